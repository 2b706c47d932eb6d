// LayerNorm and RMSNorm: one block per row. Row statistics are summed in double, as on
// the CPU; weight and bias gradients go through column_reduce (fixed order, no atomics).
// A norm's output is a matmul's input: the forward's feeds the q/k/v (up/gate) products,
// the backward's (the residual stream's gradient) the output gradient of the previous
// block's last product. When the model holds it (matmul_input_hold) the kernel writes its
// bf16 copy beside it (`*_copy`, else NULL), sparing that product a read of the whole
// output to convert it.
#include "ops/cuda/cuda_common.cuh"

enum { NORM_THREADS = 256 };

__global__ static void layernorm_forward_kernel(float *out, __nv_bfloat16 *out_copy, float *mean, float *rstd,
                                                const float *inp, const float *weight,
                                                const float *bias, int C, float eps) {
    long row = blockIdx.x;
    const float *x = inp + row * C;
    double sum = 0;
    for (int c = threadIdx.x; c < C; c += blockDim.x) sum += x[c];
    double mu = block_sum(sum) / C;
    double var = 0;
    for (int c = threadIdx.x; c < C; c += blockDim.x) var += (x[c] - mu) * (x[c] - mu);
    var = block_sum(var) / C;
    float s = (float)(1.0 / sqrt(var + eps)), m = (float)mu;
    float *y = out + row * C;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        y[c] = (x[c] - m) * s * weight[c] + (bias ? bias[c] : 0.0f);
        if (out_copy) out_copy[row * C + c] = __float2bfloat16(y[c]);
    }
    if (threadIdx.x == 0) {
        mean[row] = m;
        rstd[row] = s;
    }
}

void cuda_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                            const float *weight, const float *bias, int N, int C, float eps) {
    if (N == 0) return;
    layernorm_forward_kernel<<<N, NORM_THREADS>>>(out, cuda_held_copy_to_write(out, (long)N * C), mean, rstd, inp,
                                                  weight, bias, C, eps);
    CUDA_CHECK_LAUNCH();
}

__global__ static void layernorm_backward_kernel(float *dinp, __nv_bfloat16 *dinp_copy, const float *dout,
                                                 const float *inp, const float *weight, const float *mean,
                                                 const float *rstd, int C) {
    long row = blockIdx.x;
    const float *x = inp + row * C, *dy = dout + row * C;
    float m = mean[row], s = rstd[row];
    double sum_g = 0, sum_g_xhat = 0;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        float g = dy[c] * weight[c];
        sum_g += g;
        sum_g_xhat += (double)g * ((x[c] - m) * s);
    }
    float mean_g = (float)(block_sum(sum_g) / C);
    float mean_g_xhat = (float)(block_sum(sum_g_xhat) / C);
    float *dx = dinp + row * C;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        float xhat = (x[c] - m) * s;
        dx[c] += s * (dy[c] * weight[c] - mean_g - xhat * mean_g_xhat);
        if (dinp_copy) dinp_copy[row * C + c] = __float2bfloat16(dx[c]);
    }
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
        layernorm_backward_kernel<<<N, NORM_THREADS>>>(dinp, cuda_held_copy_to_write(dinp, (long)N * C), dout, inp,
                                                       weight, mean, rstd, C);
        CUDA_CHECK_LAUNCH();
    }
    if (dweight) column_reduce(dweight, N, C, LayerNormWeightTerm{dout, inp, mean, rstd, C});
    if (dbias) column_reduce(dbias, N, C, ColumnOf{dout, C});
}

// RMSNorm runs twice a layer and once more at the end; when C is a multiple of 4 and every
// row 16-byte aligned (the model's activations always are) a thread reads and writes
// float4s (cuda_common.cuh's Four). Each thread then sums its four squares in order; the
// per-element formulas are the same.
static bool rows_by_four(int C, const void *a, const void *b, const void *c, const void *d) {
    return C % 4 == 0 && all_aligned16(a, b, c, d);
}

__global__ static void rmsnorm_forward_kernel(float *out, __nv_bfloat16 *out_copy, float *rstd, const float *inp,
                                              const float *weight, int C, float eps,
                                              float offset, bool by_four) {
    long row = blockIdx.x;
    const float *x = inp + row * C;
    float *y = out + row * C;
    double sum_sq = 0;
    if (by_four) {
        for (int c = 4 * threadIdx.x; c < C; c += 4 * blockDim.x) {
            const Four v = load_four(x, c, C, true);
            for (int k = 0; k < 4; k++) sum_sq += (double)v.x[k] * v.x[k];
        }
    } else {
        for (int c = threadIdx.x; c < C; c += blockDim.x) sum_sq += (double)x[c] * x[c];
    }
    float s = (float)(1.0 / sqrt(block_sum(sum_sq) / C + eps));
    if (by_four) {
        for (int c = 4 * threadIdx.x; c < C; c += 4 * blockDim.x) {
            const Four v = load_four(x, c, C, true), w = load_four(weight, c, C, true);
            Four result;
            for (int k = 0; k < 4; k++) result.x[k] = v.x[k] * s * (offset + w.x[k]);
            store_four(y, c, C, true, result);
            store_four_bf16(out_copy ? out_copy + row * C : NULL, c, C, true, result);
        }
    } else {
        for (int c = threadIdx.x; c < C; c += blockDim.x) {
            y[c] = x[c] * s * (offset + weight[c]);
            if (out_copy) out_copy[row * C + c] = __float2bfloat16(y[c]);
        }
    }
    if (threadIdx.x == 0) rstd[row] = s;
}

void cuda_rmsnorm_forward(float *out, float *rstd, const float *inp, const float *weight, int N,
                          int C, float eps, bool weight_plus_one) {
    if (N == 0) return;
    rmsnorm_forward_kernel<<<N, NORM_THREADS>>>(out, cuda_held_copy_to_write(out, (long)N * C), rstd, inp, weight, C,
                                                eps, weight_plus_one ? 1.0f : 0.0f,
                                                rows_by_four(C, out, inp, weight, NULL));
    CUDA_CHECK_LAUNCH();
}

__global__ static void rmsnorm_backward_kernel(float *dinp, __nv_bfloat16 *dinp_copy, const float *dout,
                                               const float *inp, const float *weight, const float *rstd, int C,
                                               float offset, bool by_four) {
    long row = blockIdx.x;
    const float *x = inp + row * C, *dy = dout + row * C;
    float s = rstd[row];
    float *dx = dinp + row * C;
    double sum_g_xhat = 0;
    if (by_four) {
        for (int c = 4 * threadIdx.x; c < C; c += 4 * blockDim.x) {
            const Four g = load_four(dy, c, C, true), w = load_four(weight, c, C, true), v = load_four(x, c, C, true);
            for (int k = 0; k < 4; k++) sum_g_xhat += (double)g.x[k] * (offset + w.x[k]) * v.x[k] * s;
        }
    } else {
        for (int c = threadIdx.x; c < C; c += blockDim.x)
            sum_g_xhat += (double)dy[c] * (offset + weight[c]) * x[c] * s;
    }
    float mean_g_xhat = (float)(block_sum(sum_g_xhat) / C);
    if (by_four) {
        for (int c = 4 * threadIdx.x; c < C; c += 4 * blockDim.x) {
            const Four g = load_four(dy, c, C, true), w = load_four(weight, c, C, true), v = load_four(x, c, C, true);
            Four d = load_four(dx, c, C, true);
            for (int k = 0; k < 4; k++) d.x[k] += s * (g.x[k] * (offset + w.x[k]) - v.x[k] * s * mean_g_xhat);
            store_four(dx, c, C, true, d);
            store_four_bf16(dinp_copy ? dinp_copy + row * C : NULL, c, C, true, d);
        }
    } else {
        for (int c = threadIdx.x; c < C; c += blockDim.x) {
            dx[c] += s * (dy[c] * (offset + weight[c]) - x[c] * s * mean_g_xhat);
            if (dinp_copy) dinp_copy[row * C + c] = __float2bfloat16(dx[c]);
        }
    }
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
        rmsnorm_backward_kernel<<<N, NORM_THREADS>>>(dinp, cuda_held_copy_to_write(dinp, (long)N * C), dout, inp,
                                                     weight, rstd, C, weight_plus_one ? 1.0f : 0.0f,
                                                     rows_by_four(C, dinp, dout, inp, weight));
        CUDA_CHECK_LAUNCH();
    }
    if (dweight) column_reduce(dweight, N, C, RmsNormWeightTerm{dout, inp, rstd, C});
}
