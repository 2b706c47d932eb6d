"""The speed part of tests/gpu/run.sh's summary line, from the bench.jsonl its speed runs
wrote (tests/gpu/speed.sh): each training shape's step beside PyTorch's, with the variants
run beside it and each side's peak device memory; decoding at batch 1 and 64 in each way it
was run. A figure that is missing (a benchmark skipped at --time-limit, or one that failed)
reads n/a.

usage: bench_summary.py BENCH.jsonl [--pairs "ours:theirs ..."] [--prompt 32] [--long-prompt 1024]
"""
import argparse
import json

parser = argparse.ArgumentParser()
parser.add_argument("results")
parser.add_argument("--pairs", default="smollm2-135m:smollm2 llama-1b:llama1b",
                    help="training shapes, bench/train_step's name : bench/torch_gpu_train_step.py's")
parser.add_argument("--prompt", type=int, default=32, help="the decode runs' prompt length")
parser.add_argument("--long-prompt", type=int, default=1024, help="the KV-cache runs' prompt length")
args = parser.parse_args()

rows = [json.loads(line) for line in open(args.results) if line.startswith("{")]


def find(impl, **fields):
    for r in rows:
        if r.get("impl") == impl and all(r.get(k) == v for k, v in fields.items()):
            return r
    return {}


def rate(r, key):  # a figure, or n/a for a benchmark skipped or failed
    return f"{r[key]:.0f}" if key in r else "n/a"


def gib(r):  # the most device memory the run held (bench/device_memory.h, PyTorch's max_memory_allocated)
    return f"{r['peak_mem_gib']:.1f}" if r.get("peak_mem_gib") is not None else "n/a"


def picked(r):  # how many of a decode run's tokens came from the device's results (bench/decode.c)
    if "backend_picked_tokens" not in r:
        return ""
    return f" [{r['backend_picked_tokens']} of {r['batch'] * r['new_tokens']} picked on the device]"


def held(r, key):  # a figure of a step's memory breakdown (bench/train_step.c, bench/torch_gpu_train_step.py)
    return f"{r[key]:.1f}" if r.get(key) is not None else "n/a"


def mfu(r):
    return f"{100 * r['mfu']:.1f}%" if "mfu" in r else "n/a"


parts = []
for pair in args.pairs.split():
    ours, theirs = pair.split(":")
    m, t = find("marlhf-cuda", model=ours), find("pytorch-eager", shape=theirs)
    u, a = find("marlhf-cuda-unfused", model=ours), find("marlhf-cuda-wmma", model=ours)
    p = find("marlhf-cuda-mma-plain", model=ours)
    s = find("marlhf-cuda-mma-ds", model=ours)
    three = find("marlhf-cuda", model=ours, fused_qkv=False)  # MARLHF_FUSED_QKV=0 (the shape behind PyTorch only)
    unstored = find("marlhf-cuda", model=ours, stored_inputs=False)
    tps = "tokens_per_s"
    parts.append(f"{ours} step {rate(m, tps)} tok/s MFU {mfu(m)} "
                 f"(mma-plain {rate(p, tps)}, mma-ds {rate(s, tps)}, wmma {rate(a, tps)}, unfused {rate(u, tps)}; "
                 f"q/k/v as three products {rate(three, tps)}, stores off {rate(unstored, tps)}) "
                 f"vs pytorch {rate(t, tps)} tok/s MFU {mfu(t)}; peak memory {gib(m)} vs {gib(t)} GiB "
                 f"(weights {held(m, 'weights_gib')} vs {held(t, 'weights_gib')}, between steps "
                 f"{held(m, 'held_between_steps_gib')} vs {held(t, 'held_between_steps_gib')})")
key = "decode_tokens_per_s"
for batch in (1, 64):
    m = find("marlhf-cuda", batch=batch, quantize="none", prompt=args.prompt, temperature=0, folded_norms=True)
    unfolded = find("marlhf-cuda", batch=batch, quantize="none", prompt=args.prompt, folded_norms=False)
    t = find("transformers-generate", batch=batch, temperature=0, prompt_len=args.prompt)
    sampled = find("marlhf-cuda", batch=batch, quantize="none", prompt=args.prompt, temperature=0.8)
    whole_row = find("marlhf-cuda", batch=batch, quantize="none", prompt=args.prompt, temperature=1, top_k=0, top_p=1)
    nucleus = find("marlhf-cuda", batch=batch, quantize="none", prompt=args.prompt, temperature=0.1, top_p=0.9)
    sampled_peer = find("transformers-generate", batch=batch, temperature=0.8)
    nucleus_peer = find("transformers-generate", batch=batch, temperature=0.1, top_p=0.9)
    q8, qk = find("marlhf-cuda", batch=batch, quantize="q8_0"), find("marlhf-cuda", batch=batch, quantize="q4_k_m")
    q5 = find("marlhf-cuda", batch=batch, quantize="q5_k_m")
    b16 = find("marlhf-cuda", batch=batch, quantize="bf16")
    # MARLHF_UNFOLDED_NORMS=1 runs batches 1 and 8 only (a batch of 64 folds nothing)
    unfolded_text = f"norms unfolded {rate(unfolded, key)}; " if batch == 1 else ""
    parts.append(f"decode B{batch} {rate(m, key)} vs {rate(t, key)} tok/s ({gib(m)} vs {gib(t)} GiB) "
                 f"({unfolded_text}q8_0 {rate(q8, key)}, q4_k_m {rate(qk, key)}, q5_k_m {rate(q5, key)}, "
                 f"bf16 {rate(b16, key)} in {gib(b16)} GiB; "
                 f"top-k 50 {rate(sampled, key)} vs {rate(sampled_peer, key)}; temperature 1 no top-k {rate(whole_row, key)}; "
                 f"top-p 0.9 {rate(nucleus, key)} vs {rate(nucleus_peer, key)}{picked(nucleus)})")
    caches = [(kv, find("marlhf-cuda", batch=batch, quantize="none", prompt=args.long_prompt, kv_cache=kv))
              for kv in ("f32", "f16", "q8_0")]
    long_peer = find("transformers-generate", batch=batch, prompt_len=args.long_prompt)
    parts.append(f"after {args.long_prompt} prompt tokens B{batch} " +
                 ", ".join(f"{kv} cache {rate(r, key)}" for kv, r in caches) + f" vs {rate(long_peer, key)} tok/s")
print("; ".join(parts))
