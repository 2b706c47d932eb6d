// Rotary position embedding: the row kernel of rope_rows.cuh (a block per token, its cos and
// sin computed once for all heads; a held backward output's bf16 copy written beside it).
#include "ops/cuda/cuda_common.cuh"
#include "ops/cuda/rope_rows.cuh"

// The first n_heads heads of x's N rows (row_stride floats apart) rotated; x_copy (or NULL):
// the bf16 copy of the whole rows to write.
static void rotate_rows(float *x, __nv_bfloat16 *x_copy, int row_stride, const int *positions, int N, int n_heads,
                        int head_dim, const float *inv_freq, float direction) {
    if ((long)N * n_heads * (head_dim / 2) == 0) return;
    rope_rows::rope_kernel<<<N, rope_rows::THREADS, (size_t)head_dim * sizeof(float)>>>(
        x, x_copy, row_stride, positions, n_heads, head_dim, inv_freq, direction);
    CUDA_CHECK_LAUNCH();
}

// Rows of their own: the copy is written when x is held.
static void rope_rotate(float *x, const int *positions, int N, int n_heads, int head_dim,
                        const float *inv_freq, float direction) {
    if ((long)N * n_heads * (head_dim / 2) == 0) return; // nothing rotated: no copy made either
    const int width = n_heads * head_dim;
    rotate_rows(x, cuda_held_copy_to_write(x, (long)N * width), width, positions, N, n_heads, head_dim, inv_freq,
                direction);
}

void cuda_rope_forward(float *x, const int *positions, int N, int n_heads, int head_dim,
                       const float *inv_freq) {
    rope_rotate(x, positions, N, n_heads, head_dim, inv_freq, 1.0f);
}

void cuda_rope_backward(float *dx, const int *positions, int N, int n_heads, int head_dim,
                        const float *inv_freq) {
    rope_rotate(dx, positions, N, n_heads, head_dim, inv_freq, -1.0f);
}

void cuda_rope_backward_rows(float *dx, __nv_bfloat16 *dx_copy, int row_stride, const int *positions, int N,
                             int n_heads, int head_dim, const float *inv_freq) {
    rotate_rows(dx, dx_copy, row_stride, positions, N, n_heads, head_dim, inv_freq, -1.0f);
}
