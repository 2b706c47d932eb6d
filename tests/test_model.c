// The transformer engine against PyTorch (tools/make_model_fixtures.py).
//
// For tiny GPT-2, Llama (GQA, untied), Llama (MQA, tied), Qwen2 and Gemma models, the
// references were computed by transformers in float64; marlhf computes in float32.
// Tolerances (|got - want| <= atol + rtol*|want|):
//   logits, log-probs, values ........ 1e-4 + 1e-4 relative
//   loss ............................. 1e-5 relative
//   every gradient ................... 1e-5 + 1e-3 relative, per tensor scaled by its
//                                      largest reference magnitude (see check_buffer)
//   10 AdamW steps: losses 1e-4 rel., grad norms 1e-3 rel., final weights 2e-3 abs.
//                   (Adam divides by sqrt(v), which magnifies float32 noise in near-zero
//                   gradients; the fixture README measures PyTorch float32 at 7e-4.)
// Also: a ragged batch equals each row alone, left padding equals right padding,
// gradient checkpointing gives bit-identical gradients, gradient accumulation over
// two micro-batches equals one batch, and the LM head run on the target slots only equals
// the whole head there.
// LoRA (tools/make_lora_fixtures.py: PEFT adapters, rank 4, alpha 8, all seven modules,
// references in float64): logits 1e-4 + 1e-4 relative, loss 1e-5 relative, adapter
// gradients as above; a fresh adapter and a disabled one leave the base model's log-probs
// bit-identical; the merged model saved beside the adapter gives the same log-probs
// (1e-5); training moves the adapters only; the frozen base costs no gradient memory.
#include <stdint.h>

#include "core/check.h"
#include "core/rng.h"
#include "io/fs.h"
#include "io/gguf.h"
#include "io/gguf_dequant.h"
#include "io/safetensors.h"
#include "model/lora.h"
#include "model/tensor_map.h"
#include "model/weights_io.h"
#include "test.h"
#include "tokenizer/tokenizer.h"
#include "train/adamw.h"
#include "train/lr_schedule.h"

static const char *fixture_names[] = {"gpt2",  "llama", "llama_tied", "llama3_rope",   "qwen2",         "qwen3",
                                      "gemma", "gemma2", "gemma3", "mistral_window", "gemma2_window", "gemma3_window",
                                      "qwen2_window"};

typedef struct {
    char dir[256], reference[300];
    SafetensorsSet *ref;
    int B, T, V;
    int *tokens, *targets, *row_len;
    int valid_targets;
} Fixture;

static float *read_floats(const Fixture *f, const char *name, long long *count) {
    const SafetensorsTensor *t = safetensors_find(f->ref, name);
    CHECK(t, "fixture %s has no tensor %s", f->reference, name);
    float *out = xmalloc((size_t)t->count * sizeof(float));
    CHECK(safetensors_read_f32(t, out, t->count) == 0, "%s", err_msg());
    if (count) *count = t->count;
    return out;
}

static void fixture_open(Fixture *f, const char *name) {
    memset(f, 0, sizeof *f);
    snprintf(f->dir, sizeof f->dir, "tests/fixtures/models/%s", name);
    snprintf(f->reference, sizeof f->reference, "%s/reference.safetensors", f->dir);
    CHECK(safetensors_open(f->reference, &f->ref) == 0, "%s", err_msg());
    const SafetensorsTensor *ids = safetensors_find(f->ref, "input_ids");
    const SafetensorsTensor *lengths = safetensors_find(f->ref, "lengths");
    const SafetensorsTensor *logits = safetensors_find(f->ref, "logits");
    CHECK(ids && lengths && logits, "fixture %s is incomplete", f->reference);
    f->B = (int)ids->shape[0];
    f->T = (int)ids->shape[1];
    f->V = (int)logits->shape[2];
    int64_t *ids64 = xmalloc((size_t)ids->count * sizeof(int64_t));
    int64_t *len64 = xmalloc((size_t)lengths->count * sizeof(int64_t));
    CHECK(safetensors_read_i64(ids, ids64, ids->count) == 0, "%s", err_msg());
    CHECK(safetensors_read_i64(lengths, len64, lengths->count) == 0, "%s", err_msg());
    long N = (long)f->B * f->T;
    f->tokens = xmalloc(N * sizeof(int));
    f->targets = xmalloc(N * sizeof(int));
    f->row_len = xmalloc(f->B * sizeof(int));
    for (long i = 0; i < N; i++) f->tokens[i] = (int)ids64[i];
    for (int b = 0; b < f->B; b++) {
        f->row_len[b] = (int)len64[b];
        for (int t = 0; t < f->T; t++) {
            bool valid = t + 1 < f->row_len[b];
            f->targets[(long)b * f->T + t] = valid ? f->tokens[(long)b * f->T + t + 1] : -1;
            f->valid_targets += valid;
        }
    }
    free(ids64);
    free(len64);
}

static void fixture_close(Fixture *f) {
    safetensors_close(f->ref);
    free(f->tokens), free(f->targets), free(f->row_len);
}

static void load_model(Model *model, const Fixture *f, bool value_head) {
    ModelLoadOptions options = {.with_lm_head = true, .with_value_head = value_head};
    CHECK(model_load(model, f->dir, &ops_cpu, &options) == 0, "%s", err_msg());
}

// loss = -mean log p over valid targets; returns the loss and fills dlogp.
static double causal_lm_loss(Model *model, const Fixture *f, float *dlogp) {
    long N = (long)f->B * f->T;
    float *logp = xmalloc(N * sizeof(float));
    model_logprobs(model, f->targets, logp, NULL, NULL);
    double loss = 0;
    for (long i = 0; i < N; i++) {
        if (f->targets[i] >= 0) loss -= logp[i];
        if (dlogp) dlogp[i] = f->targets[i] >= 0 ? -1.0f / f->valid_targets : 0.0f;
    }
    free(logp);
    return loss / f->valid_targets;
}

// Compares each parameter tensor of `got` with `want` (both laid out like the table).
// Tolerance per tensor: atol_scale * S + rtol * |want|, S = max|want| over the tensor, but at
// least 1e-2 x the largest gradient of the model: tensors whose true gradient is zero (the
// key bias, which softmax ignores) only carry float32 rounding noise, and with atol_scale
// 1e-5 that floor is 1e-7 of the largest gradient, about two float32 ulps of it. (At 1e-3,
// a tenth of an ulp, GPT-2's key-bias noise of 1.1e-8 x the largest gradient failed once
// the GELU's tanh rounded differently: ops/cpu/vector_math.h.)
static void check_buffer(const Model *model, const float *got, const float *want, double atol_scale,
                         double rtol, const char *what, const char *fixture) {
    double global_scale = 0;
    for (long j = 0; j < model->table.total; j++)
        if (fabs(want[j]) > global_scale) global_scale = fabs(want[j]);
    for (int i = 0; i < model->table.count; i++) {
        const ParamEntry *e = &model->table.entries[i];
        double scale = 1e-2 * global_scale;
        for (long j = 0; j < e->numel; j++)
            if (fabs(want[e->offset + j]) > scale) scale = fabs(want[e->offset + j]);
        double ratio = test_worst_ratio(got + e->offset, want + e->offset, e->numel, atol_scale * scale, rtol);
        if (!(ratio <= 1.0)) {
            fprintf(stderr, "  %s %s %s: worst error is %.3g x tolerance\n", fixture, what, e->name, ratio);
            test_current_failures++;
        }
    }
}

// After a forward over the fixture's batch: the largest error of the logits at real slots
// against `want` [B, T, V], as a multiple of the tolerance 1e-4 + 1e-4 relative.
static double worst_logits_ratio(Model *model, const Fixture *f, const float *want) {
    float *row = xmalloc(f->V * sizeof(float));
    double worst = 0;
    for (int b = 0; b < f->B; b++)
        for (int t = 0; t < f->row_len[b]; t++) {
            long i = (long)b * f->T + t;
            model_logits_row(model, (int)i, row);
            double r = test_worst_ratio(row, want + i * f->V, f->V, 1e-4, 1e-4);
            if (r > worst) worst = r;
        }
    free(row);
    return worst;
}

// The fixture `name` opened, its model loaded with gradients, and a forward over its batch.
static void fixture_forward_with_grad(Fixture *f, Model *model, const char *name) {
    fixture_open(f, name);
    load_model(model, f, false);
    model_enable_grad(model);
    ModelBatch batch = {.B = f->B, .T = f->T, .tokens = f->tokens, .row_len = f->row_len};
    model_forward(model, &batch);
}

static void test_logits_loss_and_gradients(void) {
    for (size_t k = 0; k < sizeof fixture_names / sizeof fixture_names[0]; k++) {
        Fixture f;
        Model model;
        fixture_forward_with_grad(&f, &model, fixture_names[k]);

        float *want_logits = read_floats(&f, "logits", NULL);
        double worst = worst_logits_ratio(&model, &f, want_logits);
        EXPECT(worst <= 1.0, "%s logits: worst error %.3g x tolerance", fixture_names[k], worst);

        long N = (long)f.B * f.T;
        float *dlogp = xmalloc(N * sizeof(float));
        double loss = causal_lm_loss(&model, &f, dlogp);
        float *want_loss = read_floats(&f, "loss", NULL);
        EXPECT_CLOSE(loss, want_loss[0], 0, 1e-5, fixture_names[k]);

        model_zero_grad(&model);
        model_backward(&model, dlogp, NULL, NULL);
        float *want_grads = xcalloc(model.table.total, sizeof(float));
        CHECK(model_read_named_tensors(&model, f.reference, "grad.", want_grads) == 0, "%s", err_msg());
        check_buffer(&model, model.grads, want_grads, 1e-5, 1e-3, "grad", fixture_names[k]);

        free(want_logits), free(dlogp), free(want_loss), free(want_grads);
        model_free(&model);
        fixture_close(&f);
    }
}

static void test_adamw_ten_steps(void);
static void test_recompute_is_exact(void);
static void test_gradient_accumulation(void);
static void test_gradient_writes(void);

// The fused q/k/v product (model/transformer.c, layer_fuses_qkv), which the CPU leaves to
// the GPU by default (ops.h, fuses_qkv_products), forced on: it is taken by the layers of
// the fixtures that allow it (RoPE rotated inside the attention, no q/k norms, no biases
// between the weights, no query scale), and those fixtures' logits, loss, gradients, AdamW
// steps, recomputed backward, accumulation and first-writes checks hold as they do without it.
static void test_fused_qkv_products(void) {
    model_set_qkv_fusion(MODEL_QKV_FUSION_ON);
    static const char *fusing[] = {"llama", "llama_tied", "llama3_rope", "gemma", "mistral_window"};
    for (size_t k = 0; k < sizeof fixture_names / sizeof fixture_names[0]; k++) {
        bool expected = false;
        for (size_t i = 0; i < sizeof fusing / sizeof fusing[0]; i++) expected |= !strcmp(fusing[i], fixture_names[k]);
        Fixture f;
        Model model;
        fixture_forward_with_grad(&f, &model, fixture_names[k]);
        int fused = 0;
        for (int l = 0; l < model.config.num_layers; l++) fused += model.acts.layers[l].qkv_fused;
        EXPECT(fused == (expected ? model.config.num_layers : 0), "%s: %d of %d layers fused q/k/v (expected %s)",
               fixture_names[k], fused, model.config.num_layers, expected ? "all" : "none");
        model_free(&model);
        fixture_close(&f);
    }
    test_logits_loss_and_gradients();
    test_adamw_ten_steps();
    test_recompute_is_exact();
    test_gradient_accumulation();
    test_gradient_writes();
    model_set_qkv_fusion(MODEL_QKV_FUSION_BACKEND);
}

static void test_value_head(void) {
    for (size_t k = 0; k < sizeof fixture_names / sizeof fixture_names[0]; k++) {
        Fixture f;
        fixture_open(&f, fixture_names[k]);
        Model model;
        load_model(&model, &f, true);
        model_enable_grad(&model);
        float *value_head = read_floats(&f, "value_head.weight", NULL);
        memcpy(model.weights.value_head, value_head, model.config.hidden_size * sizeof(float));
        ModelBatch batch = {.B = f.B, .T = f.T, .tokens = f.tokens, .row_len = f.row_len};
        model_forward(&model, &batch);
        long N = (long)f.B * f.T;
        float *values = xmalloc(N * sizeof(float));
        model_values(&model, values);
        float *want_values = read_floats(&f, "values", NULL);
        float *dvalue = read_floats(&f, "dvalue", NULL);
        for (int b = 0; b < f.B; b++)
            for (int t = 0; t < f.row_len[b]; t++) {
                long i = (long)b * f.T + t;
                EXPECT_CLOSE(values[i], want_values[i], 1e-4, 1e-4, fixture_names[k]);
            }
        model_zero_grad(&model);
        model_backward(&model, NULL, NULL, dvalue);
        float *want_grads = xcalloc(model.table.total, sizeof(float));
        CHECK(model_read_named_tensors(&model, f.reference, "vgrad.", want_grads) == 0, "%s", err_msg());
        check_buffer(&model, model.grads, want_grads, 1e-5, 1e-3, "value grad", fixture_names[k]);
        free(value_head), free(values), free(want_values), free(dvalue), free(want_grads);
        model_free(&model);
        fixture_close(&f);
    }
}

static void test_adamw_ten_steps(void) {
    for (size_t k = 0; k < sizeof fixture_names / sizeof fixture_names[0]; k++) {
        Fixture f;
        fixture_open(&f, fixture_names[k]);
        Model model;
        load_model(&model, &f, false);
        model_enable_grad(&model);
        AdamW opt;
        adamw_init(&opt, &model, (AdamWConfig){.beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f});
        LrSchedule schedule = {.kind = LR_COSINE, .peak_lr = 1e-2f, .warmup_steps = 3, .total_steps = 10};
        float *want_losses = read_floats(&f, "adamw_losses", NULL);
        float *want_norms = read_floats(&f, "adamw_grad_norms", NULL);
        float *want_lrs = read_floats(&f, "adamw_lrs", NULL);
        long N = (long)f.B * f.T;
        float *dlogp = xmalloc(N * sizeof(float));
        ModelBatch batch = {.B = f.B, .T = f.T, .tokens = f.tokens, .row_len = f.row_len};
        for (int step = 0; step < 10; step++) {
            model_forward(&model, &batch);
            double loss = causal_lm_loss(&model, &f, dlogp);
            model_zero_grad(&model);
            model_backward(&model, dlogp, NULL, NULL);
            double norm = grad_global_norm(&model);
            float lr = lr_schedule_at(&schedule, step);
            EXPECT_CLOSE(loss, want_losses[step], 0, 1e-4, "adamw loss");
            EXPECT_CLOSE(norm, want_norms[step], 0, 1e-3, "adamw grad norm");
            EXPECT_CLOSE(lr, want_lrs[step], 1e-9, 1e-6, "adamw lr");
            adamw_step(&opt, &model, lr, grad_clip_coefficient(norm, 1.0f));
        }
        float *want_final = xcalloc(model.table.total, sizeof(float));
        CHECK(model_read_named_tensors(&model, f.reference, "final.", want_final) == 0, "%s", err_msg());
        double worst = test_max_abs_diff(model.params, want_final, model.table.total);
        EXPECT(worst <= 2e-3, "%s final weights differ by %.3g", fixture_names[k], worst);
        free(want_losses), free(want_norms), free(want_lrs), free(dlogp), free(want_final);
        adamw_free(&opt);
        model_free(&model);
        fixture_close(&f);
    }
}

// Each row of the ragged batch, run alone (and left-padded), gives the same logits.
static void test_padding_invariance(void) {
    for (size_t k = 0; k < sizeof fixture_names / sizeof fixture_names[0]; k++) {
        Fixture f;
        fixture_open(&f, fixture_names[k]);
        Model model;
        load_model(&model, &f, false);
        ModelBatch batch = {.B = f.B, .T = f.T, .tokens = f.tokens, .row_len = f.row_len};
        model_forward(&model, &batch);
        long N = (long)f.B * f.T;
        float *batched = xmalloc(N * f.V * sizeof(float));
        for (long i = 0; i < N; i++) model_logits_row(&model, (int)i, batched + i * f.V);
        float *alone = xmalloc(f.V * sizeof(float));
        for (int b = 0; b < f.B; b++) {
            int L = f.row_len[b];
            ModelBatch one = {.B = 1, .T = L, .tokens = f.tokens + (long)b * f.T, .row_len = &L};
            model_forward(&model, &one);
            double worst = 0;
            for (int t = 0; t < L; t++) {
                model_logits_row(&model, t, alone);
                double d = test_max_abs_diff(alone, batched + ((long)b * f.T + t) * f.V, f.V);
                if (d > worst) worst = d;
            }
            EXPECT(worst <= 1e-5, "%s row %d alone differs from the batch by %.3g", fixture_names[k], b, worst);
            // The same row left-padded by 5 slots of junk tokens.
            int pad = 5, T = L + pad, start = pad;
            int *tokens = xmalloc(T * sizeof(int));
            for (int t = 0; t < pad; t++) tokens[t] = (t * 7 + 3) % f.V;
            memcpy(tokens + pad, f.tokens + (long)b * f.T, L * sizeof(int));
            ModelBatch left = {.B = 1, .T = T, .tokens = tokens, .row_start = &start, .row_len = &L};
            model_forward(&model, &left);
            worst = 0;
            for (int t = 0; t < L; t++) {
                model_logits_row(&model, pad + t, alone);
                double d = test_max_abs_diff(alone, batched + ((long)b * f.T + t) * f.V, f.V);
                if (d > worst) worst = d;
            }
            EXPECT(worst <= 1e-5, "%s row %d left-padded differs by %.3g", fixture_names[k], b, worst);
            free(tokens);
        }
        free(batched), free(alone);
        model_free(&model);
        fixture_close(&f);
    }
}

static void run_gradients(Model *model, const Fixture *f, float *dlogp) {
    ModelBatch batch = {.B = f->B, .T = f->T, .tokens = f->tokens, .row_len = f->row_len};
    model_forward(model, &batch);
    causal_lm_loss(model, f, dlogp);
    model_zero_grad(model);
    model_backward(model, dlogp, NULL, NULL);
}

static void test_recompute_is_exact(void) {
    for (size_t k = 0; k < sizeof fixture_names / sizeof fixture_names[0]; k++) {
        Fixture f;
        fixture_open(&f, fixture_names[k]);
        Model stored, recomputed;
        load_model(&stored, &f, false);
        load_model(&recomputed, &f, false);
        recomputed.recompute = true;
        model_enable_grad(&stored);
        model_enable_grad(&recomputed);
        float *dlogp = xmalloc((long)f.B * f.T * sizeof(float));
        run_gradients(&stored, &f, dlogp);
        run_gradients(&recomputed, &f, dlogp);
        EXPECT(memcmp(stored.grads, recomputed.grads, stored.table.total * sizeof(float)) == 0,
               "%s: gradient checkpointing changed the gradients", fixture_names[k]);
        EXPECT(recomputed.acts.layers != NULL && !recomputed.acts.keep_all_layers, "recompute keeps one layer");
        free(dlogp);
        model_free(&stored), model_free(&recomputed);
        fixture_close(&f);
    }
}

// Rows {0} and {1, 2} as two micro-batches, gradients accumulated, equal one batch.
static void test_gradient_accumulation(void) {
    Fixture f;
    fixture_open(&f, "llama");
    Model model;
    load_model(&model, &f, false);
    model_enable_grad(&model);
    long N = (long)f.B * f.T;
    float *dlogp = xmalloc(N * sizeof(float));
    run_gradients(&model, &f, dlogp);
    float *full = xmalloc(model.table.total * sizeof(float));
    memcpy(full, model.grads, model.table.total * sizeof(float));

    model_zero_grad(&model);
    int splits[2][2] = {{0, 1}, {1, 3}};
    for (int s = 0; s < 2; s++) {
        int first = splits[s][0], rows = splits[s][1] - first;
        ModelBatch part = {.B = rows, .T = f.T, .tokens = f.tokens + (long)first * f.T, .row_len = f.row_len + first};
        model_forward(&model, &part);
        float *logp = xmalloc((long)rows * f.T * sizeof(float));
        model_logprobs(&model, f.targets + (long)first * f.T, logp, NULL, NULL);
        model_backward(&model, dlogp + (long)first * f.T, NULL, NULL); // same per-token weights
        free(logp);
    }
    double worst = test_worst_ratio(model.grads, full, model.table.total, 1e-6, 1e-4);
    EXPECT(worst <= 1.0, "accumulated gradients differ: %.3g x tolerance", worst);
    free(dlogp), free(full);
    model_free(&model);
    fixture_close(&f);
}

// Model.gradient_hook: the points come in the order num_layers, num_layers - 1, ..., 0, -1, and
// at each point the gradients of the entries model_gradient_point assigns to it are final --
// nothing of the backward writes them afterwards (ZeRO-2 sums and frees them there,
// dist/zero.c). A snapshot of each entry taken at its point must equal the gradient after the
// backward, bit for bit; log-prob and value gradients together, every fixture family (learned
// positions, a tied head, Gemma 2's extra norms, Qwen3's q/k norms), and PEFT's DoRA adapters
// (a frozen base: only the tail has gradients).
typedef struct {
    const Model *model;
    float *snapshot; // laid out like the gradients
    int expected_point, calls;
    bool in_order;
} PointRecorder;

static void record_point(Model *model, int point, void *context) {
    PointRecorder *r = context;
    r->in_order &= point == r->expected_point;
    r->expected_point = point - 1;
    r->calls++;
    for (int i = 0; i < model->table.count; i++) {
        const ParamEntry *e = &model->table.entries[i];
        if (e->offset < model->trainable_offset || model_gradient_point(model, e) != point) continue;
        const long at = e->offset - model->trainable_offset;
        memcpy(r->snapshot + at, model->grads + at, (size_t)e->numel * sizeof(float));
    }
}

static void check_gradient_points(Model *model, const Fixture *f, const char *what) {
    model_enable_grad(model);
    const long N = (long)f->B * f->T, total = model_trainable_floats(model);
    float *dlogp = xmalloc(N * sizeof(float)), *values = xmalloc(N * sizeof(float)), *dvalue = xmalloc(N * sizeof(float));
    for (long i = 0; i < N; i++) dvalue[i] = 0.01f * (float)(i % 7) - 0.03f;
    PointRecorder recorder = {.model = model, .snapshot = xcalloc((size_t)total, sizeof(float)),
                              .expected_point = model->config.num_layers, .in_order = true};
    model->gradient_hook.ready = record_point, model->gradient_hook.context = &recorder;
    ModelBatch batch = {.B = f->B, .T = f->T, .tokens = f->tokens, .row_len = f->row_len};
    model_forward(model, &batch);
    causal_lm_loss(model, f, dlogp);
    model_values(model, values);
    model_zero_grad(model);
    model_backward(model, dlogp, NULL, dvalue);
    EXPECT(recorder.in_order && recorder.calls == model->config.num_layers + 2, "%s: %d points, in order: %d", what,
           recorder.calls, recorder.in_order);
    double norm = 0;
    for (long j = 0; j < total; j++) norm += (double)model->grads[j] * model->grads[j];
    EXPECT(norm > 0, "%s: no gradient at all", what);
    for (int i = 0; i < model->table.count; i++) {
        const ParamEntry *e = &model->table.entries[i];
        if (e->offset < model->trainable_offset) continue;
        const long at = e->offset - model->trainable_offset;
        EXPECT(memcmp(recorder.snapshot + at, model->grads + at, (size_t)e->numel * sizeof(float)) == 0,
               "%s: %s changed after its point %d", what, e->name, model_gradient_point(model, e));
    }
    model->gradient_hook.ready = NULL, model->gradient_hook.context = NULL;
    free(dlogp), free(values), free(dvalue), free(recorder.snapshot);
}

static void test_gradient_points(void) {
    for (size_t k = 0; k < sizeof fixture_names / sizeof fixture_names[0]; k++) {
        Fixture f;
        fixture_open(&f, fixture_names[k]);
        Model model;
        load_model(&model, &f, true);
        check_gradient_points(&model, &f, fixture_names[k]);
        model_free(&model);
        fixture_close(&f);
    }
    Fixture f;
    fixture_open(&f, "llama");
    Model model;
    load_model(&model, &f, true);
    CHECK(model_load_lora_adapter(&model, "tests/fixtures/models/llama/dora", false, 11) == 0, "%s", err_msg());
    check_gradient_points(&model, &f, "llama DoRA");
    model_free(&model);
    fixture_close(&f);
}

// model_zero_grad leaves the gradients unwritten (model/gradient_writes.c): the first op to
// produce a tensor writes over it, the later ones add, and settling zero-fills the rest.
// Checked on contents that are neither zero nor NaN, so neither mode of model_zero_grad
// (MARLHF_CHECK_GRADIENT_WRITES or not) can pass for the wrong reason.
static void test_gradient_writes(void) {
    Fixture f;
    fixture_open(&f, "qwen2"); // q/k/v biases: a weight and a bias written by one product
    Model model;
    load_model(&model, &f, true);
    model_enable_grad(&model);
    const long total = model_trainable_floats(&model);
    bool all_zero = true;
    for (long i = 0; i < total; i++) all_zero &= model.grads[i] == 0.0f;
    EXPECT(all_zero, "gradients not zero after model_enable_grad");

    LayerTensors *g = &model.gradients.layers[0];
    const long q_numel = (long)model.config.num_heads * model.config.head_dim * model.config.hidden_size;
    const long q_bias = (long)model.config.num_heads * model.config.head_dim, C = model.config.hidden_size;
    model_zero_grad(&model);
    for (long i = 0; i < total; i++) model.grads[i] = 7.0f; // what an earlier step left
    EXPECT(model_gradient_write_mode(&model, g->q_w, g->q_b) == WRITE_OVERWRITE, "first writer of q not told to overwrite");
    EXPECT(g->q_w[0] == 7.0f && g->q_b[0] == 7.0f, "an overwritten tensor was filled");
    EXPECT(model_gradient_write_mode(&model, g->q_w, g->q_b) == WRITE_ADD, "second writer of q not told to add");
    // A weight unwritten, its bias written: the op adds into both, the weight zero-filled first.
    model_gradient_write_mode(&model, NULL, g->k_b);
    EXPECT(model_gradient_write_mode(&model, g->k_w, g->k_b) == WRITE_ADD, "k with a written bias not told to add");
    bool k_zero = true;
    for (long i = 0; i < C * model.config.num_kv_heads * model.config.head_dim; i++) k_zero &= g->k_w[i] == 0.0f;
    EXPECT(k_zero && g->k_b[0] == 7.0f, "k's unwritten weight gradient not zero-filled, or its written bias changed");
    // An op that can only add: the tensor zero-filled once, then left alone.
    float *norm = model_gradient_to_add(&model, g->attn_norm_w);
    EXPECT(norm == g->attn_norm_w && norm[0] == 0.0f && norm[C - 1] == 0.0f, "attn_norm_w not zero-filled");
    norm[0] = 3.0f;
    model_gradient_to_add(&model, g->attn_norm_w);
    EXPECT(norm[0] == 3.0f, "a written gradient was filled again");
    EXPECT(model_gradient_to_add(&model, NULL) == NULL, "no gradient: nothing");
    // Settling zero-fills exactly the tensors nothing wrote.
    model_settle_gradients(&model);
    EXPECT(g->q_w[q_numel - 1] == 7.0f && g->q_b[q_bias - 1] == 7.0f, "settling filled a written tensor");
    EXPECT(g->v_w[0] == 0.0f && model.gradients.final_norm_w[0] == 0.0f && model.gradients.value_head[C - 1] == 0.0f,
           "settling left an unwritten tensor");
    // After a backward every tensor holds its gradient: the value head, which a backward of
    // log-probs alone does not reach, holds zeros (settled at its point).
    const long N = (long)f.B * f.T;
    float *dlogp = xmalloc(N * sizeof(float));
    ModelBatch batch = {.B = f.B, .T = f.T, .tokens = f.tokens, .row_len = f.row_len};
    model_forward(&model, &batch);
    causal_lm_loss(&model, &f, dlogp);
    model_zero_grad(&model);
    for (long i = 0; i < total; i++) model.grads[i] = 7.0f;
    model_backward(&model, dlogp, NULL, NULL);
    bool head_zero = true, finite = true;
    for (long i = 0; i < C; i++) head_zero &= model.gradients.value_head[i] == 0.0f;
    for (long i = 0; i < total; i++) finite &= isfinite(model.grads[i]);
    EXPECT(head_zero && finite, "after a backward: value head zero %d, every gradient finite %d", head_zero, finite);
    EXPECT(g->q_w[0] != 7.0f && model.gradients.tok_emb[0] != 7.0f, "a gradient the backward produces was left");
    free(dlogp);
    model_free(&model);
    fixture_close(&f);
}

// The LM head on the slots with a target only (prompt and padding skipped) gives the
// log-probs, entropies and gradients of the whole head at those slots, and 0 elsewhere.
static void test_head_on_target_slots_only(void) {
    for (size_t k = 0; k < sizeof fixture_names / sizeof fixture_names[0]; k++) {
        Fixture f;
        fixture_open(&f, fixture_names[k]);
        Model model;
        load_model(&model, &f, false);
        model_enable_grad(&model);
        const long N = (long)f.B * f.T, total = model.table.total;
        // Every third target kept: many short runs, as prompt/response rows give.
        int *targets = xmalloc(N * sizeof(int)), *top1 = xmalloc(N * sizeof(int));
        float *dlogp = xcalloc(N, sizeof(float)), *dentropy = xcalloc(N, sizeof(float));
        for (long i = 0; i < N; i++) {
            targets[i] = i % 3 == 0 ? f.targets[i] : -1;
            if (targets[i] >= 0) dlogp[i] = -0.1f * (float)(1 + i % 5), dentropy[i] = 0.01f;
        }
        float *logp[2], *entropy[2], *grads[2];
        ModelBatch batch = {.B = f.B, .T = f.T, .tokens = f.tokens, .row_len = f.row_len};
        for (int compact = 0; compact < 2; compact++) {
            logp[compact] = xmalloc(N * sizeof(float)), entropy[compact] = xmalloc(N * sizeof(float));
            model_forward(&model, &batch);
            // Asking for top1 runs the head on every slot.
            model_logprobs(&model, targets, logp[compact], compact ? NULL : top1, entropy[compact]);
            EXPECT(model.acts.head_compact == (compact == 1), "%s: head on all slots = %d", fixture_names[k], !compact);
            model_zero_grad(&model);
            model_backward(&model, dlogp, dentropy, NULL);
            grads[compact] = xmalloc(total * sizeof(float));
            memcpy(grads[compact], model.grads, total * sizeof(float));
        }
        for (long i = 0; i < N; i++) {
            if (targets[i] >= 0) {
                EXPECT_CLOSE(logp[1][i], logp[0][i], 1e-6, 1e-6, "log-prob at a target slot");
                EXPECT_CLOSE(entropy[1][i], entropy[0][i], 1e-6, 1e-6, "entropy at a target slot");
            } else {
                EXPECT(logp[1][i] == 0.0f && entropy[1][i] == 0.0f, "%s: slot %ld without a target: %g, %g",
                       fixture_names[k], i, logp[1][i], entropy[1][i]);
            }
        }
        double worst = test_worst_ratio(grads[1], grads[0], total, 1e-6, 1e-4);
        EXPECT(worst <= 1.0, "%s: gradients differ: %.3g x tolerance", fixture_names[k], worst);
        for (int c = 0; c < 2; c++) free(logp[c]), free(entropy[c]), free(grads[c]);
        free(targets), free(top1), free(dlogp), free(dentropy);
        model_free(&model);
        fixture_close(&f);
    }
}

static void test_param_table(void) {
    Fixture f;
    fixture_open(&f, "gpt2");
    Model model;
    load_model(&model, &f, true);
    EXPECT(model_num_params(&model) == config_num_params(&model.config) + model.config.hidden_size,
           "parameter count %ld vs config %lld", model_num_params(&model), config_num_params(&model.config));
    const ParamEntry *wte = param_table_find(&model.table, "model.embed_tokens.weight");
    const ParamEntry *qw = param_table_find(&model.table, "model.layers.0.self_attn.q_proj.weight");
    const ParamEntry *ln = param_table_find(&model.table, "model.layers.1.input_layernorm.bias");
    EXPECT(wte && !wte->decay, "embeddings are not decayed");
    EXPECT(qw && qw->decay, "q_proj is decayed");
    EXPECT(ln && !ln->decay, "norm bias is not decayed");
    model_free(&model);
    fixture_close(&f);
}

// A model written by model_save_hf reloads bit-identically, with and without a value
// head (a reward model is written as *ForSequenceClassification with score.weight).
static void test_save_load_round_trip(void) {
    const char *tmp = getenv("MARLHF_TEST_TMP") ? getenv("MARLHF_TEST_TMP") : "/tmp";
    for (size_t k = 0; k < sizeof fixture_names / sizeof fixture_names[0]; k++) {
        for (int value_head = 0; value_head <= 1; value_head++) {
            Fixture f;
            fixture_open(&f, fixture_names[k]);
            Model model, reloaded;
            ModelLoadOptions options = {.with_lm_head = !value_head, .with_value_head = value_head, .seed = 7};
            CHECK(model_load(&model, f.dir, &ops_cpu, &options) == 0, "%s", err_msg());
            char out[512];
            snprintf(out, sizeof out, "%s/roundtrip-%s-%d", tmp, fixture_names[k], value_head);
            EXPECT(model_save_hf(&model, out, f.dir) == 0, "save: %s", err_msg());
            options.require_value_head = value_head;
            EXPECT(model_load(&reloaded, out, &ops_cpu, &options) == 0, "reload: %s", err_msg());
            EXPECT(reloaded.table.total == model.table.total &&
                       memcmp(reloaded.params, model.params, model.table.total * sizeof(float)) == 0,
                   "%s (value head %d): reloaded weights differ", fixture_names[k], value_head);
            model_free(&model);
            model_free(&reloaded);
            fixture_close(&f);
        }
    }
}

// The tiny Llama converted to GGUF as llama.cpp does (tools/make_gguf_model_fixture.py:
// llama.cpp names, permuted q/k rows, F16 and Q8_0 matrices) loads to the same weights as
// the Hugging Face folder, within the quantization error (Q8_0: half a step of max/127,
// so 0.5% of each tensor's largest magnitude), and gives nearly the same log-probs.
static void test_gguf_model_matches_hf(void) {
    Fixture f;
    fixture_open(&f, "llama");
    Model from_hf, from_gguf;
    load_model(&from_hf, &f, false);
    ModelLoadOptions options = {.with_lm_head = true};
    CHECK(model_load(&from_gguf, "tests/fixtures/gguf/tiny_llama_model.gguf", &ops_cpu, &options) == 0, "%s", err_msg());
    EXPECT(from_gguf.table.total == from_hf.table.total, "same parameter layout");
    for (int i = 0; i < from_hf.table.count; i++) {
        const ParamEntry *e = &from_hf.table.entries[i];
        double scale = 0;
        for (long j = 0; j < e->numel; j++)
            if (fabs(from_hf.params[e->offset + j]) > scale) scale = fabs(from_hf.params[e->offset + j]);
        double d = test_max_abs_diff(from_gguf.params + e->offset, from_hf.params + e->offset, e->numel);
        EXPECT(d <= 0.005 * scale, "%s differs by %.3g (largest magnitude %.3g)", e->name, d, scale);
    }
    ModelBatch batch = {.B = f.B, .T = f.T, .tokens = f.tokens, .row_len = f.row_len};
    long N = (long)f.B * f.T;
    float *a = xmalloc(N * sizeof(float)), *b = xmalloc(N * sizeof(float));
    model_forward(&from_hf, &batch);
    model_logprobs(&from_hf, f.targets, a, NULL, NULL);
    model_forward(&from_gguf, &batch);
    model_logprobs(&from_gguf, f.targets, b, NULL, NULL);
    double d = test_max_abs_diff(a, b, N);
    EXPECT(d <= 0.05, "GGUF and HF log-probs differ by %.3g", d);
    free(a), free(b);
    model_free(&from_hf), model_free(&from_gguf);
    fixture_close(&f);
}

static Model lora_model_scaled(const Fixture *f, int rank, float alpha, bool rslora) {
    Model model;
    load_model(&model, f, false);
    LoraConfig lora = {.rank = rank, .alpha = alpha, .targets = (1u << LORA_TARGETS) - 1, .rslora = rslora};
    CHECK(model_add_lora(&model, &lora, false, 11) == 0, "%s", err_msg());
    return model;
}

static Model lora_model(const Fixture *f, int rank, float alpha) { return lora_model_scaled(f, rank, alpha, false); }

// The PEFT adapter fixture on the tiny Llama (B non-zero, so merging changes weights).
static Model lora_model_for_export(const Fixture *f) {
    Model model = lora_model(f, 4, 8.0f);
    CHECK(lora_read_adapter(&model, "tests/fixtures/models/llama/lora") == 0, "%s", err_msg());
    return model;
}

static void logprobs_of(Model *model, const Fixture *f, float *logp) {
    ModelBatch batch = {.B = f->B, .T = f->T, .tokens = f->tokens, .row_len = f->row_len};
    model_forward(model, &batch);
    model_logprobs(model, f->targets, logp, NULL, NULL);
}

// Runs the fixture's batch through `model` (an adapted model with gradients) and compares
// the logits, the loss and every adapter gradient with PEFT's, in DIR/reference.safetensors.
static void compare_with_peft_reference(Model *model, const Fixture *f, const char *dir, const char *name) {
    char reference[340];
    snprintf(reference, sizeof reference, "%s/reference.safetensors", dir);
    ModelBatch batch = {.B = f->B, .T = f->T, .tokens = f->tokens, .row_len = f->row_len};
    model_forward(model, &batch);

    SafetensorsSet *ref;
    CHECK(safetensors_open(reference, &ref) == 0, "%s", err_msg());
    const SafetensorsTensor *logits = safetensors_find(ref, "logits");
    float *want_logits = xmalloc((size_t)logits->count * sizeof(float));
    CHECK(safetensors_read_f32(logits, want_logits, logits->count) == 0, "%s", err_msg());
    double worst = worst_logits_ratio(model, f, want_logits);
    EXPECT(worst <= 1.0, "%s LoRA logits: worst error %.3g x tolerance", name, worst);

    long N = (long)f->B * f->T;
    float *dlogp = xmalloc(N * sizeof(float)), want_loss;
    double loss = causal_lm_loss(model, f, dlogp);
    CHECK(safetensors_read_f32(safetensors_find(ref, "loss"), &want_loss, 1) == 0, "%s", err_msg());
    EXPECT_CLOSE(loss, want_loss, 0, 1e-5, name);

    model_zero_grad(model);
    model_backward(model, dlogp, NULL, NULL);
    int adapters = 0;
    for (int i = 0; i < model->table.count; i++) {
        const ParamEntry *e = &model->table.entries[i];
        if (e->offset < model->trainable_offset) continue;
        char tensor[160];
        snprintf(tensor, sizeof tensor, "grad.base_model.model.%s", e->name);
        const SafetensorsTensor *t = safetensors_find(ref, tensor);
        EXPECT(t && t->count == e->numel, "%s: reference has no %s", name, tensor);
        if (!t || t->count != e->numel) continue;
        float *want = xmalloc((size_t)e->numel * sizeof(float));
        CHECK(safetensors_read_f32(t, want, e->numel) == 0, "%s", err_msg());
        double scale = 0;
        for (long j = 0; j < e->numel; j++) scale = fmax(scale, fabs(want[j]));
        double r = test_worst_ratio(model->grads + (e->offset - model->trainable_offset), want, e->numel,
                                    1e-5 * scale, 1e-3);
        EXPECT(r <= 1.0, "%s %s: worst error %.3g x tolerance", name, e->name, r);
        free(want);
        adapters++;
    }
    // Every adapter gradient PEFT has, and no other: the same modules adapted.
    int reference_grads = 0;
    for (int i = 0; i < safetensors_tensor_count(ref); i++)
        reference_grads += !strncmp(safetensors_tensor_at(ref, i)->name, "grad.", 5);
    EXPECT(adapters == reference_grads, "%s: %d adapter tensors, PEFT's reference has %d", name, adapters,
           reference_grads);
    free(want_logits), free(dlogp);
    safetensors_close(ref);
}

// PEFT's adapters on the tiny models: logits, loss and every adapter gradient; and on the
// tiny Llama with rsLoRA (scale alpha / sqrt(rank) = 4), which a model with plain LoRA's
// scale refuses to read.
static void test_lora_against_peft(void) {
    const struct {
        const char *model, *adapter;
        bool rslora;
    } cases[] = {{"llama", "lora", false}, {"qwen2", "lora", false}, {"gemma", "lora", false},
                 {"gemma2", "lora", false}, {"llama", "lora_rslora", true}};
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        Fixture f;
        fixture_open(&f, cases[k].model);
        const char *name = cases[k].rslora ? "llama rsLoRA" : cases[k].model;
        char dir[300];
        snprintf(dir, sizeof dir, "%s/%s", f.dir, cases[k].adapter);
        Model model = lora_model_scaled(&f, 4, 8.0f, cases[k].rslora);
        EXPECT(lora_read_adapter(&model, dir) == 0, "%s: %s", name, err_msg());
        if (cases[k].rslora) {
            Model plain = lora_model(&f, 4, 8.0f);
            EXPECT(lora_read_adapter(&plain, dir) != 0 && strstr(err_msg(), "rsLoRA"), "plain LoRA read an rsLoRA "
                   "adapter: '%s'", err_msg());
            model_free(&plain);
        }
        model_enable_grad(&model);
        compare_with_peft_reference(&model, &f, dir, name);
        model_free(&model);
        fixture_close(&f);
    }
}

// PEFT's per-module ranks and alphas (rank_pattern, alpha_pattern; tools/make_lora_fixtures.py
// RANK_PATTERN, ALPHA_PATTERN), plain and with rsLoRA, read from PEFT's folders as
// --lora-adapter reads them: each module's A and B have the rank the patterns give it, and the
// logits, loss and every adapter gradient are PEFT's. A model built without the patterns
// refuses the folder.
static void test_lora_patterns_against_peft(void) {
    const char *adapters[2] = {"lora_pattern", "lora_pattern_rslora"};
    for (int k = 0; k < 2; k++) {
        Fixture f;
        fixture_open(&f, "llama");
        char dir[300];
        snprintf(dir, sizeof dir, "%s/%s", f.dir, adapters[k]);
        Model model;
        load_model(&model, &f, false);
        EXPECT(model_load_lora_adapter(&model, dir, false, 11) == 0, "%s: %s", adapters[k], err_msg());
        EXPECT(model.lora.rank_patterns == 4 && model.lora.alpha_patterns == 3 && model.lora.rslora == (k == 1),
               "%s: %d rank and %d alpha patterns read", adapters[k], model.lora.rank_patterns,
               model.lora.alpha_patterns);
        // layer 0's q_proj: rank 5 (its full name, before "q_proj"); layer 1's q_proj: 2;
        // layer 1's up_proj and down_proj: 6; the rest: r = 4 ("proj" matches no module).
        const struct {
            const char *name;
            int rank;
        } want[] = {{"model.layers.0.self_attn.q_proj.lora_A.weight", 5}, {"model.layers.1.self_attn.q_proj.lora_A.weight", 2},
                    {"model.layers.1.mlp.up_proj.lora_A.weight", 6},       {"model.layers.1.mlp.down_proj.lora_B.weight", 6},
                    {"model.layers.0.mlp.up_proj.lora_A.weight", 4},       {"model.layers.0.self_attn.o_proj.lora_B.weight", 4}};
        for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
            const ParamEntry *e = param_table_find(&model.table, want[i].name);
            const int rank = e ? (strstr(want[i].name, "lora_A") ? (int)e->shape[0] : (int)e->shape[1]) : -1;
            EXPECT(rank == want[i].rank, "%s: %s has rank %d, want %d", adapters[k], want[i].name, rank, want[i].rank);
        }
        Model plain = lora_model_scaled(&f, 4, 8.0f, k == 1);
        EXPECT(lora_read_adapter(&plain, dir) != 0 && strstr(err_msg(), "per-module"),
               "a model without the patterns read %s: '%s'", adapters[k], err_msg());
        model_free(&plain);
        model_enable_grad(&model);
        compare_with_peft_reference(&model, &f, dir, adapters[k]);
        model_free(&model);
        fixture_close(&f);
    }
}

// PEFT's narrower module choices (tools/make_lora_fixtures.py TARGET_REGEX, LAYERS_TO_TRANSFORM),
// read from PEFT's folders as --lora-adapter reads them: target_modules as a regex (q_proj and
// v_proj of layer 0, every layer's down_proj) and layers_to_transform [1] (all seven modules of
// layer 1 only). Exactly those modules have adapters, the logits, loss and every adapter
// gradient are PEFT's, and a model adapted everywhere refuses the folders.
static void test_lora_selection_against_peft(void) {
    const struct {
        const char *adapter;
        int modules;
        const char *adapted, *not_adapted;
    } cases[] = {{"lora_regex", 4, "model.layers.1.mlp.down_proj.lora_A.weight", "model.layers.1.self_attn.q_proj.lora_A.weight"},
                 {"lora_layers", 7, "model.layers.1.self_attn.k_proj.lora_B.weight", "model.layers.0.mlp.up_proj.lora_A.weight"}};
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        Fixture f;
        fixture_open(&f, "llama");
        char dir[300];
        snprintf(dir, sizeof dir, "%s/%s", f.dir, cases[k].adapter);
        Model model;
        load_model(&model, &f, false);
        EXPECT(model_load_lora_adapter(&model, dir, false, 11) == 0, "%s: %s", cases[k].adapter, err_msg());
        int modules = 0;
        for (int i = model.lora_first_entry; i < model.table.count; i++) modules += !!strstr(model.table.entries[i].name, ".lora_A.");
        EXPECT(modules == cases[k].modules, "%s: %d adapted modules, want %d", cases[k].adapter, modules, cases[k].modules);
        EXPECT(param_table_find(&model.table, cases[k].adapted) && !param_table_find(&model.table, cases[k].not_adapted),
               "%s: %s should have an adapter and %s none", cases[k].adapter, cases[k].adapted, cases[k].not_adapted);
        Model everywhere = lora_model(&f, 4, 8.0f);
        EXPECT(lora_read_adapter(&everywhere, dir) != 0 && strstr(err_msg(), "modules"),
               "a model adapted everywhere read %s: '%s'", cases[k].adapter, err_msg());
        model_free(&everywhere);
        model_enable_grad(&model);
        compare_with_peft_reference(&model, &f, dir, cases[k].adapter);
        model_free(&model);
        fixture_close(&f);
    }
}

// LoRA dropout against PEFT in training mode with marlhf's masks (tools/make_lora_fixtures.py
// make_dropout: seed 1234, epoch 2, micro-batch 5, the first pass). The adapter is PEFT's
// folder with lora_dropout 0.25, read as --lora-adapter reads it. Then: the same masks
// under gradient checkpointing (bit-identical gradients); a second pass of the micro-batch
// draws other masks; after model_training_pass_end the model is the no-dropout model bit for bit.
static void test_lora_dropout_against_peft(void) {
    Fixture f;
    fixture_open(&f, "llama");
    const char *dir = "tests/fixtures/models/llama/lora_dropout";
    Model model, recomputed, plain;
    load_model(&model, &f, false), load_model(&recomputed, &f, false), load_model(&plain, &f, false);
    EXPECT(model_load_lora_adapter(&model, dir, false, 11) == 0, "%s", err_msg());
    EXPECT(model.lora.dropout == 0.25, "lora_dropout read as %g", model.lora.dropout);
    CHECK(model_load_lora_adapter(&recomputed, dir, false, 11) == 0, "%s", err_msg());
    CHECK(model_load_lora_adapter(&plain, dir, false, 11) == 0, "%s", err_msg());
    recomputed.recompute = true;
    model_enable_grad(&model), model_enable_grad(&recomputed), model_enable_grad(&plain);

    model_training_pass_begin(&model, 1234, 2, 5);
    compare_with_peft_reference(&model, &f, dir, "llama lora_dropout 0.25");
    model_training_pass_end(&model);

    const long N = (long)f.B * f.T;
    float *dlogp = xmalloc(N * sizeof(float));
    model_training_pass_begin(&recomputed, 1234, 2, 5);
    run_gradients(&recomputed, &f, dlogp);
    EXPECT(memcmp(model.grads, recomputed.grads, (size_t)model_trainable_floats(&model) * sizeof(float)) == 0,
           "gradient checkpointing changed the adapter gradients under dropout");
    float *first = xmalloc(N * sizeof(float)), *second = xmalloc(N * sizeof(float));
    logprobs_of(&recomputed, &f, second); // the micro-batch's second pass
    model_training_pass_end(&recomputed);
    model_training_pass_begin(&model, 1234, 2, 5);
    logprobs_of(&model, &f, first);
    model_training_pass_end(&model);
    EXPECT(test_max_abs_diff(first, second, N) > 1e-4, "a second pass drew the first pass's masks");

    float *without = xmalloc(N * sizeof(float)), *never = xmalloc(N * sizeof(float));
    logprobs_of(&model, &f, without);
    plain.lora.dropout = 0;
    logprobs_of(&plain, &f, never);
    EXPECT(!memcmp(without, never, (size_t)N * sizeof(float)), "a pass after model_training_pass_end still dropped inputs");
    free(dlogp), free(first), free(second), free(without), free(never);
    model_free(&model), model_free(&recomputed), model_free(&plain);
    fixture_close(&f);
}

// NEFTune (model.h neftune_noise_alpha): in a training pass the embedding output -- the
// residual stream's first slice -- is the noiseless one plus uniform_noise_add's noise of
// magnitude alpha / sqrt(T * hidden), keyed by the pass (seed, the micro-batch's place, the
// pass's first forward); outside a pass, and on a model without gradients, there is none;
// under gradient checkpointing the gradients are the stored activations' bit for bit (the
// noise is drawn once a forward, never again in the backward). GPT-2 (learned positions
// added after the noise) and Gemma (its embeddings scaled before it).
static void test_neftune_noise(void) {
    const char *names[] = {"gpt2", "gemma"};
    for (int k = 0; k < 2; k++) {
        Fixture f;
        fixture_open(&f, names[k]);
        Model model, recomputed, inference;
        load_model(&model, &f, false), load_model(&recomputed, &f, false), load_model(&inference, &f, false);
        model_enable_grad(&model), model_enable_grad(&recomputed);
        recomputed.recompute = true;
        model.neftune_noise_alpha = recomputed.neftune_noise_alpha = inference.neftune_noise_alpha = 5;
        const long N = (long)f.B * f.T, C = model.config.hidden_size;
        float *logp_clean = xmalloc(N * sizeof(float)), *logp_noisy = xmalloc(N * sizeof(float));
        float *clean = xmalloc(N * C * sizeof(float)), *noisy = xmalloc(N * C * sizeof(float));
        logprobs_of(&model, &f, logp_clean);
        memcpy(clean, model.acts.residual, (size_t)(N * C) * sizeof(float));
        model_training_pass_begin(&model, 1234, 3, 7);
        logprobs_of(&model, &f, logp_noisy);
        memcpy(noisy, model.acts.residual, (size_t)(N * C) * sizeof(float));
        model_training_pass_end(&model);
        const uint64_t stream = rng_stream("neftune", rng_stream("lora_dropout_micro_batch", 3, 7), 1);
        ops_cpu.uniform_noise_add(clean, N * C, (float)(5 / sqrt((double)f.T * (double)C)), 1234, stream);
        EXPECT(!memcmp(noisy, clean, (size_t)(N * C) * sizeof(float)),
               "%s: the embeddings are not the noiseless ones plus the pass's noise", names[k]);
        EXPECT(test_max_abs_diff(logp_clean, logp_noisy, N) > 1e-6, "%s: the noise changed no log-prob", names[k]);
        float *after = xmalloc(N * sizeof(float));
        logprobs_of(&model, &f, after);
        EXPECT(!memcmp(after, logp_clean, (size_t)N * sizeof(float)), "%s: noise outside a training pass", names[k]);

        float *dlogp = xmalloc(N * sizeof(float));
        model_training_pass_begin(&model, 1234, 3, 7);
        run_gradients(&model, &f, dlogp);
        model_training_pass_end(&model);
        model_training_pass_begin(&recomputed, 1234, 3, 7);
        run_gradients(&recomputed, &f, dlogp);
        model_training_pass_end(&recomputed);
        EXPECT(!memcmp(model.grads, recomputed.grads, (size_t)model_trainable_floats(&model) * sizeof(float)),
               "%s: gradient checkpointing changed the gradients under NEFTune", names[k]);

        logprobs_of(&inference, &f, logp_clean);
        model_training_pass_begin(&inference, 1234, 3, 7);
        logprobs_of(&inference, &f, logp_noisy);
        model_training_pass_end(&inference);
        EXPECT(!memcmp(logp_clean, logp_noisy, (size_t)N * sizeof(float)), "%s: noise on a model without gradients",
               names[k]);
        free(logp_clean), free(logp_noisy), free(clean), free(noisy), free(after), free(dlogp);
        model_free(&model), model_free(&recomputed), model_free(&inference);
        fixture_close(&f);
    }
}

// DoRA against PEFT (tools/make_lora_fixtures.py make_dora: random A, B and magnitudes on
// the tiny Llama, PEFT's own folders read as --lora-adapter reads them): logits, loss and
// the gradients of A, B and m, without and with lora_dropout 0.25 (marlhf's masks, PEFT's
// base term on the dropped input). Then: a plain-LoRA model refuses the DoRA adapter; a
// fresh DoRA adapter (B = 0, m = ||W||) leaves the log-probs bit for bit; gradient
// checkpointing gives bit-identical gradients; the saved model, the adapter merged
// (m / ||W + s B A|| (W + s B A) row by row), computes what the adapted model does.
static void test_dora_against_peft(void) {
    const char *tmp = getenv("MARLHF_TEST_TMP") ? getenv("MARLHF_TEST_TMP") : "/tmp";
    Fixture f;
    fixture_open(&f, "llama");
    const long N = (long)f.B * f.T;
    Model model, recomputed, dropped;
    load_model(&model, &f, false), load_model(&recomputed, &f, false), load_model(&dropped, &f, false);
    EXPECT(model_load_lora_adapter(&model, "tests/fixtures/models/llama/dora", false, 11) == 0, "%s", err_msg());
    EXPECT(model.lora.dora && model.lora.rank == 4 && model.lora.alpha == 8.0f, "DoRA adapter read as rank %d, "
           "alpha %g, dora %d", model.lora.rank, model.lora.alpha, (int)model.lora.dora);
    CHECK(model_load_lora_adapter(&recomputed, "tests/fixtures/models/llama/dora", false, 11) == 0, "%s", err_msg());
    model_enable_grad(&model);
    compare_with_peft_reference(&model, &f, "tests/fixtures/models/llama/dora", "llama DoRA");

    recomputed.recompute = true;
    model_enable_grad(&recomputed);
    float *dlogp = xmalloc(N * sizeof(float));
    run_gradients(&recomputed, &f, dlogp);
    EXPECT(memcmp(model.grads, recomputed.grads, (size_t)model_trainable_floats(&model) * sizeof(float)) == 0,
           "gradient checkpointing changed the DoRA gradients");

    CHECK(model_load_lora_adapter(&dropped, "tests/fixtures/models/llama/dora_dropout", false, 11) == 0, "%s",
          err_msg());
    EXPECT(dropped.lora.dora && dropped.lora.dropout == 0.25, "DoRA dropout adapter read as dora %d, dropout %g",
           (int)dropped.lora.dora, dropped.lora.dropout);
    model_enable_grad(&dropped);
    model_training_pass_begin(&dropped, 1234, 2, 5);
    compare_with_peft_reference(&dropped, &f, "tests/fixtures/models/llama/dora_dropout", "llama DoRA lora_dropout 0.25");
    model_training_pass_end(&dropped);

    Model plain = lora_model(&f, 4, 8.0f);
    EXPECT(lora_read_adapter(&plain, "tests/fixtures/models/llama/dora") != 0 && strstr(err_msg(), "DoRA"),
           "plain LoRA read a DoRA adapter: '%s'", err_msg());
    model_free(&plain);

    Model base, fresh;
    load_model(&base, &f, false), load_model(&fresh, &f, false);
    LoraConfig lora = {.rank = 3, .alpha = 6.0f, .targets = (1u << LORA_TARGETS) - 1, .dora = true};
    CHECK(model_add_lora(&fresh, &lora, false, 11) == 0, "%s", err_msg());
    float *want = xmalloc(N * sizeof(float)), *got = xmalloc(N * sizeof(float));
    logprobs_of(&base, &f, want);
    logprobs_of(&fresh, &f, got);
    EXPECT(memcmp(want, got, N * sizeof(float)) == 0, "a fresh DoRA adapter changed the log-probs");

    char out[512];
    snprintf(out, sizeof out, "%s/dora-merged", tmp);
    EXPECT(model_save_hf(&model, out, f.dir) == 0, "save: %s", err_msg());
    Model merged;
    ModelLoadOptions options = {.with_lm_head = true};
    CHECK(model_load(&merged, out, &ops_cpu, &options) == 0, "%s", err_msg());
    EXPECT(merged.table.total == base.table.total, "the merged DoRA model has the base's tensors only");
    logprobs_of(&model, &f, want);
    logprobs_of(&merged, &f, got);
    double d = test_max_abs_diff(want, got, N);
    EXPECT(d <= 1e-5, "merged DoRA model's log-probs differ by %.3g", d);
    Model reread;
    load_model(&reread, &f, false);
    EXPECT(model_load_lora_adapter(&reread, out, false, 11) == 0, "%s", err_msg());
    EXPECT(reread.table.total == model.table.total &&
               memcmp(reread.params, model.params, (size_t)model.table.total * sizeof(float)) == 0,
           "the DoRA adapter file did not read back bit-identically");

    free(dlogp), free(want), free(got);
    model_free(&model), model_free(&recomputed), model_free(&dropped), model_free(&base), model_free(&fresh);
    model_free(&merged), model_free(&reread);
    fixture_close(&f);
}

// A fresh adapter (B = 0) and a disabled one leave the base model's log-probs bit for bit;
// the gradients cover the adapters only; a few AdamW steps move the adapters and nothing
// else; the model saved with the adapters merged computes what the adapted one does, and
// its adapter file reads back bit-identically.
static void test_lora_frozen_base_and_merge(void) {
    const char *tmp = getenv("MARLHF_TEST_TMP") ? getenv("MARLHF_TEST_TMP") : "/tmp";
    for (size_t k = 0; k < sizeof fixture_names / sizeof fixture_names[0]; k++) {
        Fixture f;
        fixture_open(&f, fixture_names[k]);
        const long N = (long)f.B * f.T;
        Model base, model = lora_model(&f, 3, 6.0f);
        load_model(&base, &f, false);
        float *want = xmalloc(N * sizeof(float)), *got = xmalloc(N * sizeof(float));
        logprobs_of(&base, &f, want);
        logprobs_of(&model, &f, got);
        EXPECT(memcmp(want, got, N * sizeof(float)) == 0, "%s: a fresh adapter changed the log-probs", fixture_names[k]);

        model_enable_grad(&model);
        const long base_floats = base.table.total;
        EXPECT(model.trainable_offset >= base_floats && model_trainable_floats(&model) < base_floats / 2,
               "%s: %ld trainable floats of %ld", fixture_names[k], model_trainable_floats(&model), model.table.total);
        float *before = xmalloc((size_t)model.table.total * sizeof(float));
        memcpy(before, model.params, (size_t)model.table.total * sizeof(float));
        AdamW opt;
        adamw_init(&opt, &model, (AdamWConfig){.beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f});
        EXPECT(opt.total == model_trainable_floats(&model), "optimizer moments for the adapters only");
        float *dlogp = xmalloc(N * sizeof(float));
        double first_loss = 0, loss = 0;
        ModelBatch batch = {.B = f.B, .T = f.T, .tokens = f.tokens, .row_len = f.row_len};
        for (int step = 0; step < 5; step++) {
            model_forward(&model, &batch);
            loss = causal_lm_loss(&model, &f, dlogp);
            model_zero_grad(&model);
            model_backward(&model, dlogp, NULL, NULL);
            if (step == 0) first_loss = loss;
            adamw_step(&opt, &model, 1e-2f, grad_clip_coefficient(grad_global_norm(&model), 1.0f));
        }
        EXPECT(loss < first_loss, "%s: LoRA training did not lower the loss (%g -> %g)", fixture_names[k], first_loss, loss);
        EXPECT(memcmp(before, model.params, (size_t)model.trainable_offset * sizeof(float)) == 0,
               "%s: a frozen base weight moved", fixture_names[k]);
        EXPECT(memcmp(before + model.trainable_offset, model_trainable_params(&model),
                      (size_t)model_trainable_floats(&model) * sizeof(float)) != 0,
               "%s: the adapters did not move", fixture_names[k]);

        model.lora_enabled = false;
        logprobs_of(&model, &f, got);
        EXPECT(memcmp(want, got, N * sizeof(float)) == 0, "%s: a disabled adapter changed the log-probs", fixture_names[k]);
        model.lora_enabled = true;
        logprobs_of(&model, &f, want);

        char out[512];
        snprintf(out, sizeof out, "%s/lora-merged-%s", tmp, fixture_names[k]);
        EXPECT(model_save_hf(&model, out, f.dir) == 0, "save: %s", err_msg());
        Model merged;
        ModelLoadOptions options = {.with_lm_head = true};
        CHECK(model_load(&merged, out, &ops_cpu, &options) == 0, "%s", err_msg());
        EXPECT(merged.table.total == base.table.total, "%s: the merged model has the base's tensors only", fixture_names[k]);
        logprobs_of(&merged, &f, got);
        double d = test_max_abs_diff(want, got, N);
        EXPECT(d <= 1e-5, "%s: merged model's log-probs differ by %.3g", fixture_names[k], d);

        Model reread = lora_model(&f, 3, 6.0f);
        EXPECT(lora_read_adapter(&reread, out) == 0, "%s: %s", fixture_names[k], err_msg());
        EXPECT(memcmp(reread.params, model.params, (size_t)model.table.total * sizeof(float)) == 0,
               "%s: the adapter file did not read back bit-identically", fixture_names[k]);
        // Another rank, or other base weights, are refused with the file named.
        Model other = lora_model(&f, 2, 6.0f);
        EXPECT(lora_read_adapter(&other, out) != 0 && strstr(err_msg(), "adapter_config.json"),
               "%s: adapter of another rank accepted (%s)", fixture_names[k], err_msg());
        model_free(&other);
        Model moved;
        load_model(&moved, &f, false);
        moved.params[moved.table.total / 2] += 1e-3f; // one base weight moved
        LoraConfig lora = {.rank = 3, .alpha = 6.0f, .targets = (1u << LORA_TARGETS) - 1};
        CHECK(model_add_lora(&moved, &lora, false, 11) == 0, "%s", err_msg());
        EXPECT(lora_read_adapter(&moved, out) != 0 && strstr(err_msg(), "other base weights"),
               "%s: adapter accepted on other base weights (%s)", fixture_names[k], err_msg());
        model_free(&moved);

        free(want), free(got), free(before), free(dlogp);
        adamw_free(&opt);
        model_free(&model), model_free(&base), model_free(&merged), model_free(&reread);
        fixture_close(&f);
    }
}

// Gradient checkpointing with adapters gives bit-identical adapter gradients.
static void test_lora_recompute_is_exact(void) {
    Fixture f;
    fixture_open(&f, "llama");
    Model stored = lora_model(&f, 4, 8.0f), recomputed = lora_model(&f, 4, 8.0f);
    CHECK(lora_read_adapter(&stored, "tests/fixtures/models/llama/lora") == 0, "%s", err_msg());
    CHECK(lora_read_adapter(&recomputed, "tests/fixtures/models/llama/lora") == 0, "%s", err_msg());
    recomputed.recompute = true;
    model_enable_grad(&stored), model_enable_grad(&recomputed);
    float *dlogp = xmalloc((long)f.B * f.T * sizeof(float));
    run_gradients(&stored, &f, dlogp);
    run_gradients(&recomputed, &f, dlogp);
    EXPECT(memcmp(stored.grads, recomputed.grads, (size_t)model_trainable_floats(&stored) * sizeof(float)) == 0,
           "gradient checkpointing changed the adapter gradients");
    free(dlogp);
    model_free(&stored), model_free(&recomputed);
    fixture_close(&f);
}

static void test_lora_options(void) {
    unsigned targets;
    EXPECT(lora_parse_targets("q_proj,v_proj", &targets) == 0 && targets == ((1u << LORA_Q) | (1u << LORA_V)),
           "q_proj,v_proj -> %#x", targets);
    EXPECT(lora_parse_targets("all-linear", &targets) == 0 && targets == 127u, "all-linear -> %#x", targets);
    EXPECT(lora_parse_targets("q_proj,c_attn", &targets) != 0 && strstr(err_msg(), "'c_attn'"), "unknown module: %s",
           err_msg());
    Fixture f;
    fixture_open(&f, "gpt2");
    Model model;
    load_model(&model, &f, false);
    LoraConfig gate_only = {.rank = 2, .alpha = 2, .targets = 1u << LORA_GATE};
    EXPECT(model_add_lora(&model, &gate_only, false, 1) != 0 && strstr(err_msg(), "gate_proj"),
           "gate_proj on GPT-2: %s", err_msg());
    LoraConfig zero_rank = {.rank = 0, .alpha = 2, .targets = 1};
    EXPECT(model_add_lora(&model, &zero_rank, false, 1) != 0 && strstr(err_msg(), "--lora-rank"), "rank 0: %s", err_msg());
    LoraConfig all = {.rank = 2, .alpha = 2, .targets = 127u};
    EXPECT(model_add_lora(&model, &all, false, 1) == 0 && !(model.lora.targets & (1u << LORA_GATE)),
           "all-linear on GPT-2 takes the layers it has: %s", err_msg());
    model_free(&model);
    fixture_close(&f);
}

// model_write_gguf then model_load: F32 gives the same weights bit for bit (Gemma's norms
// within an ulp of 1) and F16 / Q8_0 / Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q4_K_M / Q5_K_M within their
// rounding, for every family (GPT-2's fused qkv, Llama's permuted q/k rows,
// Gemma's 1 + w norms); a LoRA model is written merged. The fixtures' rows (64, 128 values)
// are not whole K-quant super-blocks, so Q4_K_M and Q5_K_M take llama.cpp's fallbacks (Q5_0,
// Q5_1, Q8_0);
// tests/test_gguf.c checks the K-quants themselves.
static void test_gguf_export_round_trip(void) {
    const char *tmp = getenv("MARLHF_TEST_TMP") ? getenv("MARLHF_TEST_TMP") : "/tmp";
    const GgufOutType types[] = {GGUF_OUT_F32,  GGUF_OUT_F16,  GGUF_OUT_Q8_0,   GGUF_OUT_Q4_0,  GGUF_OUT_Q4_1,
                                 GGUF_OUT_Q5_0, GGUF_OUT_Q5_1, GGUF_OUT_Q4_K_M, GGUF_OUT_Q5_K_M};
    // As a fraction of the tensor's largest value: F16's rounding, half a Q8_0 step, and
    // for the 4-bit types a whole 4-bit step (Q4_0's levels run from -8 to 7 steps, so the
    // side opposite a block's extreme can lose one; Q4_K's 6-bit sub-block scales add their
    // own rounding; Q5_K_M likewise a whole 5-bit step, 2 / 31: its fit is least squares and
    // the 6-bit scales and minimums round too, its fallback Q5_1 stays within half of that),
    // plus the f16 scales' rounding. Q4_1 and Q5_1 (a minimum and range / 15 or / 31 per block)
    // within half a step, at most a whole step of the tensor's largest value over 15 or 31;
    // Q5_0 as Q4_0 with twice the levels. tests/test_gguf.c bounds the RMS errors.
    const double step_fraction[] = {0, 1.0 / 2048, 0.005, 1.0 / 8 + 0.001, 1.0 / 15 + 0.001, 1.0 / 16 + 0.001,
                                    1.0 / 31 + 0.001, 1.0 / 8 + 0.001, 2.0 / 31 + 0.001};
    const int type_count = (int)(sizeof types / sizeof types[0]);
    for (size_t k = 0; k < sizeof fixture_names / sizeof fixture_names[0]; k++) {
        Fixture f;
        fixture_open(&f, fixture_names[k]);
        Model model;
        load_model(&model, &f, false);
        if (model.config.family == FAMILY_GEMMA3) {
            // llama.cpp fixes the layer pattern (6) and infers the query scalar: the fixture's
            // pattern of 2 is refused, nothing written; with llama.cpp's pattern and head_dim
            // as the scalar the file is written (the weights are the same either way).
            char path[512];
            snprintf(path, sizeof path, "%s/export-gemma3-refused.gguf", tmp);
            EXPECT(model_write_gguf(&model, NULL, path, GGUF_OUT_F32) != 0 && strstr(err_msg(), "layer pattern (2)") &&
                       !fs_exists(path),
                   "gemma3 with another layer pattern: %s", err_msg());
            model.config.sliding_window_pattern = 6;
            model.config.query_pre_attn_scalar = (float)model.config.head_dim;
        }
        if (model.config.family == FAMILY_GEMMA2) {
            // A GGUF file has no query_pre_attn_scalar: one llama.cpp would not infer (the
            // fixture's 24, against head_dim 16) is refused, nothing written; with head_dim
            // (what llama.cpp infers for every shape but the 27B's) the file is written.
            char path[512];
            snprintf(path, sizeof path, "%s/export-gemma2-refused.gguf", tmp);
            EXPECT(model_write_gguf(&model, NULL, path, GGUF_OUT_F32) != 0 && strstr(err_msg(), "query_pre_attn_scalar") &&
                       !fs_exists(path),
                   "gemma2 with an uninferable query_pre_attn_scalar: %s", err_msg());
            model.config.query_pre_attn_scalar = (float)model.config.head_dim;
        }
        if (model.config.family == FAMILY_QWEN2 && model.config.sliding_window > 0) {
            // llama.cpp's qwen2 has no sliding window: refused, nothing written.
            char path[512];
            snprintf(path, sizeof path, "%s/export-qwen2-window-refused.gguf", tmp);
            EXPECT(model_write_gguf(&model, NULL, path, GGUF_OUT_F32) != 0 && strstr(err_msg(), "sliding window") &&
                       !fs_exists(path),
                   "qwen2 with a sliding window: %s", err_msg());
            model_free(&model);
            fixture_close(&f);
            continue;
        }
        for (int t = 0; t < type_count; t++) {
            char path[512];
            snprintf(path, sizeof path, "%s/export-%s-%d.gguf", tmp, fixture_names[k], t);
            EXPECT(model_write_gguf(&model, NULL, path, types[t]) == 0, "%s: %s", fixture_names[k], err_msg());
            Model back;
            ModelLoadOptions options = {.with_lm_head = true};
            CHECK(model_load(&back, path, &ops_cpu, &options) == 0, "%s", err_msg());
            EXPECT(back.table.total == model.table.total, "%s: layout", fixture_names[k]);
            EXPECT(back.config.attn_logit_softcap == model.config.attn_logit_softcap &&
                       back.config.final_logit_softcap == model.config.final_logit_softcap &&
                       back.config.sandwich_norms == model.config.sandwich_norms &&
                       back.config.query_pre_attn_scalar == model.config.query_pre_attn_scalar &&
                       back.config.rope_local_theta == model.config.rope_local_theta &&
                       back.config.sliding_window_pattern == model.config.sliding_window_pattern &&
                       back.config.rope_scaling == model.config.rope_scaling &&
                       back.config.rope_factor == model.config.rope_factor &&
                       back.config.max_position_embeddings == model.config.max_position_embeddings &&
                       back.config.sliding_window == model.config.sliding_window,
                   "%s: soft caps %g/%g, query scalar %g, context %d, window %d read back", fixture_names[k],
                   (double)back.config.attn_logit_softcap, (double)back.config.final_logit_softcap,
                   (double)back.config.query_pre_attn_scalar, back.config.max_position_embeddings,
                   back.config.sliding_window);
            for (int i = 0; i < model.table.count && back.table.total == model.table.total; i++) {
                const ParamEntry *e = &model.table.entries[i];
                double scale = 0;
                for (long j = 0; j < e->numel; j++) scale = fmax(scale, fabs(model.params[e->offset + j]));
                double tolerance = step_fraction[t] * scale;
                // Vectors stay F32; Gemma's norms go through 1 + w and back (an ulp of 1).
                const bool plus_one = model.config.norm_weight_plus_one;
                if (e->ndim == 1) tolerance = strstr(e->name, "norm") && plus_one ? 1.2e-7 : 0;
                double d = test_max_abs_diff(back.params + e->offset, model.params + e->offset, e->numel);
                EXPECT(d <= tolerance, "%s type %d: %s differs by %.3g (tolerance %.3g)", fixture_names[k], t, e->name, d,
                       tolerance);
            }
            model_free(&back);
            remove(path);
        }
        model_free(&model);
        fixture_close(&f);
    }
    // LoRA: the merged weights, as model_save_hf writes them.
    Fixture f;
    fixture_open(&f, "llama");
    Model model = lora_model_for_export(&f);
    char gguf[512], hf[512];
    snprintf(gguf, sizeof gguf, "%s/export-lora.gguf", tmp);
    snprintf(hf, sizeof hf, "%s/export-lora-hf", tmp);
    EXPECT(model_write_gguf(&model, NULL, gguf, GGUF_OUT_F32) == 0 && model_save_hf(&model, hf, NULL) == 0, "%s",
           err_msg());
    Model from_gguf, from_hf;
    ModelLoadOptions options = {.with_lm_head = true};
    CHECK(model_load(&from_gguf, gguf, &ops_cpu, &options) == 0 && model_load(&from_hf, hf, &ops_cpu, &options) == 0,
          "%s", err_msg());
    EXPECT(from_gguf.table.total == from_hf.table.total &&
               !memcmp(from_gguf.params, from_hf.params, (size_t)from_hf.table.total * sizeof(float)),
           "a LoRA model's GGUF holds the merged weights");
    model_free(&model), model_free(&from_gguf), model_free(&from_hf);
    fixture_close(&f);
}

// A LoRA adapter written for llama.cpp's --lora: the keys llama.cpp reads, two tensors per
// adapted layer named after the base tensor, A as is and B with the base's row order (q/k
// rows permuted for Llama: read back through the same map, B comes out unchanged).
// llama.cpp itself running the file: tools/check_gguf_export.py --lora-adapter.
static void test_gguf_export_lora_adapter(void) {
    const char *tmp = getenv("MARLHF_TEST_TMP") ? getenv("MARLHF_TEST_TMP") : "/tmp";
    Fixture f;
    fixture_open(&f, "llama");
    Model model = lora_model_for_export(&f);
    char path[512];
    snprintf(path, sizeof path, "%s/export-adapter.gguf", tmp);
    EXPECT(model_write_gguf_adapter(&model, path, GGUF_OUT_F32) == 0, "%s", err_msg());
    GgufFile file;
    CHECK(gguf_open(&file, path) == 0, "%s", err_msg());
    char *type = NULL;
    float alpha = 0;
    EXPECT(gguf_get_string(&file, "general.type", &type) == 0 && !strcmp(type, "adapter") &&
               gguf_get_f32(&file, "adapter.lora.alpha", &alpha) == 0 && alpha == 8.0f,
           "adapter keys");
    free(type);
    EXPECT(file.n_tensors == 2 * 7 * 2, "%llu tensors", (unsigned long long)file.n_tensors);
    const ParamEntry *b = param_table_find(&model.table, "model.layers.1.self_attn.k_proj.lora_B.weight");
    const ParamEntry *a = param_table_find(&model.table, "model.layers.1.self_attn.k_proj.lora_A.weight");
    const GgufTensor *tb = gguf_find_tensor(&file, "blk.1.attn_k.weight.lora_b");
    const GgufTensor *ta = gguf_find_tensor(&file, "blk.1.attn_k.weight.lora_a");
    EXPECT(ta && tb && ta->ne[0] == a->shape[1] && ta->ne[1] == 4 && tb->ne[0] == 4 && tb->ne[1] == b->shape[0],
           "lora_a / lora_b shapes");
    if (ta && tb) {
        const long most = a->numel > b->numel ? a->numel : b->numel;
        float *stored = xmalloc((size_t)most * sizeof(float)), *back = xmalloc((size_t)b->numel * sizeof(float));
        CHECK(gguf_tensor_to_f32(&file, tb, stored) == 0, "%s", err_msg());
        TensorMap map;
        tensor_map_gguf(&model.config, param_table_find(&model.table, "model.layers.1.self_attn.k_proj.weight"), &map);
        tensor_map_set_shape(&map, b->shape[0], b->shape[1]);
        tensor_map_load(&map, b, stored, back);
        EXPECT(map.kind == MAP_UNPERMUTE_ROPE && !memcmp(back, model.params + b->offset, (size_t)b->numel * sizeof(float)) &&
                   memcmp(stored, model.params + b->offset, (size_t)b->numel * sizeof(float)),
               "B's rows permuted as the base k_proj's");
        CHECK(gguf_tensor_to_f32(&file, ta, stored) == 0, "%s", err_msg());
        EXPECT(!memcmp(stored, model.params + a->offset, (size_t)a->numel * sizeof(float)), "A as is");
        free(stored), free(back);
    }
    gguf_close(&file);
    remove(path);
    model_free(&model);
    // rsLoRA: llama.cpp scales by alpha / rank, so the file says alpha sqrt(rank) = 8 x 2.
    model = lora_model_scaled(&f, 4, 8.0f, true);
    CHECK(lora_read_adapter(&model, "tests/fixtures/models/llama/lora_rslora") == 0, "%s", err_msg());
    EXPECT(model_write_gguf_adapter(&model, path, GGUF_OUT_F32) == 0, "%s", err_msg());
    CHECK(gguf_open(&file, path) == 0, "%s", err_msg());
    EXPECT(gguf_get_f32(&file, "adapter.lora.alpha", &alpha) == 0 && alpha == 16.0f, "rsLoRA alpha %g", alpha);
    gguf_close(&file);
    remove(path);
    model_free(&model);
    // Per-module ranks and alphas with rsLoRA (PEFT's lora_pattern_rslora fixture): each pair
    // has its module's rank in its shape, and llama.cpp's scale, the file's alpha over that
    // rank, times the stored B is the module's scale times B (the ratio is folded into B).
    // Checked on the modules whose rows GGUF keeps in order (all but q and k).
    load_model(&model, &f, false);
    CHECK(model_load_lora_adapter(&model, "tests/fixtures/models/llama/lora_pattern_rslora", false, 11) == 0, "%s",
          err_msg());
    EXPECT(model_write_gguf_adapter(&model, path, GGUF_OUT_F32) == 0, "%s", err_msg());
    CHECK(gguf_open(&file, path) == 0, "%s", err_msg());
    CHECK(gguf_get_f32(&file, "adapter.lora.alpha", &alpha) == 0, "%s", err_msg());
    int checked = 0, ranks_seen[8] = {0};
    for (int i = model.lora_first_entry; i + 1 < model.table.count; i += 2) {
        const ParamEntry *ea = &model.table.entries[i], *eb = &model.table.entries[i + 1];
        const LoraTarget t = lora_entry_target(ea);
        TensorMap map;
        char name[sizeof map.source + 16], base_name[128];
        snprintf(base_name, sizeof base_name, "%.*s.weight", (int)(strstr(ea->name, ".lora_A") - ea->name), ea->name);
        tensor_map_gguf(&model.config, param_table_find(&model.table, base_name), &map);
        snprintf(name, sizeof name, "%s.lora_b", map.source);
        const GgufTensor *tb2 = gguf_find_tensor(&file, name);
        EXPECT(tb2 && tb2->ne[0] == ea->shape[0], "%s: stored rank %lld, want %ld", name,
               tb2 ? (long long)tb2->ne[0] : -1LL, ea->shape[0]);
        if (!tb2 || t == LORA_Q || t == LORA_K) continue;
        ranks_seen[ea->shape[0] < 8 ? ea->shape[0] : 7] = 1;
        float *stored = xmalloc((size_t)eb->numel * sizeof(float));
        CHECK(gguf_tensor_to_f32(&file, tb2, stored) == 0, "%s", err_msg());
        const float llama_scale = alpha / (float)ea->shape[0];
        const float want_scale = model.lora_scales[(long)ea->layer * LORA_TARGETS + t];
        double worst = 0;
        for (long j = 0; j < eb->numel; j++) {
            const double want = (double)want_scale * model.params[eb->offset + j];
            worst = fmax(worst, fabs(llama_scale * stored[j] - want) / (1e-6 * fabs(want) + 1e-7));
        }
        EXPECT(worst <= 1.0, "%s: llama.cpp's scaled B off by %.3g x tolerance", name, worst);
        free(stored);
        checked++;
    }
    EXPECT(checked == 10 && ranks_seen[4] && ranks_seen[6], "%d modules checked", checked);
    gguf_close(&file);
    remove(path);
    model_free(&model);
    Model plain;
    load_model(&plain, &f, false);
    EXPECT(model_write_gguf_adapter(&plain, path, GGUF_OUT_F32) != 0 && strstr(err_msg(), "no LoRA adapter"),
           "a model without adapters: %s", err_msg());
    model_free(&plain);
    fixture_close(&f);
}

// Tokenizers written into a GGUF file and read back (tokenizer/load_gguf.c) encode and
// decode as the tokenizer.json they came from: SmolLM2-style byte-level BPE ("smollm"),
// Llama-3-style ("llama-bpe") and sentencepiece-style BPE with byte fallback ("llama"). For
// the last only on text without added tokens or leading spaces: there a Llama-2
// tokenizer.json (transformers' "legacy" prefix-space rules) and any GGUF reading of it
// (transformers', llama.cpp's, marlhf's) differ, whoever wrote the file (docs/lora.md has
// the llama.cpp figures). llama.cpp reading the same files: tools/check_gguf_export.py.
static void test_gguf_export_tokenizer(void) {
    const char *tmp = getenv("MARLHF_TEST_TMP") ? getenv("MARLHF_TEST_TMP") : "/tmp";
    const struct {
        const char *dir, *model;
        size_t texts; // how many of texts[] hold for it
    } cases[] = {{"tests/fixtures/models/tiny_chat", "gpt2", 7},
                 {"tests/fixtures/tokenizers/bytelevel_small", "gpt2", 7},
                 {"tests/fixtures/tokenizers/spm_small", "llama", 5}};
    const char *texts[] = {"Hello, world! It's 2026.", "\xc3\x89milie's caf\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac",
                           "tabs\tand\nlines  12345", "a", "",
                           "  leading spaces <|im_start|>user", "<s>Hi</s> there"};
    Model shape;
    ModelLoadOptions options = {.with_lm_head = true};
    CHECK(model_load(&shape, "tests/fixtures/models/tiny_chat", &ops_cpu, &options) == 0, "%s", err_msg());
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        Tokenizer *hf, *gguf;
        CHECK(tokenizer_load(&hf, cases[c].dir) == 0, "%s", err_msg());
        // Weights do not matter here: a model of the tokenizer's vocabulary size.
        ModelConfig cfg = shape.config;
        if (tokenizer_vocab_size(hf) > cfg.vocab_size) cfg.vocab_size = tokenizer_vocab_size(hf);
        Model model;
        model_init(&model, &cfg, &ops_cpu, true, false);
        char path[512];
        snprintf(path, sizeof path, "%s/export-tokenizer-%zu.gguf", tmp, c);
        EXPECT(model_write_gguf(&model, hf, path, GGUF_OUT_F16) == 0, "%s: %s", cases[c].dir, err_msg());
        GgufFile file;
        CHECK(gguf_open(&file, path) == 0, "%s", err_msg());
        char *kind = NULL;
        EXPECT(gguf_get_string(&file, "tokenizer.ggml.model", &kind) == 0 && !strcmp(kind, cases[c].model),
               "%s: tokenizer.ggml.model %s", cases[c].dir, kind ? kind : "?");
        free(kind);
        gguf_close(&file);
        CHECK(tokenizer_load(&gguf, path) == 0, "%s", err_msg());
        for (size_t i = 0; i < cases[c].texts; i++) {
            for (int special = 0; special < 2; special++) {
                int *x, *y, nx, ny;
                CHECK(tokenizer_encode(hf, texts[i], strlen(texts[i]), special, &x, &nx) == 0, "%s", err_msg());
                CHECK(tokenizer_encode(gguf, texts[i], strlen(texts[i]), special, &y, &ny) == 0, "%s", err_msg());
                EXPECT(nx == ny && !memcmp(x, y, (size_t)nx * sizeof(int)), "%s: text %zu (special %d): ids differ",
                       cases[c].dir, i, special);
                char *dx = tokenizer_decode(hf, x, nx, false), *dy = tokenizer_decode(gguf, y, ny, false);
                EXPECT(!strcmp(dx, dy), "%s: text %zu: decoded '%s' vs '%s'", cases[c].dir, i, dx, dy);
                free(x), free(y), free(dx), free(dy);
            }
        }
        EXPECT(tokenizer_bos_id(gguf) == tokenizer_bos_id(hf) && tokenizer_eos_id(gguf) == tokenizer_eos_id(hf) &&
                   tokenizer_adds_bos(gguf) == tokenizer_adds_bos(hf),
               "%s: special ids and BOS rule", cases[c].dir);
        EXPECT((tokenizer_chat_template(gguf) == NULL) == (tokenizer_chat_template(hf) == NULL) &&
                   (!tokenizer_chat_template(hf) || !strcmp(tokenizer_chat_template(gguf), tokenizer_chat_template(hf))),
               "%s: chat template", cases[c].dir);
        tokenizer_free(hf), tokenizer_free(gguf);
        model_free(&model);
        remove(path);
    }
    model_free(&shape);
}

int main(void) {
    RUN(test_param_table);
    RUN(test_logits_loss_and_gradients);
    RUN(test_value_head);
    RUN(test_fused_qkv_products);
    RUN(test_adamw_ten_steps);
    RUN(test_padding_invariance);
    RUN(test_recompute_is_exact);
    RUN(test_gradient_accumulation);
    RUN(test_gradient_points);
    RUN(test_gradient_writes);
    RUN(test_head_on_target_slots_only);
    RUN(test_save_load_round_trip);
    RUN(test_gguf_model_matches_hf);
    RUN(test_gguf_export_round_trip);
    RUN(test_gguf_export_tokenizer);
    RUN(test_gguf_export_lora_adapter);
    RUN(test_lora_options);
    RUN(test_lora_against_peft);
    RUN(test_lora_patterns_against_peft);
    RUN(test_lora_selection_against_peft);
    RUN(test_lora_dropout_against_peft);
    RUN(test_neftune_noise);
    RUN(test_lora_frozen_base_and_merge);
    RUN(test_lora_recompute_is_exact);
    RUN(test_dora_against_peft);
    TEST_EXIT();
}
