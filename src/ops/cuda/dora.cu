// DoRA's elementwise parts on the GPU (ops.h dora_weight_norm / dora_forward /
// dora_backward), the CPU's arithmetic (ops/cpu/dora.c): a row's norm is one block's
// fixed-order sum in double, the magnitude gradient a fixed-order column reduction.
#include "ops/cuda/cuda_common.cuh"

__global__ static void weight_norm_kernel(float *norm, const float *weight, const float *delta, float scale,
                                          int cols) {
    const long row = blockIdx.x;
    const float *w = weight + row * cols, *d = delta + row * cols;
    double sum = 0;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
        const float v = w[c] + scale * d[c];
        sum += (double)v * v;
    }
    sum = block_sum(sum);
    if (threadIdx.x == 0) norm[row] = (float)sqrt(sum);
}

void cuda_dora_weight_norm(float *norm, const float *weight, const float *delta, float scale, int rows, int cols) {
    if (rows == 0) return;
    weight_norm_kernel<<<rows, 256>>>(norm, weight, delta, scale, cols);
    CUDA_CHECK_LAUNCH();
}

__global__ static void forward_kernel(float *out, float *z, const float *base, const float *bias,
                                      const float *magnitude, const float *norm, long n, int OC) {
    const long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const int o = (int)(i % OC);
    const float s = magnitude[o] / norm[o];
    const float b = base ? base[i] : out[i] - (bias ? bias[o] : 0.0f);
    const float lora = z[i];
    z[i] = b + lora;
    out[i] += (s - 1.0f) * b + s * lora;
}

void cuda_dora_forward(float *out, float *z, const float *base, const float *bias, const float *magnitude,
                       const float *norm, int N, int OC) {
    const long n = (long)N * OC;
    if (n == 0) return;
    forward_kernel<<<grid_for(n, 256), 256>>>(out, z, base, bias, magnitude, norm, n, OC);
    CUDA_CHECK_LAUNCH();
}

__global__ static void scaled_kernel(float *dscaled, const float *dout, const float *magnitude, const float *norm,
                                     float shift, long n, int OC) {
    const long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const int o = (int)(i % OC);
    dscaled[i] = (magnitude[o] / norm[o] + shift) * dout[i];
}

// One term of the magnitude's gradient: dout * z / norm, summed over rows by column_reduce.
struct DoraMagnitudeTerm {
    const float *dout, *z, *norm;
    int OC;
    __device__ float operator()(int i, int c) const {
        return dout[(long)i * OC + c] * z[(long)i * OC + c] / norm[c];
    }
};

void cuda_dora_backward(float *dmagnitude, float *dscaled, const float *dout, const float *z, const float *magnitude,
                        const float *norm, float shift, int N, int OC) {
    const long n = (long)N * OC;
    if (n == 0) return;
    scaled_kernel<<<grid_for(n, 256), 256>>>(dscaled, dout, magnitude, norm, shift, n, OC);
    CUDA_CHECK_LAUNCH();
    if (dmagnitude) column_reduce(dmagnitude, N, OC, DoraMagnitudeTerm{dout, z, norm, OC});
}
