#!/usr/bin/env bash
# Decode speed and memory of the README's SmolLM2-135M-Instruct Q4_1 GGUF, batch 1, 1 and 2
# threads: marlhf running the file with its own Q4_1 bits (`--quantize q4_1`), its Q8_0 path on
# the same file (`--quantize q8_0`: every matrix dequantized and re-quantized) and its float32
# default (`none`), and llama.cpp on the same file (llama-cpp-python: bench/llamacpp_decode.py
# --files; skipped when it is not installed). Then marlhf's own Q5_K_M of the same weights
# (`convert --outtype q5_k_m`, written once to build/models/; its rows of 576 make most of it the
# fallback Q5_1) with `--quantize q5_k_m`: this build (Q5_1 rows with their own bits) and, with
# BASE=path, that checkout's build/bench/decode (the before of a change: Q5_1 rows held as
# Q8_0), and llama.cpp on it. One JSON line each: ms_per_step (= ms per token at batch 1),
# decode_tokens_per_s, peak_rss_mb.
#
# REPEATS=n (default 3) runs every configuration n times, the configurations taking turns within
# each round so that a busy moment of a shared machine does not land on one of them only; take
# the best of each (a JSON line with the load average opens every round). PYTHON=path picks the
# interpreter that has llama_cpp (default .venv-tools/bin/python).
set -euo pipefail
cd "$(dirname "$0")/.."
make --no-print-directory build/bench/decode build/marlhf > /dev/null
scripts/fetch-model
new=${NEW:-64}
python=${PYTHON:-.venv-tools/bin/python}
q4_1=models/SmolLM2-135M-Instruct.Q4_1.gguf
q5_k_m=build/models/SmolLM2-135M-Instruct.Q5_K_M.gguf
mkdir -p build/models
[ -f "$q5_k_m" ] || build/marlhf convert "$q4_1" "$q5_k_m" --outtype q5_k_m > /dev/null
have_llama_cpp() { "$python" -c "import llama_cpp" 2> /dev/null; }
llama_cpp() {
    if have_llama_cpp; then
        "$python" bench/llamacpp_decode.py --new "$new" --threads "$1" --files "$2" 2> /dev/null | grep impl
    else
        echo '{"impl": "llama.cpp", "skipped": "pip install llama-cpp-python (PYTHON=...)"}'
    fi
}
for round in $(seq "${REPEATS:-3}"); do
    echo "{\"round\": $round, \"uptime\": \"$(uptime | sed 's/^ *//')\"}"
    for threads in 1 2; do
        for quantize in q4_1 q8_0 none; do
            OMP_NUM_THREADS=$threads build/bench/decode --model "$q4_1" --new "$new" --batches 1 --quantize "$quantize"
        done
        llama_cpp "$threads" "$q4_1"
        OMP_NUM_THREADS=$threads build/bench/decode --model "$q5_k_m" --new "$new" --batches 1 --quantize q5_k_m
        if [ -n "${BASE:-}" ]; then
            OMP_NUM_THREADS=$threads "$BASE/build/bench/decode" --model "$q5_k_m" --new "$new" --batches 1 --quantize q5_k_m |
                sed 's/"impl": "marlhf-cpu"/"impl": "marlhf-cpu-base"/'
        fi
        llama_cpp "$threads" "$q5_k_m"
    done
done
echo "{\"end\": true, \"uptime\": \"$(uptime | sed 's/^ *//')\"}"
