#!/usr/bin/env bash
# SFT packing on SmolLM2-135M: one epoch over the same ROWS prompt/response rows of
# data/austen/sft_train.jsonl (25-110 tokens each), BATCH rows a micro-batch, MAX_LEN tokens a
# row, float32 on the CPU, THREADS threads. marlhf four ways -- one example a row (padded to
# the micro-batch's longest), --group-by-length, --padding-free (a micro-batch's examples in
# one row, each attending to itself only), --packing (bfd: rows of MAX_LEN tokens, padding-free
# as in TRL) -- beside Hugging Face TRL's SFTTrainer without packing, with padding_free=True
# and with packing=True (bench/trl_sft_epoch.py). Per run one JSON line: the epoch's wall time
# train_s (marlhf: process start to the last step, loading included; TRL: train()), its
# optimizer steps, the mean step after the first, the tokens of the training rows (padding
# not counted) and tokens_per_s = tokens / train_s, the peak resident memory.
#   ROWS=256 BATCH=8 MAX_LEN=256 THREADS=2 bench/run_sft_packing.sh
# The TRL peer runs with TRL_PYTHON (default .venv-tools/bin/python, scripts/setup-python).
set -euo pipefail
cd "$(dirname "$0")/.."
rows=${ROWS:-256} batch=${BATCH:-8} max_len=${MAX_LEN:-256} threads=${THREADS:-2}
model=${MODEL_DIR:-build/models/smollm2-f32} out=${OUT_DIR:-/tmp/sft-packing-bench}
py=${TRL_PYTHON:-.venv-tools/bin/python}
[ -f "$model/model.safetensors" ] || { echo "run_sft_packing.sh: no model in $model (scripts/fetch-model, then marlhf convert)" >&2; exit 2; }
rm -rf "$out" && mkdir -p "$out"
head -n "$rows" data/austen/sft_train.jsonl > "$out/rows.jsonl"

marlhf_epoch() { # marlhf_epoch IMPL [OPTIONS...]
    local impl=$1 start end
    shift
    start=$(date +%s.%N)
    /usr/bin/time -f "%M" -o "$out/$impl.rss" build/marlhf sft --model "$model" --data "$out/rows.jsonl" \
        --output "$out/$impl" --per-device-train-batch-size "$batch" --num-train-epochs 1 --max-seq-len "$max_len" \
        --learning-rate 1e-5 --threads "$threads" "$@" > "$out/$impl.log" 2>&1 || { tail -n 5 "$out/$impl.log" >&2; return 1; }
    end=$(date +%s.%N)
    python3 - "$out/$impl/metrics.jsonl" "$out/$impl.log" "$(tail -n 1 "$out/$impl.rss")" "$impl" "$rows" "$batch" \
        "$max_len" "$threads" << 'PY'
import json, re, sys
path, log, rss_kb, impl, rows, batch, max_len, threads = sys.argv[1:]
times = [r["time"] for r in map(json.loads, open(path)) if "train/loss" in r]
later = [b - a for a, b in zip(times, times[1:])] or times
line = next(l for l in open(log) if l.startswith("sft: "))
training_rows = int(re.search(r"into (\d+) rows", line).group(1)) if "packed" in line else int(line.split()[1])
tokens = int(re.search(r"(\d+) tokens;", line).group(1))
print(json.dumps({"impl": impl, "rows": int(rows), "batch": int(batch), "max_length": int(max_len),
                  "steps": len(times), "training_rows": training_rows, "tokens": tokens,
                  "train_s": round(times[-1], 2), "step_s": round(sum(later) / len(later), 3),
                  "tokens_per_s": round(tokens / times[-1], 1), "max_rss_mb": round(int(rss_kb) / 1024),
                  "threads": int(threads)}))
PY
}
marlhf_epoch marlhf-sft
marlhf_epoch marlhf-sft-group-by-length --group-by-length
marlhf_epoch marlhf-sft-padding-free --padding-free
marlhf_epoch marlhf-sft-packing-bfd --packing

if ! [ -x "$py" ] || ! "$py" -c "import trl" 2> /dev/null; then
    echo '{"impl": "trl-sft", "skipped": "run scripts/setup-python first (or set TRL_PYTHON)"}'
    exit 0
fi
export OMP_NUM_THREADS=$threads MKL_NUM_THREADS=$threads TOKENIZERS_PARALLELISM=false
for extra in "" --padding-free --packing; do
    "$py" bench/trl_sft_epoch.py --model "$model" --data "$out/rows.jsonl" --rows "$rows" --batch "$batch" \
        --max-length "$max_len" --threads "$threads" --output "$out/trl" $extra 2> "$out/trl.log" | tail -n 1 ||
        { tail -n 5 "$out/trl.log" >&2; exit 1; }
done
