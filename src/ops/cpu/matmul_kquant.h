// Decode steps over K-quant weights (Q4_K, Q6_K; ops/kquant.h): the row dot products of
// ops/cpu/matmul_kquant.c, each vector path by name so that tests/test_kquant.c can hold
// every path to the portable loop. A path a build was not compiled for is NULL.
#pragma once
#include <stdint.h>

#include "ops/kquant.h"

// One weight row (cols / 256 super-blocks of `type`) times one quantized input row:
// the sum over super-blocks, in order, of the input block's scale times the weight block's
// integer products scaled by its own factors (Q4_K: d * sum sc*q*x - dmin * sum m*x; Q6_K:
// d * sum sc*(q-32)*x). The integer parts are exact, so every path gives the same bits.
typedef float (*KQuantRowDot)(QuantType type, const uint8_t *row, const KQuantInput *x, long cols);

float kquant_row_dot_portable(QuantType type, const uint8_t *row, const KQuantInput *x, long cols);
extern const KQuantRowDot kquant_row_dot_avx2;   // NULL without AVX2
extern const KQuantRowDot kquant_row_dot_avx512; // NULL without AVX-512 BW + VNNI
// The path cpu_matmul_kquant uses: the widest one compiled.
extern const KQuantRowDot kquant_row_dot_best;
extern const char *const kquant_best_path_name;

// out[N, OC] = inp[N, IC] . W^T (+ bias) for a K-quant W [OC, IC], each input row quantized
// to Q8_K blocks first (matmul_forward_q8 below Q8_SGEMM_MIN_ROWS rows).
void cpu_matmul_kquant(float *out, const float *inp, const Q8Matrix *weight, const float *bias, int N, int IC,
                       int OC);
