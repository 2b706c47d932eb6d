// Rotary position embedding in the Hugging Face "rotate half" layout: dimension i of a
// head pairs with dimension i + head_dim/2, rotated by position * inv_freq[i]. The
// frequencies come from the model (model/config.c rope_inverse_frequencies, float32 as
// transformers computes them, with the config's RoPE scaling), so long positions round the
// same way as in transformers.
#include <math.h>

#include "ops/cpu/ops_cpu.h"

static void rope_rotate(float *x, const int *positions, int N, int n_heads, int head_dim,
                        const float *inv_freq, float direction) {
    int half = head_dim / 2;
#pragma omp parallel for schedule(static)
    for (int row = 0; row < N; row++) {
        float position = (float)positions[row];
        for (int h = 0; h < n_heads; h++) {
            float *head = x + ((long)row * n_heads + h) * head_dim;
            for (int i = 0; i < half; i++) {
                float angle = position * inv_freq[i];
                float c = cosf(angle), s = direction * sinf(angle);
                float x1 = head[i], x2 = head[i + half];
                head[i] = x1 * c - x2 * s;
                head[i + half] = x2 * c + x1 * s;
            }
        }
    }
}

void cpu_rope_forward(float *x, const int *positions, int N, int n_heads, int head_dim,
                      const float *inv_freq) {
    rope_rotate(x, positions, N, n_heads, head_dim, inv_freq, 1.0f);
}

void cpu_rope_backward(float *dx, const int *positions, int N, int n_heads, int head_dim,
                       const float *inv_freq) {
    rope_rotate(dx, positions, N, n_heads, head_dim, inv_freq, -1.0f);
}
