# Shared by bench/run_dpo_step.sh and bench/run_kto_step.sh (sourced, after `cd` to the repo
# root): the timed marlhf run and its JSON line, and the TRL peer run twice.

# timed_marlhf OUT IMPL STEPS BATCH_KEY BATCH THREADS COMMAND...: runs COMMAND (a marlhf
# trainer writing OUT/run) under /usr/bin/time and prints one JSON line: train_s (process
# start to the last step, from metrics.jsonl), the mean step after the first, the peak
# resident memory, and total_s (the whole process, the final checkpoint included).
timed_marlhf() {
    local out=$1 impl=$2 steps=$3 batch_key=$4 batch=$5 threads=$6
    shift 6
    local start end
    start=$(date +%s.%N)
    /usr/bin/time -f "%M" -o "$out/rss" "$@" > "$out/log" 2>&1 || { cat "$out/log" >&2; return 1; }
    end=$(date +%s.%N)
    python3 - "$out/run/metrics.jsonl" "$(tail -n 1 "$out/rss")" "$start" "$end" "$impl" "$steps" "$batch_key" "$batch" \
        "$threads" << 'PY'
import json, sys
path, rss_kb, start, end, impl, steps, batch_key, batch, threads = sys.argv[1:]
times = [r["time"] for r in map(json.loads, open(path)) if "train/loss" in r]
later = [b - a for a, b in zip(times, times[1:])]
print(json.dumps({"impl": impl, "steps": int(steps), batch_key: int(batch), "train_s": round(times[-1], 2),
                  "step_s": round(sum(later) / len(later), 3), "max_rss_mb": round(int(rss_kb) / 1024),
                  "total_s": round(float(end) - float(start), 2), "threads": int(threads)}))
PY
}

# trl_peer OUT IMPL THREADS SCRIPT ARGS...: the TRL peer SCRIPT (bench/trl_*_step.py) with
# ARGS, by default and with --precompute-ref, one JSON line each; a skip line without the
# tools environment (scripts/setup-python).
trl_peer() {
    local out=$1 impl=$2 threads=$3
    shift 3
    local py=.venv-tools/bin/python
    if ! [ -x "$py" ] || ! "$py" -c "import trl" 2> /dev/null; then
        echo "{\"impl\": \"$impl\", \"skipped\": \"run scripts/setup-python first\"}"
        return 0
    fi
    export OMP_NUM_THREADS=$threads MKL_NUM_THREADS=$threads TOKENIZERS_PARALLELISM=false
    for extra in "" --precompute-ref; do
        "$py" "$@" --threads "$threads" --output "$out/trl" $extra 2> "$out/trl.log" | tail -n 1 ||
            { tail -n 5 "$out/trl.log" >&2; return 1; }
    done
}
