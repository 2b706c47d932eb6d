#!/usr/bin/env python3
"""Write the reference embeddings `marlhf serve`'s /v1/embeddings is tested against.

Usage (developers only; CI never runs Python, the output is committed):

    .venv-tools/bin/python tools/make_embedding_fixtures.py [--gguf models/SmolLM2-135M-Instruct.Q4_1.gguf]

For each model -- the tiny Llama of tests/fixtures/models/tiny_chat (its own byte-level
tokenizer), and SmolLM2-135M-Instruct from the Q4_1 GGUF that scripts/fetch-model
downloads (transformers dequantizes it to float32, as marlhf does) when that file is
there -- and each text below:

  ids     tokenizer(text)["input_ids"]: add_special_tokens=True, as marlhf tokenizes an
          embedding input (and as sentence-transformers does)
  mean    the final hidden states averaged over the tokens, then L2-normalised
  last    the last token's final hidden state, L2-normalised
  cls     the first token's final hidden state, L2-normalised
  none    (tiny model only) every token's final hidden state, not normalised: what
          `serve --pooling none` answers on POST /embeddings (llama.cpp returns them so)

"Final hidden state" is model(..., output_hidden_states=True).hidden_states[-1] of the
causal-LM model, which for Llama is the output of the final RMSNorm (the LM head's
input): the script checks that against the norm applied by hand to the last decoder
layer's output, and against the base model's last_hidden_state. The pooling is
sentence-transformers' (mean: sum(h * mask) / sum(mask)) and the normalisation
torch.nn.functional.normalize(p=2), written out here so no extra package is needed.

Numerics: the tiny model is run in float64 (tools/make_model_fixtures.py's
float64_everywhere, so that RMSNorm's internal float32 casts do not round), SmolLM2 in
float32 (its GGUF loads as float32; float64 would not change what it is compared
against by much). The script prints how far a plain float32 run of the tiny model is
from its float64 reference: a guide for the tests' tolerance.

Output: tests/fixtures/embeddings/<name>.json, {"model", "hidden_size", "context",
"inputs": [{"text", "ids", "mean", "last", "cls"[, "none"]}, ...]}.
"""
import argparse
import json
import os
import sys

import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM, AutoTokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools"))
from make_model_fixtures import float64_everywhere  # noqa: E402

TEXTS = [
    "The cat sat on the mat.",
    "Tell me about the dog.",
    "Embeddings pool a model's final hidden states over the tokens of a text, so that texts "
    "that mean similar things end up close together; this one is longer than the others.",
    "Café, naïve, 東京 and an emoji 🙂 in one line.",
    "A",
]


def final_hidden_states(model, ids):
    """hidden_states[-1] for one unpadded row, checked to be the final norm's output."""
    captured = {}
    last_layer = model.model.layers[-1]
    hook = last_layer.register_forward_hook(
        lambda module, args, output: captured.__setitem__("pre_norm", output[0] if isinstance(output, tuple) else output))
    try:
        out = model(torch.tensor([ids]), output_hidden_states=True)
    finally:
        hook.remove()
    hidden = out.hidden_states[-1][0]
    by_hand = model.model.norm(captured["pre_norm"])[0]
    if not torch.equal(hidden, by_hand):
        raise SystemExit(f"hidden_states[-1] is not the final norm's output (differs by {(hidden - by_hand).abs().max()})")
    base = model.model(torch.tensor([ids])).last_hidden_state[0]
    if not torch.equal(hidden, base):
        raise SystemExit("hidden_states[-1] is not the base model's last_hidden_state")
    return hidden


def pooled(hidden):
    mask = torch.ones(hidden.shape[0], 1, dtype=hidden.dtype)
    return {
        "mean": F.normalize((hidden * mask).sum(0) / mask.sum(), p=2, dim=0),
        "last": F.normalize(hidden[-1], p=2, dim=0),
        "cls": F.normalize(hidden[0], p=2, dim=0),
    }


def rounded(vector):
    """float32's precision (9 significant digits) is all a float32 engine can be compared at."""
    return [float(f"{x:.9g}") for x in vector.tolist()]


def write(path, model_label, hidden_size, context, rows):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        json.dump({"model": model_label, "hidden_size": hidden_size, "context": context, "inputs": rows}, f,
                  ensure_ascii=False)
        f.write("\n")
    print("wrote", os.path.relpath(path, ROOT), f"({len(rows)} inputs)")


def tiny_chat(out_dir):
    folder = os.path.join(ROOT, "tests/fixtures/models/tiny_chat")
    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="eager").eval()
    model64 = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="eager").eval()
    model64.double()
    rows, worst32, worst_none = [], 0.0, 0.0
    with torch.no_grad():
        for text in TEXTS:
            ids = tok(text)["input_ids"]
            with float64_everywhere():
                hidden = final_hidden_states(model64, ids)
            reference = pooled(hidden)
            plain32 = final_hidden_states(model, ids)
            plain = pooled(plain32)
            worst32 = max(worst32, max((plain[k].double() - reference[k]).abs().max().item() for k in reference))
            worst_none = max(worst_none, (plain32.double() - hidden).abs().max().item())
            rows.append({"text": text, "ids": ids, **{k: rounded(v) for k, v in reference.items()},
                         "none": [rounded(h) for h in hidden]})
            print(f"tiny_chat {len(ids):3d} tokens  {text[:40]!r}")
    print(f"tiny_chat: transformers in float32 is {worst32:.2e} (largest component) from the float64 reference")
    print(f"tiny_chat: its per-token states (pooling none) are {worst_none:.2e} from the float64 reference")
    cfg = model.config
    write(os.path.join(out_dir, "tiny_chat.json"), "tests/fixtures/models/tiny_chat", cfg.hidden_size,
          cfg.max_position_embeddings, rows)


def smollm2(gguf, out_dir):
    folder, name = os.path.split(os.path.abspath(gguf))
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32,
                                                 attn_implementation="eager").eval()
    rows = []
    with torch.no_grad():
        for text in TEXTS:
            ids = tok(text)["input_ids"]
            rows.append({"text": text, "ids": ids, **{k: rounded(v) for k, v in pooled(final_hidden_states(model, ids)).items()}})
            print(f"smollm2 {len(ids):3d} tokens  {text[:40]!r}")
    cfg = model.config
    write(os.path.join(out_dir, "smollm2.json"), os.path.relpath(os.path.abspath(gguf), ROOT), cfg.hidden_size,
          cfg.max_position_embeddings, rows)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gguf", default=os.path.join(ROOT, "models/SmolLM2-135M-Instruct.Q4_1.gguf"),
                    help="SmolLM2's GGUF (skipped when absent)")
    ap.add_argument("--out", default=os.path.join(ROOT, "tests/fixtures/embeddings"))
    args = ap.parse_args()
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)  # reproducible reductions
    tiny_chat(args.out)
    if os.path.exists(args.gguf):
        smollm2(args.gguf, args.out)
    else:
        print("no", args.gguf, "- the SmolLM2 fixture is left as it is")
    return 0


if __name__ == "__main__":
    sys.exit(main())
