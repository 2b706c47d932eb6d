// AdamW, the gradient norm's sum of squares and the EMA of weights. The EMA writes fp32
// weights, so it marks their cached bf16 copies stale (matmul.cu); AdamW writes the bf16
// copy of the tensor it updates when one is cached (the next forward then converts
// nothing: 6 bytes a parameter fewer to move each step), else marks copies stale too.
#include "ops/cuda/cuda_common.cuh"
#include "ops/cuda/optimizer_kernels.cuh"

using namespace optimizer_kernels;

void cuda_adamw_update(float *params, const float *grads, float *m, float *v, long n, float lr,
                       float beta1, float beta2, float eps, float weight_decay,
                       float bias_correction1, float bias_correction2, float grad_scale) {
    if (n == 0) return;
    __nv_bfloat16 *params_bf16 = cuda_weight_cache_claim(params, n);
    const bool vector = all_aligned16(params, grads, m, v) && (uintptr_t)params_bf16 % 8 == 0;
    adamw_kernel<<<grid_for_fours(n, 256), 256>>>(params, grads, m, v, n, lr, beta1, beta2, eps, weight_decay,
                                                  lr / bias_correction1, sqrtf(bias_correction2), grad_scale,
                                                  params_bf16, vector);
    CUDA_CHECK_LAUNCH();
}

double cuda_sum_squares(const float *x, long n) {
    if (n == 0) return 0.0;
    long chunks = (n + SUM_CHUNK - 1) / SUM_CHUNK;
    double *partial = (double *)cuda_scratch(SCRATCH_REDUCE, (size_t)chunks * sizeof(double));
    sum_squares_chunks_kernel<<<(unsigned)chunks, SUM_THREADS, SUM_SHARED_BYTES>>>(partial, x, n,
                                                                                   (uintptr_t)x % 16 == 0);
    CUDA_CHECK_LAUNCH();
    sum_partials_kernel<<<1, SUM_PARTIAL_THREADS, SUM_PARTIAL_SHARED_BYTES>>>(partial, chunks);
    CUDA_CHECK_LAUNCH();
    double total;
    CUDA_CHECK(cudaMemcpy(&total, partial, sizeof total, cudaMemcpyDeviceToHost));
    return total;
}

__global__ static void moving_average_kernel(float *average, const float *x, float beta, long n) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) average[i] = beta * average[i] + (1.0f - beta) * x[i];
}

void cuda_moving_average(float *average, const float *x, float beta, long n) {
    if (n == 0) return;
    cuda_weights_written(average, (size_t)n * sizeof(float));
    moving_average_kernel<<<grid_for(n, 256), 256>>>(average, x, beta, n);
    CUDA_CHECK_LAUNCH();
}
