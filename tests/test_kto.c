// KTO (train/kto.c) against the PyTorch float64 reference of tools/make_kto_fixtures.py on
// the tiny Llama fixture: four labelled examples, their mismatched rows (each prompt with
// the next example's completion, built here by the task from the rows and compared with the
// fixture's), the KL baseline, the loss with unequal desirable/undesirable weights, and
// every weight's gradient. Also: at the reference the baseline is 0 and every example's
// loss is half its weight; two micro-batches estimate their own baselines; the loss
// against central differences; the task's errors.
//
// The other two losses against TRL 1.12.0's own code on the same examples (the fixture
// calls KTOTrainer._compute_loss and BCOTrainer.get_batch_loss_metrics): apo-zero-unpaired's
// loss and gradients, with no mismatched row built or run; BCO's running reward mean over
// two micro-batches of a step and a third after them, its losses and the step's gradients;
// both at the reference; BCO's state through a checkpoint's JSON and the refusals of a
// state from another loss.
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
    for (int r = 0; r < 4; r++) task->train_reference[r] = f->ref_logps[r];
    for (int r = 0; r < task->train_kl.count; r++) task->train_kl_reference[r] = f->ref_kl_logps[r];
}

static KtoLossOptions fixture_options(KtoLossKind loss) {
    KtoLossOptions options = FIXTURE_OPTIONS;
    options.loss = loss;
    return options;
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
    EXPECT(task.kl_rows_scored == 4, "%ld mismatched rows scored, expected the micro-batch's 4", task.kl_rows_scored);
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
    // The reference's sums came from a batch of four rows, the policy's from two: float32
    // sums of about 30 that a BLAS may round differently by a row's place in the batch
    // (OpenBLAS on AMD Zen: 2.4e-6 here).
    EXPECT_CLOSE(first.metric_sums[0] + second.metric_sums[0], 0.0, 2e-5, 0, "baseline at the reference");
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

// The fixture's policy-minus-reference log-ratios (the rows' sums as TRL saw them).
static void fixture_logratios(const KtoFixture *f, double *r) {
    for (int i = 0; i < 4; i++) r[i] = (double)f->policy_logps[i] - f->ref_logps[i];
}

// apo-zero-unpaired against TRL's KTOTrainer: the loss of the four examples in one batch
// and every gradient; no mismatched row is built, so none can be scored.
static void test_apo_zero_unpaired_matches_trl(void) {
    KtoFixture f;
    fixture_open(&f);
    Model model;
    fixture_load_policy(&model);
    KtoTask task;
    const KtoLossOptions options = fixture_options(KTO_LOSS_APO_ZERO_UNPAIRED);
    make_task(&task, &f, &options, true);
    EXPECT(task.train_kl.count == 0 && task.eval_kl.count == 0, "%ld mismatched rows built", task.train_kl.count);
    TrainTask train = kto_train_task(&task);
    EXPECT(!strcmp(train.metric_names[0], "accuracy") && !train.metric_names[1], "metrics %s, %s: no kl without a baseline",
           train.metric_names[0], train.metric_names[1] ? train.metric_names[1] : "(none)");
    const long all[4] = {0, 1, 2, 3};
    MicroStepResult result = {0};
    model_zero_grad(&model);
    train.micro_step(train.context, &model, all, 4, 1.0 / 4, &result);
    float want_loss;
    read_floats_into(f.set, "apo.loss", &want_loss, 1);
    EXPECT_CLOSE(result.loss_sum / 4, want_loss, 1e-6, 1e-5, "apo-zero-unpaired loss");
    EXPECT(task.kl_rows_scored == 0, "%ld mismatched rows scored", task.kl_rows_scored);
    double r[4], correct = 0;
    fixture_logratios(&f, r);
    for (int i = 0; i < 4; i++) correct += f.desirable[i] ? r[i] > 0 : r[i] < 0;
    EXPECT(result.metric_sums[0] == correct, "accuracy sum %g, expected %g", result.metric_sums[0], correct);
    float *want = xcalloc((size_t)model.table.total, sizeof(float));
    CHECK(model_read_named_tensors(&model, FIXTURE, "apo.grad.", want) == 0, "%s", err_msg());
    fixture_expect_gradients(&model, want, "apo-zero-unpaired");
    free(want);
    kto_task_free(&task);
    model_free(&model);
    fixture_close(&f);
}

// BCO against TRL's BCOTrainer: one step of micro-batches {0, 1} and {2, 3} from a fresh
// running mean, each against the mean its own rewards updated (the deltas, the losses, the
// step's gradients), then {0, 1} once more against the mean both left.
static void test_bco_matches_trl(void) {
    KtoFixture f;
    fixture_open(&f);
    Model model;
    fixture_load_policy(&model);
    KtoTask task;
    const KtoLossOptions options = fixture_options(KTO_LOSS_BCO);
    make_task(&task, &f, &options, true);
    EXPECT(task.train_kl.count == 0, "%ld mismatched rows built", task.train_kl.count);
    TrainTask train = kto_train_task(&task);
    EXPECT(!strcmp(train.metric_names[0], "delta") && !strcmp(train.metric_names[1], "accuracy"), "metrics %s, %s",
           train.metric_names[0], train.metric_names[1]);
    float want_delta[3], want_loss[3];
    read_floats_into(f.set, "bco.delta", want_delta, 3);
    read_floats_into(f.set, "bco.loss", want_loss, 3);
    const long order[6] = {0, 1, 2, 3, 0, 1};
    model_zero_grad(&model);
    for (int m = 0; m < 3; m++) {
        if (m == 2) { // the step's gradients are those of the first two micro-batches
            float *want = xcalloc((size_t)model.table.total, sizeof(float));
            CHECK(model_read_named_tensors(&model, FIXTURE, "bco.grad.", want) == 0, "%s", err_msg());
            fixture_expect_gradients(&model, want, "bco");
            free(want);
            EXPECT(task.bco_count == 4.0, "count %g after two micro-batches of 2", task.bco_count);
        }
        MicroStepResult result = {0};
        train.micro_step(train.context, &model, order + 2 * m, 2, 1.0 / 4, &result);
        char what[64];
        // TRL adds each increment of the mean in float32 (RunningMoments.update), and the
        // log-ratios are differences of float32 sums of about 30 (a BLAS may round a row by
        // its place in the batch: 5e-6 relative on AMD Zen): 2e-5.
        snprintf(what, sizeof what, "delta of micro-batch %d", m);
        EXPECT_CLOSE(result.metric_sums[0] / 2, want_delta[m], 1e-6, 2e-5, what);
        EXPECT_CLOSE(task.bco_mean, want_delta[m], 1e-6, 2e-5, "running mean");
        snprintf(what, sizeof what, "loss of micro-batch %d", m);
        EXPECT_CLOSE(result.loss_sum / 2, want_loss[m], 1e-6, 1e-5, what);
        double r[4], correct = 0;
        fixture_logratios(&f, r);
        for (int i = 0; i < 2; i++) {
            const long e = order[2 * m + i];
            const double margin = FIXTURE_OPTIONS.beta * r[e] - result.metric_sums[0] / 2;
            correct += f.desirable[e] ? margin > 0 : margin < 0;
        }
        EXPECT(result.metric_sums[1] == correct, "accuracy sum %g, expected %g", result.metric_sums[1], correct);
    }
    EXPECT(task.bco_count == 6.0 && task.kl_rows_scored == 0, "count %g, %ld mismatched rows", task.bco_count,
           task.kl_rows_scored);
    kto_task_free(&task);
    model_free(&model);
    fixture_close(&f);
}

// At the reference r = 0: apo-zero-unpaired's loss is half each example's weight; BCO's
// rewards are 0, so is its delta, and each example's loss is log 2. Neither scores a
// mismatched row, not even with the reference; one example is a valid task for both.
static void test_other_losses_at_the_reference(void) {
    KtoFixture f;
    fixture_open(&f);
    Model model;
    fixture_load_policy(&model);
    const KtoLossKind kinds[2] = {KTO_LOSS_APO_ZERO_UNPAIRED, KTO_LOSS_BCO};
    for (int k = 0; k < 2; k++) {
        KtoTask task;
        const KtoLossOptions options = fixture_options(kinds[k]);
        make_task(&task, &f, &options, false);
        kto_task_compute_reference(&task, &model);
        EXPECT(task.kl_rows_scored == 0, "%s: %ld mismatched rows scored", kto_loss_name(kinds[k]), task.kl_rows_scored);
        TrainTask train = kto_train_task(&task);
        const long all[4] = {0, 1, 2, 3};
        MicroStepResult result = {0};
        train.micro_step(train.context, &model, all, 4, 1.0, &result);
        const double expected = kinds[k] == KTO_LOSS_BCO ? 4 * log(2.0) : 0.5 * (1.0 + 1.5 + 1.0 + 1.5);
        EXPECT_CLOSE(result.loss_sum, expected, 1e-6, 0, kto_loss_name(kinds[k]));
        if (kinds[k] == KTO_LOSS_BCO) EXPECT(fabs(task.bco_mean) < 1e-6, "delta %g at the reference", task.bco_mean);
        kto_task_free(&task);

        TokenizedExamples one = fixture_copy_rows(&f.rows), eval = {0};
        for (long r = 1; r < one.count; r++) free(one.ids[r]);
        one.count = 1;
        bool *labels = xcalloc(1, sizeof(bool)), *eval_labels = xcalloc(1, sizeof(bool));
        memset(&task, 0, sizeof task);
        EXPECT(kto_task_from_rows(&task, &one, labels, &eval, eval_labels, 0, 64, &options) == 0,
               "%s with one example: %s", kto_loss_name(kinds[k]), err_msg());
        kto_task_free(&task);
    }
    model_free(&model);
    fixture_close(&f);
}

// BCO's running mean through a checkpoint's trainer state (written with the checkpoint's
// 17 digits, read back): the same bits. A state of another loss, or a BCO state without
// the mean, is refused; a state from before the choice of loss is KTO's.
static void test_bco_state_round_trip(void) {
    KtoFixture f;
    fixture_open(&f);
    KtoTask bco, other;
    const KtoLossOptions bco_options = fixture_options(KTO_LOSS_BCO);
    make_task(&bco, &f, &bco_options, true);
    bco.bco_mean = 0.1 + 0.2 / 3.0, bco.bco_count = 12.0;
    TrainTask train = kto_train_task(&bco);
    json_t *state = json_object();
    train.save_state(train.context, state);
    char *text = json_dumps(state, JSON_REAL_PRECISION(17));
    json_t *read = json_loads(text, 0, NULL);
    make_task(&other, &f, &bco_options, true);
    TrainTask resumed = kto_train_task(&other);
    EXPECT(resumed.load_state(resumed.context, read, "ckpt") == 0, "%s", err_msg());
    EXPECT(other.bco_mean == bco.bco_mean && other.bco_count == 12.0, "mean %.17g, expected %.17g", other.bco_mean,
           bco.bco_mean);
    kto_task_free(&other);
    make_task(&other, &f, &FIXTURE_OPTIONS, true);
    resumed = kto_train_task(&other);
    EXPECT(resumed.load_state(resumed.context, read, "ckpt") == -1 && strstr(err_msg(), "--loss bco"), "%s", err_msg());
    json_t *legacy = json_object();
    EXPECT(resumed.load_state(resumed.context, legacy, "ckpt") == 0, "a state without kto_loss: %s", err_msg());
    kto_task_free(&other);
    make_task(&other, &f, &bco_options, true);
    resumed = kto_train_task(&other);
    json_object_set_new(legacy, "kto_loss", json_string("bco"));
    EXPECT(resumed.load_state(resumed.context, legacy, "ckpt") == -1 && strstr(err_msg(), "bco_reward_mean"), "%s",
           err_msg());
    json_decref(legacy), json_decref(read), json_decref(state), free(text);
    kto_task_free(&other), kto_task_free(&bco);
    fixture_close(&f);
}

static void test_loss_names(void) {
    const KtoLossKind kinds[3] = {KTO_LOSS_KTO, KTO_LOSS_APO_ZERO_UNPAIRED, KTO_LOSS_BCO};
    for (int k = 0; k < 3; k++) {
        KtoLossKind parsed = (KtoLossKind)-1;
        EXPECT(kto_loss_from_name(kto_loss_name(kinds[k]), &parsed) == 0 && parsed == kinds[k], "%s", kto_loss_name(kinds[k]));
    }
    KtoLossKind unused;
    EXPECT(kto_loss_from_name("apo_zero_unpaired", &unused) == -1 && kto_loss_from_name("", &unused) == -1, "bad names");
}

// Each loss kind's value against its closed form and d loss / d r against central
// differences (h = 1e-5: error about 1e-10 here), at points on both sides of the baseline.
static void test_other_example_losses(void) {
    const double beta = 0.3, points[][2] = {{1.5, 0.25}, {-4.0, 0.0}, {30.0, 2.0}, {-0.5, 1.0}, {0.0, -0.7}};
    for (int kind = KTO_LOSS_APO_ZERO_UNPAIRED; kind <= KTO_LOSS_BCO; kind++) {
        const KtoLossOptions o = {.loss = kind, .beta = beta, .desirable_weight = 1.2, .undesirable_weight = 0.7};
        for (int desirable = 0; desirable < 2; desirable++)
            for (int p = 0; p < 5; p++) {
                double d, unused;
                const double r = points[p][0], baseline = points[p][1], step = 1e-5;
                const double loss = kto_example_loss(&o, desirable, r, baseline, &d);
                const double numeric = (kto_example_loss(&o, desirable, r + step, baseline, &unused) -
                                        kto_example_loss(&o, desirable, r - step, baseline, &unused)) / (2 * step);
                char what[80];
                snprintf(what, sizeof what, "%s %s point %d d/dr", kto_loss_name(kind), desirable ? "desirable" : "undesirable", p);
                EXPECT_CLOSE(d, numeric, 1e-9, 1e-6, what);
                const double sigma = 1.0 / (1.0 + exp(-beta * r)); // sigmoid(beta r)
                double expected;
                if (kind == KTO_LOSS_APO_ZERO_UNPAIRED) // TRL: 1 - sigmoid(beta r) and sigmoid(beta r), weighted
                    expected = desirable ? 1.2 * (1.0 - sigma) : 0.7 * sigma;
                else // -log sigmoid(+-(beta r - delta)), no weights
                    expected = -log(1.0 / (1.0 + exp(-(desirable ? 1 : -1) * (beta * r - baseline))));
                snprintf(what, sizeof what, "%s %s point %d value", kto_loss_name(kind), desirable ? "desirable" : "undesirable", p);
                EXPECT_CLOSE(loss, expected, 1e-14, 1e-12, what);
            }
    }
    const KtoLossOptions bco = {.loss = KTO_LOSS_BCO, .beta = beta};
    double d;
    EXPECT(kto_example_loss(&bco, true, 1e6, 0.0, &d) == 0.0 && d == 0.0, "saturated desirable: d %g", d);
    const double far = kto_example_loss(&bco, false, 1e6, 0.0, &d);
    EXPECT(isfinite(far) && fabs(far - beta * 1e6) < 1e-6 && d == beta, "saturated undesirable: loss %g, d %g", far, d);
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

// The task's largest batch (train/loop.h largest_batch) holds every micro-batch of up to two
// examples, their rows and their mismatched rows: sized for it once, the activations are not
// made again by any of them; and it is no larger than needed (2 rows, the longest of either
// kind), so a micro-batch of three examples does make them again.
static void test_largest_batch_covers_every_micro_batch(void) {
    KtoFixture f;
    fixture_open(&f);
    Model model;
    fixture_load_policy(&model);
    KtoTask task;
    make_task(&task, &f, &FIXTURE_OPTIONS, true);
    // A mismatched row the longest (the examples' longest, example 3's 12 tokens, cut to 9;
    // its mismatched row keeps 11), so that a largest batch without them is too short.
    task.train.lengths[3] = 9;
    TrainTask train = kto_train_task(&task);
    int longest = 0;
    for (int r = 0; r < 4; r++) {
        if (task.train.lengths[r] > longest) longest = task.train.lengths[r];
        if (task.train_kl.lengths[r] > longest) longest = task.train_kl.lengths[r];
    }
    const long batches[][2] = {{0, 1}, {2, 3}, {1, 3}, {0, -1}, {3, 0}};
    fixture_expect_largest_batch(&train, &model, batches, 5, 2, longest, 3);
    kto_task_free(&task);
    model_free(&model);
    fixture_close(&f);
}

int main(void) {
    RUN(test_largest_batch_covers_every_micro_batch);
    RUN(test_mismatched_rows_and_sums);
    RUN(test_loss_and_gradients_match_pytorch);
    RUN(test_at_the_reference);
    RUN(test_baseline_clamped_at_zero);
    RUN(test_example_loss);
    RUN(test_task_errors);
    RUN(test_apo_zero_unpaired_matches_trl);
    RUN(test_bco_matches_trl);
    RUN(test_other_losses_at_the_reference);
    RUN(test_bco_state_round_trip);
    RUN(test_loss_names);
    RUN(test_other_example_losses);
    TEST_EXIT();
}
