#!/usr/bin/env bash
# Reward models over HTTP (OpenRLHF's /get_reward protocol). `marlhf serve --reward-model`
# scores texts exactly as the reward model trained on them: equal to `marlhf infer
# --ref-scores`, whose means equal the RM trainer's own evaluation. `marlhf ppo --reward
# remote` trains against a scripted server (each request's queries, prompts, labels and
# the scores PPO logs checked) and against marlhf's own server. Bad requests, bad options,
# unreachable and misbehaving servers. Prints PASS/FAIL per case.
set -u
cd "$(dirname "$0")/../.."
bin=${MARLHF_BIN:-build/marlhf}
tmp=${MARLHF_TEST_TMP:-/tmp}/cli_remote_reward
rm -rf "$tmp" && mkdir -p "$tmp"
model=tests/fixtures/models/tiny_chat
data=tests/fixtures/train
failures=0
. tests/cli_helpers.sh
servers=()
trap 'for pid in "${servers[@]}"; do kill "$pid" 2> /dev/null; done' EXIT

"$bin" rm --model "$model" --data "$data/pairs.jsonl" --eval-data "$data/pairs.jsonl" --max-seq-len 64 \
    --per-device-train-batch-size 8 --learning-rate 3e-3 --max-steps 6 --output "$tmp/rm" --quiet --threads 2 \
    2> "$tmp/rm.err" || fail reward_model "$(tail -n 2 "$tmp/rm.err")"

# infer --ref-scores reads each score where the trainer does (the EOS after the response):
# its means are the trainer's final eval/chosen_score and eval/rejected_score.
"$bin" infer --reward-model "$tmp/rm/final" --data "$data/pairs.jsonl" --ref-scores --count 0 --no-shuffle \
    --output "$tmp/ref.jsonl" --quiet --threads 2 2> "$tmp/ref.err"
python3 - "$tmp/ref.jsonl" "$tmp/rm/metrics.jsonl" <<'PY' && pass ref_scores_match_rm_eval || fail ref_scores_match_rm_eval "$(tail -n 2 "$tmp/ref.err")"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
last = [json.loads(l) for l in open(sys.argv[2]) if '"eval/chosen_score"' in l][-1]
chosen = sum(r["reward"] for r in rows) / len(rows)
rejected = sum(r["rejected_reward"] for r in rows) / len(rows)
print(f"  infer {chosen:.6f} / {rejected:.6f}, rm eval {last['eval/chosen_score']:.6f} / {last['eval/rejected_score']:.6f}",
      file=sys.stderr)
sys.exit(0 if abs(chosen - last["eval/chosen_score"]) < 1e-5 and abs(rejected - last["eval/rejected_score"]) < 1e-5 else 1)
PY

# --- marlhf serve --reward-model ---------------------------------------------------------
"$bin" serve --reward-model "$tmp/rm/final" --port 0 --parallel 4 --threads 2 > "$tmp/serve.log" 2>&1 &
servers+=($!)
if wait_port "${servers[0]}" "$tmp/serve.log" 's|^serve: listening on http://.*:\([0-9][0-9]*\) (reward model .*)$|\1|p' 600; then
    pass reward_server_starts
else
    fail reward_server_starts "$(tail -n 3 "$tmp/serve.log")"
fi
url=http://127.0.0.1:$port/get_reward

# Every pair in one request (96 texts, 4 per forward), then one text per request, then
# with the end-of-text and padding a client decoding with special tokens leaves on.
python3 - "$url" "$data/pairs.jsonl" "$tmp/ref.jsonl" <<'PY' && pass get_reward_equals_ref_scores || fail get_reward_equals_ref_scores "see above"
import json, sys, urllib.request
url = sys.argv[1]
pairs = [json.loads(l) for l in open(sys.argv[2])]
ref = [json.loads(l) for l in open(sys.argv[3])]
def post(body):
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    answer = json.load(urllib.request.urlopen(request))
    assert answer["rewards"] == answer["scores"]
    return answer["rewards"]
queries = [p["prompt"] + p[k] for p in pairs for k in ("chosen", "rejected")]
prompts = [p["prompt"] for p in pairs for _ in range(2)]
expected = [r[k] for r in ref for k in ("reward", "rejected_reward")]
together = post({"query": queries, "prompts": prompts, "labels": [None] * len(queries)})
alone = [post({"query": [q], "prompts": [p]})[0] for q, p in zip(queries[:8], prompts[:8])]
decorated = post({"query": [q + "<|end_of_text|><|end_of_text|>" for q in queries[:8]], "prompts": prompts[:8]})
worst = max(abs(a - b) for a, b in zip(together, expected))
ok = len(together) == len(expected) and worst < 1e-5
ok &= all(abs(a - b) < 1e-5 for a, b in zip(alone, together[:8]))
ok &= all(abs(a - b) < 1e-5 for a, b in zip(decorated, together[:8]))
print(f"  {len(together)} texts, largest difference from infer --ref-scores {worst:.2e}", file=sys.stderr)
# Without prompts each text is tokenized whole: still a finite score per text.
whole = post({"query": queries[:4]})
ok &= len(whole) == 4 and all(abs(x) < 1e6 for x in whole)
sys.exit(0 if ok else 1)
PY

# Bad requests: one OpenAI-style error each.
bad_request() { # bad_request NAME STATUS CODE_OR_PARAM METHOD PATH BODY
    local name=$1 status=$2 expected=$3 method=$4 path=$5 body=$6 got
    got=$(curl -s -o "$tmp/answer.json" -w '%{http_code}' -X "$method" -H 'Content-Type: application/json' \
        --data-binary "$body" "http://127.0.0.1:$port$path")
    if [ "$got" = "$status" ] && grep -qF -- "$expected" "$tmp/answer.json"; then
        pass "$name"
    else
        fail "$name" "HTTP $got $(head -c 300 "$tmp/answer.json")"
    fi
}
bad_request reward_bad_json 400 invalid_json POST /get_reward '{"query": ['
bad_request reward_query_not_list 400 '"param":"query"' POST /get_reward '{"query": "one text"}'
bad_request reward_query_empty 400 '"param":"query"' POST /get_reward '{"query": []}'
bad_request reward_query_not_text 400 'query[1]' POST /get_reward '{"query": ["a", 2]}'
bad_request reward_prompts_length 400 '"param":"prompts"' POST /get_reward '{"query": ["a", "b"], "prompts": ["a"]}'
bad_request reward_get 405 method_not_allowed GET /get_reward ''
bad_request reward_server_no_chat 400 not_a_generative_model POST /v1/chat/completions \
    '{"messages": [{"role": "user", "content": "hi"}]}'
bad_request reward_server_no_embeddings 400 not_a_generative_model POST /v1/embeddings '{"input": "hi"}'
curl -s "http://127.0.0.1:$port/metrics" > "$tmp/metrics.txt"
# 96 + 8 + 8 + 4 texts were scored above (bad requests score nothing).
grep -qx 'marlhf_reward_sequences_total 116' "$tmp/metrics.txt" && grep -q '^marlhf_reward_tokens_total [1-9]' "$tmp/metrics.txt" &&
    pass reward_metrics || fail reward_metrics "$(grep reward_ "$tmp/metrics.txt" | grep -v '^#')"

expect_error serve_model_and_reward_model "--reward-model" "$bin" serve --model "$model" --reward-model "$tmp/rm/final"
expect_error serve_no_model "--model" "$bin" serve
expect_error serve_reward_model_kv_cache "--kv-cache" "$bin" serve --reward-model "$tmp/rm/final" --kv-cache f16
expect_error serve_reward_model_pooling "--pooling" "$bin" serve --reward-model "$tmp/rm/final" --pooling last
expect_error serve_reward_model_not_rm "value head" "$bin" serve --reward-model "$model" --port 0

# --- marlhf ppo --reward remote ----------------------------------------------------------
# A scripted server: the reward is the count of the row's label letter in the response
# (/5); every request is logged. /short answers one reward too few, /refuse answers 400.
cat > "$tmp/reward_server.py" <<'PY'
import http.server, json, sys
log_path, port_path = sys.argv[1], sys.argv[2]
class Handler(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with open(log_path, "a") as log:
            log.write(json.dumps({"path": self.path, **request}) + "\n")
        if self.path == "/refuse":
            status, answer = 400, {"error": {"message": "no rewards today"}}
        else:
            rewards = []
            for prompt, query, label in zip(request["prompts"], request["query"], request["labels"]):
                response = query[len(prompt):]
                rewards.append(response.count(label or "e") / 5)
            status, answer = 200, {"rewards": rewards[:-1] if self.path == "/short" else rewards}
        body = json.dumps(answer).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
open(port_path, "w").write(str(server.server_address[1]))
server.serve_forever()
PY
python3 - "$data/sft.jsonl" "$tmp/label_prompts.jsonl" <<'PY'
import json, sys
with open(sys.argv[1]) as rows, open(sys.argv[2], "w") as out:
    for line in rows:
        out.write(json.dumps({"prompt": json.loads(line)["prompt"], "label": "o"}) + "\n")
PY
python3 "$tmp/reward_server.py" "$tmp/requests.jsonl" "$tmp/scripted.port" 2> "$tmp/scripted.err" &
servers+=($!)
for _ in $(seq 100); do [ -s "$tmp/scripted.port" ] && break; sleep 0.1; done
scripted=http://127.0.0.1:$(cat "$tmp/scripted.port" 2> /dev/null)
common=(--actor-model "$model" --prompts "$tmp/label_prompts.jsonl" --eval-prompts "$data/sft_eval.jsonl" --eval-count 4
        --rollout-batch-size 8 --generation-batch-size 8 --micro-batch-size 4 --max-new-tokens 10
        --actor-learning-rate 1e-3 --critic-learning-rate 1e-3 --min-response-tokens 1 --quiet --threads 2)
grpo=(--reward remote --advantage-estimator grpo --samples-per-prompt 4 --termination-condition token)

"$bin" ppo "${common[@]}" "${grpo[@]}" --reward-url "$scripted/get_reward" --max-iterations 3 --output "$tmp/scripted" \
    2> "$tmp/scripted_run.err"
python3 - "$tmp/requests.jsonl" "$tmp/scripted/metrics.jsonl" "$tmp/label_prompts.jsonl" <<'PY' &&
import json, sys
requests = [json.loads(l) for l in open(sys.argv[1])]
scores = [json.loads(l)["train/score"] for l in open(sys.argv[2]) if '"train/score"' in l]
prompts = {json.loads(l)["prompt"] for l in open(sys.argv[3])}
train = [r for r in requests if r["labels"][0] is not None]
evals = [r for r in requests if r["labels"][0] is None]  # the eval rows have no label
ok = len(scores) == 3 and len(train) == 3 and all(len(r["query"]) == 32 for r in train)
for r, score in zip(train, scores):
    ok &= all(p in prompts and q.startswith(p) and label == "o" for q, p, label in zip(r["query"], r["prompts"], r["labels"]))
    served = sum(q[len(p):].count("o") / 5 for q, p in zip(r["query"], r["prompts"])) / len(r["query"])
    ok &= abs(served - score) < 1e-6  # the score PPO logs is the mean of what the server gave
ok &= len(evals) >= 1 and all(len(r["query"]) == 4 and set(r["labels"]) == {None} for r in evals)
print(f"  {len(train)} training requests of 32 responses, {len(evals)} eval requests; scores {scores}", file=sys.stderr)
sys.exit(0 if ok else 1)
PY
    pass ppo_remote_reward_requests || fail ppo_remote_reward_requests "$(tail -n 3 "$tmp/scripted_run.err")"

# Against marlhf's own reward server, with a critic (GAE): the final evaluation's rewards
# are the server's scores of the very texts in samples/final.jsonl.
"$bin" ppo "${common[@]}" --reward remote --reward-url "$url" --max-iterations 2 --output "$tmp/served" \
    2> "$tmp/served_run.err"
python3 - "$url" "$tmp/served/samples/final.jsonl" <<'PY' && pass ppo_remote_reward_model || fail ppo_remote_reward_model "$(tail -n 3 "$tmp/served_run.err")"
import json, sys, urllib.request
rows = [json.loads(l) for l in open(sys.argv[2])]
body = {"query": [r["prompt"] + r["response"] for r in rows], "prompts": [r["prompt"] for r in rows]}
request = urllib.request.Request(sys.argv[1], json.dumps(body).encode(), {"Content-Type": "application/json"})
rewards = json.load(urllib.request.urlopen(request))["rewards"]
sys.exit(0 if len(rows) == 4 and all(abs(a - r["reward"]) < 1e-5 for a, r in zip(rewards, rows)) else 1)
PY

expect_error ppo_remote_unreachable "no answer from http://127.0.0.1:9/get_reward" "$bin" ppo "${common[@]}" "${grpo[@]}" \
    --reward-url http://127.0.0.1:9/get_reward --reward-retries 0 --max-iterations 1 --output "$tmp/x"
expect_error ppo_remote_short_answer "3 rewards for 4 queries" "$bin" ppo "${common[@]}" "${grpo[@]}" \
    --reward-url "$scripted/short" --reward-retries 0 --max-iterations 1 --output "$tmp/x"
expect_error ppo_remote_refused "HTTP 400 from $scripted/refuse: no rewards today" "$bin" ppo "${common[@]}" "${grpo[@]}" \
    --reward-url "$scripted/refuse" --max-iterations 1 --output "$tmp/x"
expect_error ppo_remote_bad_scheme "--reward-url must start with http://" "$bin" ppo "${common[@]}" "${grpo[@]}" \
    --reward-url ftp://127.0.0.1/get_reward --output "$tmp/x"
expect_error ppo_remote_no_url "--reward-url" "$bin" ppo "${common[@]}" "${grpo[@]}" --output "$tmp/x"
expect_error ppo_remote_url_unused "--reward remote" "$bin" ppo "${common[@]}" --reward-model "$tmp/rm/final" \
    --reward-url "$url" --output "$tmp/x"
expect_error ppo_remote_bad_retries "--reward-retries" "$bin" ppo "${common[@]}" "${grpo[@]}" --reward-url "$url" \
    --reward-retries -1 --output "$tmp/x"
exit $((failures > 0))
