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
//
// An input that is an RMSNorm's output (ops.h's InputRmsNorm) can be normalised as it is
// read (RowNorm, NormedRows below): the norm's launch spared, twice a layer.
#pragma once
#include "ops/cuda/activation_functions.cuh"
#include "ops/cuda/device_primitives.cuh"
#include "ops/cuda/norm_functions.cuh"
#include "ops/ops.h"

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
// 8 weights from flat index `at` (o * IC + c), `rows.load(m, at, v)` the 8 inputs of row m
// from at = m * IC + c.
// M <= MAX_ROWS, IC a multiple of GROUP. out[m, o] = (sum + bias[o]) + addend[m, o], each term
// where given; `addend` ([M, OC]) may be `out` itself (read before it is written, by the same
// lane). Each column's sum is its warp's alone: a part of a PartsOutput gets the bits the
// part's own product would.
template <typename Weights, typename Rows, typename Out>
DEVICE_INLINE void product_column(Out out, const Weights &weights, Rows rows, const float *bias, const float *addend,
                                  int M, int IC, int OC, int o);

template <typename Weights, typename Rows, typename Out>
DEVICE_INLINE void product(Out out, const Weights &weights, Rows rows, const float *bias,
                           const float *addend, int M, int IC, int OC) {
    const int o = (int)blockIdx.x * WARPS + (int)threadIdx.x / 32;
    if (o >= OC) return; // the whole warp: its shuffles below never miss a lane
    product_column(out, weights, rows, bias, addend, M, IC, OC, o);
}

// Column o < OC of product(), by the whole warp: what a kernel whose blocks serve several
// weights (matmul_quantized.cu's parts_columns) calls for each.
template <typename Weights, typename Rows, typename Out>
DEVICE_INLINE void product_column(Out out, const Weights &weights, Rows rows, const float *bias, const float *addend,
                                  int M, int IC, int OC, int o) {
    const int lane = (int)threadIdx.x % 32;
    float sums[MAX_ROWS];
    for (int m = 0; m < MAX_ROWS; m++) sums[m] = 0.0f;
    for (long c = (long)lane * GROUP; c < IC; c += 32 * GROUP) {
        float w[GROUP];
        weights.load((long)o * IC + c, w);
        // Unrolled over MAX_ROWS with a guard, so `sums` stays in registers.
        for (int m = 0; m < MAX_ROWS; m++) {
            if (m >= M) break;
            float x[GROUP];
            rows.load(m, (long)m * IC + c, x);
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
            rows.load(m, (long)m * IC + c, x);
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

// ---- An RMSNorm applied to the input rows as they are read ----
//
// A decode step's norm output is read by one product only (q/k/v's, or gate/up's), so that
// product can normalise each row itself. Every block finds the M rows' inverse RMS on its
// own, as norm_rows.cuh's rmsnorm_forward_kernel does -- the same 256 shares of the sum of
// squares (rms_sum_squares_share), each warp's added by the same shuffles, the 8 warps' in
// order -- and each value is that kernel's x * s * (offset + w): a product gets the bits it
// gets from the norm's output. The price is every block reading the M input rows once more
// (from L2: hidden size x M floats).
struct RowNorm {
    const float *x;      // [M, IC]: the norm's input rows (16-byte aligned)
    const float *weight; // [IC]
    float eps, offset;   // offset: 1 for Gemma's (1 + w) weights, else 0
    bool by_four;        // rmsnorm_forward_kernel's `by_four` (the order of each share's squares)
};

// An op's InputRmsNorm over rows of IC: by_four as cuda_rmsnorm_forward chooses it for the
// model's buffers (its output and the output's copy are allocations, so 16-byte aligned).
static inline RowNorm row_norm(const InputRmsNorm *norm, int IC) {
    const bool by_four = IC % 4 == 0 && (uintptr_t)norm->x % 16 == 0 && (uintptr_t)norm->weight % 16 == 0;
    return {norm->x, norm->weight, norm->eps, norm->weight_plus_one ? 1.0f : 0.0f, by_four};
}

constexpr int NORM_WARPS = norm_rows::THREADS / 32;
static_assert((int)norm_rows::THREADS == 2 * (int)THREADS, "each thread adds two of the norm kernel's shares");

// Called by every thread of the block, before any warp leaves: scales[m] (shared) is row m's
// inverse RMS for m < M on return. slots: MAX_ROWS * NORM_WARPS doubles of shared memory.
// Thread t adds the norm kernel's shares t and t + THREADS, which are lane t % 32 of that
// kernel's warps t / 32 and t / 32 + WARPS.
DEVICE_INLINE void row_inverse_rms(float *scales, double *slots, const RowNorm &norm, int M, int IC) {
    const int warp = (int)threadIdx.x / 32, lane = (int)threadIdx.x % 32;
    for (int m = 0; m < MAX_ROWS; m++) {
        if (m >= M) break;
        for (int half = 0; half < 2; half++) {
            const int share = (int)threadIdx.x + half * THREADS;
            const double sum = warp_sum(norm_rows::rms_sum_squares_share(norm.x + (long)m * IC, IC, share, norm.by_four));
            if (lane == 0) slots[m * NORM_WARPS + warp + half * WARPS] = sum;
        }
    }
    __syncthreads();
    if ((int)threadIdx.x < M) {
        double total = 0;
        for (int w = 0; w < NORM_WARPS; w++) total += slots[threadIdx.x * NORM_WARPS + w];
        scales[threadIdx.x] = norm_rows::rms_inverse(total, IC, norm.eps);
    }
    __syncthreads();
}

// Input rows normalised as they are read, then (ROUND_TO_BF16, the float weights' path)
// rounded to bf16 as that path's operand is.
template <bool ROUND_TO_BF16> struct NormedRows {
    RowNorm norm;
    const float *scales; // row_inverse_rms's
    int IC;
    DEVICE_METHOD void load(int m, long at, float values[GROUP]) const {
        const long c = at - (long)m * IC;
        float x[GROUP], w[GROUP];
        if (norm.by_four) { // 16-byte aligned rows and weight, c a multiple of 8
            load_float4(x, norm.x + at);
            load_float4(x + 4, norm.x + at + 4);
            load_float4(w, norm.weight + c);
            load_float4(w + 4, norm.weight + c + 4);
        } else {
            for (int i = 0; i < GROUP; i++) x[i] = norm.x[at + i], w[i] = norm.weight[c + i];
        }
        const float s = scales[m];
        for (int i = 0; i < GROUP; i++) {
            const float value = norm_rows::rms_normalised(x[i], s, norm.offset, w[i]);
            values[i] = ROUND_TO_BF16 ? from_bf16(to_bf16(value)) : value;
        }
    }
};

} // namespace matvec
