// The worst relative error of one segment of a tensor (a head's part of a row), shared by
// the CUDA checks (tests/gpu/test_cuda.c) and the emulated kernels' tests
// (tests/emulated_test.h). C and C++.
#pragma once
#include <math.h>

// The worst relative error of a segment: got and want as n / width segments of `width`
// values (a head's part of a row), each segment's ||got - want|| over the larger of its
// ||want|| and the segments' root mean square norm (1 when want is all zeros, as
// relative_error). A whole-tensor error hides one wrong row among many; this does not. The
// floor keeps rows that nearly cancel (a query that sees one key has a zero gradient up to
// rounding) from being judged by their own rounding noise.
static inline double worst_segment_error(const float *got, const float *want, long n, int width) {
    double total = 0;
    for (long i = 0; i < n; i++) total += (double)want[i] * want[i];
    const long segments = n / width;
    const double typical = segments > 0 && total > 0 ? sqrt(total / segments) : 1.0;
    double worst = 0;
    for (long s = 0; s < segments; s++) {
        double diff = 0, norm = 0;
        for (long i = s * width; i < (s + 1) * width; i++) {
            const double d = (double)got[i] - want[i];
            diff += d * d, norm += (double)want[i] * want[i];
        }
        if (diff != diff) return INFINITY; // a NaN anywhere in the segment
        worst = fmax(worst, sqrt(diff) / fmax(sqrt(norm), typical));
    }
    return worst;
}
