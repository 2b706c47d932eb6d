"""The transformers peer of bench/decode.c: SmolLM2-135M-Instruct from the same GGUF
(dequantized to float32), greedy generate() with the KV cache, a 32-token prompt per row,
exactly --new tokens per row, batch 1, 8, 32. Decode tokens/s excludes the prefill
(timed separately as a 1-token generate). --temperature T (> 0) samples instead, with
--top-k and --top-p as bench/decode.c takes them (top-k 0: off, as in marlhf), and --min-p and
--repetition-penalty (generate's min_p and repetition_penalty: the peers of marlhf's). --dtype
bfloat16 loads the weights in bf16 (the peer of marlhf's --quantize bf16; float32 by default)."""
import argparse
import json
import os
import time

import torch
import transformers

ap = argparse.ArgumentParser()
ap.add_argument("--model", default="models/SmolLM2-135M-Instruct.Q4_1.gguf")
ap.add_argument("--new", type=int, default=64)
ap.add_argument("--prompt", type=int, default=32)
ap.add_argument("--batches", default="1,8,32")
ap.add_argument("--threads", type=int, default=os.cpu_count())
ap.add_argument("--temperature", type=float, default=0.0)
ap.add_argument("--top-k", type=int, default=0)
ap.add_argument("--top-p", type=float, default=1.0)
ap.add_argument("--min-p", type=float, default=0.0)
ap.add_argument("--repetition-penalty", type=float, default=1.0)
ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
args = ap.parse_args()
torch.set_num_threads(args.threads)
directory, name = os.path.split(os.path.abspath(args.model))
dtype = getattr(torch, args.dtype)
model = transformers.AutoModelForCausalLM.from_pretrained(directory, gguf_file=name, dtype=dtype).eval()
generator = torch.Generator().manual_seed(5)
for B in [int(b) for b in args.batches.split(",")]:
    ids = torch.randint(100, 20100, (B, args.prompt), generator=generator)
    mask = torch.ones_like(ids)

    # min_p and repetition_penalty only when set: generate() adds no processor for their defaults.
    extras = {}
    if args.min_p > 0:
        extras["min_p"] = args.min_p
    if args.repetition_penalty != 1.0:
        extras["repetition_penalty"] = args.repetition_penalty

    def run(new):
        start = time.perf_counter()
        with torch.no_grad():
            if args.temperature > 0:
                model.generate(ids, attention_mask=mask, max_new_tokens=new, min_new_tokens=new, do_sample=True,
                               temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, pad_token_id=0,
                               **extras)
            else:
                model.generate(ids, attention_mask=mask, max_new_tokens=new, min_new_tokens=new, do_sample=False,
                               pad_token_id=0, **extras)
        return time.perf_counter() - start

    run(2)  # warm up
    prefill = run(1)
    total = run(args.new)
    decode_tokens = B * (args.new - 1)
    print(json.dumps({"impl": "transformers", "dtype": args.dtype, "batch": B, "temperature": args.temperature, "top_k": args.top_k,
                      "top_p": args.top_p, "min_p": args.min_p, "repetition_penalty": args.repetition_penalty, "decode_tokens_per_s": round(decode_tokens / (total - prefill), 1),
                      "prefill_s": round(prefill, 3), "decode_s": round(total - prefill, 3), "new_tokens": args.new,
                      "prompt": args.prompt, "threads": torch.get_num_threads()}), flush=True)
