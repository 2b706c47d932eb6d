// Decode steps over NF4 weights (fewer than Q8_SGEMM_MIN_ROWS input rows; ops/nf4.h): the
// inputs stay float and each weight is its dequantized value, level[code] * its block's
// scale, so out = inp . dequantized(W)^T as the float matmul of those values computes it, up
// to summation order. NF4's levels are not integers, so llama.cpp-style integer products do
// not apply; instead each block's 16 levels times its scale are one 16-float table, and a
// code is looked up in it (AVX-512: one vpermps per 16 codes).
//
// bitsandbytes' byte order puts value 2j of a block in byte j's high nibble and 2j + 1 in its
// low one, so each input row is first split, block by block, into its even and odd columns:
// the high nibbles of 16 bytes then pair with 16 consecutive floats of the even half.
//
// Each output is one thread's sum over the blocks in order (4 input rows share each decoded
// block), so results do not depend on the thread count.
#include <immintrin.h>
#include <stdlib.h>

#include "core/check.h"
#include "core/sanitizer.h"
#include "ops/cpu/ops_cpu.h"
#include "ops/nf4.h"

#define ROWS_AT_ONCE 4
#define HALF (NF4_BLOCK / 2)

// x [N, IC] -> split [N, IC]: for each block of 64, its 32 even columns, then its 32 odd ones.
static float *split_inputs(const float *inp, int N, int IC) {
    float *split = xmalloc((size_t)N * IC * sizeof(float));
    for (long i = 0; i < N; i++)
        for (long b = 0; b < IC / NF4_BLOCK; b++) {
            const float *x = inp + i * IC + b * NF4_BLOCK;
            float *s = split + i * IC + b * NF4_BLOCK;
            for (int j = 0; j < HALF; j++) {
                s[j] = x[2 * j];
                s[HALF + j] = x[2 * j + 1];
            }
        }
    return split;
}

#if defined(__AVX512F__)
// Rows [0, R) of the split inputs (R <= ROWS_AT_ONCE) against one weight row.
static void row_dot(float *out, long out_stride, const float *split, long IC, int R, const uint8_t *codes,
                    const float *scales, const float *code_book) {
    const __m512 levels = _mm512_loadu_ps(code_book);
    const __m512i low_mask = _mm512_set1_epi32(0x0F);
    __m512 acc[ROWS_AT_ONCE];
    for (int r = 0; r < ROWS_AT_ONCE; r++) acc[r] = _mm512_setzero_ps();
    for (long b = 0; b < IC / NF4_BLOCK; b++) {
        const __m512 table = _mm512_mul_ps(levels, _mm512_set1_ps(scales[b])); // the block's 16 weights
        for (int h = 0; h < 2; h++) { // two times 16 bytes: 32 values, even and odd
            const __m512i bytes = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(codes + b * HALF + h * 16)));
            const __m512 even = _mm512_permutexvar_ps(_mm512_srli_epi32(bytes, 4), table);
            const __m512 odd = _mm512_permutexvar_ps(_mm512_and_si512(bytes, low_mask), table);
            for (int r = 0; r < R; r++) {
                const float *x = split + r * IC + b * NF4_BLOCK + h * 16;
                acc[r] = _mm512_fmadd_ps(even, _mm512_loadu_ps(x), acc[r]);
                acc[r] = _mm512_fmadd_ps(odd, _mm512_loadu_ps(x + HALF), acc[r]);
            }
        }
    }
    for (int r = 0; r < R; r++) out[r * out_stride] = _mm512_reduce_add_ps(acc[r]);
}
#else
// Exempt from the sanitizers' per-access checks, as matmul.c's dot_rows: cpu_matmul_nf4
// checks the whole ranges first (core/sanitizer.h). The sanitizer build takes this loop.
SANITIZER_UNCHECKED static void row_dot(float *out, long out_stride, const float *split, long IC, int R,
                                        const uint8_t *codes, const float *scales, const float *code_book) {
    for (int r = 0; r < R; r++) {
        const float *x = split + r * IC;
        float sum = 0.0f;
        for (long b = 0; b < IC / NF4_BLOCK; b++) {
            float table[16];
            for (int q = 0; q < 16; q++) table[q] = code_book[q] * scales[b];
            for (int j = 0; j < HALF; j++) {
                const uint8_t byte = codes[b * HALF + j];
                sum += table[byte >> 4] * x[b * NF4_BLOCK + j] + table[byte & 0x0F] * x[b * NF4_BLOCK + HALF + j];
            }
        }
        out[r * out_stride] = sum;
    }
}
#endif

void cpu_matmul_nf4(float *out, const float *inp, const Q8Matrix *weight, const float *bias, int N, int IC, int OC) {
    CHECK(weight->type == QUANT_NF4 && weight->rows == OC && weight->cols == IC && IC % NF4_BLOCK == 0,
          "NF4 weight [%d, %d] used as [%d, %d]", weight->rows, weight->cols, OC, IC);
    float *split = split_inputs(inp, N, IC);
    SANITIZER_CHECK_RANGE(split, (size_t)N * IC * sizeof(float));
    SANITIZER_CHECK_RANGE(weight->nibbles, (size_t)OC * IC / 2);
    SANITIZER_CHECK_RANGE(out, (size_t)N * OC * sizeof(float));
#pragma omp parallel
    {
    float *scales = xmalloc((size_t)(IC / NF4_BLOCK) * sizeof(float));
    SANITIZER_CHECK_RANGE(scales, (size_t)(IC / NF4_BLOCK) * sizeof(float));
#pragma omp for schedule(static)
    for (int o = 0; o < OC; o++) {
        nf4_row_scales(weight, o, 1, scales);
        const uint8_t *codes = weight->nibbles + (long)o * IC / 2;
        for (int i = 0; i < N; i += ROWS_AT_ONCE) {
            const int R = N - i < ROWS_AT_ONCE ? N - i : ROWS_AT_ONCE;
            row_dot(out + (long)i * OC + o, OC, split + (long)i * IC, IC, R, codes, scales, quant_levels(weight));
            if (bias)
                for (int r = 0; r < R; r++) out[(long)(i + r) * OC + o] += bias[o];
        }
    }
    free(scales);
    }
    free(split);
}
