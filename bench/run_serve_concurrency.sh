#!/usr/bin/env bash
# Serving throughput under concurrent clients: REQUESTS chat requests (temperature 1, seed i,
# MAX_TOKENS new tokens) from CLIENTS clients at once against `marlhf serve` with
# --parallel 1 (one request at a time) and --parallel CLIENTS (the queued requests generated
# together), SmolLM2-135M-Instruct Q4_1 GGUF (marlhf computes in f32, and with --quantize
# q8_0 in Q8_0), THREADS threads; and the same requests through llama.cpp
# (llama-cpp-python, Q4_1 and the f32 and Q8_0 GGUFs that bench/run_decode.sh writes), one
# at a time as llama-cpp-python's own server runs them.
# MIX=8,96,16,128 gives request i the (i mod 4)-th max_tokens instead (short and long
# answers mixed). MARLHF=path runs another marlhf binary (an earlier build, to compare),
# LABEL names its lines; PEERS=0 leaves llama.cpp out.
# Prints one JSON line per configuration.
#   REQUESTS=16 CLIENTS=4 MAX_TOKENS=48 THREADS=2 bench/run_serve_concurrency.sh
set -euo pipefail
cd "$(dirname "$0")/.."
requests=${REQUESTS:-16} clients=${CLIENTS:-4} max_tokens=${MAX_TOKENS:-48} threads=${THREADS:-2}
mix=${MIX:-} label=${LABEL:-marlhf-serve} peers=${PEERS:-1}
model=models/SmolLM2-135M-Instruct.Q4_1.gguf
[ -f "$model" ] || scripts/fetch-model
out=$(mktemp -d)
. bench/serve_helpers.sh
trap 'kill $server 2> /dev/null || true; rm -rf "$out"' EXIT
for setting in "1 none" "$clients none" "1 q8_0" "$clients q8_0"; do
    read -r parallel quantize <<< "$setting"
    start_server "$out/serve.log" --model "$model" --parallel "$parallel" --max-concurrent $((clients * 2)) \
        --quantize "$quantize" --threads "$threads"
    python3 bench/serve_load.py client "http://127.0.0.1:$port" --impl "$label-parallel-$parallel-$quantize" \
        --requests "$requests" --clients "$clients" --max-tokens "$max_tokens" --max-tokens-mix "$mix" --threads "$threads"
    stop_server
done
py=.venv-tools/bin/python
if [ "$peers" = 0 ]; then
    :
elif [ -x "$py" ] && "$py" -c "import llama_cpp" 2> /dev/null; then
    for path in "$model" "${model%.Q4_1.gguf}.F32.gguf" "${model%.Q4_1.gguf}.Q8_0.gguf"; do
        [ -f "$path" ] || continue
        kind=$(basename "$path" .gguf | sed 's/.*\.//' | tr 'A-Z' 'a-z')
        "$py" bench/serve_load.py llamacpp "$path" --impl "llama.cpp-sequential-$kind" --requests "$requests" \
            --max-tokens "$max_tokens" --max-tokens-mix "$mix" --threads "$threads" 2> /dev/null
    done
else
    echo '{"impl": "llama.cpp", "skipped": "pip install llama-cpp-python into .venv-tools first"}'
fi
