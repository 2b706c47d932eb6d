// Decode steps over Q5_0 weights (ops/q5.h: a Q4_K_M file's rows that 256 does not divide),
// Q4_0 (--quantize q4_0, a Q4_0 GGUF), Q5_1 (a Q5_K_M file's), Q4_1 (--quantize q4_1) and
// IQ4_NL (an IQ4_NL or IQ4_XS GGUF): the weight rows' 5- or 4-bit codes times Q8_0-quantized
// input rows, without widening the codes to an int8 copy first. Each vector path is named so
// that tests/test_kquant.c and tests/test_iq4_nl.c can hold every one to the portable loop;
// a path a build was not compiled for is NULL.
#pragma once
#include <stdint.h>

#include "ops/ops.h"

// A kernel call covers up to Q5_ROWS weight rows against up to Q5_INPUTS input rows: the
// weight rows' integer block sums are reduced together, and their float sums run side by
// side in vector lanes; each block's codes are decoded once (into registers) for all the
// input rows.
#define Q5_ROWS 8
#define Q5_INPUTS 4

// One input row quantized as Q8_0 (ops/q8.h: values[cols], scales[cols / 32]), plus each
// block's sum of values, sums[cols / 32] (Q5_0's offset of 16 is folded in through it), and
// for Q5_1 / Q4_1 weights min_terms[cols / 32], each block's scale * (float)sum, which the
// weight block's minimum multiplies (NULL for Q5_0).
typedef struct {
    const int8_t *values;
    const float *scales;
    const int32_t *sums;
    const float *min_terms;
} Q5Input;
// For Q5_1 / Q4_1 weights, a Q8_0 row's scales and sums made llama.cpp's Q8_1 (the activation
// type of its Q4_1 / Q5_1 products): min_terms[b] = half(scales[b] * sums[b]), then scales[b]
// rounded to a half float too, each as the half float's value.
void q5_input_q8_1(float *scales, const int32_t *sums, long blocks, float *min_terms);

// out[i * out_stride + k] for k < count (1 <= count <= Q5_ROWS) and i < inputs (1 <= inputs
// <= Q5_INPUTS) = weight row first + k times input row x[i], the sum over the blocks b in
// order of, for Q5_0 (and Q4_0 with an offset of 8 for 16),
//     (float)dot_b * (x[i].scales[b] * weight scale of block b),  dot_b = sum_j (q_j - 16) * x_j,
// and for Q5_1 and Q4_1 (q_j unsigned, no offset)
//     (float)dot_b * (x[i].scales[b] * weight scale) + x[i].min_terms[b] * weight min,  dot_b = sum_j q_j * x_j,
// one float addition after another (the portable loop of matmul_q8.c's Q8_0 kernel). dot_b
// is exact in every path and the float steps are the same operations in the same order, so
// every path gives the same bits, whatever count and inputs are (an output does not depend
// on the rows beside it in the call).
typedef void (*Q5RowsDot)(const Q8Matrix *weight, long first, int count, const Q5Input *x, int inputs, float *out,
                          long out_stride);

// Every path takes the five weight types (weight->type says which). IQ4_NL: as Q5_0 with each
// q_j - 16 replaced by the level of its nibble, gguf_iq4_levels[q_j] (no minimum).
void q5_rows_dot_portable(const Q8Matrix *weight, long first, int count, const Q5Input *x, int inputs, float *out,
                          long out_stride);
extern const Q5RowsDot q5_rows_dot_avx2;   // NULL without AVX2
extern const Q5RowsDot q5_rows_dot_avx512; // NULL without AVX-512 BW + VNNI
// The path cpu_matmul_q5 uses: the widest one compiled.
extern const Q5RowsDot q5_rows_dot_best;
extern const char *const q5_best_path_name;

// Whether cpu_matmul_q5 takes weights of `type`.
static inline bool cpu_matmul_q5_takes(QuantType type) {
    return type == QUANT_Q5_0 || type == QUANT_Q4_0 || type == QUANT_Q5_1 || type == QUANT_Q4_1 || type == QUANT_IQ4_NL;
}

// out[N, OC] = inp[N, IC] . W^T (+ bias) for a W [OC, IC] of those types, each input row quantized to
// Q8_0 blocks first (matmul_forward_q8 below Q8_SGEMM_MIN_ROWS rows). The threads take whole
// groups of Q5_ROWS output rows, as evenly as they divide, and each group takes the input
// rows Q5_INPUTS at a time.
void cpu_matmul_q5(float *out, const float *inp, const Q8Matrix *weight, const float *bias, int N, int IC, int OC);
