"""The peer of bench/run_reward_server.sh: a reward model served on OpenRLHF's /get_reward
protocol with PyTorch + transformers, computed the way OpenRLHF's `openrlhf.cli.serve_rm`
computes it (its RewardModelProxy): each query has trailing pad/EOS text taken off and the
EOS text appended, the batch is tokenized whole and left-padded, positions count from
each row's first real token, and the score is the value head's output at the row's last
real token. Requests are answered one at a time, as serve_rm's one uvicorn worker runs
its synchronous model calls. Float32 on the CPU.

    .venv-tools/bin/python bench/torch_reward_server.py --model /tmp/smollm2-rm \
        --port-file /tmp/port [--batch-size 4] [--threads 2]
"""
import argparse
import json
import sys
from http.server import BaseHTTPRequestHandler, HTTPServer

import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer


def strip_sequence(text, pad, eos):
    """Takes pad and EOS text off the end, as OpenRLHF's strip_sequence does."""
    changed = True
    while changed:
        changed = False
        for token in (pad, eos):
            if token and text.endswith(token):
                text, changed = text[: -len(token)], True
    return text


class RewardModel:
    def __init__(self, path, batch_size, max_length):
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.tokenizer.padding_side = "left"
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.model = AutoModelForSequenceClassification.from_pretrained(path, dtype=torch.float32).eval()
        self.batch_size, self.max_length = batch_size, max_length

    @torch.no_grad()
    def score(self, queries):
        eos, pad = self.tokenizer.eos_token, self.tokenizer.pad_token
        texts = [strip_sequence(q, pad, eos) + eos for q in queries]
        scores = []
        for first in range(0, len(texts), self.batch_size):
            batch = self.tokenizer(texts[first : first + self.batch_size], return_tensors="pt", padding=True,
                                   truncation=True, max_length=self.max_length)
            mask = batch["attention_mask"]
            positions = (mask.long().cumsum(-1) - 1).clamp(min=0)
            hidden = self.model.base_model(input_ids=batch["input_ids"], attention_mask=mask,
                                           position_ids=positions).last_hidden_state
            values = self.model.score(hidden).squeeze(-1)
            # Left padding: every row's last real token is the last column.
            scores.extend(values[:, -1].tolist())
        return scores


def serve(model, port_file):
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            if self.path != "/get_reward":
                self.send_error(404)
                return
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            scores = model.score(body["query"])
            answer = json.dumps({"rewards": scores, "scores": scores}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, *args):
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    with open(port_file, "w") as out:
        out.write(str(server.server_address[1]))
    server.serve_forever()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--port-file", required=True)
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--max-length", type=int, default=2048)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    serve(RewardModel(args.model, args.batch_size, args.max_length), args.port_file)


if __name__ == "__main__":
    sys.exit(main())
