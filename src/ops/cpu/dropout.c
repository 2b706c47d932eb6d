// The elementwise ops whose randomness is keyed rather than stored: inverted dropout (ops.h
// dropout_forward / dropout_backward) and uniform noise (uniform_noise_add, NEFTune's). Element
// i draws word i % 4 of Philox block i / 4 (core/philox.h), so the backward, a
// gradient-checkpointing recomputation and the CUDA kernels (ops/cuda/dropout.cu) all
// regenerate the same mask or noise from (seed, stream).
#include <stdint.h>

#include "core/philox.h"
#include "ops/cpu/ops_cpu.h"

typedef enum { KEYED_DROPOUT, KEYED_NOISE } KeyedOp;

// The loop over blocks of four elements, shared by the ops. Dropout: out[i] is inp[i] *
// factor where kept (the word reaches threshold) and 0 where dropped (accumulate: out[i] +=
// that). Noise: out[i] = inp[i] + philox_signed_24(word) * factor.
static void keyed_elementwise(KeyedOp op, float *out, const float *inp, long n, uint32_t threshold, float factor,
                              uint64_t seed, uint64_t stream, bool accumulate) {
    const long blocks = (n + 3) / 4;
#pragma omp parallel for schedule(static)
    for (long block = 0; block < blocks; block++) {
        const Philox4x32 words = philox4x32_block(seed, stream, (uint64_t)block);
        for (int lane = 0; lane < 4; lane++) {
            const long i = block * 4 + lane;
            if (i >= n) break;
            if (op == KEYED_NOISE) {
                out[i] = inp[i] + philox_signed_24(words.v[lane]) * factor;
                continue;
            }
            const float value = words.v[lane] >= threshold ? inp[i] * factor : 0.0f;
            out[i] = accumulate ? out[i] + value : value;
        }
    }
}

void cpu_dropout_forward(float *out, const float *inp, long n, float p, uint64_t seed, uint64_t stream) {
    keyed_elementwise(KEYED_DROPOUT, out, inp, n, dropout_threshold(p), 1.0f / (1.0f - p), seed, stream, false);
}

void cpu_dropout_backward(float *dinp, const float *dout, long n, float p, uint64_t seed, uint64_t stream) {
    keyed_elementwise(KEYED_DROPOUT, dinp, dout, n, dropout_threshold(p), 1.0f / (1.0f - p), seed, stream, true);
}

void cpu_uniform_noise_add(float *x, long n, float magnitude, uint64_t seed, uint64_t stream) {
    // magnitude / 2^23: one unit of philox_signed_24's integers
    keyed_elementwise(KEYED_NOISE, x, x, n, 0, magnitude * 0x1p-23f, seed, stream, false);
}
