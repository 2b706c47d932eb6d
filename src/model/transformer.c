// The one transformer implementation: forward and backward for every family.
//
// Layer l maps the residual stream x_l to x_{l+1}:
//   x_mid   = x_l   + o_proj(attention(rope(q(norm1(x_l))), rope(k(..)), v(..)))
//   x_{l+1} = x_mid + down(act(gate(norm2(x_mid))) * up(norm2(x_mid)))   (gated MLPs)
//   x_{l+1} = x_mid + down(gelu(up(norm2(x_mid))))                        (GPT-2)
// followed, after the last layer, by the final norm, then the LM head and/or value head.
// Gemma 2 normalises each block's output before its residual add (x_l + norm(o_proj(..)),
// x_mid + norm(down(..))), scales the queries to its query_pre_attn_scalar, and soft-caps
// the attention scores (the attention ops' softcap) and the logits (lm_head_forward).
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "core/check.h"
#include "core/rng.h"
#include "model/lora.h"
#include "model/quantize.h"
#include "model/model.h"
#include "model/packed_attention.h"

// ---------------------------------------------------------------------------------------
// Allocation

void model_init(Model *model, const ModelConfig *cfg, const OpsBackend *ops, bool with_lm_head,
                bool with_value_head) {
    model_init_without_params(model, cfg, ops, with_lm_head, with_value_head);
    model->params = ops->alloc((size_t)model->table.stored_total * sizeof(float));
    param_views_bind_stored(&model->weights, &model->table, model->params, cfg->num_layers);
}

void model_init_without_params(Model *model, const ModelConfig *cfg, const OpsBackend *ops, bool with_lm_head,
                               bool with_value_head) {
    memset(model, 0, sizeof *model);
    // Gemma 2's soft caps need the backend's soft_cap_forward (both backends have it).
    if ((cfg->attn_logit_softcap > 0.0f || cfg->final_logit_softcap > 0.0f) && !ops->soft_cap_forward)
        die_user("%s models (soft-capped attention and logits) are not built for this backend", cfg->model_type);
    model->config = *cfg;
    model->ops = ops;
    model->has_lm_head = with_lm_head;
    model->has_value_head = with_value_head;
    param_table_build(&model->table, cfg, with_lm_head, with_value_head);
    if (cfg->positions == POSITIONS_ROPE) {
        const size_t size = (size_t)(cfg->head_dim / 2) * sizeof(float);
        float *inv_freq = xmalloc(size);
        rope_inverse_frequencies(cfg, inv_freq);
        model->rope_inv_freq = ops->alloc(size);
        ops->copy_to_device(model->rope_inv_freq, inv_freq, size);
        if (cfg->rope_local_theta > 0.0f) { // Gemma 3's sliding layers: their own base, unscaled
            ModelConfig local = *cfg;
            local.rope_theta = cfg->rope_local_theta, local.rope_scaling = ROPE_SCALING_NONE;
            rope_inverse_frequencies(&local, inv_freq);
            model->rope_inv_freq_local = ops->alloc(size);
            ops->copy_to_device(model->rope_inv_freq_local, inv_freq, size);
        }
        free(inv_freq);
    }
}

// The RoPE frequencies layer l turns its queries and keys by.
static const float *rope_table(const Model *model, int l) {
    return config_layer_uses_local_rope(&model->config, l) ? model->rope_inv_freq_local : model->rope_inv_freq;
}

// Calls copy(table_offset, stored_offset, floats) for each run of stored entries below `count`
// between unstored ones (one run when none is unstored): inside a run the backend buffer is laid
// out as the table, shifted (param_table_append's and quantized_unstore's one alignment rule).
static void for_each_stored_run(const ParamTable *table, long count,
                                void (*copy)(void *context, long at, long stored, long n), void *context) {
    int i = 0;
    while (i < table->count) {
        const ParamEntry *first = &table->entries[i];
        if (first->offset >= count) break;
        if (first->stored < 0) {
            i++;
            continue;
        }
        int j = i + 1;
        while (j < table->count && table->entries[j].offset < count && table->entries[j].stored >= 0) j++;
        // The run takes the padding after its last entry (to a multiple of 16 floats, in the
        // backend buffer as in the table), up to the next entry or `count`.
        long end = j < table->count ? table->entries[j].offset : table->total;
        if (end > count) end = count;
        copy(context, first->offset, first->stored, end - first->offset);
        i = j;
    }
}

typedef struct {
    const Model *model;
    float *host;
    const float *source;
} ParamsCopy;

static void copy_run_to_host(void *context, long at, long stored, long n) {
    const ParamsCopy *c = context;
    c->model->ops->copy_to_host(c->host + at, c->model->params + stored, (size_t)n * sizeof(float));
}

static void copy_run_to_device(void *context, long at, long stored, long n) {
    const ParamsCopy *c = context;
    c->model->ops->copy_to_device(c->model->params + stored, c->source + at, (size_t)n * sizeof(float));
}

void model_params_to_host(const Model *model, float *host, long count) {
    if (model->table.stored_total != model->table.total) memset(host, 0, (size_t)count * sizeof(float));
    ParamsCopy c = {.model = model, .host = host};
    for_each_stored_run(&model->table, count, copy_run_to_host, &c);
}

void model_params_to_device(Model *model, const float *host, long count) {
    ParamsCopy c = {.model = model, .source = host};
    for_each_stored_run(&model->table, count, copy_run_to_device, &c);
    param_views_bind_stored(&model->weights, &model->table, model->params, model->config.num_layers);
}

static void activations_free(Model *model) {
    const OpsBackend *ops = model->ops;
    Activations *a = &model->acts;
    int sets = a->keep_all_layers ? model->config.num_layers : 1;
    if (a->layers) {
        for (int s = 0; s < sets; s++) {
            LayerActivations *la = &a->layers[s];
            float *buffers[] = {la->attn_norm_out, la->attn_norm_mean, la->attn_norm_rstd,
                                la->qkv, la->q_raw, la->k_raw, la->q_norm_rstd, la->k_norm_rstd,
                                la->attention_saved, la->att_out, la->x_mid,
                                la->mlp_norm_out, la->mlp_norm_mean, la->mlp_norm_rstd,
                                la->gate, la->up, la->act, la->attn_proj, la->post_attn_norm_rstd,
                                la->mlp_proj, la->post_mlp_norm_rstd};
            for (size_t i = 0; i < sizeof buffers / sizeof buffers[0]; i++)
                if (buffers[i]) ops->free(buffers[i]);
            for (int t = 0; t < LORA_TARGETS; t++) {
                if (la->lora_hidden[t]) ops->free(la->lora_hidden[t]);
                if (la->dora_z[t]) ops->free(la->dora_z[t]);
            }
        }
        free(a->layers);
    }
    void *buffers[] = {a->tokens,     a->positions,      a->row_start,     a->targets,
                       a->residual,   a->final_out,      a->final_mean,    a->final_rstd,    a->last_hidden,
                       a->last_logits, a->last_lse, a->sample_inverse, a->sample_uniform,
                       a->candidate_inverse, a->candidate_values, a->candidate_top_k, a->candidate_counts,
                       a->candidate_ids, a->candidate_lse, a->candidate_scaled_lse,
                       a->logits,     a->lse,            a->logp_device,   a->entropy_device,
                       a->values_device, a->top1_device, a->d_resid,       a->d_norm_out,
                       a->d_hidden,   a->dqkv,
                       a->d_att_out,  a->d_act,          a->d_gate,        a->d_up,
                       a->d_head,     a->head_hidden,    a->d_lora_hidden, a->dq_raw,   a->dk_raw,
                       a->d_branch,
                       a->lora_dropped, a->d_lora_dropped, a->dora_scratch, a->dora_delta, a->dora_base};
    for (size_t i = 0; i < sizeof buffers / sizeof buffers[0]; i++)
        if (buffers[i]) ops->free(buffers[i]);
    free(a->head_run_start), free(a->head_run_len);
    packed_attention_free(model);
    memset(a, 0, sizeof *a);
}

void model_release_activations(Model *model) { activations_free(model); }

void model_free(Model *model) {
    if (!model->ops) return;
    activations_free(model);
    model_quantized_free(model);
    model->ops->free(model->params);
    if (model->rope_inv_freq) model->ops->free(model->rope_inv_freq);
    if (model->rope_inv_freq_local) model->ops->free(model->rope_inv_freq_local);
    if (model->grads) model->ops->free(model->grads);
    free(model->gradient_unwritten);
    if (model->dora_norms) model->ops->free(model->dora_norms);
    free(model->lora_ranks), free(model->lora_scales);
    param_views_free(&model->weights);
    param_views_free(&model->gradients);
    param_table_free(&model->table);
    memset(model, 0, sizeof *model);
}

void model_enable_grad(Model *model) {
    if (model->grads) return;
    CHECK(!model->quantized || model->lora.rank > 0,
          "a model with quantized weights (--quantize) trains only LoRA adapters on its frozen base");
    // Only the trainable tail of the table gets gradients: frozen views stay NULL, and the
    // ops skip a NULL gradient (a frozen weight still passes gradients to its input).
    model->grads = model->ops->alloc((size_t)model_trainable_floats(model) * sizeof(float)); // zero-filled
    model->gradient_unwritten = xcalloc((size_t)model->table.count, sizeof(bool));
    param_views_bind_tail(&model->gradients, &model->table, model->grads, model->trainable_offset,
                          model->config.num_layers);
    model_rebuild_activations(model); // sized for a frozen model, they keep too little for backward
}

int model_gradient_point(const Model *model, const ParamEntry *entry) {
    if (entry->layer >= 0) return entry->layer;
    if (entry->view_field == offsetof(ModelTensors, tok_emb) || entry->view_field == offsetof(ModelTensors, pos_emb))
        return -1;
    return model->config.num_layers;
}

static void weights_pass(Model *model, int kind) {
    if (model->weight_hook.pass) model->weight_hook.pass(model, kind, model->weight_hook.context);
}

static void weights_of_layer(Model *model, int l, bool needed) {
    if (model->weight_hook.layer) model->weight_hook.layer(model, l, needed, model->weight_hook.context);
}

static void gradients_ready(Model *model, int point) {
    model_settle_gradient_point(model, point);
    if (model->gradient_hook.ready) model->gradient_hook.ready(model, point, model->gradient_hook.context);
}

long model_num_params(const Model *model) {
    long total = 0;
    for (int i = 0; i < model->table.count; i++) total += model->table.entries[i].numel;
    return total;
}

static float *alloc_floats(const OpsBackend *ops, long n) {
    return ops->alloc((size_t)n * sizeof(float));
}

// Whether every training forward of layer l stores its stored buffers (layer_stores_inputs
// with no target), whatever the adapters' switch: a trained layer of plain float weights,
// without adapters and without up's bias. model_reserve sizes its buffers for the stored
// values only (ops.h, stored_buffer_floats); every condition here changes only where the
// activations are freed (model_enable_grad, model_add_lora, quantizing).
static bool layer_always_stores(const Model *model, int l) {
    const LayerTensors *w = &model->weights.layers[l];
    if (!model->grads || model->quantized || w->up_b) return false;
    for (int t = 0; t < LORA_TARGETS; t++)
        if (w->lora_a[t]) return false;
    return true;
}

// A buffer of n values that only stored forwards write (stored_only): the backend's size for
// its stored values; else n floats.
static float *alloc_maybe_stored(const OpsBackend *ops, long n, bool stored_only) {
    return alloc_floats(ops, stored_only ? ops->stored_buffer_floats(n) : n);
}

long model_attention_saved_floats(const Model *model, int B, int T, int first, int last) {
    const ModelConfig *cfg = &model->config;
    long saved = 0;
    for (int l = first; l <= last; l++) {
        const long size = model->ops->attention_saved_size(B, T, cfg->num_heads, cfg->num_kv_heads, cfg->head_dim,
                                                           cfg->attn_logit_softcap, config_layer_window(cfg, l));
        if (size > saved) saved = size;
    }
    return saved;
}

// Activations for B x T rows: every layer's set or one (keep_all), with the backward's
// buffers or without (backward: generation needs none). Growing within a layout keeps the
// larger of each size; a change of layout starts from B x T.
static void reserve_layout(Model *model, int B, int T, bool keep_all, bool backward) {
    const ModelConfig *cfg = &model->config;
    const OpsBackend *ops = model->ops;
    Activations *a = &model->acts;
    const bool same_layout = a->keep_all_layers == keep_all && a->backward_buffers == backward;
    if (a->capacity_B >= B && a->capacity_T >= T && same_layout) return;
    // Per-row buffers for the most rows ever asked for, in any layout (at least the grown B
    // below: capacity_rows >= capacity_B).
    const int rows = B > a->capacity_rows ? B : a->capacity_rows;
    if (a->capacity_B) {
        if (same_layout && a->capacity_B > B) B = a->capacity_B;
        if (same_layout && a->capacity_T > T) T = a->capacity_T;
        activations_free(model);
    }
    const long N = (long)B * T, C = cfg->hidden_size, I = cfg->intermediate_size;
    const long q_dim = (long)cfg->num_heads * cfg->head_dim;
    const long kv_dim = (long)cfg->num_kv_heads * cfg->head_dim;
    const int L = cfg->num_layers;
    a->capacity_B = B;
    a->capacity_T = T;
    a->capacity_rows = rows;
    a->keep_all_layers = keep_all;
    a->backward_buffers = backward;
    a->tokens = ops->alloc((size_t)N * sizeof(int));
    a->positions = ops->alloc((size_t)N * sizeof(int));
    a->targets = ops->alloc((size_t)N * sizeof(int));
    a->row_start = ops->alloc((size_t)a->capacity_rows * sizeof(int));
    a->residual_slices = backward ? L + 1 : 2;
    a->residual = alloc_floats(ops, a->residual_slices * N * C);
    int sets = keep_all ? L : 1;
    a->layers = xcalloc((size_t)sets, sizeof(LayerActivations));
    for (int s = 0; s < sets; s++) {
        LayerActivations *la = &a->layers[s];
        // Set 0 also serves every layer's KV-cache forward (layer_activations), which writes
        // floats; the other sets of layers that always store hold their stored buffers'
        // values only (on a GPU half the floats: about 7 GB of a 1B model's step at 8 x 1024).
        la->stored_only = s > 0 && layer_always_stores(model, s);
        la->attn_norm_out = alloc_maybe_stored(ops, N * C, la->stored_only);
        la->attn_norm_mean = alloc_floats(ops, N);
        la->attn_norm_rstd = alloc_floats(ops, N);
        la->qkv = alloc_floats(ops, N * (q_dim + 2 * kv_dim));
        la->q = la->qkv, la->k = la->q + N * q_dim, la->v = la->k + N * kv_dim;
        if (cfg->qk_norm) {
            la->q_raw = alloc_floats(ops, N * q_dim);
            la->k_raw = alloc_floats(ops, N * kv_dim);
            la->q_norm_rstd = alloc_floats(ops, N * cfg->num_heads);
            la->k_norm_rstd = alloc_floats(ops, N * cfg->num_kv_heads);
        }
        // The saved state of the layers this set serves: one layer's, or every layer's when
        // the set is shared, as set 0 is by KV-cache forwards. None where no backward
        // follows and the backend's forward needs none (attention_saved_for).
        const bool shared = !keep_all || s == 0;
        if (!model->packed_rows_only && (backward || !ops->attention_forward_without_saved)) {
            la->attention_saved_floats = model_attention_saved_floats(model, B, T, shared ? 0 : s, shared ? L - 1 : s);
            la->attention_saved = alloc_floats(ops, la->attention_saved_floats);
        }
        la->att_out = alloc_floats(ops, N * q_dim);
        la->x_mid = alloc_floats(ops, N * C);
        la->mlp_norm_out = alloc_maybe_stored(ops, N * C, la->stored_only);
        la->mlp_norm_mean = alloc_floats(ops, N);
        la->mlp_norm_rstd = alloc_floats(ops, N);
        if (cfg->sandwich_norms) {
            la->attn_proj = alloc_floats(ops, N * C);
            la->post_attn_norm_rstd = alloc_floats(ops, N);
            la->mlp_proj = alloc_floats(ops, N * C);
            la->post_mlp_norm_rstd = alloc_floats(ops, N);
        }
        if (cfg->mlp != MLP_GELU) la->gate = alloc_maybe_stored(ops, N * I, la->stored_only);
        la->up = alloc_maybe_stored(ops, N * I, la->stored_only);
        la->act = alloc_maybe_stored(ops, N * I, la->stored_only);
        for (int t = 0; t < LORA_TARGETS; t++)
            if (model->lora.targets & (1u << t)) {
                la->lora_hidden[t] = alloc_floats(ops, N * model->lora_max_rank);
                if (model->lora.dora) la->dora_z[t] = alloc_floats(ops, N * lora_out_features(cfg, (LoraTarget)t));
            }
    }
    // (LoRA's dropout and DoRA's scratch serve training passes only)
    if (model->lora.rank && backward) a->d_lora_hidden = alloc_floats(ops, N * model->lora_max_rank);
    if (model->lora.rank && backward && model->lora.dropout > 0) {
        // Wide enough for any adapted layer's input: the hidden size, q_proj's output (o_proj's
        // input) or the MLP's width (down_proj's input).
        long widest = C > q_dim ? C : q_dim;
        if (I > widest) widest = I;
        a->lora_dropped = alloc_floats(ops, N * widest);
        a->d_lora_dropped = alloc_floats(ops, N * widest);
    }
    if (model->lora.dora) {
        // The widest adapted output, and the largest adapted weight.
        long widest = 0, largest = 0;
        for (int t = 0; t < LORA_TARGETS; t++) {
            if (!(model->lora.targets & (1u << t))) continue;
            const long out = lora_out_features(cfg, (LoraTarget)t), in = lora_in_features(cfg, (LoraTarget)t);
            if (out > widest) widest = out;
            if (out * in > largest) largest = out * in;
        }
        a->dora_delta = alloc_floats(ops, largest);
        if (model->quantized) a->dora_base = alloc_floats(ops, largest);
        if (backward) a->dora_scratch = alloc_floats(ops, N * widest);
    }
    a->final_out = alloc_floats(ops, N * C);
    a->final_mean = alloc_floats(ops, N);
    a->final_rstd = alloc_floats(ops, N);
    const long R = a->capacity_rows;
    a->last_hidden = alloc_floats(ops, R * C);
    if (model->has_lm_head) {
        a->last_logits = alloc_floats(ops, R * cfg->vocab_size);
        a->last_lse = alloc_floats(ops, R);
        a->sample_inverse = alloc_floats(ops, R);
        a->sample_uniform = ops->alloc((size_t)R * sizeof(double));
    }
    a->logp_device = alloc_floats(ops, N);
    a->entropy_device = alloc_floats(ops, N);
    a->values_device = alloc_floats(ops, N);
    a->top1_device = ops->alloc((size_t)N * sizeof(int));
    if (backward) {
        a->d_resid = alloc_floats(ops, N * C);
        a->d_norm_out = alloc_floats(ops, N * C);
        a->d_hidden = alloc_floats(ops, N * C);
        a->dqkv = alloc_floats(ops, N * (q_dim + 2 * kv_dim));
        a->dq = a->dqkv, a->dk = a->dq + N * q_dim, a->dv = a->dk + N * kv_dim;
        a->d_att_out = alloc_floats(ops, N * q_dim);
        if (cfg->qk_norm) a->dq_raw = alloc_floats(ops, N * q_dim), a->dk_raw = alloc_floats(ops, N * kv_dim);
        if (cfg->sandwich_norms) a->d_branch = alloc_floats(ops, N * C);
        // The activation's gradients are stored by the backward of a layer that stored its
        // forward (layer_backward): their values only when every layer does.
        bool all_store = true;
        for (int l = 0; l < L; l++) all_store = all_store && layer_always_stores(model, l);
        a->d_act = alloc_maybe_stored(ops, N * I, all_store);
        if (cfg->mlp != MLP_GELU) a->d_gate = alloc_maybe_stored(ops, N * I, all_store); // (GELU: no gate)
        a->d_up = alloc_maybe_stored(ops, N * I, all_store);
        a->d_head = alloc_floats(ops, 3 * N);
    }
}

void model_reserve(Model *model, int B, int T) {
    reserve_layout(model, B, T, model->grads && !model->recompute, model->grads != NULL);
}

// Whether the activations as they are serve a KV-cache forward of B x T (set 0 serves,
// whichever the layout).
static bool cached_forward_fits(const Model *model, int B, int T) {
    const Activations *a = &model->acts;
    return a->capacity_B && B <= a->capacity_rows && (long)B * T <= (long)a->capacity_B * a->capacity_T &&
           (model->ops->attention_forward_without_saved ||
            model_attention_saved_floats(model, B, T, 0, model->config.num_layers - 1) <= a->layers[0].attention_saved_floats);
}

void model_reserve_cached(Model *model, int B, int T) {
    if (!cached_forward_fits(model, B, T)) reserve_layout(model, B, T, false, false);
}

int model_cached_rows_fitting(const Model *model, int T) {
    const Activations *a = &model->acts;
    if (!a->capacity_B || T <= 0) return 0;
    const long by_slots = (long)a->capacity_B * a->capacity_T / T;
    int rows = (int)(by_slots < a->capacity_rows ? by_slots : a->capacity_rows);
    while (rows > 0 && !cached_forward_fits(model, rows, T)) rows--; // the attention's saved state
    return rows;
}

void model_rebuild_activations(Model *model) {
    Activations *a = &model->acts;
    if (!a->capacity_B) return;
    const int B = a->capacity_B, T = a->capacity_T, rows = a->capacity_rows;
    activations_free(model);
    a->capacity_rows = rows;
    model_reserve(model, B, T);
}

// ---------------------------------------------------------------------------------------
// Forward

static void norm_forward(const Model *model, float *out, float *mean, float *rstd,
                         const float *inp, const float *weight, const float *bias, long N) {
    const ModelConfig *cfg = &model->config;
    if (cfg->norm == NORM_LAYERNORM)
        model->ops->layernorm_forward(out, mean, rstd, inp, weight, bias, (int)N,
                                      cfg->hidden_size, cfg->norm_eps);
    else
        model->ops->rmsnorm_forward(out, rstd, inp, weight, (int)N, cfg->hidden_size,
                                    cfg->norm_eps, cfg->norm_weight_plus_one);
}

static void norm_backward(const Model *model, float *dinp, float *dweight, float *dbias,
                          const float *dout, const float *inp, const float *weight,
                          const float *mean, const float *rstd, long N) {
    const ModelConfig *cfg = &model->config;
    dweight = model_gradient_to_add(model, dweight), dbias = model_gradient_to_add(model, dbias);
    if (cfg->norm == NORM_LAYERNORM)
        model->ops->layernorm_backward(dinp, dweight, dbias, dout, inp, weight, mean, rstd,
                                       (int)N, cfg->hidden_size);
    else
        model->ops->rmsnorm_backward(dinp, dweight, dout, inp, weight, rstd, (int)N,
                                     cfg->hidden_size, cfg->norm_weight_plus_one);
}

// out = inp . weight^T (+ bias): through the quantized copy of the weight when the model has
// one (model/quantize.h; its float32 weight is then gone). A model being trained (a LoRA
// over a quantized base) multiplies by the dequantized weights, so that model_linear_backward is
// the gradient of what it computed; so does a model asked to (Model.dequantized_matmuls).
// kernel_rows: the rows the inference kernel is chosen for (ModelBatch.kernel_rows), N but
// in a chunk of a prompt.
void model_linear_forward(const Model *model, float *out, const float *inp, const float *weight,
                          const Q8Matrix *quantized, const float *bias, long N, int IC, int OC, long kernel_rows) {
    if (quantized && quantized->values) {
        if (model->grads || model->dequantized_matmuls) model->ops->matmul_forward_dequantized(out, inp, quantized, bias, (int)N, IC, OC);
        else model->ops->matmul_forward_q8(out, inp, quantized, bias, (int)N, IC, OC, (int)kernel_rows);
    } else {
        model->ops->matmul_forward(out, inp, weight, bias, (int)N, IC, OC);
    }
}

// model_linear_forward's backward: a quantized weight is frozen (model_enable_grad), so only the
// input gradient flows, through its dequantized values. The weight's and bias's gradients are
// written over when unwritten since model_zero_grad (model_gradient_write_mode), else added.
void model_linear_backward(const Model *model, float *dinp, float *dweight, float *dbias, const float *dout,
                           const float *inp, const float *weight, const Q8Matrix *quantized, long N, int IC,
                           int OC, WriteMode dinp_mode) {
    if (quantized && quantized->values) {
        CHECK(!dweight && !dbias, "a quantized weight is frozen: it has no gradient");
        if (!dinp) return;
        if (dinp_mode == WRITE_OVERWRITE) model->ops->fill_zero(dinp, N * IC); // the quantized op adds
        model->ops->matmul_backward_input_q8(dinp, dout, quantized, (int)N, IC, OC);
    } else {
        model->ops->matmul_backward(dinp, dweight, dbias, dout, inp, weight, (int)N, IC, OC, dinp_mode,
                                    model_gradient_write_mode(model, dweight, dbias));
    }
}

// A block's output added to the residual stream: out = residual + (inp . weight^T + bias +
// the module's adapter term), normalised first with Gemma 2's sandwich norms (into `proj`,
// then `post_norm_w`'s norm). A plain float weight is one op that reads the residual as it
// writes out (matmul_forward_residual: on a GPU no separate pass over the stream); otherwise
// the product, the adapter's term, the norm and then the residual, the order the sums have
// always had.
static void block_output_forward(Model *model, int l, LoraTarget target, const LayerActivations *la, float *out,
                                 const float *inp, const float *residual, const float *weight,
                                 const Q8Matrix *quantized, const float *bias, float *proj, const float *post_norm_w,
                                 float *post_norm_rstd, long N, int IC, int OC) {
    const bool sandwich = model->config.sandwich_norms;
    if (!sandwich && (!quantized || !quantized->values) && !lora_adapts(model, l, target)) {
        model->ops->matmul_forward_residual(out, inp, weight, bias, residual, (int)N, IC, OC);
        return;
    }
    float *product = sandwich ? proj : out;
    model_linear_forward(model, product, inp, weight, quantized, bias, N, IC, OC, model->acts.kernel_rows);
    lora_forward(model, l, target, product, inp, la->lora_hidden[target], la->dora_z[target], N);
    if (sandwich) norm_forward(model, out, NULL, post_norm_rstd, proj, post_norm_w, NULL, N);
    model->ops->accumulate(out, residual, N * OC);
}

// Where a forward with a KV cache puts its keys and values, and what it attends to.
typedef struct {
    KvCache *cache;
    int first_row; // the batch's row b is the cache's row first_row + b
    int slot;      // the batch's slot t is the cache's slot `slot + t`
    bool decode;   // the batch continues its rows' cached slots and attends to them: slot
                   // slot + t to [row_start, slot + t] (a decode step, T == 1, or a prompt
                   // that extends a cached prefix); else the batch attends to itself
} CacheTarget;

// The attention state a forward writes for its backward (ops.h, attention_forward): none
// where no backward follows (a KV-cache forward; a model without the backward's buffers)
// and the backend's forward needs none (OpsBackend.attention_forward_without_saved: on the
// CPU the [B, H, T, T] probabilities, 576 MB for one row of 4,000 tokens of SmolLM2).
static float *attention_saved_for(const Model *model, const LayerActivations *la, const CacheTarget *target) {
    const bool backward_may_follow = !target && model->acts.backward_buffers;
    return backward_may_follow || !model->ops->attention_forward_without_saved ? la->attention_saved : NULL;
}

// Layer l's input in the residual stream (l = num_layers: the final norm's) of a forward of
// N slots (Activations.residual).
static float *residual_slice(const Activations *a, int l, long N, long C) {
    return a->residual + (long)(l % a->residual_slices) * N * C;
}

// Gemma 2 scores q.k / sqrt(query_pre_attn_scalar); the attention ops divide by sqrt(head_dim),
// so the queries are scaled by sqrt(head_dim / query_pre_attn_scalar) first (1 elsewhere).
static float query_scale_of(const ModelConfig *cfg) {
    if (!(cfg->query_pre_attn_scalar > 0.0f) || cfg->query_pre_attn_scalar == (float)cfg->head_dim) return 1.0f;
    return sqrtf((float)cfg->head_dim / cfg->query_pre_attn_scalar);
}

// Whether a training forward of layer l stores the buffers that only products and the
// activation read (ops.h, hold_stored): the norms' outputs, gate's and up's outputs, the
// activation's output, and in the backward the activation's gradients (down's input
// gradient, which it reads, and gate's and up's output gradients, which it writes). True when
// nothing else reads them: the layer's weights plain floats without adapters (LoRA's and
// DoRA's terms, and quantized weights' kernels, read them otherwise) and up without a bias
// (added to its output as floats). A forward for a KV cache (generation) stores nothing: no
// backward follows it.
static bool layer_stores_inputs(const Model *model, int l, const CacheTarget *target) {
    if (!model->grads || target || model->quantized || model->weights.layers[l].up_b) return false;
    for (int t = 0; t < LORA_TARGETS; t++)
        if (lora_adapts(model, l, (LoraTarget)t)) return false;
    return true;
}

// A product input held (ops.h): stored when the layer stores them, `written` by an earlier
// op under the store (the forward's output that its backward reads again).
static void hold_input(const OpsBackend *ops, bool store, const float *inp, long n, bool written) {
    if (store) ops->hold_stored(inp, n, written);
    else ops->matmul_input_hold(inp, n);
}

// Up's output, and gate's in a gated MLP, stored (n floats each): only the activation reads
// them, forward and backward.
static void store_mlp_products(const OpsBackend *ops, const LayerActivations *la, bool gated, long n, bool written) {
    ops->hold_stored(la->up, n, written);
    if (gated) ops->hold_stored(la->gate, n, written);
}

// Whether the attention op rotates q and k itself (ops.h, attention_forward_rotary): with
// RoPE, when nothing reads the rotated q and k but the attention (no KV cache to fill) and
// no query scale comes between the rotation and the attention. Its backward follows a
// forward without a target, so it asks with target NULL.
static bool attention_rotates(const ModelConfig *cfg, const CacheTarget *target) {
    return cfg->positions == POSITIONS_ROPE && !target && query_scale_of(cfg) == 1.0f;
}

// Whether q, k, v and their biases (b: NULL for none) lie one after the other in memory,
// [q_dim + 2 kv_dim] rows (and floats) of `C` from q on: the table's order (model/params.c)
// when no bias sits between the weights, in the weights, their gradients and a ZeRO-3
// layer's gathered copy alike; all NULL (a frozen layer's gradients) counts too.
static bool qkv_adjacent(const float *q, const float *k, const float *v, const float *q_b, const float *k_b,
                         const float *v_b, long C, long q_dim, long kv_dim) {
    if (!q && !k && !v && !q_b && !k_b && !v_b) return true;
    if (!q || k != q + q_dim * C || v != k + kv_dim * C) return false;
    if (!q_b && !k_b && !v_b) return true;
    return q_b && k_b == q_b + q_dim && v_b == k_b + kv_dim;
}

// Whether layers fuse their q/k/v products where they can (model_set_qkv_fusion): the
// backend's choice (OpsBackend.fuses_qkv_products) unless MARLHF_FUSED_QKV says 1 (every
// backend) or 0 (none), for measuring the one against the other and testing the fused path
// on the CPU; any other value is a one-line user error.
static ModelQkvFusion qkv_fusion = MODEL_QKV_FUSION_UNSET;

void model_set_qkv_fusion(ModelQkvFusion fusion) { qkv_fusion = fusion; }

bool model_qkv_fusion_on(const OpsBackend *ops) {
    if (qkv_fusion == MODEL_QKV_FUSION_UNSET) {
        const char *setting = getenv("MARLHF_FUSED_QKV");
        if (!setting || !*setting) qkv_fusion = MODEL_QKV_FUSION_BACKEND;
        else {
            const int on = env_switch("MARLHF_FUSED_QKV");
            if (on < 0) die_from_err();
            qkv_fusion = on ? MODEL_QKV_FUSION_ON : MODEL_QKV_FUSION_OFF;
        }
    }
    return qkv_fusion == MODEL_QKV_FUSION_ON || (qkv_fusion == MODEL_QKV_FUSION_BACKEND && ops->fuses_qkv_products);
}

// Whether layer l computes q, k and v as one product, [N, q_dim + 2 kv_dim] from the three
// weights side by side, and the attention reads their columns (ops.h's row strides): one
// larger product runs nearer the GPU's peak than three (the k and v products of the 1B shape
// ran at ~290 TFLOP/s against ~530 for q, 2026-12-04), and its backward is one weight
// gradient and one input gradient instead of three each. When the attention op rotates q and
// k itself (nothing else reads them: no KV cache to fill; no q/k norms between), the weights
// are plain floats without adapters (an adapter's term is added to its own output), and
// the weights, biases and gradients lie side by side (qkv_adjacent: not under Qwen2's
// biases, which the table puts between the weights).
static bool layer_fuses_qkv(const Model *model, int l, const CacheTarget *target) {
    const ModelConfig *cfg = &model->config;
    if (!model_qkv_fusion_on(model->ops) || !attention_rotates(cfg, target) || cfg->qk_norm || model->quantized)
        return false;
    if (lora_adapts(model, l, LORA_Q) || lora_adapts(model, l, LORA_K) || lora_adapts(model, l, LORA_V)) return false;
    const long C = cfg->hidden_size, q_dim = (long)cfg->num_heads * cfg->head_dim;
    const long kv_dim = (long)cfg->num_kv_heads * cfg->head_dim;
    const LayerTensors *w = &model->weights.layers[l];
    if (!w->q_w || !qkv_adjacent(w->q_w, w->k_w, w->v_w, w->q_b, w->k_b, w->v_b, C, q_dim, kv_dim)) return false;
    if (!model->grads) return true;
    const LayerTensors *g = &model->gradients.layers[l];
    return qkv_adjacent(g->q_w, g->k_w, g->v_w, g->q_b, g->k_b, g->v_b, C, q_dim, kv_dim);
}

// Where a layer does not fuse them (a KV-cache forward, a q/k norm, a query scale, a backend
// that keeps three products), whether its q, k and v products run as one op with three
// outputs (ops.h's matmul_forward_parts): float weights side by side, their biases too, no
// adapter on any of them. The numbers are those of three products; a GPU's decode step
// launches one product for the three instead of three (its host's time is most of a step).
static bool layer_takes_qkv_in_parts(const Model *model, int l) {
    if (model->quantized || lora_adapts(model, l, LORA_Q) || lora_adapts(model, l, LORA_K) ||
        lora_adapts(model, l, LORA_V))
        return false;
    const ModelConfig *cfg = &model->config;
    const long C = cfg->hidden_size, q_dim = (long)cfg->num_heads * cfg->head_dim;
    const LayerTensors *w = &model->weights.layers[l];
    return w->q_w && qkv_adjacent(w->q_w, w->k_w, w->v_w, w->q_b, w->k_b, w->v_b, C, q_dim,
                                  (long)cfg->num_kv_heads * cfg->head_dim);
}

// Where a model without gradients has quantized q, k and v (model_linear_forward would run
// matmul_forward_q8 on each), whether they run as one op (ops.h's matmul_forward_parts_q8: a
// GPU's decode step in one launch), no adapter on any of them.
static bool layer_takes_quantized_qkv_in_one_op(const Model *model, int l) {
    const QuantizedLayer *quantized = model->quantized ? &model->quantized->layers[l] : NULL;
    return quantized && quantized->q.values && quantized->k.values && quantized->v.values && !model->grads &&
           !model->dequantized_matmuls && model->ops->matmul_forward_parts_q8 && !lora_adapts(model, l, LORA_Q) &&
           !lora_adapts(model, l, LORA_K) && !lora_adapts(model, l, LORA_V);
}

// The same for a gated MLP's gate and up products (the table's order: gate, then up), when
// neither has a bias or an adapter.
static bool layer_takes_gate_up_in_parts(const Model *model, int l) {
    const ModelConfig *cfg = &model->config;
    if (cfg->mlp == MLP_GELU || model->quantized || lora_adapts(model, l, LORA_GATE) || lora_adapts(model, l, LORA_UP))
        return false;
    const LayerTensors *w = &model->weights.layers[l];
    return w->gate_w && !w->up_b && w->up_w == w->gate_w + (long)cfg->intermediate_size * cfg->hidden_size;
}

// q, k and v (or dq, dk, dv) as the rotary attention ops take them (ops.h): the three
// buffers the activations point at, or the columns of the rows [N, q | k | v] that a layer
// which fused their products keeps in the same memory (LayerActivations' qkv, Activations'
// dqkv, which q and dq point at).
typedef struct {
    float *q, *k, *v;
    int q_row_stride, kv_row_stride;
} QkvLayout;

static QkvLayout qkv_layout(float *q, float *k, float *v, bool fused, int q_dim, int kv_dim) {
    const int width = q_dim + 2 * kv_dim;
    if (fused) return (QkvLayout){q, q + q_dim, q + q_dim + kv_dim, width, width};
    return (QkvLayout){q, k, v, q_dim, kv_dim};
}

// Whether a forward of layer l that no backward follows (the GLU backward reads gate and up)
// takes its gate and up products and the gated unit as one op: float weights taken in parts
// (matmul_forward_glu), or two quantized matrices where model_linear_forward would run
// matmul_forward_q8 on each (matmul_forward_glu_q8), neither with a bias or an adapter.
static bool layer_takes_glu_in_one_op(const Model *model, int l, const CacheTarget *target) {
    if (!target && model->grads) return false;
    if (layer_takes_gate_up_in_parts(model, l)) return true;
    const QuantizedLayer *quantized = model->quantized ? &model->quantized->layers[l] : NULL;
    return quantized && model->config.mlp != MLP_GELU && quantized->gate.values && quantized->up.values &&
           !model->grads && !model->dequantized_matmuls && model->ops->matmul_forward_glu_q8 &&
           !model->weights.layers[l].up_b && !lora_adapts(model, l, LORA_GATE) && !lora_adapts(model, l, LORA_UP);
}

// MARLHF_UNFOLDED_NORMS=1 keeps every norm an op of its own (to compare): read once.
bool model_norms_folded(void) {
    static int unfolded = -1;
    if (unfolded < 0) {
        unfolded = env_switch("MARLHF_UNFOLDED_NORMS");
        if (unfolded < 0) die_from_err();
    }
    return !unfolded;
}

typedef enum { NORM_BEFORE_ATTENTION, NORM_BEFORE_MLP } LayerNormSite;

// Whether a forward of layer l that no backward follows gives its RMSNorms to the ops that
// read their outputs (ops.h's InputRmsNorm): the attention's norm to q, k and v as one op
// (matmul_forward_parts, matmul_forward_parts_q8), the MLP's to gate and up with the activation
// (layer_takes_glu_in_one_op), where the norm's output has no other reader (no adapter: the
// parts and GLU ops take none). A GPU's decode step then normalises the rows as the product
// reads them: two launches a layer fewer (unless model_norms_folded says no).
static bool layer_folds_norm(const Model *model, int l, const CacheTarget *target, LayerNormSite site, bool qkv_fused) {
    if (!model_norms_folded() || model->config.norm != NORM_RMSNORM || (!target && model->grads)) return false;
    if (site == NORM_BEFORE_MLP) return layer_takes_glu_in_one_op(model, l, target);
    return !qkv_fused && (layer_takes_qkv_in_parts(model, l) || layer_takes_quantized_qkv_in_one_op(model, l));
}

// The RMSNorm over x with its weight, as the ops that fold it take it.
static InputRmsNorm input_rms_norm(const Model *model, const float *x, float *rstd, const float *weight) {
    return (InputRmsNorm){.x = x, .rstd = rstd, .weight = weight, .eps = model->config.norm_eps,
                          .weight_plus_one = model->config.norm_weight_plus_one};
}

// A layer's MLP up to its activation, la->act (held for the down projection), from the
// norm's output la->mlp_norm_out (held): the up and gate products (in parts where the layer
// takes them so), their adapters, then the activation; the products' outputs stored when
// `store`.
static void mlp_activation_forward(Model *model, int l, LayerActivations *la, bool store, long N) {
    const ModelConfig *cfg = &model->config;
    const OpsBackend *ops = model->ops;
    const LayerTensors *w = &model->weights.layers[l];
    const QuantizedLayer *quantized = model->quantized ? &model->quantized->layers[l] : NULL;
    const int C = cfg->hidden_size, I = cfg->intermediate_size;
    // Up's and gate's outputs, which only the activation reads (forward and backward): stored,
    // a GPU writes them as bf16 from its products.
    const bool gated = cfg->mlp != MLP_GELU;
    if (store) store_mlp_products(ops, la, gated, N * I, false);
    if (layer_takes_gate_up_in_parts(model, l)) {
        float *outs[2] = {la->gate, la->up};
        const int widths[2] = {I, I};
        ops->matmul_forward_parts(outs, widths, 2, la->mlp_norm_out, w->gate_w, NULL, (int)N, C, NULL);
    } else {
        model_linear_forward(model, la->up, la->mlp_norm_out, w->up_w, quantized ? &quantized->up : NULL, w->up_b, N, C, I, model->acts.kernel_rows);
        lora_forward(model, l, LORA_UP, la->up, la->mlp_norm_out, la->lora_hidden[LORA_UP], la->dora_z[LORA_UP], N);
        if (gated) {
            model_linear_forward(model, la->gate, la->mlp_norm_out, w->gate_w, quantized ? &quantized->gate : NULL, NULL, N, C, I, model->acts.kernel_rows);
            lora_forward(model, l, LORA_GATE, la->gate, la->mlp_norm_out, la->lora_hidden[LORA_GATE], la->dora_z[LORA_GATE], N);
        }
    }
    ops->matmul_input_release();
    // The activation's output feeds down (and its adapter): held, a GPU writes its bf16 copy
    // with it instead of reading it back to convert it.
    hold_input(ops, store, la->act, N * I, false);
    if (store) store_mlp_products(ops, la, gated, N * I, true);
    if (cfg->mlp == MLP_GELU) ops->gelu_forward(la->act, la->up, N * I);
    else ops->glu_forward(la->act, la->gate, la->up, N * I, cfg->mlp == MLP_GEGLU);
}

// With a KV cache, the layer stores this batch's keys and values in the target's slots; a
// decode step attends to the cache instead of to the batch.
static void layer_forward(Model *model, int l, LayerActivations *la, const float *x_in,
                          float *x_out, const CacheTarget *target) {
    const ModelConfig *cfg = &model->config;
    const OpsBackend *ops = model->ops;
    const LayerTensors *w = &model->weights.layers[l];
    const QuantizedLayer *quantized = model->quantized ? &model->quantized->layers[l] : NULL;
    Activations *a = &model->acts;
    const int B = a->B, T = a->T;
    const long N = (long)B * T;
    const int C = cfg->hidden_size, I = cfg->intermediate_size;
    const int q_dim = cfg->num_heads * cfg->head_dim, kv_dim = cfg->num_kv_heads * cfg->head_dim;
    const int window = config_layer_window(cfg, l); // a sliding layer's (0: attends to the whole row)

    // q, k, v and their adapters all read attn_norm_out: held (ops.h), a GPU converts it to
    // bf16 once, the norm writing the copy with it; stored when nothing else reads it.
    const bool store = layer_stores_inputs(model, l, target);
    CHECK(store || !la->stored_only, "layer %d's buffers hold stored values only, and its forward stores none", l);
    la->inputs_stored = store;
    hold_input(ops, store, la->attn_norm_out, N * C, false);
    la->qkv_fused = layer_fuses_qkv(model, l, target);
    // Folded (layer_folds_norm): the q/k/v op below runs the norm, or applies it as it reads.
    const bool attention_norm_folded = layer_folds_norm(model, l, target, NORM_BEFORE_ATTENTION, la->qkv_fused);
    const InputRmsNorm attention_norm = input_rms_norm(model, x_in, la->attn_norm_rstd, w->attn_norm_w);
    if (!attention_norm_folded)
        norm_forward(model, la->attn_norm_out, la->attn_norm_mean, la->attn_norm_rstd, x_in, w->attn_norm_w,
                     w->attn_norm_b, N);
    // Qwen3 normalises each head's query and key (RMSNorm over head_dim, one weight for all
    // heads) between the projection and RoPE; the projections stay in q_raw / k_raw for
    // the backward.
    float *q_proj = cfg->qk_norm ? la->q_raw : la->q, *k_proj = cfg->qk_norm ? la->k_raw : la->k;
    // Fused (layer_fuses_qkv): one product from the three weights side by side (their
    // biases too), into rows [N, q | k | v] that the rotating attention op reads as columns.
    if (la->qkv_fused) {
        model_linear_forward(model, la->qkv, la->attn_norm_out, w->q_w, NULL, w->q_b, N, C, q_dim + 2 * kv_dim,
                             model->acts.kernel_rows);
    } else if (layer_takes_qkv_in_parts(model, l)) {
        float *outs[3] = {q_proj, k_proj, la->v};
        const int widths[3] = {q_dim, kv_dim, kv_dim};
        ops->matmul_forward_parts(outs, widths, 3, la->attn_norm_out, w->q_w, w->q_b, (int)N, C,
                                  attention_norm_folded ? &attention_norm : NULL);
    } else if (layer_takes_quantized_qkv_in_one_op(model, l)) {
        float *outs[3] = {q_proj, k_proj, la->v};
        const Q8Matrix *weights[3] = {&quantized->q, &quantized->k, &quantized->v};
        const float *biases[3] = {w->q_b, w->k_b, w->v_b};
        ops->matmul_forward_parts_q8(outs, weights, biases, 3, la->attn_norm_out, (int)N, C,
                                     (int)model->acts.kernel_rows, attention_norm_folded ? &attention_norm : NULL);
    } else {
        model_linear_forward(model, q_proj, la->attn_norm_out, w->q_w, quantized ? &quantized->q : NULL, w->q_b, N, C, q_dim, model->acts.kernel_rows);
        lora_forward(model, l, LORA_Q, q_proj, la->attn_norm_out, la->lora_hidden[LORA_Q], la->dora_z[LORA_Q], N);
        model_linear_forward(model, k_proj, la->attn_norm_out, w->k_w, quantized ? &quantized->k : NULL, w->k_b, N, C, kv_dim, model->acts.kernel_rows);
        lora_forward(model, l, LORA_K, k_proj, la->attn_norm_out, la->lora_hidden[LORA_K], la->dora_z[LORA_K], N);
        model_linear_forward(model, la->v, la->attn_norm_out, w->v_w, quantized ? &quantized->v : NULL, w->v_b, N, C, kv_dim, model->acts.kernel_rows);
        lora_forward(model, l, LORA_V, la->v, la->attn_norm_out, la->lora_hidden[LORA_V], la->dora_z[LORA_V], N);
    }
    if (cfg->qk_norm) { // (never fused)
        ops->rmsnorm_forward(la->q, la->q_norm_rstd, la->q_raw, w->q_norm_w, (int)(N * cfg->num_heads), cfg->head_dim,
                             cfg->norm_eps, cfg->norm_weight_plus_one);
        ops->rmsnorm_forward(la->k, la->k_norm_rstd, la->k_raw, w->k_norm_w, (int)(N * cfg->num_kv_heads),
                             cfg->head_dim, cfg->norm_eps, cfg->norm_weight_plus_one);
    }
    ops->matmul_input_release();
    const bool rotates = attention_rotates(cfg, target); // q and k stay unrotated in la->q, la->k
    const bool rotated_here = cfg->positions == POSITIONS_ROPE && !rotates;
    if (target) {
        // q and k rotated and the new keys and values written in one op (one launch on the GPU).
        const KvCache *cache = target->cache;
        // The target rows' first slot, in bytes: every element type has fixed-size slots.
        const long row_offset = (long)target->first_row * cache->capacity_T * kv_cache_slot_bytes(model, cache->type);
        char *keys = (char *)cache->k[l] + row_offset, *values = (char *)cache->v[l] + row_offset;
        ops->rotate_and_cache_write(la->q, la->k, la->v, keys, values, cache->type, a->positions, B, T,
                                    cache->capacity_T, target->slot, cfg->num_heads, cfg->num_kv_heads, cfg->head_dim,
                                    rotated_here ? rope_table(model, l) : NULL);
    } else if (rotated_here) {
        ops->rope_forward(la->q, a->positions, (int)N, cfg->num_heads, cfg->head_dim, rope_table(model, l));
        ops->rope_forward(la->k, a->positions, (int)N, cfg->num_kv_heads, cfg->head_dim, rope_table(model, l));
    }
    const float query_scale = query_scale_of(cfg);
    if (query_scale != 1.0f) ops->scale(la->q, query_scale, N * q_dim);
    // The attention's output is o's (and its adapter's) input: held, the GPU's fused
    // attention writes its bf16 copy with it.
    ops->matmul_input_hold(la->att_out, N * q_dim);
    if (target && target->decode) {
        const KvCache *cache = target->cache;
        const long row_offset = (long)target->first_row * cache->capacity_T * kv_cache_slot_bytes(model, cache->type);
        const void *keys = (const char *)cache->k[l] + row_offset, *values = (const char *)cache->v[l] + row_offset;
        const int H = cfg->num_heads, KV = cfg->num_kv_heads, D = cfg->head_dim, capacity = cache->capacity_T;
        const int slot = target->slot;
        float *out = la->att_out;
        switch (cache->type) {
        case KV_CACHE_F32:
            if (T == 1) ops->attention_decode(out, la->q, keys, values, a->row_start, B, capacity, slot + 1, H, KV, D, cfg->attn_logit_softcap, window);
            else ops->attention_extend(out, la->q, keys, values, a->row_start, B, T, capacity, slot, H, KV, D, cfg->attn_logit_softcap, window);
            break;
        case KV_CACHE_F16:
            if (T == 1) ops->attention_decode_f16(out, la->q, keys, values, a->row_start, B, capacity, slot + 1, H, KV, D, cfg->attn_logit_softcap, window);
            else ops->attention_extend_f16(out, la->q, keys, values, a->row_start, B, T, capacity, slot, H, KV, D, cfg->attn_logit_softcap, window);
            break;
        case KV_CACHE_Q8_0:
            if (T == 1) ops->attention_decode_q8(out, la->q, keys, values, a->row_start, B, capacity, slot + 1, H, KV, D, cfg->attn_logit_softcap, window);
            else ops->attention_extend_q8(out, la->q, keys, values, a->row_start, B, T, capacity, slot, H, KV, D, cfg->attn_logit_softcap, window);
            break;
        }
    } else if (packed_attention_active(model)) {
        const QkvLayout in = qkv_layout(la->q, la->k, la->v, la->qkv_fused, q_dim, kv_dim);
        packed_attention_forward(model, l, la->att_out, in.q, in.k, in.v, in.q_row_stride, in.kv_row_stride,
                                 rotates ? rope_table(model, l) : NULL);
    } else if (rotates) {
        const QkvLayout in = qkv_layout(la->q, la->k, la->v, la->qkv_fused, q_dim, kv_dim);
        ops->attention_forward_rotary(la->att_out, attention_saved_for(model, la, target), in.q, in.k, in.v, in.q_row_stride,
                                      in.kv_row_stride, a->row_start, a->positions, rope_table(model, l), B, T,
                                      cfg->num_heads, cfg->num_kv_heads, cfg->head_dim, cfg->attn_logit_softcap,
                                      window);
    } else
        ops->attention_forward(la->att_out, attention_saved_for(model, la, target), la->q, la->k, la->v, a->row_start, B, T,
                               cfg->num_heads, cfg->num_kv_heads, cfg->head_dim, cfg->attn_logit_softcap, window);
    block_output_forward(model, l, LORA_O, la, la->x_mid, la->att_out, x_in, w->o_w, quantized ? &quantized->o : NULL,
                         w->o_b, la->attn_proj, w->post_attn_norm_w, la->post_attn_norm_rstd, N, q_dim, C);
    ops->matmul_input_release();

    hold_input(ops, store, la->mlp_norm_out, N * C, false); // up and gate (and adapters) read it
    const bool mlp_norm_folded = layer_folds_norm(model, l, target, NORM_BEFORE_MLP, false);
    const InputRmsNorm mlp_norm = input_rms_norm(model, la->x_mid, la->mlp_norm_rstd, w->mlp_norm_w);
    if (!mlp_norm_folded)
        norm_forward(model, la->mlp_norm_out, la->mlp_norm_mean, la->mlp_norm_rstd, la->x_mid, w->mlp_norm_w,
                     w->mlp_norm_b, N);
    if (layer_takes_glu_in_one_op(model, l, target)) {
        // A forward no backward follows (a KV-cache step, a model without gradients): gate and
        // up go only into the activation, so one op makes act (a GPU's decode step: one
        // launch, gate and up never written). The down projection reads act, held with the
        // norm's output until both are read (the release below).
        hold_input(ops, store, la->act, N * I, false);
        if (quantized)
            ops->matmul_forward_glu_q8(la->act, la->gate, la->up, la->mlp_norm_out, &quantized->gate, &quantized->up,
                                       (int)N, C, I, cfg->mlp == MLP_GEGLU, (int)model->acts.kernel_rows,
                                       mlp_norm_folded ? &mlp_norm : NULL);
        else
            ops->matmul_forward_glu(la->act, la->gate, la->up, la->mlp_norm_out, w->gate_w, (int)N, C, I,
                                    cfg->mlp == MLP_GEGLU, mlp_norm_folded ? &mlp_norm : NULL);
    } else {
        mlp_activation_forward(model, l, la, store, N);
    }
    block_output_forward(model, l, LORA_DOWN, la, x_out, la->act, la->x_mid, w->down_w,
                         quantized ? &quantized->down : NULL, w->down_b, la->mlp_proj, w->post_mlp_norm_w,
                         la->post_mlp_norm_rstd, N, I, C);
    ops->matmul_input_release();
}

// A KV-cache forward (target) uses set 0 for every layer: no backward reads its activations,
// and the other sets may hold stored values only (model_reserve).
static LayerActivations *layer_activations(Model *model, int l, const CacheTarget *target) {
    return &model->acts.layers[model->acts.keep_all_layers && !target ? l : 0];
}

// A forward with a KV cache target writes the batch's keys and values into the cache; a
// decode step's positions continue its rows' cached ones, any other batch's count from
// each row's first real token (batch->row_start) as without a cache.
static void forward_impl(Model *model, const ModelBatch *batch, const CacheTarget *target) {
    const ModelConfig *cfg = &model->config;
    const OpsBackend *ops = model->ops;
    const int B = batch->B, T = batch->T;
    const long N = (long)B * T;
    weights_pass(model, MODEL_PASS_FORWARD);
    if (target) model_reserve_cached(model, B, T);
    else model_reserve(model, B, T);
    Activations *a = &model->acts;
    a->B = B;
    a->T = T;
    a->kernel_rows = batch->kernel_rows > 0 ? batch->kernel_rows : N;

    // Host-side preparation of ids and positions, then one copy each to the backend.
    int *positions = xmalloc((size_t)N * sizeof(int));
    int *row_start = xmalloc((size_t)B * sizeof(int));
    CHECK(!(target && model->training_pass.active), "a KV-cache forward inside a training pass");
    CHECK(!(target && batch->segments), "a KV-cache forward of packed rows");
    const bool decode = target && target->decode;
    for (int b = 0; b < B; b++) {
        int start = decode ? target->cache->row_start[target->first_row + b]
                           : batch->row_start ? batch->row_start[b] : 0;
        const int first_slot = decode ? target->slot : 0;
        CHECK(start >= 0 && start <= first_slot + T, "row %d starts at %d outside [0, %d]", b, start,
              first_slot + T);
        row_start[b] = start;
        for (int t = 0; t < T; t++) {
            int position = first_slot + t - start;
            positions[(long)b * T + t] = position > 0 ? position : 0;
        }
    }
    packed_attention_begin(model, batch, positions); // packed rows: positions by segment
    CHECK(batch->segments || !model->packed_rows_only, "a forward of unpacked rows on a model that runs packed rows only");
    for (long i = 0; i < N; i++)
        CHECK(batch->tokens[i] >= 0 && batch->tokens[i] < cfg->vocab_size,
              "token id %d at slot %ld is outside the vocabulary", batch->tokens[i], i);
    if (cfg->positions == POSITIONS_LEARNED && !batch->segments)
        for (int b = 0; b < B; b++)
            CHECK(positions[(long)b * T + T - 1] < cfg->max_position_embeddings,
                  "row %d reaches position %d, past the model's %d positions", b, positions[(long)b * T + T - 1],
                  cfg->max_position_embeddings);
    ops->copy_to_device(a->tokens, batch->tokens, (size_t)N * sizeof(int));
    ops->copy_to_device(a->positions, positions, (size_t)N * sizeof(int));
    ops->copy_to_device(a->row_start, row_start, (size_t)B * sizeof(int));
    free(positions);
    free(row_start);

    const long C = cfg->hidden_size;
    if (model->quantized && model->quantized->embedding.values) // a bitsandbytes checkpoint's stays float32
        ops->embedding_forward_q8(a->residual, a->tokens, a->positions, &model->quantized->embedding,
                                  model->weights.pos_emb, (int)N, (int)C, cfg->embedding_multiplier);
    else
        ops->embedding_forward(a->residual, a->tokens, a->positions, model->weights.tok_emb,
                               model->weights.pos_emb, (int)N, (int)C, cfg->embedding_multiplier);
    // NEFTune: the noise is additive, so the backward is the noiseless one's.
    if (model->training_pass.active && model->neftune_noise_alpha > 0)
        ops->uniform_noise_add(a->residual, N * C, (float)(model->neftune_noise_alpha / sqrt((double)T * (double)C)),
                               model->training_pass.seed,
                               rng_stream("neftune", model->training_pass.micro_batch, model->training_pass.passes));
    for (int l = 0; l < cfg->num_layers; l++) {
        weights_of_layer(model, l, true);
        // DoRA's weight norms follow the adapters, taken while the layer's weights are in place
        // (under ZeRO-3 gathered); a KV-cache continuation keeps its cache's.
        if (!decode) lora_dora_norms(model, l);
        layer_forward(model, l, layer_activations(model, l, target), residual_slice(a, l, N, C),
                      residual_slice(a, l + 1, N, C), target);
        weights_of_layer(model, l, false);
    }
    norm_forward(model, a->final_out, a->final_mean, a->final_rstd,
                 residual_slice(a, cfg->num_layers, N, C), model->weights.final_norm_w,
                 model->weights.final_norm_b, N);
    a->has_forward = true;
    // A decode step's activations cover one slot of a longer row: no backward through it.
    a->backward_ready = target == NULL;
    a->logits_valid = false;
}

void model_training_pass_begin(Model *model, uint64_t seed, uint64_t epoch, uint64_t micro_batch) {
    const bool lora_dropout = model->lora.rank > 0 && model->lora.dropout > 0;
    if (!model->grads || !(lora_dropout || model->neftune_noise_alpha > 0)) return;
    model->training_pass.active = true;
    model->training_pass.seed = seed;
    // (The key's name is from when the pass was LoRA dropout's alone: the same masks as then.)
    model->training_pass.micro_batch = rng_stream("lora_dropout_micro_batch", epoch, micro_batch);
    model->training_pass.passes = 0;
}

void model_training_pass_end(Model *model) { model->training_pass.active = false; }

void model_forward(Model *model, const ModelBatch *batch) {
    // Each forward of a training pass draws its own LoRA dropout masks and NEFTune noise; a
    // backward's recomputation (gradient checkpointing) runs inside the pass and redraws the
    // same masks (the embeddings are never recomputed).
    if (model->training_pass.active) model->training_pass.passes++;
    forward_impl(model, batch, NULL);
}

void model_forward_cached(Model *model, const ModelBatch *batch, KvCache *cache) {
    const int B = batch->B, T = batch->T;
    CHECK(cache->length == 0 || T == 1, "a KV cache takes a prefill, then one token per step");
    CHECK(cache->length + T <= cache->capacity_T && B <= cache->capacity_B,
          "KV cache of %d x %d slots is too small for %d x %d", cache->capacity_B, cache->capacity_T, B,
          cache->length + T);
    if (cache->length == 0) {
        cache->B = B;
        for (int b = 0; b < B; b++) cache->row_start[b] = batch->row_start ? batch->row_start[b] : 0;
    }
    CHECK(cache->B == B, "decode step with %d rows on a cache of %d", B, cache->B);
    CacheTarget target = {cache, 0, cache->length, cache->length > 0};
    forward_impl(model, batch, &target);
    cache->length += T;
}

// A batch of B rows of T slots written to rows [first_row, first_row + B) of the cache,
// ending at its filled length (model_prefill_rows, model_extend_rows).
static void check_rows_fit(const KvCache *cache, const ModelBatch *batch, int first_row) {
    CHECK(first_row >= 0 && first_row + batch->B <= cache->capacity_B, "rows [%d, %d) are outside a KV cache of %d rows",
          first_row, first_row + batch->B, cache->capacity_B);
    CHECK(batch->T <= cache->length && cache->length <= cache->capacity_T,
          "%d new slots must end at the cache's filled length %d", batch->T, cache->length);
}

void model_extend_rows(Model *model, const ModelBatch *batch, KvCache *cache, int first_row) {
    const int T = batch->T;
    check_rows_fit(cache, batch, first_row);
    CHECK(T == 1 || (cache->type == model->kv_cache_type && kv_cache_can_extend(model)),
          "the %s backend cannot extend cached rows of %s", model->ops->name, kv_cache_type_name(cache->type));
    CHECK(!batch->row_start, "an extension continues its rows: no padding");
    CacheTarget target = {cache, first_row, cache->length - T, true};
    forward_impl(model, batch, &target);
}

void model_prefill_rows(Model *model, const ModelBatch *batch, KvCache *cache, int first_row) {
    const int B = batch->B, T = batch->T;
    check_rows_fit(cache, batch, first_row);
    const int slot = cache->length - T;
    for (int b = 0; b < B; b++) cache->row_start[first_row + b] = slot + (batch->row_start ? batch->row_start[b] : 0);
    CacheTarget target = {cache, first_row, slot, false};
    forward_impl(model, batch, &target);
}

static const float *lm_head_weight(const Model *model) {
    return model->weights.lm_head ? model->weights.lm_head : model->weights.tok_emb;
}

static const Q8Matrix *lm_head_quantized(const Model *model) {
    return model->quantized ? &model->quantized->lm_head : NULL;
}

// The LM head on `rows` rows of hidden states, Gemma 2's final soft cap included.
static void lm_head_forward(Model *model, float *logits, const float *hidden, long rows, long kernel_rows) {
    const ModelConfig *cfg = &model->config;
    model_linear_forward(model, logits, hidden, lm_head_weight(model), lm_head_quantized(model), NULL, rows,
                         cfg->hidden_size, cfg->vocab_size, kernel_rows);
    if (cfg->final_logit_softcap > 0.0f)
        model->ops->soft_cap_forward(logits, rows * cfg->vocab_size, cfg->final_logit_softcap);
}

static void compute_logits(Model *model) {
    Activations *a = &model->acts;
    CHECK(model->has_lm_head, "model has no LM head");
    CHECK(a->has_forward, "logits requested before a forward pass");
    if (a->logits_valid && !a->head_compact) return;
    a->head_compact = false;
    a->logprobs_ready = false;
    const ModelConfig *cfg = &model->config;
    const long capacity_N = (long)a->capacity_B * a->capacity_T;
    if (!a->logits) {
        a->logits = alloc_floats(model->ops, capacity_N * cfg->vocab_size);
        a->lse = alloc_floats(model->ops, capacity_N);
    }
    const long N = (long)a->B * a->T;
    lm_head_forward(model, a->logits, a->final_out, N, N);
    a->logits_valid = true;
}

// Finds the runs of consecutive slots with a target (targets[i] >= 0). Returns their rows.
static long find_head_runs(Activations *a, const int *targets, long N) {
    if (!a->head_run_start) {
        long capacity = (long)a->capacity_B * a->capacity_T;
        a->head_run_start = xmalloc((size_t)capacity * sizeof(long));
        a->head_run_len = xmalloc((size_t)capacity * sizeof(long));
    }
    a->head_runs = 0;
    long rows = 0;
    for (long i = 0; i < N; i++) {
        if (targets[i] < 0) continue;
        if (a->head_runs > 0 && a->head_run_start[a->head_runs - 1] + a->head_run_len[a->head_runs - 1] == i) {
            a->head_run_len[a->head_runs - 1]++;
        } else {
            a->head_run_start[a->head_runs] = i;
            a->head_run_len[a->head_runs++] = 1;
        }
        rows++;
    }
    return rows;
}

// Moves values between slot order and the gathered rows of the head's runs: `width`
// elements of `size` bytes per slot, in host memory (slots_to_rows: gather, else scatter;
// a scatter leaves the slots between runs as they are).
static void move_head_rows(const Activations *a, void *rows, void *slots, size_t width, bool slots_to_rows) {
    for (long r = 0, row = 0; r < a->head_runs; row += a->head_run_len[r], r++) {
        char *at_row = (char *)rows + (size_t)row * width, *at_slot = (char *)slots + (size_t)a->head_run_start[r] * width;
        size_t bytes = (size_t)a->head_run_len[r] * width;
        memcpy(slots_to_rows ? at_row : at_slot, slots_to_rows ? at_slot : at_row, bytes);
    }
}

// The same for [., C] rows in backend memory.
static void move_head_hidden(const Model *model, float *rows, float *slots, bool slots_to_rows) {
    const Activations *a = &model->acts;
    const long C = model->config.hidden_size;
    for (long r = 0, row = 0; r < a->head_runs; row += a->head_run_len[r], r++) {
        float *at_row = rows + row * C, *at_slot = slots + a->head_run_start[r] * C;
        model->ops->copy_rows(slots_to_rows ? at_row : at_slot, C, slots_to_rows ? at_slot : at_row, C,
                              (int)a->head_run_len[r], (int)C);
    }
}

// The LM head and log-probs on the slots with a target only: their final hidden states are
// gathered into head_hidden (head_rows rows), and logits, lse and targets hold those rows.
static void compact_logprobs(Model *model, const int *targets, float *logp, float *entropy) {
    Activations *a = &model->acts;
    const OpsBackend *ops = model->ops;
    const ModelConfig *cfg = &model->config;
    const long C = cfg->hidden_size, V = cfg->vocab_size, N = (long)a->B * a->T;
    const long M = a->head_rows;
    const long capacity_N = (long)a->capacity_B * a->capacity_T;
    if (!a->logits) {
        a->logits = alloc_floats(ops, capacity_N * V);
        a->lse = alloc_floats(ops, capacity_N);
    }
    if (!a->head_hidden) a->head_hidden = alloc_floats(ops, capacity_N * C);
    int *packed_targets = xmalloc((size_t)(M + 1) * sizeof(int));
    move_head_hidden(model, a->head_hidden, a->final_out, true);
    move_head_rows(a, packed_targets, (void *)targets, sizeof(int), true);
    lm_head_forward(model, a->logits, a->head_hidden, M, M);
    a->logits_valid = true;
    a->head_compact = true;
    ops->copy_to_device(a->targets, packed_targets, (size_t)M * sizeof(int));
    ops->logprob_forward(logp ? a->logp_device : NULL, a->lse, NULL, entropy ? a->entropy_device : NULL, a->logits,
                         a->targets, (int)M, (int)V);
    // Back to slot order; slots without a target get 0.
    float *packed = xmalloc((size_t)(M + 1) * sizeof(float));
    float *outputs[2] = {logp, entropy};
    float *device[2] = {a->logp_device, a->entropy_device};
    for (int k = 0; k < 2; k++) {
        if (!outputs[k]) continue;
        ops->copy_to_host(packed, device[k], (size_t)M * sizeof(float));
        memset(outputs[k], 0, (size_t)N * sizeof(float));
        move_head_rows(a, packed, outputs[k], sizeof(float), false);
    }
    free(packed), free(packed_targets);
}

void model_logprobs(Model *model, const int *targets, float *logp, int *top1, float *entropy) {
    Activations *a = &model->acts;
    const OpsBackend *ops = model->ops;
    const long N = (long)a->B * a->T;
    const int V = model->config.vocab_size;
    CHECK(model->has_lm_head, "model has no LM head");
    CHECK(a->has_forward, "log-probs requested before a forward pass");
    if (targets) {
        for (long i = 0; i < N; i++)
            CHECK(targets[i] < V, "target id %d at slot %ld is outside the vocabulary",
                  targets[i], i);
        // top1 is wanted at every slot (also those without a target): then the whole head runs.
        if (!top1) {
            a->head_rows = find_head_runs(a, targets, N);
            // Gathering costs a copy of the rows: worth it when it skips at least 1/8 of them.
            if (a->head_rows <= N - N / 8) {
                compact_logprobs(model, targets, logp, entropy);
                a->logprobs_ready = true;
                return;
            }
        }
    }
    compute_logits(model);
    if (targets) ops->copy_to_device(a->targets, targets, (size_t)N * sizeof(int));
    ops->logprob_forward(logp ? a->logp_device : NULL, a->lse, top1 ? a->top1_device : NULL,
                         entropy ? a->entropy_device : NULL, a->logits,
                         targets ? a->targets : NULL, (int)N, V);
    if (logp) ops->copy_to_host(logp, a->logp_device, (size_t)N * sizeof(float));
    if (top1) ops->copy_to_host(top1, a->top1_device, (size_t)N * sizeof(int));
    if (entropy) ops->copy_to_host(entropy, a->entropy_device, (size_t)N * sizeof(float));
    a->logprobs_ready = true;
}

void model_collision_entropy(Model *model, float *collision) {
    Activations *a = &model->acts;
    const OpsBackend *ops = model->ops;
    const long N = (long)a->B * a->T;
    CHECK(a->logits_valid && a->logprobs_ready, "collision entropy requested without model_logprobs on this forward");
    // The head's rows: every slot, or the gathered slots with a target.
    const long rows = a->head_compact ? a->head_rows : N;
    ops->collision_entropy_forward(a->entropy_device, a->logits, (int)rows, model->config.vocab_size);
    if (!a->head_compact) {
        ops->copy_to_host(collision, a->entropy_device, (size_t)N * sizeof(float));
        return;
    }
    float *packed = xmalloc((size_t)(rows + 1) * sizeof(float));
    ops->copy_to_host(packed, a->entropy_device, (size_t)rows * sizeof(float));
    memset(collision, 0, (size_t)N * sizeof(float));
    move_head_rows(a, packed, collision, sizeof(float), false);
    free(packed);
}

// The logits of each row's last slot into a->last_logits, in the backend's memory.
static void last_slot_logits(Model *model) {
    Activations *a = &model->acts;
    const ModelConfig *cfg = &model->config;
    CHECK(model->has_lm_head, "model has no LM head");
    const int B = a->B, T = a->T, C = cfg->hidden_size;
    // Its own [B, V] buffer: the full logits buffer is [B * T, V] for a prefill's shape
    // (393 MB for 4 rows of 500 tokens of a 49k vocabulary) to hold B rows. On the CPU only
    // the pages written count, but a GPU allocation is all real memory.
    model->ops->copy_rows(a->last_hidden, C, a->final_out + (long)(T - 1) * C, (long)T * C, B, C);
    lm_head_forward(model, a->last_logits, a->last_hidden, B, B);
}

void model_last_logits(Model *model, float *logits) {
    last_slot_logits(model);
    const Activations *a = &model->acts;
    model->ops->copy_to_host(logits, a->last_logits, (size_t)a->B * model->config.vocab_size * sizeof(float));
}

void model_last_greedy(Model *model, int *tokens, float *logprobs) {
    last_slot_logits(model);
    Activations *a = &model->acts;
    const OpsBackend *ops = model->ops;
    // top1 is also the targets: each row's log-prob is its argmax's (ops.h)
    ops->logprob_forward(a->logp_device, a->last_lse, a->top1_device, NULL, a->last_logits, a->top1_device, a->B,
                         model->config.vocab_size);
    ops->copy_to_host(tokens, a->top1_device, (size_t)a->B * sizeof(int));
    ops->copy_to_host(logprobs, a->logp_device, (size_t)a->B * sizeof(float));
}

bool model_last_sampled(Model *model, const float *inv_temperature, const double *uniform, int *tokens,
                        float *logprobs, float *sampling_logprobs) {
    const OpsBackend *ops = model->ops;
    if (!ops->samples_whole_rows || !ops->sample_rows) return false;
    last_slot_logits(model);
    Activations *a = &model->acts;
    const int B = a->B;
    ops->copy_to_device(a->sample_inverse, inv_temperature, (size_t)B * sizeof(float));
    ops->copy_to_device(a->sample_uniform, uniform, (size_t)B * sizeof(double));
    // (the head's staging buffers hold the outputs: top1 the tokens, logp and entropy the log-probs)
    ops->sample_rows(a->top1_device, a->logp_device, a->entropy_device, a->last_logits, a->sample_inverse,
                     a->sample_uniform, B, model->config.vocab_size);
    ops->copy_to_host(tokens, a->top1_device, (size_t)B * sizeof(int));
    ops->copy_to_host(logprobs, a->logp_device, (size_t)B * sizeof(float));
    ops->copy_to_host(sampling_logprobs, a->entropy_device, (size_t)B * sizeof(float));
    return true;
}

bool model_last_candidates(Model *model, const float *inv_temperature, const int *top_k, int capacity, int *counts,
                           int *ids, float *values, double *lse, double *scaled_lse) {
    last_slot_logits(model);
    Activations *a = &model->acts;
    const OpsBackend *ops = model->ops;
    const int B = a->B;
    if (capacity != a->candidate_capacity) { // (one capacity for a whole generate call)
        void *old[] = {a->candidate_inverse, a->candidate_values, a->candidate_top_k,
                       a->candidate_counts,  a->candidate_ids,    a->candidate_lse, a->candidate_scaled_lse};
        for (size_t i = 0; i < sizeof old / sizeof old[0]; i++)
            if (old[i]) ops->free(old[i]);
        const size_t rows = (size_t)a->capacity_rows;
        a->candidate_inverse = ops->alloc(rows * sizeof(float));
        a->candidate_top_k = ops->alloc(rows * sizeof(int));
        a->candidate_counts = ops->alloc(rows * sizeof(int));
        a->candidate_lse = ops->alloc(rows * sizeof(double));
        a->candidate_scaled_lse = ops->alloc(rows * sizeof(double));
        a->candidate_ids = ops->alloc(rows * capacity * sizeof(int));
        a->candidate_values = ops->alloc(rows * capacity * sizeof(float));
        a->candidate_capacity = capacity;
    }
    ops->copy_to_device(a->candidate_inverse, inv_temperature, (size_t)B * sizeof(float));
    ops->copy_to_device(a->candidate_top_k, top_k, (size_t)B * sizeof(int));
    ops->sampling_candidates(a->candidate_counts, a->candidate_ids, a->candidate_values, a->candidate_lse,
                             scaled_lse ? a->candidate_scaled_lse : NULL, a->last_logits, a->candidate_inverse,
                             a->candidate_top_k, B, model->config.vocab_size, capacity);
    ops->copy_to_host(counts, a->candidate_counts, (size_t)B * sizeof(int));
    for (int b = 0; b < B; b++)
        if (counts[b] > capacity) return false;
    ops->copy_to_host(lse, a->candidate_lse, (size_t)B * sizeof(double));
    if (scaled_lse) ops->copy_to_host(scaled_lse, a->candidate_scaled_lse, (size_t)B * sizeof(double));
    ops->copy_to_host(ids, a->candidate_ids, (size_t)B * capacity * sizeof(int));
    ops->copy_to_host(values, a->candidate_values, (size_t)B * capacity * sizeof(float));
    return true;
}

void model_logits_row(Model *model, int i, float *out) {
    compute_logits(model);
    const int V = model->config.vocab_size;
    model->ops->copy_to_host(out, model->acts.logits + (long)i * V, (size_t)V * sizeof(float));
}

void model_values(Model *model, float *values) {
    Activations *a = &model->acts;
    CHECK(model->has_value_head, "model has no value head");
    CHECK(a->has_forward, "values requested before a forward pass");
    const long N = (long)a->B * a->T;
    model->ops->value_head_forward(a->values_device, a->final_out, model->weights.value_head,
                                   (int)N, model->config.hidden_size);
    model->ops->copy_to_host(values, a->values_device, (size_t)N * sizeof(float));
}

void model_hidden_slots(Model *model, int b, int first, int count, float *out) {
    const Activations *a = &model->acts;
    CHECK(a->has_forward, "hidden states requested before a forward pass");
    CHECK(b >= 0 && b < a->B && first >= 0 && count >= 0 && first + count <= a->T,
          "slots [%d, %d) of row %d are outside the last forward's %d x %d", first, first + count, b, a->B, a->T);
    const long C = model->config.hidden_size;
    model->ops->copy_to_host(out, a->final_out + ((long)b * a->T + first) * C, (size_t)count * C * sizeof(float));
}

// ---------------------------------------------------------------------------------------
// Backward

// The attention's backward and the q/k/v product's of a layer whose forward fused them
// (layer_fuses_qkv): the attention op writes dq, dk and dv as the columns of rows
// [N, dq | dk | dv] (dqkv, held: on a GPU its last writer, the RoPE backward, writes the
// product's bf16 copy of it), then one product gives the three weights' (and biases')
// gradients and d_norm_out, written over as the q product's was.
static void attention_backward_fused_qkv(Model *model, int l, const LayerActivations *la) {
    const ModelConfig *cfg = &model->config;
    const OpsBackend *ops = model->ops;
    const LayerTensors *w = &model->weights.layers[l];
    const LayerTensors *g = &model->gradients.layers[l];
    Activations *a = &model->acts;
    const long N = (long)a->B * a->T;
    const int C = cfg->hidden_size;
    const int q_dim = cfg->num_heads * cfg->head_dim, kv_dim = cfg->num_kv_heads * cfg->head_dim;
    const int width = q_dim + 2 * kv_dim;
    const QkvLayout in = qkv_layout(la->q, la->k, la->v, true, q_dim, kv_dim);
    const QkvLayout out = qkv_layout(a->dq, a->dk, a->dv, true, q_dim, kv_dim);
    ops->matmul_input_hold(a->dqkv, N * width);
    if (packed_attention_active(model))
        packed_attention_backward(model, l, out.q, out.k, out.v, a->d_att_out, in.q, in.k, in.v, width, width,
                                  rope_table(model, l));
    else
        ops->attention_backward_rotary(out.q, out.k, out.v, a->d_att_out, la->att_out, la->attention_saved, in.q,
                                       in.k, in.v, width, width, a->row_start, a->positions, rope_table(model, l),
                                       a->B, a->T, cfg->num_heads, cfg->num_kv_heads, cfg->head_dim,
                                       cfg->attn_logit_softcap, config_layer_window(cfg, l));
    hold_input(ops, la->inputs_stored, la->attn_norm_out, N * C, true); // the weight gradients read it
    float *const gradients[] = {g->q_w, g->k_w, g->v_w, g->q_b, g->k_b, g->v_b};
    // qkv_adjacent: g->q_w and g->q_b start the three weights' and biases' gradients.
    ops->matmul_backward(a->d_norm_out, g->q_w, g->q_b, a->dqkv, la->attn_norm_out, w->q_w, (int)N, C, width,
                         WRITE_OVERWRITE, model_gradients_write_mode(model, gradients, 6));
}

// On entry d_resid holds d loss / d x_{l+1}; on exit d loss / d x_l. d_resid is held
// (matmul_input_hold) from each norm backward that writes it to the product that reads it
// as its output gradient: down's here, from the norm backward that ends the layer above (or
// the final norm's, model_backward), and o's, from the MLP norm's backward. With sandwich
// norms those products read d_branch instead, held in its place.
static void layer_backward(Model *model, int l, const LayerActivations *la, const float *x_in) {
    const ModelConfig *cfg = &model->config;
    const OpsBackend *ops = model->ops;
    const LayerTensors *w = &model->weights.layers[l];
    const LayerTensors *g = &model->gradients.layers[l];
    const QuantizedLayer *qz = model->quantized ? &model->quantized->layers[l] : NULL;
    Activations *a = &model->acts;
    const int B = a->B, T = a->T;
    const int window = config_layer_window(cfg, l);
    const long N = (long)B * T;
    const int C = cfg->hidden_size, I = cfg->intermediate_size;
    const int q_dim = cfg->num_heads * cfg->head_dim, kv_dim = cfg->num_kv_heads * cfg->head_dim;

    // MLP block: x_{l+1} = x_mid + down(act), with sandwich norms x_mid + norm(down(act)):
    // then d_branch is the gradient of down's output.
    const float *d_mlp_out = a->d_resid;
    if (cfg->sandwich_norms) {
        ops->matmul_input_release(); // d_resid: not down's output gradient here
        ops->fill_zero(a->d_branch, N * C);
        ops->matmul_input_hold(a->d_branch, N * C);
        norm_backward(model, a->d_branch, g->post_mlp_norm_w, NULL, a->d_resid, la->mlp_proj, w->post_mlp_norm_w, NULL,
                      la->post_mlp_norm_rstd, N);
        d_mlp_out = a->d_branch;
    }
    // The first writer of each fresh gradient buffer overwrites it (WRITE_OVERWRITE, and the
    // activations' backward ops): no zero-fills. The later ones add.
    // Down's input gradient first, its weight gradient after the activation's backward: that
    // op recomputes act and, act being held, writes act's bf16 copy (a GPU), so the weight
    // gradient reads no fp32 act to convert. (LoRA's A reads act before: converted once.)
    // When the forward stored act (layer_stores_inputs), its copy is still there: the
    // activation's backward leaves it, and the activation writes its input gradients
    // stored too, as only gate's and up's products read them; so is down's input gradient,
    // which only the activation's backward reads.
    const bool stored = la->inputs_stored;
    const float *down_dout = lora_dora_dout(model, l, LORA_DOWN, d_mlp_out, la->dora_z[LORA_DOWN], N);
    hold_input(ops, stored, la->act, N * I, true);
    if (stored) ops->hold_stored(a->d_act, N * I, false);
    model_linear_backward(model, a->d_act, NULL, NULL, down_dout, la->act, w->down_w, qz ? &qz->down : NULL, N, I, C,
                          WRITE_OVERWRITE);
    lora_backward(model, l, LORA_DOWN, a->d_act, d_mlp_out, la->act, la->lora_hidden[LORA_DOWN], N);
    const bool gated = cfg->mlp != MLP_GELU; // gate's backward writes d_norm_out first, else up's
    // Gate's and up's weight gradients read mlp_norm_out; their output gradients are the
    // activation's, which writes their bf16 copies with them when held (a GPU).
    hold_input(ops, stored, la->mlp_norm_out, N * C, true);
    hold_input(ops, stored, a->d_up, N * I, false);
    if (gated) hold_input(ops, stored, a->d_gate, N * I, false);
    // The forward's outputs of up and gate, which the activation's backward reads (8 holds
    // here: d_resid or d_branch, act, d_act, mlp_norm_out, d_up, d_gate, up, gate).
    if (stored) store_mlp_products(ops, la, gated, N * I, true);
    if (!gated) ops->gelu_backward(a->d_up, a->d_act, la->up, la->act, N * I);
    else ops->glu_backward(a->d_gate, a->d_up, a->d_act, la->gate, la->up, la->act, N * I, cfg->mlp == MLP_GEGLU);
    if (g->down_w || g->down_b)
        model_linear_backward(model, NULL, g->down_w, g->down_b, down_dout, la->act, w->down_w, qz ? &qz->down : NULL,
                              N, I, C, WRITE_OVERWRITE);
    if (gated) {
        model_linear_backward(model, a->d_norm_out, g->gate_w, NULL,
                        lora_dora_dout(model, l, LORA_GATE, a->d_gate, la->dora_z[LORA_GATE], N), la->mlp_norm_out,
                        w->gate_w, qz ? &qz->gate : NULL, N, C, I, WRITE_OVERWRITE);
        lora_backward(model, l, LORA_GATE, a->d_norm_out, a->d_gate, la->mlp_norm_out,
                      la->lora_hidden[LORA_GATE], N);
    }
    model_linear_backward(model, a->d_norm_out, g->up_w, g->up_b,
                    lora_dora_dout(model, l, LORA_UP, a->d_up, la->dora_z[LORA_UP], N), la->mlp_norm_out,
                    w->up_w, qz ? &qz->up : NULL, N, C, I, gated ? WRITE_ADD : WRITE_OVERWRITE);
    lora_backward(model, l, LORA_UP, a->d_norm_out, a->d_up, la->mlp_norm_out, la->lora_hidden[LORA_UP], N);
    ops->matmul_input_release();
    // d_resid already carries the residual path into x_mid; add the norm's branch.
    ops->matmul_input_hold(a->d_resid, N * C); // o's output gradient
    norm_backward(model, a->d_resid, g->mlp_norm_w, g->mlp_norm_b, a->d_norm_out, la->x_mid,
                  w->mlp_norm_w, la->mlp_norm_mean, la->mlp_norm_rstd, N);

    // Attention block: x_mid = x_l + o_proj(att_out) (sandwich: x_l + norm(o_proj(att_out)))
    const float *d_attn_out = a->d_resid;
    if (cfg->sandwich_norms) {
        ops->matmul_input_release(); // d_resid: not o's output gradient here
        ops->fill_zero(a->d_branch, N * C);
        ops->matmul_input_hold(a->d_branch, N * C);
        norm_backward(model, a->d_branch, g->post_attn_norm_w, NULL, a->d_resid, la->attn_proj, w->post_attn_norm_w,
                      NULL, la->post_attn_norm_rstd, N);
        d_attn_out = a->d_branch;
    }
    model_linear_backward(model, a->d_att_out, g->o_w, g->o_b,
                    lora_dora_dout(model, l, LORA_O, d_attn_out, la->dora_z[LORA_O], N), la->att_out,
                    w->o_w, qz ? &qz->o : NULL, N, q_dim, C, WRITE_OVERWRITE);
    lora_backward(model, l, LORA_O, a->d_att_out, d_attn_out, la->att_out, la->lora_hidden[LORA_O], N);
    ops->matmul_input_release(); // d_resid (d_branch)
    if (la->qkv_fused) {
        attention_backward_fused_qkv(model, l, la);
    } else {
        // The q and k projections' output gradients (dq_raw, dk_raw under Qwen3's norms) are
        // written last by the RoPE backward (or those norms' backward), which writes their bf16
        // copies when they are held.
        float *dq = cfg->qk_norm ? a->dq_raw : a->dq, *dk = cfg->qk_norm ? a->dk_raw : a->dk;
        ops->matmul_input_hold(dq, N * q_dim);
        ops->matmul_input_hold(dk, N * kv_dim);
        const bool rotates = attention_rotates(cfg, NULL); // then its backward rotates dq and dk back
        if (packed_attention_active(model))
            packed_attention_backward(model, l, a->dq, a->dk, a->dv, a->d_att_out, la->q, la->k, la->v, q_dim, kv_dim,
                                      rotates ? rope_table(model, l) : NULL);
        else if (rotates)
            ops->attention_backward_rotary(a->dq, a->dk, a->dv, a->d_att_out, la->att_out, la->attention_saved, la->q,
                                           la->k, la->v, q_dim, kv_dim, a->row_start, a->positions,
                                           rope_table(model, l), B, T, cfg->num_heads, cfg->num_kv_heads,
                                           cfg->head_dim, cfg->attn_logit_softcap, window);
        else
            ops->attention_backward(a->dq, a->dk, a->dv, a->d_att_out, la->att_out, la->attention_saved, la->q, la->k,
                                    la->v, a->row_start, B, T, cfg->num_heads, cfg->num_kv_heads, cfg->head_dim,
                                    cfg->attn_logit_softcap, window);
        const float query_scale = query_scale_of(cfg);
        if (query_scale != 1.0f) ops->scale(a->dq, query_scale, N * q_dim);
        if (cfg->positions == POSITIONS_ROPE && !rotates) {
            ops->rope_backward(a->dq, a->positions, (int)N, cfg->num_heads, cfg->head_dim, rope_table(model, l));
            ops->rope_backward(a->dk, a->positions, (int)N, cfg->num_kv_heads, cfg->head_dim, rope_table(model, l));
        }
        if (cfg->qk_norm) {
            ops->fill_zero(a->dq_raw, N * q_dim);
            ops->fill_zero(a->dk_raw, N * kv_dim);
            ops->rmsnorm_backward(a->dq_raw, model_gradient_to_add(model, g->q_norm_w), a->dq, la->q_raw, w->q_norm_w,
                                  la->q_norm_rstd, (int)(N * cfg->num_heads), cfg->head_dim, cfg->norm_weight_plus_one);
            ops->rmsnorm_backward(a->dk_raw, model_gradient_to_add(model, g->k_norm_w), a->dk, la->k_raw, w->k_norm_w,
                                  la->k_norm_rstd, (int)(N * cfg->num_kv_heads), cfg->head_dim, cfg->norm_weight_plus_one);
        }
        hold_input(ops, stored, la->attn_norm_out, N * C, true); // q's, k's and v's weight gradients read it
        model_linear_backward(model, a->d_norm_out, g->q_w, g->q_b,
                        lora_dora_dout(model, l, LORA_Q, dq, la->dora_z[LORA_Q], N), la->attn_norm_out,
                        w->q_w, qz ? &qz->q : NULL, N, C, q_dim, WRITE_OVERWRITE);
        lora_backward(model, l, LORA_Q, a->d_norm_out, dq, la->attn_norm_out, la->lora_hidden[LORA_Q], N);
        model_linear_backward(model, a->d_norm_out, g->k_w, g->k_b,
                        lora_dora_dout(model, l, LORA_K, dk, la->dora_z[LORA_K], N), la->attn_norm_out,
                        w->k_w, qz ? &qz->k : NULL, N, C, kv_dim, WRITE_ADD);
        lora_backward(model, l, LORA_K, a->d_norm_out, dk, la->attn_norm_out, la->lora_hidden[LORA_K], N);
        model_linear_backward(model, a->d_norm_out, g->v_w, g->v_b,
                        lora_dora_dout(model, l, LORA_V, a->dv, la->dora_z[LORA_V], N), la->attn_norm_out,
                        w->v_w, qz ? &qz->v : NULL, N, C, kv_dim, WRITE_ADD);
        lora_backward(model, l, LORA_V, a->d_norm_out, a->dv, la->attn_norm_out, la->lora_hidden[LORA_V], N);
    }
    ops->matmul_input_release();
    ops->matmul_input_hold(a->d_resid, N * C); // the output gradient of the layer below's down
    norm_backward(model, a->d_resid, g->attn_norm_w, g->attn_norm_b, a->d_norm_out, x_in,
                  w->attn_norm_w, la->attn_norm_mean, la->attn_norm_rstd, N);
}

void model_backward(Model *model, const float *dlogp, const float *dentropy,
                    const float *dvalue) {
    const ModelConfig *cfg = &model->config;
    const OpsBackend *ops = model->ops;
    Activations *a = &model->acts;
    CHECK(model->grads, "backward on a model without gradients (call model_enable_grad)");
    CHECK(a->has_forward && a->backward_ready && a->backward_buffers, "backward without a (non-cached) forward pass");
    const long N = (long)a->B * a->T, C = cfg->hidden_size;
    weights_pass(model, MODEL_PASS_BACKWARD);

    ops->fill_zero(a->d_hidden, N * C);
    if (dlogp || dentropy) {
        CHECK(a->logits_valid && a->logprobs_ready, "backward through log-probs without model_logprobs");
        // The head's rows: every slot, or the gathered slots with a target (model_logprobs).
        const long M = a->head_compact ? a->head_rows : N;
        float *dlogp_device = dlogp ? a->d_head : NULL;
        float *dentropy_device = dentropy ? a->d_head + N : NULL;
        const float *host[2] = {dlogp, dentropy};
        float *device[2] = {dlogp_device, dentropy_device};
        float *packed = a->head_compact ? xmalloc((size_t)(M + 1) * sizeof(float)) : NULL;
        for (int k = 0; k < 2; k++) {
            if (!host[k]) continue;
            if (!a->head_compact) {
                ops->copy_to_device(device[k], host[k], (size_t)N * sizeof(float));
                continue;
            }
            move_head_rows(a, packed, (void *)host[k], sizeof(float), true);
            ops->copy_to_device(device[k], packed, (size_t)M * sizeof(float));
        }
        free(packed);
        // The logits' gradient is the LM head's output gradient: held, a GPU's log-prob
        // backward writes its bf16 copy with it instead of the head's products converting it.
        ops->matmul_input_hold(a->logits, M * cfg->vocab_size);
        ops->logprob_backward(a->logits, dlogp_device, dentropy_device, a->targets, a->lse,
                              (int)M, cfg->vocab_size, cfg->final_logit_softcap);
        a->logits_valid = false; // the buffer now holds d logits
        float *d_lm_head = model->gradients.lm_head ? model->gradients.lm_head
                                                    : model->gradients.tok_emb;
        if (!a->head_compact) {
            model_linear_backward(model, a->d_hidden, d_lm_head, NULL, a->logits, a->final_out, lm_head_weight(model),
                            lm_head_quantized(model), N, (int)C, cfg->vocab_size, WRITE_ADD);
        } else {
            // d_norm_out is free until the layers' backward: the gathered rows' gradient,
            // then scattered to their slots (the others stay 0).
            model_linear_backward(model, a->d_norm_out, d_lm_head, NULL, a->logits, a->head_hidden, lm_head_weight(model),
                            lm_head_quantized(model), M, (int)C, cfg->vocab_size, WRITE_OVERWRITE);
            move_head_hidden(model, a->d_norm_out, a->d_hidden, false);
        }
        ops->matmul_input_release();
    }
    if (dvalue) {
        CHECK(model->has_value_head, "dvalue given to a model without a value head");
        float *dvalue_device = a->d_head + 2 * N;
        ops->copy_to_device(dvalue_device, dvalue, (size_t)N * sizeof(float));
        ops->value_head_backward(a->d_hidden, model_gradient_to_add(model, model->gradients.value_head),
                                 dvalue_device, a->final_out, model->weights.value_head, (int)N, (int)C);
    }

    const int L = cfg->num_layers;
    ops->fill_zero(a->d_resid, N * C);
    ops->matmul_input_hold(a->d_resid, N * C); // the last layer's down reads it (layer_backward)
    norm_backward(model, a->d_resid, model->gradients.final_norm_w,
                  model->gradients.final_norm_b, a->d_hidden, residual_slice(a, L, N, C),
                  model->weights.final_norm_w, a->final_mean, a->final_rstd, N);
    gradients_ready(model, L);
    for (int l = L - 1; l >= 0; l--) {
        const float *x_in = residual_slice(a, l, N, C);
        LayerActivations *la = layer_activations(model, l, NULL);
        weights_of_layer(model, l, true);
        // Gradient checkpointing: rebuild this layer's activations from its saved input.
        // The recomputed output equals the saved x_{l+1} bit for bit.
        if (!a->keep_all_layers) layer_forward(model, l, la, x_in, residual_slice(a, l + 1, N, C), NULL);
        layer_backward(model, l, la, x_in);
        gradients_ready(model, l);
        weights_of_layer(model, l, false);
    }
    ops->matmul_input_release(); // d_resid, held for a layer below the first
    ops->embedding_backward(model_gradient_to_add(model, model->gradients.tok_emb),
                            model_gradient_to_add(model, model->gradients.pos_emb), a->d_resid,
                            a->tokens, a->positions, (int)N, (int)C, cfg->embedding_multiplier);
    a->has_forward = false;
    gradients_ready(model, -1);
}
