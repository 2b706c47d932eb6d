#include "ops/kquant.h"

#include <math.h>

#include "core/check.h"
#include "io/gguf_dequant.h"
#include "io/gguf_quantize.h"

static GgmlType ggml_type_of(QuantType type) {
    CHECK(quant_is_kquant(type), "quantized type %d is not a K-quant", (int)type);
    switch (type) {
    case QUANT_Q4_K: return GGML_TYPE_Q4_K;
    case QUANT_Q5_K: return GGML_TYPE_Q5_K;
    case QUANT_Q3_K: return GGML_TYPE_Q3_K;
    case QUANT_Q2_K: return GGML_TYPE_Q2_K;
    default: return GGML_TYPE_Q6_K;
    }
}

long kquant_row_bytes(QuantType type, long cols) { return cols / KQ_BLOCK * kquant_block_bytes(type); }

void kquant_quantize_matrix(Q8Matrix *matrix, QuantType type, const float *weight, long rows, long cols,
                            void *(*alloc)(size_t)) {
    CHECK(cols % KQ_BLOCK == 0, "a K-quant row of %ld values is not whole super-blocks of %d", cols, KQ_BLOCK);
    matrix->rows = (int)rows;
    matrix->cols = (int)cols;
    matrix->type = type;
    matrix->scales = NULL;
    matrix->blocks = alloc((size_t)(rows * kquant_row_bytes(type, cols)));
    // Rows are contiguous and whole super-blocks, so the matrix is one run of blocks.
    gguf_quantize(ggml_type_of(type), weight, matrix->blocks, rows * cols);
}

void kquant_dequantize_rows(const Q8Matrix *matrix, long first, long count, float *out) {
    const long row_bytes = kquant_row_bytes(matrix->type, matrix->cols);
    gguf_dequantize(ggml_type_of(matrix->type), matrix->blocks + first * row_bytes, out, count * matrix->cols);
}

void kquant_quantize_input(const float *x, long cols, KQuantInput *input) {
    for (long b = 0; b < cols / KQ_BLOCK; b++) {
        const float *block = x + b * KQ_BLOCK;
        int8_t *values = input->values + b * KQ_BLOCK;
        float largest = 0.0f;
        for (int i = 0; i < KQ_BLOCK; i++) {
            const float magnitude = fabsf(block[i]);
            largest = magnitude > largest ? magnitude : largest;
        }
        const float scale = largest / 127.0f;
        const float inverse = scale > 0.0f ? 1.0f / scale : 0.0f;
        input->scales[b] = scale;
        // rintf: nearest, ties to even; x * inverse stays within [-127, 127] up to a rounding
        // of the product, which rintf cannot take past 127.
        for (int i = 0; i < KQ_BLOCK; i++) values[i] = (int8_t)rintf(block[i] * inverse);
        for (int g = 0; g < KQ_BLOCK / 16; g++) {
            int sum = 0;
            for (int i = 0; i < 16; i++) sum += values[16 * g + i];
            input->sums[b * (KQ_BLOCK / 16) + g] = (int16_t)sum;
        }
    }
}
