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

void kv_cache_reset(KvCache *cache) {
    cache->length = 0;
    cache->B = 0;
}
