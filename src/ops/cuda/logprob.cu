// Log-probabilities, argmax and entropy over the vocabulary (one block per row, the kernels
// of logprob_rows.cuh), their backward written over the logits, the collision entropy and
// the value head. Probabilities are never stored: each row keeps its log-sum-exp and the
// backward rebuilds them (see ops/cpu/logprob.c).
#include "ops/cuda/cuda_common.cuh"
#include "ops/cuda/logprob_rows.cuh"

enum { ROW_THREADS = 512 };

// Rows read four floats at a time when every row starts 16-byte aligned.
static bool rows_of_four(const float *logits, int V) { return V % 4 == 0 && (uintptr_t)logits % 16 == 0; }

void cuda_logprob_forward(float *logp, float *lse, int *top1, float *entropy,
                          const float *logits, const int *targets, int N, int V) {
    if (N == 0) return;
    logprob_rows::forward_kernel<<<N, logprob_rows::THREADS, logprob_rows::SHARED_BYTES>>>(
        logp, lse, top1, entropy, logits, targets, V, rows_of_four(logits, V));
    CUDA_CHECK_LAUNCH();
}

// -log sum_v p_v^2 = 2 log sum_v e^(z_v - m) - log sum_v e^(2 (z_v - m)) (ops/cpu/logprob.c).
__global__ static void collision_entropy_kernel(float *collision, const float *logits, int V) {
    long row = blockIdx.x;
    const float *z = logits + row * V;
    float max_logit = -INFINITY;
    for (int v = threadIdx.x; v < V; v += blockDim.x) max_logit = fmaxf(max_logit, z[v]);
    max_logit = block_max(max_logit);
    double sum = 0, sum_squares = 0;
    for (int v = threadIdx.x; v < V; v += blockDim.x) {
        double e = exp((double)(z[v] - max_logit));
        sum += e;
        sum_squares += e * e;
    }
    sum = block_sum(sum);
    sum_squares = block_sum(sum_squares);
    if (threadIdx.x == 0) collision[row] = (float)(2.0 * log(sum) - log(sum_squares));
}

void cuda_collision_entropy_forward(float *collision, const float *logits, int N, int V) {
    if (N == 0) return;
    collision_entropy_kernel<<<N, ROW_THREADS>>>(collision, logits, V);
    CUDA_CHECK_LAUNCH();
}

void cuda_logprob_backward(float *logits_to_dlogits, const float *dlogp, const float *dentropy,
                           const int *targets, const float *lse, int N, int V, float softcap) {
    if (N == 0) return;
    logprob_rows::backward_kernel<<<N, logprob_rows::THREADS, logprob_rows::SHARED_BYTES>>>(
        logits_to_dlogits, cuda_held_copy_to_write(logits_to_dlogits, (long)N * V), dlogp, dentropy, targets, lse, V,
        softcap, rows_of_four(logits_to_dlogits, V));
    CUDA_CHECK_LAUNCH();
}

__global__ static void soft_cap_kernel(float *x, long n, float cap) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = cap * tanhf(x[i] / cap);
}

// Gemma 2's final logits: x = cap * tanh(x / cap) in place.
void cuda_soft_cap_forward(float *x, long n, float cap) {
    if (n == 0) return;
    soft_cap_kernel<<<grid_for(n, 256), 256>>>(x, n, cap);
    CUDA_CHECK_LAUNCH();
}

// One warp per row.
__global__ static void value_head_forward_kernel(float *values, const float *hidden,
                                                 const float *weight, int N, int C) {
    long row = (long)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    if (row >= N) return;
    double sum = 0;
    for (int c = lane; c < C; c += 32) sum += (double)hidden[row * C + c] * weight[c];
    sum = warp_sum(sum);
    if (lane == 0) values[row] = (float)sum;
}

void cuda_value_head_forward(float *values, const float *hidden, const float *weight, int N,
                             int C) {
    if (N == 0) return;
    value_head_forward_kernel<<<grid_for(N, 8), 256>>>(values, hidden, weight, N, C);
    CUDA_CHECK_LAUNCH();
}

__global__ static void value_head_dhidden_kernel(float *dhidden, const float *dvalues,
                                                 const float *weight, int N, int C) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < (long)N * C) dhidden[i] += dvalues[i / C] * weight[i % C];
}

struct ScaledHidden {
    const float *hidden, *dvalues;
    int C;
    __device__ float operator()(int i, int c) const { return dvalues[i] * hidden[(long)i * C + c]; }
};

void cuda_value_head_backward(float *dhidden, float *dweight, const float *dvalues,
                              const float *hidden, const float *weight, int N, int C) {
    if (N == 0) return;
    if (dhidden) {
        value_head_dhidden_kernel<<<grid_for((long)N * C, 256), 256>>>(dhidden, dvalues, weight, N, C);
        CUDA_CHECK_LAUNCH();
    }
    if (dweight) column_reduce(dweight, N, C, ScaledHidden{hidden, dvalues, C});
}
