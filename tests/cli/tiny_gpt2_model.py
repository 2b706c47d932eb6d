#!/usr/bin/env python3
"""A tiny GPT-2 folder for the CLI tests (Python standard library only): the gpt2 fixture's
weights with its token table grown to a chat tokenizer's vocabulary (row r is row r mod 128,
scaled), and that tokenizer. usage: tiny_gpt2_model.py GPT2_FIXTURE CHAT_FIXTURE OUT_FOLDER"""
import array
import json
import os
import shutil
import struct
import sys

src, chat, out = sys.argv[1:4]
os.makedirs(out, exist_ok=True)
config = json.load(open(f"{src}/config.json"))
vocab = json.load(open(f"{chat}/config.json"))["vocab_size"]
with open(f"{src}/model.safetensors", "rb") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    header = json.loads(f.read(n))
    data = f.read()
tensors = {}
for name, info in header.items():
    if name == "__metadata__":
        continue
    begin, end = info["data_offsets"]
    tensors[name] = (info["shape"], array.array("f", data[begin:end]))
# The token table grown to the chat tokenizer's vocabulary: row r is row r % 128, scaled.
shape, wte = tensors["transformer.wte.weight"]
rows, width = shape
grown = array.array("f", (wte[(r % rows) * width + c] * (1 + (r // rows) * 0.25) for r in range(vocab) for c in range(width)))
tensors["transformer.wte.weight"] = ([vocab, width], grown)
config["vocab_size"] = vocab
new_header, blobs, offset = {}, [], 0
for name in sorted(tensors):
    shape, values = tensors[name]
    blob = values.tobytes()
    new_header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + len(blob)]}
    blobs.append(blob)
    offset += len(blob)
head = json.dumps(new_header).encode()
head += b" " * (-len(head) % 8)
with open(f"{out}/model.safetensors", "wb") as f:
    f.write(struct.pack("<Q", len(head)) + head + b"".join(blobs))
json.dump(config, open(f"{out}/config.json", "w"), indent=2)
for name in ("tokenizer.json", "tokenizer_config.json"):
    shutil.copy(f"{chat}/{name}", f"{out}/{name}")
