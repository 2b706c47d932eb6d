// The CUDA runtime, as far as the CUDA backend (src/ops/cuda) uses it, on the CPU: the
// backend's own source compiled by a host C++ compiler, so that tests/gpu/test_cuda runs
// in CI against the whole backend -- its host code (scratch slots, the bf16 weight cache,
// held and stored matmul inputs, the attention's dispatch and streams) and every kernel --
// on machines without a GPU (build/tests/gpu/test_cuda_emulated, tests/cli/gpu_emulated.sh).
//
// How: the fake <cuda_runtime.h>, <cuda_bf16.h>, <cublasLt.h>, <mma.h> of
// tests/emulated_cuda/include all come here. Kernels run through cpu_emulation.h (one OS
// thread per CUDA thread, blocks one after another); the Makefile rewrites each launch
// `kernel<<<grid, block, shared, stream>>>(args)` into
// `emulation::launcher([=](auto... arguments) { kernel(arguments...); },
// EMULATED_KERNEL_ADDRESS(kernel), grid, block, shared, stream)(args)`. Device memory is host
// memory; every stream is the host's one thread of control, so work runs in issue order,
// which is one of the orders the GPU may run it in (events and stream waits only narrow
// the GPU's choices, so they are no-ops here). With MARLHF_EMULATED_STREAMS=late a
// stream other than the default one runs its kernels as late as the GPU may: queued, and
// run only when another stream waits for an event recorded after them, or at a device
// synchronisation or a cudaFree (which synchronises) -- not at a cudaMemcpy, which on the
// legacy stream does not wait for a non-blocking stream. Work on the main stream between a
// fork and its join then sees none of the side stream's results, and overwrites its
// inputs before it reads them: a missing join or event shows as wrong results.
// cuBLASLt is tests/emulated_cuda/cublaslt.cpp.
//
// What it cannot show: timing, races between streams other than these two orders, the
// tensor cores' rounding (tests/gpu/test_cuda.c's tolerances cover it), register and
// shared-memory limits (kernel facts are not reported: cudaFuncGetAttributes gives
// zeros), and a PTX layout believed wrongly both here and in the kernel. Test-only: never
// part of the marlhf binary.
#pragma once
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <deque>
#include <functional>
#include <map>
#include <vector>
#include <mutex>
#include <tuple>
#include <type_traits>
#include <utility>

#include "ops/cuda/cpu_emulation.h"

// ---- qualifiers ----
#define __device__
#define __host__
#define __forceinline__ inline
#define __constant__
// A kernel's fixed-size shared array is STATIC_SHARED (device_primitives.cuh), which the
// emulation refills with poison before each block; a plain static would carry one
// block's values into the next, so `__shared__` itself does not compile here.
#define __shared__ _Pragma("GCC error \"a kernel's shared array is STATIC_SHARED(type, name, count) (device_primitives.cuh)\"")
#define __align__(n) __attribute__((aligned(n)))

#define CUDART_VERSION 13000

// ---- vector types ----
struct dim3 {
    unsigned x, y, z;
    dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
struct alignas(16) float4 {
    float x, y, z, w;
};
struct alignas(16) uint4 {
    unsigned x, y, z, w;
};
static inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return uint4{x, y, z, w}; }
static inline float4 make_float4(float x, float y, float z, float w) { return float4{x, y, z, w}; }

// ---- bf16 and half ----
typedef bf16 __nv_bfloat16;
struct __nv_bfloat162 {
    bf16 x, y;
};
static inline bf16 __float2bfloat16(float x) { return float_to_bf16(x); }
static inline bf16 __float2bfloat16_rn(float x) { return float_to_bf16(x); }
static inline float __bfloat162float(bf16 x) { return bf16_to_float(x); }
static inline __nv_bfloat162 __floats2bfloat162_rn(float low, float high) {
    return __nv_bfloat162{float_to_bf16(low), float_to_bf16(high)};
}
struct __half {
    uint16_t bits;
};
// Round to nearest even (cpu_emulation.h's float_to_half_bits).
static inline __half __float2half_rn(float x) { return __half{float_to_half_bits(x)}; }
static inline unsigned short __half_as_ushort(__half h) { return h.bits; }
static inline __half __ushort_as_half(unsigned short bits) { return __half{bits}; }
static inline float __half2float(__half h) { return half_to_float(h.bits); }

// ---- device math ----
static inline float __fmul_rn(float a, float b) { return mul_rn(a, b); }
static inline float __fadd_rn(float a, float b) { return add_rn(a, b); }
static inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
static inline float __fdividef(float a, float b) { return a / b; }
static inline float __uint_as_float(unsigned bits) { return float_from_bits(bits); }
static inline unsigned __float_as_uint(float x) {
    unsigned u;
    memcpy(&u, &x, 4);
    return u;
}
static inline int __float2int_rn(float x) { return (int)rintf(x); }
// CUDA's integer min and max (device overloads of the same name).
static inline int min(int a, int b) { return a < b ? a : b; }
static inline int max(int a, int b) { return a > b ? a : b; }
static inline long min(long a, long b) { return a < b ? a : b; }
static inline long max(long a, long b) { return a > b ? a : b; }
static inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
static inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
static inline float min(float a, float b) { return fminf(a, b); }
static inline float max(float a, float b) { return fmaxf(a, b); }

static inline float __shfl_down_sync(unsigned, float value, int delta) {
    emulation::Thread *me = emulation::current;
    int parity = emulation::next_parity(me);
    memcpy(&me->warp->words[parity][me->lane][0], &value, sizeof value);
    me->warp->barrier.wait();
    const int from = me->lane + delta < 32 ? me->lane + delta : me->lane;
    float other;
    memcpy(&other, &me->warp->words[parity][from][0], sizeof other);
    return other;
}

// ---- the runtime API ----
typedef enum {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
} cudaError_t;
typedef enum {
    cudaMemcpyHostToHost = 0,
    cudaMemcpyHostToDevice = 1,
    cudaMemcpyDeviceToHost = 2,
    cudaMemcpyDeviceToDevice = 3,
    cudaMemcpyDefault = 4,
} cudaMemcpyKind;
typedef enum { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 } cudaFuncAttribute;
// A stream's kernels not yet run (MARLHF_EMULATED_STREAMS=late): `executed` of the `queued`
// so far have run, the rest wait in `pending`.
struct EmulatedStream {
    std::deque<std::function<void()>> pending;
    long queued = 0, executed = 0;
};
// The stream it was last recorded on (null: the default stream, whose work has run) and
// how many of that stream's kernels were queued then.
struct EmulatedEvent {
    EmulatedStream *stream = nullptr;
    long position = 0;
};
typedef EmulatedStream *cudaStream_t;
typedef EmulatedEvent *cudaEvent_t;
enum { cudaStreamNonBlocking = 1, cudaEventDisableTiming = 2 };

struct cudaDeviceProp {
    char name[256];
    int major, minor;
    int multiProcessorCount;
    size_t sharedMemPerBlockOptin;
    size_t totalGlobalMem;
};
struct cudaFuncAttributes {
    int numRegs;
    size_t localSizeBytes, sharedSizeBytes;
    int maxThreadsPerBlock;
};

namespace emulation {
// With MARLHF_EMULATED_COUNT_LAUNCHES=1, said on stderr at exit: the kernels launched and the
// cuBLASLt products run (tests/emulated_cuda/cublaslt.cpp), each a call the host pays for on
// a GPU -- what a decode step of a small model spends its time on there (gpu_emulated.sh
// counts a step's).
struct LaunchCounts {
    std::atomic<long> kernels{0}, products{0};
    ~LaunchCounts() {
        const char *setting = getenv("MARLHF_EMULATED_COUNT_LAUNCHES");
        if (setting && !strcmp(setting, "1"))
            fprintf(stderr, "emulation: %ld kernel launches, %ld cuBLASLt products\n", kernels.load(), products.load());
    }
};
inline LaunchCounts launch_counts;
// MARLHF_EMULATED_SKIP_WORK=1: launches and cuBLASLt products are checked and counted but
// not run, and device memory starts as zero bytes instead of the poison below (so that
// token ids read back from it are valid ones). What a program then spends is the host's
// share of its work (the model's C code, the backend's wrappers and this runtime's own
// bookkeeping), which bounds from below the time the host spends launching the same work
// on a GPU (bench/host_overhead.sh). Its results are meaningless; for timing only.
// An environment switch of the emulation: false when unset, empty or `off`, true when `on`;
// any other setting stops the program with a message naming it.
inline bool env_switch(const char *name, const char *off, const char *on) {
    const char *setting = getenv(name);
    if (!setting || !*setting || !strcmp(setting, off)) return false;
    if (!strcmp(setting, on)) return true;
    fprintf(stderr, "emulation: %s is '%s'; expected %s or %s\n", name, setting, off, on);
    abort();
}
inline bool skip_work() {
    static const bool skip = env_switch("MARLHF_EMULATED_SKIP_WORK", "0", "1");
    return skip;
}
// The error of the last launch the GPU would refuse (too many threads, a grid too tall,
// more dynamic shared memory than the kernel was allowed).
inline cudaError_t last_error = cudaSuccess;
inline const size_t shared_memory_optin = 227 * 1024; // an H100/H200's
// Without cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, n) a
// kernel may be launched with at most 48 KB of dynamic shared memory; with it, n.
inline const size_t shared_memory_default = 48 * 1024;
inline std::map<const void *, size_t> &dynamic_shared_allowed() {
    static std::map<const void *, size_t> allowed;
    return allowed;
}

// Device memory is host memory, so a host pointer handed to a kernel, or a copy whose
// direction names the wrong side, would work here and fault on a GPU: every allocation
// is recorded, and each pointer a kernel gets and each side of a copy is checked against
// the record.
inline std::map<uintptr_t, size_t> &allocations() {
    static std::map<uintptr_t, size_t> record;
    return record;
}
// The device's memory, MARLHF_EMULATED_MEMORY_MIB (default 8192 MiB): a cudaMalloc past it
// fails as a full GPU's does, so the backend's out-of-memory error can be tested
// (tests/cli/gpu_emulated.sh). bytes_allocated is what the recorded allocations hold.
inline size_t memory_limit() {
    static const size_t limit = [] {
        const char *setting = getenv("MARLHF_EMULATED_MEMORY_MIB");
        if (!setting || !*setting) return (size_t)8 << 30;
        char *end;
        const long mib = strtol(setting, &end, 10);
        if (*end || mib < 1) {
            fprintf(stderr, "emulation: MARLHF_EMULATED_MEMORY_MIB is '%s'; expected a positive whole number\n", setting);
            abort();
        }
        return (size_t)mib << 20;
    }();
    return limit;
}
inline size_t &bytes_allocated() {
    static size_t bytes;
    return bytes;
}
inline bool on_device(const void *p) {
    const uintptr_t address = (uintptr_t)p;
    auto after = allocations().upper_bound(address);
    if (after == allocations().begin()) return false;
    --after;
    return address <= after->first + after->second; // one past the end counts (an empty range's)
}
inline void require_device(const void *p, const char *what) {
    if (p == nullptr || on_device(p)) return;
    fprintf(stderr, "emulation: %s %p is not device memory (a GPU faults)\n", what, p);
    abort();
}
inline void require_host(const void *p, const char *what) {
    if (!on_device(p)) return;
    fprintf(stderr, "emulation: %s %p is device memory, not the host's (a GPU faults)\n", what, p);
    abort();
}

// With MARLHF_EMULATED_DEVICE_CLOSED=1, device memory is closed to the host's code, as a
// GPU's is: each allocation is its own mapping, kept PROT_NONE except while a kernel, a
// copy, a memset or a cuBLASLt product runs (DeviceAccess), so host code that reads or
// writes a device pointer directly (a memcpy where a cudaMemcpy belongs) stops with SIGSEGV
// here as it would on a GPU machine. Not the default: an mprotect costs ~40 us a MB of
// 4 KB pages here (2 a launch), which made test_cuda_emulated 8x slower (12m49 against
// 1m35) and a 20-step SFT run 3x; gpu_emulated.sh runs marlhf's SFT steps so.
inline size_t page_bytes() {
    static const size_t bytes = (size_t)sysconf(_SC_PAGESIZE);
    return bytes;
}
// A closed allocation's mapping: whole pages, at least one (an empty allocation has an address too).
inline size_t mapped_bytes(size_t bytes) {
    return bytes == 0 ? page_bytes() : (bytes + page_bytes() - 1) / page_bytes() * page_bytes();
}
inline bool device_left_open() {
    static const bool closed = getenv("MARLHF_EMULATED_DEVICE_CLOSED") && atoi(getenv("MARLHF_EMULATED_DEVICE_CLOSED"));
    return !closed;
}
inline std::mutex &access_lock() {
    static std::mutex lock;
    return lock;
}
inline int &access_depth() {
    static int depth = 0;
    return depth;
}
inline void protect_all(int protection) {
    for (const auto &[address, bytes] : allocations())
        if (mprotect((void *)address, mapped_bytes(bytes), protection) != 0) {
            fprintf(stderr, "emulation: mprotect of device memory failed\n");
            abort();
        }
}
// Device memory open to the calling code while it lives (nested, and across threads: closed
// again when the last one ends).
struct DeviceAccess {
    DeviceAccess() {
        if (device_left_open()) return;
        std::lock_guard<std::mutex> hold(access_lock());
        if (access_depth()++ == 0) protect_all(PROT_READ | PROT_WRITE);
    }
    ~DeviceAccess() {
        if (device_left_open()) return;
        std::lock_guard<std::mutex> hold(access_lock());
        if (--access_depth() == 0) protect_all(PROT_NONE);
    }
    DeviceAccess(const DeviceAccess &) = delete;
    DeviceAccess &operator=(const DeviceAccess &) = delete;
};
} // namespace emulation

static inline const char *cudaGetErrorString(cudaError_t status) {
    switch (status) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument (emulated)";
    case cudaErrorMemoryAllocation: return "out of memory (emulated)";
    }
    return "unknown error (emulated)";
}
static inline cudaError_t cudaGetLastError(void) {
    cudaError_t status = emulation::last_error;
    emulation::last_error = cudaSuccess;
    return status;
}
// One emulated GPU, or $MARLHF_EMULATED_DEVICES (tests/cli/gpu_emulated.sh gives two ranks
// one each, as NCCL needs). Each has its own PCI address (cudaDeviceGetPCIBusId), all the
// same memory.
namespace emulation {
inline int device_count() {
    static const int count = getenv("MARLHF_EMULATED_DEVICES") && atoi(getenv("MARLHF_EMULATED_DEVICES")) > 0
                                 ? atoi(getenv("MARLHF_EMULATED_DEVICES"))
                                 : 1;
    return count;
}
inline int current_device = 0;
} // namespace emulation
static inline cudaError_t cudaGetDeviceCount(int *count) {
    *count = emulation::device_count();
    return cudaSuccess;
}
static inline cudaError_t cudaSetDevice(int device) {
    if (device < 0 || device >= emulation::device_count()) return cudaErrorInvalidValue;
    emulation::current_device = device;
    return cudaSuccess;
}
static inline cudaError_t cudaGetDevice(int *device) {
    *device = emulation::current_device;
    return cudaSuccess;
}
static inline cudaError_t cudaDeviceGetPCIBusId(char *address, int length, int device) {
    if (device < 0 || device >= emulation::device_count() || length < 1) return cudaErrorInvalidValue;
    snprintf(address, (size_t)length, "emulated:%04x:00.0", device);
    return cudaSuccess;
}
static inline cudaError_t cudaGetDeviceProperties(cudaDeviceProp *prop, int device) {
    memset(prop, 0, sizeof *prop);
    snprintf(prop->name, sizeof prop->name, "emulated GPU (CPU threads)");
    prop->major = 9, prop->minor = 0;
    prop->multiProcessorCount = 132;
    prop->sharedMemPerBlockOptin = emulation::shared_memory_optin;
    prop->totalGlobalMem = emulation::memory_limit();
    return cudaSuccess;
}
static inline cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes) {
    std::lock_guard<std::mutex> hold(emulation::access_lock());
    *total_bytes = emulation::memory_limit();
    *free_bytes = *total_bytes - emulation::bytes_allocated();
    return cudaSuccess;
}
// Device memory: 256-byte aligned like cudaMalloc's, filled with 0xFF bytes (NaN as fp32
// and bf16) so that a buffer read before anything wrote it shows. Closed to host code
// (emulation::DeviceAccess), each allocation is a mapping of its own; open (the default),
// the heap's (fresh mappings cost a page fault a page at every allocation, which the
// backend's scratch buffers, allocated again as they grow, made several times slower).
template <typename T> static inline cudaError_t cudaMalloc(T **ptr, size_t bytes) {
    {
        std::lock_guard<std::mutex> hold(emulation::access_lock());
        if (bytes > emulation::memory_limit() - emulation::bytes_allocated()) return cudaErrorMemoryAllocation;
    }
    void *memory;
    if (emulation::device_left_open()) {
        memory = aligned_alloc(256, (bytes + 255) / 256 * 256);
        if (!memory) return cudaErrorMemoryAllocation;
    } else {
        memory = mmap(nullptr, emulation::mapped_bytes(bytes), PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (memory == MAP_FAILED) return cudaErrorMemoryAllocation;
    }
    memset(memory, emulation::skip_work() ? 0 : 0xFF, bytes);
    std::lock_guard<std::mutex> hold(emulation::access_lock());
    if (emulation::access_depth() == 0 && !emulation::device_left_open())
        mprotect(memory, emulation::mapped_bytes(bytes), PROT_NONE);
    emulation::allocations()[(uintptr_t)memory] = bytes;
    emulation::bytes_allocated() += bytes;
    *ptr = (T *)memory;
    return cudaSuccess;
}
namespace emulation {
inline bool streams_late() {
    static const bool late = env_switch("MARLHF_EMULATED_STREAMS", "in-order", "late");
    return late;
}
inline std::vector<EmulatedStream *> &created_streams() {
    static std::vector<EmulatedStream *> streams;
    return streams;
}
// Runs `stream`'s queued kernels up to its `position`-th.
inline void run_stream_until(EmulatedStream *stream, long position) {
    while (stream->executed < position) {
        std::function<void()> kernel = std::move(stream->pending.front());
        stream->pending.pop_front();
        stream->executed++;
        kernel();
    }
}
inline void run_all_streams() {
    for (EmulatedStream *stream : created_streams()) run_stream_until(stream, stream->queued);
}
} // namespace emulation

static inline cudaError_t cudaFree(void *ptr) {
    if (!ptr) return cudaSuccess;
    emulation::run_all_streams(); // cudaFree waits for the device
    std::lock_guard<std::mutex> hold(emulation::access_lock());
    auto allocation = emulation::allocations().find((uintptr_t)ptr);
    if (allocation == emulation::allocations().end()) return cudaErrorInvalidValue; // not from cudaMalloc
    if (emulation::device_left_open()) free(ptr);
    else munmap(ptr, emulation::mapped_bytes(allocation->second));
    emulation::bytes_allocated() -= allocation->second;
    emulation::allocations().erase(allocation);
    return cudaSuccess;
}
static inline cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind) {
    if (bytes == 0) return cudaSuccess;
    if (kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice) emulation::require_device(dst, "copy destination");
    if (kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice) emulation::require_device(src, "copy source");
    if (kind == cudaMemcpyHostToDevice) emulation::require_host(src, "copy source");
    if (kind == cudaMemcpyDeviceToHost) emulation::require_host(dst, "copy destination");
    emulation::DeviceAccess access;
    memmove(dst, src, bytes);
    return cudaSuccess;
}
static inline cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind,
                                          cudaStream_t = nullptr) {
    return cudaMemcpy(dst, src, bytes, kind);
}
static inline cudaError_t cudaMemcpy2DAsync(void *dst, size_t dst_pitch, const void *src, size_t src_pitch,
                                            size_t width, size_t height, cudaMemcpyKind, cudaStream_t = nullptr) {
    if (width > dst_pitch || width > src_pitch) return cudaErrorInvalidValue;
    if (height == 0 || width == 0) return cudaSuccess;
    emulation::require_device(dst, "2-D copy destination"), emulation::require_device(src, "2-D copy source");
    emulation::DeviceAccess access;
    for (size_t row = 0; row < height; row++)
        memmove((char *)dst + row * dst_pitch, (const char *)src + row * src_pitch, width);
    return cudaSuccess;
}
static inline cudaError_t cudaMemset(void *ptr, int value, size_t bytes) {
    if (bytes == 0) return cudaSuccess;
    emulation::require_device(ptr, "memset destination");
    emulation::DeviceAccess access;
    memset(ptr, value, bytes);
    return cudaSuccess;
}
static inline cudaError_t cudaMemsetAsync(void *ptr, int value, size_t bytes, cudaStream_t = nullptr) {
    return cudaMemset(ptr, value, bytes);
}
template <typename Symbol>
static inline cudaError_t cudaMemcpyToSymbol(Symbol &symbol, const void *src, size_t bytes, size_t offset = 0,
                                             cudaMemcpyKind = cudaMemcpyHostToDevice) {
    memcpy((char *)&symbol + offset, src, bytes);
    return cudaSuccess;
}
static inline cudaError_t cudaDeviceSynchronize(void) {
    emulation::run_all_streams();
    return cudaSuccess;
}
static inline cudaError_t cudaStreamCreateWithFlags(cudaStream_t *stream, unsigned) {
    *stream = new EmulatedStream;
    emulation::created_streams().push_back(*stream);
    return cudaSuccess;
}
static inline cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned) {
    *event = new EmulatedEvent;
    return cudaSuccess;
}
static inline cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream = nullptr) {
    event->stream = stream;
    event->position = stream ? stream->queued : 0;
    return cudaSuccess;
}
// The waiting stream's later work runs after the event's: here, the recorded stream's
// kernels up to the event run now (the default stream's have run already).
static inline cudaError_t cudaStreamWaitEvent(cudaStream_t, cudaEvent_t event, unsigned = 0) {
    if (event->stream) emulation::run_stream_until(event->stream, event->position);
    return cudaSuccess;
}

template <typename Kernel> static inline cudaError_t cudaFuncSetAttribute(Kernel *kernel, cudaFuncAttribute, int value) {
    if (value < 0 || (size_t)value > emulation::shared_memory_optin) return cudaErrorInvalidValue;
    emulation::dynamic_shared_allowed()[(const void *)kernel] = (size_t)value;
    return cudaSuccess;
}
// What a GPU reports of a kernel's registers and memory cannot be known here: zeros.
template <typename Kernel> static inline cudaError_t cudaFuncGetAttributes(cudaFuncAttributes *attributes, Kernel *) {
    memset(attributes, 0, sizeof *attributes);
    attributes->maxThreadsPerBlock = 1024;
    return cudaSuccess;
}
template <typename Kernel>
static inline cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int *blocks, Kernel *, int, size_t) {
    *blocks = 0;
    return cudaSuccess;
}

// ---- launches ----
namespace emulation {
// `body` calls the kernel with the arguments it is given (a generic lambda the Makefile
// writes around the kernel's name, so that a kernel template deduced from its arguments
// is resolved as in the launch); every thread of the grid calls it with a copy of the
// launch's arguments.
// A pointer a kernel is given must be device memory (or null).
template <typename Argument> inline void check_argument(const Argument &argument) {
    if constexpr (std::is_pointer_v<Argument>) require_device((const void *)argument, "kernel argument");
}

// The dynamic shared memory the GPU lets `kernel` (its address; null where the launch
// names a template deduced from the arguments) be launched with.
inline size_t dynamic_shared_limit(const void *kernel, size_t shared_bytes) {
    if (shared_bytes <= shared_memory_default) return shared_memory_default;
    if (!kernel) {
        fprintf(stderr, "emulation: a launch with %zu bytes of dynamic shared memory names its kernel by a "
                        "template deduced from the arguments, so its cudaFuncSetAttribute cannot be found; "
                        "name the kernel's template arguments at the launch\n",
                shared_bytes);
        abort();
    }
    auto allowed = dynamic_shared_allowed().find(kernel);
    return allowed == dynamic_shared_allowed().end() ? shared_memory_default : allowed->second;
}

// The Makefile's launch rewrite passes the kernel's address as EMULATED_KERNEL_ADDRESS(kernel):
// the address where the name resolves without the arguments (a function, a template with
// its arguments named, a pointer to a kernel), null for a template the arguments deduce.
// The name is only used as an argument of a call on a generic parameter, so that one that
// does not resolve makes the requires-expression false instead of the build fail.
struct KernelAddress {
    template <typename Function> const void *of(Function *function) const { return (const void *)function; }
};
#define EMULATED_KERNEL_ADDRESS(kernel)                                                                         \
    ([&](auto address) -> const void * {                                                                       \
        if constexpr (requires { address.of(kernel); })                                                         \
            return address.of(kernel);                                                                          \
        else                                                                                                    \
            return nullptr;                                                                                     \
    }(emulation::KernelAddress{}))

template <typename Body> struct Launcher {
    Body body;
    const void *kernel;
    dim3 grid, block;
    size_t shared_bytes;
    cudaStream_t stream;
    template <typename... Args> void operator()(Args... args) const {
        const unsigned threads = block.x * block.y * block.z;
        if (block.y != 1 || block.z != 1 || grid.z != 1 || threads == 0 || threads > 1024 || threads % 32 != 0 ||
            grid.x == 0 || grid.y == 0 || grid.y > 65535 || shared_bytes > dynamic_shared_limit(kernel, shared_bytes)) {
            // What the GPU refuses (cudaErrorInvalidConfiguration there); blocks that are not
            // whole warps, or 2-D ones, are not modelled by cpu_emulation.h.
            fprintf(stderr, "emulation: launch of grid %ux%ux%u, block %ux%ux%u, %zu bytes of shared memory refused\n",
                    grid.x, grid.y, grid.z, block.x, block.y, block.z, shared_bytes);
            last_error = cudaErrorInvalidValue;
            return;
        }
        (check_argument(args), ...);
        launch_counts.kernels++;
        if (skip_work()) return;
        const std::tuple<Args...> arguments(args...);
        // Everything the run needs by value (the body captured the kernel by value too: the
        // Makefile's rewrite), so that it can wait in a stream's queue past this scope.
        auto run = [body = body, arguments, grid = grid, threads, shared_bytes = shared_bytes] {
            DeviceAccess access;
            launch(Dim3{grid.x, grid.y, 1}, (int)threads, shared_bytes, [&] { std::apply(body, arguments); });
        };
        if (stream && streams_late()) {
            stream->pending.push_back(run);
            stream->queued++;
        } else {
            run();
        }
    }
};
template <typename Body>
static inline Launcher<Body> launcher(Body body, const void *kernel, dim3 grid, dim3 block, size_t shared_bytes = 0,
                                      cudaStream_t stream = nullptr) {
    return Launcher<Body>{body, kernel, grid, block, shared_bytes, stream};
}
} // namespace emulation
