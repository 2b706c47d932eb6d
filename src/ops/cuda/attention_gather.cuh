// The attention's gathers (attention.cu launches them): Q, K, V and the output gradient dO
// from the model's rows [B*T, heads*hd] (fp32) into the head-major bf16 copies
// [B, H, T, hd] that the attention's products read, K and V repeated for the heads of their
// group (head h reads input head h / group); and the backward's row term
// D[b, h, t] = dO[b*T + t, h] . O[b*T + t, h] (the softmax backward's rowsum(P dP)).
// Q, K and V's rows are `row_stride` floats apart: heads*hd for buffers of their own, or the
// width of a fused q | k | v buffer whose columns they are (ops.h, attention_forward_rotary),
// which the gathers then read in place. dO is the attention output's gradient: rows of its own.
//
// Written once for nvcc and for the CPU emulation (cpu_emulation.h), which runs them in
// tests/test_attention_gather_emulated.cpp against plain loops.
#pragma once
#include <stdint.h>

#include "ops/cuda/device_primitives.cuh"

namespace attention_gather {

enum { THREADS = 256 };

// Whether the eight-element kernels can gather `in` (rows `row_stride` floats apart, read as
// float4): head_dim and the row stride multiples of 8 and 4 (every head's piece of a row
// 16-byte aligned), `in` 16-byte aligned, a head's items countable in 32 bits (the kernels
// index in unsigned ints) and the heads within a grid's y dimension.
static inline bool gathers_by_eight(const float *in, int row_stride, int B, int T, int n_heads, int head_dim) {
    const long items_per_head = (long)B * T * (head_dim / 8);
    return head_dim % 8 == 0 && row_stride % 4 == 0 && (uintptr_t)in % 16 == 0 && items_per_head < (1l << 31) &&
           n_heads <= 65535;
}

// Whether gather_dout_by_eight_kernel can take dO and O (rows of their own, n_heads *
// head_dim floats): as gathers_by_eight, and a head row's head_dim / 8 threads fit evenly in
// a warp (they add their products by shuffles).
static inline bool gathers_dout_by_eight(const float *dout, const float *out, int B, int T, int n_heads,
                                         int head_dim) {
    return gathers_by_eight(dout, n_heads * head_dim, B, T, n_heads, head_dim) && (uintptr_t)out % 16 == 0 &&
           32 % (head_dim / 8) == 0;
}

// out[b, h, t, :] = in[(b*T + t) * row_stride + (h / group) * hd + :] as bf16, one element a
// thread: any head_dim, row stride and alignment (the fallback of the kernel below). Grid:
// B*H*T*hd threads.
static __global__ void __launch_bounds__(THREADS)
    gather_heads_kernel(bf16 *out, const float *in, int row_stride, int B, int T, int n_heads, int group,
                        int head_dim) {
    const long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    const long total = (long)B * n_heads * T * head_dim;
    if (i >= total) return;
    const int d = (int)(i % head_dim);
    long rest = i / head_dim;
    const int t = (int)(rest % T);
    rest /= T;
    const int h = (int)(rest % n_heads);
    const int b = (int)(rest / n_heads);
    out[i] = to_bf16(in[((long)b * T + t) * row_stride + (h / group) * head_dim + d]);
}

// The same, eight elements of a row a thread (two float4 reads, one 16-byte write) where
// gathers_by_eight holds: the common case, run twice a layer (forward and backward) for
// Q, K, V and dO. blockIdx.y is the output head; a thread's index within it is
// (b*T + t) * chunks + chunk, chunks = head_dim / 8.
static __global__ void __launch_bounds__(THREADS)
    gather_heads_by_eight_kernel(bf16 *out, const float *in, int row_stride, int B, int T, int n_heads, int group,
                                 int head_dim) {
    const unsigned chunks = (unsigned)head_dim / 8;
    const unsigned item = blockIdx.x * blockDim.x + threadIdx.x;
    if (item >= (unsigned)B * T * chunks) return;
    const int h = blockIdx.y;
    const unsigned row = item / chunks, chunk = item % chunks; // row = b*T + t
    const int b = (int)(row / (unsigned)T), t = (int)(row % (unsigned)T);
    const float *from = in + (long)row * row_stride + (h / group) * head_dim + chunk * 8;
    float eight[8];
    load_float4(eight, from);
    load_float4(eight + 4, from + 4);
    store_bf16x8(out + (((long)b * n_heads + h) * T + t) * head_dim + chunk * 8, eight);
}

// Whether gather_rotated_heads_kernel can gather `in`: as gathers_by_eight, with head_dim a
// multiple of 16 (a thread takes eight pairs: eight elements of each half of a head row).
static inline bool gathers_rotated(const float *in, int row_stride, int B, int T, int n_heads, int head_dim) {
    return head_dim % 16 == 0 && gathers_by_eight(in, row_stride, B, T, n_heads, head_dim);
}

// Q or K gathered as gather_heads_by_eight_kernel gathers them (group 1), rotated on the
// way as rope_forward rotates (rope_rows.cuh's formulas: pair i of a head row, elements i
// and i + head_dim / 2, turned by positions[row] * inv_freq[i]), so that the rotation is
// not a pass of its own over q and k (ops.h, attention_forward_rotary). A thread takes
// pairs [8c, 8c + 8) of a head row: two float4 reads and one 16-byte write in each half.
// blockIdx.y is the head; a thread's index within it is (b*T + t) * chunks + c, chunks =
// head_dim / 16. A pair's cosine and sine are computed in each head's thread (sincosf: a
// few tens of instructions against the 48 bytes each pair moves), in a loop kept a loop and
// through shared memory: eight copies of sincosf unrolled put its slow path's table (for
// angles past 105615) in local memory. Dynamic shared memory: ROTATED_SHARED_BYTES.
enum { ROTATED_SHARED_BYTES = 16 * THREADS * sizeof(float) };

static __global__ void __launch_bounds__(THREADS)
    gather_rotated_heads_kernel(bf16 *out, const float *in, int row_stride, const int *positions,
                                const float *inv_freq, int B, int T, int n_heads, int head_dim) {
    DYNAMIC_SHARED(shared);
    float *cos_sin = reinterpret_cast<float *>(shared) + threadIdx.x; // [16][THREADS]: 8 cosines, then 8 sines
    const unsigned chunks = (unsigned)head_dim / 16;
    const unsigned item = blockIdx.x * blockDim.x + threadIdx.x;
    if (item >= (unsigned)B * T * chunks) return;
    const int h = blockIdx.y, half = head_dim / 2;
    const unsigned row = item / chunks, chunk = item % chunks; // row = b*T + t
    const int b = (int)(row / (unsigned)T), t = (int)(row % (unsigned)T);
    const float *from = in + (long)row * row_stride + (long)h * head_dim + chunk * 8;
    float first[8], second[8];
    load_float4(first, from);
    load_float4(first + 4, from + 4);
    load_float4(second, from + half);
    load_float4(second + 4, from + half + 4);
    const float position = (float)positions[row];
    KEEP_LOOP
    for (int i = 0; i < 8; i++) {
        float s, c;
        sincosf(position * inv_freq[chunk * 8 + i], &s, &c);
        cos_sin[i * THREADS] = c;
        cos_sin[(8 + i) * THREADS] = s;
    }
    float first_rotated[8], second_rotated[8];
    UNROLL
    for (int i = 0; i < 8; i++) {
        const float c = cos_sin[i * THREADS], s = cos_sin[(8 + i) * THREADS];
        first_rotated[i] = first[i] * c - second[i] * s;
        second_rotated[i] = second[i] * c + first[i] * s;
    }
    bf16 *to = out + (((long)b * n_heads + h) * T + t) * head_dim + chunk * 8;
    store_bf16x8(to, first_rotated);
    store_bf16x8(to + half, second_rotated);
}

// dO gathered as gather_heads_by_eight_kernel gathers it (group 1), and with it the row term
// D[b, h, t] = dO . O over the head's columns (row_dot_kernel's), so that dout is read once;
// where gathers_dout_by_eight holds. The chunks = head_dim / 8 threads of a head row are
// consecutive lanes of one warp (chunks divides 32 and the block's threads), which add their
// eight products by xor shuffles; no lane returns early, since all join the shuffles.
static __global__ void __launch_bounds__(THREADS)
    gather_dout_by_eight_kernel(bf16 *dO, float *D, const float *dout, const float *out, int B, int T, int n_heads,
                                int head_dim) {
    const unsigned chunks = (unsigned)head_dim / 8;
    const unsigned item = blockIdx.x * blockDim.x + threadIdx.x;
    const bool valid = item < (unsigned)B * T * chunks; // a head row's lanes are all valid or all not
    const int h = blockIdx.y;
    const unsigned row = item / chunks, chunk = item % chunks; // row = b*T + t
    const int b = (int)(row / (unsigned)T), t = (int)(row % (unsigned)T);
    const long head_row = ((long)b * n_heads + h) * T + t; // D's index; dO's row
    float dot = 0.0f;
    if (valid) {
        const long at = (long)row * n_heads * head_dim + (long)h * head_dim + chunk * 8;
        float gradient[8], output[8];
        load_float4(gradient, dout + at);
        load_float4(gradient + 4, dout + at + 4);
        load_float4(output, out + at);
        load_float4(output + 4, out + at + 4);
        dot = gradient[0] * output[0];
        UNROLL
        for (int i = 1; i < 8; i++) dot += gradient[i] * output[i];
        store_bf16x8(dO + head_row * head_dim + chunk * 8, gradient);
    }
    for (unsigned offset = chunks / 2; offset > 0; offset /= 2) dot += __shfl_xor_sync(0xffffffffu, dot, offset);
    if (valid && chunk == 0) D[head_row] = dot;
}

// D[b, h, t] = dO[b*T + t, h] . O[b*T + t, h], one warp a row (the fallback of the kernel
// above, beside gather_heads_kernel). Grid: B*H*T warps.
static __global__ void __launch_bounds__(THREADS)
    row_dot_kernel(float *D, const float *dout, const float *out, int B, int H, int T, int head_dim) {
    const long row = (long)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32; // (b*H + h)*T + t
    const int lane = threadIdx.x % 32;
    if (row >= (long)B * H * T) return; // the whole warp: a row is one warp's
    const int t = (int)(row % T), h = (int)(row / T % H), b = (int)(row / T / H);
    const long at = ((long)b * T + t) * H * head_dim + h * head_dim;
    float sum = 0.0f;
    for (int d = lane; d < head_dim; d += 32) sum += dout[at + d] * out[at + d];
    sum = warp_sum(sum);
    if (lane == 0) D[row] = sum;
}

} // namespace attention_gather
