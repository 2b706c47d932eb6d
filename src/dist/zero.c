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
    shard_layout(model_trainable_floats(model), counts, displs);
    adamw_init_range(opt, model, config, displs[rank], displs[rank] + counts[rank]);
    free(counts), free(displs);
}

// The collectives go in rounds of at most S = dist_collective_floats() floats of every
// rank's shard: MPI implementations allocate temporaries as large as the message, which for
// the whole buffer would cost more memory than sharding the moments saves. Each round packs
// the ranks' slices side by side in a small buffer (W * S floats).

// Round `round`'s slice of every shard: rank r's is [starts[r], starts[r] + lengths[r]);
// offsets[r] is where it sits in the packed buffer. Returns the packed length.
static long round_layout(const long *counts, const long *displs, long round, long *lengths, long *offsets,
                         long *starts) {
    const long slice = dist_collective_floats();
    long packed = 0;
    for (int r = 0; r < dist_world_size(); r++) {
        long skip = round * slice, left = counts[r] > skip ? counts[r] - skip : 0;
        lengths[r] = left < slice ? left : slice;
        starts[r] = displs[r] + skip;
        offsets[r] = packed;
        packed += lengths[r];
    }
    return packed;
}

typedef struct {
    long *counts, *displs, *lengths, *offsets, *starts;
    long rounds;
    float *packed;
} Rounds;

static void rounds_begin(Rounds *x, long total) {
    const int world = dist_world_size();
    x->counts = xmalloc((size_t)world * sizeof(long)), x->displs = xmalloc((size_t)world * sizeof(long));
    x->lengths = xmalloc((size_t)world * sizeof(long)), x->offsets = xmalloc((size_t)world * sizeof(long));
    x->starts = xmalloc((size_t)world * sizeof(long));
    shard_layout(total, x->counts, x->displs);
    const long slice = dist_collective_floats();
    x->rounds = (x->counts[0] + slice - 1) / slice; // rank 0's shard is the longest
    x->packed = xmalloc((size_t)world * slice * sizeof(float));
}

static void rounds_end(Rounds *x) {
    free(x->counts), free(x->displs), free(x->lengths), free(x->offsets), free(x->starts), free(x->packed);
}

double dist_reduce_gradients(Model *model, const AdamW *opt) {
    if (!is_sharded(opt)) {
        dist_sum_gradients(model);
        return grad_global_norm(model);
    }
    const int world = dist_world_size(), rank = dist_rank();
    Rounds x;
    rounds_begin(&x, model_trainable_floats(model));
    for (long round = 0; round < x.rounds; round++) {
        round_layout(x.counts, x.displs, round, x.lengths, x.offsets, x.starts);
        for (int r = 0; r < world; r++)
            memcpy(x.packed + x.offsets[r], model->grads + x.starts[r], (size_t)x.lengths[r] * sizeof(float));
        // This rank's slice of the sums lands in its own part of the gradients; the rest of
        // model->grads stays this rank's own and is never read by the step.
        dist_reduce_scatter_floats(x.packed, model->grads + x.starts[rank], x.lengths);
    }
    rounds_end(&x);
    const long mine = opt->end - opt->begin;
    double squares[1] = {mine > 0 ? model->ops->sum_squares(model->grads + opt->begin, mine) : 0.0};
    dist_sum_doubles(squares, 1);
    return sqrt(squares[0]);
}

void dist_adamw_step(AdamW *opt, Model *model, float lr, float grad_scale) {
    adamw_step(opt, model, lr, grad_scale);
    if (!is_sharded(opt)) return;
    const int world = dist_world_size(), rank = dist_rank();
    Rounds x;
    rounds_begin(&x, model_trainable_floats(model));
    for (long round = 0; round < x.rounds; round++) {
        round_layout(x.counts, x.displs, round, x.lengths, x.offsets, x.starts);
        memcpy(x.packed + x.offsets[rank], model_trainable_params(model) + x.starts[rank],
               (size_t)x.lengths[rank] * sizeof(float));
        dist_allgather_floats(x.packed, x.lengths, x.offsets);
        for (int r = 0; r < world; r++)
            if (r != rank)
                memcpy(model_trainable_params(model) + x.starts[r], x.packed + x.offsets[r],
                       (size_t)x.lengths[r] * sizeof(float));
    }
    rounds_end(&x);
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
