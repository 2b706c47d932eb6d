#include "train/kto.h"

#include <math.h>
#include <string.h>

#include "core/check.h"
#include "dist/dist.h"
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
    build_mismatched_rows(&task->train, max_seq_len, &task->train_kl);
    build_mismatched_rows(&task->eval, max_seq_len, &task->eval_kl);
    task->pad_id = pad_id;
    task->options = *options;
    task->train_reference = response_sums_unknown(task->train.count);
    task->eval_reference = response_sums_unknown(task->eval.count);
    task->train_kl_reference = response_sums_unknown(task->train_kl.count);
    task->eval_kl_reference = response_sums_unknown(task->eval_kl.count);
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
    memset(task, 0, sizeof *task);
}

void kto_task_compute_reference(KtoTask *task, Model *reference) {
    response_logps_all(reference, &task->train, task->pad_id, task->train_reference);
    response_logps_all(reference, &task->eval, task->pad_id, task->eval_reference);
    response_logps_all(reference, &task->train_kl, task->pad_id, task->train_kl_reference);
    response_logps_all(reference, &task->eval_kl, task->pad_id, task->eval_kl_reference);
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

typedef struct {
    double loss, correct, tokens;
    double chosen_reward, chosen_count, rejected_reward, rejected_count;
} KtoStats;

// One forward over the examples' rows, their losses against the baseline kl, and (when
// train) the backward of scale * the summed loss.
static void kto_forward(const KtoTask *task, Model *model, const TokenizedExamples *rows, const double *reference,
                        const bool *desirable, const long *examples, int count, double kl, double scale, bool train,
                        KtoStats *stats) {
    ResponseBatch batch;
    response_batch_build(rows, examples, count, task->pad_id, &batch);
    double *sums = xmalloc((size_t)count * sizeof(double)), *d_sums = xmalloc((size_t)count * sizeof(double));
    response_batch_forward(model, &batch, sums);
    for (int b = 0; b < count; b++) {
        const long e = examples[b];
        CHECK(!isnan(reference[e]), "KTO reference log-probs were not computed");
        const double logratio = sums[b] - reference[e];
        stats->loss += kto_example_loss(&task->options, desirable[e], logratio, kl, &d_sums[b]);
        stats->correct += desirable[e] ? logratio > kl : logratio < kl;
        // TRL's implicit rewards: beta (policy - reference), the baseline not subtracted.
        if (desirable[e]) stats->chosen_reward += task->options.beta * logratio, stats->chosen_count += 1;
        else stats->rejected_reward += task->options.beta * logratio, stats->rejected_count += 1;
    }
    stats->tokens += (double)response_batch_tokens(&batch);
    if (train) response_batch_backward(model, &batch, d_sums, scale);
    free(sums), free(d_sums);
    response_batch_free(&batch);
}

static double kto_weight(void *context, const long *examples, int count) { return count; }

static void kto_micro_step(void *context, Model *model, const long *examples, int count, double scale,
                           MicroStepResult *result) {
    KtoTask *task = context;
    // The baseline of this micro-batch: its examples' mismatched rows under the current
    // policy (no gradient), against their reference sums.
    double *policy_kl = xmalloc((size_t)count * sizeof(double)), *reference_kl = xmalloc((size_t)count * sizeof(double));
    response_logps(model, &task->train_kl, examples, count, task->pad_id, policy_kl);
    for (int b = 0; b < count; b++) reference_kl[b] = task->train_kl_reference[examples[b]];
    const double kl = kl_baseline(policy_kl, reference_kl, count);
    free(policy_kl), free(reference_kl);
    KtoStats stats = {0};
    kto_forward(task, model, &task->train, task->train_reference, task->train_desirable, examples, count, kl, scale, true,
                &stats);
    result->loss_sum = stats.loss;
    result->weight = count;
    result->tokens = stats.tokens;
    result->metric_sums[0] = kl * count;
    result->metric_sums[1] = stats.correct;
}

static void kto_evaluate(void *context, Model *model, EvalResult *result) {
    KtoTask *task = context;
    const long n = task->eval.count;
    double *policy_kl = xmalloc((size_t)n * sizeof(double));
    response_logps_all(model, &task->eval_kl, task->pad_id, policy_kl);
    const double kl = kl_baseline(policy_kl, task->eval_kl_reference, n);
    free(policy_kl);
    KtoStats stats = {0};
    long examples[4];
    // Under mpirun each rank evaluates its share of the examples and the sums are added up.
    DistChunks chunks = dist_chunks(n, 4);
    for (int count; (count = dist_chunks_next(&chunks, examples)) > 0;)
        kto_forward(task, model, &task->eval, task->eval_reference, task->eval_desirable, examples, count, kl, 0.0, false,
                    &stats);
    double sums[6] = {stats.loss, stats.correct, stats.chosen_reward, stats.chosen_count, stats.rejected_reward,
                      stats.rejected_count};
    dist_sum_doubles(sums, 6);
    const char *names[] = {"loss", "kl", "accuracy", "chosen_reward", "rejected_reward"};
    const double values[] = {sums[0] / (double)n, kl, sums[1] / (double)n, sums[3] > 0 ? sums[2] / sums[3] : 0.0,
                             sums[5] > 0 ? sums[4] / sums[5] : 0.0};
    for (int i = 0; i < 5; i++) result->names[i] = names[i], result->values[i] = values[i];
    result->count = 5;
}

TrainTask kto_train_task(KtoTask *task) {
    return (TrainTask){
        .name = "kto",
        .num_examples = task->train.count,
        .metric_names = {"kl", "accuracy", NULL},
        .weight = kto_weight,
        .micro_step = kto_micro_step,
        .evaluate = task->eval.count > 0 ? kto_evaluate : NULL,
        .context = task,
    };
}
