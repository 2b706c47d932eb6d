// The attention ops with the rotary positions applied inside (ops.h,
// attention_forward_rotary / attention_backward_rotary), on the CPU as the composition they
// stand for: q and k rotated into copies (rope.c) for the attention ops of attention.c, and
// the backward's dq and dk rotated back (rope_backward). The backward rotates the copies
// again rather than keeping them from the forward: the saved state stays the probabilities
// alone, and a rotation is a small cost beside the attention's products. The same bits as
// rope_forward in place followed by attention_forward, and attention_backward followed by
// rope_backward.
#include <stdlib.h>
#include <string.h>

#include "core/check.h"
#include "ops/cpu/ops_cpu.h"

// q and k rotated, in new buffers (the caller frees them).
static void rotated_copies(float **q_rotated, float **k_rotated, const float *q, const float *k, const int *positions,
                           const float *inv_freq, int N, int n_heads, int n_kv_heads, int head_dim) {
    const size_t q_bytes = (size_t)N * n_heads * head_dim * sizeof(float);
    const size_t k_bytes = (size_t)N * n_kv_heads * head_dim * sizeof(float);
    *q_rotated = xmalloc(q_bytes);
    *k_rotated = xmalloc(k_bytes);
    memcpy(*q_rotated, q, q_bytes);
    memcpy(*k_rotated, k, k_bytes);
    cpu_rope_forward(*q_rotated, positions, N, n_heads, head_dim, inv_freq);
    cpu_rope_forward(*k_rotated, positions, N, n_kv_heads, head_dim, inv_freq);
}

void cpu_attention_forward_rotary(float *out, float *probs, const float *q, const float *k, const float *v,
                                  const int *row_start, const int *positions, const float *inv_freq, int B, int T,
                                  int n_heads, int n_kv_heads, int head_dim, float softcap, int window) {
    float *q_rotated, *k_rotated;
    rotated_copies(&q_rotated, &k_rotated, q, k, positions, inv_freq, B * T, n_heads, n_kv_heads, head_dim);
    cpu_attention_forward(out, probs, q_rotated, k_rotated, v, row_start, B, T, n_heads, n_kv_heads, head_dim, softcap,
                          window);
    free(q_rotated);
    free(k_rotated);
}

void cpu_attention_backward_rotary(float *dq, float *dk, float *dv, const float *dout, const float *out,
                                   const float *probs, const float *q, const float *k, const float *v,
                                   const int *row_start, const int *positions, const float *inv_freq, int B, int T,
                                   int n_heads, int n_kv_heads, int head_dim, float softcap, int window) {
    float *q_rotated, *k_rotated;
    rotated_copies(&q_rotated, &k_rotated, q, k, positions, inv_freq, B * T, n_heads, n_kv_heads, head_dim);
    cpu_attention_backward(dq, dk, dv, dout, out, probs, q_rotated, k_rotated, v, row_start, B, T, n_heads, n_kv_heads,
                           head_dim, softcap, window);
    free(q_rotated);
    free(k_rotated);
    cpu_rope_backward(dq, positions, B * T, n_heads, head_dim, inv_freq);
    cpu_rope_backward(dk, positions, B * T, n_kv_heads, head_dim, inv_freq);
}
