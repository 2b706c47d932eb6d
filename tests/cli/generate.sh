#!/usr/bin/env bash
# marlhf generate and chat on SmolLM2-135M-Instruct (fetched by `make test`): greedy output
# as transformers gives it, reproducible sampling independent of batch size, streaming chat,
# and bad input. Prints PASS/FAIL per case.
set -u
cd "$(dirname "$0")/../.."
bin=${MARLHF_BIN:-build/marlhf}
tmp=${MARLHF_TEST_TMP:-/tmp}/cli_generate
rm -rf "$tmp" && mkdir -p "$tmp"
model=models/SmolLM2-135M-Instruct.Q4_1.gguf
failures=0
. tests/cli_helpers.sh

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

# Bad input: exit 2, one line naming the problem.
printf '{"prompt": "ok"}\n{"prompt": 5}\n' > "$tmp/bad.jsonl"
expect_error generate_bad_row "$tmp/bad.jsonl:2" "$bin" generate --model "$model" --input "$tmp/bad.jsonl"
printf '{"messages": [{"role": "user"}]}\n' > "$tmp/bad_messages.jsonl"
expect_error generate_bad_messages "$tmp/bad_messages.jsonl:1" "$bin" generate --model "$model" --input "$tmp/bad_messages.jsonl"
expect_error generate_bad_temperature "--temperature" "$bin" generate --model "$model" --temperature -1 "hi"
expect_error generate_bad_top_p "--top-p" "$bin" generate --model "$model" --top-p 1.5 "hi"
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
[ "$failures" -eq 0 ]
