#!/usr/bin/env bash
# One PPO iteration of marlhf beside one PPO iteration of Hugging Face TRL's PPOTrainer
# (bench/trl_ppo_iteration.py), on the CPU, one after the other, timed in three parts:
#   generation  sampling the responses (batch of prompts, NEW_TOKENS each)
#   experience  the no-grad forwards on the rollout (reference log-probs, critic values,
#               reward score; marlhf also re-runs the actor, TRL reuses generate()'s
#               scores) and the rewards/GAE
#   training    one PPO epoch: micro-batches of actor + critic forward/backward, AdamW
# Same weights (SmolLM2-135M-Instruct from the Q4_1 GGUF, converted to an f32 Hugging
# Face folder), same reward/critic folder (those weights + a fixed-seed score head), the
# same first BATCH prompts (same token ids: plain text, no chat template), temperature 1,
# top-k 0, top-p 1, float32, THREADS threads. Vanilla token-level PPO on the marlhf side.
# Model loading and saving are not timed. Builds nothing: run `make` first; needs
# .venv-tools with TRL 1.10-1.12 (PPOTrainer left TRL in 1.13).
# Prints two JSON lines (impl "marlhf" and "trl-<version>") and a short table.
# ROLLOUT_LOGPROBS=1: marlhf takes its old log-probs from generation as TRL does
# (--old-logprobs-from-rollout) instead of its actor's pass over the rollout.
# ITERATIONS=N: both run N iterations over the same BATCH prompts and report the last
# one's three parts (the first also pays for the memory each process touches first; the
# later ones are the steady state of a long run).
#   BATCH=16 MICRO=8 GEN_BATCH=16 NEW_TOKENS=48 THREADS=2 ITERATIONS=1 bench/run_ppo_iteration.sh
set -euo pipefail
cd "$(dirname "$0")/.."
batch=${BATCH:-16} micro=${MICRO:-8} gen_batch=${GEN_BATCH:-16} new_tokens=${NEW_TOKENS:-48}
threads=${THREADS:-2} iterations=${ITERATIONS:-1}
[[ "$iterations" =~ ^[1-9][0-9]*$ ]] ||
    { echo "marlhf: error: ITERATIONS=$iterations: must be a whole number from 1 (bench/run_ppo_iteration.sh)" >&2; exit 2; }
hf=${HF_DIR:-/tmp/smollm2-hf} rm=${RM_DIR:-/tmp/smollm2-rm} out=${OUT_DIR:-/tmp/ppo-bench}
py=.venv-tools/bin/python
. bench/smollm2_models.sh
rm -rf "$out" && mkdir -p "$out"
load() { echo "load average $1: $(cut -d' ' -f1-3 /proc/loadavg) (on $(nproc) cores; >0.5 = shared machine)" >&2; }
head -n "$batch" data/austen/ppo_prompts.jsonl >"$out/prompts.jsonl"

load "before marlhf"
# marlhf: the run folder holds only these BATCH prompts, so iteration 1 uses all of them
# (and each further iteration is another epoch of them, as TRL's).
# --min-response-tokens 1: keep every row (TRL drops none); --warmup-ratio 0: TRL has none.
build/marlhf ppo --actor-model "$hf" --reward-model "$rm" --prompts "$out/prompts.jsonl" \
    --output "$out/marlhf" --rollout-batch-size "$batch" --generation-batch-size "$gen_batch" \
    --micro-batch-size "$micro" --num-minibatches 1 --ppo-epochs 1 --max-iterations "$iterations" --num-train-epochs "$iterations" \
    --max-new-tokens "$new_tokens" --min-response-tokens 1 --temperature 1 --top-k 0 --top-p 1 \
    --warmup-ratio 0 --termination-condition token --threads "$threads" --quiet \
    ${ROLLOUT_LOGPROBS:+--old-logprobs-from-rollout} >"$out/marlhf.log" 2>&1 ||
    { cat "$out/marlhf.log" >&2; exit 1; }
"$py" - "$out/marlhf/metrics.jsonl" "$batch" "$new_tokens" "$threads" "$iterations" >"$out/results.jsonl" <<'EOF'
import json, sys
path, batch, new_tokens, threads, iterations = sys.argv[1], *map(int, sys.argv[2:])
rows = [r for r in map(json.loads, open(path)) if "train/time_generation" in r]
assert len(rows) == iterations, f"{path}: {len(rows)} iterations, {iterations} asked for"
m = rows[-1]
g, e, t = (m["train/time_" + k] for k in ("generation", "experience", "training"))
print(json.dumps({"impl": "marlhf", "generation_s": round(g, 3), "experience_s": round(e, 3),
                  "training_s": round(t, 3), "total_s": round(g + e + t, 3), "batch": batch,
                  "new_tokens": new_tokens, "threads": threads,
                  "mean_response_tokens": round(m["train/response_length"], 2),
                  "old_logprobs": "rollout" if m["train/old_logprobs_from_rollout"] else "actor pass",
                  "iteration": iterations}))
EOF

load "before TRL"
"$py" bench/trl_ppo_iteration.py --actor "$hf" --reward "$rm" --prompts data/austen/ppo_prompts.jsonl \
    --batch "$batch" --micro-batch "$micro" --generation-batch "$gen_batch" --new-tokens "$new_tokens" \
    --threads "$threads" --iterations "$iterations" 2>"$out/trl.log" | tail -n 1 >>"$out/results.jsonl" ||
    { cat "$out/trl.log" >&2; exit 1; }
load "after TRL"
cat "$out/results.jsonl"
"$py" - "$out/results.jsonl" <<'EOF'
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
keys = ["generation_s", "experience_s", "training_s", "total_s", "mean_response_tokens"]
print(f"\n{'impl':<12}{'generation':>12}{'experience':>12}{'training':>12}{'total':>12}{'resp tokens':>13}")
for r in rows:
    print(f"{r['impl']:<12}" + "".join(f"{r[k]:>11.2f}s" for k in keys[:4]) + f"{r[keys[4]]:>13.1f}")
if len(rows) == 2 and all(rows[0][k] > 0 for k in keys[:4]):
    print(f"{'trl/marlhf':<12}" + "".join(f"{rows[1][k] / rows[0][k]:>11.2f}x" for k in keys[:4]))
EOF
