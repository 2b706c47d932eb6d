// GGUF's blocks of 32 with 4- or 5-bit codes held as weights (ops/ops.h):
//  - QUANT_Q5_0: the type llama.cpp's Q4_K_M mix falls back to for a matrix whose rows
//    super-blocks of 256 do not divide (SmolLM2's rows of 576), run with the file's own bits
//    under --quantize q4_k_m (model/quantize.c). A block is 32 values (q - 16) * d, q in
//    [0, 31]: its low 4 bits as Q4_0's nibbles (value j in byte j's low nibble, j + 16 in its
//    high one), its fifth bits in a 32-bit word (bit j for value j), d a half float held as a
//    float.
//  - QUANT_Q5_1 (the Q5_K_M mix's fallback; --quantize q5_1) and QUANT_Q4_1 (--quantize q4_1, the
//    type of the README's SmolLM2 file): 32 values d * q + m, q unsigned in [0, 31] (Q5_1, the
//    fifth bits as Q5_0's) or [0, 15] (Q4_1, the nibbles alone), d and m half floats held as
//    floats (scales, mins). Held split as Q5_0 is, and for the same reason: the kernels read
//    the codes of consecutive blocks as one run and the float factors as arrays of their own,
//    which vector loads take as they are (a half float would be converted at every block).
// Decode steps multiply the codes where they are (ops/cpu/matmul_q5.c); prefills, training and
// the token-table lookup take the dequantized rows below.
#pragma once
#include <stdint.h>

#include "ops/ops.h"

// Rows [first, first + count) as floats [count, cols].
void q5_0_dequantize_rows(const Q8Matrix *matrix, long first, long count, float *out);
// The same for a QUANT_Q4_1 or QUANT_Q5_1 matrix: each value d * (float)q + m, the float
// arithmetic of io/gguf_dequant.c's readers (gguf-py's), so that the held matrix dequantizes
// to the float load of the file bit for bit.
void q4_1_q5_1_dequantize_rows(const Q8Matrix *matrix, long first, long count, float *out);
