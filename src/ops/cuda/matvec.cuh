// The decode-step product: out[M, OC] = x[M, IC] . W[OC, IC]^T (+ bias) (+ addend) for a few
// input rows (M <= MAX_ROWS: one token per sequence of a small decoding batch), where a
// product is too small for a tiled GEMM to pay: every weight read once, nothing written but
// the output, one launch. Two users, which differ only in how a group of 8 weights and of 8
// input values is read: matvec_quantized.cuh (a quantized weight's blocks decoded, the
// inputs' floats as they are) and matvec_bf16.cuh (a float weight's bf16 copy, the inputs
// rounded to bf16 as cuBLASLt gets them).
//
// One warp per output column o: lane l reads groups [8 (l + 32 k), 8 (l + 32 k) + 8) of row o
// and the same 8 values of each input row, adds their products in fp32 in order, and the 32
// lanes' sums are added by shuffles.
#pragma once
#include "ops/cuda/device_primitives.cuh"

namespace matvec {

enum { WARPS = 4, THREADS = 32 * WARPS, MAX_ROWS = 8, GROUP = 8 };

static inline unsigned blocks_for(int OC) { return (unsigned)((OC + WARPS - 1) / WARPS); }

// The body of a kernel of blocks_for(OC) blocks of THREADS. `weights.load(at, v)` gives the
// 8 weights from flat index `at` (o * IC + c), `rows.load(at, v)` the 8 inputs from m * IC + c.
// M <= MAX_ROWS, IC a multiple of GROUP. out[m, o] = (sum + bias[o]) + addend[m, o], each term
// where given; `addend` may be `out` itself (read before it is written, by the same lane).
template <typename Weights, typename Rows>
DEVICE_INLINE void product(float *out, const Weights &weights, Rows rows, const float *bias,
                           const float *addend, int M, int IC, int OC) {
    const int warp = (int)threadIdx.x / 32, lane = (int)threadIdx.x % 32;
    const int o = (int)blockIdx.x * WARPS + warp;
    if (o >= OC) return; // the whole warp: its shuffles below never miss a lane
    float sums[MAX_ROWS];
    for (int m = 0; m < MAX_ROWS; m++) sums[m] = 0.0f;
    for (long c = (long)lane * GROUP; c < IC; c += 32 * GROUP) {
        float w[GROUP];
        weights.load((long)o * IC + c, w);
        // Unrolled over MAX_ROWS with a guard, so `sums` stays in registers.
        for (int m = 0; m < MAX_ROWS; m++) {
            if (m >= M) break;
            float x[GROUP];
            rows.load((long)m * IC + c, x);
            float sum = sums[m];
            for (int i = 0; i < GROUP; i++) sum += w[i] * x[i];
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

} // namespace matvec
