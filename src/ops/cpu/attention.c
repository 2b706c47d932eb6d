// Causal, padding-aware multi-head attention with grouped K/V heads.
//
// Each (row, head) pair is one independent problem solved with sgemm on its T x T score
// matrix; those problems are spread over OpenMP threads (OpenBLAS runs single-threaded
// inside a parallel region). The full T x T product wastes the upper triangle, but at the
// sequence lengths RLHF trains on here it keeps attention a small share of a step.
#include <cblas.h>
#include <math.h>
#include <stdlib.h>

#include "core/check.h"
#include "ops/cpu/ops_cpu.h"

// Turns scaled scores into probabilities over the keys a query may see:
// row_start <= j <= t. A query before row_start (left padding) sees nothing: zeros.
static void masked_softmax_rows(float *P, int T, int row_start) {
    for (int t = 0; t < T; t++) {
        float *p = P + (long)t * T;
        if (t < row_start) {
            for (int j = 0; j < T; j++) p[j] = 0.0f;
            continue;
        }
        float max_score = -INFINITY;
        for (int j = row_start; j <= t; j++)
            if (p[j] > max_score) max_score = p[j];
        double sum = 0;
        for (int j = row_start; j <= t; j++) {
            p[j] = expf(p[j] - max_score);
            sum += p[j];
        }
        float inv_sum = (float)(1.0 / sum);
        for (int j = 0; j < row_start; j++) p[j] = 0.0f;
        for (int j = row_start; j <= t; j++) p[j] *= inv_sum;
        for (int j = t + 1; j < T; j++) p[j] = 0.0f;
    }
}

void cpu_attention_forward(float *out, float *probs, const float *q, const float *k,
                           const float *v, const int *row_start, int B, int T, int n_heads,
                           int n_kv_heads, int head_dim) {
    const int q_stride = n_heads * head_dim, kv_stride = n_kv_heads * head_dim;
    const int group = n_heads / n_kv_heads;
    const float scale = 1.0f / sqrtf((float)head_dim);
#pragma omp parallel for schedule(static)
    for (int bh = 0; bh < B * n_heads; bh++) {
        int b = bh / n_heads, h = bh % n_heads, kv_head = h / group;
        int start = row_start ? row_start[b] : 0;
        const float *Q = q + (long)b * T * q_stride + h * head_dim;
        const float *K = k + (long)b * T * kv_stride + kv_head * head_dim;
        const float *V = v + (long)b * T * kv_stride + kv_head * head_dim;
        float *P = probs + (long)bh * T * T;
        float *O = out + (long)b * T * q_stride + h * head_dim;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, head_dim, scale, Q, q_stride,
                    K, kv_stride, 0.0f, P, T);
        masked_softmax_rows(P, T, start);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, head_dim, T, 1.0f, P, T, V,
                    kv_stride, 0.0f, O, q_stride);
    }
}

// Query heads that share a K/V head all add into its gradient, so the parallel loop runs
// over (row, K/V head) and the heads of one group are handled in order by one thread.
long cpu_attention_saved_size(int B, int T, int n_heads, int head_dim) {
    return (long)B * n_heads * T * T; // the probabilities
}

// out is not needed here: the saved probabilities carry everything.
void cpu_attention_backward(float *dq, float *dk, float *dv, const float *dout, const float *out,
                            const float *probs, const float *q, const float *k, const float *v,
                            const int *row_start, int B, int T, int n_heads, int n_kv_heads,
                            int head_dim) {
    const int q_stride = n_heads * head_dim, kv_stride = n_kv_heads * head_dim;
    const int group = n_heads / n_kv_heads;
    const float scale = 1.0f / sqrtf((float)head_dim);
#pragma omp parallel
    {
        float *dscores = xaligned_alloc((size_t)T * T * sizeof(float));
#pragma omp for schedule(static)
        for (int bkv = 0; bkv < B * n_kv_heads; bkv++) {
            int b = bkv / n_kv_heads, kv_head = bkv % n_kv_heads;
            int start = row_start ? row_start[b] : 0;
            const float *K = k + (long)b * T * kv_stride + kv_head * head_dim;
            const float *V = v + (long)b * T * kv_stride + kv_head * head_dim;
            float *dK = dk + (long)b * T * kv_stride + kv_head * head_dim;
            float *dV = dv + (long)b * T * kv_stride + kv_head * head_dim;
            for (int h = kv_head * group; h < (kv_head + 1) * group; h++) {
                const float *Q = q + (long)b * T * q_stride + h * head_dim;
                const float *dO = dout + (long)b * T * q_stride + h * head_dim;
                float *dQ = dq + (long)b * T * q_stride + h * head_dim;
                const float *P = probs + ((long)b * n_heads + h) * T * T;
                // dV += P^T dO
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, head_dim, T, 1.0f, P, T,
                            dO, q_stride, 1.0f, dV, kv_stride);
                // dP = dO V^T, then the softmax backward turns it into dS in place.
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, head_dim, 1.0f, dO,
                            q_stride, V, kv_stride, 0.0f, dscores, T);
                for (int t = 0; t < T; t++) {
                    float *ds = dscores + (long)t * T;
                    const float *p = P + (long)t * T;
                    if (t < start) {
                        for (int j = 0; j < T; j++) ds[j] = 0.0f;
                        continue;
                    }
                    double dot = 0;
                    for (int j = start; j <= t; j++) dot += (double)p[j] * ds[j];
                    float dotf = (float)dot;
                    for (int j = 0; j < start; j++) ds[j] = 0.0f;
                    for (int j = start; j <= t; j++) ds[j] = p[j] * (ds[j] - dotf);
                    for (int j = t + 1; j < T; j++) ds[j] = 0.0f;
                }
                // scores = scale * Q K^T:  dQ += scale dS K;  dK += scale dS^T Q
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, head_dim, T, scale,
                            dscores, T, K, kv_stride, 1.0f, dQ, q_stride);
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, head_dim, T, scale,
                            dscores, T, Q, q_stride, 1.0f, dK, kv_stride);
            }
        }
        free(dscores);
    }
}
