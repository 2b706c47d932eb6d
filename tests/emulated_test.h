// What the tests of the CUDA kernels run on CPU threads (tests/test_*_emulated.cpp, through
// src/ops/cuda/cpu_emulation.h) share: a fixed sequence of random inputs, the errors they are
// judged by (the relative error is tests/gpu/test_cuda.c's measure) and the check of a held
// output's bf16 copy.
#pragma once
#include <math.h>
#include <stdint.h>

#include <vector>

#include "ops/cuda/device_primitives.cuh"
#include "segment_error.h"

// n values uniform in [center - scale, center + scale) from the xorshift64* sequence in
// `state` (each test keeps its own, so its inputs do not depend on another's).
static inline std::vector<float> random_floats(uint64_t &state, long n, float scale, float center = 0.0f) {
    std::vector<float> x((size_t)n);
    for (long i = 0; i < n; i++) {
        state ^= state >> 12, state ^= state << 25, state ^= state >> 27;
        const uint64_t r = state * 0x2545f4914f6cdd1dull;
        x[(size_t)i] = center + scale * (2.0f * (float)((r >> 40) * (1.0 / 16777216.0)) - 1.0f);
    }
    return x;
}

// The largest |got - want| over the largest |want| (the plain difference when want is all
// zeros); a NaN in either counts as infinite.
static inline double worst_error_of_largest(const std::vector<float> &got, const std::vector<float> &want) {
    double worst = 0, largest = 0;
    for (size_t i = 0; i < got.size(); i++) {
        const double difference = fabs((double)got[i] - want[i]);
        if (isnan(difference)) return INFINITY;
        worst = fmax(worst, difference), largest = fmax(largest, fabs((double)want[i]));
    }
    return largest > 0 ? worst / largest : worst;
}

// How many of a held output's bf16 copies are not its floats rounded (as cuda_to_bf16 rounds).
static inline long wrong_bf16_copies(const std::vector<bf16> &copy, const std::vector<float> &values) {
    long wrong = 0;
    for (size_t i = 0; i < values.size(); i++) wrong += copy[i].bits != float_to_bf16(values[i]).bits;
    return wrong;
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
