// Rotary position embedding: the row kernel of rope_rows.cuh (a block per token, its cos and
// sin computed once for all heads; a held backward output's bf16 copy written beside it).
#include "ops/cuda/cuda_common.cuh"
#include "ops/cuda/rope_rows.cuh"

static void rope_rotate(float *x, const int *positions, int N, int n_heads, int head_dim,
                        const float *inv_freq, float direction) {
    if ((long)N * n_heads * (head_dim / 2) == 0) return;
    rope_rows::rope_kernel<<<N, rope_rows::THREADS, (size_t)head_dim * sizeof(float)>>>(
        x, cuda_held_copy_to_write(x, (long)N * n_heads * head_dim), positions, n_heads, head_dim, inv_freq, direction);
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
