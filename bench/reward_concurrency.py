"""Load for bench/run_reward_batch.sh: CLIENTS clients at once, each posting REQUESTS
/get_reward requests of QUERIES texts (prompt + chosen / rejected of data/austen/rm_eval.jsonl,
client c's requests in turn), each client sending its next request when the previous one is
answered — as several PPO workers or rollout processes scoring their samples against one
reward server.

    python3 bench/reward_concurrency.py URL --impl NAME --clients 8 --requests 4 --queries 2 --scores-out FILE

Prints one JSON line: requests, sequences, wall seconds, requests/s, sequences/s, latency
(mean, p50, p90, max); writes every reward (in request order) to --scores-out, so that the
driver can compare a batched run's rewards with a one-at-a-time run's."""
import argparse
import json
import threading
import time
import urllib.request

from reward_load import texts  # the same texts as bench/run_reward_server.sh's load (bench/ is on sys.path)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("url")
    ap.add_argument("--impl", required=True)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--requests", type=int, default=4, help="per client")
    ap.add_argument("--queries", type=int, default=2, help="texts per request")
    ap.add_argument("--data", default="data/austen/rm_eval.jsonl")
    ap.add_argument("--scores-out", required=True)
    args = ap.parse_args()
    total = args.clients * args.requests
    queries = texts(args.data, total * args.queries)
    bodies = [json.dumps({"query": queries[r * args.queries:(r + 1) * args.queries]}).encode() for r in range(total)]
    rewards, latencies, errors = [None] * total, [None] * total, []

    def client(c):
        for k in range(args.requests):
            r = c * args.requests + k
            request = urllib.request.Request(args.url + "/get_reward", data=bodies[r],
                                             headers={"Content-Type": "application/json"})
            sent = time.perf_counter()
            try:
                with urllib.request.urlopen(request) as response:
                    answer = json.loads(response.read())
            except Exception as e:  # reported below: the run does not count
                errors.append(f"request {r}: {e}")
                return
            latencies[r] = time.perf_counter() - sent
            rewards[r] = answer["rewards"]

    start = time.perf_counter()
    threads = [threading.Thread(target=client, args=(c,)) for c in range(args.clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    if errors:
        raise SystemExit(f"{args.impl}: {len(errors)} requests failed: {errors[0]}")
    with open(args.scores_out, "w") as out:
        out.writelines(f"{x!r}\n" for row in rewards for x in row)
    ordered = sorted(latencies)
    pick = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))]
    print(json.dumps({"impl": args.impl, "clients": args.clients, "requests": total, "queries": args.queries,
                      "sequences": total * args.queries, "wall_s": round(wall, 3),
                      "requests_per_s": round(total / wall, 2), "sequences_per_s": round(total * args.queries / wall, 2),
                      "latency_mean_s": round(sum(latencies) / total, 3), "latency_p50_s": round(pick(0.5), 3),
                      "latency_p90_s": round(pick(0.9), 3), "latency_max_s": round(ordered[-1], 3)}), flush=True)


if __name__ == "__main__":
    main()
