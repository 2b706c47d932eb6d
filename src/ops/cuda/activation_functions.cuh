// The activations' formulas (GELU's tanh approximation, SiLU) and their derivatives, as
// ops/cpu/activation.c computes them: the activation kernels' (activation_kernels.cuh) and
// the decode product's that applies the gated unit beside its sums (matvec.cuh's
// glu_product), so that both give the same bits.
#pragma once
#include <math.h>

#include "ops/cuda/device_primitives.cuh"

namespace activation_kernels {

constexpr float GELU_SCALE = 0.7978845608028654f; // sqrt(2 / pi)
constexpr float GELU_CUBIC = 0.044715f;

DEVICE_INLINE float gelu(float x) {
    float inner = GELU_SCALE * (x + GELU_CUBIC * x * x * x);
    return 0.5f * x * (1.0f + tanhf(inner));
}

DEVICE_INLINE float gelu_derivative(float x) {
    float inner = GELU_SCALE * (x + GELU_CUBIC * x * x * x);
    float t = tanhf(inner);
    float dinner = GELU_SCALE * (1.0f + 3.0f * GELU_CUBIC * x * x);
    return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * dinner;
}

DEVICE_INLINE float silu(float x) { return x / (1.0f + expf(-x)); }

DEVICE_INLINE float silu_derivative(float x) {
    float sig = 1.0f / (1.0f + expf(-x));
    return sig * (1.0f + x * (1.0f - sig));
}

} // namespace activation_kernels
