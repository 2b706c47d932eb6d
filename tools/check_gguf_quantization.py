"""Developer check of `marlhf convert SRC OUT.gguf --outtype q4_0|q4_1|q5_0|q5_1|q4_k_m|q5_k_m` (io/gguf_quantize.c)
against llama.cpp's own quantizer, both run by llama.cpp (llama-cpp-python):

    .venv-tools/bin/python tools/check_gguf_quantization.py [--marlhf build/marlhf] [--outtype q4_k_m] SRC

  1. marlhf writes SRC as an f32 GGUF (the reference) and as OUTTYPE;
  2. llama.cpp quantizes the f32 GGUF to the same type (llama_model_quantize);
  3. llama.cpp computes the log-probs of some Austen text with each file: for marlhf's and
     llama.cpp's quantization, the mean and largest |log-prob - f32 log-prob| and the
     perplexity;
  4. marlhf's own log-probs on each quantized file against llama.cpp's on the same file
     (the quantized layout read the same way by both; llama.cpp also quantizes the
     activations, so they differ by more than rounding even on llama.cpp's own file).
Prints one line per measurement; fails when marlhf's quantization error is above 1.5 x
llama.cpp's, or the two programs disagree on marlhf's file clearly more than on llama.cpp's.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import llama_cpp
import numpy as np
from llama_cpp import Llama

FTYPES = {"q4_0": 2, "q4_1": 3, "q5_0": 8, "q5_1": 9, "q4_k_m": 15, "q5_k_m": 17, "q8_0": 7}


def run(cmd):
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout


def token_logprobs(path, ids):
    llm = Llama(model_path=path, logits_all=True, n_ctx=1024, verbose=False, n_threads=2, type_k=0, type_v=0)
    llm.eval(ids)
    logits = np.array(llm.scores[: len(ids)], dtype=np.float64)
    logits -= logits.max(axis=1, keepdims=True)
    lsm = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
    return np.array([lsm[t, ids[t + 1]] for t in range(len(ids) - 1)])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--marlhf", default="build/marlhf")
    ap.add_argument("--outtype", default="q4_k_m", choices=sorted(FTYPES))
    ap.add_argument("--tolerance", type=float, default=0.05)
    ap.add_argument("source")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        f32, ours, theirs = (os.path.join(tmp, n) for n in ("f32.gguf", "ours.gguf", "theirs.gguf"))
        run([args.marlhf, "convert", args.source, f32, "--outtype", "f32"])
        run([args.marlhf, "convert", args.source, ours, "--outtype", args.outtype])
        params = llama_cpp.llama_model_quantize_default_params()
        params.ftype = FTYPES[args.outtype]
        params.nthread = 2
        assert llama_cpp.llama_model_quantize(f32.encode(), theirs.encode(), params) == 0, "llama.cpp quantize failed"
        rows = [json.loads(line) for line in open("data/austen/sft_eval.jsonl")][:12]
        text = " ".join(r["prompt"] + r["response"] for r in rows)
        texts = os.path.join(tmp, "text.jsonl")
        with open(texts, "w") as f:
            f.write(json.dumps({"text": text}) + "\n")
        ids = json.loads(run([args.marlhf, "tokenize", "--model", args.source, "--input", texts]).splitlines()[0])["ids"]
        ids = ids[:1000]
        reference = token_logprobs(f32, ids)
        results = {}
        for name, path in (("marlhf", ours), ("llama.cpp", theirs)):
            logp = token_logprobs(path, ids)
            diff = np.abs(logp - reference)
            results[name] = diff.mean()
            print(f"{args.outtype} by {name:9s}: {os.path.getsize(path) / 1e6:6.1f} MB, |log-prob - f32| mean "
                  f"{diff.mean():.4f} max {diff.max():.3f}, perplexity {np.exp(-logp.mean()):.3f} "
                  f"(f32 {np.exp(-reference.mean()):.3f}) over {len(ids) - 1} tokens")
        ids_file = os.path.join(tmp, "ids.jsonl")
        with open(ids_file, "w") as f:
            f.write(json.dumps({"ids": ids[:256]}) + "\n")
        same_file = {}
        for name, path in (("marlhf", ours), ("llama.cpp", theirs)):
            mine = np.array(json.loads(run([args.marlhf, "logprobs", "--model", path, "--input", ids_file])
                                       .splitlines()[0])["logprobs"])
            same_file[name] = np.abs(mine - token_logprobs(path, ids[:256]))
            print(f"marlhf against llama.cpp, both reading {name}'s {args.outtype} file: |log-prob diff| mean "
                  f"{same_file[name].mean():.4f} max {same_file[name].max():.3f}")
        # llama.cpp quantizes the activations for quantized matrices, so even on its own file
        # the two differ; marlhf's file must not make that worse.
        ok = (results["marlhf"] <= 1.5 * results["llama.cpp"] and
              same_file["marlhf"].mean() <= 1.5 * same_file["llama.cpp"].mean() + args.tolerance / 10)
        print("ok" if ok else "FAIL")
        sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
