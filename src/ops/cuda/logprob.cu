// Log-probabilities, argmax and entropy over the vocabulary (one block per row), their
// backward written over the logits, and the value head. Probabilities are never stored:
// each row keeps its log-sum-exp and the backward rebuilds them (see ops/cpu/logprob.c).
#include "ops/cuda/cuda_common.cuh"

enum { ROW_THREADS = 512 };

// Largest value, first index among equals (the CPU's argmax).
__device__ static void block_argmax(float *value, int *index) {
    __shared__ float values[32];
    __shared__ int indices[32];
    float v = *value;
    int i = *index;
    for (int offset = 16; offset > 0; offset >>= 1) {
        float other_v = __shfl_xor_sync(0xffffffffu, v, offset);
        int other_i = __shfl_xor_sync(0xffffffffu, i, offset);
        if (other_v > v || (other_v == v && other_i < i)) v = other_v, i = other_i;
    }
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
    __syncthreads();
    if (lane == 0) values[warp] = v, indices[warp] = i;
    __syncthreads();
    v = values[0], i = indices[0];
    for (int w = 1; w < warps; w++)
        if (values[w] > v || (values[w] == v && indices[w] < i)) v = values[w], i = indices[w];
    *value = v;
    *index = i;
}

__global__ static void logprob_forward_kernel(float *logp, float *lse, int *top1, float *entropy,
                                              const float *logits, const int *targets, int V) {
    long row = blockIdx.x;
    const float *z = logits + row * V;
    float max_logit = -INFINITY;
    int argmax = V;
    for (int v = threadIdx.x; v < V; v += blockDim.x)
        if (z[v] > max_logit) max_logit = z[v], argmax = v;
    block_argmax(&max_logit, &argmax);
    double sum = 0, weighted = 0;
    for (int v = threadIdx.x; v < V; v += blockDim.x) {
        double e = exp((double)(z[v] - max_logit));
        sum += e;
        if (entropy) weighted += e * z[v];
    }
    sum = block_sum(sum);
    if (entropy) weighted = block_sum(weighted);
    if (threadIdx.x != 0) return;
    double row_lse = max_logit + log(sum);
    lse[row] = (float)row_lse;
    if (logp) {
        int target = targets ? targets[row] : -1;
        logp[row] = target >= 0 ? (float)(z[target] - row_lse) : 0.0f;
    }
    if (top1) top1[row] = argmax;
    if (entropy) entropy[row] = (float)(row_lse - weighted / sum); // H = lse - E_p[z]
}

void cuda_logprob_forward(float *logp, float *lse, int *top1, float *entropy,
                          const float *logits, const int *targets, int N, int V) {
    if (N == 0) return;
    logprob_forward_kernel<<<N, ROW_THREADS>>>(logp, lse, top1, entropy, logits, targets, V);
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

// d logp / d z_v = [v == target] - p_v;  d H / d z_v = -p_v (z_v - lse + H); under a soft
// cap z = cap tanh(r / cap), each times dz / dr = 1 - (z / cap)^2 (ops/cpu/logprob.c).
__global__ static void logprob_backward_kernel(float *z_to_dz, const float *dlogp,
                                               const float *dentropy, const int *targets,
                                               const float *lse, int V, float softcap) {
    long row = blockIdx.x;
    float *z = z_to_dz + row * V;
    int target = targets ? targets[row] : -1;
    float g_logp = dlogp && target >= 0 ? dlogp[row] : 0.0f;
    float g_entropy = dentropy ? dentropy[row] : 0.0f;
    double row_lse = lse[row];
    double row_entropy = 0;
    if (g_entropy != 0.0f) {
        double expected = 0;
        for (int v = threadIdx.x; v < V; v += blockDim.x) expected += exp(z[v] - row_lse) * z[v];
        row_entropy = row_lse - block_sum(expected);
    }
    __syncthreads(); // every thread has read the logits it needs before any is overwritten
    for (int v = threadIdx.x; v < V; v += blockDim.x) {
        double p = exp(z[v] - row_lse);
        double grad = -g_logp * p;
        if (g_entropy != 0.0f) grad += -g_entropy * p * (z[v] - row_lse + row_entropy);
        if (v == target) grad += g_logp;
        if (softcap > 0.0f) {
            const double capped = z[v] / softcap;
            grad *= 1.0 - capped * capped;
        }
        z[v] = (float)grad;
    }
}

void cuda_logprob_backward(float *logits_to_dlogits, const float *dlogp, const float *dentropy,
                           const int *targets, const float *lse, int N, int V, float softcap) {
    if (N == 0) return;
    logprob_backward_kernel<<<N, ROW_THREADS>>>(logits_to_dlogits, dlogp, dentropy, targets, lse, V, softcap);
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
    for (int offset = 16; offset > 0; offset >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
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
