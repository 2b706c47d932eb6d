#!/usr/bin/env python3
"""transformers peer of the C/CUDA greedy decode benchmark (PyTorch eager, no torch.compile).

A Llama model built from its config (random weights, cast to --dtype) runs greedy
model.generate() with the KV cache on random [B, P] prompts for exactly N new tokens, after one
untimed warm-up generate. The prefill alone (one forward over the prompt) is timed separately;
decode_tokens_per_s = B * N / (total_s - prefill_s). Prints one JSON line on stdout.
--temperature T (> 0) samples instead, with --top-k (0: off), as bench/decode.c does.
"""
import argparse
import json
import sys
import time

import torch
from transformers import LlamaForCausalLM

from torch_gpu_train_step import SHAPES, build_config, device_name, sync

DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


def run(args, device, result):
    cfg = build_config(args.shape, "sdpa")
    with device:  # initialise the weights directly on the device
        model = LlamaForCausalLM(cfg).to(DTYPES[args.dtype]).eval()
    n_params = sum(p.numel() for p in model.parameters())
    print(f"# {args.shape}: {n_params:,} parameters ({n_params / 1e6:.1f}M), dtype={args.dtype}",
          file=sys.stderr)
    # token 0 is the pad id: keep it out of the prompts (the mask is all ones anyway)
    ids = torch.randint(1, cfg.vocab_size, (args.batch, args.prompt_len), device=device)
    mask = torch.ones_like(ids)

    def timed(fn):
        sync(device)
        t0 = time.perf_counter()
        out = fn()
        sync(device)
        return time.perf_counter() - t0, out

    sampling = {"do_sample": False}
    if args.temperature > 0:
        sampling = {"do_sample": True, "temperature": args.temperature, "top_k": args.top_k, "top_p": args.top_p}

    def generate():
        return model.generate(ids, attention_mask=mask, max_new_tokens=args.new_tokens,
                              min_new_tokens=args.new_tokens, use_cache=True,
                              pad_token_id=0, eos_token_id=None, **sampling)

    def prefill():
        with torch.no_grad():
            return model(input_ids=ids, attention_mask=mask, use_cache=True)

    generate()  # warm-up
    prefill_s, _ = timed(prefill)
    if device.type == "cuda":  # the peak of the timed generate alone, as bench/decode.c's
        torch.cuda.reset_peak_memory_stats(device)
    total_s, out = timed(generate)
    if out.shape != (args.batch, args.prompt_len + args.new_tokens):
        raise SystemExit(f"generate returned shape {tuple(out.shape)}")
    result.update({
        "decode_tokens_per_s": round(args.batch * args.new_tokens / (total_s - prefill_s), 1),
        "total_s": round(total_s, 4),
        "prefill_s": round(prefill_s, 4),
        "peak_mem_gib": (round(torch.cuda.max_memory_allocated(device) / 2**30, 3)
                         if device.type == "cuda" else None),
    })


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", choices=sorted(SHAPES), default="smollm2", help="model shape")
    ap.add_argument("--batch", type=int, default=1, help="prompts decoded together (B)")
    ap.add_argument("--prompt-len", type=int, default=32, help="prompt tokens per row (P)")
    ap.add_argument("--new-tokens", type=int, default=128, help="generated tokens per row (N)")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="bf16",
                    help="inference dtype of the weights")
    ap.add_argument("--temperature", type=float, default=0.0, help="0: greedy")
    ap.add_argument("--top-k", type=int, default=0, help="with --temperature: 0 is off")
    ap.add_argument("--top-p", type=float, default=1.0, help="with --temperature: 1 is off")
    args = ap.parse_args()
    if min(args.batch, args.prompt_len, args.new_tokens) < 1:
        ap.error("--batch, --prompt-len and --new-tokens must be >= 1")

    torch.manual_seed(1234)
    device = torch.device(args.device)
    result = {"impl": "transformers-generate", "shape": args.shape, "batch": args.batch,
              "prompt_len": args.prompt_len, "new_tokens": args.new_tokens, "dtype": args.dtype,
              "temperature": args.temperature, "top_k": args.top_k, "top_p": args.top_p}
    try:
        run(args, device, result)
    except torch.cuda.OutOfMemoryError as e:
        print(f"# OOM: {e}", file=sys.stderr)
        result["error"] = "oom"
    result.update({"torch": torch.__version__, "device_name": device_name(device)})
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
