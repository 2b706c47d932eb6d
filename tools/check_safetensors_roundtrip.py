#!/usr/bin/env python3
"""Developer check: files written by marlhf's C writers load in Python unchanged.

    make test        # or run build/tests/test_safetensors and test_config_hf directly
    .venv-tools/bin/python tools/check_safetensors_roundtrip.py [PATH ...]

With no PATH it checks what the C tests leave in $MARLHF_TEST_TMP (default /tmp; under
`make test` that is tests/tmp/build):

  test_safetensors/st_roundtrip.safetensors
      loaded with safetensors (numpy and torch): the metadata, tensor order, dtypes,
      shapes and values, bit for bit, must be those that tests/test_safetensors.c
      wrote (recomputed here from the same definitions).
  test_config_hf/hf_tiny_*/
      config.json (config_write_hf_json) + model.safetensors (safetensors_write):
      loaded by transformers with the class named in "architectures"; there must be
      no missing, unexpected or mismatched weights, every tensor in the model must
      equal the file's bit for bit, the config must say what the file says, and a
      forward pass must give finite outputs of the right shape.

A PATH may be a .safetensors file (checked as st_roundtrip if its metadata says so,
else just loaded) or a model folder. Exits non-zero on any failure.
"""
import glob
import json
import logging
import os
import sys

import numpy as np

ROUNDTRIP_PRODUCER = "marlhf test_safetensors roundtrip"


def fail(message):
    raise AssertionError(message)


def expect(condition, message):
    if not condition:
        fail(message)


def same_bits(a, b):
    a, b = np.ascontiguousarray(a), np.ascontiguousarray(b)
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def expected_roundtrip():
    """The tensors tests/test_safetensors.c (test_write_read_roundtrip) writes."""
    special_bits = np.array([0x80000000, 0x00000001, 0x7F800000, 0xFF800000, 0x7FC00123, 0x7F7FFFFF], dtype=np.uint32)
    return {
        "weights": ((np.arange(15) - 7) / 4.0).astype(np.float32).reshape(3, 5),
        "specials": special_bits.view(np.float32),
        "token_ids": np.array([0, 1, -1, 2**63 - 1, -2**63, 50256], dtype=np.int64).reshape(2, 3),
        "step": np.array(42, dtype=np.int32),
        "empty": np.zeros((0,), dtype=np.float32),
    }


def check_roundtrip_file(path):
    import torch
    from safetensors import safe_open
    from safetensors.torch import load_file

    expected = expected_roundtrip()
    with safe_open(path, framework="np") as f:
        metadata = f.metadata()
        expect(metadata == {"format": "pt", "producer": ROUNDTRIP_PRODUCER, "note": "\u00fcnicode \u2713"},
               f"metadata {metadata}")
        expect(list(f.keys()) == sorted(expected), f"keys {list(f.keys())}")
        for name, want in expected.items():
            got = f.get_tensor(name)
            expect(same_bits(got, want), f"{name}: numpy got {got!r}, expected {want!r}")
    # torch, as transformers loads it; NaN payloads compared through integer views.
    tensors = load_file(path)
    for name, want in expected.items():
        got = tensors[name].numpy()
        expect(same_bits(got, want), f"{name}: torch got {got!r}")
    expect(tensors["specials"].dtype == torch.float32 and tensors["token_ids"].dtype == torch.int64, "torch dtypes")
    # Header layout the format asks for: 8-byte aligned, padded with spaces.
    with open(path, "rb") as f:
        raw = f.read()
    n = int.from_bytes(raw[:8], "little")
    header = raw[8:8 + n]
    expect(n % 8 == 0 and header.startswith(b"{") and header.rstrip(b" ").endswith(b"}"), "header layout")
    json.loads(header)
    return f"{len(expected)} tensors bit-exact in safetensors (numpy, torch), metadata intact"


def check_plain_file(path):
    from safetensors.torch import load_file

    tensors = load_file(path)
    return f"{len(tensors)} tensors load"


def check_model_folder(folder):
    import torch
    import transformers
    from safetensors.numpy import load_file

    with open(os.path.join(folder, "config.json")) as f:
        written = json.load(f)
    architecture = written["architectures"][0]
    model_class = getattr(transformers, architecture)

    warnings = []
    handler = logging.Handler()
    handler.emit = lambda record: warnings.append(record.getMessage())
    logger = logging.getLogger("transformers")
    logger.addHandler(handler)
    try:
        model, info = model_class.from_pretrained(folder, output_loading_info=True)
    finally:
        logger.removeHandler(handler)
    for kind in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs"):
        expect(not info.get(kind), f"{kind}: {info.get(kind)}")

    config = model.config
    expect(config.model_type == written["model_type"], "model_type")
    expect(model.dtype == torch.float32, f"model dtype {model.dtype}")
    hidden = written.get("hidden_size", written.get("n_embd"))
    expect(config.hidden_size == hidden, "hidden_size")
    expect(config.num_hidden_layers == written.get("num_hidden_layers", written.get("n_layer")), "layers")
    expect(config.vocab_size == written["vocab_size"], "vocab_size")
    expect(bool(config.tie_word_embeddings) == written["tie_word_embeddings"], "tie_word_embeddings")
    if "rope_theta" in written:
        expect(config.rope_parameters["rope_type"] == "default", "rope_type")
        expect(config.rope_parameters["rope_theta"] == written["rope_theta"], "rope_theta")
        expect(config.num_key_value_heads == written["num_key_value_heads"], "num_key_value_heads")
        expect(model.model.layers[0].self_attn.head_dim == written["head_dim"], "head_dim")
        expect(config.rms_norm_eps == written["rms_norm_eps"], "rms_norm_eps")
    else:
        expect(config.n_inner == written["n_inner"] and config.layer_norm_epsilon == written["layer_norm_epsilon"],
               "gpt2 sizes")
    if architecture.endswith("ForSequenceClassification"):
        expect(config.num_labels == 1, f"num_labels {config.num_labels}")

    state = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    tensors = load_file(os.path.join(folder, "model.safetensors"))
    for name, value in tensors.items():
        expect(name in state, f"{name} not in the model")
        expect(same_bits(state[name], value), f"{name} differs after loading")
    if written["tie_word_embeddings"] and not architecture.endswith("ForSequenceClassification"):
        embed = "transformer.wte.weight" if written["model_type"] == "gpt2" else "model.embed_tokens.weight"
        expect(same_bits(state["lm_head.weight"], tensors[embed]), "lm_head is not tied to the embedding")

    ids = torch.arange(6).reshape(1, 6) % written["vocab_size"]
    with torch.no_grad():
        out = model(input_ids=ids).logits
    width = 1 if architecture.endswith("ForSequenceClassification") else written["vocab_size"]
    expect(out.shape[-1] == width and torch.isfinite(out).all(), f"forward: shape {tuple(out.shape)}")
    note = f"; transformers warned: {warnings}" if warnings else ""
    return f"{architecture}: {len(tensors)} tensors bit-exact, config as written, forward finite{note}"


def check(path):
    if os.path.isdir(path):
        return check_model_folder(path)
    from safetensors import safe_open

    with safe_open(path, framework="np") as f:
        producer = (f.metadata() or {}).get("producer")
    return check_roundtrip_file(path) if producer == ROUNDTRIP_PRODUCER else check_plain_file(path)


def main():
    paths = sys.argv[1:]
    if not paths:
        base = os.environ.get("MARLHF_TEST_TMP") or "/tmp"
        paths = [os.path.join(base, "test_safetensors", "st_roundtrip.safetensors")]
        paths += sorted(glob.glob(os.path.join(base, "test_config_hf", "hf_tiny_*")))
    failures = 0
    for path in paths:
        try:
            print(f"PASS {path}: {check(path)}")
        except Exception as error:  # report every path, then fail
            failures += 1
            print(f"FAIL {path}: {type(error).__name__}: {error}")
    print(f"{len(paths) - failures} passed, {failures} failed")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
