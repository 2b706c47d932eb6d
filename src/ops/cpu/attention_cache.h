// What the two kernels that read the KV cache share (ops/cpu/attention_decode.c: a decode
// step, one query per row; ops/cpu/attention_extend.c: several new queries per row): the
// cache's element types, the exponential of the softmax, and one cached row widened to
// floats.
#pragma once
#include <immintrin.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "ops/cpu/ops_cpu.h"
#include "ops/ops.h"
#include "ops/q8.h"

typedef enum { ELEMENTS_F32, ELEMENTS_F16, ELEMENTS_Q8 } CacheElementType;

// exp(x) in place, for x <= 0 (scores minus their maximum): 2^k * e^r with k = round(x /
// ln 2) and |r| <= ln 2 / 2, e^r by Cephes' expf polynomial; within 2 ulp of expf. Below
// -87.3 (where expf reaches float's smallest normal numbers) it returns about 1.2e-38.
static inline void exp_nonpositive(float *x, int n) {
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

// dst[d] = head kv_head's element d of cache slot `slot` (counted from the cache's start:
// row * capacity + slot in the row), d < head_dim: a float, a half widened, or a Q8_0
// value times its block's scale (one rounding).
static inline void cache_head_to_floats(float *dst, const void *cache, CacheElementType type, long slot, int kv_head,
                                        int n_kv_heads, int head_dim) {
    if (type == ELEMENTS_F32) {
        memcpy(dst, (const float *)cache + slot * n_kv_heads * head_dim + (long)kv_head * head_dim,
               (size_t)head_dim * sizeof(float));
    } else if (type == ELEMENTS_F16) {
        const uint16_t *halves = (const uint16_t *)cache + slot * n_kv_heads * head_dim + (long)kv_head * head_dim;
        int d = 0;
#if defined(__AVX512F__)
        for (; d + 16 <= head_dim; d += 16)
            _mm512_storeu_ps(dst + d, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(halves + d))));
#endif
        for (; d < head_dim; d++) dst[d] = cpu_half_to_float(halves[d]);
    } else {
        const char *record = (const char *)cache + slot * kv_q8_slot_bytes(n_kv_heads, head_dim);
        const int8_t *values = (const int8_t *)record + (long)kv_head * head_dim;
        const float *scales = (const float *)(record + kv_q8_values_bytes(n_kv_heads, head_dim)) +
                              (long)kv_head * kv_q8_blocks_per_head(head_dim);
        int d = 0;
#if defined(__AVX512F__)
        for (; d + 16 <= head_dim; d += 16) {
            const __m512 widened = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(values + d))));
            _mm512_storeu_ps(dst + d, _mm512_mul_ps(widened, _mm512_set1_ps(scales[d / Q8_BLOCK])));
        }
#endif
        for (; d < head_dim; d++) dst[d] = (float)values[d] * scales[d / Q8_BLOCK];
    }
}

// The attention of the previous implementation, one (row, query, head) at a time, each head
// reading its keys and values itself (ops/cpu/attention_decode.c). Kept as the baseline the
// grouped and tiled kernels are tested and measured against, and as the decode step of
// half and Q8_0 caches (below).
void cpu_attention_per_head(float *out, const float *q, const void *k_cache, const void *v_cache,
                            CacheElementType type, const int *row_start, int B, int T, int capacity, int first_slot,
                            int n_heads, int n_kv_heads, int head_dim, float softcap);
// Which kernels the decode and extend ops run, from MARLHF_CPU_ATTENTION (read once, at the
// first attention; any other value is refused): auto (or unset) runs the grouped decode
// step for float32 caches, the per-head one for half and Q8_0 caches (measured no faster
// grouped; the same bits either way), and tiled extensions; grouped runs the grouped step
// for every cache; per-head runs the per-head kernel for everything (the previous code).
typedef enum { CPU_ATTENTION_AUTO, CPU_ATTENTION_PER_HEAD, CPU_ATTENTION_GROUPED } CpuAttentionKernel;
CpuAttentionKernel cpu_attention_kernel(void);

// The tiled extension (ops/cpu/attention_extend.c): query t of row b at slot first_slot + t
// attends to slots [row_start[b], first_slot + t]; T > 1.
void cpu_attention_extend_tiled(float *out, const float *q, const void *k_cache, const void *v_cache,
                                CacheElementType type, const int *row_start, int B, int T, int capacity,
                                int first_slot, int n_heads, int n_kv_heads, int head_dim, float softcap);
