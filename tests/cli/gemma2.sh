#!/usr/bin/env bash
# Gemma 2 through the commands (tests/fixtures/models/tiny_gemma2_chat: tiny_chat's sizes
# and tokenizer as a Gemma 2, soft caps 2 on the attention scores and 5 on the logits):
# SFT learns and saves a gemma2 config.json with its caps; the reward model learns and saves
# as Gemma2ForSequenceClassification; MA-PPO runs on the two and is reproducible from its
# seed; a GGUF export generates what the folder generates; bad values and an export
# llama.cpp would misread are refused. The numerics are checked against transformers in
# tests/test_model.c. Prints PASS/FAIL per case.
set -u
cd "$(dirname "$0")/../.."
bin=${MARLHF_BIN:-build/marlhf}
tmp=${MARLHF_TEST_TMP:-/tmp}/cli_gemma2
rm -rf "$tmp" && mkdir -p "$tmp"
model=tests/fixtures/models/tiny_gemma2_chat
data=tests/fixtures/train
failures=0
. tests/cli_helpers.sh

# --- SFT ------------------------------------------------------------------------------
sft_learns gemma2 "$model"
python3 - "$tmp/sft/final/config.json" <<'PY' && pass gemma2_sft_saves_config || fail gemma2_sft_saves_config "$(cat "$tmp/sft/final/config.json")"
import json, sys
c = json.load(open(sys.argv[1]))
sys.exit(0 if c["model_type"] == "gemma2" and c["architectures"] == ["Gemma2ForCausalLM"]
         and c["attn_logit_softcapping"] == 2.0 and c["final_logit_softcapping"] == 5.0
         and c["query_pre_attn_scalar"] == 16.0 else 1)
PY

# --- reward model and MA-PPO (the SFT model against it, critic from it, fixed 3-grams) ----
rm_and_ma_ppo gemma2 "$model" Gemma2ForSequenceClassification gemma2

# --- GGUF: the export generates what the folder generates ------------------------------
"$bin" convert "$tmp/sft/final" "$tmp/sft.gguf" --outtype f32 > /dev/null 2> "$tmp/convert.err" ||
    fail gemma2_gguf_export "$(tail -n 2 "$tmp/convert.err")"
for source in folder gguf; do
    path=$tmp/sft/final
    [ "$source" = gguf ] && path=$tmp/sft.gguf
    "$bin" generate --model "$path" --max-new-tokens 12 --temperature 0 "Hello there" > "$tmp/greedy_$source.jsonl" \
        2> "$tmp/greedy_$source.err"
done
python3 - "$tmp/greedy_folder.jsonl" "$tmp/greedy_gguf.jsonl" <<'PY' && pass gemma2_gguf_generates_the_same ||
import json, sys
folder, gguf = (json.loads(open(p).readline()) for p in sys.argv[1:])
worst = max(abs(a - b) for a, b in zip(folder["logprobs"], gguf["logprobs"]))
sys.exit(0 if folder["ids"] == gguf["ids"] and len(folder["ids"]) == 12 and worst < 1e-4 else 1)
PY
    fail gemma2_gguf_generates_the_same "$(cat "$tmp/greedy_folder.jsonl" "$tmp/greedy_gguf.jsonl" "$tmp/greedy_gguf.err" | head -c 600)"

# --- refusals -------------------------------------------------------------------------
mkdir -p "$tmp/bad_cap" "$tmp/odd_scalar"
cp "$model"/* "$tmp/bad_cap/" && cp "$tmp/sft/final"/* "$tmp/odd_scalar/"
sed -i 's/"attn_logit_softcapping": 2.0/"attn_logit_softcapping": -2.0/' "$tmp/bad_cap/config.json"
expect_error gemma2_negative_soft_cap "'attn_logit_softcapping'" "$bin" generate --model "$tmp/bad_cap" "Hi"
# llama.cpp infers the query scalar from the shape (head_dim here): a model with another
# cannot be exported, and nothing is written.
sed -i 's/"query_pre_attn_scalar": 16/"query_pre_attn_scalar": 24/' "$tmp/odd_scalar/config.json"
expect_error gemma2_uninferable_query_scalar "query_pre_attn_scalar (24)" "$bin" convert "$tmp/odd_scalar" "$tmp/odd.gguf"
[ ! -e "$tmp/odd.gguf" ] && pass gemma2_refused_export_writes_nothing || fail gemma2_refused_export_writes_nothing "odd.gguf exists"
# llama.cpp always applies both caps: a model without one cannot be exported.
mkdir -p "$tmp/uncapped" && cp "$tmp/sft/final"/* "$tmp/uncapped/"
sed -i 's/"final_logit_softcapping": 5.0/"final_logit_softcapping": null/' "$tmp/uncapped/config.json"
expect_error gemma2_uncapped_export "without both soft caps" "$bin" convert "$tmp/uncapped" "$tmp/uncapped.gguf"
# On the GPU (the unfused attention kernels): runs where a GPU is; else the device is refused.
expect_runs_on_cuda gemma2_on_cuda "$bin" generate --model "$model" --device cuda --max-new-tokens 4 "Hi"

[ "$failures" -eq 0 ]
