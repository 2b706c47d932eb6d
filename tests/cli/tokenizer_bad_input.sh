#!/usr/bin/env bash
# Bad tokenizer files and bad rows for `marlhf tokenize` (and {"text"} rows of logprobs):
# every case must exit with status 2 and print exactly one line, "marlhf: error: ...",
# naming the file and the field (or the input line). Also a few good runs of `tokenize`.
# Prints PASS/FAIL per case, like the C tests.
set -u
cd "$(dirname "$0")/../.."
bin=${MARLHF_BIN:-build/marlhf}
tmp=${MARLHF_TEST_TMP:-/tmp}/cli_tokenizer_bad_input
rm -rf "$tmp" && mkdir -p "$tmp"
failures=0
. tests/cli_helpers.sh
fixtures=tests/fixtures/tokenizers
spm=$fixtures/spm_small


# expect_output NAME EXPECTED_STDOUT COMMAND...
expect_output() {
    local name=$1 expected=$2
    shift 2
    local got
    got=$("$@" 2> "$tmp/stderr")
    if [ $? -eq 0 ] && [ "$got" = "$expected" ]; then
        echo "PASS $name"
    else
        echo "FAIL $name: got '$got', wanted '$expected'"
        sed 's/^/    /' "$tmp/stderr" | head -n 5
        failures=$((failures + 1))
    fi
}

text="$tmp/text.jsonl"
echo '{"text": "Hello world"}' > "$text"

# bad_tokenizer NAME JSON: a folder with that tokenizer.json
bad_tokenizer() {
    mkdir -p "$tmp/$1" && printf '%s' "$2" > "$tmp/$1/tokenizer.json"
}
vocab='"vocab": {"a": 0, "b": 1, "ab": 2}'

# --- tokenizer.json -------------------------------------------------------------------
bad_tokenizer invalid_json '{"model": {"type": "BPE",'
expect_error tokenizer_json_invalid "$tmp/invalid_json/tokenizer.json" "$bin" tokenize --model "$tmp/invalid_json" --input "$text"
bad_tokenizer no_model '{"version": "1.0"}'
expect_error tokenizer_json_missing_model "no \"model\" in $tmp/no_model/tokenizer.json" "$bin" tokenize --model "$tmp/no_model" --input "$text"
bad_tokenizer unigram '{"model": {"type": "Unigram", "vocab": [["a", 0.0]]}}'
expect_error tokenizer_json_unknown_model_type "model.type \"Unigram\"" "$bin" tokenize --model "$tmp/unigram" --input "$text"
bad_tokenizer merge_unknown "{\"model\": {\"type\": \"BPE\", $vocab, \"merges\": [\"a b\", \"ab c\"]}}"
expect_error tokenizer_json_merge_unknown_token "model.merges[1] merges \"c\"" "$bin" tokenize --model "$tmp/merge_unknown" --input "$text"
bad_tokenizer vocab_type '{"model": {"type": "BPE", "vocab": {"a": "zero"}, "merges": []}}'
expect_error tokenizer_json_vocab_wrong_type "model.vocab[\"a\"]" "$bin" tokenize --model "$tmp/vocab_type" --input "$text"
bad_tokenizer merges_type "{\"model\": {\"type\": \"BPE\", $vocab, \"merges\": {\"a\": \"b\"}}}"
expect_error tokenizer_json_merges_wrong_type "model.merges must be an array" "$bin" tokenize --model "$tmp/merges_type" --input "$text"
bad_tokenizer flag_type "{\"model\": {\"type\": \"BPE\", $vocab, \"merges\": [], \"ignore_merges\": \"yes\"}}"
expect_error tokenizer_json_flag_wrong_type "model.ignore_merges" "$bin" tokenize --model "$tmp/flag_type" --input "$text"
bad_tokenizer pre_unknown "{\"model\": {\"type\": \"BPE\", $vocab, \"merges\": []}, \"pre_tokenizer\": {\"type\": \"Frobnicate\"}}"
expect_error tokenizer_json_unknown_pre_tokenizer "pre_tokenizer.type \"Frobnicate\"" "$bin" tokenize --model "$tmp/pre_unknown" --input "$text"
bad_tokenizer bad_regex "{\"model\": {\"type\": \"BPE\", $vocab, \"merges\": []}, \"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"Regex\": \"[a-\"}, \"behavior\": \"Isolated\", \"invert\": false}}"
expect_error tokenizer_json_bad_regex "pre_tokenizer" "$bin" tokenize --model "$tmp/bad_regex" --input "$text"
bad_tokenizer added_type "{\"model\": {\"type\": \"BPE\", $vocab, \"merges\": []}, \"added_tokens\": [{\"id\": \"x\", \"content\": \"<s>\"}]}"
expect_error tokenizer_json_added_token_wrong_type "added_tokens[0]" "$bin" tokenize --model "$tmp/added_type" --input "$text"
cp -r "$spm" "$tmp/bad_config" && echo '{"bos_token": 1}' > "$tmp/bad_config/tokenizer_config.json"
expect_error tokenizer_config_wrong_type "bos_token" "$bin" tokenize --model "$tmp/bad_config" --input "$text"
# Not bad input: transformers writes "model_max_length": 1000000000000000019884624838656 for a
# tokenizer without a limit (many published models carry it), past 64-bit integers.
cp -r "$spm" "$tmp/huge_int" &&
    sed -i 's/^{/{\n  "model_max_length": 1000000000000000019884624838656,/' "$tmp/huge_int/tokenizer_config.json"
"$bin" tokenize --model "$spm" --input "$text" > "$tmp/plain.out" 2>&1
"$bin" tokenize --model "$tmp/huge_int" --input "$text" > "$tmp/huge_int.out" 2>&1 &&
    grep -q 1000000000000000019884624838656 "$tmp/huge_int/tokenizer_config.json" && cmp -s "$tmp/plain.out" "$tmp/huge_int.out" &&
    pass tokenizer_config_huge_integer || fail tokenizer_config_huge_integer "$(head -c 300 "$tmp/huge_int.out")"
mkdir -p "$tmp/empty_folder"
expect_error tokenizer_json_missing "$tmp/empty_folder/tokenizer.json" "$bin" tokenize --model "$tmp/empty_folder" --input "$text"

# --- GGUF metadata --------------------------------------------------------------------
expect_error gguf_no_tokenizer "tokenizer.ggml.model" "$bin" tokenize --model tests/fixtures/gguf/tiny_llama_model.gguf --input "$text"
expect_error gguf_unknown_pre "tokenizer.ggml.pre \"frobnicate\"" "$bin" tokenize --model $fixtures/bad/unknown_pre.gguf --input "$text"
expect_error gguf_tokens_wrong_type "tokenizer.ggml.tokens" "$bin" tokenize --model $fixtures/bad/tokens_wrong_type.gguf --input "$text"
expect_error gguf_missing_merges "tokenizer.ggml.merges" "$bin" tokenize --model $fixtures/bad/no_merges.gguf --input "$text"
expect_error gguf_unknown_model "tokenizer.ggml.model \"rwkv\"" "$bin" tokenize --model $fixtures/bad/unknown_model.gguf --input "$text"
expect_error gguf_error_names_file "unknown_pre.gguf" "$bin" tokenize --model $fixtures/bad/unknown_pre.gguf --input "$text"

# --- input rows -----------------------------------------------------------------------
printf '{"text": "ok"}\n{"text": "ok"\n' > "$tmp/badline.jsonl"
expect_error tokenize_invalid_json "$tmp/badline.jsonl:2" "$bin" tokenize --model "$spm" --input "$tmp/badline.jsonl"
echo '{"text": 42}' > "$tmp/notstring.jsonl"
expect_error tokenize_text_not_string "\"text\" must be a string ($tmp/notstring.jsonl:1)" "$bin" tokenize --model "$spm" --input "$tmp/notstring.jsonl"
echo '{"words": "x"}' > "$tmp/notext.jsonl"
expect_error tokenize_missing_text "$tmp/notext.jsonl:1" "$bin" tokenize --model "$spm" --input "$tmp/notext.jsonl"
echo '[1, 2]' > "$tmp/notobject.jsonl"
expect_error tokenize_row_not_object "$tmp/notobject.jsonl:1" "$bin" tokenize --model "$spm" --input "$tmp/notobject.jsonl"
echo '{"ids": [1, "x"]}' > "$tmp/idtype.jsonl"
expect_error detokenize_id_not_integer "not an integer" "$bin" tokenize --decode --model "$spm" --input "$tmp/idtype.jsonl"
echo '{"ids": [1, 5000]}' > "$tmp/idrange.jsonl"
expect_error detokenize_id_out_of_range "outside the vocabulary" "$bin" tokenize --decode --model "$spm" --input "$tmp/idrange.jsonl"
echo '{"text": "Hello"}' > "$tmp/text_row.jsonl"
expect_error logprobs_text_without_tokenizer "tokenizer.json" "$bin" logprobs --model tests/fixtures/models/llama --input "$tmp/text_row.jsonl"
echo '{"text": 7}' > "$tmp/text_int.jsonl"
expect_error logprobs_text_not_string "\"text\" must be a string" "$bin" logprobs --model tests/fixtures/models/llama --input "$tmp/text_int.jsonl"

# --- good runs ------------------------------------------------------------------------
ids=$("$bin" tokenize --model "$spm" --input "$text" 2>/dev/null)
expect_output tokenize_round_trip '{"text":"Hello world"}' bash -c "echo '$ids' | '$bin' tokenize --decode --model '$spm' --input -"
with_bos=$("$bin" tokenize --model "$spm" --input "$text" --add-bos 2>/dev/null)
case "$with_bos" in '{"ids": [1, '*) echo "PASS tokenize_add_bos" ;; *) echo "FAIL tokenize_add_bos: $with_bos"; failures=$((failures + 1)) ;; esac
printf '{"ids": [1, 2]}\n' > "$tmp/special.jsonl"
expect_output detokenize_skip_special '{"text":""}' "$bin" tokenize --decode --skip-special --model "$spm" --input "$tmp/special.jsonl"
echo keep > "$tmp/out.jsonl"
expect_error tokenize_bad_row_keeps_output "$tmp/badline.jsonl:2" "$bin" tokenize --model "$spm" --input "$tmp/badline.jsonl" --output "$tmp/out.jsonl"
if [ "$(cat "$tmp/out.jsonl")" = keep ]; then echo "PASS tokenize_kept_existing_output"; else echo "FAIL tokenize_kept_existing_output"; failures=$((failures + 1)); fi

[ "$failures" -eq 0 ]
