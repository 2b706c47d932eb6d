// The decode-step product with a quantized weight: out[M, OC] = inp[M, IC] . W[OC, IC]^T (+ bias)
// for a few input rows (M <= MAX_ROWS: one token per sequence of a small decoding batch), read
// straight from the weight's blocks and accumulated in fp32. The tiled path (matmul_quantized.cu)
// writes the whole weight as a bf16 tile and reads it back for cuBLASLt at every step; here the
// blocks are read once and nothing is written but the output, which is what a decode step of a
// memory-bound product should cost.
//
// One warp per output column o: lane l decodes values [8 (l + 32 k), 8 (l + 32 k) + 8) of row o
// (dequantize.cuh decode8: the CPU's dequantized floats, bit for bit), multiplies them with the
// same 8 values of each input row, and the 32 lanes' sums are added by shuffles. The warp reads
// 32 consecutive groups of 8 weights at a time (256 bytes of Q8_0 codes, 128 of 4-bit ones) and
// the matching 1 KB of each input row. The inputs stay fp32 (no bf16 rounding, unlike the tiled
// path), so the result differs from the CPU's float product only in the order of the fp32 sums:
// tests/test_dequantize_emulated.cpp holds it to 1e-5 of sum |x| |w| per output.
#pragma once
#include "ops/cuda/dequantize.cuh"

namespace matvec {

enum { WARPS = 4, THREADS = 32 * WARPS, MAX_ROWS = 8, GROUP = dequantize::VALUES_PER_THREAD };

static inline unsigned blocks_for(int OC) { return (unsigned)((OC + WARPS - 1) / WARPS); }

// Grid: blocks_for(OC) blocks of THREADS. M <= MAX_ROWS, IC a multiple of 8.
static __global__ void __launch_bounds__(THREADS) kernel(float *out, const float *inp, dequantize::Weights w,
                                                         const float *bias, int M, int IC, int OC) {
    const int warp = (int)threadIdx.x / 32, lane = (int)threadIdx.x % 32;
    const int o = (int)blockIdx.x * WARPS + warp;
    if (o >= OC) return; // the whole warp: its shuffles below never miss a lane
    float sums[MAX_ROWS];
    for (int m = 0; m < MAX_ROWS; m++) sums[m] = 0.0f;
    for (long c = (long)lane * GROUP; c < IC; c += 32 * GROUP) {
        float weights[GROUP];
        dequantize::decode8(w, (long)o * IC + c, weights);
        // Unrolled over MAX_ROWS with a guard, so `sums` stays in registers.
        for (int m = 0; m < MAX_ROWS; m++) {
            if (m >= M) break;
            const float *x = inp + (long)m * IC + c;
            float sum = sums[m];
            for (int i = 0; i < GROUP; i++) sum += weights[i] * x[i];
            sums[m] = sum;
        }
    }
    for (int m = 0; m < MAX_ROWS; m++) {
        if (m >= M) break;
        float sum = sums[m];
        for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
        if (lane == 0) out[(long)m * OC + o] = bias ? sum + bias[o] : sum;
    }
}

} // namespace matvec
