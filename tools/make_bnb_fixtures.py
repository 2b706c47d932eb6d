#!/usr/bin/env python3
"""Checkpoints saved by transformers after loading with bitsandbytes, for tests/test_bnb.c and
tests/cli/bnb.sh (marlhf loading a "-bnb-4bit" / LLM.int8 folder with --model).

    .venv-tools/bin/python tools/make_bnb_fixtures.py

Each folder under tests/fixtures/bnb/ is what `AutoModelForCausalLM.from_pretrained(src,
quantization_config=BitsAndBytesConfig(...), dtype=torch.bfloat16, device_map="cpu")` followed
by `save_pretrained` writes with bitsandbytes' CPU backend (config.json with its
quantization_config, model.safetensors with the packed codes and quant states), from a tiny
random Llama (hidden 64, so that bitsandbytes' flat blocks of 64 are whole rows):
  - nf4:  2 layers, tied head, vocab 264, NF4 with double quantization (QLoRA's recipe), with a
          small byte-level BPE tokenizer (tests/fixtures/models/tiny_chat's, cut to its first
          264 tokens: the 4 special tokens, the 256 bytes and the first 4 merges), so that the
          commands run on it (tests/cli/bnb.sh);
  - fp4:  1 layer, untied head, vocab 64, FP4 without double quantization (no tokenizer);
  - int8: 1 layer, untied head, vocab 64, LLM.int8 (load_in_8bit) (no tokenizer).
The non-quantized tensors (embeddings, norms, head) are bfloat16, as such checkpoints usually are.
Each folder's reference.json holds, for the token ids it lists:
  - "logits": transformers' LlamaForCausalLM in float32 holding the checkpoint's values: each
    quantized weight as bitsandbytes dequantizes it in float32 (dequantize_4bit; int8:
    int8_vectorwise_dequant, weight * SCB * (1/127)), the bfloat16 tensors widened exactly;
  - "bnb_forward_logits": transformers' own forward of the quantized model (Linear4bit /
    Linear8bitLt on the CPU), which rounds more (bfloat16 dequantized weights and, on a CPU with
    AVX512-BF16, a bfloat16 kernel; LLM.int8 quantizes the activations too): for the docs;
  - for model.layers.0.self_attn.k_proj.weight, the FNV-1a hash (core/hash.h's hash_floats:
    64-bit words of two float32 values) and the first 16 values of bitsandbytes' dequantization.
"""
import copy
import json
import os
import shutil
import tempfile
import warnings
from pathlib import Path

import numpy as np
import torch

warnings.filterwarnings("ignore")
import transformers  # noqa: E402
from transformers import AutoModelForCausalLM, BitsAndBytesConfig  # noqa: E402
import bitsandbytes.functional as F  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "fixtures" / "bnb"
TINY_CHAT = ROOT / "tests" / "fixtures" / "models" / "tiny_chat"
SMALL_VOCAB = 264
MATRIX = "model.layers.0.self_attn.k_proj"


def floats(t):
    """float32 values as one hex string, 8 digits (the IEEE bits) each: exact."""
    return np.ascontiguousarray(t.detach().float().numpy().reshape(-1)).astype(">f4").tobytes().hex()


def fnv1a(t):
    """core/hash.h's hash_floats: FNV-1a 64 over the float32 values two at a time (one
    little-endian 64-bit word each; the count here is even)."""
    words = np.ascontiguousarray(t.detach().float().numpy().reshape(-1)).astype("<f4").view("<u8")
    h = 0xcbf29ce484222325
    for w in words.tolist():
        h = ((h ^ w) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return "%016x" % h


def small_tokenizer(out):
    """tiny_chat's byte-level BPE cut to its first SMALL_VOCAB ids (specials, bytes, first merges)."""
    t = json.loads((TINY_CHAT / "tokenizer.json").read_text())
    vocab = {k: v for k, v in t["model"]["vocab"].items() if v < SMALL_VOCAB}
    merges = []
    for m in t["model"]["merges"]:
        a, b = m.split(" ") if isinstance(m, str) else m
        if a in vocab and b in vocab and a + b in vocab:
            merges.append(m)
    t["model"]["vocab"] = vocab
    t["model"]["merges"] = merges
    t["added_tokens"] = [a for a in t["added_tokens"] if a["id"] < SMALL_VOCAB]
    (out / "tokenizer.json").write_text(json.dumps(t, ensure_ascii=False, separators=(",", ":")))
    shutil.copy(TINY_CHAT / "tokenizer_config.json", out / "tokenizer_config.json")


def tiny_llama(path, vocab, layers, tied, seed):
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(vocab_size=vocab, hidden_size=64, intermediate_size=128,
                                      num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                                      max_position_embeddings=64, rms_norm_eps=1e-5, rope_theta=10000.0,
                                      tie_word_embeddings=tied, bos_token_id=None, eos_token_id=None,
                                      pad_token_id=None)
    model = transformers.LlamaForCausalLM(config)
    with torch.no_grad():  # norms away from 1, so that a norm read wrongly shows
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
    model.save_pretrained(path, safe_serialization=True)


def dequantized(module):
    """bitsandbytes' float32 dequantization of a quantized Linear's weight, or None."""
    weight = getattr(module, "weight", None)
    if getattr(weight, "SCB", None) is not None:
        return F.int8_vectorwise_dequant(weight.data, weight.SCB)
    state = getattr(weight, "quant_state", None) or getattr(module, "quant_state", None)
    if state is None or weight.dtype != torch.uint8:
        return None
    state = copy.copy(state)
    state.dtype = torch.float32  # the checkpoint's is bfloat16: its values would be rounded to it
    return F.dequantize_4bit(weight.data, state)


def float_model(saved):
    """A float32 Llama holding the checkpoint's values: bitsandbytes' float32 dequantization of each
    quantized weight, the bfloat16 tensors widened (exactly). What marlhf computes; transformers'
    own forward of the quantized model rounds more (LLM.int8 quantizes the activations too; on a CPU
    with AVX512-BF16 Linear4bit repacks its weights for a bfloat16 kernel, and it dequantizes to
    the quant_state's dtype, bfloat16 here)."""
    plain = transformers.LlamaForCausalLM(saved.config).float()
    state = plain.state_dict()
    with torch.no_grad():
        for mname, module in saved.named_modules():
            values = dequantized(module)
            if values is not None:
                state[mname + ".weight"].copy_(values.reshape(state[mname + ".weight"].shape))
        for pname, p in saved.named_parameters():
            if pname in state and p.dtype not in (torch.int8, torch.uint8):
                state[pname].copy_(p.data.float())
    return plain


def logits_of(model, ids):
    with torch.no_grad():
        return floats(model(torch.tensor([ids])).logits[0])


def make(name, src, qconfig, ids, tokenizer=False):
    out = OUT / name
    shutil.rmtree(out, ignore_errors=True)
    model = AutoModelForCausalLM.from_pretrained(src, quantization_config=qconfig, dtype=torch.bfloat16,
                                                 device_map="cpu")
    model.save_pretrained(out, safe_serialization=True)
    if (out / "generation_config.json").exists():
        os.remove(out / "generation_config.json")
    if tokenizer:
        small_tokenizer(out)
    saved = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32, device_map="cpu")
    plain = float_model(saved)  # before any forward: LLM.int8's first one moves SCB off the weight
    dq = dequantized(saved.get_submodule(MATRIX))
    ref = {"source": "transformers %s, bitsandbytes %s (CPU), tools/make_bnb_fixtures.py" %
                     (transformers.__version__, __import__("bitsandbytes").__version__),
           "float_encoding": "float32 arrays are hex strings, 8 digits a value: the IEEE bits, most significant first",
           "ids": ids, "matrix": MATRIX + ".weight", "matrix_fnv1a": fnv1a(dq),
           "matrix_first_values": floats(dq.reshape(-1)[:16]),
           "logits": logits_of(plain, ids), "bnb_forward_logits": logits_of(saved, ids)}
    (out / "reference.json").write_text(json.dumps(ref, separators=(",", ":")) + "\n")
    size = sum(f.stat().st_size for f in out.iterdir())
    print(f"wrote {out} ({size} bytes)")


def main():
    OUT.mkdir(parents=True, exist_ok=True)
    f32 = torch.float32
    ids = [1, 5, 9, 14, 2, 7]
    with tempfile.TemporaryDirectory() as tmp:
        tied, untied = Path(tmp) / "tied", Path(tmp) / "untied"
        tiny_llama(tied, SMALL_VOCAB, 2, True, 7)
        tiny_llama(untied, 64, 1, False, 8)
        make("nf4", tied, BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                                             bnb_4bit_use_double_quant=True, bnb_4bit_compute_dtype=f32), ids,
             tokenizer=True)
        make("fp4", untied, BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="fp4",
                                               bnb_4bit_use_double_quant=False, bnb_4bit_compute_dtype=f32), ids)
        make("int8", untied, BitsAndBytesConfig(load_in_8bit=True), ids)


if __name__ == "__main__":
    main()
