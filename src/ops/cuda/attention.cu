// Causal, padding-aware attention with grouped K/V heads. Three implementations, chosen
// by ops_cuda_select_attention (or $MARLHF_CUDA_ATTENTION when the device opens):
//  - "mma" (attention_mma.cu), the default for head_dim 16, 32, 64 and 128: fused on
//    mma.sync with the scores in registers (FlashAttention-2's layout), the saved state one
//    log-sum-exp per query row; the fastest on the H200 (2026-12-04: forward 9.8 ms and
//    backward 21.1 ms per 1B step, against 23.7 and 61.3 for wmma), and checked there as
//    on the CPU through an emulation (tests/test_attention_emulated.cpp);
//  - "wmma" (attention_fused.cu): the same contract on WMMA fragments, each score tile
//    round-tripping through shared memory (the first fused kernels, kept as a second
//    implementation to check against);
//  - "unfused" (this file), for any head_dim and as a reference: matrix products on the
//    tensor cores plus two softmax kernels, saving the fp32 probabilities.
// Either fused choice falls back to the unfused path for another head_dim, and for a
// head_dim whose kernels need more shared memory per block than the device has (the mma
// backward at head_dim 128 takes 103 KB: more than an sm_86/sm_89 GPU's 99 KB). The choice
// must be made before a model sizes its activations (attention_saved_size).
//
// The unfused path:
// Q, K and V arrive as rows [B*T, heads*hd]. They are gathered into head-major bf16
// copies [B, H, T, hd] (K and V repeated for the heads of their group; attention_gather.cuh,
// whose gathers the fused paths use too), so that every product is one strided batch over
// the B*H (row, head) pairs:
//   forward:  S = scale Q K^T (fp32, into probs) -> masked softmax -> O = P V
//   backward: dV = P^T dO, dP = dO V^T, dS = P (dP - rowsum(P dP)), dQ = scale dS K,
//             dK = scale dS^T Q
// Per-head gradients of K and V are then added over the heads of each group in a fixed
// order (no atomics). The saved probabilities are fp32 [B, H, T, T], as on the CPU; the
// products read bf16 copies. The upper triangle is computed and masked, not skipped.
// Gemma 2's soft cap (softcap > 0) runs here only: the softmax reads cap * tanh(s / cap) of
// each score, and the backward recomputes S to multiply dS by the slope 1 - tanh^2(s / cap).
#include <cuda_fp16.h>
#include <math.h>
#include <string.h>

#include "ops/attention_window.h"
#include "ops/cuda/attention_cached.cuh"
#include "ops/cuda/attention_fused.cuh"
#include "ops/cuda/attention_gather.cuh"

// "mma-plain" is the mma kernels' PLAIN variant (attention_mma.cuh), kept selectable so that
// a GPU run measures it beside the TUNED one that "mma" runs; "mma-ds" is TUNED with the
// scores' gradient kept from the dK/dV kernel for the dQ kernel (not the default until a
// GPU has measured it against "mma").
enum AttentionKernels { KERNELS_UNFUSED, KERNELS_WMMA, KERNELS_MMA, KERNELS_MMA_PLAIN, KERNELS_MMA_DS, KERNELS_COUNT };
static const char *const kernel_names[] = {"unfused", "wmma", "mma", "mma-plain", "mma-ds"};
static AttentionKernels selected = KERNELS_MMA;

static bool mma_selected(void) {
    return selected == KERNELS_MMA || selected == KERNELS_MMA_PLAIN || selected == KERNELS_MMA_DS;
}

extern "C" bool ops_cuda_select_attention(const char *kernels) {
    for (int i = 0; i < KERNELS_COUNT; i++)
        if (!strcmp(kernels, kernel_names[i])) {
            selected = (AttentionKernels)i;
            return true;
        }
    return false;
}

extern "C" const char *ops_cuda_attention_kernels(void) { return kernel_names[selected]; }

// The fused kernels take no soft cap; a sliding window shorter than the rows only the mma ones.
static bool use_fused(int head_dim, float softcap, int window, int T) {
    if (selected == KERNELS_UNFUSED || softcap > 0.0f || (selected == KERNELS_WMMA && window > 0 && window < T) ||
        !cuda_fused_attention_supports(head_dim))
        return false;
    const size_t shared = mma_selected() ? cuda_mma_attention_shared_bytes(head_dim)
                                         : cuda_wmma_attention_shared_bytes(head_dim);
    return shared <= cuda_shared_memory_per_block();
}

// The mma kernels' saved state: the forward's log-sum-exps [B, H, T], then the head-major
// bf16 copies of Q [B, H, T, hd], K and V [B, KV, T, hd] that the forward gathered, which the
// backward reads instead of gathering them again. Each part starts 16 bytes aligned
// (cp.async reads them): the log-sum-exps are padded to 4 floats, and the bf16 parts are
// multiples of 32 bytes (hd is a multiple of 16 for the fused kernels).
struct MmaSaved {
    float *lse;
    __nv_bfloat16 *Q, *K, *V;
};

static long mma_saved_lse_floats(int B, int T, int H) { return ((long)B * H * T + 3) / 4 * 4; }

static long mma_saved_floats(int B, int T, int H, int KV, int hd) {
    const long q_n = (long)B * H * T * hd, kv_n = (long)B * KV * T * hd;
    return mma_saved_lse_floats(B, T, H) + (q_n + 2 * kv_n) / 2;
}

static MmaSaved mma_saved_parts(float *saved, int B, int T, int H, int KV, int hd) {
    MmaSaved parts;
    parts.lse = saved;
    parts.Q = (__nv_bfloat16 *)(saved + mma_saved_lse_floats(B, T, H));
    parts.K = parts.Q + (long)B * H * T * hd;
    parts.V = parts.K + (long)B * KV * T * hd;
    return parts;
}

long cuda_attention_saved_size(int B, int T, int n_heads, int n_kv_heads, int head_dim, float softcap, int window) {
    if (!use_fused(head_dim, softcap, window, T)) return (long)B * n_heads * T * T;
    return mma_selected() ? mma_saved_floats(B, T, n_heads, n_kv_heads, head_dim) : (long)B * n_heads * T;
}

const float *cuda_attention_row_dot(const float *dout, const float *out, int B, int H, int T, int head_dim) {
    float *D = (float *)cuda_scratch(SCRATCH_ATT_ROWDOT, (size_t)B * H * T * sizeof(float));
    const int warps_per_block = attention_gather::THREADS / 32;
    attention_gather::row_dot_kernel<<<grid_for((long)B * H * T, warps_per_block), attention_gather::THREADS>>>(
        D, dout, out, B, H, T, head_dim);
    CUDA_CHECK_LAUNCH();
    return D;
}

// out [B, n_heads, T, hd] bf16 from in's rows (row_stride floats apart), head h reading
// input head h / group.
static void gather_heads_into(__nv_bfloat16 *out, const float *in, int row_stride, int B, int T, int n_heads,
                              int group, int head_dim) {
    const long n = (long)B * n_heads * T * head_dim;
    const long items_per_head = (long)B * T * (head_dim / 8);
    const int threads = attention_gather::THREADS;
    if (attention_gather::gathers_by_eight(in, row_stride, B, T, n_heads, head_dim))
        attention_gather::gather_heads_by_eight_kernel<<<dim3(grid_for(items_per_head, threads), n_heads), threads>>>(
            out, in, row_stride, B, T, n_heads, group, head_dim);
    else
        attention_gather::gather_heads_kernel<<<grid_for(n, threads), threads>>>(out, in, row_stride, B, T, n_heads,
                                                                                group, head_dim);
    CUDA_CHECK_LAUNCH();
}

// The same from rows of their own ([B*T, (n_heads / group) * hd]) into a scratch slot.
static __nv_bfloat16 *gather_heads(int slot, const float *in, int B, int T, int n_heads, int group,
                                   int head_dim) {
    const long n = (long)B * n_heads * T * head_dim;
    __nv_bfloat16 *out = (__nv_bfloat16 *)cuda_scratch(slot, (size_t)n * sizeof(__nv_bfloat16));
    gather_heads_into(out, in, n_heads / group * head_dim, B, T, n_heads, group, head_dim);
    return out;
}

// dO [B, H, T, hd] bf16 (a scratch slot) and D [B, H, T] (cuda_attention_row_dot's slot).
static __nv_bfloat16 *gather_dout_with_row_dot(const float **D, const float *dout, const float *out, int B, int T,
                                               int H, int head_dim) {
    if (!attention_gather::gathers_dout_by_eight(dout, out, B, T, H, head_dim)) {
        *D = cuda_attention_row_dot(dout, out, B, H, T, head_dim);
        return gather_heads(SCRATCH_ATT_DOUT, dout, B, T, H, 1, head_dim);
    }
    const long n = (long)B * H * T * head_dim, items_per_head = (long)B * T * (head_dim / 8);
    __nv_bfloat16 *dO = (__nv_bfloat16 *)cuda_scratch(SCRATCH_ATT_DOUT, (size_t)n * sizeof(__nv_bfloat16));
    float *row_dot = (float *)cuda_scratch(SCRATCH_ATT_ROWDOT, (size_t)B * H * T * sizeof(float));
    const int threads = attention_gather::THREADS;
    attention_gather::gather_dout_by_eight_kernel<<<dim3(grid_for(items_per_head, threads), H), threads>>>(
        dO, row_dot, dout, out, B, T, H, head_dim);
    CUDA_CHECK_LAUNCH();
    *D = row_dot;
    return dO;
}

// out[b*T + t, g*hd + d] = sum over the `group` heads h of group g of in[b, h, t, d],
// added in head order.
__global__ static void scatter_heads_kernel(float *out, const float *in, int B, int T,
                                            int n_heads, int group, int head_dim) {
    int n_out_heads = n_heads / group;
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    long total = (long)B * T * n_out_heads * head_dim;
    if (i >= total) return;
    int d = (int)(i % head_dim);
    long rest = i / head_dim;
    int g = (int)(rest % n_out_heads);
    long bt = rest / n_out_heads;
    int b = (int)(bt / T), t = (int)(bt % T);
    float sum = 0.0f;
    for (int r = 0; r < group; r++) {
        int h = g * group + r;
        sum += in[(((long)b * n_heads + h) * T + t) * head_dim + d];
    }
    out[i] = sum;
}

static void scatter_heads(float *out, const float *in, int B, int T, int n_heads, int group,
                          int head_dim) {
    long n = (long)B * T * (n_heads / group) * head_dim;
    scatter_heads_kernel<<<grid_for(n, 256), 256>>>(out, in, B, T, n_heads, group, head_dim);
    CUDA_CHECK_LAUNCH();
}

enum { SOFTMAX_THREADS = 256 };

// One block per query row (b, h, t): probabilities over keys first <= j <= t (first: the
// row's first token, or its window's), zero elsewhere; a query before row_start (left
// padding) gets an all-zero row. Under a soft cap
// (the CPU's cpu_soft_cap) each thread caps its window scores in place first; the block
// reductions' barriers publish them before the last loop, which splits the row otherwise.
__global__ static void masked_softmax_kernel(float *probs, __nv_bfloat16 *probs16,
                                             const int *row_start, int n_heads, int T, float softcap,
                                             int window) {
    long row = blockIdx.x;
    int t = (int)(row % T);
    int b = (int)(row / T / n_heads);
    int row_first = row_start ? row_start[b] : 0;
    float *p = probs + row * T;
    __nv_bfloat16 *p16 = probs16 + row * T;
    if (t < row_first) {
        for (int j = threadIdx.x; j < T; j += blockDim.x) p[j] = 0.0f, p16[j] = __float2bfloat16(0.0f);
        return;
    }
    const int start = attention_first_key(row_first, t, window);
    if (softcap > 0.0f)
        for (int j = start + threadIdx.x; j <= t; j += blockDim.x) p[j] = softcap * tanhf(p[j] / softcap);
    float max_score = -INFINITY;
    for (int j = start + threadIdx.x; j <= t; j += blockDim.x) max_score = fmaxf(max_score, p[j]);
    max_score = block_max(max_score);
    double sum = 0;
    for (int j = start + threadIdx.x; j <= t; j += blockDim.x) sum += expf(p[j] - max_score);
    float inv_sum = (float)(1.0 / block_sum(sum));
    for (int j = threadIdx.x; j < T; j += blockDim.x) {
        float value = j >= start && j <= t ? expf(p[j] - max_score) * inv_sum : 0.0f;
        p[j] = value;
        p16[j] = __float2bfloat16(value);
    }
}

// dS = P (dP - sum_j P dP) inside the row's window, zero outside; written as bf16. Under a
// soft cap, times 1 - tanh^2(s / cap), s the uncapped scores (`scores`, else NULL).
__global__ static void softmax_backward_kernel(__nv_bfloat16 *dscores16, const float *dprobs,
                                               const float *probs, const float *scores, float softcap,
                                               const int *row_start, int n_heads, int T, int window) {
    long row = blockIdx.x;
    int t = (int)(row % T);
    int b = (int)(row / T / n_heads);
    int row_first = row_start ? row_start[b] : 0;
    // A padding query (t < row_first) has no keys: every value below is 0 for it.
    int start = t < row_first ? row_first : attention_first_key(row_first, t, window);
    const float *p = probs + row * T, *dp = dprobs + row * T;
    __nv_bfloat16 *ds = dscores16 + row * T;
    double dot = 0;
    if (t >= start)
        for (int j = start + threadIdx.x; j <= t; j += blockDim.x) dot += (double)p[j] * dp[j];
    float dotf = (float)block_sum(dot);
    for (int j = threadIdx.x; j < T; j += blockDim.x) {
        float value = t >= start && j >= start && j <= t ? p[j] * (dp[j] - dotf) : 0.0f;
        if (scores) {
            const float capped = tanhf(scores[row * T + j] / softcap);
            value *= 1.0f - capped * capped;
        }
        ds[j] = __float2bfloat16(value);
    }
}

// The mma forward once Q, K and V are in its saved state.
static void mma_forward_from_saved(float *out, const MmaSaved &saved, const int *row_start, int B, int T, int H,
                                   int KV, int hd, int window) {
    // The output is the o projection's input: when the model holds it, the kernel writes
    // its bf16 copy too (the other paths leave the copy to the product's conversion).
    __nv_bfloat16 *out_copy = cuda_held_copy_to_write(out, (long)B * T * H * hd);
    cuda_mma_attention_forward(out, out_copy, saved.lse, saved.Q, saved.K, saved.V, row_start, B, H, KV, T, hd, window,
                               selected == KERNELS_MMA_PLAIN);
}

// The mma backward, reading Q, K and V from the forward's saved state; dq's rows
// q_row_stride floats apart, dk's and dv's kv_row_stride.
static void mma_backward(float *dq, float *dk, float *dv, int q_row_stride, int kv_row_stride, const float *dout,
                         const float *out, const float *probs, const int *row_start, int B, int T, int H, int KV,
                         int hd, int window) {
    const MmaSaved saved = mma_saved_parts(const_cast<float *>(probs), B, T, H, KV, hd);
    const float *D;
    const __nv_bfloat16 *dO = gather_dout_with_row_dot(&D, dout, out, B, T, H, hd);
    cuda_mma_attention_backward(dq, dk, dv, q_row_stride, kv_row_stride, saved.Q, saved.K, saved.V, dO, saved.lse, D,
                                row_start, B, H, KV, T, hd, window, selected == KERNELS_MMA_PLAIN,
                                selected == KERNELS_MMA_DS);
}

void cuda_attention_forward(float *out, float *probs, const float *q, const float *k,
                            const float *v, const int *row_start, int B, int T, int n_heads,
                            int n_kv_heads, int head_dim, float softcap, int window) {
    if (B == 0 || T == 0) return;
    const int H = n_heads, hd = head_dim, group = n_heads / n_kv_heads;
    const float scale = 1.0f / sqrtf((float)hd);
    const int batch = B * H;
    const long long head_stride = (long long)T * hd, score_stride = (long long)T * T;
    const bool fused = use_fused(hd, softcap, window, T);
    if (fused && mma_selected()) { // Q, K, V gathered into the saved state, for the backward too
        const MmaSaved saved = mma_saved_parts(probs, B, T, H, n_kv_heads, hd);
        gather_heads_into(saved.Q, q, H * hd, B, T, H, 1, hd);
        gather_heads_into(saved.K, k, n_kv_heads * hd, B, T, n_kv_heads, 1, hd);
        gather_heads_into(saved.V, v, n_kv_heads * hd, B, T, n_kv_heads, 1, hd);
        mma_forward_from_saved(out, saved, row_start, B, T, H, n_kv_heads, hd, window);
        return;
    }
    __nv_bfloat16 *Q = gather_heads(SCRATCH_ATT_Q, q, B, T, H, 1, hd);
    __nv_bfloat16 *K = gather_heads(SCRATCH_ATT_K, k, B, T, H, group, hd);
    __nv_bfloat16 *V = gather_heads(SCRATCH_ATT_V, v, B, T, H, group, hd);
    if (fused) {
        cuda_fused_attention_forward(out, probs, Q, K, V, row_start, B, H, T, hd);
        return;
    }
    // probs[t][j] = scale q_t . k_j : column-major (j, t) = K^T Q.
    cuda_gemm_bf16(true, false, T, T, hd, scale, K, hd, Q, hd, 0.0f, probs, T, batch, head_stride,
                   head_stride, score_stride);
    __nv_bfloat16 *P16 = (__nv_bfloat16 *)cuda_scratch(
        SCRATCH_ATT_P16, (size_t)batch * score_stride * sizeof(__nv_bfloat16));
    masked_softmax_kernel<<<(unsigned)((long)batch * T), SOFTMAX_THREADS>>>(probs, P16, row_start, H, T, softcap, window);
    CUDA_CHECK_LAUNCH();
    // O[t][d] = sum_j P[t][j] V[j][d] : column-major (d, t) = V(d, j) P^T(j, t).
    float *O = (float *)cuda_scratch(SCRATCH_ATT_HEADS32, (size_t)batch * head_stride * sizeof(float));
    cuda_gemm_bf16(false, false, hd, T, T, 1.0f, V, hd, P16, T, 0.0f, O, hd, batch, head_stride,
                   score_stride, head_stride);
    scatter_heads(out, O, B, T, H, 1, hd);
}

void cuda_attention_backward(float *dq, float *dk, float *dv, const float *dout, const float *out,
                             const float *probs, const float *q, const float *k, const float *v,
                             const int *row_start, int B, int T, int n_heads, int n_kv_heads,
                             int head_dim, float softcap, int window) {
    if (B == 0 || T == 0) return;
    const int H = n_heads, hd = head_dim, group = n_heads / n_kv_heads;
    const float scale = 1.0f / sqrtf((float)hd);
    const int batch = B * H;
    const long long head_stride = (long long)T * hd, score_stride = (long long)T * T;
    const bool fused = use_fused(hd, softcap, window, T);
    if (fused && mma_selected()) { // q, k and v as the forward gathered them into the saved state
        mma_backward(dq, dk, dv, H * hd, n_kv_heads * hd, dout, out, probs, row_start, B, T, H, n_kv_heads, hd,
                     window);
        return;
    }
    __nv_bfloat16 *Q = gather_heads(SCRATCH_ATT_Q, q, B, T, H, 1, hd);
    __nv_bfloat16 *K = gather_heads(SCRATCH_ATT_K, k, B, T, H, group, hd);
    __nv_bfloat16 *V = gather_heads(SCRATCH_ATT_V, v, B, T, H, group, hd);
    __nv_bfloat16 *dO = gather_heads(SCRATCH_ATT_DOUT, dout, B, T, H, 1, hd);
    if (fused) {
        cuda_fused_attention_backward(dq, dk, dv, dout, out, Q, K, V, dO, probs, row_start, B, H, n_kv_heads, T, hd);
        return;
    }
    // The forward's bf16 probabilities may have been overwritten by a later layer.
    __nv_bfloat16 *P16 = (__nv_bfloat16 *)cuda_scratch(
        SCRATCH_ATT_P16, (size_t)batch * score_stride * sizeof(__nv_bfloat16));
    cuda_to_bf16(P16, probs, (long)batch * score_stride);
    float *heads = (float *)cuda_scratch(SCRATCH_ATT_HEADS32, (size_t)batch * head_stride * sizeof(float));

    // dV[j][d] = sum_t P[t][j] dO[t][d] : column-major (d, j) = dO(d, t) P(t, j).
    cuda_gemm_bf16(false, true, hd, T, T, 1.0f, dO, hd, P16, T, 0.0f, heads, hd, batch,
                   head_stride, score_stride, head_stride);
    scatter_heads(dv, heads, B, T, H, group, hd); // the op overwrites dq, dk, dv (ops.h)

    // dP[t][j] = dO_t . V_j : column-major (j, t) = V^T dO.
    float *dP = (float *)cuda_scratch(SCRATCH_ATT_DS32, (size_t)batch * score_stride * sizeof(float));
    cuda_gemm_bf16(true, false, T, T, hd, 1.0f, V, hd, dO, hd, 0.0f, dP, T, batch, head_stride,
                   head_stride, score_stride);
    __nv_bfloat16 *dS = (__nv_bfloat16 *)cuda_scratch(
        SCRATCH_ATT_DS16, (size_t)batch * score_stride * sizeof(__nv_bfloat16));
    float *scores = NULL; // the uncapped scores, as the forward computed them, for the cap's slope
    if (softcap > 0.0f) {
        scores = (float *)cuda_scratch(SCRATCH_ATT_S32, (size_t)batch * score_stride * sizeof(float));
        cuda_gemm_bf16(true, false, T, T, hd, scale, K, hd, Q, hd, 0.0f, scores, T, batch, head_stride, head_stride,
                       score_stride);
    }
    softmax_backward_kernel<<<(unsigned)((long)batch * T), SOFTMAX_THREADS>>>(dS, dP, probs, scores, softcap, row_start,
                                                                              H, T, window);
    CUDA_CHECK_LAUNCH();

    // dQ[t][d] = scale sum_j dS[t][j] K[j][d] : column-major (d, t) = K(d, j) dS^T(j, t).
    cuda_gemm_bf16(false, false, hd, T, T, scale, K, hd, dS, T, 0.0f, heads, hd, batch,
                   head_stride, score_stride, head_stride);
    scatter_heads(dq, heads, B, T, H, 1, hd);
    // dK[j][d] = scale sum_t dS[t][j] Q[t][d] : column-major (d, j) = Q(d, t) dS(t, j).
    cuda_gemm_bf16(false, true, hd, T, T, scale, Q, hd, dS, T, 0.0f, heads, hd, batch,
                   head_stride, score_stride, head_stride);
    scatter_heads(dk, heads, B, T, H, group, hd);
}

// Attention against the KV cache (decode steps, the prompt cache): attention_cached.cuh's
// kernel over each kind of cache.
template <typename Slots>
static void launch_attention_cached(float *out, const float *q, Slots keys, Slots values, const int *row_start, int B,
                                    int T, int first_slot, int capacity, int n_heads, int n_kv_heads, int head_dim,
                                    float softcap, int window) {
    if (B == 0 || T == 0) return;
    CHECK(head_dim <= attention_cached::MAX_HEAD_DIM, "attention against the KV cache: head_dim %d is over %d", head_dim,
          (int)attention_cached::MAX_HEAD_DIM);
    using attention_cached::Plan;
    const Plan plan = attention_cached::plan(B, T, first_slot, n_heads, n_kv_heads, head_dim, window,
                                             attention_cached::TARGET_BLOCKS);
    float *partial = plan.splits > 1
                         ? (float *)cuda_scratch(SCRATCH_ATT_DECODE_SPLITS, attention_cached::partial_bytes(plan, n_heads))
                         : NULL;
    const dim3 grid(attention_cached::blocks_x(plan, n_kv_heads), (unsigned)plan.splits);
    attention_cached::attention_kernel<Slots><<<grid, attention_cached::THREADS, attention_cached::shared_bytes(plan)>>>(
        out, partial, q, keys, values, row_start, T, capacity, first_slot, n_heads, n_kv_heads,
        1.0f / sqrtf((float)head_dim), softcap, window, plan);
    CUDA_CHECK_LAUNCH();
    if (plan.splits > 1) {
        attention_cached::combine_kernel<<<(unsigned)(plan.queries * n_heads), attention_cached::THREADS>>>(out, partial,
                                                                                                        plan);
        CUDA_CHECK_LAUNCH();
    }
}

static attention_cached::FloatSlots float_slots(const float *cache, int n_kv_heads, int head_dim) {
    return {cache, n_kv_heads * head_dim, head_dim};
}
static attention_cached::HalfSlots half_slots(const uint16_t *cache, int n_kv_heads, int head_dim) {
    return {cache, n_kv_heads * head_dim, head_dim};
}
static attention_cached::Q8Slots q8_slots(const void *cache, int n_kv_heads, int head_dim) {
    return {(const uint8_t *)cache, attention_cached::q8_layout(n_kv_heads, head_dim)};
}

void cuda_attention_decode(float *out, const float *q, const float *k_cache, const float *v_cache,
                           const int *row_start, int B, int capacity, int length, int n_heads, int n_kv_heads,
                           int head_dim, float softcap, int window) {
    launch_attention_cached(out, q, float_slots(k_cache, n_kv_heads, head_dim), float_slots(v_cache, n_kv_heads, head_dim),
                            row_start, B, 1, length - 1, capacity, n_heads, n_kv_heads, head_dim, softcap, window);
}

void cuda_attention_decode_f16(float *out, const float *q, const uint16_t *k_cache, const uint16_t *v_cache,
                               const int *row_start, int B, int capacity, int length, int n_heads, int n_kv_heads,
                               int head_dim, float softcap, int window) {
    launch_attention_cached(out, q, half_slots(k_cache, n_kv_heads, head_dim), half_slots(v_cache, n_kv_heads, head_dim),
                            row_start, B, 1, length - 1, capacity, n_heads, n_kv_heads, head_dim, softcap, window);
}

void cuda_attention_decode_q8(float *out, const float *q, const void *k_cache, const void *v_cache,
                              const int *row_start, int B, int capacity, int length, int n_heads, int n_kv_heads,
                              int head_dim, float softcap, int window) {
    launch_attention_cached(out, q, q8_slots(k_cache, n_kv_heads, head_dim), q8_slots(v_cache, n_kv_heads, head_dim),
                            row_start, B, 1, length - 1, capacity, n_heads, n_kv_heads, head_dim, softcap, window);
}

void cuda_attention_extend(float *out, const float *q, const float *k_cache, const float *v_cache,
                           const int *row_start, int B, int T, int capacity, int first_slot, int n_heads,
                           int n_kv_heads, int head_dim, float softcap, int window) {
    launch_attention_cached(out, q, float_slots(k_cache, n_kv_heads, head_dim), float_slots(v_cache, n_kv_heads, head_dim),
                            row_start, B, T, first_slot, capacity, n_heads, n_kv_heads, head_dim, softcap, window);
}

void cuda_attention_extend_f16(float *out, const float *q, const uint16_t *k_cache, const uint16_t *v_cache,
                               const int *row_start, int B, int T, int capacity, int first_slot, int n_heads,
                               int n_kv_heads, int head_dim, float softcap, int window) {
    launch_attention_cached(out, q, half_slots(k_cache, n_kv_heads, head_dim), half_slots(v_cache, n_kv_heads, head_dim),
                            row_start, B, T, first_slot, capacity, n_heads, n_kv_heads, head_dim, softcap, window);
}

void cuda_attention_extend_q8(float *out, const float *q, const void *k_cache, const void *v_cache,
                              const int *row_start, int B, int T, int capacity, int first_slot, int n_heads,
                              int n_kv_heads, int head_dim, float softcap, int window) {
    launch_attention_cached(out, q, q8_slots(k_cache, n_kv_heads, head_dim), q8_slots(v_cache, n_kv_heads, head_dim),
                            row_start, B, T, first_slot, capacity, n_heads, n_kv_heads, head_dim, softcap, window);
}

void cuda_cache_write_q8(void *cache, const float *x, int B, int T, int capacity, int slot, int n_kv_heads,
                         int head_dim) {
    if (B == 0 || T == 0) return;
    const attention_cached::Q8Layout layout = attention_cached::q8_layout(n_kv_heads, head_dim);
    attention_cached::write_q8_kernel<<<attention_cached::write_blocks(layout, B, T), attention_cached::THREADS>>>(
        (uint8_t *)cache, x, layout, B, T, capacity, slot);
    CUDA_CHECK_LAUNCH();
}

// ops.h rotate_and_cache_write: one launch (attention_cached.cuh's rotate_and_store_kernel) for
// what rope_forward twice and two cache writes do in four. A held q or k gets its bf16 copy
// written with the rotation, as rope_forward writes it.
void cuda_rotate_and_cache_write(float *q, float *k, const float *v, void *k_cache, void *v_cache, KvCacheType type,
                                 const int *positions, int B, int T, int capacity, int slot, int n_heads,
                                 int n_kv_heads, int head_dim, const float *inv_freq) {
    if (B == 0 || T == 0) return;
    const long N = (long)B * T, kv_width = (long)n_kv_heads * head_dim;
    if (inv_freq && head_dim / 2 == 0) inv_freq = NULL; // nothing to rotate (as rope_forward: no copy either)
    __nv_bfloat16 *q_copy = inv_freq ? cuda_held_copy_to_write(q, N * n_heads * head_dim) : NULL;
    __nv_bfloat16 *k_copy = inv_freq ? cuda_held_copy_to_write(k, N * kv_width) : NULL;
    const size_t shared = inv_freq ? (size_t)head_dim * sizeof(float) : 0;
    auto launch = [&](auto keys, auto values) { // the kernel for the cache's Store type
        attention_cached::rotate_and_store_kernel<decltype(keys)><<<B * T, attention_cached::THREADS, shared>>>(
            q, q_copy, k, k_copy, v, keys, values, positions, T, capacity, slot, n_heads, n_kv_heads, head_dim,
            inv_freq);
        CUDA_CHECK_LAUNCH();
    };
    const attention_cached::Q8Layout layout = attention_cached::q8_layout(n_kv_heads, head_dim);
    switch (type) {
    case KV_CACHE_F32:
        launch(attention_cached::FloatStore{(float *)k_cache, (int)kv_width},
               attention_cached::FloatStore{(float *)v_cache, (int)kv_width});
        break;
    case KV_CACHE_F16:
        launch(attention_cached::HalfStore{(uint16_t *)k_cache, (int)kv_width},
               attention_cached::HalfStore{(uint16_t *)v_cache, (int)kv_width});
        break;
    case KV_CACHE_Q8_0:
        launch(attention_cached::Q8Store{(uint8_t *)k_cache, layout}, attention_cached::Q8Store{(uint8_t *)v_cache, layout});
        break;
    }
}

// Row b's T slots of x ([B, T, width] floats) into slots [slot, slot + T) of a half cache,
// rounded to nearest even: one thread per element, blockIdx.y the row.
__global__ static void cache_write_f16_kernel(uint16_t *cache, const float *x, int capacity, int slot, int width,
                                              long row_elements) {
    const long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    const int b = blockIdx.y;
    if (i >= row_elements) return;
    cache[((long)b * capacity + slot) * width + i] = float_to_half_bits(x[(long)b * row_elements + i]);
}

void cuda_cache_write_f16(uint16_t *cache, const float *x, int B, int T, int capacity, int slot, int width) {
    const long row_elements = (long)T * width;
    if (B == 0 || row_elements == 0) return;
    dim3 grid((unsigned)((row_elements + 255) / 256), (unsigned)B);
    cache_write_f16_kernel<<<grid, 256>>>(cache, x, capacity, slot, width, row_elements);
    CUDA_CHECK_LAUNCH();
}

// ---- with the rotary positions applied inside (ops.h, attention_forward_rotary) ----
//
// q, k and v arrive as rows q_row_stride and kv_row_stride floats apart: rows of their own,
// or the columns of one fused q | k | v buffer (the fused q/k/v product's output), and dq,
// dk and dv go back the same way. The mma path reads and writes them where they are
// (reads_rows_in_place); the other paths take rows of their own, moved through scratch rows.

// Whether the rotary ops run on q, k, v and dq, dk, dv where they lie, at their row strides:
// on the mma path, whose gathers read rows by their stride, whose backward kernels write
// gradient rows by their stride, and whose RoPE backward rotates them in place (one launch
// over a fused buffer's rows). Elsewhere -- the wmma and unfused kernels (which also run a
// soft cap and a head_dim without mma kernels), whose products and softmax index rows by
// heads * head_dim -- the rows are copied into rows of their own and the gradients back: a
// pass over q, k and v more in the forward, and over q, k, v, dq, dk and dv in the backward.
// So are strides that are not multiples of 4 floats (no model makes them: a fused buffer's
// width is a multiple of head_dim): the gathers' float4 loads need each head's piece of a
// row 16-byte aligned, and such rows would meet the one-element gathers instead.
static bool reads_rows_in_place(int q_row_stride, int kv_row_stride, int head_dim, float softcap, int window, int T) {
    return use_fused(head_dim, softcap, window, T) && mma_selected() && q_row_stride % 4 == 0 &&
           kv_row_stride % 4 == 0;
}

// N rows of `width` floats, `row_stride` apart in x, into a scratch slot as rows of their own.
static float *rows_of_their_own(int slot, const float *x, int N, int width, int row_stride) {
    const size_t row_bytes = (size_t)width * sizeof(float);
    float *rows = (float *)cuda_scratch(slot, (size_t)N * row_bytes);
    if (row_stride == width)
        CUDA_CHECK(cudaMemcpyAsync(rows, x, (size_t)N * row_bytes, cudaMemcpyDeviceToDevice, 0));
    else
        CUDA_CHECK(cudaMemcpy2DAsync(rows, row_bytes, x, (size_t)row_stride * sizeof(float), row_bytes, (size_t)N,
                                     cudaMemcpyDeviceToDevice, 0));
    return rows;
}

// The other way: N rows of `width` floats of their own into rows `row_stride` apart in x.
static void rows_into_strided(float *x, int row_stride, const float *rows, int N, int width) {
    const size_t row_bytes = (size_t)width * sizeof(float);
    CUDA_CHECK(cudaMemcpy2DAsync(x, (size_t)row_stride * sizeof(float), rows, row_bytes, row_bytes, (size_t)N,
                                 cudaMemcpyDeviceToDevice, 0));
}

// x's n_heads heads of each of its N rows (row_stride floats apart, only read) rotated as
// rope_forward rotates, into a scratch slot as rows of their own.
static const float *rotated_copy(int slot, const float *x, int row_stride, const int *positions, const float *inv_freq,
                                 int N, int n_heads, int hd) {
    float *copy = rows_of_their_own(slot, x, N, n_heads * hd, row_stride);
    cuda_rope_forward(copy, positions, N, n_heads, hd, inv_freq);
    return copy;
}

// q or k (rows row_stride floats apart) rotated and gathered into `out` (head-major bf16):
// in one pass where the rotating gather takes it, else rotated into a scratch copy (`slot`)
// and gathered.
static void gather_rotated_into(__nv_bfloat16 *out, const float *in, int row_stride, const int *positions,
                                const float *inv_freq, int B, int T, int n_heads, int hd, int slot) {
    if (!attention_gather::gathers_rotated(in, row_stride, B, T, n_heads, hd)) {
        gather_heads_into(out, rotated_copy(slot, in, row_stride, positions, inv_freq, B * T, n_heads, hd),
                          n_heads * hd, B, T, n_heads, 1, hd);
        return;
    }
    const long items_per_head = (long)B * T * (hd / 16);
    const int threads = attention_gather::THREADS;
    const dim3 grid(grid_for(items_per_head, threads), n_heads);
    attention_gather::gather_rotated_heads_kernel<<<grid, threads, attention_gather::ROTATED_SHARED_BYTES>>>(
        out, in, row_stride, positions, inv_freq, B, T, n_heads, hd);
    CUDA_CHECK_LAUNCH();
}

// Whether the rotary ops run on the rows as they come: rows of their own, or strided rows
// the mma path reads in place; the others go through scratch rows of their own.
static bool takes_rows_as_given(int q_row_stride, int kv_row_stride, int n_heads, int n_kv_heads, int head_dim,
                                float softcap, int window, int T) {
    const bool own_rows = q_row_stride == n_heads * head_dim && kv_row_stride == n_kv_heads * head_dim;
    return own_rows || reads_rows_in_place(q_row_stride, kv_row_stride, head_dim, softcap, window, T);
}

// q, k and v (N rows, q_row_stride and kv_row_stride floats apart) moved into scratch rows of
// their own, for the paths that take none other.
static void qkv_rows_of_their_own(const float **q, const float **k, const float **v, int N, int q_dim, int kv_dim,
                                  int q_row_stride, int kv_row_stride) {
    *q = rows_of_their_own(SCRATCH_ATT_ROWS_Q, *q, N, q_dim, q_row_stride);
    *k = rows_of_their_own(SCRATCH_ATT_ROWS_K, *k, N, kv_dim, kv_row_stride);
    *v = rows_of_their_own(SCRATCH_ATT_ROWS_V, *v, N, kv_dim, kv_row_stride);
}

static void attention_forward_rotary_rows(float *out, float *saved, const float *q, const float *k, const float *v,
                                          int q_row_stride, int kv_row_stride, const int *row_start,
                                          const int *positions, const float *inv_freq, int B, int T, int n_heads,
                                          int n_kv_heads, int head_dim, float softcap, int window);
static void attention_backward_rotary_rows(float *dq, float *dk, float *dv, int q_row_stride, int kv_row_stride,
                                           const float *dout, const float *out, const float *saved, const float *q,
                                           const float *k, const float *v, const int *row_start,
                                           const int *positions, const float *inv_freq, int B, int T, int n_heads,
                                           int n_kv_heads, int head_dim, float softcap, int window);

void cuda_attention_forward_rotary(float *out, float *saved, const float *q, const float *k, const float *v,
                                   int q_row_stride, int kv_row_stride, const int *row_start, const int *positions,
                                   const float *inv_freq, int B, int T, int n_heads, int n_kv_heads, int head_dim,
                                   float softcap, int window) {
    if (B == 0 || T == 0) return;
    const int N = B * T, q_dim = n_heads * head_dim, kv_dim = n_kv_heads * head_dim;
    if (!takes_rows_as_given(q_row_stride, kv_row_stride, n_heads, n_kv_heads, head_dim, softcap, window, T)) {
        qkv_rows_of_their_own(&q, &k, &v, N, q_dim, kv_dim, q_row_stride, kv_row_stride);
        q_row_stride = q_dim, kv_row_stride = kv_dim;
    }
    attention_forward_rotary_rows(out, saved, q, k, v, q_row_stride, kv_row_stride, row_start, positions, inv_freq, B,
                                  T, n_heads, n_kv_heads, head_dim, softcap, window);
}

void cuda_attention_backward_rotary(float *dq, float *dk, float *dv, const float *dout, const float *out,
                                    const float *saved, const float *q, const float *k, const float *v,
                                    int q_row_stride, int kv_row_stride, const int *row_start, const int *positions,
                                    const float *inv_freq, int B, int T, int n_heads, int n_kv_heads, int head_dim,
                                    float softcap, int window) {
    if (B == 0 || T == 0) return;
    const int N = B * T, q_dim = n_heads * head_dim, kv_dim = n_kv_heads * head_dim;
    if (takes_rows_as_given(q_row_stride, kv_row_stride, n_heads, n_kv_heads, head_dim, softcap, window, T)) {
        attention_backward_rotary_rows(dq, dk, dv, q_row_stride, kv_row_stride, dout, out, saved, q, k, v, row_start,
                                       positions, inv_freq, B, T, n_heads, n_kv_heads, head_dim, softcap, window);
        return;
    }
    // The inputs and then the gradients through scratch rows of their own.
    qkv_rows_of_their_own(&q, &k, &v, N, q_dim, kv_dim, q_row_stride, kv_row_stride);
    float *dq_rows = (float *)cuda_scratch(SCRATCH_ATT_ROWS_DQ, (size_t)N * q_dim * sizeof(float));
    float *dk_rows = (float *)cuda_scratch(SCRATCH_ATT_ROWS_DK, (size_t)N * kv_dim * sizeof(float));
    float *dv_rows = (float *)cuda_scratch(SCRATCH_ATT_ROWS_DV, (size_t)N * kv_dim * sizeof(float));
    attention_backward_rotary_rows(dq_rows, dk_rows, dv_rows, q_dim, kv_dim, dout, out, saved, q, k, v, row_start,
                                   positions, inv_freq, B, T, n_heads, n_kv_heads, head_dim, softcap, window);
    rows_into_strided(dq, q_row_stride, dq_rows, N, q_dim);
    rows_into_strided(dk, kv_row_stride, dk_rows, N, kv_dim);
    rows_into_strided(dv, kv_row_stride, dv_rows, N, kv_dim);
}

// Strides other than rows of their own come here only on the mma path (reads_rows_in_place).
static void attention_forward_rotary_rows(float *out, float *saved, const float *q, const float *k, const float *v,
                                          int q_row_stride, int kv_row_stride, const int *row_start,
                                          const int *positions, const float *inv_freq, int B, int T, int n_heads,
                                          int n_kv_heads, int head_dim, float softcap, int window) {
    const int N = B * T;
    if (!(use_fused(head_dim, softcap, window, T) && mma_selected())) {
        // The other kernels gather from floats, in the forward and again in the backward.
        cuda_attention_forward(
            out, saved, rotated_copy(SCRATCH_ATT_ROTATED_Q, q, q_row_stride, positions, inv_freq, N, n_heads, head_dim),
            rotated_copy(SCRATCH_ATT_ROTATED_K, k, kv_row_stride, positions, inv_freq, N, n_kv_heads, head_dim), v,
            row_start, B, T, n_heads, n_kv_heads, head_dim, softcap, window);
        return;
    }
    const MmaSaved parts = mma_saved_parts(saved, B, T, n_heads, n_kv_heads, head_dim);
    gather_rotated_into(parts.Q, q, q_row_stride, positions, inv_freq, B, T, n_heads, head_dim, SCRATCH_ATT_ROTATED_Q);
    gather_rotated_into(parts.K, k, kv_row_stride, positions, inv_freq, B, T, n_kv_heads, head_dim,
                        SCRATCH_ATT_ROTATED_K);
    gather_heads_into(parts.V, v, kv_row_stride, B, T, n_kv_heads, 1, head_dim);
    mma_forward_from_saved(out, parts, row_start, B, T, n_heads, n_kv_heads, head_dim, window);
}

// dq and dk rotated back (rope_backward's inverse rotation) where they lie. Rows of their
// own: a launch each, which writes the bf16 copy of dq or dk when the model holds it (the q
// and k projections' products read it). The columns of one fused q | k | v buffer (dk and
// dv the columns after dq's, in the same rows): one launch over the H + KV heads of each row
// (q's heads and then k's, rotated alike), which, when the whole buffer is held (the fused
// product's output gradient: dq is its first float), writes the copy of every column of the
// rows, v's as the attention backward wrote them, so that the product converts nothing.
// Other strides: a launch each and no copy (a hold of rows with gaps between their heads
// would need the gaps' values too; the product converts them).
static void rope_backward_gradients(float *dq, float *dk, const float *dv, int q_row_stride, int kv_row_stride,
                                    const int *positions, const float *inv_freq, int N, int n_heads, int n_kv_heads,
                                    int head_dim) {
    const int q_dim = n_heads * head_dim, kv_dim = n_kv_heads * head_dim, width = q_dim + 2 * kv_dim;
    if (q_row_stride == q_dim && kv_row_stride == kv_dim) {
        cuda_rope_backward(dq, positions, N, n_heads, head_dim, inv_freq);
        cuda_rope_backward(dk, positions, N, n_kv_heads, head_dim, inv_freq);
    } else if (q_row_stride == width && kv_row_stride == width && dk == dq + q_dim && dv == dk + kv_dim) {
        cuda_rope_backward_rows(dq, cuda_held_copy_to_write(dq, (long)N * width), width, positions, N,
                                n_heads + n_kv_heads, head_dim, inv_freq);
    } else {
        cuda_rope_backward_rows(dq, NULL, q_row_stride, positions, N, n_heads, head_dim, inv_freq);
        cuda_rope_backward_rows(dk, NULL, kv_row_stride, positions, N, n_kv_heads, head_dim, inv_freq);
    }
}

// dq and dk come out of the attention's kernels for the rotated q and k, and are rotated
// back by the RoPE backward (rope_backward_gradients). Strides other than rows of their own
// come here only on the mma path (reads_rows_in_place).
static void attention_backward_rotary_rows(float *dq, float *dk, float *dv, int q_row_stride, int kv_row_stride,
                                           const float *dout, const float *out, const float *saved, const float *q,
                                           const float *k, const float *v, const int *row_start,
                                           const int *positions, const float *inv_freq, int B, int T, int n_heads,
                                           int n_kv_heads, int head_dim, float softcap, int window) {
    const int N = B * T;
    if (use_fused(head_dim, softcap, window, T) && mma_selected()) {
        mma_backward(dq, dk, dv, q_row_stride, kv_row_stride, dout, out, saved, row_start, B, T, n_heads, n_kv_heads,
                     head_dim, window);
    } else {
        cuda_attention_backward(
            dq, dk, dv, dout, out, saved,
            rotated_copy(SCRATCH_ATT_ROTATED_Q, q, q_row_stride, positions, inv_freq, N, n_heads, head_dim),
            rotated_copy(SCRATCH_ATT_ROTATED_K, k, kv_row_stride, positions, inv_freq, N, n_kv_heads, head_dim), v,
            row_start, B, T, n_heads, n_kv_heads, head_dim, softcap, window);
    }
    rope_backward_gradients(dq, dk, dv, q_row_stride, kv_row_stride, positions, inv_freq, N, n_heads, n_kv_heads,
                            head_dim);
}
