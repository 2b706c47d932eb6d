#include "model/config_hf.h"

#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/check.h"
#include "io/fs.h"
#include "io/jsonl.h"

// A config.json is a few kilobytes; anything near this is not one.
#define CONFIG_MAX_BYTES (16u << 20)

typedef struct {
    json_t *root;
    const char *path;
} Json;

// The value of `field`, or NULL when it is missing or null.
static json_t *field_value(const Json *json, const char *field) {
    json_t *value = json_object_get(json->root, field);
    return json_is_null(value) ? NULL : value;
}

static int missing_field(const Json *json, const char *field) {
    if (json_object_get(json->root, field))
        return err_set("config.json field '%s' is null (%s)", field, json->path);
    return err_set("config.json has no field '%s' (%s)", field, json->path);
}

static int int_value(const Json *json, const char *field, json_t *value, int *out) {
    if (!json_is_integer(value))
        return err_set("config.json field '%s' must be an integer, not %s (%s)", field, json_kind(value),
                       json->path);
    json_int_t v = json_integer_value(value);
    if (v < INT_MIN || v > INT_MAX)
        return err_set("config.json field '%s' = %lld is out of range (%s)", field, (long long)v, json->path);
    *out = (int)v;
    return 0;
}

static int required_int(const Json *json, const char *field, int *out) {
    json_t *value = field_value(json, field);
    if (!value) return missing_field(json, field);
    return int_value(json, field, value, out);
}

static int optional_int(const Json *json, const char *field, int fallback, int *out) {
    json_t *value = field_value(json, field);
    if (!value) {
        *out = fallback;
        return 0;
    }
    return int_value(json, field, value, out);
}

static int number_value(const Json *json, const char *field, json_t *value, float *out) {
    if (!json_is_number(value))
        return err_set("config.json field '%s' must be a number, not %s (%s)", field, json_kind(value), json->path);
    *out = (float)json_number_value(value);
    return 0;
}

static int optional_float(const Json *json, const char *field, float fallback, float *out) {
    json_t *value = field_value(json, field);
    if (!value) {
        *out = fallback;
        return 0;
    }
    return number_value(json, field, value, out);
}

static int optional_bool(const Json *json, const char *field, bool fallback, bool *out) {
    json_t *value = field_value(json, field);
    if (!value) {
        *out = fallback;
        return 0;
    }
    if (!json_is_boolean(value))
        return err_set("config.json field '%s' must be true or false, not %s (%s)", field, json_kind(value),
                       json->path);
    *out = json_is_true(value);
    return 0;
}

static int optional_string(const Json *json, const char *field, const char *fallback, const char **out) {
    json_t *value = field_value(json, field);
    if (!value) {
        *out = fallback;
        return 0;
    }
    if (!json_is_string(value))
        return err_set("config.json field '%s' must be a string, not %s (%s)", field, json_kind(value), json->path);
    *out = json_string_value(value);
    return 0;
}

// An integer, null/missing (-1), or a list whose first entry is taken.
static int token_id(const Json *json, const char *field, int *out) {
    json_t *value = field_value(json, field);
    *out = -1;
    if (!value) return 0;
    if (json_is_array(value)) {
        if (json_array_size(value) == 0) return 0;
        value = json_array_get(value, 0);
    }
    return int_value(json, field, value, out);
}

// A number of a RoPE dict, "<field>.<key>" in errors; required.
static int rope_number(const Json *json, json_t *dict, const char *field, const char *key, float *out) {
    char name[96];
    snprintf(name, sizeof name, "%s.%s", field, key);
    json_t *value = json_object_get(dict, key);
    if (!value || json_is_null(value)) return err_set("config.json has no field '%s' (%s)", name, json->path);
    return number_value(json, name, value, out);
}

// Reads one RoPE dict, `field` its name in errors: its scaling into cfg, and its rope_theta.
static int check_rope_object(const Json *json, const char *field, json_t *dict, ModelConfig *cfg, float *theta,
                             bool *has_theta) {
    if (!json_is_object(dict))
        return err_set("config.json field '%s' must be an object, not %s (%s)", field, json_kind(dict), json->path);
    json_t *type = json_object_get(dict, "rope_type");
    if (!type) type = json_object_get(dict, "type"); // 4.x spelling
    const char *type_name = json_is_string(type) ? json_string_value(type) : "default";
    if (type && !json_is_string(type) && !json_is_null(type))
        return err_set("config.json field '%s' has a rope_type that is not a string (%s)", field, json->path);
    if (!strcmp(type_name, "linear")) {
        cfg->rope_scaling = ROPE_SCALING_LINEAR;
        if (rope_number(json, dict, field, "factor", &cfg->rope_factor) != 0) return -1;
    } else if (!strcmp(type_name, "llama3")) {
        cfg->rope_scaling = ROPE_SCALING_LLAMA3;
        float original = 0;
        if (rope_number(json, dict, field, "factor", &cfg->rope_factor) != 0 ||
            rope_number(json, dict, field, "low_freq_factor", &cfg->rope_low_freq_factor) != 0 ||
            rope_number(json, dict, field, "high_freq_factor", &cfg->rope_high_freq_factor) != 0 ||
            rope_number(json, dict, field, "original_max_position_embeddings", &original) != 0)
            return -1;
        cfg->rope_original_max_positions = (int)original;
    } else if (strcmp(type_name, "default") != 0) {
        return err_set("unsupported rope_scaling: config.json field '%s' has rope_type '%s'; plain RoPE, linear and "
                       "llama3 scaling are implemented (%s)",
                       field, type_name, json->path);
    }
    const char *key;
    json_t *value;
    json_object_foreach(dict, key, value) {
        if (json_is_object(value)) // per-layer-type RoPE (Gemma 3 style)
            return err_set("unsupported rope_scaling: config.json field '%s' has per-layer entry '%s' (%s)", field,
                           key, json->path);
    }
    json_t *factor = json_object_get(dict, "partial_rotary_factor");
    if (factor && !(json_is_number(factor) && json_number_value(factor) == 1.0))
        return err_set("unsupported rope_scaling: config.json field '%s' has a partial_rotary_factor (%s)", field,
                       json->path);
    json_t *value_theta = json_object_get(dict, "rope_theta");
    if (value_theta && !json_is_null(value_theta)) {
        char name[96];
        snprintf(name, sizeof name, "%s.rope_theta", field);
        if (number_value(json, name, value_theta, theta) != 0) return -1;
        *has_theta = true;
    }
    return 0;
}

// The RoPE dict of the top-level field "rope_scaling" or "rope_parameters", if present.
static int check_rope_dict(const Json *json, const char *field, ModelConfig *cfg, float *theta, bool *has_theta) {
    json_t *dict = field_value(json, field);
    return dict ? check_rope_object(json, field, dict, cfg, theta, has_theta) : 0;
}

static int read_rope(const Json *json, ModelConfig *cfg, float default_theta) {
    float theta = 0;
    bool has_theta = false;
    if (check_rope_dict(json, "rope_scaling", cfg, &theta, &has_theta) != 0) return -1;
    if (check_rope_dict(json, "rope_parameters", cfg, &theta, &has_theta) != 0) return -1;
    json_t *factor = field_value(json, "partial_rotary_factor");
    if (factor && !(json_is_number(factor) && json_number_value(factor) == 1.0))
        return err_set("unsupported rope_scaling: config.json field 'partial_rotary_factor' is not 1 (%s)",
                       json->path);
    if (has_theta) {
        cfg->rope_theta = theta;
        return 0;
    }
    return optional_float(json, "rope_theta", default_theta, &cfg->rope_theta);
}

// Gemma 3's RoPE: transformers 5 writes one dict per layer type (rope_parameters.full_attention,
// .sliding_attention), 4.x rope_theta and rope_scaling for the full layers and
// rope_local_base_freq for the sliding ones (Gemma3TextConfig's defaults 1e6 and 1e4).
static int read_gemma3_rope(const Json *json, ModelConfig *cfg) {
    json_t *parameters = field_value(json, "rope_parameters");
    json_t *full = json_is_object(parameters) ? json_object_get(parameters, "full_attention") : NULL;
    json_t *sliding = json_is_object(parameters) ? json_object_get(parameters, "sliding_attention") : NULL;
    if (!full && !sliding) {
        if (read_rope(json, cfg, 1e6f) != 0) return -1;
        return optional_float(json, "rope_local_base_freq", 1e4f, &cfg->rope_local_theta);
    }
    bool has_theta = false, has_local_theta = false;
    cfg->rope_theta = 1e6f, cfg->rope_local_theta = 1e4f;
    if (full && check_rope_object(json, "rope_parameters.full_attention", full, cfg, &cfg->rope_theta, &has_theta) != 0)
        return -1;
    ModelConfig local = *cfg;
    local.rope_scaling = ROPE_SCALING_NONE;
    if (sliding && check_rope_object(json, "rope_parameters.sliding_attention", sliding, &local, &cfg->rope_local_theta,
                                     &has_local_theta) != 0)
        return -1;
    if (local.rope_scaling != ROPE_SCALING_NONE)
        return err_set("unsupported rope_scaling: config.json field 'rope_parameters.sliding_attention' scales the "
                       "sliding layers' RoPE; marlhf scales the full-attention layers' only (%s)", json->path);
    return 0;
}

// Gemma 3's layer types: "layer_types" (transformers 5) or every sliding_window_pattern-th
// layer a full-attention one (4.x; Gemma3TextConfig's default 6). marlhf keeps the pattern:
// a list that does not repeat one is refused.
static int read_gemma3_layers(const Json *json, ModelConfig *cfg) {
    json_t *types = field_value(json, "layer_types");
    if (!types) {
        if (optional_int(json, "sliding_window_pattern", 6, &cfg->sliding_window_pattern) != 0) return -1;
        if (cfg->sliding_window_pattern <= 0)
            return err_set("config.json field 'sliding_window_pattern' is %d; it must be positive (%s)",
                           cfg->sliding_window_pattern, json->path);
        return 0;
    }
    if (!json_is_array(types) || (long)json_array_size(types) != cfg->num_layers)
        return err_set("config.json field 'layer_types' must be a list of num_hidden_layers (%d) names (%s)",
                       cfg->num_layers, json->path);
    // The first full-attention layer sets the pattern; none: every layer slides.
    cfg->sliding_window_pattern = cfg->num_layers + 1;
    for (int l = cfg->num_layers - 1; l >= 0; l--) {
        const char *name = json_string_value(json_array_get(types, (size_t)l));
        if (!name || (strcmp(name, "sliding_attention") && strcmp(name, "full_attention")))
            return err_set("config.json field 'layer_types' entry %d is not \"sliding_attention\" or \"full_attention\" "
                           "(%s)", l, json->path);
        if (!strcmp(name, "full_attention")) cfg->sliding_window_pattern = l + 1;
    }
    for (int l = 0; l < cfg->num_layers; l++) {
        const bool sliding = !strcmp(json_string_value(json_array_get(types, (size_t)l)), "sliding_attention");
        if (sliding != ((l + 1) % cfg->sliding_window_pattern != 0))
            return err_set("config.json field 'layer_types' does not repeat one pattern (every %d-th layer full "
                           "attention): layer %d is %s; marlhf reads Gemma 3's regular patterns only (%s)",
                           cfg->sliding_window_pattern, l, sliding ? "sliding" : "full", json->path);
    }
    return 0;
}

static int read_gpt2(const Json *json, ModelConfig *cfg) {
    if (required_int(json, "n_embd", &cfg->hidden_size) || required_int(json, "n_layer", &cfg->num_layers) ||
        required_int(json, "n_head", &cfg->num_heads) ||
        required_int(json, "n_positions", &cfg->max_position_embeddings) ||
        required_int(json, "vocab_size", &cfg->vocab_size) ||
        optional_int(json, "n_inner", 0, &cfg->intermediate_size) ||
        optional_float(json, "layer_norm_epsilon", 1e-5f, &cfg->norm_eps) ||
        optional_bool(json, "tie_word_embeddings", true, &cfg->tie_word_embeddings))
        return -1;
    const char *activation = NULL; // optional_string sets it on success; NULL keeps -Wmaybe-uninitialized quiet
    if (optional_string(json, "activation_function", "gelu_new", &activation) != 0) return -1;
    if (strcmp(activation, "gelu_new") != 0 && strcmp(activation, "gelu_pytorch_tanh") != 0)
        return err_set("config.json field 'activation_function' is '%s'; marlhf implements only the tanh "
                       "approximation, 'gelu_new' or 'gelu_pytorch_tanh' (%s)",
                       activation, json->path);
    bool scaled = true, scaled_by_layer = false;
    if (optional_bool(json, "scale_attn_weights", true, &scaled) ||
        optional_bool(json, "scale_attn_by_inverse_layer_idx", false, &scaled_by_layer))
        return -1;
    if (!scaled || scaled_by_layer)
        return err_set("config.json field '%s' asks for an attention scaling marlhf does not implement (%s)",
                       scaled ? "scale_attn_by_inverse_layer_idx" : "scale_attn_weights", json->path);
    if (cfg->intermediate_size == 0 && cfg->hidden_size > 0 && cfg->hidden_size <= INT_MAX / 4)
        cfg->intermediate_size = 4 * cfg->hidden_size; // null n_inner: the GPT-2 default
    cfg->num_kv_heads = cfg->num_heads;
    return 0;
}

static int read_activation(const Json *json, const ModelConfig *cfg) {
    const char *act = NULL; // the same
    if (cfg->family != FAMILY_GEMMA && cfg->family != FAMILY_GEMMA2 && cfg->family != FAMILY_GEMMA3) {
        if (optional_string(json, "hidden_act", "silu", &act) != 0) return -1;
        if (strcmp(act, "silu") != 0)
            return err_set("config.json field 'hidden_act' is '%s'; %s models must use 'silu' (%s)", act,
                           cfg->model_type, json->path);
        return 0;
    }
    // transformers 4.x Gemma prefers "hidden_activation"; 5.x reads only "hidden_act".
    if (optional_string(json, "hidden_activation", NULL, &act) != 0) return -1;
    const char *field = "hidden_activation";
    if (!act) {
        field = "hidden_act";
        if (optional_string(json, "hidden_act", "gelu_pytorch_tanh", &act) != 0) return -1;
        if (strcmp(act, "gelu") == 0) return 0; // legacy name for the tanh form
    }
    if (strcmp(act, "gelu_pytorch_tanh") != 0 && strcmp(act, "gelu_new") != 0)
        return err_set("config.json field '%s' is '%s'; gemma models must use 'gelu_pytorch_tanh' (%s)", field, act,
                       json->path);
    return 0;
}

// The sliding window (ModelConfig.sliding_window); null or absent where transformers has none.
static int read_sliding_window(const Json *json, ModelConfig *cfg) {
    int window = 0;
    json_t *value = json_object_get(json->root, "sliding_window");
    if (cfg->family == FAMILY_MISTRAL) {
        if (!value) window = 4096; // the transformers default
        else if (!json_is_null(value) && optional_int(json, "sliding_window", 0, &window) != 0) return -1;
    } else if (cfg->family == FAMILY_GEMMA2 || cfg->family == FAMILY_GEMMA3) {
        // Gemma 2 alternates sliding-window and global layers (Gemma 3 five sliding to one global).
        if (!value) window = 4096;
        else if (!json_is_null(value) && optional_int(json, "sliding_window", 4096, &window) != 0) return -1;
    } else if (cfg->family == FAMILY_QWEN2 || cfg->family == FAMILY_QWEN3) {
        bool used = false;
        if (optional_bool(json, "use_sliding_window", false, &used) != 0) return -1;
        if (used && value && !json_is_null(value) && optional_int(json, "sliding_window", 0, &window) != 0) return -1;
        if (used && optional_int(json, "max_window_layers", 28, &cfg->sliding_window_first_layer) != 0) return -1;
    }
    if (window < 0)
        return err_set("config.json field 'sliding_window' is %d; it must be positive or null (%s)", window, json->path);
    cfg->sliding_window = window;
    return 0;
}

// transformers 5's "layer_types" must name the layers marlhf slides (config_layer_window): each
// family's rule, which the field only spells out; another list is refused, naming the layer.
static int check_layer_types(const Json *json, const ModelConfig *cfg) {
    json_t *types = field_value(json, "layer_types");
    if (!types || cfg->sliding_window <= 0) return 0;
    if (!json_is_array(types) || (long)json_array_size(types) != cfg->num_layers)
        return err_set("config.json field 'layer_types' must be a list of num_hidden_layers (%d) names (%s)",
                       cfg->num_layers, json->path);
    for (int l = 0; l < cfg->num_layers; l++) {
        const char *name = json_string_value(json_array_get(types, (size_t)l));
        const char *want = config_layer_window(cfg, l) > 0 ? "sliding_attention" : "full_attention";
        if (!name || strcmp(name, want))
            return err_set("config.json field 'layer_types' entry %d is %s%s%s; marlhf's %s model has %s there (%s)", l,
                           name ? "\"" : "", name ? name : "not a string", name ? "\"" : "",
                           config_family_name(cfg->family), want, json->path);
    }
    return 0;
}

// A soft cap: absent is transformers' default, null is none (0).
static int soft_cap(const Json *json, const char *field, float fallback, float *out) {
    json_t *value = json_object_get(json->root, field);
    if (!value) {
        *out = fallback;
        return 0;
    }
    if (json_is_null(value)) {
        *out = 0.0f;
        return 0;
    }
    if (number_value(json, field, value, out) != 0) return -1;
    if (!(*out > 0.0f))
        return err_set("config.json field '%s' is %g; a soft cap must be positive or null (%s)", field, (double)*out,
                       json->path);
    return 0;
}

// Gemma 2's fields, with transformers' Gemma2Config defaults (Gemma 3's: no soft caps).
static int read_gemma2(const Json *json, ModelConfig *cfg) {
    const bool gemma3 = cfg->family == FAMILY_GEMMA3;
    if (soft_cap(json, "attn_logit_softcapping", gemma3 ? 0.0f : 50.0f, &cfg->attn_logit_softcap) ||
        soft_cap(json, "final_logit_softcapping", gemma3 ? 0.0f : 30.0f, &cfg->final_logit_softcap) ||
        optional_float(json, "query_pre_attn_scalar", 256.0f, &cfg->query_pre_attn_scalar))
        return -1;
    if (!(cfg->query_pre_attn_scalar > 0.0f))
        return err_set("config.json field 'query_pre_attn_scalar' is %g; it must be positive (%s)",
                       (double)cfg->query_pre_attn_scalar, json->path);
    bool bidirectional = false; // transformers 5's switch for Gemma-based embedding models
    if (optional_bool(json, "use_bidirectional_attention", false, &bidirectional) != 0) return -1;
    if (bidirectional)
        return err_set("config.json field 'use_bidirectional_attention' is true; bidirectional attention is not "
                       "implemented (%s)", json->path);
    return 0;
}

static int read_llama_like(const Json *json, ModelConfig *cfg) {
    const bool gemma2_like = cfg->family == FAMILY_GEMMA2 || cfg->family == FAMILY_GEMMA3;
    bool tied_by_default = cfg->family == FAMILY_GEMMA || gemma2_like;
    if (required_int(json, "hidden_size", &cfg->hidden_size) ||
        required_int(json, "num_hidden_layers", &cfg->num_layers) ||
        required_int(json, "num_attention_heads", &cfg->num_heads) ||
        optional_int(json, "num_key_value_heads", cfg->num_heads, &cfg->num_kv_heads) ||
        optional_int(json, "head_dim", 0, &cfg->head_dim) ||
        required_int(json, "intermediate_size", &cfg->intermediate_size) ||
        required_int(json, "max_position_embeddings", &cfg->max_position_embeddings) ||
        required_int(json, "vocab_size", &cfg->vocab_size) ||
        optional_float(json, "rms_norm_eps", 1e-6f, &cfg->norm_eps) ||
        optional_bool(json, "tie_word_embeddings", tied_by_default, &cfg->tie_word_embeddings))
        return -1;
    if (cfg->head_dim == 0 && gemma2_like) cfg->head_dim = 256; // Gemma2Config's and Gemma3TextConfig's default
    if (cfg->head_dim == 0 && cfg->num_heads > 0) cfg->head_dim = cfg->hidden_size / cfg->num_heads;
    if ((cfg->family == FAMILY_GEMMA3 ? read_gemma3_rope(json, cfg) || read_gemma3_layers(json, cfg)
                                      : read_rope(json, cfg, 10000.0f)) ||
        read_activation(json, cfg) || read_sliding_window(json, cfg) || check_layer_types(json, cfg))
        return -1;
    if (gemma2_like && read_gemma2(json, cfg) != 0) return -1;
    if (cfg->family == FAMILY_LLAMA) {
        bool mlp_bias = false;
        if (optional_bool(json, "mlp_bias", false, &mlp_bias) != 0) return -1;
        if (mlp_bias)
            return err_set("config.json field 'mlp_bias' is true; MLP biases are not implemented for llama (%s)",
                           json->path);
    }
    return 0;
}

// "quantization_config": absent or null, or bitsandbytes' (transformers' BitsAndBytesConfig as
// save_pretrained writes it): load_in_4bit with bnb_4bit_quant_type "nf4" or "fp4",
// bnb_4bit_use_double_quant and bnb_4bit_quant_storage "uint8" (the codes as bytes), or
// load_in_8bit. Other methods (GPTQ, AWQ, ...) are refused: their tensors are not float weights.
static int read_quantization(const Json *json, ModelConfig *cfg) {
    json_t *q = field_value(json, "quantization_config");
    if (!q) return 0;
    if (!json_is_object(q))
        return err_set("config.json field 'quantization_config' must be an object, not %s (%s)", json_kind(q),
                       json->path);
    Json inner = {q, json->path};
    const char *method = NULL, *quant_type = NULL, *storage = NULL;
    bool four = false, eight = false;
    if (optional_string(&inner, "quant_method", NULL, &method) != 0) return -1;
    if (!method || strcmp(method, "bitsandbytes"))
        return err_set("config.json field 'quantization_config.quant_method' is '%s'; marlhf reads bitsandbytes "
                       "checkpoints only (%s)", method ? method : "missing", json->path);
    if (optional_bool(&inner, "load_in_4bit", false, &four) != 0 || optional_bool(&inner, "load_in_8bit", false, &eight) != 0 ||
        optional_string(&inner, "bnb_4bit_quant_type", "fp4", &quant_type) != 0 ||
        optional_bool(&inner, "bnb_4bit_use_double_quant", false, &cfg->bnb_double_quant) != 0 ||
        optional_string(&inner, "bnb_4bit_quant_storage", "uint8", &storage) != 0)
        return -1;
    if (four == eight)
        return err_set("config.json field 'quantization_config' must set exactly one of load_in_4bit and "
                       "load_in_8bit (%s)", json->path);
    if (eight) {
        cfg->bnb_bits = 8;
        cfg->bnb_double_quant = false;
        return 0;
    }
    if (strcmp(quant_type, "nf4") && strcmp(quant_type, "fp4"))
        return err_set("config.json field 'quantization_config.bnb_4bit_quant_type' is '%s'; marlhf reads nf4 and "
                       "fp4 (%s)", quant_type, json->path);
    if (strcmp(storage, "uint8"))
        return err_set("config.json field 'quantization_config.bnb_4bit_quant_storage' is '%s'; marlhf reads uint8 "
                       "(%s)", storage, json->path);
    cfg->bnb_bits = 4;
    cfg->bnb_fp4 = !strcmp(quant_type, "fp4");
    return 0;
}

int config_from_hf_json(ModelConfig *cfg, const char *path) {
    memset(cfg, 0, sizeof *cfg);
    char *file_path = fs_is_dir(path) ? fs_join(path, "config.json") : xstrdup(path);
    char *text;
    size_t size;
    if (fs_read_file(file_path, CONFIG_MAX_BYTES, &text, &size) != 0) {
        free(file_path);
        return -1;
    }
    json_error_t error;
    Json json = {json_loadb(text, size, JSON_REJECT_DUPLICATES, &error), file_path};
    free(text);
    int rc = 0;
    if (!json.root)
        rc = err_set("bad JSON in config.json at line %d column %d: %s (%s)", error.line, error.column, error.text,
                     file_path);
    else if (!json_is_object(json.root))
        rc = err_set("config.json is not a JSON object (%s)", file_path);
    const char *model_type = NULL;
    if (rc == 0) {
        rc = optional_string(&json, "model_type", NULL, &model_type);
        if (rc == 0 && !model_type) rc = missing_field(&json, "model_type");
    }
    if (rc == 0 && !strcmp(model_type, "gemma3"))
        rc = err_set("config.json field 'model_type' is 'gemma3', a Gemma 3 model with its vision tower; marlhf reads "
                     "the text-only ones, model_type 'gemma3_text' (as gemma-3-1b) (%s)", file_path);
    else if (rc == 0 && config_family_from_name(model_type, &cfg->family) != 0)
        rc = err_set("config.json field 'model_type' is '%s'; marlhf supports gpt2, llama, mistral, qwen2, qwen3, "
                     "gemma, gemma2 and gemma3_text (%s)",
                     model_type, file_path);
    if (rc == 0) {
        snprintf(cfg->model_type, sizeof cfg->model_type, "%s", model_type);
        rc = cfg->family == FAMILY_GPT2 ? read_gpt2(&json, cfg) : read_llama_like(&json, cfg);
    }
    if (rc == 0)
        rc = token_id(&json, "bos_token_id", &cfg->bos_token_id) || token_id(&json, "eos_token_id", &cfg->eos_token_id) ||
                     token_id(&json, "pad_token_id", &cfg->pad_token_id)
                 ? -1
                 : 0;
    bool attention_bias = false;
    if (rc == 0 && (cfg->family == FAMILY_LLAMA || cfg->family == FAMILY_GEMMA || cfg->family == FAMILY_GEMMA2 ||
                    cfg->family == FAMILY_GEMMA3 || cfg->family == FAMILY_QWEN3))
        rc = optional_bool(&json, "attention_bias", false, &attention_bias);
    // config_finish sets the family's default switches; the file's own come after.
    if (rc == 0) rc = config_finish(cfg, file_path);
    if (rc == 0 && attention_bias) cfg->qkv_bias = cfg->o_bias = true;
    if (rc == 0) rc = read_quantization(&json, cfg);
    if (rc == 0 && cfg->bnb_bits && cfg->family == FAMILY_GPT2)
        rc = err_set("config.json: a bitsandbytes-quantized GPT-2 (fused, transposed Conv1D weights) is not supported "
                     "(%s)", file_path);
    json_decref(json.root);
    free(file_path);
    return rc;
}

// --- writer ----------------------------------------------------------------------

static const struct {
    ModelFamily family;
    const char *prefix; // class-name prefix in transformers
    const char *causal_lm;
} family_classes[] = {
    {FAMILY_GPT2, "GPT2", "GPT2LMHeadModel"},
    {FAMILY_LLAMA, "Llama", "LlamaForCausalLM"},
    {FAMILY_MISTRAL, "Mistral", "MistralForCausalLM"},
    {FAMILY_QWEN2, "Qwen2", "Qwen2ForCausalLM"},
    {FAMILY_GEMMA, "Gemma", "GemmaForCausalLM"},
    {FAMILY_QWEN3, "Qwen3", "Qwen3ForCausalLM"},
    {FAMILY_GEMMA2, "Gemma2", "Gemma2ForCausalLM"},
    {FAMILY_GEMMA3, "Gemma3", "Gemma3ForCausalLM"},
};

static int family_index(ModelFamily family) {
    for (int i = 0; i < (int)(sizeof family_classes / sizeof family_classes[0]); i++)
        if (family_classes[i].family == family) return i;
    CHECK(0, "unknown model family %d", (int)family);
    return -1;
}

const char *config_hf_causal_lm_architecture(ModelFamily family) {
    return family_classes[family_index(family)].causal_lm;
}

const char *config_hf_sequence_classification_architecture(ModelFamily family) {
    static const char *const names[] = {
        [FAMILY_GPT2] = "GPT2ForSequenceClassification",     [FAMILY_LLAMA] = "LlamaForSequenceClassification",
        [FAMILY_MISTRAL] = "MistralForSequenceClassification", [FAMILY_QWEN2] = "Qwen2ForSequenceClassification",
        [FAMILY_GEMMA] = "GemmaForSequenceClassification",     [FAMILY_QWEN3] = "Qwen3ForSequenceClassification",
        [FAMILY_GEMMA2] = "Gemma2ForSequenceClassification",
        [FAMILY_GEMMA3] = "Gemma3TextForSequenceClassification",
    };
    CHECK((unsigned)family < sizeof names / sizeof names[0] && names[family], "unknown family %d", (int)family);
    return names[family];
}

// The shortest decimal that reads back as exactly `value` as a float, as a JSON
// number (so 1e-6f is written "1e-06", not "9.9999999747524271e-07").
static json_t *json_float(float value) {
    char text[32];
    for (int digits = 1; digits <= 9; digits++) {
        snprintf(text, sizeof text, "%.*g", digits, (double)value);
        if (strtof(text, NULL) == value) break;
    }
    return json_real(strtod(text, NULL));
}

static json_t *json_token(int id) { return id >= 0 ? json_integer(id) : json_null(); }

static bool ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

// What transformers' classes of the family can and cannot express.
static int check_expressible(const ModelConfig *cfg, const char *path) {
    const char *problem = NULL;
    switch (cfg->family) {
    case FAMILY_GPT2:
        if (cfg->num_kv_heads != cfg->num_heads) problem = "grouped-query attention";
        break;
    case FAMILY_LLAMA:
    case FAMILY_GEMMA:
    case FAMILY_GEMMA2:
    case FAMILY_GEMMA3:
        if (cfg->qkv_bias != cfg->o_bias) problem = "q/k/v biases without an output bias (or the reverse)";
        else if (cfg->mlp_bias) problem = "MLP biases";
        break;
    case FAMILY_MISTRAL:
        if (cfg->qkv_bias || cfg->o_bias || cfg->mlp_bias) problem = "biases";
        break;
    case FAMILY_QWEN2:
        if (!cfg->qkv_bias || cfg->o_bias || cfg->mlp_bias) problem = "biases other than on q/k/v";
        break;
    case FAMILY_QWEN3:
        if (cfg->qkv_bias != cfg->o_bias) problem = "q/k/v biases without an output bias (or the reverse)";
        else if (cfg->mlp_bias) problem = "MLP biases";
        break;
    }
    if (problem)
        return err_set("cannot write config.json: %s cannot be expressed for model_type %s (%s)", problem,
                       config_family_name(cfg->family), path);
    return 0;
}

// The RoPE settings the 4.x way (rope_theta, rope_scaling) and the 5.x way
// (rope_parameters), so that either version of transformers reads them.
static json_t *rope_dict(const ModelConfig *cfg, bool with_theta) {
    json_t *dict = json_object();
    if (cfg->rope_scaling == ROPE_SCALING_NONE) {
        json_object_set_new(dict, "rope_type", json_string("default"));
    } else if (cfg->rope_scaling == ROPE_SCALING_LINEAR) {
        json_object_set_new(dict, "rope_type", json_string("linear"));
        json_object_set_new(dict, "factor", json_float(cfg->rope_factor));
    } else {
        json_object_set_new(dict, "rope_type", json_string("llama3"));
        json_object_set_new(dict, "factor", json_float(cfg->rope_factor));
        json_object_set_new(dict, "low_freq_factor", json_float(cfg->rope_low_freq_factor));
        json_object_set_new(dict, "high_freq_factor", json_float(cfg->rope_high_freq_factor));
        json_object_set_new(dict, "original_max_position_embeddings", json_integer(cfg->rope_original_max_positions));
    }
    if (with_theta) json_object_set_new(dict, "rope_theta", json_float(cfg->rope_theta));
    return dict;
}

static void add_rope_fields(json_t *root, const ModelConfig *cfg) {
    json_object_set_new(root, "rope_theta", json_float(cfg->rope_theta));
    json_object_set_new(root, "rope_scaling", cfg->rope_scaling == ROPE_SCALING_NONE ? json_null() : rope_dict(cfg, false));
    json_object_set_new(root, "rope_parameters", rope_dict(cfg, true));
}

// Gemma 3's RoPE and layer types both ways: 4.x's rope_theta, rope_scaling,
// rope_local_base_freq and sliding_window_pattern, 5.x's per-layer-type rope_parameters and
// layer_types.
static void add_gemma3_rope_fields(json_t *root, const ModelConfig *cfg) {
    json_object_set_new(root, "rope_theta", json_float(cfg->rope_theta));
    json_object_set_new(root, "rope_scaling", cfg->rope_scaling == ROPE_SCALING_NONE ? json_null() : rope_dict(cfg, false));
    json_object_set_new(root, "rope_local_base_freq", json_float(cfg->rope_local_theta));
    ModelConfig local = *cfg;
    local.rope_scaling = ROPE_SCALING_NONE, local.rope_theta = cfg->rope_local_theta;
    json_object_set_new(root, "rope_parameters", json_pack("{s:o, s:o}", "full_attention", rope_dict(cfg, true),
                                                           "sliding_attention", rope_dict(&local, true)));
    json_object_set_new(root, "sliding_window_pattern", json_integer(cfg->sliding_window_pattern));
    json_t *types = json_array();
    for (int l = 0; l < cfg->num_layers; l++)
        json_array_append_new(types, json_string(config_layer_uses_local_rope(cfg, l) ? "sliding_attention"
                                                                                      : "full_attention"));
    json_object_set_new(root, "layer_types", types);
}

int config_write_hf_json(const ModelConfig *cfg, const char *path, const char *architecture) {
    const char *prefix = family_classes[family_index(cfg->family)].prefix;
    // "LlamaFor...", "GPT2LMHeadModel" — but not "Gemma2ForCausalLM" for a gemma config
    // ("Gemma3TextFor...": Gemma 3's text-only classes but its causal LM).
    const char *rest = architecture ? architecture + strlen(prefix) : NULL;
    if (rest && cfg->family == FAMILY_GEMMA3 && !strncmp(rest, "Text", 4)) rest += 4;
    if (!architecture || strncmp(architecture, prefix, strlen(prefix)) != 0 ||
        (strncmp(rest, "For", 3) != 0 && strcmp(rest, "LMHeadModel") != 0 && strcmp(rest, "Model") != 0))
        return err_set("cannot write config.json: architecture '%s' is not a %s class (%s)",
                       architecture ? architecture : "(none)", config_family_name(cfg->family), path);
    ModelConfig finished = *cfg;
    if (config_finish(&finished, path) != 0 || check_expressible(cfg, path) != 0) return -1;

    json_t *root = json_object();
    json_object_set_new(root, "architectures", json_pack("[s]", architecture));
    json_object_set_new(root, "model_type", json_string(config_family_name(cfg->family)));
    json_object_set_new(root, "vocab_size", json_integer(cfg->vocab_size));
    if (cfg->family == FAMILY_GPT2) {
        json_object_set_new(root, "n_embd", json_integer(cfg->hidden_size));
        json_object_set_new(root, "n_layer", json_integer(cfg->num_layers));
        json_object_set_new(root, "n_head", json_integer(cfg->num_heads));
        json_object_set_new(root, "n_positions", json_integer(cfg->max_position_embeddings));
        json_object_set_new(root, "n_inner", json_integer(cfg->intermediate_size));
        json_object_set_new(root, "activation_function", json_string("gelu_new"));
        json_object_set_new(root, "layer_norm_epsilon", json_float(cfg->norm_eps));
    } else {
        json_object_set_new(root, "hidden_size", json_integer(cfg->hidden_size));
        json_object_set_new(root, "intermediate_size", json_integer(cfg->intermediate_size));
        json_object_set_new(root, "num_hidden_layers", json_integer(cfg->num_layers));
        json_object_set_new(root, "num_attention_heads", json_integer(cfg->num_heads));
        json_object_set_new(root, "num_key_value_heads", json_integer(cfg->num_kv_heads));
        json_object_set_new(root, "head_dim", json_integer(finished.head_dim));
        json_object_set_new(root, "max_position_embeddings", json_integer(cfg->max_position_embeddings));
        json_object_set_new(root, "rms_norm_eps", json_float(cfg->norm_eps));
        const bool gemma2_like = cfg->family == FAMILY_GEMMA2 || cfg->family == FAMILY_GEMMA3;
        if (cfg->family == FAMILY_GEMMA3) add_gemma3_rope_fields(root, cfg);
        else add_rope_fields(root, cfg);
        json_object_set_new(root, "hidden_act",
                            json_string(cfg->family == FAMILY_GEMMA || gemma2_like ? "gelu_pytorch_tanh" : "silu"));
        if (cfg->family == FAMILY_LLAMA || cfg->family == FAMILY_GEMMA || gemma2_like || cfg->family == FAMILY_QWEN3)
            json_object_set_new(root, "attention_bias", json_boolean(cfg->qkv_bias));
        if (gemma2_like) {
            // transformers 4.x reads hidden_activation first.
            json_object_set_new(root, "hidden_activation", json_string("gelu_pytorch_tanh"));
            // transformers 5's Gemma2Config and Gemma3TextConfig take an int only.
            const float scalar = finished.query_pre_attn_scalar > 0.0f ? finished.query_pre_attn_scalar
                                                                       : (float)finished.head_dim;
            json_object_set_new(root, "query_pre_attn_scalar",
                                scalar == floorf(scalar) && scalar < 1e9f ? json_integer((json_int_t)scalar)
                                                                          : json_float(scalar));
            json_object_set_new(root, "attn_logit_softcapping",
                                cfg->attn_logit_softcap > 0.0f ? json_float(cfg->attn_logit_softcap) : json_null());
            json_object_set_new(root, "final_logit_softcapping",
                                cfg->final_logit_softcap > 0.0f ? json_float(cfg->final_logit_softcap) : json_null());
            // Gemma's configs take an integer: without a window, the whole context is one.
            json_object_set_new(root, "sliding_window", json_integer(cfg->sliding_window > 0 ? cfg->sliding_window
                                                                                             : cfg->max_position_embeddings));
        }
        if (cfg->family == FAMILY_LLAMA) json_object_set_new(root, "mlp_bias", json_false());
        if (cfg->family == FAMILY_MISTRAL || cfg->family == FAMILY_QWEN2 || cfg->family == FAMILY_QWEN3)
            json_object_set_new(root, "sliding_window",
                                cfg->sliding_window > 0 ? json_integer(cfg->sliding_window) : json_null());
        if (cfg->family == FAMILY_QWEN2 || cfg->family == FAMILY_QWEN3) {
            json_object_set_new(root, "use_sliding_window", json_boolean(cfg->sliding_window > 0));
            if (cfg->sliding_window > 0)
                json_object_set_new(root, "max_window_layers", json_integer(cfg->sliding_window_first_layer));
        }
    }
    json_object_set_new(root, "tie_word_embeddings", json_boolean(cfg->tie_word_embeddings));
    json_object_set_new(root, "bos_token_id", json_token(cfg->bos_token_id));
    json_object_set_new(root, "eos_token_id", json_token(cfg->eos_token_id));
    json_object_set_new(root, "pad_token_id", json_token(cfg->pad_token_id));
    // "dtype" for transformers 5.x, "torch_dtype" for 4.x; 5.x keeps "dtype" when both are there.
    json_object_set_new(root, "dtype", json_string("float32"));
    json_object_set_new(root, "torch_dtype", json_string("float32"));
    if (ends_with(architecture, "ForSequenceClassification")) {
        // One label: a scalar score (reward model / value head).
        json_object_set_new(root, "num_labels", json_integer(1));
        json_object_set_new(root, "id2label", json_pack("{s:s}", "0", "LABEL_0"));
        json_object_set_new(root, "label2id", json_pack("{s:i}", "LABEL_0", 0));
    }
    int rc = json_write_file(path, root, JSON_INDENT(2) | JSON_REAL_PRECISION(9));
    json_decref(root);
    return rc;
}
