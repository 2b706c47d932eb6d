#include "train/sft.h"

#include <limits.h>
#include <math.h>
#include <string.h>

#include "core/check.h"
#include "dist/dist.h"
#include "dist/zero.h"
#include "train/losses.h"

void tokenize_example(const Tokenizer *tokenizer, const char *prompt, const char *response, int max_seq_len,
                      int **ids, int *length, int *prompt_length, bool *truncated) {
    int *prompt_ids, prompt_count, *response_ids, response_count;
    tokenizer_encode(tokenizer, prompt, strlen(prompt), true, &prompt_ids, &prompt_count);
    tokenizer_encode(tokenizer, response, strlen(response), false, &response_ids, &response_count);
    int eos = tokenizer_eos_id(tokenizer);
    int total = prompt_count + response_count + (eos >= 0 ? 1 : 0);
    *truncated = total > max_seq_len;
    if (total > max_seq_len) total = max_seq_len;
    *ids = xmalloc((size_t)(total > 0 ? total : 1) * sizeof(int));
    int n = 0;
    for (int i = 0; i < prompt_count && n < total; i++) (*ids)[n++] = prompt_ids[i];
    for (int i = 0; i < response_count && n < total; i++) (*ids)[n++] = response_ids[i];
    if (eos >= 0 && n < total) (*ids)[n++] = eos;
    *length = n;
    *prompt_length = prompt_count < n ? prompt_count : n;
    free(prompt_ids);
    free(response_ids);
}

void tokenize_turns(const Tokenizer *tokenizer, const char *const *turns, int turn_count, int max_seq_len, int **ids,
                    unsigned char **trained, int *length, int *prompt_length, bool *truncated) {
    int **turn_ids = xmalloc((size_t)turn_count * sizeof *turn_ids), *turn_counts = xmalloc((size_t)turn_count * sizeof(int));
    const int eos = tokenizer_eos_id(tokenizer);
    int total = eos >= 0 ? 1 : 0;
    for (int k = 0; k < turn_count; k++) {
        tokenizer_encode(tokenizer, turns[k], strlen(turns[k]), k == 0, &turn_ids[k], &turn_counts[k]);
        total += turn_counts[k];
    }
    *truncated = total > max_seq_len;
    if (total > max_seq_len) total = max_seq_len;
    *ids = xmalloc((size_t)(total > 0 ? total : 1) * sizeof(int));
    *trained = xcalloc((size_t)(total > 0 ? total : 1), 1);
    int n = 0;
    *prompt_length = -1;
    for (int k = 0; k < turn_count; k++) {
        for (int i = 0; i < turn_counts[k] && n < total; i++) {
            if (k % 2 == 1 && *prompt_length < 0) *prompt_length = n;
            (*trained)[n] = k % 2 == 1;
            (*ids)[n++] = turn_ids[k][i];
        }
        free(turn_ids[k]);
    }
    if (eos >= 0 && n < total) {
        if (*prompt_length < 0) *prompt_length = n;
        (*trained)[n] = 1;
        (*ids)[n++] = eos;
    }
    if (*prompt_length < 0) *prompt_length = n;
    *length = n;
    free(turn_ids), free(turn_counts);
}

void tokenized_examples_free(TokenizedExamples *examples) {
    for (long i = 0; i < examples->count; i++) {
        free(examples->ids[i]);
        if (examples->trained) free(examples->trained[i]);
        if (examples->segment_lengths) free(examples->segment_lengths[i]);
    }
    free(examples->ids), free(examples->lengths), free(examples->prompt_lengths), free(examples->trained);
    free(examples->segment_counts), free(examples->segment_lengths);
    memset(examples, 0, sizeof *examples);
}

int longest_length(const int *lengths, long count) {
    int longest = 0;
    for (long i = 0; i < count; i++)
        if (lengths[i] > longest) longest = lengths[i];
    return longest;
}

int tokenized_longest(const TokenizedExamples *examples) { return longest_length(examples->lengths, examples->count); }

int batch_rows(long batch, long count) { return (int)(batch < count ? batch : count); }

void tokenized_examples_alloc(TokenizedExamples *examples, long capacity) {
    if (capacity < 1) capacity = 1;
    memset(examples, 0, sizeof *examples);
    examples->ids = xcalloc((size_t)capacity, sizeof(int *));
    examples->lengths = xcalloc((size_t)capacity, sizeof(int));
    examples->prompt_lengths = xcalloc((size_t)capacity, sizeof(int));
    examples->trained = xcalloc((size_t)capacity, sizeof(unsigned char *));
    examples->count = 0;
}

int training_pad_id(const Tokenizer *tokenizer) {
    const int pad = tokenizer_pad_id(tokenizer);
    if (pad >= 0) return pad;
    return tokenizer_eos_id(tokenizer) >= 0 ? tokenizer_eos_id(tokenizer) : 0;
}

// Whether position t of example i is a trained target (the loss predicts it from t - 1).
static bool trained_target(const TokenizedExamples *examples, long i, int t) {
    if (t >= examples->lengths[i]) return false;
    return examples->trained && examples->trained[i] ? examples->trained[i][t] : t >= examples->prompt_lengths[i];
}

// Tokenizes the examples, each cut at `limit` tokens.
static void tokenize_all(SftTask *task, const Tokenizer *tokenizer, const SftExample *examples, long count, int limit,
                         TokenizedExamples *out) {
    tokenized_examples_alloc(out, count);
    for (long i = 0; i < count; i++) {
        int *ids, length, prompt_length;
        unsigned char *trained = NULL;
        bool truncated;
        if (examples[i].turn_count > 0)
            tokenize_turns(tokenizer, examples[i].turns, examples[i].turn_count, limit, &ids, &trained, &length,
                           &prompt_length, &truncated);
        else
            tokenize_example(tokenizer, examples[i].prompt, examples[i].response, limit, &ids, &length, &prompt_length,
                             &truncated);
        if (task->loss_tokens != SFT_LOSS_COMPLETION) { // every token but the first is a target
            free(trained);
            trained = NULL;
            prompt_length = length < 1 ? length : 1;
        }
        // Keep an example only if at least one token is trained (a response token or EOS).
        if (length - prompt_length < 1 || length < 2) {
            task->dropped++;
            free(ids), free(trained);
            continue;
        }
        task->truncated += truncated;
        out->ids[out->count] = ids;
        out->trained[out->count] = trained;
        out->lengths[out->count] = length;
        out->prompt_lengths[out->count] = prompt_length;
        out->count++;
    }
}

// sft_task_init with the training examples cut at train_limit tokens (the evaluation's at
// max_seq_len).
static int task_init(SftTask *task, const Tokenizer *tokenizer, const SftExample *examples, long count,
                     const SftExample *eval_examples, long eval_count, int max_seq_len, SftLossTokens loss_tokens,
                     int train_limit, int eval_limit) {
    memset(task, 0, sizeof *task);
    task->max_seq_len = max_seq_len;
    task->loss_tokens = loss_tokens;
    task->pad_id = training_pad_id(tokenizer);
    tokenize_all(task, tokenizer, examples, count, train_limit, &task->train);
    tokenize_all(task, tokenizer, eval_examples, eval_count, eval_limit, &task->eval);
    if (task->train.count == 0) return err_set("no SFT example has a trained token within --max-seq-len %d", max_seq_len);
    return 0;
}

int sft_task_init(SftTask *task, const Tokenizer *tokenizer, const SftExample *examples, long count,
                  const SftExample *eval_examples, long eval_count, int max_seq_len, SftLossTokens loss_tokens) {
    return task_init(task, tokenizer, examples, count, eval_examples, eval_count, max_seq_len, loss_tokens,
                     max_seq_len, max_seq_len);
}

// Whether token t of example i is trained where sequences run one after another (a wrapped
// row): as in its own row, except that without completion-only loss every token is, the
// first one too -- TRL's labels there are the input ids, so an example's first token is
// predicted from the previous one's last (the first token of a row or segment never is).
static bool trained_in_stream(const SftTask *task, const TokenizedExamples *examples, long i, int t) {
    return task->loss_tokens == SFT_LOSS_SEQUENCE ? t < examples->lengths[i] : trained_target(examples, i, t);
}

// Packs `in` (the task's training or evaluation examples) into rows (train/packing.h): each
// row's pieces' ids and trained flags side by side, and for bfd and bfd_split the pieces as its
// segments. Returns the number of sequences packed.
static long pack_rows(const SftTask *task, TokenizedExamples *in, PackingStrategy strategy) {
    PackedRows packed;
    pack_sequences(in->lengths, in->count, task->max_seq_len, strategy, &packed);
    TokenizedExamples out;
    tokenized_examples_alloc(&out, packed.rows);
    const bool segmented = strategy != PACKING_WRAPPED;
    if (segmented) {
        out.segment_counts = xcalloc((size_t)(packed.rows > 0 ? packed.rows : 1), sizeof(int));
        out.segment_lengths = xcalloc((size_t)(packed.rows > 0 ? packed.rows : 1), sizeof(int *));
    }
    for (long r = 0; r < packed.rows; r++) {
        const long first = packed.row_first[r], end = packed.row_first[r + 1];
        int length = 0;
        for (long k = first; k < end; k++) length += packed.pieces[k].length;
        int *ids = xmalloc((size_t)length * sizeof(int));
        unsigned char *trained = xcalloc((size_t)length, 1);
        if (segmented) {
            out.segment_counts[r] = (int)(end - first);
            out.segment_lengths[r] = xmalloc((size_t)(end - first) * sizeof(int));
        }
        int at = 0;
        for (long k = first; k < end; k++) {
            const PackedPiece *piece = &packed.pieces[k];
            if (segmented) out.segment_lengths[r][k - first] = piece->length;
            for (int t = 0; t < piece->length; t++, at++) {
                ids[at] = in->ids[piece->sequence][piece->first + t];
                const bool starts = at == 0 || (segmented && t == 0); // nothing before it to predict it from
                trained[at] = !starts && trained_in_stream(task, in, piece->sequence, piece->first + t);
            }
        }
        out.ids[r] = ids;
        out.trained[r] = trained;
        out.lengths[r] = length;
        out.prompt_lengths[r] = 0; // (the trained flags say it)
        out.count++;
    }
    const long sequences = in->count;
    packed_rows_free(&packed);
    tokenized_examples_free(in);
    *in = out;
    return sequences;
}

int sft_task_init_packed(SftTask *task, const Tokenizer *tokenizer, const SftExample *examples, long count,
                         const SftExample *eval_examples, long eval_count, int max_seq_len, SftLossTokens loss_tokens,
                         PackingStrategy packing, bool pack_eval) {
    CHECK(loss_tokens != SFT_LOSS_PADDED, "packed rows with the padded loss");
    // bfd_split and wrapped split a long example between rows instead of cutting it.
    const int limit = packing == PACKING_BFD ? max_seq_len : INT_MAX / 2;
    if (task_init(task, tokenizer, examples, count, eval_examples, eval_count, max_seq_len, loss_tokens, limit,
                  pack_eval ? limit : max_seq_len) != 0)
        return -1;
    task->packed = true;
    task->packing = packing;
    task->sequences = pack_rows(task, &task->train, packing);
    if (pack_eval) {
        task->eval_packed = true;
        task->eval_sequences = pack_rows(task, &task->eval, packing);
    }
    return 0;
}

void sft_task_free(SftTask *task) {
    tokenized_examples_free(&task->train);
    tokenized_examples_free(&task->eval);
}

void sft_batch_build(const TokenizedExamples *examples, const long *which, int count, int pad_id, int pad_to,
                     bool one_row, SftBatch *batch) {
    CHECK(!(one_row && pad_to > 0), "a padded batch in one row");
    // Where each example goes: row b from slot 0, or (one_row) row 0 after the ones before it.
    int *row_of = xmalloc((size_t)count * sizeof(int)), *start_of = xmalloc((size_t)count * sizeof(int));
    int T = 0, segment_count = 0;
    for (int b = 0; b < count; b++) {
        const int length = examples->lengths[which[b]];
        row_of[b] = one_row ? 0 : b;
        start_of[b] = one_row ? T : 0;
        T = one_row ? T + length : (length > T ? length : T);
        segment_count += examples->segment_counts ? examples->segment_counts[which[b]] : 1;
    }
    const bool padded = pad_to > 0;
    if (padded) T = pad_to;
    const int B = one_row ? 1 : count;
    const long N = (long)B * T;
    batch->B = B;
    batch->T = T;
    batch->tokens = xmalloc((size_t)N * sizeof(int));
    batch->targets = xmalloc((size_t)N * sizeof(int));
    batch->row_len = xcalloc((size_t)B, sizeof(int));
    batch->mask = xcalloc((size_t)N, sizeof(float));
    for (long i = 0; i < N; i++) batch->tokens[i] = pad_id, batch->targets[i] = -1;
    // Segments where the rows hold several sequences: packed rows' own, or the examples of one row.
    const bool segmented = examples->segment_counts || one_row;
    batch->segments = segmented ? xmalloc((size_t)segment_count * sizeof(ModelSegment)) : NULL;
    batch->segment_count = segmented ? segment_count : 0;
    int s = 0;
    for (int b = 0; b < count; b++) {
        const long example = which[b];
        const int *ids = examples->ids[example];
        const int length = examples->lengths[example];
        int *row = batch->tokens + (long)row_of[b] * T + start_of[b];
        memcpy(row, ids, (size_t)length * sizeof(int));
        // In the released behaviour padding is real input (attended to), as it was there.
        batch->row_len[row_of[b]] = padded ? T : start_of[b] + length;
        const int slots = padded ? T : length; // this example's slots
        for (int t = 0; t < slots; t++) {
            const long i = (long)row_of[b] * T + start_of[b] + t;
            const bool counted = padded ? t + 1 < T : trained_target(examples, example, t + 1);
            // No target where the loss does not count: the LM head skips those slots.
            batch->targets[i] = counted ? row[t + 1] : -1;
            batch->mask[i] = counted ? 1.0f : 0.0f;
        }
        if (!segmented) continue;
        if (!examples->segment_counts) {
            batch->segments[s++] = (ModelSegment){row_of[b], start_of[b], length};
            continue;
        }
        for (int k = 0, at = start_of[b]; k < examples->segment_counts[example]; k++) {
            const int segment_length = examples->segment_lengths[example][k];
            batch->segments[s++] = (ModelSegment){row_of[b], at, segment_length};
            at += segment_length;
        }
    }
    free(row_of), free(start_of);
}

ModelBatch sft_batch_input(const SftBatch *batch) {
    return (ModelBatch){.B = batch->B, .T = batch->T, .tokens = batch->tokens, .row_len = batch->row_len,
                        .segments = batch->segments, .segment_count = batch->segment_count};
}

void sft_batch_free(SftBatch *batch) {
    free(batch->tokens), free(batch->targets), free(batch->row_len), free(batch->mask), free(batch->segments);
}

// The task's batch of `which` (its padding rule).
static void build_batch(const SftTask *task, const TokenizedExamples *examples, const long *which, int count,
                        SftBatch *batch) {
    sft_batch_build(examples, which, count, task->pad_id, task->loss_tokens == SFT_LOSS_PADDED ? task->max_seq_len : 0,
                    task->padding_free, batch);
}

static double counted_tokens(const SftTask *task, const TokenizedExamples *examples, const long *which, int count) {
    double total = 0;
    for (int b = 0; b < count; b++) {
        if (task->loss_tokens == SFT_LOSS_PADDED) total += task->max_seq_len - 1;
        else if (!examples->trained || !examples->trained[which[b]])
            total += examples->lengths[which[b]] - examples->prompt_lengths[which[b]];
        else
            for (int t = 0; t < examples->lengths[which[b]]; t++) total += examples->trained[which[b]][t];
    }
    return total;
}

// The summed token loss of the task's kind (train/losses.h): the NLL, or DFT's.
static double token_loss(const SftTask *task, const float *logp, const float *mask, long n, float scale, float *dlogp) {
    return task->dft ? sft_dft_loss(logp, mask, n, scale, dlogp) : sft_loss(logp, mask, n, scale, dlogp);
}

static double sft_weight(void *context, const long *examples, int count) {
    SftTask *task = context;
    return counted_tokens(task, &task->train, examples, count);
}

static void sft_micro_step(void *context, Model *model, const long *examples, int count, double scale,
                           MicroStepResult *result) {
    SftTask *task = context;
    SftBatch batch;
    build_batch(task, &task->train, examples, count, &batch);
    long N = (long)batch.B * batch.T;
    float *logp = xmalloc(N * sizeof(float)), *dlogp = xcalloc(N, sizeof(float));
    ModelBatch input = sft_batch_input(&batch);
    model_forward(model, &input);
    model_logprobs(model, batch.targets, logp, NULL, NULL);
    result->loss_sum = token_loss(task, logp, batch.mask, N, (float)scale, dlogp);
    result->weight = counted_tokens(task, &task->train, examples, count);
    for (int b = 0; b < batch.B; b++) result->tokens += batch.row_len[b];
    model_backward(model, dlogp, NULL, NULL);
    free(logp), free(dlogp);
    sft_batch_free(&batch);
}

static void sft_evaluate(void *context, Model *model, EvalResult *result) {
    SftTask *task = context;
    double loss = 0, tokens = 0;
    long which[8];
    // Under mpirun each rank evaluates its share of the examples and the sums are added up.
    DistChunks chunks = dist_chunks(task->eval.count, 8);
    for (int count; (count = dist_chunks_next(&chunks, which)) > 0;) {
        SftBatch batch;
        build_batch(task, &task->eval, which, count, &batch);
        long N = (long)batch.B * batch.T;
        float *logp = xmalloc(N * sizeof(float));
        ModelBatch input = sft_batch_input(&batch);
        model_forward(model, &input);
        model_logprobs(model, batch.targets, logp, NULL, NULL);
        loss += token_loss(task, logp, batch.mask, N, 0.0f, NULL);
        tokens += counted_tokens(task, &task->eval, which, count);
        free(logp);
        sft_batch_free(&batch);
    }
    dist_weights_drain(model); // ZeRO-3: every rank's forwards done before the sum (dist/zero.h)
    double sums[2] = {loss, tokens};
    dist_sum_doubles(sums, 2);
    loss = sums[0], tokens = sums[1];
    result->count = 0;
    if (tokens > 0) {
        result->names[0] = "loss";
        result->values[0] = loss / tokens;
        result->names[1] = "perplexity";
        result->values[1] = exp(loss / tokens);
        result->count = 2;
    }
}

// Micro-batches of up to micro_batch examples, evaluation chunks of up to 8 (sft_evaluate).
static int sft_example_length(void *context, long example) {
    const SftTask *task = context;
    return task->train.lengths[example];
}

int longest_one_row(const int *lengths, long count, long k) {
    int *sorted = xmalloc((size_t)(count > 0 ? count : 1) * sizeof(int));
    memcpy(sorted, lengths, (size_t)count * sizeof(int));
    long sum = 0;
    for (long taken = 0; taken < k && taken < count; taken++) { // k is a micro-batch: small
        long largest = taken;
        for (long i = taken + 1; i < count; i++)
            if (sorted[i] > sorted[largest]) largest = i;
        const int swap = sorted[taken];
        sorted[taken] = sorted[largest], sorted[largest] = swap;
        sum += sorted[taken];
    }
    free(sorted);
    return (int)sum;
}

static void sft_largest_batch(void *context, long micro_batch, int *rows, int *length) {
    const SftTask *task = context;
    if (task->padding_free) { // one row of a micro-batch's (or an evaluation chunk's) examples
        const int train = longest_one_row(task->train.lengths, task->train.count, micro_batch);
        const int eval = longest_one_row(task->eval.lengths, task->eval.count, 8);
        *rows = 1;
        *length = train > eval ? train : eval;
        return;
    }
    const int train_rows = batch_rows(micro_batch, task->train.count), eval_rows = batch_rows(8, task->eval.count);
    *rows = train_rows > eval_rows ? train_rows : eval_rows;
    const int train_longest = tokenized_longest(&task->train), eval_longest = tokenized_longest(&task->eval);
    *length = task->loss_tokens == SFT_LOSS_PADDED ? task->max_seq_len
                                                : (train_longest > eval_longest ? train_longest : eval_longest);
}

// --packing makes other examples of the same data: a resume must pack as the run it continues.
static const char *packing_of(const SftTask *task) { return task->packed ? packing_strategy_name(task->packing) : "none"; }

static void sft_save_state(void *context, json_t *state) {
    const SftTask *task = context;
    json_object_set_new(state, "packing", json_string(packing_of(task)));
    json_object_set_new(state, "sft_loss_type", json_string(task->dft ? "dft" : "nll"));
}

static int sft_load_state(void *context, const json_t *state, const char *checkpoint) {
    const SftTask *task = context;
    const char *saved = json_string_value(json_object_get(state, "packing"));
    if (!saved) saved = "none"; // a checkpoint from before --packing
    if (strcmp(saved, packing_of(task)) != 0)
        return err_set("checkpoint was made with packing %s, this run has %s (%s): other training rows", saved,
                       packing_of(task), checkpoint);
    const char *loss = json_string_value(json_object_get(state, "sft_loss_type"));
    if (!loss) loss = "nll"; // a checkpoint from before --loss-type
    if (strcmp(loss, task->dft ? "dft" : "nll") != 0)
        return err_set("checkpoint was made with --loss-type %s, this run has %s (%s)", loss, task->dft ? "dft" : "nll",
                       checkpoint);
    return 0;
}

TrainTask sft_train_task(SftTask *task) {
    return (TrainTask){
        .save_state = sft_save_state,
        .load_state = sft_load_state,
        .name = "sft",
        .num_examples = task->train.count,
        .weight = sft_weight,
        .micro_step = sft_micro_step,
        .evaluate = task->eval.count > 0 ? sft_evaluate : NULL,
        .largest_batch = sft_largest_batch,
        .example_length = sft_example_length,
        .context = task,
    };
}
