// The bf16 decode kernel (ops/cpu/matmul_bf16.c, --quantize bf16) beside the float32 product
// of the float model (ops_cpu.matmul_forward: OpenBLAS) on SmolLM2-135M's shapes, at 1, 4, 8
// and 32 input rows, weights read from memory: enough copies of each matrix, used in turn,
// that they do not stay in the 32 MB L3. One JSON line per (shape, rows): the best call of
// --repeats rounds, microseconds, and the GB/s of weight bytes read.
//
// usage: build/bench/matmul_bf16 [--repeats 10]
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/check.h"
#include "core/rng.h"
#include "core/bf16.h"
#include "ops/cpu/matmul_bf16.h"
#include "ops/cpu/ops_cpu.h"

#define MEMORY_BYTES (96L << 20) // each kind's weight bytes: 3x the L3

// --repeats' value: the whole text a whole number from 1 (atoi would read "abc" as 0 rounds,
// and the lines would print no time at all).
static int parse_repeats(const char *text) {
    char *end;
    const long value = strtol(text, &end, 10);
    if (end == text || *end || value < 1 || value > 1000000)
        die_user("option --repeats: expected a whole number from 1, got '%s'", text);
    return (int)value;
}

int main(int argc, char **argv) {
    int repeats = 10;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--repeats")) {
            if (i + 1 >= argc) die_user("option --repeats needs a value");
            repeats = parse_repeats(argv[++i]);
        } else die_user("unknown argument %s (see the comment at the top of bench/matmul_bf16.c)", argv[i]);
    }
    const struct {
        const char *name;
        int IC, OC;
    } shapes[] = {{"q_proj", 576, 576}, {"up_proj", 576, 1536}, {"down_proj", 1536, 576}, {"lm_head", 576, 49152}};
    const int row_counts[] = {1, 4, 8, 32};
    float *inp = xmalloc(32 * 1536 * sizeof(float)), *out = xmalloc((size_t)32 * 49152 * sizeof(float));
    for (int i = 0; i < 32 * 1536; i++) inp[i] = rng_uniform(5, 0, (uint64_t)i) - 0.5f;
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const int IC = shapes[s].IC, OC = shapes[s].OC;
        const long n = (long)IC * OC;
        float *weights = xmalloc((size_t)n * sizeof(float));
        for (long i = 0; i < n; i++) weights[i] = 0.1f * (rng_uniform(6, 0, (uint64_t)i) - 0.5f);
        const int bf16_copies = (int)(MEMORY_BYTES / (n * 2)) + 1, float_copies = (int)(MEMORY_BYTES / (n * 4)) + 1;
        Q8Matrix *bf16 = xmalloc((size_t)bf16_copies * sizeof(Q8Matrix));
        float **floats = xmalloc((size_t)float_copies * sizeof(float *));
        for (int c = 0; c < bf16_copies; c++) {
            bf16[c] = (Q8Matrix){.rows = OC, .cols = IC, .type = QUANT_BF16};
            bf16[c].bf16 = xmalloc((size_t)n * sizeof(uint16_t));
            bf16_round_row(weights, n, bf16[c].bf16);
        }
        for (int c = 0; c < float_copies; c++) floats[c] = memcpy(xmalloc((size_t)n * sizeof(float)), weights, (size_t)n * 4);
        for (size_t k = 0; k < sizeof row_counts / sizeof row_counts[0]; k++) {
            const int N = row_counts[k];
            double best_bf16 = 1e30, best_float = 1e30;
            // The two take turns within each repeat (a busy moment of a shared machine falls on both).
            for (int r = 0; r < repeats; r++) {
                for (int c = 0; c < bf16_copies; c++) {
                    const double start = omp_get_wtime();
                    cpu_matmul_bf16(out, inp, &bf16[c], NULL, N, IC, OC);
                    const double seconds = omp_get_wtime() - start;
                    best_bf16 = seconds < best_bf16 ? seconds : best_bf16;
                }
                for (int c = 0; c < float_copies; c++) {
                    const double start = omp_get_wtime();
                    ops_cpu.matmul_forward(out, inp, floats[c], NULL, N, IC, OC);
                    const double seconds = omp_get_wtime() - start;
                    best_float = seconds < best_float ? seconds : best_float;
                }
            }
            printf("{\"bench\": \"matmul_bf16\", \"shape\": \"%s\", \"in\": %d, \"out\": %d, \"rows\": %d, "
                   "\"bf16_us\": %.1f, \"bf16_weight_gb_per_s\": %.1f, \"float32_us\": %.1f, "
                   "\"float32_weight_gb_per_s\": %.1f, \"path\": \"%s\", \"threads\": %d}\n",
                   shapes[s].name, IC, OC, N, best_bf16 * 1e6, n * 2 / best_bf16 * 1e-9, best_float * 1e6,
                   n * 4 / best_float * 1e-9, bf16_best_path_name, omp_get_max_threads());
            fflush(stdout);
        }
        for (int c = 0; c < bf16_copies; c++) free(bf16[c].bf16);
        for (int c = 0; c < float_copies; c++) free(floats[c]);
        free(bf16), free(floats), free(weights);
    }
    free(inp), free(out);
    return 0;
}
