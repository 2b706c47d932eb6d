#!/usr/bin/env bash
# marlhf kto end to end on the tiny model (tests/fixtures/models/tiny_chat): from the
# patterned pairs of tests/fixtures/train (each pair a desirable and an undesirable
# example) and from the same data as unpaired rows ({prompt, completion, label}), it learns
# to put good completions above the KL baseline and bad ones below; the first step sits at
# the reference (loss 0.5 with unit weights, baseline 0); the output is a causal LM that
# generates; a run killed twice and resumed ends bit-identical; --reference-model, the
# weights and LoRA work; bad options and data are one-line errors (exit 2). PASS/FAIL per case.
set -u
cd "$(dirname "$0")/../.."
bin=${MARLHF_BIN:-build/marlhf}
tmp=${MARLHF_TEST_TMP:-/tmp}/cli_kto
rm -rf "$tmp" && mkdir -p "$tmp"
model=tests/fixtures/models/tiny_chat
data=tests/fixtures/train
failures=0
. tests/cli_helpers.sh

args=(--model "$model" --eval-data "$data/pairs_eval.jsonl" --max-seq-len 32 --per-device-train-batch-size 4
      --learning-rate 3e-3 --num-train-epochs 2 --threads 2 --quiet)

# The training pairs as unpaired rows, chosen and rejected in turn.
python3 - "$data/pairs.jsonl" "$tmp/unpaired.jsonl" << 'PYEOF'
import json, sys
with open(sys.argv[1]) as source, open(sys.argv[2], "w") as out:
    for line in source:
        row = json.loads(line)
        for key, label in (("chosen", True), ("rejected", False)):
            out.write(json.dumps({"prompt": row["prompt"], "completion": row[key], "label": label}) + "\n")
PYEOF

# --- learns from pairs; unpaired rows of the same examples are the same run ----------------------
"$bin" kto "${args[@]}" --data "$data/pairs.jsonl" --eval-every 6 --output "$tmp/pairs" 2> "$tmp/pairs.err"
rc=$?
acc=$(json_field "$tmp/pairs/metrics.jsonl" eval/accuracy -1 2>/dev/null)
chosen=$(json_field "$tmp/pairs/metrics.jsonl" eval/chosen_reward -1 2>/dev/null)
rejected=$(json_field "$tmp/pairs/metrics.jsonl" eval/rejected_reward -1 2>/dev/null)
python3 -c "import sys; a, c, r = map(float, sys.argv[1:]); sys.exit(0 if a >= 0.9 and c > r else 1)" "$acc" "$chosen" "$rejected" 2>/dev/null &&
    [ $rc -eq 0 ] && pass "kto_learns (eval accuracy $acc, rewards $chosen / $rejected)" ||
    fail kto_learns "exit $rc, accuracy '$acc', rewards '$chosen' '$rejected' $(tail -n 2 "$tmp/pairs.err")"
for source in pairs unpaired; do
    file="$data/pairs.jsonl"
    [ "$source" = unpaired ] && file="$tmp/unpaired.jsonl"
    "$bin" kto "${args[@]}" --data "$file" --max-steps 6 --output "$tmp/short_$source" 2> "$tmp/short_$source.err"
done
cmp -s "$tmp/short_pairs/final/model.safetensors" "$tmp/short_unpaired/final/model.safetensors" &&
    pass kto_unpaired_rows_same_run || fail kto_unpaired_rows_same_run "$(tail -n 2 "$tmp/short_unpaired.err")"
first_loss=$(json_field "$tmp/pairs/metrics.jsonl" train/loss 0 2>/dev/null)
first_kl=$(json_field "$tmp/pairs/metrics.jsonl" train/kl 0 2>/dev/null)
python3 -c "import sys; sys.exit(0 if abs(float(sys.argv[1]) - 0.5) < 1e-6 and abs(float(sys.argv[2])) < 1e-6 else 1)" \
    "$first_loss" "$first_kl" 2>/dev/null && pass "kto_first_step_at_reference (loss $first_loss)" ||
    fail kto_first_step_at_reference "loss '$first_loss' kl '$first_kl'"
grep -q '"LlamaForCausalLM"' "$tmp/pairs/final/config.json" && "$bin" generate --model "$tmp/pairs/final" --max-new-tokens 4 \
    "Tell me about the cat." > "$tmp/gen.out" 2> "$tmp/gen.err" && [ -s "$tmp/gen.out" ] && pass kto_final_generates ||
    fail kto_final_generates "$(tail -n 2 "$tmp/gen.err")"

# --- weights, another reference, LoRA ---------------------------------------------------------
"$bin" kto "${args[@]}" --data "$data/pairs.jsonl" --max-steps 1 --desirable-weight 2 --undesirable-weight 0.5 \
    --output "$tmp/weights" 2> "$tmp/weights.err"
loss0=$(json_field "$tmp/weights/metrics.jsonl" train/loss 0 2>/dev/null)
# Four examples per step, two of each label: (2 x 0.5 + 0.5 x 0.5) x 2 / 4 = 0.625.
python3 -c "import sys; sys.exit(0 if abs(float(sys.argv[1]) - 0.625) < 1e-6 else 1)" "$loss0" 2>/dev/null &&
    pass "kto_weights (first loss $loss0)" || fail kto_weights "first loss '$loss0' $(tail -n 2 "$tmp/weights.err")"
"$bin" kto "${args[@]}" --data "$data/pairs.jsonl" --max-steps 2 --reference-model "$tmp/pairs/final" --output "$tmp/other_ref" \
    2> "$tmp/other_ref.err"
loss0=$(json_field "$tmp/other_ref/metrics.jsonl" train/loss 0 2>/dev/null)
python3 -c "import sys; sys.exit(0 if abs(float(sys.argv[1]) - 0.5) > 1e-3 else 1)" "$loss0" 2>/dev/null &&
    pass "kto_reference_model (first loss $loss0)" || fail kto_reference_model "first loss '$loss0' $(tail -n 2 "$tmp/other_ref.err")"
"$bin" kto "${args[@]}" --data "$data/pairs.jsonl" --lora-rank 4 --learning-rate 1e-2 --num-train-epochs 4 --eval-every 6 \
    --output "$tmp/lora" 2> "$tmp/lora.err"
acc=$(json_field "$tmp/lora/metrics.jsonl" eval/accuracy -1 2>/dev/null)
chosen=$(json_field "$tmp/lora/metrics.jsonl" eval/chosen_reward -1 2>/dev/null)
rejected=$(json_field "$tmp/lora/metrics.jsonl" eval/rejected_reward -1 2>/dev/null)
python3 -c "import sys; a, c, r = map(float, sys.argv[1:]); sys.exit(0 if a >= 0.8 and c > r else 1)" "$acc" "$chosen" "$rejected" 2>/dev/null &&
    [ -f "$tmp/lora/final/adapter/adapter_model.safetensors" ] && pass "kto_lora_learns (eval accuracy $acc)" ||
    fail kto_lora_learns "accuracy '$acc', rewards '$chosen' '$rejected' $(tail -n 2 "$tmp/lora.err")"

# --- exact resume after SIGKILL ------------------------------------------------------------
resume_args=("${args[@]}" --data "$data/pairs.jsonl" --num-train-epochs 2 --save-every 1 --keep-last 2 --eval-every 0)
"$bin" kto "${resume_args[@]}" --output "$tmp/straight" 2> /dev/null
out="$tmp/killed"
interrupted_run "$out" "$bin" kto "${resume_args[@]}" --output "$out"
[ "$finished_early" = 1 ] && fail kto_resume_kill_mid_run "the run finished before the kill"
cmp -s "$tmp/straight/final/model.safetensors" "$out/final/model.safetensors" && pass kto_resume_bit_identical ||
    fail kto_resume_bit_identical "$(tail -n 2 "$out.err")"

# --- bad options and data --------------------------------------------------------------------
expect_error kto_bad_beta "--beta" "$bin" kto --model "$model" --data "$data/pairs.jsonl" --output "$tmp/x1" --beta 0
expect_error kto_bad_desirable_weight "--desirable-weight" "$bin" kto --model "$model" --data "$data/pairs.jsonl" \
    --output "$tmp/x2" --desirable-weight -1
expect_error kto_bad_undesirable_weight "--undesirable-weight" "$bin" kto --model "$model" --data "$data/pairs.jsonl" \
    --output "$tmp/x3" --undesirable-weight nan
expect_error kto_sft_data "no labelled completion" "$bin" kto --model "$model" --data "$data/sft.jsonl" --output "$tmp/x4"
head -n 1 "$tmp/unpaired.jsonl" > "$tmp/one.jsonl"
expect_error kto_one_example "at least 2" "$bin" kto --model "$model" --data "$tmp/one.jsonl" --output "$tmp/x5"
printf '{"prompt": "p", "completion": "c", "label": "yes"}\n' > "$tmp/bad_label.jsonl"
expect_error kto_forced_unpaired_on_pairs "\"completion\"" "$bin" kto --model "$model" --data "$data/pairs.jsonl" \
    --data-format unpaired --output "$tmp/x8"
expect_error kto_bad_label "\"label\"" "$bin" kto --model "$model" --data "$tmp/bad_label.jsonl" --output "$tmp/x6"
expect_error kto_missing_reference "$tmp/nowhere" "$bin" kto --model "$model" --data "$data/pairs.jsonl" --output "$tmp/x7" \
    --reference-model "$tmp/nowhere"
[ ! -e "$tmp/x1/final" ] && [ ! -e "$tmp/x7/final" ] && pass kto_errors_write_no_model || fail kto_errors_write_no_model "a model was written"
[ "$failures" -eq 0 ]
