// SmolLM2-135M-Instruct, loaded from its real GGUF (Q4_1 + Q8_0 + F32, dequantized to
// f32), against transformers loading the same GGUF (tools/make_smollm2_reference.py,
// float32, eager attention). Next-token log-probs must agree within 2e-4 (measured:
// 5.4e-5) and the top-1 next token must be identical at every position.
// The model comes from scripts/fetch-model, which `make test` runs first.
#include <jansson.h>

#include "core/check.h"
#include "model/weights_io.h"
#include "test.h"

static const char *model_path = "models/SmolLM2-135M-Instruct.Q4_1.gguf";

static void test_smollm2_matches_transformers(void) {
    json_error_t error;
    json_t *reference = json_load_file("tests/fixtures/smollm2/reference.json", 0, &error);
    CHECK(reference, "reference.json: %s", error.text);
    Model model;
    ModelLoadOptions options = {.with_lm_head = true};
    if (model_load(&model, model_path, &ops_cpu, &options) != 0) {
        fprintf(stderr, "  cannot load %s: %s (run scripts/fetch-model)\n", model_path, err_msg());
        test_current_failures++;
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

int main(void) {
    RUN(test_smollm2_matches_transformers);
    TEST_EXIT();
}
