// Checkpoints that bitsandbytes quantized (model/bnb_checkpoint.h), against transformers and
// bitsandbytes 0.50.2 on the CPU (tests/fixtures/bnb/, tools/make_bnb_fixtures.py):
//  - logits: NF4 with double quantization (2 layers, tied head), FP4 without (untied head) and
//    LLM.int8, a prefill and token-by-token decoding, against transformers' float32 Llama holding
//    bitsandbytes' dequantized weights (within 2e-5);
//  - the bits: every 4-bit matrix holds the file's own bytes (codes, absmax or their 8-bit codes,
//    second-level absmax, offset), the code books are bitsandbytes' bit for bit, and a matrix
//    dequantizes to bitsandbytes' floats bit for bit (FNV-1a of all of them, and the first 16);
//    LLM.int8's weight * SCB / 127 likewise;
//  - QLoRA over the NF4 checkpoint computes the log-probs and adapter gradients of LoRA over a
//    float32 base holding its dequantized values (same fingerprint);
//  - refusals, each naming the tensor or field: a missing absmax, SCB or quant_state, a
//    malformed quant_state, blocks of 128, a changed code book, a config that disagrees with the
//    tensors (fp4 / nf4, double quantization), rows that are not whole blocks of 64, another
//    quant_method, and a --quantize that would
//    requantize the 4-bit weights.
#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "core/check.h"
#include "core/hash.h"
#include "io/fs.h"
#include "io/safetensors.h"
#include "model/bnb_checkpoint.h"
#include "model/lora.h"
#include "model/quantize.h"
#include "model/weights_io.h"
#include "ops/nf4.h"
#include "ops/q4.h"
#include "qlora_step.h"
#include "test.h"

#define FIXTURES "tests/fixtures/bnb"

static json_t *reference(const char *name) {
    char path[256];
    snprintf(path, sizeof path, FIXTURES "/%s/reference.json", name);
    json_error_t error;
    json_t *root = json_load_file(path, 0, &error);
    CHECK(root, "%s: %s", path, error.text);
    return root;
}

// A hex string of float32 values (8 digits, the IEEE bits, a value). Returns the count.
static long hex_floats(json_t *value, float **out) {
    const char *hex = json_string_value(value);
    CHECK(hex && strlen(hex) % 8 == 0, "reference.json: a float array is not hex");
    const long n = (long)strlen(hex) / 8;
    *out = xmalloc((size_t)n * sizeof(float));
    for (long i = 0; i < n; i++) {
        unsigned bits;
        CHECK(sscanf(hex + 8 * i, "%8x", &bits) == 1, "reference.json: bad hex");
        memcpy(*out + i, &bits, sizeof bits);
    }
    return n;
}

static void load(Model *model, const char *name, const char *quantize) {
    char path[256];
    snprintf(path, sizeof path, FIXTURES "/%s", name);
    ModelLoadOptions options = {.with_lm_head = true, .quantize = quantize};
    CHECK(model_load(model, path, &ops_cpu, &options) == 0, "%s", err_msg());
}

// ---- logits ----

static void test_bnb_logits(void) {
    const char *names[] = {"nf4", "fp4", "int8"};
    const char *quantization[] = {"nf4", "fp4-single", "none"};
    for (int k = 0; k < 3; k++) {
        json_t *ref = reference(names[k]);
        json_t *ids_json = json_object_get(ref, "ids");
        const int T = (int)json_array_size(ids_json);
        int ids[16];
        CHECK(T >= 4 && T <= 16, "ids");
        for (int t = 0; t < T; t++) ids[t] = (int)json_integer_value(json_array_get(ids_json, t));
        float *expected, *bnb_forward;
        const long n = hex_floats(json_object_get(ref, "logits"), &expected);
        CHECK(hex_floats(json_object_get(ref, "bnb_forward_logits"), &bnb_forward) == n, "bnb_forward_logits");
        Model model;
        load(&model, names[k], NULL);
        const int V = model.config.vocab_size;
        CHECK(n == (long)T * V, "%s: %ld logits for %d ids of a vocabulary of %d", names[k], n, T, V);
        EXPECT(!strcmp(model_quantize_name(&model), quantization[k]), "%s: loaded as %s", names[k],
               model_quantize_name(&model));
        // A prefill of all the ids.
        float *got = xmalloc((size_t)n * sizeof(float));
        ModelBatch batch = {.B = 1, .T = T, .tokens = ids};
        model_forward(&model, &batch);
        for (int t = 0; t < T; t++) model_logits_row(&model, t, got + (long)t * V);
        const double prefill = test_max_abs_diff(got, expected, n);
        // Decoding: a prefill of 2, then one token a step (the few-row kernels).
        KvCache cache;
        kv_cache_init(&cache, &model, 1, T);
        ModelBatch first = {.B = 1, .T = 2, .tokens = ids};
        model_forward_cached(&model, &first, &cache);
        double decode = 0;
        for (int t = 1; t < T; t++) {
            model_last_logits(&model, got);
            decode = fmax(decode, test_max_abs_diff(got, expected + (long)t * V, V));
            if (t + 1 < T) {
                ModelBatch one = {.B = 1, .T = 1, .tokens = ids + t + 1};
                model_forward_cached(&model, &one, &cache);
            }
        }
        kv_cache_free(&cache, &model);
        const double bnb_own = test_max_abs_diff(bnb_forward, expected, n);
        printf("bnb %s: logits within %.3g (prefill) and %.3g (decoding) of transformers' float32 forward of the "
               "dequantized checkpoint; bitsandbytes' own quantized forward is %.3g from it\n",
               names[k], prefill, decode, bnb_own);
        EXPECT(prefill <= 2e-5 && decode <= 2e-5, "%s: logits %.3g / %.3g from the reference", names[k], prefill, decode);
        free(got), free(expected), free(bnb_forward);
        model_free(&model);
        json_decref(ref);
    }
}

// ---- the bits ----

static const SafetensorsTensor *tensor(const SafetensorsSet *set, const char *name, const char *suffix) {
    char key[256];
    snprintf(key, sizeof key, "%s%s", name, suffix);
    const SafetensorsTensor *t = safetensors_find(set, key);
    CHECK(t, "no tensor %s", key);
    return t;
}

// The loaded matrices hold the file's bytes, the code books are bitsandbytes', and the
// reference matrix dequantizes to bitsandbytes' floats.
static void check_4bit(const char *name, bool double_quant, const float *book) {
    Model model;
    load(&model, name, NULL);
    char path[256];
    snprintf(path, sizeof path, FIXTURES "/%s", name);
    SafetensorsSet *set;
    CHECK(safetensors_open(path, &set) == 0, "%s", err_msg());
    int matrices = 0, differing = 0;
    for (int i = 0; i < model_base_entries(&model); i++) {
        const ParamEntry *e = &model.table.entries[i];
        const Q8Matrix *m = quantized_matrix(&model, e);
        if (e->layer < 0 || e->ndim != 2) {
            EXPECT(!m, "%s: %s is quantized; bitsandbytes left it in floats", name, e->name);
            continue;
        }
        CHECK(m, "%s: %s is not quantized", name, e->name);
        matrices++;
        const long n = e->numel, blocks = n / NF4_BLOCK;
        const SafetensorsTensor *codes = tensor(set, e->name, ""), *absmax = tensor(set, e->name, ".absmax");
        differing += memcmp(m->nibbles, codes->data, (size_t)n / 2) != 0;
        float map[256];
        CHECK(safetensors_read_f32(tensor(set, e->name, ".quant_map"), map, 16) == 0, "%s", err_msg());
        differing += memcmp(map, book, sizeof(float) * 16) != 0 || m->levels != (book == nf4_levels ? NULL : book);
        if (double_quant) {
            const long blocks2 = (blocks + NF4_SCALE_BLOCK - 1) / NF4_SCALE_BLOCK;
            float nested[64];
            CHECK(blocks2 <= 64, "too many scale blocks");
            CHECK(safetensors_read_f32(tensor(set, e->name, ".nested_absmax"), nested, blocks2) == 0, "%s", err_msg());
            CHECK(safetensors_read_f32(tensor(set, e->name, ".nested_quant_map"), map, 256) == 0, "%s", err_msg());
            const SafetensorsTensor *state = tensor(set, e->name, ".quant_state.bitsandbytes__nf4");
            json_t *object = json_loadb(state->data, state->nbytes, 0, NULL);
            const float offset = (float)json_number_value(json_object_get(object, "nested_offset"));
            json_decref(object);
            differing += !m->scale_codes || m->scales || memcmp(m->scale_codes, absmax->data, (size_t)blocks) != 0 ||
                         memcmp(m->scale_absmax, nested, (size_t)blocks2 * sizeof(float)) != 0 ||
                         memcmp(map, nf4_dynamic_map(), sizeof map) != 0 ||
                         memcmp(&m->scale_offset, &offset, sizeof offset) != 0;
        } else {
            float *scales = xmalloc((size_t)blocks * sizeof(float));
            CHECK(safetensors_read_f32(absmax, scales, blocks) == 0, "%s", err_msg());
            differing += !m->scales || m->scale_codes || memcmp(m->scales, scales, (size_t)blocks * sizeof(float)) != 0;
            free(scales);
        }
    }
    EXPECT(matrices == 7 * model.config.num_layers && differing == 0,
           "%s: %d of %d matrices differ from the file's bytes or bitsandbytes' tables", name, differing, matrices);
    // bitsandbytes' dequantization of one matrix, bit for bit.
    json_t *ref = reference(name);
    const ParamEntry *e = param_table_find(&model.table, json_string_value(json_object_get(ref, "matrix")));
    CHECK(e, "no matrix");
    float *values = xmalloc((size_t)e->numel * sizeof(float)), *first;
    quant_dequantize_rows(quantized_matrix(&model, e), 0, e->shape[0], values);
    char hash[17];
    snprintf(hash, sizeof hash, "%016llx", (unsigned long long)hash_floats(HASH_FNV1A_START, values, e->numel));
    CHECK(hex_floats(json_object_get(ref, "matrix_first_values"), &first) == 16, "first values");
    EXPECT(!strcmp(hash, json_string_value(json_object_get(ref, "matrix_fnv1a"))) &&
               !memcmp(first, values, 16 * sizeof(float)),
           "%s: %s dequantizes to other floats than bitsandbytes' (FNV-1a %s, bitsandbytes' %s)", name, e->name, hash,
           json_string_value(json_object_get(ref, "matrix_fnv1a")));
    free(values), free(first);
    json_decref(ref);
    safetensors_close(set);
    model_free(&model);
}

static void test_bnb_bits(void) {
    check_4bit("nf4", true, nf4_levels);
    check_4bit("fp4", false, fp4_levels);
    // LLM.int8: dequantized on load, the model is float32.
    Model model;
    load(&model, "int8", NULL);
    json_t *ref = reference("int8");
    const ParamEntry *e = param_table_find(&model.table, json_string_value(json_object_get(ref, "matrix")));
    CHECK(e, "no matrix");
    char hash[17];
    snprintf(hash, sizeof hash, "%016llx",
             (unsigned long long)hash_floats(HASH_FNV1A_START, model.params + e->offset, e->numel));
    float *first;
    CHECK(hex_floats(json_object_get(ref, "matrix_first_values"), &first) == 16, "first values");
    EXPECT(!model.quantized && !strcmp(hash, json_string_value(json_object_get(ref, "matrix_fnv1a"))) &&
               !memcmp(first, model.params + e->offset, 16 * sizeof(float)),
           "int8: %s is not bitsandbytes' weight * SCB / 127 (FNV-1a %s)", e->name, hash);
    free(first);
    json_decref(ref);
    model_free(&model);
}

// ---- QLoRA on the NF4 checkpoint ----

enum { QB = 2, QT = 9 };

static const int qlora_row_len[QB] = {QT, QT - 3};

static void test_bnb_qlora(void) {
    Model quantized, dequantized;
    load(&quantized, "nf4", NULL);
    load(&dequantized, "nf4", NULL);
    model_dequantize(&dequantized); // a float32 model holding the checkpoint's values
    LoraConfig lora = {.rank = 4, .alpha = 8.0f, .targets = (1u << LORA_TARGETS) - 1};
    Model *models[2] = {&quantized, &dequantized};
    for (int m = 0; m < 2; m++) {
        CHECK(model_add_lora(models[m], &lora, false, 5) == 0, "%s", err_msg());
        for (int i = models[m]->lora_first_entry; i < models[m]->table.count; i++) {
            const ParamEntry *e = &models[m]->table.entries[i];
            if (strstr(e->name, "lora_B"))
                for (long j = 0; j < e->numel; j++) models[m]->params[e->offset + j] = 0.01f * (float)((j * 37 + i) % 11 - 5);
        }
        model_enable_grad(models[m]);
    }
    EXPECT(!dequantized.quantized && quantized.lora_base_fingerprint == dequantized.lora_base_fingerprint,
           "fingerprints %016llx (bnb nf4), %016llx (dequantized)", (unsigned long long)quantized.lora_base_fingerprint,
           (unsigned long long)dequantized.lora_base_fingerprint);
    const long G = model_trainable_floats(&quantized);
    CHECK(G == model_trainable_floats(&dequantized), "trainable sizes differ");
    float logp[2][QB * QT], *grads[2];
    double scale = 0;
    for (int m = 0; m < 2; m++) {
        grads[m] = xmalloc((size_t)G * sizeof(float));
        qlora_step(models[m], QB, QT, qlora_row_len, logp[m], grads[m]);
    }
    for (long i = 0; i < G; i++) scale = fmax(scale, fabs(grads[1][i]));
    const double logp_error = test_max_abs_diff(logp[0], logp[1], QB * QT), grad_error = test_max_abs_diff(grads[0], grads[1], G);
    printf("QLoRA on the bnb NF4 checkpoint: log-probs within %.3g and adapter gradients within %.3g (largest %.3g) "
           "of LoRA on its dequantized float32 base\n", logp_error, grad_error, scale);
    EXPECT(scale > 0 && logp_error <= 2e-5 && grad_error <= 1e-4 * scale, "log-probs %.3g, gradients %.3g of %.3g",
           logp_error, grad_error, scale);
    free(grads[0]), free(grads[1]);
    model_free(&quantized);
    model_free(&dequantized);
}

// ---- refusals ----

static const char *tmp_root(void) {
    const char *t = getenv("MARLHF_TEST_TMP");
    return t && *t ? t : "/tmp";
}

// A copy of fixture `name` in `dir` with tensor `drop` left out, tensor `replace` given `count`
// values of `dtype` at `data` (one dimension), and config.json's `from` replaced by `to` (each
// NULL for none).
typedef struct {
    const char *drop, *replace;
    SafetensorsDtype dtype;
    const void *data;
    long long count;
    const char *from, *to;
} Variant;

static void variant(const char *name, const char *dir, Variant v) {
    const char *drop = v.drop, *replace = v.replace, *from = v.from, *to = v.to;
    char src[256], path[1024];
    snprintf(src, sizeof src, FIXTURES "/%s", name);
    CHECK(fs_mkdir_p(dir) == 0, "%s", err_msg());
    SafetensorsSet *set;
    CHECK(safetensors_open(src, &set) == 0, "%s", err_msg());
    const int count = safetensors_tensor_count(set);
    SafetensorsWriteTensor *out = xcalloc((size_t)count, sizeof *out);
    int kept = 0;
    for (int i = 0; i < count; i++) {
        const SafetensorsTensor *t = safetensors_tensor_at(set, i);
        if (drop && !strcmp(t->name, drop)) continue;
        SafetensorsWriteTensor *w = &out[kept++];
        w->name = t->name;
        w->dtype = t->dtype;
        w->ndim = t->ndim;
        memcpy(w->shape, t->shape, sizeof w->shape);
        w->data = t->data;
        if (replace && !strcmp(t->name, replace)) {
            w->dtype = v.dtype;
            w->ndim = 1;
            w->shape[0] = v.count;
            w->data = v.data;
        }
    }
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    CHECK(safetensors_write(path, out, kept, NULL) == 0, "%s", err_msg());
    free(out);
    safetensors_close(set);
    char *text;
    size_t size;
    snprintf(path, sizeof path, "%s/config.json", src);
    CHECK(fs_read_file(path, 1 << 20, &text, &size) == 0, "%s", err_msg());
    char *at = from ? strstr(text, from) : NULL;
    CHECK(!from || at, "config.json has no '%s'", from);
    char *config = xmalloc(size + (to ? strlen(to) : 0) + 1);
    if (at) sprintf(config, "%.*s%s%s", (int)(at - text), text, to, at + strlen(from));
    else memcpy(config, text, size + 1);
    snprintf(path, sizeof path, "%s/config.json", dir);
    CHECK(fs_write_file_atomic(path, config, strlen(config)) == 0, "%s", err_msg());
    free(config), free(text);
}

// Loading `dir` (with `quantize`) fails with an error containing `expected`.
static void expect_refused(const char *dir, const char *quantize, const char *expected) {
    Model model;
    ModelLoadOptions options = {.with_lm_head = true, .quantize = quantize};
    err_clear();
    const int rc = model_load(&model, dir, &ops_cpu, &options);
    EXPECT(rc != 0 && strstr(err_msg(), expected), "%s: rc %d, error '%s', expected '%s'", dir, rc, err_msg(), expected);
    if (rc == 0) model_free(&model);
}

static void test_bnb_refusals(void) {
    char dir[512], state_key[256], map_key[256];
    const char *up = "model.layers.1.mlp.up_proj.weight";
    snprintf(state_key, sizeof state_key, "%s.quant_state.bitsandbytes__nf4", up);
    snprintf(map_key, sizeof map_key, "%s.quant_map", up);
    const char *bad_json = "{\"quant_type\": \"nf4\", \"blocksize\": 64,";
    const char *blocks_of_128 = "{\"quant_type\": \"nf4\", \"blocksize\": 128, \"dtype\": \"bfloat16\", \"shape\": "
                                "[128, 64], \"nested_blocksize\": 256, \"nested_dtype\": \"float32\", \"nested_offset\": 0.05}";
    const char *wrong_shape = "{\"quant_type\": \"nf4\", \"blocksize\": 64, \"dtype\": \"bfloat16\", \"shape\": "
                              "[64, 128], \"nested_blocksize\": 256, \"nested_dtype\": \"float32\", \"nested_offset\": 0.05}";
    float other_book[16];
    memcpy(other_book, nf4_levels, sizeof other_book);
    other_book[9] = nextafterf(other_book[9], 1.0f); // one level one ulp off
    const struct {
        const char *fixture, *dir;
        Variant v;
        const char *expected;
    } cases[] = {
        {"nf4", "no_absmax", {.drop = "model.layers.1.mlp.up_proj.weight.absmax"},
         "bitsandbytes tensor 'model.layers.1.mlp.up_proj.weight' has no 'model.layers.1.mlp.up_proj.weight.absmax'"},
        {"nf4", "no_quant_state", {.drop = state_key},
         "has no 'model.layers.1.mlp.up_proj.weight.quant_state.bitsandbytes__nf4'"},
        {"nf4", "bad_json", {.replace = state_key, .dtype = SAFETENSORS_U8, .data = bad_json, .count = (long long)strlen(bad_json)},
         "bitsandbytes tensor 'model.layers.1.mlp.up_proj.weight': its quant_state is not a JSON object"},
        {"nf4", "blocks_of_128", {.replace = state_key, .dtype = SAFETENSORS_U8, .data = blocks_of_128,
                                  .count = (long long)strlen(blocks_of_128)},
         "bitsandbytes tensor 'model.layers.1.mlp.up_proj.weight' has blocks of 128 values"},
        {"nf4", "wrong_shape", {.replace = state_key, .dtype = SAFETENSORS_U8, .data = wrong_shape,
                                .count = (long long)strlen(wrong_shape)},
         "bitsandbytes tensor 'model.layers.1.mlp.up_proj.weight': quant_state's shape is not [128, 64]"},
        {"nf4", "other_code_book", {.replace = map_key, .dtype = SAFETENSORS_F32, .data = other_book, .count = 16},
         "bitsandbytes tensor 'model.layers.1.mlp.up_proj.weight.quant_map' is not bitsandbytes' nf4 table"},
        {"nf4", "code_book_dtype", {.replace = map_key, .dtype = SAFETENSORS_U8, .data = wrong_shape, .count = 16},
         "bitsandbytes tensor 'model.layers.1.mlp.up_proj.weight.quant_map' must be F32 with 16 values, not U8"},
        {"fp4", "fp4_said_nf4", {.from = "\"bnb_4bit_quant_type\": \"fp4\"", .to = "\"bnb_4bit_quant_type\": \"nf4\""},
         "is fp4, config.json says nf4"},
        {"fp4", "double_quant_said", {.from = "\"bnb_4bit_use_double_quant\": false", .to = "\"bnb_4bit_use_double_quant\": true"},
         "config.json says bnb_4bit_use_double_quant true, its quant_state has no nested_offset"},
        {"fp4", "gptq", {.from = "\"quant_method\": \"bitsandbytes\"", .to = "\"quant_method\": \"gptq\""},
         "'quantization_config.quant_method' is 'gptq'; marlhf reads bitsandbytes checkpoints only"},
        {"fp4", "rows_of_96", {.from = "\"hidden_size\": 64", .to = "\"hidden_size\": 96"},
         "bitsandbytes tensor 'model.layers.0.self_attn.q_proj.weight' has rows of 96 values: its blocks of 64 span rows"},
        {"int8", "no_scb", {.drop = "model.layers.0.self_attn.q_proj.SCB"},
         "bitsandbytes tensor 'model.layers.0.self_attn.q_proj.weight' has no 'model.layers.0.self_attn.q_proj.SCB'"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        snprintf(dir, sizeof dir, "%s/test_bnb/%s", tmp_root(), cases[i].dir);
        variant(cases[i].fixture, dir, cases[i].v);
        expect_refused(dir, NULL, cases[i].expected);
    }
    // Requantizing the 4-bit codes is refused; the checkpoint's own name, or none, loads it.
    expect_refused(FIXTURES "/nf4", "nf4-single", "bitsandbytes nf4 checkpoint, run with its own 4-bit weights: "
                                                  "--quantize nf4-single would quantize them a second time");
    expect_refused(FIXTURES "/fp4", "q8_0", "--quantize q8_0 would quantize them a second time");
    Model model;
    load(&model, "nf4", "nf4");
    EXPECT(!strcmp(model_quantize_name(&model), "nf4"), "%s", model_quantize_name(&model));
    model_free(&model);
    // LLM.int8 is a float32 model: --quantize applies as to any.
    load(&model, "int8", "q8_0");
    EXPECT(!strcmp(model_quantize_name(&model), "q8_0"), "%s", model_quantize_name(&model));
    model_free(&model);
    // marlhf does not quantize float weights to FP4.
    Model plain;
    ModelLoadOptions fp4 = {.with_lm_head = true, .quantize = "fp4"};
    err_clear();
    EXPECT(model_load(&plain, "tests/fixtures/models/tiny_chat", &ops_cpu, &fp4) != 0 &&
               strstr(err_msg(), "quantization 'fp4' is only that of a bitsandbytes FP4 checkpoint"),
           "fp4 on a float model: '%s'", err_msg());
}

int main(void) {
    RUN(test_bnb_logits);
    RUN(test_bnb_bits);
    RUN(test_bnb_qlora);
    RUN(test_bnb_refusals);
    TEST_EXIT();
}
