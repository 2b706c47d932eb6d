// The CUDA activation kernels (src/ops/cuda/activation_kernels.cuh) on CPU threads through
// src/ops/cuda/cpu_emulation.h, against the CPU ops (ops/cpu/activation.c): GELU forward and
// backward, SwiGLU and GeGLU forward and backward, over buffers four at a time (aligned) and
// one at a time, with a tail that is not a whole four; and the held outputs' bf16 copies
// (each output's, and the forward's output act that the backwards recompute for the down
// projection's weight gradient) bit for bit against the rounded floats of the kernels'
// outputs and of their forward.
//
// The GPU takes libm's tanhf where the CPU takes vector_math.h's (within 3 ulp): results
// agree to 3e-6 of the largest value (the bound below; seen: up to 5.3e-7, the GELU's derivative).
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
#include "ops/cuda/activation_kernels.cuh"
#include "test.h"

static uint64_t rng = 0x510e527fade682d1ull;

static void launch_fours(long n, const std::function<void()> &kernel) {
    emulation::launch({(unsigned)((n + 3) / 4 + 255) / 256, 1, 1}, 256, 0, kernel);
}

static const double TOLERANCE = 3e-6;

// kind 0: GELU; 1: SwiGLU; 2: GeGLU.
static void check_activation(int kind, long n, bool vector) {
    const char *names[] = {"gelu", "swiglu", "geglu"};
    const bool gated = kind > 0, use_gelu = kind == 2;
    std::vector<float> x = random_floats(rng, n, 4.0f), up = random_floats(rng, n, 2.0f), dy = random_floats(rng, n, 1.0f);
    std::vector<float> y((size_t)n), want_y((size_t)n);
    std::vector<bf16> y_copy((size_t)n, bf16{0xffff});
    if (gated) {
        launch_fours(n, [&] {
            activation_kernels::glu_forward_kernel(y.data(), y_copy.data(), x.data(), up.data(), n, use_gelu, vector);
        });
        ops_cpu.glu_forward(want_y.data(), x.data(), up.data(), n, use_gelu);
    } else {
        launch_fours(n, [&] { activation_kernels::gelu_forward_kernel(y.data(), y_copy.data(), x.data(), n, vector); });
        ops_cpu.gelu_forward(want_y.data(), x.data(), n);
    }
    // The backward writes over its outputs (ops.h): NaN before, so a value left unwritten shows.
    std::vector<float> dx((size_t)n, NAN), dup((size_t)n, NAN), want_dx((size_t)n), want_dup((size_t)n);
    std::vector<bf16> dx_copy((size_t)n, bf16{0xffff}), dup_copy((size_t)n, bf16{0xffff}), act_copy((size_t)n, bf16{0xffff});
    if (gated) {
        launch_fours(n, [&] {
            activation_kernels::glu_backward_kernel(dx.data(), dup.data(), dx_copy.data(), dup_copy.data(),
                                                    act_copy.data(), dy.data(), x.data(), up.data(), n, use_gelu,
                                                    vector);
        });
        ops_cpu.glu_backward(want_dx.data(), want_dup.data(), dy.data(), x.data(), up.data(), NULL, n, use_gelu);
    } else {
        launch_fours(n, [&] {
            activation_kernels::gelu_backward_kernel(dx.data(), dx_copy.data(), act_copy.data(), dy.data(), x.data(), n,
                                                     vector);
        });
        ops_cpu.gelu_backward(want_dx.data(), dy.data(), x.data(), NULL, n);
    }
    const double forward_error = worst_error_of_largest(y, want_y), backward_error =
        fmax(worst_error_of_largest(dx, want_dx), gated ? worst_error_of_largest(dup, want_dup) : 0.0);
    const long copies_wrong = wrong_bf16_copies(y_copy, y) + wrong_bf16_copies(dx_copy, dx) + wrong_bf16_copies(act_copy, y) +
                              (gated ? wrong_bf16_copies(dup_copy, dup) : 0);
    printf("# %-6s n %-6ld %-15s forward %.2g, backward %.2g\n", names[kind], n,
           vector ? "four at a time" : "one at a time", forward_error, backward_error);
    EXPECT(forward_error <= TOLERANCE && backward_error <= TOLERANCE, "%s n %ld%s: forward %.3g, backward %.3g",
           names[kind], n, vector ? " four at a time" : "", forward_error, backward_error);
    EXPECT(copies_wrong == 0, "%s n %ld%s: %ld bf16 copies wrong", names[kind], n, vector ? " four at a time" : "",
           copies_wrong);
}

static void test_activations(void) {
    for (int kind = 0; kind < 3; kind++)
        for (long n : {4096L, 10003L})
            for (int vector = 0; vector <= 1; vector++) check_activation(kind, n, vector);
}

int main(void) {
    RUN(test_activations);
    TEST_EXIT();
}
