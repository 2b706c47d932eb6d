#!/usr/bin/env bash
# KTO on SmolLM2-135M, marlhf beside Hugging Face TRL's KTOTrainer (bench/trl_kto_step.py) on
# the same examples (the first STEPS x BATCH / 2 pairs of data/austen/rm_train.jsonl, each a
# desirable and an undesirable completion, written as unpaired rows), batch, sequence limit and
# thread count, float32 on the CPU. Per implementation: the training time train_s (marlhf:
# process start to the last step, loading and the reference log-probs included; TRL:
# train(), its reference and KL passes included, loading not), the mean optimizer step after
# the first, and the peak resident memory; for marlhf also total_s, which adds writing the
# final checkpoint and model (TRL here saves nothing). Both recompute activations in the
# backward (TRL's KTOConfig turns gradient checkpointing on by default; marlhf gets
# --gradient-checkpointing). TRL runs twice: its default (the reference model's forwards in
# every step) and --precompute-ref (all reference log-probs first, as marlhf does).
# Prints one JSON line per run.
#   STEPS=8 BATCH=8 MAX_LEN=256 THREADS=2 bench/run_kto_step.sh
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${STEPS:-8} batch=${BATCH:-8} max_len=${MAX_LEN:-256} threads=${THREADS:-2}
hf=${HF_DIR:-/tmp/smollm2-hf} out=${OUT_DIR:-/tmp/kto-bench}
if [ ! -f "$hf/model.safetensors" ]; then
    build/marlhf convert models/SmolLM2-135M-Instruct.Q4_1.gguf "$hf" > /dev/null
fi
rm -rf "$out" && mkdir -p "$out"
head -n $((steps * batch / 2)) data/austen/rm_train.jsonl | python3 -c '
import json, sys
for line in sys.stdin:
    row = json.loads(line)
    for key, label in (("chosen", True), ("rejected", False)):
        print(json.dumps({"prompt": row["prompt"], "completion": row[key], "label": label}))' > "$out/examples.jsonl"
. bench/preference_bench.sh
timed_marlhf "$out" marlhf-kto "$steps" batch_examples "$batch" "$threads" \
    build/marlhf kto --model "$hf" --data "$out/examples.jsonl" --output "$out/run" \
    --per-device-train-batch-size "$batch" --max-steps "$steps" --max-seq-len "$max_len" --learning-rate 1e-6 \
    --beta 0.1 --gradient-checkpointing --threads "$threads" --quiet
trl_peer "$out" trl-kto "$threads" \
    bench/trl_kto_step.py --model "$hf" --examples "$out/examples.jsonl" --steps "$steps" \
    --batch "$batch" --max-length "$max_len"
