#!/usr/bin/env bash
# A LoRA training step (rank 8 on every linear layer, base frozen; with lora_dropout
# $DROPOUT, default 0.05; DoRA, PEFT's use_dora; and QLoRA, the frozen base quantized to each
# of $QUANTIZE, default "q8_0 q4_0 nf4"; PyTorch's QLoRA, bitsandbytes' Linear4bit NF4 with
# double quantization on its CPU backend, for each of $PEFT_QUANTIZE, default "nf4") beside full fine-tuning,
# for marlhf and for PyTorch + PEFT, SmolLM2-135M shape from random weights, in the same
# run. Each configuration runs in its own process so that max_rss_mb is its own peak
# memory. Needs scripts/setup-python (and peft) for the PyTorch side. Prints JSON lines.
set -euo pipefail
cd "$(dirname "$0")/.."
make --no-print-directory bench > /dev/null
batch=${BATCH:-4}
seq=${SEQ:-256}
steps=${STEPS:-3}
rank=${RANK:-8}
dropout=${DROPOUT:-0.05}
threads=${THREADS:-$(nproc)}
for r in 0 "$rank"; do
    OMP_NUM_THREADS=$threads build/bench/train_step --model smollm2-135m --batch "$batch" --seq "$seq" --steps "$steps" \
        --lora-rank "$r" | grep '"impl": "marlhf"'
done
OMP_NUM_THREADS=$threads build/bench/train_step --model smollm2-135m --batch "$batch" --seq "$seq" --steps "$steps" \
    --lora-rank "$rank" --lora-dropout "$dropout" | grep '"impl": "marlhf"'
OMP_NUM_THREADS=$threads build/bench/train_step --model smollm2-135m --batch "$batch" --seq "$seq" --steps "$steps" \
    --lora-rank "$rank" --use-dora | grep '"impl": "marlhf"'
for q in ${QUANTIZE-q8_0 q4_0 nf4}; do
    OMP_NUM_THREADS=$threads build/bench/train_step --model smollm2-135m --batch "$batch" --seq "$seq" --steps "$steps" \
        --lora-rank "$rank" --quantize "$q" | grep '"impl": "marlhf"'
done
if [ -x .venv-tools/bin/python ] && .venv-tools/bin/python -c "import peft" 2> /dev/null; then
    for r in 0 "$rank"; do
        .venv-tools/bin/python bench/torch_train_step.py --model smollm2-135m --batch "$batch" --seq "$seq" \
            --steps "$steps" --threads "$threads" --lora-rank "$r" 2> /dev/null
    done
    .venv-tools/bin/python bench/torch_train_step.py --model smollm2-135m --batch "$batch" --seq "$seq" \
        --steps "$steps" --threads "$threads" --lora-rank "$rank" --lora-dropout "$dropout" 2> /dev/null
    .venv-tools/bin/python bench/torch_train_step.py --model smollm2-135m --batch "$batch" --seq "$seq" \
        --steps "$steps" --threads "$threads" --lora-rank "$rank" --use-dora 2> /dev/null
    for q in ${PEFT_QUANTIZE-nf4}; do
        .venv-tools/bin/python bench/torch_train_step.py --model smollm2-135m --batch "$batch" --seq "$seq" \
            --steps "$steps" --threads "$threads" --lora-rank "$rank" --quantize "$q" 2> /dev/null
    done
else
    echo '{"impl": "pytorch", "skipped": "run scripts/setup-python first"}'
fi
