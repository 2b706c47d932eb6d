// Partial loads (ModelLoadOptions.keep_range), how ZeRO-3 gives each rank only its shard of
// the layers: the kept part of every parameter is the whole load's, bit for bit, the rest is
// zero, and the pages of what is not kept are never touched (mincore: not resident), so a
// rank's memory never holds the whole model. model_reload_weights (a resumed run) keeps the
// same parts. That the ranks' shards together make the model is tests/cli/data_parallel.sh's
// (ZeRO-3 runs equal to unsharded ones).
// SmolLM2-135M (its GGUF, dequantized: 4 to 9 MB per layer tensor) shows the pages; the
// reload uses the tiny Llama fixture.
#include <stdint.h>
#include <sys/mman.h>
#include <unistd.h>

#include "core/check.h"
#include "model/weights_io.h"
#include "test.h"

static const char *smollm2_path = "models/SmolLM2-135M-Instruct.Q4_1.gguf";
static const char *tiny_llama_path = "tests/fixtures/models/llama";

// Keeps the layers below keep_below whole and nothing of the others; the global tensors whole.
static int keep_below;
static void keep_lower_layers(const Model *model, const ParamEntry *entry, long *first, long *count) {
    (void)model;
    *first = 0;
    *count = entry->layer < keep_below ? entry->numel : 0;
}

// Keeps the second half of every layer tensor (a shard boundary inside each one).
static void keep_second_halves(const Model *model, const ParamEntry *entry, long *first, long *count) {
    (void)model;
    *first = entry->layer >= 0 ? entry->numel / 2 : 0;
    *count = entry->numel - *first;
}

static bool load(Model *model, const char *path, ModelKeepRange keep_range) {
    ModelLoadOptions options = {.with_lm_head = true, .keep_range = keep_range};
    if (model_load(model, path, &ops_cpu, &options) == 0) return true;
    fprintf(stderr, "  cannot load %s: %s (run scripts/fetch-model)\n", path, err_msg());
    test_current_failures++;
    return false;
}

// Every parameter of `partial` against `whole`: the part keep_range names equal bit for bit,
// the rest zero. Returns the number of floats not kept.
static long expect_kept_parts(const Model *partial, const Model *whole, ModelKeepRange keep_range) {
    long dropped = 0;
    for (int i = 0; i < whole->table.count; i++) {
        const ParamEntry *e = &whole->table.entries[i];
        long first = 0, count = e->numel, wrong = 0;
        keep_range(whole, e, &first, &count);
        for (long k = 0; k < e->numel; k++) {
            const float got = partial->params[e->offset + k];
            const bool kept = k >= first && k < first + count;
            const float want = kept ? whole->params[e->offset + k] : 0.0f;
            wrong += memcmp(&got, &want, sizeof got) != 0;
        }
        dropped += e->numel - count;
        EXPECT(wrong == 0, "%s: %ld of %ld floats differ from the whole load's kept part (kept [%ld, +%ld))", e->name,
               wrong, e->numel, first, count);
    }
    return dropped;
}

static void test_kept_parts_match_the_whole_load(void) {
    Model whole, halves, lower;
    if (!load(&whole, smollm2_path, NULL)) return;
    keep_below = whole.config.num_layers / 2;
    if (load(&halves, smollm2_path, keep_second_halves)) {
        const long dropped = expect_kept_parts(&halves, &whole, keep_second_halves);
        EXPECT(dropped > whole.table.total / 4, "only %ld of %ld floats dropped", dropped, whole.table.total);
        model_free(&halves);
    }
    if (load(&lower, smollm2_path, keep_lower_layers)) {
        const long dropped = expect_kept_parts(&lower, &whole, keep_lower_layers);
        EXPECT(dropped > whole.table.total / 4, "only %ld of %ld floats dropped", dropped, whole.table.total);
        model_free(&lower);
    }
    model_free(&whole);
}

// Pages of model->params that may have been written by a load keeping `keep_range`: those of
// every kept part, widened by 2 MB each way (a transparent huge page faults in whole).
static unsigned char *pages_maybe_written(const Model *model, ModelKeepRange keep_range, long pages, long page) {
    unsigned char *maybe = calloc((size_t)pages, 1);
    const uintptr_t base = (uintptr_t)model->params / (uintptr_t)page * (uintptr_t)page;
    const long margin = (2L << 20) / page;
    for (int i = 0; i < model->table.count; i++) {
        const ParamEntry *e = &model->table.entries[i];
        long first = 0, count = e->numel;
        keep_range(model, e, &first, &count);
        if (count == 0) continue;
        const long lo = (long)(((uintptr_t)(model->params + e->offset + first) - base) / (uintptr_t)page) - margin;
        const long hi = (long)(((uintptr_t)(model->params + e->offset + first + count) - base) / (uintptr_t)page) + margin;
        for (long p = lo < 0 ? 0 : lo; p <= hi && p < pages; p++) maybe[p] = 1;
    }
    return maybe;
}

// The pages of the layers not kept are not resident after the load: it never wrote them. The
// kept layers' pages are (mincore sees what was written: the check can fail).
static void test_pages_not_kept_are_never_touched(void) {
    Model lower;
    ModelConfig cfg;
    if (model_read_config(&cfg, smollm2_path) != 0) {
        EXPECT(false, "%s: %s (run scripts/fetch-model)", smollm2_path, err_msg());
        return;
    }
    keep_below = cfg.num_layers / 2;
    if (!load(&lower, smollm2_path, keep_lower_layers)) return;
    const long page = sysconf(_SC_PAGESIZE);
    const uintptr_t base = (uintptr_t)lower.params / (uintptr_t)page * (uintptr_t)page;
    const long pages = (long)(((uintptr_t)(lower.params + lower.table.total) - base + (uintptr_t)page - 1) / (uintptr_t)page);
    unsigned char *resident = malloc((size_t)pages);
    CHECK(mincore((void *)base, (size_t)pages * (size_t)page, resident) == 0, "mincore failed");
    unsigned char *maybe = pages_maybe_written(&lower, keep_lower_layers, pages, page);
    long untouched_pages = 0, resident_untouched = 0, written_pages = 0, resident_written = 0;
    for (long p = 0; p < pages; p++) {
        if (maybe[p]) {
            written_pages++;
            resident_written += resident[p] & 1;
        } else {
            untouched_pages++;
            resident_untouched += resident[p] & 1;
        }
    }
    EXPECT(untouched_pages > pages / 4, "only %ld of %ld pages lie away from the kept parts", untouched_pages, pages);
    EXPECT(resident_untouched == 0, "%ld of the %ld pages of layers not kept are resident", resident_untouched,
           untouched_pages);
    EXPECT(resident_written > written_pages / 2, "only %ld of the %ld pages of kept parts are resident",
           resident_written, written_pages);
    free(resident), free(maybe), model_free(&lower);
}

// A resumed run's reload keeps the same parts: the kept floats come back from the file, the
// rest stays zero.
static void test_reload_keeps_the_same_parts(void) {
    Model whole, partial;
    if (!load(&whole, tiny_llama_path, NULL)) return;
    if (!load(&partial, tiny_llama_path, keep_second_halves)) {
        model_free(&whole);
        return;
    }
    for (int i = 0; i < partial.table.count; i++) { // what training would have changed
        const ParamEntry *e = &partial.table.entries[i];
        long first = 0, count = e->numel;
        keep_second_halves(&partial, e, &first, &count);
        for (long k = first; k < first + count; k++) partial.params[e->offset + k] = 7.0f;
    }
    EXPECT(model_reload_weights(&partial, tiny_llama_path, keep_second_halves) == 0, "%s", err_msg());
    expect_kept_parts(&partial, &whole, keep_second_halves);
    model_free(&partial), model_free(&whole);
}

// A partial load needs float32 weights on the CPU: quantized as read, it is refused by name.
static void test_quantized_partial_load_is_refused(void) {
    Model model;
    ModelLoadOptions options = {.with_lm_head = true, .quantize = "q8_0", .keep_range = keep_second_halves};
    EXPECT(model_load(&model, tiny_llama_path, &ops_cpu, &options) != 0, "a quantized partial load was accepted");
    EXPECT(strstr(err_msg(), "partial load") && strstr(err_msg(), tiny_llama_path), "error: %s", err_msg());
}

int main(void) {
    RUN(test_kept_parts_match_the_whole_load);
    // The sanitizer build's model buffers come from malloc, not fresh anonymous pages.
    if (TEST_SANITIZED)
        printf("SKIP test_pages_not_kept_are_never_touched: the sanitizer build allocates models with malloc\n");
    else
        RUN(test_pages_not_kept_are_never_touched);
    RUN(test_reload_keeps_the_same_parts);
    RUN(test_quantized_partial_load_is_refused);
    TEST_EXIT();
}
