// DoRA's elementwise parts (ops.h dora_weight_norm / dora_forward / dora_backward): the row
// norms of the adapted weight, the magnitude's rescaling of a layer's output, and its
// backward. The matrix products around them are the ordinary matmul ops (model/lora.c).
#include <math.h>

#include "ops/cpu/ops_cpu.h"

void cpu_dora_weight_norm(float *norm, const float *weight, const float *delta, float scale, int rows, int cols) {
#pragma omp parallel for schedule(static)
    for (int r = 0; r < rows; r++) {
        const float *w = weight + (long)r * cols, *d = delta + (long)r * cols;
        double sum = 0;
        for (int c = 0; c < cols; c++) {
            const float v = w[c] + scale * d[c];
            sum += (double)v * v;
        }
        norm[r] = (float)sqrt(sum);
    }
}

void cpu_dora_forward(float *out, float *z, const float *base, const float *bias, const float *magnitude,
                      const float *norm, int N, int OC) {
#pragma omp parallel for schedule(static)
    for (long t = 0; t < N; t++)
        for (int o = 0; o < OC; o++) {
            const long i = t * OC + o;
            const float s = magnitude[o] / norm[o];
            const float b = base ? base[i] : out[i] - (bias ? bias[o] : 0.0f);
            const float lora = z[i];
            z[i] = b + lora;
            out[i] += (s - 1.0f) * b + s * lora;
        }
}

// Columns per task of the magnitude gradient: each task sums its columns over every row,
// in row order, so the result does not depend on the number of threads.
enum { DORA_COLUMNS = 32 };

void cpu_dora_backward(float *dmagnitude, float *dscaled, const float *dout, const float *z, const float *magnitude,
                       const float *norm, float shift, int N, int OC) {
#pragma omp parallel for schedule(static)
    for (long t = 0; t < N; t++)
        for (int o = 0; o < OC; o++) dscaled[t * OC + o] = (magnitude[o] / norm[o] + shift) * dout[t * OC + o];
    if (!dmagnitude) return;
    const int tasks = (OC + DORA_COLUMNS - 1) / DORA_COLUMNS;
#pragma omp parallel for schedule(static)
    for (int task = 0; task < tasks; task++) {
        const int first = task * DORA_COLUMNS, last = first + DORA_COLUMNS < OC ? first + DORA_COLUMNS : OC;
        double sum[DORA_COLUMNS] = {0};
        for (long t = 0; t < N; t++)
            for (int o = first; o < last; o++) sum[o - first] += (double)dout[t * OC + o] * z[t * OC + o];
        for (int o = first; o < last; o++) dmagnitude[o] += (float)(sum[o - first] / norm[o]);
    }
}
