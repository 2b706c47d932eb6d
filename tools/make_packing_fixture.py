#!/usr/bin/env python3
"""Writes tests/fixtures/train/packing.json for tests/test_train_tasks.c.

Run with the newer TRL's environment (scripts/setup-python makes it):
    .venv-trl/bin/python tools/make_packing_fixture.py
The output is deterministic: re-running it gives an identical file. It needs TRL 1.16 or later:
1.12's (.venv-tools, pinned for its PPO trainer) wrapped packing repeats the first block's
tokens in every later block (it read the pyarrow slice's whole child buffer), which 1.16 fixed.

Why: `marlhf sft --packing` (src/train/packing.c) packs sequences into rows as TRL's
SFTTrainer does with packing=True, through trl.data_utils.pack_dataset: Best Fit Decreasing
("bfd", cutting what is longer than a row; "bfd_split", splitting it) or a stream cut into
rows ("wrapped"), in blocks of the datasets.map batch size (1000). Each case here holds the
sequences' lengths, the row length, the strategy and the rows pack_dataset makes, each row as
its pieces [sequence, first token, length]. The sequences' tokens say where each token came
from (sequence * 100000 + position), so the pieces are read back from the packed input_ids.

Cases: rows of 7, 16 and 64 tokens; lengths around the row length (cuts and splits), small
ones (many to a row, many ties: the sort must keep their order), empty sequences (left out);
2300 sequences, so that the blocks of 1000 show.
"""
import json
import os
import random

import trl
from datasets import Dataset
from trl.data_utils import pack_dataset

CASES = [  # (sequences, row length, shortest, longest)
    (25, 7, 0, 12),
    (60, 16, 1, 40),
    (2300, 64, 0, 90),
    (40, 64, 1, 6),
]


def pieces_of(row):
    pieces = []
    for token in row:
        sequence, position = divmod(token, 100000)
        if pieces and pieces[-1][0] == sequence and pieces[-1][1] + pieces[-1][2] == position:
            pieces[-1][2] += 1
        else:
            pieces.append([sequence, position, 1])
    return pieces


def main():
    major, minor = (int(part) for part in trl.__version__.split(".")[:2])
    if (major, minor) < (1, 16):
        raise SystemExit(f"make_packing_fixture.py: TRL {trl.__version__} packs wrapped rows wrongly past 1000 "
                         "sequences; run it with .venv-trl/bin/python (TRL 1.16)")
    rng = random.Random(20261207)
    cases = []
    for n, row_length, shortest, longest in CASES:
        lengths = [rng.randint(shortest, longest) for _ in range(n)]
        ids = [[i * 100000 + t for t in range(length)] for i, length in enumerate(lengths)]
        for strategy in ("bfd", "bfd_split", "wrapped"):
            packed = pack_dataset(Dataset.from_dict({"input_ids": ids}), row_length, strategy)
            rows = [pieces_of(row) for row in packed["input_ids"]]
            if strategy != "wrapped":  # the segments TRL keeps are the pieces read back
                for row, seq_lengths in zip(rows, packed["seq_lengths"]):
                    assert [p[2] for p in row] == seq_lengths, (row, seq_lengths)
            cases.append({"lengths": lengths, "row_length": row_length, "strategy": strategy, "rows": rows})
    out = {"trl": trl.__version__, "cases": cases}
    path = os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures", "train", "packing.json")
    with open(path, "w") as f:
        json.dump(out, f, separators=(",", ":"))
        f.write("\n")


if __name__ == "__main__":
    main()
