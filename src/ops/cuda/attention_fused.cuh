// The fused attention kernels, called by attention.cu: the WMMA kernels
// (attention_fused.cu) and the mma.sync kernels (attention_mma.cu). Both take the same
// inputs and produce the same outputs.
#pragma once
#include <type_traits>

#include "ops/cuda/cuda_common.cuh"

// D[b, h, t] = dO . O over the head's hd columns of row b*T + t (a scratch buffer,
// attention.cu): the softmax backward's row term, shared by both fused backwards.
const float *cuda_attention_row_dot(const float *dout, const float *out, int B, int H, int T, int head_dim);

bool cuda_fused_attention_supports(int head_dim);
// The most dynamic shared memory any of a fused implementation's kernels takes for this
// head_dim (which cuda_fused_attention_supports): checked against the device's limit.
size_t cuda_wmma_attention_shared_bytes(int head_dim);
size_t cuda_mma_attention_shared_bytes(int head_dim);

// Calls launch(std::integral_constant<int, HD>{}) for head_dim HD among the sizes the fused
// kernels are instantiated for (16, 32, 64, 128): the one switch from a run-time head size
// to a kernel template, for both fused implementations.
template <typename Launch> void with_fused_head_dim(int head_dim, const char *kernels, Launch &&launch) {
    switch (head_dim) {
    case 16: launch(std::integral_constant<int, 16>{}); break;
    case 32: launch(std::integral_constant<int, 32>{}); break;
    case 64: launch(std::integral_constant<int, 64>{}); break;
    case 128: launch(std::integral_constant<int, 128>{}); break;
    default: CHECK(false, "%s attention has no kernel for head_dim %d", kernels, head_dim);
    }
}
// Q, K, V: head-major bf16 [B, H, T, hd] (K, V repeated over each group). Writes out
// ([B*T, H*hd] rows) and lse ([B, H, T]).
void cuda_fused_attention_forward(float *out, float *lse, const __nv_bfloat16 *Q, const __nv_bfloat16 *K,
                                  const __nv_bfloat16 *V, const int *row_start, int B, int H, int T,
                                  int head_dim);
// Adds into dq ([B*T, H*hd]) and dk, dv ([B*T, KV*hd]). out is the forward's output.
void cuda_fused_attention_backward(float *dq, float *dk, float *dv, const float *dout, const float *out,
                                   const __nv_bfloat16 *Q, const __nv_bfloat16 *K, const __nv_bfloat16 *V,
                                   const __nv_bfloat16 *dO, const float *lse, const int *row_start, int B,
                                   int H, int KV, int T, int head_dim);

// The same two calls on the mma.sync kernels (head_dim 16, 32, 64, 128), which also take a
// sliding window (0: none; the WMMA kernels do not), and read K and V once per K/V head:
// [B, KV, T, hd], not repeated. The backward takes D (cuda_attention_row_dot, or computed
// with dO's gather) instead of dout and out. plain: the PLAIN variant of the kernels
// instead of the TUNED one (attention_mma.cuh). out_copy (or NULL): where the forward also
// writes out as bf16 [B*T, H*hd] (out's held copy, cuda_held_copy_to_write). The backward
// writes dq's rows q_row_stride floats apart and dk's and dv's kv_row_stride (H*hd and KV*hd
// for rows of their own; the width of a fused q | k | v gradient whose columns they are).
// keep_scores_gradient ("mma-ds"): the TUNED dK/dV kernel also writes dS, from which the dQ
// kernel needs one product a tile instead of three (up to 1 GB of scratch; past it, as plain
// is false).
void cuda_mma_attention_forward(float *out, __nv_bfloat16 *out_copy, float *lse, const __nv_bfloat16 *Q,
                                const __nv_bfloat16 *K, const __nv_bfloat16 *V, const int *row_start, int B, int H,
                                int KV, int T, int head_dim, int window, bool plain);
void cuda_mma_attention_backward(float *dq, float *dk, float *dv, int q_row_stride, int kv_row_stride,
                                 const __nv_bfloat16 *Q, const __nv_bfloat16 *K, const __nv_bfloat16 *V,
                                 const __nv_bfloat16 *dO, const float *lse, const float *D, const int *row_start,
                                 int B, int H, int KV, int T, int head_dim, int window, bool plain,
                                 bool keep_scores_gradient);
