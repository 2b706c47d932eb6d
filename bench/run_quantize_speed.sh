#!/usr/bin/env bash
# How long quantizing SmolLM2-135M-Instruct takes: `marlhf convert F32.gguf OUT.gguf --outtype
# TYPE` against llama.cpp's quantizer on the same F32 file (bench/llamacpp_quantize.py:
# llama_model_quantize, what llama-quantize runs), the same threads, reading and writing
# included. `--quantize TYPE` at load runs the same block code on the same matrices. One JSON
# line per run: program, type, threads, seconds (the files' types are the same tensor for
# tensor: docs/quantization.md).
#
# TYPES (default "q2_k q3_k_m q4_k_m iq4_nl iq4_xs"), THREADS (default 2), REPEATS (default 3:
# the programs take turns within each round, the marlhf builds' order changing from round to
# round, so a busy moment of a shared machine does not land on one of them only; take the
# best of each; a JSON line with the load average opens every round). A marlhf run just after
# llama.cpp's took 1.3 s more (IQ4_XS, 6.4 against 5.0 s, either build): an untimed Q8_0
# conversion follows each llama.cpp run. BASE=path adds that checkout's build/marlhf (an earlier commit, built: the
# before of a change, measured in the same run). PYTHON=path picks the interpreter that has
# llama_cpp (default .venv-tools/bin/python; llama.cpp is skipped without it).
set -euo pipefail
cd "$(dirname "$0")/.."
make --no-print-directory build/marlhf > /dev/null
scripts/fetch-model
python=${PYTHON:-.venv-tools/bin/python}
threads=${THREADS:-2}
repeats=${REPEATS:-3}
types=${TYPES:-q2_k q3_k_m q4_k_m iq4_nl iq4_xs}
dir=build/models
f32=$dir/SmolLM2-135M-Instruct.F32.gguf
[ -f "$f32" ] || build/marlhf convert models/SmolLM2-135M-Instruct.Q4_1.gguf "$f32" --outtype f32 > /dev/null
llamacpp=0
"$python" -c "import llama_cpp" 2> /dev/null && llamacpp=1 ||
    echo "# $python has no llama_cpp: llama.cpp's runs are skipped" >&2
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
timed() { # timed LABEL BINARY TYPE: one marlhf convert, as a JSON line
    local start end
    start=$(date +%s.%N)
    "$2" convert "$f32" "$out/$1-$3.gguf" --outtype "$3" --threads "$threads" > /dev/null
    end=$(date +%s.%N)
    rm -f "$out/$1-$3.gguf"
    printf '{"program": "%s", "type": "%s", "threads": %d, "seconds": %.3f}\n' "$1" "$3" "$threads" \
        "$(echo "$end - $start" | bc)"
}
for round in $(seq "$repeats"); do
    printf '{"round": %d, "load_average": "%s"}\n' "$round" "$(cut -d' ' -f1-3 /proc/loadavg)"
    for type in $types; do
        if [ -n "${BASE:-}" ] && [ $((round % 2)) = 0 ]; then
            timed marlhf-base "$BASE/build/marlhf" "$type"
            timed marlhf build/marlhf "$type"
        else
            timed marlhf build/marlhf "$type"
            [ -n "${BASE:-}" ] && timed marlhf-base "$BASE/build/marlhf" "$type"
        fi
        if [ $llamacpp = 1 ]; then
            "$python" bench/llamacpp_quantize.py --source "$f32" --output "$out/llamacpp-$type.gguf" --type "$type" \
                --threads "$threads" 2> /dev/null
            rm -f "$out/llamacpp-$type.gguf"
            build/marlhf convert "$f32" "$out/settle.gguf" --outtype q8_0 --threads "$threads" > /dev/null 2>&1
            rm -f "$out/settle.gguf"
        fi
    done
done
