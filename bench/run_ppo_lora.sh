#!/usr/bin/env bash
# One PPO iteration with full fine-tuning and with LoRA adapters (rank RANK, every linear
# layer): time per part and the process's peak memory, marlhf beside Hugging Face TRL's
# PPOTrainer with a PEFT policy (bench/trl_ppo_iteration.py --lora-rank; TRL adapts the
# policy only, so marlhf runs "actor" LoRA for parity, and "actor+critic" LoRA as well).
# With actor adapters the reference model is the actor's frozen base, so the iteration
# holds three models' weights instead of four and no gradients or AdamW moments for the
# bases. Same setup as bench/run_ppo_iteration.sh (SmolLM2-135M-Instruct weights, its
# reward folder, the first BATCH Austen prompts, vanilla token-level PPO); run that script
# once first to build the folders, and `make`. Prints one JSON line per configuration.
# CONFIGS picks marlhf's configurations (default: full actor actor+critic); qlora-q8_0 and
# qlora-q4_0 are actor+critic LoRA over quantized bases (--actor-quantize, --critic-quantize;
# the reference is the actor's quantized base). TRL=0 skips TRL.
#   BATCH=16 MICRO=8 NEW_TOKENS=48 RANK=8 THREADS=2 bench/run_ppo_lora.sh
#   CONFIGS="actor+critic qlora-q8_0 qlora-q4_0" TRL=0 bench/run_ppo_lora.sh
set -euo pipefail
cd "$(dirname "$0")/.."
batch=${BATCH:-16} micro=${MICRO:-8} new_tokens=${NEW_TOKENS:-48} rank=${RANK:-8} threads=${THREADS:-2}
hf=${HF_DIR:-/tmp/smollm2-hf} rm=${RM_DIR:-/tmp/smollm2-rm} out=${OUT_DIR:-/tmp/ppo-lora-bench}
[ -f "$hf/model.safetensors" ] && [ -f "$rm/model.safetensors" ] || { echo "run bench/run_ppo_iteration.sh first" >&2; exit 1; }
rm -rf "$out" && mkdir -p "$out"
head -n "$batch" data/austen/ppo_prompts.jsonl > "$out/prompts.jsonl"
for config in ${CONFIGS:-full actor actor+critic}; do
    lora=() r=0
    [ "$config" = full ] || r=$rank
    [ "$config" = full ] || lora=(--actor-lora-rank "$r")
    [ "$config" = actor ] || [ "$config" = full ] || lora+=(--critic-lora-rank "$r")
    case $config in
        full | actor | actor+critic) ;;
        qlora-*) lora+=(--actor-quantize "${config#qlora-}" --critic-quantize "${config#qlora-}") ;;
        *) echo "unknown configuration $config" >&2; exit 1 ;;
    esac
    /usr/bin/time -f "%M" -o "$out/rss_$config" build/marlhf ppo --actor-model "$hf" --reward-model "$rm" \
        --prompts "$out/prompts.jsonl" --output "$out/run_$config" --rollout-batch-size "$batch" \
        --generation-batch-size "$batch" --micro-batch-size "$micro" --num-minibatches 1 --ppo-epochs 1 \
        --max-iterations 1 --max-new-tokens "$new_tokens" --min-response-tokens 1 --temperature 1 --top-k 0 \
        --top-p 1 --warmup-ratio 0 --termination-condition token --threads "$threads" --quiet "${lora[@]}" \
        > "$out/log_$config" 2>&1 || { cat "$out/log_$config" >&2; exit 1; }
    python3 - "$out/run_$config/metrics.jsonl" "$config" "$(tail -n 1 "$out/rss_$config")" "$r" "$batch" "$new_tokens" \
        "$threads" << 'PY'
import json, sys
path, config, rss_kb, rank, batch, new_tokens, threads = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:])
m = next(r for r in map(json.loads, open(path)) if "train/time_generation" in r)
g, e, t = (m["train/time_" + k] for k in ("generation", "experience", "training"))
print(json.dumps({"impl": "marlhf", "lora": config, "lora_rank": rank, "generation_s": round(g, 3), "experience_s": round(e, 3),
                  "training_s": round(t, 3), "total_s": round(g + e + t, 3), "max_rss_mb": round(rss_kb / 1024),
                  "batch": batch, "new_tokens": new_tokens, "threads": threads}))
PY
done
py=.venv-tools/bin/python
if [ "${TRL:-1}" = 0 ]; then
    :
elif [ -x "$py" ] && "$py" -c "import trl, peft" 2> /dev/null; then
    export OMP_NUM_THREADS=$threads MKL_NUM_THREADS=$threads TOKENIZERS_PARALLELISM=false
    for r in 0 "$rank"; do
        "$py" bench/trl_ppo_iteration.py --actor "$hf" --reward "$rm" --prompts "$out/prompts.jsonl" --batch "$batch" \
            --micro-batch "$micro" --generation-batch "$batch" --new-tokens "$new_tokens" --threads "$threads" \
            --lora-rank "$r" 2> "$out/trl_$r.log" || { tail -n 5 "$out/trl_$r.log" >&2; exit 1; }
    done
else
    echo '{"impl": "trl", "skipped": "run scripts/setup-python first"}'
fi
