// AdamW, the gradient norm's sum of squares and the EMA of weights. The AdamW and EMA
// updates write fp32 weights, so they mark the cached bf16 copies stale (matmul.cu).
#include "ops/cuda/cuda_common.cuh"

__global__ static void adamw_kernel(float *params, const float *grads, float *m, float *v, long n,
                                    float lr, float beta1, float beta2, float eps,
                                    float weight_decay, float step_size, float sqrt_bc2,
                                    float grad_scale) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float g = grads[i] * grad_scale;
    float p = params[i] * (1.0f - lr * weight_decay);
    float mi = beta1 * m[i] + (1.0f - beta1) * g;
    float vi = beta2 * v[i] + (1.0f - beta2) * g * g;
    m[i] = mi;
    v[i] = vi;
    params[i] = p - step_size * mi / (sqrtf(vi) / sqrt_bc2 + eps);
}

void cuda_adamw_update(float *params, const float *grads, float *m, float *v, long n, float lr,
                       float beta1, float beta2, float eps, float weight_decay,
                       float bias_correction1, float bias_correction2, float grad_scale) {
    if (n == 0) return;
    cuda_weights_written(params, (size_t)n * sizeof(float));
    adamw_kernel<<<grid_for(n, 256), 256>>>(params, grads, m, v, n, lr, beta1, beta2, eps,
                                            weight_decay, lr / bias_correction1,
                                            sqrtf(bias_correction2), grad_scale);
    CUDA_CHECK_LAUNCH();
}

// Fixed chunks of 64K elements, one block each, then the chunk sums in order: the result
// depends only on n, like the CPU's (though not bit-equal to it).
enum { SUM_CHUNK = 1 << 16, SUM_THREADS = 256 };

__global__ static void sum_squares_chunks_kernel(double *partial, const float *x, long n) {
    long first = (long)blockIdx.x * SUM_CHUNK;
    long last = first + SUM_CHUNK < n ? first + SUM_CHUNK : n;
    double sum = 0;
    for (long i = first + threadIdx.x; i < last; i += blockDim.x) sum += (double)x[i] * x[i];
    sum = block_sum(sum);
    if (threadIdx.x == 0) partial[blockIdx.x] = sum;
}

__global__ static void sum_partials_kernel(double *partial, long chunks) {
    double total = 0;
    for (long k = 0; k < chunks; k++) total += partial[k];
    partial[0] = total;
}

double cuda_sum_squares(const float *x, long n) {
    if (n == 0) return 0.0;
    long chunks = (n + SUM_CHUNK - 1) / SUM_CHUNK;
    double *partial = (double *)cuda_scratch(SCRATCH_REDUCE, (size_t)chunks * sizeof(double));
    sum_squares_chunks_kernel<<<(unsigned)chunks, SUM_THREADS>>>(partial, x, n);
    CUDA_CHECK_LAUNCH();
    sum_partials_kernel<<<1, 1>>>(partial, chunks);
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
