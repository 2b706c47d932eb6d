// The decode-step product with a float weight: out[M, OC] = x[M, IC] . W[OC, IC]^T (+ bias)
// (+ addend) for a few input rows (M <= MAX_ROWS: one token per sequence of a small decoding
// batch), in place of cuBLASLt (matmul.cu). At these sizes a product takes the GPU a few
// microseconds and cuBLASLt's call about as long on the host, so a decode step of a small
// model is host-bound (docs/cuda.md, "Speed": SmolLM2-135M at batch 1 decoded faster with
// Q8_0 weights, whose products were already a kernel of our own, matvec_quantized.cuh, than
// with float ones); one plain launch per product, the bias and the residual included,
// leaves less to the host.
//
// The operands are cuBLASLt's: the weight's cached bf16 copy and the input rounded to bf16 (a
// held input's copy, or its floats rounded here as cuda_to_bf16 rounds them, which saves that
// conversion's launch), products added in fp32. Only the order of the sums differs from
// cuBLASLt's, which no caller relies on (its own order changes with the row count).
//
// One warp per output column o: lane l reads weights [8 (l + 32 k), 8 (l + 32 k) + 8) of row
// o (16 bytes) and the same 8 values of each input row, and the 32 lanes' sums are added by
// shuffles; tests/gpu/test_cuda.c's matmul checks hold it to the CPU's product as cuBLASLt's.
#pragma once
#include "ops/cuda/device_primitives.cuh"

namespace matvec_bf16 {

enum { WARPS = 4, THREADS = 32 * WARPS, MAX_ROWS = 8, GROUP = 8 };

static inline unsigned blocks_for(int OC) { return (unsigned)((OC + WARPS - 1) / WARPS); }

// The input rows: a bf16 copy, or floats rounded as they are read. 16-byte aligned rows.
struct Input {
    const bf16 *copy; // NULL: read `floats`
    const float *floats;
    DEVICE_METHOD void load(long at, float values[GROUP]) const {
        if (copy) {
            load_bf16x8(values, copy + at);
            return;
        }
        load_float4(values, floats + at);
        load_float4(values + 4, floats + at + 4);
        for (int i = 0; i < GROUP; i++) values[i] = from_bf16(to_bf16(values[i]));
    }
};

// Grid: blocks_for(OC) blocks of THREADS. M <= MAX_ROWS, IC a multiple of GROUP, the weight
// and the input 16-byte aligned. out[m, o] = (sum + bias[o]) + addend[m, o], each term where
// given; `addend` may be `out` itself (read before it is written, by the same lane).
static __global__ void __launch_bounds__(THREADS) kernel(float *out, const bf16 *weight, Input x, const float *bias,
                                                         const float *addend, int M, int IC, int OC) {
    const int warp = (int)threadIdx.x / 32, lane = (int)threadIdx.x % 32;
    const int o = (int)blockIdx.x * WARPS + warp;
    if (o >= OC) return; // the whole warp: its shuffles below never miss a lane
    float sums[MAX_ROWS];
    for (int m = 0; m < MAX_ROWS; m++) sums[m] = 0.0f;
    for (long c = (long)lane * GROUP; c < IC; c += 32 * GROUP) {
        float weights[GROUP];
        load_bf16x8(weights, weight + (long)o * IC + c);
        // Unrolled over MAX_ROWS with a guard, so `sums` stays in registers.
        for (int m = 0; m < MAX_ROWS; m++) {
            if (m >= M) break;
            float values[GROUP];
            x.load((long)m * IC + c, values);
            float sum = sums[m];
            for (int i = 0; i < GROUP; i++) sum += weights[i] * values[i];
            sums[m] = sum;
        }
    }
    for (int m = 0; m < MAX_ROWS; m++) {
        if (m >= M) break;
        float sum = sums[m];
        for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
        if (lane != 0) continue;
        if (bias) sum += bias[o];
        const long at = (long)m * OC + o;
        out[at] = addend ? sum + addend[at] : sum;
    }
}

} // namespace matvec_bf16
