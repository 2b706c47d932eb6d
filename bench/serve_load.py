"""Load for bench/run_serve_concurrency.sh: REQUESTS chat requests ("Tell me about <topic>.",
temperature 1, seed i, MAX_TOKENS new tokens each) sent by CLIENTS concurrent clients.

  serve_load.py client URL ...   against an OpenAI-compatible server (marlhf serve)
  serve_load.py llamacpp GGUF ... the same requests through llama-cpp-python in this process,
                                  one at a time, as its own server runs them (the peer)

With --max-tokens-mix A,B,...: request i asks for the (i mod k)-th of those instead (short
and long answers mixed, where a static batch holds the short ones back until the long end).

Prints one JSON line: requests, completion tokens, wall seconds, tokens/s, latency (mean,
median, 90th percentile)."""
import argparse
import json
import threading
import time
import urllib.request

TOPICS = ["cats", "rain", "ships", "bread", "winter", "music", "rivers", "trains", "bees", "castles", "tea",
          "clocks", "forests", "letters", "storms", "gardens"]


def body(i, max_tokens):
    return {"messages": [{"role": "user", "content": f"Tell me about {TOPICS[i % len(TOPICS)]}."}],
            "temperature": 1.0, "seed": i, "max_tokens": max_tokens}


def request_max_tokens(i, max_tokens, mix):
    return mix[i % len(mix)] if mix else max_tokens


def run_clients(url, requests, clients, max_tokens, mix):
    latencies, tokens, lock, next_index = [], [0], threading.Lock(), [0]

    def client():
        while True:
            with lock:
                i = next_index[0]
                next_index[0] += 1
            if i >= requests:
                return
            data = json.dumps(body(i, request_max_tokens(i, max_tokens, mix))).encode()
            request = urllib.request.Request(url + "/v1/chat/completions", data=data,
                                             headers={"Content-Type": "application/json"})
            start = time.perf_counter()
            with urllib.request.urlopen(request, timeout=600) as response:
                answer = json.loads(response.read())
            with lock:
                latencies.append(time.perf_counter() - start)
                tokens[0] += answer["usage"]["completion_tokens"]

    threads = [threading.Thread(target=client) for _ in range(clients)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - start, tokens[0], latencies


def run_llamacpp(path, requests, max_tokens, threads, mix):
    import llama_cpp
    llm = llama_cpp.Llama(model_path=path, n_ctx=512, n_threads=threads, n_threads_batch=threads, verbose=False)
    llm.create_chat_completion(**body(0, 4))  # warm-up
    latencies, tokens = [], 0
    start = time.perf_counter()
    for i in range(requests):
        b = body(i, request_max_tokens(i, max_tokens, mix))
        t0 = time.perf_counter()
        answer = llm.create_chat_completion(messages=b["messages"], temperature=b["temperature"], seed=b["seed"],
                                            max_tokens=b["max_tokens"])
        latencies.append(time.perf_counter() - t0)
        tokens += answer["usage"]["completion_tokens"]
    return time.perf_counter() - start, tokens, latencies


ap = argparse.ArgumentParser()
ap.add_argument("mode", choices=["client", "llamacpp"])
ap.add_argument("target")
ap.add_argument("--impl", required=True)
ap.add_argument("--requests", type=int, default=16)
ap.add_argument("--clients", type=int, default=4)
ap.add_argument("--max-tokens", type=int, default=48)
ap.add_argument("--threads", type=int, default=2)
ap.add_argument("--max-tokens-mix", default="", help="comma-separated max_tokens, request i takes the (i mod k)-th")
args = ap.parse_args()
mix = [int(x) for x in args.max_tokens_mix.split(",") if x]
if args.mode == "client":
    wall, tokens, latencies = run_clients(args.target, args.requests, args.clients, args.max_tokens, mix)
else:
    wall, tokens, latencies = run_llamacpp(args.target, args.requests, args.max_tokens, args.threads, mix)
ordered = sorted(latencies)


def percentile(q):
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 2)


print(json.dumps({"impl": args.impl, "requests": args.requests, "clients": args.clients if args.mode == "client" else 1,
                  "max_tokens": args.max_tokens_mix if mix else args.max_tokens, "completion_tokens": tokens,
                  "wall_s": round(wall, 2), "tokens_per_s": round(tokens / wall, 1),
                  "mean_latency_s": round(sum(latencies) / len(latencies), 2), "median_latency_s": percentile(0.5),
                  "p90_latency_s": percentile(0.9), "threads": args.threads}))
