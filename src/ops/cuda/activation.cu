// GELU (tanh approximation) and the gated units SwiGLU / GeGLU: the kernels of
// activation_kernels.cuh, each output's bf16 copy written when it is a held matmul input.
#include "ops/cuda/activation_kernels.cuh"
#include "ops/cuda/cuda_common.cuh"

using namespace activation_kernels;

// Four elements at a time need the floats 16-byte aligned and the copies 8-byte aligned (a
// scratch slot always is; a stored copy is its buffer's own memory).
static bool copies_by_four(const void *a, const void *b = NULL, const void *c = NULL) {
    return (uintptr_t)a % 8 == 0 && (uintptr_t)b % 8 == 0 && (uintptr_t)c % 8 == 0;
}

// A stored output (matmul_input_store: out, dinp, dgate, dup) is written as its bf16 copy
// only (cuda_held_output turns the float pointer NULL), and a stored `act` that its forward
// wrote is not rewritten (cuda_held_recomputed_copy).
void cuda_gelu_forward(float *out, const float *inp, long n) {
    if (n == 0) return;
    __nv_bfloat16 *out_copy = cuda_held_output(&out, n);
    gelu_forward_kernel<<<grid_for_fours(n, 256), 256>>>(out, out_copy, inp, n,
                                                         all_aligned16(out, inp) && copies_by_four(out_copy));
    CUDA_CHECK_LAUNCH();
}

void cuda_gelu_backward(float *dinp, const float *dout, const float *inp, const float *act, long n) {
    if (n == 0) return;
    __nv_bfloat16 *dinp_copy = cuda_held_output(&dinp, n);
    __nv_bfloat16 *act_copy = cuda_held_recomputed_copy(act, n);
    gelu_backward_kernel<<<grid_for_fours(n, 256), 256>>>(dinp, dinp_copy, act_copy, dout, inp, n,
                                                          all_aligned16(dinp, dout, inp) &&
                                                              copies_by_four(dinp_copy, act_copy));
    CUDA_CHECK_LAUNCH();
}

void cuda_glu_forward(float *out, const float *gate, const float *up, long n, bool use_gelu) {
    if (n == 0) return;
    __nv_bfloat16 *out_copy = cuda_held_output(&out, n);
    glu_forward_kernel<<<grid_for_fours(n, 256), 256>>>(out, out_copy, gate, up, n, use_gelu,
                                                        all_aligned16(out, gate, up) && copies_by_four(out_copy));
    CUDA_CHECK_LAUNCH();
}

void cuda_glu_backward(float *dgate, float *dup, const float *dout, const float *gate,
                       const float *up, const float *act, long n, bool use_gelu) {
    if (n == 0) return;
    __nv_bfloat16 *dgate_copy = cuda_held_output(&dgate, n), *dup_copy = cuda_held_output(&dup, n);
    __nv_bfloat16 *act_copy = cuda_held_recomputed_copy(act, n);
    glu_backward_kernel<<<grid_for_fours(n, 256), 256>>>(dgate, dup, dgate_copy, dup_copy, act_copy, dout, gate, up, n,
                                                         use_gelu,
                                                         all_aligned16(dgate, dup, dout, gate, up) &&
                                                             copies_by_four(dgate_copy, dup_copy, act_copy));
    CUDA_CHECK_LAUNCH();
}
