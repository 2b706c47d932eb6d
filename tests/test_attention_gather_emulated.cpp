// The CUDA attention's gathers (src/ops/cuda/attention_gather.cuh) on CPU threads through
// src/ops/cuda/cpu_emulation.h, launched as attention.cu launches them, against plain loops:
// Q-like rows (group 1) and K/V-like rows repeated over a group of heads gathered to
// head-major bf16 by the eight-element kernel and by the one-element fallback; dO with its
// row term D = dO . O by the eight-element kernel and by the fallback pair. The bf16 copies
// must be the source floats rounded, bit for bit, every element written (the outputs start
// as NaN bits); D within float rounding of a double dot product (1e-5 of the sum of the
// products' magnitudes). head_dim 8 to 128 (1 to 16 threads a head row; 24's 3 threads do not
// divide a warp and take the fallback for dO), T not a multiple of any block. Q, K and V are
// also gathered, plain and rotated, from the columns of one fused q | k | v buffer (rows of
// (H + 2 KV) * hd floats, read in place by their row stride), and from rows whose stride is
// not a multiple of 4 floats, which only the one-element kernel may take.
// tests/gpu/test_cuda.c checks the same kernels on a GPU through the attention ops.
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include <vector>

extern "C" {
#include "ops/ops.h"
}
#include "emulated_test.h"
#include "ops/cuda/attention_gather.cuh"
#include "test.h"

static uint64_t rng = 0x6a09e667f3bcc909ull;

static unsigned blocks_for(long items, long per_block) { return (unsigned)((items + per_block - 1) / per_block); }

// How many of out's [B, H, T, hd] bf16 are not the floats rounded of the H / group heads at
// in's columns from `column` on, its rows `row_stride` floats apart.
static long wrong_gathered(const std::vector<bf16> &out, const float *in, int row_stride, int B, int T, int H,
                           int group, int hd) {
    long wrong = 0;
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++)
            for (int t = 0; t < T; t++)
                for (int d = 0; d < hd; d++) {
                    const float source = in[((long)b * T + t) * row_stride + (h / group) * hd + d];
                    const bf16 got = out[(size_t)((((long)b * H + h) * T + t) * hd + d)];
                    wrong += got.bits != float_to_bf16(source).bits;
                }
    return wrong;
}

// The worst |D - dO . O| over the sum of |dO_i O_i| of its row ([B, H, T] rows).
static double worst_row_dot(const std::vector<float> &D, const std::vector<float> &dout, const std::vector<float> &out,
                            int B, int T, int H, int hd) {
    double worst = 0;
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++)
            for (int t = 0; t < T; t++) {
                double dot = 0, magnitude = 0;
                const long at = ((long)b * T + t) * H * hd + (long)h * hd;
                for (int d = 0; d < hd; d++) {
                    const double product = (double)dout[(size_t)(at + d)] * out[(size_t)(at + d)];
                    dot += product, magnitude += fabs(product);
                }
                const double got = D[(size_t)(((long)b * H + h) * T + t)];
                const double error = fabs(got - dot) / (magnitude > 0 ? magnitude : 1);
                worst = isnan(error) ? INFINITY : fmax(worst, error);
            }
    return worst;
}

// The H / group heads of `in`'s rows (row_stride floats apart; group > 1: the K/V heads that
// H query heads read) gathered by the eight-element kernel that attention.cu's
// gather_heads_into picks, or by the one-element fallback. `what` names the rows.
static void check_gather_rows(const char *what, const float *in, int row_stride, int B, int T, int H, int group,
                              int hd, bool by_eight) {
    const int threads = attention_gather::THREADS;
    std::vector<bf16> out((size_t)B * H * T * hd, bf16{0xffff});
    if (by_eight) {
        const long items_per_head = (long)B * T * (hd / 8);
        emulation::launch({blocks_for(items_per_head, threads), (unsigned)H, 1}, threads, 0, [&] {
            attention_gather::gather_heads_by_eight_kernel(out.data(), in, row_stride, B, T, H, group, hd);
        });
    } else {
        emulation::launch({blocks_for((long)B * H * T * hd, threads), 1, 1}, threads, 0, [&] {
            attention_gather::gather_heads_kernel(out.data(), in, row_stride, B, T, H, group, hd);
        });
    }
    const long wrong = wrong_gathered(out, in, row_stride, B, T, H, group, hd);
    printf("# gather %-7s %-8s B %d T %d, %2d heads from %2d, head_dim %3d, row stride %4d: %ld wrong\n",
           by_eight ? "by 8" : "by 1", what, B, T, H, H / group, hd, row_stride, wrong);
    EXPECT(wrong == 0, "gather %s of %s, %d heads from %d at head_dim %d: %ld of %zu bf16 wrong",
           by_eight ? "by 8" : "by 1", what, H, H / group, hd, wrong, out.size());
}

// Rows of their own of `heads` heads (H = heads * group).
static void check_gather(int B, int T, int H, int group, int hd, bool by_eight) {
    const int width = H / group * hd;
    const std::vector<float> in = random_floats(rng, (long)B * T * width, 3.0f);
    EXPECT(attention_gather::gathers_by_eight(in.data(), width, B, T, H, hd) == (hd % 8 == 0),
           "gathers_by_eight at head_dim %d", hd);
    check_gather_rows("own rows", in.data(), width, B, T, H, group, hd, by_eight);
}

// Q- or K-like rows (H heads of `in`'s rows, row_stride floats apart) gathered with the
// rotation applied (gather_rotated_heads_kernel, for attention_forward_rotary) against the
// CPU's rope_forward on a copy of the heads as rows of their own, then the same gather: each
// bf16 within a rounding of the rotated float (a half ulp of bf16 plus float rounding of the
// rotation, whose sin and cos the kernel and the CPU compute with different calls).
static void check_rotated_rows(const char *what, const float *in, int row_stride, int B, int T, int H, int hd) {
    const int threads = attention_gather::THREADS, N = B * T, half = hd / 2;
    std::vector<float> inv_freq((size_t)half);
    for (int i = 0; i < half; i++) inv_freq[(size_t)i] = 1.0f / powf(10000.0f, (float)(2 * i) / (float)hd);
    std::vector<int> positions((size_t)N);
    for (int row = 0; row < N; row++) positions[(size_t)row] = row % T + (row / T) * 29989; // far positions too
    std::vector<bf16> out((size_t)N * H * hd, bf16{0xffff});
    EXPECT(attention_gather::gathers_rotated(in, row_stride, B, T, H, hd), "gathers_rotated of %s at head_dim %d",
           what, hd);
    const long items_per_head = (long)N * (hd / 16);
    emulation::launch({blocks_for(items_per_head, threads), (unsigned)H, 1}, threads,
                      attention_gather::ROTATED_SHARED_BYTES, [&] {
                          attention_gather::gather_rotated_heads_kernel(out.data(), in, row_stride, positions.data(),
                                                                        inv_freq.data(), B, T, H, hd);
                      });
    std::vector<float> rotated((size_t)N * H * hd);
    for (long row = 0; row < N; row++)
        for (int i = 0; i < H * hd; i++) rotated[(size_t)(row * H * hd + i)] = in[row * row_stride + i];
    ops_cpu.rope_forward(rotated.data(), positions.data(), N, H, hd, inv_freq.data());
    long wrong = 0, not_bitwise = 0;
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++)
            for (int t = 0; t < T; t++)
                for (int d = 0; d < hd; d++) {
                    const float want = rotated[(size_t)(((long)b * T + t) * H * hd + (long)h * hd + d)];
                    const bf16 got = out[(size_t)((((long)b * H + h) * T + t) * hd + d)];
                    wrong += !(fabsf(bf16_to_float(got) - want) <= 0x1p-8f * fabsf(want) + 1e-30f);
                    not_bitwise += got.bits != float_to_bf16(want).bits;
                }
    printf("# gather rotated %-8s B %d T %d, %2d heads, head_dim %3d, row stride %4d: %ld wrong (%ld not the CPU's "
           "bits)\n",
           what, B, T, H, hd, row_stride, wrong, not_bitwise);
    EXPECT(wrong == 0, "rotated gather of %s at head_dim %d: %ld of %zu bf16 wrong", what, hd, wrong, out.size());
}

static void check_rotated_gather(int B, int T, int H, int hd) {
    const std::vector<float> in = random_floats(rng, (long)B * T * H * hd, 3.0f);
    check_rotated_rows("own rows", in.data(), H * hd, B, T, H, hd);
}

// dO and D as gather_dout_with_row_dot makes them: the eight-element kernel where it can,
// else the fallback's two kernels.
static void check_dout(int B, int T, int H, int hd) {
    const int threads = attention_gather::THREADS;
    const std::vector<float> dout = random_floats(rng, (long)B * T * H * hd, 1.0f);
    const std::vector<float> out = random_floats(rng, (long)B * T * H * hd, 2.0f);
    std::vector<bf16> dO((size_t)B * H * T * hd, bf16{0xffff});
    std::vector<float> D((size_t)B * H * T, NAN);
    const bool by_eight = attention_gather::gathers_dout_by_eight(dout.data(), out.data(), B, T, H, hd);
    if (by_eight) {
        const long items_per_head = (long)B * T * (hd / 8);
        emulation::launch({blocks_for(items_per_head, threads), (unsigned)H, 1}, threads, 0, [&] {
            attention_gather::gather_dout_by_eight_kernel(dO.data(), D.data(), dout.data(), out.data(), B, T, H, hd);
        });
    } else {
        emulation::launch({blocks_for((long)B * H * T, threads / 32), 1, 1}, threads, 0, [&] {
            attention_gather::row_dot_kernel(D.data(), dout.data(), out.data(), B, H, T, hd);
        });
        emulation::launch({blocks_for((long)B * H * T * hd, threads), 1, 1}, threads, 0, [&] {
            attention_gather::gather_heads_kernel(dO.data(), dout.data(), H * hd, B, T, H, 1, hd);
        });
    }
    const long wrong = wrong_gathered(dO, dout.data(), H * hd, B, T, H, 1, hd);
    const double error = worst_row_dot(D, dout, out, B, T, H, hd);
    printf("# dO, D  %-7s B %d T %d, %2d heads, head_dim %3d: %ld wrong, D %.2g\n", by_eight ? "by 8" : "by 1", B, T,
           H, hd, wrong, error);
    EXPECT(wrong == 0, "dO gathered %s at head_dim %d: %ld of %zu bf16 wrong", by_eight ? "by 8" : "by 1", hd, wrong,
           dO.size());
    EXPECT(error <= 1e-5, "D %s at head_dim %d: %.3g of its products' magnitude", by_eight ? "by 8" : "by 1", hd,
           error);
}

static void test_gathers(void) {
    const int head_dims[] = {8, 16, 24, 32, 64, 128};
    for (int hd : head_dims) {
        for (int by_eight = 0; by_eight <= 1; by_eight++) {
            if (by_eight && hd % 8 != 0) continue;
            check_gather(2, 37, 6, 1, hd, by_eight); // queries
            check_gather(2, 37, 6, 3, hd, by_eight); // keys or values: 2 heads read by 3 each
        }
    }
    check_gather(1, 5, 4, 4, 6, false); // a head_dim the eight-element kernel cannot take
}

static void test_rotated_gathers(void) {
    const int head_dims[] = {16, 32, 64, 128};
    for (int hd : head_dims) {
        check_rotated_gather(2, 37, 6, hd); // queries
        check_rotated_gather(2, 37, 2, hd); // keys
    }
    std::vector<float> odd(16 * 24 + 4);
    EXPECT(!attention_gather::gathers_rotated(odd.data(), 24, 1, 16, 1, 24), "gathers_rotated takes head_dim 24");
}

// The columns of one fused q | k | v buffer (rows of (H + 2 KV) * hd floats), as the rotary
// attention's forward gathers them in place: q's H heads and k's KV heads plain and rotated,
// v's KV heads, and k's heads repeated over groups of H / KV (as the unfused kernels gather
// K and V); every gather by both kernels where the eight-element one takes the rows.
static void check_packed_gathers(int B, int T, int H, int KV, int hd) {
    const int q_dim = H * hd, kv_dim = KV * hd, width = q_dim + 2 * kv_dim;
    const std::vector<float> packed = random_floats(rng, (long)B * T * width, 3.0f);
    const float *q = packed.data(), *k = q + q_dim, *v = k + kv_dim;
    const bool by_eight = hd % 8 == 0;
    EXPECT(attention_gather::gathers_by_eight(k, width, B, T, KV, hd) == by_eight,
           "gathers_by_eight of packed rows at head_dim %d", hd);
    for (int eight = 0; eight <= (by_eight ? 1 : 0); eight++) {
        check_gather_rows("packed q", q, width, B, T, H, 1, hd, eight);
        check_gather_rows("packed k", k, width, B, T, KV, 1, hd, eight);
        check_gather_rows("packed k", k, width, B, T, H, H / KV, hd, eight);
        check_gather_rows("packed v", v, width, B, T, KV, 1, hd, eight);
    }
    if (hd % 16 == 0) {
        check_rotated_rows("packed q", q, width, B, T, H, hd);
        check_rotated_rows("packed k", k, width, B, T, KV, hd);
    }
}

static void test_packed_gathers(void) {
    const int head_dims[] = {8, 16, 24, 32, 64, 128};
    for (int hd : head_dims) {
        check_packed_gathers(2, 37, 6, 2, hd);
        check_packed_gathers(1, 19, 4, 1, hd); // one K/V head for all four query heads
    }
    // A row stride that is not a multiple of 4 floats (2 heads of 16 and 2 floats more a row):
    // the float4 kernels cannot read its heads (neither predicate takes it); the
    // one-element kernel can.
    const int B = 2, T = 9, H = 2, hd = 16, row_stride = H * hd + 2;
    const std::vector<float> rows = random_floats(rng, (long)B * T * row_stride, 3.0f);
    EXPECT(!attention_gather::gathers_by_eight(rows.data(), row_stride, B, T, H, hd),
           "gathers_by_eight takes a row stride of %d floats", row_stride);
    EXPECT(!attention_gather::gathers_rotated(rows.data(), row_stride, B, T, H, hd),
           "gathers_rotated takes a row stride of %d floats", row_stride);
    check_gather_rows("odd rows", rows.data(), row_stride, B, T, H, 1, hd, false);
}

static void test_dout_and_row_term(void) {
    const int head_dims[] = {8, 16, 24, 32, 64, 128};
    for (int hd : head_dims) check_dout(2, 37, 6, hd);
    // The fallback's kernels at a head_dim the eight-element one takes: an O not 16-byte
    // aligned (an offset view) makes gather_dout_with_row_dot fall back too.
    const int B = 1, T = 9, H = 3, hd = 64;
    const std::vector<float> dout = random_floats(rng, (long)B * T * H * hd, 1.0f);
    std::vector<float> out_storage = random_floats(rng, (long)B * T * H * hd + 1, 2.0f);
    const float *out = out_storage.data() + 1;
    EXPECT(!attention_gather::gathers_dout_by_eight(dout.data(), out, B, T, H, hd),
           "gathers_dout_by_eight takes an O that is not 16-byte aligned");
    std::vector<float> D((size_t)B * H * T, NAN);
    emulation::launch({blocks_for((long)B * H * T, attention_gather::THREADS / 32), 1, 1}, attention_gather::THREADS, 0,
                      [&] { attention_gather::row_dot_kernel(D.data(), dout.data(), out, B, H, T, hd); });
    const std::vector<float> out_view(out, out + (long)B * T * H * hd);
    const double error = worst_row_dot(D, dout, out_view, B, T, H, hd);
    EXPECT(error <= 1e-5, "D by the fallback with an unaligned O: %.3g of its products' magnitude", error);
}

int main(void) {
    RUN(test_gathers);
    RUN(test_rotated_gathers);
    RUN(test_packed_gathers);
    RUN(test_dout_and_row_term);
    TEST_EXIT();
}
