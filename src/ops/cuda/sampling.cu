// Sampling's candidates on the GPU (ops.h's sampling_candidates; the kernel in
// sampling_rows.cuh): a sampled decode step copies each row's top-k tokens and
// log-normaliser to the host instead of its whole row of logits.
#include "ops/cuda/cuda_common.cuh"
#include "ops/cuda/sampling_rows.cuh"

void cuda_sample_rows(int *tokens, float *logprobs, float *sampling_logprobs, const float *logits,
                      const float *inv_temperature, const double *uniform, int N, int V) {
    if (N == 0) return;
    sampling_rows::sample_kernel<<<N, sampling_rows::THREADS, sampling_rows::SAMPLE_SHARED_BYTES>>>(
        tokens, logprobs, sampling_logprobs, logits, inv_temperature, uniform, V);
    CUDA_CHECK_LAUNCH();
}

void cuda_sampling_candidates(int *counts, int *ids, float *values, double *lse, double *scaled_lse,
                              const float *logits, const float *inv_temperature, const int *top_k, int N, int V,
                              int capacity) {
    if (N == 0) return;
    sampling_rows::candidates_kernel<<<N, sampling_rows::THREADS, sampling_rows::SHARED_BYTES>>>(
        counts, ids, values, lse, scaled_lse, logits, inv_temperature, top_k, V, capacity);
    CUDA_CHECK_LAUNCH();
}
