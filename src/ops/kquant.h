// llama.cpp's K-quants Q4_K, Q5_K, Q6_K, Q3_K and Q2_K as weights (`--quantize q4_k_m`, model/quantize.h): a
// matrix keeps the GGUF file's own super-blocks, and the decode kernels
// (ops/cpu/matmul_kquant.c) multiply them by input rows quantized the way llama.cpp's Q8_K
// quantizes activations.
//
// Weight layouts (gguf-py's, checked bit for bit in tests/test_gguf.c through
// io/gguf_dequant.c): a row is cols / 256 super-blocks of 256 values.
//  - Q4_K, 144 bytes: half-float d and dmin, 12 bytes packing eight 6-bit scales sc[j] and
//    minimums m[j] (one per sub-block of 32), then 128 bytes of 4-bit codes q: bytes
//    [32k, 32k + 32) hold sub-block 2k in their low nibbles and 2k + 1 in their high ones.
//    Value i of sub-block j is d * sc[j] * q - dmin * m[j].
//  - Q5_K, 176 bytes: Q4_K's d, dmin and 12 scale bytes, then 32 bytes qh of fifth bits (bit j
//    of byte l: value l of sub-block j), then Q4_K's 128 bytes of low 4 bits. q in [0, 31],
//    the value d * sc[j] * q - dmin * m[j] as Q4_K's.
//  - Q6_K, 210 bytes: 128 bytes of low 4 bits, 64 bytes of high 2 bits, sixteen signed 8-bit
//    scales sc[g] (one per group of 16), half-float d. Value i is d * sc[i / 16] * (q - 32),
//    q in [0, 63]; gguf_dequant.c's block_q6_k says where q's bits sit.
//  - Q3_K, 110 bytes: 32 bytes hmask of high bits, 64 bytes of low 2 bits, 12 bytes packing
//    sixteen 6-bit scales (one per group of 16), half-float d. Value i is
//    d * (sc[i / 16] - 32) * (q - 4), q = low | high << 2 in [0, 7]: value i's low bits are
//    bits 2 * ((i % 128) / 32) of byte 32 * (i / 128) + i % 32 of the low bits, its high bit
//    bit i / 32 of hmask byte i % 32 (a clear bit is llama.cpp's "subtract 4").
//  - Q2_K, 84 bytes: sixteen bytes of 4-bit scales sc[g] (low nibble) and minimums m[g] (high
//    nibble), one pair per group of 16, 64 bytes of 2-bit codes q (placed as Q3_K's low
//    bits), half-float d and dmin. Value i is d * sc[i / 16] * q - dmin * m[i / 16].
//
// The input side (KQuantInput), llama.cpp's Q8_K idea: each row's blocks of 256 get one float
// scale max|x| / 127 and 256 int8 values x / scale rounded to nearest, plus the sum of each
// 16 of those values, which folds Q4_K's / Q5_K's / Q2_K's minimums (and Q6_K's offset of 32,
// Q3_K's of 4) into one integer
// product per sub-block instead of one per value.
#pragma once
#include <stdint.h>

#include "ops/ops.h"

#define KQ_BLOCK 256
#define KQ_Q4_K_BYTES 144
#define KQ_Q5_K_BYTES 176
#define KQ_Q6_K_BYTES 210
#define KQ_Q3_K_BYTES 110
#define KQ_Q2_K_BYTES 84

// Bytes of one row of `cols` values (a multiple of KQ_BLOCK) of a K-quant type.
long kquant_row_bytes(QuantType type, long cols);
// Whether `type` is QUANT_Q4_K, QUANT_Q5_K, QUANT_Q6_K, QUANT_Q3_K or QUANT_Q2_K.
static inline int quant_is_kquant(QuantType type) {
    return type == QUANT_Q4_K || type == QUANT_Q5_K || type == QUANT_Q6_K || type == QUANT_Q3_K ||
           type == QUANT_Q2_K;
}
// Bytes of one super-block of a K-quant type.
static inline long kquant_block_bytes(QuantType type) {
    switch (type) {
    case QUANT_Q4_K: return KQ_Q4_K_BYTES;
    case QUANT_Q5_K: return KQ_Q5_K_BYTES;
    case QUANT_Q3_K: return KQ_Q3_K_BYTES;
    case QUANT_Q2_K: return KQ_Q2_K_BYTES;
    default: return KQ_Q6_K_BYTES;
    }
}

// A K-quant matrix [rows, cols] of `type` from floats (rows contiguous, cols a multiple of
// KQ_BLOCK), with the GGUF writer's block code (io/gguf_quantize.c): the bytes
// `marlhf convert --outtype q4_k_m` writes for the same floats. Arrays from `alloc`.
void kquant_quantize_matrix(Q8Matrix *matrix, QuantType type, const float *weight, long rows, long cols,
                            void *(*alloc)(size_t));
// Rows [first, first + count) as floats [count, cols]: gguf-py's dequantization.
void kquant_dequantize_rows(const Q8Matrix *matrix, long first, long count, float *out);

// One input row quantized to Q8_K blocks: values[cols], scales[cols / 256], and
// sums[cols / 16], sums[g] = values[16g] + ... + values[16g + 15].
typedef struct {
    int8_t *values;
    float *scales;
    int16_t *sums;
} KQuantInput;
// Quantizes x[0, cols) (cols a multiple of KQ_BLOCK) into `input`, whose arrays hold cols,
// cols / 256 and cols / 16 entries. A block's largest magnitude maps to +-127; an all-zero
// block gets scale 0 and values 0.
void kquant_quantize_input(const float *x, long cols, KQuantInput *input);
