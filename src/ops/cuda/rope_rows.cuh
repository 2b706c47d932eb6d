// Rotary position embedding, Hugging Face "rotate half" layout (ops/cpu/rope.c), over rows
// (rope.cu launches it): one block per row (token). The row's cos and sin of position *
// inv_freq[pair] (the model's table, device memory) are computed once into shared memory,
// then every head's pairs are rotated with them: sincosf once a row and frequency instead of
// once for each head too, and no 64-bit index divisions. The backward (direction -1, the
// inverse rotation) is the q and k projections' output gradient: when it is a held matmul
// input (matmul_input_hold) its bf16 copy is written too. Rows are `row_stride` floats
// apart, and the heads rotated are the first n_heads of each: rows of their own (row_stride
// n_heads * head_dim), or the rows of a fused q | k | v gradient, whose q and k heads are
// its first H + KV heads (the rotary attention's backward, attention.cu), where the copy of
// a held buffer takes the rest of each row (v's columns) too.
//
// Written once for nvcc and for the CPU emulation (cpu_emulation.h), which runs it in
// tests/test_rope_emulated.cpp against ops/cpu/rope.c.
#pragma once
#include <math.h>

#include "ops/cuda/device_primitives.cuh"
#include "ops/cuda/rope_rotation.cuh"

namespace rope_rows {

enum { THREADS = 256 };

// x_copy (or NULL): the bf16 copy of the whole rows [N, row_stride] to write, the rotated
// heads' new values and the other columns' values as they are. Dynamic shared memory:
// head_dim floats (cos of each pair, then sin times direction).
static __global__ void __launch_bounds__(THREADS)
    rope_kernel(float *x, bf16 *x_copy, int row_stride, const int *positions, int n_heads, int head_dim,
                const float *inv_freq, float direction) {
    DYNAMIC_SHARED(shared);
    float *cos_sin = reinterpret_cast<float *>(shared);
    const long row = blockIdx.x;
    rope_rotation::row_cos_sin(cos_sin, positions[row], inv_freq, head_dim, direction, (int)threadIdx.x, THREADS);
    __syncthreads();
    float *heads = x + row * row_stride;
    rope_rotation::rotate_heads(heads, x_copy ? x_copy + row * row_stride : NULL, cos_sin, n_heads, head_dim,
                                (int)threadIdx.x, THREADS);
    if (x_copy) // the columns past the rotated heads (none for rows of their own)
        for (int column = n_heads * head_dim + threadIdx.x; column < row_stride; column += THREADS)
            x_copy[row * row_stride + column] = to_bf16(heads[column]);
}

} // namespace rope_rows
