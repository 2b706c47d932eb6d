// WMMA (nvcuda::wmma) on the CPU, for the wmma attention kernels (src/ops/cuda/attention_fused.cu)
// under the emulated CUDA runtime (tests/emulated_cuda/emulated_runtime.h).
//
// A fragment's layout across a warp's lanes is opaque in WMMA (a kernel may only load,
// store, fill and multiply whole fragments), so here every lane holds the whole 16x16
// matrix, row-major, and owns element e when e % 32 is its lane: a product takes each
// element of A and B from the lane that owns it, and a store writes each lane's own
// elements. So a lane that loaded stale values (a missing __syncwarp before a load of
// what other lanes wrote) spoils the elements it owns, as its share of the registers
// would on the GPU.
#pragma once
#include <type_traits>

#include "../emulated_runtime.h"

namespace nvcuda {
namespace wmma {

struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

template <typename Use, int M, int N, int K, typename T, typename Layout = void> struct fragment {
    static_assert(M == 16 && N == 16 && K == 16, "only the 16x16x16 shape is emulated");
    T x[256]; // [row][column] of the matrix this fragment holds: A is M x K, B is K x N, C is M x N
};

static inline float value_of(float x) { return x; }
static inline float value_of(bf16 x) { return bf16_to_float(x); }
static inline void set_value(float &to, float x) { to = x; }
static inline void set_value(bf16 &to, float x) { to = float_to_bf16(x); }

template <typename Use, typename T, typename Layout, typename Value>
static inline void fill_fragment(fragment<Use, 16, 16, 16, T, Layout> &f, Value value) {
    for (int i = 0; i < 256; i++) set_value(f.x[i], (float)value);
}

// A and B fragments: their memory layout is the fragment type's.
template <typename Use, typename T, typename Layout>
static inline void load_matrix_sync(fragment<Use, 16, 16, 16, T, Layout> &f, const T *p, unsigned ldm) {
    for (int r = 0; r < 16; r++)
        for (int c = 0; c < 16; c++)
            f.x[r * 16 + c] = std::is_same<Layout, col_major>::value ? p[(long)c * ldm + r] : p[(long)r * ldm + c];
}
// Accumulators: the memory layout is an argument.
static inline void load_matrix_sync(fragment<accumulator, 16, 16, 16, float> &f, const float *p, unsigned ldm,
                                    layout_t layout) {
    for (int r = 0; r < 16; r++)
        for (int c = 0; c < 16; c++) f.x[r * 16 + c] = layout == mem_col_major ? p[(long)c * ldm + r] : p[(long)r * ldm + c];
}
static inline void store_matrix_sync(float *p, const fragment<accumulator, 16, 16, 16, float> &f, unsigned ldm,
                                     layout_t layout) {
    for (int e = emulation::current->lane; e < 256; e += 32) {
        const int r = e / 16, c = e % 16;
        float &to = layout == mem_col_major ? p[(long)c * ldm + r] : p[(long)r * ldm + c];
        to = f.x[e];
    }
}
// d = a b + c, fp32 sums in k order (d may be c). A warp collective, as on the GPU: every
// lane posts its operands, and the first lane past the barrier multiplies, each element
// of A and B taken from the lane that owns it; the others read the product.
template <typename T, typename LayoutA, typename LayoutB>
static inline void mma_sync(fragment<accumulator, 16, 16, 16, float> &d,
                            const fragment<matrix_a, 16, 16, 16, T, LayoutA> &a,
                            const fragment<matrix_b, 16, 16, 16, T, LayoutB> &b,
                            const fragment<accumulator, 16, 16, 16, float> &c) {
    emulation::Thread *me = emulation::current;
    emulation::Warp *warp = me->warp;
    const int parity = emulation::next_parity(me);
    warp->fragments[parity][me->lane][0] = &a, warp->fragments[parity][me->lane][1] = &b;
    warp->barrier.wait();
    float *product = warp->product[parity];
    if (warp->made[parity] != warp->barrier.generation) {
        warp->made[parity] = warp->barrier.generation;
        typedef fragment<matrix_a, 16, 16, 16, T, LayoutA> A;
        typedef fragment<matrix_b, 16, 16, 16, T, LayoutB> B;
        float a_owned[256], b_owned[256];
        for (int e = 0; e < 256; e++) {
            a_owned[e] = value_of(((const A *)warp->fragments[parity][e % 32][0])->x[e]);
            b_owned[e] = value_of(((const B *)warp->fragments[parity][e % 32][1])->x[e]);
        }
        for (int m = 0; m < 16; m++)
            for (int n = 0; n < 16; n++) {
                float sum = 0.0f;
                for (int k = 0; k < 16; k++) sum += a_owned[m * 16 + k] * b_owned[k * 16 + n];
                product[m * 16 + n] = sum;
            }
    }
    for (int i = 0; i < 256; i++) d.x[i] = c.x[i] + product[i];
}

} // namespace wmma
} // namespace nvcuda
