// The fused attention kernels (attention_fused.cu), called by attention.cu.
#pragma once
#include "ops/cuda/cuda_common.cuh"

bool cuda_fused_attention_supports(int head_dim);
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
