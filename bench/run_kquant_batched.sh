#!/usr/bin/env bash
# Batched decoding over a Q4_K_M file's types (Q4_K, Q6_K, Q5_0; Q8_0 beside them): the
# kernels at N = 1..63 input rows (build/bench/quant_kernels --batched: SmolLM2-135M's and a 1B
# Llama's shapes, time per input row), then SmolLM2-135M Q4_K_M (marlhf's own convert, as
# bench/run_kquant_decode.sh writes it) decoding batches of BATCHES prompts (bench/decode),
# and llama.cpp on the same file with as many sequences (bench/llamacpp_batched_decode.py;
# skipped without llama-cpp-python). THREADS (default "1 2") threads.
#
# BASE=path (a checkout of an earlier commit, built with `make bench`) runs that build's
# programs too, taking turns with this one within each of REPEATS rounds (default 3) so that
# a busy moment of a shared machine does not land on one of them only; take the best of each.
# OLD=path likewise (a second earlier build, e.g. before the Q5_0 kernel: its quant_kernels
# must have --batched). PYTHON=path picks the interpreter that has llama_cpp.
set -euo pipefail
cd "$(dirname "$0")/.."
make --no-print-directory bench > /dev/null
make --no-print-directory build/marlhf > /dev/null
scripts/fetch-model
file=build/models/SmolLM2-135M-Instruct.Q4_K_M.gguf
mkdir -p build/models
[ -f "$file" ] || build/marlhf convert models/SmolLM2-135M-Instruct.Q4_1.gguf "$file" --outtype q4_k_m > /dev/null
python=${PYTHON:-.venv-tools/bin/python}
builds=(.)
[ -n "${BASE:-}" ] && builds+=("$BASE")
[ -n "${OLD:-}" ] && builds+=("$OLD")
label() { [ "$1" = . ] && echo marlhf || { [ "$1" = "${BASE:-}" ] && echo base || echo old; }; }
for round in $(seq "${REPEATS:-3}"); do
    echo "{\"round\": $round, \"uptime\": \"$(uptime | sed 's/^ *//')\"}"
    for threads in ${THREADS:-1 2}; do
        for b in "${builds[@]}"; do
            OMP_NUM_THREADS=$threads "$b/build/bench/quant_kernels" --batched --repeats "${KERNEL_REPEATS:-3}" |
                sed "s/^{/{\"build\": \"$(label "$b")\", /"
        done
        for b in "${builds[@]}"; do
            OMP_NUM_THREADS=$threads "$b/build/bench/decode" --model "$file" --new "${NEW:-64}" --batches "${BATCHES:-1,4,16}" \
                --quantize q4_k_m | sed "s/^{/{\"build\": \"$(label "$b")\", /"
        done
        if "$python" -c "import llama_cpp" 2> /dev/null; then
            "$python" bench/llamacpp_batched_decode.py --model "$file" --new "${NEW:-64}" --batches "${BATCHES:-1,4,16}" \
                --threads "$threads" 2> /dev/null
        else
            echo '{"impl": "llama.cpp", "skipped": "pip install llama-cpp-python (PYTHON=...)"}'
        fi
    done
done
echo "{\"end\": true, \"uptime\": \"$(uptime | sed 's/^ *//')\"}"
