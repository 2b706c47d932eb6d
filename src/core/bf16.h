// bfloat16 on the host: the top 16 bits of an IEEE float32 (its sign, its 8 exponent bits,
// 7 of its 23 mantissa bits). The file readers widen a checkpoint's bf16 tensors with it
// (io/safetensors.c, io/gguf_dequant.c). A weight matrix held this way (--quantize bf16, ops.h
// QUANT_BF16) takes 2 bytes a weight, as a Hugging Face model loaded with
// torch_dtype=torch.bfloat16 does, and loses nothing of a checkpoint stored in bf16 (most
// are): such a file's values are read as floats and rounded back to the bits they came from.
#pragma once
#include <stdint.h>
#include <string.h>

// Round to nearest, ties to even -- what PyTorch's .to(torch.bfloat16) and CUDA's
// __float2bfloat16 do (ops/cuda's bf16 copies of float weights) -- so a float weight's bf16
// value here is the one the GPU's float matmul multiplies. A NaN stays a (quiet) NaN; a value
// past bf16's largest finite one rounds to infinity, as there.
static inline uint16_t bf16_round(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

// The float a bf16 value stands for, exactly.
static inline float bf16_value(uint16_t bits) {
    const uint32_t u = (uint32_t)bits << 16;
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

// n floats rounded to bf16 (bf16_round each).
static inline void bf16_round_row(const float *x, long n, uint16_t *out) {
    for (long i = 0; i < n; i++) out[i] = bf16_round(x[i]);
}
