// Attention against the KV cache, the grouped decode step and the tiled extension
// (ops/cpu/attention_decode.c, ops/cpu/attention_extend.c), for the three cache types
// (float, half, Q8_0), against
//  - a double-precision reference over the cache's own values (halves widened, Q8_0
//    values times their scales): within 2e-5 absolute;
//  - the previous kernel, one (row, query, head) at a time (cpu_attention_per_head, kept
//    for this and for the benchmarks): the decode step bit for bit (each head's sums in the
//    same order), the extension within 2e-5 absolute (its sums run in another order).
// GQA ratios 1, 3, 4, 8 and 10 (over 8: the group is taken 8 heads at a time); head
// sizes 64 and 128, 80 (a tail of 16 past the 64-lane blocks) and 24 (Qwen3's fixture: one
// short Q8_0 block, no whole vector of 64); contexts 1, 31, 32, 33, 100 and 1000 (around
// the extension's key tiles of 32, past the decode step's key blocks of 256); three rows, left-padded as the batch decode pads them
// (rows starting at slot 0, halfway and at the last slot). Queries spread to +-6 and keys
// to +-1.5, so the softmaxes are sharp. test_soft_cap runs a few of the shapes again with
// Gemma 2's soft cap on the scores (every kernel and the reference cap them).
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/check.h"
#include "core/sanitizer.h"
#include "ops/cpu/attention_cache.h"
#include "ops/ops.h"
#include "test.h"

static uint64_t rng_state = 2026;
static float *random_floats(long n, float lo, float hi) {
    float *x = xmalloc((size_t)n * sizeof(float));
    for (long i = 0; i < n; i++) {
        rng_state = rng_state * 6364136223846793005ULL + 1442695040888963407ULL;
        x[i] = lo + (hi - lo) * (float)((rng_state >> 40) / (double)(1ULL << 24));
    }
    return x;
}

static const int gqa_ratios[] = {1, 3, 4, 8, 10};
static const int head_dims[] = {64, 128, 80, 24};
static const int contexts[] = {1, 31, 32, 33, 100, 1000};
enum { RATIOS = 5, HEAD_DIMS = 4, CONTEXTS = 6, TYPES = 3, KV_HEADS = 2, ROWS = 3 };
static const char *type_names[] = {"f32", "f16", "q8_0"};
static float soft_cap = 0.0f; // the attention ops' softcap: test_soft_cap sets it
static int sliding_window = 0; // the attention ops' window: test_sliding_window sets it

// The first slot query `slot` of a row starting at `start` sees.
static int first_visible(int start, int slot) {
    return sliding_window > 0 && slot - sliding_window + 1 > start ? slot - sliding_window + 1 : start;
}

// A cache of `type` holding keys or values x ([ROWS * capacity, kv_width] floats), and the
// floats it holds (the halves or Q8_0 values as read back).
typedef struct {
    void *cache;
    float *held;
} Cache;

static Cache make_cache(const float *x, CacheElementType type, int capacity, int head_dim) {
    const int kv_width = KV_HEADS * head_dim;
    const long slots = (long)ROWS * capacity;
    Cache c = {NULL, xmalloc((size_t)slots * kv_width * sizeof(float))};
    if (type == ELEMENTS_F32) {
        c.cache = xmalloc((size_t)slots * kv_width * sizeof(float));
        ops_cpu.cache_write(c.cache, x, ROWS, capacity, capacity, 0, kv_width);
    } else if (type == ELEMENTS_F16) {
        c.cache = xmalloc((size_t)slots * kv_width * sizeof(uint16_t));
        ops_cpu.cache_write_f16(c.cache, x, ROWS, capacity, capacity, 0, kv_width);
    } else {
        c.cache = xmalloc((size_t)slots * kv_q8_slot_bytes(KV_HEADS, head_dim));
        ops_cpu.cache_write_q8(c.cache, x, ROWS, capacity, capacity, 0, KV_HEADS, head_dim);
    }
    for (long s = 0; s < slots; s++)
        for (int h = 0; h < KV_HEADS; h++)
            cache_head_to_floats(c.held + s * kv_width + h * head_dim, c.cache, type, s, h, KV_HEADS, head_dim);
    return c;
}

// Double precision: query t of row b at slot first_slot + t against slots
// [row_start[b], first_slot + t] of the float caches k, v. Unchecked in the sanitizer build:
// it is the test's own arithmetic (a third of the test's time there), and the sanitizers
// are there for the kernels.
SANITIZER_UNCHECKED static void reference(double *out, const float *q, const float *k, const float *v, const int *row_start, int T,
                      int capacity, int first_slot, int n_heads, int head_dim) {
    const int kv_width = KV_HEADS * head_dim, q_width = n_heads * head_dim, group = n_heads / KV_HEADS;
    double *scores = xmalloc((size_t)(first_slot + T) * sizeof(double));
    for (int b = 0; b < ROWS; b++)
        for (int t = 0; t < T; t++)
            for (int h = 0; h < n_heads; h++) {
                const float *query = q + ((long)b * T + t) * q_width + h * head_dim;
                const long head_at = (long)(h / group) * head_dim;
                double max_score = -INFINITY, sum = 0;
                const int first = first_visible(row_start[b], first_slot + t);
                for (int j = first; j <= first_slot + t; j++) {
                    double dot = 0;
                    for (int d = 0; d < head_dim; d++)
                        dot += (double)query[d] * k[((long)b * capacity + j) * kv_width + head_at + d];
                    scores[j] = dot / sqrt(head_dim);
                    if (soft_cap > 0.0f) scores[j] = soft_cap * tanh(scores[j] / soft_cap);
                    if (scores[j] > max_score) max_score = scores[j];
                }
                for (int j = first; j <= first_slot + t; j++) sum += scores[j] = exp(scores[j] - max_score);
                for (int d = 0; d < head_dim; d++) {
                    double want = 0;
                    for (int j = first; j <= first_slot + t; j++)
                        want += scores[j] / sum * v[((long)b * capacity + j) * kv_width + head_at + d];
                    out[((long)b * T + t) * q_width + h * head_dim + d] = want;
                }
            }
    free(scores);
}

static void attention_op(bool extend, float *out, const float *q, Cache k, Cache v, CacheElementType type,
                         const int *row_start, int T, int capacity, int first_slot, int n_heads, int head_dim) {
    const int H = n_heads, KV = KV_HEADS, D = head_dim, length = first_slot + 1;
    if (!extend && type == ELEMENTS_F32) ops_cpu.attention_decode(out, q, k.cache, v.cache, row_start, ROWS, capacity, length, H, KV, D, soft_cap, sliding_window);
    if (!extend && type == ELEMENTS_F16) ops_cpu.attention_decode_f16(out, q, k.cache, v.cache, row_start, ROWS, capacity, length, H, KV, D, soft_cap, sliding_window);
    if (!extend && type == ELEMENTS_Q8) ops_cpu.attention_decode_q8(out, q, k.cache, v.cache, row_start, ROWS, capacity, length, H, KV, D, soft_cap, sliding_window);
    if (extend && type == ELEMENTS_F32) ops_cpu.attention_extend(out, q, k.cache, v.cache, row_start, ROWS, T, capacity, first_slot, H, KV, D, soft_cap, sliding_window);
    if (extend && type == ELEMENTS_F16) ops_cpu.attention_extend_f16(out, q, k.cache, v.cache, row_start, ROWS, T, capacity, first_slot, H, KV, D, soft_cap, sliding_window);
    if (extend && type == ELEMENTS_Q8) ops_cpu.attention_extend_q8(out, q, k.cache, v.cache, row_start, ROWS, T, capacity, first_slot, H, KV, D, soft_cap, sliding_window);
}

// One shape: T new queries per row ending at slot context - 1 (T = 1: a decode step).
// Returns the largest differences from the reference and from the per-head kernel, and
// counts the decode outputs that differ from the per-head kernel's in any bit.
static void check_shape(bool extend, int T, int ratio, int head_dim, int context, CacheElementType type,
                        double *worst_reference, double *worst_per_head, long *decode_mismatches) {
    const int n_heads = ratio * KV_HEADS, kv_width = KV_HEADS * head_dim, q_width = n_heads * head_dim;
    const int capacity = context + 3, first_slot = context - T;
    // Left padding: row 1 starts halfway; row 2 at the first new query's slot (a decode
    // step: the only slot; an extension: its own queries only).
    int row_start[ROWS] = {0, first_slot / 2, first_slot};
    float *q = random_floats((long)ROWS * T * q_width, -6, 6);
    float *keys = random_floats((long)ROWS * capacity * kv_width, -1.5f, 1.5f);
    float *values = random_floats((long)ROWS * capacity * kv_width, -1, 1);
    Cache k = make_cache(keys, type, capacity, head_dim), v = make_cache(values, type, capacity, head_dim);
    const long n_out = (long)ROWS * T * q_width;
    float *out = xcalloc((size_t)n_out, sizeof(float)), *per_head = xcalloc((size_t)n_out, sizeof(float));
    double *want = xmalloc((size_t)n_out * sizeof(double));
    attention_op(extend, out, q, k, v, type, row_start, T, capacity, first_slot, n_heads, head_dim);
    cpu_attention_per_head(per_head, q, k.cache, v.cache, type, row_start, ROWS, T, capacity, first_slot, n_heads,
                           KV_HEADS, head_dim, soft_cap, sliding_window);
    reference(want, q, k.held, v.held, row_start, T, capacity, first_slot, n_heads, head_dim);
    for (long i = 0; i < n_out; i++) {
        *worst_reference = fmax(*worst_reference, fabs(want[i] - out[i]));
        *worst_per_head = fmax(*worst_per_head, fabs((double)per_head[i] - out[i]));
        if (!isfinite(out[i])) *worst_reference = INFINITY;
    }
    if (T == 1 && memcmp(out, per_head, (size_t)n_out * sizeof(float)) != 0) {
        for (long i = 0; i < n_out; i++) *decode_mismatches += memcmp(&out[i], &per_head[i], sizeof(float)) != 0;
        fprintf(stderr, "  T = 1 %s ratio %d head_dim %d context %d: differs from the per-head kernel\n",
                type_names[type], ratio, head_dim, context);
    }
    free(q), free(keys), free(values), free(k.cache), free(k.held), free(v.cache), free(v.held);
    free(out), free(per_head), free(want);
}

// Whether a shape is checked: every one whose context holds its T queries, except that the
// longest context takes extensions of more than 2 queries at the GQA ratio 3 only (an odd
// group). Those extensions cost T x 1000 per head in the double reference, nearly all of
// the test's time (most of it under the sanitizers); context 100 already takes them at
// every ratio, the groups over 8 included, across four key tiles. In the sanitizer build
// (`make test SANITIZE=1`, there to find memory errors, not to recheck the numbers) the
// head size 128 (two blocks of 64, the path of 64 twice) is left out, and the longest
// context keeps the ratios 3 and 10 only: one group that divides no vector and one taken 8
// heads at a time, past the decode step's key blocks of 256 in both.
static bool shape_is_checked(int T, int ratio, int head_dim, int context) {
    if (T > context) return false;
    // Under the soft cap: an odd group and one of 8 heads, the head sizes 64 and 24, contexts
    // within and past a key tile.
    if (soft_cap > 0.0f) return (ratio == 3 || ratio == 8) && (head_dim == 64 || head_dim == 24) && (context == 33 || context == 100);
    if (TEST_SANITIZED && (head_dim == 128 || (context == 1000 && ratio != 3 && ratio != 10))) return false;
    return !(context == 1000 && T > 2 && ratio != 3);
}

// Every shape above, for each cache type, with T new queries per row for each T of
// `lengths` that the context holds: within 2e-5 of the reference; the outputs of T = 1
// equal to the per-head kernel's bit for bit, the others within 2e-5 of them.
static void check_all_shapes(bool extend, const char *op, const int *lengths, int n_lengths) {
    for (int type = 0; type < TYPES; type++) {
        double worst_reference = 0, worst_per_head = 0;
        long mismatches = 0;
        for (int r = 0; r < RATIOS; r++)
            for (int d = 0; d < HEAD_DIMS; d++)
                for (int c = 0; c < CONTEXTS; c++)
                    for (int l = 0; l < n_lengths; l++)
                        if (shape_is_checked(lengths[l], gqa_ratios[r], head_dims[d], contexts[c]))
                            check_shape(extend, lengths[l], gqa_ratios[r], head_dims[d], contexts[c],
                                        (CacheElementType)type, &worst_reference, &worst_per_head, &mismatches);
        printf("# %s %s: %.3g from the double reference, %.3g from the per-head kernel\n", op, type_names[type],
               worst_reference, worst_per_head);
        EXPECT(worst_reference <= 2e-5, "%s %s differs from the double reference by %.3g", type_names[type], op,
               worst_reference);
        EXPECT(worst_per_head <= 2e-5, "%s %s differs from the per-head kernel by %.3g", type_names[type], op,
               worst_per_head);
        EXPECT(mismatches == 0, "%s %s: %ld outputs of one query differ from the per-head kernel's", type_names[type],
               op, mismatches);
    }
}

static void test_decode_grouped(void) {
    const int one[] = {1};
    check_all_shapes(false, "decode", one, 1);
}

// Extensions of 2, 33 and 70 queries (within one query tile of 64; past a key tile of 32;
// two query tiles), each ending at the contexts above that hold them; and T = 1 through
// the extend entry, which is the decode step bit for bit.
static void test_extend_tiled(void) {
    const int lengths[] = {1, 2, 33, 70};
    check_all_shapes(true, "extend", lengths, 4);
}

// Soft-capped scores (cap 2; the scores here reach about +-20): the decode step and the
// extension again, on fewer shapes. The capped outputs differ from the plain ones.
static void test_soft_cap(void) {
    const int lengths[] = {1, 2, 33};
    float plain[64], capped[64];
    for (int pass = 0; pass < 2; pass++) {
        soft_cap = pass ? 2.0f : 0.0f;
        const int capacity = 8, H = 2, D = 16; // a decode step over 8 slots, one query head per K/V head
        rng_state = 77;
        float *q = random_floats((long)ROWS * H * KV_HEADS / 2 * D, -6, 6);
        float *x = random_floats((long)ROWS * capacity * KV_HEADS * D, -1.5f, 1.5f);
        float *out = xcalloc((size_t)ROWS * H * D, sizeof(float));
        int row_start[ROWS] = {0, 0, 0};
        ops_cpu.attention_decode(out, q, x, x, row_start, ROWS, capacity, capacity, H, KV_HEADS, D, soft_cap, sliding_window);
        memcpy(pass ? capped : plain, out, sizeof plain);
        free(q), free(x), free(out);
    }
    double moved = 0;
    for (int i = 0; i < 64; i++) moved = fmax(moved, fabs(capped[i] - plain[i]));
    EXPECT(moved > 1e-2, "the soft cap moved the outputs by %.3g only", moved);
    soft_cap = 2.0f;
    check_all_shapes(false, "decode (soft cap)", lengths, 1);
    check_all_shapes(true, "extend (soft cap)", lengths, 3);
    soft_cap = 0.0f;
}

// A sliding window (Mistral, Gemma 2/3's sliding layers): each query sees the last `window`
// slots of its row, itself included. Windows of 1 (the query alone), 5 and 32 against every
// kernel and the reference, on the decode step and extensions whose queries' windows begin
// at different slots; the windowed output differs from the plain one.
static void test_sliding_window(void) {
    const int windows[] = {1, 5, 32}, lengths[] = {1, 2, 33};
    for (int w = 0; w < 3; w++) {
        sliding_window = windows[w];
        check_all_shapes(false, "decode (sliding window)", lengths, 1);
        check_all_shapes(true, "extend (sliding window)", lengths, 3);
    }
    float plain[64], windowed[64];
    for (int pass = 0; pass < 2; pass++) {
        sliding_window = pass ? 4 : 0;
        const int capacity = 8, H = 2, D = 16;
        rng_state = 78;
        float *q = random_floats((long)ROWS * H * D, -6, 6);
        float *x = random_floats((long)ROWS * capacity * KV_HEADS * D, -1.5f, 1.5f);
        float *out = xcalloc((size_t)ROWS * H * D, sizeof(float));
        int row_start[ROWS] = {0, 0, 0};
        ops_cpu.attention_decode(out, q, x, x, row_start, ROWS, capacity, capacity, H, KV_HEADS, D, 0.0f,
                                 sliding_window);
        memcpy(pass ? windowed : plain, out, sizeof plain);
        free(q), free(x), free(out);
    }
    sliding_window = 0;
    double moved = 0;
    for (int i = 0; i < 64; i++) moved = fmax(moved, fabs(windowed[i] - plain[i]));
    EXPECT(moved > 1e-2, "the sliding window moved the outputs by %.3g only", moved);
}

int main(void) {
    // The grouped decode step for every cache type (by default only float32 caches take it).
    setenv("MARLHF_CPU_ATTENTION", "grouped", 1);
    RUN(test_decode_grouped);
    RUN(test_extend_tiled);
    RUN(test_soft_cap);
    RUN(test_sliding_window);
    TEST_EXIT();
}
