#include <math.h>

#include "ops/q8.h"

void q8_quantize_row(const float *x, long n, int8_t *values, float *scales) {
    for (long block = 0; block < n / Q8_BLOCK; block++) {
        const float *in = x + block * Q8_BLOCK;
        float largest = 0.0f;
        for (int i = 0; i < Q8_BLOCK; i++) {
            float magnitude = fabsf(in[i]);
            largest = magnitude > largest ? magnitude : largest; // vectorizes, unlike fmaxf
        }
        float scale = largest / 127.0f;
        // An all-zero block keeps scale 0 and values 0 (no division by zero).
        float inverse = scale > 0.0f ? 1.0f / scale : 0.0f;
        // Round to nearest, ties to even (rintf: one vector instruction, where roundf is a
        // library call per value); only exact ties differ from GGUF's reference roundf.
        for (int i = 0; i < Q8_BLOCK; i++) values[block * Q8_BLOCK + i] = (int8_t)rintf(in[i] * inverse);
        scales[block] = scale;
    }
}
