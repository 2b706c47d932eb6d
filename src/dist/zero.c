#include "dist/zero.h"

#include <math.h>
#include <string.h>

#include "core/check.h"
#include "dist/dist.h"
#include "dist/model_sync.h"

static bool is_sharded(const AdamW *opt) { return !(opt->begin == 0 && opt->end == opt->total); }

// Rank r's shard: [displs[r], displs[r] + counts[r]), contiguous, 16-float aligned, the
// last one shorter (or empty).
static void shard_layout(long total, long *counts, long *displs) {
    const int world = dist_world_size();
    long chunk = ((total + world - 1) / world + 15) / 16 * 16;
    for (int r = 0; r < world; r++) {
        long begin = (long)r * chunk < total ? (long)r * chunk : total;
        long end = begin + chunk < total ? begin + chunk : total;
        displs[r] = begin;
        counts[r] = end - begin;
    }
}

void dist_adamw_init(AdamW *opt, const Model *model, AdamWConfig config, int zero_stage) {
    const int world = dist_world_size(), rank = dist_rank();
    if (zero_stage < 1 || world == 1) {
        adamw_init(opt, model, config);
        return;
    }
    CHECK(model->ops == &ops_cpu, "ZeRO stage 1 needs the CPU backend");
    long *counts = xmalloc((size_t)world * sizeof(long)), *displs = xmalloc((size_t)world * sizeof(long));
    shard_layout(model->table.total, counts, displs);
    adamw_init_range(opt, model, config, displs[rank], displs[rank] + counts[rank]);
    free(counts), free(displs);
}

// The reduce-scatter's output, kept from step to step (this rank's shard size).
static float *shard_scratch;
static long shard_scratch_size;

double dist_reduce_gradients(Model *model, const AdamW *opt) {
    if (!is_sharded(opt)) {
        dist_sum_gradients(model);
        return grad_global_norm(model);
    }
    const int world = dist_world_size();
    long *counts = xmalloc((size_t)world * sizeof(long)), *displs = xmalloc((size_t)world * sizeof(long));
    shard_layout(model->table.total, counts, displs);
    const long mine = opt->end - opt->begin;
    if (shard_scratch_size < mine + 1) {
        free(shard_scratch);
        shard_scratch = xmalloc((size_t)(mine + 1) * sizeof(float));
        shard_scratch_size = mine + 1;
    }
    dist_reduce_scatter_floats(model->grads, shard_scratch, counts);
    // Only this shard's gradients are summed; the rest of model->grads is this rank's own
    // and is never read by the step.
    memcpy(model->grads + opt->begin, shard_scratch, (size_t)mine * sizeof(float));
    double squares[1] = {mine > 0 ? model->ops->sum_squares(model->grads + opt->begin, mine) : 0.0};
    dist_sum_doubles(squares, 1);
    free(counts), free(displs);
    return sqrt(squares[0]);
}

void dist_adamw_step(AdamW *opt, Model *model, float lr, float grad_scale) {
    adamw_step(opt, model, lr, grad_scale);
    if (!is_sharded(opt)) return;
    const int world = dist_world_size();
    long *counts = xmalloc((size_t)world * sizeof(long)), *displs = xmalloc((size_t)world * sizeof(long));
    shard_layout(model->table.total, counts, displs);
    dist_allgather_floats(model->params, counts, displs);
    free(counts), free(displs);
}

void dist_adamw_gather(const AdamW *opt, AdamW *full) {
    *full = *opt;
    if (!is_sharded(opt)) return;
    const int world = dist_world_size();
    long *counts = xmalloc((size_t)world * sizeof(long)), *displs = xmalloc((size_t)world * sizeof(long));
    shard_layout(opt->total, counts, displs);
    full->begin = 0, full->end = opt->total;
    full->m = full->v = NULL;
    if (dist_is_main()) {
        full->m = xmalloc((size_t)opt->total * sizeof(float));
        full->v = xmalloc((size_t)opt->total * sizeof(float));
    }
    dist_gather_floats(opt->m, full->m, counts, displs, 0);
    dist_gather_floats(opt->v, full->v, counts, displs, 0);
    free(counts), free(displs);
}

void dist_adamw_gathered_free(const AdamW *opt, AdamW *full) {
    if (is_sharded(opt)) free(full->m), free(full->v);
    memset(full, 0, sizeof *full);
}
