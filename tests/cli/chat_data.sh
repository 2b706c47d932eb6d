#!/usr/bin/env bash
# Conversational data (TRL's message formats) end to end: sft, rm, dpo, kto, infer and ppo read lists of
# {role, content} messages and render them with a chat template (src/data/chat_data.c).
# A run on conversational rows must train exactly as a run on the same rows written as text
# by transformers' apply_chat_template (tests/fixtures/chat_data/cases.json, made by
# tools/make_chat_data_fixtures.py; the Llama 3 template on the tiny model, whose
# tokenizer adds BOS: the text rows leave out the template's BOS, which the tokenizer then
# adds, so both runs see the same ids only if the conversational run adds no second BOS).
# Then ppo on conversational prompts, a pipeline passing "chat-template" to its stages, SmolLM2
# with its own template (from the GGUF), and
# the bad inputs: one-line errors, exit 2, naming file:line. Prints PASS/FAIL per case.
set -u
cd "$(dirname "$0")/../.."
bin=${MARLHF_BIN:-build/marlhf}
tmp=${MARLHF_TEST_TMP:-/tmp}/cli_chat_data
rm -rf "$tmp" && mkdir -p "$tmp"
model=tests/fixtures/models/tiny_chat
smollm2=models/SmolLM2-135M-Instruct.Q4_1.gguf
failures=0
. tests/cli_helpers.sh

# The fixture's llama3 cases as conversational rows and as the rendered text rows.
python3 - tests/fixtures/chat_data/cases.json "$tmp" << 'PYEOF'
import json, sys
cases = [c for c in json.load(open(sys.argv[1]))["cases"] if c["template"] == "llama3"]
bos = "<|begin_of_text|>"
def text_prompt(c):
    assert c["expected"]["prompt"].startswith(bos)
    return c["expected"]["prompt"][len(bos):]
def write(name, rows):
    with open(f"{sys.argv[2]}/{name}", "w") as f:
        for row in rows:
            f.write((row if isinstance(row, str) else json.dumps(row)) + "\n")
sft = [c for c in cases if c["name"].split("/")[1].startswith("sft_") or c["name"].endswith("/prompt_continued")]
unpaired = [c for c in cases if c["name"].split("/")[1].startswith("unpaired_")]
pairs = [c for c in cases if c["name"].split("/")[1].startswith("pairs_")]
write("sft_chat.jsonl", [c["row"] for c in sft] * 4)
write("sft_text.jsonl", [{"prompt": text_prompt(c), "response": c["expected"]["chosen"]} for c in sft] * 4)
# explicit and implicit pairs are one format (pairs), so they share a file
write("pairs_chat.jsonl", [c["row"] for c in pairs] * 4)
write("pairs_text.jsonl", [{"prompt": text_prompt(c), "chosen": c["expected"]["chosen"],
                            "rejected": c["expected"]["rejected"]} for c in pairs] * 4)
# rankings of three (no TRL counterpart): the explicit pairs' prompt, chosen, rejected, rejected
explicit = [c for c in pairs if isinstance(json.loads(c["row"]).get("prompt"), list)]
write("ranked_chat.jsonl", [{"prompt": r["prompt"], "responses": [r["chosen"], r["rejected"], r["rejected"]]}
                            for r in (json.loads(c["row"]) for c in explicit)] * 4)
write("ranked_text.jsonl", [{"prompt": text_prompt(c), "responses": [c["expected"]["chosen"], c["expected"]["rejected"],
                                                                     c["expected"]["rejected"]]} for c in explicit] * 4)
write("unpaired_chat.jsonl", [c["row"] for c in unpaired] * 4)
write("unpaired_text.jsonl", [{"prompt": text_prompt(c), "completion": c["expected"]["chosen"] or c["expected"]["rejected"],
                               "label": json.loads(c["row"])["label"]} for c in unpaired] * 4)
write("prompts_chat.jsonl", [json.dumps({"prompt": [{"role": "user", "content": f"Say {w}."}]})
                             for w in ["yes", "no", "hello", "goodbye", "one", "two", "three", "four"]])
PYEOF

train_args=(--model "$model" --max-seq-len 96 --per-device-train-batch-size 2 --learning-rate 1e-3 --num-warmup-steps 0
            --max-steps 3 --num-train-epochs 2 --threads 2 --quiet)
same_losses() { # same_losses NAME RUN_A RUN_B: identical train/loss and train/grad_norm lines
    local a b
    a=$(json_values "$tmp/$2/metrics.jsonl" train/loss 2>/dev/null; json_values "$tmp/$2/metrics.jsonl" train/grad_norm 2>/dev/null)
    b=$(json_values "$tmp/$3/metrics.jsonl" train/loss 2>/dev/null; json_values "$tmp/$3/metrics.jsonl" train/grad_norm 2>/dev/null)
    if [ "$(echo $a | wc -w)" -eq 6 ] && [ "$a" = "$b" ]; then pass "$1"; else fail "$1" "conversational [$a] text [$b]"; fi
}

# chat_and_text COMMAND DATA: COMMAND trained on $tmp/DATA_chat.jsonl (conversational) and on
# $tmp/DATA_text.jsonl (the rendered texts), the same losses and gradient norms.
chat_and_text() {
    local command=$1 data=$2 kind
    for kind in chat text; do
        local extra=()
        [ $kind = chat ] && extra=(--chat-template llama3)
        "$bin" "$command" "${train_args[@]}" --data "$tmp/${data}_$kind.jsonl" "${extra[@]}" --output "$tmp/${command}_$kind" \
            2> "$tmp/${command}_$kind.err" || fail "${command}_${kind}_runs" "$(tail -n 2 "$tmp/${command}_$kind.err")"
    done
    same_losses "${command}_chat_equals_rendered_text" "${command}_chat" "${command}_text"
}
chat_and_text sft sft
chat_and_text dpo pairs
chat_and_text rm pairs
chat_and_text kto unpaired
# A listwise reward model on conversational rankings: as on the rendered texts.
for kind in chat text; do
    extra=()
    [ $kind = chat ] && extra=(--chat-template llama3)
    "$bin" rm "${train_args[@]}" --data "$tmp/ranked_$kind.jsonl" "${extra[@]}" --loss listwise \
        --output "$tmp/rm_ranked_$kind" 2> "$tmp/rm_ranked_$kind.err" || fail "rm_ranked_${kind}_runs" "$(tail -n 2 "$tmp/rm_ranked_$kind.err")"
done
same_losses rm_listwise_chat_equals_rendered_text rm_ranked_chat rm_ranked_text

# infer on the pairs' conversational prompts (greedy, the reward model trained above): the
# same responses and rewards as on the rendered texts; the prompts written as rendered (the
# text rows' lack the template's BOS, which their tokenizer adds).
for kind in chat text; do
    extra=()
    [ $kind = chat ] && extra=(--chat-template llama3)
    "$bin" infer --model "$model" --reward-model "$tmp/rm_chat/final" --data "$tmp/pairs_$kind.jsonl" "${extra[@]}" --no-shuffle \
        --temperature 0 --max-new-tokens 4 --batch-size 4 --output "$tmp/infer_$kind.jsonl" 2> "$tmp/infer_$kind.err" ||
        fail "infer_${kind}_runs" "$(tail -n 2 "$tmp/infer_$kind.err")"
done
python3 - "$tmp" << 'PYEOF' && pass infer_chat_equals_rendered_text || fail infer_chat_equals_rendered_text "see above"
import json, sys
chat, text = ([json.loads(line) for line in open(f"{sys.argv[1]}/infer_{k}.jsonl")] for k in ("chat", "text"))
assert len(chat) == len(text) == 12, (len(chat), len(text))
assert [(r["response"], r["reward"]) for r in chat] == [(r["response"], r["reward"]) for r in text]
assert all(c["prompt"] == "<|begin_of_text|>" + t["prompt"] for c, t in zip(chat, text))
PYEOF
# infer --ref-scores: the pairs' own chosen and rejected responses scored, the same rewards.
for kind in chat text; do
    extra=()
    [ $kind = chat ] && extra=(--chat-template llama3)
    "$bin" infer --ref-scores --reward-model "$tmp/rm_chat/final" --data "$tmp/pairs_$kind.jsonl" "${extra[@]}" --no-shuffle \
        --batch-size 4 --output "$tmp/ref_scores_$kind.jsonl" 2> "$tmp/ref_scores_$kind.err" ||
        fail "ref_scores_${kind}_runs" "$(tail -n 2 "$tmp/ref_scores_$kind.err")"
done
python3 - "$tmp" << 'PYEOF' && pass ref_scores_chat_equals_rendered_text || fail ref_scores_chat_equals_rendered_text "see above"
import json, sys
chat, text = ([json.loads(line) for line in open(f"{sys.argv[1]}/ref_scores_{k}.jsonl")] for k in ("chat", "text"))
keys = ("response", "reward", "rejected_response", "rejected_reward")
assert len(chat) == len(text) == 12 and all(len(set(r) & set(keys)) == 4 for r in chat), (len(chat), len(text))
assert [[r[k] for k in keys] for r in chat] == [[r[k] for k in keys] for r in text]
PYEOF

# PPO (GRPO, the lexicon as reward: no reward model needed) on conversational prompts.
"$bin" ppo --actor-model "$model" --prompts "$tmp/prompts_chat.jsonl" --chat-template llama3 --reward lexicon \
    --gold-lexicon data/austen/lexicon.tsv --advantage-estimator grpo --samples-per-prompt 2 --rollout-batch-size 4 \
    --generation-batch-size 4 --micro-batch-size 4 --max-new-tokens 6 --max-iterations 1 --termination-condition token \
    --min-response-tokens 1 --quiet --threads 2 --output "$tmp/ppo_chat" 2> "$tmp/ppo_chat.err"
rc=$?
if [ $rc -eq 0 ] && [ -f "$tmp/ppo_chat/final/actor/model.safetensors" ]; then pass ppo_chat_runs
else fail ppo_chat_runs "exit $rc: $(tail -n 2 "$tmp/ppo_chat.err")"; fi

# A pipeline passes its top-level "chat-template" to every stage (sft -> dpo).
cat > "$tmp/pipeline.json" << JSONEOF
{"output": "$tmp/pipe", "model": "$model", "chat-template": "llama3", "threads": 2, "quiet": true,
 "sft": {"data": "$tmp/sft_chat.jsonl", "max-steps": 1, "max-seq-len": 96},
 "dpo": {"data": "$tmp/pairs_chat.jsonl", "max-steps": 1, "max-seq-len": 96}}
JSONEOF
"$bin" pipeline "$tmp/pipeline.json" 2> "$tmp/pipeline.err"
rc=$?
if [ $rc -eq 0 ] && [ -f "$tmp/pipe/dpo/final/model.safetensors" ] && grep -q '"chat-template": "llama3"' "$tmp/pipe/dpo.json"; then
    pass pipeline_chat_template
else fail pipeline_chat_template "exit $rc: $(tail -n 2 "$tmp/pipeline.err")"; fi

# SmolLM2 with its own template (found in the GGUF), one SFT step.
if [ -f "$smollm2" ]; then
    python3 -c "
import json
for i in range(2):
    print(json.dumps({'messages': [{'role': 'user', 'content': 'Name a fruit.'}, {'role': 'assistant', 'content': 'An apple.'}]}))
" > "$tmp/smol.jsonl"
    "$bin" sft --model "$smollm2" --data "$tmp/smol.jsonl" --max-seq-len 64 --per-device-train-batch-size 2 --max-steps 1 \
        --threads 2 --quiet --output "$tmp/sft_smol" 2> "$tmp/sft_smol.err"
    rc=$?
    if [ $rc -eq 0 ] && [ "$(json_values "$tmp/sft_smol/metrics.jsonl" train/loss | wc -w)" -eq 1 ]; then pass sft_smollm2_own_template
    else fail sft_smollm2_own_template "exit $rc: $(tail -n 2 "$tmp/sft_smol.err")"; fi
    rm -rf "$tmp/sft_smol"/checkpoint-* "$tmp/sft_smol/final" # 2 GB of SmolLM2 that nothing reads
else
    fail sft_smollm2_own_template "$smollm2 missing (scripts/fetch-model)"
fi

# --assistant-only-loss: every assistant turn of a {"messages"} row trained. The first step's
# loss (before any update) must be the mean negative log-prob, by `marlhf logprobs` on the
# fixture's ids of the whole conversation, over the tokens the fixture marks trained (from
# the tokenizer's character offsets: each assistant message's text and end of turn, and the
# EOS). Without the option only the last turn counts, which gives another loss.
if nm "$bin" 2> /dev/null | grep -q '__asan_init'; then
    # Its numbers are the plain build's to check; the tiny model's runs above take the same
    # code under the sanitizers (and test_chat_data.c the turns).
    echo "SKIP assistant_only_loss: $bin is built with AddressSanitizer; the plain build checks the losses"
elif [ -f "$smollm2" ]; then
    python3 - tests/fixtures/chat_data/cases.json "$tmp" << 'PYEOF'
import json, sys
for c in json.load(open(sys.argv[1]))["cases"]:
    if c["name"] in ("smollm2/sft_messages", "smollm2/sft_messages_edges"):
        tag = c["name"].split("/")[1]
        open(f"{sys.argv[2]}/{tag}.jsonl", "w").write(c["row"] + "\n")
        open(f"{sys.argv[2]}/{tag}_ids.jsonl", "w").write(json.dumps({"ids": c["turns"]["ids"]}) + "\n")
        open(f"{sys.argv[2]}/{tag}_whole_ids.jsonl", "w").write(json.dumps({"ids": c["whole"]["ids"]}) + "\n")
        json.dump(c["turns"]["trained"], open(f"{sys.argv[2]}/{tag}_trained.json", "w"))
PYEOF
    for tag in sft_messages sft_messages_edges; do
        for mode in all last; do
            extra=(); [ $mode = all ] && extra=(--assistant-only-loss)
            "$bin" sft --model "$smollm2" --data "$tmp/$tag.jsonl" --max-seq-len 128 --per-device-train-batch-size 1 \
                --max-steps 1 --threads 2 --quiet "${extra[@]}" --output "$tmp/turns_${tag}_$mode" 2> "$tmp/turns_$tag.err" ||
                fail "assistant_only_loss_$tag" "$(tail -n 2 "$tmp/turns_$tag.err")"
            # Only the metrics are read: SmolLM2's checkpoint and final model are 2 GB a run.
            rm -rf "$tmp/turns_${tag}_$mode"/checkpoint-* "$tmp/turns_${tag}_$mode/final"
        done
        "$bin" logprobs --model "$smollm2" --input "$tmp/${tag}_ids.jsonl" --threads 2 > "$tmp/${tag}_logprobs.jsonl" \
            2> "$tmp/turns_$tag.err"
        if python3 - "$tmp/${tag}_logprobs.jsonl" "$tmp/${tag}_trained.json" "$tmp/turns_${tag}_all/metrics.jsonl" \
            "$tmp/turns_${tag}_last/metrics.jsonl" << 'PYEOF'
import json, sys
logprobs = json.loads(open(sys.argv[1]).readline())["logprobs"]  # logprobs[t - 1]: token t given the ones before
trained = json.load(open(sys.argv[2]))
counted = [-logprobs[t - 1] for t in range(1, len(trained)) if trained[t]]
want = sum(counted) / len(counted)
loss = lambda path: [json.loads(l)["train/loss"] for l in open(path) if "train/loss" in l][0]
got, last = loss(sys.argv[3]), loss(sys.argv[4])
print(f"loss {got:.6f}, want {want:.6f} over {len(counted)} tokens; last turn only {last:.6f}", file=sys.stderr)
sys.exit(0 if abs(got - want) <= 1e-4 * abs(want) and abs(last - want) > 1e-3 * abs(want) else 1)
PYEOF
        then pass "assistant_only_loss_$tag"; else fail "assistant_only_loss_$tag" "see above"; fi

        # --completion-only-loss false: every token of the whole conversation (TRL's SFTTrainer
        # default on {"messages"} rows), the messages after the last assistant message included
        # (the edges row ends with a user message): the mean over every token after the first of
        # the fixture's ids of the conversation as transformers renders it whole.
        "$bin" sft --model "$smollm2" --data "$tmp/$tag.jsonl" --max-seq-len 128 --per-device-train-batch-size 1 \
            --max-steps 1 --threads 2 --quiet --completion-only-loss false --output "$tmp/whole_$tag" \
            2> "$tmp/whole_$tag.err" || fail "completion_only_loss_false_$tag" "$(tail -n 2 "$tmp/whole_$tag.err")"
        rm -rf "$tmp/whole_$tag"/checkpoint-* "$tmp/whole_$tag/final"
        "$bin" logprobs --model "$smollm2" --input "$tmp/${tag}_whole_ids.jsonl" --threads 2 \
            > "$tmp/${tag}_whole_logprobs.jsonl" 2> "$tmp/whole_$tag.err"
        if python3 - "$tmp/${tag}_whole_logprobs.jsonl" "$tmp/${tag}_logprobs.jsonl" "$tmp/whole_$tag/metrics.jsonl" \
            "$tag" << 'PYEOF'
import json, sys
mean = lambda values: sum(values) / len(values)
whole = json.loads(open(sys.argv[1]).readline())["logprobs"]
through_last = json.loads(open(sys.argv[2]).readline())["logprobs"]  # the conversation through its last assistant message
want, without_tail = -mean(whole), -mean(through_last)
got = [json.loads(l)["train/loss"] for l in open(sys.argv[3]) if "train/loss" in l][0]
print(f"loss {got:.6f}, want {want:.6f} over {len(whole)} tokens; through the last assistant message "
      f"{without_tail:.6f} over {len(through_last)}", file=sys.stderr)
ok = abs(got - want) <= 1e-4 * abs(want)
if sys.argv[4] == "sft_messages_edges":  # a user message follows the last assistant one
    ok = ok and len(whole) > len(through_last) and abs(got - without_tail) > 1e-3 * abs(want)
else:
    ok = ok and whole == through_last
sys.exit(0 if ok else 1)
PYEOF
        then pass "completion_only_loss_false_$tag"; else fail "completion_only_loss_false_$tag" "see above"; fi
    done
else
    fail assistant_only_loss "$smollm2 missing (scripts/fetch-model)"
fi
expect_error assistant_only_loss_text_rows "--assistant-only-loss" "$bin" sft "${train_args[@]}" --data "$tmp/sft_text.jsonl" \
    --assistant-only-loss --output "$tmp/x_turns"

# --- bad input -----------------------------------------------------------------------------
u='{"role": "user", "content": "q"}'
a='{"role": "assistant", "content": "a"}'
printf '{"messages": [%s, %s]}\n{"messages": [{"content": "q"}, %s]}\n' "$u" "$a" "$a" > "$tmp/no_role.jsonl"
printf '{"prompt": [{"role": "user", "content": ["q"]}], "completion": [%s]}\n' "$a" > "$tmp/content_list.jsonl"
printf '{"messages": [%s, %s]}\n{"messages": [%s]}\n' "$u" "$a" "$u" > "$tmp/no_assistant.jsonl"
printf '{"prompt": [%s], "completion": [%s]}\n' "$u" "$u" > "$tmp/not_prefix.jsonl"
printf '{"prompt": [%s], "chosen": [%s], "rejected": [%s]}\n' "$u" "$a" "$u" > "$tmp/not_prefix_pairs.jsonl"
printf '{"prompt": [%s], "responses": [[%s], [%s]]}\n{"prompt": [%s], "responses": [[%s], "b"]}\n' \
    "$u" "$a" "$a" "$u" "$a" > "$tmp/ranked_text_response.jsonl"
printf '{"prompt": [%s], "responses": [[%s]]}\n' "$u" "$a" > "$tmp/ranked_one.jsonl"
mkdir -p "$tmp/no_template"
cp "$model"/config.json "$model"/tokenizer.json "$model"/model.safetensors "$tmp/no_template/"
python3 -c "
import json, sys
c = json.load(open('$model/tokenizer_config.json')); del c['chat_template']
json.dump(c, open('$tmp/no_template/tokenizer_config.json', 'w'))"
sft_bad=(--max-steps 1 --threads 2 --quiet --output "$tmp/bad")
expect_error bad_no_role "missing field \"messages[0].role\" ($tmp/no_role.jsonl:2)" \
    "$bin" sft --model "$model" --data "$tmp/no_role.jsonl" "${sft_bad[@]}"
expect_error bad_content_not_string "field \"prompt[0].content\" is an array, expected a string ($tmp/content_list.jsonl:1)" \
    "$bin" sft --model "$model" --data "$tmp/content_list.jsonl" "${sft_bad[@]}"
expect_error bad_no_assistant "no assistant message to train on ($tmp/no_assistant.jsonl:2)" \
    "$bin" sft --model "$model" --data "$tmp/no_assistant.jsonl" "${sft_bad[@]}"
expect_error bad_not_prefix "does not extend the prompt's rendering" \
    "$bin" sft --model "$model" --data "$tmp/not_prefix.jsonl" --chat-template llama3 "${sft_bad[@]}"
grep -qF "($tmp/not_prefix.jsonl:1)" "$tmp/stderr" && pass bad_not_prefix_names_line || fail bad_not_prefix_names_line "$(cat "$tmp/stderr")"
expect_error bad_not_prefix_dpo "($tmp/not_prefix_pairs.jsonl:1)" \
    "$bin" dpo --model "$model" --data "$tmp/not_prefix_pairs.jsonl" --chat-template smollm2 "${sft_bad[@]}"
expect_error bad_ranked_text_response \
    "field \"responses[1]\" is a string, expected a list of messages ($tmp/ranked_text_response.jsonl:2)" \
    "$bin" rm --model "$model" --data "$tmp/ranked_text_response.jsonl" --loss listwise --chat-template llama3 "${sft_bad[@]}"
expect_error bad_ranked_one "field \"responses\" has 1 entry, expected at least 2 ($tmp/ranked_one.jsonl:1)" \
    "$bin" rm --model "$model" --data "$tmp/ranked_one.jsonl" --loss listwise --chat-template llama3 "${sft_bad[@]}"
expect_error bad_no_template "the data is conversational ($tmp/sft_chat.jsonl) and the model has no recognised chat template ($tmp/no_template)" \
    "$bin" sft --model "$tmp/no_template" --data "$tmp/sft_chat.jsonl" "${sft_bad[@]}"
expect_error bad_no_template_ppo "the data is conversational ($tmp/prompts_chat.jsonl)" \
    "$bin" ppo --actor-model "$tmp/no_template" --prompts "$tmp/prompts_chat.jsonl" --reward lexicon \
    --gold-lexicon data/austen/lexicon.tsv --quiet --threads 2 --output "$tmp/bad_ppo"
expect_error bad_chat_template_text_data "--chat-template" \
    "$bin" sft --model "$model" --data "$tmp/sft_text.jsonl" --chat-template llama3 "${sft_bad[@]}"
expect_error bad_chat_template_name "unknown" \
    "$bin" sft --model "$model" --data "$tmp/sft_chat.jsonl" --chat-template no-such-template "${sft_bad[@]}"
# The fields this layer reads beside the messages: a row's tools, its calls, its template
# variables, and text pairs without a shared prompt -- one line, exit 2, file:line.
printf '{"prompt": [%s], "completion": [%s], "tools": "[{not json"}\n' "$u" "$a" > "$tmp/bad_tools.jsonl"
printf '{"prompt": [%s], "completion": [{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "[1]"}}]}]}\n' \
    "$u" > "$tmp/bad_call.jsonl"
printf '{"prompt": [%s], "completion": [%s], "chat_template_kwargs": {"add_vision_id": true}}\n' "$u" "$a" > "$tmp/bad_kwargs.jsonl"
printf '{"chosen": "Yes.", "rejected": "No."}\n' > "$tmp/bad_implicit.jsonl"
expect_error bad_tools_not_json "field \"tools\" is a string that does not hold JSON" \
    "$bin" sft --model "$model" --data "$tmp/bad_tools.jsonl" --chat-template llama3.1 "${sft_bad[@]}"
grep -qF "($tmp/bad_tools.jsonl:1)" "$tmp/stderr" && pass bad_tools_names_line || fail bad_tools_names_line "$(cat "$tmp/stderr")"
expect_error bad_call_arguments "completion[0].tool_calls[0].function.arguments\" is a string that does not hold a JSON object ($tmp/bad_call.jsonl:1)" \
    "$bin" sft --model "$model" --data "$tmp/bad_call.jsonl" --chat-template llama3.1 "${sft_bad[@]}"
expect_error bad_template_kwargs "chat_template_kwargs.add_vision_id is not a variable" \
    "$bin" sft --model "$model" --data "$tmp/bad_kwargs.jsonl" --chat-template qwen3 "${sft_bad[@]}"
expect_error bad_implicit_prompt "share no leading text to use as the prompt ($tmp/bad_implicit.jsonl:1)" \
    "$bin" dpo --model "$model" --data "$tmp/bad_implicit.jsonl" "${sft_bad[@]}"
[ ! -e "$tmp/bad/final" ] && pass bad_input_writes_nothing || fail bad_input_writes_nothing "$tmp/bad/final exists"

exit $((failures > 0))
