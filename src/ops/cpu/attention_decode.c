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
//
// The KV cache is float32, or IEEE half (--kv-cache f16: half the memory to read each
// step): the same kernel, widening each key and value as it reads them (F16C's
// conversions where the compiler has them, else the portable cpu_half_to_float). Or Q8_0
// blocks (--kv-cache q8_0: a little over a quarter of float32's bytes; ops/ops.h gives the
// slot layout): the same loops again, each block's int8 values widened to float and
// multiplied by its scale. The query stays float (llama.cpp quantizes it to Q8_0 too and
// takes integer dot products): one more rounding saved, and widening 16 bytes is not what
// limits a step that reads the whole cache from memory.
#include <immintrin.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/check.h"
#include "ops/attention_window.h"
#include "ops/cpu/attention_cache.h"

// The grouped decode: keys per block of the score loop; query heads that share a pass over
// the keys or the values (4 heads x 4 vectors of 16 lanes are 16 accumulators, half the AVX-512 registers).
// PREFETCH_SLOTS: how many slots ahead the cached rows are asked for.
enum { DECODE_KEY_BLOCK = 256, HEADS_IN_REGISTERS = 4, PREFETCH_SLOTS = 16 };

uint16_t cpu_float_to_half(float value) {
    uint32_t bits;
    memcpy(&bits, &value, sizeof bits);
    const uint16_t sign = (uint16_t)((bits >> 16) & 0x8000);
    const uint32_t magnitude = bits & 0x7FFFFFFFu;
    if (magnitude > 0x7F800000u) return sign | 0x7E00;   // NaN (quiet)
    if (magnitude >= 0x477FF000u) return sign | 0x7C00;  // 65520 and up round to infinity
    if (magnitude < 0x38800000u) {                       // below 2^-14: a subnormal half
        float scaled;
        memcpy(&scaled, &magnitude, sizeof scaled);
        // In units of 2^-24, rounded to nearest even (rintf's default mode); 1024 is 2^-14,
        // whose bits are those of the smallest normal half.
        return sign | (uint16_t)rintf(scaled * 16777216.0f);
    }
    // Rebias the exponent (127 -> 15) and round the mantissa to 10 bits, ties to even; a
    // carry out of the mantissa correctly moves the exponent up.
    const uint32_t rounded = magnitude + 0xFFFu + ((magnitude >> 13) & 1u);
    return sign | (uint16_t)((rounded - 0x38000000u) >> 13);
}

float cpu_half_to_float(uint16_t half) {
    const uint32_t sign = (uint32_t)(half & 0x8000) << 16, exponent = (half >> 10) & 0x1F, mantissa = half & 0x3FF;
    uint32_t bits;
    if (exponent == 0) { // zero or subnormal: mantissa * 2^-24
        const float magnitude = (float)mantissa * 5.9604644775390625e-8f;
        return sign ? -magnitude : magnitude;
    }
    if (exponent == 0x1F) bits = sign | 0x7F800000u | (mantissa << 13); // infinity, NaN
    else bits = sign | ((exponent + 112) << 23) | (mantissa << 13);
    float value;
    memcpy(&value, &bits, sizeof value);
    return value;
}

// A KV cache's elements: floats, or halves widened to float as they are read. The kernels
// below take `half` as a loop-invariant flag, which the compiler moves out of the loops.
typedef struct {
    const void *base;
    bool half;
} CacheElements;

static inline float cache_element(CacheElements cache, long at) {
    return cache.half ? cpu_half_to_float(((const uint16_t *)cache.base)[at]) : ((const float *)cache.base)[at];
}

#if defined(__AVX512F__)
static inline __m512 cache_lanes(CacheElements cache, long at) { // elements [at, at + 16)
    return cache.half ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)cache.base + at)))
                      : _mm512_loadu_ps((const float *)cache.base + at);
}
#endif

// sum + sum_e a[e] * keys[at + e], d <= e < n: the elements after the vectors. One
// function, never inlined, so that the per-head and grouped kernels run the same code for
// it (a vectorised reduction's order is the compiler's choice at each place it is inlined).
static __attribute__((noinline)) float dot_tail(float sum, const float *a, CacheElements keys, long at, int d, int n) {
#pragma omp simd reduction(+ : sum)
    for (int e = d; e < n; e++) sum += a[e] * cache_element(keys, at + e);
    return sum;
}

// sum_d a[d] * keys[at + d], d < n.
static inline __attribute__((always_inline)) float dot_product(const float *a, CacheElements keys, long at, int n) {
    int d = 0;
    float sum = 0.0f;
#if defined(__AVX512F__)
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
    for (; d + 32 <= n; d += 32) {
        acc0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + d), cache_lanes(keys, at + d), acc0);
        acc1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + d + 16), cache_lanes(keys, at + d + 16), acc1);
    }
    for (; d + 16 <= n; d += 16) acc0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + d), cache_lanes(keys, at + d), acc0);
    sum = _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
#endif
    return d < n ? dot_tail(sum, a, keys, at, d, n) : sum;
}

// out[d] = scale * sum_j weights[j] * values[first + j * stride + d], d < head_dim.
static void weighted_sum(float *out, const float *weights, CacheElements values, long first, long stride, int n,
                         int head_dim, float scale) {
    int d = 0;
#if defined(__AVX512F__)
    for (; d + 64 <= head_dim; d += 64) {
        __m512 acc0 = _mm512_setzero_ps(), acc1 = acc0, acc2 = acc0, acc3 = acc0;
        for (int j = 0; j < n; j++) {
            const long at = first + (long)j * stride + d;
            const __m512 weight = _mm512_set1_ps(weights[j]);
            acc0 = _mm512_fmadd_ps(weight, cache_lanes(values, at), acc0);
            acc1 = _mm512_fmadd_ps(weight, cache_lanes(values, at + 16), acc1);
            acc2 = _mm512_fmadd_ps(weight, cache_lanes(values, at + 32), acc2);
            acc3 = _mm512_fmadd_ps(weight, cache_lanes(values, at + 48), acc3);
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
        const long at = first + (long)j * stride;
        for (int e = d; e < head_dim; e++) out[e] += weights[j] * cache_element(values, at + e);
    }
    for (int e = d; e < head_dim; e++) out[e] *= scale;
}

// ---- the Q8_0 cache ----

// One head's keys or values in consecutive slots of a Q8_0 cache: slot j's int8 values and
// its block scales.
typedef struct {
    const char *first; // the first slot's record
    long stride;       // bytes from one slot's record to the next
    long values_at, scales_at; // the head's values and scales, in bytes from a record's start
} Q8Slots;

static inline const int8_t *q8_slot_values(Q8Slots slots, int j) {
    return (const int8_t *)(slots.first + (long)j * slots.stride + slots.values_at);
}
static inline const float *q8_slot_scales(Q8Slots slots, int j) {
    return (const float *)(slots.first + (long)j * slots.stride + slots.scales_at);
}

// Asks for the cache lines of bytes [at, at + bytes) ahead of their use. The grouped loops
// do several heads' work per cached row, so fewer rows' loads are in flight at once than in
// a loop of one head; without this a step waits on memory's latency, not its bandwidth.
static inline void prefetch_bytes(const void *at, long bytes) {
    for (long offset = 0; offset < bytes; offset += 64) _mm_prefetch((const char *)at + offset, _MM_HINT_T0);
}

static inline int block_end(int d, int n) { // the end of the block holding element d of n
    const int end = (d / Q8_BLOCK + 1) * Q8_BLOCK;
    return end < n ? end : n;
}

#if defined(__AVX512F__)
static inline __m512 widen_int8(const int8_t *x) { // x[0, 16) as floats
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)x)));
}
#endif

// sum + the blocks' products from element d on (q8_dot_product's elements after the
// vectors; never inlined, as dot_tail).
static __attribute__((noinline)) float q8_dot_tail(float sum, const float *a, const int8_t *x, const float *scales,
                                                   int d, int n) {
    while (d < n) {
        const int end = block_end(d, n);
        float block = 0.0f;
#pragma omp simd reduction(+ : block)
        for (int e = d; e < end; e++) block += a[e] * (float)x[e];
        sum += block * scales[d / Q8_BLOCK];
        d = end;
    }
    return sum;
}

// sum_d a[d] * x[d] * scales[d / Q8_BLOCK], d < n: each block's products summed, then
// scaled once.
static inline __attribute__((always_inline)) float q8_dot_product(const float *a, const int8_t *x, const float *scales, int n) {
    int d = 0;
    float sum = 0.0f;
#if defined(__AVX512F__)
    // Alternate blocks go to two accumulators, so consecutive blocks do not wait on each other.
    __m512 acc[2] = {_mm512_setzero_ps(), _mm512_setzero_ps()};
    for (; d + Q8_BLOCK <= n; d += Q8_BLOCK) {
        __m512 block = _mm512_mul_ps(_mm512_loadu_ps(a + d), widen_int8(x + d));
        block = _mm512_fmadd_ps(_mm512_loadu_ps(a + d + 16), widen_int8(x + d + 16), block);
        acc[(d / Q8_BLOCK) & 1] = _mm512_fmadd_ps(block, _mm512_set1_ps(scales[d / Q8_BLOCK]), acc[(d / Q8_BLOCK) & 1]);
    }
    if (d + 16 <= n) { // a last block of 16 to 31
        acc[0] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_loadu_ps(a + d), widen_int8(x + d)),
                                 _mm512_set1_ps(scales[d / Q8_BLOCK]), acc[0]);
        d += 16;
    }
    sum = _mm512_reduce_add_ps(_mm512_add_ps(acc[0], acc[1]));
#endif
    return d < n ? q8_dot_tail(sum, a, x, scales, d, n) : sum;
}

#if defined(__AVX512F__)
// The scores of `heads` query heads (queries: consecutive rows of head_dim; a compile-time
// constant once inlined) against one key: scores[h * scores_stride] = scale * dot_product
// (or q8_dot_product) of query h, the same operations in the same order, each vector of the
// key widened once for all the heads.
static inline __attribute__((always_inline)) void group_dot_products(int heads, float *scores, long scores_stride,
                                                                      const float *queries, int head_dim, float scale,
                                                                      CacheElements keys, long at, const int8_t *x,
                                                                      const float *block_scales, bool q8) {
    __m512 acc[HEADS_IN_REGISTERS][2];
    for (int h = 0; h < heads; h++) acc[h][0] = acc[h][1] = _mm512_setzero_ps();
    int d = 0;
    if (q8) {
        // Blocks 2k and 2k + 1 to the two accumulators, as q8_dot_product alternates them.
        for (; d + 2 * Q8_BLOCK <= head_dim; d += 2 * Q8_BLOCK) {
            const __m512 x0 = widen_int8(x + d), x1 = widen_int8(x + d + 16), x2 = widen_int8(x + d + 32),
                         x3 = widen_int8(x + d + 48);
            const __m512 scale0 = _mm512_set1_ps(block_scales[d / Q8_BLOCK]),
                         scale1 = _mm512_set1_ps(block_scales[d / Q8_BLOCK + 1]);
            for (int h = 0; h < heads; h++) {
                const float *a = queries + (long)h * head_dim + d;
                __m512 block = _mm512_mul_ps(_mm512_loadu_ps(a), x0);
                block = _mm512_fmadd_ps(_mm512_loadu_ps(a + 16), x1, block);
                acc[h][0] = _mm512_fmadd_ps(block, scale0, acc[h][0]);
                block = _mm512_mul_ps(_mm512_loadu_ps(a + 32), x2);
                block = _mm512_fmadd_ps(_mm512_loadu_ps(a + 48), x3, block);
                acc[h][1] = _mm512_fmadd_ps(block, scale1, acc[h][1]);
            }
        }
        if (d + Q8_BLOCK <= head_dim) { // an even block left
            const __m512 x0 = widen_int8(x + d), x1 = widen_int8(x + d + 16);
            const __m512 scale0 = _mm512_set1_ps(block_scales[d / Q8_BLOCK]);
            for (int h = 0; h < heads; h++) {
                const float *a = queries + (long)h * head_dim + d;
                __m512 block = _mm512_mul_ps(_mm512_loadu_ps(a), x0);
                block = _mm512_fmadd_ps(_mm512_loadu_ps(a + 16), x1, block);
                acc[h][0] = _mm512_fmadd_ps(block, scale0, acc[h][0]);
            }
            d += Q8_BLOCK;
        }
        if (d + 16 <= head_dim) { // a last block of 16 to 31
            const __m512 x0 = widen_int8(x + d), scale0 = _mm512_set1_ps(block_scales[d / Q8_BLOCK]);
            for (int h = 0; h < heads; h++)
                acc[h][0] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_loadu_ps(queries + (long)h * head_dim + d), x0), scale0,
                                            acc[h][0]);
            d += 16;
        }
    } else {
        for (; d + 32 <= head_dim; d += 32) {
            const __m512 k0 = cache_lanes(keys, at + d), k1 = cache_lanes(keys, at + d + 16);
            for (int h = 0; h < heads; h++) {
                const float *a = queries + (long)h * head_dim + d;
                acc[h][0] = _mm512_fmadd_ps(_mm512_loadu_ps(a), k0, acc[h][0]);
                acc[h][1] = _mm512_fmadd_ps(_mm512_loadu_ps(a + 16), k1, acc[h][1]);
            }
        }
        for (; d + 16 <= head_dim; d += 16) {
            const __m512 k0 = cache_lanes(keys, at + d);
            for (int h = 0; h < heads; h++)
                acc[h][0] = _mm512_fmadd_ps(_mm512_loadu_ps(queries + (long)h * head_dim + d), k0, acc[h][0]);
        }
    }
    for (int h = 0; h < heads; h++) {
        float sum = _mm512_reduce_add_ps(_mm512_add_ps(acc[h][0], acc[h][1]));
        const float *a = queries + (long)h * head_dim;
        if (d < head_dim)
            sum = q8 ? q8_dot_tail(sum, a, x, block_scales, d, head_dim) : dot_tail(sum, a, keys, at, d, head_dim);
        scores[h * scores_stride] = scale * sum;
    }
}

static void group_dot_products_any(int heads, float *scores, long scores_stride, const float *queries, int head_dim,
                                   float scale, CacheElements keys, long at, const int8_t *x, const float *block_scales,
                                   bool q8) {
#define GROUP_DOTS(H)                                                                                                  \
    case H:                                                                                                            \
        if (q8) group_dot_products(H, scores, scores_stride, queries, head_dim, scale, keys, at, x, block_scales, true); \
        else group_dot_products(H, scores, scores_stride, queries, head_dim, scale, keys, at, x, block_scales, false);  \
        break;
    switch (heads) { GROUP_DOTS(1) GROUP_DOTS(2) GROUP_DOTS(3) GROUP_DOTS(4) }
#undef GROUP_DOTS
}
#endif

// out[d] = scale * sum_j weights[j] * value_j[d], d < head_dim, value_j[d] the int8 value of
// slot j times its block's scale: weights[j] times the block's scale multiplies a block.
static void q8_weighted_sum(float *out, const float *weights, Q8Slots values, int n, int head_dim, float scale) {
    int d = 0;
#if defined(__AVX512F__)
    const __m512 factor = _mm512_set1_ps(scale);
    for (; d + 64 <= head_dim; d += 64) { // two whole blocks, 64 lanes held in registers
        __m512 acc0 = _mm512_setzero_ps(), acc1 = acc0, acc2 = acc0, acc3 = acc0;
        for (int j = 0; j < n; j++) {
            const int8_t *x = q8_slot_values(values, j) + d;
            const float *block_scales = q8_slot_scales(values, j) + d / Q8_BLOCK;
            const __m512 first = _mm512_set1_ps(weights[j] * block_scales[0]);
            const __m512 second = _mm512_set1_ps(weights[j] * block_scales[1]);
            acc0 = _mm512_fmadd_ps(first, widen_int8(x), acc0);
            acc1 = _mm512_fmadd_ps(first, widen_int8(x + 16), acc1);
            acc2 = _mm512_fmadd_ps(second, widen_int8(x + 32), acc2);
            acc3 = _mm512_fmadd_ps(second, widen_int8(x + 48), acc3);
        }
        _mm512_storeu_ps(out + d, _mm512_mul_ps(acc0, factor));
        _mm512_storeu_ps(out + d + 16, _mm512_mul_ps(acc1, factor));
        _mm512_storeu_ps(out + d + 32, _mm512_mul_ps(acc2, factor));
        _mm512_storeu_ps(out + d + 48, _mm512_mul_ps(acc3, factor));
    }
    for (; d + 16 <= head_dim; d += 16) { // 16 lanes (d is a multiple of 16: one block's)
        __m512 acc = _mm512_setzero_ps();
        for (int j = 0; j < n; j++)
            acc = _mm512_fmadd_ps(_mm512_set1_ps(weights[j] * q8_slot_scales(values, j)[d / Q8_BLOCK]),
                                  widen_int8(q8_slot_values(values, j) + d), acc);
        _mm512_storeu_ps(out + d, _mm512_mul_ps(acc, factor));
    }
#endif
    if (d == head_dim) return;
    memset(out + d, 0, (size_t)(head_dim - d) * sizeof(float));
    for (int j = 0; j < n; j++) {
        const int8_t *x = q8_slot_values(values, j);
        const float *block_scales = q8_slot_scales(values, j);
        for (int e = d; e < head_dim;) {
            const int end = block_end(e, head_dim);
            const float weight = weights[j] * block_scales[e / Q8_BLOCK];
#pragma omp simd
            for (int i = e; i < end; i++) out[i] += weight * (float)x[i];
            e = end;
        }
    }
    for (int e = d; e < head_dim; e++) out[e] *= scale;
}

// What both decode kernels derive from the shapes: row widths, the group size, the score
// scale, how the cache's elements read.
typedef struct {
    int kv_width, q_width, group;
    float scale;
    bool half, q8;
    CacheElements keys, values;
} CacheShape;

static CacheShape cache_shape(const void *k_cache, const void *v_cache, CacheElementType type, int n_heads,
                              int n_kv_heads, int head_dim) {
    const bool half = type == ELEMENTS_F16;
    return (CacheShape){n_kv_heads * head_dim, n_heads * head_dim, n_heads / n_kv_heads, 1.0f / sqrtf((float)head_dim),
                        half, type == ELEMENTS_Q8, {k_cache, half}, {v_cache, half}};
}

// The previous kernel, for every cache: `type` says whether k_cache and v_cache hold floats,
// halves or Q8_0 slot records. Query t of row b (q and out: [B * T, n_heads * head_dim])
// sits at slot first_slot + t and attends to the row's slots [row_start[b], first_slot + t]
// (under a sliding window of `window` slots, 0 for none, the last `window` of those): a decode
// step is T = 1. Each (row, query, head) reads its keys and values itself.
void cpu_attention_per_head(float *out, const float *q, const void *k_cache, const void *v_cache,
                            CacheElementType type, const int *row_start, int B, int T, int capacity, int first_slot,
                            int n_heads, int n_kv_heads, int head_dim, float softcap, int window) {
    const CacheShape shape = cache_shape(k_cache, v_cache, type, n_heads, n_kv_heads, head_dim);
    const int kv_width = shape.kv_width, q_width = shape.q_width, group = shape.group;
    const float scale = shape.scale;
    const bool q8 = shape.q8;
    const CacheElements keys = shape.keys, values = shape.values;
    const long q8_slot = kv_q8_slot_bytes(n_kv_heads, head_dim), q8_values = kv_q8_values_bytes(n_kv_heads, head_dim);
#pragma omp parallel
    {
        float *scores = xmalloc((size_t)(first_slot + T) * sizeof(float));
#pragma omp for schedule(static)
        for (long item = 0; item < (long)B * T * n_heads; item++) {
            const int h = (int)(item % n_heads), t = (int)(item / n_heads % T), b = (int)(item / n_heads / T);
            const int kv_head = h / group;
            const int start = attention_first_key(row_start ? row_start[b] : 0, first_slot + t, window);
            const int n = first_slot + t + 1 - start;
            const float *query = q + ((long)b * T + t) * q_width + h * head_dim;
            const long first = ((long)b * capacity + start) * kv_width + kv_head * head_dim; // element index
            // A Q8_0 cache's slots of this head: records from the row's first slot on.
            const long first_record = ((long)b * capacity + start) * q8_slot;
            const long values_at = (long)kv_head * head_dim;
            const long scales_at = q8_values + (long)kv_head * kv_q8_blocks_per_head(head_dim) * (long)sizeof(float);
            const Q8Slots q8_keys = {(const char *)k_cache + first_record, q8_slot, values_at, scales_at};
            const Q8Slots q8_vals = {(const char *)v_cache + first_record, q8_slot, values_at, scales_at};
            for (int j = 0; j < n; j++)
                scores[j] = scale * (q8 ? q8_dot_product(query, q8_slot_values(q8_keys, j), q8_slot_scales(q8_keys, j),
                                                         head_dim)
                                        : dot_product(query, keys, first + (long)j * kv_width, head_dim));
            cpu_soft_cap(scores, n, softcap);
            float max_score = -INFINITY;
            for (int j = 0; j < n; j++)
                if (scores[j] > max_score) max_score = scores[j];
            for (int j = 0; j < n; j++) scores[j] -= max_score;
            exp_nonpositive(scores, n);
            double sum = 0;
            for (int j = 0; j < n; j++) sum += scores[j];
            float *result = out + ((long)b * T + t) * q_width + h * head_dim;
            if (q8) q8_weighted_sum(result, scores, q8_vals, n, head_dim, (float)(1.0 / sum));
            else weighted_sum(result, scores, values, first, kv_width, n, head_dim, (float)(1.0 / sum));
        }
        free(scores);
    }
}

// ---- a decode step, the query heads of a GQA group together ----
// The n_heads / n_kv_heads query heads that share a KV head take their scores from the
// same keys and their sums from the same values, so they are computed together: each
// cached key and value comes from memory once for the whole group (the group's other heads
// find it in the L1 cache). Each head's arithmetic is the per-head kernel's above, in the
// same order, so the results are the same bit for bit. Three parallel loops share the work
// between the threads even when there are fewer (row, KV head) pairs than threads (batch
// 1 of SmolLM2: 3): the scores by blocks of keys, the softmax of each (row, head), and the
// weighted sums by blocks of 16 output lanes.


#if defined(__AVX512F__)
// Lanes [d, d + 16 * vectors) of the weighted sums of `heads` query heads (`heads` and
// `vectors` compile-time constants once inlined, so the accumulators stay in registers),
// over the n slots of values: out_h[e] = inverse_sums[h] * sum_j weights[h * weights_stride
// + j] * value_j[e], each lane one fused multiply-add per slot in slot order, as
// weighted_sum and q8_weighted_sum do.
static inline __attribute__((always_inline)) void group_lanes_fma(int heads, int vectors, float *out, int head_dim,
                                                                   const float *weights, long weights_stride,
                                                                   const float *inverse_sums, CacheElements values,
                                                                   long first, long stride, Q8Slots q8_values, bool q8,
                                                                   int n, int d) {
    __m512 acc[HEADS_IN_REGISTERS][4];
    for (int h = 0; h < heads; h++)
        for (int i = 0; i < vectors; i++) acc[h][i] = _mm512_setzero_ps();
    for (int j = 0; j < n; j++) {
        if (j + PREFETCH_SLOTS < n) {
            if (q8) {
                prefetch_bytes(q8_slot_values(q8_values, j + PREFETCH_SLOTS) + d, 16 * vectors);
                prefetch_bytes(q8_slot_scales(q8_values, j + PREFETCH_SLOTS) + d / Q8_BLOCK, 4);
            } else {
                prefetch_bytes((const char *)values.base + (first + (long)(j + PREFETCH_SLOTS) * stride + d) * (values.half ? 2 : 4),
                               16L * vectors * (values.half ? 2 : 4));
            }
        }
        __m512 lanes[4];
        float block_scales[4] = {1.0f, 1.0f, 1.0f, 1.0f};
        for (int i = 0; i < vectors; i++) {
            if (q8) {
                lanes[i] = widen_int8(q8_slot_values(q8_values, j) + d + 16 * i);
                if (i % 2 == 0) block_scales[i] = q8_slot_scales(q8_values, j)[(d + 16 * i) / Q8_BLOCK];
            } else {
                lanes[i] = cache_lanes(values, first + (long)j * stride + d + 16 * i);
            }
        }
        for (int h = 0; h < heads; h++) {
            const float weight = weights[h * weights_stride + j];
            __m512 factor = _mm512_set1_ps(weight);
            for (int i = 0; i < vectors; i++) {
                // A Q8_0 block's factor: the weight times its scale (d is a multiple of 64, so
                // vectors 2k and 2k + 1 are one block's).
                if (q8 && i % 2 == 0) factor = _mm512_set1_ps(weight * block_scales[i]);
                acc[h][i] = _mm512_fmadd_ps(factor, lanes[i], acc[h][i]);
            }
        }
    }
    for (int h = 0; h < heads; h++)
        for (int i = 0; i < vectors; i++)
            _mm512_storeu_ps(out + (long)h * head_dim + d + 16 * i,
                             _mm512_mul_ps(acc[h][i], _mm512_set1_ps(inverse_sums[h])));
}

static void group_lanes_fma_any(int heads, int vectors, float *out, int head_dim, const float *weights,
                                long weights_stride, const float *inverse_sums, CacheElements values, long first,
                                long stride, Q8Slots q8_values, bool q8, int n, int d) {
#define GROUP_LANES(H, V)                                                                                              \
    case H * 8 + V:                                                                                                    \
        if (q8) group_lanes_fma(H, V, out, head_dim, weights, weights_stride, inverse_sums, values, first, stride,     \
                                q8_values, true, n, d);                                                                \
        else group_lanes_fma(H, V, out, head_dim, weights, weights_stride, inverse_sums, values, first, stride,        \
                             q8_values, false, n, d);                                                                  \
        break;
    switch (heads * 8 + vectors) {
        GROUP_LANES(1, 1) GROUP_LANES(1, 2) GROUP_LANES(1, 3) GROUP_LANES(1, 4)
        GROUP_LANES(2, 1) GROUP_LANES(2, 2) GROUP_LANES(2, 3) GROUP_LANES(2, 4)
        GROUP_LANES(3, 1) GROUP_LANES(3, 2) GROUP_LANES(3, 3) GROUP_LANES(3, 4)
        GROUP_LANES(4, 1) GROUP_LANES(4, 2) GROUP_LANES(4, 3) GROUP_LANES(4, 4)
    }
#undef GROUP_LANES
}
#endif

// The lanes [d, head_dim) that the per-head kernels leave to plain loops (a multiply, then
// an add), for `heads` query heads: each value row is read once for all of them.
static void group_lanes_plain(int heads, float *out, int head_dim, const float *weights, long weights_stride,
                              const float *inverse_sums, CacheElements values, long first, long stride,
                              Q8Slots q8_values, bool q8, int n, int d) {
    for (int h = 0; h < heads; h++) memset(out + (long)h * head_dim + d, 0, (size_t)(head_dim - d) * sizeof(float));
    for (int j = 0; j < n; j++) {
        for (int h = 0; h < heads; h++) {
            float *result = out + (long)h * head_dim;
            const float weight = weights[h * weights_stride + j];
            if (q8) {
                const int8_t *x = q8_slot_values(q8_values, j);
                const float *block_scales = q8_slot_scales(q8_values, j);
                for (int e = d; e < head_dim;) {
                    const int end = block_end(e, head_dim);
                    const float block_weight = weight * block_scales[e / Q8_BLOCK];
#pragma omp simd
                    for (int i = e; i < end; i++) result[i] += block_weight * (float)x[i];
                    e = end;
                }
            } else {
                const long at = first + (long)j * stride;
                for (int e = d; e < head_dim; e++) result[e] += weight * cache_element(values, at + e);
            }
        }
    }
    for (int h = 0; h < heads; h++)
        for (int e = d; e < head_dim; e++) out[(long)h * head_dim + e] *= inverse_sums[h];
}

// The decode step (T = 1) of every cache type: query b at slot length - 1 of row b attends
// to slots [row_start[b], length) (the last `window` of them under a sliding window).
static void attention_decode_grouped(float *out, const float *q, const void *k_cache, const void *v_cache,
                                     CacheElementType type, const int *row_start, int B, int capacity, int length,
                                     int n_heads, int n_kv_heads, int head_dim, float softcap, int window) {
    const CacheShape shape = cache_shape(k_cache, v_cache, type, n_heads, n_kv_heads, head_dim);
    const long q8_slot = kv_q8_slot_bytes(n_kv_heads, head_dim), q8_values_bytes = kv_q8_values_bytes(n_kv_heads, head_dim);
    // The lanes the per-head kernels give to fused multiply-adds: whole blocks of 64 lanes
    // for float and half caches, of 16 for Q8_0; the rest go to plain loops.
#if defined(__AVX512F__)
    const int fma_lanes = shape.q8 ? head_dim / 16 * 16 : head_dim / 64 * 64;
#else
    const int fma_lanes = 0;
#endif
    // The values' lanes are shared out in tiles of 128 bytes of each cached row (32 float
    // lanes, 64 half or 8-bit ones: the pair of cache lines the memory brings in together),
    // and the last tile holds the plain lanes.
    const int tile_lanes = type == ELEMENTS_F32 ? 32 : 64;
    const int lane_blocks = (fma_lanes + tile_lanes - 1) / tile_lanes + (fma_lanes < head_dim ? 1 : 0);
    const int key_blocks = (length + DECODE_KEY_BLOCK - 1) / DECODE_KEY_BLOCK;
    // scores[(b * n_heads + h) * length + j]: head h of row b's score of the row's j-th
    // visible slot (slot row_start[b] + j); then its unnormalised softmax weight.
    float *scores = xmalloc((size_t)B * n_heads * length * sizeof(float));
    float *inverse_sums = xmalloc((size_t)B * n_heads * sizeof(float));
#pragma omp parallel
    {
#pragma omp for schedule(static)
        for (long item = 0; item < (long)B * n_kv_heads * key_blocks; item++) {
            const int block = (int)(item % key_blocks), kv_head = (int)(item / key_blocks % n_kv_heads);
            const int b = (int)(item / key_blocks / n_kv_heads);
            const int start = attention_first_key(row_start ? row_start[b] : 0, length - 1, window), n = length - start;
            const int j_end = (block + 1) * DECODE_KEY_BLOCK < n ? (block + 1) * DECODE_KEY_BLOCK : n;
            const long first = ((long)b * capacity + start) * shape.kv_width + kv_head * head_dim;
            const long values_at = (long)kv_head * head_dim;
            const long scales_at = q8_values_bytes + (long)kv_head * kv_q8_blocks_per_head(head_dim) * (long)sizeof(float);
            const Q8Slots q8_keys = {(const char *)k_cache + ((long)b * capacity + start) * q8_slot, q8_slot, values_at,
                                     scales_at};
            for (int j = block * DECODE_KEY_BLOCK; j < j_end; j++) {
                if (j + PREFETCH_SLOTS < n) {
                    if (shape.q8) {
                        prefetch_bytes(q8_slot_values(q8_keys, j + PREFETCH_SLOTS), head_dim);
                        prefetch_bytes(q8_slot_scales(q8_keys, j + PREFETCH_SLOTS), 4);
                    } else {
                        prefetch_bytes((const char *)k_cache + (first + (long)(j + PREFETCH_SLOTS) * shape.kv_width) * (shape.half ? 2 : 4),
                                       (long)head_dim * (shape.half ? 2 : 4));
                    }
                }
                for (int g = 0; g < shape.group; g += HEADS_IN_REGISTERS) { // the group, 4 heads at a time
                    const int h = kv_head * shape.group + g;
                    const float *query = q + (long)b * shape.q_width + h * head_dim;
                    float *score = scores + ((long)b * n_heads + h) * length + j;
#if defined(__AVX512F__)
                    const int heads = shape.group - g < HEADS_IN_REGISTERS ? shape.group - g : HEADS_IN_REGISTERS;
                    group_dot_products_any(heads, score, length, query, head_dim, shape.scale, shape.keys, first + (long)j * shape.kv_width,
                                           q8_slot_values(q8_keys, j), q8_slot_scales(q8_keys, j), shape.q8);
#else
                    for (int i = 0; i < HEADS_IN_REGISTERS && g + i < shape.group; i++)
                        score[(long)i * length] =
                            shape.scale * (shape.q8 ? q8_dot_product(query + (long)i * head_dim, q8_slot_values(q8_keys, j),
                                                         q8_slot_scales(q8_keys, j), head_dim)
                                        : dot_product(query + (long)i * head_dim, shape.keys, first + (long)j * shape.kv_width, head_dim));
#endif
                }
            }
        }
#pragma omp for schedule(static)
        for (long item = 0; item < (long)B * n_heads; item++) {
            const int b = (int)(item / n_heads);
            const int n = length - attention_first_key(row_start ? row_start[b] : 0, length - 1, window);
            float *row = scores + item * length;
            cpu_soft_cap(row, n, softcap);
            float max_score = -INFINITY;
            for (int j = 0; j < n; j++)
                if (row[j] > max_score) max_score = row[j];
            for (int j = 0; j < n; j++) row[j] -= max_score;
            exp_nonpositive(row, n);
            double sum = 0;
            for (int j = 0; j < n; j++) sum += row[j];
            inverse_sums[item] = (float)(1.0 / sum);
        }
#pragma omp for schedule(static)
        for (long item = 0; item < (long)B * n_kv_heads * lane_blocks; item++) {
            const int lane_block = (int)(item % lane_blocks), kv_head = (int)(item / lane_blocks % n_kv_heads);
            const int b = (int)(item / lane_blocks / n_kv_heads);
            const int start = attention_first_key(row_start ? row_start[b] : 0, length - 1, window), n = length - start;
            const long first = ((long)b * capacity + start) * shape.kv_width + kv_head * head_dim;
            const long values_at = (long)kv_head * head_dim;
            const long scales_at = q8_values_bytes + (long)kv_head * kv_q8_blocks_per_head(head_dim) * (long)sizeof(float);
            const Q8Slots q8_vals = {(const char *)v_cache + ((long)b * capacity + start) * q8_slot, q8_slot, values_at,
                                     scales_at};
            const int d = lane_block * tile_lanes < fma_lanes ? lane_block * tile_lanes : fma_lanes; // the plain tile: fma_lanes
            for (int g = 0; g < shape.group; g += HEADS_IN_REGISTERS) { // the group, 4 heads at a time
                const int h = kv_head * shape.group + g, heads = shape.group - g < HEADS_IN_REGISTERS ? shape.group - g : HEADS_IN_REGISTERS;
                float *result = out + (long)b * shape.q_width + h * head_dim;
                const float *weights = scores + ((long)b * n_heads + h) * length;
                const float *inverses = inverse_sums + (long)b * n_heads + h;
#if defined(__AVX512F__)
                if (d < fma_lanes) {
                    const int vectors = (fma_lanes - d < tile_lanes ? fma_lanes - d : tile_lanes) / 16;
                    group_lanes_fma_any(heads, vectors, result, head_dim, weights, length, inverses, shape.values, first,
                                        shape.kv_width, q8_vals, shape.q8, n, d);
                    continue;
                }
#endif
                group_lanes_plain(heads, result, head_dim, weights, length, inverses, shape.values, first, shape.kv_width, q8_vals,
                                  shape.q8, n, d);
            }
        }
    }
    free(scores);
    free(inverse_sums);
}

CpuAttentionKernel cpu_attention_kernel(void) {
    static int chosen = -1; // read once, by the thread that calls the ops
    if (chosen < 0) {
        const char *setting = getenv("MARLHF_CPU_ATTENTION");
        if (!setting || !strcmp(setting, "auto")) chosen = CPU_ATTENTION_AUTO;
        else if (!strcmp(setting, "per-head")) chosen = CPU_ATTENTION_PER_HEAD;
        else if (!strcmp(setting, "grouped")) chosen = CPU_ATTENTION_GROUPED;
        else die_user("MARLHF_CPU_ATTENTION=%s: expected auto, per-head or grouped", setting);
    }
    return (CpuAttentionKernel)chosen;
}

// Every decode and extend entry. A decode step (T = 1, also an extension of one query)
// runs grouped where that measured faster: float32 caches. For half and Q8_0 caches, whose
// steps are bound by the arithmetic of their scores more than by memory, sharing the
// reads gained nothing measurable (Q8_0: 0.84-1.0x; docs/quantization.md), so they keep
// the per-head kernel unless MARLHF_CPU_ATTENTION=grouped; the two give the same bits.
// Longer extensions are tiled unless MARLHF_CPU_ATTENTION=per-head.
// Every kernel takes the sliding window (ops/attention_window.h).
static void attention_cached(float *out, const float *q, const void *k_cache, const void *v_cache,
                             CacheElementType type, const int *row_start, int B, int T, int capacity, int first_slot,
                             int n_heads, int n_kv_heads, int head_dim, float softcap, int window) {
    const CpuAttentionKernel kernel = cpu_attention_kernel();
    const bool grouped =
        kernel == CPU_ATTENTION_GROUPED || (kernel == CPU_ATTENTION_AUTO && type == ELEMENTS_F32);
    if (T == 1 && grouped)
        attention_decode_grouped(out, q, k_cache, v_cache, type, row_start, B, capacity, first_slot + 1, n_heads,
                                 n_kv_heads, head_dim, softcap, window);
    else if (T == 1 || kernel == CPU_ATTENTION_PER_HEAD)
        cpu_attention_per_head(out, q, k_cache, v_cache, type, row_start, B, T, capacity, first_slot, n_heads,
                               n_kv_heads, head_dim, softcap, window);
    else
        cpu_attention_extend_tiled(out, q, k_cache, v_cache, type, row_start, B, T, capacity, first_slot, n_heads,
                                   n_kv_heads, head_dim, softcap, window);
}

void cpu_attention_decode(float *out, const float *q, const float *k_cache, const float *v_cache,
                          const int *row_start, int B, int capacity, int length, int n_heads,
                          int n_kv_heads, int head_dim, float softcap, int window) {
    attention_cached(out, q, k_cache, v_cache, ELEMENTS_F32, row_start, B, 1, capacity, length - 1, n_heads, n_kv_heads,
                     head_dim, softcap, window);
}

void cpu_attention_decode_f16(float *out, const float *q, const uint16_t *k_cache, const uint16_t *v_cache,
                              const int *row_start, int B, int capacity, int length, int n_heads, int n_kv_heads,
                              int head_dim, float softcap, int window) {
    attention_cached(out, q, k_cache, v_cache, ELEMENTS_F16, row_start, B, 1, capacity, length - 1, n_heads, n_kv_heads,
                     head_dim, softcap, window);
}

void cpu_attention_extend(float *out, const float *q, const float *k_cache, const float *v_cache,
                          const int *row_start, int B, int T, int capacity, int first_slot, int n_heads, int n_kv_heads,
                          int head_dim, float softcap, int window) {
    attention_cached(out, q, k_cache, v_cache, ELEMENTS_F32, row_start, B, T, capacity, first_slot, n_heads, n_kv_heads,
                     head_dim, softcap, window);
}

void cpu_attention_extend_f16(float *out, const float *q, const uint16_t *k_cache, const uint16_t *v_cache,
                              const int *row_start, int B, int T, int capacity, int first_slot, int n_heads,
                              int n_kv_heads, int head_dim, float softcap, int window) {
    attention_cached(out, q, k_cache, v_cache, ELEMENTS_F16, row_start, B, T, capacity, first_slot, n_heads, n_kv_heads,
                     head_dim, softcap, window);
}

void cpu_cache_write_f16(uint16_t *cache, const float *x, int B, int T, int capacity, int slot, int width) {
    const long count = (long)T * width; // row b's T slots are contiguous in both
#pragma omp parallel for schedule(static)
    for (int b = 0; b < B; b++) {
        uint16_t *dst = cache + ((long)b * capacity + slot) * width;
        const float *src = x + (long)b * count;
        long i = 0;
#if defined(__AVX512F__)
        for (; i + 16 <= count; i += 16)
            _mm256_storeu_si256((__m256i *)(dst + i), _mm512_cvtps_ph(_mm512_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
#endif
        for (; i < count; i++) dst[i] = cpu_float_to_half(src[i]);
    }
}

void cpu_attention_decode_q8(float *out, const float *q, const void *k_cache, const void *v_cache,
                             const int *row_start, int B, int capacity, int length, int n_heads, int n_kv_heads,
                             int head_dim, float softcap, int window) {
    attention_cached(out, q, k_cache, v_cache, ELEMENTS_Q8, row_start, B, 1, capacity, length - 1, n_heads, n_kv_heads,
                     head_dim, softcap, window);
}

void cpu_attention_extend_q8(float *out, const float *q, const void *k_cache, const void *v_cache,
                             const int *row_start, int B, int T, int capacity, int first_slot, int n_heads,
                             int n_kv_heads, int head_dim, float softcap, int window) {
    attention_cached(out, q, k_cache, v_cache, ELEMENTS_Q8, row_start, B, T, capacity, first_slot, n_heads, n_kv_heads,
                     head_dim, softcap, window);
}

void cpu_cache_write_q8(void *cache, const float *x, int B, int T, int capacity, int slot, int n_kv_heads,
                        int head_dim) {
    const int width = n_kv_heads * head_dim, blocks = kv_q8_blocks_per_head(head_dim);
    const long record_bytes = kv_q8_slot_bytes(n_kv_heads, head_dim);
    const long values_bytes = kv_q8_values_bytes(n_kv_heads, head_dim);
#pragma omp parallel for schedule(static)
    for (long i = 0; i < (long)B * T; i++) { // row i / T's slot slot + i % T
        char *record = (char *)cache + ((i / T) * capacity + slot + i % T) * record_bytes;
        int8_t *values = (int8_t *)record;
        float *scales = (float *)(record + values_bytes);
        const float *source = x + i * width;
        for (int h = 0; h < n_kv_heads; h++)
            for (int k = 0; k < blocks; k++) {
                const int d = k * Q8_BLOCK, n = head_dim - d < Q8_BLOCK ? head_dim - d : Q8_BLOCK;
                q8_quantize_block(source + h * head_dim + d, n, values + h * head_dim + d, scales + h * blocks + k);
            }
        // The padding before the scales is zero, so equal caches are equal byte for byte.
        memset(values + width, 0, (size_t)(values_bytes - width));
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
