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
"$bin" sft --model "$model" --data "$data/sft.jsonl" --eval-data "$data/sft_eval.jsonl" --max-seq-len 32 \
    --per-device-train-batch-size 4 --gradient-accumulation-steps 2 --learning-rate 3e-3 --num-train-epochs 4 \
    --warmup-ratio 0.1 --eval-every 6 --threads 2 --quiet --output "$tmp/sft" 2> "$tmp/sft.err" ||
    fail sft_runs "$(tail -n 3 "$tmp/sft.err")"
first=$(json_field "$tmp/sft/metrics.jsonl" eval/loss 0 2>/dev/null); last=$(json_field "$tmp/sft/metrics.jsonl" eval/loss -1 2>/dev/null)
python3 -c "import sys; sys.exit(0 if float(sys.argv[2]) < 0.75 * float(sys.argv[1]) else 1)" "$first" "$last" 2>/dev/null &&
    pass "gemma2_sft_learns (eval loss $first -> $last)" || fail gemma2_sft_learns "eval loss '$first' -> '$last'"
python3 - "$tmp/sft/final/config.json" <<'PY' && pass gemma2_sft_saves_config || fail gemma2_sft_saves_config "$(cat "$tmp/sft/final/config.json")"
import json, sys
c = json.load(open(sys.argv[1]))
sys.exit(0 if c["model_type"] == "gemma2" and c["architectures"] == ["Gemma2ForCausalLM"]
         and c["attn_logit_softcapping"] == 2.0 and c["final_logit_softcapping"] == 5.0
         and c["query_pre_attn_scalar"] == 16.0 else 1)
PY

# --- reward model ---------------------------------------------------------------------
"$bin" rm --model "$model" --data "$data/pairs.jsonl" --eval-data "$data/pairs_eval.jsonl" --max-seq-len 32 \
    --per-device-train-batch-size 4 --learning-rate 3e-3 --num-train-epochs 4 --threads 2 --quiet \
    --output "$tmp/rm" 2> "$tmp/rm.err"
acc=$(json_field "$tmp/rm/metrics.jsonl" eval/accuracy -1 2>/dev/null)
python3 -c "import sys; sys.exit(0 if float(sys.argv[1]) >= 0.9 else 1)" "$acc" 2>/dev/null &&
    pass "gemma2_rm_learns (eval accuracy $acc)" || fail gemma2_rm_learns "accuracy '$acc' $(tail -n 2 "$tmp/rm.err")"
grep -q '"Gemma2ForSequenceClassification"' "$tmp/rm/final/config.json" && pass gemma2_rm_saved_as_classifier ||
    fail gemma2_rm_saved_as_classifier "$(grep -A1 architectures "$tmp/rm/final/config.json")"

# --- MA-PPO: the SFT model against the reward model (critic from it), fixed 3-grams ----
ppo() { # ppo NAME: three iterations into $tmp/NAME
    "$bin" ppo --actor-model "$tmp/sft/final" --reward-model "$tmp/rm/final" --prompts "$data/sft.jsonl" \
        --eval-prompts "$data/sft_eval.jsonl" --eval-count 4 --rollout-batch-size 8 --generation-batch-size 8 \
        --micro-batch-size 4 --max-new-tokens 10 --max-iterations 3 --actor-learning-rate 1e-3 \
        --critic-learning-rate 1e-3 --min-response-tokens 1 --termination-condition fixed --ngram 3 --seed 7 \
        --quiet --threads 2 --output "$tmp/$1" 2> "$tmp/$1.err"
}
ppo ppo
lines=$(grep -c '"train/score"' "$tmp/ppo/metrics.jsonl" 2>/dev/null)
[ "$lines" = 3 ] && [ -f "$tmp/ppo/final/actor/model.safetensors" ] && grep -q '"gemma2"' "$tmp/ppo/final/actor/config.json" &&
    pass gemma2_ppo_runs || fail gemma2_ppo_runs "$lines iterations: $(tail -n 3 "$tmp/ppo.err")"
ppo ppo_again
cmp -s "$tmp/ppo/final/actor/model.safetensors" "$tmp/ppo_again/final/actor/model.safetensors" &&
    cmp -s "$tmp/ppo/final/critic/model.safetensors" "$tmp/ppo_again/final/critic/model.safetensors" &&
    pass gemma2_ppo_reproducible || fail gemma2_ppo_reproducible "two runs of seed 7 differ"

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
