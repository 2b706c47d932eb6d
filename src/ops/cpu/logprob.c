// Log-probabilities of given tokens, entropy, and the value head. The softmax is never
// stored: the forward keeps only the log-sum-exp per row, and the backward rebuilds the
// probabilities from it while overwriting the logits with their gradient.
#include <math.h>

#include "ops/cpu/ops_cpu.h"

void cpu_logprob_forward(float *logp, float *lse, int *top1, float *entropy,
                         const float *logits, const int *targets, int N, int V) {
#pragma omp parallel for schedule(static)
    for (int i = 0; i < N; i++) {
        const float *z = logits + (long)i * V;
        float max_logit = z[0];
        int argmax = 0;
        for (int v = 1; v < V; v++)
            if (z[v] > max_logit) {
                max_logit = z[v];
                argmax = v;
            }
        double sum = 0;
        for (int v = 0; v < V; v++) sum += exp((double)(z[v] - max_logit));
        double row_lse = max_logit + log(sum);
        lse[i] = (float)row_lse;
        if (top1) top1[i] = argmax; // before targets[i] is read: targets may be top1 (ops.h)
        if (logp) logp[i] = targets && targets[i] >= 0 ? (float)(z[targets[i]] - row_lse) : 0.0f;
        if (entropy) {
            // H = lse - sum_v p_v z_v
            double expected_logit = 0;
            for (int v = 0; v < V; v++) expected_logit += exp(z[v] - row_lse) * z[v];
            entropy[i] = (float)(row_lse - expected_logit);
        }
    }
}

// -log sum_v p_v^2 = 2 log sum_v e^(z_v - m) - log sum_v e^(2 (z_v - m)): the max m cancels,
// and both sums are at least 1, so neither underflows.
void cpu_collision_entropy_forward(float *collision, const float *logits, int N, int V) {
#pragma omp parallel for schedule(static)
    for (int i = 0; i < N; i++) {
        const float *z = logits + (long)i * V;
        float max_logit = z[0];
        for (int v = 1; v < V; v++)
            if (z[v] > max_logit) max_logit = z[v];
        double sum = 0, sum_squares = 0;
        for (int v = 0; v < V; v++) {
            const double e = exp((double)(z[v] - max_logit));
            sum += e;
            sum_squares += e * e;
        }
        collision[i] = (float)(2.0 * log(sum) - log(sum_squares));
    }
}

// d logp / d z_v = [v == target] - p_v
// d H / d z_v    = -p_v (z_v - lse + H)
// Under a soft cap z = cap tanh(r / cap), d z / d r = 1 - (z / cap)^2: each element's
// gradient times that slope (1 without a cap, which changes no bit).
void cpu_logprob_backward(float *logits_to_dlogits, const float *dlogp, const float *dentropy,
                          const int *targets, const float *lse, int N, int V, float softcap) {
#pragma omp parallel for schedule(static)
    for (int i = 0; i < N; i++) {
        float *z = logits_to_dlogits + (long)i * V;
        float g_logp = dlogp && targets && targets[i] >= 0 ? dlogp[i] : 0.0f;
        float g_entropy = dentropy ? dentropy[i] : 0.0f;
        double row_lse = lse[i];
        double row_entropy = 0;
        if (g_entropy != 0.0f) {
            double expected_logit = 0;
            for (int v = 0; v < V; v++) expected_logit += exp(z[v] - row_lse) * z[v];
            row_entropy = row_lse - expected_logit;
        }
        float target_slope = 1.0f;
        if (softcap > 0.0f && g_logp != 0.0f) {
            const float capped = z[targets[i]] / softcap;
            target_slope = 1.0f - capped * capped;
        }
        for (int v = 0; v < V; v++) {
            double p = exp(z[v] - row_lse);
            double grad = -g_logp * p;
            if (g_entropy != 0.0f) grad += -g_entropy * p * (z[v] - row_lse + row_entropy);
            if (softcap > 0.0f) {
                const double capped = z[v] / softcap;
                grad *= 1.0 - capped * capped;
            }
            z[v] = (float)grad;
        }
        if (g_logp != 0.0f) z[targets[i]] += g_logp * target_slope;
    }
}

void cpu_soft_cap_forward(float *x, long n, float cap) {
#pragma omp parallel for simd schedule(static)
    for (long i = 0; i < n; i++) x[i] = cap * tanh_one(x[i] / cap);
}

void cpu_value_head_forward(float *values, const float *hidden, const float *weight, int N,
                            int C) {
#pragma omp parallel for schedule(static)
    for (int i = 0; i < N; i++) {
        const float *h = hidden + (long)i * C;
        double sum = 0;
        for (int c = 0; c < C; c++) sum += (double)h[c] * weight[c];
        values[i] = (float)sum;
    }
}

void cpu_value_head_backward(float *dhidden, float *dweight, const float *dvalues,
                             const float *hidden, const float *weight, int N, int C) {
    if (dhidden) {
#pragma omp parallel for schedule(static)
        for (int i = 0; i < N; i++) {
            float *dh = dhidden + (long)i * C;
            for (int c = 0; c < C; c++) dh[c] += dvalues[i] * weight[c];
        }
    }
    if (dweight) {
        const int block = 16;
#pragma omp parallel for schedule(static)
        for (int c0 = 0; c0 < C; c0 += block) {
            int c1 = c0 + block < C ? c0 + block : C;
            for (int i = 0; i < N; i++)
                for (int c = c0; c < c1; c++) dweight[c] += dvalues[i] * hidden[(long)i * C + c];
        }
    }
}
