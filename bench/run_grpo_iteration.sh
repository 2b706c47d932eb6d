#!/usr/bin/env bash
# One GRPO iteration (one optimizer step), marlhf beside Hugging Face TRL's GRPOTrainer
# (bench/trl_grpo_iteration.py): the first PROMPTS Austen prompts answered GROUP times each,
# NEW_TOKENS tokens at temperature 1 (top-k and top-p off), scored by the same reward model,
# KL coefficient BETA against the same reference, float32 on the CPU, THREADS threads. Same
# weights as bench/run_ppo_iteration.sh (SmolLM2-135M-Instruct as an f32 folder, its reward
# folder; run that script once to make them). Per implementation: the iteration's time
# (marlhf: generation + experience + training from its metrics; TRL: train() for its one
# step) and the process's peak resident memory. TRL's KL is a k3 term in the loss, and so is
# marlhf's by default (KL_FORM=loss: --kl-ctl 0 --kl-loss-coef BETA, TRL's GRPO exactly; the
# step is on-policy, so neither runs the actor over the rollout before training);
# KL_FORM=reward puts it on the reward instead (TRL's RLOO form, --kl-ctl BETA: marlhf then
# needs the actor's experience pass). Both run the reference forward. Both recompute
# activations in the backward (TRL's GRPOConfig turns gradient checkpointing on by default;
# marlhf gets --gradient-checkpointing).
# Prints one JSON line per implementation.
#   PROMPTS=4 GROUP=4 NEW_TOKENS=48 BETA=0.05 THREADS=2 KL_FORM=loss bench/run_grpo_iteration.sh
set -euo pipefail
cd "$(dirname "$0")/.."
prompts=${PROMPTS:-4} group=${GROUP:-4} new_tokens=${NEW_TOKENS:-48} beta=${BETA:-0.05} threads=${THREADS:-2}
kl_form=${KL_FORM:-loss}
case "$kl_form" in
    loss) kl_args=(--kl-ctl 0 --kl-loss-coef "$beta") ;;
    reward) kl_args=(--kl-ctl "$beta") ;;
    *) echo "KL_FORM must be loss or reward" >&2; exit 1 ;;
esac
hf=${HF_DIR:-/tmp/smollm2-hf} rm=${RM_DIR:-/tmp/smollm2-rm} out=${OUT_DIR:-/tmp/grpo-bench}
[ -f "$hf/model.safetensors" ] && [ -f "$rm/model.safetensors" ] || { echo "run bench/run_ppo_iteration.sh first" >&2; exit 1; }
rm -rf "$out" && mkdir -p "$out"
head -n "$prompts" data/austen/ppo_prompts.jsonl > "$out/prompts.jsonl"
rows=$((prompts * group))
/usr/bin/time -f "%M" -o "$out/rss" build/marlhf ppo --actor-model "$hf" --reward-model "$rm" --prompts "$out/prompts.jsonl" \
    --output "$out/marlhf" --advantage-estimator grpo --samples-per-prompt "$group" --rollout-batch-size "$prompts" \
    --generation-batch-size "$rows" --micro-batch-size "$rows" --num-minibatches 1 --ppo-epochs 1 --max-iterations 1 \
    --max-new-tokens "$new_tokens" --min-response-tokens 1 --temperature 1 --top-k 0 --top-p 1 "${kl_args[@]}" \
    --warmup-ratio 0 --termination-condition token --gradient-checkpointing --threads "$threads" --quiet \
    > "$out/marlhf.log" 2>&1 ||
    { cat "$out/marlhf.log" >&2; exit 1; }
python3 - "$out/marlhf/metrics.jsonl" "$kl_form" "$(tail -n 1 "$out/rss")" "$prompts" "$group" "$new_tokens" "$threads" << 'PY'
import json, sys
path, kl_form, (rss_kb, prompts, group, new_tokens, threads) = sys.argv[1], sys.argv[2], map(int, sys.argv[3:])
m = next(r for r in map(json.loads, open(path)) if "train/time_generation" in r)
g, e, t = (m["train/time_" + k] for k in ("generation", "experience", "training"))
print(json.dumps({"impl": "marlhf-grpo", "prompts": prompts, "group": group, "rows": prompts * group,
                  "new_tokens": new_tokens, "iteration_s": round(g + e + t, 2), "generation_s": round(g, 2),
                  "experience_s": round(e, 2), "training_s": round(t, 2), "max_rss_mb": round(rss_kb / 1024),
                  "threads": threads, "kl_form": kl_form}))
PY
py=.venv-tools/bin/python
if [ -x "$py" ] && "$py" -c "import trl" 2> /dev/null; then
    export OMP_NUM_THREADS=$threads MKL_NUM_THREADS=$threads TOKENIZERS_PARALLELISM=false
    "$py" bench/trl_grpo_iteration.py --actor "$hf" --reward "$rm" --prompts "$out/prompts.jsonl" \
        --prompts-count "$prompts" --group "$group" --new-tokens "$new_tokens" --beta "$beta" --threads "$threads" \
        --output "$out/trl" 2> "$out/trl.log" | tail -n 1 || { tail -n 5 "$out/trl.log" >&2; exit 1; }
else
    echo '{"impl": "trl-grpo", "skipped": "run scripts/setup-python first"}'
fi
