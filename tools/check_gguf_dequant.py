#!/usr/bin/env python3
"""Compares marlhf's GGUF dequantization with gguf-py's on every tensor of a file.

    .venv-tools/bin/python tools/check_gguf_dequant.py MODEL.gguf

Builds tools/gguf_dump.c (with src/io/gguf*.c) into a temporary directory, runs
`gguf_dump --f32 MODEL.gguf`, which streams each tensor converted to f32, and
compares it, tensor by tensor, with gguf.quants.dequantize() of the same bytes as
read by gguf.GGUFReader. Prints per-type counts, the max |difference| and how many
values differ in their bits; exits 1 if any value differs. Nothing large is written
to disk: the values go through a pipe.
"""
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

import numpy as np
import gguf

REPO = Path(__file__).resolve().parent.parent


def build_dump_tool(out_dir):
    binary = Path(out_dir) / "gguf_dump"
    sources = ["src/core/check.c", "src/io/gguf.c", "src/io/gguf_dequant.c", "tools/gguf_dump.c"]
    subprocess.run(["gcc", "-std=c17", "-O2", "-D_GNU_SOURCE", "-Isrc", *sources, "-o", str(binary)],
                   cwd=REPO, check=True)
    return binary


def read_exactly(stream, n):
    chunks, left = [], n
    while left > 0:
        chunk = stream.read(left)
        if not chunk:
            raise RuntimeError(f"gguf_dump output ended {left} bytes early")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def main():
    if len(sys.argv) != 2:
        print("usage: check_gguf_dequant.py MODEL.gguf", file=sys.stderr)
        return 2
    path = sys.argv[1]
    reader = gguf.GGUFReader(path)
    with tempfile.TemporaryDirectory() as tmp:
        binary = build_dump_tool(tmp)
        proc = subprocess.Popen([str(binary), "--f32", path], stdout=subprocess.PIPE)
        per_type = defaultdict(lambda: [0, 0, 0.0, 0])  # tensors, values, max |diff|, differing values
        for tensor in reader.tensors:
            expected = gguf.quants.dequantize(tensor.data, tensor.tensor_type).astype(np.float32).ravel()
            got = np.frombuffer(read_exactly(proc.stdout, expected.size * 4), dtype="<f4")
            same = (got == expected) | (np.isnan(got) & np.isnan(expected))  # equal infinities too
            with np.errstate(invalid="ignore"):
                diff = np.where(same, 0.0, np.abs(got.astype(np.float64) - expected.astype(np.float64)))
            stats = per_type[tensor.tensor_type.name]
            stats[0] += 1
            stats[1] += expected.size
            stats[2] = max(stats[2], float(np.nanmax(diff)) if diff.size else 0.0)
            stats[3] += int(np.count_nonzero(got.view(np.uint32) != expected.view(np.uint32)))
        trailing = proc.stdout.read()
        rc = proc.wait()
    if rc != 0 or trailing:
        print(f"gguf_dump failed (exit {rc}, {len(trailing)} unexpected bytes)", file=sys.stderr)
        return 1
    worst, differing = 0.0, 0
    print(f"{path}")
    for name, (tensors, values, max_diff, n_diff) in sorted(per_type.items()):
        print(f"  {name:6s} {tensors:4d} tensors {values:11d} values  max |diff| {max_diff:.3g}  bit-different {n_diff}")
        worst = max(worst, max_diff)
        differing += n_diff
    print(f"max |diff| over all tensors: {worst:.3g}; values differing in any bit: {differing}")
    return 0 if differing == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
