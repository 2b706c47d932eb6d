#!/usr/bin/env bash
# The judge end to end against `marlhf serve` on loopback with the real SmolLM2-135M-
# Instruct: real HTTP, a real model writing the verdicts. A 135M model is a poor judge, so
# the test checks the plumbing (every row judged or marked invalid, the summary written,
# order swaps applied), not the verdicts. Prints PASS/FAIL per case.
set -u
cd "$(dirname "$0")/../.."
bin=${MARLHF_BIN:-build/marlhf}
tmp=${MARLHF_TEST_TMP:-/tmp}/cli_judge_serve
rm -rf "$tmp" && mkdir -p "$tmp"
model=models/SmolLM2-135M-Instruct.Q4_1.gguf
failures=0
. tests/cli_helpers.sh

if [ ! -f "$model" ]; then
    fail judge_against_serve "$model is missing (scripts/fetch-model)"
    exit 1
fi
# The judge and the server run under the sanitizers in judge.sh and serve.sh, on the tiny
# fixture models; this real-model run is the plain build's (real_model_runs).
real_model_runs "$model" "judge against serve on SmolLM2" || exit 0
"$bin" serve --model "$model" --port 0 --threads 2 --max-tokens-limit 64 > "$tmp/serve.log" 2>&1 &
server=$!
if ! wait_port "$server" "$tmp/serve.log" 's|^serve: listening on http://.*:\([0-9][0-9]*\) (model .*)$|\1|p' 600; then
    fail judge_against_serve "server did not start: $(tail -n 2 "$tmp/serve.log")"
    kill "$server" 2> /dev/null
    exit 1
fi
name=$(sed -n 's|^serve: listening on .* (model \(.*\))$|\1|p' "$tmp/serve.log")

python3 - "$tmp" <<'PY'
import json, sys
rows = [("Summarize: The cat sat on the mat all day and slept.", "A cat slept on a mat.", "Dogs bark loudly."),
        ("Summarize: Rain fell in the city, flooding two streets.", "City streets flooded after rain.", "It was sunny."),
        ("Summarize: The meeting moved from Monday to Friday.", "The meeting is now on Friday.", "The meeting is on Monday.")]
for name, pick in (("a", 1), ("b", 2)):
    with open(f"{sys.argv[1]}/{name}.jsonl", "w") as f:
        for row in rows:
            f.write(json.dumps({"prompt": row[0], "response": row[pick], "reward": 0.0}) + "\n")
PY
timeout 300 "$bin" judge "$tmp/a.jsonl" "$tmp/b.jsonl" --task summarization --output "$tmp/verdicts.jsonl" \
    --api-base "http://127.0.0.1:$port/v1" --judge-model "$name" --max-tokens 24 --timeout-s 120 --quiet \
    > "$tmp/summary.txt" 2> "$tmp/judge.err"
rc=$?
python3 - "$tmp/verdicts.jsonl" "$tmp/verdicts.summary.json" <<'PY' && [ $rc -eq 0 ] &&
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
summary = json.load(open(sys.argv[2]))
ok = len(rows) == 3 and all(r["verdict"] in ("A", "B", "tie", "invalid") for r in rows)
ok = ok and all(isinstance(r.get("swapped"), bool) and r.get("raw_reply", r.get("reply", "x")) != "" for r in rows)
sys.exit(0 if ok else 1)
PY
    pass "judge_against_serve ($(grep -o '"verdict":"[a-zA-Z]*"' "$tmp/verdicts.jsonl" | tr '\n' ' '))" ||
    fail judge_against_serve "exit $rc: $(tail -n 2 "$tmp/judge.err")"
grep -q 'POST /v1/chat/completions' "$tmp/serve.log" && pass judge_requests_reached_server ||
    fail judge_requests_reached_server "no request in the server log"
kill -TERM "$server" 2> /dev/null
wait "$server"
[ $? -eq 0 ] && pass serve_stops_after_judge || fail serve_stops_after_judge "exit status"
exit $((failures > 0))
