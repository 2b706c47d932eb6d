"""The llama.cpp peer of bench/decode.c at batch 1 (llama-cpp-python, built from its PyPI
source distribution by pip; see bench/run_decode.sh). The Q4_1 GGUF is converted once to
an all-f32 GGUF with llama.cpp's own quantize tool (ftype ALL_F32), so both programs read
f32 weights, and from that to Q8_0 (ftype MOSTLY_Q8_0), the peer of `marlhf --quantize
q8_0`. Greedy decode of --new tokens after a --prompt-token prompt; the prefill is
timed apart."""
import argparse
import ctypes
import json
import os
import time

import llama_cpp

ap = argparse.ArgumentParser()
ap.add_argument("--model", default="models/SmolLM2-135M-Instruct.Q4_1.gguf")
ap.add_argument("--new", type=int, default=64)
ap.add_argument("--prompt", type=int, default=32)
ap.add_argument("--threads", type=int, default=os.cpu_count())
args = ap.parse_args()

f32_path = args.model.replace(".Q4_1.gguf", ".F32.gguf")
if not os.path.exists(f32_path):
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = 0  # LLAMA_FTYPE_ALL_F32
    params.allow_requantize = True
    rc = llama_cpp.llama_model_quantize(args.model.encode(), f32_path.encode(), ctypes.byref(params))
    assert rc == 0, "llama_model_quantize failed"

q8_path = args.model.replace(".Q4_1.gguf", ".Q8_0.gguf")
if not os.path.exists(q8_path):
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = 7  # LLAMA_FTYPE_MOSTLY_Q8_0
    rc = llama_cpp.llama_model_quantize(f32_path.encode(), q8_path.encode(), ctypes.byref(params))
    assert rc == 0, "llama_model_quantize failed"

for label, path in (("f32", f32_path), ("q8_0", q8_path), ("q4_1", args.model)):
    llm = llama_cpp.Llama(model_path=path, n_ctx=args.prompt + args.new + 8, n_threads=args.threads,
                          n_threads_batch=args.threads, n_batch=max(512, args.prompt + args.new + 8), verbose=False)
    import random
    rng = random.Random(5)
    prompt = [rng.randrange(100, 20100) for _ in range(args.prompt)]
    for attempt in range(2):  # the first pass warms up
        llm.reset()
        start = time.perf_counter()
        llm.eval(prompt)
        prefill = time.perf_counter() - start
        token = int(max(range(llm.n_vocab()), key=lambda v: llm.scores[llm.n_tokens - 1, v]))
        start = time.perf_counter()
        for _ in range(args.new - 1):
            llm.eval([token])
            token = int(llm.scores[llm.n_tokens - 1].argmax())
        decode = time.perf_counter() - start
    print(json.dumps({"impl": f"llama.cpp-{label}", "batch": 1, "decode_tokens_per_s": round((args.new - 1) / decode, 1),
                      "prefill_s": round(prefill, 3), "decode_s": round(decode, 3), "new_tokens": args.new,
                      "prompt": args.prompt, "threads": args.threads}), flush=True)
