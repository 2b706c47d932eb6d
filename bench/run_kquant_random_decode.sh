#!/usr/bin/env bash
# Decode speed and memory of llama.cpp's own Q3_K_M and Q2_K files of a random Llama whose rows
# are whole super-blocks (bench/random_llama_gguf.py: 156M weights; Q3_K / Q2_K the bulk of
# each file, unlike SmolLM2's), batch 1: marlhf with the files' own bits (the default,
# `--quantize q4_k_m`), marlhf's Q8_0 path (`--quantize q8_0`: every matrix dequantized and
# re-quantized to Q8_0, what Q3_K / Q2_K tensors were held as before they had kernels), and
# llama.cpp on the same files (bench/llamacpp_decode.py --files). One JSON line each, as
# bench/run_kquant_decode.sh writes them; THREADS (default "1 2"), REPEATS (default 3) rounds,
# the configurations taking turns within each round (take the best of each).
#
# GGUF_PYTHON: an interpreter with gguf-py and numpy (default .venv-tools/bin/python);
# PYTHON: one with llama_cpp (default the same).
set -euo pipefail
cd "$(dirname "$0")/.."
make --no-print-directory bench > /dev/null
gguf_python=${GGUF_PYTHON:-.venv-tools/bin/python}
python=${PYTHON:-$gguf_python}
new=${NEW:-64}
mkdir -p build/models
f32=build/models/random-llama-1024.F32.gguf
[ -f "$f32" ] || "$gguf_python" bench/random_llama_gguf.py "$f32"
files=()
for mix in q3_k_m q2_k; do
    file=build/models/random-llama-1024.${mix^^}.gguf
    [ -f "$file" ] || "$python" bench/llamacpp_decode.py --model "$f32" --make "$mix" "$file" --files > /dev/null 2>&1
    files+=("$file")
done
for round in $(seq "${REPEATS:-3}"); do
    echo "{\"round\": $round, \"uptime\": \"$(uptime | sed 's/^ *//')\"}"
    for f in "${files[@]}"; do
        for threads in ${THREADS:-1 2}; do
            for quantize in q4_k_m q8_0; do
                OMP_NUM_THREADS=$threads build/bench/decode --model "$f" --new "$new" --batches 1 --quantize "$quantize"
            done
            "$python" bench/llamacpp_decode.py --new "$new" --threads "$threads" --files "$f" 2> /dev/null | grep impl
        done
    done
done
echo "{\"end\": true, \"uptime\": \"$(uptime | sed 's/^ *//')\"}"
