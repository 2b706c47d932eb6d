// LayerNorm and RMSNorm: the row kernels of norm_rows.cuh (one block per row, statistics in
// fp64 as on the CPU, a held output's bf16 copy written beside it); weight and bias
// gradients go through column_reduce (fixed order, no atomics).
#include "ops/cuda/cuda_common.cuh"
#include "ops/cuda/norm_rows.cuh"

// A forward's stored output (hold_stored) is written as its bf16 copy only
// (cuda_held_output makes `out` NULL); an empty forward still marks it written.
void cuda_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                            const float *weight, const float *bias, int N, int C, float eps) {
    __nv_bfloat16 *out_copy = cuda_held_output(&out, (long)N * C);
    if (N == 0) return;
    norm_rows::layernorm_forward_kernel<<<N, norm_rows::THREADS, norm_rows::SHARED_BYTES>>>(
        out, out_copy, mean, rstd, inp, weight, bias, C, eps);
    CUDA_CHECK_LAUNCH();
}

struct LayerNormWeightTerm {
    const float *dout, *inp, *mean, *rstd;
    int C;
    __device__ float operator()(int i, int c) const {
        long at = (long)i * C + c;
        return dout[at] * (inp[at] - mean[i]) * rstd[i];
    }
};

struct ColumnOf {
    const float *x;
    int C;
    __device__ float operator()(int i, int c) const { return x[(long)i * C + c]; }
};

void cuda_layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                             const float *inp, const float *weight, const float *mean,
                             const float *rstd, int N, int C) {
    if (N == 0) return;
    if (dinp) {
        norm_rows::layernorm_backward_kernel<<<N, norm_rows::THREADS, norm_rows::SHARED_BYTES>>>(
            dinp, cuda_held_copy_to_write(dinp, (long)N * C), dout, inp, weight, mean, rstd, C);
        CUDA_CHECK_LAUNCH();
    }
    if (dweight) column_reduce(dweight, N, C, LayerNormWeightTerm{dout, inp, mean, rstd, C});
    if (dbias) column_reduce(dbias, N, C, ColumnOf{dout, C});
}

// Rows of four floats at a time when C is a multiple of 4 and every row 16-byte aligned.
static bool rows_by_four(int C, const void *a, const void *b, const void *c, const void *d) {
    return C % 4 == 0 && all_aligned16(a, b, c, d);
}

void cuda_rmsnorm_forward(float *out, float *rstd, const float *inp, const float *weight, int N,
                          int C, float eps, bool weight_plus_one) {
    __nv_bfloat16 *out_copy = cuda_held_output(&out, (long)N * C);
    if (N == 0) return;
    norm_rows::rmsnorm_forward_kernel<<<N, norm_rows::THREADS, norm_rows::SHARED_BYTES>>>(
        out, out_copy, rstd, inp, weight, C, eps, weight_plus_one ? 1.0f : 0.0f,
        rows_by_four(C, out, inp, weight, out_copy));
    CUDA_CHECK_LAUNCH();
}

struct RmsNormWeightTerm {
    const float *dout, *inp, *rstd;
    int C;
    __device__ float operator()(int i, int c) const {
        long at = (long)i * C + c;
        return dout[at] * inp[at] * rstd[i];
    }
};

void cuda_rmsnorm_backward(float *dinp, float *dweight, const float *dout, const float *inp,
                           const float *weight, const float *rstd, int N, int C,
                           bool weight_plus_one) {
    if (N == 0) return;
    if (dinp) {
        norm_rows::rmsnorm_backward_kernel<<<N, norm_rows::THREADS, norm_rows::SHARED_BYTES>>>(
            dinp, cuda_held_copy_to_write(dinp, (long)N * C), dout, inp, weight, rstd, C, weight_plus_one ? 1.0f : 0.0f,
            rows_by_four(C, dinp, dout, inp, weight));
        CUDA_CHECK_LAUNCH();
    }
    if (dweight) column_reduce(dweight, N, C, RmsNormWeightTerm{dout, inp, rstd, C});
}
