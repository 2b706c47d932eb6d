// Sampling's candidates over rows of logits (ops.h's sampling_candidates): each row's
// log-normaliser and the tokens its top-k keeps, so that the sampler runs on those alone.
// The threshold and the comparison are gen/sampler.c's own (ops/sampling_key.h's
// sampling_kth_largest on the scaled logits, then >=), so the set is the one its top-k keeps;
// for every logit but NaN it is the CUDA kernel's selection by keys (ops/cuda/sampling_rows.cuh).
#include <math.h>
#include <stdlib.h>

#include "core/check.h"
#include "ops/cpu/ops_cpu.h"
#include "ops/sampling_key.h"

// ops.h sample_rows: the arithmetic the GPU's kernel does (ops/cuda/sampling_rows.cuh
// sample_kernel), in one thread's order: fp32 exponentials, fp64 sums, the walk in id order.
// The tests' reference for that kernel; CPU generation samples with gen/sampler.c instead
// (OpsBackend.samples_whole_rows).
void cpu_sample_rows(int *tokens, float *logprobs, float *sampling_logprobs, const float *logits,
                     const float *inv_temperature, const double *uniform, int N, int V) {
#pragma omp parallel for schedule(static)
    for (int i = 0; i < N; i++) {
        const float *z = logits + (long)i * V;
        const float inverse = inv_temperature[i];
        float max_raw = -INFINITY, max_scaled = -INFINITY;
        for (int v = 0; v < V; v++) {
            max_raw = fmaxf(max_raw, z[v]);
            max_scaled = fmaxf(max_scaled, z[v] * inverse);
        }
        double sum_raw = 0, sum_scaled = 0;
        for (int v = 0; v < V; v++) {
            sum_raw += (double)expf(z[v] - max_raw);
            sum_scaled += (double)expf(z[v] * inverse - max_scaled);
        }
        // The walk compares unnormalised masses with uniform times their total.
        const double target = uniform[i] * sum_scaled;
        double cumulative = 0;
        int chosen = V - 1;
        for (int v = 0; v < V; v++) {
            cumulative += (double)expf(z[v] * inverse - max_scaled);
            if (target < cumulative) {
                chosen = v;
                break;
            }
        }
        tokens[i] = chosen;
        logprobs[i] = (float)(z[chosen] - (max_raw + log(sum_raw)));
        sampling_logprobs[i] = (float)(z[chosen] * inverse - (max_scaled + log(sum_scaled)));
    }
}

void cpu_sampling_candidates(int *counts, int *ids, float *values, double *lse, double *scaled_lse,
                             const float *logits, const float *inv_temperature, const int *top_k, int N, int V,
                             int capacity) {
#pragma omp parallel
    {
        float *scaled = xmalloc((size_t)V * sizeof(float)), *work = xmalloc((size_t)V * sizeof(float));
#pragma omp for schedule(static)
        for (int i = 0; i < N; i++) {
            const float *z = logits + (long)i * V;
            CHECK(top_k[i] > 0 && top_k[i] < V, "sampling candidates: top_k %d of %d tokens", top_k[i], V);
            float max_logit = z[0];
            for (int v = 1; v < V; v++)
                if (z[v] > max_logit) max_logit = z[v];
            double sum = 0;
            for (int v = 0; v < V; v++) sum += exp((double)(z[v] - max_logit));
            lse[i] = max_logit + log(sum);
            for (int v = 0; v < V; v++) scaled[v] = z[v] * inv_temperature[i];
            if (scaled_lse) { // sample_rows' arithmetic, the GPU kernel's in one thread's order
                float max_scaled = -INFINITY;
                for (int v = 0; v < V; v++) max_scaled = fmaxf(max_scaled, scaled[v]);
                double sum_scaled = 0;
                for (int v = 0; v < V; v++) sum_scaled += (double)expf(scaled[v] - max_scaled);
                scaled_lse[i] = max_scaled + log(sum_scaled);
            }
            const float threshold = sampling_kth_largest(scaled, V, top_k[i], work);
            int count = 0;
            for (int v = 0; v < V; v++) {
                if (!(scaled[v] >= threshold)) continue;
                if (count < capacity) ids[(long)i * capacity + count] = v, values[(long)i * capacity + count] = z[v];
                count++;
            }
            counts[i] = count;
        }
        free(scaled), free(work);
    }
}
