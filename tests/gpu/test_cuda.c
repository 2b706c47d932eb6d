// The CUDA backend against the CPU backend (tests/gpu/run.sh runs this on a GPU machine;
// CI only compiles it). Every op forward and backward on fresh random inputs, then whole
// models: the fixture transformers' log-probs, loss and gradients, a value head, and
// generation with the KV cache on the GPU.
//
// Error measure: ||gpu - cpu|| / ||cpu|| over the whole output (relative L2). Tolerances:
//   TOL_FP32 = 1e-5  ops computed in fp32 on both sides (norms, RoPE, softmax rows,
//                    activations, log-probs, AdamW, ...): only summation order differs.
//   TOL_BF16 = 1e-2  ops whose products run on bf16 operands (matmul, attention): bf16
//                    keeps 8 bits of mantissa, 2^-8 = 4e-3 per operand.
//   TOL_MODEL = 3e-2 a whole model in bf16 products (errors add over layers).
//   TOL_BF16_ROW = 0.15  the attention checks' worst single head row (segment_error.h: its
//                    error over the larger of its norm and the rows' RMS), which a
//                    whole-tensor error would average a wrong row away in. Grounded in the
//                    CPU stand-in's bf16-rounded operands: worst 5.9e-2 (dq, T = 1000,
//                    head_dim 128; long rows that nearly cancel), the rest under 3e-2.
// Each check prints "# op: error (tolerance)" so the run leaves the measured figures.
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../q4_k_m_model.h"
#include "../segment_error.h"
#include "../test.h"
#include "core/check.h"
#include "gen/continuous.h"
#include "gen/generate.h"
#include "model/model.h"
#include "model/lora.h"
#include "model/quantize.h"
#include "model/weights_io.h"
#include "io/gguf_write.h"
#include "ops/cpu/ops_cpu.h"
#include "ops/kquant.h"
#include "ops/ops.h"

#define TOL_FP32 1e-5
#define TOL_BF16 1e-2
#define TOL_BF16_ROW 0.15
#define TOL_MODEL 3e-2

static const OpsBackend *gpu;
static bool standing_in; // MARLHF_GPU_TEST_DEVICE=cpu: the CPU's table is `gpu` (main)
static bool emulated;    // the CUDA backend on CPU threads (test_cuda_emulated, tests/emulated_cuda)
static const OpsBackend *cpu = &ops_cpu;
static unsigned long long random_state = 0x9E3779B97F4A7C15ull;

// ---------------------------------------------------------------------------------------
// The GPU's rounding on the CPU
//
// The GPU multiplies bf16 copies of its operands (fp32 accumulation): both sides of every
// linear layer, and in attention Q, K, V, the probabilities that multiply V, dO and dS.
// `bf16_rounding` is the CPU's table with exactly those operands rounded to bf16 first
// (round to nearest even, as cuda_to_bf16), so a model on it makes the GPU's rounding
// errors without any of its code. Some gradients are ill-conditioned under that rounding: a
// LoRA adapter's gradient is the weight's gradient projected on rank-r directions
// (dA = s B^T dW, dB = s dW A^T), and rounding noise spread over all of dW is not projected
// away with it; on the tiny fixtures the CPU with bf16 operands alone is 4e-2..1e-1 off its
// own float32 gradients there. compare_pair takes such a model as the measure of what the
// rounding does to each tensor.
static OpsBackend bf16_rounding;

static float round_bf16(float x) {
    uint32_t bits;
    memcpy(&bits, &x, sizeof bits);
    if ((bits & 0x7f800000u) == 0x7f800000u) return x; // inf, NaN
    bits += 0x7fffu + ((bits >> 16) & 1u);
    bits &= 0xffff0000u;
    memcpy(&x, &bits, sizeof x);
    return x;
}

static float *rounded_copy(const float *x, long n) {
    if (!x) return NULL;
    float *y = xmalloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    for (long i = 0; i < n; i++) y[i] = round_bf16(x[i]);
    return y;
}

// A product's input: a stored one's values as the CPU's products read them
// (ops/cpu/stored_inputs.c), rounded.
static float *rounded_input(const float *x, long n) { return rounded_copy(cpu_stored_input(x, n), n); }

// A product's output that is a stored buffer (gate's, up's, down's input gradient: the
// check of ops/cpu/stored_inputs.c on) is written as bf16 on the GPU: rounded here too.
static void round_if_stored(float *out, long n) {
    if (!cpu_stored_pending(out, n)) return;
    for (long i = 0; i < n; i++) out[i] = round_bf16(out[i]);
}

static void rounded_matmul_forward(float *out, const float *inp, const float *weight, const float *bias, int N,
                                   int IC, int OC) {
    float *x = rounded_input(inp, (long)N * IC), *w = rounded_copy(weight, (long)OC * IC);
    ops_cpu.matmul_forward(out, x, w, bias, N, IC, OC);
    round_if_stored(out, (long)N * OC);
    free(x), free(w);
}

static void rounded_matmul_accumulate(float *out, const float *inp, const float *weight, int N, int IC, int OC) {
    float *x = rounded_input(inp, (long)N * IC), *w = rounded_copy(weight, (long)OC * IC);
    ops_cpu.matmul_accumulate(out, x, w, N, IC, OC);
    free(x), free(w);
}

static void rounded_matmul_forward_residual(float *out, const float *inp, const float *weight, const float *bias,
                                            const float *residual, int N, int IC, int OC) {
    float *x = rounded_input(inp, (long)N * IC), *w = rounded_copy(weight, (long)OC * IC);
    ops_cpu.matmul_forward_residual(out, x, w, bias, residual, N, IC, OC);
    free(x), free(w);
}

// The bias gradient is a column sum of the float32 dout (a kernel of its own on the GPU).
static void rounded_matmul_backward(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                                    const float *weight, int N, int IC, int OC, WriteMode dinp_mode,
                                    WriteMode weight_mode) {
    float *g = rounded_input(dout, (long)N * OC), *x = rounded_input(inp, (long)N * IC);
    float *w = rounded_copy(weight, (long)OC * IC);
    ops_cpu.matmul_backward(dinp, dweight, NULL, g, x, w, N, IC, OC, dinp_mode, weight_mode);
    round_if_stored(dinp, (long)N * IC);
    if (dbias) ops_cpu.matmul_backward(NULL, NULL, dbias, dout, inp, weight, N, IC, OC, WRITE_ADD, weight_mode);
    free(g), free(x), free(w);
}

// A quantized weight: the GPU multiplies bf16 tiles of its dequantized rows.
static float *rounded_dequantized(const Q8Matrix *weight, int OC, int IC) {
    float *w = xmalloc((size_t)OC * IC * sizeof(float));
    ops_cpu.dequantize_rows(w, weight, 0, OC);
    for (long i = 0; i < (long)OC * IC; i++) w[i] = round_bf16(w[i]);
    return w;
}

static void rounded_matmul_forward_dequantized(float *out, const float *inp, const Q8Matrix *weight,
                                               const float *bias, int N, int IC, int OC) {
    float *x = rounded_input(inp, (long)N * IC), *w = rounded_dequantized(weight, OC, IC);
    ops_cpu.matmul_forward(out, x, w, bias, N, IC, OC);
    free(x), free(w);
}

static void rounded_matmul_backward_input_q8(float *dinp, const float *dout, const Q8Matrix *weight, int N, int IC,
                                             int OC) {
    float *g = rounded_copy(dout, (long)N * OC), *w = rounded_dequantized(weight, OC, IC);
    ops_cpu.matmul_backward(dinp, NULL, NULL, g, NULL, w, N, IC, OC, WRITE_ADD, WRITE_ADD);
    free(g), free(w);
}

// The CPU's probabilities from rounded Q and K, then O = bf16(P) bf16(V).
static void rounded_attention_forward(float *out, float *saved, const float *q, const float *k, const float *v,
                                      const int *row_start, int B, int T, int H, int KV, int D, float softcap, int window) {
    float *rq = rounded_copy(q, (long)B * T * H * D), *rk = rounded_copy(k, (long)B * T * KV * D);
    float *rv = rounded_copy(v, (long)B * T * KV * D);
    ops_cpu.attention_forward(out, saved, rq, rk, rv, row_start, B, T, H, KV, D, softcap, window);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++) {
            const float *P = saved + ((long)b * H + h) * T * T;
            const float *V = rv + (long)b * T * KV * D + h / (H / KV) * D;
            for (int t = 0; t < T; t++)
                for (int d = 0; d < D; d++) {
                    double sum = 0;
                    for (int j = 0; j <= t; j++) sum += (double)round_bf16(P[(long)t * T + j]) * V[(long)j * KV * D + d];
                    out[((long)b * T + t) * H * D + h * D + d] = (float)sum;
                }
        }
    free(rq), free(rk), free(rv);
}

// dP = bf16(dO) bf16(V)^T, dS = P (dP - dO.O) rounded, dQ = scale dS bf16(K),
// dK = scale dS^T bf16(Q), dV = bf16(P)^T bf16(dO); written over dq, dk, dv, as the op's
// contract says.
// Under a soft cap (the GPU's unfused path) the CPU's backward on rounded inputs.
static void rounded_attention_backward(float *dq, float *dk, float *dv, const float *dout, const float *out,
                                       const float *saved, const float *q, const float *k, const float *v,
                                       const int *row_start, int B, int T, int H, int KV, int D, float softcap, int window) {
    float *rq = rounded_copy(q, (long)B * T * H * D), *rk = rounded_copy(k, (long)B * T * KV * D);
    float *rv = rounded_copy(v, (long)B * T * KV * D), *rdo = rounded_copy(dout, (long)B * T * H * D);
    if (softcap > 0.0f) {
        ops_cpu.attention_backward(dq, dk, dv, rdo, out, saved, rq, rk, rv, row_start, B, T, H, KV, D, softcap, window);
        free(rq), free(rk), free(rv), free(rdo);
        return;
    }
    const double scale = 1.0 / sqrt((double)D);
    memset(dq, 0, (size_t)B * T * H * D * sizeof(float)); // the sums below add into them
    memset(dk, 0, (size_t)B * T * KV * D * sizeof(float));
    memset(dv, 0, (size_t)B * T * KV * D * sizeof(float));
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++) {
            const int kv_head = h / (H / KV), start = row_start ? row_start[b] : 0;
            const float *P = saved + ((long)b * H + h) * T * T;
            for (int t = start; t < T; t++) {
                const long qi = ((long)b * T + t) * H * D + h * D;
                double row_dot = 0;
                for (int d = 0; d < D; d++) row_dot += (double)dout[qi + d] * out[qi + d];
                const int first = window > 0 && t - window + 1 > start ? t - window + 1 : start; // sliding window
                for (int j = first; j <= t; j++) {
                    const long kj = ((long)b * T + j) * KV * D + kv_head * D;
                    double dp = 0;
                    for (int d = 0; d < D; d++) dp += (double)rdo[qi + d] * rv[kj + d];
                    const float p = P[(long)t * T + j], ds = round_bf16((float)(p * (dp - row_dot)));
                    for (int d = 0; d < D; d++) {
                        dq[qi + d] += (float)(scale * ds * rk[kj + d]);
                        dk[kj + d] += (float)(scale * ds * rq[qi + d]);
                        dv[kj + d] += round_bf16(p) * rdo[qi + d];
                    }
                }
            }
        }
    free(rq), free(rk), free(rv), free(rdo);
}

// The rotary attention ops (ops.h, attention_forward_rotary) on the rounded ones above, as
// the CPU composes them (ops/cpu/attention_rotary.c): q, k and v taken as rows of their own
// (copied out of a fused q | k | v buffer's columns, whatever their row strides), q and k
// rotated into copies, the rounded attention, and the backward's dq and dk rotated back,
// then the gradients copied into rows of the given strides. The GPU rounds the rotated Q
// and K, as these round the copies.

// N rows of `width` floats, `row_stride` apart in x, into a new buffer of their own.
static float *rows_of_their_own(const float *x, int N, int width, int row_stride) {
    float *rows = xmalloc((size_t)N * width * sizeof(float));
    for (long row = 0; row < N; row++) memcpy(rows + row * width, x + row * row_stride, (size_t)width * sizeof(float));
    return rows;
}

// The other way: N rows of `width` floats of their own into rows `row_stride` apart in x.
static void rows_into_strided(float *x, int row_stride, const float *rows, int N, int width) {
    for (long row = 0; row < N; row++) memcpy(x + row * row_stride, rows + row * width, (size_t)width * sizeof(float));
}

static void rotated_copies(float **q_rotated, float **k_rotated, const float *q, const float *k, const int *positions,
                           const float *inv_freq, int N, int H, int KV, int D) {
    *q_rotated = xmalloc((size_t)N * H * D * sizeof(float));
    *k_rotated = xmalloc((size_t)N * KV * D * sizeof(float));
    memcpy(*q_rotated, q, (size_t)N * H * D * sizeof(float));
    memcpy(*k_rotated, k, (size_t)N * KV * D * sizeof(float));
    ops_cpu.rope_forward(*q_rotated, positions, N, H, D, inv_freq);
    ops_cpu.rope_forward(*k_rotated, positions, N, KV, D, inv_freq);
}

static void rounded_attention_forward_rotary(float *out, float *saved, const float *q, const float *k, const float *v,
                                             int q_row_stride, int kv_row_stride, const int *row_start,
                                             const int *positions, const float *inv_freq, int B, int T, int H, int KV,
                                             int D, float softcap, int window) {
    const int N = B * T;
    float *q_rows = rows_of_their_own(q, N, H * D, q_row_stride), *k_rows = rows_of_their_own(k, N, KV * D, kv_row_stride);
    float *v_rows = rows_of_their_own(v, N, KV * D, kv_row_stride);
    float *q_rotated, *k_rotated;
    rotated_copies(&q_rotated, &k_rotated, q_rows, k_rows, positions, inv_freq, N, H, KV, D);
    rounded_attention_forward(out, saved, q_rotated, k_rotated, v_rows, row_start, B, T, H, KV, D, softcap, window);
    free(q_rows), free(k_rows), free(v_rows), free(q_rotated), free(k_rotated);
}

static void rounded_attention_backward_rotary(float *dq, float *dk, float *dv, const float *dout, const float *out,
                                              const float *saved, const float *q, const float *k, const float *v,
                                              int q_row_stride, int kv_row_stride, const int *row_start,
                                              const int *positions, const float *inv_freq, int B, int T, int H,
                                              int KV, int D, float softcap, int window) {
    const int N = B * T;
    float *q_rows = rows_of_their_own(q, N, H * D, q_row_stride), *k_rows = rows_of_their_own(k, N, KV * D, kv_row_stride);
    float *v_rows = rows_of_their_own(v, N, KV * D, kv_row_stride);
    float *q_rotated, *k_rotated;
    rotated_copies(&q_rotated, &k_rotated, q_rows, k_rows, positions, inv_freq, N, H, KV, D);
    float *dq_rows = xmalloc((size_t)N * H * D * sizeof(float)), *dk_rows = xmalloc((size_t)N * KV * D * sizeof(float));
    float *dv_rows = xmalloc((size_t)N * KV * D * sizeof(float));
    rounded_attention_backward(dq_rows, dk_rows, dv_rows, dout, out, saved, q_rotated, k_rotated, v_rows, row_start, B,
                               T, H, KV, D, softcap, window);
    ops_cpu.rope_backward(dq_rows, positions, N, H, D, inv_freq);
    ops_cpu.rope_backward(dk_rows, positions, N, KV, D, inv_freq);
    rows_into_strided(dq, q_row_stride, dq_rows, N, H * D);
    rows_into_strided(dk, kv_row_stride, dk_rows, N, KV * D);
    rows_into_strided(dv, kv_row_stride, dv_rows, N, KV * D);
    free(q_rows), free(k_rows), free(v_rows), free(q_rotated), free(k_rotated), free(dq_rows), free(dk_rows),
        free(dv_rows);
}

// A product per part, each as rounded_matmul_forward (the GPU's parts give each part's bits).
static void rounded_matmul_forward_parts(float *const *outs, const int *widths, int parts, const float *inp,
                                         const float *weight, const float *bias, int N, int IC,
                                         const InputRmsNorm *norm) {
    ops_matmul_forward_per_part(&bf16_rounding, outs, widths, parts, inp, weight, bias, N, IC, norm);
}

// The gate and up parts, then the GLU, each as the rounded backend computes them.
static void rounded_matmul_forward_glu(float *act, float *gate, float *up, const float *inp, const float *weight, int N,
                                       int IC, int width, bool gelu, const InputRmsNorm *norm) {
    ops_matmul_forward_glu_in_calls(&bf16_rounding, act, gate, up, inp, weight, N, IC, width, gelu, norm);
}

static void bf16_rounding_init(void) {
    bf16_rounding = ops_cpu;
    bf16_rounding.name = "cpu-with-bf16-operands";
    bf16_rounding.matmul_forward = rounded_matmul_forward;
    bf16_rounding.matmul_accumulate = rounded_matmul_accumulate;
    bf16_rounding.matmul_forward_residual = rounded_matmul_forward_residual;
    bf16_rounding.matmul_forward_parts = rounded_matmul_forward_parts;
    bf16_rounding.matmul_forward_glu = rounded_matmul_forward_glu;
    bf16_rounding.matmul_backward = rounded_matmul_backward;
    bf16_rounding.matmul_forward_dequantized = rounded_matmul_forward_dequantized;
    bf16_rounding.matmul_backward_input_q8 = rounded_matmul_backward_input_q8;
    bf16_rounding.attention_forward = rounded_attention_forward;
    bf16_rounding.attention_backward = rounded_attention_backward;
    bf16_rounding.attention_forward_rotary = rounded_attention_forward_rotary;
    bf16_rounding.attention_backward_rotary = rounded_attention_backward_rotary;
    // Its forward writes the probabilities it then reads (saved), as the GPU's kernels
    // write their state: no forward without it (ops.h).
    bf16_rounding.attention_forward_without_saved = false;
}

// Fresh uniform values in [lo, hi) for every call (xorshift64*).
static float random_uniform(float lo, float hi) {
    random_state ^= random_state >> 12;
    random_state ^= random_state << 25;
    random_state ^= random_state >> 27;
    unsigned long long bits = random_state * 2685821657736338717ull;
    return lo + (hi - lo) * (float)((bits >> 40) / 16777216.0);
}

static float *random_host(long n, float scale) {
    float *x = xmalloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    for (long i = 0; i < n; i++) x[i] = random_uniform(-scale, scale);
    return x;
}

static float *copy_host(const float *x, long n) {
    float *y = xmalloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    memcpy(y, x, (size_t)n * sizeof(float));
    return y;
}

static void *to_gpu(const void *host, size_t bytes) {
    void *d = gpu->alloc(bytes);
    gpu->copy_to_device(d, host, bytes);
    return d;
}

static float *gpu_floats(const float *host, long n) { return to_gpu(host, (size_t)n * sizeof(float)); }
static int *gpu_ints(const int *host, long n) { return to_gpu(host, (size_t)n * sizeof(int)); }

static double relative_error(const float *got, const float *want, long n) {
    double diff = 0, norm = 0;
    for (long i = 0; i < n; i++) {
        double d = (double)got[i] - want[i];
        if (d != d) return INFINITY;
        diff += d * d;
        norm += (double)want[i] * want[i];
    }
    return norm > 0 ? sqrt(diff / norm) : sqrt(diff);
}

// Copies the GPU buffer back and compares it with the CPU result.
static void expect_match_keep(const char *what, const float *device, const float *want, long n, double tol) {
    float *got = xmalloc((size_t)n * sizeof(float));
    gpu->copy_to_host(got, device, (size_t)n * sizeof(float));
    double error = relative_error(got, want, n);
    printf("# %-34s %.3e (tolerance %.0e)\n", what, error, tol);
    EXPECT(error <= tol, "%s: relative error %.3e > %.0e", what, error, tol);
    free(got);
}

// The same, then frees the GPU buffer.
static void expect_match(const char *what, float *device, const float *want, long n, double tol) {
    expect_match_keep(what, device, want, n, tol);
    gpu->free(device);
}

// ---------------------------------------------------------------------------------------
// Ops

static void test_embedding(void) {
    const int N = 300, C = 96, V = 50, P = 64;
    int tokens[300], positions[300];
    for (int i = 0; i < N; i++) tokens[i] = (int)(random_uniform(0, 1) * 10), positions[i] = i % P; // many repeats
    float *tok = random_host((long)V * C, 1), *pos = random_host((long)P * C, 1);
    float *out = xmalloc((size_t)N * C * sizeof(float));
    cpu->embedding_forward(out, tokens, positions, tok, pos, N, C, 1.5f);
    int *d_tokens = gpu_ints(tokens, N), *d_positions = gpu_ints(positions, N);
    float *d_out = gpu->alloc((size_t)N * C * sizeof(float));
    gpu->embedding_forward(d_out, d_tokens, d_positions, gpu_floats(tok, (long)V * C), gpu_floats(pos, (long)P * C), N, C, 1.5f);
    expect_match("embedding_forward", d_out, out, (long)N * C, TOL_FP32);

    float *dout = random_host((long)N * C, 1);
    float *dtok = random_host((long)V * C, 1), *dpos = random_host((long)P * C, 1); // accumulate onto
    float *d_dtok = gpu_floats(dtok, (long)V * C), *d_dpos = gpu_floats(dpos, (long)P * C);
    float *d_dout = gpu_floats(dout, (long)N * C);
    cpu->embedding_backward(dtok, dpos, dout, tokens, positions, N, C, 1.5f);
    gpu->embedding_backward(d_dtok, d_dpos, d_dout, d_tokens, d_positions, N, C, 1.5f);
    expect_match("embedding_backward tokens", d_dtok, dtok, (long)V * C, TOL_FP32);
    expect_match("embedding_backward positions", d_dpos, dpos, (long)P * C, TOL_FP32);
    free(tok), free(pos), free(out), free(dout), free(dtok), free(dpos);
}

static void test_norms(void) {
    const int N = 130, C = 320;
    float *x = random_host((long)N * C, 2), *w = random_host(C, 1), *bias = random_host(C, 1);
    float *dy = random_host((long)N * C, 1);
    float *d_x = gpu_floats(x, (long)N * C), *d_w = gpu_floats(w, C), *d_b = gpu_floats(bias, C);
    float *d_dy = gpu_floats(dy, (long)N * C);
    // LayerNorm
    float *out = xmalloc((size_t)N * C * 4), *mean = xmalloc(N * 4), *rstd = xmalloc(N * 4);
    cpu->layernorm_forward(out, mean, rstd, x, w, bias, N, C, 1e-5f);
    float *d_out = gpu->alloc((size_t)N * C * 4), *d_mean = gpu->alloc(N * 4), *d_rstd = gpu->alloc(N * 4);
    gpu->layernorm_forward(d_out, d_mean, d_rstd, d_x, d_w, d_b, N, C, 1e-5f);
    expect_match("layernorm_forward", d_out, out, (long)N * C, TOL_FP32);
    float *dx = random_host((long)N * C, 1), *dw = random_host(C, 1), *db = random_host(C, 1);
    float *d_dx = gpu_floats(dx, (long)N * C), *d_dw = gpu_floats(dw, C), *d_db = gpu_floats(db, C);
    cpu->layernorm_backward(dx, dw, db, dy, x, w, mean, rstd, N, C);
    gpu->layernorm_backward(d_dx, d_dw, d_db, d_dy, d_x, d_w, d_mean, d_rstd, N, C);
    expect_match("layernorm_backward dinp", d_dx, dx, (long)N * C, TOL_FP32);
    expect_match("layernorm_backward dweight", d_dw, dw, C, TOL_FP32);
    expect_match("layernorm_backward dbias", d_db, db, C, TOL_FP32);
    gpu->free(d_mean);
    // RMSNorm, both weight conventions
    for (int plus_one = 0; plus_one <= 1; plus_one++) {
        cpu->rmsnorm_forward(out, rstd, x, w, N, C, 1e-6f, plus_one);
        d_out = gpu->alloc((size_t)N * C * 4);
        gpu->rmsnorm_forward(d_out, d_rstd, d_x, d_w, N, C, 1e-6f, plus_one);
        expect_match(plus_one ? "rmsnorm_forward (1+w)" : "rmsnorm_forward", d_out, out, (long)N * C, TOL_FP32);
        float *rdx = random_host((long)N * C, 1), *rdw = random_host(C, 1);
        float *d_rdx = gpu_floats(rdx, (long)N * C), *d_rdw = gpu_floats(rdw, C);
        cpu->rmsnorm_backward(rdx, rdw, dy, x, w, rstd, N, C, plus_one);
        gpu->rmsnorm_backward(d_rdx, d_rdw, d_dy, d_x, d_w, d_rstd, N, C, plus_one);
        expect_match("rmsnorm_backward dinp", d_rdx, rdx, (long)N * C, TOL_FP32);
        expect_match("rmsnorm_backward dweight", d_rdw, rdw, C, TOL_FP32);
        free(rdx), free(rdw);
    }
    gpu->free(d_x), gpu->free(d_w), gpu->free(d_b), gpu->free(d_dy), gpu->free(d_rstd);
    free(x), free(w), free(bias), free(dy), free(out), free(mean), free(rstd), free(dx), free(dw), free(db);
}

static void test_matmul(void) {
    // Odd sizes on purpose: no dimension is a multiple of the tile sizes.
    // 3, 1 and 8 rows: a decode step's products (matvec_bf16.cuh, up to 8 rows).
    const int shapes[][3] = {{257, 96, 200}, {3, 64, 1000}, {1, 576, 49}, {8, 96, 70}, {1024, 128, 384}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int N = shapes[s][0], IC = shapes[s][1], OC = shapes[s][2];
        float *x = random_host((long)N * IC, 1), *w = random_host((long)OC * IC, 0.2f), *bias = random_host(OC, 1);
        float *out = xmalloc((size_t)N * OC * 4);
        cpu->matmul_forward(out, x, w, bias, N, IC, OC);
        float *d_x = gpu_floats(x, (long)N * IC), *d_w = gpu_floats(w, (long)OC * IC), *d_b = gpu_floats(bias, OC);
        float *d_out = gpu->alloc((size_t)N * OC * 4);
        gpu->matmul_forward(d_out, d_x, d_w, d_b, N, IC, OC);
        char what[64];
        snprintf(what, sizeof what, "matmul_forward %dx%dx%d", N, IC, OC);
        expect_match_keep(what, d_out, out, (long)N * OC, TOL_BF16); // kept: accumulated onto next
        cpu->matmul_accumulate(out, x, w, N, IC, OC);
        gpu->matmul_accumulate(d_out, d_x, d_w, N, IC, OC);
        expect_match("matmul_accumulate", d_out, out, (long)N * OC, TOL_BF16);
        // Onto a residual stream (out of place: cuBLASLt reads C and writes D), without and
        // with a bias; the residual must come through unchanged.
        float *residual = random_host((long)N * OC, 1);
        float *d_residual = gpu_floats(residual, (long)N * OC);
        for (int with_bias = 0; with_bias <= 1; with_bias++) {
            cpu->matmul_forward_residual(out, x, w, with_bias ? bias : NULL, residual, N, IC, OC);
            d_out = gpu->alloc((size_t)N * OC * 4);
            gpu->matmul_forward_residual(d_out, d_x, d_w, with_bias ? d_b : NULL, d_residual, N, IC, OC);
            expect_match(with_bias ? "matmul_forward_residual (bias)" : "matmul_forward_residual", d_out, out,
                         (long)N * OC, TOL_BF16);
        }
        expect_match("matmul_forward_residual's residual unchanged", d_residual, residual, (long)N * OC, 0.0);
        free(residual);

        float *dout = random_host((long)N * OC, 1);
        float *dx = random_host((long)N * IC, 1), *dw = random_host((long)OC * IC, 1), *db = random_host(OC, 1);
        float *d_dout = gpu_floats(dout, (long)N * OC), *d_dx = gpu_floats(dx, (long)N * IC);
        float *d_dw = gpu_floats(dw, (long)OC * IC), *d_db = gpu_floats(db, OC);
        cpu->matmul_backward(dx, dw, db, dout, x, w, N, IC, OC, WRITE_ADD, WRITE_ADD);
        gpu->matmul_backward(d_dx, d_dw, d_db, d_dout, d_x, d_w, N, IC, OC, WRITE_ADD, WRITE_ADD);
        expect_match("matmul_backward dinp", d_dx, dx, (long)N * IC, TOL_BF16);
        // Overwritten: the input gradient alone, over garbage (NaN where a read would show).
        for (long i = 0; i < (long)N * IC; i++) dx[i] = NAN;
        d_dx = gpu_floats(dx, (long)N * IC);
        cpu->matmul_backward(dx, NULL, NULL, dout, x, w, N, IC, OC, WRITE_OVERWRITE, WRITE_ADD);
        gpu->matmul_backward(d_dx, NULL, NULL, d_dout, d_x, d_w, N, IC, OC, WRITE_OVERWRITE, WRITE_ADD);
        expect_match("matmul_backward dinp overwritten", d_dx, dx, (long)N * IC, TOL_BF16);
        expect_match("matmul_backward dweight", d_dw, dw, (long)OC * IC, TOL_BF16);
        expect_match("matmul_backward dbias", d_db, db, OC, TOL_FP32);
        // The weight's and bias's gradients overwritten (an unwritten gradient tensor,
        // model/gradient_writes.c), over NaN: cuBLASLt's beta 0 must not read them.
        for (long i = 0; i < (long)OC * IC; i++) dw[i] = NAN;
        for (int i = 0; i < OC; i++) db[i] = NAN;
        d_dw = gpu_floats(dw, (long)OC * IC), d_db = gpu_floats(db, OC);
        cpu->matmul_backward(NULL, dw, db, dout, x, w, N, IC, OC, WRITE_ADD, WRITE_OVERWRITE);
        gpu->matmul_backward(NULL, d_dw, d_db, d_dout, d_x, d_w, N, IC, OC, WRITE_ADD, WRITE_OVERWRITE);
        expect_match("matmul_backward dweight overwritten", d_dw, dw, (long)OC * IC, TOL_BF16);
        expect_match("matmul_backward dbias overwritten", d_db, db, OC, TOL_FP32);

        // The cached bf16 weight must follow a change of the fp32 weight (AdamW here).
        float *grad = random_host((long)OC * IC, 1), *m = calloc((size_t)OC * IC, 4), *v = calloc((size_t)OC * IC, 4);
        float *d_grad = gpu_floats(grad, (long)OC * IC), *d_m = gpu_floats(m, (long)OC * IC), *d_v = gpu_floats(v, (long)OC * IC);
        cpu->adamw_update(w, grad, m, v, (long)OC * IC, 0.05f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.1f, 0.05f, 1.0f);
        gpu->adamw_update(d_w, d_grad, d_m, d_v, (long)OC * IC, 0.05f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.1f, 0.05f, 1.0f);
        cpu->matmul_forward(out, x, w, NULL, N, IC, OC);
        d_out = gpu->alloc((size_t)N * OC * 4);
        gpu->matmul_forward(d_out, d_x, d_w, NULL, N, IC, OC);
        expect_match_keep("matmul_forward after weight update", d_out, out, (long)N * OC, TOL_BF16);
        // AdamW wrote the cached bf16 copy itself (optimizer.cu): the same product as from a
        // fresh copy of the updated fp32 weights, converted anew, bit for bit. Then a partial
        // update (the cached copy goes stale and is converted again) the same way.
        float *w_now = xmalloc((size_t)OC * IC * 4), *got = xmalloc((size_t)N * OC * 4), *want = xmalloc((size_t)N * OC * 4);
        for (int partial = 0; partial <= 1; partial++) {
            if (partial) {
                const long half = (long)OC * IC / 2;
                gpu->adamw_update(d_w + half, d_grad + half, d_m + half, d_v + half, (long)OC * IC - half, 0.05f, 0.9f,
                                  0.95f, 1e-8f, 0.1f, 0.1f, 0.05f, 1.0f);
            }
            gpu->matmul_forward(d_out, d_x, d_w, NULL, N, IC, OC);
            gpu->copy_to_host(got, d_out, (size_t)N * OC * 4);
            gpu->copy_to_host(w_now, d_w, (size_t)OC * IC * 4);
            float *d_w_fresh = gpu_floats(w_now, (long)OC * IC);
            gpu->matmul_forward(d_out, d_x, d_w_fresh, NULL, N, IC, OC);
            gpu->copy_to_host(want, d_out, (size_t)N * OC * 4);
            EXPECT(memcmp(got, want, (size_t)N * OC * 4) == 0,
                   "matmul_forward after a%s AdamW update differs from the same weights converted anew",
                   partial ? " partial" : "n");
            gpu->free(d_w_fresh);
        }
        // Weights copied in from the host over a cached copy (a checkpoint loaded, an
        // adapter merged): the cache goes stale (cuda_weights_written) and the next product
        // reads the new weights.
        float *w_new = random_host((long)OC * IC, 1);
        gpu->copy_to_device(d_w, w_new, (size_t)OC * IC * 4);
        cpu->matmul_forward(out, x, w_new, NULL, N, IC, OC);
        gpu->matmul_forward(d_out, d_x, d_w, NULL, N, IC, OC);
        expect_match_keep("matmul_forward after weights copied in", d_out, out, (long)N * OC, TOL_BF16);
        free(w_new);
        free(w_now), free(got), free(want);
        gpu->free(d_out);
        gpu->free(d_x), gpu->free(d_w), gpu->free(d_b), gpu->free(d_dout), gpu->free(d_grad), gpu->free(d_m), gpu->free(d_v);
        free(x), free(w), free(bias), free(out), free(dout), free(dx), free(dw), free(db), free(grad), free(m), free(v);
    }
}

// A held input (matmul_input_hold) is converted once for every product that reads it until
// the release: forward, accumulate and weight gradient through it give the CPU's results;
// a product of another input meanwhile is unaffected; and holding the same buffer again
// after new contents were written reads the new contents (no stale copy).
// N rows: 129 for cuBLASLt, 5 for a decode step's kernel (matvec_bf16.cuh), which reads a
// held input's floats until a copy of it is made (in a model by the norm that writes it;
// here by the backward's product) and the copy from then on.
static void matmul_held_input_rows(int N) {
    const int IC = 96, OC = 80, OC2 = 40;
    float *x = random_host((long)N * IC, 1), *w = random_host((long)OC * IC, 0.2f), *w2 = random_host((long)OC2 * IC, 0.2f);
    float *other = random_host((long)N * IC, 1), *dout = random_host((long)N * OC, 1);
    float *out = xmalloc((size_t)N * OC * 4), *out2 = xmalloc((size_t)N * OC2 * 4), *out3 = xmalloc((size_t)N * OC * 4);
    float *dw = calloc((size_t)OC * IC, 4);
    float *d_x = gpu_floats(x, (long)N * IC), *d_w = gpu_floats(w, (long)OC * IC), *d_w2 = gpu_floats(w2, (long)OC2 * IC);
    float *d_other = gpu_floats(other, (long)N * IC), *d_dout = gpu_floats(dout, (long)N * OC);
    float *d_dw = gpu_floats(dw, (long)OC * IC);
    float *d_out = gpu->alloc((size_t)N * OC * 4), *d_out2 = gpu->alloc((size_t)N * OC2 * 4), *d_out3 = gpu->alloc((size_t)N * OC * 4);
    cpu->matmul_forward(out, x, w, NULL, N, IC, OC);
    cpu->matmul_forward(out2, x, w2, NULL, N, IC, OC2);
    cpu->matmul_forward(out3, other, w, NULL, N, IC, OC);
    cpu->matmul_backward(NULL, dw, NULL, dout, x, w, N, IC, OC, WRITE_ADD, WRITE_ADD);
    gpu->matmul_input_hold(d_x, (long)N * IC);
    gpu->matmul_forward(d_out, d_x, d_w, NULL, N, IC, OC);
    float *from_floats = xmalloc((size_t)N * OC * 4);
    gpu->copy_to_host(from_floats, d_out, (size_t)N * OC * 4);
    gpu->matmul_forward(d_out3, d_other, d_w, NULL, N, IC, OC); // not the held input
    gpu->matmul_forward(d_out2, d_x, d_w2, NULL, N, IC, OC2);
    gpu->matmul_backward(NULL, d_dw, NULL, d_dout, d_x, d_w, N, IC, OC, WRITE_ADD, WRITE_ADD);
    gpu->fill_zero(d_out, (long)N * OC);
    gpu->matmul_forward(d_out, d_x, d_w, NULL, N, IC, OC); // the copy the backward made
    gpu->matmul_input_release();
    expect_match_keep("held input: matmul_forward", d_out, out, (long)N * OC, TOL_BF16);
    if (N <= 8) { // the decode kernel rounds floats as the copy was rounded: the same operands
        float *from_copy = xmalloc((size_t)N * OC * 4);
        gpu->copy_to_host(from_copy, d_out, (size_t)N * OC * 4);
        EXPECT(!memcmp(from_floats, from_copy, (size_t)N * OC * 4),
               "decode-step product: the input's floats and its bf16 copy give different bits");
        free(from_copy);
    }
    free(from_floats);
    expect_match_keep("held input: a second product", d_out2, out2, (long)N * OC2, TOL_BF16);
    expect_match_keep("held input: another input meanwhile", d_out3, out3, (long)N * OC, TOL_BF16);
    expect_match_keep("held input: matmul_backward dweight", d_dw, dw, (long)OC * IC, TOL_BF16);
    // The held copy is what the products read: with the promise broken on purpose (a write
    // during the hold), a second product still sees the old contents. (The CPU standing in
    // holds nothing; a decode step's kernel reads an input's floats until a copy is made.)
    if (!standing_in && N > 8) {
        gpu->copy_to_device(d_x, x, (size_t)N * IC * 4);
        gpu->matmul_input_hold(d_x, (long)N * IC);
        gpu->matmul_forward(d_out, d_x, d_w, NULL, N, IC, OC);
        gpu->copy_to_device(d_x, other, (size_t)N * IC * 4);
        gpu->matmul_forward(d_out, d_x, d_w, NULL, N, IC, OC);
        gpu->matmul_input_release();
        expect_match_keep("held input: converted once per hold", d_out, out, (long)N * OC, TOL_BF16);
    }
    // New contents in the same buffer, held again.
    gpu->copy_to_device(d_x, other, (size_t)N * IC * 4);
    gpu->matmul_input_hold(d_x, (long)N * IC);
    gpu->matmul_forward(d_out, d_x, d_w, NULL, N, IC, OC);
    gpu->matmul_input_release();
    expect_match_keep("held input: held again after a write", d_out, out3, (long)N * OC, TOL_BF16);
    gpu->free(d_x), gpu->free(d_w), gpu->free(d_w2), gpu->free(d_other), gpu->free(d_dout), gpu->free(d_dw);
    gpu->free(d_out), gpu->free(d_out2), gpu->free(d_out3);
    free(x), free(w), free(w2), free(other), free(dout), free(out), free(out2), free(out3), free(dw);
}

static void test_matmul_held_input(void) {
    matmul_held_input_rows(129);
    matmul_held_input_rows(5);
}

// An activation whose output is a held matmul input writes the output's bf16 copy with it
// (matmul_input_hold), and the products that read the output through the hold give the
// CPU's results: forward (GELU, SwiGLU, GeGLU into a down projection) and backward (their
// gradients into the gate/up input gradients, and the forward's output, whose copy the
// backward writes from its recomputed activation, into the down projection's weight
// gradient). Each held slot is first filled with the
// conversion of a NaN buffer of the same size, so a copy the activation failed to write
// shows as NaN. Odd sizes: the copy's element-by-element tail runs.
// Fills with NaN the held copies that the next `count` holds take (a hold takes the first
// free slot): each of the NaN buffers held and converted through a product, then released.
static void fill_held_slots_with_nan(float *const *nan_buffers, int count, float *d_w, float *d_out, int N, int I,
                                     int C) {
    for (int i = 0; i < count; i++) {
        gpu->matmul_input_hold(nan_buffers[i], (long)N * I);
        gpu->matmul_forward(d_out, nan_buffers[i], d_w, NULL, N, I, C);
    }
    gpu->matmul_input_release();
}

static void test_held_activation_outputs(void) {
    const int N = 67, I = 97, C = 40;
    const long n = (long)N * I;
    float *gate = random_host(n, 3), *up = random_host(n, 3), *dact = random_host(n, 1), *w = random_host((long)C * I, 0.2f);
    float *nan_host = xmalloc((size_t)n * 4);
    for (long i = 0; i < n; i++) nan_host[i] = NAN;
    float *d_gate = gpu_floats(gate, n), *d_up = gpu_floats(up, n), *d_dact = gpu_floats(dact, n);
    float *d_w = gpu_floats(w, (long)C * I);
    float *d_nans[3] = {gpu_floats(nan_host, n), gpu_floats(nan_host, n), gpu_floats(nan_host, n)};
    float *dout_down = random_host((long)N * C, 1), *d_dout_down = gpu_floats(dout_down, (long)N * C);
    float *dw_down = xmalloc((size_t)C * I * 4), *d_dw_down = gpu->alloc((size_t)C * I * 4);
    float *act = xmalloc((size_t)n * 4), *out = xmalloc((size_t)N * C * 4), *dgate = xmalloc((size_t)n * 4),
          *dup = xmalloc((size_t)n * 4), *dx = xmalloc((size_t)N * C * 4), *dx_up = xmalloc((size_t)N * C * 4);
    float *d_act = gpu->alloc((size_t)n * 4), *d_out = gpu->alloc((size_t)N * C * 4), *d_dgate = gpu->alloc((size_t)n * 4),
          *d_dup = gpu->alloc((size_t)n * 4), *d_dx = gpu->alloc((size_t)N * C * 4), *d_dx_up = gpu->alloc((size_t)N * C * 4);
    for (int kind = 0; kind < 3; kind++) { // 0: GELU, 1: SwiGLU, 2: GeGLU
        const char *name = kind == 0 ? "gelu" : kind == 1 ? "swiglu" : "geglu";
        char what[96];
        fill_held_slots_with_nan(d_nans, 1, d_w, d_out, N, I, C);
        if (kind == 0) cpu->gelu_forward(act, up, n);
        else cpu->glu_forward(act, gate, up, n, kind == 2);
        cpu->matmul_forward(out, act, w, NULL, N, I, C);
        gpu->matmul_input_hold(d_act, n);
        if (kind == 0) gpu->gelu_forward(d_act, d_up, n);
        else gpu->glu_forward(d_act, d_gate, d_up, n, kind == 2);
        gpu->matmul_forward(d_out, d_act, d_w, NULL, N, I, C);
        gpu->matmul_input_release();
        snprintf(what, sizeof what, "held %s output: its product", name);
        expect_match_keep(what, d_out, out, (long)N * C, TOL_BF16);
        snprintf(what, sizeof what, "held %s output", name);
        expect_match_keep(what, d_act, act, n, TOL_FP32);

        // Backward: both gradients and the forward's output held, their slots first made NaN.
        fill_held_slots_with_nan(d_nans, 3, d_w, d_out, N, I, C);
        if (kind == 0) cpu->gelu_backward(dup, dact, up, act, n);
        else cpu->glu_backward(dgate, dup, dact, gate, up, act, n, kind == 2);
        memset(dw_down, 0, (size_t)C * I * 4);
        cpu->matmul_backward(NULL, dw_down, NULL, dout_down, act, w, N, I, C, WRITE_OVERWRITE, WRITE_ADD);
        // dx = d(output of the activation's input product) . W: the gradient through a product
        // of the held gradient, as gate's and up's backward read it (dout = the gradient).
        float *w_in = random_host((long)I * C, 0.2f), *d_w_in = gpu_floats(w_in, (long)I * C); // [I, C]: C -> I
        cpu->matmul_backward(dx_up, NULL, NULL, dup, NULL, w_in, N, C, I, WRITE_OVERWRITE, WRITE_ADD);
        if (kind) cpu->matmul_backward(dx, NULL, NULL, dgate, NULL, w_in, N, C, I, WRITE_OVERWRITE, WRITE_ADD);
        if (kind) gpu->matmul_input_hold(d_dgate, n);
        gpu->matmul_input_hold(d_dup, n);
        gpu->matmul_input_hold(d_act, n);
        gpu->fill_zero(d_dw_down, (long)C * I);
        if (kind == 0) gpu->gelu_backward(d_dup, d_dact, d_up, d_act, n);
        else gpu->glu_backward(d_dgate, d_dup, d_dact, d_gate, d_up, d_act, n, kind == 2);
        gpu->matmul_backward(d_dx_up, NULL, NULL, d_dup, NULL, d_w_in, N, C, I, WRITE_OVERWRITE, WRITE_ADD);
        if (kind) gpu->matmul_backward(d_dx, NULL, NULL, d_dgate, NULL, d_w_in, N, C, I, WRITE_OVERWRITE, WRITE_ADD);
        gpu->matmul_backward(NULL, d_dw_down, NULL, d_dout_down, d_act, d_w, N, I, C, WRITE_OVERWRITE, WRITE_ADD);
        gpu->matmul_input_release();
        snprintf(what, sizeof what, "held %s backward: the forward output's copy (down's weight gradient)", name);
        expect_match_keep(what, d_dw_down, dw_down, (long)C * I, TOL_BF16);
        snprintf(what, sizeof what, "held %s backward: up's input gradient", name);
        expect_match_keep(what, d_dx_up, dx_up, (long)N * C, TOL_BF16);
        if (kind) {
            snprintf(what, sizeof what, "held %s backward: gate's input gradient", name);
            expect_match_keep(what, d_dx, dx, (long)N * C, TOL_BF16);
        }
        gpu->free(d_w_in);
        free(w_in);
    }
    gpu->free(d_gate), gpu->free(d_up), gpu->free(d_dact), gpu->free(d_w), gpu->free(d_nans[0]), gpu->free(d_nans[1]);
    gpu->free(d_nans[2]), gpu->free(d_dout_down), gpu->free(d_dw_down);
    free(dout_down), free(dw_down);
    gpu->free(d_act);
    gpu->free(d_out), gpu->free(d_dgate), gpu->free(d_dup), gpu->free(d_dx), gpu->free(d_dx_up);
    free(gate), free(up), free(dact), free(w), free(nan_host), free(act), free(out), free(dgate), free(dup), free(dx),
        free(dx_up);
}

// Stored inputs (hold_stored): the activations' outputs and input gradients and the
// norms' outputs, written as their products' bf16 copies in their own memory, read by the
// products of the forward and again, held as written, by those of the backward, give the
// CPU's results. On the GPU, each buffer is first filled with a pattern that its second
// half must still hold after: no floats were written, the copy being the first half. Run
// again with stores turned into holds (ops_cuda_enable_stored_inputs(false), as
// MARLHF_CUDA_STORED_INPUTS=0), which writes floats (and the model still calls the store).
static bool second_half_is_pattern(const float *device, long n) {
    float *host = xmalloc((size_t)n * 4);
    gpu->copy_to_host(host, device, (size_t)n * 4);
    bool same = true;
    for (long i = (n + 1) / 2; i < n; i++) same = same && host[i] == 12345.0f;
    free(host);
    return same;
}

static void test_stored_inputs(void) {
    const int N = 67, I = 96, C = 40; // n even: the copy fills the first half exactly
    const long n = (long)N * I, nc = (long)N * C;
    float *gate = random_host(n, 3), *up = random_host(n, 3), *dact = random_host(n, 1);
    float *w_down = random_host((long)C * I, 0.2f), *w_in = random_host((long)I * C, 0.2f); // [C, I]; [I, C]: C -> I
    float *w_gate = random_host((long)I * C, 0.2f);
    float *x = random_host(nc, 2), *w_norm = random_host(C, 1), *bias = random_host(C, 1);
    float *dout_down = random_host(nc, 1), *dout_in = random_host(n, 1);
    float *pattern = xmalloc((size_t)n * 4);
    for (long i = 0; i < n; i++) pattern[i] = 12345.0f;
    float *act = xmalloc((size_t)n * 4), *dgate = xmalloc((size_t)n * 4), *dup = xmalloc((size_t)n * 4);
    float *out = xmalloc((size_t)nc * 4), *dw_down = xmalloc((size_t)C * I * 4), *dx = xmalloc((size_t)nc * 4);
    float *dx_up = xmalloc((size_t)nc * 4), *norm = xmalloc((size_t)nc * 4), *stat = xmalloc((size_t)N * 4);
    float *mean = xmalloc((size_t)N * 4), *proj = xmalloc((size_t)n * 4), *dw_in = xmalloc((size_t)I * C * 4);
    float *product_gate = xmalloc((size_t)n * 4), *product_up = xmalloc((size_t)n * 4);
    float *product_dact = xmalloc((size_t)n * 4);
    float *d_gate = gpu->alloc((size_t)n * 4), *d_up = gpu->alloc((size_t)n * 4), *d_dact = gpu->alloc((size_t)n * 4);
    float *d_w_down = gpu_floats(w_down, (long)C * I), *d_w_in = gpu_floats(w_in, (long)I * C);
    float *d_w_gate = gpu_floats(w_gate, (long)I * C);
    float *d_x = gpu_floats(x, nc), *d_w_norm = gpu_floats(w_norm, C), *d_bias = gpu_floats(bias, C);
    float *d_dout_down = gpu_floats(dout_down, nc), *d_dout_in = gpu_floats(dout_in, n);
    float *d_act = gpu->alloc((size_t)n * 4), *d_dgate = gpu->alloc((size_t)n * 4), *d_dup = gpu->alloc((size_t)n * 4);
    float *d_out = gpu->alloc((size_t)nc * 4), *d_dw_down = gpu->alloc((size_t)C * I * 4), *d_dx = gpu->alloc((size_t)nc * 4);
    float *d_dx_up = gpu->alloc((size_t)nc * 4), *d_norm = gpu->alloc((size_t)nc * 4), *d_stat = gpu->alloc((size_t)N * 4);
    float *d_mean = gpu->alloc((size_t)N * 4), *d_proj = gpu->alloc((size_t)n * 4), *d_dw_in = gpu->alloc((size_t)I * C * 4);
    // The products' outputs that `produced` runs read: x through up's and gate's weights
    // ([I, C]: C -> I), and down's input gradient.
    cpu->matmul_forward(product_up, x, w_in, NULL, N, C, I);
    cpu->matmul_forward(product_gate, x, w_gate, NULL, N, C, I);
    cpu->matmul_backward(product_dact, NULL, NULL, dout_down, NULL, w_down, N, I, C, WRITE_OVERWRITE, WRITE_ADD);
    char what[160];
    for (int pass = 0; pass < (standing_in ? 1 : 2); pass++) {
        const bool stores = pass == 0; // pass 1: stores turned into holds
        if (!standing_in) ops_cuda_enable_stored_inputs(stores);
        const bool floats_unwritten = stores && !standing_in;
        const char *mode = stores ? "stored" : "stores as holds";
        // The MLP: kind 0 GELU, 1 SwiGLU, 2 GeGLU; the activation's inputs (gate, up, and
        // the backward's output gradient) given as floats, or (produced) written stored
        // by their products, as the model's are.
        for (int kind = 0; kind < 3; kind++)
            for (int produced = 0; produced <= 1; produced++) {
                char name[48];
                snprintf(name, sizeof name, "%s%s", kind == 0 ? "gelu" : kind == 1 ? "swiglu" : "geglu",
                         produced ? " of stored products" : "");
                const float *h_gate = produced ? product_gate : gate, *h_up = produced ? product_up : up;
                const float *h_dact = produced ? product_dact : dact;
                if (kind == 0) cpu->gelu_forward(act, h_up, n);
                else cpu->glu_forward(act, h_gate, h_up, n, kind == 2);
                cpu->matmul_forward(out, act, w_down, NULL, N, I, C);
                if (kind == 0) cpu->gelu_backward(dup, h_dact, h_up, act, n);
                else cpu->glu_backward(dgate, dup, h_dact, h_gate, h_up, act, n, kind == 2);
                cpu->matmul_backward(NULL, dw_down, NULL, dout_down, act, w_down, N, I, C, WRITE_OVERWRITE,
                                     WRITE_OVERWRITE);
                cpu->matmul_backward(dx_up, NULL, NULL, dup, NULL, w_in, N, C, I, WRITE_OVERWRITE, WRITE_ADD);
                if (kind) cpu->matmul_backward(dx, NULL, NULL, dgate, NULL, w_in, N, C, I, WRITE_OVERWRITE, WRITE_ADD);

                if (produced) { // up's and gate's outputs stored by their products
                    gpu->copy_to_device(d_up, pattern, (size_t)n * 4);
                    gpu->copy_to_device(d_gate, pattern, (size_t)n * 4);
                    gpu->hold_stored(d_up, n, false);
                    if (kind) gpu->hold_stored(d_gate, n, false);
                    gpu->matmul_forward(d_up, d_x, d_w_in, NULL, N, C, I);
                    if (kind) gpu->matmul_forward(d_gate, d_x, d_w_gate, NULL, N, C, I);
                    gpu->matmul_input_release();
                    if (floats_unwritten) {
                        snprintf(what, sizeof what, "%s %s: no floats of the products' outputs written", mode, name);
                        EXPECT(second_half_is_pattern(d_up, n) && (!kind || second_half_is_pattern(d_gate, n)), "%s",
                               what);
                    }
                } else {
                    gpu->copy_to_device(d_up, up, (size_t)n * 4);
                    gpu->copy_to_device(d_gate, gate, (size_t)n * 4);
                }
                // Forward: act stored, read by down's product.
                gpu->copy_to_device(d_act, pattern, (size_t)n * 4);
                gpu->hold_stored(d_act, n, false);
                if (produced) {
                    gpu->hold_stored(d_up, n, true);
                    if (kind) gpu->hold_stored(d_gate, n, true);
                }
                if (kind == 0) gpu->gelu_forward(d_act, d_up, n);
                else gpu->glu_forward(d_act, d_gate, d_up, n, kind == 2);
                gpu->matmul_forward(d_out, d_act, d_w_down, NULL, N, I, C);
                gpu->matmul_input_release();
                snprintf(what, sizeof what, "%s %s output: its product", mode, name);
                expect_match_keep(what, d_out, out, nc, TOL_BF16);
                if (floats_unwritten) {
                    snprintf(what, sizeof what, "%s %s output: no floats written", mode, name);
                    EXPECT(second_half_is_pattern(d_act, n), "%s", what);
                }
                // Backward: act stored and written (down's weight gradient), the output
                // gradient given or stored by down's input-gradient product, the input
                // gradients stored (gate's and up's input gradients through their products).
                gpu->hold_stored(d_act, n, true);
                if (produced) {
                    gpu->copy_to_device(d_dact, pattern, (size_t)n * 4);
                    gpu->hold_stored(d_dact, n, false);
                    gpu->matmul_backward(d_dact, NULL, NULL, d_dout_down, NULL, d_w_down, N, I, C, WRITE_OVERWRITE,
                                         WRITE_ADD);
                    if (floats_unwritten) {
                        snprintf(what, sizeof what, "%s %s: no floats of down's input gradient written", mode, name);
                        EXPECT(second_half_is_pattern(d_dact, n), "%s", what);
                    }
                    gpu->hold_stored(d_up, n, true);
                    if (kind) gpu->hold_stored(d_gate, n, true);
                } else {
                    gpu->copy_to_device(d_dact, dact, (size_t)n * 4);
                }
                gpu->copy_to_device(d_dup, pattern, (size_t)n * 4);
                gpu->copy_to_device(d_dgate, pattern, (size_t)n * 4);
                gpu->hold_stored(d_dup, n, false);
                if (kind) gpu->hold_stored(d_dgate, n, false);
                if (kind == 0) gpu->gelu_backward(d_dup, d_dact, d_up, d_act, n);
                else gpu->glu_backward(d_dgate, d_dup, d_dact, d_gate, d_up, d_act, n, kind == 2);
                gpu->matmul_backward(NULL, d_dw_down, NULL, d_dout_down, d_act, d_w_down, N, I, C, WRITE_OVERWRITE,
                                     WRITE_OVERWRITE);
                gpu->matmul_backward(d_dx_up, NULL, NULL, d_dup, NULL, d_w_in, N, C, I, WRITE_OVERWRITE, WRITE_ADD);
                if (kind) gpu->matmul_backward(d_dx, NULL, NULL, d_dgate, NULL, d_w_in, N, C, I, WRITE_OVERWRITE, WRITE_ADD);
                gpu->matmul_input_release();
                snprintf(what, sizeof what, "%s %s backward: down's weight gradient from the forward's output", mode, name);
                expect_match_keep(what, d_dw_down, dw_down, (long)C * I, TOL_BF16);
                snprintf(what, sizeof what, "%s %s backward: up's input gradient", mode, name);
                expect_match_keep(what, d_dx_up, dx_up, nc, TOL_BF16);
                if (kind) {
                    snprintf(what, sizeof what, "%s %s backward: gate's input gradient", mode, name);
                    expect_match_keep(what, d_dx, dx, nc, TOL_BF16);
                }
                if (floats_unwritten) {
                    snprintf(what, sizeof what, "%s %s backward: no floats of the input gradients written", mode, name);
                    EXPECT(second_half_is_pattern(d_dup, n) && (!kind || second_half_is_pattern(d_dgate, n)), "%s", what);
                }
            }
        for (int kind = 0; kind < 2; kind++) { // 0: RMSNorm, 1: LayerNorm
            const char *name = kind == 0 ? "rmsnorm" : "layernorm";
            // Forward: the norm's output stored, read by a product (up's); the backward's
            // weight gradient reads it again, held as written.
            if (kind == 0) cpu->rmsnorm_forward(norm, stat, x, w_norm, N, C, 1e-6f, false);
            else cpu->layernorm_forward(norm, mean, stat, x, w_norm, bias, N, C, 1e-5f);
            cpu->matmul_forward(proj, norm, w_in, NULL, N, C, I);
            cpu->matmul_backward(NULL, dw_in, NULL, dout_in, norm, w_in, N, C, I, WRITE_OVERWRITE, WRITE_OVERWRITE);
            gpu->copy_to_device(d_norm, pattern, (size_t)nc * 4);
            gpu->hold_stored(d_norm, nc, false);
            if (kind == 0) gpu->rmsnorm_forward(d_norm, d_stat, d_x, d_w_norm, N, C, 1e-6f, false);
            else gpu->layernorm_forward(d_norm, d_mean, d_stat, d_x, d_w_norm, d_bias, N, C, 1e-5f);
            gpu->matmul_forward(d_proj, d_norm, d_w_in, NULL, N, C, I);
            gpu->matmul_input_release();
            gpu->hold_stored(d_norm, nc, true);
            gpu->matmul_backward(NULL, d_dw_in, NULL, d_dout_in, d_norm, d_w_in, N, C, I, WRITE_OVERWRITE, WRITE_OVERWRITE);
            gpu->matmul_input_release();
            snprintf(what, sizeof what, "%s %s output: its product", mode, name);
            expect_match_keep(what, d_proj, proj, n, TOL_BF16);
            snprintf(what, sizeof what, "%s %s output: the weight gradient reading it again", mode, name);
            expect_match_keep(what, d_dw_in, dw_in, (long)I * C, TOL_BF16);
            snprintf(what, sizeof what, "%s %s: its statistics", mode, name);
            expect_match_keep(what, d_stat, stat, N, TOL_FP32);
            if (floats_unwritten) {
                snprintf(what, sizeof what, "%s %s output: no floats written", mode, name);
                EXPECT(second_half_is_pattern(d_norm, nc), "%s", what);
            }
        }
    }
    if (!standing_in) ops_cuda_enable_stored_inputs(true);
    float *device[] = {d_w_gate, d_gate, d_up, d_dact, d_w_down, d_w_in, d_x, d_w_norm, d_bias, d_dout_down, d_dout_in,
                       d_act, d_dgate, d_dup, d_out, d_dw_down, d_dx, d_dx_up, d_norm, d_stat, d_mean, d_proj, d_dw_in};
    for (size_t i = 0; i < sizeof device / sizeof device[0]; i++) gpu->free(device[i]);
    float *host[] = {product_gate, product_up, product_dact, w_gate, gate, up, dact, w_down, w_in, x, w_norm, bias, dout_down, dout_in, pattern, act, dgate, dup,
                     out, dw_down, dx, dx_up, norm, stat, mean, proj, dw_in};
    for (size_t i = 0; i < sizeof host / sizeof host[0]; i++) free(host[i]);
}

// The norms (forward: their output; backward: their input gradient, accumulated), the RoPE
// backward (its rotated gradient) and the attention forward (its output) write a held
// output's bf16 copy too, as the model holds them for the products that read them next
// (q/k/v and up/gate, o; o's and down's output gradients; q's and k's). Each product through the hold gives the CPU's result; each held slot is
// first filled with NaN (fill_held_slots_with_nan), so a copy the op failed to write shows.
static void test_held_norm_and_attention_outputs(void) {
    const int N = 67, C = 96, OC = 40;
    const long n = (long)N * C;
    float *x = random_host(n, 2), *w = random_host(C, 1), *bias = random_host(C, 1), *dy = random_host(n, 1);
    float *dx_start = random_host(n, 1), *w_out = random_host((long)OC * C, 0.2f);
    float *w_in = random_host((long)OC * C, 0.2f);
    float *nan_host = xmalloc((size_t)n * 4);
    for (long i = 0; i < n; i++) nan_host[i] = NAN;
    float *d_x = gpu_floats(x, n), *d_w = gpu_floats(w, C), *d_b = gpu_floats(bias, C), *d_dy = gpu_floats(dy, n);
    float *d_w_out = gpu_floats(w_out, (long)OC * C), *d_w_in = gpu_floats(w_in, (long)OC * C); // [OC, C]
    float *d_nans[1] = {gpu_floats(nan_host, n)};
    float *norm = xmalloc((size_t)n * 4), *stat = xmalloc((size_t)N * 4), *mean = xmalloc((size_t)N * 4);
    float *proj = xmalloc((size_t)N * OC * 4), *dx = xmalloc((size_t)n * 4), *dproj = xmalloc((size_t)N * OC * 4);
    float *d_norm = gpu->alloc((size_t)n * 4), *d_stat = gpu->alloc((size_t)N * 4), *d_mean = gpu->alloc((size_t)N * 4);
    float *d_proj = gpu->alloc((size_t)N * OC * 4), *d_dx = gpu->alloc((size_t)n * 4);
    float *d_dproj = gpu->alloc((size_t)N * OC * 4);
    float *d_scratch = gpu->alloc((size_t)N * OC * 4);
    for (int kind = 0; kind < 2; kind++) { // 0: RMSNorm, 1: LayerNorm
        const char *name = kind == 0 ? "rmsnorm" : "layernorm";
        char what[96];
        // Forward: the norm's output, then a product reading it (q's, up's).
        fill_held_slots_with_nan(d_nans, 1, d_w_out, d_scratch, N, C, OC);
        if (kind == 0) cpu->rmsnorm_forward(norm, stat, x, w, N, C, 1e-6f, false);
        else cpu->layernorm_forward(norm, mean, stat, x, w, bias, N, C, 1e-5f);
        cpu->matmul_forward(proj, norm, w_out, NULL, N, C, OC);
        gpu->matmul_input_hold(d_norm, n);
        if (kind == 0) gpu->rmsnorm_forward(d_norm, d_stat, d_x, d_w, N, C, 1e-6f, false);
        else gpu->layernorm_forward(d_norm, d_mean, d_stat, d_x, d_w, d_b, N, C, 1e-5f);
        gpu->matmul_forward(d_proj, d_norm, d_w_out, NULL, N, C, OC);
        gpu->matmul_input_release();
        snprintf(what, sizeof what, "held %s output: its product", name);
        expect_match_keep(what, d_proj, proj, (long)N * OC, TOL_BF16);
        // Backward: the input gradient (added to what the buffer held), then the gradient
        // through a product that reads it as its output gradient (o's, down's).
        fill_held_slots_with_nan(d_nans, 1, d_w_out, d_scratch, N, C, OC);
        memcpy(dx, dx_start, (size_t)n * 4);
        gpu->copy_to_device(d_dx, dx_start, (size_t)n * 4);
        if (kind == 0) cpu->rmsnorm_backward(dx, NULL, dy, x, w, stat, N, C, false);
        else cpu->layernorm_backward(dx, NULL, NULL, dy, x, w, mean, stat, N, C);
        cpu->matmul_backward(dproj, NULL, NULL, dx, NULL, w_in, N, OC, C, WRITE_OVERWRITE, WRITE_ADD); // w_in: [C, OC] as OC -> C
        gpu->matmul_input_hold(d_dx, n);
        if (kind == 0) gpu->rmsnorm_backward(d_dx, NULL, d_dy, d_x, d_w, d_stat, N, C, false);
        else gpu->layernorm_backward(d_dx, NULL, NULL, d_dy, d_x, d_w, d_mean, d_stat, N, C);
        gpu->matmul_backward(d_dproj, NULL, NULL, d_dx, NULL, d_w_in, N, OC, C, WRITE_OVERWRITE, WRITE_ADD);
        gpu->matmul_input_release();
        snprintf(what, sizeof what, "held %s backward: the next product's input gradient", name);
        expect_match_keep(what, d_dproj, dproj, (long)N * OC, TOL_BF16);
        snprintf(what, sizeof what, "held %s backward: its input gradient", name);
        expect_match_keep(what, d_dx, dx, n, TOL_FP32);
    }

    // The RoPE backward's output (rows of 2 heads of 48) as a product's output gradient (q's).
    {
        const int heads = 2, head_dim = C / heads;
        int positions[67];
        for (int i = 0; i < N; i++) positions[i] = (i * 13) % 500;
        ModelConfig rope_cfg = {.head_dim = head_dim, .rope_theta = 10000.0f};
        float inv_freq[48];
        rope_inverse_frequencies(&rope_cfg, inv_freq);
        float *d_inv_freq = gpu_floats(inv_freq, head_dim / 2);
        int *d_positions = gpu_ints(positions, N);
        fill_held_slots_with_nan(d_nans, 1, d_w_out, d_scratch, N, C, OC);
        memcpy(dx, dy, (size_t)n * 4);
        cpu->rope_backward(dx, positions, N, heads, head_dim, inv_freq);
        cpu->matmul_backward(dproj, NULL, NULL, dx, NULL, w_in, N, OC, C, WRITE_OVERWRITE, WRITE_ADD);
        gpu->copy_to_device(d_dx, dy, (size_t)n * 4);
        gpu->matmul_input_hold(d_dx, n);
        gpu->rope_backward(d_dx, d_positions, N, heads, head_dim, d_inv_freq);
        gpu->matmul_backward(d_dproj, NULL, NULL, d_dx, NULL, d_w_in, N, OC, C, WRITE_OVERWRITE, WRITE_ADD);
        gpu->matmul_input_release();
        expect_match_keep("held rope_backward output: the product's input gradient", d_dproj, dproj, (long)N * OC,
                          TOL_BF16);
        gpu->free(d_inv_freq), gpu->free(d_positions);
    }

    // The log-prob backward's output (the logits' gradient, C = 96 a row: four at a time) as
    // the LM head's output gradient.
    {
        int targets[67];
        for (int i = 0; i < N; i++) targets[i] = i % 5 == 0 ? -1 : (i * 7) % C;
        float *lse = xmalloc((size_t)N * 4), *dlogp = random_host(N, 1);
        fill_held_slots_with_nan(d_nans, 1, d_w_out, d_scratch, N, C, OC);
        memcpy(dx, dy, (size_t)n * 4); // dy as the logits
        cpu->logprob_forward(NULL, lse, NULL, NULL, dx, targets, N, C);
        cpu->logprob_backward(dx, dlogp, NULL, targets, lse, N, C, 0.0f);
        cpu->matmul_backward(dproj, NULL, NULL, dx, NULL, w_in, N, OC, C, WRITE_OVERWRITE, WRITE_ADD);
        float *d_lse = gpu_floats(lse, N), *d_dlogp = gpu_floats(dlogp, N);
        int *d_targets = gpu_ints(targets, N);
        gpu->copy_to_device(d_dx, dy, (size_t)n * 4);
        gpu->matmul_input_hold(d_dx, n);
        gpu->logprob_backward(d_dx, d_dlogp, NULL, d_targets, d_lse, N, C, 0.0f);
        gpu->matmul_backward(d_dproj, NULL, NULL, d_dx, NULL, d_w_in, N, OC, C, WRITE_OVERWRITE, WRITE_ADD);
        gpu->matmul_input_release();
        expect_match_keep("held logprob_backward output: the head's input gradient", d_dproj, dproj, (long)N * OC,
                          TOL_BF16);
        expect_match_keep("held logprob_backward output itself", d_dx, dx, n, TOL_FP32);
        gpu->free(d_lse), gpu->free(d_dlogp), gpu->free(d_targets);
        free(lse), free(dlogp);
    }

    // The attention's output (the default kernels) into o's product.
    const int B = 2, T = 70, H = 4, KV = 2, D = 64, rows = B * T, width = H * D;
    const int row_start[2] = {0, 5};
    const long q_n = (long)rows * width, kv_n = (long)rows * KV * D;
    float *q = random_host(q_n, 1), *k = random_host(kv_n, 1), *v = random_host(kv_n, 1);
    float *w_o = random_host((long)C * width, 0.2f);
    float *att = xmalloc((size_t)q_n * 4), *o = xmalloc((size_t)rows * C * 4);
    float *probs = xmalloc((size_t)cpu->attention_saved_size(B, T, H, KV, D, 0.0f, 0) * 4);
    float *att_nan = xmalloc((size_t)q_n * 4);
    for (long i = 0; i < q_n; i++) att_nan[i] = NAN;
    cpu->attention_forward(att, probs, q, k, v, row_start, B, T, H, KV, D, 0.0f, 0);
    cpu->matmul_forward(o, att, w_o, NULL, rows, width, C);
    float *d_q = gpu_floats(q, q_n), *d_k = gpu_floats(k, kv_n), *d_v = gpu_floats(v, kv_n);
    float *d_w_o = gpu_floats(w_o, (long)C * width);
    float *d_att_nan[1] = {gpu_floats(att_nan, q_n)};
    int *d_rs = gpu_ints(row_start, B);
    float *d_att = gpu->alloc((size_t)q_n * 4), *d_o = gpu->alloc((size_t)rows * C * 4);
    float *d_saved = gpu->alloc((size_t)gpu->attention_saved_size(B, T, H, KV, D, 0.0f, 0) * 4);
    fill_held_slots_with_nan(d_att_nan, 1, d_w_o, d_o, rows, width, C);
    gpu->matmul_input_hold(d_att, q_n);
    gpu->attention_forward(d_att, d_saved, d_q, d_k, d_v, d_rs, B, T, H, KV, D, 0.0f, 0);
    gpu->matmul_forward(d_o, d_att, d_w_o, NULL, rows, width, C);
    gpu->matmul_input_release();
    expect_match_keep("held attention output: o's product", d_o, o, (long)rows * C, TOL_BF16);

    gpu->free(d_x), gpu->free(d_w), gpu->free(d_b), gpu->free(d_dy), gpu->free(d_w_out), gpu->free(d_w_in);
    gpu->free(d_nans[0]), gpu->free(d_norm), gpu->free(d_stat), gpu->free(d_mean), gpu->free(d_proj), gpu->free(d_dx);
    gpu->free(d_dproj), gpu->free(d_scratch);
    gpu->free(d_q), gpu->free(d_k), gpu->free(d_v), gpu->free(d_w_o), gpu->free(d_att_nan[0]), gpu->free(d_rs);
    gpu->free(d_att), gpu->free(d_o), gpu->free(d_saved);
    free(x), free(w), free(bias), free(dy), free(dx_start), free(w_out), free(w_in), free(nan_host), free(norm);
    free(stat), free(mean), free(proj), free(dx), free(dproj);
    free(q), free(k), free(v), free(w_o), free(att), free(o), free(probs), free(att_nan);
}

static void test_rope(void) {
    const int N = 77, H = 5, D = 64;
    int positions[77];
    for (int i = 0; i < N; i++) positions[i] = (i * 37) % 3000;
    float *x = random_host((long)N * H * D, 1);
    float *d_x = gpu_floats(x, (long)N * H * D);
    int *d_pos = gpu_ints(positions, N);
    // Llama 3's scaled frequencies: every branch of the table (kept, divided, blended).
    ModelConfig cfg = {.head_dim = D, .rope_theta = 10000.0f, .rope_scaling = ROPE_SCALING_LLAMA3, .rope_factor = 8.0f,
                       .rope_low_freq_factor = 1.0f, .rope_high_freq_factor = 4.0f,
                       .rope_original_max_positions = 256};
    float inv_freq[32];
    rope_inverse_frequencies(&cfg, inv_freq);
    float *d_inv_freq = gpu_floats(inv_freq, D / 2);
    cpu->rope_forward(x, positions, N, H, D, inv_freq);
    gpu->rope_forward(d_x, d_pos, N, H, D, d_inv_freq);
    expect_match("rope_forward", d_x, x, (long)N * H * D, TOL_FP32);
    float *dx = random_host((long)N * H * D, 1);
    float *d_dx = gpu_floats(dx, (long)N * H * D);
    cpu->rope_backward(dx, positions, N, H, D, inv_freq);
    gpu->rope_backward(d_dx, d_pos, N, H, D, d_inv_freq);
    expect_match("rope_backward", d_dx, dx, (long)N * H * D, TOL_FP32);
    gpu->free(d_pos), gpu->free(d_inv_freq);
    free(x), free(dx);
}

// Gemma 2's soft cap on the scores for check_attention (0: none). A capped attention runs
// the unfused kernels whatever the choice: the fused ones take no cap.
static float attention_softcap = 0.0f;
// A sliding window for check_attention (0: none); the wmma kernels take none shorter than T
// (the unfused ones run), the mma kernels do.
static int attention_window = 0;

// One attention configuration against the CPU: forward output, the saved probabilities
// (unfused path only: the fused kernels save log-sum-exps), the three input gradients, and
// the same gradients bit for bit from a second run.
static void check_attention(const char *kernels, int B, int T, int H, int KV, int D, const int *row_start) {
    for (int b = 0; b < B; b++) CHECK(row_start[b] <= T, "row_start %d past T %d", row_start[b], T);
    // The CPU standing in has one attention path, which saves the probabilities.
    const char *previous = standing_in ? NULL : ops_cuda_attention_kernels();
    if (!standing_in) CHECK(ops_cuda_select_attention(kernels), "unknown attention kernels %s", kernels);
    const float softcap = attention_softcap;
    const int window = attention_window;
    const bool windowed = window > 0 && window < T;
    const bool fused = !standing_in && strcmp(kernels, "unfused") != 0 && softcap == 0.0f &&
                       !(windowed && !strcmp(kernels, "wmma"));
    char label[96];
    snprintf(label, sizeof label, "attention %s B%d T%d H%d/%d hd%d%s%s", kernels, B, T, H, KV, D,
             softcap > 0 ? " cap" : "", window > 0 ? " window" : "");
    const long q_n = (long)B * T * H * D, kv_n = (long)B * T * KV * D, p_n = (long)B * H * T * T;
    const long saved_n = gpu->attention_saved_size(B, T, H, KV, D, softcap, window);
    // A fused choice keeps one log-sum-exp per query row (padded to 4 floats), the mma
    // kernels bf16 copies of Q [B, H, T, D], K and V [B, KV, T, D] after them (attention.cu,
    // MmaSaved); the unfused fallback (another head_dim, or kernels wanting more shared memory
    // than the device has: not on an H200) would save T x T probabilities and this would test
    // the wrong kernels.
    const long fused_saved_n = strncmp(kernels, "mma", 3) ? (long)B * H * T
                                                          : ((long)B * H * T + 3) / 4 * 4 + (q_n + 2 * kv_n) / 2;
    EXPECT(!fused || saved_n == fused_saved_n, "%s: fell back to the unfused kernels (saved %ld floats, not %ld)", label,
           saved_n, fused_saved_n);
    EXPECT(softcap == 0.0f || saved_n == p_n, "%s: a soft cap must run the unfused kernels", label);
    EXPECT(!(windowed && !strcmp(kernels, "wmma")) || saved_n == p_n, "%s: wmma with a window must fall back", label);
    float *q = random_host(q_n, 1), *k = random_host(kv_n, 1), *v = random_host(kv_n, 1);
    float *out = xmalloc(q_n * 4), *probs = xmalloc(p_n * 4), *out_gpu = xmalloc(q_n * 4);
    cpu->attention_forward(out, probs, q, k, v, row_start, B, T, H, KV, D, softcap, window);
    float *d_q = gpu_floats(q, q_n), *d_k = gpu_floats(k, kv_n), *d_v = gpu_floats(v, kv_n);
    int *d_rs = gpu_ints(row_start, B);
    float *d_out = gpu->alloc(q_n * 4), *d_saved = gpu->alloc(saved_n * 4);
    gpu->attention_forward(d_out, d_saved, d_q, d_k, d_v, d_rs, B, T, H, KV, D, softcap, window);
    gpu->copy_to_host(out_gpu, d_out, q_n * 4);
    char what[160];
    double error = relative_error(out_gpu, out, q_n), worst = worst_segment_error(out_gpu, out, q_n, D);
    printf("# %-44s out %.3e (tolerance %.0e), worst head row %.3e (%.0e)\n", label, error, TOL_BF16, worst,
           TOL_BF16_ROW);
    EXPECT(error <= TOL_BF16, "%s out: %.3e", label, error);
    EXPECT(worst <= TOL_BF16_ROW, "%s out: %.3e in one head's row", label, worst);
    long padding_nonzero = 0; // left-padding queries have no keys: output exactly 0
    for (int b = 0; b < B; b++)
        for (int t = 0; t < row_start[b]; t++)
            for (int j = 0; j < H * D; j++) padding_nonzero += out_gpu[((long)b * T + t) * H * D + j] != 0.0f;
    EXPECT(padding_nonzero == 0, "%s: %ld outputs of padding queries are nonzero", label, padding_nonzero);
    if (!fused) {
        float *probs_gpu = xmalloc(p_n * 4);
        gpu->copy_to_host(probs_gpu, d_saved, p_n * 4);
        error = relative_error(probs_gpu, probs, p_n);
        long masked_nonzero = 0;
        for (long i = 0; i < p_n; i++) masked_nonzero += probs[i] == 0.0f && probs_gpu[i] != 0.0f;
        printf("# %-44s probs %.3e (tolerance %.0e)\n", label, error, TOL_BF16);
        EXPECT(error <= TOL_BF16 && masked_nonzero == 0, "%s probs %.3e, %ld masked nonzero", label, error, masked_nonzero);
        free(probs_gpu);
    }

    float *dout = random_host(q_n, 1);
    // The op overwrites dq, dk, dv (ops.h): both sides start from NaN, which any element left
    // unwritten keeps.
    float *dq = xmalloc(q_n * 4), *dk = xmalloc(kv_n * 4), *dv = xmalloc(kv_n * 4);
    for (long i = 0; i < q_n; i++) dq[i] = NAN;
    for (long i = 0; i < kv_n; i++) dk[i] = dv[i] = NAN;
    float *d_dout = gpu_floats(dout, q_n), *d_dq = gpu_floats(dq, q_n), *d_dk = gpu_floats(dk, kv_n), *d_dv = gpu_floats(dv, kv_n);
    cpu->attention_backward(dq, dk, dv, dout, out, probs, q, k, v, row_start, B, T, H, KV, D, softcap, window);
    gpu->attention_backward(d_dq, d_dk, d_dv, d_dout, d_out, d_saved, d_q, d_k, d_v, d_rs, B, T, H, KV, D, softcap, window);
    float *got = xmalloc(q_n * 4);
    struct { const char *name; float *device, *want; long n; } grads[] = {
        {"dq", d_dq, dq, q_n}, {"dk", d_dk, dk, kv_n}, {"dv", d_dv, dv, kv_n}};
    for (int g = 0; g < 3; g++) {
        gpu->copy_to_host(got, grads[g].device, grads[g].n * 4);
        error = relative_error(got, grads[g].want, grads[g].n);
        worst = worst_segment_error(got, grads[g].want, grads[g].n, D);
        snprintf(what, sizeof what, "%s %s", label, grads[g].name);
        printf("# %-44s %s %.3e (tolerance %.0e), worst head row %.3e (%.0e)\n", label, grads[g].name, error, TOL_BF16,
               worst, TOL_BF16_ROW);
        EXPECT(error <= TOL_BF16, "%s: %.3e", what, error);
        EXPECT(worst <= TOL_BF16_ROW, "%s: %.3e in one head's row", what, worst);
        gpu->free(grads[g].device);
    }
    // Determinism: the same backward twice from zero gives the same bits.
    float *zeros = calloc(q_n, 4);
    float *a = xmalloc(q_n * 4), *b = xmalloc(q_n * 4);
    float *runs[2][3];
    for (int run = 0; run < 2; run++) {
        runs[run][0] = gpu_floats(zeros, q_n), runs[run][1] = gpu_floats(zeros, kv_n), runs[run][2] = gpu_floats(zeros, kv_n);
        gpu->attention_backward(runs[run][0], runs[run][1], runs[run][2], d_dout, d_out, d_saved, d_q, d_k, d_v, d_rs,
                                B, T, H, KV, D, softcap, window);
    }
    for (int g = 0; g < 3; g++) {
        long n = g == 0 ? q_n : kv_n;
        gpu->copy_to_host(a, runs[0][g], n * 4);
        gpu->copy_to_host(b, runs[1][g], n * 4);
        EXPECT(memcmp(a, b, n * 4) == 0, "%s: backward %s is not bit-identical run to run", label, grads[g].name);
        gpu->free(runs[0][g]), gpu->free(runs[1][g]);
    }
    gpu->free(d_q), gpu->free(d_k), gpu->free(d_v), gpu->free(d_rs), gpu->free(d_out), gpu->free(d_saved), gpu->free(d_dout);
    free(q), free(k), free(v), free(out), free(out_gpu), free(probs), free(dout), free(dq), free(dk), free(dv);
    free(got), free(zeros), free(a), free(b);
    if (!standing_in) ops_cuda_select_attention(previous);
}

static void test_attention(void) {
    // Ragged rows (left padding, one row of padding only past a tile), grouped K/V heads,
    // several 64-row tiles with a partial last one; each fused implementation (mma, the
    // default, its PLAIN variant mma-plain, mma-ds keeping dS for the dQ kernel (head_dim
    // up to 64; at 128 it recomputes, as mma), and wmma) and the unfused reference path.
    const int starts3[3] = {0, 5, 30}, starts4[4] = {0, 70, 149, 3}, starts2[2] = {0, 2}, starts_short[3] = {0, 5, 18};
    const int starts_long[2] = {0, 200};
    // Long rows: 16 key tiles and 8 query blocks on the GPU; 5 and 3 on the emulated backend
    // (test_cuda_emulated), where T = 1000 was most of the run's time for no path the
    // shorter rows miss (several blocks of each kind, a window across tiles, padding past
    // the first block). The emulation leaves wmma at the shorter rows (its WMMA loads every
    // fragment in every lane).
    const int long_rows = emulated ? 300 : 1000;
    check_attention("unfused", 3, 37, 6, 2, 32, starts3);
    check_attention("unfused", 4, 150, 8, 2, 64, starts4);
    const char *fused[] = {"wmma", "mma", "mma-plain", "mma-ds"};
    for (size_t i = 0; i < sizeof fused / sizeof fused[0]; i++) {
        check_attention(fused[i], 3, 37, 6, 2, 32, starts3);
        check_attention(fused[i], 4, 150, 8, 2, 64, starts4);
        check_attention(fused[i], 2, 70, 4, 4, 128, starts2);
        check_attention(fused[i], 3, 19, 4, 1, 16, starts_short);
        if (!(emulated && !strcmp(fused[i], "wmma"))) check_attention(fused[i], 2, long_rows, 8, 2, 128, starts_long);
    }
    check_attention("mma-ds", 2, long_rows, 8, 2, 64, starts_long);
    // Gemma 2's soft cap (1: the scores here reach about 2): the unfused kernels, also when a
    // fused choice is made.
    attention_softcap = 1.0f;
    check_attention("unfused", 3, 37, 6, 2, 32, starts3);
    check_attention("mma", 4, 150, 8, 2, 64, starts4);
    attention_softcap = 0.0f;
    // A sliding window shorter than the rows (Mistral, Gemma 2/3's sliding layers): the mma
    // kernels (a window inside a tile, and one across tiles), the unfused ones, and wmma's
    // fallback to them; with the soft cap too; one as long as the rows is plain causal
    // attention and keeps the wmma kernels.
    attention_window = 7;
    check_attention("unfused", 3, 37, 6, 2, 32, starts3);
    check_attention("mma", 4, 150, 8, 2, 64, starts4);
    check_attention("wmma", 4, 150, 8, 2, 64, starts4);
    check_attention("mma-plain", 4, 150, 8, 2, 64, starts4);
    attention_window = 70;
    check_attention("mma", 2, long_rows, 8, 2, 128, starts_long);
    check_attention("mma-plain", 2, long_rows, 8, 2, 64, starts_long);
    check_attention("mma-ds", 2, long_rows, 8, 2, 64, starts_long);
    attention_window = 7;
    check_attention("mma-ds", 4, 150, 8, 2, 64, starts4);
    attention_softcap = 1.0f;
    check_attention("unfused", 3, 37, 6, 2, 32, starts3);
    attention_softcap = 0.0f;
    attention_window = 37;
    check_attention("wmma", 3, 37, 6, 2, 32, starts3);
    attention_window = 0;
}

// Whether the attention ops run on the mma kernels for this shape (the rotary ops then take
// a fused q | k | v buffer's rows in place: attention.cu, reads_rows_in_place): when the
// saved state asked for is theirs, a log-sum-exp per query row and the gathered bf16 Q, K
// and V. They are the GPU's choice unless it is wmma or unfused, and take no soft cap, no
// head_dim but 16, 32, 64 and 128, and no head_dim 128 on a GPU with under 103 KB of shared
// memory per block.
static bool mma_kernels_ran(int B, int T, int H, int KV, int D, float softcap, int window) {
    const long lse = ((long)B * H * T + 3) / 4 * 4, gathered = (long)B * T * (H + 2 * KV) * D / 2;
    return !standing_in && !strncmp(ops_cuda_attention_kernels(), "mma", 3) &&
           gpu->attention_saved_size(B, T, H, KV, D, softcap, window) == lse + gathered;
}

// The rotary attention ops again on the columns of one fused q | k | v buffer
// [B*T, (H + 2 KV) * D] and its gradient, as the model calls them after its fused q/k/v
// product: the output and the three gradients must be the planar run's (`planar`: out, dq,
// dk, dv as the GPU computed them) bit for bit, whichever path runs (the mma kernels read and
// write the rows in place, the other paths copy them to and from rows of their own), and
// every column of the gradient buffer, which starts as NaN, written. The gradient buffer is
// held through the backward and a product that reads it (matmul_input_hold, as the fused
// product's backward holds it): on the mma path the RoPE backward writes its bf16 copy,
// every column of the rows (v's too), which the product reads instead of converting the
// floats; its held slot is first filled with NaN (fill_held_slots_with_nan), so a column the
// copy missed shows. The product through the hold must give the CPU's result (`cpu_grads`:
// dq, dk, dv) within TOL_BF16, and the same product without the hold, bit for bit. Where
// the backward wrote the copy (mma_kernels_ran), the gradient's floats are overwritten with
// NaN before that product, a promise broken on purpose: the product must still read the
// copy, not convert the floats.
static void check_rotary_attention_packed(const char *label, const float *q, const float *k, const float *v,
                                          float *const planar[4], float *const cpu_grads[3], float *d_dout,
                                          int *d_rs, int *d_positions, float *d_inv_freq, float *d_saved, int B,
                                          int T, int H, int KV, int D, float softcap, int window,
                                          bool copy_in_backward) {
    const int N = B * T, q_dim = H * D, kv_dim = KV * D, width = q_dim + 2 * kv_dim, C = 40;
    const long packed_n = (long)N * width, q_n = (long)N * q_dim;
    // Rows of q | k | v: the inputs, the GPU's planar gradients and the CPU's.
    float *packed = xmalloc((size_t)packed_n * 4), *want = xmalloc((size_t)packed_n * 4);
    float *cpu_packed = xmalloc((size_t)packed_n * 4), *nans = xmalloc((size_t)packed_n * 4);
    for (long row = 0; row < N; row++) {
        const float *parts[3][3] = {{q, k, v}, {planar[1], planar[2], planar[3]}, {cpu_grads[0], cpu_grads[1], cpu_grads[2]}};
        float *rows[3] = {packed, want, cpu_packed};
        for (int r = 0; r < 3; r++) {
            memcpy(rows[r] + row * width, parts[r][0] + row * q_dim, (size_t)q_dim * 4);
            memcpy(rows[r] + row * width + q_dim, parts[r][1] + row * kv_dim, (size_t)kv_dim * 4);
            memcpy(rows[r] + row * width + q_dim + kv_dim, parts[r][2] + row * kv_dim, (size_t)kv_dim * 4);
        }
    }
    for (long i = 0; i < packed_n; i++) nans[i] = NAN;
    float *w = random_host((long)C * width, 0.2f), *dx = xmalloc((size_t)N * C * 4);
    cpu->matmul_backward(dx, NULL, NULL, cpu_packed, NULL, w, N, C, width, WRITE_OVERWRITE, WRITE_ADD);
    float *d_packed = gpu_floats(packed, packed_n), *d_dpacked = gpu_floats(nans, packed_n);
    float *d_nans[1] = {gpu_floats(nans, packed_n)};
    float *d_w = gpu_floats(w, (long)C * width); // [width, C] for the product's backward, [C, width] to fill the slot
    float *d_out = gpu->alloc(q_n * 4), *d_dx = gpu->alloc((size_t)N * C * 4);
    float *d_dx_unheld = gpu->alloc((size_t)N * C * 4), *d_scratch = gpu->alloc((size_t)N * C * 4);
    gpu->attention_forward_rotary(d_out, d_saved, d_packed, d_packed + q_dim, d_packed + q_dim + kv_dim, width, width,
                                  d_rs, d_positions, d_inv_freq, B, T, H, KV, D, softcap, window);
    fill_held_slots_with_nan(d_nans, 1, d_w, d_scratch, N, width, C);
    gpu->matmul_input_hold(d_dpacked, packed_n);
    gpu->attention_backward_rotary(d_dpacked, d_dpacked + q_dim, d_dpacked + q_dim + kv_dim, d_dout, d_out, d_saved,
                                   d_packed, d_packed + q_dim, d_packed + q_dim + kv_dim, width, width, d_rs,
                                   d_positions, d_inv_freq, B, T, H, KV, D, softcap, window);
    float *got = xmalloc((size_t)packed_n * 4), *got_unheld = xmalloc((size_t)N * C * 4);
    gpu->copy_to_host(got, d_dpacked, packed_n * 4);
    if (copy_in_backward) gpu->copy_to_device(d_dpacked, nans, (size_t)packed_n * 4);
    gpu->matmul_backward(d_dx, NULL, NULL, d_dpacked, NULL, d_w, N, C, width, WRITE_OVERWRITE, WRITE_ADD);
    gpu->matmul_input_release();
    gpu->copy_to_device(d_dpacked, got, (size_t)packed_n * 4);
    gpu->matmul_backward(d_dx_unheld, NULL, NULL, d_dpacked, NULL, d_w, N, C, width, WRITE_OVERWRITE, WRITE_ADD);

    long unwritten = 0, different = 0;
    for (long i = 0; i < packed_n; i++) {
        if (got[i] != got[i]) unwritten++;
        else different += memcmp(&got[i], &want[i], 4) != 0;
    }
    printf("# %-44s packed: gradient columns %ld unwritten, %ld not the planar bits\n", label, unwritten, different);
    EXPECT(unwritten == 0, "%s: %ld of the packed gradient's elements unwritten", label, unwritten);
    EXPECT(different == 0, "%s: %ld of the packed gradient's elements not the planar run's", label, different);
    gpu->copy_to_host(got, d_out, q_n * 4);
    EXPECT(memcmp(got, planar[0], q_n * 4) == 0, "%s: the output from packed rows is not the planar run's", label);
    char what[128];
    snprintf(what, sizeof what, "%s held packed gradient: the product%s", label,
             copy_in_backward ? " (of its copy)" : "");
    expect_match_keep(what, d_dx, dx, (long)N * C, TOL_BF16);
    gpu->copy_to_host(got, d_dx, (size_t)N * C * 4);
    gpu->copy_to_host(got_unheld, d_dx_unheld, (size_t)N * C * 4);
    EXPECT(memcmp(got, got_unheld, (size_t)N * C * 4) == 0,
           "%s: the product through the held packed gradient differs from the product without the hold", label);
    float *device[] = {d_packed, d_dpacked, d_nans[0], d_w, d_out, d_dx, d_dx_unheld, d_scratch};
    for (size_t i = 0; i < sizeof device / sizeof device[0]; i++) gpu->free(device[i]);
    free(packed), free(want), free(cpu_packed), free(nans), free(w), free(dx), free(got), free(got_unheld);
}

// The attention ops with the rotary positions inside (attention_forward_rotary) against the
// CPU's (rope_forward on copies, then the attention ops): output and the three gradients of
// the unrotated q, k, v, within the attention's tolerances, and q and k left as they were;
// then on packed rows (check_rotary_attention_packed).
// Positions run past T (a packed row's offsets) and far out (30000), where the angles'
// range reduction matters.
static void check_rotary_attention(const char *kernels, int B, int T, int H, int KV, int D, const int *row_start) {
    const char *previous = standing_in ? NULL : ops_cuda_attention_kernels();
    if (!standing_in) CHECK(ops_cuda_select_attention(kernels), "unknown attention kernels %s", kernels);
    const float softcap = attention_softcap;
    const int window = attention_window;
    char label[96];
    snprintf(label, sizeof label, "rotary attention %s B%d T%d H%d/%d hd%d%s%s", kernels, B, T, H, KV, D,
             softcap > 0 ? " cap" : "", window > 0 ? " window" : "");
    const long q_n = (long)B * T * H * D, kv_n = (long)B * T * KV * D, p_n = (long)B * H * T * T;
    const long saved_n = gpu->attention_saved_size(B, T, H, KV, D, softcap, window);
    int *positions = xmalloc((size_t)B * T * sizeof(int));
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) positions[b * T + t] = (t < row_start[b] ? 0 : t - row_start[b]) + b * 40000;
    float *inv_freq = xmalloc((size_t)(D / 2) * sizeof(float));
    for (int i = 0; i < D / 2; i++) inv_freq[i] = 1.0f / powf(10000.0f, (float)(2 * i) / (float)D);
    float *q = random_host(q_n, 1), *k = random_host(kv_n, 1), *v = random_host(kv_n, 1), *dout = random_host(q_n, 1);
    float *out = xmalloc(q_n * 4), *probs = xmalloc(p_n * 4), *got = xmalloc(q_n * 4);
    float *dq = xmalloc(q_n * 4), *dk = xmalloc(kv_n * 4), *dv = xmalloc(kv_n * 4);
    cpu->attention_forward_rotary(out, probs, q, k, v, H * D, KV * D, row_start, positions, inv_freq, B, T, H, KV, D,
                                  softcap, window);
    cpu->attention_backward_rotary(dq, dk, dv, dout, out, probs, q, k, v, H * D, KV * D, row_start, positions,
                                   inv_freq, B, T, H, KV, D, softcap, window);
    float *d_q = gpu_floats(q, q_n), *d_k = gpu_floats(k, kv_n), *d_v = gpu_floats(v, kv_n);
    float *d_dout = gpu_floats(dout, q_n), *d_inv_freq = gpu_floats(inv_freq, D / 2);
    int *d_rs = gpu_ints(row_start, B), *d_positions = gpu_ints(positions, (long)B * T);
    float *d_out = gpu->alloc(q_n * 4), *d_saved = gpu->alloc(saved_n * 4);
    float *d_dq = gpu->alloc(q_n * 4), *d_dk = gpu->alloc(kv_n * 4), *d_dv = gpu->alloc(kv_n * 4);
    gpu->attention_forward_rotary(d_out, d_saved, d_q, d_k, d_v, H * D, KV * D, d_rs, d_positions, d_inv_freq, B, T, H,
                                  KV, D, softcap, window);
    gpu->attention_backward_rotary(d_dq, d_dk, d_dv, d_dout, d_out, d_saved, d_q, d_k, d_v, H * D, KV * D, d_rs,
                                   d_positions, d_inv_freq, B, T, H, KV, D, softcap, window);
    struct { const char *name; float *device, *want; long n; } results[] = {
        {"out", d_out, out, q_n}, {"dq", d_dq, dq, q_n}, {"dk", d_dk, dk, kv_n}, {"dv", d_dv, dv, kv_n}};
    float *planar[4]; // the GPU's results, for the packed run
    for (int r = 0; r < 4; r++) {
        gpu->copy_to_host(got, results[r].device, results[r].n * 4);
        planar[r] = copy_host(got, results[r].n);
        const double error = relative_error(got, results[r].want, results[r].n);
        const double worst = worst_segment_error(got, results[r].want, results[r].n, D);
        printf("# %-44s %s %.3e (tolerance %.0e), worst head row %.3e (%.0e)\n", label, results[r].name, error,
               TOL_BF16, worst, TOL_BF16_ROW);
        EXPECT(error <= TOL_BF16, "%s %s: %.3e", label, results[r].name, error);
        EXPECT(worst <= TOL_BF16_ROW, "%s %s: %.3e in one head's row", label, results[r].name, worst);
    }
    gpu->copy_to_host(got, d_q, q_n * 4);
    EXPECT(memcmp(got, q, q_n * 4) == 0, "%s wrote q", label);
    gpu->copy_to_host(got, d_k, kv_n * 4);
    EXPECT(memcmp(got, k, kv_n * 4) == 0, "%s wrote k", label);
    float *cpu_grads[3] = {dq, dk, dv};
    check_rotary_attention_packed(label, q, k, v, planar, cpu_grads, d_dout, d_rs, d_positions, d_inv_freq, d_saved, B,
                                  T, H, KV, D, softcap, window, mma_kernels_ran(B, T, H, KV, D, softcap, window));
    for (int r = 0; r < 4; r++) free(planar[r]);
    float *device[] = {d_q, d_k, d_v, d_dout, d_inv_freq, d_out, d_saved, d_dq, d_dk, d_dv};
    for (size_t i = 0; i < sizeof device / sizeof device[0]; i++) gpu->free(device[i]);
    gpu->free(d_rs), gpu->free(d_positions);
    free(positions), free(inv_freq), free(q), free(k), free(v), free(dout), free(out), free(probs), free(got);
    free(dq), free(dk), free(dv);
    if (!standing_in) ops_cuda_select_attention(previous);
}

static void test_attention_rotary(void) {
    // The mma kernels (the rotating gathers), and the paths that rotate copies first (wmma,
    // unfused); a head_dim the fused kernels do not take (80: unfused).
    const int starts4[4] = {0, 70, 149, 3}, starts2[2] = {0, 2}, starts3[3] = {0, 5, 30};
    const char *kernels[] = {"mma", "mma-plain", "mma-ds", "wmma", "unfused"};
    for (size_t i = 0; i < sizeof kernels / sizeof kernels[0]; i++) {
        check_rotary_attention(kernels[i], 4, 150, 8, 2, 64, starts4);
        check_rotary_attention(kernels[i], 2, 70, 4, 4, 128, starts2);
    }
    check_rotary_attention("mma", 3, 37, 6, 2, 16, starts3);
    check_rotary_attention("mma", 3, 37, 6, 2, 80, starts3);
    // Gemma 2/3 (a query scalar equal to the head size): a sliding window on the mma kernels,
    // a soft cap (the unfused kernels, rotated copies in the backward's score recomputation).
    attention_window = 7;
    check_rotary_attention("mma", 4, 150, 8, 2, 64, starts4);
    attention_softcap = 1.0f;
    check_rotary_attention("mma", 3, 37, 6, 2, 32, starts3);
    attention_softcap = 0.0f;
    attention_window = 0;
}

static void test_attention_decode_and_cache(void) {
    const int B = 4, capacity = 50, length = 41, H = 6, KV = 3, D = 64, T = 3;
    const int row_start[4] = {0, 7, 40, 12};
    const long cache_n = (long)B * capacity * KV * D;
    float *kc = random_host(cache_n, 1), *vc = random_host(cache_n, 1), *q = random_host((long)B * H * D, 1);
    float *out = xmalloc((size_t)B * H * D * 4);
    cpu->attention_decode(out, q, kc, vc, row_start, B, capacity, length, H, KV, D, 0.0f, 0);
    float *d_kc = gpu_floats(kc, cache_n), *d_vc = gpu_floats(vc, cache_n), *d_q = gpu_floats(q, (long)B * H * D);
    int *d_rs = gpu_ints(row_start, B);
    float *d_out = gpu->alloc((size_t)B * H * D * 4);
    gpu->attention_decode(d_out, d_q, d_kc, d_vc, d_rs, B, capacity, length, H, KV, D, 0.0f, 0);
    expect_match_keep("attention_decode", d_out, out, (long)B * H * D, TOL_FP32); // written again below
    cpu->attention_decode(out, q, kc, vc, row_start, B, capacity, length, H, KV, D, 0.5f, 0);
    gpu->attention_decode(d_out, d_q, d_kc, d_vc, d_rs, B, capacity, length, H, KV, D, 0.5f, 0);
    expect_match_keep("attention_decode (soft cap 0.5)", d_out, out, (long)B * H * D, TOL_FP32);
    // A sliding window of 9 slots: shorter than rows 0, 1 and 3, longer than row 2's one slot.
    cpu->attention_decode(out, q, kc, vc, row_start, B, capacity, length, H, KV, D, 0.0f, 9);
    gpu->attention_decode(d_out, d_q, d_kc, d_vc, d_rs, B, capacity, length, H, KV, D, 0.0f, 9);
    expect_match("attention_decode (sliding window 9)", d_out, out, (long)B * H * D, TOL_FP32);

    float *x = random_host((long)B * T * KV * D, 1);
    float *d_x = gpu_floats(x, (long)B * T * KV * D);
    cpu->cache_write(kc, x, B, T, capacity, 9, KV * D);
    gpu->cache_write(d_kc, d_x, B, T, capacity, 9, KV * D);
    expect_match("cache_write", d_kc, kc, cache_n, 0.0);
    float *rows = random_host(5 * 100, 1), *rows_dst = random_host(5 * 70, 1);
    float *d_rows = gpu_floats(rows, 500), *d_rows_dst = gpu_floats(rows_dst, 350);
    cpu->copy_rows(rows_dst, 70, rows + 3, 100, 5, 60);
    gpu->copy_rows(d_rows_dst, 70, d_rows + 3, 100, 5, 60);
    expect_match("copy_rows", d_rows_dst, rows_dst, 350, 0.0);
    gpu->free(d_vc), gpu->free(d_q), gpu->free(d_rs), gpu->free(d_x), gpu->free(d_rows);
    free(kc), free(vc), free(q), free(out), free(x), free(rows), free(rows_dst);
}

// The half-float KV cache (--kv-cache f16): the GPU writes the CPU's halves bit for bit
// (both round to nearest even), and decodes from them as the CPU does.
static void test_attention_decode_f16(void) {
    const int B = 3, capacity = 300, length = 290, H = 8, KV = 2, D = 64;
    const int row_start[3] = {0, 100, 289};
    const long cache_n = (long)B * capacity * KV * D, x_n = (long)B * length * KV * D;
    float *keys = random_host(x_n, 1), *values = random_host(x_n, 1), *q = random_host((long)B * H * D, 2);
    uint16_t *kc = xcalloc((size_t)cache_n, 2), *vc = xcalloc((size_t)cache_n, 2);
    cpu->cache_write_f16(kc, keys, B, length, capacity, 0, KV * D);
    cpu->cache_write_f16(vc, values, B, length, capacity, 0, KV * D);
    uint16_t *d_kc = gpu->alloc((size_t)cache_n * 2), *d_vc = gpu->alloc((size_t)cache_n * 2);
    gpu->fill_zero((float *)d_kc, cache_n / 2);
    gpu->fill_zero((float *)d_vc, cache_n / 2);
    float *d_keys = gpu_floats(keys, x_n), *d_values = gpu_floats(values, x_n);
    gpu->cache_write_f16(d_kc, d_keys, B, length, capacity, 0, KV * D);
    gpu->cache_write_f16(d_vc, d_values, B, length, capacity, 0, KV * D);
    uint16_t *written = xmalloc((size_t)cache_n * 2);
    gpu->copy_to_host(written, d_kc, (size_t)cache_n * 2);
    long differ = 0;
    for (long i = 0; i < cache_n; i++) differ += written[i] != kc[i];
    printf("# %-34s %ld of %ld halves differ (tolerance 0)\n", "cache_write_f16", differ, cache_n);
    EXPECT(differ == 0, "cache_write_f16: %ld halves differ from the CPU's", differ);
    float *out = xmalloc((size_t)B * H * D * 4);
    cpu->attention_decode_f16(out, q, kc, vc, row_start, B, capacity, length, H, KV, D, 0.0f, 0);
    float *d_q = gpu_floats(q, (long)B * H * D);
    int *d_rs = gpu_ints(row_start, B);
    float *d_out = gpu->alloc((size_t)B * H * D * 4);
    gpu->attention_decode_f16(d_out, d_q, d_kc, d_vc, d_rs, B, capacity, length, H, KV, D, 0.0f, 0);
    expect_match("attention_decode_f16", d_out, out, (long)B * H * D, TOL_FP32);
    // attention_extend (serve's prompt cache): 7 queries per row at slots [250, 257) of both
    // caches, against the CPU's.
    const int T = 7, first_slot = 250;
    const int extend_start[3] = {0, 100, 240};
    float *q_ext = random_host((long)B * T * H * D, 2), *out_ext = xmalloc((size_t)B * T * H * D * 4);
    float *d_q_ext = gpu_floats(q_ext, (long)B * T * H * D);
    int *d_es = gpu_ints(extend_start, B);
    float *d_kf = gpu_floats(keys, x_n), *d_vf = gpu_floats(values, x_n);
    // The float cache here is the keys and values as written ([B, length] rows, capacity = length).
    cpu->attention_extend(out_ext, q_ext, keys, values, extend_start, B, T, length, first_slot, H, KV, D, 0.0f, 0);
    float *d_out_ext = gpu->alloc((size_t)B * T * H * D * 4);
    gpu->attention_extend(d_out_ext, d_q_ext, d_kf, d_vf, d_es, B, T, length, first_slot, H, KV, D, 0.0f, 0);
    expect_match("attention_extend", d_out_ext, out_ext, (long)B * T * H * D, TOL_FP32);
    cpu->attention_extend_f16(out_ext, q_ext, kc, vc, extend_start, B, T, capacity, first_slot, H, KV, D, 0.0f, 0);
    d_out_ext = gpu->alloc((size_t)B * T * H * D * 4);
    gpu->attention_extend_f16(d_out_ext, d_q_ext, d_kc, d_vc, d_es, B, T, capacity, first_slot, H, KV, D, 0.0f, 0);
    expect_match("attention_extend_f16", d_out_ext, out_ext, (long)B * T * H * D, TOL_FP32);
    gpu->free(d_q_ext), gpu->free(d_es), gpu->free(d_kf), gpu->free(d_vf);
    free(q_ext), free(out_ext);
    gpu->free(d_kc), gpu->free(d_vc), gpu->free(d_keys), gpu->free(d_values), gpu->free(d_q), gpu->free(d_rs);
    free(keys), free(values), free(q), free(kc), free(vc), free(written), free(out);
}

// The Q8_0 KV cache (--kv-cache q8_0, ops/cuda/attention_cached.cuh): the GPU writes the CPU's
// records byte for byte (the same quantization, each operation rounded alone), and decodes and
// extends from them as the CPU does; head_dim 80 (blocks of 32, 32 and 16) as well as 64.
static void test_attention_decode_q8(void) {
    for (int D = 64; D <= 80; D += 16) {
        const int B = 3, capacity = 300, length = 290, H = 8, KV = 2;
        const int row_start[3] = {0, 100, 289};
        const long slot_bytes = kv_q8_slot_bytes(KV, D), cache_bytes = (long)B * capacity * slot_bytes;
        const long x_n = (long)B * length * KV * D;
        float *keys = random_host(x_n, 1), *values = random_host(x_n, 1), *q = random_host((long)B * H * D, 2);
        uint8_t *kc = xcalloc((size_t)cache_bytes, 1), *vc = xcalloc((size_t)cache_bytes, 1);
        cpu->cache_write_q8(kc, keys, B, length, capacity, 0, KV, D);
        cpu->cache_write_q8(vc, values, B, length, capacity, 0, KV, D);
        uint8_t *d_kc = gpu->alloc((size_t)cache_bytes), *d_vc = gpu->alloc((size_t)cache_bytes); // zero-filled
        float *d_keys = gpu_floats(keys, x_n), *d_values = gpu_floats(values, x_n);
        gpu->cache_write_q8(d_kc, d_keys, B, length, capacity, 0, KV, D);
        gpu->cache_write_q8(d_vc, d_values, B, length, capacity, 0, KV, D);
        uint8_t *written = xmalloc((size_t)cache_bytes);
        gpu->copy_to_host(written, d_kc, (size_t)cache_bytes);
        long differ = 0;
        for (long i = 0; i < cache_bytes; i++) differ += written[i] != kc[i];
        printf("# %-34s head_dim %d: %ld of %ld bytes differ (tolerance 0)\n", "cache_write_q8", D, differ, cache_bytes);
        EXPECT(differ == 0, "cache_write_q8 (head_dim %d): %ld bytes differ from the CPU's", D, differ);
        float *out = xmalloc((size_t)B * H * D * 4);
        cpu->attention_decode_q8(out, q, kc, vc, row_start, B, capacity, length, H, KV, D, 0.0f, 0);
        float *d_q = gpu_floats(q, (long)B * H * D);
        int *d_rs = gpu_ints(row_start, B);
        float *d_out = gpu->alloc((size_t)B * H * D * 4);
        gpu->attention_decode_q8(d_out, d_q, d_kc, d_vc, d_rs, B, capacity, length, H, KV, D, 0.0f, 0);
        char what[64];
        snprintf(what, sizeof what, "attention_decode_q8 head_dim %d", D);
        expect_match(what, d_out, out, (long)B * H * D, TOL_FP32);
        const int T = 7, first_slot = 250;
        const int extend_start[3] = {0, 100, 240};
        float *q_ext = random_host((long)B * T * H * D, 2), *out_ext = xmalloc((size_t)B * T * H * D * 4);
        float *d_q_ext = gpu_floats(q_ext, (long)B * T * H * D);
        int *d_es = gpu_ints(extend_start, B);
        cpu->attention_extend_q8(out_ext, q_ext, kc, vc, extend_start, B, T, capacity, first_slot, H, KV, D, 0.0f, 0);
        float *d_out_ext = gpu->alloc((size_t)B * T * H * D * 4);
        gpu->attention_extend_q8(d_out_ext, d_q_ext, d_kc, d_vc, d_es, B, T, capacity, first_slot, H, KV, D, 0.0f, 0);
        snprintf(what, sizeof what, "attention_extend_q8 head_dim %d", D);
        expect_match(what, d_out_ext, out_ext, (long)B * T * H * D, TOL_FP32);
        gpu->free(d_q_ext), gpu->free(d_es), gpu->free(d_kc), gpu->free(d_vc), gpu->free(d_keys), gpu->free(d_values);
        gpu->free(d_q), gpu->free(d_rs);
        free(q_ext), free(out_ext), free(keys), free(values), free(q), free(kc), free(vc), free(written), free(out);
    }
}

// rotate_and_cache_write (one launch on the GPU: rope of q and k, then the new keys and values
// into the cache) against the CPU's four calls, on each kind of cache: q and k within the fp32
// tolerance, and the caches byte for byte what the CPU's cache writes make of the GPU's own
// rotated k and of v over the same starting bytes (the slots not written left alone); a
// decode step and a 3-slot extension, and without a table (learned positions).
static void test_rotate_and_cache_write(void) {
    const KvCacheType types[] = {KV_CACHE_F32, KV_CACHE_F16, KV_CACHE_Q8_0};
    const char *names[] = {"f32", "f16", "q8_0"};
    for (int kind = 0; kind < 3; kind++)
        for (int case_index = 0; case_index < 3; case_index++) {
            const int B = 3, T = case_index == 1 ? 3 : 1, capacity = 12, slot = 5, H = 8, KV = 2, D = 64;
            const bool rotate = case_index != 2;
            const long N = (long)B * T, q_n = N * H * D, kv_n = N * KV * D;
            const long slot_bytes = types[kind] == KV_CACHE_F32   ? (long)KV * D * 4
                                    : types[kind] == KV_CACHE_F16 ? (long)KV * D * 2
                                                                  : kv_q8_slot_bytes(KV, D);
            const long cache_bytes = (long)B * capacity * slot_bytes;
            int positions[9];
            for (long i = 0; i < N; i++) positions[i] = slot + (int)(i % T) + 700 * (int)(i / T);
            float inv_freq[32];
            for (int i = 0; i < D / 2; i++) inv_freq[i] = 1.0f / powf(10000.0f, (float)(2 * i) / (float)D);
            float *q = random_host(q_n, 2), *k = random_host(kv_n, 2), *v = random_host(kv_n, 2);
            float *noise = random_host(cache_bytes / 4, 1); // slot_bytes is a multiple of 4
            uint8_t *cpu_k = xmalloc((size_t)cache_bytes), *cpu_v = xmalloc((size_t)cache_bytes);
            memcpy(cpu_k, noise, (size_t)cache_bytes), memcpy(cpu_v, noise, (size_t)cache_bytes);
            float *d_q = gpu_floats(q, q_n), *d_k = gpu_floats(k, kv_n), *d_v = gpu_floats(v, kv_n);
            float *d_table = gpu_floats(inv_freq, D / 2);
            int *d_positions = gpu_ints(positions, N);
            void *d_kc = to_gpu(noise, (size_t)cache_bytes), *d_vc = to_gpu(noise, (size_t)cache_bytes);
            cpu->rotate_and_cache_write(q, k, v, cpu_k, cpu_v, types[kind], positions, B, T, capacity, slot, H, KV, D,
                                        rotate ? inv_freq : NULL);
            gpu->rotate_and_cache_write(d_q, d_k, d_v, d_kc, d_vc, types[kind], d_positions, B, T, capacity, slot, H, KV,
                                        D, rotate ? d_table : NULL);
            char what[80];
            snprintf(what, sizeof what, "rotate_and_cache_write %s T %d%s q", names[kind], T, rotate ? "" : " (no rope)");
            expect_match_keep(what, d_q, q, q_n, TOL_FP32);
            snprintf(what, sizeof what, "rotate_and_cache_write %s T %d%s k", names[kind], T, rotate ? "" : " (no rope)");
            expect_match_keep(what, d_k, k, kv_n, TOL_FP32);
            // The reference caches: the CPU's writes of the GPU's rotated k and of v.
            float *gpu_q = xmalloc((size_t)q_n * 4), *gpu_k = xmalloc((size_t)kv_n * 4);
            gpu->copy_to_host(gpu_q, d_q, (size_t)q_n * 4), gpu->copy_to_host(gpu_k, d_k, (size_t)kv_n * 4);
            uint8_t *want_k = xmalloc((size_t)cache_bytes), *want_v = xmalloc((size_t)cache_bytes);
            memcpy(want_k, noise, (size_t)cache_bytes), memcpy(want_v, noise, (size_t)cache_bytes);
            cpu->rotate_and_cache_write(gpu_q, gpu_k, v, want_k, want_v, types[kind], positions, B, T, capacity, slot, H,
                                        KV, D, NULL);
            uint8_t *got_k = xmalloc((size_t)cache_bytes), *got_v = xmalloc((size_t)cache_bytes);
            gpu->copy_to_host(got_k, d_kc, (size_t)cache_bytes), gpu->copy_to_host(got_v, d_vc, (size_t)cache_bytes);
            long differ = 0;
            for (long i = 0; i < cache_bytes; i++) differ += (got_k[i] != want_k[i]) + (got_v[i] != want_v[i]);
            printf("# %-34s %ld of %ld cache bytes differ (tolerance 0)\n", "rotate_and_cache_write", differ,
                   2 * cache_bytes);
            EXPECT(differ == 0, "rotate_and_cache_write (%s, T %d): %ld cache bytes differ from the CPU's writes",
                   names[kind], T, differ);
            gpu->free(d_q), gpu->free(d_k), gpu->free(d_v), gpu->free(d_table), gpu->free(d_positions);
            gpu->free(d_kc), gpu->free(d_vc);
            free(q), free(k), free(v), free(noise), free(cpu_k), free(cpu_v), free(gpu_q), free(gpu_k);
            free(want_k), free(want_v), free(got_k), free(got_v);
        }
}

static void test_activations_and_elementwise(void) {
    const long n = 100003;
    float *x = random_host(n, 4), *y = random_host(n, 4), *dy = random_host(n, 1);
    float *d_x = gpu_floats(x, n), *d_y = gpu_floats(y, n), *d_dy = gpu_floats(dy, n);
    float *out = xmalloc(n * 4), *d_out = gpu->alloc(n * 4);
    cpu->gelu_forward(out, x, n);
    gpu->gelu_forward(d_out, d_x, n);
    expect_match("gelu_forward", d_out, out, n, TOL_FP32);
    float *dx = random_host(n, 1);
    float *d_dx = gpu_floats(dx, n);
    cpu->gelu_backward(dx, dy, x, NULL, n);
    gpu->gelu_backward(d_dx, d_dy, d_x, NULL, n);
    expect_match("gelu_backward", d_dx, dx, n, TOL_FP32);
    for (int use_gelu = 0; use_gelu <= 1; use_gelu++) {
        d_out = gpu->alloc(n * 4);
        cpu->glu_forward(out, x, y, n, use_gelu);
        gpu->glu_forward(d_out, d_x, d_y, n, use_gelu);
        expect_match(use_gelu ? "geglu_forward" : "swiglu_forward", d_out, out, n, TOL_FP32);
        float *dg = random_host(n, 1), *du = random_host(n, 1);
        float *d_dg = gpu_floats(dg, n), *d_du = gpu_floats(du, n);
        cpu->glu_backward(dg, du, dy, x, y, NULL, n, use_gelu);
        gpu->glu_backward(d_dg, d_du, d_dy, d_x, d_y, NULL, n, use_gelu);
        expect_match("glu_backward dgate", d_dg, dg, n, TOL_FP32);
        expect_match("glu_backward dup", d_du, du, n, TOL_FP32);
        free(dg), free(du);
    }
    d_out = gpu->alloc(n * 4);
    cpu->add(out, x, y, n);
    gpu->add(d_out, d_x, d_y, n);
    expect_match("add", d_out, out, n, 0.0);
    float *acc = copy_host(y, n);
    float *d_acc = gpu_floats(acc, n);
    cpu->accumulate(acc, x, n);
    gpu->accumulate(d_acc, d_x, n);
    expect_match_keep("accumulate", d_acc, acc, n, 0.0); // scaled next
    cpu->scale(acc, 0.37f, n);
    gpu->scale(d_acc, 0.37f, n);
    expect_match("scale", d_acc, acc, n, 0.0);
    // Dropout: the same Philox mask on both (core/philox.h), so the forward matches bit for
    // bit; the backward adds through it (an add the GPU may order differently: fp32 bound).
    float *dropped = xmalloc(n * 4), *d_dropped = gpu->alloc(n * 4);
    cpu->dropout_forward(dropped, x, n, 0.25f, 1234, 77);
    gpu->dropout_forward(d_dropped, d_x, n, 0.25f, 1234, 77);
    expect_match("dropout_forward", d_dropped, dropped, n, 0.0);
    float *d_from = copy_host(y, n);
    float *d_d_from = gpu_floats(d_from, n);
    cpu->dropout_backward(d_from, x, n, 0.25f, 1234, 78);
    gpu->dropout_backward(d_d_from, d_x, n, 0.25f, 1234, 78);
    expect_match("dropout_backward", d_d_from, d_from, n, TOL_FP32);
    free(dropped), free(d_from); // expect_match freed their GPU copies
    // NEFTune's uniform noise: the same Philox words and the same two roundings, bit for bit.
    float *noisy = copy_host(y, n);
    float *d_noisy = gpu_floats(noisy, n);
    cpu->uniform_noise_add(noisy, n, 0.05f, 1234, 79);
    gpu->uniform_noise_add(d_noisy, n, 0.05f, 1234, 79);
    expect_match("uniform_noise_add", d_noisy, noisy, n, 0.0);
    free(noisy);
    float *avg = copy_host(y, n);
    float *d_avg = gpu_floats(avg, n);
    cpu->moving_average(avg, x, 0.9f, n);
    gpu->moving_average(d_avg, d_x, 0.9f, n);
    expect_match("moving_average", d_avg, avg, n, TOL_FP32);
    double want = cpu->sum_squares(x, n), got = gpu->sum_squares(d_x, n);
    printf("# %-34s %.3e (tolerance %.0e)\n", "sum_squares", fabs(got - want) / want, 1e-12);
    EXPECT(fabs(got - want) <= 1e-12 * want, "sum_squares %.17g vs %.17g", got, want);
    float *zero = xmalloc(n * 4);
    for (long i = 0; i < n; i++) zero[i] = 0.0f;
    gpu->fill_zero(d_x, n);
    expect_match("fill_zero", d_x, zero, n, 0.0);
    gpu->free(d_y), gpu->free(d_dy);
    free(x), free(y), free(dy), free(out), free(dx), free(acc), free(avg), free(zero);
}

static void test_logprob_and_value_head(void) {
    const int N = 67, V = 5003, C = 200;
    float *logits = random_host((long)N * V, 6);
    int targets[67];
    for (int i = 0; i < N; i++) targets[i] = i % 9 == 0 ? -1 : (i * 131) % V;
    logits[5 * V + 17] = logits[5 * V + 4000] = 50.0f; // a tie: the first index wins
    float *logp = xmalloc(N * 4), *lse = xmalloc(N * 4), *entropy = xmalloc(N * 4);
    int *top1 = xmalloc(N * 4), *top1_gpu = xmalloc(N * 4);
    cpu->logprob_forward(logp, lse, top1, entropy, logits, targets, N, V);
    float *d_logits = gpu_floats(logits, (long)N * V);
    int *d_targets = gpu_ints(targets, N), *d_top1 = gpu->alloc(N * 4);
    float *d_logp = gpu->alloc(N * 4), *d_lse = gpu->alloc(N * 4), *d_entropy = gpu->alloc(N * 4);
    gpu->logprob_forward(d_logp, d_lse, d_top1, d_entropy, d_logits, d_targets, N, V);
    gpu->copy_to_host(top1_gpu, d_top1, N * 4);
    EXPECT(memcmp(top1, top1_gpu, N * 4) == 0, "argmax differs");
    // Kept: the soft-capped rows below write them again.
    expect_match_keep("logprob_forward logp", d_logp, logp, N, TOL_FP32);
    expect_match_keep("logprob_forward entropy", d_entropy, entropy, N, TOL_FP32);
    // WPO's collision entropy (-log sum_v p_v^2) of the same rows; d_entropy as its output.
    float *collision = xmalloc(N * 4);
    cpu->collision_entropy_forward(collision, logits, N, V);
    gpu->collision_entropy_forward(d_entropy, d_logits, N, V);
    expect_match_keep("collision_entropy_forward", d_entropy, collision, N, TOL_FP32);
    free(collision);
    float *lse_gpu = xmalloc(N * 4);
    gpu->copy_to_host(lse_gpu, d_lse, N * 4);
    double error = relative_error(lse_gpu, lse, N);
    printf("# %-34s %.3e (tolerance %.0e)\n", "logprob_forward lse", error, TOL_FP32);
    EXPECT(error <= TOL_FP32, "lse %.3e", error);

    float *dlogp = random_host(N, 1), *dentropy = random_host(N, 1);
    float *d_dlogp = gpu_floats(dlogp, N), *d_dentropy = gpu_floats(dentropy, N);
    cpu->logprob_backward(logits, dlogp, dentropy, targets, lse, N, V, 0.0f);
    gpu->logprob_backward(d_logits, d_dlogp, d_dentropy, d_targets, d_lse, N, V, 0.0f);
    expect_match("logprob_backward", d_logits, logits, (long)N * V, TOL_FP32);
    // Gemma 2's final soft cap: the capped logits, their log-probs, and the gradient of the
    // raw logits through the cap. 5000 logits a row: the kernels read and write these rows
    // four floats at a time (5003 above: one at a time).
    const int V4 = 5000;
    int targets4[67];
    for (int i = 0; i < N; i++) targets4[i] = targets[i] < 0 ? -1 : targets[i] % V4;
    int *d_targets4 = gpu_ints(targets4, N);
    float *raw = random_host((long)N * V4, 6);
    float *d_raw = gpu_floats(raw, (long)N * V4);
    cpu->soft_cap_forward(raw, (long)N * V4, 4.0f);
    gpu->soft_cap_forward(d_raw, (long)N * V4, 4.0f);
    expect_match_keep("soft_cap_forward", d_raw, raw, (long)N * V4, TOL_FP32);
    cpu->logprob_forward(logp, lse, top1, entropy, raw, targets4, N, V4);
    gpu->logprob_forward(d_logp, d_lse, d_top1, d_entropy, d_raw, d_targets4, N, V4);
    gpu->copy_to_host(top1_gpu, d_top1, N * 4);
    EXPECT(memcmp(top1, top1_gpu, N * 4) == 0, "argmax differs (soft cap 4)");
    expect_match("logprob_forward logp (soft cap 4)", d_logp, logp, N, TOL_FP32);
    expect_match("logprob_forward entropy (soft cap 4)", d_entropy, entropy, N, TOL_FP32);
    cpu->logprob_backward(raw, dlogp, dentropy, targets4, lse, N, V4, 4.0f);
    gpu->logprob_backward(d_raw, d_dlogp, d_dentropy, d_targets4, d_lse, N, V4, 4.0f);
    expect_match("logprob_backward (soft cap 4)", d_raw, raw, (long)N * V4, TOL_FP32);
    gpu->free(d_targets4);
    free(raw);

    float *hidden = random_host((long)N * C, 1), *w = random_host(C, 1);
    float *values = xmalloc(N * 4);
    cpu->value_head_forward(values, hidden, w, N, C);
    float *d_hidden = gpu_floats(hidden, (long)N * C), *d_w = gpu_floats(w, C), *d_values = gpu->alloc(N * 4);
    gpu->value_head_forward(d_values, d_hidden, d_w, N, C);
    expect_match("value_head_forward", d_values, values, N, TOL_FP32);
    float *dvalues = random_host(N, 1), *dh = random_host((long)N * C, 1), *dw = random_host(C, 1);
    float *d_dvalues = gpu_floats(dvalues, N), *d_dh = gpu_floats(dh, (long)N * C), *d_dw = gpu_floats(dw, C);
    cpu->value_head_backward(dh, dw, dvalues, hidden, w, N, C);
    gpu->value_head_backward(d_dh, d_dw, d_dvalues, d_hidden, d_w, N, C);
    expect_match("value_head_backward dhidden", d_dh, dh, (long)N * C, TOL_FP32);
    expect_match("value_head_backward dweight", d_dw, dw, C, TOL_FP32);
    gpu->free(d_targets), gpu->free(d_top1), gpu->free(d_lse), gpu->free(d_dlogp), gpu->free(d_dentropy);
    gpu->free(d_hidden), gpu->free(d_w), gpu->free(d_dvalues);
    free(logits), free(logp), free(lse), free(entropy), free(top1), free(top1_gpu), free(lse_gpu), free(dlogp);
    free(dentropy), free(hidden), free(w), free(values), free(dvalues), free(dh), free(dw);
}

static void test_adamw(void) {
    const long n = 70001;
    float *p = random_host(n, 1), *g = random_host(n, 1), *m = random_host(n, 0.1f), *v = random_host(n, 0.1f);
    for (long i = 0; i < n; i++) v[i] = fabsf(v[i]);
    float *d_p = gpu_floats(p, n), *d_g = gpu_floats(g, n), *d_m = gpu_floats(m, n), *d_v = gpu_floats(v, n);
    cpu->adamw_update(p, g, m, v, n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.271f, 0.0975f, 0.5f);
    gpu->adamw_update(d_p, d_g, d_m, d_v, n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.271f, 0.0975f, 0.5f);
    expect_match("adamw_update params", d_p, p, n, TOL_FP32);
    expect_match("adamw_update m", d_m, m, n, TOL_FP32);
    expect_match("adamw_update v", d_v, v, n, TOL_FP32);
    gpu->free(d_g);
    free(p), free(g), free(m), free(v);
}

// The weights' bf16 copies (matmul.cu) of a range and of its parts, as the fused q/k/v
// product and a decode step's own products take them: a product of three weights side by
// side, then of each one alone (read from the one copy of the three); AdamW on the middle
// one, which writes its part of that copy (the products after it must see the new
// weights); a write from the host to the last one, which makes the copy stale. Each
// product against the CPU's on the same weights.
static void test_weight_copy_ranges(void) {
    const int N = 40, IC = 64, OC = 160, parts[3][2] = {{0, 96}, {96, 32}, {128, 32}}; // first row, rows
    float *x = random_host((long)N * IC, 1), *w = random_host((long)OC * IC, 0.2f);
    float *d_x = gpu_floats(x, (long)N * IC), *d_w = gpu_floats(w, (long)OC * IC);
    float *out = xmalloc((size_t)N * OC * 4);
    char what[80];
    for (int round = 0; round < 3; round++) {
        cpu->matmul_forward(out, x, w, NULL, N, IC, OC);
        float *d_out = gpu->alloc((size_t)N * OC * 4);
        gpu->matmul_forward(d_out, d_x, d_w, NULL, N, IC, OC);
        snprintf(what, sizeof what, "weight copy: the three (round %d)", round);
        expect_match(what, d_out, out, (long)N * OC, TOL_BF16);
        for (int p = 0; p < 3; p++) {
            const long first = (long)parts[p][0] * IC;
            cpu->matmul_forward(out, x, w + first, NULL, N, IC, parts[p][1]);
            d_out = gpu->alloc((size_t)N * parts[p][1] * 4);
            gpu->matmul_forward(d_out, d_x, d_w + first, NULL, N, IC, parts[p][1]);
            snprintf(what, sizeof what, "weight copy: part %d (round %d)", p, round);
            expect_match(what, d_out, out, (long)N * parts[p][1], TOL_BF16);
        }
        if (round == 0) { // AdamW on the middle part
            const long first = (long)parts[1][0] * IC, n = (long)parts[1][1] * IC;
            float *g = random_host(n, 1), *m = random_host(n, 0.1f), *v = random_host(n, 0.1f);
            for (long i = 0; i < n; i++) v[i] = fabsf(v[i]);
            float *d_g = gpu_floats(g, n), *d_m = gpu_floats(m, n), *d_v = gpu_floats(v, n);
            cpu->adamw_update(w + first, g, m, v, n, 0.05f, 0.9f, 0.95f, 1e-8f, 0.0f, 0.1f, 0.05f, 1.0f);
            gpu->adamw_update(d_w + first, d_g, d_m, d_v, n, 0.05f, 0.9f, 0.95f, 1e-8f, 0.0f, 0.1f, 0.05f, 1.0f);
            gpu->free(d_g), gpu->free(d_m), gpu->free(d_v);
            free(g), free(m), free(v);
        } else if (round == 1) { // new values for the last part, from the host
            const long first = (long)parts[2][0] * IC, n = (long)parts[2][1] * IC;
            for (long i = 0; i < n; i++) w[first + i] = random_uniform(-0.2f, 0.2f);
            gpu->copy_to_device(d_w + first, w + first, (size_t)n * 4);
        }
    }
    gpu->free(d_x), gpu->free(d_w);
    free(x), free(w), free(out);
}

// What ops_cuda_memory counts: a tensor's bytes while it lives, a weight's bf16 copy from its
// first product until the weight is freed, and the most held at once (kept over frees,
// dropped to what is held by ops_cuda_memory_reset_peak). Exact byte counts: another
// allocation of the backend's in between would show here.
static void test_device_memory(void) {
    const int N = 8, IC = 64, OC = 48;
    float *x = random_host((long)N * IC, 1), *w = random_host((long)OC * IC, 0.2f);
    float *d_x = gpu_floats(x, (long)N * IC), *d_w = gpu_floats(w, (long)OC * IC);
    float *d_out = gpu->alloc((size_t)N * OC * 4);
    gpu->matmul_forward(d_out, d_x, d_w, NULL, N, IC, OC); // allocates what it needs (scratch, the weight's copy)
    gpu->synchronize();
    ops_cuda_memory_reset_peak();
    const OpsCudaMemory before = ops_cuda_memory();
    EXPECT(before.peak_bytes == before.in_use_bytes, "after a reset the peak %zu is what is held, %zu",
           before.peak_bytes, before.in_use_bytes);

    const size_t big = (size_t)3 << 20, small = 4096;
    float *d_big = gpu->alloc(big), *d_small = gpu->alloc(small);
    OpsCudaMemory now = ops_cuda_memory();
    EXPECT(now.in_use_bytes == before.in_use_bytes + big + small, "two tensors: %zu bytes held, want %zu",
           now.in_use_bytes, before.in_use_bytes + big + small);
    gpu->free(d_big);
    now = ops_cuda_memory();
    EXPECT(now.in_use_bytes == before.in_use_bytes + small, "one freed: %zu held, want %zu", now.in_use_bytes,
           before.in_use_bytes + small);
    EXPECT(now.peak_bytes == before.in_use_bytes + big + small, "the peak %zu forgot the freed tensor (want %zu)",
           now.peak_bytes, before.in_use_bytes + big + small);

    // A new weight's first product makes its bf16 copy; freeing the weight frees the copy too.
    float *w2 = random_host((long)OC * IC, 0.2f), *d_w2 = gpu_floats(w2, (long)OC * IC);
    const size_t with_weight = ops_cuda_memory().in_use_bytes;
    gpu->matmul_forward(d_out, d_x, d_w2, NULL, N, IC, OC);
    gpu->synchronize();
    now = ops_cuda_memory();
    EXPECT(now.in_use_bytes == with_weight + (size_t)OC * IC * 2, "a weight's bf16 copy: %zu held, want %zu",
           now.in_use_bytes, with_weight + (size_t)OC * IC * 2);
    gpu->free(d_w2);
    gpu->free(d_small);
    now = ops_cuda_memory();
    EXPECT(now.in_use_bytes == before.in_use_bytes, "all freed: %zu held, want %zu as before", now.in_use_bytes,
           before.in_use_bytes);
    ops_cuda_memory_reset_peak();
    EXPECT(ops_cuda_memory().peak_bytes == before.in_use_bytes, "reset: peak %zu, want %zu",
           ops_cuda_memory().peak_bytes, before.in_use_bytes);
    printf("# device memory: %zu bytes held by the backend before the test's tensors\n", before.in_use_bytes);
    gpu->free(d_x), gpu->free(d_w), gpu->free(d_out);
    free(x), free(w), free(w2);
}

// matmul_forward_parts (a layer's q, k and v, or gate and up, from their weights side by
// side): each part's output the bits of its own matmul_forward on the GPU -- at 1, 5 and 8
// rows one matvec launch for all the parts, at 40 a cuBLASLt product per part -- with and
// without the parts' biases, 3 parts and 2; and the CPU's numbers within the bf16 tolerance.
static void test_matmul_parts(void) {
    const int IC = 64, widths3[3] = {96, 32, 32}, widths2[2] = {64, 64}, rows[4] = {1, 5, 8, 40};
    float *w = random_host(160L * IC, 0.2f), *bias = random_host(160, 0.5f);
    float *d_w = gpu_floats(w, 160L * IC), *d_bias = gpu_floats(bias, 160);
    char what[96];
    for (int r = 0; r < 4; r++)
        for (int shape = 0; shape < 2; shape++)
            for (int with_bias = 0; with_bias < 2; with_bias++) {
                const int N = rows[r], parts = shape == 0 ? 3 : 2;
                const int *widths = shape == 0 ? widths3 : widths2;
                float *x = random_host((long)N * IC, 1), *d_x = gpu_floats(x, (long)N * IC);
                float *d_outs[3], *cpu_outs[3];
                for (int p = 0; p < parts; p++) {
                    d_outs[p] = gpu->alloc((size_t)N * widths[p] * 4);
                    cpu_outs[p] = xmalloc((size_t)N * widths[p] * 4);
                }
                const float *b = with_bias ? bias : NULL, *d_b = with_bias ? d_bias : NULL;
                gpu->matmul_forward_parts(d_outs, widths, parts, d_x, d_w, d_b, N, IC, NULL);
                cpu->matmul_forward_parts(cpu_outs, widths, parts, x, w, b, N, IC, NULL);
                long first = 0;
                for (int p = 0; p < parts; p++) {
                    const long n = (long)N * widths[p];
                    float *got = xmalloc((size_t)n * 4), *alone = xmalloc((size_t)n * 4);
                    float *d_alone = gpu->alloc((size_t)n * 4);
                    gpu->matmul_forward(d_alone, d_x, d_w + first * IC, d_b ? d_b + first : NULL, N, IC, widths[p]);
                    gpu->copy_to_host(got, d_outs[p], (size_t)n * 4);
                    gpu->copy_to_host(alone, d_alone, (size_t)n * 4);
                    snprintf(what, sizeof what, "parts: %d rows, part %d of %d%s", N, p, parts, with_bias ? ", bias" : "");
                    EXPECT(!memcmp(got, alone, (size_t)n * 4), "%s: other bits than the part's own product", what);
                    expect_match_keep(what, d_outs[p], cpu_outs[p], n, TOL_BF16);
                    gpu->free(d_alone), gpu->free(d_outs[p]);
                    free(got), free(alone), free(cpu_outs[p]);
                    first += widths[p];
                }
                gpu->free(d_x), free(x);
            }
    gpu->free(d_w), gpu->free(d_bias);
    free(w), free(bias);
}

// What the GLU op tests check of one call: `act` made by the one op (held, then read by a
// product into `out`) against `act_calls` made by the op's calls (likewise into
// `out_calls`): the same bits for both, and act within the bf16 tolerance of the CPU's
// `cpu_act`. Frees the four device buffers.
static void expect_glu_outputs(const char *what, float *d_act, float *d_act_calls, float *d_out, float *d_out_calls,
                               const float *cpu_act, long n, long out_n) {
    float *got = xmalloc((size_t)n * 4), *want = xmalloc((size_t)n * 4);
    float *out = xmalloc((size_t)out_n * 4), *out_calls = xmalloc((size_t)out_n * 4);
    gpu->copy_to_host(got, d_act, (size_t)n * 4);
    gpu->copy_to_host(want, d_act_calls, (size_t)n * 4);
    EXPECT(!memcmp(got, want, (size_t)n * 4), "%s: other bits than the op's calls", what);
    gpu->copy_to_host(out, d_out, (size_t)out_n * 4);
    gpu->copy_to_host(out_calls, d_out_calls, (size_t)out_n * 4);
    EXPECT(!memcmp(out, out_calls, (size_t)out_n * 4), "%s: the product of the held act differs", what);
    expect_match_keep(what, d_act, cpu_act, n, TOL_BF16);
    gpu->free(d_act), gpu->free(d_act_calls), gpu->free(d_out), gpu->free(d_out_calls);
    free(got), free(want), free(out), free(out_calls);
}

// matmul_forward_glu (a gated MLP's gate and up products and activation; a decode step's one
// launch that never writes gate and up): act the bits of matmul_forward_parts then
// glu_forward on the GPU, SwiGLU and GeGLU, at 1, 5 and 8 rows (the one launch) and 40 (those
// two ops); the CPU's within the bf16 tolerance; and with act held (matmul_input_hold), the
// down product that reads its copy gives the bits it gives after the two ops.
static void test_matmul_glu(void) {
    enum { IC = 64, I = 96, C = 48 };
    const int rows[4] = {1, 5, 8, 40};
    float *w = random_host(2L * I * IC, 0.3f), *down = random_host((long)C * I, 0.2f);
    float *d_w = gpu_floats(w, 2L * I * IC), *d_down = gpu_floats(down, (long)C * I);
    char what[96];
    for (int r = 0; r < 4; r++)
        for (int gelu = 0; gelu < 2; gelu++) {
            const int N = rows[r];
            const long n = (long)N * I;
            float *x = random_host((long)N * IC, 1), *d_x = gpu_floats(x, (long)N * IC);
            float *cpu_act = xmalloc((size_t)n * 4), *cpu_gate = xmalloc((size_t)n * 4), *cpu_up = xmalloc((size_t)n * 4);
            float *d_act = gpu->alloc((size_t)n * 4), *d_gate = gpu->alloc((size_t)n * 4), *d_up = gpu->alloc((size_t)n * 4);
            float *d_act_calls = gpu->alloc((size_t)n * 4), *d_out = gpu->alloc((size_t)N * C * 4);
            float *d_out_calls = gpu->alloc((size_t)N * C * 4);
            snprintf(what, sizeof what, "glu product: %d rows, %s", N, gelu ? "GeGLU" : "SwiGLU");
            cpu->matmul_forward_glu(cpu_act, cpu_gate, cpu_up, x, w, N, IC, I, gelu, NULL);
            // Held act: the op writes its copy, which the down product then reads.
            gpu->matmul_input_hold(d_act, n);
            gpu->matmul_forward_glu(d_act, d_gate, d_up, d_x, d_w, N, IC, I, gelu, NULL);
            gpu->matmul_forward(d_out, d_act, d_down, NULL, N, I, C);
            gpu->matmul_input_release();
            gpu->matmul_input_hold(d_act_calls, n);
            ops_matmul_forward_glu_in_calls(gpu, d_act_calls, d_gate, d_up, d_x, d_w, N, IC, I, gelu, NULL);
            gpu->matmul_forward(d_out_calls, d_act_calls, d_down, NULL, N, I, C);
            gpu->matmul_input_release();
            expect_glu_outputs(what, d_act, d_act_calls, d_out, d_out_calls, cpu_act, n, (long)N * C);
            gpu->free(d_x), gpu->free(d_gate), gpu->free(d_up);
            free(x), free(cpu_act), free(cpu_gate), free(cpu_up);
        }
    gpu->free(d_w), gpu->free(d_down);
    free(w), free(down);
}

// ---------------------------------------------------------------------------------------
// Whole models

// The *_window fixtures: sliding windows of 5 keys (the unfused kernels where they slide).
static const char *fixture_models[] = {"gpt2",          "llama",         "llama_tied",    "llama3_rope",
                                       "qwen2",         "qwen3",         "gemma",         "gemma2",
                                       "gemma3",        "random-hd64",   "mistral_window", "gemma2_window",
                                       "gemma3_window", "qwen2_window"};

// A Llama with the head size of real models (64), GQA, random weights.
static void random_llama_pair(Model *on_cpu, Model *on_gpu, bool value_head) {
    ModelConfig cfg = {0};
    cfg.family = FAMILY_LLAMA;
    cfg.vocab_size = 300, cfg.hidden_size = 256, cfg.num_layers = 2, cfg.num_heads = 4, cfg.num_kv_heads = 2;
    cfg.intermediate_size = 512, cfg.max_position_embeddings = 1024, cfg.norm_eps = 1e-5f, cfg.rope_theta = 10000.0f;
    CHECK(config_finish(&cfg, "random-hd64") == 0, "%s", err_msg());
    model_init(on_cpu, &cfg, cpu, true, value_head);
    model_init(on_gpu, &cfg, gpu, true, value_head);
    float *w = random_host(on_cpu->table.total, 0.08f);
    for (int i = 0; i < on_cpu->table.count; i++)
        if (strstr(on_cpu->table.entries[i].name, "norm"))
            for (long j = 0; j < on_cpu->table.entries[i].numel; j++) w[on_cpu->table.entries[i].offset + j] += 1.0f;
    memcpy(on_cpu->params, w, on_cpu->table.total * 4);
    gpu->copy_to_device(on_gpu->params, w, on_gpu->table.total * 4);
    free(w);
}

static void load_pair(Model *on_cpu, Model *on_gpu, const char *dir, bool value_head) {
    ModelLoadOptions options = {.with_lm_head = true, .with_value_head = value_head};
    if (!strcmp(dir, "tests/fixtures/models/random-hd64")) {
        random_llama_pair(on_cpu, on_gpu, value_head);
    } else {
        CHECK(model_load(on_cpu, dir, cpu, &options) == 0, "%s", err_msg());
        CHECK(model_load(on_gpu, dir, gpu, &options) == 0, "%s", err_msg());
    }
    if (value_head) { // a random value head, the same on both
        const ParamEntry *e = NULL;
        for (int i = 0; i < on_cpu->table.count; i++)
            if (!strcmp(on_cpu->table.entries[i].name, "score.weight")) e = &on_cpu->table.entries[i];
        CHECK(e, "no score.weight");
        float *w = random_host(e->numel, 0.5f);
        memcpy(on_cpu->params + e->offset, w, e->numel * 4);
        gpu->copy_to_device(on_gpu->params + e->offset, w, e->numel * 4);
        free(w);
    }
}

// What compare_pair takes from one model: per-token log-probs, entropies and values of a
// forward, and (host copies of) the trainable gradients of the backward below.
typedef struct {
    float *logp, *entropy, *values, *grads;
    double loss;
} ModelRun;

static ModelRun run_model(Model *model, const ModelBatch *batch, const int *targets) {
    const long N = (long)batch->B * batch->T;
    ModelRun run = {.logp = xmalloc(N * 4), .entropy = xmalloc(N * 4), .values = xmalloc(N * 4)};
    model_enable_grad(model);
    model_forward(model, batch);
    model_logprobs(model, targets, run.logp, NULL, run.entropy);
    model_values(model, run.values);
    int count = 0;
    for (long i = 0; i < N; i++)
        if (targets[i] >= 0) run.loss -= run.logp[i], count++;
    run.loss /= count;
    // Backward of mean NLL + 0.1 entropy + 0.5 sum of values.
    float *dlogp = xmalloc(N * 4), *dent = xmalloc(N * 4), *dval = xmalloc(N * 4);
    for (long i = 0; i < N; i++) {
        dlogp[i] = targets[i] >= 0 ? -1.0f / count : 0.0f;
        dent[i] = targets[i] >= 0 ? 0.1f / count : 0.0f;
        dval[i] = targets[i] >= 0 ? 0.5f / count : 0.0f;
    }
    model_zero_grad(model);
    model_backward(model, dlogp, dent, dval);
    const long trainable = model_trainable_floats(model);
    run.grads = xmalloc((size_t)trainable * 4);
    model->ops->copy_to_host(run.grads, model->grads, (size_t)trainable * 4);
    free(dlogp), free(dent), free(dval);
    return run;
}

static void model_run_free(ModelRun *run) { free(run->logp), free(run->entropy), free(run->values), free(run->grads); }

// Per tensor, ||got - cpu|| over max(||cpu||, 1e-3 ||whole cpu gradient||): some gradients
// are zero in exact arithmetic (a key bias shifts every score of a row equally), and bf16
// rounding leaves noise there that is small against the rest.
static double tensor_error(const Model *mc, const ParamEntry *e, const float *got, const float *want, double floor) {
    const long at = e->offset - mc->trainable_offset;
    double diff = 0, norm = 0;
    for (long j = 0; j < e->numel; j++) {
        double d = (double)got[at + j] - want[at + j];
        diff += d * d, norm += (double)want[at + j] * want[at + j];
    }
    return sqrt(diff) / fmax(sqrt(norm), floor);
}

// One model on both backends: log-probs, entropy, values, loss and every trainable
// parameter's gradient. With `rounded` (the same model on bf16_rounding), each figure's
// tolerance is TOL_MODEL or 3 times the error bf16 rounding alone gives the CPU there,
// whichever is larger: the GPU's error is that rounding's plus its own summation order.
static void compare_runs(const char *name, Model *mc, Model *mg, ModelRun *run_c, ModelRun *run_g, ModelRun *run_r,
                         long N);

static void compare_pair_rounded(const char *name, Model *mc, Model *mg, Model *rounded) {
    // Two attention tiles where the positions allow (GPT-2's fixture has 64).
    const int B = 3, T = mc->config.positions == POSITIONS_LEARNED ? 64 : 90;
    const int row_start[3] = {0, 4, T - 19};
    const int row_len[3] = {T, T - 4, 19};
    const int V = mc->config.vocab_size;
    long N = (long)B * T;
    int *tokens = xmalloc(N * 4), *targets = xmalloc(N * 4);
    for (long i = 0; i < N; i++) tokens[i] = (int)(random_uniform(0, 1) * V) % V;
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            bool real = t >= row_start[b] && t + 1 < row_start[b] + row_len[b];
            targets[b * T + t] = real ? tokens[b * T + t + 1] : -1;
        }
    ModelBatch batch = {.B = B, .T = T, .tokens = tokens, .row_start = row_start, .row_len = row_len};
    ModelRun c = run_model(mc, &batch, targets), g = run_model(mg, &batch, targets), r = {0};
    if (rounded) r = run_model(rounded, &batch, targets);
    compare_runs(name, mc, mg, &c, &g, rounded ? &r : NULL, N);
    free(tokens), free(targets);
}

// The figures of compare_pair_rounded from the runs of one batch of N slots (r: NULL, or the
// run with bf16 operands on the CPU). Frees the runs.
static void compare_runs(const char *name, Model *mc, Model *mg, ModelRun *run_c, ModelRun *run_g, ModelRun *run_r,
                         long N) {
    const bool rounded = run_r != NULL;
    ModelRun c = *run_c, g = *run_g, r = rounded ? *run_r : (ModelRun){0};
    const float *outputs_c[3] = {c.logp, c.entropy, c.values}, *outputs_g[3] = {g.logp, g.entropy, g.values};
    const float *outputs_r[3] = {r.logp, r.entropy, r.values};
    double errors[3], limits[3], rounding[3] = {0};
    bool forward_ok = true;
    for (int i = 0; i < 3; i++) {
        errors[i] = relative_error(outputs_g[i], outputs_c[i], N);
        if (rounded) rounding[i] = relative_error(outputs_r[i], outputs_c[i], N);
        limits[i] = fmax(TOL_MODEL, 3 * rounding[i]);
        forward_ok = forward_ok && errors[i] <= limits[i];
    }
    printf("# %-10s logp %.3e  entropy %.3e  values %.3e  loss %.6f vs %.6f", name, errors[0], errors[1], errors[2],
           g.loss, c.loss);
    if (rounded) printf("  (bf16 operands on the CPU: %.3e %.3e %.3e)", rounding[0], rounding[1], rounding[2]);
    printf("\n");
    EXPECT(forward_ok, "%s forward", name);
    EXPECT(fabs(g.loss - c.loss) <= 1e-2 * fabs(c.loss), "%s loss %.6f vs %.6f", name, g.loss, c.loss);

    const long trainable = model_trainable_floats(mg);
    double total = 0;
    for (long i = 0; i < trainable; i++) total += (double)c.grads[i] * c.grads[i];
    const double floor = 1e-3 * sqrt(total);
    double worst = 0, worst_error = 0, worst_rounding = 0; // worst: error / its limit
    const char *worst_name = "";
    for (int i = 0; i < mc->table.count; i++) {
        const ParamEntry *e = &mc->table.entries[i];
        if (e->offset < mc->trainable_offset) continue; // frozen
        const double error = tensor_error(mc, e, g.grads, c.grads, floor);
        const double from_rounding = rounded ? tensor_error(mc, e, r.grads, c.grads, floor) : 0.0;
        const double ratio = error / fmax(TOL_MODEL, 3 * from_rounding);
        if (!(ratio <= worst)) worst = ratio, worst_error = error, worst_rounding = from_rounding, worst_name = e->name;
    }
    printf("# %-10s gradients: worst tensor %s %.3e (tolerance %.0e", name, worst_name, worst_error, TOL_MODEL);
    if (rounded) printf("; bf16 operands on the CPU %.3e there, so %.3e", worst_rounding, fmax(TOL_MODEL, 3 * worst_rounding));
    printf(")\n");
    EXPECT(worst <= 1.0, "%s gradient %s: %.3e", name, worst_name, worst_error);
    model_run_free(&c), model_run_free(&g);
    if (rounded) model_run_free(&r);
}

static void compare_pair(const char *name, Model *mc, Model *mg) { compare_pair_rounded(name, mc, mg, NULL); }

// Packed rows (model.h's segments, SFT's --packing): two rows of sequences side by side, one
// with padding after them, each sequence attending to itself only. The backend runs them
// through model/packed_attention.c's copies and its attention ops in the layout of one
// sequence a row; the figures are compare_pair's against the CPU's packed run.
static void test_packed_rows(void) {
    const char *names[] = {"llama", "gpt2", "qwen3", "gemma2_window", "random-hd64"};
    for (size_t k = 0; k < sizeof names / sizeof names[0]; k++) {
        char dir[256], label[64];
        snprintf(dir, sizeof dir, "tests/fixtures/models/%s", names[k]);
        snprintf(label, sizeof label, "%s packed", names[k]);
        Model mc, mg;
        load_pair(&mc, &mg, dir, true);
        const int B = 2, T = mc.config.positions == POSITIONS_LEARNED ? 64 : 90, V = mc.config.vocab_size;
        const ModelSegment segments[] = {{0, 0, 23}, {0, 23, T - 23 - 11}, {1, 0, T - 30}, {1, T - 30, 30}};
        const long N = (long)B * T;
        int *tokens = xmalloc(N * 4), *targets = xmalloc(N * 4);
        for (long i = 0; i < N; i++) tokens[i] = (int)(random_uniform(0, 1) * V) % V, targets[i] = -1;
        for (int s = 0; s < 4; s++)
            for (int t = 0; t + 1 < segments[s].length; t++) {
                const long slot = (long)segments[s].row * T + segments[s].start + t;
                targets[slot] = tokens[slot + 1];
            }
        ModelBatch batch = {.B = B, .T = T, .tokens = tokens, .segments = segments, .segment_count = 4};
        ModelRun c = run_model(&mc, &batch, targets), g = run_model(&mg, &batch, targets);
        compare_runs(label, &mc, &mg, &c, &g, NULL, N);
        free(tokens), free(targets);
        model_free(&mc), model_free(&mg);
    }
}

static void test_fixture_models(void) {
    for (size_t k = 0; k < sizeof fixture_models / sizeof fixture_models[0]; k++) {
        char dir[256];
        snprintf(dir, sizeof dir, "tests/fixtures/models/%s", fixture_models[k]);
        Model mc, mg;
        load_pair(&mc, &mg, dir, true);
        compare_pair(fixture_models[k], &mc, &mg);
        model_free(&mc);
        model_free(&mg);
    }
}

// DoRA's ops (ops.h dora_*): the weight's row norms, the rescaled output with the base
// result taken from out less its bias and given apart (dropout), the backward with and
// without the magnitude gradient. Elementwise results within fp32 rounding (the GPU may
// fuse a multiply-add); the norms and the magnitude gradient are sums in another order.
static void test_dora_ops(void) {
    const int rows = 150, cols = 200, N = 70, OC = 150;
    float *weight = random_host((long)rows * cols, 1), *delta = random_host((long)rows * cols, 1);
    float *norm = xmalloc(rows * sizeof(float)), *d_norm = gpu->alloc(rows * sizeof(float));
    cpu->dora_weight_norm(norm, weight, delta, 0.7f, rows, cols);
    gpu->dora_weight_norm(d_norm, gpu_floats(weight, (long)rows * cols), gpu_floats(delta, (long)rows * cols), 0.7f,
                          rows, cols);
    expect_match("dora_weight_norm", d_norm, norm, rows, TOL_FP32);

    float *magnitude = random_host(OC, 1), *bias = random_host(OC, 1);
    for (int o = 0; o < OC; o++) magnitude[o] = norm[o] * (1.0f + 0.5f * magnitude[o]);
    float *d_m = gpu_floats(magnitude, OC), *d_n = gpu_floats(norm, OC), *d_bias = gpu_floats(bias, OC);
    for (int with_base = 0; with_base < 2; with_base++) {
        float *out = random_host((long)N * OC, 1), *z = random_host((long)N * OC, 1), *base = random_host((long)N * OC, 1);
        float *d_out = gpu_floats(out, (long)N * OC), *d_z = gpu_floats(z, (long)N * OC);
        float *d_base = gpu_floats(base, (long)N * OC);
        cpu->dora_forward(out, z, with_base ? base : NULL, bias, magnitude, norm, N, OC);
        gpu->dora_forward(d_out, d_z, with_base ? d_base : NULL, d_bias, d_m, d_n, N, OC);
        expect_match(with_base ? "dora_forward out (base given)" : "dora_forward out (out - bias)", d_out, out,
                     (long)N * OC, TOL_FP32);
        expect_match(with_base ? "dora_forward z (base given)" : "dora_forward z (out - bias)", d_z, z, (long)N * OC,
                     TOL_FP32);
        gpu->free(d_base);
        free(out), free(z), free(base);
    }
    float *dout = random_host((long)N * OC, 1), *z = random_host((long)N * OC, 1);
    float *dm = random_host(OC, 1), *scaled = xmalloc((size_t)N * OC * sizeof(float));
    float *d_dout = gpu_floats(dout, (long)N * OC), *d_z = gpu_floats(z, (long)N * OC), *d_dm = gpu_floats(dm, OC);
    float *d_scaled = gpu->alloc((size_t)N * OC * sizeof(float));
    cpu->dora_backward(dm, scaled, dout, z, magnitude, norm, 0.0f, N, OC);
    gpu->dora_backward(d_dm, d_scaled, d_dout, d_z, d_m, d_n, 0.0f, N, OC);
    expect_match("dora_backward dmagnitude", d_dm, dm, OC, TOL_FP32);
    expect_match("dora_backward s * dout", d_scaled, scaled, (long)N * OC, TOL_FP32);
    d_scaled = gpu->alloc((size_t)N * OC * sizeof(float));
    cpu->dora_backward(NULL, scaled, dout, NULL, magnitude, norm, -1.0f, N, OC);
    gpu->dora_backward(NULL, d_scaled, d_dout, NULL, d_m, d_n, -1.0f, N, OC);
    expect_match("dora_backward (s - 1) * dout", d_scaled, scaled, (long)N * OC, TOL_FP32);
    gpu->free(d_dout), gpu->free(d_z), gpu->free(d_m), gpu->free(d_n), gpu->free(d_bias);
    free(weight), free(delta), free(norm), free(magnitude), free(bias), free(dout), free(z), free(dm), free(scaled);
}

// LoRA adapters (PEFT's, tools/make_lora_fixtures.py) on a frozen base, and PEFT's DoRA
// adapter on the tiny Llama. The value head stays frozen (its random weights still give the
// values compared): the fixture adapters hold no "score", which lora_read_adapter would
// read for a trained one.
// The entries of `from` (a CPU model) whose names contain `part`, into `to` (any backend).
static void copy_entries(Model *to, const Model *from, const char *part) {
    for (int i = 0; i < from->table.count; i++) {
        const ParamEntry *e = &from->table.entries[i];
        if (strstr(e->name, part))
            to->ops->copy_to_device(to->params + to->table.entries[i].stored, from->params + e->offset,
                                    (size_t)e->numel * sizeof(float));
    }
}

// The model of `dir` on bf16_rounding with mc's random value head.
static void load_rounded(Model *rounded, const Model *mc, const char *dir) {
    ModelLoadOptions options = {.with_lm_head = true, .with_value_head = true};
    CHECK(model_load(rounded, dir, &bf16_rounding, &options) == 0, "%s", err_msg());
    copy_entries(rounded, mc, "score.weight");
}

// LoRA and DoRA adapters (PEFT fixtures) on the GPU against the CPU, with the CPU's own
// error under bf16 operands as the measure of each adapter gradient's conditioning.
static void test_lora_models(void) {
    static const char *names[] = {"llama", "qwen2", "gemma", "llama"}, *adapters[] = {"lora", "lora", "lora", "dora"};
    for (size_t k = 0; k < sizeof names / sizeof names[0]; k++) {
        char dir[256], adapter[280], label[64];
        snprintf(dir, sizeof dir, "tests/fixtures/models/%s", names[k]);
        snprintf(adapter, sizeof adapter, "%s/%s", dir, adapters[k]);
        snprintf(label, sizeof label, "%s+%s", names[k], adapters[k]);
        Model mc, mg, mr;
        load_pair(&mc, &mg, dir, true);
        load_rounded(&mr, &mc, dir);
        LoraConfig lora = {.rank = 4, .alpha = 8.0f, .targets = (1u << LORA_TARGETS) - 1,
                           .dora = !strcmp(adapters[k], "dora")};
        CHECK(model_add_lora(&mc, &lora, false, 3) == 0 && model_add_lora(&mg, &lora, false, 3) == 0 &&
                  model_add_lora(&mr, &lora, false, 3) == 0,
              "%s", err_msg());
        CHECK(lora_read_adapter(&mc, adapter) == 0 && lora_read_adapter(&mg, adapter) == 0 &&
                  lora_read_adapter(&mr, adapter) == 0,
              "%s", err_msg());
        compare_pair_rounded(label, &mc, &mg, &mr);
        model_free(&mc);
        model_free(&mg);
        model_free(&mr);
    }
}

// Generation on the GPU (KV cache in GPU memory): the log-probs it reports for its own
// tokens agree with a CPU forward over the same tokens. Row 3 repeats row 0's prompt, so
// the two share one prefill and row 3's cache rows are copied on the device. Greedy (each
// step's tokens from the log-prob kernel's argmax, model_last_greedy), then rows sampled
// with top-k beside a greedy one (each step's candidates from the device,
// model_last_candidates).
static void check_generation_on_gpu(const char *label, const SamplerConfig *samplers) {
    Model mc, mg;
    load_pair(&mc, &mg, "tests/fixtures/models/tiny_chat", false);
    const int B = 4, new_tokens = 12;
    int p0[] = {5, 17, 300, 41, 9}, p1[] = {77, 12}, p2[] = {1, 2, 3, 4, 5, 6, 7, 8};
    const int *prompts[] = {p0, p1, p2, p0};
    int lengths[] = {5, 2, 8, 5};
    GenerateOptions gen = {.row_samplers = samplers, .max_new_tokens = new_tokens, .seed = 3};
    GeneratedRow rows[4];
    generate(&mg, prompts, lengths, NULL, B, &gen, rows, NULL);
    for (int b = 0; b < B; b++)
        for (int j = 0; j < rows[b].length; j++)
            EXPECT((samplers[b].temperature > 0.0f) == (rows[b].sampling_logprobs[j] != 0.0f) &&
                       rows[b].sampling_logprobs[j] <= 0.0f,
                   "%s row %d step %d: sampling log-prob %g", label, b, j, rows[b].sampling_logprobs[j]);
    double worst = 0;
    for (int b = 0; b < B; b++) {
        int T = lengths[b] + rows[b].length;
        int *tokens = xmalloc(T * 4), *targets = xmalloc(T * 4);
        memcpy(tokens, prompts[b], lengths[b] * 4);
        memcpy(tokens + lengths[b], rows[b].tokens, rows[b].length * 4);
        for (int t = 0; t < T; t++) targets[t] = t + 1 < T ? tokens[t + 1] : -1;
        float *logp = xmalloc(T * 4);
        ModelBatch batch = {.B = 1, .T = T, .tokens = tokens};
        model_forward(&mc, &batch);
        model_logprobs(&mc, targets, logp, NULL, NULL);
        for (int j = 0; j < rows[b].length; j++) {
            double d = fabs(logp[lengths[b] - 1 + j] - rows[b].logprobs[j]);
            if (d > worst) worst = d;
        }
        free(tokens), free(targets), free(logp);
        generated_row_free(&rows[b]);
    }
    printf("# %-34s %.3e (tolerance 5e-2 abs)\n", label, worst);
    EXPECT(worst <= 5e-2, "%s: generated log-probs differ from the CPU forward by %.3e", label, worst);
    model_free(&mc);
    model_free(&mg);
}

// A training step, then generation with a KV cache, then the same step again on `trained`:
// the same loss and gradients; the generated tokens and log-probs those of `frozen`, the
// same weights without gradients (test_stored_only_buffers).
static void check_training_around_generation(const char *name, Model *trained, Model *frozen, int B, int T) {
    const long N = (long)B * T;
    const int V = trained->config.vocab_size;
    int *tokens = xmalloc(N * 4), *targets = xmalloc(N * 4);
    for (long i = 0; i < N; i++) tokens[i] = (int)(random_uniform(0, 1) * V) % V;
    for (long i = 0; i < N; i++) targets[i] = (i + 1) % T ? tokens[i + 1] : -1;
    ModelBatch batch = {.B = B, .T = T, .tokens = tokens};
    ModelRun first = run_model(trained, &batch, targets);

    const SamplerConfig greedy[2] = {{.temperature = 0.0f}, {.temperature = 0.0f}};
    int p0[] = {5, 17, 100, 41, 9, 3, 60, 8}, p1[] = {77, 12, 3};
    const int *prompts[] = {p0, p1};
    int lengths[] = {8, 3};
    GenerateOptions gen = {.row_samplers = greedy, .max_new_tokens = 6, .seed = 3};
    GeneratedRow rows_trained[2], rows_frozen[2];
    generate(trained, prompts, lengths, NULL, 2, &gen, rows_trained, NULL);
    generate(frozen, prompts, lengths, NULL, 2, &gen, rows_frozen, NULL);
    for (int b = 0; b < 2; b++) {
        bool same = rows_trained[b].length == rows_frozen[b].length;
        for (int j = 0; same && j < rows_trained[b].length; j++)
            same = rows_trained[b].tokens[j] == rows_frozen[b].tokens[j] &&
                   fabsf(rows_trained[b].logprobs[j] - rows_frozen[b].logprobs[j]) <= 1e-6f;
        EXPECT(same, "%s row %d: the trained model's generation differs from the same weights' without gradients",
               name, b);
        generated_row_free(&rows_trained[b]), generated_row_free(&rows_frozen[b]);
    }

    ModelRun again = run_model(trained, &batch, targets);
    const long trainable = model_trainable_floats(trained);
    double diff = 0, norm = 0;
    for (long i = 0; i < trainable; i++) {
        const double d = (double)again.grads[i] - first.grads[i];
        diff += d * d, norm += (double)first.grads[i] * first.grads[i];
    }
    printf("# stored-only buffers (%s): gradients after generation vs before: %.3e relative\n", name,
           sqrt(diff / norm));
    EXPECT(norm > 0 && sqrt(diff / norm) <= 1e-6 && fabs(again.loss - first.loss) <= 1e-6 * fabs(first.loss),
           "%s: the step after generation: loss %.9g vs %.9g, gradients %.3e relative apart", name, again.loss,
           first.loss, sqrt(diff / norm));
    model_run_free(&first), model_run_free(&again);
    free(tokens), free(targets);
}

// Buffers sized for their stored values (model_reserve, ops.h's stored_buffer_floats): a
// trained Llama's layers after the first keep their norms' outputs, gate, up and act, and
// the model the activation's gradients, as bf16 only, so reserving takes exactly that much
// less device memory than with stores off (not where the CPU stands in: it keeps floats).
// A training step, then generation with a KV cache (every layer's cache forward in set 0,
// whose buffers stay floats), then the same step again: the same gradients; and the
// generated tokens and log-probs are those of the same weights without gradients; for that
// Llama and for Gemma 2 with a sliding window (tests/fixtures/models/gemma2_window).
static void test_stored_only_buffers(void) {
    ModelConfig cfg = {0};
    cfg.family = FAMILY_LLAMA;
    cfg.vocab_size = 300, cfg.hidden_size = 256, cfg.num_layers = 3, cfg.num_heads = 4, cfg.num_kv_heads = 2;
    cfg.intermediate_size = 512, cfg.max_position_embeddings = 1024, cfg.norm_eps = 1e-5f, cfg.rope_theta = 10000.0f;
    CHECK(config_finish(&cfg, "stored-only") == 0, "%s", err_msg());
    const int B = 2, T = 40, L = cfg.num_layers;
    const long N = (long)B * T, C = cfg.hidden_size, I = cfg.intermediate_size;
    Model probe;
    model_init(&probe, &cfg, gpu, true, true);
    const long total = probe.table.total;
    model_free(&probe);
    float *w = random_host(total, 0.08f);

    if (!standing_in) {
        size_t reserved[2] = {0, 0};
        for (int stores = 0; stores < 2; stores++) {
            ops_cuda_enable_stored_inputs(stores);
            Model m;
            model_init(&m, &cfg, gpu, true, false);
            model_enable_grad(&m);
            const size_t before = ops_cuda_memory().in_use_bytes;
            model_reserve(&m, B, T);
            reserved[stores] = ops_cuda_memory().in_use_bytes - before;
            model_free(&m);
        }
        ops_cuda_enable_stored_inputs(true);
        // Per set after the first: two [N, C] and three [N, I] buffers; once: three [N, I].
        const long saved_floats = (L - 1) * (2 * (N * C - gpu->stored_buffer_floats(N * C)) +
                                             3 * (N * I - gpu->stored_buffer_floats(N * I))) +
                                  3 * (N * I - gpu->stored_buffer_floats(N * I));
        EXPECT(gpu->stored_buffer_floats(N * I) == N * I / 2, "stored_buffer_floats(%ld) = %ld, want %ld", N * I,
               gpu->stored_buffer_floats(N * I), N * I / 2);
        EXPECT(reserved[0] - reserved[1] == (size_t)saved_floats * sizeof(float),
               "model_reserve took %zu bytes with stores, %zu without: %zu less, want %ld", reserved[1], reserved[0],
               reserved[0] - reserved[1], saved_floats * (long)sizeof(float));
        printf("# stored-only buffers: model_reserve %zu bytes, %zu with stores off\n", reserved[1], reserved[0]);
    }

    Model trained, frozen;
    model_init(&trained, &cfg, gpu, true, true);
    model_init(&frozen, &cfg, gpu, true, true);
    gpu->copy_to_device(trained.params, w, (size_t)total * 4);
    gpu->copy_to_device(frozen.params, w, (size_t)total * 4);
    check_training_around_generation("llama", &trained, &frozen, B, T);
    model_free(&trained), model_free(&frozen);
    free(w);
    // Gemma 2 with a 5-key window on its first layer (the unfused kernels on a GPU, whose
    // saved state set 0 must be sized for), sandwich norms and soft caps.
    ModelLoadOptions options = {.with_lm_head = true, .with_value_head = true};
    CHECK(model_load(&trained, "tests/fixtures/models/gemma2_window", gpu, &options) == 0, "%s", err_msg());
    CHECK(model_load(&frozen, "tests/fixtures/models/gemma2_window", gpu, &options) == 0, "%s", err_msg());
    check_training_around_generation("gemma2_window", &trained, &frozen, B, T);
    model_free(&trained), model_free(&frozen);
}

static void test_generation_on_gpu(void) {
    const SamplerConfig greedy[4] = {{.temperature = 0.0f}, {.temperature = 0.0f}, {.temperature = 0.0f},
                                     {.temperature = 0.0f}};
    const SamplerConfig top_k[4] = {{.temperature = 0.8f, .top_k = 50},
                                    {.temperature = 0.0f},
                                    {.temperature = 1.2f, .top_k = 20, .top_p = 0.9f},
                                    {.temperature = 1.0f, .top_k = 5}};
    // Sampled over the whole vocabulary: on the GPU the draws are the device's (model_last_sampled).
    const SamplerConfig whole_rows[4] = {{.temperature = 1.0f}, {.temperature = 0.7f}, {.temperature = 1.3f, .top_p = 1.0f},
                                         {.temperature = 1.0f}};
    check_generation_on_gpu("greedy logprobs vs CPU forward", greedy);
    check_generation_on_gpu("top-k logprobs vs CPU forward", top_k);
    check_generation_on_gpu("whole-row sampled logprobs vs CPU forward", whole_rows);
    const SamplerConfig mixed[4] = {{.temperature = 0.0f}, {.temperature = 1.0f}, {.temperature = 0.0f},
                                    {.temperature = 0.9f}};
    check_generation_on_gpu("greedy and whole-row logprobs vs CPU forward", mixed);
    const SamplerConfig top_p[4] = {{.temperature = 0.8f, .top_p = 0.9f}, {.temperature = 0.0f},
                                    {.temperature = 1.0f, .top_p = 0.5f}, {.temperature = 1.5f, .top_p = 0.98f}};
    check_generation_on_gpu("top-p logprobs vs CPU forward", top_p);
}

// Top-p without top-k where the logits are (gen/sampler.h, sampler_candidates_hold_nucleus):
// the same tokens as the host's sampler on the same GPU logits (the run again with top log-
// probs, which copies every row), the log-probs to 1e-5; the flat row (temperature 1.5, top-p
// 0.98) outgrows the first 64 candidates, those steps copy the logits and later ones ask for
// more. Where the CPU stands in, every top-p token is the host's.
static void test_generation_on_gpu_top_p(void) {
    Model mc, mg;
    load_pair(&mc, &mg, "tests/fixtures/models/tiny_chat", false);
    const int B = 4, new_tokens = 16;
    const SamplerConfig samplers[4] = {{.temperature = 0.8f, .top_p = 0.9f}, {.temperature = 0.0f},
                                       {.temperature = 1.0f, .top_p = 0.5f}, {.temperature = 1.5f, .top_p = 0.98f}};
    int p0[] = {5, 17, 300, 41, 9}, p1[] = {77, 12}, p2[] = {1, 2, 3, 4, 5, 6, 7, 8};
    const int *prompts[] = {p0, p1, p2, p0};
    int lengths[] = {5, 2, 8, 5};
    GenerateOptions gen = {.row_samplers = samplers, .max_new_tokens = new_tokens, .seed = 11};
    GeneratedRow rows[4], host_rows[4];
    GenerateStats stats, host_stats;
    generate(&mg, prompts, lengths, NULL, B, &gen, rows, &stats);
    gen.top_logprobs = 1; // the host reads every row's logits: its sampler picks
    generate(&mg, prompts, lengths, NULL, B, &gen, host_rows, &host_stats);
    double worst = 0;
    for (int b = 0; b < B; b++) {
        bool same = rows[b].length == host_rows[b].length;
        for (int j = 0; same && j < rows[b].length; j++) {
            same = rows[b].tokens[j] == host_rows[b].tokens[j];
            worst = fmax(worst, fabs(rows[b].logprobs[j] - host_rows[b].logprobs[j]));
            worst = fmax(worst, fabs(rows[b].sampling_logprobs[j] - host_rows[b].sampling_logprobs[j]));
        }
        EXPECT(same, "row %d: other tokens than the host's sampler on the same logits", b);
        generated_row_free(&rows[b]), generated_row_free(&host_rows[b]);
    }
    printf("# top-p from candidates vs the host's sampler: log-probs %.3e apart; %ld of %ld tokens picked on the "
           "device, %d steps short of a nucleus\n",
           worst, stats.backend_picked_tokens, stats.generated_tokens, stats.nucleus_misses);
    EXPECT(worst <= 1e-5, "top-p log-probs %.3e from the host sampler's", worst);
    EXPECT(host_stats.backend_picked_tokens == 0, "%ld tokens picked on the device with top log-probs asked for",
           host_stats.backend_picked_tokens);
    if (mg.ops->samples_whole_rows)
        EXPECT(stats.backend_picked_tokens >= stats.generated_tokens - B - (long)B * stats.nucleus_misses &&
                   stats.backend_picked_tokens > 0 && stats.nucleus_misses >= 1,
               "%ld of %ld tokens picked on the device, %d steps short of a nucleus", stats.backend_picked_tokens,
               stats.generated_tokens, stats.nucleus_misses);
    else
        EXPECT(stats.backend_picked_tokens == 0 && stats.nucleus_misses == 0, "%ld top-p tokens picked on the CPU's backend",
               stats.backend_picked_tokens);

    // A nucleus too wide for any candidates (temperature 50: nearly uniform over the 1008
    // tokens; top-p 0.9999 leaves out less than one token's mass): 64, 256, then 1007
    // candidates fall short, and from the fourth step on the host samples the copied
    // logits. The same tokens as the host's sampler throughout.
    const SamplerConfig wide[2] = {{.temperature = 50.0f, .top_p = 0.9999f}, {.temperature = 0.0f}};
    GenerateOptions wide_gen = {.row_samplers = wide, .max_new_tokens = 8, .seed = 13};
    generate(&mg, prompts, lengths, NULL, 2, &wide_gen, rows, &stats);
    wide_gen.top_logprobs = 1;
    generate(&mg, prompts, lengths, NULL, 2, &wide_gen, host_rows, &host_stats);
    for (int b = 0; b < 2; b++) {
        EXPECT(rows[b].length == host_rows[b].length &&
                   !memcmp(rows[b].tokens, host_rows[b].tokens, rows[b].length * sizeof(int)),
               "wide nucleus row %d: other tokens than the host's sampler", b);
        generated_row_free(&rows[b]), generated_row_free(&host_rows[b]);
    }
    if (mg.ops->samples_whole_rows)
        EXPECT(stats.nucleus_misses == 3 && stats.backend_picked_tokens == 0,
               "a nucleus too wide for candidates: %d steps short, %ld tokens picked on the device (want 3, 0)",
               stats.nucleus_misses, stats.backend_picked_tokens);
    model_free(&mc);
    model_free(&mg);
}

// Continuous batching on the GPU (serve's path): sequences join a decoding batch at other
// steps, one with a prompt longer than the batch so far (the cached rows move on in GPU
// memory), rows leave from the middle (the rows after move up), and the run passes the
// cache's first 256 slots (the rows move back). Each sequence's greedy log-probs agree
// with a CPU forward over its prompt and tokens. Again with the KV cache in half floats and
// in Q8_0 blocks.
typedef struct {
    int prompt[24];
    int prompt_length;
    GeneratedRow result;
    bool finished;
} GpuSequence;

static void gpu_sequence_finished(void *context, void *owner, GeneratedRow *row) {
    GpuSequence *sequence = owner;
    sequence->result = *row;
    sequence->finished = true;
}

// `sampler` for the even sequences, `odd_sampler` for the odd ones.
static void run_continuous_batch_sampled_on_gpu(const char *kv_cache, int prefill_chunk, SamplerConfig sampler,
                                                SamplerConfig odd_sampler) {
    Model mc, mg;
    load_pair(&mc, &mg, "tests/fixtures/models/tiny_chat", false);
    CHECK(kv_cache_type_set(&mg, kv_cache, "--kv-cache") == 0, "%s", err_msg());
    enum { SEQUENCES = 24 };
    static GpuSequence sequences[SEQUENCES];
    SequenceOptions options[SEQUENCES];
    for (int i = 0; i < SEQUENCES; i++) {
        GpuSequence *sequence = &sequences[i];
        memset(sequence, 0, sizeof *sequence);
        sequence->prompt_length = i % 6 == 2 ? 24 : 1 + (i * 7) % 9;
        for (int t = 0; t < sequence->prompt_length; t++) sequence->prompt[t] = 3 + (i * 31 + t * 17) % 400;
        options[i] = (SequenceOptions){.sampler = i % 2 ? odd_sampler : sampler,
                                       .seed = 5,
                                       .row_id = (uint64_t)i,
                                       .max_new_tokens = 20 + (i * 13) % 60,
                                       .owner = sequence};
    }
    ContinuousOptions batch_options = {.on_finish = gpu_sequence_finished, .prefill_chunk = prefill_chunk};
    ContinuousBatch *batch = continuous_batch_new(&mg, 4, &batch_options);
    int next = 0;
    for (int step = 0; next < SEQUENCES || continuous_batch_rows(batch) > 0; step++) {
        // One sequence joins every third step while a row is free; the long prompts join
        // right after a short one started a batch.
        if (next < SEQUENCES && step % 3 == 0 && continuous_batch_rows(batch) < 4) {
            SequenceRequest request = {sequences[next].prompt, sequences[next].prompt_length, &options[next], 1, 0};
            continuous_batch_add(batch, &request, 1);
            next++;
        }
        continuous_batch_step(batch);
    }
    ContinuousStats stats;
    continuous_batch_stats(batch, &stats);
    continuous_batch_free(batch);
    double worst = 0;
    for (int i = 0; i < SEQUENCES; i++) {
        GpuSequence *sequence = &sequences[i];
        EXPECT(sequence->finished, "sequence %d never finished", i);
        if (!sequence->finished) continue;
        const GeneratedRow *row = &sequence->result;
        int T = sequence->prompt_length + row->length;
        int *tokens = xmalloc(T * 4), *targets = xmalloc(T * 4);
        memcpy(tokens, sequence->prompt, sequence->prompt_length * 4);
        memcpy(tokens + sequence->prompt_length, row->tokens, row->length * 4);
        for (int t = 0; t < T; t++) targets[t] = t + 1 < T ? tokens[t + 1] : -1;
        float *logp = xmalloc(T * 4);
        ModelBatch one = {.B = 1, .T = T, .tokens = tokens};
        model_forward(&mc, &one);
        model_logprobs(&mc, targets, logp, NULL, NULL);
        for (int j = 0; j < row->length; j++) {
            double d = fabs(logp[sequence->prompt_length - 1 + j] - row->logprobs[j]);
            if (d > worst) worst = d;
        }
        free(tokens), free(targets), free(logp);
        generated_row_free(&sequence->result);
    }
    printf("# continuous batch (%s cache, prefill chunk %d, temperature %g) vs CPU forward %.3e (tolerance 5e-2 abs; "
           "%ld steps, %ld chunks, moved on %ld, back %ld, %ld of %ld tokens picked on the device)\n",
           kv_cache, prefill_chunk, sampler.temperature, worst, stats.decode_steps, stats.prefill_chunks, stats.moves_on,
           stats.moves_back, stats.backend_picked_tokens, stats.generated_tokens);
    // Every token but each sequence's first (its prefill's logits) is picked where the logits
    // are: greedy on any backend, whole-row draws (beside greedy rows too) where the backend
    // makes them (not the CPU standing in for the GPU, MARLHF_GPU_TEST_DEVICE=cpu).
    const bool all_greedy = sampler.temperature <= 0.0f && odd_sampler.temperature <= 0.0f;
    // Top-p rows without top-k take candidates there too, but a step whose candidates fall
    // short of a row's nucleus copies the logits (its rows, at most 4, picked on the host).
    const bool nucleus = sampler_keeps_top_p(&sampler) || sampler_keeps_top_p(&odd_sampler);
    if (nucleus && mg.ops->samples_whole_rows)
        EXPECT(stats.backend_picked_tokens > 0 &&
                   stats.generated_tokens - SEQUENCES - stats.backend_picked_tokens <= 4 * stats.nucleus_misses,
               "%ld of %ld tokens picked on the device, %ld steps short of a nucleus", stats.backend_picked_tokens,
               stats.generated_tokens, stats.nucleus_misses);
    else if (all_greedy || mg.ops->samples_whole_rows)
        EXPECT(stats.backend_picked_tokens == stats.generated_tokens - SEQUENCES, "%ld of %ld tokens picked on the device",
               stats.backend_picked_tokens, stats.generated_tokens);
    else
        EXPECT(stats.backend_picked_tokens < stats.generated_tokens - SEQUENCES, "%ld of %ld tokens picked on the CPU",
               stats.backend_picked_tokens, stats.generated_tokens);
    EXPECT(worst <= 5e-2, "continuous-batch log-probs differ from the CPU forward by %.3e", worst);
    // A prompt prefilled in chunks joins a batch older by its chunks: it may not move on.
    EXPECT((stats.moves_on >= 1 || prefill_chunk > 0) && stats.moves_back >= 1,
           "the cache moved on %ld times, back %ld times", stats.moves_on, stats.moves_back);
    EXPECT((stats.prefill_chunks > 0) == (prefill_chunk > 0), "%ld chunk forwards", stats.prefill_chunks);
    model_free(&mc);
    model_free(&mg);
}

static void run_continuous_batch_on_gpu(const char *kv_cache, int prefill_chunk) {
    run_continuous_batch_sampled_on_gpu(kv_cache, prefill_chunk, (SamplerConfig){.temperature = 0.0f},
                                        (SamplerConfig){.temperature = 0.0f});
}

static void test_continuous_batch_on_gpu(void) { run_continuous_batch_on_gpu("f32", 0); }
// Sampled over the whole vocabulary (an OpenAI request's default: temperature 1, no top-k):
// the draws made on the device (model_last_sampled), their log-probs the model's; then every
// other sequence greedy (their tokens model_last_greedy's in the same steps).
static void test_continuous_batch_on_gpu_sampled(void) {
    const SamplerConfig whole_row = {.temperature = 1.0f, .top_p = 1.0f};
    run_continuous_batch_sampled_on_gpu("f32", 0, whole_row, whole_row);
    run_continuous_batch_sampled_on_gpu("f32", 0, whole_row, (SamplerConfig){.temperature = 0.0f});
    // Top-p without top-k (an OpenAI request's top_p): candidates, and greedy rows beside them.
    run_continuous_batch_sampled_on_gpu("f32", 0, (SamplerConfig){.temperature = 0.9f, .top_p = 0.9f},
                                        (SamplerConfig){.temperature = 0.0f});
}
static void test_continuous_batch_on_gpu_half_cache(void) { run_continuous_batch_on_gpu("f16", 0); }
// Chunked prefill on the GPU (--prefill-chunk through the same code: the staging cache and
// the extending forwards are device memory and attention_extend): the 24-token prompts in
// chunks of 5.
static void test_continuous_batch_on_gpu_chunked_prefill(void) { run_continuous_batch_on_gpu("f32", 5); }
static void test_continuous_batch_on_gpu_chunked_prefill_half_cache(void) { run_continuous_batch_on_gpu("f16", 5); }
static void test_continuous_batch_on_gpu_q8_cache(void) { run_continuous_batch_on_gpu("q8_0", 0); }
static void test_continuous_batch_on_gpu_chunked_prefill_q8_cache(void) { run_continuous_batch_on_gpu("q8_0", 5); }

// ---------------------------------------------------------------------------------------
// Quantized weights (ops/cuda/matmul_quantized.cu, dequantize.cuh)

// A random [rows, cols] weight quantized to `type` ("q8_0", "q4_0", "nf4": double-quantized
// scales, "nf4-single") in `ops`' memory by model/quantize.c; the same call on the other
// backend gives the same blocks.
// "q4_k", "q5_k" and "q6_k": the GGUF writer's super-blocks (ops/kquant.h), built on the host
// and moved as a Q4_K_M file's are. "q3_k" and "q2_k" (marlhf reads them but does not write
// them): the same random bytes for each call (`weights` unused) under d = dmin = 0.01.
static Q8Matrix quantized_on(const OpsBackend *ops, const char *type, const float *weights, int rows, int cols) {
    Q8Matrix m = {0};
    if (!strcmp(type, "q3_k") || !strcmp(type, "q2_k")) {
        const QuantType kind = !strcmp(type, "q3_k") ? QUANT_Q3_K : QUANT_Q2_K;
        const long bytes = (long)rows * kquant_row_bytes(kind, cols), block = kquant_block_bytes(kind);
        m = (Q8Matrix){.rows = rows, .cols = cols, .type = kind, .blocks = ops_cpu.alloc((size_t)bytes)};
        unsigned long long state = 0x9e3779b97f4a7c15ull;
        for (long i = 0; i < bytes; i++) {
            state = state * 6364136223846793005ull + 1442695040888963407ull;
            m.blocks[i] = (uint8_t)(state >> 56);
        }
        const uint16_t d = gguf_f32_to_f16(0.01f);
        for (long b = 0; b < bytes / block; b++) {
            uint8_t *at = m.blocks + b * block + (kind == QUANT_Q3_K ? 108 : 80);
            memcpy(at, &d, 2);
            if (kind == QUANT_Q2_K) memcpy(at + 2, &d, 2); // dmin
        }
        quantized_to_backend(ops, &m);
        return m;
    }
    if (!strcmp(type, "q4_k") || !strcmp(type, "q5_k") || !strcmp(type, "q6_k")) {
        const QuantType kind = !strcmp(type, "q4_k") ? QUANT_Q4_K : !strcmp(type, "q5_k") ? QUANT_Q5_K : QUANT_Q6_K;
        kquant_quantize_matrix(&m, kind, weights, rows, cols, ops_cpu.alloc);
        quantized_to_backend(ops, &m);
        return m;
    }
    const QuantType quant_type = !strncmp(type, "nf4", 3) ? QUANT_NF4
                                 : !strcmp(type, "q4_0")  ? QUANT_Q4_0
                                 : !strcmp(type, "q4_1")  ? QUANT_Q4_1
                                 : !strcmp(type, "q5_1")  ? QUANT_Q5_1
                                 : !strcmp(type, "bf16")  ? QUANT_BF16
                                                          : QUANT_Q8_0;
    quantize_matrix(ops, &m, quant_type, !strcmp(type, "nf4"), weights, rows, cols);
    return m;
}

static void free_quantized(const OpsBackend *ops, Q8Matrix *m) {
    ops->free(m->values), ops->free(m->scales), ops->free(m->scale_codes), ops->free(m->scale_absmax);
    ops->free(m->high_bits), ops->free(m->mins);
}

// A quantized product as the device computes it, on the CPU: the dequantized weights times
// the float inputs (what the GPU's decode kernels and tiles compute), or, where the CPU stands
// in for the GPU (MARLHF_GPU_TEST_DEVICE=cpu), the CPU's own matmul_forward_q8, whose decode
// kernels round the inputs to Q8_0 (1e-2 from the dequantized product on some inputs: a
// glu test failed so in `make test` on 2026-12-07).
static void quantized_reference(float *out, const float *x, const Q8Matrix *w, const float *bias, int N, int IC,
                                int OC) {
    if (standing_in) cpu->matmul_forward_q8(out, x, w, bias, N, IC, OC, N);
    else cpu->matmul_forward_dequantized(out, x, w, bias, N, IC, OC);
}

// Whether a quantized_on type is a K-quant (rows of whole super-blocks of 256).
static bool kquant_name(const char *type) { return type[0] == 'q' && type[2] == '_' && type[3] == 'k'; }

// The three quantized linear ops and the quantized token table, each type, against the CPU's
// ops on the same blocks: forward (matmul_forward_dequantized, and matmul_forward_q8, which on
// the GPU computes the same dequantized product at any kernel_rows) and the input gradient
// added onto nonzero values. The last shape's weight is larger than one tile (2,048 rows of
// 8,192: TILE_VALUES), so its product is two tiles.
// The K-quants take rows of whole super-blocks (256): their shapes' IC are 256, 512, 768, 8192.
// matmul_forward_glu_q8 (a gated MLP's two quantized matrices and its activation): act the
// bits of matmul_forward_q8 of each then glu_forward on the GPU, at 1, 5 and 8 rows (one
// launch that never writes gate and up) and 20 (those calls), SwiGLU and GeGLU, for Q8_0,
// Q4_0 and Q4_K weights; the CPU's products as the device computes them
// (quantized_reference) and its GLU within the bf16 tolerance; and a held act's copy read
// by the next product bit for bit.
static void test_matmul_glu_quantized(void) {
    static const char *types[] = {"q8_0", "q4_0", "q4_k"};
    enum { IC = 256, I = 40, C = 24 };
    const int rows[4] = {1, 5, 8, 20};
    char what[96];
    for (size_t k = 0; k < sizeof types / sizeof types[0]; k++) {
        float *gate_w = random_host((long)I * IC, 0.2f), *up_w = random_host((long)I * IC, 0.2f);
        float *down = random_host((long)C * I, 0.2f), *d_down = gpu_floats(down, (long)C * I);
        Q8Matrix gate_cpu = quantized_on(cpu, types[k], gate_w, I, IC), up_cpu = quantized_on(cpu, types[k], up_w, I, IC);
        Q8Matrix gate_gpu = quantized_on(gpu, types[k], gate_w, I, IC), up_gpu = quantized_on(gpu, types[k], up_w, I, IC);
        for (int r = 0; r < 4; r++)
            for (int gelu = 0; gelu < 2; gelu++) {
                const int N = rows[r];
                const long n = (long)N * I;
                float *x = random_host((long)N * IC, 1), *d_x = gpu_floats(x, (long)N * IC);
                float *cpu_act = xmalloc((size_t)n * 4), *cpu_gate = xmalloc((size_t)n * 4), *cpu_up = xmalloc((size_t)n * 4);
                float *d_act = gpu->alloc((size_t)n * 4), *d_act_calls = gpu->alloc((size_t)n * 4);
                float *d_gate = gpu->alloc((size_t)n * 4), *d_up = gpu->alloc((size_t)n * 4);
                float *d_out = gpu->alloc((size_t)N * C * 4), *d_out_calls = gpu->alloc((size_t)N * C * 4);
                snprintf(what, sizeof what, "%s glu product: %d rows, %s", types[k], N, gelu ? "GeGLU" : "SwiGLU");
                quantized_reference(cpu_gate, x, &gate_cpu, NULL, N, IC, I);
                quantized_reference(cpu_up, x, &up_cpu, NULL, N, IC, I);
                cpu->glu_forward(cpu_act, cpu_gate, cpu_up, n, gelu);
                gpu->matmul_input_hold(d_act, n);
                gpu->matmul_forward_glu_q8(d_act, d_gate, d_up, d_x, &gate_gpu, &up_gpu, N, IC, I, gelu, N, NULL);
                gpu->matmul_forward(d_out, d_act, d_down, NULL, N, I, C);
                gpu->matmul_input_release();
                gpu->matmul_input_hold(d_act_calls, n);
                ops_matmul_forward_glu_q8_in_calls(gpu, d_act_calls, d_gate, d_up, d_x, &gate_gpu, &up_gpu, N, IC, I,
                                                   gelu, N, NULL);
                gpu->matmul_forward(d_out_calls, d_act_calls, d_down, NULL, N, I, C);
                gpu->matmul_input_release();
                expect_glu_outputs(what, d_act, d_act_calls, d_out, d_out_calls, cpu_act, n, (long)N * C);
                gpu->free(d_x), gpu->free(d_gate), gpu->free(d_up);
                free(x), free(cpu_act), free(cpu_gate), free(cpu_up);
            }
        free_quantized(cpu, &gate_cpu), free_quantized(cpu, &up_cpu);
        free_quantized(gpu, &gate_gpu), free_quantized(gpu, &up_gpu);
        gpu->free(d_down);
        free(gate_w), free(up_w), free(down);
    }
}

// GPU output `d_got` the bits of `d_want` (n floats each).
static void expect_same_bits(const char *what, const float *d_got, const float *d_want, long n) {
    float *got = xmalloc((size_t)n * 4), *want = xmalloc((size_t)n * 4);
    gpu->copy_to_host(got, d_got, (size_t)n * 4);
    gpu->copy_to_host(want, d_want, (size_t)n * 4);
    EXPECT(!memcmp(got, want, (size_t)n * 4), "%s: other bits than the reference on the GPU", what);
    free(got), free(want);
}

// matmul_forward_parts_q8 (a layer's quantized q, k and v over the same input): each part's
// output the bits of its own matmul_forward_q8 on the GPU -- at 1, 5 and 8 rows one launch
// for all the parts, at 20 a product per part -- with and without biases, 3 parts and 2,
// Q8_0 matrices and Q4_K_M's mix (Q4_K q and k, Q6_K v); the CPU's products as the device
// computes them (quantized_reference) within the bf16 tolerance. Verified to fail with parts 1 and 2 given each other's blocks.
static void test_matmul_parts_quantized(void) {
    static const char *mixes[2][3] = {{"q8_0", "q8_0", "q8_0"}, {"q4_k", "q4_k", "q6_k"}};
    enum { IC = 256 };
    const int widths[3] = {96, 32, 40}, rows[4] = {1, 5, 8, 20};
    char what[128];
    for (int mix = 0; mix < 2; mix++) {
        float *w[3], *bias[3], *d_bias[3];
        Q8Matrix on_cpu[3], on_gpu[3];
        const Q8Matrix *gpu_weights[3], *cpu_weights[3];
        for (int p = 0; p < 3; p++) {
            w[p] = random_host((long)widths[p] * IC, 0.2f), bias[p] = random_host(widths[p], 0.5f);
            d_bias[p] = gpu_floats(bias[p], widths[p]);
            on_cpu[p] = quantized_on(cpu, mixes[mix][p], w[p], widths[p], IC);
            on_gpu[p] = quantized_on(gpu, mixes[mix][p], w[p], widths[p], IC);
            gpu_weights[p] = &on_gpu[p], cpu_weights[p] = &on_cpu[p];
        }
        for (int r = 0; r < 4; r++)
            for (int parts = 2; parts <= 3; parts++)
                for (int with_bias = 0; with_bias < 2; with_bias++) {
                    const int N = rows[r];
                    float *x = random_host((long)N * IC, 1), *d_x = gpu_floats(x, (long)N * IC);
                    float *d_outs[3], *cpu_outs[3];
                    const float *biases[3], *d_biases[3];
                    for (int p = 0; p < parts; p++) {
                        d_outs[p] = gpu->alloc((size_t)N * widths[p] * 4);
                        cpu_outs[p] = xmalloc((size_t)N * widths[p] * 4);
                        biases[p] = with_bias ? bias[p] : NULL, d_biases[p] = with_bias ? d_bias[p] : NULL;
                    }
                    gpu->matmul_forward_parts_q8(d_outs, gpu_weights, d_biases, parts, d_x, N, IC, N, NULL);
                    for (int p = 0; p < parts; p++) {
                        const long n = (long)N * widths[p];
                        float *d_alone = gpu->alloc((size_t)n * 4);
                        gpu->matmul_forward_q8(d_alone, d_x, gpu_weights[p], d_biases[p], N, IC, widths[p], N);
                        quantized_reference(cpu_outs[p], x, cpu_weights[p], biases[p], N, IC, widths[p]);
                        snprintf(what, sizeof what, "%s parts: %d rows, part %d of %d%s", mixes[mix][p], N, p, parts,
                                 with_bias ? ", bias" : "");
                        expect_same_bits(what, d_outs[p], d_alone, n);
                        expect_match_keep(what, d_outs[p], cpu_outs[p], n, TOL_BF16);
                        gpu->free(d_alone), gpu->free(d_outs[p]), free(cpu_outs[p]);
                    }
                    gpu->free(d_x), free(x);
                }
        for (int p = 0; p < 3; p++) {
            free_quantized(cpu, &on_cpu[p]), free_quantized(gpu, &on_gpu[p]);
            gpu->free(d_bias[p]), free(w[p]), free(bias[p]);
        }
    }
}

// The products that take their input's RMSNorm (ops.h's InputRmsNorm): q/k/v as parts (with
// biases), gate and up with the activation, and the same over Q4_K matrices. On the GPU
// each the bits of the norm op then the product without the norm -- at 1, 5 and 8 rows one
// launch that normalises the rows as it reads them, at 40 the norm's kernel (whose output,
// the product's input, is then the norm op's) and the product -- for a norm weight w and
// Gemma's 1 + w, 16-byte aligned (the norm kernel's four-at-a-time order of squares) or not
// (one at a time); the CPU's within the bf16 tolerance. IC = 1280 passes every share of the
// norm kernel's sum at least once and some twice, in either order. Verified to fail with the
// inverse RMS rounded through bf16 and with the second half of the shares left out (the
// warps' sums added in reverse order went unnoticed: fp64 sums of these rows round to the
// same float either way).
static void test_matmul_input_norm(void) {
    enum { IC = 1280, I = 48, OC = 128 };
    const int widths[3] = {64, 32, 32}, rows[4] = {1, 5, 8, 40};
    const float eps = 1e-5f;
    float *w = random_host((long)OC * IC, 0.05f), *bias = random_host(OC, 0.5f);
    float *glu_w = random_host(2L * I * IC, 0.05f), *norm_w = random_host(IC + 4, 0.5f);
    float *d_w = gpu_floats(w, (long)OC * IC), *d_bias = gpu_floats(bias, OC), *d_glu_w = gpu_floats(glu_w, 2L * I * IC);
    float *d_norm_w = gpu_floats(norm_w, IC + 4);
    Q8Matrix gate_cpu = quantized_on(cpu, "q4_k", glu_w, I, IC), up_cpu = quantized_on(cpu, "q4_k", glu_w + (long)I * IC, I, IC);
    Q8Matrix gate_gpu = quantized_on(gpu, "q4_k", glu_w, I, IC), up_gpu = quantized_on(gpu, "q4_k", glu_w + (long)I * IC, I, IC);
    // q, k and v's three parts as Q4_K matrices of their own.
    Q8Matrix parts_cpu[3], parts_gpu[3];
    const Q8Matrix *cpu_parts[3], *gpu_parts[3];
    const float *part_bias[3], *d_part_bias[3];
    for (int p = 0, first = 0; p < 3; first += widths[p], p++) {
        parts_cpu[p] = quantized_on(cpu, "q4_k", w + (long)first * IC, widths[p], IC);
        parts_gpu[p] = quantized_on(gpu, "q4_k", w + (long)first * IC, widths[p], IC);
        cpu_parts[p] = &parts_cpu[p], gpu_parts[p] = &parts_gpu[p];
        part_bias[p] = bias + first, d_part_bias[p] = d_bias + first;
    }
    char what[128];
    for (int r = 0; r < 4; r++)
        for (int plus_one = 0; plus_one < 2; plus_one++)
            for (int aligned = 0; aligned < 2; aligned++) {
                const int N = rows[r];
                const long n = (long)N * IC, act_n = (long)N * I;
                // Scale 3: inverse RMS well away from 1, so that a scale left out shows.
                float *x = random_host(n, 3.0f), *d_x = gpu_floats(x, n);
                const float *nw = aligned ? norm_w : norm_w + 1, *d_nw = aligned ? d_norm_w : d_norm_w + 1;
                float *cpu_in = xmalloc((size_t)n * 4), *cpu_rstd = xmalloc((size_t)N * 4);
                float *d_in = gpu->alloc((size_t)n * 4), *d_normed = gpu->alloc((size_t)n * 4);
                float *d_rstd = gpu->alloc((size_t)N * 4), *d_rstd_ref = gpu->alloc((size_t)N * 4);
                const InputRmsNorm gpu_norm = {.x = d_x, .rstd = d_rstd, .weight = d_nw, .eps = eps, .weight_plus_one = plus_one};
                const InputRmsNorm cpu_norm = {.x = x, .rstd = cpu_rstd, .weight = nw, .eps = eps, .weight_plus_one = plus_one};
                // The reference: the norm op's output, held as the model holds it (the later
                // products read its floats, the same bits as its copy).
                gpu->matmul_input_hold(d_normed, n);
                gpu->rmsnorm_forward(d_normed, d_rstd_ref, d_x, d_nw, N, IC, eps, plus_one);
                const char *form = plus_one ? "1 + w" : "w";
                // q, k and v.
                float *d_outs[3], *d_ref[3], *cpu_outs[3];
                for (int p = 0; p < 3; p++) {
                    d_outs[p] = gpu->alloc((size_t)N * widths[p] * 4), d_ref[p] = gpu->alloc((size_t)N * widths[p] * 4);
                    cpu_outs[p] = xmalloc((size_t)N * widths[p] * 4);
                }
                gpu->matmul_forward_parts(d_ref, widths, 3, d_normed, d_w, d_bias, N, IC, NULL);
                gpu->matmul_input_release();
                gpu->matmul_input_hold(d_in, n);
                gpu->matmul_forward_parts(d_outs, widths, 3, d_in, d_w, d_bias, N, IC, &gpu_norm);
                gpu->matmul_input_release();
                cpu->matmul_forward_parts(cpu_outs, widths, 3, cpu_in, w, bias, N, IC, &cpu_norm);
                for (int p = 0; p < 3; p++) {
                    snprintf(what, sizeof what, "normed parts: %d rows, %s, %saligned, part %d", N, form,
                             aligned ? "" : "not ", p);
                    expect_same_bits(what, d_outs[p], d_ref[p], (long)N * widths[p]);
                    expect_match_keep(what, d_outs[p], cpu_outs[p], (long)N * widths[p], TOL_BF16);
                    gpu->free(d_outs[p]), gpu->free(d_ref[p]), free(cpu_outs[p]);
                }
                if (N > 8) {
                    snprintf(what, sizeof what, "normed parts: %d rows, the norm's output", N);
                    expect_same_bits(what, d_in, d_normed, n);
                    expect_same_bits(what, d_rstd, d_rstd_ref, N);
                }
                // The same parts as Q4_K matrices; the CPU's as the device computes them.
                for (int p = 0; p < 3; p++) {
                    d_outs[p] = gpu->alloc((size_t)N * widths[p] * 4), d_ref[p] = gpu->alloc((size_t)N * widths[p] * 4);
                    cpu_outs[p] = xmalloc((size_t)N * widths[p] * 4);
                }
                gpu->matmul_forward_parts_q8(d_ref, gpu_parts, d_part_bias, 3, d_normed, N, IC, N, NULL);
                gpu->matmul_input_hold(d_in, n);
                gpu->matmul_forward_parts_q8(d_outs, gpu_parts, d_part_bias, 3, d_in, N, IC, N, &gpu_norm);
                gpu->matmul_input_release();
                cpu->rmsnorm_forward(cpu_in, cpu_rstd, x, nw, N, IC, eps, plus_one);
                for (int p = 0; p < 3; p++) {
                    quantized_reference(cpu_outs[p], cpu_in, cpu_parts[p], part_bias[p], N, IC, widths[p]);
                    snprintf(what, sizeof what, "normed q4_k parts: %d rows, %s, %saligned, part %d", N, form,
                             aligned ? "" : "not ", p);
                    expect_same_bits(what, d_outs[p], d_ref[p], (long)N * widths[p]);
                    expect_match_keep(what, d_outs[p], cpu_outs[p], (long)N * widths[p], TOL_BF16);
                    gpu->free(d_outs[p]), gpu->free(d_ref[p]), free(cpu_outs[p]);
                }
                // Gate and up with SwiGLU, float and Q4_K.
                float *d_act = gpu->alloc((size_t)act_n * 4), *d_act_ref = gpu->alloc((size_t)act_n * 4);
                float *d_gate = gpu->alloc((size_t)act_n * 4), *d_up = gpu->alloc((size_t)act_n * 4);
                float *cpu_act = xmalloc((size_t)act_n * 4), *cpu_gate = xmalloc((size_t)act_n * 4);
                float *cpu_up = xmalloc((size_t)act_n * 4);
                gpu->matmul_forward_glu(d_act_ref, d_gate, d_up, d_normed, d_glu_w, N, IC, I, false, NULL);
                gpu->matmul_input_hold(d_in, n);
                gpu->matmul_forward_glu(d_act, d_gate, d_up, d_in, d_glu_w, N, IC, I, false, &gpu_norm);
                gpu->matmul_input_release();
                cpu->matmul_forward_glu(cpu_act, cpu_gate, cpu_up, cpu_in, glu_w, N, IC, I, false, &cpu_norm);
                snprintf(what, sizeof what, "normed glu: %d rows, %s, %saligned", N, form, aligned ? "" : "not ");
                expect_same_bits(what, d_act, d_act_ref, act_n);
                expect_match_keep(what, d_act, cpu_act, act_n, TOL_BF16);
                gpu->matmul_forward_glu_q8(d_act_ref, d_gate, d_up, d_normed, &gate_gpu, &up_gpu, N, IC, I, false, N,
                                           NULL);
                gpu->matmul_input_hold(d_in, n);
                gpu->matmul_forward_glu_q8(d_act, d_gate, d_up, d_in, &gate_gpu, &up_gpu, N, IC, I, false, N, &gpu_norm);
                gpu->matmul_input_release();
                // The CPU's products as the device computes them (quantized_reference).
                cpu->rmsnorm_forward(cpu_in, cpu_rstd, x, nw, N, IC, eps, plus_one);
                quantized_reference(cpu_gate, cpu_in, &gate_cpu, NULL, N, IC, I);
                quantized_reference(cpu_up, cpu_in, &up_cpu, NULL, N, IC, I);
                cpu->glu_forward(cpu_act, cpu_gate, cpu_up, act_n, false);
                snprintf(what, sizeof what, "normed q4_k glu: %d rows, %s, %saligned", N, form, aligned ? "" : "not ");
                expect_same_bits(what, d_act, d_act_ref, act_n);
                expect_match_keep(what, d_act, cpu_act, act_n, TOL_BF16);
                gpu->free(d_act), gpu->free(d_act_ref), gpu->free(d_gate), gpu->free(d_up);
                gpu->free(d_x), gpu->free(d_in), gpu->free(d_normed), gpu->free(d_rstd), gpu->free(d_rstd_ref);
                free(x), free(cpu_in), free(cpu_rstd), free(cpu_act), free(cpu_gate), free(cpu_up);
            }
    free_quantized(cpu, &gate_cpu), free_quantized(cpu, &up_cpu);
    free_quantized(gpu, &gate_gpu), free_quantized(gpu, &up_gpu);
    for (int p = 0; p < 3; p++) free_quantized(cpu, &parts_cpu[p]), free_quantized(gpu, &parts_gpu[p]);
    gpu->free(d_w), gpu->free(d_bias), gpu->free(d_glu_w), gpu->free(d_norm_w);
    free(w), free(bias), free(glu_w), free(norm_w);
}

static void test_quantized_ops(void) {
    static const char *types[] = {"q8_0", "q4_0", "nf4", "nf4-single", "q4_1", "q5_1",
                                  "q2_k", "q3_k", "q4_k", "q5_k", "q6_k", "bf16"};
    const int shapes[][3] = {{257, 192, 200}, {3, 64, 1000}, {1, 576, 49}, {5, 8192, 2100}};
    const int kquant_ic[] = {256, 512, 768, 8192};
    for (size_t k = 0; k < sizeof types / sizeof types[0]; k++)
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
            const bool kquant = kquant_name(types[k]);
            const int N = shapes[s][0], IC = kquant ? kquant_ic[s] : shapes[s][1], OC = shapes[s][2];
            float *w = random_host((long)OC * IC, 0.2f), *x = random_host((long)N * IC, 1), *bias = random_host(OC, 1);
            Q8Matrix on_cpu = quantized_on(cpu, types[k], w, OC, IC), on_gpu = quantized_on(gpu, types[k], w, OC, IC);
            float *d_x = gpu_floats(x, (long)N * IC), *d_bias = gpu_floats(bias, OC);
            float *out = xmalloc((size_t)N * OC * sizeof(float));
            cpu->matmul_forward_dequantized(out, x, &on_cpu, bias, N, IC, OC);
            char what[96];
            float *d_out = gpu->alloc((size_t)N * OC * sizeof(float));
            gpu->matmul_forward_dequantized(d_out, d_x, &on_gpu, d_bias, N, IC, OC);
            snprintf(what, sizeof what, "%s forward_dequantized %dx%dx%d", types[k], N, IC, OC);
            expect_match(what, d_out, out, (long)N * OC, TOL_BF16);
            d_out = gpu->alloc((size_t)N * OC * sizeof(float));
            gpu->matmul_forward_q8(d_out, d_x, &on_gpu, d_bias, N, IC, OC, N);
            snprintf(what, sizeof what, "%s forward_q8 %dx%dx%d", types[k], N, IC, OC);
            expect_match(what, d_out, out, (long)N * OC, TOL_BF16);

            float *dout = random_host((long)N * OC, 1), *dinp = random_host((long)N * IC, 1);
            float *d_dout = gpu_floats(dout, (long)N * OC), *d_dinp = gpu_floats(dinp, (long)N * IC);
            cpu->matmul_backward_input_q8(dinp, dout, &on_cpu, N, IC, OC);
            gpu->matmul_backward_input_q8(d_dinp, d_dout, &on_gpu, N, IC, OC);
            snprintf(what, sizeof what, "%s backward_input %dx%dx%d", types[k], N, IC, OC);
            expect_match(what, d_dinp, dinp, (long)N * IC, TOL_BF16);
            gpu->free(d_x), gpu->free(d_bias), gpu->free(d_dout);
            free_quantized(cpu, &on_cpu), free_quantized(gpu, &on_gpu);
            free(w), free(x), free(bias), free(out), free(dout), free(dinp);
        }
    // The token table: the GPU's floats are the CPU's, bit for bit (dequantize.cuh rounds each
    // product and sum as the CPU does).
    for (size_t k = 0; k < sizeof types / sizeof types[0]; k++) {
        const int V = 50, C = kquant_name(types[k]) ? 256 : 128, N = 77, P = 40;
        int tokens[77], positions[77];
        for (int i = 0; i < N; i++) tokens[i] = (i * 13) % V, positions[i] = i % P;
        float *table = random_host((long)V * C, 0.5f), *pos = random_host((long)P * C, 0.3f);
        Q8Matrix on_cpu = quantized_on(cpu, types[k], table, V, C), on_gpu = quantized_on(gpu, types[k], table, V, C);
        float *out = xmalloc((size_t)N * C * sizeof(float)), *d_out = gpu->alloc((size_t)N * C * sizeof(float));
        int *d_tokens = gpu_ints(tokens, N), *d_positions = gpu_ints(positions, N);
        float *d_pos = gpu_floats(pos, (long)P * C);
        cpu->embedding_forward_q8(out, tokens, positions, &on_cpu, pos, N, C, 1.5f);
        gpu->embedding_forward_q8(d_out, d_tokens, d_positions, &on_gpu, d_pos, N, C, 1.5f);
        char what[64];
        snprintf(what, sizeof what, "%s embedding_forward_q8", types[k]);
        expect_match(what, d_out, out, (long)N * C, 0.0);
        gpu->free(d_tokens), gpu->free(d_positions), gpu->free(d_pos);
        free_quantized(cpu, &on_cpu), free_quantized(gpu, &on_gpu);
        free(table), free(pos), free(out);
    }
}

// The relative error of mg's log-probs against mc's over B rows of T random tokens (inference:
// each model's forward stays for model_last_logits).
static double logprobs_error(Model *mc, Model *mg, int B, int T) {
    const long N = (long)B * T;
    int *tokens = xmalloc(N * sizeof(int)), *targets = xmalloc(N * sizeof(int));
    for (long i = 0; i < N; i++) tokens[i] = (int)(random_uniform(0, 1) * (mc->config.vocab_size - 1));
    for (long i = 0; i < N; i++) targets[i] = i % T + 1 < T ? tokens[i + 1] : -1;
    float *logp_c = xmalloc(N * sizeof(float)), *logp_g = xmalloc(N * sizeof(float));
    ModelBatch batch = {.B = B, .T = T, .tokens = tokens};
    model_forward(mc, &batch);
    model_logprobs(mc, targets, logp_c, NULL, NULL);
    model_forward(mg, &batch);
    model_logprobs(mg, targets, logp_g, NULL, NULL);
    const double error = relative_error(logp_g, logp_c, N);
    free(tokens), free(targets), free(logp_c), free(logp_g);
    return error;
}

// Random values for every LoRA B matrix (zero at initialisation, which would leave the
// adapters out of the forward), the same on both models.
static void randomize_lora_b(Model *mc, Model *mg) {
    for (int i = 0; i < mc->table.count; i++) {
        const ParamEntry *e = &mc->table.entries[i];
        if (!strstr(e->name, ".lora_B.")) continue;
        float *b = random_host(e->numel, 0.05f);
        memcpy(mc->params + e->offset, b, (size_t)e->numel * sizeof(float));
        gpu->copy_to_device(mg->params + mg->table.entries[i].stored, b, (size_t)e->numel * sizeof(float));
        free(b);
    }
}

// A quantized tiny model, each type: inference log-probs on the GPU against the CPU's
// dequantized products (Model.dequantized_matmuls: the CPU's integer decode kernel is
// another arithmetic); the GPU model quantized after loading (model_quantize) and the CPU's
// while loading give the same blocks (the LoRA base fingerprints, which hash the
// dequantized base, agree); then QLoRA: adapters on both, a forward and every trainable
// gradient (adapters, value head) compared, one AdamW step on each, and the forward again.
static void test_quantized_models(void) {
    static const char *types[] = {"q8_0", "q4_0", "nf4", "nf4-single", "q4_1", "q5_1", "q5_k_m", "bf16"};
    const char *dir = "tests/fixtures/models/tiny_chat";
    for (size_t k = 0; k < sizeof types / sizeof types[0]; k++) {
        Model mc, mg, mr; // mr: on bf16_rounding, quantized as the GPU's
        ModelLoadOptions quantized = {.with_lm_head = true, .with_value_head = true, .quantize = types[k]};
        ModelLoadOptions plain = {.with_lm_head = true, .with_value_head = true};
        CHECK(model_load(&mc, dir, cpu, &quantized) == 0, "%s", err_msg());
        CHECK(model_load(&mg, dir, gpu, &plain) == 0, "%s", err_msg());
        CHECK(model_load(&mr, dir, &bf16_rounding, &plain) == 0, "%s", err_msg());
        EXPECT(model_quantize(&mg, types[k]) == 0, "%s on the GPU: %s", types[k], err_msg());
        EXPECT(!strcmp(model_quantize_name(&mg), types[k]), "the GPU model is %s", model_quantize_name(&mg));
        CHECK(model_quantize(&mr, types[k]) == 0, "%s", err_msg());
        mc.dequantized_matmuls = mr.dequantized_matmuls = true;

        const double error = logprobs_error(&mc, &mg, 2, 40);
        printf("# %-10s quantized inference logp %.3e (tolerance %.0e)\n", types[k], error, TOL_MODEL);
        EXPECT(error <= TOL_MODEL, "%s quantized inference log-probs: %.3e", types[k], error);

        LoraConfig lora = {.rank = 4, .alpha = 8.0f, .targets = (1u << LORA_TARGETS) - 1};
        CHECK(model_add_lora(&mc, &lora, true, 3) == 0 && model_add_lora(&mg, &lora, true, 3) == 0 &&
                  model_add_lora(&mr, &lora, true, 3) == 0,
              "%s", err_msg());
        EXPECT(mc.lora_base_fingerprint == mg.lora_base_fingerprint,
               "%s: base fingerprints differ (CPU %016llx, GPU %016llx)", types[k],
               (unsigned long long)mc.lora_base_fingerprint, (unsigned long long)mg.lora_base_fingerprint);
        randomize_lora_b(&mc, &mg);
        copy_entries(&mr, &mc, ".lora_A.");
        copy_entries(&mr, &mc, ".lora_B.");
        char label[64];
        snprintf(label, sizeof label, "qlora %s", types[k]);
        compare_pair_rounded(label, &mc, &mg, &mr); // forward, loss and every trainable gradient
        // One AdamW step, then the forward and backward again: the step's kernel, and the bf16
        // copies of the adapters made again after it (matmul.cu's weight cache). Every model
        // steps with the CPU's gradients: AdamW's first step is about lr sign(g), so each
        // side's own rounding noise on gradient entries near zero would otherwise give the
        // models adapters 2 lr apart there, and the comparison would measure that.
        const long n = model_trainable_floats(&mc), first = mc.trainable_offset;
        float *m = xcalloc((size_t)n, sizeof(float)), *v = xcalloc((size_t)n, sizeof(float));
        float *m_rounded = xcalloc((size_t)n, sizeof(float)), *v_rounded = xcalloc((size_t)n, sizeof(float));
        float *d_m = gpu_floats(m, n), *d_v = gpu_floats(v, n);
        gpu->copy_to_device(mg.grads, mc.grads, (size_t)n * sizeof(float));
        memcpy(mr.grads, mc.grads, (size_t)n * sizeof(float));
        cpu->adamw_update(mc.params + first, mc.grads, m, v, n, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.0f, 0.1f, 0.05f, 1.0f);
        gpu->adamw_update(model_trainable_params(&mg), mg.grads, d_m, d_v, n, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.0f, 0.1f, 0.05f, 1.0f);
        bf16_rounding.adamw_update(model_trainable_params(&mr), mr.grads, m_rounded, v_rounded, n, 1e-2f, 0.9f, 0.95f,
                                   1e-8f, 0.0f, 0.1f, 0.05f, 1.0f);
        float *stepped = xmalloc((size_t)n * sizeof(float));
        gpu->copy_to_host(stepped, model_trainable_params(&mg), (size_t)n * sizeof(float));
        const double step_error = relative_error(stepped, mc.params + first, n);
        printf("# %-10s adapters after the step %.3e (tolerance %.0e)\n", types[k], step_error, TOL_FP32);
        EXPECT(step_error <= TOL_FP32, "%s adapters after an AdamW step: %.3e", types[k], step_error);
        snprintf(label, sizeof label, "qlora %s step", types[k]);
        compare_pair_rounded(label, &mc, &mg, &mr);
        gpu->free(d_m), gpu->free(d_v);
        free(m), free(v), free(m_rounded), free(v_rounded), free(stepped);
        model_free(&mc);
        model_free(&mg);
        model_free(&mr);
    }
}

// --quantize bf16 on the GPU against the float model holding the same bf16 values (a bf16
// checkpoint read as floats): the float model's products already multiply bf16 copies of its
// weights (matmul.cu), so the two compute the same products -- log-probs of a training-sized
// forward (cuBLASLt) within float rounding; decode-sized ones within the bf16 rounding of the
// float model's decode inputs -- while
// the bf16 model holds 2 bytes a weight where the float one holds 4, and 2 more for the copies
// once it has multiplied. Measured on the device's own count (ops_device_memory).
static void test_bf16_model_on_gpu(void) {
    const char *dir = "tests/fixtures/models/tiny_chat";
    ModelLoadOptions plain = {.with_lm_head = true}, bf16 = {.with_lm_head = true, .quantize = "bf16"};
    Model mc; // the bf16 values, as floats, on the host
    CHECK(model_load(&mc, dir, cpu, &bf16) == 0, "%s", err_msg());
    float *values = xmalloc((size_t)mc.table.total * sizeof(float));
    memcpy(values, mc.params, (size_t)mc.table.total * sizeof(float));
    model_dequantize_into(&mc, values);
    long linear = 0; // the weights held as bf16
    for (int i = 0; i < model_base_entries(&mc); i++) {
        const Q8Matrix *q = quantized_matrix(&mc, &mc.table.entries[i]);
        if (q && q != &mc.quantized->lm_head) linear += (long)q->rows * q->cols; // a tied head is the table
    }
    size_t before = 0, peak, float_loaded = 0, bf16_loaded = 0;
    Model mg, mb;
    const bool counted = ops_device_memory(gpu, &before, &peak); // not by a CPU standing in
    CHECK(model_load(&mg, dir, gpu, &plain) == 0, "%s", err_msg());
    model_params_to_device(&mg, values, mg.table.total);
    ops_device_memory(gpu, &float_loaded, &peak);
    CHECK(model_load(&mb, dir, gpu, &bf16) == 0, "%s", err_msg());
    EXPECT(!strcmp(model_quantize_name(&mb), "bf16"), "the GPU model is %s", model_quantize_name(&mb));
    ops_device_memory(gpu, &bf16_loaded, &peak);
    bf16_loaded -= float_loaded, float_loaded -= before;
    const double train_error = logprobs_error(&mg, &mb, 2, 40), decode_error = logprobs_error(&mg, &mb, 1, 6);
    printf("# bf16 on %s: log-probs %.3e (B 2 x T 40) and %.3e (B 1 x T 6) from the float model of the same values; "
           "weights %zu bytes against %zu (%ld held as bf16)\n", gpu->name, train_error, decode_error, bf16_loaded,
           float_loaded, linear);
    // The training-sized products are the same cuBLASLt calls on the same bf16 operands (0 apart
    // on the emulated device); a decode step's differ: the float model's matvec rounds its
    // inputs to bf16 (matvec_bf16.cuh), the bf16 model's keeps them float (matvec_quantized.cuh).
    // (A CPU standing in rounds only its float products' inputs: bf16_rounding.)
    EXPECT(train_error <= (standing_in ? 1e-3 : TOL_FP32), "bf16 log-probs %.3e from the float model's (B 2 x T 40)",
           train_error);
    EXPECT(decode_error <= 1e-3, "bf16 log-probs %.3e from the float model's (B 1 x T 6)", decode_error);
    // What the load holds: 4 bytes a float, 2 a bf16 weight (allocations rounded up a little).
    EXPECT(!counted || (float_loaded >= (size_t)mc.table.total * 4 && bf16_loaded >= (size_t)linear * 2 &&
                        bf16_loaded <= (size_t)(mc.table.total - linear) * 4 + (size_t)linear * 2 + 64 * 1024),
           "loaded: float model %zu bytes, bf16 model %zu (%ld floats, %ld bf16 weights)", float_loaded, bf16_loaded,
           mc.table.total, linear);
    model_free(&mb);
    model_free(&mg);
    model_free(&mc);
    free(values);
}

// A GGUF model with its own bits on the GPU (`quantize`: the --quantize name that keeps the
// file's blocks): log-probs and the last position's logits against the CPU's dequantized
// products, and the same blocks on both (the LoRA base fingerprint hashes the dequantized base).
// Each type in `wanted` (a list ending in -1) must be among the GPU model's matrices.
static void check_gguf_model(const char *path, const char *quantize, const int *wanted) {
    const char *name = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
    Model mc, mg;
    ModelLoadOptions options = {.with_lm_head = true, .quantize = quantize};
    CHECK(model_load(&mc, path, cpu, &options) == 0, "%s", err_msg());
    if (model_load(&mg, path, gpu, &options) != 0) {
        EXPECT(0, "%s --quantize %s on the GPU: %s", name, quantize, err_msg());
        model_free(&mc);
        return;
    }
    int types[QUANT_IQ4_NL + 1] = {0};
    for (int i = 0; i < mg.table.count; i++) {
        const Q8Matrix *m = quantized_matrix(&mg, &mg.table.entries[i]);
        if (m) types[m->type]++;
    }
    // ops/ops.h QuantType order
    static const char *const type_names[] = {"Q8_0", "Q4_0", "NF4", "Q4_K", "Q6_K", "Q5_0",
                                             "Q5_K", "Q4_1", "Q5_1", "Q3_K", "Q2_K", "BF16", "IQ4_NL"};
    printf("# %s --quantize %s on %s:", name, quantize, gpu->name);
    for (int t = 0; t <= QUANT_IQ4_NL; t++)
        if (types[t]) printf(" %d %s", types[t], type_names[t]);
    printf("; %ld of %ld floats stored\n", mg.table.stored_total, mg.table.total);
    for (const int *t = wanted; *t >= 0; t++) EXPECT(types[*t] > 0, "%s: no matrix of type %d on the GPU", name, *t);
    // The CPU's dequantized products: the GPU's forward_q8 is that product at any row count
    // (so is a CPU standing in, asked to be).
    mc.dequantized_matmuls = mg.dequantized_matmuls = true;
    const int B = 2;
    double error = logprobs_error(&mc, &mg, B, 33); // the forward that model_last_logits reads
    printf("# %s logp %.3e (tolerance %.0e)\n", name, error, TOL_MODEL);
    EXPECT(error <= TOL_MODEL, "%s --quantize %s log-probs: %.3e", name, quantize, error);
    const long V = mc.config.vocab_size;
    float *logits_c = xmalloc((size_t)(B * V) * sizeof(float)), *logits_g = xmalloc((size_t)(B * V) * sizeof(float));
    model_last_logits(&mc, logits_c);
    model_last_logits(&mg, logits_g);
    error = relative_error(logits_g, logits_c, B * V);
    printf("# %s last logits %.3e (tolerance %.0e)\n", name, error, TOL_MODEL);
    EXPECT(error <= TOL_MODEL, "%s --quantize %s last logits: %.3e", name, quantize, error);
    free(logits_c), free(logits_g);
    LoraConfig lora = {.rank = 4, .alpha = 8.0f, .targets = (1u << LORA_TARGETS) - 1};
    CHECK(model_add_lora(&mc, &lora, false, 3) == 0 && model_add_lora(&mg, &lora, false, 3) == 0, "%s", err_msg());
    EXPECT(mc.lora_base_fingerprint == mg.lora_base_fingerprint, "%s --quantize %s: base fingerprints differ", name,
           quantize);
    model_free(&mc);
    model_free(&mg);
}

// A Q4_K_M model written by marlhf's converter (--quantize q4_k_m: Q4_K, Q6_K and Q5_0 matrices).
static void test_q4_k_m_model(void) {
    char path[512];
    const char *tmp = getenv("MARLHF_TEST_TMP") ? getenv("MARLHF_TEST_TMP") : "/tmp";
    snprintf(path, sizeof path, "%s/test_cuda_q4_k_m_%d.gguf", tmp, (int)getpid());
    write_q4_k_m_llama(path, 0x51ab);
    const int wanted[] = {QUANT_Q4_K, QUANT_Q6_K, QUANT_Q5_0, -1};
    check_gguf_model(path, "q4_k_m", wanted);
    remove(path);
}

// The same Llama as an IQ4_NL file (`convert --outtype iq4_nl`: every matrix but the head, which
// is Q6_K), under the inference commands' default (quantize_default: iq4_nl, the blocks held).
static void test_iq4_nl_model(void) {
    char path[512];
    const char *tmp = getenv("MARLHF_TEST_TMP") ? getenv("MARLHF_TEST_TMP") : "/tmp";
    snprintf(path, sizeof path, "%s/test_cuda_iq4_nl_%d.gguf", tmp, (int)getpid());
    write_random_llama(path, 0x51ac, GGUF_OUT_IQ4_NL);
    const int wanted[] = {QUANT_IQ4_NL, QUANT_Q6_K, -1};
    check_gguf_model(path, quantize_default(NULL, path), wanted);
    remove(path);
}

// llama.cpp's own files (tests/fixtures/gguf), their blocks as they are: Q5_K_M (Q5_K, Q6_K;
// under q5_k_m and under q4_k_m), Q3_K_M (Q3_K, Q4_K, Q5_K, Q6_K), Q2_K (Q2_K, Q3_K, Q6_K), Q4_1
// and Q5_1. The Q3_K_M and Q2_K files under the inference commands' default (quantize_default,
// their own mixes q3_k_m and q2_k on either device).
static void test_llama_cpp_models(void) {
    const int q5_k_m[] = {QUANT_Q5_K, QUANT_Q6_K, -1}, q3_k_m[] = {QUANT_Q3_K, QUANT_Q5_K, -1};
    const int q2_k[] = {QUANT_Q2_K, QUANT_Q3_K, -1}, q4_1[] = {QUANT_Q4_1, -1}, q5_1[] = {QUANT_Q5_1, -1};
    check_gguf_model("tests/fixtures/gguf/q5_k_m.gguf", "q5_k_m", q5_k_m);
    check_gguf_model("tests/fixtures/gguf/q5_k_m.gguf", "q4_k_m", q5_k_m);
    check_gguf_model("tests/fixtures/gguf/q3_k_m.gguf", quantize_default(NULL, "tests/fixtures/gguf/q3_k_m.gguf"), q3_k_m);
    check_gguf_model("tests/fixtures/gguf/q2_k.gguf", quantize_default(NULL, "tests/fixtures/gguf/q2_k.gguf"), q2_k);
    check_gguf_model("tests/fixtures/gguf/q4_1.gguf", "q4_1", q4_1);
    check_gguf_model("tests/fixtures/gguf/q5_1.gguf", "q5_1", q5_1);
}

// QDoRA on the GPU: DoRA adapters over a quantized base (the magnitudes and each forward's
// weight norms from the dequantize_rows op's floats, the CPU's bit for bit), forward, loss and
// every trainable gradient against the CPU's, over NF4 and Q8_0 bases.
static void test_qdora_on_gpu(void) {
    static const char *types[] = {"nf4", "q8_0"};
    for (size_t k = 0; k < sizeof types / sizeof types[0]; k++) {
        Model mc, mg;
        ModelLoadOptions options = {.with_lm_head = true, .with_value_head = true, .quantize = types[k]};
        CHECK(model_load(&mc, "tests/fixtures/models/tiny_chat", cpu, &options) == 0, "%s", err_msg());
        CHECK(model_load(&mg, "tests/fixtures/models/tiny_chat", gpu, &options) == 0, "%s", err_msg());
        LoraConfig dora = {.rank = 4, .alpha = 8.0f, .targets = (1u << LORA_TARGETS) - 1, .dora = true};
        EXPECT(model_add_lora(&mc, &dora, true, 3) == 0 && model_add_lora(&mg, &dora, true, 3) == 0,
               "DoRA over a quantized base: %s", err_msg());
        randomize_lora_b(&mc, &mg);
        char label[64];
        snprintf(label, sizeof label, "qdora %s", types[k]);
        compare_pair(label, &mc, &mg); // forward, loss and every trainable gradient (magnitudes too)
        model_free(&mc);
        model_free(&mg);
    }
}

// The fixture models again on the wmma attention kernels (MARLHF_CUDA_ATTENTION=wmma; mma
// is the default).
static void test_fixture_models_wmma_attention(void) {
    const char *previous = ops_cuda_attention_kernels();
    ops_cuda_select_attention("wmma");
    test_fixture_models();
    ops_cuda_select_attention(previous);
}

// What the GPU reports of the mma attention kernels (bench/ops_breakdown prints it): every
// kernel of each variant, no local memory (the build refuses spills; this is the device's
// word for it), at least one block an SM; a name that is not an mma variant refused.
static void test_attention_kernel_facts(void) {
    const char *variants[] = {"mma", "mma-plain", "mma-ds"};
    const int head_dims[] = {64, 128};
    for (int v = 0; v < 3; v++)
        for (int d = 0; d < 2; d++) {
            OpsAttentionKernelFacts facts[4];
            const int count = ops_cuda_attention_kernel_facts(variants[v], head_dims[d], facts, 4);
            EXPECT(count == 3, "%s head_dim %d: %d kernels, expected the forward, dK/dV and dQ", variants[v],
                   head_dims[d], count);
            for (int i = 0; i < count; i++)
                EXPECT(facts[i].registers > 0 && facts[i].local_bytes == 0 && facts[i].blocks_per_sm >= 1,
                       "%s head_dim %d %s: %d registers, %d bytes of local memory, %d blocks an SM", variants[v],
                       head_dims[d], facts[i].kernel, facts[i].registers, facts[i].local_bytes,
                       facts[i].blocks_per_sm);
            if (v == 2 && count == 3)
                EXPECT(!strcmp(facts[1].kernel, head_dims[d] <= 64 ? "dK/dV writing dS" : "dK/dV"),
                       "mma-ds head_dim %d runs %s", head_dims[d], facts[1].kernel);
        }
    OpsAttentionKernelFacts facts[4];
    EXPECT(ops_cuda_attention_kernel_facts("wmma", 64, facts, 4) == -1, "wmma has no mma kernel facts");
    EXPECT(ops_cuda_attention_kernel_facts("mma", 48, facts, 4) == -1, "head_dim 48 has no mma kernel");
}

// Fetches a probed launch's records (ops_cuda_attention_probe_end) and checks what holds of
// any: each block that ran its loop took `steps` steps (when steps > 0), ended after it
// started, waited no more cycles than it ran. Returns how many blocks recorded.
static long check_probe_records(const char *kernel, int expected_grid_x, int expected_grid_y,
                                const int *steps_of_block) {
    OpsAttentionProbeRecord *records;
    int grid_x, grid_y;
    const long count = ops_cuda_attention_probe_end(&records, &grid_x, &grid_y);
    EXPECT(count == (long)expected_grid_x * expected_grid_y * 4 && grid_x == expected_grid_x && grid_y == expected_grid_y,
           "%s probe: %ld records over a %d x %d grid, expected 4 a block of %d x %d", kernel, count, grid_x, grid_y,
           expected_grid_x, expected_grid_y);
    long recorded = 0;
    for (long i = 0; i < count; i++) {
        const OpsAttentionProbeRecord *r = &records[i];
        if (r->end_ns == 0) continue;
        recorded += i % 4 == 0;
        const long block = i / 4;
        EXPECT(r->end_ns >= r->start_ns && r->cycles > 0 && r->waiting_cycles >= 0 && r->waiting_cycles <= r->cycles,
               "%s probe, block %ld: %lld to %lld ns, %lld cycles, %lld waiting", kernel, block, r->start_ns, r->end_ns,
               r->cycles, r->waiting_cycles);
        EXPECT(!steps_of_block || r->steps == steps_of_block[block], "%s probe, block %ld: %d steps, expected %d",
               kernel, block, r->steps, steps_of_block ? steps_of_block[block] : 0);
    }
    free(records);
    return recorded;
}

// The mma kernels' case that the probe and overlap checks share: B 2, T 300, grouped heads
// 8/2, head_dim 64, the second row left-padded by 70; random q, k, v and dO on the GPU,
// room for the output and the saved state. mma is selected until mma_case_free.
typedef struct {
    int B, T, H, KV, D, row_start[2];
    long q_n, kv_n;
    const char *previous_kernels;
    float *d_q, *d_k, *d_v, *d_dout, *d_out, *d_saved;
    int *d_rs;
} MmaCase;

static MmaCase mma_case_new(void) {
    MmaCase c = {.B = 2, .T = 300, .H = 8, .KV = 2, .D = 64, .row_start = {0, 70}};
    c.previous_kernels = ops_cuda_attention_kernels();
    CHECK(ops_cuda_select_attention("mma"), "mma");
    c.q_n = (long)c.B * c.T * c.H * c.D, c.kv_n = (long)c.B * c.T * c.KV * c.D;
    float *q = random_host(c.q_n, 1), *k = random_host(c.kv_n, 1), *v = random_host(c.kv_n, 1);
    float *dout = random_host(c.q_n, 1);
    c.d_q = gpu_floats(q, c.q_n), c.d_k = gpu_floats(k, c.kv_n), c.d_v = gpu_floats(v, c.kv_n);
    c.d_dout = gpu_floats(dout, c.q_n);
    free(q), free(k), free(v), free(dout);
    c.d_rs = gpu_ints(c.row_start, c.B);
    c.d_out = gpu->alloc(c.q_n * 4);
    c.d_saved = gpu->alloc(gpu->attention_saved_size(c.B, c.T, c.H, c.KV, c.D, 0.0f, 0) * 4);
    return c;
}

static void mma_case_free(MmaCase *c) {
    gpu->free(c->d_q), gpu->free(c->d_k), gpu->free(c->d_v), gpu->free(c->d_dout), gpu->free(c->d_rs);
    gpu->free(c->d_out), gpu->free(c->d_saved);
    ops_cuda_select_attention(c->previous_kernels);
}

// The block probes (bench/ops_breakdown's "attention_probe" lines): a probed launch of each
// mma kernel computes what the unprobed one does, bit for bit, and records a step for each
// key tile a forward block walks (grouped heads, left padding, a partial last tile).
static void test_attention_probes(void) {
    MmaCase c = mma_case_new();
    const int B = c.B, T = c.T, H = c.H, KV = c.KV, D = c.D, *row_start = c.row_start;
    const long q_n = c.q_n, kv_n = c.kv_n;
    float *d_q = c.d_q, *d_k = c.d_k, *d_v = c.d_v, *d_dout = c.d_dout, *d_out = c.d_out, *d_saved = c.d_saved;
    int *d_rs = c.d_rs;
    float *d_grads[2][3];
    float *host[2][4];
    for (int run = 0; run < 2; run++) { // 0: plain launches; 1: each kernel probed
        d_grads[run][0] = gpu->alloc(q_n * 4), d_grads[run][1] = gpu->alloc(kv_n * 4), d_grads[run][2] = gpu->alloc(kv_n * 4);
        if (run == 1) CHECK(ops_cuda_attention_probe_begin("forward") == 0, "%s", err_msg());
        gpu->attention_forward(d_out, d_saved, d_q, d_k, d_v, d_rs, B, T, H, KV, D, 0.0f, 0);
        if (run == 1) {
            // The forward's grid: x the B*H heads, y its 128-row blocks from the last (forward_grid).
            const int blocks_y = (T + 127) / 128, grid_x = B * H;
            int *steps = xmalloc((size_t)grid_x * blocks_y * sizeof(int));
            for (int y = 0; y < blocks_y; y++)
                for (int x = 0; x < grid_x; x++) {
                    const int q0 = (blocks_y - 1 - y) * 128, q_last = (q0 + 128 < T ? q0 + 128 : T) - 1;
                    const int start = row_start[x / H];
                    steps[y * grid_x + x] = q_last >= start ? q_last / 64 - start / 64 + 1 : 0;
                }
            EXPECT(check_probe_records("forward", grid_x, blocks_y, steps) == (long)grid_x * blocks_y,
                   "a forward block without a record");
            free(steps);
        }
        host[run][0] = xmalloc(q_n * 4);
        gpu->copy_to_host(host[run][0], d_out, q_n * 4);
        for (int g = 0; g < 3; g++) host[run][1 + g] = xmalloc((g == 0 ? q_n : kv_n) * 4);
        // Run 0 one backward; run 1 one with the dK/dV kernel probed (dk, dv kept from it),
        // then one with the dQ kernel probed (dq kept from it).
        const char *backward_kernels[2] = {"dK/dV", "dQ"};
        for (int part = 0; part < (run == 1 ? 2 : 1); part++) {
            if (run == 1) CHECK(ops_cuda_attention_probe_begin(backward_kernels[part]) == 0, "%s", err_msg());
            gpu->attention_backward(d_grads[run][0], d_grads[run][1], d_grads[run][2], d_dout, d_out, d_saved, d_q, d_k,
                                    d_v, d_rs, B, T, H, KV, D, 0.0f, 0);
            if (run == 1) {
                const int grid_x = part == 0 ? B * KV : B * H, grid_y = (T + 63) / 64;
                EXPECT(check_probe_records(backward_kernels[part], grid_x, grid_y, NULL) > 0, "no %s block recorded",
                       backward_kernels[part]);
            }
            for (int g = 0; g < 3; g++)
                if (run == 0 || (part == 0) == (g != 0))
                    gpu->copy_to_host(host[run][1 + g], d_grads[run][g], (g == 0 ? q_n : kv_n) * 4);
        }
        for (int g = 0; g < 3; g++) gpu->free(d_grads[run][g]);
    }
    const char *names[4] = {"out", "dq", "dk", "dv"};
    for (int i = 0; i < 4; i++) {
        const long n = i <= 1 ? q_n : kv_n;
        EXPECT(memcmp(host[0][i], host[1][i], n * 4) == 0, "probed kernels changed %s", names[i]);
        free(host[0][i]), free(host[1][i]);
    }
    OpsAttentionProbeRecord *none;
    int grid_x, grid_y;
    EXPECT(ops_cuda_attention_probe_end(&none, &grid_x, &grid_y) == -1, "records from no probed launch");
    EXPECT(ops_cuda_attention_probe_begin("dS") == -1, "a probe of no kernel");
    mma_case_free(&c);
}

// The mma backward with its dQ kernel after dK/dV on the main stream
// (ops_cuda_attention_backward_overlap(false): what bench/ops_breakdown times against the
// default) gives the default's gradients, bit for bit: the two kernels write different
// gradients from the same inputs, so the order in which they run changes nothing.
static void test_attention_backward_overlap(void) {
    MmaCase c = mma_case_new();
    const int B = c.B, T = c.T, H = c.H, KV = c.KV, D = c.D;
    const long q_n = c.q_n, kv_n = c.kv_n;
    float *d_q = c.d_q, *d_k = c.d_k, *d_v = c.d_v, *d_dout = c.d_dout, *d_out = c.d_out, *d_saved = c.d_saved;
    int *d_rs = c.d_rs;
    gpu->attention_forward(d_out, d_saved, d_q, d_k, d_v, d_rs, B, T, H, KV, D, 0.0f, 0);
    const long sizes[3] = {q_n, kv_n, kv_n};
    float *grads[2][3];
    for (int run = 0; run < 2; run++) { // 0: the default (overlapped); 1: one stream
        float *d_grads[3];
        for (int g = 0; g < 3; g++) d_grads[g] = gpu->alloc(sizes[g] * 4);
        ops_cuda_attention_backward_overlap(run == 0);
        gpu->attention_backward(d_grads[0], d_grads[1], d_grads[2], d_dout, d_out, d_saved, d_q, d_k, d_v, d_rs, B, T,
                                H, KV, D, 0.0f, 0);
        ops_cuda_attention_backward_overlap(true);
        for (int g = 0; g < 3; g++) {
            grads[run][g] = xmalloc(sizes[g] * 4);
            gpu->copy_to_host(grads[run][g], d_grads[g], sizes[g] * 4);
            gpu->free(d_grads[g]);
        }
    }
    const char *names[3] = {"dq", "dk", "dv"};
    for (int g = 0; g < 3; g++) {
        EXPECT(memcmp(grads[0][g], grads[1][g], sizes[g] * 4) == 0, "%s differs with dQ after dK/dV on one stream",
               names[g]);
        free(grads[0][g]), free(grads[1][g]);
    }
    mma_case_free(&c);
}

// `test_cuda NAME...` runs only the named tests (all without names).
static char **selected_names;
static int selected_count;

static bool selected(const char *test) {
    for (int i = 0; i < selected_count; i++)
        if (!strcmp(selected_names[i], test)) return true;
    return selected_count == 0;
}

#define RUN_SELECTED(fn)               \
    do {                               \
        if (selected(#fn)) RUN(fn);    \
    } while (0)

static void run_quantized_weight_tests(void) {
    RUN_SELECTED(test_quantized_ops);
    RUN_SELECTED(test_quantized_models);
    RUN_SELECTED(test_bf16_model_on_gpu);
    RUN_SELECTED(test_q4_k_m_model);
    RUN_SELECTED(test_iq4_nl_model);
    RUN_SELECTED(test_llama_cpp_models);
    RUN_SELECTED(test_qdora_on_gpu);
}

int main(int argc, char **argv) {
    selected_names = argv + 1, selected_count = argc - 1;
    // MARLHF_GPU_TEST_DEVICE=cpu (`make test` on a machine without a GPU, and tests/gpu/run.sh's
    // check of itself): the CPU's table with the GPU's bf16 operands (bf16_rounding) stands in
    // for the GPU under another name, so the model code takes every path it takes for a GPU
    // (host copies, blocks moved, the float32 buffer without the quantized weights' slots),
    // every check below runs its host side (the buffers it allocates, copies, compares and
    // frees), and its comparisons see the errors of the GPU's rounding: on the same random
    // inputs the stand-in's matmul and attention errors are the H200's to four digits
    // (1.690e-3, 2.134e-3). What it is for is a harness that does not break, and tolerances
    // that hold, on the rare machine with a GPU: faults in five checks written after the
    // 2026-11-29 run (buffers used after expect_match freed them, a stale LoRA fixture) were
    // found this way on 2026-12-03, and the flat tolerance of LoRA adapter gradients that
    // failed on the H200 on 2026-12-04 fails here too. The attention kernel choices (wmma, mma)
    // are the GPU's own: the CPU runs its one path in their place, and the fixture models are
    // not run a second time for wmma.
    bf16_rounding_init();
    const char *device = getenv("MARLHF_GPU_TEST_DEVICE");
    static OpsBackend standing_in_table;
    if (device && !strcmp(device, "cpu")) {
        standing_in = true;
        standing_in_table = bf16_rounding;
        standing_in_table.name = "cpu-standing-in-for-cuda";
        gpu = &standing_in_table;
        printf("# device: none (MARLHF_GPU_TEST_DEVICE=cpu: the CPU's ops standing in)\n");
    } else {
        gpu = ops_backend_by_name("cuda");
        if (!gpu) {
            fprintf(stderr, "test_cuda: %s\n", err_msg());
            printf("FAIL cuda_device_available\n");
            return 1;
        }
        printf("# device: %s\n", ops_cuda_device_name());
        emulated = ops_cuda_is_emulated();
    }
    RUN_SELECTED(test_embedding);
    RUN_SELECTED(test_norms);
    RUN_SELECTED(test_matmul);
    RUN_SELECTED(test_matmul_held_input);
    RUN_SELECTED(test_held_activation_outputs);
    RUN_SELECTED(test_held_norm_and_attention_outputs);
    RUN_SELECTED(test_stored_inputs);
    RUN_SELECTED(test_rope);
    RUN_SELECTED(test_attention);
    RUN_SELECTED(test_attention_rotary);
    RUN_SELECTED(test_attention_decode_and_cache);
    RUN_SELECTED(test_attention_decode_f16);
    RUN_SELECTED(test_attention_decode_q8);
    RUN_SELECTED(test_rotate_and_cache_write);
    RUN_SELECTED(test_activations_and_elementwise);
    RUN_SELECTED(test_logprob_and_value_head);
    RUN_SELECTED(test_adamw);
    RUN_SELECTED(test_weight_copy_ranges);
    RUN_SELECTED(test_matmul_parts);
    RUN_SELECTED(test_matmul_glu);
    RUN_SELECTED(test_matmul_glu_quantized);
    RUN_SELECTED(test_matmul_parts_quantized);
    RUN_SELECTED(test_matmul_input_norm);
    RUN_SELECTED(test_dora_ops);
    RUN_SELECTED(test_fixture_models);
    RUN_SELECTED(test_packed_rows);
    if (!standing_in) RUN_SELECTED(test_fixture_models_wmma_attention);
    // Registers, local memory, occupancy and clocks are the GPU's to report: not the
    // emulated backend's (tests/cli/gpu_emulated.sh).
    if (!standing_in && !emulated) RUN_SELECTED(test_attention_kernel_facts);
    if (!standing_in && !emulated) RUN_SELECTED(test_attention_probes);
    if (emulated && selected("test_attention_kernel_facts"))
        printf("SKIP test_attention_kernel_facts (emulated: no registers to count)\n");
    if (emulated && selected("test_attention_probes")) printf("SKIP test_attention_probes (emulated: no clocks to probe with)\n");
    if (!standing_in) RUN_SELECTED(test_attention_backward_overlap);
    if (!standing_in) RUN_SELECTED(test_device_memory); // the CUDA backend's own count
    RUN_SELECTED(test_lora_models);
    RUN_SELECTED(test_generation_on_gpu);
    RUN_SELECTED(test_generation_on_gpu_top_p);
    RUN_SELECTED(test_stored_only_buffers);
    RUN_SELECTED(test_continuous_batch_on_gpu);
    RUN_SELECTED(test_continuous_batch_on_gpu_sampled);
    RUN_SELECTED(test_continuous_batch_on_gpu_half_cache);
    RUN_SELECTED(test_continuous_batch_on_gpu_chunked_prefill);
    RUN_SELECTED(test_continuous_batch_on_gpu_chunked_prefill_half_cache);
    RUN_SELECTED(test_continuous_batch_on_gpu_q8_cache);
    RUN_SELECTED(test_continuous_batch_on_gpu_chunked_prefill_q8_cache);
    run_quantized_weight_tests();
    printf("%d passed, %d failed\n", test_total_passed, test_total_failed);
    TEST_EXIT();
}
