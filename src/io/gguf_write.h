// Writing GGUF v3 files (the format io/gguf.h reads): metadata key/values, then tensor
// descriptions, then the tensors' bytes, each aligned to general.alignment (32).
//
// Build the file in memory with the add functions (keys and tensors are written in the
// order added; the writer copies everything it is given), then gguf_writer_write() puts it
// on disk through the atomic file helper (io/fs.h), so a failed write leaves no file.
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "io/gguf.h"

typedef struct GgufWriter GgufWriter;

GgufWriter *gguf_writer_new(void);
void gguf_writer_free(GgufWriter *w);

void gguf_writer_add_string(GgufWriter *w, const char *key, const char *value);
void gguf_writer_add_u32(GgufWriter *w, const char *key, uint32_t value);
void gguf_writer_add_f32(GgufWriter *w, const char *key, float value);
void gguf_writer_add_bool(GgufWriter *w, const char *key, bool value);
// An array of `count` strings; lengths may be NULL (NUL-terminated strings).
void gguf_writer_add_string_array(GgufWriter *w, const char *key, const char *const *strings, const size_t *lengths,
                                  uint64_t count);
void gguf_writer_add_i32_array(GgufWriter *w, const char *key, const int32_t *values, uint64_t count);
void gguf_writer_add_f32_array(GgufWriter *w, const char *key, const float *values, uint64_t count);

// A tensor of n_dims dimensions, ne[0] the contiguous one (ggml's order: a row-major
// [rows, cols] matrix is ne = {cols, rows}), from f32 values converted to `type`: F32, F16
// or a type of io/gguf_quantize.h (Q8_0, Q4_0, Q5_0: blocks of 32 along ne[0]; Q4_K, Q6_K:
// 256), whose block size must divide ne[0].
void gguf_writer_add_tensor(GgufWriter *w, const char *name, GgmlType type, int n_dims, const int64_t *ne,
                            const float *values);

// IEEE binary16 of a float, rounded to nearest, ties to even.
uint16_t gguf_f32_to_f16(float value);

// Writes the file. Returns 0, or -1 with err_set() naming the path.
int gguf_writer_write(const GgufWriter *w, const char *path);
