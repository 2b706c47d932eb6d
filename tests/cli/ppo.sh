#!/usr/bin/env bash
# PPO / MA-PPO end to end on the tiny model (tests/fixtures/models/tiny_chat): every
# termination condition runs; --ngram 1 gives bit-identical weights to vanilla token-level
# PPO; runs are reproducible from the seed; a run killed with SIGKILL resumes to the same
# weights; EMA and PTX; the critic-free GRPO, RLOO and REINFORCE++ (no critic, learn,
# resume); bad options. Prints PASS/FAIL per case.
set -u
cd "$(dirname "$0")/../.."
bin=${MARLHF_BIN:-build/marlhf}
tmp=${MARLHF_TEST_TMP:-/tmp}/cli_ppo
rm -rf "$tmp" && mkdir -p "$tmp"
model=tests/fixtures/models/tiny_chat
data=tests/fixtures/train
failures=0
. tests/cli_helpers.sh

"$bin" rm --model "$model" --data "$data/pairs.jsonl" --max-seq-len 32 --per-device-train-batch-size 8 \
    --learning-rate 3e-3 --max-steps 6 --output "$tmp/rm" --quiet --threads 2 2> "$tmp/rm.err" ||
    fail reward_model "$(tail -n 2 "$tmp/rm.err")"
common=(--actor-model "$model" --reward-model "$tmp/rm/final" --prompts "$data/sft.jsonl" --eval-prompts "$data/sft_eval.jsonl"
        --eval-count 4 --rollout-batch-size 8 --generation-batch-size 8 --micro-batch-size 4 --max-new-tokens 10
        --max-iterations 3 --actor-learning-rate 1e-3 --critic-learning-rate 1e-3 --min-response-tokens 1 --quiet --threads 2)

run() { # run NAME ARGS...: a PPO run into $tmp/NAME
    local name=$1
    shift
    "$bin" ppo "${common[@]}" --output "$tmp/$name" "$@" 2> "$tmp/$name.err"
}

run fixed5 --termination-condition fixed --ngram 5
if [ -f "$tmp/fixed5/final/actor/model.safetensors" ] && [ -f "$tmp/fixed5/final/critic/model.safetensors" ]; then
    pass ppo_runs
else
    fail ppo_runs "$(tail -n 3 "$tmp/fixed5.err")"
fi
lines=$(grep -c '"train/score"' "$tmp/fixed5/metrics.jsonl" 2>/dev/null)
[ "$lines" = 3 ] && pass ppo_metrics_per_iteration || fail ppo_metrics_per_iteration "$lines lines"
for key in train/kl train/entropy train/clip_fraction train/approx_kl train/macro_actions train/macro_action_length \
           train/value_loss train/time_generation train/time_experience train/time_training train/distinct_2 \
           train/same_answer_fraction train/hacking_alarms eval/score; do
    grep -q "\"$key\"" "$tmp/fixed5/metrics.jsonl" 2>/dev/null && pass "metric_$key" || fail "metric_$key" missing
done
[ -s "$tmp/fixed5/samples/final.jsonl" ] && pass ppo_samples || fail ppo_samples "no samples"

# The frozen reference and reward model in 8 bits: the first rollout is the float32 run's
# (the actor stays float32), its scores move by the reward model's quantization only, and
# the KL to a reference that starts as the actor is no longer exactly 0 (measured: score
# -0.7246 against -0.7296, KL -0.0008 against 0).
run q8_frozen --termination-condition fixed --ngram 5 --max-iterations 1 --reference-quantize q8_0 --reward-quantize q8_0
python3 - "$tmp/fixed5/metrics.jsonl" "$tmp/q8_frozen/metrics.jsonl" <<'PY' &&
import json, sys
f32, q8 = ([json.loads(l) for l in open(p) if '"train/score"' in l][0] for p in sys.argv[1:])
ok = 0 < abs(q8["train/score"] - f32["train/score"]) <= 0.05 and f32["train/kl"] == 0.0
ok &= q8["train/kl"] != 0.0 and abs(q8["train/kl"]) < 0.01
print(f"  first iteration: score {f32['train/score']} -> {q8['train/score']}, kl {f32['train/kl']} -> {q8['train/kl']}",
      file=sys.stderr)
sys.exit(0 if ok else 1)
PY
    pass frozen_models_quantized || fail frozen_models_quantized "$(tail -n 3 "$tmp/q8_frozen.err")"
# The same two models in bf16: the scores and the KL move by bf16's rounding of the weights
# (measured: score -0.7296 -> -0.7327, KL -0.0011; the mean KL of one rollout is not ordered by
# the weights' error: Q8_0's, larger, gave -0.0008).
run bf16_frozen --termination-condition fixed --ngram 5 --max-iterations 1 --reference-quantize bf16 --reward-quantize bf16
python3 - "$tmp/fixed5/metrics.jsonl" "$tmp/q8_frozen/metrics.jsonl" "$tmp/bf16_frozen/metrics.jsonl" <<'PY' &&
import json, sys
f32, q8, bf16 = ([json.loads(l) for l in open(p) if '"train/score"' in l][0] for p in sys.argv[1:])
moved = abs(bf16["train/score"] - f32["train/score"])
print(f"  bf16: score {f32['train/score']} -> {bf16['train/score']} (q8_0 {q8['train/score']}), kl {bf16['train/kl']} "
      f"(q8_0 {q8['train/kl']})", file=sys.stderr)
ok = 0 < moved <= 0.05 and 0 < abs(bf16["train/kl"]) < 0.01
sys.exit(0 if ok else 1)
PY
    pass frozen_models_bf16 || fail frozen_models_bf16 "$(tail -n 3 "$tmp/bf16_frozen.err")"
expect_error bad_reward_quantize "--reward-quantize" "$bin" ppo "${common[@]}" --output "$tmp/x" --reward-quantize q4
expect_error reference_quantize_actor_base "--reference-quantize" "$bin" ppo "${common[@]}" --output "$tmp/x" \
    --actor-lora-rank 4 --reference-quantize q8_0

for condition in randomized ppl parsing; do
    run "$condition" --termination-condition "$condition"
    [ -f "$tmp/$condition/final/actor/model.safetensors" ] && pass "termination_$condition" ||
        fail "termination_$condition" "$(tail -n 3 "$tmp/$condition.err")"
done

# --ngram 1 is exactly token-level PPO (its own code path), bit for bit.
run ngram1 --termination-condition fixed --ngram 1
run token --termination-condition token
cmp -s "$tmp/ngram1/final/actor/model.safetensors" "$tmp/token/final/actor/model.safetensors" &&
    cmp -s "$tmp/ngram1/final/critic/model.safetensors" "$tmp/token/final/critic/model.safetensors" &&
    pass ngram1_is_token_level_ppo || fail ngram1_is_token_level_ppo "weights differ"
# The old log-probs from generation (--old-logprobs-from-rollout, TRL's way) instead of the
# actor's pass over the rollout: the same rollouts and rewards at the first iteration, the
# first ratio 1 within the decode path's rounding (not exactly: a ratio of exactly 1 and an
# approx KL of exactly 0 everywhere would mean the option did nothing), the KL penalty's
# log-probs within 1e-5, and the entropy from the training forward the pass's own.
run token_rollout_logprobs --termination-condition token --old-logprobs-from-rollout
python3 - "$tmp/token/metrics.jsonl" "$tmp/token_rollout_logprobs/metrics.jsonl" << 'PYEOF2' &&
import json, math, sys
passed, rollout = [[json.loads(l) for l in open(p) if '"train/score"' in l] for p in sys.argv[1:]]
first, first_rollout = passed[0], rollout[0]
ok = len(passed) == len(rollout) == 3
ok &= all(r["train/old_logprobs_from_rollout"] == 1 for r in rollout)
ok &= all(r["train/old_logprobs_from_rollout"] == 0 for r in passed)
ok &= first["train/score"] == first_rollout["train/score"]
ok &= abs(first["train/kl"] - first_rollout["train/kl"]) < 1e-5
ok &= abs(first["train/entropy"] - first_rollout["train/entropy"]) < 1e-6 * first["train/entropy"]
ok &= all(abs(r["train/ratio"] - 1) < 1e-5 and 0 <= r["train/approx_kl"] < 1e-9 for r in rollout)
ok &= any(r["train/ratio"] != 1 or r["train/approx_kl"] != 0 for r in rollout)
ok &= all(math.isfinite(r["train/kl"]) and math.isfinite(r["train/policy_loss"]) for r in rollout)
sys.exit(0 if ok else 1)
PYEOF2
    pass old_logprobs_from_rollout || fail old_logprobs_from_rollout "$(tail -n 3 "$tmp/token_rollout_logprobs.err")"
expect_error rollout_logprobs_or_recompute "--recompute-old-logprobs" "$bin" ppo "${common[@]}" --output "$tmp/x" \
    --old-logprobs-from-rollout --recompute-old-logprobs
expect_error rollout_logprobs_float_actor "needs a float actor" "$bin" ppo "${common[@]}" --output "$tmp/x" \
    --old-logprobs-from-rollout --actor-lora-rank 4 --actor-quantize q8_0
expect_error rollout_logprobs_bad_value "--old-logprobs-from-rollout expects true or false" "$bin" ppo "${common[@]}" \
    --output "$tmp/x" --old-logprobs-from-rollout=sometimes
# ... and the released zero-length step makes it differ.
run released --termination-condition fixed --ngram 1 --keep-duplicate-boundaries
cmp -s "$tmp/ngram1/final/actor/model.safetensors" "$tmp/released/final/actor/model.safetensors" &&
    fail released_duplicate_boundary_differs "identical" || pass released_duplicate_boundary_differs

# Reproducible from the seed (randomized macro actions included).
run randomized_again --termination-condition randomized
cmp -s "$tmp/randomized/final/actor/model.safetensors" "$tmp/randomized_again/final/actor/model.safetensors" &&
    pass randomized_reproducible || fail randomized_reproducible "weights differ"
run randomized_seed2 --termination-condition randomized --seed 99
cmp -s "$tmp/randomized/final/actor/model.safetensors" "$tmp/randomized_seed2/final/actor/model.safetensors" &&
    fail seed_matters "identical" || pass seed_matters

# killed_then_resumed NAME KILL_RANGE OPTIONS...: a run with OPTIONS (saving every
# iteration) killed with SIGKILL once the checkpoint of a random iteration k in
# [2, 2 + KILL_RANGE) exists, while later work is under way, then resumed, ends with the
# weights of the same run left alone. Output in $tmp/NAME_killed, $tmp/NAME_straight.
killed_then_resumed() {
    local name=$1 range=$2 pid k
    shift 2
    run "${name}_straight" "$@" --save-every 1
    "$bin" ppo "${common[@]}" "$@" --save-every 1 --keep-last 0 --output "$tmp/${name}_killed" 2> /dev/null &
    pid=$!
    k=$((2 + RANDOM % range))
    for _ in $(seq 1200); do [ -d "$tmp/${name}_killed/checkpoint-$k" ] && break; sleep 0.02; done
    kill -9 $pid 2> /dev/null
    wait $pid 2> /dev/null
    if [ -d "$tmp/${name}_killed/final" ]; then
        fail "${name}_killed_mid_run" "the run finished before the kill"
        return
    fi
    "$bin" ppo "${common[@]}" "$@" --save-every 1 --output "$tmp/${name}_killed" --resume 2> "$tmp/${name}_killed.err"
    cmp -s "$tmp/${name}_straight/final/actor/model.safetensors" "$tmp/${name}_killed/final/actor/model.safetensors" &&
        pass "${name}_resume_bit_identical" || fail "${name}_resume_bit_identical" "$(tail -n 2 "$tmp/${name}_killed.err")"
}
killed_then_resumed ppo 10 --max-iterations 24 --num-train-epochs 4

run extras --enable-ema --ptx-data "$data/sft.jsonl" --ptx-coef 0.5 --entropy-coef 0.01 --kl-target 0.1 \
    --whiten-advantages --normalize-reward --ppo-epochs 2 --num-minibatches 2 --ratio macro --macro-reward sum \
    --value-function position
[ -f "$tmp/extras/final/actor_ema/model.safetensors" ] && pass ema_ptx_adaptive_kl || fail ema_ptx_adaptive_kl "$(tail -n 3 "$tmp/extras.err")"
# PTX data as DeepSpeed-Chat's unsupervised text ({"text"} rows: every token trained): the
# first iteration's train/ptx_loss (taken before its step) is SFT's first-step loss on the same
# two rows, which the SFT task computes on its own; runs without PTX data log it as null.
printf '%s\n' '{"text": "Once upon a time a goat lived on a hill."}' '{"text": "The cow is a lovely animal."}' > "$tmp/ptx_text.jsonl"
run ptx_text --ptx-data "$tmp/ptx_text.jsonl" --ptx-coef 0.5 --max-iterations 1
"$bin" sft --model "$model" --data "$tmp/ptx_text.jsonl" --max-seq-len 48 --per-device-train-batch-size 2 --max-steps 1 \
    --threads 2 --quiet --output "$tmp/ptx_text_sft" 2> "$tmp/ptx_text_sft.err"
ptx=$(json_field "$tmp/ptx_text/metrics.jsonl" train/ptx_loss 0 2> /dev/null)
sft_loss=$(json_field "$tmp/ptx_text_sft/metrics.jsonl" train/loss 0 2> /dev/null)
without=$(json_field "$tmp/fixed5/metrics.jsonl" train/ptx_loss 0 2> /dev/null)
python3 -c "import sys; a, b = float(sys.argv[1]), float(sys.argv[2]); sys.exit(0 if abs(a - b) <= 1e-6 * abs(b) and sys.argv[3] == 'None' else 1)" \
    "$ptx" "$sft_loss" "$without" 2> /dev/null && pass ptx_text_rows_loss ||
    fail ptx_text_rows_loss "ptx_loss '$ptx', SFT's '$sft_loss', without PTX '$without' $(tail -n 1 "$tmp/ptx_text.err")"
# Packed into one stream (--ptx-packing wrapped: DeepSpeed-Chat's group_texts, rows of
# --max-prompt-len + --max-new-tokens = 48 tokens) the two texts are one row, every token
# trained but the row's first: the first train/ptx_loss is sft's first-step loss on the same
# rows packed the same way (--packing --packing-strategy wrapped, every token).
run ptx_wrapped --ptx-data "$tmp/ptx_text.jsonl" --ptx-coef 0.5 --max-iterations 1 --ptx-packing wrapped \
    --max-prompt-len 38
"$bin" sft --model "$model" --data "$tmp/ptx_text.jsonl" --max-seq-len 48 --per-device-train-batch-size 2 --max-steps 1 \
    --packing --packing-strategy wrapped --completion-only-loss false --threads 2 --quiet --output "$tmp/ptx_wrapped_sft" \
    2> "$tmp/ptx_wrapped_sft.err"
ptx=$(json_field "$tmp/ptx_wrapped/metrics.jsonl" train/ptx_loss 0 2> /dev/null)
sft_loss=$(json_field "$tmp/ptx_wrapped_sft/metrics.jsonl" train/loss 0 2> /dev/null)
unpacked=$(json_field "$tmp/ptx_text/metrics.jsonl" train/ptx_loss 0 2> /dev/null)
python3 -c "import sys; a, b, c = map(float, sys.argv[1:4]); sys.exit(0 if abs(a - b) <= 1e-6 * abs(b) and abs(a - c) > 1e-4 else 1)" \
    "$ptx" "$sft_loss" "$unpacked" 2> /dev/null && pass "ptx_packing_wrapped_loss ($ptx; unpacked $unpacked)" ||
    fail ptx_packing_wrapped_loss "ptx_loss '$ptx', SFT's '$sft_loss', unpacked '$unpacked' $(tail -n 1 "$tmp/ptx_wrapped.err")"
expect_error ppo_ptx_packing_resume_other "made with --ptx-packing wrapped, this run has none" \
    "$bin" ppo "${common[@]}" --ptx-data "$tmp/ptx_text.jsonl" --max-prompt-len 38 --max-iterations 2 --resume \
    --output "$tmp/ptx_wrapped"
expect_error ppo_ptx_packing_unknown "option --ptx-packing must be none, wrapped, bfd or bfd_split, got 'blocks'" \
    "$bin" ppo "${common[@]}" --ptx-data "$tmp/ptx_text.jsonl" --ptx-packing blocks --output "$tmp/x_ptx_packing"
expect_error ppo_ptx_packing_without_data "option --ptx-packing wrapped packs --ptx-data" \
    "$bin" ppo "${common[@]}" --ptx-packing wrapped --output "$tmp/x_ptx_packing"
# As prompts they are refused: they have none (not rolled out from empty prompts).
expect_error ppo_text_rows_as_prompts "ptx_text.jsonl at line 1 is a language-modeling" \
    "$bin" ppo "${common[@]}" --prompts "$tmp/ptx_text.jsonl" --output "$tmp/x_text_prompts"

# --- critic-free estimators: no critic is loaded, trained or saved --------------------------
for estimator in grpo rloo reinforce++-baseline; do
    run "$estimator" --advantage-estimator "$estimator" --samples-per-prompt 4 --termination-condition token
    lines=$(grep -c '"train/score"' "$tmp/$estimator/metrics.jsonl" 2>/dev/null)
    [ -f "$tmp/$estimator/final/actor/model.safetensors" ] && [ ! -e "$tmp/$estimator/final/critic" ] && [ "$lines" = 3 ] &&
        [ -z "$(ls -d "$tmp/$estimator"/checkpoint-*/critic 2> /dev/null)" ] && pass "${estimator}_runs_without_critic" ||
        fail "${estimator}_runs_without_critic" "$lines lines $(tail -n 3 "$tmp/$estimator.err")"
done
# GRPO's score rises on the fixture task (the reward model above prefers kind words).
first=$(python3 -c "import json,sys; r=[json.loads(l)['train/score'] for l in open(sys.argv[1]) if 'train/score' in l]; print(r[0])" "$tmp/grpo/metrics.jsonl" 2>/dev/null)
run grpo_long --advantage-estimator grpo --samples-per-prompt 4 --max-iterations 8 --termination-condition token
last=$(python3 -c "import json,sys; r=[json.loads(l)['train/score'] for l in open(sys.argv[1]) if 'train/score' in l]; print(sum(r[-3:]) / 3)" "$tmp/grpo_long/metrics.jsonl" 2>/dev/null)
python3 -c "import sys; sys.exit(0 if float(sys.argv[2]) > float(sys.argv[1]) + 0.5 else 1)" "$first" "$last" 2>/dev/null &&
    pass "grpo_learns (score $first -> $last)" || fail grpo_learns "score '$first' -> '$last'"
# REINFORCE++ needs no group: one response per prompt, whitened returns-to-go; it learns too.
run reinforce --advantage-estimator reinforce++ --max-iterations 8 --termination-condition token
rf_first=$(python3 -c "import json,sys; r=[json.loads(l)['train/score'] for l in open(sys.argv[1]) if 'train/score' in l]; print(r[0])" "$tmp/reinforce/metrics.jsonl" 2>/dev/null)
rf_last=$(python3 -c "import json,sys; r=[json.loads(l)['train/score'] for l in open(sys.argv[1]) if 'train/score' in l]; print(sum(r[-3:]) / 3)" "$tmp/reinforce/metrics.jsonl" 2>/dev/null)
[ ! -e "$tmp/reinforce/final/critic" ] &&
    python3 -c "import sys; sys.exit(0 if float(sys.argv[2]) > float(sys.argv[1]) + 0.5 else 1)" "$rf_first" "$rf_last" 2>/dev/null &&
    pass "reinforce++_learns (score $rf_first -> $rf_last)" || fail reinforce++_learns "score '$rf_first' -> '$rf_last' $(tail -n 2 "$tmp/reinforce.err")"
# Dr. GRPO (no division by the group's spread, token sums over --max-new-tokens) learns as
# well; its loss aggregation is a real change (the explicit released one gives other weights).
run dr_grpo --advantage-estimator dr-grpo --samples-per-prompt 4 --max-iterations 8 --termination-condition token
dr_first=$(python3 -c "import json,sys; r=[json.loads(l)['train/score'] for l in open(sys.argv[1]) if 'train/score' in l]; print(r[0])" "$tmp/dr_grpo/metrics.jsonl" 2>/dev/null)
dr_last=$(python3 -c "import json,sys; r=[json.loads(l)['train/score'] for l in open(sys.argv[1]) if 'train/score' in l]; print(sum(r[-3:]) / 3)" "$tmp/dr_grpo/metrics.jsonl" 2>/dev/null)
[ ! -e "$tmp/dr_grpo/final/critic" ] &&
    python3 -c "import sys; sys.exit(0 if float(sys.argv[2]) > float(sys.argv[1]) + 0.5 else 1)" "$dr_first" "$dr_last" 2>/dev/null &&
    pass "dr_grpo_learns (score $dr_first -> $dr_last)" || fail dr_grpo_learns "score '$dr_first' -> '$dr_last' $(tail -n 2 "$tmp/dr_grpo.err")"
run dr_grpo_seq_mean --advantage-estimator dr-grpo --samples-per-prompt 4 --max-iterations 2 --termination-condition token \
    --loss-aggregation seq-mean-token-mean
run dr_grpo_short --advantage-estimator dr-grpo --samples-per-prompt 4 --max-iterations 2 --termination-condition token
[ -f "$tmp/dr_grpo_short/final/actor/model.safetensors" ] && ! cmp -s "$tmp/dr_grpo_short/final/actor/model.safetensors" \
    "$tmp/dr_grpo_seq_mean/final/actor/model.safetensors" && pass dr_grpo_token_sum_norm ||
    fail dr_grpo_token_sum_norm "$(tail -n 3 "$tmp/dr_grpo_short.err")"
# TRL's bnpo (--loss-aggregation micro-batch-token-mean): with one micro-batch per step it is
# token-mean to the bit, with one response per micro-batch the per-response mean (TRL's grpo);
# with micro-batches of 4 responses of unequal lengths it weighs their tokens otherwise, and it
# learns.
bnpo_args=(--advantage-estimator grpo --samples-per-prompt 4 --termination-condition token)
run bnpo_one "${bnpo_args[@]}" --max-iterations 2 --micro-batch-size 32 --loss-aggregation bnpo
run token_mean_one "${bnpo_args[@]}" --max-iterations 2 --micro-batch-size 32 --loss-aggregation token-mean
run token_mean_four "${bnpo_args[@]}" --max-iterations 2 --loss-aggregation token-mean
run bnpo_single "${bnpo_args[@]}" --max-iterations 2 --micro-batch-size 1 --loss-aggregation bnpo
run sequence_mean_single "${bnpo_args[@]}" --max-iterations 2 --micro-batch-size 1
run bnpo "${bnpo_args[@]}" --max-iterations 8 --loss-aggregation micro-batch-token-mean
run bnpo_four "${bnpo_args[@]}" --max-iterations 2 --loss-aggregation micro-batch-token-mean
bnpo_last=$(python3 -c "import json,sys; r=[json.loads(l)['train/score'] for l in open(sys.argv[1]) if 'train/score' in l]; print(sum(r[-3:]) / 3)" "$tmp/bnpo/metrics.jsonl" 2>/dev/null)
[ -f "$tmp/bnpo_one/final/actor/model.safetensors" ] &&
    cmp -s "$tmp/bnpo_one/final/actor/model.safetensors" "$tmp/token_mean_one/final/actor/model.safetensors" &&
    [ -f "$tmp/bnpo_single/final/actor/model.safetensors" ] &&
    cmp -s "$tmp/bnpo_single/final/actor/model.safetensors" "$tmp/sequence_mean_single/final/actor/model.safetensors" &&
    [ -f "$tmp/bnpo_four/final/actor/model.safetensors" ] &&
    ! cmp -s "$tmp/bnpo_four/final/actor/model.safetensors" "$tmp/token_mean_four/final/actor/model.safetensors" &&
    python3 -c "import sys; sys.exit(0 if float(sys.argv[2]) > float(sys.argv[1]) + 0.5 else 1)" "$first" "$bnpo_last" 2>/dev/null &&
    pass "bnpo (token-mean with one micro-batch, the sequence mean with one response each, neither with four; score $first -> $bnpo_last)" ||
    fail bnpo "score '$first' -> '$bnpo_last' $(tail -n 2 "$tmp/bnpo_one.err" "$tmp/bnpo.err")"
# OPO (verl's: the group's baseline weighted by the responses' lengths; its arithmetic is
# test_ppo_math's): it learns, and it is not Dr. GRPO's unweighted baseline (another training).
run opo --advantage-estimator opo --samples-per-prompt 4 --max-iterations 8 --termination-condition token
opo_last=$(python3 -c "import json,sys; r=[json.loads(l)['train/score'] for l in open(sys.argv[1]) if 'train/score' in l]; print(sum(r[-3:]) / 3)" "$tmp/opo/metrics.jsonl" 2>/dev/null)
run opo_seq_mean --advantage-estimator opo --samples-per-prompt 4 --max-iterations 2 --termination-condition token \
    --loss-aggregation seq-mean-token-sum-norm
[ ! -e "$tmp/opo/final/critic" ] && [ -f "$tmp/opo_seq_mean/final/actor/model.safetensors" ] &&
    ! cmp -s "$tmp/opo_seq_mean/final/actor/model.safetensors" "$tmp/dr_grpo_short/final/actor/model.safetensors" &&
    python3 -c "import sys; sys.exit(0 if float(sys.argv[2]) > float(sys.argv[1]) + 0.5 else 1)" "$first" "$opo_last" 2>/dev/null &&
    pass "opo_learns (score $first -> $opo_last)" || fail opo_learns "score '$first' -> '$opo_last' $(tail -n 2 "$tmp/opo.err")"
# ReMax (verl's: the baseline is the score of the actor's greedy answer to the prompt): sampled
# greedily too, every response is its baseline's, so the first iteration's advantages are all 0
# (the KL is 0 there: the actor is the reference), no actor gradient, the logged baseline the
# raw score; sampled, it learns.
run remax_greedy --advantage-estimator remax --termination-condition token --temperature 0 --max-iterations 1
run remax --advantage-estimator remax --samples-per-prompt 4 --max-iterations 8 --termination-condition token
remax_last=$(python3 -c "import json,sys; r=[json.loads(l)['train/score'] for l in open(sys.argv[1]) if 'train/score' in l]; print(sum(r[-3:]) / 3)" "$tmp/remax/metrics.jsonl" 2>/dev/null)
python3 - "$tmp/remax_greedy/metrics.jsonl" << 'PYEOF2' &&
import json, sys
r = [json.loads(l) for l in open(sys.argv[1]) if '"train/score"' in l][0]
print(f"greedy: raw score {r['train/raw_score']}, baseline {r['train/baseline_score']}, advantage {r['train/advantage']}, "
      f"actor gradient {r['train/actor_grad_norm']}", file=sys.stderr)
sys.exit(0 if r["train/advantage"] == 0 and r["train/actor_grad_norm"] == 0 and
         r["train/baseline_score"] == r["train/raw_score"] else 1)
PYEOF2
    [ ! -e "$tmp/remax/final/critic" ] &&
    python3 -c "import sys; sys.exit(0 if float(sys.argv[2]) > float(sys.argv[1]) + 0.5 else 1)" "$first" "$remax_last" 2>/dev/null &&
    pass "remax (score $first -> $remax_last)" || fail remax "score '$first' -> '$remax_last' $(tail -n 2 "$tmp/remax.err")"
expect_error remax_normalize_reward "--advantage-estimator remax compares" "$bin" ppo "${common[@]}" --output "$tmp/x" \
    --advantage-estimator remax --normalize-reward
# DAPO's clip-higher and soft overlong punishment: both change the run; the punishment
# lowers the logged score of responses that reach into the buffer.
# (Several optimizer steps per rollout at a high learning rate, so that ratios leave [0.8, 1.2].)
clip_args=(--advantage-estimator grpo --samples-per-prompt 4 --max-iterations 2 --termination-condition token --ppo-epochs 4
           --num-minibatches 2 --actor-learning-rate 1e-2)
run grpo_clip_higher "${clip_args[@]}" --cliprange-high 0.28
run grpo_clip_symmetric "${clip_args[@]}"
python3 - "$tmp/grpo_clip_symmetric/metrics.jsonl" "$tmp/grpo_clip_higher/metrics.jsonl" << 'PYEOF2' &&
import json, sys
clipped = [sum(json.loads(l)["train/clip_fraction"] for l in open(p) if '"train/clip_fraction"' in l) for p in sys.argv[1:]]
sys.exit(0 if clipped[0] > 0 and clipped[1] < clipped[0] else 1)
PYEOF2
    ! cmp -s "$tmp/grpo_clip_higher/final/actor/model.safetensors" "$tmp/grpo_clip_symmetric/final/actor/model.safetensors" &&
    pass dapo_clip_higher || fail dapo_clip_higher "$(tail -n 3 "$tmp/grpo_clip_higher.err")"
# DeepSeek-V3.2's off-policy sequence masking (TRL's off_policy_mask_threshold; its arithmetic is
# test_ppo_math's against TRL's): in the clip test's off-policy steps a threshold of 0 drops the
# negative-advantage tokens of the responses the policy has moved away from (a fraction logged,
# and another training); a threshold no response reaches is the plain run bit for bit.
run grpo_off_policy_masked "${clip_args[@]}" --off-policy-mask-threshold 0
run grpo_off_policy_unreached "${clip_args[@]}" --off-policy-mask-threshold 1e9
python3 - "$tmp/grpo_off_policy_masked/metrics.jsonl" "$tmp/grpo_off_policy_unreached/metrics.jsonl" \
    "$tmp/grpo_clip_symmetric/metrics.jsonl" << 'PYEOF2' &&
import json, sys
masked, unreached, plain = [[r for r in map(json.loads, open(p)) if "train/score" in r] for p in sys.argv[1:]]
print(f"masked fractions {[r['train/off_policy_masked'] for r in masked]}, unreached "
      f"{[r['train/off_policy_masked'] for r in unreached]}, plain {[r['train/off_policy_masked'] for r in plain]}",
      file=sys.stderr)
ok = all(0 < r["train/off_policy_masked"] < 0.5 for r in masked) and all(r["train/off_policy_masked"] == 0 for r in unreached)
sys.exit(0 if ok and all(r["train/off_policy_masked"] is None for r in plain) else 1)
PYEOF2
    cmp -s "$tmp/grpo_off_policy_unreached/final/actor/model.safetensors" \
        "$tmp/grpo_clip_symmetric/final/actor/model.safetensors" &&
    ! cmp -s "$tmp/grpo_off_policy_masked/final/actor/model.safetensors" \
        "$tmp/grpo_clip_symmetric/final/actor/model.safetensors" &&
    pass grpo_off_policy_mask || fail grpo_off_policy_mask "$(tail -n 3 "$tmp/grpo_off_policy_masked.err")"
# --rollout-correction (TRL's vLLM importance sampling): on the CPU generation's log-probs are
# the actor pass's to float rounding, so every ratio is 1 but for rounding: the sequence weights
# log ~1; truncated at 0.5 every weight is 0.5 and the first step's actor gradient half the plain
# run's; masked outside [0, 0.5] every weight is 0 and there is no actor gradient.
one=(--termination-condition token --max-iterations 1)
run correction_plain "${one[@]}"
run correction_sequence "${one[@]}" --rollout-correction sequence-truncate
run correction_half "${one[@]}" --rollout-correction token-truncate --rollout-correction-max 0.5
run correction_none "${one[@]}" --rollout-correction token-mask --rollout-correction-max 0.5
python3 - "$tmp" << 'PYEOF2' &&
import json, sys
def first(name):
    return [r for r in map(json.loads, open(f"{sys.argv[1]}/{name}/metrics.jsonl")) if "train/score" in r][0]
plain, sequence, half, none = (first(n) for n in ("correction_plain", "correction_sequence", "correction_half",
                                                   "correction_none"))
norms = [r["train/actor_grad_norm"] for r in (plain, half, none)]
weights = [r["train/rollout_weight"] for r in (plain, sequence, half, none)]
print(f"actor grad norms (plain, half, none) {norms}; weights {weights}", file=sys.stderr)
ok = weights[0] is None and abs(weights[1] - 1) < 1e-3 and weights[2] == 0.5 and weights[3] == 0
ok &= abs(norms[1] - 0.5 * norms[0]) < 1e-4 * norms[0] and norms[2] == 0 and norms[0] > 0
sys.exit(0 if ok else 1)
PYEOF2
    pass ppo_rollout_correction || fail ppo_rollout_correction "$(tail -n 3 "$tmp/correction_half.err")"
expect_error ppo_rollout_correction_unknown "--rollout-correction must be none, token-truncate" "$bin" ppo \
    "${common[@]}" --rollout-correction vllm --output "$tmp/x"
expect_error ppo_rollout_correction_bounds "must be 0 <= min < max" "$bin" ppo "${common[@]}" \
    --rollout-correction token-mask --rollout-correction-min 2 --rollout-correction-max 1 --output "$tmp/x"
expect_error ppo_rollout_correction_from_rollout "give one (--rollout-correction)" "$bin" ppo "${common[@]}" \
    --rollout-correction token-mask --old-logprobs-from-rollout --output "$tmp/x"
# VESPO folds the weights into its own sequence ratio (TRL's get_gamma_weights): with weights
# of ~1 (sequence-truncate on the CPU) the first step's actor gradient is the plain VESPO run's
# to 1e-3; with every token masked (log 1e-8 each) its gamma weight, and so the gradient,
# all but vanish.
vespo=("${one[@]}" --advantage-estimator grpo --samples-per-prompt 2 --policy-loss vespo)
run vespo_plain "${vespo[@]}"
run vespo_sequence "${vespo[@]}" --rollout-correction sequence-truncate
run vespo_masked "${vespo[@]}" --rollout-correction token-mask --rollout-correction-max 0.5
python3 - "$tmp" << 'PYEOF2' &&
import json, sys
def first(name):
    return [r for r in map(json.loads, open(f"{sys.argv[1]}/{name}/metrics.jsonl")) if "train/score" in r][0]
norms = [first(n)["train/actor_grad_norm"] for n in ("vespo_plain", "vespo_sequence", "vespo_masked")]
print(f"VESPO actor grad norms (plain, sequence-truncate, all masked) {norms}", file=sys.stderr)
sys.exit(0 if norms[0] > 0 and abs(norms[1] - norms[0]) < 1e-3 * norms[0] and norms[2] < 1e-6 * norms[0] else 1)
PYEOF2
    pass ppo_rollout_correction_vespo || fail ppo_rollout_correction_vespo "$(tail -n 3 "$tmp/vespo_masked.err")"
run grpo_overlong --advantage-estimator grpo --samples-per-prompt 4 --max-iterations 1 --termination-condition token \
    --overlong-buffer 8 --overlong-penalty 5
run grpo_plain --advantage-estimator grpo --samples-per-prompt 4 --max-iterations 1 --termination-condition token
python3 - "$tmp/grpo_plain/metrics.jsonl" "$tmp/grpo_overlong/metrics.jsonl" << 'PYEOF2' &&
import json, sys
first = [[json.loads(l) for l in open(p) if '"train/score"' in l][0] for p in sys.argv[1:]]
# Same first rollout (same seed and weights); only the shaping differs, and it only lowers.
sys.exit(0 if first[1]["train/raw_score"] == first[0]["train/raw_score"] and first[1]["train/score"] < first[0]["train/score"] else 1)
PYEOF2
    pass dapo_overlong_penalty || fail dapo_overlong_penalty "$(tail -n 3 "$tmp/grpo_overlong.err")"
# DAPO's dynamic sampling (the filter): with the gold lexicon as reward, most of the tiny
# model's groups score 0 throughout; they are left out of training, and that changes it.
filter_args=(--reward lexicon --gold-lexicon data/austen/lexicon.tsv --advantage-estimator grpo --samples-per-prompt 4
             --termination-condition token)
"$bin" ppo "${common[@]}" "${filter_args[@]}" --output "$tmp/filter_off" 2> "$tmp/filter_off.err"
"$bin" ppo "${common[@]}" "${filter_args[@]}" --filter-groups --output "$tmp/filter_on" 2> "$tmp/filter_on.err"
python3 - "$tmp/filter_off/metrics.jsonl" "$tmp/filter_on/metrics.jsonl" << 'PYEOF2' &&
import json, sys
dropped = [sum(json.loads(l)["train/uniform_groups_dropped"] for l in open(p) if '"train/score"' in l) for p in sys.argv[1:]]
sys.exit(0 if dropped[0] == 0 and dropped[1] > 0 else 1)
PYEOF2
    [ -f "$tmp/filter_on/final/actor/model.safetensors" ] &&
    ! cmp -s "$tmp/filter_on/final/actor/model.safetensors" "$tmp/filter_off/final/actor/model.safetensors" &&
    pass dapo_filter_groups || fail dapo_filter_groups "$(tail -n 3 "$tmp/filter_on.err")"
# ... and its refill: further rounds of prompts until the batch holds --rollout-batch-size
# groups that were not filtered, at most --max-generation-rounds rounds. The first
# iteration's first round is the filter-only run's; the refill trains on more responses.
"$bin" ppo "${common[@]}" "${filter_args[@]}" --filter-groups --max-generation-rounds 4 --output "$tmp/filter_refill" \
    2> "$tmp/filter_refill.err"
python3 - "$tmp/filter_on/metrics.jsonl" "$tmp/filter_refill/metrics.jsonl" << 'PYEOF2' &&
import json, sys
only, refill = ([json.loads(l) for l in open(p) if '"train/score"' in l] for p in sys.argv[1:])
ok = all(r["train/generation_rounds"] == 1 for r in only)
ok &= refill[0]["train/generation_rounds"] >= 2 and all(1 <= r["train/generation_rounds"] <= 4 for r in refill)
ok &= refill[0]["train/responses_trained"] > only[0]["train/responses_trained"]
ok &= all(r["train/responses_trained"] <= 8 * 4 for r in refill)  # never more than --rollout-batch-size groups
sys.exit(0 if ok else 1)
PYEOF2
    pass dapo_filter_refill || fail dapo_filter_refill "$(tail -n 3 "$tmp/filter_refill.err")"
killed_then_resumed refill 4 "${filter_args[@]}" --filter-groups --max-generation-rounds 3 --max-iterations 10 \
    --num-train-epochs 8
expect_error refill_needs_filter "--max-generation-rounds" "$bin" ppo "${common[@]}" --output "$tmp/x" \
    --advantage-estimator grpo --samples-per-prompt 2 --max-generation-rounds 3
expect_error bad_generation_rounds "--max-generation-rounds" "$bin" ppo "${common[@]}" --output "$tmp/x" \
    --advantage-estimator grpo --samples-per-prompt 2 --filter-groups --max-generation-rounds 0
expect_error filter_groups_needs_groups "--filter-groups" "$bin" ppo "${common[@]}" --output "$tmp/x" --filter-groups
expect_error bad_cliprange_high "--cliprange-high" "$bin" ppo "${common[@]}" --output "$tmp/x" --cliprange-high 0
expect_error bad_overlong_buffer "--overlong-buffer" "$bin" ppo "${common[@]}" --output "$tmp/x" --overlong-buffer 1000
expect_error bad_overlong_penalty "--overlong-penalty" "$bin" ppo "${common[@]}" --output "$tmp/x" --overlong-buffer 4 \
    --overlong-penalty -1
expect_error bad_loss_aggregation "--loss-aggregation" "$bin" ppo "${common[@]}" --output "$tmp/x" --loss-aggregation sum
# The KL as a k3 loss term (TRL's GRPO beta) instead of the reward penalty.
# It moves the weights (from the second iteration, when the policy has left the reference).
run grpo_no_kl --advantage-estimator grpo --samples-per-prompt 2 --kl-ctl 0 --termination-condition token
run grpo_kl_loss --advantage-estimator grpo --samples-per-prompt 2 --kl-ctl 0 --kl-loss-coef 0.1 --termination-condition token
[ -f "$tmp/grpo_kl_loss/final/actor/model.safetensors" ] && ! cmp -s "$tmp/grpo_kl_loss/final/actor/model.safetensors" \
    "$tmp/grpo_no_kl/final/actor/model.safetensors" && pass grpo_kl_loss || fail grpo_kl_loss "$(tail -n 3 "$tmp/grpo_kl_loss.err")"
expect_error bad_kl_loss_coef "--kl-loss-coef" "$bin" ppo "${common[@]}" --output "$tmp/x" --kl-loss-coef -1
# The KL loss term's estimator (--kl-loss-type; its arithmetic is test_ppo_math's): k3 is the
# default, bit for bit; k2 is another training.
run grpo_kl_loss_k3 --advantage-estimator grpo --samples-per-prompt 2 --kl-ctl 0 --kl-loss-coef 0.1 --kl-loss-type k3 \
    --termination-condition token
run grpo_kl_loss_k2 --advantage-estimator grpo --samples-per-prompt 2 --kl-ctl 0 --kl-loss-coef 0.1 --kl-loss-type k2 \
    --termination-condition token
cmp -s "$tmp/grpo_kl_loss/final/actor/model.safetensors" "$tmp/grpo_kl_loss_k3/final/actor/model.safetensors" &&
    [ -f "$tmp/grpo_kl_loss_k2/final/actor/model.safetensors" ] &&
    ! cmp -s "$tmp/grpo_kl_loss/final/actor/model.safetensors" "$tmp/grpo_kl_loss_k2/final/actor/model.safetensors" &&
    pass grpo_kl_loss_type || fail grpo_kl_loss_type "$(tail -n 2 "$tmp/grpo_kl_loss_k2.err")"
# The reward penalty's estimator (--kl-estimator): k1 is the default, bit for bit; with k3 the
# first iteration is the same (the actor is the reference: every estimate 0) and the run is not.
run kl_k1 --termination-condition token --kl-estimator k1
run kl_k3 --termination-condition token --kl-estimator k3
python3 - "$tmp/token/metrics.jsonl" "$tmp/kl_k3/metrics.jsonl" << 'PYEOF' &&
import json, sys
k1, k3 = [[r for r in map(json.loads, open(p)) if "train/score" in r] for p in sys.argv[1:3]]
print(f"scores k1 {[r['train/score'] for r in k1]}, k3 {[r['train/score'] for r in k3]}", file=sys.stderr)
keys = ["train/score", "train/kl", "train/value_loss", "train/policy_loss", "train/advantage", "train/actor_grad_norm"]
ok = len(k1) == len(k3) == 3 and all(k1[0][k] == k3[0][k] for k in keys)
sys.exit(0 if ok and any(k1[2][k] != k3[2][k] for k in keys) else 1)
PYEOF
    cmp -s "$tmp/token/final/actor/model.safetensors" "$tmp/kl_k1/final/actor/model.safetensors" &&
    [ -f "$tmp/kl_k3/final/actor/model.safetensors" ] &&
    ! cmp -s "$tmp/token/final/actor/model.safetensors" "$tmp/kl_k3/final/actor/model.safetensors" &&
    pass ppo_kl_estimator || fail ppo_kl_estimator "$(tail -n 2 "$tmp/kl_k3.err")"
# TRL 1.16's default KL term (use_bias_correction_kl, its arithmetic test_ppo_math's against TRL's):
# the first step is the plain term's (the actor is the reference: every k3 and its slope 0),
# the run is not.
run grpo_kl_loss_bias --advantage-estimator grpo --samples-per-prompt 2 --kl-ctl 0 --kl-loss-coef 0.1 \
    --kl-loss-bias-correction --termination-condition token
[ -f "$tmp/grpo_kl_loss_bias/final/actor/model.safetensors" ] &&
    ! cmp -s "$tmp/grpo_kl_loss/final/actor/model.safetensors" "$tmp/grpo_kl_loss_bias/final/actor/model.safetensors" &&
    [ "$(json_field "$tmp/grpo_kl_loss/metrics.jsonl" train/actor_grad_norm 0)" = \
      "$(json_field "$tmp/grpo_kl_loss_bias/metrics.jsonl" train/actor_grad_norm 0)" ] &&
    pass grpo_kl_loss_bias_correction || fail grpo_kl_loss_bias_correction "$(tail -n 2 "$tmp/grpo_kl_loss_bias.err")"
expect_error ppo_kl_loss_bias_without_coef "give --kl-loss-coef above 0" "$bin" ppo "${common[@]}" \
    --kl-loss-bias-correction --output "$tmp/x"
expect_error ppo_kl_estimator_unknown "--kl-estimator must be k1, k2, k3 or abs" "$bin" ppo "${common[@]}" \
    --kl-estimator low_var_kl --output "$tmp/x"
expect_error ppo_kl_loss_type_without_coef "give --kl-loss-coef above 0" "$bin" ppo "${common[@]}" --kl-loss-type k2 \
    --output "$tmp/x"
# --mask-truncated-completions (TRL's, DAPO's overlong filtering): only the responses that
# stopped train the actor. The fixture model rarely says EOS, so the actor here is one SFT made
# to answer in one short sentence. With the option an iteration has an actor gradient (and a
# policy loss) exactly when some of its responses stopped -- in 3 tokens the first iterations'
# none do, in 12 some do at every iteration; without it every iteration has one.
"$bin" sft --model "$model" --data "$data/sft.jsonl" --max-seq-len 32 --learning-rate 3e-3 --num-train-epochs 6 \
    --threads 2 --quiet --output "$tmp/short_answers" 2> "$tmp/short_answers.err"
short=("${common[@]}" --actor-model "$tmp/short_answers/final" --max-iterations 4)
for case in "3 on" "3 off" "12 on"; do
    set -- $case
    mask=(); [ $2 = on ] && mask=(--mask-truncated-completions)
    "$bin" ppo "${short[@]}" --max-new-tokens $1 "${mask[@]}" --output "$tmp/mask_$1_$2" 2> "$tmp/mask_$1_$2.err"
done
python3 - "$tmp" << 'PYEOF' &&
import json, sys
def rows(name):
    return [(r["train/stopped_fraction"], r["train/actor_grad_norm"], r["train/policy_loss"])
            for r in map(json.loads, open(f"{sys.argv[1]}/{name}/metrics.jsonl")) if "train/actor_grad_norm" in r]
none_on, none_off, some_on = rows("mask_3_on"), rows("mask_3_off"), rows("mask_12_on")
print(f"(stopped fraction, actor grad norm, policy loss) in 3 tokens: {none_on}; without the option: {none_off}; "
      f"in 12 tokens: {some_on}", file=sys.stderr)
ok = len(none_on) == len(none_off) == len(some_on) == 4
ok &= all((s > 0) == (g > 0) and (s > 0 or l == 0) for s, g, l in none_on + some_on)
ok &= any(s == 0 for s, _, _ in none_on) and any(s > 0 for s, _, _ in none_on + some_on)
ok &= all(g > 0 for _, g, _ in none_off)
sys.exit(0 if ok else 1)
PYEOF
    pass ppo_mask_truncated_completions || fail ppo_mask_truncated_completions "$(tail -n 2 "$tmp/mask_3_on.err")"
# --missing-eos-penalty (TRL's): the first rollout is the plain run's (the same raw scores), and
# its mean score is lower by the penalty times the fraction of responses cut at 12 tokens
# (some stop, some do not, in this SFT's first rollout).
for penalty in 0 0.5; do
    "$bin" ppo "${short[@]}" --max-new-tokens 12 --max-iterations 1 --missing-eos-penalty $penalty \
        --output "$tmp/eos_$penalty" 2> "$tmp/eos_$penalty.err"
done
python3 - "$tmp/eos_0/metrics.jsonl" "$tmp/eos_0.5/metrics.jsonl" << 'PYEOF' &&
import json, sys
plain, penalised = [[r for r in map(json.loads, open(p)) if "train/score" in r][0] for p in sys.argv[1:3]]
cut = 1 - penalised["train/stopped_fraction"]
print(f"score {plain['train/score']} -> {penalised['train/score']}, raw {plain['train/raw_score']} -> "
      f"{penalised['train/raw_score']}, cut fraction {cut}", file=sys.stderr)
ok = plain["train/raw_score"] == penalised["train/raw_score"] and 0 < cut < 1
ok &= abs(penalised["train/score"] - (plain["train/score"] - 0.5 * cut)) < 1e-6
sys.exit(0 if ok else 1)
PYEOF
    pass ppo_missing_eos_penalty || fail ppo_missing_eos_penalty "$(tail -n 2 "$tmp/eos_0.5.err")"
expect_error ppo_eval_samples_range "--eval-samples-per-prompt must be in [1, 64]" "$bin" ppo "${common[@]}" \
    --eval-samples-per-prompt 0 --output "$tmp/x"
expect_error ppo_off_policy_mask_nan "--off-policy-mask-threshold expects a number" "$bin" ppo "${common[@]}" \
    --off-policy-mask-threshold nan --output "$tmp/x"
expect_error ppo_kl_cov_coef_negative "--kl-cov-coef >= 0" "$bin" ppo "${common[@]}" --policy-loss kl_cov \
    --kl-cov-coef -1 --output "$tmp/x"
expect_error ppo_logit_bias_vocabulary "token 5000 is not in the actor's vocabulary" "$bin" ppo "${common[@]}" \
    --logit-bias 5000:1 --output "$tmp/x"
expect_error ppo_missing_eos_penalty_negative "--missing-eos-penalty must be >= 0" "$bin" ppo "${common[@]}" \
    --missing-eos-penalty -1 --output "$tmp/x"
# --critic-warmup-iterations (OpenRLHF's freezing_actor_steps): in the first iteration the critic
# takes the plain run's step (the same bits) and the actor none (its weights those it started
# from; no policy figures, null); the actor's schedule starts at its own first step (iteration 2
# logs the full learning rate, the plain run less: linear decay, no warm-up); a run resumed at
# iteration 1 ends as the one that never stopped.
warm=(--warmup-ratio 0 --save-every 1 --keep-last 0)
run critic_warmup "${warm[@]}" --critic-warmup-iterations 1
run critic_warmup_plain "${warm[@]}"
rm -rf "$tmp/critic_warmup_resumed" && mkdir -p "$tmp/critic_warmup_resumed" &&
    cp -r "$tmp/critic_warmup/checkpoint-1" "$tmp/critic_warmup_resumed/"
run critic_warmup_resumed "${warm[@]}" --critic-warmup-iterations 1 --resume
python3 - "$tmp/critic_warmup/metrics.jsonl" "$tmp/critic_warmup_plain/metrics.jsonl" << 'PYEOF' &&
import json, sys
warm, plain = [[r for r in map(json.loads, open(p)) if "train/score" in r] for p in sys.argv[1:3]]
print(f"actor lr {[r['train/actor_lr'] for r in warm]} (plain {[r['train/actor_lr'] for r in plain]}), "
      f"policy loss {[r['train/policy_loss'] for r in warm]}", file=sys.stderr)
ok = len(warm) == len(plain) == 3 and warm[0]["train/policy_loss"] is None and warm[0]["train/actor_lr"] is None
ok &= warm[0]["train/value_loss"] == plain[0]["train/value_loss"] and warm[0]["train/score"] == plain[0]["train/score"]
ok &= abs(warm[1]["train/actor_lr"] - 1e-3) < 1e-9 and plain[1]["train/actor_lr"] < 0.9e-3
ok &= all(r["train/policy_loss"] is not None for r in warm[1:])
sys.exit(0 if ok else 1)
PYEOF
    cmp -s "$tmp/critic_warmup/checkpoint-1/critic/model.safetensors" \
        "$tmp/critic_warmup_plain/checkpoint-1/critic/model.safetensors" &&
    weights_close "$tmp/critic_warmup/checkpoint-1/actor/model.safetensors" "$model/model.safetensors" 0 > /dev/null &&
    ! weights_close "$tmp/critic_warmup/final/actor/model.safetensors" "$model/model.safetensors" 0 > /dev/null &&
    cmp -s "$tmp/critic_warmup/final/actor/model.safetensors" "$tmp/critic_warmup_resumed/final/actor/model.safetensors" &&
    pass ppo_critic_warmup || fail ppo_critic_warmup "$(tail -n 2 "$tmp/critic_warmup_resumed.err")"
expect_error ppo_critic_warmup_grpo "has no critic to warm up" "$bin" ppo "${common[@]}" --advantage-estimator grpo \
    --samples-per-prompt 2 --critic-warmup-iterations 1 --output "$tmp/x"
expect_error ppo_critic_warmup_negative "--critic-warmup-iterations must be in" "$bin" ppo "${common[@]}" \
    --critic-warmup-iterations -1 --output "$tmp/x"
# --sync-ref-model (TRL's GRPO sync_ref_model): with alpha 1 and an update after every optimizer
# step the reference is the actor as each rollout begins, so every iteration's KL is 0 (without
# the option the third is not); with alpha 0.5 every 2 steps the checkpoints hold the moved
# reference, and a run resumed from iteration 3's ends as the one that never stopped.
grpo_sync=(--advantage-estimator grpo --samples-per-prompt 2 --termination-condition token --sync-ref-model)
run grpo_sync_1 "${grpo_sync[@]}" --ref-model-mixup-alpha 1 --ref-model-sync-steps 1
run grpo_nosync --advantage-estimator grpo --samples-per-prompt 2 --termination-condition token
python3 - "$tmp/grpo_sync_1/metrics.jsonl" "$tmp/grpo_nosync/metrics.jsonl" << 'PYEOF' &&
import json, sys
synced, fixed = [[r["train/kl"] for r in map(json.loads, open(p)) if "train/kl" in r] for p in sys.argv[1:3]]
print(f"kl with the update {synced}, without {fixed}", file=sys.stderr)
sys.exit(0 if len(synced) == len(fixed) == 3 and all(abs(k) < 1e-6 for k in synced) and abs(fixed[-1]) > 1e-3 else 1)
PYEOF
    pass grpo_sync_ref_model_every_step || fail grpo_sync_ref_model_every_step "$(tail -n 2 "$tmp/grpo_sync_1.err")"
grpo_mix=("${grpo_sync[@]}" --ref-model-mixup-alpha 0.5 --ref-model-sync-steps 2 --max-iterations 4 --save-every 1 --keep-last 0)
run grpo_sync_mix "${grpo_mix[@]}"
rm -rf "$tmp/grpo_sync_resumed" && mkdir -p "$tmp/grpo_sync_resumed" &&
    cp -r "$tmp/grpo_sync_mix/checkpoint-3" "$tmp/grpo_sync_resumed/"
run grpo_sync_resumed "${grpo_mix[@]}" --resume
[ -d "$tmp/grpo_sync_mix/checkpoint-3/reference" ] &&
    ! cmp -s "$tmp/grpo_sync_mix/checkpoint-3/reference/model.safetensors" "$model/model.safetensors" &&
    cmp -s "$tmp/grpo_sync_mix/final/actor/model.safetensors" "$tmp/grpo_sync_resumed/final/actor/model.safetensors" &&
    pass grpo_sync_ref_model_resume_bit_identical ||
    fail grpo_sync_ref_model_resume_bit_identical "$(tail -n 2 "$tmp/grpo_sync_resumed.err")"
expect_error grpo_sync_ref_model_resume_without "made with --sync-ref-model, this run has none" \
    "$bin" ppo "${common[@]}" --advantage-estimator grpo --samples-per-prompt 2 --termination-condition token \
    --max-iterations 4 --save-every 1 --resume --output "$tmp/grpo_sync_resumed"
expect_error grpo_sync_ref_model_lora "not with LoRA" "$bin" ppo "${common[@]}" "${grpo_sync[@]}" --actor-lora-rank 4 \
    --output "$tmp/x"
expect_error grpo_sync_ref_model_quantized "not with a quantized reference" "$bin" ppo "${common[@]}" "${grpo_sync[@]}" \
    --reference-quantize q8_0 --output "$tmp/x"
# --adaptive-entropy (Skywork-OR1, TRL's use_adaptive_entropy), one optimizer step an iteration:
# with a target above any entropy the coefficient climbs one delta a step (0.05 -> 0.06, 0.07,
# 0.08, logged as entropy_coef); the first step has no bonus (no entropy measured before it), so
# the second iteration's rollout is the plain run's (the same scores), the third's is not; a
# run resumed at iteration 2 ends as the one that never stopped (the controller's state rides
# in the checkpoint).
adaptive=(--advantage-estimator grpo --samples-per-prompt 2 --termination-condition token --ppo-epochs 1
          --num-minibatches 1 --entropy-coef 0.05 --adaptive-entropy --entropy-target 100 --entropy-coef-delta 0.01)
run adaptive_entropy "${adaptive[@]}" --save-every 1 --keep-last 0
run adaptive_plain --advantage-estimator grpo --samples-per-prompt 2 --termination-condition token --ppo-epochs 1 \
    --num-minibatches 1
rm -rf "$tmp/adaptive_resumed" && mkdir -p "$tmp/adaptive_resumed" && cp -r "$tmp/adaptive_entropy/checkpoint-2" "$tmp/adaptive_resumed/"
run adaptive_resumed "${adaptive[@]}" --save-every 1 --keep-last 0 --resume
python3 - "$tmp/adaptive_entropy/metrics.jsonl" "$tmp/adaptive_plain/metrics.jsonl" << 'PYEOF' &&
import json, sys
adaptive, plain = [[r for r in map(json.loads, open(p)) if "train/entropy_coef" in r] for p in sys.argv[1:3]]
coefs = [round(r["train/entropy_coef"], 9) for r in adaptive]
scores = [(a["train/score"], b["train/score"]) for a, b in zip(adaptive, plain)]
print(f"entropy_coef {coefs}; scores (adaptive, plain) {scores}", file=sys.stderr)
ok = coefs == [0.06, 0.07, 0.08] and scores[0][0] == scores[0][1] and scores[1][0] == scores[1][1]
ok &= scores[2][0] != scores[2][1]
sys.exit(0 if ok else 1)
PYEOF
    cmp -s "$tmp/adaptive_entropy/final/actor/model.safetensors" "$tmp/adaptive_resumed/final/actor/model.safetensors" &&
    pass ppo_adaptive_entropy || fail ppo_adaptive_entropy "$(tail -n 2 "$tmp/adaptive_resumed.err")"
expect_error ppo_adaptive_entropy_bounds "--adaptive-entropy needs" "$bin" ppo "${common[@]}" --adaptive-entropy \
    --entropy-coef 2 --output "$tmp/x"
# --top-entropy-quantile (TRL's, the 80/20 rule; its arithmetic is test_ppo_math's against
# TRL's): 1 keeps every token, the run without it bit for bit; 0.2 trains the policy on a
# fifth of the tokens, another run. --delta (two-sided clipping) and the option's bad values.
run grpo_entropy_all --advantage-estimator grpo --samples-per-prompt 2 --termination-condition token --top-entropy-quantile 1
run grpo_entropy_fifth --advantage-estimator grpo --samples-per-prompt 2 --termination-condition token --top-entropy-quantile 0.2
cmp -s "$tmp/grpo_nosync/final/actor/model.safetensors" "$tmp/grpo_entropy_all/final/actor/model.safetensors" &&
    [ -f "$tmp/grpo_entropy_fifth/final/actor/model.safetensors" ] &&
    ! cmp -s "$tmp/grpo_nosync/final/actor/model.safetensors" "$tmp/grpo_entropy_fifth/final/actor/model.safetensors" &&
    pass grpo_top_entropy_quantile || fail grpo_top_entropy_quantile "$(tail -n 2 "$tmp/grpo_entropy_fifth.err")"
expect_error grpo_top_entropy_quantile_range "--top-entropy-quantile must be in [0, 1]" "$bin" ppo "${common[@]}" \
    --top-entropy-quantile 1.5 --output "$tmp/x"
expect_error ppo_delta_below_clip "--delta must be above 1 + --cliprange-high (1.28)" "$bin" ppo "${common[@]}" \
    --cliprange-high 0.28 --delta 1.2 --output "$tmp/x"
expect_error ppo_delta_cispo "--policy-loss cispo has none" "$bin" ppo "${common[@]}" --policy-loss cispo --delta 2 \
    --output "$tmp/x"
# An on-policy step (one PPO epoch, one minibatch, no KL in the reward) takes its old
# log-probs from the training forward: the experience pass skips the actor (TRL's GRPO does
# the same). Where the BLAS rounds a row the same whatever its batch-mates and padding, the
# training is bit for bit the one with the pass; OpenBLAS's AMD Zen kernels do not, so the
# check allows float rounding (the weights within 1e-5: a real change, such as the KL loss
# term above, moves them by 4e-3). With the KL penalty the pass runs.
run grpo_recompute --advantage-estimator grpo --samples-per-prompt 2 --kl-ctl 0 --termination-condition token \
    --recompute-old-logprobs
python3 - "$tmp/grpo_no_kl/metrics.jsonl" "$tmp/grpo_recompute/metrics.jsonl" "$tmp/grpo/metrics.jsonl" << 'PYEOF2' &&
import json, math, sys
runs = [[json.loads(l) for l in open(p) if '"train/score"' in l] for p in sys.argv[1:]]
reused, recomputed, penalised = runs
ok = len(reused) == 3 and all(r["train/old_logprobs_from_training"] == 1 for r in reused)
ok &= all(r["train/ratio"] == 1.0 and r["train/approx_kl"] == 0.0 for r in reused)
ok &= all(math.isfinite(r["train/kl"]) and r["train/entropy"] > 0 for r in reused)
ok &= all(r["train/old_logprobs_from_training"] == 0 for r in recomputed + penalised)
ok &= all(abs(a["train/kl"] - b["train/kl"]) < 1e-6 for a, b in zip(reused, recomputed))
ok &= all(abs(a["train/entropy"] - b["train/entropy"]) < 1e-6 * b["train/entropy"] for a, b in zip(reused, recomputed))
sys.exit(0 if ok else 1)
PYEOF2
    difference=$(weights_close "$tmp/grpo_no_kl/final/actor/model.safetensors" \
        "$tmp/grpo_recompute/final/actor/model.safetensors" 1e-5) &&
    pass "old_logprobs_from_training (weights within $difference)" ||
    fail old_logprobs_from_training "weights differ by $difference $(tail -n 3 "$tmp/grpo_recompute.err")"
# TRL's other GRPO loss forms: CISPO, SAPO, GSPO's sequence-level ratio, batch-scaled
# advantages, VESPO, LUSPO, GMPO and verl's KL-Cov, Clip-Cov and GPG (its estimator and loss). At ratio 1 the first three
# have PPO's gradient, so they are
# run with the clip test's several off-policy steps per rollout: each changes that
# training, and each learns.
for form in "cispo --policy-loss cispo" "sapo --policy-loss sapo" "gspo --ratio sequence" "batch --scale-rewards batch" \
    "vespo --policy-loss vespo" "luspo --policy-loss luspo" "gmpo --policy-loss gmpo" \
    "kl_cov --policy-loss kl_cov --kl-cov-ratio 0.2" \
    "clip_cov --policy-loss clip_cov --clip-cov-ratio 0.2 --clip-cov-lower 0.01 --clip-cov-upper 100" \
    "gpg --policy-loss gpg --advantage-estimator gpg"; do
    set -- $form
    name=$1
    shift
    run "grpo_$name" "${clip_args[@]}" "$@"
    [ -f "$tmp/grpo_$name/final/actor/model.safetensors" ] && ! cmp -s "$tmp/grpo_$name/final/actor/model.safetensors" \
        "$tmp/grpo_clip_symmetric/final/actor/model.safetensors" && pass "grpo_${name}_changes_training" ||
        fail "grpo_${name}_changes_training" "$(tail -n 3 "$tmp/grpo_$name.err")"
    run "grpo_${name}_long" --advantage-estimator grpo --samples-per-prompt 4 --max-iterations 8 --termination-condition token \
        --ppo-epochs 2 "$@"
    form_last=$(python3 -c "import json,sys; r=[json.loads(l)['train/score'] for l in open(sys.argv[1]) if 'train/score' in l]; print(sum(r[-3:]) / 3)" "$tmp/grpo_${name}_long/metrics.jsonl" 2>/dev/null)
    python3 -c "import sys; sys.exit(0 if float(sys.argv[2]) > float(sys.argv[1]) + 0.5 else 1)" "$first" "$form_last" 2>/dev/null &&
        pass "grpo_${name}_learns (score $first -> $form_last)" ||
        fail "grpo_${name}_learns" "score '$first' -> '$form_last' $(tail -n 2 "$tmp/grpo_${name}_long.err")"
done
# GSPO-token: with GRPO's one advantage per response it trains as GSPO (its gradient is GSPO's,
# summed in another order); with PPO's per-token advantages (GAE) each token keeps its own, and
# the off-policy training is another.
run grpo_gspo_token "${clip_args[@]}" --ratio sequence-token
difference=$(weights_close "$tmp/grpo_gspo/final/actor/model.safetensors" \
    "$tmp/grpo_gspo_token/final/actor/model.safetensors" 1e-5) &&
    pass "gspo_token_trains_as_gspo_with_grpo (weights within $difference)" ||
    fail gspo_token_trains_as_gspo_with_grpo "weights differ by $difference $(tail -n 2 "$tmp/grpo_gspo_token.err")"
ppo_off_policy=(--termination-condition token --ppo-epochs 4 --num-minibatches 2 --actor-learning-rate 1e-2 --max-iterations 2)
run ppo_gspo "${ppo_off_policy[@]}" --ratio sequence
run ppo_gspo_token "${ppo_off_policy[@]}" --ratio gspo_token
difference=$(weights_close "$tmp/ppo_gspo/final/actor/model.safetensors" \
    "$tmp/ppo_gspo_token/final/actor/model.safetensors" 1e-3)
[ -f "$tmp/ppo_gspo_token/final/actor/model.safetensors" ] && [ "$difference" != "" ] &&
    python3 -c "import sys; sys.exit(0 if 1e-3 < float(sys.argv[1]) < float('inf') else 1)" "$difference" &&
    pass "gspo_token_differs_with_gae (weights apart by $difference)" ||
    fail gspo_token_differs_with_gae "'$difference' $(tail -n 2 "$tmp/ppo_gspo_token.err")"
expect_error bad_policy_loss "--policy-loss" "$bin" ppo "${common[@]}" --output "$tmp/x" --policy-loss reinforce
expect_error bad_cispo_max_weight "--cispo-max-weight" "$bin" ppo "${common[@]}" --output "$tmp/x" --policy-loss cispo \
    --cispo-max-weight 0
expect_error bad_sapo_temperature "--sapo-temperature" "$bin" ppo "${common[@]}" --output "$tmp/x" --policy-loss sapo \
    --sapo-temperature-neg -1
expect_error bad_ratio "--ratio" "$bin" ppo "${common[@]}" --output "$tmp/x" --ratio geometric
expect_error vespo_with_ratio "--ratio" "$bin" ppo "${common[@]}" --output "$tmp/x" --policy-loss vespo --ratio sequence
expect_error gmpo_with_ratio "--ratio does not apply to --policy-loss gmpo" "$bin" ppo "${common[@]}" --output "$tmp/x" \
    --policy-loss gmpo --ratio macro
expect_error kl_cov_ratio_range "--kl-cov-ratio must be in (0, 1]" "$bin" ppo "${common[@]}" --output "$tmp/x" \
    --policy-loss kl_cov --kl-cov-ratio 0
# Clip-Cov's draws come from the seed: a second run is the first to the bit. It logs the
# fraction of tokens left out (0.2 of each micro-batch's, where enough are candidates); the
# other forms log no such figure.
run grpo_clip_cov_again "${clip_args[@]}" --policy-loss clip_cov --clip-cov-ratio 0.2 --clip-cov-lower 0.01 \
    --clip-cov-upper 100
python3 - "$tmp/grpo_clip_cov/metrics.jsonl" "$tmp/grpo_kl_cov/metrics.jsonl" << 'PYEOF2' &&
import json, sys
clip_cov, kl_cov = [[json.loads(l) for l in open(p) if '"train/score"' in l] for p in sys.argv[1:]]
left_out = [r["train/clip_cov_left_out"] for r in clip_cov]
print(f"Clip-Cov left out {left_out}", file=sys.stderr)
sys.exit(0 if all(0.05 < x <= 0.2 for x in left_out) and all("train/clip_cov_left_out" not in r for r in kl_cov) else 1)
PYEOF2
    cmp -s "$tmp/grpo_clip_cov/final/actor/model.safetensors" "$tmp/grpo_clip_cov_again/final/actor/model.safetensors" &&
    pass clip_cov_seeded_draws || fail clip_cov_seeded_draws "$(tail -n 2 "$tmp/grpo_clip_cov_again.err")"
expect_error gpg_with_ratio "--ratio does not apply to --policy-loss gpg" "$bin" ppo "${common[@]}" \
    --output "$tmp/x" --policy-loss gpg --ratio macro
expect_error gpg_one_sample "--samples-per-prompt must be at least 2 with --advantage-estimator gpg" "$bin" ppo \
    "${common[@]}" --output "$tmp/x" --advantage-estimator gpg
expect_error clip_cov_bounds "--clip-cov-lower below --clip-cov-upper" "$bin" ppo "${common[@]}" --output "$tmp/x" \
    --policy-loss clip_cov --clip-cov-lower 5 --clip-cov-upper 1
expect_error clip_cov_ratio_range "--clip-cov-ratio must be in (0, 1]" "$bin" ppo "${common[@]}" --output "$tmp/x" \
    --policy-loss clip_cov --clip-cov-ratio 1.5
expect_error clip_cov_with_ratio "--ratio does not apply to --policy-loss clip_cov" "$bin" ppo "${common[@]}" \
    --output "$tmp/x" --policy-loss clip_cov --ratio sequence
# GMPO with TRL's entropy mask: the low-entropy tokens leave the geometric mean, which changes
# the off-policy training; the masks that act on single tokens' advantages are refused.
run grpo_gmpo_entropy "${clip_args[@]}" --policy-loss gmpo --top-entropy-quantile 0.2
[ -f "$tmp/grpo_gmpo_entropy/final/actor/model.safetensors" ] &&
    ! cmp -s "$tmp/grpo_gmpo_entropy/final/actor/model.safetensors" "$tmp/grpo_gmpo/final/actor/model.safetensors" &&
    pass gmpo_entropy_mask_changes_training || fail gmpo_entropy_mask_changes_training "$(tail -n 2 "$tmp/grpo_gmpo_entropy.err")"
expect_error gmpo_with_off_policy_mask "weighs the response as a whole" "$bin" ppo "${common[@]}" --output "$tmp/x" \
    --advantage-estimator grpo --samples-per-prompt 2 --policy-loss gmpo --off-policy-mask-threshold 0.5
expect_error bad_vespo_lambda "--vespo-lambda" "$bin" ppo "${common[@]}" --output "$tmp/x" --policy-loss vespo \
    --vespo-lambda-neg 0
expect_error bad_scale_rewards "--scale-rewards" "$bin" ppo "${common[@]}" --output "$tmp/x" --advantage-estimator grpo \
    --samples-per-prompt 2 --scale-rewards global
expect_error scale_rewards_not_grpo "--scale-rewards" "$bin" ppo "${common[@]}" --output "$tmp/x" --advantage-estimator rloo \
    --samples-per-prompt 2 --scale-rewards batch
# --reward command: the user's program scores each response from one JSON line
# {prompt, response, row} (here: the count of the row's "target" letter in the response).
# It sees every field of the prompt's row, GRPO learns with it, and a program that answers
# nonsense, exits or hangs stops training with a one-line error.
python3 - "$data/sft.jsonl" "$tmp/target_prompts.jsonl" << 'PYEOF2'
import json, sys
with open(sys.argv[1]) as rows, open(sys.argv[2], "w") as out:
    for line in rows:
        row = json.loads(line)
        out.write(json.dumps({"prompt": row["prompt"], "target": "e"}) + "\n")
PYEOF2
cat > "$tmp/reward.py" << 'PYEOF2'
import json, sys
log = open(sys.argv[1], "a")
for line in sys.stdin:
    request = json.loads(line)
    log.write(line)
    log.flush()
    print(request["response"].count(request["row"].get("target", "e")) / 5, flush=True)  # eval rows have none
PYEOF2
command_args=(--prompts "$tmp/target_prompts.jsonl" --reward command --reward-command "python3 $tmp/reward.py $tmp/requests.jsonl"
              --advantage-estimator grpo --samples-per-prompt 4 --termination-condition token)
rm -f "$tmp/requests.jsonl"
"$bin" ppo "${common[@]}" "${command_args[@]}" --max-iterations 12 --num-train-epochs 2 --output "$tmp/command" \
    --alarm-distinct-ratio 0.99 --save-every 3 --keep-last 0 2> "$tmp/command.err"
python3 - "$tmp/command/metrics.jsonl" "$tmp/requests.jsonl" << 'PYEOF2' &&
import json, sys
scores = [json.loads(l)["train/score"] for l in open(sys.argv[1]) if '"train/score"' in l]
requests = [json.loads(l) for l in open(sys.argv[2])]
ok = len(scores) == 12 and sum(scores[-3:]) / 3 > sum(scores[:3]) / 3 + 0.3
train = [r for r in requests if "target" in r["row"]]
ok &= all(r["row"] == {"prompt": r["prompt"], "target": "e"} and isinstance(r["response"], str) for r in train)
ok &= len(train) == 12 * 8 * 4  # every training response, with its row (the eval prompts' rows are the eval file's)
sys.exit(0 if ok else 1)
PYEOF2
    pass "command_reward_learns ($(python3 -c "import json,sys; s=[json.loads(l)['train/score'] for l in open(sys.argv[1]) if 'train/score' in l]; print(s[0], '->', s[-1])" "$tmp/command/metrics.jsonl"))" ||
    fail command_reward_learns "$(tail -n 3 "$tmp/command.err")"
# Reward-hacking alarms (rl/hacking_signals.h): the reward above pays for the letter e and the
# responses narrow. Each iteration's alarm count is what its logged signals give against the
# first iteration's (distinct-2's limit raised to 0.99 so that this short run sets it off);
# a warning line marks each iteration where an alarm starts or ends; the same run resumed
# from its checkpoint of iteration 9 keeps the first iteration's baseline: the same alarms.
python3 - "$tmp/command/metrics.jsonl" "$tmp/command.err" << 'PYEOF2' &&
import json, re, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"train/score"' in l]
first = rows[0]
def alarms(r):
    on = [r["train/response_length"] > 2 * first["train/response_length"] or
          r["train/response_length"] < first["train/response_length"] / 2,
          r["train/distinct_2"] < 0.99 * first["train/distinct_2"]]
    on += [r["train/" + k] - first["train/" + k] >= 0.25
           for k in ("repetitive_fraction", "same_answer_fraction", "shared_trigram_fraction")]
    return on
logged = [r["train/hacking_alarms"] for r in rows]
ok = logged == [sum(alarms(r)) for r in rows] and max(logged) > 0
# The warnings: the iterations where the count of alarms on changes, each with its line.
text = open(sys.argv[2]).read()
starts = [int(n) for n in re.findall(r"ppo: warning: iteration (\d+): possible reward hacking or collapse: ", text)]
ends = [int(n) for n in re.findall(r"ppo: iteration (\d+): back within the alarm's limit: ", text)]
before = [[False] * 5] + [alarms(r) for r in rows[:-1]]
want_starts = [i + 1 for i, r in enumerate(rows) for k in range(5) if alarms(r)[k] and not before[i][k]]
want_ends = [i + 1 for i, r in enumerate(rows) for k in range(5) if before[i][k] and not alarms(r)[k]]
ok &= starts == want_starts and ends == want_ends and "distinct-2" in text and "--alarm-distinct-ratio 0.99" in text
print(logged, starts, ends, file=sys.stderr)
sys.exit(0 if ok else 1)
PYEOF2
    pass "hacking_alarms ($(grep -c 'possible reward hacking' "$tmp/command.err") warnings)" ||
    fail hacking_alarms "$(grep 'iteration' "$tmp/command.err" | head -n 3)"
cp -r "$tmp/command" "$tmp/command_resumed" && rm -rf "$tmp/command_resumed/final" "$tmp/command_resumed/checkpoint-12"
"$bin" ppo "${common[@]}" "${command_args[@]}" --max-iterations 12 --num-train-epochs 2 --output "$tmp/command_resumed" \
    --alarm-distinct-ratio 0.99 --save-every 3 --keep-last 0 --resume \
    --reward-command "python3 $tmp/reward.py $tmp/requests_resumed.jsonl" 2> "$tmp/command_resumed.err"
python3 - "$tmp/command/metrics.jsonl" "$tmp/command_resumed/metrics.jsonl" << 'PYEOF2' &&
import json, sys
signals = ("distinct_2", "same_answer_fraction", "hacking_alarms")
def series(path):
    return [tuple(r["train/" + k] for k in signals) for r in map(json.loads, open(path)) if "train/score" in r]
straight, resumed = series(sys.argv[1]), series(sys.argv[2])
sys.exit(0 if len(straight) == 12 and straight == resumed else 1)
PYEOF2
    pass hacking_alarms_resume || fail hacking_alarms_resume "$(tail -n 2 "$tmp/command_resumed.err")"
# Win rates against the starting policy: each evaluation's eval/win_rate is the share of the
# held-out prompts whose reward beats iteration 0's (ties half), recomputed from the samples
# files; null at iteration 0; the resumed run (which reads iteration 0's scores back from its
# samples file) logs the same final win rate.
python3 - "$tmp/command" "$tmp/command_resumed" << 'PYEOF2' &&
import json, os, sys
def rewards(path):
    return [json.loads(l)["reward"] for l in open(path)]
def evals(run):
    return {r["step"]: r for r in map(json.loads, open(os.path.join(run, "metrics.jsonl"))) if "eval/score" in r}
run = sys.argv[1]
first = rewards(os.path.join(run, "samples/eval-000000.jsonl"))
rows = evals(run)
ok = rows[0]["eval/win_rate"] is None and rows[0]["eval/gold_win_rate"] is None
checked = 0
for step, row in rows.items():
    if step == 0:
        continue
    name = "final.jsonl" if step == max(rows) else f"eval-{step:06d}.jsonl"
    now = rewards(os.path.join(run, "samples", name))
    want = sum(1.0 if a > b else 0.5 if a == b else 0.0 for a, b in zip(now, first)) / len(first)
    ok &= len(now) == len(first) and abs(row["eval/win_rate"] - want) < 1e-9 and row["eval/gold_win_rate"] is None
    checked += 1
resumed = evals(sys.argv[2])
ok &= checked > 0 and resumed[max(resumed)]["eval/win_rate"] == rows[max(rows)]["eval/win_rate"]
print("win rates", [(s, r["eval/win_rate"]) for s, r in rows.items()], file=sys.stderr)
sys.exit(0 if ok else 1)
PYEOF2
    pass eval_win_rate || fail eval_win_rate "see above"
# --eval-samples-per-prompt 3 (TRL's num_generations_eval): each eval prompt answered 3 times
# (rows "sample" 0, 1, 2 of the prompt), eval/score their mean, eval/best_of_n the mean of each
# prompt's best, both recomputed from the samples file; the win rates pair each row with
# iteration 0's same row.
run eval_three --eval-samples-per-prompt 3 --max-iterations 2 --termination-condition token
python3 - "$tmp/eval_three" << 'PYEOF2' &&
import json, os, sys
run = sys.argv[1]
rows = {r["step"]: r for r in map(json.loads, open(os.path.join(run, "metrics.jsonl"))) if "eval/score" in r}
ok = True
for step, metrics in rows.items():
    name = "final.jsonl" if step == max(rows) else f"eval-{step:06d}.jsonl"
    samples = [json.loads(l) for l in open(os.path.join(run, "samples", name))]
    ok &= len(samples) == 12 and [s["sample"] for s in samples] == [0, 1, 2] * 4
    ok &= all(samples[3 * q]["prompt"] == samples[3 * q + k]["prompt"] for q in range(4) for k in range(3))
    rewards = [s["reward"] for s in samples]
    best = sum(max(rewards[3 * q:3 * q + 3]) for q in range(4)) / 4
    ok &= abs(metrics["eval/score"] - sum(rewards) / 12) < 1e-5 and abs(metrics["eval/best_of_n"] - best) < 1e-5
    ok &= metrics["eval/best_of_n"] >= metrics["eval/score"]
print("eval (score, best of 3)", [(r["eval/score"], r["eval/best_of_n"]) for r in rows.values()], file=sys.stderr)
sys.exit(0 if ok and rows[max(rows)]["eval/win_rate"] is not None else 1)
PYEOF2
    pass eval_samples_per_prompt || fail eval_samples_per_prompt "$(tail -n 2 "$tmp/eval_three.err")"
# --stop-on-alarm: the same run stops before training on the first iteration whose responses
# set off an alarm (K, from the run above), resumed from its last checkpoint before K so that
# only the iterations up to K are run again: exit status 3, one line naming K and that
# checkpoint, the metrics of iterations 1 .. K-1 the uninterrupted run's, no row for K, no
# final model and no checkpoint after K-1.
stop_at=$(python3 -c "import json,sys; a=[json.loads(l)['train/hacking_alarms'] for l in open(sys.argv[1]) if 'train/score' in l]; print(1 + [x > 0 for x in a].index(True))" "$tmp/command/metrics.jsonl")
resume_from=$(( (stop_at - 1) / 3 * 3 ))
rm -rf "$tmp/command_stop" && mkdir -p "$tmp/command_stop"
if [ "$resume_from" -gt 0 ]; then
    cp -r "$tmp/command/checkpoint-$resume_from" "$tmp/command/metrics.jsonl" "$tmp/command_stop/"
fi
status=0
"$bin" ppo "${common[@]}" "${command_args[@]}" --max-iterations 12 --num-train-epochs 2 --output "$tmp/command_stop" \
    --alarm-distinct-ratio 0.99 --save-every 3 --keep-last 0 --resume --stop-on-alarm \
    --reward-command "python3 $tmp/reward.py $tmp/requests_stop.jsonl" 2> "$tmp/command_stop.err" || status=$?
python3 - "$tmp/command/metrics.jsonl" "$tmp/command_stop/metrics.jsonl" "$stop_at" << 'PYEOF2' &&
import json, sys
def rows(path):
    return [r for r in map(json.loads, open(path)) if "train/score" in r]
straight, stopped, k = rows(sys.argv[1]), rows(sys.argv[2]), int(sys.argv[3])
drop = ("train/time_generation", "train/time_experience", "train/time_training", "train/generation_tokens_per_s", "time")
same = [{key: v for key, v in r.items() if key not in drop} for r in straight[:k - 1]]
sys.exit(0 if [{key: v for key, v in r.items() if key not in drop} for r in stopped] == same else 1)
PYEOF2
[ "$status" = 3 ] && [ ! -e "$tmp/command_stop/final" ] &&
    grep -q "ppo: stopped at iteration $stop_at by --stop-on-alarm (" "$tmp/command_stop.err" &&
    { [ "$resume_from" = 0 ] || grep -q "continues from .*checkpoint-$resume_from\$" "$tmp/command_stop.err"; } &&
    [ -z "$(ls -d "$tmp/command_stop"/checkpoint-* 2> /dev/null | awk -F- -v k="$stop_at" '$NF >= k')" ] &&
    pass "stop_on_alarm (iteration $stop_at, status $status)" ||
    fail stop_on_alarm "status $status, $(tail -n 2 "$tmp/command_stop.err")"
expect_error stop_on_alarm_without_alarms "--stop-on-alarm" "$bin" ppo "${common[@]}" --output "$tmp/x" --stop-on-alarm \
    --alarm-length-ratio 0 --alarm-distinct-ratio 0 --alarm-fraction-rise 0 --alarm-score-quantile 0
# The reward-range alarm: marlhf rm wrote reward_stats.json (its scores of its data's pairs)
# into its final folder; an iteration whose mean raw score is above the --alarm-score-quantile
# of those chosen scores sets it off (the other alarms off here, so the logged count is this
# one alone): with the real file, on exactly where train/raw_score is above the quantile
# recomputed from the file; with the file's scores replaced by -1000 it is on from the first
# iteration, with its warning line; a malformed file is refused naming it.
no_signal_alarms=(--alarm-length-ratio 0 --alarm-distinct-ratio 0 --alarm-fraction-rise 0)
"$bin" ppo "${common[@]}" "${no_signal_alarms[@]}" --alarm-score-quantile 0.2 --output "$tmp/score_range" \
    2> "$tmp/score_range.err" || fail score_range_runs "$(tail -n 2 "$tmp/score_range.err")"
rm -rf "$tmp/rm_low" "$tmp/rm_bad" && cp -r "$tmp/rm/final" "$tmp/rm_low" && cp -r "$tmp/rm/final" "$tmp/rm_bad"
python3 -c "import json, sys; s = json.load(open(sys.argv[1])); s['chosen'] = [-1000.0] * len(s['chosen']); json.dump(s, open(sys.argv[1], 'w'))" \
    "$tmp/rm_low/reward_stats.json"
"$bin" ppo "${common[@]}" "${no_signal_alarms[@]}" --reward-model "$tmp/rm_low" --max-iterations 2 --output "$tmp/score_low" \
    2> "$tmp/score_low.err" || fail score_range_runs "$(tail -n 2 "$tmp/score_low.err")"
python3 - "$tmp/rm/final/reward_stats.json" "$tmp/score_range/metrics.jsonl" "$tmp/score_low/metrics.jsonl" \
    "$tmp/score_low.err" "$tmp/rm_low/reward_stats.json" << 'PYEOF2' &&
import json, math, sys
stats = json.load(open(sys.argv[1]))
chosen = sorted(stats["chosen"])
limit = chosen[max(math.ceil(0.2 * len(chosen)), 1) - 1]
rows = [r for r in map(json.loads, open(sys.argv[2])) if "train/score" in r]
ok = stats["source"] == "train" and len(rows) == 3
ok &= all(r["train/hacking_alarms"] == (1 if r["train/raw_score"] > limit else 0) for r in rows)
low = [r["train/hacking_alarms"] for r in map(json.loads, open(sys.argv[3])) if "train/score" in r]
text = open(sys.argv[4]).read()
ok &= low == [1, 1] and text.count("possible reward hacking") == 1
ok &= f"iteration 1: possible reward hacking or collapse: mean reward-model score " in text
ok &= f"above the 0.99 quantile of its scores of the preferred answers of its own data, -1000 ({sys.argv[5]}; --alarm-score-quantile 0.99)" in text
print([(r["train/raw_score"], r["train/hacking_alarms"]) for r in rows], "limit", limit, low, file=sys.stderr)
sys.exit(0 if ok else 1)
PYEOF2
    pass "score_range_alarm" || fail score_range_alarm "$(grep -m1 'reward-model score' "$tmp/score_low.err")"
echo '{"chosen": "high"}' > "$tmp/rm_bad/reward_stats.json"
expect_error score_range_bad_stats "$tmp/rm_bad/reward_stats.json" "$bin" ppo "${common[@]}" --reward-model "$tmp/rm_bad" \
    --output "$tmp/x"
expect_error bad_alarm_score_quantile "--alarm-score-quantile" "$bin" ppo "${common[@]}" --output "$tmp/x" \
    --alarm-score-quantile 1.5
expect_error bad_alarm_length_ratio "--alarm-length-ratio" "$bin" ppo "${common[@]}" --output "$tmp/x" --alarm-length-ratio 0.5
expect_error bad_alarm_distinct_ratio "--alarm-distinct-ratio" "$bin" ppo "${common[@]}" --output "$tmp/x" \
    --alarm-distinct-ratio 1
expect_error bad_alarm_fraction_rise "--alarm-fraction-rise" "$bin" ppo "${common[@]}" --output "$tmp/x" \
    --alarm-fraction-rise -0.1
expect_error command_reward_nonsense "not a finite number" "$bin" ppo "${common[@]}" "${command_args[@]}" --output "$tmp/x" \
    --reward-command "while read line; do echo lots; done"
expect_error command_reward_exits "exited" "$bin" ppo "${common[@]}" "${command_args[@]}" --output "$tmp/x" --reward-command true
expect_error command_reward_hangs "no answer within 0.5 s" "$bin" ppo "${common[@]}" "${command_args[@]}" --output "$tmp/x" \
    --reward-command "sleep 30" --reward-timeout 0.5
expect_error command_reward_missing "--reward-command" "$bin" ppo "${common[@]}" --output "$tmp/x" --reward command
expect_error command_reward_unused "--reward-command" "$bin" ppo "${common[@]}" --output "$tmp/x" --reward-command cat
expect_error command_reward_bad_timeout "--reward-timeout" "$bin" ppo "${common[@]}" "${command_args[@]}" --output "$tmp/x" \
    --reward-timeout 0
# Several reward sources (TRL's reward_funcs and reward_weights): the reward model and the
# command above, 1 and 0.5. The first rollout is each one-source run's (the same seed and
# weights): its per-source means are their raw scores to the bit, and its raw score their
# weighted sum; the training is another.
mixed=(--prompts "$tmp/target_prompts.jsonl" --advantage-estimator grpo --samples-per-prompt 4 --termination-condition token
       --max-iterations 2)
"$bin" ppo "${common[@]}" "${mixed[@]}" --reward model --output "$tmp/mixed_model" 2> "$tmp/mixed_model.err"
"$bin" ppo "${common[@]}" "${mixed[@]}" --reward command --reward-command "python3 $tmp/reward.py /dev/null" \
    --output "$tmp/mixed_command" 2> "$tmp/mixed_command.err"
"$bin" ppo "${common[@]}" "${mixed[@]}" --reward model,command --reward-weights 1,0.5 \
    --reward-command "python3 $tmp/reward.py /dev/null" --output "$tmp/mixed" 2> "$tmp/mixed.err"
python3 - "$tmp" << 'PYEOF2' &&
import json, sys
def rows(name):
    return [r for r in map(json.loads, open(f"{sys.argv[1]}/{name}/metrics.jsonl")) if "train/score" in r]
model, command, mixed = rows("mixed_model"), rows("mixed_command"), rows("mixed")
m = mixed[0]
print(f"raw score {m['train/raw_score']} = {m['train/reward_model']} + 0.5 x {m['train/reward_command']}; "
      f"one-source runs {model[0]['train/raw_score']}, {command[0]['train/raw_score']}", file=sys.stderr)
ok = m["train/reward_model"] == model[0]["train/raw_score"] and m["train/reward_command"] == command[0]["train/raw_score"]
ok &= abs(m["train/raw_score"] - (m["train/reward_model"] + 0.5 * m["train/reward_command"])) < 1e-6
ok &= m["train/reward_command"] > 0 and "train/reward_model" not in model[0]
sys.exit(0 if ok else 1)
PYEOF2
    ! cmp -s "$tmp/mixed/final/actor/model.safetensors" "$tmp/mixed_model/final/actor/model.safetensors" &&
    pass ppo_reward_sources_weighted || fail ppo_reward_sources_weighted "$(tail -n 2 "$tmp/mixed.err")"
# GDPO (TRL's multi_objective_aggregation="normalize_then_sum"): the same first rollout and raw
# scores as the weighted sum's, but each source normalised within its group before the sum, so
# the iteration's mean score is 0 (every group's normalised scores sum to 0), and another training.
"$bin" ppo "${common[@]}" "${mixed[@]}" --reward model,command --reward-weights 1,0.5 \
    --reward-command "python3 $tmp/reward.py /dev/null" --multi-objective-aggregation normalize_then_sum \
    --output "$tmp/gdpo" 2> "$tmp/gdpo.err"
python3 - "$tmp" << 'PYEOF2' &&
import json, sys
def rows(name):
    return [r for r in map(json.loads, open(f"{sys.argv[1]}/{name}/metrics.jsonl")) if "train/score" in r]
mixed, gdpo = rows("mixed"), rows("gdpo")
print(f"GDPO first iteration: score {gdpo[0]['train/score']}, raw {gdpo[0]['train/raw_score']} "
      f"(sum: score {mixed[0]['train/score']}, raw {mixed[0]['train/raw_score']})", file=sys.stderr)
ok = len(gdpo) == 2 and gdpo[0]["train/raw_score"] == mixed[0]["train/raw_score"]
ok &= gdpo[0]["train/reward_model"] == mixed[0]["train/reward_model"]
ok &= all(abs(r["train/score"]) < 1e-6 for r in gdpo) and abs(mixed[0]["train/score"]) > 1e-3
sys.exit(0 if ok else 1)
PYEOF2
    ! cmp -s "$tmp/gdpo/final/actor/model.safetensors" "$tmp/mixed/final/actor/model.safetensors" &&
    pass ppo_gdpo_normalize_then_sum || fail ppo_gdpo_normalize_then_sum "$(tail -n 2 "$tmp/gdpo.err")"
expect_error ppo_gdpo_bad_value "--multi-objective-aggregation must be sum_then_normalize or normalize_then_sum" \
    "$bin" ppo "${common[@]}" --multi-objective-aggregation mean --output "$tmp/x"
expect_error ppo_gdpo_not_grpo "--multi-objective-aggregation normalize_then_sum applies to --advantage-estimator grpo" \
    "$bin" ppo "${common[@]}" --multi-objective-aggregation normalize_then_sum --output "$tmp/x"
expect_error ppo_gdpo_scale_rewards "--scale-rewards" "$bin" ppo "${common[@]}" "${mixed[@]}" \
    --multi-objective-aggregation normalize_then_sum --scale-rewards batch --output "$tmp/x"
expect_error ppo_gdpo_normalize_reward "--normalize-reward" "$bin" ppo "${common[@]}" "${mixed[@]}" \
    --multi-objective-aggregation normalize_then_sum --normalize-reward --output "$tmp/x"
expect_error ppo_reward_sources_twice "--reward names model twice" "$bin" ppo "${common[@]}" --reward model,model \
    --output "$tmp/x"
expect_error ppo_reward_sources_unknown "--reward must be model, lexicon" "$bin" ppo "${common[@]}" --reward model,rm \
    --output "$tmp/x"
expect_error ppo_reward_weights_count "--reward-weights must be 2 numbers" "$bin" ppo "${common[@]}" \
    --reward model,lexicon --gold-lexicon data/austen/lexicon.tsv --reward-weights 1 --output "$tmp/x"
expect_error ppo_reward_weights_garbage "--reward-weights must be 1 number" "$bin" ppo "${common[@]}" \
    --reward-weights x --output "$tmp/x"
# Macro actions still shape the ratio (--ratio macro) without a critic; MA-GRPO runs.
run grpo_macro --advantage-estimator grpo --samples-per-prompt 2 --termination-condition fixed --ngram 3 --ratio macro
[ -f "$tmp/grpo_macro/final/actor/model.safetensors" ] && pass grpo_macro_ratio || fail grpo_macro_ratio "$(tail -n 3 "$tmp/grpo_macro.err")"
killed_then_resumed grpo 6 --advantage-estimator grpo --samples-per-prompt 2 --max-iterations 12 --num-train-epochs 4
expect_error grpo_resume_other_estimator "--advantage-estimator" "$bin" ppo "${common[@]}" --advantage-estimator rloo \
    --samples-per-prompt 2 --max-iterations 12 --num-train-epochs 4 --save-every 1 --output "$tmp/grpo_killed" --resume
expect_error grpo_one_sample "--samples-per-prompt" "$bin" ppo "${common[@]}" --output "$tmp/x" --advantage-estimator grpo
expect_error dr_grpo_one_sample "--samples-per-prompt" "$bin" ppo "${common[@]}" --output "$tmp/x" --advantage-estimator dr-grpo
expect_error grpo_critic_model "--critic-model" "$bin" ppo "${common[@]}" --output "$tmp/x" --advantage-estimator grpo \
    --samples-per-prompt 2 --critic-model "$model"
expect_error grpo_critic_lora "--critic-lora-rank" "$bin" ppo "${common[@]}" --output "$tmp/x" --advantage-estimator rloo \
    --samples-per-prompt 2 --critic-lora-rank 4
expect_error baseline_one_sample "--samples-per-prompt" "$bin" ppo "${common[@]}" --output "$tmp/x" \
    --advantage-estimator reinforce++-baseline
expect_error bad_samples_per_prompt "--samples-per-prompt" "$bin" ppo "${common[@]}" --output "$tmp/x" --samples-per-prompt 0
expect_error bad_estimator "--advantage-estimator" "$bin" ppo "${common[@]}" --output "$tmp/x" --advantage-estimator ppo

expect_error bad_termination "--termination-condition" "$bin" ppo "${common[@]}" --output "$tmp/x" --termination-condition words
expect_error bad_ngram "--ngram" "$bin" ppo "${common[@]}" --output "$tmp/x" --ngram 0
expect_error bad_min_new_tokens "--min-new-tokens" "$bin" ppo "${common[@]}" --output "$tmp/x" --min-new-tokens -1
expect_error bad_value_function "--value-function" "$bin" ppo "${common[@]}" --output "$tmp/x" --value-function median
expect_error missing_reward "--reward-model" "$bin" ppo --actor-model "$model" --prompts "$data/sft.jsonl" --output "$tmp/x"
# The reward model, critic and reference read the actor's token ids: one of another tokenizer
# (SmolLM2's 49,152 ids against the tiny model's 1,001) is refused, naming its option.
smollm2=models/SmolLM2-135M-Instruct.Q4_1.gguf
expect_error reward_model_other_tokenizer "id 0 is \"<|endoftext|>\" there and \"<|begin_of_text|>\" here (49152 and 1001 ids) (--reward-model)" \
    "$bin" ppo "${common[@]}" --output "$tmp/x" --reward-model "$smollm2"
expect_error critic_model_other_tokenizer "(--critic-model)" "$bin" ppo "${common[@]}" --output "$tmp/x" --critic-model "$smollm2"
expect_error reference_model_other_tokenizer "(--reference-model)" "$bin" ppo "${common[@]}" --output "$tmp/x" \
    --reference-model "$smollm2"
# The actor's context (a GPT-2 of 64 learned positions): answers stop there however many new
# tokens are asked, and PTX rows are cut to it (both ended in an internal error before).
python3 tests/cli/tiny_gpt2_model.py tests/fixtures/models/gpt2 "$model" "$tmp/gpt2_64" 2> /dev/null
python3 -c "
import json
for i in range(4): print(json.dumps({'prompt': 'Tell me ' + 'about the cat ' * 10, 'response': ' The cat is good.' * 10}))
" > "$tmp/long_ptx.jsonl"
"$bin" rm --model "$tmp/gpt2_64" --data "$data/pairs.jsonl" --max-seq-len 32 --per-device-train-batch-size 8 \
    --learning-rate 3e-3 --max-steps 2 --output "$tmp/gpt2_64_rm" --quiet --threads 2 2> /dev/null
"$bin" ppo --actor-model "$tmp/gpt2_64" --reward-model "$tmp/gpt2_64_rm/final" --prompts "$data/sft.jsonl" \
    --rollout-batch-size 4 --generation-batch-size 4 --micro-batch-size 2 --max-new-tokens 100 --max-iterations 1 \
    --ptx-data "$tmp/long_ptx.jsonl" --ptx-coef 0.5 --quiet --threads 2 --output "$tmp/gpt2_64_ppo" 2> "$tmp/gpt2_64_ppo.err"
python3 -c "
import json, sys
rows = [r for r in map(json.loads, open(sys.argv[1])) if 'train/response_length' in r]
sys.exit(0 if len(rows) == 1 and 0 < rows[0]['train/response_length'] < 64 else 1)" "$tmp/gpt2_64_ppo/metrics.jsonl" 2> /dev/null &&
    pass ppo_answers_stop_at_the_actor_context || fail ppo_answers_stop_at_the_actor_context "$(tail -n 2 "$tmp/gpt2_64_ppo.err")"
[ "$failures" -eq 0 ]
