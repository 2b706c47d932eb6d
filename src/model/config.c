#include "model/config.h"

#include <math.h>
#include <string.h>

#include "core/check.h"

static const struct {
    const char *name;
    ModelFamily family;
} family_names[] = {
    {"gpt2", FAMILY_GPT2},     {"llama", FAMILY_LLAMA}, {"mistral", FAMILY_MISTRAL},
    {"qwen2", FAMILY_QWEN2},   {"gemma", FAMILY_GEMMA}, {"qwen3", FAMILY_QWEN3}, {"gemma2", FAMILY_GEMMA2},
    {"gemma3_text", FAMILY_GEMMA3},
};

int config_family_from_name(const char *model_type, ModelFamily *family) {
    for (size_t i = 0; i < sizeof family_names / sizeof family_names[0]; i++) {
        if (strcmp(model_type, family_names[i].name) == 0) {
            *family = family_names[i].family;
            return 0;
        }
    }
    return -1;
}

const char *config_family_name(ModelFamily family) {
    for (size_t i = 0; i < sizeof family_names / sizeof family_names[0]; i++)
        if (family_names[i].family == family) return family_names[i].name;
    return "unknown";
}

int config_finish(ModelConfig *cfg, const char *source) {
    snprintf(cfg->model_type, sizeof cfg->model_type, "%s", config_family_name(cfg->family));
    switch (cfg->family) {
    case FAMILY_GPT2:
        cfg->norm = NORM_LAYERNORM;
        cfg->norm_bias = true;
        cfg->norm_weight_plus_one = false;
        cfg->positions = POSITIONS_LEARNED;
        cfg->mlp = MLP_GELU;
        cfg->qkv_bias = cfg->o_bias = cfg->mlp_bias = true;
        cfg->embedding_multiplier = 1.0f;
        break;
    case FAMILY_LLAMA:
    case FAMILY_MISTRAL:
    case FAMILY_QWEN2:
    case FAMILY_QWEN3:
        cfg->norm = NORM_RMSNORM;
        cfg->norm_bias = false;
        cfg->norm_weight_plus_one = false;
        cfg->positions = POSITIONS_ROPE;
        cfg->mlp = MLP_SWIGLU;
        cfg->qkv_bias = cfg->family == FAMILY_QWEN2;
        cfg->o_bias = cfg->mlp_bias = false;
        cfg->qk_norm = cfg->family == FAMILY_QWEN3;
        cfg->embedding_multiplier = 1.0f;
        break;
    case FAMILY_GEMMA:
    case FAMILY_GEMMA2:
    case FAMILY_GEMMA3:
        cfg->norm = NORM_RMSNORM;
        cfg->norm_bias = false;
        cfg->norm_weight_plus_one = true;
        cfg->positions = POSITIONS_ROPE;
        cfg->mlp = MLP_GEGLU;
        cfg->qkv_bias = cfg->o_bias = cfg->mlp_bias = false;
        cfg->embedding_multiplier = sqrtf((float)cfg->hidden_size);
        cfg->sandwich_norms = cfg->family != FAMILY_GEMMA;
        cfg->qk_norm = cfg->family == FAMILY_GEMMA3;
        break;
    }
    if (cfg->num_kv_heads <= 0) cfg->num_kv_heads = cfg->num_heads;
    if (cfg->head_dim <= 0 && cfg->num_heads > 0) cfg->head_dim = cfg->hidden_size / cfg->num_heads;

    struct {
        const char *field;
        int value;
    } positive[] = {
        {"vocab_size", cfg->vocab_size},
        {"hidden_size", cfg->hidden_size},
        {"num_hidden_layers", cfg->num_layers},
        {"num_attention_heads", cfg->num_heads},
        {"num_key_value_heads", cfg->num_kv_heads},
        {"head_dim", cfg->head_dim},
        {"intermediate_size", cfg->intermediate_size},
        {"max_position_embeddings", cfg->max_position_embeddings},
    };
    for (size_t i = 0; i < sizeof positive / sizeof positive[0]; i++)
        if (positive[i].value <= 0)
            return err_set("config field %s must be positive, got %d (%s)", positive[i].field,
                           positive[i].value, source);
    if (cfg->num_heads % cfg->num_kv_heads != 0)
        return err_set("num_attention_heads %d is not a multiple of num_key_value_heads %d (%s)",
                       cfg->num_heads, cfg->num_kv_heads, source);
    if (cfg->positions == POSITIONS_ROPE && cfg->head_dim % 2 != 0)
        return err_set("head_dim %d must be even for rotary positions (%s)", cfg->head_dim, source);
    if (cfg->family == FAMILY_GPT2 && cfg->head_dim * cfg->num_heads != cfg->hidden_size)
        return err_set("hidden_size %d is not num_heads %d x head_dim %d (%s)", cfg->hidden_size,
                       cfg->num_heads, cfg->head_dim, source);
    if (!(cfg->norm_eps > 0.0f) || cfg->norm_eps > 1.0f)
        return err_set("config norm epsilon %g is out of range (%s)", (double)cfg->norm_eps, source);
    if (cfg->positions == POSITIONS_ROPE && !(cfg->rope_theta > 0.0f))
        return err_set("config rope_theta %g must be positive (%s)", (double)cfg->rope_theta, source);
    if (!(cfg->attn_logit_softcap >= 0.0f && isfinite(cfg->attn_logit_softcap)) ||
        !(cfg->final_logit_softcap >= 0.0f && isfinite(cfg->final_logit_softcap)))
        return err_set("config soft caps (attention %g, final %g) must be positive or absent (%s)",
                       (double)cfg->attn_logit_softcap, (double)cfg->final_logit_softcap, source);
    if (!(cfg->query_pre_attn_scalar >= 0.0f && isfinite(cfg->query_pre_attn_scalar)))
        return err_set("config query_pre_attn_scalar %g must be positive (%s)", (double)cfg->query_pre_attn_scalar,
                       source);
    if (!(cfg->rope_local_theta >= 0.0f && isfinite(cfg->rope_local_theta)) || cfg->sliding_window_pattern < 0 ||
        ((cfg->rope_local_theta > 0.0f) != (cfg->sliding_window_pattern > 0)))
        return err_set("config local RoPE base %g and sliding window pattern %d must both be positive or both absent "
                       "(%s)", (double)cfg->rope_local_theta, cfg->sliding_window_pattern, source);
    if (cfg->sliding_window < 0 || cfg->sliding_window_first_layer < 0)
        return err_set("config sliding window %d (from layer %d) must not be negative (%s)", cfg->sliding_window,
                       cfg->sliding_window_first_layer, source);
    if (cfg->rope_scaling != ROPE_SCALING_NONE && !(cfg->rope_factor >= 1.0f && isfinite(cfg->rope_factor)))
        return err_set("RoPE scaling factor %g must be at least 1 (%s)", (double)cfg->rope_factor, source);
    if (cfg->rope_scaling == ROPE_SCALING_LLAMA3 &&
        (!(cfg->rope_low_freq_factor > 0.0f) || !(cfg->rope_high_freq_factor > cfg->rope_low_freq_factor) ||
         cfg->rope_original_max_positions < 1))
        return err_set("llama3 RoPE scaling needs 0 < low_freq_factor (%g) < high_freq_factor (%g) and a positive "
                       "original_max_position_embeddings (%d) (%s)",
                       (double)cfg->rope_low_freq_factor, (double)cfg->rope_high_freq_factor,
                       cfg->rope_original_max_positions, source);
    return 0;
}

void rope_inverse_frequencies(const ModelConfig *cfg, float *inv_freq) {
    const int half = cfg->head_dim / 2;
    for (int i = 0; i < half; i++) {
        float freq = 1.0f / powf(cfg->rope_theta, (float)(2 * i) / (float)cfg->head_dim);
        if (cfg->rope_scaling == ROPE_SCALING_LINEAR) {
            freq = freq / cfg->rope_factor;
        } else if (cfg->rope_scaling == ROPE_SCALING_LLAMA3) {
            // transformers' _compute_llama3_parameters, in float32 as it computes.
            const float old_context = (float)cfg->rope_original_max_positions;
            const float low_freq_wavelen = old_context / cfg->rope_low_freq_factor;
            const float high_freq_wavelen = old_context / cfg->rope_high_freq_factor;
            const float wavelen = (float)(2.0 * M_PI) / freq;
            if (wavelen > low_freq_wavelen) {
                freq = freq / cfg->rope_factor;
            } else if (!(wavelen < high_freq_wavelen)) {
                const float smooth = (old_context / wavelen - cfg->rope_low_freq_factor) /
                                     (cfg->rope_high_freq_factor - cfg->rope_low_freq_factor);
                freq = (1.0f - smooth) * freq / cfg->rope_factor + smooth * freq;
            }
        }
        inv_freq[i] = freq;
    }
}

bool config_layer_uses_local_rope(const ModelConfig *cfg, int layer) {
    return cfg->rope_local_theta > 0.0f && (layer + 1) % cfg->sliding_window_pattern != 0;
}

int config_layer_window(const ModelConfig *cfg, int layer) {
    if (cfg->sliding_window <= 0) return 0;
    switch (cfg->family) {
    case FAMILY_GEMMA2: return layer % 2 == 0 ? cfg->sliding_window : 0; // transformers: not layer_idx % 2
    case FAMILY_GEMMA3: return (layer + 1) % cfg->sliding_window_pattern != 0 ? cfg->sliding_window : 0;
    case FAMILY_QWEN2:
    case FAMILY_QWEN3: return layer >= cfg->sliding_window_first_layer ? cfg->sliding_window : 0;
    default: return cfg->sliding_window;
    }
}

void rope_frequency_factors(const ModelConfig *cfg, float *factors) {
    ModelConfig plain = *cfg;
    plain.rope_scaling = ROPE_SCALING_NONE;
    const int half = cfg->head_dim / 2;
    float scaled[half];
    rope_inverse_frequencies(&plain, factors);
    rope_inverse_frequencies(cfg, scaled);
    for (int i = 0; i < half; i++) factors[i] /= scaled[i];
}

long long config_num_params(const ModelConfig *cfg) {
    long long C = cfg->hidden_size, V = cfg->vocab_size, I = cfg->intermediate_size;
    long long q = (long long)cfg->num_heads * cfg->head_dim;
    long long kv = (long long)cfg->num_kv_heads * cfg->head_dim;
    long long norm = cfg->norm_bias ? 2 * C : C;
    long long per_layer = (cfg->sandwich_norms ? 4 : 2) * norm + C * q + 2 * C * kv + q * C;
    if (cfg->qk_norm) per_layer += 2LL * cfg->head_dim;
    if (cfg->qkv_bias) per_layer += q + 2 * kv;
    if (cfg->o_bias) per_layer += C;
    per_layer += (cfg->mlp == MLP_GELU ? 2 : 3) * C * I;
    if (cfg->mlp_bias) per_layer += I + C;
    long long total = V * C + cfg->num_layers * per_layer + norm;
    if (cfg->positions == POSITIONS_LEARNED) total += (long long)cfg->max_position_embeddings * C;
    if (!cfg->tie_word_embeddings) total += V * C;
    return total;
}
