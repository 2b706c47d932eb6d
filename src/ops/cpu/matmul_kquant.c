// Decode steps over Q4_K, Q5_K, Q6_K, Q3_K and Q2_K weights held as the GGUF file's bytes (ops/kquant.h):
// llama.cpp's K-quant x Q8_K arithmetic. Each input row is quantized per block of 256 to
// int8 values, a float scale and the sums of each 16 values; each pair of super-blocks then
// gives exact integer sums,
//   Q4_K, Q5_K: products = sum_j sc[j] * (q . x over sub-block j),  minimums = sum_j m[j] * (x's sum over j)
//   Q6_K:       products = sum_g sc[g] * (q . x over group g - 32 * x's sum over g)
//   Q3_K:       products = sum_g sc[g] * (q . x over group g - 4 * x's sum over g)
//   Q2_K:       products = sum_g sc[g] * (q . x over group g), minimums = sum_g m[g] * (x's sum over g)
// and the pair adds x_scale * (d * products - dmin * minimums) (Q6_K, Q3_K: x_scale * d *
// products) to the output, super-blocks in order. Reading 4.5 (Q4_K), 5.5 (Q5_K), 6.6 (Q6_K),
// 3.4 (Q3_K) or 2.6 (Q2_K) bits a weight is what makes a decode step faster than Q8_0's 8.5.
// Q5_K is Q4_K with a fifth bit per code (q in [0, 31]): the same integer sums once the codes
// are widened, the same float steps. Q3_K and Q2_K share their 2-bit codes' layout; Q3_K adds
// a third bit per code (q in [0, 7], offset 4 as Q6_K's codes are by 32) and signed 6-bit
// scales per group of 16, Q2_K has 4-bit scales and minimums per group of 16 (Q4_K's form).
//
// Only the integer sums differ between the paths (AVX2 and AVX-512 multiply-adds, a portable
// loop for the sanitizer build and other CPUs), and integer sums are exact: the float
// arithmetic around them is the same scalar code in every path, so every path gives the
// same bits (tests/test_kquant.c).
//
// Batched decoding (2 to 63 input rows): a call takes one weight row against up to
// KQ_INPUT_ROWS input rows, decoding each super-block's scales and codes once (into
// registers) for all of them; each row keeps its own integer and float sums, so its output
// has the bits of a call of that row alone. Prefills (Q8_SGEMM_MIN_ROWS rows or more) and training
// go through the dequantized tiles of matmul_q8.c instead.
#include "ops/cpu/matmul_kquant.h"

#include <immintrin.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "core/check.h"
#include "core/sanitizer.h"
#include "ops/cpu/simd_paths.h"
#include "io/gguf_dequant.h"
#include "ops/cpu/ops_cpu.h"

// A block's half-float factor. With F16C (every path of a -march=native build on this
// machine, the portable loop included, so the paths still agree) one instruction; it and
// gguf_f16_to_f32 give the same float for every half but a signalling NaN, which F16C quiets.
static inline float half_at(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
#if defined(__F16C__)
    return _cvtsh_ss(h);
#else
    return gguf_f16_to_f32(h);
#endif
}

// The integer sums of one weight super-block against the matching block of `count` input
// rows (x[i]: 256 values, sums[i]: its 16 group sums), each row's into products[i] and
// minimums[i] (0 for Q6_K). The block's scales and codes are decoded once for all the rows.
// Entries of x and sums from count to KQ_INPUT_ROWS are valid pointers but not read: the
// loops over the rows run to the constant KQ_INPUT_ROWS, skipping rows past `count`, so the
// compiler unrolls them and keeps each row's vector sum in a register.
typedef void (*BlockSums)(const uint8_t *block, const int8_t *const x[KQ_INPUT_ROWS],
                          const int16_t *const sums[KQ_INPUT_ROWS], int count, int32_t products[KQ_INPUT_ROWS],
                          int32_t minimums[KQ_INPUT_ROWS]);

// Q4_K's and Q5_K's minimums term, the same in every path: sum_j m[j] * (x's sum over sub-block j).
static inline int32_t q4k_minimums(const int min[8], const int16_t *sums) {
    int32_t total = 0;
    for (int j = 0; j < 8; j++) total += min[j] * (sums[2 * j] + sums[2 * j + 1]);
    return total;
}

// Q3_K's sixteen 6-bit scales, unpacked from their 12 bytes four at a time (as 32-bit words),
// each less its offset of 32 left to the caller: scales 0-7 have their low 4 bits in the low
// nibbles of bytes 0-7, scales 8-15 in the high nibbles; the top 2 bits of scale k are bits
// 2 * (k / 4) of byte 8 + k % 4. word[w] holds scales 4w .. 4w + 3, one a byte (0 .. 63).
static inline void q3k_scale_words(const uint8_t *packed, uint32_t word[4]) {
    uint32_t low[2], top;
    memcpy(low, packed, 8);
    memcpy(&top, packed + 8, 4);
    const uint32_t nibbles = 0x0F0F0F0F, two_bits = 0x03030303;
    word[0] = (low[0] & nibbles) | (top & two_bits) << 4;
    word[1] = (low[1] & nibbles) | ((top >> 2) & two_bits) << 4;
    word[2] = ((low[0] >> 4) & nibbles) | ((top >> 4) & two_bits) << 4;
    word[3] = ((low[1] >> 4) & nibbles) | ((top >> 6) & two_bits) << 4;
}

// The super-blocks of a row, each row's float sum into sum[i]: x_scale * (d * products -
// dmin * minimums), d the half float at byte d_offset of a block, dmin the one at byte
// dmin_offset for the types with minimums (Q4_K, Q5_K, Q2_K); Q6_K and Q3_K have none (dmin
// and their minimums 0, which leaves d * products as it is: subtracting +0 is exact).
static inline __attribute__((always_inline)) void super_block_loop(BlockSums block_sums, long block_bytes,
                                                                   long d_offset, long dmin_offset, bool has_minimums,
                                                                   const uint8_t *row, const KQuantInput *x,
                                                                   int count, long cols, float sum[KQ_INPUT_ROWS]) {
    const int8_t *xb[KQ_INPUT_ROWS];
    const int16_t *sb[KQ_INPUT_ROWS];
    int32_t products[KQ_INPUT_ROWS], minimums[KQ_INPUT_ROWS];
    for (long b = 0; b < cols / KQ_BLOCK; b++) {
        const uint8_t *block = row + b * block_bytes;
        for (int i = 0; i < KQ_INPUT_ROWS; i++) { // rows past count point at row 0's (never read)
            const KQuantInput *input = &x[i < count ? i : 0];
            xb[i] = input->values + b * KQ_BLOCK, sb[i] = input->sums + b * 16;
        }
        block_sums(block, xb, sb, count, products, minimums);
        const float d = half_at(block + d_offset), dmin = has_minimums ? half_at(block + dmin_offset) : 0.0f;
        for (int i = 0; i < count; i++) sum[i] += x[i].scales[b] * (d * (float)products[i] - dmin * (float)minimums[i]);
    }
}

// The loop over a row's super-blocks, shared by every path (inlined into each with its own
// block sums, so the float arithmetic is the same code). Each input row's float sum takes
// the same steps as a call of that row alone: what the other rows of the call add is in
// their own sums.
static inline __attribute__((always_inline)) void rows_dot_loop(const BlockSums sums[5], QuantType type,
                                                                const uint8_t *row, const KQuantInput *x,
                                                                int count, long cols, float *out) {
    float sum[KQ_INPUT_ROWS] = {0};
    switch (type) {
    case QUANT_Q4_K: super_block_loop(sums[0], KQ_Q4_K_BYTES, 0, 2, true, row, x, count, cols, sum); break;
    case QUANT_Q5_K: super_block_loop(sums[1], KQ_Q5_K_BYTES, 0, 2, true, row, x, count, cols, sum); break;
    case QUANT_Q3_K: super_block_loop(sums[3], KQ_Q3_K_BYTES, 108, 0, false, row, x, count, cols, sum); break;
    case QUANT_Q2_K: super_block_loop(sums[4], KQ_Q2_K_BYTES, 80, 82, true, row, x, count, cols, sum); break;
    default: super_block_loop(sums[2], KQ_Q6_K_BYTES, 208, 0, false, row, x, count, cols, sum); break;
    }
    for (int i = 0; i < count; i++) out[i] = sum[i];
}

// One input row (a decode step of one sequence, the common case) is the loop with count the
// constant 1, so that the compiler drops the other rows' code and checks: it ran 1.5 times
// slower with count a variable. The bits are the same either way.
// `sums`: the path's block sums of Q4_K, Q5_K, Q6_K, Q3_K and Q2_K, in that order.
static inline __attribute__((always_inline)) void rows_dot_with(const BlockSums sums[5], QuantType type,
                                                                const uint8_t *row, const KQuantInput *x,
                                                                int count, long cols, float *out) {
    if (count == 1) rows_dot_loop(sums, type, row, x, 1, cols, out);
    else rows_dot_loop(sums, type, row, x, count, cols, out);
}

// ---- the portable loop ----
// Unchecked by the sanitizers access by access: cpu_matmul_kquant checks the whole ranges
// once per call (core/sanitizer.h), as matmul_q8.c's portable loop does. Each block's codes
// are decoded once into `q` and multiplied by every row from there.

// Q4_K's and Q5_K's sums from the block's codes q[32j + l] (value l of sub-block j) and its
// packed scales and minimums.
SANITIZER_UNCHECKED static inline void scale_min_sums_portable(const uint8_t *block, const uint8_t q[KQ_BLOCK],
                                                               const int8_t *const x[KQ_INPUT_ROWS],
                                                               const int16_t *const sums[KQ_INPUT_ROWS], int count,
                                                               int32_t products[KQ_INPUT_ROWS],
                                                               int32_t minimums[KQ_INPUT_ROWS]) {
    int scale[8], min[8];
    gguf_unpack_k_scales(block + 4, scale, min);
    for (int i = 0; i < count; i++) {
        int32_t total = 0;
        for (int j = 0; j < 8; j++) {
            int32_t dot = 0;
            for (int l = 0; l < 32; l++) dot += q[32 * j + l] * x[i][32 * j + l];
            total += scale[j] * dot;
        }
        products[i] = total;
        minimums[i] = q4k_minimums(min, sums[i]);
    }
}

SANITIZER_UNCHECKED static void q4k_sums_portable(const uint8_t *block, const int8_t *const x[KQ_INPUT_ROWS],
                                                  const int16_t *const sums[KQ_INPUT_ROWS], int count,
                                                  int32_t products[KQ_INPUT_ROWS], int32_t minimums[KQ_INPUT_ROWS]) {
    uint8_t q[KQ_BLOCK];
    for (int j = 0; j < 8; j++) {
        const uint8_t *bytes = block + 16 + 32 * (j / 2);
        const int shift = 4 * (j % 2);
        for (int l = 0; l < 32; l++) q[32 * j + l] = (bytes[l] >> shift) & 0x0F;
    }
    scale_min_sums_portable(block, q, x, sums, count, products, minimums);
}

// Q5_K: Q4_K's nibbles 32 bytes later, each code's fifth bit from bit j of qh byte l.
SANITIZER_UNCHECKED static void q5k_sums_portable(const uint8_t *block, const int8_t *const x[KQ_INPUT_ROWS],
                                                  const int16_t *const sums[KQ_INPUT_ROWS], int count,
                                                  int32_t products[KQ_INPUT_ROWS], int32_t minimums[KQ_INPUT_ROWS]) {
    const uint8_t *high_bits = block + 16;
    uint8_t q[KQ_BLOCK];
    for (int j = 0; j < 8; j++) {
        const uint8_t *bytes = block + 48 + 32 * (j / 2);
        const int shift = 4 * (j % 2);
        for (int l = 0; l < 32; l++) q[32 * j + l] = (uint8_t)(((bytes[l] >> shift) & 0x0F) | ((high_bits[l] >> j) & 1) << 4);
    }
    scale_min_sums_portable(block, q, x, sums, count, products, minimums);
}

SANITIZER_UNCHECKED static void q6k_sums_portable(const uint8_t *block, const int8_t *const x[KQ_INPUT_ROWS],
                                                  const int16_t *const sums[KQ_INPUT_ROWS], int count,
                                                  int32_t products[KQ_INPUT_ROWS], int32_t minimums[KQ_INPUT_ROWS]) {
    const uint8_t *low_bits = block, *high_bits = block + 128;
    const int8_t *scales = (const int8_t *)(block + 192);
    uint8_t q[KQ_BLOCK];
    for (int v = 0; v < KQ_BLOCK; v++) {
        const int half = v / 128, r = v % 128;
        const int low = (low_bits[half * 64 + r % 64] >> (4 * (r / 64))) & 0x0F;
        const int high = (high_bits[half * 32 + r % 32] >> (2 * (r / 32))) & 3;
        q[v] = (uint8_t)(low | high << 4);
    }
    for (int i = 0; i < count; i++) {
        int32_t total = 0;
        for (int g = 0; g < 16; g++) {
            int32_t dot = 0;
            for (int v = 16 * g; v < 16 * g + 16; v++) dot += q[v] * x[i][v];
            total += scales[g] * (dot - 32 * sums[i][g]);
        }
        products[i] = total;
        minimums[i] = 0;
    }
}

// Q3_K's and Q2_K's 2-bit codes (`bytes`, 64 of them): value v's bits 2 * ((v % 128) / 32) of
// byte 32 * (v / 128) + v % 32.
static inline int two_bit_code(const uint8_t *bytes, int v) {
    return (bytes[32 * (v / 128) + v % 32] >> (2 * ((v % 128) / 32))) & 3;
}

// Q3_K: the 2-bit codes with their third bit (bit v / 32 of hmask byte v % 32), q in [0, 7]
// for the value q - 4, and the signed scales sc - 32.
SANITIZER_UNCHECKED static void q3k_sums_portable(const uint8_t *block, const int8_t *const x[KQ_INPUT_ROWS],
                                                  const int16_t *const sums[KQ_INPUT_ROWS], int count,
                                                  int32_t products[KQ_INPUT_ROWS], int32_t minimums[KQ_INPUT_ROWS]) {
    const uint8_t *high_bits = block, *low_bits = block + 32;
    uint32_t words[4];
    q3k_scale_words(block + 96, words);
    uint8_t scale_bytes[16];
    memcpy(scale_bytes, words, sizeof scale_bytes);
    uint8_t q[KQ_BLOCK];
    for (int v = 0; v < KQ_BLOCK; v++) q[v] = (uint8_t)(two_bit_code(low_bits, v) | ((high_bits[v % 32] >> (v / 32)) & 1) << 2);
    for (int i = 0; i < count; i++) {
        int32_t total = 0;
        for (int g = 0; g < 16; g++) {
            int32_t dot = 0;
            for (int v = 16 * g; v < 16 * g + 16; v++) dot += q[v] * x[i][v];
            total += (scale_bytes[g] - 32) * (dot - 4 * sums[i][g]);
        }
        products[i] = total;
        minimums[i] = 0;
    }
}

// Q2_K: the 2-bit codes, a 4-bit scale (low nibble) and minimum (high nibble) per group of 16.
SANITIZER_UNCHECKED static void q2k_sums_portable(const uint8_t *block, const int8_t *const x[KQ_INPUT_ROWS],
                                                  const int16_t *const sums[KQ_INPUT_ROWS], int count,
                                                  int32_t products[KQ_INPUT_ROWS], int32_t minimums[KQ_INPUT_ROWS]) {
    const uint8_t *scales = block, *codes = block + 16;
    uint8_t q[KQ_BLOCK];
    for (int v = 0; v < KQ_BLOCK; v++) q[v] = (uint8_t)two_bit_code(codes, v);
    for (int i = 0; i < count; i++) {
        int32_t total = 0, minimum = 0;
        for (int g = 0; g < 16; g++) {
            int32_t dot = 0;
            for (int v = 16 * g; v < 16 * g + 16; v++) dot += q[v] * x[i][v];
            total += (scales[g] & 0x0F) * dot;
            minimum += (scales[g] >> 4) * sums[i][g];
        }
        products[i] = total;
        minimums[i] = minimum;
    }
}

void kquant_rows_dot_portable(QuantType type, const uint8_t *row, const KQuantInput *x, int count, long cols,
                              float *out) {
    static const BlockSums sums[5] = {q4k_sums_portable, q5k_sums_portable, q6k_sums_portable, q3k_sums_portable,
                                      q2k_sums_portable};
    rows_dot_with(sums, type, row, x, count, cols, out);
}

// ---- AVX2 ----
#if defined(__AVX2__)
// The 12 bytes of a Q4_K block's six-bit scales and minimums unpacked as 16 bytes, scales
// 0-7 then minimums 0-7 (the layout gguf_unpack_k_scales reads a byte at a time), as three
// 32-bit words: bytes 0-3 hold scales 0-3 in their low 6 bits and the top 2 bits of scales
// 4-7, bytes 4-7 minimums 0-3 and the top bits of minimums 4-7, bytes 8-11 the low 4 bits of
// scales 4-7 (low nibbles) and of minimums 4-7 (high nibbles).
static inline __m128i unpack_k_scales_vector(const uint8_t *packed) {
    uint32_t word[3];
    memcpy(word, packed, sizeof word);
    const uint32_t six_bits = 0x3F3F3F3F, low_nibbles = 0x0F0F0F0F, two_bits = 0x03030303;
    const uint32_t scales_0_3 = word[0] & six_bits, mins_0_3 = word[1] & six_bits;
    const uint32_t scales_4_7 = (word[2] & low_nibbles) | ((word[0] >> 6) & two_bits) << 4;
    const uint32_t mins_4_7 = ((word[2] >> 4) & low_nibbles) | ((word[1] >> 6) & two_bits) << 4;
    return _mm_set_epi32((int)mins_4_7, (int)mins_0_3, (int)scales_4_7, (int)scales_0_3);
}

// The sums of 8 int32 `products` and of 8 int32 `minimums` at once.
static inline void horizontal_sums_pair(__m256i products, __m256i minimums, int32_t *product_sum, int32_t *minimum_sum) {
    const __m256i pairs = _mm256_hadd_epi32(products, minimums); // p01 p23 m01 m23 | p45 p67 m45 m67
    const __m128i quads = _mm_add_epi32(_mm256_castsi256_si128(pairs), _mm256_extracti128_si256(pairs, 1));
    const __m128i totals = _mm_hadd_epi32(quads, quads); // P M P M
    *product_sum = _mm_cvtsi128_si32(totals);
    *minimum_sum = _mm_extract_epi32(totals, 1);
}

// Q4_K's (and Q5_K's) minimums for each row: minimum j (twice, as int16: `minimums16`, from the block's
// unpacked scale bytes) times the sums of 16 inputs 2j and 2j + 1, then the rows' sums of
// `totals` (8 int32 lanes of scaled code products each).
static inline void q4k_finish(__m128i scale_bytes, const __m256i totals[KQ_INPUT_ROWS],
                              const int16_t *const sums[KQ_INPUT_ROWS], int count, int32_t products[KQ_INPUT_ROWS],
                              int32_t minimums[KQ_INPUT_ROWS]) {
    const __m256i minimums16 = _mm256_cvtepu8_epi16(_mm_unpackhi_epi8(scale_bytes, scale_bytes));
    for (int i = 0; i < KQ_INPUT_ROWS; i++)
        if (i < count) {
            const __m256i min_terms = _mm256_madd_epi16(minimums16, _mm256_loadu_si256((const __m256i *)sums[i]));
            horizontal_sums_pair(totals[i], min_terms, &products[i], &minimums[i]);
        }
}

// Q6_K's (code_offset 32) and Q3_K's (4) super-block sums from the scaled code products in
// `totals` (8 int32 lanes each): their sum less the codes' offset, folded in through each
// row's group sums, sum_g sc[g] * sums[g] (`scales16`: the 16 signed group scales). (Neither
// type has minimums.)
static inline void offset_finish(const __m256i totals[KQ_INPUT_ROWS], __m256i scales16, int code_offset,
                                 const int16_t *const sums[KQ_INPUT_ROWS], int count, int32_t products[KQ_INPUT_ROWS],
                                 int32_t minimums[KQ_INPUT_ROWS]) {
    for (int i = 0; i < KQ_INPUT_ROWS; i++)
        if (i < count) {
            const __m256i offset_terms = _mm256_madd_epi16(scales16, _mm256_loadu_si256((const __m256i *)sums[i]));
            int32_t product_sum, offset;
            horizontal_sums_pair(totals[i], offset_terms, &product_sum, &offset);
            products[i] = product_sum - code_offset * offset;
            minimums[i] = 0;
        }
}

// Q6_K's: its 16 scales are the block's bytes 192-207.
static inline void q6k_finish(const __m256i totals[KQ_INPUT_ROWS], const int8_t *scales,
                              const int16_t *const sums[KQ_INPUT_ROWS], int count, int32_t products[KQ_INPUT_ROWS],
                              int32_t minimums[KQ_INPUT_ROWS]) {
    const __m256i scales16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)scales));
    offset_finish(totals, scales16, 32, sums, count, products, minimums);
}

// Q2_K's minimums for each row: the 16 group minimums (`minimums8`, one a byte) times the
// row's 16 group sums, with the rows' sums of `totals` (8 int32 lanes of scaled code products
// each).
static inline void q2k_finish(__m128i minimums8, const __m256i totals[KQ_INPUT_ROWS],
                              const int16_t *const sums[KQ_INPUT_ROWS], int count, int32_t products[KQ_INPUT_ROWS],
                              int32_t minimums[KQ_INPUT_ROWS]) {
    const __m256i minimums16 = _mm256_cvtepu8_epi16(minimums8);
    for (int i = 0; i < KQ_INPUT_ROWS; i++)
        if (i < count) {
            const __m256i min_terms = _mm256_madd_epi16(minimums16, _mm256_loadu_si256((const __m256i *)sums[i]));
            horizontal_sums_pair(totals[i], min_terms, &products[i], &minimums[i]);
        }
}

// A Q3_K block's 16 scales (sc - 32, signed) or a Q2_K block's 16 scales (low nibbles, 0-15)
// as bytes, and Q2_K's 16 minimums (high nibbles; zero for Q3_K).
static inline void two_bit_scales(const uint8_t *block, bool q3k, __m128i *scales8, __m128i *minimums8) {
    if (q3k) {
        uint32_t words[4];
        q3k_scale_words(block + 96, words); // as a vector from registers: a load of the four stores would stall
        const __m128i scales = _mm_set_epi32((int)words[3], (int)words[2], (int)words[1], (int)words[0]);
        *scales8 = _mm_sub_epi8(scales, _mm_set1_epi8(32));
        *minimums8 = _mm_setzero_si128();
    } else {
        const __m128i packed = _mm_loadu_si128((const __m128i *)block), nibble = _mm_set1_epi8(0x0F);
        *scales8 = _mm_and_si128(packed, nibble);
        *minimums8 = _mm_and_si128(_mm_srli_epi16(packed, 4), nibble);
    }
}

// 32 unsigned codes times 32 int8 inputs, pairs added in int16 (Q4_K: at most 2 * 15 * 127;
// Q5_K: 2 * 31 * 127; Q6_K: 2 * 63 * 127, all below 32767), then multiplied by the scales in
// `scale` (one int16 per pair, at most 63 or 128 in magnitude) and added in pairs into 8 int32
// lanes.
static inline __m256i scaled_dot(__m256i codes, const int8_t *x, __m256i scale) {
    const __m256i pairs = _mm256_maddubs_epi16(codes, _mm256_loadu_si256((const __m256i *)x));
    return _mm256_madd_epi16(pairs, scale);
}

// Q5_K's fifth bits of sub-block j as 0x10 in each byte l: bit j of byte l of `high_bits`
// (the block's 32 qh bytes) moved to bit 4. The 16-bit shift moves each byte's bit j to bit 4
// of the same byte (j < 8), whatever crosses from the neighbouring byte is masked off.
static inline __m256i q5k_fifth_bits(__m256i high_bits, int j) {
    const __m256i moved = j <= 4 ? _mm256_slli_epi16(high_bits, 4 - j) : _mm256_srli_epi16(high_bits, j - 4);
    return _mm256_and_si256(moved, _mm256_set1_epi8(0x10));
}

// Q4_K's sums, and Q5_K's (five_bits: the nibbles 32 bytes later, each code with its fifth
// bit from qh). Inlined with five_bits a constant, so Q4_K's code has no fifth-bit work.
static inline __attribute__((always_inline)) void scale_min_sums_avx2(
    const uint8_t *block, bool five_bits, const int8_t *const x[KQ_INPUT_ROWS],
    const int16_t *const sums[KQ_INPUT_ROWS], int count, int32_t products[KQ_INPUT_ROWS],
    int32_t minimums[KQ_INPUT_ROWS]) {
    const __m128i scale_bytes = unpack_k_scales_vector(block + 4);
    uint8_t scale[16];
    _mm_storeu_si128((__m128i *)scale, scale_bytes);
    const __m256i nibble = _mm256_set1_epi8(0x0F);
    const __m256i high_bits = five_bits ? _mm256_loadu_si256((const __m256i *)(block + 16)) : _mm256_setzero_si256();
    const uint8_t *nibbles = block + (five_bits ? 48 : 16);
    __m256i totals[KQ_INPUT_ROWS];
    for (int i = 0; i < KQ_INPUT_ROWS; i++) totals[i] = _mm256_setzero_si256();
    for (int k = 0; k < 4; k++) { // 32 bytes: sub-block 2k in the low nibbles, 2k + 1 in the high
        const __m256i bytes = _mm256_loadu_si256((const __m256i *)(nibbles + 32 * k));
        __m256i low = _mm256_and_si256(bytes, nibble);
        __m256i high = _mm256_and_si256(_mm256_srli_epi16(bytes, 4), nibble);
        if (five_bits) {
            low = _mm256_or_si256(low, q5k_fifth_bits(high_bits, 2 * k));
            high = _mm256_or_si256(high, q5k_fifth_bits(high_bits, 2 * k + 1));
        }
        const __m256i low_scale = _mm256_set1_epi16((int16_t)scale[2 * k]);
        const __m256i high_scale = _mm256_set1_epi16((int16_t)scale[2 * k + 1]);
        for (int i = 0; i < KQ_INPUT_ROWS; i++)
            if (i < count) {
                totals[i] = _mm256_add_epi32(totals[i], scaled_dot(low, x[i] + 64 * k, low_scale));
                totals[i] = _mm256_add_epi32(totals[i], scaled_dot(high, x[i] + 64 * k + 32, high_scale));
            }
    }
    q4k_finish(scale_bytes, totals, sums, count, products, minimums);
}

static inline void q4k_sums_avx2(const uint8_t *block, const int8_t *const x[KQ_INPUT_ROWS],
                                 const int16_t *const sums[KQ_INPUT_ROWS], int count, int32_t products[KQ_INPUT_ROWS],
                                 int32_t minimums[KQ_INPUT_ROWS]) {
    scale_min_sums_avx2(block, false, x, sums, count, products, minimums);
}

static inline void q5k_sums_avx2(const uint8_t *block, const int8_t *const x[KQ_INPUT_ROWS],
                                 const int16_t *const sums[KQ_INPUT_ROWS], int count, int32_t products[KQ_INPUT_ROWS],
                                 int32_t minimums[KQ_INPUT_ROWS]) {
    scale_min_sums_avx2(block, true, x, sums, count, products, minimums);
}

static inline void q6k_sums_avx2(const uint8_t *block, const int8_t *const x[KQ_INPUT_ROWS],
                                 const int16_t *const sums[KQ_INPUT_ROWS], int count, int32_t products[KQ_INPUT_ROWS],
                                 int32_t minimums[KQ_INPUT_ROWS]) {
    const int8_t *scales = (const int8_t *)(block + 192);
    const __m256i nibble = _mm256_set1_epi8(0x0F), two_bits = _mm256_set1_epi8(3);
    __m256i totals[KQ_INPUT_ROWS];
    for (int i = 0; i < KQ_INPUT_ROWS; i++) totals[i] = _mm256_setzero_si256();
    for (int half = 0; half < 2; half++) {
        // Values 128 * half + r: r in [0, 32) low nibbles of low0 with bits 0-1 of high,
        // [32, 64) low nibbles of low1 with bits 2-3, [64, 96) high nibbles of low0 with bits
        // 4-5, [96, 128) high nibbles of low1 with bits 6-7.
        const __m256i low0 = _mm256_loadu_si256((const __m256i *)(block + 64 * half));
        const __m256i low1 = _mm256_loadu_si256((const __m256i *)(block + 64 * half + 32));
        const __m256i high = _mm256_loadu_si256((const __m256i *)(block + 128 + 32 * half));
        const __m256i low_parts[4] = {_mm256_and_si256(low0, nibble), _mm256_and_si256(low1, nibble),
                                      _mm256_and_si256(_mm256_srli_epi16(low0, 4), nibble),
                                      _mm256_and_si256(_mm256_srli_epi16(low1, 4), nibble)};
        for (int s = 0; s < 4; s++) {
            const __m256i top = _mm256_and_si256(_mm256_srli_epi16(high, 2 * s), two_bits);
            const __m256i codes = _mm256_or_si256(low_parts[s], _mm256_slli_epi16(top, 4));
            // Groups g and g + 1: the first 16 values' pairs sit in the low 128 bits.
            const int g = 8 * half + 2 * s;
            const __m256i scale = _mm256_set_m128i(_mm_set1_epi16(scales[g + 1]), _mm_set1_epi16(scales[g]));
            for (int i = 0; i < KQ_INPUT_ROWS; i++)
                if (i < count) totals[i] = _mm256_add_epi32(totals[i], scaled_dot(codes, x[i] + 128 * half + 32 * s, scale));
        }
    }
    q6k_finish(totals, scales, sums, count, products, minimums);
}

// Q3_K's sums, and Q2_K's (q3k false): 32 2-bit codes a step, values 128h + 32j + [0, 32) in
// bits 2j of the 32 bytes of half h (a 16-bit shift right by 2j, what it brings in from the
// other byte masked off), Q3_K's with their third bit (bit 4h + j of hmask's 32 bytes, moved
// to bit 2 as Q5_K's fifth bits are to bit 4). Each step is groups g = 8h + 2j and g + 1.
// Inlined with q3k a constant.
static inline __attribute__((always_inline)) void two_bit_sums_avx2(
    const uint8_t *block, bool q3k, const int8_t *const x[KQ_INPUT_ROWS], const int16_t *const sums[KQ_INPUT_ROWS],
    int count, int32_t products[KQ_INPUT_ROWS], int32_t minimums[KQ_INPUT_ROWS]) {
    __m128i scales8, minimums8;
    two_bit_scales(block, q3k, &scales8, &minimums8);
    int8_t scale[16];
    _mm_storeu_si128((__m128i *)scale, scales8);
    const __m256i two_bits = _mm256_set1_epi8(3);
    const __m256i high_bits = q3k ? _mm256_loadu_si256((const __m256i *)block) : _mm256_setzero_si256();
    const uint8_t *low_bits = block + (q3k ? 32 : 16);
    __m256i totals[KQ_INPUT_ROWS];
    for (int i = 0; i < KQ_INPUT_ROWS; i++) totals[i] = _mm256_setzero_si256();
    for (int half = 0; half < 2; half++) {
        const __m256i bytes = _mm256_loadu_si256((const __m256i *)(low_bits + 32 * half));
        for (int j = 0; j < 4; j++) {
            __m256i codes = _mm256_and_si256(_mm256_srli_epi16(bytes, 2 * j), two_bits);
            if (q3k) {
                const int bit = 4 * half + j;
                const __m256i moved = bit <= 2 ? _mm256_slli_epi16(high_bits, 2 - bit) : _mm256_srli_epi16(high_bits, bit - 2);
                codes = _mm256_or_si256(codes, _mm256_and_si256(moved, _mm256_set1_epi8(4)));
            }
            const int g = 8 * half + 2 * j;
            const __m256i group_scale = _mm256_set_m128i(_mm_set1_epi16(scale[g + 1]), _mm_set1_epi16(scale[g]));
            for (int i = 0; i < KQ_INPUT_ROWS; i++)
                if (i < count)
                    totals[i] = _mm256_add_epi32(totals[i], scaled_dot(codes, x[i] + 128 * half + 32 * j, group_scale));
        }
    }
    if (q3k) offset_finish(totals, _mm256_cvtepi8_epi16(scales8), 4, sums, count, products, minimums);
    else q2k_finish(minimums8, totals, sums, count, products, minimums);
}

static inline void q3k_sums_avx2(const uint8_t *block, const int8_t *const x[KQ_INPUT_ROWS],
                                 const int16_t *const sums[KQ_INPUT_ROWS], int count, int32_t products[KQ_INPUT_ROWS],
                                 int32_t minimums[KQ_INPUT_ROWS]) {
    two_bit_sums_avx2(block, true, x, sums, count, products, minimums);
}

static inline void q2k_sums_avx2(const uint8_t *block, const int8_t *const x[KQ_INPUT_ROWS],
                                 const int16_t *const sums[KQ_INPUT_ROWS], int count, int32_t products[KQ_INPUT_ROWS],
                                 int32_t minimums[KQ_INPUT_ROWS]) {
    two_bit_sums_avx2(block, false, x, sums, count, products, minimums);
}

static void rows_dot_avx2(QuantType type, const uint8_t *row, const KQuantInput *x, int count, long cols, float *out) {
    static const BlockSums sums[5] = {q4k_sums_avx2, q5k_sums_avx2, q6k_sums_avx2, q3k_sums_avx2, q2k_sums_avx2};
    rows_dot_with(sums, type, row, x, count, cols, out);
}
const KQuantRowsDot kquant_rows_dot_avx2 = rows_dot_avx2;
#else
const KQuantRowsDot kquant_rows_dot_avx2 = NULL;
#endif

// ---- AVX-512 (BW for the byte and word multiply-adds, VNNI for vpdpwssd) ----
// 64 values a step: the AVX2 path's products twice as wide, the scaled pairs added straight
// into the int32 lanes (vpdpwssd).
#if SIMD_HAS_AVX512
// A row's 16 int32 lanes folded to the AVX2 path's 8.
static inline __m256i fold_halves(__m512i total) {
    return _mm256_add_epi32(_mm512_castsi512_si256(total), _mm512_extracti64x4_epi64(total, 1));
}

// Q4_K's sums, and Q5_K's (five_bits: the nibbles 32 bytes later, each code's fifth bit from
// the qh bytes, the same 32 in both halves of a step: bit 2k of byte l for the low half, bit
// 2k + 1 for the high, moved to bit 4). Inlined with five_bits a constant.
static inline __attribute__((always_inline)) void scale_min_sums_avx512(
    const uint8_t *block, bool five_bits, const int8_t *const x[KQ_INPUT_ROWS],
    const int16_t *const sums[KQ_INPUT_ROWS], int count, int32_t products[KQ_INPUT_ROWS],
    int32_t minimums[KQ_INPUT_ROWS]) {
    const __m128i scale_bytes = unpack_k_scales_vector(block + 4);
    // Each sub-block scale as int16, picked for a step's two sub-blocks by vpermw: step k's
    // low 256 bits take scale 2k, its high 256 scale 2k + 1.
    const __m512i scales16 = _mm512_castsi256_si512(_mm256_cvtepu8_epi16(scale_bytes));
    const __m256i nibble = _mm256_set1_epi8(0x0F);
    const __m512i high_bits =
        five_bits ? _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(block + 16))) : _mm512_setzero_si512();
    const uint8_t *nibbles = block + (five_bits ? 48 : 16);
    __m512i totals[KQ_INPUT_ROWS];
    for (int i = 0; i < KQ_INPUT_ROWS; i++) totals[i] = _mm512_setzero_si512();
    for (int k = 0; k < 4; k++) { // sub-blocks 2k (low nibbles) and 2k + 1 (high): values [64k, 64k + 64)
        const __m256i bytes = _mm256_loadu_si256((const __m256i *)(nibbles + 32 * k));
        __m512i codes = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_and_si256(bytes, nibble)),
                                           _mm256_and_si256(_mm256_srli_epi16(bytes, 4), nibble), 1);
        const __m512i pick = _mm512_inserti64x4(_mm512_set1_epi16((short)(2 * k)), _mm256_set1_epi16((short)(2 * k + 1)), 1);
        if (five_bits) // shifted right by the sub-block, then left by 4 (16-bit shifts; what they bring in from the other byte is masked)
            codes = _mm512_or_si512(codes, _mm512_and_si512(_mm512_slli_epi16(_mm512_srlv_epi16(high_bits, pick), 4),
                                                            _mm512_set1_epi8(0x10)));
        const __m512i scale = _mm512_permutexvar_epi16(pick, scales16);
        for (int i = 0; i < KQ_INPUT_ROWS; i++)
            if (i < count) {
                const __m512i pairs = _mm512_maddubs_epi16(codes, _mm512_loadu_si512(x[i] + 64 * k));
                totals[i] = _mm512_dpwssd_epi32(totals[i], pairs, scale);
            }
    }
    __m256i halves[KQ_INPUT_ROWS];
    for (int i = 0; i < KQ_INPUT_ROWS; i++) halves[i] = fold_halves(totals[i]);
    q4k_finish(scale_bytes, halves, sums, count, products, minimums);
}

static inline void q4k_sums_avx512(const uint8_t *block, const int8_t *const x[KQ_INPUT_ROWS],
                                   const int16_t *const sums[KQ_INPUT_ROWS], int count,
                                   int32_t products[KQ_INPUT_ROWS], int32_t minimums[KQ_INPUT_ROWS]) {
    scale_min_sums_avx512(block, false, x, sums, count, products, minimums);
}

static inline void q5k_sums_avx512(const uint8_t *block, const int8_t *const x[KQ_INPUT_ROWS],
                                   const int16_t *const sums[KQ_INPUT_ROWS], int count,
                                   int32_t products[KQ_INPUT_ROWS], int32_t minimums[KQ_INPUT_ROWS]) {
    scale_min_sums_avx512(block, true, x, sums, count, products, minimums);
}

static inline void q6k_sums_avx512(const uint8_t *block, const int8_t *const x[KQ_INPUT_ROWS],
                                   const int16_t *const sums[KQ_INPUT_ROWS], int count,
                                   int32_t products[KQ_INPUT_ROWS], int32_t minimums[KQ_INPUT_ROWS]) {
    const int8_t *scales = (const int8_t *)(block + 192);
    const __m512i nibble = _mm512_set1_epi8(0x0F), two_bits = _mm512_set1_epi8(3);
    const __m512i scales16 = _mm512_castsi256_si512(_mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)scales)));
    // Each 128-bit lane of int16 pairs is one group of 16 values: lane i takes group g + i's scale.
    const __m512i spread = _mm512_set_epi16(3, 3, 3, 3, 3, 3, 3, 3, 2, 2, 2, 2, 2, 2, 2, 2, 1, 1, 1, 1, 1, 1, 1, 1,
                                            0, 0, 0, 0, 0, 0, 0, 0);
    // The high bits of values r (r / 32 = 0..3) sit at bits 2 * (r / 32) of qh's byte r % 32.
    const __m512i first_shifts = _mm512_set_epi64(2, 2, 2, 2, 0, 0, 0, 0);
    const __m512i second_shifts = _mm512_set_epi64(6, 6, 6, 6, 4, 4, 4, 4);
    __m512i totals[KQ_INPUT_ROWS];
    for (int i = 0; i < KQ_INPUT_ROWS; i++) totals[i] = _mm512_setzero_si512();
    for (int half = 0; half < 2; half++) {
        const __m512i low = _mm512_loadu_si512(block + 64 * half); // low nibbles: values 0-63, high: 64-127
        const __m512i high = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(block + 128 + 32 * half)));
        const __m512i codes[2] = {
            _mm512_or_si512(_mm512_and_si512(low, nibble),
                            _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi64(high, first_shifts), two_bits), 4)),
            _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(low, 4), nibble),
                            _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi64(high, second_shifts), two_bits), 4))};
        for (int s = 0; s < 2; s++) {
            const int g = 8 * half + 4 * s;
            const __m512i group_scales = _mm512_permutexvar_epi16(_mm512_add_epi16(spread, _mm512_set1_epi16((short)g)), scales16);
            for (int i = 0; i < KQ_INPUT_ROWS; i++)
                if (i < count) {
                    const __m512i pairs = _mm512_maddubs_epi16(codes[s], _mm512_loadu_si512(x[i] + 128 * half + 64 * s));
                    totals[i] = _mm512_dpwssd_epi32(totals[i], pairs, group_scales);
                }
        }
    }
    __m256i halves[KQ_INPUT_ROWS];
    for (int i = 0; i < KQ_INPUT_ROWS; i++) halves[i] = fold_halves(totals[i]);
    q6k_finish(halves, scales, sums, count, products, minimums);
}

// Q3_K's sums, and Q2_K's (q3k false): the AVX2 path's steps two at a time, 64 values
// 128h + 64s + [0, 64): the half's 32 code bytes in both 256-bit halves, shifted right by 4s
// in the low one and 4s + 2 in the high one (64-bit shifts; what comes in from the next byte
// is masked off), Q3_K's third bits likewise from bits 4h + 2s and 4h + 2s + 1 of hmask's
// bytes. Each 128-bit lane of pairs is one group of 16 values, g = 8h + 4s + lane, its scale
// picked by vpermw as Q6_K's are. Inlined with q3k a constant.
static inline __attribute__((always_inline)) void two_bit_sums_avx512(
    const uint8_t *block, bool q3k, const int8_t *const x[KQ_INPUT_ROWS], const int16_t *const sums[KQ_INPUT_ROWS],
    int count, int32_t products[KQ_INPUT_ROWS], int32_t minimums[KQ_INPUT_ROWS]) {
    __m128i scales8, minimums8;
    two_bit_scales(block, q3k, &scales8, &minimums8);
    const __m256i scales16_256 = q3k ? _mm256_cvtepi8_epi16(scales8) : _mm256_cvtepu8_epi16(scales8);
    const __m512i scales16 = _mm512_castsi256_si512(scales16_256);
    const __m512i spread = _mm512_set_epi16(3, 3, 3, 3, 3, 3, 3, 3, 2, 2, 2, 2, 2, 2, 2, 2, 1, 1, 1, 1, 1, 1, 1, 1,
                                            0, 0, 0, 0, 0, 0, 0, 0);
    const __m512i two_bits = _mm512_set1_epi8(3), one_bit = _mm512_set1_epi8(1);
    const __m512i high_bits =
        q3k ? _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)block)) : _mm512_setzero_si512();
    const uint8_t *low_bits = block + (q3k ? 32 : 16);
    __m512i totals[KQ_INPUT_ROWS];
    for (int i = 0; i < KQ_INPUT_ROWS; i++) totals[i] = _mm512_setzero_si512();
    for (int half = 0; half < 2; half++) {
        const __m512i bytes = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(low_bits + 32 * half)));
        for (int s = 0; s < 2; s++) {
            const long low = 4 * s, high = 4 * s + 2;
            __m512i codes = _mm512_and_si512(
                _mm512_srlv_epi64(bytes, _mm512_set_epi64(high, high, high, high, low, low, low, low)), two_bits);
            if (q3k) {
                const long bit_low = 4 * half + 2 * s, bit_high = bit_low + 1;
                const __m512i third = _mm512_and_si512(
                    _mm512_srlv_epi64(high_bits,
                                      _mm512_set_epi64(bit_high, bit_high, bit_high, bit_high, bit_low, bit_low, bit_low, bit_low)),
                    one_bit);
                codes = _mm512_or_si512(codes, _mm512_slli_epi16(third, 2)); // each byte 0 or 1: no carry between bytes
            }
            const int g = 8 * half + 4 * s;
            const __m512i group_scales = _mm512_permutexvar_epi16(_mm512_add_epi16(spread, _mm512_set1_epi16((short)g)), scales16);
            for (int i = 0; i < KQ_INPUT_ROWS; i++)
                if (i < count) {
                    const __m512i pairs = _mm512_maddubs_epi16(codes, _mm512_loadu_si512(x[i] + 128 * half + 64 * s));
                    totals[i] = _mm512_dpwssd_epi32(totals[i], pairs, group_scales);
                }
        }
    }
    __m256i halves[KQ_INPUT_ROWS];
    for (int i = 0; i < KQ_INPUT_ROWS; i++) halves[i] = fold_halves(totals[i]);
    if (q3k) offset_finish(halves, scales16_256, 4, sums, count, products, minimums);
    else q2k_finish(minimums8, halves, sums, count, products, minimums);
}

static inline void q3k_sums_avx512(const uint8_t *block, const int8_t *const x[KQ_INPUT_ROWS],
                                   const int16_t *const sums[KQ_INPUT_ROWS], int count,
                                   int32_t products[KQ_INPUT_ROWS], int32_t minimums[KQ_INPUT_ROWS]) {
    two_bit_sums_avx512(block, true, x, sums, count, products, minimums);
}

static inline void q2k_sums_avx512(const uint8_t *block, const int8_t *const x[KQ_INPUT_ROWS],
                                   const int16_t *const sums[KQ_INPUT_ROWS], int count,
                                   int32_t products[KQ_INPUT_ROWS], int32_t minimums[KQ_INPUT_ROWS]) {
    two_bit_sums_avx512(block, false, x, sums, count, products, minimums);
}

static void rows_dot_avx512(QuantType type, const uint8_t *row, const KQuantInput *x, int count, long cols,
                            float *out) {
    static const BlockSums sums[5] = {q4k_sums_avx512, q5k_sums_avx512, q6k_sums_avx512, q3k_sums_avx512,
                                      q2k_sums_avx512};
    rows_dot_with(sums, type, row, x, count, cols, out);
}
const KQuantRowsDot kquant_rows_dot_avx512 = rows_dot_avx512;
#else
const KQuantRowsDot kquant_rows_dot_avx512 = NULL;
#endif

const KQuantRowsDot kquant_rows_dot_best = SIMD_BEST(rows_dot_avx512, rows_dot_avx2, kquant_rows_dot_portable);
const char *const kquant_best_path_name = SIMD_BEST_NAME;

void cpu_matmul_kquant(float *out, const float *inp, const Q8Matrix *weight, const float *bias, int N, int IC,
                       int OC) {
    CHECK(quant_is_kquant(weight->type) && weight->rows == OC && weight->cols == IC && IC % KQ_BLOCK == 0,
          "K-quant weight [%d, %d] used as [%d, %d]", weight->rows, weight->cols, OC, IC);
    const long blocks = IC / KQ_BLOCK, row_bytes = kquant_row_bytes(weight->type, IC);
    int8_t *values = xmalloc((size_t)N * IC);
    float *scales = xmalloc((size_t)N * blocks * sizeof(float));
    int16_t *sums = xmalloc((size_t)N * blocks * 16 * sizeof(int16_t));
    KQuantInput *inputs = xmalloc((size_t)N * sizeof(KQuantInput));
    for (int i = 0; i < N; i++) {
        inputs[i] = (KQuantInput){values + (long)i * IC, scales + i * blocks, sums + i * blocks * 16};
        kquant_quantize_input(inp + (long)i * IC, IC, &inputs[i]);
    }
    // The ranges the row dots read (the portable loop runs unchecked).
    SANITIZER_CHECK_RANGE(values, (size_t)N * IC);
    SANITIZER_CHECK_RANGE(sums, (size_t)N * blocks * 16 * sizeof(int16_t));
    SANITIZER_CHECK_RANGE(weight->blocks, (size_t)OC * row_bytes);
    // Each output is one call's sum for its input row, whichever rows share the call, so the
    // results depend neither on N nor on the thread count.
#pragma omp parallel for schedule(static)
    for (int o = 0; o < OC; o++) {
        const uint8_t *row = weight->blocks + (long)o * row_bytes;
        for (int i0 = 0; i0 < N; i0 += KQ_INPUT_ROWS) {
            const int count = N - i0 < KQ_INPUT_ROWS ? N - i0 : KQ_INPUT_ROWS;
            float dots[KQ_INPUT_ROWS];
            kquant_rows_dot_best(weight->type, row, &inputs[i0], count, IC, dots);
            for (int i = 0; i < count; i++) out[(long)(i0 + i) * OC + o] = bias ? dots[i] + bias[o] : dots[i];
        }
    }
    free(values), free(scales), free(sums), free(inputs);
}
