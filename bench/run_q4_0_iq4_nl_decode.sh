#!/usr/bin/env bash
# Decode speed and memory of SmolLM2-135M-Instruct with Q4_0 and IQ4_NL weights, batch 1 (and 8
# for marlhf), against llama.cpp on the same files. Four files, each made once in build/models/
# from the README's Q4_1 GGUF: marlhf's own Q4_0 and IQ4_NL (`marlhf convert --outtype q4_0 /
# iq4_nl` of the float weights) and llama.cpp's (its quantize tool from an F32 GGUF of the same
# weights: bench/llamacpp_decode.py --make). marlhf runs each Q4_0 file with `--quantize q4_0`
# and each IQ4_NL file with its default (the file's own bits); with BASE=path, that checkout's
# build/bench/decode runs them too (the before of a change); llama.cpp (llama-cpp-python:
# bench/llamacpp_decode.py --files; skipped when it is not installed) runs all four with
# --no-extra-buffers: with its repacked weight buffers llama-cpp-python 0.3.36 crashed
# (SIGSEGV) on three of the four files on the AMX machine of 2026-12-07 (not on marlhf's
# IQ4_NL file); a run that fails anyway prints a line saying so and the rounds go on.
#
# REPEATS=n (default 3) rounds, every configuration once a round, so that a busy moment of a
# shared machine does not land on one of them only (a JSON line with the load average opens
# each round); THREADS (default "1 2"); NEW new tokens (default 48) after 32-token prompts.
# PYTHON=path picks the interpreter that has llama_cpp (default .venv-tools/bin/python).
set -euo pipefail
cd "$(dirname "$0")/.."
make --no-print-directory build/bench/decode build/marlhf > /dev/null
scripts/fetch-model
new=${NEW:-48}
python=${PYTHON:-.venv-tools/bin/python}
q4_1=models/SmolLM2-135M-Instruct.Q4_1.gguf
dir=build/models
mkdir -p "$dir"
have_llama_cpp() { "$python" -c "import llama_cpp" 2> /dev/null; }
if [ ! -f "$dir/smollm2-q4_0.gguf" ] || [ ! -f "$dir/smollm2-iq4_nl.gguf" ]; then
    [ -f "$dir/smollm2-f32/model.safetensors" ] || build/marlhf convert "$q4_1" "$dir/smollm2-f32" --overwrite > /dev/null
    for type in q4_0 iq4_nl; do
        [ -f "$dir/smollm2-$type.gguf" ] ||
            build/marlhf convert "$dir/smollm2-f32" "$dir/smollm2-$type.gguf" --outtype "$type" > /dev/null
    done
fi
if have_llama_cpp; then
    for type in q4_0 iq4_nl; do
        [ -f "$dir/smollm2-$type-llamacpp.gguf" ] || "$python" bench/llamacpp_decode.py --model "$q4_1" \
            --make "$type" "$dir/smollm2-$type-llamacpp.gguf" --files > /dev/null 2>&1
    done
fi
files="smollm2-q4_0.gguf smollm2-iq4_nl.gguf"
[ -f "$dir/smollm2-q4_0-llamacpp.gguf" ] && files="$files smollm2-q4_0-llamacpp.gguf smollm2-iq4_nl-llamacpp.gguf"
marlhf() { # BINARY THREADS FILE IMPL
    local quantize=q4_k_m
    case $3 in *q4_0*) quantize=q4_0 ;; esac
    OMP_NUM_THREADS=$2 "$1" --model "$dir/$3" --new "$new" --batches 1,8 --quantize "$quantize" 2> /dev/null |
        grep '"impl"' | sed "s/\"impl\": \"marlhf-cpu\"/\"impl\": \"$4\", \"file\": \"$3\"/"
}
for round in $(seq "${REPEATS:-3}"); do
    echo "{\"round\": $round, \"uptime\": \"$(uptime | sed 's/^ *//')\"}"
    for threads in ${THREADS:-1 2}; do
        for file in $files; do
            marlhf build/bench/decode "$threads" "$file" marlhf-cpu
            [ -n "${BASE:-}" ] && marlhf "$BASE/build/bench/decode" "$threads" "$file" marlhf-cpu-base
            if have_llama_cpp; then
                "$python" bench/llamacpp_decode.py --new "$new" --threads "$threads" --no-extra-buffers \
                    --files "$dir/$file" 2> /dev/null | grep impl ||
                    echo "{\"impl\": \"llama.cpp-$file\", \"failed\": true, \"threads\": $threads}"
            else
                echo '{"impl": "llama.cpp", "skipped": "pip install llama-cpp-python (PYTHON=...)"}'
            fi
        done
    done
done
echo "{\"end\": true, \"uptime\": \"$(uptime | sed 's/^ *//')\"}"
