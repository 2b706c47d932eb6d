#!/usr/bin/env bash
# Data-parallel training step on this machine's cores: marlhf (bench/data_parallel_step,
# MPI) beside PyTorch DDP (bench/torch_ddp_step.py, gloo), same model shape, same global
# batch, in one run. Two configurations each, and the data-parallel one again with ZeRO-1
# (the AdamW moments sharded across ranks: marlhf --zero-stage 1, PyTorch's
# ZeroRedundancyOptimizer) and ZeRO-2 (the gradients too: marlhf --zero-stage 2, PyTorch's
# FSDP2 with reshard_after_forward=False) and ZeRO-3 (the layers' weights too: marlhf
# --zero-stage 3, PyTorch's FSDP2 with reshard_after_forward=True):
#   1 process x CORES threads, batch RANKS*BATCH      (no data parallelism: the baseline)
#   RANKS processes x CORES/RANKS threads, BATCH each (data parallel)
# Prints the JSON lines and a table of tokens/s. Needs `make bench` and, for the PyTorch
# side, scripts/setup-python.
#   MODEL=smollm2-135m RANKS=2 BATCH=2 SEQ=256 STEPS=3 bench/run_data_parallel.sh
set -euo pipefail
cd "$(dirname "$0")/.."
model=${MODEL:-smollm2-135m} ranks=${RANKS:-2} batch=${BATCH:-2} seq=${SEQ:-256} steps=${STEPS:-3}
cores=$(nproc)
per_rank=$((cores / ranks > 0 ? cores / ranks : 1))
bin=${BUILD:-build}/bench/data_parallel_step
py=.venv-tools/bin/python
[ -x "$bin" ] || { echo "$bin missing: run make bench" >&2; exit 1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl_vader_single_copy_mechanism=none
out=$(mktemp)
common=(--model "$model" --seq "$seq" --steps "$steps")
"$bin" "${common[@]}" --batch $((ranks * batch)) --threads "$cores" | tee -a "$out"
mpirun --oversubscribe --bind-to none -np "$ranks" "$bin" "${common[@]}" --batch "$batch" --threads "$per_rank" | tee -a "$out"
for stage in 1 2 3; do
    mpirun --oversubscribe --bind-to none -np "$ranks" "$bin" "${common[@]}" --batch "$batch" --threads "$per_rank" \
        --zero-stage $stage | tee -a "$out"
done
if [ -x "$py" ]; then
    "$py" bench/torch_ddp_step.py "${common[@]}" --ranks 1 --threads "$cores" --batch $((ranks * batch)) | tee -a "$out"
    for sharding in none zero1 zero2 zero3; do
        "$py" bench/torch_ddp_step.py "${common[@]}" --ranks "$ranks" --threads "$per_rank" --batch "$batch" \
            --sharding $sharding | tee -a "$out"
    done
else
    echo '{"impl": "pytorch", "skipped": "run scripts/setup-python first"}'
fi
python3 - "$out" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
print("\n| impl | processes x threads | batch per process | tokens/s | step s | gradient sum s | optimizer s | peak RSS MB (rank 0) |")
print("|---|---|---|---|---|---|---|---|")
for r in rows:
    print(f"| {r['impl']} | {r['ranks']} x {r['threads_per_rank']} | {r['batch_per_rank']} | {r['tokens_per_s']:.1f} "
          f"| {r['step_s']:.3f} | {r.get('gradient_sum_s', '-') if r['ranks'] > 1 else '-'} "
          f"| {r.get('optimizer_s', '-')} | {r.get('peak_rss_mb', '-')} |")
PY
rm -f "$out"
