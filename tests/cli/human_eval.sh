#!/usr/bin/env bash
# marlhf human-eval: the terminal mode driven through a pipe (answers mapped back to the
# models from what was shown, invalid input asked again, quit and end of input keep the
# partial file, resume, a partial of another seed refused unless --overwrite, --limit);
# the web mode's JSON API with curl (good and bad requests, the server alive after each,
# SIGINT keeps the partial, resume, the exit after the last verdict); headless Chromium
# clicking through the real page (?autoplay=...); and bad input. Every process and every
# wait is bounded. Prints PASS/FAIL per case.
set -u
cd "$(dirname "$0")/../.."
bin=${MARLHF_BIN:-build/marlhf}
tmp=${MARLHF_TEST_TMP:-/tmp}/cli_human_eval
rm -rf "$tmp" && mkdir -p "$tmp"
case "$tmp" in /*) ;; *) tmp=$PWD/$tmp ;; esac
failures=0
. tests/cli_helpers.sh

server_pid=
port=
cleanup() { [ -n "$server_pid" ] && kill -9 "$server_pid" 2> /dev/null; }
trap cleanup EXIT

# Six rows; row 5's prompt is markup the page must show as text. Row 2 of B lacks a reward.
for i in 0 1 2 3 4 5; do
    prompt="question number $i"
    [ $i -eq 5 ] && prompt='<img src=x onerror=alert(1)> & question number 5'
    reward_b=', "reward": -0.5'
    [ $i -eq 2 ] && reward_b=
    printf '{"prompt": "%s", "response": "model a says %d", "reward": 0.5}\n' "$prompt" $i >> "$tmp/a.jsonl"
    printf '{"prompt": "%s", "response": "model b says %d"%s}\n' "$prompt" $i "$reward_b" >> "$tmp/b.jsonl"
done
a=$tmp/a.jsonl
b=$tmp/b.jsonl

# The checks, one place: `check.py KIND ...` exits non-zero with a reason.
cat > "$tmp/check.py" <<'PY'
import html, json, re, sys

def fail(why):
    print(why)
    sys.exit(1)

def model_of(text):
    m = re.match(r"model ([ab]) says (\d+)$", text)
    if not m: fail(f"not a response of the inputs: {text!r}")
    return m.group(1).upper(), int(m.group(2))

def transcript(path, *choices):
    # The rows a terminal session showed, with the answers given to them, as JSON.
    lines = open(path, encoding="utf-8").read().split("\n")
    shown = []
    for k, line in enumerate(lines):
        m = re.match(r"=== Row (\d+) of (\d+) ===$", line)
        if m:
            shown.append({"index": int(m.group(1)) - 1})
        elif line == "--- Response 1 ---":
            shown[-1]["response_1"] = lines[k + 1]
        elif line == "--- Response 2 ---":
            shown[-1]["response_2"] = lines[k + 1]
    for row, choice in zip(shown, choices):
        row["choice"] = choice
    print(json.dumps([r for r in shown if "choice" in r]))

def api(*paths_and_choices):
    # The rows GET /api/next answered (saved bodies), with the answers given, as JSON.
    shown = []
    for item in paths_and_choices:
        path, choice = item.split("=", 1)
        d = json.load(open(path))
        for key in ("response_a", "response_b", "swapped", "verdict"):
            if key in d: fail(f"/api/next tells {key}: the comparison is not blind")
        shown.append({"index": d["index"], "response_1": d["response_1"], "response_2": d["response_2"], "choice": choice})
    print(json.dumps(shown))

def dom(path):
    # The answers the page's autoplay gave, from the dumped DOM, as JSON.
    text = open(path, encoding="utf-8").read()
    m = re.search(r'<pre id="autoplay-log"[^>]*>(.*?)</pre>', text, re.S)
    if not m: fail("no autoplay log in the page")
    print(json.dumps(json.loads(html.unescape(m.group(1)))))

def verdicts(path, shown_path, rows, complete):
    # Every verdict follows from what was shown and answered; the summary adds them up.
    shown = json.load(open(shown_path))
    out = [json.loads(l) for l in open(path)]
    if len(out) != int(rows): fail(f"{len(out)} verdict rows, wanted {rows}")
    by_index = {s["index"]: s for s in shown}
    counts = {"A": 0, "B": 0, "tie": 0, "skipped": 0}
    for i, r in enumerate(out):
        if r["index"] != i: fail(f"row {i} has index {r['index']}")
        if i not in by_index: continue
        s = by_index[i]
        first, n1 = model_of(s["response_1"])
        second, n2 = model_of(s["response_2"])
        if n1 != i or n2 != i or first == second: fail(f"row {i} showed {s}")
        choice = {"1": "1", "2": "2", "t": "tie", "tie": "tie", "s": "skip", "skip": "skip"}[s["choice"].replace("key", "")]
        want = {"1": first, "2": second, "tie": "tie", "skip": "skipped"}[choice]
        if r["verdict"] != want: fail(f"row {i}: verdict {r['verdict']}, wanted {want} ({s})")
        if r["choice"] != choice: fail(f"row {i}: choice {r['choice']}, wanted {choice}")
        if r["swapped"] != (first == "B"): fail(f"row {i}: swapped {r['swapped']} but Response 1 was {first}'s")
        if r["response_a"] != f"model a says {i}" or r["response_b"] != f"model b says {i}": fail(f"row {i}: {r}")
        if not re.match(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$", r["timestamp"]): fail(f"timestamp {r['timestamp']}")
        if ("reward_b" in r) != (i != 2): fail(f"row {i}: rewards {r}")
        counts[want] += 1
    if complete == "complete":
        if len(shown) != len(out): fail(f"{len(shown)} rows shown, {len(out)} judged")
        summary = json.load(open(path[:-len(".jsonl")] + ".summary.json"))
        got = {k: summary[{"A": "wins_a", "B": "wins_b", "tie": "ties", "skipped": "skipped"}[k]] for k in counts}
        if got != counts: fail(f"summary {got}, wanted {counts}")
        valid = counts["A"] + counts["B"] + counts["tie"]
        rate = (counts["A"] + counts["tie"] / 2) / valid if valid else None
        if summary["valid"] != valid or (rate is not None and abs(summary["win_rate_a"] - rate) > 1e-9):
            fail(f"summary {summary}")
        lo, hi = summary["win_rate_a_ci95"]
        if not (0 <= lo <= rate <= hi <= 1): fail(f"interval {lo} {hi} around {rate}")

def field(path, key):
    print(json.load(open(path))[key])

globals()[sys.argv[1]](*sys.argv[2:])
PY
check() { python3 "$tmp/check.py" "$@"; }

# --- terminal mode ---------------------------------------------------------------------------

out=$tmp/term.jsonl
# Row 1 gets a bad answer first (asked again), then the person quits at row 3.
printf '1\nbogus\n2\nq\n' | timeout 30 "$bin" human-eval "$a" "$b" --output "$out" --terminal > "$tmp/term1.out" 2> "$tmp/term1.err"
rc=$?
[ $rc -eq 0 ] && grep -q 'quit; 2 of 6 rows judged' "$tmp/term1.err" && [ "$(wc -l < "$out.partial")" -eq 2 ] &&
    [ ! -e "$out" ] && pass terminal_quit_keeps_partial ||
    fail terminal_quit_keeps_partial "exit $rc: $(cat "$tmp/term1.err")"
[ "$(grep -c 'Please answer 1, 2, t, s or q' "$tmp/term1.out")" -eq 1 ] && pass terminal_asks_again ||
    fail terminal_asks_again "$(grep -c 'Please answer' "$tmp/term1.out") re-asks"
check transcript "$tmp/term1.out" 1 2 > "$tmp/term1.json" && check verdicts "$out.partial" "$tmp/term1.json" 2 partial &&
    pass terminal_verdicts_unswapped || fail terminal_verdicts_unswapped "see above"

printf 't\ns\n1\n2\n' | timeout 30 "$bin" human-eval "$a" "$b" --output "$out" --terminal > "$tmp/term2.out" 2> "$tmp/term2.err"
rc=$?
head -n 2 "$tmp/term2.out" | grep -q '=== Row 3 of 6 ===' && grep -q 'continuing after 2 saved verdicts' "$tmp/term2.err" &&
    pass terminal_resumes_at_first_unjudged || fail terminal_resumes_at_first_unjudged "$(head -n 3 "$tmp/term2.out")"
check transcript "$tmp/term2.out" t s 1 2 > "$tmp/term2.json"
python3 -c 'import json, sys; print(json.dumps(json.load(open(sys.argv[1])) + json.load(open(sys.argv[2]))))' \
    "$tmp/term1.json" "$tmp/term2.json" > "$tmp/term.json"
[ $rc -eq 0 ] && [ ! -e "$out.partial" ] && check verdicts "$out" "$tmp/term.json" 6 complete &&
    grep -q '^A wins .*, B wins .*, ties 1, skipped 1$' "$tmp/term2.out" && pass terminal_finishes_with_summary ||
    fail terminal_finishes_with_summary "exit $rc: $(cat "$tmp/term2.err")"

# End of input is a quit; a later session with another seed is refused, --overwrite starts over.
out2=$tmp/eof.jsonl
printf '2\n' | timeout 30 "$bin" human-eval "$a" "$b" --output "$out2" --terminal > /dev/null 2> "$tmp/eof.err"
rc=$?
[ $rc -eq 0 ] && grep -q 'end of input; 1 of 6 rows judged' "$tmp/eof.err" && [ "$(wc -l < "$out2.partial")" -eq 1 ] &&
    pass terminal_end_of_input_keeps_partial || fail terminal_end_of_input_keeps_partial "exit $rc: $(cat "$tmp/eof.err")"
expect_error terminal_other_seed_refused "another --seed" \
    timeout 30 "$bin" human-eval "$a" "$b" --output "$out2" --terminal --seed 99
printf 'q\n' | timeout 30 "$bin" human-eval "$a" "$b" --output "$out2" --terminal --seed 99 --overwrite > /dev/null 2>&1
[ $? -eq 0 ] && [ ! -e "$out2.partial" ] && pass terminal_overwrite_discards_other_partial ||
    fail terminal_overwrite_discards_other_partial "partial still there"
printf '1\n1\n' | timeout 30 "$bin" human-eval "$a" "$b" --output "$tmp/limit.jsonl" --terminal --limit 2 > /dev/null 2>&1
[ $? -eq 0 ] && [ "$(wc -l < "$tmp/limit.jsonl")" -eq 2 ] && pass terminal_limit || fail terminal_limit "no 2-row output"

# --- web mode: the JSON API ------------------------------------------------------------------

# start_server LOG ARGS...: waits at most 30 s for the ready line; sets server_pid and port.
# Not under `timeout`: it forwards a signal with a SIGCONT, which can wedge LeakSanitizer's
# exit check in the SANITIZE=1 build; wait_server and the EXIT trap bound the server instead.
start_server() {
    local log=$1
    shift
    "$bin" human-eval "$a" "$b" --port 0 "$@" > "$log.out" 2> "$log" &
    server_pid=$!
    wait_port "$server_pid" "$log" 's|^human-eval: open http://127\.0\.0\.1:\([0-9][0-9]*\)/$|\1|p' 300
}
# wait_server: at most 20 s for the server to exit on its own (or after a signal); sets server_rc.
wait_server() {
    wait_exit "$server_pid" 20
    server_rc=$exit_rc
    server_pid=
}
# request METHOD PATH [BODY]: the answer's body in $tmp/body, its status on stdout (000: none in 10 s).
request() {
    local data=()
    [ $# -gt 2 ] && data=(--data-binary "$3")
    curl -s --max-time 10 -X "$1" -o "$tmp/body" -w '%{http_code}' -H 'Content-Type: application/json' "${data[@]}" \
        "http://127.0.0.1:$port$2"
}
is_error_json() { python3 -c 'import json, sys; d = json.load(open(sys.argv[1])); assert isinstance(d["error"], str) and d["error"]' "$tmp/body" 2> /dev/null; }

out=$tmp/web.jsonl
if start_server "$tmp/web1.err" --output "$out"; then
    pass web_ready_line
    code=$(request GET /)
    [ "$code" = 200 ] && grep -q "id='b1'" "$tmp/body" && grep -q 'Response 2' "$tmp/body" && ! grep -qi 'src=.http' "$tmp/body" &&
        pass web_serves_page || fail web_serves_page "status $code"
    code=$(request GET /api/progress)
    [ "$code" = 200 ] && [ "$(check field "$tmp/body" judged)/$(check field "$tmp/body" total)" = 0/6 ] &&
        pass web_progress || fail web_progress "status $code: $(cat "$tmp/body")"
    code=$(request GET /api/next) && cp "$tmp/body" "$tmp/next0.json"
    [ "$code" = 200 ] && [ "$(check field "$tmp/body" index)" = 0 ] && pass web_next || fail web_next "status $code"

    bad() { # bad NAME STATUS METHOD PATH [BODY]
        local name=$1 want=$2
        shift 2
        local code
        code=$(request "$@")
        [ "$code" = "$want" ] && is_error_json && pass "web_bad_$name" || fail "web_bad_$name" "status $code: $(head -c 200 "$tmp/body")"
    }
    bad not_json 400 POST /api/verdict '{"index": 0, "choice":'
    bad empty_body 400 POST /api/verdict ''
    bad array 400 POST /api/verdict '[0, "1"]'
    bad no_choice 400 POST /api/verdict '{"index": 0}'
    bad choice_3 400 POST /api/verdict '{"index": 0, "choice": "3"}'
    bad choice_number 400 POST /api/verdict '{"index": 0, "choice": 1}'
    bad index_string 400 POST /api/verdict '{"index": "0", "choice": "1"}'
    bad other_row 409 POST /api/verdict '{"index": 3, "choice": "1"}'
    bad negative_row 409 POST /api/verdict '{"index": -1, "choice": "1"}'
    bad get_verdict 405 GET /api/verdict
    bad post_next 405 POST /api/next '{}'
    bad unknown_path 404 GET /api/nothing
    head -c 100000 /dev/zero | tr '\0' 'x' > "$tmp/big.json"
    bad too_big 413 POST /api/verdict "@$tmp/big.json"
    kill -0 "$server_pid" 2> /dev/null && [ "$(request GET /api/progress)" = 200 ] &&
        [ "$(check field "$tmp/body" judged)" = 0 ] && pass web_alive_after_bad_requests ||
        fail web_alive_after_bad_requests "the server went away or counted a bad request"
    expect_error web_port_in_use "cannot listen" \
        timeout 30 "$bin" human-eval "$a" "$b" --output "$tmp/other.jsonl" --port "$port"

    code=$(request POST /api/verdict '{"index": 0, "choice": "1"}')
    [ "$code" = 200 ] && [ "$(check field "$tmp/body" recorded)" = 0 ] && [ "$(check field "$tmp/body" index)" = 1 ] &&
        pass web_verdict || fail web_verdict "status $code: $(cat "$tmp/body")"
    cp "$tmp/body" "$tmp/next1.json"
    bad same_row_twice 409 POST /api/verdict '{"index": 0, "choice": "2"}'
    request POST /api/verdict '{"index": 1, "choice": "tie"}' > /dev/null
    kill -INT "$server_pid"
    wait_server
    [ "$server_rc" = 0 ] && grep -q 'SIGINT; 2 of 6 rows judged' "$tmp/web1.err" && [ "$(wc -l < "$out.partial")" -eq 2 ] &&
        [ ! -e "$out" ] && pass web_sigint_keeps_partial || fail web_sigint_keeps_partial "exit $server_rc: $(tail -n 3 "$tmp/web1.err")"
else
    fail web_ready_line "$(cat "$tmp/web1.err")"
fi

if start_server "$tmp/web2.err" --output "$out"; then
    code=$(request GET /api/next) && cp "$tmp/body" "$tmp/next2.json"
    [ "$code" = 200 ] && [ "$(check field "$tmp/body" index)" = 2 ] && pass web_resumes_at_first_unjudged ||
        fail web_resumes_at_first_unjudged "status $code: $(cat "$tmp/body")"
    shown=("$tmp/next0.json=1" "$tmp/next1.json=tie" "$tmp/next2.json=2")
    request POST /api/verdict '{"index": 2, "choice": "2"}' > /dev/null && cp "$tmp/body" "$tmp/next3.json"
    request POST /api/verdict '{"index": 3, "choice": "skip"}' > /dev/null && cp "$tmp/body" "$tmp/next4.json"
    request POST /api/verdict '{"index": 4, "choice": "1"}' > /dev/null && cp "$tmp/body" "$tmp/next5.json"
    shown+=("$tmp/next3.json=skip" "$tmp/next4.json=1" "$tmp/next5.json=2")
    code=$(request POST /api/verdict '{"index": 5, "choice": "2"}')
    [ "$code" = 200 ] && [ "$(check field "$tmp/body" done)" = True ] && python3 -c '
import json, sys; s = json.load(open(sys.argv[1]))["summary"]; assert s["rows"] == 6 and s["judged"] == 6' "$tmp/body" &&
        pass web_last_verdict_answers_done || fail web_last_verdict_answers_done "status $code: $(cat "$tmp/body")"
    bad after_done 409 POST /api/verdict '{"index": 5, "choice": "2"}'
    wait_server
    check api "${shown[@]}" > "$tmp/web.json"
    [ "$server_rc" = 0 ] && [ ! -e "$out.partial" ] && check verdicts "$out" "$tmp/web.json" 6 complete &&
        grep -q '^win rate of A ' "$tmp/web2.err.out" && pass web_exits_after_last_verdict ||
        fail web_exits_after_last_verdict "exit $server_rc: $(tail -n 3 "$tmp/web2.err")"
    # The same seed shows the same order in both modes.
    python3 -c 'import json, sys; t = [json.loads(l)["swapped"] for l in open(sys.argv[1])]; w = [json.loads(l)["swapped"] for l in open(sys.argv[2])]; sys.exit(t != w)' \
        "$tmp/term.jsonl" "$out" && pass web_and_terminal_same_order || fail web_and_terminal_same_order "orders differ"
else
    fail web_resumes_at_first_unjudged "$(cat "$tmp/web2.err")"
fi

# --- web mode: Chromium clicks through the page ------------------------------------------------

# ?autoplay=1,2,t,s,key1,key2: the page answers each row as it appears, by dispatching a click
# on the button (the first four) or a keydown of the shortcut (the last two), through the
# page's own handlers and the real API; #autoplay-log keeps what it saw and answered.
if ! command -v chromium > /dev/null; then
    fail web_page_in_chromium "chromium is not installed (scripts/setup installs it)"
elif start_server "$tmp/page.err" --output "$tmp/page.jsonl" --seed 5; then
    timeout 90 chromium --headless --no-sandbox --disable-gpu --user-data-dir="$tmp/chromium" --virtual-time-budget=10000 \
        --dump-dom "http://127.0.0.1:$port/?autoplay=1,2,t,s,key1,key2" > "$tmp/dom.html" 2> "$tmp/chromium.err"
    grep -q '<body data-state="done"' "$tmp/dom.html" && grep -q '<span id="progress">6 of 6</span>' "$tmp/dom.html" &&
        grep -q '<td>Win rate of A (ties count half)</td>' "$tmp/dom.html" && pass web_page_done_screen ||
        fail web_page_done_screen "$(grep -o '<body[^>]*>' "$tmp/dom.html"; grep -o 'id="error"[^<]*' "$tmp/dom.html")"
    grep -q '&lt;img src=x onerror=alert(1)&gt; &amp; question number 5' "$tmp/dom.html" && ! grep -q '<img src=x' "$tmp/dom.html" &&
        pass web_page_shows_markup_as_text || fail web_page_shows_markup_as_text "markup from the data reached the page"
    wait_server
    check dom "$tmp/dom.html" > "$tmp/page.json" && [ "$server_rc" = 0 ] &&
        check verdicts "$tmp/page.jsonl" "$tmp/page.json" 6 complete && pass web_page_clicks_recorded ||
        fail web_page_clicks_recorded "exit $server_rc: $(tail -n 3 "$tmp/page.err")"
else
    fail web_page_in_chromium "$(cat "$tmp/page.err")"
fi

# --- bad input -------------------------------------------------------------------------------

expect_error bad_no_inputs "two results files" "$bin" human-eval "$a" --output "$tmp/x.jsonl"
expect_error bad_missing_file "$tmp/none.jsonl" "$bin" human-eval "$a" "$tmp/none.jsonl" --output "$tmp/x.jsonl"
head -n 4 "$b" > "$tmp/short.jsonl"
expect_error bad_row_counts "has 6 rows but" "$bin" human-eval "$a" "$tmp/short.jsonl" --output "$tmp/x.jsonl"
sed '4s/question number 3/another question/' "$b" > "$tmp/other_prompt.jsonl"
expect_error bad_prompt_differs "the prompts of row 3 differ" "$bin" human-eval "$a" "$tmp/other_prompt.jsonl" --output "$tmp/x.jsonl"
sed '2s/"response"/"answer"/' "$b" > "$tmp/no_response.jsonl"
expect_error bad_row_without_response "no_response.jsonl:2" "$bin" human-eval "$a" "$tmp/no_response.jsonl" --output "$tmp/x.jsonl"
expect_error bad_output_exists "exists" "$bin" human-eval "$a" "$b" --output "$tmp/term.jsonl" --terminal
expect_error bad_port "--port" "$bin" human-eval "$a" "$b" --output "$tmp/x.jsonl" --port 70000
expect_error bad_limit "--limit" "$bin" human-eval "$a" "$b" --output "$tmp/x.jsonl" --limit -1
expect_error bad_host "cannot resolve host" timeout 30 "$bin" human-eval "$a" "$b" --output "$tmp/x.jsonl" --host no.such.host.invalid
exit $((failures > 0))
