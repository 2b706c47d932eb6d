// A ModelConfig from the metadata of a GGUF file (the keys llama.cpp writes).
#pragma once
#include "io/gguf.h"
#include "model/config.h"

// Reads general.architecture ("llama", "mistral", "qwen2", "gemma", "gpt2") and the
// <arch>.* sizes, the vocabulary size and the special token ids, then calls
// config_finish(). `path` names the file in error messages. Returns 0, or -1 with
// err_set() naming the missing or bad key and the file.
// For Gemma it clears norm_weight_plus_one: llama.cpp's converter already stored the
// RMSNorm weights as (1 + weight).
int config_from_gguf(ModelConfig *cfg, const GgufFile *f, const char *path);
