// Sliding-window attention's one rule, shared by every attention kernel (CPU, CUDA, and the
// CUDA kernels compiled for the CPU by the emulation tests): a query at position `query` of
// a row whose real tokens start at `row_start` sees keys [attention_first_key(...), query].
// With a window of W keys (0: none) that is the last W of them, itself included, as
// transformers masks them (key > query - W).
#pragma once

#if defined(__CUDACC__)
#define ATTENTION_WINDOW_INLINE static __host__ __device__ __forceinline__
#else
#define ATTENTION_WINDOW_INLINE static inline
#endif

ATTENTION_WINDOW_INLINE int attention_first_key(int row_start, int query, int window) {
    return window > 0 && query - window + 1 > row_start ? query - window + 1 : row_start;
}
