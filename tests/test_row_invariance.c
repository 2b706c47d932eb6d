// A row's bits do not depend on the batch around it (docs/lora.md, "One policy"):
//   - the batch-invariant matmul (ops/cpu/matmul_invariant.c): its vector kernel against its
//     portable loop bit for bit, both within float rounding of a double product; the same 40
//     rows in batches of M = 1..40 at shuffled positions, on 1 and 2 threads, give each row
//     the bits it gets alone (forward and accumulate);
//   - the causal attention forward (ops/cpu/attention.c): a sequence alone, left-padded and
//     right-padded to other lengths, among other rows, on 1 and 2 threads, gives the same
//     bits, and within 2e-6 of a double reference;
//   - a whole model (the tiny Llama fixture, GQA): each sequence's log-probs alone and in
//     ragged batches, left- and right-padded, on 1 and 2 threads, the same bits.
// MARLHF_CPU_MATMUL=batch-invariant is set before the first matmul. The sgemm path is
// probed too and its count of rows that change printed: with OPENBLAS_CORETYPE=Haswell
// (the kernels this project's machine runs) it is not zero, which is what this test guards.
#include <cblas.h>
#include <omp.h>
#include <stdint.h>

#include "core/check.h"
#include "model/model.h"
#include "model/weights_io.h"
#include "ops/cpu/ops_cpu.h"
#include "test.h"

static uint64_t rng_state = 88172645463325252ULL;
static uint64_t next_random(void) {
    rng_state ^= rng_state << 13, rng_state ^= rng_state >> 7, rng_state ^= rng_state << 17;
    return rng_state;
}
static float uniform(float lo, float hi) { return lo + (hi - lo) * (float)((next_random() >> 40) / 16777216.0); }
static float *random_floats(long n) {
    float *x = xmalloc((size_t)n * sizeof(float));
    for (long i = 0; i < n; i++) x[i] = uniform(-1.0f, 1.0f);
    return x;
}
// A random permutation of 0..n-1 (Fisher-Yates).
static void shuffle(int *order, int n) {
    for (int i = 0; i < n; i++) order[i] = i;
    for (int i = n - 1; i > 0; i--) {
        int j = (int)(next_random() % (uint64_t)(i + 1)), swap = order[i];
        order[i] = order[j], order[j] = swap;
    }
}

// The vector kernel and the portable loop are the same sequence of operations, and both are
// a dot product: within 1e-5 relative of the double product.
static void test_kernel_equals_portable(void) {
    const int shapes[][3] = {{1, 576, 1}, {3, 17, 5}, {5, 1, 3}, {7, 33, 37}, {40, 576, 72}, {9, 1536, 13}, {64, 64, 70}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const int N = shapes[s][0], IC = shapes[s][1], OC = shapes[s][2];
        float *inp = random_floats((long)N * IC), *w = random_floats((long)OC * IC);
        float *kernel = random_floats((long)N * OC), *portable = xmalloc((size_t)N * OC * sizeof(float));
        memcpy(portable, kernel, (size_t)N * OC * sizeof(float));
        for (int accumulate = 0; accumulate < 2; accumulate++) {
            cpu_matmul_fixed_order(kernel, OC, inp, w, N, IC, OC, accumulate);
            cpu_matmul_fixed_order_portable(portable, OC, inp, w, N, IC, OC, accumulate);
            EXPECT(!memcmp(kernel, portable, (size_t)N * OC * sizeof(float)),
                   "N %d IC %d OC %d accumulate %d: the kernel differs from the portable loop", N, IC, OC, accumulate);
        }
        double worst = 0; // after both passes: out = 2 * inp . w^T (and the random start)
        cpu_matmul_fixed_order(kernel, OC, inp, w, N, IC, OC, false);
        for (int i = 0; i < N; i++)
            for (int o = 0; o < OC; o++) {
                double want = 0, size = 0;
                for (int c = 0; c < IC; c++) {
                    want += (double)inp[(long)i * IC + c] * w[(long)o * IC + c];
                    size += fabs((double)inp[(long)i * IC + c] * w[(long)o * IC + c]);
                }
                worst = fmax(worst, fabs(kernel[(long)i * OC + o] - want) / fmax(size, 1e-30));
            }
        EXPECT(worst <= 1e-6, "N %d IC %d OC %d: %.3g of the sum of |products| from the double product", N, IC, OC, worst);
        free(inp), free(w), free(kernel), free(portable);
    }
}

// 40 distinct rows; each alone (1 thread) is the reference. Batches of M = 1..40 of them at
// shuffled positions, through the op table (MARLHF_CPU_MATMUL=batch-invariant), 1 and 2
// threads: every row's output is its reference, bit for bit. The sgemm path is counted
// the same way and its count printed (not a failure: it depends on the CPU's kernels).
static void test_matmul_rows_do_not_depend_on_batch(void) {
    EXPECT(cpu_matmul_batch_invariant(), "MARLHF_CPU_MATMUL=batch-invariant was not read");
    const int rows = 40, IC = 576, OC = 200; // OC: a partial tile and a partial kernel
    float *pool = random_floats((long)rows * IC), *w = random_floats((long)OC * IC), *bias = random_floats(OC);
    float *alone = xmalloc((size_t)rows * OC * sizeof(float)), *alone_sgemm = xmalloc((size_t)rows * OC * sizeof(float));
    omp_set_num_threads(1);
    for (int r = 0; r < rows; r++) {
        ops_cpu.matmul_forward(alone + (long)r * OC, pool + (long)r * IC, w, bias, 1, IC, OC);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, 1, OC, IC, 1.0f, pool + (long)r * IC, IC, w, IC, 0.0f,
                    alone_sgemm + (long)r * OC, OC);
    }
    float *inp = xmalloc((size_t)rows * IC * sizeof(float)), *out = xmalloc((size_t)rows * OC * sizeof(float));
    float *acc = xmalloc((size_t)rows * OC * sizeof(float));
    int order[40], differing = 0, sgemm_differing = 0, sgemm_rows = 0;
    for (int threads = 1; threads <= 2; threads++) {
        omp_set_num_threads(threads);
        for (int M = 1; M <= rows; M++) {
            shuffle(order, rows); // rows order[0..M) at positions 0..M
            for (int i = 0; i < M; i++) memcpy(inp + (long)i * IC, pool + (long)order[i] * IC, IC * sizeof(float));
            ops_cpu.matmul_forward(out, inp, w, bias, M, IC, OC);
            // accumulate onto ones: 1 + row's product, which the forward without bias gives + 1
            for (long i = 0; i < (long)M * OC; i++) acc[i] = 1.0f;
            ops_cpu.matmul_accumulate(acc, inp, w, M, IC, OC);
            for (int i = 0; i < M; i++) {
                const float *want = alone + (long)order[i] * OC;
                if (memcmp(out + (long)i * OC, want, OC * sizeof(float))) differing++;
            }
            float *no_bias = xmalloc((size_t)M * OC * sizeof(float));
            cpu_matmul_fixed_order(no_bias, OC, inp, w, M, IC, OC, false);
            for (long i = 0; i < (long)M * OC; i++)
                if (acc[i] != no_bias[i] + 1.0f) differing++;
            free(no_bias);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, OC, IC, 1.0f, inp, IC, w, IC, 0.0f, out, OC);
            for (int i = 0; i < M; i++, sgemm_rows++)
                if (memcmp(out + (long)i * OC, alone_sgemm + (long)order[i] * OC, OC * sizeof(float))) sgemm_differing++;
        }
    }
    omp_set_num_threads(2);
    EXPECT(differing == 0, "%d rows (or accumulated elements) differ from the row alone", differing);
    fprintf(stderr, "  sgemm (OpenBLAS core %s): %d of %d rows in batches differ from the row alone\n",
            getenv("OPENBLAS_CORETYPE") ? getenv("OPENBLAS_CORETYPE") : "auto", sgemm_differing, sgemm_rows);
    free(pool), free(w), free(bias), free(alone), free(alone_sgemm), free(inp), free(out), free(acc);
}

// Double-precision causal attention of one sequence of L tokens (q [L, H*D], k and v
// [L, KV*D]), out [L, H*D].
static void attention_reference(double *out, const float *q, const float *k, const float *v, int L, int H, int KV,
                                int D, int window) {
    const int group = H / KV;
    double *p = xmalloc((size_t)L * sizeof(double));
    for (int h = 0; h < H; h++)
        for (int t = 0; t < L; t++) {
            double max_score = -INFINITY, sum = 0;
            const int first = window > 0 && t - window + 1 > 0 ? t - window + 1 : 0; // a sliding window's first key
            for (int j = first; j <= t; j++) {
                double s = 0;
                for (int c = 0; c < D; c++) s += (double)q[(long)t * H * D + h * D + c] * k[(long)j * KV * D + (h / group) * D + c];
                p[j] = s / sqrt((double)D);
                max_score = fmax(max_score, p[j]);
            }
            for (int j = first; j <= t; j++) sum += p[j] = exp(p[j] - max_score);
            for (int c = 0; c < D; c++) {
                double o = 0;
                for (int j = first; j <= t; j++) o += p[j] / sum * v[(long)j * KV * D + (h / group) * D + c];
                out[(long)t * H * D + h * D + c] = o;
            }
        }
    free(p);
}

// One sequence (L tokens) alone, then placed as row `row` of B rows of T slots (left-padded
// when `left`, else right-padded), the other rows and the padding random: its outputs and
// probabilities keep their bits. Head sizes 16 (a whole vector) and 20 (a partial one).
static void test_attention_does_not_depend_on_padding(void) {
    const int shapes[][3] = {{4, 2, 16}, {6, 3, 20}, {9, 3, 64}}; // heads, K/V heads, head size
    // Without and with a sliding window of 7 keys (shorter than most rows here).
    for (int window = 0; window <= 7; window += 7)
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const int H = shapes[s][0], KV = shapes[s][1], D = shapes[s][2], qw = H * D, kvw = KV * D;
        for (int L = 1; L <= 40; L += 13) {
            float *q = random_floats((long)L * qw), *k = random_floats((long)L * kvw), *v = random_floats((long)L * kvw);
            float *out1 = xmalloc((size_t)L * qw * sizeof(float)), *p1 = xmalloc((size_t)H * L * L * sizeof(float));
            omp_set_num_threads(1);
            ops_cpu.attention_forward(out1, p1, q, k, v, NULL, 1, L, H, KV, D, 0.0f, window);
            double *want = xmalloc((size_t)L * qw * sizeof(double)), worst = 0;
            attention_reference(want, q, k, v, L, H, KV, D, window);
            for (long i = 0; i < (long)L * qw; i++) worst = fmax(worst, fabs(out1[i] - want[i]));
            EXPECT(worst <= 2e-6, "H %d KV %d D %d L %d window %d: %.3g from the double reference", H, KV, D, L, window,
                   worst);
            const struct { int B, T, row, left, threads; } layouts[] = {
                {1, L + 7, 0, 1, 1}, {1, L + 7, 0, 0, 2}, {3, L + 20, 1, 1, 2}, {3, L + 33, 2, 0, 1}, {5, L + 1, 4, 1, 2}};
            for (size_t l = 0; l < sizeof layouts / sizeof layouts[0]; l++) {
                const int B = layouts[l].B, T = layouts[l].T, row = layouts[l].row, pad = layouts[l].left ? T - L : 0;
                float *qb = random_floats((long)B * T * qw), *kb = random_floats((long)B * T * kvw),
                      *vb = random_floats((long)B * T * kvw);
                int row_start[5];
                for (int b = 0; b < B; b++) row_start[b] = (int)(next_random() % (uint64_t)(T < 5 ? T : 5));
                row_start[row] = pad;
                memcpy(qb + ((long)row * T + pad) * qw, q, (size_t)L * qw * sizeof(float));
                memcpy(kb + ((long)row * T + pad) * kvw, k, (size_t)L * kvw * sizeof(float));
                memcpy(vb + ((long)row * T + pad) * kvw, v, (size_t)L * kvw * sizeof(float));
                float *out = xmalloc((size_t)B * T * qw * sizeof(float)), *p = xmalloc((size_t)B * H * T * T * sizeof(float));
                omp_set_num_threads(layouts[l].threads);
                ops_cpu.attention_forward(out, p, qb, kb, vb, row_start, B, T, H, KV, D, 0.0f, window);
                bool same = !memcmp(out + ((long)row * T + pad) * qw, out1, (size_t)L * qw * sizeof(float));
                for (int h = 0; h < H; h++)
                    for (int t = 0; t < L; t++)
                        same &= !memcmp(p + (((long)row * H + h) * T + pad + t) * T + pad, p1 + ((long)h * L + t) * L,
                                        (size_t)L * sizeof(float));
                EXPECT(same, "H %d KV %d D %d L %d window %d: row %d of %d, T %d, %s padding, %d threads: other bits than "
                       "alone", H, KV, D, L, window, row, B, T, layouts[l].left ? "left" : "right", layouts[l].threads);
                free(qb), free(kb), free(vb), free(out), free(p);
            }
            free(q), free(k), free(v), free(out1), free(p1), free(want);
        }
    }
    omp_set_num_threads(2);
}

// The tiny Llama (GQA 4/2): sequences of 3..23 tokens; each one's next-token log-probs alone,
// then in ragged batches (left- or right-padded, each row's targets on its own tokens) on 1
// and 2 threads: the same bits. With sgemm and the previous attention this failed.
static void test_model_rows_do_not_depend_on_batch(void) {
    Model model;
    ModelLoadOptions load = {.with_lm_head = true};
    CHECK(model_load(&model, "tests/fixtures/models/llama", &ops_cpu, &load) == 0, "%s", err_msg());
    const int count = 8, V = model.config.vocab_size;
    int lengths[8], tokens[8][24];
    float alone[8][24];
    omp_set_num_threads(1);
    for (int s = 0; s < count; s++) {
        lengths[s] = 3 + (int)(next_random() % 21);
        for (int t = 0; t < lengths[s]; t++) tokens[s][t] = (int)(next_random() % (uint64_t)V);
        int targets[24];
        for (int t = 0; t < lengths[s]; t++) targets[t] = t + 1 < lengths[s] ? tokens[s][t + 1] : -1;
        ModelBatch one = {.B = 1, .T = lengths[s], .tokens = tokens[s], .row_len = &lengths[s]};
        model_forward(&model, &one);
        model_logprobs(&model, targets, alone[s], NULL, NULL);
    }
    int differing = 0;
    for (int trial = 0; trial < 6; trial++) {
        const int B = 1 + trial, left = trial % 2, T = 24 + trial * 3;
        int order[8], row_start[8], row_len[8];
        shuffle(order, count);
        int *batch_tokens = xmalloc((size_t)B * T * sizeof(int)), *targets = xmalloc((size_t)B * T * sizeof(int));
        float *logp = xmalloc((size_t)B * T * sizeof(float));
        for (int b = 0; b < B; b++) {
            const int s = order[b], L = lengths[s];
            row_len[b] = L, row_start[b] = left ? T - L - (int)(next_random() % 3) : 0;
            for (int t = 0; t < T; t++) batch_tokens[(long)b * T + t] = (int)(next_random() % (uint64_t)V), targets[(long)b * T + t] = -1;
            for (int t = 0; t < L; t++) {
                batch_tokens[(long)b * T + row_start[b] + t] = tokens[s][t];
                targets[(long)b * T + row_start[b] + t] = t + 1 < L ? tokens[s][t + 1] : -1;
            }
        }
        omp_set_num_threads(1 + trial % 2);
        ModelBatch batch = {.B = B, .T = T, .tokens = batch_tokens, .row_start = row_start, .row_len = row_len};
        model_forward(&model, &batch);
        model_logprobs(&model, targets, logp, NULL, NULL);
        for (int b = 0; b < B; b++)
            if (memcmp(logp + (long)b * T + row_start[b], alone[order[b]], (size_t)(row_len[b] - 1) * sizeof(float))) {
                differing++;
                fprintf(stderr, "  trial %d: sequence %d (row %d of %d, %s-padded to %d) differs from alone\n", trial,
                        order[b], b, B, left ? "left" : "right", T);
            }
        free(batch_tokens), free(targets), free(logp);
    }
    omp_set_num_threads(2);
    EXPECT(differing == 0, "%d sequences' log-probs differ from their log-probs alone", differing);
    model_free(&model);
}

int main(void) {
    setenv("MARLHF_CPU_MATMUL", "batch-invariant", 1);
    RUN(test_kernel_equals_portable);
    RUN(test_matmul_rows_do_not_depend_on_batch);
    RUN(test_attention_does_not_depend_on_padding);
    RUN(test_model_rows_do_not_depend_on_batch);
    TEST_EXIT();
}
