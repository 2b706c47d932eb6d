// Rotary position embedding, Hugging Face "rotate half" layout (ops/cpu/rope.c), over rows
// (rope.cu launches it): one block per row (token). The row's cos and sin of position *
// inv_freq[pair] (the model's table, device memory) are computed once into shared memory,
// then every head's pairs are rotated with them: sincosf once a row and frequency instead of
// once for each head too, and no 64-bit index divisions. The backward (direction -1, the
// inverse rotation) is the q and k projections' output gradient: when it is a held matmul
// input (matmul_input_hold) its bf16 copy is written too.
//
// Written once for nvcc and for the CPU emulation (cpu_emulation.h), which runs it in
// tests/test_rope_emulated.cpp against ops/cpu/rope.c.
#pragma once
#include <math.h>

#include "ops/cuda/device_primitives.cuh"

namespace rope_rows {

enum { THREADS = 256 };

// Dynamic shared memory: head_dim floats (cos of each pair, then sin times direction).
static __global__ void __launch_bounds__(THREADS)
    rope_kernel(float *x, bf16 *x_copy, const int *positions, int n_heads, int head_dim, const float *inv_freq,
                float direction) {
    DYNAMIC_SHARED(shared);
    float *cos_sin = reinterpret_cast<float *>(shared);
    const int half = head_dim / 2;
    const long row = blockIdx.x;
    for (int pair = threadIdx.x; pair < half; pair += THREADS) {
        const float angle = (float)positions[row] * inv_freq[pair];
        float s, c;
        sincosf(angle, &s, &c);
        cos_sin[pair] = c;
        cos_sin[half + pair] = s * direction;
    }
    __syncthreads();
    float *heads = x + row * n_heads * head_dim;
    for (int i = threadIdx.x; i < n_heads * half; i += THREADS) {
        const int pair = i % half;
        float *head = heads + (i / half) * head_dim;
        const float c = cos_sin[pair], s = cos_sin[half + pair];
        const float x1 = head[pair], x2 = head[pair + half];
        head[pair] = x1 * c - x2 * s;
        head[pair + half] = x2 * c + x1 * s;
        if (x_copy) {
            bf16 *copy = x_copy + (head - x);
            copy[pair] = to_bf16(head[pair]);
            copy[pair + half] = to_bf16(head[pair + half]);
        }
    }
}

} // namespace rope_rows
