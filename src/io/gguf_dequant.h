// Sizes of the ggml tensor types, and conversion of GGUF tensors to f32.
//
// A quantized type stores its elements in blocks of `block_size` elements taking
// `type_size` bytes each (scales plus packed integers). Converted types: F32, F16,
// BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS, MXFP4,
// NVFP4, TQ1_0, TQ2_0. Each gives results
// bit-identical to the `gguf` Python package (gguf.quants.dequantize), which
// tests/test_gguf.c checks. Other types are known by size, so that files holding
// them open, but converting one is an error.
//
// Exactness needs each multiply and add rounded on its own (no fused multiply-add);
// that is what GCC does in an ISO mode (-std=c17 implies -ffp-contract=off).
#pragma once
#include <stdbool.h>
#include <stdint.h>

#include "io/gguf.h"

typedef struct {
    const char *name; // "Q4_K"
    int block_size;   // elements per block (1 for F32, F16, ...)
    int type_size;    // bytes per block
    bool can_dequantize;
} GgmlTypeInfo;

// The sizes of type id `type`, or NULL for an id that is not a ggml type.
const GgmlTypeInfo *gguf_type_info(uint32_t type);
// "Q4_K", or "unknown".
const char *gguf_type_name(uint32_t type);

// IEEE half and bfloat16 to float (exact, NaN payloads kept).
float gguf_f16_to_f32(uint16_t h);
// IQ4_NL's and IQ4_XS's 16 levels: a 4-bit code indexes this table (non-uniform steps,
// closer together near zero where weights are dense) instead of being the value itself.
extern const int8_t gguf_iq4_levels[16];
float gguf_bf16_to_f32(uint16_t h);

// Converts `n` elements of `type` (n a multiple of its block size) stored at `src`
// (n / block_size * type_size bytes; no alignment needed) into dst[0..n).
// The type must have can_dequantize set (CHECK()ed).
void gguf_dequantize(GgmlType type, const void *src, float *dst, int64_t n);
// The eight 6-bit scales and minimums of a Q4_K (or Q5_K) super-block from its 12 packed
// bytes (the block's bytes 4-15).
void gguf_unpack_k_scales(const uint8_t *packed, int scale[8], int min[8]);

// The whole tensor into dst[0 .. t->n_elements). Returns 0, or -1 with err_set()
// naming the tensor, its type and the file if the type cannot be converted.
int gguf_tensor_to_f32(const GgufFile *f, const GgufTensor *t, float *dst);

// Rows [first_row, first_row + n_rows) of t, a row being ne[0] consecutive elements
// (e.g. the embeddings of some tokens), into dst[0 .. n_rows * ne[0]). The row range
// is CHECK()ed; errors as gguf_tensor_to_f32().
int gguf_tensor_rows_to_f32(const GgufFile *f, const GgufTensor *t, int64_t first_row, int64_t n_rows,
                            float *dst);
