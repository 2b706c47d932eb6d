// Linear layers with quantized weights of every type (model/quantize.h, ops/ops.h Q8Matrix):
// NF4's and bf16's decode steps have their own float kernels (ops/cpu/matmul_nf4.c,
// matmul_bf16.c), the K-quants' and Q5_0's, Q4_0's, Q5_1's, Q4_1's, IQ4_NL's their own integer ones
// (ops/cpu/matmul_kquant.c, matmul_q5.c); their prefills and training take the dequantized
// tiles below.
//
// Fewer than Q8_SGEMM_MIN_ROWS input rows (decode steps): the input rows are quantized to
// Q8_0 blocks as well, and each pair of blocks contributes its integer dot product times
// the two scales, which is llama.cpp's arithmetic for Q8_0 weights. Decoding reads every
// weight once per step, so reading one byte per weight instead of four is what makes it
// faster. More rows (prefills): tiles of the weights are dequantized and go through sgemm
// (or, with MARLHF_CPU_MATMUL=batch-invariant, the fixed-order kernel of matmul_invariant.c).
// Q4_0 and IQ4_NL weights, Q5_0 (a Q4_K_M file's fallback rows, ops/q5.h), Q5_1 and Q4_1
// take ops/cpu/matmul_q5.c's kernel, which decodes the codes in registers (Q4_0 was widened
// to an int8 copy of each weight row here before: 108 against 160 tokens/s at batch 1,
// docs/quantization.md).
//
// Training over a quantized frozen base (QLoRA) uses only the dequantized tiles, for the
// forward (matmul_forward_dequantized: weights-only quantization at any N) and for the
// input gradient (matmul_backward_input_q8), so the backward is the exact gradient of the
// forward: both are the float32 matmuls of the dequantized weights, up to summation order.
//
// Each output element of the integer path is one thread's sum over the blocks in order, so
// results do not depend on the thread count. Its vector paths (AVX-512 VNNI, AVX2) and
// the portable loop add the same products in different orders: they agree to float
// rounding, not bit for bit.
#include <cblas.h>
#include <immintrin.h>
#include <stdlib.h>

#include "core/check.h"
#include "core/sanitizer.h"
#include "ops/cpu/matmul_bf16.h"
#include "ops/cpu/matmul_kquant.h"
#include "ops/cpu/matmul_q5.h"
#include "ops/cpu/ops_cpu.h"
#include "ops/q4.h"
#include "ops/q8.h"


#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
// AVX-512 VNNI: one vpdpbusd multiplies 64 unsigned bytes by 64 signed ones and adds each
// group of four products into one of 16 int32 lanes. The input values are stored offset by
// 128 (unsigned), and each lane starts from -128 times its four weights' sum, so the
// lanes end at exactly sum x*w. One 512-bit step covers two blocks: lanes 0-7 are the
// first block's, 8-15 the second's, and the scales are applied per half.
#define Q8_PAIR (2 * Q8_BLOCK)
#define ROWS_AT_ONCE 4
#define ROW_TILE 16
#define OUT_TILE 16

// The input rows, quantized: offset values [N, IC] and, for each pair of blocks, a vector
// of 16 scales (8 copies of each block's) so that a step multiplies by one load.
typedef struct {
    uint8_t *values;
    float *scale_vectors; // [N, pairs, 16]
    int pairs;
} QuantizedInput;

static void quantize_input(QuantizedInput *input, const float *inp, int N, int IC) {
    const int blocks = IC / Q8_BLOCK;
    input->pairs = (blocks + 1) / 2;
    // Rows are padded to whole pairs: a missing last block has values 128 (zero) and scale 0.
    const long row_bytes = (long)input->pairs * Q8_PAIR;
    input->values = xmalloc((size_t)N * row_bytes);
    input->scale_vectors = xcalloc((size_t)N * input->pairs * 16, sizeof(float));
    int8_t *values = xmalloc(IC);
    float *scales = xmalloc((size_t)blocks * sizeof(float));
    for (int i = 0; i < N; i++) {
        q8_quantize_row(inp + (long)i * IC, IC, values, scales);
        uint8_t *row = input->values + i * row_bytes;
        for (long c = 0; c < row_bytes; c++) row[c] = c < IC ? (uint8_t)(values[c] + 128) : 128;
        float *vectors = input->scale_vectors + (long)i * input->pairs * 16;
        for (int b = 0; b < blocks; b++)
            for (int lane = 0; lane < 8; lane++) vectors[(b / 2) * 16 + (b % 2) * 8 + lane] = scales[b];
    }
    free(values);
    free(scales);
}

static inline float horizontal_sum(__m512 v) { return _mm512_reduce_add_ps(v); }

// out[i * OC] for rows [0, R) of the input (R <= ROWS_AT_ONCE) against one weight row.
static void weight_row_dot(float *out, long out_stride, const QuantizedInput *input, long row_bytes, int R,
                           const int8_t *w, const float *w_scales, int IC) {
    const int blocks = IC / Q8_BLOCK;
    const __m512i offset = _mm512_set1_epi8((char)128);
    __m512 acc[ROWS_AT_ONCE][2];
    for (int r = 0; r < ROWS_AT_ONCE; r++) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
    for (int p = 0; p < input->pairs; p++) {
        const bool whole = 2 * p + 1 < blocks;
        // The weights of a missing second block read as zeros (masked load).
        __m512i wv = _mm512_maskz_loadu_epi8(whole ? ~0ULL : 0xFFFFFFFFULL, w + (long)p * Q8_PAIR);
        __m512i start = _mm512_sub_epi32(_mm512_setzero_si512(),
                                         _mm512_dpbusd_epi32(_mm512_setzero_si512(), offset, wv));
        __m512 w_scale = _mm512_insertf32x8(_mm512_set1_ps(w_scales[2 * p]),
                                            _mm256_set1_ps(whole ? w_scales[2 * p + 1] : 0.0f), 1);
        for (int r = 0; r < R; r++) {
            __m512i xv = _mm512_loadu_si512(input->values + r * row_bytes + (long)p * Q8_PAIR);
            __m512 dot = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(start, xv, wv));
            __m512 scale = _mm512_mul_ps(_mm512_loadu_ps(input->scale_vectors + ((long)r * input->pairs + p) * 16), w_scale);
            // Two accumulators per row so consecutive pairs do not wait on each other.
            acc[r][p & 1] = _mm512_fmadd_ps(dot, scale, acc[r][p & 1]);
        }
    }
    for (int r = 0; r < R; r++) out[r * out_stride] = horizontal_sum(_mm512_add_ps(acc[r][0], acc[r][1]));
}

static void matmul_q8_integer(float *out, const float *inp, const Q8Matrix *weight, const float *bias,
                              int N, int IC, int OC) {
    QuantizedInput input;
    quantize_input(&input, inp, N, IC);
    const long row_bytes = (long)input.pairs * Q8_PAIR;
    // Tiles of OUT_TILE weight rows by ROW_TILE input rows: the input rows of a tile stay in
    // L1 while the tile's weight rows pass over them, so a long prefill does not stream all
    // its rows from L2 once per weight row. Each output is still one sum in block order.
#pragma omp parallel for schedule(static)
    for (int o0 = 0; o0 < OC; o0 += OUT_TILE) {
        const int o1 = o0 + OUT_TILE < OC ? o0 + OUT_TILE : OC;
        for (int i0 = 0; i0 < N; i0 += ROW_TILE) {
            const int i1 = i0 + ROW_TILE < N ? i0 + ROW_TILE : N;
            for (int o = o0; o < o1; o++) {
                const int8_t *w = weight->values + (long)o * IC;
                const float *w_scales = weight->scales + (long)o * (IC / Q8_BLOCK);
                for (int i = i0; i < i1; i += ROWS_AT_ONCE) {
                    QuantizedInput rows = input;
                    rows.values += i * row_bytes;
                    rows.scale_vectors += (long)i * input.pairs * 16;
                    int R = i1 - i < ROWS_AT_ONCE ? i1 - i : ROWS_AT_ONCE;
                    weight_row_dot(out + (long)i * OC + o, OC, &rows, row_bytes, R, w, w_scales, IC);
                    if (bias)
                        for (int r = 0; r < R; r++) out[(long)(i + r) * OC + o] += bias[o];
                }
            }
        }
    }
    free(input.values);
    free(input.scale_vectors);
}
#else
#if defined(__AVX2__) && defined(__FMA__)
static inline float horizontal_sum(__m256 v) {
    __m128 sum = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    sum = _mm_add_ps(sum, _mm_movehl_ps(sum, sum));
    sum = _mm_add_ss(sum, _mm_movehdup_ps(sum));
    return _mm_cvtss_f32(sum);
}

// Eight partial sums of a block's 32 products x[i] * w[i], as int32. The multiply-add
// instructions take one unsigned operand, so |x| is multiplied by w with x's sign.
static inline __m256i block_dot(const int8_t *x, const int8_t *w) {
    __m256i xv = _mm256_loadu_si256((const __m256i *)x);
    __m256i wv = _mm256_loadu_si256((const __m256i *)w);
    __m256i x_abs = _mm256_sign_epi8(xv, xv);
    __m256i w_signed = _mm256_sign_epi8(wv, xv);
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), x_abs, w_signed);
#else
    // Pairs of products in int16 (at most 2 * 127 * 127, no saturation), then pairs of those.
    __m256i pairs = _mm256_maddubs_epi16(x_abs, w_signed);
    return _mm256_madd_epi16(pairs, _mm256_set1_epi16(1));
#endif
}

static float row_dot(const int8_t *x, const float *x_scales, const int8_t *w, const float *w_scales,
                     int blocks) {
    // Four accumulators so consecutive blocks do not wait on one another's multiply-add.
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    int b = 0;
    for (; b + 4 <= blocks; b += 4)
        for (int u = 0; u < 4; u++) {
            __m256 dot = _mm256_cvtepi32_ps(block_dot(x + (b + u) * Q8_BLOCK, w + (b + u) * Q8_BLOCK));
            acc[u] = _mm256_fmadd_ps(dot, _mm256_set1_ps(x_scales[b + u] * w_scales[b + u]), acc[u]);
        }
    for (; b < blocks; b++) {
        __m256 dot = _mm256_cvtepi32_ps(block_dot(x + b * Q8_BLOCK, w + b * Q8_BLOCK));
        acc[0] = _mm256_fmadd_ps(dot, _mm256_set1_ps(x_scales[b] * w_scales[b]), acc[0]);
    }
    return horizontal_sum(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])));
}
#else
// The portable loop (no AVX2: among others, the sanitizer build) is unchecked access by
// access: matmul_q8_integer checks the whole ranges it reads once per call
// (core/sanitizer.h). Checked, it made the sanitized SmolLM2 decode tests several times slower.
SANITIZER_UNCHECKED static float row_dot(const int8_t *x, const float *x_scales, const int8_t *w, const float *w_scales,
                                         int blocks) {
    float sum = 0.0f;
    for (int b = 0; b < blocks; b++) {
        int dot = 0;
        for (int i = 0; i < Q8_BLOCK; i++) dot += x[b * Q8_BLOCK + i] * w[b * Q8_BLOCK + i];
        sum += (float)dot * (x_scales[b] * w_scales[b]);
    }
    return sum;
}
#endif

static void matmul_q8_integer(float *out, const float *inp, const Q8Matrix *weight, const float *bias,
                              int N, int IC, int OC) {
    const int blocks = IC / Q8_BLOCK;
    int8_t *x_values = xmalloc((size_t)N * IC);
    float *x_scales = xmalloc((size_t)N * blocks * sizeof(float));
    for (int i = 0; i < N; i++)
        q8_quantize_row(inp + (long)i * IC, IC, x_values + (long)i * IC, x_scales + (long)i * blocks);
    // row_dot's ranges (it may run unchecked): the inputs and each weight row it reads.
    SANITIZER_CHECK_RANGE(x_values, (size_t)N * IC);
    SANITIZER_CHECK_RANGE(x_scales, (size_t)N * blocks * sizeof(float));
    SANITIZER_CHECK_RANGE(weight->values, (size_t)OC * IC);
    SANITIZER_CHECK_RANGE(weight->scales, (size_t)OC * blocks * sizeof(float));
#pragma omp parallel for schedule(static)
    for (int o = 0; o < OC; o++) {
        const int8_t *w = weight->values + (long)o * IC;
        const float *w_scales = weight->scales + (long)o * blocks;
        for (int i = 0; i < N; i++) {
            float sum = row_dot(x_values + (long)i * IC, x_scales + (long)i * blocks, w, w_scales, blocks);
            out[(long)i * OC + o] = bias ? sum + bias[o] : sum;
        }
    }
    free(x_values);
    free(x_scales);
}
#endif

// Many rows (a prefill, Q8_SGEMM_MIN_ROWS or more): the weights are turned back into floats
// a tile of rows at a time and multiplied by the float inputs with sgemm, which is faster
// than the integer kernel once each weight serves this many rows, and more exact.
#define DEQUANTIZED_TILE 256

// Weight rows [first, first + rows) as floats, one thread per row.
static void dequantize_tile(float *tile, const Q8Matrix *weight, int first, int rows) {
#pragma omp parallel for schedule(static)
    for (int r = 0; r < rows; r++) quant_dequantize_rows(weight, first + r, 1, tile + (long)r * weight->cols);
}

static void check_shape(const Q8Matrix *weight, int IC, int OC) {
    CHECK(weight->rows == OC && weight->cols == IC && IC % Q8_BLOCK == 0,
          "quantized weight [%d, %d] used as [%d, %d]", weight->rows, weight->cols, OC, IC);
}

static void matmul_q8_dequantized(float *out, const float *inp, const Q8Matrix *weight, const float *bias, int N,
                                  int IC, int OC) {
    float *tile = xmalloc((size_t)DEQUANTIZED_TILE * IC * sizeof(float));
    for (int o0 = 0; o0 < OC; o0 += DEQUANTIZED_TILE) {
        const int rows = OC - o0 < DEQUANTIZED_TILE ? OC - o0 : DEQUANTIZED_TILE;
        dequantize_tile(tile, weight, o0, rows);
        if (cpu_matmul_batch_invariant()) cpu_matmul_fixed_order(out + o0, OC, inp, tile, N, IC, rows, false);
        else cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, rows, IC, 1.0f, inp, IC, tile, IC, 0.0f,
                         out + o0, OC);
    }
    free(tile);
    if (bias) {
#pragma omp parallel for schedule(static)
        for (int i = 0; i < N; i++)
            for (int o = 0; o < OC; o++) out[(long)i * OC + o] += bias[o];
    }
}

void cpu_matmul_forward_q8(float *out, const float *inp, const Q8Matrix *weight, const float *bias, int N, int IC,
                           int OC, int kernel_rows) {
    check_shape(weight, IC, OC);
    if (kernel_rows >= Q8_SGEMM_MIN_ROWS) matmul_q8_dequantized(out, inp, weight, bias, N, IC, OC);
    else if (weight->type == QUANT_NF4) cpu_matmul_nf4(out, inp, weight, bias, N, IC, OC);
    else if (weight->type == QUANT_BF16) cpu_matmul_bf16(out, inp, weight, bias, N, IC, OC); // ops/cpu/matmul_bf16.c
    else if (quant_is_kquant(weight->type)) cpu_matmul_kquant(out, inp, weight, bias, N, IC, OC);
    else if (cpu_matmul_q5_takes(weight->type)) cpu_matmul_q5(out, inp, weight, bias, N, IC, OC);
    else matmul_q8_integer(out, inp, weight, bias, N, IC, OC);
}

void cpu_matmul_forward_dequantized(float *out, const float *inp, const Q8Matrix *weight, const float *bias, int N,
                                    int IC, int OC) {
    check_shape(weight, IC, OC);
    matmul_q8_dequantized(out, inp, weight, bias, N, IC, OC);
}

// dinp[N, IC] += dout[N, OC] . W[OC, IC], W a tile of DEQUANTIZED_TILE rows at a time: each
// tile's rows are a slice of dout's columns, and sgemm adds that slice's product into dinp.
void cpu_matmul_backward_input_q8(float *dinp, const float *dout, const Q8Matrix *weight, int N, int IC, int OC) {
    check_shape(weight, IC, OC);
    float *tile = xmalloc((size_t)DEQUANTIZED_TILE * IC * sizeof(float));
    for (int o0 = 0; o0 < OC; o0 += DEQUANTIZED_TILE) {
        const int rows = OC - o0 < DEQUANTIZED_TILE ? OC - o0 : DEQUANTIZED_TILE;
        dequantize_tile(tile, weight, o0, rows);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, IC, rows, 1.0f, dout + o0, OC, tile, IC, 1.0f, dinp,
                    IC);
    }
    free(tile);
}

void cpu_dequantize_rows(float *out, const Q8Matrix *weight, int first, int count) {
    CHECK(first >= 0 && count >= 0 && first + count <= weight->rows, "rows [%d, %d) of a quantized matrix of %d rows",
          first, first + count, weight->rows);
    quant_dequantize_rows(weight, first, count, out);
}
