#include "model/quantize.h"

#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "core/check.h"
#include "ops/q8.h"

int quantize_type_check(const char *type, const char *option) {
    if (strcmp(type, "none") == 0 || strcmp(type, "q8_0") == 0) return 0;
    return err_set("unknown quantization '%s' (%s): none or q8_0", type, option);
}

bool quantize_requested(const char *type) { return type && strcmp(type, "none") != 0; }

int quantized_begin(Model *model, const char *type) {
    if (quantize_type_check(type, "--quantize") != 0) return -1;
    const ModelConfig *cfg = &model->config;
    if (!model->ops->matmul_forward_q8 || !model->ops->embedding_forward_q8) {
        return err_set("8-bit weights (%s) run on the CPU only (this model is on %s)", type, model->ops->name);
    }
    if (model->grads) return err_set("8-bit weights (%s) are for inference: this model is being trained", type);
    if (model->quantized) return err_set("the model is already quantized");
    const int C = cfg->hidden_size, I = cfg->intermediate_size;
    const int q_dim = cfg->num_heads * cfg->head_dim;
    if (C % Q8_BLOCK || I % Q8_BLOCK || q_dim % Q8_BLOCK)
        return err_set("8-bit weights (%s) need the model's hidden, intermediate and attention sizes to be "
                       "multiples of %d (they are %d, %d, %d)", type, Q8_BLOCK, C, I, q_dim);
    model->quantized = xcalloc(1, sizeof *model->quantized);
    model->quantized->layers = xcalloc(cfg->num_layers, sizeof *model->quantized->layers);
    return 0;
}

// Gives the whole pages inside [start, start + bytes) back to the system: they read as
// zeros afterwards and stop counting as the process's memory. The pages at the two ends,
// shared with neighbouring tensors, stay.
static void release_pages(float *start, long count) {
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t first = ((uintptr_t)start + page - 1) / page * page;
    uintptr_t end = ((uintptr_t)(start + count)) / page * page;
    if (end > first) madvise((void *)first, end - first, MADV_DONTNEED);
}

static void quantize_matrix(const OpsBackend *ops, Q8Matrix *matrix, const float *weight, long rows, long cols) {
    matrix->rows = (int)rows;
    matrix->cols = (int)cols;
    matrix->values = ops->alloc((size_t)(rows * cols));
    matrix->scales = ops->alloc((size_t)(rows * (cols / Q8_BLOCK)) * sizeof(float));
    // One thread (about 60 ms for SmolLM2): an OpenMP team started here, on the loading
    // thread, would make libgomp count more threads than cores once `serve` runs its own
    // team on its generation thread, and its workers would then sleep between regions
    // instead of spinning (measured: serve at half speed).
    for (long r = 0; r < rows; r++)
        q8_quantize_row(weight + r * cols, cols, matrix->values + r * cols, matrix->scales + r * (cols / Q8_BLOCK));
}

// The quantized copy a table entry goes to, or NULL if the entry stays float32.
static Q8Matrix *matrix_for(Model *model, const ParamEntry *entry) {
    ModelQuantized *quantized = model->quantized;
    if (entry->layer >= 0) {
        QuantizedLayer *q = &quantized->layers[entry->layer];
        static const struct {
            size_t view_field, matrix_field;
        } linear[] = {
            {offsetof(LayerTensors, q_w), offsetof(QuantizedLayer, q)},
            {offsetof(LayerTensors, k_w), offsetof(QuantizedLayer, k)},
            {offsetof(LayerTensors, v_w), offsetof(QuantizedLayer, v)},
            {offsetof(LayerTensors, o_w), offsetof(QuantizedLayer, o)},
            {offsetof(LayerTensors, gate_w), offsetof(QuantizedLayer, gate)},
            {offsetof(LayerTensors, up_w), offsetof(QuantizedLayer, up)},
            {offsetof(LayerTensors, down_w), offsetof(QuantizedLayer, down)},
        };
        for (size_t i = 0; i < sizeof linear / sizeof linear[0]; i++)
            if (entry->view_field == linear[i].view_field) return (Q8Matrix *)((char *)q + linear[i].matrix_field);
        return NULL;
    }
    if (entry->view_field == offsetof(ModelTensors, tok_emb)) return &quantized->embedding;
    if (entry->view_field == offsetof(ModelTensors, lm_head) && model->has_lm_head) return &quantized->lm_head;
    return NULL;
}

void quantized_take(Model *model, const ParamEntry *entry) {
    Q8Matrix *matrix = matrix_for(model, entry);
    if (!matrix) return;
    float *weight = model->params + entry->offset;
    quantize_matrix(model->ops, matrix, weight, entry->shape[0], entry->shape[1]);
    release_pages(weight, entry->numel);
    // A tied LM head reads the embedding table: the head shares its quantized arrays.
    ModelQuantized *quantized = model->quantized;
    if (matrix == &quantized->embedding && model->has_lm_head && !model->weights.lm_head) {
        quantized->lm_head = quantized->embedding;
        quantized->head_is_embedding = true;
    }
}

int model_quantize(Model *model, const char *type) {
    if (!quantize_requested(type)) return 0;
    // DoRA's row norms ||W + scale B A|| need the float32 weights the quantization frees.
    if (model->lora.dora)
        return err_set("--quantize %s: a DoRA adapter needs the float32 weights; merge it into the model instead "
                       "(its saved final/ folder)", type);
    if (quantized_begin(model, type) != 0) return -1;
    for (int i = 0; i < model_base_entries(model); i++) quantized_take(model, &model->table.entries[i]);
    return 0;
}

static void free_matrix(const OpsBackend *ops, Q8Matrix *matrix) {
    if (matrix->values) ops->free(matrix->values);
    if (matrix->scales) ops->free(matrix->scales);
    memset(matrix, 0, sizeof *matrix);
}

void model_quantized_free(Model *model) {
    ModelQuantized *quantized = model->quantized;
    if (!quantized) return;
    for (int l = 0; l < model->config.num_layers; l++) {
        QuantizedLayer *q = &quantized->layers[l];
        Q8Matrix *all[] = {&q->q, &q->k, &q->v, &q->o, &q->gate, &q->up, &q->down};
        for (int i = 0; i < 7; i++) free_matrix(model->ops, all[i]);
    }
    if (quantized->head_is_embedding) memset(&quantized->lm_head, 0, sizeof quantized->lm_head);
    free_matrix(model->ops, &quantized->lm_head);
    free_matrix(model->ops, &quantized->embedding);
    free(quantized->layers);
    free(quantized);
    model->quantized = NULL;
}
