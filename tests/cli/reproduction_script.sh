#!/usr/bin/env bash
# scripts/reproduction end to end on the tiny model (tests/fixtures/models/tiny_chat as the
# SFT model, a reward model trained here): 7 methods x 2 seeds of 2 iterations, the summary
# table with one row per method, every run's macro actions as its method says, a second run
# of the script skipping every finished run, a deleted run run again to the same weights;
# bad options.
# Prints PASS/FAIL per case.
set -u
cd "$(dirname "$0")/../.."
bin=${MARLHF_BIN:-build/marlhf}
tmp=${MARLHF_TEST_TMP:-/tmp}/cli_reproduction_script
rm -rf "$tmp" && mkdir -p "$tmp"
case "$tmp" in /*) ;; *) tmp=$PWD/$tmp ;; esac
model=tests/fixtures/models/tiny_chat
failures=0
. tests/cli_helpers.sh
export MARLHF_BIN=$bin

"$bin" rm --model "$model" --data tests/fixtures/train/pairs.jsonl --max-seq-len 32 --per-device-train-batch-size 8 \
    --learning-rate 3e-3 --max-steps 4 --output "$tmp/rm" --quiet --threads 1 2> "$tmp/rm.err" ||
    fail reward_model "$(tail -n 2 "$tmp/rm.err")"

study=$tmp/study
scripts/reproduction --sft "$model" --rm "$tmp/rm/final" --seeds "1 2" --iterations 2 --out "$study" \
    > "$tmp/first.out" 2> "$tmp/first.err"
rc=$?
[ $rc -eq 0 ] && pass study_runs || fail study_runs "exit $rc: $(tail -n 3 "$tmp/first.err")"
finals=$(ls -d "$study"/*/seed*/final 2> /dev/null | wc -l)
[ "$finals" -eq 14 ] && pass study_all_runs_finished || fail study_all_runs_finished "$finals final folders, want 14"
checkpoints=$(ls -d "$study"/*/seed*/checkpoint-* 2> /dev/null | wc -l)
[ "$checkpoints" -eq 0 ] && pass study_checkpoints_dropped || fail study_checkpoints_dropped "$checkpoints left"
rows=$(grep -c '^| \(Vanilla PPO\|MA-PPO\) ' "$study/summary/summary.md")
[ "$rows" -eq 14 ] && pass study_summary_rows || fail study_summary_rows "$rows rows, want 7 per table"
for figure in heldout_score heldout_gold train_score kl; do
    [ -s "$study/summary/$figure.svg" ] && pass "study_figure_$figure" || fail "study_figure_$figure" "missing"
done
grep -qF "| Vanilla PPO | 2 |" "$study/summary/summary.md" && pass study_two_seeds || fail study_two_seeds "no 2-seed row"

# Each method's runs used its termination condition: PPO's macro actions are single tokens,
# a fixed 3-gram's are longer than one token and at most 3.
macro_length() { # the mean train/macro_action_length of a run
    grep -o '"train/macro_action_length":[0-9.e+-]*' "$study/$1/metrics.jsonl" | cut -d: -f2 |
        awk '{ s += $1; n++ } END { if (n) printf "%.4f", s / n }'
}
ppo=$(macro_length ppo/seed1) fixed3=$(macro_length fixed3/seed1)
[ "$ppo" = "1.0000" ] && pass study_ppo_token_level || fail study_ppo_token_level "macro length $ppo"
awk -v m="$fixed3" 'BEGIN { exit !(m > 1 && m <= 3) }' && pass study_fixed3_macro || fail study_fixed3_macro "macro length $fixed3"
# The seeds differ; the same seed gives one evaluation of the SFT model for every method.
first_eval() { head -n 1 "$study/$1/metrics.jsonl" | grep -o '"eval/score":[^,]*'; }
[ "$(first_eval ppo/seed1)" = "$(first_eval parsing/seed1)" ] && pass study_shared_start || fail study_shared_start "step-0 evaluations differ"
cmp -s "$study/ppo/seed1/final/actor/model.safetensors" "$study/ppo/seed2/final/actor/model.safetensors" &&
    fail study_seeds_differ "seed 1 and 2 gave the same weights" || pass study_seeds_differ

# Again: every run is finished, nothing starts, the summary is the same.
cp "$study/summary/summary.md" "$tmp/summary.first"
scripts/reproduction --sft "$model" --rm "$tmp/rm/final" --seeds "1 2" --iterations 2 --out "$study" \
    > "$tmp/second.out" 2> "$tmp/second.err"
rc=$?
[ $rc -eq 0 ] && ! grep -q ' start ' "$tmp/second.out" && pass study_rerun_skips ||
    fail study_rerun_skips "exit $rc; $(grep -c ' start ' "$tmp/second.out") runs started"
cmp -s "$study/summary/summary.md" "$tmp/summary.first" && pass study_rerun_same_summary || fail study_rerun_same_summary "differs"

# An unfinished run (its final folder gone) runs again and gives the same weights: runs
# are reproducible from the seed.
cp "$study/fixed5/seed2/final/actor/model.safetensors" "$tmp/fixed5_seed2.safetensors"
rm -rf "$study/fixed5/seed2"
scripts/reproduction --sft "$model" --rm "$tmp/rm/final" --seeds "1 2" --iterations 2 --out "$study" \
    > "$tmp/third.out" 2> "$tmp/third.err"
rc=$?
started=$(grep -c ' start ' "$tmp/third.out")
[ $rc -eq 0 ] && [ "$started" -eq 1 ] && pass study_reruns_missing || fail study_reruns_missing "exit $rc, $started started"
cmp -s "$study/fixed5/seed2/final/actor/model.safetensors" "$tmp/fixed5_seed2.safetensors" &&
    pass study_run_reproducible || fail study_run_reproducible "weights differ"

# Bad options: one line naming the option, exit 2, nothing run.
expect_script_error() { # NAME EXPECTED ARGS...
    local name=$1 expected=$2
    shift 2
    scripts/reproduction "$@" > "$tmp/stdout" 2> "$tmp/stderr"
    local rc=$?
    if [ $rc -eq 2 ] && [ "$(wc -l < "$tmp/stderr")" -eq 1 ] && grep -qF -- "$expected" "$tmp/stderr"; then
        pass "$name"
    else
        fail "$name" "exit $rc: $(head -n 2 "$tmp/stderr")"
    fi
}
expect_script_error study_unknown_option "unknown option '--seed'" --seed 3
expect_script_error study_bad_jobs "--jobs must be a positive integer" --jobs 0
expect_script_error study_bad_iterations "--iterations must be a positive integer" --iterations x
expect_script_error study_missing_rm "--rm: no model folder '$tmp/nothing'" --sft "$model" --rm "$tmp/nothing" --out "$tmp/bad"
[ ! -e "$tmp/bad" ] && pass study_bad_writes_nothing || fail study_bad_writes_nothing "$tmp/bad exists"
exit $((failures > 0))
