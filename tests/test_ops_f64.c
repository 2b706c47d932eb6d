// Finite-difference checks of every CPU op's backward in DOUBLE precision.
//
// The very source files of ops/cpu are compiled a second time in this test with `float`
// meaning `double` (and the float math and BLAS calls mapped to their double versions), so
// the kernels under test are the shipped ones, evaluated exactly enough that central
// differences (h = 1e-5) agree with the analytic backward to ~1e-8. Tolerance: 1e-6
// absolute + 1e-5 relative. tests/test_ops.c runs the same checks on the float build.
#include <cblas.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/check.h"
#include "test.h"

#define float double
#define VECTOR_MATH_EXACT // vector_math.h: libm's functions, in double here
#define expf exp
#define tanhf tanh
#define sqrtf sqrt
#define powf pow
#define cosf cos
#define sinf sin
#define cblas_sgemm cblas_dgemm
#define cblas_sgemv cblas_dgemv
#define fmaf fma
#define cpu_embedding_forward f64_embedding_forward
#define cpu_embedding_backward f64_embedding_backward
#define cpu_layernorm_forward f64_layernorm_forward
#define cpu_layernorm_backward f64_layernorm_backward
#define cpu_rmsnorm_forward f64_rmsnorm_forward
#define cpu_rmsnorm_backward f64_rmsnorm_backward
#define cpu_matmul_forward f64_matmul_forward
#define cpu_matmul_backward f64_matmul_backward
#define cpu_rope_forward f64_rope_forward
#define cpu_rope_backward f64_rope_backward
#define cpu_attention_forward f64_attention_forward
#define cpu_attention_backward f64_attention_backward
#define cpu_attention_saved_size f64_attention_saved_size
#define cpu_attention_decode f64_attention_decode
#define cpu_cache_write f64_cache_write
#define cpu_copy_rows f64_copy_rows
#define cpu_gelu_forward f64_gelu_forward
#define cpu_gelu_backward f64_gelu_backward
#define cpu_glu_forward f64_glu_forward
#define cpu_glu_backward f64_glu_backward
#define cpu_logprob_forward f64_logprob_forward
#define cpu_logprob_backward f64_logprob_backward
#define cpu_soft_cap_forward f64_soft_cap_forward
#define cpu_collision_entropy_forward f64_collision_entropy_forward
#define cpu_value_head_forward f64_value_head_forward
#define cpu_value_head_backward f64_value_head_backward
#define cpu_adamw_update f64_adamw_update
#define cpu_sum_squares f64_sum_squares
#include "../src/ops/cpu/activation.c"
#include "../src/ops/cpu/adamw.c"
#include "../src/ops/cpu/attention.c"
#include "../src/ops/cpu/embedding.c"
#include "../src/ops/cpu/logprob.c"
// The batch-invariant matmul has no double form: the float64 checks take sgemm's path.
// (Defined here, after ops_cpu.h's declarations, which the includes above brought in.)
#define cpu_matmul_batch_invariant() false
#define cpu_matmul_fixed_order(out, out_stride, inp, weight, N, IC, OC, accumulate) ((void)0)
#include "../src/ops/cpu/matmul.c"
#include "../src/ops/cpu/norm.c"
#include "../src/ops/cpu/rope.c"
#undef float

static uint64_t rng_state = 12345;
static double uniform(double lo, double hi) {
    rng_state = rng_state * 6364136223846793005ULL + 1442695040888963407ULL;
    return lo + (hi - lo) * ((rng_state >> 11) / (double)(1ULL << 53));
}
static double *random_doubles(long n, double lo, double hi) {
    double *x = xmalloc((size_t)n * sizeof(double));
    for (long i = 0; i < n; i++) x[i] = uniform(lo, hi);
    return x;
}
static double dot(const double *a, const double *b, long n) {
    double s = 0;
    for (long i = 0; i < n; i++) s += (double)a[i] * b[i];
    return s;
}

typedef double (*LossFn)(void *ctx);

// Compares analytic[i] with the central difference of loss() w.r.t. x[i] at up to
// `samples` indices (all when n <= samples).
static void check_gradient(const char *what, LossFn loss, void *ctx, double *x, long n,
                           const double *analytic, int samples) {
    const double h = 1e-5;
    int failures = 0;
    for (int s = 0; s < (n < samples ? n : samples); s++) {
        long i = n <= samples ? s : (long)(uniform(0, 1) * n) % n;
        double saved = x[i];
        x[i] = saved + h;
        double plus = loss(ctx);
        x[i] = saved - h;
        double minus = loss(ctx);
        x[i] = saved;
        double numeric = (plus - minus) / (2.0 * h);
        double tol = 1e-6 + 1e-5 * fabs(numeric);
        if (!(fabs(numeric - analytic[i]) <= tol)) {
            if (failures++ < 3)
                fprintf(stderr, "  %s[%ld]: analytic %.6g, numeric %.6g\n", what, i,
                        (double)analytic[i], numeric);
            test_current_failures++;
        }
    }
}

// ---- matmul ----
typedef struct { int N, IC, OC; double *inp, *w, *b, *out, *R; } MatmulCase;
static double matmul_loss(void *p) {
    MatmulCase *c = p;
    f64_matmul_forward(c->out, c->inp, c->w, c->b, c->N, c->IC, c->OC);
    return dot(c->out, c->R, (long)c->N * c->OC);
}
static void test_matmul(void) {
    MatmulCase c = {.N = 5, .IC = 7, .OC = 3};
    c.inp = random_doubles(c.N * c.IC, -1, 1);
    c.w = random_doubles(c.OC * c.IC, -1, 1);
    c.b = random_doubles(c.OC, -1, 1);
    c.out = xcalloc(c.N * c.OC, sizeof(double));
    c.R = random_doubles(c.N * c.OC, -1, 1);
    double *dinp = xcalloc(c.N * c.IC, sizeof(double)), *dw = xcalloc(c.OC * c.IC, sizeof(double)), *db = xcalloc(c.OC, sizeof(double));
    f64_matmul_backward(dinp, dw, db, c.R, c.inp, c.w, c.N, c.IC, c.OC, WRITE_ADD, WRITE_ADD);
    check_gradient("matmul dinp", matmul_loss, &c, c.inp, c.N * c.IC, dinp, 100);
    check_gradient("matmul dweight", matmul_loss, &c, c.w, c.OC * c.IC, dw, 100);
    check_gradient("matmul dbias", matmul_loss, &c, c.b, c.OC, db, 100);
    free(c.inp), free(c.w), free(c.b), free(c.out), free(c.R), free(dinp), free(dw), free(db);
}

// ---- layernorm / rmsnorm ----
typedef struct { int N, C; bool rms, plus_one; double *inp, *w, *b, *out, *mean, *rstd, *R; } NormCase;
static double norm_loss(void *p) {
    NormCase *c = p;
    if (c->rms) f64_rmsnorm_forward(c->out, c->rstd, c->inp, c->w, c->N, c->C, 1e-5f, c->plus_one);
    else f64_layernorm_forward(c->out, c->mean, c->rstd, c->inp, c->w, c->b, c->N, c->C, 1e-5f);
    return dot(c->out, c->R, (long)c->N * c->C);
}
static void run_norm_case(bool rms, bool plus_one) {
    NormCase c = {.N = 4, .C = 24, .rms = rms, .plus_one = plus_one};
    c.inp = random_doubles(c.N * c.C, -2, 2);
    c.w = random_doubles(c.C, 0.5, 1.5);
    c.b = random_doubles(c.C, -0.5, 0.5);
    c.out = xcalloc(c.N * c.C, sizeof(double)), c.mean = xcalloc(c.N, sizeof(double)), c.rstd = xcalloc(c.N, sizeof(double));
    c.R = random_doubles(c.N * c.C, -1, 1);
    norm_loss(&c);
    double *dinp = xcalloc(c.N * c.C, sizeof(double)), *dw = xcalloc(c.C, sizeof(double)), *db = xcalloc(c.C, sizeof(double));
    if (rms) f64_rmsnorm_backward(dinp, dw, c.R, c.inp, c.w, c.rstd, c.N, c.C, plus_one);
    else f64_layernorm_backward(dinp, dw, db, c.R, c.inp, c.w, c.mean, c.rstd, c.N, c.C);
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
typedef struct { int N, heads, hd; int *pos; double *x, *work, *R, *inv_freq; } RopeCase;
static double rope_loss(void *p) {
    RopeCase *c = p;
    long n = (long)c->N * c->heads * c->hd;
    memcpy(c->work, c->x, n * sizeof(double));
    f64_rope_forward(c->work, c->pos, c->N, c->heads, c->hd, c->inv_freq);
    return dot(c->work, c->R, n);
}
static void test_rope(void) {
    RopeCase c = {.N = 6, .heads = 2, .hd = 8};
    long n = (long)c.N * c.heads * c.hd;
    int pos[6] = {0, 1, 2, 7, 30, 500};
    double inv_freq[4];
    for (int i = 0; i < 4; i++) inv_freq[i] = 1.0 / pow(10000.0, (double)(2 * i) / 8.0);
    c.pos = pos, c.inv_freq = inv_freq;
    c.x = random_doubles(n, -1, 1), c.work = xcalloc(n, sizeof(double)), c.R = random_doubles(n, -1, 1);
    double *dx = xmalloc(n * sizeof(double));
    memcpy(dx, c.R, n * sizeof(double));
    f64_rope_backward(dx, c.pos, c.N, c.heads, c.hd, c.inv_freq);
    check_gradient("rope dx", rope_loss, &c, c.x, n, dx, 200);
    free(c.x), free(c.work), free(c.R), free(dx);
}

// ---- attention (GQA, a left-padded row) ----
// softcap > 0: Gemma 2's soft-capped scores (cap tanh(s / cap) before the softmax); window >
// 0: a sliding window of that many keys (Mistral, Gemma 2/3's sliding layers).
typedef struct { int B, T, nh, nkv, hd; double softcap; int window; int *row_start; double *q, *k, *v, *out, *probs, *R; } AttnCase;
static double attention_loss(void *p) {
    AttnCase *c = p;
    f64_attention_forward(c->out, c->probs, c->q, c->k, c->v, c->row_start, c->B, c->T,
                              c->nh, c->nkv, c->hd, c->softcap, c->window);
    return dot(c->out, c->R, (long)c->B * c->T * c->nh * c->hd);
}
static void run_attention(double softcap, int window) {
    AttnCase c = {.B = 2, .T = 6, .nh = 4, .nkv = 2, .hd = 4, .softcap = softcap, .window = window};
    int row_start[2] = {0, 2};
    c.row_start = row_start;
    long nq = (long)c.B * c.T * c.nh * c.hd, nkv = (long)c.B * c.T * c.nkv * c.hd;
    // Under the cap (0.7), scores reach about 2: far into tanh's bend.
    c.q = random_doubles(nq, -1.5, 1.5), c.k = random_doubles(nkv, -1.5, 1.5), c.v = random_doubles(nkv, -1, 1);
    c.out = xcalloc(nq, sizeof(double)), c.probs = xcalloc((long)c.B * c.nh * c.T * c.T, sizeof(double));
    c.R = random_doubles(nq, -1, 1);
    // The loss only sees real query slots: padded queries have no keys.
    for (int t = 0; t < row_start[1]; t++)
        for (int j = 0; j < c.nh * c.hd; j++) c.R[((long)c.T + t) * c.nh * c.hd + j] = 0.0f;
    attention_loss(&c);
    double *dq = xmalloc(nq * sizeof(double)), *dk = xmalloc(nkv * sizeof(double)), *dv = xmalloc(nkv * sizeof(double));
    for (long i = 0; i < nq; i++) dq[i] = NAN; // overwritten by the op (ops.h)
    for (long i = 0; i < nkv; i++) dk[i] = dv[i] = NAN;
    f64_attention_backward(dq, dk, dv, c.R, NULL, c.probs, c.q, c.k, c.v, c.row_start, c.B, c.T,
                               c.nh, c.nkv, c.hd, c.softcap, c.window);
    check_gradient("attention dq", attention_loss, &c, c.q, nq, dq, 400);
    check_gradient("attention dk", attention_loss, &c, c.k, nkv, dk, 400);
    check_gradient("attention dv", attention_loss, &c, c.v, nkv, dv, 400);
    // Probabilities of a real query sum to one over the keys it may see (from the row's first
    // token, or the window's first key, to itself), and are exactly zero elsewhere.
    for (int b = 0; b < c.B; b++)
        for (int t = row_start[b]; t < c.T; t++) {
            const int first = window > 0 && t - window + 1 > row_start[b] ? t - window + 1 : row_start[b];
            double sum = 0, outside = 0;
            for (int j = 0; j < c.T; j++) {
                const double p = c.probs[((long)(b * c.nh + 0) * c.T + t) * c.T + j];
                if (j >= first && j <= t) sum += p;
                else outside += fabs(p);
            }
            EXPECT_CLOSE(sum, 1.0, 1e-6, 0, "row of attention probabilities");
            EXPECT(outside == 0.0, "row %d query %d: keys outside [%d, %d] got weight %g", b, t, first, t, outside);
        }
    free(c.q), free(c.k), free(c.v), free(c.out), free(c.probs), free(c.R), free(dq), free(dk), free(dv);
}
static void test_attention(void) { run_attention(0.0, 0); }
// Windows of 1 (each query alone), 2 and 3 keys over rows of 6 (one left-padded by 2).
static void test_attention_sliding_window(void) {
    for (int window = 1; window <= 3; window++) run_attention(0.0, window);
    run_attention(0.7, 3); // with Gemma 2's cap, as its sliding layers have
}
static void test_attention_soft_cap(void) {
    // The capped scores differ from the plain ones: the forward really applies the cap.
    AttnCase plain = {.B = 1, .T = 5, .nh = 2, .nkv = 1, .hd = 4}, capped = plain;
    capped.softcap = 0.7;
    long nq = (long)plain.T * plain.nh * plain.hd, nkv = (long)plain.T * plain.nkv * plain.hd;
    double *q = random_doubles(nq, -1.5, 1.5), *k = random_doubles(nkv, -1.5, 1.5), *v = random_doubles(nkv, -1, 1);
    double *out[2], *probs[2];
    for (int i = 0; i < 2; i++) {
        out[i] = xcalloc(nq, sizeof(double)), probs[i] = xcalloc((long)plain.nh * plain.T * plain.T, sizeof(double));
        f64_attention_forward(out[i], probs[i], q, k, v, NULL, 1, plain.T, plain.nh, plain.nkv, plain.hd,
                              i ? capped.softcap : 0.0, 0);
    }
    // Query 1 of head 0: two keys, scores s0, s1 -> p1 = 1 / (1 + exp(c(s0) - c(s1))).
    double s[2];
    for (int j = 0; j < 2; j++) {
        s[j] = 0;
        for (int d = 0; d < plain.hd; d++) s[j] += q[(long)1 * plain.nh * plain.hd + d] * k[(long)j * plain.hd + d];
        s[j] /= 2.0; // 1 / sqrt(4)
        s[j] = 0.7 * tanh(s[j] / 0.7);
    }
    EXPECT_CLOSE(probs[1][1 * plain.T + 1], 1.0 / (1.0 + exp(s[0] - s[1])), 1e-12, 0, "capped probability by hand");
    EXPECT(fabs(probs[1][1 * plain.T + 1] - probs[0][1 * plain.T + 1]) > 1e-3, "the cap changed no probability");
    for (int i = 0; i < 2; i++) free(out[i]), free(probs[i]);
    free(q), free(k), free(v);
    run_attention(0.7, 0);
}

// ---- activations ----
typedef struct { long n; int kind; double *a, *b, *out, *R; } ActCase; // kind 0 gelu, 1 swiglu, 2 geglu
static double activation_loss(void *p) {
    ActCase *c = p;
    if (c->kind == 0) f64_gelu_forward(c->out, c->a, c->n);
    else f64_glu_forward(c->out, c->a, c->b, c->n, c->kind == 2);
    return dot(c->out, c->R, c->n);
}
static void run_activation(int kind) {
    ActCase c = {.n = 64, .kind = kind};
    c.a = random_doubles(c.n, -4, 4), c.b = random_doubles(c.n, -2, 2);
    c.out = xcalloc(c.n, sizeof(double)), c.R = random_doubles(c.n, -1, 1);
    double *da = xcalloc(c.n, sizeof(double)), *db = xcalloc(c.n, sizeof(double));
    if (kind == 0) f64_gelu_backward(da, c.R, c.a, NULL, c.n);
    else f64_glu_backward(da, db, c.R, c.a, c.b, NULL, c.n, kind == 2);
    check_gradient("activation d(first input)", activation_loss, &c, c.a, c.n, da, 64);
    if (kind) check_gradient("activation d(up)", activation_loss, &c, c.b, c.n, db, 64);
    free(c.a), free(c.b), free(c.out), free(c.R), free(da), free(db);
}
static void test_gelu(void) { run_activation(0); }
static void test_swiglu(void) { run_activation(1); }
static void test_geglu(void) { run_activation(2); }

// ---- embedding ----
typedef struct { int N, C, V, P; int *tokens, *positions; double *tok, *pos, *out, *R; double scale; } EmbCase;
static double embedding_loss(void *p) {
    EmbCase *c = p;
    f64_embedding_forward(c->out, c->tokens, c->positions, c->tok, c->pos, c->N, c->C, c->scale);
    return dot(c->out, c->R, (long)c->N * c->C);
}
static void test_embedding(void) {
    EmbCase c = {.N = 6, .C = 5, .V = 4, .P = 8, .scale = 1.7f};
    int tokens[6] = {0, 3, 3, 1, 0, 3}, positions[6] = {0, 1, 2, 0, 1, 7};
    c.tokens = tokens, c.positions = positions;
    c.tok = random_doubles(c.V * c.C, -1, 1), c.pos = random_doubles(c.P * c.C, -1, 1);
    c.out = xcalloc(c.N * c.C, sizeof(double)), c.R = random_doubles(c.N * c.C, -1, 1);
    double *dtok = xcalloc(c.V * c.C, sizeof(double)), *dpos = xcalloc(c.P * c.C, sizeof(double));
    f64_embedding_backward(dtok, dpos, c.R, c.tokens, c.positions, c.N, c.C, c.scale);
    check_gradient("embedding dtok", embedding_loss, &c, c.tok, c.V * c.C, dtok, 100);
    check_gradient("embedding dpos", embedding_loss, &c, c.pos, c.P * c.C, dpos, 100);
    free(c.tok), free(c.pos), free(c.out), free(c.R), free(dtok), free(dpos);
}

// ---- log-probs and entropy ----
typedef struct { int N, V; int *targets; double *logits, *logp, *lse, *entropy, *Rl, *Re; } LogprobCase;
static double logprob_loss(void *p) {
    LogprobCase *c = p;
    f64_logprob_forward(c->logp, c->lse, NULL, c->entropy, c->logits, c->targets, c->N, c->V);
    return dot(c->logp, c->Rl, c->N) + dot(c->entropy, c->Re, c->N);
}
static void test_logprob(void) {
    LogprobCase c = {.N = 4, .V = 11};
    int targets[4] = {3, 0, 10, -1};
    c.targets = targets;
    c.logits = random_doubles(c.N * c.V, -3, 3);
    c.logp = xcalloc(c.N, sizeof(double)), c.lse = xcalloc(c.N, sizeof(double)), c.entropy = xcalloc(c.N, sizeof(double));
    c.Rl = random_doubles(c.N, -1, 1), c.Re = random_doubles(c.N, -1, 1);
    logprob_loss(&c);
    EXPECT(c.logp[3] == 0.0f, "ignored target must give log-prob 0");
    double *grad = xmalloc(c.N * c.V * sizeof(double));
    memcpy(grad, c.logits, c.N * c.V * sizeof(double));
    f64_logprob_backward(grad, c.Rl, c.Re, c.targets, c.lse, c.N, c.V, 0.0f);
    check_gradient("logprob+entropy dlogits", logprob_loss, &c, c.logits, c.N * c.V, grad, 100);
    free(c.logits), free(c.logp), free(c.lse), free(c.entropy), free(c.Rl), free(c.Re), free(grad);
}

// Gemma 2's final soft cap: the loss of soft_cap_forward's logits, differentiated with respect
// to the raw logits by logprob_backward's softcap.
typedef struct { LogprobCase inner; double cap; double *capped; } CappedLogprobCase;
static double capped_logprob_loss(void *p) {
    CappedLogprobCase *c = p;
    long n = (long)c->inner.N * c->inner.V;
    memcpy(c->capped, c->inner.logits, n * sizeof(double));
    f64_soft_cap_forward(c->capped, n, c->cap);
    LogprobCase shown = c->inner;
    shown.logits = c->capped;
    return logprob_loss(&shown);
}
static void test_logprob_soft_cap(void) {
    CappedLogprobCase c = {.inner = {.N = 4, .V = 11}, .cap = 2.0};
    int targets[4] = {3, 0, 10, -1};
    c.inner.targets = targets;
    long n = (long)c.inner.N * c.inner.V;
    c.inner.logits = random_doubles(n, -4, 4); // past the cap: tanh bends
    c.capped = xmalloc(n * sizeof(double));
    c.inner.logp = xcalloc(c.inner.N, sizeof(double)), c.inner.lse = xcalloc(c.inner.N, sizeof(double));
    c.inner.entropy = xcalloc(c.inner.N, sizeof(double));
    c.inner.Rl = random_doubles(c.inner.N, -1, 1), c.inner.Re = random_doubles(c.inner.N, -1, 1);
    capped_logprob_loss(&c);
    for (long i = 0; i < n; i++) EXPECT(fabs(c.capped[i]) < 2.0, "a capped logit reached the cap");
    EXPECT_CLOSE(c.capped[5], 2.0 * tanh(c.inner.logits[5] / 2.0), 1e-15, 0, "capped logit by hand");
    double *grad = xmalloc(n * sizeof(double));
    memcpy(grad, c.capped, n * sizeof(double));
    f64_logprob_backward(grad, c.inner.Rl, c.inner.Re, c.inner.targets, c.inner.lse, c.inner.N, c.inner.V, c.cap);
    check_gradient("capped logprob+entropy d(raw logits)", capped_logprob_loss, &c, c.inner.logits, n, grad, 100);
    free(c.inner.logits), free(c.capped), free(c.inner.logp), free(c.inner.lse), free(c.inner.entropy);
    free(c.inner.Rl), free(c.inner.Re), free(grad);
}

// ---- value head ----
typedef struct { int N, C; double *h, *w, *values, *R; } ValueCase;
static double value_loss(void *p) {
    ValueCase *c = p;
    f64_value_head_forward(c->values, c->h, c->w, c->N, c->C);
    return dot(c->values, c->R, c->N);
}
static void test_value_head(void) {
    ValueCase c = {.N = 5, .C = 9};
    c.h = random_doubles(c.N * c.C, -1, 1), c.w = random_doubles(c.C, -1, 1);
    c.values = xcalloc(c.N, sizeof(double)), c.R = random_doubles(c.N, -1, 1);
    double *dh = xcalloc(c.N * c.C, sizeof(double)), *dw = xcalloc(c.C, sizeof(double));
    f64_value_head_backward(dh, dw, c.R, c.h, c.w, c.N, c.C);
    check_gradient("value head dhidden", value_loss, &c, c.h, c.N * c.C, dh, 100);
    check_gradient("value head dweight", value_loss, &c, c.w, c.C, dw, 100);
    free(c.h), free(c.w), free(c.values), free(c.R), free(dh), free(dw);
}

// ---- AdamW against a hand-computed step ----
static void test_adamw_update(void) {
    double p[2] = {1.0f, -2.0f}, g[2] = {0.5f, -0.25f}, m[2] = {0}, v[2] = {0};
    double lr = 0.1f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f;
    f64_adamw_update(p, g, m, v, 2, lr, b1, b2, eps, wd, 1 - b1, 1 - b2, 1.0f);
    // Step 1: m/bc1 = g, v/bc2 = g^2, so the update is lr * sign(g) (up to eps).
    EXPECT_CLOSE(p[0], 1.0 * (1 - lr * wd) - lr, 1e-6, 0, "adamw p[0]");
    EXPECT_CLOSE(p[1], -2.0 * (1 - lr * wd) + lr, 1e-6, 0, "adamw p[1]");
    double x[3] = {3, 4, 12};
    EXPECT_CLOSE(f64_sum_squares(x, 3), 169.0, 0, 0, "sum of squares");
}

int main(void) {
    RUN(test_matmul);
    RUN(test_layernorm);
    RUN(test_rmsnorm);
    RUN(test_rmsnorm_plus_one);
    RUN(test_rope);
    RUN(test_attention);
    RUN(test_attention_soft_cap);
    RUN(test_attention_sliding_window);
    RUN(test_gelu);
    RUN(test_swiglu);
    RUN(test_geglu);
    RUN(test_embedding);
    RUN(test_logprob);
    RUN(test_logprob_soft_cap);
    RUN(test_value_head);
    RUN(test_adamw_update);
    TEST_EXIT();
}
