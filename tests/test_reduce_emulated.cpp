// The warp reductions of src/ops/cuda/device_primitives.cuh under the CPU emulation:
// warp_sum and warp_max there are emulation::warp_butterfly (src/ops/cuda/cpu_emulation.h),
// the five rounds of the GPU's butterfly computed at one barrier. Here each is run beside the
// five __shfl_xor_sync rounds the GPU runs, written out, on the same values: every lane's
// result the same bits, for float and double sums of values of mixed magnitudes (where
// another order of addition gives other bits: checked too, so the comparison can fail),
// for fmaxf over signed zeros, infinities and NaN, and for several reductions in a row
// (each lane alternates between the warp's two operand sets, and lanes run ahead of others).
#include <math.h>
#include <stdint.h>
#include <string.h>

#include <vector>

#include "emulated_test.h"
#include "test.h"

static uint64_t rng = 0x9b05688c2b3e6c1full;

enum { BLOCKS = 3, THREADS = 128, ROUNDS = 3 };

// The GPU's butterflies, shuffle by shuffle (device_primitives.cuh's nvcc branch).
template <typename Real> static Real shuffled_sum(Real value) {
    for (int offset = 16; offset > 0; offset >>= 1) value += __shfl_xor_sync(0xffffffffu, value, offset);
    return value;
}
static float shuffled_max(float value) {
    for (int offset = 16; offset > 0; offset >>= 1) value = fmaxf(value, __shfl_xor_sync(0xffffffffu, value, offset));
    return value;
}

// Values whose sum depends on the order it is taken in: magnitudes from 1e-6 to 1e6.
template <typename Real> static std::vector<Real> mixed_values(long n) {
    const std::vector<float> signs = random_floats(rng, n, 1.0f), exponents = random_floats(rng, n, 6.0f);
    std::vector<Real> values((size_t)n);
    for (long i = 0; i < n; i++) values[(size_t)i] = (Real)signs[(size_t)i] * (Real)pow(10.0, exponents[(size_t)i]);
    return values;
}

// Every thread takes ROUNDS reductions in a row of its own values (round r: values[r][i]),
// once through `reduce` and once through `reference`; returns how many results differ in
// any bit.
template <typename Real, typename Reduce, typename Reference>
static long differing_results(const std::vector<Real> &values, Reduce reduce, Reference reference) {
    const long n = (long)BLOCKS * THREADS;
    std::vector<Real> got((size_t)(ROUNDS * n)), want((size_t)(ROUNDS * n));
    auto run = [&](std::vector<Real> &out, bool use_reference) {
        emulation::launch({BLOCKS, 1, 1}, THREADS, 0, [&] {
            const long i = (long)blockIdx.x * THREADS + threadIdx.x;
            for (int r = 0; r < ROUNDS; r++) {
                const Real value = values[(size_t)(r * n + i)];
                out[(size_t)(r * n + i)] = use_reference ? reference(value) : reduce(value);
            }
        });
    };
    run(got, false);
    run(want, true);
    long differing = 0;
    for (size_t i = 0; i < got.size(); i++) differing += memcmp(&got[i], &want[i], sizeof(Real)) != 0;
    return differing;
}

template <typename Real> static void check_sum(const char *name) {
    const long n = (long)ROUNDS * BLOCKS * THREADS;
    const std::vector<Real> values = mixed_values<Real>(n);
    const long differing = differing_results<Real>(values, [](Real v) { return warp_sum(v); },
                                                   [](Real v) { return shuffled_sum(v); });
    EXPECT(differing == 0, "%s warp_sum: %ld of %ld lanes' results differ from the shuffles'", name, differing, n);
    // The comparison sees the order: lane 0's running sum from lane 0 up is another result
    // for most warps of these values.
    long other_order = 0;
    for (long warp = 0; warp < n / 32; warp++) {
        Real sequential = 0, butterfly[32];
        for (int lane = 0; lane < 32; lane++) sequential += values[(size_t)(warp * 32 + lane)];
        for (int lane = 0; lane < 32; lane++) butterfly[lane] = values[(size_t)(warp * 32 + lane)];
        for (int offset = 16; offset > 0; offset >>= 1) {
            Real next[32];
            for (int lane = 0; lane < 32; lane++) next[lane] = butterfly[lane] + butterfly[lane ^ offset];
            memcpy(butterfly, next, sizeof next);
        }
        other_order += sequential != butterfly[0];
    }
    EXPECT(other_order >= n / 32 / 2, "%s: only %ld of %ld warps' sums depend on the order", name, other_order, n / 32);
}

static void test_warp_sum_float(void) { check_sum<float>("float"); }
static void test_warp_sum_double(void) { check_sum<double>("double"); }

static void test_warp_max(void) {
    const long n = (long)ROUNDS * BLOCKS * THREADS;
    std::vector<float> values = random_floats(rng, n, 100.0f);
    // Signed zeros, infinities and NaN (fmaxf takes the other operand) in some warps.
    const float specials[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN};
    for (long i = 0; i < n; i++)
        if (i % 7 < 3) values[(size_t)i] = specials[(size_t)(i / 7) % 5];
    for (long i = 0; i < n; i += 96) values[(size_t)i] = NAN;
    const long differing = differing_results<float>(values, [](float v) { return warp_max(v); },
                                                    [](float v) { return shuffled_max(v); });
    EXPECT(differing == 0, "warp_max: %ld of %ld lanes' results differ from the shuffles'", differing, n);
}

int main(void) {
    RUN(test_warp_sum_float);
    RUN(test_warp_sum_double);
    RUN(test_warp_max);
    TEST_EXIT();
}
