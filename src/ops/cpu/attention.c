// Causal, padding-aware multi-head attention with grouped K/V heads.
//
// Forward: each (row, head) pair is one independent problem, spread over OpenMP threads.
// Query t of a row whose real tokens start at row_start sees keys row_start..t only (under a
// sliding window of W keys, max(row_start, t - W + 1)..t: Mistral, Gemma 2/3), and
// every number it gets is computed over those keys alone, in an order fixed by the key's
// place in the sequence (its distance from row_start), never by the padded length T, the
// row's place in the batch or the thread count. So a sequence gets the same bits alone,
// left-padded, right-padded or in any batch (tests/test_row_invariance.c): PPO's experience
// pass and its training forward, which batch the same rows differently, agree exactly.
// (The previous forward multiplied the whole T x T score matrix with sgemm, whose kernels
// round a row differently for another T.) Each score is one sequential chain of fused
// multiply-adds over the head's dimensions, and each output element one chain over the
// keys; the vector loops below run many such chains side by side, one per lane, which
// changes no chain's order.
//
// Backward: sgemm on the saved T x T probabilities (zero outside each query's keys), per
// (row, K/V head); it needs to be exact, not row-invariant.
#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/check.h"
#include "core/sanitizer.h"
#include "ops/attention_window.h"
#include "ops/cpu/ops_cpu.h"

// Scores and outputs are computed this many lanes at a time: one 512-bit vector of floats.
#define LANES 16

static int round_up(int n, int multiple) { return (n + multiple - 1) / multiple * multiple; }

// Turns query t's scaled scores s[0..n) (keys row_start..t) into probabilities, in place.
static void softmax_in_place(float *s, int n) {
    float max_score = -INFINITY;
    for (int j = 0; j < n; j++)
        if (s[j] > max_score) max_score = s[j];
    double sum = 0;
    for (int j = 0; j < n; j++) {
        s[j] = expf(s[j] - max_score);
        sum += s[j];
    }
    float inv_sum = (float)(1.0 / sum);
    for (int j = 0; j < n; j++) s[j] *= inv_sum;
}

// Columns of the transposed keys: the row's keys plus a vector of zeros, so that a query
// whose window starts inside a vector still reads whole vectors.
static int keys_width(int n_keys) { return round_up(n_keys, LANES) + LANES; }

// One (row, head): Q, K, V, O point at the row's slot 0 of that head; P is its T x T
// probabilities, or NULL where no backward follows: then each query's row of them is
// p_scratch's T floats. keys_t is scratch for the keys transposed, [head_dim][keys_width(T)],
// so that LANES consecutive keys' scores are one vector chain per dimension.
// Most of a prompt's prefill: in the sanitizer build it runs the FMA copy where the CPU has
// the instruction (the same bits: its sums are fmaf chains) and is not checked access by
// access; cpu_attention_forward checks the whole ranges it is given (core/sanitizer.h).
FMA_CLONES SANITIZER_UNCHECKED static void attend_one_head(float *O, float *P, const float *Q, const float *K, const float *V, int start, int T,
                            int q_stride, int kv_stride, int head_dim, float scale, float softcap, int window,
                            float *keys_t, float *p_scratch) {
    const int n_keys = T - start, width = keys_width(n_keys);
    // keys_t[c][j] = K[start + j][c]; zero past the last key, so a block that runs over the
    // end computes scores nobody reads from zeros.
    for (int c = 0; c < head_dim; c++) {
        float *row = keys_t + (long)c * width;
        for (int j = 0; j < n_keys; j++) row[j] = K[(long)(start + j) * kv_stride + c];
        for (int j = n_keys; j < width; j++) row[j] = 0.0f;
    }
    for (int t = 0; t < start; t++) {
        if (P) memset(P + (long)t * T, 0, (size_t)T * sizeof(float));
        for (int c = 0; c < head_dim; c++) O[(long)t * q_stride + c] = 0.0f;
    }
    for (int t = start; t < T; t++) {
        const float *q = Q + (long)t * q_stride;
        float *p_row = P ? P + (long)t * T : p_scratch;
        const int first = attention_first_key(start, t, window), n = t - first + 1;
        float *p = p_row + first; // probabilities of keys first..t, then zeros
        const float *keys_from = keys_t + (first - start); // column 0: key `first`
        // Scores: each key's dot product runs over c in order, one chain per key; four
        // vectors of keys at a time while they last (independent chains keep the FMA units
        // busy), then one.
        int j0 = 0;
        for (; j0 + 4 * LANES <= round_up(n, LANES); j0 += 4 * LANES) {
            float acc[4 * LANES] = {0};
            for (int c = 0; c < head_dim; c++) {
                const float qc = q[c], *kc = keys_from + (long)c * width + j0;
                for (int l = 0; l < 4 * LANES; l++) acc[l] = fmaf(qc, kc[l], acc[l]);
            }
            const int valid = n - j0 < 4 * LANES ? n - j0 : 4 * LANES;
            for (int l = 0; l < valid; l++) p[j0 + l] = acc[l] * scale;
        }
        for (; j0 < n; j0 += LANES) {
            float acc[LANES] = {0};
            for (int c = 0; c < head_dim; c++) {
                const float qc = q[c], *kc = keys_from + (long)c * width + j0;
                for (int l = 0; l < LANES; l++) acc[l] = fmaf(qc, kc[l], acc[l]);
            }
            const int valid = n - j0 < LANES ? n - j0 : LANES;
            for (int l = 0; l < valid; l++) p[j0 + l] = acc[l] * scale;
        }
        cpu_soft_cap(p, n, softcap);
        softmax_in_place(p, n);
        if (P) { // the backward reads whole rows
            memset(p_row, 0, (size_t)first * sizeof(float));
            memset(p + n, 0, (size_t)(T - t - 1) * sizeof(float));
        }
        // Output: each element sums p[j] * V[start + j][c] over j in order; four vectors of
        // dimensions at a time (four independent chains), then the rest one by one.
        float *o = O + (long)t * q_stride;
        const float *v = V + (long)first * kv_stride;
        int c0 = 0;
        for (; c0 + 4 * LANES <= head_dim; c0 += 4 * LANES) {
            float acc[4 * LANES] = {0};
            for (int j = 0; j < n; j++)
                for (int l = 0; l < 4 * LANES; l++) acc[l] = fmaf(p[j], v[(long)j * kv_stride + c0 + l], acc[l]);
            memcpy(o + c0, acc, sizeof acc);
        }
        for (; c0 < head_dim; c0 += LANES) {
            const int w = head_dim - c0 < LANES ? head_dim - c0 : LANES;
            float acc[LANES] = {0};
            for (int j = 0; j < n; j++)
                for (int l = 0; l < w; l++) acc[l] = fmaf(p[j], v[(long)j * kv_stride + c0 + l], acc[l]);
            memcpy(o + c0, acc, (size_t)w * sizeof(float));
        }
    }
}

void cpu_attention_forward(float *out, float *probs, const float *q, const float *k,
                           const float *v, const int *row_start, int B, int T, int n_heads,
                           int n_kv_heads, int head_dim, float softcap, int window) {
    const int q_stride = n_heads * head_dim, kv_stride = n_kv_heads * head_dim;
    const int group = n_heads / n_kv_heads;
    const float scale = 1.0f / sqrtf((float)head_dim);
    SANITIZER_CHECK_RANGE(out, (size_t)B * T * q_stride * sizeof(float));
    SANITIZER_CHECK_RANGE(q, (size_t)B * T * q_stride * sizeof(float));
    SANITIZER_CHECK_RANGE(k, (size_t)B * T * kv_stride * sizeof(float));
    SANITIZER_CHECK_RANGE(v, (size_t)B * T * kv_stride * sizeof(float));
    if (probs) SANITIZER_CHECK_RANGE(probs, (size_t)B * n_heads * T * T * sizeof(float));
#pragma omp parallel
    {
        float *keys_t = xaligned_alloc((size_t)head_dim * keys_width(T) * sizeof(float));
        float *p_scratch = probs ? NULL : xaligned_alloc((size_t)T * sizeof(float));
#pragma omp for schedule(static)
        for (int bh = 0; bh < B * n_heads; bh++) {
            int b = bh / n_heads, h = bh % n_heads, kv_head = h / group;
            int start = row_start ? row_start[b] : 0;
            attend_one_head(out + (long)b * T * q_stride + h * head_dim, probs ? probs + (long)bh * T * T : NULL,
                            q + (long)b * T * q_stride + h * head_dim, k + (long)b * T * kv_stride + kv_head * head_dim,
                            v + (long)b * T * kv_stride + kv_head * head_dim, start, T, q_stride, kv_stride, head_dim,
                            scale, softcap, window, keys_t, p_scratch);
        }
        free(keys_t), free(p_scratch);
    }
}

// Query heads that share a K/V head all add into its gradient, so the parallel loop runs
// over (row, K/V head) and the heads of one group are handled in order by one thread.
long cpu_attention_saved_size(int B, int T, int n_heads, int n_kv_heads, int head_dim, float softcap, int window) {
    return (long)B * n_heads * T * T; // the probabilities
}

// out is not needed here: the saved probabilities carry everything but, under a soft cap,
// the capped scores' slopes 1 - tanh^2(s / cap), which it recomputes from Q K^T.
void cpu_attention_backward(float *dq, float *dk, float *dv, const float *dout, const float *out,
                            const float *probs, const float *q, const float *k, const float *v,
                            const int *row_start, int B, int T, int n_heads, int n_kv_heads,
                            int head_dim, float softcap, int window) {
    const int q_stride = n_heads * head_dim, kv_stride = n_kv_heads * head_dim;
    const int group = n_heads / n_kv_heads;
    const float scale = 1.0f / sqrtf((float)head_dim);
#pragma omp parallel
    {
        float *dscores = xaligned_alloc((size_t)T * T * sizeof(float));
        float *uncapped = softcap > 0.0f ? xaligned_alloc((size_t)T * T * sizeof(float)) : NULL;
#pragma omp for schedule(static)
        for (int bkv = 0; bkv < B * n_kv_heads; bkv++) {
            int b = bkv / n_kv_heads, kv_head = bkv % n_kv_heads;
            int start = row_start ? row_start[b] : 0;
            const float *K = k + (long)b * T * kv_stride + kv_head * head_dim;
            const float *V = v + (long)b * T * kv_stride + kv_head * head_dim;
            float *dK = dk + (long)b * T * kv_stride + kv_head * head_dim;
            float *dV = dv + (long)b * T * kv_stride + kv_head * head_dim;
            for (int h = kv_head * group; h < (kv_head + 1) * group; h++) {
                // dq, dk and dv are overwritten (ops.h): the group's first head writes dK and
                // dV (beta 0), the others add.
                const float kv_beta = h == kv_head * group ? 0.0f : 1.0f;
                const float *Q = q + (long)b * T * q_stride + h * head_dim;
                const float *dO = dout + (long)b * T * q_stride + h * head_dim;
                float *dQ = dq + (long)b * T * q_stride + h * head_dim;
                const float *P = probs + ((long)b * n_heads + h) * T * T;
                // dV += P^T dO
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, head_dim, T, 1.0f, P, T,
                            dO, q_stride, kv_beta, dV, kv_stride);
                // dP = dO V^T, then the softmax backward turns it into dS in place.
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, head_dim, 1.0f, dO,
                            q_stride, V, kv_stride, 0.0f, dscores, T);
                if (uncapped) // the scores before the cap, for its slopes below
                    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, head_dim, scale, Q, q_stride, K,
                                kv_stride, 0.0f, uncapped, T);
                for (int t = 0; t < T; t++) {
                    float *ds = dscores + (long)t * T;
                    const float *p = P + (long)t * T;
                    if (t < start) {
                        for (int j = 0; j < T; j++) ds[j] = 0.0f;
                        continue;
                    }
                    const int first = attention_first_key(start, t, window);
                    double dot = 0;
                    for (int j = first; j <= t; j++) dot += (double)p[j] * ds[j];
                    float dotf = (float)dot;
                    for (int j = 0; j < first; j++) ds[j] = 0.0f;
                    for (int j = first; j <= t; j++) ds[j] = p[j] * (ds[j] - dotf);
                    if (uncapped) { // d(cap tanh(s / cap)) / ds = 1 - tanh^2(s / cap), in the window only
                        const float *s = uncapped + (long)t * T;
#pragma omp simd
                        for (int j = first; j <= t; j++) {
                            const float capped = tanh_one(s[j] / softcap);
                            ds[j] *= 1.0f - capped * capped;
                        }
                    }
                    for (int j = t + 1; j < T; j++) ds[j] = 0.0f;
                }
                // scores = scale * Q K^T:  dQ = scale dS K;  dK += scale dS^T Q
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, head_dim, T, scale,
                            dscores, T, K, kv_stride, 0.0f, dQ, q_stride);
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, head_dim, T, scale,
                            dscores, T, Q, q_stride, kv_beta, dK, kv_stride);
            }
        }
        free(dscores);
        free(uncapped);
    }
}
