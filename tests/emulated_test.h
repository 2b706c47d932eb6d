// What the tests of the CUDA kernels run on CPU threads (tests/test_*_emulated.cpp, through
// src/ops/cuda/cpu_emulation.h) share: a fixed sequence of random inputs and the relative
// error they are judged by (the same measure as tests/gpu/test_cuda.c's).
#pragma once
#include <math.h>
#include <stdint.h>

#include <vector>

#include "segment_error.h"

// n values uniform in [-scale, scale) from the xorshift64* sequence in `state` (each test keeps
// its own, so its inputs do not depend on another's).
static inline std::vector<float> random_floats(uint64_t &state, long n, float scale) {
    std::vector<float> x((size_t)n);
    for (long i = 0; i < n; i++) {
        state ^= state >> 12, state ^= state << 25, state ^= state >> 27;
        const uint64_t r = state * 0x2545f4914f6cdd1dull;
        x[(size_t)i] = scale * (2.0f * (float)((r >> 40) * (1.0 / 16777216.0)) - 1.0f);
    }
    return x;
}

// ||got - want|| / ||want|| (the plain difference's norm when want is zero).
static inline double relative_error(const float *got, const float *want, long n) {
    double diff = 0, norm = 0;
    for (long i = 0; i < n; i++) {
        const double d = (double)got[i] - want[i];
        diff += d * d, norm += (double)want[i] * want[i];
    }
    return sqrt(diff / (norm > 0 ? norm : 1));
}
