#!/usr/bin/env bash
# Decode speed of SmolLM2-135M-Instruct: marlhf (f32, --quantize bf16, q8_0, q4_0 and nf4) beside
# transformers' generate() (f32 and bf16; batch 1, 8, 32) and llama.cpp (batch 1, f32, Q8_0 and Q4_1), in
# one run on this machine (LONG_PROMPT=N: the KV cache types after N-token prompts, below). The peers need
# scripts/setup-python; llama.cpp comes from the llama-cpp-python package, which pip builds
# from source: `.venv-tools/bin/pip install llama-cpp-python`.
set -euo pipefail
cd "$(dirname "$0")/.."
make --no-print-directory bench > /dev/null
scripts/fetch-model
new=${NEW:-64}
# LONG_PROMPT=2048: instead, decoding after prompts of that many tokens (Q8_0 weights,
# batch 1 and 8) with each KV cache type, where reading the cache is much of a step.
# ATTENTION=1: instead, decode ms per token at contexts CONTEXTS (default "128 1024 4096":
# prompts of that many tokens, NEW new tokens, batch 1, Q8_0 weights, KV cache KV (default
# q8_0)) with the previous per-head attention kernel and the grouped one
# (MARLHF_CPU_ATTENTION=per-head / grouped, one binary), taking turns, and llama.cpp Q8_0
# after the same prompts. Each line gets the load average (1 minute) taken before it.
if [ -n "${ATTENTION:-}" ]; then
    kv=${KV:-q8_0}
    for context in ${CONTEXTS:-128 1024 4096}; do
        for kernel in per-head grouped; do
            load=$(cut -d' ' -f1 /proc/loadavg)
            MARLHF_CPU_ATTENTION=$kernel build/bench/decode --prompt "$context" --new "$new" --batches 1 \
                --quantize q8_0 --kv-cache "$kv" | sed "s/}\$/, \"attention\": \"$kernel\", \"load_average\": $load}/"
        done
        if [ -n "${LLAMA_PYTHON:-}" ] || .venv-tools/bin/python -c "import llama_cpp" 2> /dev/null; then
            load=$(cut -d' ' -f1 /proc/loadavg)
            "${LLAMA_PYTHON:-.venv-tools/bin/python}" bench/llamacpp_decode.py --prompt "$context" --new "$new" \
                2> /dev/null | grep impl | sed "s/}\$/, \"load_average\": $load}/"
        fi
    done
    exit 0
fi
# TOP_P=0.9: instead, sampling at temperature 1 with that top-p (top-k off), batch 1 and 8:
# marlhf (f32, Q8_0) beside transformers' generate(do_sample=True) with the same settings;
# at a 49k vocabulary the sampler's sort is part of every step.
if [ -n "${TOP_P:-}" ]; then
    for quantize in none q8_0; do
        build/bench/decode --new "$new" --batches 1,8 --quantize "$quantize" --temperature 1 --top-p "$TOP_P"
    done
    if [ -x .venv-tools/bin/python ]; then
        .venv-tools/bin/python bench/torch_decode.py --new "$new" --batches 1,8 --temperature 1 --top-p "$TOP_P" 2> /dev/null
    else
        echo '{"impl": "transformers", "skipped": "run scripts/setup-python first"}'
    fi
    exit 0
fi
# PENALTIES=1: instead, the cost of the sampling penalties, batch 1 and 8, f32: greedy without
# and with a repetition penalty of 1.3 (over the prompt and the answer), then sampling at
# temperature 1 without and with min_p 0.05 + repetition penalty 1.3, and marlhf's presence and
# frequency penalties (0.5 each; transformers' generate has none), beside transformers' generate
# with the same repetition_penalty and min_p. A row with a penalty is picked on the host from
# its logits after the penalties over its tokens so far (gen/sampler.h).
if [ -n "${PENALTIES:-}" ]; then
    build/bench/decode --new "$new" --batches 1,8
    build/bench/decode --new "$new" --batches 1,8 --repetition-penalty 1.3
    build/bench/decode --new "$new" --batches 1,8 --temperature 1
    build/bench/decode --new "$new" --batches 1,8 --temperature 1 --min-p 0.05 --repetition-penalty 1.3
    build/bench/decode --new "$new" --batches 1,8 --temperature 1 --presence-penalty 0.5 --frequency-penalty 0.5
    if [ -x .venv-tools/bin/python ]; then
        for args in "" "--repetition-penalty 1.3" "--temperature 1" "--temperature 1 --min-p 0.05 --repetition-penalty 1.3"; do
            # shellcheck disable=SC2086
            .venv-tools/bin/python bench/torch_decode.py --new "$new" --batches 1,8 $args 2> /dev/null
        done
    else
        echo '{"impl": "transformers", "skipped": "run scripts/setup-python first"}'
    fi
    exit 0
fi
if [ -n "${LONG_PROMPT:-}" ]; then
    for kv in f32 f16 q8_0; do
        build/bench/decode --prompt "$LONG_PROMPT" --new "$new" --batches 1,8 --quantize q8_0 --kv-cache "$kv"
    done
    exit 0
fi
build/bench/decode --new "$new" --batches 1,8,32
build/bench/decode --new "$new" --batches 1,8,32 --quantize bf16
build/bench/decode --new "$new" --batches 1,8,32 --quantize q8_0
build/bench/decode --new "$new" --batches 1,8,32 --quantize q4_0
build/bench/decode --new "$new" --batches 1,8,32 --quantize nf4
if [ -x .venv-tools/bin/python ]; then
    .venv-tools/bin/python bench/torch_decode.py --new "$new" 2> /dev/null
    .venv-tools/bin/python bench/torch_decode.py --new "$new" --dtype bfloat16 2> /dev/null
    if .venv-tools/bin/python -c "import llama_cpp" 2> /dev/null; then
        .venv-tools/bin/python bench/llamacpp_decode.py --new "$new" 2> /dev/null | grep impl
    else
        echo '{"impl": "llama.cpp", "skipped": "pip install llama-cpp-python into .venv-tools first"}'
    fi
else
    echo '{"impl": "transformers", "skipped": "run scripts/setup-python first"}'
fi
