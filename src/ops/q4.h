// The Q4_0 block format of quantized weights (`--quantize q4_0`, model/quantize.c), and the
// dequantization of a Q8Matrix of either type (ops/ops.h gives both layouts).
//
// A Q4_0 block is llama.cpp's: 32 values, one scale d and 32 four-bit codes q in 0..15, each
// value (q - 8) * d. The scale is d = m / -8 for the block's value m of largest magnitude
// (with its sign: m becomes code 0, -8 * d), rounded to a half float as GGUF stores it; each
// code is trunc(x / d + 8.5) computed with the unrounded d, at most 15 -- gguf-py's
// gguf.quants.Q4_0 rule, so a block it quantized, dequantized and quantized again here gives
// back its own bytes (tests/test_quantize.c), and a Q4_0 GGUF runs with its own bits.
#pragma once
#include <stdint.h>

#include "ops/ops.h"

// One block of Q8_BLOCK floats into 16 bytes of codes (value j in byte j's low nibble,
// value j + 16 in its high nibble) and its scale (a half float's value, as a float).
void q4_quantize_block(const float *x, uint8_t *nibbles, float *scale);
// n floats (a multiple of Q8_BLOCK): n / 2 bytes of codes and n / Q8_BLOCK scales.
void q4_quantize_row(const float *x, long n, uint8_t *nibbles, float *scales);

// Rows [first, first + count) of a quantized matrix of any type, as floats [count, cols].
void quant_dequantize_rows(const Q8Matrix *matrix, long first, long count, float *out);
// The bytes a quantized matrix of any type holds (codes, scales, the other per-block arrays).
long quant_matrix_bytes(const Q8Matrix *matrix);
