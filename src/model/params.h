// The parameter table: every tensor of a model, laid out in one flat buffer.
//
// A model's weights, gradients and AdamW moments are four buffers with the same layout;
// the table says where each named tensor lives in them, so checkpoint IO, weight-decay
// groups and norms iterate over the table instead of knowing the architecture.
// Names are Hugging Face's Llama-style names for every family (GPT-2 files are mapped at
// the IO boundary, model/weights_io.c). The value head is "score.weight" [1, hidden], the
// name transformers' *ForSequenceClassification models use.
#pragma once
#include <stdbool.h>
#include <stddef.h>

#include "model/config.h"

// The linear layers a LoRA adapter can attach to (model/lora.h), in the order of PEFT's
// module names q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj.
typedef enum { LORA_Q, LORA_K, LORA_V, LORA_O, LORA_GATE, LORA_UP, LORA_DOWN, LORA_TARGETS } LoraTarget;

typedef struct {
    float *attn_norm_w, *attn_norm_b;
    float *q_w, *q_b, *k_w, *k_b, *v_w, *v_b, *o_w, *o_b;
    float *q_norm_w, *k_norm_w; // Qwen3's per-head q/k RMSNorm weights [head_dim]
    float *mlp_norm_w, *mlp_norm_b;
    float *post_attn_norm_w, *post_mlp_norm_w; // Gemma 2's norms of the attention and MLP outputs
    float *gate_w; // gated MLPs only
    float *up_w, *up_b, *down_w, *down_b;
    // LoRA adapters, NULL where none: A [rank, in_features], B [out_features, rank]; with
    // DoRA the magnitude m [out_features] too (model/lora.h).
    float *lora_a[LORA_TARGETS], *lora_b[LORA_TARGETS], *lora_m[LORA_TARGETS];
} LayerTensors;

// Named views into one flat buffer (weights, gradients, or a moment buffer).
typedef struct {
    float *tok_emb;      // [vocab, hidden]
    float *pos_emb;      // [max_positions, hidden], learned positions only
    float *final_norm_w, *final_norm_b;
    float *lm_head;      // [vocab, hidden]; NULL when tied to tok_emb
    float *value_head;   // [1, hidden]; NULL without a value head
    LayerTensors *layers; // [num_layers]
    int num_layers;
} ModelTensors;

typedef struct {
    char name[96];
    int ndim;
    long shape[2];
    long offset; // in floats, into the flat buffer (the table's layout: files, host copies, gradients)
    // Where the tensor lives in the model's backend buffer (Model.params): `offset`, or -1 for a
    // weight held only quantized on a backend other than the CPU, which keeps no float32 slot for
    // it (model/quantize.c quantized_unstore). The entries stored are in table order, each
    // 16-float aligned, so every stretch of entries between two unstored ones is laid out as in
    // the table, shifted.
    long stored;
    long numel;
    bool decay;  // receives weight decay (see param_name_decays)
    int layer;   // layer index, or -1 for a global tensor
    size_t view_field; // offsetof() the pointer in LayerTensors / ModelTensors
} ParamEntry;

typedef struct {
    ParamEntry *entries;
    int count;
    long total; // floats in the flat buffer
    long stored_total; // floats in the backend buffer: `total` less the entries stored nowhere
    int capacity; // entries allocated
} ParamTable;

// Builds the table for a config. with_lm_head: keep an LM head (tied or not);
// with_value_head: add "score.weight".
void param_table_build(ParamTable *table, const ModelConfig *cfg, bool with_lm_head,
                       bool with_value_head);
void param_table_free(ParamTable *table);
const ParamEntry *param_table_find(const ParamTable *table, const char *name);

// Points every view of `views` into `base` (a buffer of table->total floats).
void param_views_bind(ModelTensors *views, const ParamTable *table, float *base,
                      int num_layers);
// The same for the model's backend buffer (Model.params), by each entry's `stored`: the views of
// entries stored nowhere are NULL.
void param_views_bind_stored(ModelTensors *views, const ParamTable *table, float *base, int num_layers);
// The same for a buffer that holds only the table's tail [first, table->total), as the
// gradients of a partly frozen model do: views of tensors before `first` are NULL.
void param_views_bind_tail(ModelTensors *views, const ParamTable *table, float *base, long first,
                           int num_layers);
// Appends a [rows, cols] tensor to the table (16-float aligned, like every entry).
void param_table_append(ParamTable *table, const char *name, int layer, size_t view_field, long rows,
                        long cols);
void param_views_free(ModelTensors *views);

// The weight-decay rule, by name as DeepSpeed-Chat and TRL apply it: biases, norm
// weights and embeddings are not decayed; everything else is.
bool param_name_decays(const char *name);
