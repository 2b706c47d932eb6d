// The CUDA optimizer kernels (src/ops/cuda/optimizer_kernels.cuh) on CPU threads through
// src/ops/cuda/cpu_emulation.h, against the CPU ops (ops/cpu/adamw.c): AdamW over 70001
// parameters (a tail that is not a whole four) four at a time and one at a time, with weight
// decay and a gradient scale, and the updated weights' bf16 copy bit for bit; the sum of
// squares over 200003 values (four chunks, the last partial) from an aligned and an
// unaligned start, and over fewer values than one block's threads.
//
// AdamW's floats agree to 1e-6 of the largest value (the same formulas; seen: ~1e-7). The
// sums of squares are fp64 in two fixed but different orders: 1e-12 relative.
// tests/gpu/test_cuda.c checks the same kernels on a GPU.
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <vector>

extern "C" {
#include "ops/ops.h"
}
#include "emulated_test.h"
#include "ops/cuda/optimizer_kernels.cuh"
#include "test.h"

static uint64_t rng = 0x1f83d9abfb41bd6bull;

static void check_adamw(bool vector) {
    const long n = 70001;
    const float lr = 1e-3f, beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, weight_decay = 0.1f;
    const float bias_correction1 = 0.271f, bias_correction2 = 0.0975f, grad_scale = 0.5f;
    std::vector<float> params = random_floats(rng, n, 1.0f), grads = random_floats(rng, n, 1.0f);
    std::vector<float> m = random_floats(rng, n, 0.1f), v = random_floats(rng, n, 0.05f, 0.05f);
    std::vector<float> want_params = params, want_m = m, want_v = v;
    std::vector<bf16> copy((size_t)n, bf16{0xffff});
    emulation::launch({(unsigned)(((n + 3) / 4 + 255) / 256), 1, 1}, 256, 0, [&] {
        optimizer_kernels::adamw_kernel(params.data(), grads.data(), m.data(), v.data(), n, lr, beta1, beta2, eps,
                                        weight_decay, lr / bias_correction1, sqrtf(bias_correction2), grad_scale,
                                        copy.data(), vector);
    });
    ops_cpu.adamw_update(want_params.data(), grads.data(), want_m.data(), want_v.data(), n, lr, beta1, beta2, eps,
                         weight_decay, bias_correction1, bias_correction2, grad_scale);
    const double error = fmax(worst_error_of_largest(params, want_params),
                              fmax(worst_error_of_largest(m, want_m), worst_error_of_largest(v, want_v)));
    const long wrong = wrong_bf16_copies(copy, params);
    printf("# adamw %-15s %.2g of the largest, %ld bf16 copies wrong\n", vector ? "four at a time" : "one at a time",
           error, wrong);
    EXPECT(error <= 1e-6, "adamw%s: %.3g of the largest", vector ? " four at a time" : "", error);
    EXPECT(wrong == 0, "adamw%s: %ld bf16 copies of the weights wrong", vector ? " four at a time" : "", wrong);
}

static double emulated_sum_squares(const float *x, long n) {
    using namespace optimizer_kernels;
    const long chunks = (n + SUM_CHUNK - 1) / SUM_CHUNK;
    std::vector<double> partial((size_t)chunks);
    emulation::launch({(unsigned)chunks, 1, 1}, SUM_THREADS, SUM_SHARED_BYTES, [&] {
        sum_squares_chunks_kernel(partial.data(), x, n, (uintptr_t)x % 16 == 0);
    });
    emulation::launch({1, 1, 1}, SUM_PARTIAL_THREADS, SUM_PARTIAL_SHARED_BYTES,
                      [&] { sum_partials_kernel(partial.data(), chunks); });
    return partial[0];
}

static void check_sum_squares(long n, long offset) {
    const std::vector<float> x = random_floats(rng, n + offset, 1.0f);
    const double got = emulated_sum_squares(x.data() + offset, n), want = ops_cpu.sum_squares(x.data() + offset, n);
    printf("# sum_squares n %-6ld from offset %ld: %.17g (CPU %.17g)\n", n, offset, got, want);
    EXPECT(fabs(got - want) <= 1e-12 * want, "sum of squares of %ld values from offset %ld: %.17g, CPU %.17g", n,
           offset, got, want);
}

static void test_adamw(void) {
    check_adamw(false);
    check_adamw(true);
}

// Offset 1: x not 16-byte aligned, read one float at a time.
static void test_sum_squares(void) {
    check_sum_squares(200003, 0);
    check_sum_squares(200003, 1);
    check_sum_squares(100, 0);
}

int main(void) {
    RUN(test_adamw);
    RUN(test_sum_squares);
    TEST_EXIT();
}
