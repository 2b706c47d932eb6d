#!/usr/bin/env bash
# --quantize q4_1 and q5_1 on the inference commands (docs/quantization.md, "Q4_1 and Q5_1"):
# llama.cpp's own Q4_1 and Q5_1 files of a small random Llama (tests/fixtures/gguf/q4_1.gguf,
# q5_1.gguf, tools/make_q4_1_fixtures.py) give llama.cpp's log-probs to 1e-4 under --quantize
# q4_1 / q5_1 (and not under the float32 default); SmolLM2's Q4_1 file under --quantize q4_1 runs
# its own bits (other log-probs than the float32 default) within 0.08 on average of llama.cpp's
# on the same file (tests/fixtures/smollm2/q4_1_llama_cpp.json); q5_1 keeps a file's tensors of a
# type marlhf holds as they are too (the same log-probs); generate answers under q4_1; on --device cuda
# both run where a GPU does (the small files' log-probs within 5e-2 of the CPU's: bf16 products), and
# the device is refused with a one-line error where none does; an unknown name is refused.
# Prints PASS/FAIL per case.
set -u
cd "$(dirname "$0")/../.."
bin=${MARLHF_BIN:-build/marlhf}
tmp=${MARLHF_TEST_TMP:-/tmp}/cli_q4_1
rm -rf "$tmp" && mkdir -p "$tmp"
model=models/SmolLM2-135M-Instruct.Q4_1.gguf
fixture=tests/fixtures/smollm2/q4_1_llama_cpp.json
failures=0
. tests/cli_helpers.sh

for type in q4_1 q5_1; do
    expected=tests/fixtures/gguf/$type.expected.json
    python3 -c "import json, sys; print(json.dumps({'ids': json.load(open(sys.argv[1]))['ids']}))" "$expected" \
        > "$tmp/small_ids.jsonl"
    own=$("$bin" logprobs --model "tests/fixtures/gguf/$type.gguf" --input "$tmp/small_ids.jsonl" --quantize "$type" 2> "$tmp/err")
    float32=$("$bin" logprobs --model "tests/fixtures/gguf/$type.gguf" --input "$tmp/small_ids.jsonl" 2>> "$tmp/err")
    python3 - "$expected" "$own" "$float32" << 'EOF' && pass "${type}_llama_cpp_file" || fail "${type}_llama_cpp_file" "$(tail -n 1 "$tmp/err")"
import json, math, sys
expected = json.load(open(sys.argv[1]))
ids, rows = expected["ids"], expected["logits"]
def log_prob(row, token):
    top = max(row)
    return row[token] - top - math.log(sum(math.exp(x - top) for x in row))
reference = [log_prob(rows[t], ids[t + 1]) for t in range(len(ids) - 1)]
own, float32 = (json.loads(x)["logprobs"] for x in sys.argv[2:4])
own_d = max(abs(a - b) for a, b in zip(own, reference))
float_d = max(abs(a - b) for a, b in zip(float32, reference))
assert len(own) == len(reference) and own_d < 1e-4 and float_d > 1e-2, (own_d, float_d)
EOF
done

python3 -c "import json, sys; [print(json.dumps({'ids': s['ids']})) for s in json.load(open(sys.argv[1]))['sequences']]" \
    "$fixture" > "$tmp/ids.jsonl"
# One sequence a forward pass (17-41 rows): the decode kernels, as llama.cpp's batch of one
# sequence; batched to 64 rows or more a prefill multiplies the dequantized weights by the float
# inputs, the float32 model's own product.
logprobs() { "$bin" logprobs --model "$model" --input "$tmp/ids.jsonl" --batch-size 1 "$@" 2> "$tmp/logprobs.err" > "$tmp/out.jsonl" && cat "$tmp/out.jsonl"; }
# SmolLM2's statistics are the plain build's to check: under AddressSanitizer the small
# files above run the same code.
if nm "$bin" 2> /dev/null | grep -q '__asan_init'; then
    echo "SKIP q4_1_smollm2: $bin is built with AddressSanitizer; the plain build checks SmolLM2's figures"
else
q4_1=$(logprobs --quantize q4_1)
none=$(logprobs)
q5_1=$(logprobs --quantize q5_1)
[ -n "$q4_1" ] || fail q4_1_runs "$(tail -n 1 "$tmp/logprobs.err")"
python3 - "$fixture" "$q4_1" "$none" "$q5_1" << 'EOF' && pass q4_1_smollm2 || fail q4_1_smollm2 "log-probs not close to llama.cpp's"
import json, sys
fixture = json.load(open(sys.argv[1]))["sequences"]
own, none, q5_1 = ([json.loads(line)["logprobs"] for line in text.splitlines()] for text in sys.argv[2:5])
def differences(rows):
    assert len(rows) == len(fixture)
    return [abs(a - b) for row, seq in zip(rows, fixture) for a, b in zip(row, seq["logprobs"])]
own_d = differences(own)
mean = sum(own_d) / len(own_d)
print(f"  q4_1 within {max(own_d):.3g} (mean {mean:.3g}) of llama.cpp's log-probs")
assert own != none and own == q5_1 and mean <= 0.08 and max(own_d) <= 0.5, (mean, max(own_d))
EOF
fi

out=$("$bin" generate --model "$model" --quantize q4_1 --chat --greedy --max-new-tokens 8 "What is the capital of France?" 2> "$tmp/generate.err")
python3 - "$out" << 'EOF' && pass q4_1_generate || fail q4_1_generate "answer '$out' $(tail -n 1 "$tmp/generate.err")"
import json, math, sys
row = json.loads(sys.argv[1])
assert row["response_tokens"] == 8 and row["response"].strip() and all(math.isfinite(x) for x in row["logprobs"]), row
EOF
# On --device cuda: where a GPU runs, q4_1 and q5_1 run there (ops/cuda/dequantize.cuh) with
# the CPU's log-probs up to the bf16 products; without one (or without nvcc at build time) the
# device is refused.
if "$bin" logprobs --model "$model" --input "$tmp/ids.jsonl" --device cuda > /dev/null 2>&1; then
    for type in q4_1 q5_1; do
        cpu=$("$bin" logprobs --model "tests/fixtures/gguf/$type.gguf" --input "$tmp/small_ids.jsonl" --quantize "$type" 2> "$tmp/err")
        cuda=$("$bin" logprobs --model "tests/fixtures/gguf/$type.gguf" --input "$tmp/small_ids.jsonl" --quantize "$type" \
            --device cuda 2>> "$tmp/err")
        python3 - "$cpu" "$cuda" << 'EOF' && pass "${type}_on_cuda" || fail "${type}_on_cuda" "$(tail -n 1 "$tmp/err")"
import json, sys
cpu, cuda = (json.loads(x)["logprobs"] for x in sys.argv[1:3])
assert len(cpu) == len(cuda) and max(abs(a - b) for a, b in zip(cpu, cuda)) <= 5e-2, (cpu, cuda)
EOF
    done
else
    expect_error q4_1_on_cuda "--device cuda" "$bin" logprobs --model "$model" --input "$tmp/ids.jsonl" --quantize q4_1 --device cuda
    expect_error q5_1_on_cuda "--device cuda" "$bin" generate --model "$model" --quantize q5_1 --device cuda "Hello"
fi
expect_error q4_1_bad_name "q4_2" "$bin" generate --model "$model" --quantize q4_2 "Hello"
[ $failures -eq 0 ]
