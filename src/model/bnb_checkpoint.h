// Checkpoints that bitsandbytes already quantized: what transformers' save_pretrained writes
// for a model loaded with BitsAndBytesConfig(load_in_4bit=True, ...) (the "-bnb-4bit" repos
// QLoRA starts from) or load_in_8bit=True (LLM.int8), with config.json's
// "quantization_config" (model/config_hf.c reads it into ModelConfig.bnb_*).
//
// 4-bit (NF4 or FP4): each quantized Linear "X" is stored as
//   X.weight                                   U8, the packed codes [n / 2, 1] (n = out * in,
//                                              value 2i in byte i's high nibble)
//   X.weight.absmax                            F32 per block of `blocksize` values, or with
//                                              double quantization U8 codes of the nested map
//   X.weight.quant_map                         F32 [16]: the code book (nf4 or fp4)
//   X.weight.nested_absmax, .nested_quant_map  F32, double quantization only (blocks of 256)
//   X.weight.quant_state.bitsandbytes__nf4     U8: a JSON object (QuantState.as_dict(packed=
//     (or __fp4)                               True)): quant_type, blocksize, dtype, shape,
//                                              and nested_blocksize, nested_dtype, nested_offset
// which is the layout of marlhf's QUANT_NF4 matrices (ops/nf4.h) when the blocks are 64 values
// and the rows whole blocks: the bytes are taken as they are, without requantization (the
// nibbles, the absmax values or their 8-bit codes, the second-level absmax values and the
// offset), and FP4 only swaps the code book (fp4_levels). The file's quant_map and
// nested_quant_map must be bitsandbytes' tables bit for bit. Any other block size, a row that
// is not whole blocks, a missing or malformed piece is refused, naming the tensor. Linears
// that bitsandbytes left unquantized (its llm_int8_skip_modules; the LM head) and the
// embedding, norms and biases are read as floats and stay float32, as bitsandbytes leaves them.
//
// 8-bit (LLM.int8): X.weight is I8 [out, in], X.SCB F32 [out] (each row's absmax), and maybe
// X.weight_format (U8 0, "row"); the weight is dequantized on load as bitsandbytes does,
// w * SCB * (1/127 in float), and the model is a float32 model from then on (--quantize
// applies to it as to any float model).
#pragma once
#include <stdbool.h>

#include "io/safetensors.h"
#include "model/model.h"

// The quantization a 4-bit bitsandbytes checkpoint runs with: "nf4", "nf4-single" (without
// double quantization), "fp4" or "fp4-single"; NULL for any other config.
const char *bnb_quantize_name(const ModelConfig *cfg);

// The quantization to load `cfg` (read from `source`) with, given the one asked for (`asked`,
// an option's value; NULL or "none" when none): a 4-bit bitsandbytes checkpoint runs with its
// own bits, so none or its own name (bnb_quantize_name) give that name and anything else is
// refused (requantizing 4-bit codes would add a second rounding); any other model gets `asked`.
// `option` names the option for the error. Returns 0, or -1 with err_set().
int bnb_resolve_quantize(const ModelConfig *cfg, const char *source, const char *asked, const char *option,
                         const char **resolved);

// For a 4-bit checkpoint: every linear layer's rows must be whole blocks of 64 (bitsandbytes'
// blocks run over the flattened matrix; marlhf's kernels take a row's blocks as its own).
// Returns 0, or -1 with err_set() naming the first tensor whose rows are not (and `path`).
int bnb_check_rows(const Model *model, const char *path);

// Reads 4-bit weight `name` ("model.layers.0.self_attn.q_proj.weight") of shape [rows, cols]
// into `matrix` (arrays from `alloc`). Returns 1 when the tensor is bitsandbytes-quantized and
// was read, 0 when the file holds it as floats (a skipped module: the caller reads it), -1 with
// err_set() naming the tensor and `path` when a piece is missing, malformed or not loadable.
int bnb_read_4bit(const SafetensorsSet *set, const char *path, const char *name, long rows, long cols, bool fp4,
                  bool double_quant, Q8Matrix *matrix, void *(*alloc)(size_t));

// Reads int8 weight `name` [rows, cols] with its X.SCB into dst as floats (w * SCB / 127).
// Returns 1 when read, 0 when the file holds it as floats, -1 with err_set() as above.
int bnb_read_int8(const SafetensorsSet *set, const char *path, const char *name, long rows, long cols, float *dst);
