#!/usr/bin/env bash
# marlhf convert to GGUF (llama.cpp's format): the tiny chat model and its tokenizer come
# back from the file as they went in (F32 bit for bit; F16 and Q8_0 close), the GGUF runs
# every command, a LoRA adapter is merged or written alone, and bad options or inputs are
# one-line errors that leave existing files alone. Prints PASS/FAIL per case.
set -u
cd "$(dirname "$0")/../.."
bin=${MARLHF_BIN:-build/marlhf}
tmp=${MARLHF_TEST_TMP:-/tmp}/cli_convert
rm -rf "$tmp" && mkdir -p "$tmp"
model=tests/fixtures/models/tiny_chat
failures=0
. tests/cli_helpers.sh
logprobs_line() { "$bin" logprobs --model "$1" --input "$tmp/ids.jsonl" 2> /dev/null | head -n 1; }
echo '{"ids": [1, 5, 9, 14, 2, 33, 7, 12, 40, 3]}' > "$tmp/ids.jsonl"
want=$(logprobs_line "$model")

"$bin" convert "$model" "$tmp/f32.gguf" --outtype f32 2> "$tmp/f32.err" &&
    [ "$(logprobs_line "$tmp/f32.gguf")" = "$want" ] && pass convert_gguf_f32_same_logprobs ||
    fail convert_gguf_f32_same_logprobs "$(tail -n 1 "$tmp/f32.err")"
# Each type within its rounding of the f32 log-probs. 4-bit: the tiny model's rows (64, 128
# values) take llama.cpp's fallbacks (Q5_0, Q8_0) for Q4_K_M; the log-probs move more.
# IQ4_XS: the same rows are not whole super-blocks either; they take IQ4_NL (llama.cpp's fallback);
# Q3_K_M's and Q2_K's take Q4_0 (and Q5_0 / Q5_1 for their Q4_K / Q5_K matrices).
for case in f16:0.02 q8_0:0.02 q4_0:0.25 q4_1:0.25 q5_0:0.12 q5_1:0.12 iq4_nl:0.25 iq4_xs:0.25 q4_k_m:0.25 \
    q3_k_m:0.25 q2_k:0.25; do
    type=${case%%:*} tolerance=${case#*:}
    "$bin" convert "$model" "$tmp/$type.gguf" --outtype "$type" 2> "$tmp/$type.err"
    python3 - "$want" "$(logprobs_line "$tmp/$type.gguf")" "$tolerance" << 'EOF' && pass "convert_gguf_${type}_close" || fail "convert_gguf_${type}_close" "$(tail -n 1 "$tmp/$type.err")"
import json, sys
a, b = (json.loads(x)["logprobs"] for x in sys.argv[1:3])
assert len(a) == len(b) and max(abs(x - y) for x, y in zip(a, b)) < float(sys.argv[3]), (a, b)
EOF
done
[ "$(stat -c %s "$tmp/q4_0.gguf")" -lt "$(stat -c %s "$tmp/q8_0.gguf")" ] && pass convert_gguf_q4_smaller || fail convert_gguf_q4_smaller "sizes"
# Per 32 values Q4_0 takes 18 bytes, Q4_1 20, Q5_0 22, Q5_1 24, Q8_0 34 (IQ4_NL 18, as Q4_0); and the
# file says which (general.file_type, llama.cpp's ftype: 3 Q4_1, 8 Q5_0, 9 Q5_1, 25 IQ4_NL, 30 IQ4_XS,
# whose file here holds IQ4_NL's bytes: the same size; 12 Q3_K_M, 10 Q2_K).
python3 - "$tmp" << 'EOF' && pass convert_gguf_legacy_sizes_and_file_types || fail convert_gguf_legacy_sizes_and_file_types "see above"
import os, struct, sys
tmp = sys.argv[1]
size = {t: os.path.getsize(f"{tmp}/{t}.gguf") for t in ("q4_0", "q4_1", "q5_0", "q5_1", "q8_0")}
assert size["q4_0"] < size["q4_1"] < size["q5_0"] < size["q5_1"] < size["q8_0"], size
assert os.path.getsize(f"{tmp}/iq4_nl.gguf") == size["q4_0"], (os.path.getsize(f"{tmp}/iq4_nl.gguf"), size)
assert os.path.getsize(f"{tmp}/iq4_xs.gguf") == size["q4_0"], (os.path.getsize(f"{tmp}/iq4_xs.gguf"), size)
def file_type(path):  # the value after the key "general.file_type": its type (4, uint32), then the u32
    data = open(path, "rb").read(1 << 16)
    key = b"general.file_type"
    at = data.index(struct.pack("<Q", len(key)) + key) + 8 + len(key)
    assert struct.unpack_from("<I", data, at)[0] == 4
    return struct.unpack_from("<I", data, at + 4)[0]
got = {t: file_type(f"{tmp}/{t}.gguf") for t in ("q4_1", "q5_0", "q5_1", "iq4_nl", "iq4_xs", "q3_k_m", "q2_k")}
assert got == {"q4_1": 3, "q5_0": 8, "q5_1": 9, "iq4_nl": 25, "iq4_xs": 30, "q3_k_m": 12, "q2_k": 10}, got
EOF
[ "$(stat -c %s "$tmp/q8_0.gguf")" -lt "$(stat -c %s "$tmp/f16.gguf")" ] &&
    [ "$(stat -c %s "$tmp/f16.gguf")" -lt "$(stat -c %s "$tmp/f32.gguf")" ] && pass convert_gguf_sizes || fail convert_gguf_sizes "sizes"
# The tokenizer travels in the file: the same ids for text, and generation runs on it.
printf '{"text": "Hello, world! It is 2026."}\n{"text": "<|im_start|>user\\nhi"}\n' > "$tmp/texts.jsonl"
[ "$("$bin" tokenize --model "$model" --input "$tmp/texts.jsonl")" = "$("$bin" tokenize --model "$tmp/f32.gguf" --input "$tmp/texts.jsonl")" ] &&
    pass convert_gguf_same_token_ids || fail convert_gguf_same_token_ids "ids differ"
"$bin" generate --model "$tmp/f16.gguf" --chat "hi" --max-new-tokens 4 --temperature 0 > /dev/null 2> "$tmp/generate.err" &&
    pass convert_gguf_generates || fail convert_gguf_generates "$(tail -n 1 "$tmp/generate.err")"
# GGUF back to a Hugging Face folder: the same weights again.
"$bin" convert "$tmp/f32.gguf" "$tmp/back" 2> /dev/null && [ "$(logprobs_line "$tmp/back")" = "$want" ] &&
    pass convert_gguf_back_to_hf || fail convert_gguf_back_to_hf "log-probs differ"

# A LoRA adapter: merged into the GGUF, or alone as a llama.cpp --lora file.
"$bin" sft --model "$model" --data tests/fixtures/train/sft.jsonl --max-seq-len 32 --learning-rate 1e-2 --max-steps 4 \
    --lora-rank 4 --threads 2 --quiet --output "$tmp/lora_run" 2> /dev/null
adapted=$("$bin" logprobs --model "$model" --lora-adapter "$tmp/lora_run/final" --input "$tmp/ids.jsonl" 2> /dev/null)
"$bin" convert "$model" "$tmp/merged.gguf" --lora-adapter "$tmp/lora_run/final" --outtype f32 2> "$tmp/merged.err"
python3 - "$adapted" "$(logprobs_line "$tmp/merged.gguf")" "$want" << 'EOF' && pass convert_gguf_lora_merged || fail convert_gguf_lora_merged "$(tail -n 1 "$tmp/merged.err")"
import json, sys
a, m, base = (json.loads(x)["logprobs"] for x in sys.argv[1:])
assert max(abs(x - y) for x, y in zip(a, m)) < 1e-5 and max(abs(x - y) for x, y in zip(a, base)) > 1e-3, (a, m, base)
EOF
"$bin" convert "$model" "$tmp/adapter.gguf" --lora-adapter "$tmp/lora_run/final" --adapter-only --outtype f32 2> "$tmp/adapter.err" &&
    [ "$(stat -c %s "$tmp/adapter.gguf")" -lt "$(stat -c %s "$tmp/f32.gguf")" ] && pass convert_gguf_lora_adapter_only ||
    fail convert_gguf_lora_adapter_only "$(tail -n 1 "$tmp/adapter.err")"
expect_error convert_adapter_only_needs_adapter "--adapter-only needs --lora-adapter" "$bin" convert "$model" "$tmp/y.gguf" --adapter-only

expect_error convert_bad_outtype "--outtype" "$bin" convert "$model" "$tmp/x.gguf" --outtype q4_k
echo keep > "$tmp/existing.gguf"
expect_error convert_gguf_refuses_overwrite "--overwrite" "$bin" convert "$model" "$tmp/existing.gguf"
[ "$(cat "$tmp/existing.gguf")" = keep ] && pass convert_gguf_kept_existing || fail convert_gguf_kept_existing "changed"
# A tokenizer larger than the model's embedding is refused, and nothing is written.
mkdir -p "$tmp/mismatch"
cp tests/fixtures/models/llama/config.json tests/fixtures/models/llama/model.safetensors "$tmp/mismatch/"
cp tests/fixtures/tokenizers/spm_small/tokenizer*.json "$tmp/mismatch/"
expect_error convert_gguf_tokenizer_too_large "1000 tokens but the model only 128" "$bin" convert "$tmp/mismatch" "$tmp/mismatch.gguf"
[ ! -e "$tmp/mismatch.gguf" ] && pass convert_gguf_failed_leaves_nothing || fail convert_gguf_failed_leaves_nothing "file written"

[ $failures -eq 0 ]
