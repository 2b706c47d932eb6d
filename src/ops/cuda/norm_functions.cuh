// RMSNorm's arithmetic, in one place for the norm's own kernel (norm_rows.cuh) and the
// decode products that normalise their input rows as they read them (matvec.cuh, RowNorm),
// so that both give the same bits: the order in which a row's squares are added (each of
// the norm kernel's THREADS shares), the inverse RMS from their sum, and a normalised value.
#pragma once
#include <math.h>

#include "ops/cuda/device_primitives.cuh"

namespace norm_rows {

enum { THREADS = 256 }; // a norm kernel's block: one row

// RMSNorm's sum of squares over row x of C: thread `thread`'s (of THREADS) share, in the
// forward kernel's order -- with `by_four` four consecutive floats at a time, else one
// every THREADS. The matvec kernels (matvec.cuh, RowNorm) add the same shares in the same
// order for the rows they normalise themselves.
DEVICE_INLINE double rms_sum_squares_share(const float *x, int C, int thread, bool by_four) {
    double sum_sq = 0;
    if (by_four) {
        for (int c = 4 * thread; c < C; c += 4 * THREADS) {
            float v[4];
            load_float4(v, x + c);
            for (int k = 0; k < 4; k++) sum_sq += (double)v[k] * v[k];
        }
    } else {
        for (int c = thread; c < C; c += THREADS) sum_sq += (double)x[c] * x[c];
    }
    return sum_sq;
}

// The inverse RMS from a row's whole sum of squares.
DEVICE_INLINE float rms_inverse(double sum_sq, int C, float eps) { return (float)(1.0 / sqrt(sum_sq / C + eps)); }

// A normalised value, as every RMSNorm forward writes it.
DEVICE_INLINE float rms_normalised(float x, float s, float offset, float weight) { return x * s * (offset + weight); }

} // namespace norm_rows
