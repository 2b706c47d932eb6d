#include "train/dpo.h"

#include <math.h>
#include <string.h>

#include "core/check.h"
#include "dist/dist.h"
#include "dist/zero.h"
#include "train/response_logps.h"

int dpo_loss_from_name(const char *name, DpoLossKind *kind) {
    if (!strcmp(name, "sigmoid")) *kind = DPO_LOSS_SIGMOID;
    else if (!strcmp(name, "ipo")) *kind = DPO_LOSS_IPO;
    else if (!strcmp(name, "hinge")) *kind = DPO_LOSS_HINGE;
    else if (!strcmp(name, "simpo")) *kind = DPO_LOSS_SIMPO;
    else if (!strcmp(name, "orpo")) *kind = DPO_LOSS_ORPO;
    else if (!strcmp(name, "cpo")) *kind = DPO_LOSS_CPO;
    else if (!strcmp(name, "cpo-hinge") || !strcmp(name, "cpo_hinge")) *kind = DPO_LOSS_CPO_HINGE;
    else if (!strcmp(name, "cpo-ipo") || !strcmp(name, "cpo_ipo")) *kind = DPO_LOSS_CPO_IPO;
    else if (!strcmp(name, "alphapo")) *kind = DPO_LOSS_ALPHAPO;
    else if (!strcmp(name, "aot")) *kind = DPO_LOSS_AOT;
    else if (!strcmp(name, "aot-unpaired") || !strcmp(name, "aot_unpaired")) *kind = DPO_LOSS_AOT_UNPAIRED;
    else if (!strcmp(name, "sigmoid-norm") || !strcmp(name, "sigmoid_norm")) *kind = DPO_LOSS_SIGMOID_NORM;
    else if (!strcmp(name, "robust")) *kind = DPO_LOSS_ROBUST;
    else if (!strcmp(name, "exo") || !strcmp(name, "exo_pair")) *kind = DPO_LOSS_EXO;
    else if (!strcmp(name, "nca") || !strcmp(name, "nca_pair")) *kind = DPO_LOSS_NCA;
    else if (!strcmp(name, "bco") || !strcmp(name, "bco_pair")) *kind = DPO_LOSS_BCO;
    else if (!strcmp(name, "sppo-hard") || !strcmp(name, "sppo_hard")) *kind = DPO_LOSS_SPPO;
    else if (!strcmp(name, "apo-zero") || !strcmp(name, "apo_zero")) *kind = DPO_LOSS_APO_ZERO;
    else if (!strcmp(name, "apo-down") || !strcmp(name, "apo_down")) *kind = DPO_LOSS_APO_DOWN;
    else if (!strcmp(name, "discopop")) *kind = DPO_LOSS_DISCOPOP;
    else return -1;
    return 0;
}

int f_divergence_from_name(const char *name, FDivergence *kind) {
    if (!strcmp(name, "reverse-kl") || !strcmp(name, "reverse_kl")) *kind = F_DIVERGENCE_REVERSE_KL;
    else if (!strcmp(name, "forward-kl") || !strcmp(name, "forward_kl")) *kind = F_DIVERGENCE_FORWARD_KL;
    else if (!strcmp(name, "js") || !strcmp(name, "js_divergence")) *kind = F_DIVERGENCE_JS;
    else if (!strcmp(name, "alpha") || !strcmp(name, "alpha_divergence")) *kind = F_DIVERGENCE_ALPHA;
    else return -1;
    return 0;
}

static bool has_response(const TokenizedExamples *rows, long r) { return rows->lengths[r] - rows->prompt_lengths[r] >= 1; }

// Tokenizes the pairs into rows (two per pair), leaving out pairs where either row has no
// response token within max_seq_len.
static void tokenize_pairs(DpoTask *task, const Tokenizer *tokenizer, const char *const *prompts,
                           const char *const *responses, long count, int max_seq_len, TokenizedExamples *out) {
    tokenized_examples_alloc(out, 2 * count);
    for (long i = 0; i < count; i++) {
        bool truncated_pair = false;
        for (int k = 0; k < 2; k++) {
            bool truncated;
            long r = out->count + k;
            tokenize_example(tokenizer, prompts[i], responses[2 * i + k], max_seq_len, &out->ids[r], &out->lengths[r],
                             &out->prompt_lengths[r], &truncated);
            truncated_pair |= truncated;
        }
        if (!has_response(out, out->count) || !has_response(out, out->count + 1)) {
            task->dropped++;
            free(out->ids[out->count]), free(out->ids[out->count + 1]);
            continue;
        }
        task->truncated += truncated_pair;
        out->count += 2;
    }
}

int dpo_task_from_rows(DpoTask *task, TokenizedExamples *train, TokenizedExamples *eval, int pad_id,
                       const DpoLossOptions *options) {
    long dropped = task->dropped, truncated = task->truncated;
    memset(task, 0, sizeof *task);
    task->dropped = dropped, task->truncated = truncated;
    task->train = *train, task->eval = *eval;
    memset(train, 0, sizeof *train), memset(eval, 0, sizeof *eval);
    task->train_count = task->train.count / 2;
    task->eval_count = task->eval.count / 2;
    task->pad_id = pad_id;
    task->options = *options;
    task->train_reference = response_sums_unknown(task->train.count);
    task->eval_reference = response_sums_unknown(task->eval.count);
    CHECK(task->train.count % 2 == 0 && task->eval.count % 2 == 0, "DPO rows come in pairs");
    if (task->train_count == 0) return err_set("no DPO pair has a response token within --max-seq-len");
    return 0;
}

int dpo_task_init(DpoTask *task, const Tokenizer *tokenizer, const char *const *prompts, const char *const *responses,
                  long count, const char *const *eval_prompts, const char *const *eval_responses, long eval_count,
                  int max_seq_len, const DpoLossOptions *options) {
    memset(task, 0, sizeof *task);
    TokenizedExamples train, eval;
    tokenize_pairs(task, tokenizer, prompts, responses, count, max_seq_len, &train);
    tokenize_pairs(task, tokenizer, eval_prompts, eval_responses, eval_count, max_seq_len, &eval);
    return dpo_task_from_rows(task, &train, &eval, training_pad_id(tokenizer), options);
}

void dpo_task_free(DpoTask *task) {
    tokenized_examples_free(&task->train);
    tokenized_examples_free(&task->eval);
    free(task->train_reference), free(task->eval_reference);
    memset(task, 0, sizeof *task);
}

// Response tokens of row r (the count IPO averages over).
static int response_tokens(const TokenizedExamples *rows, long r) { return rows->lengths[r] - rows->prompt_lengths[r]; }

// LD-DPO (Liu et al. 2024, "length desensitization"; TRL's ld_alpha): in both rows of a
// pair the response tokens past the shorter response's length count alpha times, in the
// policy's sums and the reference's alike.
static bool length_desensitised(const DpoLossOptions *o) { return o->ld_alpha > 0 && o->ld_alpha != 1.0; }

static void fill_tail_weights(const void *context, const TokenizedExamples *rows, const long *which,
                              ResponseBatch *batch) {
    const double alpha = *(const double *)context;
    batch->weights = xmalloc((size_t)batch->B * batch->T * sizeof(float));
    for (int b = 0; b < batch->B; b++) {
        const long r = which[b], partner = r ^ 1; // rows 2i and 2i+1 are a pair
        const int shared = response_tokens(rows, r) < response_tokens(rows, partner) ? response_tokens(rows, r)
                                                                                        : response_tokens(rows, partner);
        int k = 0; // response tokens so far in this row
        for (int t = 0; t < batch->T; t++) {
            const long i = (long)b * batch->T + t;
            batch->weights[i] = batch->targets[i] >= 0 && k++ >= shared ? (float)alpha : 1.0f;
        }
    }
}

void dpo_task_compute_reference(DpoTask *task, Model *reference) {
    const ResponseWeighting tails = {fill_tail_weights, &task->options.ld_alpha};
    const ResponseWeighting *weighting = length_desensitised(&task->options) ? &tails : NULL;
    response_logps_all_weighted(reference, &task->train, task->pad_id, weighting, task->train_reference);
    response_logps_all_weighted(reference, &task->eval, task->pad_id, weighting, task->eval_reference);
}

// The reference's sums a checkpoint's trainer state kept for these rows, alpha and reference
// (response_sums_load: the others stay unknown).
static void load_reference_sums(DpoTask *task, const json_t *state) {
    response_sums_load(state, "dpo_reference_train", &task->train, task->options.ld_alpha, task->reference_fingerprint,
                       task->train_reference);
    response_sums_load(state, "dpo_reference_eval", &task->eval, task->options.ld_alpha, task->reference_fingerprint,
                       task->eval_reference);
}

void dpo_task_reference_model(DpoTask *task, Model *reference, const TrainOptions *options) {
    task->reference_fingerprint = response_reference_fingerprint(reference);
    json_t *state = train_resume_state(options);
    if (state) {
        load_reference_sums(task, state);
        json_decref(state);
    }
    // Under mpirun the scoring is a collective: every rank scores unless every rank has the sums.
    const bool known = response_sums_known(task->train_reference, task->train.count) &&
                       response_sums_known(task->eval_reference, task->eval.count);
    if (dist_any_failed(!known)) {
        dpo_task_compute_reference(task, reference);
        task->reference_rows_scored += task->train.count + task->eval.count;
    }
}

void dpo_pair_rewards(const DpoLossOptions *o, double policy_chosen, double policy_rejected, double ref_chosen,
                      double ref_rejected, int chosen_tokens, int rejected_tokens, double *chosen_reward,
                      double *rejected_reward) {
    if (!dpo_loss_uses_reference(o->loss)) ref_chosen = ref_rejected = 0.0;
    const bool means = !dpo_loss_uses_reference(o->loss) && dpo_loss_compares_means(o->loss);
    const double nc = means ? chosen_tokens : 1.0, nr = means ? rejected_tokens : 1.0;
    if (dpo_loss_is_cpo_trainer(o->loss) && o->alphapo_alpha != 0.0) {
        double slope;
        *chosen_reward = o->beta * alphapo_reward(o->alphapo_alpha, policy_chosen / nc, &slope);
        *rejected_reward = o->beta * alphapo_reward(o->alphapo_alpha, policy_rejected / nr, &slope);
        return;
    }
    *chosen_reward = o->beta * (policy_chosen - ref_chosen) / nc;
    *rejected_reward = o->beta * (policy_rejected - ref_rejected) / nr;
}

typedef struct {
    double loss, correct, margin, chosen_reward, rejected_reward, tokens;
} DpoStats;


// One forward over the pairs' rows, the losses, and (when train) the backward of
// scale * the summed loss.
static void dpo_forward(DpoTask *task, Model *model, const TokenizedExamples *rows, const double *reference,
                        const long *pairs, int count, double scale, bool train, DpoStats *stats) {
    const DpoLossOptions *o = &task->options;
    long *which = xmalloc((size_t)2 * count * sizeof(long));
    for (int e = 0; e < count; e++) which[2 * e] = 2 * pairs[e], which[2 * e + 1] = 2 * pairs[e] + 1;
    ResponseBatch batch;
    response_batch_build(rows, which, 2 * count, task->pad_id, &batch);
    if (length_desensitised(o)) fill_tail_weights(&o->ld_alpha, rows, which, &batch);
    double *sums = xmalloc((size_t)batch.B * sizeof(double)), *d_sums = xmalloc((size_t)batch.B * sizeof(double));
    // The sft term reads the rows' unweighted sums (TRL's cross-entropy on the logits, which
    // LD-DPO's weights do not touch); WPO the rows' log-weights.
    ResponseRowExtras extras = {
        .plain_sums = o->sft_term ? xmalloc((size_t)batch.B * sizeof(double)) : NULL,
        .wpo_log_weights = o->use_weighting ? xmalloc((size_t)batch.B * sizeof(double)) : NULL,
    };
    double *d_plain_sums = o->sft_term ? xcalloc((size_t)batch.B, sizeof(double)) : NULL;
    response_batch_forward_more(model, &batch, sums, &extras);
    double pair_weight_sum = 0; // WPO: the sum of the pairs' weights (else the pair count)
    // AOT sorts across the pairs of this forward (TRL: of the micro-batch on one device): the
    // loop gathers the pairs' sums and dpo_batch_loss_from_sums takes them all at once.
    const bool sorted = dpo_options_sort_batch(o);
    CHECK(!sorted || !o->use_weighting, "WPO with AOT (refused by the command)");
    double *batch_sums = sorted ? xmalloc((size_t)4 * count * sizeof(double)) : NULL;
    int *batch_tokens = sorted ? xmalloc((size_t)2 * count * sizeof(int)) : NULL;
    for (int e = 0; e < count; e++) {
        long c = which[2 * e], r = which[2 * e + 1];
        double pc = sums[2 * e], pr = sums[2 * e + 1], rc = reference[c], rr = reference[r];
        const bool uses_reference = dpo_loss_uses_reference(o->loss);
        CHECK(!uses_reference || (!isnan(rc) && !isnan(rr)), "DPO reference log-probs were not computed");
        if (!uses_reference) rc = rr = 0.0;
        // IPO compares per-token means (TRL's normalisation, which the IPO authors confirmed),
        // sigmoid-norm too, and SimPO and ORPO with no reference: dpo_pair_loss_from_sums.
        const int nc = response_tokens(rows, c), nr = response_tokens(rows, r);
        // WPO (Zhou et al. 2024, Eq. 2; TRL's use_weighting): the pair's loss times
        // w_c w_r, each w = exp(mean over the row's tokens of log p - log sum_v p_v^2) under
        // the policy, a constant for the gradient. 1 without.
        const double pair_weight =
            o->use_weighting ? exp(extras.wpo_log_weights[2 * e] + extras.wpo_log_weights[2 * e + 1]) : 1.0;
        pair_weight_sum += pair_weight;
        if (sorted) {
            batch_sums[e] = pc, batch_sums[count + e] = pr; // four columns: pc, pr, rc, rr
            batch_sums[2 * count + e] = rc, batch_sums[3 * count + e] = rr;
            batch_tokens[e] = nc, batch_tokens[count + e] = nr;
            d_sums[2 * e] = d_sums[2 * e + 1] = 0.0;
        } else {
            double d_chosen, d_rejected;
            stats->loss += pair_weight * dpo_pair_loss_from_sums(o, pc, pr, rc, rr, nc, nr, &d_chosen, &d_rejected);
            d_sums[2 * e] = pair_weight * d_chosen, d_sums[2 * e + 1] = pair_weight * d_rejected;
        }
        if (o->sft_weight > 0) { // RPO: the chosen response's mean negative log-likelihood
            const double tokens = response_tokens(rows, c);
            stats->loss += pair_weight * (o->sft_weight * -pc / tokens);
            d_sums[2 * e] += pair_weight * (-o->sft_weight / tokens);
        }
        double chosen_reward, rejected_reward;
        dpo_pair_rewards(o, pc, pr, rc, rr, nc, nr, &chosen_reward, &rejected_reward);
        stats->correct += chosen_reward > rejected_reward;
        stats->margin += chosen_reward - rejected_reward;
        stats->chosen_reward += chosen_reward;
        stats->rejected_reward += rejected_reward;
    }
    if (sorted) {
        double *d_chosen = xmalloc((size_t)2 * count * sizeof(double)), *d_rejected = d_chosen + count;
        stats->loss += dpo_batch_loss_from_sums(o, count, batch_sums, batch_sums + count, batch_sums + 2 * count,
                                                batch_sums + 3 * count, batch_tokens, batch_tokens + count, d_chosen,
                                                d_rejected);
        for (int e = 0; e < count; e++) d_sums[2 * e] += d_chosen[e], d_sums[2 * e + 1] += d_rejected[e];
        free(d_chosen), free(batch_sums), free(batch_tokens);
    }
    if (o->sft_term) {
        // TRL's "sft" term: the mean -log-prob over all the micro-batch's chosen response
        // tokens, which TRL gives every pair (times its WPO weight) before the mean over
        // pairs; here the loop divides the sum over pairs by the pair count instead.
        double chosen_tokens = 0, chosen_sum = 0;
        for (int e = 0; e < count; e++) {
            chosen_tokens += response_tokens(rows, which[2 * e]);
            chosen_sum += extras.plain_sums[2 * e];
        }
        const double share = o->sft_term_weight * pair_weight_sum;
        stats->loss += share * (-chosen_sum / chosen_tokens);
        for (int e = 0; e < count; e++) d_plain_sums[2 * e] = -share / chosen_tokens;
    }
    stats->tokens += (double)response_batch_tokens(&batch);
    if (train) response_batch_backward_more(model, &batch, d_sums, d_plain_sums, scale);
    free(sums), free(d_sums), free(which), free(extras.plain_sums), free(extras.wpo_log_weights), free(d_plain_sums);
    response_batch_free(&batch);
}

static double dpo_weight(void *context, const long *examples, int count) { return count; }

static void dpo_micro_step(void *context, Model *model, const long *examples, int count, double scale,
                           MicroStepResult *result) {
    DpoTask *task = context;
    DpoStats stats = {0};
    dpo_forward(task, model, &task->train, task->train_reference, examples, count, scale, true, &stats);
    result->loss_sum = stats.loss;
    result->weight = count;
    result->tokens = stats.tokens;
    result->metric_sums[0] = stats.correct;
    result->metric_sums[1] = stats.margin;
    result->metric_sums[2] = stats.chosen_reward;
    result->metric_sums[3] = stats.rejected_reward;
}

static void dpo_evaluate(void *context, Model *model, EvalResult *result) {
    DpoTask *task = context;
    DpoStats stats = {0};
    long pairs[4];
    // Under mpirun each rank evaluates its share of the pairs and the sums are added up.
    DistChunks chunks = dist_chunks(task->eval_count, 4);
    for (int n; (n = dist_chunks_next(&chunks, pairs)) > 0;)
        dpo_forward(task, model, &task->eval, task->eval_reference, pairs, n, 0.0, false, &stats);
    dist_weights_drain(model); // ZeRO-3: every rank's forwards done before the sum (dist/zero.h)
    double sums[5] = {stats.loss, stats.correct, stats.margin, stats.chosen_reward, stats.rejected_reward};
    dist_sum_doubles(sums, 5);
    const double n = task->eval_count;
    const char *names[] = {"loss", "accuracy", "margin", "chosen_reward", "rejected_reward"};
    for (int i = 0; i < 5; i++) result->names[i] = names[i], result->values[i] = n > 0 ? sums[i] / n : 0.0;
    result->count = n > 0 ? 5 : 0;
}

// The reference is the policy's starting weights: computed here, on the model as it trains,
// unless a resumed run's checkpoint gave every sum back (dpo_load_state; run before this).
static void dpo_prepare(void *context, Model *model) {
    DpoTask *task = context;
    if (response_sums_known(task->train_reference, task->train.count) &&
        response_sums_known(task->eval_reference, task->eval.count))
        return;
    dpo_task_compute_reference(task, model);
    task->reference_rows_scored += task->train.count + task->eval.count;
    model_release_activations(model); // sized for the reference's batches
}

// The reference's sums ride in every checkpoint (response_sums_save: with a fingerprint of
// the rows and of LD-DPO's alpha, which weights them), so --resume need not score the data again.
static void dpo_save_state(void *context, json_t *state) {
    const DpoTask *task = context;
    response_sums_save(state, "dpo_reference_train", &task->train, task->options.ld_alpha, task->reference_fingerprint,
                       task->train_reference);
    response_sums_save(state, "dpo_reference_eval", &task->eval, task->options.ld_alpha, task->reference_fingerprint,
                       task->eval_reference);
    reference_sync_save_state(&task->sync, state);
}

// A checkpoint of a reference that follows the policy (--sync-ref-model) resumes only a run
// that has one too, with the same settings (its reference/, which the command read, is that
// run's reference). Missing or stale sums are computed again, not an error.
static int dpo_load_state(void *context, const json_t *state, const char *checkpoint) {
    DpoTask *task = context;
    if (reference_sync_check_state(&task->sync, state, checkpoint) != 0) return -1;
    load_reference_sums(task, state);
    return 0;
}

// TR-DPO: after each update the reference scores the rows again.
static void dpo_after_step(void *context, Model *model, long step) {
    DpoTask *task = context;
    if (!reference_sync_after_step(&task->sync, model, step)) return;
    Model *reference = task->sync.model;
    task->reference_fingerprint = response_reference_fingerprint(reference);
    dpo_task_compute_reference(task, reference);
    task->reference_rows_scored += task->train.count + task->eval.count;
    model_release_activations(reference); // its scoring batches' memory, until the next update
}

// Micro-batches, and evaluation chunks of 4 pairs (dpo_evaluate), of two rows a pair.
// The longer of the pair's two rows (they run in one batch).
static int dpo_example_length(void *context, long example) {
    const DpoTask *task = context;
    const int chosen = task->train.lengths[2 * example], rejected = task->train.lengths[2 * example + 1];
    return chosen > rejected ? chosen : rejected;
}

static void dpo_largest_batch(void *context, long micro_batch, int *rows, int *length) {
    const DpoTask *task = context;
    const int train_rows = 2 * batch_rows(micro_batch, task->train_count), eval_rows = 2 * batch_rows(4, task->eval_count);
    *rows = train_rows > eval_rows ? train_rows : eval_rows;
    const int train_longest = tokenized_longest(&task->train), eval_longest = tokenized_longest(&task->eval);
    *length = train_longest > eval_longest ? train_longest : eval_longest;
}

TrainTask dpo_train_task(DpoTask *task) {
    return (TrainTask){
        .name = "dpo",
        .num_examples = task->train_count,
        .metric_names = {"accuracy", "margin", "chosen_reward", "rejected_reward"},
        .weight = dpo_weight,
        .micro_step = dpo_micro_step,
        .evaluate = task->eval_count > 0 ? dpo_evaluate : NULL,
        .prepare = task->reference_from_policy ? dpo_prepare : NULL,
        .save_state = task->reference_from_policy || task->reference_fingerprint ? dpo_save_state : NULL,
        // (Every run with a reference checks that a checkpoint's reference was not a moving one.)
        .load_state = task->reference_from_policy || task->reference_fingerprint ? dpo_load_state : NULL,
        .largest_batch = dpo_largest_batch,
        .example_length = dpo_example_length,
        .after_step = task->sync.model ? dpo_after_step : NULL,
        .checkpoint_model_name = task->sync.model ? REFERENCE_SYNC_FOLDER : NULL,
        .checkpoint_model = task->sync.model,
        .context = task,
    };
}
