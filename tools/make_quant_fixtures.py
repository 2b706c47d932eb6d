#!/usr/bin/env python3
"""Reference Q4_0 blocks for tests/test_quantize.c, from gguf-py's own quantizer.

    .venv-tools/bin/python tools/make_quant_fixtures.py

Writes tests/fixtures/quant/q4_0.json: float32 blocks of 32 values (random at several
magnitudes, plus an all-zero block, blocks whose largest magnitude is positive or negative,
and one holding exact halves between codes), each with the 18 bytes gguf.quants.Q4_0 makes of
it (f16 scale, 16 bytes of nibbles) and gguf-py's dequantization of those bytes. marlhf's
Q4_0 (src/ops/q4.c) must produce the same bytes and the same dequantized floats.
"""
import json
from pathlib import Path

import numpy as np
from gguf import quants, GGMLQuantizationType

OUT = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "quant" / "q4_0.json"


def main():
    rng = np.random.default_rng(2026)
    blocks = []
    for magnitude in (1e-3, 0.02, 0.5, 3.0, 40.0):
        for _ in range(4):
            blocks.append(rng.normal(0.0, magnitude, 32))
    blocks.append(np.zeros(32))
    positive = rng.uniform(-1, 1, 32)
    positive[7] = 2.5  # the extreme is positive: the scale is negative
    blocks.append(positive)
    negative = rng.uniform(-1, 1, 32)
    negative[30] = -2.5
    blocks.append(negative)
    halves = (np.arange(32) % 16 - 8 + 0.5) * 0.25  # values exactly between two codes
    halves[0] = -2.0
    blocks.append(halves)
    x = np.asarray(blocks, dtype=np.float32)
    q = quants.quantize(x, GGMLQuantizationType.Q4_0)
    assert q.shape == (len(blocks), 18), q.shape
    y = quants.dequantize(q, GGMLQuantizationType.Q4_0).astype(np.float32)
    fixture = {
        "source": "gguf-py gguf.quants (quantize / dequantize, Q4_0), tools/make_quant_fixtures.py",
        "blocks": [
            {"x": [float(v) for v in x[i]], "bytes": bytes(q[i]).hex(), "dequantized": [float(v) for v in y[i]]}
            for i in range(len(blocks))
        ],
    }
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(fixture, separators=(",", ":")) + "\n")
    print(f"wrote {OUT} ({len(blocks)} blocks)")


if __name__ == "__main__":
    main()
