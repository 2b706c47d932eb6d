#!/usr/bin/env bash
# DPO on SmolLM2-135M, marlhf beside Hugging Face TRL's DPOTrainer (bench/trl_dpo_step.py)
# on the same pairs (the first STEPS x BATCH of data/austen/rm_train.jsonl), batch, sequence
# limit and thread count, float32 on the CPU. Per implementation: the training time train_s
# (marlhf: process start to the last step, loading and the reference log-probs included;
# TRL: train(), its reference passes included, loading not), the mean optimizer step after
# the first, and the peak resident memory; for marlhf also total_s, which adds writing the
# final checkpoint and model (TRL here saves nothing). Both recompute activations in the
# backward (TRL's DPOConfig turns gradient checkpointing on by default; marlhf gets
# --gradient-checkpointing). TRL runs twice: its default (the reference model's forward
# in every step) and --precompute-ref (all reference log-probs first, as marlhf does).
# Prints one JSON line per run.
#   STEPS=8 BATCH=4 MAX_LEN=256 THREADS=2 bench/run_dpo_step.sh
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${STEPS:-8} batch=${BATCH:-4} max_len=${MAX_LEN:-256} threads=${THREADS:-2}
hf=${HF_DIR:-/tmp/smollm2-hf} out=${OUT_DIR:-/tmp/dpo-bench}
if [ ! -f "$hf/model.safetensors" ]; then
    build/marlhf convert models/SmolLM2-135M-Instruct.Q4_1.gguf "$hf" > /dev/null
fi
rm -rf "$out" && mkdir -p "$out"
head -n $((steps * batch)) data/austen/rm_train.jsonl > "$out/pairs.jsonl"
. bench/preference_bench.sh
timed_marlhf "$out" marlhf-dpo "$steps" batch_pairs "$batch" "$threads" \
    build/marlhf dpo --model "$hf" --data "$out/pairs.jsonl" --output "$out/run" \
    --per-device-train-batch-size "$batch" --max-steps "$steps" --max-seq-len "$max_len" --learning-rate 1e-6 \
    --beta 0.1 --gradient-checkpointing --threads "$threads" --quiet
trl_peer "$out" trl-dpo "$threads" \
    bench/trl_dpo_step.py --model "$hf" --pairs "$out/pairs.jsonl" --steps "$steps" \
    --batch "$batch" --max-length "$max_len"
