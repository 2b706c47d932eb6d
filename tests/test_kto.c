// KTO (train/kto.c) against the PyTorch float64 reference of tools/make_kto_fixtures.py on
// the tiny Llama fixture: four labelled examples, their mismatched rows (each prompt with
// the next example's completion, built here by the task from the rows and compared with the
// fixture's), the KL baseline, the loss with unequal desirable/undesirable weights, and
// every weight's gradient. Also: at the reference the baseline is 0 and every example's
// loss is half its weight; two micro-batches estimate their own baselines; the loss
// against central differences; the task's errors.
#include <string.h>

#include "preference_fixture.h"
#include "train/kto.h"
#include "train/response_logps.h"

static const char *FIXTURE = "tests/fixtures/kto/llama.safetensors";
static const KtoLossOptions FIXTURE_OPTIONS = {.beta = 0.5, .desirable_weight = 1.0, .undesirable_weight = 1.5};

typedef struct {
    SafetensorsSet *set;
    TokenizedExamples rows, kl_rows;
    bool desirable[4];
    float ref_logps[4], ref_kl_logps[4], policy_logps[4], policy_kl_logps[4], kl, loss;
} KtoFixture;

static void read_floats_into(SafetensorsSet *set, const char *name, float *out, int count) {
    float *values = fixture_floats(set, FIXTURE, name, NULL);
    memcpy(out, values, (size_t)count * sizeof(float));
    free(values);
}

static void read_rows(SafetensorsSet *set, const char *tokens_name, const char *lengths_name, const int64_t *prompt_lengths,
                      TokenizedExamples *rows) {
    const SafetensorsTensor *tokens = safetensors_find(set, tokens_name);
    CHECK(tokens && tokens->shape[0] == 4, "%s: %s [4, T] expected", FIXTURE, tokens_name);
    const int T = (int)tokens->shape[1];
    int64_t *ids = fixture_ints(set, FIXTURE, tokens_name), *lengths = fixture_ints(set, FIXTURE, lengths_name);
    rows->count = 4;
    rows->ids = xcalloc(4, sizeof(int *));
    rows->lengths = xcalloc(4, sizeof(int));
    rows->prompt_lengths = xcalloc(4, sizeof(int));
    for (int r = 0; r < 4; r++) {
        rows->lengths[r] = (int)lengths[r];
        rows->prompt_lengths[r] = (int)prompt_lengths[r];
        rows->ids[r] = xmalloc((size_t)rows->lengths[r] * sizeof(int));
        for (int t = 0; t < rows->lengths[r]; t++) rows->ids[r][t] = (int)ids[(long)r * T + t];
    }
    free(ids), free(lengths);
}

static void fixture_open(KtoFixture *f) {
    memset(f, 0, sizeof *f);
    CHECK(safetensors_open(FIXTURE, &f->set) == 0, "%s", err_msg());
    int64_t *prompt_lengths = fixture_ints(f->set, FIXTURE, "prompt_lengths"), *desirable = fixture_ints(f->set, FIXTURE, "desirable");
    read_rows(f->set, "tokens", "lengths", prompt_lengths, &f->rows);
    read_rows(f->set, "kl_tokens", "kl_lengths", prompt_lengths, &f->kl_rows);
    for (int i = 0; i < 4; i++) f->desirable[i] = desirable[i] != 0;
    free(prompt_lengths), free(desirable);
    read_floats_into(f->set, "ref_logps", f->ref_logps, 4);
    read_floats_into(f->set, "ref_kl_logps", f->ref_kl_logps, 4);
    read_floats_into(f->set, "policy_logps", f->policy_logps, 4);
    read_floats_into(f->set, "policy_kl_logps", f->policy_kl_logps, 4);
    read_floats_into(f->set, "kl", &f->kl, 1);
    read_floats_into(f->set, "loss", &f->loss, 1);
}

static void fixture_close(KtoFixture *f) {
    tokenized_examples_free(&f->rows), tokenized_examples_free(&f->kl_rows);
    safetensors_close(f->set);
}

// The task from the fixture's rows; with_reference: the fixture's reference sums.
static void make_task(KtoTask *task, const KtoFixture *f, const KtoLossOptions *options, bool with_reference) {
    TokenizedExamples train = fixture_copy_rows(&f->rows), eval = {0};
    bool *labels = xmalloc(4 * sizeof(bool)), *eval_labels = xmalloc(sizeof(bool));
    memcpy(labels, f->desirable, 4 * sizeof(bool));
    memset(task, 0, sizeof *task);
    CHECK(kto_task_from_rows(task, &train, labels, &eval, eval_labels, 0, 64, options) == 0, "%s", err_msg());
    if (!with_reference) return;
    for (int r = 0; r < 4; r++) task->train_reference[r] = f->ref_logps[r], task->train_kl_reference[r] = f->ref_kl_logps[r];
}

static void test_mismatched_rows_and_sums(void) {
    KtoFixture f;
    fixture_open(&f);
    KtoTask task;
    make_task(&task, &f, &FIXTURE_OPTIONS, true);
    for (int r = 0; r < 4; r++) {
        EXPECT(task.train_kl.lengths[r] == f.kl_rows.lengths[r] && task.train_kl.prompt_lengths[r] == f.kl_rows.prompt_lengths[r],
               "mismatched row %d: length %d, expected %d", r, task.train_kl.lengths[r], f.kl_rows.lengths[r]);
        EXPECT(task.train_kl.lengths[r] == f.kl_rows.lengths[r] &&
                   !memcmp(task.train_kl.ids[r], f.kl_rows.ids[r], (size_t)f.kl_rows.lengths[r] * sizeof(int)),
               "mismatched row %d differs from prompt %d + completion %d", r, r, (r + 1) % 4);
    }
    EXPECT(task.train_desirable_count == 2, "%ld desirable", task.train_desirable_count);
    Model model;
    fixture_load_policy(&model);
    const long all[4] = {0, 1, 2, 3};
    double sums[4];
    response_logps(&model, &task.train, all, 4, 0, sums);
    for (int r = 0; r < 4; r++) EXPECT_CLOSE(sums[r], f.policy_logps[r], 1e-4, 1e-5, "completion log-prob sum");
    response_logps(&model, &task.train_kl, all, 4, 0, sums);
    for (int r = 0; r < 4; r++) EXPECT_CLOSE(sums[r], f.policy_kl_logps[r], 1e-4, 1e-5, "mismatched log-prob sum");
    model_free(&model);
    kto_task_free(&task);
    fixture_close(&f);
}

static void test_loss_and_gradients_match_pytorch(void) {
    KtoFixture f;
    fixture_open(&f);
    EXPECT(f.kl > 0.05f, "the fixture exercises the baseline (kl %g)", f.kl);
    Model model;
    fixture_load_policy(&model);
    KtoTask task;
    make_task(&task, &f, &FIXTURE_OPTIONS, true);
    TrainTask train = kto_train_task(&task);
    const long all[4] = {0, 1, 2, 3};
    MicroStepResult result = {0};
    model_zero_grad(&model);
    train.micro_step(train.context, &model, all, 4, 1.0 / 4, &result);
    EXPECT_CLOSE(result.loss_sum / 4, f.loss, 1e-6, 1e-5, "loss");
    EXPECT_CLOSE(result.metric_sums[0] / 4, f.kl, 1e-5, 1e-5, "kl baseline");
    float *want = xcalloc((size_t)model.table.total, sizeof(float));
    CHECK(model_read_named_tensors(&model, FIXTURE, "grad.", want) == 0, "%s", err_msg());
    fixture_expect_gradients(&model, want, "kto");
    free(want);
    kto_task_free(&task);
    model_free(&model);
    fixture_close(&f);
}

// The model as its own reference: the baseline is 0, r = 0, and each example's loss is
// weight x (1 - sigmoid(0)) = weight / 2. Split in two micro-batches, each estimates its own
// baseline, which at the reference is 0 as well.
static void test_at_the_reference(void) {
    KtoFixture f;
    fixture_open(&f);
    Model model;
    fixture_load_policy(&model);
    KtoTask task;
    make_task(&task, &f, &FIXTURE_OPTIONS, false);
    kto_task_compute_reference(&task, &model);
    for (int r = 0; r < 4; r++) EXPECT_CLOSE(task.train_reference[r], f.policy_logps[r], 1e-4, 1e-5, "reference sum");
    TrainTask train = kto_train_task(&task);
    const long all[4] = {0, 1, 2, 3};
    MicroStepResult first = {0}, second = {0};
    train.micro_step(train.context, &model, all, 2, 1.0, &first);
    train.micro_step(train.context, &model, all + 2, 2, 1.0, &second);
    EXPECT_CLOSE(first.loss_sum + second.loss_sum, 0.5 * (1.0 + 1.5 + 1.0 + 1.5), 1e-6, 0, "loss at the reference");
    EXPECT_CLOSE(first.metric_sums[0] + second.metric_sums[0], 0.0, 1e-6, 0, "baseline at the reference");
    kto_task_free(&task);
    model_free(&model);
    fixture_close(&f);
}

// A policy below the reference on the mismatched rows gives a baseline of 0, not a
// negative one (the clamp).
static void test_baseline_clamped_at_zero(void) {
    KtoFixture f;
    fixture_open(&f);
    Model model;
    fixture_load_policy(&model);
    KtoTask task;
    make_task(&task, &f, &FIXTURE_OPTIONS, true);
    for (int r = 0; r < 4; r++) task.train_kl_reference[r] = f.policy_kl_logps[r] + 1.0;
    TrainTask train = kto_train_task(&task);
    const long all[4] = {0, 1, 2, 3};
    MicroStepResult result = {0};
    train.micro_step(train.context, &model, all, 4, 1.0, &result);
    EXPECT(result.metric_sums[0] == 0.0, "baseline %g", result.metric_sums[0] / 4);
    double expected = 0, unused;
    for (int r = 0; r < 4; r++)
        expected += kto_example_loss(&FIXTURE_OPTIONS, f.desirable[r], (double)f.policy_logps[r] - f.ref_logps[r], 0.0, &unused);
    EXPECT_CLOSE(result.loss_sum, expected, 1e-5, 1e-5, "loss with a zero baseline");
    kto_task_free(&task);
    model_free(&model);
    fixture_close(&f);
}

static void test_example_loss(void) {
    const KtoLossOptions o = {.beta = 0.3, .desirable_weight = 1.2, .undesirable_weight = 0.7};
    const double points[][2] = {{1.5, 0.25}, {-4.0, 0.0}, {30.0, 2.0}, {-0.5, 1.0}};
    for (int desirable = 0; desirable < 2; desirable++)
        for (int p = 0; p < 4; p++) {
            double d, unused;
            const double r = points[p][0], kl = points[p][1], step = 1e-5;
            double loss = kto_example_loss(&o, desirable, r, kl, &d);
            double numeric = (kto_example_loss(&o, desirable, r + step, kl, &unused) -
                              kto_example_loss(&o, desirable, r - step, kl, &unused)) / (2 * step);
            char what[64];
            snprintf(what, sizeof what, "%s point %d d/dr", desirable ? "desirable" : "undesirable", p);
            EXPECT_CLOSE(d, numeric, 1e-9, 1e-6, what);
            const double z = desirable ? 0.3 * (r - kl) : 0.3 * (kl - r);
            EXPECT_CLOSE(loss, (desirable ? 1.2 : 0.7) * (1.0 - 1.0 / (1.0 + exp(-z))), 1e-15, 1e-12, "loss value");
        }
    double d;
    EXPECT(kto_example_loss(&o, true, 1e6, 0.0, &d) == 0.0 && d == 0.0, "saturated desirable");
    EXPECT(isfinite(kto_example_loss(&o, false, 1e6, 0.0, &d)) && d == 0.0, "saturated undesirable: d %g", d);
}

static void test_task_errors(void) {
    KtoFixture f;
    fixture_open(&f);
    KtoTask task;
    TokenizedExamples one = fixture_copy_rows(&f.rows), eval = {0};
    for (long r = 1; r < one.count; r++) free(one.ids[r]);
    one.count = 1;
    bool *labels = xcalloc(4, sizeof(bool)), *eval_labels = xcalloc(1, sizeof(bool));
    memset(&task, 0, sizeof task);
    EXPECT(kto_task_from_rows(&task, &one, labels, &eval, eval_labels, 0, 64, &FIXTURE_OPTIONS) == -1 &&
               strstr(err_msg(), "at least 2"),
           "one example: %s", err_msg());
    kto_task_free(&task);
    TokenizedExamples train = fixture_copy_rows(&f.rows), one_eval = fixture_copy_rows(&f.rows);
    for (long r = 1; r < one_eval.count; r++) free(one_eval.ids[r]);
    one_eval.count = 1;
    labels = xcalloc(4, sizeof(bool)), eval_labels = xcalloc(4, sizeof(bool));
    memset(&task, 0, sizeof task);
    EXPECT(kto_task_from_rows(&task, &train, labels, &one_eval, eval_labels, 0, 64, &FIXTURE_OPTIONS) == -1 &&
               strstr(err_msg(), "evaluation"),
           "one eval example: %s", err_msg());
    kto_task_free(&task);
    fixture_close(&f);
}

int main(void) {
    RUN(test_mismatched_rows_and_sums);
    RUN(test_loss_and_gradients_match_pytorch);
    RUN(test_at_the_reference);
    RUN(test_baseline_clamped_at_zero);
    RUN(test_example_loss);
    RUN(test_task_errors);
    TEST_EXIT();
}
