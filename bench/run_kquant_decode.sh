#!/usr/bin/env bash
# Decode speed and memory of a Q4_K_M GGUF of SmolLM2-135M-Instruct (MIX=q5_k_m: a Q5_K_M one;
# MIX=q3_k_m, q3_k_s or q2_k: llama.cpp's own file of that mix, which marlhf does not write),
# batch 1, 1 and 2 threads: marlhf running the file with its own bits (`--quantize q4_k_m`, what
# the inference commands do with a K-quant file by default, Q5_K_M's included), marlhf's Q8_0 path on the same file (`--quantize q8_0`: every
# matrix dequantized and re-quantized to Q8_0), and llama.cpp on the same file
# (llama-cpp-python: bench/llamacpp_decode.py --files; skipped when it is not installed). One
# JSON line each: ms_per_step (= ms per token at batch 1), decode_tokens_per_s, peak_rss_mb.
#
# The file is marlhf's own `convert --outtype q4_k_m` (q5_k_m) of the SmolLM2 GGUF (written once
# to build/models/; SmolLM2's rows of 576 make most of a Q5_K_M file the fallback Q5_1, which
# marlhf holds as Q8_0: its Q5_K matrices are the ffn_down ones); LLAMACPP_FILE=1 (Q4_K_M only) adds llama.cpp's own Q4_K_M of the same weights
# (bench/llamacpp_decode.py --make-q4-k-m: llama_model_quantize through an F32 file), whose
# blocks come from llama.cpp's quantizer. PYTHON=path picks the interpreter that has llama_cpp
# (default .venv-tools/bin/python).
#
# REPEATS=n (default 3) runs every configuration n times, the configurations taking turns
# within each round so that a busy moment of a shared machine does not land on one of them
# only; take the best of each (a JSON line with the load average opens every round).
# BASE=path adds that build's build/bench/decode on the file's own bits (a checkout of an
# earlier commit, built: the before of a change, measured in the same run).
set -euo pipefail
cd "$(dirname "$0")/.."
make --no-print-directory bench > /dev/null
make --no-print-directory build/marlhf > /dev/null
scripts/fetch-model
new=${NEW:-64}
python=${PYTHON:-.venv-tools/bin/python}
source_model=models/SmolLM2-135M-Instruct.Q4_1.gguf
mix=${MIX:-q4_k_m}
case "$mix" in q4_k_m | q5_k_m | q3_k_m | q3_k_s | q2_k) ;; *) echo "MIX must be q4_k_m, q5_k_m, q3_k_m, q3_k_s or q2_k" >&2 && exit 2 ;; esac
file=build/models/SmolLM2-135M-Instruct.${mix^^}.gguf
mkdir -p build/models
case "$mix" in q3_k_m | q3_k_s | q2_k) # llama.cpp's quantizer (through an F32 file), as LLAMACPP_FILE's Q4_K_M
    file=build/models/SmolLM2-135M-Instruct.llamacpp-${mix^^}.gguf
    [ -f "$file" ] || "$python" bench/llamacpp_decode.py --model "$source_model" --make "$mix" "$file" --files > /dev/null ;;
esac
[ -f "$file" ] || build/marlhf convert "$source_model" "$file" --outtype "$mix" > /dev/null
files=("$file")
if [ -n "${LLAMACPP_FILE:-}" ] && [ "$mix" = q4_k_m ] && "$python" -c "import llama_cpp" 2> /dev/null; then
    llama_file=build/models/SmolLM2-135M-Instruct.llamacpp-Q4_K_M.gguf
    "$python" bench/llamacpp_decode.py --model "$source_model" --make-q4-k-m "$llama_file" --files 2> /dev/null || true
    [ -f "$llama_file" ] && files+=("$llama_file")
fi
for round in $(seq "${REPEATS:-3}"); do
    echo "{\"round\": $round, \"uptime\": \"$(uptime | sed 's/^ *//')\"}"
    for f in "${files[@]}"; do
        for threads in 1 2; do
            for quantize in q4_k_m q8_0; do
                OMP_NUM_THREADS=$threads build/bench/decode --model "$f" --new "$new" --batches 1 --quantize "$quantize"
            done
            if [ -n "${BASE:-}" ]; then
                OMP_NUM_THREADS=$threads "$BASE/build/bench/decode" --model "$f" --new "$new" --batches 1 --quantize q4_k_m |
                    sed 's/"impl": "marlhf-cpu"/"impl": "marlhf-cpu-base"/'
            fi
            if "$python" -c "import llama_cpp" 2> /dev/null; then
                "$python" bench/llamacpp_decode.py --new "$new" --threads "$threads" --files "$f" 2> /dev/null | grep impl
            else
                echo '{"impl": "llama.cpp", "skipped": "pip install llama-cpp-python (PYTHON=...)"}'
            fi
        done
    done
done
echo "{\"end\": true, \"uptime\": \"$(uptime | sed 's/^ *//')\"}"
