// Rotary position embedding in the Hugging Face "rotate half" layout: dimension i of a
// head pairs with dimension i + head_dim/2, rotated by position * inv_freq[i]. The
// frequencies come from the model (model/config.c rope_inverse_frequencies, float32 as
// transformers computes them, with the config's RoPE scaling), so long positions round the
// same way as in transformers.
#include <math.h>
#include <stdlib.h>

#include "core/check.h"
#include "ops/cpu/ops_cpu.h"

// A row's cosines and sines are computed once for all its heads (a thread's table of
// head_dim floats): the same values as computing them for each head, a head's worth of
// cosf and sinf instead of one per head.
static void rope_rotate(float *x, const int *positions, int N, int n_heads, int head_dim,
                        const float *inv_freq, float direction) {
    const int half = head_dim / 2;
#pragma omp parallel
    {
        float *cos_sin = xmalloc((size_t)(half > 0 ? 2 * half : 1) * sizeof(float)); // cos, then sin * direction
#pragma omp for schedule(static)
        for (int row = 0; row < N; row++) {
            const float position = (float)positions[row];
            for (int i = 0; i < half; i++) {
                const float angle = position * inv_freq[i];
                cos_sin[i] = cosf(angle);
                cos_sin[half + i] = direction * sinf(angle);
            }
            for (int h = 0; h < n_heads; h++) {
                float *head = x + ((long)row * n_heads + h) * head_dim;
                for (int i = 0; i < half; i++) {
                    const float c = cos_sin[i], s = cos_sin[half + i];
                    const float x1 = head[i], x2 = head[i + half];
                    head[i] = x1 * c - x2 * s;
                    head[i + half] = x2 * c + x1 * s;
                }
            }
        }
        free(cos_sin);
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
