// The order sampling sorts and selects logits by, shared by the host's sampler
// (gen/sampler.c: top-p's radix sort), the CPU backend's candidates (ops/cpu/sampling.c) and
// the CUDA kernel (ops/cuda/sampling_rows.cuh, also compiled for the CPU by the emulation
// test): each float's 32-bit key, a larger float a smaller key, -0 the key of +0 (they
// compare equal as floats). For every float but NaN, a < b exactly when key(a) > key(b).
// Also top-k's threshold on the host (the sampler's and the CPU op's), by floats: for every
// float but NaN the same tokens as the CUDA kernel's selection by keys.
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

#if !defined(__CUDA_ARCH__)
// The k-th largest of x[0..n) (1-based k <= n), by quickselect on a copy in work[0..n).
static inline float sampling_kth_largest(const float *x, int n, int k, float *work) {
    memcpy(work, x, (size_t)n * sizeof(float));
    int lo = 0, hi = n - 1;
    const int target = k - 1;
    while (lo < hi) {
        const float pivot = work[(lo + hi) / 2];
        int i = lo, j = hi;
        while (i <= j) {
            while (work[i] > pivot) i++;
            while (work[j] < pivot) j--;
            if (i <= j) {
                const float swap = work[i];
                work[i] = work[j], work[j] = swap;
                i++, j--;
            }
        }
        if (target <= j) hi = j;
        else if (target >= i) lo = i;
        else break;
    }
    return work[target];
}
#endif
