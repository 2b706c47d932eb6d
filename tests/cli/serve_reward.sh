#!/usr/bin/env bash
# /get_reward requests that arrive while the reward model is busy are scored together
# (`marlhf serve --reward-model --reward-batch N`): a large request keeps the model busy,
# twelve clients post meanwhile (one text each, several texts, texts with and without
# prompts, and two malformed bodies), and every well-formed request gets the scores it gets
# alone, the malformed ones their 400 naming the field, while /metrics shows the waiting
# requests scored in one round. --reward-batch 1 scores them one at a time (a round each,
# the solo scores bit for bit); stopping with requests waiting. Bad --reward-batch values. (remote_reward.sh checks the
# scores against `marlhf infer --ref-scores` and PPO against the server.) Prints PASS/FAIL
# per case.
set -u
cd "$(dirname "$0")/../.."
bin=${MARLHF_BIN:-build/marlhf}
tmp=${MARLHF_TEST_TMP:-/tmp}/cli_serve_reward
rm -rf "$tmp" && mkdir -p "$tmp"
model=tests/fixtures/models/tiny_chat
data=tests/fixtures/train
failures=0
. tests/cli_helpers.sh
. tests/serve_helpers.sh

"$bin" rm --model "$model" --data "$data/pairs.jsonl" --max-seq-len 64 --per-device-train-batch-size 8 \
    --learning-rate 3e-3 --max-steps 2 --output "$tmp/rm" --quiet --threads 1 2> "$tmp/rm.err" ||
    fail reward_model "$(tail -n 2 "$tmp/rm.err")"

# concurrent.py URL: the scores of each request posted alone (one after the other), then
# the same requests posted at once while a request of 1,008 texts is being scored;
# prints {"solo": [...], "together": [...], "bad": [[status, body], ...], "rounds": [before,
# after]} to stdout.
cat > "$tmp/concurrent.py" << 'PY'
import json, sys, threading, time, urllib.error, urllib.request
url = sys.argv[1]
pairs = [json.loads(l) for l in open("tests/fixtures/train/pairs.jsonl")]

def post(body):
    request = urllib.request.Request(url + "/get_reward", json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request) as answer:
            return answer.status, json.load(answer)
    except urllib.error.HTTPError as e:
        return e.code, json.load(e)

def metric(name):
    for line in urllib.request.urlopen(url + "/metrics").read().decode().splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise SystemExit(f"no {name} in /metrics")

# Twelve requests of 1 to 5 texts, short and long (padding matters), with prompts or not.
requests = []
for r in range(12):
    rows = pairs[r * 3 : r * 3 + 1 + r % 5]
    body = {"query": [p["prompt"] + (p["chosen"] * (1 + 3 * (r % 3))) for p in rows]}
    if r % 2 == 0:
        body["prompts"] = [p["prompt"] for p in rows]
    requests.append(body)
malformed = ['{"query": ["a text", 7]}', '{"query": "not a list"}']
solo = [post(body)[1]["rewards"] for body in requests]

blocker = {"query": [(p["prompt"] + p["chosen"]) * 3 for p in pairs] * 21}
rounds_before = metric("marlhf_reward_rounds_total")
results, bad = [None] * len(requests), [None] * len(malformed)
def client(i):
    results[i] = post(requests[i])
def bad_client(i):
    request = urllib.request.Request(url + "/get_reward", malformed[i].encode(), {"Content-Type": "application/json"})
    try:
        urllib.request.urlopen(request)
        bad[i] = [200, ""]
    except urllib.error.HTTPError as e:
        bad[i] = [e.code, e.read().decode()]
big_status = []
big = threading.Thread(target=lambda: big_status.append(post(blocker)[0]))
big.start()
while big.is_alive() and metric("marlhf_requests_in_progress") < 1:  # the blocker is in
    time.sleep(0.01)
threads = [threading.Thread(target=client, args=(i,)) for i in range(len(requests))]
threads += [threading.Thread(target=bad_client, args=(i,)) for i in range(len(malformed))]
for t in threads: t.start()
for t in threads: t.join()
big.join()
statuses = [status for status, _ in results] + big_status
print(json.dumps({"solo": solo, "together": [body.get("rewards") for _, body in results], "statuses": statuses,
                  "bad": bad, "rounds": [rounds_before, metric("marlhf_reward_rounds_total")],
                  "requests": len(requests)}))
PY

# compare.py FILE MODE: MODE "close" (every score within 1e-5 of its solo score: rows of
# other batch shapes round differently) or "bitwise"; at least one round shared by two or
# more requests ("close") or one round per request ("bitwise"); the malformed bodies 400.
cat > "$tmp/compare.py" << 'PY'
import json, struct, sys
r = json.load(open(sys.argv[1]))
mode = sys.argv[2]
ok = True
if r["statuses"] != [200] * (r["requests"] + 1):
    print("  statuses", r["statuses"]); ok = False
f32 = lambda x: struct.unpack("<f", struct.pack("<f", x))[0]
worst, same, total = 0.0, 0, 0
for solo, together in zip(r["solo"], r["together"]):
    if together is None or len(solo) != len(together):
        print("  scores", solo, together); ok = False; continue
    for a, b in zip(solo, together):
        worst = max(worst, abs(a - b)); same += f32(a) == f32(b); total += 1
rounds = r["rounds"][1] - r["rounds"][0]
print(f"  {total} scores of {r['requests']} concurrent requests: {same} bit for bit equal to their solo scores, "
      f"largest difference {worst:.2e}; {rounds:.0f} scoring rounds for them and the large request", file=sys.stderr)
if mode == "close":
    ok &= worst < 1e-5 and rounds < r["requests"] + 1
else:
    ok &= same == total and rounds == r["requests"] + 1
(s0, b0), (s1, b1) = r["bad"]
ok &= s0 == 400 and '"param":"query"' in b0 and "query[1] must be a text" in b0
ok &= s1 == 400 and '"param":"query"' in b1
if not ok: print("  bad requests", r["bad"], file=sys.stderr)
sys.exit(0 if ok else 1)
PY

start_server "$tmp/serve.log" --reward-model "$tmp/rm/final" --parallel 4 --threads 1 --max-concurrent 64 --max-body-bytes 8000000 ||
    fail reward_server_starts "$(tail -n 3 "$tmp/serve.log")"
python3 "$tmp/concurrent.py" "http://127.0.0.1:$port" > "$tmp/batched.json" &&
    python3 "$tmp/compare.py" "$tmp/batched.json" close && grep -q 'reward requests scored together' "$tmp/serve.log" &&
    pass reward_concurrent_requests_batched || fail reward_concurrent_requests_batched "$(tail -n 3 "$tmp/serve.log")"
stop_server
[ "$stop_rc" = 0 ] || fail reward_server_stops "exit $stop_rc"

start_server "$tmp/serve1.log" --reward-model "$tmp/rm/final" --parallel 4 --threads 1 --max-concurrent 64 --max-body-bytes 8000000 \
    --reward-batch 1 || fail reward_server_batch1_starts "$(tail -n 3 "$tmp/serve1.log")"
python3 "$tmp/concurrent.py" "http://127.0.0.1:$port" > "$tmp/one.json" &&
    python3 "$tmp/compare.py" "$tmp/one.json" bitwise && ! grep -q 'scored together' "$tmp/serve1.log" &&
    pass reward_batch_1_one_at_a_time || fail reward_batch_1_one_at_a_time "$(tail -n 3 "$tmp/serve1.log")"

# SIGTERM while a large request scores and four wait: the waiting ones are answered 503
# (server_shutting_down) without scoring, the running one 200 or 503, and the server exits 0.
cat > "$tmp/stop.py" << 'PY'
import json, sys, threading, time, urllib.error, urllib.request
url = sys.argv[1]
def metric(name):
    for line in urllib.request.urlopen(url + "/metrics").read().decode().splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
answers = {}
def post(name, body):
    request = urllib.request.Request(url + "/get_reward", json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request) as answer:
            answers[name] = (answer.status, json.load(answer))
    except urllib.error.HTTPError as e:
        answers[name] = (e.code, json.load(e))
    except Exception as e:
        answers[name] = (0, str(e))
threads = [threading.Thread(target=post, args=("large", {"query": ["The goat is good. " * 12] * 2000}))]
threads[0].start()
while threads[0].is_alive() and metric("marlhf_requests_in_progress") < 1:
    time.sleep(0.01)
threads += [threading.Thread(target=post, args=(f"waiting{i}", {"query": [f"text {i}"]})) for i in range(4)]
for t in threads[1:]: t.start()
while threads[0].is_alive() and metric("marlhf_requests_in_progress") < 5:
    time.sleep(0.01)
print("ready", flush=True)
for t in threads: t.join()
print(json.dumps({k: [v[0], str(v[1])[:300]] for k, v in sorted(answers.items())}))
PY
python3 "$tmp/stop.py" "http://127.0.0.1:$port" > "$tmp/stop.out" &
client=$!
until grep -q ready "$tmp/stop.out" 2> /dev/null || ! kill -0 "$client" 2> /dev/null; do sleep 0.05; done
stop_server
wait "$client"
python3 - "$tmp/stop.out" "$stop_rc" << 'PY' && pass reward_stop_answers_waiting || fail reward_stop_answers_waiting "$(tail -n 1 "$tmp/stop.out")"
import json, sys
answers = json.loads(open(sys.argv[1]).read().splitlines()[-1])
ok = sys.argv[2] == "0" and answers["large"][0] in (200, 503)
ok &= all(answers[f"waiting{i}"][0] == 503 and "server_shutting_down" in answers[f"waiting{i}"][1] for i in range(4))
sys.exit(0 if ok else 1)
PY

expect_error serve_reward_batch_zero "--reward-batch must be in [1, 4096]" "$bin" serve --reward-model "$tmp/rm/final" \
    --reward-batch 0
expect_error serve_reward_batch_text "--reward-batch" "$bin" serve --reward-model "$tmp/rm/final" --reward-batch many
expect_error serve_reward_batch_generative "option --reward-batch applies to --reward-model only" "$bin" serve \
    --model "$model" --reward-batch 4

exit $((failures > 0))
