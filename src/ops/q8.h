// The Q8_0 block format shared by the weight quantizer (model/quantize.c) and the kernels
// that quantize their input rows on the fly (ops/cpu/matmul_q8.c).
#pragma once
#include <stdint.h>

#include "ops/ops.h"

// Quantizes n floats (n a multiple of Q8_BLOCK) into n int8 values and n / Q8_BLOCK scales
// as GGUF's Q8_0 does: each block's scale is max|x| / 127 and each value x / scale rounded to the nearest integer,
// so a block's largest value maps to +-127 and a dequantized Q8_0 block quantizes back to
// the same values and scale.
void q8_quantize_row(const float *x, long n, int8_t *values, float *scales);
// One block of n <= Q8_BLOCK floats, the same way (a KV cache's last block of a head
// whose head_dim is not a multiple of Q8_BLOCK is shorter).
void q8_quantize_block(const float *x, int n, int8_t *values, float *scale);

// A matmul_forward_q8 with at least this many input rows multiplies the float inputs by
// dequantized weights (sgemm); with fewer, quantized inputs by the 8-bit weights (integer
// dot products). bench/matmul_q8 on SmolLM2's shapes: below ~32 rows the integer kernel beats
// float32 sgemm; from 64 rows the dequantized tiles come within 6-14% of it.
#define Q8_SGEMM_MIN_ROWS 64
