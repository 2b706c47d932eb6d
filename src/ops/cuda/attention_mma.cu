// Launchers of the mma.sync attention kernels (attention_mma.cuh).
#include <math.h>
#include <string.h>

#include <algorithm>

#include "ops/cuda/attention_fused.cuh"
#include "ops/cuda/attention_mma.cuh"

using namespace attention_mma;

// Block probes (ops_cuda_attention_probe_begin, benchmarks only): the next launch of the
// kernel asked for, if it is a TUNED one at head_dim 64 (the only probed instantiations,
// the 1B and SmolLM2 shapes'), runs its PROBED instantiation and leaves its records here.
enum ProbedKernel { PROBE_NONE, PROBE_FORWARD, PROBE_KEYS, PROBE_QUERIES };
static ProbedKernel probe_next = PROBE_NONE;
static ProbeRecord *probe_device_records = nullptr;
static long probe_record_count = 0;
static GridShape probe_grid;

static_assert(sizeof(ProbeRecord) == sizeof(OpsAttentionProbeRecord), "the device's records are the API's");

#ifdef __CUDACC__
template <int HD, Variant VARIANT> constexpr bool PROBES_BUILT = HD == 64 && VARIANT == TUNED;
#else // the emulated runtime (tests/emulated_cuda) has no clocks to probe with
template <int HD, Variant VARIANT> constexpr bool PROBES_BUILT = false;
#endif

// Called for every launch of `kernel`: whether this one is the probed one. The next launch
// of the kernel asked for takes the probe, and if it cannot be probed (`built` false: not
// a PROBES_BUILT instantiation, or not run) nothing is, rather than a later launch. A probed
// launch's records are allocated (zeros: a block that returns before its loop, with nothing
// to compute, writes none) and the kernels' pointer set, on the main stream: the backward
// calls this before it forks the side stream, which then waits for them.
static bool probe_this_launch(ProbedKernel kernel, GridShape grid, bool built) {
    if (probe_next != kernel) return false;
    probe_next = PROBE_NONE;
    if (!built) return false;
    probe_record_count = (long)grid.x * grid.y * WARPS;
    probe_device_records = (ProbeRecord *)cuda_device_alloc((size_t)probe_record_count * sizeof(ProbeRecord),
                                                            "an attention probe's records");
    CUDA_CHECK(cudaMemset(probe_device_records, 0, (size_t)probe_record_count * sizeof(ProbeRecord)));
#ifdef __CUDACC__
    CUDA_CHECK(cudaMemcpyToSymbol(probe_records, &probe_device_records, sizeof probe_device_records));
#endif
    probe_grid = grid;
    return true;
}

extern "C" int ops_cuda_attention_probe_begin(const char *kernel) {
    if (!strcmp(kernel, "forward")) probe_next = PROBE_FORWARD;
    else if (!strcmp(kernel, "dK/dV")) probe_next = PROBE_KEYS;
    else if (!strcmp(kernel, "dQ")) probe_next = PROBE_QUERIES;
    else return err_set("attention probe: '%s' is not forward, dK/dV or dQ", kernel);
    cuda_device_free(probe_device_records);
    probe_device_records = nullptr, probe_record_count = 0;
    return 0;
}

extern "C" long ops_cuda_attention_probe_end(OpsAttentionProbeRecord **records, int *grid_x, int *grid_y) {
    probe_next = PROBE_NONE;
    if (!probe_device_records)
        return err_set("attention probe: no probed kernel ran (probes exist for the mma kernels at head_dim 64)");
    CUDA_CHECK(cudaDeviceSynchronize());
    *records = (OpsAttentionProbeRecord *)xmalloc((size_t)probe_record_count * sizeof(OpsAttentionProbeRecord));
    CUDA_CHECK(cudaMemcpy(*records, probe_device_records, (size_t)probe_record_count * sizeof(ProbeRecord),
                          cudaMemcpyDeviceToHost));
    cuda_device_free(probe_device_records);
    probe_device_records = nullptr;
    *grid_x = probe_grid.x, *grid_y = probe_grid.y;
    return probe_record_count;
}

template <int HD, Variant VARIANT>
static void forward_for(float *out, bf16 *out_copy, float *lse, const bf16 *Q, const bf16 *K, const bf16 *V,
                        const int *row_start, int B, int H, int KV, int T, float scale, int window) {
    const size_t shared = forward_shared_bytes<HD>();
    const GridShape grid = forward_grid<HD, VARIANT>(B, H, T);
    auto kernel = forward_kernel<HD, VARIANT>; // or its probed instantiation (the same signature)
    if (probe_this_launch(PROBE_FORWARD, grid, PROBES_BUILT<HD, VARIANT>))
        if constexpr (PROBES_BUILT<HD, VARIANT>) kernel = forward_kernel<HD, VARIANT, true>;
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)shared));
    kernel<<<dim3(grid.x, grid.y), THREADS, shared>>>(out, out_copy, lse, Q, K, V, row_start, H, KV, T, scale, window);
    CUDA_CHECK_LAUNCH();
}

size_t cuda_mma_attention_shared_bytes(int head_dim) {
    size_t most = 0;
    with_fused_head_dim(head_dim, "mma", [&](auto hd) {
        constexpr int HD = decltype(hd)::value;
        most = std::max({forward_shared_bytes<HD>(), backward_q_shared_bytes<HD>(), backward_kv_shared_bytes<HD>(),
                         backward_q_from_scores_shared_bytes<HD>()});
    });
    return most;
}

void cuda_mma_attention_forward(float *out, bf16 *out_copy, float *lse, const bf16 *Q, const bf16 *K, const bf16 *V,
                                const int *row_start, int B, int H, int KV, int T, int head_dim, int window,
                                bool plain) {
    const float scale = 1.0f / sqrtf((float)head_dim);
    with_fused_head_dim(head_dim, "mma", [&](auto hd) {
        constexpr int HD = decltype(hd)::value;
        if (plain) forward_for<HD, PLAIN>(out, out_copy, lse, Q, K, V, row_start, B, H, KV, T, scale, window);
        else forward_for<HD, TUNED>(out, out_copy, lse, Q, K, V, row_start, B, H, KV, T, scale, window);
    });
}

// Which backward kernels run (ops_cuda_attention_backward_parts: benchmarks only).
static bool run_key_kernel = true, run_query_kernel = true;

extern "C" void ops_cuda_attention_backward_parts(bool key_gradients, bool query_gradients) {
    run_key_kernel = key_gradients, run_query_kernel = query_gradients;
}

// Whether dQ runs on the side stream beside dK/dV (ops_cuda_attention_backward_overlap:
// benchmarks only; the other way, after it on the main stream, as before 2026-12-05).
static bool overlap_query_kernel = true;

extern "C" void ops_cuda_attention_backward_overlap(bool overlapped) { overlap_query_kernel = overlapped; }

// "mma-ds" keeps the scores' gradient dS (bf16 tiles on and below the causal diagonal,
// attention_mma.cuh's score_tile_index) from the dK/dV kernel for the dQ kernel, which then
// needs one product a tile instead of three: up to this many bytes (285 MB at B = 8,
// T = 1024, 32 heads); past it dQ recomputes.
static const size_t SCORES_GRADIENT_MOST_BYTES = (size_t)1 << 30;

// dK/dV, then dQ from the dS it wrote: one after the other on the main stream.
template <int HD>
static void backward_keeping_scores(float *dq, float *dk, float *dv, int q_row_stride, int kv_row_stride, const bf16 *Q,
                                    const bf16 *K, const bf16 *V, const bf16 *dO, const float *lse, const float *D,
                                    const int *row_start, int B, int H, int KV, int T, float scale, int window,
                                    bf16 *scores_gradient) {
    const size_t kv_shared = backward_kv_shared_bytes<HD>(), q_shared = backward_q_from_scores_shared_bytes<HD>();
    CUDA_CHECK(cudaFuncSetAttribute(backward_kv_scores_kernel<HD>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    (int)kv_shared));
    CUDA_CHECK(cudaFuncSetAttribute(backward_q_from_scores_kernel<HD>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    (int)q_shared));
    const GridShape kv_grid = backward_kv_grid(B, KV, T), q_grid = backward_q_grid(B, H, T);
    probe_this_launch(PROBE_KEYS, kv_grid, false); // (no probed instantiation of these two)
    probe_this_launch(PROBE_QUERIES, q_grid, false);
    if (run_key_kernel) {
        backward_kv_scores_kernel<HD><<<dim3(kv_grid.x, kv_grid.y), THREADS, kv_shared>>>(
            dk, dv, kv_row_stride, Q, K, V, dO, lse, D, row_start, H, KV, T, scale, window, scores_gradient);
        CUDA_CHECK_LAUNCH();
    }
    if (run_query_kernel) {
        backward_q_from_scores_kernel<HD><<<dim3(q_grid.x, q_grid.y), THREADS, q_shared>>>(
            dq, q_row_stride, K, scores_gradient, row_start, H, KV, T, scale, window);
        CUDA_CHECK_LAUNCH();
    }
}

template <int HD, Variant VARIANT>
static void backward_for(float *dq, float *dk, float *dv, int q_row_stride, int kv_row_stride, const bf16 *Q,
                         const bf16 *K, const bf16 *V, const bf16 *dO, const float *lse, const float *D,
                         const int *row_start, int B, int H, int KV, int T, float scale, int window) {
    const size_t kv_shared = backward_kv_shared_bytes<HD>(), q_shared = backward_q_shared_bytes<HD>();
    const GridShape kv_grid = backward_kv_grid(B, KV, T), q_grid = backward_q_grid(B, H, T);
    // Each kernel or its probed instantiation (the same signature); a probe's records are
    // set up on the main stream before the fork (probe_this_launch).
    auto kv_kernel = backward_kv_kernel<HD, VARIANT>;
    auto q_kernel = backward_q_kernel<HD, VARIANT>;
    if (probe_this_launch(PROBE_KEYS, kv_grid, PROBES_BUILT<HD, VARIANT> && run_key_kernel))
        if constexpr (PROBES_BUILT<HD, VARIANT>) kv_kernel = backward_kv_kernel<HD, VARIANT, true>;
    if (probe_this_launch(PROBE_QUERIES, q_grid, PROBES_BUILT<HD, VARIANT> && run_query_kernel))
        if constexpr (PROBES_BUILT<HD, VARIANT>) q_kernel = backward_q_kernel<HD, VARIANT, true>;
    CUDA_CHECK(cudaFuncSetAttribute(kv_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)kv_shared));
    CUDA_CHECK(cudaFuncSetAttribute(q_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)q_shared));
    // The two kernels read the same inputs and write different gradients, so dQ runs on the
    // side stream beside dK/dV: launched second, its blocks start as dK/dV's last ones free
    // the SMs (one kernel after the other, each one's tail of last blocks left SMs idle),
    // and the main stream waits for both before the op returns.
    if (overlap_query_kernel) cuda_side_stream_fork();
    if (run_key_kernel) {
        kv_kernel<<<dim3(kv_grid.x, kv_grid.y), THREADS, kv_shared>>>(dk, dv, kv_row_stride, Q, K, V, dO, lse, D,
                                                                       row_start, H, KV, T, scale, window);
        CUDA_CHECK_LAUNCH();
    }
    if (run_query_kernel) {
        cudaStream_t stream = overlap_query_kernel ? cuda_side_stream() : 0;
        q_kernel<<<dim3(q_grid.x, q_grid.y), THREADS, q_shared, stream>>>(dq, q_row_stride, Q, K, V, dO, lse, D,
                                                                           row_start, H, KV, T, scale, window);
        CUDA_CHECK_LAUNCH();
    }
    if (overlap_query_kernel) cuda_side_stream_join();
}

void cuda_mma_attention_backward(float *dq, float *dk, float *dv, int q_row_stride, int kv_row_stride, const bf16 *Q,
                                 const bf16 *K, const bf16 *V, const bf16 *dO, const float *lse, const float *D,
                                 const int *row_start, int B, int H, int KV, int T, int head_dim, int window,
                                 bool plain, bool keep_scores_gradient) {
    const float scale = 1.0f / sqrtf((float)head_dim);
    const size_t scores_bytes = (size_t)B * H * (size_t)score_tiles_per_head(T) * SCORE_TILE_ELEMENTS * sizeof(bf16);
    bf16 *scores_gradient =
        keep_scores_gradient && keeps_scores_gradient_at(head_dim) && scores_bytes <= SCORES_GRADIENT_MOST_BYTES
            ? (bf16 *)cuda_scratch(SCRATCH_ATT_DS16, scores_bytes)
            : nullptr;
    with_fused_head_dim(head_dim, "mma", [&](auto hd) {
        constexpr int HD = decltype(hd)::value;
        if constexpr (keeps_scores_gradient_at(HD))
            if (scores_gradient) {
                backward_keeping_scores<HD>(dq, dk, dv, q_row_stride, kv_row_stride, Q, K, V, dO, lse, D, row_start,
                                            B, H, KV, T, scale, window, scores_gradient);
                return;
            }
        if (plain)
            backward_for<HD, PLAIN>(dq, dk, dv, q_row_stride, kv_row_stride, Q, K, V, dO, lse, D, row_start, B, H, KV,
                                    T, scale, window);
        else
            backward_for<HD, TUNED>(dq, dk, dv, q_row_stride, kv_row_stride, Q, K, V, dO, lse, D, row_start, B, H, KV,
                                    T, scale, window);
    });
}

// One kernel's facts as the GPU reports them (ops_cuda_attention_kernel_facts).
template <typename Kernel>
static OpsAttentionKernelFacts kernel_facts(const char *name, Kernel kernel, size_t dynamic_shared) {
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)dynamic_shared));
    cudaFuncAttributes attributes;
    CUDA_CHECK(cudaFuncGetAttributes(&attributes, kernel));
    int blocks = 0;
    CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, THREADS, dynamic_shared));
    return {name, attributes.numRegs, (int)attributes.localSizeBytes,
            (int)(attributes.sharedSizeBytes + dynamic_shared), blocks};
}

extern "C" int ops_cuda_attention_kernel_facts(const char *kernels, int head_dim, OpsAttentionKernelFacts *facts,
                                               int capacity) {
    const bool plain = !strcmp(kernels, "mma-plain"), keeps_scores = !strcmp(kernels, "mma-ds");
    if (!plain && !keeps_scores && strcmp(kernels, "mma"))
        return err_set("attention kernel facts: '%s' is not one of mma, mma-plain, mma-ds", kernels);
    if (head_dim != 16 && head_dim != 32 && head_dim != 64 && head_dim != 128)
        return err_set("attention kernel facts: no mma kernel for head_dim %d", head_dim);
    OpsAttentionKernelFacts found[4];
    int count = 0;
    with_fused_head_dim(head_dim, "mma", [&](auto hd) {
        constexpr int HD = decltype(hd)::value;
        const size_t kv_shared = backward_kv_shared_bytes<HD>();
        if (plain) {
            found[count++] = kernel_facts("forward", forward_kernel<HD, PLAIN>, forward_shared_bytes<HD>());
            found[count++] = kernel_facts("dK/dV", backward_kv_kernel<HD, PLAIN>, kv_shared);
            found[count++] = kernel_facts("dQ", backward_q_kernel<HD, PLAIN>, backward_q_shared_bytes<HD>());
            return;
        }
        found[count++] = kernel_facts("forward", forward_kernel<HD, TUNED>, forward_shared_bytes<HD>());
        if constexpr (keeps_scores_gradient_at(HD))
            if (keeps_scores) { // what backward_keeping_scores runs
                found[count++] = kernel_facts("dK/dV writing dS", backward_kv_scores_kernel<HD>, kv_shared);
                found[count++] = kernel_facts("dQ from dS", backward_q_from_scores_kernel<HD>,
                                              backward_q_from_scores_shared_bytes<HD>());
                return;
            }
        found[count++] = kernel_facts("dK/dV", backward_kv_kernel<HD, TUNED>, kv_shared);
        found[count++] = kernel_facts("dQ", backward_q_kernel<HD, TUNED>, backward_q_shared_bytes<HD>());
    });
    for (int i = 0; i < count && i < capacity; i++) facts[i] = found[i];
    return count < capacity ? count : capacity;
}
