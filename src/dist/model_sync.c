#include "dist/model_sync.h"

#include <string.h>

#include "core/check.h"
#include "core/hash.h"
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
// The staging pieces are of even length, so hashing them one by one is hashing the whole.
static void hash_pass(float *values, long n, void *context) {
    uint64_t *hash = context;
    *hash = hash_floats(*hash, values, n);
}

void dist_sum_gradients(Model *model) {
    if (dist_world_size() <= 1) return;
    CHECK(model->grads, "dist_sum_gradients on a model without gradients");
    model_settle_gradients(model);
    on_host(model, model->grads, model_trainable_floats(model), sum_pass, NULL, true);
}

void dist_broadcast_weights(Model *model) {
    if (dist_world_size() <= 1) return;
    // A quantized base (QLoRA) is frozen and quantized alike on every rank from the same
    // file; its float32 pages were given back, and a broadcast would fill them again.
    const long first = model->quantized ? model_trainable_stored(model) : 0;
    on_host(model, model->params + first, model->table.stored_total - first, broadcast_pass, NULL, true);
}

unsigned long long model_weights_fingerprint(const Model *model) {
    uint64_t hash = HASH_FNV1A_START;
    on_host(model, model->params, model->table.stored_total, hash_pass, &hash, false);
    return hash;
}
