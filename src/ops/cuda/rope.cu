// Rotary position embedding, Hugging Face "rotate half" layout (see ops/cpu/rope.c): one
// thread per (row, head, pair), rotated by position * inv_freq[pair] (the model's table,
// device memory).
#include "ops/cuda/cuda_common.cuh"

__global__ static void rope_kernel(float *x, const int *positions, int N, int n_heads,
                                   int head_dim, const float *inv_freq, float direction) {
    int half = head_dim / 2;
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long)N * n_heads * half) return;
    int pair = (int)(i % half);
    long head_index = i / half; // row * n_heads + head
    long row = head_index / n_heads;
    float angle = (float)positions[row] * inv_freq[pair];
    float s, c;
    sincosf(angle, &s, &c);
    s *= direction;
    float *head = x + head_index * head_dim;
    float x1 = head[pair], x2 = head[pair + half];
    head[pair] = x1 * c - x2 * s;
    head[pair + half] = x2 * c + x1 * s;
}

static void rope_rotate(float *x, const int *positions, int N, int n_heads, int head_dim,
                        const float *inv_freq, float direction) {
    long n = (long)N * n_heads * (head_dim / 2);
    if (n == 0) return;
    rope_kernel<<<grid_for(n, 256), 256>>>(x, positions, N, n_heads, head_dim, inv_freq, direction);
    CUDA_CHECK_LAUNCH();
}

void cuda_rope_forward(float *x, const int *positions, int N, int n_heads, int head_dim,
                       const float *inv_freq) {
    rope_rotate(x, positions, N, n_heads, head_dim, inv_freq, 1.0f);
}

void cuda_rope_backward(float *dx, const int *positions, int N, int n_heads, int head_dim,
                        const float *inv_freq) {
    rope_rotate(dx, positions, N, n_heads, head_dim, inv_freq, -1.0f);
}
