#!/usr/bin/env bash
# marlhf dpo end to end on the tiny model (tests/fixtures/models/tiny_chat) and the
# patterned pairs of tests/fixtures/train: each of the 20 losses, a combination of losses
# (the MPO recipe) and WPO weighting learn the preference, the first
# step sits at the reference (loss log 2, zero margin), the output is a causal LM that
# generates, a run killed twice and resumed ends bit-identical to one that was not (the
# reference log-probs are recomputed from the starting weights), --reference-model and
# LoRA adapters work, and bad options are one-line errors (exit 2). Prints PASS/FAIL per case.
set -u
cd "$(dirname "$0")/../.."
bin=${MARLHF_BIN:-build/marlhf}
tmp=${MARLHF_TEST_TMP:-/tmp}/cli_dpo
rm -rf "$tmp" && mkdir -p "$tmp"
model=tests/fixtures/models/tiny_chat
data=tests/fixtures/train
failures=0
. tests/cli_helpers.sh

args=(--model "$model" --data "$data/pairs.jsonl" --eval-data "$data/pairs_eval.jsonl" --max-seq-len 32
      --per-device-train-batch-size 4 --learning-rate 3e-3 --num-train-epochs 2 --threads 2 --quiet)

# --- each loss learns the preference -----------------------------------------------------
for loss in sigmoid ipo hinge simpo orpo cpo sigmoid-norm robust exo nca bco sppo-hard apo-zero apo-down discopop \
    aot aot-unpaired cpo-hinge cpo-ipo alphapo; do
    extra=()
    [ "$loss" = sigmoid ] && extra=(--label-smoothing 0.1)
    [ "$loss" = robust ] && extra=(--label-smoothing 0.1)
    [ "$loss" = exo ] && extra=(--label-smoothing 1e-3)
    [ "$loss" = discopop ] && extra=(--discopop-tau 0.5)
    [ "$loss" = simpo ] && extra=(--beta 2 --simpo-gamma 1)
    [ "$loss" = alphapo ] && extra=(--beta 2 --simpo-gamma 1 --alphapo-alpha 0.25)
    [ "$loss" = aot ] && extra=(--label-smoothing 0.1)
    # CPO (and its hinge) compares the raw sums with no reference to cancel the responses'
    # lengths: after the two epochs 10 of the 12 eval pairs are right (the others: all 12).
    bar=0.9
    [ "$loss" = cpo ] || [ "$loss" = cpo-hinge ] && bar=0.8
    "$bin" dpo "${args[@]}" --loss "$loss" "${extra[@]}" --eval-every 6 --output "$tmp/$loss" 2> "$tmp/$loss.err"
    rc=$?
    acc=$(json_field "$tmp/$loss/metrics.jsonl" eval/accuracy -1 2>/dev/null)
    margin=$(json_field "$tmp/$loss/metrics.jsonl" eval/margin -1 2>/dev/null)
    python3 -c "import sys; sys.exit(0 if float(sys.argv[1]) >= float(sys.argv[3]) and float(sys.argv[2]) > 0 else 1)" \
        "$acc" "$margin" "$bar" 2>/dev/null &&
        [ $rc -eq 0 ] && pass "dpo_${loss}_learns (eval accuracy $acc, margin $margin)" ||
        fail "dpo_${loss}_learns" "exit $rc, accuracy '$acc', margin '$margin' $(tail -n 2 "$tmp/$loss.err")"
done
# f-DPO: the other divergences learn it too, and train otherwise than reverse KL (DPO), which
# alpha-divergence at alpha 1 is, bit for bit.
for divergence in reverse-kl forward-kl js alpha; do
    "$bin" dpo "${args[@]}" --f-divergence "$divergence" --eval-every 6 --output "$tmp/f_$divergence" 2> "$tmp/f_$divergence.err"
    acc=$(json_field "$tmp/f_$divergence/metrics.jsonl" eval/accuracy -1 2>/dev/null)
    margin=$(json_field "$tmp/f_$divergence/metrics.jsonl" eval/margin -1 2>/dev/null)
    python3 -c "import sys; sys.exit(0 if float(sys.argv[1]) >= 0.9 and float(sys.argv[2]) > 0 else 1)" "$acc" "$margin" 2>/dev/null &&
        pass "dpo_f_divergence_${divergence}_learns (eval accuracy $acc, margin $margin)" ||
        fail "dpo_f_divergence_${divergence}_learns" "accuracy '$acc', margin '$margin' $(tail -n 2 "$tmp/f_$divergence.err")"
done
for divergence in forward-kl js alpha; do
    cmp -s "$tmp/f_$divergence/final/model.safetensors" "$tmp/f_reverse-kl/final/model.safetensors" &&
        fail "dpo_f_divergence_${divergence}_changes_training" "the same weights as reverse KL" ||
        pass "dpo_f_divergence_${divergence}_changes_training"
done
"$bin" dpo "${args[@]}" --f-divergence alpha --f-alpha 1 --eval-every 6 --output "$tmp/f_alpha_1" 2> "$tmp/f_alpha_1.err"
cmp -s "$tmp/f_alpha_1/final/model.safetensors" "$tmp/f_reverse-kl/final/model.safetensors" &&
    pass dpo_f_alpha_1_is_reverse_kl || fail dpo_f_alpha_1_is_reverse_kl "$(tail -n 2 "$tmp/f_alpha_1.err")"
# LD-DPO (--ld-alpha): learns too; trains otherwise than plain DPO on pairs of unequal
# lengths; --ld-alpha 1 is plain DPO bit for bit.
"$bin" dpo "${args[@]}" --ld-alpha 0.5 --eval-every 6 --output "$tmp/ld" 2> "$tmp/ld.err"
acc=$(json_field "$tmp/ld/metrics.jsonl" eval/accuracy -1 2>/dev/null)
margin=$(json_field "$tmp/ld/metrics.jsonl" eval/margin -1 2>/dev/null)
python3 -c "import sys; sys.exit(0 if float(sys.argv[1]) >= 0.9 and float(sys.argv[2]) > 0 else 1)" "$acc" "$margin" 2>/dev/null &&
    ! cmp -s "$tmp/ld/final/model.safetensors" "$tmp/f_reverse-kl/final/model.safetensors" &&
    pass "dpo_ld_alpha_learns (eval accuracy $acc, margin $margin)" ||
    fail dpo_ld_alpha_learns "accuracy '$acc', margin '$margin' $(tail -n 2 "$tmp/ld.err")"
"$bin" dpo "${args[@]}" --ld-alpha 1 --eval-every 6 --output "$tmp/ld_1" 2> "$tmp/ld_1.err"
cmp -s "$tmp/ld_1/final/model.safetensors" "$tmp/f_reverse-kl/final/model.safetensors" && pass dpo_ld_alpha_1_is_dpo ||
    fail dpo_ld_alpha_1_is_dpo "$(tail -n 2 "$tmp/ld_1.err")"
# DiscoPOP with TRL's tau 0.05 has a local minimum at beta h = -0.12 and a maximum at +0.08:
# from the reference (h = 0) its gradient points down, and training settles below 0 (with
# tau above 0.1023 the slope at 0 is the right way, as in the loop above).
"$bin" dpo "${args[@]}" --loss discopop --eval-every 6 --output "$tmp/discopop_005" 2> "$tmp/discopop_005.err"
margin=$(json_field "$tmp/discopop_005/metrics.jsonl" eval/margin -1 2>/dev/null)
python3 -c "import sys; sys.exit(0 if -0.3 < float(sys.argv[1]) < 0 else 1)" "$margin" 2>/dev/null &&
    pass "dpo_discopop_tau_005_settles_below_zero (eval margin $margin)" ||
    fail dpo_discopop_tau_005_settles_below_zero "margin '$margin' $(tail -n 2 "$tmp/discopop_005.err")"
first_loss=$(json_field "$tmp/sigmoid/metrics.jsonl" train/loss 0 2>/dev/null)
first_margin=$(json_field "$tmp/sigmoid/metrics.jsonl" train/margin 0 2>/dev/null)
python3 -c "import sys, math; sys.exit(0 if abs(float(sys.argv[1]) - math.log(2)) < 1e-6 and abs(float(sys.argv[2])) < 1e-6 else 1)" \
    "$first_loss" "$first_margin" 2>/dev/null && pass "dpo_first_step_at_reference (loss $first_loss)" ||
    fail dpo_first_step_at_reference "loss '$first_loss' margin '$first_margin'"
grep -q '"LlamaForCausalLM"' "$tmp/sigmoid/final/config.json" && pass dpo_saved_as_causal_lm || fail dpo_saved_as_causal_lm "config"
"$bin" generate --model "$tmp/sigmoid/final" --max-new-tokens 4 "Tell me about the cat." > "$tmp/gen.out" 2> "$tmp/gen.err" &&
    [ -s "$tmp/gen.out" ] && pass dpo_final_generates || fail dpo_final_generates "$(tail -n 2 "$tmp/gen.err")"

# --- several losses combined (TRL's loss_type list: the MPO recipe) and WPO weighting ------
# (--use-weighting) learn it; two halves of sigmoid are sigmoid bit for bit.
for variant in mpo wpo; do
    extra=(--loss sigmoid,bco,sft --loss-weights 0.8,0.2,1.0)
    [ "$variant" = wpo ] && extra=(--use-weighting)
    "$bin" dpo "${args[@]}" "${extra[@]}" --eval-every 6 --output "$tmp/$variant" 2> "$tmp/$variant.err"
    acc=$(json_field "$tmp/$variant/metrics.jsonl" eval/accuracy -1 2>/dev/null)
    margin=$(json_field "$tmp/$variant/metrics.jsonl" eval/margin -1 2>/dev/null)
    python3 -c "import sys; sys.exit(0 if float(sys.argv[1]) >= 0.9 and float(sys.argv[2]) > 0 else 1)" "$acc" "$margin" 2>/dev/null &&
        ! cmp -s "$tmp/$variant/final/model.safetensors" "$tmp/f_reverse-kl/final/model.safetensors" &&
        pass "dpo_${variant}_learns (eval accuracy $acc, margin $margin)" ||
        fail "dpo_${variant}_learns" "accuracy '$acc', margin '$margin' $(tail -n 2 "$tmp/$variant.err")"
done
"$bin" dpo "${args[@]}" --loss sigmoid,sigmoid --loss-weights 0.5,0.5 --eval-every 6 --output "$tmp/halves" 2> "$tmp/halves.err"
cmp -s "$tmp/halves/final/model.safetensors" "$tmp/f_reverse-kl/final/model.safetensors" && pass dpo_two_halves_of_sigmoid_are_sigmoid ||
    fail dpo_two_halves_of_sigmoid_are_sigmoid "$(tail -n 2 "$tmp/halves.err")"
# A config file in TRL's spelling (lists) is the same run as the command line's commas.
printf '{"loss_type": ["sigmoid", "bco_pair", "sft"], "loss_weights": [0.8, 0.2, 1], "use_weighting": true}\n' > "$tmp/trl.json"
"$bin" dpo "${args[@]}" --max-steps 2 --config "$tmp/trl.json" --output "$tmp/trl_config" 2> "$tmp/trl_config.err"
"$bin" dpo "${args[@]}" --max-steps 2 --loss sigmoid,bco,sft --loss-weights 0.8,0.2,1 --use-weighting \
    --output "$tmp/trl_cli" 2> "$tmp/trl_cli.err"
[ -f "$tmp/trl_config/final/model.safetensors" ] &&
    cmp -s "$tmp/trl_config/final/model.safetensors" "$tmp/trl_cli/final/model.safetensors" && pass dpo_config_lists ||
    fail dpo_config_lists "$(tail -n 2 "$tmp/trl_config.err" "$tmp/trl_cli.err")"
echo '{"loss_type": ["sigmoid", {"name": "bco_pair"}]}' > "$tmp/bad_list.json"
expect_error dpo_config_list_of_objects "config key 'loss_type': a list of strings or numbers expected" \
    "$bin" dpo "${args[@]}" --config "$tmp/bad_list.json" --output "$tmp/x"

# --- a reference other than the starting weights: the first step is no longer at log 2 ---
"$bin" dpo "${args[@]}" --max-steps 2 --reference-model "$tmp/ipo/final" --output "$tmp/other_ref" 2> "$tmp/other_ref.err"
loss0=$(json_field "$tmp/other_ref/metrics.jsonl" train/loss 0 2>/dev/null)
python3 -c "import sys, math; sys.exit(0 if abs(float(sys.argv[1]) - math.log(2)) > 1e-3 else 1)" "$loss0" 2>/dev/null &&
    pass "dpo_reference_model (first loss $loss0)" || fail dpo_reference_model "first loss '$loss0' $(tail -n 2 "$tmp/other_ref.err")"

# --- LoRA: only the adapters move, the first step is at the reference --------------------
"$bin" dpo "${args[@]}" --lora-rank 4 --learning-rate 1e-2 --eval-every 6 --output "$tmp/lora" 2> "$tmp/lora.err"
acc=$(json_field "$tmp/lora/metrics.jsonl" eval/accuracy -1 2>/dev/null)
python3 -c "import sys; sys.exit(0 if float(sys.argv[1]) >= 0.9 else 1)" "$acc" 2>/dev/null &&
    [ -f "$tmp/lora/final/adapter/adapter_model.safetensors" ] && pass "dpo_lora_learns (eval accuracy $acc)" ||
    fail dpo_lora_learns "accuracy '$acc' $(tail -n 2 "$tmp/lora.err")"

# --- exact resume after SIGKILL ------------------------------------------------------------
resume_epochs=$(kill_test_epochs 8) # 12 steps each
resume_args=("${args[@]}" --num-train-epochs "$resume_epochs" --save-every 1 --keep-last 2 --eval-every 0)
"$bin" dpo "${resume_args[@]}" --output "$tmp/straight" 2> /dev/null
out="$tmp/killed"
interrupted_run "$out" "$bin" dpo "${resume_args[@]}" --output "$out"
[ "$finished_early" = 1 ] && fail dpo_resume_kill_mid_run "the run finished before the kill"
cmp -s "$tmp/straight/final/model.safetensors" "$out/final/model.safetensors" && pass dpo_resume_bit_identical ||
    fail dpo_resume_bit_identical "$(tail -n 2 "$out.err")"
lines=$(grep -c '"train/loss"' "$out/metrics.jsonl")
[ "$lines" = $((12 * resume_epochs)) ] && pass dpo_resume_metrics_continuous || fail dpo_resume_metrics_continuous "$lines lines"

# The reference's log-probs ride in the checkpoints: a run resumed from its checkpoint of step
# 3 takes them from there (the starting weights score no row) and ends as the run that never
# stopped, bit for bit; one whose checkpoint's sums do not match its rows (their fingerprint
# changed here) scores them again, to the same end.
cached_args=("${args[@]}" --num-train-epochs 2 --save-every 1 --keep-last 0 --eval-every 0)
"$bin" dpo "${cached_args[@]}" --output "$tmp/cached" 2> /dev/null
told=() # not --quiet: the run says how many rows the starting weights scored
for arg in "${cached_args[@]}"; do [ "$arg" != --quiet ] && told+=("$arg"); done
for case in cached stale; do
    rm -rf "$tmp/cached_$case" && mkdir -p "$tmp/cached_$case" && cp -r "$tmp/cached/checkpoint-3" "$tmp/cached_$case/"
    [ $case = stale ] && sed -i 's/"fingerprint": *"\([0-9a-f]\)/"fingerprint": "x\1/' "$tmp/cached_$case/checkpoint-3/trainer_state.json"
    "$bin" dpo "${told[@]}" --resume --output "$tmp/cached_$case" 2> "$tmp/cached_$case.err"
    scored=$(sed -n 's/.*starting weights scored \([0-9]*\) rows.*/\1/p' "$tmp/cached_$case.err")
    want=0; [ $case = stale ] && want=$(( $(wc -l < "$data/pairs.jsonl") * 2 + $(wc -l < "$data/pairs_eval.jsonl") * 2 ))
    [ "$scored" = "$want" ] && cmp -s "$tmp/cached/final/model.safetensors" "$tmp/cached_$case/final/model.safetensors" &&
        pass "dpo_resume_reference_$case" || fail "dpo_resume_reference_$case" "scored '$scored' (want $want) $(tail -n 2 "$tmp/cached_$case.err")"
done

# --reference-model's sums ride in the checkpoints too, keyed by the reference's weights: resumed
# with the same reference model, it scores no row and the run ends as the one that never
# stopped; resumed with the policy's own starting weights as the reference instead, the kept
# sums are not theirs, and the starting weights score every row.
"$bin" dpo "${cached_args[@]}" --reference-model "$tmp/ipo/final" --output "$tmp/cached_ref" 2> /dev/null
rows_all=$(( $(wc -l < "$data/pairs.jsonl") * 2 + $(wc -l < "$data/pairs_eval.jsonl") * 2 ))
for case in same policy; do
    rm -rf "$tmp/cached_ref_$case" && mkdir -p "$tmp/cached_ref_$case" && cp -r "$tmp/cached_ref/checkpoint-3" "$tmp/cached_ref_$case/"
    reference=(--reference-model "$tmp/ipo/final"); [ $case = policy ] && reference=()
    "$bin" dpo "${told[@]}" "${reference[@]}" --resume --output "$tmp/cached_ref_$case" 2> "$tmp/cached_ref_$case.err"
    scored=$(sed -n 's/.*\(reference model\|starting weights\) scored \([0-9]*\) rows.*/\2/p' "$tmp/cached_ref_$case.err")
    want=0; [ $case = policy ] && want=$rows_all
    same=0; cmp -s "$tmp/cached_ref/final/model.safetensors" "$tmp/cached_ref_$case/final/model.safetensors" && same=1
    [ "$scored" = "$want" ] && [ $same = $([ $case = same ] && echo 1 || echo 0) ] &&
        pass "dpo_resume_reference_model_$case (scored $scored rows)" ||
        fail "dpo_resume_reference_model_$case" "scored '$scored' (want $want), same final $same $(tail -n 2 "$tmp/cached_ref_$case.err")"
done

# --padding-free (TRL's padding_free): each micro-batch's rows side by side in one row, each
# attending to itself only -- the same losses, step after step, and the same evaluation.
"$bin" dpo "${args[@]}" --max-steps 4 --eval-every 2 --output "$tmp/rows" 2> "$tmp/rows.err"
"$bin" dpo "${args[@]}" --max-steps 4 --eval-every 2 --padding-free --output "$tmp/padding_free" 2> "$tmp/padding_free.err"
same_losses "$tmp/rows" "$tmp/padding_free" 7 2> "$tmp/padding_free.cmp" &&
    pass "dpo_padding_free_same_losses ($(cat "$tmp/padding_free.cmp"))" ||
    fail dpo_padding_free_same_losses "$(cat "$tmp/padding_free.cmp") $(tail -n 1 "$tmp/padding_free.err")"

# --- TR-DPO (--sync-ref-model, TRL's sync_ref_model) ----------------------------------------
# With --ref-model-mixup-alpha 1 and a sync after every step the reference is always the policy
# as the step begins, so every step's loss is log 2 (without: only the first); with alpha 0.5
# every 2 steps the checkpoint's reference/ is half the policy of step 2 and half the starting
# weights; a run resumed between two syncs ends as the one that never stopped, bit for bit.
# (No warmup in the first two runs: a first step at learning rate 0 would leave the policy
# where it started, and the second loss at log 2 without the option too.)
sync_args=("${args[@]}" --sync-ref-model --eval-every 0)
"$bin" dpo "${sync_args[@]}" --max-steps 4 --num-warmup-steps 0 --ref-model-mixup-alpha 1 --ref-model-sync-steps 1 \
    --output "$tmp/sync_1" 2> "$tmp/sync_1.err"
"$bin" dpo "${args[@]}" --max-steps 4 --num-warmup-steps 0 --eval-every 0 --output "$tmp/sync_none" 2> "$tmp/sync_none.err"
python3 - "$(json_values "$tmp/sync_1/metrics.jsonl" train/loss)" "$(json_values "$tmp/sync_none/metrics.jsonl" train/loss)" << 'EOF' &&
import math, sys
synced, fixed = [list(map(float, s.split())) for s in sys.argv[1:3]]
print(f"synced {synced}, fixed {fixed}", file=sys.stderr)
sys.exit(0 if len(synced) == len(fixed) == 4 and all(abs(x - math.log(2)) < 1e-6 for x in synced)
         and abs(fixed[0] - math.log(2)) < 1e-6 and all(abs(x - math.log(2)) > 1e-4 for x in fixed[1:]) else 1)
EOF
    pass dpo_sync_ref_model_every_step || fail dpo_sync_ref_model_every_step "$(tail -n 2 "$tmp/sync_1.err")"
mix_args=("${sync_args[@]}" --ref-model-mixup-alpha 0.5 --ref-model-sync-steps 2 --save-every 1 --keep-last 0)
"$bin" dpo "${mix_args[@]}" --max-steps 4 --output "$tmp/sync_mix" 2> "$tmp/sync_mix.err"
python3 - "$model/model.safetensors" "$tmp/sync_mix/checkpoint-2/model.safetensors" \
    "$tmp/sync_mix/checkpoint-2/reference/model.safetensors" "$tmp/sync_mix/checkpoint-3/reference/model.safetensors" << 'EOF' &&
import array, json, struct, sys
def tensors(path):
    with open(path, "rb") as f:
        header = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
        body = f.read()
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        begin, end = t["data_offsets"]
        raw = body[begin:end]
        if t["dtype"] == "F32":
            out[name] = array.array("f", raw)
        elif t["dtype"] == "BF16":  # widened: a bf16 is the top half of a float
            out[name] = array.array("f", b"".join(b"\0\0" + raw[i:i + 2] for i in range(0, len(raw), 2)))
    return out
start, policy, reference, later = map(tensors, sys.argv[1:5])
worst, count = 0.0, 0
for name, r in reference.items():
    want = [0.5 * a + 0.5 * b for a, b in zip(start[name], policy[name])]
    worst = max([worst] + [abs(x - y) / max(abs(y), 1e-3) for x, y in zip(r, want)])
    count += len(r)
moved = any(a != b for name in reference for a, b in zip(reference[name], start[name]))
print(f"{count} reference weights, worst relative difference {worst:.2e} from 0.5 policy + 0.5 start", file=sys.stderr)
sys.exit(0 if count > 0 and worst <= 1e-6 and moved and later == reference else 1)
EOF
    pass dpo_sync_ref_model_mix || fail dpo_sync_ref_model_mix "$(tail -n 2 "$tmp/sync_mix.err")"
rm -rf "$tmp/sync_resumed" && mkdir -p "$tmp/sync_resumed" && cp -r "$tmp/sync_mix/checkpoint-3" "$tmp/sync_resumed/"
mix_told=(); for arg in "${mix_args[@]}"; do [ "$arg" != --quiet ] && mix_told+=("$arg"); done
"$bin" dpo "${mix_told[@]}" --max-steps 4 --resume --output "$tmp/sync_resumed" 2> "$tmp/sync_resumed.err"
grep -q "scored 0 rows (the rest from the checkpoint)" "$tmp/sync_resumed.err" &&
    grep -q "the reference moved 1 times" "$tmp/sync_resumed.err" &&
    cmp -s "$tmp/sync_mix/final/model.safetensors" "$tmp/sync_resumed/final/model.safetensors" &&
    pass dpo_sync_ref_model_resume_bit_identical ||
    fail dpo_sync_ref_model_resume_bit_identical "$(grep 'dpo:' "$tmp/sync_resumed.err" | tail -n 3)"
expect_error dpo_sync_ref_model_resume_without "made with --sync-ref-model, this run has none" \
    "$bin" dpo "${args[@]}" --eval-every 0 --save-every 1 --max-steps 4 --resume --output "$tmp/sync_resumed"
rm -rf "$tmp/plain_resumed" && mkdir -p "$tmp/plain_resumed" && cp -r "$tmp/cached/checkpoint-3" "$tmp/plain_resumed/"
expect_error dpo_sync_ref_model_resume_plain "made without --sync-ref-model" \
    "$bin" dpo "${mix_args[@]}" --resume --output "$tmp/plain_resumed"
expect_error dpo_sync_ref_model_other_alpha "--ref-model-mixup-alpha 0.5 --ref-model-sync-steps 2, this run has 0.6" \
    "$bin" dpo "${sync_args[@]}" --ref-model-sync-steps 2 --save-every 1 --keep-last 0 --max-steps 4 --resume \
    --output "$tmp/sync_resumed"
expect_error dpo_sync_ref_model_lora "not with LoRA" "$bin" dpo "${sync_args[@]}" --lora-rank 4 --output "$tmp/x1"
expect_error dpo_sync_ref_model_simpo "--loss simpo has no reference" "$bin" dpo "${sync_args[@]}" --loss simpo \
    --output "$tmp/x1"
expect_error dpo_sync_ref_model_alpha_0 "--ref-model-mixup-alpha must be in (0, 1]" "$bin" dpo "${sync_args[@]}" \
    --ref-model-mixup-alpha 0 --output "$tmp/x1"
expect_error dpo_sync_steps_without_sync "--ref-model-sync-steps applies with --sync-ref-model" "$bin" dpo "${args[@]}" \
    --ref-model-sync-steps 8 --output "$tmp/x1"

# --- bad options and data --------------------------------------------------------------------
expect_error dpo_bad_loss "--loss" "$bin" dpo --model "$model" --data "$data/pairs.jsonl" --output "$tmp/x1" --loss kto_pair
expect_error dpo_bad_beta "--beta" "$bin" dpo --model "$model" --data "$data/pairs.jsonl" --output "$tmp/x2" --beta 0
expect_error dpo_bad_smoothing "--label-smoothing" "$bin" dpo --model "$model" --data "$data/pairs.jsonl" --output "$tmp/x3" \
    --label-smoothing 0.5
expect_error dpo_smoothing_needs_sigmoid "--label-smoothing" "$bin" dpo --model "$model" --data "$data/pairs.jsonl" \
    --output "$tmp/x4" --loss ipo --label-smoothing 0.1
expect_error dpo_smoothing_not_nca "--label-smoothing applies to --loss sigmoid, robust, exo, aot, aot-unpaired, cpo, simpo and alphapo" "$bin" dpo --model "$model" \
    --data "$data/pairs.jsonl" --output "$tmp/x4" --loss nca --label-smoothing 0.1
expect_error dpo_exo_needs_smoothing "--loss exo needs it above 0" "$bin" dpo --model "$model" --data "$data/pairs.jsonl" \
    --output "$tmp/x4" --loss exo
expect_error dpo_bad_f_divergence "--f-divergence must be" "$bin" dpo --model "$model" --data "$data/pairs.jsonl" \
    --output "$tmp/x4" --f-divergence chi2
expect_error dpo_f_divergence_not_nca "--loss nca has no f-divergence form" "$bin" dpo --model "$model" \
    --data "$data/pairs.jsonl" --output "$tmp/x4" --loss nca --f-divergence js
expect_error dpo_bad_f_alpha "option --f-alpha expects a number" "$bin" dpo --model "$model" --data "$data/pairs.jsonl" \
    --output "$tmp/x4" --f-divergence alpha --f-alpha nan
expect_error dpo_bad_ld_alpha "--ld-alpha must be in (0, 1]" "$bin" dpo --model "$model" --data "$data/pairs.jsonl" \
    --output "$tmp/x4" --ld-alpha 1.5
expect_error dpo_ld_alpha_with_sft_weight "--ld-alpha" "$bin" dpo --model "$model" --data "$data/pairs.jsonl" \
    --output "$tmp/x4" --ld-alpha 0.5 --sft-weight 0.5
expect_error dpo_bad_discopop_tau "--discopop-tau" "$bin" dpo --model "$model" --data "$data/pairs.jsonl" --output "$tmp/x4" \
    --loss discopop --discopop-tau 0
expect_error dpo_loss_weights_count "--loss-weights: 1 weights for 2 losses" "$bin" dpo --model "$model" \
    --data "$data/pairs.jsonl" --output "$tmp/x4" --loss sigmoid,bco --loss-weights 1
expect_error dpo_loss_weights_negative "--loss-weights must be numbers >= 0" "$bin" dpo --model "$model" \
    --data "$data/pairs.jsonl" --output "$tmp/x4" --loss sigmoid,bco --loss-weights 1,-0.5
expect_error dpo_loss_weights_nan "--loss-weights must be numbers >= 0" "$bin" dpo --model "$model" \
    --data "$data/pairs.jsonl" --output "$tmp/x4" --loss sigmoid,bco --loss-weights nan,1
expect_error dpo_loss_unknown_component "got 'kto_pair'" "$bin" dpo --model "$model" --data "$data/pairs.jsonl" \
    --output "$tmp/x4" --loss sigmoid,kto_pair
expect_error dpo_simpo_combined "--loss: simpo combines with no other loss" "$bin" dpo --model "$model" \
    --data "$data/pairs.jsonl" --output "$tmp/x4" --loss sigmoid,simpo
expect_error dpo_cpo_combined "--loss: cpo combines with no other loss" "$bin" dpo --model "$model" \
    --data "$data/pairs.jsonl" --output "$tmp/x4" --loss cpo,sft
expect_error dpo_cpo_alpha_not_cpo "--cpo-alpha applies to --loss cpo, cpo-hinge, cpo-ipo and simpo only" "$bin" dpo --model "$model" \
    --data "$data/pairs.jsonl" --output "$tmp/x4" --cpo-alpha 1
expect_error dpo_cpo_alpha_negative "--cpo-alpha must be >= 0" "$bin" dpo --model "$model" --data "$data/pairs.jsonl" \
    --output "$tmp/x4" --loss cpo --cpo-alpha -1
expect_error dpo_cpo_sft_weight "--sft-weight: --loss cpo" "$bin" dpo --model "$model" --data "$data/pairs.jsonl" \
    --output "$tmp/x4" --loss cpo --sft-weight 0.5
expect_error dpo_cpo_reference "--loss cpo has no reference" "$bin" dpo --model "$model" --data "$data/pairs.jsonl" \
    --output "$tmp/x7" --loss cpo --reference-model "$model"
# SimPO's behaviour cloning is off by default (the SimPO paper; TRL's alphapo): --cpo-alpha 0
# is the same run bit for bit, and --cpo-alpha 1 (CPO-SimPO) another.
"$bin" dpo "${args[@]}" --loss simpo --beta 2 --simpo-gamma 1 --cpo-alpha 0 --eval-every 6 --output "$tmp/simpo_a0" \
    2> "$tmp/simpo_a0.err"
cmp -s "$tmp/simpo_a0/final/model.safetensors" "$tmp/simpo/final/model.safetensors" &&
    pass dpo_simpo_cpo_alpha_0_is_default || fail dpo_simpo_cpo_alpha_0_is_default "$(tail -n 2 "$tmp/simpo_a0.err")"
"$bin" dpo "${args[@]}" --max-steps 2 --loss simpo --beta 2 --simpo-gamma 1 --cpo-alpha 1 --output "$tmp/simpo_a1" \
    2> "$tmp/simpo_a1.err"
"$bin" dpo "${args[@]}" --max-steps 2 --loss simpo --beta 2 --simpo-gamma 1 --output "$tmp/simpo_plain" \
    2> "$tmp/simpo_plain.err"
with_bc=$(json_field "$tmp/simpo_a1/metrics.jsonl" train/loss 0 2>/dev/null)
plain=$(json_field "$tmp/simpo_plain/metrics.jsonl" train/loss 0 2>/dev/null)
# The first step's loss grows by the chosen tokens' mean NLL, several nats on this model.
python3 -c "import sys; sys.exit(0 if float(sys.argv[1]) > float(sys.argv[2]) + 1 else 1)" "$with_bc" "$plain" 2>/dev/null &&
    pass "dpo_simpo_cpo_alpha_adds_nll (first loss $plain -> $with_bc)" ||
    fail dpo_simpo_cpo_alpha_adds_nll "first losses '$plain' '$with_bc' $(tail -n 2 "$tmp/simpo_a1.err")"
# AOT: with one pair per micro-batch there is nothing to sort, and it is sigmoid bit for bit.
"$bin" dpo "${args[@]}" --max-steps 2 --per-device-train-batch-size 1 --loss aot --output "$tmp/aot_1" 2> "$tmp/aot_1.err"
"$bin" dpo "${args[@]}" --max-steps 2 --per-device-train-batch-size 1 --output "$tmp/sigmoid_1" 2> "$tmp/sigmoid_1.err"
[ -f "$tmp/aot_1/final/model.safetensors" ] &&
    cmp -s "$tmp/aot_1/final/model.safetensors" "$tmp/sigmoid_1/final/model.safetensors" && pass dpo_aot_one_pair_is_sigmoid ||
    fail dpo_aot_one_pair_is_sigmoid "$(tail -n 2 "$tmp/aot_1.err" "$tmp/sigmoid_1.err")"
# ... and with four it trains otherwise than sigmoid (the loop's aot run, smoothing 0.1).
cmp -s "$tmp/aot/final/model.safetensors" "$tmp/sigmoid/final/model.safetensors" &&
    fail dpo_aot_sorts "the same weights as sigmoid with the same smoothing" || pass dpo_aot_sorts
expect_error dpo_aot_use_weighting "--use-weighting: --loss aot and aot-unpaired sort the pairs" "$bin" dpo \
    --model "$model" --data "$data/pairs.jsonl" --output "$tmp/x4" --loss aot --use-weighting
expect_error dpo_aot_f_divergence "--loss aot-unpaired has no f-divergence form" "$bin" dpo --model "$model" \
    --data "$data/pairs.jsonl" --output "$tmp/x4" --loss aot-unpaired --f-divergence js
expect_error dpo_cpo_hinge_smoothing "--label-smoothing applies to" "$bin" dpo --model "$model" --data "$data/pairs.jsonl" \
    --output "$tmp/x4" --loss cpo-hinge --label-smoothing 0.1
expect_error dpo_cpo_ipo_reference "--loss cpo-ipo has no reference" "$bin" dpo --model "$model" --data "$data/pairs.jsonl" \
    --output "$tmp/x7" --loss cpo-ipo --reference-model "$model"
expect_error dpo_alphapo_needs_alpha "--alphapo-alpha: --loss alphapo needs it non-zero" "$bin" dpo --model "$model" \
    --data "$data/pairs.jsonl" --output "$tmp/x4" --loss alphapo
expect_error dpo_alphapo_alpha_not_cpo "--alphapo-alpha applies to --loss alphapo, cpo, cpo-hinge, cpo-ipo and simpo" \
    "$bin" dpo --model "$model" --data "$data/pairs.jsonl" --output "$tmp/x4" --loss sigmoid --alphapo-alpha 0.25
expect_error dpo_bad_alphapo_alpha "option --alphapo-alpha expects a number" "$bin" dpo --model "$model" \
    --data "$data/pairs.jsonl" --output "$tmp/x4" --loss alphapo --alphapo-alpha nan
expect_error dpo_alphapo_cpo_alpha "--cpo-alpha: --loss alphapo is SimPO with cpo_alpha 0" "$bin" dpo --model "$model" \
    --data "$data/pairs.jsonl" --output "$tmp/x4" --loss alphapo --alphapo-alpha 0.25 --cpo-alpha 1
expect_error dpo_sft_alone "--loss: sft alone" "$bin" dpo --model "$model" --data "$data/pairs.jsonl" --output "$tmp/x4" \
    --loss sft
expect_error dpo_sft_term_and_sft_weight "--sft-weight" "$bin" dpo --model "$model" --data "$data/pairs.jsonl" \
    --output "$tmp/x4" --loss sigmoid,sft --sft-weight 0.5
expect_error dpo_combined_f_divergence "--loss bco has no f-divergence form" "$bin" dpo --model "$model" \
    --data "$data/pairs.jsonl" --output "$tmp/x4" --loss sigmoid,bco,sft --f-divergence js
expect_error dpo_use_weighting_orpo "--use-weighting" "$bin" dpo --model "$model" --data "$data/pairs.jsonl" \
    --output "$tmp/x4" --loss orpo --use-weighting
"$bin" dpo "${args[@]}" --max-steps 3 --sft-weight 0.5 --output "$tmp/rpo" 2> "$tmp/rpo.err"
loss0=$(json_field "$tmp/rpo/metrics.jsonl" train/loss 0 2>/dev/null)
# At the reference the DPO term is log 2; the SFT term adds half the chosen rows' mean NLL.
python3 -c "import sys, math; sys.exit(0 if float(sys.argv[1]) > math.log(2) + 0.5 else 1)" "$loss0" 2>/dev/null &&
    pass "dpo_sft_weight (first loss $loss0)" || fail dpo_sft_weight "first loss '$loss0' $(tail -n 2 "$tmp/rpo.err")"
expect_error dpo_bad_sft_weight "--sft-weight" "$bin" dpo --model "$model" --data "$data/pairs.jsonl" --output "$tmp/x8" \
    --sft-weight -1
expect_error dpo_bad_simpo_gamma "--simpo-gamma" "$bin" dpo --model "$model" --data "$data/pairs.jsonl" --output "$tmp/x9" \
    --loss simpo --simpo-gamma nan
expect_error dpo_simpo_reference "--reference-model" "$bin" dpo --model "$model" --data "$data/pairs.jsonl" \
    --output "$tmp/x7" --loss simpo --reference-model "$model"
expect_error dpo_orpo_reference "--loss orpo has no reference" "$bin" dpo --model "$model" --data "$data/pairs.jsonl" \
    --output "$tmp/x7" --loss orpo --reference-model "$model"
expect_error dpo_sft_data "chosen" "$bin" dpo --model "$model" --data "$data/sft.jsonl" --output "$tmp/x5"
expect_error dpo_missing_reference "$tmp/nowhere" "$bin" dpo --model "$model" --data "$data/pairs.jsonl" --output "$tmp/x6" \
    --reference-model "$tmp/nowhere"
expect_error dpo_reference_other_tokenizer "(--reference-model): the reference's log-probs are of the policy's token ids" \
    "$bin" dpo --model "$model" --data "$data/pairs.jsonl" --output "$tmp/x6" --reference-model models/SmolLM2-135M-Instruct.Q4_1.gguf
[ ! -e "$tmp/x1/final" ] && [ ! -e "$tmp/x6/final" ] && pass dpo_errors_write_no_model || fail dpo_errors_write_no_model "a model was written"
[ "$failures" -eq 0 ]
