// GELU (tanh approximation, GPT-2's "gelu_new" and Gemma's "gelu_pytorch_tanh") and the
// gated units SwiGLU / GeGLU.
#include <math.h>

#include "ops/cpu/ops_cpu.h"

#define GELU_SCALE 0.7978845608028654f // sqrt(2 / pi)
#define GELU_CUBIC 0.044715f

static inline float gelu(float x) {
    float inner = GELU_SCALE * (x + GELU_CUBIC * x * x * x);
    return 0.5f * x * (1.0f + tanhf(inner));
}

static inline float gelu_derivative(float x) {
    float inner = GELU_SCALE * (x + GELU_CUBIC * x * x * x);
    float t = tanhf(inner);
    float dinner = GELU_SCALE * (1.0f + 3.0f * GELU_CUBIC * x * x);
    return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * dinner;
}

static inline float silu(float x) { return x / (1.0f + expf(-x)); }

static inline float silu_derivative(float x) {
    float sig = 1.0f / (1.0f + expf(-x));
    return sig * (1.0f + x * (1.0f - sig));
}

void cpu_gelu_forward(float *out, const float *inp, long n) {
#pragma omp parallel for schedule(static)
    for (long i = 0; i < n; i++) out[i] = gelu(inp[i]);
}

void cpu_gelu_backward(float *dinp, const float *dout, const float *inp, long n) {
#pragma omp parallel for schedule(static)
    for (long i = 0; i < n; i++) dinp[i] += dout[i] * gelu_derivative(inp[i]);
}

void cpu_glu_forward(float *out, const float *gate, const float *up, long n, bool use_gelu) {
#pragma omp parallel for schedule(static)
    for (long i = 0; i < n; i++) out[i] = (use_gelu ? gelu(gate[i]) : silu(gate[i])) * up[i];
}

void cpu_glu_backward(float *dgate, float *dup, const float *dout, const float *gate,
                      const float *up, long n, bool use_gelu) {
#pragma omp parallel for schedule(static)
    for (long i = 0; i < n; i++) {
        float g = gate[i];
        float act = use_gelu ? gelu(g) : silu(g);
        float dact = use_gelu ? gelu_derivative(g) : silu_derivative(g);
        dgate[i] += dout[i] * up[i] * dact;
        dup[i] += dout[i] * act;
    }
}
