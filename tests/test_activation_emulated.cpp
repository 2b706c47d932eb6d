// The CUDA activation kernels (src/ops/cuda/activation_kernels.cuh) on CPU threads through
// src/ops/cuda/cpu_emulation.h, against the CPU ops (ops/cpu/activation.c): GELU forward and
// backward, SwiGLU and GeGLU forward and backward, over buffers four at a time (aligned) and
// one at a time, with a tail that is not a whole four; and the held outputs' bf16 copies
// (each output's, and the forward's output act that the backwards recompute for the down
// projection's weight gradient) bit for bit against the rounded floats of the kernels'
// outputs and of their forward; and with stored buffers (ops.h's hold_stored): bf16 inputs,
// and outputs written as their copies only.
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

// The inputs as the kernels take them: floats, or (stored: hold_stored, the gate and up
// products' outputs and down's input gradient) bf16 values, with floats beside them that the kernel must not read:
// the unrounded values, which differ from the stored ones by far more than the tolerance.
struct KernelInput {
    std::vector<float> floats, reference; // reference: what the CPU op is given (rounded when stored)
    std::vector<bf16> stored;
    activation_kernels::Input input() const { return {floats.data(), stored.empty() ? nullptr : stored.data()}; }
};

static KernelInput kernel_input(long n, float scale, bool stored) {
    KernelInput in;
    in.floats = random_floats(rng, n, scale);
    in.reference = in.floats;
    if (stored) {
        in.stored.resize((size_t)n);
        for (long i = 0; i < n; i++) {
            in.stored[(size_t)i] = float_to_bf16(in.floats[(size_t)i]);
            in.reference[(size_t)i] = bf16_to_float(in.stored[(size_t)i]);
        }
    }
    return in;
}

// kind 0: GELU; 1: SwiGLU; 2: GeGLU. `stored`: the inputs stored as bf16 and, in a second
// run, every float output NULL (a stored output: only the copies written), whose copies
// must be those of the first run.
static void check_activation(int kind, long n, bool vector, bool stored) {
    const char *names[] = {"gelu", "swiglu", "geglu"};
    const bool gated = kind > 0, use_gelu = kind == 2;
    const KernelInput x = kernel_input(n, 4.0f, stored), up = kernel_input(n, 2.0f, stored);
    const KernelInput dy = kernel_input(n, 1.0f, stored);
    std::vector<float> y((size_t)n), want_y((size_t)n);
    std::vector<bf16> y_copy((size_t)n, bf16{0xffff}), y_copy_alone((size_t)n, bf16{0xffff});
    auto forward = [&](float *out, bf16 *copy) {
        if (gated)
            launch_fours(n, [&] {
                activation_kernels::glu_forward_kernel(out, copy, x.input(), up.input(), n, use_gelu, vector);
            });
        else
            launch_fours(n, [&] { activation_kernels::gelu_forward_kernel(out, copy, x.input(), n, vector); });
    };
    forward(y.data(), y_copy.data());
    if (gated) ops_cpu.glu_forward(want_y.data(), x.reference.data(), up.reference.data(), n, use_gelu);
    else ops_cpu.gelu_forward(want_y.data(), x.reference.data(), n);
    // The backward writes over its outputs (ops.h): NaN before, so a value left unwritten shows.
    std::vector<float> dx((size_t)n, NAN), dup((size_t)n, NAN), want_dx((size_t)n), want_dup((size_t)n);
    std::vector<bf16> dx_copy((size_t)n, bf16{0xffff}), dup_copy((size_t)n, bf16{0xffff}), act_copy((size_t)n, bf16{0xffff});
    std::vector<bf16> dx_copy_alone((size_t)n, bf16{0xffff}), dup_copy_alone((size_t)n, bf16{0xffff});
    auto backward = [&](float *dgate, float *dup_out, bf16 *dgate_copy, bf16 *dup_out_copy, bf16 *act) {
        if (gated)
            launch_fours(n, [&] {
                activation_kernels::glu_backward_kernel(dgate, dup_out, dgate_copy, dup_out_copy, act, dy.input(),
                                                        x.input(), up.input(), n, use_gelu, vector);
            });
        else
            launch_fours(n, [&] {
                activation_kernels::gelu_backward_kernel(dgate, dgate_copy, act, dy.input(), x.input(), n, vector);
            });
    };
    backward(dx.data(), dup.data(), dx_copy.data(), dup_copy.data(), act_copy.data());
    if (gated)
        ops_cpu.glu_backward(want_dx.data(), want_dup.data(), dy.reference.data(), x.reference.data(), up.reference.data(), NULL,
                             n, use_gelu);
    else
        ops_cpu.gelu_backward(want_dx.data(), dy.reference.data(), x.reference.data(), NULL, n);
    const double forward_error = worst_error_of_largest(y, want_y), backward_error =
        fmax(worst_error_of_largest(dx, want_dx), gated ? worst_error_of_largest(dup, want_dup) : 0.0);
    const long copies_wrong = wrong_bf16_copies(y_copy, y) + wrong_bf16_copies(dx_copy, dx) + wrong_bf16_copies(act_copy, y) +
                              (gated ? wrong_bf16_copies(dup_copy, dup) : 0);
    long alone_differ = 0; // stored outputs: the copies without the floats
    if (stored) {
        forward(nullptr, y_copy_alone.data());
        backward(nullptr, nullptr, dx_copy_alone.data(), dup_copy_alone.data(), nullptr);
        for (long i = 0; i < n; i++)
            alone_differ += y_copy_alone[(size_t)i].bits != y_copy[(size_t)i].bits ||
                            dx_copy_alone[(size_t)i].bits != dx_copy[(size_t)i].bits ||
                            (gated && dup_copy_alone[(size_t)i].bits != dup_copy[(size_t)i].bits);
    }
    const char *how = vector ? "four at a time" : "one at a time";
    printf("# %-6s n %-6ld %-15s%s forward %.2g, backward %.2g\n", names[kind], n, how, stored ? " stored" : "",
           forward_error, backward_error);
    EXPECT(forward_error <= TOLERANCE && backward_error <= TOLERANCE, "%s n %ld %s%s: forward %.3g, backward %.3g",
           names[kind], n, how, stored ? " stored" : "", forward_error, backward_error);
    EXPECT(copies_wrong == 0, "%s n %ld %s%s: %ld bf16 copies wrong", names[kind], n, how, stored ? " stored" : "",
           copies_wrong);
    EXPECT(alone_differ == 0, "%s n %ld %s: %ld copies differ when the floats are not written", names[kind], n, how,
           alone_differ);
}

static void test_activations(void) {
    for (int kind = 0; kind < 3; kind++)
        for (long n : {4096L, 10003L})
            for (int vector = 0; vector <= 1; vector++)
                for (int stored = 0; stored <= 1; stored++) check_activation(kind, n, vector, stored);
}

int main(void) {
    RUN(test_activations);
    TEST_EXIT();
}
