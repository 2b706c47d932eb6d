// The decode kernels of a Q4_K_M file's types (Q5_0, Q8_0, Q4_K, Q6_K), of Q5_K and Q5_1 (a
// Q5_K_M file's), of Q4_1 (the README's SmolLM2 file's) and of Q3_K and Q2_K (Q3_K_S/M/L and
// Q2_K files') on SmolLM2-135M's
// MLP shapes at one input row, the way a decode step runs them: weights read from memory
// (enough copies of the matrix, used in turn, that they do not stay in the 32 MB L3) and,
// apart, from cache (the same matrix again and again: the kernel's arithmetic alone, each
// vector path and the portable loop by name). ns a weight and the GB/s of weight bytes read;
// best of --repeats. docs/quantization.md ("Decode steps") has figures.
//
// --batched: instead, each type's matmul at N = 1, 2, 4, 8, 16, 32 and 63 input rows (batched
// decoding, below Q8_SGEMM_MIN_ROWS) on SmolLM2-135M's shapes (as above) and a ~1B Llama's
// (Llama-3.2-1B's up projection, [8192, 2048], for every type), weights from memory, one
// JSON line per (shape, type, N) with the time a call and per input row, the best single
// call of --repeats rounds over every copy ("Batched decode steps" in docs/quantization.md).
//
// usage: OMP_NUM_THREADS=1 build/bench/quant_kernels [--repeats 20] [--batched]
#include <omp.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/check.h"
#include "core/rng.h"
#include "ops/cpu/matmul_kquant.h"
#include "ops/cpu/matmul_q5.h"
#include "ops/cpu/ops_cpu.h"
#include "ops/kquant.h"
#include "ops/q4.h"
#include "ops/q8.h"

#define MEMORY_BYTES (96L << 20) // each type's weight bytes when read from memory: 3x the L3

static void *zeroed(size_t bytes) { return xcalloc(1, bytes); }

// A [rows, cols] matrix of `type` with random codes (any byte is valid Q5_0 / Q8_0 / Q4_1 /
// Q5_1 / Q3_K / Q2_K data, given finite factors; the other K-quants come from random floats
// through the GGUF writer's code).
static Q8Matrix random_matrix(QuantType type, int rows, int cols, uint64_t seed) {
    Q8Matrix m = {.rows = rows, .cols = cols, .type = type};
    const long n = (long)rows * cols, blocks = n / Q8_BLOCK;
    if (type == QUANT_Q3_K || type == QUANT_Q2_K) { // marlhf writes neither
        const long bytes = rows * kquant_row_bytes(type, cols), block_bytes = kquant_block_bytes(type);
        m.blocks = xmalloc((size_t)bytes);
        for (long i = 0; i < bytes; i++) m.blocks[i] = (uint8_t)(rng_uniform(seed, 4, (uint64_t)i) * 256);
        const uint16_t d = 0x1800; // 2^-9
        for (long b = 0; b < n / KQ_BLOCK; b++) // d (Q3_K's at 108; Q2_K's d and dmin at 80, 82)
            for (int k = 0; k < (type == QUANT_Q3_K ? 1 : 2); k++)
                memcpy(m.blocks + b * block_bytes + (type == QUANT_Q3_K ? 108 : 80 + 2 * k), &d, 2);
        return m;
    }
    if (quant_is_kquant(type)) {
        float *w = xmalloc((size_t)n * sizeof(float));
        for (long i = 0; i < n; i++) w[i] = rng_uniform(seed, 0, (uint64_t)i) - 0.5f;
        kquant_quantize_matrix(&m, type, w, rows, cols, zeroed);
        free(w);
        return m;
    }
    m.scales = xmalloc((size_t)blocks * sizeof(float));
    for (long b = 0; b < blocks; b++) m.scales[b] = 0.001f * (1.0f + rng_uniform(seed, 1, (uint64_t)b));
    const long code_bytes = type == QUANT_Q8_0 ? n : n / 2;
    m.nibbles = xmalloc((size_t)code_bytes);
    for (long i = 0; i < code_bytes; i++) m.nibbles[i] = (uint8_t)(rng_uniform(seed, 2, (uint64_t)i) * 256);
    if (type == QUANT_Q4_1 || type == QUANT_Q5_1) {
        m.mins = xmalloc((size_t)blocks * sizeof(float));
        for (long b = 0; b < blocks; b++) m.mins[b] = -0.008f * (1.0f + rng_uniform(seed, 4, (uint64_t)b));
    }
    if (type == QUANT_Q5_0 || type == QUANT_Q5_1) {
        m.high_bits = xmalloc((size_t)blocks * sizeof(uint32_t));
        for (long b = 0; b < blocks; b++) m.high_bits[b] = (uint32_t)(rng_uniform(seed, 3, (uint64_t)b) * 4294967295.0);
    }
    return m;
}

static void free_matrix(Q8Matrix *m) { free(m->nibbles), free(m->scales), free(m->high_bits), free(m->mins); }

// The types of blocks of 32 with the Q5_0 kernel (ops/cpu/matmul_q5.c).
static bool q5_kernel(QuantType type) { return type == QUANT_Q5_0 || type == QUANT_Q5_1 || type == QUANT_Q4_1; }

static const char *type_name(QuantType type) {
    return type == QUANT_Q5_0   ? "q5_0"
           : type == QUANT_Q5_1 ? "q5_1"
           : type == QUANT_Q4_1 ? "q4_1"
           : type == QUANT_Q8_0 ? "q8_0"
           : type == QUANT_Q4_K ? "q4_k"
           : type == QUANT_Q5_K ? "q5_k"
           : type == QUANT_Q3_K ? "q3_k"
           : type == QUANT_Q2_K ? "q2_k"
                                : "q6_k";
}

static void report(const char *type, const char *path, const char *from, int IC, int OC, double seconds, long bytes) {
    printf("{\"type\": \"%s\", \"path\": \"%s\", \"weights_from\": \"%s\", \"in\": %d, \"out\": %d, \"rows\": 1, "
           "\"ns_per_weight\": %.4f, \"weight_gb_per_s\": %.2f, \"threads\": %d}\n",
           type, path, from, IC, OC, seconds * 1e9 / ((double)IC * OC), (double)bytes / seconds * 1e-9,
           omp_get_max_threads());
    fflush(stdout);
}

// One type's matrices: `copies` of [OC, IC] (SmolLM2's gate / up projection for the blocks
// of 32, its down projection for the K-quants), `bytes` each.
typedef struct {
    QuantType type;
    int IC, OC, copies;
    long bytes;
    Q8Matrix *matrices;
} Case;

static double seconds_per_call(const Case *c, const float *inp, float *out, int from_memory) {
    const int calls = from_memory ? c->copies : 50;
    const double start = omp_get_wtime();
    for (int i = 0; i < calls; i++)
        ops_cpu.matmul_forward_q8(out, inp, &c->matrices[from_memory ? i : 0], NULL, 1, c->IC, c->OC, 1);
    return (omp_get_wtime() - start) / calls;
}

// Each path's row dots alone over the first matrix (from cache), one thread.
static void time_paths(const Case *c, const float *inp, float *out, int repeats) {
    const int IC = c->IC, OC = c->OC;
    const QuantType type = c->type;
    int8_t *values = xmalloc((size_t)IC);
    float *x_scales = xmalloc((size_t)IC / Q8_BLOCK * sizeof(float));
    int32_t *x_sums = xmalloc((size_t)IC / Q8_BLOCK * sizeof(int32_t));
    float *x_min_terms = xmalloc((size_t)IC / Q8_BLOCK * sizeof(float));
    int16_t *k_sums = xmalloc((size_t)IC / 16 * sizeof(int16_t));
    q8_quantize_row(inp, IC, values, x_scales);
    for (int b = 0; b < IC / Q8_BLOCK; b++) {
        x_sums[b] = 0;
        for (int j = 0; j < Q8_BLOCK; j++) x_sums[b] += values[b * Q8_BLOCK + j];
    }
    q5_input_q8_1(x_scales, x_sums, IC / Q8_BLOCK, x_min_terms);
    const Q5Input q5_input = {values, x_scales, x_sums, x_min_terms};
    KQuantInput k_input = {values, x_scales, k_sums};
    if (quant_is_kquant(type)) kquant_quantize_input(inp, IC, &k_input);
    const struct {
        const char *name;
        Q5RowsDot q5;
        KQuantRowsDot kq;
    } paths[] = {{"portable", q5_rows_dot_portable, kquant_rows_dot_portable},
                 {"avx2", q5_rows_dot_avx2, kquant_rows_dot_avx2},
                 {"avx512", q5_rows_dot_avx512, kquant_rows_dot_avx512}};
    const Q8Matrix *m = &c->matrices[0];
    const long row_bytes = quant_is_kquant(type) ? kquant_row_bytes(type, IC) : 0;
    for (size_t p = 0; p < sizeof paths / sizeof paths[0]; p++) {
        if (q5_kernel(type) ? !paths[p].q5 : !paths[p].kq) continue;
        double best = 1e30;
        for (int r = 0; r < repeats; r++) {
            const double start = omp_get_wtime();
            for (int i = 0; i < 10; i++)
                if (q5_kernel(type))
                    for (int o = 0; o < OC; o += Q5_ROWS) paths[p].q5(m, o, Q5_ROWS, &q5_input, 1, out + o, OC);
                else
                    for (int o = 0; o < OC; o++) paths[p].kq(type, m->blocks + o * row_bytes, &k_input, 1, IC, out + o);
            const double seconds = (omp_get_wtime() - start) / 10;
            best = seconds < best ? seconds : best;
        }
        report(type_name(type), paths[p].name, "cache", IC, OC, best, c->bytes);
    }
    free(values), free(x_scales), free(x_sums), free(x_min_terms), free(k_sums);
}

// A copy of `m`'s bytes (another matrix in memory with the same contents: what a batched
// call reads from memory does not depend on the codes).
static Q8Matrix copy_matrix(const Q8Matrix *m) {
    Q8Matrix copy = *m;
    const long n = (long)m->rows * m->cols, blocks = n / Q8_BLOCK;
    if (quant_is_kquant(m->type)) {
        const size_t bytes = (size_t)kquant_row_bytes(m->type, m->cols) * m->rows;
        copy.blocks = memcpy(xmalloc(bytes), m->blocks, bytes);
        return copy;
    }
    const size_t code_bytes = (size_t)(m->type == QUANT_Q8_0 ? n : n / 2);
    copy.nibbles = memcpy(xmalloc(code_bytes), m->nibbles, code_bytes);
    copy.scales = memcpy(xmalloc((size_t)blocks * sizeof(float)), m->scales, (size_t)blocks * sizeof(float));
    if (m->mins) copy.mins = memcpy(xmalloc((size_t)blocks * sizeof(float)), m->mins, (size_t)blocks * sizeof(float));
    if (m->high_bits)
        copy.high_bits = memcpy(xmalloc((size_t)blocks * sizeof(uint32_t)), m->high_bits, (size_t)blocks * sizeof(uint32_t));
    return copy;
}

// The --batched sweep: per shape, the seven types take turns within each repeat (as in main),
// N rows a call, weights from memory (matrices used in turn, 3x the L3 of each type).
static void batched_sweep(int repeats) {
    const struct {
        const char *name;
        int IC_blocks32, OC_blocks32, IC_kquant, OC_kquant; // Q5_0 / Q8_0 shape, K-quant shape
    } shapes[] = {{"smollm2-135m", 576, 1536, 1536, 576}, {"llama-1b", 2048, 8192, 2048, 8192}};
    const QuantType types[] = {QUANT_Q5_0, QUANT_Q8_0, QUANT_Q4_K, QUANT_Q5_K, QUANT_Q6_K,
                               QUANT_Q4_1, QUANT_Q5_1, QUANT_Q3_K, QUANT_Q2_K};
    const int row_counts[] = {1, 2, 4, 8, 16, 32, 63};
    enum { TYPES = sizeof types / sizeof types[0], COUNTS = sizeof row_counts / sizeof row_counts[0] };
    const int max_rows = 63;
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        Case cases[TYPES];
        int max_ic = 0;
        for (int t = 0; t < TYPES; t++) {
            Case *c = &cases[t];
            c->type = types[t];
            c->IC = quant_is_kquant(c->type) ? shapes[s].IC_kquant : shapes[s].IC_blocks32;
            c->OC = quant_is_kquant(c->type) ? shapes[s].OC_kquant : shapes[s].OC_blocks32;
            max_ic = c->IC > max_ic ? c->IC : max_ic;
            const Q8Matrix first = random_matrix(c->type, c->OC, c->IC, 10);
            c->bytes = quant_matrix_bytes(&first);
            c->copies = (int)(MEMORY_BYTES / c->bytes) + 1;
            c->matrices = xmalloc((size_t)c->copies * sizeof(Q8Matrix));
            c->matrices[0] = first;
            for (int i = 1; i < c->copies; i++) c->matrices[i] = copy_matrix(&first);
        }
        float *inp = xmalloc((size_t)max_rows * max_ic * sizeof(float));
        float *out = xmalloc((size_t)max_rows * 8192 * sizeof(float));
        for (long i = 0; i < (long)max_rows * max_ic; i++) inp[i] = rng_uniform(5, 0, (uint64_t)i) - 0.5f;
        for (int n = 0; n < COUNTS; n++) {
            const int N = row_counts[n];
            double best[TYPES];
            for (int t = 0; t < TYPES; t++) best[t] = 1e30;
            // Each call timed alone, the best kept: on a shared machine a call that another
            // process interrupted does not count (each copy is still read from memory).
            for (int r = 0; r < repeats; r++)
                for (int t = 0; t < TYPES; t++) {
                    const Case *c = &cases[t];
                    for (int i = 0; i < c->copies; i++) {
                        const double start = omp_get_wtime();
                        ops_cpu.matmul_forward_q8(out, inp, &c->matrices[i], NULL, N, c->IC, c->OC, N);
                        const double seconds = omp_get_wtime() - start;
                        best[t] = seconds < best[t] ? seconds : best[t];
                    }
                }
            for (int t = 0; t < TYPES; t++) {
                const Case *c = &cases[t];
                printf("{\"bench\": \"batched\", \"shape\": \"%s\", \"type\": \"%s\", \"path\": \"%s\", \"in\": %d, "
                       "\"out\": %d, \"rows\": %d, \"us_per_call\": %.1f, \"us_per_row\": %.2f, "
                       "\"ns_per_weight_row\": %.4f, \"threads\": %d}\n",
                       shapes[s].name, type_name(c->type),
                       c->type == QUANT_Q8_0 ? "q8_0-integer" : q5_kernel(c->type) ? q5_best_path_name : kquant_best_path_name,
                       c->IC, c->OC, N, best[t] * 1e6, best[t] * 1e6 / N, best[t] * 1e9 / ((double)N * c->IC * c->OC),
                       omp_get_max_threads());
            }
            fflush(stdout);
        }
        for (int t = 0; t < TYPES; t++) {
            for (int i = 0; i < cases[t].copies; i++) free_matrix(&cases[t].matrices[i]);
            free(cases[t].matrices);
        }
        free(inp), free(out);
    }
}

int main(int argc, char **argv) {
    int repeats = 20;
    bool batched = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--repeats") && i + 1 < argc) repeats = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--batched")) batched = true;
        else die_user("unknown argument %s (see the comment at the top of bench/quant_kernels.c)", argv[i]);
    }
    if (batched) {
        batched_sweep(repeats);
        return 0;
    }
    const QuantType types[] = {QUANT_Q5_0, QUANT_Q8_0, QUANT_Q4_K, QUANT_Q5_K, QUANT_Q6_K,
                               QUANT_Q4_1, QUANT_Q5_1, QUANT_Q3_K, QUANT_Q2_K};
    enum { TYPES = sizeof types / sizeof types[0] };
    Case cases[TYPES];
    for (int t = 0; t < TYPES; t++) {
        Case *c = &cases[t];
        c->type = types[t];
        c->IC = quant_is_kquant(c->type) ? 1536 : 576, c->OC = quant_is_kquant(c->type) ? 576 : 1536;
        const Q8Matrix first = random_matrix(c->type, c->OC, c->IC, 10);
        c->bytes = quant_matrix_bytes(&first);
        c->copies = (int)(MEMORY_BYTES / c->bytes) + 1;
        c->matrices = xmalloc((size_t)c->copies * sizeof(Q8Matrix));
        c->matrices[0] = first;
        for (int i = 1; i < c->copies; i++) c->matrices[i] = random_matrix(c->type, c->OC, c->IC, 10 + (uint64_t)i % 4);
    }
    float *inp = xmalloc(1536 * sizeof(float)), *out = xmalloc(1536 * sizeof(float));
    for (int i = 0; i < 1536; i++) inp[i] = rng_uniform(5, 0, (uint64_t)i) - 0.5f;
    // The types take turns within each repeat, so that a busy moment of a shared machine
    // does not fall on one type's runs only; the best of each is reported.
    for (int from_memory = 1; from_memory >= 0; from_memory--) {
        double best[TYPES];
        for (int t = 0; t < TYPES; t++) best[t] = 1e30;
        for (int r = 0; r < repeats; r++)
            for (int t = 0; t < TYPES; t++) {
                const double seconds = seconds_per_call(&cases[t], inp, out, from_memory);
                best[t] = seconds < best[t] ? seconds : best[t];
            }
        for (int t = 0; t < TYPES; t++)
            report(type_name(types[t]), "matmul", from_memory ? "memory" : "cache", cases[t].IC, cases[t].OC, best[t],
                   cases[t].bytes);
    }
    for (int t = 0; t < TYPES; t++)
        if (types[t] != QUANT_Q8_0) time_paths(&cases[t], inp, out, repeats);
    for (int t = 0; t < TYPES; t++) {
        for (int i = 0; i < cases[t].copies; i++) free_matrix(&cases[t].matrices[i]);
        free(cases[t].matrices);
    }
    free(inp), free(out);
    return 0;
}
