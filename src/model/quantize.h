// Q8_0 weights for inference (`--quantize q8_0` on generate, chat, serve and infer): every
// linear layer and the LM head compute from 8-bit copies of their weights, and the token
// embedding is looked up in an 8-bit table (a row dequantized per token), as llama.cpp runs
// a Q8_0 model. The float32 copies of those weights are given back to the system once
// quantized (their pages read as zeros afterwards), so a quantized model takes about 1.1
// bytes per weight instead of 4 (norms, biases and learned positions stay float32):
// SmolLM2-135M ~150 MB of weights instead of ~540, a 7B Llama ~7.5 GB instead of 28. Loading with
// ModelLoadOptions.quantize quantizes each tensor as it is read, so the float32 model
// never exists in full.
//
// A quantized model is for inference only: it cannot be trained, saved, converted or given
// a LoRA adapter afterwards (a LoRA adapter loaded before quantizing keeps working; its
// float32 term is added to the 8-bit layer's output).
#pragma once
#include <stdbool.h>

#include "model/model.h"

typedef struct {
    Q8Matrix q, k, v, o, gate, up, down; // gate: gated MLPs only
} QuantizedLayer;

typedef struct ModelQuantized {
    QuantizedLayer *layers; // [num_layers]
    Q8Matrix embedding;     // the token table
    Q8Matrix lm_head;       // the LM head; the same arrays as `embedding` when tied
    bool head_is_embedding;
} ModelQuantized;

// True when `type` asks for quantized weights (not NULL and not "none").
bool quantize_requested(const char *type);

// The names --quantize takes: "none" (float32) or "q8_0". Returns 0, or -1 with err_set()
// naming `option` (the option or field that gave the name).
int quantize_type_check(const char *type, const char *option);

// Quantizes a loaded model's linear layers and LM head to `type` and releases their
// float32 copies; "none" (or NULL) does nothing. The model must be on the CPU and have no
// gradients. Returns 0, or -1 with err_set() (the model unchanged).
int model_quantize(Model *model, const char *type);

// For model_load (model/weights_io.c): quantized_begin checks and sets up the quantized
// copies before any weight is read (same errors as model_quantize); quantized_take then
// quantizes table entry `entry` if it is one of the quantized tensors, once its float32
// values are in model->params, and releases them.
int quantized_begin(Model *model, const char *type);
void quantized_take(Model *model, const ParamEntry *entry);

// Frees the quantized copies (model_free calls it).
void model_quantized_free(Model *model);
