#!/usr/bin/env python3
"""Writes tests/fixtures/data/splits.json for tests/test_data.c.

Run with the tools environment:  .venv-tools/bin/python tools/make_split_fixtures.py
The output is deterministic: re-running it gives an identical file.

Why: src/data/split.c reproduces DeepSpeed-Chat's train-phase splits
(dschat/utils/data/data_utils.py, get_raw_dataset_split_index and get_shuffle_idx; spec
section 3.1) in C, including numpy's legacy RandomState(seed).shuffle, and must give the
same indices, every one. The reference here is numpy itself, driven by a re-statement of
DS-Chat's index arithmetic:

  weights = [float(w) for w in split.split(",")]; divided by their sum
  bounds  = [0]; bounds[k+1] = bounds[k] + int(round(weight_k * float(N)))
  d = bounds[-1] - N; every bound but the first has d subtracted
  perm    = numpy.arange(N, dtype=uint32); numpy.random.RandomState(seed).shuffle(perm)
  phase k = perm[bounds[k-1]:bounds[k]]   (a Python slice: negative bounds count from
                                           the end)

WebGPT (OpenaiWebgptcomparisonsDataset): the train split is first cut "95,5" into
train/eval with the same seed, then the phase split runs inside the chosen part.

splits.json:
  mt19937     {seed, u32: first 8 words (randint(0, 2**32, dtype=uint32)), doubles: first 4
              random_sample() values, as "%.17g" strings}
  cases       {n, seed, permutation, splits: [{split, boundaries, phases (null for the
              largest n, whose phases the test takes from permutation and boundaries)}]}
  nested      {n, seed, outer, split, parts: [[phase indices...] per phase] per outer part}
  bad_splits  split strings DS-Chat could not use or we refuse (see split.h)
"""
import json
from pathlib import Path

import numpy as np

OUT = Path(__file__).resolve().parent.parent / "tests/fixtures/data/splits.json"
SIZES = [0, 1, 2, 3, 5, 10, 97, 1000, 12345]
SEEDS = [1234, 42]
SPLITS = ["2,4,4", "95,5", "1,0,0", "6,2,2", "1,1,1", "1,1", "1,3,3,3", " 0.5, 0.25 ,0.25", "0.1,0.2,0.7"]
LARGEST_WITH_PHASES = 1000


def boundaries(n, split):
    weights = [float(w) for w in split.split(",")]
    total = sum(weights)
    weights = [w / total for w in weights]
    bounds = [0]
    for k, w in enumerate(weights):
        bounds.append(bounds[k] + int(round(w * float(n))))
    error = bounds[-1] - n
    for k in range(1, len(bounds)):
        bounds[k] -= error
    assert bounds[-1] == n
    return bounds


def permutation(n, seed):
    perm = np.arange(0, n, 1, dtype=np.uint32)
    np.random.RandomState(seed=seed).shuffle(perm)
    return [int(i) for i in perm]


def phases(n, seed, split):
    perm = permutation(n, seed)
    b = boundaries(n, split)
    return [perm[b[k]:b[k + 1]] for k in range(len(b) - 1)]


def main():
    mt = []
    for seed in [1234, 42, 0, 2**32 - 1]:
        words = np.random.RandomState(seed).randint(0, 2**32, size=8, dtype=np.uint32)
        doubles = np.random.RandomState(seed).random_sample(4)
        mt.append({"seed": seed, "u32": [int(w) for w in words], "doubles": ["%.17g" % d for d in doubles]})

    cases = []
    for n in SIZES:
        for seed in SEEDS:
            perm = permutation(n, seed)
            entry = {"n": n, "seed": seed, "permutation": perm, "splits": []}
            for split in SPLITS:
                b = boundaries(n, split)
                entry["splits"].append({
                    "split": split,
                    "boundaries": b,
                    "phases": [perm[b[k]:b[k + 1]] for k in range(len(b) - 1)] if n <= LARGEST_WITH_PHASES else None,
                })
            cases.append(entry)
    # Seeds at the edges of numpy's legacy range.
    for seed in [0, 2**32 - 1]:
        cases.append({"n": 10, "seed": seed, "permutation": permutation(10, seed),
                      "splits": [{"split": "2,4,4", "boundaries": boundaries(10, "2,4,4"),
                                  "phases": phases(10, seed, "2,4,4")}]})

    nested = []
    for n in [97, 1000, 1957]:
        for seed in SEEDS:
            parts = []
            for outer_phase in phases(n, seed, "95,5"):
                inner = phases(len(outer_phase), seed, "2,4,4")
                parts.append([[outer_phase[i] for i in p] for p in inner])
            nested.append({"n": n, "seed": seed, "outer": "95,5", "split": "2,4,4", "parts": parts})

    fixture = {
        "mt19937": mt,
        "cases": cases,
        "nested": nested,
        "bad_splits": ["", "2,,4", "2,4,x", "0,0,0", "-1,2", "nan,1", "inf,1", "0x10,1", "2;4;4", "1,"],
    }
    OUT.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(fixture, separators=(",", ":"))
    # One case per line keeps diffs readable without bloating the file.
    text = text.replace("},{\"n\"", "},\n{\"n\"")
    OUT.write_text(text + "\n")
    print(f"wrote {OUT} ({OUT.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
