#!/usr/bin/env bash
# A Q4_K_M GGUF on the inference commands (docs/quantization.md, "K-quants"): SmolLM2-135M-Instruct
# written as Q4_K_M by marlhf convert runs with its own bits when --quantize is left out (the
# log-probs of --quantize q4_k_m, bit for bit, not those of the float32 weights), --quantize
# none still runs it in float32, the Q4_1 file it came from stays float32 by default, and
# generate answers from it; an unknown --quantize is a one-line error. llama.cpp's own Q5_K_M
# file runs with its bits, as llama.cpp computes it, and convert writes Q5_K_M; --quantize q3_k_m,
# q2_k, iq4_nl and iq4_xs on a float model give the log-probs of the file convert writes in that
# mix, bit for bit. Prints PASS/FAIL per case. Under the sanitizers the conversion of SmolLM2 runs (the writer on a real model's
# shapes) but its log-probs and answers are the plain build's (tests/cli_helpers.sh
# real_model_runs): the small llama.cpp files below run the same kernels there.
set -u
cd "$(dirname "$0")/../.."
bin=${MARLHF_BIN:-build/marlhf}
tmp=${MARLHF_TEST_TMP:-/tmp}/cli_kquant
rm -rf "$tmp" && mkdir -p "$tmp"
source_model=models/SmolLM2-135M-Instruct.Q4_1.gguf
model=$tmp/SmolLM2-135M-Instruct.Q4_K_M.gguf
failures=0
. tests/cli_helpers.sh
echo '{"ids": [1, 504, 3158, 282, 260, 1345, 30, 216, 1121, 1379, 314, 4042, 30]}' > "$tmp/ids.jsonl"
logprobs_line() { "$bin" logprobs --model "$1" --input "$tmp/ids.jsonl" "${@:2}" 2> "$tmp/logprobs.err" | head -n 1; }

"$bin" convert "$source_model" "$model" --outtype q4_k_m > /dev/null 2> "$tmp/convert.err" ||
    fail kquant_convert "$(tail -n 1 "$tmp/convert.err")"
if real_model_runs "$source_model" "kquant.sh's SmolLM2 log-probs and answer"; then
default=$(logprobs_line "$model")
own=$(logprobs_line "$model" --quantize q4_k_m)
float=$(logprobs_line "$model" --quantize none)
[ -n "$default" ] && [ "$default" = "$own" ] && pass kquant_default_is_own_bits ||
    fail kquant_default_is_own_bits "default: $default; --quantize q4_k_m: $own $(tail -n 1 "$tmp/logprobs.err")"
# The own bits move the log-probs (the inputs are quantized too), but not far.
python3 - "$own" "$float" << 'EOF' && pass kquant_close_to_float32 || fail kquant_close_to_float32 "$own / $float"
import json, sys
a, b = (json.loads(x)["logprobs"] for x in sys.argv[1:3])
difference = max(abs(x - y) for x, y in zip(a, b))
assert len(a) == len(b) and 0 < difference < 1.0, difference
EOF
[ "$(logprobs_line "$source_model")" = "$(logprobs_line "$source_model" --quantize none)" ] &&
    pass kquant_q4_1_file_stays_float32 || fail kquant_q4_1_file_stays_float32 "a Q4_1 file was quantized by default"
# A greedy answer of 12 tokens (SmolLM2's first words are close calls: "The" against "L"
# in float32, docs/quantization.md, so the text itself is not checked).
out=$("$bin" generate --model "$model" --chat --greedy --max-new-tokens 12 "What is the capital of France?" 2> "$tmp/generate.err")
python3 - "$out" << 'EOF' && pass kquant_generate || fail kquant_generate "answer '$out' $(tail -n 1 "$tmp/generate.err")"
import json, math, sys
row = json.loads(sys.argv[1])
assert row["response_tokens"] == 12 and row["response"].strip() and all(math.isfinite(x) for x in row["logprobs"]), row
EOF
fi
expect_error kquant_bad_quantize "q4_k_s" "$bin" generate --model "$model" --quantize q4_k_s "Hello"

# llama.cpp's Q5_K_M file (tests/fixtures/gguf/q5_k_m.gguf, tools/make_q5_k_fixture.py): by
# default its Q5_K / Q6_K tensors run with their own bits (the same log-probs as --quantize
# q4_k_m and q5_k_m, which both hold a file's K-quant bytes), llama.cpp's log-probs on the
# file to 1e-4, and --quantize none (float inputs on the dequantized weights) clearly not.
q5=tests/fixtures/gguf/q5_k_m.gguf
q5_expected=tests/fixtures/gguf/q5_k_m.expected.json
python3 -c "import json, sys; print(json.dumps({'ids': json.load(open(sys.argv[1]))['ids']}))" "$q5_expected" > "$tmp/q5_ids.jsonl"
q5_line() { "$bin" logprobs --model "$1" --input "$tmp/q5_ids.jsonl" "${@:2}" 2> "$tmp/logprobs.err" | head -n 1; }
q5_default=$(q5_line "$q5")
[ -n "$q5_default" ] && [ "$q5_default" = "$(q5_line "$q5" --quantize q4_k_m)" ] &&
    [ "$q5_default" = "$(q5_line "$q5" --quantize q5_k_m)" ] && pass kquant_q5_k_default_is_own_bits ||
    fail kquant_q5_k_default_is_own_bits "default: $q5_default $(tail -n 1 "$tmp/logprobs.err")"
# llama.cpp's log-probs (from the logits of expected file $1) against the log-probs line $2
# (to 1e-4) and $3 (--quantize none: more than 1e-2 off).
near_llama_cpp() {
    python3 - "$@" << 'EOF'
import json, math, sys
expected = json.load(open(sys.argv[1]))
ids, rows = expected["ids"], expected["logits"]
def log_prob(row, token):
    top = max(row)
    return row[token] - top - math.log(sum(math.exp(x - top) for x in row))
reference = [log_prob(rows[t], ids[t + 1]) for t in range(len(ids) - 1)]
own, float32 = (json.loads(x)["logprobs"] for x in sys.argv[2:4])
own_difference = max(abs(a - b) for a, b in zip(own, reference))
float_difference = max(abs(a - b) for a, b in zip(float32, reference))
assert len(own) == len(reference) and own_difference < 1e-4 and float_difference > 1e-2, (own_difference, float_difference)
EOF
}
near_llama_cpp "$q5_expected" "$q5_default" "$(q5_line "$q5" --quantize none)" && pass kquant_q5_k_llama_cpp ||
    fail kquant_q5_k_llama_cpp "log-probs of the Q5_K_M file differ from llama.cpp's"
# llama.cpp's Q3_K_M and Q2_K files (tools/make_q3_k_fixture.py: the same weights and ids): by
# default their Q3_K / Q2_K tensors run with their own bits too (the same log-probs as
# --quantize q4_k_m), llama.cpp's log-probs to 1e-4, --quantize none clearly not.
for name in q3_k_m q2_k; do
    file=tests/fixtures/gguf/$name.gguf
    own=$(q5_line "$file")
    [ -n "$own" ] && [ "$own" = "$(q5_line "$file" --quantize q4_k_m)" ] &&
        near_llama_cpp "tests/fixtures/gguf/$name.expected.json" "$own" "$(q5_line "$file" --quantize none)" &&
        pass "kquant_${name}_llama_cpp" || fail "kquant_${name}_llama_cpp" "log-probs $own $(tail -n 1 "$tmp/logprobs.err")"
done
# convert --outtype q5_k_m (the fixture's weights in marlhf's own Q5_K_M blocks) runs by default
# with its own bits too, close to the original file's log-probs.
"$bin" convert "$q5" "$tmp/q5_again.gguf" --outtype q5_k_m > /dev/null 2> "$tmp/convert.err" ||
    fail kquant_convert_q5_k_m "$(tail -n 1 "$tmp/convert.err")"
python3 - "$q5_default" "$(q5_line "$tmp/q5_again.gguf")" << 'EOF' && pass kquant_convert_q5_k_m || fail kquant_convert_q5_k_m "its log-probs are not close"
import json, sys
a, b = (json.loads(x)["logprobs"] for x in sys.argv[1:3])
assert len(a) == len(b) and 0 < max(abs(x - y) for x, y in zip(a, b)) < 0.5
EOF
expect_error kquant_bad_outtype "q5_k_s" "$bin" convert "$q5" "$tmp/bad.gguf" --outtype q5_k_s
# --quantize MIX on a float model is the file `convert --outtype MIX` writes of it: the same
# log-probs, bit for bit, as that file run with its default (its own bits, named by its type).
"$bin" convert "$q5" "$tmp/q5_f32.gguf" --outtype f32 > /dev/null 2> "$tmp/convert.err" ||
    fail kquant_convert_f32 "$(tail -n 1 "$tmp/convert.err")"
for name in q3_k_m q2_k iq4_nl iq4_xs; do
    "$bin" convert "$tmp/q5_f32.gguf" "$tmp/q5_$name.gguf" --outtype $name > /dev/null 2> "$tmp/convert.err" ||
        fail "kquant_convert_$name" "$(tail -n 1 "$tmp/convert.err")"
    written=$(q5_line "$tmp/q5_$name.gguf")
    [ -n "$written" ] && [ "$written" = "$(q5_line "$tmp/q5_f32.gguf" --quantize $name)" ] &&
        [ "$written" != "$(q5_line "$tmp/q5_f32.gguf")" ] && pass "kquant_quantize_${name}_is_its_file" ||
        fail "kquant_quantize_${name}_is_its_file" "$written $(tail -n 1 "$tmp/logprobs.err")"
done

[ $failures -eq 0 ]
