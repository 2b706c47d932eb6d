// Philox4x32-10 (Salmon et al. 2011), the block function behind core/rng.h, in a header so
// that GPU kernels (ops/cuda) draw the same numbers as the CPU: a dropout mask made on the
// GPU is the CPU's mask bit for bit. Plain C and CUDA C++ both compile it.
#pragma once
#include <stdint.h>

#if defined(__CUDACC__)
#define PHILOX_FUNCTION static inline __host__ __device__
#else
#define PHILOX_FUNCTION static inline
#endif

typedef struct {
    uint32_t v[4];
} Philox4x32;

// The block for key `seed` and 128-bit counter (stream, counter).
PHILOX_FUNCTION Philox4x32 philox4x32_block(uint64_t seed, uint64_t stream, uint64_t counter) {
    const uint32_t multiplier0 = 0xD2511F53u, multiplier1 = 0xCD9E8D57u;
    const uint32_t weyl0 = 0x9E3779B9u, weyl1 = 0xBB67AE85u;
    uint32_t c0 = (uint32_t)counter, c1 = (uint32_t)(counter >> 32);
    uint32_t c2 = (uint32_t)stream, c3 = (uint32_t)(stream >> 32);
    uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
    for (int round = 0; round < 10; round++) {
        uint64_t p0 = (uint64_t)multiplier0 * c0;
        uint64_t p1 = (uint64_t)multiplier1 * c2;
        uint32_t hi0 = (uint32_t)(p0 >> 32), lo0 = (uint32_t)p0;
        uint32_t hi1 = (uint32_t)(p1 >> 32), lo1 = (uint32_t)p1;
        uint32_t n0 = hi1 ^ c1 ^ k0, n1 = lo1, n2 = hi0 ^ c3 ^ k1, n3 = lo0;
        c0 = n0, c1 = n1, c2 = n2, c3 = n3;
        k0 += weyl0;
        k1 += weyl1;
    }
    Philox4x32 block;
    block.v[0] = c0, block.v[1] = c1, block.v[2] = c2, block.v[3] = c3;
    return block;
}

// Dropout masks (ops.h dropout_forward): element i of a mask keyed by (seed, stream) is kept
// when word i % 4 of block i / 4 is at least dropout_threshold(p), so it is dropped with
// probability p (to within 2^-32) and each block serves four elements.
PHILOX_FUNCTION uint32_t dropout_threshold(float p) {
    double scaled = (double)p * 4294967296.0;
    return scaled >= 4294967295.0 ? 0xFFFFFFFFu : (uint32_t)scaled;
}

// Uniform noise (ops.h uniform_noise_add): a word's top 24 bits as one of the 2^24 integers in
// [-2^23, 2^23), exact as a float, which the op scales by magnitude * 2^-23 -- so the noise is
// uniform on [-magnitude, magnitude) and made of the same bits on every backend.
PHILOX_FUNCTION float philox_signed_24(uint32_t word) { return (float)((int32_t)(word >> 8) - 8388608); }
