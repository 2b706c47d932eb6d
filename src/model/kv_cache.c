// The KV cache's memory. The forward pass that fills and reads it is in transformer.c
// (model_forward_cached), so generation runs the very same layer code as training.
#include <string.h>

#include "core/check.h"
#include "model/model.h"

long kv_cache_slot_bytes(const Model *model, KvCacheType type) {
    const int kv_heads = model->config.num_kv_heads, head_dim = model->config.head_dim;
    switch (type) {
    case KV_CACHE_F16: return (long)kv_heads * head_dim * 2;
    case KV_CACHE_Q8_0: return kv_q8_slot_bytes(kv_heads, head_dim);
    case KV_CACHE_F32: break;
    }
    return (long)kv_heads * head_dim * (long)sizeof(float);
}

// A slot's width in floats, the unit of ops->copy_rows: a slot of halves or a Q8_0 record
// is a whole number of floats (kv_cache_type_set checks a half cache's kv_dim is even;
// kv_q8_slot_bytes is a multiple of 4).
static int slot_floats(const KvCache *cache, const Model *model) {
    return (int)(kv_cache_slot_bytes(model, cache->type) / (long)sizeof(float));
}

void kv_cache_init(KvCache *cache, const Model *model, int B, int T) {
    const ModelConfig *cfg = &model->config;
    memset(cache, 0, sizeof *cache);
    cache->capacity_B = B;
    cache->capacity_T = T;
    cache->type = model->kv_cache_type;
    const size_t bytes = (size_t)B * T * slot_floats(cache, model) * sizeof(float);
    cache->k = xcalloc((size_t)cfg->num_layers, sizeof(void *));
    cache->v = xcalloc((size_t)cfg->num_layers, sizeof(void *));
    for (int l = 0; l < cfg->num_layers; l++) {
        cache->k[l] = model->ops->alloc(bytes);
        cache->v[l] = model->ops->alloc(bytes);
    }
    cache->row_start = xcalloc((size_t)B, sizeof(int));
}

void kv_cache_free(KvCache *cache, const Model *model) {
    for (int l = 0; cache->k && l < model->config.num_layers; l++) {
        model->ops->free(cache->k[l]);
        model->ops->free(cache->v[l]);
    }
    free(cache->k);
    free(cache->v);
    free(cache->row_start);
    memset(cache, 0, sizeof *cache);
}

// Copies `count` slots of one layer's buffer: from slot `from_slot` of row `from` of
// `source` (a buffer of the cache's shape) to slot `to_slot` of row `to` of `target` (rows
// of target_capacity slots).
static void copy_slots(const KvCache *cache, const Model *model, void *target, int target_capacity, int to,
                       int to_slot, const void *source, int from, int from_slot, int count) {
    if (count <= 0) return;
    const int width = slot_floats(cache, model);
    model->ops->copy_rows((float *)target + ((long)to * target_capacity + to_slot) * width, width,
                          (const float *)source + ((long)from * cache->capacity_T + from_slot) * width, width, count,
                          width);
}

// The same slots of every layer's keys and values, within the cache.
static void copy_row_slots(const KvCache *cache, const Model *model, int to, int from, int first_slot, int count) {
    for (int l = 0; l < model->config.num_layers; l++) {
        copy_slots(cache, model, cache->k[l], cache->capacity_T, to, first_slot, cache->k[l], from, first_slot, count);
        copy_slots(cache, model, cache->v[l], cache->capacity_T, to, first_slot, cache->v[l], from, first_slot, count);
    }
}

void kv_cache_expand_rows(KvCache *cache, const Model *model, const int *source, int B) {
    CHECK(B <= cache->capacity_B, "KV cache of %d rows cannot hold %d", cache->capacity_B, B);
    int *row_start = xmalloc((size_t)B * sizeof(int));
    for (int b = B - 1; b >= 0; b--) {
        const int u = source[b];
        CHECK(u >= 0 && u <= b && u < cache->B, "row %d cannot copy row %d of a cache of %d", b, u, cache->B);
        row_start[b] = cache->row_start[u];
        if (u != b) copy_row_slots(cache, model, b, u, 0, cache->length);
    }
    memcpy(cache->row_start, row_start, (size_t)B * sizeof(int));
    free(row_start);
    cache->B = B;
}

void kv_cache_copy_slots(KvCache *to, int to_row, int to_slot, const KvCache *from, int from_row, int from_slot,
                         int count, const Model *model) {
    CHECK(to->type == from->type, "a KV cache of %s and one of %s cannot exchange slots", kv_cache_type_name(to->type),
          kv_cache_type_name(from->type));
    CHECK(to_row < to->capacity_B && from_row < from->capacity_B && to_slot + count <= to->capacity_T &&
              from_slot + count <= from->capacity_T,
          "%d slots do not fit the caches (rows %d, %d; slots %d, %d)", count, to_row, from_row, to_slot, from_slot);
    for (int l = 0; l < model->config.num_layers; l++) {
        copy_slots(from, model, to->k[l], to->capacity_T, to_row, to_slot, from->k[l], from_row, from_slot, count);
        copy_slots(from, model, to->v[l], to->capacity_T, to_row, to_slot, from->v[l], from_row, from_slot, count);
    }
}

void kv_cache_copy_row(KvCache *cache, const Model *model, int to, int from) {
    CHECK(to >= 0 && to < cache->capacity_B && from >= 0 && from < cache->capacity_B,
          "cannot copy row %d to row %d of a cache of %d rows", from, to, cache->capacity_B);
    if (to == from) return;
    const int start = cache->row_start[from];
    cache->row_start[to] = start;
    copy_row_slots(cache, model, to, from, start, cache->length - start);
}

void kv_cache_relayout(KvCache *cache, const Model *model, int capacity_B, int capacity_T, int shift) {
    CHECK(cache->B <= capacity_B, "a KV cache of %d rows cannot hold %d", capacity_B, cache->B);
    CHECK(cache->length + shift >= 0 && cache->length + shift <= capacity_T,
          "a KV cache of %d slots cannot hold %d", capacity_T, cache->length + shift);
    for (int b = 0; b < cache->B; b++)
        CHECK(cache->row_start[b] + shift >= 0, "row %d (from slot %d) cannot move %d slots", b,
              cache->row_start[b], shift);
    const size_t bytes = (size_t)capacity_B * capacity_T * slot_floats(cache, model) * sizeof(float);
    // Into fresh buffers, one at a time: no copy overlaps its source, and the memory in use
    // exceeds the cache by one buffer at most.
    for (int l = 0; l < model->config.num_layers; l++) {
        void **buffers[2] = {&cache->k[l], &cache->v[l]};
        for (int i = 0; i < 2; i++) {
            void *moved = model->ops->alloc(bytes);
            for (int b = 0; b < cache->B; b++) {
                const int start = cache->row_start[b];
                copy_slots(cache, model, moved, capacity_T, b, start + shift, *buffers[i], b, start, cache->length - start);
            }
            model->ops->free(*buffers[i]);
            *buffers[i] = moved;
        }
    }
    if (capacity_B != cache->capacity_B) cache->row_start = xrealloc(cache->row_start, (size_t)capacity_B * sizeof(int));
    for (int b = 0; b < cache->B; b++) cache->row_start[b] += shift;
    cache->length += shift;
    cache->capacity_B = capacity_B;
    cache->capacity_T = capacity_T;
}

const char *kv_cache_type_name(KvCacheType type) {
    switch (type) {
    case KV_CACHE_F16: return "f16";
    case KV_CACHE_Q8_0: return "q8_0";
    case KV_CACHE_F32: break;
    }
    return "f32";
}

int kv_cache_type_set(Model *model, const char *type, const char *option) {
    KvCacheType chosen = KV_CACHE_F32;
    if (type && strcmp(type, "f16") == 0) chosen = KV_CACHE_F16;
    else if (type && strcmp(type, "q8_0") == 0) chosen = KV_CACHE_Q8_0;
    else if (type && strcmp(type, "f32") != 0) return err_set("%s must be f32, f16 or q8_0, got '%s'", option, type);
    if (!model) return 0;
    const OpsBackend *ops = model->ops;
    const int kv_dim = model->config.num_kv_heads * model->config.head_dim;
    if (chosen == KV_CACHE_F16) {
        if (!ops->cache_write_f16 || !ops->attention_decode_f16)
            return err_set("%s f16: the %s backend has no half-float KV cache", option, ops->name);
        if (kv_dim % 2 != 0) return err_set("%s f16 needs an even key width (this model's is %d)", option, kv_dim);
    }
    // Any head_dim: a head whose head_dim is not a multiple of Q8_BLOCK ends in a shorter block.
    if (chosen == KV_CACHE_Q8_0 && (!ops->cache_write_q8 || !ops->attention_decode_q8))
        return err_set("%s q8_0: the %s backend has no 8-bit KV cache", option, ops->name);
    model->kv_cache_type = chosen;
    return 0;
}

bool kv_cache_can_extend(const Model *model) {
    const OpsBackend *ops = model->ops;
    switch (model->kv_cache_type) {
    case KV_CACHE_F16: return ops->attention_extend_f16 != NULL;
    case KV_CACHE_Q8_0: return ops->attention_extend_q8 != NULL;
    case KV_CACHE_F32: break;
    }
    return ops->attention_extend != NULL;
}

void kv_cache_reset(KvCache *cache) {
    cache->length = 0;
    cache->B = 0;
}
