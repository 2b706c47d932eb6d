#include "dist/model_sync.h"

#include <string.h>

#include "core/check.h"
#include "dist/dist.h"

// Device memory (the CUDA backend) travels through a host buffer of this many floats.
#define STAGING_FLOATS (1L << 22)

static bool is_host_memory(const Model *model) { return model->ops == &ops_cpu; }

void dist_sum_gradients(Model *model) {
    if (dist_world_size() <= 1) return;
    CHECK(model->grads, "dist_sum_gradients on a model without gradients");
    long total = model->table.total;
    if (is_host_memory(model)) {
        dist_sum_floats(model->grads, total);
        return;
    }
    float *staging = xmalloc(STAGING_FLOATS * sizeof(float));
    for (long first = 0; first < total; first += STAGING_FLOATS) {
        long count = total - first < STAGING_FLOATS ? total - first : STAGING_FLOATS;
        model->ops->copy_to_host(staging, model->grads + first, (size_t)count * sizeof(float));
        dist_sum_floats(staging, count);
        model->ops->copy_to_device(model->grads + first, staging, (size_t)count * sizeof(float));
    }
    free(staging);
}

void dist_broadcast_weights(Model *model) {
    if (dist_world_size() <= 1) return;
    long total = model->table.total;
    if (is_host_memory(model)) {
        dist_broadcast(model->params, (size_t)total * sizeof(float), 0);
        return;
    }
    float *staging = xmalloc(STAGING_FLOATS * sizeof(float));
    for (long first = 0; first < total; first += STAGING_FLOATS) {
        long count = total - first < STAGING_FLOATS ? total - first : STAGING_FLOATS;
        model->ops->copy_to_host(staging, model->params + first, (size_t)count * sizeof(float));
        dist_broadcast(staging, (size_t)count * sizeof(float), 0);
        // Through the backend, so the CUDA backend's bf16 weight copies are marked stale.
        model->ops->copy_to_device(model->params + first, staging, (size_t)count * sizeof(float));
    }
    free(staging);
}

unsigned long long model_weights_fingerprint(const Model *model) {
    long total = model->table.total;
    float *host = xmalloc(STAGING_FLOATS * sizeof(float));
    unsigned long long hash = 14695981039346656037ULL;
    for (long first = 0; first < total; first += STAGING_FLOATS) {
        long count = total - first < STAGING_FLOATS ? total - first : STAGING_FLOATS;
        model->ops->copy_to_host(host, model->params + first, (size_t)count * sizeof(float));
        const unsigned char *bytes = (const unsigned char *)host;
        for (size_t i = 0; i < (size_t)count * sizeof(float); i++) {
            hash ^= bytes[i];
            hash *= 1099511628211ULL;
        }
    }
    free(host);
    return hash;
}
