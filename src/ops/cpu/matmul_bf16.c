// Decode steps over bf16 weights (ops/cpu/matmul_bf16.h). What a step costs is reading the
// weights, 2 bytes each here against 4 for float32, so a bf16 model decodes up to twice as
// fast as the float model where the step is bound by memory (bench/decode), with the inputs
// and every sum kept in float32: a bf16 value widens to float exactly (its bits shifted up
// 16), and the products and sums are the float kernel's, only the weights rounded.
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
#include "ops/bf16.h"

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

// The vector paths take the inputs one at a time, each over the whole weight row (read again
// from L1 for the next input): each input's lanes are then a few named registers. (Looping
// over the inputs inside the column loop kept the accumulators in an array GCC left on the
// stack, a load and a store in every chain.)
#if defined(__AVX2__) && defined(__FMA__)
// 8 bf16 values at p as floats: each widened to 32 bits and shifted into the top half.
static inline __m256 load8_bf16(const uint16_t *p) {
    const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
}

SANITIZER_UNCHECKED static void row_dot_avx2(const uint16_t *row, const float *inp, int inputs, long IC, float *out,
                                             long out_stride) {
    for (int i = 0; i < inputs; i++) {
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
        // l + 16 into l: registers 2, 3 into 0, 1; then l + 8, 4, 2, 1.
        const __m256 eight = _mm256_add_ps(_mm256_add_ps(acc0, acc2), _mm256_add_ps(acc1, acc3));
        __m128 v = _mm_add_ps(_mm256_castps256_ps128(eight), _mm256_extractf128_ps(eight, 1));
        v = _mm_add_ps(v, _mm_movehl_ps(v, v));
        v = _mm_add_ss(v, _mm_shuffle_ps(v, v, 1));
        out[i * out_stride] = _mm_cvtss_f32(v);
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

SANITIZER_UNCHECKED static void row_dot_avx512(const uint16_t *row, const float *inp, int inputs, long IC, float *out,
                                               long out_stride) {
    for (int i = 0; i < inputs; i++) {
        const float *x = inp + i * IC;
        __m512 low = _mm512_setzero_ps(), high = _mm512_setzero_ps(); // lanes [0, 16) and [16, 32)
        for (long c = 0; c < IC; c += BF16_LANES) {
            low = _mm512_fmadd_ps(_mm512_loadu_ps(x + c), load16_bf16(row + c), low);
            high = _mm512_fmadd_ps(_mm512_loadu_ps(x + c + 16), load16_bf16(row + c + 16), high);
        }
        const __m512 sixteen = _mm512_add_ps(low, high); // l + 16 into l
        const __m256 eight = _mm256_add_ps(_mm512_castps512_ps256(sixteen), _mm512_extractf32x8_ps(sixteen, 1));
        __m128 v = _mm_add_ps(_mm256_castps256_ps128(eight), _mm256_extractf128_ps(eight, 1));
        v = _mm_add_ps(v, _mm_movehl_ps(v, v));
        v = _mm_add_ss(v, _mm_shuffle_ps(v, v, 1));
        out[i * out_stride] = _mm_cvtss_f32(v);
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
