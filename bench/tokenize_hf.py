#!/usr/bin/env python3
"""The peer of bench/tokenize.c: Hugging Face tokenizers encoding the same corpus with
SmolLM2's tokenizer (transformers builds it from the GGUF), on one thread.

    .venv-tools/bin/python bench/tokenize_hf.py [REPEATS]
"""
import json
import os
import sys
import time

os.environ["RAYON_NUM_THREADS"] = "1"  # before tokenizers starts its thread pool
from transformers import AutoTokenizer  # noqa: E402

repeats = int(sys.argv[1]) if len(sys.argv) > 1 else 5
tok = AutoTokenizer.from_pretrained("models", gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf").backend_tokenizer
texts = [bytes.fromhex(json.loads(line)["hex"]).decode("utf-8", "replace")
         for line in open("tests/fixtures/tokenizers/corpus.jsonl")]
start = time.perf_counter()
n = sum(len(tok.encode(s, add_special_tokens=False).ids) for _ in range(repeats) for s in texts)
print(f"HF tokenizers, one string at a time: {n / (time.perf_counter() - start):.0f} tokens/s")
start = time.perf_counter()
n = sum(len(e.ids) for _ in range(repeats) for e in tok.encode_batch(texts, add_special_tokens=False))
print(f"HF tokenizers, encode_batch (one thread): {n / (time.perf_counter() - start):.0f} tokens/s")
