"""Load for bench/run_reward_server.sh: the texts of data/austen/rm_eval.jsonl (prompt + chosen,
prompt + rejected, in file order) posted to a /get_reward server in REQUESTS requests of
QUERIES queries, one after the other from one client, as a PPO trainer posts a rollout's
responses. Only "query" is sent, so every server tokenizes each text whole.

    python3 bench/reward_load.py URL --impl NAME --requests 8 --queries 64 --scores-out FILE

Prints one JSON line: requests, sequences, wall seconds, sequences/s, latency (mean, max);
writes the rewards, one per line, to --scores-out (the driver compares servers with them)."""
import argparse
import json
import time
import urllib.request


def texts(path, count):
    out = []
    for line in open(path):
        row = json.loads(line)
        out += [row["prompt"] + row["chosen"], row["prompt"] + row["rejected"]]
        if len(out) >= count:
            break
    if len(out) < count:
        raise SystemExit(f"{path} has only {len(out)} texts, {count} wanted")
    return out[:count]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("url")
    ap.add_argument("--impl", required=True)
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--queries", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--data", default="data/austen/rm_eval.jsonl")
    ap.add_argument("--scores-out", required=True)
    args = ap.parse_args()
    queries = texts(args.data, args.requests * args.queries)
    rewards, latencies = [], []
    start = time.perf_counter()
    for first in range(0, len(queries), args.queries):
        data = json.dumps({"query": queries[first : first + args.queries]}).encode()
        request = urllib.request.Request(args.url + "/get_reward", data=data,
                                         headers={"Content-Type": "application/json"})
        sent = time.perf_counter()
        with urllib.request.urlopen(request, timeout=600) as response:
            answer = json.loads(response.read())
        latencies.append(time.perf_counter() - sent)
        if len(answer["rewards"]) != args.queries:
            raise SystemExit(f"{args.impl}: {len(answer['rewards'])} rewards for {args.queries} queries")
        rewards += answer["rewards"]
    wall = time.perf_counter() - start
    with open(args.scores_out, "w") as out:
        out.writelines(f"{r!r}\n" for r in rewards)
    print(json.dumps({"impl": args.impl, "requests": args.requests, "sequences": len(queries),
                      "wall_s": round(wall, 3), "sequences_per_s": round(len(queries) / wall, 2),
                      "latency_mean_s": round(sum(latencies) / len(latencies), 3),
                      "latency_max_s": round(max(latencies), 3), "threads": args.threads}), flush=True)


if __name__ == "__main__":
    main()
