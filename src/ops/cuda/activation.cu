// GELU (tanh approximation) and the gated units SwiGLU / GeGLU; formulas as ops/cpu.
#include "ops/cuda/cuda_common.cuh"

#define GELU_SCALE 0.7978845608028654f // sqrt(2 / pi)
#define GELU_CUBIC 0.044715f

__device__ static inline float gelu(float x) {
    float inner = GELU_SCALE * (x + GELU_CUBIC * x * x * x);
    return 0.5f * x * (1.0f + tanhf(inner));
}

__device__ static inline float gelu_derivative(float x) {
    float inner = GELU_SCALE * (x + GELU_CUBIC * x * x * x);
    float t = tanhf(inner);
    float dinner = GELU_SCALE * (1.0f + 3.0f * GELU_CUBIC * x * x);
    return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * dinner;
}

__device__ static inline float silu(float x) { return x / (1.0f + expf(-x)); }

__device__ static inline float silu_derivative(float x) {
    float sig = 1.0f / (1.0f + expf(-x));
    return sig * (1.0f + x * (1.0f - sig));
}

__global__ static void gelu_forward_kernel(float *out, const float *inp, long n) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = gelu(inp[i]);
}

__global__ static void gelu_backward_kernel(float *dinp, const float *dout, const float *inp, long n) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dinp[i] += dout[i] * gelu_derivative(inp[i]);
}

__global__ static void glu_forward_kernel(float *out, const float *gate, const float *up, long n,
                                          bool use_gelu) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = (use_gelu ? gelu(gate[i]) : silu(gate[i])) * up[i];
}

__global__ static void glu_backward_kernel(float *dgate, float *dup, const float *dout,
                                           const float *gate, const float *up, long n,
                                           bool use_gelu) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float g = gate[i];
    float act = use_gelu ? gelu(g) : silu(g);
    float dact = use_gelu ? gelu_derivative(g) : silu_derivative(g);
    dgate[i] += dout[i] * up[i] * dact;
    dup[i] += dout[i] * act;
}

void cuda_gelu_forward(float *out, const float *inp, long n) {
    if (n == 0) return;
    gelu_forward_kernel<<<grid_for(n, 256), 256>>>(out, inp, n);
    CUDA_CHECK_LAUNCH();
}

void cuda_gelu_backward(float *dinp, const float *dout, const float *inp, long n) {
    if (n == 0) return;
    gelu_backward_kernel<<<grid_for(n, 256), 256>>>(dinp, dout, inp, n);
    CUDA_CHECK_LAUNCH();
}

void cuda_glu_forward(float *out, const float *gate, const float *up, long n, bool use_gelu) {
    if (n == 0) return;
    glu_forward_kernel<<<grid_for(n, 256), 256>>>(out, gate, up, n, use_gelu);
    CUDA_CHECK_LAUNCH();
}

void cuda_glu_backward(float *dgate, float *dup, const float *dout, const float *gate,
                       const float *up, long n, bool use_gelu) {
    if (n == 0) return;
    glu_backward_kernel<<<grid_for(n, 256), 256>>>(dgate, dup, dout, gate, up, n, use_gelu);
    CUDA_CHECK_LAUNCH();
}
