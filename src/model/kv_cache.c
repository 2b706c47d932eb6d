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

void kv_cache_reset(KvCache *cache) {
    cache->length = 0;
    cache->B = 0;
}
