#include "model/config_gguf.h"

#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/check.h"
#include "io/gguf_dequant.h"

float config_gguf_gemma_query_scalar(const ModelConfig *cfg) {
    const int head_dim = cfg->head_dim > 0 ? cfg->head_dim : cfg->num_heads > 0 ? cfg->hidden_size / cfg->num_heads : 0;
    const int layers_27b = cfg->family == FAMILY_GEMMA3 ? 62 : 46;
    if (cfg->num_layers == layers_27b && cfg->num_heads > 0) return (float)(cfg->hidden_size / cfg->num_heads);
    return (float)head_dim;
}

// "<arch>.<suffix>", the way llama.cpp names per-architecture keys.
static void arch_key(char *key, size_t size, const char *arch, const char *suffix) {
    snprintf(key, size, "%s.%s", arch, suffix);
}

static int get_int(const GgufFile *f, const char *key, int *out) {
    uint32_t value;
    if (gguf_get_u32(f, key, &value) < 0) return -1;
    if (value > INT_MAX) return err_set("GGUF metadata key '%s' value %u is too large (%s)", key, value, f->path);
    *out = (int)value;
    return 0;
}

static int get_arch_int(const GgufFile *f, const char *arch, const char *suffix, int *out) {
    char key[128];
    arch_key(key, sizeof key, arch, suffix);
    return get_int(f, key, out);
}

// Leaves *out alone when the key is absent.
static int get_optional_arch_int(const GgufFile *f, const char *arch, const char *suffix, int *out) {
    char key[128];
    arch_key(key, sizeof key, arch, suffix);
    return gguf_find(f, key) ? get_int(f, key, out) : 0;
}

// A token id, or -1 when the file names none.
static int get_token_id(const GgufFile *f, const char *key, int *out) {
    *out = -1;
    return gguf_find(f, key) ? get_int(f, key, out) : 0;
}

static int read_vocab_size(const GgufFile *f, const char *arch, int *out) {
    char key[128];
    arch_key(key, sizeof key, arch, "vocab_size");
    if (gguf_find(f, key)) return get_int(f, key, out);
    if (!gguf_find(f, "tokenizer.ggml.tokens"))
        return err_set("GGUF file has neither '%s' nor 'tokenizer.ggml.tokens', so no vocabulary size (%s)", key,
                       f->path);
    const GgufValue *tokens;
    if (gguf_get_string_array(f, "tokenizer.ggml.tokens", &tokens) < 0) return -1;
    if (gguf_array_count(tokens) > INT_MAX)
        return err_set("GGUF tokenizer.ggml.tokens has too many entries (%s)", f->path);
    *out = (int)gguf_array_count(tokens);
    return 0;
}

static int read_norm_eps(const GgufFile *f, const char *arch, float *out) {
    char rms_key[128], ln_key[128];
    arch_key(rms_key, sizeof rms_key, arch, "attention.layer_norm_rms_epsilon");
    arch_key(ln_key, sizeof ln_key, arch, "attention.layer_norm_epsilon");
    if (gguf_find(f, rms_key)) return gguf_get_f32(f, rms_key, out);
    if (gguf_find(f, ln_key)) return gguf_get_f32(f, ln_key, out);
    return err_set("GGUF metadata key '%s' (or '%s') is missing (%s)", rms_key, ln_key, f->path);
}

// RoPE scaling as llama.cpp stores it: "<arch>.rope.scaling.type" linear with its factor,
// or (Llama 3.1/3.2) a rope_freqs.weight tensor of per-dimension divisors, which no key
// describes. Those divisors are recognised as Llama 3's scaling with Meta's settings (low
// and high frequency factors 1 and 4, an original context of 8192 or the file's
// rope.scaling.original_context_length) so that the model saves as a transformers config;
// other divisors are refused rather than run as plain RoPE.
static int read_rope_scaling(const GgufFile *f, const char *arch, ModelConfig *cfg, const char *path) {
    char key[128];
    arch_key(key, sizeof key, arch, "rope.scaling.type");
    if (gguf_find(f, key)) {
        char *type;
        if (gguf_get_string(f, key, &type) < 0) return -1;
        int rc = 0;
        if (!strcmp(type, "linear")) {
            cfg->rope_scaling = ROPE_SCALING_LINEAR;
            arch_key(key, sizeof key, arch, "rope.scaling.factor");
            rc = gguf_get_f32(f, key, &cfg->rope_factor);
        } else if (strcmp(type, "none") != 0) {
            rc = err_set("unsupported RoPE scaling '%.32s' in GGUF key %s.rope.scaling.type: plain RoPE, linear and "
                         "Llama 3's are implemented (%s)", type, arch, path);
        }
        free(type);
        if (rc != 0) return -1;
    }
    const GgufTensor *tensor = gguf_find_tensor(f, "rope_freqs.weight");
    if (!tensor) return 0;
    const int half = cfg->head_dim / 2;
    if (cfg->rope_scaling != ROPE_SCALING_NONE || tensor->n_elements != half)
        return err_set("GGUF tensor rope_freqs.weight has %lld values for head_dim %d, or comes with another RoPE "
                       "scaling (%s)", (long long)tensor->n_elements, cfg->head_dim, path);
    float *stored = xmalloc((size_t)half * sizeof(float)), *expected = xmalloc((size_t)half * sizeof(float));
    int rc = gguf_tensor_to_f32(f, tensor, stored);
    float factor = 1.0f;
    for (int i = 0; rc == 0 && i < half; i++) factor = fmaxf(factor, stored[i]);
    int original = 8192;
    arch_key(key, sizeof key, arch, "rope.scaling.original_context_length");
    if (rc == 0 && gguf_find(f, key)) rc = get_int(f, key, &original);
    if (rc == 0) {
        cfg->rope_scaling = ROPE_SCALING_LLAMA3;
        cfg->rope_factor = factor, cfg->rope_low_freq_factor = 1.0f, cfg->rope_high_freq_factor = 4.0f;
        cfg->rope_original_max_positions = original;
        rope_frequency_factors(cfg, expected);
        double worst = 0;
        for (int i = 0; i < half; i++) worst = fmax(worst, fabs((double)stored[i] - expected[i]) / expected[i]);
        if (!(worst <= 1e-4))
            rc = err_set("GGUF tensor rope_freqs.weight is not Llama 3's RoPE scaling (factor %g, low and high "
                         "frequency factors 1 and 4, original context %d; off by %.3g): unsupported (%s)",
                         (double)factor, original, worst, path);
    }
    free(stored), free(expected);
    return rc;
}

int config_from_gguf(ModelConfig *cfg, const GgufFile *f, const char *path) {
    memset(cfg, 0, sizeof *cfg);
    char *arch;
    if (gguf_get_string(f, "general.architecture", &arch) < 0) return -1;
    // llama.cpp names Gemma 3's text model "gemma3" (transformers: "gemma3_text").
    if (!strcmp(arch, "gemma3")) cfg->family = FAMILY_GEMMA3;
    else if (strlen(arch) > 64 || config_family_from_name(arch, &cfg->family) < 0) {
        err_set("unsupported GGUF architecture '%.64s', expected llama, mistral, qwen2, qwen3, gemma, gemma2, gemma3 or gpt2 "
                "(%s)", arch, path);
        free(arch);
        return -1;
    }

    int rc = -1;
    if (get_arch_int(f, arch, "embedding_length", &cfg->hidden_size) < 0) goto done;
    if (get_arch_int(f, arch, "block_count", &cfg->num_layers) < 0) goto done;
    if (get_arch_int(f, arch, "attention.head_count", &cfg->num_heads) < 0) goto done;
    cfg->num_kv_heads = cfg->num_heads;
    if (get_optional_arch_int(f, arch, "attention.head_count_kv", &cfg->num_kv_heads) < 0) goto done;
    if (get_arch_int(f, arch, "feed_forward_length", &cfg->intermediate_size) < 0) goto done;
    if (get_arch_int(f, arch, "context_length", &cfg->max_position_embeddings) < 0) goto done;
    if (get_optional_arch_int(f, arch, "attention.key_length", &cfg->head_dim) < 0) goto done;
    if (read_norm_eps(f, arch, &cfg->norm_eps) < 0) goto done;
    cfg->rope_theta = 10000.0f;
    char key[128];
    arch_key(key, sizeof key, arch, "rope.freq_base");
    if (gguf_find(f, key) && gguf_get_f32(f, key, &cfg->rope_theta) < 0) goto done;
    if (read_vocab_size(f, arch, &cfg->vocab_size) < 0) goto done;
    if (get_token_id(f, "tokenizer.ggml.bos_token_id", &cfg->bos_token_id) < 0) goto done;
    if (get_token_id(f, "tokenizer.ggml.eos_token_id", &cfg->eos_token_id) < 0) goto done;
    if (get_token_id(f, "tokenizer.ggml.padding_token_id", &cfg->pad_token_id) < 0) goto done;
    // llama.cpp's converters leave out output.weight when the head shares the embedding.
    cfg->tie_word_embeddings = gguf_find_tensor(f, "output.weight") == NULL;
    if (config_finish(cfg, path) < 0) goto done;
    if (cfg->positions == POSITIONS_ROPE && read_rope_scaling(f, arch, cfg, path) < 0) goto done;
    if (cfg->family == FAMILY_GEMMA2) {
        float attn_cap = 50.0f, final_cap = 30.0f; // llama.cpp's defaults when a key is missing
        arch_key(key, sizeof key, arch, "attn_logit_softcapping");
        if (gguf_find(f, key) && gguf_get_f32(f, key, &attn_cap) < 0) goto done;
        arch_key(key, sizeof key, arch, "final_logit_softcapping");
        if (gguf_find(f, key) && gguf_get_f32(f, key, &final_cap) < 0) goto done;
        cfg->attn_logit_softcap = attn_cap, cfg->final_logit_softcap = final_cap;
        cfg->query_pre_attn_scalar = config_gguf_gemma_query_scalar(cfg);
    }
    if (cfg->family == FAMILY_GEMMA3) {
        cfg->sliding_window_pattern = GGUF_GEMMA3_PATTERN, cfg->rope_local_theta = GGUF_GEMMA3_LOCAL_THETA;
        cfg->query_pre_attn_scalar = config_gguf_gemma_query_scalar(cfg);
    }
    // The sliding window: Gemma 2's and 3's (llama.cpp's default 4096 when the key is
    // missing), or a Mistral checkpoint's under "llama" (model_write_gguf; none without it).
    const bool gemma2_like = cfg->family == FAMILY_GEMMA2 || cfg->family == FAMILY_GEMMA3;
    if (gemma2_like || cfg->family == FAMILY_LLAMA) {
        int window = gemma2_like ? 4096 : 0;
        if (get_optional_arch_int(f, arch, "attention.sliding_window", &window) < 0) goto done;
        cfg->sliding_window = window > 0 ? window : 0;
    }
    if (config_finish(cfg, path) < 0) goto done; // checks the scaling too
    // llama.cpp's Gemma converter stores RMSNorm weights as (1 + weight). The config keeps
    // Hugging Face's convention (scale by 1 + w); model/weights_io.c subtracts the 1 when it
    // loads those tensors, so a converted model matches transformers.
    rc = 0;
done:
    free(arch);
    return rc;
}
