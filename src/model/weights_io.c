#include "model/weights_io.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/check.h"
#include "core/rng.h"
#include "io/fs.h"
#include "io/gguf.h"
#include "io/gguf_dequant.h"
#include "io/gguf_write.h"
#include "io/safetensors.h"
#include "model/bnb_checkpoint.h"
#include "model/config_gguf.h"
#include "model/config_hf.h"
#include "model/lora.h"
#include "model/quantize.h"
#include "model/tensor_map.h"

bool path_is_gguf(const char *path) {
    if (!fs_is_file(path)) return false;
    FILE *file = fopen(path, "rb");
    if (!file) return false;
    char magic[4] = {0};
    size_t got = fread(magic, 1, 4, file);
    fclose(file);
    return got == 4 && memcmp(magic, "GGUF", 4) == 0;
}

int model_read_config(ModelConfig *cfg, const char *path) {
    memset(cfg, 0, sizeof *cfg);
    if (path_is_gguf(path)) {
        GgufFile gguf;
        if (gguf_open(&gguf, path) != 0) return -1;
        int rc = config_from_gguf(cfg, &gguf, path);
        gguf_close(&gguf);
        return rc;
    }
    if (!fs_is_dir(path)) {
        if (!fs_exists(path)) return err_set("model path does not exist (%s)", path);
        return err_set("model must be a Hugging Face folder or a .gguf file (%s)", path);
    }
    char *config_path = fs_join(path, "config.json");
    int rc = config_from_hf_json(cfg, config_path);
    free(config_path);
    return rc;
}

typedef enum { FORMAT_HF, FORMAT_GGUF } FileFormat;

typedef struct {
    FileFormat format;
    const char *path;
    SafetensorsSet *safetensors;
    GgufFile gguf;
    const char *gpt2_prefix; // "transformer." or "" for HF GPT-2 files
} WeightSource;

static void map_entry(const WeightSource *src, const ModelConfig *cfg, const ParamEntry *e,
                      TensorMap *map) {
    if (src->format == FORMAT_GGUF) tensor_map_gguf(cfg, e, map);
    else tensor_map_hf(cfg, e, src->gpt2_prefix, map);
}

// Reads source tensor `name` of the given shape (in the file's own layout) as f32.
static int source_read(WeightSource *src, const TensorMap *map, float *dst) {
    if (src->format == FORMAT_HF)
        return safetensors_load_f32(src->safetensors, map->source, map->ndim, map->shape, dst);
    const GgufTensor *t = gguf_find_tensor(&src->gguf, map->source);
    if (!t) return err_set("GGUF file has no tensor '%s' (%s)", map->source, src->path);
    // GGUF lists dimensions innermost first.
    bool ok = map->ndim == 2 ? (t->n_dims == 2 && t->ne[0] == map->shape[1] && t->ne[1] == map->shape[0])
                             : (t->n_dims == 1 && t->ne[0] == map->shape[0]);
    if (!ok) {
        char got[64];
        if (t->n_dims == 1) snprintf(got, sizeof got, "[%lld]", (long long)t->ne[0]);
        else snprintf(got, sizeof got, "[%lld, %lld]", (long long)t->ne[1], (long long)t->ne[0]);
        if (map->ndim == 2)
            return err_set("tensor '%s' has shape %s but the model expects [%lld, %lld] (%s)", map->source,
                           got, map->shape[0], map->shape[1], src->path);
        return err_set("tensor '%s' has shape %s but the model expects [%lld] (%s)", map->source, got,
                       map->shape[0], src->path);
    }
    return gguf_tensor_to_f32(&src->gguf, t, dst);
}

// Reads parameter `e` as float32 into dst (e->numel floats, the model's layout), through
// *staging (grown as needed) when the file's layout differs.
static int read_float_entry(WeightSource *src, const TensorMap *map, const ParamEntry *e, float *dst, float **staging,
                            long long *staging_size) {
    long long n = tensor_map_numel(map);
    if (map->kind == MAP_COPY && n == e->numel) return source_read(src, map, dst);
    if (n > *staging_size) {
        free(*staging);
        *staging = xmalloc((size_t)n * sizeof(float));
        *staging_size = n;
    }
    int rc = source_read(src, map, *staging);
    if (rc == 0) tensor_map_load(map, e, *staging, dst);
    return rc;
}

static void init_value_head(float *weight, int C, uint64_t seed) {
    // nn.Linear's default initialisation: U(-1/sqrt(in), 1/sqrt(in)).
    float bound = 1.0f / sqrtf((float)C);
    uint64_t stream = rng_stream("value_head", 0, 0);
    for (int c = 0; c < C; c++) weight[c] = bound * (2.0f * rng_uniform(seed, stream, (uint64_t)c) - 1.0f);
}

int model_load(Model *model, const char *path, const OpsBackend *ops, const ModelLoadOptions *options) {
    ModelConfig cfg;
    if (model_read_config(&cfg, path) != 0) return -1;
    WeightSource src = {.path = path, .gpt2_prefix = ""};
    if (path_is_gguf(path)) {
        src.format = FORMAT_GGUF;
        if (gguf_open(&src.gguf, path) != 0) return -1;
    } else {
        src.format = FORMAT_HF;
        if (safetensors_open(path, &src.safetensors) != 0) return -1;
        if (cfg.family == FAMILY_GPT2 && safetensors_find(src.safetensors, "transformer.wte.weight"))
            src.gpt2_prefix = "transformer.";
    }

    // A bitsandbytes 4-bit checkpoint runs with its own codes (model/bnb_checkpoint.h).
    const char *quantize_type = options->quantize;
    const bool bnb4 = cfg.bnb_bits == 4, bnb8 = cfg.bnb_bits == 8;
    if (bnb_resolve_quantize(&cfg, path, options->quantize, "--quantize", &quantize_type) != 0) {
        if (src.format == FORMAT_GGUF) gguf_close(&src.gguf);
        else safetensors_close(src.safetensors);
        return -1;
    }
    bool quantize = quantize_requested(quantize_type);
    // Off the CPU a quantized model's float32 buffer is made at the end, without the quantized
    // weights (quantized_unstore): the float32 model never exists in the device's memory.
    if (quantize && ops != &ops_cpu) model_init_without_params(model, &cfg, ops, options->with_lm_head, options->with_value_head);
    else model_init(model, &cfg, ops, options->with_lm_head, options->with_value_head);
    if ((bnb4 && bnb_check_rows(model, path) != 0) || (quantize && quantized_begin(model, quantize_type) != 0)) {
        model_free(model);
        if (src.format == FORMAT_GGUF) gguf_close(&src.gguf);
        else safetensors_close(src.safetensors);
        return -1;
    }
    bool on_host = ops == &ops_cpu;
    if (options->keep_range && (!on_host || quantize || bnb4 || bnb8)) {
        model_free(model);
        if (src.format == FORMAT_GGUF) gguf_close(&src.gguf);
        else safetensors_close(src.safetensors);
        return err_set("a partial load (ZeRO-3's shards) needs float32 weights on the CPU (%s)", path);
    }
    float *host = on_host ? model->params : xcalloc((size_t)model->table.total, sizeof(float));
    float *staging = NULL, *whole = NULL;
    long long staging_size = 0;
    int rc = 0;
    for (int i = 0; i < model->table.count && rc == 0; i++) {
        const ParamEntry *e = &model->table.entries[i];
        float *dst = host + e->offset;
        long keep_first = 0, keep_count = e->numel;
        if (options->keep_range) options->keep_range(model, e, &keep_first, &keep_count);
        if (keep_count == 0) continue; // all of it kept elsewhere: not read
        if (keep_count < e->numel) {
            // Read whole beside the model, and only the kept part written into it.
            TensorMap map;
            map_entry(&src, &cfg, e, &map);
            whole = xrealloc(whole, (size_t)e->numel * sizeof(float));
            rc = read_float_entry(&src, &map, e, whole, &staging, &staging_size);
            if (rc == 0) memcpy(dst + keep_first, whole + keep_first, (size_t)keep_count * sizeof(float));
            continue;
        }
        if (!strcmp(e->name, "score.weight")) {
            // A reward model or critic: HF sequence classifiers call it score.weight,
            // DeepSpeed-Chat checkpoints v_head.weight.
            const char *found = NULL;
            if (src.format == FORMAT_HF) {
                if (safetensors_find(src.safetensors, "score.weight")) found = "score.weight";
                else if (safetensors_find(src.safetensors, "v_head.weight")) found = "v_head.weight";
            }
            if (!found) {
                if (options->require_value_head) {
                    rc = err_set("model has no value head ('score.weight' or 'v_head.weight'); is it a reward model? (%s)", path);
                    break;
                }
                init_value_head(dst, cfg.hidden_size, options->seed);
                continue;
            }
            long long dims[2] = {1, cfg.hidden_size};
            rc = safetensors_load_f32(src.safetensors, found, 2, dims, dst);
            continue;
        }
        TensorMap map;
        map_entry(&src, &cfg, e, &map);
        if (src.format == FORMAT_HF && !strcmp(e->name, "lm_head.weight") &&
            !safetensors_find(src.safetensors, "lm_head.weight")) {
            rc = err_set("untied model has no tensor 'lm_head.weight' (%s)", path);
            break;
        }
        // A linear layer's weight that bitsandbytes quantized: 4-bit codes taken as they are,
        // int8 dequantized; one it left in floats reads as usual (and stays float32 in a
        // 4-bit checkpoint, as bitsandbytes left it).
        const bool linear = e->layer >= 0 && e->ndim == 2 && map.kind == MAP_COPY;
        if (linear && bnb4) {
            // Read into host memory, then moved to the backend's (a GPU's).
            int got = bnb_read_4bit(src.safetensors, path, map.source, e->shape[0], e->shape[1], cfg.bnb_fp4,
                                    cfg.bnb_double_quant, quantized_slot(model, e), ops_cpu.alloc);
            if (got != 0) quantized_to_backend(ops, quantized_slot(model, e)); // a failed read's arrays too: model_free frees them
            rc = got < 0 ? -1 : 0;
            if (got != 0) continue;
        } else if (linear && bnb8) {
            int got = bnb_read_int8(src.safetensors, path, map.source, e->shape[0], e->shape[1], dst);
            rc = got < 0 ? -1 : 0;
            if (got == 1 && quantize) quantized_take(model, e, dst);
            if (got != 0) continue;
        }
        // q4_k_m: a Q4_K / Q5_K / Q6_K tensor of a GGUF file keeps its own bytes (no float read).
        if (quantize && src.format == FORMAT_GGUF) {
            int got = quantized_take_gguf(model, e, &src.gguf, &map);
            rc = got < 0 ? -1 : 0;
            if (got != 0) continue;
        }
        rc = read_float_entry(&src, &map, e, dst, &staging, &staging_size);
        if (rc == 0 && quantize && !bnb4) quantized_take(model, e, dst);
    }
    free(staging), free(whole);
    if (src.format == FORMAT_GGUF) gguf_close(&src.gguf);
    else safetensors_close(src.safetensors);
    if (!on_host) {
        if (rc == 0) {
            quantized_unstore(model); // the quantized weights' float32 slots left out of the device buffer
            model_params_to_device(model, host, model->table.total);
        }
        free(host);
    }
    if (rc != 0) model_free(model);
    return rc;
}

int model_load_with_adapter(Model *model, const char *path, const OpsBackend *ops, const ModelLoadOptions *options,
                            const char *adapter, uint64_t adapter_seed) {
    if (!adapter) return model_load(model, path, ops, options);
    // An adapter trained on a quantized base (QLoRA) goes on that quantized base: the model is
    // loaded quantized as it was, and the adapter checked against its dequantized values.
    char base_quantize[16];
    if (lora_read_adapter_base_quantize(adapter, base_quantize) != 0) return -1;
    // A bitsandbytes 4-bit base is quantized as its file says (model/bnb_checkpoint.h).
    ModelConfig cfg;
    const char *resolved = options->quantize;
    if (model_read_config(&cfg, path) != 0 || bnb_resolve_quantize(&cfg, path, options->quantize, "--quantize", &resolved) != 0)
        return -1;
    if (quantize_requested(base_quantize) || bnb_quantize_name(&cfg)) {
        const char *asked = resolved ? resolved : "none";
        if (strcmp(asked, base_quantize))
            return err_set("the LoRA adapter %s was trained on a base quantized as %s: load it with --quantize %s "
                           "(this run asks for %s)", adapter, base_quantize, base_quantize, asked);
        if (model_load(model, path, ops, options) != 0) return -1;
        if (model_load_lora_adapter(model, adapter, false, adapter_seed) != 0) {
            model_free(model);
            return -1;
        }
        return 0;
    }
    ModelLoadOptions float32 = *options;
    float32.quantize = NULL;
    if (model_load(model, path, ops, &float32) != 0) return -1;
    if (model_load_lora_adapter(model, adapter, false, adapter_seed) != 0 || model_quantize(model, options->quantize) != 0) {
        model_free(model);
        return -1;
    }
    return 0;
}

int model_read_named_tensors(const Model *model, const char *path, const char *name_prefix, float *dst) {
    const ModelConfig *cfg = &model->config;
    WeightSource src = {.path = path, .format = FORMAT_HF, .gpt2_prefix = ""};
    if (safetensors_open(path, &src.safetensors) != 0) return -1;
    char probe[256];
    snprintf(probe, sizeof probe, "%stransformer.wte.weight", name_prefix);
    if (cfg->family == FAMILY_GPT2 && safetensors_find(src.safetensors, probe)) src.gpt2_prefix = "transformer.";
    float *staging = NULL;
    int rc = 0;
    for (int i = 0; i < model->table.count && rc == 0; i++) {
        const ParamEntry *e = &model->table.entries[i];
        TensorMap map;
        if (!strcmp(e->name, "score.weight")) {
            memset(&map, 0, sizeof map);
            snprintf(map.source, sizeof map.source, "value_head.weight");
            tensor_map_set_shape(&map, 1, cfg->hidden_size);
        } else {
            map_entry(&src, cfg, e, &map);
        }
        char prefixed[sizeof map.source];
        snprintf(prefixed, sizeof prefixed, "%s%s", name_prefix, map.source);
        memcpy(map.source, prefixed, sizeof prefixed);
        staging = xrealloc(staging, (size_t)tensor_map_numel(&map) * sizeof(float));
        rc = source_read(&src, &map, staging);
        if (rc == 0) tensor_map_load(&map, e, staging, dst + e->offset);
    }
    free(staging);
    safetensors_close(src.safetensors);
    return rc;
}

int model_reload_weights(Model *model, const char *path, ModelKeepRange keep_range) {
    // A LoRA model's checkpoint: its adapters go back onto the base weights in memory.
    if (model->lora.rank > 0) return lora_read_adapter(model, path);
    CHECK(!model->quantized, "a quantized model's float32 weights are gone (model/quantize.h)");
    CHECK(!keep_range || model->ops == &ops_cpu, "a partial reload of a model off the CPU");
    Model saved;
    ModelLoadOptions options = {.with_lm_head = model->has_lm_head, .with_value_head = model->has_value_head,
                                .require_value_head = model->has_value_head, .keep_range = keep_range};
    if (model_load(&saved, path, &ops_cpu, &options) != 0) return -1;
    if (saved.table.total != model->table.total) {
        model_free(&saved);
        return err_set("saved model does not match this model's shape (%s)", path);
    }
    if (!keep_range) {
        model_params_to_device(model, saved.params, model->table.total);
    } else {
        // Only the kept parts copied: writing the zeros of the rest would fill the pages the
        // partial load saved.
        for (int i = 0; i < model->table.count; i++) {
            const ParamEntry *e = &model->table.entries[i];
            long first = 0, count = e->numel;
            keep_range(model, e, &first, &count);
            memcpy(model->params + e->offset + first, saved.params + e->offset + first, (size_t)count * sizeof(float));
        }
    }
    model_free(&saved);
    return 0;
}

// ---------------------------------------------------------------------------------------
// Saving

static const char *tokenizer_files[] = {
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json",
    "merges.txt", "tokenizer.model", "added_tokens.json", "generation_config.json",
};

static int copy_file(const char *from, const char *to) {
    char *data = NULL;
    size_t size = 0;
    if (fs_read_file(from, (size_t)1 << 31, &data, &size) != 0) return -1;
    int rc = fs_write_file_atomic(to, data, size);
    free(data);
    return rc;
}

// The tensors of the saved file, in the file's own names and layouts.
typedef struct {
    SafetensorsWriteTensor *tensors;
    float **owned; // buffers to free
    int count, capacity;
} SaveList;

static void save_list_add(SaveList *list, const char *name, int ndim, long long rows, long long cols,
                          const float *data, float *owned) {
    if (list->count == list->capacity) {
        list->capacity = list->capacity ? 2 * list->capacity : 64;
        list->tensors = xrealloc(list->tensors, (size_t)list->capacity * sizeof *list->tensors);
        list->owned = xrealloc(list->owned, (size_t)list->capacity * sizeof *list->owned);
    }
    SafetensorsWriteTensor *t = &list->tensors[list->count];
    memset(t, 0, sizeof *t);
    t->name = xstrdup(name);
    t->dtype = SAFETENSORS_F32;
    t->ndim = ndim;
    t->shape[0] = rows;
    t->shape[1] = cols;
    t->data = data;
    list->owned[list->count] = owned;
    list->count++;
}

static void save_list_free(SaveList *list) {
    for (int i = 0; i < list->count; i++) {
        free((char *)list->tensors[i].name);
        free(list->owned[i]);
    }
    free(list->tensors);
    free(list->owned);
}

static void build_gpt2_save_list(const Model *model, const float *params, bool classifier, SaveList *list) {
    const ModelConfig *cfg = &model->config;
    const long C = cfg->hidden_size;
    const char *prefix = "transformer.";
    char name[160];
    const ModelTensors *w = &model->weights;
    // Views of the host copy of the parameters.
    ModelTensors host = {0};
    param_views_bind(&host, &model->table, (float *)params, cfg->num_layers);
    (void)w;
    snprintf(name, sizeof name, "%swte.weight", prefix);
    save_list_add(list, name, 2, cfg->vocab_size, C, host.tok_emb, NULL);
    snprintf(name, sizeof name, "%swpe.weight", prefix);
    save_list_add(list, name, 2, cfg->max_position_embeddings, C, host.pos_emb, NULL);
    for (int l = 0; l < cfg->num_layers; l++) {
        const LayerTensors *lt = &host.layers[l];
        const long I = cfg->intermediate_size;
#define NAME(fmt) (snprintf(name, sizeof name, "%sh.%d." fmt, prefix, l), name)
        save_list_add(list, NAME("ln_1.weight"), 1, C, 0, lt->attn_norm_w, NULL);
        save_list_add(list, NAME("ln_1.bias"), 1, C, 0, lt->attn_norm_b, NULL);
        float *c_attn = xmalloc((size_t)C * 3 * C * sizeof(float));
        const float *parts[3] = {lt->q_w, lt->k_w, lt->v_w};
        for (int p = 0; p < 3; p++)
            for (long o = 0; o < C; o++)
                for (long i = 0; i < C; i++) c_attn[i * 3 * C + p * C + o] = parts[p][o * C + i];
        save_list_add(list, NAME("attn.c_attn.weight"), 2, C, 3 * C, c_attn, c_attn);
        float *c_attn_bias = xmalloc((size_t)3 * C * sizeof(float));
        memcpy(c_attn_bias, lt->q_b, C * sizeof(float));
        memcpy(c_attn_bias + C, lt->k_b, C * sizeof(float));
        memcpy(c_attn_bias + 2 * C, lt->v_b, C * sizeof(float));
        save_list_add(list, NAME("attn.c_attn.bias"), 1, 3 * C, 0, c_attn_bias, c_attn_bias);
        struct {
            const char *fmt;
            const float *w;
            long rows, cols;
        } transposed[] = {
            {"attn.c_proj.weight", lt->o_w, C, C},
            {"mlp.c_fc.weight", lt->up_w, I, C},
            {"mlp.c_proj.weight", lt->down_w, C, I},
        };
        for (int t = 0; t < 3; t++) {
            long rows = transposed[t].rows, cols = transposed[t].cols;
            float *out = xmalloc((size_t)rows * cols * sizeof(float));
            for (long r = 0; r < rows; r++)
                for (long c = 0; c < cols; c++) out[c * rows + r] = transposed[t].w[r * cols + c];
            snprintf(name, sizeof name, "%sh.%d.%s", prefix, l, transposed[t].fmt);
            save_list_add(list, name, 2, cols, rows, out, out);
        }
        save_list_add(list, NAME("attn.c_proj.bias"), 1, C, 0, lt->o_b, NULL);
        save_list_add(list, NAME("ln_2.weight"), 1, C, 0, lt->mlp_norm_w, NULL);
        save_list_add(list, NAME("ln_2.bias"), 1, C, 0, lt->mlp_norm_b, NULL);
        save_list_add(list, NAME("mlp.c_fc.bias"), 1, I, 0, lt->up_b, NULL);
        save_list_add(list, NAME("mlp.c_proj.bias"), 1, C, 0, lt->down_b, NULL);
#undef NAME
    }
    snprintf(name, sizeof name, "%sln_f.weight", prefix);
    save_list_add(list, name, 1, C, 0, host.final_norm_w, NULL);
    snprintf(name, sizeof name, "%sln_f.bias", prefix);
    save_list_add(list, name, 1, C, 0, host.final_norm_b, NULL);
    if (host.lm_head) save_list_add(list, "lm_head.weight", 2, cfg->vocab_size, C, host.lm_head, NULL);
    if (host.value_head) save_list_add(list, "score.weight", 2, 1, C, host.value_head, NULL);
    (void)classifier;
    param_views_free(&host);
}

// SafetensorsWriteTensor.fill of a tensor whose weights Model.weight_hook.read gives (a LoRA
// model's with its adapter merged in).
typedef struct {
    const Model *model;
    const ParamEntry *entry;
} StreamedPiece;

static void fill_streamed(void *context, long long first, long long count, void *out) {
    const StreamedPiece *piece = context;
    const Model *model = piece->model;
    const long row = lora_merge_row_length(model, piece->entry);
    if (row == 0) {
        model->weight_hook.read(model, piece->entry->offset + (long)first, (long)count, out, model->weight_hook.context);
        lora_merge_piece(model, piece->entry, (long)first, (long)count, out);
        return;
    }
    // DoRA scales each merged row by its own norm: the rows the piece touches are read and
    // merged whole, and the piece copied out of them.
    const long first_row = (long)first / row, end_row = ((long)(first + count) + row - 1) / row;
    float *rows = xmalloc((size_t)(end_row - first_row) * row * sizeof(float));
    model->weight_hook.read(model, piece->entry->offset + first_row * row, (end_row - first_row) * row, rows,
                            model->weight_hook.context);
    lora_merge_piece(model, piece->entry, first_row * row, (end_row - first_row) * row, rows);
    memcpy(out, rows + ((long)first - first_row * row), (size_t)count * sizeof(float));
    free(rows);
}

int model_write_hf_files(const Model *model, const char *dir) {
    // A quantized base (QLoRA) is saved as its dequantized values with the adapters merged in
    // (what PEFT's merge_and_unload does on a 4-bit model), the adapters in adapter/.
    CHECK(!model->quantized || model->lora.rank > 0, "a quantized model's float32 weights are gone (model/quantize.h)");
    const ModelConfig *cfg = &model->config;
    bool classifier = model->has_value_head && !model->has_lm_head;
    const bool lora = model->lora.rank > 0;
    // Weights not all in this process (ZeRO-3) are read piece by piece while the file is
    // written; GPT-2's, which are saved transposed, into a whole copy first.
    const bool streamed = model->weight_hook.read && cfg->family != FAMILY_GPT2;
    // A LoRA model is saved with its adapters merged into a copy of the weights.
    const bool copy = (model->ops != &ops_cpu || lora || model->weight_hook.read) && !streamed;
    float *params = model->params;
    if (copy) {
        params = xmalloc((size_t)model->table.total * sizeof(float));
        if (model->weight_hook.read)
            model->weight_hook.read(model, 0, model->table.total, params, model->weight_hook.context);
        else
            model_params_to_host(model, params, model->table.total);
    }
    CHECK(!streamed || !model->quantized, "streamed weights of a quantized model");
    int rc = lora ? lora_write_adapter(model, params, dir) : 0; // streamed: the adapters are whole in params
    if (model->quantized) model_dequantize_into(model, params);
    if (lora && !streamed) lora_merge(model, params);
    SaveList list = {0};
    StreamedPiece *pieces = streamed ? xmalloc((size_t)model->table.count * sizeof *pieces) : NULL;
    if (cfg->family == FAMILY_GPT2) {
        build_gpt2_save_list(model, params, classifier, &list);
    } else {
        for (int i = 0; i < model_base_entries(model); i++) { // adapters: merged above, saved in adapter/
            const ParamEntry *e = &model->table.entries[i];
            save_list_add(&list, e->name, e->ndim, e->shape[0], e->shape[1], params + e->offset, NULL);
            if (streamed) {
                SafetensorsWriteTensor *t = &list.tensors[list.count - 1];
                t->data = NULL, t->fill = fill_streamed, t->fill_context = (void *)&pieces[i];
                pieces[i] = (StreamedPiece){model, e};
            }
        }
    }
    char *weights_path = fs_join(dir, "model.safetensors");
    char *config_path = fs_join(dir, "config.json");
    const char *architecture = classifier ? config_hf_sequence_classification_architecture(cfg->family)
                                          : config_hf_causal_lm_architecture(cfg->family);
    if (rc == 0) rc = safetensors_write(weights_path, list.tensors, list.count, NULL);
    if (rc == 0) rc = config_write_hf_json(cfg, config_path, architecture);
    free(weights_path);
    free(config_path);
    save_list_free(&list);
    free(pieces);
    if (copy) free(params);
    return rc;
}

int model_save_hf(const Model *model, const char *dir, const char *tokenizer_source) {
    FsAtomicDir out;
    if (fs_atomic_dir_begin(&out, dir) != 0) return -1;
    int rc = model_write_hf_files(model, out.tmp_path);
    for (size_t i = 0; rc == 0 && tokenizer_source && i < sizeof tokenizer_files / sizeof tokenizer_files[0]; i++) {
        char *from = fs_join(tokenizer_source, tokenizer_files[i]);
        if (fs_is_file(from)) {
            char *to = fs_join(out.tmp_path, tokenizer_files[i]);
            rc = copy_file(from, to);
            free(to);
        }
        free(from);
    }
    if (rc == 0) return fs_atomic_dir_commit(&out);
    fs_atomic_dir_abort(&out);
    return rc;
}

// ---------------------------------------------------------------------------------------
// GGUF export

// llama.cpp's architecture name; Mistral checkpoints are converted as "llama", Gemma 3's
// text model as "gemma3".
static const char *gguf_architecture(ModelFamily family) {
    return family == FAMILY_MISTRAL ? "llama" : family == FAMILY_GEMMA3 ? "gemma3" : config_family_name(family);
}

int gguf_out_type_from_name(const char *name, GgufOutType *out) {
    static const struct { const char *name; GgufOutType type; } names[] = {
        {"f32", GGUF_OUT_F32},   {"f16", GGUF_OUT_F16},   {"q8_0", GGUF_OUT_Q8_0},
        {"q4_0", GGUF_OUT_Q4_0}, {"q4_1", GGUF_OUT_Q4_1}, {"q5_0", GGUF_OUT_Q5_0},
        {"q5_1", GGUF_OUT_Q5_1}, {"iq4_nl", GGUF_OUT_IQ4_NL}, {"iq4_xs", GGUF_OUT_IQ4_XS}, {"q2_k", GGUF_OUT_Q2_K},
        {"q3_k_m", GGUF_OUT_Q3_K_M}, {"q4_k_m", GGUF_OUT_Q4_K_M},
        {"q5_k_m", GGUF_OUT_Q5_K_M}};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (!strcmp(name, names[i].name)) {
            *out = names[i].type;
            return 0;
        }
    return -1;
}

// llama.cpp's use_more_bits: the first and last eighth of the layers and every third in
// between get the larger type (Q6_K for attn_v and ffn_down) in the _M mixes.
static bool use_more_bits(int layer, int layers) {
    return layer < layers / 8 || layer >= 7 * layers / 8 || (layer - layers / 8) % 3 == 2;
}

// The type of matrix `name` (GGUF name, `row` values along ne[0]) for output type `out`:
// llama.cpp's llama_tensor_get_type for these types, then its fallbacks for rows that the
// type's blocks do not divide.
static GgmlType matrix_type(GgufOutType out, const ModelConfig *cfg, const char *name, int64_t row) {
    GgmlType type;
    const bool output = !strcmp(name, "output.weight") ||
                        (cfg->tie_word_embeddings && !strcmp(name, "token_embd.weight"));
    int layer = -1;
    sscanf(name, "blk.%d.", &layer);
    switch (out) {
    case GGUF_OUT_F32: return GGML_TYPE_F32;
    case GGUF_OUT_F16: return GGML_TYPE_F16;
    case GGUF_OUT_Q8_0: type = GGML_TYPE_Q8_0; break;
    // The legacy types (one scale, or a scale and a minimum, per 32 values): llama.cpp gives
    // the output matrix Q6_K (Q8_0 where 256 does not divide its rows) and every other
    // matrix the file's type. IQ4_NL (one scale per 32 values, codes into a table of levels)
    // and IQ4_XS (its super-blocks of 256, IQ4_NL where 256 does not divide a row, as
    // llama.cpp falls back) the same way, with llama.cpp's two raises for them (without an
    // importance matrix): Q5_K for attn_v where each K/V head serves 4 or more query heads,
    // and for the ffn_down of the first num_layers / 8 layers (SmolLM2's 0-2: the types of
    // llama.cpp's own IQ4_NL and IQ4_XS files of it).
    case GGUF_OUT_Q4_0:
    case GGUF_OUT_Q4_1:
    case GGUF_OUT_Q5_0:
    case GGUF_OUT_Q5_1:
    case GGUF_OUT_IQ4_NL:
    case GGUF_OUT_IQ4_XS: {
        static const GgmlType legacy[] = {[GGUF_OUT_Q4_0] = GGML_TYPE_Q4_0, [GGUF_OUT_Q4_1] = GGML_TYPE_Q4_1,
                                          [GGUF_OUT_Q5_0] = GGML_TYPE_Q5_0, [GGUF_OUT_Q5_1] = GGML_TYPE_Q5_1,
                                          [GGUF_OUT_IQ4_NL] = GGML_TYPE_IQ4_NL, [GGUF_OUT_IQ4_XS] = GGML_TYPE_IQ4_XS};
        type = output ? GGML_TYPE_Q6_K : legacy[out];
        if (!output && (out == GGUF_OUT_IQ4_NL || out == GGUF_OUT_IQ4_XS)) {
            if (strstr(name, ".attn_v.weight") && cfg->num_heads / cfg->num_kv_heads >= 4) type = GGML_TYPE_Q5_K;
            if (strstr(name, ".ffn_down.weight") && layer >= 0 && layer < cfg->num_layers / 8) type = GGML_TYPE_Q5_K;
        }
        break;
    }
    // Q3_K_M and Q2_K: llama.cpp's rules for a model without experts and without an
    // importance matrix. Q3_K_M: Q3_K, attn_v Q5_K in the first two layers and Q4_K after,
    // ffn_down Q5_K in the first num_layers / 16 and Q4_K after, attn_output Q4_K. Q2_K: Q2_K,
    // attn_v Q4_K where each K/V head serves 4 or more query heads (else Q3_K), ffn_down and
    // attn_output Q3_K.
    case GGUF_OUT_Q3_K_M: {
        const bool attn_v = strstr(name, ".attn_v.weight") != NULL, ffn_down = strstr(name, ".ffn_down.weight") != NULL;
        type = GGML_TYPE_Q3_K;
        if (output) type = GGML_TYPE_Q6_K;
        else if (attn_v) type = layer < 2 ? GGML_TYPE_Q5_K : GGML_TYPE_Q4_K;
        else if (ffn_down) type = layer < cfg->num_layers / 16 ? GGML_TYPE_Q5_K : GGML_TYPE_Q4_K;
        else if (strstr(name, ".attn_output.weight")) type = GGML_TYPE_Q4_K;
        break;
    }
    case GGUF_OUT_Q2_K:
        type = GGML_TYPE_Q2_K;
        if (output) type = GGML_TYPE_Q6_K;
        else if (strstr(name, ".attn_v.weight"))
            type = cfg->num_heads / cfg->num_kv_heads >= 4 ? GGML_TYPE_Q4_K : GGML_TYPE_Q3_K;
        else if (strstr(name, ".ffn_down.weight") || strstr(name, ".attn_output.weight")) type = GGML_TYPE_Q3_K;
        break;
    case GGUF_OUT_Q4_K_M:
    case GGUF_OUT_Q5_K_M:
    default:
        type = out == GGUF_OUT_Q5_K_M ? GGML_TYPE_Q5_K : GGML_TYPE_Q4_K;
        if (output) type = GGML_TYPE_Q6_K;
        else if ((strstr(name, ".attn_v.weight") || strstr(name, ".ffn_down.weight")) && layer >= 0 &&
                 use_more_bits(layer, cfg->num_layers))
            type = GGML_TYPE_Q6_K;
        break;
    }
    if (row % 256) { // K-quant (IQ4_XS) super-blocks do not fit the row
        if (type == GGML_TYPE_IQ4_XS) type = GGML_TYPE_IQ4_NL;
        if (type == GGML_TYPE_Q2_K || type == GGML_TYPE_Q3_K) type = GGML_TYPE_Q4_0;
        if (type == GGML_TYPE_Q4_K) type = GGML_TYPE_Q5_0;
        if (type == GGML_TYPE_Q5_K) type = GGML_TYPE_Q5_1;
        if (type == GGML_TYPE_Q6_K) type = GGML_TYPE_Q8_0;
    }
    if (row % 32) type = GGML_TYPE_F16;
    return type;
}

GgmlType gguf_mix_matrix_type(GgufOutType mix, const ModelConfig *cfg, const char *name, int64_t row) {
    CHECK(mix == GGUF_OUT_Q4_K_M || mix == GGUF_OUT_Q5_K_M || mix == GGUF_OUT_Q3_K_M || mix == GGUF_OUT_Q2_K ||
              mix == GGUF_OUT_IQ4_NL || mix == GGUF_OUT_IQ4_XS,
          "GGUF output type %d is not one of llama.cpp's mixes --quantize takes", (int)mix);
    return matrix_type(mix, cfg, name, row);
}

static void add_architecture_keys(GgufWriter *w, const ModelConfig *cfg, const char *arch, GgufOutType out) {
    char key[128];
#define ARCH_KEY(suffix) (snprintf(key, sizeof key, "%s." suffix, arch), key)
    gguf_writer_add_string(w, "general.architecture", arch);
    gguf_writer_add_string(w, "general.name", "marlhf export");
    // llama_ftype: 0 all F32, 1 mostly F16, 2 mostly Q4_0, 3 mostly Q4_1, 7 mostly Q8_0,
    // 8 mostly Q5_0, 9 mostly Q5_1, 15 mostly Q4_K_M, 17 mostly Q5_K_M, 25 mostly IQ4_NL,
    // 30 mostly IQ4_XS, 10 mostly Q2_K, 12 mostly Q3_K_M.
    static const uint32_t file_types[] = {[GGUF_OUT_F32] = 0,     [GGUF_OUT_F16] = 1,      [GGUF_OUT_Q8_0] = 7,
                                          [GGUF_OUT_Q4_0] = 2,    [GGUF_OUT_Q4_1] = 3,     [GGUF_OUT_Q5_0] = 8,
                                          [GGUF_OUT_Q5_1] = 9,    [GGUF_OUT_Q4_K_M] = 15, [GGUF_OUT_Q5_K_M] = 17,
                                          [GGUF_OUT_IQ4_NL] = 25, [GGUF_OUT_IQ4_XS] = 30, [GGUF_OUT_Q2_K] = 10,
                                          [GGUF_OUT_Q3_K_M] = 12};
    gguf_writer_add_u32(w, "general.file_type", file_types[out]);
    gguf_writer_add_u32(w, ARCH_KEY("vocab_size"), (uint32_t)cfg->vocab_size);
    gguf_writer_add_u32(w, ARCH_KEY("context_length"), (uint32_t)cfg->max_position_embeddings);
    gguf_writer_add_u32(w, ARCH_KEY("embedding_length"), (uint32_t)cfg->hidden_size);
    gguf_writer_add_u32(w, ARCH_KEY("block_count"), (uint32_t)cfg->num_layers);
    gguf_writer_add_u32(w, ARCH_KEY("feed_forward_length"), (uint32_t)cfg->intermediate_size);
    gguf_writer_add_u32(w, ARCH_KEY("attention.head_count"), (uint32_t)cfg->num_heads);
    gguf_writer_add_u32(w, ARCH_KEY("attention.head_count_kv"), (uint32_t)cfg->num_kv_heads);
    gguf_writer_add_u32(w, ARCH_KEY("attention.key_length"), (uint32_t)cfg->head_dim);
    gguf_writer_add_u32(w, ARCH_KEY("attention.value_length"), (uint32_t)cfg->head_dim);
    if (cfg->norm == NORM_LAYERNORM) {
        gguf_writer_add_f32(w, ARCH_KEY("attention.layer_norm_epsilon"), cfg->norm_eps);
    } else {
        gguf_writer_add_f32(w, ARCH_KEY("attention.layer_norm_rms_epsilon"), cfg->norm_eps);
    }
    if (cfg->positions == POSITIONS_ROPE) {
        gguf_writer_add_f32(w, ARCH_KEY("rope.freq_base"), cfg->rope_theta);
        gguf_writer_add_u32(w, ARCH_KEY("rope.dimension_count"), (uint32_t)cfg->head_dim);
        // llama.cpp's own keys for linear scaling; Llama 3's goes in the rope_freqs tensor.
        if (cfg->rope_scaling == ROPE_SCALING_LINEAR) {
            gguf_writer_add_string(w, ARCH_KEY("rope.scaling.type"), "linear");
            gguf_writer_add_f32(w, ARCH_KEY("rope.scaling.factor"), cfg->rope_factor);
        } else if (cfg->rope_scaling == ROPE_SCALING_LLAMA3) {
            // Which context the rope_freqs divisors were made for (llama.cpp reads it for
            // YaRN only; model/config_gguf.c reads it back).
            gguf_writer_add_u32(w, ARCH_KEY("rope.scaling.original_context_length"),
                                (uint32_t)cfg->rope_original_max_positions);
        }
    }
    if (cfg->family == FAMILY_GEMMA2) { // llama.cpp's keys
        gguf_writer_add_f32(w, ARCH_KEY("attn_logit_softcapping"), cfg->attn_logit_softcap);
        gguf_writer_add_f32(w, ARCH_KEY("final_logit_softcapping"), cfg->final_logit_softcap);
    }
    // The sliding window: gemma2 and gemma3 always carry one (a model without: the whole
    // context is one; the rest of Gemma 3's pattern llama.cpp fixes); Mistral's goes under
    // "llama", which llama.cpp does not apply (past it llama.cpp attends to the whole
    // context, as for its own conversion of such a checkpoint).
    const bool gemma2_like = cfg->family == FAMILY_GEMMA2 || cfg->family == FAMILY_GEMMA3;
    if (gemma2_like || ((cfg->family == FAMILY_MISTRAL || cfg->family == FAMILY_LLAMA) && cfg->sliding_window > 0))
        gguf_writer_add_u32(w, ARCH_KEY("attention.sliding_window"),
                            (uint32_t)(cfg->sliding_window > 0 ? cfg->sliding_window : cfg->max_position_embeddings));
#undef ARCH_KEY
}

int model_write_gguf(const Model *model, const Tokenizer *tokenizer, const char *path, GgufOutType out) {
    CHECK(!model->quantized, "a quantized model's float32 weights are gone (model/quantize.h)");
    const ModelConfig *cfg = &model->config;
    CHECK(model->has_lm_head, "GGUF export of a model without an LM head");
    if (cfg->family == FAMILY_GEMMA3) {
        // llama.cpp's gemma3 has no keys for these: it fixes them (and infers the query scalar).
        float inferred = config_gguf_gemma_query_scalar(cfg);
        float own = cfg->query_pre_attn_scalar > 0.0f ? cfg->query_pre_attn_scalar : (float)cfg->head_dim;
        if (cfg->sliding_window_pattern != GGUF_GEMMA3_PATTERN || cfg->rope_local_theta != GGUF_GEMMA3_LOCAL_THETA)
            return err_set("a gemma3 model whose layer pattern (%d) or sliding layers' RoPE base (%g) is not llama.cpp's "
                           "(%d, %g) cannot be written as GGUF (%s)", cfg->sliding_window_pattern,
                           (double)cfg->rope_local_theta, GGUF_GEMMA3_PATTERN, (double)GGUF_GEMMA3_LOCAL_THETA, path);
        if (own != inferred)
            return err_set("a gemma3 model whose query_pre_attn_scalar (%g) is not the %g llama.cpp infers for its "
                           "shape cannot be written as GGUF (%s)", (double)own, (double)inferred, path);
        if (cfg->attn_logit_softcap > 0.0f || cfg->final_logit_softcap > 0.0f)
            return err_set("a gemma3 model with soft caps cannot be written as GGUF: llama.cpp applies none (%s)", path);
    }
    if ((cfg->family == FAMILY_QWEN2 || cfg->family == FAMILY_QWEN3) && cfg->sliding_window > 0)
        return err_set("a %s model with a sliding window (use_sliding_window) cannot be written as GGUF: llama.cpp's "
                       "%s has none (%s)", config_family_name(cfg->family), config_family_name(cfg->family), path);
    if (cfg->family == FAMILY_GEMMA2) {
        // A GGUF file has no key for it: llama.cpp (and model/config_gguf.c) infer it.
        float inferred = config_gguf_gemma_query_scalar(cfg);
        float own = cfg->query_pre_attn_scalar > 0.0f ? cfg->query_pre_attn_scalar : (float)cfg->head_dim;
        if (own != inferred)
            return err_set("a gemma2 model whose query_pre_attn_scalar (%g) is not the %g llama.cpp infers for its "
                           "shape cannot be written as GGUF (%s)", (double)own, (double)inferred, path);
        if (cfg->attn_logit_softcap <= 0.0f || cfg->final_logit_softcap <= 0.0f)
            return err_set("a gemma2 model without both soft caps cannot be written as GGUF: llama.cpp always "
                           "applies them (%s)", path);
    }
    float *params = xmalloc((size_t)model->table.total * sizeof(float));
    model_params_to_host(model, params, model->table.total);
    lora_merge(model, params);
    GgufWriter *w = gguf_writer_new();
    add_architecture_keys(w, cfg, gguf_architecture(cfg->family), out);
    int rc = tokenizer ? tokenizer_write_gguf(tokenizer, w, cfg->vocab_size) : 0;
    // Table entries in order. A fused file tensor (GPT-2's attn_qkv weight and bias, whose
    // parts the table interleaves) is gathered in a pending buffer and written at its last part.
    struct {
        char source[sizeof ((TensorMap *)0)->source];
        float *values;
    } pending[4] = {0};
    for (int i = 0; rc == 0 && i < model_base_entries(model); i++) {
        const ParamEntry *e = &model->table.entries[i];
        if (!strcmp(e->name, "score.weight")) continue; // a value head has no place in GGUF
        TensorMap map;
        tensor_map_gguf(cfg, e, &map);
        const long long n = tensor_map_numel(&map);
        float *values = NULL;
        int slot = -1;
        if (map.kind == MAP_ROW_SLICE) {
            for (int k = 0; k < 4 && slot < 0; k++)
                if (pending[k].values && !strcmp(pending[k].source, map.source)) slot = k;
            for (int k = 0; k < 4 && slot < 0; k++)
                if (!pending[k].values) {
                    slot = k;
                    snprintf(pending[k].source, sizeof pending[k].source, "%s", map.source);
                    pending[k].values = xmalloc((size_t)n * sizeof(float));
                }
            CHECK(slot >= 0, "more than 4 fused GGUF tensors pending");
            values = pending[slot].values;
        } else {
            values = xmalloc((size_t)n * sizeof(float));
        }
        tensor_map_store(&map, e, params + e->offset, values);
        if (map.kind == MAP_ROW_SLICE && map.part + 1 < map.parts) continue;
        int64_t ne[2] = {map.ndim == 2 ? map.shape[1] : map.shape[0], map.shape[0]};
        GgmlType stored = map.ndim == 1 ? GGML_TYPE_F32 : matrix_type(out, cfg, map.source, ne[0]);
        gguf_writer_add_tensor(w, map.source, stored, map.ndim, ne, values);
        free(values);
        if (slot >= 0) pending[slot].values = NULL;
    }
    for (int k = 0; k < 4; k++) free(pending[k].values);
    if (rc == 0 && cfg->rope_scaling == ROPE_SCALING_LLAMA3) { // as llama.cpp's converter writes it
        float *factors = xmalloc((size_t)(cfg->head_dim / 2) * sizeof(float));
        rope_frequency_factors(cfg, factors);
        const int64_t ne[1] = {cfg->head_dim / 2};
        gguf_writer_add_tensor(w, "rope_freqs.weight", GGML_TYPE_F32, 1, ne, factors);
        free(factors);
    }
    if (rc == 0) rc = gguf_writer_write(w, path);
    gguf_writer_free(w);
    free(params);
    return rc;
}

int model_write_gguf_adapter(const Model *model, const char *path, GgufOutType out) {
    const ModelConfig *cfg = &model->config;
    const GgmlType type = out == GGUF_OUT_F32 ? GGML_TYPE_F32 : out == GGUF_OUT_F16 ? GGML_TYPE_F16 : GGML_TYPE_Q8_0;
    if (model->lora.rank == 0) return err_set("the model has no LoRA adapter to write (%s)", path);
    if (cfg->family == FAMILY_GPT2)
        return err_set("GPT-2's GGUF fuses q, k and v: its LoRA adapters cannot be written for llama.cpp (%s)", path);
    if (model->lora.dora)
        return err_set("llama.cpp's LoRA files have no DoRA magnitude: write the merged model instead of "
                       "--adapter-only (%s)", path);
    float *params = xmalloc((size_t)model->table.total * sizeof(float));
    model_params_to_host(model, params, model->table.total);
    GgufWriter *w = gguf_writer_new();
    gguf_writer_add_string(w, "general.architecture", gguf_architecture(cfg->family));
    gguf_writer_add_string(w, "general.type", "adapter");
    gguf_writer_add_string(w, "general.name", "marlhf LoRA adapter");
    gguf_writer_add_string(w, "adapter.type", "lora");
    // llama.cpp scales each tensor pair by alpha / rank, one alpha for the file and the rank
    // read from the pair's shape (so per-module ranks carry over); rsLoRA's alpha / sqrt(rank)
    // is that with alpha sqrt(rank). A module whose scale differs from the file's alpha over
    // its rank (rsLoRA or an alpha_pattern with per-module ranks) has the ratio multiplied
    // into its B.
    const float file_alpha =
        model->lora.rslora ? model->lora.alpha * sqrtf((float)model->lora.rank) : model->lora.alpha;
    gguf_writer_add_f32(w, "adapter.lora.alpha", file_alpha);
    for (int i = model->lora_first_entry; i + 1 < model->table.count; i += 2) { // A, B pairs
        const ParamEntry *a = &model->table.entries[i], *b = &model->table.entries[i + 1];
        const int rank = (int)a->shape[0];
        const float factor = model->lora_scales[(long)a->layer * LORA_TARGETS + lora_entry_target(a)] /
                             (file_alpha / (float)rank);
        // "model.layers.L.self_attn.q_proj.lora_A.weight" adapts "model.layers.L.self_attn.q_proj.weight".
        const char *marker = strstr(a->name, ".lora_A.weight");
        CHECK(marker, "LoRA entry %s is not an A matrix", a->name);
        char base_name[sizeof a->name];
        snprintf(base_name, sizeof base_name, "%.*s.weight", (int)(marker - a->name), a->name);
        const ParamEntry *base = param_table_find(&model->table, base_name);
        CHECK(base, "LoRA entry %s without its base weight", a->name);
        TensorMap map;
        tensor_map_gguf(cfg, base, &map);
        char name[sizeof map.source + 16];
        // A acts on the input side, which GGUF keeps in Hugging Face's order.
        snprintf(name, sizeof name, "%s.lora_a", map.source);
        const int64_t ne_a[2] = {a->shape[1], rank};
        GgmlType stored = type == GGML_TYPE_Q8_0 && a->shape[1] % 32 ? GGML_TYPE_F16 : type;
        gguf_writer_add_tensor(w, name, stored, 2, ne_a, params + a->offset);
        // B's rows are the base weight's output rows: they move as the base's do.
        float *rows = xmalloc((size_t)b->numel * sizeof(float));
        if (map.kind == MAP_UNPERMUTE_ROPE) {
            TensorMap b_map = map;
            tensor_map_set_shape(&b_map, b->shape[0], b->shape[1]);
            tensor_map_store(&b_map, b, params + b->offset, rows);
        } else {
            memcpy(rows, params + b->offset, (size_t)b->numel * sizeof(float));
        }
        if (factor != 1.0f)
            for (long j = 0; j < b->numel; j++) rows[j] *= factor;
        snprintf(name, sizeof name, "%s.lora_b", map.source);
        const int64_t ne_b[2] = {rank, b->shape[0]};
        stored = type == GGML_TYPE_Q8_0 && rank % 32 ? GGML_TYPE_F16 : type;
        gguf_writer_add_tensor(w, name, stored, 2, ne_b, rows);
        free(rows);
    }
    int rc = gguf_writer_write(w, path);
    gguf_writer_free(w);
    free(params);
    return rc;
}
