#!/usr/bin/env bash
# The prompt cache on a multi-turn chat (bench/prompt_cache.py: a ~280-token system prompt,
# TURNS turns of MAX_TOKENS greedy tokens): marlhf serve with --prompt-cache 0 and 4, in
# float32 and Q8_0, and the same chat through llama.cpp (llama-cpp-python, which reuses the
# previous call's common prefix) at Q8_0 when bench/run_decode.sh has written that GGUF.
# Prints one JSON line per configuration.
#   TURNS=6 MAX_TOKENS=32 THREADS=2 bench/run_prompt_cache.sh
set -euo pipefail
cd "$(dirname "$0")/.."
turns=${TURNS:-6} max_tokens=${MAX_TOKENS:-32} threads=${THREADS:-2}
model=models/SmolLM2-135M-Instruct.Q4_1.gguf
[ -f "$model" ] || scripts/fetch-model
out=$(mktemp -d)
. bench/serve_helpers.sh
trap 'kill $server 2> /dev/null || true; rm -rf "$out"' EXIT
for setting in "0 none" "4 none" "0 q8_0" "4 q8_0"; do
    read -r cache quantize <<< "$setting"
    start_server "$out/serve.log" --model "$model" --prompt-cache "$cache" --quantize "$quantize" --threads "$threads"
    python3 bench/prompt_cache.py client "http://127.0.0.1:$port" --impl "marlhf-serve-prompt-cache-$cache-$quantize" \
        --turns "$turns" --max-tokens "$max_tokens" --threads "$threads"
    stop_server
done
py=.venv-tools/bin/python q8=${model%.Q4_1.gguf}.Q8_0.gguf
if [ -x "$py" ] && "$py" -c "import llama_cpp" 2> /dev/null && [ -f "$q8" ]; then
    "$py" bench/prompt_cache.py llamacpp "$q8" --impl llama.cpp-q8_0 --turns "$turns" --max-tokens "$max_tokens" \
        --threads "$threads" 2> /dev/null
else
    echo '{"impl": "llama.cpp", "skipped": "pip install llama-cpp-python into .venv-tools and run bench/run_decode.sh first"}'
fi
