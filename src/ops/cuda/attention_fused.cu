// Fused ("flash") attention on the tensor cores: the T x T scores never reach device
// memory. The forward keeps, per query row, the log-sum-exp of its scaled scores; the
// backward recomputes the probabilities tile by tile from it.
//
// Inputs are the head-major bf16 copies made by attention.cu ([B, H, T, hd], K and V
// repeated for the heads of their group, followed by 64 zero rows so that a tile may run
// past the last row). Every warp works alone on 16 rows with 16x16x16 bf16 WMMA products
// and fp32 accumulators: its own rows' fragments stay in registers, the other operand's
// fragments are read from global memory (the 4 warps of a block read the same tiles, so
// they come from L1), and only the 16 x 64 score tile goes through shared memory for the
// row-wise softmax. No block-wide barrier.
//   forward      per 16 queries: pass 1 finds each row's max and sum over the key tiles,
//                pass 2 adds exp(s - max) / sum times V (no rescaling of the output)
//   backward dKV per 16 keys, for every query tile and every head of the group:
//                P^T, dP^T = V dO^T, dS^T = P^T (dP^T - D), dV += P^T dO, dK += dS^T Q
//   backward dQ  per 16 queries: dQ += dS K over the key tiles
// where D_i = dO_i . O_i. dK/dV and dQ come from separate kernels so that every gradient
// element is written by exactly one warp, in a fixed order: no atomics, bit-identical
// runs. Masks: key j is visible to query i when row_start <= j <= i; a query before
// row_start (left padding) has no keys, output 0 and log-sum-exp +inf.
#include <math.h>
#include <mma.h>

#include "ops/cuda/attention_fused.cuh"

using namespace nvcuda;

constexpr int TILE = 64, WARPS = 4, THREADS = 128;
// Per-warp shared scratch, in floats/bf16s: two fp32 16 x 64 score tiles, two bf16 16 x 64
// probability tiles; the output staging (16 x (HD+4) fp32) reuses the two score tiles.
constexpr int SCORE_LD = TILE + 4, PROB_LD = TILE + 8;
constexpr int WARP_SCRATCH_BYTES = 2 * 16 * SCORE_LD * 4 + 2 * 16 * PROB_LD * 2;

typedef wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> FragA;
typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::row_major> FragB;
typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> FragBT;
typedef wmma::fragment<wmma::accumulator, 16, 16, 16, float> FragC;

struct WarpScratch {
    float *S, *dP;          // [16][SCORE_LD]
    __nv_bfloat16 *P, *dS;  // [16][PROB_LD]
    float *out;             // [16][HD + 4], over S and dP
};

__device__ static WarpScratch warp_scratch(unsigned char *shared) {
    unsigned char *base = shared + (threadIdx.x / 32) * WARP_SCRATCH_BYTES;
    WarpScratch w;
    w.S = (float *)base;
    w.dP = w.S + 16 * SCORE_LD;
    w.P = (__nv_bfloat16 *)(w.dP + 16 * SCORE_LD);
    w.dS = w.P + 16 * PROB_LD;
    w.out = w.S;
    return w;
}

// The 16 rows starting at `rows` of a head-major [*, HD] bf16 matrix, as A fragments.
template <int HD> __device__ static void load_rows(FragA *frags, const __nv_bfloat16 *rows) {
    for (int kk = 0; kk < HD / 16; kk++) wmma::load_matrix_sync(frags[kk], rows + kk * 16, HD);
}

// C[16][64] (ld SCORE_LD) = A(16 x HD, fragments) . B^T, B = 64 rows of [*, HD] at `rows`.
template <int HD> __device__ static void scores_tile(float *C, const FragA *a, const __nv_bfloat16 *rows) {
    for (int j = 0; j < TILE / 16; j++) {
        FragC acc;
        wmma::fill_fragment(acc, 0.0f);
        for (int kk = 0; kk < HD / 16; kk++) {
            FragBT b;
            wmma::load_matrix_sync(b, rows + (long)j * 16 * HD + kk * 16, HD);
            wmma::mma_sync(acc, a[kk], b, acc);
        }
        wmma::store_matrix_sync(C + j * 16, acc, SCORE_LD, wmma::mem_row_major);
    }
}

// acc[j] += P(16 x 64, bf16 in shared, ld PROB_LD) . B(64 rows of [*, HD] at `rows`).
template <int HD> __device__ static void accumulate_tile(FragC *acc, const __nv_bfloat16 *P, const __nv_bfloat16 *rows) {
    FragA a[TILE / 16];
    for (int kk = 0; kk < TILE / 16; kk++) wmma::load_matrix_sync(a[kk], P + kk * 16, PROB_LD);
    for (int j = 0; j < HD / 16; j++)
        for (int kk = 0; kk < TILE / 16; kk++) {
            FragB b;
            wmma::load_matrix_sync(b, rows + (long)kk * 16 * HD + j * 16, HD);
            wmma::mma_sync(acc[j], a[kk], b, acc[j]);
        }
}

// Adds scale * the warp's 16 x HD accumulators into rows [row0, row0 + 16) (those < T) of
// a [B*T, width] gradient at column `column`.
template <int HD>
__device__ static void add_rows(float *grad, long width, int column, int b, int T, int row0, FragC *acc,
                                float *staging, float scale) {
    const int lane = threadIdx.x % 32;
    for (int j = 0; j < HD / 16; j++)
        wmma::store_matrix_sync(staging + j * 16, acc[j], HD + 4, wmma::mem_row_major);
    __syncwarp();
    for (int i = 0; i < 16 && row0 + i < T; i++)
        for (int d = lane; d < HD; d += 32)
            grad[((long)b * T + row0 + i) * width + column + d] += scale * staging[i * (HD + 4) + d];
    __syncwarp();
}

template <int HD>
__global__ static void __launch_bounds__(THREADS)
    fused_forward_kernel(float *out, float *lse, const __nv_bfloat16 *Q, const __nv_bfloat16 *K,
                         const __nv_bfloat16 *V, const int *row_start, int H, int T, float scale) {
    extern __shared__ __align__(128) unsigned char shared[];
    const WarpScratch w = warp_scratch(shared);
    const int lane = threadIdx.x % 32;
    const int bh = blockIdx.y, b = bh / H, h = bh % H;
    const int q0 = blockIdx.x * TILE + (threadIdx.x / 32) * 16; // this warp's first query
    if (q0 >= T) return;
    const int start = row_start ? row_start[b] : 0;
    const int q_last = min(q0 + 16, T) - 1;
    const long head = (long)bh * T; // first row of this (row, head) in Q, K, V
    const int r = lane / 2, half = lane % 2, qi = q0 + r; // two lanes per query row
    float m = -INFINITY, l = 0.0f;
    const bool any = q_last >= start; // some row of this warp sees keys
    if (any) {
        FragA q[HD / 16];
        load_rows<HD>(q, Q + (head + q0) * HD);
        // Pass 1: each row's max and sum of exp over its visible keys.
        for (int kt = start / TILE; kt <= q_last / TILE; kt++) {
            scores_tile<HD>(w.S, q, K + (head + (long)kt * TILE) * HD);
            __syncwarp();
            float tile_max = -INFINITY;
            for (int c = half * 32; c < half * 32 + 32; c++) {
                int kj = kt * TILE + c;
                float s = qi < T && kj >= start && kj <= qi ? w.S[r * SCORE_LD + c] * scale : -INFINITY;
                w.S[r * SCORE_LD + c] = s;
                tile_max = fmaxf(tile_max, s);
            }
            tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
            float m_new = fmaxf(m, tile_max), sum = 0.0f;
            if (m_new != -INFINITY)
                for (int c = half * 32; c < half * 32 + 32; c++) sum += expf(w.S[r * SCORE_LD + c] - m_new);
            sum += __shfl_xor_sync(0xffffffffu, sum, 1);
            l = (m == -INFINITY ? 0.0f : l * expf(m - m_new)) + sum;
            m = m_new;
            __syncwarp();
        }
        // Pass 2: O = sum over tiles of (exp(s - m) / l) V.
        const float inv_l = l > 0.0f ? 1.0f / l : 0.0f;
        FragC o[HD / 16];
        for (int j = 0; j < HD / 16; j++) wmma::fill_fragment(o[j], 0.0f);
        for (int kt = start / TILE; kt <= q_last / TILE; kt++) {
            scores_tile<HD>(w.S, q, K + (head + (long)kt * TILE) * HD);
            __syncwarp();
            for (int c = half * 32; c < half * 32 + 32; c++) {
                int kj = kt * TILE + c;
                bool visible = qi < T && kj >= start && kj <= qi;
                float p = visible ? expf(w.S[r * SCORE_LD + c] * scale - m) * inv_l : 0.0f;
                w.P[r * PROB_LD + c] = __float2bfloat16(p);
            }
            __syncwarp();
            accumulate_tile<HD>(o, w.P, V + (head + (long)kt * TILE) * HD);
            __syncwarp();
        }
        for (int j = 0; j < HD / 16; j++)
            wmma::store_matrix_sync(w.out + j * 16, o[j], HD + 4, wmma::mem_row_major);
        __syncwarp();
    }
    for (int i = 0; i < 16 && q0 + i < T; i++)
        for (int d = lane; d < HD; d += 32)
            out[((long)b * T + q0 + i) * H * HD + h * HD + d] = any ? w.out[i * (HD + 4) + d] : 0.0f;
    if (half == 0 && qi < T) lse[head + qi] = l > 0.0f ? m + logf(l) : INFINITY;
}

template <int HD>
__global__ static void __launch_bounds__(THREADS)
    fused_backward_kv_kernel(float *dk, float *dv, const __nv_bfloat16 *Q, const __nv_bfloat16 *K,
                             const __nv_bfloat16 *V, const __nv_bfloat16 *dO, const float *lse,
                             const float *D, const int *row_start, int H, int KV, int T, float scale) {
    extern __shared__ __align__(128) unsigned char shared[];
    const WarpScratch w = warp_scratch(shared);
    const int lane = threadIdx.x % 32;
    const int group = H / KV, b = blockIdx.y / KV, kv_head = blockIdx.y % KV;
    const int k0 = blockIdx.x * TILE + (threadIdx.x / 32) * 16; // this warp's first key
    if (k0 >= T) return;
    const int start = row_start ? row_start[b] : 0;
    if (k0 + 16 <= start) return; // keys no query sees: zero gradient
    // K and V are the same for every head of the group; take the group's first.
    const long kv_rows = ((long)b * H + kv_head * group) * T;
    FragA k[HD / 16], v[HD / 16];
    load_rows<HD>(k, K + (kv_rows + k0) * HD);
    load_rows<HD>(v, V + (kv_rows + k0) * HD);
    FragC dK[HD / 16], dV[HD / 16];
    for (int j = 0; j < HD / 16; j++) wmma::fill_fragment(dK[j], 0.0f), wmma::fill_fragment(dV[j], 0.0f);
    const int r = lane / 2, half = lane % 2, kj = k0 + r; // two lanes per key row
    for (int member = 0; member < group; member++) {
        const long head = ((long)b * H + kv_head * group + member) * T;
        for (int qt = max(k0, start) / TILE; qt <= (T - 1) / TILE; qt++) {
            const long rows = (head + (long)qt * TILE) * HD;
            scores_tile<HD>(w.S, k, Q + rows);   // S^T: keys x queries
            scores_tile<HD>(w.dP, v, dO + rows); // dP^T
            __syncwarp();
            for (int c = half * 32; c < half * 32 + 32; c++) {
                int qi = qt * TILE + c;
                bool visible = kj < T && qi < T && kj >= start && kj <= qi;
                float p = 0.0f, ds = 0.0f;
                if (visible) {
                    p = expf(w.S[r * SCORE_LD + c] * scale - lse[head + qi]);
                    ds = p * (w.dP[r * SCORE_LD + c] - D[head + qi]);
                }
                w.P[r * PROB_LD + c] = __float2bfloat16(p);
                w.dS[r * PROB_LD + c] = __float2bfloat16(ds);
            }
            __syncwarp();
            accumulate_tile<HD>(dV, w.P, dO + rows);
            accumulate_tile<HD>(dK, w.dS, Q + rows);
            __syncwarp();
        }
    }
    const long width = (long)KV * HD;
    add_rows<HD>(dv, width, kv_head * HD, b, T, k0, dV, w.out, 1.0f);
    add_rows<HD>(dk, width, kv_head * HD, b, T, k0, dK, w.out, scale);
}

template <int HD>
__global__ static void __launch_bounds__(THREADS)
    fused_backward_q_kernel(float *dq, const __nv_bfloat16 *Q, const __nv_bfloat16 *K,
                            const __nv_bfloat16 *V, const __nv_bfloat16 *dO, const float *lse,
                            const float *D, const int *row_start, int H, int T, float scale) {
    extern __shared__ __align__(128) unsigned char shared[];
    const WarpScratch w = warp_scratch(shared);
    const int lane = threadIdx.x % 32;
    const int bh = blockIdx.y, b = bh / H, h = bh % H;
    const int q0 = blockIdx.x * TILE + (threadIdx.x / 32) * 16;
    if (q0 >= T) return;
    const int start = row_start ? row_start[b] : 0;
    const int q_last = min(q0 + 16, T) - 1;
    if (q_last < start) return; // only padding queries: zero gradient
    const long head = (long)bh * T;
    FragA q[HD / 16], o_grad[HD / 16];
    load_rows<HD>(q, Q + (head + q0) * HD);
    load_rows<HD>(o_grad, dO + (head + q0) * HD);
    FragC dQ[HD / 16];
    for (int j = 0; j < HD / 16; j++) wmma::fill_fragment(dQ[j], 0.0f);
    const int r = lane / 2, half = lane % 2, qi = q0 + r;
    const float row_lse = qi < T ? lse[head + qi] : INFINITY, row_D = qi < T ? D[head + qi] : 0.0f;
    for (int kt = start / TILE; kt <= q_last / TILE; kt++) {
        const long rows = (head + (long)kt * TILE) * HD;
        scores_tile<HD>(w.S, q, K + rows);
        scores_tile<HD>(w.dP, o_grad, V + rows);
        __syncwarp();
        for (int c = half * 32; c < half * 32 + 32; c++) {
            int kj = kt * TILE + c;
            bool visible = qi < T && kj >= start && kj <= qi;
            float ds = 0.0f;
            if (visible) {
                float p = expf(w.S[r * SCORE_LD + c] * scale - row_lse);
                ds = p * (w.dP[r * SCORE_LD + c] - row_D);
            }
            w.dS[r * PROB_LD + c] = __float2bfloat16(ds);
        }
        __syncwarp();
        accumulate_tile<HD>(dQ, w.dS, K + rows);
        __syncwarp();
    }
    add_rows<HD>(dq, (long)H * HD, h * HD, b, T, q0, dQ, w.out, scale);
}

// D[b, h, t] = dO[b*T + t, h] . O[b*T + t, h] (one warp per row).
__global__ static void row_dot_kernel(float *D, const float *dout, const float *out, int B, int H,
                                      int T, int head_dim) {
    long row = (long)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32; // (b*H + h)*T + t
    int lane = threadIdx.x % 32;
    if (row >= (long)B * H * T) return;
    int t = (int)(row % T), h = (int)(row / T % H), b = (int)(row / T / H);
    long at = ((long)b * T + t) * H * head_dim + h * head_dim;
    float sum = 0.0f;
    for (int d = lane; d < head_dim; d += 32) sum += dout[at + d] * out[at + d];
    for (int offset = 16; offset > 0; offset >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
    if (lane == 0) D[row] = sum;
}

bool cuda_fused_attention_supports(int head_dim) {
    return head_dim == 16 || head_dim == 32 || head_dim == 64 || head_dim == 128;
}

template <int HD>
static void forward_for(float *out, float *lse, const __nv_bfloat16 *Q, const __nv_bfloat16 *K,
                        const __nv_bfloat16 *V, const int *row_start, int B, int H, int T, float scale) {
    size_t shared = WARPS * WARP_SCRATCH_BYTES;
    CUDA_CHECK(cudaFuncSetAttribute(fused_forward_kernel<HD>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)shared));
    dim3 grid((T + TILE - 1) / TILE, B * H);
    fused_forward_kernel<HD><<<grid, THREADS, shared>>>(out, lse, Q, K, V, row_start, H, T, scale);
    CUDA_CHECK_LAUNCH();
}

void cuda_fused_attention_forward(float *out, float *lse, const __nv_bfloat16 *Q, const __nv_bfloat16 *K,
                                  const __nv_bfloat16 *V, const int *row_start, int B, int H, int T,
                                  int head_dim) {
    float scale = 1.0f / sqrtf((float)head_dim);
    switch (head_dim) {
    case 16: forward_for<16>(out, lse, Q, K, V, row_start, B, H, T, scale); break;
    case 32: forward_for<32>(out, lse, Q, K, V, row_start, B, H, T, scale); break;
    case 64: forward_for<64>(out, lse, Q, K, V, row_start, B, H, T, scale); break;
    case 128: forward_for<128>(out, lse, Q, K, V, row_start, B, H, T, scale); break;
    default: CHECK(false, "fused attention has no kernel for head_dim %d", head_dim);
    }
}

template <int HD>
static void backward_for(float *dq, float *dk, float *dv, const __nv_bfloat16 *Q, const __nv_bfloat16 *K,
                         const __nv_bfloat16 *V, const __nv_bfloat16 *dO, const float *lse,
                         const float *D, const int *row_start, int B, int H, int KV, int T, float scale) {
    size_t shared = WARPS * WARP_SCRATCH_BYTES;
    CUDA_CHECK(cudaFuncSetAttribute(fused_backward_kv_kernel<HD>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)shared));
    CUDA_CHECK(cudaFuncSetAttribute(fused_backward_q_kernel<HD>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)shared));
    dim3 kv_grid((T + TILE - 1) / TILE, B * KV), q_grid((T + TILE - 1) / TILE, B * H);
    fused_backward_kv_kernel<HD><<<kv_grid, THREADS, shared>>>(dk, dv, Q, K, V, dO, lse, D, row_start, H, KV, T, scale);
    CUDA_CHECK_LAUNCH();
    fused_backward_q_kernel<HD><<<q_grid, THREADS, shared>>>(dq, Q, K, V, dO, lse, D, row_start, H, T, scale);
    CUDA_CHECK_LAUNCH();
}

void cuda_fused_attention_backward(float *dq, float *dk, float *dv, const float *dout, const float *out,
                                   const __nv_bfloat16 *Q, const __nv_bfloat16 *K, const __nv_bfloat16 *V,
                                   const __nv_bfloat16 *dO, const float *lse, const int *row_start, int B,
                                   int H, int KV, int T, int head_dim) {
    float *D = (float *)cuda_scratch(SCRATCH_ATT_ROWDOT, (size_t)B * H * T * sizeof(float));
    row_dot_kernel<<<grid_for((long)B * H * T, 8), 256>>>(D, dout, out, B, H, T, head_dim);
    CUDA_CHECK_LAUNCH();
    float scale = 1.0f / sqrtf((float)head_dim);
    switch (head_dim) {
    case 16: backward_for<16>(dq, dk, dv, Q, K, V, dO, lse, D, row_start, B, H, KV, T, scale); break;
    case 32: backward_for<32>(dq, dk, dv, Q, K, V, dO, lse, D, row_start, B, H, KV, T, scale); break;
    case 64: backward_for<64>(dq, dk, dv, Q, K, V, dO, lse, D, row_start, B, H, KV, T, scale); break;
    case 128: backward_for<128>(dq, dk, dv, Q, K, V, dO, lse, D, row_start, B, H, KV, T, scale); break;
    default: CHECK(false, "fused attention has no kernel for head_dim %d", head_dim);
    }
}
