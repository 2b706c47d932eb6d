// GGUF's Q5_0 blocks held as weights (ops/ops.h QUANT_Q5_0): the type llama.cpp's Q4_K_M mix
// falls back to for a matrix whose rows super-blocks of 256 do not divide (SmolLM2's rows of
// 576), run with the file's own bits under --quantize q4_k_m (model/quantize.c). A block is 32
// values (q - 16) * d, q in [0, 31]: its low 4 bits as Q4_0's nibbles (value j in byte j's low
// nibble, j + 16 in its high one), its fifth bits in a 32-bit word (bit j for value j), d a
// half float held as a float. Decode steps multiply the codes where they are
// (ops/cpu/matmul_q5.c); prefills and training take the dequantized rows below.
#pragma once
#include <stdint.h>

#include "ops/ops.h"

// Rows [first, first + count) as floats [count, cols].
void q5_0_dequantize_rows(const Q8Matrix *matrix, long first, long count, float *out);
