#!/usr/bin/env bash
# Attention against the KV cache alone (bench/attention_cache.c): the previous per-head
# kernel beside the grouped decode step and the tiled extension, SmolLM2-135M's shape, each
# cache type; one JSON line per measurement with the load average (1 minute) taken before
# the run. THREADS sets OMP_NUM_THREADS (default 2); the arguments go to the program.
#   THREADS=1 bench/run_attention_cache.sh --repeats 9
set -euo pipefail
cd "$(dirname "$0")/.."
make --no-print-directory bench > /dev/null
load=$(cut -d' ' -f1 /proc/loadavg)
OMP_NUM_THREADS=${THREADS:-2} build/bench/attention_cache "$@" | sed "s/}\$/, \"load_average\": $load}/"
