"""llama.cpp's log-probs of token ids under a GGUF file, as `marlhf logprobs` writes them: for
each line {"ids": [...]} of --input, the log-probability of every id after the first given
the ids before it (llama-cpp-python, all positions of a line in one batch, f32 K/V cache).
With --compare MARLHF.jsonl (`marlhf logprobs --model FILE --input ...` on the same lines)
it prints one JSON line instead: the mean and largest |difference| between the two programs
on the same file -- whether llama.cpp reads a file marlhf wrote as marlhf does.

    PYTHON bench/llamacpp_logprobs.py --model FILE.gguf --input IDS.jsonl [--compare MARLHF.jsonl]
"""
import argparse
import json

import llama_cpp
import numpy as np

from llamacpp_buffers import without_extra_buffers

ap = argparse.ArgumentParser()
ap.add_argument("--model", required=True)
ap.add_argument("--input", required=True, help='JSON lines {"ids": [...]}')
ap.add_argument("--compare", help="marlhf logprobs' output on the same lines")
ap.add_argument("--threads", type=int, default=2)
ap.add_argument("--extra-buffers", action="store_true",
                help="load with llama.cpp's repacked (AMX, interleaved) weight buffers; off by default: with them "
                "llama-cpp-python 0.3.36 crashed (SIGSEGV) on the AMX machine of 2026-12-07 (llamacpp_buffers.py)")
args = ap.parse_args()

if not args.extra_buffers:
    without_extra_buffers()

lines = [json.loads(line)["ids"] for line in open(args.input) if line.strip()]
longest = max(len(ids) for ids in lines)
llm = llama_cpp.Llama(model_path=args.model, logits_all=True, n_ctx=longest + 8, n_batch=longest + 8, verbose=False,
                      n_threads=args.threads, type_k=0, type_v=0)
ours = []
for ids in lines:
    llm.reset()
    llm.eval(ids)
    logits = np.array(llm.scores[: len(ids)], dtype=np.float64)
    logits -= logits.max(axis=1, keepdims=True)
    log_softmax = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
    ours.append([float(log_softmax[t, ids[t + 1]]) for t in range(len(ids) - 1)])
if not args.compare:
    for row in ours:
        print(json.dumps({"logprobs": row}))
else:
    theirs = [json.loads(line)["logprobs"] for line in open(args.compare) if line.strip()]
    differences = [abs(a - b) for row_a, row_b in zip(ours, theirs, strict=True)
                   for a, b in zip(row_a, row_b, strict=True)]
    print(json.dumps({"bench": "llamacpp_logprobs", "model": args.model.split("/")[-1], "lines": len(lines),
                      "tokens": len(differences), "llama_cpp": llama_cpp.__version__,
                      "mean_abs_difference": round(sum(differences) / len(differences), 6),
                      "max_abs_difference": round(max(differences), 6)}))
