// Shared pieces of the CUDA backend: error checks, launch helpers, the bf16 scratch
// buffers and the declarations of every op, one .cu file per concept as in ops/cpu.
//
// Memory model: every float buffer the model sees is fp32 in device memory (master
// weights, activations, gradients). Matrix products convert their operands to bf16 on the
// fly (weights once, cached until the weights change: matmul.cu) and accumulate in fp32
// through cuBLASLt. All work goes to one stream (the legacy default stream), so ops run in
// the order the model calls them and a copy to the host waits for everything before it.
// The one exception is inside an op: the mma attention backward runs its dQ kernel on a
// side stream beside its dK/dV kernel (cuda_side_stream_fork/join below), and the main
// stream waits for it before the op returns, so to its callers the op is in order too.
#pragma once
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

extern "C" {
#include "core/check.h"
#include "ops/ops.h"
}
#include "ops/cuda/cublaslt_library.cuh"
#include "ops/cuda/device_primitives.cuh"

#define CUDA_CHECK(call)                                                                   \
    do {                                                                                   \
        cudaError_t cuda_status_ = (call);                                                 \
        if (cuda_status_ != cudaSuccess)                                                   \
            die_internal(__FILE__, __LINE__, "CUDA: %s (%s)", cudaGetErrorString(cuda_status_), \
                         #call);                                                           \
    } while (0)

#define CUBLAS_CHECK(call)                                                                 \
    do {                                                                                   \
        cublasStatus_t cublas_status_ = (call);                                            \
        if (cublas_status_ != CUBLAS_STATUS_SUCCESS)                                       \
            die_internal(__FILE__, __LINE__, "cuBLAS status %d (%s)", (int)cublas_status_, #call); \
    } while (0)

// After every kernel launch: a bad launch configuration is reported where it happened.
#define CUDA_CHECK_LAUNCH() CUDA_CHECK(cudaGetLastError())

static inline unsigned grid_for(long n, int threads) {
    long blocks = (n + threads - 1) / threads;
    return (unsigned)(blocks < 1 ? 1 : blocks);
}

// Whether every given pointer (NULL counts as aligned) is aligned to `bytes`.
static inline bool all_aligned(uintptr_t bytes, const void *a, const void *b = NULL, const void *c = NULL,
                               const void *d = NULL, const void *e = NULL) {
    const void *pointers[5] = {a, b, c, d, e};
    for (const void *p : pointers)
        if ((uintptr_t)p % bytes) return false;
    return true;
}
// ... to 16 bytes: float4 accesses.
static inline bool all_aligned16(const void *a, const void *b, const void *c = NULL, const void *d = NULL,
                                 const void *e = NULL) {
    return all_aligned(16, a, b, c, d, e);
}

static inline unsigned grid_for_fours(long n, int threads) { return grid_for((n + 3) / 4, threads); }
// ---- cuda_backend.cu ----
// The backend's cuBLASLt handle and workspace (created when the device is opened).
cublasLtHandle_t cuda_blaslt(void);
// A second stream for work that may run beside the main stream's within one op (created
// when the device is opened; non-blocking, so the legacy default stream does not
// serialise it). fork: the side stream waits for everything issued to the main stream so
// far; join: the main stream waits for everything issued to the side stream so far.
cudaStream_t cuda_side_stream(void);
void cuda_side_stream_fork(void);
void cuda_side_stream_join(void);
void *cuda_blaslt_workspace(size_t *bytes);
// Every cudaMalloc and cudaFree of the backend goes through these two, which count the
// bytes held and the most held at once (ops_cuda_memory). Where the GPU has no room,
// cuda_device_alloc ends the program with a user error (exit status 2) naming `what` was
// asked for, the memory free and what the backend holds. cuda_device_free takes only a
// pointer cuda_device_alloc returned (NULL is ignored).
void *cuda_device_alloc(size_t bytes, const char *what);
void cuda_device_free(void *ptr);
// The most dynamic shared memory one block may opt in to on the open device (227 KB on
// an H100/H200, 163 KB on an A100, 99 KB on sm_86/sm_89 parts).
size_t cuda_shared_memory_per_block(void);
// A scratch buffer of at least `bytes`, one per slot, reused across calls. Growing one
// waits for the device, so a buffer is never freed under a running kernel.
enum {
    SCRATCH_MATMUL_A, SCRATCH_MATMUL_B,                    // bf16 activations (matmul.cu)
    SCRATCH_MATMUL_HELD,                                   // bf16 of the held inputs (matmul_input_hold):
    SCRATCH_MATMUL_HELD_LAST = SCRATCH_MATMUL_HELD + OPS_HELD_INPUTS_MAX - 1, // one slot each (a stored
                                                           //   one's stays unallocated: its copy is in place)
    SCRATCH_ATT_Q, SCRATCH_ATT_K, SCRATCH_ATT_V, SCRATCH_ATT_DOUT, // bf16 [B,H,T,hd]
    SCRATCH_ATT_P16, SCRATCH_ATT_DS32, SCRATCH_ATT_DS16,  // [B,H,T,T]
    SCRATCH_ATT_S32,                                       // fp32 [B,H,T,T]: scores for a soft cap's slope
    SCRATCH_ATT_HEADS32,                                   // fp32 [B,H,T,hd]
    SCRATCH_ATT_ROWDOT,                                    // fused backward: dO . O per row
    SCRATCH_ATT_DECODE_SPLITS,                             // attention_cached.cuh: each run of keys' softmax state
    SCRATCH_ATT_ROTATED_Q, SCRATCH_ATT_ROTATED_K,          // fp32 q, k rotated (attention_forward_rotary's fallbacks)
    SCRATCH_ATT_ROWS_Q, SCRATCH_ATT_ROWS_K, SCRATCH_ATT_ROWS_V,    // fp32 q, k, v and dq, dk, dv as rows of
    SCRATCH_ATT_ROWS_DQ, SCRATCH_ATT_ROWS_DK, SCRATCH_ATT_ROWS_DV, //   their own, from and to a fused q | k | v
                                                                   //   buffer (the rotary ops' fallbacks)
    SCRATCH_PARTIAL,                                       // column-sum partials
    SCRATCH_REDUCE,                                        // sum_squares partials
    SCRATCH_INDEX,                                         // embedding backward groups
    SCRATCH_DEQUANTIZED,                                   // bf16 tile of a quantized weight (matmul_quantized.cu)
    SCRATCH_SLOTS
};
void *cuda_scratch(int slot, size_t bytes);
// Any write to [ptr, ptr+bytes) through the backend: cached bf16 weights there are stale.
void cuda_weights_written(const void *ptr, size_t bytes);

// Block-wide sum of one value per thread (blockDim.x a multiple of 32, at most 1024).
// Every thread gets the total. The order of additions is fixed: deterministic.
template <typename Real> __device__ Real block_sum(Real value) {
    STATIC_SHARED(Real, warp_sums, 32);
    return block_sum_over(value, warp_sums, (int)blockDim.x / 32);
}

__device__ inline float block_max(float value) {
    STATIC_SHARED(float, warp_maxima, 32);
    return block_max_over(value, warp_maxima, (int)blockDim.x / 32);
}

// Column reduction in a fixed order: out[c] += sum over rows i of term(i, c), where `term`
// is a functor object with `__device__ float operator()(int i, int c) const`. Rows are cut
// into chunks of 64; each chunk's sums go to a partial row, then the partial rows are
// added in order. No atomics, so gradients are bit-identical run to run.
enum { COLUMN_CHUNK_ROWS = 64 };

template <typename Term>
__global__ void column_partial_kernel(float *partial, int N, int C, Term term) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    int first = blockIdx.y * COLUMN_CHUNK_ROWS;
    int last = min(first + (int)COLUMN_CHUNK_ROWS, N);
    float sum = 0.0f;
    for (int i = first; i < last; i++) sum += term(i, c);
    partial[(long)blockIdx.y * C + c] = sum;
}

__global__ void column_total_kernel(float *out, const float *partial, int chunks, int C);

template <typename Term> void column_reduce(float *out, int N, int C, Term term) {
    int chunks = (N + COLUMN_CHUNK_ROWS - 1) / COLUMN_CHUNK_ROWS;
    float *partial = (float *)cuda_scratch(SCRATCH_PARTIAL, (size_t)chunks * C * sizeof(float));
    dim3 grid((C + 255) / 256, chunks);
    column_partial_kernel<<<grid, 256>>>(partial, N, C, term);
    CUDA_CHECK_LAUNCH();
    column_total_kernel<<<(C + 255) / 256, 256>>>(out, partial, chunks, C);
    CUDA_CHECK_LAUNCH();
}

// ---- bf16.cu ----
void cuda_to_bf16(__nv_bfloat16 *out, const float *in, long n);
// Strided rows: out[r*out_ld + c] = in[r*in_ld + c] for c < width.
void cuda_to_bf16_rows(__nv_bfloat16 *out, long out_ld, const float *in, long in_ld, int rows,
                       int width);

// ---- matmul.cu ----
// D[m x n] (column-major, ldd) = alpha * op(A) op(B) + beta * D, A and B bf16, D fp32.
void cuda_gemm_bf16(bool trans_a, bool trans_b, int m, int n, int k, float alpha,
                    const __nv_bfloat16 *A, int lda, const __nv_bfloat16 *B, int ldb, float beta,
                    float *D, int ldd, int batch, long long stride_a, long long stride_b,
                    long long stride_d);
// The bf16 copy of a weight matrix, converted on first use and kept until a write through
// the backend touches the fp32 weights (cuda_weights_written) or their memory is freed. A
// copy of a larger range around it serves it (the fused q/k/v product's three weights); a
// new copy's range takes the place of the copies inside it.
const __nv_bfloat16 *cuda_weight_bf16(const float *weight, long n);
// x [n] as bf16 in scratch buffer `slot` (an activation operand, converted on every call),
// or the held input's one copy (matmul_input_hold).
const __nv_bfloat16 *cuda_activation_bf16(int slot, const float *x, long n);
void cuda_matmul_input_hold(const float *inp, long n);
void cuda_hold_stored(const float *inp, long n, bool written);
long cuda_stored_buffer_floats(long n);
// The bytes of the live device allocation that starts at ptr (cuda_device_alloc), or 0 where
// none starts there (a view inside one).
size_t cuda_allocation_size(const void *ptr);
void cuda_matmul_input_release(void);
// For an op writing `out` (n floats): the bf16 copy it should write beside it when `out` is
// held (matmul_input_hold; the copy then counts as made), else NULL (also for `out` NULL).
// A stored `out` (hold_stored) is an internal error here: the op would write floats
// over its copy; the ops that can write a stored output ask cuda_held_output.
__nv_bfloat16 *cuda_held_copy_to_write(const float *out, long n);
// cuda_held_copy_to_write for the ops that may write a stored output: for one, the copy is
// the buffer's own memory and *out becomes NULL (the kernel writes no floats).
__nv_bfloat16 *cuda_held_output(float **out, long n);
// For an activation backward's `act` (or NULL), whose copy it can write from the values it
// recomputes: the copy to write when act is held, or stored but not yet written; NULL when
// act is not held or its stored copy is already there.
__nv_bfloat16 *cuda_held_recomputed_copy(const float *act, long n);
// x's values as bf16 when x is stored (hold_stored) and written: its own memory; else NULL
// (the reader reads x's floats). An activation's input (gate, up) reads them so.
const __nv_bfloat16 *cuda_stored_values(const float *x, long n);
// out[i, o] += bias[o] for N rows of OC.
void cuda_add_bias(float *out, const float *bias, long N, int OC);
void cuda_weight_cache_mark_stale(const void *ptr, size_t bytes);
// For a kernel about to rewrite the fp32 weights [weight, weight + n) that will write their
// bf16 copy too: where in the cached copies to write it -- a copy of exactly this range
// (valid from then on), or a valid copy of a larger range around it (which stays valid) --
// or NULL when there is none. Every other cached copy touching the range goes stale.
__nv_bfloat16 *cuda_weight_cache_claim(const float *weight, long n);
void cuda_weight_cache_release(const void *ptr, size_t bytes);
void cuda_matmul_accumulate(float *out, const float *inp, const float *weight, int N, int IC, int OC);
void cuda_matmul_forward_residual(float *out, const float *inp, const float *weight, const float *bias,
                                  const float *residual, int N, int IC, int OC);
void cuda_matmul_forward(float *out, const float *inp, const float *weight, const float *bias,
                         int N, int IC, int OC);
void cuda_matmul_forward_parts(float *const *outs, const int *widths, int parts, const float *inp,
                               const float *weight, const float *bias, int N, int IC, const InputRmsNorm *norm);
void cuda_matmul_forward_glu(float *act, float *gate, float *up, const float *inp, const float *weight, int N,
                             int IC, int I, bool use_gelu, const InputRmsNorm *norm);
void cuda_matmul_forward_parts_q8(float *const *outs, const Q8Matrix *const *weights, const float *const *biases,
                                  int parts, const float *inp, int N, int IC, int kernel_rows,
                                  const InputRmsNorm *norm);
void cuda_matmul_forward_glu_q8(float *act, float *gate, float *up, const float *inp, const Q8Matrix *gate_weight,
                                const Q8Matrix *up_weight, int N, int IC, int width, bool use_gelu,
                                int kernel_rows, const InputRmsNorm *norm);
void cuda_matmul_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                          const float *inp, const float *weight, int N, int IC, int OC, WriteMode dinp_mode,
                          WriteMode weight_mode);

// ---- matmul_quantized.cu ----
void cuda_matmul_forward_q8(float *out, const float *inp, const Q8Matrix *weight, const float *bias, int N, int IC,
                            int OC, int kernel_rows);
void cuda_matmul_forward_dequantized(float *out, const float *inp, const Q8Matrix *weight, const float *bias, int N,
                                     int IC, int OC);
void cuda_matmul_backward_input_q8(float *dinp, const float *dout, const Q8Matrix *weight, int N, int IC, int OC);
void cuda_dequantize_rows(float *out, const Q8Matrix *weight, int first, int count);
void cuda_embedding_forward_q8(float *out, const int *tokens, const int *positions, const Q8Matrix *tok_emb,
                               const float *pos_emb, int N, int C, float scale);

// ---- embedding.cu ----
void cuda_embedding_forward(float *out, const int *tokens, const int *positions,
                            const float *tok_emb, const float *pos_emb, int N, int C, float scale);
void cuda_embedding_backward(float *d_tok_emb, float *d_pos_emb, const float *dout,
                             const int *tokens, const int *positions, int N, int C, float scale);

// ---- norm.cu ----
void cuda_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                            const float *weight, const float *bias, int N, int C, float eps);
void cuda_layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                             const float *inp, const float *weight, const float *mean,
                             const float *rstd, int N, int C);
void cuda_rmsnorm_forward(float *out, float *rstd, const float *inp, const float *weight, int N,
                          int C, float eps, bool weight_plus_one);
void cuda_rmsnorm_backward(float *dinp, float *dweight, const float *dout, const float *inp,
                           const float *weight, const float *rstd, int N, int C,
                           bool weight_plus_one);

// ---- rope.cu ----
void cuda_rope_forward(float *x, const int *positions, int N, int n_heads, int head_dim,
                       const float *inv_freq);
void cuda_rope_backward(float *dx, const int *positions, int N, int n_heads, int head_dim,
                        const float *inv_freq);
// The backward over rows row_stride floats apart, rotating the first n_heads heads of each
// (the rotary attention's dq and dk in a fused q | k | v gradient: its first H + KV heads);
// dx_copy (or NULL): where the bf16 copy of the whole rows [N, row_stride] is written, the
// columns past the rotated heads as they are (the caller's cuda_held_copy_to_write).
void cuda_rope_backward_rows(float *dx, __nv_bfloat16 *dx_copy, int row_stride, const int *positions, int N,
                             int n_heads, int head_dim, const float *inv_freq);

// ---- attention.cu ----
void cuda_attention_forward(float *out, float *probs, const float *q, const float *k,
                            const float *v, const int *row_start, int B, int T, int n_heads,
                            int n_kv_heads, int head_dim, float softcap, int window);
long cuda_attention_saved_size(int B, int T, int n_heads, int n_kv_heads, int head_dim, float softcap, int window);
void cuda_attention_backward(float *dq, float *dk, float *dv, const float *dout, const float *out,
                             const float *probs, const float *q, const float *k, const float *v,
                             const int *row_start, int B, int T, int n_heads, int n_kv_heads,
                             int head_dim, float softcap, int window);
void cuda_attention_forward_rotary(float *out, float *saved, const float *q, const float *k, const float *v,
                                   int q_row_stride, int kv_row_stride, const int *row_start, const int *positions,
                                   const float *inv_freq, int B, int T, int n_heads, int n_kv_heads, int head_dim,
                                   float softcap, int window);
void cuda_attention_backward_rotary(float *dq, float *dk, float *dv, const float *dout, const float *out,
                                    const float *saved, const float *q, const float *k, const float *v,
                                    int q_row_stride, int kv_row_stride, const int *row_start, const int *positions,
                                    const float *inv_freq, int B, int T, int n_heads, int n_kv_heads, int head_dim,
                                    float softcap, int window);
void cuda_attention_decode(float *out, const float *q, const float *k_cache,
                           const float *v_cache, const int *row_start, int B, int capacity,
                           int length, int n_heads, int n_kv_heads, int head_dim, float softcap, int window);
void cuda_attention_decode_f16(float *out, const float *q, const uint16_t *k_cache, const uint16_t *v_cache,
                               const int *row_start, int B, int capacity, int length, int n_heads, int n_kv_heads,
                               int head_dim, float softcap, int window);
void cuda_cache_write_f16(uint16_t *cache, const float *x, int B, int T, int capacity, int slot, int width);
void cuda_attention_extend(float *out, const float *q, const float *k_cache, const float *v_cache,
                           const int *row_start, int B, int T, int capacity, int first_slot, int n_heads,
                           int n_kv_heads, int head_dim, float softcap, int window);
void cuda_attention_extend_f16(float *out, const float *q, const uint16_t *k_cache, const uint16_t *v_cache,
                               const int *row_start, int B, int T, int capacity, int first_slot, int n_heads,
                               int n_kv_heads, int head_dim, float softcap, int window);
void cuda_rotate_and_cache_write(float *q, float *k, const float *v, void *k_cache, void *v_cache, KvCacheType type,
                                 const int *positions, int B, int T, int capacity, int slot, int n_heads,
                                 int n_kv_heads, int head_dim, const float *inv_freq);
void cuda_cache_write_q8(void *cache, const float *x, int B, int T, int capacity, int slot, int n_kv_heads,
                         int head_dim);
void cuda_attention_decode_q8(float *out, const float *q, const void *k_cache, const void *v_cache,
                              const int *row_start, int B, int capacity, int length, int n_heads, int n_kv_heads,
                              int head_dim, float softcap, int window);
void cuda_attention_extend_q8(float *out, const float *q, const void *k_cache, const void *v_cache,
                              const int *row_start, int B, int T, int capacity, int first_slot, int n_heads,
                              int n_kv_heads, int head_dim, float softcap, int window);

// ---- activation.cu ----
void cuda_gelu_forward(float *out, const float *inp, long n);
void cuda_gelu_backward(float *dinp, const float *dout, const float *inp, const float *act, long n);
void cuda_glu_forward(float *out, const float *gate, const float *up, long n, bool use_gelu);
void cuda_glu_backward(float *dgate, float *dup, const float *dout, const float *gate,
                       const float *up, const float *act, long n, bool use_gelu);

// ---- dropout.cu ----
void cuda_dropout_forward(float *out, const float *inp, long n, float p, uint64_t seed, uint64_t stream);
void cuda_dropout_backward(float *dinp, const float *dout, long n, float p, uint64_t seed, uint64_t stream);
void cuda_uniform_noise_add(float *x, long n, float magnitude, uint64_t seed, uint64_t stream);

// ---- dora.cu ----
void cuda_dora_weight_norm(float *norm, const float *weight, const float *delta, float scale, int rows, int cols);
void cuda_dora_forward(float *out, float *z, const float *base, const float *bias, const float *magnitude,
                       const float *norm, int N, int OC);
void cuda_dora_backward(float *dmagnitude, float *dscaled, const float *dout, const float *z, const float *magnitude,
                        const float *norm, float shift, int N, int OC);

// ---- logprob.cu ----
void cuda_logprob_forward(float *logp, float *lse, int *top1, float *entropy,
                          const float *logits, const int *targets, int N, int V);
void cuda_collision_entropy_forward(float *collision, const float *logits, int N, int V);
void cuda_logprob_backward(float *logits_to_dlogits, const float *dlogp, const float *dentropy,
                           const int *targets, const float *lse, int N, int V, float softcap);

// ---- sampling.cu ----
void cuda_sample_rows(int *tokens, float *logprobs, float *sampling_logprobs, const float *logits,
                      const float *inv_temperature, const double *uniform, int N, int V);
void cuda_sampling_candidates(int *counts, int *ids, float *values, double *lse, double *scaled_lse,
                              const float *logits, const float *inv_temperature, const int *top_k, int N, int V,
                              int capacity);
void cuda_soft_cap_forward(float *x, long n, float cap);
void cuda_value_head_forward(float *values, const float *hidden, const float *weight, int N,
                             int C);
void cuda_value_head_backward(float *dhidden, float *dweight, const float *dvalues,
                              const float *hidden, const float *weight, int N, int C);

// ---- optimizer.cu ----
void cuda_adamw_update(float *params, const float *grads, float *m, float *v, long n, float lr,
                       float beta1, float beta2, float eps, float weight_decay,
                       float bias_correction1, float bias_correction2, float grad_scale);
double cuda_sum_squares(const float *x, long n);
void cuda_moving_average(float *average, const float *x, float beta, long n);
