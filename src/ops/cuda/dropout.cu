// The keyed elementwise ops, the CPU backend's (ops/cpu/dropout.c): inverted dropout and
// uniform noise. One thread per block of four elements draws the Philox block (core/philox.h,
// compiled for the device here); dropout keeps element i where word i % 4 reaches the
// threshold, the noise adds philox_signed_24(word) times its step.
#include "core/philox.h"
#include "ops/cuda/cuda_common.cuh"

enum KeyedOp { KEYED_DROPOUT, KEYED_NOISE };

__global__ static void keyed_kernel(KeyedOp op, float *out, const float *inp, long n, uint32_t threshold, float factor,
                                    uint64_t seed, uint64_t stream, bool accumulate) {
    const long block = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (block * 4 >= n) return;
    const Philox4x32 words = philox4x32_block(seed, stream, (uint64_t)block);
    for (int lane = 0; lane < 4; lane++) {
        const long i = block * 4 + lane;
        if (i >= n) break;
        // __fmul_rn / __fadd_rn: no fused multiply-add, so each value is rounded as the CPU
        // rounds it (the product, then the sum).
        if (op == KEYED_NOISE) {
            out[i] = __fadd_rn(inp[i], __fmul_rn(philox_signed_24(words.v[lane]), factor));
            continue;
        }
        const float value = words.v[lane] >= threshold ? __fmul_rn(inp[i], factor) : 0.0f;
        out[i] = accumulate ? out[i] + value : value;
    }
}

static void launch(KeyedOp op, float *out, const float *inp, long n, uint32_t threshold, float factor, uint64_t seed,
                   uint64_t stream, bool accumulate) {
    if (n == 0) return;
    const long blocks = (n + 3) / 4;
    keyed_kernel<<<grid_for(blocks, 256), 256>>>(op, out, inp, n, threshold, factor, seed, stream, accumulate);
    CUDA_CHECK_LAUNCH();
}

void cuda_dropout_forward(float *out, const float *inp, long n, float p, uint64_t seed, uint64_t stream) {
    launch(KEYED_DROPOUT, out, inp, n, dropout_threshold(p), 1.0f / (1.0f - p), seed, stream, false);
}

void cuda_dropout_backward(float *dinp, const float *dout, long n, float p, uint64_t seed, uint64_t stream) {
    launch(KEYED_DROPOUT, dinp, dout, n, dropout_threshold(p), 1.0f / (1.0f - p), seed, stream, true);
}

void cuda_uniform_noise_add(float *x, long n, float magnitude, uint64_t seed, uint64_t stream) {
    launch(KEYED_NOISE, x, x, n, 0, magnitude * 0x1p-23f, seed, stream, false);
}
