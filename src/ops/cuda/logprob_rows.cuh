// The log-probability kernels over rows of logits (logprob.cu): one block of THREADS threads
// per row, the logits read once in the forward (log-sum-exp, the target's log-prob, the
// argmax and the entropy in one pass) and the backward written over them. Written once for
// nvcc and for the CPU emulation (cpu_emulation.h), which runs them in
// tests/test_logprob_emulated.cpp against ops/cpu/logprob.c.
//
// The exponentials are fp32 (expf: ~2 ulp) and every sum fp64. The CPU's exponentials are
// fp64; the row's results differ from its in the 7th digit, not more (the test's bound). An
// fp64 exp per logit was most of these kernels' time on an H200 (the 1B step's forward at
// 1.9 TB/s over two passes, 2026-12-04).
#pragma once
#include <math.h>

#include "ops/cuda/device_primitives.cuh"

namespace logprob_rows {

enum { THREADS = 512, WARPS = THREADS / 32 };

// What a thread keeps of the logits it reads: the largest and its first index, and relative
// to that maximum sum_v e^(z_v - max) and sum_v e^(z_v - max) z_v (the entropy's), rescaled
// when the maximum grows.
struct RowState {
    float max;
    int argmax;
    double sum, weighted;
};

DEVICE_INLINE void row_state_add(RowState &s, float z, int v, bool with_entropy) {
    if (z > s.max) {
        // every earlier term times e^(old max - z) < 1; with none yet there is nothing to scale
        const double rescale = s.max == -INFINITY ? 0.0 : (double)expf(s.max - z);
        s.sum = s.sum * rescale + 1.0;
        if (with_entropy) s.weighted = s.weighted * rescale + (double)z;
        s.max = z, s.argmax = v;
    } else {
        // -inf: e^-inf = 0 (-inf - -inf would be NaN), its term of the entropy's sum 0 * -inf,
        // NaN, as on the CPU; a NaN logit goes on into both sums
        const float e = z == -INFINITY ? 0.0f : expf(z - s.max);
        s.sum += e;
        if (with_entropy) s.weighted += (double)e * z;
    }
}

// The states of every thread of the block combined in a fixed order; every thread gets the
// row's. `shared`: SHARED_BYTES of the block's dynamic shared memory, each warp's maximum and
// its index, then each warp's sum (block_sum_fixed).
struct WarpSlot {
    float max;
    int argmax;
};
enum { SHARED_BYTES = WARPS * sizeof(double) };
static_assert(sizeof(WarpSlot) <= sizeof(double), "a warp's maximum and index fit in its sum's slot");

DEVICE_INLINE void take_larger(float &max, int &argmax, float other_max, int other_argmax) {
    if (other_max > max || (other_max == max && other_argmax < argmax)) max = other_max, argmax = other_argmax;
}

DEVICE_INLINE RowState combine_row(RowState s, unsigned char *shared, bool with_entropy) {
    WarpSlot *slots = reinterpret_cast<WarpSlot *>(shared);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    // The row's maximum, first index among equals (the CPU's argmax).
    float max = s.max;
    int argmax = s.argmax;
    for (int offset = 16; offset > 0; offset >>= 1)
        take_larger(max, argmax, __shfl_xor_sync(0xffffffffu, max, offset),
                    __shfl_xor_sync(0xffffffffu, argmax, offset));
    if (lane == 0) slots[warp].max = max, slots[warp].argmax = argmax;
    __syncthreads();
    max = slots[0].max, argmax = slots[0].argmax;
    for (int w = 1; w < WARPS; w++) take_larger(max, argmax, slots[w].max, slots[w].argmax);
    // Each thread's sums moved to that maximum, then added: lanes, then warps in order (the
    // block sum's first barrier keeps the maxima' slots until every thread has read them).
    const double scale = s.max == -INFINITY ? 0.0 : exp((double)s.max - (double)max);
    double *sums = reinterpret_cast<double *>(shared);
    RowState row = {max, argmax, block_sum_fixed<THREADS>(s.sum * scale, sums), 0.0};
    if (with_entropy) row.weighted = block_sum_fixed<THREADS>(s.weighted * scale, sums);
    return row;
}

// For each row: lse, logp (z[target] - lse, 0 without a target), top1 and entropy (each
// optional), as ops.h's logprob_forward. `vector`: V % 4 == 0 and the logits 16-byte
// aligned, read four at a time.
static __global__ void __launch_bounds__(THREADS)
    forward_kernel(float *logp, float *lse, int *top1, float *entropy, const float *logits, const int *targets, int V,
                   bool vector) {
    DYNAMIC_SHARED(shared);
    const long row = blockIdx.x;
    const float *z = logits + row * V;
    const bool with_entropy = entropy != nullptr;
    RowState s = {-INFINITY, V, 0.0, 0.0};
    if (vector) {
        for (int c = threadIdx.x; c < V / 4; c += THREADS) {
            float four[4];
            load_float4(four, z + 4 * c);
            for (int j = 0; j < 4; j++) row_state_add(s, four[j], 4 * c + j, with_entropy);
        }
    } else {
        for (int v = threadIdx.x; v < V; v += THREADS) row_state_add(s, z[v], v, with_entropy);
    }
    const RowState whole = combine_row(s, shared, with_entropy);
    if (threadIdx.x != 0) return;
    const double row_lse = whole.max + log(whole.sum);
    lse[row] = (float)row_lse;
    if (top1) top1[row] = whole.argmax; // before targets[row] is read: targets may be top1 (ops.h)
    if (logp) {
        const int target = targets ? targets[row] : -1;
        logp[row] = target >= 0 ? (float)(z[target] - row_lse) : 0.0f;
    }
    if (entropy) entropy[row] = (float)(row_lse - whole.weighted / whole.sum); // H = lse - E_p[z]
}

// d logp / d z = [v == target] - p;  d H / d z = -p (z - lse + H); under a soft cap
// z = cap tanh(r / cap), times dz / dr = 1 - (z / cap)^2 (ops/cpu/logprob.c).
DEVICE_INLINE float logit_gradient(float z, int v, int target, float g_logp, float g_entropy, double row_lse,
                                   double row_entropy, float softcap) {
    const float p = expf((float)((double)z - row_lse));
    float grad = -g_logp * p;
    if (g_entropy != 0.0f) grad -= g_entropy * p * (float)((double)z - row_lse + row_entropy);
    if (v == target) grad += g_logp;
    if (softcap > 0.0f) {
        const float capped = z / softcap;
        grad *= 1.0f - capped * capped;
    }
    return grad;
}

// Writes each row's logits over with their gradient, as ops.h's logprob_backward, and the
// gradient rounded to bf16 into `copy` (the LM head's held output gradient, matmul_input_hold;
// nothing when NULL). A thread writes only the logits it read itself.
static __global__ void __launch_bounds__(THREADS)
    backward_kernel(float *z_to_dz, bf16 *copy, const float *dlogp, const float *dentropy, const int *targets,
                    const float *lse, int V, float softcap, bool vector) {
    DYNAMIC_SHARED(shared);
    const long row = blockIdx.x;
    float *z = z_to_dz + row * V;
    bf16 *row_copy = copy ? copy + row * V : nullptr;
    const int target = targets ? targets[row] : -1;
    const float g_logp = dlogp && target >= 0 ? dlogp[row] : 0.0f;
    const float g_entropy = dentropy ? dentropy[row] : 0.0f;
    const double row_lse = lse[row];
    double row_entropy = 0.0;
    if (g_entropy != 0.0f) { // H = lse - E_p[z], from this row's logits
        double expected = 0.0;
        for (int v = threadIdx.x; v < V; v += THREADS) expected += (double)expf((float)((double)z[v] - row_lse)) * z[v];
        row_entropy = row_lse - block_sum_fixed<THREADS>(expected, reinterpret_cast<double *>(shared));
    }
    if (vector) {
        for (int c = threadIdx.x; c < V / 4; c += THREADS) {
            float four[4];
            load_float4(four, z + 4 * c);
            for (int j = 0; j < 4; j++)
                four[j] = logit_gradient(four[j], 4 * c + j, target, g_logp, g_entropy, row_lse, row_entropy, softcap);
            store_float4(z + 4 * c, four);
            if (row_copy) store_bf16x4(row_copy + 4 * c, four); // 8-byte aligned: V is a multiple of 4
        }
    } else {
        for (int v = threadIdx.x; v < V; v += THREADS) {
            const float grad = logit_gradient(z[v], v, target, g_logp, g_entropy, row_lse, row_entropy, softcap);
            z[v] = grad;
            if (row_copy) row_copy[v] = to_bf16(grad);
        }
    }
}

} // namespace logprob_rows
