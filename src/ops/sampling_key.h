// The order sampling sorts and selects logits by, shared by the host's sampler
// (gen/sampler.c: top-p's radix sort), the CPU backend's candidates (ops/cpu/sampling.c) and
// the CUDA kernel (ops/cuda/sampling_rows.cuh, also compiled for the CPU by the emulation
// test): each float's 32-bit key, a larger float a smaller key, -0 the key of +0 (they
// compare equal as floats). For every float but NaN, a < b exactly when key(a) > key(b).
#pragma once
#include <stdint.h>
#include <string.h>

#if defined(__CUDACC__)
#define SAMPLING_KEY_INLINE static __host__ __device__ __forceinline__
#else
#define SAMPLING_KEY_INLINE static inline
#endif

SAMPLING_KEY_INLINE uint32_t sampling_descending_key(float x) {
    if (x == 0.0f) x = 0.0f;
#if defined(__CUDA_ARCH__)
    const uint32_t bits = __float_as_uint(x); // (memcpy would put x on the stack)
#else
    uint32_t bits;
    memcpy(&bits, &x, sizeof bits);
#endif
    const uint32_t ascending = bits & 0x80000000u ? ~bits : bits | 0x80000000u;
    return ~ascending;
}
