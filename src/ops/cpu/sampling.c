// Sampling's candidates over rows of logits (ops.h's sampling_candidates): each row's
// log-normaliser and the tokens its top-k keeps, so that the sampler runs on those alone.
// The selection is by ops/sampling_key.h's keys, as the CUDA kernel's
// (ops/cuda/sampling_rows.cuh), and gives the set gen/sampler.c's top-k keeps.
#include <math.h>
#include <stdlib.h>

#include "core/check.h"
#include "ops/cpu/ops_cpu.h"
#include "ops/sampling_key.h"

// The k-th smallest (1-based) of keys[0, n), by quickselect on the array (reordered).
static uint32_t kth_smallest_key(uint32_t *keys, int n, int k) {
    int low = 0, high = n - 1;
    const int target = k - 1;
    while (low < high) {
        const uint32_t pivot = keys[low + (high - low) / 2];
        int i = low, j = high;
        while (i <= j) {
            while (keys[i] < pivot) i++;
            while (keys[j] > pivot) j--;
            if (i <= j) {
                const uint32_t swap = keys[i];
                keys[i] = keys[j], keys[j] = swap;
                i++, j--;
            }
        }
        if (target <= j) high = j;
        else if (target >= i) low = i;
        else break;
    }
    return keys[target];
}

void cpu_sampling_candidates(int *counts, int *ids, float *values, double *lse, const float *logits,
                             const float *inv_temperature, const int *top_k, int N, int V, int capacity) {
#pragma omp parallel
    {
        uint32_t *keys = xmalloc((size_t)V * sizeof(uint32_t));
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
            for (int v = 0; v < V; v++) keys[v] = sampling_descending_key(z[v] * inv_temperature[i]);
            const uint32_t threshold = kth_smallest_key(keys, V, top_k[i]);
            int count = 0;
            for (int v = 0; v < V; v++) {
                if (sampling_descending_key(z[v] * inv_temperature[i]) > threshold) continue;
                if (count < capacity) ids[(long)i * capacity + count] = v, values[(long)i * capacity + count] = z[v];
                count++;
            }
            counts[i] = count;
        }
        free(keys);
    }
}
