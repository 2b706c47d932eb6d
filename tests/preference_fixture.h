// What tests/test_dpo.c and tests/test_kto.c share: reading a PyTorch reference fixture of
// tools/make_{dpo,kto}_fixtures.py (safetensors), copying its token rows, the tiny Llama
// they were computed on, and the gradient comparison.
#pragma once
#include <string.h>

#include "core/check.h"
#include "io/safetensors.h"
#include "model/weights_io.h"
#include "test.h"
#include "train/sft.h"

// Tensor `name` of `set` (read from `path`) as floats; *count (may be NULL) its size.
static inline float *fixture_floats(SafetensorsSet *set, const char *path, const char *name, long long *count) {
    const SafetensorsTensor *t = safetensors_find(set, name);
    CHECK(t, "%s has no tensor %s", path, name);
    float *out = xmalloc((size_t)t->count * sizeof(float));
    CHECK(safetensors_read_f32(t, out, t->count) == 0, "%s", err_msg());
    if (count) *count = t->count;
    return out;
}

static inline int64_t *fixture_ints(SafetensorsSet *set, const char *path, const char *name) {
    const SafetensorsTensor *t = safetensors_find(set, name);
    CHECK(t, "%s has no tensor %s", path, name);
    int64_t *out = xmalloc((size_t)t->count * sizeof(int64_t));
    CHECK(safetensors_read_i64(t, out, t->count) == 0, "%s", err_msg());
    return out;
}

// A deep copy of rows (the tasks take their rows over).
static inline TokenizedExamples fixture_copy_rows(const TokenizedExamples *rows) {
    TokenizedExamples copy = {.count = rows->count};
    copy.ids = xcalloc((size_t)rows->count, sizeof(int *));
    copy.lengths = xcalloc((size_t)rows->count, sizeof(int));
    copy.prompt_lengths = xcalloc((size_t)rows->count, sizeof(int));
    for (long r = 0; r < rows->count; r++) {
        copy.lengths[r] = rows->lengths[r], copy.prompt_lengths[r] = rows->prompt_lengths[r];
        copy.ids[r] = xmalloc((size_t)rows->lengths[r] * sizeof(int));
        memcpy(copy.ids[r], rows->ids[r], (size_t)rows->lengths[r] * sizeof(int));
    }
    return copy;
}

// The tiny Llama of tests/fixtures/models/llama with gradients, as the fixtures saw it.
static inline void fixture_load_policy(Model *model) {
    ModelLoadOptions options = {.with_lm_head = true};
    CHECK(model_load(model, "tests/fixtures/models/llama", &ops_cpu, &options) == 0, "%s", err_msg());
    model_enable_grad(model);
}

// Every weight's gradient within 1e-3 relative of the tensor's largest (floored at 1e-3 of
// the whole gradient's largest), as tests/test_model.c checks the causal-LM gradients.
static inline void fixture_expect_gradients(const Model *model, const float *want, const char *what) {
    double global = 0;
    for (long j = 0; j < model->table.total; j++) global = fmax(global, fabs(want[j]));
    for (int i = 0; i < model->table.count; i++) {
        const ParamEntry *e = &model->table.entries[i];
        double scale = 1e-3 * global;
        for (long j = 0; j < e->numel; j++) scale = fmax(scale, fabs(want[e->offset + j]));
        double ratio = test_worst_ratio(model->grads + e->offset, want + e->offset, e->numel, 1e-4 * scale, 1e-3);
        EXPECT(ratio <= 1.0, "%s gradient of %s: worst error %.3g x tolerance", what, e->name, ratio);
    }
}

// The task's largest batch for micro-batches of two examples (train/loop.h largest_batch):
// `want_rows` rows of `want_length` tokens. Reserved, it holds every micro-batch of
// `batches` (two examples, or one and -1): none makes the activations again. And it is no
// larger than needed: a micro-batch of examples 0, 1 and 2 does, in `rows_of_three` rows.
static inline void fixture_expect_largest_batch(TrainTask *train, Model *model, const long (*batches)[2], int count,
                                                int want_rows, int want_length, int rows_of_three) {
    int rows = 0, length = 0;
    train->largest_batch(train->context, 2, &rows, &length);
    EXPECT(rows == want_rows && length == want_length, "largest batch %d rows of %d tokens, want %d of %d", rows,
           length, want_rows, want_length);
    model_reserve(model, rows, length);
    const float *residual = model->acts.residual;
    for (int i = 0; i < count; i++) {
        MicroStepResult result = {0};
        train->micro_step(train->context, model, batches[i], batches[i][1] < 0 ? 1 : 2, 0.25, &result);
        EXPECT(model->acts.residual == residual && model->acts.capacity_B == want_rows &&
                   model->acts.capacity_T == want_length,
               "micro-batch %d made the activations again (%d x %d)", i, model->acts.capacity_B,
               model->acts.capacity_T);
    }
    const long three[3] = {0, 1, 2};
    MicroStepResult result = {0};
    train->micro_step(train->context, model, three, 3, 0.25, &result);
    EXPECT(model->acts.capacity_B == rows_of_three, "three examples ran in %d rows' activations, want %d",
           model->acts.capacity_B, rows_of_three);
}
