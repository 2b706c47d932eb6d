#include "ops/q4.h"

#include <math.h>

#include "core/bf16.h"
#include "io/gguf_write.h"
#include "io/gguf_dequant.h"
#include "ops/kquant.h"
#include "ops/nf4.h"
#include "ops/q5.h"

void q4_quantize_block(const float *x, uint8_t *nibbles, float *scale) {
    float extreme = 0.0f;
    for (int i = 0; i < Q8_BLOCK; i++)
        if (fabsf(x[i]) > fabsf(extreme)) extreme = x[i];
    const float d = extreme / -8.0f;
    const float inverse = d != 0.0f ? 1.0f / d : 0.0f;
    *scale = gguf_f16_to_f32(gguf_f32_to_f16(d));
    for (int j = 0; j < Q8_BLOCK / 2; j++) {
        int low = (int)(x[j] * inverse + 8.5f), high = (int)(x[j + Q8_BLOCK / 2] * inverse + 8.5f);
        low = low > 15 ? 15 : low;
        high = high > 15 ? 15 : high;
        nibbles[j] = (uint8_t)(low | high << 4);
    }
}

void q4_quantize_row(const float *x, long n, uint8_t *nibbles, float *scales) {
    for (long block = 0; block < n / Q8_BLOCK; block++)
        q4_quantize_block(x + block * Q8_BLOCK, nibbles + block * (Q8_BLOCK / 2), scales + block);
}

void quant_dequantize_rows(const Q8Matrix *matrix, long first, long count, float *out) {
    if (matrix->type == QUANT_NF4) {
        nf4_dequantize_rows(matrix, first, count, out);
        return;
    }
    if (quant_is_kquant(matrix->type)) {
        kquant_dequantize_rows(matrix, first, count, out);
        return;
    }
    if (matrix->type == QUANT_Q5_0) {
        q5_0_dequantize_rows(matrix, first, count, out);
        return;
    }
    if (matrix->type == QUANT_Q4_1 || matrix->type == QUANT_Q5_1) {
        q4_1_q5_1_dequantize_rows(matrix, first, count, out);
        return;
    }
    if (matrix->type == QUANT_BF16) {
        const uint16_t *values = matrix->bf16 + first * (long)matrix->cols;
        for (long i = 0; i < count * (long)matrix->cols; i++) out[i] = bf16_value(values[i]);
        return;
    }
    const long cols = matrix->cols, blocks = cols / Q8_BLOCK;
    for (long i = 0; i < count; i++) {
        const long r = first + i;
        const float *scales = matrix->scales + r * blocks;
        float *row = out + i * cols;
        if (matrix->type == QUANT_Q8_0) {
            const int8_t *values = matrix->values + r * cols;
            for (long b = 0; b < blocks; b++)
                for (long c = b * Q8_BLOCK; c < (b + 1) * Q8_BLOCK; c++) row[c] = values[c] * scales[b];
        } else if (matrix->type == QUANT_IQ4_NL) { // the level times the scale, as gguf_dequantize
            const uint8_t *codes = matrix->nibbles + r * cols / 2;
            for (long b = 0; b < blocks; b++) {
                const uint8_t *block = codes + b * (Q8_BLOCK / 2);
                float *y = row + b * Q8_BLOCK;
                for (int j = 0; j < Q8_BLOCK / 2; j++) {
                    y[j] = scales[b] * (float)gguf_iq4_levels[block[j] & 0x0F];
                    y[j + Q8_BLOCK / 2] = scales[b] * (float)gguf_iq4_levels[block[j] >> 4];
                }
            }
        } else { // Q4_0
            const uint8_t *codes = matrix->nibbles + r * cols / 2;
            for (long b = 0; b < blocks; b++) {
                const uint8_t *block = codes + b * (Q8_BLOCK / 2);
                float *y = row + b * Q8_BLOCK;
                for (int j = 0; j < Q8_BLOCK / 2; j++) {
                    y[j] = (float)((block[j] & 0x0F) - 8) * scales[b];
                    y[j + Q8_BLOCK / 2] = (float)((block[j] >> 4) - 8) * scales[b];
                }
            }
        }
    }
}

long quant_matrix_bytes(const Q8Matrix *matrix) {
    const long n = (long)matrix->rows * matrix->cols, blocks = n / Q8_BLOCK;
    switch (matrix->type) {
    case QUANT_Q8_0: return n + blocks * (long)sizeof(float);
    case QUANT_Q4_0:
    case QUANT_IQ4_NL: return n / 2 + blocks * (long)sizeof(float);
    case QUANT_Q5_0: return n / 2 + blocks * (long)(sizeof(float) + sizeof(uint32_t));
    case QUANT_Q4_1: return n / 2 + blocks * (long)(2 * sizeof(float));
    case QUANT_Q5_1: return n / 2 + blocks * (long)(2 * sizeof(float) + sizeof(uint32_t));
    case QUANT_Q4_K:
    case QUANT_Q5_K:
    case QUANT_Q6_K:
    case QUANT_Q3_K:
    case QUANT_Q2_K: return matrix->rows * kquant_row_bytes(matrix->type, matrix->cols);
    case QUANT_BF16: return n * (long)sizeof(uint16_t);
    case QUANT_NF4: {
        const long nf4_blocks = n / NF4_BLOCK;
        return n / 2 + (matrix->scales ? nf4_blocks * (long)sizeof(float)
                                       : nf4_blocks + (nf4_blocks + 255) / 256 * (long)sizeof(float));
    }
    }
    return 0;
}
