// The CUDA RoPE row kernel (src/ops/cuda/rope_rows.cuh) on CPU threads through
// src/ops/cuda/cpu_emulation.h, against the CPU op (ops/cpu/rope.c): forward and backward
// rotations of 3 heads (and of 40: more pairs than the block has threads) at head_dim 6, 64
// and 128, positions from 0 to 30000, and the backward's bf16 copy of a held output bit for
// bit against its rounded floats. Both sides compute each pair's angle, cosine and sine and
// rotate with the same float formulas (the kernel once a row, the CPU once a head), so they
// agree to float rounding (the bound below: 1e-6 of the largest value). The backward over
// the rows of a fused q | k | v gradient (attention.cu's rotary backward: one launch over the
// H + KV heads of q and k, v's columns after them) against the CPU's rope_backward of the q
// and k parts as rows of their own, v's columns left as they were, and the bf16 copy of the
// whole rows (v's columns included) bit for bit.
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
        rope_rows::rope_kernel(got.data(), backward ? copy.data() : nullptr, n_heads * head_dim, positions, n_heads,
                               head_dim, inv_freq.data(), direction);
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

// Rows of q_dim + 2 kv_dim floats: q's H heads, k's KV heads, v's KV heads' columns.
static void check_packed_backward(int H, int KV, int head_dim) {
    const int positions[] = {0, 1, 7, 100, 4095, 30000};
    const int N = (int)(sizeof positions / sizeof positions[0]), half = head_dim / 2;
    const int q_dim = H * head_dim, kv_dim = KV * head_dim, width = q_dim + 2 * kv_dim;
    std::vector<float> inv_freq(half);
    for (int i = 0; i < half; i++) inv_freq[i] = 1.0f / powf(10000.0f, (float)(2 * i) / (float)head_dim);
    const std::vector<float> x = random_floats(rng, (long)N * width, 2.0f);
    std::vector<float> got = x;
    std::vector<bf16> copy(x.size(), bf16{0xffff});
    emulation::launch({(unsigned)N, 1, 1}, rope_rows::THREADS, (size_t)head_dim * sizeof(float), [&] {
        rope_rows::rope_kernel(got.data(), copy.data(), width, positions, H + KV, head_dim, inv_freq.data(), -1.0f);
    });
    // The CPU's backward of q's and k's columns as rows of their own.
    std::vector<float> want_q((size_t)N * q_dim), want_k((size_t)N * kv_dim), got_q(want_q.size()), got_k(want_k.size());
    long v_changed = 0;
    for (int row = 0; row < N; row++) {
        for (int i = 0; i < q_dim; i++) {
            want_q[(size_t)row * q_dim + i] = x[(size_t)row * width + i];
            got_q[(size_t)row * q_dim + i] = got[(size_t)row * width + i];
        }
        for (int i = 0; i < kv_dim; i++) {
            want_k[(size_t)row * kv_dim + i] = x[(size_t)row * width + q_dim + i];
            got_k[(size_t)row * kv_dim + i] = got[(size_t)row * width + q_dim + i];
        }
        for (int i = q_dim + kv_dim; i < width; i++)
            v_changed += memcmp(&got[(size_t)row * width + i], &x[(size_t)row * width + i], sizeof(float)) != 0;
    }
    ops_cpu.rope_backward(want_q.data(), positions, N, H, head_dim, inv_freq.data());
    ops_cpu.rope_backward(want_k.data(), positions, N, KV, head_dim, inv_freq.data());
    const double q_error = worst_error_of_largest(got_q, want_q), k_error = worst_error_of_largest(got_k, want_k);
    const long wrong_copies = wrong_bf16_copies(copy, got);
    printf("# rope backward packed %d + %d heads of %-3d (+ %d of v): q %.2g, k %.2g of the largest, %ld of v changed, "
           "%ld bf16 copies wrong\n",
           H, KV, head_dim, KV, q_error, k_error, v_changed, wrong_copies);
    EXPECT(q_error <= 1e-6, "packed rope backward, %d + %d heads of %d: q %.3g of the largest", H, KV, head_dim,
           q_error);
    EXPECT(k_error <= 1e-6, "packed rope backward, %d + %d heads of %d: k %.3g of the largest", H, KV, head_dim,
           k_error);
    EXPECT(v_changed == 0, "packed rope backward, %d + %d heads of %d: %ld of v's values changed", H, KV, head_dim,
           v_changed);
    EXPECT(wrong_copies == 0, "packed rope backward, %d + %d heads of %d: %ld of the rows' bf16 copies wrong", H, KV,
           head_dim, wrong_copies);
}

static void test_rope_packed_backward(void) {
    const int head_dims[] = {6, 64, 128};
    for (int head_dim : head_dims) {
        check_packed_backward(3, 1, head_dim);
        check_packed_backward(32, 8, head_dim); // 40 x 32 pairs at 64, and 512 of v's columns a row
    }
}

int main(void) {
    RUN(test_rope);
    RUN(test_rope_packed_backward);
    TEST_EXIT();
}
