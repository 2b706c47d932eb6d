"""Writes tests/fixtures/models/tiny_chat/: a tiny Llama (hidden 64, 2 layers, 4 heads, 2 KV
heads, tied embeddings) from random weights, with the small byte-level BPE tokenizer of
tests/fixtures/tokenizers/bytelevel_small. The trainers' tests (SFT, RM, PPO, resume)
run real commands on it in seconds.

With --gemma2, tests/fixtures/models/tiny_gemma2_chat/ instead: the same sizes as a Gemma 2
(sandwich norms, soft caps 2 on the attention scores and 5 on the logits, small enough to
act once training grows them; query_pre_attn_scalar = head_dim, which a GGUF file can say),
for tests/cli/gemma2.sh.
With --gemma3, tests/fixtures/models/tiny_gemma3_chat/: the same widths as a Gemma 3 text model
of 6 layers (q/k norms, no soft caps, layers 0-4 sliding layers turning by RoPE base 1e4,
layer 5 a full-attention one by 5e5, not transformers' default; the pattern and local base
llama.cpp fixes, and query_pre_attn_scalar = head_dim, so that a GGUF file can say it), for
tests/cli/gemma3.sh.
usage: .venv-tools/bin/python tools/make_tiny_model.py [--gemma2 | --gemma3]
"""
import json
import os
import shutil
import sys

import torch
import transformers

gemma2 = "--gemma2" in sys.argv[1:]
gemma3 = "--gemma3" in sys.argv[1:]
root = os.path.join(os.path.dirname(__file__), "..")
tokenizer_dir = os.path.join(root, "tests/fixtures/tokenizers/bytelevel_small")
out = os.path.join(root, "tests/fixtures/models",
                   "tiny_gemma2_chat" if gemma2 else "tiny_gemma3_chat" if gemma3 else "tiny_chat")
vocab = len(json.load(open(os.path.join(tokenizer_dir, "tokenizer.json")))["model"]["vocab"])
vocab += len(json.load(open(os.path.join(tokenizer_dir, "tokenizer.json")))["added_tokens"])
vocab = (vocab + 7) // 8 * 8
torch.manual_seed(0)
sizes = dict(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=256, rope_theta=10000.0, tie_word_embeddings=True,
             bos_token_id=None, eos_token_id=None, pad_token_id=None)
if gemma2:
    config = transformers.Gemma2Config(**sizes, head_dim=16, rms_norm_eps=1e-6, hidden_activation="gelu_pytorch_tanh",
                                       query_pre_attn_scalar=16, attn_logit_softcapping=2.0,
                                       final_logit_softcapping=5.0, sliding_window=256)
    model = transformers.Gemma2ForCausalLM(config)
elif gemma3:
    sizes.pop("rope_theta")
    sizes["num_hidden_layers"] = 6
    config = transformers.Gemma3TextConfig(**sizes, head_dim=16, rms_norm_eps=1e-6, hidden_activation="gelu_pytorch_tanh",
                                           query_pre_attn_scalar=16, sliding_window=256,
                                           layer_types=["sliding_attention"] * 5 + ["full_attention"],
                                           rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 5e5},
                                                            "sliding_attention": {"rope_type": "default",
                                                                                  "rope_theta": 1e4}})
    model = transformers.Gemma3ForCausalLM(config)
else:
    config = transformers.LlamaConfig(**sizes, rms_norm_eps=1e-5)
    model = transformers.LlamaForCausalLM(config)
os.makedirs(out, exist_ok=True)
model.save_pretrained(out, safe_serialization=True)
for name in ("tokenizer.json", "tokenizer_config.json"):
    shutil.copy(os.path.join(tokenizer_dir, name), os.path.join(out, name))
print("wrote", out, "vocab", vocab)
