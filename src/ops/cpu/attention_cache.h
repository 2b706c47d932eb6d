// What the two kernels that read the KV cache share (ops/cpu/attention_decode.c: a decode
// step, one query per row; ops/cpu/attention_extend.c: several new queries per row): the
// cache's element types and one cached row widened to floats (the softmax's exponential:
// ops/cpu/vector_math.h).
#pragma once
#include <immintrin.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "ops/cpu/ops_cpu.h"
#include "ops/cpu/vector_math.h"
#include "ops/ops.h"
#include "ops/q8.h"

typedef enum { ELEMENTS_F32, ELEMENTS_F16, ELEMENTS_Q8 } CacheElementType;

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
                            int n_heads, int n_kv_heads, int head_dim, float softcap, int window);
// Which kernels the decode and extend ops run, from MARLHF_CPU_ATTENTION (read once, at the
// first attention; any other value is refused): auto (or unset) runs the grouped decode
// step for float32 caches, the per-head one for half and Q8_0 caches (measured no faster
// grouped; the same bits either way), and tiled extensions; grouped runs the grouped step
// for every cache; per-head runs the per-head kernel for everything (the previous code).
typedef enum { CPU_ATTENTION_AUTO, CPU_ATTENTION_PER_HEAD, CPU_ATTENTION_GROUPED } CpuAttentionKernel;
CpuAttentionKernel cpu_attention_kernel(void);

// The tiled extension (ops/cpu/attention_extend.c): query t of row b at slot first_slot + t
// attends to slots [row_start[b], first_slot + t] (the last `window` of those under a sliding
// window; 0: none); T > 1.
void cpu_attention_extend_tiled(float *out, const float *q, const void *k_cache, const void *v_cache,
                                CacheElementType type, const int *row_start, int B, int T, int capacity,
                                int first_slot, int n_heads, int n_kv_heads, int head_dim, float softcap,
                                int window);
