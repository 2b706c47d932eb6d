// Attention of several new queries per row against the KV cache (attention_extend: every
// chunk of a chunked prefill after the first, a prompt that continues a cached prefix).
// Query t of row b sits at slot first_slot + t and attends to the row's slots
// [row_start[b], first_slot + t] (under a sliding window of W slots, the last W of those).
//
// A query per (row, head) against every cached key, as a decode step does it, reads the
// whole prefix once per query and takes one horizontal sum per score. Here the work is
// tiled instead: a tile of up to 64 queries times the query heads of one GQA group (192
// rows for SmolLM2's groups of 3) meets the cached slots 32 at a time. The 32 keys are
// widened to floats and transposed (d-major), so that a tile's scores are a small matrix
// product with the keys along the vector lanes (no horizontal sums); the 32 values are
// widened to floats and the probabilities times them is a second small product with the
// head's dimension along the lanes. The softmax is online (flash attention's): each row
// keeps its running maximum and sum, and its output is rescaled when the maximum grows.
// Causality inside the new chunk is a mask on the last tiles of keys; a sliding window starts
// the tiles at the first query's window and masks each row's keys before its own.
//
// The results are not bit for bit the per-head kernel's (the sums run in another order,
// Q8_0 keys are dequantized before the products): tests/test_attention_decode.c holds
// them within 2e-5 of a double-precision reference and of the per-head kernel.
#include <math.h>
#include <stdlib.h>

#include "core/check.h"
#include "core/sanitizer.h"
#include "ops/attention_window.h"
#include "ops/cpu/attention_cache.h"

// ROW_BLOCK rows meet the 32 keys in 16 accumulators (8 rows x 2 vectors of 16 keys): each
// key vector loaded serves 8 rows.
enum { KEY_TILE = 32, QUERY_TILE = 64, ROW_BLOCK = 8 };

// One thread's tiles. Rows are (query, head of the group) pairs, query-major; padded to a
// multiple of ROW_BLOCK with zero queries whose results are dropped.
typedef struct {
    float *queries;      // [rows, head_dim]
    float *keys_t;       // [head_dim, KEY_TILE]: the key tile, transposed
    float *values;       // [KEY_TILE, lanes]: the value tile, zero beyond head_dim
    float *scores;       // [rows, KEY_TILE]: scores, then probabilities
    float *acc;          // [rows, lanes]: the unnormalised outputs
    float *row_max, *row_sum;
} ExtendTiles;

// The two small products below are most of a chunked prefill. In the sanitizer build they run
// the FMA copy where the CPU has the instruction (their sums are fmaf chains: the same bits)
// and are not checked access by access; extend_query_tile checks the tiles' ranges before
// each call (core/sanitizer.h).

// scores[r][k] = sum_d queries[r][d] * keys_t[d][k] for the rows' block of ROW_BLOCK.
FMA_CLONES_NOINLINE SANITIZER_UNCHECKED static void tile_scores(float *scores, const float *queries, const float *keys_t, int rows, int head_dim) {
    for (int r = 0; r < rows; r += ROW_BLOCK) {
#if defined(__AVX512F__)
        __m512 acc[ROW_BLOCK][2];
        for (int i = 0; i < ROW_BLOCK; i++) acc[i][0] = acc[i][1] = _mm512_setzero_ps();
        for (int d = 0; d < head_dim; d++) {
            const __m512 k0 = _mm512_loadu_ps(keys_t + d * KEY_TILE), k1 = _mm512_loadu_ps(keys_t + d * KEY_TILE + 16);
            for (int i = 0; i < ROW_BLOCK; i++) {
                const __m512 query = _mm512_set1_ps(queries[(long)(r + i) * head_dim + d]);
                acc[i][0] = _mm512_fmadd_ps(query, k0, acc[i][0]);
                acc[i][1] = _mm512_fmadd_ps(query, k1, acc[i][1]);
            }
        }
        for (int i = 0; i < ROW_BLOCK; i++) {
            _mm512_storeu_ps(scores + (r + i) * KEY_TILE, acc[i][0]);
            _mm512_storeu_ps(scores + (r + i) * KEY_TILE + 16, acc[i][1]);
        }
#else
        for (int i = r; i < r + ROW_BLOCK; i++) {
            float *row = scores + i * KEY_TILE;
            for (int k = 0; k < KEY_TILE; k++) row[k] = 0.0f;
            for (int d = 0; d < head_dim; d++) {
                const float query = queries[(long)i * head_dim + d];
#pragma omp simd
                for (int k = 0; k < KEY_TILE; k++) row[k] = fmaf(query, keys_t[d * KEY_TILE + k], row[k]);
            }
        }
#endif
    }
}

#if defined(__AVX512F__)
// Rows [r, r + 4) of acc += probs times values, lanes [e, e + 16 * vectors): 4 x vectors
// accumulators, each value vector loaded once for the 4 rows (`vectors` a constant once
// inlined).
static inline __attribute__((always_inline)) void weighted_sums_block(int vectors, float *acc, const float *probs,
                                                                       const float *values, int r, int lanes, int e) {
    __m512 sums[4][4];
    for (int i = 0; i < 4; i++)
        for (int v = 0; v < vectors; v++) sums[i][v] = _mm512_loadu_ps(acc + (long)(r + i) * lanes + e + 16 * v);
    for (int k = 0; k < KEY_TILE; k++) {
        __m512 value[4];
        for (int v = 0; v < vectors; v++) value[v] = _mm512_loadu_ps(values + k * lanes + e + 16 * v);
        for (int i = 0; i < 4; i++) {
            const __m512 p = _mm512_set1_ps(probs[(r + i) * KEY_TILE + k]);
            for (int v = 0; v < vectors; v++) sums[i][v] = _mm512_fmadd_ps(p, value[v], sums[i][v]);
        }
    }
    for (int i = 0; i < 4; i++)
        for (int v = 0; v < vectors; v++) _mm512_storeu_ps(acc + (long)(r + i) * lanes + e + 16 * v, sums[i][v]);
}
#endif

// acc[r][e] += sum_k probs[r][k] * values[k][e], e < lanes (a multiple of 16).
FMA_CLONES_NOINLINE SANITIZER_UNCHECKED static void tile_weighted_sums(float *acc, const float *probs, const float *values, int rows, int lanes) {
#if defined(__AVX512F__)
    for (int r = 0; r < rows; r += 4) {
        int e = 0;
        for (; e + 64 <= lanes; e += 64) weighted_sums_block(4, acc, probs, values, r, lanes, e);
        for (; e + 32 <= lanes; e += 32) weighted_sums_block(2, acc, probs, values, r, lanes, e);
        for (; e < lanes; e += 16) weighted_sums_block(1, acc, probs, values, r, lanes, e);
    }
#else
    for (int i = 0; i < rows; i++)
        for (int k = 0; k < KEY_TILE; k++) {
            const float p = probs[i * KEY_TILE + k];
            float *row = acc + (long)i * lanes;
#pragma omp simd
            for (int e = 0; e < lanes; e++) row[e] = fmaf(p, values[k * lanes + e], row[e]);
        }
#endif
}

// Queries [t0, t0 + count) of row b, the heads of KV head kv_head's group.
static void extend_query_tile(float *out, const float *q, const void *k_cache, const void *v_cache,
                              CacheElementType type, int start, int b, int kv_head, int t0, int count, int T,
                              int capacity, int first_slot, int n_heads, int n_kv_heads, int head_dim,
                              float softcap, int window, const ExtendTiles *tiles) {
    const int group = n_heads / n_kv_heads, q_width = n_heads * head_dim;
    const int rows = count * group, padded_rows = (rows + ROW_BLOCK - 1) / ROW_BLOCK * ROW_BLOCK;
    const int lanes = (head_dim + 15) / 16 * 16;
    const float scale = 1.0f / sqrtf((float)head_dim);
    // The group's heads are consecutive in a query row: query t's rows are one stretch.
    for (int t = 0; t < count; t++)
        memcpy(tiles->queries + (long)t * group * head_dim,
               q + ((long)b * T + t0 + t) * q_width + (long)kv_head * group * head_dim,
               (size_t)group * head_dim * sizeof(float));
    memset(tiles->queries + (long)rows * head_dim, 0, (size_t)(padded_rows - rows) * head_dim * sizeof(float));
    memset(tiles->acc, 0, (size_t)padded_rows * lanes * sizeof(float));
    for (int r = 0; r < padded_rows; r++) tiles->row_max[r] = -INFINITY, tiles->row_sum[r] = 0.0f;

    const int last_slot = first_slot + t0 + count - 1; // the tile's last query sees up to here
    // The tile's first query sees the earliest slot: its window's first, or the row's.
    const int first_seen = attention_first_key(start, first_slot + t0, window);
    float key[512];                                     // one key widened (head_dim <= 512: checked below)
    for (int s0 = first_seen; s0 <= last_slot; s0 += KEY_TILE) {
        const int keys = last_slot + 1 - s0 < KEY_TILE ? last_slot + 1 - s0 : KEY_TILE;
        for (int k = 0; k < KEY_TILE; k++) {
            const long slot = (long)b * capacity + s0 + k;
            if (k < keys) {
                cache_head_to_floats(key, k_cache, type, slot, kv_head, n_kv_heads, head_dim);
                for (int d = 0; d < head_dim; d++) tiles->keys_t[d * KEY_TILE + k] = key[d];
                cache_head_to_floats(tiles->values + (long)k * lanes, v_cache, type, slot, kv_head, n_kv_heads,
                                     head_dim);
            } else { // past the tile's last slot: zeros (their probabilities are zero too)
                for (int d = 0; d < head_dim; d++) tiles->keys_t[d * KEY_TILE + k] = 0.0f;
                memset(tiles->values + (long)k * lanes, 0, (size_t)head_dim * sizeof(float));
            }
        }
        SANITIZER_CHECK_RANGE(tiles->scores, (size_t)padded_rows * KEY_TILE * sizeof(float));
        SANITIZER_CHECK_RANGE(tiles->queries, (size_t)padded_rows * head_dim * sizeof(float));
        SANITIZER_CHECK_RANGE(tiles->keys_t, (size_t)head_dim * KEY_TILE * sizeof(float));
        tile_scores(tiles->scores, tiles->queries, tiles->keys_t, padded_rows, head_dim);
        for (int r = 0; r < padded_rows; r++) {
            float *row = tiles->scores + r * KEY_TILE, *acc = tiles->acc + (long)r * lanes;
            // Row r (query t0 + r / group) sees the tile's slots up to first_slot + t0 + r / group.
            const int limit = first_slot + t0 + (r < rows ? r / group : 0) + 1 - s0;
            const int visible = r >= rows ? 0 : limit < keys ? limit : keys;
            // Under a window the row's keys begin `begin` slots into the tile (0: from the first).
            const int begin = attention_first_key(s0, s0 + limit - 1, window) - s0;
            if (visible <= begin) { // the whole tile is after this query, or before its window
                memset(row, 0, KEY_TILE * sizeof(float));
                continue;
            }
            for (int k = begin; k < visible; k++) row[k] *= scale;
            cpu_soft_cap(row + begin, visible - begin, softcap);
            float tile_max = -INFINITY;
#pragma omp simd reduction(max : tile_max)
            for (int k = begin; k < visible; k++) tile_max = fmaxf(tile_max, row[k]);
            if (tile_max > tiles->row_max[r]) { // rescale what the earlier tiles summed
                const float factor = expf(tiles->row_max[r] - tile_max); // 0 on the first tile
                for (int e = 0; e < lanes; e++) acc[e] *= factor;
                tiles->row_sum[r] *= factor;
                tiles->row_max[r] = tile_max;
            }
            const float row_max = tiles->row_max[r];
#pragma omp simd
            for (int k = begin; k < visible; k++) row[k] -= row_max;
            exp_nonpositive(row + begin, visible - begin);
            float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
            for (int k = begin; k < visible; k++) sum += row[k];
            tiles->row_sum[r] += sum;
            for (int k = 0; k < begin; k++) row[k] = 0.0f;
            for (int k = visible; k < KEY_TILE; k++) row[k] = 0.0f;
        }
        SANITIZER_CHECK_RANGE(tiles->acc, (size_t)padded_rows * lanes * sizeof(float));
        SANITIZER_CHECK_RANGE(tiles->values, (size_t)KEY_TILE * lanes * sizeof(float));
        tile_weighted_sums(tiles->acc, tiles->scores, tiles->values, padded_rows, lanes);
    }
    for (int r = 0; r < rows; r++) {
        const int t = r / group, g = r % group;
        float *result = out + ((long)b * T + t0 + t) * q_width + (long)(kv_head * group + g) * head_dim;
        const float inverse = 1.0f / tiles->row_sum[r];
        for (int d = 0; d < head_dim; d++) result[d] = tiles->acc[(long)r * lanes + d] * inverse;
    }
}

void cpu_attention_extend_tiled(float *out, const float *q, const void *k_cache, const void *v_cache,
                                CacheElementType type, const int *row_start, int B, int T, int capacity,
                                int first_slot, int n_heads, int n_kv_heads, int head_dim, float softcap,
                                int window) {
    CHECK(head_dim <= 512, "attention_extend: head_dim %d is over 512", head_dim);
    const int group = n_heads / n_kv_heads, lanes = (head_dim + 15) / 16 * 16;
    const int query_tiles = (T + QUERY_TILE - 1) / QUERY_TILE;
    const int max_rows = (QUERY_TILE * group + ROW_BLOCK - 1) / ROW_BLOCK * ROW_BLOCK;
#pragma omp parallel
    {
        ExtendTiles tiles = {
            .queries = xmalloc((size_t)max_rows * head_dim * sizeof(float)),
            .keys_t = xmalloc((size_t)head_dim * KEY_TILE * sizeof(float)),
            .values = xcalloc((size_t)KEY_TILE * lanes, sizeof(float)), // lanes past head_dim stay zero
            .scores = xmalloc((size_t)max_rows * KEY_TILE * sizeof(float)),
            .acc = xmalloc((size_t)max_rows * lanes * sizeof(float)),
            .row_max = xmalloc((size_t)max_rows * sizeof(float)),
            .row_sum = xmalloc((size_t)max_rows * sizeof(float)),
        };
        // Later query tiles see more slots: dynamic hands them out as threads come free.
#pragma omp for schedule(dynamic, 1)
        for (long item = 0; item < (long)B * n_kv_heads * query_tiles; item++) {
            const int tile = (int)(item % query_tiles), kv_head = (int)(item / query_tiles % n_kv_heads);
            const int b = (int)(item / query_tiles / n_kv_heads);
            const int t0 = tile * QUERY_TILE, count = T - t0 < QUERY_TILE ? T - t0 : QUERY_TILE;
            extend_query_tile(out, q, k_cache, v_cache, type, row_start ? row_start[b] : 0, b, kv_head, t0, count, T,
                              capacity, first_slot, n_heads, n_kv_heads, head_dim, softcap, window, &tiles);
        }
        free(tiles.queries), free(tiles.keys_t), free(tiles.values), free(tiles.scores), free(tiles.acc);
        free(tiles.row_max), free(tiles.row_sum);
    }
}
