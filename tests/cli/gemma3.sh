#!/usr/bin/env bash
# Gemma 3 (text-only, model_type gemma3_text) through the commands
# (tests/fixtures/models/tiny_gemma3_chat: tiny_chat's widths and tokenizer as a Gemma 3 of 6
# layers, layers 0-4 sliding ones turning by RoPE base 1e4, layer 5 a full-attention one by
# 5e5): SFT learns and saves a config.json that says the same in transformers 4.x's and 5.x's
# fields; the reward model learns and saves as Gemma3TextForSequenceClassification; MA-PPO
# runs and is reproducible from its seed; a GGUF export generates what the folder generates;
# what marlhf does not read or write is refused in one line. The numerics are checked against transformers in tests/test_model.c (fixture
# gemma3). Prints PASS/FAIL per case.
set -u
cd "$(dirname "$0")/../.."
bin=${MARLHF_BIN:-build/marlhf}
tmp=${MARLHF_TEST_TMP:-/tmp}/cli_gemma3
rm -rf "$tmp" && mkdir -p "$tmp"
model=tests/fixtures/models/tiny_gemma3_chat
data=tests/fixtures/train
failures=0
. tests/cli_helpers.sh

# --- SFT ------------------------------------------------------------------------------
sft_learns gemma3 "$model"
python3 - "$tmp/sft/final/config.json" <<'PY' && pass gemma3_sft_saves_config || fail gemma3_sft_saves_config "$(cat "$tmp/sft/final/config.json")"
import json, sys
c = json.load(open(sys.argv[1]))
rope = c["rope_parameters"]
sys.exit(0 if c["model_type"] == "gemma3_text" and c["architectures"] == ["Gemma3ForCausalLM"]
         and c["layer_types"] == ["sliding_attention"] * 5 + ["full_attention"] and c["sliding_window_pattern"] == 6
         and c["rope_theta"] == 5e5 and c["rope_local_base_freq"] == 1e4
         and rope["full_attention"]["rope_theta"] == 5e5 and rope["sliding_attention"]["rope_theta"] == 1e4
         and c["attn_logit_softcapping"] is None and c["final_logit_softcapping"] is None
         and c["query_pre_attn_scalar"] == 16.0 else 1)
PY
# 4.x's fields alone (rope_theta, not the default; rope_local_base_freq,
# sliding_window_pattern) say the same model as 5.x's: the same greedy answer and log-probs
# (tests/test_config_hf.c reads non-default values of each).
mkdir -p "$tmp/fields_4x" && cp "$tmp/sft/final"/* "$tmp/fields_4x/"
python3 - "$tmp/fields_4x/config.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
for key in ("rope_parameters", "layer_types"):
    del c[key]
json.dump(c, open(sys.argv[1], "w"))
PY
for source in sft/final fields_4x; do
    "$bin" generate --model "$tmp/$source" --max-new-tokens 8 --temperature 0 "Hello there" > "$tmp/greedy_${source%%/*}.jsonl" \
        2> "$tmp/greedy_${source%%/*}.err"
done
cmp -s "$tmp/greedy_sft.jsonl" "$tmp/greedy_fields_4x.jsonl" && [ -s "$tmp/greedy_sft.jsonl" ] &&
    pass gemma3_4x_fields_same_model || fail gemma3_4x_fields_same_model "$(cat "$tmp/greedy_fields_4x.err" | head -n 2)"

# --- reward model and MA-PPO (the SFT model against it, critic from it, fixed 3-grams) ----
rm_and_ma_ppo gemma3 "$model" Gemma3TextForSequenceClassification gemma3_text

# --- GGUF: the export (llama.cpp's gemma3) generates what the folder generates ------------
"$bin" convert "$tmp/sft/final" "$tmp/sft.gguf" --outtype f32 > /dev/null 2> "$tmp/convert.err" ||
    fail gemma3_gguf_export "$(tail -n 2 "$tmp/convert.err")"
"$bin" generate --model "$tmp/sft.gguf" --max-new-tokens 8 --temperature 0 "Hello there" > "$tmp/greedy_gguf.jsonl" \
    2> "$tmp/greedy_gguf.err"
python3 - "$tmp/greedy_sft.jsonl" "$tmp/greedy_gguf.jsonl" <<'PY' && pass gemma3_gguf_generates_the_same ||
import json, sys
folder, gguf = (json.loads(open(p).readline()) for p in sys.argv[1:])
worst = max(abs(a - b) for a, b in zip(folder["logprobs"], gguf["logprobs"]))
sys.exit(0 if folder["ids"] == gguf["ids"] and len(folder["ids"]) == 8 and worst < 1e-4 else 1)
PY
    fail gemma3_gguf_generates_the_same "$(cat "$tmp/greedy_sft.jsonl" "$tmp/greedy_gguf.jsonl" "$tmp/greedy_gguf.err" | head -c 600)"

# --- refusals -------------------------------------------------------------------------
mkdir -p "$tmp/vision" "$tmp/irregular" "$tmp/pattern_2"
cp "$model"/* "$tmp/vision/" && cp "$model"/* "$tmp/irregular/" && cp "$model"/* "$tmp/pattern_2/"
sed -i 's/"model_type": "gemma3_text"/"model_type": "gemma3"/' "$tmp/vision/config.json"
expect_error gemma3_vision_checkpoint "model_type 'gemma3_text'" "$bin" generate --model "$tmp/vision" "Hi"
python3 - "$tmp/irregular/config.json" "$tmp/pattern_2/config.json" <<'PY'
import json, sys
for path, types in zip(sys.argv[1:], (["full_attention"] + ["sliding_attention"] * 5,
                                      ["sliding_attention", "full_attention"] * 3)):
    c = json.load(open(path))
    c["layer_types"] = types
    json.dump(c, open(path, "w"))
PY
expect_error gemma3_irregular_layer_types "does not repeat one pattern" "$bin" generate --model "$tmp/irregular" "Hi"
# llama.cpp fixes the pattern (every 6th layer full attention): another cannot be exported.
expect_error gemma3_other_pattern_export "layer pattern (2)" "$bin" convert "$tmp/pattern_2" "$tmp/pattern_2.gguf"
[ ! -e "$tmp/pattern_2.gguf" ] && pass gemma3_refused_export_writes_nothing || fail gemma3_refused_export_writes_nothing "pattern_2.gguf exists"
# On the GPU: runs where a GPU is; else the device is refused.
expect_runs_on_cuda gemma3_on_cuda "$bin" generate --model "$model" --device cuda --max-new-tokens 4 "Hi"

[ "$failures" -eq 0 ]
