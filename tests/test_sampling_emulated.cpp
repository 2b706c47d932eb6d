// The CUDA kernel of sampling's candidates (src/ops/cuda/sampling_rows.cuh) on CPU threads
// through src/ops/cuda/cpu_emulation.h, against the CPU op (ops/cpu/sampling.c): each row's
// count, candidate ids and logits bit for bit, and its log-normaliser within 1e-6 (fp32
// exponentials on the GPU, fp64 on the CPU). Rows: plain random logits at several
// temperatures and k; logits on a coarse grid, so that the k-th largest is tied (every tie
// is in); -0 beside +0 at the threshold; -inf logits; k = 1 (greedy: the maxima); k = V - 1;
// fewer logits than the block has threads; and a capacity smaller than a row's count (only
// the count is defined then). Then the draw over whole rows (sample_kernel), below.
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <vector>

extern "C" {
#include "ops/ops.h"
}
#include "emulated_test.h"
#include "ops/cuda/sampling_rows.cuh"
#include "test.h"

static uint64_t rng = 0x243f6a8885a308d3ull;

static void check_rows(const char *what, const std::vector<float> &logits, int V, const std::vector<float> &inverse,
                       const std::vector<int> &top_k, int capacity) {
    const int N = (int)top_k.size();
    std::vector<int> counts(N, -1), want_counts(N, -1), ids((size_t)N * capacity, -7), want_ids((size_t)N * capacity, -7);
    std::vector<float> values((size_t)N * capacity, -7.0f), want_values((size_t)N * capacity, -7.0f);
    std::vector<double> lse(N), want_lse(N), scaled_lse(N, -7.0), want_scaled_lse(N, -7.0);
    emulation::launch({(unsigned)N, 1, 1}, sampling_rows::THREADS, sampling_rows::SHARED_BYTES, [&] {
        sampling_rows::candidates_kernel(counts.data(), ids.data(), values.data(), lse.data(), scaled_lse.data(),
                                         logits.data(), inverse.data(), top_k.data(), V, capacity);
    });
    ops_cpu.sampling_candidates(want_counts.data(), want_ids.data(), want_values.data(), want_lse.data(),
                                want_scaled_lse.data(), logits.data(), inverse.data(), top_k.data(), N, V, capacity);
    for (int i = 0; i < N; i++) {
        EXPECT(counts[i] == want_counts[i], "%s row %d: %d candidates, CPU %d", what, i, counts[i], want_counts[i]);
        EXPECT(want_counts[i] >= top_k[i], "%s row %d: %d candidates for k %d", what, i, want_counts[i], top_k[i]);
        EXPECT(want_counts[i] > capacity || // (then only the count is defined)
                   (!memcmp(&ids[(size_t)i * capacity], &want_ids[(size_t)i * capacity], capacity * sizeof(int)) &&
                    !memcmp(&values[(size_t)i * capacity], &want_values[(size_t)i * capacity], capacity * sizeof(float))),
               "%s row %d: other candidates than the CPU's", what, i);
        EXPECT_CLOSE(lse[i], want_lse[i], 1e-6, 1e-7, what);
        // The scaled row's log-normaliser: both against the definition in long double.
        long double max_scaled = -INFINITY, sum_scaled = 0;
        for (int v = 0; v < V; v++) max_scaled = fmaxl(max_scaled, logits[(size_t)i * V + v] * inverse[i]);
        for (int v = 0; v < V; v++) sum_scaled += expl(logits[(size_t)i * V + v] * inverse[i] - max_scaled);
        const double definition = (double)(max_scaled + logl(sum_scaled));
        EXPECT_CLOSE(scaled_lse[i], definition, 1e-6, 1e-7, what);
        EXPECT_CLOSE(want_scaled_lse[i], definition, 1e-6, 1e-7, what);
        // The CPU's own definition, checked directly: the k-th largest scaled logit, ties in.
        if (want_counts[i] > capacity) continue;
        std::vector<float> scaled(V);
        for (int v = 0; v < V; v++) scaled[v] = logits[(size_t)i * V + v] * inverse[i];
        std::vector<float> sorted = scaled;
        std::sort(sorted.begin(), sorted.end(), [](float a, float b) { return a > b; });
        const float threshold = sorted[top_k[i] - 1];
        int at = 0;
        for (int v = 0; v < V; v++)
            if (scaled[v] >= threshold) {
                EXPECT(at < want_counts[i] && want_ids[(size_t)i * capacity + at] == v, "%s row %d: id %d", what, i, v);
                at++;
            }
        EXPECT(at == want_counts[i], "%s row %d: %d at or over the k-th largest, %d candidates", what, i, at,
               want_counts[i]);
    }
}

static void test_candidates(void) {
    const int sizes[] = {40, 1001, 5000};
    for (int V : sizes) {
        const int N = 6;
        std::vector<float> logits = random_floats(rng, (long)N * V, 8.0f);
        // row 1: a coarse grid (ties at every k); row 2: zeros of both signs at the top, -inf
        // elsewhere in places; row 3: a tie of the largest (k = 1 keeps both)
        for (int v = 0; v < V; v++) logits[(size_t)V + v] = (float)((int)(logits[(size_t)V + v] * 2)) / 2.0f;
        for (int v = 0; v < V; v++) {
            float &x = logits[2 * (size_t)V + v];
            x = v % 3 == 0 ? -INFINITY : -fabsf(x) - 1.0f;
            if (v % 5 == 1) x = v % 2 ? -0.0f : 0.0f;
        }
        logits[3 * (size_t)V + V / 2] = logits[3 * (size_t)V + V - 1] = 20.0f;
        const std::vector<float> inverse = {1.0f, 1.0f / 0.8f, 1.0f, 1.0f, 1.0f / 1.7f, 2.0f};
        const int k_large = V - 1;
        std::vector<int> top_k = {50 < V ? 50 : 5, 7, 3, 1, k_large, 1};
        char what[64];
        snprintf(what, sizeof what, "V %d", V);
        check_rows(what, logits, V, inverse, top_k, V);
        snprintf(what, sizeof what, "V %d capacity 8", V);
        check_rows(what, logits, V, inverse, top_k, 8);
    }
}

// sample_kernel (ops.h sample_rows) against the CPU op, which does its arithmetic in one
// thread's order: the same token for random uniform numbers (the two sum the masses in other
// orders, so only a number within ~1e-16 of a bound could tell them apart), both log-probs
// within 1e-6; and the token against the definition, in long double: the masses of the tokens
// before it stay within u times the total, its own takes the walk past it. Rows: random
// logits at several temperatures, -inf logits (never drawn), one token with nearly all the
// mass, fewer logits than threads; u = 0 (the first token with any mass) and the largest
// double under 1 (the last with any: rounding may leave u past the total, where the rule
// takes the last token, V - 1: checked only to be a token with mass or V - 1).
static void test_sample_rows(void) {
    const int sizes[] = {40, 1001, 5000};
    for (int V : sizes) {
        const int N = 8;
        std::vector<float> logits = random_floats(rng, (long)N * V, 6.0f);
        for (int v = 0; v < V; v++)
            if (v % 4 == 1) logits[2 * (size_t)V + v] = -INFINITY; // row 2: a quarter never drawn
        logits[3 * (size_t)V + V / 3] = 40.0f;                    // row 3: one token takes nearly all
        const std::vector<float> inverse = {1.0f, 1.0f / 0.7f, 1.0f, 1.0f / 1.3f, 1.0f, 2.0f, 1.0f, 1.0f};
        const double last_under_one = nextafter(1.0, 0.0);
        std::vector<double> uniform = {0.37, 0.81, 0.5, 0.99, 0.0, 0.123456789, last_under_one, 0.7};
        for (int i = 0; i < N; i++)
            if (i == 0 || i == 1 || i == 7) uniform[i] = (double)random_floats(rng, 1, 0.5f)[0] + 0.5; // [0, 1)
        std::vector<int> tokens(N, -1), want_tokens(N, -2);
        std::vector<float> logprobs(N), want_logprobs(N), sampling(N), want_sampling(N);
        emulation::launch({(unsigned)N, 1, 1}, sampling_rows::THREADS, sampling_rows::SAMPLE_SHARED_BYTES, [&] {
            sampling_rows::sample_kernel(tokens.data(), logprobs.data(), sampling.data(), logits.data(), inverse.data(),
                                         uniform.data(), V);
        });
        ops_cpu.sample_rows(want_tokens.data(), want_logprobs.data(), want_sampling.data(), logits.data(),
                            inverse.data(), uniform.data(), N, V);
        for (int i = 0; i < N; i++) {
            const float *z = &logits[(size_t)i * V];
            const int t = tokens[i];
            EXPECT(t >= 0 && t < V, "V %d row %d: token %d", V, i, t);
            if (t < 0 || t >= V) continue;
            // The definition, in long double.
            long double max = -INFINITY, total = 0, before = 0;
            for (int v = 0; v < V; v++) max = fmaxl(max, (long double)(z[v] * inverse[i]));
            for (int v = 0; v < V; v++) total += expl((long double)(z[v] * inverse[i]) - max);
            for (int v = 0; v < t; v++) before += expl((long double)(z[v] * inverse[i]) - max);
            const long double mass = expl((long double)(z[t] * inverse[i]) - max), target = uniform[i] * total;
            const bool edge = uniform[i] == last_under_one;
            if (edge) {
                EXPECT(mass > 0 || t == V - 1, "V %d row %d: u next to 1 drew token %d with no mass", V, i, t);
            } else {
                EXPECT(t == want_tokens[i], "V %d row %d: token %d, CPU %d", V, i, t, want_tokens[i]);
                EXPECT(mass > 0 && before <= target * (1 + 1e-12L) && target < (before + mass) * (1 + 1e-12L),
                       "V %d row %d: token %d does not hold u %.17g (before %Lg, mass %Lg, target %Lg)", V, i, t,
                       uniform[i], before, mass, target);
            }
            EXPECT_CLOSE(logprobs[i], want_logprobs[i], 1e-6, 1e-6, "sample_rows logprob");
            EXPECT_CLOSE(sampling[i], want_sampling[i], 1e-6, 1e-6, "sample_rows sampling logprob");
        }
        printf("# sample rows V %4d: tokens", V);
        for (int i = 0; i < N; i++) printf(" %d", tokens[i]);
        printf("\n");
    }
}

int main(void) {
    RUN(test_candidates);
    RUN(test_sample_rows);
    TEST_EXIT();
}
