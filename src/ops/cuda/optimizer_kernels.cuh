// The optimizer's kernels (optimizer.cu launches them): AdamW four parameters a thread, and
// the gradient norm's sum of squares in fixed chunks. Written once for nvcc and for the CPU
// emulation (cpu_emulation.h), which runs them in tests/test_optimizer_emulated.cpp against
// ops/cpu/adamw.c and the CPU's sum of squares.
#pragma once
#include <math.h>

#include "ops/cuda/device_primitives.cuh"

namespace optimizer_kernels {

// Four parameters a thread (device_primitives.cuh's Four: float4 accesses when every buffer is
// aligned), each updated as one alone would be.
static __global__ void adamw_kernel(float *params, const float *grads, float *m, float *v, long n, float lr,
                                    float beta1, float beta2, float eps, float weight_decay, float step_size,
                                    float sqrt_bc2, float grad_scale, bf16 *params_bf16, bool vector) {
    const long first = first_of_four();
    if (first >= n) return;
    Four p = load_four(params, first, n, vector), g = load_four(grads, first, n, vector);
    Four mi = load_four(m, first, n, vector), vi = load_four(v, first, n, vector);
    for (int k = 0; k < 4; k++) {
        const float gk = g.x[k] * grad_scale;
        const float decayed = p.x[k] * (1.0f - lr * weight_decay);
        mi.x[k] = beta1 * mi.x[k] + (1.0f - beta1) * gk;
        vi.x[k] = beta2 * vi.x[k] + (1.0f - beta2) * gk * gk;
        p.x[k] = decayed - step_size * mi.x[k] / (sqrtf(vi.x[k]) / sqrt_bc2 + eps);
    }
    store_four(m, first, n, vector, mi);
    store_four(v, first, n, vector, vi);
    store_four(params, first, n, vector, p);
    store_four_bf16(params_bf16, first, n, vector, p); // as cuda_to_bf16 rounds
}

// Fixed chunks of 64K elements, one block each, then the chunk sums by one block in a fixed
// order: the result depends only on n and on x's 16-byte alignment, like the CPU's (though
// not bit-equal to it). An aligned x is read as float4 (the gradient buffer always is),
// about twice the bandwidth of float reads on the H200; a thread then adds its four
// squares in order before the next four.
enum {
    SUM_CHUNK = 1 << 16,
    SUM_THREADS = 256,
    SUM_PARTIAL_THREADS = 1024,
    SUM_SHARED_BYTES = SUM_THREADS / 32 * sizeof(double),
    SUM_PARTIAL_SHARED_BYTES = SUM_PARTIAL_THREADS / 32 * sizeof(double)
};

static __global__ void __launch_bounds__(SUM_THREADS)
    sum_squares_chunks_kernel(double *partial, const float *x, long n, bool vector) {
    DYNAMIC_SHARED(shared);
    const long first = (long)blockIdx.x * SUM_CHUNK;
    const long last = first + SUM_CHUNK < n ? first + SUM_CHUNK : n;
    double sum = 0;
    long scalar_from = first;
    if (vector) {
        const long fours = (last - first) / 4;
        for (long i = threadIdx.x; i < fours; i += SUM_THREADS) {
            float v[4];
            load_float4(v, x + first + 4 * i);
            for (int k = 0; k < 4; k++) sum += (double)v[k] * v[k];
        }
        scalar_from = first + 4 * fours;
    }
    for (long i = scalar_from + threadIdx.x; i < last; i += SUM_THREADS) sum += (double)x[i] * x[i];
    sum = block_sum_fixed<SUM_THREADS>(sum, reinterpret_cast<double *>(shared));
    if (threadIdx.x == 0) partial[blockIdx.x] = sum;
}

// The chunks' sums in order into partial[0] (every thread has read its partials inside
// the block sum, before thread 0 writes).
static __global__ void __launch_bounds__(SUM_PARTIAL_THREADS) sum_partials_kernel(double *partial, long chunks) {
    DYNAMIC_SHARED(shared);
    double total = 0;
    for (long k = threadIdx.x; k < chunks; k += SUM_PARTIAL_THREADS) total += partial[k];
    total = block_sum_fixed<SUM_PARTIAL_THREADS>(total, reinterpret_cast<double *>(shared));
    if (threadIdx.x == 0) partial[0] = total;
}

} // namespace optimizer_kernels
