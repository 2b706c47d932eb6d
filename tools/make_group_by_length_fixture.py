#!/usr/bin/env python3
"""Writes tests/fixtures/train/group_by_length.json for tests/test_train_tasks.c.

Run with the tools environment:  .venv-tools/bin/python tools/make_group_by_length_fixture.py
The output is deterministic: re-running it gives an identical file.

Why: `--group-by-length` (src/train/loop.c, train_group_by_length) is Hugging Face's
group_by_length, whose order transformers.trainer_pt_utils.get_length_grouped_indices makes:
a shuffle cut into megabatches, each sorted longest first, the longest example swapped to
the front. That function draws its shuffle with torch.randperm; marlhf shuffles with its own
stream (train_epoch_order), so the reference here is the function itself run on a given
shuffle: torch.randperm is replaced, for the call, by one that returns it. Each case holds
the lengths, the batch size (marlhf passes one optimizer step's examples, as the Trainer
passes train_batch_size * gradient_accumulation_steps), the shuffle and the order
transformers returns for it.

Cases: sizes that give a megabatch multiple of 1 (fewer than 4 batches of examples), of a
few, and of the cap of 50; lengths drawn from a narrow range (many ties: the sort must keep
their shuffled order, as Python's stable sort does) and a wide one.
"""
import json
import os
import random

import torch
from transformers import trainer_pt_utils

CASES = [  # (examples, batch, shortest, longest)
    (5, 8, 3, 40),
    (37, 4, 1, 6),
    (100, 6, 10, 200),
    (1000, 8, 1, 9),
    (3000, 4, 5, 900),
    (257, 16, 2, 3),
]


def grouped(lengths, batch, shuffle):
    real_randperm = torch.randperm
    torch.randperm = lambda n, generator=None: torch.tensor(shuffle, dtype=torch.long)
    try:
        return [int(i) for i in trainer_pt_utils.get_length_grouped_indices(lengths, batch)]
    finally:
        torch.randperm = real_randperm


def main():
    rng = random.Random(20261207)
    cases = []
    for n, batch, shortest, longest in CASES:
        lengths = [rng.randint(shortest, longest) for _ in range(n)]
        shuffle = list(range(n))
        rng.shuffle(shuffle)
        cases.append({"batch": batch, "lengths": lengths, "shuffle": shuffle,
                      "grouped": grouped(lengths, batch, shuffle)})
    import transformers
    out = {"transformers": transformers.__version__, "cases": cases}
    path = os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures", "train", "group_by_length.json")
    with open(path, "w") as f:
        json.dump(out, f, separators=(",", ":"))
        f.write("\n")


if __name__ == "__main__":
    main()
