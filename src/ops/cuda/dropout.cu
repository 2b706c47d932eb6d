// Inverted dropout, the CPU backend's mask (ops/cpu/dropout.c): one thread per block of four
// elements draws the Philox block (core/philox.h, compiled for the device here) and keeps
// element i where word i % 4 reaches the threshold.
#include "core/philox.h"
#include "ops/cuda/cuda_common.cuh"

__global__ static void dropout_kernel(float *out, const float *inp, long n, uint32_t threshold, float keep_scale,
                                      uint64_t seed, uint64_t stream, bool accumulate) {
    const long block = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (block * 4 >= n) return;
    const Philox4x32 words = philox4x32_block(seed, stream, (uint64_t)block);
    for (int lane = 0; lane < 4; lane++) {
        const long i = block * 4 + lane;
        if (i >= n) break;
        // __fmul_rn: no fused multiply-add with the accumulation, so the kept value is the
        // CPU's product.
        const float value = words.v[lane] >= threshold ? __fmul_rn(inp[i], keep_scale) : 0.0f;
        out[i] = accumulate ? out[i] + value : value;
    }
}

static void launch(float *out, const float *inp, long n, float p, uint64_t seed, uint64_t stream, bool accumulate) {
    if (n == 0) return;
    const long blocks = (n + 3) / 4;
    dropout_kernel<<<grid_for(blocks, 256), 256>>>(out, inp, n, dropout_threshold(p), 1.0f / (1.0f - p), seed, stream,
                                                   accumulate);
    CUDA_CHECK_LAUNCH();
}

void cuda_dropout_forward(float *out, const float *inp, long n, float p, uint64_t seed, uint64_t stream) {
    launch(out, inp, n, p, seed, stream, false);
}

void cuda_dropout_backward(float *dinp, const float *dout, long n, float p, uint64_t seed, uint64_t stream) {
    launch(dinp, dout, n, p, seed, stream, true);
}
