"""The llama.cpp peer of bench/decode.c at batch 1 (llama-cpp-python, built from its PyPI
source distribution by pip; see bench/run_decode.sh). The Q4_1 GGUF is converted once to
an all-f32 GGUF with llama.cpp's own quantize tool (ftype ALL_F32), so both programs read
f32 weights, and from that to Q8_0 (ftype MOSTLY_Q8_0), the peer of `marlhf --quantize
q8_0`. Greedy decode of --new tokens after a --prompt-token prompt; the prefill is
timed apart. --files PATH... benches those GGUF files as they are instead (bench/run_kquant_decode.sh:
a Q4_K_M file), each line with the milliseconds per token and the process's peak resident memory
(ru_maxrss: the Python interpreter's own, about `rss_baseline_mb`, included)."""
import argparse
import ctypes
import json
import os
import resource
import time

import llama_cpp

from llamacpp_buffers import without_extra_buffers

ap = argparse.ArgumentParser()
ap.add_argument("--model", default="models/SmolLM2-135M-Instruct.Q4_1.gguf")
ap.add_argument("--new", type=int, default=64)
ap.add_argument("--prompt", type=int, default=32)
ap.add_argument("--threads", type=int, default=os.cpu_count())
ap.add_argument("--files", nargs="*", help="bench these GGUF files (none: only --make-q4-k-m) instead of the f32 / "
                "Q8_0 / Q4_1 trio")
ap.add_argument("--make-q4-k-m", metavar="PATH", help="first write llama.cpp's own Q4_K_M of --model's weights to PATH "
                "(from an F32 file beside it), if PATH is not there")
ap.add_argument("--no-extra-buffers", action="store_true",
                help="load with llama.cpp's use_extra_bufts off: no repacked (AMX, interleaved) weight buffers. "
                "On the 2026-12-07 machine (AMX) llama-cpp-python 0.3.36 crashed (SIGSEGV) on Q4_0 and Q4_1 files "
                "with them; the lines then say -no-extra-buffers")
ap.add_argument("--make", nargs=2, metavar=("MIX", "PATH"), help="likewise llama.cpp's own MIX (q3_k_m, q3_k_s, q2_k, q4_0, iq4_nl or iq4_xs)")
args = ap.parse_args()
rss_baseline_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

if args.no_extra_buffers:
    without_extra_buffers()


def quantize(source, out, ftype):
    """llama.cpp's quantize tool: `source` to `out` as llama_ftype `ftype`, once."""
    if os.path.exists(out):
        return
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = ftype
    params.allow_requantize = True
    rc = llama_cpp.llama_model_quantize(source.encode(), out.encode(), ctypes.byref(params))
    assert rc == 0, "llama_model_quantize failed"


FTYPES = {"q4_k_m": 15, "q3_k_m": 12, "q3_k_s": 11, "q2_k": 10, "q4_0": 2, "iq4_nl": 25, "iq4_xs": 30}  # LLAMA_FTYPE_MOSTLY_*
made_files = [("q4_k_m", args.make_q4_k_m)] + ([tuple(args.make)] if args.make else [])
for mix, made in made_files:
    if made:
        ftype = FTYPES[mix]
        f32_beside = os.path.join(os.path.dirname(made), os.path.basename(args.model).replace(".Q4_1.gguf", ".F32.gguf"))
        quantize(args.model, f32_beside, 0)  # LLAMA_FTYPE_ALL_F32
        quantize(f32_beside, made, ftype)

f32_path = args.model.replace(".Q4_1.gguf", ".F32.gguf")
q8_path = args.model.replace(".Q4_1.gguf", ".Q8_0.gguf")
if args.files is None:
    quantize(args.model, f32_path, 0)  # LLAMA_FTYPE_ALL_F32
    quantize(f32_path, q8_path, 7)  # LLAMA_FTYPE_MOSTLY_Q8_0

files = [(os.path.basename(p), p) for p in args.files] if args.files is not None else \
    (("f32", f32_path), ("q8_0", q8_path), ("q4_1", args.model))
for label, path in files:
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
    suffix = "-no-extra-buffers" if args.no_extra_buffers else ""
    print(json.dumps({"impl": f"llama.cpp-{label}{suffix}", "batch": 1, "decode_tokens_per_s": round((args.new - 1) / decode, 1),
                      "prefill_s": round(prefill, 3), "decode_s": round(decode, 3), "new_tokens": args.new,
                      "prompt": args.prompt, "threads": args.threads, "ms_per_token": round(1000 * decode / (args.new - 1), 2),
                      "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
                      "rss_baseline_mb": round(rss_baseline_mb, 1)}), flush=True)
