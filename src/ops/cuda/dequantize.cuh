// Quantized weights (ops/ops.h Q8Matrix: every QuantType -- Q8_0, Q4_0, Q5_0, Q4_1, Q5_1, NF4
// with float or double-quantized scales, a bitsandbytes FP4 code book, llama.cpp's K-quants
// Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL (its levels as NF4's code book), and bf16) turned back into numbers on the GPU: rows of a matrix into a
// bf16 tile for cuBLASLt (matmul_quantized.cu), and the quantized token table's rows into fp32 embeddings. The GPU
// keeps the weights quantized in its memory; a product with a quantized weight dequantizes it
// a tile at a time and multiplies in bf16 as the float model does (a decode step of a few rows
// reads the blocks directly instead: matvec_quantized.cuh).
//
// Each value is the CPU's (ops/q4.c quant_dequantize_rows, ops/nf4.c, ops/q5.c, and for the
// K-quants io/gguf_dequant.c, gguf-py's order; Q4_1, Q5_1: ops/q5.c) to the bit before the bf16 rounding: the same
// float products in the same order, each rounded on its own (mul_rn / add_rn: nvcc would fuse
// a product and a sum into one FMA) -- the double-quantized NF4 scale map[code] * absmax2 +
// offset, Q4_K's, Q5_K's and Q2_K's (d * scale) * q - dmin * min, Q4_1's and Q5_1's d * q + m.
// tests/test_dequantize_emulated.cpp checks that on CPU threads (device_primitives.cuh, cpu_emulation.h); tests/gpu/test_cuda.c on the device.
//
// A thread decodes 8 consecutive values of the flattened matrix (its row r, columns
// [c, c + 8), c a multiple of 8): they lie in one block (32 or 64 values; for the K-quants
// one sub-block of 16 or 32 of a super-block of 256) and in 8 (Q8_0) or 4 (the 4-bit codes)
// bytes, so every thread does one block's scale and a few loads. A K-quant matrix's rows are
// whole super-blocks one after another, so value i of the flattened matrix is in super-block
// i / 256.
#pragma once
#include <stdint.h>

#include "ops/cuda/device_primitives.cuh"
extern "C" {
#include "io/gguf_dequant.h"
#include "ops/kquant.h"
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
    if (matrix->type == QUANT_IQ4_NL)
        for (int i = 0; i < 16; i++) w.book.levels[i] = (float)gguf_iq4_levels[i];
    return w;
}

// The scale of block k of the flattened matrix (32 values for Q8_0 and Q4_0, 64 for NF4).
DEVICE_INLINE float block_scale(const Weights &w, long k) {
    if (w.matrix.scales) return w.matrix.scales[k];
    const float scaled = mul_rn(w.dynamic_map[w.matrix.scale_codes[k]], w.matrix.scale_absmax[k / NF4_SCALE_BLOCK]);
    return add_rn(scaled, w.matrix.scale_offset);
}

// A little-endian half float at p (any alignment) as a float, exactly (io/gguf_dequant.c's
// gguf_f16_to_f32).
DEVICE_INLINE float half_at(const uint8_t *p) { return half_to_float((uint16_t)(p[0] | p[1] << 8)); }

// Q4_K and Q5_K (ops/kquant.h): values [i, i + 8) of the super-block at `block`, i a multiple
// of 8. Both begin with d, dmin (half floats) and 12 bytes of packed scales: sub-block j = i / 32
// has a 6-bit scale and minimum (gguf_unpack_k_scales' packing: j < 4 in the low 6 bits of bytes
// j and j + 4, j >= 4 in the nibbles of byte j + 4 and the top 2 bits of bytes j - 4 and j). The
// low 4 bits of sub-block j's codes are nibble j % 2 of bytes [32 (j / 2), 32 (j / 2) + 32) of
// the codes (Q4_K: at byte 16; Q5_K: at byte 48, after 32 bytes whose byte l holds in bit j the
// fifth bit of value 32 j + l).
DEVICE_INLINE void decode8_q4_k_q5_k(const uint8_t *block, int i, bool fifth_bits, float out[VALUES_PER_THREAD]) {
    const float d = half_at(block), dmin = half_at(block + 2);
    const uint8_t *packed = block + 4;
    const int sub = i / 32;
    int scale, min;
    if (sub < 4) {
        scale = packed[sub] & 0x3f;
        min = packed[sub + 4] & 0x3f;
    } else {
        scale = (packed[sub + 4] & 0x0f) | ((packed[sub - 4] >> 2) & 0x30);
        min = (packed[sub + 4] >> 4) | ((packed[sub] >> 2) & 0x30);
    }
    const float dl = mul_rn(d, (float)scale), ml = mul_rn(dmin, (float)min);
    const uint8_t *codes = block + (fifth_bits ? 48 : 16) + (sub / 2) * 32 + i % 32;
    const uint8_t *high = block + 16 + i % 32; // Q5_K only
    const int shift = 4 * (sub % 2);
    for (int k = 0; k < VALUES_PER_THREAD; k++) {
        const int q = ((codes[k] >> shift) & 0x0f) | (fifth_bits ? ((high[k] >> sub) & 1) << 4 : 0);
        out[k] = add_rn(mul_rn(dl, (float)q), -ml);
    }
}

// Q3_K: values [i, i + 8) of the super-block at `block`. Each 128 values (half h = i / 128)
// take their low 2 bits from 32 bytes at 32 + 32 h, value 32 s + l of the half in bits 2 s of
// byte l; byte l of the first 32 bytes holds in bit b the "high bit" of value 32 b + l, and a
// clear one subtracts 4. Each 16 values have a signed 6-bit scale (offset by 32; the low 4 bits
// in a nibble of bytes 96..103, the high 2 in bytes 104..107), the block a half-float d at 108.
DEVICE_INLINE void decode8_q3_k(const uint8_t *block, int i, float out[VALUES_PER_THREAD]) {
    const uint8_t *packed = block + 96;
    const int group = i / 16; // the 8 values share one scale
    const int low_scale = group < 8 ? packed[group] & 0x0f : packed[group - 8] >> 4;
    const int high_scale = (packed[8 + group % 4] >> (2 * (group / 4))) & 3;
    const float dl = mul_rn(half_at(block + 108), (float)((low_scale | high_scale << 4) - 32));
    const int half = i / 128, shift = 2 * ((i % 128) / 32);
    const uint8_t *low = block + 32 + half * 32 + i % 32, *high = block + i % 32;
    for (int k = 0; k < VALUES_PER_THREAD; k++) {
        const int q = ((low[k] >> shift) & 3) - (((high[k] >> (i / 32)) & 1) ? 0 : 4);
        out[k] = mul_rn(dl, (float)q);
    }
}

// Q2_K: values [i, i + 8) of the super-block at `block`: 16 bytes of scales (each 16 values'
// 4-bit scale in the low nibble, 4-bit minimum in the high one), then the 2-bit codes laid out
// as Q3_K's low bits (at byte 16), then d and dmin (half floats at 80 and 82).
DEVICE_INLINE void decode8_q2_k(const uint8_t *block, int i, float out[VALUES_PER_THREAD]) {
    const int scales = block[i / 16];
    const float dl = mul_rn(half_at(block + 80), (float)(scales & 0x0f));
    const float ml = mul_rn(half_at(block + 82), (float)(scales >> 4));
    const int half = i / 128, shift = 2 * ((i % 128) / 32);
    const uint8_t *codes = block + 16 + half * 32 + i % 32;
    for (int k = 0; k < VALUES_PER_THREAD; k++) out[k] = add_rn(mul_rn(dl, (float)((codes[k] >> shift) & 3)), -ml);
}

// Q6_K: values [i, i + 8) of the super-block at `block`: in half h = i / 128 (r = i % 128) the
// low 4 bits are nibble r / 64 of byte 64 h + r % 64, the high 2 bits bits 2 (r / 32) of byte
// 128 + 32 h + r % 32; each 16 values have a signed 8-bit scale, the block a half-float d.
DEVICE_INLINE void decode8_q6_k(const uint8_t *block, int i, float out[VALUES_PER_THREAD]) {
    const int half = i / 128, r = i % 128;
    const float dl = mul_rn(half_at(block + 208), (float)(int8_t)block[192 + i / 16]);
    const uint8_t *low = block + half * 64 + r % 64, *high = block + 128 + half * 32 + r % 32;
    const int low_shift = 4 * (r / 64), high_shift = 2 * (r / 32);
    for (int k = 0; k < VALUES_PER_THREAD; k++) {
        const int q = ((low[k] >> low_shift) & 0x0f) | ((high[k] >> high_shift) & 3) << 4;
        out[k] = mul_rn(dl, (float)(q - 32));
    }
}

// Blocks of 32 with a 4-bit nibble per value (Q4_0, Q5_0, Q4_1, Q5_1): block `block`'s bytes
// hold value j in the low nibble of byte j and value j + 16 in the high one. The codes of values
// [within, within + 8) of the block (within a multiple of 8), with the block's fifth bits when
// fifth_bits says so (Q5_0, Q5_1: high_bits[block], bit j value j's fifth bit).
DEVICE_INLINE void block32_codes(const Q8Matrix &m, long block, int within, bool fifth_bits,
                                 int codes[VALUES_PER_THREAD]) {
    const uint8_t *bytes = m.nibbles + block * (Q8_BLOCK / 2) + within % (Q8_BLOCK / 2);
    const int shift = within >= Q8_BLOCK / 2 ? 4 : 0;
    const uint32_t fifth = fifth_bits ? m.high_bits[block] >> within : 0;
    for (int i = 0; i < VALUES_PER_THREAD; i++) codes[i] = ((bytes[i] >> shift) & 0x0f) | (int)((fifth >> i) & 1) << 4;
}

// Values [index, index + 8) of the flattened matrix, index a multiple of 8. A switch over every
// QuantType with no default: a new type is an error here in the emulated build (g++ -Werror,
// -Wswitch; checked 2026-12-06), though nvcc does not warn.
DEVICE_INLINE void decode8(const Weights &w, long index, float out[VALUES_PER_THREAD]) {
    const Q8Matrix &m = w.matrix;
    const long block = index / Q8_BLOCK; // for the types in blocks of 32
    const int within = (int)(index % Q8_BLOCK);
    int codes[VALUES_PER_THREAD];
    switch (m.type) {
    case QUANT_Q4_K:
    case QUANT_Q5_K: {
        const long bytes = m.type == QUANT_Q4_K ? KQ_Q4_K_BYTES : KQ_Q5_K_BYTES;
        decode8_q4_k_q5_k(m.blocks + index / KQ_BLOCK * bytes, (int)(index % KQ_BLOCK), m.type == QUANT_Q5_K, out);
        return;
    }
    case QUANT_Q6_K: decode8_q6_k(m.blocks + index / KQ_BLOCK * KQ_Q6_K_BYTES, (int)(index % KQ_BLOCK), out); return;
    case QUANT_Q3_K: decode8_q3_k(m.blocks + index / KQ_BLOCK * KQ_Q3_K_BYTES, (int)(index % KQ_BLOCK), out); return;
    case QUANT_Q2_K: decode8_q2_k(m.blocks + index / KQ_BLOCK * KQ_Q2_K_BYTES, (int)(index % KQ_BLOCK), out); return;
    case QUANT_Q5_0: { // value = (code - 16) * scale
        block32_codes(m, block, within, true, codes);
        const float scale = m.scales[block];
        for (int i = 0; i < VALUES_PER_THREAD; i++) out[i] = mul_rn((float)(codes[i] - 16), scale);
        return;
    }
    case QUANT_Q4_1:
    case QUANT_Q5_1: { // value = scale * code + min, the code unsigned
        block32_codes(m, block, within, m.type == QUANT_Q5_1, codes);
        const float scale = m.scales[block], min = m.mins[block];
        for (int i = 0; i < VALUES_PER_THREAD; i++) out[i] = add_rn(mul_rn(scale, (float)codes[i]), min);
        return;
    }
    case QUANT_Q4_0: { // value = (code - 8) * scale
        block32_codes(m, block, within, false, codes);
        const float scale = block_scale(w, block);
        for (int i = 0; i < VALUES_PER_THREAD; i++) out[i] = (float)(codes[i] - 8) * scale;
        return;
    }
    case QUANT_IQ4_NL: { // value = scale * level[code], as gguf_dequantize computes it
        block32_codes(m, block, within, false, codes);
        const float scale = m.scales[block];
        for (int i = 0; i < VALUES_PER_THREAD; i++) out[i] = mul_rn(scale, w.book.levels[codes[i]]);
        return;
    }
    case QUANT_Q8_0: {
        const float scale = block_scale(w, block);
        const int8_t *values = m.values + index;
        for (int i = 0; i < VALUES_PER_THREAD; i++) out[i] = (float)values[i] * scale;
        return;
    }
    case QUANT_BF16: // the values themselves, 16 bytes (index a multiple of 8, the array 256-byte aligned)
        load_bf16x8(out, reinterpret_cast<const bf16 *>(m.bf16 + index));
        return;
    case QUANT_NF4: { // (or bitsandbytes FP4: another code book)
        // Byte j holds value 2j in its high nibble and value 2j + 1 in its low one.
        const float scale = block_scale(w, index / NF4_BLOCK);
        const uint8_t *bytes = m.nibbles + index / 2;
        for (int i = 0; i < VALUES_PER_THREAD / 2; i++) {
            out[2 * i] = w.book.levels[bytes[i] >> 4] * scale;
            out[2 * i + 1] = w.book.levels[bytes[i] & 0x0F] * scale;
        }
        return;
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

// out[rows, cols] = rows [first_row, first_row + rows) of the matrix as floats (DoRA's row
// norms over a quantized base). Grid: rows_blocks(rows, cols) blocks of THREADS.
static __global__ void __launch_bounds__(THREADS) float_rows_kernel(float *out, Weights w, long first_row, int rows) {
    const long unit = (long)blockIdx.x * THREADS + threadIdx.x;
    if (unit >= rows_threads(rows, w.matrix.cols)) return;
    decode8(w, first_row * w.matrix.cols + unit * VALUES_PER_THREAD, out + unit * VALUES_PER_THREAD);
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
