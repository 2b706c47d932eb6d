// fp32 -> bf16 conversion of matmul operands, and the second pass of column_reduce
// (cuda_common.cuh), which bias, norm-weight and value-head gradients use.
#include "ops/cuda/cuda_common.cuh"

__global__ static void to_bf16_kernel(__nv_bfloat16 *out, const float *in, long n) {
    long i = ((long)blockIdx.x * blockDim.x + threadIdx.x) * 4;
    if (i + 3 < n && ((reinterpret_cast<uintptr_t>(in) & 15) == 0)) {
        float4 x = *reinterpret_cast<const float4 *>(in + i);
        out[i] = __float2bfloat16(x.x);
        out[i + 1] = __float2bfloat16(x.y);
        out[i + 2] = __float2bfloat16(x.z);
        out[i + 3] = __float2bfloat16(x.w);
    } else {
        for (long j = i; j < i + 4 && j < n; j++) out[j] = __float2bfloat16(in[j]);
    }
}

void cuda_to_bf16(__nv_bfloat16 *out, const float *in, long n) {
    to_bf16_kernel<<<grid_for((n + 3) / 4, 256), 256>>>(out, in, n);
    CUDA_CHECK_LAUNCH();
}

__global__ static void to_bf16_rows_kernel(__nv_bfloat16 *out, long out_ld, const float *in,
                                           long in_ld, int rows, int width) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long)rows * width) return;
    long r = i / width, c = i % width;
    out[r * out_ld + c] = __float2bfloat16(in[r * in_ld + c]);
}

void cuda_to_bf16_rows(__nv_bfloat16 *out, long out_ld, const float *in, long in_ld, int rows,
                       int width) {
    to_bf16_rows_kernel<<<grid_for((long)rows * width, 256), 256>>>(out, out_ld, in, in_ld, rows,
                                                                     width);
    CUDA_CHECK_LAUNCH();
}

__global__ void column_total_kernel(float *out, const float *partial, int chunks, int C) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    float sum = 0.0f;
    for (int k = 0; k < chunks; k++) sum += partial[(long)k * C + c];
    out[c] += sum;
}
