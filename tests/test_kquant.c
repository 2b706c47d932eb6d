// K-quant weights run with their own bits (`--quantize q4_k_m`, `q5_k_m`, a file's default; ops/kquant.h,
// ops/cpu/matmul_kquant.c, model/quantize.c). The layouts themselves are checked against
// gguf-py bit for bit in tests/test_gguf.c (io/gguf_dequant.c, which the kernels' dequantized
// reference here goes through).
//
//  - Each row dot, per path: the portable loop equals the exact sum it is meant to compute
//    (the input blocks' scales times the integer sums of each super-block, in double, from
//    the dequantized weights and the int8 inputs: relative 1e-6 of sum |w x|); every vector
//    path compiled in (AVX2, AVX-512) gives the portable loop's bits. On super-blocks the
//    GGUF writer made and on random bytes (any 6-bit scale and minimum, any code).
//  - Batched decoding: a kernel call of several input rows (K-quants: up to KQ_INPUT_ROWS;
//    Q5_0: up to Q5_INPUTS input rows by Q5_ROWS weight rows) gives each output the bits of
//    the portable loop's call of that row alone, every path, every count and position; the
//    decode ops at N = 1 .. 70 rows and 1 / 2 threads give every row those bits too.
//  - The matmul, odd row counts and inputs of 1 to 63 rows, with and without a bias: within
//    the bound the input's quantization allows of the float matmul of the dequantized weights
//    (sum |w| * x_scale / 2 per output); from Q8_SGEMM_MIN_ROWS rows on, that float matmul.
//  - A whole model: a random Llama with rows of 256 and 384 values (a mix of Q4_K, Q6_K and
//    the fallback rows), tied and untied, written as a Q4_K_M GGUF by marlhf's converter
//    (model_write_gguf, what `marlhf convert --outtype q4_k_m` runs) and loaded with
//    --quantize q4_k_m: every Q4_K / Q6_K tensor holds the file's bytes (its rows in
//    the model's order: dequantized, they are the float load of the same file bit for bit),
//    the bytes held by the K-quant matrices equal the file's K-quant tensor bytes, the
//    fallback matrices are Q5_0 / Q8_0 held from the file's blocks too (all dequantize to the
//    float load bit for bit; memory: the file's bytes, + 2 a block of 32 for their float
//    scales), each matrix's decode kernel is within the input quantization's bound of the
//    float matmul of its values (two tensors of the file are overwritten with random
//    super-blocks first, bytes that no re-quantization of their values would give back), decode and prefill logits stay close to the float model
//    of the file's dequantized weights (prefill: of the held matrices' dequantized weights, to
//    sgemm's rounding), and --quantize q4_k_m on the float model quantizes
//    to the file's own bytes.
//  - Q5_K (a Q5_K_M file's type) through the same path and batch tests as Q4_K and Q6_K; its
//    layout against a decoder written here; llama.cpp's own Q5_K_M file
//    (tests/fixtures/gguf/q5_k_m.gguf) held with its bits and giving llama.cpp's logits to 1e-4;
//    the q5_k_m mix rule against that file's types, marlhf's Q5_K_M export and --quantize q5_k_m.
//  - Q3_K and Q2_K (Q3_K_S/M/L and Q2_K files' types) through the same path and batch tests as
//    Q4_K and Q6_K, on random super-blocks (marlhf writes neither); llama.cpp's own Q3_K_M and
//    Q2_K files of the Q5_K_M fixture's weights (tests/fixtures/gguf/q3_k_m.gguf, q2_k.gguf)
//    held with their bits and giving llama.cpp's logits to 1e-4 (Q2_K token by token: 0.05).
//  - QLoRA over a q4_k_m base against LoRA over its dequantized float32 twin; the inference
//    commands' default (quantize_default); SmolLM2 in the Q4_K_M mix decoded token by token
//    against transformers' float32 log-probs (top-1 agreement >= 0.88, mean <= 0.4).
#include <jansson.h>
#include <omp.h>
#include <math.h>
#include <string.h>

#include "core/check.h"
#include "core/rng.h"
#include "io/gguf.h"
#include "io/gguf_dequant.h"
#include "io/gguf_quantize.h"
#include "model/lora.h"
#include "model/quantize.h"
#include "model/tensor_map.h"
#include "model/weights_io.h"
#include "ops/cpu/matmul_kquant.h"
#include "ops/cpu/matmul_q5.h"
#include "ops/kquant.h"
#include "ops/q4.h"
#include "ops/q5.h"
#include "ops/q8.h"
#include "qlora_step.h"
#include "test.h"
#include "quantized_decode.h"

static void *zeroed(size_t bytes) { return xcalloc(1, bytes); }

static float uniform(uint64_t seed, uint64_t i) { return 2.0f * rng_uniform(seed, 0, i) - 1.0f; }

// n_blocks super-blocks of random bytes (any scale and minimum, any code) with factors d, dmin
// of magnitude 2^-10 .. 2^-6 (finite half floats; either sign for Q6_K and Q3_K).
static void random_blocks(QuantType type, uint8_t *blocks, long n_blocks, uint64_t seed) {
    const long block_bytes = kquant_block_bytes(type);
    for (long b = 0; b < n_blocks; b++) {
        uint8_t *block = blocks + b * block_bytes;
        for (long j = 0; j < block_bytes; j++) block[j] = (uint8_t)(rng_uniform(seed + 1, 0, (uint64_t)(b * 256 + j)) * 256);
        const uint16_t d = (uint16_t)(0x1400 + (b * 37) % 0x1000), dmin = (uint16_t)(0x1400 + (b * 53) % 0x1000);
        const uint16_t signed_d = (uint16_t)(d | (b % 2 ? 0x8000 : 0));
        if (type == QUANT_Q6_K) memcpy(block + 208, &signed_d, 2);
        else if (type == QUANT_Q3_K) memcpy(block + 108, &signed_d, 2);
        else if (type == QUANT_Q2_K) memcpy(block + 80, &d, 2), memcpy(block + 82, &dmin, 2);
        else memcpy(block, &d, 2), memcpy(block + 2, &dmin, 2); // Q4_K, Q5_K
    }
}

// Overwrites tensor `name` (Q4_K, Q5_K or Q6_K) of the GGUF file at `path` with random super-blocks:
// bytes that marlhf's own quantizer would not write for their dequantized values, as a file
// from another quantizer (llama.cpp's, with its own search) holds.
static void randomize_tensor(const char *path, const char *name, uint64_t seed) {
    GgufFile file;
    CHECK(gguf_open(&file, path) == 0, "%s", err_msg());
    const GgufTensor *t = gguf_find_tensor(&file, name);
    CHECK(t && (t->type == GGML_TYPE_Q4_K || t->type == GGML_TYPE_Q5_K || t->type == GGML_TYPE_Q6_K),
          "%s is not a K-quant tensor", name);
    const QuantType type = t->type == GGML_TYPE_Q4_K ? QUANT_Q4_K : t->type == GGML_TYPE_Q5_K ? QUANT_Q5_K : QUANT_Q6_K;
    const long offset = (long)(file.data_offset + t->offset), n_blocks = t->n_elements / KQ_BLOCK;
    const size_t bytes = t->nbytes;
    gguf_close(&file);
    uint8_t *blocks = xmalloc(bytes);
    random_blocks(type, blocks, n_blocks, seed);
    FILE *f = fopen(path, "r+b");
    CHECK(f && fseek(f, offset, SEEK_SET) == 0 && fwrite(blocks, 1, bytes, f) == bytes && fclose(f) == 0,
          "cannot rewrite %s in %s", name, path);
    free(blocks);
}

// A [rows, cols] K-quant matrix: from random floats with the GGUF writer's code, or (random_bytes)
// random bytes with sane half-float factors (any scale, minimum and code). Q3_K and Q2_K, which
// marlhf does not write, are always random bytes (llama.cpp's quantizer made the blocks of
// the fixtures test_q3_k_m_llama_cpp reads).
static Q8Matrix random_matrix(QuantType type, long rows, long cols, bool random_bytes, uint64_t seed) {
    Q8Matrix m = {0};
    if (type == QUANT_Q3_K || type == QUANT_Q2_K) {
        m = (Q8Matrix){.rows = (int)rows, .cols = (int)cols, .type = type};
        m.blocks = zeroed((size_t)(rows * kquant_row_bytes(type, cols)));
        random_blocks(type, m.blocks, rows * cols / KQ_BLOCK, seed + (random_bytes ? 0 : 77));
        return m;
    }
    float *w = xmalloc((size_t)(rows * cols) * sizeof(float));
    for (long i = 0; i < rows * cols; i++) w[i] = 0.1f * uniform(seed, (uint64_t)i) * (1.0f + (float)(i % 7));
    kquant_quantize_matrix(&m, type, w, rows, cols, zeroed);
    free(w);
    if (random_bytes) random_blocks(type, m.blocks, rows * cols / KQ_BLOCK, seed);
    return m;
}

static void quantize_inputs(const float *x, int N, long cols, KQuantInput *inputs) {
    for (int i = 0; i < N; i++) {
        inputs[i].values = xmalloc((size_t)cols);
        inputs[i].scales = xmalloc((size_t)(cols / KQ_BLOCK) * sizeof(float));
        inputs[i].sums = xmalloc((size_t)(cols / 16) * sizeof(int16_t));
        kquant_quantize_input(x + (long)i * cols, cols, &inputs[i]);
    }
}

static void free_inputs(KQuantInput *inputs, int N) {
    for (int i = 0; i < N; i++) free(inputs[i].values), free(inputs[i].scales), free(inputs[i].sums);
}

static void test_row_dot_paths(void) {
    const QuantType types[] = {QUANT_Q4_K, QUANT_Q5_K, QUANT_Q6_K, QUANT_Q3_K, QUANT_Q2_K};
    const long cols_list[] = {256, 768, 1536};
    const struct {
        const char *name;
        KQuantRowsDot dot;
    } paths[] = {{"avx2", kquant_rows_dot_avx2}, {"avx512", kquant_rows_dot_avx512}};
    int compared = 0;
    for (int t = 0; t < 5; t++)
        for (int c = 0; c < 3; c++)
            for (int random_bytes = 0; random_bytes < 2; random_bytes++) {
                const long cols = cols_list[c], rows = 9;
                const uint64_t seed = 100 + 10 * t + 3 * c + random_bytes;
                Q8Matrix m = random_matrix(types[t], rows, cols, random_bytes, seed);
                float *w = xmalloc((size_t)(rows * cols) * sizeof(float)), *x = xmalloc((size_t)cols * sizeof(float));
                kquant_dequantize_rows(&m, 0, rows, w);
                // Inputs with an all-zero block (scale 0) when there are several blocks.
                for (long i = 0; i < cols; i++) x[i] = i >= 256 && i < 512 ? 0.0f : 3.0f * uniform(seed + 7, (uint64_t)i);
                KQuantInput input;
                quantize_inputs(x, 1, cols, &input);
                // The input's quantization: every value within half a step of x.
                for (long i = 0; i < cols; i++) {
                    const float scale = input.scales[i / KQ_BLOCK];
                    EXPECT(fabsf(input.values[i] * scale - x[i]) <= 0.5f * scale * (1 + 1e-6f) + 1e-30f,
                           "input value %ld: %d * %g for %g", i, input.values[i], scale, x[i]);
                }
                // ... and each block's largest magnitude on +-127 (the whole int8 range used).
                for (long b = 0; b < cols / KQ_BLOCK; b++) {
                    int largest = 0;
                    for (long i = b * KQ_BLOCK; i < (b + 1) * KQ_BLOCK; i++) largest = abs(input.values[i]) > largest ? abs(input.values[i]) : largest;
                    EXPECT(largest == (input.scales[b] > 0 ? 127 : 0), "input block %ld: largest value %d", b, largest);
                }
                for (long r = 0; r < rows; r++) {
                    const uint8_t *row = m.blocks + r * kquant_row_bytes(types[t], cols);
                    double exact = 0, magnitude = 0;
                    for (long i = 0; i < cols; i++) {
                        const double term = (double)w[r * cols + i] * input.values[i] * input.scales[i / KQ_BLOCK];
                        exact += term, magnitude += fabs(term);
                    }
                    float portable, got;
                    kquant_rows_dot_portable(types[t], row, &input, 1, cols, &portable);
                    EXPECT(fabs(portable - exact) <= 1e-6 * magnitude + 1e-30,
                           "type %d cols %ld row %ld: portable %.9g, exact %.9g (sum |terms| %.3g)", (int)types[t], cols,
                           r, portable, exact, magnitude);
                    for (size_t p = 0; p < sizeof paths / sizeof paths[0]; p++) {
                        if (!paths[p].dot) continue;
                        paths[p].dot(types[t], row, &input, 1, cols, &got);
                        EXPECT(memcmp(&got, &portable, sizeof got) == 0, "%s, type %d cols %ld row %ld: %.9g, portable %.9g",
                               paths[p].name, (int)types[t], cols, r, got, portable);
                        compared++;
                    }
                }
                free_inputs(&input, 1);
                free(m.blocks), free(w), free(x);
            }
    printf("vector paths compared with the portable loop: %d row dots (avx2 %s, avx512 %s; the kernel runs %s)\n",
           compared, kquant_rows_dot_avx2 ? "built" : "not built", kquant_rows_dot_avx512 ? "built" : "not built",
           kquant_best_path_name);
}

// A [rows, cols] Q5_0 matrix of random codes, fifth bits and scales of either sign (any bytes
// are a valid Q5_0 block).
static Q8Matrix random_q5_0(long rows, long cols, uint64_t seed) {
    const long blocks = rows * cols / Q8_BLOCK;
    Q8Matrix m = {.rows = (int)rows, .cols = (int)cols, .type = QUANT_Q5_0};
    m.nibbles = xmalloc((size_t)(rows * cols / 2));
    m.high_bits = xmalloc((size_t)blocks * sizeof(uint32_t));
    m.scales = xmalloc((size_t)blocks * sizeof(float));
    for (long i = 0; i < rows * cols / 2; i++) m.nibbles[i] = (uint8_t)(rng_uniform(seed, 0, (uint64_t)i) * 256);
    for (long b = 0; b < blocks; b++) {
        m.high_bits[b] = (uint32_t)(rng_uniform(seed, 1, (uint64_t)b) * 4294967296.0);
        m.scales[b] = 0.01f * uniform(seed + 2, (uint64_t)b) * (1.0f + (float)(b % 5));
    }
    return m;
}

// One input row quantized as the Q5_0 kernel takes it (Q8_0 blocks and their sums).
typedef struct {
    int8_t *values;
    float *scales;
    int32_t *sums;
} Q5TestInput;

static Q5TestInput q5_test_input(const float *x, long cols) {
    Q5TestInput in = {xmalloc((size_t)cols), xmalloc((size_t)(cols / Q8_BLOCK) * sizeof(float)),
                      xmalloc((size_t)(cols / Q8_BLOCK) * sizeof(int32_t))};
    q8_quantize_row(x, cols, in.values, in.scales);
    for (long b = 0; b < cols / Q8_BLOCK; b++) {
        in.sums[b] = 0;
        for (int j = 0; j < Q8_BLOCK; j++) in.sums[b] += in.values[b * Q8_BLOCK + j];
    }
    return in;
}

static void free_q5(Q8Matrix *m, Q5TestInput *in) {
    free(m->nibbles), free(m->high_bits), free(m->scales);
    free(in->values), free(in->scales), free(in->sums);
}

// The Q5_0 kernel's paths (ops/cpu/matmul_q5.c): the portable loop equals the exact sum
// of the dequantized weights (q5_0_dequantize_rows, another code path) times the int8
// inputs and their scales, to 1e-6 of sum |terms|; every vector path gives its bits for
// every call shape: 1 to 8 rows from any first row, rows of 1, 2, 3, 18 (SmolLM2), 19 and
// 33 blocks (odd counts leave a block without a pair; 33 spans two passes of the AVX-512
// path and five chunks of scales), an all-zero input block among them.
static void test_q5_0_paths(void) {
    const long cols_list[] = {32, 64, 96, 576, 608, 1056};
    const struct {
        const char *name;
        Q5RowsDot dot;
    } paths[] = {{"avx2", q5_rows_dot_avx2}, {"avx512", q5_rows_dot_avx512}};
    int compared = 0;
    for (size_t c = 0; c < sizeof cols_list / sizeof cols_list[0]; c++) {
        const long cols = cols_list[c], rows = 13, blocks = cols / Q8_BLOCK;
        Q8Matrix m = random_q5_0(rows, cols, 700 + c);
        float *w = xmalloc((size_t)(rows * cols) * sizeof(float)), *x = xmalloc((size_t)cols * sizeof(float));
        q5_0_dequantize_rows(&m, 0, rows, w);
        for (long i = 0; i < cols; i++) x[i] = i >= 32 && i < 64 ? 0.0f : 2.0f * uniform(800 + c, (uint64_t)i);
        Q5TestInput in = q5_test_input(x, cols);
        const Q5Input input = {in.values, in.scales, in.sums, NULL};
        float portable[Q5_ROWS], got[Q5_ROWS];
        for (long first = 0; first < rows; first++)
            for (int count = 1; count <= Q5_ROWS && first + count <= rows; count++) {
                q5_rows_dot_portable(&m, first, count, &input, 1, portable, Q5_ROWS);
                if (count == 1) { // each row once: against the exact sum
                    double exact = 0, magnitude = 0;
                    for (long i = 0; i < cols; i++) {
                        const double term = (double)w[first * cols + i] * in.values[i] * in.scales[i / Q8_BLOCK];
                        exact += term, magnitude += fabs(term);
                    }
                    EXPECT(fabs(portable[0] - exact) <= 1e-6 * magnitude + 1e-30,
                           "Q5_0 cols %ld row %ld: portable %.9g, exact %.9g (sum |terms| %.3g)", cols, first,
                           portable[0], exact, magnitude);
                }
                for (size_t p = 0; p < sizeof paths / sizeof paths[0]; p++) {
                    if (!paths[p].dot) continue;
                    for (int k = 0; k < Q5_ROWS; k++) got[k] = -12345.0f; // lanes past count stay untouched
                    paths[p].dot(&m, first, count, &input, 1, got, Q5_ROWS);
                    for (int k = 0; k < count; k++)
                        EXPECT(memcmp(&got[k], &portable[k], sizeof got[k]) == 0,
                               "Q5_0 %s, cols %ld (%ld blocks), rows %ld + %d of %d: %.9g, portable %.9g", paths[p].name,
                               cols, blocks, first, k, count, got[k], portable[k]);
                    for (int k = count; k < Q5_ROWS; k++)
                        EXPECT(got[k] == -12345.0f, "Q5_0 %s wrote lane %d of a call of %d rows", paths[p].name, k, count);
                    compared += count;
                }
            }
        free_q5(&m, &in);
        free(w), free(x);
    }
    printf("Q5_0 vector paths compared with the portable loop: %d row dots (avx2 %s, avx512 %s; the kernel runs %s)\n",
           compared, q5_rows_dot_avx2 ? "built" : "not built", q5_rows_dot_avx512 ? "built" : "not built",
           q5_best_path_name);
}

// The Q5_0 decode op (matmul_forward_q8 below Q8_SGEMM_MIN_ROWS rows): each output is the
// portable loop's row dot of its input row (plus the bias), bit for bit, for 1, 3 and 63 input
// rows and 1, 2 and 4 threads (the threads take whole groups of 8 rows; 37 rows leave a
// group of 5).
static void test_q5_0_matmul(void) {
    const struct {
        int N, IC, OC;
        bool bias;
    } shapes[] = {{1, 576, 37, false}, {3, 608, 37, true}, {63, 96, 20, true}};
    const int threads_before = omp_get_max_threads();
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const int N = shapes[s].N, IC = shapes[s].IC, OC = shapes[s].OC;
        Q8Matrix m = random_q5_0(OC, IC, 900 + s);
        float *x = xmalloc((size_t)N * IC * sizeof(float)), *got = xmalloc((size_t)N * OC * sizeof(float));
        float *bias = shapes[s].bias ? xmalloc((size_t)OC * sizeof(float)) : NULL;
        for (long i = 0; i < (long)N * IC; i++) x[i] = uniform(910 + s, (uint64_t)i);
        for (int o = 0; bias && o < OC; o++) bias[o] = uniform(920 + s, (uint64_t)o);
        const int thread_counts[] = {1, 2, 4};
        for (int t = 0; t < 3; t++) {
            omp_set_num_threads(thread_counts[t]);
            ops_cpu.matmul_forward_q8(got, x, &m, bias, N, IC, OC, N);
            int mismatches = 0;
            for (int i = 0; i < N; i++) {
                Q5TestInput in = q5_test_input(x + (long)i * IC, IC);
                const Q5Input input = {in.values, in.scales, in.sums, NULL};
                for (int o = 0; o < OC; o++) {
                    float expected;
                    q5_rows_dot_portable(&m, o, 1, &input, 1, &expected, 1);
                    if (bias) expected += bias[o];
                    mismatches += memcmp(&expected, &got[(long)i * OC + o], sizeof expected) != 0;
                }
                free(in.values), free(in.scales), free(in.sums);
            }
            EXPECT(mismatches == 0, "Q5_0 matmul N %d IC %d OC %d, %d threads: %d outputs differ from the portable loop", N,
                   IC, OC, thread_counts[t], mismatches);
        }
        free(m.nibbles), free(m.high_bits), free(m.scales);
        free(x), free(got), free(bias);
    }
    omp_set_num_threads(threads_before);
}

// Batched K-quant calls (ops/cpu/matmul_kquant.c): a call of `count` input rows gives each
// row the bits of the portable loop's call of that row alone, on every path (the portable
// loop's own batched call included), every count 1 .. KQ_INPUT_ROWS and every position of
// the row in the call; nothing is written past out[count - 1]. Input rows of different
// magnitudes, one with an all-zero block; super-blocks the GGUF writer made and random bytes.
static void test_batched_row_dots(void) {
    const QuantType types[] = {QUANT_Q4_K, QUANT_Q5_K, QUANT_Q6_K, QUANT_Q3_K, QUANT_Q2_K};
    const struct {
        const char *name;
        KQuantRowsDot dot;
    } paths[] = {{"portable", kquant_rows_dot_portable}, {"avx2", kquant_rows_dot_avx2}, {"avx512", kquant_rows_dot_avx512}};
    enum { INPUTS = 7, ROWS = 5 };
    const long cols = 768;
    int compared = 0;
    for (int t = 0; t < 5; t++)
        for (int random_bytes = 0; random_bytes < 2; random_bytes++) {
            const uint64_t seed = 1100 + 10 * t + random_bytes;
            Q8Matrix m = random_matrix(types[t], ROWS, cols, random_bytes, seed);
            float *x = xmalloc((size_t)INPUTS * cols * sizeof(float));
            for (long i = 0; i < INPUTS * cols; i++) {
                const long input = i / cols, c = i % cols;
                x[i] = input == 3 && c >= 256 && c < 512 ? 0.0f : (1.0f + (float)input) * uniform(seed + 5, (uint64_t)i);
            }
            KQuantInput inputs[INPUTS];
            quantize_inputs(x, INPUTS, cols, inputs);
            const long row_bytes = kquant_row_bytes(types[t], cols);
            float single[INPUTS][ROWS];
            for (int i = 0; i < INPUTS; i++)
                for (int r = 0; r < ROWS; r++)
                    kquant_rows_dot_portable(types[t], m.blocks + r * row_bytes, &inputs[i], 1, cols, &single[i][r]);
            for (size_t p = 0; p < sizeof paths / sizeof paths[0]; p++) {
                if (!paths[p].dot) continue;
                for (int r = 0; r < ROWS; r++)
                    for (int count = 1; count <= KQ_INPUT_ROWS; count++)
                        for (int first = 0; first + count <= INPUTS; first++) {
                            float got[KQ_INPUT_ROWS + 1];
                            for (int i = 0; i <= KQ_INPUT_ROWS; i++) got[i] = -12345.0f;
                            paths[p].dot(types[t], m.blocks + r * row_bytes, &inputs[first], count, cols, got);
                            for (int i = 0; i < count; i++)
                                EXPECT(memcmp(&got[i], &single[first + i][r], sizeof got[i]) == 0,
                                       "%s type %d%s row %d, inputs %d + %d of %d: %.9g, alone %.9g", paths[p].name,
                                       (int)types[t], random_bytes ? " (random bytes)" : "", r, first, i, count, got[i],
                                       single[first + i][r]);
                            for (int i = count; i <= KQ_INPUT_ROWS; i++)
                                EXPECT(got[i] == -12345.0f, "%s wrote out[%d] in a call of %d rows", paths[p].name, i, count);
                            compared += count;
                        }
            }
            free_inputs(inputs, INPUTS);
            free(m.blocks), free(x);
        }
    printf("batched K-quant row dots compared with single rows: %d\n", compared);
}

// Batched Q5_0 calls (ops/cpu/matmul_q5.c): each output of a call of `inputs` input rows and
// `count` weight rows has the bits of the portable loop's call of that weight row and that
// input row alone, on every path (the portable loop's batched call included), for every
// inputs 1 .. Q5_INPUTS at every position, every count 1 .. Q5_ROWS from any first row, rows
// of 2, 3, 18 (SmolLM2), 19 and 33 blocks (odd counts leave a block without a pair; 18, 19
// and 33 span several of the shorter passes a call of several inputs takes). Nothing is
// written outside [inputs, count] of the strided output.
static void test_q5_0_batched_paths(void) {
    const long cols_list[] = {64, 96, 576, 608, 1056};
    const struct {
        const char *name;
        Q5RowsDot dot;
    } paths[] = {{"portable", q5_rows_dot_portable}, {"avx2", q5_rows_dot_avx2}, {"avx512", q5_rows_dot_avx512}};
    enum { INPUTS = 6, ROWS = 11, STRIDE = Q5_ROWS + 1 };
    int compared = 0;
    for (size_t c = 0; c < sizeof cols_list / sizeof cols_list[0]; c++) {
        const long cols = cols_list[c];
        Q8Matrix m = random_q5_0(ROWS, cols, 1200 + c);
        float *x = xmalloc((size_t)cols * sizeof(float));
        Q5TestInput in[INPUTS];
        Q5Input input[INPUTS];
        for (int i = 0; i < INPUTS; i++) {
            for (long j = 0; j < cols; j++)
                x[j] = i == 2 && j >= 32 && j < 64 ? 0.0f : (1.0f + (float)i) * uniform(1300 + c, (uint64_t)(i * cols + j));
            in[i] = q5_test_input(x, cols);
            input[i] = (Q5Input){in[i].values, in[i].scales, in[i].sums, NULL};
        }
        float single[INPUTS][ROWS];
        for (int i = 0; i < INPUTS; i++)
            for (int r = 0; r < ROWS; r++) q5_rows_dot_portable(&m, r, 1, &input[i], 1, &single[i][r], 1);
        for (size_t p = 0; p < sizeof paths / sizeof paths[0]; p++) {
            if (!paths[p].dot) continue;
            for (int inputs = 1; inputs <= Q5_INPUTS; inputs++)
                for (int first_input = 0; first_input + inputs <= INPUTS; first_input++)
                    for (int first = 0; first < ROWS; first++)
                        for (int count = 1; count <= Q5_ROWS && first + count <= ROWS; count++) {
                            float got[(Q5_INPUTS + 1) * STRIDE];
                            for (int j = 0; j < (Q5_INPUTS + 1) * STRIDE; j++) got[j] = -12345.0f;
                            paths[p].dot(&m, first, count, &input[first_input], inputs, got, STRIDE);
                            for (int i = 0; i <= Q5_INPUTS; i++)
                                for (int k = 0; k < STRIDE; k++) {
                                    const float value = got[i * STRIDE + k];
                                    if (i < inputs && k < count)
                                        EXPECT(memcmp(&value, &single[first_input + i][first + k], sizeof value) == 0,
                                               "Q5_0 %s, cols %ld, rows %d + %d of %d, inputs %d + %d of %d: %.9g, alone %.9g",
                                               paths[p].name, cols, first, k, count, first_input, i, inputs, value,
                                               single[first_input + i][first + k]);
                                    else
                                        EXPECT(value == -12345.0f, "Q5_0 %s wrote input %d row %d of a call of %d x %d",
                                               paths[p].name, i, k, inputs, count);
                                }
                            compared += inputs * count;
                        }
        }
        for (int i = 0; i < INPUTS; i++) free(in[i].values), free(in[i].scales), free(in[i].sums);
        free(m.nibbles), free(m.high_bits), free(m.scales);
        free(x);
    }
    printf("batched Q5_0 row dots compared with single rows: %d\n", compared);
}

// The decode kernels over N = 1 .. 70 input rows (cpu_matmul_kquant and cpu_matmul_q5
// themselves, past Q8_SGEMM_MIN_ROWS too, where matmul_forward_q8 would take sgemm), with a
// bias, at 1 and 2 threads: every output has the bits of the portable loop's call of its
// weight row and input row alone (+ the bias), so an input row's result depends neither on
// how many rows are in the batch (whole groups and every remainder), nor on the thread
// count, nor on the vector path. 13 weight rows: a Q5_0 group of 8 and one of 5.
static void test_batched_matmul(void) {
    const QuantType types[] = {QUANT_Q4_K, QUANT_Q6_K, QUANT_Q5_0, QUANT_Q5_K, QUANT_Q3_K, QUANT_Q2_K};
    enum { MAX_N = 70, OC = 13 };
    const int threads_before = omp_get_max_threads();
    for (int t = 0; t < 6; t++) {
        const QuantType type = types[t];
        const int IC = type == QUANT_Q5_0 ? 608 : 512;
        Q8Matrix m = type == QUANT_Q5_0 ? random_q5_0(OC, IC, 1400) : random_matrix(type, OC, IC, false, 1400 + t);
        float *x = xmalloc((size_t)MAX_N * IC * sizeof(float)), *bias = xmalloc(OC * sizeof(float));
        float *expected = xmalloc((size_t)MAX_N * OC * sizeof(float)), *got = xmalloc((size_t)MAX_N * OC * sizeof(float));
        for (long i = 0; i < (long)MAX_N * IC; i++) x[i] = (1.0f + (float)(i / IC % 5)) * uniform(1500 + t, (uint64_t)i);
        for (int o = 0; o < OC; o++) bias[o] = uniform(1600 + t, (uint64_t)o);
        for (int i = 0; i < MAX_N; i++)
            for (int o = 0; o < OC; o++) {
                float sum;
                if (type == QUANT_Q5_0) {
                    Q5TestInput in = q5_test_input(x + (long)i * IC, IC);
                    const Q5Input input = {in.values, in.scales, in.sums, NULL};
                    q5_rows_dot_portable(&m, o, 1, &input, 1, &sum, 1);
                    free(in.values), free(in.scales), free(in.sums);
                } else {
                    KQuantInput input;
                    quantize_inputs(x + (long)i * IC, 1, IC, &input);
                    kquant_rows_dot_portable(type, m.blocks + o * kquant_row_bytes(type, IC), &input, 1, IC, &sum);
                    free_inputs(&input, 1);
                }
                expected[(long)i * OC + o] = sum + bias[o];
            }
        for (int threads = 1; threads <= 2; threads++) {
            omp_set_num_threads(threads);
            int mismatches = 0, first_bad_n = 0;
            for (int N = 1; N <= MAX_N; N++) {
                for (long j = 0; j < (long)N * OC; j++) got[j] = NAN;
                if (type == QUANT_Q5_0) cpu_matmul_q5(got, x, &m, bias, N, IC, OC);
                else cpu_matmul_kquant(got, x, &m, bias, N, IC, OC);
                const int bad = memcmp(got, expected, (size_t)N * OC * sizeof(float)) != 0;
                if (bad && !first_bad_n) first_bad_n = N;
                mismatches += bad;
            }
            EXPECT(mismatches == 0, "type %d, %d threads: %d of the batch sizes 1-%d differ from single rows (first N %d)",
                   (int)type, threads, mismatches, MAX_N, first_bad_n);
        }
        if (type == QUANT_Q5_0) free(m.nibbles), free(m.high_bits), free(m.scales);
        else free(m.blocks);
        free(x), free(bias), free(expected), free(got);
    }
    omp_set_num_threads(threads_before);
}

static void test_matmul(void) {
    const struct {
        int N, IC, OC;
        bool bias;
    } shapes[] = {{1, 256, 7, false}, {3, 512, 37, true}, {5, 1536, 13, false}, {63, 768, 9, true}, {64, 256, 11, true}, {70, 512, 5, false}};
    const QuantType types[] = {QUANT_Q4_K, QUANT_Q6_K, QUANT_Q5_K, QUANT_Q3_K, QUANT_Q2_K};
    for (int t = 0; t < 5; t++) {
        const QuantType type = types[t];
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
            const int N = shapes[s].N, IC = shapes[s].IC, OC = shapes[s].OC;
            Q8Matrix m = random_matrix(type, OC, IC, false, 300 + s);
            float *w = xmalloc((size_t)OC * IC * sizeof(float)), *x = xmalloc((size_t)N * IC * sizeof(float));
            float *bias = shapes[s].bias ? xmalloc((size_t)OC * sizeof(float)) : NULL;
            float *got = xmalloc((size_t)N * OC * sizeof(float)), *expected = xmalloc((size_t)N * OC * sizeof(float));
            kquant_dequantize_rows(&m, 0, OC, w);
            for (long i = 0; i < (long)N * IC; i++) x[i] = uniform(400 + s, (uint64_t)i);
            for (int o = 0; bias && o < OC; o++) bias[o] = uniform(500 + s, (uint64_t)o);
            ops_cpu.matmul_forward_q8(got, x, &m, bias, N, IC, OC, N);
            ops_cpu.matmul_forward(expected, x, w, bias, N, IC, OC);
            KQuantInput *inputs = xmalloc((size_t)N * sizeof(KQuantInput));
            quantize_inputs(x, N, IC, inputs);
            double worst = 0; // the error as a fraction of what the input's rounding allows
            for (int i = 0; i < N; i++)
                for (int o = 0; o < OC; o++) {
                    double bound = 0;
                    for (long c = 0; c < IC; c++)
                        bound += fabs(w[(long)o * IC + c]) * inputs[i].scales[c / KQ_BLOCK] / 2;
                    // From Q8_SGEMM_MIN_ROWS rows on: sgemm of the same floats (float rounding only).
                    if (N >= Q8_SGEMM_MIN_ROWS) bound = 1e-5 * (fabs(expected[(long)i * OC + o]) + 1);
                    else bound += 1e-5 * (fabs(expected[(long)i * OC + o]) + 1); // float sums, f16 factors
                    worst = fmax(worst, fabs(got[(long)i * OC + o] - expected[(long)i * OC + o]) / bound);
                }
            EXPECT(worst <= 1.0, "type %d [%d x %d] x %d rows: error %.3g of its bound", (int)type, OC, IC, N, worst);
            free_inputs(inputs, N);
            free(inputs), free(m.blocks), free(w), free(x), free(bias), free(got), free(expected);
        }
    }
}

// The decode kernel of a held matrix (any type: Q4_K / Q6_K's own, Q5_0 / Q8_0 through the
// Q8_0 integer kernel) on 3 input rows against the float matmul of its dequantized values
// `w`, within what the input's quantization allows: sum |w| * (the input block's scale) / 2,
// the blocks 256 values for the K-quants (Q8_K) and 32 for the others (Q8_0).
static void check_decode_matmul(const Q8Matrix *m, const float *w, const char *name) {
    const int N = 3, IC = m->cols, OC = m->rows, block = quant_is_kquant(m->type) ? KQ_BLOCK : Q8_BLOCK;
    float *x = xmalloc((size_t)N * IC * sizeof(float)), *got = xmalloc((size_t)N * OC * sizeof(float));
    float *expected = xmalloc((size_t)N * OC * sizeof(float));
    for (long i = 0; i < (long)N * IC; i++) x[i] = uniform(600, (uint64_t)i);
    ops_cpu.matmul_forward_q8(got, x, m, NULL, N, IC, OC, N);
    ops_cpu.matmul_forward(expected, x, w, NULL, N, IC, OC);
    double worst = 0;
    for (int i = 0; i < N; i++)
        for (int o = 0; o < OC; o++) {
            double bound = 1e-5 * (fabs(expected[(long)i * OC + o]) + 1);
            for (long c0 = 0; c0 < IC; c0 += block) {
                double largest = 0, weights = 0;
                for (long c = c0; c < c0 + block; c++)
                    largest = fmax(largest, fabs(x[(long)i * IC + c])), weights += fabs(w[(long)o * IC + c]);
                bound += weights * largest / 127 / 2;
            }
            worst = fmax(worst, fabs(got[(long)i * OC + o] - expected[(long)i * OC + o]) / bound);
        }
    EXPECT(worst <= 1.0, "%s (type %d): decode error %.3g of its bound", name, (int)m->type, worst);
    free(x), free(got), free(expected);
}

// A random Llama whose rows are 256 (hidden, attention) and 384 (intermediate) values long:
// q, k, v, o, gate and up are K-quants in a Q4_K_M file, down falls back (Q5_0 or Q8_0).
static void random_llama(Model *model, bool tied) {
    ModelConfig cfg = {0};
    cfg.family = FAMILY_LLAMA;
    cfg.vocab_size = 300, cfg.hidden_size = 256, cfg.num_layers = 3, cfg.num_heads = 4, cfg.num_kv_heads = 2;
    cfg.intermediate_size = 384, cfg.max_position_embeddings = 128, cfg.norm_eps = 1e-5f, cfg.rope_theta = 10000.0f;
    cfg.tie_word_embeddings = tied;
    CHECK(config_finish(&cfg, "random llama") == 0, "%s", err_msg());
    model_init(model, &cfg, &ops_cpu, true, false);
    for (int i = 0; i < model->table.count; i++) {
        const ParamEntry *e = &model->table.entries[i];
        float *p = model->params + e->offset;
        const bool norm = strstr(e->name, "norm") != NULL;
        for (long j = 0; j < e->numel; j++)
            p[j] = norm ? 1.0f + 0.1f * uniform(7 + i, (uint64_t)j) : 0.08f * uniform(7 + i, (uint64_t)j);
    }
}

// The largest difference between the decode logits (decode_logits: 5 steps) of `own` and of
// `reference`, and the largest of the reference's in *largest.
static double decode_difference(Model *own, Model *reference, double *largest) {
    const int V = own->config.vocab_size, steps = 5;
    float *expected = xmalloc((size_t)steps * 2 * V * sizeof(float)), *got = xmalloc((size_t)steps * 2 * V * sizeof(float));
    decode_logits(reference, expected, steps);
    decode_logits(own, got, steps);
    *largest = 0;
    for (long i = 0; i < (long)steps * 2 * V; i++) *largest = fmax(*largest, fabs(expected[i]));
    const double difference = test_max_abs_diff(got, expected, (long)steps * 2 * V);
    free(expected), free(got);
    return difference;
}

// The tensor of GGUF file `file` that entry `e` of `model` is read from.
static const GgufTensor *file_tensor(const Model *model, const ParamEntry *e, const GgufFile *file) {
    TensorMap map;
    tensor_map_gguf(&model->config, e, &map);
    const GgufTensor *t = gguf_find_tensor(file, map.source);
    CHECK(t, "no tensor %s", map.source);
    return t;
}

static void load_gguf(Model *model, const char *path, const char *quantize) {
    ModelLoadOptions options = {.with_lm_head = true, .quantize = quantize};
    CHECK(model_load(model, path, &ops_cpu, &options) == 0, "%s", err_msg());
}

static void test_q4_k_m_model(void) {
    const char *tmp = getenv("MARLHF_TEST_TMP") ? getenv("MARLHF_TEST_TMP") : "/tmp";
    for (int tied = 0; tied < 2; tied++) {
        char path[512];
        snprintf(path, sizeof path, "%s/kquant-%d.gguf", tmp, tied);
        Model original;
        random_llama(&original, tied);
        CHECK(model_write_gguf(&original, NULL, path, GGUF_OUT_Q4_K_M) == 0, "%s", err_msg());
        // Two tensors of bytes marlhf's quantizer would not write (one of them a permuted q):
        // re-quantizing their dequantized values would not give them back.
        const char *foreign[] = {"blk.0.attn_q.weight", "blk.2.attn_v.weight"};
        for (int k = 0; k < 2; k++) randomize_tensor(path, foreign[k], 900 + k);
        Model dequantized, own;
        load_gguf(&dequantized, path, NULL);
        load_gguf(&own, path, "q4_k_m");
        EXPECT(!strcmp(model_quantize_name(&own), "q4_k_m"), "name %s", model_quantize_name(&own));
        GgufFile file;
        CHECK(gguf_open(&file, path) == 0, "%s", err_msg());
        long file_kquant_bytes = 0, held_kquant_bytes = 0, file_bytes = 0, held_bytes = 0, blocks_of_32 = 0;
        int counts[QUANT_Q5_0 + 1] = {0};
        for (int i = 0; i < own.table.count; i++) {
            const ParamEntry *e = &own.table.entries[i];
            const Q8Matrix *m = quantized_matrix(&own, e);
            if (!m) continue;
            const GgufTensor *t = file_tensor(&own, e, &file);
            const bool file_kquant = t->type == GGML_TYPE_Q4_K || t->type == GGML_TYPE_Q6_K;
            const QuantType expected = t->type == GGML_TYPE_Q4_K   ? QUANT_Q4_K
                                       : t->type == GGML_TYPE_Q6_K ? QUANT_Q6_K
                                       : t->type == GGML_TYPE_Q5_0 ? QUANT_Q5_0
                                                                   : QUANT_Q8_0;
            EXPECT(m->type == expected, "%s: type %d for the file's %s", e->name, (int)m->type, gguf_type_name(t->type));
            counts[m->type]++;
            float *values = xmalloc((size_t)e->numel * sizeof(float));
            quant_dequantize_rows(m, 0, m->rows, values);
            const float *file_values = dequantized.params + e->offset;
            EXPECT(memcmp(values, file_values, (size_t)e->numel * sizeof(float)) == 0,
                   "%s: the held blocks are not the file's rows", e->name);
            check_decode_matmul(m, values, e->name);
            file_bytes += (long)gguf_quantized_size(t->type, t->n_elements);
            held_bytes += quant_matrix_bytes(m);
            if (file_kquant) {
                file_kquant_bytes += (long)gguf_quantized_size(t->type, t->n_elements);
                held_kquant_bytes += quant_matrix_bytes(m);
            } else blocks_of_32 += e->numel / 32;
            free(values);
        }
        gguf_close(&file);
        // Per layer: q, k, v, o, gate, up K-quants, down the fallback (Q5_0 for Q4_K, Q8_0 for
        // Q6_K); the token table too (rows of 256) and an untied output.
        const int layers = own.config.num_layers;
        EXPECT(counts[QUANT_Q4_K] + counts[QUANT_Q6_K] == 6 * layers + 1 + (tied ? 0 : 1) &&
                   counts[QUANT_Q5_0] + counts[QUANT_Q8_0] == layers && counts[QUANT_Q5_0] >= 1 && counts[QUANT_Q8_0] >= 1,
               "tied %d: %d Q4_K, %d Q6_K, %d Q5_0, %d Q8_0 matrices", tied, counts[QUANT_Q4_K], counts[QUANT_Q6_K],
               counts[QUANT_Q5_0], counts[QUANT_Q8_0]);
        EXPECT(counts[QUANT_Q6_K] >= 2, "tied %d: %d Q6_K matrices (output, some attn_v)", tied, counts[QUANT_Q6_K]);
        // Memory: the file's bytes, and for the blocks of 32 a float scale where the file has a half.
        EXPECT(held_kquant_bytes == file_kquant_bytes && held_kquant_bytes > 0, "K-quant bytes held %ld, in the file %ld",
               held_kquant_bytes, file_kquant_bytes);
        EXPECT(held_bytes == file_bytes + 2 * blocks_of_32, "bytes held %ld, in the file %ld (+ 2 x %ld blocks of 32)",
               held_bytes, file_bytes, blocks_of_32);
        printf("tied %d: %d Q4_K, %d Q6_K, %d Q5_0, %d Q8_0 matrices; K-quant bytes held %ld = the file's; all %ld = the "
               "file's %ld + 2 a block of 32\n", tied, counts[QUANT_Q4_K], counts[QUANT_Q6_K], counts[QUANT_Q5_0],
               counts[QUANT_Q8_0], held_kquant_bytes, held_bytes, file_bytes);

        // Logits against the float model of the file's dequantized weights.
        double largest;
        const double difference = decode_difference(&own, &dequantized, &largest);
        EXPECT(difference > 0 && difference <= 0.04 * largest, "tied %d: decode logits differ by %.3g (largest %.3g)",
               tied, difference, largest);
        printf("tied %d: decode logits within %.3g of the dequantized float model (largest %.3g)\n", tied, difference,
               largest);
        // A prefill of 2 x 40 rows (the dequantized tiles): the logits of the float model holding
        // the held matrices' dequantized values (the fallbacks' Q8_0 ones included), up to sgemm's rounding.
        Model twin;
        load_gguf(&twin, path, "q4_k_m");
        model_dequantize(&twin);
        const int B = 2, T = 40, V = own.config.vocab_size;
        int *tokens = xmalloc((size_t)B * T * sizeof(int));
        for (int i = 0; i < B * T; i++) tokens[i] = (5 * i + 1) % V;
        ModelBatch batch = {.B = B, .T = T, .tokens = tokens};
        float *a = xmalloc((size_t)V * sizeof(float)), *b = xmalloc((size_t)V * sizeof(float));
        model_forward(&twin, &batch);
        model_logits_row(&twin, B * T - 1, a);
        model_forward(&own, &batch);
        model_logits_row(&own, B * T - 1, b);
        const double prefill = test_max_abs_diff(b, a, V);
        EXPECT(prefill <= 1e-4 * largest, "tied %d: prefill logits differ by %.3g", tied, prefill);

        // --quantize q4_k_m on the float model: the file's own bytes for every K-quant matrix.
        CHECK(model_quantize(&original, "q4_k_m") == 0, "%s", err_msg());
        for (int i = 0; i < own.table.count; i++) {
            const ParamEntry *e = &own.table.entries[i];
            const Q8Matrix *from_file = quantized_matrix(&own, e), *from_floats = quantized_matrix(&original, e);
            if (!from_file || !quant_is_kquant(from_file->type)) continue;
            TensorMap map;
            tensor_map_gguf(&own.config, e, &map);
            if (!strcmp(map.source, foreign[0]) || !strcmp(map.source, foreign[1])) continue;
            EXPECT(from_floats->type == from_file->type &&
                       !memcmp(from_floats->blocks, from_file->blocks,
                               (size_t)(from_file->rows * kquant_row_bytes(from_file->type, from_file->cols))),
                   "%s: quantizing the floats gives other bytes than the file's", e->name);
        }
        free(tokens), free(a), free(b);
        model_free(&original), model_free(&dequantized), model_free(&own), model_free(&twin);
        remove(path);
    }
}

// Q5_K's layout read by a decoder written here from llama.cpp's description (d, dmin, the
// 12 bytes of 6-bit scales and minimums, 32 bytes of fifth bits -- bit j of byte l for value
// l of sub-block j --, then Q4_K's 128 bytes of low nibbles): kquant_dequantize_rows gives its
// values bit for bit on random super-blocks (any scale, minimum, code and fifth bit). And the
// Q5_K block writer (io/gguf_quantize.c) on random floats: its values within 0.6 of the Q4_K
// writer's root-mean-square error on the same floats (the fifth bit halves the step), and
// above zero (the codes are not the floats).
static void test_q5_k_layout(void) {
    enum { ROWS = 3, COLS = 512 };
    Q8Matrix m = random_matrix(QUANT_Q5_K, ROWS, COLS, true, 2100);
    float *got = xmalloc(ROWS * COLS * sizeof(float));
    kquant_dequantize_rows(&m, 0, ROWS, got);
    int mismatches = 0;
    for (long b = 0; b < ROWS * COLS / KQ_BLOCK; b++) {
        const uint8_t *block = m.blocks + b * KQ_Q5_K_BYTES, *packed = block + 4, *qh = block + 16, *qs = block + 48;
        uint16_t d_half, dmin_half;
        memcpy(&d_half, block, 2), memcpy(&dmin_half, block + 2, 2);
        const float d = gguf_f16_to_f32(d_half), dmin = gguf_f16_to_f32(dmin_half);
        for (int j = 0; j < 8; j++) {
            const int scale = j < 4 ? packed[j] & 63 : (packed[j + 4] & 0x0F) | (packed[j - 4] >> 6) << 4;
            const int min = j < 4 ? packed[j + 4] & 63 : (packed[j + 4] >> 4) | (packed[j] >> 6) << 4;
            for (int l = 0; l < 32; l++) {
                const int q = ((qs[32 * (j / 2) + l] >> (4 * (j % 2))) & 15) + 16 * ((qh[l] >> j) & 1);
                const float expected = d * (float)scale * (float)q - dmin * (float)min;
                mismatches += memcmp(&expected, &got[b * KQ_BLOCK + 32 * j + l], sizeof expected) != 0;
            }
        }
    }
    EXPECT(mismatches == 0, "Q5_K: %d dequantized values differ from the layout's", mismatches);
    free(m.blocks);
    float *w = xmalloc(ROWS * COLS * sizeof(float));
    for (long i = 0; i < ROWS * COLS; i++) w[i] = 0.1f * uniform(2200, (uint64_t)i) * (1.0f + (float)(i % 7));
    double squared[2] = {0, 0};
    const QuantType types[2] = {QUANT_Q4_K, QUANT_Q5_K};
    for (int t = 0; t < 2; t++) {
        Q8Matrix q = {0};
        kquant_quantize_matrix(&q, types[t], w, ROWS, COLS, zeroed);
        kquant_dequantize_rows(&q, 0, ROWS, got);
        for (long i = 0; i < ROWS * COLS; i++) squared[t] += (double)(got[i] - w[i]) * (got[i] - w[i]);
        free(q.blocks);
    }
    const double rms4 = sqrt(squared[0] / (ROWS * COLS)), rms5 = sqrt(squared[1] / (ROWS * COLS));
    EXPECT(rms5 > 0 && rms5 <= 0.6 * rms4, "Q5_K writer: rms error %.3g, Q4_K's %.3g", rms5, rms4);
    printf("Q5_K writer: rms error %.4g (Q4_K's %.4g)\n", rms5, rms4);
    free(w), free(got);
}

// The QuantType a GGUF K-quant tensor is held as on the CPU (-1 for another type).
static int held_kquant_type(uint32_t type) {
    switch (type) {
    case GGML_TYPE_Q2_K: return QUANT_Q2_K;
    case GGML_TYPE_Q3_K: return QUANT_Q3_K;
    case GGML_TYPE_Q4_K: return QUANT_Q4_K;
    case GGML_TYPE_Q5_K: return QUANT_Q5_K;
    case GGML_TYPE_Q6_K: return QUANT_Q6_K;
    default: return -1;
    }
}

// A llama.cpp file of K-quants (tests/fixtures/gguf/NAME.gguf: a random Llama of rows of 256
// that llama.cpp's own quantizer wrote, tools/make_q5_k_fixture.py, tools/make_q3_k_fixture.py)
// runs with its own bits by default: every matrix held as the file's bytes in the file's type
// (memory: the file's K-quant bytes; `expected_counts[type]` matrices of each QuantType), and
// the logits at all 12 positions, decoded token by token through the KV cache and in one batch
// (both below Q8_SGEMM_MIN_ROWS rows: the decode kernels; the token table looked up in the
// file's type), are llama.cpp's on the same file (NAME.expected.json, one batch) to
// `tolerance` (token by token: `step_tolerance`, below) --
// llama.cpp quantizes the activations to Q8_K as marlhf's kernels do, so they agree far closer
// than the quantization moves the logits (float inputs on the file's dequantized weights, as
// --quantize none, or the file's blocks re-quantized to Q8_0, are 1e-2 or more off). Token by
// token the attention runs over the KV cache (ops/cpu/attention_decode.c), whose sums round
// differently from the batch's in the last bit; an activation that lands on a rounding
// boundary of its int8 quantization then takes the other step, which moves that position's
// logits by up to about the step times the weights it meets (Q2_K's coarse grid: 0.016 once).
static void check_llama_cpp_fixture(const char *name, const int expected_counts[QUANT_Q2_K + 1], double tolerance,
                                    double step_tolerance) {
    char path[256], expected_path[256];
    snprintf(path, sizeof path, "tests/fixtures/gguf/%s.gguf", name);
    snprintf(expected_path, sizeof expected_path, "tests/fixtures/gguf/%s.expected.json", name);
    json_error_t error;
    json_t *expected = json_load_file(expected_path, 0, &error);
    CHECK(expected, "%s: %s", expected_path, error.text);
    const char *quantize = quantize_default(NULL, path); // the file's general.file_type names its mix
    EXPECT(!strcmp(quantize, name), "%s: the default %s", name, quantize);
    Model model;
    load_gguf(&model, path, quantize);
    GgufFile file;
    CHECK(gguf_open(&file, path) == 0, "%s", err_msg());
    int counts[QUANT_Q2_K + 1] = {0};
    long file_bytes = 0, held_bytes = 0;
    for (int i = 0; i < model.table.count; i++) {
        const ParamEntry *e = &model.table.entries[i];
        const Q8Matrix *m = quantized_matrix(&model, e);
        if (!m) continue;
        const GgufTensor *t = file_tensor(&model, e, &file);
        counts[m->type]++;
        EXPECT((int)m->type == held_kquant_type(t->type), "%s: %s held as type %d for the file's %s", name, e->name,
               (int)m->type, gguf_type_name(t->type));
        EXPECT(!quant_is_kquant(m->type) ||
                   memcmp(m->blocks, t->data, (size_t)m->rows * (size_t)kquant_row_bytes(m->type, m->cols)) == 0 ||
                   strstr(e->name, "q_proj") || strstr(e->name, "k_proj"), // llama.cpp's row order undone
               "%s: %s does not hold the file's bytes", name, e->name);
        file_bytes += (long)t->nbytes, held_bytes += quant_matrix_bytes(m);
    }
    gguf_close(&file);
    for (int type = 0; type <= QUANT_Q2_K; type++)
        EXPECT(counts[type] == expected_counts[type], "%s: %d matrices of type %d, expected %d", name, counts[type], type,
               expected_counts[type]);
    EXPECT(held_bytes == file_bytes, "%s: bytes held %ld, the file's %ld", name, held_bytes, file_bytes);

    json_t *ids_json = json_object_get(expected, "ids"), *logits_json = json_object_get(expected, "logits");
    const int T = (int)json_array_size(ids_json), V = model.config.vocab_size;
    CHECK(V == json_integer_value(json_object_get(expected, "vocab")) && T <= 16, "the fixture does not fit the model");
    int ids[16];
    for (int t = 0; t < T; t++) ids[t] = (int)json_integer_value(json_array_get(ids_json, t));
    float *batch_logits = xmalloc((size_t)T * V * sizeof(float)), *step_logits = xmalloc((size_t)T * V * sizeof(float));
    ModelBatch batch = {.B = 1, .T = T, .tokens = ids};
    model_forward(&model, &batch);
    for (int t = 0; t < T; t++) model_logits_row(&model, t, batch_logits + (long)t * V);
    KvCache cache;
    kv_cache_init(&cache, &model, 1, T);
    for (int t = 0; t < T; t++) {
        ModelBatch one = {.B = 1, .T = 1, .tokens = &ids[t]};
        model_forward_cached(&model, &one, &cache);
        model_last_logits(&model, step_logits + (long)t * V);
    }
    kv_cache_free(&cache, &model);
    double batch_difference = 0, step_difference = 0, largest = 0;
    for (int t = 0; t < T; t++)
        for (int v = 0; v < V; v++) {
            const double reference = json_real_value(json_array_get(json_array_get(logits_json, t), v));
            largest = fmax(largest, fabs(reference));
            batch_difference = fmax(batch_difference, fabs(batch_logits[(long)t * V + v] - reference));
            step_difference = fmax(step_difference, fabs(step_logits[(long)t * V + v] - reference));
        }
    const double quantization = json_real_value(json_object_get(expected, "quantization_max_difference"));
    printf("%s file against llama.cpp's logits (largest %.3g; the quantization moves them %.3g): batch %.3g, "
           "token by token %.3g\n", name, largest, quantization, batch_difference, step_difference);
    EXPECT(batch_difference <= tolerance && step_difference <= step_tolerance && quantization > 100 * step_tolerance,
           "%s: logits differ from llama.cpp's by %.3g (batch), %.3g (token by token)", name, batch_difference,
           step_difference);
    free(batch_logits), free(step_logits);
    model_free(&model);
    json_decref(expected);
}

// llama.cpp's Q5_K_M: 13 Q5_K and 3 Q6_K tensors (the quantization moves llama.cpp's logits
// 0.88 between its float32 and Q5_K_M files), llama.cpp's logits to 1e-4.
static void test_q5_k_m_llama_cpp(void) {
    const int counts[QUANT_Q2_K + 1] = {[QUANT_Q5_K] = 13, [QUANT_Q6_K] = 3};
    check_llama_cpp_fixture("q5_k_m", counts, 1e-4, 1e-4);
}

// llama.cpp's Q3_K_M of the same weights (tools/make_q3_k_fixture.py): Q3_K for the token table,
// q, k, gate and up, Q4_K for attn_output and ffn_down, Q5_K for attn_v, Q6_K for the output
// (the quantization moves llama.cpp's logits 3.39 from the float32 file's); llama.cpp's logits
// to 1e-4 (measured 5.7e-6, batch and token by token).
static void test_q3_k_m_llama_cpp(void) {
    const int counts[QUANT_Q2_K + 1] = {[QUANT_Q3_K] = 9, [QUANT_Q4_K] = 4, [QUANT_Q5_K] = 2, [QUANT_Q6_K] = 1};
    check_llama_cpp_fixture("q3_k_m", counts, 1e-4, 1e-4);
}

// llama.cpp's Q2_K of the same weights: Q2_K for the token table, q, k, gate and up, Q3_K for
// attn_v, attn_output and ffn_down, Q6_K for the output (the quantization moves llama.cpp's
// logits 5.93); llama.cpp's logits to 1e-4 in one batch (measured 5.2e-6), token by token to
// 0.05 (measured: 1e-6 or less at 11 of the 12 positions, 0.016 at one, where marlhf's own
// batch and step logits differ by that much: an activation's int8 rounding, above).
static void test_q2_k_llama_cpp(void) {
    const int counts[QUANT_Q2_K + 1] = {[QUANT_Q2_K] = 9, [QUANT_Q3_K] = 6, [QUANT_Q6_K] = 1};
    check_llama_cpp_fixture("q2_k", counts, 1e-4, 0.05);
}

// `--quantize q5_k_m` and `convert --outtype q5_k_m` (llama.cpp's Q5_K_M mix): the rule gives
// every matrix of llama.cpp's own Q5_K_M fixture the type llama.cpp gave it (Q6_K for the
// output and layer 1's attn_v and ffn_down, Q5_K elsewhere); a random Llama (3 layers, rows of
// 256 and 384) written as Q5_K_M by marlhf's converter holds Q5_K tensors, Q6_K for the output
// and layer 2's attn_v (use_more_bits: the last eighth), and for the ffn_down rows of 384 the
// fallbacks Q5_1 (layers 0, 1) and Q8_0 (layer 2, Q6_K's), loads under --quantize q5_k_m with the K-quant tensors' own
// bytes and the Q5_1 ones with their own Q5_1 bits (ops/q5.h), and --quantize q5_k_m on the float model
// gives the file's K-quant and Q5_1 bytes; the decode logits stay within 0.04 of the largest of the
// float model of the file's dequantized weights, as q4_k_m's do.
// The type marlhf's rule for `mix` gives each matrix of llama.cpp's own file of that mix
// (tests/fixtures/gguf/NAME.gguf, the random Llama's 16 matrices) is the type llama.cpp wrote.
static void expect_mix_rule_matches_fixture(const char *name, GgufOutType mix) {
    char fixture[256];
    snprintf(fixture, sizeof fixture, "tests/fixtures/gguf/%s.gguf", name);
    Model llama;
    load_gguf(&llama, fixture, "none");
    GgufFile file;
    CHECK(gguf_open(&file, fixture) == 0, "%s", err_msg());
    int matrices = 0;
    for (uint64_t i = 0; i < file.n_tensors; i++) {
        const GgufTensor *t = &file.tensors[i];
        if (t->n_dims != 2) continue;
        const GgmlType rule = gguf_mix_matrix_type(mix, &llama.config, t->name, (int64_t)t->ne[0]);
        EXPECT(rule == (GgmlType)t->type, "%s: the %s rule gives %s, llama.cpp wrote %s", t->name, name,
               gguf_type_name(rule), gguf_type_name(t->type));
        matrices++;
    }
    EXPECT(matrices == 16, "%d matrices in %s", matrices, fixture);
    gguf_close(&file);
    model_free(&llama);
}

static void test_q5_k_m_mix(void) {
    expect_mix_rule_matches_fixture("q5_k_m", GGUF_OUT_Q5_K_M);
    GgufFile file;

    const char *tmp = getenv("MARLHF_TEST_TMP") ? getenv("MARLHF_TEST_TMP") : "/tmp";
    char path[512];
    snprintf(path, sizeof path, "%s/kquant-q5_k_m.gguf", tmp);
    Model original, dequantized, own;
    random_llama(&original, false);
    CHECK(model_write_gguf(&original, NULL, path, GGUF_OUT_Q5_K_M) == 0, "%s", err_msg());
    CHECK(gguf_open(&file, path) == 0, "%s", err_msg());
    int file_counts[GGML_TYPE_Q6_K + 1] = {0};
    for (uint64_t i = 0; i < file.n_tensors; i++)
        if (file.tensors[i].n_dims == 2 && file.tensors[i].type <= GGML_TYPE_Q6_K) file_counts[file.tensors[i].type]++;
    gguf_close(&file);
    const int layers = original.config.num_layers; // 3
    EXPECT(file_counts[GGML_TYPE_Q5_K] == 6 * layers && file_counts[GGML_TYPE_Q6_K] == 2 &&
               file_counts[GGML_TYPE_Q5_1] == 2 && file_counts[GGML_TYPE_Q8_0] == 1,
           "the file: %d Q5_K, %d Q6_K, %d Q5_1, %d Q8_0", file_counts[GGML_TYPE_Q5_K], file_counts[GGML_TYPE_Q6_K],
           file_counts[GGML_TYPE_Q5_1], file_counts[GGML_TYPE_Q8_0]);
    load_gguf(&dequantized, path, NULL);
    load_gguf(&own, path, "q5_k_m");
    EXPECT(!strcmp(model_quantize_name(&own), "q5_k_m"), "name %s", model_quantize_name(&own));
    CHECK(model_quantize(&original, "q5_k_m") == 0, "%s", err_msg());
    int counts[QUANT_Q5_1 + 1] = {0};
    for (int i = 0; i < own.table.count; i++) {
        const ParamEntry *e = &own.table.entries[i];
        const Q8Matrix *from_file = quantized_matrix(&own, e), *from_floats = quantized_matrix(&original, e);
        if (!from_file) continue;
        counts[from_file->type]++;
        EXPECT(from_floats->type == from_file->type, "%s: type %d from the floats, %d from the file", e->name,
               (int)from_floats->type, (int)from_file->type);
        if (quant_is_kquant(from_file->type) && from_floats->type == from_file->type)
            EXPECT(!memcmp(from_floats->blocks, from_file->blocks,
                           (size_t)(from_file->rows * kquant_row_bytes(from_file->type, from_file->cols))),
                   "%s: quantizing the floats gives other bytes than the file's", e->name);
        if (from_file->type == QUANT_Q5_1 && from_floats->type == QUANT_Q5_1) { // the fallback rows' own Q5_1 bits
            const size_t n = (size_t)from_file->rows * (size_t)from_file->cols, blocks = n / Q8_BLOCK;
            EXPECT(!memcmp(from_floats->nibbles, from_file->nibbles, n / 2) &&
                       !memcmp(from_floats->high_bits, from_file->high_bits, blocks * 4) &&
                       !memcmp(from_floats->scales, from_file->scales, blocks * sizeof(float)) &&
                       !memcmp(from_floats->mins, from_file->mins, blocks * sizeof(float)),
                   "%s: quantizing the floats gives other Q5_1 blocks than the file's", e->name);
        }
    }
    EXPECT(counts[QUANT_Q5_K] == 6 * layers && counts[QUANT_Q6_K] == 2 && counts[QUANT_Q5_1] == 2 &&
               counts[QUANT_Q8_0] == 1,
           "held: %d Q5_K, %d Q6_K, %d Q5_1, %d Q8_0", counts[QUANT_Q5_K], counts[QUANT_Q6_K], counts[QUANT_Q5_1],
           counts[QUANT_Q8_0]);
    double largest;
    const double difference = decode_difference(&own, &dequantized, &largest);
    EXPECT(difference > 0 && difference <= 0.04 * largest, "decode logits differ by %.3g (largest %.3g)", difference,
           largest);
    printf("q5_k_m: %d Q5_K, %d Q6_K, %d Q5_1, %d Q8_0 matrices held; decode logits within %.3g of the dequantized "
           "float model (largest %.3g)\n", counts[QUANT_Q5_K], counts[QUANT_Q6_K], counts[QUANT_Q5_1], counts[QUANT_Q8_0],
           difference, largest);
    model_free(&original), model_free(&dequantized), model_free(&own);
    remove(path);
}

// The Q3_K_M and Q2_K mixes marlhf writes (`convert --outtype q3_k_m / q2_k`): the type its
// rule gives each matrix of llama.cpp's own Q3_K_M and Q2_K files of the random Llama
// (tests/fixtures/gguf) is the type llama.cpp wrote, tensor for tensor; and a random Llama of
// three layers written in each mix loads by default with the file's own bits (no matrix
// re-quantized: the held bytes the file's), its decode logits near those of its dequantized
// float load (the held forward rounds the activations to 8 bits).
static void test_q3_k_m_and_q2_k_written(void) {
    static const struct { const char *name; GgufOutType mix; double tolerance; } mixes[2] = {
        {"q3_k_m", GGUF_OUT_Q3_K_M, 0.04}, {"q2_k", GGUF_OUT_Q2_K, 0.04}};
    const char *tmp = getenv("MARLHF_TEST_TMP") ? getenv("MARLHF_TEST_TMP") : "/tmp";
    for (int k = 0; k < 2; k++) {
        expect_mix_rule_matches_fixture(mixes[k].name, mixes[k].mix);
        char path[512];
        GgufFile file;
        snprintf(path, sizeof path, "%s/kquant-written-%s.gguf", tmp, mixes[k].name);
        Model original, dequantized, own;
        random_llama(&original, false);
        CHECK(model_write_gguf(&original, NULL, path, mixes[k].mix) == 0, "%s", err_msg());
        model_free(&original);
        load_gguf(&dequantized, path, "none");
        load_gguf(&own, path, quantize_default(NULL, path));
        CHECK(gguf_open(&file, path) == 0, "%s", err_msg());
        int held = 0, k_quants = 0;
        for (int i = 0; i < own.table.count; i++) {
            const ParamEntry *e = &own.table.entries[i];
            const Q8Matrix *m = quantized_matrix(&own, e);
            if (!m) continue;
            held++;
            const GgufTensor *t = file_tensor(&own, e, &file);
            if (!quant_is_kquant(m->type)) continue;
            k_quants++;
            EXPECT((int)m->type == held_kquant_type(t->type), "%s: %s held as type %d for the file's %s",
                   mixes[k].name, e->name, (int)m->type, gguf_type_name(t->type));
            EXPECT(memcmp(m->blocks, t->data, (size_t)m->rows * (size_t)kquant_row_bytes(m->type, m->cols)) == 0 ||
                       strstr(e->name, "q_proj") || strstr(e->name, "k_proj"), // llama.cpp's row order undone
                   "%s: %s does not hold the file's bytes", mixes[k].name, e->name);
        }
        gguf_close(&file);
        double largest;
        const double difference = decode_difference(&own, &dequantized, &largest);
        printf("%s written: %d matrices held (%d K-quants); decode logits within %.3g of the dequantized float model "
               "(largest %.3g)\n", mixes[k].name, held, k_quants, difference, largest);
        EXPECT(held == 3 * 7 + 2 && k_quants >= 3 * 5 + 2, "%s: %d matrices held, %d K-quants", mixes[k].name, held,
               k_quants);
        EXPECT(difference > 0 && difference <= mixes[k].tolerance * largest, "%s: decode logits differ by %.3g "
               "(largest %.3g)", mixes[k].name, difference, largest);
        model_free(&dequantized), model_free(&own);
        remove(path);
    }
}

// `--quantize q3_k_m / q2_k / iq4_nl / iq4_xs` on a float model (model_quantize): every matrix
// in the type `convert --outtype` of that mix writes for it, holding what loading that file
// holds -- the same type and the same dequantized values, row for row -- so the two decode to
// the same logits bit for bit; the model is named after the mix, and so is the file's default
// --quantize (its general.file_type). The random Llama's rows of 256 and 384 take the mixes'
// raises and fallbacks (IQ4_XS's down projections IQ4_NL, Q3_K's and Q2_K's Q4_0, Q6_K's Q8_0);
// two of the four models tie the token table to the head (then the output's type).
static void test_quantize_to_mix(void) {
    static const struct { const char *name; int types; } mixes[] = {
        {"q3_k_m", 5}, {"q2_k", 4}, {"iq4_nl", 2}, {"iq4_xs", 2}}; // IQ4_XS held as IQ4_NL sub-blocks
    const char *tmp = getenv("MARLHF_TEST_TMP") ? getenv("MARLHF_TEST_TMP") : "/tmp";
    for (size_t k = 0; k < sizeof mixes / sizeof mixes[0]; k++) {
        const char *name = mixes[k].name;
        GgufOutType mix;
        CHECK(gguf_out_type_from_name(name, &mix) == 0, "%s", name);
        char path[512];
        snprintf(path, sizeof path, "%s/kquant-mix-%s.gguf", tmp, name);
        Model floats, from_file;
        random_llama(&floats, k % 2 == 1);
        CHECK(model_write_gguf(&floats, NULL, path, mix) == 0, "%s", err_msg());
        const char *asked = quantize_default(NULL, path);
        EXPECT(!strcmp(asked, name), "the default --quantize of a %s file is %s", name, asked);
        load_gguf(&from_file, path, name);
        CHECK(model_quantize(&floats, name) == 0, "%s", err_msg());
        EXPECT(!strcmp(model_quantize_name(&floats), name) && !strcmp(model_quantize_name(&from_file), name),
               "named %s and %s under --quantize %s", model_quantize_name(&floats), model_quantize_name(&from_file),
               name);
        int matrices = 0, types = 0;
        bool seen[QUANT_IQ4_NL + 1] = {false};
        for (int i = 0; i < from_file.table.count; i++) {
            const ParamEntry *e = &from_file.table.entries[i];
            const Q8Matrix *held = quantized_matrix(&from_file, e), *made = quantized_matrix(&floats, e);
            if (!held) continue;
            matrices++;
            types += !seen[held->type];
            seen[held->type] = true;
            if (!made || made->type != held->type) {
                EXPECT(false, "%s: %s is type %d from the floats, %d from the file", name, e->name,
                       made ? (int)made->type : -1, (int)held->type);
                continue;
            }
            float *a = xmalloc((size_t)e->numel * sizeof(float)), *b = xmalloc((size_t)e->numel * sizeof(float));
            quant_dequantize_rows(made, 0, made->rows, a);
            quant_dequantize_rows(held, 0, held->rows, b);
            EXPECT(!memcmp(a, b, (size_t)e->numel * sizeof(float)), "%s: %s holds other values than the file's",
                   name, e->name);
            free(a), free(b);
        }
        double largest;
        const double difference = decode_difference(&floats, &from_file, &largest);
        printf("--quantize %s: %d matrices of %d types, those of its file; decode logits %.3g apart (largest %.3g)\n",
               name, matrices, types, difference, largest);
        EXPECT(matrices == 7 * 3 + 2 - (int)(k % 2) && types == mixes[k].types, "%s: %d matrices of %d types", name,
               matrices, types);
        EXPECT(difference == 0, "%s: decode logits %.3g apart", name, difference);
        model_free(&floats), model_free(&from_file);
        remove(path);
    }
}

// QLoRA over a q4_k_m, q2_k and iq4_xs base: the log-probs and adapter gradients of LoRA over
// the float32 model holding the base's dequantized values (the forward and the input gradient
// both run on the dequantized tiles, as for the other types; tests/test_quantize.c).
static void test_qlora_over_kquant(void) {
    static const char *const mixes[] = {"q4_k_m", "q2_k", "iq4_xs"};
    const char *tmp = getenv("MARLHF_TEST_TMP") ? getenv("MARLHF_TEST_TMP") : "/tmp";
    for (int k = 0; k < 3; k++) {
        char path[512];
        snprintf(path, sizeof path, "%s/kquant-qlora-%s.gguf", tmp, mixes[k]);
        GgufOutType mix;
        CHECK(gguf_out_type_from_name(mixes[k], &mix) == 0, "%s", mixes[k]);
        Model original;
        random_llama(&original, true);
        CHECK(model_write_gguf(&original, NULL, path, mix) == 0, "%s", err_msg());
        model_free(&original);
        Model quantized, twin;
        load_gguf(&quantized, path, mixes[k]);
        load_gguf(&twin, path, NULL);
        model_dequantize_into(&quantized, twin.params);
        LoraConfig lora = {.rank = 4, .alpha = 8.0f, .targets = (1u << LORA_TARGETS) - 1};
        Model *models[2] = {&quantized, &twin};
        enum { B = 2, T = 21 };
        const int row_len[B] = {T, T - 6};
        float logp[2][B * T];
        float *grads[2];
        for (int m = 0; m < 2; m++) {
            CHECK(model_add_lora(models[m], &lora, false, 5) == 0, "%s", err_msg());
            for (int i = models[m]->lora_first_entry; i < models[m]->table.count; i++) { // B != 0: the adapters act
                const ParamEntry *e = &models[m]->table.entries[i];
                if (strstr(e->name, "lora_B"))
                    for (long j = 0; j < e->numel; j++)
                        models[m]->params[e->offset + j] = 0.05f * uniform(77, (uint64_t)j);
            }
            model_enable_grad(models[m]);
            grads[m] = xmalloc((size_t)model_trainable_floats(models[m]) * sizeof(float));
            qlora_step(models[m], B, T, row_len, logp[m], grads[m]);
        }
        const long G = model_trainable_floats(&quantized);
        double grad_scale = 0;
        for (long i = 0; i < G; i++) grad_scale = fmax(grad_scale, fabs(grads[1][i]));
        const double logp_error = test_max_abs_diff(logp[0], logp[1], B * T),
                     grad_error = test_max_abs_diff(grads[0], grads[1], G);
        EXPECT(grad_scale > 0 && logp_error <= 2e-5 && grad_error <= 1e-4 * grad_scale,
               "%s: log-probs %.3g, adapter gradients %.3g (largest %.3g) from LoRA on the dequantized float32 base",
               mixes[k], logp_error, grad_error, grad_scale);
        EXPECT(quantized.lora_base_fingerprint == twin.lora_base_fingerprint, "%s: base fingerprints differ", mixes[k]);
        printf("QLoRA %s: log-probs within %.3g, adapter gradients within %.3g (largest %.3g) of the float twin's\n",
               mixes[k], logp_error, grad_error, grad_scale);
        for (int m = 0; m < 2; m++) free(grads[m]), model_free(models[m]);
        remove(path);
    }
}

// The inference commands' default (quantize_default): a GGUF holding K-quant tensors runs with
// its own bits when --quantize is left out, on either device (a Q4_0 file with a Q6_K output
// included: Q4_0 and Q6_K kept); a float or Q8_0 file, a folder or an explicit --quantize keep
// what they had.
static void test_default_rule(void) {
    const char *tmp = getenv("MARLHF_TEST_TMP") ? getenv("MARLHF_TEST_TMP") : "/tmp";
    char kquant[512], q8[512];
    snprintf(kquant, sizeof kquant, "%s/kquant-default.gguf", tmp);
    snprintf(q8, sizeof q8, "%s/kquant-default-q8.gguf", tmp);
    Model model;
    random_llama(&model, false);
    CHECK(model_write_gguf(&model, NULL, kquant, GGUF_OUT_Q4_K_M) == 0 && model_write_gguf(&model, NULL, q8, GGUF_OUT_Q8_0) == 0,
          "%s", err_msg());
    model_free(&model);
    EXPECT(!strcmp(quantize_default(NULL, kquant), "q4_k_m"), "a Q4_K_M file: %s", quantize_default(NULL, kquant));
    EXPECT(!strcmp(quantize_default(NULL, q8), "none"), "a Q8_0 file: %s", quantize_default(NULL, q8));
    EXPECT(!strcmp(quantize_default(NULL, "tests/fixtures/models/llama"), "none"), "a folder");
    EXPECT(!strcmp(quantize_default("none", kquant), "none") && !strcmp(quantize_default("q8_0", kquant), "q8_0"),
           "an explicit --quantize");
    // A Q4_0 file (marlhf's, as llama.cpp's, stores its output as Q6_K) runs with its own bits too:
    // Q4_0 layers that dequantize to the file's values bit for bit, and the Q6_K head's bytes.
    Model q4, own;
    random_llama(&q4, false);
    CHECK(model_write_gguf(&q4, NULL, q8, GGUF_OUT_Q4_0) == 0, "%s", err_msg());
    model_free(&q4);
    EXPECT(!strcmp(quantize_default(NULL, q8), "q4_k_m"), "a Q4_0 file with a Q6_K output");
    load_gguf(&q4, q8, NULL);
    load_gguf(&own, q8, "q4_k_m");
    int q4_0 = 0, q6_k = 0;
    for (int i = 0; i < own.table.count; i++) {
        const ParamEntry *e = &own.table.entries[i];
        const Q8Matrix *m = quantized_matrix(&own, e);
        if (!m) continue;
        q4_0 += m->type == QUANT_Q4_0, q6_k += m->type == QUANT_Q6_K;
        float *values = xmalloc((size_t)e->numel * sizeof(float));
        quant_dequantize_rows(m, 0, m->rows, values);
        EXPECT(memcmp(values, q4.params + e->offset, (size_t)e->numel * sizeof(float)) == 0, "%s: not the Q4_0 file's values",
               e->name);
        free(values);
    }
    EXPECT(q6_k == 1 && q4_0 == 7 * own.config.num_layers + 1, "a Q4_0 file held as %d Q4_0 and %d Q6_K matrices", q4_0, q6_k);
    model_free(&q4), model_free(&own);
    // The tiny fixtures' rows (64 values) take no K-quant: their Q4_K_M file stays float by default.
    Model tiny;
    ModelLoadOptions options = {.with_lm_head = true};
    CHECK(model_load(&tiny, "tests/fixtures/models/llama", &ops_cpu, &options) == 0, "%s", err_msg());
    CHECK(model_write_gguf(&tiny, NULL, q8, GGUF_OUT_Q4_K_M) == 0, "%s", err_msg());
    EXPECT(!strcmp(quantize_default(NULL, q8), "none"), "a Q4_K_M file without K-quant tensors");
    model_free(&tiny);
    remove(kquant), remove(q8);
}

// SmolLM2 in the Q4_K_M mix (its float weights -- the Q4_1 file dequantized -- quantized by
// --quantize q4_k_m, the blocks marlhf convert --outtype q4_k_m writes and the default then
// holds), token by token against transformers' float32.
static void test_smollm2_q4_k_m_decode(void) {
    json_t *reference = smollm2_reference();
    Model model;
    if (smollm2_load(&model, NULL) != 0) {
        json_decref(reference);
        return;
    }
    CHECK(model_quantize(&model, "q4_k_m") == 0, "%s", err_msg());
    int counts[QUANT_Q5_0 + 1] = {0};
    for (int i = 0; i < model.table.count; i++) {
        const Q8Matrix *m = quantized_matrix(&model, &model.table.entries[i]);
        if (m) counts[m->type]++;
    }
    // The Q4_K_M file's types (docs/quantization.md): rows of 576 are Q5_0 / Q8_0, ffn_down K-quants.
    EXPECT(counts[QUANT_Q4_K] == 16 && counts[QUANT_Q6_K] == 14 && counts[QUANT_Q5_0] == 166 && counts[QUANT_Q8_0] == 15,
           "%d Q4_K, %d Q6_K, %d Q5_0, %d Q8_0 matrices", counts[QUANT_Q4_K], counts[QUANT_Q6_K], counts[QUANT_Q5_0],
           counts[QUANT_Q8_0]);
    double agreement, mean, worst;
    smollm2_decode_agreement(&model, reference, &agreement, &mean, &worst);
    printf("smollm2 Q4_K_M decode vs transformers float32: top-1 agreement %.4f, |log-prob difference| mean %.3g, "
           "max %.3g\n", agreement, mean, worst);
    // Measured: 0.9065, mean 0.32, max 2.04 (one position is 0.009 of agreement; Q8_0: 0.925,
    // 0.082; Q4_0: 0.654, 0.653 -- tests/test_quantize.c).
    if (smollm2_figures_checked("test_smollm2_q4_k_m_decode"))
        EXPECT(agreement >= 0.88 && mean <= 0.4, "top-1 agreement %.4f, mean |log-prob difference| %.3g", agreement,
               mean);
    model_free(&model);
    json_decref(reference);
}

int main(void) {
    RUN(test_row_dot_paths);
    RUN(test_q5_0_paths);
    RUN(test_q5_0_matmul);
    RUN(test_batched_row_dots);
    RUN(test_q5_0_batched_paths);
    RUN(test_batched_matmul);
    RUN(test_matmul);
    RUN(test_q5_k_layout);
    RUN(test_q4_k_m_model);
    RUN(test_q5_k_m_llama_cpp);
    RUN(test_q3_k_m_llama_cpp);
    RUN(test_q2_k_llama_cpp);
    RUN(test_q5_k_m_mix);
    RUN(test_q3_k_m_and_q2_k_written);
    RUN(test_quantize_to_mix);
    RUN(test_qlora_over_kquant);
    RUN(test_default_rule);
    RUN(test_smollm2_q4_k_m_decode);
    TEST_EXIT();
}
