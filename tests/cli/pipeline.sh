#!/usr/bin/env bash
# marlhf pipeline on the tiny model: SFT -> RM -> PPO from one file gives the same policy
# as the three commands run by hand (and SFT -> DPO as the two); a second run skips every finished stage; a pipeline
# killed with SIGKILL during PPO and run again ends with the same weights as an
# uninterrupted one; bad pipeline files are one-line errors. Prints PASS/FAIL per case.
set -u
cd "$(dirname "$0")/../.."
bin=${MARLHF_BIN:-build/marlhf}
tmp=${MARLHF_TEST_TMP:-/tmp}/cli_pipeline
rm -rf "$tmp" && mkdir -p "$tmp"
model=tests/fixtures/models/tiny_chat
data=tests/fixtures/train
failures=0
. tests/cli_helpers.sh

write_config() { # write_config FILE OUTPUT PPO_ITERATIONS
    cat > "$1" <<JSON
{"output": "$2", "model": "$model", "threads": 2, "quiet": true,
 "sft": {"data": "$data/sft.jsonl", "max-seq-len": 32, "per-device-train-batch-size": 4,
         "learning-rate": 3e-3, "max-steps": 4},
 "rm": {"data": "$data/pairs.jsonl", "max-seq-len": 32, "per-device-train-batch-size": 8,
        "learning-rate": 3e-3, "max-steps": 4},
 "ppo": {"prompts": "$data/sft.jsonl", "rollout-batch-size": 8, "generation-batch-size": 8,
         "micro-batch-size": 4, "max-new-tokens": 10, "max-iterations": $3, "save-every": 1,
         "actor-learning-rate": 1e-3, "critic-learning-rate": 1e-3, "min-response-tokens": 1,
         "termination-condition": "fixed", "ngram": 5}}
JSON
}

# --- one file runs the three stages -----------------------------------------------------
write_config "$tmp/a.json" "$tmp/a" 3
"$bin" pipeline "$tmp/a.json" 2> "$tmp/a.err"
rc=$?
if [ $rc -eq 0 ] && [ -f "$tmp/a/sft/final/model.safetensors" ] && [ -f "$tmp/a/rm/final/model.safetensors" ] &&
    [ -f "$tmp/a/ppo/final/actor/model.safetensors" ] && [ -f "$tmp/a/ppo.json" ]; then
    pass pipeline_runs
else
    fail pipeline_runs "exit $rc: $(tail -n 3 "$tmp/a.err")"
fi

# --- the same as the three commands by hand ---------------------------------------------
common=(--threads 2 --quiet)
"$bin" sft --model "$model" --data "$data/sft.jsonl" --max-seq-len 32 --per-device-train-batch-size 4 \
    --learning-rate 3e-3 --max-steps 4 --output "$tmp/hand/sft" "${common[@]}" 2> /dev/null
"$bin" rm --model "$tmp/hand/sft/final" --data "$data/pairs.jsonl" --max-seq-len 32 --per-device-train-batch-size 8 \
    --learning-rate 3e-3 --max-steps 4 --output "$tmp/hand/rm" "${common[@]}" 2> /dev/null
"$bin" ppo --actor-model "$tmp/hand/sft/final" --reward-model "$tmp/hand/rm/final" --prompts "$data/sft.jsonl" \
    --rollout-batch-size 8 --generation-batch-size 8 --micro-batch-size 4 --max-new-tokens 10 --max-iterations 3 \
    --save-every 1 --actor-learning-rate 1e-3 --critic-learning-rate 1e-3 --min-response-tokens 1 \
    --termination-condition fixed --ngram 5 --output "$tmp/hand/ppo" "${common[@]}" 2> /dev/null
cmp -s "$tmp/a/ppo/final/actor/model.safetensors" "$tmp/hand/ppo/final/actor/model.safetensors" &&
    cmp -s "$tmp/a/rm/final/model.safetensors" "$tmp/hand/rm/final/model.safetensors" &&
    pass pipeline_equals_commands_by_hand || fail pipeline_equals_commands_by_hand "final weights differ"

# --- a second run skips the finished stages -----------------------------------------------
before=$(stat -c %Y "$tmp/a/ppo/final/actor/model.safetensors")
"$bin" pipeline "$tmp/a.json" 2> "$tmp/again.err"
rc=$?
skipped=$(grep -c 'already finished' "$tmp/again.err")
after=$(stat -c %Y "$tmp/a/ppo/final/actor/model.safetensors")
[ $rc -eq 0 ] && [ "$skipped" = 3 ] && [ "$before" = "$after" ] && pass pipeline_skips_finished_stages ||
    fail pipeline_skips_finished_stages "exit $rc, $skipped skipped"

# --- SIGKILL during PPO, run again: the same weights as without the kill -------------------
write_config "$tmp/straight.json" "$tmp/straight" 16
"$bin" pipeline "$tmp/straight.json" 2> /dev/null
write_config "$tmp/killed.json" "$tmp/killed" 16
setsid "$bin" pipeline "$tmp/killed.json" 2> /dev/null &
pid=$!
for _ in $(seq 1 600); do # wait for PPO's first checkpoint, then kill the whole process group
    ls -d "$tmp"/killed/ppo/checkpoint-* > /dev/null 2>&1 && break
    sleep 0.05
done
kill -9 -- -"$pid" 2> /dev/null
wait "$pid" 2> /dev/null
was_interrupted=$([ -f "$tmp/killed/ppo/final/actor/model.safetensors" ] && echo no || echo yes)
"$bin" pipeline "$tmp/killed.json" 2> "$tmp/resume.err"
rc=$?
if [ "$was_interrupted" = yes ] && [ $rc -eq 0 ] && grep -q 'sft already finished' "$tmp/resume.err" &&
    cmp -s "$tmp/straight/ppo/final/actor/model.safetensors" "$tmp/killed/ppo/final/actor/model.safetensors"; then
    pass pipeline_resumes_after_sigkill
else
    fail pipeline_resumes_after_sigkill "interrupted=$was_interrupted exit $rc: $(tail -n 2 "$tmp/resume.err")"
fi

# --- SFT -> DPO: the same as the two commands by hand --------------------------------------
cat > "$tmp/dpo.json" <<JSON
{"output": "$tmp/d", "model": "$model", "threads": 2, "quiet": true,
 "sft": {"data": "$data/sft.jsonl", "max-seq-len": 32, "per-device-train-batch-size": 4,
         "learning-rate": 3e-3, "max-steps": 4},
 "dpo": {"data": "$data/pairs.jsonl", "max-seq-len": 32, "per-device-train-batch-size": 4,
         "learning-rate": 3e-3, "max-steps": 4}}
JSON
"$bin" pipeline "$tmp/dpo.json" 2> "$tmp/dpo.err"
rc=$?
"$bin" dpo --model "$tmp/hand/sft/final" --data "$data/pairs.jsonl" --max-seq-len 32 --per-device-train-batch-size 4 \
    --learning-rate 3e-3 --max-steps 4 --output "$tmp/hand/dpo" "${common[@]}" 2> /dev/null
[ $rc -eq 0 ] && grep -q "the policy is in $tmp/d/dpo/final" "$tmp/dpo.err" &&
    cmp -s "$tmp/d/dpo/final/model.safetensors" "$tmp/hand/dpo/final/model.safetensors" && pass pipeline_sft_dpo ||
    fail pipeline_sft_dpo "exit $rc: $(tail -n 2 "$tmp/dpo.err")"

# --- SFT -> KTO (the pairs as labelled completions): the same as the two commands by hand ----
python3 -c "import json,sys; c=json.load(open(sys.argv[1])); c['kto']=c.pop('dpo'); c['output']=sys.argv[3]; json.dump(c, open(sys.argv[2],'w'))" \
    "$tmp/dpo.json" "$tmp/kto.json" "$tmp/k"
"$bin" pipeline "$tmp/kto.json" 2> "$tmp/kto.err"
rc=$?
"$bin" kto --model "$tmp/hand/sft/final" --data "$data/pairs.jsonl" --max-seq-len 32 --per-device-train-batch-size 4 \
    --learning-rate 3e-3 --max-steps 4 --output "$tmp/hand/kto" "${common[@]}" 2> /dev/null
[ $rc -eq 0 ] && grep -q "the policy is in $tmp/k/kto/final" "$tmp/kto.err" &&
    cmp -s "$tmp/k/kto/final/model.safetensors" "$tmp/hand/kto/final/model.safetensors" && pass pipeline_sft_kto ||
    fail pipeline_sft_kto "exit $rc: $(tail -n 2 "$tmp/kto.err")"
python3 -c "import json,sys; c=json.load(open(sys.argv[1])); c['kto']={}; json.dump(c, open(sys.argv[2],'w'))" \
    "$tmp/dpo.json" "$tmp/dpo_kto.json"
expect_error pipeline_dpo_and_kto '"kto"' "$bin" pipeline "$tmp/dpo_kto.json"

# --- bad pipeline files ----------------------------------------------------------------------
expect_error pipeline_missing_file "$tmp/none.json" "$bin" pipeline "$tmp/none.json"
printf '{"output": "x",\n "model": }\n' > "$tmp/bad.json"
expect_error pipeline_bad_json "$tmp/bad.json:2" "$bin" pipeline "$tmp/bad.json"
sed 's/"threads": 2/"thread": 2/' "$tmp/a.json" > "$tmp/unknown.json"
expect_error pipeline_unknown_key '"thread"' "$bin" pipeline "$tmp/unknown.json"
python3 -c "import json,sys; c=json.load(open(sys.argv[1])); del c['rm']; json.dump(c, open(sys.argv[2],'w'))" \
    "$tmp/a.json" "$tmp/norm.json"
expect_error pipeline_missing_stage '"rm"' "$bin" pipeline "$tmp/norm.json"
expect_error pipeline_no_file "pipeline file" "$bin" pipeline
python3 -c "import json,sys; c=json.load(open(sys.argv[1])); c['dpo']={}; json.dump(c, open(sys.argv[2],'w'))" \
    "$tmp/a.json" "$tmp/both.json"
expect_error pipeline_dpo_and_ppo '"dpo"' "$bin" pipeline "$tmp/both.json"
# A bad option inside a stage: that stage's own error, then the pipeline stops with exit 2.
python3 -c "import json,sys; c=json.load(open(sys.argv[1])); c['output']=sys.argv[3]; c['sft']['bogus-option']=1; json.dump(c, open(sys.argv[2],'w'))" \
    "$tmp/a.json" "$tmp/stage.json" "$tmp/stage"
"$bin" pipeline "$tmp/stage.json" 2> "$tmp/stage.err"
rc=$?
[ $rc -eq 2 ] && grep -q 'bogus-option' "$tmp/stage.err" && grep -q 'pipeline stopped: stage sft' "$tmp/stage.err" &&
    pass pipeline_stage_error_stops || fail pipeline_stage_error_stops "exit $rc: $(cat "$tmp/stage.err")"

exit $((failures > 0))
