#include "dist/model_sync.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

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

// Whether device memory's sums and broadcasts use the backend's own collectives (NCCL)
// or travel through host memory (on_host and MPI): decided once for the process, by all
// ranks together at the first of them, which every rank reaches at the same point.
typedef enum { PATH_UNDECIDED, PATH_HOST, PATH_BACKEND } CollectivePath;
static CollectivePath collective_path = PATH_UNDECIDED;
static const OpsBackend *decided_for; // one backend a run: every model of a command shares --device

// Two ranks of one machine on one GPU cannot form an NCCL communicator (more ranks than
// GPUs, or CUDA_VISIBLE_DEVICES giving them the same one): the first pair that share one
// is named in `why` on every rank.
static void find_shared_device(const char *device_key, char *why, size_t why_bytes) {
    char host[256] = "", mine[OPS_DEVICE_KEY_BYTES + 300], shared[sizeof mine];
    gethostname(host, sizeof host - 1);
    snprintf(mine, sizeof mine, "%s on %s", device_key, host);
    int first, second;
    if (dist_find_shared_string(mine, shared, sizeof shared, &first, &second))
        snprintf(why, why_bytes, "ranks %d and %d share the GPU %s (NCCL needs one GPU for each rank)", first, second,
                 shared);
}

static bool backend_collectives(const OpsBackend *ops) {
    if (collective_path != PATH_UNDECIDED) {
        CHECK(ops == decided_for, "collectives decided for the %s backend, asked for the %s one", decided_for->name,
              ops->name);
        return collective_path == PATH_BACKEND;
    }
    decided_for = ops;
    const DistNcclSetting setting = dist_nccl_setting();
    char why[512] = "", device_key[OPS_DEVICE_KEY_BYTES] = "";
    if (setting == DIST_NCCL_OFF) snprintf(why, sizeof why, "MARLHF_NCCL=0");
    else if (!ops->collectives) snprintf(why, sizeof why, "the %s backend has no collectives", ops->name);
    else if (ops->collectives->available(device_key) != 0) snprintf(why, sizeof why, "%s", err_msg());
    bool usable = !dist_any_failed(*why != '\0');
    if (usable) {
        find_shared_device(device_key, why, sizeof why);
        usable = *why == '\0';
    }
    if (usable) {
        unsigned char id[OPS_COLLECTIVES_ID_BYTES] = {0};
        if (dist_is_main() && ops->collectives->make_id(id) != 0) snprintf(why, sizeof why, "%s", err_msg());
        usable = !dist_any_failed(*why != '\0');
        if (usable) {
            dist_broadcast(id, sizeof id, 0);
            if (ops->collectives->open(id, dist_rank(), dist_world_size()) != 0) snprintf(why, sizeof why, "%s", err_msg());
            usable = !dist_any_failed(*why != '\0');
        }
    }
    const char *reason = *why ? why : "another rank cannot use it";
    if (!usable && setting == DIST_NCCL_REQUIRED)
        die_user("MARLHF_NCCL=1 but the ranks cannot sum with NCCL: %s", reason);
    collective_path = usable ? PATH_BACKEND : PATH_HOST;
    // Said once, by rank 0; nothing to say on the CPU, whose memory is the host's.
    if (dist_is_main() && usable)
        fprintf(stderr, "data parallel: %d ranks sum gradients on their GPUs with %s\n", dist_world_size(),
                ops->collectives->describe());
    else if (dist_is_main() && ops != &ops_cpu)
        fprintf(stderr, "data parallel: %d ranks sum gradients through host memory (MPI): %s\n", dist_world_size(),
                reason);
    return usable;
}

bool dist_backend_collectives(const Model *model) { return backend_collectives(model->ops); }

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
    if (backend_collectives(model->ops))
        model->ops->collectives->sum_floats(model->grads, model_trainable_floats(model));
    else
        on_host(model, model->grads, model_trainable_floats(model), sum_pass, NULL, true);
}

void dist_broadcast_weights(Model *model) {
    if (dist_world_size() <= 1) return;
    // A quantized base (QLoRA) is frozen and quantized alike on every rank from the same
    // file; its float32 pages were given back, and a broadcast would fill them again.
    const long first = model->quantized ? model_trainable_stored(model) : 0;
    if (backend_collectives(model->ops))
        model->ops->collectives->broadcast_floats(model->params + first, model->table.stored_total - first, 0);
    else
        on_host(model, model->params + first, model->table.stored_total - first, broadcast_pass, NULL, true);
}

unsigned long long model_weights_fingerprint(const Model *model) {
    uint64_t hash = HASH_FNV1A_START;
    on_host(model, model->params, model->table.stored_total, hash_pass, &hash, false);
    return hash;
}
