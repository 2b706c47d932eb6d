// The sanitizer build's treatment of the hottest inner loops.
//
// AddressSanitizer checks every load and UBSan every pointer step, and together they keep
// the compiler from vectorising: the decoder's matrix-vector product (nearly all of a
// decode step) ran about six times slower in the sanitizer build, and the test suite's
// sanitized pass spent most of its time there. A function marked SANITIZER_UNCHECKED is
// not checked access by access; instead its caller states the whole ranges it reads and
// writes with SANITIZER_CHECK_RANGE, which the sanitizer build checks once per call, so
// an out-of-bounds range (a wrong row count or width) is still reported, with the
// block's allocation, as any other ASan error. In other builds both are nothing.
#pragma once
#include <stddef.h>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#define SANITIZER_UNCHECKED __attribute__((no_sanitize("address", "undefined")))
// The first unaddressable byte of [start, start + bytes) is read through this checked
// function, so that ASan reports it the way it reports any bad read.
static inline void sanitizer_check_range(const void *start, size_t bytes) {
    const volatile char *poisoned = (const volatile char *)__asan_region_is_poisoned((void *)start, bytes);
    if (poisoned) (void)*poisoned;
}
#define SANITIZER_CHECK_RANGE(start, bytes) sanitizer_check_range((start), (bytes))
#else
#define SANITIZER_UNCHECKED
#define SANITIZER_CHECK_RANGE(start, bytes) ((void)(start), (void)(bytes))
#endif

// A build without -march (the sanitizer build) compiles for the baseline x86-64, where fmaf
// is a call into libm's software version and vectors are 128 bits wide. A hot loop marked
// FMA_CLONES is compiled twice on x86-64 and the copy for CPUs with FMA (and AVX) is chosen
// at load time. A loop written with fmaf gets the same bits from either copy (fmaf is
// exactly rounded); a vectorised reduction may sum in another order, so such a loop's bits
// depend on the copy the machine runs (as any -march build's do on its machine). Builds for
// a named -march (all the others) have FMA or not already, and get no clones.
// FMA_CLONES_NOINLINE: the same for a function that must also stay out of line. A cloned
// function is called through its resolver and never inlined, and clang refuses noinline
// beside target_clones (`make fuzz`'s build), so the clones go without it.
#if defined(__x86_64__) && !defined(__FMA__)
#define FMA_CLONES __attribute__((target_clones("fma", "default")))
#define FMA_CLONES_NOINLINE FMA_CLONES
#else
#define FMA_CLONES
#define FMA_CLONES_NOINLINE __attribute__((noinline))
#endif
