#include "train/kto.h"

#include <math.h>
#include <string.h>

#include "core/check.h"
#include "dist/dist.h"
#include "dist/zero.h"
#include "train/response_logps.h"

// Tokenizes the examples that keep at least one completion token within max_seq_len, with
// their labels (*labels: count entries, the kept ones first).
static void tokenize_examples(KtoTask *task, const Tokenizer *tokenizer, const char *const *prompts,
                              const char *const *completions, const bool *desirable, long count, int max_seq_len,
                              TokenizedExamples *rows, bool **labels) {
    tokenized_examples_alloc(rows, count);
    *labels = xcalloc((size_t)(count > 0 ? count : 1), sizeof(bool));
    for (long i = 0; i < count; i++) {
        const long r = rows->count;
        bool truncated;
        tokenize_example(tokenizer, prompts[i], completions[i], max_seq_len, &rows->ids[r], &rows->lengths[r],
                         &rows->prompt_lengths[r], &truncated);
        if (rows->lengths[r] - rows->prompt_lengths[r] < 1) {
            task->dropped++;
            free(rows->ids[r]);
            continue;
        }
        task->truncated += truncated;
        (*labels)[r] = desirable[i];
        rows->count++;
    }
}

// Example i's prompt with example (i + 1) mod n's completion (its EOS included), cut at
// max_seq_len; at least one completion token is left because example i has one.
static void build_mismatched_rows(const TokenizedExamples *rows, int max_seq_len, TokenizedExamples *kl_rows) {
    const long n = rows->count;
    tokenized_examples_alloc(kl_rows, n);
    for (long i = 0; i < n; i++) {
        const long j = (i + 1) % n;
        const int prompt_length = rows->prompt_lengths[i];
        int completion_length = rows->lengths[j] - rows->prompt_lengths[j];
        if (prompt_length + completion_length > max_seq_len) completion_length = max_seq_len - prompt_length;
        int *ids = xmalloc((size_t)(prompt_length + completion_length) * sizeof(int));
        memcpy(ids, rows->ids[i], (size_t)prompt_length * sizeof(int));
        memcpy(ids + prompt_length, rows->ids[j] + rows->prompt_lengths[j], (size_t)completion_length * sizeof(int));
        kl_rows->ids[i] = ids;
        kl_rows->lengths[i] = prompt_length + completion_length;
        kl_rows->prompt_lengths[i] = prompt_length;
    }
    kl_rows->count = n;
}

static long count_true(const bool *values, long n) {
    long count = 0;
    for (long i = 0; i < n; i++) count += values[i];
    return count;
}

int kto_loss_from_name(const char *name, KtoLossKind *kind) {
    if (!strcmp(name, "kto")) *kind = KTO_LOSS_KTO;
    else if (!strcmp(name, "apo-zero-unpaired")) *kind = KTO_LOSS_APO_ZERO_UNPAIRED;
    else if (!strcmp(name, "bco")) *kind = KTO_LOSS_BCO;
    else return -1;
    return 0;
}

const char *kto_loss_name(KtoLossKind kind) {
    switch (kind) {
    case KTO_LOSS_APO_ZERO_UNPAIRED: return "apo-zero-unpaired";
    case KTO_LOSS_BCO: return "bco";
    case KTO_LOSS_KTO:
    default: return "kto";
    }
}

// Only KTO's loss has the KL baseline, and with it the mismatched rows.
static bool uses_kl_baseline(const KtoTask *task) { return task->options.loss == KTO_LOSS_KTO; }

int kto_task_from_rows(KtoTask *task, TokenizedExamples *train, bool *train_desirable, TokenizedExamples *eval,
                       bool *eval_desirable, int pad_id, int max_seq_len, const KtoLossOptions *options) {
    long dropped = task->dropped, truncated = task->truncated;
    memset(task, 0, sizeof *task);
    task->dropped = dropped, task->truncated = truncated;
    task->train = *train, task->eval = *eval;
    memset(train, 0, sizeof *train), memset(eval, 0, sizeof *eval);
    task->train_desirable = train_desirable, task->eval_desirable = eval_desirable;
    task->train_desirable_count = count_true(train_desirable, task->train.count);
    task->eval_desirable_count = count_true(eval_desirable, task->eval.count);
    task->pad_id = pad_id;
    task->options = *options;
    // Without the baseline (apo-zero-unpaired, bco) there are no mismatched rows at all:
    // nothing to score with the reference, nothing extra to run per micro-batch.
    if (uses_kl_baseline(task)) {
        build_mismatched_rows(&task->train, max_seq_len, &task->train_kl);
        build_mismatched_rows(&task->eval, max_seq_len, &task->eval_kl);
    }
    task->train_reference = response_sums_unknown(task->train.count);
    task->eval_reference = response_sums_unknown(task->eval.count);
    task->train_kl_reference = response_sums_unknown(task->train_kl.count);
    task->eval_kl_reference = response_sums_unknown(task->eval_kl.count);
    if (!uses_kl_baseline(task)) {
        if (task->train.count < 1) return err_set("no training example has a completion token within --max-seq-len");
        return 0;
    }
    if (task->train.count < 2)
        return err_set("KTO needs at least 2 training examples with a completion token within --max-seq-len (it has "
                       "%ld): its KL baseline pairs each prompt with another example's completion",
                       task->train.count);
    if (task->eval.count == 1)
        return err_set("KTO needs 0 or at least 2 evaluation examples with a completion token within --max-seq-len: "
                       "its KL baseline pairs each prompt with another example's completion");
    return 0;
}

int kto_task_init(KtoTask *task, const Tokenizer *tokenizer, const char *const *prompts, const char *const *completions,
                  const bool *desirable, long count, const char *const *eval_prompts,
                  const char *const *eval_completions, const bool *eval_desirable, long eval_count, int max_seq_len,
                  const KtoLossOptions *options) {
    memset(task, 0, sizeof *task);
    TokenizedExamples train, eval;
    bool *train_labels, *eval_labels;
    tokenize_examples(task, tokenizer, prompts, completions, desirable, count, max_seq_len, &train, &train_labels);
    tokenize_examples(task, tokenizer, eval_prompts, eval_completions, eval_desirable, eval_count, max_seq_len, &eval,
                      &eval_labels);
    return kto_task_from_rows(task, &train, train_labels, &eval, eval_labels, training_pad_id(tokenizer), max_seq_len,
                              options);
}

void kto_task_free(KtoTask *task) {
    tokenized_examples_free(&task->train), tokenized_examples_free(&task->eval);
    tokenized_examples_free(&task->train_kl), tokenized_examples_free(&task->eval_kl);
    free(task->train_desirable), free(task->eval_desirable);
    free(task->train_reference), free(task->eval_reference);
    free(task->train_kl_reference), free(task->eval_kl_reference);
    free(task->step_delta);
    memset(task, 0, sizeof *task);
}

void kto_task_compute_reference(KtoTask *task, Model *reference) {
    response_logps_all(reference, &task->train, task->pad_id, task->train_reference);
    response_logps_all(reference, &task->eval, task->pad_id, task->eval_reference);
    response_logps_all(reference, &task->train_kl, task->pad_id, task->train_kl_reference);
    response_logps_all(reference, &task->eval_kl, task->pad_id, task->eval_kl_reference);
    task->kl_rows_scored += task->train_kl.count + task->eval_kl.count;
}

// The baseline from the mismatched rows' policy and reference sums: max(0, mean(policy - reference)).
static double kl_baseline(const double *policy, const double *reference, long count) {
    double sum = 0.0;
    for (long i = 0; i < count; i++) {
        CHECK(!isnan(reference[i]), "KTO reference log-probs were not computed");
        sum += policy[i] - reference[i];
    }
    const double mean = count > 0 ? sum / (double)count : 0.0;
    return mean > 0.0 ? mean : 0.0;
}

// The log-ratios r = policy - reference of the examples' rows, from one forward over them
// (the batch stays built for a backward; the caller frees it).
static void kto_logratios(const KtoTask *task, Model *model, const TokenizedExamples *rows, const double *reference,
                          const long *examples, int count, ResponseBatch *batch, double *logratios) {
    response_batch_build(rows, examples, count, task->pad_id, batch);
    response_batch_forward(model, batch, logratios);
    for (int b = 0; b < count; b++) {
        CHECK(!isnan(reference[examples[b]]), "KTO reference log-probs were not computed");
        logratios[b] -= reference[examples[b]];
    }
}

// The sum of a micro-batch's rewards beta r, in batch order (the same bits wherever it is
// computed, so the delta of bco_begin_step is the delta of a micro-step on one process).
static double reward_sum(const KtoTask *task, const double *logratios, int count) {
    double sum = 0.0;
    for (int b = 0; b < count; b++) sum += task->options.beta * logratios[b];
    return sum;
}

// TRL's RunningMoments.update (trl/experimental/bco/bco_trainer.py), the part BCO reads: the
// mean of every reward seen so far, after a batch of `count` rewards summing to `sum`.
// Returns the new mean, the delta of that batch's loss.
static double bco_running_update(KtoTask *task, double sum, double count) {
    const double batch_mean = sum / count, total = task->bco_count + count;
    task->bco_mean += (batch_mean - task->bco_mean) * count / total;
    task->bco_count = total;
    return task->bco_mean;
}

typedef struct {
    double loss, correct, tokens;
    double chosen_reward, chosen_count, rejected_reward, rejected_count;
} KtoStats;

// The examples' losses against `baseline` (KTO's z0, BCO's delta, unused by
// apo-zero-unpaired), d loss / d r into d_logratios, and the statistics.
static void kto_losses(const KtoTask *task, const bool *desirable, const long *examples, int count,
                       const double *logratios, double baseline, double *d_logratios, KtoStats *stats) {
    const KtoLossOptions *o = &task->options;
    for (int b = 0; b < count; b++) {
        const bool good = desirable[examples[b]];
        const double r = logratios[b];
        stats->loss += kto_example_loss(o, good, r, baseline, &d_logratios[b]);
        // On its side of the baseline: the sign of the loss's own logit.
        const double margin = o->loss == KTO_LOSS_BCO ? o->beta * r - baseline
                              : o->loss == KTO_LOSS_KTO ? r - baseline
                                                        : r;
        stats->correct += good ? margin > 0 : margin < 0;
        // TRL's implicit rewards: beta (policy - reference), the baseline not subtracted.
        if (good) stats->chosen_reward += o->beta * r, stats->chosen_count += 1;
        else stats->rejected_reward += o->beta * r, stats->rejected_count += 1;
    }
}

static double kto_weight(void *context, const long *examples, int count) { return count; }

static void kto_micro_step(void *context, Model *model, const long *examples, int count, double scale,
                           MicroStepResult *result) {
    KtoTask *task = context;
    double baseline = 0.0;
    if (uses_kl_baseline(task)) {
        // The baseline of this micro-batch: its examples' mismatched rows under the current
        // policy (no gradient), against their reference sums.
        double *policy_kl = xmalloc((size_t)count * sizeof(double)), *reference_kl = xmalloc((size_t)count * sizeof(double));
        response_logps(model, &task->train_kl, examples, count, task->pad_id, policy_kl);
        for (int b = 0; b < count; b++) reference_kl[b] = task->train_kl_reference[examples[b]];
        baseline = kl_baseline(policy_kl, reference_kl, count);
        task->kl_rows_scored += count;
        free(policy_kl), free(reference_kl);
    }
    ResponseBatch batch;
    double *logratios = xmalloc((size_t)count * sizeof(double)), *d_logratios = xmalloc((size_t)count * sizeof(double));
    kto_logratios(task, model, &task->train, task->train_reference, examples, count, &batch, logratios);
    if (task->options.loss == KTO_LOSS_BCO) {
        // TRL adds the micro-batch's own rewards to the running mean before its loss. Under
        // mpirun bco_begin_step has done so for the whole step already.
        baseline = task->step_delta ? task->step_delta[examples[0]]
                                    : bco_running_update(task, reward_sum(task, logratios, count), count);
    }
    KtoStats stats = {0};
    kto_losses(task, task->train_desirable, examples, count, logratios, baseline, d_logratios, &stats);
    // r = policy - reference, so d loss / d (policy sum) = d loss / d r.
    response_batch_backward(model, &batch, d_logratios, scale);
    result->loss_sum = stats.loss;
    result->weight = count;
    result->tokens = (double)response_batch_tokens(&batch);
    if (task->options.loss == KTO_LOSS_APO_ZERO_UNPAIRED) {
        result->metric_sums[0] = stats.correct;
    } else {
        result->metric_sums[0] = baseline * count; // kl or delta
        result->metric_sums[1] = stats.correct;
    }
    free(logratios), free(d_logratios);
    response_batch_free(&batch);
}

// bco under mpirun (TrainTask.begin_step): micro-batch m of the step runs on rank m mod W,
// but its delta depends on the rewards of micro-batches 0..m, wherever they run. So every
// rank scores its own micro-batches first (one forward each, no backward), the reward sums
// are gathered, and the running mean is advanced micro-batch by micro-batch in step order,
// as one process with W times the accumulation advances it: each example gets its
// micro-batch's delta, and every rank ends the step with the same running mean.
static void bco_begin_step(void *context, Model *model, const long *examples, long count, long micro_batch) {
    KtoTask *task = context;
    const int world = dist_world_size(), rank = dist_rank();
    if (world == 1) return; // one process: each micro-step advances the mean itself, in order
    if (!task->step_delta) task->step_delta = response_sums_unknown(task->train.count);
    const long micro_count = (count + micro_batch - 1) / micro_batch;
    double *sums = xcalloc((size_t)micro_count, sizeof(double)); // per micro-batch: its reward sum
    double *logratios = xmalloc((size_t)micro_batch * sizeof(double));
    for (long m = rank; m < micro_count; m += world) {
        const long first = m * micro_batch;
        const int size = (int)(count - first < micro_batch ? count - first : micro_batch);
        ResponseBatch batch;
        kto_logratios(task, model, &task->train, task->train_reference, examples + first, size, &batch, logratios);
        response_batch_free(&batch);
        sums[m] = reward_sum(task, logratios, size);
    }
    dist_weights_drain(model); // ZeRO-3: every rank's forwards done before the sum (dist/zero.h)
    dist_sum_doubles(sums, micro_count); // the other ranks' entries are 0 here: x + 0 = x exactly
    for (long m = 0; m < micro_count; m++) {
        const long first = m * micro_batch;
        const long size = count - first < micro_batch ? count - first : micro_batch;
        const double delta = bco_running_update(task, sums[m], (double)size);
        for (long i = first; i < first + size; i++) task->step_delta[examples[i]] = delta;
    }
    free(sums), free(logratios);
}

static void kto_evaluate(void *context, Model *model, EvalResult *result) {
    KtoTask *task = context;
    const long n = task->eval.count;
    double baseline = 0.0;
    if (uses_kl_baseline(task)) {
        double *policy_kl = xmalloc((size_t)n * sizeof(double));
        response_logps_all(model, &task->eval_kl, task->pad_id, policy_kl);
        baseline = kl_baseline(policy_kl, task->eval_kl_reference, n);
        task->kl_rows_scored += n;
        free(policy_kl);
    } else if (task->options.loss == KTO_LOSS_BCO) {
        baseline = task->bco_mean; // TRL evaluates with do_train=False: the mean as it stands
    }
    KtoStats stats = {0};
    long examples[4];
    double logratios[4], d_logratios[4];
    // Under mpirun each rank evaluates its share of the examples and the sums are added up.
    DistChunks chunks = dist_chunks(n, 4);
    for (int count; (count = dist_chunks_next(&chunks, examples)) > 0;) {
        ResponseBatch batch;
        kto_logratios(task, model, &task->eval, task->eval_reference, examples, count, &batch, logratios);
        response_batch_free(&batch);
        kto_losses(task, task->eval_desirable, examples, count, logratios, baseline, d_logratios, &stats);
    }
    dist_weights_drain(model); // ZeRO-3: every rank's forwards done before the sum (dist/zero.h)
    double sums[6] = {stats.loss, stats.correct, stats.chosen_reward, stats.chosen_count, stats.rejected_reward,
                      stats.rejected_count};
    dist_sum_doubles(sums, 6);
    int k = 0;
    result->names[k] = "loss", result->values[k++] = sums[0] / (double)n;
    if (task->options.loss != KTO_LOSS_APO_ZERO_UNPAIRED)
        result->names[k] = uses_kl_baseline(task) ? "kl" : "delta", result->values[k++] = baseline;
    result->names[k] = "accuracy", result->values[k++] = sums[1] / (double)n;
    result->names[k] = "chosen_reward", result->values[k++] = sums[3] > 0 ? sums[2] / sums[3] : 0.0;
    result->names[k] = "rejected_reward", result->values[k++] = sums[5] > 0 ? sums[4] / sums[5] : 0.0;
    result->count = k;
}

// Trainer state: the loss (a checkpoint of one loss does not resume another) and, for bco,
// the running mean. JSON_REAL_PRECISION(17) in the checkpoint writes doubles exactly.
// With the reference computed in kto_prepare (the policy's starting weights, or
// --reference-model), its sums too (response_sums_save, keyed by the reference model's
// fingerprint), so --resume need not score the data again.
static void kto_save_state(void *context, json_t *state) {
    const KtoTask *task = context;
    json_object_set_new(state, "kto_loss", json_string(kto_loss_name(task->options.loss)));
    if (task->reference_from_policy || task->reference_fingerprint) {
        const uint64_t source = task->reference_fingerprint;
        response_sums_save(state, "kto_reference_train", &task->train, 0, source, task->train_reference);
        response_sums_save(state, "kto_reference_eval", &task->eval, 0, source, task->eval_reference);
        response_sums_save(state, "kto_reference_train_kl", &task->train_kl, 0, source, task->train_kl_reference);
        response_sums_save(state, "kto_reference_eval_kl", &task->eval_kl, 0, source, task->eval_kl_reference);
    }
    reference_sync_save_state(&task->sync, state);
    if (task->options.loss != KTO_LOSS_BCO) return;
    json_object_set_new(state, "bco_reward_mean", json_real(task->bco_mean));
    json_object_set_new(state, "bco_reward_count", json_real(task->bco_count));
}

// The reference's sums a checkpoint's trainer state kept for these rows and this reference
// (response_sums_load: the others stay unknown).
static void load_reference_sums(KtoTask *task, const json_t *state) {
    const uint64_t source = task->reference_fingerprint;
    response_sums_load(state, "kto_reference_train", &task->train, 0, source, task->train_reference);
    response_sums_load(state, "kto_reference_eval", &task->eval, 0, source, task->eval_reference);
    response_sums_load(state, "kto_reference_train_kl", &task->train_kl, 0, source, task->train_kl_reference);
    response_sums_load(state, "kto_reference_eval_kl", &task->eval_kl, 0, source, task->eval_kl_reference);
}

static int kto_load_state(void *context, const json_t *state, const char *checkpoint) {
    KtoTask *task = context;
    const char *saved = json_string_value(json_object_get(state, "kto_loss"));
    if (!saved) saved = "kto"; // written before there was a choice of loss
    const char *loss = kto_loss_name(task->options.loss);
    if (strcmp(saved, loss) != 0)
        return err_set("checkpoint was made with --loss %s, this run has --loss %s (%s)", saved, loss, checkpoint);
    // A reference that follows the policy resumes only such a run (its reference/ is the run's).
    if (reference_sync_check_state(&task->sync, state, checkpoint) != 0) return -1;
    // Missing or stale sums are computed again (kto_prepare).
    if (task->reference_from_policy) load_reference_sums(task, state);
    if (task->options.loss != KTO_LOSS_BCO) return 0;
    const json_t *mean = json_object_get(state, "bco_reward_mean"), *seen = json_object_get(state, "bco_reward_count");
    if (!json_is_number(mean) || !json_is_number(seen) || !(json_number_value(seen) >= 0))
        return err_set("checkpoint has no BCO running reward mean (bco_reward_mean, bco_reward_count) (%s)", checkpoint);
    task->bco_mean = json_number_value(mean);
    task->bco_count = json_number_value(seen);
    return 0;
}

static bool reference_known(const KtoTask *task) {
    return response_sums_known(task->train_reference, task->train.count) &&
           response_sums_known(task->eval_reference, task->eval.count) &&
           response_sums_known(task->train_kl_reference, task->train_kl.count) &&
           response_sums_known(task->eval_kl_reference, task->eval_kl.count);
}

// Unless a resumed run's checkpoint gave every sum back (kto_load_state, run before this).
static void kto_prepare(void *context, Model *model) {
    KtoTask *task = context;
    if (reference_known(task)) return;
    kto_task_compute_reference(task, model);
    model_release_activations(model); // sized for the reference's batches
}

// TR-DPO's update (--sync-ref-model): after it the reference scores every row again.
static void kto_after_step(void *context, Model *model, long step) {
    KtoTask *task = context;
    if (!reference_sync_after_step(&task->sync, model, step)) return;
    task->reference_fingerprint = response_reference_fingerprint(task->sync.model);
    kto_task_compute_reference(task, task->sync.model);
    model_release_activations(task->sync.model); // its scoring batches' memory, until the next update
}

void kto_task_reference_model(KtoTask *task, Model *reference, const TrainOptions *options) {
    task->reference_fingerprint = response_reference_fingerprint(reference);
    json_t *state = train_resume_state(options);
    if (state) {
        load_reference_sums(task, state);
        json_decref(state);
    }
    // Under mpirun the scoring is a collective: every rank scores unless every rank has the sums.
    if (dist_any_failed(!reference_known(task))) kto_task_compute_reference(task, reference);
}

// Micro-batches (the examples' rows, then as many mismatched rows for the KL baseline),
// evaluation chunks of 4 examples, and the evaluation's mismatched rows in chunks of 8
// (kto_evaluate, response_logps_all).
// The example's row, or its KL row where that is longer (both run in its micro-step).
static int kto_example_length(void *context, long example) {
    const KtoTask *task = context;
    const int own = task->train.lengths[example];
    const int kl = uses_kl_baseline(task) ? task->train_kl.lengths[example] : 0;
    return own > kl ? own : kl;
}

static void kto_largest_batch(void *context, long micro_batch, int *rows, int *length) {
    const KtoTask *task = context;
    int most = batch_rows(micro_batch, task->train.count);
    const int eval_rows = batch_rows(4, task->eval.count);
    const int eval_kl_rows = uses_kl_baseline(task) ? batch_rows(8, task->eval_kl.count) : 0;
    if (eval_rows > most) most = eval_rows;
    if (eval_kl_rows > most) most = eval_kl_rows;
    *rows = most;
    const TokenizedExamples *all[] = {&task->train, &task->eval, &task->train_kl, &task->eval_kl};
    *length = 0;
    for (int i = 0; i < 4; i++) {
        const int longest = tokenized_longest(all[i]);
        if (longest > *length) *length = longest;
    }
}

TrainTask kto_train_task(KtoTask *task) {
    TrainTask train = {
        .name = "kto",
        .num_examples = task->train.count,
        .metric_names = {"kl", "accuracy", NULL},
        .weight = kto_weight,
        .micro_step = kto_micro_step,
        .evaluate = task->eval.count > 0 ? kto_evaluate : NULL,
        .save_state = kto_save_state,
        .load_state = kto_load_state,
        .prepare = task->reference_from_policy ? kto_prepare : NULL,
        .largest_batch = kto_largest_batch,
        .example_length = kto_example_length,
        .after_step = task->sync.model ? kto_after_step : NULL,
        .checkpoint_model_name = task->sync.model ? REFERENCE_SYNC_FOLDER : NULL,
        .checkpoint_model = task->sync.model,
        .context = task,
    };
    if (task->options.loss == KTO_LOSS_APO_ZERO_UNPAIRED) train.metric_names[0] = "accuracy", train.metric_names[1] = NULL;
    if (task->options.loss == KTO_LOSS_BCO) train.metric_names[0] = "delta", train.begin_step = bco_begin_step;
    return train;
}
