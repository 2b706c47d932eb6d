#!/usr/bin/env bash
# marlhf generate and chat on SmolLM2-135M-Instruct (fetched by `make test`): greedy output
# as transformers gives it, reproducible sampling independent of batch size, streaming chat,
# structured outputs (--json-schema with a pattern, --json, --regex answers that Python's
# re.fullmatch accepts, --choice, --grammar / --grammar-file answers), and bad input. Prints PASS/FAIL per case.
set -u
cd "$(dirname "$0")/../.."
bin=${MARLHF_BIN:-build/marlhf}
tmp=${MARLHF_TEST_TMP:-/tmp}/cli_generate
rm -rf "$tmp" && mkdir -p "$tmp"
model=models/SmolLM2-135M-Instruct.Q4_1.gguf
failures=0
. tests/cli_helpers.sh
# Every case runs SmolLM2: the plain build's to check (tests/cli_helpers.sh real_model_runs;
# under the sanitizers test_generate.c and the tiny model's serve.sh take generation's code).
real_model_runs "$model" "generate.sh (every case is on SmolLM2)" || exit 0
# Greedy chat answer: the same text transformers' greedy decoding gives (greedy.json).
out=$("$bin" generate --model "$model" --chat --greedy --max-new-tokens 40 "What is the capital of France?" 2>/dev/null)
if echo "$out" | grep -q '"response":"The capital of France is Paris."' && echo "$out" | grep -q '"stop_reason":"stop_token"'; then
    pass greedy_chat_answer
else
    fail greedy_chat_answer "$out"
fi

# Sampling: same seed -> same text; a row's text does not depend on the batch size.
cat > "$tmp/prompts.jsonl" <<'JSONL'
{"prompt": "Tell me a short story about a cat."}
{"messages": [{"role": "user", "content": "Name a color."}]}
{"prompt": "Once upon a time"}
JSONL
run() { "$bin" generate --model "$model" --input "$tmp/prompts.jsonl" --chat --max-new-tokens 24 --seed 7 --temperature 0.9 --top-k 40 --top-p 0.95 "$@" 2>/dev/null | python3 -c 'import sys, json; [print(json.loads(l)["response"]) for l in sys.stdin]'; }
a=$(run --batch-size 3); b=$(run --batch-size 3); c=$(run --batch-size 1); d=$(run --batch-size 3 --seed 8)
[ -n "$a" ] && [ "$a" = "$b" ] && pass sampling_reproducible || fail sampling_reproducible "two runs differ"
[ "$a" = "$c" ] && pass sampling_batch_invariant || fail sampling_batch_invariant "batch 3 vs 1 differ"
[ "$a" != "$d" ] && pass sampling_seed_matters || fail sampling_seed_matters "seed 7 and 8 agree"

# min-p and the penalties (gen/sampler.c; their arithmetic is test_generate's against
# transformers'): --min-p 1 keeps only the most likely token, greedy decoding's answers; a
# repetition penalty of 1 and penalties of 0 are the plain run's bytes; a repetition penalty
# changes the greedy answers, and the streamed chat (continuous batching) gives generate's.
e=$(run --batch-size 3 --repetition-penalty 1 --presence-penalty 0 --frequency-penalty 0)
[ "$a" = "$e" ] && pass sampler_penalties_off || fail sampler_penalties_off "$e"
greedy=$("$bin" generate --model "$model" --input "$tmp/prompts.jsonl" --chat --max-new-tokens 24 --greedy 2>/dev/null)
min_p=$("$bin" generate --model "$model" --input "$tmp/prompts.jsonl" --chat --max-new-tokens 24 --temperature 1 \
    --top-k 0 --min-p 1 2>/dev/null | python3 -c 'import sys, json; [print(json.loads(l)["response"]) for l in sys.stdin]')
greedy_text=$(echo "$greedy" | python3 -c 'import sys, json; [print(json.loads(l)["response"]) for l in sys.stdin]')
[ -n "$min_p" ] && [ "$min_p" = "$greedy_text" ] && pass min_p_one_is_greedy || fail min_p_one_is_greedy "$min_p"
penalized=$("$bin" generate --model "$model" --chat --max-new-tokens 40 --greedy --repetition-penalty 1.3 \
    --frequency-penalty 0.5 "List the days of the week." 2>/dev/null)
plain=$("$bin" generate --model "$model" --chat --max-new-tokens 40 --greedy "List the days of the week." 2>/dev/null)
chat_penalized=$(printf 'List the days of the week.\n' | "$bin" chat --model "$model" --max-new-tokens 40 --temperature 0 \
    --repetition-penalty 1.3 --frequency-penalty 0.5 2>/dev/null)
python3 - "$penalized" "$plain" "$chat_penalized" << 'PYEOF' &&
import json, sys
penalized, plain = json.loads(sys.argv[1])["response"], json.loads(sys.argv[2])["response"]
print(f"penalized: {penalized!r}; plain: {plain!r}; chat: {sys.argv[3]!r}", file=sys.stderr)
sys.exit(0 if penalized != plain and penalized.strip() and penalized.strip() in sys.argv[3] else 1)
PYEOF
    pass repetition_penalty_changes_greedy || fail repetition_penalty_changes_greedy "$penalized"
# --logit-bias ID:100 makes every greedy token that one (the ids written are all ID); an id
# outside the vocabulary or a malformed list is a one-line error.
biased=$("$bin" generate --model "$model" --greedy --max-new-tokens 5 --logit-bias 330:100 "Hello" 2>/dev/null |
    python3 -c 'import json, sys; print(json.load(sys.stdin)["ids"])')
[ "$biased" = "[330, 330, 330, 330, 330]" ] && pass logit_bias_forces_a_token || fail logit_bias_forces_a_token "$biased"
expect_error logit_bias_vocabulary "token 999999 is not in the model's vocabulary" "$bin" generate --model "$model" \
    --logit-bias 999999:1 hello
expect_error logit_bias_format "--logit-bias must be ID:BIAS pairs" "$bin" chat --model "$model" --logit-bias 5:200
expect_error min_p_range "--min-p must be in [0, 1]" "$bin" generate --model "$model" --min-p 1.5 hello
expect_error repetition_penalty_range "--repetition-penalty must be positive" "$bin" generate --model "$model" \
    --repetition-penalty 0 hello
expect_error presence_penalty_range "--presence-penalty must be in [-2, 2]" "$bin" chat --model "$model" \
    --presence-penalty 3

# Stop string: the row stops, and the response is cut before it.
out=$("$bin" generate --model "$model" --chat --greedy --max-new-tokens 40 --stop "Paris" "What is the capital of France?" 2>/dev/null)
if echo "$out" | grep -q '"response":"The capital of France is "' && echo "$out" | grep -q '"stop_reason":"stop_string"'; then
    pass stop_string
else
    fail stop_string "$out"
fi

# Output to a file: written whole.
"$bin" generate --model "$model" --greedy --max-new-tokens 4 --output "$tmp/out.jsonl" "Hello" 2>/dev/null
[ "$(wc -l < "$tmp/out.jsonl")" -eq 1 ] && pass output_file || fail output_file "$(cat "$tmp/out.jsonl")"

# Chat: two turns from standard input, the replies streamed to standard output.
chat=$(printf 'What is the capital of France?\n/reset\nWhat is 2+2?\n' | "$bin" chat --model "$model" --temperature 0 --max-new-tokens 40 2>/dev/null)
if echo "$chat" | grep -q "The capital of France is Paris." && echo "$chat" | grep -q "4"; then pass chat_turns; else fail chat_turns "$chat"; fi
# chat's prompt cache (each turn computes only what follows the previous reply) gives the
# replies of recomputing the whole conversation every turn (greedy, three turns).
turns='Tell me about cats.\nWhat do they eat?\nHow long do they live?\n'
cached=$(printf "$turns" | "$bin" chat --model "$model" --temperature 0 --max-new-tokens 24 2>/dev/null)
recomputed=$(printf "$turns" | "$bin" chat --model "$model" --temperature 0 --max-new-tokens 24 --prompt-cache 0 2>/dev/null)
[ -n "$cached" ] && [ "$cached" = "$recomputed" ] && [ "$(echo "$cached" | grep -c '^> ')" -ge 3 ] && pass chat_prompt_cache ||
    fail chat_prompt_cache "$cached vs $recomputed"
expect_error chat_bad_prompt_cache "--prompt-cache" "$bin" chat --model "$model" --prompt-cache 2 < /dev/null
# chat's structured outputs (generate's options): every reply of the conversation is one of
# the choices, or matches the pattern whole.
chat=$(printf 'Pick a colour.\nAnd another one?\n' | "$bin" chat --model "$model" --temperature 0 --max-new-tokens 16 \
    --choice "red,green,blue" 2>/dev/null)
replies=$(echo "$chat" | sed -n 's/^> \(..*\)$/\1/p')
[ "$(echo "$replies" | wc -l)" -eq 2 ] && ! echo "$replies" | grep -qvxE 'red|green|blue' && pass chat_choice ||
    fail chat_choice "$chat"
chat=$(printf 'When was Marie Curie born? Give the year.\n' | "$bin" chat --model "$model" --temperature 0 \
    --max-new-tokens 16 --regex '1[0-9]{3}' 2>/dev/null)
echo "$chat" | grep -qxE '> 1[0-9]{3}' && pass chat_regex || fail chat_regex "$chat"
expect_error chat_two_constraints "give one of" "$bin" chat --model "$model" --json --regex a < /dev/null

# Bad input: exit 2, one line naming the problem.
printf '{"prompt": "ok"}\n{"prompt": 5}\n' > "$tmp/bad.jsonl"
expect_error generate_bad_row "$tmp/bad.jsonl:2" "$bin" generate --model "$model" --input "$tmp/bad.jsonl"
printf '{"messages": [{"role": "user"}]}\n' > "$tmp/bad_messages.jsonl"
expect_error generate_bad_messages "$tmp/bad_messages.jsonl:1" "$bin" generate --model "$model" --input "$tmp/bad_messages.jsonl"
expect_error generate_bad_temperature "--temperature" "$bin" generate --model "$model" --temperature -1 "hi"
expect_error generate_bad_top_p "--top-p" "$bin" generate --model "$model" --top-p 1.5 "hi"
# Structured outputs: --json-schema / --json (docs/serving.md "Structured outputs").
printf '{"type": "string", "format": "email"}' > "$tmp/format.schema.json"
printf '{"type": "object", ' > "$tmp/broken.schema.json"
printf '{"type": "object", "properties": {"city": {"type": "string", "maxLength": 20, "pattern": "^[A-Z][a-z]"}, "population": {"type": "integer"}}, "required": ["city", "population"]}' > "$tmp/city.schema.json"
echo kept > "$tmp/kept.jsonl"
expect_error generate_json_schema_missing "--json-schema $tmp/none.json" "$bin" generate --model "$model" --json-schema "$tmp/none.json" "hi"
expect_error generate_json_schema_not_json "--json-schema $tmp/broken.schema.json: not JSON" "$bin" generate --model "$model" --json-schema "$tmp/broken.schema.json" "hi"
expect_error generate_json_schema_unsupported "--json-schema $tmp/format.schema.json: 'format' 'email' is not supported" \
    "$bin" generate --model "$model" --json-schema "$tmp/format.schema.json" --output "$tmp/kept.jsonl" "hi"
[ "$(cat "$tmp/kept.jsonl")" = kept ] && pass generate_json_schema_error_keeps_output || fail generate_json_schema_error_keeps_output "overwritten"
expect_error generate_json_and_schema "give one of --json, --json-schema, --regex, --choice, --grammar and --grammar-file" "$bin" generate --model "$model" --json --json-schema "$tmp/city.schema.json" "hi"
expect_error generate_regex_and_choice "give one of --json, --json-schema, --regex, --choice, --grammar and --grammar-file" "$bin" generate --model "$model" --regex a --choice a,b "hi"
expect_error generate_regex_bad "--regex: lookahead and lookbehind are not supported (at position 1)" \
    "$bin" generate --model "$model" --regex 'a(?=b)' --output "$tmp/kept.jsonl" "hi"
expect_error generate_regex_cap "--regex: a repetition bound above 1000 is not supported (at position 1)" "$bin" generate --model "$model" --regex 'a{2000}' "hi"
expect_error generate_choice_bad_json "--choice: item 1 of the JSON list is not a string" "$bin" generate --model "$model" --choice '["a", 2]' "hi"
[ "$(cat "$tmp/kept.jsonl")" = kept ] && pass generate_regex_error_keeps_output || fail generate_regex_error_keeps_output "overwritten"
out=$("$bin" generate --model "$model" --chat --greedy --max-new-tokens 40 --json-schema "$tmp/city.schema.json" \
    "Give the largest city of France and its population as JSON." 2>/dev/null)
if why=$(python3 -c 'import json, re, sys
r = json.loads(sys.argv[1]); v = json.loads(r["response"])
assert r["stop_reason"] == "stop_token", r
assert set(v) == {"city", "population"} and isinstance(v["city"], str) and len(v["city"]) <= 20, v
assert re.search("^[A-Z][a-z]", v["city"]), v
assert isinstance(v["population"], int) and not isinstance(v["population"], bool), v' "$out" 2>&1); then
    pass generate_json_schema_answer
else
    fail generate_json_schema_answer "$out $why"
fi
out=$("$bin" generate --model "$model" --chat --max-new-tokens 40 --json --num-return-sequences 2 --seed 3 "Describe a cat." 2>/dev/null)
if why=$(python3 -c 'import json, sys
rows = [json.loads(l) for l in sys.argv[1].splitlines()]
assert len(rows) == 2, rows
for r in rows:
    if r["stop_reason"] == "stop_token": assert isinstance(json.loads(r["response"]), dict), r
    else: assert r["stop_reason"] == "length" and r["response"].startswith("{"), r' "$out" 2>&1); then
    pass generate_json_object_samples
else
    fail generate_json_object_samples "$out $why"
fi
# --regex: the whole answer matches (Python's re.fullmatch); --choice: the answer is one of them.
regex='(19|20)\d{2}-(0[1-9]|1[0-2])-[0-3]\d'
out=$("$bin" generate --model "$model" --chat --max-new-tokens 16 --regex "$regex" --num-return-sequences 2 --seed 5 \
    --temperature 0.8 "When did the first man walk on the Moon? Answer with the date." 2>/dev/null)
if why=$(python3 -c 'import json, re, sys
rows = [json.loads(l) for l in sys.argv[1].splitlines()]
assert len(rows) == 2, rows
for r in rows: assert r["stop_reason"] == "stop_token" and re.fullmatch(sys.argv[2], r["response"]), r
print(" ".join(r["response"] for r in rows))' "$out" "$regex" 2>&1); then
    pass "generate_regex_answers $why"
else
    fail generate_regex_answers "$out $why"
fi
out=$("$bin" generate --model "$model" --chat --greedy --max-new-tokens 8 --choice '["positive", "negative", "mixed, unclear"]' \
    "Is this review positive or negative? \"The food was wonderful.\"" 2>/dev/null)
if why=$(python3 -c 'import json, sys
r = json.loads(sys.argv[1])
assert r["stop_reason"] == "stop_token" and r["response"] in ("positive", "negative", "mixed, unclear"), r
print(r["response"])' "$out" 2>&1); then
    pass "generate_choice_answer $why"
else
    fail generate_choice_answer "$out $why"
fi
# --grammar / --grammar-file (GBNF): greedy and sampled answers parse under the grammar (checked
# by Python's re.fullmatch on the equivalent regular expression); malformed grammars refused
# naming the option, the file, the line and the column, the output file kept.
cat > "$tmp/list.gbnf" <<'GBNF'
# a list of numbers, or of lists of numbers
root ::= "[" item ("," " "? item){0,3} "]"
item ::= number | "[" number ("," " "? number){0,2} "]"
number ::= "-"? [0-9]{1,3}
GBNF
list_regex='\[(-?\d{1,3}|\[-?\d{1,3}(, ?-?\d{1,3}){0,2}\])(, ?(-?\d{1,3}|\[-?\d{1,3}(, ?-?\d{1,3}){0,2}\])){0,3}\]'
check_grammar_rows() { # OUT COUNT REGEX
    python3 -c 'import json, re, sys
rows = [json.loads(l) for l in sys.argv[1].splitlines()]
assert len(rows) == int(sys.argv[2]), rows
for r in rows: assert r["stop_reason"] == "stop_token" and re.fullmatch(sys.argv[3], r["response"]), r
print(" ".join(r["response"] for r in rows))' "$@" 2>&1
}
out=$("$bin" generate --model "$model" --chat --greedy --max-new-tokens 40 --grammar-file "$tmp/list.gbnf" \
    "Give a list of three small numbers." 2>/dev/null)
why=$(check_grammar_rows "$out" 1 "$list_regex") && pass "generate_grammar_file_greedy $why" || fail generate_grammar_file_greedy "$out $why"
out=$("$bin" generate --model "$model" --chat --max-new-tokens 40 --grammar "$(cat "$tmp/list.gbnf")" --num-return-sequences 2 \
    --seed 5 --temperature 0.8 "Give a list of two lists of numbers." 2>/dev/null)
why=$(check_grammar_rows "$out" 2 "$list_regex") && pass "generate_grammar_sampled $why" || fail generate_grammar_sampled "$out $why"
chat=$(printf 'Is the sky blue?\nIs grass red?\n' | "$bin" chat --model "$model" --temperature 0 --max-new-tokens 8 \
    --grammar 'root ::= ("yes" | "no") "."' 2>/dev/null)
[ "$(echo "$chat" | grep -cxE '> (yes|no)\.')" -eq 2 ] && pass chat_grammar || fail chat_grammar "$chat"
printf 'root ::= item\nitem ::= "a" |\n  [b-' > "$tmp/bad.gbnf"
echo kept > "$tmp/kept.jsonl"
expect_error generate_grammar_file_bad "--grammar-file $tmp/bad.gbnf: unterminated character class (at line 3, column 3)" \
    "$bin" generate --model "$model" --grammar-file "$tmp/bad.gbnf" --output "$tmp/kept.jsonl" "hi"
expect_error generate_grammar_left_recursive "--grammar: the rule 'expr' is left-recursive" \
    "$bin" generate --model "$model" --grammar $'root ::= expr\nexpr ::= expr "+" "1" | "1"' --output "$tmp/kept.jsonl" "hi"
[ "$(cat "$tmp/kept.jsonl")" = kept ] && pass generate_grammar_error_keeps_output || fail generate_grammar_error_keeps_output "overwritten"
expect_error generate_grammar_file_missing "--grammar-file: cannot open file" "$bin" generate --model "$model" --grammar-file "$tmp/none.gbnf" "hi"
expect_error generate_grammar_and_regex "give one of --json, --json-schema, --regex, --choice, --grammar and --grammar-file" \
    "$bin" generate --model "$model" --grammar 'root ::= "a"' --regex a "hi"
expect_error chat_grammar_bad "--grammar: unknown escape \\q (at line 1, column 11)" "$bin" chat --model "$model" --grammar 'root ::= "\q"' < /dev/null
expect_error generate_no_prompt "--input" "$bin" generate --model "$model"
# --min-new-tokens: the end of turn that greedy decoding picks after 3 tokens waits until 20.
short=$("$bin" generate --model "$model" --chat --greedy --max-new-tokens 40 --output - "Reply with one word: yes or no?" 2> /dev/null)
long=$("$bin" generate --model "$model" --chat --greedy --max-new-tokens 40 --min-new-tokens 20 --output - \
    "Reply with one word: yes or no?" 2> /dev/null)
python3 -c "import json, sys; a, b = (json.loads(x) for x in sys.argv[1:]); sys.exit(0 if a['response_tokens'] < 20 <= b['response_tokens'] else 1)" \
    "$short" "$long" 2> /dev/null && pass generate_min_new_tokens || fail generate_min_new_tokens "$short / $long"
expect_error generate_bad_min_new_tokens "--min-new-tokens" "$bin" generate --model "$model" --max-new-tokens 4 \
    --min-new-tokens 5 "hi"
expect_error generate_unknown_template "chat template" "$bin" generate --model "$model" --chat --chat-template nonsense "hi"

# --no-thinking: Qwen3's template (forced here on SmolLM2's vocabulary) drops the earlier
# turn's reasoning and ends the prompt with an empty think block: the row's prompt is that
# text, and it has as many tokens as the text tokenized alone. Without the switch there is
# no think block. Templates without the switch refuse the option.
printf '%s\n' '{"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "<think>r</think>A"}, {"role": "user", "content": "q2"}]}' \
    > "$tmp/thinking.jsonl"
thinking_prompt='<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\nA<|im_end|>\n<|im_start|>user\nq2<|im_end|>\n<|im_start|>assistant\n'
python3 -c 'import json, sys; print(json.dumps({"text": sys.argv[1].replace("\\n", "\n") + "<think>\n\n</think>\n\n"}))' \
    "$thinking_prompt" > "$tmp/thinking_text.jsonl"
"$bin" tokenize --model "$model" --input "$tmp/thinking_text.jsonl" > "$tmp/thinking_ids.jsonl" 2> /dev/null
for mode in off on; do
    flag=$([ "$mode" = off ] && echo --no-thinking)
    "$bin" generate --model "$model" --input "$tmp/thinking.jsonl" --chat-template qwen3 --greedy --max-new-tokens 1 \
        $flag > "$tmp/thinking_$mode.jsonl" 2> /dev/null
done
python3 - "$tmp" "$thinking_prompt" <<'PY' && pass generate_no_thinking || fail generate_no_thinking "see $tmp/thinking_*.jsonl"
import json, sys
tmp, prompt = sys.argv[1], sys.argv[2].replace("\\n", "\n")
off = json.loads(open(f"{tmp}/thinking_off.jsonl").readline())
on = json.loads(open(f"{tmp}/thinking_on.jsonl").readline())
ids = json.loads(open(f"{tmp}/thinking_ids.jsonl").readline())["ids"]
assert off["prompt"] == prompt + "<think>\n\n</think>\n\n", off["prompt"]
assert off["prompt_tokens"] == len(ids), (off["prompt_tokens"], len(ids))
assert on["prompt"] == prompt, on["prompt"]
PY
"$bin" chat --model "$model" --chat-template qwen3 --no-thinking < /dev/null > /dev/null 2> "$tmp/chat_no_thinking.err"
grep -q "(qwen3 template, thinking off)" "$tmp/chat_no_thinking.err" && pass chat_no_thinking ||
    fail chat_no_thinking "$(head -n 3 "$tmp/chat_no_thinking.err")"
expect_error generate_no_thinking_unsupported "--no-thinking: chat template smollm2 has no thinking switch" \
    "$bin" generate --model "$model" --chat --no-thinking "hi"
expect_error generate_bad_no_thinking "--no-thinking" "$bin" generate --model "$model" --chat --no-thinking=maybe "hi"
expect_error chat_no_thinking_unsupported "--no-thinking: chat template chatml has no thinking switch" \
    "$bin" chat --model "$model" --chat-template chatml --no-thinking < /dev/null

# --num-return-sequences 3: three answers per prompt, in prompt order with "sample" 0, 1, 2;
# sample 0 is the answer without the option, the others differ, and the batch size changes
# nothing (the three rows share the prompt's prefill).
"$bin" generate --model "$model" --input "$tmp/prompts.jsonl" --chat --max-new-tokens 12 --seed 7 --temperature 0.9 \
    --num-return-sequences 3 --batch-size 4 > "$tmp/n3.jsonl" 2> /dev/null
"$bin" generate --model "$model" --input "$tmp/prompts.jsonl" --chat --max-new-tokens 12 --seed 7 --temperature 0.9 \
    --num-return-sequences 3 --batch-size 1 > "$tmp/n3_b1.jsonl" 2> /dev/null
"$bin" generate --model "$model" --input "$tmp/prompts.jsonl" --chat --max-new-tokens 12 --seed 7 --temperature 0.9 \
    > "$tmp/n1.jsonl" 2> /dev/null
python3 - "$tmp/n3.jsonl" "$tmp/n1.jsonl" "$tmp/n3_b1.jsonl" <<'PY' &&
import json, sys
n3, n1, n3_b1 = ([json.loads(l) for l in open(p)] for p in sys.argv[1:])
ok = len(n3) == 9 and [r["sample"] for r in n3] == [0, 1, 2] * 3
for i, plain in enumerate(n1):
    group = n3[3 * i:3 * i + 3]
    ok &= all(r["prompt"] == plain["prompt"] for r in group) and group[0]["ids"] == plain["ids"]
    ok &= len({tuple(r["ids"]) for r in group}) == 3
ok &= [r["ids"] for r in n3] == [r["ids"] for r in n3_b1]  # the tokens; log-probs move by float rounding
sys.exit(0 if ok else 1)
PY
    pass num_return_sequences || fail num_return_sequences "$(head -c 300 "$tmp/n3.jsonl")"
expect_error generate_bad_num_return_sequences "--num-return-sequences" "$bin" generate --model "$model" \
    --num-return-sequences 0 "hi"
expect_error generate_num_return_sequences_greedy "--num-return-sequences" "$bin" generate --model "$model" --greedy \
    --num-return-sequences 2 "hi"
# --quantize q8_0: the decode steps run on Q8_0 copies of the weights. On a prompt whose
# greedy tokens win by a clear margin (on "What is the capital of France?" alone the first
# token is a near tie, -1.88 against -1.96, which 8 bits flip) the answer is the float32
# model's, and its log-probs are not the float32 ones (the 8-bit path ran). A bad name is a
# one-line error on every command that takes the option.
question="What is the capital of France? Answer in two sentences."
f32=$("$bin" generate --model "$model" --chat --greedy --max-new-tokens 40 "$question" 2>/dev/null)
q8=$("$bin" generate --model "$model" --chat --greedy --max-new-tokens 40 --quantize q8_0 "$question" 2>/dev/null)
python3 -c "import json, sys; a, b = (json.loads(x) for x in sys.argv[1:]); sys.exit(0 if a['response'] == b['response'] == 'The capital of France is Paris.' and a['ids'] == b['ids'] and a['logprobs'] != b['logprobs'] else 1)" \
    "$q8" "$f32" 2> /dev/null && pass generate_quantize_q8_0 || fail generate_quantize_q8_0 "$q8"
# --quantize bf16: the weights (the file's Q4_1 values as floats) rounded to bfloat16, the
# decode steps through ops/cpu/matmul_bf16.c. The same answer, token for token, and log-probs
# within a few hundredths of the float32 ones but not equal to them (the bf16 path ran).
bf16=$("$bin" generate --model "$model" --chat --greedy --max-new-tokens 40 --quantize bf16 "$question" 2>/dev/null)
python3 - "$bf16" "$f32" <<'PY' && pass generate_quantize_bf16 || fail generate_quantize_bf16 "$bf16"
import json, sys
b, f = (json.loads(x) for x in sys.argv[1:])
moved = max(abs(x - y) for x, y in zip(b["logprobs"], f["logprobs"]))
print(f"  bf16: {len(b['ids'])} tokens, log-probs at most {moved:.4f} from float32's", file=sys.stderr)
sys.exit(0 if b["ids"] == f["ids"] and b["response"] == f["response"] and 0 < moved <= 0.05 else 1)
PY
# The quantized model gives its float32 weights back: peak memory of the same generation
# (measured 406 MB against 770 MB; the GGUF file's pages and the activations stay). Not
# under AddressSanitizer, whose allocator, shadow memory and quarantine decide the peak.
if nm "$bin" 2> /dev/null | grep -q '__asan_init'; then
    echo "SKIP quantize_q8_0_memory: $bin is built with AddressSanitizer, whose own memory decides the peak"
else
python3 - "$bin" "$model" "$question" <<'PY' && pass quantize_q8_0_memory || fail quantize_q8_0_memory "peak memory not below 80% of float32's"
import resource, subprocess, sys
binary, model, question = sys.argv[1:]
def peak(quantize):
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    subprocess.run([binary, "generate", "--model", model, "--chat", "--greedy", "--max-new-tokens", "8", "--quantize", quantize,
                    question], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    return resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
q8 = peak("q8_0")          # first: RUSAGE_CHILDREN keeps the largest child's peak
f32 = peak("none")
print("  peak memory: q8_0 %d MB, float32 %d MB" % (q8 // 1024, f32 // 1024), file=sys.stderr)
sys.exit(0 if q8 < 0.8 * f32 else 1)
PY
fi
expect_error generate_bad_quantize "--quantize" "$bin" generate --model "$model" --quantize q4 "hi"
expect_error chat_bad_quantize "--quantize" "$bin" chat --model "$model" --quantize Q8 < /dev/null
expect_error serve_bad_quantize "--quantize" "$bin" serve --model "$model" --port 0 --quantize int8
expect_error infer_bad_quantize "--quantize" "$bin" infer --model "$model" --reward-model "$model" \
    --data "$tmp/prompts.jsonl" --output "$tmp/infer.jsonl" --quantize q8
# --kv-cache f16: the KV cache in half floats. The same greedy answer; its log-probs move
# by the halves' rounding only (< 1e-2 from float32's), and do move (the half cache ran).
# A bad value is one line on every command that takes the option.
f16=$("$bin" generate --model "$model" --chat --greedy --max-new-tokens 40 --kv-cache f16 "$question" 2>/dev/null)
python3 -c "import json, sys; a, b = (json.loads(x) for x in sys.argv[1:]); sys.exit(0 if a['ids'] == b['ids'] and a['response'] == 'The capital of France is Paris.' and a['logprobs'] != b['logprobs'] and max(abs(x - y) for x, y in zip(a['logprobs'], b['logprobs'])) < 1e-2 else 1)" \
    "$f16" "$f32" 2> /dev/null && pass generate_kv_cache_f16 || fail generate_kv_cache_f16 "$f16"
# --kv-cache q8_0: the KV cache in 8-bit blocks. The same greedy answer; its log-probs move
# by the 8-bit keys' and values' rounding (0.002 here, 0.03 on a shorter question), < 0.05.
q8=$("$bin" generate --model "$model" --chat --greedy --max-new-tokens 40 --kv-cache q8_0 "$question" 2>/dev/null)
python3 -c "import json, sys; a, b = (json.loads(x) for x in sys.argv[1:]); sys.exit(0 if a['ids'] == b['ids'] and a['response'] == 'The capital of France is Paris.' and a['logprobs'] != b['logprobs'] and max(abs(x - y) for x, y in zip(a['logprobs'], b['logprobs'])) < 5e-2 else 1)" \
    "$q8" "$f32" 2> /dev/null && pass generate_kv_cache_q8_0 || fail generate_kv_cache_q8_0 "$q8"
expect_error generate_bad_kv_cache "--kv-cache" "$bin" generate --model "$model" --kv-cache f8 "hi"
expect_error generate_kv_cache_q4 "--kv-cache" "$bin" generate --model "$model" --kv-cache q4 "hi"
expect_error chat_bad_kv_cache "--kv-cache" "$bin" chat --model "$model" --kv-cache F16 < /dev/null
expect_error serve_bad_kv_cache "--kv-cache" "$bin" serve --model "$model" --port 0 --kv-cache half
expect_error infer_bad_kv_cache "--kv-cache" "$bin" infer --model "$model" --reward-model "$model" \
    --data "$tmp/prompts.jsonl" --output "$tmp/infer.jsonl" --kv-cache bf16
# The CPU attention kernel's environment switch (ops/cpu/attention_decode.c): a bad value is
# one line naming the variable, exit 2, at the first attention.
MARLHF_CPU_ATTENTION=bogus expect_error bad_cpu_attention_choice "MARLHF_CPU_ATTENTION=bogus" \
    "$bin" generate --model tests/fixtures/models/tiny_chat --max-new-tokens 2 "Hi"
# The model's context (a GPT-2 of 64 learned positions): a row stops there ("length") with
# prompt + answer = 64 tokens, on its own or beside a row that goes on (which it no longer
# stops with an internal error), the same bits in a batch of two as alone; a prompt that
# leaves no room for an answer is one line naming it, exit 2.
python3 tests/cli/tiny_gpt2_model.py tests/fixtures/models/gpt2 tests/fixtures/models/tiny_chat "$tmp/gpt2_64" 2> /dev/null
python3 -c "import json; print(json.dumps({'prompt': 'Hello'})); print(json.dumps({'prompt': ' '.join(['cat dog'] * 9)}))" \
    > "$tmp/context_prompts.jsonl"
for batch in 1 2; do
    "$bin" generate --model "$tmp/gpt2_64" --input "$tmp/context_prompts.jsonl" --max-new-tokens 100 --temperature 0.8 \
        --seed 3 --batch-size $batch --batch-invariant > "$tmp/context_$batch.jsonl" 2> "$tmp/context_$batch.err"
done
python3 - "$tmp/context_1.jsonl" <<'PY' && cmp -s "$tmp/context_1.jsonl" "$tmp/context_2.jsonl" &&
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
sys.exit(0 if len(rows) == 2 and all(r["prompt_tokens"] + r["response_tokens"] == 64 and r["stop_reason"] == "length"
                                     for r in rows) and rows[0]["prompt_tokens"] != rows[1]["prompt_tokens"] else 1)
PY
    pass generate_stops_at_the_context ||
    fail generate_stops_at_the_context "$(tail -n 1 "$tmp/context_2.err") $(cut -c1-200 "$tmp/context_1.jsonl")"
expect_error generate_prompt_past_the_context "prompt of 82 tokens does not fit the model's context of 64 tokens" \
    "$bin" generate --model "$tmp/gpt2_64" --max-new-tokens 5 "$(python3 -c "print('x ' * 80)")"
# chat: a reply has the room the context leaves; a turn that would pass it is declined in one
# line (the conversation stays), /reset starts over; the session goes on and ends normally.
printf 'Tell me about the cat and the dog and the bird\nAnd more about the dog please now\n/reset\nHi\n' |
    "$bin" chat --model "$tmp/gpt2_64" --max-new-tokens 40 > "$tmp/chat_context.out" 2> "$tmp/chat_context.err"
rc=$?
[ $rc = 0 ] && [ "$(grep -c "fills the model's context of 64 tokens; /reset starts over" "$tmp/chat_context.err")" = 1 ] &&
    ! grep -q 'internal error' "$tmp/chat_context.err" && pass chat_stops_at_the_context ||
    fail chat_stops_at_the_context "exit $rc: $(tail -n 2 "$tmp/chat_context.err")"
[ "$failures" -eq 0 ]
