// Rotary position embedding, Hugging Face "rotate half" layout (see ops/cpu/rope.c): one
// thread per (row, head, pair). Angles in float32 as transformers computes them.
#include "ops/cuda/cuda_common.cuh"

__global__ static void rope_kernel(float *x, const int *positions, int N, int n_heads,
                                   int head_dim, float theta, float direction) {
    int half = head_dim / 2;
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long)N * n_heads * half) return;
    int pair = (int)(i % half);
    long head_index = i / half; // row * n_heads + head
    long row = head_index / n_heads;
    float inv_freq = 1.0f / powf(theta, (float)(2 * pair) / (float)head_dim);
    float angle = (float)positions[row] * inv_freq;
    float s, c;
    sincosf(angle, &s, &c);
    s *= direction;
    float *head = x + head_index * head_dim;
    float x1 = head[pair], x2 = head[pair + half];
    head[pair] = x1 * c - x2 * s;
    head[pair + half] = x2 * c + x1 * s;
}

static void rope_rotate(float *x, const int *positions, int N, int n_heads, int head_dim,
                        float theta, float direction) {
    long n = (long)N * n_heads * (head_dim / 2);
    if (n == 0) return;
    rope_kernel<<<grid_for(n, 256), 256>>>(x, positions, N, n_heads, head_dim, theta, direction);
    CUDA_CHECK_LAUNCH();
}

void cuda_rope_forward(float *x, const int *positions, int N, int n_heads, int head_dim,
                       float theta) {
    rope_rotate(x, positions, N, n_heads, head_dim, theta, 1.0f);
}

void cuda_rope_backward(float *dx, const int *positions, int N, int n_heads, int head_dim,
                        float theta) {
    rope_rotate(dx, positions, N, n_heads, head_dim, theta, -1.0f);
}
