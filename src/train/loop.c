#include "train/loop.h"

#include <math.h>
#include <string.h>

#include "core/check.h"
#include "core/progress.h"
#include "core/rng.h"
#include "core/timer.h"
#include "dist/dist.h"
#include "dist/model_sync.h"
#include "dist/zero.h"
#include "io/fs.h"
#include "model/lora.h"
#include "model/weights_io.h"
#include "train/adamw.h"
#include "train/checkpoint.h"
#include "train/metrics.h"

TrainOptions train_default_options(void) {
    return (TrainOptions){
        .learning_rate = 5e-5,
        .schedule = LR_COSINE,
        .warmup_ratio = 0.1,
        .warmup_steps = -1,
        .epochs = 1,
        .micro_batch = 4,
        .grad_accum = 1,
        .clip_norm = 1.0,
        .weight_decay = 0.01,
        .beta1 = 0.9,
        .beta2 = 0.95,
        .eps = 1e-8,
        .keep_last = 2,
        .log_every = 1,
        .seed = 1234,
    };
}

void train_epoch_order(uint64_t seed, long epoch, long n, long *order) {
    for (long i = 0; i < n; i++) order[i] = i;
    uint64_t stream = rng_stream("epoch-order", (uint64_t)epoch, 0);
    for (long i = n - 1; i > 0; i--) {
        long j = (long)rng_below(seed, stream, (uint64_t)i, (uint64_t)i + 1);
        long t = order[i];
        order[i] = order[j];
        order[j] = t;
    }
}

// Each megabatch's examples, longest first; equal lengths keep their order (insertion sort:
// stable, and a megabatch holds at most 50 optimizer steps' examples).
static void sort_longest_first(long *examples, long count, const int *lengths) {
    for (long i = 1; i < count; i++) {
        const long example = examples[i];
        long j = i;
        while (j > 0 && lengths[examples[j - 1]] < lengths[example]) {
            examples[j] = examples[j - 1];
            j--;
        }
        examples[j] = example;
    }
}

void train_group_by_length(long *order, long n, const int *lengths, long batch) {
    if (n <= 0 || batch <= 0) return;
    long multiple = n / (batch * 4);
    if (multiple > 50) multiple = 50;
    if (multiple < 1) multiple = 1;
    const long megabatch = multiple * batch;
    long longest_megabatch = 0;
    for (long start = 0; start < n; start += megabatch) {
        sort_longest_first(order + start, n - start < megabatch ? n - start : megabatch, lengths);
        if (lengths[order[start]] > lengths[order[longest_megabatch]]) longest_megabatch = start;
    }
    const long first = order[0];
    order[0] = order[longest_megabatch];
    order[longest_megabatch] = first;
}

static long state_integer(json_t *state, const char *key, long fallback) {
    json_t *value = json_object_get(state, key);
    return json_is_integer(value) ? (long)json_integer_value(value) : fallback;
}

// The name of the first parameter whose gradient holds a NaN or infinity (for the error).
static const char *first_nonfinite_gradient(const Model *model) {
    model_settle_gradients(model);
    for (int i = 0; i < model->table.count; i++) {
        const ParamEntry *e = &model->table.entries[i];
        if (e->offset < model->trainable_offset) continue; // frozen: no gradient
        if (!isfinite(model->ops->sum_squares(model->grads + (e->offset - model->trainable_offset), e->numel)))
            return e->name;
    }
    return "none";
}

typedef struct {
    long step, epoch, cursor; // optimizer steps done; epoch in progress; micro-batches done in it
} LoopState;

static int save_checkpoint(const TrainTask *task, const Model *model, const AdamW *optimizer,
                           const Tokenizer *tokenizer, const TrainOptions *options, const LoopState *s) {
    json_t *state = json_object();
    json_object_set_new(state, "task", json_string(task->name));
    json_object_set_new(state, "epoch", json_integer(s->epoch));
    json_object_set_new(state, "cursor", json_integer(s->cursor));
    json_object_set_new(state, "seed", json_integer((json_int_t)options->seed));
    json_object_set_new(state, "group_by_length", json_boolean(options->group_by_length));
    json_object_set_new(state, "num_examples", json_integer(task->num_examples));
    json_object_set_new(state, "world_size", json_integer(dist_world_size()));
    json_object_set_new(state, "lora_rank", json_integer(model->lora.rank));
    json_object_set_new(state, "lora_dropout", json_real(model->lora.dropout));
    json_object_set_new(state, "neftune_noise_alpha", json_real(model->neftune_noise_alpha));
    checkpoint_record_batch_invariant(state, model->ops);
    if (task->save_state) task->save_state(task->context, state);
    CheckpointModel entries[2] = {{"", model, optimizer}, {task->checkpoint_model_name, task->checkpoint_model, NULL}};
    int rc = checkpoint_save(options->run_dir, s->step, entries, task->checkpoint_model ? 2 : 1, tokenizer, state,
                             (int)options->keep_last);
    json_decref(state);
    return rc;
}

static void run_evaluation(const TrainTask *task, Model *model, MetricsWriter *metrics, long step, bool quiet) {
    if (!task->evaluate) return;
    EvalResult result = {0};
    task->evaluate(task->context, model, &result);
    metrics_log(metrics, "eval", step, result.names, result.values, result.count);
    if (!quiet) {
        fprintf(stderr, "\neval at step %ld:", step);
        for (int i = 0; i < result.count; i++) fprintf(stderr, " %s %.4f", result.names[i], result.values[i]);
        fprintf(stderr, "\n");
    }
}

// The sums of a step's micro-batch results over every rank's share of them.
static void sum_across_ranks(MicroStepResult *total) {
    double packed[7] = {total->loss_sum, total->weight, total->tokens};
    for (int k = 0; k < 4; k++) packed[3 + k] = total->metric_sums[k];
    dist_sum_doubles(packed, 7);
    total->loss_sum = packed[0], total->weight = packed[1], total->tokens = packed[2];
    for (int k = 0; k < 4; k++) total->metric_sums[k] = packed[3 + k];
}

json_t *train_resume_state(const TrainOptions *options) {
    char *checkpoint = options->resume ? checkpoint_latest(options->run_dir) : NULL;
    json_t *state = NULL;
    if (checkpoint && checkpoint_load_state(checkpoint, &state) != 0) state = NULL;
    free(checkpoint);
    return state;
}

int train_run(const TrainTask *task, Model *model, const Tokenizer *tokenizer, const TrainOptions *options) {
    const long n = task->num_examples;
    if (n <= 0) return err_set("no training examples");
    if (options->group_by_length && !task->example_length)
        return err_set("the %s trainer's examples are not grouped by length (--group-by-length)", task->name);
    // Data parallel (dist/dist.h): an optimizer step takes grad_accum micro-batches on
    // each of the W ranks, as DeepSpeed's global batch = micro batch x accumulation x W.
    // Rank r runs micro-batches r, r + W, ... of the step; the gradients are then summed.
    const int world = dist_world_size(), rank = dist_rank();
    const long micro_per_step = options->grad_accum * world;
    const long per_step = options->micro_batch * micro_per_step;
    const long steps_per_epoch = (n + per_step - 1) / per_step;
    long total_steps = steps_per_epoch * options->epochs;
    if (options->max_steps > 0 && options->max_steps < total_steps) total_steps = options->max_steps;
    LrSchedule schedule = {
        .kind = options->schedule,
        .peak_lr = (float)options->learning_rate,
        .warmup_steps = options->warmup_steps >= 0 ? options->warmup_steps
                                                   : lr_warmup_steps_from_ratio(options->warmup_ratio, total_steps),
        .total_steps = total_steps,
    };

    model_enable_grad(model);
    AdamW optimizer;
    dist_adamw_init(&optimizer, model,
                    (AdamWConfig){(float)options->beta1, (float)options->beta2, (float)options->eps,
                                  (float)options->weight_decay},
                    options->zero_stage);
    // Every rank starts from rank 0's weights (they loaded the same files; this makes sure).
    // Under ZeRO-3 each rank keeps its shard of the layers from here.
    dist_weights_start(model);
    if (options->start_adapter) {
        // Every rank reads the same file (the adapters are whole on each), checked against the
        // fingerprint of the sharded base that the start took.
        const int rc = lora_read_adapter(model, options->start_adapter);
        if (dist_any_failed(rc != 0)) {
            dist_adamw_free(&optimizer, model);
            return rc != 0 ? -1 : err_set("another rank could not read the LoRA adapter %s", options->start_adapter);
        }
    }
    // A resume reads the checkpoint's trainer state first, its weights last: between them the
    // task's preparation runs on the starting weights (DPO's and KTO's reference log-probs,
    // unless the state gave them back) and the activations are sized for the largest batch.
    LoopState s = {0};
    char *checkpoint = options->resume ? checkpoint_latest(options->run_dir) : NULL;
    json_t *state = NULL;
    {
        int rc = 0;
        if (checkpoint) {
            rc = checkpoint_load_state(checkpoint, &state);
            if (rc == 0 && state_integer(state, "num_examples", -1) != n)
                rc = err_set("checkpoint was made with %ld examples, this run has %ld (%s)",
                             state_integer(state, "num_examples", -1), n, checkpoint);
            // The step size in examples depends on the process count; resuming with another
            // would silently change the data order and the schedule.
            if (rc == 0 && state_integer(state, "world_size", 1) != world)
                rc = err_set("checkpoint was made by %ld processes, this run has %d (%s): resume with mpirun -np %ld",
                             state_integer(state, "world_size", 1), world, checkpoint,
                             state_integer(state, "world_size", 1));
            // A LoRA checkpoint holds adapters for the base given with --model; a full one
            // holds every weight. Mixing them would train the wrong thing.
            if (rc == 0 && state_integer(state, "lora_rank", 0) != model->lora.rank)
                rc = err_set("checkpoint was made with --lora-rank %ld, this run has %d (%s)",
                             state_integer(state, "lora_rank", 0), model->lora.rank, checkpoint);
            // Masks are drawn from the micro-batch's place in the run, so the same dropout
            // continues the same run; another would not be the run that was saved.
            if (rc == 0 && fabs(json_number_value(json_object_get(state, "lora_dropout")) - model->lora.dropout) > 1e-9)
                rc = err_set("checkpoint was made with --lora-dropout %g, this run has %g (%s)",
                             json_number_value(json_object_get(state, "lora_dropout")), model->lora.dropout, checkpoint);
            // NEFTune's noise is drawn the same way (0 in checkpoints from before the option).
            const double neftune = json_number_value(json_object_get(state, "neftune_noise_alpha"));
            if (rc == 0 && fabs(neftune - model->neftune_noise_alpha) > 1e-9)
                rc = err_set("checkpoint was made with --neftune-noise-alpha %g, this run has %g (%s)", neftune,
                             model->neftune_noise_alpha, checkpoint);
            // The data order of every epoch depends on it.
            if (rc == 0 && json_is_true(json_object_get(state, "group_by_length")) != options->group_by_length)
                rc = err_set("checkpoint was made with --group-by-length %s, this run has %s (%s): another data order",
                             options->group_by_length ? "false" : "true", options->group_by_length ? "true" : "false",
                             checkpoint);
            if (rc == 0) rc = checkpoint_check_batch_invariant(state, model->ops, checkpoint);
            if (rc == 0 && task->load_state) rc = task->load_state(task->context, state, checkpoint);
        }
        // Every rank stops here together (the preparation's forwards are collectives under
        // ZeRO-3), the one that failed with its own error.
        const bool failed = dist_any_failed(rc != 0);
        if (!failed) {
            if (task->prepare) task->prepare(task->context, model);
            if (task->largest_batch) {
                int rows = 0, length = 0;
                task->largest_batch(task->context, options->micro_batch, &rows, &length);
                // A padding-free model runs a batch's rows side by side in one row: at most
                // rows x length slots (SFT gives its exact row).
                if (model->packed_rows_only && rows > 1) length *= rows, rows = 1;
                if (rows > 0 && length > 0) model_reserve(model, rows, length);
            }
        } else if (rc == 0) {
            rc = err_set("another process could not resume from %s", checkpoint ? checkpoint : options->run_dir);
        }
        if (rc == 0 && checkpoint) {
            rc = model_reload_weights(model, checkpoint, dist_weights_sharded(model) ? dist_weights_load_range : NULL);
            if (rc == 0) rc = checkpoint_load_optimizer(checkpoint, "", model, &optimizer);
            if (rc == 0) {
                s.step = state_integer(state, "step", 0);
                s.epoch = state_integer(state, "epoch", 0);
                s.cursor = state_integer(state, "cursor", 0);
                if (!options->quiet) fprintf(stderr, "resuming from %s (step %ld)\n", checkpoint, s.step);
            }
        }
        json_decref(state);
        free(checkpoint);
        if (rc != 0) {
            dist_adamw_free(&optimizer, model);
            return -1;
        }
    }
    // A resumed run's weights are rank 0's everywhere too (every rank asks, so the
    // collective matches whether or not this rank found a checkpoint).
    if (options->resume) dist_weights_start(model);
    MetricsWriter metrics;
    if (dist_is_main()) {
        if (dist_any_failed(metrics_open(&metrics, options->run_dir, options->resume ? s.step : -1) != 0)) {
            dist_adamw_free(&optimizer, model);
            return -1;
        }
    } else {
        metrics_open_none(&metrics);
        if (dist_any_failed(false)) {
            dist_adamw_free(&optimizer, model);
            return err_set("rank 0 could not open the metrics of %s", options->run_dir);
        }
    }

    long *order = xmalloc((size_t)n * sizeof(long));
    long order_epoch = -1;
    int *lengths = NULL; // --group-by-length: each example's length
    if (options->group_by_length) {
        lengths = xmalloc((size_t)n * sizeof(int));
        for (long i = 0; i < n; i++) lengths[i] = task->example_length(task->context, i);
    }
    const long micro_batches_per_epoch = (n + options->micro_batch - 1) / options->micro_batch;
    Progress progress;
    progress_start(&progress, task->name, total_steps, "steps");
    progress.done = s.step;
    progress.quiet = options->quiet;
    // The starting point's held-out figures, so every run shows what training changed.
    if (s.step == 0) run_evaluation(task, model, &metrics, 0, options->quiet);
    double tokens_since_log = 0, time_at_log = now_seconds();
    int rc = 0;
    while (s.step < total_steps) {
        if (order_epoch != s.epoch) {
            train_epoch_order(options->seed, s.epoch, n, order);
            if (lengths) train_group_by_length(order, n, lengths, per_step);
            order_epoch = s.epoch;
        }
        // The micro-batches of this optimizer step (the last step of an epoch may be short).
        long first_micro = s.cursor;
        long micro_count = micro_per_step;
        if (first_micro + micro_count > micro_batches_per_epoch) micro_count = micro_batches_per_epoch - first_micro;
        double step_weight = 0;
        for (long m = 0; m < micro_count; m++) {
            long start = (first_micro + m) * options->micro_batch;
            long count = n - start < options->micro_batch ? n - start : options->micro_batch;
            step_weight += task->weight(task->context, order + start, (int)count);
        }
        if (task->begin_step && step_weight > 0) {
            const long start = first_micro * options->micro_batch;
            const long end = (first_micro + micro_count) * options->micro_batch;
            task->begin_step(task->context, model, order + start, (end < n ? end : n) - start, options->micro_batch);
        }
        dist_zero_grad(model);
        MicroStepResult total = {0};
        // In rounds of one micro-batch per rank (ZeRO stage 2 sums gradients in every
        // backward, so every rank takes part in each round's, dist/zero.h); the last round
        // of a step may leave some ranks without one.
        const long rounds = step_weight > 0 ? (micro_count + world - 1) / world : 0;
        for (long round = 0; round < rounds; round++) {
            const long m = round * world + rank;
            dist_backward_round_begin(model, round == rounds - 1);
            MicroStepResult r = {0};
            if (m < micro_count) {
                long start = (first_micro + m) * options->micro_batch;
                long count = n - start < options->micro_batch ? n - start : options->micro_batch;
                model_training_pass_begin(model, options->seed, (uint64_t)s.epoch, (uint64_t)(first_micro + m));
                task->micro_step(task->context, model, order + start, (int)count, 1.0 / step_weight, &r);
                model_training_pass_end(model);
            }
            dist_backward_round_end(model);
            total.loss_sum += r.loss_sum;
            total.weight += r.weight;
            total.tokens += r.tokens;
            for (int k = 0; k < 4; k++) total.metric_sums[k] += r.metric_sums[k];
        }
        double norm = dist_reduce_gradients(model, &optimizer);
        sum_across_ranks(&total);
        float lr = lr_schedule_at(&schedule, s.step);
        if (!isfinite(norm)) {
            rc = err_set("gradient norm is %g at step %ld (first non-finite gradient: %s): training diverged "
                         "(lower --learning-rate?)", norm, s.step, first_nonfinite_gradient(model));
            break;
        }
        dist_adamw_step(&optimizer, model, lr, grad_clip_coefficient(norm, (float)options->clip_norm));
        s.step++;
        if (task->after_step) task->after_step(task->context, model, s.step);
        s.cursor += micro_count;
        bool epoch_done = s.cursor >= micro_batches_per_epoch;
        if (epoch_done) s.epoch++, s.cursor = 0;

        tokens_since_log += total.tokens;
        double loss = total.weight > 0 ? total.loss_sum / total.weight : 0;
        if (options->log_every > 0 && (s.step % options->log_every == 0 || s.step == total_steps)) {
            double elapsed = now_seconds() - time_at_log;
            const char *names[10] = {"loss", "learning_rate", "grad_norm", "tokens_per_s", "epoch"};
            double values[10] = {loss, lr, norm, elapsed > 0 ? tokens_since_log / elapsed : 0,
                                 s.epoch + (double)s.cursor / micro_batches_per_epoch};
            int count = 5;
            for (int k = 0; k < 4 && task->metric_names[k]; k++) {
                names[count] = task->metric_names[k];
                values[count++] = total.weight > 0 ? total.metric_sums[k] / total.weight : 0;
            }
            // On a GPU, the most device memory since the last line (the largest rank's; every
            // rank runs on the same kind of device, so all of them take this branch or none).
            int device_mib = ops_take_device_memory_peak_mib(model->ops);
            if (device_mib >= 0) {
                dist_max_ints(&device_mib, 1);
                names[count] = "device_memory_gib", values[count++] = device_mib / 1024.0;
            }
            if (dist_any_failed(metrics_log(&metrics, "train", s.step, names, values, count) != 0)) {
                rc = dist_is_main() ? -1 : err_set("rank 0 could not write the metrics of %s", options->run_dir);
                break;
            }
            tokens_since_log = 0;
            time_at_log = now_seconds();
        }
        char status[96];
        snprintf(status, sizeof status, "loss %.4f, lr %.2e", loss, lr);
        progress_update(&progress, 1, status);
        bool last = s.step == total_steps;
        if ((options->eval_every > 0 && s.step % options->eval_every == 0) || epoch_done || last)
            run_evaluation(task, model, &metrics, s.step, options->quiet);
        if ((options->save_every > 0 && s.step % options->save_every == 0) || last) {
            // Rank 0 writes; the others hand it their moments' shards meanwhile (dist/zero.h),
            // and under ZeRO-3 their shards of the layers' weights.
            bool failed = false;
            if (dist_is_main()) {
                failed = save_checkpoint(task, model, &optimizer, tokenizer, options, &s) != 0;
                dist_serving_end();
            } else {
                const AdamW *optimizers[1] = {&optimizer};
                const Model *models[1] = {model};
                dist_serve_shards(optimizers, 1, models, 1);
            }
            if (dist_any_failed(failed)) {
                rc = failed ? -1 : err_set("rank 0 could not save a checkpoint in %s", options->run_dir);
                break;
            }
        }
    }
    progress_finish(&progress, NULL);
    // Same gradients and the same AdamW step on every rank keep the weights identical; a
    // difference here is a bug (a collective that did not give every rank the same bits).
    // Under ZeRO-3 each layer weight has one owner, so there is nothing to compare.
    if (rc == 0 && world > 1 && !dist_weights_sharded(model))
        CHECK(dist_all_equal(model_weights_fingerprint(model)), "ranks ended training with different weights");
    // The final model is written by rank 0, with every weight (ZeRO-3: gathered to it, once
    // the moments, which the run no longer needs, have given their memory back).
    if (rc == 0 && dist_weights_sharded(model)) {
        adamw_free(&optimizer);
        dist_weights_gather_to_main(model);
    }
    if (rc == 0 && dist_is_main()) {
        char *final_dir = fs_join(options->run_dir, "final");
        FsAtomicDir out;
        rc = fs_atomic_dir_begin(&out, final_dir);
        if (rc == 0) {
            rc = model_write_hf_files(model, out.tmp_path);
            if (rc == 0 && tokenizer) rc = tokenizer_write_hf(tokenizer, out.tmp_path);
            if (rc == 0 && task->write_final) rc = task->write_final(task->context, model, out.tmp_path);
            if (rc == 0) rc = fs_atomic_dir_commit(&out);
            else fs_atomic_dir_abort(&out);
        }
        free(final_dir);
    }
    if (world > 1 && dist_any_failed(rc != 0) && rc == 0)
        rc = err_set("rank 0 could not write the final model in %s/final", options->run_dir);
    free(order), free(lengths);
    metrics_close(&metrics);
    dist_adamw_free(&optimizer, model);
    return rc;
}
