// Decode steps over bf16 weights (ops/cpu/matmul_bf16.h). What a one-row step costs is
// reading the weights, 2 bytes each here against 4 for float32, with the inputs and every sum
// kept in float32: a bf16 value widens to float exactly (its bits shifted up 16), and the
// products and sums are the float kernel's, only the weights rounded. Measured on this
// project's 2-core AMD EPYC (bench/matmul_bf16, weights from memory): SmolLM2's [1536, 576]
// product at one input row in 50 us (36 GB/s of weights) against the float32 product's 101;
// from about 4 input rows the machine's multiply-add rate bounds it, and at 32 rows OpenBLAS's
// sgemm, which keeps its inputs in registers, is 1.4x faster.
//
// The vector paths hold the 32 lanes of matmul_bf16.h as two 16-float registers (AVX-512) or
// four 8-float ones (AVX2), each lane's sum a chain of fused multiply-adds, and add the lanes
// in the order the portable loop does: they give its bits, which tests/test_quantize.c checks.
// Prefills and training (Q8_SGEMM_MIN_ROWS rows or more, matmul_forward_dequantized) take
// matmul_q8.c's dequantized tiles and sgemm, as every other weight type does.
#include "ops/cpu/matmul_bf16.h"

#include <immintrin.h>
#include <math.h>

#include "core/check.h"
#include "core/sanitizer.h"
#include "core/bf16.h"

// lanes[0, 32) added in halves: l + 16 into l, then l + 8, l + 4, l + 2, l + 1.
static float lanes_sum(float lanes[BF16_LANES]) {
    for (int width = BF16_LANES / 2; width >= 1; width /= 2)
        for (int l = 0; l < width; l++) lanes[l] += lanes[l + width];
    return lanes[0];
}

// ---- the portable loop (the reference; the sanitizer build runs it) ----
// Unchecked access by access: cpu_matmul_bf16 checks the whole ranges once per call.
SANITIZER_UNCHECKED void bf16_row_dot_portable(const uint16_t *row, const float *inp, int inputs, long IC, float *out,
                                               long out_stride) {
    for (int i = 0; i < inputs; i++) {
        const float *x = inp + i * IC;
        float lanes[BF16_LANES] = {0};
        for (long c = 0; c < IC; c += BF16_LANES)
            for (int l = 0; l < BF16_LANES; l++) lanes[l] = fmaf(x[c + l], bf16_value(row[c + l]), lanes[l]);
        out[i * out_stride] = lanes_sum(lanes);
    }
}

// The vector paths keep each input's lanes in named registers (an array of them indexed by a
// run-time input count was left on the stack by GCC, a load and a store in every chain). A
// chain of fused multiply-adds waits for the one before (4 cycles), so one input's 2 (AVX-512)
// or 4 (AVX2) chains use a quarter of the FMA units: several inputs go through the weight row
// together, sharing each widened weight -- 4 at a time on AVX-512 (8 chains), 2 on AVX2 (8
// chains in 16 registers) -- and the rest one at a time.
#if defined(__AVX2__) && defined(__FMA__)
// 8 bf16 values at p as floats: each widened to 32 bits and shifted into the top half.
static inline __m256 load8_bf16(const uint16_t *p) {
    const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
}

// l + 16 into l (registers 2, 3 into 0, 1), then l + 8, 4, 2, 1: register k holds lanes [8k, 8k + 8).
static inline float lanes_sum_avx2(__m256 acc0, __m256 acc1, __m256 acc2, __m256 acc3) {
    const __m256 eight = _mm256_add_ps(_mm256_add_ps(acc0, acc2), _mm256_add_ps(acc1, acc3));
    __m128 v = _mm_add_ps(_mm256_castps256_ps128(eight), _mm256_extractf128_ps(eight, 1));
    v = _mm_add_ps(v, _mm_movehl_ps(v, v));
    v = _mm_add_ss(v, _mm_shuffle_ps(v, v, 1));
    return _mm_cvtss_f32(v);
}

// Two inputs x, y through the row at once.
SANITIZER_UNCHECKED static void row_dot2_avx2(const uint16_t *row, const float *x, const float *y, long IC, float *out_x,
                                              float *out_y) {
    __m256 x0 = _mm256_setzero_ps(), x1 = _mm256_setzero_ps(), x2 = _mm256_setzero_ps(), x3 = _mm256_setzero_ps();
    __m256 y0 = _mm256_setzero_ps(), y1 = _mm256_setzero_ps(), y2 = _mm256_setzero_ps(), y3 = _mm256_setzero_ps();
    for (long c = 0; c < IC; c += BF16_LANES) {
        const __m256 w0 = load8_bf16(row + c), w1 = load8_bf16(row + c + 8);
        const __m256 w2 = load8_bf16(row + c + 16), w3 = load8_bf16(row + c + 24);
        x0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + c), w0, x0);
        y0 = _mm256_fmadd_ps(_mm256_loadu_ps(y + c), w0, y0);
        x1 = _mm256_fmadd_ps(_mm256_loadu_ps(x + c + 8), w1, x1);
        y1 = _mm256_fmadd_ps(_mm256_loadu_ps(y + c + 8), w1, y1);
        x2 = _mm256_fmadd_ps(_mm256_loadu_ps(x + c + 16), w2, x2);
        y2 = _mm256_fmadd_ps(_mm256_loadu_ps(y + c + 16), w2, y2);
        x3 = _mm256_fmadd_ps(_mm256_loadu_ps(x + c + 24), w3, x3);
        y3 = _mm256_fmadd_ps(_mm256_loadu_ps(y + c + 24), w3, y3);
    }
    *out_x = lanes_sum_avx2(x0, x1, x2, x3);
    *out_y = lanes_sum_avx2(y0, y1, y2, y3);
}

SANITIZER_UNCHECKED static void row_dot_avx2(const uint16_t *row, const float *inp, int inputs, long IC, float *out,
                                             long out_stride) {
    int i = 0;
    for (; i + 2 <= inputs; i += 2)
        row_dot2_avx2(row, inp + i * IC, inp + (i + 1) * IC, IC, out + i * out_stride, out + (i + 1) * out_stride);
    for (; i < inputs; i++) {
        const float *x = inp + i * IC;
        // Register k holds lanes [8k, 8k + 8).
        __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps(), acc2 = _mm256_setzero_ps(),
               acc3 = _mm256_setzero_ps();
        for (long c = 0; c < IC; c += BF16_LANES) {
            acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + c), load8_bf16(row + c), acc0);
            acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(x + c + 8), load8_bf16(row + c + 8), acc1);
            acc2 = _mm256_fmadd_ps(_mm256_loadu_ps(x + c + 16), load8_bf16(row + c + 16), acc2);
            acc3 = _mm256_fmadd_ps(_mm256_loadu_ps(x + c + 24), load8_bf16(row + c + 24), acc3);
        }
        out[i * out_stride] = lanes_sum_avx2(acc0, acc1, acc2, acc3);
    }
}
const Bf16RowDot bf16_row_dot_avx2 = row_dot_avx2;
#else
const Bf16RowDot bf16_row_dot_avx2 = NULL;
#endif

#if defined(__AVX512F__)
static inline __m512 load16_bf16(const uint16_t *p) {
    const __m512i wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
}

// Lanes [0, 16) in low, [16, 32) in high: l + 16 into l, then l + 8, 4, 2, 1.
static inline float lanes_sum_avx512(__m512 low, __m512 high) {
    const __m512 sixteen = _mm512_add_ps(low, high);
    const __m256 eight = _mm256_add_ps(_mm512_castps512_ps256(sixteen), _mm512_extractf32x8_ps(sixteen, 1));
    __m128 v = _mm_add_ps(_mm256_castps256_ps128(eight), _mm256_extractf128_ps(eight, 1));
    v = _mm_add_ps(v, _mm_movehl_ps(v, v));
    v = _mm_add_ss(v, _mm_shuffle_ps(v, v, 1));
    return _mm_cvtss_f32(v);
}

// Four inputs (rows of inp, IC apart) through the row at once.
SANITIZER_UNCHECKED static void row_dot4_avx512(const uint16_t *row, const float *inp, long IC, float *out,
                                                long out_stride) {
    const float *x0 = inp, *x1 = inp + IC, *x2 = inp + 2 * IC, *x3 = inp + 3 * IC;
    __m512 low0 = _mm512_setzero_ps(), high0 = _mm512_setzero_ps(), low1 = _mm512_setzero_ps(),
           high1 = _mm512_setzero_ps(), low2 = _mm512_setzero_ps(), high2 = _mm512_setzero_ps(),
           low3 = _mm512_setzero_ps(), high3 = _mm512_setzero_ps();
    for (long c = 0; c < IC; c += BF16_LANES) {
        const __m512 w_low = load16_bf16(row + c), w_high = load16_bf16(row + c + 16);
        low0 = _mm512_fmadd_ps(_mm512_loadu_ps(x0 + c), w_low, low0);
        high0 = _mm512_fmadd_ps(_mm512_loadu_ps(x0 + c + 16), w_high, high0);
        low1 = _mm512_fmadd_ps(_mm512_loadu_ps(x1 + c), w_low, low1);
        high1 = _mm512_fmadd_ps(_mm512_loadu_ps(x1 + c + 16), w_high, high1);
        low2 = _mm512_fmadd_ps(_mm512_loadu_ps(x2 + c), w_low, low2);
        high2 = _mm512_fmadd_ps(_mm512_loadu_ps(x2 + c + 16), w_high, high2);
        low3 = _mm512_fmadd_ps(_mm512_loadu_ps(x3 + c), w_low, low3);
        high3 = _mm512_fmadd_ps(_mm512_loadu_ps(x3 + c + 16), w_high, high3);
    }
    out[0] = lanes_sum_avx512(low0, high0);
    out[out_stride] = lanes_sum_avx512(low1, high1);
    out[2 * out_stride] = lanes_sum_avx512(low2, high2);
    out[3 * out_stride] = lanes_sum_avx512(low3, high3);
}

SANITIZER_UNCHECKED static void row_dot_avx512(const uint16_t *row, const float *inp, int inputs, long IC, float *out,
                                               long out_stride) {
    if (inputs == 4) {
        row_dot4_avx512(row, inp, IC, out, out_stride);
        return;
    }
    for (int i = 0; i < inputs; i++) {
        const float *x = inp + i * IC;
        __m512 low = _mm512_setzero_ps(), high = _mm512_setzero_ps();
        for (long c = 0; c < IC; c += BF16_LANES) {
            low = _mm512_fmadd_ps(_mm512_loadu_ps(x + c), load16_bf16(row + c), low);
            high = _mm512_fmadd_ps(_mm512_loadu_ps(x + c + 16), load16_bf16(row + c + 16), high);
        }
        out[i * out_stride] = lanes_sum_avx512(low, high);
    }
}
const Bf16RowDot bf16_row_dot_avx512 = row_dot_avx512;
#else
const Bf16RowDot bf16_row_dot_avx512 = NULL;
#endif

// (The sanitizer build is compiled without -march=native: the portable loop.)
#if defined(__AVX512F__)
const Bf16RowDot bf16_row_dot_best = row_dot_avx512;
const char *const bf16_best_path_name = "avx512";
#elif defined(__AVX2__) && defined(__FMA__)
const Bf16RowDot bf16_row_dot_best = row_dot_avx2;
const char *const bf16_best_path_name = "avx2";
#else
const Bf16RowDot bf16_row_dot_best = bf16_row_dot_portable;
const char *const bf16_best_path_name = "portable";
#endif

void cpu_matmul_bf16(float *out, const float *inp, const Q8Matrix *weight, const float *bias, int N, int IC, int OC) {
    CHECK(weight->type == QUANT_BF16 && weight->rows == OC && weight->cols == IC && IC % BF16_LANES == 0,
          "bf16 weight [%d, %d] used as [%d, %d]", weight->rows, weight->cols, OC, IC);
    SANITIZER_CHECK_RANGE(inp, (size_t)N * IC * sizeof(float));
    SANITIZER_CHECK_RANGE(weight->bf16, (size_t)OC * IC * sizeof(uint16_t));
    SANITIZER_CHECK_RANGE(out, (size_t)N * OC * sizeof(float));
#pragma omp parallel for schedule(static)
    for (int o = 0; o < OC; o++) {
        const uint16_t *row = weight->bf16 + (long)o * IC;
        for (int i = 0; i < N; i += BF16_INPUTS) {
            const int inputs = N - i < BF16_INPUTS ? N - i : BF16_INPUTS;
            bf16_row_dot_best(row, inp + (long)i * IC, inputs, IC, out + (long)i * OC + o, OC);
            if (bias)
                for (int r = 0; r < inputs; r++) out[(long)(i + r) * OC + o] += bias[o];
        }
    }
}
