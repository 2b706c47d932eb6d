// Quantized weights, Q8_0, Q4_0 and NF4, for inference and under LoRA training (model/quantize.h,
// ops/q4.c, ops/nf4.c, ops/cpu/matmul_q8.c, ops/cpu/matmul_nf4.c).
//
//  - NF4 against bitsandbytes 0.50.2 (tests/fixtures/quant/nf4.json, tools/make_nf4_fixture.py):
//    the 16 levels, the 256-value dynamic map, the 4-bit codes and absmax values, and, given
//    bitsandbytes' offset, the 8-bit scale codes, second-level absmax values, scales and every
//    dequantized value, bit for bit; marlhf's own offset within 1 ulp of torch's float32 mean;
//    a whole matrix (single and double-quantized scales) dequantizes as the flat functions do.
//    On SmolLM2, NF4 decoding against transformers' float32 (agreement >= 0.65, mean <= 1.2).
//  - Q4_0 blocks: marlhf's quantizer writes the bytes gguf-py's gguf.quants.Q4_0 writes for the
//    same floats (tests/fixtures/quant/q4_0.json, tools/make_quant_fixtures.py), its
//    dequantization gives gguf-py's floats bit for bit, and a dequantized block quantizes
//    back to its own bytes (also every block the GGUF writer makes of the tiny Llama's
//    weights), so a Q4_0 GGUF runs with its own bits.
//  - bf16 (--quantize bf16): rounding to nearest even as torch's .to(torch.bfloat16) rounds
//    (tests/fixtures/quant/bf16.json, tools/make_bf16_fixture.py), every bf16 value fixed; the
//    decode kernel (ops/cpu/matmul_bf16.c) within 1e-6 of the exact sum, each vector path the
//    portable loop's bits, each output its input row's alone; a bf16 model the float32 model of
//    the same values to 1e-5 of the largest logit (decode and prefill, four architectures), 2
//    bytes a weight; SmolLM2 against transformers' float32 (agreement >= 0.98, mean <= 0.02).
//  - QLoRA: LoRA over a Q8_0, Q4_0, Q4_1, Q5_1, NF4 (with and without double quantization) or bf16 base computes the log-probs and adapter gradients of
//    LoRA over a float32 base holding the dequantized values (same fingerprint too; gradient
//    checkpointing gives the same bits); its saved
//    merged model computes what it does; its adapter reloads onto the quantized base and is
//    refused on the float32 one.
//
//  - A dequantized Q8_0 block (what a GGUF Q8_0 tensor loads as) quantizes back to the
//    same 32 values and the same scale, so a Q8_0 model file is decoded with its own bits.
//  - The kernel computes exactly sum over blocks of (integer dot) * scale_x * scale_w:
//    checked against that sum in double over shapes with an odd last block, row counts
//    around the kernel's 4-row chunks, and with and without a bias (relative 1e-5); from
//    Q8_SGEMM_MIN_ROWS rows on, the float inputs times the dequantized weights.
//  - Against the float32 matmul, every output is within the bound the rounding allows:
//    sum_i |x_i| dw/2 + |w_i| dx/2 + dx dw/4 (dx, dw: the blocks' scales).
//  - A quantized model: decode steps and prefills use the Q8_0 weights and stay close to
//    the float32 model's logits (four architectures); quantizing while loading gives the
//    same model as quantizing after, and gives the float32 copies back, the token table's
//    included (their pages read as zeros); a model with gradients and unknown names are
//    refused.
//  - SmolLM2's Q8_0 embedding table (its tied LM head) quantizes to the file's own blocks.
//  - SmolLM2-135M-Instruct decoded token by token with Q8_0 weights against transformers'
//    float32 log-probs (tests/fixtures/smollm2/reference.json): top-1 agreement >= 0.92,
//    mean |log-prob difference| <= 0.1 (llama.cpp's Q8_0: 0.963 and 0.087 on the same
//    positions; docs/quantization.md).
#include <jansson.h>
#include <math.h>
#include <string.h>
#include <unistd.h>

#include "core/check.h"
#include "core/rng.h"
#include "io/gguf.h"
#include "io/gguf_dequant.h"
#include "model/lora.h"
#include "model/quantize.h"
#include "io/gguf_quantize.h"
#include "io/gguf_write.h"
#include "io/fs.h"
#include "model/weights_io.h"
#include "core/bf16.h"
#include "ops/cpu/matmul_bf16.h"
#include "ops/nf4.h"
#include "ops/q4.h"
#include "ops/q8.h"
#include "qlora_step.h"
#include "test.h"
#include "quantized_decode.h"

// Uniform in [0, 1) from a seed and a running counter.
typedef struct {
    uint64_t seed, counter;
} Draws;

static float draw(Draws *d) { return rng_uniform(d->seed, 0, d->counter++); }

static void fill_uniform(Draws *d, float *x, long n, float range) {
    for (long i = 0; i < n; i++) x[i] = range * (2.0f * draw(d) - 1.0f);
}

static void test_q8_block_roundtrip(void) {
    Draws rng = {.seed = 11};
    int mismatches = 0;
    for (int trial = 0; trial < 200; trial++) {
        int8_t values[Q8_BLOCK], again[Q8_BLOCK];
        for (int i = 0; i < Q8_BLOCK; i++) values[i] = (int8_t)((int)(draw(&rng) * 255.0f) - 127);
        values[trial % Q8_BLOCK] = trial % 2 ? 127 : -127; // llama.cpp's quantizer puts the largest at +-127
        // A scale as GGUF stores it: an IEEE half.
        float scale = gguf_f16_to_f32((uint16_t)(0x1000 + (trial * 977) % 0x3000));
        float block[Q8_BLOCK], scale_again;
        for (int i = 0; i < Q8_BLOCK; i++) block[i] = values[i] * scale;
        q8_quantize_row(block, Q8_BLOCK, again, &scale_again);
        mismatches += scale_again != scale || memcmp(values, again, Q8_BLOCK) != 0;
    }
    EXPECT(mismatches == 0, "%d of 200 dequantized blocks quantize to other values", mismatches);
    float zeros[Q8_BLOCK] = {0}, scale = -1;
    int8_t values[Q8_BLOCK];
    q8_quantize_row(zeros, Q8_BLOCK, values, &scale);
    int nonzero = 0;
    for (int i = 0; i < Q8_BLOCK; i++) nonzero += values[i] != 0;
    EXPECT(scale == 0.0f && nonzero == 0, "an all-zero block: scale %g, %d nonzero values", scale, nonzero);
}

typedef struct {
    int N, IC, OC;
    bool bias;
} Shape;

static const Shape shapes[] = {{1, 32, 7, false},  {3, 96, 37, true},   {4, 64, 5, false},
                               {5, 576, 19, true},  {9, 160, 33, false}, {2, 1536, 11, true},
                               {Q8_SGEMM_MIN_ROWS, 96, 300, true}, {Q8_SGEMM_MIN_ROWS + 3, 64, 9, false}};

// out = quantized inp . weight^T (+ bias) through the CPU kernel; also returns the input's
// quantization and the weight's.
static void run_kernel(const Shape *s, const float *inp, const float *weight, const float *bias, float *out,
                       Q8Matrix *matrix) {
    matrix->rows = s->OC;
    matrix->cols = s->IC;
    matrix->values = xmalloc((size_t)s->OC * s->IC);
    matrix->scales = xmalloc((size_t)s->OC * (s->IC / Q8_BLOCK) * sizeof(float));
    matrix->type = QUANT_Q8_0;
    for (int o = 0; o < s->OC; o++)
        q8_quantize_row(weight + (long)o * s->IC, s->IC, matrix->values + (long)o * s->IC,
                        matrix->scales + (long)o * (s->IC / Q8_BLOCK));
    ops_cpu.matmul_forward_q8(out, inp, matrix, bias, s->N, s->IC, s->OC, s->N);
}

static void test_q8_matmul_arithmetic(void) {
    Draws rng = {.seed = 12};
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
        const Shape *s = &shapes[k];
        const int blocks = s->IC / Q8_BLOCK;
        float *inp = xmalloc((size_t)s->N * s->IC * sizeof(float)), *weight = xmalloc((size_t)s->OC * s->IC * sizeof(float));
        float *bias = xmalloc((size_t)s->OC * sizeof(float)), *out = xmalloc((size_t)s->N * s->OC * sizeof(float));
        fill_uniform(&rng, inp, (long)s->N * s->IC, 3.0f);
        fill_uniform(&rng, weight, (long)s->OC * s->IC, 0.2f);
        fill_uniform(&rng, bias, s->OC, 1.0f);
        inp[0] = 40.0f; // one large value: its block's scale is far from the others'
        Q8Matrix matrix;
        run_kernel(s, inp, weight, s->bias ? bias : NULL, out, &matrix);
        int8_t *x_values = xmalloc(s->IC);
        float *x_scales = xmalloc((size_t)blocks * sizeof(float));
        double worst_exact = 0, worst_bound = 0;
        for (int i = 0; i < s->N; i++) {
            const float *x = inp + (long)i * s->IC;
            q8_quantize_row(x, s->IC, x_values, x_scales);
            for (int o = 0; o < s->OC; o++) {
                const float *w = weight + (long)o * s->IC;
                const int8_t *w_values = matrix.values + (long)o * s->IC;
                const float *w_scales = matrix.scales + (long)o * blocks;
                double exact = s->bias ? bias[o] : 0.0, magnitude = fabs(exact), f32 = exact, bound = 0;
                double sgemm_exact = exact;
                for (int b = 0; b < blocks; b++) {
                    long dot = 0;
                    for (int c = b * Q8_BLOCK; c < (b + 1) * Q8_BLOCK; c++) {
                        dot += (long)x_values[c] * w_values[c];
                        if (s->N >= Q8_SGEMM_MIN_ROWS) { // float inputs times dequantized weights
                            sgemm_exact += (double)x[c] * w_values[c] * w_scales[b];
                            magnitude += fabs((double)x[c] * w_values[c] * w_scales[b]);
                        } else {
                            magnitude += fabs((double)x_values[c] * w_values[c] * x_scales[b] * w_scales[b]);
                        }
                        f32 += (double)x[c] * w[c];
                        bound += fabs(x[c]) * w_scales[b] / 2 + fabs(w[c]) * x_scales[b] / 2 +
                                 (double)x_scales[b] * w_scales[b] / 4;
                    }
                    exact += (double)dot * x_scales[b] * w_scales[b];
                }
                if (s->N >= Q8_SGEMM_MIN_ROWS) exact = sgemm_exact;
                double got = out[(long)i * s->OC + o];
                double exact_ratio = fabs(got - exact) / (1e-5 * magnitude + 1e-30);
                double bound_ratio = fabs(got - f32) / (bound * (1 + 1e-4) + 1e-6);
                if (exact_ratio > worst_exact) worst_exact = exact_ratio;
                if (bound_ratio > worst_bound) worst_bound = bound_ratio;
            }
        }
        EXPECT(worst_exact <= 1.0, "N %d IC %d OC %d: %.3g x the tolerance from the exact block sums", s->N, s->IC,
               s->OC, worst_exact);
        EXPECT(worst_bound <= 1.0, "N %d IC %d OC %d: %.3g x the rounding bound from the float32 product", s->N,
               s->IC, s->OC, worst_bound);
        free(inp), free(weight), free(bias), free(out), free(x_values), free(x_scales);
        free(matrix.values), free(matrix.scales);
    }
}

static void load(Model *model, const char *path) {
    ModelLoadOptions options = {.with_lm_head = true};
    CHECK(model_load(model, path, &ops_cpu, &options) == 0, "%s", err_msg());
}

static void test_quantized_model(void) {
    const char *paths[] = {"tests/fixtures/models/llama", "tests/fixtures/models/gpt2", "tests/fixtures/models/gemma",
                           "tests/fixtures/models/qwen2"};
    for (int m = 0; m < 4; m++) {
        Model plain, quantized;
        load(&plain, paths[m]);
        load(&quantized, paths[m]);
        EXPECT(model_quantize(&quantized, "q8_0") == 0, "%s: %s", paths[m], err_msg());
        const int V = plain.config.vocab_size, steps = 6;
        float *expected = xmalloc((size_t)steps * 2 * V * sizeof(float)), *got = xmalloc((size_t)steps * 2 * V * sizeof(float));
        decode_logits(&plain, expected, steps);
        decode_logits(&quantized, got, steps);
        double largest = 0;
        for (long i = 0; i < (long)steps * 2 * V; i++) largest = fmax(largest, fabs(expected[i]));
        double difference = test_max_abs_diff(got, expected, (long)steps * 2 * V);
        // Measured 1.7-3.0% of the largest logit on these random weights; real weights are
        // checked on SmolLM2 below.
        EXPECT(difference > 0 && difference <= 0.04 * largest, "%s: logits differ by %.3g (largest %.3g)", paths[m],
               difference, largest);
        printf("%s: Q8_0 decode logits within %.3g of float32 (largest %.3g)\n", paths[m], difference, largest);

        // A prefill-sized batch runs in Q8_0 too, as close to the float32 model.
        const int B = 3, T = 12;
        int *tokens = xmalloc((size_t)B * T * sizeof(int));
        for (int i = 0; i < B * T; i++) tokens[i] = (5 * i + 1) % V;
        ModelBatch batch = {.B = B, .T = T, .tokens = tokens};
        float *a = xmalloc((size_t)V * sizeof(float)), *b = xmalloc((size_t)V * sizeof(float));
        model_forward(&plain, &batch);
        model_logits_row(&plain, B * T - 1, a);
        model_forward(&quantized, &batch);
        model_logits_row(&quantized, B * T - 1, b);
        double prefill_difference = test_max_abs_diff(b, a, V);
        EXPECT(prefill_difference > 0 && prefill_difference <= 0.04 * largest, "%s: prefill logits differ by %.3g",
               paths[m], prefill_difference);

        // Quantizing as the file is read gives the same model as quantizing after loading.
        Model while_loading;
        ModelLoadOptions options = {.with_lm_head = true, .quantize = "q8_0"};
        CHECK(model_load(&while_loading, paths[m], &ops_cpu, &options) == 0, "%s", err_msg());
        model_forward(&while_loading, &batch);
        model_logits_row(&while_loading, B * T - 1, a);
        EXPECT(memcmp(a, b, (size_t)V * sizeof(float)) == 0, "%s: quantized while loading is another model", paths[m]);
        // The float32 copies are given back: the whole pages inside a layer's MLP weight
        // now read as zeros (its quantized copy still has the values).
        const LayerTensors *w = &while_loading.weights.layers[0];
        const long numel = (long)while_loading.config.intermediate_size * while_loading.config.hidden_size;
        const long page_floats = sysconf(_SC_PAGESIZE) / (long)sizeof(float), checked = numel - 2 * page_floats;
        long nonzero = 0;
        for (long i = page_floats; i < numel - page_floats; i++) nonzero += w->up_w[i] != 0.0f;
        // The token table too: the lookup reads its 8-bit rows.
        const long table = (long)while_loading.config.vocab_size * while_loading.config.hidden_size;
        for (long i = page_floats; i < table - page_floats; i++) nonzero += while_loading.weights.tok_emb[i] != 0.0f;
        EXPECT(checked > 0, "%s: up_proj is too small to hold a whole page", paths[m]);
        EXPECT(nonzero == 0, "%s: %ld float32 weights of up_proj and the token table still there", paths[m], nonzero);
        model_free(&while_loading);
        free(tokens), free(a), free(b), free(expected), free(got);
        model_free(&plain);
        model_free(&quantized);
    }
}

// A LoRA adapter added before quantizing keeps its float32 term on top of the 8-bit layers.
static void test_quantized_model_with_lora(void) {
    Model base, adapted;
    load(&base, "tests/fixtures/models/llama");
    load(&adapted, "tests/fixtures/models/llama");
    LoraConfig lora = {.rank = 4, .alpha = 8.0f, .targets = (1u << LORA_TARGETS) - 1};
    CHECK(model_add_lora(&adapted, &lora, false, 5) == 0, "%s", err_msg());
    Draws rng = {.seed = 13};
    for (int l = 0; l < adapted.config.num_layers; l++)
        for (int t = 0; t < LORA_TARGETS; t++) {
            const ParamEntry *e = NULL;
            for (int i = 0; i < adapted.table.count; i++)
                if (adapted.table.entries[i].layer == l &&
                    adapted.table.entries[i].view_field == offsetof(LayerTensors, lora_b) + (size_t)t * sizeof(float *))
                    e = &adapted.table.entries[i];
            CHECK(e, "no lora_B entry for layer %d target %d", l, t);
            fill_uniform(&rng, adapted.params + e->offset, e->numel, 0.1f);
        }
    const int V = base.config.vocab_size, steps = 4;
    const long n = (long)steps * 2 * V;
    float *base_logits = xmalloc(n * sizeof(float)), *expected = xmalloc(n * sizeof(float)), *got = xmalloc(n * sizeof(float));
    decode_logits(&base, base_logits, steps);
    decode_logits(&adapted, expected, steps);
    CHECK(model_quantize(&adapted, "q8_0") == 0, "%s", err_msg());
    decode_logits(&adapted, got, steps);
    double adapter_effect = test_max_abs_diff(expected, base_logits, n), error = test_max_abs_diff(got, expected, n);
    printf("LoRA on Q8_0: logits within %.3g of the float32 adapted model; the adapter moves them %.3g\n", error,
           adapter_effect);
    EXPECT(error < adapter_effect / 5, "quantized adapted logits %.3g from float32, the adapter's effect %.3g", error,
           adapter_effect);
    free(base_logits), free(expected), free(got);
    model_free(&base);
    model_free(&adapted);
}

// ---- bf16 (--quantize bf16, core/bf16.h) ----

// The float of 32 bits.
static float bits_float(uint32_t u) {
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

// Rounding to bf16 against torch's .to(torch.bfloat16) (tests/fixtures/quant/bf16.json,
// tools/make_bf16_fixture.py): halfway cases both ways, the largest finite values, subnormals,
// infinities and NaN; and every bf16 value rounds back to itself.
static void test_bf16_rounding(void) {
    json_error_t error;
    json_t *root = json_load_file("tests/fixtures/quant/bf16.json", 0, &error);
    CHECK(root, "tests/fixtures/quant/bf16.json: %s", error.text);
    json_t *cases = json_object_get(root, "cases");
    CHECK(json_array_size(cases) > 50, "tests/fixtures/quant/bf16.json: no cases");
    int mismatches = 0, nan_cases = 0;
    for (size_t i = 0; i < json_array_size(cases); i++) {
        json_t *c = json_array_get(cases, i);
        const uint32_t input = (uint32_t)json_integer_value(json_object_get(c, "float_bits"));
        const uint16_t expected = (uint16_t)json_integer_value(json_object_get(c, "bf16_bits"));
        const uint16_t got = bf16_round(bits_float(input));
        // A NaN need only stay a NaN (torch 2.15 gives 0xffff for any: its sign and payload are its own).
        const bool nan = (input & 0x7fffffffu) > 0x7f800000u;
        nan_cases += nan;
        const bool same = nan ? (got & 0x7fffu) > 0x7f80u && (expected & 0x7fffu) > 0x7f80u : got == expected;
        if (!same && mismatches++ < 5)
            printf("  %08x: got %04x, torch %04x\n", (unsigned)input, (unsigned)got, (unsigned)expected);
    }
    EXPECT(mismatches == 0, "%d of %zu floats round to other bf16 bits than torch's", mismatches,
           json_array_size(cases));
    EXPECT(nan_cases > 0, "the fixture holds no NaN");
    json_decref(root);
    int not_fixed = 0;
    for (uint32_t b = 0; b < 0x10000u; b++)
        if ((b & 0x7fffu) <= 0x7f80u) not_fixed += bf16_round(bf16_value((uint16_t)b)) != b;
    EXPECT(not_fixed == 0, "%d bf16 values do not round back to themselves", not_fixed);
}

// A random matrix rounded to bf16 (inputs and bias float).
static Q8Matrix random_bf16_matrix(Draws *rng, int rows, int cols) {
    float *weight = xmalloc((size_t)rows * cols * sizeof(float));
    fill_uniform(rng, weight, (long)rows * cols, 0.2f);
    Q8Matrix m = {.rows = rows, .cols = cols, .type = QUANT_BF16};
    m.bf16 = xmalloc((size_t)rows * cols * sizeof(uint16_t));
    bf16_round_row(weight, (long)rows * cols, m.bf16);
    free(weight);
    return m;
}

// The decode kernel (ops/cpu/matmul_bf16.c): each vector path compiled gives the portable
// loop's bits; the portable loop is the exact sum of the bf16 weights times the float inputs to
// float rounding (1e-6 of sum |x w|); an output has the bits of a call of its input row alone
// (4-row chunks, rows around them); from Q8_SGEMM_MIN_ROWS rows the product goes through the
// dequantized tiles, as close to the exact sum.
static void test_bf16_matmul(void) {
    Draws rng = {.seed = 31};
    const Bf16RowDot paths[] = {bf16_row_dot_avx2, bf16_row_dot_avx512};
    const char *names[] = {"avx2", "avx512"};
    int paths_compared = 0;
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
        const Shape *s = &shapes[k];
        Q8Matrix m = random_bf16_matrix(&rng, s->OC, s->IC);
        float *inp = xmalloc((size_t)s->N * s->IC * sizeof(float)), *bias = xmalloc((size_t)s->OC * sizeof(float));
        float *out = xmalloc((size_t)s->N * s->OC * sizeof(float)), *alone = xmalloc((size_t)s->OC * sizeof(float));
        fill_uniform(&rng, inp, (long)s->N * s->IC, 3.0f);
        fill_uniform(&rng, bias, s->OC, 1.0f);
        inp[0] = 40.0f;
        ops_cpu.matmul_forward_q8(out, inp, &m, s->bias ? bias : NULL, s->N, s->IC, s->OC, s->N);
        double worst = 0;
        long invariance_misses = 0;
        for (int i = 0; i < s->N; i++) {
            const float *x = inp + (long)i * s->IC;
            for (int o = 0; o < s->OC; o++) {
                double exact = s->bias ? bias[o] : 0.0, magnitude = fabs(exact);
                for (int c = 0; c < s->IC; c++) {
                    const double term = (double)x[c] * bf16_value(m.bf16[(long)o * s->IC + c]);
                    exact += term;
                    magnitude += fabs(term);
                }
                worst = fmax(worst, fabs(out[(long)i * s->OC + o] - exact) / (1e-6 * magnitude + 1e-30));
            }
            if (s->N < Q8_SGEMM_MIN_ROWS) { // the same row alone
                ops_cpu.matmul_forward_q8(alone, x, &m, s->bias ? bias : NULL, 1, s->IC, s->OC, 1);
                invariance_misses += memcmp(alone, out + (long)i * s->OC, (size_t)s->OC * sizeof(float)) != 0;
            }
        }
        EXPECT(worst <= 1.0, "N %d IC %d OC %d: %.3g x the tolerance from the exact sums", s->N, s->IC, s->OC, worst);
        EXPECT(invariance_misses == 0, "N %d IC %d OC %d: %ld rows differ from the same row alone", s->N, s->IC,
               s->OC, invariance_misses);
        // Every path against the portable loop, one weight row at a time, 1 to BF16_INPUTS inputs.
        for (int p = 0; p < 2; p++) {
            if (!paths[p]) continue;
            for (int inputs = 1; inputs <= BF16_INPUTS && inputs <= s->N; inputs++) {
                float portable[BF16_INPUTS], got[BF16_INPUTS];
                long differing = 0;
                for (int o = 0; o < s->OC; o++) {
                    bf16_row_dot_portable(m.bf16 + (long)o * s->IC, inp, inputs, s->IC, portable, 1);
                    paths[p](m.bf16 + (long)o * s->IC, inp, inputs, s->IC, got, 1);
                    differing += memcmp(portable, got, (size_t)inputs * sizeof(float)) != 0;
                }
                EXPECT(differing == 0, "%s, IC %d, %d inputs: %ld weight rows differ from the portable loop", names[p],
                       s->IC, inputs, differing);
                paths_compared++;
            }
        }
        free(inp), free(bias), free(out), free(alone), free(m.bf16);
    }
    printf("bf16 decode kernel: %s path; %d (path, shape, inputs) cases against the portable loop\n",
           bf16_best_path_name, paths_compared);
}

// A bf16 model computes what the float32 model holding the same bf16 values computes, up to
// summation order, for decode steps (ops/cpu/matmul_bf16.c) and prefills (dequantized tiles
// and sgemm) on four architectures; the rounding to bf16 itself moves the logits far more. Its
// linear weights, token table and LM head take 2 bytes each, and their float32 pages are given
// back; loading with .quantize = "bf16" gives the same model.
static void test_bf16_model(void) {
    const char *paths[] = {"tests/fixtures/models/llama", "tests/fixtures/models/gpt2", "tests/fixtures/models/gemma",
                           "tests/fixtures/models/qwen2"};
    for (int m = 0; m < 4; m++) {
        Model original, rounded, bf16;
        load(&original, paths[m]);
        load(&rounded, paths[m]);
        ModelLoadOptions options = {.with_lm_head = true, .quantize = "bf16"};
        CHECK(model_load(&bf16, paths[m], &ops_cpu, &options) == 0, "%s", err_msg());
        EXPECT(strcmp(model_quantize_name(&bf16), "bf16") == 0, "%s: loaded as %s", paths[m], model_quantize_name(&bf16));
        model_dequantize_into(&bf16, rounded.params); // the float32 model of the bf16 values
        long weights = 0, bytes = 0;
        for (int i = 0; i < model_base_entries(&bf16); i++) {
            const Q8Matrix *q = quantized_matrix(&bf16, &bf16.table.entries[i]);
            if (!q) continue;
            EXPECT(q->type == QUANT_BF16, "%s: %s is of type %d", paths[m], bf16.table.entries[i].name, (int)q->type);
            weights += (long)q->rows * q->cols;
            bytes += quant_matrix_bytes(q);
        }
        EXPECT(weights > 0 && bytes == 2 * weights, "%s: %ld bytes for %ld weights", paths[m], bytes, weights);
        EXPECT(bf16.quantized->embedding.type == QUANT_BF16 && bf16.quantized->lm_head.type == QUANT_BF16,
               "%s: the token table or the head is not bf16", paths[m]);

        const int V = original.config.vocab_size, steps = 6;
        const long n = (long)steps * 2 * V;
        float *expected = xmalloc(n * sizeof(float)), *got = xmalloc(n * sizeof(float)), *unrounded = xmalloc(n * sizeof(float));
        decode_logits(&rounded, expected, steps);
        decode_logits(&bf16, got, steps);
        decode_logits(&original, unrounded, steps);
        double largest = 0;
        for (long i = 0; i < n; i++) largest = fmax(largest, fabs(expected[i]));
        const double decode_error = test_max_abs_diff(got, expected, n), rounding = test_max_abs_diff(expected, unrounded, n);

        const int B = 3, T = 12; // a prefill-sized batch: the tiles' sgemm
        int *tokens = xmalloc((size_t)B * T * sizeof(int));
        for (int i = 0; i < B * T; i++) tokens[i] = (5 * i + 1) % V;
        ModelBatch batch = {.B = B, .T = T, .tokens = tokens};
        float *a = xmalloc((size_t)V * sizeof(float)), *b = xmalloc((size_t)V * sizeof(float));
        model_forward(&rounded, &batch);
        model_logits_row(&rounded, B * T - 1, a);
        model_forward(&bf16, &batch);
        model_logits_row(&bf16, B * T - 1, b);
        const double prefill_error = test_max_abs_diff(b, a, V);
        printf("%s: bf16 logits within %.3g (decode) and %.3g (prefill) of float32 holding the bf16 values; the "
               "rounding to bf16 moves them %.3g (largest %.3g)\n", paths[m], decode_error, prefill_error, rounding,
               largest);
        EXPECT(decode_error <= 1e-5 * largest && prefill_error <= 1e-5 * largest,
               "%s: bf16 logits %.3g (decode), %.3g (prefill) from the float32 model of the same values", paths[m],
               decode_error, prefill_error);
        EXPECT(rounding > 100 * 1e-5 * largest, "%s: rounding to bf16 moved the logits only %.3g", paths[m], rounding);

        // Quantized after loading: the same model, bit for bit.
        Model after;
        load(&after, paths[m]);
        CHECK(model_quantize(&after, "bf16") == 0, "%s", err_msg());
        model_forward(&after, &batch);
        model_logits_row(&after, B * T - 1, a);
        EXPECT(memcmp(a, b, (size_t)V * sizeof(float)) == 0, "%s: bf16 after loading is another model", paths[m]);
        model_free(&after);
        // The float32 copies are given back (the whole pages inside a layer's MLP weight).
        const LayerTensors *w = &bf16.weights.layers[0];
        const long numel = (long)bf16.config.intermediate_size * bf16.config.hidden_size;
        const long page_floats = sysconf(_SC_PAGESIZE) / (long)sizeof(float);
        long nonzero = 0;
        for (long i = page_floats; i < numel - page_floats; i++) nonzero += w->up_w[i] != 0.0f;
        EXPECT(nonzero == 0, "%s: %ld float32 weights of up_proj still there", paths[m], nonzero);
        free(tokens), free(a), free(b), free(expected), free(got), free(unrounded);
        model_free(&original);
        model_free(&rounded);
        model_free(&bf16);
    }
}

// ---- Q4_0 ----

static void hex_bytes(const char *hex, uint8_t *out, int n) {
    for (int i = 0; i < n; i++) {
        unsigned value;
        CHECK(sscanf(hex + 2 * i, "%2x", &value) == 1, "bad hex '%s'", hex);
        out[i] = (uint8_t)value;
    }
}

static void json_floats(json_t *array, float *out, int n) {
    CHECK(json_array_size(array) == (size_t)n, "expected %d numbers", n);
    for (int i = 0; i < n; i++) out[i] = (float)json_number_value(json_array_get(array, i));
}

// gguf-py's Q4_0 against marlhf's, block by block.
static void test_q4_block_matches_gguf(void) {
    json_error_t error;
    json_t *fixture = json_load_file("tests/fixtures/quant/q4_0.json", 0, &error);
    CHECK(fixture, "tests/fixtures/quant/q4_0.json: %s", error.text);
    json_t *blocks = json_object_get(fixture, "blocks");
    int quantized_differ = 0, dequantized_differ = 0, roundtrip_differ = 0, count = 0;
    size_t index;
    json_t *block;
    json_array_foreach(blocks, index, block) {
        float x[Q8_BLOCK], expected[Q8_BLOCK], y[Q8_BLOCK], scale, file_scale;
        uint8_t bytes[2 + Q8_BLOCK / 2], nibbles[Q8_BLOCK / 2];
        json_floats(json_object_get(block, "x"), x, Q8_BLOCK);
        json_floats(json_object_get(block, "dequantized"), expected, Q8_BLOCK);
        hex_bytes(json_string_value(json_object_get(block, "bytes")), bytes, (int)sizeof bytes);
        const uint16_t half = (uint16_t)(bytes[0] | bytes[1] << 8);
        q4_quantize_block(x, nibbles, &scale);
        quantized_differ += gguf_f32_to_f16(scale) != half || memcmp(nibbles, bytes + 2, sizeof nibbles) != 0;
        file_scale = gguf_f16_to_f32(half);
        Q8Matrix matrix = {.rows = 1, .cols = Q8_BLOCK, .nibbles = bytes + 2, .scales = &file_scale, .type = QUANT_Q4_0};
        quant_dequantize_rows(&matrix, 0, 1, y);
        dequantized_differ += memcmp(y, expected, sizeof y) != 0;
        q4_quantize_block(y, nibbles, &scale);
        roundtrip_differ += scale != file_scale || memcmp(nibbles, bytes + 2, sizeof nibbles) != 0;
        count++;
    }
    EXPECT(count >= 20, "only %d blocks in the fixture", count);
    EXPECT(quantized_differ == 0, "%d of %d blocks quantize to other bytes than gguf-py's", quantized_differ, count);
    EXPECT(dequantized_differ == 0, "%d of %d blocks dequantize to other floats than gguf-py's", dequantized_differ,
           count);
    EXPECT(roundtrip_differ == 0, "%d of %d dequantized blocks quantize to other bytes", roundtrip_differ, count);
    json_decref(fixture);

    // Every weight matrix of the tiny Llama as the GGUF writer's Q4_0 (marlhf convert
    // --outtype q4_0), dequantized as a loaded Q4_0 GGUF is, quantizes back to its own blocks.
    Model model;
    load(&model, "tests/fixtures/models/llama");
    long blocks_checked = 0, differing = 0;
    for (int i = 0; i < model.table.count; i++) {
        const ParamEntry *e = &model.table.entries[i];
        if (e->ndim != 2 || e->shape[1] % Q8_BLOCK) continue;
        const long n = e->numel, nblocks = n / Q8_BLOCK;
        uint8_t *file = xmalloc(gguf_quantized_size(GGML_TYPE_Q4_0, n)), *codes = xmalloc((size_t)n / 2);
        float *values = xmalloc((size_t)n * sizeof(float)), *scales = xmalloc((size_t)nblocks * sizeof(float));
        gguf_quantize(GGML_TYPE_Q4_0, model.params + e->offset, file, n);
        gguf_dequantize(GGML_TYPE_Q4_0, file, values, n);
        q4_quantize_row(values, n, codes, scales);
        for (long b = 0; b < nblocks; b++) {
            const uint8_t *stored = file + b * (2 + Q8_BLOCK / 2);
            differing += gguf_f16_to_f32((uint16_t)(stored[0] | stored[1] << 8)) != scales[b] ||
                         memcmp(stored + 2, codes + b * (Q8_BLOCK / 2), Q8_BLOCK / 2) != 0;
        }
        blocks_checked += nblocks;
        free(file), free(codes), free(values), free(scales);
    }
    EXPECT(blocks_checked > 1000 && differing == 0, "%ld of %ld GGUF Q4_0 blocks come back otherwise", differing,
           blocks_checked);
    model_free(&model);
}

// ---- NF4 against bitsandbytes (tests/fixtures/quant/nf4.json, tools/make_nf4_fixture.py) ----

// A fixture array of float32 values: hex, 8 digits (the IEEE bits) a value. Returns the count.
static long hex_floats(json_t *value, float **out) {
    const char *hex = json_string_value(value);
    CHECK(hex && strlen(hex) % 8 == 0, "nf4.json: a float array is not hex");
    const long n = (long)strlen(hex) / 8;
    *out = xmalloc((size_t)(n ? n : 1) * sizeof(float));
    for (long i = 0; i < n; i++) {
        unsigned bits;
        CHECK(sscanf(hex + 8 * i, "%8x", &bits) == 1, "nf4.json: bad hex");
        uint32_t b = bits;
        memcpy(&(*out)[i], &b, sizeof b);
    }
    return n;
}

static long hex_array(json_t *value, uint8_t **out) {
    const char *hex = json_string_value(value);
    CHECK(hex && strlen(hex) % 2 == 0, "nf4.json: a byte array is not hex");
    const long n = (long)strlen(hex) / 2;
    *out = xmalloc((size_t)(n ? n : 1));
    hex_bytes(hex, *out, (int)n);
    return n;
}

// The formula matrix of tools/make_nf4_fixture.py (x is not stored in the fixture).
static void nf4_formula_matrix(float *x, long n) {
    for (long i = 0; i < n; i++) {
        const uint32_t u = (uint32_t)((uint64_t)i * 2654435761u + 12345u) >> 8;
        const double unit = ((double)u - 8388608.0) / 8388608.0;
        x[i] = (float)(unit * ldexp(1.0, -(3 + (int)((i / 64) % 9))));
    }
}

// Values of x and y (n of them) whose bits differ.
static long differing_floats(const float *x, const float *y, long n) {
    long count = 0;
    for (long i = 0; i < n; i++) count += memcmp(&x[i], &y[i], sizeof(float)) != 0;
    return count;
}

static void *zeroed(size_t bytes) { return xcalloc(1, bytes); }

static void test_nf4_matches_bitsandbytes(void) {
    json_error_t error;
    json_t *fixture = json_load_file("tests/fixtures/quant/nf4.json", 0, &error);
    CHECK(fixture, "tests/fixtures/quant/nf4.json: %s", error.text);
    float *levels, *map;
    EXPECT(hex_floats(json_object_get(fixture, "levels"), &levels) == 16 &&
               differing_floats(levels, nf4_levels, 16) == 0, "the NF4 levels are not bitsandbytes'");
    EXPECT(hex_floats(json_object_get(fixture, "dynamic_map"), &map) == 256 &&
               differing_floats(map, nf4_dynamic_map(), 256) == 0,
           "the dynamic map differs from bitsandbytes' create_dynamic_map() in %ld values",
           differing_floats(map, nf4_dynamic_map(), 256));
    free(levels), free(map);

    int cases = 0, whole_rows = 0;
    double worst_offset_ulps = 0, worst_own_offset_scale = 0;
    size_t index;
    json_t *c;
    json_array_foreach(json_object_get(fixture, "cases"), index, c) {
        const char *name = json_string_value(json_object_get(c, "name"));
        json_t *shape = json_object_get(c, "shape");
        const long rows = (long)json_integer_value(json_array_get(shape, 0));
        const long cols = (long)json_integer_value(json_array_get(shape, 1)), n = rows * cols;
        const long blocks = (n + NF4_BLOCK - 1) / NF4_BLOCK, scale_blocks = (blocks + NF4_SCALE_BLOCK - 1) / NF4_SCALE_BLOCK;
        float *x;
        if (json_object_get(c, "x")) {
            CHECK(hex_floats(json_object_get(c, "x"), &x) == n, "%s: x", name);
        } else {
            x = xmalloc((size_t)n * sizeof(float));
            nf4_formula_matrix(x, n);
        }
        json_t *single = json_object_get(c, "single"), *dq = json_object_get(c, "double");
        uint8_t *expected_packed, *packed = xmalloc((size_t)(n + 1) / 2);
        float *expected_absmax, *absmax = xmalloc((size_t)blocks * sizeof(float));
        CHECK(hex_array(json_object_get(c, "packed"), &expected_packed) == (n + 1) / 2, "%s: packed", name);
        CHECK(hex_floats(json_object_get(single, "absmax"), &expected_absmax) == blocks, "%s: absmax", name);
        nf4_quantize(x, n, packed, absmax);
        long codes_differ = 0;
        for (long i = 0; i < (n + 1) / 2; i++) codes_differ += packed[i] != expected_packed[i];
        EXPECT(codes_differ == 0, "%s: %ld of %ld bytes of codes differ from bitsandbytes'", name, codes_differ, (n + 1) / 2);
        EXPECT(differing_floats(absmax, expected_absmax, blocks) == 0, "%s: absmax differs", name);

        // Dequantized, without and with double quantization, against dequantize_4bit's floats
        // (all of them, or the fixture's rows of the formula matrix).
        float *y = xmalloc((size_t)n * sizeof(float));
        float *offset_value, *expected_absmax2, *expected_scales, *absmax2 = xmalloc((size_t)scale_blocks * sizeof(float));
        uint8_t *expected_scale_codes, *scale_codes = xmalloc((size_t)blocks);
        CHECK(hex_floats(json_object_get(dq, "offset"), &offset_value) == 1, "%s: offset", name);
        CHECK(hex_array(json_object_get(dq, "scale_codes"), &expected_scale_codes) == blocks, "%s: scale codes", name);
        CHECK(hex_floats(json_object_get(dq, "absmax2"), &expected_absmax2) == scale_blocks, "%s: absmax2", name);
        CHECK(hex_floats(json_object_get(dq, "scales"), &expected_scales) == blocks, "%s: scales", name);
        const float offset = offset_value[0];
        // Given bitsandbytes' offset, the 8-bit codes and second-level absmax values are its own.
        nf4_double_quantize(expected_absmax, blocks, offset, scale_codes, absmax2);
        long scale_codes_differ = 0;
        for (long k = 0; k < blocks; k++) scale_codes_differ += scale_codes[k] != expected_scale_codes[k];
        EXPECT(scale_codes_differ == 0, "%s: %ld of %ld scale codes differ from bitsandbytes'", name,
               scale_codes_differ, blocks);
        EXPECT(differing_floats(absmax2, expected_absmax2, scale_blocks) == 0, "%s: absmax2 differs", name);
        float *scales = xmalloc((size_t)blocks * sizeof(float));
        nf4_double_dequantize(expected_scale_codes, expected_absmax2, offset, blocks, scales);
        EXPECT(differing_floats(scales, expected_scales, blocks) == 0, "%s: %ld double-dequantized scales differ", name,
               differing_floats(scales, expected_scales, blocks));
        for (int variant = 0; variant < 2; variant++) {
            json_t *entry = variant ? dq : single;
            nf4_dequantize(expected_packed, variant ? expected_scales : expected_absmax, n, y);
            json_t *all = json_object_get(entry, "dequantized");
            if (all) {
                float *expected;
                CHECK(hex_floats(all, &expected) == n, "%s: dequantized", name);
                EXPECT(differing_floats(y, expected, n) == 0, "%s (%s): %ld of %ld dequantized values differ", name,
                       variant ? "double" : "single", differing_floats(y, expected, n), n);
                free(expected);
            } else {
                const char *key;
                json_t *row;
                json_object_foreach(json_object_get(entry, "dequantized_rows"), key, row) {
                    float *expected;
                    const long r = atol(key);
                    CHECK(hex_floats(row, &expected) == cols, "%s: row %s", name, key);
                    EXPECT(differing_floats(y + r * cols, expected, cols) == 0, "%s (%s): row %ld differs", name,
                           variant ? "double" : "single", r);
                    free(expected);
                }
            }
        }
        // marlhf's own offset (the mean summed in double) against torch's float32 mean.
        const float own = nf4_scales_offset(expected_absmax, blocks);
        const double ulps = fabs((double)own - offset) / (nextafterf(fabsf(offset), INFINITY) - fabsf(offset));
        worst_offset_ulps = ulps > worst_offset_ulps ? ulps : worst_offset_ulps;

        // A matrix (rows a multiple of 64 long) quantized whole: its dequantized rows are the
        // flat functions' (with its own offset), single and double.
        if (cols % NF4_BLOCK == 0) {
            whole_rows++;
            for (int dbl = 0; dbl < 2; dbl++) {
                Q8Matrix matrix = {0};
                nf4_quantize_matrix(&matrix, x, rows, cols, dbl, zeroed);
                float *from_matrix = xmalloc((size_t)n * sizeof(float));
                quant_dequantize_rows(&matrix, 0, rows, from_matrix);
                if (dbl) {
                    nf4_double_quantize(absmax, blocks, own, scale_codes, absmax2);
                    nf4_double_dequantize(scale_codes, absmax2, own, blocks, scales);
                    // Against bitsandbytes' scales: apart only by the offset's last bits (measured
                    // relative to the offset, the scales' common term; a scale near 0 has no
                    // relative error to speak of).
                    for (long k = 0; k < blocks; k++) {
                        const double d = fabs((double)scales[k] - expected_scales[k]) / fabs(offset);
                        worst_own_offset_scale = d > worst_own_offset_scale ? d : worst_own_offset_scale;
                    }
                }
                nf4_dequantize(packed, dbl ? scales : absmax, n, y);
                EXPECT(differing_floats(from_matrix, y, n) == 0, "%s: the %s matrix dequantizes otherwise", name,
                       dbl ? "double-quantized" : "single");
                EXPECT(nf4_matrix_bytes(&matrix) == n / 2 + (dbl ? blocks + 4 * scale_blocks + 4 : 4 * blocks),
                       "%s: matrix bytes", name);
                free(from_matrix);
                free(matrix.nibbles), free(matrix.scales), free(matrix.scale_codes), free(matrix.scale_absmax);
            }
        }
        cases++;
        free(x), free(packed), free(expected_packed), free(absmax), free(expected_absmax), free(y);
        free(offset_value), free(expected_absmax2), free(expected_scales), free(absmax2), free(expected_scale_codes);
        free(scale_codes), free(scales);
    }
    printf("nf4: %d cases; marlhf's offset vs torch's float32 mean: at most %.0f ulp; the scales with marlhf's own "
           "offset vs bitsandbytes': at most %.2g of the offset\n", cases, worst_offset_ulps, worst_own_offset_scale);
    EXPECT(cases == 6 && whole_rows == 4, "%d cases, %d of whole blocks per row", cases, whole_rows);
    EXPECT(worst_offset_ulps <= 2, "the offset is %.0f ulp from torch's mean", worst_offset_ulps);
    EXPECT(worst_own_offset_scale <= 1e-6, "the scales move by %.3g with marlhf's own offset", worst_own_offset_scale);
    json_decref(fixture);
}

// ---- QLoRA: LoRA over a quantized frozen base ----

// Sets every lora_B of the model to values drawn from `seed` (a fresh adapter's B is 0,
// which would leave the adapters' A without a gradient).
static void fill_lora_b(Model *model, uint64_t seed) {
    Draws rng = {.seed = seed};
    for (int i = model->lora_first_entry; i < model->table.count; i++) {
        const ParamEntry *e = &model->table.entries[i];
        if (strstr(e->name, "lora_B")) fill_uniform(&rng, model->params + e->offset, e->numel, 0.1f);
    }
}

enum { QB = 2, QT = 21 }; // 42 token rows: fewer than Q8_SGEMM_MIN_ROWS (the integer kernel's range)

// The lengths of the rows of qlora_step's fixed ragged batch (tests/qlora_step.h).
static const int qlora_row_len[QB] = {QT, QT - 6};

// LoRA (or DoRA: QDoRA) over a base quantized to `type` against the same adapters over the
// float32 base holding its dequantized values (and over the original floats, which the
// quantization must move by far more than the tolerance); with lora_dropout the masks are
// drawn (model_training_pass_begin), so DoRA's base product on the dropped input and its input
// gradient go through the quantized weight as well.
static void check_qlora_against_float(const char *type, bool dora, double dropout) {
    const char *path = "tests/fixtures/models/llama";
    char label[64];
    snprintf(label, sizeof label, "%s%s%s", type, dora ? " DoRA" : "", dropout > 0 ? " dropout" : "");
    {
        Model quantized, dequantized, original;
        ModelLoadOptions options = {.with_lm_head = true, .quantize = type};
        CHECK(model_load(&quantized, path, &ops_cpu, &options) == 0, "%s", err_msg());
        load(&dequantized, path);
        load(&original, path);
        model_dequantize_into(&quantized, dequantized.params); // the same table, the base's values
        LoraConfig lora = {.rank = 4, .alpha = 8.0f, .targets = (1u << LORA_TARGETS) - 1, .dora = dora,
                           .dropout = dropout};
        Model *models[3] = {&quantized, &dequantized, &original};
        for (int m = 0; m < 3; m++) {
            CHECK(model_add_lora(models[m], &lora, false, 5) == 0, "%s", err_msg());
            fill_lora_b(models[m], 21);
            model_enable_grad(models[m]);
        }
        EXPECT(quantized.lora_base_fingerprint == dequantized.lora_base_fingerprint &&
                   quantized.lora_base_fingerprint != original.lora_base_fingerprint,
               "%s: fingerprints %016llx (quantized), %016llx (dequantized float32), %016llx (original)", label,
               quantized.lora_base_fingerprint, dequantized.lora_base_fingerprint, original.lora_base_fingerprint);
        const long G = model_trainable_floats(&quantized);
        CHECK(G == model_trainable_floats(&dequantized), "trainable sizes differ");
        float logp[3][QB * QT];
        float *grads[3];
        for (int m = 0; m < 3; m++) {
            grads[m] = xmalloc((size_t)G * sizeof(float));
            model_training_pass_begin(models[m], 77, 0, 0); // nothing without lora_dropout
            qlora_step(models[m], QB, QT, qlora_row_len, logp[m], grads[m]);
        }
        // Gradient checkpointing recomputes each quantized layer to the same bits.
        float recomputed_logp[QB * QT];
        float *recomputed = xmalloc((size_t)G * sizeof(float));
        quantized.recompute = true;
        model_training_pass_begin(&quantized, 77, 0, 0); // the same masks again
        qlora_step(&quantized, QB, QT, qlora_row_len, recomputed_logp, recomputed);
        EXPECT(!quantized.acts.keep_all_layers, "%s: the layers' activations were kept, not recomputed", label);
        quantized.recompute = false;
        EXPECT(memcmp(recomputed, grads[0], (size_t)G * sizeof(float)) == 0,
               "%s: gradient checkpointing changed the adapter gradients by %.3g", label,
               test_max_abs_diff(recomputed, grads[0], G));
        free(recomputed);
        double grad_scale = 0;
        for (long i = 0; i < G; i++) grad_scale = fmax(grad_scale, fabs(grads[1][i]));
        const double logp_error = test_max_abs_diff(logp[0], logp[1], QB * QT);
        const double grad_error = test_max_abs_diff(grads[0], grads[1], G);
        const double logp_quantization = test_max_abs_diff(logp[1], logp[2], QB * QT);
        const double grad_quantization = test_max_abs_diff(grads[1], grads[2], G);
        printf("QLoRA %s: log-probs within %.3g and adapter gradients within %.3g (largest %.3g) of LoRA on the "
               "dequantized float32 base; the quantization itself moves them %.3g and %.3g\n",
               label, logp_error, grad_error, grad_scale, logp_quantization, grad_quantization);
        EXPECT(grad_scale > 0, "%s: no adapter gradient", label);
        EXPECT(logp_error <= 2e-5, "%s: log-probs %.3g from the dequantized float32 base's", label, logp_error);
        EXPECT(grad_error <= 1e-4 * grad_scale, "%s: adapter gradients %.3g from the dequantized float32 base's",
               label, grad_error);
        // The check can tell: the quantization moves both far more than the tolerance.
        EXPECT(logp_quantization > 50 * 2e-5 && grad_quantization > 10 * 1e-4 * grad_scale,
               "%s: quantizing moved the log-probs only %.3g and the gradients %.3g", label, logp_quantization,
               grad_quantization);
        // The base stayed frozen: its float32 pages are still given back (read as zeros).
        const LayerTensors *w = &quantized.weights.layers[0];
        const long numel = (long)quantized.config.intermediate_size * quantized.config.hidden_size;
        const long page_floats = sysconf(_SC_PAGESIZE) / (long)sizeof(float);
        long nonzero = 0;
        for (long i = page_floats; i < numel - page_floats; i++) nonzero += w->up_w[i] != 0.0f;
        EXPECT(nonzero == 0, "%s: %ld float32 weights of up_proj came back", label, nonzero);

        // Saved: the dequantized base with the adapters merged, a plain float32 model that
        // computes what the adapted quantized one does; the adapter says which base it needs.
        char dir[512];
        snprintf(dir, sizeof dir, "%s/marlhf_qlora_XXXXXX", getenv("MARLHF_TEST_TMP") ? getenv("MARLHF_TEST_TMP") : "/tmp");
        CHECK(mkdtemp(dir), "mkdtemp in %s failed", dir);
        CHECK(model_write_hf_files(&quantized, dir) == 0, "%s", err_msg());
        Model merged;
        load(&merged, dir);
        float merged_logp[QB * QT], adapted_logp[QB * QT];
        qlora_step(&merged, QB, QT, qlora_row_len, merged_logp, NULL);
        model_training_pass_end(&quantized); // the merged model is the adapted one without dropout
        qlora_step(&quantized, QB, QT, qlora_row_len, adapted_logp, NULL);
        const double merged_error = test_max_abs_diff(merged_logp, adapted_logp, QB * QT);
        EXPECT(merged_error <= 2e-5, "%s: the merged model's log-probs %.3g from the adapted model's", label,
               merged_error);
        Model again;
        CHECK(model_load(&again, path, &ops_cpu, &options) == 0, "%s", err_msg());
        EXPECT(model_load_lora_adapter(&again, dir, false, 0) == 0, "%s: the adapter on its quantized base: %s",
               label, err_msg());
        model_free(&again);
        load(&again, path);
        EXPECT(model_load_lora_adapter(&again, dir, false, 0) != 0 && strstr(err_msg(), type),
               "%s: the adapter accepted on the float32 base (%s)", label, err_msg());
        model_free(&again);
        model_free(&merged);
        char command[600];
        snprintf(command, sizeof command, "rm -rf '%s'", dir);
        CHECK(system(command) == 0, "%s failed", command);
        for (int m = 0; m < 3; m++) {
            free(grads[m]);
            model_free(models[m]);
        }
    }
}

static void test_qlora_matches_dequantized_float(void) {
    const char *types[] = {"q8_0", "q4_0", "nf4", "nf4-single", "q4_1", "q5_1", "bf16"};
    for (int k = 0; k < 7; k++) check_qlora_against_float(types[k], false, 0.0);
}

// QDoRA: DoRA's magnitudes and weight norms from the dequantized base (ops dequantize_rows),
// its products through the quantized weights.
static void test_qdora_matches_dequantized_float(void) {
    check_qlora_against_float("q8_0", true, 0.0);
    check_qlora_against_float("nf4", true, 0.0);
    check_qlora_against_float("q4_1", true, 0.25);
}

static void test_quantize_refusals(void) {
    Model model;
    load(&model, "tests/fixtures/models/llama");
    EXPECT(model_quantize(&model, "q5_0") != 0 && strstr(err_msg(), "--quantize"), "q5_0 accepted: %s", err_msg());
    EXPECT(model_quantize(&model, "none") == 0 && model.quantized == NULL, "none quantized the model");
    model_enable_grad(&model);
    EXPECT(model_quantize(&model, "q8_0") != 0 && strstr(err_msg(), "before it trains"),
           "a trainable model quantized: %s", err_msg());
    model_free(&model);
    // NF4's blocks of 64 along a row: Qwen3's attention size (4 heads of 24) is refused.
    load(&model, "tests/fixtures/models/qwen3");
    EXPECT(model_quantize(&model, "nf4") != 0 && strstr(err_msg(), "multiples of 64") && model.quantized == NULL,
           "nf4 on rows of 96: %s", err_msg());
    EXPECT(model_quantize(&model, "q4_0") == 0, "q4_0 on rows of 96: %s", err_msg());
    model_free(&model);
}

// SmolLM2 decoded token by token over the reference's positions: top-1 agreement with
// transformers' float32 and the mean and largest |log-prob difference|.
// SmolLM2 token by token (one-row decode steps, the Q8_0 path) against transformers' float32.
static void test_smollm2_quantized_decode(void) {
    json_t *reference = smollm2_reference();
    Model model;
    if (smollm2_load(&model, NULL) != 0) {
        json_decref(reference);
        return;
    }
    CHECK(model_quantize(&model, "q8_0") == 0, "%s", err_msg());

    // The file stores the embedding table (the tied LM head) as Q8_0: its quantized copy
    // must be the file's own blocks, bit for bit.
    GgufFile file;
    CHECK(gguf_open(&file, "models/SmolLM2-135M-Instruct.Q4_1.gguf") == 0, "%s", err_msg());
    const GgufTensor *embedding = gguf_find_tensor(&file, "token_embd.weight");
    CHECK(embedding && embedding->type == GGML_TYPE_Q8_0, "token_embd.weight is not Q8_0 in the test model");
    const Q8Matrix *head = &model.quantized->lm_head;
    const long blocks = (long)head->rows * head->cols / Q8_BLOCK;
    long differing = 0;
    for (long b = 0; b < blocks; b++) {
        const uint8_t *block = (const uint8_t *)embedding->data + b * (2 + Q8_BLOCK); // f16 scale, 32 values
        uint16_t half = (uint16_t)(block[0] | block[1] << 8);
        differing += gguf_f16_to_f32(half) != head->scales[b] ||
                     memcmp(block + 2, head->values + b * Q8_BLOCK, Q8_BLOCK) != 0;
    }
    gguf_close(&file);
    EXPECT(differing == 0, "%ld of %ld Q8_0 blocks of the embedding differ from the file's", differing, blocks);
    double agreement, mean, worst;
    smollm2_decode_agreement(&model, reference, &agreement, &mean, &worst);
    printf("smollm2 Q8_0 decode vs transformers float32: top-1 agreement %.4f, |log-prob difference| mean %.3g, "
           "max %.3g\n", agreement, mean, worst);
    // Measured: 0.925, mean 0.082, max 0.57 (0.935, 0.074, 0.50 before the decode attention
    // kernel of 2026-11-30 changed the rounding). llama.cpp's own Q8_0 file of these weights on
    // the same positions: 0.963, mean 0.087, max 0.635 (docs/quantization.md).
    if (smollm2_figures_checked("test_smollm2_quantized_decode")) {
        EXPECT(agreement >= 0.92, "top-1 agreement %.4f", agreement);
        EXPECT(mean <= 0.1 && worst <= 1.0, "log-prob differences: mean %.3g, max %.3g", mean, worst);
    }
    model_free(&model);
    json_decref(reference);
}

// SmolLM2 loaded with `quantize` and decoded token by token against transformers' float32:
// prints the figures (`label`), and in the plain build checks them against the floor and
// ceiling given (`test`: the name smollm2_figures_checked reports). False when the model is not
// there.
static bool check_smollm2_decode(json_t *reference, const char *quantize, const char *label, const char *test,
                                 double min_agreement, double max_mean) {
    Model model;
    if (smollm2_load(&model, quantize) != 0) return false;
    EXPECT(strcmp(model_quantize_name(&model), quantize) == 0, "%s loaded as %s", quantize, model_quantize_name(&model));
    double agreement, mean, worst;
    smollm2_decode_agreement(&model, reference, &agreement, &mean, &worst);
    printf("smollm2 %s decode vs transformers float32: top-1 agreement %.4f, |log-prob difference| mean %.3g, "
           "max %.3g\n", label, agreement, mean, worst);
    if (smollm2_figures_checked(test))
        EXPECT(agreement >= min_agreement && mean <= max_mean, "%s: top-1 agreement %.4f, mean |log-prob difference| %.3g",
               quantize, agreement, mean);
    model_free(&model);
    return true;
}

// The same with Q4_0 weights (the file's Q4_1 blocks re-quantized to Q4_0's 16 levels
// without a minimum: the coarsest of the three).
static void test_smollm2_q4_0_decode(void) {
    json_t *reference = smollm2_reference();
    // Measured: 0.654, mean 0.658, max 6.03 (0.653 and 6.0 through the Q8_0 kernel's 16-lane
    // sums before the register kernel; 0.617 and 0.77 with the token table and tied head in
    // Q4_0 too, before they were kept in Q8_0).
    check_smollm2_decode(reference, "q4_0", "Q4_0", "test_smollm2_q4_0_decode", 0.6, 0.8);
    json_decref(reference);
}

// The same with NF4 weights (double-quantized scales, QLoRA's recipe) and NF4 with float scales.
static void test_smollm2_nf4_decode(void) {
    json_t *reference = smollm2_reference();
    // Measured: nf4 0.692, mean 1.07, max 7.47; nf4-single 0.701, 1.07, 7.62 (Q4_0: 0.654,
    // 0.653, 6.0). These weights are SmolLM2's Q4_1 blocks of 32 dequantized: bitsandbytes'
    // own NF4 of them is 6.5% further from them (relative RMS, blocks 0 and 15) than
    // gguf-py's Q4_0 (docs/quantization.md).
    const char *types[] = {"nf4", "nf4-single"};
    for (int k = 0; k < 2; k++)
        if (!check_smollm2_decode(reference, types[k], types[k], types[k], 0.65, 1.2)) break;
    json_decref(reference);
}

// SmolLM2 with bf16 weights: its Q4_1 file's values rounded to bf16, against transformers'
// float32 of those values, token by token.
static void test_smollm2_bf16_decode(void) {
    json_t *reference = smollm2_reference();
    // Measured: 0.9907, mean 0.0102, max 0.0864 (Q8_0: 0.925, 0.082, 0.57).
    check_smollm2_decode(reference, "bf16", "bf16", "test_smollm2_bf16_decode", 0.98, 0.02);
    json_decref(reference);
}

int main(void) {
    RUN(test_q8_block_roundtrip);
    RUN(test_q8_matmul_arithmetic);
    RUN(test_quantized_model);
    RUN(test_quantized_model_with_lora);
    RUN(test_bf16_rounding);
    RUN(test_bf16_matmul);
    RUN(test_bf16_model);
    RUN(test_q4_block_matches_gguf);
    RUN(test_nf4_matches_bitsandbytes);
    RUN(test_qlora_matches_dequantized_float);
    RUN(test_qdora_matches_dequantized_float);
    RUN(test_quantize_refusals);
    RUN(test_smollm2_quantized_decode);
    RUN(test_smollm2_q4_0_decode);
    RUN(test_smollm2_nf4_decode);
    RUN(test_smollm2_bf16_decode);
    TEST_EXIT();
}
