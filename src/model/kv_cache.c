// The KV cache's memory. The forward pass that fills and reads it is in transformer.c
// (model_forward_cached), so generation runs the very same layer code as training.
#include <string.h>

#include "core/check.h"
#include "model/model.h"

void kv_cache_init(KvCache *cache, const Model *model, int B, int T) {
    const ModelConfig *cfg = &model->config;
    memset(cache, 0, sizeof *cache);
    cache->capacity_B = B;
    cache->capacity_T = T;
    const size_t bytes = (size_t)B * T * cfg->num_kv_heads * cfg->head_dim * sizeof(float);
    cache->k = xcalloc((size_t)cfg->num_layers, sizeof(float *));
    cache->v = xcalloc((size_t)cfg->num_layers, sizeof(float *));
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

void kv_cache_expand_rows(KvCache *cache, const Model *model, const int *source, int B) {
    const ModelConfig *cfg = &model->config;
    const int kv_dim = cfg->num_kv_heads * cfg->head_dim;
    const long row_floats = (long)cache->capacity_T * kv_dim;
    CHECK(B <= cache->capacity_B, "KV cache of %d rows cannot hold %d", cache->capacity_B, B);
    int *row_start = xmalloc((size_t)B * sizeof(int));
    for (int b = B - 1; b >= 0; b--) {
        const int u = source[b];
        CHECK(u >= 0 && u <= b && u < cache->B, "row %d cannot copy row %d of a cache of %d", b, u, cache->B);
        row_start[b] = cache->row_start[u];
        if (u == b) continue;
        for (int l = 0; l < cfg->num_layers; l++) {
            model->ops->copy_rows(cache->k[l] + b * row_floats, kv_dim, cache->k[l] + u * row_floats, kv_dim,
                                  cache->length, kv_dim);
            model->ops->copy_rows(cache->v[l] + b * row_floats, kv_dim, cache->v[l] + u * row_floats, kv_dim,
                                  cache->length, kv_dim);
        }
    }
    memcpy(cache->row_start, row_start, (size_t)B * sizeof(int));
    free(row_start);
    cache->B = B;
}

void kv_cache_copy_row(KvCache *cache, const Model *model, int to, int from) {
    const ModelConfig *cfg = &model->config;
    const int kv_dim = cfg->num_kv_heads * cfg->head_dim;
    CHECK(to >= 0 && to < cache->capacity_B && from >= 0 && from < cache->capacity_B,
          "cannot copy row %d to row %d of a cache of %d rows", from, to, cache->capacity_B);
    if (to == from) return;
    const int start = cache->row_start[from];
    cache->row_start[to] = start;
    if (start >= cache->length) return;
    const long row_floats = (long)cache->capacity_T * kv_dim;
    for (int l = 0; l < cfg->num_layers; l++) {
        float *buffers[2] = {cache->k[l], cache->v[l]};
        for (int i = 0; i < 2; i++)
            model->ops->copy_rows(buffers[i] + to * row_floats + (long)start * kv_dim, kv_dim,
                                  buffers[i] + from * row_floats + (long)start * kv_dim, kv_dim,
                                  cache->length - start, kv_dim);
    }
}

void kv_cache_relayout(KvCache *cache, const Model *model, int capacity_B, int capacity_T, int shift) {
    const ModelConfig *cfg = &model->config;
    const int kv_dim = cfg->num_kv_heads * cfg->head_dim;
    CHECK(cache->B <= capacity_B, "a KV cache of %d rows cannot hold %d", capacity_B, cache->B);
    CHECK(cache->length + shift >= 0 && cache->length + shift <= capacity_T,
          "a KV cache of %d slots cannot hold %d", capacity_T, cache->length + shift);
    for (int b = 0; b < cache->B; b++)
        CHECK(cache->row_start[b] + shift >= 0, "row %d (from slot %d) cannot move %d slots", b,
              cache->row_start[b], shift);
    const long old_row_floats = (long)cache->capacity_T * kv_dim, new_row_floats = (long)capacity_T * kv_dim;
    const size_t bytes = (size_t)capacity_B * new_row_floats * sizeof(float);
    // Into fresh buffers, a layer at a time: no copy overlaps its source, and the memory
    // in use exceeds the cache by one layer's buffer at most.
    for (int l = 0; l < cfg->num_layers; l++) {
        float **buffers[2] = {&cache->k[l], &cache->v[l]};
        for (int i = 0; i < 2; i++) {
            float *moved = model->ops->alloc(bytes);
            for (int b = 0; b < cache->B; b++) {
                const int start = cache->row_start[b];
                if (start >= cache->length) continue;
                model->ops->copy_rows(moved + b * new_row_floats + (long)(start + shift) * kv_dim, kv_dim,
                                      *buffers[i] + b * old_row_floats + (long)start * kv_dim, kv_dim,
                                      cache->length - start, kv_dim);
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

void kv_cache_reset(KvCache *cache) {
    cache->length = 0;
    cache->B = 0;
}
