#include "model/pooling.h"

#include <math.h>
#include <string.h>

#include "core/check.h"

static const char *const pooling_names[] = {[POOLING_MEAN] = "mean", [POOLING_LAST] = "last", [POOLING_CLS] = "cls",
                                            [POOLING_NONE] = "none"};

int pooling_parse(const char *name, const char *option, Pooling *out) {
    for (size_t i = 0; i < sizeof pooling_names / sizeof pooling_names[0]; i++)
        if (strcmp(name, pooling_names[i]) == 0) {
            *out = (Pooling)i;
            return 0;
        }
    return err_set("%s must be mean, last, cls or none, got '%s'", option, name);
}

const char *pooling_name(Pooling pooling) { return pooling_names[pooling]; }

// Scales the vector to unit length (a zero vector stays zero, as llama.cpp leaves it).
static void l2_normalise(const double *in, float *out, int n) {
    double squares = 0;
    for (int i = 0; i < n; i++) squares += in[i] * in[i];
    const double scale = squares > 0 ? 1.0 / sqrt(squares) : 0.0;
    for (int i = 0; i < n; i++) out[i] = (float)(in[i] * scale);
}

// One forward of the rows, right-padded to the longest.
static void forward_rows(Model *model, const int *const *rows, const int *lengths, int count) {
    int T = 0;
    for (int b = 0; b < count; b++) {
        CHECK(lengths[b] >= 1 && lengths[b] <= model->config.max_position_embeddings,
              "embedding row %d has %d tokens, outside [1, %d]", b, lengths[b], model->config.max_position_embeddings);
        if (lengths[b] > T) T = lengths[b];
    }
    // Right padding with token 0 (any id in range would do: no real token attends to it).
    int *tokens = xcalloc((size_t)count * T, sizeof(int));
    for (int b = 0; b < count; b++) memcpy(tokens + (size_t)b * T, rows[b], (size_t)lengths[b] * sizeof(int));
    ModelBatch batch = {.B = count, .T = T, .tokens = tokens, .row_len = lengths};
    model_forward(model, &batch);
    free(tokens);
}

void token_embeddings(Model *model, const int *const *rows, const int *lengths, int count, float *out) {
    forward_rows(model, rows, lengths, count);
    size_t at = 0;
    for (int b = 0; b < count; b++) {
        model_hidden_slots(model, b, 0, lengths[b], out + at);
        at += (size_t)lengths[b] * model->config.hidden_size;
    }
}

void pooled_embeddings(Model *model, const int *const *rows, const int *lengths, int count, Pooling pooling,
                       float *out) {
    CHECK(pooling != POOLING_NONE, "pooled_embeddings: --pooling none has no pooled vector (token_embeddings)");
    const int C = model->config.hidden_size;
    int T = 0;
    for (int b = 0; b < count; b++) T = lengths[b] > T ? lengths[b] : T;
    forward_rows(model, rows, lengths, count);

    // The states are summed in double: a long text's mean is then as exact as its terms.
    float *states = xmalloc((size_t)T * C * sizeof(float));
    double *pooled = xmalloc((size_t)C * sizeof(double));
    for (int b = 0; b < count; b++) {
        const int first = pooling == POOLING_LAST ? lengths[b] - 1 : 0;
        const int slots = pooling == POOLING_MEAN ? lengths[b] : 1;
        model_hidden_slots(model, b, first, slots, states);
        for (int c = 0; c < C; c++) pooled[c] = 0;
        for (int t = 0; t < slots; t++)
            for (int c = 0; c < C; c++) pooled[c] += states[(size_t)t * C + c];
        for (int c = 0; c < C; c++) pooled[c] /= slots;
        l2_normalise(pooled, out + (size_t)b * C, C);
    }
    free(pooled), free(states);
}
