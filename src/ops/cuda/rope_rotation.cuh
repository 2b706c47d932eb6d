// One row's rotary rotation (Hugging Face "rotate half", ops/cpu/rope.c), by a block's
// threads: the row's angles into shared memory once, then its heads rotated with them. Shared
// by rope_rows.cuh's kernel (rope_forward / rope_backward) and attention_cached.cuh's
// rotate_and_store_kernel (a KV-cache step's q and k), so both rotate alike. Written against
// device_primitives.cuh only (runs under cpu_emulation.h in the emulated tests).
#pragma once
#include <math.h>

#include "ops/cuda/device_primitives.cuh"

namespace rope_rotation {

// A row's angles, by the block's `threads` threads (this one `tid`): cos_sin[pair] the cosine
// of position * inv_freq[pair], cos_sin[head_dim / 2 + pair] its sine times direction. The
// caller's barrier publishes them.
DEVICE_INLINE void row_cos_sin(float *cos_sin, int position, const float *inv_freq, int head_dim, float direction,
                               int tid, int threads) {
    const int half = head_dim / 2;
    for (int pair = tid; pair < half; pair += threads) {
        const float angle = (float)position * inv_freq[pair];
        float s, c;
        sincosf(angle, &s, &c);
        cos_sin[pair] = c;
        cos_sin[half + pair] = s * direction;
    }
}

// The first n_heads heads of a row rotated in place by row_cos_sin's angles; copy (or NULL):
// where the bf16 copy of `heads` starts, written with the new values.
DEVICE_INLINE void rotate_heads(float *heads, bf16 *copy, const float *cos_sin, int n_heads, int head_dim, int tid,
                                int threads) {
    const int half = head_dim / 2;
    for (int i = tid; i < n_heads * half; i += threads) {
        const int pair = i % half, first = (i / half) * head_dim;
        float *head = heads + first;
        const float c = cos_sin[pair], s = cos_sin[half + pair];
        const float x1 = head[pair], x2 = head[pair + half];
        head[pair] = x1 * c - x2 * s;
        head[pair + half] = x2 * c + x1 * s;
        if (copy) {
            copy[first + pair] = to_bf16(head[pair]);
            copy[first + pair + half] = to_bf16(head[pair + half]);
        }
    }
}

} // namespace rope_rotation
