#include "model/params.h"

#include <stdio.h>
#include <string.h>

#include "core/check.h"

bool param_name_decays(const char *name) {
    return !(strstr(name, "bias") || strstr(name, "norm") || strstr(name, "embed"));
}

static void add_entry(ParamTable *table, int *capacity, const char *name, int layer,
                      size_t view_field, long rows, long cols) {
    if (table->count == *capacity) {
        *capacity = *capacity ? 2 * *capacity : 64;
        table->entries = xrealloc(table->entries, (size_t)*capacity * sizeof(ParamEntry));
    }
    if (table->capacity < *capacity) table->capacity = *capacity;
    ParamEntry *e = &table->entries[table->count++];
    memset(e, 0, sizeof *e);
    snprintf(e->name, sizeof e->name, "%s", name);
    e->ndim = cols > 0 ? 2 : 1;
    e->shape[0] = rows;
    e->shape[1] = cols > 0 ? cols : 0;
    e->numel = cols > 0 ? rows * cols : rows;
    // Keep every tensor 16-float aligned (64 bytes) for vector loads.
    e->offset = (table->total + 15) / 16 * 16;
    table->total = e->offset + e->numel;
    // The backend buffer by the same rule: `offset` itself until a quantized entry is unstored.
    e->stored = (table->stored_total + 15) / 16 * 16;
    table->stored_total = e->stored + e->numel;
    e->decay = param_name_decays(name);
    e->layer = layer;
    e->view_field = view_field;
}

#define GLOBAL(field) offsetof(ModelTensors, field)
#define LAYER(field) offsetof(LayerTensors, field)

void param_table_build(ParamTable *table, const ModelConfig *cfg, bool with_lm_head,
                       bool with_value_head) {
    memset(table, 0, sizeof *table);
    int capacity = 0;
    const long C = cfg->hidden_size, V = cfg->vocab_size, I = cfg->intermediate_size;
    const long q_dim = (long)cfg->num_heads * cfg->head_dim;
    const long kv_dim = (long)cfg->num_kv_heads * cfg->head_dim;
    char name[96];

    add_entry(table, &capacity, "model.embed_tokens.weight", -1, GLOBAL(tok_emb), V, C);
    if (cfg->positions == POSITIONS_LEARNED)
        add_entry(table, &capacity, "model.embed_positions.weight", -1, GLOBAL(pos_emb),
                  cfg->max_position_embeddings, C);
    for (int l = 0; l < cfg->num_layers; l++) {
#define ADD(suffix, field, rows, cols)                                          \
    do {                                                                        \
        snprintf(name, sizeof name, "model.layers.%d.%s", l, suffix);           \
        add_entry(table, &capacity, name, l, LAYER(field), rows, cols);          \
    } while (0)
        ADD("input_layernorm.weight", attn_norm_w, C, 0);
        if (cfg->norm_bias) ADD("input_layernorm.bias", attn_norm_b, C, 0);
        ADD("self_attn.q_proj.weight", q_w, q_dim, C);
        if (cfg->qkv_bias) ADD("self_attn.q_proj.bias", q_b, q_dim, 0);
        ADD("self_attn.k_proj.weight", k_w, kv_dim, C);
        if (cfg->qkv_bias) ADD("self_attn.k_proj.bias", k_b, kv_dim, 0);
        ADD("self_attn.v_proj.weight", v_w, kv_dim, C);
        if (cfg->qkv_bias) ADD("self_attn.v_proj.bias", v_b, kv_dim, 0);
        if (cfg->qk_norm) ADD("self_attn.q_norm.weight", q_norm_w, cfg->head_dim, 0);
        if (cfg->qk_norm) ADD("self_attn.k_norm.weight", k_norm_w, cfg->head_dim, 0);
        ADD("self_attn.o_proj.weight", o_w, C, q_dim);
        if (cfg->o_bias) ADD("self_attn.o_proj.bias", o_b, C, 0);
        if (cfg->sandwich_norms) {
            // Gemma 2 names the norm of the attention output post_attention_layernorm, and
            // the MLP's input norm pre_feedforward_layernorm.
            ADD("post_attention_layernorm.weight", post_attn_norm_w, C, 0);
            ADD("pre_feedforward_layernorm.weight", mlp_norm_w, C, 0);
            ADD("post_feedforward_layernorm.weight", post_mlp_norm_w, C, 0);
        } else {
            ADD("post_attention_layernorm.weight", mlp_norm_w, C, 0);
            if (cfg->norm_bias) ADD("post_attention_layernorm.bias", mlp_norm_b, C, 0);
        }
        if (cfg->mlp != MLP_GELU) ADD("mlp.gate_proj.weight", gate_w, I, C);
        ADD("mlp.up_proj.weight", up_w, I, C);
        if (cfg->mlp_bias) ADD("mlp.up_proj.bias", up_b, I, 0);
        ADD("mlp.down_proj.weight", down_w, C, I);
        if (cfg->mlp_bias) ADD("mlp.down_proj.bias", down_b, C, 0);
#undef ADD
    }
    add_entry(table, &capacity, "model.norm.weight", -1, GLOBAL(final_norm_w), C, 0);
    if (cfg->norm_bias)
        add_entry(table, &capacity, "model.norm.bias", -1, GLOBAL(final_norm_b), C, 0);
    if (with_lm_head && !cfg->tie_word_embeddings)
        add_entry(table, &capacity, "lm_head.weight", -1, GLOBAL(lm_head), V, C);
    if (with_value_head)
        add_entry(table, &capacity, "score.weight", -1, GLOBAL(value_head), 1, C);
    table->total = (table->total + 15) / 16 * 16;
    table->stored_total = (table->stored_total + 15) / 16 * 16;
}

void param_table_append(ParamTable *table, const char *name, int layer, size_t view_field, long rows,
                        long cols) {
    int capacity = table->capacity;
    add_entry(table, &capacity, name, layer, view_field, rows, cols);
    table->total = (table->total + 15) / 16 * 16;
    table->stored_total = (table->stored_total + 15) / 16 * 16;
}

void param_table_free(ParamTable *table) {
    free(table->entries);
    memset(table, 0, sizeof *table);
}

const ParamEntry *param_table_find(const ParamTable *table, const char *name) {
    for (int i = 0; i < table->count; i++)
        if (strcmp(table->entries[i].name, name) == 0) return &table->entries[i];
    return NULL;
}

void param_views_bind(ModelTensors *views, const ParamTable *table, float *base,
                      int num_layers) {
    param_views_bind_tail(views, table, base, 0, num_layers);
}

void param_views_bind_tail(ModelTensors *views, const ParamTable *table, float *base, long first,
                           int num_layers) {
    LayerTensors *layers = views->layers && views->num_layers == num_layers
                               ? views->layers
                               : xcalloc((size_t)num_layers, sizeof(LayerTensors));
    if (layers != views->layers) free(views->layers);
    memset(views, 0, sizeof *views);
    memset(layers, 0, (size_t)num_layers * sizeof(LayerTensors));
    views->layers = layers;
    views->num_layers = num_layers;
    for (int i = 0; i < table->count; i++) {
        const ParamEntry *e = &table->entries[i];
        if (e->offset < first) continue;
        char *owner = e->layer < 0 ? (char *)views : (char *)&layers[e->layer];
        float **slot = (float **)(owner + e->view_field);
        *slot = base + (e->offset - first);
    }
}

void param_views_bind_stored(ModelTensors *views, const ParamTable *table, float *base, int num_layers) {
    param_views_bind(views, table, base, num_layers);
    for (int i = 0; i < table->count; i++) {
        const ParamEntry *e = &table->entries[i];
        char *owner = e->layer < 0 ? (char *)views : (char *)&views->layers[e->layer];
        float **slot = (float **)(owner + e->view_field);
        *slot = e->stored >= 0 ? base + e->stored : NULL;
    }
}

void param_views_free(ModelTensors *views) {
    free(views->layers);
    memset(views, 0, sizeof *views);
}
