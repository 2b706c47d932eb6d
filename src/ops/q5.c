#include "ops/q5.h"

#if defined(__AVX2__)
#include <immintrin.h>
#endif

void q5_0_unpack_row(const Q8Matrix *matrix, long r, int8_t *values) {
    const long blocks = matrix->cols / Q8_BLOCK;
    for (long b = 0; b < blocks; b++) {
        const uint8_t *nibbles = matrix->nibbles + (r * blocks + b) * (Q8_BLOCK / 2);
        const uint32_t high = matrix->high_bits[r * blocks + b];
        int8_t *out = values + b * Q8_BLOCK;
        // A decode step widens every weight row, so the block's 32 values go at once (a
        // byte-at-a-time loop took longer than the integer products it feeds, as Q4_0's did).
#if defined(__AVX512BW__) && defined(__AVX512VL__)
        // The fifth bits are a 32-bit mask as they are: where set, 16 is added back.
        const __m128i bytes = _mm_loadu_si128((const __m128i *)nibbles), nibble = _mm_set1_epi8(0x0F);
        const __m256i codes = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(bytes, 4), nibble), _mm_and_si128(bytes, nibble));
        const __m256i sixteen = _mm256_set1_epi8(16), low = _mm256_sub_epi8(codes, sixteen);
        _mm256_storeu_si256((__m256i *)out, _mm256_mask_add_epi8(low, (__mmask32)high, low, sixteen));
        continue;
#elif defined(__AVX2__)
        // Byte j of `spread` is byte j / 8 of the fifth bits; it keeps bit j % 8 as 0x10.
        const __m128i bytes = _mm_loadu_si128((const __m128i *)nibbles), nibble = _mm_set1_epi8(0x0F);
        const __m256i codes = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(bytes, 4), nibble), _mm_and_si128(bytes, nibble));
        const __m256i spread = _mm256_shuffle_epi8(_mm256_set1_epi32((int)high),
                                                   _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202,
                                                                     0x0101010101010101, 0x0000000000000000));
        const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201);
        const __m256i is_set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
        const __m256i fifth = _mm256_and_si256(is_set, _mm256_set1_epi8(0x10));
        _mm256_storeu_si256((__m256i *)out, _mm256_sub_epi8(_mm256_or_si256(codes, fifth), _mm256_set1_epi8(16)));
        continue;
#endif
        for (int j = 0; j < Q8_BLOCK / 2; j++) {
            out[j] = (int8_t)(((nibbles[j] & 0x0F) | (int)((high >> j) & 1) << 4) - 16);
            out[j + Q8_BLOCK / 2] = (int8_t)(((nibbles[j] >> 4) | (int)((high >> (j + 16)) & 1) << 4) - 16);
        }
    }
}

void q5_0_dequantize_rows(const Q8Matrix *matrix, long first, long count, float *out) {
    const long blocks = matrix->cols / Q8_BLOCK;
    for (long k = first * blocks; k < (first + count) * blocks; k++) { // the rows' blocks, in order
        const uint8_t *nibbles = matrix->nibbles + k * (Q8_BLOCK / 2);
        const uint32_t high = matrix->high_bits[k];
        const float scale = matrix->scales[k];
        float *y = out + (k - first * blocks) * Q8_BLOCK;
        for (int j = 0; j < Q8_BLOCK / 2; j++) {
            y[j] = (float)(((nibbles[j] & 0x0F) | (int)((high >> j) & 1) << 4) - 16) * scale;
            y[j + Q8_BLOCK / 2] = (float)(((nibbles[j] >> 4) | (int)((high >> (j + 16)) & 1) << 4) - 16) * scale;
        }
    }
}
