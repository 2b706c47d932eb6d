// The attention ops with the rotary positions applied inside (ops.h,
// attention_forward_rotary / attention_backward_rotary), on the CPU as the composition they
// stand for: q and k rotated into copies (rope.c) for the attention ops of attention.c, and
// the backward's dq and dk rotated back (rope_backward). The backward rotates the copies
// again rather than keeping them from the forward: the saved state stays the probabilities
// alone, and a rotation is a small cost beside the attention's products. The same bits as
// rope_forward in place followed by attention_forward, and attention_backward followed by
// rope_backward, whichever row strides q, k and v come with: rows of a fused q | k | v
// buffer are copied out into buffers of their own (v too), and the backward's gradients
// computed in such buffers are copied into the fused rows.
#include <stdlib.h>
#include <string.h>

#include "core/check.h"
#include "ops/cpu/ops_cpu.h"

// N rows of `width` floats, `row_stride` apart in `x`, into a new buffer of their own (the
// caller frees it).
static float *rows_copy(const float *x, int N, int width, int row_stride) {
    float *copy = xmalloc((size_t)N * width * sizeof(float));
    for (long row = 0; row < N; row++)
        memcpy(copy + row * width, x + row * row_stride, (size_t)width * sizeof(float));
    return copy;
}

// The other way: N rows of `width` floats of their own into rows `row_stride` apart.
static void rows_scatter(float *x, int row_stride, const float *rows, int N, int width) {
    for (long row = 0; row < N; row++)
        memcpy(x + row * row_stride, rows + row * width, (size_t)width * sizeof(float));
}

// q and k rotated, in new buffers (the caller frees them).
static void rotated_copies(float **q_rotated, float **k_rotated, const float *q, const float *k, int q_row_stride,
                           int kv_row_stride, const int *positions, const float *inv_freq, int N, int n_heads,
                           int n_kv_heads, int head_dim) {
    *q_rotated = rows_copy(q, N, n_heads * head_dim, q_row_stride);
    *k_rotated = rows_copy(k, N, n_kv_heads * head_dim, kv_row_stride);
    cpu_rope_forward(*q_rotated, positions, N, n_heads, head_dim, inv_freq);
    cpu_rope_forward(*k_rotated, positions, N, n_kv_heads, head_dim, inv_freq);
}

void cpu_attention_forward_rotary(float *out, float *probs, const float *q, const float *k, const float *v,
                                  int q_row_stride, int kv_row_stride, const int *row_start, const int *positions,
                                  const float *inv_freq, int B, int T, int n_heads, int n_kv_heads, int head_dim,
                                  float softcap, int window) {
    const int N = B * T, kv_dim = n_kv_heads * head_dim;
    float *q_rotated, *k_rotated;
    rotated_copies(&q_rotated, &k_rotated, q, k, q_row_stride, kv_row_stride, positions, inv_freq, N, n_heads,
                   n_kv_heads, head_dim);
    float *v_rows = kv_row_stride == kv_dim ? NULL : rows_copy(v, N, kv_dim, kv_row_stride);
    cpu_attention_forward(out, probs, q_rotated, k_rotated, v_rows ? v_rows : v, row_start, B, T, n_heads, n_kv_heads,
                          head_dim, softcap, window);
    free(q_rotated);
    free(k_rotated);
    free(v_rows);
}

void cpu_attention_backward_rotary(float *dq, float *dk, float *dv, const float *dout, const float *out,
                                   const float *probs, const float *q, const float *k, const float *v,
                                   int q_row_stride, int kv_row_stride, const int *row_start, const int *positions,
                                   const float *inv_freq, int B, int T, int n_heads, int n_kv_heads, int head_dim,
                                   float softcap, int window) {
    const int N = B * T, q_dim = n_heads * head_dim, kv_dim = n_kv_heads * head_dim;
    float *q_rotated, *k_rotated;
    rotated_copies(&q_rotated, &k_rotated, q, k, q_row_stride, kv_row_stride, positions, inv_freq, N, n_heads,
                   n_kv_heads, head_dim);
    // Gradients into buffers of their own where the rows are a fused buffer's columns.
    const bool q_own = q_row_stride == q_dim, kv_own = kv_row_stride == kv_dim;
    float *v_rows = kv_own ? NULL : rows_copy(v, N, kv_dim, kv_row_stride);
    float *dq_rows = q_own ? dq : xmalloc((size_t)N * q_dim * sizeof(float));
    float *dk_rows = kv_own ? dk : xmalloc((size_t)N * kv_dim * sizeof(float));
    float *dv_rows = kv_own ? dv : xmalloc((size_t)N * kv_dim * sizeof(float));
    cpu_attention_backward(dq_rows, dk_rows, dv_rows, dout, out, probs, q_rotated, k_rotated, v_rows ? v_rows : v,
                           row_start, B, T, n_heads, n_kv_heads, head_dim, softcap, window);
    free(q_rotated);
    free(k_rotated);
    free(v_rows);
    cpu_rope_backward(dq_rows, positions, N, n_heads, head_dim, inv_freq);
    cpu_rope_backward(dk_rows, positions, N, n_kv_heads, head_dim, inv_freq);
    if (!q_own) rows_scatter(dq, q_row_stride, dq_rows, N, q_dim), free(dq_rows);
    if (!kv_own) {
        rows_scatter(dk, kv_row_stride, dk_rows, N, kv_dim);
        rows_scatter(dv, kv_row_stride, dv_rows, N, kv_dim);
        free(dk_rows);
        free(dv_rows);
    }
}
