// LayerNorm and RMSNorm over rows (norm.cu launches them): one block of THREADS threads per
// row, the row's statistics summed in fp64 as on the CPU, the per-element formulas the
// CPU's. A norm's output is a matmul's input: the forward's feeds the q/k/v (up/gate)
// products, the backward's (the residual stream's gradient) the output gradient of the
// previous block's last product. When the model holds it (matmul_input_hold) the kernel
// writes its bf16 copy beside it (`*_copy`, else NULL), sparing that product a read of the
// whole output to convert it. A forward's `out` is NULL when the model stores it
// (hold_stored): the copy is then all that is written.
//
// Written once for nvcc and for the CPU emulation (cpu_emulation.h), which runs them in
// tests/test_norm_emulated.cpp against ops/cpu/norm.c.
#pragma once
#include <math.h>

#include "ops/cuda/device_primitives.cuh"
#include "ops/cuda/norm_functions.cuh"

namespace norm_rows {

enum { SHARED_BYTES = THREADS / 32 * sizeof(double) };

static __global__ void __launch_bounds__(THREADS)
    layernorm_forward_kernel(float *out, bf16 *out_copy, float *mean, float *rstd, const float *inp,
                             const float *weight, const float *bias, int C, float eps) {
    DYNAMIC_SHARED(shared);
    double *slots = reinterpret_cast<double *>(shared);
    const long row = blockIdx.x;
    const float *x = inp + row * C;
    double sum = 0;
    for (int c = threadIdx.x; c < C; c += THREADS) sum += x[c];
    const double mu = block_sum_fixed<THREADS>(sum, slots) / C;
    double var = 0;
    for (int c = threadIdx.x; c < C; c += THREADS) var += (x[c] - mu) * (x[c] - mu);
    var = block_sum_fixed<THREADS>(var, slots) / C;
    const float s = (float)(1.0 / sqrt(var + eps)), m = (float)mu;
    float *y = out ? out + row * C : nullptr;
    for (int c = threadIdx.x; c < C; c += THREADS) {
        const float value = (x[c] - m) * s * weight[c] + (bias ? bias[c] : 0.0f);
        if (y) y[c] = value;
        if (out_copy) out_copy[row * C + c] = to_bf16(value);
    }
    if (threadIdx.x == 0) {
        mean[row] = m;
        rstd[row] = s;
    }
}

// dinp += the row's gradient (the backward ops add, ops.h).
static __global__ void __launch_bounds__(THREADS)
    layernorm_backward_kernel(float *dinp, bf16 *dinp_copy, const float *dout, const float *inp, const float *weight,
                              const float *mean, const float *rstd, int C) {
    DYNAMIC_SHARED(shared);
    double *slots = reinterpret_cast<double *>(shared);
    const long row = blockIdx.x;
    const float *x = inp + row * C, *dy = dout + row * C;
    const float m = mean[row], s = rstd[row];
    double sum_g = 0, sum_g_xhat = 0;
    for (int c = threadIdx.x; c < C; c += THREADS) {
        const float g = dy[c] * weight[c];
        sum_g += g;
        sum_g_xhat += (double)g * ((x[c] - m) * s);
    }
    const float mean_g = (float)(block_sum_fixed<THREADS>(sum_g, slots) / C);
    const float mean_g_xhat = (float)(block_sum_fixed<THREADS>(sum_g_xhat, slots) / C);
    float *dx = dinp + row * C;
    for (int c = threadIdx.x; c < C; c += THREADS) {
        const float xhat = (x[c] - m) * s;
        dx[c] += s * (dy[c] * weight[c] - mean_g - xhat * mean_g_xhat);
        if (dinp_copy) dinp_copy[row * C + c] = to_bf16(dx[c]);
    }
}

// RMSNorm runs twice a layer and once more at the end: with `by_four` (C a multiple of 4,
// every row 16-byte aligned: the model's activations always are) a thread reads and writes
// four floats at a time, summing its four squares in order; the per-element formulas are
// the same either way. `offset`: 1 for Gemma's (1 + w) weights, else 0.
static __global__ void __launch_bounds__(THREADS)
    rmsnorm_forward_kernel(float *out, bf16 *out_copy, float *rstd, const float *inp, const float *weight, int C,
                           float eps, float offset, bool by_four) {
    DYNAMIC_SHARED(shared);
    double *slots = reinterpret_cast<double *>(shared);
    const long row = blockIdx.x;
    const float *x = inp + row * C;
    float *y = out ? out + row * C : nullptr;
    bf16 *y_copy = out_copy ? out_copy + row * C : nullptr;
    const double sum_sq = rms_sum_squares_share(x, C, (int)threadIdx.x, by_four);
    const float s = rms_inverse(block_sum_fixed<THREADS>(sum_sq, slots), C, eps);
    if (by_four) {
        for (int c = 4 * threadIdx.x; c < C; c += 4 * THREADS) {
            float v[4], w[4], result[4];
            load_float4(v, x + c);
            load_float4(w, weight + c);
            for (int k = 0; k < 4; k++) result[k] = rms_normalised(v[k], s, offset, w[k]);
            if (y) store_float4(y + c, result);
            if (y_copy) store_bf16x4(y_copy + c, result);
        }
    } else {
        for (int c = threadIdx.x; c < C; c += THREADS) {
            const float value = rms_normalised(x[c], s, offset, weight[c]);
            if (y) y[c] = value;
            if (y_copy) y_copy[c] = to_bf16(value);
        }
    }
    if (threadIdx.x == 0) rstd[row] = s;
}

// dinp += the row's gradient.
static __global__ void __launch_bounds__(THREADS)
    rmsnorm_backward_kernel(float *dinp, bf16 *dinp_copy, const float *dout, const float *inp, const float *weight,
                            const float *rstd, int C, float offset, bool by_four) {
    DYNAMIC_SHARED(shared);
    double *slots = reinterpret_cast<double *>(shared);
    const long row = blockIdx.x;
    const float *x = inp + row * C, *dy = dout + row * C;
    const float s = rstd[row];
    float *dx = dinp + row * C;
    bf16 *dx_copy = dinp_copy ? dinp_copy + row * C : nullptr;
    double sum_g_xhat = 0;
    if (by_four) {
        for (int c = 4 * threadIdx.x; c < C; c += 4 * THREADS) {
            float g[4], w[4], v[4];
            load_float4(g, dy + c);
            load_float4(w, weight + c);
            load_float4(v, x + c);
            for (int k = 0; k < 4; k++) sum_g_xhat += (double)g[k] * (offset + w[k]) * v[k] * s;
        }
    } else {
        for (int c = threadIdx.x; c < C; c += THREADS) sum_g_xhat += (double)dy[c] * (offset + weight[c]) * x[c] * s;
    }
    const float mean_g_xhat = (float)(block_sum_fixed<THREADS>(sum_g_xhat, slots) / C);
    if (by_four) {
        for (int c = 4 * threadIdx.x; c < C; c += 4 * THREADS) {
            float g[4], w[4], v[4], d[4];
            load_float4(g, dy + c);
            load_float4(w, weight + c);
            load_float4(v, x + c);
            load_float4(d, dx + c);
            for (int k = 0; k < 4; k++) d[k] += s * (g[k] * (offset + w[k]) - v[k] * s * mean_g_xhat);
            store_float4(dx + c, d);
            if (dx_copy) store_bf16x4(dx_copy + c, d);
        }
    } else {
        for (int c = threadIdx.x; c < C; c += THREADS) {
            dx[c] += s * (dy[c] * (offset + weight[c]) - x[c] * s * mean_g_xhat);
            if (dx_copy) dx_copy[c] = to_bf16(dx[c]);
        }
    }
}

} // namespace norm_rows
