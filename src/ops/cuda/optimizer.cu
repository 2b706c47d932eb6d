// AdamW, the gradient norm's sum of squares and the EMA of weights. The EMA writes fp32
// weights, so it marks their cached bf16 copies stale (matmul.cu); AdamW writes the bf16
// copy of the tensor it updates when one is cached (the next forward then converts
// nothing: 6 bytes a parameter fewer to move each step), else marks copies stale too.
#include "ops/cuda/cuda_common.cuh"

// Four parameters a thread (device_primitives.cuh's Four: float4 accesses when every buffer is
// aligned), each updated as one alone would be.
__global__ static void adamw_kernel(float *params, const float *grads, float *m, float *v, long n,
                                    float lr, float beta1, float beta2, float eps,
                                    float weight_decay, float step_size, float sqrt_bc2,
                                    float grad_scale, __nv_bfloat16 *params_bf16, bool vector) {
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

// Fixed chunks of 64K elements, one block each, then the chunk sums by one block in a fixed
// order: the result depends only on n and on x's 16-byte alignment, like the CPU's (though
// not bit-equal to it). An aligned x is read as float4 (the gradient buffer always is),
// about twice the bandwidth of float reads on the H200; a thread then adds its four
// squares in order before the next four.
enum { SUM_CHUNK = 1 << 16, SUM_THREADS = 256, SUM_PARTIAL_THREADS = 1024 };

__global__ static void sum_squares_chunks_kernel(double *partial, const float *x, long n, bool vector) {
    long first = (long)blockIdx.x * SUM_CHUNK;
    long last = first + SUM_CHUNK < n ? first + SUM_CHUNK : n;
    double sum = 0;
    long scalar_from = first;
    if (vector) {
        long fours = (last - first) / 4;
        const float4 *x4 = reinterpret_cast<const float4 *>(x + first);
        for (long i = threadIdx.x; i < fours; i += blockDim.x) {
            float4 v = x4[i];
            sum += (double)v.x * v.x;
            sum += (double)v.y * v.y;
            sum += (double)v.z * v.z;
            sum += (double)v.w * v.w;
        }
        scalar_from = first + 4 * fours;
    }
    for (long i = scalar_from + threadIdx.x; i < last; i += blockDim.x) sum += (double)x[i] * x[i];
    sum = block_sum(sum);
    if (threadIdx.x == 0) partial[blockIdx.x] = sum;
}

__global__ static void sum_partials_kernel(double *partial, long chunks) {
    double total = 0;
    for (long k = threadIdx.x; k < chunks; k += blockDim.x) total += partial[k];
    total = block_sum(total);
    __syncthreads(); // every thread has read its partials before the first is overwritten
    if (threadIdx.x == 0) partial[0] = total;
}

double cuda_sum_squares(const float *x, long n) {
    if (n == 0) return 0.0;
    long chunks = (n + SUM_CHUNK - 1) / SUM_CHUNK;
    double *partial = (double *)cuda_scratch(SCRATCH_REDUCE, (size_t)chunks * sizeof(double));
    sum_squares_chunks_kernel<<<(unsigned)chunks, SUM_THREADS>>>(partial, x, n, (uintptr_t)x % 16 == 0);
    CUDA_CHECK_LAUNCH();
    sum_partials_kernel<<<1, SUM_PARTIAL_THREADS>>>(partial, chunks);
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
