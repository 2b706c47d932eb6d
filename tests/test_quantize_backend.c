// Quantized weights on a backend other than the CPU's, without a GPU: "host-as-device" is the
// CPU's table under another identity, so the model code takes every path it takes for the
// GPU (ops/cuda) -- weights loaded into a host copy and sent with copy_to_device, quantized
// blocks built on the host and moved with quantized_to_backend, model_quantize from host
// copies of device weights, the LoRA base fingerprint and the saved model from host copies
// of the blocks (model/quantize.c, model/lora.c, model/weights_io.c) -- while its memory is
// still readable here. Everything must equal the CPU's own: the blocks (dequantized, bit for
// bit), the log-probs, the fingerprint and the saved files. tests/gpu/test_cuda.c checks the
// same on the GPU itself.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/check.h"
#include "io/fs.h"
#include "model/lora.h"
#include "model/quantize.h"
#include "model/weights_io.h"
#include "ops/q4.h"
#include "test.h"

static OpsBackend other;
static const char *const types[] = {"q8_0", "q4_0", "nf4", "nf4-single"};
static const char *const tiny = "tests/fixtures/models/tiny_chat";

// Every quantized entry of the two models dequantizes to the same floats.
static void expect_same_blocks(const char *label, const Model *mc, const Model *mo) {
    long matrices = 0, different = 0;
    for (int i = 0; i < model_base_entries(mc); i++) {
        const ParamEntry *e = &mc->table.entries[i];
        const Q8Matrix *a = quantized_matrix(mc, e), *b = quantized_matrix(mo, e);
        EXPECT((a != NULL) == (b != NULL), "%s: %s quantized on one backend only", label, e->name);
        if (!a || !b) continue;
        EXPECT(a->type == b->type && a->rows == b->rows && a->cols == b->cols && (a->scales != NULL) == (b->scales != NULL),
               "%s: %s has another layout", label, e->name);
        float *x = xmalloc((size_t)e->numel * sizeof(float)), *y = xmalloc((size_t)e->numel * sizeof(float));
        quant_dequantize_rows(a, 0, a->rows, x);
        quant_dequantize_rows(b, 0, b->rows, y);
        different += memcmp(x, y, (size_t)e->numel * sizeof(float)) != 0;
        matrices++;
        free(x), free(y);
    }
    printf("# %-28s %ld quantized matrices, %ld differ\n", label, matrices, different);
    EXPECT(matrices > 0 && different == 0, "%s: %ld of %ld matrices differ", label, different, matrices);
}

// The two models' log-probs over the same tokens, bit for bit (the same ops run).
static void expect_same_logprobs(const char *label, Model *mc, Model *mo) {
    enum { B = 2, T = 24 };
    int tokens[B * T], targets[B * T];
    for (int i = 0; i < B * T; i++) tokens[i] = (i * 37 + 5) % mc->config.vocab_size;
    for (int i = 0; i < B * T; i++) targets[i] = i % T + 1 < T ? tokens[i + 1] : -1;
    float logp_c[B * T], logp_o[B * T];
    ModelBatch batch = {.B = B, .T = T, .tokens = tokens};
    model_forward(mc, &batch);
    model_logprobs(mc, targets, logp_c, NULL, NULL);
    model_forward(mo, &batch);
    model_logprobs(mo, targets, logp_o, NULL, NULL);
    EXPECT(memcmp(logp_c, logp_o, sizeof logp_c) == 0, "%s: log-probs differ (%g vs %g first)", label, logp_o[0],
           logp_c[0]);
}

static void load(Model *model, const char *path, const OpsBackend *ops, const char *quantize) {
    ModelLoadOptions options = {.with_lm_head = true, .quantize = quantize};
    CHECK(model_load(model, path, ops, &options) == 0, "%s", err_msg());
}

// Quantized while loading (model_load: the loader's host copy, quantized_take).
static void test_quantized_load(void) {
    for (int k = 0; k < 4; k++) {
        Model mc, mo;
        load(&mc, tiny, &ops_cpu, types[k]);
        load(&mo, tiny, &other, types[k]);
        expect_same_blocks(types[k], &mc, &mo);
        expect_same_logprobs(types[k], &mc, &mo);
        model_free(&mc);
        model_free(&mo);
    }
}

// Quantized after loading (model_quantize: each weight copied to the host, quantized, moved,
// its device floats zeroed).
static void test_quantize_after_load(void) {
    for (int k = 0; k < 4; k++) {
        Model mc, mo;
        load(&mc, tiny, &ops_cpu, types[k]);
        load(&mo, tiny, &other, NULL);
        CHECK(model_quantize(&mo, types[k]) == 0, "%s", err_msg());
        char label[64];
        snprintf(label, sizeof label, "%s after loading", types[k]);
        expect_same_blocks(label, &mc, &mo);
        expect_same_logprobs(label, &mc, &mo);
        model_free(&mc);
        model_free(&mo);
    }
}

// Whether two files (of at most 64 MB) hold the same bytes; false when either cannot be read.
static bool same_contents(const char *a, const char *b) {
    char *x = NULL, *y = NULL;
    size_t nx = 0, ny = 0;
    const bool read = fs_read_file(a, 64u << 20, &x, &nx) == 0 && fs_read_file(b, 64u << 20, &y, &ny) == 0;
    const bool same = read && nx == ny && memcmp(x, y, nx) == 0;
    free(x), free(y);
    return same;
}

// QLoRA: adapters over the quantized base on both (the base fingerprint hashes the
// dequantized base from host copies of the blocks), the saved merged model and adapter
// equal file for file, and the adapters removed again.
static void test_qlora_adapters_and_save(void) {
    const char *root = getenv("MARLHF_TEST_TMP") ? getenv("MARLHF_TEST_TMP") : "/tmp";
    for (int k = 0; k < 4; k++) {
        Model mc, mo;
        load(&mc, tiny, &ops_cpu, types[k]);
        load(&mo, tiny, &other, types[k]);
        LoraConfig lora = {.rank = 4, .alpha = 8.0f, .targets = (1u << LORA_TARGETS) - 1};
        CHECK(model_add_lora(&mc, &lora, false, 7) == 0 && model_add_lora(&mo, &lora, false, 7) == 0, "%s", err_msg());
        EXPECT(mc.lora_base_fingerprint == mo.lora_base_fingerprint, "%s: fingerprints %016llx and %016llx", types[k],
               (unsigned long long)mc.lora_base_fingerprint, (unsigned long long)mo.lora_base_fingerprint);
        // Nonzero B matrices, so the merged weights differ from the base.
        for (int i = 0; i < mc.table.count; i++) {
            const ParamEntry *e = &mc.table.entries[i];
            if (!strstr(e->name, ".lora_B.")) continue;
            for (long j = 0; j < e->numel; j++) mc.params[e->offset + j] = mo.params[e->offset + j] = 1e-3f * (float)(j % 7);
        }
        expect_same_logprobs(types[k], &mc, &mo);
        char dir_c[256], dir_o[256], file_c[300], file_o[300];
        snprintf(dir_c, sizeof dir_c, "%s/marlhf_qbackend_XXXXXX", root);
        snprintf(dir_o, sizeof dir_o, "%s/marlhf_qbackend_XXXXXX", root);
        CHECK(mkdtemp(dir_c) && mkdtemp(dir_o), "mkdtemp in %s failed", root);
        CHECK(model_write_hf_files(&mc, dir_c) == 0 && model_write_hf_files(&mo, dir_o) == 0, "%s", err_msg());
        const char *files[] = {"model.safetensors", "adapter/adapter_model.safetensors", "adapter/adapter_config.json"};
        for (int f = 0; f < 3; f++) {
            snprintf(file_c, sizeof file_c, "%s/%s", dir_c, files[f]);
            snprintf(file_o, sizeof file_o, "%s/%s", dir_o, files[f]);
            EXPECT(same_contents(file_c, file_o), "%s: the saved %s differ", types[k], files[f]);
        }
        model_remove_lora(&mc);
        model_remove_lora(&mo);
        expect_same_logprobs(types[k], &mc, &mo);
        model_free(&mc);
        model_free(&mo);
        CHECK(fs_remove_tree(dir_c) == 0 && fs_remove_tree(dir_o) == 0, "%s", err_msg());
    }
}

// A bitsandbytes NF4 checkpoint: its blocks read on the host and moved (weights_io.c).
static void test_bitsandbytes_checkpoint(void) {
    Model mc, mo;
    load(&mc, "tests/fixtures/bnb/nf4", &ops_cpu, NULL);
    load(&mo, "tests/fixtures/bnb/nf4", &other, NULL);
    expect_same_blocks("bitsandbytes nf4", &mc, &mo);
    expect_same_logprobs("bitsandbytes nf4", &mc, &mo);
    model_free(&mc);
    model_free(&mo);
}

int main(void) {
    other = ops_cpu;
    other.name = "host-as-device";
    RUN(test_quantized_load);
    RUN(test_quantize_after_load);
    RUN(test_qlora_adapters_and_save);
    RUN(test_bitsandbytes_checkpoint);
    TEST_EXIT();
}
