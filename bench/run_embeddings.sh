#!/usr/bin/env bash
# /v1/embeddings of `marlhf serve` on SmolLM2-135M-Instruct (the Q4_1 GGUF of
# scripts/fetch-model): TEXTS texts of the Austen task (data/austen/rm_eval.jsonl, the
# prompt and chosen response of each row, ~80 tokens) embedded in one request (the server
# runs --parallel rows per forward), then in requests of one text each, one client, mean
# pooling, THREADS threads. Prints one JSON line per way: texts/s, tokens/s, seconds.
# Builds nothing: run `make` first.
#   TEXTS=64 PARALLEL=4 THREADS=2 bench/run_embeddings.sh
set -euo pipefail
cd "$(dirname "$0")/.."
texts=${TEXTS:-64} parallel=${PARALLEL:-4} threads=${THREADS:-2}
model=${MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
out=$(mktemp -d)
. bench/serve_helpers.sh
trap 'kill $server 2> /dev/null || true; rm -rf "$out"' EXIT
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg) (on $(nproc) cores; >0.5 = shared machine)" >&2
: > "$out/serve.log" # the server writes it from the background: sed must find it at once
start_server "$out/serve.log" --model "$model" --parallel "$parallel" --threads "$threads"
python3 - "http://127.0.0.1:$port/v1/embeddings" "$texts" "$parallel" "$threads" << 'PY'
import json, sys, time, urllib.request
url, count, parallel, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
rows = [json.loads(line) for line in open("data/austen/rm_eval.jsonl")][:count]
texts = [r["prompt"] + r["chosen"] for r in rows]
def post(inputs):
    request = urllib.request.Request(url, json.dumps({"input": inputs}).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=600) as answer:
        return json.load(answer)
post(texts[:1])  # warm-up: the activation buffers
for way in ("one_request", "one_text_per_request"):
    start = time.perf_counter()
    answers = [post(texts)] if way == "one_request" else [post([t]) for t in texts]
    seconds = time.perf_counter() - start
    tokens = sum(a["usage"]["prompt_tokens"] for a in answers)
    print(json.dumps({"impl": "marlhf-serve", "way": way, "texts": len(texts), "tokens": tokens, "parallel": parallel,
                      "threads": threads, "seconds": round(seconds, 3), "texts_per_s": round(len(texts) / seconds, 1),
                      "tokens_per_s": round(tokens / seconds, 1)}))
PY
stop_server
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
