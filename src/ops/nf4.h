// NF4 (`--quantize nf4`, `--quantize nf4-single`): QLoRA's 4-bit NormalFloat, as bitsandbytes
// stores it (bitsandbytes.functional.quantize_4bit(quant_type="nf4", blocksize=64)), and its
// double quantization of the block scales (compress_statistics=True, what transformers calls
// bnb_4bit_use_double_quant).
//
// A tensor of n values, flattened, is cut into blocks of NF4_BLOCK (the last one shorter when
// n is not a multiple). Each block keeps its absmax m = max |x| as a float, and each value
// the index q of the nearest of the 16 NF4 levels to x / m (bitsandbytes' rounding: x times
// the float reciprocal 1 / max(m, 1e-38) for a whole block, x / m for a shorter last one,
// clamped to [-1, 1]; a value exactly halfway between two levels, as float32 computes the
// midpoint, takes the lower one). Its value is level[q] * m. Two codes a byte: value 2i in
// byte i's high nibble, value 2i + 1 in its low one (an odd count pads the last low nibble
// with the code of 0.0, 7).
//
// Double quantization: the blocks' absmax values, flattened over the whole tensor, less
// their mean (the offset), are quantized in blocks of NF4_SCALE_BLOCK to 8-bit codes of
// bitsandbytes' signed dynamic map (create_dynamic_map(): 256 values in [-1, 1], finer near
// 0) with a float absmax per block of scales (nearest map value to s / absmax, ties to the
// lower, as bitsandbytes' torch kernel rounds; its CPU C kernel, which quantize_4bit calls on
// the CPU, misses the nearest value for some inputs, mostly tiny ones: docs/quantization.md);
// a block's scale is then map[code] * absmax2 + offset, in float (0.127 bits a weight for the
// scales instead of 0.5).
//
// The offset: bitsandbytes takes torch's float32 mean, whose summation order is torch's
// (vector width, threads; CUDA's on a GPU), so its last bit is the platform's; marlhf sums
// in double and rounds once (tests/test_quantize.c measures the difference against
// bitsandbytes': given bitsandbytes' offset, every code and every value is its own).
#pragma once
#include <stdint.h>

#include "ops/ops.h"

#define NF4_BLOCK 64
#define NF4_SCALE_BLOCK 256

// The 16 NF4 levels, ascending (bitsandbytes' get_4bit_type("nf4")): index 7 is 0.0.
extern const float nf4_levels[16];
// bitsandbytes' FP4 code book (get_4bit_type("fp4")): 1 sign bit, 2 exponent bits, 1 mantissa
// bit, in bit-pattern order (not ascending), divided by its largest magnitude 12 in float32.
// Matrices of a bitsandbytes FP4 checkpoint (model/bnb_checkpoint.h) take it as their
// `levels`; the kernels look a code up in it as in nf4_levels. marlhf does not quantize to it.
extern const float fp4_levels[16];
// A QUANT_NF4 matrix's code book: its `levels`, or nf4_levels.
static inline const float *quant_levels(const Q8Matrix *matrix) { return matrix->levels ? matrix->levels : nf4_levels; }

// bitsandbytes' create_dynamic_map() (signed, 7 exponent bits, 8 bits): 256 ascending floats,
// built here as bitsandbytes builds them (torch's float32 linspace and products).
const float *nf4_dynamic_map(void);

// The NF4 code of v = x / absmax (clamped to [-1, 1]): index of the nearest level, ties lower.
int nf4_code(float v);

// n values (any n) into (n + 1) / 2 bytes and ceil(n / NF4_BLOCK) absmax values.
void nf4_quantize(const float *x, long n, uint8_t *packed, float *absmax);
// The inverse: out[i] = level[code i] * absmax[i / NF4_BLOCK].
void nf4_dequantize(const uint8_t *packed, const float *absmax, long n, float *out);

// The mean of `count` absmax values (summed in double, rounded once to float).
float nf4_scales_offset(const float *absmax, long count);
// Double quantization of `count` absmax values with the given offset: count codes and
// ceil(count / NF4_SCALE_BLOCK) second-level absmax values.
void nf4_double_quantize(const float *absmax, long count, float offset, uint8_t *codes, float *absmax2);
// The scales back: scales[k] = map[codes[k]] * absmax2[k / NF4_SCALE_BLOCK] + offset.
void nf4_double_dequantize(const uint8_t *codes, const float *absmax2, float offset, long count, float *scales);

// A Q8Matrix of type QUANT_NF4 (ops/ops.h) from a float [rows, cols] matrix, cols a multiple
// of NF4_BLOCK: its nibbles, and its scales either as floats (double_quant false) or as codes,
// second-level absmax values and an offset. The arrays are allocated with `alloc`.
void nf4_quantize_matrix(Q8Matrix *matrix, const float *weight, long rows, long cols, int double_quant,
                         void *(*alloc)(size_t));
// The block scales of rows [first, first + count) of an NF4 matrix: count * cols / NF4_BLOCK floats.
void nf4_row_scales(const Q8Matrix *matrix, long first, long count, float *scales);
// Rows [first, first + count) of an NF4 matrix as floats [count, cols].
void nf4_dequantize_rows(const Q8Matrix *matrix, long first, long count, float *out);
// Bytes an NF4 matrix takes (codes and scales), for the docs and the tests.
long nf4_matrix_bytes(const Q8Matrix *matrix);
