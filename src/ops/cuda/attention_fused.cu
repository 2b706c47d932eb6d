// Fused ("flash") attention on the tensor cores: the T x T scores never reach device
// memory. The forward keeps, per query row, the log-sum-exp of its scaled scores; the
// backward recomputes the probabilities tile by tile from it.
//
// Inputs are the head-major bf16 copies made by attention.cu ([B, H, T, hd], K and V
// repeated for the heads of their group). A block has 4 warps and owns a 64-row tile;
// each warp owns 16 rows and runs 16x16x16 bf16 WMMA products with fp32 accumulators.
//   forward       grid (query tiles, B*H):  S = Q K^T, online softmax, O += P V
//   backward dKV  grid (key tiles, B*KV):   for every query tile and every head of the
//                 group: P^T, dP^T = V dO^T, dS^T = P^T (dP^T - D), dV += P^T dO,
//                 dK += dS^T Q
//   backward dQ   grid (query tiles, B*H):  dQ += dS K over the key tiles
// where D_i = dO_i . O_i. dK/dV and dQ come from separate kernels so that every gradient
// element is written by exactly one block, in a fixed order: no atomics, bit-identical
// runs. Masks: key j is visible to query i when row_start <= j <= i; a query before
// row_start (left padding) has no keys, output 0 and log-sum-exp +inf.
#include <math.h>
#include <mma.h>

#include <algorithm>

#include "ops/cuda/attention_fused.cuh"

using namespace nvcuda;

enum { TILE = 64, WARPS = 4, THREADS = 128 };

typedef wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> FragA;
typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::row_major> FragB;
typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> FragBT;
typedef wmma::fragment<wmma::accumulator, 16, 16, 16, float> FragC;

// Row strides in shared memory, padded against bank conflicts; every 16-row block stays
// 32-byte aligned as WMMA requires.
template <int HD> struct Strides {
    static constexpr int tile = HD + 8;      // bf16 [64][HD] tiles (Q, K, V, dO)
    static constexpr int score = TILE + 4;   // fp32 [64][64] (S, dP)
    static constexpr int prob = TILE + 8;    // bf16 [64][64] (P, dS)
    static constexpr int out = HD + 4;       // fp32 [64][HD] (O, gradients out)
};

// 64 rows of a head-major [T, HD] bf16 matrix from row `row0` into shared memory; rows
// past T are zero.
template <int HD>
__device__ static void load_tile(__nv_bfloat16 *dst, const __nv_bfloat16 *src, int row0, int T) {
    constexpr int chunks = HD / 8; // 16-byte pieces per row
    for (int c = threadIdx.x; c < TILE * chunks; c += blockDim.x) {
        int r = c / chunks, k = c % chunks;
        uint4 value = make_uint4(0, 0, 0, 0);
        if (row0 + r < T) value = *reinterpret_cast<const uint4 *>(src + (long)(row0 + r) * HD + k * 8);
        *reinterpret_cast<uint4 *>(dst + r * Strides<HD>::tile + k * 8) = value;
    }
}

// C(16 x 64, fp32, ld_c) = A(16 x HD) B^T where B is stored [64][HD]: a warp's scores.
template <int HD>
__device__ static void product_abt(float *C, int ld_c, const __nv_bfloat16 *A, const __nv_bfloat16 *B) {
    constexpr int ld = Strides<HD>::tile;
    for (int j = 0; j < TILE / 16; j++) {
        FragC acc;
        wmma::fill_fragment(acc, 0.0f);
        for (int kk = 0; kk < HD / 16; kk++) {
            FragA a;
            FragBT b;
            wmma::load_matrix_sync(a, A + kk * 16, ld);
            wmma::load_matrix_sync(b, B + j * 16 * ld + kk * 16, ld);
            wmma::mma_sync(acc, a, b, acc);
        }
        wmma::store_matrix_sync(C + j * 16, acc, ld_c, wmma::mem_row_major);
    }
}

// acc[j] += A(16 x 64, bf16 probabilities) B(64 x HD) for the HD/16 column blocks j.
template <int HD>
__device__ static void product_ab_accumulate(FragC *acc, const __nv_bfloat16 *A, const __nv_bfloat16 *B) {
    for (int j = 0; j < HD / 16; j++)
        for (int kk = 0; kk < TILE / 16; kk++) {
            FragA a;
            FragB b;
            wmma::load_matrix_sync(a, A + kk * 16, Strides<HD>::prob);
            wmma::load_matrix_sync(b, B + kk * 16 * Strides<HD>::tile + j * 16, Strides<HD>::tile);
            wmma::mma_sync(acc[j], a, b, acc[j]);
        }
}

template <int HD> size_t fused_forward_shared_bytes() {
    using S = Strides<HD>;
    return 3 * TILE * S::tile * 2 + TILE * S::score * 4 + TILE * S::prob * 2 + TILE * S::out * 4 + 2 * TILE * 4;
}

template <int HD>
__global__ static void __launch_bounds__(THREADS)
    fused_forward_kernel(float *out, float *lse, const __nv_bfloat16 *Q, const __nv_bfloat16 *K,
                         const __nv_bfloat16 *V, const int *row_start, int H, int T, float scale) {
    using S = Strides<HD>;
    DYNAMIC_SHARED(shared);
    __nv_bfloat16 *Qs = (__nv_bfloat16 *)shared, *Ks = Qs + TILE * S::tile, *Vs = Ks + TILE * S::tile;
    float *Ss = (float *)(Vs + TILE * S::tile);
    __nv_bfloat16 *Ps = (__nv_bfloat16 *)(Ss + TILE * S::score);
    float *Os = (float *)(Ps + TILE * S::prob);
    float *row_max = Os + TILE * S::out, *row_sum = row_max + TILE;

    const int bh = blockIdx.y, b = bh / H, h = bh % H, q0 = blockIdx.x * TILE;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int start = row_start ? row_start[b] : 0;
    const long head = (long)bh * T * HD;
    load_tile<HD>(Qs, Q + head, q0, T);
    for (int i = threadIdx.x; i < TILE * S::out; i += blockDim.x) Os[i] = 0.0f;
    for (int i = threadIdx.x; i < TILE; i += blockDim.x) row_max[i] = -INFINITY, row_sum[i] = 0.0f;

    const int q_last = min(q0 + TILE, T) - 1;
    const int r = warp * 16 + lane / 2, half = lane % 2, qi = q0 + r; // this lane's row
    for (int kt = start / TILE; q_last >= start && kt <= q_last / TILE; kt++) {
        __syncthreads(); // the previous tile's K and V are no longer read
        load_tile<HD>(Ks, K + head, kt * TILE, T);
        load_tile<HD>(Vs, V + head, kt * TILE, T);
        __syncthreads();
        product_abt<HD>(Ss + warp * 16 * S::score, S::score, Qs + warp * 16 * S::tile, Ks);
        __syncwarp();
        // Online softmax: two lanes per row, 32 columns each.
        float *srow = Ss + r * S::score;
        float tile_max = -INFINITY;
        for (int c = half * 32; c < half * 32 + 32; c++) {
            int kj = kt * TILE + c;
            bool visible = qi < T && kj >= start && kj <= qi;
            float s = visible ? srow[c] * scale : -INFINITY;
            srow[c] = s;
            tile_max = fmaxf(tile_max, s);
        }
        tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
        float m_old = row_max[r], m_new = fmaxf(m_old, tile_max);
        float sum = 0.0f;
        for (int c = half * 32; c < half * 32 + 32; c++) {
            float p = m_new == -INFINITY ? 0.0f : expf(srow[c] - m_new);
            Ps[r * S::prob + c] = __float2bfloat16(p);
            sum += p;
        }
        sum += __shfl_xor_sync(0xffffffffu, sum, 1);
        float alpha = m_old == -INFINITY ? 0.0f : expf(m_old - m_new);
        __syncwarp(); // both lanes of the row have read row_max
        if (half == 0) row_max[r] = m_new, row_sum[r] = row_sum[r] * alpha + sum;
        for (int d = half * (HD / 2); d < (half + 1) * (HD / 2); d++) Os[r * S::out + d] *= alpha;
        __syncwarp();
        // O += P V
        FragC acc[HD / 16];
        for (int j = 0; j < HD / 16; j++)
            wmma::load_matrix_sync(acc[j], Os + warp * 16 * S::out + j * 16, S::out, wmma::mem_row_major);
        product_ab_accumulate<HD>(acc, Ps + warp * 16 * S::prob, Vs);
        for (int j = 0; j < HD / 16; j++)
            wmma::store_matrix_sync(Os + warp * 16 * S::out + j * 16, acc[j], S::out, wmma::mem_row_major);
        __syncwarp();
    }
    __syncthreads();
    for (int i = 0; i < 16; i++) {
        int row = warp * 16 + i, q = q0 + row;
        if (q >= T) break;
        float l = row_sum[row];
        float inv = l > 0.0f ? 1.0f / l : 0.0f;
        for (int d = lane; d < HD; d += 32)
            out[((long)b * T + q) * H * HD + h * HD + d] = Os[row * S::out + d] * inv;
        if (lane == 0) lse[(long)bh * T + q] = l > 0.0f ? row_max[row] + logf(l) : INFINITY;
    }
}

template <int HD> size_t fused_backward_shared_bytes() {
    using S = Strides<HD>;
    return 4 * TILE * S::tile * 2 + 2 * TILE * S::score * 4 + 2 * TILE * S::prob * 2 + 2 * TILE * 4;
}

// Writes a warp's 16 x HD accumulators, times `scale`, over rows [row0 + warp*16, ...) of a
// [B*T, width] gradient at column offset `column` (the op overwrites dq, dk, dv: ops.h).
// `buffer` is shared scratch of TILE x (HD+4) floats that no other warp is using.
template <int HD>
__device__ static void write_fragments(float *grad, long width, int column, int b, int T, int row0,
                                     FragC *acc, float *buffer, float scale) {
    using S = Strides<HD>;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    for (int j = 0; j < HD / 16; j++)
        wmma::store_matrix_sync(buffer + warp * 16 * S::out + j * 16, acc[j], S::out, wmma::mem_row_major);
    __syncwarp();
    for (int i = 0; i < 16; i++) {
        int row = row0 + warp * 16 + i;
        if (row >= T) break;
        for (int d = lane; d < HD; d += 32)
            grad[((long)b * T + row) * width + column + d] = scale * buffer[(warp * 16 + i) * S::out + d];
    }
    __syncwarp();
}

// Zeros a block's TILE rows from row0 (those before T) of a [B*T, width] gradient at columns
// [column, column + HD): rows that no key or query reaches, which a block with nothing to
// compute still writes.
template <int HD>
__device__ static void zero_gradient_rows(float *grad, long width, int column, int b, int T, int row0) {
    for (int i = threadIdx.x; i < TILE * HD; i += blockDim.x) {
        const int row = row0 + i / HD;
        if (row < T) grad[((long)b * T + row) * width + column + i % HD] = 0.0f;
    }
}

template <int HD>
__global__ static void __launch_bounds__(THREADS)
    fused_backward_kv_kernel(float *dk, float *dv, const __nv_bfloat16 *Q, const __nv_bfloat16 *K,
                             const __nv_bfloat16 *V, const __nv_bfloat16 *dO, const float *lse,
                             const float *D, const int *row_start, int H, int KV, int T, float scale) {
    using S = Strides<HD>;
    DYNAMIC_SHARED(shared);
    __nv_bfloat16 *Ks = (__nv_bfloat16 *)shared, *Vs = Ks + TILE * S::tile, *Qs = Vs + TILE * S::tile,
                  *dOs = Qs + TILE * S::tile;
    float *Ss = (float *)(dOs + TILE * S::tile), *dPs = Ss + TILE * S::score;
    __nv_bfloat16 *Ps = (__nv_bfloat16 *)(dPs + TILE * S::score), *dSs = Ps + TILE * S::prob;
    float *lse_s = (float *)(dSs + TILE * S::prob), *D_s = lse_s + TILE;

    const int group = H / KV, b = blockIdx.y / KV, kv_head = blockIdx.y % KV, k0 = blockIdx.x * TILE;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int start = row_start ? row_start[b] : 0;
    if (k0 + TILE <= start) { // keys no query sees: zero gradients
        zero_gradient_rows<HD>(dk, (long)KV * HD, kv_head * HD, b, T, k0);
        zero_gradient_rows<HD>(dv, (long)KV * HD, kv_head * HD, b, T, k0);
        return;
    }
    // K and V are the same for every head of the group; take the group's first.
    const long kv_rows = ((long)b * H + kv_head * group) * T * HD;
    load_tile<HD>(Ks, K + kv_rows, k0, T);
    load_tile<HD>(Vs, V + kv_rows, k0, T);
    FragC dK[HD / 16], dV[HD / 16];
    for (int j = 0; j < HD / 16; j++) wmma::fill_fragment(dK[j], 0.0f), wmma::fill_fragment(dV[j], 0.0f);

    const int kr = warp * 16 + lane / 2, half = lane % 2, kj = k0 + kr; // this lane's key row
    for (int member = 0; member < group; member++) {
        const int h = kv_head * group + member;
        const long head = ((long)b * H + h) * T;
        for (int qt = max(k0, start) / TILE; qt <= (T - 1) / TILE; qt++) {
            __syncthreads(); // the previous query tile is no longer read
            load_tile<HD>(Qs, Q + head * HD, qt * TILE, T);
            load_tile<HD>(dOs, dO + head * HD, qt * TILE, T);
            for (int i = threadIdx.x; i < TILE; i += blockDim.x) {
                int q = qt * TILE + i;
                lse_s[i] = q < T ? lse[head + q] : INFINITY;
                D_s[i] = q < T ? D[head + q] : 0.0f;
            }
            __syncthreads();
            // S^T = K Q^T and dP^T = V dO^T for this warp's 16 keys.
            product_abt<HD>(Ss + warp * 16 * S::score, S::score, Ks + warp * 16 * S::tile, Qs);
            product_abt<HD>(dPs + warp * 16 * S::score, S::score, Vs + warp * 16 * S::tile, dOs);
            __syncwarp();
            for (int c = half * 32; c < half * 32 + 32; c++) {
                int qi = qt * TILE + c;
                bool visible = kj < T && qi < T && kj >= start && kj <= qi;
                float p = visible ? expf(Ss[kr * S::score + c] * scale - lse_s[c]) : 0.0f;
                float ds = p * (dPs[kr * S::score + c] - D_s[c]);
                Ps[kr * S::prob + c] = __float2bfloat16(p);
                dSs[kr * S::prob + c] = __float2bfloat16(ds);
            }
            __syncwarp();
            product_ab_accumulate<HD>(dV, Ps + warp * 16 * S::prob, dOs);
            product_ab_accumulate<HD>(dK, dSs + warp * 16 * S::prob, Qs);
        }
    }
    __syncthreads(); // the output buffer below overlaps every warp's score rows
    float *buffer = Ss; // Ss and dPs together hold TILE x (HD+4) floats for HD <= 128
    const long width = (long)KV * HD;
    write_fragments<HD>(dv, width, kv_head * HD, b, T, k0, dV, buffer, 1.0f);
    write_fragments<HD>(dk, width, kv_head * HD, b, T, k0, dK, buffer, scale);
}

template <int HD>
__global__ static void __launch_bounds__(THREADS)
    fused_backward_q_kernel(float *dq, const __nv_bfloat16 *Q, const __nv_bfloat16 *K,
                            const __nv_bfloat16 *V, const __nv_bfloat16 *dO, const float *lse,
                            const float *D, const int *row_start, int H, int T, float scale) {
    using S = Strides<HD>;
    DYNAMIC_SHARED(shared);
    __nv_bfloat16 *Qs = (__nv_bfloat16 *)shared, *dOs = Qs + TILE * S::tile, *Ks = dOs + TILE * S::tile,
                  *Vs = Ks + TILE * S::tile;
    float *Ss = (float *)(Vs + TILE * S::tile), *dPs = Ss + TILE * S::score;
    __nv_bfloat16 *dSs = (__nv_bfloat16 *)(dPs + TILE * S::score);
    float *lse_s = (float *)(dSs + 2 * TILE * S::prob), *D_s = lse_s + TILE;

    const int bh = blockIdx.y, b = bh / H, h = bh % H, q0 = blockIdx.x * TILE;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int start = row_start ? row_start[b] : 0;
    const int q_last = min(q0 + TILE, T) - 1;
    if (q_last < start) { // only padding queries: zero gradients
        zero_gradient_rows<HD>(dq, (long)H * HD, h * HD, b, T, q0);
        return;
    }
    const long head = (long)bh * T;
    load_tile<HD>(Qs, Q + head * HD, q0, T);
    load_tile<HD>(dOs, dO + head * HD, q0, T);
    for (int i = threadIdx.x; i < TILE; i += blockDim.x) {
        int q = q0 + i;
        lse_s[i] = q < T ? lse[head + q] : INFINITY;
        D_s[i] = q < T ? D[head + q] : 0.0f;
    }
    FragC dQ[HD / 16];
    for (int j = 0; j < HD / 16; j++) wmma::fill_fragment(dQ[j], 0.0f);
    const int r = warp * 16 + lane / 2, half = lane % 2, qi = q0 + r;
    for (int kt = start / TILE; kt <= q_last / TILE; kt++) {
        __syncthreads();
        load_tile<HD>(Ks, K + head * HD, kt * TILE, T);
        load_tile<HD>(Vs, V + head * HD, kt * TILE, T);
        __syncthreads();
        product_abt<HD>(Ss + warp * 16 * S::score, S::score, Qs + warp * 16 * S::tile, Ks);
        product_abt<HD>(dPs + warp * 16 * S::score, S::score, dOs + warp * 16 * S::tile, Vs);
        __syncwarp();
        for (int c = half * 32; c < half * 32 + 32; c++) {
            int kj = kt * TILE + c;
            bool visible = qi < T && kj >= start && kj <= qi;
            float p = visible ? expf(Ss[r * S::score + c] * scale - lse_s[r]) : 0.0f;
            dSs[r * S::prob + c] = __float2bfloat16(p * (dPs[r * S::score + c] - D_s[r]));
        }
        __syncwarp();
        product_ab_accumulate<HD>(dQ, dSs + warp * 16 * S::prob, Ks);
    }
    __syncthreads();
    write_fragments<HD>(dq, (long)H * HD, h * HD, b, T, q0, dQ, Ss, scale);
}

bool cuda_fused_attention_supports(int head_dim) {
    return head_dim == 16 || head_dim == 32 || head_dim == 64 || head_dim == 128;
}

size_t cuda_wmma_attention_shared_bytes(int head_dim) {
    size_t most = 0;
    with_fused_head_dim(head_dim, "fused", [&](auto hd) {
        constexpr int HD = decltype(hd)::value;
        most = std::max(fused_forward_shared_bytes<HD>(), fused_backward_shared_bytes<HD>());
    });
    return most;
}

template <int HD>
static void forward_for(float *out, float *lse, const __nv_bfloat16 *Q, const __nv_bfloat16 *K,
                        const __nv_bfloat16 *V, const int *row_start, int B, int H, int T, float scale) {
    size_t shared = fused_forward_shared_bytes<HD>();
    CUDA_CHECK(cudaFuncSetAttribute(fused_forward_kernel<HD>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)shared));
    dim3 grid((T + TILE - 1) / TILE, B * H);
    fused_forward_kernel<HD><<<grid, THREADS, shared>>>(out, lse, Q, K, V, row_start, H, T, scale);
    CUDA_CHECK_LAUNCH();
}

void cuda_fused_attention_forward(float *out, float *lse, const __nv_bfloat16 *Q, const __nv_bfloat16 *K,
                                  const __nv_bfloat16 *V, const int *row_start, int B, int H, int T,
                                  int head_dim) {
    float scale = 1.0f / sqrtf((float)head_dim);
    with_fused_head_dim(head_dim, "fused", [&](auto hd) {
        forward_for<decltype(hd)::value>(out, lse, Q, K, V, row_start, B, H, T, scale);
    });
}

template <int HD>
static void backward_for(float *dq, float *dk, float *dv, const __nv_bfloat16 *Q, const __nv_bfloat16 *K,
                         const __nv_bfloat16 *V, const __nv_bfloat16 *dO, const float *lse,
                         const float *D, const int *row_start, int B, int H, int KV, int T, float scale) {
    size_t shared = fused_backward_shared_bytes<HD>();
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
    const float *D = cuda_attention_row_dot(dout, out, B, H, T, head_dim);
    float scale = 1.0f / sqrtf((float)head_dim);
    with_fused_head_dim(head_dim, "fused", [&](auto hd) {
        backward_for<decltype(hd)::value>(dq, dk, dv, Q, K, V, dO, lse, D, row_start, B, H, KV, T, scale);
    });
}
