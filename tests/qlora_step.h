// One fixed ragged batch through a model with adapters, for the QLoRA checks of
// test_quantize.c and test_bnb.c: a quantized base and its dequantized float32 twin must give
// the same log-probs and adapter gradients.
#pragma once
#include <stdlib.h>
#include <string.h>

#include "model/model.h"

// The log-probs (logp: B * T) of a batch of B rows of T tokens, row b holding row_len[b]
// real tokens, and (unless grads is NULL) the trainable gradients of the mean log-prob
// over the real targets. The tokens are a fixed function of the position.
static void qlora_step(Model *model, int B, int T, const int *row_len, float *logp, float *grads) {
    const int V = model->config.vocab_size;
    int *tokens = malloc((size_t)B * T * sizeof(int)), *targets = malloc((size_t)B * T * sizeof(int));
    float *dlogp = malloc((size_t)B * T * sizeof(float));
    for (int i = 0; i < B * T; i++) tokens[i] = (7 * i + 3) % V;
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) targets[b * T + t] = t + 1 < row_len[b] ? tokens[b * T + t + 1] : -1;
    ModelBatch batch = {.B = B, .T = T, .tokens = tokens, .row_len = row_len};
    model_forward(model, &batch);
    model_logprobs(model, targets, logp, NULL, NULL);
    if (grads) {
        for (int i = 0; i < B * T; i++) dlogp[i] = targets[i] >= 0 ? -1.0f / (float)(B * T) : 0.0f;
        model_zero_grad(model);
        model_backward(model, dlogp, NULL, NULL);
        memcpy(grads, model->grads, (size_t)model_trainable_floats(model) * sizeof(float));
    }
    free(tokens), free(targets), free(dlogp);
}
