// Hugging Face config.json <-> ModelConfig.
//
// Reads the config.json of GPT-2, Llama (SmolLM2, TinyLlama), Mistral, Qwen2, Qwen3, Gemma
// and Gemma 2 checkpoints, as transformers 4.x and 5.x write them, and writes config.json
// files that transformers loads into the same model.
//
// What the reader accepts, and why (anything else is a user error naming the field):
//  - gpt2: n_embd, n_layer, n_head, n_positions, vocab_size are required; n_inner
//    null or missing means 4 * n_embd; activation_function must be "gelu_new" or
//    "gelu_pytorch_tanh" (both the tanh approximation; plain "gelu" is the erf form,
//    which the kernels do not implement); scale_attn_weights must be true and
//    scale_attn_by_inverse_layer_idx false (other attention scalings are not
//    implemented); tie_word_embeddings defaults to true.
//  - llama, mistral, qwen2, qwen3, gemma, gemma2: hidden_size, num_hidden_layers,
//    num_attention_heads, intermediate_size, max_position_embeddings, vocab_size are
//    required; num_key_value_heads defaults to the head count, head_dim to
//    hidden_size / heads, rms_norm_eps to 1e-6, rope_theta to 10000.
//    tie_word_embeddings defaults to false, true for gemma and gemma2 (the transformers
//    defaults; gemma2's head_dim defaults to 256, as Gemma2Config's). hidden_act must
//    be "silu"; for gemma and gemma2 "gelu_pytorch_tanh" (or
//    "gelu_new"), and also the legacy "gelu" of the original Gemma releases, which
//    transformers maps to the tanh approximation; a non-null "hidden_activation"
//    (transformers 4.x) takes precedence and must be a tanh form.
//  - RoPE: rope_theta is read from "rope_parameters" (transformers 5.x), else from
//    the top level (4.x). "rope_scaling" / "rope_parameters" may be absent, null, or
//    of rope_type "default", "linear" (factor) or "llama3" (factor, low_freq_factor,
//    high_freq_factor, original_max_position_embeddings: Llama 3.1/3.2); anything else
//    (yarn, dynamic, longrope...) is "unsupported rope_scaling". partial_rotary_factor
//    must be absent or 1.
//  - gemma2: attn_logit_softcapping (default 50) and final_logit_softcapping (default
//    30), null meaning none; query_pre_attn_scalar (default 256).
//  - attention_bias (llama, gemma, gemma2, qwen3) turns on the q/k/v and output biases; qwen2
//    always has q/k/v biases; llama's mlp_bias = true is refused (not implemented).
//  - Sliding-window attention (ModelConfig.sliding_window, config_layer_window): mistral's
//    "sliding_window" (default 4096 as in transformers, null for none) in every layer; gemma2's
//    and gemma3's (default 4096) in their sliding layers; qwen2/qwen3's only when
//    "use_sliding_window" is true, from layer "max_window_layers" (default 28) on. A
//    transformers 5 "layer_types" list must name the same layers.
//  - bos/eos/pad_token_id: an integer, or null/missing (-1). eos_token_id may be a
//    list (Llama 3 style); the first entry is taken as *the* end-of-sequence token.
#pragma once
#include "model/config.h"

// Reads `path` (a config.json, or a folder holding one) into *cfg and runs
// config_finish(). Returns 0, or -1 with err_set() naming the file and the field,
// e.g. "config.json has no field 'hidden_size' (path)".
int config_from_hf_json(ModelConfig *cfg, const char *path);

// Writes a config.json for `cfg` at `path` (atomically, see io/fs.h) with
// "architectures": [architecture], e.g. "LlamaForCausalLM", "GPT2LMHeadModel",
// "LlamaForSequenceClassification" (which also gets num_labels 1 — a scalar reward
// or value head). The architecture must belong to cfg's family. Size fields use the
// family's own names, dtype is float32; RoPE is written both the 4.x way
// (rope_theta, rope_scaling null) and the 5.x way (rope_parameters) so either
// version loads it. A config the family cannot express in transformers (e.g. Llama
// with q/k/v biases but no output bias) is an error.
int config_write_hf_json(const ModelConfig *cfg, const char *path, const char *architecture);

// "GPT2LMHeadModel", "LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM",
// "GemmaForCausalLM".
const char *config_hf_causal_lm_architecture(ModelFamily family);
// "GPT2ForSequenceClassification", "LlamaForSequenceClassification", ...
const char *config_hf_sequence_classification_architecture(ModelFamily family);
