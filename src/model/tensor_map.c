// Where each parameter of the table sits in a Hugging Face or GGUF file, and how it is
// transformed on the way in (tensor_map_load) and out (tensor_map_store).
#include "model/tensor_map.h"

#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "core/check.h"

void tensor_map_set_shape(TensorMap *map, long long rows, long long cols) {
    map->ndim = cols > 0 ? 2 : 1;
    map->shape[0] = rows;
    map->shape[1] = cols;
}

// Fills `map` for entry `e`. `suffix` is the name after "model.layers.<l>." (or the whole
// name for global tensors); `layer` is -1 for globals.
static void map_hf_gpt2(const ModelConfig *cfg, const ParamEntry *e, int layer, const char *suffix,
                        const char *prefix, TensorMap *map) {
    const long long C = cfg->hidden_size;
    char base[96];
    snprintf(base, sizeof base, "%sh.%d.", prefix, layer);
    struct {
        const char *ours, *theirs;
        MapKind kind;
        int part;
    } layer_names[] = {
        {"input_layernorm.weight", "ln_1.weight", MAP_COPY, 0},
        {"input_layernorm.bias", "ln_1.bias", MAP_COPY, 0},
        {"self_attn.q_proj.weight", "attn.c_attn.weight", MAP_TRANSPOSED_COLUMN_SLICE, 0},
        {"self_attn.k_proj.weight", "attn.c_attn.weight", MAP_TRANSPOSED_COLUMN_SLICE, 1},
        {"self_attn.v_proj.weight", "attn.c_attn.weight", MAP_TRANSPOSED_COLUMN_SLICE, 2},
        {"self_attn.q_proj.bias", "attn.c_attn.bias", MAP_ROW_SLICE, 0},
        {"self_attn.k_proj.bias", "attn.c_attn.bias", MAP_ROW_SLICE, 1},
        {"self_attn.v_proj.bias", "attn.c_attn.bias", MAP_ROW_SLICE, 2},
        {"self_attn.o_proj.weight", "attn.c_proj.weight", MAP_TRANSPOSE, 0},
        {"self_attn.o_proj.bias", "attn.c_proj.bias", MAP_COPY, 0},
        {"post_attention_layernorm.weight", "ln_2.weight", MAP_COPY, 0},
        {"post_attention_layernorm.bias", "ln_2.bias", MAP_COPY, 0},
        {"mlp.up_proj.weight", "mlp.c_fc.weight", MAP_TRANSPOSE, 0},
        {"mlp.up_proj.bias", "mlp.c_fc.bias", MAP_COPY, 0},
        {"mlp.down_proj.weight", "mlp.c_proj.weight", MAP_TRANSPOSE, 0},
        {"mlp.down_proj.bias", "mlp.c_proj.bias", MAP_COPY, 0},
    };
    struct {
        const char *ours, *theirs;
    } global_names[] = {
        {"model.embed_tokens.weight", "wte.weight"},
        {"model.embed_positions.weight", "wpe.weight"},
        {"model.norm.weight", "ln_f.weight"},
        {"model.norm.bias", "ln_f.bias"},
    };
    tensor_map_set_shape(map, e->shape[0], e->shape[1]);
    map->kind = MAP_COPY;
    if (layer < 0) {
        snprintf(map->source, sizeof map->source, "%s", e->name);
        for (size_t i = 0; i < sizeof global_names / sizeof global_names[0]; i++)
            if (strcmp(e->name, global_names[i].ours) == 0)
                snprintf(map->source, sizeof map->source, "%s%s", prefix, global_names[i].theirs);
        return;
    }
    for (size_t i = 0; i < sizeof layer_names / sizeof layer_names[0]; i++) {
        if (strcmp(suffix, layer_names[i].ours) != 0) continue;
        snprintf(map->source, sizeof map->source, "%s%s", base, layer_names[i].theirs);
        map->kind = layer_names[i].kind;
        map->part = layer_names[i].part;
        map->parts = 3;
        if (map->kind == MAP_TRANSPOSE) tensor_map_set_shape(map, e->shape[1], e->shape[0]);
        if (map->kind == MAP_TRANSPOSED_COLUMN_SLICE) tensor_map_set_shape(map, C, 3 * C);
        if (map->kind == MAP_ROW_SLICE) tensor_map_set_shape(map, 3 * C, 0);
        return;
    }
    CHECK(0, "no GPT-2 mapping for parameter %s", e->name);
}

static void map_gguf(const ModelConfig *cfg, const ParamEntry *e, int layer, const char *suffix,
                     TensorMap *map) {
    // llama.cpp stores Gemma's norm weights w of (1 + w) as 1 + w.
    const bool gemma = cfg->family == FAMILY_GEMMA || cfg->family == FAMILY_GEMMA2 || cfg->family == FAMILY_GEMMA3;
    // llama.cpp converts Llama and Mistral checkpoints with permuted q/k rows.
    const bool permuted = cfg->family == FAMILY_LLAMA || cfg->family == FAMILY_MISTRAL;
    const bool fused_qkv = cfg->family == FAMILY_GPT2;
    tensor_map_set_shape(map, e->shape[0], e->shape[1]);
    map->kind = MAP_COPY;
    if (layer < 0) {
        const char *theirs = e->name;
        if (!strcmp(e->name, "model.embed_tokens.weight")) theirs = "token_embd.weight";
        else if (!strcmp(e->name, "model.embed_positions.weight")) theirs = "position_embd.weight";
        else if (!strcmp(e->name, "model.norm.weight")) theirs = "output_norm.weight", map->kind = gemma ? MAP_MINUS_ONE : MAP_COPY;
        else if (!strcmp(e->name, "model.norm.bias")) theirs = "output_norm.bias";
        else if (!strcmp(e->name, "lm_head.weight")) theirs = "output.weight";
        snprintf(map->source, sizeof map->source, "%s", theirs);
        return;
    }
    struct {
        const char *ours, *theirs;
    } names[] = {
        {"input_layernorm.weight", "attn_norm.weight"},
        {"input_layernorm.bias", "attn_norm.bias"},
        {"self_attn.q_proj.weight", "attn_q.weight"},
        {"self_attn.k_proj.weight", "attn_k.weight"},
        {"self_attn.v_proj.weight", "attn_v.weight"},
        {"self_attn.q_proj.bias", "attn_q.bias"},
        {"self_attn.k_proj.bias", "attn_k.bias"},
        {"self_attn.v_proj.bias", "attn_v.bias"},
        {"self_attn.q_norm.weight", "attn_q_norm.weight"},
        {"self_attn.k_norm.weight", "attn_k_norm.weight"},
        {"self_attn.o_proj.weight", "attn_output.weight"},
        {"self_attn.o_proj.bias", "attn_output.bias"},
        {"post_attention_layernorm.weight", "ffn_norm.weight"},
        {"post_attention_layernorm.bias", "ffn_norm.bias"},
        {"mlp.gate_proj.weight", "ffn_gate.weight"},
        {"mlp.up_proj.weight", "ffn_up.weight"},
        {"mlp.up_proj.bias", "ffn_up.bias"},
        {"mlp.down_proj.weight", "ffn_down.weight"},
        {"mlp.down_proj.bias", "ffn_down.bias"},
        // Gemma 2's sandwich norms (model/params.c)
        {"pre_feedforward_layernorm.weight", "ffn_norm.weight"},
        {"post_feedforward_layernorm.weight", "post_ffw_norm.weight"},
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        if (strcmp(suffix, names[i].ours) != 0) continue;
        const char *theirs = names[i].theirs;
        // With sandwich norms post_attention_layernorm is the attention output's norm (the
        // MLP's input norm is pre_feedforward_layernorm).
        if (cfg->sandwich_norms && !strcmp(suffix, "post_attention_layernorm.weight"))
            theirs = "post_attention_norm.weight";
        bool is_q = !strcmp(suffix, "self_attn.q_proj.weight"), is_k = !strcmp(suffix, "self_attn.k_proj.weight");
        bool is_qkv = !strncmp(suffix, "self_attn.q_proj", 16) || !strncmp(suffix, "self_attn.k_proj", 16) ||
                      !strncmp(suffix, "self_attn.v_proj", 16);
        if (fused_qkv && is_qkv) {
            bool is_bias = strstr(suffix, ".bias") != NULL;
            theirs = is_bias ? "attn_qkv.bias" : "attn_qkv.weight";
            map->kind = MAP_ROW_SLICE;
            map->parts = 3;
            map->part = suffix[10] == 'q' ? 0 : suffix[10] == 'k' ? 1 : 2;
            tensor_map_set_shape(map, 3 * e->shape[0], e->shape[1]);
        } else if (permuted && (is_q || is_k)) {
            map->kind = MAP_UNPERMUTE_ROPE;
            map->heads = is_q ? cfg->num_heads : cfg->num_kv_heads;
        } else if (gemma && strstr(suffix, "norm.weight")) {
            map->kind = MAP_MINUS_ONE;
        }
        snprintf(map->source, sizeof map->source, "blk.%d.%s", layer, theirs);
        return;
    }
    CHECK(0, "no GGUF mapping for parameter %s", e->name);
}

// Moves entry `e` between the file's layout (`file`, the whole file tensor) and the
// table's (`table`, e->numel floats): into the table when loading, out of it when saving.
// Each case says once where an element or row sits on both sides, so load and store
// cannot drift apart.
static void transfer(const TensorMap *map, const ParamEntry *e, float *file, float *table, bool loading) {
#define MOVE(file_at, table_at, count)                                                                  \
    (loading ? memcpy(table + (table_at), file + (file_at), (size_t)(count) * sizeof(float))            \
             : memcpy(file + (file_at), table + (table_at), (size_t)(count) * sizeof(float)))
    const long rows = e->shape[0], cols = e->ndim == 2 ? e->shape[1] : 1;
    switch (map->kind) {
    case MAP_COPY:
        MOVE(0, 0, e->numel);
        break;
    case MAP_MINUS_ONE: // the file holds 1 + w
        for (long i = 0; i < e->numel; i++) {
            if (loading) table[i] = file[i] - 1.0f;
            else file[i] = table[i] + 1.0f;
        }
        break;
    case MAP_TRANSPOSE: // the file is [cols, rows]
        for (long r = 0; r < rows; r++)
            for (long c = 0; c < cols; c++) MOVE(c * rows + r, r * cols + c, 1);
        break;
    case MAP_ROW_SLICE:
        MOVE((long)map->part * e->numel, 0, e->numel);
        break;
    case MAP_TRANSPOSED_COLUMN_SLICE: { // the file is [cols (in features), parts*rows]
        long file_cols = (long)map->parts * rows;
        for (long r = 0; r < rows; r++)
            for (long c = 0; c < cols; c++) MOVE(c * file_cols + (long)map->part * rows + r, r * cols + c, 1);
        break;
    }
    case MAP_UNPERMUTE_ROPE: {
        // llama.cpp row h*hd + 2i + s holds HF row h*hd + s*hd/2 + i.
        long head_dim = rows / map->heads, half = head_dim / 2;
        for (long h = 0; h < map->heads; h++)
            for (long i = 0; i < half; i++)
                for (long s = 0; s < 2; s++) MOVE((h * head_dim + 2 * i + s) * cols, (h * head_dim + s * half + i) * cols, cols);
        break;
    }
    }
#undef MOVE
}

void tensor_map_load(const TensorMap *map, const ParamEntry *e, const float *in, float *out) {
    transfer(map, e, (float *)in, out, true); // `in` is only read
}

void tensor_map_store(const TensorMap *map, const ParamEntry *e, const float *in, float *out) {
    transfer(map, e, out, (float *)in, false); // `in` is only read
}

long tensor_map_file_row(const TensorMap *map, const ParamEntry *e, long r) {
    if (e->ndim != 2) return -1;
    switch (map->kind) {
    case MAP_COPY: return r;
    case MAP_ROW_SLICE: return (long)map->part * e->shape[0] + r;
    case MAP_UNPERMUTE_ROPE: { // the inverse of transfer()'s row formula
        const long head_dim = e->shape[0] / map->heads, half = head_dim / 2;
        const long h = r / head_dim, s = r % head_dim / half, i = r % head_dim % half;
        return h * head_dim + 2 * i + s;
    }
    default: return -1;
    }
}

long long tensor_map_numel(const TensorMap *map) {
    return map->ndim == 2 ? map->shape[0] * map->shape[1] : map->shape[0];
}


// "model.layers.<l>.<suffix>" -> layer and suffix; globals: -1 and the whole name.
static const char *entry_suffix(const ParamEntry *e, int *layer) {
    *layer = e->layer;
    if (e->layer < 0) return e->name;
    return strchr(e->name + strlen("model.layers."), '.') + 1;
}

void tensor_map_gguf(const ModelConfig *cfg, const ParamEntry *e, TensorMap *map) {
    memset(map, 0, sizeof *map);
    int layer;
    const char *suffix = entry_suffix(e, &layer);
    map_gguf(cfg, e, layer, suffix, map);
}

void tensor_map_hf(const ModelConfig *cfg, const ParamEntry *e, const char *gpt2_prefix, TensorMap *map) {
    memset(map, 0, sizeof *map);
    int layer;
    const char *suffix = entry_suffix(e, &layer);
    if (cfg->family == FAMILY_GPT2) {
        map_hf_gpt2(cfg, e, layer, suffix, gpt2_prefix, map);
        return;
    }
    snprintf(map->source, sizeof map->source, "%s", e->name);
    map->kind = MAP_COPY;
    tensor_map_set_shape(map, e->shape[0], e->shape[1]);
}
