// A ModelConfig from the metadata of a GGUF file (the keys llama.cpp writes).
#pragma once
#include "io/gguf.h"
#include "model/config.h"

// Reads general.architecture ("llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2",
// "gpt2") and the <arch>.* sizes, the vocabulary size and the special token ids, then calls
// config_finish(). `path` names the file in error messages. Returns 0, or -1 with
// err_set() naming the missing or bad key and the file.
// Gemma's RMSNorm weights, which llama.cpp's converter stores as (1 + weight), keep Hugging
// Face's convention in the config; model/weights_io.c subtracts the 1 as it loads them.
// Gemma 2: the soft caps and the sliding window (which lowers max_position_embeddings, as
// for config.json) from their keys.
int config_from_gguf(ModelConfig *cfg, const GgufFile *f, const char *path);

// Gemma 2's query_pre_attn_scalar, which a GGUF file does not hold: llama.cpp takes
// hidden_size / heads for the 27B shape (46 layers) and head_dim for every other.
float config_gguf_gemma2_query_scalar(const ModelConfig *cfg);
