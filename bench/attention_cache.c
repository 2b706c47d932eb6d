// Attention against the KV cache alone, on SmolLM2-135M's shape (9 query heads, 3 KV heads
// of 64, 30 layers), the previous per-head kernel beside the current ones in one run
// (cpu_attention_per_head, ops/cpu/attention_cache.h), taking turns so that load on a
// shared machine falls on both alike:
//  - decode: one step (T = 1) at each --contexts length, batch 1 and 8, for each cache type:
//    per-head against grouped (ops_cpu.attention_decode*), ms per step of all 30 layers.
//    The step runs over `layers` distinct caches (at least 30, and enough for 256 MB, so
//    that the cache comes from memory as in a real step) and is scaled to 30 layers.
//  - extend: the chunks of a --prompt-token prompt prefilled --chunk at a time (the first
//    chunk is a prefill, attention_forward, not timed here): the second and the last
//    chunk's extension, per-head against tiled (ops_cpu.attention_extend*), ms per chunk of
//    30 layers (4 layers timed: the extension is bound by arithmetic, not memory).
// Prints the best and the median of --repeats, and the best CPU time of all threads (on a
// loaded machine, with OMP_NUM_THREADS=1, the time the kernel ran rather than waited), one
// JSON line per (op, type, context or chunk, batch, kernel).
//
// usage: OMP_NUM_THREADS=2 build/bench/attention_cache [--contexts 128,1024,4096] [--batches 1,8]
//            [--prompt 1536] [--chunk 256] [--repeats 7] [--types f32,f16,q8_0] [--only decode|extend]
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/check.h"
#include "core/rng.h"
#include "ops/cpu/attention_cache.h"
#include "ops/ops.h"

enum { HEADS = 9, KV_HEADS = 3, HEAD_DIM = 64, MODEL_LAYERS = 30 };

static long slot_bytes(CacheElementType type) {
    return type == ELEMENTS_F32 ? KV_HEADS * HEAD_DIM * 4L
         : type == ELEMENTS_F16 ? KV_HEADS * HEAD_DIM * 2L
                                : kv_q8_slot_bytes(KV_HEADS, HEAD_DIM);
}

// B rows of `capacity` slots of random keys (or values) written through the cache's own op.
static void *make_cache(CacheElementType type, int B, int capacity, uint64_t seed) {
    const int width = KV_HEADS * HEAD_DIM;
    float *x = xmalloc((size_t)B * capacity * width * sizeof(float));
    for (long i = 0; i < (long)B * capacity * width; i++) x[i] = 2.0f * rng_uniform(seed, 0, (uint64_t)i) - 1.0f;
    void *cache = xmalloc((size_t)B * capacity * slot_bytes(type));
    if (type == ELEMENTS_F32) ops_cpu.cache_write(cache, x, B, capacity, capacity, 0, width);
    else if (type == ELEMENTS_F16) ops_cpu.cache_write_f16(cache, x, B, capacity, capacity, 0, width);
    else ops_cpu.cache_write_q8(cache, x, B, capacity, capacity, 0, KV_HEADS, HEAD_DIM);
    free(x);
    return cache;
}

// T queries per row at slots [first_slot, first_slot + T): the current kernel (the ops
// table's entry) or the per-head one.
static void attend(bool per_head, CacheElementType type, float *out, const float *q, const void *k, const void *v,
                   int B, int T, int capacity, int first_slot) {
    const int H = HEADS, KV = KV_HEADS, D = HEAD_DIM;
    if (per_head) {
        cpu_attention_per_head(out, q, k, v, type, NULL, B, T, capacity, first_slot, H, KV, D, 0.0f, 0);
    } else if (T == 1) {
        if (type == ELEMENTS_F32) ops_cpu.attention_decode(out, q, k, v, NULL, B, capacity, first_slot + 1, H, KV, D, 0.0f, 0);
        if (type == ELEMENTS_F16) ops_cpu.attention_decode_f16(out, q, k, v, NULL, B, capacity, first_slot + 1, H, KV, D, 0.0f, 0);
        if (type == ELEMENTS_Q8) ops_cpu.attention_decode_q8(out, q, k, v, NULL, B, capacity, first_slot + 1, H, KV, D, 0.0f, 0);
    } else {
        if (type == ELEMENTS_F32) ops_cpu.attention_extend(out, q, k, v, NULL, B, T, capacity, first_slot, H, KV, D, 0.0f, 0);
        if (type == ELEMENTS_F16) ops_cpu.attention_extend_f16(out, q, k, v, NULL, B, T, capacity, first_slot, H, KV, D, 0.0f, 0);
        if (type == ELEMENTS_Q8) ops_cpu.attention_extend_q8(out, q, k, v, NULL, B, T, capacity, first_slot, H, KV, D, 0.0f, 0);
    }
}

static double cpu_seconds(void) { // of all the process's threads
    struct timespec now;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &now);
    return (double)now.tv_sec + 1e-9 * (double)now.tv_nsec;
}

static int compare_doubles(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

// Times `layers` layers of T queries per row at first_slot for both kernels, taking turns;
// prints a line for each, scaled to the model's 30 layers.
static void measure(const char *op, const char *type_name, CacheElementType type, int B, int T, int capacity,
                    int first_slot, int layers, int repeats, const char *what, int what_value) {
    void **k = xmalloc((size_t)layers * sizeof(void *)), **v = xmalloc((size_t)layers * sizeof(void *));
    for (int l = 0; l < layers; l++) k[l] = make_cache(type, B, capacity, 2 * l), v[l] = make_cache(type, B, capacity, 2 * l + 1);
    float *q = xmalloc((size_t)B * T * HEADS * HEAD_DIM * sizeof(float));
    float *out = xmalloc((size_t)B * T * HEADS * HEAD_DIM * sizeof(float));
    for (long i = 0; i < (long)B * T * HEADS * HEAD_DIM; i++) q[i] = 4.0f * rng_uniform(99, 0, (uint64_t)i) - 2.0f;
    double *times[2] = {xmalloc((size_t)repeats * sizeof(double)), xmalloc((size_t)repeats * sizeof(double))};
    double *cpu_times[2] = {xmalloc((size_t)repeats * sizeof(double)), xmalloc((size_t)repeats * sizeof(double))};
    for (int l = 0; l < layers; l++) attend(false, type, out, q, k[l], v[l], B, T, capacity, first_slot); // warm up
    for (int r = 0; r < repeats; r++)
        for (int turn = 0; turn < 2; turn++) { // each kernel first on alternate repeats
            const int kernel = (turn + r) % 2;
            const double start = omp_get_wtime(), cpu_start = cpu_seconds();
            for (int l = 0; l < layers; l++) attend(kernel == 0, type, out, q, k[l], v[l], B, T, capacity, first_slot);
            times[kernel][r] = (omp_get_wtime() - start) * 1e3 * MODEL_LAYERS / layers;
            cpu_times[kernel][r] = (cpu_seconds() - cpu_start) * 1e3 * MODEL_LAYERS / layers;
        }
    const char *names[2] = {"per-head", T == 1 ? "grouped" : "tiled"};
    for (int kernel = 0; kernel < 2; kernel++) {
        qsort(times[kernel], (size_t)repeats, sizeof(double), compare_doubles);
        qsort(cpu_times[kernel], (size_t)repeats, sizeof(double), compare_doubles);
        printf("{\"bench\": \"attention_cache\", \"op\": \"%s\", \"kernel\": \"%s\", \"kv_cache\": \"%s\", \"batch\": %d, "
               "\"%s\": %d, \"queries\": %d, \"best_ms\": %.3f, \"median_ms\": %.3f, \"best_cpu_ms\": %.3f, \"layers\": %d, \"layers_timed\": %d, "
               "\"repeats\": %d, \"threads\": %d}\n",
               op, names[kernel], type_name, B, what, what_value, T, times[kernel][0], times[kernel][repeats / 2], cpu_times[kernel][0],
               MODEL_LAYERS, layers, repeats, omp_get_max_threads());
    }
    fflush(stdout);
    for (int l = 0; l < layers; l++) free(k[l]), free(v[l]);
    free(k), free(v), free(q), free(out), free(times[0]), free(times[1]), free(cpu_times[0]), free(cpu_times[1]);
}

int main(int argc, char **argv) {
    char contexts[128] = "128,1024,4096", batches[64] = "1,8", types[64] = "f32,f16,q8_0";
    int prompt = 1536, chunk = 256, repeats = 7;
    const char *only = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--contexts") && i + 1 < argc) snprintf(contexts, sizeof contexts, "%s", argv[++i]);
        else if (!strcmp(argv[i], "--batches") && i + 1 < argc) snprintf(batches, sizeof batches, "%s", argv[++i]);
        else if (!strcmp(argv[i], "--types") && i + 1 < argc) snprintf(types, sizeof types, "%s", argv[++i]);
        else if (!strcmp(argv[i], "--prompt") && i + 1 < argc) prompt = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--chunk") && i + 1 < argc) chunk = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--repeats") && i + 1 < argc) repeats = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--only") && i + 1 < argc) only = argv[++i];
        else die_user("unknown argument %s (see the comment at the top of bench/attention_cache.c)", argv[i]);
    }
    setenv("MARLHF_CPU_ATTENTION", "grouped", 1); // the grouped decode step for every cache type
    if (repeats < 1 || chunk < 2 || prompt < 2 * chunk)
        die_user("--repeats must be positive, --chunk at least 2 and --prompt at least two chunks");
    for (char *save_t = NULL, *type_name = strtok_r(types, ",", &save_t); type_name;
         type_name = strtok_r(NULL, ",", &save_t)) {
        const CacheElementType type = !strcmp(type_name, "f32")   ? ELEMENTS_F32
                                      : !strcmp(type_name, "f16") ? ELEMENTS_F16
                                      : !strcmp(type_name, "q8_0") ? ELEMENTS_Q8
                                                                   : (die_user("--types: unknown type %s", type_name), ELEMENTS_F32);
        if (!only || !strcmp(only, "decode")) {
            char batch_list[64];
            snprintf(batch_list, sizeof batch_list, "%s", batches);
            for (char *save_b = NULL, *item_b = strtok_r(batch_list, ",", &save_b); item_b;
                 item_b = strtok_r(NULL, ",", &save_b)) {
                char context_list[128];
                snprintf(context_list, sizeof context_list, "%s", contexts);
                for (char *save_c = NULL, *item_c = strtok_r(context_list, ",", &save_c); item_c;
                     item_c = strtok_r(NULL, ",", &save_c)) {
                    const int B = atoi(item_b), context = atoi(item_c);
                    if (B < 1 || context < 1) die_user("--batches and --contexts take positive numbers");
                    const long layer_bytes = 2L * B * context * slot_bytes(type);
                    int layers = (int)((256L << 20) / layer_bytes);
                    layers = layers < MODEL_LAYERS ? MODEL_LAYERS : layers > 256 ? 256 : layers;
                    measure("decode", type_name, type, B, 1, context, context - 1, layers, repeats, "context", context);
                }
            }
        }
        if (!only || !strcmp(only, "extend")) {
            const int last_chunk = (prompt - 1) / chunk * chunk; // the last chunk's first slot
            measure("extend", type_name, type, 1, chunk, last_chunk + chunk, chunk, 4, repeats, "first_slot", chunk);
            measure("extend", type_name, type, 1, chunk, last_chunk + chunk, last_chunk, 4, repeats, "first_slot",
                    last_chunk);
        }
    }
    return 0;
}
