#!/usr/bin/env bash
# --batch-invariant, the row-invariant CPU forward (docs/lora.md, "One policy"), on the tiny
# model (tests/fixtures/models/tiny_chat): a row's log-probs are the same bits scored alone or
# in a batch with it, and the option, its config-file key and MARLHF_CPU_MATMUL=batch-invariant
# give the same bits; PPO's first iteration is exactly on-policy with it (ratio 1, approx KL 0)
# where it is not without; a checkpoint records the setting and --resume with the other is
# refused (sft's loop and ppo's); the option and the environment disagreeing, the option (or
# the environment) on --device cuda, and a bad MARLHF_CPU_MATMUL are one-line errors; every
# command that runs a model has the option and applies it; the pipeline passes its top-level
# key to each stage. Where OpenBLAS's sgemm happens to give these rows the same bits in every
# batch (another CPU), the cases showing the difference without the option say SKIP.
# Prints PASS/FAIL/SKIP per case.
set -u
cd "$(dirname "$0")/../.."
bin=${MARLHF_BIN:-build/marlhf}
tmp=${MARLHF_TEST_TMP:-/tmp}/cli_batch_invariant
rm -rf "$tmp" && mkdir -p "$tmp"
model=tests/fixtures/models/tiny_chat
data=tests/fixtures/train
failures=0
. tests/cli_helpers.sh

# --- log-probs: alone vs in a batch --------------------------------------------------------
printf '{"ids": [1, 5, 9, 14, 2, 7, 33, 4]}\n{"ids": [3, 8, 2]}\n{"ids": [4, 4, 6, 10, 12]}\n' > "$tmp/ids.jsonl"
logprobs() { # NAME OPTIONS...: the three rows' log-probs into $tmp/NAME.jsonl
    local name=$1
    shift
    "$bin" logprobs --model "$model" --input "$tmp/ids.jsonl" --output "$tmp/$name.jsonl" --threads 2 "$@" \
        2> "$tmp/$name.err" || fail "logprobs_$name" "$(tail -n 1 "$tmp/$name.err")"
}
logprobs sgemm_alone --batch-size 1
logprobs sgemm_batched --batch-size 3
logprobs invariant_alone --batch-size 1 --batch-invariant
logprobs invariant_batched --batch-size 3 --batch-invariant
MARLHF_CPU_MATMUL=batch-invariant logprobs environment_batched --batch-size 3
echo '{"batch-invariant": true, "batch-size": 3}' > "$tmp/logprobs_config.json"
logprobs config_batched --config "$tmp/logprobs_config.json"
same() { cmp -s "$tmp/$1.jsonl" "$tmp/$2.jsonl"; }
if same sgemm_alone sgemm_batched; then
    echo "SKIP rows_depend_on_batch_without_option (sgemm gives these rows the same bits in both batches here)"
else
    pass rows_depend_on_batch_without_option
fi
same invariant_alone invariant_batched && pass rows_same_alone_and_batched_with_option ||
    fail rows_same_alone_and_batched_with_option "log-probs of the rows alone and in a batch of 3 differ"
same invariant_batched environment_batched && same invariant_batched config_batched && pass option_environment_and_config_key_same_bits ||
    fail option_environment_and_config_key_same_bits "--batch-invariant, its config key and MARLHF_CPU_MATMUL differ"

# --- PPO's first iteration -----------------------------------------------------------------
"$bin" rm --model "$model" --data "$data/pairs.jsonl" --max-seq-len 32 --per-device-train-batch-size 8 \
    --learning-rate 3e-3 --max-steps 2 --output "$tmp/rm" --quiet --threads 2 2> "$tmp/rm.err" ||
    fail reward_model "$(tail -n 1 "$tmp/rm.err")"
# The experience pass scores the 8 rollouts in one batch, the PPO epoch in micro-batches of 4
# padded to their own lengths: with sgemm a row's log-probs move in the last bits.
ppo=(--actor-model "$model" --reward-model "$tmp/rm/final" --prompts "$data/sft.jsonl" --rollout-batch-size 8
     --generation-batch-size 8 --micro-batch-size 4 --max-new-tokens 10 --min-response-tokens 1 --quiet --threads 2)
"$bin" ppo "${ppo[@]}" --max-iterations 1 --output "$tmp/ppo_sgemm" 2> "$tmp/ppo_sgemm.err" ||
    fail ppo_sgemm "$(tail -n 1 "$tmp/ppo_sgemm.err")"
"$bin" ppo "${ppo[@]}" --max-iterations 1 --save-every 1 --batch-invariant --output "$tmp/ppo" 2> "$tmp/ppo.err" ||
    fail ppo_invariant "$(tail -n 1 "$tmp/ppo.err")"
first_iteration() { # RUN: "ratio approx_kl clip_fraction" of the first iteration
    python3 -c 'import json, sys
r = [json.loads(l) for l in open(sys.argv[1]) if "train/ratio" in l][0]
print(repr(r["train/ratio"]), repr(r["train/approx_kl"]), repr(r["train/clip_fraction"]))' "$1/metrics.jsonl"
}
sgemm_first=$(first_iteration "$tmp/ppo_sgemm")
invariant_first=$(first_iteration "$tmp/ppo")
[ "$invariant_first" = "1.0 0.0 0.0" ] && pass "ppo_first_iteration_exactly_on_policy_with_option (ratio, approx kl, clip fraction: $invariant_first)" ||
    fail ppo_first_iteration_exactly_on_policy_with_option "ratio, approx kl, clip fraction: $invariant_first"
if [ "$sgemm_first" = "1.0 0.0 0.0" ]; then
    echo "SKIP ppo_first_iteration_not_exact_without_option (sgemm: $sgemm_first)"
else
    pass "ppo_first_iteration_not_exact_without_option ($sgemm_first)"
fi

# --- resume with the other setting: refused, nothing written --------------------------------
python3 -c 'import json, sys; sys.exit(0 if json.load(open(sys.argv[1]))["batch_invariant"] is True else 1)' \
    "$tmp/ppo/checkpoint-1/trainer_state.json" && pass ppo_checkpoint_records_option ||
    fail ppo_checkpoint_records_option "trainer_state.json has no \"batch_invariant\": true"
cp "$tmp/ppo/metrics.jsonl" "$tmp/ppo_metrics_before"
expect_error ppo_resume_other_setting_refused "this run is without it ($tmp/ppo/checkpoint-1)" \
    "$bin" ppo "${ppo[@]}" --max-iterations 2 --save-every 1 --resume --output "$tmp/ppo"
cmp -s "$tmp/ppo/metrics.jsonl" "$tmp/ppo_metrics_before" && [ ! -e "$tmp/ppo/checkpoint-2" ] &&
    pass ppo_refused_resume_writes_nothing || fail ppo_refused_resume_writes_nothing "the run folder changed"
# sft's loop, the option from a --config file this time.
sft=(--model "$model" --data "$data/sft.jsonl" --max-seq-len 32 --per-device-train-batch-size 4 --save-every 1
     --quiet --threads 2 --output "$tmp/sft")
echo '{"batch_invariant": true}' > "$tmp/sft_config.json"
"$bin" sft "${sft[@]}" --max-steps 1 --config "$tmp/sft_config.json" 2> "$tmp/sft.err" ||
    fail sft_invariant "$(tail -n 1 "$tmp/sft.err")"
cp "$tmp/sft/metrics.jsonl" "$tmp/sft_metrics_before"
expect_error sft_resume_other_setting_refused "this run is without it ($tmp/sft/checkpoint-1)" \
    "$bin" sft "${sft[@]}" --max-steps 2 --resume
[ ! -e "$tmp/sft/checkpoint-2" ] && cmp -s "$tmp/sft/metrics.jsonl" "$tmp/sft_metrics_before" &&
    "$bin" sft "${sft[@]}" --max-steps 2 --resume --batch-invariant 2> "$tmp/sft_resumed.err" &&
    [ -d "$tmp/sft/checkpoint-2" ] && pass sft_resume_same_setting_continues ||
    fail sft_resume_same_setting_continues "the refused resume wrote, or the same setting did not continue"
# A checkpoint from before the record (no "batch_invariant" key) is not held against either setting.
python3 -c 'import json, sys
state = json.load(open(sys.argv[1])); del state["batch_invariant"]; json.dump(state, open(sys.argv[1], "w"))' \
    "$tmp/sft/checkpoint-2/trainer_state.json"
cp -r "$tmp/sft" "$tmp/sft_copy"
"$bin" sft "${sft[@]}" --max-steps 3 --resume 2> "$tmp/sft_old.err" && [ -d "$tmp/sft/checkpoint-3" ] &&
    "$bin" sft "${sft[@]}" --max-steps 3 --resume --batch-invariant --output "$tmp/sft_copy" 2>> "$tmp/sft_old.err" &&
    [ -d "$tmp/sft_copy/checkpoint-3" ] && pass sft_resume_unrecorded_checkpoint_either_setting ||
    fail sft_resume_unrecorded_checkpoint_either_setting "$(tail -n 1 "$tmp/sft_old.err")"

# --- bad combinations ----------------------------------------------------------------------
MARLHF_CPU_MATMUL=sgemm expect_error option_and_environment_disagree \
    "option --batch-invariant and MARLHF_CPU_MATMUL=sgemm disagree" \
    "$bin" logprobs --model "$model" --input "$tmp/ids.jsonl" --batch-invariant
MARLHF_CPU_MATMUL=batch-invariant expect_error option_false_and_environment_disagree \
    "option --batch-invariant false and MARLHF_CPU_MATMUL=batch-invariant disagree" \
    "$bin" sft "${sft[@]}" --batch-invariant false
expect_error option_on_cuda_refused "option --batch-invariant: the row-invariant forward is a CPU kernel, --device cuda has none" \
    "$bin" ppo "${ppo[@]}" --batch-invariant --device cuda --output "$tmp/ppo_cuda"
MARLHF_CPU_MATMUL=batch-invariant expect_error environment_on_cuda_refused \
    "MARLHF_CPU_MATMUL=batch-invariant: the row-invariant forward is a CPU kernel, --device cuda has none" \
    "$bin" generate --model "$model" --device cuda hello
MARLHF_CPU_MATMUL=bogus expect_error bad_environment_value "MARLHF_CPU_MATMUL=bogus: expected sgemm or batch-invariant" \
    "$bin" logprobs --model "$model" --input "$tmp/ids.jsonl"

# --- every command that runs a model has the option, and applies it -------------------------
# The disagreement is found right after the options are read, before any file is opened (a
# command without the option fails here too: "unknown option").
"$bin" logprobs --help | grep -q -- '--batch-invariant .*row-invariant CPU forward' && pass option_in_help ||
    fail option_in_help "not in marlhf logprobs --help"
for command in "sft --model x --data x --output x" "rm --model x --data x --output x" "dpo --model x --data x --output x" \
    "kto --model x --data x --output x" "ppo --actor-model x --reward-model x --prompts x --output x" \
    "infer --model x --reward-model x --data x --output x" "logprobs --model x --input x" "generate --model x hello" \
    "chat --model x" "serve --model x"; do
    # shellcheck disable=SC2086 # the words of $command are its arguments
    MARLHF_CPU_MATMUL=sgemm expect_error "${command%% *}_applies_option" "option --batch-invariant and MARLHF_CPU_MATMUL=sgemm" \
        "$bin" $command --batch-invariant
done
# The pipeline's top-level key reaches every stage's options.
echo '{"output": "'"$tmp"'/pipe", "model": "'"$model"'", "batch-invariant": true, "sft": {"data": "x"}, "dpo": {"data": "x"}}' \
    > "$tmp/pipeline.json"
"$bin" pipeline "$tmp/pipeline.json" --dry-run > "$tmp/pipeline.out" 2>&1
[ "$(grep -c '"batch-invariant":true' "$tmp/pipeline.out")" = 2 ] && pass pipeline_key_reaches_stages ||
    fail pipeline_key_reaches_stages "$(head -n 2 "$tmp/pipeline.out")"

echo "$failures failure(s)"
[ "$failures" -eq 0 ]
