"""Load for bench/run_prefill_chunk.sh: what a long prompt joining the batch costs the answers
already streaming, against `marlhf serve` at URL.

Request A streams a greedy completion of up to --decode-tokens tokens. When A has streamed
--lead tokens, request B arrives: a prompt of about --prompt-tokens tokens (a text repeated
to length), streamed, --b-tokens new tokens. Timed on the client, from the server-sent
events (one per token of text: /v1/completions sends no role chunk, so B's first event is
its first token):
  - A's gaps between tokens: p50, p99 and max over its whole answer, and the max while B
    was waiting for its first token (the stall a whole prefill puts on A);
  - B's time to first token (from its request being sent).
A must still be streaming when B's first token comes (`a_outlived_b`), or its gaps miss
part of B's prefill. The 1-minute load average before the run says how busy the machine was.

Prints one JSON line."""
import argparse
import http.client
import json
import os
import threading
import time
import urllib.parse

SENTENCE = ("The keeper of the lighthouse climbed the narrow stairs each evening, trimmed the wick, "
            "wound the clockwork and watched the ships pass the reef in the failing light. ")


def stream(url, path, body, times, texts, usage):
    """POSTs body with stream=true; appends each token event's arrival time and text."""
    parsed = urllib.parse.urlparse(url)
    connection = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=600)
    connection.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
    response = connection.getresponse()
    if response.status != 200:
        raise SystemExit(f"{path}: status {response.status}: {response.read()[:200]!r}")
    for raw in response:
        line = raw.decode().strip()
        if not line.startswith("data: "):
            continue
        data = line[6:]
        if data == "[DONE]":
            break
        event = json.loads(data)
        if event.get("usage"):
            usage.update(event["usage"])
        if event.get("choices") and event["choices"][0].get("text"):
            times.append(time.perf_counter())
            texts.append(event["choices"][0]["text"])
    connection.close()


def percentile(values, q):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else None


ap = argparse.ArgumentParser()
ap.add_argument("url")
ap.add_argument("--impl", required=True)
ap.add_argument("--decode-tokens", type=int, default=400)
ap.add_argument("--lead", type=int, default=16)
ap.add_argument("--prompt-tokens", type=int, default=1500)
ap.add_argument("--b-tokens", type=int, default=8)
ap.add_argument("--threads", type=int, default=2)
args = ap.parse_args()

# About 33 tokens per sentence with SmolLM2's tokenizer: the server's usage says exactly.
load_before = os.getloadavg()[0]  # the machine's other work, before this run's own
long_prompt = SENTENCE * max(1, round(args.prompt_tokens / 33)) + "Tell the story of the keeper:"
a_times, a_texts, a_usage = [], [], {}
b_times, b_texts, b_usage = [], [], {}
a_body = {"prompt": "Once upon a time, in a town by the sea,", "max_tokens": args.decode_tokens,
          "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
b_body = {"prompt": long_prompt, "max_tokens": args.b_tokens, "temperature": 0, "stream": True,
          "stream_options": {"include_usage": True}}
a = threading.Thread(target=stream, args=(args.url, "/v1/completions", a_body, a_times, a_texts, a_usage))
a.start()
while len(a_times) < args.lead and a.is_alive():
    time.sleep(0.002)
b_sent = time.perf_counter()
b = threading.Thread(target=stream, args=(args.url, "/v1/completions", b_body, b_times, b_texts, b_usage))
b.start()
b.join()
a.join()

gaps = [y - x for x, y in zip(a_times, a_times[1:])]
b_first = b_times[0] if b_times else None
# The gaps that end after B was sent and start before B's first token: A's tokens during B's wait.
during = [y - x for x, y in zip(a_times, a_times[1:]) if y > b_sent and (b_first is None or x < b_first)]
ms = lambda v: None if v is None else round(1000 * v, 1)
print(json.dumps({
    "impl": args.impl, "threads": args.threads,
    "a_tokens": a_usage.get("completion_tokens"), "a_events": len(a_times),
    "a_gap_p50_ms": ms(percentile(gaps, 0.5)), "a_gap_p99_ms": ms(percentile(gaps, 0.99)),
    "a_gap_max_ms": ms(max(gaps) if gaps else None),
    "a_gap_max_during_b_prefill_ms": ms(max(during) if during else None),
    "a_tokens_during_b_prefill": len(during),
    "b_prompt_tokens": b_usage.get("prompt_tokens"), "b_ttft_ms": ms(None if b_first is None else b_first - b_sent),
    "a_outlived_b": bool(a_times and b_first is not None and a_times[-1] > b_first),
    "load_average_1m": round(load_before, 2), "cpus": os.cpu_count()}))
