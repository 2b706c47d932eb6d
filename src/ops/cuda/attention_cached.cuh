// Attention against a KV cache on the GPU -- a decode step (one new query per row) or a few
// new queries per row that continue a cached prefix (the prompt cache, chunked prefill) --
// over the three kinds of cache (model/model.h KvCacheType): float32, IEEE halves
// (--kv-cache f16) and Q8_0 blocks (--kv-cache q8_0; ops/ops.h kv_q8_slot_bytes gives a
// slot's record: a head's int8 values, then each block's float scale), and the write of new
// keys and values into a Q8_0 cache.
//
// One block of THREADS threads per (row, query, head): the threads take the cached keys in
// turn, each score a dot product of the float query with the key as it is read (a half
// widened exactly; an 8-bit block's sum of products times its scale), kept in shared memory;
// a block-wide maximum, the exponentials and their double sum; then each thread a few of
// head_dim's output elements, summing over the keys. The cache kinds differ only in how a
// slot is read (the *Slots structs), so the three share one kernel.
//
// The Q8_0 write gives the CPU's bytes exactly (ops/q8.c q8_quantize_block: scale = max|x| /
// 127, codes rint(x * (1 / scale)), each operation rounded alone as on the CPU; the padding
// before the scales zero), so a cache written on either device reads the same.
//
// Written against device_primitives.cuh only, so that tests/test_attention_cached_emulated.cpp
// runs these kernels' source on CPU threads (cpu_emulation.h) against the CPU ops in CI;
// tests/gpu/test_cuda.c checks them on the device.
#pragma once
#include <math.h>
#include <stdint.h>

#include "ops/attention_window.h"
#include "ops/cuda/device_primitives.cuh"
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
    DEVICE_METHOD float dot(const float *query, long slot, int kv_head) const {
        const Element *key = cache + slot * width + kv_head * head_dim;
        float sum = 0.0f;
        for (int d = 0; d < head_dim; d++) sum += query[d] * widen(key[d]);
        return sum;
    }
    DEVICE_METHOD float element(long slot, int kv_head, int d) const {
        return widen(cache[slot * width + kv_head * head_dim + d]);
    }
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
    // Each block's products summed, then times its scale.
    DEVICE_METHOD float dot(const float *query, long slot, int kv_head) const {
        const int8_t *key = values(slot, kv_head);
        const float *scale = scales(slot, kv_head);
        const int head_dim = layout.head_dim;
        float sum = 0.0f;
        for (int k = 0; k < layout.blocks_per_head; k++) {
            const int end = (k + 1) * Q8_BLOCK < head_dim ? (k + 1) * Q8_BLOCK : head_dim;
            float block = 0.0f;
            for (int d = k * Q8_BLOCK; d < end; d++) block += query[d] * (float)key[d];
            sum += block * scale[k];
        }
        return sum;
    }
    DEVICE_METHOD float element(long slot, int kv_head, int d) const {
        return (float)values(slot, kv_head)[d] * scales(slot, kv_head)[d / Q8_BLOCK];
    }
};

// The block-wide maximum (or sum) of every thread's x, in a fixed order (a tree over
// `scratch`, THREADS doubles of shared memory); every thread gets it. Ends with a barrier, so
// scratch can be used again and everything the threads wrote to shared memory before the
// call is visible after it.
DEVICE_INLINE double block_reduce(double *scratch, double x, bool maximum) {
    const int tid = (int)threadIdx.x;
    scratch[tid] = x;
    __syncthreads();
    for (int stride = THREADS / 2; stride > 0; stride /= 2) {
        if (tid < stride) {
            const double a = scratch[tid], b = scratch[tid + stride];
            scratch[tid] = maximum ? (a > b ? a : b) : a + b;
        }
        __syncthreads();
    }
    const double result = scratch[0];
    __syncthreads();
    return result;
}

// Dynamic shared memory of a launch whose queries reach slot `last_slot` (first_slot + T - 1).
static inline size_t shared_bytes(int last_slot) {
    return THREADS * sizeof(double) + (size_t)(last_slot + 1) * sizeof(float);
}

// Query t of row b (q, out: [B * T, n_heads * head_dim]) sits at slot first_slot + t and
// attends to slots [row_start[b], first_slot + t] (row_start NULL: from 0), under a sliding
// window of `window` slots (0: none) the last `window` of those; its keys and values are
// already in the caches. Grid: B * T * n_heads blocks of THREADS, shared_bytes().
template <typename Slots>
static __global__ void __launch_bounds__(THREADS)
    attention_kernel(float *out, const float *q, Slots keys, Slots values, const int *row_start, int T, int capacity,
                     int first_slot, int n_heads, int n_kv_heads, int head_dim, float scale, float softcap,
                     int window) {
    DYNAMIC_SHARED(shared);
    double *scratch = reinterpret_cast<double *>(shared);
    float *scores = reinterpret_cast<float *>(scratch + THREADS);
    const int tid = (int)threadIdx.x;
    const int h = (int)blockIdx.x % n_heads, t = (int)blockIdx.x / n_heads % T, b = (int)blockIdx.x / n_heads / T;
    const int kv_head = h / (n_heads / n_kv_heads);
    const int length = first_slot + t + 1;
    const int start = attention_first_key(row_start ? row_start[b] : 0, length - 1, window);
    const long row_slots = (long)b * capacity;
    const float *query = q + (((long)b * T + t) * n_heads + h) * head_dim;
    float largest = -INFINITY;
    for (int j = start + tid; j < length; j += THREADS) {
        float score = keys.dot(query, row_slots + j, kv_head) * scale;
        if (softcap > 0.0f) score = softcap * tanhf(score / softcap); // Gemma 2's soft cap
        scores[j] = score;
        largest = fmaxf(largest, score);
    }
    largest = (float)block_reduce(scratch, largest, true);
    double sum = 0;
    for (int j = start + tid; j < length; j += THREADS) {
        scores[j] = expf(scores[j] - largest);
        sum += scores[j];
    }
    const float inverse = (float)(1.0 / block_reduce(scratch, sum, false)); // its barrier publishes scores[]
    float *o = out + (((long)b * T + t) * n_heads + h) * head_dim;
    for (int d = tid; d < head_dim; d += THREADS) {
        float acc = 0.0f;
        for (int j = start; j < length; j++) acc += scores[j] * inverse * values.element(row_slots + j, kv_head, d);
        o[d] = acc;
    }
}

// One thread per (new row i = b * T + t, head, block): quantizes the block of x
// ([B * T, n_kv_heads * head_dim]) into row b's slot slot + t of a Q8_0 cache, as
// q8_quantize_block does; the first block's thread also zeroes the record's padding. Grid:
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
    const int n_kv_heads = layout.n_kv_heads, head_dim = layout.head_dim, blocks = layout.blocks_per_head;
    const long i = unit / ((long)n_kv_heads * blocks); // the new row
    const int h = (int)(unit / blocks % n_kv_heads), k = (int)(unit % blocks);
    const long values_bytes = layout.values_bytes;
    uint8_t *record = cache + ((i / T) * capacity + slot + i % T) * layout.slot_bytes;
    const int first = h * head_dim + k * Q8_BLOCK;
    const int n = head_dim - k * Q8_BLOCK < Q8_BLOCK ? head_dim - k * Q8_BLOCK : Q8_BLOCK;
    const float *source = x + i * n_kv_heads * head_dim + first;
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
        for (long p = (long)n_kv_heads * head_dim; p < values_bytes; p++) record[p] = 0;
}

} // namespace attention_cached
