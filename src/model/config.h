// The shape of a decoder-only transformer, for every family marlhf runs.
//
// One implementation (model/transformer.c) covers GPT-2, Llama (SmolLM2, TinyLlama),
// Mistral, Qwen2, Qwen3, Gemma and Gemma 2 through the switches below. A config comes from a Hugging
// Face config.json (model/config_hf.c) or from GGUF metadata (model/config_gguf.c).
#pragma once
#include <stdbool.h>

typedef enum { NORM_LAYERNORM, NORM_RMSNORM } NormKind;
typedef enum { POSITIONS_LEARNED, POSITIONS_ROPE } PositionKind;
// MLP_GELU:   down(gelu_tanh(up(x)))                 (GPT-2, "gelu_new")
// MLP_SWIGLU: down(silu(gate(x)) * up(x))            (Llama, Mistral, Qwen2)
// MLP_GEGLU:  down(gelu_tanh(gate(x)) * up(x))       (Gemma, "gelu_pytorch_tanh")
typedef enum { MLP_GELU, MLP_SWIGLU, MLP_GEGLU } MlpKind;

// How RoPE's frequencies are stretched for a longer context (rope_inverse_frequencies):
//   ROPE_SCALING_NONE    inv_freq_i = theta^(-2i/d)
//   ROPE_SCALING_LINEAR  inv_freq_i / factor (positions interpolated; transformers' "linear")
//   ROPE_SCALING_LLAMA3  Llama 3.1/3.2's: wavelengths above original_max_positions /
//                        low_freq_factor divided by factor, below original_max_positions /
//                        high_freq_factor kept, a smooth blend between (transformers'
//                        "llama3"; llama.cpp stores the same as a rope_freqs tensor)
typedef enum { ROPE_SCALING_NONE, ROPE_SCALING_LINEAR, ROPE_SCALING_LLAMA3 } RopeScalingKind;

typedef enum {
    FAMILY_GPT2,
    FAMILY_LLAMA, // also SmolLM2, TinyLlama
    FAMILY_MISTRAL,
    FAMILY_QWEN2,
    FAMILY_GEMMA,
    FAMILY_QWEN3, // Qwen2's layout without q/k/v biases, with q/k norms
    FAMILY_GEMMA2, // Gemma's, with sandwich norms and soft-capped attention scores and logits
    FAMILY_GEMMA3, // Gemma 2's layout with q/k norms, no soft caps, and another RoPE base on its sliding layers
} ModelFamily;

typedef struct {
    ModelFamily family;
    char model_type[32]; // as in config.json: "gpt2", "llama", "mistral", "qwen2", "gemma", "qwen3", "gemma2",
                         // "gemma3_text"

    int vocab_size;
    int hidden_size;
    int num_layers;
    int num_heads;
    int num_kv_heads; // == num_heads for MHA, < for GQA, 1 for MQA
    int head_dim;     // usually hidden_size / num_heads; Gemma sets it explicitly
    int intermediate_size;
    int max_position_embeddings;

    NormKind norm;
    float norm_eps;
    bool norm_weight_plus_one; // Gemma: RMSNorm scales by (1 + weight)

    PositionKind positions;
    float rope_theta;
    RopeScalingKind rope_scaling;
    float rope_factor;                // LINEAR, LLAMA3
    float rope_low_freq_factor;       // LLAMA3
    float rope_high_freq_factor;      // LLAMA3
    int rope_original_max_positions;  // LLAMA3: the context the model was pretrained on
    // Gemma 3: its sliding-window layers turn by their own RoPE base, unscaled (transformers'
    // rope_local_base_freq, rope_parameters.sliding_attention), the others by rope_theta with
    // the scaling above. Layer i is a sliding layer unless (i + 1) is a multiple of
    // sliding_window_pattern (its layer_types). 0, 0: every layer turns alike.
    float rope_local_theta;
    int sliding_window_pattern;
    // Sliding-window attention: a query of a sliding layer sees the last sliding_window keys
    // (itself included) of its sequence; 0: none. Which layers slide is the family's
    // (config_layer_window): Mistral every layer; Gemma 2 the even layers; Gemma 3 those of
    // sliding_window_pattern above; Qwen2/Qwen3 (use_sliding_window) the layers from
    // sliding_window_first_layer on (transformers' max_window_layers).
    int sliding_window;
    int sliding_window_first_layer;

    MlpKind mlp;

    bool qkv_bias;  // GPT-2, Qwen2
    bool o_bias;    // GPT-2
    bool mlp_bias;  // GPT-2
    bool norm_bias; // LayerNorm has a bias (GPT-2)
    bool qk_norm;   // Qwen3, Gemma 3: RMSNorm over each head's query and key (weights [head_dim]) before RoPE
    // Gemma 2: an RMSNorm on the attention block's output and one on the MLP's, each before
    // its residual add ("post_attention_layernorm", "post_feedforward_layernorm"; the MLP's
    // input norm is then "pre_feedforward_layernorm").
    bool sandwich_norms;
    // Gemma 2's soft caps, 0 where none: each attention score s becomes cap * tanh(s / cap)
    // before the softmax, each logit z of the LM head cap * tanh(z / cap).
    float attn_logit_softcap;
    float final_logit_softcap;
    // Gemma 2: scores are q.k / sqrt(query_pre_attn_scalar); 0 means head_dim (every other
    // family). The model scales the queries by sqrt(head_dim / this) and the attention ops
    // keep their 1 / sqrt(head_dim).
    float query_pre_attn_scalar;

    bool tie_word_embeddings;
    float embedding_multiplier; // Gemma: sqrt(hidden_size); 1 elsewhere

    int bos_token_id; // -1 when unknown
    int eos_token_id;
    int pad_token_id;

    // A checkpoint bitsandbytes quantized (config.json "quantization_config", quant_method
    // "bitsandbytes"; model/bnb_checkpoint.h): 4 (load_in_4bit) or 8 (load_in_8bit), else 0.
    int bnb_bits;
    bool bnb_fp4;          // 4-bit: bnb_4bit_quant_type "fp4" (else "nf4")
    bool bnb_double_quant; // 4-bit: bnb_4bit_use_double_quant
} ModelConfig;

// Fills the family-specific switches (norm, positions, MLP, biases, multiplier) from
// cfg->family and checks that the sizes are consistent. Returns 0, or -1 with err_set()
// naming `source` (the file the config came from) and the offending field.
int config_finish(ModelConfig *cfg, const char *source);

// "gpt2" -> FAMILY_GPT2 ...; returns -1 for an unknown model_type.
int config_family_from_name(const char *model_type, ModelFamily *family);
const char *config_family_name(ModelFamily family);

// RoPE's inverse frequencies, head_dim / 2 of them, in float32 as transformers computes
// them (so that long positions round the same way): theta^(-2i/d) with cfg->rope_scaling.
void rope_inverse_frequencies(const ModelConfig *cfg, float *inv_freq);
// Whether layer `layer` turns by cfg->rope_local_theta (a Gemma 3 sliding-window layer).
bool config_layer_uses_local_rope(const ModelConfig *cfg, int layer);
// The sliding window of layer `layer`'s attention (ModelConfig.sliding_window), or 0 where the
// layer attends to the whole sequence.
int config_layer_window(const ModelConfig *cfg, int layer);
// llama.cpp's per-dimension divisors of the plain frequencies (its rope_freqs tensor):
// plain / scaled, 1 where the scaling keeps a frequency.
void rope_frequency_factors(const ModelConfig *cfg, float *factors);

// Number of parameters of the transformer (without value head).
long long config_num_params(const ModelConfig *cfg);
