#!/usr/bin/env python3
"""Write the tiny-model reference fixtures the C transformer engine is tested against.

Usage (developers only; CI never runs Python, the output is committed):

    .venv-tools/bin/python tools/make_model_fixtures.py [--out tests/fixtures/models]

For each tiny model (gpt2, llama, llama_tied, llama3_rope, qwen2, qwen3, gemma, gemma2, gemma3, and
mistral_window, gemma2_window, gemma3_window, qwen2_window with sliding windows of 5)
this script

  1. builds the model from random weights with the transformers classes: float32,
     initialised by transformers under a fixed torch seed (initializer_range 0.1 so
     attention is far from uniform), then perturbs every norm weight and every bias
     with seeded Gaussian noise so that bugs in them are visible (they would otherwise
     be exactly 1/0, or 0 for Gemma's and Gemma 2's (1+w) norms);
  2. saves it with save_pretrained (float32 config.json + model.safetensors) into
     <out>/<name>/ -- this is what the C code loads;
  3. converts a copy to float64 and computes, inside `float64_everywhere()` (which
     stops transformers' internal float32 up/down-casts in RMSNorm, RoPE and softmax so
     that every floating-point op really runs in float64, checked by a dispatch mode),
     the logits, causal-LM loss, parameter gradients, a linear value head and its
     gradients, and 10 AdamW steps, all stored as float32 in
     <out>/<name>/reference.safetensors;
  4. verifies: the saved folder reloads with transformers and its float32 logits match
     the reference, logits == lm_head(last_hidden_state) (i.e. the hidden state the value
     head reads includes the final norm), the loss matches a hand-written one, and every
     parameter name matches model.safetensors.  It also measures how far a plain torch
     float32 run is from the float64 reference (a guide for C test tolerances);
  5. writes <out>/README.md describing every tensor (the contract for the C tests)
     with a per-model summary.

pad_token_id is set to None in every config so that nn.Embedding has no padding_idx
(HF would otherwise zero the embedding gradient of the pad row for Gemma); bos/eos are
1/2 so that generation_config.json holds ids inside the tiny vocabulary.

Everything is deterministic: the same transformers/torch versions give the same files.
"""
import argparse
import contextlib
import copy
import json
import math
import os
import sys

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch.utils._python_dispatch import TorchDispatchMode

import transformers
from transformers import (AutoModelForCausalLM, Gemma2Config, Gemma2ForCausalLM, Gemma3ForCausalLM, Gemma3TextConfig,
                          GemmaConfig, GemmaForCausalLM, GPT2Config,
                          GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM,
                          Qwen2Config, Qwen3Config, Qwen3ForCausalLM, Qwen2ForCausalLM,
                          get_cosine_schedule_with_warmup)

B, T = 3, 16
LENGTHS = [16, 11, 7]
ADAM_STEPS = 10
ADAM = dict(lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
WARMUP = 3
CLIP = 1.0
NO_DECAY = ("bias", "norm", "ln_", "embed_tokens", "wte", "wpe")
COMMON = dict(pad_token_id=None, bos_token_id=1, eos_token_id=2, use_cache=False,
              initializer_range=0.1, attn_implementation="eager")
LLAMA_SIZES = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                   num_attention_heads=4, max_position_embeddings=64, rope_theta=10000)


def gemma2_config(sliding_window):
    """The tiny Gemma 2 (see model_specs) with the given window."""
    return Gemma2Config(
        **LLAMA_SIZES, num_key_value_heads=2, head_dim=16,
        hidden_activation="gelu_pytorch_tanh", rms_norm_eps=1e-6, tie_word_embeddings=True,
        query_pre_attn_scalar=24, attn_logit_softcapping=1.5, final_logit_softcapping=3.0,
        sliding_window=sliding_window, **COMMON)


def gemma3_config(sliding_window):
    """The tiny Gemma 3 (see model_specs) with the given window."""
    return Gemma3TextConfig(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=64, hidden_activation="gelu_pytorch_tanh",
        rms_norm_eps=1e-6, tie_word_embeddings=True, query_pre_attn_scalar=24, sliding_window=sliding_window,
        layer_types=["sliding_attention", "full_attention"],
        rope_parameters={"full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}},
        **COMMON)


def model_specs():
    """name -> (seed, model class, config)."""
    return {
        "gpt2": (1, GPT2LMHeadModel, GPT2Config(
            vocab_size=128, n_positions=64, n_embd=64, n_layer=2, n_head=4,
            activation_function="gelu_new", resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
            **COMMON)),
        "llama": (2, LlamaForCausalLM, LlamaConfig(
            **LLAMA_SIZES, num_key_value_heads=2, rms_norm_eps=1e-5, tie_word_embeddings=False,
            **COMMON)),
        "llama_tied": (3, LlamaForCausalLM, LlamaConfig(
            **LLAMA_SIZES, num_key_value_heads=1, rms_norm_eps=1e-5, tie_word_embeddings=True,
            **COMMON)),
        # Llama 3.1/3.2's RoPE scaling: with head_dim 16 the wavelengths 6.3 .. 19869 cover
        # every branch (kept below 64 / 4, divided by 8 above 64, blended between).
        "llama3_rope": (6, LlamaForCausalLM, LlamaConfig(
            **{**LLAMA_SIZES, "max_position_embeddings": 128}, num_key_value_heads=2, rms_norm_eps=1e-5,
            tie_word_embeddings=False, rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                      "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
            **COMMON)),
        "qwen2": (4, Qwen2ForCausalLM, Qwen2Config(
            **LLAMA_SIZES, num_key_value_heads=2, rms_norm_eps=1e-6, tie_word_embeddings=False,
            **COMMON)),
        # Qwen3: RMSNorm of each head's q and k before RoPE; head_dim 24, so q is wider
        # (96) than the hidden size (64), as in Qwen3's own shapes.
        "qwen3": (7, Qwen3ForCausalLM, Qwen3Config(
            **LLAMA_SIZES, num_key_value_heads=2, head_dim=24, rms_norm_eps=1e-6, tie_word_embeddings=False,
            **COMMON)),
        "gemma": (5, GemmaForCausalLM, GemmaConfig(
            **LLAMA_SIZES, num_key_value_heads=2, head_dim=32,
            hidden_activation="gelu_pytorch_tanh", rms_norm_eps=1e-6, tie_word_embeddings=True,
            **COMMON)),
        # Gemma 2: four (1+w) norms per layer (post-attention and post-feedforward norms on
        # the branch outputs), query scale query_pre_attn_scalar^-0.5 with 24 != head_dim 16,
        # tanh soft caps on attention scores and final logits.  Without caps this model's
        # max |score| is 2.26 and max |logit| 4.07 on the batch, so caps 1.5 and 3 really
        # bend them.
        # sliding_window 64 = max positions: the default layer_types alternate sliding/full,
        # but every layer is plain causal attention on the 16-token batch.
        "gemma2": (8, Gemma2ForCausalLM, gemma2_config(sliding_window=64)),
        # Gemma 3 (text): Gemma 2's four norms, (1+w) RMSNorms of each head's q and k before
        # RoPE, no soft caps, and per-layer-type RoPE: layer 0 a sliding layer turning by base
        # 1e4, layer 1 a full-attention layer by base 1e6 with linear scaling 8 (as the 4B+
        # models), so a layer that takes the other's frequencies is visible at T = 16.
        # sliding_window 64 = max positions: no effect on the batch.
        "gemma3": (9, Gemma3ForCausalLM, gemma3_config(sliding_window=64)),
        # Sliding-window attention with a window of 5 keys, shorter than the batch's rows of
        # 16, 11 and 7 tokens: Mistral (every layer), Gemma 2 (layer 0 sliding, layer 1 full;
        # with its soft caps), Gemma 3 (layer 0 sliding with its own RoPE base) and Qwen2 with
        # use_sliding_window (layers from max_window_layers = 1 on).
        "mistral_window": (10, MistralForCausalLM, MistralConfig(
            **LLAMA_SIZES, num_key_value_heads=2, rms_norm_eps=1e-5, tie_word_embeddings=False,
            sliding_window=5, **COMMON)),
        "gemma2_window": (11, Gemma2ForCausalLM, gemma2_config(sliding_window=5)),
        "gemma3_window": (12, Gemma3ForCausalLM, gemma3_config(sliding_window=5)),
        "qwen2_window": (13, Qwen2ForCausalLM, Qwen2Config(
            **LLAMA_SIZES, num_key_value_heads=2, rms_norm_eps=1e-6, tie_word_embeddings=False,
            use_sliding_window=True, sliding_window=5, max_window_layers=1, **COMMON)),
    }


# ---------------------------------------------------------------------------------------
# float64 everywhere

@contextlib.contextmanager
def float64_everywhere():
    """Make transformers' hard-coded float32 casts no-ops on float64 tensors."""
    orig_float, orig_to, orig_softmax = torch.Tensor.float, torch.Tensor.to, F.softmax

    def _float(self, *a, **k):
        return self if self.dtype == torch.float64 else orig_float(self, *a, **k)

    def _to(self, *args, **kwargs):
        if self.dtype == torch.float64:
            args = tuple(torch.float64 if a is torch.float32 else a for a in args)
            if kwargs.get("dtype") is torch.float32:
                kwargs["dtype"] = torch.float64
        return orig_to(self, *args, **kwargs)

    def _softmax(input, dim=None, _stacklevel=3, dtype=None):
        if input.dtype == torch.float64 and dtype is torch.float32:
            dtype = torch.float64
        return orig_softmax(input, dim=dim, _stacklevel=_stacklevel, dtype=dtype)

    torch.Tensor.float, torch.Tensor.to, F.softmax = _float, _to, _softmax
    torch.set_default_dtype(torch.float64)  # e.g. AdamW's step counters
    try:
        with NoFloat32Check():
            yield
    finally:
        torch.Tensor.float, torch.Tensor.to, F.softmax = orig_float, orig_to, orig_softmax
        torch.set_default_dtype(torch.float32)


class NoFloat32Check(TorchDispatchMode):
    """Fails if any aten op turns floating-point input into a float32 result (converting
    integer positions/masks to float32 is exact and allowed)."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        ins = [a for a in torch.utils._pytree.tree_leaves((args, kwargs))
               if isinstance(a, torch.Tensor)]
        outs = [o for o in torch.utils._pytree.tree_leaves(out) if isinstance(o, torch.Tensor)]
        if any(o.dtype == torch.float32 for o in outs) and any(i.is_floating_point() for i in ins):
            raise RuntimeError(f"float32 result from {func} inside float64_everywhere()")
        return out


def exact_rope(model):
    """Recompute RoPE inverse frequencies in float64 (transformers computes them in float32)."""
    for mod in model.modules():
        if isinstance(getattr(mod, "rope_type", None), dict):  # Gemma 3: one table per layer type
            cfg = mod.config
            for layer_type in mod.layer_types:
                p = cfg.rope_parameters[layer_type]
                inv = 1.0 / (p["rope_theta"] ** (torch.arange(0, cfg.head_dim, 2, dtype=torch.float64) / cfg.head_dim))
                if p.get("rope_type") == "linear":
                    inv = inv / p["factor"]
                setattr(mod, f"{layer_type}_inv_freq", inv)
                setattr(mod, f"{layer_type}_original_inv_freq", inv.clone())
            continue
        if hasattr(mod, "inv_freq") and hasattr(mod, "config"):
            cfg = mod.config
            dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
            theta = cfg.rope_parameters["rope_theta"]
            inv = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
            if cfg.rope_parameters.get("rope_type") == "llama3":  # transformers' formula, in float64
                p = cfg.rope_parameters
                old = p["original_max_position_embeddings"]
                low, high, factor = p["low_freq_factor"], p["high_freq_factor"], p["factor"]
                wavelen = 2 * math.pi / inv
                scaled = torch.where(wavelen > old / low, inv / factor, inv)
                smooth = (old / wavelen - low) / (high - low)
                smoothed = (1 - smooth) * scaled / factor + smooth * scaled
                medium = ~(wavelen < old / high) & ~(wavelen > old / low)
                inv = torch.where(medium, smoothed, scaled)
            mod.inv_freq = inv
            mod.original_inv_freq = inv.clone()


# ---------------------------------------------------------------------------------------

def build(name, seed, cls, config):
    torch.manual_seed(seed)
    model = cls(config).float().eval()
    g = torch.Generator().manual_seed(1000 + seed)
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if "bias" in pname:
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
            elif "norm" in pname or "ln_" in pname:
                base = 0.0 if name.startswith("gemma") else 1.0  # Gemma stores w of (1 + w)
                p.copy_(base + 0.1 * torch.randn(p.shape, generator=g))
    return model


def make_batch(vocab, seed):
    g = torch.Generator().manual_seed(2000 + seed)
    ids = torch.randint(0, vocab, (B, T), generator=g, dtype=torch.int64)
    lengths = torch.tensor(LENGTHS, dtype=torch.int64)
    mask = torch.arange(T)[None, :] < lengths[:, None]
    ids[~mask] = 0
    return ids, lengths, mask.long()


def labels_of(ids, mask):
    lab = ids.clone()
    lab[mask == 0] = -100
    return lab


def base_model(model):
    return model.transformer if hasattr(model, "transformer") else model.model


def lm_loss(model, ids, mask):
    out = model(input_ids=ids, attention_mask=mask, labels=labels_of(ids, mask))
    return out.loss, out.logits


def grads_of(model, names):
    out = {}
    for n, p in model.named_parameters():
        out[n] = torch.zeros_like(p) if p.grad is None else p.grad.detach().clone()
    return {n: out[n] for n in names}


def forward_backward(model, ids, mask, w_v, dvalue):
    """Returns logits, loss, loss-grads, values, value-grads (incl. value head)."""
    names = [n for n, _ in model.named_parameters()]
    model.zero_grad(set_to_none=True)
    loss, logits = lm_loss(model, ids, mask)
    loss.backward()
    grads = grads_of(model, names)

    model.zero_grad(set_to_none=True)
    w_v = w_v.detach().clone().requires_grad_(True)
    hidden = base_model(model)(input_ids=ids, attention_mask=mask).last_hidden_state
    values = hidden @ w_v[0]
    (values * dvalue).sum().backward()
    vgrads = grads_of(model, names)
    vgrads["value_head.weight"] = w_v.grad.detach().clone()

    # the value head must read the hidden state *after* the final norm: check that the
    # LM head applied to it reproduces the logits (after Gemma 2's final soft cap)
    head = model.lm_head.weight
    lg = hidden.detach() @ head.detach().T
    cap = getattr(model.config, "final_logit_softcapping", None)
    if cap is not None:
        lg = cap * torch.tanh(lg / cap)
    assert torch.allclose(lg, logits.detach(), rtol=1e-6, atol=1e-6 * lg.abs().max()), \
        "last_hidden_state is not the final-norm output"
    return logits.detach(), loss.detach(), grads, values.detach(), vgrads


def manual_loss(logits, ids, lengths):
    terms = []
    for b in range(B):
        for t in range(int(lengths[b]) - 1):
            terms.append(-torch.log_softmax(logits[b, t], -1)[ids[b, t + 1]])
    return torch.stack(terms).mean()


def adamw_run(model, ids, mask):
    decay = [p for n, p in model.named_parameters() if not any(k in n for k in NO_DECAY)]
    no_decay = [p for n, p in model.named_parameters() if any(k in n for k in NO_DECAY)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": ADAM["weight_decay"]},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=ADAM["lr"], betas=ADAM["betas"], eps=ADAM["eps"])
    sched = get_cosine_schedule_with_warmup(opt, num_warmup_steps=WARMUP,
                                            num_training_steps=ADAM_STEPS)
    losses, norms, lrs = [], [], []
    for _ in range(ADAM_STEPS):
        opt.zero_grad(set_to_none=True)
        loss, _ = lm_loss(model, ids, mask)
        loss.backward()
        norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)))
        losses.append(float(loss.detach()))
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    final = {n: p.detach().clone() for n, p in model.named_parameters()}
    return losses, norms, lrs, final


def max_rel(a, b):
    """max |a-b| / max |b| (scale-relative error)."""
    return float((a.double() - b.double()).abs().max() / b.double().abs().max().clamp_min(1e-30))


def make_one(name, seed, cls, config, out_dir):
    folder = os.path.join(out_dir, name)
    os.makedirs(folder, exist_ok=True)
    model32 = build(name, seed, cls, config)
    model32.save_pretrained(folder, safe_serialization=True)
    saved_names = set(load_file(os.path.join(folder, "model.safetensors")).keys())
    param_names = [n for n, _ in model32.named_parameters()]
    assert set(param_names) == saved_names, (set(param_names) ^ saved_names)

    vocab, hidden = config.vocab_size, model32.config.hidden_size
    ids, lengths, mask = make_batch(vocab, seed)
    g = torch.Generator().manual_seed(3000 + seed)
    w_v = torch.randn(1, hidden, generator=g) / math.sqrt(hidden)
    dvalue = torch.randn(B, T, generator=g) * mask

    model64 = copy.deepcopy(model32).double()
    exact_rope(model64)
    with float64_everywhere():
        logits, loss, grads, values, vgrads = forward_backward(
            model64, ids, mask, w_v.double(), dvalue.double())
        ml = manual_loss(logits, ids, lengths)
        assert abs(float(ml) - float(loss)) < 1e-12, (float(ml), float(loss))
        losses, norms, lrs, final = adamw_run(copy.deepcopy(model64), ids, mask)

    ref = {"input_ids": ids, "lengths": lengths, "logits": logits, "loss": loss.reshape(1),
           "value_head.weight": w_v, "values": values, "dvalue": dvalue,
           "adamw_losses": torch.tensor(losses), "adamw_grad_norms": torch.tensor(norms),
           "adamw_lrs": torch.tensor(lrs)}
    ref.update({f"grad.{n}": g_ for n, g_ in grads.items()})
    ref.update({f"vgrad.{n}": g_ for n, g_ in vgrads.items()})
    ref.update({f"final.{n}": p for n, p in final.items()})
    ref = {k: (v.float() if v.is_floating_point() else v).contiguous() for k, v in ref.items()}
    # no metadata: safetensors writes it in random order, and the files should be
    # byte-identical between runs (versions are recorded in README.md)
    save_file(ref, os.path.join(folder, "reference.safetensors"))

    # --- checks against plain float32 torch (the reloaded folder) ---
    re = AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager").eval()
    valid = mask.bool()
    rl = forward_backward(re, ids, mask, w_v, dvalue)
    logit_err = float((rl[0] - logits.float())[valid].abs().max())
    assert logit_err < 1e-4, f"{name}: reloaded logits differ by {logit_err}"
    grad_err = max(max_rel(rl[2][n], grads[n]) for n in param_names)
    vgrad_err = max(max_rel(rl[4][n], vgrads[n]) for n in vgrads)
    value_err = float((rl[3] - values.float())[valid].abs().max())
    r32 = adamw_run(re, ids, mask)
    final_err = max(float((r32[3][n] - final[n].float()).abs().max()) for n in param_names)
    summary = dict(
        params=sum(p.numel() for p in model32.parameters()),
        max_abs_logit=float(logits[valid].abs().max()), loss=float(loss),
        adamw_final_loss=losses[-1],
        f32_logit_abs_err=logit_err, f32_value_abs_err=value_err,
        f32_loss_abs_err=abs(float(rl[1]) - float(loss)),
        f32_grad_rel_err=grad_err, f32_vgrad_rel_err=vgrad_err,
        f32_adamw_final_abs_err=final_err)
    print(name, json.dumps(summary))
    return summary, ref, config, model32


# ---------------------------------------------------------------------------------------

README_HEAD = """# Tiny-model reference fixtures

Generated by `tools/make_model_fixtures.py` (torch {torch}, transformers {tf}); do not edit
by hand, re-run the script.  CI never runs Python: these files are the contract the C
transformer engine is tested against.

Each `<model>/` folder holds

* `config.json`, `model.safetensors`, `generation_config.json`: the model exactly as
  transformers' `save_pretrained` writes it, float32 weights.  This is what the C code
  loads.  Tied models (`gpt2`, `llama_tied`, `gemma`, `gemma2`, `gemma3`) have no `lm_head.weight` tensor:
  the LM head is the token embedding.  Note transformers 5 writes RoPE settings as
  `"rope_parameters": {{"rope_theta": ..., "rope_type": "default"}}` in config.json.
* `reference.safetensors`: the expected results below.  Every float tensor is stored as
  float32 but was computed with the model in float64 with *no* internal float32 casts
  (RMSNorm, RoPE frequencies/angles and softmax included), so it is the exact function
  of the stored float32 weights up to float64 rounding.

## Models

| name | family | layers | hidden | heads / kv heads | head_dim | ffn | tied | notes |
|---|---|---|---|---|---|---|---|---|
| gpt2 | GPT2LMHeadModel | 2 | 64 | 4 / 4 | 16 | 256 (gelu_new) | yes | LayerNorm eps 1e-5, learned positions (64) |
| llama | LlamaForCausalLM | 2 | 64 | 4 / 2 (GQA) | 16 | 128 (SwiGLU) | no | RMSNorm eps 1e-5, RoPE theta 1e4 |
| llama_tied | LlamaForCausalLM | 2 | 64 | 4 / 1 (MQA) | 16 | 128 (SwiGLU) | yes | RMSNorm eps 1e-5, RoPE theta 1e4 |
| llama3_rope | LlamaForCausalLM | 2 | 64 | 4 / 2 (GQA) | 16 | 128 (SwiGLU) | no | RMSNorm eps 1e-5, RoPE theta 1e4 with Llama 3 scaling (factor 8, low/high frequency factors 1/4, original context 64) |
| qwen2 | Qwen2ForCausalLM | 2 | 64 | 4 / 2 (GQA) | 16 | 128 (SwiGLU) | no | q/k/v biases, RMSNorm eps 1e-6, RoPE theta 1e4 |
| qwen3 | Qwen3ForCausalLM | 2 | 64 | 4 / 2 (GQA) | 24 | 128 (SwiGLU) | no | RMSNorm of each head's q and k (q_norm / k_norm) before RoPE, q wider (96) than hidden, RMSNorm eps 1e-6, RoPE theta 1e4 |
| gemma | GemmaForCausalLM | 2 | 64 | 4 / 2 (GQA) | 32 | 128 (GeGLU, gelu tanh) | yes | (1+w) RMSNorm eps 1e-6, embeddings x sqrt(64)=8, RoPE theta 1e4 |
| gemma2 | Gemma2ForCausalLM | 2 | 64 | 4 / 2 (GQA) | 16 | 128 (GeGLU, gelu tanh) | yes | (1+w) RMSNorm eps 1e-6, four norms per layer (input, post_attention, pre_feedforward, post_feedforward), embeddings x 8, RoPE theta 1e4, query_pre_attn_scalar 24 (scores x 24^-0.5, not head_dim^-0.5), attn_logit_softcapping 1.5, final_logit_softcapping 3.0, sliding_window 64 (no effect at T=16) |
| gemma3 | Gemma3ForCausalLM | 2 | 64 | 4 / 2 (GQA) | 16 | 128 (GeGLU, gelu tanh) | yes | Gemma 2's four (1+w) norms and query_pre_attn_scalar 24, (1+w) RMSNorm of each head's q and k before RoPE, no soft caps, layer 0 sliding (RoPE theta 1e4), layer 1 full attention (theta 1e6, linear scaling 8), sliding_window 64 (no effect at T=16) |
| mistral_window | MistralForCausalLM | 2 | 64 | 4 / 2 (GQA) | 16 | 128 (SwiGLU) | no | Llama's layout, sliding_window 5 in every layer (rows of 16, 11 and 7 tokens: the window bites) |
| gemma2_window | Gemma2ForCausalLM | 2 | 64 | 4 / 2 (GQA) | 16 | 128 (GeGLU, gelu tanh) | yes | gemma2 with sliding_window 5: layer 0 sliding, layer 1 full attention |
| gemma3_window | Gemma3ForCausalLM | 2 | 64 | 4 / 2 (GQA) | 16 | 128 (GeGLU, gelu tanh) | yes | gemma3 with sliding_window 5: layer 0 sliding, layer 1 full attention |
| qwen2_window | Qwen2ForCausalLM | 2 | 64 | 4 / 2 (GQA) | 16 | 128 (SwiGLU) | no | qwen2 with use_sliding_window, sliding_window 5, max_window_layers 1: layer 1 sliding |

All: vocab 128, max positions 64, weights from transformers' init (seeded,
initializer_range 0.1), then every bias and norm weight perturbed with N(0, 0.1) noise
(around 1 for LayerNorm/RMSNorm weights, around 0 for Gemma's `w` of `(1+w)`).
GPT-2 tensors are named `transformer.*` and its `c_attn`/`c_proj`/`c_fc` weights are
Conv1D, stored `[in, out]` (y = x W + b, the transpose of nn.Linear); `c_attn` packs
q|k|v along the output dim.  The Llama/Qwen2/Gemma projections are nn.Linear `[out, in]`.
RoPE uses the HF "rotate_half" layout (dimension i pairs with i + head_dim/2, frequency
`theta^(-2i/head_dim)`), not the interleaved GGUF layout.  pad_token_id is null, so
the embedding has no padding_idx (its gradient includes every row, row 0 too).

Gemma 2 layer: `h = x + post_attention_layernorm(attn(input_layernorm(x)))`, then
`out = h + post_feedforward_layernorm(mlp(pre_feedforward_layernorm(h)))`.  Attention
scores are `s = (q . k) * 24^-0.5`, soft-capped `s = 1.5 * tanh(s / 1.5)` before the mask and
softmax; the logits are `3 * tanh((h_final W_emb^T) / 3)`.  `values` read `h_final` (the
final-norm output, before the LM head and its soft cap).

## Tensors in reference.safetensors

B = 3, T = 16, V = 128; `lengths = [16, 11, 7]`; "valid" means `t < lengths[b]`.

| name | dtype, shape | meaning |
|---|---|---|
| `input_ids` | int64 [3,16] | random ids in [0,128); padded positions (t >= lengths[b]) hold 0 (right padding); valid positions can also be 0 |
| `lengths` | int64 [3] | [16, 11, 7] |
| `logits` | f32 [3,16,128] | `model(input_ids, attention_mask)` with `attention_mask[b,t] = t < lengths[b]` and positions 0..T-1; only valid positions are meaningful |
| `loss` | f32 [1] | causal-LM loss: mean over all (b,t) with t+1 < lengths[b] of `-log softmax(logits[b,t])[input_ids[b,t+1]]`: (16-1)+(11-1)+(7-1) = 31 terms |
| `grad.<name>` | f32, param shape | d loss / d param for every parameter (HF names exactly as in model.safetensors; for tied models the embedding gradient includes the LM-head contribution) |
| `value_head.weight` | f32 [1,64] | value-head weight w_v (no bias) |
| `values` | f32 [3,16] | `values[b,t] = h[b,t,:] . w_v[0]`, h = last hidden state *after the final norm* (ln_f / model.norm), i.e. the tensor the LM head multiplies; meaningful at valid positions |
| `dvalue` | f32 [3,16] | random upstream gradient, 0 at padded positions |
| `vgrad.<name>` | f32, param shape | d L_v / d param for every parameter, L_v = sum(values * dvalue); untied `lm_head.weight` gets zeros (unused) |
| `vgrad.value_head.weight` | f32 [1,64] | d L_v / d w_v |
| `adamw_losses` | f32 [10] | loss at each of 10 AdamW steps, computed before that step's update (adamw_losses[0] == loss) |
| `adamw_grad_norms` | f32 [10] | global L2 norm of all gradients before clipping, at each step |
| `adamw_lrs` | f32 [10] | learning rate used at each step |
| `final.<name>` | f32, param shape | every parameter after the 10 steps |

### The 10-step AdamW run (torch.optim.AdamW semantics)

Same batch and loss every step, starting from the weights in model.safetensors.  Step
k = 0..9:

1. g = d loss / d p (all params; the tied embedding appears once).
2. `n = sqrt(sum over all params of sum(g^2))` (stored in adamw_grad_norms);
   `c = min(1, 1.0 / (n + 1e-6))`; g *= c  (torch.nn.utils.clip_grad_norm_).
3. lr_k = 1e-2 * f(k), f = get_cosine_schedule_with_warmup(warmup 3, total 10):
   `f(k) = k/3` for k < 3, else `0.5 * (1 + cos(pi * (k-3)/7))`; so lr_0 = 0 (stored in
   adamw_lrs).  Moments and the step counter still advance at step 0.
4. with t = k+1, beta1 = 0.9, beta2 = 0.95, eps = 1e-8:
   `p *= 1 - lr_k * wd`; `m = b1 m + (1-b1) g`; `v = b2 v + (1-b2) g^2`;
   `p -= (lr_k / (1 - b1^t)) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)`.
   wd = 0.1, except wd = 0 for parameters whose HF name contains any of
   "bias", "norm", "ln_", "embed_tokens", "wte", "wpe" (so biases, all norm weights and
   token/position embeddings -- including a tied LM head -- are not decayed; an untied
   `lm_head.weight` is decayed).

## Tolerances

The `f32_*` columns below are the errors of plain PyTorch float32 (CPU) against these
float64 references: a float32 implementation should land in the same range.  Logit and
value errors are max absolute errors at valid positions; grad errors are
`max|a-b| / max|b|` per tensor, worst tensor; AdamW error is the max absolute difference
of the final parameters.  Adam divides by sqrt(v), so parameter entries whose gradient is
close to 0 amplify float32 noise: compare `final.*` with a loose tolerance (about
`lr`-sized differences on a few entries are possible), and check the losses/grad norms
tightly.

## Summary

| model | params | max abs logit | loss | loss after 10 AdamW steps (adamw_losses[9]) | f32 logit err | f32 value err | f32 loss err | f32 grad rel err | f32 vgrad rel err | f32 AdamW final err |
|---|---|---|---|---|---|---|---|---|---|---|
"""


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ap.add_argument("--out", default=os.path.join(here, "tests", "fixtures", "models"))
    ap.add_argument("--only", help="write this model's folder alone (README.md is not rewritten)")
    args = ap.parse_args()
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)  # reproducible reductions
    rows = []
    for name, (seed, cls, config) in model_specs().items():
        if args.only and name != args.only:
            continue
        s, *_ = make_one(name, seed, cls, config, args.out)
        rows.append(
            f"| {name} | {s['params']} | {s['max_abs_logit']:.4f} | {s['loss']:.6f} | "
            f"{s['adamw_final_loss']:.6f} | {s['f32_logit_abs_err']:.1e} | "
            f"{s['f32_value_abs_err']:.1e} | {s['f32_loss_abs_err']:.1e} | "
            f"{s['f32_grad_rel_err']:.1e} | {s['f32_vgrad_rel_err']:.1e} | "
            f"{s['f32_adamw_final_abs_err']:.1e} |")
    if args.only:
        print("\n".join(rows))
        return 0
    with open(os.path.join(args.out, "README.md"), "w") as f:
        f.write(README_HEAD.format(torch=torch.__version__, tf=transformers.__version__))
        f.write("\n".join(rows) + "\n")
    print("wrote", args.out)


if __name__ == "__main__":
    sys.exit(main())
