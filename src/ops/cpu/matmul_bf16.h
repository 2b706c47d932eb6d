// Decode steps over bf16 weights (ops.h QUANT_BF16, --quantize bf16): fewer than
// Q8_SGEMM_MIN_ROWS float input rows times a weight matrix held as bfloat16 (core/bf16.h).
#pragma once
#include "ops/ops.h"

// out[i * out_stride] = inp row i [IC] . weight row `row` for i in [0, inputs), inputs <=
// BF16_INPUTS, IC a multiple of BF16_LANES. Every path computes the same sum in the same
// order, so they give the same bits: lane l (of BF16_LANES) adds x[c] w[c] for c = l, l + 32,
// l + 64, ... as fused multiply-adds, column after column, then the lanes are added in halves
// (l + 16 into l, then l + 8, 4, 2, 1). An output depends only on its input row and weight
// row, never on the rows beside it in the call.
enum { BF16_LANES = 32, BF16_INPUTS = 4 };
typedef void (*Bf16RowDot)(const uint16_t *row, const float *inp, int inputs, long IC, float *out, long out_stride);

void bf16_row_dot_portable(const uint16_t *row, const float *inp, int inputs, long IC, float *out, long out_stride);
extern const Bf16RowDot bf16_row_dot_avx2;   // NULL without AVX2 and FMA
extern const Bf16RowDot bf16_row_dot_avx512; // NULL without AVX-512 F
// The path cpu_matmul_bf16 uses: the widest one compiled.
extern const Bf16RowDot bf16_row_dot_best;
extern const char *const bf16_best_path_name;

// out[N, OC] = inp[N, IC] . W^T (+ bias) for a QUANT_BF16 W [OC, IC]: the threads take whole
// weight rows, each row its input rows BF16_INPUTS at a time.
void cpu_matmul_bf16(float *out, const float *inp, const Q8Matrix *weight, const float *bias, int N, int IC, int OC);
