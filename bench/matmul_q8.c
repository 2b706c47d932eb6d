// The linear layer with Q8_0 weights (ops/cpu/matmul_q8.c) beside the float32 one (sgemm, or
// the matrix-vector loop for up to 4 rows) on SmolLM2-135M's shapes, for 1 to 512 input rows:
// where each is faster, which sets Q8_SGEMM_MIN_ROWS (ops/q8.h; from there on the Q8_0 op
// itself runs sgemm on dequantized tiles). Best of --repeats runs; the weights here fit in
// cache, so the small-row figures understate the Q8_0 gain of a real decode step, where
// they come from memory (bench/run_decode.sh measures that).
//
// usage: OMP_NUM_THREADS=2 build/bench/matmul_q8 [--repeats 10] [--type q8_0|q4_0|nf4|nf4-single]
// --type: the weights' type (default q8_0; "q8_us" is then that type's time).
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/check.h"
#include "core/rng.h"
#include "ops/ops.h"
#include "ops/nf4.h"
#include "ops/q4.h"
#include "ops/q8.h"

static void *zeroed(size_t bytes) { return xcalloc(1, bytes); }

int main(int argc, char **argv) {
    int repeats = 10;
    const char *type = "q8_0";
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--repeats") && i + 1 < argc) repeats = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--type") && i + 1 < argc) type = argv[++i];
        else die_user("unknown argument %s (see the comment at the top of bench/matmul_q8.c)", argv[i]);
    }
    const int shapes[][2] = {{576, 1536}, {1536, 576}, {576, 576}, {576, 49152}}; // IC, OC
    const int rows[] = {1, 4, 16, 32, 63, 64, 128, 256, 512};
    const int max_rows = 512;
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const int IC = shapes[s][0], OC = shapes[s][1];
        float *weight = xmalloc((size_t)IC * OC * sizeof(float)), *inp = xmalloc((size_t)max_rows * IC * sizeof(float));
        float *out = xmalloc((size_t)max_rows * OC * sizeof(float));
        for (long i = 0; i < (long)IC * OC; i++) weight[i] = rng_uniform(1, 0, (uint64_t)i) - 0.5f;
        for (long i = 0; i < (long)max_rows * IC; i++) inp[i] = rng_uniform(2, 0, (uint64_t)i) - 0.5f;
        Q8Matrix matrix = {.rows = OC, .cols = IC, .values = xmalloc((size_t)IC * OC),
                           .scales = xmalloc((size_t)OC * (IC / Q8_BLOCK) * sizeof(float)), .type = QUANT_Q8_0};
        if (!strcmp(type, "q4_0")) matrix.type = QUANT_Q4_0;
        for (int o = 0; o < OC; o++) {
            float *scales = matrix.scales + (long)o * (IC / Q8_BLOCK);
            if (matrix.type == QUANT_Q4_0) q4_quantize_row(weight + (long)o * IC, IC, matrix.nibbles + (long)o * IC / 2, scales);
            else q8_quantize_row(weight + (long)o * IC, IC, matrix.values + (long)o * IC, scales);
        }
        if (!strncmp(type, "nf4", 3)) {
            free(matrix.values), free(matrix.scales);
            nf4_quantize_matrix(&matrix, weight, OC, IC, !strcmp(type, "nf4"), zeroed);
        } else if (strcmp(type, "q8_0") && strcmp(type, "q4_0")) {
            die_user("--type %s: q8_0, q4_0, nf4 or nf4-single", type);
        }
        for (size_t r = 0; r < sizeof rows / sizeof rows[0]; r++) {
            const int N = rows[r];
            double best_f32 = 1e30, best_q8 = 1e30;
            for (int k = 0; k < repeats; k++) {
                double start = omp_get_wtime();
                ops_cpu.matmul_forward(out, inp, weight, NULL, N, IC, OC);
                double middle = omp_get_wtime();
                ops_cpu.matmul_forward_q8(out, inp, &matrix, NULL, N, IC, OC, N);
                double end = omp_get_wtime();
                if (middle - start < best_f32) best_f32 = middle - start;
                if (end - middle < best_q8) best_q8 = end - middle;
            }
            printf("{\"type\": \"%s\", \"in\": %d, \"out\": %d, \"rows\": %d, \"q8_path\": \"%s\", \"f32_us\": %.1f, "
                   "\"q8_us\": %.1f, \"q8_speedup\": %.2f, \"threads\": %d}\n", type,
                   IC, OC, N, N >= Q8_SGEMM_MIN_ROWS ? "dequantized-sgemm" : matrix.type == QUANT_NF4 ? "nf4-float" : "integer",
                   best_f32 * 1e6, best_q8 * 1e6,
                   best_f32 / best_q8, omp_get_max_threads());
            fflush(stdout);
        }
        free(weight), free(inp), free(out), free(matrix.values), free(matrix.scales), free(matrix.scale_codes),
            free(matrix.scale_absmax);
    }
    return 0;
}
