// The cost of a row-invariant CPU forward (docs/lora.md, "One policy"), each kernel against
// its peer in the same process, calls alternated so both see the same machine load:
//   - linear layers: the default path (OpenBLAS sgemm; for N <= 4 rows its own dot-product
//     loop, ops/cpu/matmul.c; MARLHF_CPU_MATMUL must be unset) against the fixed-order kernel of
//     MARLHF_CPU_MATMUL=batch-invariant (ops/cpu/matmul_invariant.c), on SmolLM2-135M's
//     shapes (q/o 576x576, k/v 192x576, gate/up 1536x576, down 576x1536, the LM head
//     49152x576) at N rows;
//   - attention forward: the fixed-order kernel (ops/cpu/attention.c) against the
//     previous one, kept here as the baseline: one sgemm on each (row, head)'s whole T x T
//     score matrix, a masked softmax, one sgemm for the output.
// Prints one JSON line per case with the best (minimum) milliseconds of each over --reps.
//
// --portable adds the fixed-order kernel's portable loop (what a CPU without AVX-512 runs),
// timed once per shape after the others.
//
// usage: build/bench/row_invariance [--rows 1024] [--batch 4] [--seq 256] [--reps 7] [--portable]
#include <cblas.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/check.h"
#include "core/timer.h"
#include "ops/cpu/ops_cpu.h"

static float *random_floats(long n) {
    float *x = xaligned_alloc((size_t)n * sizeof(float));
    for (long i = 0; i < n; i++) x[i] = 0.01f * (float)((i * 7919) % 201 - 100);
    return x;
}

// The previous attention forward: each (row, head)'s full T x T scores through sgemm.
static void attention_sgemm_baseline(float *out, float *probs, const float *q, const float *k, const float *v,
                                     const int *row_start, int B, int T, int n_heads, int n_kv_heads, int head_dim) {
    const int q_stride = n_heads * head_dim, kv_stride = n_kv_heads * head_dim, group = n_heads / n_kv_heads;
    const float scale = 1.0f / sqrtf((float)head_dim);
#pragma omp parallel for schedule(static)
    for (int bh = 0; bh < B * n_heads; bh++) {
        int b = bh / n_heads, h = bh % n_heads, start = row_start[b];
        const float *Q = q + (long)b * T * q_stride + h * head_dim;
        const float *K = k + (long)b * T * kv_stride + (h / group) * head_dim;
        const float *V = v + (long)b * T * kv_stride + (h / group) * head_dim;
        float *P = probs + (long)bh * T * T;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, head_dim, scale, Q, q_stride, K, kv_stride, 0.0f,
                    P, T);
        for (int t = 0; t < T; t++) {
            float *p = P + (long)t * T, max_score = -INFINITY;
            double sum = 0;
            for (int j = start; j <= t; j++) max_score = fmaxf(max_score, p[j]);
            for (int j = start; j <= t; j++) sum += p[j] = expf(p[j] - max_score);
            for (int j = 0; j < T; j++) p[j] = j >= start && j <= t ? p[j] * (float)(1.0 / sum) : 0.0f;
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, head_dim, T, 1.0f, P, T, V, kv_stride, 0.0f,
                    out + (long)b * T * q_stride + h * head_dim, q_stride);
    }
}

int main(int argc, char **argv) {
    int rows = 1024, B = 4, T = 256, reps = 7;
    bool portable = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--rows") && i + 1 < argc) rows = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--batch") && i + 1 < argc) B = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--seq") && i + 1 < argc) T = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--portable")) portable = true;
        else die_user("usage: row_invariance [--rows N] [--batch B] [--seq T] [--reps R] [--portable]");
    }
    if (cpu_matmul_batch_invariant()) die_user("row_invariance: unset MARLHF_CPU_MATMUL (the peer is the default path)");
    const struct { const char *name; int in, out; } linear[] = {
        {"q/o", 576, 576}, {"k/v", 576, 192}, {"gate/up", 576, 1536}, {"down", 1536, 576}, {"lm_head", 576, 49152}};
    float *inp = random_floats((long)rows * 1536), *w = random_floats(49152L * 576);
    float *out = random_floats((long)rows * 49152);
    for (size_t s = 0; s < sizeof linear / sizeof linear[0]; s++) {
        const int IC = linear[s].in, OC = linear[s].out;
        double best_sgemm = INFINITY, best_fixed = INFINITY;
        for (int r = 0; r <= reps; r++) { // the first round warms up and is not counted
            double t0 = now_seconds();
            ops_cpu.matmul_forward(out, inp, w, NULL, rows, IC, OC);
            double t1 = now_seconds();
            cpu_matmul_fixed_order(out, OC, inp, w, rows, IC, OC, false);
            double t2 = now_seconds();
            if (r > 0) best_sgemm = fmin(best_sgemm, t1 - t0), best_fixed = fmin(best_fixed, t2 - t1);
        }
        printf("{\"op\": \"matmul %s forward\", \"rows\": %d, \"in\": %d, \"out\": %d, \"default_ms\": %.3f, "
               "\"fixed_order_ms\": %.3f, \"ratio\": %.2f",
               linear[s].name, rows, IC, OC, best_sgemm * 1e3, best_fixed * 1e3, best_fixed / best_sgemm);
        if (portable) {
            double t0 = now_seconds();
            cpu_matmul_fixed_order_portable(out, OC, inp, w, rows, IC, OC, false);
            printf(", \"portable_ms\": %.3f", (now_seconds() - t0) * 1e3);
        }
        printf("}\n");
    }
    free(inp), free(w), free(out);

    const int H = 9, KV = 3, D = 64; // SmolLM2-135M
    float *q = random_floats((long)B * T * H * D), *k = random_floats((long)B * T * KV * D);
    float *v = random_floats((long)B * T * KV * D), *att = random_floats((long)B * T * H * D);
    float *probs = random_floats((long)B * H * T * T);
    int *row_start = xcalloc(B, sizeof(int));
    for (int b = 0; b < B; b++) row_start[b] = (b * T) / (4 * B); // some left padding
    double best_old = INFINITY, best_new = INFINITY;
    for (int r = 0; r <= reps; r++) {
        double t0 = now_seconds();
        attention_sgemm_baseline(att, probs, q, k, v, row_start, B, T, H, KV, D);
        double t1 = now_seconds();
        cpu_attention_forward(att, probs, q, k, v, row_start, B, T, H, KV, D, 0.0f, 0);
        double t2 = now_seconds();
        if (r > 0) best_old = fmin(best_old, t1 - t0), best_new = fmin(best_new, t2 - t1);
    }
    printf("{\"op\": \"attention forward\", \"batch\": %d, \"seq\": %d, \"previous_sgemm_ms\": %.3f, "
           "\"fixed_order_ms\": %.3f, \"ratio\": %.2f}\n",
           B, T, best_old * 1e3, best_new * 1e3, best_new / best_old);
    free(q), free(k), free(v), free(att), free(probs), free(row_start);
    return 0;
}
