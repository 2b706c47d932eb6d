#!/usr/bin/env bash
# ZeRO-3 started from a model file: every rank's peak resident memory over one SFT step of
# SmolLM2-135M (its float32 Hugging Face folder) on RANKS processes of this machine.
#   marlhf:  mpirun -np RANKS marlhf sft --zero-stage 3: each rank reads only its shard of the
#            layers from the file (dist_weights_load_range), rank 0 broadcasts the embeddings,
#            final norm and head; the final model is gathered to rank 0 and written.
#   PyTorch: FSDP2 with reshard_after_forward=True (its ZeRO-3) on the model that
#            transformers' from_pretrained loaded on every rank (bench/torch_ddp_step.py
#            --load), the usual way; nothing written.
# The same shapes: batch 1 of 64 tokens per rank, AdamW. Prints each rank's peak and a table.
# LORA=R: LoRA adapters of rank R on every linear layer, the base frozen: marlhf with
# --lora-rank R under --zero-stage 2 (the base whole on every rank) and 3 (the base sharded),
# PyTorch FSDP2 ZeRO-3 on a PEFT model (torch_ddp_step.py --lora R).
# (Unsharded runs are left out: on 8 ranks PyTorch DDP's ranks hold about 3 GB each, which
# a 23 GB machine cannot hold.)
# Needs `make` and, for PyTorch, scripts/setup-python. The float32 folder is made once from
# the GGUF that scripts/fetch-model brings (marlhf convert).
#   RANKS=8 HF=/tmp/smollm2-hf [LORA=16] [BIN=build/marlhf] bench/run_zero3_load.sh
set -euo pipefail
cd "$(dirname "$0")/.."
ranks=${RANKS:-8} lora=${LORA:-0} threads=1 py=.venv-tools/bin/python hf=${HF:-/tmp/smollm2-hf} bin=${BIN:-build/marlhf}
[ -x "$bin" ] || { echo "$bin missing: run make" >&2; exit 1; }
[ -f "$hf/model.safetensors" ] || "$bin" convert models/SmolLM2-135M-Instruct.Q4_1.gguf "$hf" --overwrite >&2
export OMP_NUM_THREADS=$threads
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl_vader_single_copy_mechanism=none
run=$(mktemp -d) out=$(mktemp)
stages=3 lora_options=() torch_lora=()
if [ "$lora" -gt 0 ]; then stages="2 3" lora_options=(--lora-rank "$lora") torch_lora=(--lora "$lora"); fi
for stage in $stages; do
    # Each rank under /usr/bin/time, which reports its peak resident set (KB) on exit, into a
    # file of its own: lines through mpirun's forwarded output can come interleaved.
    mkdir -p "$run/peaks$stage"
    PEAKS="$run/peaks$stage" mpirun --oversubscribe --bind-to none -np "$ranks" -x PEAKS bash -c \
        '/usr/bin/time -o "$PEAKS/$OMPI_COMM_WORLD_RANK" -f "%M" "$@"' rank \
        "$bin" sft --model "$hf" --data tests/fixtures/train/sft.jsonl --max-seq-len 64 \
        --per-device-train-batch-size 1 --max-steps 1 --zero-stage $stage "${lora_options[@]}" --threads $threads \
        --output "$run/sft$stage" --quiet 2> "$run/time$stage.err"
    python3 - "$run/peaks$stage" "$ranks" "marlhf-zero$stage${lora_options:+-lora$lora}" >> "$out" <<'PY'
import json, os, sys
peaks = {int(r): round(int(open(os.path.join(sys.argv[1], r)).read().split()[-1]) / 1024) for r in os.listdir(sys.argv[1])}
ranks = int(sys.argv[2])
print(json.dumps({"impl": sys.argv[3], "ranks": ranks, "peak_rss_mb_by_rank": [peaks.get(r) for r in range(ranks)]}))
PY
    tail -n 1 "$out"
done
if [ -x "$py" ]; then
    "$py" bench/torch_ddp_step.py --load "$hf" --ranks "$ranks" --threads $threads --batch 1 --seq 64 \
        --steps 1 --warmup 0 --sharding zero3 "${torch_lora[@]}" | tee -a "$out"
else
    echo '{"impl": "pytorch", "skipped": "run scripts/setup-python first"}'
fi
python3 - "$out" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
print("\n| impl | processes | peak RSS MB, rank 0 | largest of the other ranks | smallest |")
print("|---|---|---|---|---|")
for r in rows:
    if "skipped" in r: continue
    peaks = r["peak_rss_mb_by_rank"]
    others = [p for p in peaks[1:] if p is not None]  # a rank whose line mpirun's interleaving lost: None
    print(f"| {r['impl']} | {r['ranks']} | {peaks[0]} | {max(others)} | {min([peaks[0]] + others)} |")
PY
rm -rf "$run" "$out"
