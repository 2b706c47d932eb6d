// GELU (tanh approximation) and the gated units SwiGLU / GeGLU, formulas as ops/cpu, four
// elements a thread (device_primitives.cuh's Four): launched by activation.cu. Written once
// for nvcc and for the CPU emulation (cpu_emulation.h), which runs them in
// tests/test_activation_emulated.cpp against ops/cpu/activation.c.
#pragma once
#include <math.h>

#include "ops/cuda/activation_functions.cuh"
#include "ops/cuda/device_primitives.cuh"

namespace activation_kernels {

// An activation's input: its floats, or the bf16 values that a stored buffer holds in their
// place (hold_stored: the gate and up products' outputs, and the output gradient that down's
// input-gradient product writes, written as bf16 by the products).
struct Input {
    const float *floats;
    const bf16 *stored; // NULL: read the floats
    DEVICE_METHOD Four load(long first, long n, bool vector) const {
        return stored ? load_four_bf16(stored, first, n, vector) : load_four(floats, first, n, vector);
    }
};

// Each thread takes four consecutive elements (device_primitives.cuh's Four): every element's
// formula is the same on either path, so results do not depend on it. An output that is a
// held matmul input (matmul_input_hold) gets its bf16 copy written beside it (`*_copy`, NULL
// otherwise), which spares the next product a read of the whole output to convert it. A
// float output is NULL when the model stores it (hold_stored): only its copy is
// written.
static __global__ void gelu_forward_kernel(float *out, bf16 *out_copy, Input inp, long n, bool vector) {
    const long first = first_of_four();
    if (first >= n) return;
    Four x = inp.load(first, n, vector), y;
    for (int k = 0; k < 4; k++) y.x[k] = gelu(x.x[k]);
    store_four(out, first, n, vector, y);
    store_four_bf16(out_copy, first, n, vector, y);
}

// The backward kernels overwrite their outputs (the op contract in ops.h): the layer's
// backward needs no zero-filled buffers for them and they read nothing they write. When the
// forward's output is held (the down projection's weight gradient reads it next), they also
// write its copy (`act_copy`) from the activation they recompute anyway, the forward's
// formula on the same inputs: the weight gradient then reads no fp32 act to convert.
static __global__ void gelu_backward_kernel(float *dinp, bf16 *dinp_copy, bf16 *act_copy,
                                            Input dout, Input inp, long n, bool vector) {
    const long first = first_of_four();
    if (first >= n) return;
    Four x = inp.load(first, n, vector), dy = dout.load(first, n, vector), dx;
    for (int k = 0; k < 4; k++) dx.x[k] = dy.x[k] * gelu_derivative(x.x[k]);
    store_four(dinp, first, n, vector, dx);
    store_four_bf16(dinp_copy, first, n, vector, dx);
    if (act_copy) {
        Four y;
        for (int k = 0; k < 4; k++) y.x[k] = gelu(x.x[k]);
        store_four_bf16(act_copy, first, n, vector, y);
    }
}

static __global__ void glu_forward_kernel(float *out, bf16 *out_copy, Input gate, Input up, long n, bool use_gelu,
                                          bool vector) {
    const long first = first_of_four();
    if (first >= n) return;
    Four g = gate.load(first, n, vector), u = up.load(first, n, vector), y;
    for (int k = 0; k < 4; k++) y.x[k] = (use_gelu ? gelu(g.x[k]) : silu(g.x[k])) * u.x[k];
    store_four(out, first, n, vector, y);
    store_four_bf16(out_copy, first, n, vector, y);
}

static __global__ void glu_backward_kernel(float *dgate, float *dup, bf16 *dgate_copy,
                                           bf16 *dup_copy, bf16 *act_copy, Input dout,
                                           Input gate, Input up, long n, bool use_gelu, bool vector) {
    const long first = first_of_four();
    if (first >= n) return;
    Four g = gate.load(first, n, vector), u = up.load(first, n, vector);
    Four dy = dout.load(first, n, vector), dg, du, y;
    for (int k = 0; k < 4; k++) {
        float act = use_gelu ? gelu(g.x[k]) : silu(g.x[k]);
        float dact = use_gelu ? gelu_derivative(g.x[k]) : silu_derivative(g.x[k]);
        dg.x[k] = dy.x[k] * u.x[k] * dact;
        du.x[k] = dy.x[k] * act;
        y.x[k] = act * u.x[k];
    }
    store_four(dgate, first, n, vector, dg);
    store_four(dup, first, n, vector, du);
    store_four_bf16(dgate_copy, first, n, vector, dg);
    store_four_bf16(dup_copy, first, n, vector, du);
    store_four_bf16(act_copy, first, n, vector, y);
}

} // namespace activation_kernels
