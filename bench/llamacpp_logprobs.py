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
import os
import sys


def fail(message):
    """One line on stderr and exit 2, as marlhf's own errors."""
    print(f"marlhf: error: {message} (bench/llamacpp_logprobs.py)", file=sys.stderr)
    sys.exit(2)


class Parser(argparse.ArgumentParser):
    def error(self, message):
        fail(message)


ap = Parser()
ap.add_argument("--model", required=True)
ap.add_argument("--input", required=True, help='JSON lines {"ids": [...]}')
ap.add_argument("--compare", help="marlhf logprobs' output on the same lines")
ap.add_argument("--threads", type=int, default=2)
ap.add_argument("--extra-buffers", action="store_true",
                help="load with llama.cpp's repacked (AMX, interleaved) weight buffers; off by default: with them "
                "llama-cpp-python 0.3.36 crashed (SIGSEGV) on the AMX machine of 2026-12-07 (llamacpp_buffers.py)")
args = ap.parse_args()
for path in (args.model, args.input, args.compare):
    if path and not os.path.isfile(path):
        fail(f"{path} does not exist")
lines = []
for number, line in enumerate(open(args.input), 1):
    if not line.strip():
        continue
    try:
        ids = json.loads(line)["ids"]
    except (ValueError, KeyError, TypeError):
        fail(f'{args.input}:{number}: not a JSON object with "ids"')
    if not isinstance(ids, list) or len(ids) < 2 or not all(isinstance(i, int) and i >= 0 for i in ids):
        fail(f'{args.input}:{number}: "ids" must be two or more token ids')
    lines.append(ids)
if not lines:
    fail(f"{args.input} holds no lines")
try:
    import llama_cpp
    import numpy as np
except ImportError as e:
    fail(f"needs llama-cpp-python and numpy ({e}); bench/run_decode.sh builds an interpreter with them")
from llamacpp_buffers import without_extra_buffers  # noqa: E402 (imports llama_cpp)

if not args.extra_buffers:
    without_extra_buffers()

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
