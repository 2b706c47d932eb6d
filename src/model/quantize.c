#include "model/quantize.h"

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "core/bf16.h"
#include "core/check.h"
#include "core/hash.h"
#include "io/gguf.h"
#include "io/gguf_quantize.h"
#include "model/weights_io.h"
#include "ops/kquant.h"
#include "ops/nf4.h"
#include "ops/q4.h"
#include "ops/q8.h"

// Every name --quantize (and each option or field that names a quantization) takes but "none":
// the type of the linear layers' matrices and, for llama.cpp's mixes, the GGUF output type whose
// per-tensor rule picks each matrix's type (-1: every matrix `type`, the table and head Q8_0 but
// under bf16). NF4's two names differ in double_quant; a bitsandbytes FP4 checkpoint's "fp4" and
// "fp4-single" are not here (quantized_begin).
static const struct {
    const char *name;
    QuantType type;
    int gguf_mix;
} quantizations[] = {
    {"q8_0", QUANT_Q8_0, -1},
    {"q4_0", QUANT_Q4_0, -1},
    {"nf4", QUANT_NF4, -1},
    {"nf4-single", QUANT_NF4, -1},
    {"q4_k_m", QUANT_Q4_K, GGUF_OUT_Q4_K_M},
    {"q5_k_m", QUANT_Q5_K, GGUF_OUT_Q5_K_M},
    {"q3_k_m", QUANT_Q3_K, GGUF_OUT_Q3_K_M},
    {"q2_k", QUANT_Q2_K, GGUF_OUT_Q2_K},
    {"iq4_nl", QUANT_IQ4_NL, GGUF_OUT_IQ4_NL},
    {"iq4_xs", QUANT_IQ4_NL, GGUF_OUT_IQ4_XS}, // IQ4_XS's sub-blocks held as IQ4_NL's (quantize_q4_k_m.c)
    {"q4_1", QUANT_Q4_1, -1},
    {"q5_1", QUANT_Q5_1, -1},
    {"bf16", QUANT_BF16, -1},
};
enum { QUANTIZATIONS = sizeof quantizations / sizeof quantizations[0] };

static int quantization_index(const char *name) {
    for (int i = 0; i < QUANTIZATIONS; i++)
        if (strcmp(name, quantizations[i].name) == 0) return i;
    return -1;
}

int quantize_type_check(const char *type, const char *option) {
    if (strcmp(type, "none") == 0 || quantization_index(type) >= 0) return 0;
    return err_set("unknown quantization '%s' (%s): %s", type, option, QUANTIZE_TYPES);
}

bool quantize_requested(const char *type) { return type && strcmp(type, "none") != 0; }

const char *quantize_default(const char *asked, const char *model_path) {
    if (asked) return asked;
    if (!model_path || !path_is_gguf(model_path)) return "none";
    GgufFile file;
    if (gguf_open(&file, model_path) != 0) { // the load reports the file's fault
        err_clear();
        return "none";
    }
    bool kquant = false;
    for (uint64_t i = 0; i < file.n_tensors && !kquant; i++)
        kquant = file.tensors[i].type == GGML_TYPE_Q4_K || file.tensors[i].type == GGML_TYPE_Q5_K ||
                 file.tensors[i].type == GGML_TYPE_Q6_K || file.tensors[i].type == GGML_TYPE_Q3_K ||
                 file.tensors[i].type == GGML_TYPE_Q2_K || file.tensors[i].type == GGML_TYPE_IQ4_NL ||
                 file.tensors[i].type == GGML_TYPE_IQ4_XS;
    // The mix the file says it is (llama_ftype: 10 Q2_K, 12 Q3_K_M, 15 Q4_K_M, 17 Q5_K_M,
    // 25 IQ4_NL, 30 IQ4_XS), so the model's name is the file's; any other, or none: q4_k_m.
    uint32_t file_type = 0;
    if (kquant && gguf_get_u32(&file, "general.file_type", &file_type) != 0) err_clear();
    gguf_close(&file);
    if (!kquant) return "none";
    switch (file_type) {
    case 10: return "q2_k";
    case 12: return "q3_k_m";
    case 17: return "q5_k_m";
    case 25: return "iq4_nl";
    case 30: return "iq4_xs";
    default: return "q4_k_m";
    }
}

int quantized_begin(Model *model, const char *type) {
    const ModelConfig *cfg = &model->config;
    // FP4 is only what a bitsandbytes FP4 checkpoint runs with (its own codes): marlhf does not
    // quantize to it.
    const bool fp4 = !strncmp(type, "fp4", 3);
    if (fp4 && !(cfg->bnb_bits == 4 && cfg->bnb_fp4 && (!strcmp(type, "fp4") || !strcmp(type, "fp4-single"))))
        return err_set("quantization '%s' is only that of a bitsandbytes FP4 checkpoint: %s", type, QUANTIZE_TYPES);
    const int index = fp4 ? -1 : quantization_index(type);
    if (!fp4 && quantize_type_check(type, "--quantize") != 0) return -1;
    CHECK(fp4 || index >= 0, "quantized_begin: '%s' is no quantization", type); // "none": the callers quantize nothing
    const bool nf4 = fp4 || quantizations[index].type == QUANT_NF4;
    const QuantType quant_type = fp4 ? QUANT_NF4 : quantizations[index].type;
    if (!model->ops->matmul_forward_q8 || !model->ops->embedding_forward_q8)
        return err_set("quantized weights (%s): the %s backend has no quantized products", type, model->ops->name);
    if (model->grads) return err_set("quantized weights (%s) go on a model before it trains", type);
    if (model->quantized) return err_set("the model is already quantized");
    const int C = cfg->hidden_size, I = cfg->intermediate_size;
    const int q_dim = cfg->num_heads * cfg->head_dim;
    // NF4's blocks of 64 go along a row (bitsandbytes' blocks run over the flattened matrix:
    // with rows a multiple of 64 long they are the same blocks).
    // The mixes: a matrix whose rows are not whole super-blocks of 256 falls back (Q5_0, Q8_0...).
    const int block = nf4 ? NF4_BLOCK : Q8_BLOCK;
    if (C % block || I % block || q_dim % block)
        return err_set("quantized weights (%s) need the model's hidden, intermediate and attention sizes to be "
                       "multiples of %d (they are %d, %d, %d)", type, block, C, I, q_dim);
    model->quantized = xcalloc(1, sizeof *model->quantized);
    if (model->ops == &ops_cpu) quantized_small_pages(model->params, model->table.total);
    model->quantized->type = quant_type;
    model->quantized->source_type = -1;
    model->quantized->double_quant = strcmp(type, "nf4") == 0 || strcmp(type, "fp4") == 0;
    model->quantized->fp4 = fp4;
    model->quantized->gguf_mix = fp4 ? -1 : quantizations[index].gguf_mix;
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

void quantized_small_pages(float *params, long count) {
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t first = ((uintptr_t)params + page - 1) / page * page;
    uintptr_t end = ((uintptr_t)(params + count)) / page * page;
    if (end > first) madvise((void *)first, end - first, MADV_NOHUGEPAGE);
}

enum { MATRIX_ARRAYS = 6 };

// The byte sizes of a matrix's arrays (values, nibbles or K-quant super-blocks; scales; scale
// codes; scale absmax values; Q5_0's and Q5_1's fifth bits; Q4_1's and Q5_1's minimums), 0 for
// those it does not have.
static void matrix_array_bytes(const Q8Matrix *m, size_t bytes[MATRIX_ARRAYS]) {
    const size_t n = (size_t)m->rows * (size_t)m->cols;
    const size_t blocks = n / (m->type == QUANT_NF4 ? NF4_BLOCK : Q8_BLOCK);
    bytes[0] = quant_is_kquant(m->type) ? (size_t)m->rows * (size_t)kquant_row_bytes(m->type, m->cols)
               : m->type == QUANT_Q8_0  ? n
               : m->type == QUANT_BF16  ? n * sizeof(uint16_t)
                                        : n / 2;
    bytes[1] = m->scales ? blocks * sizeof(float) : 0;
    bytes[2] = m->scale_codes ? blocks : 0;
    bytes[3] = m->scale_absmax ? (blocks + NF4_SCALE_BLOCK - 1) / NF4_SCALE_BLOCK * sizeof(float) : 0;
    bytes[4] = m->high_bits ? blocks * sizeof(uint32_t) : 0;
    bytes[5] = m->mins ? blocks * sizeof(float) : 0;
}

static void matrix_arrays(Q8Matrix *m, void **arrays[MATRIX_ARRAYS]) {
    arrays[0] = (void **)&m->values, arrays[1] = (void **)&m->scales;
    arrays[2] = (void **)&m->scale_codes, arrays[3] = (void **)&m->scale_absmax;
    arrays[4] = (void **)&m->high_bits, arrays[5] = (void **)&m->mins;
}

void quantized_to_backend(const OpsBackend *ops, Q8Matrix *matrix) {
    if (ops == &ops_cpu) return;
    size_t bytes[MATRIX_ARRAYS];
    void **arrays[MATRIX_ARRAYS];
    matrix_array_bytes(matrix, bytes);
    matrix_arrays(matrix, arrays);
    for (int i = 0; i < MATRIX_ARRAYS; i++) {
        if (!*arrays[i]) continue;
        void *device = ops->alloc(bytes[i]);
        ops->copy_to_device(device, *arrays[i], bytes[i]);
        ops_cpu.free(*arrays[i]);
        *arrays[i] = device;
    }
}

// A copy of a matrix of the model's backend in host memory (ops_cpu's), for the host code
// that reads one (saving, the base fingerprint); free_matrix(&ops_cpu, ...) releases it.
static Q8Matrix host_copy(const OpsBackend *ops, const Q8Matrix *matrix) {
    Q8Matrix copy = *matrix;
    size_t bytes[MATRIX_ARRAYS];
    void **arrays[MATRIX_ARRAYS];
    matrix_array_bytes(matrix, bytes);
    matrix_arrays(&copy, arrays);
    for (int i = 0; i < MATRIX_ARRAYS; i++) {
        if (!*arrays[i]) continue;
        void *host = ops_cpu.alloc(bytes[i]);
        ops->copy_to_host(host, *arrays[i], bytes[i]);
        *arrays[i] = host;
    }
    return copy;
}

// Quantizes in host memory, then moves the blocks to the backend's (quantized_to_backend).
void quantize_matrix(const OpsBackend *ops, Q8Matrix *matrix, QuantType type, bool double_quant, const float *weight,
                     long rows, long cols) {
    if (type == QUANT_NF4) {
        nf4_quantize_matrix(matrix, weight, rows, cols, double_quant, ops_cpu.alloc);
        quantized_to_backend(ops, matrix);
        return;
    }
    if (type == QUANT_Q4_1 || type == QUANT_Q5_1) { // the GGUF writer's blocks, split as a file's are
        const GgmlType file_type = type == QUANT_Q4_1 ? GGML_TYPE_Q4_1 : GGML_TYPE_Q5_1;
        uint8_t *blocks = xmalloc(gguf_quantized_size(file_type, rows * cols));
        gguf_quantize(file_type, weight, blocks, rows * cols);
        quantized_hold_gguf_blocks(ops, matrix, file_type, blocks, rows, cols);
        free(blocks);
        return;
    }
    if (type == QUANT_BF16) {
        *matrix = (Q8Matrix){.rows = (int)rows, .cols = (int)cols, .type = QUANT_BF16};
        matrix->bf16 = ops_cpu.alloc((size_t)(rows * cols) * sizeof(uint16_t));
        bf16_round_row(weight, rows * cols, matrix->bf16);
        quantized_to_backend(ops, matrix);
        return;
    }
    matrix->rows = (int)rows;
    matrix->cols = (int)cols;
    matrix->type = type;
    matrix->values = ops_cpu.alloc((size_t)(type == QUANT_Q4_0 ? rows * cols / 2 : rows * cols));
    matrix->scales = ops_cpu.alloc((size_t)(rows * (cols / Q8_BLOCK)) * sizeof(float));
    // One thread (about 60 ms for SmolLM2): an OpenMP team started here, on the loading
    // thread, would make libgomp count more threads than cores once `serve` runs its own
    // team on its generation thread, and its workers would then sleep between regions
    // instead of spinning (measured: serve at half speed).
    for (long r = 0; r < rows; r++) {
        float *scales = matrix->scales + r * (cols / Q8_BLOCK);
        if (type == QUANT_Q4_0) q4_quantize_row(weight + r * cols, cols, matrix->nibbles + r * cols / 2, scales);
        else q8_quantize_row(weight + r * cols, cols, matrix->values + r * cols, scales);
    }
    quantized_to_backend(ops, matrix);
}

// The quantized copy a table entry goes to, or NULL if the entry stays float32.
static Q8Matrix *matrix_for(const Model *model, const ParamEntry *entry) {
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

Q8Matrix *quantized_slot(const Model *model, const ParamEntry *entry) {
    return model->quantized ? matrix_for(model, entry) : NULL;
}

void model_dequantize(Model *model) {
    if (!model->quantized) return;
    CHECK(model->ops == &ops_cpu, "model_dequantize runs on the CPU");
    model_dequantize_into(model, model->params);
    model_quantized_free(model);
}

// A tied LM head reads the embedding table: the head shares its quantized arrays. (The table
// says whether the head is tied: the weight views may not be bound yet, model_load off the CPU.)
void quantized_share_tied_head(Model *model, const Q8Matrix *matrix) {
    ModelQuantized *quantized = model->quantized;
    if (matrix == &quantized->embedding && model->has_lm_head && !param_table_find(&model->table, "lm_head.weight")) {
        quantized->lm_head = quantized->embedding;
        quantized->head_is_embedding = true;
    }
}

void quantized_take(Model *model, const ParamEntry *entry, float *weight) {
    Q8Matrix *matrix = matrix_for(model, entry);
    if (!matrix) return;
    // The token table and the LM head stay Q8_0 under q4_0 and nf4, as llama.cpp keeps its
    // output tensor above 4 bits in a Q4_0 model (and bitsandbytes' Linear4bit leaves the
    // embedding and lm_head of a QLoRA model unquantized): on SmolLM2 (tied) a 4-bit head
    // costs most of the accuracy (docs/quantization.md). Under bf16 they are bf16 too, as in a
    // Hugging Face model loaded in bf16.
    ModelQuantized *q = model->quantized;
    if (q->gguf_mix >= 0) k_mix_take_floats(model, entry, matrix, weight); // model/quantize_q4_k_m.c
    else {
        const bool table_or_head = matrix == &q->embedding || matrix == &q->lm_head;
        const QuantType type = table_or_head && q->type != QUANT_BF16 ? QUANT_Q8_0 : q->type;
        quantize_matrix(model->ops, matrix, type, q->double_quant, weight, entry->shape[0], entry->shape[1]);
    }
    release_pages(weight, entry->numel);
    quantized_share_tied_head(model, matrix);
}

void quantized_unstore(Model *model) {
    if (model->ops == &ops_cpu || !model->quantized) return;
    ParamTable *table = &model->table;
    table->stored_total = 0;
    for (int i = 0; i < table->count; i++) {
        ParamEntry *e = &table->entries[i];
        if (i < model_base_entries(model) && quantized_matrix(model, e)) {
            e->stored = -1;
            continue;
        }
        e->stored = (table->stored_total + 15) / 16 * 16;
        table->stored_total = e->stored + e->numel;
    }
    table->stored_total = (table->stored_total + 15) / 16 * 16;
    model->ops->free(model->params);
    model->params = model->ops->alloc((size_t)table->stored_total * sizeof(float));
    param_views_bind_stored(&model->weights, table, model->params, model->config.num_layers);
}

int model_quantize(Model *model, const char *type) {
    if (!quantize_requested(type)) return 0;
    // A DoRA adapter stays: its row norms ||W + scale B A|| come from the dequantized weights
    // from now on (model/lora.c lora_dora_norms), as over a base quantized before the adapters.
    if (model->lora.dora && !model->ops->dequantize_rows)
        return err_set("--quantize %s: a DoRA adapter over a quantized base needs dequantize_rows, which the %s backend "
                       "lacks", type, model->ops->name);
    if (quantized_begin(model, type) != 0) return -1;
    // Activations reserved for the float model are made again at the next forward, with what a
    // quantized one needs (a DoRA adapter's scratch for the dequantized weight).
    model_release_activations(model);
    if (model->ops == &ops_cpu) {
        for (int i = 0; i < model_base_entries(model); i++)
            quantized_take(model, &model->table.entries[i], model->params + model->table.entries[i].offset);
        return 0;
    }
    // Another backend's weights are quantized from a host copy of the buffer, which is then made
    // again without the quantized weights' float32 slots. The old one goes first, so the float
    // model and the blocks are never in the backend's memory together.
    float *host = xmalloc((size_t)model->table.total * sizeof(float));
    model_params_to_host(model, host, model->table.total);
    model->ops->free(model->params);
    model->params = NULL;
    for (int i = 0; i < model_base_entries(model); i++)
        quantized_take(model, &model->table.entries[i], host + model->table.entries[i].offset);
    quantized_unstore(model);
    model_params_to_device(model, host, model->table.total);
    free(host);
    return 0;
}

const Q8Matrix *quantized_matrix(const Model *model, const ParamEntry *entry) {
    if (!model->quantized) return NULL;
    const Q8Matrix *matrix = matrix_for(model, entry);
    return matrix && matrix->values ? matrix : NULL;
}

const char *model_quantize_name(const Model *model) {
    const ModelQuantized *quantized = model->quantized;
    if (!quantized) return "none";
    if (quantized->type == QUANT_NF4) {
        if (quantized->fp4) return quantized->double_quant ? "fp4" : "fp4-single";
        return quantized->double_quant ? "nf4" : "nf4-single";
    }
    for (int i = 0; i < QUANTIZATIONS; i++)
        if (quantizations[i].type == quantized->type && quantizations[i].gguf_mix == quantized->gguf_mix)
            return quantizations[i].name;
    return "q8_0"; // a bitsandbytes 8-bit checkpoint's Q8_0 (model/bnb_checkpoint.h)
}

static void free_matrix(const OpsBackend *ops, Q8Matrix *matrix);

// The quantized matrices of the base's entries as the host can read them: the model's own
// on the CPU, host copies of another backend's (the tied head's copied once). NULL where an
// entry is not quantized. Release with host_matrices_free.
static Q8Matrix **host_matrices(const Model *model) {
    const int count = model_base_entries(model);
    Q8Matrix **matrices = xcalloc((size_t)count, sizeof *matrices);
    for (int i = 0; i < count; i++) {
        const Q8Matrix *matrix = quantized_matrix(model, &model->table.entries[i]);
        if (!matrix) continue;
        if (model->ops == &ops_cpu) {
            matrices[i] = (Q8Matrix *)matrix;
            continue;
        }
        for (int j = 0; j < i; j++)
            if (matrices[j] && quantized_matrix(model, &model->table.entries[j])->values == matrix->values)
                matrices[i] = matrices[j];
        if (matrices[i]) continue;
        matrices[i] = xmalloc(sizeof **matrices);
        *matrices[i] = host_copy(model->ops, matrix);
    }
    return matrices;
}

static void host_matrices_free(const Model *model, Q8Matrix **matrices) {
    const int count = model_base_entries(model);
    for (int i = 0; model->ops != &ops_cpu && i < count; i++) {
        if (!matrices[i]) continue;
        for (int j = i + 1; j < count; j++)
            if (matrices[j] == matrices[i]) matrices[j] = NULL; // a shared (tied) copy
        free_matrix(&ops_cpu, matrices[i]);
        free(matrices[i]);
    }
    free(matrices);
}

void model_dequantize_into(const Model *model, float *params) {
    Q8Matrix **matrices = host_matrices(model);
    for (int i = 0; i < model_base_entries(model); i++) {
        const ParamEntry *entry = &model->table.entries[i];
        const Q8Matrix *matrix = matrices[i];
        if (matrix) quant_dequantize_rows(matrix, 0, matrix->rows, params + entry->offset);
    }
    host_matrices_free(model, matrices);
}

uint64_t model_base_hash(const Model *model, const float *params, long n) {
    // Chunks of an even length, so hashing them one after another hashes the whole.
    enum { CHUNK = 1 << 20 };
    float *chunk = xmalloc((size_t)CHUNK * sizeof(float));
    float *row = NULL;
    long row_capacity = 0;
    uint64_t hash = HASH_FNV1A_START;
    Q8Matrix **matrices = host_matrices(model);
    for (long start = 0; start < n; start += CHUNK) {
        const long length = n - start < CHUNK ? n - start : CHUNK, end = start + length;
        memcpy(chunk, params + start, (size_t)length * sizeof(float));
        for (int i = 0; i < model_base_entries(model); i++) {
            const ParamEntry *entry = &model->table.entries[i];
            const Q8Matrix *matrix = matrices[i];
            if (!matrix || entry->offset >= end || entry->offset + entry->numel <= start) continue;
            // The entry's rows that overlap the chunk, each dequantized and its overlap copied.
            const long cols = matrix->cols;
            if (cols > row_capacity) {
                row = xrealloc(row, (size_t)cols * sizeof(float));
                row_capacity = cols;
            }
            const long from = start > entry->offset ? start : entry->offset;
            const long to = end < entry->offset + entry->numel ? end : entry->offset + entry->numel;
            for (long r = (from - entry->offset) / cols; r <= (to - 1 - entry->offset) / cols; r++) {
                quant_dequantize_rows(matrix, r, 1, row);
                const long row_start = entry->offset + r * cols;
                const long a = row_start > from ? row_start : from, b = row_start + cols < to ? row_start + cols : to;
                memcpy(chunk + (a - start), row + (a - row_start), (size_t)(b - a) * sizeof(float));
            }
        }
        hash = hash_floats(hash, chunk, length);
    }
    host_matrices_free(model, matrices);
    free(chunk);
    free(row);
    return hash;
}

static void free_matrix(const OpsBackend *ops, Q8Matrix *matrix) {
    if (matrix->values) ops->free(matrix->values);
    if (matrix->high_bits) ops->free(matrix->high_bits);
    if (matrix->mins) ops->free(matrix->mins);
    if (matrix->scales) ops->free(matrix->scales);
    if (matrix->scale_codes) ops->free(matrix->scale_codes);
    if (matrix->scale_absmax) ops->free(matrix->scale_absmax);
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
