"""Writes small training files for the trainer tests (tests/cli/train.sh), in the generic
local schemas: sft.jsonl {"prompt", "response"}, pairs.jsonl {"prompt", "chosen",
"rejected"}, ranked.jsonl {"prompt", "responses"} (best first), each with an _eval twin.
The content is patterned so that a tiny model learns it in a few dozen steps: the response
repeats the prompt's animal, and preferred answers are kind words, rejected ones unkind.
usage: .venv-tools/bin/python tools/make_train_fixtures.py
"""
import json
import os
import random

root = os.path.join(os.path.dirname(__file__), "..", "tests/fixtures/train")
os.makedirs(root, exist_ok=True)
rng = random.Random(1234)
animals = ["cat", "dog", "bird", "fish", "horse", "cow", "sheep", "goat", "duck", "mouse"]
kind = ["good", "lovely", "happy", "great", "wonderful", "kind"]
unkind = ["bad", "awful", "sad", "terrible", "horrible", "nasty"]


def write(name, rows):
    with open(os.path.join(root, name), "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")


for split, n in (("", 48), ("_eval", 12)):
    sft, pairs, ranked = [], [], []
    for _ in range(n):
        a = rng.choice(animals)
        prompt = f"Tell me about the {a}."
        sft.append({"prompt": prompt, "response": f" The {a} is a {rng.choice(kind)} animal."})
        pairs.append({"prompt": prompt, "chosen": f" The {a} is {rng.choice(kind)}.",
                      "rejected": f" The {a} is {rng.choice(unkind)}."})
        ranked.append({"prompt": prompt, "responses": [f" The {a} is {rng.choice(kind)} and {rng.choice(kind)}.",
                                                       f" The {a} is {rng.choice(kind)}.",
                                                       f" The {a} is {rng.choice(unkind)}.",
                                                       f" The {a} is {rng.choice(unkind)} and {rng.choice(unkind)}."]})
    write(f"sft{split}.jsonl", sft)
    write(f"pairs{split}.jsonl", pairs)
    write(f"ranked{split}.jsonl", ranked)
print("wrote", root)
