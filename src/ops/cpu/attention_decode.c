// Attention for one new token per row against the KV cache (generation). Each (row, head)
// is one query against the row's cached keys: its scores, their softmax, and the weighted
// sum of the values. Decoding reads the whole cache every step, so this is what slows a
// long context down; three things keep it near the memory's speed:
//  - the query-key dot products in AVX-512 registers with one horizontal sum per key (a
//    vectorised reduction the compiler writes spills the vector and adds 16 scalars);
//  - the weighted sum of the values with 64 output lanes held in registers across the
//    keys (a loop over the output in memory stores and reloads it for every key);
//  - the exponentials by a polynomial the compiler vectorises (within 2 ulp of expf).
// Without AVX-512 the first two are plain loops. Each (row, head) is one thread's, in a
// fixed order, so the result depends neither on the threads nor on the other rows.
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "core/check.h"
#include "ops/cpu/ops_cpu.h"

// exp(x) in place, for x <= 0 (scores minus their maximum): 2^k * e^r with k = round(x /
// ln 2) and |r| <= ln 2 / 2, e^r by Cephes' expf polynomial; within 2 ulp of expf. Below
// -87.3 (where expf reaches float's smallest normal numbers) it returns about 1.2e-38.
static void exp_nonpositive(float *x, int n) {
#pragma omp simd
    for (int i = 0; i < n; i++) {
        const float v = x[i] < -87.3f ? -87.3f : x[i];
        // Adding 1.5 * 2^23 rounds v / ln 2 to an integer in the low mantissa bits.
        const float k = (v * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
        const float r = v - k * 0.693359375f + k * 2.12194440e-4f; // ln 2 in two parts
        float p = 1.9875691500e-4f;
        p = p * r + 1.3981999507e-3f;
        p = p * r + 8.3334519073e-3f;
        p = p * r + 4.1665795894e-2f;
        p = p * r + 1.6666665459e-1f;
        p = p * r + 5.0000001201e-1f;
        p = p * r * r + r + 1.0f;
        const int bits = ((int)k + 127) << 23; // 2^k
        float power;
        memcpy(&power, &bits, sizeof power);
        x[i] = p * power;
    }
}

static inline float dot_product(const float *a, const float *b, int n) {
    int d = 0;
    float sum = 0.0f;
#if defined(__AVX512F__)
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
    for (; d + 32 <= n; d += 32) {
        acc0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + d), _mm512_loadu_ps(b + d), acc0);
        acc1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + d + 16), _mm512_loadu_ps(b + d + 16), acc1);
    }
    for (; d + 16 <= n; d += 16) acc0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + d), _mm512_loadu_ps(b + d), acc0);
    sum = _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
#endif
#pragma omp simd reduction(+ : sum)
    for (int e = d; e < n; e++) sum += a[e] * b[e];
    return sum;
}

// out[d] = scale * sum_j weights[j] * values[j * stride + d], d < head_dim.
static void weighted_sum(float *out, const float *weights, const float *values, long stride, int n, int head_dim,
                         float scale) {
    int d = 0;
#if defined(__AVX512F__)
    for (; d + 64 <= head_dim; d += 64) {
        __m512 acc0 = _mm512_setzero_ps(), acc1 = acc0, acc2 = acc0, acc3 = acc0;
        for (int j = 0; j < n; j++) {
            const float *value = values + (long)j * stride + d;
            const __m512 weight = _mm512_set1_ps(weights[j]);
            acc0 = _mm512_fmadd_ps(weight, _mm512_loadu_ps(value), acc0);
            acc1 = _mm512_fmadd_ps(weight, _mm512_loadu_ps(value + 16), acc1);
            acc2 = _mm512_fmadd_ps(weight, _mm512_loadu_ps(value + 32), acc2);
            acc3 = _mm512_fmadd_ps(weight, _mm512_loadu_ps(value + 48), acc3);
        }
        const __m512 factor = _mm512_set1_ps(scale);
        _mm512_storeu_ps(out + d, _mm512_mul_ps(acc0, factor));
        _mm512_storeu_ps(out + d + 16, _mm512_mul_ps(acc1, factor));
        _mm512_storeu_ps(out + d + 32, _mm512_mul_ps(acc2, factor));
        _mm512_storeu_ps(out + d + 48, _mm512_mul_ps(acc3, factor));
    }
#endif
    if (d == head_dim) return;
    memset(out + d, 0, (size_t)(head_dim - d) * sizeof(float));
    for (int j = 0; j < n; j++) {
        const float *value = values + (long)j * stride;
        for (int e = d; e < head_dim; e++) out[e] += weights[j] * value[e];
    }
    for (int e = d; e < head_dim; e++) out[e] *= scale;
}

void cpu_attention_decode(float *out, const float *q, const float *k_cache, const float *v_cache,
                          const int *row_start, int B, int capacity, int length, int n_heads,
                          int n_kv_heads, int head_dim) {
    const int kv_width = n_kv_heads * head_dim, q_width = n_heads * head_dim;
    const int group = n_heads / n_kv_heads;
    const float scale = 1.0f / sqrtf((float)head_dim);
#pragma omp parallel
    {
        float *scores = xmalloc((size_t)length * sizeof(float));
#pragma omp for schedule(static)
        for (int bh = 0; bh < B * n_heads; bh++) {
            const int b = bh / n_heads, h = bh % n_heads, kv_head = h / group;
            const int start = row_start ? row_start[b] : 0, n = length - start;
            const float *query = q + (long)b * q_width + h * head_dim;
            const float *keys = k_cache + ((long)b * capacity + start) * kv_width + kv_head * head_dim;
            const float *values = v_cache + ((long)b * capacity + start) * kv_width + kv_head * head_dim;
            float max_score = -INFINITY;
            for (int j = 0; j < n; j++) {
                scores[j] = dot_product(query, keys + (long)j * kv_width, head_dim) * scale;
                if (scores[j] > max_score) max_score = scores[j];
            }
            for (int j = 0; j < n; j++) scores[j] -= max_score;
            exp_nonpositive(scores, n);
            double sum = 0;
            for (int j = 0; j < n; j++) sum += scores[j];
            weighted_sum(out + (long)b * q_width + h * head_dim, scores, values, kv_width, n, head_dim,
                         (float)(1.0 / sum));
        }
        free(scores);
    }
}

void cpu_cache_write(float *cache, const float *x, int B, int T, int capacity, int slot, int width) {
#pragma omp parallel for schedule(static)
    for (int b = 0; b < B; b++)
        memcpy(cache + ((long)b * capacity + slot) * width, x + (long)b * T * width,
               (size_t)T * width * sizeof(float));
}

void cpu_copy_rows(float *dst, long dst_stride, const float *src, long src_stride, int rows, int width) {
    for (int r = 0; r < rows; r++)
        memcpy(dst + (long)r * dst_stride, src + (long)r * src_stride, (size_t)width * sizeof(float));
}
