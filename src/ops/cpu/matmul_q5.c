// Decode steps over Q5_0, Q4_0, Q5_1, Q4_1 and IQ4_NL weights (ops/q5.h, ops/ops.h) with Q8_0
// inputs: llama.cpp's Q5_0 / Q4_0 / IQ4_NL x Q8_0 (Q5_1 / Q4_1 x Q8_1) arithmetic, each block's 32
// codes decoded in registers and multiplied at once (IQ4_NL's looked up into its levels, one
// vpshufb).
//
// The work is a matrix-vector product that reads every weight once per step, so what it
// costs is reading the weights (0.69 bytes each) and turning them into products. The 5-bit
// codes q = nibble | fifth bit << 4 are in [0, 31], unsigned, which is what the byte
// multiply-adds (vpdpbusd, vpmaddubsw) take as their unsigned operand with the int8 inputs as
// the signed one; the offset of 16 is folded in afterwards through the input block's sum:
//     sum_j (q_j - 16) x_j = sum_j q_j x_j - 16 sum_j x_j.
// So no code is widened to a signed int8 copy in memory first (the previous path wrote each
// row's codes out as int8 and read them back, a quarter of a SmolLM2 decode step). Q4_0 is
// Q5_0 without the fifth bits: its nibbles in [0, 15] with an offset of 8.
// Q5_1 and Q4_1 codes have no offset (Q4_1's are the nibbles alone, no fifth bits); a block
// adds its minimum m times the input block's sum instead:
//     sum_j (d q_j + m) x_j s = d s sum_j q_j x_j + m (s sum_j x_j),
// s the input block's scale, (s sum_j x_j) computed once per input row. Both are rounded to
// half floats, as llama.cpp's Q8_1 blocks hold them (q5_input_q8_1): then a Q5_1 / Q4_1 product
// is llama.cpp's to float rounding (a file of them gives llama.cpp's logits to ~1e-6,
// tests/test_q4_1_q5_1.c), where float scales moved a 2-layer model's logits by 0.06.
//
// Each block b of a row gives one exact integer dot_b, and the row's float sum adds
// dot_b * (x_scale * w_scale) block after block. The block sums of 8 rows are reduced
// together (their vectors transposed and added, no horizontal sum per row), and the 8 float
// sums then run in the 8 lanes of one vector: lane k does row k's scalar operations in the
// scalar order, so the vector paths give the portable loop's bits.
//
// Batched decoding (2 to 63 input rows): a call takes up to Q5_INPUTS input rows, and each
// block's codes, decoded once into a register, are multiplied by each of them (the codes of
// a weight row were decoded again for every input row before); the weight scales' transpose
// is shared too. Each input row keeps its own sums, so its outputs have the bits of a call
// of that row alone.
#include "ops/cpu/matmul_q5.h"

#include <immintrin.h>
#include <stdlib.h>
#include <string.h>

#include "core/check.h"
#include "core/sanitizer.h"
#include "ops/cpu/simd_paths.h"
#include "io/gguf_dequant.h"
#include "io/gguf_write.h"
#include "ops/q8.h"

// What a weight type's blocks hold: fifth bits (Q5_0, Q5_1), a minimum (Q5_1, Q4_1), and
// the codes' offset (16 for Q5_0, 8 for Q4_0, none for the others). IQ4_NL's nibbles stand for levels
// (gguf_iq4_levels, -127 .. 113): the portable loop and the AVX2 path multiply the signed
// levels; the AVX-512 path the levels plus 128 (unsigned, as vpdpbusd takes them), the 128
// taken back through the input block's sum as Q5_0's 16 is.
static inline bool has_fifth_bits(QuantType type) { return type == QUANT_Q5_0 || type == QUANT_Q5_1; }
static inline bool has_min(QuantType type) { return type == QUANT_Q5_1 || type == QUANT_Q4_1; }
static inline int code_offset(QuantType type) { return type == QUANT_Q5_0 ? 16 : type == QUANT_Q4_0 ? 8 : 0; }

// ---- the portable loop (the reference; the sanitizer build runs it) ----
// Unchecked access by access: cpu_matmul_q5 checks the whole ranges once per call.
SANITIZER_UNCHECKED void q5_rows_dot_portable(const Q8Matrix *weight, long first, int count, const Q5Input *x,
                                              int inputs, float *out, long out_stride) {
    const long blocks = weight->cols / Q8_BLOCK;
    const bool five = has_fifth_bits(weight->type), min = has_min(weight->type);
    const bool levels = weight->type == QUANT_IQ4_NL;
    const int offset = code_offset(weight->type);
    for (int k = 0; k < count; k++) {
        const long r = first + k;
        float sum[Q5_INPUTS] = {0};
        for (long b = 0; b < blocks; b++) {
            const uint8_t *nibbles = weight->nibbles + (r * blocks + b) * (Q8_BLOCK / 2);
            const uint32_t fifth_bits = five ? weight->high_bits[r * blocks + b] : 0;
            int code[Q8_BLOCK]; // q less its offset, decoded once for every input row
            for (int j = 0; j < Q8_BLOCK / 2; j++) {
                code[j] = ((nibbles[j] & 0x0F) | (int)((fifth_bits >> j) & 1) << 4) - offset;
                code[j + Q8_BLOCK / 2] = ((nibbles[j] >> 4) | (int)((fifth_bits >> (j + 16)) & 1) << 4) - offset;
                if (levels) code[j] = gguf_iq4_levels[code[j]], code[j + Q8_BLOCK / 2] = gguf_iq4_levels[code[j + Q8_BLOCK / 2]];
            }
            const float w_scale = weight->scales[r * blocks + b], w_min = min ? weight->mins[r * blocks + b] : 0;
            for (int i = 0; i < inputs; i++) {
                const int8_t *xb = x[i].values + b * Q8_BLOCK;
                int32_t dot = 0;
                for (int j = 0; j < Q8_BLOCK; j++) dot += code[j] * xb[j];
                if (min) sum[i] += (float)dot * (x[i].scales[b] * w_scale) + x[i].min_terms[b] * w_min;
                else sum[i] += (float)dot * (x[i].scales[b] * w_scale);
            }
        }
        for (int i = 0; i < inputs; i++) out[i * out_stride + k] = sum[i];
    }
}

#if defined(__AVX2__)
// The rows of one kernel call: a call of fewer than Q5_ROWS rows repeats its last row in
// the spare lanes (computed, not stored), so every step has the same shape.
// A type's arrays it lacks (Q4_1's fifth bits, Q5_0's minimums) are NULL here.
typedef struct {
    const uint8_t *nibbles[Q5_ROWS];
    const uint32_t *fifth_bits[Q5_ROWS];
    const float *w_scales[Q5_ROWS];
    const float *w_mins[Q5_ROWS];
} RowGroup;

static inline RowGroup row_group(const Q8Matrix *weight, long first, int count) {
    const long blocks = weight->cols / Q8_BLOCK;
    RowGroup group;
    for (int k = 0; k < Q5_ROWS; k++) {
        const long r = first + (k < count ? k : count - 1);
        group.nibbles[k] = weight->nibbles + r * blocks * (Q8_BLOCK / 2);
        group.fifth_bits[k] = has_fifth_bits(weight->type) ? weight->high_bits + r * blocks : NULL;
        group.w_scales[k] = weight->scales + r * blocks;
        group.w_mins[k] = has_min(weight->type) ? weight->mins + r * blocks : NULL;
    }
    return group;
}

// The weight scales (or minimums) of blocks [b0, b0 + SCALE_CHUNK) (fewer at a row's end)
// turned to one vector per block, lane k row k's: an 8 x 8 transpose of the rows' scales,
// which a gather per block (microcoded, it took a third of the kernel) would do slower.
#define SCALE_CHUNK 8
static inline void chunk_scales(const float *const rows[Q5_ROWS], long b0, int chunk, __m256 scales[SCALE_CHUNK]) {
    if (chunk < SCALE_CHUNK) {
        float lanes[SCALE_CHUNK][Q5_ROWS];
        for (int j = 0; j < chunk; j++)
            for (int k = 0; k < Q5_ROWS; k++) lanes[j][k] = rows[k][b0 + j];
        for (int j = 0; j < chunk; j++) scales[j] = _mm256_loadu_ps(lanes[j]);
        return;
    }
    __m256 t[8], u[8];
    for (int k = 0; k < 8; k += 2) { // rows k, k + 1 interleaved: blocks 0, 1 | 4, 5 and 2, 3 | 6, 7
        const __m256 a = _mm256_loadu_ps(rows[k] + b0), b = _mm256_loadu_ps(rows[k + 1] + b0);
        t[k] = _mm256_unpacklo_ps(a, b), t[k + 1] = _mm256_unpackhi_ps(a, b);
    }
    for (int h = 0; h < 8; h += 4) { // rows h .. h + 3 of blocks 0 | 4, 1 | 5, 2 | 6, 3 | 7
        u[h] = _mm256_shuffle_ps(t[h], t[h + 2], 0x44), u[h + 1] = _mm256_shuffle_ps(t[h], t[h + 2], 0xEE);
        u[h + 2] = _mm256_shuffle_ps(t[h + 1], t[h + 3], 0x44), u[h + 3] = _mm256_shuffle_ps(t[h + 1], t[h + 3], 0xEE);
    }
    for (int j = 0; j < 4; j++) {
        scales[j] = _mm256_permute2f128_ps(u[j], u[j + 4], 0x20);
        scales[j + 4] = _mm256_permute2f128_ps(u[j], u[j + 4], 0x31);
    }
}

// The 8 rows' float sums (lane k: row k) after block b, whose integer sums of q * x are
// `dots` (lane k: row k), weight scales `w_scales` and minimums `w_mins`: dot_b = dots -
// offset * x's block sum (Q5_0's 16, Q4_0's 8, the AVX-512 path's IQ4_NL 128), then the scalar loop's
// steps (with Q5_1's and Q4_1's minimum term, in the same order).
static inline __m256 add_block(__m256 sums, __m256i dots, __m256 w_scales, __m256 w_mins, const Q5Input *x, long b,
                               QuantType type, int offset) {
    const __m256i dot = offset ? _mm256_sub_epi32(dots, _mm256_set1_epi32(offset * x->sums[b])) : dots;
    const __m256 scale = _mm256_mul_ps(_mm256_set1_ps(x->scales[b]), w_scales);
    const __m256 product = _mm256_mul_ps(_mm256_cvtepi32_ps(dot), scale);
    if (!has_min(type)) return _mm256_add_ps(sums, product);
    return _mm256_add_ps(sums, _mm256_add_ps(product, _mm256_mul_ps(_mm256_set1_ps(x->min_terms[b]), w_mins)));
}

static inline void store_rows(float *out, int count, __m256 sums) {
    float lanes[Q5_ROWS];
    _mm256_storeu_ps(lanes, sums);
    memcpy(out, lanes, (size_t)count * sizeof(float));
}

// Eight vectors of int32 partial sums -> in each 128-bit lane, the four sums of that lane's
// four int32s for rows 0-3 (first) and 4-7 (second): the first half of a transpose-and-add.
// unpacklo/hi of two rows and an add leave [a0+a2, b0+b2, a1+a3, b1+b3] per 128-bit lane;
// the 64-bit unpacks of two such results and an add leave [a, b, c, d].
#define REDUCE_FOUR_ROWS(bits, v, out)                                                                      \
    do {                                                                                                    \
        const __m##bits##i ab = _mm##bits##_add_epi32(_mm##bits##_unpacklo_epi32(v[0], v[1]),              \
                                                      _mm##bits##_unpackhi_epi32(v[0], v[1]));             \
        const __m##bits##i cd = _mm##bits##_add_epi32(_mm##bits##_unpacklo_epi32(v[2], v[3]),              \
                                                      _mm##bits##_unpackhi_epi32(v[2], v[3]));             \
        out = _mm##bits##_add_epi32(_mm##bits##_unpacklo_epi64(ab, cd), _mm##bits##_unpackhi_epi64(ab, cd)); \
    } while (0)

// Blocks per pass: each row's codes for the pass are read in one run (rows one after the
// other, so the weights stream from memory in address order, which the hardware prefetcher
// follows; 8 rows read side by side, block by block, ran at half the bandwidth), their
// integer sums kept (8 KB), then reduced and added block by block.
// With several input rows the sums of each are kept, so a pass is that many times shorter
// (the same 8 KB), still a multiple of SCALE_CHUNK.
#define PASS_BLOCKS 32 // a multiple of SCALE_CHUNK, so a chunk of scales never spans two passes
_Static_assert(PASS_BLOCKS / Q5_INPUTS >= SCALE_CHUNK, "a pass of Q5_INPUTS input rows holds a chunk of scales");
static inline long pass_blocks(int inputs) { return PASS_BLOCKS / inputs / SCALE_CHUNK * SCALE_CHUNK; }

// Each row's codes and fifth bits are also asked for this far ahead (rows follow one
// another in memory, so this reaches into the next rows): on SmolLM2's decode step it took
// the kernel from 2.7 to 2.5 times the Q8_0 kernel's time (on 2.6 times its weights); the
// scales too took it to about 0.8 of the Q8_0 kernel's time a weight in bench/quant_kernels.
#define PREFETCH_BYTES 4096

// ---- AVX2: one block a step ----
// A block's 32 codes: values 0-15 are the 16 bytes' low nibbles, 16-31 their high ones, and
// bit j of the fifth bits is value j's bit 4.
// Q4_0 and Q4_1 (`five` false) have no fifth bits: the nibbles are the codes.
static inline __m256i block_codes_avx2(const uint8_t *nibbles, uint32_t fifth_bits, bool five) {
    const __m128i bytes = _mm_loadu_si128((const __m128i *)nibbles), nibble = _mm_set1_epi8(0x0F);
    const __m256i codes = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(bytes, 4), nibble), _mm_and_si128(bytes, nibble));
    if (!five) return codes;
    // Byte j of `spread` is byte j / 8 of the fifth bits; `bit` keeps its bit j % 8.
    const __m256i spread = _mm256_shuffle_epi8(_mm256_set1_epi32((int)fifth_bits),
                                               _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202,
                                                                 0x0101010101010101, 0x0000000000000000));
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201);
    const __m256i is_set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
    return _mm256_or_si256(codes, _mm256_and_si256(is_set, _mm256_set1_epi8(0x10)));
}

// The rows' sums of q * x for one block, 8 int32 each (`v`, rows 0-7) -> one int32 a row.
static inline __m256i reduce_block_avx2(const __m256i v[Q5_ROWS]) {
    __m256i low_rows, high_rows;
    REDUCE_FOUR_ROWS(256, v, low_rows);
    REDUCE_FOUR_ROWS(256, (v + 4), high_rows);
    // The two 128-bit lanes of each hold halves of the block: add them across.
    return _mm256_add_epi32(_mm256_permute2x128_si256(low_rows, high_rows, 0x20),
                            _mm256_permute2x128_si256(low_rows, high_rows, 0x31));
}

// The loops over the input rows run to the constant Q5_INPUTS, skipping rows past `inputs`,
// so the compiler unrolls them and keeps each row's sums in registers.
static inline __attribute__((always_inline)) void rows_dot_avx2_loop(const Q8Matrix *weight, long first, int count,
                                                                    const Q5Input *x, int inputs, float *out,
                                                                    long out_stride, QuantType type) {
    const long blocks = weight->cols / Q8_BLOCK, pass = pass_blocks(inputs);
    const RowGroup group = row_group(weight, first, count);
    const __m256i ones = _mm256_set1_epi16(1);
    const __m256i level_table = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)gguf_iq4_levels));
    const int offset = code_offset(type);
    __m256 sums[Q5_INPUTS], w_scales[SCALE_CHUNK], w_mins[SCALE_CHUNK] = {0};
    for (int i = 0; i < Q5_INPUTS; i++) sums[i] = _mm256_setzero_ps();
    __m256i dots[PASS_BLOCKS * Q5_ROWS]; // [input i][block b - b0][row k]: 8 int32 partial sums of q * x
    for (long b0 = 0; b0 < blocks; b0 += pass) {
        const long b1 = b0 + pass < blocks ? b0 + pass : blocks;
        for (int k = 0; k < Q5_ROWS; k++)
            for (long b = b0; b < b1; b++) {
                const uint8_t *nibbles = group.nibbles[k] + b * (Q8_BLOCK / 2);
                _mm_prefetch((const char *)nibbles + PREFETCH_BYTES, _MM_HINT_T0);
                if (has_fifth_bits(type))
                    _mm_prefetch((const char *)(group.fifth_bits[k] + b) + PREFETCH_BYTES / 4, _MM_HINT_T0);
                _mm_prefetch((const char *)(group.w_scales[k] + b) + PREFETCH_BYTES / 4, _MM_HINT_T0);
                if (has_min(type)) _mm_prefetch((const char *)(group.w_mins[k] + b) + PREFETCH_BYTES / 4, _MM_HINT_T0);
                const __m256i codes =
                    block_codes_avx2(nibbles, has_fifth_bits(type) ? group.fifth_bits[k][b] : 0, has_fifth_bits(type));
                // IQ4_NL: the signed levels; the byte multiply-add takes an unsigned operand, so
                // |x| times the level with x's sign (at most 2 * 127 * 127, no saturation).
                const __m256i levels = type == QUANT_IQ4_NL ? _mm256_shuffle_epi8(level_table, codes) : codes;
                for (int i = 0; i < Q5_INPUTS; i++)
                    if (i < inputs) {
                        const __m256i xv = _mm256_loadu_si256((const __m256i *)(x[i].values + b * Q8_BLOCK));
                        // Pairs of products in int16 (at most 2 * 31 * 128, no saturation), then pairs of those.
                        const __m256i pairs = type == QUANT_IQ4_NL
                                                  ? _mm256_maddubs_epi16(_mm256_sign_epi8(xv, xv), _mm256_sign_epi8(levels, xv))
                                                  : _mm256_maddubs_epi16(codes, xv);
                        dots[(i * pass + b - b0) * Q5_ROWS + k] = _mm256_madd_epi16(pairs, ones);
                    }
            }
        for (long b = b0; b < b1; b++) {
            if (b % SCALE_CHUNK == 0) {
                const int chunk = blocks - b < SCALE_CHUNK ? (int)(blocks - b) : SCALE_CHUNK;
                chunk_scales(group.w_scales, b, chunk, w_scales);
                if (has_min(type)) chunk_scales(group.w_mins, b, chunk, w_mins);
            }
            for (int i = 0; i < Q5_INPUTS; i++)
                if (i < inputs)
                    sums[i] = add_block(sums[i], reduce_block_avx2(dots + (i * pass + b - b0) * Q5_ROWS),
                                        w_scales[b % SCALE_CHUNK], w_mins[b % SCALE_CHUNK], &x[i], b, type, offset);
        }
    }
    for (int i = 0; i < inputs; i++) store_rows(out + i * out_stride, count, sums[i]);
}

// One input row (a decode step of one sequence) with `inputs` the constant 1, so that the
// compiler drops the other rows' code and checks; the bits are the same either way. The
// weight type a constant too, one loop compiled per type.
#define DISPATCH_TYPE(loop, type)                                                                             \
    case type:                                                                                                 \
        if (inputs == 1) loop(weight, first, count, x, 1, out, out_stride, type);                              \
        else loop(weight, first, count, x, inputs, out, out_stride, type);                                     \
        break
#define DISPATCH_TYPES(loop)                                                                                    \
    do {                                                                                                       \
        switch (weight->type) {                                                                                \
            DISPATCH_TYPE(loop, QUANT_Q5_1);                                                                   \
            DISPATCH_TYPE(loop, QUANT_Q4_1);                                                                   \
            DISPATCH_TYPE(loop, QUANT_IQ4_NL);                                                                 \
            DISPATCH_TYPE(loop, QUANT_Q4_0);                                                                   \
        default: /* Q5_0: cpu_matmul_q5_takes no other type */                                                \
            DISPATCH_TYPE(loop, QUANT_Q5_0);                                                                   \
        }                                                                                                      \
    } while (0)
static void rows_dot_avx2(const Q8Matrix *weight, long first, int count, const Q5Input *x, int inputs, float *out,
                          long out_stride) {
    DISPATCH_TYPES(rows_dot_avx2_loop);
}
const Q5RowsDot q5_rows_dot_avx2 = rows_dot_avx2;
#else
const Q5RowsDot q5_rows_dot_avx2 = NULL;
#endif

// ---- AVX-512 (BW for the byte masks and shifts, VNNI for vpdpbusd): two blocks a step ----
#if SIMD_HAS_AVX512
// Two consecutive blocks' 64 codes from their 32 nibble bytes and 64 fifth bits: 128-bit
// lane 2i + h holds block i's values 16h .. 16h + 15, so byte n is value n % 32 of block
// n / 32 and the two fifth-bit words are that byte order's mask as they are.
static inline __m512i pair_codes_avx512(__m256i nibble_bytes, uint64_t fifth_bits, bool five) {
    const __m512i bytes = _mm512_castsi256_si512(nibble_bytes);
    const __m512i spread = _mm512_shuffle_i64x2(bytes, bytes, _MM_SHUFFLE(1, 1, 0, 0)); // lanes 0, 0, 1, 1
    const __m512i shifts = _mm512_set_epi64(4, 4, 0, 0, 4, 4, 0, 0);                   // high nibbles in lanes 1, 3
    const __m512i codes = _mm512_and_si512(_mm512_srlv_epi64(spread, shifts), _mm512_set1_epi8(0x0F));
    if (!five) return codes; // Q4_0, Q4_1
    // Where the fifth bit is set, 16 is added to the nibble (no byte-masked OR exists).
    return _mm512_mask_add_epi8(codes, (__mmask64)fifth_bits, codes, _mm512_set1_epi8(0x10));
}

// The 8 rows' integer sums of q * x for two blocks, 16 int32 each in `dots` (lanes 0-7 the
// first block's, 8-15 the second's) -> rows 0-7 of the first block, rows 0-7 of the second.
static inline __m512i reduce_pair(const __m512i dots[Q5_ROWS]) {
    __m512i low_rows, high_rows;
    REDUCE_FOUR_ROWS(512, dots, low_rows);
    REDUCE_FOUR_ROWS(512, (dots + 4), high_rows);
    // Lanes [first block: two halves, second block: two halves] of rows 0-3, then 4-7:
    // add each block's halves -> [0-3 first, 0-3 second, 4-7 first, 4-7 second], then reorder.
    const __m512i added = _mm512_add_epi32(_mm512_shuffle_i64x2(low_rows, high_rows, _MM_SHUFFLE(2, 0, 2, 0)),
                                           _mm512_shuffle_i64x2(low_rows, high_rows, _MM_SHUFFLE(3, 1, 3, 1)));
    return _mm512_shuffle_i64x2(added, added, _MM_SHUFFLE(3, 1, 2, 0));
}

static inline __attribute__((always_inline)) void rows_dot_avx512_loop(const Q8Matrix *weight, long first, int count,
                                                                      const Q5Input *x, int inputs, float *out,
                                                                      long out_stride, QuantType type) {
    const long blocks = weight->cols / Q8_BLOCK, pairs = (blocks + 1) / 2, pass = pass_blocks(inputs) / 2;
    const RowGroup group = row_group(weight, first, count);
    const bool five = has_fifth_bits(type), levels = type == QUANT_IQ4_NL;
    // IQ4_NL's levels plus 128 (wrapping bytes: -127 .. 113 become 1 .. 241), in every 128-bit lane.
    const __m512i level_table = _mm512_broadcast_i32x4(
        _mm_add_epi8(_mm_loadu_si128((const __m128i *)gguf_iq4_levels), _mm_set1_epi8((char)-128)));
    const int offset = levels ? 128 : code_offset(type);
    __m256 sums[Q5_INPUTS], w_scales[SCALE_CHUNK], w_mins[SCALE_CHUNK] = {0};
    for (int i = 0; i < Q5_INPUTS; i++) sums[i] = _mm256_setzero_ps();
    __m512i dots[PASS_BLOCKS / 2 * Q5_ROWS]; // [input i][pair p - p0][row k]
    for (long p0 = 0; p0 < pairs; p0 += pass) {
        const long p1 = p0 + pass < pairs ? p0 + pass : pairs;
        for (int k = 0; k < Q5_ROWS; k++)
            for (long p = p0; p < p1; p++) {
                const long b = 2 * p;
                __m512i codes;
                __mmask64 x_bytes = ~0ULL;
                if (b + 1 < blocks) {
                    uint64_t fifth_bits = 0;
                    if (five) memcpy(&fifth_bits, group.fifth_bits[k] + b, sizeof fifth_bits);
                    _mm_prefetch((const char *)(group.nibbles[k] + b * (Q8_BLOCK / 2)) + PREFETCH_BYTES, _MM_HINT_T0);
                    if (five) _mm_prefetch((const char *)(group.fifth_bits[k] + b) + PREFETCH_BYTES / 4, _MM_HINT_T0);
                    _mm_prefetch((const char *)(group.w_scales[k] + b) + PREFETCH_BYTES / 4, _MM_HINT_T0);
                    if (has_min(type)) _mm_prefetch((const char *)(group.w_mins[k] + b) + PREFETCH_BYTES / 4, _MM_HINT_T0);
                    codes = pair_codes_avx512(_mm256_loadu_si256((const __m256i *)(group.nibbles[k] + b * (Q8_BLOCK / 2))),
                                              fifth_bits, five);
                } else { // an odd last block: the pair's second block reads as zero codes and inputs
                    x_bytes = 0xFFFFFFFFULL;
                    const __m128i nibble_bytes = _mm_loadu_si128((const __m128i *)(group.nibbles[k] + b * (Q8_BLOCK / 2)));
                    codes = pair_codes_avx512(_mm256_zextsi128_si256(nibble_bytes), five ? group.fifth_bits[k][b] : 0, five);
                }
                if (levels) codes = _mm512_shuffle_epi8(level_table, codes); // the second block of an odd end: 1s, times zero inputs
                for (int i = 0; i < Q5_INPUTS; i++)
                    if (i < inputs) {
                        const __m512i xv = _mm512_maskz_loadu_epi8(x_bytes, x[i].values + b * Q8_BLOCK);
                        dots[(i * pass + p - p0) * Q5_ROWS + k] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), codes, xv);
                    }
            }
        for (long p = p0; p < p1; p++) {
            const long b = 2 * p;
            if (b % SCALE_CHUNK == 0) {
                const int chunk = blocks - b < SCALE_CHUNK ? (int)(blocks - b) : SCALE_CHUNK;
                chunk_scales(group.w_scales, b, chunk, w_scales);
                if (has_min(type)) chunk_scales(group.w_mins, b, chunk, w_mins);
            }
            for (int i = 0; i < Q5_INPUTS; i++)
                if (i < inputs) {
                    const __m512i rows = reduce_pair(dots + (i * pass + p - p0) * Q5_ROWS);
                    sums[i] = add_block(sums[i], _mm512_castsi512_si256(rows), w_scales[b % SCALE_CHUNK],
                                        w_mins[b % SCALE_CHUNK], &x[i], b, type, offset);
                    if (b + 1 < blocks)
                        sums[i] = add_block(sums[i], _mm512_extracti64x4_epi64(rows, 1), w_scales[(b + 1) % SCALE_CHUNK],
                                            w_mins[(b + 1) % SCALE_CHUNK], &x[i], b + 1, type, offset);
                }
        }
    }
    for (int i = 0; i < inputs; i++) store_rows(out + i * out_stride, count, sums[i]);
}
static void rows_dot_avx512(const Q8Matrix *weight, long first, int count, const Q5Input *x, int inputs, float *out,
                            long out_stride) {
    DISPATCH_TYPES(rows_dot_avx512_loop);
}
const Q5RowsDot q5_rows_dot_avx512 = rows_dot_avx512;
#else
const Q5RowsDot q5_rows_dot_avx512 = NULL;
#endif

const Q5RowsDot q5_rows_dot_best = SIMD_BEST(rows_dot_avx512, rows_dot_avx2, q5_rows_dot_portable);
const char *const q5_best_path_name = SIMD_BEST_NAME;

void q5_input_q8_1(float *scales, const int32_t *sums, long blocks, float *min_terms) {
    for (long b = 0; b < blocks; b++) {
        min_terms[b] = gguf_f16_to_f32(gguf_f32_to_f16(scales[b] * (float)sums[b]));
        scales[b] = gguf_f16_to_f32(gguf_f32_to_f16(scales[b]));
    }
}

void cpu_matmul_q5(float *out, const float *inp, const Q8Matrix *weight, const float *bias, int N, int IC, int OC) {
    CHECK(cpu_matmul_q5_takes(weight->type) && weight->rows == OC && weight->cols == IC && IC % Q8_BLOCK == 0,
          "Q5_0 / Q4_0 / Q5_1 / Q4_1 / IQ4_NL weight (type %d) [%d, %d] used as [%d, %d]", (int)weight->type, weight->rows,
          weight->cols, OC, IC);
    const long blocks = IC / Q8_BLOCK;
    const bool min = has_min(weight->type);
    int8_t *values = xmalloc((size_t)N * IC);
    float *scales = xmalloc((size_t)N * blocks * sizeof(float));
    int32_t *sums = xmalloc((size_t)N * blocks * sizeof(int32_t));
    float *min_terms = min ? xmalloc((size_t)N * blocks * sizeof(float)) : NULL;
    for (int i = 0; i < N; i++) {
        q8_quantize_row(inp + (long)i * IC, IC, values + (long)i * IC, scales + i * blocks);
        for (long b = 0; b < blocks; b++) {
            int32_t sum = 0;
            for (int j = 0; j < Q8_BLOCK; j++) sum += values[(long)i * IC + b * Q8_BLOCK + j];
            sums[i * blocks + b] = sum;
        }
        if (min) q5_input_q8_1(scales + i * blocks, sums + i * blocks, blocks, min_terms + i * blocks);
    }
    // The ranges the row dots read (the portable loop runs unchecked).
    SANITIZER_CHECK_RANGE(values, (size_t)N * IC);
    SANITIZER_CHECK_RANGE(scales, (size_t)N * blocks * sizeof(float));
    SANITIZER_CHECK_RANGE(weight->nibbles, (size_t)OC * IC / 2);
    if (has_fifth_bits(weight->type)) SANITIZER_CHECK_RANGE(weight->high_bits, (size_t)OC * blocks * sizeof(uint32_t));
    SANITIZER_CHECK_RANGE(weight->scales, (size_t)OC * blocks * sizeof(float));
    if (min) {
        SANITIZER_CHECK_RANGE(weight->mins, (size_t)OC * blocks * sizeof(float));
        SANITIZER_CHECK_RANGE(min_terms, (size_t)N * blocks * sizeof(float));
    }
    // Whole groups of Q5_ROWS rows to each thread, the static schedule's even split (for one
    // input row, a decode step, the work is the groups): each output is one lane's sum in
    // block order, so the results depend neither on the thread count nor on N.
    const int groups = (OC + Q5_ROWS - 1) / Q5_ROWS;
#pragma omp parallel for schedule(static)
    for (int g = 0; g < groups; g++) {
        const int o = g * Q5_ROWS, count = OC - o < Q5_ROWS ? OC - o : Q5_ROWS;
        for (int i0 = 0; i0 < N; i0 += Q5_INPUTS) {
            const int inputs = N - i0 < Q5_INPUTS ? N - i0 : Q5_INPUTS;
            Q5Input x[Q5_INPUTS];
            for (int i = 0; i < inputs; i++)
                x[i] = (Q5Input){values + (long)(i0 + i) * IC, scales + (i0 + i) * blocks, sums + (i0 + i) * blocks,
                                 min ? min_terms + (i0 + i) * blocks : NULL};
            float *y = out + (long)i0 * OC + o;
            q5_rows_dot_best(weight, o, count, x, inputs, y, OC);
            for (int i = 0; bias && i < inputs; i++)
                for (int k = 0; k < count; k++) y[(long)i * OC + k] += bias[o + k];
        }
    }
    free(values), free(scales), free(sums), free(min_terms);
}
