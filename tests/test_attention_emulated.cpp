// The mma.sync attention kernels (src/ops/cuda/attention_mma.cuh) run on the CPU through
// src/ops/cuda/cpu_emulation.h, against the CPU backend's attention op: forward output,
// log-sum-exps, and the three input gradients, on ragged rows (left padding), grouped K/V
// heads, partial tiles (the forward's 128-row query blocks, the backward's 64-row tiles)
// and every supported head_dim. The same tolerances as the GPU checks
// (tests/gpu/test_cuda.c): bf16 operands give relative errors near 2e-3, the bound is 1e-2.
// This checks the kernels' indexing, masking, online softmax and tile pipeline in CI;
// tests/gpu/run.sh checks the same kernels on a GPU. test_mma_attention_window runs them
// with sliding windows (shorter than a tile, and across several tiles). Every backward runs
// a second time into the columns of one fused q | k | v gradient (rows q_dim + 2 kv_dim floats
// apart, as the rotary attention's backward writes them in place), which must hold the
// planar run's bits in every element.
#include <stdint.h>
#include <string.h>

#include <vector>

extern "C" {
#include "ops/ops.h"
}
#include "ops/cuda/attention_mma.cuh"
#include "emulated_test.h"
#include "test.h"

using namespace attention_mma;

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

// This test's inputs: one sequence from a fixed seed.
static std::vector<float> random_floats(long n, float scale) { return random_floats(rng_state, n, scale); }

// in [B*T, heads*hd] rows -> bf16 [B, H, T, hd], head h reading input head h / group.
static std::vector<bf16> head_major(const std::vector<float> &in, int B, int T, int H, int group, int hd) {
    std::vector<bf16> out((size_t)B * H * T * hd);
    const int width = H / group * hd;
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++)
            for (int t = 0; t < T; t++)
                for (int d = 0; d < hd; d++)
                    out[(((size_t)b * H + h) * T + t) * hd + d] =
                        float_to_bf16(in[((size_t)b * T + t) * width + (h / group) * hd + d]);
    return out;
}

// The backward run by `backward(dq, dk, dv, q_row_stride, kv_row_stride)` into one fused
// buffer [N, q_dim + 2 kv_dim] filled with NaN, dq its first q_dim columns, dk the next
// kv_dim and dv the last: every element must be the planar run's (dq, dk, dv), bit for bit
// (the kernels compute the same sums whatever the stride), and none left NaN.
template <typename Backward>
static void check_packed_gradients(const char *label, const std::vector<float> &dq, const std::vector<float> &dk,
                                   const std::vector<float> &dv, int N, int q_dim, int kv_dim, Backward backward) {
    const int width = q_dim + 2 * kv_dim;
    std::vector<float> packed((size_t)N * width, NAN);
    backward(packed.data(), packed.data() + q_dim, packed.data() + q_dim + kv_dim, width, width);
    long unwritten = 0, different = 0;
    for (long row = 0; row < N; row++)
        for (int column = 0; column < width; column++) {
            const float got = packed[(size_t)(row * width + column)];
            const float want = column < q_dim            ? dq[(size_t)(row * q_dim + column)]
                               : column < q_dim + kv_dim ? dk[(size_t)(row * kv_dim + column - q_dim)]
                                                         : dv[(size_t)(row * kv_dim + column - q_dim - kv_dim)];
            if (got != got) unwritten++;
            else different += memcmp(&got, &want, sizeof got) != 0;
        }
    printf("# %-22s packed gradients: %ld unwritten, %ld not the planar bits\n", label, unwritten, different);
    EXPECT(unwritten == 0, "%s: %ld elements of the packed gradient left unwritten", label, unwritten);
    EXPECT(different == 0, "%s: %ld elements of the packed gradient differ from the planar run's", label, different);
}

static const float TOLERANCE = 1e-2f;
// A single head's row (HD values) has fewer values to average its bf16 rounding over.
static const float ROW_TOLERANCE = 5e-2f;

// One case on one variant of the kernels (attention_mma.cuh): TUNED, the default, on every
// case below; test_mma_attention_plain_variant runs PLAIN on a few.
template <int HD, Variant VARIANT = TUNED>
static void check_case(int B, int T, int H, int KV, const std::vector<int> &row_start, int window = 0) {
    const int group = H / KV;
    const long q_n = (long)B * T * H * HD, kv_n = (long)B * T * KV * HD;
    const float scale = 1.0f / sqrtf((float)HD);
    char label[112];
    snprintf(label, sizeof label, "%s B%d T%d H%d/%d hd%d window %d", VARIANT == TUNED ? "tuned" : "plain", B, T, H, KV,
             HD, window);
    std::vector<float> q = random_floats(q_n, 2.0f), k = random_floats(kv_n, 2.0f), v = random_floats(kv_n, 1.0f);
    std::vector<float> dout = random_floats(q_n, 1.0f);

    // The reference: the CPU op in fp32 on the same (bf16-rounded) inputs.
    auto round_bf16 = [](std::vector<float> x) {
        for (float &value : x) value = bf16_to_float(float_to_bf16(value));
        return x;
    };
    std::vector<float> qr = round_bf16(q), kr = round_bf16(k), vr = round_bf16(v);
    std::vector<float> out_ref((size_t)q_n), probs((size_t)B * H * T * T);
    ops_cpu.attention_forward(out_ref.data(), probs.data(), qr.data(), kr.data(), vr.data(), row_start.data(), B, T, H,
                              KV, HD, 0.0f, window);

    // K and V once per K/V head, as attention.cu gathers them for these kernels.
    std::vector<bf16> Q = head_major(q, B, T, H, 1, HD), K = head_major(k, B, T, KV, 1, HD);
    std::vector<bf16> V = head_major(v, B, T, KV, 1, HD), dO = head_major(dout, B, T, H, 1, HD);
    std::vector<float> out((size_t)q_n, NAN), lse((size_t)B * H * T, NAN);
    // The output's bf16 copy (a held o-projection input), written over NaN; PLAIN runs without one.
    std::vector<bf16> out_copy((size_t)q_n, float_to_bf16(NAN));
    bf16 *copy = VARIANT == TUNED ? out_copy.data() : nullptr;
    const int *rs = row_start.data();
    const GridShape forward = forward_grid<HD, VARIANT>(B, H, T);
    emulation::launch({forward.x, forward.y, 1}, THREADS, forward_shared_bytes<HD>(), [&] {
        forward_kernel<HD, VARIANT>(out.data(), copy, lse.data(), Q.data(), K.data(), V.data(), rs, H, KV, T, scale,
                                    window);
    });
    double error = relative_error(out.data(), out_ref.data(), q_n);
    double worst = worst_segment_error(out.data(), out_ref.data(), q_n, HD);
    printf("# %-22s out %.3e (worst head row %.3e)\n", label, error, worst);
    EXPECT(error <= TOLERANCE, "%s: forward output error %.3e", label, error);
    EXPECT(worst <= ROW_TOLERANCE, "%s: forward output error %.3e in one head's row", label, worst);
    if (copy) {
        long copy_mismatches = 0;
        for (size_t i = 0; i < (size_t)q_n; i++) copy_mismatches += out_copy[i].bits != float_to_bf16(out[i]).bits;
        EXPECT(copy_mismatches == 0, "%s: %ld elements of the output's bf16 copy are not the output rounded", label,
               copy_mismatches);
    }

    // Log-sum-exps in double from the rounded inputs; +inf for queries with no keys.
    long padding_nonzero = 0;
    double lse_worst = 0;
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++)
            for (int t = 0; t < T; t++) {
                float got = lse[((size_t)b * H + h) * T + t];
                if (t < row_start[(size_t)b]) {
                    EXPECT(got == INFINITY, "%s: padding query %d of row %d has lse %g", label, t, b, got);
                    for (int d = 0; d < HD; d++) padding_nonzero += out[((size_t)b * T + t) * H * HD + h * HD + d] != 0.0f;
                    continue;
                }
                double max_score = -INFINITY, sum = 0;
                std::vector<double> scores;
                const int first = window > 0 ? std::max(row_start[(size_t)b], t - window + 1) : row_start[(size_t)b];
                for (int j = first; j <= t; j++) {
                    double dot = 0;
                    for (int d = 0; d < HD; d++)
                        dot += (double)qr[((size_t)b * T + t) * H * HD + h * HD + d] *
                               kr[((size_t)b * T + j) * KV * HD + (h / group) * HD + d];
                    scores.push_back(dot * scale);
                    max_score = fmax(max_score, dot * scale);
                }
                for (double s : scores) sum += exp(s - max_score);
                lse_worst = fmax(lse_worst, fabs(got - (max_score + log(sum))));
            }
    printf("# %-22s lse max abs error %.3e\n", label, lse_worst);
    EXPECT(lse_worst <= 2e-3, "%s: lse error %.3e", label, lse_worst);
    EXPECT(padding_nonzero == 0, "%s: %ld outputs of padding queries are nonzero", label, padding_nonzero);

    // Backward, written over NaN (the op's contract: the gradients are overwritten, every
    // element, so a row the kernels leave alone shows).
    std::vector<float> dq_ref((size_t)q_n, 0.0f), dk_ref((size_t)kv_n, 0.0f), dv_ref((size_t)kv_n, 0.0f);
    std::vector<float> doutr = round_bf16(dout);
    ops_cpu.attention_backward(dq_ref.data(), dk_ref.data(), dv_ref.data(), doutr.data(), out_ref.data(), probs.data(),
                               qr.data(), kr.data(), vr.data(), row_start.data(), B, T, H, KV, HD, 0.0f, window);
    std::vector<float> D((size_t)B * H * T);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++)
            for (int t = 0; t < T; t++) {
                float sum = 0.0f;
                for (int d = 0; d < HD; d++) {
                    size_t at = ((size_t)b * T + t) * H * HD + h * HD + d;
                    sum += dout[at] * out[at];
                }
                D[((size_t)b * H + h) * T + t] = sum;
            }
    std::vector<float> dq((size_t)q_n, NAN), dk((size_t)kv_n, NAN), dv((size_t)kv_n, NAN);
    const GridShape kv = backward_kv_grid(B, KV, T), queries = backward_q_grid(B, H, T);
    const int N = B * T, q_dim = H * HD, kv_dim = KV * HD;
    auto backward = [&](float *dq_rows, float *dk_rows, float *dv_rows, int q_row_stride, int kv_row_stride) {
        emulation::launch({kv.x, kv.y, 1}, THREADS, backward_kv_shared_bytes<HD>(), [&] {
            backward_kv_kernel<HD, VARIANT>(dk_rows, dv_rows, kv_row_stride, Q.data(), K.data(), V.data(), dO.data(),
                                            lse.data(), D.data(), rs, H, KV, T, scale, window);
        });
        emulation::launch({queries.x, queries.y, 1}, THREADS, backward_q_shared_bytes<HD>(), [&] {
            backward_q_kernel<HD, VARIANT>(dq_rows, q_row_stride, Q.data(), K.data(), V.data(), dO.data(), lse.data(),
                                           D.data(), rs, H, KV, T, scale, window);
        });
    };
    backward(dq.data(), dk.data(), dv.data(), q_dim, kv_dim);
    struct Gradient {
        const char *name;
        std::vector<float> &got, &want;
    } gradients[] = {{"dq", dq, dq_ref}, {"dk", dk, dk_ref}, {"dv", dv, dv_ref}};
    auto check_gradients = [&](const char *how) {
        for (Gradient &g : gradients) {
            error = relative_error(g.got.data(), g.want.data(), (long)g.got.size());
            worst = worst_segment_error(g.got.data(), g.want.data(), (long)g.got.size(), HD);
            printf("# %-22s %s%s %.3e (worst head row %.3e)\n", label, how, g.name, error, worst);
            EXPECT(error <= TOLERANCE, "%s: %s%s error %.3e", label, how, g.name, error);
            EXPECT(worst <= ROW_TOLERANCE, "%s: %s%s error %.3e in one head's row", label, how, g.name, worst);
        }
    };
    check_gradients("");
    check_packed_gradients(label, dq, dk, dv, N, q_dim, kv_dim, backward);

    // "mma-ds": the dK/dV kernel also writes dS (into NaN: an entry the dQ kernel reads and
    // the dK/dV kernel did not write shows), then dQ from it.
    if constexpr (VARIANT == TUNED && keeps_scores_gradient_at(HD)) {
        std::vector<bf16> scores((size_t)B * H * (size_t)score_tiles_per_head(T) * SCORE_TILE_ELEMENTS, float_to_bf16(NAN));
        std::fill(dq.begin(), dq.end(), NAN), std::fill(dk.begin(), dk.end(), NAN), std::fill(dv.begin(), dv.end(), NAN);
        auto backward_keeping_scores = [&](float *dq_rows, float *dk_rows, float *dv_rows, int q_row_stride,
                                           int kv_row_stride) {
            emulation::launch({kv.x, kv.y, 1}, THREADS, backward_kv_shared_bytes<HD>(), [&] {
                backward_kv_scores_kernel<HD>(dk_rows, dv_rows, kv_row_stride, Q.data(), K.data(), V.data(), dO.data(),
                                              lse.data(), D.data(), rs, H, KV, T, scale, window, scores.data());
            });
            emulation::launch({queries.x, queries.y, 1}, THREADS, backward_q_from_scores_shared_bytes<HD>(), [&] {
                backward_q_from_scores_kernel<HD>(dq_rows, q_row_stride, K.data(), scores.data(), rs, H, KV, T, scale,
                                                  window);
            });
        };
        backward_keeping_scores(dq.data(), dk.data(), dv.data(), q_dim, kv_dim);
        check_gradients("kept dS: ");
        char kept_label[128];
        snprintf(kept_label, sizeof kept_label, "%s kept dS", label);
        check_packed_gradients(kept_label, dq, dk, dv, N, q_dim, kv_dim, backward_keeping_scores);
    }
}

static void test_mma_attention_small_heads(void) {
    check_case<32>(3, 37, 6, 2, {0, 5, 30});  // GQA 3:1, one partial tile
    check_case<16>(3, 19, 4, 1, {0, 5, 18}); // multi-query, a row of one query
}

static void test_mma_attention_several_tiles(void) {
    // Three tiles, the last partial; a row whose padding ends past a tile boundary and
    // one whose only query is the last.
    check_case<64>(3, 150, 4, 2, {0, 70, 149});
}

static void test_mma_attention_head_dim_128(void) {
    check_case<128>(1, 70, 2, 2, {2});
    // Padding fills two whole tiles. Twelve real rows: with two (T = 130) the reference
    // gradients are near zero (a row of two keys has dS = p1 p2 (dP1 - dP2)) and their relative
    // error is bf16 rounding over almost nothing, 7e-2 on some inputs for both variants alike.
    check_case<128>(1, 140, 2, 1, {128});
}

// Sliding windows: 7 keys (inside a tile), 70 (across tile boundaries, so whole key tiles
// before a block's windows are skipped and some of a query tile's rows see none of a tile
// that others see), and 2 (a query and its predecessor); ragged rows and GQA.
static void test_mma_attention_window(void) {
    check_case<32>(3, 37, 6, 2, {0, 5, 30}, 7);
    check_case<64>(3, 150, 4, 2, {0, 70, 149}, 70);
    check_case<64>(2, 200, 4, 1, {0, 3}, 7);
    check_case<16>(2, 70, 4, 2, {0, 9}, 2);
}

// The forward's 128-row query blocks (two 16-row m-tiles per warp, the block's two halves
// of 64 rows; HD <= 64): partial blocks (T = 65, 70, 129, 130, 200), padding that fills a
// block's first half (row_start 64, 66, 192) or a whole block (128, 192), so that one
// m-tile of every warp, or both, see no key; windows shorter than a key tile and longer
// than a query block.
static void test_mma_attention_forward_blocks(void) {
    check_case<64>(2, 70, 4, 2, {0, 66});
    check_case<32>(3, 130, 4, 2, {0, 64, 128});
    check_case<16>(2, 200, 4, 4, {0, 192});
    check_case<64>(1, 65, 2, 1, {64}); // a block's only real row is its second half's first
    check_case<32>(2, 129, 2, 1, {3, 79}, 5); // 79: an m-tile whose only real row is its last
    check_case<16>(2, 200, 4, 2, {0, 70}, 130);
    check_case<64>(2, 200, 2, 2, {1, 100}, 64);
}

// PLAIN (one forward m-tile per warp, 64-row blocks; no A operands kept in registers): the
// kernels as run on the H200 before TUNED, kept selectable ("mma-plain") to measure against
// it. Partial tiles, padding, GQA, every head_dim, a window across tiles.
static void test_mma_attention_plain_variant(void) {
    check_case<32, PLAIN>(3, 37, 6, 2, {0, 5, 30});
    check_case<16, PLAIN>(3, 19, 4, 1, {0, 5, 18});
    check_case<64, PLAIN>(3, 150, 4, 2, {0, 70, 149});
    check_case<128, PLAIN>(1, 70, 2, 2, {2});
    check_case<64, PLAIN>(3, 150, 4, 2, {0, 70, 149}, 70);
    check_case<64, PLAIN>(2, 70, 4, 2, {0, 66});
}

int main(void) {
    RUN(test_mma_attention_window);
    RUN(test_mma_attention_small_heads);
    RUN(test_mma_attention_several_tiles);
    RUN(test_mma_attention_head_dim_128);
    RUN(test_mma_attention_forward_blocks);
    RUN(test_mma_attention_plain_variant);
    TEST_EXIT();
}
