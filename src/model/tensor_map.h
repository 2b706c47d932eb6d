// Where each parameter of the table (model/params.h) sits in a Hugging Face or GGUF file,
// and how it is transformed between the file's layout and the table's: GPT-2's Conv1D
// weights are transposed and its q/k/v fused, llama.cpp permutes Llama's q/k rows and
// stores Gemma's norms as 1 + w. Used by model/weights_io.c in both directions.
#pragma once
#include "model/config.h"
#include "model/params.h"

typedef enum {
    MAP_COPY,
    MAP_TRANSPOSE,              // source [cols, rows] (GPT-2 Conv1D)
    MAP_ROW_SLICE,              // rows [part*rows, (part+1)*rows) of the source (1-D: elements)
    MAP_TRANSPOSED_COLUMN_SLICE, // GPT-2 c_attn: source [in, parts*out], take columns of `part`
    MAP_UNPERMUTE_ROPE,         // llama.cpp's interleaved q/k row order back to HF's halves
    MAP_MINUS_ONE,              // GGUF Gemma norms store 1 + w
} MapKind;

typedef struct {
    char source[160];
    MapKind kind;
    int ndim;
    long long shape[2]; // the source tensor's shape
    int part, parts;
    int heads;
} TensorMap;


void tensor_map_set_shape(TensorMap *map, long long rows, long long cols);
// The tensor of a GGUF file (llama.cpp's names and layouts) that holds entry `e`.
void tensor_map_gguf(const ModelConfig *cfg, const ParamEntry *e, TensorMap *map);
// The tensor of a Hugging Face safetensors file that holds `e` (GPT-2 files are prefixed
// with gpt2_prefix, "transformer." or "").
void tensor_map_hf(const ModelConfig *cfg, const ParamEntry *e, const char *gpt2_prefix, TensorMap *map);
// Elements of the file's tensor.
long long tensor_map_numel(const TensorMap *map);
// The row of the file tensor that holds row r of entry `e` (a 2-D entry), for the maps that
// move whole rows (copy, a slice of rows, the q/k row permutation); -1 for the others. How a
// quantized matrix takes the file's own row bytes (model/quantize.c).
long tensor_map_file_row(const TensorMap *map, const ParamEntry *e, long r);
// File layout -> table layout: `in` is the whole file tensor, `out` the entry's e->numel floats.
void tensor_map_load(const TensorMap *map, const ParamEntry *e, const float *in, float *out);
// Table layout -> file layout, the inverse of tensor_map_load: writes the entry's part of
// the file tensor `out` (tensor_map_numel floats; a fused tensor gets one part per call).
void tensor_map_store(const TensorMap *map, const ParamEntry *e, const float *in, float *out);
