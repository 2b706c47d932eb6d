#!/usr/bin/env bash
# marlhf kto end to end on the tiny model (tests/fixtures/models/tiny_chat): from the
# patterned pairs of tests/fixtures/train (each pair a desirable and an undesirable
# example) and from the same data as unpaired rows ({prompt, completion, label}), it learns
# to put good completions above the KL baseline and bad ones below; the first step sits at
# the reference (loss 0.5 with unit weights, baseline 0); the output is a causal LM that
# generates; a run killed twice and resumed ends bit-identical; --reference-model, the
# weights and LoRA work; bad options and data are one-line errors (exit 2). The other two
# losses: apo-zero-unpaired and bco learn the same preference from their own starting points
# (loss 0.5 and log 2), apo-zero-unpaired scores no mismatched row (and so trains on a single
# example), bco's running reward mean survives two SIGKILLs (bit-identical resume) and under
# mpirun two ranks train what one process accumulating two micro-batches does. PASS/FAIL per case.
set -u
cd "$(dirname "$0")/../.."
bin=${MARLHF_BIN:-build/marlhf}
tmp=${MARLHF_TEST_TMP:-/tmp}/cli_kto
rm -rf "$tmp" && mkdir -p "$tmp"
model=tests/fixtures/models/tiny_chat
data=tests/fixtures/train
failures=0
. tests/cli_helpers.sh

loud_args=(--model "$model" --eval-data "$data/pairs_eval.jsonl" --max-seq-len 32 --per-device-train-batch-size 4
           --learning-rate 3e-3 --num-train-epochs 2 --threads 2)
args=("${loud_args[@]}" --quiet)

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
# Six epochs, 144 steps (three under the sanitizers, kill_test_epochs): the kill, soon after
# the checkpoint of step 1..4 (interrupted_run), lands mid-run.
resume_args=("${args[@]}" --data "$data/pairs.jsonl" --num-train-epochs "$(kill_test_epochs 6)" --save-every 1 --keep-last 2 --eval-every 0)
"$bin" kto "${resume_args[@]}" --output "$tmp/straight" 2> /dev/null
out="$tmp/killed"
interrupted_run "$out" "$bin" kto "${resume_args[@]}" --output "$out"
[ "$finished_early" = 1 ] && fail kto_resume_kill_mid_run "the run finished before the kill"
cmp -s "$tmp/straight/final/model.safetensors" "$out/final/model.safetensors" && pass kto_resume_bit_identical ||
    fail kto_resume_bit_identical "$(tail -n 2 "$out.err")"

# The reference's sums ride in the checkpoints (as dpo's): resumed from its checkpoint of step 3
# a run takes them from there, one whose checkpoint's sums do not match its rows (fingerprints
# changed here) scores them again -- the reference's mismatched rows among them, one per
# training and evaluation example, which the last line counts -- and both end as the run that
# never stopped, bit for bit.
cached_args=("${loud_args[@]}" --data "$data/pairs.jsonl" --save-every 1 --keep-last 0 --eval-every 0)
"$bin" kto "${cached_args[@]}" --quiet --output "$tmp/cached" 2> /dev/null
for case in cached stale; do
    rm -rf "$tmp/cached_$case" && mkdir -p "$tmp/cached_$case" && cp -r "$tmp/cached/checkpoint-3" "$tmp/cached_$case/"
    [ $case = stale ] && sed -i 's/"fingerprint": *"\([0-9a-f]\)/"fingerprint": "x\1/' "$tmp/cached_$case/checkpoint-3/trainer_state.json"
    "$bin" kto "${cached_args[@]}" --resume --output "$tmp/cached_$case" 2> "$tmp/cached_$case.err"
done
rows() { sed -n 's/.*(\([0-9]*\) mismatched rows scored.*/\1/p' "$1"; }
cached=$(rows "$tmp/cached_cached.err") stale=$(rows "$tmp/cached_stale.err")
examples=$(( ($(wc -l < "$data/pairs.jsonl") + $(wc -l < "$data/pairs_eval.jsonl")) * 2 ))
[ -n "$cached" ] && [ -n "$stale" ] && [ $((stale - cached)) = "$examples" ] &&
    cmp -s "$tmp/cached/final/model.safetensors" "$tmp/cached_cached/final/model.safetensors" &&
    cmp -s "$tmp/cached/final/model.safetensors" "$tmp/cached_stale/final/model.safetensors" &&
    pass kto_resume_reference_from_checkpoint ||
    fail kto_resume_reference_from_checkpoint "mismatched rows: $cached from the checkpoint, $stale recomputed (want $examples more) $(tail -n 1 "$tmp/cached_stale.err")"

# The same with --reference-model, whose sums are keyed by its weights: resumed with it, the
# checkpoint's sums serve (as many mismatched rows scored as above from the checkpoint) and the
# run ends as the one that never stopped; resumed with the policy's starting weights as the
# reference, they are not theirs and every row is scored again.
"$bin" kto "${cached_args[@]}" --reference-model "$tmp/pairs/final" --quiet --output "$tmp/cached_ref" 2> /dev/null
for case in same policy; do
    rm -rf "$tmp/cached_ref_$case" && mkdir -p "$tmp/cached_ref_$case" && cp -r "$tmp/cached_ref/checkpoint-3" "$tmp/cached_ref_$case/"
    reference=(--reference-model "$tmp/pairs/final"); [ $case = policy ] && reference=()
    "$bin" kto "${cached_args[@]}" "${reference[@]}" --resume --output "$tmp/cached_ref_$case" 2> "$tmp/cached_ref_$case.err"
done
same=$(rows "$tmp/cached_ref_same.err") policy=$(rows "$tmp/cached_ref_policy.err")
[ "$same" = "$cached" ] && [ -n "$policy" ] && [ $((policy - same)) = "$examples" ] &&
    cmp -s "$tmp/cached_ref/final/model.safetensors" "$tmp/cached_ref_same/final/model.safetensors" &&
    ! cmp -s "$tmp/cached_ref/final/model.safetensors" "$tmp/cached_ref_policy/final/model.safetensors" &&
    pass kto_resume_reference_model_from_checkpoint ||
    fail kto_resume_reference_model_from_checkpoint "mismatched rows: $same with the same reference (want $cached), $policy with the policy's (want $examples more) $(tail -n 1 "$tmp/cached_ref_same.err")"

# --padding-free (TRL's padding_free): each micro-batch's rows side by side in one row, each
# attending to itself only -- the same losses, step after step, and the same evaluation.
"$bin" kto "${args[@]}" --data "$data/pairs.jsonl" --max-steps 4 --eval-every 2 --output "$tmp/rows" 2> "$tmp/rows.err"
"$bin" kto "${args[@]}" --data "$data/pairs.jsonl" --max-steps 4 --eval-every 2 --padding-free --output "$tmp/padding_free" 2> "$tmp/padding_free.err"
same_losses "$tmp/rows" "$tmp/padding_free" 7 2> "$tmp/padding_free.cmp" &&
    pass "kto_padding_free_same_losses ($(cat "$tmp/padding_free.cmp"))" ||
    fail kto_padding_free_same_losses "$(cat "$tmp/padding_free.cmp") $(tail -n 1 "$tmp/padding_free.err")"

# --sync-ref-model (TR-DPO, TRL's KTOConfig sync_ref_model): with alpha 1 and an update after
# every step the reference is the policy as each step begins, so every log-ratio, and the KL
# baseline, is 0 and every step's loss 0.5 (without the option only the first is); resumed
# between two updates (alpha 0.5, every 2 steps), a run ends as the one that never stopped.
sync_args=("${args[@]}" --data "$data/pairs.jsonl" --sync-ref-model --eval-every 0 --num-warmup-steps 0 --max-steps 4)
"$bin" kto "${sync_args[@]}" --ref-model-mixup-alpha 1 --ref-model-sync-steps 1 --output "$tmp/sync_1" 2> "$tmp/sync_1.err"
python3 - "$(json_values "$tmp/sync_1/metrics.jsonl" train/loss)" << 'PYEOF' &&
import sys
losses = list(map(float, sys.argv[1].split()))
print(f"losses {losses}", file=sys.stderr)
sys.exit(0 if len(losses) == 4 and all(abs(x - 0.5) < 1e-6 for x in losses) else 1)
PYEOF
    pass kto_sync_ref_model_every_step || fail kto_sync_ref_model_every_step "$(tail -n 2 "$tmp/sync_1.err")"
mix_args=("${sync_args[@]}" --ref-model-mixup-alpha 0.5 --ref-model-sync-steps 2 --save-every 1 --keep-last 0)
"$bin" kto "${mix_args[@]}" --output "$tmp/sync_mix" 2> "$tmp/sync_mix.err"
rm -rf "$tmp/sync_resumed" && mkdir -p "$tmp/sync_resumed" && cp -r "$tmp/sync_mix/checkpoint-3" "$tmp/sync_resumed/"
"$bin" kto "${mix_args[@]}" --resume --output "$tmp/sync_resumed" 2> "$tmp/sync_resumed.err"
[ -d "$tmp/sync_mix/checkpoint-3/reference" ] &&
    cmp -s "$tmp/sync_mix/final/model.safetensors" "$tmp/sync_resumed/final/model.safetensors" &&
    ! cmp -s "$tmp/sync_mix/checkpoint-2/reference/model.safetensors" "$model/model.safetensors" &&
    pass kto_sync_ref_model_resume_bit_identical ||
    fail kto_sync_ref_model_resume_bit_identical "$(tail -n 2 "$tmp/sync_resumed.err")"
expect_error kto_sync_ref_model_resume_without "made with --sync-ref-model, this run has none" \
    "$bin" kto "${args[@]}" --data "$data/pairs.jsonl" --eval-every 0 --save-every 1 --max-steps 4 --resume \
    --output "$tmp/sync_resumed"

# --- apo-zero-unpaired: no KL baseline, so no mismatched rows -------------------------------
# Not --quiet: the last line counts the mismatched rows the process scored.
"$bin" kto "${loud_args[@]}" --loss apo-zero-unpaired --data "$data/pairs.jsonl" --eval-every 6 --output "$tmp/apo" \
    2> "$tmp/apo.err"
rc=$?
acc=$(json_field "$tmp/apo/metrics.jsonl" eval/accuracy -1 2>/dev/null)
chosen=$(json_field "$tmp/apo/metrics.jsonl" eval/chosen_reward -1 2>/dev/null)
rejected=$(json_field "$tmp/apo/metrics.jsonl" eval/rejected_reward -1 2>/dev/null)
first_loss=$(json_field "$tmp/apo/metrics.jsonl" train/loss 0 2>/dev/null)
last_loss=$(json_field "$tmp/apo/metrics.jsonl" eval/loss -1 2>/dev/null)
python3 -c "import sys; a, c, r, f, l = map(float, sys.argv[1:]); sys.exit(0 if a >= 0.9 and c > r and abs(f - 0.5) < 1e-6 and l < f else 1)" \
    "$acc" "$chosen" "$rejected" "$first_loss" "$last_loss" 2>/dev/null && [ $rc -eq 0 ] &&
    pass "kto_apo_zero_unpaired_learns (eval accuracy $acc, loss $first_loss -> $last_loss, rewards $chosen / $rejected)" ||
    fail kto_apo_zero_unpaired_learns "exit $rc, accuracy '$acc', loss '$first_loss' -> '$last_loss', rewards '$chosen' '$rejected' $(tail -n 2 "$tmp/apo.err")"
# The same count from a KTO run shows it counts: there, every step scores its micro-batch's rows.
"$bin" kto "${loud_args[@]}" --data "$data/pairs.jsonl" --max-steps 2 --output "$tmp/kto_counted" 2> "$tmp/kto_counted.err"
apo_rows=$(sed -n 's/.*(\([0-9]*\) mismatched rows scored.*/\1/p' "$tmp/apo.err")
kto_rows=$(sed -n 's/.*(\([0-9]*\) mismatched rows scored.*/\1/p' "$tmp/kto_counted.err")
# KTO: 96 training + 24 evaluation rows for the reference, 2 steps x 4, and 2 evaluations x 24.
if [ "$apo_rows" = 0 ] && [ "$kto_rows" = $((96 + 24 + 2 * 4 + 2 * 24)) ] &&
    ! grep -q '/kl"' "$tmp/apo/metrics.jsonl" && grep -q '"train/kl"' "$tmp/kto_counted/metrics.jsonl"; then
    pass "kto_apo_zero_unpaired_scores_no_mismatched_rows (kto: $kto_rows)"
else
    fail kto_apo_zero_unpaired_scores_no_mismatched_rows "apo '$apo_rows', kto '$kto_rows' $(grep -c '/kl"' "$tmp/apo/metrics.jsonl") lines with kl"
fi
head -n 1 "$tmp/unpaired.jsonl" > "$tmp/single.jsonl"
"$bin" kto "${args[@]}" --loss apo-zero-unpaired --data "$tmp/single.jsonl" --max-steps 2 --output "$tmp/apo_single" \
    2> "$tmp/apo_single.err" && [ -f "$tmp/apo_single/final/model.safetensors" ] && pass kto_apo_zero_unpaired_one_example ||
    fail kto_apo_zero_unpaired_one_example "$(tail -n 2 "$tmp/apo_single.err")"

# --- bco: the running reward mean delta ------------------------------------------------------
"$bin" kto "${args[@]}" --loss bco --data "$data/pairs.jsonl" --eval-every 6 --output "$tmp/bco" 2> "$tmp/bco.err"
rc=$?
acc=$(json_field "$tmp/bco/metrics.jsonl" eval/accuracy -1 2>/dev/null)
chosen=$(json_field "$tmp/bco/metrics.jsonl" eval/chosen_reward -1 2>/dev/null)
rejected=$(json_field "$tmp/bco/metrics.jsonl" eval/rejected_reward -1 2>/dev/null)
first_loss=$(json_field "$tmp/bco/metrics.jsonl" train/loss 0 2>/dev/null)
last_loss=$(json_field "$tmp/bco/metrics.jsonl" eval/loss -1 2>/dev/null)
first_delta=$(json_field "$tmp/bco/metrics.jsonl" train/delta 0 2>/dev/null)
last_delta=$(json_field "$tmp/bco/metrics.jsonl" eval/delta -1 2>/dev/null)
# At the reference every reward is 0, so is delta, and each loss is log 2; the mean then moves.
python3 -c "
import math, sys
a, c, r, f, l, d0, d = map(float, sys.argv[1:])
sys.exit(0 if a >= 0.9 and c > r and abs(f - math.log(2)) < 1e-6 and l < f and abs(d0) < 1e-6 and abs(d) > 1e-4 else 1)" \
    "$acc" "$chosen" "$rejected" "$first_loss" "$last_loss" "$first_delta" "$last_delta" 2>/dev/null && [ $rc -eq 0 ] &&
    pass "kto_bco_learns (eval accuracy $acc, loss $first_loss -> $last_loss, delta $last_delta)" ||
    fail kto_bco_learns "exit $rc, accuracy '$acc', loss '$first_loss' -> '$last_loss', delta '$first_delta' -> '$last_delta' $(tail -n 2 "$tmp/bco.err")"

bco_resume_args=("${args[@]}" --loss bco --data "$data/pairs.jsonl" --num-train-epochs "$(kill_test_epochs 6)" --save-every 1 --keep-last 2 --eval-every 0)
"$bin" kto "${bco_resume_args[@]}" --output "$tmp/bco_straight" 2> /dev/null
out="$tmp/bco_killed"
interrupted_run "$out" "$bin" kto "${bco_resume_args[@]}" --output "$out"
[ "$finished_early" = 1 ] && fail kto_bco_resume_kill_mid_run "the run finished before the kill"
# (The newest finished checkpoint: a kill can leave a checkpoint-N.tmp-PID behind.)
grep -q '"bco_reward_mean"' "$(ls -d "$out"/checkpoint-* | grep -v '\.tmp-' | sort -t- -k2 -n | tail -n 1)/trainer_state.json" &&
    cmp -s "$tmp/bco_straight/final/model.safetensors" "$out/final/model.safetensors" && pass kto_bco_resume_bit_identical ||
    fail kto_bco_resume_bit_identical "$(tail -n 2 "$out.err")"
# A BCO checkpoint carries its running mean; another loss must not resume it.
expect_error kto_resume_other_loss "--loss bco" "$bin" kto "${bco_resume_args[@]}" --loss kto --output "$out" --resume

# Under mpirun each rank's micro-batch needs the rewards of the micro-batches before it in
# the step: two ranks must train what one process accumulating two micro-batches does.
if command -v mpirun > /dev/null && ldd "$bin" 2> /dev/null | grep -q libmpi; then
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl_vader_single_copy_mechanism=none
    bco_args=(--model "$model" --loss bco --data "$data/pairs.jsonl" --eval-data "$data/pairs_eval.jsonl" --max-seq-len 32
              --per-device-train-batch-size 4 --learning-rate 3e-3 --max-steps 6 --eval-every 3 --threads 1 --quiet)
    "$bin" kto "${bco_args[@]}" --gradient-accumulation-steps 2 --output "$tmp/bco_one" 2> /dev/null
    ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0" mpirun --oversubscribe --bind-to none -np 2 \
        "$bin" kto "${bco_args[@]}" --output "$tmp/bco_two" 2> "$tmp/bco_two.err"
    values() { python3 -c "import sys, json; print(' '.join(str(json.loads(l)[k]) for l in open(sys.argv[1]) for k in sys.argv[2:] if k in json.loads(l)))" "$@"; }
    python3 -c "
import sys
a, b = sys.argv[1].split(), sys.argv[2].split()
sys.exit(0 if len(a) == len(b) == 6 * 2 + 3 * 2 and all(abs(float(x) - float(y)) <= 1e-5 * max(1.0, abs(float(x))) for x, y in zip(a, b)) else 1)" \
        "$(values "$tmp/bco_one/metrics.jsonl" train/loss train/delta eval/delta eval/loss)" \
        "$(values "$tmp/bco_two/metrics.jsonl" train/loss train/delta eval/delta eval/loss)" &&
        pass kto_bco_two_ranks_same_training || fail kto_bco_two_ranks_same_training "$(tail -n 2 "$tmp/bco_two.err")"
else
    echo "SKIP kto_bco_two_ranks_same_training: $bin is not linked with MPI or mpirun is missing"
fi

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
expect_error kto_reference_other_tokenizer "(--reference-model): the reference's log-probs are of the policy's token ids" \
    "$bin" kto --model "$model" --data "$data/pairs.jsonl" --output "$tmp/x7" --reference-model models/SmolLM2-135M-Instruct.Q4_1.gguf
expect_error kto_bad_loss "--loss" "$bin" kto --model "$model" --data "$data/pairs.jsonl" --output "$tmp/x9" \
    --loss apo_zero_unpaired
expect_error kto_bco_weights "--desirable-weight" "$bin" kto --model "$model" --data "$data/pairs.jsonl" \
    --output "$tmp/x10" --loss bco --desirable-weight 1.3
[ ! -e "$tmp/x1/final" ] && [ ! -e "$tmp/x7/final" ] && [ ! -e "$tmp/x9/final" ] && pass kto_errors_write_no_model || fail kto_errors_write_no_model "a model was written"
[ "$failures" -eq 0 ]
