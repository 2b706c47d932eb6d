// A CPU emulation of the few CUDA features the mma attention kernels, the dequantization
// kernels and the cached attention use, so that their source (attention_mma.cuh,
// dequantize.cuh, attention_cached.cuh) runs in CI on machines without a GPU
// (tests/test_attention_emulated.cpp, tests/test_dequantize_emulated.cpp,
// tests/test_attention_cached_emulated.cpp). Included by device_primitives.cuh when the
// compiler is not nvcc; never part of the marlhf binary.
//
// emulation::launch runs a grid one block at a time; a block is one OS thread per CUDA
// thread, so __syncthreads is a real barrier and a data race between warps can show. The
// same OS threads run every block of a launch, one after another (starting threads was
// most of the emulated tests' time, and several times more under AddressSanitizer). The
// warp-collective instructions (mma, ldmatrix, shuffles) are emulated lane by lane with
// the register layouts of device_primitives.cuh: every lane posts its operands, waits for
// its warp, then computes its own results from all 32 lanes' operands. Shared memory
// starts filled with 0xFF bytes (NaN as bf16 and as fp32), so reading a tile that was
// never loaded poisons the result. A cp.async copy is made when its thread's
// cp_async_wait lets its committed group complete, not when issued: a tile read before the
// wait that covers it (or never committed) is the poison or a previous tile's contents, as
// it can be on a GPU.
//
// What it does not model: the tensor cores' summation order (sums here are fp32 in k
// order, the GPU's differ in the last bits) and timing. A kernel that passes here can
// still fail on the GPU through a wrong belief about a PTX layout shared by the kernel
// and this file; tests/gpu/test_cuda.c is the check for that. It does check the address
// alignment the instructions require (a GPU faults on a misaligned one; the CPU would not):
// 4 bytes for a 32-bit fragment load, 16 for an ldmatrix row and for both cp_async_16
// addresses, 4 for cp_async_4's.
#pragma once
#include <float.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <deque>
#include <functional>
#include <thread>
#include <vector>

struct bf16 {
    uint16_t bits;
};

// Round to nearest even, as __float2bfloat16; NaN stays NaN.
static inline bf16 float_to_bf16(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return bf16{(uint16_t)((u >> 16) | 0x40)};
    u += 0x7fffu + ((u >> 16) & 1u);
    return bf16{(uint16_t)(u >> 16)};
}

static inline float bf16_to_float(bf16 h) {
    uint32_t u = (uint32_t)h.bits << 16;
    float x;
    memcpy(&x, &u, 4);
    return x;
}

#define DEVICE_INLINE static inline
#define DEVICE_METHOD inline
#define HOST_DEVICE_INLINE static inline
#define UNROLL
#define KEEP_LOOP
#define __global__
#define __launch_bounds__(...)

namespace emulation {

struct Dim3 {
    unsigned x, y, z;
};

struct Warp {
    pthread_barrier_t barrier;
    // Operands posted by each lane for a collective. Two sets, used alternately: a lane
    // that runs ahead into the next collective writes the other set while slower lanes
    // still read this one, and cannot come back to this set before they have finished.
    uint32_t words[2][32][6];
    const bf16 *rows[2][32];
};

struct Block {
    pthread_barrier_t barrier;
    std::vector<Warp> warps;
};

// One cp.async: `bytes` from `from` to `to`, or zeros when `from` is null.
struct Copy {
    void *to;
    const void *from;
    size_t bytes;
};

struct Thread {
    Dim3 thread_idx, block_idx, block_dim;
    Block *block;
    Warp *warp;
    int lane;
    int parity; // which operand set this lane's next collective uses
    unsigned char *shared;
    std::vector<Copy> uncommitted;           // issued since the last cp_async_commit
    std::deque<std::vector<Copy>> committed; // groups not yet waited for, oldest first
};

inline thread_local Thread *current = nullptr;

// Runs kernel() for every thread of every block of `grid`, `threads` threads per block
// (a multiple of 32) with `shared_bytes` of dynamic shared memory. Thread i of the pool is
// thread i of each block in turn; between two blocks every thread waits at `between`, and
// one of them refills shared memory with 0xFF, so that a block starts as a fresh one would
// (nothing read from shared memory is left from the block before).
inline void launch(Dim3 grid, int threads, size_t shared_bytes, const std::function<void()> &kernel) {
    Block block;
    pthread_barrier_init(&block.barrier, nullptr, (unsigned)threads);
    block.warps.resize((size_t)threads / 32);
    for (Warp &warp : block.warps) pthread_barrier_init(&warp.barrier, nullptr, 32);
    pthread_barrier_t between;
    pthread_barrier_init(&between, nullptr, (unsigned)threads);
    // The device's dynamic shared memory starts 128-byte aligned (DYNAMIC_SHARED).
    std::vector<unsigned char> shared(shared_bytes + 128 + 16, 0xFF);
    unsigned char *shared_start = shared.data() + (128 - (uintptr_t)shared.data() % 128) % 128;
    std::vector<Thread> states((size_t)threads);
    std::vector<std::thread> pool;
    for (int i = 0; i < threads; i++) {
        pool.emplace_back([&, i] {
            Thread *state = &states[(size_t)i];
            current = state;
            for (unsigned y = 0; y < grid.y; y++)
                for (unsigned x = 0; x < grid.x; x++) {
                    *state = Thread{{(unsigned)i, 0, 0},  {x, y, 0}, {(unsigned)threads, 1, 1},
                                    &block,           &block.warps[(size_t)i / 32],
                                    i % 32,           0,
                                    shared_start,     {},
                                    {}}; // a block starts with no copy in flight
                    kernel();
                    if (pthread_barrier_wait(&between) == PTHREAD_BARRIER_SERIAL_THREAD)
                        memset(shared.data(), 0xFF, shared.size());
                    pthread_barrier_wait(&between);
                }
        });
    }
    for (std::thread &thread : pool) thread.join();
    pthread_barrier_destroy(&between);
    for (Warp &warp : block.warps) pthread_barrier_destroy(&warp.barrier);
    pthread_barrier_destroy(&block.barrier);
}

// Stops the test where the GPU would fault with a misaligned address.
inline void require_aligned(const void *address, size_t alignment, const char *what) {
    if ((uintptr_t)address % alignment == 0) return;
    fprintf(stderr, "emulation: %s address %p is not %zu-byte aligned (a GPU faults)\n", what, address, alignment);
    abort();
}

// This lane's operand set for the next collective (and flips to the other for the one after).
inline int next_parity(Thread *me) {
    int parity = me->parity;
    me->parity ^= 1;
    return parity;
}

} // namespace emulation

#define threadIdx (emulation::current->thread_idx)
#define blockIdx (emulation::current->block_idx)
#define blockDim (emulation::current->block_dim)
#define DYNAMIC_SHARED(name) unsigned char *name = emulation::current->shared

static inline void __syncthreads() { pthread_barrier_wait(&emulation::current->block->barrier); }
static inline void __syncwarp() { pthread_barrier_wait(&emulation::current->warp->barrier); }

// A butterfly shuffle of any 4- or 8-byte value (float, int, double: CUDA's overloads).
template <typename Word> static inline Word shuffle_xor(Word value, int lane_mask) {
    static_assert(sizeof(Word) <= 8, "a shuffled value is at most two words");
    emulation::Thread *me = emulation::current;
    int parity = emulation::next_parity(me);
    memcpy(&me->warp->words[parity][me->lane][0], &value, sizeof value);
    pthread_barrier_wait(&me->warp->barrier);
    Word other;
    memcpy(&other, &me->warp->words[parity][me->lane ^ lane_mask][0], sizeof other);
    return other;
}
static inline float __shfl_xor_sync(unsigned, float value, int lane_mask) { return shuffle_xor(value, lane_mask); }
static inline double __shfl_xor_sync(unsigned, double value, int lane_mask) { return shuffle_xor(value, lane_mask); }
static inline int __shfl_xor_sync(unsigned, int value, int lane_mask) { return shuffle_xor(value, lane_mask); }

DEVICE_INLINE bf16 to_bf16(float x) { return float_to_bf16(x); }
DEVICE_INLINE float from_bf16(bf16 x) { return bf16_to_float(x); }

DEVICE_INLINE uint32_t pack_bf16x2(float low, float high) {
    return (uint32_t)float_to_bf16(low).bits | (uint32_t)float_to_bf16(high).bits << 16;
}

// Each result rounded to float before it is used (a volatile store: a compiler allowed to
// contract a * b + c into an FMA cannot do it across one), as __fmul_rn / __fadd_rn.
DEVICE_INLINE float mul_rn(float a, float b) {
    volatile float product = a * b;
    return product;
}
DEVICE_INLINE float add_rn(float a, float b) {
    volatile float sum = a + b;
    return sum;
}

DEVICE_INLINE float float_from_bits(uint32_t bits) {
    float x;
    memcpy(&x, &bits, 4);
    return x;
}

// __half2float: exact (io/gguf_dequant.c's gguf_f16_to_f32; a subnormal is its mantissa times
// 2^-24, exact in float).
DEVICE_INLINE float half_to_float(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exponent = (h >> 10) & 0x1fu, mantissa = h & 0x3ffu;
    if (exponent == 0x1f) return float_from_bits(sign | 0x7f800000u | mantissa << 13);
    if (exponent != 0) return float_from_bits(sign | (exponent + (127 - 15)) << 23 | mantissa << 13);
    const float magnitude = (float)mantissa * 5.9604644775390625e-8f; // 2^-24
    return sign ? -magnitude : magnitude;
}

// ex2.approx.ftz: 2^x with results below FLT_MIN flushed to 0 (the hardware's approximation
// is within a relative 2^-22 of this, the PTX ISA's bound).
DEVICE_INLINE float exp2_approx(float x) {
    const float y = exp2f(x);
    return y < FLT_MIN ? 0.0f : y;
}

// __float2int_rn: nearest, ties to even.
DEVICE_INLINE int round_to_int(float x) { return (int)rintf(x); }

DEVICE_INLINE uint32_t load_u32(const bf16 *p) {
    emulation::require_aligned(p, 4, "32-bit fragment load");
    uint32_t value;
    memcpy(&value, p, 4);
    return value;
}

DEVICE_INLINE void store_u32(bf16 *p, uint32_t value) {
    emulation::require_aligned(p, 4, "32-bit store of two bf16");
    memcpy(p, &value, 4);
}

static inline float low_half(uint32_t word) { return bf16_to_float(bf16{(uint16_t)(word & 0xffffu)}); }
static inline float high_half(uint32_t word) { return bf16_to_float(bf16{(uint16_t)(word >> 16)}); }

DEVICE_INLINE void mma_bf16_16x8x16(float d[4], const uint32_t a[4], const uint32_t b[2]) {
    emulation::Thread *me = emulation::current;
    emulation::Warp *warp = me->warp;
    int parity = emulation::next_parity(me);
    uint32_t *mine = warp->words[parity][me->lane];
    for (int i = 0; i < 4; i++) mine[i] = a[i];
    mine[4] = b[0], mine[5] = b[1];
    pthread_barrier_wait(&warp->barrier);
    float A[16][16], B[16][8];
    for (int lane = 0; lane < 32; lane++) {
        const uint32_t *w = warp->words[parity][lane];
        int g = lane / 4, t = lane % 4;
        A[g][2 * t] = low_half(w[0]), A[g][2 * t + 1] = high_half(w[0]);
        A[g + 8][2 * t] = low_half(w[1]), A[g + 8][2 * t + 1] = high_half(w[1]);
        A[g][2 * t + 8] = low_half(w[2]), A[g][2 * t + 9] = high_half(w[2]);
        A[g + 8][2 * t + 8] = low_half(w[3]), A[g + 8][2 * t + 9] = high_half(w[3]);
        B[2 * t][g] = low_half(w[4]), B[2 * t + 1][g] = high_half(w[4]);
        B[2 * t + 8][g] = low_half(w[5]), B[2 * t + 9][g] = high_half(w[5]);
    }
    int g = me->lane / 4, t = me->lane % 4;
    for (int i = 0; i < 4; i++) {
        int row = g + (i >= 2 ? 8 : 0), col = 2 * t + (i & 1);
        float sum = 0.0f;
        for (int k = 0; k < 16; k++) sum += A[row][k] * B[k][col];
        d[i] += sum;
    }
}

// Both ldmatrix forms start alike: every lane posts its row's address (16-byte aligned)
// and waits for its warp. Returns the 32 lanes' row addresses.
static inline const bf16 *const *ldmatrix_rows(const bf16 *row) {
    emulation::Thread *me = emulation::current;
    emulation::Warp *warp = me->warp;
    emulation::require_aligned(row, 16, "ldmatrix row");
    int parity = emulation::next_parity(me);
    warp->rows[parity][me->lane] = row;
    pthread_barrier_wait(&warp->barrier);
    return warp->rows[parity];
}

DEVICE_INLINE void ldmatrix_x4(uint32_t r[4], const bf16 *row) {
    const bf16 *const *rows = ldmatrix_rows(row);
    int g = emulation::current->lane / 4, t = emulation::current->lane % 4;
    for (int j = 0; j < 4; j++) {
        const bf16 *mine = rows[8 * j + g]; // row g of matrix j
        r[j] = (uint32_t)mine[2 * t].bits | (uint32_t)mine[2 * t + 1].bits << 16;
    }
}

DEVICE_INLINE void ldmatrix_x4_trans(uint32_t r[4], const bf16 *row) {
    const bf16 *const *rows = ldmatrix_rows(row);
    int g = emulation::current->lane / 4, t = emulation::current->lane % 4;
    for (int j = 0; j < 4; j++) {
        const bf16 *first = rows[8 * j + 2 * t], *second = rows[8 * j + 2 * t + 1];
        r[j] = (uint32_t)first[g].bits | (uint32_t)second[g].bits << 16;
    }
}

DEVICE_INLINE void load_float4(float r[4], const float *p) {
    emulation::require_aligned(p, 16, "float4 load");
    memcpy(r, p, 16);
}
DEVICE_INLINE void store_float4(float *p, const float r[4]) {
    emulation::require_aligned(p, 16, "float4 store");
    memcpy(p, r, 16);
}
DEVICE_INLINE void store_bf16x4(bf16 *p, const float r[4]) {
    emulation::require_aligned(p, 8, "store of four bf16");
    const uint32_t pairs[2] = {pack_bf16x2(r[0], r[1]), pack_bf16x2(r[2], r[3])};
    memcpy(p, pairs, 8);
}
DEVICE_INLINE void store_bf16x8(bf16 *p, const float r[8]) {
    emulation::require_aligned(p, 16, "store of eight bf16");
    const uint32_t pairs[4] = {pack_bf16x2(r[0], r[1]), pack_bf16x2(r[2], r[3]), pack_bf16x2(r[4], r[5]),
                               pack_bf16x2(r[6], r[7])};
    memcpy(p, pairs, 16);
}

DEVICE_INLINE void cp_async_16(void *shared_dst, const void *global_src, bool valid) {
    emulation::require_aligned(shared_dst, 16, "cp.async shared");
    emulation::require_aligned(global_src, 16, "cp.async global");
    emulation::current->uncommitted.push_back({shared_dst, valid ? global_src : nullptr, 16});
}
DEVICE_INLINE void cp_async_4(void *shared_dst, const void *global_src, bool valid) {
    emulation::require_aligned(shared_dst, 4, "cp.async shared");
    emulation::require_aligned(global_src, 4, "cp.async global");
    emulation::current->uncommitted.push_back({shared_dst, valid ? global_src : nullptr, 4});
}
DEVICE_INLINE void cp_async_commit() {
    emulation::Thread *thread = emulation::current;
    thread->committed.push_back(std::move(thread->uncommitted));
    thread->uncommitted.clear();
}
// Completes this thread's oldest committed groups until `pending` remain.
template <int pending> DEVICE_INLINE void cp_async_wait() {
    emulation::Thread *thread = emulation::current;
    while (thread->committed.size() > (size_t)pending) {
        for (const emulation::Copy &copy : thread->committed.front()) {
            if (copy.from)
                memcpy(copy.to, copy.from, copy.bytes);
            else
                memset(copy.to, 0, copy.bytes);
        }
        thread->committed.pop_front();
    }
}
