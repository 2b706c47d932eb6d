#!/usr/bin/env bash
# One training step of marlhf beside PyTorch doing the same step, in the same run.
# Needs scripts/setup-python for the PyTorch side. Prints the JSON lines of both.
set -euo pipefail
cd "$(dirname "$0")/.."
make --no-print-directory bench >/dev/null
batch=${BATCH:-4}
seq=${SEQ:-256}
steps=${STEPS:-3}
model=${MODEL:-all} # gpt2-124m, smollm2-135m, gemma2-135m, gemma3-135m, or all (the first two)
build/bench/train_step --batch "$batch" --seq "$seq" --steps "$steps" --model "$model"
if [ -x .venv-tools/bin/python ]; then
    .venv-tools/bin/python bench/torch_train_step.py --batch "$batch" --seq "$seq" --steps "$steps" --model "$model" 2>/dev/null
else
    echo '{"impl": "pytorch", "skipped": "run scripts/setup-python first"}'
fi
