// Finite-difference checks of every CPU op's backward (and decode attention, which has
// none, against a double-precision reference).
//
// Each op's output is contracted with a fixed random tensor R, giving a scalar loss
// L = sum(out * R) accumulated in double. The analytic gradient from the op's backward
// (fed dout = R) is compared with central differences (L(x+h) - L(x-h)) / 2h at sampled
// elements of every input. The kernels are float32, so h is 1e-2 and the tolerance is
// 2e-3 absolute + 2e-2 relative: enough to catch any wrong term (those are O(1) errors),
// with margin for float32 rounding in L. tests/test_ops_f64.c runs the same checks in
// double precision on the same kernel sources, to 1e-6.
#include <immintrin.h>
#include <stdint.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/check.h"
#include "core/rng.h"
#include "ops/cpu/ops_cpu.h"
#include "ops/ops.h"
#include "ops/nf4.h"
#include "ops/q4.h"
#include "ops/q8.h"
#include "test.h"

static uint64_t rng_state = 12345;
static float uniform(float lo, float hi) {
    rng_state = rng_state * 6364136223846793005ULL + 1442695040888963407ULL;
    return lo + (hi - lo) * (float)((rng_state >> 40) / (double)(1ULL << 24));
}
static float *random_floats(long n, float lo, float hi) {
    float *x = xmalloc((size_t)n * sizeof(float));
    for (long i = 0; i < n; i++) x[i] = uniform(lo, hi);
    return x;
}
static double dot(const float *a, const float *b, long n) {
    double s = 0;
    for (long i = 0; i < n; i++) s += (double)a[i] * b[i];
    return s;
}

typedef double (*LossFn)(void *ctx);

// Compares analytic[i] with the central difference of loss() w.r.t. x[i] at up to
// `samples` indices (all when n <= samples).
static void check_gradient(const char *what, LossFn loss, void *ctx, float *x, long n,
                           const float *analytic, int samples) {
    const float h = 1e-2f;
    int failures = 0;
    for (int s = 0; s < (n < samples ? n : samples); s++) {
        long i = n <= samples ? s : (long)(uniform(0, 1) * n) % n;
        float saved = x[i];
        x[i] = saved + h;
        double plus = loss(ctx);
        x[i] = saved - h;
        double minus = loss(ctx);
        x[i] = saved;
        double numeric = (plus - minus) / (2.0 * h);
        double tol = 2e-3 + 2e-2 * fabs(numeric);
        if (!(fabs(numeric - analytic[i]) <= tol)) {
            if (failures++ < 3)
                fprintf(stderr, "  %s[%ld]: analytic %.6g, numeric %.6g\n", what, i,
                        (double)analytic[i], numeric);
            test_current_failures++;
        }
    }
}

// ---- matmul ----
typedef struct { int N, IC, OC; float *inp, *w, *b, *out, *R; } MatmulCase;
static double matmul_loss(void *p) {
    MatmulCase *c = p;
    ops_cpu.matmul_forward(c->out, c->inp, c->w, c->b, c->N, c->IC, c->OC);
    return dot(c->out, c->R, (long)c->N * c->OC);
}
static void test_matmul(void) {
    MatmulCase c = {.N = 5, .IC = 7, .OC = 3};
    c.inp = random_floats(c.N * c.IC, -1, 1);
    c.w = random_floats(c.OC * c.IC, -1, 1);
    c.b = random_floats(c.OC, -1, 1);
    c.out = xcalloc(c.N * c.OC, sizeof(float));
    c.R = random_floats(c.N * c.OC, -1, 1);
    float *dinp = xcalloc(c.N * c.IC, 4), *dw = xcalloc(c.OC * c.IC, 4), *db = xcalloc(c.OC, 4);
    ops_cpu.matmul_backward(dinp, dw, db, c.R, c.inp, c.w, c.N, c.IC, c.OC, WRITE_ADD, WRITE_ADD);
    check_gradient("matmul dinp", matmul_loss, &c, c.inp, c.N * c.IC, dinp, 100);
    // WRITE_OVERWRITE: the same input gradient written over garbage (NaN, which a read shows).
    float *overwritten = xmalloc((size_t)c.N * c.IC * 4);
    for (int i = 0; i < c.N * c.IC; i++) overwritten[i] = NAN;
    ops_cpu.matmul_backward(overwritten, NULL, NULL, c.R, c.inp, c.w, c.N, c.IC, c.OC, WRITE_OVERWRITE, WRITE_ADD);
    check_gradient("matmul dinp (overwritten)", matmul_loss, &c, c.inp, c.N * c.IC, overwritten, 100);
    free(overwritten);
    check_gradient("matmul dweight", matmul_loss, &c, c.w, c.OC * c.IC, dw, 100);
    check_gradient("matmul dbias", matmul_loss, &c, c.b, c.OC, db, 100);
    // Weight WRITE_OVERWRITE (an unwritten weight gradient, model/gradient_writes.c): the
    // weight's and bias's gradients written over NaN are the ones added into zeros, bit for bit.
    float *dw_over = xmalloc((size_t)c.OC * c.IC * 4), *db_over = xmalloc((size_t)c.OC * 4);
    for (int i = 0; i < c.OC * c.IC; i++) dw_over[i] = NAN;
    for (int i = 0; i < c.OC; i++) db_over[i] = NAN;
    ops_cpu.matmul_backward(NULL, dw_over, db_over, c.R, c.inp, c.w, c.N, c.IC, c.OC, WRITE_ADD, WRITE_OVERWRITE);
    EXPECT(memcmp(dw_over, dw, (size_t)c.OC * c.IC * 4) == 0, "overwritten weight gradient differs from the added one");
    EXPECT(memcmp(db_over, db, (size_t)c.OC * 4) == 0, "overwritten bias gradient differs from the added one");
    // And added (WRITE_ADD) onto what is there: twice the gradient.
    ops_cpu.matmul_backward(NULL, dw_over, db_over, c.R, c.inp, c.w, c.N, c.IC, c.OC, WRITE_ADD, WRITE_ADD);
    double worst = 0;
    for (int i = 0; i < c.OC * c.IC; i++) worst = fmax(worst, fabs(dw_over[i] - 2 * dw[i]));
    for (int i = 0; i < c.OC; i++) worst = fmax(worst, fabs(db_over[i] - 2 * db[i]));
    EXPECT(worst < 1e-5, "a weight gradient added onto itself is off by %g", worst);
    free(dw_over), free(db_over);
    // matmul_forward_residual: the product and bias, then the residual, bit for bit.
    float *residual = random_floats(c.N * c.OC, -1, 1);
    float *fused = xmalloc((size_t)c.N * c.OC * 4), *apart = xmalloc((size_t)c.N * c.OC * 4);
    ops_cpu.matmul_forward_residual(fused, c.inp, c.w, c.b, residual, c.N, c.IC, c.OC);
    ops_cpu.matmul_forward(apart, c.inp, c.w, c.b, c.N, c.IC, c.OC);
    ops_cpu.accumulate(apart, residual, (long)c.N * c.OC);
    EXPECT(memcmp(fused, apart, (size_t)c.N * c.OC * 4) == 0, "matmul_forward_residual differs from forward + accumulate");
    free(residual), free(fused), free(apart);
    free(c.inp), free(c.w), free(c.b), free(c.out), free(c.R), free(dinp), free(dw), free(db);
}

// matmul_accumulate adds what matmul_forward writes (both the few-row and the sgemm path);
// scale multiplies.
static void test_matmul_accumulate_and_scale(void) {
    const int shapes[][3] = {{3, 7, 5}, {37, 8, 29}};
    for (int s = 0; s < 2; s++) {
        int N = shapes[s][0], IC = shapes[s][1], OC = shapes[s][2];
        float *inp = random_floats(N * IC, -1, 1), *w = random_floats(OC * IC, -1, 1);
        float *acc = random_floats(N * OC, -1, 1), *want = xmalloc(N * OC * 4), *product = xmalloc(N * OC * 4);
        ops_cpu.matmul_forward(product, inp, w, NULL, N, IC, OC);
        for (int i = 0; i < N * OC; i++) want[i] = acc[i] + product[i];
        ops_cpu.matmul_accumulate(acc, inp, w, N, IC, OC);
        for (int i = 0; i < N * OC; i++) EXPECT_CLOSE(acc[i], want[i], 1e-5, 1e-5, "matmul_accumulate");
        memcpy(product, acc, N * OC * 4);
        ops_cpu.scale(acc, -0.5f, N * OC);
        for (int i = 0; i < N * OC; i++) EXPECT(acc[i] == -0.5f * product[i], "scale: %g vs %g", acc[i], -0.5f * product[i]);
        free(inp), free(w), free(acc), free(want), free(product);
    }
}

// ---- quantized weights (Q8_0, Q4_0, NF4): the LoRA base's matmuls ----
static void *zeroed(size_t bytes) { return xcalloc(1, bytes); }

// A random [OC, IC] weight quantized to NF4 (double_quant: its scales too), and its dequantized
// floats, each within |scale - absmax| + 0.1386 absmax of its value (half the widest gap between
// NF4 levels, 0.7230 to 1, of the block's absmax, and how far the stored scale is from it).
static Q8Matrix random_nf4(int OC, int IC, bool double_quant, float **dequantized) {
    float *w = random_floats((long)OC * IC, -0.3f, 0.3f);
    for (long i = 0; i < (long)OC * IC; i += 7 * NF4_BLOCK + 5) w[i] *= 8.0f; // blocks of other scales
    Q8Matrix m = {0};
    nf4_quantize_matrix(&m, w, OC, IC, double_quant, zeroed);
    *dequantized = xmalloc((size_t)OC * IC * sizeof(float));
    quant_dequantize_rows(&m, 0, OC, *dequantized);
    float *scales = xmalloc((size_t)OC * (IC / NF4_BLOCK) * sizeof(float));
    nf4_row_scales(&m, 0, OC, scales);
    double worst = 0;
    for (long b = 0; b < (long)OC * IC / NF4_BLOCK; b++) {
        float absmax = 0;
        for (long i = b * NF4_BLOCK; i < (b + 1) * NF4_BLOCK; i++) absmax = fmaxf(absmax, fabsf(w[i]));
        const double bound = fabs((double)scales[b] - absmax) + 0.15191 * absmax;
        for (long i = b * NF4_BLOCK; i < (b + 1) * NF4_BLOCK; i++)
            worst = fmax(worst, fabs((*dequantized)[i] - w[i]) / (bound * (1 + 1e-5) + 1e-30));
    }
    EXPECT(worst <= 1.0, "nf4 (double quantization %d): a dequantized weight %.3g bounds from its value", double_quant,
           worst);
    free(scales);
    free(w);
    return m;
}

// A random [OC, IC] weight quantized to `type`, and its dequantized floats.
static Q8Matrix random_quantized(QuantType type, int OC, int IC, float **dequantized) {
    if (type == QUANT_NF4) return random_nf4(OC, IC, IC % 128 == 0, dequantized); // both kinds of scales
    float *w = random_floats((long)OC * IC, -0.3f, 0.3f);
    Q8Matrix m = {.rows = OC, .cols = IC, .type = type};
    m.scales = xmalloc((size_t)OC * (IC / Q8_BLOCK) * sizeof(float));
    m.values = xmalloc(type == QUANT_Q4_0 ? (size_t)OC * IC / 2 : (size_t)OC * IC);
    for (int o = 0; o < OC; o++) {
        float *scales = m.scales + (long)o * (IC / Q8_BLOCK);
        if (type == QUANT_Q4_0) q4_quantize_row(w + (long)o * IC, IC, m.nibbles + (long)o * IC / 2, scales);
        else q8_quantize_row(w + (long)o * IC, IC, m.values + (long)o * IC, scales);
    }
    *dequantized = xmalloc((size_t)OC * IC * sizeof(float));
    quant_dequantize_rows(&m, 0, OC, *dequantized);
    // The dequantized weights are the quantization of w: within half a step of each value for
    // Q8_0; for Q4_0 a step (code 15, 7 steps, is the most a value on the side opposite the
    // block's extreme can get, for values up to 8 steps), the step rounded to a half (8 steps
    // of 2^-11).
    double worst = 0;
    for (long i = 0; i < (long)OC * IC; i++) {
        const float step = fabsf(m.scales[i / Q8_BLOCK]);
        worst = fmax(worst, fabs((*dequantized)[i] - w[i]) / (step * (type == QUANT_Q4_0 ? 1.0 : 0.5) + 1e-30));
    }
    EXPECT(worst <= (type == QUANT_Q4_0 ? 1.0 + 8.0 / 2048 : 1.0 + 1e-5), "type %d: a dequantized weight %.3g bounds from its value",
           (int)type, worst);
    free(w);
    return m;
}

// matmul_backward_input_q8 (dinp += dout . W) and matmul_forward_dequantized against the
// float32 ops on the dequantized weights: row counts on both sides of Q8_SGEMM_MIN_ROWS,
// outputs over one and several of the kernels' 256-row tiles (with a partial last one), an
// accumulating dinp. The summation order differs (a tile at a time), so relative 1e-5 of the
// products' magnitude. The inference kernel (matmul_forward_q8, Q4_0 included) stays within
// the input's Q8_0 rounding of the same product; NF4's (ops/cpu/matmul_nf4.c below 64 rows)
// does not quantize the input: within relative 1e-5 too. NF4's shapes have rows of whole
// blocks of 64 (single and double-quantized scales, 1 to 1800 blocks of them).
static void test_matmul_quantized(void) {
    const int shapes[][3] = {{5, 64, 37}, {70, 96, 300}, {13, 160, 600}, {64, 32, 257}};
    const int nf4_shapes[][3] = {{5, 64, 37}, {70, 128, 300}, {13, 192, 600}, {64, 64, 257}, {1, 576, 40}, {4, 256, 9}};
    const QuantType types[] = {QUANT_Q8_0, QUANT_Q4_0, QUANT_NF4};
    for (int t = 0; t < 3; t++)
        for (int k = 0; k < (types[t] == QUANT_NF4 ? 6 : 4); k++) {
            const int *shape = types[t] == QUANT_NF4 ? nf4_shapes[k] : shapes[k];
            const int N = shape[0], IC = shape[1], OC = shape[2];
            float *w;
            Q8Matrix m = random_quantized(types[t], OC, IC, &w);
            float *inp = random_floats((long)N * IC, -1, 1), *dout = random_floats((long)N * OC, -1, 1);
            float *bias = random_floats(OC, -1, 1);
            float *dinp = random_floats((long)N * IC, -1, 1), *want = xmalloc((size_t)N * IC * sizeof(float));
            memcpy(want, dinp, (size_t)N * IC * sizeof(float));
            ops_cpu.matmul_backward_input_q8(dinp, dout, &m, N, IC, OC);
            ops_cpu.matmul_backward(want, NULL, NULL, dout, inp, w, N, IC, OC, WRITE_ADD, WRITE_ADD);
            double worst = 0;
            for (int i = 0; i < N; i++)
                for (int c = 0; c < IC; c++) {
                    double magnitude = 1;
                    for (int o = 0; o < OC; o++) magnitude += fabs((double)dout[(long)i * OC + o] * w[(long)o * IC + c]);
                    worst = fmax(worst, fabs(dinp[(long)i * IC + c] - want[(long)i * IC + c]) / (1e-5 * magnitude));
                }
            EXPECT(worst <= 1.0, "type %d, N %d IC %d OC %d: backward input %.3g x the tolerance from float32", (int)types[t],
                   N, IC, OC, worst);

            float *out = xmalloc((size_t)N * OC * sizeof(float)), *expected = xmalloc((size_t)N * OC * sizeof(float));
            ops_cpu.matmul_forward(expected, inp, w, bias, N, IC, OC);
            ops_cpu.matmul_forward_dequantized(out, inp, &m, bias, N, IC, OC);
            double worst_forward = 0, worst_inference = 0;
            float *inference = xmalloc((size_t)N * OC * sizeof(float));
            ops_cpu.matmul_forward_q8(inference, inp, &m, bias, N, IC, OC, N);
            for (int i = 0; i < N; i++)
                for (int o = 0; o < OC; o++) {
                    double magnitude = 1 + fabs(bias[o]), rounding = 0;
                    for (int c = 0; c < IC; c++) {
                        magnitude += fabs((double)inp[(long)i * IC + c] * w[(long)o * IC + c]);
                        // the input's Q8_0 step is at most max|x| / 127 <= 1/127 per value (NF4: float inputs)
                        if (types[t] != QUANT_NF4) rounding += fabs(w[(long)o * IC + c]) / 127.0 / 2;
                    }
                    const long at = (long)i * OC + o;
                    worst_forward = fmax(worst_forward, fabs(out[at] - expected[at]) / (1e-5 * magnitude));
                    worst_inference = fmax(worst_inference, fabs(inference[at] - expected[at]) / (rounding + 1e-5 * magnitude));
                }
            EXPECT(worst_forward <= 1.0, "type %d, N %d IC %d OC %d: forward %.3g x the tolerance from float32", (int)types[t],
                   N, IC, OC, worst_forward);
            EXPECT(worst_inference <= 1.0, "type %d, N %d IC %d OC %d: inference kernel %.3g x its rounding bound",
                   (int)types[t], N, IC, OC, worst_inference);
            free(inp), free(dout), free(bias), free(dinp), free(want), free(out), free(expected), free(inference), free(w);
            free(m.values), free(m.scales), free(m.scale_codes), free(m.scale_absmax);
        }
}

// ---- layernorm / rmsnorm ----
typedef struct { int N, C; bool rms, plus_one; float *inp, *w, *b, *out, *mean, *rstd, *R; } NormCase;
static double norm_loss(void *p) {
    NormCase *c = p;
    if (c->rms) ops_cpu.rmsnorm_forward(c->out, c->rstd, c->inp, c->w, c->N, c->C, 1e-5f, c->plus_one);
    else ops_cpu.layernorm_forward(c->out, c->mean, c->rstd, c->inp, c->w, c->b, c->N, c->C, 1e-5f);
    return dot(c->out, c->R, (long)c->N * c->C);
}
static void run_norm_case(bool rms, bool plus_one) {
    NormCase c = {.N = 4, .C = 24, .rms = rms, .plus_one = plus_one};
    c.inp = random_floats(c.N * c.C, -2, 2);
    c.w = random_floats(c.C, 0.5, 1.5);
    c.b = random_floats(c.C, -0.5, 0.5);
    c.out = xcalloc(c.N * c.C, 4), c.mean = xcalloc(c.N, 4), c.rstd = xcalloc(c.N, 4);
    c.R = random_floats(c.N * c.C, -1, 1);
    norm_loss(&c);
    float *dinp = xcalloc(c.N * c.C, 4), *dw = xcalloc(c.C, 4), *db = xcalloc(c.C, 4);
    if (rms) ops_cpu.rmsnorm_backward(dinp, dw, c.R, c.inp, c.w, c.rstd, c.N, c.C, plus_one);
    else ops_cpu.layernorm_backward(dinp, dw, db, c.R, c.inp, c.w, c.mean, c.rstd, c.N, c.C);
    check_gradient("norm dinp", norm_loss, &c, c.inp, c.N * c.C, dinp, 100);
    check_gradient("norm dweight", norm_loss, &c, c.w, c.C, dw, 100);
    if (!rms) check_gradient("norm dbias", norm_loss, &c, c.b, c.C, db, 100);
    free(c.inp), free(c.w), free(c.b), free(c.out), free(c.mean), free(c.rstd), free(c.R);
    free(dinp), free(dw), free(db);
}
static void test_layernorm(void) { run_norm_case(false, false); }
static void test_rmsnorm(void) { run_norm_case(true, false); }
static void test_rmsnorm_plus_one(void) { run_norm_case(true, true); }

// ---- rope ----
typedef struct { int N, heads, hd; int *pos; float *x, *work, *R, *inv_freq; } RopeCase;
static double rope_loss(void *p) {
    RopeCase *c = p;
    long n = (long)c->N * c->heads * c->hd;
    memcpy(c->work, c->x, n * sizeof(float));
    ops_cpu.rope_forward(c->work, c->pos, c->N, c->heads, c->hd, c->inv_freq);
    return dot(c->work, c->R, n);
}
static void test_rope(void) {
    RopeCase c = {.N = 6, .heads = 2, .hd = 8};
    long n = (long)c.N * c.heads * c.hd;
    int pos[6] = {0, 1, 2, 7, 30, 500};
    float inv_freq[4];
    for (int i = 0; i < 4; i++) inv_freq[i] = 1.0f / powf(10000.0f, (float)(2 * i) / 8.0f);
    c.pos = pos, c.inv_freq = inv_freq;
    c.x = random_floats(n, -1, 1), c.work = xcalloc(n, 4), c.R = random_floats(n, -1, 1);
    float *dx = xmalloc(n * sizeof(float));
    memcpy(dx, c.R, n * sizeof(float));
    ops_cpu.rope_backward(dx, c.pos, c.N, c.heads, c.hd, c.inv_freq);
    check_gradient("rope dx", rope_loss, &c, c.x, n, dx, 200);
    free(c.x), free(c.work), free(c.R), free(dx);
}

// ---- attention (GQA, a left-padded row) ----
typedef struct { int B, T, nh, nkv, hd; int *row_start; float *q, *k, *v, *out, *probs, *R; } AttnCase;
static double attention_loss(void *p) {
    AttnCase *c = p;
    ops_cpu.attention_forward(c->out, c->probs, c->q, c->k, c->v, c->row_start, c->B, c->T,
                              c->nh, c->nkv, c->hd, 0.0f, 0);
    return dot(c->out, c->R, (long)c->B * c->T * c->nh * c->hd);
}
static void test_attention(void) {
    AttnCase c = {.B = 2, .T = 6, .nh = 4, .nkv = 2, .hd = 4};
    int row_start[2] = {0, 2};
    c.row_start = row_start;
    long nq = (long)c.B * c.T * c.nh * c.hd, nkv = (long)c.B * c.T * c.nkv * c.hd;
    c.q = random_floats(nq, -1, 1), c.k = random_floats(nkv, -1, 1), c.v = random_floats(nkv, -1, 1);
    c.out = xcalloc(nq, 4), c.probs = xcalloc((long)c.B * c.nh * c.T * c.T, 4);
    c.R = random_floats(nq, -1, 1);
    // The loss only sees real query slots: padded queries have no keys.
    for (int t = 0; t < row_start[1]; t++)
        for (int j = 0; j < c.nh * c.hd; j++) c.R[((long)c.T + t) * c.nh * c.hd + j] = 0.0f;
    attention_loss(&c);
    // The op overwrites its gradients (ops.h): they start as NaN, which an element left
    // unwritten keeps.
    float *dq = xmalloc(nq * 4), *dk = xmalloc(nkv * 4), *dv = xmalloc(nkv * 4);
    for (long i = 0; i < nq; i++) dq[i] = NAN;
    for (long i = 0; i < nkv; i++) dk[i] = dv[i] = NAN;
    ops_cpu.attention_backward(dq, dk, dv, c.R, NULL, c.probs, c.q, c.k, c.v, c.row_start, c.B, c.T,
                               c.nh, c.nkv, c.hd, 0.0f, 0);
    check_gradient("attention dq", attention_loss, &c, c.q, nq, dq, 400);
    check_gradient("attention dk", attention_loss, &c, c.k, nkv, dk, 400);
    check_gradient("attention dv", attention_loss, &c, c.v, nkv, dv, 400);
    // Probabilities of a real query sum to one over the keys it may see.
    for (int t = row_start[1]; t < c.T; t++) {
        double sum = 0;
        for (int j = 0; j < c.T; j++) sum += c.probs[((long)(1 * c.nh + 0) * c.T + t) * c.T + j];
        EXPECT_CLOSE(sum, 1.0, 1e-6, 0, "row of attention probabilities");
        EXPECT(c.probs[((long)(1 * c.nh) * c.T + t) * c.T + 0] == 0.0f, "padding key got weight");
    }
    free(c.q), free(c.k), free(c.v), free(c.out), free(c.probs), free(c.R), free(dq), free(dk), free(dv);
}

// ---- attention with the rotary positions inside (attention_forward_rotary) ----
// Its forward is rope_forward on q and k and then attention_forward, bit for bit, and
// leaves q and k as they were; its backward's dq and dk are the gradients of the
// unrotated q and k (finite differences through the rotary forward), dv as ever. Plain,
// and with Gemma 2's soft cap and a sliding window (Gemma 2/3 take this op too when their
// query scalar is the head size).
typedef struct { AttnCase attention; int *positions; float *inv_freq; float softcap; int window; } RotaryCase;
static double rotary_attention_loss(void *p) {
    RotaryCase *r = p;
    AttnCase *c = &r->attention;
    ops_cpu.attention_forward_rotary(c->out, c->probs, c->q, c->k, c->v, c->nh * c->hd, c->nkv * c->hd, c->row_start,
                                     r->positions, r->inv_freq, c->B, c->T, c->nh, c->nkv, c->hd, r->softcap,
                                     r->window);
    return dot(c->out, c->R, (long)c->B * c->T * c->nh * c->hd);
}
// The same op on q, k and v as the columns of one [B*T, q | k | v] buffer (the fused q/k/v
// product's output): the same output and saved state, and the gradients, written into the
// same columns of one buffer, the same bits as into buffers of their own. The columns not
// q's, k's or v's (none here: the rows are exactly q | k | v) would be left alone.
static void check_packed_rotary_attention(RotaryCase *r, const float *dq, const float *dk, const float *dv) {
    AttnCase *c = &r->attention;
    const int N = c->B * c->T, qd = c->nh * c->hd, kvd = c->nkv * c->hd, width = qd + 2 * kvd;
    float *packed = xmalloc((size_t)N * width * 4), *gradients = xmalloc((size_t)N * width * 4);
    for (int row = 0; row < N; row++) {
        memcpy(packed + (long)row * width, c->q + (long)row * qd, qd * 4);
        memcpy(packed + (long)row * width + qd, c->k + (long)row * kvd, kvd * 4);
        memcpy(packed + (long)row * width + qd + kvd, c->v + (long)row * kvd, kvd * 4);
    }
    for (long i = 0; i < (long)N * width; i++) gradients[i] = NAN;
    const long nq = (long)N * qd, n_probs = (long)c->B * c->nh * c->T * c->T;
    float *out = xcalloc(nq, 4), *probs = xcalloc(n_probs, 4);
    ops_cpu.attention_forward_rotary(out, probs, packed, packed + qd, packed + qd + kvd, width, width, c->row_start,
                                     r->positions, r->inv_freq, c->B, c->T, c->nh, c->nkv, c->hd, r->softcap,
                                     r->window);
    EXPECT(memcmp(out, c->out, nq * 4) == 0, "rotary attention on a fused q | k | v buffer: another output");
    EXPECT(memcmp(probs, c->probs, n_probs * 4) == 0, "rotary attention on a fused buffer: another saved state");
    ops_cpu.attention_backward_rotary(gradients, gradients + qd, gradients + qd + kvd, c->R, c->out, c->probs, packed,
                                      packed + qd, packed + qd + kvd, width, width, c->row_start, r->positions,
                                      r->inv_freq, c->B, c->T, c->nh, c->nkv, c->hd, r->softcap, r->window);
    int differing = 0;
    for (int row = 0; row < N; row++) {
        differing += memcmp(gradients + (long)row * width, dq + (long)row * qd, qd * 4) != 0;
        differing += memcmp(gradients + (long)row * width + qd, dk + (long)row * kvd, kvd * 4) != 0;
        differing += memcmp(gradients + (long)row * width + qd + kvd, dv + (long)row * kvd, kvd * 4) != 0;
    }
    EXPECT(differing == 0, "rotary attention backward into a fused buffer: %d rows' gradients differ", differing);
    free(packed), free(gradients), free(out), free(probs);
}

static void run_rotary_attention_case(float softcap, int window) {
    RotaryCase r = {.attention = {.B = 2, .T = 6, .nh = 4, .nkv = 2, .hd = 8}, .softcap = softcap, .window = window};
    AttnCase *c = &r.attention;
    int row_start[2] = {0, 2}, positions[12];
    for (int b = 0; b < 2; b++)
        for (int t = 0; t < 6; t++) positions[b * 6 + t] = t < row_start[b] ? 0 : 3 * (t - row_start[b]) + 100 * b;
    float inv_freq[4];
    for (int i = 0; i < 4; i++) inv_freq[i] = 1.0f / powf(10000.0f, (float)(2 * i) / 8.0f);
    c->row_start = row_start, r.positions = positions, r.inv_freq = inv_freq;
    const long nq = (long)c->B * c->T * c->nh * c->hd, nkv = (long)c->B * c->T * c->nkv * c->hd;
    const long n_probs = (long)c->B * c->nh * c->T * c->T;
    c->q = random_floats(nq, -1, 1), c->k = random_floats(nkv, -1, 1), c->v = random_floats(nkv, -1, 1);
    c->out = xcalloc(nq, 4), c->probs = xcalloc(n_probs, 4);
    c->R = random_floats(nq, -1, 1);
    for (int t = 0; t < row_start[1]; t++) // padded queries have no keys
        for (int j = 0; j < c->nh * c->hd; j++) c->R[((long)c->T + t) * c->nh * c->hd + j] = 0.0f;
    // The forward against rope_forward then attention_forward, and q and k left alone.
    float *q_before = xmalloc(nq * 4), *k_before = xmalloc(nkv * 4);
    memcpy(q_before, c->q, nq * 4), memcpy(k_before, c->k, nkv * 4);
    float *q_rotated = xmalloc(nq * 4), *k_rotated = xmalloc(nkv * 4);
    memcpy(q_rotated, c->q, nq * 4), memcpy(k_rotated, c->k, nkv * 4);
    ops_cpu.rope_forward(q_rotated, positions, c->B * c->T, c->nh, c->hd, inv_freq);
    ops_cpu.rope_forward(k_rotated, positions, c->B * c->T, c->nkv, c->hd, inv_freq);
    float *want = xcalloc(nq, 4), *want_probs = xcalloc(n_probs, 4);
    ops_cpu.attention_forward(want, want_probs, q_rotated, k_rotated, c->v, row_start, c->B, c->T, c->nh, c->nkv, c->hd,
                              softcap, window);
    rotary_attention_loss(&r);
    EXPECT(memcmp(c->out, want, nq * 4) == 0, "rotary attention forward differs from rope_forward + attention_forward");
    EXPECT(memcmp(c->probs, want_probs, n_probs * 4) == 0, "rotary attention's saved state differs");
    EXPECT(memcmp(c->q, q_before, nq * 4) == 0 && memcmp(c->k, k_before, nkv * 4) == 0,
           "rotary attention forward wrote q or k");
    // The backward over NaN-filled gradients (the op overwrites them, every element).
    float *dq = xmalloc(nq * 4), *dk = xmalloc(nkv * 4), *dv = xmalloc(nkv * 4);
    for (long i = 0; i < nq; i++) dq[i] = NAN;
    for (long i = 0; i < nkv; i++) dk[i] = dv[i] = NAN;
    ops_cpu.attention_backward_rotary(dq, dk, dv, c->R, c->out, c->probs, c->q, c->k, c->v, c->nh * c->hd,
                                      c->nkv * c->hd, row_start, positions, inv_freq, c->B, c->T, c->nh, c->nkv, c->hd,
                                      softcap, window);
    EXPECT(memcmp(c->q, q_before, nq * 4) == 0 && memcmp(c->k, k_before, nkv * 4) == 0,
           "rotary attention backward wrote q or k");
    check_packed_rotary_attention(&r, dq, dk, dv);
    check_gradient("rotary attention dq", rotary_attention_loss, &r, c->q, nq, dq, 400);
    check_gradient("rotary attention dk", rotary_attention_loss, &r, c->k, nkv, dk, 400);
    check_gradient("rotary attention dv", rotary_attention_loss, &r, c->v, nkv, dv, 400);
    free(c->q), free(c->k), free(c->v), free(c->out), free(c->probs), free(c->R), free(dq), free(dk), free(dv);
    free(q_before), free(k_before), free(q_rotated), free(k_rotated), free(want), free(want_probs);
}
static void test_attention_rotary(void) {
    run_rotary_attention_case(0.0f, 0);
    run_rotary_attention_case(0.5f, 3); // the scores reach about 2: the cap bends them
}

// ---- attention forward without a saved state (ops.h, attention_forward_without_saved) ----
// Where no backward follows, the CPU forward takes saved NULL and keeps one row of
// probabilities at a time: the same output bits as the forward that keeps them all, with
// padding, a soft cap and a sliding window, and through the rotary op.
static void test_attention_forward_without_saved(void) {
    EXPECT(ops_cpu.attention_forward_without_saved, "the CPU backend takes saved NULL");
    const struct { int T, hd; float softcap; int window; } cases[] = {{6, 4, 0.0f, 0}, {70, 64, 0.0f, 0},
                                                                       {70, 64, 0.5f, 9}, {33, 80, 0.0f, 5}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const int B = 2, T = cases[i].T, nh = 4, nkv = 2, hd = cases[i].hd;
        int row_start[2] = {0, T / 3};
        const long nq = (long)B * T * nh * hd, nk = (long)B * T * nkv * hd;
        float *q = random_floats(nq, -1, 1), *k = random_floats(nk, -1, 1), *v = random_floats(nk, -1, 1);
        float *kept = xmalloc(nq * 4), *alone = xmalloc(nq * 4);
        float *probs = xmalloc(ops_cpu.attention_saved_size(B, T, nh, nkv, hd, cases[i].softcap, cases[i].window) * 4);
        ops_cpu.attention_forward(kept, probs, q, k, v, row_start, B, T, nh, nkv, hd, cases[i].softcap, cases[i].window);
        ops_cpu.attention_forward(alone, NULL, q, k, v, row_start, B, T, nh, nkv, hd, cases[i].softcap, cases[i].window);
        EXPECT(!memcmp(kept, alone, nq * 4), "case %zu: other output without the saved probabilities", i);
        int *positions = xmalloc((size_t)B * T * sizeof(int));
        for (int b = 0; b < B; b++)
            for (int t = 0; t < T; t++) positions[b * T + t] = t > row_start[b] ? t - row_start[b] : 0;
        float *inv_freq = xmalloc((size_t)(hd / 2) * sizeof(float));
        for (int j = 0; j < hd / 2; j++) inv_freq[j] = powf(10000.0f, -2.0f * j / hd);
        ops_cpu.attention_forward_rotary(kept, probs, q, k, v, nh * hd, nkv * hd, row_start, positions, inv_freq, B, T,
                                         nh, nkv, hd, cases[i].softcap, cases[i].window);
        ops_cpu.attention_forward_rotary(alone, NULL, q, k, v, nh * hd, nkv * hd, row_start, positions, inv_freq, B, T,
                                         nh, nkv, hd, cases[i].softcap, cases[i].window);
        EXPECT(!memcmp(kept, alone, nq * 4), "case %zu: other rotary output without the saved probabilities", i);
        free(q), free(k), free(v), free(kept), free(alone), free(probs), free(positions), free(inv_freq);
    }
}

// ---- decode attention (no backward: checked against a double-precision reference) ----
// One query per row against a cache: head sizes that take the vector paths whole (64,
// 128), with a tail (80 = 64 + 16, 40), and the plain loops (8); grouped-query heads;
// rows starting at other slots; lengths from 1 to 700. The scores spread with a standard
// deviation of 3, so the softmax is sharp and its exponentials span a wide range.
// Tolerance 2e-5 absolute.
static void test_attention_decode(void) {
    const int head_dims[] = {64, 128, 80, 40, 8};
    const int lengths[] = {1, 37, 700};
    double worst = 0;
    for (int hd_i = 0; hd_i < 5; hd_i++) {
        for (int len_i = 0; len_i < 3; len_i++) {
            const int B = 3, n_heads = 6, n_kv_heads = 2, D = head_dims[hd_i], length = lengths[len_i];
            const int capacity = length + 5, kv_width = n_kv_heads * D, q_width = n_heads * D;
            int row_start[3] = {0, length / 2, length - 1};
            float *q = random_floats((long)B * q_width, -6, 6);
            float *k = random_floats((long)B * capacity * kv_width, -1.5f, 1.5f);
            float *v = random_floats((long)B * capacity * kv_width, -1, 1);
            float *out = xcalloc((size_t)B * q_width, sizeof(float));
            ops_cpu.attention_decode(out, q, k, v, row_start, B, capacity, length, n_heads, n_kv_heads, D, 0.0f, 0);
            double *scores = xmalloc((size_t)length * sizeof(double));
            for (int b = 0; b < B; b++)
                for (int h = 0; h < n_heads; h++) {
                    const int kv_head = h / (n_heads / n_kv_heads);
                    const float *query = q + (long)b * q_width + h * D;
                    double max_score = -INFINITY, sum = 0;
                    for (int j = row_start[b]; j < length; j++) {
                        scores[j] = dot(query, k + ((long)b * capacity + j) * kv_width + kv_head * D, D) / sqrt(D);
                        if (scores[j] > max_score) max_score = scores[j];
                    }
                    for (int j = row_start[b]; j < length; j++) sum += scores[j] = exp(scores[j] - max_score);
                    for (int d = 0; d < D; d++) {
                        double want = 0;
                        for (int j = row_start[b]; j < length; j++)
                            want += scores[j] / sum * v[((long)b * capacity + j) * kv_width + kv_head * D + d];
                        double error = fabs(want - out[(long)b * q_width + h * D + d]);
                        if (error > worst) worst = error;
                    }
                }
            free(q), free(k), free(v), free(out), free(scores);
        }
    }
    EXPECT(worst <= 2e-5, "decode attention differs from the double reference by %.3g", worst);
}

// attention_extend (a prompt continuing a cached prefix): query t of a row at slot
// first_slot + t attends to its row's slots [row_start, first_slot + t], float and half
// caches, against a double reference; its last query is attention_decode's answer within
// 2e-5 (the tiled extension sums in another order: tests/test_attention_decode.c).
static void test_attention_extend(void) {
    const int B = 2, T = 5, n_heads = 4, n_kv_heads = 2, D = 64, capacity = 120, first_slot = 90;
    const int kv_width = n_kv_heads * D, q_width = n_heads * D;
    int row_start[2] = {3, 60};
    float *q = random_floats((long)B * T * q_width, -6, 6);
    float *k = random_floats((long)B * capacity * kv_width, -1.5f, 1.5f), *v = random_floats((long)B * capacity * kv_width, -1, 1);
    uint16_t *k16 = xmalloc((size_t)B * capacity * kv_width * 2), *v16 = xmalloc((size_t)B * capacity * kv_width * 2);
    for (long i = 0; i < (long)B * capacity * kv_width; i++) {
        k16[i] = cpu_float_to_half(k[i]), v16[i] = cpu_float_to_half(v[i]);
    }
    float *out = xcalloc((size_t)B * T * q_width, sizeof(float)), *out16 = xcalloc((size_t)B * T * q_width, sizeof(float));
    ops_cpu.attention_extend(out, q, k, v, row_start, B, T, capacity, first_slot, n_heads, n_kv_heads, D, 0.0f, 0);
    ops_cpu.attention_extend_f16(out16, q, k16, v16, row_start, B, T, capacity, first_slot, n_heads, n_kv_heads, D, 0.0f, 0);
    double worst = 0, worst16 = 0, scores[128], scores16[128];
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int h = 0; h < n_heads; h++) {
                const int kv_head = h / (n_heads / n_kv_heads), last = first_slot + t;
                const float *query = q + ((long)b * T + t) * q_width + h * D;
                double max_score = -INFINITY, max16 = -INFINITY, sum = 0, sum16 = 0;
                for (int j = row_start[b]; j <= last; j++) {
                    const long at = ((long)b * capacity + j) * kv_width + kv_head * D;
                    double dot_qk = 0, dot16 = 0;
                    for (int d = 0; d < D; d++) {
                        dot_qk += (double)query[d] * k[at + d];
                        dot16 += (double)query[d] * cpu_half_to_float(k16[at + d]);
                    }
                    scores[j - row_start[b]] = dot_qk / sqrt(D), scores16[j - row_start[b]] = dot16 / sqrt(D);
                    if (scores[j - row_start[b]] > max_score) max_score = scores[j - row_start[b]];
                    if (scores16[j - row_start[b]] > max16) max16 = scores16[j - row_start[b]];
                }
                for (int j = 0; j <= last - row_start[b]; j++) {
                    sum += scores[j] = exp(scores[j] - max_score);
                    sum16 += scores16[j] = exp(scores16[j] - max16);
                }
                for (int d = 0; d < D; d++) {
                    double want = 0, want16 = 0;
                    for (int j = row_start[b]; j <= last; j++) {
                        const long at = ((long)b * capacity + j) * kv_width + kv_head * D + d;
                        want += scores[j - row_start[b]] / sum * v[at];
                        want16 += scores16[j - row_start[b]] / sum16 * cpu_half_to_float(v16[at]);
                    }
                    const long o = ((long)b * T + t) * q_width + h * D + d;
                    if (fabs(want - out[o]) > worst) worst = fabs(want - out[o]);
                    if (fabs(want16 - out16[o]) > worst16) worst16 = fabs(want16 - out16[o]);
                }
            }
    EXPECT(worst <= 2e-5 && worst16 <= 2e-5, "attention_extend differs from the double reference by %.3g (half %.3g)",
           worst, worst16);
    // The last query of each row is a decode step with length first_slot + T.
    float *q_last = xmalloc((size_t)B * q_width * sizeof(float)), *decoded = xcalloc((size_t)B * q_width, sizeof(float));
    for (int b = 0; b < B; b++) memcpy(q_last + (long)b * q_width, q + ((long)b * T + T - 1) * q_width, (size_t)q_width * 4);
    ops_cpu.attention_decode(decoded, q_last, k, v, row_start, B, capacity, first_slot + T, n_heads, n_kv_heads, D, 0.0f, 0);
    for (int b = 0; b < B; b++)
        for (int i = 0; i < q_width; i++)
            EXPECT_CLOSE(out[((long)b * T + T - 1) * q_width + i], decoded[(long)b * q_width + i], 2e-5, 0,
                         "the extension's last query against a decode step");
    free(q), free(k), free(v), free(k16), free(v16), free(out), free(out16), free(q_last), free(decoded);
}

// ---- the half-float KV cache ----
// Conversions: values whose halves are known (1, -2, 65504, the smallest normal and
// subnormal, ties to even at 1 + 2^-11 and 1 + 3 * 2^-11, 65520 and up to infinity, a
// subnormal tie), the round trip of every half, and (where the compiler has F16C) the
// hardware's conversion of 200,000 random floats, NaN only as NaN.
static void test_half_conversion(void) {
    const struct { float value; uint16_t half; } known[] = {
        {1.0f, 0x3C00}, {-2.0f, 0xC000}, {65504.0f, 0x7BFF}, {65519.0f, 0x7BFF}, {65520.0f, 0x7C00},
        {1e30f, 0x7C00}, {-INFINITY, 0xFC00}, {6.103515625e-05f, 0x0400}, {5.9604644775390625e-08f, 0x0001},
        {2.98023223876953125e-08f, 0x0000}, {8.940696716308594e-08f, 0x0002}, {1.00048828125f, 0x3C00},
        {1.00146484375f, 0x3C02}, {-0.0f, 0x8000}, {0.1f, 0x2E66}, {1e-10f, 0x0000},
    };
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
        EXPECT(cpu_float_to_half(known[i].value) == known[i].half, "%.9g -> 0x%04x, want 0x%04x", (double)known[i].value,
               cpu_float_to_half(known[i].value), known[i].half);
    EXPECT((cpu_float_to_half(NAN) & 0x7C00) == 0x7C00 && (cpu_float_to_half(NAN) & 0x3FF), "NaN is not NaN");
    for (uint32_t h = 0; h < 0x10000; h++) {
        const float value = cpu_half_to_float((uint16_t)h);
        if (isnan(value)) EXPECT((h & 0x7C00) == 0x7C00 && (h & 0x3FF), "0x%04x widened to NaN", h);
        else EXPECT(cpu_float_to_half(value) == h, "0x%04x -> %.9g -> 0x%04x", h, (double)value, cpu_float_to_half(value));
    }
#if defined(__F16C__)
    int mismatches = 0;
    for (int i = 0; i < 200000; i++) {
        rng_state = rng_state * 6364136223846793005ULL + 1442695040888963407ULL;
        uint32_t bits = (uint32_t)(rng_state >> 32);
        float value;
        memcpy(&value, &bits, sizeof value);
        const uint16_t hardware = _cvtss_sh(value, _MM_FROUND_TO_NEAREST_INT), portable = cpu_float_to_half(value);
        if (isnan(value) ? !((portable & 0x7C00) == 0x7C00 && (portable & 0x3FF)) : hardware != portable) mismatches++;
        if (!isnan(value)) EXPECT(cpu_half_to_float(hardware) == _cvtsh_ss(hardware), "widening 0x%04x", hardware);
    }
    EXPECT(mismatches == 0, "%d of 200000 conversions differ from F16C's", mismatches);
#endif
}

// cache_write_f16 stores each element's half; attention_decode_f16 equals the double
// reference over the halves' values (the cases of test_attention_decode).
static void test_attention_decode_f16(void) {
    const int head_dims[] = {64, 128, 80, 8};
    double worst = 0;
    for (int hd_i = 0; hd_i < 4; hd_i++) {
        const int B = 2, n_heads = 4, n_kv_heads = 2, D = head_dims[hd_i], length = 300, capacity = 310;
        const int kv_width = n_kv_heads * D, q_width = n_heads * D;
        int row_start[2] = {0, 123};
        float *q = random_floats((long)B * q_width, -6, 6);
        float *keys = random_floats((long)B * length * kv_width, -1.5f, 1.5f);
        float *values = random_floats((long)B * length * kv_width, -1, 1);
        uint16_t *k = xcalloc((size_t)B * capacity * kv_width, sizeof(uint16_t));
        uint16_t *v = xcalloc((size_t)B * capacity * kv_width, sizeof(uint16_t));
        ops_cpu.cache_write_f16(k, keys, B, length, capacity, 0, kv_width);
        ops_cpu.cache_write_f16(v, values, B, length, capacity, 0, kv_width);
        for (int b = 0; b < B; b++)
            for (long i = 0; i < (long)length * kv_width; i++)
                EXPECT(k[(long)b * capacity * kv_width + i] == cpu_float_to_half(keys[(long)b * length * kv_width + i]),
                       "cache_write_f16 row %d element %ld", b, i);
        float *out = xcalloc((size_t)B * q_width, sizeof(float));
        ops_cpu.attention_decode_f16(out, q, k, v, row_start, B, capacity, length, n_heads, n_kv_heads, D, 0.0f, 0);
        double *scores = xmalloc((size_t)length * sizeof(double));
        for (int b = 0; b < B; b++)
            for (int h = 0; h < n_heads; h++) {
                const int kv_head = h / (n_heads / n_kv_heads);
                double max_score = -INFINITY, sum = 0;
                for (int j = row_start[b]; j < length; j++) {
                    double dot_qk = 0;
                    for (int d = 0; d < D; d++)
                        dot_qk += (double)q[(long)b * q_width + h * D + d] *
                                  cpu_half_to_float(k[((long)b * capacity + j) * kv_width + kv_head * D + d]);
                    scores[j] = dot_qk / sqrt(D);
                    if (scores[j] > max_score) max_score = scores[j];
                }
                for (int j = row_start[b]; j < length; j++) sum += scores[j] = exp(scores[j] - max_score);
                for (int d = 0; d < D; d++) {
                    double want = 0;
                    for (int j = row_start[b]; j < length; j++)
                        want += scores[j] / sum * cpu_half_to_float(v[((long)b * capacity + j) * kv_width + kv_head * D + d]);
                    double error = fabs(want - out[(long)b * q_width + h * D + d]);
                    if (error > worst) worst = error;
                }
            }
        free(q), free(keys), free(values), free(k), free(v), free(out), free(scores);
    }
    EXPECT(worst <= 2e-5, "half-cache decode attention differs from the double reference by %.3g", worst);
}

// ---- the Q8_0 KV cache ----
// Head sizes that take the vector paths whole (64, 128), with a 16-lane tail (80) or a
// shorter last block (40, 24: Qwen3's fixture, 8), a half-block head (16), and 3 heads of
// 10 (30 values: 2 bytes of padding before the scales).
static const struct { int n_kv_heads, head_dim; } q8_cache_shapes[] = {{2, 64}, {2, 128}, {2, 80}, {2, 40},
                                                                        {2, 24}, {2, 16}, {2, 8},   {3, 10}};
enum { Q8_CACHE_SHAPES = sizeof q8_cache_shapes / sizeof q8_cache_shapes[0] };

// The values of a Q8_0 cache of `slots` slots, dequantized (value times its block's scale).
static float *dequantize_q8_cache(const void *cache, long slots, int n_kv_heads, int head_dim) {
    const long record = kv_q8_slot_bytes(n_kv_heads, head_dim), values_bytes = kv_q8_values_bytes(n_kv_heads, head_dim);
    const int width = n_kv_heads * head_dim, blocks = kv_q8_blocks_per_head(head_dim);
    float *out = xmalloc((size_t)slots * width * sizeof(float));
    for (long s = 0; s < slots; s++) {
        const int8_t *values = (const int8_t *)((const char *)cache + s * record);
        const float *scales = (const float *)((const char *)cache + s * record + values_bytes);
        for (int h = 0; h < n_kv_heads; h++)
            for (int d = 0; d < head_dim; d++)
                out[s * width + h * head_dim + d] = values[h * head_dim + d] * scales[h * blocks + d / Q8_BLOCK];
    }
    return out;
}

// cache_write_q8 into slots [5, 5 + T) of rows of 20: each block's scale is its largest
// magnitude / 127, every value within half a step (scale / 2) of its float, the padding
// zero, and the slots before and after untouched.
static void test_cache_write_q8(void) {
    for (int s = 0; s < Q8_CACHE_SHAPES; s++) {
        const int KV = q8_cache_shapes[s].n_kv_heads, D = q8_cache_shapes[s].head_dim, B = 2, T = 7, capacity = 20;
        const int width = KV * D, blocks = kv_q8_blocks_per_head(D), first = 5;
        const long record = kv_q8_slot_bytes(KV, D), values_bytes = kv_q8_values_bytes(KV, D);
        float *x = random_floats((long)B * T * width, -2, 2);
        for (int d = 0; d < D; d++) x[d] = 0.0f; // an all-zero head: scale 0, values 0
        char *cache = xmalloc((size_t)B * capacity * record);
        memset(cache, 0x5A, (size_t)B * capacity * record);
        ops_cpu.cache_write_q8(cache, x, B, T, capacity, first, KV, D);
        double worst_step = 0; // the largest error in units of the block's scale
        for (int b = 0; b < B; b++)
            for (int slot = 0; slot < capacity; slot++) {
                const char *rec = cache + ((long)b * capacity + slot) * record;
                if (slot < first || slot >= first + T) {
                    bool untouched = true;
                    for (long i = 0; i < record; i++) untouched &= rec[i] == 0x5A;
                    EXPECT(untouched, "shape %d: row %d slot %d outside the written ones changed", s, b, slot);
                    continue;
                }
                const int8_t *values = (const int8_t *)rec;
                const float *scales = (const float *)(rec + values_bytes);
                const float *source = x + ((long)b * T + slot - first) * width;
                for (long i = width; i < values_bytes; i++) EXPECT(rec[i] == 0, "shape %d: padding byte %ld", s, i);
                for (int h = 0; h < KV; h++)
                    for (int k = 0; k < blocks; k++) {
                        const int d0 = k * Q8_BLOCK, d1 = d0 + Q8_BLOCK < D ? d0 + Q8_BLOCK : D;
                        float largest = 0;
                        for (int d = d0; d < d1; d++) largest = fmaxf(largest, fabsf(source[h * D + d]));
                        const float scale = scales[h * blocks + k];
                        EXPECT(scale == largest / 127.0f, "shape %d: scale %.9g, want %.9g", s, scale, largest / 127.0f);
                        for (int d = d0; d < d1; d++) {
                            const double error = fabs((double)values[h * D + d] * scale - source[h * D + d]);
                            if (scale == 0) EXPECT(values[h * D + d] == 0, "shape %d: a zero block's value", s);
                            else if (error / scale > worst_step) worst_step = error / scale;
                        }
                    }
            }
        EXPECT(worst_step <= 0.5 + 1e-5, "shape %d (%d heads of %d): a value is %.4g steps from its float", s, KV, D,
               worst_step);
        free(x), free(cache);
    }
}

// A double-precision decode or extension for query rows q ([B * T, n_heads * D]) against
// float caches k, v ([B, capacity, n_kv_heads * D]), query t of row b at slot first_slot + t.
static void attention_reference(double *out, const float *q, const float *k, const float *v, const int *row_start,
                                int B, int T, int capacity, int first_slot, int n_heads, int n_kv_heads, int D) {
    const int kv_width = n_kv_heads * D, q_width = n_heads * D;
    double *scores = xmalloc((size_t)(first_slot + T) * sizeof(double));
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int h = 0; h < n_heads; h++) {
                const int kv_head = h / (n_heads / n_kv_heads), last = first_slot + t;
                const float *query = q + ((long)b * T + t) * q_width + h * D;
                double max_score = -INFINITY, sum = 0;
                for (int j = row_start[b]; j <= last; j++) {
                    scores[j] = dot(query, k + ((long)b * capacity + j) * kv_width + kv_head * D, D) / sqrt(D);
                    if (scores[j] > max_score) max_score = scores[j];
                }
                for (int j = row_start[b]; j <= last; j++) sum += scores[j] = exp(scores[j] - max_score);
                for (int d = 0; d < D; d++) {
                    double want = 0;
                    for (int j = row_start[b]; j <= last; j++)
                        want += scores[j] / sum * v[((long)b * capacity + j) * kv_width + kv_head * D + d];
                    out[((long)b * T + t) * q_width + h * D + d] = want;
                }
            }
    free(scores);
}

// A bound on how far attention over the quantized cache can be from attention over the
// floats it was made from, for one (row, query, head): with every score off by at most
// e = sum_d |q_d| * (its key's scale / 2) / sqrt(D), each softmax weight is off by a factor
// within [exp(-2e), exp(2e)], so the weights move by at most exp(2e) - 1 in all; and each
// value by at most half its block's step.
static double q8_attention_bound(const float *query, const float *k_scales_max, const float *v_steps_max, int D) {
    double e = 0;
    for (int d = 0; d < D; d++) e += fabs(query[d]) * k_scales_max[d] / 2;
    e /= sqrt(D);
    double value_error = 0;
    for (int d = 0; d < D; d++) value_error = fmax(value_error, v_steps_max[d] / 2);
    const double largest_value = 127 * 2 * value_error; // a value is at most 127 steps
    return (exp(2 * e) - 1) * largest_value + value_error;
}

// attention_decode_q8 and attention_extend_q8, for the shapes above, rows starting at other
// slots: against the double reference over the dequantized cache (2e-5, as the float
// kernels), and against the same reference over the floats the cache was made from,
// within q8_attention_bound (the queries spread to +-6 and the keys to +-1.5: sharp
// softmaxes, where key errors matter most). The extension's last query is the decode step
// within 2e-5.
static void test_attention_q8(void) {
    double worst_dequantized = 0, worst_over_bound = 0, worst_float = 0;
    for (int s = 0; s < Q8_CACHE_SHAPES; s++) {
        const int KV = q8_cache_shapes[s].n_kv_heads, D = q8_cache_shapes[s].head_dim, H = 2 * KV, B = 2, T = 4;
        const int length = 150, capacity = 160, first_slot = length - T;
        const int kv_width = KV * D, q_width = H * D;
        const long record = kv_q8_slot_bytes(KV, D);
        int row_start[2] = {0, 77};
        float *q = random_floats((long)B * T * q_width, -6, 6);
        float *keys = random_floats((long)B * capacity * kv_width, -1.5f, 1.5f);
        float *values = random_floats((long)B * capacity * kv_width, -1, 1);
        char *k = xcalloc((size_t)B * capacity, (size_t)record), *v = xcalloc((size_t)B * capacity, (size_t)record);
        // Written as one slot per row at a time (decode steps) and as several (a prefill) alike.
        ops_cpu.cache_write_q8(k, keys, B, capacity, capacity, 0, KV, D);
        for (int b = 0; b < B; b++)
            for (int slot = 0; slot < capacity; slot++)
                ops_cpu.cache_write_q8(v + ((long)b * capacity + slot) * record,
                                       values + ((long)b * capacity + slot) * kv_width, 1, 1, 1, 0, KV, D);
        float *k_deq = dequantize_q8_cache(k, (long)B * capacity, KV, D);
        float *v_deq = dequantize_q8_cache(v, (long)B * capacity, KV, D);
        float *out = xcalloc((size_t)B * T * q_width, sizeof(float));
        double *want = xmalloc((size_t)B * T * q_width * sizeof(double));
        double *want_float = xmalloc((size_t)B * T * q_width * sizeof(double));
        ops_cpu.attention_extend_q8(out, q, k, v, row_start, B, T, capacity, first_slot, H, KV, D, 0.0f, 0);
        attention_reference(want, q, k_deq, v_deq, row_start, B, T, capacity, first_slot, H, KV, D);
        attention_reference(want_float, q, keys, values, row_start, B, T, capacity, first_slot, H, KV, D);
        // Each head's largest block scale of keys and of values over its row's slots, per element.
        float *k_scale_max = xcalloc((size_t)B * kv_width, sizeof(float)), *v_step_max = xcalloc((size_t)B * kv_width, sizeof(float));
        for (int b = 0; b < B; b++)
            for (int slot = row_start[b]; slot < length; slot++)
                for (int h = 0; h < KV; h++)
                    for (int k0 = 0; k0 < D; k0 += Q8_BLOCK) {
                        const int k1 = k0 + Q8_BLOCK < D ? k0 + Q8_BLOCK : D;
                        float key_largest = 0, value_largest = 0;
                        const long at = ((long)b * capacity + slot) * kv_width + h * D;
                        for (int d = k0; d < k1; d++) {
                            key_largest = fmaxf(key_largest, fabsf(keys[at + d]));
                            value_largest = fmaxf(value_largest, fabsf(values[at + d]));
                        }
                        for (int d = k0; d < k1; d++) {
                            float *ks = &k_scale_max[(long)b * kv_width + h * D + d], *vs = &v_step_max[(long)b * kv_width + h * D + d];
                            *ks = fmaxf(*ks, key_largest / 127), *vs = fmaxf(*vs, value_largest / 127);
                        }
                    }
        for (int b = 0; b < B; b++)
            for (int t = 0; t < T; t++)
                for (int h = 0; h < H; h++) {
                    const long o = ((long)b * T + t) * q_width + h * D;
                    const int kv_head = h / (H / KV);
                    const double bound = q8_attention_bound(q + o, k_scale_max + (long)b * kv_width + kv_head * D,
                                                            v_step_max + (long)b * kv_width + kv_head * D, D);
                    for (int d = 0; d < D; d++) {
                        worst_dequantized = fmax(worst_dequantized, fabs(want[o + d] - out[o + d]));
                        worst_float = fmax(worst_float, fabs(want_float[o + d] - out[o + d]));
                        worst_over_bound = fmax(worst_over_bound, fabs(want_float[o + d] - out[o + d]) / bound);
                    }
                }
        // The last query of each row is a decode step of length first_slot + T.
        float *q_last = xmalloc((size_t)B * q_width * sizeof(float)), *decoded = xcalloc((size_t)B * q_width, sizeof(float));
        for (int b = 0; b < B; b++)
            memcpy(q_last + (long)b * q_width, q + ((long)b * T + T - 1) * q_width, (size_t)q_width * sizeof(float));
        ops_cpu.attention_decode_q8(decoded, q_last, k, v, row_start, B, capacity, first_slot + T, H, KV, D, 0.0f, 0);
        for (int b = 0; b < B; b++)
            for (int i = 0; i < q_width; i++)
                EXPECT_CLOSE(out[((long)b * T + T - 1) * q_width + i], decoded[(long)b * q_width + i], 2e-5, 0,
                             "the extension's last query against a decode step");
        free(q), free(keys), free(values), free(k), free(v), free(k_deq), free(v_deq), free(out), free(want);
        free(want_float), free(k_scale_max), free(v_step_max), free(q_last), free(decoded);
    }
    printf("# q8_0 cache attention: %.3g from the dequantized cache, %.3g from the floats (%.2f of the bound)\n",
           worst_dequantized, worst_float, worst_over_bound);
    EXPECT(worst_dequantized <= 2e-5, "q8_0-cache attention differs from the double reference over its values by %.3g",
           worst_dequantized);
    EXPECT(worst_over_bound <= 1.0, "q8_0-cache attention is %.3g times its error bound from the float cache's",
           worst_over_bound);
}

// ---- activations ----
typedef struct { long n; int kind; float *a, *b, *out, *R; } ActCase; // kind 0 gelu, 1 swiglu, 2 geglu
static double activation_loss(void *p) {
    ActCase *c = p;
    if (c->kind == 0) ops_cpu.gelu_forward(c->out, c->a, c->n);
    else ops_cpu.glu_forward(c->out, c->a, c->b, c->n, c->kind == 2);
    return dot(c->out, c->R, c->n);
}
static void run_activation(int kind) {
    ActCase c = {.n = 64, .kind = kind};
    c.a = random_floats(c.n, -4, 4), c.b = random_floats(c.n, -2, 2);
    c.out = xcalloc(c.n, 4), c.R = random_floats(c.n, -1, 1);
    // The outputs start as garbage: the activations' backward ops overwrite them (ops.h).
    float *da = random_floats(c.n, 5, 9), *db = random_floats(c.n, 5, 9);
    if (kind == 0) ops_cpu.gelu_backward(da, c.R, c.a, NULL, c.n);
    else ops_cpu.glu_backward(da, db, c.R, c.a, c.b, NULL, c.n, kind == 2);
    check_gradient("activation d(first input)", activation_loss, &c, c.a, c.n, da, 64);
    if (kind) check_gradient("activation d(up)", activation_loss, &c, c.b, c.n, db, 64);
    free(c.a), free(c.b), free(c.out), free(c.R), free(da), free(db);
}
static void test_gelu(void) { run_activation(0); }
static void test_swiglu(void) { run_activation(1); }
static void test_geglu(void) { run_activation(2); }

// ---- stored buffers ----
// The CPU's check of hold_stored (ops/cpu/stored_inputs.c, on for this program: main): a
// stored buffer's values move aside at its first product or activation, which read them
// from then on (the forward's, and the backward's when held again as written), and the
// buffer holds NaN, so that a reader that is neither (here `accumulate`) turns NaN. A
// buffer no reader took before the release moves then.
static bool all_nan(const float *x, long n) {
    for (long i = 0; i < n; i++)
        if (!isnan(x[i])) return false;
    return true;
}

static void test_stored_buffers_check(void) {
    const int N = 5, I = 12, C = 7;
    const long n = (long)N * I;
    float *gate = random_floats(n, -2, 2), *up = random_floats(n, -2, 2), *w = random_floats((long)C * I, -1, 1);
    float *act = xcalloc(n, 4), *want_act = xcalloc(n, 4), *out = xcalloc((long)N * C, 4), *want = xcalloc((long)N * C, 4);
    float *sum = xcalloc(n, 4);
    ops_cpu.glu_forward(want_act, gate, up, n, false);
    ops_cpu.matmul_forward(want, want_act, w, NULL, N, I, C);

    ops_cpu.hold_stored(act, n, false);
    ops_cpu.glu_forward(act, gate, up, n, false);
    ops_cpu.matmul_forward(out, act, w, NULL, N, I, C);
    EXPECT(!memcmp(out, want, (size_t)N * C * 4), "the product of a stored buffer reads its values");
    EXPECT(all_nan(act, n), "a stored buffer holds NaN once a product has read it");
    ops_cpu.accumulate(sum, act, n);
    EXPECT(all_nan(sum, n), "another reader of a stored buffer reads NaN");
    ops_cpu.matmul_input_release();

    memset(out, 0, (size_t)N * C * 4);
    ops_cpu.hold_stored(act, n, true); // the backward's hold of the forward's output
    ops_cpu.matmul_forward(out, act, w, NULL, N, I, C);
    EXPECT(!memcmp(out, want, (size_t)N * C * 4), "held again as written, a product reads the forward's values");
    ops_cpu.matmul_input_release();
    ops_cpu.matmul_forward(out, act, w, NULL, N, I, C); // no longer held: the buffer itself
    EXPECT(all_nan(out, (long)N * C), "after the release, a product reads the buffer");

    // Stored gate and up (written by products) as the activation's inputs; one left unread
    // until the release.
    float *product = xcalloc(n, 4), *x = random_floats((long)N * C, -1, 1), *w_up = random_floats((long)I * C, -1, 1);
    float *want_product = xcalloc(n, 4), *act2 = xcalloc(n, 4), *want_act2 = xcalloc(n, 4);
    ops_cpu.matmul_forward(want_product, x, w_up, NULL, N, C, I);
    ops_cpu.glu_forward(want_act2, gate, want_product, n, false);
    ops_cpu.hold_stored(product, n, false);
    ops_cpu.matmul_forward(product, x, w_up, NULL, N, C, I);
    ops_cpu.matmul_input_release();
    EXPECT(all_nan(product, n), "a stored buffer no reader took moves at the release");
    ops_cpu.hold_stored(product, n, true);
    ops_cpu.glu_forward(act2, gate, product, n, false);
    ops_cpu.matmul_input_release();
    EXPECT(!memcmp(act2, want_act2, (size_t)n * 4), "the activation reads a stored input's values");
    free(gate), free(up), free(w), free(act), free(want_act), free(out), free(want), free(sum);
    free(product), free(x), free(w_up), free(want_product), free(act2), free(want_act2);
}

// Runs this program again as `test_program argument [second]` (a fresh process: OpenMP's
// threads do not survive a bare fork) and reads what it wrote to stderr into text (size
// bytes, NUL-terminated). Returns whether it exited with status 0.
static const char *test_program;
static bool run_self(const char *argument, const char *second, char *text, size_t size) {
    char path[1024];
    snprintf(path, sizeof path, "%s/test_ops_child_XXXXXX", getenv("MARLHF_TEST_TMP") ? getenv("MARLHF_TEST_TMP") : "/tmp");
    int fd = mkstemp(path);
    CHECK(fd >= 0, "cannot create %s", path);
    fflush(NULL);
    pid_t child = fork();
    if (child == 0) {
        dup2(fd, 2);
        execl(test_program, test_program, argument, second, (char *)NULL);
        _exit(127);
    }
    int status = 0;
    waitpid(child, &status, 0);
    memset(text, 0, size);
    ssize_t got = pread(fd, text, size - 1, 0);
    (void)got;
    close(fd);
    unlink(path);
    return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

// The check's refusals, each of something the GPU refuses (ops/cuda/matmul.cu): the body
// runs in a child (this program with --refuse NAME), which must die with an internal error
// naming it.
static void expect_refused(const char *body, const char *what) {
    char text[2048];
    EXPECT(!run_self("--refuse", body, text, sizeof text), "%s: not refused", what);
    EXPECT(strstr(text, what), "%s: the error does not name it: %s", what, text);
}

enum { REFUSED_N = 4, REFUSED_IN = 8, REFUSED_OUT = 4 };
static float refused_in[REFUSED_N * REFUSED_IN], refused_out[REFUSED_N * REFUSED_OUT];
static float refused_w[REFUSED_OUT * REFUSED_IN], refused_dw[REFUSED_OUT * REFUSED_IN], refused_bias[REFUSED_OUT];

static void residual_into_stored(void) {
    ops_cpu.hold_stored(refused_out, REFUSED_N * REFUSED_OUT, false);
    ops_cpu.matmul_forward_residual(refused_out, refused_in, refused_w, NULL, refused_out, REFUSED_N, REFUSED_IN,
                                    REFUSED_OUT);
}
static void accumulate_into_stored(void) {
    ops_cpu.hold_stored(refused_out, REFUSED_N * REFUSED_OUT, false);
    ops_cpu.matmul_accumulate(refused_out, refused_in, refused_w, REFUSED_N, REFUSED_IN, REFUSED_OUT);
}
static void bias_gradient_of_stored(void) {
    ops_cpu.hold_stored(refused_out, REFUSED_N * REFUSED_OUT, false);
    ops_cpu.matmul_forward(refused_out, refused_in, refused_w, NULL, REFUSED_N, REFUSED_IN, REFUSED_OUT);
    ops_cpu.matmul_backward(NULL, refused_dw, refused_bias, refused_out, refused_in, refused_w, REFUSED_N, REFUSED_IN,
                            REFUSED_OUT, WRITE_OVERWRITE, WRITE_OVERWRITE);
}
static void added_to_stored_gradient(void) {
    ops_cpu.hold_stored(refused_in, REFUSED_N * REFUSED_IN, false);
    ops_cpu.matmul_backward(refused_in, NULL, NULL, refused_out, refused_in, refused_w, REFUSED_N, REFUSED_IN,
                            REFUSED_OUT, WRITE_ADD, WRITE_OVERWRITE);
}
static void nine_holds(void) {
    static float buffers[OPS_HELD_INPUTS_MAX + 1][4];
    for (int i = 0; i <= OPS_HELD_INPUTS_MAX; i++) ops_cpu.matmul_input_hold(buffers[i], 4);
}

static const struct {
    const char *name;
    void (*body)(void);
    const char *error;
} refusals[] = {{"residual", residual_into_stored, "matmul_forward_residual into a stored buffer"},
                {"accumulate", accumulate_into_stored, "matmul_accumulate into a stored buffer"},
                {"bias-gradient", bias_gradient_of_stored, "a bias gradient of a stored output gradient"},
                {"added-gradient", added_to_stored_gradient, "a stored input gradient (hold_stored) added to"},
                {"nine-holds", nine_holds, "matmul inputs held at once"}};

// The child's side: runs the named body (returns 0 if it was not refused).
static int run_refused(const char *name) {
    for (size_t i = 0; i < sizeof refusals / sizeof refusals[0]; i++)
        if (!strcmp(refusals[i].name, name)) refusals[i].body();
    return 0;
}

static void test_stored_buffers_refusals(void) {
    for (size_t i = 0; i < sizeof refusals / sizeof refusals[0]; i++) expect_refused(refusals[i].name, refusals[i].error);
    // Holding the same buffer again takes no second entry.
    static float again[4];
    for (int i = 0; i <= OPS_HELD_INPUTS_MAX; i++) ops_cpu.matmul_input_hold(again, 4);
    ops_cpu.matmul_input_release();
}

// ---- embedding ----
typedef struct { int N, C, V, P; int *tokens, *positions; float *tok, *pos, *out, *R; float scale; } EmbCase;
static double embedding_loss(void *p) {
    EmbCase *c = p;
    ops_cpu.embedding_forward(c->out, c->tokens, c->positions, c->tok, c->pos, c->N, c->C, c->scale);
    return dot(c->out, c->R, (long)c->N * c->C);
}
static void test_embedding(void) {
    EmbCase c = {.N = 6, .C = 5, .V = 4, .P = 8, .scale = 1.7f};
    int tokens[6] = {0, 3, 3, 1, 0, 3}, positions[6] = {0, 1, 2, 0, 1, 7};
    c.tokens = tokens, c.positions = positions;
    c.tok = random_floats(c.V * c.C, -1, 1), c.pos = random_floats(c.P * c.C, -1, 1);
    c.out = xcalloc(c.N * c.C, 4), c.R = random_floats(c.N * c.C, -1, 1);
    float *dtok = xcalloc(c.V * c.C, 4), *dpos = xcalloc(c.P * c.C, 4);
    ops_cpu.embedding_backward(dtok, dpos, c.R, c.tokens, c.positions, c.N, c.C, c.scale);
    check_gradient("embedding dtok", embedding_loss, &c, c.tok, c.V * c.C, dtok, 100);
    check_gradient("embedding dpos", embedding_loss, &c, c.pos, c.P * c.C, dpos, 100);
    free(c.tok), free(c.pos), free(c.out), free(c.R), free(dtok), free(dpos);
}

// ---- log-probs and entropy ----
typedef struct { int N, V; int *targets; float *logits, *logp, *lse, *entropy, *Rl, *Re; } LogprobCase;
static double logprob_loss(void *p) {
    LogprobCase *c = p;
    ops_cpu.logprob_forward(c->logp, c->lse, NULL, c->entropy, c->logits, c->targets, c->N, c->V);
    return dot(c->logp, c->Rl, c->N) + dot(c->entropy, c->Re, c->N);
}
static void test_logprob(void) {
    LogprobCase c = {.N = 4, .V = 11};
    int targets[4] = {3, 0, 10, -1};
    c.targets = targets;
    c.logits = random_floats(c.N * c.V, -3, 3);
    c.logp = xcalloc(c.N, 4), c.lse = xcalloc(c.N, 4), c.entropy = xcalloc(c.N, 4);
    c.Rl = random_floats(c.N, -1, 1), c.Re = random_floats(c.N, -1, 1);
    logprob_loss(&c);
    EXPECT(c.logp[3] == 0.0f, "ignored target must give log-prob 0");
    float *grad = xmalloc(c.N * c.V * sizeof(float));
    memcpy(grad, c.logits, c.N * c.V * sizeof(float));
    ops_cpu.logprob_backward(grad, c.Rl, c.Re, c.targets, c.lse, c.N, c.V, 0.0f);
    check_gradient("logprob+entropy dlogits", logprob_loss, &c, c.logits, c.N * c.V, grad, 100);
    free(c.logits), free(c.logp), free(c.lse), free(c.entropy), free(c.Rl), free(c.Re), free(grad);
}

// ---- collision entropy (WPO's weights): -log sum_v p_v^2, against the softmax itself ----
static void test_collision_entropy(void) {
    enum { N = 5, V = 13 };
    float *logits = random_floats(N * V, -4, 4), collision[N];
    for (int v = 0; v < V; v++) logits[3 * V + v] = 0.0f;           // uniform: log V
    for (int v = 0; v < V; v++) logits[4 * V + v] += 3000.0f;       // far from 0: no overflow, the same as row 4 - 3000
    ops_cpu.collision_entropy_forward(collision, logits, N, V);
    for (int i = 0; i < N; i++) {
        const float *z = logits + (long)i * V;
        double largest = z[0], sum = 0, sum_squares = 0;
        for (int v = 1; v < V; v++) largest = fmax(largest, z[v]);
        for (int v = 0; v < V; v++) sum += exp(z[v] - largest);
        for (int v = 0; v < V; v++) sum_squares += (exp(z[v] - largest) / sum) * (exp(z[v] - largest) / sum);
        EXPECT_CLOSE(collision[i], -log(sum_squares), 1e-6, 1e-6, "collision entropy");
        EXPECT(collision[i] >= 0 && collision[i] <= log((double)V) + 1e-6, "row %d: %g outside [0, log V]", i,
               collision[i]);
    }
    EXPECT_CLOSE(collision[3], log((double)V), 1e-6, 0, "collision entropy of the uniform distribution");
    free(logits);
}

// ---- value head ----
typedef struct { int N, C; float *h, *w, *values, *R; } ValueCase;
static double value_loss(void *p) {
    ValueCase *c = p;
    ops_cpu.value_head_forward(c->values, c->h, c->w, c->N, c->C);
    return dot(c->values, c->R, c->N);
}
static void test_value_head(void) {
    ValueCase c = {.N = 5, .C = 9};
    c.h = random_floats(c.N * c.C, -1, 1), c.w = random_floats(c.C, -1, 1);
    c.values = xcalloc(c.N, 4), c.R = random_floats(c.N, -1, 1);
    float *dh = xcalloc(c.N * c.C, 4), *dw = xcalloc(c.C, 4);
    ops_cpu.value_head_backward(dh, dw, c.R, c.h, c.w, c.N, c.C);
    check_gradient("value head dhidden", value_loss, &c, c.h, c.N * c.C, dh, 100);
    check_gradient("value head dweight", value_loss, &c, c.w, c.C, dw, 100);
    free(c.h), free(c.w), free(c.values), free(c.R), free(dh), free(dw);
}

// ---- AdamW against a hand-computed step ----
static void test_adamw_update(void) {
    float p[2] = {1.0f, -2.0f}, g[2] = {0.5f, -0.25f}, m[2] = {0}, v[2] = {0};
    float lr = 0.1f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f;
    ops_cpu.adamw_update(p, g, m, v, 2, lr, b1, b2, eps, wd, 1 - b1, 1 - b2, 1.0f);
    // Step 1: m/bc1 = g, v/bc2 = g^2, so the update is lr * sign(g) (up to eps).
    EXPECT_CLOSE(p[0], 1.0 * (1 - lr * wd) - lr, 1e-6, 0, "adamw p[0]");
    EXPECT_CLOSE(p[1], -2.0 * (1 - lr * wd) + lr, 1e-6, 0, "adamw p[1]");
    float x[3] = {3, 4, 12};
    EXPECT_CLOSE(ops_cpu.sum_squares(x, 3), 169.0, 0, 0, "sum of squares");
}

// Inverted dropout: the documented mask (element i kept where word i % 4 of Philox block
// i / 4 reaches the threshold), kept values scaled by exactly 1 / (1 - p), a keep rate and
// mean within four standard deviations of 1 - p and 1, the same mask for the same key and
// another for another stream, and a backward that adds through the same mask.
static void test_dropout(void) {
    const long n = (1L << 20) + 3; // a partial last block
    const float p = 0.25f, keep_scale = 1.0f / (1.0f - p);
    const uint64_t seed = 1234, stream = 77;
    float *inp = random_floats(n, 0.5f, 1.5f), *out = xmalloc((size_t)n * sizeof(float));
    float *again = xmalloc((size_t)n * sizeof(float)), *other = xmalloc((size_t)n * sizeof(float));
    ops_cpu.dropout_forward(out, inp, n, p, seed, stream);
    ops_cpu.dropout_forward(again, inp, n, p, seed, stream);
    ops_cpu.dropout_forward(other, inp, n, p, seed, stream + 1);
    const uint32_t threshold = (uint32_t)(0.25 * 4294967296.0);
    long kept = 0, wrong_mask = 0, wrong_value = 0, differ = 0;
    double sum_ratio = 0;
    for (long i = 0; i < n; i++) {
        const bool keep = philox4x32(seed, stream, (uint64_t)(i / 4)).v[i % 4] >= threshold;
        wrong_mask += keep != (out[i] != 0.0f);
        wrong_value += keep && out[i] != inp[i] * keep_scale;
        kept += keep;
        sum_ratio += out[i] / inp[i];
        differ += (other[i] != 0.0f) != (out[i] != 0.0f);
    }
    EXPECT(wrong_mask == 0, "%ld elements off the documented mask", wrong_mask);
    EXPECT(wrong_value == 0, "%ld kept elements not scaled by 1 / (1 - p)", wrong_value);
    EXPECT(!memcmp(out, again, (size_t)n * sizeof(float)), "the same key gave another mask");
    const double sigma = sqrt(p * (1 - p) / n);
    EXPECT_CLOSE((double)kept / n, 1 - p, 4 * sigma, 0, "keep rate");
    EXPECT_CLOSE(sum_ratio / n, 1.0, 4 * sigma * keep_scale, 0, "mean of out / inp (inverted dropout is unbiased)");
    EXPECT_CLOSE((double)differ / n, 2 * p * (1 - p), 4 * sqrt(2 * p * (1 - p) / n), 0,
                 "masks of two streams disagree as independent masks do");

    // Backward: dinp += dout / (1 - p) through the same mask.
    float *dout = random_floats(n, -1, 1), *dinp = random_floats(n, -1, 1);
    float *dinp_before = xmalloc((size_t)n * sizeof(float)), *dropped_dout = xmalloc((size_t)n * sizeof(float));
    memcpy(dinp_before, dinp, (size_t)n * sizeof(float));
    ops_cpu.dropout_backward(dinp, dout, n, p, seed, stream);
    ops_cpu.dropout_forward(dropped_dout, dout, n, p, seed, stream);
    for (long i = 0; i < n; i++) dinp_before[i] += dropped_dout[i];
    EXPECT(test_max_abs_diff(dinp, dinp_before, n) <= 1e-6, "backward is not dinp + dropout(dout)");

    // p = 0 keeps everything as it is.
    ops_cpu.dropout_forward(out, inp, n, 0.0f, seed, stream);
    EXPECT(!memcmp(out, inp, (size_t)n * sizeof(float)), "p = 0 changed the input");
    free(inp), free(out), free(again), free(other), free(dout), free(dinp), free(dinp_before), free(dropped_dout);
}

// Uniform noise (NEFTune's): element i gets the documented value (word i % 4 of Philox block
// i / 4: its top 24 bits less 2^23, times magnitude / 2^23), within [-magnitude, magnitude);
// mean and variance within four standard deviations of a uniform's (0, magnitude^2 / 3); the
// same noise for the same key, independent noise for another stream.
static void test_uniform_noise_add(void) {
    const long n = (1L << 20) + 3; // a partial last block
    const float magnitude = 0.03f;
    const uint64_t seed = 1234, stream = 91;
    float *x = random_floats(n, -1, 1), *out = xmalloc((size_t)n * sizeof(float));
    float *again = xmalloc((size_t)n * sizeof(float)), *other = xmalloc((size_t)n * sizeof(float));
    memcpy(out, x, (size_t)n * sizeof(float)), memcpy(again, x, (size_t)n * sizeof(float));
    memcpy(other, x, (size_t)n * sizeof(float));
    ops_cpu.uniform_noise_add(out, n, magnitude, seed, stream);
    ops_cpu.uniform_noise_add(again, n, magnitude, seed, stream);
    ops_cpu.uniform_noise_add(other, n, magnitude, seed, stream + 1);
    long wrong = 0, outside = 0;
    double sum = 0, sum_squares = 0, product = 0;
    for (long i = 0; i < n; i++) {
        const uint32_t word = philox4x32(seed, stream, (uint64_t)(i / 4)).v[i % 4];
        const float noise = (float)((int32_t)(word >> 8) - (1 << 23)) * (magnitude / 8388608.0f);
        wrong += out[i] != x[i] + noise;
        outside += !(noise >= -magnitude && noise < magnitude);
        sum += noise, sum_squares += (double)noise * noise;
        product += (double)noise * (other[i] - x[i]);
    }
    EXPECT(wrong == 0, "%ld elements off the documented noise", wrong);
    EXPECT(outside == 0, "%ld noise values outside [-magnitude, magnitude)", outside);
    EXPECT(!memcmp(out, again, (size_t)n * sizeof(float)), "the same key gave other noise");
    const double variance = (double)magnitude * magnitude / 3; // a uniform on [-m, m)
    EXPECT_CLOSE(sum / n, 0.0, 4 * sqrt(variance / n), 0, "mean of the noise");
    // The variance of a squared uniform is 4 m^4 / 45.
    EXPECT_CLOSE(sum_squares / n, variance, 4 * sqrt(4.0 * pow(magnitude, 4) / 45 / n), 0, "variance of the noise");
    EXPECT_CLOSE(product / n, 0.0, 4 * variance / sqrt((double)n), 0, "two streams' noise is uncorrelated");
    free(x), free(out), free(again), free(other);
}

#if defined(__SANITIZE_ADDRESS__)
// The sanitizer build does not check the few-row matmul's loads one by one
// (core/sanitizer.h): it checks the ranges it reads before the loop. A weight buffer one
// float short must still be reported: this program runs itself with
// --short-weight-matmul (a fresh process: OpenMP's threads do not survive a bare fork),
// which must die with AddressSanitizer's heap-buffer-overflow report.
static int short_weight_matmul(void) {
    const int N = 2, IC = 16, OC = 8;
    float *weight = malloc(sizeof(float) * (OC * IC - 1));
    float inp[2 * 16] = {0}, out[2 * 8];
    for (int i = 0; i < OC * IC - 1; i++) weight[i] = 1;
    ops_cpu.matmul_forward(out, inp, weight, NULL, N, IC, OC);
    free(weight);
    return 0; // not reported: the parent fails the test
}

static void test_matmul_short_weight_is_reported(void) {
    char text[4096];
    EXPECT(!run_self("--short-weight-matmul", NULL, text, sizeof text), "the child finished without a report");
    EXPECT(strstr(text, "heap-buffer-overflow"), "no heap-buffer-overflow report: %s", text);
}
#endif

// ops/cpu/vector_math.h against double precision: tanh_one within 3 ulp on [-50, 50] (a
// fine grid, every float near 0.625 where the branches meet, tiny and huge arguments) and
// exp_nonpositive within 2 ulp on [-87, 0].
static double ulps(float got, double want) {
    const float rounded = (float)want;
    const double ulp = nextafterf(fabsf(rounded), INFINITY) - fabsf(rounded);
    return fabs((double)got - want) / (ulp > 0 ? ulp : 1e-45);
}
static void test_vector_math(void) {
    enum { N = 400001 };
    float *x = xmalloc(N * sizeof(float)), *y = xmalloc(N * sizeof(float));
    for (int i = 0; i < N; i++) x[i] = -50.0f + 100.0f * (float)i / (N - 1);
    x[0] = 1e-30f, x[1] = -3e-8f, x[2] = 1e-4f, x[3] = 1e30f, x[4] = -1e30f, x[5] = 0.0f;
    float near = 0.62f; // every float from 0.62 to 0.63
    for (int i = 6; i < N && near < 0.63f; i++, near = nextafterf(near, 1.0f)) x[i] = near;
#pragma omp simd
    for (int i = 0; i < N; i++) y[i] = tanh_one(x[i]);
    double worst = 0;
    for (int i = 0; i < N; i++) worst = fmax(worst, ulps(y[i], tanh((double)x[i])));
    printf("# tanh_one: %.2f ulp at most\n", worst);
    EXPECT(worst <= 3.0, "tanh_one is %.2f ulp from tanh", worst);
    EXPECT(tanh_one(0.0f) == 0.0f && tanh_one(1e30f) == 1.0f && tanh_one(-1e30f) == -1.0f, "tanh_one at 0 and +-inf");
    for (int i = 0; i < N; i++) x[i] = y[i] = -87.0f * (float)i / (N - 1);
    exp_nonpositive(y, N);
    worst = 0;
    for (int i = 0; i < N; i++) worst = fmax(worst, ulps(y[i], exp((double)x[i])));
    printf("# exp_nonpositive: %.2f ulp at most\n", worst);
    EXPECT(worst <= 2.0, "exp_nonpositive is %.2f ulp from exp", worst);
    free(x), free(y);
}

int main(int argc, char **argv) {
    test_program = argv[0];
#if defined(__SANITIZE_ADDRESS__)
    if (argc == 2 && !strcmp(argv[1], "--short-weight-matmul")) return short_weight_matmul();
#endif
    // The stored buffers' check (test_stored_buffers_check), before any op reads the setting.
    setenv("MARLHF_CHECK_STORED_INPUTS", "1", 1);
    if (argc == 3 && !strcmp(argv[1], "--refuse")) return run_refused(argv[2]);
    RUN(test_matmul);
#if defined(__SANITIZE_ADDRESS__)
    RUN(test_matmul_short_weight_is_reported);
#endif
    RUN(test_matmul_accumulate_and_scale);
    RUN(test_matmul_quantized);
    RUN(test_layernorm);
    RUN(test_rmsnorm);
    RUN(test_rmsnorm_plus_one);
    RUN(test_rope);
    RUN(test_attention);
    RUN(test_attention_rotary);
    RUN(test_attention_forward_without_saved);
    RUN(test_attention_decode);
    RUN(test_attention_extend);
    RUN(test_half_conversion);
    RUN(test_attention_decode_f16);
    RUN(test_cache_write_q8);
    RUN(test_attention_q8);
    RUN(test_gelu);
    RUN(test_swiglu);
    RUN(test_geglu);
    RUN(test_stored_buffers_check);
    RUN(test_stored_buffers_refusals);
    RUN(test_embedding);
    RUN(test_logprob);
    RUN(test_collision_entropy);
    RUN(test_value_head);
    RUN(test_adamw_update);
    RUN(test_dropout);
    RUN(test_uniform_noise_add);
    RUN(test_vector_math);
    TEST_EXIT();
}
