#!/usr/bin/env python3
"""Check that the tokenizer files `marlhf convert` writes for a GGUF load in transformers
and encode like the GGUF's own tokenizer.

Usage (developers only):

    .venv-tools/bin/python tools/check_tokenizer_export.py [--gguf models/SmolLM2-135M-Instruct.Q4_1.gguf]
        [--marlhf build/marlhf]

Runs `marlhf convert GGUF TMP`, loads TMP with AutoTokenizer, and over the corpus of
tests/fixtures/tokenizers/corpus.jsonl (each string decoded with errors='replace', the C
tokenizer's policy for invalid UTF-8) compares encode (with and without special tokens),
decode (with and without skip_special_tokens) and the chat template's output against
  1. the reference of tools/make_tokenizer_fixtures.py: transformers' tokenizer built from
     the GGUF, with SmolLM2's own pre-tokenizer (Digits + ByteLevel) -- must be identical;
  2. transformers' plain GGUF loading, which ignores tokenizer.ggml.pre = "smollm" and so
     does not split digits first -- the differing strings are counted and shown.
Exits non-zero if (1) finds any difference.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from make_tokenizer_fixtures import smollm2_reference, text_of  # noqa: E402


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--gguf", default=os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf"))
    parser.add_argument("--marlhf", default=os.path.join(ROOT, "build", "marlhf"))
    args = parser.parse_args()
    from transformers import AutoTokenizer

    corpus = [bytes.fromhex(json.loads(line)["hex"])
              for line in open(os.path.join(ROOT, "tests", "fixtures", "tokenizers", "corpus.jsonl"))]
    texts = [text_of(raw) for raw in corpus]
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "hf")
        subprocess.run([args.marlhf, "convert", args.gguf, out], check=True)
        exported = AutoTokenizer.from_pretrained(out)
        reference = smollm2_reference(args.gguf)
        plain = AutoTokenizer.from_pretrained(os.path.dirname(os.path.abspath(args.gguf)),
                                              gguf_file=os.path.basename(args.gguf))
        print(f"exported tokenizer: {type(exported).__name__}, bos={exported.bos_token!r} eos={exported.eos_token!r} "
              f"pad={exported.pad_token!r} unk={exported.unk_token!r}")
        failures = 0
        for special in (False, True):
            a = [exported.encode(t, add_special_tokens=special) for t in texts]
            b = [reference.encode(t, add_special_tokens=special) for t in texts]
            c = [plain.encode(t, add_special_tokens=special) for t in texts]
            diff_ref = [i for i in range(len(texts)) if a[i] != b[i]]
            diff_plain = [i for i in range(len(texts)) if a[i] != c[i]]
            print(f"add_special_tokens={special}: {len(texts)} strings; differ from the reference: {len(diff_ref)}; "
                  f"from transformers' plain GGUF loading: {len(diff_plain)}")
            for i in diff_plain[:3]:
                print(f"    plain GGUF loading differs on {texts[i]!r}: {a[i]} vs {c[i]}")
            failures += len(diff_ref)
            for skip in (False, True):
                bad = sum(exported.decode(ids, skip_special_tokens=skip) != reference.decode(ids, skip_special_tokens=skip)
                          for ids in b)
                print(f"    decode(skip_special_tokens={skip}): {bad} differ")
                failures += bad
        messages = [{"role": "user", "content": "Hi there"}, {"role": "assistant", "content": "Hello!"}]
        chat_a = exported.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        chat_b = plain.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        print(f"chat template output identical: {chat_a == chat_b}")
        failures += chat_a != chat_b
    print("OK" if failures == 0 else f"FAILED: {failures} differences")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
