// Decoding checks shared by test_quantize.c and test_kquant.c (include after test.h):
// decode_logits, a fixed prefill and decode steps; SmolLM2-135M-Instruct loaded (quantized or
// not) and decoded token by token against transformers' float32 log-probs
// (tests/fixtures/smollm2/reference.json): the top-1 agreement and the mean and largest
// |log-prob difference| over the reference's positions.
#pragma once
#include <jansson.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>

#include "core/check.h"
#include "model/model.h"
#include "model/weights_io.h"

// Prefill of 2 rows, then decode steps; the logits after each step.
static void decode_logits(Model *model, float *logits, int steps) {
    const int V = model->config.vocab_size, T = 5;
    int prompt[2 * T], start[2] = {0, 2};
    for (int i = 0; i < 2 * T; i++) prompt[i] = (7 * i + 3) % V;
    KvCache cache;
    kv_cache_init(&cache, model, 2, T + steps);
    ModelBatch batch = {.B = 2, .T = T, .tokens = prompt, .row_start = start};
    model_forward_cached(model, &batch, &cache);
    for (int step = 0; step < steps; step++) {
        model_last_logits(model, logits + (long)step * 2 * V);
        int next[2] = {(11 * step + 1) % V, (13 * step + 5) % V};
        ModelBatch one = {.B = 2, .T = 1, .tokens = next};
        model_forward_cached(model, &one, &cache);
    }
    kv_cache_free(&cache, model);
}

// Under the sanitizers only the first positions of the first text are decoded: the
// quantized kernels and the cache still run on SmolLM2's shapes there, and the agreement
// figures, which need every position (and took most of test_quantize's and test_kquant's
// sanitized minutes), are the plain build's to check: smollm2_figures_checked() says whether
// a test should assert them.
enum { SMOLLM2_SANITIZED_POSITIONS = 4 };
static inline bool smollm2_figures_checked(const char *test) {
    if (!TEST_SANITIZED) return true;
    printf("# %s: %d positions decoded; the agreement figures are checked in the plain build\n", test,
           SMOLLM2_SANITIZED_POSITIONS);
    return false;
}

// transformers' float32 log-probs of SmolLM2 on the reference texts.
static json_t *smollm2_reference(void) {
    json_error_t error;
    json_t *reference = json_load_file("tests/fixtures/smollm2/reference.json", 0, &error);
    CHECK(reference, "reference.json: %s", error.text);
    return reference;
}

// SmolLM2's test file loaded with `quantize` (NULL: float32); where it cannot be, says so,
// counts a failed check and returns -1.
static int smollm2_load(Model *model, const char *quantize) {
    ModelLoadOptions options = {.with_lm_head = true, .quantize = quantize};
    if (model_load(model, "models/SmolLM2-135M-Instruct.Q4_1.gguf", &ops_cpu, &options) == 0) return 0;
    fprintf(stderr, "  cannot load SmolLM2: %s (run scripts/fetch-model)\n", err_msg());
    test_current_failures++;
    return -1;
}

static void smollm2_decode_agreement(Model *model, json_t *reference, double *agreement_out, double *mean_out,
                                     double *worst_out) {
    const int V = model->config.vocab_size;
    float *logits = xmalloc((size_t)V * sizeof(float));
    double worst = 0, total = 0;
    int positions = 0, top1_agree = 0;
    size_t index;
    json_t *item;
    json_array_foreach(reference, index, item) {
        json_t *ids = json_object_get(item, "ids"), *logprobs = json_object_get(item, "logprobs");
        json_t *top1 = json_object_get(item, "top1");
        int T = (int)json_array_size(ids);
        if (TEST_SANITIZED && positions >= SMOLLM2_SANITIZED_POSITIONS) break;
        KvCache cache;
        kv_cache_init(&cache, model, 1, T);
        for (int t = 0; t + 1 < T && !(TEST_SANITIZED && positions >= SMOLLM2_SANITIZED_POSITIONS); t++) {
            int token = (int)json_integer_value(json_array_get(ids, t));
            ModelBatch one = {.B = 1, .T = 1, .tokens = &token};
            model_forward_cached(model, &one, &cache);
            model_last_logits(model, logits);
            double largest = -INFINITY, sum = 0;
            int best = 0;
            for (int v = 0; v < V; v++)
                if (logits[v] > largest) largest = logits[v], best = v;
            for (int v = 0; v < V; v++) sum += exp(logits[v] - largest);
            int next = (int)json_integer_value(json_array_get(ids, t + 1));
            double logp = logits[next] - largest - log(sum);
            double d = fabs(logp - json_real_value(json_array_get(logprobs, t)));
            worst = fmax(worst, d);
            total += d;
            positions++;
            top1_agree += best == (int)json_integer_value(json_array_get(top1, t));
        }
        kv_cache_free(&cache, model);
    }
    *agreement_out = (double)top1_agree / positions;
    *mean_out = total / positions;
    *worst_out = worst;
    free(logits);
}

