// SmolLM2-135M-Instruct decoded token by token (one-row decode steps) against transformers'
// float32 log-probs (tests/fixtures/smollm2/reference.json), for the quantized types of
// test_quantize.c and test_kquant.c: the top-1 agreement and the mean and largest
// |log-prob difference| over the reference's positions.
#pragma once
#include <jansson.h>
#include <math.h>
#include <stdlib.h>

#include "core/check.h"
#include "model/model.h"

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
        KvCache cache;
        kv_cache_init(&cache, model, 1, T);
        for (int t = 0; t + 1 < T; t++) {
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

