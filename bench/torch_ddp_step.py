#!/usr/bin/env python3
"""PyTorch DDP peer of bench/data_parallel_step.c.

One data-parallel training step on the CPU: W processes (torch.multiprocessing, the gloo
backend), each with the whole model (random weights, float32) wrapped in
DistributedDataParallel and its own batch of B x T random token ids; forward with the
causal-LM loss + backward (DDP sums the gradients in buckets while backward runs) + AdamW.
After --warmup untimed steps, --steps steps are timed on rank 0.

    .venv-tools/bin/python bench/torch_ddp_step.py [--ranks 2] [--threads 1] [--batch 2]
        [--seq 256] [--steps 3] [--warmup 1] [--model smollm2-135m|gpt2-124m]
        [--sharding none|zero1|zero2|zero3] [--load HF_FOLDER] [--lora R]

--ranks 1 runs the same step without DDP (one process). --sharding: PyTorch's own ZeRO
stages, the peers of marlhf's --zero-stage: zero1 is DDP with ZeroRedundancyOptimizer (the
AdamW state sharded); zero2 is FSDP2 (fully_shard on each block and the whole model) with
reshard_after_forward=False, which PyTorch documents as its ZeRO-2 (gradients and optimizer
state sharded; it also keeps the parameters sharded between steps, which ZeRO-2 does not);
zero3 is the same FSDP2 with reshard_after_forward=True (its default, PyTorch's ZeRO-3: each
block's parameters gathered for its forward, freed, and gathered again for its backward).
--lora R: PEFT LoRA adapters of rank R on all linear layers, the base frozen and only the
adapters in the optimizer (the peer of marlhf's --lora-rank; with FSDP2 the frozen base is
sharded too). --load: the model's weights from a Hugging Face folder, by transformers' from_pretrained on
every rank (float32) before wrapping, the usual way (bench/run_zero3_load.sh); the JSON line
then also lists every rank's peak resident memory ("peak_rss_mb_by_rank").
Prints one JSON line:
  {"impl": "pytorch-ddp", "ranks": ..., "tokens_per_s": ..., "step_s": ..., ...}
"""
import argparse
import json
import os
import resource
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_train_step import build  # noqa: E402  (the same model shapes as the C benchmarks)


def worker(rank, args, port):
    torch.set_num_threads(args.threads)
    if args.ranks > 1:
        os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
        dist.init_process_group("gloo", rank=rank, world_size=args.ranks)
    if args.load:
        from transformers import AutoModelForCausalLM
        model = AutoModelForCausalLM.from_pretrained(args.load, torch_dtype=torch.float32, attn_implementation="sdpa")
        cfg = model.config
    else:
        model, cfg, _ = build(args.model, "sdpa")
    if args.lora:
        import peft
        model = peft.get_peft_model(model, peft.LoraConfig(r=args.lora, lora_alpha=args.lora, lora_dropout=0.0,
                                                           target_modules="all-linear", task_type="CAUSAL_LM"))
    adamw = dict(lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1)
    if args.ranks > 1 and args.sharding in ("zero2", "zero3"):
        from torch.distributed.fsdp import fully_shard
        reshard = args.sharding == "zero3"
        inner = model.base_model.model if args.lora else model
        for block in (inner.model.layers if hasattr(inner, "model") else inner.transformer.h):
            fully_shard(block, reshard_after_forward=reshard)
        fully_shard(model, reshard_after_forward=reshard)
        opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], **adamw)
    elif args.ranks > 1:
        model = torch.nn.parallel.DistributedDataParallel(model)
        if args.sharding == "zero1":
            from torch.distributed.optim import ZeroRedundancyOptimizer
            opt = ZeroRedundancyOptimizer([p for p in model.parameters() if p.requires_grad],
                                          optimizer_class=torch.optim.AdamW, **adamw)
        else:
            opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], **adamw)
    else:
        opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], **adamw)
    ids = torch.randint(0, cfg.vocab_size, (args.batch, args.seq),
                        generator=torch.Generator().manual_seed(1 + rank))

    def step():
        opt.zero_grad(set_to_none=True)
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()

    for _ in range(args.warmup):
        step()
    if args.ranks > 1:
        dist.barrier()
    t0 = time.perf_counter()
    for _ in range(args.steps):
        step()
    if args.ranks > 1:
        dist.barrier()
    step_s = (time.perf_counter() - t0) / args.steps
    peak_mb = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    by_rank = [peak_mb]
    if args.ranks > 1:
        by_rank = [None] * args.ranks
        dist.all_gather_object(by_rank, peak_mb)
    if rank == 0:
        tokens = args.batch * args.seq * args.ranks
        print(json.dumps({
            "impl": ("pytorch-" + {"none": "ddp", "zero1": "ddp-zero1", "zero2": "fsdp-zero2", "zero3": "fsdp-zero3"}[args.sharding]
                     if args.ranks > 1 else "pytorch") + (f"-peft-lora{args.lora}" if args.lora else ""),
            "model": args.model, "ranks": args.ranks,
            "threads_per_rank": args.threads, "batch_per_rank": args.batch, "seq": args.seq,
            "tokens_per_s": round(tokens / step_s, 1), "step_s": round(step_s, 4),
            "peak_rss_mb": peak_mb, "peak_rss_mb_by_rank": by_rank, "loaded": args.load or "random weights",
            "torch": torch.__version__}),
            flush=True)
    if args.ranks > 1:
        dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--port", type=int, default=29517)
    ap.add_argument("--model", choices=("gpt2-124m", "smollm2-135m"), default="smollm2-135m")
    ap.add_argument("--sharding", choices=("none", "zero1", "zero2", "zero3"), default="none")
    ap.add_argument("--load", default=None, help="a Hugging Face folder to load the weights from")
    ap.add_argument("--lora", type=int, default=0,
                    help="PEFT LoRA adapters of this rank on every linear layer (alpha = rank), the base frozen")
    args = ap.parse_args()
    if args.ranks == 1:
        worker(0, args, args.port)
    else:
        mp.spawn(worker, args=(args, args.port), nprocs=args.ranks, join=True)


if __name__ == "__main__":
    main()
