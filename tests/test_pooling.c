// Text embeddings (model/pooling.h) of the tiny chat model against transformers
// (tools/make_embedding_fixtures.py: hidden_states[-1], the final norm's output, pooled
// and L2-normalised in float64). marlhf computes in float32; every component must be
// within 1e-5 of the reference (transformers itself in float32 is 8e-8 from it; a vector
// pooled another way, or not normalised, is off by more than 1e-2). Also: a batch of
// rows of different lengths (right-padded) gives each row's vector alone, the batch's
// order does not matter, and --pooling's names. --pooling none: every token's state,
// unnormalised, against the fixture's per-token states, in a batch and alone.
#include <jansson.h>

#include "core/check.h"
#include "model/pooling.h"
#include "model/weights_io.h"
#include "test.h"

#define TOLERANCE 1e-5

typedef struct {
    json_t *root;
    int count, hidden;
    int **ids;
    int *lengths;
} Reference;

static void reference_open(Reference *r, const char *path) {
    json_error_t error;
    r->root = json_load_file(path, 0, &error);
    CHECK(r->root, "%s: %s", path, error.text);
    json_t *inputs = json_object_get(r->root, "inputs");
    r->count = (int)json_array_size(inputs);
    r->hidden = (int)json_integer_value(json_object_get(r->root, "hidden_size"));
    CHECK(r->count > 0 && r->hidden > 0, "%s is incomplete", path);
    r->ids = xcalloc(r->count, sizeof(int *));
    r->lengths = xcalloc(r->count, sizeof(int));
    for (int i = 0; i < r->count; i++) {
        json_t *ids = json_object_get(json_array_get(inputs, i), "ids");
        r->lengths[i] = (int)json_array_size(ids);
        r->ids[i] = xmalloc((size_t)r->lengths[i] * sizeof(int));
        for (int t = 0; t < r->lengths[i]; t++) r->ids[i][t] = (int)json_integer_value(json_array_get(ids, t));
    }
}

static void reference_close(Reference *r) {
    for (int i = 0; i < r->count; i++) free(r->ids[i]);
    free(r->ids), free(r->lengths);
    json_decref(r->root);
}

// The largest |got - reference| over every component of every input, for one pooling.
static double worst_difference(const Reference *r, const float *got, Pooling pooling) {
    json_t *inputs = json_object_get(r->root, "inputs");
    double worst = 0;
    for (int i = 0; i < r->count; i++) {
        json_t *want = json_object_get(json_array_get(inputs, i), pooling_name(pooling));
        CHECK(json_array_size(want) == (size_t)r->hidden, "input %d has no %s vector", i, pooling_name(pooling));
        for (int c = 0; c < r->hidden; c++) {
            double d = fabs(got[(size_t)i * r->hidden + c] - json_number_value(json_array_get(want, c)));
            if (!(d <= worst)) worst = d; // NaN wins
        }
    }
    return worst;
}

static void load_tiny_chat(Model *model) {
    ModelLoadOptions options = {.with_lm_head = true};
    CHECK(model_load(model, "tests/fixtures/models/tiny_chat", &ops_cpu, &options) == 0, "%s", err_msg());
}

static void test_pooling_matches_transformers(void) {
    Reference r;
    reference_open(&r, "tests/fixtures/embeddings/tiny_chat.json");
    Model model;
    load_tiny_chat(&model);
    CHECK(model.config.hidden_size == r.hidden, "the fixture is of another model");
    float *got = xmalloc((size_t)r.count * r.hidden * sizeof(float));
    const Pooling poolings[] = {POOLING_MEAN, POOLING_LAST, POOLING_CLS};
    for (size_t p = 0; p < sizeof poolings / sizeof poolings[0]; p++) {
        pooled_embeddings(&model, (const int *const *)r.ids, r.lengths, r.count, poolings[p], got);
        const double worst = worst_difference(&r, got, poolings[p]);
        printf("tiny_chat %s pooling: largest difference from transformers %.3g\n", pooling_name(poolings[p]), worst);
        EXPECT(worst <= TOLERANCE, "%s pooling is %.3g from transformers", pooling_name(poolings[p]), worst);
        for (int i = 0; i < r.count; i++) {
            double squares = 0;
            for (int c = 0; c < r.hidden; c++) squares += (double)got[(size_t)i * r.hidden + c] * got[(size_t)i * r.hidden + c];
            EXPECT_CLOSE(sqrt(squares), 1.0, 1e-6, 0, "the vector's length");
        }
    }
    // The poolings differ from each other by far more than the tolerance, so that a test
    // that passes for one could not pass for another (the fixture's texts have several tokens).
    float *mean = xmalloc((size_t)r.count * r.hidden * sizeof(float));
    pooled_embeddings(&model, (const int *const *)r.ids, r.lengths, r.count, POOLING_MEAN, mean);
    EXPECT(worst_difference(&r, mean, POOLING_LAST) > 100 * TOLERANCE, "mean and last pooling agree");
    EXPECT(worst_difference(&r, mean, POOLING_CLS) > 100 * TOLERANCE, "mean and cls pooling agree");
    free(mean), free(got);
    model_free(&model);
    reference_close(&r);
}

// Each row in a right-padded batch with longer and shorter rows, in another order, gives
// the vector it gets alone.
static void test_pooling_batch_equals_alone(void) {
    Reference r;
    reference_open(&r, "tests/fixtures/embeddings/tiny_chat.json");
    Model model;
    load_tiny_chat(&model);
    const int C = r.hidden;
    float *batched = xmalloc((size_t)r.count * C * sizeof(float)), *alone = xmalloc((size_t)C * sizeof(float));
    float *reversed = xmalloc((size_t)r.count * C * sizeof(float));
    const int **rows_reversed = xmalloc((size_t)r.count * sizeof(int *));
    int *lengths_reversed = xmalloc((size_t)r.count * sizeof(int));
    for (int i = 0; i < r.count; i++) {
        rows_reversed[i] = r.ids[r.count - 1 - i];
        lengths_reversed[i] = r.lengths[r.count - 1 - i];
    }
    for (Pooling pooling = POOLING_MEAN; pooling <= POOLING_CLS; pooling++) {
        pooled_embeddings(&model, (const int *const *)r.ids, r.lengths, r.count, pooling, batched);
        pooled_embeddings(&model, rows_reversed, lengths_reversed, r.count, pooling, reversed);
        double worst = 0;
        for (int i = 0; i < r.count; i++) {
            pooled_embeddings(&model, (const int *const *)&r.ids[i], &r.lengths[i], 1, pooling, alone);
            double d = test_max_abs_diff(batched + (size_t)i * C, alone, C);
            double e = test_max_abs_diff(reversed + (size_t)(r.count - 1 - i) * C, alone, C);
            worst = fmax(worst, fmax(d, e));
        }
        printf("%s pooling: batched vs alone differ by %.3g\n", pooling_name(pooling), worst);
        EXPECT(worst <= 1e-6, "%s pooling: a row in a batch differs from the row alone by %.3g", pooling_name(pooling),
               worst);
    }
    free(batched), free(alone), free(reversed), free(rows_reversed), free(lengths_reversed);
    model_free(&model);
    reference_close(&r);
}

// --pooling none: the per-token final hidden states of a right-padded batch of every
// fixture text (token_embeddings) against transformers' hidden_states[-1] (float64), and
// each row alone against the same row in the batch.
static void test_token_embeddings_match_transformers(void) {
    Reference r;
    reference_open(&r, "tests/fixtures/embeddings/tiny_chat.json");
    Model model;
    load_tiny_chat(&model);
    const int C = r.hidden;
    long tokens = 0;
    for (int i = 0; i < r.count; i++) tokens += r.lengths[i];
    float *got = xmalloc((size_t)tokens * C * sizeof(float)), *alone = xmalloc((size_t)tokens * C * sizeof(float));
    token_embeddings(&model, (const int *const *)r.ids, r.lengths, r.count, got);
    json_t *inputs = json_object_get(r.root, "inputs");
    double worst = 0, worst_alone = 0, largest = 0;
    long at = 0;
    for (int i = 0; i < r.count; i++) {
        json_t *want = json_object_get(json_array_get(inputs, i), "none");
        CHECK(json_array_size(want) == (size_t)r.lengths[i], "input %d has no per-token states", i);
        token_embeddings(&model, (const int *const *)&r.ids[i], &r.lengths[i], 1, alone);
        for (int t = 0; t < r.lengths[i]; t++, at++) {
            json_t *state = json_array_get(want, t);
            CHECK(json_array_size(state) == (size_t)C, "input %d token %d: %zu components", i, t, json_array_size(state));
            for (int c = 0; c < C; c++) {
                const double w = json_number_value(json_array_get(state, c)), g = got[(size_t)at * C + c];
                const double d = fabs(g - w);
                if (!(d <= worst)) worst = d;
                largest = fmax(largest, fabs(w));
                worst_alone = fmax(worst_alone, fabs(g - alone[(size_t)t * C + c]));
            }
        }
    }
    printf("tiny_chat pooling none: %ld tokens, largest difference from transformers %.3g (largest component %.3g), "
           "batched vs alone %.3g\n", tokens, worst, largest, worst_alone);
    EXPECT(worst <= TOLERANCE, "per-token states are %.3g from transformers", worst);
    // Float rounding relative to the states' size (up to ~4 here: not unit vectors).
    EXPECT(worst_alone <= 1e-6 * fmax(1, largest), "a row's per-token states in a batch differ from the row alone by %.3g",
           worst_alone);
    // Not normalised: the states' lengths are those of the final norm's output, far from 1.
    double squares = 0;
    for (int c = 0; c < C; c++) squares += (double)got[c] * got[c];
    EXPECT(fabs(sqrt(squares) - 1) > 0.1, "the first token's state has length %.3g: normalised?", sqrt(squares));
    free(got), free(alone);
    model_free(&model);
    reference_close(&r);
}

static void test_pooling_names(void) {
    Pooling pooling = POOLING_CLS;
    EXPECT(pooling_parse("mean", "--pooling", &pooling) == 0 && pooling == POOLING_MEAN, "mean");
    EXPECT(pooling_parse("last", "--pooling", &pooling) == 0 && pooling == POOLING_LAST, "last");
    EXPECT(pooling_parse("cls", "--pooling", &pooling) == 0 && pooling == POOLING_CLS, "cls");
    EXPECT(pooling_parse("none", "--pooling", &pooling) == 0 && pooling == POOLING_NONE, "none");
    EXPECT(pooling_parse("max", "--pooling", &pooling) == -1, "max is not a pooling");
    EXPECT(strstr(err_msg(), "--pooling") && strstr(err_msg(), "'max'"), "the error names the option and value: %s",
           err_msg());
    EXPECT(pooling_parse("", "--pooling", &pooling) == -1, "an empty name");
    for (Pooling p = POOLING_MEAN; p <= POOLING_NONE; p++) {
        Pooling back;
        EXPECT(pooling_parse(pooling_name(p), "--pooling", &back) == 0 && back == p, "%s", pooling_name(p));
    }
}

int main(void) {
    RUN(test_pooling_matches_transformers);
    RUN(test_pooling_batch_equals_alone);
    RUN(test_token_embeddings_match_transformers);
    RUN(test_pooling_names);
    TEST_EXIT();
}
