// A ModelConfig from the metadata of a GGUF file (the keys llama.cpp writes).
#pragma once
#include "io/gguf.h"
#include "model/config.h"

// Reads general.architecture ("llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2",
// "gemma3", "gpt2") and the <arch>.* sizes, the vocabulary size and the special token ids, then calls
// config_finish(). `path` names the file in error messages. Returns 0, or -1 with
// err_set() naming the missing or bad key and the file.
// Gemma's RMSNorm weights, which llama.cpp's converter stores as (1 + weight), keep Hugging
// Face's convention in the config; model/weights_io.c subtracts the 1 as it loads them.
// Gemma 2: the soft caps and the sliding window (which lowers max_position_embeddings, as
// for config.json) from their keys. Gemma 3: the sliding window from its key, the rest as
// llama.cpp fixes it (every 6th layer a full-attention one, the others turning by RoPE base
// 10,000; no soft caps).
int config_from_gguf(ModelConfig *cfg, const GgufFile *f, const char *path);

// llama.cpp's fixed Gemma 3 layer pattern and sliding layers' RoPE base.
#define GGUF_GEMMA3_PATTERN 6
#define GGUF_GEMMA3_LOCAL_THETA 10000.0f

// Gemma 2's and Gemma 3's query_pre_attn_scalar, which a GGUF file does not hold: llama.cpp
// takes hidden_size / heads for the 27B shapes (46 layers of Gemma 2, 62 of Gemma 3) and
// head_dim for every other.
float config_gguf_gemma_query_scalar(const ModelConfig *cfg);
