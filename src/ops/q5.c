#include "ops/q5.h"

#include <stdbool.h>

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

void q4_1_q5_1_dequantize_rows(const Q8Matrix *matrix, long first, long count, float *out) {
    const long blocks = matrix->cols / Q8_BLOCK;
    const bool five_bits = matrix->type == QUANT_Q5_1;
    for (long k = first * blocks; k < (first + count) * blocks; k++) {
        const uint8_t *nibbles = matrix->nibbles + k * (Q8_BLOCK / 2);
        const uint32_t high = five_bits ? matrix->high_bits[k] : 0;
        const float scale = matrix->scales[k], min = matrix->mins[k];
        float *y = out + (k - first * blocks) * Q8_BLOCK;
        for (int j = 0; j < Q8_BLOCK / 2; j++) {
            y[j] = scale * (float)((nibbles[j] & 0x0F) | (int)((high >> j) & 1) << 4) + min;
            y[j + Q8_BLOCK / 2] = scale * (float)((nibbles[j] >> 4) | (int)((high >> (j + 16)) & 1) << 4) + min;
        }
    }
}
