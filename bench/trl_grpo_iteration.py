"""The peer of bench/run_grpo_iteration.sh: one optimizer step of Hugging Face TRL's GRPOTrainer
on the CPU in float32: PROMPTS prompts answered GROUP times each (generation, reward-model
scores, reference log-probs for the KL term, one policy update), the same model, reward
model and prompts as marlhf. Prints one JSON line: the wall time of train() (one step; model
loading outside) and the process's peak resident memory.

    .venv-tools/bin/python bench/trl_grpo_iteration.py --actor DIR --reward DIR --prompts FILE.jsonl \
        --prompts-count 4 --group 4 --new-tokens 48 --beta 0.05 --threads 2
"""
import argparse
import json
import resource
import time

import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer
from trl import GRPOConfig, GRPOTrainer


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--actor", required=True)
    parser.add_argument("--reward", required=True)
    parser.add_argument("--prompts", required=True)
    parser.add_argument("--prompts-count", type=int, default=4)
    parser.add_argument("--group", type=int, default=4)
    parser.add_argument("--new-tokens", type=int, default=48)
    parser.add_argument("--beta", type=float, default=0.05)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--output", default="/tmp/trl-grpo-bench")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    rows = [json.loads(line)["prompt"] for line in open(args.prompts)][: args.prompts_count]
    dataset = Dataset.from_list([{"prompt": p} for p in rows])
    tokenizer = AutoTokenizer.from_pretrained(args.actor)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    reward_tokenizer = AutoTokenizer.from_pretrained(args.reward)
    if reward_tokenizer.pad_token is None:
        reward_tokenizer.pad_token = reward_tokenizer.eos_token
    reward = AutoModelForSequenceClassification.from_pretrained(args.reward, dtype=torch.float32, num_labels=1)
    reward.config.pad_token_id = reward_tokenizer.pad_token_id
    model = AutoModelForCausalLM.from_pretrained(args.actor, dtype=torch.float32)
    rows_per_step = args.prompts_count * args.group
    config = GRPOConfig(output_dir=args.output, per_device_train_batch_size=rows_per_step, num_generations=args.group,
                        max_completion_length=args.new_tokens, temperature=1.0, top_k=0, top_p=1.0, beta=args.beta,
                        learning_rate=1e-6, max_steps=1, use_cpu=True, bf16=False, report_to=[], save_strategy="no",
                        logging_steps=1, dataloader_num_workers=0, seed=1234)
    trainer = GRPOTrainer(model=model, reward_funcs=reward, args=config, train_dataset=dataset,
                          processing_class=tokenizer, reward_processing_classes=reward_tokenizer)
    started = time.perf_counter()
    trainer.train()
    total = time.perf_counter() - started
    print(json.dumps({"impl": "trl-grpo", "prompts": args.prompts_count, "group": args.group, "rows": rows_per_step,
                      "new_tokens": args.new_tokens, "iteration_s": round(total, 2),
                      "max_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
                      "threads": args.threads}))


if __name__ == "__main__":
    main()
