// The decode-step product with a float weight (matvec.cuh): out[M, OC] = x[M, IC] . W[OC, IC]^T
// (+ bias) (+ addend), in place of cuBLASLt (matmul.cu's matvec_product). At these sizes a
// product takes the GPU a few microseconds and cuBLASLt's call about as long on the host, so
// a decode step of a small model is host-bound (docs/cuda.md, "Speed": SmolLM2-135M at batch
// 1 decoded faster with Q8_0 weights, whose products were already matvec_quantized.cuh's
// kernel, than with float ones); one plain launch per product, the bias and the residual
// included, leaves less to the host.
//
// The operands are cuBLASLt's: the weight's cached bf16 copy (16 bytes a lane) and the input
// rounded to bf16 -- a held input's copy, or its floats rounded here as cuda_to_bf16 rounds
// them, which spares that conversion's launch; either gives the same bits. Products added in
// fp32: only the order of the sums differs from cuBLASLt's, which no caller relies on (its
// own order changes with the row count). tests/gpu/test_cuda.c's matmul checks hold it to
// the CPU's product as they hold cuBLASLt's.
#pragma once
#include "ops/cuda/matvec.cuh"

namespace matvec {

struct Bf16Weights {
    const bf16 *w; // 16-byte aligned, rows of IC (a multiple of 8)
    DEVICE_METHOD void load(long at, float values[GROUP]) const { load_bf16x8(values, w + at); }
};

// The input rows: a bf16 copy, or floats rounded as they are read. 16-byte aligned rows.
struct Bf16Rows {
    const bf16 *copy; // NULL: read `floats`
    const float *floats;
    DEVICE_METHOD void load(int, long at, float values[GROUP]) const {
        if (copy) {
            load_bf16x8(values, copy + at);
            return;
        }
        load_float4(values, floats + at);
        load_float4(values + 4, floats + at + 4);
        for (int i = 0; i < GROUP; i++) values[i] = from_bf16(to_bf16(values[i]));
    }
};

// Grid: blocks_for(OC) blocks of THREADS. Out: Output, or PartsOutput (matmul_forward_parts).
template <typename Out>
static __global__ void __launch_bounds__(THREADS) bf16_kernel(Out out, const bf16 *weight, Bf16Rows x,
                                                              const float *bias, const float *addend, int M, int IC,
                                                              int OC) {
    product(out, Bf16Weights{weight}, x, bias, addend, M, IC, OC);
}

// Grid: blocks_for(I) blocks of THREADS; weight [2I, IC], gate's rows then up's.
static __global__ void __launch_bounds__(THREADS) bf16_glu_kernel(float *act, bf16 *act_copy, const bf16 *weight,
                                                                  Bf16Rows x, int M, int IC, int I, bool use_gelu) {
    glu_product(act, act_copy, Bf16Weights{weight}, Bf16Weights{weight + (long)I * IC}, x, M, IC, I, use_gelu);
}

// The same two kernels over an RMSNorm's input rows, normalised as they are read (RowNorm):
// the bits of the norm kernel then bf16_kernel / bf16_glu_kernel.
template <typename Out>
static __global__ void __launch_bounds__(THREADS)
    bf16_normed_kernel(Out out, const bf16 *weight, RowNorm norm, const float *bias, int M, int IC, int OC) {
    STATIC_SHARED(float, scales, MAX_ROWS);
    STATIC_SHARED(double, slots, MAX_ROWS * NORM_WARPS);
    row_inverse_rms(scales, slots, norm, M, IC);
    product(out, Bf16Weights{weight}, NormedRows<true>{norm, scales, IC}, bias, nullptr, M, IC, OC);
}

static __global__ void __launch_bounds__(THREADS) bf16_normed_glu_kernel(float *act, bf16 *act_copy, const bf16 *weight,
                                                                         RowNorm norm, int M, int IC, int I,
                                                                         bool use_gelu) {
    STATIC_SHARED(float, scales, MAX_ROWS);
    STATIC_SHARED(double, slots, MAX_ROWS * NORM_WARPS);
    row_inverse_rms(scales, slots, norm, M, IC);
    glu_product(act, act_copy, Bf16Weights{weight}, Bf16Weights{weight + (long)I * IC},
                NormedRows<true>{norm, scales, IC}, M, IC, I, use_gelu);
}

} // namespace matvec
