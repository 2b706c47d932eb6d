#!/usr/bin/env python3
"""Writes the float32 model that marlhf's --quantize q8_0 | q4_0 computes with.

    python3 tools/dequantize_model.py IN_FOLDER OUT_FOLDER q8_0|q4_0

IN_FOLDER is a Hugging Face Llama-family folder (config.json, model.safetensors in float32,
tokenizer files); OUT_FOLDER gets the same files with every tensor marlhf quantizes
replaced by its quantized-then-dequantized values: the linear layers' weights
(q/k/v/o/gate/up/down_proj) in the asked type, the token table and an untied LM head in
Q8_0 (marlhf keeps them in Q8_0 under q4_0 too, model/quantize.c). Norms, biases and a
value head are copied unchanged.

The rounding is marlhf's (ops/q8.c, ops/q4.c), not GGUF's: Q8_0 keeps a float32 scale
max|x| / 127 and rounds x / scale to nearest, ties to even; Q4_0 takes the block's value of
largest magnitude m, d = m / -8, codes trunc(x * (1 / d) + 8.5) clamped to 15, and keeps d as
a half float. Each float32 operation is done in double and rounded to float32, which gives
the float32 result exactly (+, -, *, / of float32 operands).

A training run on OUT_FOLDER is the float32 reference for a QLoRA run on IN_FOLDER: marlhf's
adapters record the base's fingerprint (FNV-1a of the dequantized values), so the two runs'
adapter_config.json carry the same "marlhf_base_fingerprint" exactly when this file
reproduces marlhf's quantization (tests/cli/qlora.sh). Standard library only.
"""
import json
import math
import os
import re
import shutil
import struct
import sys

BLOCK = 32
LINEAR = re.compile(r"model\.layers\.\d+\.(self_attn\.(q|k|v|o)_proj|mlp\.(gate|up|down)_proj)\.weight")
TABLES = ("model.embed_tokens.weight", "lm_head.weight")


def f32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


def f16(x):
    return struct.unpack("<e", struct.pack("<e", x))[0]


def q8_block(x):
    largest = max(abs(v) for v in x)
    scale = f32(largest / 127.0)
    inverse = f32(1.0 / scale) if scale > 0 else 0.0
    # Python's round() on a float is to nearest, ties to even (rintf's default mode).
    return [f32(round(f32(v * inverse)) * scale) for v in x]


def q4_block(x):
    extreme = 0.0
    for v in x:
        if abs(v) > abs(extreme):
            extreme = v
    d = f32(extreme / -8.0)
    inverse = f32(1.0 / d) if d != 0 else 0.0
    scale = f16(d)
    out = []
    for v in x:
        code = min(int(f32(f32(v * inverse) + 8.5)), 15)
        out.append(f32((code - 8) * scale))
    return out


def read_safetensors(path):
    with open(path, "rb") as f:
        size = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(size))
        data = f.read()
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if info["dtype"] != "F32":
            sys.exit(f"{path}: tensor {name} is {info['dtype']}, this tool reads float32 only")
        start, end = info["data_offsets"]
        tensors[name] = (info["shape"], list(struct.unpack(f"<{(end - start) // 4}f", data[start:end])))
    return tensors, header.get("__metadata__")


def write_safetensors(path, tensors, metadata):
    header, offset, blobs = {}, 0, []
    for name in sorted(tensors):
        shape, values = tensors[name]
        blob = struct.pack(f"<{len(values)}f", *values)
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + len(blob)]}
        offset += len(blob)
        blobs.append(blob)
    if metadata:
        header["__metadata__"] = metadata
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def main():
    if len(sys.argv) != 4 or sys.argv[3] not in ("q8_0", "q4_0"):
        sys.exit(__doc__.split("\n\n")[1])
    source, target, kind = sys.argv[1:]
    tensors, metadata = read_safetensors(os.path.join(source, "model.safetensors"))
    if any(".c_attn." in name for name in tensors):
        sys.exit(f"{source}: GPT-2 layouts are not handled (Llama-family names only)")
    done = 0
    for name, (shape, values) in tensors.items():
        linear = LINEAR.fullmatch(name) is not None
        if not linear and name not in TABLES:
            continue
        if len(shape) != 2 or shape[1] % BLOCK:
            sys.exit(f"{source}: {name} has shape {shape}: rows must be multiples of {BLOCK} values")
        block = q4_block if linear and kind == "q4_0" else q8_block
        out = []
        for start in range(0, len(values), BLOCK):
            out.extend(block(values[start:start + BLOCK]))
        assert all(math.isfinite(v) for v in out)
        tensors[name] = (shape, out)
        done += 1
    if not done:
        sys.exit(f"{source}: no tensor that marlhf quantizes")
    os.makedirs(target, exist_ok=True)
    for entry in os.listdir(source):
        path = os.path.join(source, entry)
        if entry != "model.safetensors" and os.path.isfile(path):
            shutil.copyfile(path, os.path.join(target, entry))
    write_safetensors(os.path.join(target, "model.safetensors"), tensors, metadata)
    print(f"wrote {target}: {done} tensors as {kind} dequantized", file=sys.stderr)


if __name__ == "__main__":
    main()
