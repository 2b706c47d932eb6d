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
#include <unistd.h>

#include "core/check.h"
#include "io/fs.h"
#include "model/lora.h"
#include "model/quantize.h"
#include "model/weights_io.h"
#include "ops/kquant.h"
#include "ops/q4.h"
#include "q4_k_m_model.h"
#include "test.h"

static OpsBackend other;

// The bytes `other` holds: its alloc and free keep a list of live blocks (the CPU's memory under
// another name), so a test can weigh what a model takes in a backend's memory.
enum { MAX_BLOCKS = 8192 };
static struct {
    void *ptr;
    size_t bytes;
} live[MAX_BLOCKS];
static int live_count;
static size_t live_bytes, peak_bytes; // peak_bytes: the most live at once since a test reset it

static void *counted_alloc(size_t bytes) {
    CHECK(live_count < MAX_BLOCKS, "more than %d live blocks", MAX_BLOCKS);
    void *ptr = ops_cpu.alloc(bytes);
    live[live_count].ptr = ptr, live[live_count].bytes = bytes;
    live_count++;
    live_bytes += bytes;
    if (live_bytes > peak_bytes) peak_bytes = live_bytes;
    return ptr;
}

static void counted_free(void *ptr) {
    if (!ptr) return;
    int i = 0;
    while (i < live_count && live[i].ptr != ptr) i++;
    CHECK(i < live_count, "host-as-device free of %p, which it did not allocate", ptr);
    live_bytes -= live[i].bytes;
    live[i] = live[--live_count];
    ops_cpu.free(ptr);
}
// Every --quantize type (q4_k_m has its own tests below: the tiny model's rows are not whole
// super-blocks, so the mixes are only their fallback types: q5_k_m's Q5_1 and Q8_0, q3_k_m's
// Q4_0 and Q5_0, iq4_nl's IQ4_NL and Q8_0).
static const char *const types[] = {"q8_0", "q4_0", "nf4", "nf4-single", "q4_1", "q5_1", "q5_k_m", "q3_k_m", "iq4_nl"};
enum { TYPE_COUNT = sizeof types / sizeof types[0] };
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
    for (int k = 0; k < TYPE_COUNT; k++) {
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
    for (int k = 0; k < TYPE_COUNT; k++) {
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
    for (int k = 0; k < TYPE_COUNT; k++) {
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
            const long stored = mo.table.entries[i].stored; // its place in the other backend's smaller buffer
            for (long j = 0; j < e->numel; j++) mc.params[e->offset + j] = mo.params[stored + j] = 1e-3f * (float)(j % 7);
        }
        expect_same_logprobs(types[k], &mc, &mo);
        // The trainable tail (what AdamW updates, where a saved adapter is read back) is the
        // adapters in the smaller buffer too.
        EXPECT(model_trainable_params(&mo) == mo.weights.layers[0].lora_a[LORA_Q] &&
                   model_trainable_params(&mc) == mc.weights.layers[0].lora_a[LORA_Q],
               "%s: the trainable tail is not where the first adapter is", types[k]);
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

// QDoRA through the other backend's paths: the magnitudes made from the dequantized base (its
// dequantize_rows, then a host copy), the norms at each forward from its own dequantized
// scratch; the same magnitudes, log-probs and merged files as the CPU's.
static void test_qdora(void) {
    const char *const kinds[] = {"q8_0", "nf4", "q5_k_m"};
    for (int k = 0; k < 3; k++) {
        Model mc, mo;
        load(&mc, tiny, &ops_cpu, kinds[k]);
        load(&mo, tiny, &other, kinds[k]);
        LoraConfig dora = {.rank = 4, .alpha = 8.0f, .targets = (1u << LORA_TARGETS) - 1, .dora = true};
        CHECK(model_add_lora(&mc, &dora, false, 7) == 0 && model_add_lora(&mo, &dora, false, 7) == 0, "%s", err_msg());
        long magnitudes = 0, differ = 0;
        for (int i = mc.lora_first_entry; i < mc.table.count; i++) {
            const ParamEntry *e = &mc.table.entries[i];
            const long stored = mo.table.entries[i].stored;
            if (strstr(e->name, "lora_magnitude_vector")) {
                magnitudes++;
                differ += memcmp(mc.params + e->offset, mo.params + stored, (size_t)e->numel * sizeof(float)) != 0;
            }
            if (strstr(e->name, ".lora_B."))
                for (long j = 0; j < e->numel; j++) mc.params[e->offset + j] = mo.params[stored + j] = 1e-3f * (float)(j % 7);
        }
        printf("# qdora %-10s %ld magnitude vectors, %ld differ\n", kinds[k], magnitudes, differ);
        EXPECT(magnitudes > 0 && differ == 0, "qdora %s: %ld of %ld magnitude vectors differ", kinds[k], differ, magnitudes);
        char label[32];
        snprintf(label, sizeof label, "qdora %s", kinds[k]);
        expect_same_logprobs(label, &mc, &mo);
        model_free(&mc);
        model_free(&mo);
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

// The bytes of a quantized matrix's arrays, from its type's block layout (ops/ops.h).
static size_t block_bytes(const Q8Matrix *m) {
    const size_t n = (size_t)m->rows * (size_t)m->cols;
    if (m->type == QUANT_Q8_0) return n + n / 32 * sizeof(float);                  // int8 values, a scale per 32
    if (m->type == QUANT_Q4_0 || m->type == QUANT_IQ4_NL) return n / 2 + n / 32 * sizeof(float); // nibbles, a scale per 32
    if (m->type == QUANT_Q5_0) return n / 2 + n / 32 * (sizeof(float) + 4);        // and a word of fifth bits per 32
    if (m->type == QUANT_Q4_1) return n / 2 + n / 32 * 2 * sizeof(float);          // nibbles, a scale and a minimum per 32
    if (m->type == QUANT_Q5_1) return n / 2 + n / 32 * (2 * sizeof(float) + 4);    // and a word of fifth bits per 32
    if (quant_is_kquant(m->type)) return n / 256 * (size_t)kquant_block_bytes(m->type); // the file's super-blocks
    CHECK(m->type == QUANT_NF4, "type %d not weighed here", (int)m->type);
    if (m->scales) return n / 2 + n / 64 * sizeof(float);                          // nibbles, a scale per 64
    return n / 2 + n / 64 + (n / 64 + 255) / 256 * sizeof(float);                  // a code per 64, an absmax per 256 codes
}

// What `model` holds beyond the float model: -4 bytes per float of every quantized weight (no
// float32 slot), plus its blocks (a tied head's shared ones once).
static long expected_change(const Model *model) {
    long change = 0;
    const void *counted[2] = {NULL, NULL};
    for (int i = 0; i < model_base_entries(model); i++) {
        const ParamEntry *e = &model->table.entries[i];
        const Q8Matrix *m = quantized_matrix(model, e);
        if (!m) continue;
        change -= e->numel * (long)sizeof(float);
        if (m->values == counted[0] || m->values == counted[1]) continue;
        change += (long)block_bytes(m);
        if (!counted[0]) counted[0] = m->values;
        else counted[1] = m->values;
    }
    return change;
}

// A quantized model in another backend's memory takes its blocks and its float32 tensors only:
// the bytes allocated through the backend after loading are the float model's, less 4 per
// quantized weight, plus the blocks -- when quantized while loading, after loading
// (model_quantize), and under QLoRA adapters (the adapters' floats more). On the CPU the table
// keeps its layout (stored_total == total; the pages are given back instead).
// MARLHF_QBACKEND_MODEL=path also reports that model's figures (SmolLM2, for the docs).
static void check_memory(const char *path, bool assert_exact) {
    Model model;
    load(&model, path, &other, NULL);
    const size_t float_bytes = live_bytes;
    model_free(&model);
    EXPECT(live_bytes == 0 && live_count == 0, "%zu bytes left in %d blocks after model_free", live_bytes, live_count);
    printf("# %s: the float32 model takes %zu bytes in the backend's memory\n", path, float_bytes);
    for (int k = 0; k < TYPE_COUNT; k++) {
        for (int after = 0; after < 2; after++) {
            peak_bytes = live_bytes;
            if (after) {
                load(&model, path, &other, NULL);
                CHECK(model_quantize(&model, types[k]) == 0, "%s", err_msg());
                // The float model's buffer was given back before the blocks were made.
                if (assert_exact)
                    EXPECT(peak_bytes == float_bytes, "%s after loading: %zu bytes at the peak, the float model %zu",
                           types[k], peak_bytes, float_bytes);
            } else {
                load(&model, path, &other, types[k]);
                // Quantized while loading, the float32 model never exists there: nothing more
                // was held at any moment than the model holds at the end.
                if (assert_exact)
                    EXPECT(peak_bytes == live_bytes, "%s while loading: %zu bytes at the peak, %zu at the end", types[k],
                           peak_bytes, live_bytes);
            }
            const long want = (long)float_bytes + expected_change(&model);
            printf("# %s %-10s (%s): %zu bytes (%.3f of the float model's), expected %ld, peak %zu; %ld of %ld "
                   "floats stored\n",
                   path, types[k], after ? "model_quantize" : "quantized while loading", live_bytes,
                   (double)live_bytes / (double)float_bytes, want, peak_bytes, model.table.stored_total, model.table.total);
            if (assert_exact)
                EXPECT((long)live_bytes == want && live_bytes < float_bytes, "%s %s: %zu bytes, expected %ld",
                       types[k], after ? "after loading" : "while loading", live_bytes, want);
            if (!after && assert_exact) {
                // QLoRA: the adapters' floats (and their stored slots) come on top.
                LoraConfig lora = {.rank = 4, .alpha = 8.0f, .targets = (1u << LORA_TARGETS) - 1};
                CHECK(model_add_lora(&model, &lora, false, 7) == 0, "%s", err_msg());
                long adapter_floats = 0;
                for (int i = model.lora_first_entry; i < model.table.count; i++)
                    adapter_floats += (model.table.entries[i].numel + 15) / 16 * 16;
                EXPECT((long)live_bytes == want + adapter_floats * (long)sizeof(float),
                       "%s with adapters: %zu bytes, expected %ld", types[k], live_bytes,
                       want + adapter_floats * (long)sizeof(float));
                model_remove_lora(&model);
                EXPECT((long)live_bytes == want, "%s, adapters removed: %zu bytes, expected %ld", types[k],
                       live_bytes, want);
            }
            model_free(&model);
        }
        Model on_cpu;
        load(&on_cpu, path, &ops_cpu, types[k]);
        EXPECT(on_cpu.table.stored_total == on_cpu.table.total, "%s on the CPU: the table's layout changed", types[k]);
        model_free(&on_cpu);
    }
}

// A llama.cpp Q4_K_M file with its own bits (--quantize q4_k_m): its Q4_K, Q6_K, Q5_0 and Q8_0
// blocks moved to the other backend (model/quantize_q4_k_m.c builds them on the host), the same
// as the CPU's, the same log-probs, and only the blocks and the norms in its memory; the same
// mix made from the float model after loading (model_quantize).
static void test_q4_k_m_file(void) {
    const char *root = getenv("MARLHF_TEST_TMP") ? getenv("MARLHF_TEST_TMP") : "/tmp";
    char path[300];
    snprintf(path, sizeof path, "%s/qbackend_q4_k_m_%d.gguf", root, (int)getpid());
    write_q4_k_m_llama(path, 0x9e37);
    Model floats;
    load(&floats, path, &other, NULL);
    const size_t float_bytes = live_bytes;
    model_free(&floats);
    for (int after = 0; after < 2; after++) {
        Model mc, mo;
        load(&mc, path, &ops_cpu, "q4_k_m");
        if (after) {
            load(&mo, path, &other, NULL);
            CHECK(model_quantize(&mo, "q4_k_m") == 0, "%s", err_msg());
        } else {
            load(&mo, path, &other, "q4_k_m");
        }
        if (after) mc.dequantized_matmuls = mo.dequantized_matmuls = true; // the float model's q4_k_m need not be the file's bytes
        const char *label = after ? "q4_k_m after loading" : "q4_k_m";
        const long want = (long)float_bytes + expected_change(&mo); // weighed before a forward allocates activations
        printf("# %-28s %zu bytes in the backend's memory (float model %zu), expected %ld\n", label, live_bytes,
               float_bytes, want);
        EXPECT((long)live_bytes == want, "%s: %zu bytes, expected %ld", label, live_bytes, want);
        if (!after) expect_same_blocks(label, &mc, &mo);
        expect_same_logprobs(label, &mc, &mo);
        model_free(&mc);
        model_free(&mo);
    }
    remove(path);
}

// llama.cpp's files (tests/fixtures/gguf) with their own bits on the other backend: Q5_K_M,
// Q3_K_M and Q2_K under --quantize q4_k_m (and Q5_K_M under q5_k_m), Q4_1 and Q5_1 under theirs.
// Every matrix keeps the file's blocks there as on the CPU (the same type, the same dequantized
// floats: the GPU has kernels for every type, ops/cuda/dequantize.cuh), the file's own type
// among them, and the log-probs are the CPU's.
static void test_llama_cpp_files(void) {
    static const struct {
        const char *path, *quantize;
        QuantType own; // the type the file is named for, which must be held as it is
    } files[] = {
        {"tests/fixtures/gguf/q5_k_m.gguf", "q4_k_m", QUANT_Q5_K}, {"tests/fixtures/gguf/q5_k_m.gguf", "q5_k_m", QUANT_Q5_K},
        {"tests/fixtures/gguf/q3_k_m.gguf", "q4_k_m", QUANT_Q3_K}, {"tests/fixtures/gguf/q2_k.gguf", "q4_k_m", QUANT_Q2_K},
        {"tests/fixtures/gguf/q4_1.gguf", "q4_1", QUANT_Q4_1},     {"tests/fixtures/gguf/q5_1.gguf", "q5_1", QUANT_Q5_1},
    };
    for (size_t f = 0; f < sizeof files / sizeof files[0]; f++) {
        Model mc, mo;
        load(&mc, files[f].path, &ops_cpu, files[f].quantize);
        load(&mo, files[f].path, &other, files[f].quantize);
        char label[96];
        snprintf(label, sizeof label, "%s --quantize %s", strrchr(files[f].path, '/') + 1, files[f].quantize);
        int own = 0;
        for (int i = 0; i < model_base_entries(&mo); i++) {
            const Q8Matrix *b = quantized_matrix(&mo, &mo.table.entries[i]);
            own += b && b->type == files[f].own;
        }
        printf("# %-28s %d matrices of the file's own type on %s\n", label, own, other.name);
        EXPECT(own >= 8, "%s: %d matrices of type %d on %s", label, own, (int)files[f].own, other.name);
        expect_same_blocks(label, &mc, &mo);
        expect_same_logprobs(label, &mc, &mo);
        model_free(&mc);
        model_free(&mo);
    }
}

static void test_quantized_memory(void) {
    check_memory(tiny, true);
    if (getenv("MARLHF_QBACKEND_MODEL")) check_memory(getenv("MARLHF_QBACKEND_MODEL"), false);
}

int main(void) {
    other = ops_cpu;
    other.name = "host-as-device";
    other.alloc = counted_alloc;
    other.free = counted_free;
    RUN(test_quantized_load);
    RUN(test_quantize_after_load);
    RUN(test_qlora_adapters_and_save);
    RUN(test_bitsandbytes_checkpoint);
    RUN(test_qdora);
    RUN(test_llama_cpp_files);
    RUN(test_quantized_memory);
    RUN(test_q4_k_m_file);
    TEST_EXIT();
}
