// The decode-step product with a quantized weight (matvec.cuh): out[M, OC] = inp[M, IC] .
// W[OC, IC]^T (+ bias), read straight from the weight's blocks. The tiled path
// (matmul_quantized.cu) writes the whole weight as a bf16 tile and reads it back for
// cuBLASLt at every step; here the blocks are read once and nothing is written but the
// output, which is what a decode step of a memory-bound product should cost.
//
// A lane's 8 weights are dequantize.cuh's decode8 (the CPU's dequantized floats, bit for
// bit); a warp reads 32 consecutive groups at a time (256 bytes of Q8_0 codes, 128 of 4-bit
// ones) and the matching 1 KB of each input row. The inputs stay fp32 (no bf16 rounding,
// unlike the tiled path), so the result differs from the CPU's float product only in the
// order of the fp32 sums: tests/test_dequantize_emulated.cpp holds it to 1e-5 of
// sum |x| |w| per output.
#pragma once
#include "ops/cuda/dequantize.cuh"
#include "ops/cuda/matvec.cuh"

namespace matvec {

static_assert((int)GROUP == (int)dequantize::VALUES_PER_THREAD, "a lane decodes one group at a time");

// A kernel parameter itself (product reads it by reference): a copy of it in registers would
// go to local memory, its code book being indexed by the codes.
struct BlockWeights {
    dequantize::Weights w;
    DEVICE_METHOD void load(long at, float values[GROUP]) const { dequantize::decode8(w, at, values); }
};

// Input rows as floats, read one at a time (no alignment asked of them).
struct FloatRows {
    const float *x;
    DEVICE_METHOD void load(int, long at, float values[GROUP]) const {
        for (int i = 0; i < GROUP; i++) values[i] = x[at + i];
    }
};

// Grid: blocks_for(OC) blocks of THREADS. M <= MAX_ROWS, IC a multiple of 8.
static __global__ void __launch_bounds__(THREADS) kernel(float *out, const float *inp, BlockWeights w,
                                                         const float *bias, int M, int IC, int OC) {
    product(Output{out, OC}, w, FloatRows{inp}, bias, nullptr, M, IC, OC);
}

} // namespace matvec
