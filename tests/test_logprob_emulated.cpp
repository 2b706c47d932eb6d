// The CUDA log-probability kernels (src/ops/cuda/logprob_rows.cuh) on CPU threads through
// src/ops/cuda/cpu_emulation.h, against the CPU op (ops/cpu/logprob.c): the forward's
// log-sum-exp, target log-prob, argmax and entropy, and the backward's logit gradients with
// and without the entropy term and Gemma 2's soft cap. Rows of fewer logits than the block
// has threads, of a count not divisible by 4 (one float at a time) and of counts that are
// (four at a time, and the same rows one at a time); a row whose maximum appears twice (the
// first index wins), rows with -inf logits, a row rising to its last logit (every thread's
// running maximum moves), a row whose maximum is its first logit, a row with a NaN. The
// backward's bf16 copy of the gradient (the LM head's held input) bit for bit.
//
// The kernels take fp32 exponentials where the CPU takes fp64 ones: results agree to
// ~1e-7 (the bounds below, several times the largest differences seen with glibc's expf:
// lse and log-probs none, entropy 3e-8, gradients 6e-8), and the argmax exactly.
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
#include "ops/cuda/logprob_rows.cuh"
#include "test.h"

static uint64_t rng = 0x9e3779b97f4a7c15ull;

enum { ROWS = 7 };

// |got - want| <= atol + rtol |want|, or both NaN (a row's entropy with a -inf logit is
// 0 * -inf on both sides).
static bool close_or_both_nan(double got, double want, double atol, double rtol) {
    if (isnan(got) || isnan(want)) return isnan(got) && isnan(want);
    return fabs(got - want) <= atol + rtol * fabs(want);
}

// Row 0: its maximum twice; 1: every 7th logit -inf; 2: rising to its last; 3: largest first;
// 4: a NaN (only its lse is compared: NaN both ways); 5, 6: plain.
static std::vector<float> make_logits(int V) {
    std::vector<float> z = random_floats(rng, (long)ROWS * V, 6.0f);
    float *row0 = &z[0];
    row0[V / 3] = row0[V - 2] = 9.0f;
    for (int v = 0; v < V; v += 7) z[(size_t)V + v] = -INFINITY;
    for (int v = 0; v < V; v++) z[2 * (size_t)V + v] = -4.0f + 8.0f * (float)v / (float)V;
    z[3 * (size_t)V] = 10.0f;
    z[4 * (size_t)V + V / 2] = NAN;
    return z;
}

static std::vector<int> make_targets(int V) {
    std::vector<int> targets(ROWS);
    for (int i = 0; i < ROWS; i++) targets[i] = (i * 37 + 11) % V;
    targets[5] = -1; // no target: log-prob 0, no log-prob gradient
    return targets;
}

static void check_forward(int V, bool vector) {
    std::vector<float> z = make_logits(V);
    std::vector<int> targets = make_targets(V);
    std::vector<float> lse(ROWS), logp(ROWS), entropy(ROWS), want_lse(ROWS), want_logp(ROWS), want_entropy(ROWS);
    std::vector<int> top1(ROWS), want_top1(ROWS);
    emulation::launch({ROWS, 1, 1}, logprob_rows::THREADS, logprob_rows::SHARED_BYTES, [&] {
        logprob_rows::forward_kernel(logp.data(), lse.data(), top1.data(), entropy.data(), z.data(), targets.data(), V,
                                     vector);
    });
    ops_cpu.logprob_forward(want_logp.data(), want_lse.data(), want_top1.data(), want_entropy.data(), z.data(),
                            targets.data(), ROWS, V);
    char what[96];
    double worst_lse = 0, worst_entropy = 0;
    for (int i = 0; i < ROWS; i++) {
        snprintf(what, sizeof what, "V %d%s row %d", V, vector ? " (four at a time)" : "", i);
        if (i == 4) {
            EXPECT(isnan(lse[i]) && isnan(want_lse[i]), "%s: a NaN logit gives lse %g (CPU %g)", what, lse[i],
                   want_lse[i]);
            continue;
        }
        EXPECT_CLOSE(lse[i], want_lse[i], 2e-6, 2e-7, what);
        EXPECT_CLOSE(logp[i], want_logp[i], 2e-6, 2e-7, what);
        EXPECT(close_or_both_nan(entropy[i], want_entropy[i], 4e-6, 2e-7), "%s: entropy %.9g, CPU %.9g", what,
               entropy[i], want_entropy[i]);
        EXPECT(top1[i] == want_top1[i], "%s: argmax %d, CPU %d", what, top1[i], want_top1[i]);
        worst_lse = fmax(worst_lse, fmax(fabs(lse[i] - want_lse[i]), fabs(logp[i] - want_logp[i])));
        if (!isnan(want_entropy[i])) worst_entropy = fmax(worst_entropy, fabs(entropy[i] - want_entropy[i]));
    }
    EXPECT(top1[0] == V / 3, "V %d: of two equal maxima the first wins (%d)", V, top1[0]);
    // targets = top1 (greedy decoding, model_last_greedy): the argmax's log-prob, as the
    // CPU's with the same aliasing; the buffer holds other ids before the launch.
    std::vector<int> argmax(ROWS, 1), want_argmax(ROWS, 1);
    emulation::launch({ROWS, 1, 1}, logprob_rows::THREADS, logprob_rows::SHARED_BYTES, [&] {
        logprob_rows::forward_kernel(logp.data(), lse.data(), argmax.data(), nullptr, z.data(), argmax.data(), V,
                                     vector);
    });
    ops_cpu.logprob_forward(want_logp.data(), want_lse.data(), want_argmax.data(), nullptr, z.data(),
                            want_argmax.data(), ROWS, V);
    for (int i = 0; i < ROWS; i++) {
        if (i == 4) continue; // the NaN row
        snprintf(what, sizeof what, "V %d%s row %d, targets = top1", V, vector ? " (four at a time)" : "", i);
        EXPECT(argmax[i] == want_top1[i] && want_argmax[i] == want_top1[i], "%s: argmax %d, CPU %d", what, argmax[i],
               want_argmax[i]);
        EXPECT_CLOSE(logp[i], want_logp[i], 2e-6, 2e-7, what);
        EXPECT_CLOSE(logp[i], z[(size_t)i * V + want_top1[i]] - (double)want_lse[i], 2e-6, 2e-7, what);
    }
    printf("# forward V %-5d %-18s lse/logp worst %.2g, entropy worst %.2g\n", V, vector ? "four at a time" : "one at a time",
           worst_lse, worst_entropy);
}

static void check_backward(int V, bool vector, bool with_entropy, float softcap) {
    std::vector<float> z = make_logits(V);
    for (float &x : z)
        if (softcap > 0.0f && isfinite(x)) x = softcap * tanhf(x / softcap); // capped logits, as the model has them
    z[4 * (size_t)V + V / 2] = 0.0f;                                             // no NaN in the backward's rows
    std::vector<int> targets = make_targets(V);
    std::vector<float> lse(ROWS);
    ops_cpu.logprob_forward(NULL, lse.data(), NULL, NULL, z.data(), targets.data(), ROWS, V);
    const std::vector<float> dlogp = random_floats(rng, ROWS, 1.0f), dentropy = random_floats(rng, ROWS, 0.5f);
    std::vector<float> got = z, want = z;
    std::vector<bf16> copy(got.size(), bf16{0xffff}); // NaN until written
    const float *dentropy_or_null = with_entropy ? dentropy.data() : NULL;
    emulation::launch({ROWS, 1, 1}, logprob_rows::THREADS, logprob_rows::SHARED_BYTES, [&] {
        logprob_rows::backward_kernel(got.data(), copy.data(), dlogp.data(), dentropy_or_null, targets.data(),
                                      lse.data(), V, softcap, vector);
    });
    ops_cpu.logprob_backward(want.data(), dlogp.data(), dentropy_or_null, targets.data(), lse.data(), ROWS, V, softcap);
    double worst = 0;
    long wrong = 0, first_wrong = -1;
    for (size_t k = 0; k < got.size(); k++) {
        if (!close_or_both_nan(got[k], want[k], 3e-7, 1e-5)) {
            if (first_wrong < 0) first_wrong = (long)k;
            wrong++;
        }
        if (!isnan(want[k])) worst = fmax(worst, fabs((double)got[k] - want[k]));
    }
    const long copy_wrong = wrong_bf16_copies(copy, got);
    EXPECT(copy_wrong == 0, "V %d: %ld of %zu bf16 copies are not the rounded gradient", V, copy_wrong, got.size());
    EXPECT(wrong == 0, "V %d%s%s softcap %g: %ld of %zu gradients off, the first at row %ld logit %ld: %.9g, CPU %.9g",
           V, vector ? " four at a time" : "", with_entropy ? " with entropy" : "", softcap, wrong, got.size(),
           first_wrong / V, first_wrong % V, first_wrong >= 0 ? got[first_wrong] : 0.0f,
           first_wrong >= 0 ? want[first_wrong] : 0.0f);
    printf("# backward V %-5d %-18s entropy %d softcap %-4g worst %.2g\n", V, vector ? "four at a time" : "one at a time",
           with_entropy, softcap, worst);
}

// 40 logits: most of the block's 512 threads read none (their state stays empty).
static void test_forward(void) {
    const int sizes[] = {40, 1001, 1000, 5000};
    for (int V : sizes) {
        check_forward(V, false);
        if (V % 4 == 0) check_forward(V, true);
    }
}

static void test_backward(void) {
    const int sizes[] = {40, 1001, 1000, 5000};
    for (int V : sizes)
        for (int vector = 0; vector <= (V % 4 == 0); vector++) {
            check_backward(V, vector, false, 0.0f);
            check_backward(V, vector, true, 0.0f);
            check_backward(V, vector, true, 30.0f);
        }
}

int main(void) {
    RUN(test_forward);
    RUN(test_backward);
    TEST_EXIT();
}
