// The warp-level building blocks of the mma attention kernels (attention_mma.cuh): bf16
// packing, the m16n8k16 tensor-core product, ldmatrix and cp.async; the separately rounded
// float products and sums and the float-from-bits of the dequantization kernels
// (dequantize.cuh); the half widening and integer rounding of the cached attention
// (attention_cached.cuh); the 16-byte float loads and stores, the fixed-order block sum and
// the four-a-thread elementwise helpers of the row and elementwise kernels the emulation
// also runs (logprob_rows.cuh, norm_rows.cuh, rope_rows.cuh, activation_kernels.cuh).
//
// Compiled two ways. Under nvcc each is one PTX instruction. Under a host C++ compiler
// (tests/test_attention_emulated.cpp) they come from cpu_emulation.h, which runs a
// kernel's blocks on CPU threads with the same per-lane register layouts, so the kernels'
// indexing, masking and softmax are tested in CI on machines without a GPU. The layouts
// below are the PTX ISA's ("Matrix Fragments for mma.m16n8k16"); g = lane / 4 (the
// group) and t = lane % 4 (the thread in the group):
//   A (16 x 16, row-major), 4 registers of 2 bf16:  a[0] = A[g][2t..2t+1],
//     a[1] = A[g+8][2t..], a[2] = A[g][2t+8..], a[3] = A[g+8][2t+8..]
//   B (16 x 8, k x n), 2 registers:  b[0] = {B[2t][g], B[2t+1][g]},
//     b[1] = {B[2t+8][g], B[2t+9][g]}
//   C, D (16 x 8, fp32), 4 floats:   c[0..1] = C[g][2t..2t+1], c[2..3] = C[g+8][2t..]
// The lower-numbered element of a pair sits in the register's low 16 bits.
#pragma once
#include <stdint.h>

#ifdef __CUDACC__
#include <cuda_bf16.h>
#include <cuda_fp16.h>

typedef __nv_bfloat16 bf16;
#define DEVICE_INLINE __device__ __forceinline__
// The same for a member function (a struct that a kernel reads its operands through).
#define DEVICE_METHOD __device__ __forceinline__
// For the small index helpers that both a kernel and its launcher call.
#define HOST_DEVICE_INLINE __host__ __device__ __forceinline__
// Unrolls the loop that follows all the way (a compile-time trip count), for a loop whose
// body nvcc would not unroll by itself: a register array indexed by a counter that stays a
// variable is put in local memory.
#define UNROLL _Pragma("unroll")
// Keeps the loop that follows a loop (nvcc unrolls small constant trip counts by itself),
// for a loop whose unrolled copies would each hold their own addresses in registers.
#define KEEP_LOOP _Pragma("unroll 1")
// The block's dynamic shared memory as bytes.
#define DYNAMIC_SHARED(name) extern __shared__ __align__(128) unsigned char name[]
// A fixed-size shared array of the block. Kernels write this, not `__shared__` itself,
// which the emulated build refuses: there each such array is one buffer refilled with
// poison before every block (cpu_emulation.h), where a plain static would keep the
// previous block's values.
#define STATIC_SHARED(type, name, count) __shared__ type name[count]

DEVICE_INLINE uint32_t pack_bf16x2(float low, float high) {
    __nv_bfloat162 pair = __floats2bfloat162_rn(low, high);
    return *reinterpret_cast<uint32_t *>(&pair);
}

// a * b and a + b, each rounded on its own: nvcc contracts a product followed by a sum into
// one FMA (one rounding), which changes last bits against the CPU (dequantize.cuh).
DEVICE_INLINE bf16 to_bf16(float x) { return __float2bfloat16(x); }
DEVICE_INLINE float from_bf16(bf16 x) { return __bfloat162float(x); }
DEVICE_INLINE float mul_rn(float a, float b) { return __fmul_rn(a, b); }
DEVICE_INLINE float add_rn(float a, float b) { return __fadd_rn(a, b); }

// The float whose IEEE bits are `bits` (the K-quants' half-float scales, dequantize.cuh).
DEVICE_INLINE float float_from_bits(uint32_t bits) { return __uint_as_float(bits); }
// An IEEE half (its 16 bits) as a float, exactly (a half cache's element, attention_cached.cuh).
DEVICE_INLINE float half_to_float(uint16_t bits) { return __half2float(__ushort_as_half(bits)); }
// x as an IEEE half's 16 bits, rounded to nearest even (a half cache's write, attention_cached.cuh).
DEVICE_INLINE uint16_t float_to_half_bits(float x) { return __half_as_ushort(__float2half_rn(x)); }
// x rounded to the nearest integer, ties to even (rintf; the 8-bit KV cache's codes).
DEVICE_INLINE int round_to_int(float x) { return __float2int_rn(x); }

// 2^x by the special-function unit (ex2.approx.ftz: one MUFU.EX2), a result below the
// smallest normal float flushed to 0, 2^-inf = 0. exp2f without --use_fast_math adds a
// compare and two conditional multiplies around the same instruction to keep subnormal
// results, 3 more instructions per element of the softmax, whose results that small
// (probabilities under 1e-38 of the row's largest) change nothing.
DEVICE_INLINE float exp2_approx(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

// Two adjacent bf16 (4-byte aligned) as one register.
DEVICE_INLINE uint32_t load_u32(const bf16 *p) { return *reinterpret_cast<const uint32_t *>(p); }
// Four floats at a 16-byte aligned address in one access.
DEVICE_INLINE void load_float4(float r[4], const float *p) {
    const float4 q = *reinterpret_cast<const float4 *>(p);
    r[0] = q.x, r[1] = q.y, r[2] = q.z, r[3] = q.w;
}
DEVICE_INLINE void store_float4(float *p, const float r[4]) {
    *reinterpret_cast<float4 *>(p) = make_float4(r[0], r[1], r[2], r[3]);
}
// Eight bf16 at a 16-byte aligned address in one access, as floats (exactly).
DEVICE_INLINE void load_bf16x8(float r[8], const bf16 *p) {
    const uint4 q = *reinterpret_cast<const uint4 *>(p);
    const uint32_t words[4] = {q.x, q.y, q.z, q.w};
    for (int i = 0; i < 4; i++) {
        r[2 * i] = __uint_as_float(words[i] << 16);
        r[2 * i + 1] = __uint_as_float(words[i] & 0xffff0000u);
    }
}
// Four floats rounded to bf16 (as pack_bf16x2) at an 8-byte aligned address, one access.
DEVICE_INLINE void store_bf16x4(bf16 *p, const float r[4]) {
    *reinterpret_cast<uint2 *>(p) = make_uint2(pack_bf16x2(r[0], r[1]), pack_bf16x2(r[2], r[3]));
}
DEVICE_INLINE void store_u32(bf16 *p, uint32_t value) { *reinterpret_cast<uint32_t *>(p) = value; }
// Eight floats rounded to bf16 (as pack_bf16x2) at a 16-byte aligned address, one access.
DEVICE_INLINE void store_bf16x8(bf16 *p, const float r[8]) {
    *reinterpret_cast<uint4 *>(p) = make_uint4(pack_bf16x2(r[0], r[1]), pack_bf16x2(r[2], r[3]),
                                               pack_bf16x2(r[4], r[5]), pack_bf16x2(r[6], r[7]));
}

// d = a b + d on the tensor cores, bf16 inputs, fp32 accumulators.
DEVICE_INLINE void mma_bf16_16x8x16(float d[4], const uint32_t a[4], const uint32_t b[2]) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                 "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// The ldmatrix.x4 that both loads below issue, `layout` "" or ".trans" (an instruction's
// text has to be a string literal, hence a macro and not a parameter).
#define LDMATRIX_X4(layout, r, row)                                                                          \
    asm volatile("ldmatrix.sync.aligned.m8n8.x4" layout ".shared.b16 {%0, %1, %2, %3}, [%4];\n"           \
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])                                            \
                 : "r"((unsigned)__cvta_generic_to_shared(row))                                              \
                 : "memory")

// Four 8x8 bf16 matrices from shared memory, as stored: lane i gives the address of row
// i % 8 of matrix i / 8 (16 bytes, 16-byte aligned); register j of lane l receives
// {M_j[l/4][2(l%4)], M_j[l/4][2(l%4)+1]}. That is an A fragment's register when M_j is
// one of its 8x8 quarters, and a B fragment's (of B = M^T) when the rows are B's columns.
DEVICE_INLINE void ldmatrix_x4(uint32_t r[4], const bf16 *row) { LDMATRIX_X4("", r, row); }

// Four 8x8 bf16 matrices from shared memory, each transposed: lane i gives the address of
// row i % 8 of matrix i / 8 (16 bytes, 16-byte aligned); register j of lane l receives
// {M_j[2(l%4)][l/4], M_j[2(l%4)+1][l/4]}.
DEVICE_INLINE void ldmatrix_x4_trans(uint32_t r[4], const bf16 *row) { LDMATRIX_X4(".trans", r, row); }
#undef LDMATRIX_X4

// 16 bytes global -> shared without passing through registers; when !valid the 16
// shared bytes are zero-filled and nothing is read. Complete at cp_async_wait.
DEVICE_INLINE void cp_async_16(void *shared_dst, const void *global_src, bool valid) {
    unsigned address = (unsigned)__cvta_generic_to_shared(shared_dst);
    int source_bytes = valid ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(address), "l"(global_src),
                 "r"(source_bytes)
                 : "memory");
}
// The same for 4 bytes (4-byte aligned addresses), through L1 (.ca: the only caching a copy
// of under 16 bytes may take).
DEVICE_INLINE void cp_async_4(void *shared_dst, const void *global_src, bool valid) {
    unsigned address = (unsigned)__cvta_generic_to_shared(shared_dst);
    int source_bytes = valid ? 4 : 0;
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(address), "l"(global_src), "r"(source_bytes)
                 : "memory");
}
DEVICE_INLINE void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
// Waits until at most `pending` committed groups of this thread are still in flight.
template <int pending> DEVICE_INLINE void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(pending) : "memory");
}

#else
#include "ops/cuda/cpu_emulation.h"
#endif

// A warp's sum (or largest) of one value per lane by butterfly shuffles, in a fixed order;
// every lane gets it, and every lane must call it. Under the CPU emulation the same five
// rounds at one barrier (emulation::warp_butterfly: the same bits, fewer fiber switches).
#ifdef __CUDACC__
template <typename Real> DEVICE_INLINE Real warp_sum(Real value) {
    for (int offset = 16; offset > 0; offset >>= 1) value += __shfl_xor_sync(0xffffffffu, value, offset);
    return value;
}
DEVICE_INLINE float warp_max(float value) {
    for (int offset = 16; offset > 0; offset >>= 1) value = fmaxf(value, __shfl_xor_sync(0xffffffffu, value, offset));
    return value;
}
#else
template <typename Real> DEVICE_INLINE Real warp_sum(Real value) {
    return emulation::warp_butterfly(value, [](Real mine, Real other) { return mine + other; });
}
DEVICE_INLINE float warp_max(float value) {
    return emulation::warp_butterfly(value, [](float mine, float other) { return fmaxf(mine, other); });
}
#endif

// A block-wide sum of one value per thread over the block's `warps` warps, in a fixed order:
// the lanes by butterfly shuffles, then the warps' sums in warp order. Every thread gets it.
// `slots`: `warps` values of shared memory, which a barrier guards against the previous
// call's readers. cuda_common.cuh's block_sum is this over static shared memory; the row
// kernels the CPU emulation also runs take it with dynamic shared memory (block_sum_fixed).
template <typename Real> DEVICE_INLINE Real block_sum_over(Real value, Real *slots, int warps) {
    value = warp_sum(value);
    __syncthreads();
    if (threadIdx.x % 32 == 0) slots[threadIdx.x / 32] = value;
    __syncthreads();
    Real total = 0;
    for (int w = 0; w < warps; w++) total += slots[w];
    return total;
}

// The block-wide largest value in the same way (slots: `warps` floats).
DEVICE_INLINE float block_max_over(float value, float *slots, int warps) {
    value = warp_max(value);
    __syncthreads();
    if (threadIdx.x % 32 == 0) slots[threadIdx.x / 32] = value;
    __syncthreads();
    float largest = slots[0];
    for (int w = 1; w < warps; w++) largest = fmaxf(largest, slots[w]);
    return largest;
}

// The same for a block of THREADS threads, in fp64 (norm_rows.cuh, logprob_rows.cuh,
// optimizer_kernels.cuh).
template <int THREADS> DEVICE_INLINE double block_sum_fixed(double value, double *slots) {
    return block_sum_over(value, slots, THREADS / 32);
}

// Elementwise kernels over float buffers take four consecutive elements a thread, read and
// written as one float4 when `vector` (every pointer 16-byte aligned: activations and the
// parameter buffer always are) and one by one otherwise or at a buffer's tail. The H200
// moves 128-bit accesses at close to its memory bandwidth, 32-bit ones at about half.
struct Four {
    float x[4];
};

DEVICE_INLINE Four load_four(const float *p, long first, long n, bool vector) {
    Four f;
    if (vector && first + 4 <= n) {
        load_float4(f.x, p + first);
    } else {
        for (int k = 0; k < 4; k++) f.x[k] = first + k < n ? p[first + k] : 0.0f;
    }
    return f;
}

// Nothing when p is NULL: an output kept only as its bf16 values (a stored buffer, hold_stored).
// Four bf16 widened to floats (exactly): two 32-bit loads when `vector` (p 4-byte aligned:
// a stored buffer, hold_stored, is 16-byte aligned and `first` a multiple of 4).
DEVICE_INLINE Four load_four_bf16(const bf16 *p, long first, long n, bool vector) {
    Four f;
    if (vector && first + 4 <= n) {
        const uint32_t low = load_u32(p + first), high = load_u32(p + first + 2);
        f.x[0] = float_from_bits(low << 16), f.x[1] = float_from_bits(low & 0xffff0000u);
        f.x[2] = float_from_bits(high << 16), f.x[3] = float_from_bits(high & 0xffff0000u);
    } else {
        for (int k = 0; k < 4; k++) f.x[k] = first + k < n ? from_bf16(p[first + k]) : 0.0f;
    }
    return f;
}

DEVICE_INLINE void store_four(float *p, long first, long n, bool vector, const Four &f) {
    if (!p) return;
    if (vector && first + 4 <= n) {
        store_float4(p + first, f.x);
    } else {
        for (int k = 0; k < 4 && first + k < n; k++) p[first + k] = f.x[k];
    }
}

// The same four elements as bf16 into `copy` (a held matmul input's copy; nothing when NULL),
// rounded as cuda_to_bf16 rounds: one 8-byte store when `vector` (copy 8-byte aligned: a
// scratch buffer is, and `first` is a multiple of 4).
DEVICE_INLINE void store_four_bf16(bf16 *copy, long first, long n, bool vector, const Four &f) {
    if (!copy) return;
    if (vector && first + 3 < n) {
        store_bf16x4(copy + first, f.x);
    } else {
        for (int k = 0; k < 4 && first + k < n; k++) copy[first + k] = to_bf16(f.x[k]);
    }
}

// The first of this thread's four elements in a launch of (n + 3) / 4 threads
// (cuda_common.cuh's grid_for_fours).
DEVICE_INLINE long first_of_four() { return ((long)blockIdx.x * blockDim.x + threadIdx.x) * 4; }
