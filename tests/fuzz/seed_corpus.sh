#!/usr/bin/env bash
# Seeds the libFuzzer corpora of `make fuzz` (one folder per target under $1) with the
# test fixtures each reader loads; the fuzzer adds what it finds there.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:-build-fuzz/corpus}
seed() { # seed TARGET FILES...
    local target=$1
    shift
    mkdir -p "$out/$target"
    for f in "$@"; do cp -n "$f" "$out/$target/$(echo "$f" | tr / _)"; done
}
seed safetensors tests/fixtures/safetensors/dtypes.safetensors tests/fixtures/models/llama/model.safetensors
seed gguf tests/fixtures/gguf/types.gguf tests/fixtures/gguf/tiny_llama.gguf
seed gguf_tokenizer tests/fixtures/tokenizers/spm_small.gguf tests/fixtures/gguf/tiny_llama.gguf
seed tokenizer_json tests/fixtures/tokenizers/bytelevel_small/tokenizer.json tests/fixtures/models/tiny_chat/tokenizer.json
seed config_json tests/fixtures/models/*/config.json
seed chat_template tests/fixtures/models/tiny_chat/tokenizer_config.json \
    tests/fixtures/tokenizers/bytelevel_small/tokenizer_config.json
seed jsonl tests/fixtures/train/pairs_eval.jsonl tests/fixtures/train/ranked_eval.jsonl tests/fixtures/train/sft_eval.jsonl
seed json_schema tests/fixtures/constraints/person.schema.json
seed regex tests/fixtures/constraints/date.regex
seed gbnf tests/fixtures/constraints/json.gbnf
seed chat_request tests/fixtures/api/chat_request.json tests/fixtures/api/chat_schema_request.json
seed completion_request tests/fixtures/api/completion_request.json
seed embeddings_request tests/fixtures/api/embeddings_request.json
seed reward_request tests/fixtures/api/reward_request.json
seed judge_response tests/fixtures/api/judge_response.json
seed reward_answer tests/fixtures/api/reward_answer.json
seed tool_answer tests/fixtures/api/hermes_answer.txt tests/fixtures/api/llama3_answer.txt
echo "corpora in $out: $(ls "$out" | tr '\n' ' ')"
