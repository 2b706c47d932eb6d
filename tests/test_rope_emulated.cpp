// The CUDA RoPE row kernel (src/ops/cuda/rope_rows.cuh) on CPU threads through
// src/ops/cuda/cpu_emulation.h, against the CPU op (ops/cpu/rope.c): forward and backward
// rotations of 3 heads (and of 40: more pairs than the block has threads) at head_dim 6, 64
// and 128, positions from 0 to 30000, and the backward's bf16 copy of a held output bit for
// bit against its rounded floats. Both sides compute each pair's angle, cosine and sine and
// rotate with the same float formulas (the kernel once a row, the CPU once a head), so they
// agree to float rounding (the bound below: 1e-6 of the largest value).
// tests/gpu/test_cuda.c checks the same kernel on a GPU.
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <vector>

extern "C" {
#include "ops/ops.h"
}
#include "emulated_test.h"
#include "ops/cuda/rope_rows.cuh"
#include "test.h"

static uint64_t rng = 0xa54ff53a5f1d36f1ull;

static void check_rope(int n_heads, int head_dim, bool backward) {
    const int positions[] = {0, 1, 7, 100, 4095, 30000};
    const int N = (int)(sizeof positions / sizeof positions[0]), half = head_dim / 2;
    std::vector<float> inv_freq(half);
    for (int i = 0; i < half; i++) inv_freq[i] = 1.0f / powf(10000.0f, (float)(2 * i) / (float)head_dim);
    const std::vector<float> x = random_floats(rng, (long)N * n_heads * head_dim, 2.0f);
    std::vector<float> got = x, want = x;
    std::vector<bf16> copy(x.size(), bf16{0xffff});
    const float direction = backward ? -1.0f : 1.0f;
    emulation::launch({(unsigned)N, 1, 1}, rope_rows::THREADS, (size_t)head_dim * sizeof(float), [&] {
        rope_rows::rope_kernel(got.data(), backward ? copy.data() : nullptr, positions, n_heads, head_dim,
                               inv_freq.data(), direction);
    });
    if (backward) ops_cpu.rope_backward(want.data(), positions, N, n_heads, head_dim, inv_freq.data());
    else ops_cpu.rope_forward(want.data(), positions, N, n_heads, head_dim, inv_freq.data());
    const double error = worst_error_of_largest(got, want);
    const long wrong_copies = backward ? wrong_bf16_copies(copy, got) : 0;
    printf("# rope %-8s %2d heads of %-3d: %.2g of the largest\n", backward ? "backward" : "forward", n_heads, head_dim,
           error);
    EXPECT(error <= 1e-6, "rope %s, %d heads of %d: %.3g of the largest", backward ? "backward" : "forward", n_heads,
           head_dim, error);
    EXPECT(wrong_copies == 0, "rope backward, %d heads of %d: %ld bf16 copies wrong", n_heads, head_dim, wrong_copies);
}

static void test_rope(void) {
    const int head_dims[] = {6, 64, 128};
    for (int head_dim : head_dims)
        for (int backward = 0; backward <= 1; backward++) {
            check_rope(3, head_dim, backward);
            check_rope(40, head_dim, backward); // 40 x 32 pairs at 64: five passes of the block's threads
        }
}

int main(void) {
    RUN(test_rope);
    TEST_EXIT();
}
