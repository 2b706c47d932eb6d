// DPO (train/dpo.c) against the PyTorch float64 reference of tools/make_dpo_fixtures.py on
// the tiny Llama fixture: the response log-prob sums of six rows (three pairs), the
// losses of DPO, conservative DPO, IPO, hinge, SimPO and DPO + SFT (RPO), and every
// weight's gradient for conservative DPO, IPO, SimPO and RPO (per-token means, SimPO
// without a reference, RPO's term on the chosen rows only).
// TRL 1.12's combined losses (the MPO recipe: sigmoid 0.8, bco_pair 0.2, sft 1, the sft term
// a mean over the batch's chosen tokens) and WPO weighting, with LD-DPO too: losses and every
// weight's gradient, and each row's WPO log-weight.
// TRL 1.12's own code on fixed log-prob sums (tests/fixtures/dpo/trl_losses.json):
// DPOTrainer._compute_loss for aot and aot_unpaired (sorted across the batch), alone and in
// lists, and CPOTrainer.cpo_loss for hinge, ipo, simpo and sigmoid with and without AlphaPO's
// alpha: the batch loss, the logged rewards and the gradient w.r.t. each sum, and that
// gradient against central differences; on the model, AOT's sorted path.
// Also: the reference computed by the task from the model itself equals the policy at
// step 0 (loss log 2, zero margin), and splitting the pairs over two micro-batches gives
// the gradient of one.
#include <jansson.h>
#include <string.h>

#include "preference_fixture.h"
#include "train/dpo.h"
#include "train/response_logps.h"

static const char *FIXTURE = "tests/fixtures/dpo/llama.safetensors";

typedef struct {
    SafetensorsSet *set;
    TokenizedExamples rows;
    float ref_logps[6], policy_logps[6];
    float ref_logps_ld[6]; // the reference's LD-DPO sums (ld_alpha 0.5)
    float wpo_log_weights[6]; // each row's log WPO weight under the policy
} DpoFixture;

static void fixture_open(DpoFixture *f) {
    memset(f, 0, sizeof *f);
    CHECK(safetensors_open(FIXTURE, &f->set) == 0, "%s", err_msg());
    const SafetensorsTensor *tokens = safetensors_find(f->set, "tokens");
    CHECK(tokens && tokens->shape[0] == 6, "%s: tokens [6, T] expected", FIXTURE);
    const int T = (int)tokens->shape[1];
    int64_t *ids = fixture_ints(f->set, FIXTURE, "tokens"), *lengths = fixture_ints(f->set, FIXTURE, "lengths");
    int64_t *prompt_lengths = fixture_ints(f->set, FIXTURE, "prompt_lengths");
    f->rows.count = 6;
    f->rows.ids = xcalloc(6, sizeof(int *));
    f->rows.lengths = xcalloc(6, sizeof(int));
    f->rows.prompt_lengths = xcalloc(6, sizeof(int));
    for (int r = 0; r < 6; r++) {
        f->rows.lengths[r] = (int)lengths[r];
        f->rows.prompt_lengths[r] = (int)prompt_lengths[r];
        f->rows.ids[r] = xmalloc((size_t)T * sizeof(int));
        for (int t = 0; t < T; t++) f->rows.ids[r][t] = (int)ids[(long)r * T + t];
    }
    float *ref = fixture_floats(f->set, FIXTURE, "ref_logps", NULL), *policy = fixture_floats(f->set, FIXTURE, "policy_logps", NULL);
    memcpy(f->ref_logps, ref, sizeof f->ref_logps), memcpy(f->policy_logps, policy, sizeof f->policy_logps);
    float *ref_ld = fixture_floats(f->set, FIXTURE, "ref_logps_ld", NULL);
    memcpy(f->ref_logps_ld, ref_ld, sizeof f->ref_logps_ld);
    float *wpo = fixture_floats(f->set, FIXTURE, "wpo_log_weights", NULL);
    memcpy(f->wpo_log_weights, wpo, sizeof f->wpo_log_weights);
    free(ids), free(lengths), free(prompt_lengths), free(ref), free(policy), free(ref_ld), free(wpo);
}

static void make_task(DpoTask *task, const DpoFixture *f, const DpoLossOptions *options) {
    TokenizedExamples train = fixture_copy_rows(&f->rows), eval = {0};
    memset(task, 0, sizeof *task);
    CHECK(dpo_task_from_rows(task, &train, &eval, 0, options) == 0, "%s", err_msg());
    const bool ld = options->ld_alpha > 0 && options->ld_alpha != 1.0;
    for (int r = 0; r < 6; r++) task->train_reference[r] = ld ? f->ref_logps_ld[r] : f->ref_logps[r];
}

static void test_response_logps_match_pytorch(void) {
    DpoFixture f;
    fixture_open(&f);
    Model model;
    fixture_load_policy(&model);
    const long which[6] = {0, 1, 2, 3, 4, 5};
    double sums[6];
    response_logps(&model, &f.rows, which, 6, 0, sums);
    for (int r = 0; r < 6; r++) EXPECT_CLOSE(sums[r], f.policy_logps[r], 1e-4, 1e-5, "response log-prob sum");
    // WPO's log-weights (the model's collision entropy per token), and the plain sums with
    // them, which are the sums when no token weights are set.
    ResponseBatch batch;
    response_batch_build(&f.rows, which, 6, 0, &batch);
    double more_sums[6], plain[6], log_weights[6];
    const ResponseRowExtras extras = {.plain_sums = plain, .wpo_log_weights = log_weights};
    response_batch_forward_more(&model, &batch, more_sums, &extras);
    for (int r = 0; r < 6; r++) {
        EXPECT_CLOSE(log_weights[r], f.wpo_log_weights[r], 1e-5, 1e-5, "WPO log-weight");
        EXPECT(more_sums[r] == sums[r] && plain[r] == sums[r], "row %d: sums %g %g %g", r, more_sums[r], plain[r],
               sums[r]);
    }
    response_batch_free(&batch);
    model_free(&model);
    tokenized_examples_free(&f.rows);
    safetensors_close(f.set);
}

static void test_losses_and_gradients_match_pytorch(void) {
    DpoFixture f;
    fixture_open(&f);
    // TRL's MPO recipe: sigmoid 0.8 + bco_pair 0.2 per pair, plus the sft term (weight 1).
    const DpoLossOptions mpo = {.loss = DPO_LOSS_SIGMOID, .beta = 0.1, .term_count = 2,
                                .terms = {DPO_LOSS_SIGMOID, DPO_LOSS_BCO}, .term_weights = {0.8, 0.2},
                                .sft_term = true, .sft_term_weight = 1.0};
    DpoLossOptions mpo_wpo_ld = mpo;
    mpo_wpo_ld.use_weighting = true, mpo_wpo_ld.ld_alpha = 0.5;
    struct { const char *name; DpoLossOptions options; bool gradients; } kinds[] = {
        {"sigmoid", {.loss = DPO_LOSS_SIGMOID, .beta = 0.1}, false},
        {"cdpo", {.loss = DPO_LOSS_SIGMOID, .beta = 0.5, .label_smoothing = 0.2}, true},
        {"ipo", {.loss = DPO_LOSS_IPO, .beta = 0.1}, true},
        {"hinge", {.loss = DPO_LOSS_HINGE, .beta = 0.5}, false},
        {"simpo", {.loss = DPO_LOSS_SIMPO, .beta = 2.0, .simpo_gamma = 1.0}, true},
        {"rpo", {.loss = DPO_LOSS_SIGMOID, .beta = 0.1, .sft_weight = 0.5}, true},
        {"orpo", {.loss = DPO_LOSS_ORPO, .beta = 1.0}, true},
        {"ld", {.loss = DPO_LOSS_SIGMOID, .beta = 0.1, .ld_alpha = 0.5}, true},
        {"mpo", mpo, true},
        {"wpo", {.loss = DPO_LOSS_SIGMOID, .beta = 0.1, .use_weighting = true}, true},
        {"mpo_wpo_ld", mpo_wpo_ld, true},
        // TRL's CPOTrainer: CPO and CPO-SimPO with label smoothing and cpo_alpha (the sft term).
        {"cpo", {.loss = DPO_LOSS_CPO, .beta = 0.5, .label_smoothing = 0.1, .sft_term = true, .sft_term_weight = 1.0},
         true},
        {"cpo_simpo",
         {.loss = DPO_LOSS_SIMPO, .beta = 2.0, .simpo_gamma = 1.0, .label_smoothing = 0.1, .sft_term = true,
          .sft_term_weight = 0.5},
         true}};
    for (int k = 0; k < (int)(sizeof kinds / sizeof kinds[0]); k++) {
        Model model;
        fixture_load_policy(&model);
        DpoTask task;
        make_task(&task, &f, &kinds[k].options);
        TrainTask train = dpo_train_task(&task);
        const long pairs[3] = {0, 1, 2};
        MicroStepResult result = {0};
        model_zero_grad(&model);
        train.micro_step(train.context, &model, pairs, 3, 1.0 / 3, &result);
        char name[64];
        snprintf(name, sizeof name, "loss.%s", kinds[k].name);
        float *want = fixture_floats(f.set, FIXTURE, name, NULL);
        EXPECT_CLOSE(result.loss_sum / 3, want[0], 1e-6, 1e-5, name);
        free(want);
        if (kinds[k].gradients) {
            float *want_grads = xcalloc((size_t)model.table.total, sizeof(float));
            snprintf(name, sizeof name, "grad.%s.", kinds[k].name);
            CHECK(model_read_named_tensors(&model, FIXTURE, name, want_grads) == 0, "%s", err_msg());
            fixture_expect_gradients(&model, want_grads, kinds[k].name);
            free(want_grads);
        }
        // The same step as two micro-batches (2 pairs, then 1) adds up to the same gradient
        // (not with the sft term, a mean over each micro-batch's chosen tokens as TRL's).
        if (kinds[k].gradients && !kinds[k].options.sft_term) {
            float *one_batch = xmalloc((size_t)model.table.total * sizeof(float));
            memcpy(one_batch, model.grads, (size_t)model.table.total * sizeof(float));
            model_zero_grad(&model);
            MicroStepResult first = {0}, second = {0};
            train.micro_step(train.context, &model, pairs, 2, 1.0 / 3, &first);
            train.micro_step(train.context, &model, pairs + 2, 1, 1.0 / 3, &second);
            EXPECT_CLOSE(first.loss_sum + second.loss_sum, result.loss_sum, 1e-9, 1e-6, "split loss");
            double largest = 0;
            for (long j = 0; j < model.table.total; j++) largest = fmax(largest, fabs(one_batch[j]));
            double ratio = test_worst_ratio(model.grads, one_batch, model.table.total, 1e-5 * largest, 1e-4);
            EXPECT(ratio <= 1.0, "%s: two micro-batches differ from one (%.3g x tolerance)", kinds[k].name, ratio);
            free(one_batch);
        }
        dpo_task_free(&task);
        model_free(&model);
    }
    tokenized_examples_free(&f.rows);
    safetensors_close(f.set);
}

// With the model as its own reference, the first step sees h = 0: loss log 2, no margin,
// and the implicit rewards are all zero.
// With LD-DPO too: the reference's sums are weighted as the policy's (else h would not be 0).
static void test_own_reference_starts_at_log_two(void) {
    DpoFixture f;
    fixture_open(&f);
    Model model;
    fixture_load_policy(&model);
    for (int ld = 0; ld < 2; ld++) {
        DpoTask task;
        const DpoLossOptions sigmoid = {.loss = DPO_LOSS_SIGMOID, .beta = 0.1, .ld_alpha = ld ? 0.5 : 0.0};
        make_task(&task, &f, &sigmoid);
        dpo_task_compute_reference(&task, &model);
        if (!ld)
            for (int r = 0; r < 6; r++)
                EXPECT_CLOSE(task.train_reference[r], f.policy_logps[r], 1e-4, 1e-5, "reference sum");
        else { // pair 1's longer row (4 tokens past its partner's 3) counts those half; equal rows as they are
            EXPECT(task.train_reference[2] > f.policy_logps[2] + 1.0, "LD reference %g vs plain %g",
                   task.train_reference[2], f.policy_logps[2]);
            EXPECT_CLOSE(task.train_reference[0], f.policy_logps[0], 1e-4, 1e-5, "LD reference of an equal-length pair");
            EXPECT_CLOSE(task.train_reference[3], f.policy_logps[3], 1e-4, 1e-5, "LD reference of the shorter row");
        }
        TrainTask train = dpo_train_task(&task);
        const long pairs[3] = {0, 1, 2};
        MicroStepResult result = {0};
        train.micro_step(train.context, &model, pairs, 3, 1.0 / 3, &result);
        EXPECT_CLOSE(result.loss_sum / 3, log(2.0), 1e-6, 0, ld ? "LD loss at the reference" : "loss at the reference");
        EXPECT_CLOSE(result.metric_sums[1], 0.0, 1e-6, 0, "margin at the reference");
        dpo_task_free(&task);
    }
    model_free(&model);
    tokenized_examples_free(&f.rows);
    safetensors_close(f.set);
}

static double json_number_at(json_t *array, size_t i) { return json_number_value(json_array_get(array, i)); }

// The options of a trl_losses.json case, as cmd_dpo.c sets them from TRL's names.
static void trl_case_options(json_t *c, DpoLossOptions *o) {
    memset(o, 0, sizeof *o);
    o->beta = json_number_value(json_object_get(c, "beta"));
    o->label_smoothing = json_number_value(json_object_get(c, "label_smoothing"));
    const char *trainer = json_string_value(json_object_get(c, "trainer"));
    json_t *type = json_object_get(c, "loss_type");
    if (!strcmp(trainer, "cpo")) {
        const char *name = json_string_value(type);
        o->simpo_gamma = json_number_value(json_object_get(c, "simpo_gamma"));
        o->alphapo_alpha = json_number_value(json_object_get(c, "alpha"));
        if (!strcmp(name, "hinge")) o->loss = DPO_LOSS_CPO_HINGE;
        else if (!strcmp(name, "ipo")) o->loss = DPO_LOSS_CPO_IPO;
        else if (!strcmp(name, "sigmoid")) o->loss = DPO_LOSS_CPO;
        else o->loss = o->alphapo_alpha != 0 ? DPO_LOSS_ALPHAPO : DPO_LOSS_SIMPO; // TRL's alphapo is simpo + alpha
        return;
    }
    json_t *weights = json_object_get(c, "loss_weights");
    const int count = (int)json_array_size(type);
    for (int k = 0; k < count; k++) {
        CHECK(dpo_loss_from_name(json_string_value(json_array_get(type, k)), &o->terms[k]) == 0, "loss type %d", k);
        o->term_weights[k] = json_number_at(weights, k);
    }
    o->loss = o->terms[0];
    o->term_count = count == 1 && o->term_weights[0] == 1.0 ? 0 : count; // one of weight 1: the loss alone
}

static void test_trl_batch_losses_match_trl(void) {
    json_error_t error;
    json_t *cases = json_load_file("tests/fixtures/dpo/trl_losses.json", 0, &error);
    CHECK(cases, "trl_losses.json: %s", error.text);
    size_t index;
    json_t *c;
    int sorted_cases = 0, alpha_cases = 0;
    json_array_foreach(cases, index, c) {
        DpoLossOptions o;
        trl_case_options(c, &o);
        const int n = (int)json_array_size(json_object_get(c, "chosen"));
        CHECK(n >= 1 && n <= 8, "case %zu: %d pairs", index, n);
        double pc[8], pr[8], rc[8] = {0}, rr[8] = {0}, dc[8], dr[8];
        int nc[8], nr[8];
        const bool reference = json_object_get(c, "ref_chosen") != NULL;
        for (int i = 0; i < n; i++) {
            pc[i] = json_number_at(json_object_get(c, "chosen"), i);
            pr[i] = json_number_at(json_object_get(c, "rejected"), i);
            if (reference) {
                rc[i] = json_number_at(json_object_get(c, "ref_chosen"), i);
                rr[i] = json_number_at(json_object_get(c, "ref_rejected"), i);
            }
            nc[i] = (int)json_number_at(json_object_get(c, "chosen_tokens"), i);
            nr[i] = (int)json_number_at(json_object_get(c, "rejected_tokens"), i);
        }
        char what[96];
        const char *type = json_is_string(json_object_get(c, "loss_type"))
                               ? json_string_value(json_object_get(c, "loss_type"))
                               : json_string_value(json_array_get(json_object_get(c, "loss_type"), 0));
        sorted_cases += dpo_options_sort_batch(&o);
        alpha_cases += o.alphapo_alpha != 0;
        const double loss = dpo_batch_loss_from_sums(&o, n, pc, pr, rc, rr, nc, nr, dc, dr) / n;
        snprintf(what, sizeof what, "case %zu (%s) loss", index, type);
        EXPECT_CLOSE(loss, json_number_value(json_object_get(c, "loss")), 1e-12, 1e-10, what);
        // The logged rewards: TRL's batch means of chosen, rejected, margin and accuracy.
        double rewards[4] = {0};
        for (int i = 0; i < n; i++) {
            double chosen, rejected;
            dpo_pair_rewards(&o, pc[i], pr[i], rc[i], rr[i], nc[i], nr[i], &chosen, &rejected);
            rewards[0] += chosen / n, rewards[1] += rejected / n, rewards[2] += (chosen - rejected) / n;
            rewards[3] += (chosen > rejected) / (double)n;
        }
        for (int k = 0; k < 4; k++) {
            snprintf(what, sizeof what, "case %zu (%s) reward %d", index, type, k);
            EXPECT_CLOSE(rewards[k], json_number_at(json_object_get(c, "rewards"), k), 1e-7, 1e-9, what);
        }
        for (int i = 0; i < n; i++) {
            for (int side = 0; side < 2; side++) {
                const double got = (side ? dr[i] : dc[i]) / n;
                snprintf(what, sizeof what, "case %zu (%s) d %s %d", index, type, side ? "rejected" : "chosen", i);
                EXPECT_CLOSE(got, json_number_at(json_object_get(c, side ? "d_rejected" : "d_chosen"), i), 1e-12,
                             1e-9, what);
                // Central differences of the batch loss in this sum, except in the cases built with
                // tied log-ratios: there the sort's order picks one side of a kink, which TRL's
                // gradient (checked above) fixes and a central difference averages away.
                if (json_is_true(json_object_get(c, "ties"))) continue;
                double *x = side ? pr : pc, d_unused[2][8];
                const double saved = x[i], step = 1e-5;
                x[i] = saved + step;
                const double up = dpo_batch_loss_from_sums(&o, n, pc, pr, rc, rr, nc, nr, d_unused[0], d_unused[1]);
                x[i] = saved - step;
                const double down = dpo_batch_loss_from_sums(&o, n, pc, pr, rc, rr, nc, nr, d_unused[0], d_unused[1]);
                x[i] = saved;
                snprintf(what, sizeof what, "case %zu (%s) d %s %d by central differences", index, type,
                         side ? "rejected" : "chosen", i);
                EXPECT_CLOSE((up - down) / (2 * step), side ? dr[i] : dc[i], 1e-6, 1e-5, what);
            }
        }
    }
    EXPECT(sorted_cases == 8 && alpha_cases == 5, "trl_losses.json: %d AOT cases, %d AlphaPO cases", sorted_cases,
           alpha_cases);
    json_decref(cases);
}

// On the model: AOT's sorted path in the task (the loss and rewards of dpo_batch_loss_from_sums
// on the rows' sums), a batch of one pair is sigmoid's, and its loss depends on the split.
static void test_aot_sorts_the_micro_batch(void) {
    DpoFixture f;
    fixture_open(&f);
    Model model;
    fixture_load_policy(&model);
    for (int unpaired = 0; unpaired < 2; unpaired++) {
        const DpoLossOptions aot = {.loss = unpaired ? DPO_LOSS_AOT_UNPAIRED : DPO_LOSS_AOT, .beta = 0.5,
                                    .label_smoothing = 0.1};
        DpoTask task;
        make_task(&task, &f, &aot);
        // The reference's sums of the next pair (and its rejected row's of the pair after):
        // orders under the policy and the reference differ, so the sorts pair them otherwise.
        for (int i = 0; i < 3; i++) {
            task.train_reference[2 * i] = f.ref_logps[2 * ((i + 1) % 3)];
            task.train_reference[2 * i + 1] = f.ref_logps[2 * ((i + 2) % 3) + 1];
        }
        TrainTask train = dpo_train_task(&task);
        const long pairs[3] = {0, 1, 2};
        MicroStepResult whole = {0}, first = {0}, second = {0};
        model_zero_grad(&model);
        train.micro_step(train.context, &model, pairs, 3, 1.0 / 3, &whole);
        double pc[3], pr[3], rc[3], rr[3], dc[3], dr[3];
        int nc[3], nr[3];
        for (int i = 0; i < 3; i++) {
            pc[i] = f.policy_logps[2 * i], pr[i] = f.policy_logps[2 * i + 1];
            rc[i] = task.train_reference[2 * i], rr[i] = task.train_reference[2 * i + 1];
            nc[i] = f.rows.lengths[2 * i] - f.rows.prompt_lengths[2 * i];
            nr[i] = f.rows.lengths[2 * i + 1] - f.rows.prompt_lengths[2 * i + 1];
        }
        const double want = dpo_batch_loss_from_sums(&aot, 3, pc, pr, rc, rr, nc, nr, dc, dr);
        EXPECT_CLOSE(whole.loss_sum, want, 1e-5, 1e-5, "AOT loss of the micro-batch");
        // The sorts matter here (else this test would not see a missing sort).
        const DpoLossOptions sigmoid = {.loss = DPO_LOSS_SIGMOID, .beta = 0.5, .label_smoothing = 0.1};
        const double unsorted = dpo_batch_loss_from_sums(&sigmoid, 3, pc, pr, rc, rr, nc, nr, dc, dr);
        EXPECT(fabs(want - unsorted) > 1e-3, "AOT %g vs sigmoid %g on the fixture", want, unsorted);
        double chosen_reward = 0;
        for (int i = 0; i < 3; i++) chosen_reward += 0.5 * (pc[i] - rc[i]);
        EXPECT_CLOSE(whole.metric_sums[2], chosen_reward, 1e-5, 1e-5, "AOT chosen reward");
        // Split into pairs 1, 2 and pair 0: each micro-batch sorts its own pairs; the lone
        // pair's loss is sigmoid's.
        const long rest[2] = {1, 2};
        train.micro_step(train.context, &model, rest, 2, 1.0 / 3, &first);
        train.micro_step(train.context, &model, pairs, 1, 1.0 / 3, &second);
        double d_one, d_two;
        const DpoLossOptions lone = {.loss = DPO_LOSS_SIGMOID, .beta = 0.5, .label_smoothing = 0.1};
        const double lone_loss = dpo_pair_loss_from_sums(&lone, pc[0], pr[0], rc[0], rr[0], nc[0], nr[0], &d_one, &d_two);
        EXPECT_CLOSE(second.loss_sum, lone_loss, 1e-5, 1e-5, "AOT of a one-pair micro-batch");
        EXPECT(fabs(first.loss_sum + second.loss_sum - whole.loss_sum) > 1e-4,
               "AOT split 2 + 1 (%g) should differ from one micro-batch (%g)", first.loss_sum + second.loss_sum,
               whole.loss_sum);
        dpo_task_free(&task);
    }
    model_free(&model);
    tokenized_examples_free(&f.rows);
    safetensors_close(f.set);
}

// The task's largest batch (train/loop.h largest_batch) holds every micro-batch of up to
// two pairs: sized for it once, the activations are not made again by any of them (the
// residual stream's buffer stays where it is); and it is no larger than needed (4 rows, the
// longest row), so a micro-batch of three pairs does make them again.
static void test_largest_batch_covers_every_micro_batch(void) {
    DpoFixture f;
    fixture_open(&f);
    Model model;
    fixture_load_policy(&model);
    const DpoLossOptions sigmoid = {.loss = DPO_LOSS_SIGMOID, .beta = 0.1};
    DpoTask task;
    make_task(&task, &f, &sigmoid);
    TrainTask train = dpo_train_task(&task);
    int longest = 0;
    for (int r = 0; r < 6; r++)
        if (f.rows.lengths[r] > longest) longest = f.rows.lengths[r];
    const long batches[][2] = {{0, 1}, {2, -1}, {1, 2}, {0, 2}, {1, -1}};
    fixture_expect_largest_batch(&train, &model, batches, 5, 4, longest, 6);
    dpo_task_free(&task);
    model_free(&model);
    tokenized_examples_free(&f.rows);
    safetensors_close(f.set);
}

int main(void) {
    RUN(test_largest_batch_covers_every_micro_batch);
    RUN(test_trl_batch_losses_match_trl);
    RUN(test_aot_sorts_the_micro_batch);
    RUN(test_response_logps_match_pytorch);
    RUN(test_losses_and_gradients_match_pytorch);
    RUN(test_own_reference_starts_at_log_two);
    TEST_EXIT();
}
