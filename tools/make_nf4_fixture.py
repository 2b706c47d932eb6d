#!/usr/bin/env python3
"""Reference NF4 quantization for tests/test_quantize.c, from bitsandbytes itself (its CPU backend).

    .venv-tools/bin/python tools/make_nf4_fixture.py

Writes tests/fixtures/quant/nf4.json: bitsandbytes' 16 NF4 levels and its 256-value dynamic
map (create_dynamic_map()), and for a few float32 matrices what
bitsandbytes.functional.quantize_4bit(x, blocksize=64, quant_type="nf4") makes of them, without
and with compress_statistics (double quantization): the packed 4-bit codes, the per-block absmax
values (or their 8-bit codes, second-level absmax values and offset), and dequantize_4bit's
floats. The matrices: weights of a typical magnitude; a row of zeros beside rows of huge, tiny
and subnormal values; a size that is not a multiple of 64 (an odd count: the last block is
short, the last byte padded); values exactly on the midpoints between levels; values whose code depends on multiplying by
the reciprocal of the absmax (a whole block) or dividing by it (a shorter last one); and a
[64, 576] matrix (576 blocks: three blocks of scales for the double quantization) whose values
follow a formula the C test recomputes exactly (x is not stored; its dequantized values are,
for rows 0 and 63, and all its scales are).
marlhf's NF4 (src/ops/nf4.c) must produce the same bytes and the same floats.
"""
import json
import warnings
from pathlib import Path

import numpy as np
import torch

warnings.filterwarnings("ignore")
import bitsandbytes.functional as F  # noqa: E402

OUT = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "quant" / "nf4.json"


def formula_matrix(rows, cols):
    """x[r, c] = (u - 2^23) / 2^23 * 2^-(3 + (block % 9)), u the top 24 bits of a 32-bit hash of
    the flat index: exact in float32, recomputed by tests/test_quantize.c."""
    i = np.arange(rows * cols, dtype=np.uint64)
    u = ((i * np.uint64(2654435761) + np.uint64(12345)) % np.uint64(2**32)) >> np.uint64(8)
    unit = (u.astype(np.float64) - 2.0**23) / 2.0**23
    block = i // np.uint64(64)
    scale = 2.0 ** -(3.0 + (block % np.uint64(9)).astype(np.float64))
    return (unit * scale).astype(np.float32).reshape(rows, cols)


def floats(t):
    """float32 values as one hex string, 8 digits (the IEEE bits, most significant first) each:
    exact, and a third of the size of decimal JSON numbers."""
    return np.ascontiguousarray(np.asarray(t, dtype=np.float32).reshape(-1)).astype(">f4").tobytes().hex()


def hexbytes(t):
    return bytes(t.reshape(-1).to(torch.uint8).numpy().tobytes()).hex()


def case(name, x, store_x=True, dequantized_rows=None):
    a = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))
    out = {"name": name, "shape": list(a.shape)}
    if store_x:
        out["x"] = floats(a)
    for key, compress in (("single", False), ("double", True)):
        packed, state = F.quantize_4bit(a, blocksize=64, compress_statistics=compress, quant_type="nf4")
        y = F.dequantize_4bit(packed, state)
        # The 4-bit codes do not depend on compress_statistics: stored once.
        assert out.setdefault("packed", hexbytes(packed)) == hexbytes(packed)
        entry = {}
        if compress:
            # The block scales as dequantize_4bit computes them: map[code] * absmax2 + offset.
            scales = F.dequantize_blockwise(state.absmax, state.state2) + state.offset
            entry.update(offset=floats(state.offset), scale_codes=hexbytes(state.absmax),
                         absmax2=floats(state.state2.absmax), scales=floats(scales))
        else:
            entry["absmax"] = floats(state.absmax)
        rows = y.reshape(a.shape[0], -1).numpy()
        if dequantized_rows is None:
            entry["dequantized"] = floats(y)
        else:
            entry["dequantized_rows"] = {str(r): floats(rows[r]) for r in dequantized_rows}
        out[key] = entry
    return out


def main():
    rng = np.random.default_rng(2026)
    cases = []
    cases.append(case("weights", rng.normal(0.0, 0.02, (6, 128))))
    extremes = rng.normal(0.0, 1.0, (5, 192))
    extremes[1] = 0.0                      # a row of zeros: absmax 0
    extremes[2] *= 1e30                    # huge
    extremes[3] *= 1e-30                   # tiny (absmax above the 1e-38 clamp)
    extremes[4, :64] *= 1e-40              # subnormal: absmax below the clamp
    extremes[4, 64:128] = 3.0              # a constant block
    extremes[4, 128:] = -extremes[4, 128:] ** 2
    cases.append(case("extremes", extremes))
    cases.append(case("short_last_block", rng.normal(0.0, 1.0, (5, 37))))
    levels = F.get_4bit_type("nf4", device="cpu")
    midpoints = ((levels[:-1] + levels[1:]) / 2).numpy()
    ties = np.zeros((2, 64), dtype=np.float32)
    ties[0, :15] = midpoints               # exactly between two levels (absmax 1: scaled by 1)
    ties[0, 15:30] = -midpoints
    ties[0, 63] = 1.0
    ties[1] = np.linspace(-1.0, 1.0, 64, dtype=np.float32)
    cases.append(case("midpoints", ties))
    # A whole block multiplies by the reciprocal of its absmax, a shorter last one divides: with
    # absmax 3 these values fall on different sides of a midpoint under the two rules.
    near = [-1.83189857006073, -1.019038200378418, -0.41373518109321594, 0.11937045305967331,
            1.1679376363754272, 1.9283608198165894]
    reciprocal = rng.uniform(-1.0, 1.0, 74).astype(np.float32)
    reciprocal[0], reciprocal[64] = 3.0, -3.0
    reciprocal[1:7] = near
    reciprocal[65:71] = near
    cases.append(case("reciprocal_and_division", reciprocal.reshape(1, 74)))
    cases.append(case("formula_64x576", formula_matrix(64, 576), store_x=False, dequantized_rows=[0, 63]))
    fixture = {
        "source": "bitsandbytes %s functional.quantize_4bit / dequantize_4bit (nf4, blocksize 64, CPU), "
                  "tools/make_nf4_fixture.py" % __import__("bitsandbytes").__version__,
        "float_encoding": "float32 arrays are hex strings, 8 digits a value: the IEEE bits, most significant first",
        "levels": floats(levels),
        "dynamic_map": floats(F.create_dynamic_map()),
        "cases": cases,
    }
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(fixture, separators=(",", ":")) + "\n")
    print(f"wrote {OUT} ({len(cases)} cases, {OUT.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
