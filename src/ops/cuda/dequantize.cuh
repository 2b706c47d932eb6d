// Quantized weights (ops/ops.h Q8Matrix: Q8_0, Q4_0, NF4 with float or double-quantized
// scales, and a bitsandbytes FP4 code book) turned back into numbers on the GPU: rows of a
// matrix into a bf16 tile for cuBLASLt (matmul_quantized.cu), and the quantized token table's
// rows into fp32 embeddings. The GPU keeps the weights quantized in its memory and has no
// integer dot-product kernels: every product with a quantized weight dequantizes it a tile at
// a time and multiplies in bf16 as the float model does.
//
// Each value is the CPU's (ops/q4.c quant_dequantize_rows, ops/nf4.c) to the bit before the
// bf16 rounding: the same float products in the same order, and the double-quantized NF4
// scale map[code] * absmax2 + offset with two roundings (mul_rn / add_rn: nvcc would fuse
// them into one FMA). tests/test_dequantize_emulated.cpp checks that on CPU threads
// (device_primitives.cuh, cpu_emulation.h); tests/gpu/test_cuda.c on the device.
//
// A thread decodes 8 consecutive values of the flattened matrix (its row r, columns
// [c, c + 8), c a multiple of 8): they lie in one block (32 or 64 values) and in 8 (Q8_0)
// or 4 (Q4_0, NF4) bytes, so every thread does one block's scale and a few loads.
#pragma once
#include <stdint.h>

#include "ops/cuda/device_primitives.cuh"
extern "C" {
#include "ops/nf4.h"
#include "ops/ops.h"
}

namespace dequantize {

enum { THREADS = 128, VALUES_PER_THREAD = 8 };

// A 4-bit matrix's 16 levels (nf4_levels or fp4_levels, host arrays), passed by value.
struct CodeBook {
    float levels[16];
};

// The kernels' view of a Q8Matrix in device memory. dynamic_map: bitsandbytes' 256-value
// map of the double-quantized NF4 scales (nf4_dynamic_map), in device memory; the others
// ignore it.
struct Weights {
    Q8Matrix matrix;
    CodeBook book;
    const float *dynamic_map;
};

// The view of `matrix` (its arrays in the kernels' memory); dynamic_map is needed (and read)
// only for NF4 with double-quantized scales.
static inline Weights weights_for(const Q8Matrix *matrix, const float *dynamic_map) {
    Weights w = {};
    w.matrix = *matrix;
    w.matrix.levels = NULL; // a host array: its values travel in the code book
    if (matrix->type == QUANT_NF4) {
        const float *levels = quant_levels(matrix);
        for (int i = 0; i < 16; i++) w.book.levels[i] = levels[i];
        if (!matrix->scales) w.dynamic_map = dynamic_map;
    }
    return w;
}

// The scale of block k of the flattened matrix (32 values for Q8_0 and Q4_0, 64 for NF4).
DEVICE_INLINE float block_scale(const Weights &w, long k) {
    if (w.matrix.scales) return w.matrix.scales[k];
    const float scaled = mul_rn(w.dynamic_map[w.matrix.scale_codes[k]], w.matrix.scale_absmax[k / NF4_SCALE_BLOCK]);
    return add_rn(scaled, w.matrix.scale_offset);
}

// Values [index, index + 8) of the flattened matrix, index a multiple of 8.
DEVICE_INLINE void decode8(const Weights &w, long index, float out[VALUES_PER_THREAD]) {
    const Q8Matrix &m = w.matrix;
    if (m.type == QUANT_Q8_0) {
        const float scale = block_scale(w, index / Q8_BLOCK);
        const int8_t *values = m.values + index;
        for (int i = 0; i < VALUES_PER_THREAD; i++) out[i] = (float)values[i] * scale;
    } else if (m.type == QUANT_Q4_0) {
        // A block is 16 bytes: byte j holds value j (low nibble) and value j + 16 (high).
        const long block = index / Q8_BLOCK;
        const int within = (int)(index % Q8_BLOCK);
        const float scale = block_scale(w, block);
        const uint8_t *bytes = m.nibbles + block * (Q8_BLOCK / 2) + within % (Q8_BLOCK / 2);
        const int shift = within >= Q8_BLOCK / 2 ? 4 : 0;
        for (int i = 0; i < VALUES_PER_THREAD; i++) out[i] = (float)(((bytes[i] >> shift) & 0x0F) - 8) * scale;
    } else { // QUANT_NF4 (or bitsandbytes FP4: another code book)
        // Byte j holds value 2j in its high nibble and value 2j + 1 in its low one.
        const float scale = block_scale(w, index / NF4_BLOCK);
        const uint8_t *bytes = m.nibbles + index / 2;
        for (int i = 0; i < VALUES_PER_THREAD / 2; i++) {
            out[2 * i] = w.book.levels[bytes[i] >> 4] * scale;
            out[2 * i + 1] = w.book.levels[bytes[i] & 0x0F] * scale;
        }
    }
}

// Threads (and blocks of THREADS) that rows_kernel needs for `rows` rows of `cols`.
HOST_DEVICE_INLINE long rows_threads(long rows, long cols) { return rows * cols / VALUES_PER_THREAD; }
static inline unsigned rows_blocks(long rows, long cols) {
    return (unsigned)((rows_threads(rows, cols) + THREADS - 1) / THREADS);
}

// tile[rows, cols] = bf16 of rows [first_row, first_row + rows) of the matrix.
// Grid: rows_blocks(rows, cols) blocks of THREADS.
static __global__ void __launch_bounds__(THREADS) rows_kernel(bf16 *tile, Weights w, long first_row, int rows) {
    const long unit = (long)blockIdx.x * THREADS + threadIdx.x;
    if (unit >= rows_threads(rows, w.matrix.cols)) return;
    float values[VALUES_PER_THREAD];
    decode8(w, first_row * w.matrix.cols + unit * VALUES_PER_THREAD, values);
    uint32_t *out = reinterpret_cast<uint32_t *>(tile + unit * VALUES_PER_THREAD);
    for (int i = 0; i < VALUES_PER_THREAD / 2; i++) out[i] = pack_bf16x2(values[2 * i], values[2 * i + 1]);
}

// out[i] = scale * dequantized(table)[tokens[i]] (+ pos_emb[positions[i]] when given), the
// products and the sum rounded as the CPU's cpu_embedding_forward_q8 rounds them.
// Grid: rows_blocks(N, C) blocks of THREADS.
static __global__ void __launch_bounds__(THREADS) embedding_kernel(float *out, const int *tokens, const int *positions,
                                                            Weights table, const float *pos_emb, int N,
                                                            float scale) {
    const long C = table.matrix.cols;
    const long unit = (long)blockIdx.x * THREADS + threadIdx.x;
    if (unit >= rows_threads(N, C)) return;
    const long row = unit * VALUES_PER_THREAD / C, c = unit * VALUES_PER_THREAD % C;
    float values[VALUES_PER_THREAD];
    decode8(table, (long)tokens[row] * C + c, values);
    float *y = out + row * C + c;
    for (int i = 0; i < VALUES_PER_THREAD; i++) {
        const float scaled = mul_rn(values[i], scale);
        y[i] = pos_emb ? add_rn(scaled, pos_emb[(long)positions[row] * C + c + i]) : scaled;
    }
}

} // namespace dequantize
