"""Developer check: a Hugging Face folder written by `marlhf convert` loads in
transformers with the same logits as marlhf computes.

For each (source, ids.jsonl) it runs
  1. marlhf convert SOURCE OUT            (GGUF or HF folder -> HF folder)
  2. marlhf logprobs on SOURCE and on OUT (must agree exactly: same f32 weights)
  3. transformers on OUT                   (log-probs within --tolerance, top-1 identical)
and prints one line per model with the max |log-prob difference|.

usage: .venv-tools/bin/python tools/check_hf_export.py [--marlhf build/marlhf] SOURCE...
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import torch
import transformers


def marlhf_logprobs(marlhf, model, ids_path):
    out = subprocess.run([marlhf, "logprobs", "--model", model, "--input", ids_path],
                         check=True, capture_output=True, text=True).stdout
    return [json.loads(line) for line in out.splitlines()]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--marlhf", default="build/marlhf")
    parser.add_argument("--tolerance", type=float, default=2e-4)
    parser.add_argument("sources", nargs="+")
    args = parser.parse_args()
    failed = False
    with tempfile.TemporaryDirectory() as tmp:
        for index, source in enumerate(args.sources):
            out_dir = os.path.join(tmp, f"model{index}")
            subprocess.run([args.marlhf, "convert", source, out_dir], check=True, capture_output=True)
            config = json.load(open(os.path.join(out_dir, "config.json")))
            vocab = config["vocab_size"]
            generator = torch.Generator().manual_seed(index)
            rows = [torch.randint(0, vocab, (n,), generator=generator).tolist() for n in (5, 17, 33)]
            ids_path = os.path.join(tmp, f"ids{index}.jsonl")
            with open(ids_path, "w") as f:
                for row in rows:
                    f.write(json.dumps({"ids": row}) + "\n")
            from_source = marlhf_logprobs(args.marlhf, source, ids_path)
            from_export = marlhf_logprobs(args.marlhf, out_dir, ids_path)
            identical = from_source == from_export
            model = transformers.AutoModelForCausalLM.from_pretrained(out_dir, dtype=torch.float32,
                                                                      attn_implementation="eager").eval()
            worst, top1_same = 0.0, True
            for row, ours in zip(rows, from_export):
                with torch.no_grad():
                    logits = model(torch.tensor([row])).logits[0].double()
                logp = torch.log_softmax(logits, -1)
                ref = [logp[t, row[t + 1]].item() for t in range(len(row) - 1)]
                worst = max([worst] + [abs(a - b) for a, b in zip(ref, ours["logprobs"])])
                top1_same &= logits.argmax(-1).tolist() == ours["top1"]
            ok = identical and top1_same and worst <= args.tolerance
            failed |= not ok
            print(f"{'ok ' if ok else 'BAD'} {source}: {config['architectures'][0]}, source==export: {identical}, "
                  f"transformers max |dlogp| = {worst:.3g}, top-1 identical: {top1_same}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
