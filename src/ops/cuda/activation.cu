// GELU (tanh approximation) and the gated units SwiGLU / GeGLU: the kernels of
// activation_kernels.cuh, each output's bf16 copy written when it is a held matmul input.
#include "ops/cuda/activation_kernels.cuh"
#include "ops/cuda/cuda_common.cuh"

using namespace activation_kernels;

void cuda_gelu_forward(float *out, const float *inp, long n) {
    if (n == 0) return;
    gelu_forward_kernel<<<grid_for_fours(n, 256), 256>>>(out, cuda_held_copy_to_write(out, n), inp, n,
                                                         all_aligned16(out, inp, NULL));
    CUDA_CHECK_LAUNCH();
}

void cuda_gelu_backward(float *dinp, const float *dout, const float *inp, const float *act, long n) {
    if (n == 0) return;
    gelu_backward_kernel<<<grid_for_fours(n, 256), 256>>>(dinp, cuda_held_copy_to_write(dinp, n),
                                                          cuda_held_copy_to_write(act, n), dout, inp, n,
                                                          all_aligned16(dinp, dout, inp));
    CUDA_CHECK_LAUNCH();
}

void cuda_glu_forward(float *out, const float *gate, const float *up, long n, bool use_gelu) {
    if (n == 0) return;
    glu_forward_kernel<<<grid_for_fours(n, 256), 256>>>(out, cuda_held_copy_to_write(out, n), gate, up, n, use_gelu,
                                                        all_aligned16(out, gate, up));
    CUDA_CHECK_LAUNCH();
}

void cuda_glu_backward(float *dgate, float *dup, const float *dout, const float *gate,
                       const float *up, const float *act, long n, bool use_gelu) {
    if (n == 0) return;
    glu_backward_kernel<<<grid_for_fours(n, 256), 256>>>(dgate, dup, cuda_held_copy_to_write(dgate, n),
                                                         cuda_held_copy_to_write(dup, n),
                                                         cuda_held_copy_to_write(act, n), dout, gate, up, n, use_gelu,
                                                         all_aligned16(dgate, dup, dout, gate, up));
    CUDA_CHECK_LAUNCH();
}
