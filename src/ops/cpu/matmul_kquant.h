// Decode steps over K-quant weights (Q4_K, Q5_K, Q6_K, Q3_K, Q2_K; ops/kquant.h): the row dot products of
// ops/cpu/matmul_kquant.c, each vector path by name so that tests/test_kquant.c can hold
// every path to the portable loop. A path a build was not compiled for is NULL.
#pragma once
#include <stdint.h>

#include "ops/kquant.h"

// A kernel call covers one weight row against up to KQ_INPUT_ROWS input rows: each
// super-block's scales and codes are decoded once and multiplied by every input row.
#define KQ_INPUT_ROWS 4

// out[i] for i < count (1 <= count <= KQ_INPUT_ROWS) = one weight row (cols / 256
// super-blocks of `type`) times the quantized input row x[i]: the sum over super-blocks, in
// order, of the input block's scale times the weight block's integer products scaled by its
// own factors (Q4_K, Q5_K, Q2_K: d * sum sc*q*x - dmin * sum m*x; Q6_K: d * sum sc*(q-32)*x;
// Q3_K: d * sum sc*(q-4)*x). The integer
// parts are exact and the float steps of each input row are the same operations in the same
// order whatever `count` is, so every path gives the same bits, and so does every count (an
// input row's output does not depend on the rows beside it in the call).
typedef void (*KQuantRowsDot)(QuantType type, const uint8_t *row, const KQuantInput *x, int count, long cols,
                              float *out);

void kquant_rows_dot_portable(QuantType type, const uint8_t *row, const KQuantInput *x, int count, long cols,
                              float *out);
extern const KQuantRowsDot kquant_rows_dot_avx2;   // NULL without AVX2
extern const KQuantRowsDot kquant_rows_dot_avx512; // NULL without AVX-512 BW + VNNI
// The path cpu_matmul_kquant uses: the widest one compiled.
extern const KQuantRowsDot kquant_rows_dot_best;
extern const char *const kquant_best_path_name;

// out[N, OC] = inp[N, IC] . W^T (+ bias) for a K-quant W [OC, IC], each input row quantized
// to Q8_K blocks first (matmul_forward_q8 below Q8_SGEMM_MIN_ROWS rows). The threads take
// weight rows; each takes its input rows KQ_INPUT_ROWS at a time.
void cpu_matmul_kquant(float *out, const float *inp, const Q8Matrix *weight, const float *bias, int N, int IC,
                       int OC);
