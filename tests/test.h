// A minimal test harness. Each test binary runs its TEST functions through RUN(),
// prints "PASS name" or "FAIL name" for each, and exits non-zero if any failed.
// tests/run.sh adds up the lines of every binary into "N passed, N failed".
#pragma once
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// 1 in the sanitizer build (`make test SANITIZE=1`, AddressSanitizer + UBSan): a program
// whose sweep is long there may thin its largest shapes, whose numbers the plain build
// checks, while keeping every code path under the sanitizers. A test left out says so on a
// line "SKIP name: why" (tests/run.sh counts it, not as passed).
#if defined(__SANITIZE_ADDRESS__)
#define TEST_SANITIZED 1
#else
#define TEST_SANITIZED 0
#endif

static int test_current_failures;
static int test_total_passed;
static int test_total_failed;

#define EXPECT(cond, ...)                                                   \
    do {                                                                    \
        if (!(cond)) {                                                      \
            fprintf(stderr, "  %s:%d: expected %s: ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                   \
            fputc('\n', stderr);                                            \
            test_current_failures++;                                        \
        }                                                                   \
    } while (0)

// |a - b| <= atol + rtol * |b|, and neither is NaN.
#define EXPECT_CLOSE(a, b, atol, rtol, what)                                        \
    do {                                                                            \
        double expect_a_ = (double)(a), expect_b_ = (double)(b);                   \
        double expect_tol_ = (atol) + (rtol) * fabs(expect_b_);                    \
        if (!(fabs(expect_a_ - expect_b_) <= expect_tol_)) {                       \
            fprintf(stderr, "  %s:%d: %s: got %.9g, expected %.9g (tolerance %.3g)\n", \
                    __FILE__, __LINE__, (what), expect_a_, expect_b_, expect_tol_); \
            test_current_failures++;                                                \
        }                                                                           \
    } while (0)

#define RUN(fn)                                                         \
    do {                                                                \
        test_current_failures = 0;                                      \
        fn();                                                           \
        if (test_current_failures == 0) {                               \
            printf("PASS %s\n", #fn);                                   \
            test_total_passed++;                                        \
        } else {                                                        \
            printf("FAIL %s (%d checks failed)\n", #fn, test_current_failures); \
            test_total_failed++;                                        \
        }                                                               \
        fflush(stdout);                                                 \
    } while (0)

#define TEST_EXIT() return test_total_failed ? 1 : 0

// Largest |a[i] - b[i]| over n elements (NaN counts as infinite).
static inline double test_max_abs_diff(const float *a, const float *b, long n) {
    double worst = 0;
    for (long i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        if (d != d) return INFINITY;
        if (d > worst) worst = d;
    }
    return worst;
}

// Largest |a - b| / (atol + rtol*|b|); <= 1 means every element is within tolerance.
static inline double test_worst_ratio(const float *a, const float *b, long n, double atol, double rtol) {
    double worst = 0;
    for (long i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        if (d != d) return INFINITY;
        double r = d / (atol + rtol * fabs((double)b[i]));
        if (r > worst) worst = r;
    }
    return worst;
}
