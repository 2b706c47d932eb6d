#include "model/bnb_checkpoint.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/check.h"
#include "model/quantize.h"
#include "ops/nf4.h"

const char *bnb_quantize_name(const ModelConfig *cfg) {
    if (cfg->bnb_bits != 4) return NULL;
    if (cfg->bnb_fp4) return cfg->bnb_double_quant ? "fp4" : "fp4-single";
    return cfg->bnb_double_quant ? "nf4" : "nf4-single";
}

int bnb_resolve_quantize(const ModelConfig *cfg, const char *source, const char *asked, const char *option,
                         const char **resolved) {
    const char *own = bnb_quantize_name(cfg);
    *resolved = asked;
    if (!own) return 0;
    if (quantize_requested(asked) && strcmp(asked, own))
        return err_set("%s is a bitsandbytes %s checkpoint, run with its own 4-bit weights: %s %s would quantize "
                       "them a second time (leave %s out, or give %s)",
                       source, own, option, asked, option, own);
    *resolved = own;
    return 0;
}

int bnb_check_rows(const Model *model, const char *path) {
    if (model->config.bnb_bits != 4) return 0;
    for (int i = 0; i < model_base_entries(model); i++) {
        const ParamEntry *e = &model->table.entries[i];
        if (e->layer >= 0 && e->ndim == 2 && e->shape[1] % NF4_BLOCK)
            return err_set("bitsandbytes tensor '%s' has rows of %lld values: its blocks of %d span rows, which "
                           "marlhf's kernels do not read (%s)", e->name, (long long)e->shape[1], NF4_BLOCK, path);
    }
    return 0;
}

// "NAME.suffix" of the file, or NULL.
static const SafetensorsTensor *part(const SafetensorsSet *set, const char *name, const char *suffix) {
    char key[1024];
    snprintf(key, sizeof key, "%s%s", name, suffix);
    return safetensors_find(set, key);
}

// Reads "NAME.suffix" (required) as `count` floats; its dtype must be F32.
static int read_part_f32(const SafetensorsSet *set, const char *path, const char *name, const char *suffix,
                         long count, float *dst) {
    const SafetensorsTensor *t = part(set, name, suffix);
    if (!t) return err_set("bitsandbytes tensor '%s' has no '%s%s' (%s)", name, name, suffix, path);
    if (t->dtype != SAFETENSORS_F32 || t->count != count)
        return err_set("bitsandbytes tensor '%s%s' must be F32 with %ld values, not %s with %lld (%s)", name, suffix,
                       count, safetensors_dtype_name(t->dtype), t->count, path);
    return safetensors_read_f32(t, dst, count);
}

// The file's code book (16 floats) or nested map (256) must be bitsandbytes' bit for bit.
static int check_table(const SafetensorsSet *set, const char *path, const char *name, const char *suffix,
                       const float *expected, long count, const char *what) {
    float table[256];
    if (read_part_f32(set, path, name, suffix, count, table) != 0) return -1;
    if (memcmp(table, expected, (size_t)count * sizeof(float)))
        return err_set("bitsandbytes tensor '%s%s' is not bitsandbytes' %s table (%s)", name, suffix, what, path);
    return 0;
}

// The JSON object of NAME.quant_state.bitsandbytes__TYPE: its fields checked against what the
// model expects; *offset set from nested_offset with double quantization.
static int read_quant_state(const SafetensorsTensor *t, const char *path, const char *name, const char *type,
                            long rows, long cols, bool double_quant, float *offset) {
    json_error_t error;
    json_t *state = t->dtype == SAFETENSORS_U8 ? json_loadb(t->data, t->nbytes, JSON_REJECT_DUPLICATES, &error) : NULL;
    int rc = 0;
    if (!json_is_object(state)) {
        rc = err_set("bitsandbytes tensor '%s': its quant_state is not a JSON object in U8 bytes (%s)", name, path);
        json_decref(state);
        return rc;
    }
    json_t *quant_type = json_object_get(state, "quant_type"), *blocksize = json_object_get(state, "blocksize");
    json_t *shape = json_object_get(state, "shape");
    json_t *nested_blocksize = json_object_get(state, "nested_blocksize"), *nested_offset = json_object_get(state, "nested_offset");
    if (!json_is_string(quant_type) || strcmp(json_string_value(quant_type), type))
        rc = err_set("bitsandbytes tensor '%s': quant_state's quant_type is not \"%s\" (%s)", name, type, path);
    else if (!json_is_integer(blocksize))
        rc = err_set("bitsandbytes tensor '%s': quant_state has no integer blocksize (%s)", name, path);
    else if (json_integer_value(blocksize) != NF4_BLOCK)
        rc = err_set("bitsandbytes tensor '%s' has blocks of %lld values; marlhf reads blocks of %d only (its rows "
                     "are whole blocks) (%s)", name, (long long)json_integer_value(blocksize), NF4_BLOCK, path);
    else if (!json_is_array(shape) || json_array_size(shape) != 2 || !json_is_integer(json_array_get(shape, 0)) ||
             !json_is_integer(json_array_get(shape, 1)) || json_integer_value(json_array_get(shape, 0)) != rows ||
             json_integer_value(json_array_get(shape, 1)) != cols)
        rc = err_set("bitsandbytes tensor '%s': quant_state's shape is not [%ld, %ld] (%s)", name, rows, cols, path);
    else if (cols % NF4_BLOCK)
        rc = err_set("bitsandbytes tensor '%s' has rows of %ld values: its blocks of %d span rows, which marlhf's "
                     "kernels do not read (%s)", name, cols, NF4_BLOCK, path);
    else if (double_quant != (nested_offset != NULL))
        rc = err_set("bitsandbytes tensor '%s': config.json says bnb_4bit_use_double_quant %s, its quant_state %s "
                     "nested_offset (%s)", name, double_quant ? "true" : "false", nested_offset ? "has" : "has no", path);
    else if (double_quant && (!json_is_integer(nested_blocksize) || json_integer_value(nested_blocksize) != NF4_SCALE_BLOCK))
        rc = err_set("bitsandbytes tensor '%s': quant_state's nested_blocksize must be %d (%s)", name, NF4_SCALE_BLOCK,
                     path);
    else if (double_quant && !json_is_number(nested_offset))
        rc = err_set("bitsandbytes tensor '%s': quant_state's nested_offset is not a number (%s)", name, path);
    else if (double_quant)
        *offset = (float)json_number_value(nested_offset); // a float32 printed by Python: exact
    json_decref(state);
    return rc;
}

int bnb_read_4bit(const SafetensorsSet *set, const char *path, const char *name, long rows, long cols, bool fp4,
                  bool double_quant, Q8Matrix *matrix, void *(*alloc)(size_t)) {
    const char *type = fp4 ? "fp4" : "nf4";
    const SafetensorsTensor *codes = safetensors_find(set, name);
    const SafetensorsTensor *state = part(set, name, fp4 ? ".quant_state.bitsandbytes__fp4" : ".quant_state.bitsandbytes__nf4");
    const SafetensorsTensor *other = part(set, name, fp4 ? ".quant_state.bitsandbytes__nf4" : ".quant_state.bitsandbytes__fp4");
    if (!codes) return err_set("bitsandbytes checkpoint has no tensor '%s' (%s)", name, path);
    if (!state && !other && codes->dtype != SAFETENSORS_U8) return 0; // left in floats by bitsandbytes
    if (other) return err_set("bitsandbytes tensor '%s' is %s, config.json says %s (%s)", name, fp4 ? "nf4" : "fp4", type, path);
    if (!state) return err_set("bitsandbytes tensor '%s' has no '%s.quant_state.bitsandbytes__%s' (%s)", name, name, type, path);
    float offset = 0.0f;
    if (read_quant_state(state, path, name, type, rows, cols, double_quant, &offset) != 0) return -1;
    const long n = rows * cols, blocks = n / NF4_BLOCK, blocks2 = (blocks + NF4_SCALE_BLOCK - 1) / NF4_SCALE_BLOCK;
    if (codes->dtype != SAFETENSORS_U8 || codes->count != n / 2)
        return err_set("bitsandbytes tensor '%s' must be U8 with %ld packed bytes, not %s with %lld (%s)", name, n / 2,
                       safetensors_dtype_name(codes->dtype), codes->count, path);
    if (check_table(set, path, name, ".quant_map", fp4 ? fp4_levels : nf4_levels, 16, type) != 0) return -1;
    const SafetensorsTensor *absmax = part(set, name, ".absmax");
    if (!absmax) return err_set("bitsandbytes tensor '%s' has no '%s.absmax' (%s)", name, name, path);
    if (absmax->dtype != (double_quant ? SAFETENSORS_U8 : SAFETENSORS_F32) || absmax->count != blocks)
        return err_set("bitsandbytes tensor '%s.absmax' must be %s with %ld values, not %s with %lld (%s)", name,
                       double_quant ? "U8" : "F32", blocks, safetensors_dtype_name(absmax->dtype), absmax->count, path);
    float *scale_absmax = NULL;
    if (double_quant) {
        if (check_table(set, path, name, ".nested_quant_map", nf4_dynamic_map(), 256, "dynamic 8-bit") != 0) return -1;
        scale_absmax = xmalloc((size_t)blocks2 * sizeof(float));
        if (read_part_f32(set, path, name, ".nested_absmax", blocks2, scale_absmax) != 0) {
            free(scale_absmax);
            return -1;
        }
    }
    matrix->rows = (int)rows;
    matrix->cols = (int)cols;
    matrix->type = QUANT_NF4;
    matrix->levels = fp4 ? fp4_levels : NULL;
    matrix->nibbles = alloc((size_t)n / 2);
    memcpy(matrix->nibbles, codes->data, (size_t)n / 2);
    if (double_quant) {
        matrix->scales = NULL;
        matrix->scale_absmax = alloc((size_t)blocks2 * sizeof(float));
        memcpy(matrix->scale_absmax, scale_absmax, (size_t)blocks2 * sizeof(float));
        free(scale_absmax);
        matrix->scale_offset = offset;
        matrix->scale_codes = alloc((size_t)blocks);
        memcpy(matrix->scale_codes, absmax->data, (size_t)blocks);
    } else {
        matrix->scales = alloc((size_t)blocks * sizeof(float));
        if (safetensors_read_f32(absmax, matrix->scales, blocks) != 0) return -1;
    }
    return 1;
}

int bnb_read_int8(const SafetensorsSet *set, const char *path, const char *name, long rows, long cols, float *dst) {
    const SafetensorsTensor *weight = safetensors_find(set, name);
    if (!weight) return err_set("bitsandbytes checkpoint has no tensor '%s' (%s)", name, path);
    // X.SCB sits beside X.weight: "model.layers.0.mlp.up_proj.weight" -> "model.layers.0.mlp.up_proj.SCB".
    char module[512];
    const size_t length = strlen(name);
    CHECK(length > 7 && length < sizeof module && !strcmp(name + length - 7, ".weight"), "not a weight: %s", name);
    snprintf(module, sizeof module, "%.*s", (int)(length - 7), name);
    const SafetensorsTensor *scb = part(set, module, ".SCB");
    if (weight->dtype != SAFETENSORS_I8 && !scb) return 0; // left in floats by bitsandbytes
    if (!scb) return err_set("bitsandbytes tensor '%s' has no '%s.SCB' (%s)", name, module, path);
    const long long dims[2] = {rows, cols};
    if (weight->dtype != SAFETENSORS_I8)
        return err_set("bitsandbytes tensor '%s' must be I8, not %s (%s)", name, safetensors_dtype_name(weight->dtype), path);
    if (safetensors_check_shape(weight, 2, dims) != 0) return -1;
    const SafetensorsTensor *format = part(set, name, "_format");
    if (format) {
        int64_t value = -1;
        if (format->count != 1 || safetensors_read_i64(format, &value, 1) != 0 || value != 0)
            return err_set("bitsandbytes tensor '%s_format' must be 0 (row-major, what bitsandbytes saves) (%s)", name, path);
    }
    float *scales = xmalloc((size_t)rows * sizeof(float));
    int rc = read_part_f32(set, path, module, ".SCB", rows, scales);
    const int8_t *values = weight->data;
    // bitsandbytes' int8_vectorwise_dequant: A * SCB (float) * 7.874015718698502e-3 (float32).
    const float reciprocal = (float)7.874015718698502e-3;
    for (long r = 0; rc == 0 && r < rows; r++)
        for (long c = 0; c < cols; c++) dst[r * cols + c] = (float)values[r * cols + c] * scales[r] * reciprocal;
    free(scales);
    return rc == 0 ? 1 : -1;
}
