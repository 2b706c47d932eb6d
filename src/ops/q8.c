#include <math.h>

#include "ops/q8.h"

void q8_quantize_block(const float *x, int n, int8_t *values, float *scale) {
    float largest = 0.0f;
    for (int i = 0; i < n; i++) {
        float magnitude = fabsf(x[i]);
        largest = magnitude > largest ? magnitude : largest; // vectorizes, unlike fmaxf
    }
    *scale = largest / 127.0f;
    // An all-zero block keeps scale 0 and values 0 (no division by zero).
    float inverse = *scale > 0.0f ? 1.0f / *scale : 0.0f;
    // Round to nearest, ties to even (rintf: one vector instruction, where roundf is a
    // library call per value); only exact ties differ from GGUF's reference roundf.
    for (int i = 0; i < n; i++) values[i] = (int8_t)rintf(x[i] * inverse);
}

void q8_quantize_row(const float *x, long n, int8_t *values, float *scales) {
    // Whole blocks: the inlined block loops run Q8_BLOCK times, which the compiler unrolls.
    for (long block = 0; block < n / Q8_BLOCK; block++)
        q8_quantize_block(x + block * Q8_BLOCK, Q8_BLOCK, values + block * Q8_BLOCK, scales + block);
}
