#!/usr/bin/env python3
"""PyTorch FSDP2 peer of marlhf's ZeRO-3 PPO generation (bench/run_ppo_zero3.sh).

W processes (torch.multiprocessing, the gloo backend) each load the actor from a Hugging
Face folder (transformers' from_pretrained, float32) and shard it with FSDP2: fully_shard on
each decoder block and on the whole model, reshard_after_forward=True (PyTorch's ZeRO-3).
Rank r then samples responses to the rows r, r + W, ... of the first --rollouts prompts,
--generation-batch at a time, exactly --new-tokens new tokens each (min_new_tokens =
max_new_tokens), temperature 1, top-k 0, through transformers' generate:

  --mode layerwise  generate on the sharded model with synced_gpus=True, as TRL and
                    DeepSpeed-Chat do under ZeRO-3 without a hybrid engine: each block is
                    all-gathered for each decode step and freed after it.
  --mode gathered   the hybrid-engine way: the whole model unsharded on every rank first
                    (FSDPModule.unshard with resharding after forward turned off), generated
                    without collectives, resharded after.

Prompts are the plain text of data/austen/ppo_prompts.jsonl's "prompt" field with the
tokenizer's special tokens, as bench/trl_ppo_iteration.py tokenizes them; rows are left-padded.
Timed: the whole generation phase on each rank (from a barrier before to a barrier after, so
it ends when the slowest rank ends). Prints one JSON line with the time, the tokens
generated per second over all ranks and every rank's peak resident memory:

    .venv-tools/bin/python bench/torch_fsdp_generate.py --model /tmp/smollm2-hf --ranks 2 \\
        --threads 1 --rollouts 8 --generation-batch 4 --new-tokens 24 --mode layerwise
"""
import argparse
import json
import os
import resource
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def worker(rank, args, port, results):
    torch.set_num_threads(args.threads)
    torch.manual_seed(1234 + rank)
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    dist.init_process_group("gloo", rank=rank, world_size=args.ranks)
    from torch.distributed.fsdp import fully_shard
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.model)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(args.model, torch_dtype=torch.float32, attn_implementation="sdpa")
    model.eval()
    for block in model.model.layers:
        fully_shard(block, reshard_after_forward=True)
    fully_shard(model, reshard_after_forward=True)

    with open(args.prompts) as f:
        texts = [json.loads(line)["prompt"] for line in f if line.strip()][: args.rollouts]
    mine = texts[rank :: args.ranks]
    sampling = dict(do_sample=True, temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=args.new_tokens,
                    min_new_tokens=args.new_tokens, pad_token_id=tokenizer.pad_token_id)

    dist.barrier()
    start = time.perf_counter()
    with torch.no_grad():
        if args.mode == "gathered":
            model.set_reshard_after_forward(False)
            model.unshard()
        generated = 0
        for first in range(0, len(mine), args.generation_batch):
            batch = tokenizer(mine[first : first + args.generation_batch], return_tensors="pt", padding=True)
            out = model.generate(**batch, synced_gpus=args.mode == "layerwise", **sampling)
            generated += (out.shape[1] - batch["input_ids"].shape[1]) * out.shape[0]
        if args.mode == "gathered":
            model.reshard()
            model.set_reshard_after_forward(True)
    dist.barrier()
    seconds = time.perf_counter() - start
    peak_mb = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    results[rank] = (seconds, generated, peak_mb)
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True, help="a Hugging Face folder (float32 weights)")
    ap.add_argument("--prompts", default="data/austen/ppo_prompts.jsonl")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rollouts", type=int, default=8)
    ap.add_argument("--generation-batch", type=int, default=4)
    ap.add_argument("--new-tokens", type=int, default=24)
    ap.add_argument("--mode", choices=["layerwise", "gathered"], default="layerwise")
    ap.add_argument("--port", type=int, default=29517)
    args = ap.parse_args()
    if args.ranks < 2:
        ap.error("--ranks must be at least 2 (FSDP shards across processes)")
    if args.rollouts % args.ranks:
        ap.error("--rollouts must divide among the ranks (synced generate needs the same number of batches on each)")
    results = mp.Manager().dict()
    mp.spawn(worker, args=(args, args.port, results), nprocs=args.ranks, join=True)
    seconds = max(results[r][0] for r in range(args.ranks))
    generated = sum(results[r][1] for r in range(args.ranks))
    print(json.dumps({"impl": f"pytorch-fsdp2-{args.mode}", "torch": torch.__version__, "ranks": args.ranks,
                      "threads": args.threads, "rollouts": args.rollouts, "new_tokens": args.new_tokens,
                      "generation_s": round(seconds, 3), "tokens_per_s": round(generated / seconds, 1),
                      "peak_rss_mb_by_rank": [results[r][2] for r in range(args.ranks)]}))


if __name__ == "__main__":
    main()
