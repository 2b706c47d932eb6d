#!/usr/bin/env bash
# Chunked prefill (--prefill-chunk): one streaming request decoding while a second arrives
# with a ~PROMPT_TOKENS-token prompt (bench/prefill_chunk_load.py): the first request's gaps
# between tokens (p50, p99, max; the max while the second waits) and the second's time to
# first token, for each --prefill-chunk in CHUNKS (0: the whole prompt at once, the peer),
# SmolLM2-135M-Instruct Q4_1 GGUF computed in f32 (QUANTIZE=q8_0: in Q8_0), THREADS
# threads, REPEATS runs each (the settings taking turns, so that load on a shared machine
# falls on all of them alike). KERNELS="per-head grouped": each setting with each CPU
# attention kernel (MARLHF_CPU_ATTENTION: the previous per-head one, or the grouped decode
# step and tiled extension; default grouped only). Prints one JSON line per run, with the
# load average (1 minute) taken before it.
#   CHUNKS="0 512" REPEATS=3 PROMPT_TOKENS=1500 THREADS=2 bench/run_prefill_chunk.sh
set -euo pipefail
cd "$(dirname "$0")/.."
chunks=${CHUNKS:-0 512} repeats=${REPEATS:-3} prompt_tokens=${PROMPT_TOKENS:-1500} threads=${THREADS:-2}
quantize=${QUANTIZE:-none} decode_tokens=${DECODE_TOKENS:-400} kernels=${KERNELS:-grouped}
model=models/SmolLM2-135M-Instruct.Q4_1.gguf
[ -f "$model" ] || scripts/fetch-model
out=$(mktemp -d)
. bench/serve_helpers.sh
trap 'kill $server 2> /dev/null || true; rm -rf "$out"' EXIT
for repeat in $(seq "$repeats"); do
    for chunk in $chunks; do
        for kernel in $kernels; do
            export MARLHF_CPU_ATTENTION=$kernel
            load=$(cut -d' ' -f1 /proc/loadavg)
            start_server "$out/serve.log" --model "$model" --prefill-chunk "$chunk" --quantize "$quantize" \
                --threads "$threads" --max-tokens-limit "$decode_tokens"
            python3 bench/prefill_chunk_load.py "http://127.0.0.1:$port" \
                --impl "marlhf-serve-prefill-chunk-$chunk-$quantize" --prompt-tokens "$prompt_tokens" \
                --decode-tokens "$decode_tokens" --threads "$threads" |
                sed "s/}\$/, \"repeat\": $repeat, \"attention\": \"$kernel\", \"load_average\": $load}/"
            stop_server
        done
    done
done
