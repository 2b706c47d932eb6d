// The CUDA LayerNorm and RMSNorm row kernels (src/ops/cuda/norm_rows.cuh) on CPU threads
// through src/ops/cuda/cpu_emulation.h, against the CPU ops (ops/cpu/norm.c): outputs,
// statistics and input gradients (added to what the buffer held), and the bf16 copy of a
// held output bit for bit against the rounded fp32 result. Rows of 97 (one float at a
// time), 96 and 2048 (four at a time, and the same rows one at a time; 2048 takes each
// thread twice round the row), RMSNorm with and without Gemma's (1 + w).
//
// Both sides sum the row statistics in fp64 in different orders and round the same float
// formulas: the results agree to ~1e-6 of the row's largest value (the bound below, several
// times the largest difference seen). tests/gpu/test_cuda.c checks the same kernels on a GPU.
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <vector>

extern "C" {
#include "ops/ops.h"
}
#include "emulated_test.h"
#include "ops/cuda/norm_rows.cuh"
#include "test.h"

static uint64_t rng = 0x3c6ef372fe94f82bull;

enum { ROWS = 5 };

static const double TOLERANCE = 4e-6;

static void check_layernorm(int C) {
    const long n = (long)ROWS * C;
    std::vector<float> x = random_floats(rng, n, 2.0f, 0.7f), w = random_floats(rng, C, 1.0f, 1.0f), b = random_floats(rng, C, 0.5f);
    std::vector<float> dy = random_floats(rng, n, 1.0f), dx_start = random_floats(rng, n, 0.3f);
    std::vector<float> y((size_t)n), mean(ROWS), rstd(ROWS), want_y((size_t)n), want_mean(ROWS), want_rstd(ROWS);
    std::vector<bf16> y_copy((size_t)n, bf16{0xffff}), dx_copy((size_t)n, bf16{0xffff});
    emulation::launch({ROWS, 1, 1}, norm_rows::THREADS, norm_rows::SHARED_BYTES, [&] {
        norm_rows::layernorm_forward_kernel(y.data(), y_copy.data(), mean.data(), rstd.data(), x.data(), w.data(),
                                            b.data(), C, 1e-5f);
    });
    ops_cpu.layernorm_forward(want_y.data(), want_mean.data(), want_rstd.data(), x.data(), w.data(), b.data(), ROWS, C,
                              1e-5f);
    std::vector<float> dx = dx_start, want_dx = dx_start;
    emulation::launch({ROWS, 1, 1}, norm_rows::THREADS, norm_rows::SHARED_BYTES, [&] {
        norm_rows::layernorm_backward_kernel(dx.data(), dx_copy.data(), dy.data(), x.data(), w.data(),
                                             want_mean.data(), want_rstd.data(), C);
    });
    ops_cpu.layernorm_backward(want_dx.data(), NULL, NULL, dy.data(), x.data(), w.data(), want_mean.data(),
                               want_rstd.data(), ROWS, C);
    const double out_error = worst_error_of_largest(y, want_y), stat_error = fmax(worst_error_of_largest(mean, want_mean), worst_error_of_largest(rstd, want_rstd));
    const double grad_error = worst_error_of_largest(dx, want_dx);
    printf("# layernorm C %-5d output %.2g, statistics %.2g, input gradient %.2g\n", C, out_error, stat_error, grad_error);
    EXPECT(out_error <= TOLERANCE && stat_error <= TOLERANCE && grad_error <= TOLERANCE,
           "layernorm C %d: output %.3g, statistics %.3g, input gradient %.3g of the largest", C, out_error, stat_error,
           grad_error);
    EXPECT(wrong_bf16_copies(y_copy, y) == 0 && wrong_bf16_copies(dx_copy, dx) == 0, "layernorm C %d: %ld / %ld copies wrong", C,
           wrong_bf16_copies(y_copy, y), wrong_bf16_copies(dx_copy, dx));
}

static void check_rmsnorm(int C, bool by_four, bool plus_one) {
    const long n = (long)ROWS * C;
    std::vector<float> x = random_floats(rng, n, 2.0f), w = random_floats(rng, C, 1.0f, plus_one ? 0.0f : 1.0f);
    std::vector<float> dy = random_floats(rng, n, 1.0f), dx_start = random_floats(rng, n, 0.3f);
    std::vector<float> y((size_t)n), rstd(ROWS), want_y((size_t)n), want_rstd(ROWS);
    std::vector<bf16> y_copy((size_t)n, bf16{0xffff}), dx_copy((size_t)n, bf16{0xffff});
    const float offset = plus_one ? 1.0f : 0.0f;
    emulation::launch({ROWS, 1, 1}, norm_rows::THREADS, norm_rows::SHARED_BYTES, [&] {
        norm_rows::rmsnorm_forward_kernel(y.data(), y_copy.data(), rstd.data(), x.data(), w.data(), C, 1e-6f, offset,
                                          by_four);
    });
    ops_cpu.rmsnorm_forward(want_y.data(), want_rstd.data(), x.data(), w.data(), ROWS, C, 1e-6f, plus_one);
    std::vector<float> dx = dx_start, want_dx = dx_start;
    emulation::launch({ROWS, 1, 1}, norm_rows::THREADS, norm_rows::SHARED_BYTES, [&] {
        norm_rows::rmsnorm_backward_kernel(dx.data(), dx_copy.data(), dy.data(), x.data(), w.data(), want_rstd.data(),
                                           C, offset, by_four);
    });
    ops_cpu.rmsnorm_backward(want_dx.data(), NULL, dy.data(), x.data(), w.data(), want_rstd.data(), ROWS, C, plus_one);
    const double out_error = worst_error_of_largest(y, want_y), stat_error = worst_error_of_largest(rstd, want_rstd);
    const double grad_error = worst_error_of_largest(dx, want_dx);
    printf("# rmsnorm C %-5d %-15s %-7s output %.2g, rstd %.2g, input gradient %.2g\n", C,
           by_four ? "four at a time" : "one at a time", plus_one ? "(1 + w)" : "w", out_error, stat_error, grad_error);
    EXPECT(out_error <= TOLERANCE && stat_error <= TOLERANCE && grad_error <= TOLERANCE,
           "rmsnorm C %d%s%s: output %.3g, rstd %.3g, input gradient %.3g of the largest", C,
           by_four ? " four at a time" : "", plus_one ? " (1 + w)" : "", out_error, stat_error, grad_error);
    EXPECT(wrong_bf16_copies(y_copy, y) == 0 && wrong_bf16_copies(dx_copy, dx) == 0, "rmsnorm C %d: %ld / %ld copies wrong", C,
           wrong_bf16_copies(y_copy, y), wrong_bf16_copies(dx_copy, dx));
}

static void test_layernorm(void) {
    const int sizes[] = {97, 96, 2048};
    for (int C : sizes) check_layernorm(C);
}

static void test_rmsnorm(void) {
    const int sizes[] = {97, 96, 2048};
    for (int C : sizes)
        for (int by_four = 0; by_four <= (C % 4 == 0); by_four++)
            for (int plus_one = 0; plus_one <= 1; plus_one++) check_rmsnorm(C, by_four, plus_one);
}

int main(void) {
    RUN(test_layernorm);
    RUN(test_rmsnorm);
    TEST_EXIT();
}
