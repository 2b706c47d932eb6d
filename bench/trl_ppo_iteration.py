#!/usr/bin/env python3
"""PPO iterations of Hugging Face TRL's PPOTrainer on the CPU, the last one timed in three parts.

The peer of marlhf's `ppo --max-iterations 1 --termination-condition token` run in
bench/run_ppo_iteration.sh: same weights (a Hugging Face folder from `marlhf convert`),
same reward model / critic initialisation (a LlamaForSequenceClassification folder with
one `score.weight` row, made by --make-reward-model), same prompts, float32, N threads.

    .venv-tools/bin/python bench/trl_ppo_iteration.py --make-reward-model /tmp/smollm2-rm \
        --actor /tmp/smollm2-hf
    .venv-tools/bin/python bench/trl_ppo_iteration.py --actor /tmp/smollm2-hf \
        --reward /tmp/smollm2-rm --prompts data/austen/ppo_prompts.jsonl \
        [--batch 16] [--micro-batch 8] [--generation-batch 16] [--new-tokens 48] [--threads 2] \
        [--iterations 1]

It runs the real trainer: trl.experimental.ppo.PPOTrainer.train() (TRL 1.10-1.12; PPO
left TRL in 1.13), with total_episodes = batch x iterations so train() does exactly that
many iterations, each over the same --batch prompts (one epoch of the dataset each):
  rollout batch   = per_device_train_batch_size (micro) x gradient_accumulation_steps
  num_mini_batches = 1, num_ppo_epochs = 1  -> one optimizer step after batch/micro
                    micro-batches, each a policy+value forward/backward
  local_rollout_forward_batch_size = --generation-batch (generation AND the
                    no-grad ref/value/reward forwards go in chunks of this size)
  sampling: temperature 1, top_k 0, top_p 1 (TRL's fixed settings); stop_token None,
                    so generate() has no EOS and every row gets exactly --new-tokens
                    tokens (an <|im_end|> sampled mid-way does not stop generation,
                    but TRL then masks the rest of that row as padding, since the
                    tokenizer's pad token is <|im_end|>).
Prompts are the first --batch rows' "prompt" text, tokenized as marlhf does (the plain
text, the tokenizer's own special tokens — none for SmolLM2 — no chat template), left-padded.

Timing (no change to what TRL computes): three module-level names that train() looks up
at call time in trl.experimental.ppo.ppo_trainer are wrapped (monkeypatched):
  batch_generation   -> generation_s = its duration (HF generate with output_scores;
                        TRL takes the rollout log-probs from these scores, so there is
                        no separate policy forward in the experience phase)
  forward            -> the first call on the PolicyAndValueWrapper marks the start of
                        training; experience_s = end of generation .. that mark
                        (ref forward, value + reward forwards via get_reward, rewards,
                        GAE, whitening)
  PPOTrainer.log     -> its first call (right after the PPO epoch loop) ends training;
                        training_s = first training forward .. that call
total_s = the sum of the three (as marlhf's metrics). With --iterations N the marks are
taken per iteration and the last one's are reported (the first iteration also pays for
memory the process touches for the first time; later ones show the steady state). Model
loading and trainer set-up are outside the timed window; the whole train() call is
reported on stderr.

Prints one JSON line on stdout:
  {"impl": "trl-<version>", "generation_s", "experience_s", "training_s", "total_s",
   "batch", "new_tokens", "threads", "mean_response_tokens", "iteration"}
mean_response_tokens: response tokens per row that TRL trains on (48 unless a row
sampled <|im_end|>, see above).
"""
import argparse
import resource
import contextlib
import json
import os
import sys
import tempfile
import time
import warnings


def make_reward_model(actor, out, seed):
    """The actor's weights as a LlamaForSequenceClassification with a fixed-seed score head."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    model = AutoModelForSequenceClassification.from_pretrained(actor, num_labels=1, dtype=torch.float32)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        std = getattr(model.config, "initializer_range", 0.02)
        model.score.weight.copy_(torch.randn(model.score.weight.shape, generator=generator) * std)
    model.config.pad_token_id = model.config.pad_token_id if model.config.pad_token_id is not None else 2
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(actor).save_pretrained(out)
    print(f"wrote {out} (score.weight {tuple(model.score.weight.shape)}, seed {seed})", file=sys.stderr)


class OneLineErrors(argparse.ArgumentParser):
    """A bad option is one line on stderr and exit 2, as marlhf's own (no usage dump)."""

    def error(self, message):
        print(f"marlhf: error: {message}", file=sys.stderr)
        sys.exit(2)


def main():
    ap = OneLineErrors(description=__doc__.split("\n")[0])
    ap.add_argument("--actor", default="/tmp/smollm2-hf")
    ap.add_argument("--reward", default="/tmp/smollm2-rm")
    ap.add_argument("--make-reward-model", metavar="OUT", help="write the reward-model folder and exit")
    ap.add_argument("--prompts", default="data/austen/ppo_prompts.jsonl")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--micro-batch", type=int, default=8)
    ap.add_argument("--generation-batch", type=int, default=16)
    ap.add_argument("--new-tokens", type=int, default=48)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--iterations", type=int, default=1, help="PPO iterations; the last one is timed")
    ap.add_argument("--lora-rank", type=int, default=0,
                    help="PEFT LoRA on the policy (every linear layer); the reference is then the policy "
                         "with its adapter disabled (TRL's peft_config path; the value model stays whole)")
    args = ap.parse_args()
    if args.iterations < 1:
        ap.error(f"--iterations {args.iterations}: must be a whole number from 1")

    import torch

    torch.set_num_threads(args.threads)
    if args.make_reward_model:
        make_reward_model(args.actor, args.make_reward_model, seed=0)
        return

    warnings.filterwarnings("ignore")
    import transformers
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer

    transformers.logging.set_verbosity_error()
    import trl
    import trl.experimental.ppo.ppo_trainer as ppo_module
    from trl.experimental.ppo import PPOConfig, PPOTrainer

    tokenizer = AutoTokenizer.from_pretrained(args.actor)
    tokenizer.padding_side = "left"
    with open(args.prompts) as f:
        texts = [json.loads(line)["prompt"] for line in f if line.strip()][: args.batch]
    if len(texts) < args.batch:
        sys.exit(f"{args.prompts}: fewer than {args.batch} prompts")
    ids = [tokenizer(t, add_special_tokens=True)["input_ids"] for t in texts]
    dataset = Dataset.from_dict({"input_ids": ids})

    f32 = torch.float32
    policy = AutoModelForCausalLM.from_pretrained(args.actor, dtype=f32)
    ref_policy = None if args.lora_rank else AutoModelForCausalLM.from_pretrained(args.actor, dtype=f32)
    peft_config = None
    if args.lora_rank:
        import peft
        peft_config = peft.LoraConfig(r=args.lora_rank, lora_alpha=args.lora_rank, lora_dropout=0.0,
                                      target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                                      "down_proj"], task_type="CAUSAL_LM")
    value_model = AutoModelForSequenceClassification.from_pretrained(args.reward, num_labels=1, dtype=f32)
    reward_model = AutoModelForSequenceClassification.from_pretrained(args.reward, num_labels=1, dtype=f32)

    out_dir = tempfile.mkdtemp(prefix="trl-ppo-bench-")
    config = PPOConfig(
        output_dir=out_dir, report_to="none", save_strategy="no", logging_steps=1, disable_tqdm=True,
        use_cpu=True, bf16=False, fp16=False, seed=args.seed, dataloader_num_workers=0,
        per_device_train_batch_size=args.micro_batch,
        gradient_accumulation_steps=args.batch // args.micro_batch,
        num_mini_batches=1, num_ppo_epochs=1, total_episodes=args.batch * args.iterations,
        local_rollout_forward_batch_size=args.generation_batch,
        response_length=args.new_tokens, temperature=1.0, stop_token=None, num_sample_generations=0,
        # marlhf's defaults, for parity (they do not change the work done)
        learning_rate=1.5e-5, weight_decay=0.1, adam_beta2=0.95, kl_coef=0.05, cliprange=0.2,
        cliprange_value=0.2, gamma=1.0, lam=0.95,
    )
    trainer = PPOTrainer(args=config, processing_class=tokenizer, model=policy, ref_model=ref_policy,
                         reward_model=reward_model, train_dataset=dataset, value_model=value_model,
                         eval_dataset=dataset, peft_config=peft_config)

    marks = []  # per iteration: gen_start, gen_end, train_start, train_end
    lengths = {}
    real_generation, real_forward, real_log = ppo_module.batch_generation, ppo_module.forward, trainer.log

    def timed_generation(model, queries, chunk, pad_token_id, generation_config, *a, **k):
        marks.append({"gen_start": time.perf_counter()})  # one call an iteration (it chunks itself)
        result = real_generation(model, queries, chunk, pad_token_id, generation_config, *a, **k)
        marks[-1]["gen_end"] = time.perf_counter()
        responses = result[0][:, queries.shape[1]:]
        trained = ppo_module.first_true_indices(responses == pad_token_id)  # TRL's own sequence_lengths + 1
        lengths.update(generated=responses.shape[1], trained=trained.float().mean().item())
        return result

    def timed_forward(model, *a, **k):
        if marks and isinstance(trainer.accelerator.unwrap_model(model), ppo_module.PolicyAndValueWrapper):
            marks[-1].setdefault("train_start", time.perf_counter())
        return real_forward(model, *a, **k)

    def timed_log(*a, **k):
        if marks:
            marks[-1].setdefault("train_end", time.perf_counter())
        return real_log(*a, **k)

    ppo_module.batch_generation, ppo_module.forward, trainer.log = timed_generation, timed_forward, timed_log
    t0 = time.perf_counter()
    with contextlib.redirect_stdout(sys.stderr):  # TRL prints its log dicts; stdout keeps the JSON line
        trainer.train()
    wall = time.perf_counter() - t0

    if len(marks) != args.iterations:
        sys.exit(f"trl: {len(marks)} generations for {args.iterations} iterations")
    last = marks[-1]
    generation = last["gen_end"] - last["gen_start"]
    experience = last["train_start"] - last["gen_end"]
    training = last["train_end"] - last["train_start"]
    print(f"trl: train() {wall:.2f} s; {args.batch} rows x {lengths['generated']} generated tokens, "
          f"{lengths['trained']:.1f} trained per row (before any <|im_end|>)", file=sys.stderr)
    print(json.dumps({
        "impl": f"trl-{trl.__version__}", "generation_s": round(generation, 3), "experience_s": round(experience, 3),
        "training_s": round(training, 3), "total_s": round(generation + experience + training, 3),
        "batch": args.batch, "new_tokens": args.new_tokens, "threads": args.threads,
        "mean_response_tokens": round(lengths["trained"], 2), "lora_rank": args.lora_rank,
        "iteration": args.iterations,
        "max_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
    }))


if __name__ == "__main__":
    main()
