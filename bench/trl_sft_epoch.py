"""The peer of bench/run_sft_packing.sh: Hugging Face TRL's SFTTrainer over one epoch of the
same prompt/response rows, batch and max_length, on the CPU in float32: as it is, with
padding_free=True, or with packing=True (packing_strategy bfd, TRL's default, which is
padding-free). Prints one JSON line: the wall time of
train(), the optimizer steps it took, the mean step after the first, the tokens of the
prepared training rows (their input_ids: what the epoch computes on, padding not counted),
the process's peak resident memory and TRL's version.

    .venv-tools/bin/python bench/trl_sft_epoch.py --model DIR --data FILE.jsonl --rows 256 --batch 8 \\
        --max-length 256 --threads 2 [--packing | --padding-free]
"""
import argparse
import json
import os
import resource
import sys
import time

import torch
import trl
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import SFTConfig, SFTTrainer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from trl_step_timer import StepTimer  # noqa: E402


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--data", required=True)
    parser.add_argument("--rows", type=int, default=256)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--max-length", type=int, default=256)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--packing", action="store_true")
    parser.add_argument("--padding-free", action="store_true")
    parser.add_argument("--output", default="/tmp/trl-sft-bench")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    rows = [json.loads(line) for line in open(args.data)][: args.rows]
    dataset = Dataset.from_list([{"prompt": r["prompt"], "completion": r["response"]} for r in rows])
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32, attn_implementation="sdpa")
    # TRL refuses padding_free without packing where max_length is set (it would not cut the
    # rows): the rows here are shorter than max_length, so None is the same run.
    max_length = None if args.padding_free and not args.packing else args.max_length
    longest = max(len(tokenizer(r["prompt"] + r["response"])["input_ids"]) for r in rows) + 2
    if max_length is None and longest > args.max_length:
        raise SystemExit(f"trl_sft_epoch.py: a row of ~{longest} tokens is over --max-length {args.max_length}: "
                         "--padding-free would not cut it")
    config = SFTConfig(output_dir=args.output, per_device_train_batch_size=args.batch, num_train_epochs=1,
                       learning_rate=1e-5, max_length=max_length, packing=args.packing,
                       padding_free=args.padding_free, use_cpu=True, bf16=False,
                       report_to=[], save_strategy="no", logging_steps=1, dataloader_num_workers=0, seed=1234)
    timer = StepTimer()
    trainer = SFTTrainer(model=model, args=config, train_dataset=dataset, processing_class=tokenizer,
                         callbacks=[timer])
    tokens = sum(len(ids) for ids in trainer.train_dataset["input_ids"])
    started = time.perf_counter()
    trainer.train()
    total = time.perf_counter() - started
    later = timer.durations[1:] or timer.durations
    impl = "trl-sft" + ("-packing-bfd" if args.packing else "-padding-free" if args.padding_free else "")
    print(json.dumps({"impl": impl, "rows": args.rows,
                      "batch": args.batch, "max_length": args.max_length, "steps": len(timer.durations),
                      "training_rows": len(trainer.train_dataset), "tokens": tokens, "train_s": round(total, 2),
                      "step_s": round(sum(later) / len(later), 3), "tokens_per_s": round(tokens / total, 1),
                      "max_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
                      "threads": args.threads, "trl": trl.__version__}))


if __name__ == "__main__":
    main()
