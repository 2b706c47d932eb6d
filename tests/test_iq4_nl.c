// IQ4_NL and IQ4_XS weights held with their own bits (QUANT_IQ4_NL: ops/ops.h, ops/q4.c,
// ops/cpu/matmul_q8.c, model/quantize_q4_k_m.c) and written by the GGUF writer
// (io/gguf_quantize.c, `marlhf convert --outtype iq4_nl|iq4_xs`).
//
//  - The quantizer: on random blocks each one's squared error is at most that of the plain
//    scale (the extreme on level -127, the nearest level for each value), which it starts from;
//    a block of levels times a half-float scale that uses level -127 comes back as its own
//    bytes; a block of zeros is zeros. IQ4_XS's: a super-block of zeros is zeros; over
//    random super-blocks (sub-blocks of unlike sizes) its squared error at most 10% above
//    IQ4_NL's on the same values (its sub-block scales have 6 bits where IQ4_NL's d has a
//    half float's 11; measured 1.5% below it: each sub-block's three ls tried search more
//    scales) and below Q4_0's.
//  - The layout: IQ4_NL and IQ4_XS blocks of random bytes (any code, any 6-bit sub-block
//    scale, finite half-float d of either sign) held by quantized_hold_gguf_blocks dequantize
//    to what io/gguf_dequant.c reads from the same bytes, bit for bit; the token table lookup
//    gives those rows; quant_matrix_bytes counts 4-bit codes and a float per 32.
//  - The decode kernel (ops/cpu/matmul_q5.c): its portable loop against the exact sum it stands
//    for, and every vector path compiled in against the portable loop, bit for bit; the same
//    for Q4_0 weights, the kernel's other type of plain nibbles (an offset of 8, no levels).
//  - The product against a float reference: the decode kernel (N < 64) within the bound the
//    input's Q8_0 rounding allows (sum |w| * x_scale / 2 per output), the prefill path
//    (N >= 64) within 1e-5 of sum |w x|.
//  - A model written as an IQ4_NL GGUF (model_write_gguf, GGUF_OUT_IQ4_NL) and loaded with the
//    default --quantize (quantize_default: the file's own mix, iq4_nl): every matrix but the head
//    held as QUANT_IQ4_NL, dequantized the float load of the same file bit for bit, and its
//    logits near the float load's. The same for a random Llama whose rows are whole
//    super-blocks written as IQ4_XS (GGUF_OUT_IQ4_XS): its matrices of rows of 256 IQ4_XS,
//    the down projections' rows of 384 IQ4_NL (llama.cpp's fallback), the head Q6_K.
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/check.h"
#include "core/rng.h"
#include "io/gguf.h"
#include "io/gguf_dequant.h"
#include "io/gguf_quantize.h"
#include "io/gguf_write.h"
#include "model/quantize.h"
#include "model/weights_io.h"
#include "ops/cpu/matmul_q5.h"
#include "ops/cpu/ops_cpu.h"
#include "ops/q4.h"
#include "ops/q8.h"
#include "q4_k_m_model.h"
#include "test.h"

static float uniform(uint64_t seed, uint64_t i) { return 2.0f * rng_uniform(seed, 0, i) - 1.0f; }

// A finite half float of magnitude about 2^-10 .. 2^-6 for block b, negative for every third.
static uint16_t half_scale(long b) { return (uint16_t)(0x1400 + (b * 37) % 0x1000 + (b % 3 == 0 ? 0x8000 : 0)); }

// rows * cols values of `type` (IQ4_NL or IQ4_XS) as GGUF blocks of random bytes with finite d.
static uint8_t *random_blocks(GgmlType type, long rows, long cols, uint64_t seed) {
    const GgmlTypeInfo *info = gguf_type_info(type);
    const long blocks = rows * cols / info->block_size, block_bytes = info->type_size;
    uint8_t *bytes = xmalloc((size_t)(blocks * block_bytes));
    for (long b = 0; b < blocks; b++) {
        uint8_t *block = bytes + b * block_bytes;
        for (long j = 0; j < block_bytes; j++) block[j] = (uint8_t)(rng_uniform(seed, 1, (uint64_t)(b * 256 + j)) * 256);
        const uint16_t d = half_scale(b);
        memcpy(block, &d, 2);
    }
    return bytes;
}

static void free_held(Q8Matrix *m) { ops_cpu.free(m->nibbles), ops_cpu.free(m->scales); }

// The squared error of the plain choice: d = the extreme / -127 as a half float, each value
// the nearest level.
static double plain_error(const float *x) {
    float extreme = 0;
    for (int i = 0; i < 32; i++)
        if (fabsf(x[i]) > fabsf(extreme)) extreme = x[i];
    const float d = gguf_f16_to_f32(gguf_f32_to_f16(extreme / -127.0f));
    double error = 0;
    for (int i = 0; i < 32; i++) {
        double best = INFINITY;
        for (int k = 0; k < 16; k++) best = fmin(best, fabs((double)x[i] - (double)d * gguf_iq4_levels[k]));
        error += best * best;
    }
    return error;
}

static void test_quantizer(void) {
    enum { BLOCKS = 400 };
    float x[BLOCKS * 32], y[BLOCKS * 32];
    for (long i = 0; i < BLOCKS * 32; i++) x[i] = uniform(10, (uint64_t)i) * (1.0f + (float)(i / 32 % 7));
    for (int i = 0; i < 32; i++) x[i] = 0.0f; // block 0: zeros
    uint8_t *blocks = xmalloc(gguf_quantized_size(GGML_TYPE_IQ4_NL, BLOCKS * 32));
    gguf_quantize(GGML_TYPE_IQ4_NL, x, blocks, BLOCKS * 32);
    gguf_dequantize(GGML_TYPE_IQ4_NL, blocks, y, BLOCKS * 32);
    int worse = 0, better = 0;
    for (int b = 0; b < BLOCKS; b++) {
        double error = 0;
        for (int i = 0; i < 32; i++) error += ((double)x[b * 32 + i] - y[b * 32 + i]) * ((double)x[b * 32 + i] - y[b * 32 + i]);
        const double plain = plain_error(x + b * 32);
        worse += error > plain * (1 + 1e-12);
        better += error < plain * (1 - 1e-6);
    }
    for (int i = 0; i < 32; i++) EXPECT(y[i] == 0.0f, "a block of zeros gives %g at %d", y[i], i);
    printf("IQ4_NL quantizer: %d of %d blocks below the plain scale's error, %d above it\n", better, BLOCKS, worse);
    EXPECT(worse == 0 && better > BLOCKS / 4, "%d blocks worse than the plain scale, %d better", worse, better);

    // Levels times a half-float scale, level -127 among them: back as their own bytes.
    uint8_t *original = random_blocks(GGML_TYPE_IQ4_NL, 1, BLOCKS * 32, 11), *again = xmalloc(BLOCKS * 18);
    for (int b = 0; b < BLOCKS; b++) original[b * 18 + 2] &= 0xF0; // value 0's code: level -127
    gguf_dequantize(GGML_TYPE_IQ4_NL, original, y, BLOCKS * 32);
    gguf_quantize(GGML_TYPE_IQ4_NL, y, again, BLOCKS * 32);
    EXPECT(!memcmp(original, again, BLOCKS * 18), "quantizing a block's own values gives other bytes");
    free(blocks), free(original), free(again);
}

static void test_layout_and_lookup(void) {
    const GgmlType types[] = {GGML_TYPE_IQ4_NL, GGML_TYPE_IQ4_XS};
    enum { ROWS = 7, COLS = 512 };
    for (int t = 0; t < 2; t++) {
        uint8_t *bytes = random_blocks(types[t], ROWS, COLS, 20 + t);
        Q8Matrix m;
        quantized_hold_gguf_blocks(&ops_cpu, &m, types[t], bytes, ROWS, COLS);
        EXPECT(m.type == QUANT_IQ4_NL, "%s held as type %d", gguf_type_name(types[t]), (int)m.type);
        float *expected = xmalloc((size_t)ROWS * COLS * sizeof(float)), *got = xmalloc((size_t)ROWS * COLS * sizeof(float));
        gguf_dequantize(types[t], bytes, expected, ROWS * COLS);
        quant_dequantize_rows(&m, 0, ROWS, got);
        EXPECT(!memcmp(expected, got, (size_t)ROWS * COLS * sizeof(float)), "%s: dequantized rows differ from the file's",
               gguf_type_name(types[t]));
        EXPECT(quant_matrix_bytes(&m) == ROWS * COLS / 2 + ROWS * COLS / 32 * 4, "%ld bytes", quant_matrix_bytes(&m));
        const int tokens[3] = {4, 0, 6};
        float rows[3 * COLS];
        ops_cpu.embedding_forward_q8(rows, tokens, NULL, &m, NULL, 3, COLS, 1.0f);
        for (int i = 0; i < 3; i++)
            EXPECT(!memcmp(rows + i * COLS, expected + tokens[i] * COLS, COLS * sizeof(float)), "%s: row %d of the lookup",
                   gguf_type_name(types[t]), tokens[i]);
        free_held(&m), free(bytes), free(expected), free(got);
    }
}

// The value a nibble stands for: IQ4_NL's level, Q4_0's code less 8.
static int nibble_value(GgmlType type, int nibble) { return type == GGML_TYPE_IQ4_NL ? gguf_iq4_levels[nibble] : nibble - 8; }

// The decode kernel's paths (ops/cpu/matmul_q5.c) for IQ4_NL and Q4_0 weights: the portable
// loop equals the exact sum it stands for (each block's integer dot of the nibbles' values and
// the int8 inputs, times the two scales, in block order: within 1e-6 of the sum of |terms|),
// and each vector path compiled in gives its bits, for 1-8 weight rows from any first row and
// 1-4 input rows, rows of 1, 18 (SmolLM2) and 19 blocks (an odd last block for the AVX-512
// path's pairs).
static void row_dot_paths(GgmlType type) {
    const struct {
        const char *name;
        Q5RowsDot dot;
    } paths[] = {{"avx2", q5_rows_dot_avx2}, {"avx512", q5_rows_dot_avx512}};
    const int col_counts[] = {32, 576, 608};
    int compared = 0;
    for (size_t s = 0; s < sizeof col_counts / sizeof col_counts[0]; s++) {
        enum { ROWS = 11 };
        const int cols = col_counts[s], blocks = cols / 32;
        uint8_t *bytes = random_blocks(type, ROWS, cols, 40 + s + 10 * (type == GGML_TYPE_Q4_0));
        Q8Matrix m;
        quantized_hold_gguf_blocks(&ops_cpu, &m, type, bytes, ROWS, cols);
        EXPECT(m.type == (type == GGML_TYPE_Q4_0 ? QUANT_Q4_0 : QUANT_IQ4_NL), "%s held as type %d", gguf_type_name(type),
               (int)m.type);
        int8_t *values = xmalloc((size_t)Q5_INPUTS * cols);
        float *scales = xmalloc((size_t)Q5_INPUTS * blocks * sizeof(float)), row[608];
        int32_t *sums = xmalloc((size_t)Q5_INPUTS * blocks * sizeof(int32_t));
        Q5Input x[Q5_INPUTS];
        for (int i = 0; i < Q5_INPUTS; i++) {
            for (int c = 0; c < cols; c++) row[c] = 2.0f * uniform(50 + s, (uint64_t)(i * cols + c));
            q8_quantize_row(row, cols, values + (long)i * cols, scales + i * blocks);
            for (int b = 0; b < blocks; b++) {
                sums[i * blocks + b] = 0;
                for (int j = 0; j < 32; j++) sums[i * blocks + b] += values[(long)i * cols + b * 32 + j];
            }
            x[i] = (Q5Input){values + (long)i * cols, scales + i * blocks, sums + i * blocks, NULL};
        }
        for (int first = 0; first + 1 <= ROWS; first += 3)
            for (int count = 1; count <= Q5_ROWS && first + count <= ROWS; count += 3)
                for (int inputs = 1; inputs <= Q5_INPUTS; inputs++) {
                    float portable[Q5_INPUTS * Q5_ROWS], got[Q5_INPUTS * Q5_ROWS];
                    q5_rows_dot_portable(&m, first, count, x, inputs, portable, Q5_ROWS);
                    for (int i = 0; i < inputs; i++)
                        for (int k = 0; k < count; k++) {
                            const long r = first + k;
                            double exact = 0, magnitude = 0;
                            for (int b = 0; b < blocks; b++) {
                                long dot = 0;
                                for (int j = 0; j < 32; j++) {
                                    const uint8_t byte = m.nibbles[(r * blocks + b) * 16 + j % 16];
                                    dot += (long)nibble_value(type, j < 16 ? byte & 0x0F : byte >> 4) * x[i].values[b * 32 + j];
                                }
                                const double term = (double)dot * ((double)x[i].scales[b] * m.scales[r * blocks + b]);
                                exact += term, magnitude += fabs(term);
                            }
                            EXPECT(fabs(portable[i * Q5_ROWS + k] - exact) <= 1e-6 * magnitude + 1e-30,
                                   "%s portable, %d columns, row %ld, input %d: %.9g, exact %.9g", gguf_type_name(type), cols, r, i,
                                   portable[i * Q5_ROWS + k], exact);
                        }
                    for (size_t p = 0; p < sizeof paths / sizeof paths[0]; p++) {
                        if (!paths[p].dot) continue;
                        paths[p].dot(&m, first, count, x, inputs, got, Q5_ROWS);
                        for (int i = 0; i < inputs; i++)
                            EXPECT(!memcmp(got + i * Q5_ROWS, portable + i * Q5_ROWS, (size_t)count * sizeof(float)),
                                   "%s %s, %d columns, rows %d..%d, input %d: other bits than the portable loop",
                                   gguf_type_name(type), paths[p].name, cols, first, first + count, i);
                        compared++;
                    }
                }
        free_held(&m), free(bytes), free(values), free(scales), free(sums);
    }
    printf("%s decode kernel: %d vector-path calls held to the portable loop (avx2 %s, avx512 %s)\n",
           gguf_type_name(type), compared, q5_rows_dot_avx2 ? "built" : "not built", q5_rows_dot_avx512 ? "built" : "not built");
    EXPECT(compared > 0 || (!q5_rows_dot_avx2 && !q5_rows_dot_avx512), "no vector path compared");
}

static void test_row_dot_paths(void) {
    row_dot_paths(GGML_TYPE_IQ4_NL);
    row_dot_paths(GGML_TYPE_Q4_0);
}

static void test_matmul_against_floats(void) {
    enum { OC = 37, IC = 576 };
    const int Ns[] = {1, 3, 63, 64, 70};
    uint8_t *bytes = random_blocks(GGML_TYPE_IQ4_NL, OC, IC, 30);
    Q8Matrix m;
    quantized_hold_gguf_blocks(&ops_cpu, &m, GGML_TYPE_IQ4_NL, bytes, OC, IC);
    float *w = xmalloc((size_t)OC * IC * sizeof(float)), *bias = xmalloc(OC * sizeof(float));
    quant_dequantize_rows(&m, 0, OC, w);
    for (int o = 0; o < OC; o++) bias[o] = uniform(31, (uint64_t)o);
    for (size_t n = 0; n < sizeof Ns / sizeof Ns[0]; n++) {
        const int N = Ns[n];
        float *x = xmalloc((size_t)N * IC * sizeof(float)), *out = xmalloc((size_t)N * OC * sizeof(float));
        for (long i = 0; i < (long)N * IC; i++) x[i] = 3.0f * uniform(32 + n, (uint64_t)i);
        ops_cpu.matmul_forward_q8(out, x, &m, bias, N, IC, OC, N);
        for (int i = 0; i < N; i++) {
            float x_scales[IC / Q8_BLOCK];
            int8_t x_values[IC];
            q8_quantize_row(x + (long)i * IC, IC, x_values, x_scales);
            for (int o = 0; o < OC; o++) {
                double exact = bias[o], abs_w_scale = 0, magnitude = fabs(bias[o]);
                for (int k = 0; k < IC; k++) {
                    const double wk = w[(long)o * IC + k], xk = x[(long)i * IC + k];
                    exact += wk * xk;
                    abs_w_scale += fabs(wk) * x_scales[k / Q8_BLOCK];
                    magnitude += fabs(wk * xk);
                }
                // Below 64 rows the inputs are rounded to Q8_0 (at most half a step each).
                const double bound = N < Q8_SGEMM_MIN_ROWS ? 0.5 * abs_w_scale + 1e-5 * magnitude : 1e-5 * magnitude;
                EXPECT(fabs(out[(long)i * OC + o] - exact) <= bound, "N %d [%d, %d]: %.9g, float product %.9g (bound %.3g)",
                       N, i, o, out[(long)i * OC + o], exact, bound);
            }
        }
        free(x), free(out);
    }
    free_held(&m), free(bytes), free(w), free(bias);
}

// IQ4_XS against IQ4_NL and Q4_0 on the same values: SUPER random super-blocks whose 8
// sub-blocks have unlike magnitudes (1 to 8 times), the first all zeros.
static void test_iq4_xs_quantizer(void) {
    enum { SUPER = 100, N = SUPER * 256 };
    float *x = xmalloc(N * sizeof(float)), *y = xmalloc(N * sizeof(float));
    for (long i = 0; i < N; i++) x[i] = uniform(12, (uint64_t)i) * (1.0f + (float)(i / 32 % 8));
    for (int i = 0; i < 256; i++) x[i] = 0.0f;
    const GgmlType types[3] = {GGML_TYPE_IQ4_XS, GGML_TYPE_IQ4_NL, GGML_TYPE_Q4_0};
    double error[3];
    for (int t = 0; t < 3; t++) {
        uint8_t *blocks = xmalloc(gguf_quantized_size(types[t], N));
        gguf_quantize(types[t], x, blocks, N);
        gguf_dequantize(types[t], blocks, y, N);
        error[t] = 0;
        for (long i = 0; i < N; i++) error[t] += ((double)x[i] - y[i]) * ((double)x[i] - y[i]);
        if (t == 0) {
            EXPECT(gguf_quantized_size(types[t], N) == (size_t)SUPER * 136, "IQ4_XS: %zu bytes",
                   gguf_quantized_size(types[t], N));
            for (int i = 0; i < 256; i++) EXPECT(y[i] == 0.0f, "a super-block of zeros gives %g at %d", y[i], i);
        }
        free(blocks);
    }
    printf("squared error: IQ4_XS %.4g, IQ4_NL %.4g, Q4_0 %.4g\n", error[0], error[1], error[2]);
    EXPECT(error[0] <= 1.10 * error[1], "IQ4_XS's error %.4g against IQ4_NL's %.4g", error[0], error[1]);
    EXPECT(error[0] < error[2], "IQ4_XS's error %.4g against Q4_0's %.4g", error[0], error[2]);
    free(x), free(y);
}

// The file at `path` loaded with its default --quantize holds its `iq4_tensors` IQ4 matrices
// as QUANT_IQ4_NL, which dequantize to the float load of the same file bit for bit, and
// its logits are near the float load's.
static void expect_held_like_float_load(const char *path, int iq4_tensors, const char *label, const char *mix) {
    const char *asked = quantize_default(NULL, path);
    EXPECT(!strcmp(asked, mix), "the default --quantize of an %s file is %s", label, asked);
    ModelLoadOptions options = {.with_lm_head = true};
    Model held, floats;
    options.quantize = asked;
    CHECK(model_load(&held, path, &ops_cpu, &options) == 0, "%s", err_msg());
    ModelLoadOptions float_options = {.with_lm_head = true};
    CHECK(model_load(&floats, path, &ops_cpu, &float_options) == 0, "%s", err_msg());
    int iq4_matrices = 0;
    for (int i = 0; i < held.table.count; i++) {
        const Q8Matrix *m = quantized_matrix(&held, &held.table.entries[i]);
        iq4_matrices += m && m->type == QUANT_IQ4_NL;
    }
    EXPECT(iq4_matrices == iq4_tensors, "%d matrices held as IQ4_NL", iq4_matrices);
    float *dequantized = xmalloc((size_t)held.table.total * sizeof(float));
    memcpy(dequantized, held.params, (size_t)held.table.total * sizeof(float));
    model_dequantize_into(&held, dequantized);
    long differ = 0;
    for (int i = 0; i < held.table.count; i++) {
        const ParamEntry *e = &held.table.entries[i];
        if (quantized_matrix(&held, e))
            differ += memcmp(dequantized + e->offset, floats.params + floats.table.entries[i].offset,
                             (size_t)e->numel * sizeof(float)) != 0;
    }
    EXPECT(differ == 0, "%ld held matrices dequantize otherwise than the float load", differ);

    enum { T = 12 };
    int ids[T];
    for (int t = 0; t < T; t++) ids[t] = (t * 37 + 5) % held.config.vocab_size;
    ModelBatch batch = {.B = 1, .T = T, .tokens = ids};
    const int V = held.config.vocab_size;
    float *a = xmalloc((size_t)T * V * sizeof(float)), *b = xmalloc((size_t)T * V * sizeof(float));
    model_forward(&held, &batch);
    for (int t = 0; t < T; t++) model_logits_row(&held, t, a + (long)t * V);
    model_forward(&floats, &batch);
    for (int t = 0; t < T; t++) model_logits_row(&floats, t, b + (long)t * V);
    double worst = 0, largest = 0;
    for (long i = 0; i < (long)T * V; i++) worst = fmax(worst, fabs(a[i] - b[i])), largest = fmax(largest, fabs(b[i]));
    printf("%s model: held logits within %.3g of the float load's (largest %.3g)\n", label, worst, largest);
    // The held forward rounds each product's inputs to Q8_0 (12 rows: the integer kernel).
    EXPECT(worst > 0 && worst <= 0.02 * largest, "logits %.3g from the float load's (largest %.3g)", worst, largest);
    free(a), free(b), free(dequantized);
    model_free(&held), model_free(&floats);
}

static void test_model_file(void) {
    char path[512];
    snprintf(path, sizeof path, "%s/marlhf_test_iq4_nl_%d.gguf", getenv("MARLHF_TEST_TMP") ? getenv("MARLHF_TEST_TMP") : "/tmp",
             (int)getpid());
    Model source;
    ModelLoadOptions options = {.with_lm_head = true};
    CHECK(model_load(&source, "tests/fixtures/models/llama", &ops_cpu, &options) == 0, "%s", err_msg());
    CHECK(model_write_gguf(&source, NULL, path, GGUF_OUT_IQ4_NL) == 0, "%s", err_msg());
    model_free(&source);

    GgufFile file;
    CHECK(gguf_open(&file, path) == 0, "%s", err_msg());
    int iq4_tensors = 0;
    for (uint64_t i = 0; i < file.n_tensors; i++) iq4_tensors += file.tensors[i].type == GGML_TYPE_IQ4_NL;
    gguf_close(&file);
    // 7 matrices a layer and the token table; the head is Q8_0 (64 columns: not whole super-blocks).
    EXPECT(iq4_tensors == 2 * 7 + 1, "%d IQ4_NL tensors in the file", iq4_tensors);

    expect_held_like_float_load(path, iq4_tensors, "IQ4_NL", "iq4_nl");
    remove(path);
}

// The IQ4_XS file of a random Llama whose rows are whole super-blocks (tests/q4_k_m_model.h).
static void test_iq4_xs_model_file(void) {
    char path[512];
    snprintf(path, sizeof path, "%s/marlhf_test_iq4_xs_%d.gguf", getenv("MARLHF_TEST_TMP") ? getenv("MARLHF_TEST_TMP") : "/tmp",
             (int)getpid());
    write_random_llama(path, 0x1a4, GGUF_OUT_IQ4_XS);
    GgufFile file;
    CHECK(gguf_open(&file, path) == 0, "%s", err_msg());
    int xs = 0, nl = 0, head = 0;
    for (uint64_t i = 0; i < file.n_tensors; i++) {
        xs += file.tensors[i].type == GGML_TYPE_IQ4_XS;
        nl += file.tensors[i].type == GGML_TYPE_IQ4_NL;
        head += file.tensors[i].type == GGML_TYPE_Q6_K;
    }
    gguf_close(&file);
    // 6 matrices a layer with rows of 256 and the token table; each layer's down (rows of 384).
    EXPECT(xs == 2 * 6 + 1 && nl == 2 && head == 1, "%d IQ4_XS, %d IQ4_NL and %d Q6_K tensors", xs, nl, head);
    expect_held_like_float_load(path, xs + nl, "IQ4_XS", "iq4_xs");
    remove(path);
}

int main(void) {
    RUN(test_quantizer);
    RUN(test_iq4_xs_quantizer);
    RUN(test_layout_and_lookup);
    RUN(test_row_dot_paths);
    RUN(test_matmul_against_floats);
    RUN(test_model_file);
    RUN(test_iq4_xs_model_file);
    TEST_EXIT();
}
