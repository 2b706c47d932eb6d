#include "model/lora.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <ctype.h>
#include <errno.h>
#include <jansson.h>
#include <pcre2.h>
#include <stdlib.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "core/check.h"
#include "core/hash.h"
#include "core/rng.h"
#include "io/fs.h"
#include "io/jsonl.h"
#include "io/safetensors.h"
#include "model/quantize.h"

static const char *const target_names[LORA_TARGETS] = {
    "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj",
};
// Where each target sits under "model.layers.L." (Hugging Face Llama names).
static const char *const target_paths[LORA_TARGETS] = {
    "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
    "mlp.gate_proj",    "mlp.up_proj",      "mlp.down_proj",
};
// PEFT's prefix for the tensors of a model it wraps.
static const char peft_prefix[] = "base_model.model.";

const char *lora_target_name(LoraTarget target) { return target_names[target]; }

LoraTarget lora_entry_target(const ParamEntry *entry) {
    for (int t = 0; t < LORA_TARGETS; t++) {
        const size_t a = offsetof(LayerTensors, lora_a) + (size_t)t * sizeof(float *);
        const size_t b = offsetof(LayerTensors, lora_b) + (size_t)t * sizeof(float *);
        const size_t m = offsetof(LayerTensors, lora_m) + (size_t)t * sizeof(float *);
        if (entry->view_field == a || entry->view_field == b || entry->view_field == m) return (LoraTarget)t;
    }
    CHECK(0, "%s is not a LoRA entry", entry->name);
    return LORA_Q;
}

int lora_parse_targets(const char *list, unsigned *targets) {
    *targets = 0;
    if (!strcmp(list, "all-linear")) {
        *targets = (1u << LORA_TARGETS) - 1;
        return 0;
    }
    const char *p = list;
    while (*p) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        int found = -1;
        for (int t = 0; t < LORA_TARGETS; t++)
            if (strlen(target_names[t]) == len && !strncmp(p, target_names[t], len)) found = t;
        if (found < 0)
            return err_set("unknown LoRA module '%.*s' (known: q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, "
                           "down_proj, or all-linear)", (int)len, p);
        *targets |= 1u << found;
        p += len;
        if (*p == ',') p++;
    }
    if (!*targets) return err_set("empty LoRA module list");
    return 0;
}

// in_features and out_features of a target's linear layer.
static void target_shape(const ModelConfig *cfg, LoraTarget t, long *in, long *out) {
    const long C = cfg->hidden_size, I = cfg->intermediate_size;
    const long q_dim = (long)cfg->num_heads * cfg->head_dim, kv_dim = (long)cfg->num_kv_heads * cfg->head_dim;
    switch (t) {
    case LORA_Q: *in = C, *out = q_dim; break;
    case LORA_K:
    case LORA_V: *in = C, *out = kv_dim; break;
    case LORA_O: *in = q_dim, *out = C; break;
    case LORA_GATE:
    case LORA_UP: *in = C, *out = I; break;
    default: *in = I, *out = C; break;
    }
}

long lora_in_features(const ModelConfig *cfg, LoraTarget target) {
    long in, out;
    target_shape(cfg, target, &in, &out);
    return in;
}

long lora_out_features(const ModelConfig *cfg, LoraTarget target) {
    long in, out;
    target_shape(cfg, target, &in, &out);
    return out;
}

static float *base_weight(const LayerTensors *w, LoraTarget t) {
    float *const weights[LORA_TARGETS] = {w->q_w, w->k_w, w->v_w, w->o_w, w->gate_w, w->up_w, w->down_w};
    return weights[t];
}

// The quantized copy of layer `layer`'s target-t weight when the base is quantized (QLoRA,
// QDoRA: its float32 weight is gone), else NULL.
static const Q8Matrix *base_quantized(const Model *model, int layer, LoraTarget t) {
    if (!model->quantized) return NULL;
    const QuantizedLayer *q = &model->quantized->layers[layer];
    const Q8Matrix *const matrices[LORA_TARGETS] = {&q->q, &q->k, &q->v, &q->o, &q->gate, &q->up, &q->down};
    return matrices[t]->values ? matrices[t] : NULL;
}


static const float *base_bias(const LayerTensors *w, LoraTarget t) {
    const float *const biases[LORA_TARGETS] = {w->q_b, w->k_b, w->v_b, w->o_b, NULL, w->up_b, w->down_b};
    return biases[t];
}

// DoRA: where a module's row norms start in Model.dora_norms (layer after layer, each layer's
// adapted modules in LoraTarget order), and how many floats all of them take.
static long dora_norm_offset(const Model *model, int layer, LoraTarget target) {
    long per_layer = 0, before = 0, in, out;
    for (int t = 0; t < LORA_TARGETS; t++) {
        if (!(model->lora.targets & (1u << t))) continue;
        target_shape(&model->config, (LoraTarget)t, &in, &out);
        if (t < (int)target) before += out;
        per_layer += out;
    }
    return layer * per_layer + before;
}

static float scale_of(float alpha, int rank, bool rslora) {
    return rslora ? alpha / sqrtf((float)rank) : alpha / (float)rank;
}

// ---------------------------------------------------------------------------------------
// Per-module ranks and alphas (PEFT's rank_pattern / alpha_pattern)

// Whether `regex` (PCRE2 reads Python's re syntax for these), compiled with `options`, matches
// `name`: 1 or 0; -1 when it does not compile, PCRE2's reason in `error`.
static int regex_matches(const char *regex, uint32_t options, const char *name, char *error, size_t size) {
    int code;
    PCRE2_SIZE offset;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)regex, PCRE2_ZERO_TERMINATED, options, &code, &offset, NULL);
    if (!re) {
        pcre2_get_error_message(code, (PCRE2_UCHAR *)error, size);
        return -1;
    }
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(re, NULL);
    const int rc = pcre2_match(re, (PCRE2_SPTR)name, strlen(name), 0, 0, md, NULL);
    pcre2_match_data_free(md);
    pcre2_code_free(re);
    return rc >= 0;
}

// Whether `key` selects the module `name` as PEFT's get_pattern_key decides:
// re.match(rf"(.*\.)?({key})$", name). Returns 1 or 0, or -1 with err_set() on a bad regex.
static int pattern_matches(const char *key, const char *name, const char *what) {
    char regex[sizeof ((LoraPattern *)0)->key + 16], error[128];
    snprintf(regex, sizeof regex, "^(.*\\.)?(%s)$", key);
    const int m = regex_matches(regex, 0, name, error, sizeof error);
    if (m < 0) return err_set("%s key '%s' is not a regular expression: %s", what, key, error);
    return m;
}

// re.fullmatch(regex, name), as PEFT matches a target_modules string: 1 or 0, or -1 with
// err_set() on a bad regex.
static int regex_fullmatch(const char *regex, const char *name) {
    char error[128];
    const int m = regex_matches(regex, PCRE2_ANCHORED | PCRE2_ENDANCHORED, name, error, sizeof error);
    if (m < 0) return err_set("target_modules '%s' is not a regular expression: %s", regex, error);
    return m;
}

static bool layer_listed(const LoraConfig *lora, int layer) {
    return layer >= 0 && layer < LORA_MAX_LAYERS && (lora->layers[layer / 64] >> (layer % 64) & 1);
}

void lora_select_layer(LoraConfig *lora, int layer) {
    CHECK(layer >= 0 && layer < LORA_MAX_LAYERS, "LoRA layer %d out of range", layer);
    lora->layer_subset = true;
    lora->layers[layer / 64] |= 1ull << (layer % 64);
}

int lora_set_target_regex(LoraConfig *lora, const char *regex) {
    if (!*regex || strlen(regex) >= sizeof lora->target_regex)
        return err_set("must be 1 to %zu characters", sizeof lora->target_regex - 1);
    snprintf(lora->target_regex, sizeof lora->target_regex, "%s", regex);
    lora->targets = (1u << LORA_TARGETS) - 1;
    return 0;
}

int lora_parse_layers(LoraConfig *lora, const char *text) {
    for (const char *p = text;;) {
        char *end;
        errno = 0;
        long first = strtol(p, &end, 10), last = first;
        bool ok = end != p && errno == 0 && isdigit((unsigned char)*p);
        if (ok && *end == '-') {
            const char *q = end + 1;
            last = strtol(q, &end, 10);
            ok = end != q && errno == 0 && isdigit((unsigned char)*q) && last >= first;
        }
        if (!ok || last >= LORA_MAX_LAYERS || (*end && *end != ','))
            return err_set("must be layer indices and ranges (0 to %d) separated by commas, e.g. 0,1,8-11, got '%s'",
                           LORA_MAX_LAYERS - 1, text);
        for (long l = first; l <= last; l++) lora_select_layer(lora, (int)l);
        if (!*end) return 0;
        p = end + 1;
    }
}

// Whether module t of `layer` (one of lora->targets) has adapters: PEFT's
// check_target_module_exists for a string target_modules or layers_to_transform. Returns 1
// or 0, or -1 with err_set() on a bad regex.
static int module_selected(const LoraConfig *lora, int layer, LoraTarget t) {
    if (lora->target_regex[0]) {
        char name[96];
        snprintf(name, sizeof name, "model.layers.%d.%s", layer, target_paths[t]);
        return regex_fullmatch(lora->target_regex, name);
    }
    return !lora->layer_subset || layer_listed(lora, layer);
}

bool lora_selection_equal(const LoraConfig *a, const LoraConfig *b) {
    if (strcmp(a->target_regex, b->target_regex) || a->layer_subset != b->layer_subset) return false;
    return !a->layer_subset || !memcmp(a->layers, b->layers, sizeof a->layers);
}

// The value of the first of `patterns` (in the given order) selecting `name`, or `fallback`.
static int resolve(const LoraPattern *patterns, int count, const int *order, const char *name, float fallback,
                   const char *what, float *value) {
    *value = fallback;
    for (int i = 0; i < count; i++) {
        const LoraPattern *p = &patterns[order ? order[i] : i];
        const int m = pattern_matches(p->key, name, what);
        if (m < 0) return -1;
        if (m) {
            *value = p->value;
            return 0;
        }
    }
    return 0;
}

static int compare_keys(const void *a, const void *b, void *patterns) {
    const LoraPattern *p = patterns;
    return strcmp(p[*(const int *)a].key, p[*(const int *)b].key);
}

// A module's rank and alpha. PEFT writes adapter_config.json with its keys sorted, so a
// pattern list whose order decides something the sorted order would decide otherwise would
// not come back the same from a saved adapter: refused.
static int module_rank_alpha(const LoraConfig *lora, int layer, LoraTarget t, int *rank, float *alpha) {
    char name[96];
    snprintf(name, sizeof name, "model.layers.%d.%s", layer, target_paths[t]);
    const struct {
        const LoraPattern *patterns;
        int count;
        float fallback;
        const char *what;
    } lists[2] = {{lora->rank_pattern, lora->rank_patterns, (float)lora->rank, "rank_pattern"},
                  {lora->alpha_pattern, lora->alpha_patterns, lora->alpha, "alpha_pattern"}};
    float values[2];
    for (int k = 0; k < 2; k++) {
        if (resolve(lists[k].patterns, lists[k].count, NULL, name, lists[k].fallback, lists[k].what, &values[k]) != 0)
            return -1;
        int order[LORA_MAX_PATTERNS];
        for (int i = 0; i < lists[k].count; i++) order[i] = i;
        qsort_r(order, (size_t)lists[k].count, sizeof order[0], compare_keys, (void *)lists[k].patterns);
        float sorted;
        if (resolve(lists[k].patterns, lists[k].count, order, name, lists[k].fallback, lists[k].what, &sorted) != 0)
            return -1;
        if (sorted != values[k])
            return err_set("%s: two keys select module %s with different values (%g in the order given, %g in the "
                           "sorted order PEFT saves them in): make them select different modules", lists[k].what,
                           name, values[k], sorted);
    }
    *rank = (int)values[0];
    *alpha = values[1];
    return 0;
}

int lora_check_patterns(const LoraConfig *lora) {
    for (int k = 0; k < 2; k++) {
        const LoraPattern *list = k == 0 ? lora->rank_pattern : lora->alpha_pattern;
        const int count = k == 0 ? lora->rank_patterns : lora->alpha_patterns;
        const char *what = k == 0 ? "rank_pattern" : "alpha_pattern";
        if (count < 0 || count > LORA_MAX_PATTERNS) return err_set("%s: at most %d keys", what, LORA_MAX_PATTERNS);
        for (int i = 0; i < count; i++) {
            const float v = list[i].value;
            if (!*list[i].key) return err_set("%s: an empty key", what);
            for (int j = 0; j < i; j++)
                if (!strcmp(list[j].key, list[i].key)) return err_set("%s: key '%s' given twice", what, list[i].key);
            if (k == 0 && !(v >= 1 && v <= 4096 && v == floorf(v)))
                return err_set("%s: the rank of '%s' must be a whole number in [1, 4096], got %g", what, list[i].key, v);
            if (k == 1 && !(v > 0 && isfinite(v)))
                return err_set("%s: the alpha of '%s' must be positive, got %g", what, list[i].key, v);
            if (pattern_matches(list[i].key, "", what) < 0) return -1;
        }
    }
    return lora_check_selection(lora);
}

int lora_check_selection(const LoraConfig *lora) {
    if (lora->target_regex[0] && lora->layer_subset)
        return err_set("layers_to_transform cannot be used with a target_modules regex (PEFT refuses it too)");
    if (lora->layer_subset) {
        bool any = false;
        for (int i = 0; i < LORA_MAX_LAYERS / 64; i++) any |= lora->layers[i] != 0;
        if (!any) return err_set("layers_to_transform names no layer");
    }
    if (lora->target_regex[0]) {
        // PEFT would put adapters on these linear layers too; marlhf has none for them.
        const char *others[3] = {"lm_head", "score", "model.embed_tokens"};
        for (int i = 0; i < 3; i++) {
            const int m = regex_fullmatch(lora->target_regex, others[i]);
            if (m < 0) return -1;
            if (m) return err_set("target_modules '%s' matches %s, which marlhf does not adapt", lora->target_regex, others[i]);
        }
    }
    return 0;
}

bool lora_patterns_equal(const LoraConfig *a, const LoraConfig *b) {
    if (a->rank_patterns != b->rank_patterns || a->alpha_patterns != b->alpha_patterns) return false;
    for (int i = 0; i < a->rank_patterns; i++)
        if (strcmp(a->rank_pattern[i].key, b->rank_pattern[i].key) || a->rank_pattern[i].value != b->rank_pattern[i].value)
            return false;
    for (int i = 0; i < a->alpha_patterns; i++)
        if (strcmp(a->alpha_pattern[i].key, b->alpha_pattern[i].key) ||
            a->alpha_pattern[i].value != b->alpha_pattern[i].value)
            return false;
    return true;
}

static int compare_patterns(const void *a, const void *b) {
    return strcmp(((const LoraPattern *)a)->key, ((const LoraPattern *)b)->key);
}

int lora_parse_patterns(const char *text, const char *what, LoraPattern *patterns, int *count) {
    *count = 0;
    json_error_t error;
    json_t *object = NULL;
    if (*text == '{') { // PEFT's own form, a JSON object
        object = json_loads(text, JSON_REJECT_DUPLICATES, &error);
        if (!object || !json_is_object(object)) {
            json_decref(object);
            return err_set("%s must be KEY=VALUE,... or a JSON object of numbers: %s", what,
                           object ? "not an object" : error.text);
        }
        const char *key;
        json_t *value;
        int rc = 0;
        json_object_foreach(object, key, value) {
            if (*count == LORA_MAX_PATTERNS || strlen(key) >= sizeof patterns->key || !json_is_number(value)) {
                rc = err_set("%s: '%s' (at most %d keys of fewer than %zu characters, each with a number)", what, key,
                             LORA_MAX_PATTERNS, sizeof patterns->key);
                break;
            }
            snprintf(patterns[*count].key, sizeof patterns->key, "%s", key);
            patterns[(*count)++].value = (float)json_number_value(value);
        }
        json_decref(object);
        if (rc != 0) return rc;
    } else {
        // KEY=VALUE items split at the commas outside brackets (a key is a regex: "{1,2}"),
        // each at its last '='.
        const char *p = text;
        while (*p) {
            const char *end = p;
            int depth = 0;
            for (; *end && !(*end == ',' && depth == 0); end++) {
                if (*end == '\\' && end[1]) {
                    end++;
                    continue;
                }
                depth += (*end == '(' || *end == '[' || *end == '{') - (*end == ')' || *end == ']' || *end == '}');
            }
            const char *eq = NULL;
            for (const char *q = p; q < end; q++)
                if (*q == '=') eq = q;
            if (!eq || eq == p || eq + 1 == end)
                return err_set("%s: '%.*s' is not KEY=VALUE", what, (int)(end - p), p);
            if (*count == LORA_MAX_PATTERNS) return err_set("%s: at most %d keys", what, LORA_MAX_PATTERNS);
            if ((size_t)(eq - p) >= sizeof patterns->key) return err_set("%s: key '%.*s' is too long", what, (int)(eq - p), p);
            char number[32];
            snprintf(number, sizeof number, "%.*s", (int)(end - eq - 1 < 31 ? end - eq - 1 : 31), eq + 1);
            char *stop;
            const double v = strtod(number, &stop);
            if (stop == number || *stop) return err_set("%s: '%.*s' is not a number", what, (int)(end - eq - 1), eq + 1);
            snprintf(patterns[*count].key, sizeof patterns->key, "%.*s", (int)(eq - p), p);
            patterns[(*count)++].value = (float)v;
            p = *end ? end + 1 : end;
        }
    }
    // In the sorted order PEFT writes adapter_config.json in, so a saved adapter resolves as trained.
    qsort(patterns, (size_t)*count, sizeof *patterns, compare_patterns);
    return 0;
}

static long module_index(int layer, LoraTarget t) { return (long)layer * LORA_TARGETS + t; }

// The scale of one adapted module.
static float module_scale(const Model *model, int layer, LoraTarget t) {
    return model->lora_scales[module_index(layer, t)];
}

static int module_rank(const Model *model, int layer, LoraTarget t) {
    return model->lora_ranks[module_index(layer, t)];
}

// norms[o] = the Euclidean norm of row o of weight [rows, cols], summed in double: DoRA's
// initial magnitudes and its merge (the training passes' norms are the dora_weight_norm op).
static void row_norms(float *norms, const float *weight, long rows, long cols) {
    for (long o = 0; o < rows; o++) {
        double sum = 0;
        for (long i = 0; i < cols; i++) sum += (double)weight[o * cols + i] * weight[o * cols + i];
        norms[o] = (float)sqrt(sum);
    }
}

// dst[0, n) = src[0, n) for a dst of zeros, skipping the pages of src whose bits are all zero
// (untouched or given-back pages read as the shared zero page, so this reads without
// making them resident, and leaves dst's pages untouched there).
static void copy_nonzero_pages(float *dst, const float *src, long n) {
    const long page = 1024; // floats: 4 KiB
    for (long first = 0; first < n; first += page) {
        const long count = n - first < page ? n - first : page;
        const uint32_t *bits = (const uint32_t *)(src + first);
        long k = 0;
        while (k < count && bits[k] == 0) k++;
        if (k < count) memcpy(dst + first, src + first, (size_t)count * sizeof(float));
    }
}

int model_add_lora(Model *model, const LoraConfig *lora, bool train_value_head, uint64_t seed) {
    const ModelConfig *cfg = &model->config;
    CHECK(!model->grads, "model_add_lora after model_enable_grad");
    CHECK(model->lora.rank == 0, "the model already has LoRA adapters");
    if (lora->rank < 1) return err_set("--lora-rank must be at least 1 (got %d)", lora->rank);
    if (!(lora->alpha > 0) || !isfinite(lora->alpha)) return err_set("--lora-alpha must be positive (got %g)", lora->alpha);
    if (!(lora->dropout >= 0 && lora->dropout < 1)) return err_set("--lora-dropout must be in [0, 1) (got %g)", lora->dropout);
    unsigned targets = lora->targets;
    if (cfg->mlp == MLP_GELU && (targets & (1u << LORA_GATE))) {
        if (targets == (1u << LORA_GATE))
            return err_set("the model has no gate_proj (a %s MLP): choose other --lora-modules", cfg->model_type);
        targets &= ~(1u << LORA_GATE); // "all-linear" on GPT-2: every linear layer it has
    }
    if (!targets) return err_set("no LoRA module chosen");
    if (lora_check_patterns(lora) != 0) return -1;
    for (int l = cfg->num_layers; l < LORA_MAX_LAYERS; l++)
        if (lora->layer_subset && layer_listed(lora, l))
            return err_set("layers_to_transform names layer %d; the model has %d layers (0 to %d)", l, cfg->num_layers,
                           cfg->num_layers - 1);
    int *ranks = xcalloc((size_t)cfg->num_layers * LORA_TARGETS, sizeof(int));
    float *scales = xcalloc((size_t)cfg->num_layers * LORA_TARGETS, sizeof(float));
    int max_rank = 0;
    unsigned adapted = 0; // the targets some layer's module of which has adapters
    for (int l = 0; l < cfg->num_layers; l++)
        for (int t = 0; t < LORA_TARGETS; t++) {
            if (!(targets & (1u << t))) continue;
            const int selected = module_selected(lora, l, (LoraTarget)t);
            if (selected < 0) {
                free(ranks), free(scales);
                return -1;
            }
            if (!selected) continue; // rank 0: no entries, no adapter term (lora_forward)
            adapted |= 1u << t;
            float alpha = 0;
            if (module_rank_alpha(lora, l, (LoraTarget)t, &ranks[module_index(l, (LoraTarget)t)], &alpha) != 0) {
                free(ranks), free(scales);
                return -1;
            }
            const int r = ranks[module_index(l, (LoraTarget)t)];
            scales[module_index(l, (LoraTarget)t)] = scale_of(alpha, r, lora->rslora);
            if (r > max_rank) max_rank = r;
        }
    if (!adapted) {
        free(ranks), free(scales);
        return lora->target_regex[0] ? err_set("target_modules '%s' matches none of the model's modules "
                                               "(model.layers.L.self_attn.q_proj ...)", lora->target_regex)
                                     : err_set("no LoRA module chosen");
    }
    targets = adapted;
    // DoRA over a quantized base (QDoRA) takes its magnitudes and weight norms from the
    // dequantized weights (the backend's dequantize_rows).
    if (lora->dora && model->quantized && !model->ops->dequantize_rows) {
        free(ranks), free(scales);
        return err_set("--use-dora over a quantized base: the %s backend cannot dequantize its weights", model->ops->name);
    }

    // Appending entries leaves every existing offset where it was.
    const long base_total = model->table.total;
    long first_trainable = base_total;
    if (train_value_head && model->has_value_head) first_trainable = param_table_find(&model->table, "score.weight")->offset;
    const int first_adapter = model->table.count;
    char name[96];
    for (int l = 0; l < cfg->num_layers; l++)
        for (int t = 0; t < LORA_TARGETS; t++) {
            if (!(targets & (1u << t))) continue;
            long in, out;
            const int r = ranks[module_index(l, (LoraTarget)t)];
            if (r == 0) continue; // not selected in this layer
            target_shape(cfg, (LoraTarget)t, &in, &out);
            snprintf(name, sizeof name, "model.layers.%d.%s.lora_A.weight", l, target_paths[t]);
            param_table_append(&model->table, name, l, offsetof(LayerTensors, lora_a) + (size_t)t * sizeof(float *),
                               r, in);
            snprintf(name, sizeof name, "model.layers.%d.%s.lora_B.weight", l, target_paths[t]);
            param_table_append(&model->table, name, l, offsetof(LayerTensors, lora_b) + (size_t)t * sizeof(float *),
                               out, r);
            if (!lora->dora) continue;
            // PEFT's name for DoRA's magnitude vector (no ".weight").
            snprintf(name, sizeof name, "model.layers.%d.%s.lora_magnitude_vector", l, target_paths[t]);
            param_table_append(&model->table, name, l, offsetof(LayerTensors, lora_m) + (size_t)t * sizeof(float *),
                               out, 0);
        }
    // Adapters decay like the weights they adapt (PEFT puts them in the decayed group).
    for (int i = first_adapter; i < model->table.count; i++) model->table.entries[i].decay = true;
    if (first_trainable == base_total) first_trainable = model->table.entries[first_adapter].offset;

    // The new buffer, built on the host: the old weights, A random, B zero, and DoRA's
    // magnitude the row norms of W + scale * B A = W (PEFT's initialisation). Over a quantized
    // base (QLoRA) on the CPU the buffer is the new params itself and only the float32 entries
    // are copied: the quantized ones' pages were given back and stay untouched (zeros, no
    // memory). Over a quantized base on the GPU the whole base goes through the host as a
    // float32 one does (its quantized entries are zeros there). Either way the fingerprint is
    // of the base's dequantized values.
    const bool quantized_on_cpu = model->quantized != NULL && model->ops == &ops_cpu;
    float *host;
    if (quantized_on_cpu) {
        host = model->ops->alloc((size_t)model->table.total * sizeof(float));
        quantized_small_pages(host, base_total);
        for (int i = 0; i < first_adapter; i++) {
            const ParamEntry *e = &model->table.entries[i];
            if (!quantized_matrix(model, e))
                memcpy(host + e->offset, model->params + e->offset, (size_t)e->numel * sizeof(float));
        }
        model->lora_base_fingerprint = model_base_hash(model, model->params, first_trainable);
    } else if (model->ops == &ops_cpu) {
        // The new buffer itself, zero pages until written: only the old buffer's nonzero pages
        // are copied, so a base of which this rank loaded only its ZeRO-3 shard
        // (ModelLoadOptions.keep_range) costs no memory for the rest.
        host = model->ops->alloc((size_t)model->table.total * sizeof(float));
        copy_nonzero_pages(host, model->params, base_total);
    } else {
        host = xcalloc((size_t)model->table.total, sizeof(float));
        model_params_to_host(model, host, base_total);
    }
    for (int i = first_adapter; i < model->table.count; i++) {
        const ParamEntry *e = &model->table.entries[i];
        if (!strstr(e->name, ".lora_A.")) continue;
        const float bound = 1.0f / sqrtf((float)e->shape[1]);
        const uint64_t stream = rng_stream(e->name, (uint64_t)e->layer, 0);
        for (long j = 0; j < e->numel; j++)
            host[e->offset + j] = bound * (2.0f * rng_uniform(seed, stream, (uint64_t)j) - 1.0f);
    }
    if (lora->dora) {
        ModelTensors views = {0};
        param_views_bind(&views, &model->table, host, cfg->num_layers);
        for (int l = 0; l < cfg->num_layers; l++)
            for (int t = 0; t < LORA_TARGETS; t++) {
                const LayerTensors *w = &views.layers[l];
                if (!w->lora_m[t]) continue;
                long in, out;
                target_shape(cfg, (LoraTarget)t, &in, &out);
                const Q8Matrix *quantized = base_quantized(model, l, (LoraTarget)t);
                if (!quantized) {
                    row_norms(w->lora_m[t], base_weight(w, (LoraTarget)t), out, in);
                    continue;
                }
                // QDoRA: the dequantized weight, made in the backend's memory and copied here
                // (the host buffer's slot for it stays untouched).
                const size_t bytes = (size_t)(out * in) * sizeof(float);
                float *dequantized = model->ops->alloc(bytes), *rows = xmalloc(bytes);
                model->ops->dequantize_rows(dequantized, quantized, 0, (int)out);
                model->ops->copy_to_host(rows, dequantized, bytes);
                row_norms(w->lora_m[t], rows, out, in);
                model->ops->free(dequantized);
                free(rows);
            }
        param_views_free(&views);
    }
    model->ops->free(model->params);
    if (quantized_on_cpu) {
        model->params = host;
    } else if (model->ops == &ops_cpu) {
        model->params = host;
        model->lora_base_fingerprint = hash_floats(HASH_FNV1A_START, host, first_trainable);
    } else {
        model->params = model->ops->alloc((size_t)model->table.stored_total * sizeof(float));
        model_params_to_device(model, host, model->table.total);
        model->lora_base_fingerprint = model->quantized ? model_base_hash(model, host, first_trainable)
                                                        : hash_floats(HASH_FNV1A_START, host, first_trainable);
        free(host);
    }
    param_views_bind_stored(&model->weights, &model->table, model->params, cfg->num_layers);
    model->lora = *lora;
    model->lora.targets = targets;
    model->lora_ranks = ranks, model->lora_scales = scales, model->lora_max_rank = max_rank;
    if (lora->dora)
        model->dora_norms = model->ops->alloc((size_t)dora_norm_offset(model, cfg->num_layers, LORA_Q) * sizeof(float));
    model->lora_first_entry = first_adapter;
    model->lora_enabled = true;
    model->trainable_offset = first_trainable;
    // Activations sized before the adapters existed lack the adapters' buffers.
    model_rebuild_activations(model);
    return 0;
}

void model_remove_lora(Model *model) {
    if (model->lora.rank == 0) return;
    const long base_total = model->table.entries[model->lora_first_entry].offset;
    const long base_stored = model->table.entries[model->lora_first_entry].stored;
    model_release_activations(model);
    if (model->quantized && model->ops == &ops_cpu) { // as model_add_lora built it: only the float32 entries, no given-back pages touched
        float *params = model->ops->alloc((size_t)base_total * sizeof(float));
        quantized_small_pages(params, base_total);
        for (int i = 0; i < model->lora_first_entry; i++) {
            const ParamEntry *e = &model->table.entries[i];
            if (!quantized_matrix(model, e))
                memcpy(params + e->offset, model->params + e->offset, (size_t)e->numel * sizeof(float));
        }
        model->ops->free(model->params);
        model->params = params;
    } else {
        float *host = xmalloc((size_t)base_total * sizeof(float));
        model_params_to_host(model, host, base_total);
        model->ops->free(model->params);
        model->params = model->ops->alloc((size_t)base_stored * sizeof(float));
        model_params_to_device(model, host, base_total);
        free(host);
    }
    if (model->dora_norms) model->ops->free(model->dora_norms);
    model->dora_norms = NULL;
    free(model->lora_ranks), free(model->lora_scales);
    model->lora_ranks = NULL, model->lora_scales = NULL, model->lora_max_rank = 0;
    if (model->grads) model->ops->free(model->grads);
    model->grads = NULL;
    free(model->gradient_unwritten);
    model->gradient_unwritten = NULL;
    param_views_free(&model->gradients);
    model->table.count = model->lora_first_entry;
    model->table.total = base_total;
    model->table.stored_total = base_stored;
    param_views_bind_stored(&model->weights, &model->table, model->params, model->config.num_layers);
    model->lora = (LoraConfig){0};
    model->lora_first_entry = model->table.count;
    model->lora_enabled = false;
    model->lora_base_fingerprint = 0;
    model->trainable_offset = 0;
}

void lora_describe(const Model *model, char *out, size_t size) {
    char modules[128] = "";
    for (int t = 0; t < LORA_TARGETS; t++)
        if (model->lora.targets & (1u << t))
            snprintf(modules + strlen(modules), sizeof modules - strlen(modules), "%s%s", *modules ? "," : "",
                     target_names[t]);
    long trainable = 0;
    for (int i = 0; i < model->table.count; i++)
        if (model->table.entries[i].offset >= model->trainable_offset) trainable += model->table.entries[i].numel;
    const long total = model_num_params(model);
    char dropout[48] = "";
    if (model->lora.dropout > 0) snprintf(dropout, sizeof dropout, ", dropout %g", model->lora.dropout);
    char patterns[64] = "";
    if (model->lora.target_regex[0] || model->lora.layer_subset) {
        // Only some layers' modules: name them by what chose them.
        long adapted = 0;
        for (int i = model->lora_first_entry; i < model->table.count; i++) adapted += !!strstr(model->table.entries[i].name, ".lora_A.");
        snprintf(modules + strlen(modules), sizeof modules - strlen(modules), " (%ld modules, by %s)", adapted,
                 model->lora.target_regex[0] ? "target_modules regex" : "layers_to_transform");
    }
    if (model->lora.rank_patterns || model->lora.alpha_patterns)
        snprintf(patterns, sizeof patterns, " (per module: %d rank, %d alpha patterns; largest rank %d)",
                 model->lora.rank_patterns, model->lora.alpha_patterns, model->lora_max_rank);
    snprintf(out, size, "rank %d, alpha %g%s%s%s%s, %s: %ld of %ld parameters trained (%.2f%%)", model->lora.rank,
             model->lora.alpha, patterns, model->lora.rslora ? " (rsLoRA)" : "", model->lora.dora ? ", DoRA" : "",
             dropout, modules, trainable, total, 100.0 * trainable / total);
}

// ---------------------------------------------------------------------------------------
// Forward and backward of the adapter term

// LoRA dropout: in a training pass (model.h model_training_pass_begin) the adapters' inputs
// are dropped with probability model->lora.dropout.
static bool dropout_applies(const Model *model) {
    return model->training_pass.active && model->lora.rank > 0 && model->lora.dropout > 0 && model->lora_enabled;
}

// The mask of one adapter in the current pass: its own stream per (pass, layer, target).
static uint64_t dropout_stream(const Model *model, int layer, LoraTarget target) {
    const uint64_t adapter = (uint64_t)layer * LORA_TARGETS + (uint64_t)target;
    return rng_stream("lora_dropout", model->training_pass.micro_batch, (model->training_pass.passes << 20) | adapter);
}

void lora_dora_norms(Model *model, int l) {
    if (!model->lora.dora || !model->lora_enabled) return;
    const ModelConfig *cfg = &model->config;
    const OpsBackend *ops = model->ops;
    float *delta = model->acts.dora_delta;
    CHECK(delta, "DoRA norms without activations (model_reserve)");
    const LayerTensors *w = &model->weights.layers[l];
    for (int t = 0; t < LORA_TARGETS; t++) {
        if (!w->lora_m[t]) continue;
        long in, out;
        target_shape(cfg, (LoraTarget)t, &in, &out);
        // delta[out, in] = B[out, rank] . A[rank, in]: matmul_backward's input gradient
        // (dinp = dout . weight) with B as dout and A as the weight.
        ops->matmul_backward(delta, NULL, NULL, w->lora_b[t], NULL, w->lora_a[t], (int)out, (int)in,
                             module_rank(model, l, (LoraTarget)t), WRITE_OVERWRITE, WRITE_ADD);
        // QDoRA: W dequantized into its own scratch first (the float32 weight is gone).
        const Q8Matrix *quantized = base_quantized(model, l, (LoraTarget)t);
        const float *weight = base_weight(w, (LoraTarget)t);
        if (quantized) {
            CHECK(model->acts.dora_base, "QDoRA norms without the dequantized weight's scratch (model_reserve)");
            ops->dequantize_rows(model->acts.dora_base, quantized, 0, (int)out);
            weight = model->acts.dora_base;
        }
        ops->dora_weight_norm(model->dora_norms + dora_norm_offset(model, l, (LoraTarget)t), weight, delta,
                              module_scale(model, l, (LoraTarget)t), (int)out, (int)in);
    }
}

void lora_dora_init_magnitudes(Model *model, int l) {
    if (!model->lora.dora) return;
    CHECK(model->ops == &ops_cpu && !model->quantized, "DoRA magnitudes set again off the CPU or over a quantized base");
    const LayerTensors *w = &model->weights.layers[l];
    for (int t = 0; t < LORA_TARGETS; t++) {
        if (!w->lora_m[t]) continue;
        long in, out;
        target_shape(&model->config, (LoraTarget)t, &in, &out);
        row_norms(w->lora_m[t], base_weight(w, (LoraTarget)t), out, in);
    }
}

bool lora_adapts(const Model *model, int layer, LoraTarget target) {
    return model->lora_enabled && model->weights.layers[layer].lora_a[target];
}

void lora_forward(Model *model, int layer, LoraTarget target, float *out, const float *inp,
                  float *hidden, float *z, long N) {
    const LayerTensors *w = &model->weights.layers[layer];
    if (!lora_adapts(model, layer, target)) return;
    const OpsBackend *ops = model->ops;
    const int rank = module_rank(model, layer, target);
    long in, out_features;
    target_shape(&model->config, target, &in, &out_features);
    // PEFT's lora_B(lora_A(dropout(x))): only the adapter's input is dropped, with a mask of
    // its own; the base layer sees x whole.
    const bool dropout = dropout_applies(model);
    if (dropout) {
        ops->dropout_forward(model->acts.lora_dropped, inp, N * in, (float)model->lora.dropout, model->training_pass.seed,
                             dropout_stream(model, layer, target));
        inp = model->acts.lora_dropped;
    }
    ops->matmul_forward(hidden, inp, w->lora_a[target], NULL, (int)N, (int)in, rank);
    ops->scale(hidden, module_scale(model, layer, target), N * rank);
    if (!w->lora_m[target]) {
        ops->matmul_accumulate(out, hidden, w->lora_b[target], (int)N, rank, (int)out_features);
        return;
    }
    // DoRA, as PEFT computes it: with s = m / ||W + scale B A|| (the norm detached),
    // out += (s - 1) base + s * scale * B A x. The base result is out less its bias, or with
    // dropout W applied to the dropped input (PEFT recomputes it so).
    ops->matmul_forward(z, hidden, w->lora_b[target], NULL, (int)N, rank, (int)out_features);
    const float *base = NULL;
    if (dropout) {
        model_linear_forward(model, model->acts.dora_scratch, inp, base_weight(w, target),
                             base_quantized(model, layer, target), NULL, N, (int)in, (int)out_features, N);
        base = model->acts.dora_scratch;
    }
    ops->dora_forward(out, z, base, base_bias(w, target), w->lora_m[target],
                      model->dora_norms + dora_norm_offset(model, layer, target), (int)N, (int)out_features);
}

const float *lora_dora_dout(Model *model, int layer, LoraTarget target, const float *dout, const float *z, long N) {
    const LayerTensors *w = &model->weights.layers[layer];
    if (!model->lora_enabled || !w->lora_m[target]) return dout;
    long in, out_features;
    target_shape(&model->config, target, &in, &out_features);
    // The base layer's backward takes s * dout: right for its input, wrong for a bias (which
    // PEFT leaves outside the rescaling), so the bias must be frozen, as LoRA leaves it.
    CHECK(!base_bias(&model->gradients.layers[layer], target), "DoRA with a trainable bias");
    // d out / d base = s everywhere without dropout (the base layer's own term plus (s - 1)
    // times it); the adapter's term takes s * dout as well.
    model->ops->dora_backward(model_gradient_to_add(model, model->gradients.layers[layer].lora_m[target]),
                              model->acts.dora_scratch, dout, z,
                              w->lora_m[target], model->dora_norms + dora_norm_offset(model, layer, target), 0.0f,
                              (int)N, (int)out_features);
    return dropout_applies(model) ? dout : model->acts.dora_scratch;
}

void lora_backward(Model *model, int layer, LoraTarget target, float *dinp, const float *dout,
                   const float *inp, const float *hidden, long N) {
    const LayerTensors *w = &model->weights.layers[layer];
    if (!model->lora_enabled || !w->lora_a[target]) return;
    const LayerTensors *g = &model->gradients.layers[layer];
    const OpsBackend *ops = model->ops;
    const int rank = module_rank(model, layer, target);
    long in, out_features;
    target_shape(&model->config, target, &in, &out_features);
    float *d_hidden = model->acts.d_lora_hidden;
    const bool dora = w->lora_m[target] != NULL;
    const float *d_lora = dora ? model->acts.dora_scratch : dout; // DoRA: s * dout (lora_dora_dout)
    // hidden = scale * A x and out += B hidden, so dB += dout^T hidden, d(A x) = scale * dout B.
    ops->matmul_backward(d_hidden, g->lora_b[target], NULL, d_lora, hidden, w->lora_b[target], (int)N, rank,
                         (int)out_features, WRITE_OVERWRITE, model_gradient_write_mode(model, g->lora_b[target], NULL));
    ops->scale(d_hidden, module_scale(model, layer, target), N * rank);
    if (!dropout_applies(model)) {
        ops->matmul_backward(dinp, g->lora_a[target], NULL, d_hidden, inp, w->lora_a[target], (int)N, (int)in, rank,
                             WRITE_ADD, model_gradient_write_mode(model, g->lora_a[target], NULL));
        return;
    }
    // With dropout A saw the dropped input: regenerate it (later adapters reused the buffer),
    // and send d(dropped x) back through the same mask.
    const uint64_t stream = dropout_stream(model, layer, target);
    const float p = (float)model->lora.dropout;
    float *dropped = model->acts.lora_dropped, *d_dropped = model->acts.d_lora_dropped;
    ops->dropout_forward(dropped, inp, N * in, p, model->training_pass.seed, stream);
    ops->matmul_backward(d_dropped, g->lora_a[target], NULL, d_hidden, dropped, w->lora_a[target], (int)N, (int)in,
                         rank, WRITE_OVERWRITE, model_gradient_write_mode(model, g->lora_a[target], NULL));
    if (dora) { // the (s - 1) W dropout(x) term: d(dropped x) += W^T ((s - 1) dout)
        ops->dora_backward(NULL, model->acts.dora_scratch, dout, NULL, w->lora_m[target],
                           model->dora_norms + dora_norm_offset(model, layer, target), -1.0f, (int)N,
                           (int)out_features);
        model_linear_backward(model, d_dropped, NULL, NULL, model->acts.dora_scratch, NULL, base_weight(w, target),
                              base_quantized(model, layer, target), N, (int)in, (int)out_features, WRITE_ADD);
    }
    ops->dropout_backward(dinp, d_dropped, N * in, p, model->training_pass.seed, stream);
}

// ---------------------------------------------------------------------------------------
// Merging and files

void lora_merge(const Model *model, float *params) {
    if (model->lora.rank == 0) return;
    const ModelConfig *cfg = &model->config;
    ModelTensors views = {0};
    param_views_bind(&views, &model->table, params, cfg->num_layers);
    for (int l = 0; l < cfg->num_layers; l++)
        for (int t = 0; t < LORA_TARGETS; t++) {
            const LayerTensors *w = &views.layers[l];
            if (!w->lora_a[t]) continue;
            const int rank = module_rank(model, l, (LoraTarget)t);
            const float scale = module_scale(model, l, (LoraTarget)t);
            long in, out;
            target_shape(cfg, (LoraTarget)t, &in, &out);
            // delta[out, in] = B[out, rank] . A[rank, in]: matmul_forward takes its weight as
            // [in, rank], i.e. A transposed.
            float *a_transposed = xmalloc((size_t)in * rank * sizeof(float));
            for (long k = 0; k < rank; k++)
                for (long i = 0; i < in; i++) a_transposed[i * rank + k] = w->lora_a[t][k * in + i];
            float *delta = xmalloc((size_t)out * in * sizeof(float));
            ops_cpu.matmul_forward(delta, w->lora_b[t], a_transposed, NULL, (int)out, rank, (int)in);
            float *weight = base_weight(w, (LoraTarget)t);
            for (long j = 0; j < out * in; j++) weight[j] += scale * delta[j];
            if (w->lora_m[t]) { // DoRA (PEFT's merge): each row of W + scale B A times m / its norm
                float *norms = xmalloc((size_t)out * sizeof(float));
                row_norms(norms, weight, out, in);
                for (long o = 0; o < out; o++) {
                    const float factor = w->lora_m[t][o] / norms[o];
                    for (long i = 0; i < in; i++) weight[o * in + i] *= factor;
                }
                free(norms);
            }
            free(a_transposed), free(delta);
        }
    param_views_free(&views);
}

// The adapter target whose base weight `entry` is, or -1.
static int adapted_target(const Model *model, const ParamEntry *entry) {
    if (model->lora.rank == 0 || entry->layer < 0 || entry->ndim != 2) return -1;
    const LayerTensors *w = &model->weights.layers[entry->layer];
    for (int t = 0; t < LORA_TARGETS; t++)
        if (w->lora_a[t] && base_weight(w, (LoraTarget)t) == model->params + entry->offset) return t;
    return -1;
}

long lora_merge_row_length(const Model *model, const ParamEntry *entry) {
    const int t = adapted_target(model, entry);
    return t >= 0 && model->weights.layers[entry->layer].lora_m[t] ? entry->shape[1] : 0;
}

void lora_merge_piece(const Model *model, const ParamEntry *entry, long first, long count, float *out) {
    const int target = adapted_target(model, entry);
    if (target < 0) return;
    CHECK(model->ops == &ops_cpu, "a piecewise LoRA merge off the CPU");
    const LoraTarget t = (LoraTarget)target;
    const int l = entry->layer;
    const LayerTensors *w = &model->weights.layers[l];
    const int rank = module_rank(model, l, t);
    const float scale = module_scale(model, l, t);
    long in, out_features;
    target_shape(&model->config, t, &in, &out_features);
    // out[j - first] += scale * (B A)[o, i] for j = o * in + i, as lora_merge adds it: row by
    // row, each row's part of the piece summed over the rank in contiguous runs of A's rows.
    float *delta = xmalloc((size_t)in * sizeof(float));
    for (long j = first; j < first + count;) {
        const long o = j / in, i0 = j % in, i1 = first + count - j < in - i0 ? i0 + (first + count - j) : in;
        memset(delta + i0, 0, (size_t)(i1 - i0) * sizeof(float));
        for (int k = 0; k < rank; k++) {
            const float b = w->lora_b[t][o * rank + k], *a = w->lora_a[t] + (long)k * in;
            for (long i = i0; i < i1; i++) delta[i] += b * a[i];
        }
        for (long i = i0; i < i1; i++) out[j - first + (i - i0)] += scale * delta[i];
        j += i1 - i0;
    }
    free(delta);
    if (!w->lora_m[t]) return;
    // DoRA: each whole row of W + scale B A times m / its norm, as lora_merge scales it.
    CHECK(first % in == 0 && count % in == 0, "a piecewise DoRA merge of part of a row");
    const long first_row = first / in, rows = count / in;
    float *norms = xmalloc((size_t)rows * sizeof(float));
    row_norms(norms, out, rows, in);
    for (long o = 0; o < rows; o++) {
        const float factor = w->lora_m[t][first_row + o] / norms[o];
        for (long i = 0; i < in; i++) out[o * in + i] *= factor;
    }
    free(norms);
}

static bool trains_value_head(const Model *model) {
    const ParamEntry *score = model->has_value_head ? param_table_find(&model->table, "score.weight") : NULL;
    return score && score->offset >= model->trainable_offset;
}

int lora_write_adapter(const Model *model, const float *params, const char *model_dir) {
    // Not beside model.safetensors: transformers takes a folder with adapter_config.json
    // for an adapter and would apply it on top of the merged weights a second time.
    char *dir = fs_join(model_dir, LORA_ADAPTER_DIR);
    if (fs_mkdir_p(dir) != 0) {
        free(dir);
        return -1;
    }
    const int count = model->table.count;
    SafetensorsWriteTensor *tensors = xcalloc((size_t)count, sizeof *tensors);
    char **names = xcalloc((size_t)count, sizeof *names);
    int n = 0;
    for (int i = 0; i < count; i++) {
        const ParamEntry *e = &model->table.entries[i];
        if (e->offset < model->trainable_offset) continue;
        names[n] = xmalloc(strlen(peft_prefix) + strlen(e->name) + 1);
        sprintf(names[n], "%s%s", peft_prefix, e->name);
        tensors[n] = (SafetensorsWriteTensor){.name = names[n], .dtype = SAFETENSORS_F32, .ndim = e->ndim,
                                              .shape = {e->shape[0], e->shape[1]}, .data = params + e->offset};
        n++;
    }
    char *weights_path = fs_join(dir, "adapter_model.safetensors");
    int rc = safetensors_write(weights_path, tensors, n, NULL);
    free(weights_path);
    for (int i = 0; i < n; i++) free(names[i]);
    free(names), free(tensors);
    if (rc != 0) {
        free(dir);
        return rc;
    }

    json_t *config = json_object();
    json_object_set_new(config, "peft_type", json_string("LORA"));
    json_object_set_new(config, "task_type", json_string(model->has_lm_head ? "CAUSAL_LM" : "SEQ_CLS"));
    json_object_set_new(config, "r", json_integer(model->lora.rank));
    json_object_set_new(config, "lora_alpha", json_real(model->lora.alpha));
    json_object_set_new(config, "lora_dropout", json_real(model->lora.dropout));
    json_object_set_new(config, "use_rslora", json_boolean(model->lora.rslora));
    json_object_set_new(config, "use_dora", json_boolean(model->lora.dora));
    json_object_set_new(config, "bias", json_string("none"));
    json_object_set_new(config, "fan_in_fan_out", json_false());
    json_object_set_new(config, "inference_mode", json_true());
    json_t *modules = json_array();
    for (int t = 0; t < LORA_TARGETS; t++)
        if (model->lora.targets & (1u << t)) json_array_append_new(modules, json_string(target_names[t]));
    if (model->lora.target_regex[0]) json_decref(modules), modules = json_string(model->lora.target_regex);
    json_object_set_new(config, "target_modules", modules);
    json_t *layers = json_null();
    if (model->lora.layer_subset) {
        layers = json_array();
        for (int l = 0; l < model->config.num_layers; l++)
            if (layer_listed(&model->lora, l)) json_array_append_new(layers, json_integer(l));
    }
    json_object_set_new(config, "layers_to_transform", layers);
    // PEFT's per-module ranks and alphas ({} when none, as PEFT writes them).
    json_t *rank_pattern = json_object(), *alpha_pattern = json_object();
    for (int i = 0; i < model->lora.rank_patterns; i++)
        json_object_set_new(rank_pattern, model->lora.rank_pattern[i].key,
                            json_integer((json_int_t)model->lora.rank_pattern[i].value));
    for (int i = 0; i < model->lora.alpha_patterns; i++)
        json_object_set_new(alpha_pattern, model->lora.alpha_pattern[i].key, json_real(model->lora.alpha_pattern[i].value));
    json_object_set_new(config, "rank_pattern", rank_pattern);
    json_object_set_new(config, "alpha_pattern", alpha_pattern);
    if (trains_value_head(model)) json_object_set_new(config, "modules_to_save", json_pack("[s]", "score"));
    char fingerprint[32];
    snprintf(fingerprint, sizeof fingerprint, "%016llx", model->lora_base_fingerprint);
    // Not PEFT's: which base weights the adapters belong to, checked when they are read back.
    json_object_set_new(config, "marlhf_base_fingerprint", json_string(fingerprint));
    // Also not PEFT's: a quantized base (QLoRA), whose dequantized values the fingerprint is of.
    if (model->quantized) json_object_set_new(config, "marlhf_base_quantize", json_string(model_quantize_name(model)));
    char *config_path = fs_join(dir, "adapter_config.json");
    rc = json_write_file(config_path, config, JSON_INDENT(2) | JSON_REAL_PRECISION(9) | JSON_SORT_KEYS);
    json_decref(config);
    free(config_path);
    free(dir);
    return rc;
}

// What adapter_config.json says.
typedef struct {
    LoraConfig lora;
    bool value_head;         // modules_to_save holds "score"
    bool has_fingerprint;    // written by marlhf: the base weights it belongs to
    char fingerprint[32];
    char base_quantize[16];  // "none", or the base's quantization (quantize_type_check's names)
} AdapterConfig;

// The folder holding a model's adapter: MODEL_DIR/adapter, or MODEL_DIR itself (PEFT's).
static char *adapter_dir(const char *model_dir) {
    char *dir = fs_join(model_dir, LORA_ADAPTER_DIR);
    if (fs_is_dir(dir)) return dir;
    free(dir);
    return xstrdup(model_dir);
}

// PEFT's rank_pattern or alpha_pattern (absent, null or an object of numbers), in the file's
// order, which is the order PEFT matches them in when it loads the file.
static int read_patterns(json_t *config, const char *field, const char *path, LoraPattern *patterns, int *count) {
    json_t *object = json_object_get(config, field);
    *count = 0;
    if (!object || json_is_null(object)) return 0;
    if (!json_is_object(object)) return err_set("%s: \"%s\" must be an object of module patterns", path, field);
    const char *key;
    json_t *value;
    json_object_foreach(object, key, value) {
        if (*count == LORA_MAX_PATTERNS) return err_set("%s: \"%s\" has more than %d keys", path, field, LORA_MAX_PATTERNS);
        if (strlen(key) >= sizeof patterns->key) return err_set("%s: \"%s\" key '%.40s...' is too long", path, field, key);
        if (!json_is_number(value)) return err_set("%s: \"%s\" value of '%s' is not a number", path, field, key);
        snprintf(patterns[*count].key, sizeof patterns->key, "%s", key);
        patterns[*count].value = (float)json_number_value(value);
        (*count)++;
    }
    return 0;
}

// PEFT's layers_to_transform (absent, null, a layer or a list of layers) and layers_pattern
// (absent, null, or the "layers" of model.layers.L, which marlhf's names have).
static int read_layers(json_t *config, const char *path, LoraConfig *lora) {
    json_t *layers = json_object_get(config, "layers_to_transform"), *pattern = json_object_get(config, "layers_pattern");
    if (pattern && !json_is_null(pattern) &&
        !(json_is_string(pattern) && !strcmp(json_string_value(pattern), "layers")) &&
        !(json_is_array(pattern) && json_array_size(pattern) == 1 && json_is_string(json_array_get(pattern, 0)) &&
          !strcmp(json_string_value(json_array_get(pattern, 0)), "layers")))
        return err_set("%s: \"layers_pattern\" must be \"layers\" (model.layers.L), or null", path);
    if (!layers || json_is_null(layers) || (json_is_array(layers) && json_array_size(layers) == 0)) return 0;
    json_t *one = json_is_array(layers) ? NULL : layers;
    for (size_t i = 0; i < (one ? 1 : json_array_size(layers)); i++) {
        json_t *layer = one ? one : json_array_get(layers, i);
        if (!json_is_integer(layer) || json_integer_value(layer) < 0 || json_integer_value(layer) >= LORA_MAX_LAYERS)
            return err_set("%s: \"layers_to_transform\" must be a layer index (0 to %d) or a list of them", path,
                           LORA_MAX_LAYERS - 1);
        lora_select_layer(lora, (int)json_integer_value(layer));
    }
    return 0;
}

static int read_adapter_config(const char *dir, AdapterConfig *out) {
    memset(out, 0, sizeof *out);
    char *path = fs_join(dir, "adapter_config.json");
    json_error_t error;
    json_t *config = fs_is_file(path) ? json_load_file(path, JSON_REJECT_DUPLICATES, &error) : NULL;
    if (!config) {
        int rc = fs_is_file(path) ? err_set("%s:%d: %s", path, error.line, error.text)
                                  : err_set("no LoRA adapter in %s (adapter_config.json not found)", dir);
        free(path);
        return rc;
    }
    json_t *rank = json_object_get(config, "r"), *alpha = json_object_get(config, "lora_alpha");
    json_t *modules = json_object_get(config, "target_modules"), *saved = json_object_get(config, "modules_to_save");
    json_t *fingerprint = json_object_get(config, "marlhf_base_fingerprint");
    json_t *dropout = json_object_get(config, "lora_dropout"); // PEFT writes it; null or absent means 0
    json_t *base_quantize = json_object_get(config, "marlhf_base_quantize");
    snprintf(out->base_quantize, sizeof out->base_quantize, "none");
    int rc = 0;
    if (base_quantize && (!json_is_string(base_quantize) ||
                          (quantize_type_check(json_string_value(base_quantize), "marlhf_base_quantize") != 0 &&
                           strcmp(json_string_value(base_quantize), "fp4") &&
                           strcmp(json_string_value(base_quantize), "fp4-single"))))
        rc = err_set("%s: \"marlhf_base_quantize\" must be one of %s, or fp4 / fp4-single (a bitsandbytes FP4 base)",
                     path, QUANTIZE_TYPES);
    else if (!json_is_string(json_object_get(config, "peft_type")) ||
        strcmp(json_string_value(json_object_get(config, "peft_type")), "LORA"))
        rc = err_set("%s: not a LoRA adapter (\"peft_type\" is not \"LORA\")", path);
    else if (!json_is_integer(rank) || json_integer_value(rank) < 1 || json_integer_value(rank) > 4096 ||
             !json_is_number(alpha) || !(json_number_value(alpha) > 0))
        rc = err_set("%s: needs \"r\" (1 to 4096) and a positive \"lora_alpha\"", path);
    else if (read_patterns(config, "rank_pattern", path, out->lora.rank_pattern, &out->lora.rank_patterns) != 0 ||
             read_patterns(config, "alpha_pattern", path, out->lora.alpha_pattern, &out->lora.alpha_patterns) != 0)
        rc = -1;
    else if (read_layers(config, path, &out->lora) != 0)
        rc = -1;
    else if (json_object_get(config, "use_dora") && !json_is_boolean(json_object_get(config, "use_dora")))
        rc = err_set("%s: \"use_dora\" must be true or false", path);
    else if (dropout && !json_is_null(dropout) &&
             !(json_is_number(dropout) && json_number_value(dropout) >= 0 && json_number_value(dropout) < 1))
        rc = err_set("%s: \"lora_dropout\" must be a number in [0, 1)", path);
    else if (json_object_get(config, "use_rslora") && !json_is_boolean(json_object_get(config, "use_rslora")))
        rc = err_set("%s: \"use_rslora\" must be true or false", path);
    else if (json_is_string(modules) && !strcmp(json_string_value(modules), "all-linear"))
        out->lora.targets = (1u << LORA_TARGETS) - 1;
    else if (json_is_string(modules)) { // PEFT's regex form: re.fullmatch on each module's name
        if (strlen(json_string_value(modules)) >= sizeof out->lora.target_regex)
            rc = err_set("%s: the \"target_modules\" regex is longer than %zu characters", path,
                         sizeof out->lora.target_regex - 1);
        else {
            snprintf(out->lora.target_regex, sizeof out->lora.target_regex, "%s", json_string_value(modules));
            out->lora.targets = (1u << LORA_TARGETS) - 1;
        }
    } else if (!json_is_array(modules))
        rc = err_set("%s: \"target_modules\" must be a list of module names or a regex", path);
    size_t i;
    json_t *module;
    if (rc == 0 && json_is_array(modules))
        json_array_foreach(modules, i, module) {
            int found = -1;
            for (int t = 0; t < LORA_TARGETS; t++)
                if (json_is_string(module) && !strcmp(json_string_value(module), target_names[t])) found = t;
            if (found < 0) {
                rc = err_set("%s: target module %s is not one marlhf adapts (q_proj, k_proj, v_proj, o_proj, "
                             "gate_proj, up_proj, down_proj)", path, json_is_string(module) ? json_string_value(module) : "?");
                break;
            }
            out->lora.targets |= 1u << found;
        }
    if (rc == 0 && !out->lora.targets) rc = err_set("%s: \"target_modules\" is empty", path);
    if (rc == 0 && lora_check_patterns(&out->lora) != 0) rc = err_set("%s: %s", path, err_msg());
    if (rc == 0) {
        out->lora.rank = (int)json_integer_value(rank);
        out->lora.alpha = (float)json_number_value(alpha);
        out->lora.rslora = json_is_true(json_object_get(config, "use_rslora"));
        out->lora.dora = json_is_true(json_object_get(config, "use_dora"));
        if (json_is_number(dropout)) out->lora.dropout = json_number_value(dropout);
        if (json_is_array(saved))
            json_array_foreach(saved, i, module) out->value_head |= json_is_string(module) && !strcmp(json_string_value(module), "score");
        if (base_quantize) snprintf(out->base_quantize, sizeof out->base_quantize, "%s", json_string_value(base_quantize));
        if (json_is_string(fingerprint)) {
            out->has_fingerprint = true;
            snprintf(out->fingerprint, sizeof out->fingerprint, "%s", json_string_value(fingerprint));
        }
    }
    json_decref(config);
    free(path);
    return rc;
}

// Checks that the adapter in `dir` fits this model's adapters and base weights.
static int check_adapter_config(const Model *model, const char *dir) {
    AdapterConfig config;
    if (read_adapter_config(dir, &config) != 0) return -1;
    char want[32];
    snprintf(want, sizeof want, "%016llx", model->lora_base_fingerprint);
    if (config.lora.rank != model->lora.rank || config.lora.alpha != model->lora.alpha ||
        (config.lora.target_regex[0] ? !lora_selection_equal(&config.lora, &model->lora)
                                     : config.lora.targets != model->lora.targets || !lora_selection_equal(&config.lora, &model->lora)) ||
        config.lora.rslora != model->lora.rslora ||
        config.lora.dora != model->lora.dora || !lora_patterns_equal(&config.lora, &model->lora))
        return err_set("%s/adapter_config.json: adapter of rank %d, alpha %g%s%s does not match this run's LoRA options "
                       "(rank %d, alpha %g%s%s) or modules or per-module ranks and alphas", dir, config.lora.rank, config.lora.alpha,
                       config.lora.rslora ? ", rsLoRA" : "", config.lora.dora ? ", DoRA" : "", model->lora.rank,
                       model->lora.alpha, model->lora.rslora ? ", rsLoRA" : "", model->lora.dora ? ", DoRA" : "");
    // PEFT's own files carry no fingerprint; marlhf's must match the base in memory.
    if (config.has_fingerprint && strcmp(config.fingerprint, want) &&
        strcmp(config.base_quantize, model_quantize_name(model)))
        return err_set("%s/adapter_config.json: the adapters were trained on a base quantized as %s, and this run's "
                       "base is %s (--quantize %s)", dir, config.base_quantize, model_quantize_name(model),
                       config.base_quantize);
    if (config.has_fingerprint && strcmp(config.fingerprint, want))
        return err_set("%s/adapter_config.json: the adapters were trained on other base weights than the model this "
                       "run loaded", dir);
    return 0;
}

int lora_read_adapter_base_quantize(const char *model_dir, char quantize[16]) {
    char *dir = adapter_dir(model_dir);
    AdapterConfig config;
    int rc = read_adapter_config(dir, &config);
    free(dir);
    if (rc == 0) snprintf(quantize, 16, "%s", config.base_quantize);
    return rc;
}

int lora_read_adapter_config(const char *model_dir, LoraConfig *lora) {
    char *dir = adapter_dir(model_dir);
    AdapterConfig config;
    int rc = read_adapter_config(dir, &config);
    free(dir);
    if (rc == 0) *lora = config.lora;
    return rc;
}

int model_add_lora_of_adapter(Model *model, const char *model_dir, bool train_value_head, uint64_t seed) {
    LoraConfig lora;
    if (lora_read_adapter_config(model_dir, &lora) != 0) return -1;
    return model_add_lora(model, &lora, train_value_head, seed);
}

int model_load_lora_adapter(Model *model, const char *model_dir, bool train_value_head, uint64_t seed) {
    if (model_add_lora_of_adapter(model, model_dir, train_value_head, seed) != 0) return -1;
    return lora_read_adapter(model, model_dir);
}

int lora_read_adapter(Model *model, const char *model_dir) {
    CHECK(model->lora.rank > 0, "lora_read_adapter on a model without adapters");
    char *dir = adapter_dir(model_dir);
    if (check_adapter_config(model, dir) != 0) {
        free(dir);
        return -1;
    }
    char *path = fs_join(dir, "adapter_model.safetensors");
    SafetensorsSet *set = NULL;
    int rc = safetensors_open(path, &set);
    const long count = model_trainable_floats(model);
    float *host = rc == 0 ? xcalloc((size_t)count, sizeof(float)) : NULL;
    for (int i = 0; rc == 0 && i < model->table.count; i++) {
        const ParamEntry *e = &model->table.entries[i];
        if (e->offset < model->trainable_offset) continue;
        char name[sizeof e->name + sizeof peft_prefix];
        snprintf(name, sizeof name, "%s%s", peft_prefix, e->name);
        long long dims[2] = {e->shape[0], e->shape[1]};
        rc = safetensors_load_f32(set, name, e->ndim, dims, host + (e->offset - model->trainable_offset));
    }
    if (rc == 0)
        model->ops->copy_to_device(model_trainable_params(model), host, (size_t)count * sizeof(float));
    safetensors_close(set);
    free(host);
    free(path);
    free(dir);
    return rc;
}
