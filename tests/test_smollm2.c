// SmolLM2-135M-Instruct, loaded from its real GGUF (Q4_1 + Q8_0 + F32, dequantized to
// f32), against transformers loading the same GGUF (tools/make_smollm2_reference.py,
// float32, eager attention). Next-token log-probs must agree within 2e-4 (measured:
// 5.4e-5) and the top-1 next token must be identical at every position.
// Text embeddings (model/pooling.h: the final norm's output mean-, last- and
// first-token-pooled, L2-normalised) against transformers' hidden_states[-1] pooled the
// same way (tools/make_embedding_fixtures.py, float32): every component within 1e-4
// (measured: 2.2e-6).
// The model comes from scripts/fetch-model, which `make test` runs first.
#include <jansson.h>

#include "core/check.h"
#include "model/pooling.h"
#include "model/weights_io.h"
#include "test.h"

static const char *model_path = "models/SmolLM2-135M-Instruct.Q4_1.gguf";

// Loads the GGUF with its LM head; on failure counts a test failure and says why.
static bool load_smollm2(Model *model) {
    ModelLoadOptions options = {.with_lm_head = true};
    if (model_load(model, model_path, &ops_cpu, &options) == 0) return true;
    fprintf(stderr, "  cannot load %s: %s (run scripts/fetch-model)\n", model_path, err_msg());
    test_current_failures++;
    return false;
}

static void test_smollm2_matches_transformers(void) {
    json_error_t error;
    json_t *reference = json_load_file("tests/fixtures/smollm2/reference.json", 0, &error);
    CHECK(reference, "reference.json: %s", error.text);
    Model model;
    if (!load_smollm2(&model)) {
        json_decref(reference);
        return;
    }
    double worst = 0;
    size_t index;
    json_t *item;
    json_array_foreach(reference, index, item) {
        json_t *ids = json_object_get(item, "ids"), *logprobs = json_object_get(item, "logprobs");
        json_t *top1 = json_object_get(item, "top1");
        int T = (int)json_array_size(ids);
        int *tokens = xmalloc(T * sizeof(int)), *targets = xmalloc(T * sizeof(int)), *got_top1 = xmalloc(T * sizeof(int));
        float *logp = xmalloc(T * sizeof(float));
        for (int t = 0; t < T; t++) tokens[t] = (int)json_integer_value(json_array_get(ids, t));
        for (int t = 0; t < T; t++) targets[t] = t + 1 < T ? tokens[t + 1] : -1;
        ModelBatch batch = {.B = 1, .T = T, .tokens = tokens};
        model_forward(&model, &batch);
        model_logprobs(&model, targets, logp, got_top1, NULL);
        for (int t = 0; t + 1 < T; t++) {
            double d = fabs(logp[t] - json_real_value(json_array_get(logprobs, t)));
            if (d > worst) worst = d;
        }
        int mismatches = 0;
        for (int t = 0; t < T; t++) mismatches += got_top1[t] != (int)json_integer_value(json_array_get(top1, t));
        EXPECT(mismatches == 0, "prompt %zu: %d top-1 tokens differ", index, mismatches);
        free(tokens), free(targets), free(got_top1), free(logp);
    }
    printf("smollm2: max |logprob difference| vs transformers = %.3g\n", worst);
    EXPECT(worst <= 2e-4, "max log-prob difference %.3g", worst);
    model_free(&model);
    json_decref(reference);
}

static void test_smollm2_embeddings_match_transformers(void) {
    json_error_t error;
    json_t *reference = json_load_file("tests/fixtures/embeddings/smollm2.json", 0, &error);
    CHECK(reference, "smollm2.json: %s", error.text);
    Model model;
    if (!load_smollm2(&model)) {
        json_decref(reference);
        return;
    }
    json_t *inputs = json_object_get(reference, "inputs");
    const int count = (int)json_array_size(inputs), C = model.config.hidden_size;
    CHECK(json_integer_value(json_object_get(reference, "hidden_size")) == C, "the fixture is of another model");
    int **rows = xcalloc(count, sizeof(int *)), *lengths = xcalloc(count, sizeof(int));
    for (int i = 0; i < count; i++) {
        json_t *ids = json_object_get(json_array_get(inputs, i), "ids");
        lengths[i] = (int)json_array_size(ids);
        rows[i] = xmalloc((size_t)lengths[i] * sizeof(int));
        for (int t = 0; t < lengths[i]; t++) rows[i][t] = (int)json_integer_value(json_array_get(ids, t));
    }
    float *got = xmalloc((size_t)count * C * sizeof(float));
    for (Pooling pooling = POOLING_MEAN; pooling <= POOLING_CLS; pooling++) {
        pooled_embeddings(&model, (const int *const *)rows, lengths, count, pooling, got);
        double worst = 0;
        for (int i = 0; i < count; i++) {
            json_t *want = json_object_get(json_array_get(inputs, i), pooling_name(pooling));
            CHECK(json_array_size(want) == (size_t)C, "input %d has no %s vector", i, pooling_name(pooling));
            for (int c = 0; c < C; c++) {
                double d = fabs(got[(size_t)i * C + c] - json_number_value(json_array_get(want, c)));
                if (!(d <= worst)) worst = d;
            }
        }
        printf("smollm2: %s-pooled embeddings: max |difference| vs transformers = %.3g\n", pooling_name(pooling), worst);
        EXPECT(worst <= 1e-4, "%s pooling is %.3g from transformers", pooling_name(pooling), worst);
    }
    for (int i = 0; i < count; i++) free(rows[i]);
    free(rows), free(lengths), free(got);
    model_free(&model);
    json_decref(reference);
}

int main(void) {
    RUN(test_smollm2_matches_transformers);
    RUN(test_smollm2_embeddings_match_transformers);
    TEST_EXIT();
}
