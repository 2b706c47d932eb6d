#include "dist/zero.h"

#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "core/check.h"
#include "core/hash.h"
#include "dist/backward_sums.h"
#include "dist/dist.h"
#include "dist/model_sync.h"
#include "dist/shards.h"
#include "model/lora.h"

static bool is_sharded(const AdamW *opt) { return !(opt->begin == 0 && opt->end == opt->total); }

// The plan of stages 2 and 3. The trainable buffer cut into spans of table entries whose
// gradients are complete at the same backward point, in the order the backward completes
// them; each span is summed across ranks at its point (stage2_gradients_ready). Under stage 3
// the spans of layer l (point l) are also the weights gathered while layer l runs.
typedef struct {
    GradientSpan *spans;
    int span_count;
    long *counts, *displs, *lengths; // the shard layout; one message's share of each rank
    long *offsets;                   // where each rank's share starts in one message
    float *mine;                     // this rank's share of one message
    long backwards;                  // backwards summed so far (the hook's last point)
    long round_start;                // `backwards` at dist_backward_round_begin
    bool stage3;                     // the layers' weights are sharded too
    int shard_id;                    // its optimizer's AdamW.shard_id, or its own: requests and announcements name it
    bool whole;                      // stage 3: not sharded yet (before dist_weights_start), or rank 0 holds all (the final write)
    bool gathered;                   // stage 3: whole on every rank from dist_weights_gather_all to dist_weights_reshard
    long region;                     // its floats: [0, region)
    bool fingerprinted;              // a LoRA base plan: Model.lora_base_fingerprint taken (lora_base_fingerprint)
    bool globals_whole;              // stage 3: the global tensors' other parts are here (from a pass of this model
                                     // to another sharded model's pass or an optimizer step; stage3_use)
} ShardPlan;

// A span of a layer's weights, which stage 3 gathers while the layer runs; the others are the
// global tensors (embeddings, final norm, heads), gathered for a model's passes (stage3_use).
static bool is_layer_span(const Model *model, const GradientSpan *span) {
    return span->point >= 0 && span->point < model->config.num_layers;
}

static void stage2_gradients_ready(Model *model, int point, void *context);
static void stage3_read(const Model *model, long first, long count, float *out, void *context);

// A model's sharding plans. The gradient plan (stages 2 and 3) cuts its trainable floats;
// the weights plan (stage 3) the floats whose weights are sharded. A fully trained model has
// one plan, both at once; a model without gradients (a follower or a frozen model,
// shard_without_optimizer) only a weights plan; a LoRA model under stage 3 a gradient plan of
// its adapters (stage 2's: they stay whole) and a weights plan of its frozen base
// (dist_adamw_init's shard_without_optimizer). Either way a weights plan's floats are the table's from 0, so its
// weights are model->params + its floats.
static ShardPlan *gradient_plan(const Model *model) {
    return model->gradient_hook.ready == stage2_gradients_ready ? model->gradient_hook.context : NULL;
}

static ShardPlan *weights_plan(const Model *model) {
    return model->weight_hook.read == stage3_read ? model->weight_hook.context : NULL;
}

// The plan of the stage 3 machinery: the weights plan, else the gradient plan.
static ShardPlan *plan_of(const Model *model) {
    ShardPlan *weights = weights_plan(model);
    return weights ? weights : gradient_plan(model);
}

// Every rank numbers its sharded optimizers and stage 3 models in the same order, so the
// numbers agree: rank 0's requests for shards and each pass's announcement name them.
static int shard_ids;

// The models sharded under stage 3 on this rank: a draining rank plays the passes of
// whichever one the running ranks announce (stage3_announce).
#define MAX_STAGE3_MODELS 16
static Model *stage3_models[MAX_STAGE3_MODELS];
static bool draining; // in dist_weights_drain: this rank's own passes announce nothing

static void stage3_register(Model *model) {
    for (int i = 0; i < MAX_STAGE3_MODELS; i++)
        if (!stage3_models[i]) {
            stage3_models[i] = model;
            return;
        }
    CHECK(false, "ZeRO stage 3: more than %d sharded models", MAX_STAGE3_MODELS);
}

static void stage3_unregister(const Model *model) {
    for (int i = 0; i < MAX_STAGE3_MODELS; i++)
        if (stage3_models[i] == model) stage3_models[i] = NULL;
}

// The plan of a model's trainable floats, or (frozen_base) of the floats before them, a LoRA
// model's frozen base, cut in the shards the model had before its adapters were added (those
// its ranks loaded, dist_weights_load_range).
static ShardPlan *shard_plan_of(const Model *model, bool frozen_base) {
    const int world = dist_world_size();
    ShardPlan *plan = xcalloc(1, sizeof *plan);
    plan->spans = gradient_spans(model, frozen_base, &plan->span_count);
    plan->region = frozen_base ? model->trainable_offset : model_trainable_floats(model);
    plan->counts = xmalloc((size_t)world * sizeof(long));
    plan->displs = xmalloc((size_t)world * sizeof(long));
    plan->lengths = xmalloc((size_t)world * sizeof(long));
    plan->offsets = xmalloc((size_t)world * sizeof(long));
    shard_layout(frozen_base ? model->table.entries[model->lora_first_entry].offset : model_trainable_floats(model),
                 plan->counts, plan->displs);
    plan->mine = xmalloc((size_t)dist_collective_floats() * sizeof(float));
    return plan;
}

static ShardPlan *shard_plan(const Model *model) { return shard_plan_of(model, false); }

// Zeroes x[0, n) and gives the whole pages among them back to the system: the next write
// faults in a fresh zero page, so memory is only held for gradients being computed. The
// buffers are private anonymous memory (ops_cpu's alloc), which MADV_DONTNEED refills with
// zeros. The sanitizer build keeps plain zeroing (its buffers come from malloc, and it
// measures no memory).
static void release_zeroed(float *x, long n) {
    if (n <= 0) return;
    char *begin = (char *)x, *end = (char *)(x + n);
#if !defined(__SANITIZE_ADDRESS__)
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    char *first = (char *)(((uintptr_t)begin + page - 1) / page * page), *last = (char *)((uintptr_t)end / page * page);
    if (last > first && madvise(first, (size_t)(last - first), MADV_DONTNEED) == 0) {
        memset(begin, 0, (size_t)(first - begin));
        memset(last, 0, (size_t)(end - last));
        return;
    }
#endif
    memset(begin, 0, (size_t)(end - begin));
}

// Sums the gradients of [begin, end) across ranks in messages of at most
// dist_collective_floats() floats: each message is split at the shard boundaries, so it is
// already a reduce-scatter's input in rank order. This rank keeps the sums of its shard's
// part and zeroes (frees) the rest, which other ranks own.
static void stage2_reduce_span(Model *model, ShardPlan *plan, long begin, long end) {
    const int world = dist_world_size(), rank = dist_rank();
    const long slice = dist_collective_floats();
    float *grads = model->grads;
    for (long from = begin; from < end; from += slice) {
        const long to = from + slice < end ? from + slice : end;
        long lo, hi;
        for (int r = 0; r < world; r++) {
            shard_overlap(plan->counts, plan->displs, r, from, to, &lo, &hi);
            plan->lengths[r] = hi > lo ? hi - lo : 0;
        }
        dist_reduce_scatter_floats(grads + from, plan->mine, plan->lengths);
        shard_overlap(plan->counts, plan->displs, rank, from, to, &lo, &hi);
        if (hi <= lo) lo = hi = to;
        memcpy(grads + lo, plan->mine, (size_t)(hi - lo) * sizeof(float));
        release_zeroed(grads + from, lo - from);
        release_zeroed(grads + hi, to - hi);
    }
}

static void stage2_gradients_ready(Model *model, int point, void *context) {
    ShardPlan *plan = context;
    for (int i = 0; i < plan->span_count; i++)
        if (plan->spans[i].point == point) stage2_reduce_span(model, plan, plan->spans[i].begin, plan->spans[i].end);
    if (point == -1) plan->backwards++;
}

// Stage 3. The weights of [begin, end) from every rank's shard into every rank's buffer, in
// messages of at most dist_collective_floats() floats, each an all-gather of the ranks'
// parts of it.
static void stage3_gather_span(Model *model, ShardPlan *plan, long begin, long end) {
    const int world = dist_world_size();
    const long slice = dist_collective_floats();
    float *params = model->params;
    for (long from = begin; from < end; from += slice) {
        const long to = from + slice < end ? from + slice : end;
        for (int r = 0; r < world; r++) {
            long lo, hi;
            shard_overlap(plan->counts, plan->displs, r, from, to, &lo, &hi);
            plan->lengths[r] = hi > lo ? hi - lo : 0;
            plan->offsets[r] = hi > lo ? lo - from : 0;
        }
        dist_allgather_floats(params + from, plan->lengths, plan->offsets);
    }
}

// Gives back the pages of the weights of [begin, end) that other ranks own.
static void stage3_release_span(Model *model, const ShardPlan *plan, long begin, long end) {
    float *params = model->params;
    long lo, hi;
    shard_overlap(plan->counts, plan->displs, dist_rank(), begin, end, &lo, &hi);
    if (hi <= lo) lo = hi = end;
    release_zeroed(params + begin, lo - begin);
    release_zeroed(params + hi, end - hi);
}

static void stage3_layer(Model *model, int layer, bool needed, void *context) {
    ShardPlan *plan = context;
    if (plan->whole) return;
    for (int i = 0; i < plan->span_count; i++) {
        if (plan->spans[i].point != layer) continue;
        if (needed) stage3_gather_span(model, plan, plan->spans[i].begin, plan->spans[i].end);
        else stage3_release_span(model, plan, plan->spans[i].begin, plan->spans[i].end);
    }
}

// The global tensors (embeddings, final norm, heads) of a sharded model: gathered whole
// (needed) or the other ranks' parts given back. Every rank changes globals_whole at the same
// points (stage3_use, the optimizer step, the hybrid engine's gather and reshard), so the
// gathers meet.
static void stage3_globals(Model *model, ShardPlan *plan, bool needed) {
    if (plan->globals_whole == needed) return;
    for (int i = 0; i < plan->span_count; i++) {
        const GradientSpan *span = &plan->spans[i];
        if (is_layer_span(model, span)) continue;
        if (needed) stage3_gather_span(model, plan, span->begin, span->end);
        else stage3_release_span(model, plan, span->begin, span->end);
    }
    plan->globals_whole = needed;
}

// Before each pass of a sharded model, run or played: the global tensors of every other
// sharded model are given back, and this one's gathered if they are not here. A pass reads
// them from its start (the embeddings) to after its end (the heads run outside the model's
// forward, model_logprobs and model_values), and passes of two models never interleave
// (stage3_announce), so one model's global tensors are whole at a time.
static void stage3_use(Model *model, ShardPlan *plan) {
    for (int i = 0; i < MAX_STAGE3_MODELS; i++) {
        Model *other = stage3_models[i];
        ShardPlan *other_plan = other && other != model ? plan_of(other) : NULL;
        if (other_plan && !other_plan->whole && other_plan->globals_whole) stage3_globals(other, other_plan, false);
    }
    stage3_globals(model, plan, true);
}

// Model.weight_hook.read on rank 0: its own shard copied, the rest asked of the owners
// (which answer in dist_serve_shards), span by span.
static void stage3_read(const Model *model, long first, long count, float *out, void *context) {
    const ShardPlan *plan = context;
    CHECK(dist_rank() == 0, "ZeRO stage 3: weights read on rank %d (only rank 0 writes)", dist_rank());
    const float *params = model->params;
    long end = first + count;
    if (plan->whole) {
        memcpy(out, params + first, (size_t)count * sizeof(float));
        return;
    }
    if (end > plan->region) { // after a LoRA model's frozen base: its adapters, whole on every rank
        const long from = first > plan->region ? first : plan->region;
        memcpy(out + (from - first), params + from, (size_t)(end - from) * sizeof(float));
        end = from;
    }
    for (int i = 0; i < plan->span_count; i++) {
        const GradientSpan *span = &plan->spans[i];
        const long from = first > span->begin ? first : span->begin, to = end < span->end ? end : span->end;
        if (to <= from) continue;
        for (int r = 0; r < dist_world_size(); r++) {
            long lo, hi;
            shard_overlap(plan->counts, plan->displs, r, from, to, &lo, &hi);
            if (hi <= lo) continue;
            if (r == 0) {
                memcpy(out + (lo - first), params + lo, (size_t)(hi - lo) * sizeof(float));
                continue;
            }
            const long request[4] = {plan->shard_id, 2, lo, hi - lo};
            dist_send_longs(request, 4, r);
            dist_receive_floats(out + (lo - first), hi - lo, r);
        }
    }
}

// Every pass's gathers are collectives, so the ranks must run their passes in step: each
// pass starts by telling the others its kind and its model's shard id, and a rank with
// nothing to run (it is in dist_weights_drain) answers 0 and plays the same pass's
// collectives. Returns the kind run now (0: every rank is draining) and, in *shard_id, whose;
// two kinds or two models at once is a bug in the caller.
static int stage3_announce(int kind, int *shard_id) {
    // The largest kind and id, minus the smallest ones run.
    int announced[4] = {kind, kind ? -kind : INT_MIN, kind ? *shard_id : 0, kind ? -*shard_id : INT_MIN};
    dist_max_ints(announced, 4);
    CHECK(announced[0] == 0 || (announced[0] == -announced[1] && announced[2] == -announced[3]),
          "ZeRO stage 3: the ranks run different passes at once (a forward on one, a backward on another, or "
          "passes of different models)");
    *shard_id = announced[2];
    return announced[0];
}

static void stage3_pass(Model *model, int kind, void *context) {
    ShardPlan *plan = context;
    // A backward's gradient sums are collectives that a draining rank plays only for a
    // sharded model: with the weights gathered the ranks would stop in step no more.
    CHECK(!(plan->gathered && kind == MODEL_PASS_BACKWARD),
          "ZeRO stage 3: a backward while the weights are gathered whole (dist_weights_reshard missing)");
    if (plan->whole || draining) return;
    int shard_id = plan->shard_id;
    stage3_announce(kind, &shard_id);
    stage3_use(model, plan);
}

// The collectives of a pass of `kind` without running it, in model.h's order (Model.weight_hook):
// a forward's gathers; a backward's gathers and sums, with this rank's gradients (zeros
// outside its shard, so it adds nothing it does not own).
static void stage3_play_pass(Model *model, ShardPlan *plan, int kind) {
    const int L = model->config.num_layers;
    stage3_use(model, plan);
    if (kind == MODEL_PASS_FORWARD) {
        for (int l = 0; l < L; l++) stage3_layer(model, l, true, plan), stage3_layer(model, l, false, plan);
        return;
    }
    ShardPlan *sums = gradient_plan(model); // the weights plan itself, or a LoRA model's adapters'
    stage2_gradients_ready(model, L, sums);
    for (int l = L - 1; l >= 0; l--) {
        stage3_layer(model, l, true, plan);
        stage2_gradients_ready(model, l, sums);
        stage3_layer(model, l, false, plan);
    }
    stage2_gradients_ready(model, -1, sums);
}

void dist_weights_drain(Model *model) {
    const ShardPlan *plan = plan_of(model);
    if (!plan || !plan->stage3 || plan->whole) return;
    draining = true;
    for (;;) {
        int shard_id = 0;
        const int kind = stage3_announce(0, &shard_id);
        if (kind == 0) break;
        Model *running = NULL;
        for (int i = 0; i < MAX_STAGE3_MODELS; i++)
            if (stage3_models[i] && plan_of(stage3_models[i])->shard_id == shard_id) running = stage3_models[i];
        CHECK(running, "ZeRO stage 3: a pass of a model this rank has not sharded (shard %d)", shard_id);
        CHECK(kind == MODEL_PASS_FORWARD || running->grads, "ZeRO stage 3: a backward of a frozen model");
        stage3_play_pass(running, plan_of(running), kind);
    }
    draining = false;
}

bool dist_weights_sharded(const Model *model) {
    const ShardPlan *plan = plan_of(model);
    return plan && plan->stage3;
}

// Model.lora_base_fingerprint of a LoRA model whose base is sharded: the hash model_add_lora
// takes of the whole base (which no rank holds), taken by rank 0 reading the other ranks'
// shards piece by piece, as for a checkpoint, and sent to every rank (collective).
static void lora_base_fingerprint(Model *model, const ShardPlan *plan) {
    unsigned long long hash = HASH_FNV1A_START;
    if (dist_is_main()) {
        const long piece = 1L << 20; // even: hash_floats continues word-wise
        float *buffer = xmalloc((size_t)piece * sizeof(float));
        for (long first = 0; first < plan->region; first += piece) {
            const long count = plan->region - first < piece ? plan->region - first : piece;
            stage3_read(model, first, count, buffer, (void *)plan);
            hash = hash_floats(hash, buffer, count);
        }
        free(buffer);
        dist_serving_end();
    } else {
        const Model *models[1] = {model};
        dist_serve_shards(NULL, 0, models, 1);
    }
    dist_broadcast(&hash, sizeof hash, 0);
    model->lora_base_fingerprint = hash;
}

void dist_weights_start(Model *model) {
    ShardPlan *plan = plan_of(model);
    if (!plan || !plan->stage3) {
        dist_broadcast_weights(model);
        return;
    }
    float *params = model->params;
    for (int i = 0; i < plan->span_count; i++) {
        const GradientSpan *span = &plan->spans[i];
        if (is_layer_span(model, span)) stage3_release_span(model, plan, span->begin, span->end);
        // The first start: rank 0's global tensors everywhere. A later one (after a resume's
        // reload) finds each rank's shard of them current: reread whole from the checkpoint,
        // or, a LoRA model's frozen base, untouched since (rank 0 holds only its shard).
        else if (plan->whole) dist_broadcast(params + span->begin, (size_t)(span->end - span->begin) * sizeof(float), 0);
    }
    // Each rank keeps its shard of the global tensors until a pass.
    plan->globals_whole = true;
    stage3_globals(model, plan, false);
    plan->whole = false;
    if (plan->region < model->table.total) {
        // A LoRA model: its adapters (and a trained value head) stay whole, rank 0's everywhere;
        // the fingerprint of the sharded base is taken once, for the adapters' files.
        dist_broadcast(params + plan->region, (size_t)(model->table.total - plan->region) * sizeof(float), 0);
        if (plan->fingerprinted) return;
        lora_base_fingerprint(model, plan);
        plan->fingerprinted = true;
        // Fresh DoRA magnitudes are the base's row norms, which model_add_lora took of this
        // rank's shard only: each layer gathered, every rank sets them again (the same values).
        if (model->lora.dora)
            for (int l = 0; l < model->config.num_layers; l++) {
                stage3_layer(model, l, true, plan);
                lora_dora_init_magnitudes(model, l);
                stage3_layer(model, l, false, plan);
            }
    }
}

// The hybrid engine's gather: the same all-gathers as a forward's, of every layer at once,
// kept until dist_weights_reshard. While whole, the model's passes announce nothing and its
// layer hook does nothing (stage3_pass, stage3_layer), so the ranks run them at their own pace.
void dist_weights_gather_all(Model *model) {
    ShardPlan *plan = plan_of(model);
    if (!plan || !plan->stage3) return;
    CHECK(!plan->whole, "ZeRO stage 3: a gather of a model already whole");
    for (int l = 0; l < model->config.num_layers; l++) stage3_layer(model, l, true, plan);
    stage3_globals(model, plan, true);
    plan->whole = plan->gathered = true;
}

// Every rank holds the same whole weights (nothing trained them meanwhile: AdamW updates a
// sharded model only), so each keeps its shard and gives the rest of each layer back.
void dist_weights_reshard(Model *model) {
    ShardPlan *plan = plan_of(model);
    if (!plan || !plan->stage3) return;
    CHECK(plan->gathered, "ZeRO stage 3: a reshard of a model that is not gathered");
    plan->whole = plan->gathered = false;
    for (int l = 0; l < model->config.num_layers; l++) stage3_layer(model, l, false, plan);
    stage3_globals(model, plan, false);
}

void dist_weights_load_range(const Model *model, const ParamEntry *entry, long *first, long *count) {
    *first = 0, *count = entry->numel;
    const int world = dist_world_size(), point = model_gradient_point(model, entry);
    if (world <= 1 || point < 0 || point >= model->config.num_layers) return;
    CHECK(model->trainable_offset == 0, "a ZeRO-3 load of a partly frozen model");
    long *counts = xmalloc((size_t)world * sizeof(long)), *displs = xmalloc((size_t)world * sizeof(long));
    shard_layout(model_trainable_floats(model), counts, displs);
    long lo, hi;
    shard_overlap(counts, displs, dist_rank(), entry->offset, entry->offset + entry->numel, &lo, &hi);
    free(counts), free(displs);
    *first = hi > lo ? lo - entry->offset : 0;
    *count = hi > lo ? hi - lo : 0;
}

// A follower is never run while sharded: outside this rank's shard its layers are zeros.
static void follower_pass(Model *model, int kind, void *context) {
    const ShardPlan *plan = context;
    (void)model, (void)kind;
    CHECK(plan->whole, "ZeRO stage 3: a pass of a sharded model that only follows another (an EMA copy)");
}

// Stage 3 for a model without an optimizer: its plan, found through its weight hook.
static void shard_without_optimizer(Model *model, void (*pass)(Model *model, int kind, void *context)) {
    const bool lora_base = model->trainable_offset > 0; // dist_adamw_init's: the gradient plan is the adapters'
    CHECK(model->ops == &ops_cpu && !model->quantized && !model->weight_hook.pass &&
              (lora_base || (!model->grads && !model->gradient_hook.ready)),
          "ZeRO stage 3 on a model off the CPU, quantized, with adapters, gradients or hooks");
    ShardPlan *plan = shard_plan_of(model, lora_base);
    free(plan->mine), plan->mine = NULL; // no gradients to sum
    plan->stage3 = plan->whole = true;
    plan->shard_id = ++shard_ids;
    model->weight_hook.pass = pass;
    model->weight_hook.layer = pass == stage3_pass ? stage3_layer : NULL;
    model->weight_hook.read = stage3_read;
    model->weight_hook.context = plan;
    stage3_register(model);
}

void dist_weights_shard_like(Model *follower, const Model *trained) {
    const ShardPlan *trained_plan = plan_of(trained);
    if (!trained_plan || !trained_plan->stage3) return;
    CHECK(follower->table.total == trained->table.total, "ZeRO stage 3: a follower unlike the model it follows");
    shard_without_optimizer(follower, follower_pass); // the same table, so the same spans and shards
}

void dist_weights_shard_frozen(Model *model) {
    if (dist_world_size() <= 1) return;
    shard_without_optimizer(model, stage3_pass);
}

void dist_moving_average(Model *follower, const Model *trained, float beta) {
    float *average = model_trainable_params(follower);
    const float *x = model_trainable_params(trained);
    const ShardPlan *plan = plan_of(follower);
    // A LoRA follower's sharded plan is of its frozen base; its adapters, which move, are whole.
    if (!plan || plan->whole || plan->region < follower->table.total) {
        trained->ops->moving_average(average, x, beta, model_trainable_floats(trained));
        return;
    }
    // This rank's shard, where the trained model keeps its current weights too.
    long lo, hi;
    shard_overlap(plan->counts, plan->displs, dist_rank(), 0, model_trainable_floats(follower), &lo, &hi);
    if (hi > lo) trained->ops->moving_average(average + lo, x + lo, beta, hi - lo);
}

// The layers' weights to rank 0, span by span and rank by rank: every rank walks the same
// order, so each send meets its receive.
void dist_weights_gather_to_main(Model *model) {
    ShardPlan *plan = plan_of(model);
    if (!plan || !plan->stage3) return;
    const int world = dist_world_size(), rank = dist_rank();
    const long slice = dist_collective_floats();
    float *params = model->params;
    for (int i = 0; i < plan->span_count; i++) {
        for (int r = 1; r < world; r++) {
            long lo, hi;
            shard_overlap(plan->counts, plan->displs, r, plan->spans[i].begin, plan->spans[i].end, &lo, &hi);
            if (rank != 0 && rank != r) continue;
            for (long from = lo; from < hi; from += slice) {
                const long n = hi - from < slice ? hi - from : slice;
                if (rank == 0) dist_receive_floats(params + from, n, r);
                else dist_send_floats(params + from, n, 0);
            }
        }
    }
    if (rank == 0) plan->whole = plan->globals_whole = true;
}

void dist_adamw_init(AdamW *opt, Model *model, AdamWConfig config, int zero_stage) {
    const int world = dist_world_size(), rank = dist_rank();
    // GPU ranks summing with NCCL take the sums of stages 0 and 1 during the step's last
    // backward (dist/backward_sums.h). Asked on every rank alike: it may decide the path.
    const bool sums_in_backward = world > 1 && zero_stage <= 1 && model->grads && !model->gradient_hook.ready &&
                                  model->ops->collectives && dist_backend_collectives(model);
    if (zero_stage < 1 || world == 1) {
        adamw_init(opt, model, config);
        if (sums_in_backward) backward_sums_install(model, NULL, NULL);
        return;
    }
    // Stage 1 on another backend (the GPU) sums and gathers with its collectives (NCCL) or
    // through host buffers (reduce_scatter_gradients, dist_adamw_step); stages 2 and 3 work
    // on host buffers in place.
    CHECK(zero_stage == 1 || model->ops == &ops_cpu, "ZeRO stages 2 and 3 need the CPU backend");
    long *counts = xmalloc((size_t)world * sizeof(long)), *displs = xmalloc((size_t)world * sizeof(long));
    shard_layout(model_trainable_floats(model), counts, displs);
    adamw_init_range(opt, model, config, displs[rank], displs[rank] + counts[rank]);
    if (sums_in_backward) backward_sums_install(model, counts, displs);
    free(counts), free(displs);
    opt->shard_id = ++shard_ids;
    if (zero_stage >= 2) {
        CHECK(model->grads && !model->gradient_hook.ready, "ZeRO stage 2 on a model without gradients or with a hook");
        ShardPlan *plan = shard_plan(model);
        model->gradient_hook.ready = stage2_gradients_ready;
        model->gradient_hook.context = plan;
        if (zero_stage >= 3 && model->trainable_offset > 0) {
            // LoRA: the adapters train as under stage 2 (whole weights, sharded gradients and
            // moments); the frozen base is sharded as a frozen model's weights are.
            CHECK(model->lora.rank > 0 && !model->quantized && !model->weight_hook.pass,
                  "ZeRO stage 3 on a partly frozen model that is not a float32 LoRA model");
            shard_without_optimizer(model, stage3_pass);
        } else if (zero_stage >= 3) {
            // The whole model is trainable (no frozen base), and not sharded until dist_weights_start.
            CHECK(model->trainable_offset == 0 && !model->quantized && !model->weight_hook.pass,
                  "ZeRO stage 3 on a partly frozen or quantized model, or one with a weight hook");
            plan->stage3 = plan->whole = true;
            plan->shard_id = opt->shard_id;
            model->weight_hook.pass = stage3_pass;
            model->weight_hook.layer = stage3_layer;
            model->weight_hook.read = stage3_read;
            model->weight_hook.context = plan;
            stage3_register(model);
        }
    }
}

static void free_plan(ShardPlan *plan) {
    free(plan->spans), free(plan->counts), free(plan->displs), free(plan->lengths), free(plan->offsets);
    free(plan->mine), free(plan);
}

void dist_weights_free(Model *model) {
    backward_sums_free(model);
    ShardPlan *weights = weights_plan(model), *gradients = gradient_plan(model);
    if (!weights && !gradients) return;
    stage3_unregister(model);
    if (weights) free_plan(weights);
    if (gradients && gradients != weights) free_plan(gradients);
    model->gradient_hook.ready = NULL, model->gradient_hook.context = NULL;
    memset(&model->weight_hook, 0, sizeof model->weight_hook);
}

void dist_adamw_free(AdamW *opt, Model *model) {
    adamw_free(opt);
    dist_weights_free(model);
}

void dist_zero_grad(Model *model) {
    if (gradient_plan(model)) release_zeroed(model->grads, model_trainable_floats(model));
    else model_zero_grad(model);
}

void dist_backward_round_begin(Model *model, bool last_before_step) {
    backward_sums_round_begin(model, last_before_step);
    ShardPlan *plan = gradient_plan(model);
    if (plan) plan->round_start = plan->backwards;
}

void dist_backward_round_end(Model *model) {
    backward_sums_round_end(model);
    ShardPlan *weights = weights_plan(model);
    if (weights && weights->stage3) { // every pass in step, whatever each rank ran (stage3_announce)
        dist_weights_drain(model);
        return;
    }
    ShardPlan *plan = gradient_plan(model);
    if (!plan) return;
    const long ran = plan->backwards - plan->round_start;
    CHECK(ran <= 1, "ZeRO stage 2: %ld backwards in one round (one at most: the ranks' sums would not match)", ran);
    if (ran == 1) return;
    // This rank's zeros (and its shard's sums so far) into the sums the other ranks take in
    // their backward of this round, span by span in the same order.
    for (int i = 0; i < plan->span_count; i++) stage2_reduce_span(model, plan, plan->spans[i].begin, plan->spans[i].end);
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

// Stage 1 with NCCL (dist_backend_collectives): `collective` (the backend's reduce or
// broadcast) over each rank's shard of `buffer` in turn, rooted at that rank, in device memory.
static void shards_through_backend(const Model *model, float *buffer,
                                   void (*collective)(float *values, long n, int root)) {
    const int world = dist_world_size();
    long *counts = xmalloc((size_t)world * sizeof(long)), *displs = xmalloc((size_t)world * sizeof(long));
    shard_layout(model_trainable_floats(model), counts, displs);
    for (int r = 0; r < world; r++) collective(buffer + displs[r], counts[r], r);
    free(counts), free(displs);
}

// Stage 1: the sums of this rank's shard into its part of the gradients; the rest of
// model->grads stays this rank's own and is never read by the step. The gradients are
// backend memory: with NCCL (dist_backend_collectives) each shard reduced onto its rank
// where it lies; else copied into the packed host buffer, and this rank's sums back from a
// host buffer (in place on the CPU, where both are host memory).
static void reduce_scatter_gradients(Model *model) {
    const int world = dist_world_size(), rank = dist_rank();
    const OpsBackend *ops = model->ops;
    if (dist_backend_collectives(model)) {
        shards_through_backend(model, model->grads, ops->collectives->reduce_floats);
        return;
    }
    Rounds x;
    rounds_begin(&x, model_trainable_floats(model));
    float *sums = ops == &ops_cpu ? NULL : xmalloc((size_t)dist_collective_floats() * sizeof(float));
    for (long round = 0; round < x.rounds; round++) {
        round_layout(x.counts, x.displs, round, x.lengths, x.offsets, x.starts);
        for (int r = 0; r < world; r++)
            ops->copy_to_host(x.packed + x.offsets[r], model->grads + x.starts[r], (size_t)x.lengths[r] * sizeof(float));
        float *mine = model->grads + x.starts[rank];
        dist_reduce_scatter_floats(x.packed, sums ? sums : mine, x.lengths);
        if (sums) ops->copy_to_device(mine, sums, (size_t)x.lengths[rank] * sizeof(float));
    }
    free(sums);
    rounds_end(&x);
}

double dist_reduce_gradients(Model *model, const AdamW *opt) {
    // Summed during the last backward (dist/backward_sums.h) or by stage 2 in every backward,
    // else here.
    const bool summed = backward_sums_join(model) || gradient_plan(model);
    model_settle_gradients(model);
    if (!is_sharded(opt)) {
        if (!summed) dist_sum_gradients(model);
        return grad_global_norm(model);
    }
    if (!summed) reduce_scatter_gradients(model);
    const long mine = opt->end - opt->begin;
    double squares[1] = {mine > 0 ? model->ops->sum_squares(model->grads + opt->begin, mine) : 0.0};
    dist_sum_doubles(squares, 1);
    return sqrt(squares[0]);
}

void dist_adamw_step(AdamW *opt, Model *model, float lr, float grad_scale) {
    adamw_step(opt, model, lr, grad_scale);
    if (!is_sharded(opt)) return;
    ShardPlan *plan = gradient_plan(model);
    if (plan && plan->stage3) {
        // Everything stays sharded: each layer is gathered when it runs, the global tensors at
        // the model's next pass (stage3_use); the other ranks' parts of them held now are stale.
        CHECK(!plan->whole, "ZeRO stage 3: an optimizer step while the weights are gathered");
        stage3_globals(model, plan, false);
        return;
    }
    // The weights are backend memory: with NCCL each shard broadcast from its rank where it
    // lies; else this rank's updated shard into the packed host buffer, the other ranks'
    // back through the backend (either marks a GPU's bf16 copies stale).
    const int world = dist_world_size(), rank = dist_rank();
    const OpsBackend *ops = model->ops;
    float *params = model_trainable_params(model);
    if (dist_backend_collectives(model)) {
        shards_through_backend(model, params, ops->collectives->broadcast_floats);
        return;
    }
    Rounds x;
    rounds_begin(&x, model_trainable_floats(model));
    for (long round = 0; round < x.rounds; round++) {
        round_layout(x.counts, x.displs, round, x.lengths, x.offsets, x.starts);
        ops->copy_to_host(x.packed + x.offsets[rank], params + x.starts[rank], (size_t)x.lengths[rank] * sizeof(float));
        dist_allgather_floats(x.packed, x.lengths, x.offsets);
        for (int r = 0; r < world; r++)
            if (r != rank)
                ops->copy_to_device(params + x.starts[r], x.packed + x.offsets[r], (size_t)x.lengths[r] * sizeof(float));
    }
    rounds_end(&x);
}

// Rank 0's reads of another rank's shards: a request {shard_id, which, first, count} (which: 0
// the first moments, 1 the second, 2 the weights (ZeRO-3); first in trainable floats) answered
// with the floats; shard_id -1 ends the serving.
void dist_adamw_read_moments(const AdamW *opt, int which, long first, long count, float *out) {
    const int world = dist_world_size(), rank = dist_rank();
    CHECK(rank == 0 && first >= 0 && count >= 0 && first + count <= opt->total, "bad read of moments");
    const float *mine = which ? opt->v : opt->m;
    if (!is_sharded(opt)) {
        opt->ops->copy_to_host(out, mine + first, (size_t)count * sizeof(float));
        return;
    }
    long *counts = xmalloc((size_t)world * sizeof(long)), *displs = xmalloc((size_t)world * sizeof(long));
    shard_layout(opt->total, counts, displs);
    for (int r = 0; r < world; r++) {
        long lo, hi;
        shard_overlap(counts, displs, r, first, first + count, &lo, &hi);
        if (hi <= lo) continue;
        if (r == rank) {
            opt->ops->copy_to_host(out + (lo - first), mine + (lo - opt->begin), (size_t)(hi - lo) * sizeof(float));
            continue;
        }
        const long request[4] = {opt->shard_id, which, lo, hi - lo};
        dist_send_longs(request, 4, r);
        dist_receive_floats(out + (lo - first), hi - lo, r);
    }
    free(counts), free(displs);
}

void dist_serving_end(void) {
    const long end[4] = {-1, 0, 0, 0};
    for (int r = 1; r < dist_world_size(); r++) dist_send_longs(end, 4, r);
}

void dist_serve_shards(const AdamW *const *optimizers, int optimizer_count, const Model *const *models,
                       int model_count) {
    if (dist_world_size() <= 1) return;
    const int rank = dist_rank();
    for (;;) {
        long request[4];
        dist_receive_longs(request, 4, 0);
        if (request[0] < 0) return;
        const float *source = NULL;
        const OpsBackend *ops = &ops_cpu; // the backend whose memory `source` is in
        if (request[1] == 2) { // a sharded model's weights (stage 3: the CPU's)
            for (int i = 0; i < model_count; i++) {
                const ShardPlan *plan = models[i] ? plan_of(models[i]) : NULL;
                if (plan && plan->stage3 && plan->shard_id == request[0] && request[2] >= plan->displs[rank] &&
                    request[2] + request[3] <= plan->displs[rank] + plan->counts[rank])
                    source = models[i]->params + request[2];
            }
        } else { // an optimizer's moments
            for (int i = 0; i < optimizer_count; i++) {
                const AdamW *opt = optimizers[i];
                if (opt && is_sharded(opt) && opt->shard_id == request[0] && request[2] >= opt->begin &&
                    request[2] + request[3] <= opt->end)
                    source = (request[1] ? opt->v : opt->m) + (request[2] - opt->begin), ops = opt->ops;
            }
        }
        CHECK(source, "rank 0 asked for a shard this rank does not hold (shard %ld, part %ld, [%ld, +%ld))", request[0],
              request[1], request[2], request[3]);
        if (ops == &ops_cpu) {
            dist_send_floats(source, request[3], 0);
            continue;
        }
        float *staged = xmalloc((size_t)request[3] * sizeof(float)); // a piece of a safetensors write
        ops->copy_to_host(staged, source, (size_t)request[3] * sizeof(float));
        dist_send_floats(staged, request[3], 0);
        free(staged);
    }
}
