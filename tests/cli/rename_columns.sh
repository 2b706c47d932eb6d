#!/usr/bin/env bash
# --rename-columns (every command that reads data) and sft's --dataset-text-field (TRL's
# dataset_text_field): a file whose fields go by other names trains, scores and answers as
# the same file with the format's own names, bit for bit; a missing field or a malformed
# list is refused naming the file and line, or the option, with exit status 2.
set -u
cd "$(dirname "$0")/../.."
bin=${MARLHF_BIN:-build/marlhf}
tmp=${MARLHF_TEST_TMP:-/tmp}/cli_rename_columns
rm -rf "$tmp" && mkdir -p "$tmp"
model=tests/fixtures/models/tiny_chat
data=tests/fixtures/train
failures=0
. tests/cli_helpers.sh

# rename FILE OUT OLD=NEW...: FILE's rows with each field NEW written as OLD (the reverse of
# what --rename-columns OLD=NEW undoes).
rename() {
    python3 - "$@" << 'PYEOF'
import json, sys
source, out, pairs = sys.argv[1], sys.argv[2], [p.split("=") for p in sys.argv[3:]]
with open(out, "w") as f:
    for line in open(source):
        row = json.loads(line)
        row = {next((old for old, new in pairs if new == key), key): value for key, value in row.items()}
        f.write(json.dumps(row) + "\n")
PYEOF
}
same_losses() { # same_losses NAME RUN_A RUN_B: identical train/loss lines, and some
    local a b
    a=$(grep -o '"train/loss":[^,}]*' "$tmp/$2/metrics.jsonl" 2> /dev/null)
    b=$(grep -o '"train/loss":[^,}]*' "$tmp/$3/metrics.jsonl" 2> /dev/null)
    [ -n "$a" ] && [ "$a" = "$b" ] && pass "$1" || fail "$1" "$(tail -n 2 "$tmp/$3.err")"
}

common=(--model "$model" --max-seq-len 32 --per-device-train-batch-size 4 --learning-rate 3e-3 --max-steps 4
        --threads 2 --quiet)
rename "$data/sft.jsonl" "$tmp/sft_renamed.jsonl" question=prompt answer=response
"$bin" sft "${common[@]}" --data "$data/sft.jsonl" --output "$tmp/sft" 2> "$tmp/sft.err"
"$bin" sft "${common[@]}" --data "$tmp/sft_renamed.jsonl" --rename-columns question=prompt,answer=response \
    --output "$tmp/sft_renamed" 2> "$tmp/sft_renamed.err"
same_losses sft_rename_columns sft sft_renamed

# Language-modeling rows under another field: --dataset-text-field, and the same by --rename-columns.
python3 -c "
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
open(sys.argv[2], 'w').writelines(json.dumps({'text': r['prompt'] + r['response']}) + '\n' for r in rows)
open(sys.argv[3], 'w').writelines(json.dumps({'content': r['prompt'] + r['response'], 'id': i}) + '\n'
                                  for i, r in enumerate(rows))" "$data/sft.jsonl" "$tmp/text.jsonl" "$tmp/content.jsonl"
"$bin" sft "${common[@]}" --data "$tmp/text.jsonl" --output "$tmp/text" 2> "$tmp/text.err"
"$bin" sft "${common[@]}" --data "$tmp/content.jsonl" --dataset-text-field content --output "$tmp/content" \
    2> "$tmp/content.err"
same_losses sft_dataset_text_field text content
"$bin" sft "${common[@]}" --data "$tmp/content.jsonl" --rename-columns content=text --output "$tmp/content_renamed" \
    2> "$tmp/content_renamed.err"
same_losses sft_dataset_text_field_is_a_rename text content_renamed

# Preference pairs with their two responses swapped in the file, swapped back by the renames.
rename "$data/pairs.jsonl" "$tmp/pairs_swapped.jsonl" rejected=chosen chosen=rejected
"$bin" rm "${common[@]}" --data "$data/pairs.jsonl" --output "$tmp/rm" 2> "$tmp/rm.err"
"$bin" rm "${common[@]}" --data "$tmp/pairs_swapped.jsonl" --rename-columns chosen=rejected,rejected=chosen \
    --output "$tmp/rm_swapped" 2> "$tmp/rm_swapped.err"
same_losses rm_rename_columns_swap rm rm_swapped

# PPO's prompts and infer's data.
rename "$data/sft.jsonl" "$tmp/prompts_renamed.jsonl" question=prompt
ppo=(--actor-model "$model" --reward-model "$tmp/rm/final" --rollout-batch-size 4 --generation-batch-size 4
     --micro-batch-size 4 --max-new-tokens 6 --max-iterations 1 --min-response-tokens 1 --quiet --threads 2)
"$bin" ppo "${ppo[@]}" --prompts "$data/sft.jsonl" --output "$tmp/ppo" 2> "$tmp/ppo.err"
"$bin" ppo "${ppo[@]}" --prompts "$tmp/prompts_renamed.jsonl" --rename-columns question=prompt \
    --output "$tmp/ppo_renamed" 2> "$tmp/ppo_renamed.err"
cmp -s "$tmp/ppo/final/actor/model.safetensors" "$tmp/ppo_renamed/final/actor/model.safetensors" &&
    pass ppo_rename_columns || fail ppo_rename_columns "$(tail -n 2 "$tmp/ppo_renamed.err")"
infer=(--model "$model" --reward-model "$tmp/rm/final" --count 4 --max-new-tokens 6 --threads 2 --quiet)
"$bin" infer "${infer[@]}" --data "$data/sft.jsonl" --output "$tmp/infer.jsonl" 2> "$tmp/infer.err"
"$bin" infer "${infer[@]}" --data "$tmp/prompts_renamed.jsonl" --rename-columns question=prompt \
    --output "$tmp/infer_renamed.jsonl" 2> "$tmp/infer_renamed.err"
[ -s "$tmp/infer.jsonl" ] && cmp -s "$tmp/infer.jsonl" "$tmp/infer_renamed.jsonl" &&
    pass infer_rename_columns || fail infer_rename_columns "$(tail -n 2 "$tmp/infer_renamed.err")"

# Bad input: exit 2, one line, nothing trained.
expect_error rename_columns_missing_field "no field \"answer\" to rename to \"response\" (--rename-columns; $data/sft.jsonl:1)" \
    "$bin" sft "${common[@]}" --data "$data/sft.jsonl" --rename-columns answer=response --output "$tmp/x"
expect_error rename_columns_taken_name "has a field \"prompt\" already" \
    "$bin" sft "${common[@]}" --data "$data/sft.jsonl" --rename-columns response=prompt --output "$tmp/x"
expect_error rename_columns_malformed "option --rename-columns must be old=new pairs" \
    "$bin" rm "${common[@]}" --data "$data/pairs.jsonl" --rename-columns chosen --output "$tmp/x"
expect_error rename_columns_ppo_malformed "option --rename-columns must be old=new pairs" \
    "$bin" ppo "${ppo[@]}" --prompts "$data/sft.jsonl" --rename-columns =prompt --output "$tmp/x"
expect_error rename_columns_ppo_missing "no field \"question\"" \
    "$bin" ppo "${ppo[@]}" --prompts "$data/sft.jsonl" --rename-columns question=prompt --output "$tmp/x"
expect_error rename_columns_infer_missing "no field \"question\"" \
    "$bin" infer "${infer[@]}" --data "$data/sft.jsonl" --rename-columns question=prompt --output "$tmp/x.jsonl"
expect_error dataset_text_field_empty "--dataset-text-field must name a field" \
    "$bin" sft "${common[@]}" --data "$tmp/content.jsonl" --dataset-text-field "" --output "$tmp/x"
expect_error dataset_text_field_missing "no field \"body\" to rename to \"text\"" \
    "$bin" sft "${common[@]}" --data "$tmp/content.jsonl" --dataset-text-field body --output "$tmp/x"
[ ! -e "$tmp/x" ] && [ ! -e "$tmp/x.jsonl" ] && pass rename_columns_errors_write_nothing ||
    fail rename_columns_errors_write_nothing "$(ls "$tmp/x"* 2>&1)"
[ "$failures" -eq 0 ]
