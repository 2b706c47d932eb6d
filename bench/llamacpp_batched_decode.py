"""The llama.cpp peer of bench/decode.c at batch B (bench/run_kquant_batched.sh): B sequences
decoded together through llama-cpp-python's low-level API, one llama_decode of B tokens a
step (each its own sequence id), greedy, a --prompt-token prompt per sequence (the prompts'
tokens in one prefill batch), --new tokens per sequence. One JSON line per batch size:
ms_per_step (= ms per B tokens), decode_tokens_per_s. The first pass of each size warms up.
"""
import argparse
import ctypes
import json
import random
import time

import llama_cpp
import numpy as np

ap = argparse.ArgumentParser()
ap.add_argument("--model", required=True)
ap.add_argument("--new", type=int, default=64)
ap.add_argument("--prompt", type=int, default=32)
ap.add_argument("--batches", default="1,4,16")
ap.add_argument("--threads", type=int, default=1)
args = ap.parse_args()

llama_cpp.llama_backend_init()
model_params = llama_cpp.llama_model_default_params()
model = llama_cpp.llama_model_load_from_file(args.model.encode(), model_params)
if not model:
    raise SystemExit(f"cannot load {args.model}")
n_vocab = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(model))


def fill(batch, entries):
    """entries: (token, position, sequence, wants_logits) per token of the batch."""
    batch.n_tokens = len(entries)
    for i, (token, pos, seq, logits) in enumerate(entries):
        batch.token[i] = token
        batch.pos[i] = pos
        batch.n_seq_id[i] = 1
        batch.seq_id[i][0] = seq
        batch.logits[i] = 1 if logits else 0


def argmax(ctx, i):
    logits = llama_cpp.llama_get_logits_ith(ctx, i)
    return int(np.ctypeslib.as_array(logits, shape=(n_vocab,)).argmax())


for B in [int(b) for b in args.batches.split(",")]:
    params = llama_cpp.llama_context_default_params()
    params.n_ctx = B * (args.prompt + args.new + 8)
    params.n_batch = params.n_ubatch = max(512, B * args.prompt)
    params.n_seq_max = B
    params.n_threads = params.n_threads_batch = args.threads
    rng = random.Random(5)
    prompts = [[rng.randrange(100, 20100) for _ in range(args.prompt)] for _ in range(B)]
    for attempt in range(2):  # the first pass warms up
        ctx = llama_cpp.llama_init_from_model(model, params)
        batch = llama_cpp.llama_batch_init(max(B * args.prompt, B), 0, 1)
        fill(batch, [(t, p, s, p == args.prompt - 1) for s in range(B) for p, t in enumerate(prompts[s])])
        start = time.perf_counter()
        if llama_cpp.llama_decode(ctx, batch) != 0:
            raise SystemExit("llama_decode failed (prefill)")
        prefill = time.perf_counter() - start
        tokens = [argmax(ctx, s * args.prompt + args.prompt - 1) for s in range(B)]
        start = time.perf_counter()
        for step in range(args.new - 1):
            fill(batch, [(tokens[s], args.prompt + step, s, True) for s in range(B)])
            if llama_cpp.llama_decode(ctx, batch) != 0:
                raise SystemExit("llama_decode failed (decode step)")
            tokens = [argmax(ctx, s) for s in range(B)]
        decode = time.perf_counter() - start
        llama_cpp.llama_batch_free(batch)
        llama_cpp.llama_free(ctx)
    steps = args.new - 1
    print(json.dumps({"impl": "llama.cpp", "model": args.model, "batch": B, "threads": args.threads,
                      "decode_tokens_per_s": round(B * steps / decode, 1), "ms_per_step": round(1000 * decode / steps, 2),
                      "prefill_s": round(prefill, 3), "decode_s": round(decode, 3), "new_tokens": args.new,
                      "prompt": args.prompt}), flush=True)
