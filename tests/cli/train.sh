#!/usr/bin/env bash
# The SFT and reward-model trainers end to end on a tiny model (tests/fixtures/models/
# tiny_chat): they learn, write metrics and checkpoints, resume exactly after SIGKILL, and
# reject bad data and options. Prints PASS/FAIL per case.
set -u
cd "$(dirname "$0")/../.."
bin=${MARLHF_BIN:-build/marlhf}
tmp=${MARLHF_TEST_TMP:-/tmp}/cli_train
rm -rf "$tmp" && mkdir -p "$tmp"
model=tests/fixtures/models/tiny_chat
data=tests/fixtures/train
failures=0
. tests/cli_helpers.sh

sft_args=(--model "$model" --data "$data/sft.jsonl" --eval-data "$data/sft_eval.jsonl" --max-seq-len 32
          --per-device-train-batch-size 4 --gradient-accumulation-steps 2 --learning-rate 3e-3 --num-train-epochs 4
          --warmup-ratio 0.1 --threads 2 --quiet)

# --- SFT learns, logs and saves ------------------------------------------------------
"$bin" sft "${sft_args[@]}" --output "$tmp/sft" --eval-every 6 2> "$tmp/sft.err"
rc=$?
if [ $rc -eq 0 ] && [ -f "$tmp/sft/final/model.safetensors" ] && [ -f "$tmp/sft/final/tokenizer.json" ]; then pass sft_runs; else fail sft_runs "exit $rc: $(tail -n 3 "$tmp/sft.err")"; fi
steps=$(grep -c '"train/loss"' "$tmp/sft/metrics.jsonl" 2>/dev/null)
[ "$steps" = 24 ] && pass sft_metrics_per_step || fail sft_metrics_per_step "$steps train lines"
first=$(json_field "$tmp/sft/metrics.jsonl" eval/loss 0 2>/dev/null); last=$(json_field "$tmp/sft/metrics.jsonl" eval/loss -1 2>/dev/null)
python3 -c "import sys; sys.exit(0 if float(sys.argv[2]) < 0.75 * float(sys.argv[1]) else 1)" "$first" "$last" 2>/dev/null &&
    pass "sft_learns (eval loss $first -> $last)" || fail sft_learns "eval loss $first -> $last"
ls "$tmp"/sft/events.out.tfevents.* > /dev/null 2>&1 && pass sft_tensorboard_file || fail sft_tensorboard_file "none"
[ "$(ls -d "$tmp"/sft/checkpoint-* | wc -l)" -ge 1 ] && pass sft_checkpoint || fail sft_checkpoint "none"
echo '{"ids": [1, 2, 3]}' > "$tmp/ids.jsonl"
"$bin" logprobs --model "$tmp/sft/final" --input "$tmp/ids.jsonl" > /dev/null 2>&1 && pass sft_final_loads || fail sft_final_loads "logprobs failed"

# --- which tokens SFT trains ---------------------------------------------------------
# The first step's loss (before any update) is the mean negative log-prob, by `marlhf
# logprobs` on the same ids ([BOS] prompt response [EOS], each part tokenized on its own),
# over the trained tokens of both rows of the batch (of unequal lengths: the padding never
# counts): the response and EOS by default; every token after the first with
# --completion-only-loss false; for TRL's language-modeling {"text"} rows, the whole text
# and EOS either way.
printf '%s\n' '{"prompt": "Tell me about the goat.", "response": " The goat is a good animal."}' \
    '{"prompt": "Name a colour.", "response": " Blue, like the sky over the sea."}' > "$tmp/pr.jsonl"
printf '%s\n' '{"text": "Once upon a time a goat lived on a hill.", "source": "tale"}' \
    '{"text": "The cow is a lovely animal."}' > "$tmp/text.jsonl"
python3 - "$tmp" << 'EOF'
import json, sys
tmp = sys.argv[1]
rows = [json.loads(l) for l in open(f"{tmp}/pr.jsonl")] + [json.loads(l) for l in open(f"{tmp}/text.jsonl")]
with open(f"{tmp}/parts.jsonl", "w") as parts:
    for r in rows:
        parts.write(json.dumps({"text": r.get("prompt", "")}) + "\n")
        parts.write(json.dumps({"text": r.get("response", r.get("text"))}) + "\n")
EOF
"$bin" tokenize --model "$model" --input "$tmp/parts.jsonl" --add-bos > "$tmp/parts_bos.jsonl" &&
    "$bin" tokenize --model "$model" --input "$tmp/parts.jsonl" > "$tmp/parts_plain.jsonl" &&
    printf '{"text": "<|end_of_text|>"}\n' | "$bin" tokenize --model "$model" --input - > "$tmp/eos.jsonl" ||
    fail sft_loss_tokens "tokenize failed"
python3 - "$tmp" << 'EOF'
import json, sys
tmp = sys.argv[1]
bos_ids = [json.loads(l)["ids"] for l in open(f"{tmp}/parts_bos.jsonl")]
plain_ids = [json.loads(l)["ids"] for l in open(f"{tmp}/parts_plain.jsonl")]
eos = json.loads(open(f"{tmp}/eos.jsonl").readline())["ids"]
assert len(eos) == 1, eos
prompt_lengths = []
with open(f"{tmp}/loss_ids.jsonl", "w") as out:
    for k in range(0, len(bos_ids), 2):  # the prompt with the special tokens, the response without, then EOS
        out.write(json.dumps({"ids": bos_ids[k] + plain_ids[k + 1] + eos}) + "\n")
        prompt_lengths.append(len(bos_ids[k]))
json.dump(prompt_lengths, open(f"{tmp}/prompt_lengths.json", "w"))
EOF
"$bin" logprobs --model "$model" --input "$tmp/loss_ids.jsonl" --threads 2 > "$tmp/loss_logprobs.jsonl" 2> "$tmp/loss.err" ||
    fail sft_loss_tokens "logprobs: $(tail -n 1 "$tmp/loss.err")"
sft_first_loss() { # sft_first_loss NAME DATA [OPTIONS...]: the first step's train/loss
    "$bin" sft --model "$model" --data "$2" --max-seq-len 48 --per-device-train-batch-size 2 --max-steps 1 \
        --threads 2 --quiet "${@:3}" --output "$tmp/loss_$1" 2> "$tmp/loss_$1.err" &&
        json_field "$tmp/loss_$1/metrics.jsonl" train/loss 0
}
check_first_loss() { # check_first_loss FIRST_ROW ALL_TOKENS LOSS: rows FIRST_ROW and the next of loss_ids.jsonl
    python3 - "$tmp" "$1" "$2" "$3" << 'EOF'
import json, sys
tmp, first, all_tokens, got = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1", float(sys.argv[4])
logprobs = [json.loads(l)["logprobs"] for l in open(f"{tmp}/loss_logprobs.jsonl")][first:first + 2]
prompt_lengths = json.load(open(f"{tmp}/prompt_lengths.json"))[first:first + 2]
# logprobs[t - 1]: token t given the ones before it
counted = [-row[t - 1] for row, p in zip(logprobs, prompt_lengths) for t in range(1 if all_tokens else p, len(row) + 1)]
want = sum(counted) / len(counted)
print(f"loss {got:.6f}, want {want:.6f} over {len(counted)} tokens", file=sys.stderr)
sys.exit(0 if abs(got - want) <= 1e-5 * abs(want) else 1)
EOF
}
completion=$(sft_first_loss completion "$tmp/pr.jsonl")
sequence=$(sft_first_loss sequence "$tmp/pr.jsonl" --completion-only-loss false)
text=$(sft_first_loss text "$tmp/text.jsonl")
text_sequence=$(sft_first_loss text_sequence "$tmp/text.jsonl" --completion-only-loss false)
check_first_loss 0 0 "$completion" && pass sft_loss_on_completion ||
    fail sft_loss_on_completion "loss '$completion' $(tail -n 1 "$tmp/loss_completion.err")"
check_first_loss 0 1 "$sequence" && pass sft_completion_only_loss_false ||
    fail sft_completion_only_loss_false "loss '$sequence' $(tail -n 1 "$tmp/loss_sequence.err")"
check_first_loss 2 1 "$text" && [ "$text" = "$text_sequence" ] && pass sft_text_rows_all_trained ||
    fail sft_text_rows_all_trained "loss '$text' / '$text_sequence' $(tail -n 1 "$tmp/loss_text.err")"
# --loss-type dft (TRL's Dynamic Fine-Tuning): the same tokens, each -log p weighted by p.
dft=$(sft_first_loss dft "$tmp/pr.jsonl" --loss-type dft)
python3 - "$tmp" "$dft" << 'EOF' && pass "sft_loss_type_dft ($dft)" || fail sft_loss_type_dft "loss '$dft' $(tail -n 1 "$tmp/loss_dft.err")"
import json, math, sys
tmp, got = sys.argv[1], float(sys.argv[2])
logprobs = [json.loads(l)["logprobs"] for l in open(f"{tmp}/loss_logprobs.jsonl")][:2]
prompt_lengths = json.load(open(f"{tmp}/prompt_lengths.json"))[:2]
counted = [-math.exp(row[t - 1]) * row[t - 1] for row, p in zip(logprobs, prompt_lengths) for t in range(p, len(row) + 1)]
want = sum(counted) / len(counted)
print(f"loss {got:.6f}, want {want:.6f} over {len(counted)} tokens", file=sys.stderr)
sys.exit(0 if abs(got - want) <= 1e-5 * abs(want) else 1)
EOF
expect_error sft_loss_type_unknown "--loss-type focal: give nll or dft" "$bin" sft "${sft_args[@]}" --loss-type focal \
    --output "$tmp/x_loss"
rm -rf "$tmp"/loss_*/checkpoint-* "$tmp"/loss_*/final
expect_error sft_completion_only_with_train_on_prompt "give one (--completion-only-loss)" \
    "$bin" sft "${sft_args[@]}" --completion-only-loss false --train-on-prompt --output "$tmp/x_loss"
expect_error sft_completion_only_with_assistant_only "give one (--completion-only-loss)" \
    "$bin" sft "${sft_args[@]}" --completion-only-loss false --assistant-only-loss --output "$tmp/x_loss"

# --- --packing (TRL's packing) -----------------------------------------------------------
# Rows of 80 tokens hold both examples of pr.jsonl in one row. bfd keeps each example to
# itself (its own attention, its positions from 0): the first step's loss is the unpacked
# one. wrapped runs them as one stream (the second attends to the first, its positions go
# on): its loss is the mean -log-prob, by `marlhf logprobs` on the two examples' ids joined,
# over the same trained tokens -- and without completion-only loss over every token after
# the first, the second example's first token too (TRL's labels of a wrapped row).
python3 - "$tmp" << 'EOF'
import json, sys
tmp = sys.argv[1]
rows = [json.loads(l)["ids"] for l in open(f"{tmp}/loss_ids.jsonl")][:2]
json.dump({"ids": rows[0] + rows[1]}, open(f"{tmp}/joined_ids.jsonl", "w"))
EOF
"$bin" logprobs --model "$model" --input "$tmp/joined_ids.jsonl" --threads 2 > "$tmp/joined_logprobs.jsonl" 2> "$tmp/joined.err" ||
    fail sft_packing "logprobs: $(tail -n 1 "$tmp/joined.err")"
check_wrapped_loss() { # check_wrapped_loss ALL_TOKENS LOSS
    python3 - "$tmp" "$1" "$2" << 'EOF'
import json, sys
tmp, all_tokens, got = sys.argv[1], sys.argv[2] == "1", float(sys.argv[3])
logprobs = json.loads(open(f"{tmp}/joined_logprobs.jsonl").readline())["logprobs"]
lengths = [len(json.loads(l)["ids"]) for l in open(f"{tmp}/loss_ids.jsonl")][:2]
prompt_lengths = json.load(open(f"{tmp}/prompt_lengths.json"))[:2]
trained = range(1, sum(lengths)) if all_tokens else \
    [t for t in range(prompt_lengths[0], lengths[0])] + [lengths[0] + t for t in range(prompt_lengths[1], lengths[1])]
want = sum(-logprobs[t - 1] for t in trained) / len(trained)
print(f"loss {got:.6f}, want {want:.6f} over {len(trained)} tokens", file=sys.stderr)
sys.exit(0 if abs(got - want) <= 1e-5 * abs(want) else 1)
EOF
}
packed_bfd=$(sft_first_loss packed_bfd "$tmp/pr.jsonl" --max-seq-len 80 --packing)
packed_bfd_sequence=$(sft_first_loss packed_bfd_sequence "$tmp/pr.jsonl" --max-seq-len 80 --packing --completion-only-loss false)
packed_wrapped=$(sft_first_loss packed_wrapped "$tmp/pr.jsonl" --max-seq-len 80 --packing --packing-strategy wrapped)
packed_wrapped_sequence=$(sft_first_loss packed_wrapped_sequence "$tmp/pr.jsonl" --max-seq-len 80 --packing \
    --packing-strategy wrapped --completion-only-loss false)
"$bin" sft --model "$model" --data "$tmp/pr.jsonl" --max-seq-len 80 --max-steps 1 --packing --output "$tmp/loss_rows" \
    2> "$tmp/loss_rows.err"
grep -q "sft: 2 training examples (0 dropped, 0 cut at 80 tokens) packed (bfd) into 1 rows" "$tmp/loss_rows.err" &&
    pass sft_packing_one_row || fail sft_packing_one_row "$(grep 'sft:' "$tmp/loss_rows.err" | head -n 1)"
python3 -c "import sys; sys.exit(0 if abs(float(sys.argv[1]) - float(sys.argv[2])) <= 1e-6 * abs(float(sys.argv[2])) and abs(float(sys.argv[3]) - float(sys.argv[4])) <= 1e-6 * abs(float(sys.argv[4])) else 1)" \
    "$packed_bfd" "$completion" "$packed_bfd_sequence" "$sequence" 2> /dev/null &&
    pass "sft_packing_bfd_equals_unpacked ($packed_bfd, $packed_bfd_sequence)" ||
    fail sft_packing_bfd_equals_unpacked "packed '$packed_bfd' '$packed_bfd_sequence', unpacked '$completion' '$sequence'"
check_wrapped_loss 0 "$packed_wrapped" && pass sft_packing_wrapped_is_one_stream ||
    fail sft_packing_wrapped_is_one_stream "loss '$packed_wrapped' $(tail -n 1 "$tmp/loss_packed_wrapped.err")"
check_wrapped_loss 1 "$packed_wrapped_sequence" && pass sft_packing_wrapped_every_token ||
    fail sft_packing_wrapped_every_token "loss '$packed_wrapped_sequence' $(tail -n 1 "$tmp/loss_packed_wrapped_sequence.err")"
# {"text"} rows have no prompt: packed into one stream, each text's first token is trained
# whether or not --completion-only-loss is given (TRL labels every token of a wrapped row).
text_wrapped=$(sft_first_loss text_wrapped "$tmp/text.jsonl" --max-seq-len 80 --packing --packing-strategy wrapped)
text_wrapped_sequence=$(sft_first_loss text_wrapped_sequence "$tmp/text.jsonl" --max-seq-len 80 --packing \
    --packing-strategy wrapped --completion-only-loss false)
[ -n "$text_wrapped" ] && [ "$text_wrapped" = "$text_wrapped_sequence" ] && [ "$text_wrapped" != "$text" ] &&
    pass "sft_packing_text_rows_every_token ($text_wrapped)" ||
    fail sft_packing_text_rows_every_token "'$text_wrapped' '$text_wrapped_sequence' (unpacked '$text')"
# The evaluation data is packed as the training data (TRL's eval_packing, by default as
# packing): at learning rate 1e-30 the evaluation after one step sees the untrained model (an
# update far below a float's resolution of the weights), so its loss on pr.jsonl is wrapped's
# one stream when packed, the unpacked loss with --eval-packing false, and the unpacked loss
# under bfd either way (each example to itself).
sft_eval_loss() { # sft_eval_loss NAME [OPTIONS...]: eval/loss after one step at learning rate 1e-30
    "$bin" sft --model "$model" --data "$tmp/pr.jsonl" --eval-data "$tmp/pr.jsonl" --max-seq-len 80 \
        --per-device-train-batch-size 2 --max-steps 1 --eval-every 1 --learning-rate 1e-30 --threads 2 "${@:2}" \
        --output "$tmp/loss_$1" 2> "$tmp/loss_$1.err" && json_field "$tmp/loss_$1/metrics.jsonl" eval/loss 0
}
eval_wrapped=$(sft_eval_loss eval_wrapped --packing --packing-strategy wrapped)
eval_wrapped_unpacked=$(sft_eval_loss eval_wrapped_unpacked --packing --packing-strategy wrapped --eval-packing false)
eval_bfd=$(sft_eval_loss eval_bfd --packing)
grep -q "; 2 eval examples packed into 1 rows" "$tmp/loss_eval_wrapped.err" &&
    ! grep -q "packed into 1 rows$" "$tmp/loss_eval_wrapped_unpacked.err" &&
    check_wrapped_loss 0 "$eval_wrapped" && pass "sft_eval_packing_wrapped_is_one_stream ($eval_wrapped)" ||
    fail sft_eval_packing_wrapped_is_one_stream "loss '$eval_wrapped' $(grep 'sft:' "$tmp/loss_eval_wrapped.err" | head -n 1)"
check_first_loss 0 0 "$eval_wrapped_unpacked" && check_first_loss 0 0 "$eval_bfd" &&
    pass "sft_eval_packing_false_and_bfd_unpacked_loss ($eval_wrapped_unpacked, $eval_bfd)" ||
    fail sft_eval_packing_false_and_bfd_unpacked_loss "losses '$eval_wrapped_unpacked' '$eval_bfd'"
expect_error sft_eval_packing_without_packing "give --packing (--eval-packing)" \
    "$bin" sft "${sft_args[@]}" --eval-packing --output "$tmp/x_packing"

# --neftune-noise-alpha (NEFTune): noise on the token embeddings of training passes only. At
# learning rate 1e-30 the first step's loss moves off the noiseless one, while the evaluation
# after it (no noise) is the noiseless model's to the bit. A run resumes bit for bit (the
# noise is drawn from the micro-batch's place in the run), and not with another alpha.
eval_plain=$(sft_eval_loss neftune_off)
eval_neftune=$(sft_eval_loss neftune --neftune-noise-alpha 5)
train_plain=$(json_field "$tmp/loss_neftune_off/metrics.jsonl" train/loss 0 2> /dev/null)
train_neftune=$(json_field "$tmp/loss_neftune/metrics.jsonl" train/loss 0 2> /dev/null)
[ -n "$eval_plain" ] && [ "$eval_plain" = "$eval_neftune" ] && [ -n "$train_neftune" ] &&
    [ "$train_plain" != "$train_neftune" ] &&
    pass "sft_neftune_training_passes_only (train loss $train_plain -> $train_neftune, eval $eval_neftune)" ||
    fail sft_neftune_training_passes_only "train '$train_plain' '$train_neftune', eval '$eval_plain' '$eval_neftune'"
neftune_args=("${sft_args[@]}" --neftune-noise-alpha 5 --save-every 2 --keep-last 0 --eval-every 0 --max-steps 4)
"$bin" sft "${neftune_args[@]}" --output "$tmp/neftune" 2> "$tmp/neftune.err"
mkdir -p "$tmp/neftune_resumed" && cp -r "$tmp/neftune/checkpoint-2" "$tmp/neftune_resumed/"
"$bin" sft "${neftune_args[@]}" --resume --output "$tmp/neftune_resumed" 2> "$tmp/neftune_resumed.err"
cmp -s "$tmp/neftune/final/model.safetensors" "$tmp/neftune_resumed/final/model.safetensors" &&
    pass sft_neftune_resume_bit_identical || fail sft_neftune_resume_bit_identical "$(tail -n 2 "$tmp/neftune_resumed.err")"
expect_error sft_neftune_resume_other_alpha "made with --neftune-noise-alpha 5, this run has 1" \
    "$bin" sft "${neftune_args[@]}" --neftune-noise-alpha 1 --resume --output "$tmp/neftune_resumed"
expect_error sft_neftune_negative "--neftune-noise-alpha must be >= 0" \
    "$bin" sft "${sft_args[@]}" --neftune-noise-alpha -1 --output "$tmp/x_neftune"
rm -rf "$tmp"/loss_*/checkpoint-* "$tmp"/loss_*/final
# --padding-free (TRL's padding_free): each micro-batch and evaluation chunk as one row of its
# examples, each attending to itself only -- the same losses as one example a row, step after
# step.
"$bin" sft "${sft_args[@]}" --max-steps 6 --eval-every 3 --output "$tmp/rows" 2> "$tmp/rows.err"
"$bin" sft "${sft_args[@]}" --max-steps 6 --eval-every 3 --padding-free --output "$tmp/padding_free" 2> "$tmp/padding_free.err"
same_losses "$tmp/rows" "$tmp/padding_free" 9 2> "$tmp/padding_free.cmp" &&
    pass "sft_padding_free_same_losses ($(cat "$tmp/padding_free.cmp"))" ||
    fail sft_padding_free_same_losses "$(cat "$tmp/padding_free.cmp") $(tail -n 1 "$tmp/padding_free.err")"
expect_error sft_padding_free_with_train_on_prompt "give one (--padding-free)" \
    "$bin" sft "${sft_args[@]}" --padding-free --train-on-prompt --output "$tmp/x_packing"
# A packed run learns and resumes bit for bit; a checkpoint is not resumed with other rows.
packed_args=("${sft_args[@]}" --max-seq-len 64 --packing --save-every 2 --keep-last 0 --eval-every 0 --num-train-epochs 8)
"$bin" sft "${packed_args[@]}" --output "$tmp/packed" 2> "$tmp/packed.err"
first=$(json_field "$tmp/packed/metrics.jsonl" train/loss 0 2> /dev/null); last=$(json_field "$tmp/packed/metrics.jsonl" train/loss -1 2> /dev/null)
python3 -c "import sys; sys.exit(0 if float(sys.argv[2]) < 0.75 * float(sys.argv[1]) else 1)" "$first" "$last" 2> /dev/null &&
    pass "sft_packing_learns (loss $first -> $last)" || fail sft_packing_learns "loss '$first' -> '$last' $(tail -n 2 "$tmp/packed.err")"
mkdir -p "$tmp/packed_resumed" && cp -r "$tmp/packed/checkpoint-2" "$tmp/packed_resumed/"
"$bin" sft "${packed_args[@]}" --resume --output "$tmp/packed_resumed" 2> "$tmp/packed_resumed.err"
cmp -s "$tmp/packed/final/model.safetensors" "$tmp/packed_resumed/final/model.safetensors" &&
    pass sft_packing_resume_bit_identical || fail sft_packing_resume_bit_identical "$(tail -n 2 "$tmp/packed_resumed.err")"
expect_error sft_packing_resume_other_strategy "made with packing bfd, this run has bfd_split" \
    "$bin" sft "${packed_args[@]}" --packing-strategy bfd_split --resume --output "$tmp/packed_resumed"
expect_error sft_resume_other_loss_type "made with --loss-type nll, this run has dft" \
    "$bin" sft "${packed_args[@]}" --loss-type dft --resume --output "$tmp/packed_resumed"
expect_error sft_packing_with_train_on_prompt "give one (--packing)" \
    "$bin" sft "${sft_args[@]}" --packing --train-on-prompt --output "$tmp/x_packing"
expect_error sft_packing_unknown_strategy "--packing-strategy tight" \
    "$bin" sft "${sft_args[@]}" --packing --packing-strategy tight --output "$tmp/x_packing"

# --- exact resume after SIGKILL --------------------------------------------------------
# Long enough (96 steps) that the kill lands mid-run.
resume_args=("${sft_args[@]}" --num-train-epochs 16 --save-every 1 --keep-last 2 --eval-every 0)
"$bin" sft "${resume_args[@]}" --output "$tmp/straight" 2> /dev/null
for attempt in 1 2; do
    out="$tmp/killed$attempt"
    # Temporaries a killed run would leave: half-written checkpoints of a process that is gone
    # (removed at the next save), of a live one (this shell: kept), and one beside the .old-
    # folder of an interrupted rename-aside (recovery material: kept); and the metrics.jsonl
    # temporary of a kill that landed while the log was being rewritten (removed; the kill
    # below can leave one too).
    mkdir -p "$out/checkpoint-5.tmp-2147483000" "$out/checkpoint-6.tmp-$$" "$out/checkpoint-8.tmp-2147483001" \
        "$out/checkpoint-8.old-2147483001"
    echo partial > "$out/checkpoint-5.tmp-2147483000/model.safetensors"
    echo partial > "$out/metrics.jsonl.tmp-2147483002"
    interrupted_run "$out" "$bin" sft "${resume_args[@]}" --output "$out"
    [ "$finished_early" = 1 ] && fail "resume_kill_mid_run_$attempt" "the run finished before the kill"
    if cmp -s "$tmp/straight/final/model.safetensors" "$out/final/model.safetensors"; then
        pass "resume_bit_identical_$attempt"
    else
        fail "resume_bit_identical_$attempt" "$(tail -n 2 "$out.err")"
    fi
    lines=$(grep -c '"train/loss"' "$out/metrics.jsonl")
    [ "$lines" = 96 ] && pass "resume_metrics_continuous_$attempt" || fail "resume_metrics_continuous_$attempt" "$lines lines"
    # Every killed process is gone now: only the two kept temporaries remain.
    left=$(cd "$out" && ls -d *.tmp-* 2> /dev/null | tr '\n' ' ')
    [ "$left" = "checkpoint-6.tmp-$$ checkpoint-8.tmp-2147483001 " ] && [ -d "$out/checkpoint-8.old-2147483001" ] &&
        pass "resume_removes_stale_half_checkpoints_$attempt" || fail "resume_removes_stale_half_checkpoints_$attempt" "left: $left"
done

# --- --group-by-length (Hugging Face's group_by_length) --------------------------------
# Its order against transformers' is tests/test_train_tasks.c's. Here: it runs and learns; a
# run resumed from its checkpoint of step 6 ends as the run that never stopped, bit for bit;
# a checkpoint is not resumed with the other setting (another data order).
group_args=("${sft_args[@]}" --group-by-length --save-every 6 --keep-last 0 --eval-every 0)
"$bin" sft "${group_args[@]}" --output "$tmp/grouped" 2> "$tmp/grouped.err"
first=$(json_field "$tmp/grouped/metrics.jsonl" train/loss 0 2> /dev/null); last=$(json_field "$tmp/grouped/metrics.jsonl" train/loss -1 2> /dev/null)
python3 -c "import sys; sys.exit(0 if float(sys.argv[2]) < 0.75 * float(sys.argv[1]) else 1)" "$first" "$last" 2> /dev/null &&
    pass "sft_group_by_length_learns (loss $first -> $last)" || fail sft_group_by_length_learns "loss '$first' -> '$last' $(tail -n 2 "$tmp/grouped.err")"
mkdir -p "$tmp/grouped_resumed" && cp -r "$tmp/grouped/checkpoint-6" "$tmp/grouped_resumed/"
"$bin" sft "${group_args[@]}" --resume --output "$tmp/grouped_resumed" 2> "$tmp/grouped_resumed.err"
cmp -s "$tmp/grouped/final/model.safetensors" "$tmp/grouped_resumed/final/model.safetensors" &&
    pass sft_group_by_length_resume_bit_identical || fail sft_group_by_length_resume_bit_identical "$(tail -n 2 "$tmp/grouped_resumed.err")"
expect_error sft_group_by_length_resume_without "made with --group-by-length true, this run has false" \
    "$bin" sft "${sft_args[@]}" --save-every 6 --keep-last 0 --eval-every 0 --resume --output "$tmp/grouped_resumed"

# --- reward models -------------------------------------------------------------------
rm_common=(--model "$model" --max-seq-len 32 --per-device-train-batch-size 4 --learning-rate 3e-3
           --num-train-epochs 4 --threads 2 --quiet)
for loss in pairwise margin dschat; do
    extra=()
    [ "$loss" = margin ] && extra=(--margin 0.5)
    "$bin" rm "${rm_common[@]}" --data "$data/pairs.jsonl" --eval-data "$data/pairs_eval.jsonl" --loss "$loss" \
        "${extra[@]}" --output "$tmp/rm_$loss" 2> "$tmp/rm_$loss.err"
    acc=$(json_field "$tmp/rm_$loss/metrics.jsonl" eval/accuracy -1 2>/dev/null)
    python3 -c "import sys; sys.exit(0 if float(sys.argv[1]) >= 0.9 else 1)" "$acc" 2>/dev/null &&
        pass "rm_${loss}_learns (eval accuracy $acc)" || fail "rm_${loss}_learns" "accuracy '$acc' $(tail -n 2 "$tmp/rm_$loss.err")"
done
"$bin" rm "${rm_common[@]}" --data "$data/ranked.jsonl" --eval-data "$data/ranked_eval.jsonl" --loss listwise \
    --output "$tmp/rm_listwise" 2> "$tmp/rm_listwise.err"
acc=$(json_field "$tmp/rm_listwise/metrics.jsonl" eval/accuracy -1 2>/dev/null)
python3 -c "import sys; sys.exit(0 if float(sys.argv[1]) >= 0.8 else 1)" "$acc" 2>/dev/null &&
    pass "rm_listwise_learns (eval accuracy $acc)" || fail rm_listwise_learns "accuracy '$acc' $(tail -n 2 "$tmp/rm_listwise.err")"
grep -q '"LlamaForSequenceClassification"' "$tmp/rm_pairwise/final/config.json" && pass rm_saved_as_classifier || fail rm_saved_as_classifier "config"
# --padding-free: each micro-batch's responses side by side in one row, each attending to itself
# only: the losses of one response a row, and the finished model's scores in reward_stats.json.
# The listwise run's first two losses are the same bits; from the third on the updates differ
# by rounding (the weight gradients summed over other slots: no padding), which 52 steps at
# learning rate 3e-3 grow to ~5e-5 relative as the loss falls to 0.02, hence its tolerance.
for loss in pairwise listwise; do
    [ $loss = pairwise ] && set_name=pairs tolerance=1e-6 || set_name=ranked tolerance=2e-4
    "$bin" rm "${rm_common[@]}" --data "$data/$set_name.jsonl" --eval-data "$data/${set_name}_eval.jsonl" --loss $loss \
        --padding-free --output "$tmp/rm_${loss}_padding_free" 2> "$tmp/rm_${loss}_padding_free.err"
    count=$(($(json_values "$tmp/rm_$loss/metrics.jsonl" train/loss | wc -w) + $(json_values "$tmp/rm_$loss/metrics.jsonl" eval/loss | wc -w)))
    same_losses "$tmp/rm_$loss" "$tmp/rm_${loss}_padding_free" "$count" $tolerance 2> "$tmp/rm_${loss}_padding_free.cmp" &&
        python3 - "$tmp/rm_$loss/final/reward_stats.json" "$tmp/rm_${loss}_padding_free/final/reward_stats.json" \
            $tolerance 2>> "$tmp/rm_${loss}_padding_free.cmp" << 'EOF' &&
import json, sys
a, b = [json.load(open(path)) for path in sys.argv[1:3]]
scores = lambda s: s["chosen"] + s["rejected"]
assert len(scores(a)) == len(scores(b)) > 0 and a["indices"] == b["indices"]
worst = max(abs(x - y) / max(abs(x), 1) for x, y in zip(scores(a), scores(b)))
print(f"; {len(scores(a))} scores, worst difference {worst:.2e} (relative, of 1 at least)", file=sys.stderr)
sys.exit(0 if worst <= float(sys.argv[3]) else 1)
EOF
        pass "rm_${loss}_padding_free_same_losses ($(tr -d '\n' < "$tmp/rm_${loss}_padding_free.cmp"))" ||
        fail "rm_${loss}_padding_free_same_losses" "$(cat "$tmp/rm_${loss}_padding_free.cmp") $(tail -n 1 "$tmp/rm_${loss}_padding_free.err")"
done
expect_error rm_padding_free_dschat "give one (--padding-free)" "$bin" rm --model "$model" --data "$data/pairs.jsonl" \
    --loss dschat --padding-free --output "$tmp/x7"
# --center-rewards-coefficient C (TRL's center_rewards_coefficient): the loss gains C times the
# mean of (chosen + rejected score)^2. One step over 4 pairs at learning rate 1e-30: the loss is
# the plain one plus that term of the untrained scores (reward_stats.json of the same model);
# then, trained as rm_pairwise was, the scores sit nearer zero with it than without.
head -n 4 "$data/pairs.jsonl" > "$tmp/pairs4.jsonl"
for coefficient in 0 0.5; do
    "$bin" rm --model "$model" --data "$tmp/pairs4.jsonl" --max-seq-len 32 --per-device-train-batch-size 4 \
        --max-steps 1 --learning-rate 1e-30 --threads 2 --quiet --center-rewards-coefficient $coefficient \
        --output "$tmp/rm_center_$coefficient" 2> "$tmp/rm_center_$coefficient.err"
done
"$bin" rm "${rm_common[@]}" --data "$data/pairs.jsonl" --eval-data "$data/pairs_eval.jsonl" \
    --center-rewards-coefficient 1 --output "$tmp/rm_centered" 2> "$tmp/rm_centered.err"
python3 - "$tmp" << 'EOF' && pass rm_center_rewards || fail rm_center_rewards "see above $(tail -n 1 "$tmp/rm_center_0.5.err")"
import json, sys
tmp = sys.argv[1]
loss = lambda run: [json.loads(l)["train/loss"] for l in open(f"{tmp}/{run}/metrics.jsonl") if "train/loss" in l][0]
stats = json.load(open(f"{tmp}/rm_center_0/final/reward_stats.json"))
assert stats["source"] == "train" and stats["examples"] == 4, stats
term = sum((c + r) ** 2 for c, r in zip(stats["chosen"], stats["rejected"])) / 4
plain, centered = loss("rm_center_0"), loss("rm_center_0.5")
print(f"loss {centered:.6f}, want {plain:.6f} + 0.5 x {term:.6f} = {plain + 0.5 * term:.6f}", file=sys.stderr)
mean_sum = lambda run: (lambda s: sum(abs(c + r) for c, r in zip(s["chosen"], s["rejected"])) / len(s["chosen"]))(
    json.load(open(f"{tmp}/{run}/final/reward_stats.json")))
trained, centred_run = mean_sum("rm_pairwise"), mean_sum("rm_centered")
accuracy = [json.loads(l)["eval/accuracy"] for l in open(f"{tmp}/rm_centered/metrics.jsonl") if "eval/accuracy" in l][-1]
print(f"trained: mean |chosen + rejected| {trained:.4f} without, {centred_run:.4f} with; accuracy {accuracy}",
      file=sys.stderr)
sys.exit(0 if abs(centered - (plain + 0.5 * term)) <= 1e-5 * abs(centered) and term > 1e-3
         and centred_run < 0.5 * trained and accuracy >= 0.9 else 1)
EOF
# A "margin" column (TRL's reward trainer reads one per pair): the loss is each pair's
# -log sigmoid(chosen - rejected - margin), on the untrained scores above.
python3 - "$tmp" << 'EOF'
import json, sys
tmp = sys.argv[1]
rows = [json.loads(l) for l in open(f"{tmp}/pairs4.jsonl")]
with open(f"{tmp}/pairs4_margin.jsonl", "w") as f:
    for row, margin in zip(rows, [0.5, -1.0, 2.0, 0.0]):
        f.write(json.dumps(dict(row, margin=margin)) + "\n")
with open(f"{tmp}/pairs_mixed_margin.jsonl", "w") as f:
    f.write(json.dumps(dict(rows[0], margin=1)) + "\n" + json.dumps(rows[1]) + "\n")
with open(f"{tmp}/pairs_text_margin.jsonl", "w") as f:
    f.write(json.dumps(dict(rows[0], margin="1")) + "\n")
EOF
"$bin" rm --model "$model" --data "$tmp/pairs4_margin.jsonl" --max-seq-len 32 --per-device-train-batch-size 4 \
    --max-steps 1 --learning-rate 1e-30 --threads 2 --output "$tmp/rm_margin_column" 2> "$tmp/rm_margin_column.err"
python3 - "$tmp" << 'EOF' && grep -q "loss margin (the data's per-pair margins)" "$tmp/rm_margin_column.err" &&
import json, math, sys
tmp = sys.argv[1]
stats = json.load(open(f"{tmp}/rm_center_0/final/reward_stats.json"))
want = sum(math.log1p(math.exp(-(c - r - m))) for c, r, m in zip(stats["chosen"], stats["rejected"], [0.5, -1, 2, 0])) / 4
got = [json.loads(l)["train/loss"] for l in open(f"{tmp}/rm_margin_column/metrics.jsonl") if "train/loss" in l][0]
print(f"loss {got:.6f}, want {want:.6f}", file=sys.stderr)
sys.exit(0 if abs(got - want) <= 1e-5 * abs(want) else 1)
EOF
    pass rm_margin_column || fail rm_margin_column "$(grep 'rm:' "$tmp/rm_margin_column.err" | head -n 1)"
expect_error rm_margin_column_mixed "$tmp/pairs_mixed_margin.jsonl:2 has no \"margin\"" "$bin" rm --model "$model" \
    --data "$tmp/pairs_mixed_margin.jsonl" --output "$tmp/x7"
expect_error rm_margin_column_not_a_number "$tmp/pairs_text_margin.jsonl:1" "$bin" rm --model "$model" \
    --data "$tmp/pairs_text_margin.jsonl" --output "$tmp/x7"
expect_error rm_margin_column_and_option "give one (--margin)" "$bin" rm --model "$model" \
    --data "$tmp/pairs4_margin.jsonl" --loss margin --margin 0.5 --output "$tmp/x7"
expect_error rm_margin_column_dschat "does not read" "$bin" rm --model "$model" \
    --data "$tmp/pairs4_margin.jsonl" --loss dschat --output "$tmp/x7"
expect_error rm_center_rewards_listwise "applies to --loss pairwise and margin" "$bin" rm --model "$model" \
    --data "$data/ranked.jsonl" --loss listwise --center-rewards-coefficient 0.01 --output "$tmp/x7"
expect_error rm_center_rewards_negative "--center-rewards-coefficient must be >= 0" "$bin" rm --model "$model" \
    --data "$data/pairs.jsonl" --center-rewards-coefficient -0.01 --output "$tmp/x7"

# --- bad data and options --------------------------------------------------------------
printf '{"prompt": "a", "response": "b"}\n{"prompt": "a"}\n' > "$tmp/missing.jsonl"
expect_error sft_missing_field "$tmp/missing.jsonl:2" "$bin" sft --model "$model" --data "$tmp/missing.jsonl" --output "$tmp/x1"
printf '{"prompt": "a", "response": 3}\n' > "$tmp/type.jsonl"
expect_error sft_wrong_type "$tmp/type.jsonl:1" "$bin" sft --model "$model" --data "$tmp/type.jsonl" --output "$tmp/x2"
: > "$tmp/empty.jsonl"
expect_error sft_empty_file "$tmp/empty.jsonl" "$bin" sft --model "$model" --data "$tmp/empty.jsonl" --output "$tmp/x3"
printf '{"prompt": "a", "response": "\xff"}\n' > "$tmp/utf8.jsonl"
expect_error sft_invalid_utf8 "$tmp/utf8.jsonl:1" "$bin" sft --model "$model" --data "$tmp/utf8.jsonl" --output "$tmp/x4"
expect_error sft_bad_lr "--learning-rate" "$bin" sft --model "$model" --data "$data/sft.jsonl" --output "$tmp/x5" --learning-rate -1
expect_error sft_bad_schedule "--lr-scheduler-type" "$bin" sft --model "$model" --data "$data/sft.jsonl" --output "$tmp/x6" --lr-scheduler-type warm
expect_error rm_bad_loss "--loss" "$bin" rm --model "$model" --data "$data/pairs.jsonl" --output "$tmp/x7" --loss hinge
expect_error rm_sft_data "chosen" "$bin" rm --model "$model" --data "$data/sft.jsonl" --output "$tmp/x8"
# --max-seq-len past the model's context (a GPT-2 of 64 learned positions): rows are cut at the
# context, and the summary says so (an internal error before).
python3 tests/cli/tiny_gpt2_model.py tests/fixtures/models/gpt2 "$model" "$tmp/gpt2_64" 2> /dev/null
python3 -c "
import json
for i in range(4): print(json.dumps({'prompt': 'Tell me ' + 'about the cat ' * 10, 'response': ' The cat is good.' * 10}))
" > "$tmp/long_rows.jsonl"
"$bin" sft --model "$tmp/gpt2_64" --data "$tmp/long_rows.jsonl" --max-seq-len 200 --max-steps 1 \
    --per-device-train-batch-size 2 --output "$tmp/sft_64" 2> "$tmp/sft_64.err"
rc=$?
[ $rc = 0 ] && grep -q "4 cut at 64 tokens" "$tmp/sft_64.err" && [ -f "$tmp/sft_64/final/model.safetensors" ] &&
    pass sft_rows_cut_at_the_model_context || fail sft_rows_cut_at_the_model_context "exit $rc: $(tail -n 2 "$tmp/sft_64.err")"
[ "$failures" -eq 0 ]
