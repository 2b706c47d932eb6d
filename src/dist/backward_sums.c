#include "dist/backward_sums.h"

#include <stdlib.h>
#include <string.h>

#include "core/check.h"
#include "dist/dist.h"
#include "dist/shards.h"

typedef struct {
    GradientSpan *spans; // in the order a backward completes them
    int span_count;
    long *shard_counts, *shard_displs; // ZeRO-1's shards; NULL: all-reduce
    bool armed;  // in the last round of micro-batches before the optimizer step
    bool issued; // this step's sums are issued and not yet joined
} BackwardSums;

static void gradients_ready(Model *model, int point, void *context);

static BackwardSums *plan_of(const Model *model) {
    return model->gradient_hook.ready == gradients_ready ? model->gradient_hook.context : NULL;
}

// The sums of one span, beside the backward: the whole span to every rank, or each rank's
// part of it to that rank.
static void issue_span(const Model *model, const BackwardSums *plan, const GradientSpan *span) {
    const OpsCollectives *collectives = model->ops->collectives;
    float *grads = model->grads;
    if (!plan->shard_counts) {
        collectives->sum_floats_beside(grads + span->begin, span->end - span->begin);
        return;
    }
    for (int r = 0; r < dist_world_size(); r++) {
        long lo, hi;
        shard_overlap(plan->shard_counts, plan->shard_displs, r, span->begin, span->end, &lo, &hi);
        if (hi > lo) collectives->reduce_floats_beside(grads + lo, hi - lo, r);
    }
}

static void gradients_ready(Model *model, int point, void *context) {
    BackwardSums *plan = context;
    if (!plan->armed) return;
    // The loops run at most one backward a rank in a round; a second one would add into
    // gradients whose sums are already on their way.
    CHECK(!(plan->issued && point == model->config.num_layers),
          "two backwards in the last round of a step (their sums were issued by the first)");
    for (int i = 0; i < plan->span_count; i++)
        if (plan->spans[i].point == point) issue_span(model, plan, &plan->spans[i]);
    if (point == -1) plan->issued = true;
}

void backward_sums_install(Model *model, const long *shard_counts, const long *shard_displs) {
    CHECK(model->grads && !model->gradient_hook.ready && model->ops->collectives,
          "backward sums on a model without gradients, with a gradient hook, or without backend collectives");
    BackwardSums *plan = xcalloc(1, sizeof *plan);
    plan->spans = gradient_spans(model, false, &plan->span_count);
    if (shard_counts) {
        const size_t bytes = (size_t)dist_world_size() * sizeof(long);
        plan->shard_counts = xmalloc(bytes), plan->shard_displs = xmalloc(bytes);
        memcpy(plan->shard_counts, shard_counts, bytes), memcpy(plan->shard_displs, shard_displs, bytes);
    }
    model->gradient_hook.ready = gradients_ready;
    model->gradient_hook.context = plan;
}

bool backward_sums_installed(const Model *model) { return plan_of(model) != NULL; }

void backward_sums_free(Model *model) {
    BackwardSums *plan = plan_of(model);
    if (!plan) return;
    CHECK(!plan->issued, "backward sums freed before they were joined");
    free(plan->spans), free(plan->shard_counts), free(plan->shard_displs), free(plan);
    model->gradient_hook.ready = NULL, model->gradient_hook.context = NULL;
}

void backward_sums_round_begin(Model *model, bool last_before_step) {
    BackwardSums *plan = plan_of(model);
    if (!plan) return;
    CHECK(!plan->issued, "a round of backwards after this step's sums were issued");
    plan->armed = last_before_step;
}

void backward_sums_round_end(Model *model) {
    BackwardSums *plan = plan_of(model);
    if (!plan || !plan->armed) return;
    plan->armed = false;
    if (plan->issued) return;
    // No backward here this round: this rank's gradients (zero-filled where nothing wrote
    // them) into the sums the others issue in theirs, span by span in the same order.
    model_settle_gradients(model);
    for (int i = 0; i < plan->span_count; i++) issue_span(model, plan, &plan->spans[i]);
    plan->issued = true;
}

bool backward_sums_join(Model *model) {
    BackwardSums *plan = plan_of(model);
    if (!plan || !plan->issued) return false;
    model->ops->collectives->join();
    plan->issued = false;
    return true;
}
