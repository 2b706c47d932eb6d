// Loading a model from a Hugging Face folder or a GGUF file, and saving it as a
// Hugging Face folder that transformers loads with the same logits.
//
// Inside marlhf every family uses the parameter names and layouts of model/params.h.
// The differences of each file format are handled here, and only here:
//   - GPT-2 (HF): Conv1D weights are [in, out] and q/k/v are one fused c_attn tensor;
//     names start with "transformer." (or nothing, in the original OpenAI upload).
//   - GGUF (llama.cpp): its own tensor names; Llama's q/k rows are permuted for
//     llama.cpp's interleaved rotary layout; Gemma's norm weights are stored as 1 + w;
//     tensors may be quantized (dequantized to f32 here).
#pragma once
#include <stdbool.h>
#include <stdint.h>

#include "io/gguf.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

// The part of parameter `entry` a process keeps of the weights it loads: the floats
// [*first, *first + *count) of it (ModelLoadOptions.keep_range).
typedef void (*ModelKeepRange)(const Model *model, const ParamEntry *entry, long *first, long *count);

typedef struct {
    bool with_lm_head;       // keep the LM head (actor, reference, SFT)
    bool with_value_head;    // add a value head (reward model, critic)
    bool require_value_head; // the file must hold one ("score.weight" or "v_head.weight")
    uint64_t seed;           // initialises a value head the file does not have
    const char *quantize;    // NULL or "none": float32; "q8_0": quantized as read (model/quantize.h)
    // NULL keeps every weight. Else only the part of each parameter it names is written: the
    // rest stays zero and its pages are never touched, and a parameter with nothing kept is
    // not read at all. ZeRO-3 loads each rank's shard of the layers so
    // (dist_weights_load_range in dist/zero.h). Float32 weights on the CPU only.
    ModelKeepRange keep_range;
} ModelLoadOptions;

// Loads `path` (a folder with config.json + safetensors, or a .gguf file) onto `ops`.
// Returns 0, or -1 with err_set() naming the file and the field or tensor at fault.
int model_load(Model *model, const char *path, const OpsBackend *ops,
               const ModelLoadOptions *options);

// model_load, then the LoRA adapter saved in `adapter` on top when not NULL (model/lora.h).
// options->quantize applies either way: without an adapter the weights are quantized as
// they are read (the float32 model never exists in full); an adapter needs the float32
// base it was trained on, so then the whole model is loaded first and quantized after.
// Returns 0, or -1 with err_set() (nothing left allocated).
int model_load_with_adapter(Model *model, const char *path, const OpsBackend *ops, const ModelLoadOptions *options,
                            const char *adapter, uint64_t adapter_seed);

// Replaces the weights of an existing model by those saved at `path` (same architecture and
// heads): how a resumed run restores a checkpoint. `keep_range` as ModelLoadOptions's (NULL:
// every weight); a model on the CPU only.
int model_reload_weights(Model *model, const char *path, ModelKeepRange keep_range);

// Reads only the config of `path` (folder or .gguf).
int model_read_config(ModelConfig *cfg, const char *path);

// Writes `model` as a Hugging Face folder at `dir` (config.json, model.safetensors,
// and the tokenizer files found in `tokenizer_source`, a folder, if not NULL).
// The folder appears complete or not at all; an existing folder is replaced only
// once the new one is fully written. A model with a value head and no LM head is
// written as *ForSequenceClassification (score.weight), which is how transformers
// loads a reward model.
int model_save_hf(const Model *model, const char *dir, const char *tokenizer_source);

// Reads tensors named <name_prefix><file name of each parameter> from the safetensors
// file `path` into `dst` (laid out like model->params), mapping layouts as loading does.
// The value head is read from "<name_prefix>value_head.weight". Used by the tests to
// compare gradients and optimizer results with PyTorch references.
int model_read_named_tensors(const Model *model, const char *path, const char *name_prefix, float *dst);

// Writes config.json and model.safetensors into the existing folder `dir` (each file
// atomically, the folder as a whole not): for checkpoints, which wrap several models in
// one atomic folder.
int model_write_hf_files(const Model *model, const char *dir);

// What a GGUF export stores its matrices as (`marlhf convert --outtype`): one type for
// all, or llama.cpp's Q4_K_M or Q5_K_M mix. Vectors are always F32.
typedef enum {
    GGUF_OUT_F32,
    GGUF_OUT_F16,
    GGUF_OUT_Q8_0,
    GGUF_OUT_Q4_0,
    GGUF_OUT_Q4_1,
    GGUF_OUT_Q5_0,
    GGUF_OUT_Q5_1,
    GGUF_OUT_Q4_K_M,
    GGUF_OUT_Q5_K_M,
    GGUF_OUT_IQ4_NL,
    GGUF_OUT_IQ4_XS,
    GGUF_OUT_Q3_K_M,
    GGUF_OUT_Q2_K
} GgufOutType;
// "f32" | "f16" | "q8_0" | "q4_0" | "q4_1" | "q5_0" | "q5_1" | "iq4_nl" | "iq4_xs" | "q2_k" | "q3_k_m" | "q4_k_m" |
// "q5_k_m";
// -1 for anything else.
int gguf_out_type_from_name(const char *name, GgufOutType *out);
// The type llama.cpp's Q4_K_M mix gives the matrix named `name` (its GGUF name) whose rows are
// `row` values long: Q6_K for the output (or a tied token table) and for attn_v / ffn_down of
// some layers, Q4_K otherwise, and the fallbacks for rows the super-blocks do not divide (Q5_0,
// Q8_0; F16 for rows that 32 does not divide). What `convert --outtype q4_k_m` writes, and what
// `--quantize q4_k_m` holds (model/quantize.c). `mix` GGUF_OUT_Q5_K_M: llama.cpp's Q5_K_M,
// the same with Q5_K for Q4_K and its fallback Q5_1 for Q5_0. GGUF_OUT_Q3_K_M, GGUF_OUT_Q2_K:
// llama.cpp's Q3_K_M and Q2_K (what `convert --outtype q3_k_m / q2_k` writes; their
// fallback for Q3_K and Q2_K rows is Q4_0, as llama.cpp 0.3.36's). GGUF_OUT_IQ4_NL,
// GGUF_OUT_IQ4_XS: IQ4_NL (IQ4_XS; IQ4_NL for rows 256 does not divide), Q6_K for the output, and
// llama.cpp's raises to Q5_K (attn_v under GQA of 4 or more, ffn_down in the first eighth).
GgmlType gguf_mix_matrix_type(GgufOutType mix, const ModelConfig *cfg, const char *name, int64_t row);

// Writes the model as one GGUF file for llama.cpp (its architecture names, tensor names and
// layouts: Llama's permuted q/k rows, Gemma's 1 + w norms, GPT-2's fused qkv), with the
// tokenizer's metadata when `tokenizer` is not NULL (tokenizer_write_gguf: byte-level BPE
// only). Matrices as `out` with llama.cpp's choices per tensor (the output matrix, and
// for Q4_K_M the attn_v / ffn_down of some layers, as Q6_K; the legacy 4- and 5-bit types
// Q4_0, Q4_1, Q5_0, Q5_1 likewise give the output Q6_K; a type whose block does not
// divide a row falls back as llama.cpp's does: Q4_K to Q5_0, Q6_K to Q8_0, then F16),
// vectors as F32. A LoRA model is written with its adapters merged; a value head is left
// out. Atomic; returns 0 or -1 with err_set().
int model_write_gguf(const Model *model, const Tokenizer *tokenizer, const char *path, GgufOutType out);

// Writes the LoRA adapters of `model` alone as a llama.cpp LoRA adapter file (general.type
// "adapter", adapter.lora.alpha, tensors "<base tensor>.lora_a" [rank, in] and ".lora_b"
// [out, rank], B's rows permuted as the base weight's for Llama's q/k), for llama.cpp's
// --lora on the base model's GGUF. GPT-2 (fused qkv in GGUF) is refused. Adapters are
// small: the 4-bit output types store them as Q8_0.
int model_write_gguf_adapter(const Model *model, const char *path, GgufOutType out);

// True if `path` names a GGUF file (by its magic bytes).
bool path_is_gguf(const char *path);
