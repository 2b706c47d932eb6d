#!/usr/bin/env bash
# PPO's generation under ZeRO-3, gathering each layer for each decode step or the whole actor
# once (the hybrid engine, --enable-hybrid-engine), beside PyTorch FSDP2 generating the same
# way in the same run.
#   marlhf:  one PPO iteration of SmolLM2-135M (actor, critic, reference, reward model) on
#            RANKS processes: --zero-stage 2, --zero-stage 3, and --zero-stage 3
#            --enable-hybrid-engine. Reported: the generation phase's time (rank 0's
#            train/time_generation, which ends when the slowest rank's rows are done), the
#            whole run's time and every rank's peak resident memory (/usr/bin/time).
#   PyTorch: bench/torch_fsdp_generate.py, the actor alone under FSDP2's ZeRO-3, generating
#            the same rows with transformers' generate: layerwise (synced_gpus, as TRL and
#            DeepSpeed-Chat without a hybrid engine) and gathered (unshard, generate, reshard).
# The same prompts (the first ROLLOUTS of data/austen/ppo_prompts.jsonl, plain text), rank r
# the rows r, r + RANKS, ..., GEN_BATCH rows at a time, exactly NEW_TOKENS new tokens each
# (min new tokens = max), temperature 1, top-k 0, float32, one thread per rank.
# LORA=R: rank-R LoRA adapters on the actor and the critic (their frozen bases sharded under
# ZeRO-3, the actor's base also the reference); the PyTorch rows stay the plain actor's.
# SAVED=1 (with LORA): then two more runs, ZeRO-2 and ZeRO-3, starting from the adapters the
# ZeRO-2 run saved (--actor-lora-adapter, --critic-lora-adapter): the reference is then the
# actor's base with that adapter, whole on every rank under ZeRO-2, sharded under ZeRO-3.
# Needs `make` and scripts/setup-python.
#   RANKS=2 ROLLOUTS=8 GEN_BATCH=4 NEW_TOKENS=24 [LORA=16 [SAVED=1]] bench/run_ppo_zero3.sh
set -euo pipefail
cd "$(dirname "$0")/.."
ranks=${RANKS:-2} lora=${LORA:-0} saved=${SAVED:-0} rollouts=${ROLLOUTS:-8} gen_batch=${GEN_BATCH:-4} new_tokens=${NEW_TOKENS:-24}
threads=1 py=.venv-tools/bin/python hf=${HF_DIR:-/tmp/smollm2-hf} rm=${RM_DIR:-/tmp/smollm2-rm}
. bench/smollm2_models.sh
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl_vader_single_copy_mechanism=none
run=$(mktemp -d) out=$(mktemp)
trap 'rm -rf "$run" "$out"' EXIT
head -n "$rollouts" data/austen/ppo_prompts.jsonl > "$run/prompts.jsonl"
lora_options=()
[ "$lora" -gt 0 ] && lora_options=(--actor-lora-rank "$lora" --critic-lora-rank "$lora")
load() { echo "load average $1: $(cut -d' ' -f1-3 /proc/loadavg) (on $(getconf _NPROCESSORS_ONLN) cores)" >&2; }

marlhf() { # marlhf NAME OPTIONS...: one PPO iteration, each rank under /usr/bin/time
    local name=$1
    shift
    load "before marlhf $name"
    local start=$(date +%s.%N)
    # Each rank's peak (KB) into a file of its own: lines through mpirun's forwarded output
    # can come interleaved and lose a rank.
    mkdir -p "$run/$name.peaks"
    PEAKS="$run/$name.peaks" mpirun --oversubscribe --bind-to none -np "$ranks" -x PEAKS bash -c \
        '/usr/bin/time -o "$PEAKS/$OMPI_COMM_WORLD_RANK" -f "%M" "$@"' rank \
        build/marlhf ppo --actor-model "$hf" --reward-model "$rm" --prompts "$run/prompts.jsonl" \
        --output "$run/$name" --rollout-batch-size "$rollouts" --generation-batch-size "$gen_batch" \
        --micro-batch-size 2 --num-minibatches 1 --ppo-epochs 1 --max-iterations 1 \
        --max-new-tokens "$new_tokens" --min-new-tokens "$new_tokens" --min-response-tokens 1 \
        --temperature 1 --top-k 0 --top-p 1 --eval-every 0 --termination-condition token \
        --threads $threads --quiet "${lora_options[@]}" "$@" > "$run/$name.log" 2>&1 || { cat "$run/$name.log" >&2; exit 1; }
    local end=$(date +%s.%N)
    python3 - "$name" "$run/$name.peaks" "$run/$name/metrics.jsonl" "$start" "$end" "$ranks" "$lora" >> "$out" <<'PY'
import json, os, sys
name, peaks_dir, metrics, start, end, ranks, lora = sys.argv[1:]
ranks = int(ranks)
peaks = {int(r): round(int(open(os.path.join(peaks_dir, r)).read().split()[-1]) / 1024) for r in os.listdir(peaks_dir)}
m = next(r for r in map(json.loads, open(metrics)) if "train/time_generation" in r)
print(json.dumps({"impl": f"marlhf-{name}", "ranks": ranks, "lora_rank": int(lora), "generation_s": round(m["train/time_generation"], 3),
                  "run_s": round(float(end) - float(start), 1),
                  "mean_response_tokens": round(m["train/response_length"], 2),
                  "peak_rss_mb_by_rank": [peaks.get(r) for r in range(ranks)]}))
PY
    tail -n 1 "$out"
}

marlhf zero2 --zero-stage 2
marlhf zero3 --zero-stage 3
marlhf zero3-hybrid --zero-stage 3 --enable-hybrid-engine
if [ "$saved" = 1 ] && [ "$lora" -gt 0 ]; then
    lora_options=(--actor-lora-adapter "$run/zero2/final/actor" --critic-lora-adapter "$run/zero2/final/critic")
    marlhf zero2-saved-adapters --zero-stage 2
    marlhf zero3-saved-adapters --zero-stage 3
fi
for mode in layerwise gathered; do
    load "before pytorch $mode"
    OMP_NUM_THREADS=$threads "$py" bench/torch_fsdp_generate.py --model "$hf" --ranks "$ranks" --threads $threads \
        --rollouts "$rollouts" --generation-batch "$gen_batch" --new-tokens "$new_tokens" --mode "$mode" \
        2> "$run/torch_$mode.err" | tail -n 1 | tee -a "$out" || { cat "$run/torch_$mode.err" >&2; exit 1; }
done
python3 - "$out" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
print("\n| impl | generation s | peak RSS MB by rank |")
print("|---|---|---|")
for r in rows:
    print(f"| {r['impl']} | {r['generation_s']} | {' / '.join(map(str, r['peak_rss_mb_by_rank']))} |")
PY
