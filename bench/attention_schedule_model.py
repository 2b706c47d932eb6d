#!/usr/bin/env python3
"""A model, not a measurement: how the order of the mma attention kernels' blocks
(src/ops/cuda/attention_mma.cuh) sets how long the GPU's SMs wait on the last blocks.

Under the causal mask the blocks' work differs: a forward (or dQ) block of query rows
walks every key tile up to its rows, a dK/dV block of keys every query tile from its
keys on (for each query head of its group). Blocks start in launch order, x fastest,
each on the first free slot (SMs x resident blocks per SM). The model gives each block
a time proportional to its tiles plus a fixed start-up cost, puts blocks on slots in a
given order, and prints the time at which the last one ends, for the grids before
2026-12-05 (tiles along x: each head's tiles together, so the last head's longest tile
could start among the last blocks) and after (heads along x, tiles along y from the
longest: the longest blocks of every head start first). The ideal is the work spread
evenly over the slots.

It ignores that co-resident blocks share an SM (a block left alone on an SM runs faster),
so it overstates what an idle slot costs; the GPU run is the measurement
(bench/ops_breakdown: "attention forward" / "attention backward").

usage: bench/attention_schedule_model.py [--batch 8] [--seq 1024] [--heads 32] [--kv-heads 8]
           [--sms 132] [--forward-blocks 2] [--kv-blocks 2] [--q-blocks 3] [--forward-rows 128]
"""
import argparse
import heapq


def finish_time(durations, slots, start_cost):
    """List scheduling in the given order: each block takes the slot that frees first."""
    free_at = [0.0] * slots
    for duration in durations:
        start = heapq.heappop(free_at)
        heapq.heappush(free_at, start + start_cost + duration)
    return max(free_at)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--sms", type=int, default=132, help="SMs (132 on an H100/H200)")
    ap.add_argument("--forward-blocks", type=int, default=2, help="forward blocks per SM (TUNED, head_dim 64)")
    ap.add_argument("--kv-blocks", type=int, default=2, help="dK/dV blocks per SM")
    ap.add_argument("--q-blocks", type=int, default=3, help="dQ blocks per SM")
    ap.add_argument("--forward-rows", type=int, default=128, help="query rows per forward block (64 at head_dim 128)")
    ap.add_argument("--start-cost", type=float, default=0.5, help="a block's fixed cost, in key-tile steps")
    args = ap.parse_args()
    B, T, H, KV = args.batch, args.seq, args.heads, args.kv_heads
    tile = 64  # key (and backward) tile rows
    tiles = (T + tile - 1) // tile
    group = H // KV

    # Forward: a block of `rows` query rows from q0 walks key tiles 0 .. (q0 + rows - 1) / 64.
    rows = args.forward_rows
    forward_tiles = (T + rows - 1) // rows
    def forward_work(i):  # i = 0 is the longest (the last rows)
        q0 = (forward_tiles - 1 - i) * rows
        return min(q0 + rows, T) - 1
    forward_steps = [forward_work(i) // tile + 1 for i in range(forward_tiles)]
    # dK/dV: key tile k is seen by query tiles k .. tiles - 1 of each head of the group.
    kv_steps = [group * (tiles - k) for k in range(tiles)]
    # dQ: query tile from the longest walks tiles - i key tiles.
    q_steps = [tiles - i for i in range(tiles)]

    kernels = [("forward", forward_steps, B * H, args.forward_blocks),
               ("dK/dV", kv_steps, B * KV, args.kv_blocks),
               ("dQ", q_steps, B * H, args.q_blocks)]
    for name, steps, heads, per_sm in kernels:
        slots = args.sms * per_sm
        tiles_along_x = [s for _ in range(heads) for s in steps]   # before 2026-12-05
        heads_along_x = [s for s in steps for _ in range(heads)]   # after
        ideal = sum(s + args.start_cost for s in tiles_along_x) / slots
        before = finish_time(tiles_along_x, slots, args.start_cost)
        after = finish_time(heads_along_x, slots, args.start_cost)
        print(f"{name:8s} ideal {ideal:7.1f}  tiles along x {before:7.1f}  heads along x {after:7.1f}"
              f"  (before / after {before / after:.3f})")


if __name__ == "__main__":
    main()
