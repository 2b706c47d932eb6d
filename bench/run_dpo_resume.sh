#!/usr/bin/env bash
# What a DPO resume saves by taking the reference's log-prob sums from its checkpoint: SmolLM2-135M
# (float32) on the first PAIRS pairs of data/austen/rm_train.jsonl, --max-seq-len 256, batches
# of 8, THREADS threads; a run of 4 steps saving at step 2, then the run resumed from that
# checkpoint twice -- as saved (the sums taken from it), and with the sums' fingerprint
# changed by hand (scored again) -- each timed whole (process start to exit). With
# REFERENCE=model the reference is --reference-model (the same folder), else the policy's
# own starting weights. One JSON line per resume: its wall time, the rows the reference
# scored, whether its final weights are the uninterrupted run's bytes.
#   PAIRS=128 THREADS=2 REFERENCE=model bench/run_dpo_resume.sh
set -euo pipefail
cd "$(dirname "$0")/.."
pairs=${PAIRS:-128} threads=${THREADS:-2} reference=${REFERENCE:-model}
model=${MODEL_DIR:-build/models/smollm2-f32} out=${OUT_DIR:-/tmp/dpo-resume-bench}
[ -f "$model/model.safetensors" ] || { echo "run_dpo_resume.sh: no model in $model" >&2; exit 2; }
rm -rf "$out" && mkdir -p "$out"
head -n "$pairs" data/austen/rm_train.jsonl > "$out/pairs.jsonl"
args=(--model "$model" --data "$out/pairs.jsonl" --max-seq-len 256 --per-device-train-batch-size 8 --max-steps 4
      --save-every 2 --keep-last 0 --threads "$threads")
[ "$reference" = model ] && args+=(--reference-model "$model")
build/marlhf dpo "${args[@]}" --quiet --output "$out/run" 2> "$out/run.err" || { tail -n 3 "$out/run.err" >&2; exit 1; }
for case in kept rescored; do
    mkdir -p "$out/$case" && cp -r "$out/run/checkpoint-2" "$out/$case/"
    [ $case = rescored ] && sed -i 's/"fingerprint": *"\([0-9a-f]\)/"fingerprint": "x\1/' "$out/$case/checkpoint-2/trainer_state.json"
    start=$(date +%s.%N)
    build/marlhf dpo "${args[@]}" --resume --output "$out/$case" > /dev/null 2> "$out/$case.err" ||
        { tail -n 3 "$out/$case.err" >&2; exit 1; }
    end=$(date +%s.%N)
    scored=$(sed -n 's/.*\(reference model\|starting weights\) scored \([0-9]*\) rows.*/\2/p' "$out/$case.err")
    same=false; cmp -s "$out/run/final/model.safetensors" "$out/$case/final/model.safetensors" && same=true
    python3 -c "import json, sys; print(json.dumps({'reference': sys.argv[1], 'case': sys.argv[2], 'pairs': int(sys.argv[3]), 'resume_s': round(float(sys.argv[5]) - float(sys.argv[4]), 1), 'rows_scored': int(sys.argv[6]), 'same_final': sys.argv[7] == 'true', 'threads': int(sys.argv[8])}))" \
        "$reference" "$case" "$pairs" "$start" "$end" "$scored" "$same" "$threads"
done
