#!/usr/bin/env python3
"""Reference bf16 rounding for tests/test_quantize.c, from torch's own conversion.

    .venv-tools/bin/python tools/make_bf16_fixture.py

Writes tests/fixtures/quant/bf16.json: float32 bit patterns and the bf16 bits that
torch.Tensor.to(torch.bfloat16) gives each (round to nearest, ties to even). The cases are
the ones a rounding gets wrong first: values exactly halfway between two bf16 values (with an
even and with an odd lower neighbour), one ulp either side of halfway, the largest finite
floats (which round to infinity past bf16's largest), subnormals, signed zeros, infinities,
NaNs, and random floats at many magnitudes. marlhf's bf16_round (src/core/bf16.h) must give the
same bits (for a NaN: a NaN; torch's sign and payload bits of a NaN are its own).
"""
import json
from pathlib import Path

import numpy as np
import torch

OUT = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "quant" / "bf16.json"


def main():
    rng = np.random.default_rng(1234)
    bits = []
    for upper in (0x3F80, 0x3F81, 0xBF80, 0xBF81, 0x0001, 0x0080, 0x7F7F, 0xFF7F, 0x4049, 0x3A83):
        base = upper << 16
        bits += [base, base | 0x7FFF, base | 0x8000, base | 0x8001, base | 0xFFFF]
    bits += [0x00000000, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00000, 0x7F800001, 0x7FFFFFFF,
             0x7F7FFFFF, 0xFF7FFFFF, 0x7F7F8000, 0x7F7F7FFF, 0x00000001, 0x807FFFFF, 0x00400000]
    for scale in (1e-38, 1e-20, 1e-6, 1e-3, 0.02, 1.0, 3.0, 1e3, 1e20, 1e38):
        values = (rng.standard_normal(20) * scale).astype(np.float32)
        bits += [int(v) for v in values.view(np.uint32)]
    floats = torch.from_numpy(np.array(bits, dtype=np.uint32).view(np.float32))
    rounded = floats.to(torch.bfloat16).view(torch.int16).numpy().astype(np.uint16)
    cases = [{"float_bits": b, "bf16_bits": int(r)} for b, r in zip(bits, rounded)]
    OUT.write_text(json.dumps({"torch": torch.__version__, "cases": cases}, indent=1) + "\n")
    print(f"wrote {OUT} ({len(cases)} cases)")


if __name__ == "__main__":
    main()
