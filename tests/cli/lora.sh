#!/usr/bin/env bash
# LoRA end to end on the tiny model (tests/fixtures/models/tiny_chat): SFT, RM and PPO
# with adapters learn and save the merged model plus a PEFT adapter folder; optimizer state
# covers the adapters only; resume after SIGKILL is bit-identical; a checkpoint is refused
# on other base weights or another rank; PPO's reference shared with the actor's base
# equals a separately loaded reference. Prints PASS/FAIL per case.
set -u
cd "$(dirname "$0")/../.."
bin=${MARLHF_BIN:-build/marlhf}
tmp=${MARLHF_TEST_TMP:-/tmp}/cli_lora
rm -rf "$tmp" && mkdir -p "$tmp"
model=tests/fixtures/models/tiny_chat
data=tests/fixtures/train
failures=0
. tests/cli_helpers.sh
file_size() { stat -c %s "$1" 2> /dev/null || echo 0; }

sft=(--model "$model" --data "$data/sft.jsonl" --eval-data "$data/sft_eval.jsonl" --max-seq-len 32
     --per-device-train-batch-size 4 --gradient-accumulation-steps 2 --num-train-epochs 4 --threads 2 --quiet)

# --- SFT with adapters ------------------------------------------------------------------
"$bin" sft "${sft[@]}" --learning-rate 1e-2 --lora-rank 8 --lora-alpha 16 --output "$tmp/sft" --eval-every 6 2> "$tmp/sft.err"
rc=$?
final=$tmp/sft/final
[ $rc -eq 0 ] && [ -f "$final/model.safetensors" ] && [ -f "$final/adapter/adapter_model.safetensors" ] &&
    [ -f "$final/adapter/adapter_config.json" ] && [ ! -f "$final/adapter_config.json" ] && pass sft_lora_saves_merged_and_adapter ||
    fail sft_lora_saves_merged_and_adapter "exit $rc: $(tail -n 2 "$tmp/sft.err")"
losses=$(json_values "$tmp/sft/metrics.jsonl" eval/loss)
python3 -c "import sys; v=list(map(float, sys.argv[1].split())); sys.exit(0 if v[-1] < 0.95 * v[0] else 1)" "$losses" 2> /dev/null &&
    pass "sft_lora_learns (eval loss $losses)" || fail sft_lora_learns "eval losses $losses"
python3 - "$final/adapter/adapter_config.json" << 'EOF' && pass sft_lora_adapter_config || fail sft_lora_adapter_config "$(cat "$final/adapter/adapter_config.json")"
import json, sys
c = json.load(open(sys.argv[1]))
assert c["peft_type"] == "LORA" and c["r"] == 8 and c["lora_alpha"] == 16 and c["task_type"] == "CAUSAL_LM"
assert sorted(c["target_modules"]) == sorted(["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
EOF
# The merged weights are a plain model every command loads, the base's size.
echo '{"ids": [1, 5, 9, 14, 2]}' > "$tmp/ids.jsonl"
"$bin" logprobs --model "$final" --input "$tmp/ids.jsonl" > "$tmp/merged.jsonl" 2> "$tmp/logprobs.err" &&
    [ "$(file_size "$final/model.safetensors")" -le "$(($(file_size "$model/model.safetensors") + 4096))" ] &&
    pass sft_lora_merged_model_loads || fail sft_lora_merged_model_loads "$(tail -n 1 "$tmp/logprobs.err")"
"$bin" logprobs --model "$model" --input "$tmp/ids.jsonl" > "$tmp/base.jsonl" 2> /dev/null
cmp -s "$tmp/merged.jsonl" "$tmp/base.jsonl" && fail sft_lora_changed_the_model "merged log-probs equal the base's" ||
    pass sft_lora_changed_the_model
# AdamW moments for the adapters only: a small fraction of full fine-tuning's.
"$bin" sft "${sft[@]}" --learning-rate 3e-3 --max-steps 2 --output "$tmp/full" 2> /dev/null
lora_state=$(file_size "$(ls -d "$tmp"/sft/checkpoint-*/ | tail -n 1)optimizer.safetensors")
full_state=$(file_size "$(ls -d "$tmp"/full/checkpoint-*/ | tail -n 1)optimizer.safetensors")
[ "$lora_state" -gt 0 ] && [ $((lora_state * 4)) -lt "$full_state" ] &&
    pass "sft_lora_optimizer_state_small ($lora_state vs $full_state bytes)" ||
    fail sft_lora_optimizer_state_small "$lora_state vs $full_state bytes"

# --- a saved adapter applied to its base: --lora-adapter ------------------------------------
"$bin" logprobs --model "$model" --lora-adapter "$final" --input "$tmp/ids.jsonl" > "$tmp/adapter.jsonl" 2> "$tmp/adapter.err"
python3 - "$tmp/merged.jsonl" "$tmp/adapter.jsonl" << 'EOF' && pass logprobs_lora_adapter_equals_merged || fail logprobs_lora_adapter_equals_merged "$(cat "$tmp/adapter.err")"
import json, sys
a, b = (json.loads(open(p).readline())["logprobs"] for p in sys.argv[1:])
assert len(a) == len(b) == 4 and max(abs(x - y) for x, y in zip(a, b)) < 1e-5, (a, b)
EOF
"$bin" generate --model "$model" --lora-adapter "$final" --input "$data/sft_eval.jsonl" --max-new-tokens 4 \
    --temperature 0 --output "$tmp/generated.jsonl" 2> "$tmp/generate.err" && [ -s "$tmp/generated.jsonl" ] &&
    pass generate_lora_adapter || fail generate_lora_adapter "$(tail -n 1 "$tmp/generate.err")"
# PEFT's own adapter folder (tools/make_lora_fixtures.py) on the tiny Llama.
"$bin" logprobs --model tests/fixtures/models/llama --lora-adapter tests/fixtures/models/llama/lora --input "$tmp/ids.jsonl" \
    > /dev/null 2> "$tmp/peft.err" && pass logprobs_peft_adapter || fail logprobs_peft_adapter "$(cat "$tmp/peft.err")"
expect_error lora_adapter_other_base "other base weights" "$bin" logprobs --model "$final" --lora-adapter "$final" --input "$tmp/ids.jsonl"
expect_error lora_adapter_missing "no LoRA adapter in $tmp/nothere" "$bin" logprobs --model "$model" --lora-adapter "$tmp/nothere" --input "$tmp/ids.jsonl"
# Damaged adapter folders: one-line errors naming the file, exit 2.
bad_adapter() { # bad_adapter NAME EXPECTED CONFIG_JSON: a copy of the saved adapter with this adapter_config.json
    mkdir -p "$tmp/bad_$1"
    cp "$final/adapter/adapter_model.safetensors" "$tmp/bad_$1/"
    printf '%s' "$3" > "$tmp/bad_$1/adapter_config.json"
    expect_error "lora_adapter_$1" "$2" "$bin" logprobs --model "$model" --lora-adapter "$tmp/bad_$1" --input "$tmp/ids.jsonl"
}
good='"peft_type": "LORA", "r": 8, "lora_alpha": 16'
all='"target_modules": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]'
bad_adapter malformed_json "adapter_config.json:1" '{"peft_type": "LORA", "r": 8,'
bad_adapter not_lora "not a LoRA adapter" "{\"peft_type\": \"PROMPT_TUNING\", \"r\": 8, \"lora_alpha\": 16, $all}"
bad_adapter zero_rank "needs \"r\"" "{\"peft_type\": \"LORA\", \"r\": 0, \"lora_alpha\": 16, $all}"
bad_adapter dora_without_magnitudes "lora_magnitude_vector" "{$good, \"use_dora\": true, $all}"
bad_adapter dora_not_boolean "\"use_dora\" must be true or false" "{$good, \"use_dora\": \"yes\", $all}"
bad_adapter rank_pattern_zero "rank_pattern: the rank of 'q_proj' must be a whole number" "{$good, \"rank_pattern\": {\"q_proj\": 0}, $all}"
bad_adapter rank_pattern_not_object "\"rank_pattern\" must be an object" "{$good, \"rank_pattern\": [4], $all}"
bad_adapter alpha_pattern_bad_regex "alpha_pattern key 'q_(' is not a regular expression" "{$good, \"alpha_pattern\": {\"q_(\": 4}, $all}"
bad_adapter rank_pattern_other_shape "but the model expects [4, 64]" "{$good, \"rank_pattern\": {\"q_proj\": 4}, $all}"
bad_adapter regex_lm_head "matches lm_head, which marlhf does not adapt" "{$good, \"target_modules\": \".*\"}"
bad_adapter regex_nothing "matches none of the model's modules" "{$good, \"target_modules\": \"q_proj\"}"
bad_adapter regex_and_layers "layers_to_transform cannot be used with a target_modules regex" \
    "{$good, \"target_modules\": \".*_proj\", \"layers_to_transform\": [0]}"
bad_adapter layers_not_index "\"layers_to_transform\" must be a layer index" "{$good, $all, \"layers_to_transform\": [\"0\"]}"
bad_adapter layers_pattern "\"layers_pattern\" must be \"layers\"" "{$good, $all, \"layers_to_transform\": [0], \"layers_pattern\": \"h\"}"
bad_adapter layers_beyond_model "names layer 7; the model has 2 layers" "{$good, $all, \"layers_to_transform\": [0, 7]}"
bad_adapter unknown_module "c_attn" "{$good, \"target_modules\": [\"q_proj\", \"c_attn\"]}"
bad_adapter other_rank "but the model expects [4, 64]" "{\"peft_type\": \"LORA\", \"r\": 4, \"lora_alpha\": 16, $all}"
mkdir -p "$tmp/bad_truncated" && cp "$final/adapter/adapter_config.json" "$tmp/bad_truncated/"
head -c 3000 "$final/adapter/adapter_model.safetensors" > "$tmp/bad_truncated/adapter_model.safetensors"
expect_error lora_adapter_truncated_weights "bad_truncated/adapter_model.safetensors" \
    "$bin" logprobs --model "$model" --lora-adapter "$tmp/bad_truncated" --input "$tmp/ids.jsonl"

# Per-module ranks and alphas (--lora-rank-pattern, --lora-alpha-pattern: PEFT's rank_pattern
# and alpha_pattern, KEY=VALUE or a JSON object): each module's A and B have the rank its
# first matching key gives it, the adapter_config.json says so (PEFT reads it back:
# tools/check_lora_export.py), the adapter on the base computes the merged model, and a run
# cut back to a checkpoint resumes to the same adapter.
pattern=(--lora-rank 4 --lora-rank-pattern 'q_proj=8,layers\.1\.mlp\.(up|down)_proj=2'
         --lora-alpha-pattern '{"v_proj": 16, "o_proj": 2.5}')
"$bin" sft "${sft[@]}" --learning-rate 1e-2 "${pattern[@]}" --max-steps 4 --save-every 2 --keep-last 0 \
    --output "$tmp/pattern" 2> "$tmp/pattern.err"
"$bin" logprobs --model "$tmp/pattern/final" --input "$tmp/ids.jsonl" > "$tmp/pattern_merged.jsonl" 2> /dev/null
"$bin" logprobs --model "$model" --lora-adapter "$tmp/pattern/final" --input "$tmp/ids.jsonl" \
    > "$tmp/pattern_adapter.jsonl" 2> "$tmp/pattern_adapter.err"
python3 - "$tmp/pattern/final/adapter" "$tmp/pattern_merged.jsonl" "$tmp/pattern_adapter.jsonl" << 'PY' &&
import json, struct, sys
folder, merged, adapter = sys.argv[1:]
c = json.load(open(folder + "/adapter_config.json"))
assert c["r"] == 4 and c["rank_pattern"] == {"q_proj": 8, "layers\\.1\\.mlp\\.(up|down)_proj": 2}, c
assert c["alpha_pattern"] == {"v_proj": 16, "o_proj": 2.5}, c
with open(folder + "/adapter_model.safetensors", "rb") as f:
    header = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
def rank(layer, module):
    return header[f"base_model.model.model.layers.{layer}.{module}.lora_A.weight"]["shape"][0]
want = {(0, "self_attn.q_proj"): 8, (1, "self_attn.q_proj"): 8, (1, "mlp.up_proj"): 2, (1, "mlp.down_proj"): 2,
        (0, "mlp.down_proj"): 4, (1, "self_attn.v_proj"): 4, (0, "mlp.gate_proj"): 4}
assert all(rank(l, m) == r for (l, m), r in want.items()), {k: rank(*k) for k in want}
a, b = (json.loads(open(p).readline())["logprobs"] for p in (merged, adapter))
assert len(a) == len(b) > 0 and max(abs(x - y) for x, y in zip(a, b)) < 1e-5, (a, b)
PY
    pass lora_patterns_saved_and_applied ||
    fail lora_patterns_saved_and_applied "$(tail -n 2 "$tmp/pattern.err") $(tail -n 1 "$tmp/pattern_adapter.err")"
mkdir -p "$tmp/pattern_cut" && cp -r "$tmp/pattern/." "$tmp/pattern_cut/" &&
    rm -rf "$tmp/pattern_cut/final" "$tmp/pattern_cut/checkpoint-4"
"$bin" sft "${sft[@]}" --learning-rate 1e-2 "${pattern[@]}" --max-steps 4 --save-every 2 --keep-last 0 \
    --output "$tmp/pattern_cut" --resume 2> "$tmp/pattern_cut.err"
cmp -s "$tmp/pattern/final/adapter/adapter_model.safetensors" "$tmp/pattern_cut/final/adapter/adapter_model.safetensors" &&
    pass lora_patterns_resume_bit_identical || fail lora_patterns_resume_bit_identical "$(tail -n 2 "$tmp/pattern_cut.err")"
# Without the alpha pattern the same ranks train otherwise (the per-module scales are used).
"$bin" sft "${sft[@]}" --learning-rate 1e-2 --lora-rank 4 --lora-rank-pattern 'q_proj=8,layers\.1\.mlp\.(up|down)_proj=2' \
    --max-steps 4 --output "$tmp/pattern_no_alpha" 2> /dev/null
[ -f "$tmp/pattern_no_alpha/final/model.safetensors" ] &&
    ! cmp -s "$tmp/pattern/final/model.safetensors" "$tmp/pattern_no_alpha/final/model.safetensors" &&
    pass lora_alpha_pattern_matters || fail lora_alpha_pattern_matters "same weights"
expect_error lora_pattern_resume_other "per-module ranks and alphas" "$bin" sft "${sft[@]}" --learning-rate 1e-2 \
    --lora-rank 4 --lora-rank-pattern 'q_proj=8' --max-steps 4 --save-every 2 --output "$tmp/pattern_cut" --resume
expect_error lora_pattern_needs_rank "--lora-rank-pattern needs --lora-rank" "$bin" sft "${sft[@]}" \
    --lora-rank-pattern 'q_proj=8' --output "$tmp/x"
expect_error lora_pattern_syntax "option --lora-rank-pattern: 'q_proj' is not KEY=VALUE" "$bin" sft "${sft[@]}" \
    --lora-rank 4 --lora-rank-pattern 'q_proj' --output "$tmp/x"
expect_error lora_pattern_not_number "'eight' is not a number" "$bin" sft "${sft[@]}" --lora-rank 4 \
    --lora-rank-pattern 'q_proj=eight' --output "$tmp/x"
expect_error lora_pattern_fraction "the rank of 'q_proj' must be a whole number" "$bin" sft "${sft[@]}" --lora-rank 4 \
    --lora-rank-pattern 'q_proj=2.5' --output "$tmp/x"
expect_error lora_alpha_pattern_negative "the alpha of 'v_proj' must be positive" "$bin" sft "${sft[@]}" --lora-rank 4 \
    --lora-alpha-pattern 'v_proj=-1' --output "$tmp/x"
expect_error lora_pattern_bad_regex "key 'q_(' is not a regular expression" "$bin" sft "${sft[@]}" --lora-rank 4 \
    --lora-rank-pattern 'q_(=3' --output "$tmp/x"
expect_error lora_pattern_with_adapter "--lora-rank-pattern and --lora-alpha-pattern" "$bin" sft "${sft[@]}" \
    --lora-adapter "$tmp/pattern/final" --lora-rank-pattern 'q_proj=8' --output "$tmp/x"
expect_error ppo_actor_pattern_needs_rank "--actor-lora-rank-pattern needs --actor-lora-rank" "$bin" ppo \
    --actor-model "$model" --reward-model "$model" --prompts "$data/sft.jsonl" --output "$tmp/x" \
    --actor-lora-rank-pattern 'q_proj=2'
[ ! -e "$tmp/x" ] && pass lora_pattern_refusals_write_nothing || fail lora_pattern_refusals_write_nothing "$tmp/x exists"

# PEFT's narrower module choices: --lora-layers (layers_to_transform) and --lora-modules-regex
# (target_modules as one regex, re.fullmatch on the whole name). The adapter folder holds
# exactly the chosen modules and says how they were chosen (PEFT reads it back to the merged
# model's logits: tools/check_lora_export.py), and the adapter on the base computes the
# merged model. tests/test_model.c checks PEFT's own folders of both kinds.
for selection in layers regex; do
    if [ $selection = layers ]; then choose=(--lora-layers 1); else choose=(--lora-modules-regex 'model\.layers\.0\.self_attn\.(q|v)_proj|.*\.down_proj'); fi
    "$bin" sft "${sft[@]}" --learning-rate 1e-2 --lora-rank 4 "${choose[@]}" --max-steps 2 --output "$tmp/select_$selection" \
        2> "$tmp/select_$selection.err"
    "$bin" logprobs --model "$tmp/select_$selection/final" --input "$tmp/ids.jsonl" > "$tmp/select_${selection}_merged.jsonl" 2> /dev/null
    "$bin" logprobs --model "$model" --lora-adapter "$tmp/select_$selection/final" --input "$tmp/ids.jsonl" \
        > "$tmp/select_${selection}_adapter.jsonl" 2>> "$tmp/select_$selection.err"
    python3 - $selection "$tmp/select_$selection/final/adapter" "$tmp/select_${selection}_merged.jsonl" \
        "$tmp/select_${selection}_adapter.jsonl" "$tmp/base.jsonl" << 'EOF' && pass "sft_lora_$selection" || fail "sft_lora_$selection" "$(tail -n 2 "$tmp/select_$selection.err")"
import json, struct, sys
selection, folder = sys.argv[1:3]
config = json.load(open(folder + "/adapter_config.json"))
with open(folder + "/adapter_model.safetensors", "rb") as f:
    names = sorted(k for k in json.loads(f.read(struct.unpack("<Q", f.read(8))[0])) if k != "__metadata__")
modules = sorted({n.rsplit(".lora_", 1)[0].replace("base_model.model.", "") for n in names})
paths = ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"]
if selection == "layers":
    assert config["layers_to_transform"] == [1] and len(config["target_modules"]) == 7, config
    want = sorted(f"model.layers.1.{p}" for p in paths)
else:
    assert config["target_modules"] == r"model\.layers\.0\.self_attn\.(q|v)_proj|.*\.down_proj", config
    assert config["layers_to_transform"] is None, config
    want = sorted(["model.layers.0.self_attn.q_proj", "model.layers.0.self_attn.v_proj", "model.layers.0.mlp.down_proj",
                   "model.layers.1.mlp.down_proj"])
assert modules == want, (modules, want)
merged, adapter, base = (json.loads(open(p).readline())["logprobs"] for p in sys.argv[3:])
assert max(abs(x - y) for x, y in zip(merged, adapter)) < 1e-5, (merged, adapter)
assert merged != base, "the adapters changed nothing"
EOF
done
expect_error lora_layers_malformed "option --lora-layers must be layer indices and ranges" \
    "$bin" sft "${sft[@]}" --lora-rank 4 --lora-layers 1-x --output "$tmp/x"
expect_error lora_layers_beyond_model "names layer 9; the model has 2 layers" \
    "$bin" sft "${sft[@]}" --lora-rank 4 --lora-layers 0,9 --output "$tmp/x"
expect_error lora_regex_with_modules "option --lora-modules-regex chooses the modules itself" \
    "$bin" sft "${sft[@]}" --lora-rank 4 --lora-modules q_proj --lora-modules-regex '.*q_proj' --output "$tmp/x"
expect_error lora_regex_and_layers "option --lora-modules-regex: layers_to_transform cannot be used" \
    "$bin" sft "${sft[@]}" --lora-rank 4 --lora-layers 0 --lora-modules-regex '.*q_proj' --output "$tmp/x"
expect_error lora_regex_bad "is not a regular expression" \
    "$bin" sft "${sft[@]}" --lora-rank 4 --lora-modules-regex 'q_(' --output "$tmp/x"
expect_error lora_layers_needs_rank "option --lora-layers needs --lora-rank" \
    "$bin" sft "${sft[@]}" --lora-layers 0 --output "$tmp/x"
expect_error ppo_actor_layers_beyond_model "names layer 5" "$bin" ppo --actor-model "$model" --reward-model "$model" \
    --prompts "$data/sft.jsonl" --output "$tmp/x" --actor-lora-rank 4 --actor-lora-layers 5
[ ! -e "$tmp/x" ] && pass lora_selection_refusals_write_nothing || fail lora_selection_refusals_write_nothing "$tmp/x exists"

# rsLoRA (--lora-rslora: scale alpha / sqrt(rank)): the adapter says so, applied to the base it
# computes what the merged model does, and it trains otherwise than alpha / rank; PEFT's own
# rsLoRA folder loads.
"$bin" sft "${sft[@]}" --learning-rate 1e-2 --lora-rank 8 --lora-alpha 16 --max-steps 2 --output "$tmp/plain2" 2> /dev/null
"$bin" sft "${sft[@]}" --learning-rate 1e-2 --lora-rank 8 --lora-alpha 16 --lora-rslora --max-steps 2 \
    --output "$tmp/rslora" 2> "$tmp/rslora.err"
"$bin" logprobs --model "$tmp/rslora/final" --input "$tmp/ids.jsonl" > "$tmp/rslora_merged.jsonl" 2> /dev/null
"$bin" logprobs --model "$model" --lora-adapter "$tmp/rslora/final" --input "$tmp/ids.jsonl" > "$tmp/rslora_adapter.jsonl" \
    2> "$tmp/rslora_adapter.err"
python3 - "$tmp/rslora/final/adapter/adapter_config.json" "$tmp/rslora_merged.jsonl" "$tmp/rslora_adapter.jsonl" << 'EOF' &&
import json, sys
assert json.load(open(sys.argv[1]))["use_rslora"] is True
a, b = (json.loads(open(p).readline())["logprobs"] for p in sys.argv[2:])
assert len(a) == len(b) == 4 and max(abs(x - y) for x, y in zip(a, b)) < 1e-5, (a, b)
EOF
    ! cmp -s "$tmp/rslora/final/model.safetensors" "$tmp/plain2/final/model.safetensors" && pass sft_rslora ||
    fail sft_rslora "$(tail -n 2 "$tmp/rslora.err") $(tail -n 1 "$tmp/rslora_adapter.err")"
"$bin" logprobs --model tests/fixtures/models/llama --lora-adapter tests/fixtures/models/llama/lora_rslora \
    --input "$tmp/ids.jsonl" > /dev/null 2> "$tmp/peft_rslora.err" && pass logprobs_peft_rslora_adapter ||
    fail logprobs_peft_rslora_adapter "$(cat "$tmp/peft_rslora.err")"
expect_error lora_rslora_with_adapter "drop --lora-rank" "$bin" sft "${sft[@]}" --lora-adapter "$final" --lora-rslora \
    --output "$tmp/x"
expect_error lora_rslora_without_rank "--lora-rslora needs --lora-rank" "$bin" sft "${sft[@]}" --lora-rslora --output "$tmp/x"
expect_error lora_adapter_with_rank "drop --lora-rank" "$bin" sft "${sft[@]}" --lora-adapter "$final" --lora-rank 4 --output "$tmp/x"
# Training continues from the adapter: its first eval loss is the saved model's, not the base's.
"$bin" sft "${sft[@]}" --learning-rate 1e-2 --lora-adapter "$final" --max-steps 2 --output "$tmp/continued" 2> "$tmp/continued.err"
continued=$(json_values "$tmp/continued/metrics.jsonl" eval/loss | cut -d' ' -f1)
fresh=$(json_values "$tmp/sft/metrics.jsonl" eval/loss | cut -d' ' -f1)
python3 -c "import sys; sys.exit(0 if float(sys.argv[1]) < float(sys.argv[2]) - 0.1 else 1)" "$continued" "$fresh" 2> /dev/null &&
    pass "sft_continues_from_adapter (first eval loss $continued, fresh $fresh)" ||
    fail sft_continues_from_adapter "$continued vs $fresh: $(tail -n 2 "$tmp/continued.err")"

# --- DoRA (--use-dora, PEFT's use_dora) --------------------------------------------------
# It learns; the adapter says use_dora and holds a magnitude vector per module; applied to the
# base it computes what the merged model does; PEFT's own DoRA folder loads; a kill and resume
# and gradient checkpointing are bit-identical; it trains otherwise than plain LoRA; a resume
# without --use-dora is refused; dpo, kto and rm carry it (ppo below).
"$bin" sft "${sft[@]}" --learning-rate 1e-2 --lora-rank 8 --lora-alpha 16 --use-dora --eval-every 6 \
    --output "$tmp/dora" 2> "$tmp/dora.err"
rc=$?
losses=$(json_values "$tmp/dora/metrics.jsonl" eval/loss)
[ $rc -eq 0 ] && python3 -c "import sys; v=list(map(float, sys.argv[1].split())); sys.exit(0 if v[-1] < 0.95 * v[0] else 1)" \
    "$losses" 2> /dev/null && pass "sft_dora_learns (eval loss $losses)" ||
    fail sft_dora_learns "exit $rc, eval losses $losses: $(tail -n 2 "$tmp/dora.err")"
"$bin" logprobs --model "$tmp/dora/final" --input "$tmp/ids.jsonl" > "$tmp/dora_merged.jsonl" 2> /dev/null
"$bin" logprobs --model "$model" --lora-adapter "$tmp/dora/final" --input "$tmp/ids.jsonl" > "$tmp/dora_adapter.jsonl" \
    2> "$tmp/dora_adapter.err"
python3 - "$tmp/dora/final/adapter" "$tmp/dora_merged.jsonl" "$tmp/dora_adapter.jsonl" "$tmp/merged.jsonl" << 'EOF' &&
import json, struct, sys
config = json.load(open(sys.argv[1] + "/adapter_config.json"))
assert config["use_dora"] is True and config["r"] == 8, config
with open(sys.argv[1] + "/adapter_model.safetensors", "rb") as f:
    header = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
magnitudes = [k for k in header if k.endswith(".lora_magnitude_vector")]
assert len(magnitudes) == 7 * int(json.load(open(sys.argv[1] + "/../config.json"))["num_hidden_layers"]), magnitudes
assert all(len(header[k]["shape"]) == 1 for k in magnitudes), header
a, b, lora = (json.loads(open(p).readline())["logprobs"] for p in sys.argv[2:])
assert len(a) == len(b) == 4 and max(abs(x - y) for x, y in zip(a, b)) < 1e-5, (a, b)
assert max(abs(x - y) for x, y in zip(a, lora)) > 1e-4, (a, lora)
EOF
    pass sft_dora_adapter_equals_merged || fail sft_dora_adapter_equals_merged "$(tail -n 1 "$tmp/dora_adapter.err")"
# Greedy generation with the adapter applied unmerged (the KV cache's decode steps keep the
# prefill's weight norms) writes what the merged model writes.
"$bin" generate --model "$model" --lora-adapter "$tmp/dora/final" --input "$data/sft_eval.jsonl" --max-new-tokens 8 \
    --min-new-tokens 8 --temperature 0 --output "$tmp/dora_generated.jsonl" 2> "$tmp/dora_generate.err"
"$bin" generate --model "$tmp/dora/final" --input "$data/sft_eval.jsonl" --max-new-tokens 8 --min-new-tokens 8 \
    --temperature 0 --output "$tmp/dora_merged_generated.jsonl" 2> /dev/null
python3 - "$tmp/dora_generated.jsonl" "$tmp/dora_merged_generated.jsonl" << 'EOF' &&
import json, sys
a, b = ([json.loads(line) for line in open(p)] for p in sys.argv[1:])
assert len(a) == len(b) > 0 and all(len(x["ids"]) == 8 and x["ids"] == y["ids"] for x, y in zip(a, b)), (a, b)
assert max(abs(p - q) for x, y in zip(a, b) for p, q in zip(x["logprobs"], y["logprobs"])) < 1e-4
EOF
    pass generate_dora_adapter_equals_merged || fail generate_dora_adapter_equals_merged "$(tail -n 1 "$tmp/dora_generate.err")"
"$bin" logprobs --model tests/fixtures/models/llama --lora-adapter tests/fixtures/models/llama/dora --input "$tmp/ids.jsonl" \
    > /dev/null 2> "$tmp/peft_dora.err" && pass logprobs_peft_dora_adapter || fail logprobs_peft_dora_adapter "$(cat "$tmp/peft_dora.err")"
dora_long=("${sft[@]}" --learning-rate 1e-2 --lora-rank 4 --num-train-epochs "$(kill_test_epochs 16)" --save-every 1 --keep-last 2
           --eval-every 0)
"$bin" sft "${dora_long[@]}" --use-dora --output "$tmp/dora_straight" 2> /dev/null
interrupted_run "$tmp/dora_killed" "$bin" sft "${dora_long[@]}" --use-dora --output "$tmp/dora_killed"
[ "$finished_early" = 1 ] && fail sft_dora_kill_mid_run "the run finished before the kill"
cmp -s "$tmp/dora_straight/final/model.safetensors" "$tmp/dora_killed/final/model.safetensors" &&
    cmp -s "$tmp/dora_straight/final/adapter/adapter_model.safetensors" "$tmp/dora_killed/final/adapter/adapter_model.safetensors" &&
    pass sft_dora_resume_bit_identical || fail sft_dora_resume_bit_identical "$(tail -n 2 "$tmp/dora_killed.err")"
"$bin" sft "${dora_long[@]}" --use-dora --gradient-checkpointing --output "$tmp/dora_recomputed" 2> /dev/null
cmp -s "$tmp/dora_straight/final/adapter/adapter_model.safetensors" "$tmp/dora_recomputed/final/adapter/adapter_model.safetensors" &&
    pass sft_dora_gradient_checkpointing_same || fail sft_dora_gradient_checkpointing_same "adapters differ"
"$bin" sft "${dora_long[@]}" --output "$tmp/lora_straight" 2> /dev/null
[ -f "$tmp/lora_straight/final/model.safetensors" ] &&
    ! cmp -s "$tmp/dora_straight/final/model.safetensors" "$tmp/lora_straight/final/model.safetensors" &&
    pass sft_dora_trains_otherwise_than_lora || fail sft_dora_trains_otherwise_than_lora "the same model as plain LoRA"
before=$(ls -R "$tmp/dora_straight" | md5sum)
expect_error sft_dora_resume_without_dora "DoRA" "$bin" sft "${dora_long[@]}" --output "$tmp/dora_straight" --resume
[ "$(ls -R "$tmp/dora_straight" | md5sum)" = "$before" ] && pass sft_dora_refused_resume_keeps_run ||
    fail sft_dora_refused_resume_keeps_run "files changed"
"$bin" dpo --model "$model" --data "$data/pairs.jsonl" --max-seq-len 32 --threads 2 --max-steps 1 --lora-rank 4 --use-dora \
    --output "$tmp/dora_dpo" 2> "$tmp/dora_dpo.err" &&
    "$bin" kto --model "$model" --data "$data/pairs.jsonl" --max-seq-len 32 --threads 2 --max-steps 1 --lora-rank 4 \
        --use-dora --output "$tmp/dora_kto" 2> "$tmp/dora_kto.err" &&
    "$bin" rm --model "$model" --data "$data/pairs.jsonl" --max-seq-len 32 --threads 2 --max-steps 1 --lora-rank 4 \
        --use-dora --output "$tmp/dora_rm" 2> "$tmp/dora_rm.err" &&
    grep -q '"use_dora": true' "$tmp/dora_dpo/final/adapter/adapter_config.json" &&
    grep -q '"use_dora": true' "$tmp/dora_kto/final/adapter/adapter_config.json" &&
    grep -q '"use_dora": true' "$tmp/dora_rm/final/adapter/adapter_config.json" && pass dpo_kto_rm_dora ||
    fail dpo_kto_rm_dora "$(tail -n 1 "$tmp/dora_dpo.err") $(tail -n 1 "$tmp/dora_kto.err") $(tail -n 1 "$tmp/dora_rm.err")"
expect_error dora_without_rank "option --use-dora needs --lora-rank" "$bin" sft "${sft[@]}" --use-dora --output "$tmp/x"
expect_error dora_with_adapter "drop --lora-rank" "$bin" sft "${sft[@]}" --lora-adapter "$tmp/dora/final" --use-dora \
    --output "$tmp/x"
expect_error ppo_dora_without_rank "option --actor-use-dora needs --actor-lora-rank" "$bin" ppo --actor-model "$model" \
    --reward-model "$model" --prompts "$data/sft.jsonl" --output "$tmp/x" --actor-use-dora
# A DoRA adapter on a base quantized after it was added (--quantize q8_0 with --lora-adapter):
# its norms come from the dequantized weights; the log-probs move by the quantization only.
"$bin" logprobs --model "$model" --lora-adapter "$tmp/dora/final" --input "$tmp/ids.jsonl" > "$tmp/dora_f32.jsonl" 2> /dev/null
"$bin" logprobs --model "$model" --lora-adapter "$tmp/dora/final" --quantize q8_0 --input "$tmp/ids.jsonl" \
    > "$tmp/dora_q8_0.jsonl" 2> "$tmp/dora_q8_0.err"
logprobs_close "$tmp/dora_f32.jsonl" "$tmp/dora_q8_0.jsonl" 0.1 && ! cmp -s "$tmp/dora_f32.jsonl" "$tmp/dora_q8_0.jsonl" &&
    pass dora_adapter_on_quantized_base || fail dora_adapter_on_quantized_base "$(tail -n 1 "$tmp/dora_q8_0.err")"
expect_error dora_gguf_adapter_only "DoRA" "$bin" convert "$model" "$tmp/dora.gguf" --lora-adapter "$tmp/dora/final" \
    --adapter-only

# --- exact resume ---------------------------------------------------------------------
long=("${sft[@]}" --learning-rate 1e-2 --lora-rank 4 --num-train-epochs "$(kill_test_epochs 16)" --save-every 1 --keep-last 2
      --eval-every 0)
"$bin" sft "${long[@]}" --output "$tmp/straight" 2> /dev/null
interrupted_run "$tmp/killed" "$bin" sft "${long[@]}" --output "$tmp/killed"
[ "$finished_early" = 1 ] && fail sft_lora_kill_mid_run "the run finished before the kill"
cmp -s "$tmp/straight/final/model.safetensors" "$tmp/killed/final/model.safetensors" &&
    cmp -s "$tmp/straight/final/adapter/adapter_model.safetensors" "$tmp/killed/final/adapter/adapter_model.safetensors" &&
    pass sft_lora_resume_bit_identical || fail sft_lora_resume_bit_identical "$(tail -n 2 "$tmp/killed.err")"
before=$(ls -R "$tmp/straight" | md5sum)
expect_error sft_lora_resume_other_rank "--lora-rank 4, this run has 8" \
    "$bin" sft "${long[@]}" --lora-rank 8 --output "$tmp/straight" --resume
expect_error sft_lora_resume_without_lora "--lora-rank 4, this run has 0" \
    "$bin" sft "${sft[@]}" --learning-rate 1e-2 --num-train-epochs 16 --save-every 1 --output "$tmp/straight" --resume
long_other_base=("${long[@]}")
long_other_base[1]=$tmp/full/final
expect_error sft_lora_resume_other_base "other base weights" "$bin" sft "${long_other_base[@]}" --output "$tmp/straight" --resume
[ "$(ls -R "$tmp/straight" | md5sum)" = "$before" ] && pass sft_lora_refused_resume_keeps_run || fail sft_lora_refused_resume_keeps_run "files changed"

# --- LoRA dropout (--lora-dropout, PEFT's lora_dropout) ----------------------------------------
# Training with it differs from training without; the evaluation at step 0 does not (no
# dropout outside training passes); the adapter file says so; a kill and resume is
# bit-identical (the masks come from the micro-batch's place in the run); a resume with
# another dropout is refused.
"$bin" sft "${long[@]}" --lora-dropout 0.2 --eval-every 4 --output "$tmp/dropout" 2> "$tmp/dropout.err"
"$bin" sft "${long[@]}" --eval-every 4 --output "$tmp/no_dropout" 2> /dev/null
first_eval() { json_values "$1/metrics.jsonl" eval/loss | cut -d' ' -f1; }
[ -n "$(first_eval "$tmp/dropout")" ] && [ "$(first_eval "$tmp/dropout")" = "$(first_eval "$tmp/no_dropout")" ] &&
    ! cmp -s "$tmp/dropout/final/adapter/adapter_model.safetensors" "$tmp/no_dropout/final/adapter/adapter_model.safetensors" &&
    python3 -c "import json, sys; sys.exit(0 if json.load(open(sys.argv[1]))['lora_dropout'] == 0.2 else 1)" \
        "$tmp/dropout/final/adapter/adapter_config.json" 2> /dev/null &&
    pass sft_lora_dropout_trains_otherwise || fail sft_lora_dropout_trains_otherwise "$(tail -n 2 "$tmp/dropout.err")"
interrupted_run "$tmp/dropout_killed" "$bin" sft "${long[@]}" --lora-dropout 0.2 --eval-every 4 --output "$tmp/dropout_killed"
[ "$finished_early" = 1 ] && fail sft_lora_dropout_kill_mid_run "the run finished before the kill"
cmp -s "$tmp/dropout/final/adapter/adapter_model.safetensors" "$tmp/dropout_killed/final/adapter/adapter_model.safetensors" &&
    pass sft_lora_dropout_resume_bit_identical || fail sft_lora_dropout_resume_bit_identical "$(tail -n 2 "$tmp/dropout_killed.err")"
"$bin" sft "${long[@]}" --lora-dropout 0.2 --eval-every 4 --gradient-checkpointing --output "$tmp/dropout_recomputed" 2> /dev/null
cmp -s "$tmp/dropout/final/adapter/adapter_model.safetensors" "$tmp/dropout_recomputed/final/adapter/adapter_model.safetensors" &&
    pass sft_lora_dropout_gradient_checkpointing_same || fail sft_lora_dropout_gradient_checkpointing_same "adapters differ"
expect_error sft_lora_dropout_resume_other "--lora-dropout 0.2, this run has 0.1" \
    "$bin" sft "${long[@]}" --lora-dropout 0.1 --output "$tmp/dropout" --resume
# A saved adapter's lora_dropout: sft trains with it unless told otherwise (TRL's SFTTrainer
# keeps PEFT's dropout); rm, dpo and kto do not (TRL's disable_dropout=True): dpo here.
describe() { grep '^lora:' "$1" | head -n 1; }
sft_once=()
for arg in "${sft[@]}"; do [ "$arg" = --quiet ] || sft_once+=("$arg"); done
"$bin" sft "${sft_once[@]}" --lora-adapter "$tmp/dropout/final" --max-steps 1 --output "$tmp/dropout_sft" 2> "$tmp/dropout_sft.err"
"$bin" sft "${sft_once[@]}" --lora-adapter "$tmp/dropout/final" --lora-dropout 0 --max-steps 1 --output "$tmp/dropout_sft0" \
    2> "$tmp/dropout_sft0.err"
"$bin" dpo --model "$model" --data "$data/pairs.jsonl" --max-seq-len 32 --threads 2 --max-steps 1 \
    --lora-adapter "$tmp/dropout/final" --output "$tmp/dropout_dpo" 2> "$tmp/dropout_dpo.err"
describe "$tmp/dropout_sft.err" | grep -q "dropout 0.2," && ! describe "$tmp/dropout_sft0.err" | grep -q dropout &&
    describe "$tmp/dropout_dpo.err" | grep -q "rank 4" && ! describe "$tmp/dropout_dpo.err" | grep -q dropout &&
    pass lora_adapter_dropout_defaults ||
    fail lora_adapter_dropout_defaults "sft '$(describe "$tmp/dropout_sft.err")', sft 0 '$(describe "$tmp/dropout_sft0.err")', dpo '$(describe "$tmp/dropout_dpo.err")'"
bad_adapter dropout_out_of_range "\"lora_dropout\" must be a number in [0, 1)" "{$good, \"lora_dropout\": 1.5, $all}"
bad_adapter dropout_not_number "\"lora_dropout\" must be a number in [0, 1)" "{$good, \"lora_dropout\": \"0.1\", $all}"
expect_error lora_dropout_one "option --lora-dropout must be a number in [0, 1), got '1'" \
    "$bin" sft "${sft[@]}" --output "$tmp/x" --lora-rank 4 --lora-dropout 1
expect_error lora_dropout_not_number "got 'half'" "$bin" sft "${sft[@]}" --output "$tmp/x" --lora-rank 4 --lora-dropout half
expect_error lora_dropout_negative "got '-0.1'" "$bin" sft "${sft[@]}" --output "$tmp/x" --lora-rank 4 --lora-dropout -0.1
expect_error lora_dropout_without_rank "--lora-dropout needs --lora-rank" "$bin" dpo --model "$model" \
    --data "$data/pairs.jsonl" --output "$tmp/x" --lora-dropout 0.1
expect_error ppo_has_no_lora_dropout "--lora-dropout" "$bin" ppo --actor-model "$model" --reward-model "$model" \
    --prompts "$data/sft.jsonl" --output "$tmp/x" --actor-lora-rank 4 --lora-dropout 0.1

# --- bad options ------------------------------------------------------------------------
expect_error lora_bad_rank "--lora-rank" "$bin" sft "${sft[@]}" --output "$tmp/x" --lora-rank -1
expect_error lora_bad_alpha "--lora-alpha" "$bin" sft "${sft[@]}" --output "$tmp/x" --lora-rank 4 --lora-alpha -2
expect_error lora_bad_module "'c_attn'" "$bin" sft "${sft[@]}" --output "$tmp/x" --lora-rank 4 --lora-modules q_proj,c_attn
expect_error ppo_lora_bad_rank "--actor-lora-rank" "$bin" ppo --actor-model "$model" --reward-model "$model" \
    --prompts "$data/sft.jsonl" --output "$tmp/x" --actor-lora-rank -3

# --- reward model with adapters: the value head trains too --------------------------------
"$bin" rm --model "$model" --data "$data/pairs.jsonl" --eval-data "$data/pairs_eval.jsonl" --max-seq-len 32 \
    --per-device-train-batch-size 4 --learning-rate 1e-2 --num-train-epochs 4 --threads 2 --quiet --lora-rank 8 \
    --output "$tmp/rm" 2> "$tmp/rm.err"
acc=$(json_values "$tmp/rm/metrics.jsonl" eval/accuracy | awk '{print $NF}')
python3 -c "import sys; sys.exit(0 if float(sys.argv[1]) >= 0.8 else 1)" "$acc" 2> /dev/null &&
    grep -q '"score"' "$tmp/rm/final/adapter/adapter_config.json" &&
    grep -q ForSequenceClassification "$tmp/rm/final/config.json" && pass "rm_lora_learns (eval accuracy $acc)" ||
    fail rm_lora_learns "accuracy '$acc' $(tail -n 2 "$tmp/rm.err")"

# --- PPO: actor and critic adapters; the reference is the actor's frozen base -------------------
ppo_base=(--actor-model "$model" --reward-model "$tmp/rm/final" --prompts "$data/sft.jsonl" --eval-prompts "$data/sft_eval.jsonl"
          --eval-count 4 --rollout-batch-size 8 --generation-batch-size 8 --micro-batch-size 4 --max-new-tokens 10
          --max-iterations 4 --actor-learning-rate 1e-2 --critic-learning-rate 1e-2 --warmup-ratio 0 --min-response-tokens 1
          --quiet --threads 2 --termination-condition fixed --ngram 3)
ppo=("${ppo_base[@]}" --actor-lora-rank 4 --critic-lora-rank 4)
"$bin" ppo "${ppo[@]}" --output "$tmp/ppo" --enable-ema 2> "$tmp/ppo.err"
rc=$?
[ $rc -eq 0 ] && [ -f "$tmp/ppo/final/actor/adapter/adapter_model.safetensors" ] &&
    [ -f "$tmp/ppo/final/critic/adapter/adapter_model.safetensors" ] && [ -f "$tmp/ppo/final/actor_ema/adapter/adapter_config.json" ] &&
    pass ppo_lora_runs || fail ppo_lora_runs "exit $rc: $(tail -n 2 "$tmp/ppo.err")"
kl=$(json_values "$tmp/ppo/metrics.jsonl" train/kl)
python3 -c "import sys; v=list(map(float, sys.argv[1].split())); sys.exit(0 if len(v) == 4 and v[0] == 0 and v[-1] > 0 else 1)" "$kl" 2> /dev/null &&
    pass "ppo_lora_kl_from_zero ($kl)" || fail ppo_lora_kl_from_zero "KL per iteration: $kl"
"$bin" ppo "${ppo[@]}" --output "$tmp/ppo_separate_reference" --enable-ema --reference-model "$model" 2> /dev/null
[ "$(json_values "$tmp/ppo/metrics.jsonl" train/kl)" = "$(json_values "$tmp/ppo_separate_reference/metrics.jsonl" train/kl)" ] &&
    cmp -s "$tmp/ppo/final/actor/model.safetensors" "$tmp/ppo_separate_reference/final/actor/model.safetensors" &&
    pass ppo_lora_shared_reference_equals_loaded || fail ppo_lora_shared_reference_equals_loaded "KL or final actor differ"
interrupted_run "$tmp/ppo_killed" "$bin" ppo "${ppo[@]}" --max-iterations 24 --num-train-epochs 4 --save-every 1 --keep-last 2 --output "$tmp/ppo_killed"
[ "$finished_early" = 1 ] && fail ppo_lora_kill_mid_run "the run finished before the kill"
"$bin" ppo "${ppo[@]}" --max-iterations 24 --num-train-epochs 4 --output "$tmp/ppo_straight" 2> /dev/null
cmp -s "$tmp/ppo_straight/final/actor/adapter/adapter_model.safetensors" "$tmp/ppo_killed/final/actor/adapter/adapter_model.safetensors" &&
    cmp -s "$tmp/ppo_straight/final/critic/adapter/adapter_model.safetensors" "$tmp/ppo_killed/final/critic/adapter/adapter_model.safetensors" &&
    pass ppo_lora_resume_bit_identical || fail ppo_lora_resume_bit_identical "$(tail -n 2 "$tmp/ppo_killed.err")"
# Starting from a saved actor adapter: the reference carries it too, so the first KL is 0.
"$bin" ppo "${ppo_base[@]}" --actor-lora-adapter "$final" --output "$tmp/ppo_from_adapter" 2> "$tmp/ppo_from_adapter.err"
kl=$(json_values "$tmp/ppo_from_adapter/metrics.jsonl" train/kl)
python3 -c "import sys; v=list(map(float, sys.argv[1].split())); sys.exit(0 if len(v) == 4 and v[0] == 0 and v[-1] != 0 else 1)" "$kl" 2> /dev/null &&
    pass "ppo_from_actor_adapter (KL $kl)" || fail ppo_from_actor_adapter "KL $kl: $(tail -n 2 "$tmp/ppo_from_adapter.err")"
# DoRA on the actor and the critic: it runs and both adapters say use_dora.
"$bin" ppo "${ppo_base[@]}" --actor-lora-rank 4 --critic-lora-rank 4 --actor-use-dora --critic-use-dora --max-iterations 2 \
    --output "$tmp/ppo_dora" 2> "$tmp/ppo_dora.err" &&
    grep -q '"use_dora": true' "$tmp/ppo_dora/final/actor/adapter/adapter_config.json" &&
    grep -q '"use_dora": true' "$tmp/ppo_dora/final/critic/adapter/adapter_config.json" && pass ppo_dora_runs ||
    fail ppo_dora_runs "$(tail -n 2 "$tmp/ppo_dora.err")"
expect_error ppo_lora_resume_other_rank "--actor-lora-rank 4 --critic-lora-rank 4, this run has 2 and 4" \
    "$bin" ppo "${ppo[@]}" --max-iterations 24 --num-train-epochs 4 --output "$tmp/ppo_killed" --resume --actor-lora-rank 2

[ $failures -eq 0 ]
