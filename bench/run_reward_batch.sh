#!/usr/bin/env bash
# Concurrent /get_reward clients against `marlhf serve --reward-model`: CLIENTS clients at
# once, each posting REQUESTS requests of QUERIES texts one after the other
# (bench/reward_concurrency.py), with the requests that wait for the model scored together
# (--reward-batch 16, the default) and one at a time (--reward-batch 1), BATCH rows per
# forward, THREADS threads, REPEATS runs of each alternating. SmolLM2-135M-Instruct's
# weights with bench/trl_ppo_iteration.py's fixed-seed score head (as
# bench/run_reward_server.sh). Prints one JSON line per run (requests/s, sequences/s,
# latency) with the machine's load average, and the largest difference between the two
# settings' rewards.
# Builds nothing: run `make` first; needs .venv-tools (scripts/setup-python).
#   CLIENTS=8 REQUESTS=4 QUERIES=2 BATCH=8 THREADS=2 REPEATS=2 bench/run_reward_batch.sh
set -euo pipefail
cd "$(dirname "$0")/.."
clients=${CLIENTS:-8} requests=${REQUESTS:-4} queries=${QUERIES:-2} batch=${BATCH:-8} threads=${THREADS:-2}
repeats=${REPEATS:-2}
hf=${HF_DIR:-/tmp/smollm2-hf} rm=${RM_DIR:-/tmp/smollm2-rm}
py=.venv-tools/bin/python
. bench/smollm2_models.sh
out=$(mktemp -d)
. bench/serve_helpers.sh
trap 'kill $server 2> /dev/null || true; rm -rf "$out"' EXIT
for repeat in $(seq "$repeats"); do
    for cap in 16 1; do
        start_server "$out/serve.log" --reward-model "$rm" --parallel "$batch" --reward-batch "$cap" \
            --max-concurrent $((clients * 2)) --threads "$threads"
        load=$(cut -d' ' -f1-3 /proc/loadavg)
        line=$(python3 bench/reward_concurrency.py "http://127.0.0.1:$port" --impl "marlhf-serve-reward-batch-$cap" \
            --clients "$clients" --requests "$requests" --queries "$queries" --scores-out "$out/scores-$cap.txt")
        rounds=$(curl -s "http://127.0.0.1:$port/metrics" | sed -n 's/^marlhf_reward_rounds_total //p')
        echo "${line%\}}, \"batch\": $batch, \"threads\": $threads, \"rounds\": $rounds, \"repeat\": $repeat, \"load_before\": \"$load\", \"cores\": $(nproc)}"
        stop_server
    done
    python3 - "$out/scores-16.txt" "$out/scores-1.txt" << 'PY'
import sys
a, b = ([float(x) for x in open(p)] for p in sys.argv[1:])
same = sum(x == y for x, y in zip(a, b))
print(f"rewards batched vs one at a time: {len(a)} texts, {same} equal, largest difference "
      f"{max(abs(x - y) for x, y in zip(a, b)):.2e}", file=sys.stderr)
PY
done
