#include "dist/model_sync.h"

#include <string.h>

#include "core/check.h"
#include "dist/dist.h"

// Device memory (the CUDA backend) travels through a host buffer of this many floats.
#define STAGING_FLOATS (1L << 22)

typedef void (*HostPass)(float *values, long n, void *context);

// Runs `pass` over `buffer` (one of the model's flat buffers, backend memory) in host
// memory: in place on the CPU backend, else a piece at a time through a host buffer,
// copied back when `write_back` (through the backend, so the CUDA backend's bf16 weight
// copies are marked stale).
static void on_host(const Model *model, float *buffer, long total, HostPass pass, void *context, bool write_back) {
    if (model->ops == &ops_cpu) {
        pass(buffer, total, context);
        return;
    }
    float *staging = xmalloc(STAGING_FLOATS * sizeof(float));
    for (long first = 0; first < total; first += STAGING_FLOATS) {
        long count = total - first < STAGING_FLOATS ? total - first : STAGING_FLOATS;
        model->ops->copy_to_host(staging, buffer + first, (size_t)count * sizeof(float));
        pass(staging, count, context);
        if (write_back) model->ops->copy_to_device(buffer + first, staging, (size_t)count * sizeof(float));
    }
    free(staging);
}

static void sum_pass(float *values, long n, void *context) { (void)context, dist_sum_floats(values, n); }
static void broadcast_pass(float *values, long n, void *context) {
    (void)context, dist_broadcast(values, (size_t)n * sizeof(float), 0);
}
static void fnv1a_pass(float *values, long n, void *context) {
    unsigned long long *hash = context;
    const unsigned char *bytes = (const unsigned char *)values;
    for (size_t i = 0; i < (size_t)n * sizeof(float); i++) {
        *hash ^= bytes[i];
        *hash *= 1099511628211ULL;
    }
}

void dist_sum_gradients(Model *model) {
    if (dist_world_size() <= 1) return;
    CHECK(model->grads, "dist_sum_gradients on a model without gradients");
    on_host(model, model->grads, model_trainable_floats(model), sum_pass, NULL, true);
}

void dist_broadcast_weights(Model *model) {
    if (dist_world_size() <= 1) return;
    on_host(model, model->params, model->table.total, broadcast_pass, NULL, true);
}

unsigned long long model_weights_fingerprint(const Model *model) {
    unsigned long long hash = 14695981039346656037ULL;
    on_host(model, model->params, model->table.total, fnv1a_pass, &hash, false);
    return hash;
}
