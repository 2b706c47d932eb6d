"""Writes tests/fixtures/gguf/tiny_llama_model.gguf: the tiny Llama of
tests/fixtures/models/llama (GQA, untied) converted to GGUF the way llama.cpp's
converter does it — llama.cpp tensor names, q/k rows permuted for its interleaved
rotary layout, dimensions innermost first — with a mix of tensor types (F32 norms,
F16 and Q8_0 matrices). tests/test_model_gguf.c loads it and checks the logits against
the Hugging Face fixture, which exercises the name mapping and the un-permutation.

Also writes tiny_llama_model_bad_type.gguf, identical except that one tensor is
declared as Q8_1 (a type marlhf does not dequantize: ggml keeps activations in it,
never weights), for the bad-input tests.

usage: .venv-tools/bin/python tools/make_gguf_model_fixture.py
"""
import json
import os

import gguf
import numpy as np
from safetensors.numpy import load_file

root = os.path.join(os.path.dirname(__file__), "..")
source = os.path.join(root, "tests/fixtures/models/llama")
out_dir = os.path.join(root, "tests/fixtures/gguf")


def permute(w, n_head):
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write(path, bad_type):
    config = json.load(open(os.path.join(source, "config.json")))
    weights = load_file(os.path.join(source, "model.safetensors"))
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    rope = config.get("rope_parameters") or {}
    writer.add_rope_freq_base(rope.get("rope_theta", config.get("rope_theta", 10000.0)))
    writer.add_vocab_size(config["vocab_size"])
    names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
             "lm_head.weight": "output.weight"}
    layer_names = {"input_layernorm.weight": "attn_norm.weight", "self_attn.q_proj.weight": "attn_q.weight",
                   "self_attn.k_proj.weight": "attn_k.weight", "self_attn.v_proj.weight": "attn_v.weight",
                   "self_attn.o_proj.weight": "attn_output.weight",
                   "post_attention_layernorm.weight": "ffn_norm.weight", "mlp.gate_proj.weight": "ffn_gate.weight",
                   "mlp.up_proj.weight": "ffn_up.weight", "mlp.down_proj.weight": "ffn_down.weight"}
    for index, (name, w) in enumerate(sorted(weights.items())):
        w = w.astype(np.float32)
        if name.startswith("model.layers."):
            parts = name.split(".")
            suffix = ".".join(parts[3:])
            target = f"blk.{parts[2]}.{layer_names[suffix]}"
            if suffix == "self_attn.q_proj.weight":
                w = permute(w, heads)
            if suffix == "self_attn.k_proj.weight":
                w = permute(w, kv_heads)
        else:
            target = names[name]
        if w.ndim == 1:
            writer.add_tensor(target, w)
        elif bad_type and target == "blk.0.ffn_up.weight":
            # Q8_1: 40 bytes per 32 values; the payload is never read.
            raw = np.zeros((w.shape[0], w.shape[1] // 32 * 40), dtype=np.uint8)
            writer.add_tensor(target, raw, raw_dtype=gguf.GGMLQuantizationType.Q8_1)
        elif index % 2 == 0:
            writer.add_tensor(target, w.astype(np.float16))
        else:
            q = gguf.quants.quantize(w, gguf.GGMLQuantizationType.Q8_0)
            writer.add_tensor(target, q, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


write(os.path.join(out_dir, "tiny_llama_model.gguf"), bad_type=False)
write(os.path.join(out_dir, "tiny_llama_model_bad_type.gguf"), bad_type=True)
print("wrote", out_dir)
