#!/usr/bin/env python3
"""Whether llama.cpp reads every tensor of a GGUF file as marlhf reads it, bit for bit: the
check of a file marlhf's writer made (`marlhf convert --outtype ...`) against the program
such files are for.

    PYTHON tools/check_gguf_llamacpp_dequant.py MODEL.gguf

PYTHON has llama-cpp-python (bench/run_decode.sh builds one). llama.cpp's quantize tool
writes MODEL.gguf as an all-F32 file (ftype ALL_F32, requantizing allowed: each tensor
dequantized by llama.cpp's own to_float) into a temporary directory; tools/gguf_dump.c
(built there with src/io/gguf*.c) streams each tensor of both files as f32 (MODEL.gguf's
through marlhf's dequantization, io/gguf_dequant.c); the two are compared tensor by tensor by
name. Prints one JSON line (tensors per type, the names of those whose bits differ) and
exits 1 if any does.
"""
import json
import re
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def fail(message):
    """One line on stderr and exit 2, as marlhf's own errors."""
    print(f"marlhf: error: {message} (tools/check_gguf_llamacpp_dequant.py)", file=sys.stderr)
    sys.exit(2)


def dump(tool, path, out_dir, label):
    """The tensors of `path` as {name: f32 values} and {name: type}, through gguf_dump."""
    table = subprocess.run([tool, path], check=True, capture_output=True, text=True).stdout
    raw = Path(out_dir) / (label + ".raw")
    with open(raw, "wb") as f:
        subprocess.run([tool, "--f32", path], check=True, stdout=f, stderr=subprocess.DEVNULL)
    data = np.fromfile(raw, dtype="<u4")
    values, types, at = {}, {}, 0
    for line in table.splitlines():  # "  NAME  TYPE  [d0, d1] offset ..., bytes"
        m = re.match(r"\s+(\S+)\s+(\S+)\s+\[([0-9, ]+)\]", line)
        if m:
            n = int(np.prod([int(x) for x in m.group(3).split(",")]))
            values[m.group(1)], types[m.group(1)] = data[at:at + n], m.group(2)
            at += n
    assert at == data.size, f"{path}: {at} values in the table, {data.size} dumped"
    raw.unlink()
    return values, types


def main():
    if len(sys.argv) != 2:
        fail("usage: tools/check_gguf_llamacpp_dequant.py MODEL.gguf")
    model = sys.argv[1]
    if not Path(model).is_file():
        fail(f"{model} does not exist")
    with open(model, "rb") as f:
        if f.read(4) != b"GGUF":
            fail(f"{model} is not a GGUF file")
    try:  # imported here, after the checks above, which need neither
        global llama_cpp, np
        import llama_cpp
        import numpy as np
    except ImportError as e:
        fail(f"needs llama-cpp-python and numpy ({e}); bench/run_decode.sh builds an interpreter with them")
    with tempfile.TemporaryDirectory() as tmp:
        tool = str(Path(tmp) / "gguf_dump")
        sources = ["src/core/check.c", "src/io/gguf.c", "src/io/gguf_dequant.c", "tools/gguf_dump.c"]
        subprocess.run(["gcc", "-std=c17", "-O2", "-D_GNU_SOURCE", "-Isrc", *sources, "-o", tool, "-lm"],
                       cwd=REPO, check=True)
        f32 = str(Path(tmp) / "f32.gguf")
        params = llama_cpp.llama_model_quantize_default_params()
        params.ftype, params.nthread, params.allow_requantize = 0, 2, True  # LLAMA_FTYPE_ALL_F32
        if llama_cpp.llama_model_quantize(model.encode(), f32.encode(), params) != 0:
            fail(f"llama.cpp could not read {model}")
        ours, types = dump(tool, model, tmp, "marlhf")
        theirs, _ = dump(tool, f32, tmp, "llamacpp")
    assert ours.keys() == theirs.keys(), "the two files hold other tensors"
    differ = sorted(name for name in ours if not np.array_equal(ours[name], theirs[name]))
    print(json.dumps({"check": "gguf_llamacpp_dequant", "file": Path(model).name, "llama_cpp": llama_cpp.__version__,
                      "tensors": len(ours), "types": dict(Counter(types.values())), "differing": differ}))
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
