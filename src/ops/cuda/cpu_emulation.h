// A CPU emulation of the CUDA features the backend's kernels use, so that their source
// runs in CI on machines without a GPU: the mma attention kernels, the dequantization
// kernels, the cached attention and the row kernels in their own tests
// (tests/test_*_emulated.cpp), and the whole CUDA backend under the emulated runtime of
// tests/emulated_cuda (tests/gpu/test_cuda against it). Included by device_primitives.cuh
// when the compiler is not nvcc; never part of the marlhf binary.
//
// emulation::launch runs a grid one block at a time on the calling OS thread; a block's
// CUDA threads are fibers, a warp's run in turn until each reaches a barrier or ends, and
// a warp as far as it gets before the next one runs.
// A barrier (__syncthreads, a warp's collective) lets the fibers that reach it early yield
// to the others until the last one arrives, so every thread's writes before a barrier
// are there for every thread after it, and a thread that reads what another writes
// without a barrier between them reads whatever that other fiber has got to, as on a GPU
// it could. A thread that returns from the kernel leaves the block barrier, as exited
// threads do on the GPU. A round in which no fiber gets further is a deadlock (threads
// waiting at a barrier the others never reach), which stops the program with a message
// where a GPU would hang. Blocks alternate the order their threads run in (below,
// `reverse`), shifted from launch to launch. (The emulation ran one OS thread per CUDA thread before; a
// barrier of 256 threads on 2 cores then cost ~1 ms of context switches, too slow for a
// whole backend's checks.) The warp-collective instructions (mma, ldmatrix, shuffles) are
// emulated lane by lane with the register layouts of device_primitives.cuh: every lane
// posts its operands, waits for its warp, then computes its own results from all 32
// lanes' operands. Shared memory starts filled with 0xFF bytes (NaN as bf16 and as fp32),
// so reading a tile that was never loaded poisons the result. A cp.async copy is made
// either when issued or when its thread's cp_async_wait lets its committed group
// complete, the two ends of what a GPU allows, in alternate pairs of blocks (issue_copy):
// a tile read before the wait that covers it (or never committed) is the poison or a
// previous tile's contents, and a buffer refilled while other warps still read it changes
// under them, as either can on a GPU.
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
#include <sys/mman.h>
#include <ucontext.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <deque>
#include <functional>
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

// A barrier among a block's threads (or a warp's lanes), which are fibers: one that
// arrives before the last yields to the others (wait, defined below with the fibers).
// `leave`: a thread that has returned from the kernel no longer counts.
struct Barrier {
    int expected = 0, arrived = 0;
    unsigned long generation = 0;
    void wait();
    void leave();
};

struct Warp {
    Barrier barrier;
    // Operands posted by each lane for a collective. Two sets, used alternately: a lane
    // that runs ahead into the next collective writes the other set while slower lanes
    // still read this one, and cannot come back to this set before they have finished.
    uint32_t words[2][32][6];
    const bf16 *rows[2][32];
    // A warp-wide result computed once, by the first lane past the collective's barrier,
    // for all 32 lanes to read (an mma's 16 x 8 product; a WMMA product's 16 x 16; the rows
    // an ldmatrix reads), one per operand set; `made` is the barrier generation it was made
    // in.
    float product[2][256];
    unsigned long made[2] = {0, 0};
    const void *fragments[2][32][2]; // each lane's WMMA operands (tests/emulated_cuda/include/mma.h)
};

struct Block {
    Barrier barrier;
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
    Dim3 grid_dim;
    bool copies_land_early; // cp.async copies made when issued (see issue_copy)
};

inline thread_local Thread *current = nullptr;

// Switching fibers. On x86-64 a switch saves the callee-saved registers on the old stack
// and loads them from the new one (not the float control words: nothing here changes the
// rounding mode, and saving the x87 one took half a switch's time). swapcontext also saves
// and restores the signal mask, a system call at every switch, which was three quarters
// of an emulated test's time (and under AddressSanitizer it clears the shadow of the whole
// new stack at every switch). Elsewhere, ucontext. AddressSanitizer is told of every
// switch (__sanitizer_start_switch_fiber / __sanitizer_finish_switch_fiber), so that it
// knows which stack a frame is on.
#ifdef __SANITIZE_ADDRESS__
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif
#if defined(__x86_64__)
#define EMULATION_OWN_SWITCH 1
// emulation_switch(from, to): stores the stack pointer in *from, continues at `to`.
// emulation_fiber_start: where a new fiber's first switch lands: calls r12(rbx).
// Weak: every file that includes this header defines them, the linker keeps one.
asm(R"(
    .pushsection .text
    .weak emulation_switch
    .type emulation_switch, @function
emulation_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size emulation_switch, .-emulation_switch
    .weak emulation_fiber_start
    .type emulation_fiber_start, @function
emulation_fiber_start:
    movq %rbx, %rdi
    call *%r12
    ud2
    .size emulation_fiber_start, .-emulation_fiber_start
    .popsection
)");
extern "C" void emulation_switch(void **from, void *to);
extern "C" void emulation_fiber_start(void);
#endif

// One CUDA thread: its state, its context and its stack (kept from launch to launch).
struct Fiber {
#ifdef EMULATION_OWN_SWITCH
    void *stack_pointer = nullptr;
#else
    ucontext_t context;
#endif
    void *stack = nullptr;
    Thread state;
    bool finished = false;
    const Barrier *waiting_at = nullptr; // the barrier it waits at, and that barrier's generation then
    unsigned long waiting_generation = 0;
};

struct Scheduler {
#ifdef EMULATION_OWN_SWITCH
    void *main_stack_pointer = nullptr;
#else
    ucontext_t main;
#endif
    const void *main_stack_bottom = nullptr; // the OS thread's stack, for AddressSanitizer
    size_t main_stack_bytes = 0;
    std::deque<Fiber> fibers; // a deque: a context must not move once made
    std::vector<Fiber *> fiber_at; // fibers[i], without the deque's index arithmetic at every switch
    int running = -1;
    const std::function<void()> *kernel = nullptr;
    unsigned long progress = 0; // arrivals, releases and ends: what a round must change
    unsigned long launches = 0; // so far: shifts the blocks' orders (below) from launch to launch
};
inline thread_local Scheduler *scheduler = nullptr;
// Kernels declare big register arrays, and so does the WMMA emulation; stacks are mapped
// lazily, so a large one costs only what is used.
inline const size_t FIBER_STACK_BYTES = 1u << 20;

// The scheduler runs `fiber` until it yields or finishes.
inline void switch_to_fiber(Scheduler *s, Fiber &fiber) {
#ifdef __SANITIZE_ADDRESS__
    void *fake_stack = nullptr;
    __sanitizer_start_switch_fiber(&fake_stack, fiber.stack, FIBER_STACK_BYTES);
#endif
#ifdef EMULATION_OWN_SWITCH
    emulation_switch(&s->main_stack_pointer, fiber.stack_pointer);
#else
    swapcontext(&s->main, &fiber.context);
#endif
#ifdef __SANITIZE_ADDRESS__
    __sanitizer_finish_switch_fiber(fake_stack, nullptr, nullptr);
#endif
}

// The running fiber gives the OS thread back to the scheduler; `finished`: for good.
inline void switch_to_scheduler(Scheduler *s, Fiber &fiber, bool finished) {
#ifdef __SANITIZE_ADDRESS__
    void *fake_stack = nullptr;
    __sanitizer_start_switch_fiber(finished ? nullptr : &fake_stack, s->main_stack_bottom, s->main_stack_bytes);
#endif
#ifdef EMULATION_OWN_SWITCH
    emulation_switch(&fiber.stack_pointer, s->main_stack_pointer);
#else
    if (finished)
        setcontext(&s->main); // does not return (and runs no epilogue after the sanitizer's switch)
    else
        swapcontext(&fiber.context, &s->main);
#endif
#ifdef __SANITIZE_ADDRESS__
    __sanitizer_finish_switch_fiber(fake_stack, nullptr, nullptr);
#endif
    (void)finished;
}

// The running fiber gives the OS thread back to the scheduler.
inline void yield() {
    Scheduler *s = scheduler;
    switch_to_scheduler(s, *s->fiber_at[(size_t)s->running], false);
}

inline void Barrier::wait() {
    const unsigned long mine = generation;
    scheduler->progress++;
    if (++arrived >= expected) {
        arrived = 0;
        generation++;
        return;
    }
    Fiber &fiber = *scheduler->fiber_at[(size_t)scheduler->running];
    fiber.waiting_at = this, fiber.waiting_generation = mine;
    while (generation == mine) yield();
    fiber.waiting_at = nullptr;
}

inline void Barrier::leave() {
    expected--;
    if (arrived > 0 && arrived >= expected) {
        arrived = 0;
        generation++;
    }
}

inline void fiber_main(long index) {
    Scheduler *s = scheduler;
#ifdef __SANITIZE_ADDRESS__
    // The first switch into this fiber: where it came from is the OS thread's stack.
    __sanitizer_finish_switch_fiber(nullptr, &s->main_stack_bottom, &s->main_stack_bytes);
#endif
    (*s->kernel)();
    Fiber &fiber = *s->fiber_at[(size_t)index];
    fiber.state.block->barrier.leave();
    fiber.finished = true;
    switch_to_scheduler(s, fiber, true); // not resumed: it has finished
}

// Makes fiber `index` start at fiber_main(index) when next switched to.
inline void fiber_prepare(Scheduler *s, Fiber &fiber, int index) {
#ifdef __SANITIZE_ADDRESS__
    // The frames the stack's previous fiber ended in were never unwound: their poisoned
    // shadow (locals out of scope) would be this fiber's false errors.
    const size_t ended_frames = 64 * 1024;
    ASAN_UNPOISON_MEMORY_REGION((char *)fiber.stack + FIBER_STACK_BYTES - ended_frames, ended_frames);
#endif
#ifdef EMULATION_OWN_SWITCH
    // The frame emulation_switch pops, from the lowest address: r15, r14, r13, r12 (the
    // function), rbx (its argument), rbp, and the return address, emulation_fiber_start,
    // above which the stack pointer is 16-byte aligned for its call.
    uint64_t *top = (uint64_t *)((char *)fiber.stack + FIBER_STACK_BYTES - 64);
    uint64_t *frame = top - 7;
    frame[0] = frame[1] = frame[2] = 0;                 // r15, r14, r13
    frame[3] = (uint64_t)(uintptr_t)&fiber_main;        // r12
    frame[4] = (uint64_t)index;                         // rbx
    frame[5] = 0;                                       // rbp
    frame[6] = (uint64_t)(uintptr_t)&emulation_fiber_start; // return address
    fiber.stack_pointer = frame;
    (void)s;
#else
    getcontext(&fiber.context);
    fiber.context.uc_stack.ss_sp = fiber.stack;
    fiber.context.uc_stack.ss_size = FIBER_STACK_BYTES;
    fiber.context.uc_link = &s->main;
    makecontext(&fiber.context, (void (*)())fiber_main, 1, (long)index);
#endif
}

// The fixed-size shared arrays (STATIC_SHARED) kernels on this OS thread have declared:
// one buffer each, for every block of every kernel that declares it, as blocks run one
// after another.
struct StaticSharedArray {
    unsigned char *bytes;
    size_t size;
};
inline thread_local std::vector<StaticSharedArray> static_shared_arrays;
inline void *new_static_shared_array(size_t bytes) {
    void *array = nullptr;
    if (posix_memalign(&array, 16, bytes) != 0) {
        fprintf(stderr, "emulation: cannot allocate %zu bytes of shared memory\n", bytes);
        abort();
    }
    memset(array, 0xFF, bytes);
    static_shared_arrays.push_back({(unsigned char *)array, bytes});
    return array;
}

// Runs kernel() for every thread of every block of `grid`, `threads` threads per block
// (a multiple of 32) with `shared_bytes` of dynamic shared memory, one block after
// another. All shared memory (the dynamic bytes and every STATIC_SHARED array) is filled
// with 0xFF bytes before each block, so that a block starts as a fresh one would
// (nothing read from shared memory is left from the block before). The dynamic bytes are
// an allocation of exactly `shared_bytes`, so that under AddressSanitizer a read or
// write past them stops the test.
inline void launch(Dim3 grid, int threads, size_t shared_bytes, const std::function<void()> &kernel) {
    if (!scheduler) scheduler = new Scheduler; // kept for the thread's life, with its stacks
    Scheduler *s = scheduler;
    if (s->kernel) {
        fprintf(stderr, "emulation: a launch from inside a kernel\n");
        abort();
    }
    while (s->fibers.size() < (size_t)threads) {
        Fiber &fiber = s->fibers.emplace_back();
        s->fiber_at.push_back(&fiber);
        // A page below the stack that faults: an overflow stops there instead of running
        // into the next fiber's stack.
        const size_t guard = 4096;
        char *mapping = (char *)mmap(nullptr, guard + FIBER_STACK_BYTES, PROT_READ | PROT_WRITE,
                                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK, -1, 0);
        if (mapping != MAP_FAILED && mprotect(mapping, guard, PROT_NONE) != 0) mapping = (char *)MAP_FAILED;
        fiber.stack = mapping == MAP_FAILED ? MAP_FAILED : mapping + guard;
        if (fiber.stack == MAP_FAILED) {
            fprintf(stderr, "emulation: cannot map a stack for thread %zu\n", s->fibers.size() - 1);
            abort();
        }
    }
    s->kernel = &kernel;
    Block block;
    block.warps.resize((size_t)threads / 32);
    // The device's dynamic shared memory starts 128-byte aligned (DYNAMIC_SHARED).
    unsigned char *shared_start = nullptr;
    if (posix_memalign((void **)&shared_start, 128, shared_bytes > 0 ? shared_bytes : 1) != 0) {
        fprintf(stderr, "emulation: cannot allocate %zu bytes of dynamic shared memory\n", shared_bytes);
        abort();
    }
    Thread *outside = current;
    // Which block takes which order (warps forward or reversed, copies at issue or at the
    // wait) shifts by one from launch to launch, so that a kernel launched with one block
    // or two still meets all four over its launches.
    const unsigned long salt = s->launches++;
    for (unsigned y = 0; y < grid.y; y++)
        for (unsigned x = 0; x < grid.x; x++) {
            memset(shared_start, 0xFF, shared_bytes);
            for (const StaticSharedArray &array : static_shared_arrays) memset(array.bytes, 0xFF, array.size);
            block.barrier = Barrier{threads, 0, 0};
            for (Warp &warp : block.warps) warp.barrier = Barrier{32, 0, 0}, warp.made[0] = warp.made[1] = 0;
            for (int i = 0; i < threads; i++) {
                Fiber &fiber = *s->fiber_at[(size_t)i];
                // Field by field: a new Thread's empty deque allocates, once per thread per block.
                Thread &state = fiber.state;
                state.thread_idx = {(unsigned)i, 0, 0}, state.block_idx = {x, y, 0};
                state.block_dim = {(unsigned)threads, 1, 1}, state.grid_dim = grid;
                state.block = &block, state.warp = &block.warps[(size_t)i / 32];
                state.lane = i % 32, state.parity = 0, state.shared = shared_start;
                state.uncommitted.clear(), state.committed.clear(); // a block starts with no copy in flight
                state.copies_land_early = (y * grid.x + x + salt) / 2 % 2 == 1;
                fiber.waiting_at = nullptr;
                fiber.finished = false;
                fiber_prepare(s, fiber, i);
            }
            // A warp runs as far as it can (to the next __syncthreads, or its end) before the
            // next warp starts: the most skew between warps a GPU could show, so that a
            // read that a missing barrier leaves unordered with another warp's write comes
            // before or after it, whole. Every other block takes its warps (and lanes) in
            // the reverse order, so such a read is too early in one of the two orders
            // (the poison, a previous value, or a buffer already refilled), whichever
            // warp's index is the higher.
            const bool reverse = (y * grid.x + x + salt) % 2 == 1;
            const int warps = threads / 32;
            int unfinished = threads;
            while (unfinished > 0) {
                const unsigned long before = s->progress;
                for (int w = 0; w < warps; w++) {
                    const int warp = reverse ? warps - 1 - w : w;
                    for (;;) { // passes over the warp's lanes while they get further
                        const unsigned long before_pass = s->progress;
                        for (int l = 0; l < 32; l++) {
                            const int i = warp * 32 + (reverse ? 31 - l : l);
                            Fiber &fiber = *s->fiber_at[(size_t)i];
                            if (fiber.finished) continue;
                            if (fiber.waiting_at == &block.barrier && block.barrier.generation == fiber.waiting_generation)
                                continue; // at __syncthreads: the other warps' turn
                            s->running = i;
                            current = &fiber.state;
                            switch_to_fiber(s, fiber);
                            if (fiber.finished) unfinished--, s->progress++;
                        }
                        if (s->progress == before_pass) break;
                    }
                }
                if (unfinished > 0 && s->progress == before) {
                    fprintf(stderr,
                            "emulation: deadlock in block (%u, %u): %d of %d threads wait at a barrier the "
                            "others never reach\n",
                            x, y, unfinished, threads);
                    abort();
                }
            }
        }
    free(shared_start);
    current = outside;
    s->running = -1;
    s->kernel = nullptr;
}

// A cp.async copy lands at some time between its issue and the wait that completes its
// group. Half the blocks (every other pair) make it at the issue, the others at the wait:
// a read before the wait then reads the poison or a previous tile (a missing or too
// lenient wait), and a copy issued while other warps still read the buffer it overwrites
// changes what they read (a missing barrier before a buffer is refilled).
inline void issue_copy(const Copy &copy) {
    Thread *thread = current;
    if (!thread->copies_land_early) {
        thread->uncommitted.push_back(copy);
        return;
    }
    if (copy.from)
        memcpy(copy.to, copy.from, copy.bytes);
    else
        memset(copy.to, 0, copy.bytes);
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
#define gridDim (emulation::current->grid_dim)
#define DYNAMIC_SHARED(name) unsigned char *name = emulation::current->shared
// One buffer for each place in the source (each instantiation of a template), on each OS
// thread, poisoned before every block (launch above).
#define STATIC_SHARED(type, name, count)                                                                        \
    static thread_local type *const name = (type *)emulation::new_static_shared_array(sizeof(type) * (count))

static inline void __syncthreads() { emulation::current->block->barrier.wait(); }
static inline void __syncwarp() { emulation::current->warp->barrier.wait(); }

// A butterfly shuffle of any 4- or 8-byte value (float, int, double: CUDA's overloads).
template <typename Word> static inline Word shuffle_xor(Word value, int lane_mask) {
    static_assert(sizeof(Word) <= 8, "a shuffled value is at most two words");
    emulation::Thread *me = emulation::current;
    int parity = emulation::next_parity(me);
    memcpy(&me->warp->words[parity][me->lane][0], &value, sizeof value);
    me->warp->barrier.wait();
    Word other;
    memcpy(&other, &me->warp->words[parity][me->lane ^ lane_mask][0], sizeof other);
    return other;
}
static inline float __shfl_xor_sync(unsigned, float value, int lane_mask) { return shuffle_xor(value, lane_mask); }
static inline double __shfl_xor_sync(unsigned, double value, int lane_mask) { return shuffle_xor(value, lane_mask); }
static inline int __shfl_xor_sync(unsigned, int value, int lane_mask) { return shuffle_xor(value, lane_mask); }

namespace emulation {
// A whole butterfly -- for offset 16, 8, 4, 2, 1: value = combine(value, the value of lane
// `lane ^ offset`), as five __shfl_xor_sync would -- at one barrier instead of five: every
// lane posts its value, the first lane past the barrier runs the five rounds for all 32
// lanes, and each lane takes its own result. Each lane's operands come in the shuffles'
// order (its own first), so a `combine` that does not commute gets the shuffles' bits too. What
// warp_sum and warp_max (device_primitives.cuh) are here: a barrier is two fiber switches
// for each lane, and the decode step's products and the row kernels spent most of their
// emulated time in them (tests/test_reduce_emulated.cpp checks this against the shuffles).
template <typename Word, typename Combine> static inline Word warp_butterfly(Word value, Combine combine) {
    static_assert(sizeof(Word) <= 8, "a butterfly's value is at most two words");
    Thread *me = current;
    Warp *warp = me->warp;
    const int parity = next_parity(me);
    memcpy(&warp->words[parity][me->lane][0], &value, sizeof value);
    warp->barrier.wait();
    // The 32 results in the operand set's product slot (32 x 8 bytes of its 1 KB), read by
    // every lane before any can come back to this set (see Warp).
    unsigned char *results = (unsigned char *)warp->product[parity];
    if (warp->made[parity] != warp->barrier.generation) {
        warp->made[parity] = warp->barrier.generation;
        Word now[32], next[32];
        for (int lane = 0; lane < 32; lane++) memcpy(&now[lane], &warp->words[parity][lane][0], sizeof(Word));
        for (int offset = 16; offset > 0; offset >>= 1) {
            for (int lane = 0; lane < 32; lane++) next[lane] = combine(now[lane], now[lane ^ offset]);
            memcpy(now, next, sizeof now);
        }
        memcpy(results, now, sizeof now);
    }
    Word mine;
    memcpy(&mine, results + (size_t)me->lane * sizeof(Word), sizeof mine);
    return mine;
}
} // namespace emulation

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

// __float2half_rn's bits: round to nearest even, overflow to infinity, subnormals kept.
DEVICE_INLINE uint16_t float_to_half_bits(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    const uint32_t sign = (u >> 16) & 0x8000u;
    const uint32_t magnitude = u & 0x7fffffffu;
    if (magnitude > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);  // NaN
    if (magnitude >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); // rounds past 65504
    if (magnitude < 0x38800000u) {                                   // below 2^-14: a subnormal half (or zero)
        float a;
        memcpy(&a, &magnitude, 4);
        const uint32_t units = (uint32_t)rintf(a * 16777216.0f); // in units of 2^-24
        return (uint16_t)(sign | units);
    }
    const uint32_t rounded = magnitude + 0xfffu + ((magnitude >> 13) & 1u);
    return (uint16_t)(sign | (((rounded >> 13) - (112u << 10)) & 0x7fffu));
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
    warp->barrier.wait();
    float(*product)[8] = (float(*)[8])warp->product[parity];
    if (warp->made[parity] != warp->barrier.generation) { // the first lane here multiplies for all
        warp->made[parity] = warp->barrier.generation;
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
        for (int row = 0; row < 16; row++)
            for (int col = 0; col < 8; col++) {
                float sum = 0.0f;
                for (int k = 0; k < 16; k++) sum += A[row][k] * B[k][col];
                product[row][col] = sum;
            }
    }
    int g = me->lane / 4, t = me->lane % 4;
    for (int i = 0; i < 4; i++) {
        int row = g + (i >= 2 ? 8 : 0), col = 2 * t + (i & 1);
        d[i] += product[row][col];
    }
}

// Both ldmatrix forms start alike: every lane posts its row's address (16-byte aligned)
// and waits for its warp. Returns the 32 lanes' row addresses.
// The 32 rows (eight bf16 each) are read once, by the first lane past the barrier, into
// the warp's slot: all at the same moment, as the instruction does, not each lane's share
// whenever that lane resumes (a lane run ahead could have overwritten them by then).
static inline const bf16 (*ldmatrix_rows(const bf16 *row))[8] {
    emulation::Thread *me = emulation::current;
    emulation::Warp *warp = me->warp;
    emulation::require_aligned(row, 16, "ldmatrix row");
    int parity = emulation::next_parity(me);
    warp->rows[parity][me->lane] = row;
    warp->barrier.wait();
    bf16(*rows)[8] = (bf16(*)[8])warp->product[parity];
    if (warp->made[parity] != warp->barrier.generation) {
        warp->made[parity] = warp->barrier.generation;
        for (int lane = 0; lane < 32; lane++) memcpy(rows[lane], warp->rows[parity][lane], 16);
    }
    return rows;
}

DEVICE_INLINE void ldmatrix_x4(uint32_t r[4], const bf16 *row) {
    const bf16(*rows)[8] = ldmatrix_rows(row);
    int g = emulation::current->lane / 4, t = emulation::current->lane % 4;
    for (int j = 0; j < 4; j++) {
        const bf16 *mine = rows[8 * j + g]; // row g of matrix j
        r[j] = (uint32_t)mine[2 * t].bits | (uint32_t)mine[2 * t + 1].bits << 16;
    }
}

DEVICE_INLINE void ldmatrix_x4_trans(uint32_t r[4], const bf16 *row) {
    const bf16(*rows)[8] = ldmatrix_rows(row);
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
DEVICE_INLINE void load_bf16x8(float r[8], const bf16 *p) {
    emulation::require_aligned(p, 16, "load of eight bf16");
    for (int i = 0; i < 8; i++) r[i] = bf16_to_float(p[i]);
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
    emulation::issue_copy({shared_dst, valid ? global_src : nullptr, 16});
}
DEVICE_INLINE void cp_async_4(void *shared_dst, const void *global_src, bool valid) {
    emulation::require_aligned(shared_dst, 4, "cp.async shared");
    emulation::require_aligned(global_src, 4, "cp.async global");
    emulation::issue_copy({shared_dst, valid ? global_src : nullptr, 4});
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
