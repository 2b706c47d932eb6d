// GELU (tanh approximation) and the gated units SwiGLU / GeGLU: the kernels of
// activation_kernels.cuh, each output's bf16 copy written when it is a held matmul input.
#include "ops/cuda/activation_kernels.cuh"
#include "ops/cuda/cuda_common.cuh"

using namespace activation_kernels;

// Four elements at a time need the floats 16-byte aligned and the bf16 ones (copies, stored
// values) 8-byte aligned (a scratch slot always is; a stored buffer is its own memory).
static bool bf16_by_four(const void *a, const void *b = NULL, const void *c = NULL, const void *d = NULL,
                         const void *e = NULL) {
    return all_aligned(8, a, b, c, d, e);
}

// An input's floats, or its bf16 values when it is stored (cuda_stored_values).
static Input input_of(const float *x, long n) { return Input{x, cuda_stored_values(x, n)}; }

// A stored output (hold_stored: out, dinp, dgate, dup) is written as its bf16 copy only
// (cuda_held_output turns the float pointer NULL), a stored `act` that its forward wrote is
// not rewritten (cuda_held_recomputed_copy), and a stored input (gate, up, inp, dout: the
// products' bf16 outputs) is read as bf16. An empty call still marks its held outputs
// written (cuda_held_output before the return), as a product does, so that their readers
// do not find them unwritten.
void cuda_gelu_forward(float *out, const float *inp, long n) {
    __nv_bfloat16 *out_copy = cuda_held_output(&out, n);
    if (n == 0) return;
    const Input x = input_of(inp, n);
    gelu_forward_kernel<<<grid_for_fours(n, 256), 256>>>(out, out_copy, x, n,
                                                         all_aligned16(out, inp) && bf16_by_four(out_copy, x.stored));
    CUDA_CHECK_LAUNCH();
}

void cuda_gelu_backward(float *dinp, const float *dout, const float *inp, const float *act, long n) {
    __nv_bfloat16 *dinp_copy = cuda_held_output(&dinp, n);
    if (n == 0) return;
    __nv_bfloat16 *act_copy = cuda_held_recomputed_copy(act, n);
    const Input x = input_of(inp, n), dy = input_of(dout, n);
    gelu_backward_kernel<<<grid_for_fours(n, 256), 256>>>(dinp, dinp_copy, act_copy, dy, x, n,
                                                          all_aligned16(dinp, dout, inp) &&
                                                              bf16_by_four(dinp_copy, act_copy, x.stored, dy.stored));
    CUDA_CHECK_LAUNCH();
}

void cuda_glu_forward(float *out, const float *gate, const float *up, long n, bool use_gelu) {
    __nv_bfloat16 *out_copy = cuda_held_output(&out, n);
    if (n == 0) return;
    const Input g = input_of(gate, n), u = input_of(up, n);
    glu_forward_kernel<<<grid_for_fours(n, 256), 256>>>(out, out_copy, g, u, n, use_gelu,
                                                        all_aligned16(out, gate, up) &&
                                                            bf16_by_four(out_copy, g.stored, u.stored));
    CUDA_CHECK_LAUNCH();
}

void cuda_glu_backward(float *dgate, float *dup, const float *dout, const float *gate,
                       const float *up, const float *act, long n, bool use_gelu) {
    __nv_bfloat16 *dgate_copy = cuda_held_output(&dgate, n), *dup_copy = cuda_held_output(&dup, n);
    if (n == 0) return;
    __nv_bfloat16 *act_copy = cuda_held_recomputed_copy(act, n);
    const Input g = input_of(gate, n), u = input_of(up, n), dy = input_of(dout, n);
    glu_backward_kernel<<<grid_for_fours(n, 256), 256>>>(dgate, dup, dgate_copy, dup_copy, act_copy, dy, g, u, n,
                                                         use_gelu,
                                                         all_aligned16(dgate, dup, dout, gate, up) &&
                                                             bf16_by_four(dgate_copy, dup_copy, act_copy, g.stored,
                                                                          u.stored) &&
                                                             bf16_by_four(dy.stored));
    CUDA_CHECK_LAUNCH();
}
