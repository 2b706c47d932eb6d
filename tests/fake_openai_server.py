#!/usr/bin/env python3
"""A fake OpenAI-compatible chat-completions endpoint for tests/cli/judge.sh (stdlib only).

The verdict is scripted by markers in the texts being judged: the judge prompt shows two
texts, and the server prefers the one that holds "[[win]]" (or the other one when the
first it finds is "[[lose]]"); "[[tie]]" gives a tie; "[[garbage]]" a reply without any
verdict, every time; "[[garbage-once]]" no verdict at first, a verdict after the
reminder. Replies cycle through the verdict formats a real judge writes ("Preferred: A",
"**Preferred:** Response B", {"preferred": "A"}, "Winner: Summary 2", ...), so the
parsing is exercised end to end.

Failures: --fail-first N --fail-status S answers the first N requests with status S
(500, 429, 401, ...); --malformed-first N answers them with a 200 body that is not a
chat completion; --hang-s T sleeps T seconds before every answer after the first
--hang-after ones (default 0: every answer); --max-requests N
exits after answering N requests and answers none past the Nth (an endpoint that goes
away mid-run).

--port-file FILE receives the port (bound on 0: a free one) once the server listens;
--log FILE gets one JSON line per request: its Authorization header and its body.
"""
import argparse
import json
import os
import re
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

FORMATS = [
    "The first is more concise.\nPreferred: {label}",
    "Both are fine, but one is tighter.\n\n**Preferred:** Response {label}",
    '```json\n{{"comparison": "one is better", "preferred": "{label}"}}\n```',
    "Comparison: close call.\nWinner: Summary {number}",
    "preference: {lower}",
]
TIE_FORMATS = ["Neither stands out.\nPreferred: tie", '{{"preferred": "tie"}}', "**Preferred: Tie**"]


def verdict_reply(text, reminded, count):
    found = re.search(r"\[\[(win|lose|tie|garbage|garbage-once)\]\]", text)
    kind = found.group(1) if found else "garbage"
    if kind == "garbage" or (kind == "garbage-once" and not reminded):
        return "Both responses have merits and flaws; it is hard to say."
    if kind == "tie":
        return TIE_FORMATS[count % len(TIE_FORMATS)]
    if kind == "garbage-once":
        return "Preferred: B"
    # The marker sits in the text shown first or second; "lose" means the other one wins.
    first_end = re.search(r"\[End of [^\]]* A\]", text)
    first = found.start() < first_end.start() if first_end else True
    wins_first = first if kind == "win" else not first
    label = "A" if wins_first else "B"
    return FORMATS[count % len(FORMATS)].format(label=label, number="1" if wins_first else "2", lower=label.lower())


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--port-file", required=True)
    parser.add_argument("--log")
    parser.add_argument("--fail-first", type=int, default=0)
    parser.add_argument("--fail-status", type=int, default=500)
    parser.add_argument("--malformed-first", type=int, default=0)
    parser.add_argument("--hang-s", type=float, default=0)
    parser.add_argument("--hang-after", type=int, default=0)
    parser.add_argument("--max-requests", type=int, default=0)
    parser.add_argument("--lifetime-s", type=float, default=120, help="exit after this long whatever happens")
    args = parser.parse_args()
    lock = threading.Lock()
    state = {"requests": 0, "answered": 0}

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def send(self, status, body, content_type="application/json"):
            data = body.encode()
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            if status == 429:
                self.send_header("Retry-After", "0")
            self.end_headers()
            self.wfile.write(data)

        def do_POST(self):
            length = int(self.headers.get("Content-Length", 0))
            raw = self.rfile.read(length).decode()
            with lock:
                # The budget is counted as requests arrive, not after answers went out: a
                # client that opens a new connection per request could otherwise get one
                # more answer from another thread before the last answering one exits.
                if args.max_requests and state["requests"] >= args.max_requests:
                    self.close_connection = True
                    return  # no answer: the endpoint is going away
                state["requests"] += 1
                number = state["requests"]
                if args.log:
                    with open(args.log, "a") as f:
                        f.write(json.dumps({"n": number, "path": self.path,
                                            "authorization": self.headers.get("Authorization"),
                                            "body": raw}) + "\n")
            if args.hang_s and number > args.hang_after:
                time.sleep(args.hang_s)
            if not self.path.endswith("/chat/completions"):
                return self.send(404, json.dumps({"error": {"message": f"no route {self.path}"}}))
            if number <= args.fail_first:
                message = {429: "Rate limit reached, slow down", 401: "Incorrect API key provided: sk-bad"}.get(
                    args.fail_status, "The server had an error while processing your request")
                return self.send(args.fail_status, json.dumps({"error": {"message": message, "type": "fake"}}))
            if number <= args.fail_first + args.malformed_first:
                return self.send(200, "<html>upstream hiccup</html>", "text/html")
            try:
                request = json.loads(raw)
                messages = request["messages"]
                text = messages[0]["content"]
            except (ValueError, KeyError, IndexError, TypeError):
                return self.send(400, json.dumps({"error": {"message": "bad request body"}}))
            reply = verdict_reply(text, len(messages) > 1, number)
            self.send(200, json.dumps({
                "id": f"chatcmpl-{number}", "object": "chat.completion", "model": request.get("model"),
                "choices": [{"index": 0, "message": {"role": "assistant", "content": reply}, "finish_reason": "stop"}],
            }))
            with lock:
                state["answered"] += 1
                if args.max_requests and state["answered"] >= args.max_requests:
                    # The answer is on the wire; go away as an endpoint that crashes would.
                    self.wfile.flush()
                    os._exit(0)

    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    server.daemon_threads = True
    tmp = args.port_file + ".tmp"
    with open(tmp, "w") as f:
        f.write(str(server.server_address[1]))
    os.rename(tmp, args.port_file)
    threading.Timer(args.lifetime_s, lambda: os._exit(0)).start()
    server.serve_forever()


if __name__ == "__main__":
    sys.exit(main())
