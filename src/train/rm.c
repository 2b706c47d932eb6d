#include "train/rm.h"

#include <jansson.h>
#include <math.h>
#include <string.h>

#include "core/check.h"
#include "io/fs.h"
#include "io/jsonl.h"
#include "dist/dist.h"
#include "dist/zero.h"
#include "train/losses.h"

int rm_loss_from_name(const char *name, RmLossKind *kind) {
    if (!strcmp(name, "pairwise")) *kind = RM_LOSS_PAIRWISE;
    else if (!strcmp(name, "margin")) *kind = RM_LOSS_MARGIN;
    else if (!strcmp(name, "dschat")) *kind = RM_LOSS_DSCHAT;
    else if (!strcmp(name, "listwise")) *kind = RM_LOSS_LISTWISE;
    else return -1;
    return 0;
}

// *whole (xmalloc'd, per example): none of its rows was cut at max_seq_len.
static void tokenize_examples(const Tokenizer *tokenizer, int K, const char *const *prompts,
                              const char *const *responses, long count, int max_seq_len, TokenizedExamples *out,
                              unsigned char **whole) {
    long rows = count * K;
    tokenized_examples_alloc(out, rows);
    out->count = rows;
    *whole = xmalloc((size_t)(count > 0 ? count : 1));
    for (long i = 0; i < count; i++) {
        (*whole)[i] = 1;
        for (int k = 0; k < K; k++) {
            bool truncated;
            long r = i * K + k;
            tokenize_example(tokenizer, prompts[i], responses[r], max_seq_len, &out->ids[r], &out->lengths[r],
                             &out->prompt_lengths[r], &truncated);
            if (truncated) (*whole)[i] = 0;
        }
    }
}

int rm_task_init(RmTask *task, const Tokenizer *tokenizer, int K, const char *const *prompts,
                 const char *const *responses, const float *margins, long count, const char *const *eval_prompts,
                 const char *const *eval_responses, const float *eval_margins, long eval_count, int max_seq_len,
                 RmLossKind loss, float margin) {
    memset(task, 0, sizeof *task);
    if (K < 2) return err_set("a reward model needs at least two responses per prompt");
    if (loss != RM_LOSS_LISTWISE && K != 2) return err_set("--loss %s takes pairs; use --loss listwise for %d responses",
                                                            loss == RM_LOSS_DSCHAT ? "dschat" : "pairwise", K);
    if (count == 0) return err_set("no reward-model training examples");
    task->K = K;
    task->max_seq_len = max_seq_len;
    task->loss = loss;
    task->margin = margin;
    task->pad_id = training_pad_id(tokenizer);
    tokenize_examples(tokenizer, K, prompts, responses, count, max_seq_len, &task->train, &task->train_whole);
    tokenize_examples(tokenizer, K, eval_prompts, eval_responses, eval_count, max_seq_len, &task->eval,
                      &task->eval_whole);
    task->train_count = count;
    task->eval_count = eval_count;
    if (margins) {
        task->train_margins = xmalloc(count * sizeof(float));
        memcpy(task->train_margins, margins, count * sizeof(float));
    }
    if (eval_margins) {
        task->eval_margins = xmalloc((eval_count > 0 ? eval_count : 1) * sizeof(float));
        memcpy(task->eval_margins, eval_margins, eval_count * sizeof(float));
    }
    return 0;
}

void rm_task_free(RmTask *task) {
    tokenized_examples_free(&task->train);
    tokenized_examples_free(&task->eval);
    free(task->train_margins);
    free(task->eval_margins);
    free(task->train_whole);
    free(task->eval_whole);
    memset(task, 0, sizeof *task);
}

typedef struct {
    double loss, correct, chosen_sum, rejected_sum, tokens;
} RmStats;

// Rows of token ids as the model takes them: `count` rows padded with pad_id to the longest
// (or to pad_to when larger), or -- on a padding-free model (Model.packed_rows_only) -- one
// row of them side by side, each a segment attending to itself only. end[b]: the slot of row
// b's last token, where its score is read.
typedef struct {
    ModelBatch input;
    int *tokens, *row_len;
    ModelSegment *segments;
    long *end;
    long slots; // of the whole batch (the values' length)
} RmRows;

static void rm_rows_build(const Model *model, int *const *ids, const int *lengths, int count, int pad_to, int pad_id,
                          RmRows *rows) {
    memset(rows, 0, sizeof *rows);
    rows->end = xmalloc((size_t)count * sizeof(long));
    if (model->packed_rows_only) {
        CHECK(pad_to == 0, "padded reward-model rows on a padding-free model");
        for (int b = 0; b < count; b++) rows->slots += lengths[b];
        rows->tokens = xmalloc((size_t)rows->slots * sizeof(int));
        rows->row_len = xmalloc(sizeof(int));
        rows->segments = xmalloc((size_t)count * sizeof(ModelSegment));
        long at = 0;
        for (int b = 0; b < count; b++) {
            memcpy(rows->tokens + at, ids[b], (size_t)lengths[b] * sizeof(int));
            rows->segments[b] = (ModelSegment){0, (int)at, lengths[b]};
            at += lengths[b];
            rows->end[b] = at - 1;
        }
        rows->row_len[0] = (int)rows->slots;
        rows->input = (ModelBatch){.B = 1, .T = (int)rows->slots, .tokens = rows->tokens, .row_len = rows->row_len,
                                   .segments = rows->segments, .segment_count = count};
        return;
    }
    int T = pad_to;
    for (int b = 0; b < count; b++)
        if (lengths[b] > T) T = lengths[b];
    rows->slots = (long)count * T;
    rows->tokens = xmalloc((size_t)rows->slots * sizeof(int));
    rows->row_len = xmalloc((size_t)count * sizeof(int));
    for (int b = 0; b < count; b++) {
        for (int t = 0; t < T; t++) rows->tokens[(long)b * T + t] = t < lengths[b] ? ids[b][t] : pad_id;
        rows->row_len[b] = lengths[b];
        rows->end[b] = (long)b * T + lengths[b] - 1;
    }
    rows->input = (ModelBatch){.B = count, .T = T, .tokens = rows->tokens, .row_len = rows->row_len};
}

static void rm_rows_free(RmRows *rows) {
    free(rows->tokens), free(rows->row_len), free(rows->segments), free(rows->end);
    memset(rows, 0, sizeof *rows);
}

// One forward over the K rows of each example, the loss, and (if train) the backward.
static void rm_forward(RmTask *task, Model *model, const TokenizedExamples *examples, const float *margins,
                       const long *which, int count, double scale, bool train, RmStats *stats) {
    const int K = task->K, B = count * K;
    int **ids = xmalloc((size_t)B * sizeof(int *)), *lengths = xmalloc((size_t)B * sizeof(int));
    for (int e = 0; e < count; e++)
        for (int k = 0; k < K; k++) {
            ids[e * K + k] = examples->ids[which[e] * K + k];
            lengths[e * K + k] = examples->lengths[which[e] * K + k];
            stats->tokens += lengths[e * K + k];
        }
    RmRows rows;
    // DeepSpeed-Chat's span is defined on rows padded to max_seq_len.
    rm_rows_build(model, ids, lengths, B, task->loss == RM_LOSS_DSCHAT ? task->max_seq_len : 0, task->pad_id, &rows);
    const int T = rows.input.T; // (the dschat loss's padded rows)
    const int *tokens = rows.tokens;
    model_forward(model, &rows.input);
    float *values = xmalloc((size_t)rows.slots * sizeof(float)), *dvalue = xcalloc((size_t)rows.slots, sizeof(float));
    model_values(model, values);
    float *scores = xmalloc(B * sizeof(float)), *dscores = xcalloc(B, sizeof(float));
    for (int b = 0; b < B; b++) scores[b] = values[rows.end[b]];
    for (int e = 0; e < count; e++) {
        const float *s = scores + e * K;
        float *ds = dscores + e * K;
        float margin = margins ? margins[which[e]] : task->margin;
        switch (task->loss) {
        case RM_LOSS_PAIRWISE:
            stats->loss += rm_pairwise_loss(&s[0], &s[1], NULL, 1, (float)scale, &ds[0], &ds[1]);
            break;
        case RM_LOSS_MARGIN:
            stats->loss += rm_pairwise_loss(&s[0], &s[1], &margin, 1, (float)scale, &ds[0], &ds[1]);
            break;
        case RM_LOSS_LISTWISE:
            stats->loss += rm_listwise_loss(s, 1, K, (float)scale, ds);
            break;
        case RM_LOSS_DSCHAT: {
            const int *chosen = tokens + (long)(e * K) * T, *rejected = tokens + (long)(e * K + 1) * T;
            int divergence, end;
            rm_dschat_span(chosen, rejected, T, task->pad_id, &divergence, &end);
            stats->loss += rm_dschat_pair_loss(values + (long)(e * K) * T, values + (long)(e * K + 1) * T, divergence,
                                               end, (float)scale, dvalue + (long)(e * K) * T,
                                               dvalue + (long)(e * K + 1) * T);
            break;
        }
        }
        if (task->center_rewards > 0) { // (pairwise and margin: the command refuses the others)
            const double sum = (double)s[0] + s[1];
            stats->loss += task->center_rewards * sum * sum;
            const float d = (float)(scale * 2 * task->center_rewards * sum);
            ds[0] += d, ds[1] += d;
        }
        bool best_wins = true;
        for (int k = 1; k < K; k++) best_wins &= s[0] > s[k];
        stats->correct += best_wins;
        stats->chosen_sum += s[0];
        for (int k = 1; k < K; k++) stats->rejected_sum += s[k] / (K - 1);
    }
    if (train) {
        for (int b = 0; b < B; b++) dvalue[rows.end[b]] += dscores[b];
        model_backward(model, NULL, NULL, dvalue);
    }
    rm_rows_free(&rows);
    free(ids), free(lengths), free(values), free(dvalue), free(scores), free(dscores);
}

static double rm_weight(void *context, const long *examples, int count) { return count; }

static void rm_micro_step(void *context, Model *model, const long *examples, int count, double scale,
                          MicroStepResult *result) {
    RmTask *task = context;
    RmStats stats = {0};
    rm_forward(task, model, &task->train, task->train_margins, examples, count, scale, true, &stats);
    result->loss_sum = stats.loss;
    result->weight = count;
    result->tokens = stats.tokens;
    result->metric_sums[0] = stats.correct;
    result->metric_sums[1] = stats.chosen_sum;
    result->metric_sums[2] = stats.rejected_sum;
}

static void rm_evaluate(void *context, Model *model, EvalResult *result) {
    RmTask *task = context;
    RmStats stats = {0};
    long which[4];
    // Under mpirun each rank evaluates its share of the examples and the sums are added up.
    DistChunks chunks = dist_chunks(task->eval_count, 4);
    for (int n; (n = dist_chunks_next(&chunks, which)) > 0;)
        rm_forward(task, model, &task->eval, task->eval_margins, which, n, 0.0, false, &stats);
    dist_weights_drain(model); // ZeRO-3: every rank's forwards done before the sum (dist/zero.h)
    double sums[4] = {stats.correct, stats.chosen_sum, stats.rejected_sum, stats.loss};
    dist_sum_doubles(sums, 4);
    stats.correct = sums[0], stats.chosen_sum = sums[1], stats.rejected_sum = sums[2], stats.loss = sums[3];
    double n = task->eval_count;
    const char *names[] = {"accuracy", "chosen_score", "rejected_score", "loss"};
    double values[] = {stats.correct / n, stats.chosen_sum / n, stats.rejected_sum / n, stats.loss / n};
    for (int i = 0; i < 4; i++) result->names[i] = names[i], result->values[i] = values[i];
    result->count = n > 0 ? 4 : 0;
}

// REWARD_STATS_FILE into the final folder being written (rm.h).
static int rm_write_final(void *context, Model *model, const char *dir) {
    RmTask *task = context;
    const bool from_eval = task->eval_count > 0;
    const TokenizedExamples *examples = from_eval ? &task->eval : &task->train;
    const unsigned char *whole = from_eval ? task->eval_whole : task->train_whole;
    const long available = from_eval ? task->eval_count : task->train_count;
    const int K = task->K;
    // The first REWARD_STATS_EXAMPLES examples that were not cut, their rows side by side.
    long *indices = xmalloc((size_t)(available + 1) * sizeof(long)), n = 0, cut = 0;
    for (long i = 0; i < available && n < REWARD_STATS_EXAMPLES; i++) {
        if (whole[i]) indices[n++] = i;
        else cut++;
    }
    int **rows = xmalloc((size_t)(n * K + 1) * sizeof(int *)), *lengths = xmalloc((size_t)(n * K + 1) * sizeof(int));
    for (long e = 0; e < n; e++)
        for (int k = 0; k < K; k++) {
            rows[e * K + k] = examples->ids[indices[e] * K + k];
            lengths[e * K + k] = examples->lengths[indices[e] * K + k];
        }
    float *scores = xmalloc((size_t)(n * K + 1) * sizeof(float));
    rm_score_rows(model, rows, lengths, n * K, scores);
    json_t *chosen = json_array(), *rejected = json_array(), *index_list = json_array();
    long correct = 0;
    for (long i = 0; i < n; i++) {
        const float *s = scores + i * K;
        json_array_append_new(index_list, json_integer(indices[i]));
        bool best_wins = true;
        json_array_append_new(chosen, json_real(s[0]));
        for (int k = 1; k < K; k++) {
            json_array_append_new(rejected, json_real(s[k]));
            best_wins &= s[0] > s[k];
        }
        correct += best_wins;
    }
    json_t *stats = json_pack("{s:s, s:I, s:I, s:i, s:o, s:o, s:o, s:f}", "source", from_eval ? "eval" : "train",
                              "examples", (json_int_t)n, "cut_examples_left_out", (json_int_t)cut,
                              "responses_per_example", K, "indices", index_list, "chosen", chosen, "rejected", rejected,
                              "accuracy", n > 0 ? (double)correct / (double)n : 0.0);
    char *path = fs_join(dir, REWARD_STATS_FILE);
    int rc = json_write_file(path, stats, JSON_COMPACT);
    free(path), free(scores), free(rows), free(lengths), free(indices);
    json_decref(stats);
    return rc;
}

// Micro-batches, and evaluation chunks of 4 examples (rm_evaluate), of K rows an example;
// rows padded to max_seq_len under --loss dschat (rm_forward).
// The longest of the example's K rows (they run in one batch).
static int rm_example_length(void *context, long example) {
    const RmTask *task = context;
    int longest = 0;
    for (int k = 0; k < task->K; k++)
        if (task->train.lengths[example * task->K + k] > longest) longest = task->train.lengths[example * task->K + k];
    return longest;
}

// The most tokens `examples` examples of `task` hold together (their K rows in one row).
static int rm_longest_one_row(const RmTask *task, const TokenizedExamples *rows, long count, long examples) {
    int *sums = xcalloc((size_t)(count > 0 ? count : 1), sizeof(int));
    for (long i = 0; i < count; i++)
        for (int k = 0; k < task->K; k++) sums[i] += rows->lengths[i * task->K + k];
    const int longest = longest_one_row(sums, count, examples);
    free(sums);
    return longest;
}

static void rm_largest_batch(void *context, long micro_batch, int *rows, int *length) {
    const RmTask *task = context;
    if (task->padding_free) { // one row of a micro-batch's (or an evaluation chunk's) rows
        const int train = rm_longest_one_row(task, &task->train, task->train_count, micro_batch);
        const int eval = rm_longest_one_row(task, &task->eval, task->eval_count, 4);
        *rows = 1;
        *length = train > eval ? train : eval;
        return;
    }
    const int train_rows = task->K * batch_rows(micro_batch, task->train_count);
    const int eval_rows = task->K * batch_rows(4, task->eval_count);
    *rows = train_rows > eval_rows ? train_rows : eval_rows;
    const int train_longest = tokenized_longest(&task->train), eval_longest = tokenized_longest(&task->eval);
    *length = task->loss == RM_LOSS_DSCHAT ? task->max_seq_len
                                           : (train_longest > eval_longest ? train_longest : eval_longest);
}

TrainTask rm_train_task(RmTask *task) {
    return (TrainTask){
        .name = "rm",
        .num_examples = task->train_count,
        .metric_names = {"accuracy", "chosen_score", "rejected_score", NULL},
        .weight = rm_weight,
        .micro_step = rm_micro_step,
        .evaluate = task->eval_count > 0 ? rm_evaluate : NULL,
        .write_final = rm_write_final,
        .largest_batch = rm_largest_batch,
        .example_length = rm_example_length,
        .context = task,
    };
}

void rm_score_rows(Model *model, int *const *rows, const int *lengths, long count, float *scores) {
    const int chunk = 8;
    for (long first = 0; first < count; first += chunk) {
        const int B = count - first < chunk ? (int)(count - first) : chunk;
        RmRows batch;
        rm_rows_build(model, rows + first, lengths + first, B, 0, 0, &batch);
        model_forward(model, &batch.input);
        float *values = xmalloc((size_t)batch.slots * sizeof(float));
        model_values(model, values);
        for (int b = 0; b < B; b++) scores[first + b] = values[batch.end[b]];
        free(values);
        rm_rows_free(&batch);
    }
}
