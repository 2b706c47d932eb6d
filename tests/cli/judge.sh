#!/usr/bin/env bash
# marlhf judge against tests/fake_openai_server.py (scripted verdicts): verdicts mapped back
# to the models under the seeded swap, position statistics, the bearer header, a reply
# without verdict asked again once then "invalid", retries on 500/429/malformed bodies, no
# retry on 401, timeout -> exit 2 with the partial file kept, resume after the endpoint
# went away mid-run, and bad input. Prints PASS/FAIL per case. Every server and every run
# is bounded by `timeout`.
set -u
cd "$(dirname "$0")/../.."
bin=${MARLHF_BIN:-build/marlhf}
tmp=${MARLHF_TEST_TMP:-/tmp}/cli_judge
rm -rf "$tmp" && mkdir -p "$tmp"
failures=0
. tests/cli_helpers.sh
unset OPENAI_API_KEY

server_pids=()
trap 'for p in "${server_pids[@]}"; do kill "$p" 2> /dev/null; done' EXIT
# start_server NAME [server options]: a fake endpoint on a free port; sets $base and $server_pid.
start_server() {
    local name=$1
    shift
    rm -f "$tmp/$name.port" "$tmp/$name.log"
    timeout 120 python3 tests/fake_openai_server.py --port-file "$tmp/$name.port" --log "$tmp/$name.log" \
        --lifetime-s 110 "$@" &
    server_pid=$!
    server_pids+=("$server_pid")
    for _ in $(seq 200); do
        [ -s "$tmp/$name.port" ] && break
        sleep 0.05
    done
    base="http://127.0.0.1:$(cat "$tmp/$name.port" 2> /dev/null)/v1"
}
stop_server() { kill "$server_pid" 2> /dev/null && wait "$server_pid" 2> /dev/null; }
requests() { [ -f "$tmp/$1.log" ] && wc -l < "$tmp/$1.log" || echo 0; }
judge() { timeout 60 "$bin" judge "$tmp/a.jsonl" "$tmp/b.jsonl" --task summarization --quiet --backoff-s 0.05 "$@"; }

# 24 rows; the markers script the fake judge: [[win]] marks the better text, [[lose]] the
# worse, [[tie]] both; [[garbage]] never yields a verdict, [[garbage-once]] only after the reminder.
python3 - "$tmp" <<'PY'
import json, sys
kinds = ["A", "B", "A", "tie", "B", "A", "lose_a", "A", "B", "garbage", "A", "B",
         "garbage_once", "A", "tie", "B", "A", "A", "B", "lose_b", "A", "B", "tie", "A"]
marks = {"A": ("[[win]]", ""), "B": ("", "[[win]]"), "tie": ("[[tie]]", "[[tie]]"), "lose_a": ("[[lose]]", ""),
         "lose_b": ("", "[[lose]]"), "garbage": ("[[garbage]]", ""), "garbage_once": ("[[garbage-once]]", "")}
with open(f"{sys.argv[1]}/a.jsonl", "w") as fa, open(f"{sys.argv[1]}/b.jsonl", "w") as fb:
    for i, k in enumerate(kinds):
        prompt = f"SUBREDDIT: r/test\nPOST: story number {i}\nTL;DR:"
        ma, mb = marks[k]
        fa.write(json.dumps({"prompt": prompt, "response": f"model a says {i} {ma}", "reward": 0.5}) + "\n")
        fb.write(json.dumps({"prompt": prompt, "response": f"model b says {i} {mb}", "reward": -0.5}) + "\n")
json.dump(kinds, open(f"{sys.argv[1]}/kinds.json", "w"))
PY

# The checks on a finished run: verdicts in model terms, positions, counts and interval.
check_run() { # check_run VERDICTS.jsonl [LOG]
    python3 - "$tmp" "$@" <<'PY'
import json, math, sys
tmp, out = sys.argv[1], sys.argv[2]
kinds = json.load(open(f"{tmp}/kinds.json"))
rows = [json.loads(l) for l in open(out)]
summary = json.load(open(out[:-len(".jsonl")] + ".summary.json"))
assert len(rows) == len(kinds), len(rows)
expect_counts = {"A": 0, "B": 0, "tie": 0, "invalid": 0}
first = second = 0
for i, (r, k) in enumerate(zip(rows, kinds)):
    assert r["index"] == i and r["prompt"].endswith(f"number {i}\nTL;DR:"), r
    if k == "garbage_once":  # the fake judge then says "Preferred: B": the second position
        want = "A" if r["swapped"] else "B"
    else:
        want = {"A": "A", "B": "B", "tie": "tie", "lose_a": "B", "lose_b": "A", "garbage": "invalid"}[k]
    assert r["verdict"] == want, (i, k, r["verdict"], want, r["reply"])
    if want in ("A", "B"):
        pos = "first" if (want == "A") != r["swapped"] else "second"
        first += pos == "first"
        second += pos == "second"
    else:
        pos = {"tie": "tie", "invalid": None}[want]
    assert r["position_won"] == pos, (i, r["position_won"], pos)
    assert ("first_reply" in r) == (k in ("garbage", "garbage_once")), (i, r)
    expect_counts[want] += 1
s = summary
assert (s["wins_a"], s["wins_b"], s["ties"], s["invalid"]) == tuple(expect_counts[k] for k in ("A", "B", "tie", "invalid")), s
valid = len(kinds) - expect_counts["invalid"]
assert s["valid"] == valid and s["first_position_wins"] == first and s["second_position_wins"] == second, s
assert abs(s["first_position_win_fraction"] - first / valid) < 1e-5, s
p = (expect_counts["A"] + 0.5 * expect_counts["tie"]) / valid
z = 1.959963984540054
d = 1 + z * z / valid
c, h = (p + z * z / (2 * valid)) / d, z * math.sqrt(p * (1 - p) / valid + z * z / (4 * valid * valid)) / d
assert abs(s["win_rate_a"] - p) < 1e-5 and abs(s["win_rate_a_ci95"][0] - (c - h)) < 1e-5 and abs(s["win_rate_a_ci95"][1] - (c + h)) < 1e-5, s
swaps = [r["swapped"] for r in rows]
assert any(swaps) and not all(swaps), swaps
PY
}

# --- a full run, with an API key ------------------------------------------------------
start_server main
OPENAI_API_KEY=sk-fake-123 judge --output "$tmp/v.jsonl" --api-base "$base" > "$tmp/v.stdout" 2> "$tmp/v.stderr"
rc=$?
[ $rc -eq 0 ] && check_run "$tmp/v.jsonl" && pass judge_verdicts_unswapped_and_counted ||
    fail judge_verdicts_unswapped_and_counted "exit $rc: $(head -c 300 "$tmp/v.stderr")"
[ ! -e "$tmp/v.jsonl.partial" ] && grep -q "win rate of A" "$tmp/v.stdout" && grep -q "Wilson" "$tmp/v.stdout" &&
    grep -q "first-shown position won" "$tmp/v.stdout" && pass judge_summary_on_stdout ||
    fail judge_summary_on_stdout "$(cat "$tmp/v.stdout")"
python3 - "$tmp" <<'PY' && pass judge_requests_show_both_in_swapped_order || fail judge_requests_show_both_in_swapped_order "bad requests"
import json, sys
tmp = sys.argv[1]
log = [json.loads(l) for l in open(f"{tmp}/main.log")]
rows = [json.loads(l) for l in open(f"{tmp}/v.jsonl")]
a = [json.loads(l) for l in open(f"{tmp}/a.jsonl")]
b = [json.loads(l) for l in open(f"{tmp}/b.jsonl")]
firsts = [json.loads(e["body"]) for e in log]
firsts = [r for r in firsts if len(r["messages"]) == 1]  # reminders repeat the row
assert len(firsts) == len(rows) and len(log) == len(rows) + 2, (len(firsts), len(log))
for r, req in zip(rows, firsts):
    text = req["messages"][0]["content"]
    i = r["index"]
    one, two = (b[i], a[i]) if r["swapped"] else (a[i], b[i])
    assert a[i]["prompt"] in text and text.index(one["response"]) < text.index(two["response"]), i
    assert "concise" in text and "Preferred: tie" in text and req["model"] == "gpt-4o" and req["temperature"] == 0
for e in log:
    assert e["path"] == "/v1/chat/completions" and e["authorization"] == "Bearer sk-fake-123", e
reminded = [json.loads(e["body"]) for e in log if len(json.loads(e["body"])["messages"]) == 3]
assert len(reminded) == 2 and all(m["messages"][2]["role"] == "user" and "Preferred" in m["messages"][2]["content"] for m in reminded)
PY

# Same seed: the same swaps and verdicts; no key: no Authorization header; another seed: other swaps.
before=$(requests main)
judge --output "$tmp/v2.jsonl" --api-base "$base/" > /dev/null 2>&1
python3 - "$tmp/v.jsonl" "$tmp/v2.jsonl" <<'PY' && pass judge_reproducible_with_seed || fail judge_reproducible_with_seed "differs"
import json, sys
a, b = ([(r["swapped"], r["verdict"], r["position_won"]) for r in map(json.loads, open(p))] for p in sys.argv[1:3])
sys.exit(0 if a == b else 1)
PY
python3 - "$tmp/main.log" "$before" <<'PY' && pass judge_no_key_no_header || fail judge_no_key_no_header "header sent"
import json, sys
log = [json.loads(l) for l in open(sys.argv[1])][int(sys.argv[2]):]
sys.exit(0 if log and all(e["authorization"] is None for e in log) else 1)
PY
judge --output "$tmp/v3.jsonl" --api-base "$base" --seed 7 > /dev/null 2>&1
check_run "$tmp/v3.jsonl" && ! cmp -s <(grep -o '"swapped":[a-z]*' "$tmp/v.jsonl") <(grep -o '"swapped":[a-z]*' "$tmp/v3.jsonl") &&
    pass judge_seed_changes_swaps || fail judge_seed_changes_swaps "same swaps or wrong verdicts"
expect_error judge_existing_output "--overwrite" judge --output "$tmp/v.jsonl" --api-base "$base"
judge --output "$tmp/v.jsonl" --api-base "$base" --overwrite --limit 5 > /dev/null 2>&1
[ "$(wc -l < "$tmp/v.jsonl")" = 5 ] && grep -q '"rows": 5' "$tmp/v.summary.json" && pass judge_overwrite_and_limit ||
    fail judge_overwrite_and_limit "$(wc -l < "$tmp/v.jsonl") rows"
stop_server

# --- retries ----------------------------------------------------------------------------
for status in 500 429; do
    start_server "fail$status" --fail-first 2 --fail-status "$status"
    judge --output "$tmp/r$status.jsonl" --api-base "$base" --limit 3 > /dev/null 2> "$tmp/r$status.stderr"
    rc=$?
    [ $rc -eq 0 ] && [ "$(requests "fail$status")" = 5 ] && [ "$(wc -l < "$tmp/r$status.jsonl")" = 3 ] &&
        pass "judge_retry_on_$status" || fail "judge_retry_on_$status" "exit $rc, $(requests "fail$status") requests"
    stop_server
done
start_server malformed --malformed-first 2
judge --output "$tmp/rm.jsonl" --api-base "$base" --limit 3 > /dev/null 2>&1
rc=$?
[ $rc -eq 0 ] && [ "$(requests malformed)" = 5 ] && pass judge_retry_on_malformed_body ||
    fail judge_retry_on_malformed_body "exit $rc, $(requests malformed) requests"
stop_server
start_server malformed_always --malformed-first 100
expect_error judge_malformed_body_after_retries "malformed response" judge --output "$tmp/rm2.jsonl" --api-base "$base" --retries 2
stop_server
start_server unauthorized --fail-first 100 --fail-status 401
expect_error judge_http_401_server_message "Incorrect API key provided" judge --output "$tmp/r401.jsonl" --api-base "$base"
[ "$(requests unauthorized)" = 1 ] && grep -q "401" "$tmp/stderr" && pass judge_no_retry_on_401 ||
    fail judge_no_retry_on_401 "$(requests unauthorized) requests"
stop_server

# --- timeout after 3 rows: exit 2, one line naming the API base and the row, partial kept --
start_server hang --hang-s 20 --hang-after 3
expect_error judge_timeout_exit_2 "row 3" judge --output "$tmp/t.jsonl" --api-base "$base" --timeout-s 1.5 --retries 1
grep -qF "$base" "$tmp/stderr" && [ "$(wc -l < "$tmp/t.jsonl.partial")" = 3 ] && [ ! -e "$tmp/t.jsonl" ] &&
    pass judge_timeout_keeps_partial || fail judge_timeout_keeps_partial "$(cat "$tmp/stderr")"
stop_server

# --- the endpoint goes away mid-run; the run resumes against a new one -----------------
start_server first --max-requests 8
judge --output "$tmp/resume.jsonl" --api-base "$base" --retries 1 > /dev/null 2> "$tmp/resume1.stderr"
rc=$?
saved=$(wc -l < "$tmp/resume.jsonl.partial" 2> /dev/null || echo 0)
[ $rc -eq 2 ] && [ "$(wc -l < "$tmp/resume1.stderr")" = 1 ] && grep -qF "$base" "$tmp/resume1.stderr" &&
    [ "$saved" -ge 6 ] && [ "$saved" -le 8 ] && [ ! -e "$tmp/resume.jsonl" ] && pass judge_endpoint_gone_keeps_partial ||
    fail judge_endpoint_gone_keeps_partial "exit $rc, $saved saved: $(cat "$tmp/resume1.stderr")"
wait "$server_pid" 2> /dev/null
start_server second
expect_error judge_partial_of_other_seed "--seed" judge --output "$tmp/resume.jsonl" --api-base "$base" --seed 7
printf '{"index": %s, "prompt": "torn' "$saved" >> "$tmp/resume.jsonl.partial" # a crash mid-line
judge --output "$tmp/resume.jsonl" --api-base "$base/" > /dev/null 2> "$tmp/resume2.stderr"
rc=$?
python3 - "$tmp" "$saved" <<'PY' && check_run "$tmp/resume.jsonl" && [ $rc -eq 0 ] && [ ! -e "$tmp/resume.jsonl.partial" ] &&
import json, sys
tmp, saved = sys.argv[1], int(sys.argv[2])
log = [json.loads(json.loads(l)["body"]) for l in open(f"{tmp}/second.log")]
first = log[0]["messages"][0]["content"]
assert f"story number {saved}\n" in first, first[:400]          # the new endpoint starts at the first unsaved row
full = [(r["swapped"], r["verdict"]) for r in map(json.loads, open(f"{tmp}/v2.jsonl"))]
resumed = [(r["swapped"], r["verdict"]) for r in map(json.loads, open(f"{tmp}/resume.jsonl"))]
assert full == resumed
PY
    pass judge_resume_after_endpoint_restart || fail judge_resume_after_endpoint_restart "exit $rc: $(cat "$tmp/resume2.stderr")"
stop_server

# --- bad input -------------------------------------------------------------------------------
head -n 3 "$tmp/a.jsonl" > "$tmp/a3.jsonl"
sed -n 1,3p "$tmp/b.jsonl" | sed '3s/story number 2/story number 99/' > "$tmp/b3.jsonl"
expect_error judge_mismatched_prompts "row 2" timeout 60 "$bin" judge "$tmp/a3.jsonl" "$tmp/b3.jsonl" --task qa --output "$tmp/x.jsonl"
expect_error judge_mismatched_row_counts "rows" timeout 60 "$bin" judge "$tmp/a3.jsonl" "$tmp/b.jsonl" --task qa --output "$tmp/x.jsonl"
printf '{"prompt": "p", "response": "r"}\n{"prompt": "p", "response": \n' > "$tmp/bad.jsonl"
expect_error judge_malformed_jsonl "bad.jsonl:2" timeout 60 "$bin" judge "$tmp/bad.jsonl" "$tmp/b.jsonl" --task qa --output "$tmp/x.jsonl"
printf '{"prompt": "p"}\n' > "$tmp/noresp.jsonl"
expect_error judge_row_without_response "noresp.jsonl:1" timeout 60 "$bin" judge "$tmp/noresp.jsonl" "$tmp/noresp.jsonl" --task qa --output "$tmp/x.jsonl"
expect_error judge_bad_task "--task" judge --output "$tmp/x.jsonl" --task poetry
expect_error judge_bad_timeout "--timeout-s" judge --output "$tmp/x.jsonl" --timeout-s 0
expect_error judge_bad_api_base "--api-base" judge --output "$tmp/x.jsonl" --api-base ftp://example
expect_error judge_needs_output "--output" timeout 60 "$bin" judge "$tmp/a.jsonl" "$tmp/b.jsonl" --task qa
expect_error judge_needs_two_files "two results files" timeout 60 "$bin" judge "$tmp/a.jsonl" --task qa --output "$tmp/x.jsonl"
# Nothing listens on a port just freed: exit 2 naming the base, after the retries.
start_server closed
stop_server
expect_error judge_unreachable "$base" judge --output "$tmp/x.jsonl" --api-base "$base" --retries 2
exit $((failures > 0))
