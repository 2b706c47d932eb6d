// Sampling's candidates over rows of logits (sampling.cu; ops.h's sampling_candidates), and a
// draw from each row over the whole vocabulary (sample_rows, below): one block of THREADS
// threads per row. Written once for nvcc and for the CPU emulation
// (cpu_emulation.h), which runs it in tests/test_sampling_emulated.cpp against the CPU op
// (ops/cpu/sampling.c): the same ids and logits, the log-normaliser to ~1e-7.
//
// The top_k-th smallest key (ops/sampling_key.h) is found by a binary search over the 32-bit
// keys, each step a pass over the row and a block sum of counts: 32 passes of a row that
// stays in the caches, no atomics and no sort, so that the result cannot depend on the
// threads' timing. The candidates are then written in id order: each thread takes a
// contiguous piece of the row and writes its own after the pieces before it.
#pragma once
#include <math.h>

#include "ops/cuda/device_primitives.cuh"
#include "ops/sampling_key.h"

namespace sampling_rows {

enum { THREADS = 512, WARPS = THREADS / 32 };
// Shared memory: the block sums' slots (WARPS doubles, or ints), then one count a thread.
enum { SHARED_BYTES = WARPS * sizeof(double) + THREADS * sizeof(int) };

static __global__ void __launch_bounds__(THREADS)
    candidates_kernel(int *counts, int *ids, float *values, double *lse, double *scaled_lse, const float *logits,
                      const float *inv_temperature, const int *top_k, int V, int capacity) {
    DYNAMIC_SHARED(shared);
    double *double_slots = reinterpret_cast<double *>(shared);
    int *int_slots = reinterpret_cast<int *>(shared);
    float *float_slots = reinterpret_cast<float *>(shared);
    int *thread_counts = reinterpret_cast<int *>(shared + WARPS * sizeof(double));
    const long row = blockIdx.x;
    const float *z = logits + row * V;
    const float inverse = inv_temperature[row];
    const int k = top_k[row];

    // The log-normaliser: the row's maximum, then fp32 exponentials summed in fp64, as
    // logprob_rows.cuh (the CPU's exponentials are fp64; an fp64 exp here is a called
    // routine whose frame ptxas puts on the stack, which the build refuses).
    float max = -INFINITY;
    for (int v = threadIdx.x; v < V; v += THREADS) max = fmaxf(max, z[v]);
    max = block_max_over(max, float_slots, WARPS);
    double sum = 0.0;
    for (int v = threadIdx.x; v < V; v += THREADS) sum += (double)expf(z[v] - max);
    sum = block_sum_over(sum, double_slots, WARPS);
    // The scaled row's, where asked for (top-p from the candidates): sample_kernel's sums.
    float max_scaled = -INFINITY;
    double sum_scaled = 0.0;
    if (scaled_lse) { // (the same for the whole block: every thread takes the block sums)
        for (int v = threadIdx.x; v < V; v += THREADS) max_scaled = fmaxf(max_scaled, z[v] * inverse);
        max_scaled = block_max_over(max_scaled, float_slots, WARPS);
        for (int v = threadIdx.x; v < V; v += THREADS) sum_scaled += (double)expf(z[v] * inverse - max_scaled);
        sum_scaled = block_sum_over(sum_scaled, double_slots, WARPS);
    }

    // The smallest key that at least k of the row's scaled logits have or are under.
    uint32_t low = 0, high = 0xffffffffu;
    while (low < high) {
        const uint32_t middle = low + (high - low) / 2;
        int at_or_under = 0;
        for (int v = threadIdx.x; v < V; v += THREADS) at_or_under += sampling_descending_key(z[v] * inverse) <= middle;
        if (block_sum_over(at_or_under, int_slots, WARPS) >= k) high = middle;
        else low = middle + 1;
    }
    const uint32_t threshold = low;

    // Each thread's piece [first, last): its candidates go after those of the pieces before.
    const int piece = (V + THREADS - 1) / THREADS;
    const int first = (int)threadIdx.x * piece < V ? (int)threadIdx.x * piece : V;
    const int last = first + piece < V ? first + piece : V;
    int mine = 0;
    for (int v = first; v < last; v++) mine += sampling_descending_key(z[v] * inverse) <= threshold;
    thread_counts[threadIdx.x] = mine;
    __syncthreads();
    int before = 0, total = 0;
    for (int t = 0; t < THREADS; t++) {
        if (t < (int)threadIdx.x) before += thread_counts[t];
        total += thread_counts[t];
    }
    if (total <= capacity)
        for (int v = first, at = before; v < last; v++)
            if (sampling_descending_key(z[v] * inverse) <= threshold) {
                ids[row * capacity + at] = v;
                values[row * capacity + at] = z[v];
                at++;
            }
    if (threadIdx.x == 0) {
        counts[row] = total;
        lse[row] = max + log(sum);
        if (scaled_lse) scaled_lse[row] = max_scaled + log(sum_scaled);
    }
}

// ops.h sample_rows (sampling.cu): one block of THREADS per row. The raw and the scaled
// row's maxima; the raw row's fp32 exponentials summed in fp64 (its log-normaliser); then
// the walk in id order over the threads' contiguous pieces: each piece's mass (its scaled
// exponentials summed in id order), the masses summed in thread order by every thread alike
// (the total, the scaled row's normaliser, and on the way the bounds of each piece, which
// never fall), and the one piece whose bounds hold uniform times the total walks its tokens
// to the first whose running mass passes it (its last token where rounding keeps the walk
// short of it). Where rounding leaves the target at the total, thread 0 takes the last
// token, sampler_pick's rule. Nothing depends on the threads' timing. Shared memory:
// SAMPLE_SHARED_BYTES.
enum { SAMPLE_SHARED_BYTES = WARPS * sizeof(double) + (THREADS + 1) * sizeof(double) };

static __global__ void __launch_bounds__(THREADS)
    sample_kernel(int *tokens, float *logprobs, float *sampling_logprobs, const float *logits,
                  const float *inv_temperature, const double *uniform, int V) {
    DYNAMIC_SHARED(shared);
    double *double_slots = reinterpret_cast<double *>(shared);
    float *float_slots = reinterpret_cast<float *>(shared);
    double *bounds = reinterpret_cast<double *>(shared + WARPS * sizeof(double)); // [THREADS + 1]
    const long row = blockIdx.x;
    const int tid = (int)threadIdx.x;
    const float *z = logits + row * V;
    const float inverse = inv_temperature[row];
    float max_raw = -INFINITY, max_scaled = -INFINITY;
    for (int v = tid; v < V; v += THREADS) {
        max_raw = fmaxf(max_raw, z[v]);
        max_scaled = fmaxf(max_scaled, z[v] * inverse);
    }
    max_raw = block_max_over(max_raw, float_slots, WARPS);
    max_scaled = block_max_over(max_scaled, float_slots, WARPS);
    double sum_raw = 0.0;
    for (int v = tid; v < V; v += THREADS) sum_raw += (double)expf(z[v] - max_raw);
    sum_raw = block_sum_over(sum_raw, double_slots, WARPS);

    const int piece = (V + THREADS - 1) / THREADS;
    const int first = tid * piece < V ? tid * piece : V;
    const int last = first + piece < V ? first + piece : V;
    double mass = 0.0;
    for (int v = first; v < last; v++) mass += (double)expf(z[v] * inverse - max_scaled);
    bounds[tid + 1] = mass;
    __syncthreads();
    double before = 0.0, sum_scaled = 0.0; // the masses before this piece's, and all of them
    for (int t = 1; t <= THREADS; t++) {
        if (t == tid + 1) before = sum_scaled;
        sum_scaled += bounds[t];
    }
    const double after = before + mass; // the next step of the same sum
    const double target = uniform[row] * sum_scaled;
    int chosen = -1;
    if (before <= target && target < after) {
        double running = before;
        chosen = last - 1;
        for (int v = first; v < last; v++) {
            running += (double)expf(z[v] * inverse - max_scaled);
            if (target < running) {
                chosen = v;
                break;
            }
        }
    } else if (tid == 0 && !(target < sum_scaled)) {
        chosen = V - 1;
    }
    if (chosen >= 0) {
        tokens[row] = chosen;
        logprobs[row] = (float)(z[chosen] - (max_raw + log(sum_raw)));
        sampling_logprobs[row] = (float)(z[chosen] * inverse - (max_scaled + log(sum_scaled)));
    }
}

} // namespace sampling_rows
