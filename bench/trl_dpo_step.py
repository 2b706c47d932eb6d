"""The peer of bench/run_dpo_step.sh: Hugging Face TRL's DPOTrainer on the same model, pairs and
batch, on the CPU in float32. Prints one JSON line: wall time of train() (which includes TRL's
reference forward passes, per step by default or all before the first step with
--precompute-ref), the mean time of the optimizer steps after the first, and the process's
peak resident memory.

    .venv-tools/bin/python bench/trl_dpo_step.py --model DIR --pairs FILE.jsonl --steps 8 --batch 4 \
        --max-length 256 --threads 2 [--precompute-ref]
"""
import argparse
import json
import os
import sys

import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import DPOConfig, DPOTrainer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from trl_step_timer import StepTimer, train_and_report  # noqa: E402


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--pairs", required=True)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--max-length", type=int, default=256)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--precompute-ref", action="store_true")
    parser.add_argument("--output", default="/tmp/trl-dpo-bench")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    rows = [json.loads(line) for line in open(args.pairs)][: args.steps * args.batch]
    dataset = Dataset.from_list([{"prompt": r["prompt"], "chosen": r["chosen"], "rejected": r["rejected"]} for r in rows])
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    config = DPOConfig(output_dir=args.output, per_device_train_batch_size=args.batch, max_steps=args.steps,
                       learning_rate=1e-6, beta=0.1, max_length=args.max_length, use_cpu=True, bf16=False,
                       report_to=[], save_strategy="no", logging_steps=1, dataloader_num_workers=0,
                       precompute_ref_log_probs=args.precompute_ref, seed=1234)
    timer = StepTimer()
    trainer = DPOTrainer(model=model, args=config, train_dataset=dataset, processing_class=tokenizer,
                         callbacks=[timer])
    impl = "trl-dpo" + ("-precompute-ref" if args.precompute_ref else "")
    train_and_report(trainer, timer, impl, {"steps": args.steps, "batch_pairs": args.batch, "threads": args.threads})


if __name__ == "__main__":
    main()
