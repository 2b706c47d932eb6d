// The CUDA dequantization kernels (src/ops/cuda/dequantize.cuh) run on CPU threads through
// src/ops/cuda/cpu_emulation.h, against the CPU's dequantization (ops/q8.c, ops/q4.c,
// ops/nf4.c through quant_dequantize_rows): every value of a bf16 tile must be the bf16 of
// the CPU's float, bit for bit, and the quantized token lookup must equal the CPU op's floats
// bit for bit. Q8_0, Q4_0, NF4 with float scales and with double-quantized scales (several
// second-level blocks), bitsandbytes' FP4 code book; the K-quants Q4_K, Q5_K and Q6_K (the GGUF
// writer's blocks, and rows of random bytes under random half-float scales, subnormal ones
// included: every code and scale bit pattern), Q3_K and Q2_K (random bytes and scales in every
// row: marlhf does not write them), Q5_0, Q4_1 and Q5_1 (random codes, fifth bits, scales and
// minimums), against io/gguf_dequant.c and ops/q5.c; IQ4_NL (random codes and scales: the levels
// through the code book); bf16 (rounded weights and random finite bits); ragged row counts, tiles that start past row 0, one to
// ten blocks a row. And the decode product (matvec_quantized.cuh, 1 to 8 input rows) of each type
// against the CPU's float product of the dequantized weights (ops_cpu.matmul_forward_dequantized),
// within 1e-5 of sum |x| |w| per output: only the order of the fp32 sums differs.
// tests/gpu/test_cuda.c checks the same kernels on a GPU.
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <vector>

extern "C" {
#include "core/bf16.h"
#include "ops/kquant.h"
#include "ops/nf4.h"
#include "ops/ops.h"
#include "ops/q4.h"
#include "ops/q8.h"
}
#include "ops/cuda/dequantize.cuh"
#include "ops/cuda/matvec_quantized.cuh"
#include "test.h"

static uint64_t rng_state = 0x2545f4914f6cdd1dull;

// Uniform in [-scale, scale) from a fixed sequence (xorshift64*).
static uint64_t random_u64(void) {
    rng_state ^= rng_state >> 12, rng_state ^= rng_state << 25, rng_state ^= rng_state >> 27;
    return rng_state * 0x2545f4914f6cdd1dull;
}

static float random_float(float scale) {
    return scale * (2.0f * (float)((random_u64() >> 40) * (1.0 / 16777216.0)) - 1.0f);
}

enum Kind { Q8_0, Q4_0, NF4_SINGLE, NF4_DOUBLE, FP4_DOUBLE, Q4_K, Q6_K, Q5_0, Q5_K, Q3_K, Q2_K, Q4_1, Q5_1, BF16, IQ4_NL };
static const char *const kind_names[] = {"q8_0", "q4_0", "nf4-single", "nf4", "fp4 code book", "q4_k", "q6_k",
                                         "q5_0", "q5_k", "q3_k", "q2_k", "q4_1", "q5_1", "bf16", "iq4_nl"};
static const int kind_count = (int)(sizeof kind_names / sizeof kind_names[0]);

static bool is_kquant(int kind) { return kind == Q4_K || kind == Q6_K || kind == Q5_K || kind == Q3_K || kind == Q2_K; }

// 32 random bits, each bit as likely set as clear (the high half of the generator's output: a
// float's 24 bits scaled up would leave the low byte nearly constant, and random code bytes
// would not be random).
static uint32_t random_bits(void) { return (uint32_t)(random_u64() >> 32); }

// A random finite half float (any sign and exponent but the all-ones one), every fourth one
// subnormal (exponent 0: gguf_f16_to_f32's other branch).
static void random_half(uint8_t *p) {
    static int calls;
    const uint32_t bits = random_bits();
    const uint32_t exponent = calls++ % 4 == 0 ? 0 : bits % 31, h = (bits >> 8 & 0x8000u) | exponent << 10 | (bits >> 12 & 0x3ffu);
    p[0] = (uint8_t)(h & 0xff), p[1] = (uint8_t)(h >> 8);
}

// A [rows, cols] matrix of weights of varied magnitude per row (so block scales differ, and
// double quantization has scales spread over its map), quantized by the CPU code.
static Q8Matrix quantized_matrix(Kind kind, int rows, int cols) {
    std::vector<float> weights((size_t)rows * cols);
    for (int r = 0; r < rows; r++) {
        const float magnitude = 0.01f + 0.05f * (float)(r % 7);
        for (int c = 0; c < cols; c++) weights[(size_t)r * cols + c] = random_float(magnitude);
    }
    Q8Matrix m = {};
    if (is_kquant(kind)) {
        // Q4_K, Q5_K, Q6_K: the GGUF writer's blocks, every third row then random bytes under
        // random scales; Q3_K and Q2_K (which marlhf reads but does not write): random bytes
        // under random scales in every row.
        const QuantType type = kind == Q4_K ? QUANT_Q4_K : kind == Q5_K ? QUANT_Q5_K : kind == Q6_K ? QUANT_Q6_K
                               : kind == Q3_K                           ? QUANT_Q3_K
                                                                        : QUANT_Q2_K;
        const bool written = kind == Q4_K || kind == Q5_K || kind == Q6_K;
        const long row_bytes = kquant_row_bytes(type, cols), block_bytes = row_bytes / (cols / KQ_BLOCK);
        if (written) kquant_quantize_matrix(&m, type, weights.data(), rows, cols, malloc);
        else {
            m.rows = rows, m.cols = cols, m.type = type;
            m.blocks = (uint8_t *)malloc((size_t)(rows * row_bytes));
        }
        for (int r = written ? 1 : 0; r < rows; r += written ? 3 : 1)
            for (long b = 0; b < cols / KQ_BLOCK; b++) {
                uint8_t *block = m.blocks + r * row_bytes + b * block_bytes;
                for (long i = 0; i < block_bytes; i++) block[i] = (uint8_t)random_bits();
                if (kind == Q4_K || kind == Q5_K) random_half(block), random_half(block + 2); // d, dmin
                else if (kind == Q6_K) random_half(block + 208);                           // d
                else if (kind == Q3_K) random_half(block + 108);                           // d
                else random_half(block + 80), random_half(block + 82);                     // d, dmin
            }
        return m;
    }
    if (kind == Q5_0 || kind == Q4_1 || kind == Q5_1 || kind == IQ4_NL) {
        // Random codes, fifth bits, scales and minimums (held as floats: any float is a value
        // the kernel must reproduce).
        m.rows = rows, m.cols = cols;
        m.type = kind == Q5_0 ? QUANT_Q5_0 : kind == Q4_1 ? QUANT_Q4_1 : kind == Q5_1 ? QUANT_Q5_1 : QUANT_IQ4_NL;
        const long blocks = (long)rows * cols / Q8_BLOCK;
        m.nibbles = (uint8_t *)malloc((size_t)rows * cols / 2);
        m.scales = (float *)malloc((size_t)blocks * sizeof(float));
        if (kind == Q5_0 || kind == Q5_1) m.high_bits = (uint32_t *)malloc((size_t)blocks * sizeof(uint32_t));
        if (kind == Q4_1 || kind == Q5_1) m.mins = (float *)malloc((size_t)blocks * sizeof(float));
        for (long i = 0; i < (long)rows * cols / 2; i++) m.nibbles[i] = (uint8_t)random_bits();
        for (long k = 0; k < blocks; k++) {
            m.scales[k] = random_float(0.01f);
            if (m.high_bits) m.high_bits[k] = random_bits();
            if (m.mins) m.mins[k] = random_float(0.1f);
        }
        return m;
    }
    if (kind == BF16) {
        // The weights rounded (core/bf16.h), every other row then random bits: any finite bf16,
        // subnormals included.
        m.rows = rows, m.cols = cols, m.type = QUANT_BF16;
        m.bf16 = (uint16_t *)malloc((size_t)rows * cols * sizeof(uint16_t));
        bf16_round_row(weights.data(), (long)rows * cols, m.bf16);
        for (int r = 1; r < rows; r += 2)
            for (int c = 0; c < cols; c++) {
                uint16_t b;
                do b = (uint16_t)random_bits();
                while ((b & 0x7f80u) == 0x7f80u); // not an infinity or NaN
                m.bf16[(size_t)r * cols + c] = b;
            }
        return m;
    }
    if (kind == Q8_0 || kind == Q4_0) {
        m.rows = rows, m.cols = cols, m.type = kind == Q8_0 ? QUANT_Q8_0 : QUANT_Q4_0;
        m.values = (int8_t *)calloc((size_t)rows * cols, 1);
        m.scales = (float *)calloc((size_t)rows * cols / Q8_BLOCK, sizeof(float));
        for (int r = 0; r < rows; r++) {
            const float *x = weights.data() + (size_t)r * cols;
            float *scales = m.scales + (size_t)r * (cols / Q8_BLOCK);
            if (kind == Q8_0) q8_quantize_row(x, cols, m.values + (size_t)r * cols, scales);
            else q4_quantize_row(x, cols, m.nibbles + (size_t)r * cols / 2, scales);
        }
        return m;
    }
    nf4_quantize_matrix(&m, weights.data(), rows, cols, kind != NF4_SINGLE, malloc);
    if (kind == FP4_DOUBLE) m.levels = fp4_levels; // the same codes read through the other book
    return m;
}

static void free_matrix(Q8Matrix *m) {
    free(m->values), free(m->scales), free(m->scale_codes), free(m->scale_absmax), free(m->high_bits), free(m->mins);
}

static uint16_t bits(bf16 x) { return x.bits; }

// Rows [first, first + count) of m dequantized by the kernel into a bf16 tile, against the
// bf16 of the CPU's floats; and (a tile inside the matrix) by float_rows_kernel into floats,
// against the CPU's floats.
static void check_tile(Kind kind, const Q8Matrix &m, int first, int count) {
    const dequantize::Weights w = dequantize::weights_for(&m, nf4_dynamic_map());
    const long n = (long)count * m.cols;
    std::vector<bf16> tile((size_t)n, bf16{0xFFFF}); // NaN: an element never written shows
    emulation::launch({dequantize::rows_blocks(count, m.cols), 1, 1}, dequantize::THREADS, 0,
                      [&] { dequantize::rows_kernel(tile.data(), w, first, count); });
    std::vector<float> want((size_t)n);
    quant_dequantize_rows(&m, first, count, want.data());
    long wrong = 0, first_wrong = -1;
    for (long i = 0; i < n; i++)
        if (bits(tile[(size_t)i]) != bits(float_to_bf16(want[(size_t)i]))) {
            if (first_wrong < 0) first_wrong = i;
            wrong++;
        }
    // The float rows (float_rows_kernel, DoRA's norms over a quantized base): the CPU's floats,
    // checked on the tiles that start inside the matrix (the same decode8 as the bf16 tiles).
    long float_wrong = 0;
    if (first > 0 && count > 1) {
        std::vector<float> floats((size_t)n, NAN);
        emulation::launch({dequantize::rows_blocks(count, m.cols), 1, 1}, dequantize::THREADS, 0,
                          [&] { dequantize::float_rows_kernel(floats.data(), w, first, count); });
        float_wrong = memcmp(floats.data(), want.data(), (size_t)n * sizeof(float)) != 0;
    }
    printf("# %-14s [%3d, %3d] rows %3d..%-3d %ld of %ld values differ%s\n", kind_names[kind], m.rows, m.cols, first,
           first + count, wrong, n, float_wrong ? " (and the float rows differ)" : "");
    EXPECT(!float_wrong, "%s [%d, %d] rows %d..%d: the float rows differ from the CPU's", kind_names[kind], m.rows,
           m.cols, first, first + count);
    EXPECT(wrong == 0, "%s [%d, %d] rows %d..%d: %ld values differ, the first at %ld (%g, want %g)", kind_names[kind],
           m.rows, m.cols, first, first + count, wrong, first_wrong,
           first_wrong >= 0 ? bf16_to_float(tile[(size_t)first_wrong]) : 0.0,
           first_wrong >= 0 ? want[(size_t)first_wrong] : 0.0);
}

static void check_kind(Kind kind, const std::vector<std::pair<int, int>> &shapes) {
    for (const auto &shape : shapes) {
        Q8Matrix m = quantized_matrix(kind, shape.first, shape.second);
        check_tile(kind, m, 0, m.rows);                             // the whole matrix
        if (m.rows > 3) check_tile(kind, m, m.rows / 3, m.rows / 2); // a tile that starts inside it
        check_tile(kind, m, m.rows - 1, 1);                         // its last row alone
        free_matrix(&m);
    }
}

// Rows of 1, 3 and 10 blocks; odd row counts; NF4 double quantization over 1 to 4
// second-level blocks of 256 scales (70 x 320: 350 scales, 101 x 640: 1010).
static void test_q8_0_tiles(void) { check_kind(Q8_0, {{1, 32}, {37, 96}, {70, 320}}); }
static void test_q4_0_tiles(void) { check_kind(Q4_0, {{1, 32}, {37, 96}, {70, 320}}); }
static void test_nf4_single_tiles(void) { check_kind(NF4_SINGLE, {{1, 64}, {37, 192}, {70, 640}}); }
static void test_nf4_double_tiles(void) { check_kind(NF4_DOUBLE, {{1, 64}, {70, 320}, {101, 640}}); }
static void test_fp4_code_book_tiles(void) { check_kind(FP4_DOUBLE, {{37, 192}}); }
// K-quants: one, two and three super-blocks a row.
static void test_q4_k_tiles(void) { check_kind(Q4_K, {{1, 256}, {37, 512}, {20, 768}}); }
static void test_q6_k_tiles(void) { check_kind(Q6_K, {{1, 256}, {37, 512}, {20, 768}}); }
static void test_q5_0_tiles(void) { check_kind(Q5_0, {{1, 32}, {37, 96}, {70, 320}}); }
static void test_q4_1_tiles(void) { check_kind(Q4_1, {{1, 32}, {37, 96}, {70, 320}}); }
static void test_q5_1_tiles(void) { check_kind(Q5_1, {{1, 32}, {37, 96}, {70, 320}}); }
static void test_q5_k_tiles(void) { check_kind(Q5_K, {{1, 256}, {37, 512}, {20, 768}}); }
static void test_q3_k_tiles(void) { check_kind(Q3_K, {{1, 256}, {37, 512}, {20, 768}}); }
static void test_q2_k_tiles(void) { check_kind(Q2_K, {{1, 256}, {37, 512}, {20, 768}}); }
static void test_bf16_tiles(void) { check_kind(BF16, {{1, 32}, {37, 96}, {70, 320}}); }
static void test_iq4_nl_tiles(void) { check_kind(IQ4_NL, {{1, 32}, {37, 96}, {70, 320}}); }

// The quantized token table: the kernel's floats against ops_cpu's embedding_forward_q8
// (repeated tokens, a scale, with and without learned positions).
static void check_embedding(Kind kind, int V, int C) {
    Q8Matrix table = quantized_matrix(kind, V, C);
    const dequantize::Weights w = dequantize::weights_for(&table, nf4_dynamic_map());
    const int N = 45, P = 20;
    std::vector<int> tokens(N), positions(N);
    for (int i = 0; i < N; i++) tokens[(size_t)i] = (i * 7 + 3) % V, positions[(size_t)i] = i % P;
    std::vector<float> pos_emb((size_t)P * C);
    for (float &x : pos_emb) x = random_float(0.3f);
    for (int with_positions = 0; with_positions < 2; with_positions++) {
        const float *pos = with_positions ? pos_emb.data() : NULL;
        std::vector<float> got((size_t)N * C, NAN), want((size_t)N * C);
        ops_cpu.embedding_forward_q8(want.data(), tokens.data(), positions.data(), &table, pos, N, C, 1.7f);
        emulation::launch({dequantize::rows_blocks(N, C), 1, 1}, dequantize::THREADS, 0, [&] {
            dequantize::embedding_kernel(got.data(), tokens.data(), positions.data(), w, pos, N, 1.7f);
        });
        long wrong = 0;
        for (size_t i = 0; i < got.size(); i++) wrong += memcmp(&got[i], &want[i], sizeof(float)) != 0;
        printf("# embedding %-10s V %d C %d%s: %ld of %zu values differ\n", kind_names[kind], V, C,
               pos ? " + positions" : "", wrong, got.size());
        EXPECT(wrong == 0, "embedding %s%s: %ld values differ from the CPU op", kind_names[kind],
               pos ? " + positions" : "", wrong);
    }
    free_matrix(&table);
}

static void test_quantized_embedding(void) {
    check_embedding(Q8_0, 50, 96);
    check_embedding(Q4_0, 50, 96);
    check_embedding(NF4_DOUBLE, 50, 128);
    check_embedding(Q4_K, 50, 512);
    check_embedding(Q6_K, 50, 256);
    check_embedding(Q5_0, 50, 96);
    check_embedding(Q4_1, 50, 96);
    check_embedding(Q5_1, 50, 96);
    check_embedding(Q5_K, 50, 512);
    check_embedding(Q3_K, 50, 256);
    check_embedding(Q2_K, 50, 512);
    check_embedding(BF16, 50, 96);
    check_embedding(IQ4_NL, 50, 96);
}

// out[M, OC] = x . W^T + bias by the decode kernel, against the CPU op on the same blocks.
static void check_matvec(Kind kind, int M, int IC, int OC, bool with_bias) {
    Q8Matrix m = quantized_matrix(kind, OC, IC);
    const dequantize::Weights w = dequantize::weights_for(&m, nf4_dynamic_map());
    std::vector<float> x((size_t)M * IC), bias((size_t)OC), got((size_t)M * OC, NAN), want((size_t)M * OC);
    for (float &v : x) v = random_float(1.0f);
    for (float &v : bias) v = random_float(0.5f);
    const float *b = with_bias ? bias.data() : NULL;
    emulation::launch({matvec::blocks_for(OC), 1, 1}, matvec::THREADS, 0,
                      [&] { matvec::kernel(got.data(), x.data(), matvec::BlockWeights{w}, b, M, IC, OC); });
    ops_cpu.matmul_forward_dequantized(want.data(), x.data(), &m, b, M, IC, OC);
    std::vector<float> dequantized((size_t)OC * IC);
    quant_dequantize_rows(&m, 0, OC, dequantized.data());
    double worst = 0;
    for (int i = 0; i < M; i++)
        for (int o = 0; o < OC; o++) {
            double magnitude = 0; // sum |x| |w|: the scale of the sum's rounding
            for (int c = 0; c < IC; c++) magnitude += fabs((double)x[(size_t)i * IC + c] * dequantized[(size_t)o * IC + c]);
            const double error = fabs((double)got[(size_t)i * OC + o] - want[(size_t)i * OC + o]);
            worst = fmax(worst, error / (1e-5 * magnitude + 1e-30));
        }
    printf("# matvec %-14s M %d IC %4d OC %3d%s: worst error %.3g of the 1e-5 bound\n", kind_names[kind], M, IC, OC,
           with_bias ? " + bias" : "", worst);
    EXPECT(worst <= 1.0, "matvec %s M %d IC %d OC %d: error %.3g of the bound", kind_names[kind], M, IC, OC, worst);
    free_matrix(&m);
}

// Every type; one, three and eight input rows; rows of one block to many (the lanes' 256-value
// strides: IC below, at and above it); a column count the 4 warps of a block do not divide.
static void test_matvec(void) {
    for (int kind = 0; kind < kind_count; kind++) {
        const bool kquant = is_kquant(kind), nf4 = kind == NF4_SINGLE || kind == NF4_DOUBLE || kind == FP4_DOUBLE;
        const int small = kquant ? 256 : nf4 ? 64 : 32, large = kquant ? 768 : nf4 ? 640 : 320;
        check_matvec((Kind)kind, 1, small, 5, true);
        check_matvec((Kind)kind, 3, large, 6, false);
        check_matvec((Kind)kind, 8, large, 9, true);
    }
}

int main(void) {
    RUN(test_q8_0_tiles);
    RUN(test_q4_0_tiles);
    RUN(test_nf4_single_tiles);
    RUN(test_nf4_double_tiles);
    RUN(test_fp4_code_book_tiles);
    RUN(test_q4_k_tiles);
    RUN(test_q6_k_tiles);
    RUN(test_q5_0_tiles);
    RUN(test_q4_1_tiles);
    RUN(test_q5_1_tiles);
    RUN(test_q5_k_tiles);
    RUN(test_q3_k_tiles);
    RUN(test_q2_k_tiles);
    RUN(test_bf16_tiles);
    RUN(test_iq4_nl_tiles);
    RUN(test_quantized_embedding);
    RUN(test_matvec);
    TEST_EXIT();
}
