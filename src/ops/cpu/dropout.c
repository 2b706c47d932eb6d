// Inverted dropout (ops.h dropout_forward / dropout_backward). The mask is not stored:
// element i is kept when word i % 4 of Philox block i / 4 reaches the threshold
// (core/philox.h), so the backward, a gradient-checkpointing recomputation and the CUDA
// kernel all regenerate the same mask from (seed, stream).
#include <stdint.h>

#include "core/philox.h"
#include "ops/cpu/ops_cpu.h"

// The loop over blocks of four elements, shared by forward and backward: out[i] is
// inp[i] * keep_scale where kept and 0 where dropped (accumulate: out[i] += that).
static void masked_scale(float *out, const float *inp, long n, float p, uint64_t seed, uint64_t stream,
                         bool accumulate) {
    const uint32_t threshold = dropout_threshold(p);
    const float keep_scale = 1.0f / (1.0f - p);
    const long blocks = (n + 3) / 4;
#pragma omp parallel for schedule(static)
    for (long block = 0; block < blocks; block++) {
        const Philox4x32 words = philox4x32_block(seed, stream, (uint64_t)block);
        for (int lane = 0; lane < 4; lane++) {
            const long i = block * 4 + lane;
            if (i >= n) break;
            const float value = words.v[lane] >= threshold ? inp[i] * keep_scale : 0.0f;
            out[i] = accumulate ? out[i] + value : value;
        }
    }
}

void cpu_dropout_forward(float *out, const float *inp, long n, float p, uint64_t seed, uint64_t stream) {
    masked_scale(out, inp, n, p, seed, stream, false);
}

void cpu_dropout_backward(float *dinp, const float *dout, long n, float p, uint64_t seed, uint64_t stream) {
    masked_scale(dinp, dout, n, p, seed, stream, true);
}
