#!/usr/bin/env python3
"""PyTorch eager peer of the C/CUDA SFT training step (no torch.compile).

One step = forward + causal-LM loss under bf16 autocast (fp32 master weights), backward,
the global gradient norm clipped to --max-grad-norm (1.0, as bench/train_step and `marlhf sft`
do by default; 0 skips it), AdamW step (fused on CUDA), zero_grad(set_to_none=True), on a Llama model built from its
config with random weights and random [B, T] token ids (labels = inputs). --warmup steps
are untimed; --steps steps are timed between torch.cuda.synchronize() calls.
Prints one JSON line on stdout: tokens/s, ms/step, FLOPs/token (see flops_per_token), MFU.
With --profile-steps N, N more steps (after the timed ones, so they do not change the
figures above) run under torch.profiler and a second line ("impl": "pytorch-eager-profile")
says where a step's GPU time goes: kernel time per step by kind (attention, matmul,
optimizer, loss, everything else) and the kernels that take the most, to set beside
bench/ops_breakdown's lines for the C step. On the CPU it reports operators' own CPU time.
"""
import argparse
import json
import math
import platform
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile
from transformers import LlamaConfig, LlamaForCausalLM

SHAPES = {
    "smollm2": dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                    num_attention_heads=9, num_key_value_heads=3, head_dim=64, vocab_size=49152,
                    tie_word_embeddings=True, rope_theta=100000.0, max_position_embeddings=8192),
    "llama1b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                    num_attention_heads=32, num_key_value_heads=8, head_dim=64, vocab_size=32000,
                    tie_word_embeddings=False, rope_theta=500000.0, max_position_embeddings=8192),
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=16, vocab_size=256, tie_word_embeddings=False,
                 rope_theta=10000.0, max_position_embeddings=2048),
}


def build_config(shape, attn):
    return LlamaConfig(**SHAPES[shape], rms_norm_eps=1e-5, attn_implementation=attn,
                       bos_token_id=1, eos_token_id=2, pad_token_id=0)


def flops_per_token(cfg, T):
    """Training FLOPs per token at sequence length T, the formula of bench/bench_shapes.h:
    6 * (matmul weights: q, k, v, o, gate, up, down of every layer + the V x C LM head;
    the embedding lookup is not a matmul) + 6 * layers * heads * head_dim * T (QK^T and PV,
    causal: half of the square counted)."""
    C, I, L = cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers
    H, KV, D = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    per_layer = C * H * D + 2 * C * KV * D + H * D * C + 3 * C * I
    matmul_params = L * per_layer + cfg.vocab_size * C
    return 6 * matmul_params + 6 * L * H * D * T


def device_name(device):
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return platform.processor() or platform.machine()


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# Kinds of kernel (or, on the CPU, operator) by name, the first that matches: attention
# first, since FlashAttention's and cuDNN's kernel names also carry the architecture
# (sm90) that cuBLAS's GEMM names do.
KINDS = (
    ("attention", ("flash", "fmha", "attention", "sdpa", "attn")),
    ("matmul", ("gemm", "xmma", "nvjet", "cutlass", "cublas", "aten::mm", "aten::addmm", "aten::bmm")),
    ("optimizer", ("adam", "multi_tensor", "_foreach")),
    ("loss", ("softmax", "nll", "cross_entropy")),
)


def kind_of(name):
    lowered = name.lower()
    for kind, patterns in KINDS:
        if any(p in lowered for p in patterns):
            return kind
    return "other"


def profile_steps(step, device, steps, result):
    """Runs `steps` steps under torch.profiler; returns the profile line."""
    on_gpu = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_gpu else [])
    with profile(activities=activities) as prof:
        for _ in range(steps):
            step()
        sync(device)
    totals = {}  # name -> [microseconds, calls]
    for event in prof.key_averages():
        if on_gpu:
            if event.device_type != torch.autograd.DeviceType.CUDA:
                continue
            us = event.self_device_time_total
        else:
            # Operators' own time; the profiler's own entries and the step's Python
            # wrappers (no "::") are not operators.
            if "::" not in event.key or event.key.startswith("ProfilerStep"):
                continue
            us = event.self_cpu_time_total
        entry = totals.setdefault(event.key, [0.0, 0])
        entry[0] += us
        entry[1] += event.count
    by_kind = {kind: 0.0 for kind, _ in KINDS}
    by_kind["other"] = 0.0
    for name, (us, _) in totals.items():
        by_kind[kind_of(name)] += us / 1000 / steps
    top = sorted(totals.items(), key=lambda item: -item[1][0])[:20]
    return {
        "impl": "pytorch-eager-profile", "shape": result["shape"], "batch": result["batch"], "seq": result["seq"],
        "profiled_steps": steps, "time": "kernel" if on_gpu else "operator cpu",
        "ms_per_step": {kind: round(ms, 3) for kind, ms in by_kind.items()},
        "total_ms_per_step": round(sum(by_kind.values()), 3),
        "top": [{"name": name[:120], "kind": kind_of(name), "ms_per_step": round(us / 1000 / steps, 3),
                 "calls_per_step": round(calls / steps, 2)} for name, (us, calls) in top],
    }


def run(args, device, result):
    cfg = build_config(args.shape, args.attn)
    cfg.use_cache = False
    with device:  # initialise the weights directly on the device
        model = LlamaForCausalLM(cfg).float().train()
    on_gpu = device.type == "cuda"
    # what is held after the model is made, and between steps (weights + AdamW's moments;
    # the gradients are freed by zero_grad), beside bench/train_step.c's breakdown
    weights_gib = round(torch.cuda.memory_allocated(device) / 2**30, 3) if on_gpu else None
    n_params = sum(p.numel() for p in model.parameters())
    print(f"# {args.shape}: {n_params:,} parameters ({n_params / 1e6:.1f}M), attn={args.attn}",
          file=sys.stderr)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, betas=(0.9, 0.95), weight_decay=0.0,
                            **({"fused": True} if device.type == "cuda" else {}))
    ids = torch.randint(0, cfg.vocab_size, (args.batch, args.seq), device=device)
    labels = ids.clone()

    def step():
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16):
            loss = model(input_ids=ids, labels=labels).loss
        loss.backward()
        if args.max_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.max_grad_norm, foreach=True)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    losses = [step() for _ in range(args.warmup)]
    sync(device)
    between_gib = round(torch.cuda.memory_allocated(device) / 2**30, 3) if on_gpu else None
    t0 = time.perf_counter()
    losses += [step() for _ in range(args.steps)]
    sync(device)
    seconds = time.perf_counter() - t0

    fpt = flops_per_token(cfg, args.seq)
    tokens_per_s = args.batch * args.seq * args.steps / seconds
    result.update({
        "tokens_per_s": round(tokens_per_s, 1),
        "step_ms": round(1000 * seconds / args.steps, 3),
        "flops_per_token": fpt,
        "mfu": float(f"{fpt * tokens_per_s / (args.peak_tflops * 1e12):.4g}"),
        "loss_first": round(losses[0].item(), 4),
        "loss_last": round(losses[-1].item(), 4),
        "peak_mem_gib": (round(torch.cuda.max_memory_allocated(device) / 2**30, 3)
                         if device.type == "cuda" else None),
        "weights_gib": weights_gib,
        "held_between_steps_gib": between_gib,
    })
    print(f"# ln(vocab) = {math.log(cfg.vocab_size):.4f}", file=sys.stderr)
    if args.profile_steps > 0:
        try:  # the timed figure above stands whatever the profiler does
            return profile_steps(step, device, args.profile_steps, result)
        except Exception as e:  # noqa: BLE001 (any profiler failure)
            print(f"# --profile-steps failed: {type(e).__name__}: {e}", file=sys.stderr)
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", choices=sorted(SHAPES), default="smollm2", help="model shape")
    ap.add_argument("--batch", type=int, default=8, help="sequences per step (B)")
    ap.add_argument("--seq", type=int, default=1024, help="tokens per sequence (T)")
    ap.add_argument("--steps", type=int, default=10, help="timed steps")
    ap.add_argument("--warmup", type=int, default=3, help="untimed warm-up steps")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--attn", choices=("sdpa", "eager"), default="sdpa",
                    help="transformers attention implementation")
    ap.add_argument("--max-grad-norm", type=float, default=1.0,
                    help="clip the global gradient norm to this before the AdamW step (0: no clipping)")
    ap.add_argument("--profile-steps", type=int, default=0,
                    help="after the timed steps, profile this many and print where their time goes (a second line)")
    ap.add_argument("--peak-tflops", type=float, default=790.0,
                    help="peak bf16 dense TFLOP/s for the MFU denominator (H200 measured: 790)")
    args = ap.parse_args()
    if args.steps < 1 or args.warmup < 0:
        ap.error("--steps must be >= 1 and --warmup >= 0")
    if args.max_grad_norm < 0:
        ap.error("--max-grad-norm must be >= 0")
    if args.profile_steps < 0:
        ap.error("--profile-steps must be >= 0")

    torch.manual_seed(1234)
    device = torch.device(args.device)
    result = {"impl": "pytorch-eager", "shape": args.shape, "batch": args.batch,
              "seq": args.seq, "steps": args.steps, "max_grad_norm": args.max_grad_norm}
    profile_line = None
    try:
        profile_line = run(args, device, result)
    except torch.cuda.OutOfMemoryError as e:
        print(f"# OOM: {e}", file=sys.stderr)
        result["error"] = "oom"
    result.update({"torch": torch.__version__, "device_name": device_name(device)})
    print(json.dumps(result), flush=True)
    if profile_line:
        print(json.dumps(profile_line), flush=True)


if __name__ == "__main__":
    main()
