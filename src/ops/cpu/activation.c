// GELU (tanh approximation, GPT-2's "gelu_new" and Gemma's "gelu_pytorch_tanh") and the
// gated units SwiGLU / GeGLU. The tanh is vector_math.h's (within 3 ulp of tanh), so that the
// GELU loops vectorise: libm's tanhf, one element at a time, took about a tenth of a Gemma 2
// training step (bench/train_step --model gemma2-135m, under perf).
#include <math.h>

#include "ops/cpu/ops_cpu.h"

#define GELU_SCALE 0.7978845608028654f // sqrt(2 / pi)
#define GELU_CUBIC 0.044715f

// tanh(sqrt(2 / pi) (x + 0.044715 x^3)), which GELU and its derivative share.
static inline float gelu_tanh(float x) { return tanh_one(GELU_SCALE * (x + GELU_CUBIC * x * x * x)); }

static inline float gelu(float x) { return 0.5f * x * (1.0f + gelu_tanh(x)); }

// The derivative, given gelu_tanh(x).
static inline float gelu_derivative(float x, float t) {
    float dinner = GELU_SCALE * (1.0f + 3.0f * GELU_CUBIC * x * x);
    return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * dinner;
}

static inline float silu(float x) { return x / (1.0f + expf(-x)); }

static inline float silu_derivative(float x) {
    float sig = 1.0f / (1.0f + expf(-x));
    return sig * (1.0f + x * (1.0f - sig));
}

void cpu_gelu_forward(float *out, const float *inp, long n) {
#pragma omp parallel for simd schedule(static)
    for (long i = 0; i < n; i++) out[i] = gelu(inp[i]);
}

// `act`: for a backend that keeps copies of matmul inputs (ops.h); unused here.
void cpu_gelu_backward(float *dinp, const float *dout, const float *inp, const float *act, long n) {
#pragma omp parallel for simd schedule(static)
    for (long i = 0; i < n; i++) dinp[i] = dout[i] * gelu_derivative(inp[i], gelu_tanh(inp[i]));
}

void cpu_glu_forward(float *out, const float *gate, const float *up, long n, bool use_gelu) {
    if (use_gelu) {
#pragma omp parallel for simd schedule(static)
        for (long i = 0; i < n; i++) out[i] = gelu(gate[i]) * up[i];
        return;
    }
#pragma omp parallel for schedule(static)
    for (long i = 0; i < n; i++) out[i] = silu(gate[i]) * up[i];
}

void cpu_glu_backward(float *dgate, float *dup, const float *dout, const float *gate,
                      const float *up, const float *act, long n, bool use_gelu) {
    if (use_gelu) {
#pragma omp parallel for simd schedule(static)
        for (long i = 0; i < n; i++) {
            const float g = gate[i], t = gelu_tanh(g);
            dgate[i] = dout[i] * up[i] * gelu_derivative(g, t);
            dup[i] = dout[i] * (0.5f * g * (1.0f + t));
        }
        return;
    }
#pragma omp parallel for schedule(static)
    for (long i = 0; i < n; i++) {
        float g = gate[i];
        float activation = silu(g);
        float dact = silu_derivative(g);
        dgate[i] = dout[i] * up[i] * dact;
        dup[i] = dout[i] * activation;
    }
}
