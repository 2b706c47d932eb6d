// Attention against a KV cache on the GPU -- a decode step (one new query per row) or a few
// new queries per row that continue a cached prefix (the prompt cache, chunked prefill) --
// over the three kinds of cache (model/model.h KvCacheType): float32, IEEE halves
// (--kv-cache f16) and Q8_0 blocks (--kv-cache q8_0; ops/ops.h kv_q8_slot_bytes gives a
// slot's record: a head's int8 values, then each block's float scale), the write of new
// keys and values into a Q8_0 cache, and a KV-cache step's rotation of q and k with the
// write of its new keys and values into any of the three (rotate_and_store_kernel).
//
// Flash-decoding: a block of THREADS threads per (row, query, group of query heads that
// share a K/V head, run of keys), the keys a tile at a time with a running softmax, and the
// runs' states merged by a second kernel where a launch has few queries and long contexts
// (Plan, below). An element is read as it is stored (a half widened exactly; an 8-bit value
// times its block's scale). The cache kinds differ only in how a slot is read (the *Slots
// structs), so the three share one kernel.
//
// The Q8_0 write gives the CPU's bytes exactly (ops/q8.c q8_quantize_block: scale = max|x| /
// 127, codes rint(x * (1 / scale)), each operation rounded alone as on the CPU; the padding
// before the scales zero), so a cache written on either device reads the same.
//
// Written against device_primitives.cuh (and rope_rotation.cuh) only, so that
// tests/test_attention_cached_emulated.cpp runs these kernels' source on CPU threads
// (cpu_emulation.h) against the CPU ops in CI;
// tests/gpu/test_cuda.c checks them on the device.
#pragma once
#include <math.h>
#include <stdint.h>

#include "ops/attention_window.h"
#include "ops/cuda/device_primitives.cuh"
#include "ops/cuda/rope_rotation.cuh"
extern "C" {
#include "ops/ops.h"
}

namespace attention_cached {

enum { THREADS = 128 };

// A cached element as a float: a float32 cache's as it is, a half cache's (its 16 bits) widened
// exactly.
DEVICE_INLINE float widen(float x) { return x; }
DEVICE_INLINE float widen(uint16_t bits) { return half_to_float(bits); }

// Slot s (row b's slot j: s = b * capacity + j) of a cache of float32 (Element float) or IEEE
// half (uint16_t) elements, `width` = n_kv_heads * head_dim elements a slot.
template <typename Element> struct ElementSlots {
    const Element *cache;
    int width, head_dim;
    // One head of one slot; at(d) its element d as a float.
    struct Head {
        const Element *elements;
        DEVICE_METHOD float at(int d) const { return widen(elements[d]); }
    };
    DEVICE_METHOD Head head(long slot, int kv_head) const { return {cache + slot * width + kv_head * head_dim}; }
};
typedef ElementSlots<float> FloatSlots;
typedef ElementSlots<uint16_t> HalfSlots;

// The record of a Q8_0 cache's slot (ops/ops.h): its int8 values head after head, its float
// scales from values_bytes on, blocks_per_head per head (the last block of a head shorter when
// Q8_BLOCK does not divide head_dim). Made on the host (q8_layout): ops/ops.h's helpers are
// host code.
struct Q8Layout {
    long slot_bytes, values_bytes;
    int n_kv_heads, head_dim, blocks_per_head;
};

static inline Q8Layout q8_layout(int n_kv_heads, int head_dim) {
    return {kv_q8_slot_bytes(n_kv_heads, head_dim), kv_q8_values_bytes(n_kv_heads, head_dim), n_kv_heads, head_dim,
            kv_q8_blocks_per_head(head_dim)};
}

// A Q8_0 cache: slot s's record at cache + s * slot_bytes.
struct Q8Slots {
    const uint8_t *cache;
    Q8Layout layout;
    DEVICE_METHOD const int8_t *values(long slot, int kv_head) const {
        return reinterpret_cast<const int8_t *>(cache + slot * layout.slot_bytes) + kv_head * layout.head_dim;
    }
    DEVICE_METHOD const float *scales(long slot, int kv_head) const {
        return reinterpret_cast<const float *>(cache + slot * layout.slot_bytes + layout.values_bytes) +
               kv_head * layout.blocks_per_head;
    }
    struct Head {
        const int8_t *codes;
        const float *scales;
        // (unsigned: a shift; the signed division's fix-up for negative d cost the kernel spills)
        DEVICE_METHOD float at(int d) const { return (float)codes[d] * scales[(unsigned)d / Q8_BLOCK]; }
    };
    DEVICE_METHOD Head head(long slot, int kv_head) const { return {values(slot, kv_head), scales(slot, kv_head)}; }
};

// How a launch divides its work. A block takes one query (row b, new slot t) and up to
// MAX_GROUP of the query heads that share a K/V head (GQA), so each key and value it reads
// serves all of them, and one split of that query's keys: the keys [start, length) of the
// query are cut into `splits` runs of keys_per_split (a multiple of TILE). One split: the
// block writes the output. Several: each writes its run's softmax state (partial_record)
// and combine_kernel merges them in split order.
//
// Why splits: a decode step of a short batch has few (query, K/V head) pairs -- batch 1 of
// SmolLM2 has 3 -- and one block each would leave all but 3 of a GPU's ~132 multiprocessors
// idle while each walks the whole context (flash-decoding's observation). Splits are added
// until the launch has about TARGET_BLOCKS blocks, never a run shorter than a tile. The
// division depends only on the shapes, so the same launch gives the same bits every run (and
// on every GPU); a row's bits do depend on the batch's shape, as cuBLASLt's products' do.
struct Plan {
    int group;           // query heads per K/V head
    int heads_per_block; // of a group's heads, at most MAX_GROUP
    int head_blocks;     // blocks per group: ceil(group / heads_per_block)
    int splits, keys_per_split;
    int head_dim, parts; // parts: threads per output column in the value pass (head_dim <= THREADS / 2)
    long queries;        // B * T
};

enum { TILE = 64, MAX_GROUP = 8, MAX_HEAD_DIM = 256, TARGET_BLOCKS = 256 };
// A lane's share of a key in the score pass, a thread's columns in the value pass.
constexpr int KEY_REGISTERS = MAX_HEAD_DIM / 32, COLUMN_REGISTERS = MAX_HEAD_DIM / (int)THREADS;

static inline Plan plan(int B, int T, int first_slot, int n_heads, int n_kv_heads, int head_dim, int window,
                        long target_blocks) {
    Plan p;
    p.group = n_heads / n_kv_heads;
    p.head_blocks = (p.group + MAX_GROUP - 1) / MAX_GROUP;
    p.heads_per_block = (p.group + p.head_blocks - 1) / p.head_blocks;
    p.head_dim = head_dim;
    p.parts = head_dim <= THREADS / 2 ? THREADS / head_dim : 1;
    p.queries = (long)B * T;
    // The most keys any query of the launch sees.
    int longest = first_slot + T;
    if (window > 0 && window < longest) longest = window;
    const long base_blocks = p.queries * n_kv_heads * p.head_blocks;
    const int tiles = (longest + TILE - 1) / TILE;
    long splits = base_blocks >= target_blocks ? 1 : (target_blocks + base_blocks - 1) / base_blocks;
    if (splits > tiles) splits = tiles;
    const int tiles_per_split = (int)((tiles + splits - 1) / splits);
    p.keys_per_split = tiles_per_split * TILE;
    p.splits = (tiles + tiles_per_split - 1) / tiles_per_split;
    return p;
}

static inline unsigned blocks_x(const Plan &p, int n_kv_heads) {
    return (unsigned)(p.queries * n_kv_heads * p.head_blocks);
}

// Dynamic shared memory: the block's queries, then each part's output sums (parts > 1), then
// a tile of scores per head and each head's running maximum, sum and rescale factor.
static inline size_t shared_bytes(const Plan &p) {
    const size_t columns = (size_t)p.heads_per_block * p.head_dim;
    return (columns + (p.parts > 1 ? p.parts * columns : 0) + (size_t)p.heads_per_block * (TILE + 3)) * sizeof(float);
}

// A split's state for one (query, head): its keys' largest score, the sum of exp(score -
// largest) and the value rows weighted by those exponentials, head_dim floats.
HOST_DEVICE_INLINE long partial_record(const Plan &p) { return p.head_dim + 2; }
static inline size_t partial_bytes(const Plan &p, int n_heads) {
    return p.splits > 1 ? (size_t)p.queries * n_heads * p.splits * partial_record(p) * sizeof(float) : 0;
}

// Query t of row b (q, out: [B * T, n_heads * head_dim]) sits at slot first_slot + t and
// attends to slots [row_start[b], first_slot + t] (row_start NULL: from 0), under a sliding
// window of `window` slots (0: none) the last `window` of those; its keys and values are
// already in the caches. Grid: blocks_x(plan) x plan.splits blocks of THREADS,
// shared_bytes(plan). With one split the block writes `out`; with several, `partial`
// (partial_bytes) for combine_kernel.
//
// A tile of TILE keys at a time, as flash attention does: each warp scores its keys (a lane
// a strided part of head_dim, a butterfly of shuffles for the sum, so every key is read once
// for all the block's heads); a warp per head takes the tile's maximum, rescales what came
// before it and turns the scores into exponentials; then each thread adds the tile's values,
// one column of head_dim per thread (`parts` threads per column, each its share of the
// keys, when head_dim leaves threads over).
template <typename Slots>
static __global__ void __launch_bounds__(THREADS)
    attention_kernel(float *out, float *partial, const float *q, Slots keys, Slots values, const int *row_start, int T,
                     int capacity, int first_slot, int n_heads, int n_kv_heads, float scale, float softcap,
                     int window, Plan plan) {
    DYNAMIC_SHARED(shared);
    const int head_dim = plan.head_dim, parts = plan.parts;
    const int tid = (int)threadIdx.x, lane = tid % 32, warp = tid / 32;
    const int head_block = (int)blockIdx.x % plan.head_blocks;
    const int kv_head = (int)(blockIdx.x / plan.head_blocks % n_kv_heads);
    // 32-bit divisions: a 64-bit one is a called routine, which costs spilled registers.
    const int query_row = (int)blockIdx.x / plan.head_blocks / n_kv_heads; // b * T + t
    const int split = (int)blockIdx.y;
    const int b = query_row / T, t = query_row % T;
    const int first_head = kv_head * plan.group + head_block * plan.heads_per_block;
    const int group_left = (kv_head + 1) * plan.group - first_head; // the group's heads from first_head on
    const int heads = group_left < plan.heads_per_block ? group_left : plan.heads_per_block;
    const int length = first_slot + t + 1;
    const int start = attention_first_key(row_start ? row_start[b] : 0, length - 1, window);
    const int run_start = start + split * plan.keys_per_split;
    // Empty for a split past this query's keys.
    const int run_end = run_start + plan.keys_per_split < length ? run_start + plan.keys_per_split : length;
    const long row_slots = (long)b * capacity;

    float *query = reinterpret_cast<float *>(shared); // [heads_per_block][head_dim]
    float *part_sums = query + plan.heads_per_block * head_dim;
    float *scores = part_sums + (parts > 1 ? parts * plan.heads_per_block * head_dim : 0); // [heads][TILE]
    float *running_max = scores + plan.heads_per_block * TILE, *running_sum = running_max + plan.heads_per_block;
    float *rescale = running_sum + plan.heads_per_block;
    const float *q_first = q + ((long)query_row * n_heads + first_head) * head_dim;
    for (int i = tid; i < heads * head_dim; i += THREADS) query[i] = q_first[i];
    for (int g = tid; g < heads; g += THREADS) running_max[g] = -INFINITY, running_sum[g] = 0.0f;

    // The value pass: thread tid adds column `column` (and column + c * THREADS) over the keys
    // j with j % parts == part.
    const int part = parts > 1 ? tid / head_dim : 0, column = parts > 1 ? tid % head_dim : tid;
    const bool adds = part < parts;
    float acc[COLUMN_REGISTERS][MAX_GROUP];
    UNROLL for (int c = 0; c < COLUMN_REGISTERS; c++) UNROLL for (int g = 0; g < MAX_GROUP; g++) acc[c][g] = 0.0f;
    __syncthreads();

    for (int tile_start = run_start; tile_start < run_end; tile_start += TILE) {
        const int tile_keys = run_end - tile_start < TILE ? run_end - tile_start : TILE;
        // Scores: warp w takes keys w, w + WARPS, ... of the tile; every lane runs the shuffles.
        for (int k = warp; k < TILE; k += THREADS / 32) {
            const bool real = k < tile_keys;
            const auto key_head = keys.head(row_slots + tile_start + (real ? k : 0), kv_head);
            float key[KEY_REGISTERS];
            UNROLL for (int i = 0; i < KEY_REGISTERS; i++) {
                const int d = lane + 32 * i;
                key[i] = real && d < head_dim ? key_head.at(d) : 0.0f;
            }
            UNROLL for (int g = 0; g < MAX_GROUP; g++) {
                if (g < heads) {
                    float dot = 0.0f;
                    UNROLL for (int i = 0; i < KEY_REGISTERS; i++) {
                        const int d = lane + 32 * i;
                        if (d < head_dim) dot += query[g * head_dim + d] * key[i];
                    }
                    dot = warp_sum(dot);
                    if (lane == 0) {
                        float score = dot * scale;
                        if (softcap > 0.0f) score = softcap * tanhf(score / softcap); // Gemma 2's soft cap
                        scores[g * TILE + k] = real ? score : -INFINITY;
                    }
                }
            }
        }
        __syncthreads();
        // The softmax state: warp w takes heads w, w + WARPS, ...; a lane two of the tile's scores.
        for (int g = warp; g < heads; g += THREADS / 32) {
            float *s = scores + g * TILE;
            const float largest = fmaxf(running_max[g], warp_max(fmaxf(s[lane], s[lane + 32])));
            const float e0 = expf(s[lane] - largest), e1 = expf(s[lane + 32] - largest);
            const float tile_sum = warp_sum(e0 + e1);
            __syncwarp();
            s[lane] = e0, s[lane + 32] = e1;
            if (lane == 0) {
                const float factor = expf(running_max[g] - largest); // 0 before the first tile
                rescale[g] = factor;
                running_sum[g] = running_sum[g] * factor + tile_sum;
                running_max[g] = largest;
            }
        }
        __syncthreads();
        if (adds) {
            UNROLL for (int g = 0; g < MAX_GROUP; g++)
                if (g < heads) {
                    const float factor = rescale[g];
                    UNROLL for (int c = 0; c < COLUMN_REGISTERS; c++) acc[c][g] *= factor;
                }
            for (int k = part; k < tile_keys; k += parts) {
                const auto value_head = values.head(row_slots + tile_start + k, kv_head);
                UNROLL for (int c = 0; c < COLUMN_REGISTERS; c++) {
                    const int d = column + c * THREADS;
                    if (d < head_dim) {
                        const float v = value_head.at(d);
                        UNROLL for (int g = 0; g < MAX_GROUP; g++)
                            if (g < heads) acc[c][g] += scores[g * TILE + k] * v;
                    }
                }
            }
        }
        __syncthreads(); // the next tile's scores overwrite these
    }

    // The parts' sums into part 0's, in part order.
    if (parts > 1) {
        if (adds)
            UNROLL for (int g = 0; g < MAX_GROUP; g++)
                if (g < heads) part_sums[(part * plan.heads_per_block + g) * head_dim + column] = acc[0][g];
        __syncthreads();
        if (part == 0)
            UNROLL for (int g = 0; g < MAX_GROUP; g++)
                if (g < heads) {
                    float sum = part_sums[g * head_dim + column];
                    for (int r = 1; r < parts; r++) sum += part_sums[(r * plan.heads_per_block + g) * head_dim + column];
                    acc[0][g] = sum;
                }
    }
    if (part != 0) return;
    UNROLL for (int g = 0; g < MAX_GROUP; g++) {
        if (g >= heads) continue;
        const long head_row = (long)query_row * n_heads + first_head + g;
        if (plan.splits == 1) {
            const float inverse = 1.0f / running_sum[g];
            UNROLL for (int c = 0; c < COLUMN_REGISTERS; c++) {
                const int d = column + c * THREADS;
                if (d < head_dim) out[head_row * head_dim + d] = acc[c][g] * inverse;
            }
        } else {
            float *record = partial + (head_row * plan.splits + split) * partial_record(plan);
            if (tid == 0) record[0] = running_max[g], record[1] = running_sum[g];
            UNROLL for (int c = 0; c < COLUMN_REGISTERS; c++) {
                const int d = column + c * THREADS;
                if (d < head_dim) record[2 + d] = acc[c][g];
            }
        }
    }
}

// The splits' states of each (query, head) merged, split by split in order: the output is
// sum_s acc_s exp(m_s - M) / sum_s l_s exp(m_s - M), M the largest m_s. A split with no keys
// (l 0, m -inf) adds nothing. Grid: B * T * n_heads blocks of THREADS.
static __global__ void __launch_bounds__(THREADS) combine_kernel(float *out, const float *partial, Plan plan) {
    const long head_row = (long)blockIdx.x;
    const float *records = partial + head_row * plan.splits * partial_record(plan);
    float largest = -INFINITY;
    for (int s = 0; s < plan.splits; s++) largest = fmaxf(largest, records[s * partial_record(plan)]);
    float total = 0.0f;
    for (int s = 0; s < plan.splits; s++) {
        const float *record = records + s * partial_record(plan);
        if (record[1] > 0.0f) total += record[1] * expf(record[0] - largest);
    }
    const float inverse = 1.0f / total;
    for (int d = (int)threadIdx.x; d < plan.head_dim; d += THREADS) {
        float sum = 0.0f;
        for (int s = 0; s < plan.splits; s++) {
            const float *record = records + s * partial_record(plan);
            if (record[1] > 0.0f) sum += record[2 + d] * expf(record[0] - largest);
        }
        out[head_row * plan.head_dim + d] = sum * inverse;
    }
}

// Block k of head h of `row` (a new row's n_kv_heads * head_dim floats) into a slot's
// record, as q8_quantize_block does; the first block also zeroes the record's padding.
DEVICE_INLINE void quantize_block(uint8_t *record, const float *row, const Q8Layout &layout, int h, int k) {
    const int head_dim = layout.head_dim, blocks = layout.blocks_per_head;
    const long values_bytes = layout.values_bytes;
    const int first = h * head_dim + k * Q8_BLOCK;
    const int n = head_dim - k * Q8_BLOCK < Q8_BLOCK ? head_dim - k * Q8_BLOCK : Q8_BLOCK;
    const float *source = row + first;
    float largest = 0.0f;
    for (int d = 0; d < n; d++) {
        const float magnitude = fabsf(source[d]);
        largest = magnitude > largest ? magnitude : largest;
    }
    const float block_scale = largest / 127.0f;
    const float inverse = block_scale > 0.0f ? 1.0f / block_scale : 0.0f;
    int8_t *codes = reinterpret_cast<int8_t *>(record) + first;
    for (int d = 0; d < n; d++) codes[d] = (int8_t)round_to_int(mul_rn(source[d], inverse));
    reinterpret_cast<float *>(record + values_bytes)[h * blocks + k] = block_scale;
    if (h == 0 && k == 0)
        for (long p = (long)layout.n_kv_heads * head_dim; p < values_bytes; p++) record[p] = 0;
}

// One thread per (new row i = b * T + t, head, block): quantizes the block of x
// ([B * T, n_kv_heads * head_dim]) into row b's slot slot + t of a Q8_0 cache. Grid:
// write_blocks() blocks of THREADS.
HOST_DEVICE_INLINE long write_units(const Q8Layout &layout, int B, int T) {
    return (long)B * T * layout.n_kv_heads * layout.blocks_per_head;
}
static inline unsigned write_blocks(const Q8Layout &layout, int B, int T) {
    return (unsigned)((write_units(layout, B, T) + THREADS - 1) / THREADS);
}

static __global__ void __launch_bounds__(THREADS)
    write_q8_kernel(uint8_t *cache, const float *x, Q8Layout layout, int B, int T, int capacity, int slot) {
    const long unit = (long)blockIdx.x * THREADS + threadIdx.x;
    if (unit >= write_units(layout, B, T)) return;
    const int n_kv_heads = layout.n_kv_heads, blocks = layout.blocks_per_head;
    const long i = unit / ((long)n_kv_heads * blocks); // the new row
    const int h = (int)(unit / blocks % n_kv_heads), k = (int)(unit % blocks);
    uint8_t *record = cache + ((i / T) * capacity + slot + i % T) * layout.slot_bytes;
    quantize_block(record, x + i * n_kv_heads * layout.head_dim, layout, h, k);
}

// Where a new row's keys (or values) go: store(slot, row, tid, threads) writes the row's
// width = n_kv_heads * head_dim floats into slot `slot` (b * capacity + j) of the cache, the
// block's threads sharing the work.
struct FloatStore {
    float *cache;
    int width;
    DEVICE_METHOD void store(long slot, const float *row, int tid, int threads) const {
        float *to = cache + slot * width;
        // Not unrolled: nvcc's unrolled copy spilled registers in rotate_and_store_kernel (ptxas -v).
        KEEP_LOOP for (int i = tid; i < width; i += threads) to[i] = row[i];
    }
};
struct HalfStore { // rounded to the nearest half, ties to even, as cache_write_f16
    uint16_t *cache;
    int width;
    DEVICE_METHOD void store(long slot, const float *row, int tid, int threads) const {
        for (int i = tid; i < width; i += threads) cache[slot * width + i] = float_to_half_bits(row[i]);
    }
};
struct Q8Store { // a thread per block, as write_q8_kernel
    uint8_t *cache;
    Q8Layout layout;
    DEVICE_METHOD void store(long slot, const float *row, int tid, int threads) const {
        const int blocks = layout.blocks_per_head;
        for (int unit = tid; unit < layout.n_kv_heads * blocks; unit += threads)
            quantize_block(cache + slot * layout.slot_bytes, row, layout, unit / blocks, unit % blocks);
    }
};

// ops.h rotate_and_cache_write in one launch: a block per new row (row = b * T + t, grid B *
// T blocks of THREADS). The row's angles once (rope_rotation.cuh, head_dim floats of dynamic
// shared memory), its q and k heads rotated in place as rope_kernel rotates them (q_copy,
// k_copy: the bf16 copies of held buffers, or NULL), then k and v stored into slot slot + t
// of row b. inv_freq NULL: nothing rotated, only the stores.
template <typename Store>
static __global__ void __launch_bounds__(THREADS)
    rotate_and_store_kernel(float *q, bf16 *q_copy, float *k, bf16 *k_copy, const float *v, Store keys, Store values,
                            const int *positions, int T, int capacity, int slot, int n_heads, int n_kv_heads,
                            int head_dim, const float *inv_freq) {
    DYNAMIC_SHARED(shared);
    const int row = (int)blockIdx.x, tid = (int)threadIdx.x;
    const long q_width = (long)n_heads * head_dim, kv_width = (long)n_kv_heads * head_dim;
    float *k_row = k + row * kv_width;
    if (inv_freq) {
        float *cos_sin = reinterpret_cast<float *>(shared);
        rope_rotation::row_cos_sin(cos_sin, positions[row], inv_freq, head_dim, 1.0f, tid, THREADS);
        __syncthreads();
        rope_rotation::rotate_heads(q + row * q_width, q_copy ? q_copy + row * q_width : NULL, cos_sin, n_heads, head_dim,
                                tid, THREADS);
        rope_rotation::rotate_heads(k_row, k_copy ? k_copy + row * kv_width : NULL, cos_sin, n_kv_heads, head_dim, tid,
                                THREADS);
        __syncthreads(); // every thread's rotated k before any thread stores it
    }
    const long cache_slot = (long)(row / T) * capacity + slot + row % T;
    keys.store(cache_slot, k_row, tid, THREADS);
    values.store(cache_slot, v + row * kv_width, tid, THREADS);
}

} // namespace attention_cached
