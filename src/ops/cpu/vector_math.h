// Elementwise e^x and tanh(x) written so that a loop over an array vectorises (`#pragma omp
// simd`, no calls into libm, whose expf / tanhf run one element at a time): the softmax of
// the attention kernels, and the tanh of Gemma 2's soft caps. Both follow Cephes' float
// routines (polynomials and range reductions as in Cephes' expf and tanhf).
#pragma once
#include <math.h>
#include <string.h>

// VECTOR_MATH_EXACT (tests/test_ops_f64.c, which compiles the kernels with float meaning
// double): the libm functions instead, exact in double.
#ifdef VECTOR_MATH_EXACT
static inline float exp_nonpositive_one(float x) { return expf(x); }
static inline void exp_nonpositive(float *x, int n) {
    for (int i = 0; i < n; i++) x[i] = expf(x[i]);
}
static inline float tanh_one(float x) { return tanhf(x); }
#else

// e^x for x <= 0: 2^k * e^r with k = round(x / ln 2) and |r| <= ln 2 / 2, e^r by Cephes'
// expf polynomial; within 2 ulp of expf. Below -87.3 (where expf reaches float's smallest
// normal numbers) it returns about 1.2e-38.
static inline float exp_nonpositive_one(float x) {
    const float v = x < -87.3f ? -87.3f : x;
    // Adding 1.5 * 2^23 rounds v / ln 2 to an integer in the low mantissa bits.
    const float k = (v * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
    const float r = v - k * 0.693359375f + k * 2.12194440e-4f; // ln 2 in two parts
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    const int bits = ((int)k + 127) << 23; // 2^k
    float power;
    memcpy(&power, &bits, sizeof power);
    return p * power;
}

// x[i] = e^x[i], i < n, every x[i] <= 0 (scores minus their maximum).
static inline void exp_nonpositive(float *x, int n) {
#pragma omp simd
    for (int i = 0; i < n; i++) x[i] = exp_nonpositive_one(x[i]);
}

// tanh(x) as Cephes' tanhf computes it: below |x| = 0.625 an odd polynomial (no
// cancellation near 0), above it sign(x) (1 - e) / (1 + e) with e = e^(-2|x|) <= 0.29 (none
// there either); 1 past |x| = 43.6, where e underflows. Both branches are computed and one is
// chosen, so that the loop around it stays one vector loop. Within 3 ulp of tanh
// (tests/test_ops.c test_vector_tanh).
static inline float tanh_one(float x) {
    const float a = fabsf(x), z = x * x;
    float p = -5.70498872745e-3f;
    p = p * z + 2.06390887954e-2f;
    p = p * z - 5.37397155531e-2f;
    p = p * z + 1.33314422036e-1f;
    p = p * z - 3.33332819422e-1f;
    const float small = p * z * x + x;
    const float e = exp_nonpositive_one(-2.0f * a);
    const float large = copysignf((1.0f - e) / (1.0f + e), x);
    return a < 0.625f ? small : large;
}
#endif
