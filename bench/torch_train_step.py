#!/usr/bin/env python3
"""PyTorch peer of the C training-step benchmark.

One training step = forward with the causal-LM loss + backward + the global gradient
norm clipped to --max-grad-norm (1.0, as bench/train_step and `marlhf sft` do by default; 0
skips it) + AdamW step, on a model built from random weights (float32, CPU), for a random batch of B x T token ids.
After --warmup untimed steps, --steps steps are timed; step_s is their mean.

    .venv-tools/bin/python bench/torch_train_step.py [--batch 4] [--seq 256] [--steps 3]
        [--warmup 2] [--threads N] [--attn eager|sdpa] [--model gpt2-124m|smollm2-135m|all]
        [--max-grad-norm 1.0]
        [--lora-rank R]    (PEFT LoRA of rank R on every linear layer of the blocks, base frozen)
        [--lora-dropout P] (PEFT's lora_dropout, the model in training mode)
        [--use-dora]       (PEFT's use_dora: DoRA adapters)
        [--quantize nf4|nf4-single] (with --lora-rank: QLoRA, the blocks' linear layers as
                           bitsandbytes' Linear4bit, NF4 with (nf4) or without double quantization,
                           float32 compute, its CPU backend; PEFT's LoRA on top)

Prints one JSON line per model on stdout:
  {"impl": "pytorch", "model": ..., "tokens_per_s": ..., "step_s": ..., "gflops": ...,
   "threads": ..., ...}

FLOP count (the C benchmark uses the same formula) -- per trained token:

    flops_per_token = 6 * (P_nonemb + V * d)  +  6 * L * T * (H * d_head)

  P_nonemb  all parameters except the token and position embedding tables (norm
            weights and biases included; a tied LM head is not counted here)
  V * d     the LM-head matmul (vocab x hidden), counted whether or not it is tied
  L, T      layers, sequence length;  H * d_head  total query width (= hidden here)
  6 = 2 (multiply-add) x 3 (forward + backward); the attention term is QK^T and PV
  (2 * 2 * T * H*d_head per token per layer forward), halved by causality, times 3.

  gflops = flops_per_token * B * T / step_s / 1e9   (achieved GFLOP/s)
"""
import argparse
import json
import os
import resource
import sys
import time

import torch
from transformers import (Gemma2Config, Gemma2ForCausalLM, Gemma3ForCausalLM, Gemma3TextConfig, GPT2Config, GPT2LMHeadModel,
                          LlamaConfig, LlamaForCausalLM)

FORMULA = "flops_per_token = 6*(P_nonemb + V*d) + 6*L*T*(H*d_head)"


def build(name, attn):
    if name == "gpt2-124m":
        cfg = GPT2Config(vocab_size=50257, n_positions=1024, n_embd=768, n_layer=12, n_head=12,
                         resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
        cls, emb = GPT2LMHeadModel, ("transformer.wte.weight", "transformer.wpe.weight")
    elif name == "smollm2-135m":
        cfg = LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536,
                          num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                          tie_word_embeddings=True, rope_theta=100000.0, rms_norm_eps=1e-5,
                          max_position_embeddings=2048)
        cls, emb = LlamaForCausalLM, ("model.embed_tokens.weight",)
    elif name == "gemma2-135m":  # bench/bench_shapes.h's: SmolLM2's widths as a Gemma 2
        cfg = Gemma2Config(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                           num_attention_heads=9, num_key_value_heads=3, head_dim=64, query_pre_attn_scalar=64,
                           attn_logit_softcapping=50.0, final_logit_softcapping=30.0, sliding_window=4096,
                           tie_word_embeddings=True, rope_theta=10000.0, rms_norm_eps=1e-6,
                           max_position_embeddings=4096, hidden_activation="gelu_pytorch_tanh")
        cls, emb = Gemma2ForCausalLM, ("model.embed_tokens.weight",)
        attn = "eager"  # the soft cap of the scores: transformers applies it in eager attention
    elif name == "gemma3-135m":  # bench/bench_shapes.h's: SmolLM2's widths as a Gemma 3
        cfg = Gemma3TextConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                               num_attention_heads=9, num_key_value_heads=3, head_dim=64, query_pre_attn_scalar=64,
                               sliding_window=4096, tie_word_embeddings=True, rms_norm_eps=1e-6,
                               max_position_embeddings=4096, hidden_activation="gelu_pytorch_tanh",
                               rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                                                "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}})
        cls, emb = Gemma3ForCausalLM, ("model.embed_tokens.weight",)
    else:
        raise SystemExit(f"unknown model {name}")
    cfg.use_cache = False
    cfg._attn_implementation = attn
    torch.manual_seed(0)
    model = cls(cfg).float().train()
    p_nonemb = sum(p.numel() for n, p in model.named_parameters() if n not in emb)
    return model, cfg, p_nonemb


def flops_per_token(cfg, p_nonemb, T):
    d = cfg.hidden_size
    q_width = cfg.num_attention_heads * (getattr(cfg, "head_dim", None) or d // cfg.num_attention_heads)
    return 6 * (p_nonemb + cfg.vocab_size * d) + 6 * cfg.num_hidden_layers * T * q_width


LORA_MODULES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def quantize_nf4(model, double_quant):
    """Every linear layer of the blocks as bitsandbytes' Linear4bit (NF4, blocks of 64), its
    weights quantized from the float32 ones (Params4bit quantizes as it moves to the device)."""
    import bitsandbytes as bnb
    for layer in model.model.layers:
        for parent in (layer.self_attn, layer.mlp):
            for child, linear in list(parent.named_children()):
                if not isinstance(linear, torch.nn.Linear):
                    continue
                q = bnb.nn.Linear4bit(linear.in_features, linear.out_features, bias=linear.bias is not None,
                                      compute_dtype=torch.float32, compress_statistics=double_quant, quant_type="nf4")
                q.weight = bnb.nn.Params4bit(linear.weight.data, requires_grad=False, compress_statistics=double_quant,
                                             quant_type="nf4").to("cpu")
                setattr(parent, child, q)


def bench(name, args):
    model, cfg, p_nonemb = build(name, args.attn)
    if args.quantize != "none":
        if args.lora_rank < 1:
            raise SystemExit("--quantize needs --lora-rank (a quantized base is frozen)")
        quantize_nf4(model, args.quantize == "nf4")
    if args.lora_rank > 0:
        import peft
        config = peft.LoraConfig(r=args.lora_rank, lora_alpha=args.lora_rank, lora_dropout=args.lora_dropout,
                                 target_modules=LORA_MODULES, task_type="CAUSAL_LM", use_dora=args.use_dora)
        model = peft.get_peft_model(model, config)
    model.train()  # PEFT applies lora_dropout in training mode only
    trainable = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(trainable, lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1)
    ids = torch.randint(0, cfg.vocab_size, (args.batch, args.seq),
                        generator=torch.Generator().manual_seed(1))

    def step():
        opt.zero_grad(set_to_none=True)
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        if args.max_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(trainable, args.max_grad_norm, foreach=True)
        opt.step()
        return loss

    for _ in range(args.warmup):
        step()
    t0 = time.perf_counter()
    for _ in range(args.steps):
        loss = step()
    step_s = (time.perf_counter() - t0) / args.steps
    tokens = args.batch * args.seq
    fpt = flops_per_token(cfg, p_nonemb, args.seq)
    print(json.dumps({
        "impl": ("pytorch+peft+bitsandbytes" if args.quantize != "none" else "pytorch+peft") if args.lora_rank else "pytorch",
        "model": name, "quantize": args.quantize, "tokens_per_s": round(tokens / step_s, 1),
        "step_s": round(step_s, 4), "gflops": round(fpt * tokens / step_s / 1e9, 2),
        "threads": torch.get_num_threads(), "batch": args.batch, "seq": args.seq,
        "attn": cfg._attn_implementation, "flops_per_token": fpt, "params_nonemb": p_nonemb,
        "loss": round(float(loss.detach()), 4), "torch": torch.__version__,
        "lora_rank": args.lora_rank, "lora_dropout": args.lora_dropout, "dora": args.use_dora, "trainable_params": sum(p.numel() for p in trainable),
        "max_grad_norm": args.max_grad_norm, "max_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0)}), flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--attn", choices=("eager", "sdpa"), default="sdpa")
    ap.add_argument("--model", choices=("gpt2-124m", "smollm2-135m", "gemma2-135m", "gemma3-135m", "all"), default="all")
    ap.add_argument("--lora-rank", type=int, default=0)
    ap.add_argument("--lora-dropout", type=float, default=0.0)
    ap.add_argument("--use-dora", action="store_true")
    ap.add_argument("--quantize", choices=("none", "nf4", "nf4-single"), default="none")
    ap.add_argument("--max-grad-norm", type=float, default=1.0)
    args = ap.parse_args()
    if args.max_grad_norm < 0:
        ap.error("--max-grad-norm must be >= 0")
    torch.set_num_threads(args.threads)
    print(f"# {FORMULA}  (see docstring)", file=sys.stderr)
    for name in ("gpt2-124m", "smollm2-135m") if args.model == "all" else (args.model,):
        bench(name, args)


if __name__ == "__main__":
    main()
