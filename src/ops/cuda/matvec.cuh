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
#include "ops/cuda/activation_functions.cuh"
#include "ops/cuda/device_primitives.cuh"

namespace matvec {

enum { WARPS = 4, THREADS = 32 * WARPS, MAX_ROWS = 8, GROUP = 8 };

static inline unsigned blocks_for(int OC) { return (unsigned)((OC + WARPS - 1) / WARPS); }

// Where output column o of row m goes: out[m, o] of one [M, OC] buffer ...
struct Output {
    float *out;
    int OC;
    DEVICE_METHOD float *at(int m, int o) const { return out + (long)m * OC + o; }
};

// ... or, for a weight whose rows are up to 3 matrices one after the other (ops.h's
// matmul_forward_parts), column o - first of its part's own [M, width] buffer. Named fields,
// not arrays: an array of the kernel's parameter indexed by a computed part would be copied
// to local memory (a stack frame, which the build refuses).
struct PartsOutput {
    enum { MAX_PARTS = 3 };
    float *out0, *out1, *out2;
    int width0, width1, width2;
    int first1, first2; // a part that is not there starts past every column (INT_MAX)
    DEVICE_METHOD float *at(int m, int o) const {
        if (o >= first2) return out2 + (long)m * width2 + (o - first2);
        if (o >= first1) return out1 + (long)m * width1 + (o - first1);
        return out0 + (long)m * width0 + o;
    }
};

// The body of a kernel of blocks_for(OC) blocks of THREADS. `weights.load(at, v)` gives the
// 8 weights from flat index `at` (o * IC + c), `rows.load(at, v)` the 8 inputs from m * IC + c.
// M <= MAX_ROWS, IC a multiple of GROUP. out[m, o] = (sum + bias[o]) + addend[m, o], each term
// where given; `addend` ([M, OC]) may be `out` itself (read before it is written, by the same
// lane). Each column's sum is its warp's alone: a part of a PartsOutput gets the bits the
// part's own product would.
template <typename Weights, typename Rows, typename Out>
DEVICE_INLINE void product(Out out, const Weights &weights, Rows rows, const float *bias,
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
        float sum = warp_sum(sums[m]);
        if (lane != 0) continue;
        if (bias) sum += bias[o];
        *out.at(m, o) = addend ? sum + addend[(long)m * OC + o] : sum;
    }
}

// A gated MLP's gate and up products with the gated unit applied (ops.h's
// matmul_forward_glu, matmul_forward_glu_q8): warp o sums row o of `gate_weights` and of
// `up_weights` (each [I, IC]) over the same input values, each in product()'s order (the
// bits of each matrix's own product), then
// act[m, o] = activation(gate) * up as activation_kernels.cuh's GLU kernel computes it, into
// `act` where non-NULL and as bf16 into `act_copy` where non-NULL (a held act's copy, or a
// stored act's own memory). Gate and up are never written. Grid: blocks_for(I) blocks.
template <typename Weights, typename Rows>
DEVICE_INLINE void glu_product(float *act, bf16 *act_copy, const Weights &gate_weights, const Weights &up_weights,
                               Rows rows, int M, int IC, int I, bool use_gelu) {
    const int warp = (int)threadIdx.x / 32, lane = (int)threadIdx.x % 32;
    const int o = (int)blockIdx.x * WARPS + warp;
    if (o >= I) return; // the whole warp: its shuffles below never miss a lane
    float gate_sums[MAX_ROWS], up_sums[MAX_ROWS];
    for (int m = 0; m < MAX_ROWS; m++) gate_sums[m] = up_sums[m] = 0.0f;
    for (long c = (long)lane * GROUP; c < IC; c += 32 * GROUP) {
        float gate_w[GROUP], up_w[GROUP];
        gate_weights.load((long)o * IC + c, gate_w);
        up_weights.load((long)o * IC + c, up_w);
        for (int m = 0; m < MAX_ROWS; m++) {
            if (m >= M) break;
            float x[GROUP];
            rows.load((long)m * IC + c, x);
            float gate_sum = gate_sums[m], up_sum = up_sums[m];
            for (int i = 0; i < GROUP; i++) gate_sum += gate_w[i] * x[i];
            for (int i = 0; i < GROUP; i++) up_sum += up_w[i] * x[i];
            gate_sums[m] = gate_sum, up_sums[m] = up_sum;
        }
    }
    for (int m = 0; m < MAX_ROWS; m++) {
        if (m >= M) break;
        const float gate = warp_sum(gate_sums[m]), up = warp_sum(up_sums[m]);
        if (lane != 0) continue;
        const float y = (use_gelu ? activation_kernels::gelu(gate) : activation_kernels::silu(gate)) * up;
        if (act) act[(long)m * I + o] = y;
        if (act_copy) act_copy[(long)m * I + o] = to_bf16(y);
    }
}

} // namespace matvec
