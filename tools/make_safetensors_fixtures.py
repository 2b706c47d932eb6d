#!/usr/bin/env python3
"""Writes the fixtures of tests/test_safetensors.c and tests/test_config_hf.c.

Run from the repository root with the tools environment:

    .venv-tools/bin/python tools/make_safetensors_fixtures.py

Everything is deterministic (no random numbers), so rerunning it reproduces the same
files as long as the installed safetensors/transformers versions are the same
(config.json records "transformers_version"). Output, all under
tests/fixtures/safetensors/ (a few tens of KB in total):

  dtypes.safetensors           one tensor per dtype (F32 F16 BF16 F64 I64 I32 I16 I8
                               U8 BOOL) holding edge values: +-0, subnormals, the
                               largest finite, +-inf, quiet and signalling NaNs with
                               payloads, F64 values that round or overflow in F32,
                               integer extremes; plus a scalar and an empty tensor.
                               Metadata {"format": "pt", "fixture": "dtypes"}.
  dtypes_expected.safetensors  the same names holding what a reader must produce:
                               F32 for the float tensors, I64 for the integer ones.
                               F16 and F64 values are numpy's astype(float32), which
                               keeps NaN payloads bit for bit (torch's conversion may
                               quiet signalling NaNs); BF16 is the exact 16-bit shift.
  sharded/                     model.safetensors.index.json + two shards, laid out
                               like transformers' sharded checkpoints. Tensor k of
                               SHARDED_TENSORS holds element i = (i % 17) * 0.25 - 2 + k
                               (exact in F32 and BF16); the C test recomputes this.
  configs/<name>/config.json   written by transformers' own config classes with
                               save_pretrained(), so the C reader sees exactly what
                               transformers writes. The sizes are listed in CONFIGS
                               and repeated as expectations in tests/test_config_hf.c.
"""
import json
import os
import shutil
import sys

import numpy as np
import torch
from safetensors.torch import save_file

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "safetensors")


def bits16(values):
    return np.array(values, dtype=np.uint16)


def dtype_tensors():
    """Returns (tensors to save, expected reader output)."""
    tensors, expected = {}, {}

    f32 = np.array([0.0, -0.0, 1.0, -1.5, np.inf, -np.inf, np.nan, 1.4e-45,  # smallest subnormal
                    -1.17549435e-38, 3.4028235e38, 1e-40, 3.14159265, 65504.0, -7.25, 2.0 ** -126, 0.1],
                   dtype=np.float32).reshape(2, 8)
    tensors["f32"] = torch.from_numpy(f32.copy())
    expected["f32"] = f32

    f16_bits = bits16([0x0000, 0x8000, 0x3C00, 0xC000,  # 0, -0, 1, -2
                       0x7C00, 0xFC00,                  # +-inf
                       0x7E00, 0x7E01, 0x7C01, 0xFE55,  # quiet NaN, NaN payloads, signalling NaN
                       0x0001, 0x8001, 0x03FF,          # subnormals: smallest, negative, largest
                       0x0400, 0x7BFF, 0x3555])         # smallest normal, largest finite, ~1/3
    tensors["f16"] = torch.from_numpy(f16_bits.view(np.float16).copy())
    expected["f16"] = f16_bits.view(np.float16).astype(np.float32)

    bf16_bits = bits16([0x0000, 0x8000, 0x3F80, 0xC0C0,  # 0, -0, 1, -6
                        0x7F80, 0xFF80, 0x7FC0, 0x7F81,  # +-inf, quiet NaN, signalling NaN
                        0xFFC1, 0x0001, 0x807F, 0x0080,  # -NaN payload, subnormals, smallest normal
                        0x7F7F, 0x4049, 0x3DCD, 0xBEAB]).reshape(4, 4)  # largest, ~pi, ~0.1, ~-1/3
    tensors["bf16"] = torch.from_numpy(bf16_bits.view(np.int16).copy()).view(torch.bfloat16)
    expected["bf16"] = (bf16_bits.astype(np.uint32) << 16).view(np.float32)

    f64 = np.array([0.0, -0.0, 1.0, 0.1, np.inf, -np.inf, np.nan,
                    1e-45,            # rounds to the smallest F32 subnormal
                    1e-50,            # underflows to 0
                    1e39,             # overflows to inf
                    1.0 + 2.0 ** -24,  # a tie: rounds to even (1.0)
                    1.0 + 3 * 2.0 ** -24, -3.4028235677973366e38, 123456789.123], dtype=np.float64)
    tensors["f64"] = torch.from_numpy(f64.copy())
    with np.errstate(over="ignore"):
        expected["f64"] = f64.astype(np.float32)

    ints = {
        "i64": (np.array([-2**63, 2**63 - 1, -1, 0, 1, 50256], dtype=np.int64), None),
        "i32": (np.array([-2**31, 2**31 - 1, -1, 0, 7, 100000], dtype=np.int32), (2, 3)),
        "i16": (np.array([-32768, 32767, -1, 5], dtype=np.int16), None),
        "i8": (np.array([-128, 127, -1, 0], dtype=np.int8), None),
        "u8": (np.array([0, 1, 200, 255], dtype=np.uint8), None),
        "bool": (np.array([True, False, True], dtype=np.bool_), None),
    }
    for name, (values, shape) in ints.items():
        if shape:
            values = values.reshape(shape)
        tensors[name] = torch.from_numpy(values.copy())
        expected[name] = values.astype(np.int64)

    tensors["scalar"] = torch.tensor(2.5, dtype=torch.float32)
    expected["scalar"] = np.array(2.5, dtype=np.float32)
    tensors["empty"] = torch.zeros((0, 4), dtype=torch.float32)
    expected["empty"] = np.zeros((0, 4), dtype=np.float32)
    return tensors, expected


# name, shape, dtype, shard (1 or 2)
SHARDED_TENSORS = [
    ("model.embed_tokens.weight", (8, 4), torch.float32, 1),
    ("model.layers.0.input_layernorm.weight", (4,), torch.float32, 1),
    ("model.layers.0.self_attn.q_proj.weight", (4, 4), torch.float32, 1),
    ("model.layers.0.mlp.up_proj.weight", (6, 4), torch.bfloat16, 2),
    ("model.norm.weight", (4,), torch.float32, 2),
    ("lm_head.weight", (8, 4), torch.float16, 2),
]


def write_sharded(folder):
    os.makedirs(folder)
    shards = {1: {}, 2: {}}
    for k, (name, shape, dtype, shard) in enumerate(SHARDED_TENSORS):
        count = int(np.prod(shape))
        values = (np.arange(count) % 17) * 0.25 - 2 + k
        shards[shard][name] = torch.tensor(values, dtype=torch.float32).reshape(shape).to(dtype)
    weight_map, total = {}, 0
    for shard, tensors in shards.items():
        file_name = f"model-{shard:05d}-of-00002.safetensors"
        save_file(tensors, os.path.join(folder, file_name), metadata={"format": "pt"})
        for name, tensor in tensors.items():
            weight_map[name] = file_name
            total += tensor.numel() * tensor.element_size()
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    with open(os.path.join(folder, "model.safetensors.index.json"), "w") as f:
        json.dump(index, f, indent=2, sort_keys=True)
        f.write("\n")


def configs():
    from transformers import GemmaConfig, GPT2Config, LlamaConfig, MistralConfig, Qwen2Config

    small_llama = dict(vocab_size=128, hidden_size=64, intermediate_size=160, num_hidden_layers=3,
                       num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=256)
    return {
        "gpt2": GPT2Config(vocab_size=96, n_positions=64, n_embd=32, n_layer=2, n_head=4,
                           bos_token_id=0, eos_token_id=1),
        "gpt2_untied": GPT2Config(vocab_size=96, n_positions=64, n_embd=32, n_layer=2, n_head=4, n_inner=80,
                                  layer_norm_epsilon=1e-6, activation_function="gelu_pytorch_tanh",
                                  tie_word_embeddings=False, bos_token_id=5, eos_token_id=6, pad_token_id=7),
        "gpt2_erf_gelu": GPT2Config(vocab_size=96, n_positions=64, n_embd=32, n_layer=2, n_head=4, bos_token_id=0, eos_token_id=0,
                                    activation_function="gelu"),
        "llama": LlamaConfig(**small_llama, rms_norm_eps=1e-5,
                             rope_parameters={"rope_type": "default", "rope_theta": 50000.0},
                             tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, pad_token_id=0),
        "llama_bias": LlamaConfig(**small_llama, attention_bias=True, bos_token_id=1, eos_token_id=[2, 3]),
        "llama_rope_scaling": LlamaConfig(**small_llama, rope_parameters={
            "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 128}),
        "mistral": MistralConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                 num_attention_heads=4, num_key_value_heads=1, max_position_embeddings=512,
                                 sliding_window=None, head_dim=32),
        "mistral_window": MistralConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=1, max_position_embeddings=512,
                                        sliding_window=128),
        "qwen2": Qwen2Config(vocab_size=160, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                             rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
                             tie_word_embeddings=True, bos_token_id=None, eos_token_id=151),
        "gemma": GemmaConfig(vocab_size=128, hidden_size=48, intermediate_size=96, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=1, head_dim=16, max_position_embeddings=128),
    }


def main():
    if os.path.exists(ROOT):
        shutil.rmtree(ROOT)
    os.makedirs(ROOT)

    tensors, expected = dtype_tensors()
    save_file(tensors, os.path.join(ROOT, "dtypes.safetensors"), metadata={"format": "pt", "fixture": "dtypes"})
    expected_tensors = {name: torch.from_numpy(np.ascontiguousarray(v)) for name, v in expected.items()}
    save_file(expected_tensors, os.path.join(ROOT, "dtypes_expected.safetensors"), metadata={"format": "pt"})

    write_sharded(os.path.join(ROOT, "sharded"))

    for name, config in configs().items():
        config.save_pretrained(os.path.join(ROOT, "configs", name))

    total = sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(ROOT) for f in files)
    print(f"wrote {ROOT} ({total} bytes)", file=sys.stderr)


if __name__ == "__main__":
    main()
