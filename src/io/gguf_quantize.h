// Quantizing f32 values into ggml's block formats, the inverse of io/gguf_dequant.c's
// readers (whose comments describe each layout): Q8_0, Q4_0, Q5_0, Q4_1, Q5_1, IQ4_NL (blocks of 32)
// and the K-quants Q2_K-Q6_K and IQ4_XS (super-blocks of 256). Used by the GGUF writer (io/gguf_write.h) for
// `marlhf convert OUT.gguf --outtype q8_0|q4_0|q4_1|q5_0|q5_1|iq4_nl|iq4_xs|q2_k|q3_k_m|q4_k_m|q5_k_m`, and by `--quantize q4_1|q5_1`
// on a float model (model/quantize.c).
//
// The scales are chosen as llama.cpp's reference quantizers choose them in spirit (the
// code is this project's own): Q8_0, Q4_0, Q5_0 and Q6_K from each block's largest
// magnitude; IQ4_NL from it too, then a least-squares fit of the scale to the chosen levels
// (llama.cpp's IQ4_NL quantizer searches more scales, with an importance weighting: its
// blocks are not these bytes); IQ4_XS's sub-blocks as IQ4_NL's blocks, their scales then
// quantized to 6 bits against the super-block's f16 factor; Q3_K's signed sub-block scales
// by a search of starts and least-squares refits, Q2_K's scale and minimum as Q4_K's; Q4_1 and Q5_1 from each block's smallest and largest values; Q4_K and Q5_K per sub-block
// of 32 by a small search over candidate scales with a least-squares fit of scale and minimum, then the 6-bit sub-block scales and minimums
// quantized against the super-block's two f16 factors.
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "io/gguf.h"

// Whether gguf_quantize writes `type`.
bool gguf_can_quantize(GgmlType type);
// Bytes of n values of `type` (n a multiple of its block size).
size_t gguf_quantized_size(GgmlType type, int64_t n);
// Writes n values (a multiple of the type's block size) as `type` into out.
void gguf_quantize(GgmlType type, const float *x, void *out, int64_t n);
