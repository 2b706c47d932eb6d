// Fused causal attention on mma.sync tensor-core instructions, the FlashAttention-2 way:
// scores, probabilities and their gradients live in registers, never in shared or device
// memory; K/V (or Q/dO) tiles stream through shared memory with cp.async, the next tile
// loading while the current one is used. Launched by attention_mma.cu; also compiled for
// the CPU by tests/test_attention_emulated.cpp (device_primitives.cuh says how).
//
// Head-major bf16 inputs: Q and dO [B, H, T, hd], K and V [B, KV, T, hd] (one copy per K/V
// head; query head h reads K/V head h / (H / KV)), fp32 results written over [B*T, heads*hd]
// rows (every row of every head, zeros where nothing reaches it: the attention backward
// overwrites dq, dk and dv; the backward's gradient rows q_row_stride and kv_row_stride floats
// apart, heads*hd or the width of a fused q | k | v gradient whose columns they are), one
// natural log-sum-exp per query row (+inf for a query with
// no keys, whose output is 0). The forward also writes its output as bf16 when given a copy
// to write: the output is the o projection's input, which reads a held one (matmul_input_hold)
// as that copy. Key j is visible to query i when row_start <= j <= i, and
// under a sliding window of W keys (window > 0) when also i - j < W.
//
// A block is 4 warps. A warp owns rows in m-tiles of 16 (the M of the m16n8k16 product)
// and walks the other side 64 columns at a time, as 8 column blocks of the product. In
// the backward kernels a warp owns one m-tile and a block 64 rows (keys for dK/dV, queries
// for dQ). In the forward a warp owns FORWARD_M_TILES m-tiles: two up to HD 64 (TUNED), so a
// block owns 128 query rows and every K and V fragment read from shared memory feeds two
// mma; one at HD 128 (registers), a block of 64 rows. M-tile m of the 4 warps is the
// block's m-th 64 rows, and an m-tile that sees no key of a key tile (causal diagonal,
// window, padding) skips that tile's products. A product's fp32 accumulator layout is the
// A-operand layout of the next product, which is what keeps P and dS in registers: the
// accumulators of column blocks 2k and 2k+1 packed to bf16 are the A fragment of k-step k.
//   forward   grid (B*H, query blocks):  S = Q K^T, online softmax (base 2), O += P V
//   dK, dV    grid (B*KV, key tiles):    for each head of the group and each query tile:
//             S^T = K Q^T, dP^T = V dO^T, P^T, dS^T = P^T (dP^T - D), dV += P^T dO,
//             dK += dS^T Q
//   dQ        grid (B*H, query tiles):   S = Q K^T, dP = dO V^T, dS, dQ += dS K
//   "mma-ds": the dK/dV kernel also writes dS^T's tiles (backward_kv_scores_kernel), and
//             dQ += dS K reads them (backward_q_from_scores_kernel): one product, not three
// with D_i = dO_i . O_i. The A operands that are the same for every tile of the walk (the
// forward's Q rows, dQ's Q and dO rows, dK/dV's K and V rows up to HD 64) are read once
// into registers; the streamed tiles' operands come from shared memory by ldmatrix at each
// use. dQ has its own kernel so that every gradient element is written by one block in a
// fixed order: no atomics, bit-identical runs.
#pragma once
#include <math.h>

#include "ops/attention_window.h"
#include "ops/cuda/device_primitives.cuh"

namespace attention_mma {

// ROWS: the rows of a shared tile and of a backward block; COLUMNS: a key (or query) tile's
// columns walked per step.
enum { ROWS = 64, COLUMNS = 64, WARPS = 4, THREADS = 128 };

constexpr float LOG2E = 1.4426950408889634f, LN2 = 0.6931471805599453f;

// Block probes, for bench/ops_breakdown only (ops_cuda_attention_probe_begin): a kernel
// instantiated with PROBED records, for each of its warps, when its block ran (the global
// timer, ns), on which SM, how many steps of its loop it took, its cycles, and the cycles
// it spent in the loop's waits (for a tile's copies, and at the barriers). Probe<false>,
// which every kernel that computes for the model takes, is empty: its calls compile to
// nothing, so the probes leave the model's kernels' machine code as it was.
struct ProbeRecord {
    long long start_ns, end_ns, cycles, waiting_cycles;
    int sm, steps;
};
template <bool ON> struct Probe {
    DEVICE_METHOD void begin() {}
    DEVICE_METHOD void wait_begin() {}
    DEVICE_METHOD void wait_end() {}
    DEVICE_METHOD void step() {}
    DEVICE_METHOD void finish() {}
};
#ifdef __CUDACC__
// Where a probed launch writes: WARPS records a block, blocks in grid order (x fastest).
// Static: each file that includes this header has its own, and attention_mma.cu, which
// launches the probed kernels, sets its own.
static __device__ ProbeRecord *probe_records;

DEVICE_INLINE long long global_timer_ns() {
    long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
template <> struct Probe<true> {
    long long start_ns = 0, start_cycles = 0, wait_start = 0, waiting = 0;
    int steps = 0;
    DEVICE_METHOD void begin() { start_ns = global_timer_ns(), start_cycles = clock64(); }
    DEVICE_METHOD void wait_begin() { wait_start = clock64(); }
    DEVICE_METHOD void wait_end() { waiting += clock64() - wait_start; }
    DEVICE_METHOD void step() { steps++; }
    DEVICE_METHOD void finish() {
        const long long cycles = clock64() - start_cycles, end_ns = global_timer_ns();
        if (threadIdx.x % 32 != 0) return;
        unsigned sm;
        asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
        const long block = (long)blockIdx.y * gridDim.x + blockIdx.x;
        probe_records[block * WARPS + threadIdx.x / 32] = {start_ns, end_ns, cycles, waiting, (int)sm, steps};
    }
};
#endif

// A [64][HD] bf16 tile in shared memory: rows padded by 8 elements (16 bytes) so that the
// 8 rows a fragment load touches fall in different banks, and every row stays 16-byte
// aligned for cp.async and ldmatrix.
template <int HD> struct Tile {
    static constexpr int ld = HD + 8;
    static constexpr int elements = ROWS * ld;
    static constexpr size_t bytes = (size_t)elements * 2;
};

template <int HD> constexpr size_t forward_shared_bytes() { return 4 * Tile<HD>::bytes; }  // K, V x 2
template <int HD> constexpr size_t backward_q_shared_bytes() { return 6 * Tile<HD>::bytes; } // Q, dO, (K, V) x 2
template <int HD> constexpr size_t backward_kv_shared_bytes() {                                // K, V, (Q, dO) x 2
    return 6 * Tile<HD>::bytes + 4 * ROWS * sizeof(float);                                     // + (lse, D) x 2
}
template <int HD> constexpr size_t backward_q_from_scores_shared_bytes() { // (K, dS^T) x 2
    return 2 * Tile<HD>::bytes + 2 * Tile<COLUMNS>::bytes;
}

// Two variants of every kernel, a template parameter, built side by side so that one GPU
// run measures both (attention.cu: "mma" is TUNED, "mma-plain" PLAIN). They spend
// registers differently, and more registers per thread means fewer blocks per SM (ptxas,
// HD 64 with CUDA 13, 2026-12-05: forward 254 registers (TUNED), 2 blocks of 128 threads per
// SM, against 167 (PLAIN), 3 blocks; dK/dV 227 against 174; dQ 168 against 168), which only the GPU can
// weigh. Both give the same results up to the tensor cores' summation order.
//   TUNED  the forward's warp owns two m-tiles up to HD 64; the backward kernels keep their
//          loop-invariant A operands in registers (dK/dV up to HD 64, dQ at every HD)
//   PLAIN  one m-tile per forward warp; the backward's A operands re-read from shared
//          memory at each use (the kernels as measured on the H200 on 2026-12-04, with
//          ldmatrix loads)
enum Variant { TUNED, PLAIN };

// A forward warp's query rows are M_TILES m-tiles of 16 (the mma's M). Two let every K and
// V fragment read from shared memory feed two mma, and halve the blocks that stream each
// K/V tile. At HD 128 two would need 2 x 64 O accumulators, 2 x 32 Q fragment registers
// and 2 x 32 scores per thread, more than a thread's 255 registers (ptxas -v: 540 bytes of
// spill stores), so there it is one.
template <int HD, Variant V> constexpr int FORWARD_M_TILES = V == TUNED && HD <= 64 ? 2 : 1;
// Query rows per forward block: 128 (64 at HD 128, or PLAIN).
template <int HD, Variant V> constexpr int FORWARD_ROWS = FORWARD_M_TILES<HD, V> * WARPS * 16;

// The kernels' grids: x walks the heads (b * H + h, or b * KV + kv for dK/dV), y the tiles,
// the longest first. Under the causal mask a query tile's work grows with its position
// (the last one sees every key) and a key tile's shrinks (the first is seen by every
// query), and blocks start in launch order, x fastest: so every head's longest tile starts
// before any shorter one and the last blocks to start are the shortest, which is what
// keeps the SMs busy to the end. With the tiles along x (until 2026-12-05) the last
// head's longest tile started among the last blocks: on a model of the 1B step on an H200
// (132 SMs, 2 or 3 blocks each, a block's time proportional to its tiles) that tail cost
// the dK/dV kernel ~26% over this order, the forward ~14% and dQ ~11%.
struct GridShape {
    unsigned x, y;
};
template <int HD, Variant V> inline GridShape forward_grid(int B, int H, int T) {
    return {(unsigned)(B * H), (unsigned)((T + FORWARD_ROWS<HD, V> - 1) / FORWARD_ROWS<HD, V>)};
}
inline GridShape backward_kv_grid(int B, int KV, int T) { return {(unsigned)(B * KV), (unsigned)((T + ROWS - 1) / ROWS)}; }
inline GridShape backward_q_grid(int B, int H, int T) { return {(unsigned)(B * H), (unsigned)((T + ROWS - 1) / ROWS)}; }

// Whether the dK/dV kernel keeps its warp's K and V rows (loop-invariant A operands) in
// registers: 2 x HD/16 x 4 more per thread. At HD 128 they would join 2 x 64 dK/dV
// accumulators and spill (ptxas -v), so there they are re-read from shared memory. The dQ
// kernel keeps its Q and dO rows at every HD (254 registers at 128, no spills).
template <int HD, Variant V> constexpr bool KV_KERNEL_KEEPS_ROWS = V == TUNED && HD <= 64;
template <Variant V> constexpr bool Q_KERNEL_KEEPS_ROWS = V == TUNED;

DEVICE_INLINE int imin(int a, int b) { return a < b ? a : b; }
DEVICE_INLINE int imax(int a, int b) { return a > b ? a : b; }

// Starts copying rows [row0, row0 + 64) of a [T][HD] matrix into a tile; rows past T
// become zeros. A thread copies the 16-byte piece `threadIdx.x % chunks` of every
// (THREADS / chunks)-th row from row threadIdx.x / chunks, a compile-time count of pieces:
// its addresses are computed once and stepped by a constant (a loop bounded by threadIdx.x
// compiled to a generic loop plus remainder loops, and recomputing each piece's row and
// column took 27 instructions a piece; the loads were then a third of the backward's
// instructions per tile). Unrolled up to HD 64, the pieces' offsets become constants of
// the copy instructions; at HD 128 the loop stays a loop: unrolled, its copies' addresses
// took registers enough to spill.
template <int HD> DEVICE_INLINE void tile_load_async(bf16 *tile, const bf16 *matrix, int row0, int T) {
    constexpr int chunks = HD / 8, rows_per_pass = THREADS / chunks; // 16-byte pieces per row; rows per pass
    static_assert(THREADS % chunks == 0 && ROWS % rows_per_pass == 0, "every thread copies the same number of pieces");
    const int first = (int)threadIdx.x / chunks, column = (int)threadIdx.x % chunks * 8;
    bf16 *to = tile + first * Tile<HD>::ld + column;
    const bf16 *from = matrix + (long)(row0 + first) * HD + column;
    const int valid_rows = T - row0 - first; // this thread's pieces i * rows_per_pass below it are rows before T
    auto copy_piece = [&](int i) {
        const bool valid = i * rows_per_pass < valid_rows;
        cp_async_16(to + i * rows_per_pass * Tile<HD>::ld, valid ? from + (long)i * rows_per_pass * HD : matrix, valid);
    };
    if constexpr (HD <= 64) {
        UNROLL
        for (int i = 0; i < ROWS / rows_per_pass; i++) copy_piece(i);
    } else {
        KEEP_LOOP
        for (int i = 0; i < ROWS / rows_per_pass; i++) copy_piece(i);
    }
}

// The key loop's double buffering: starts loading key tile kt + 1 (K and V) into the other
// buffer when there is one, then waits until tile kt has arrived. The caller's barrier then
// publishes it to every warp.
template <int HD>
DEVICE_INLINE void next_kv_tile(bf16 *Ks, bf16 *Vs, const bf16 *K, const bf16 *V, int kt, int kt_last, int buffer,
                                int T) {
    if (kt < kt_last) {
        tile_load_async<HD>(Ks + (buffer ^ 1) * Tile<HD>::elements, K, (kt + 1) * COLUMNS, T);
        tile_load_async<HD>(Vs + (buffer ^ 1) * Tile<HD>::elements, V, (kt + 1) * COLUMNS, T);
        cp_async_commit();
        cp_async_wait<1>();
    } else {
        cp_async_wait<0>();
    }
}

// A fragment of the 16 x 16 block at m (row-major, ld elements per row): one ldmatrix of
// its four 8x8 quarters, in register order rows 0-7 | rows 8-15 of columns 0-7, then the
// same of columns 8-15. Lane i gives row i % 16 of the columns (i / 16) * 8.
DEVICE_INLINE void load_a(uint32_t a[4], const bf16 *m, int ld, int lane) {
    ldmatrix_x4(a, m + (lane % 16) * ld + (lane / 16) * 8);
}

// B fragments of B[k][n] = m[n][k] for 16 rows n (two blocks of 8: b[0] for rows [0, 8),
// b[1] for rows [8, 16)) and 16 columns k of m: B = m^T, which is how Q K^T reads K (rows
// are keys, columns the head dimension). One ldmatrix of four 8x8 matrices, in register
// order: rows 0-7 at columns 0-7 and 8-15, then rows 8-15 at the same columns. Lane i
// gives row (i / 16) * 8 + i % 8 of the columns ((i / 8) % 2) * 8.
DEVICE_INLINE void load_b_transposed_pair(uint32_t b[2][2], const bf16 *m, int ld, int lane) {
    uint32_t r[4];
    ldmatrix_x4(r, m + ((lane / 16) * 8 + lane % 8) * ld + ((lane / 8) % 2) * 8);
    b[0][0] = r[0], b[0][1] = r[1], b[1][0] = r[2], b[1][1] = r[3];
}

// B fragments of B[k][n] = m[k][n] for 16 rows k and columns n in [0, 8) (b_low) and
// [8, 16) (b_high): how P V reads V. One ldmatrix.trans of four 8x8 matrices.
DEVICE_INLINE void load_b_pair(uint32_t b_low[2], uint32_t b_high[2], const bf16 *m, int ld, int lane) {
    uint32_t r[4];
    ldmatrix_x4_trans(r, m + (lane % 16) * ld + (lane / 16) * 8);
    b_low[0] = r[0], b_low[1] = r[1], b_high[0] = r[2], b_high[1] = r[3];
}

// The A fragment for k-step k (16 columns) of a 16 x 64 fp32 accumulator set.
DEVICE_INLINE void accumulators_as_a(uint32_t a[4], const float (*acc)[4], int k) {
    a[0] = pack_bf16x2(acc[2 * k][0], acc[2 * k][1]);
    a[1] = pack_bf16x2(acc[2 * k][2], acc[2 * k][3]);
    a[2] = pack_bf16x2(acc[2 * k + 1][0], acc[2 * k + 1][1]);
    a[3] = pack_bf16x2(acc[2 * k + 1][2], acc[2 * k + 1][3]);
}

// acc (16 x HD) += A (16 x 64, registers) B (64 x HD, a shared tile read by load_b_pair).
template <int HD> DEVICE_INLINE void multiply_registers_by_tile(float (*acc)[4], const float (*a_acc)[4], const bf16 *tile, int lane) {
    for (int k = 0; k < COLUMNS / 16; k++) {
        uint32_t a[4];
        accumulators_as_a(a, a_acc, k);
        for (int n = 0; n < HD / 16; n++) {
            uint32_t b_low[2], b_high[2];
            load_b_pair(b_low, b_high, tile + k * 16 * Tile<HD>::ld + n * 16, Tile<HD>::ld, lane);
            mma_bf16_16x8x16(acc[2 * n], a, b_low);
            mma_bf16_16x8x16(acc[2 * n + 1], a, b_high);
        }
    }
}

// A warp's 16 rows x HD of a shared tile as the A operand of a product that is repeated for
// every tile of the other side (the backward kernels' K and V, or Q and dO, rows). With
// registers to spare their HD/16 fragments are read once and kept (KEPT); otherwise each
// use re-reads its fragment from the tile, which then has to stay in shared memory.
template <int HD, bool KEPT> struct RowOperand {
    uint32_t fragments[HD / 16][4];
    DEVICE_METHOD void load(const bf16 *rows, int lane) {
        for (int k = 0; k < HD / 16; k++) load_a(fragments[k], rows + k * 16, Tile<HD>::ld, lane);
    }
    DEVICE_METHOD void fragment(uint32_t a[4], int k, int lane) const {
        a[0] = fragments[k][0], a[1] = fragments[k][1], a[2] = fragments[k][2], a[3] = fragments[k][3];
    }
};
template <int HD> struct RowOperand<HD, false> {
    const bf16 *rows;
    DEVICE_METHOD void load(const bf16 *tile_rows, int lane) { rows = tile_rows; }
    DEVICE_METHOD void fragment(uint32_t a[4], int k, int lane) const { load_a(a, rows + k * 16, Tile<HD>::ld, lane); }
};

// acc (16 x 64) = A (16 x HD, a row operand) B^T (B: 64 rows of a shared tile).
template <int HD, bool KEPT>
DEVICE_INLINE void multiply_rows_by_tile_transposed(float (*acc)[4], const RowOperand<HD, KEPT> &a_rows,
                                                    const bf16 *b_rows, int lane) {
    for (int n = 0; n < COLUMNS / 8; n++) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
    for (int k = 0; k < HD / 16; k++) {
        uint32_t a[4];
        a_rows.fragment(a, k, lane);
        for (int n = 0; n < COLUMNS / 8; n += 2) {
            uint32_t b[2][2];
            load_b_transposed_pair(b, b_rows + n * 8 * Tile<HD>::ld + k * 16, Tile<HD>::ld, lane);
            mma_bf16_16x8x16(acc[n], a, b[0]);
            mma_bf16_16x8x16(acc[n + 1], a, b[1]);
        }
    }
}

// Writes factor * acc (16 x HD accumulators of rows row_low and row_low + 8) over an fp32
// matrix of B*T rows `width` floats apart (its row stride) at column `column`; rows at or
// past T are left alone.
template <int HD>
DEVICE_INLINE void write_rows(float *matrix, long width, int column, int b, int T, int row_low,
                              const float (*acc)[4], float factor, int lane) {
    for (int half = 0; half < 2; half++) {
        int row = row_low + 8 * half;
        if (row >= T) continue;
        float *dst = matrix + ((long)b * T + row) * width + column + 2 * (lane % 4);
        for (int n = 0; n < HD / 8; n++) {
            dst[n * 8] = factor * acc[n][2 * half];
            dst[n * 8 + 1] = factor * acc[n][2 * half + 1];
        }
    }
}

// Zeros a block's 64 rows from row0 (those before T) of an fp32 gradient of B*T rows
// `width` floats apart at columns [column, column + HD): the gradient of rows that no key or
// query reaches, which a block that has nothing to compute still writes.
template <int HD> DEVICE_INLINE void zero_rows(float *matrix, long width, int column, int b, int T, int row0) {
    for (int i = threadIdx.x; i < ROWS * HD; i += THREADS) {
        const int row = row0 + i / HD;
        if (row < T) matrix[((long)b * T + row) * width + column + i % HD] = 0.0f;
    }
}

// Whether a 64-key tile from key0 needs the per-element mask for rows from first_row on:
// the causal diagonal crosses it, it starts before the row's first real token (padding),
// or a window may cut it. Most tiles need none, and the kernels run each tile's
// element-wise step as one of two compiled versions (MASKED or not, a template parameter)
// chosen per warp: computed per element, even under a false uniform condition, the mask's
// tests were about a third of the key loop's instructions (ptxas predicates them rather
// than branching around them).
DEVICE_INLINE bool tile_needs_mask(int key0, int keys, int first_row, int start, int window) {
    return window > 0 || key0 < start || key0 + keys - 1 > first_row;
}

// Whether key `key` is hidden from query `row`.
DEVICE_INLINE bool masked_out(int key, int row, int start, int window) {
    return key < attention_first_key(start, row, window) || key > row;
}

// One key tile's step of the online softmax for one m-tile (16 query rows, this lane's
// row_low and row_low + 8): masks the scores s (Q K^T of keys key0.., unscaled; MASKED
// only), turns them into probabilities against the updated running maximum, and rescales
// what was summed so far (row_sum, the O accumulators o) to that maximum.
template <int HD, bool MASKED>
DEVICE_INLINE void online_softmax_step(float (*s)[4], float (*o)[4], float row_max[2], float row_sum[2], int key0,
                                       int row_low, int start, int window, float scale_log2, int t) {
    const int row_high = row_low + 8;
    if constexpr (MASKED)
        for (int n = 0; n < COLUMNS / 8; n++)
            for (int e = 0; e < 4; e++) {
                const int key = key0 + n * 8 + 2 * t + (e & 1), row = e < 2 ? row_low : row_high;
                if (masked_out(key, row, start, window)) s[n][e] = -INFINITY;
            }
    // Row by row: the tile's maximum over the row's 4 lanes, the rescaling of what was
    // summed so far, then this tile's probabilities. The maxima are kept scaled (base 2);
    // the scale goes into each exponent's fused multiply-add, s * scale - max (scale_log2 > 0,
    // so the scaled maximum is the raw maximum scaled).
    for (int half = 0; half < 2; half++) {
        float tile_max = -INFINITY;
        for (int n = 0; n < COLUMNS / 8; n++) tile_max = fmaxf(tile_max, fmaxf(s[n][2 * half], s[n][2 * half + 1]));
        tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
        tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 2));
        const float new_max = fmaxf(row_max[half], tile_max * scale_log2);
        float alpha = 1.0f, sum = 0.0f;
        // Only a masked tile can leave a row with no visible key yet (nothing to add then);
        // an unmasked one shows every row all 64 keys.
        if (MASKED && new_max == -INFINITY) {
            for (int n = 0; n < COLUMNS / 8; n++) s[n][2 * half] = s[n][2 * half + 1] = 0.0f;
        } else {
            alpha = exp2_approx(row_max[half] - new_max); // 0 when row_max is -inf
            for (int n = 0; n < COLUMNS / 8; n++)
                for (int e = 2 * half; e < 2 * half + 2; e++) {
                    s[n][e] = exp2_approx(fmaf(s[n][e], scale_log2, -new_max));
                    sum += s[n][e];
                }
        }
        row_sum[half] = row_sum[half] * alpha + sum;
        row_max[half] = new_max;
        for (int n = 0; n < HD / 8; n++) o[n][2 * half] *= alpha, o[n][2 * half + 1] *= alpha;
    }
}

// s[m] = Q[m] K^T (16 x 64 scores, unscaled) for M m-tiles against a key tile (64 rows of a
// shared tile): every K fragment pair read from shared memory feeds all M.
template <int HD, int M>
DEVICE_INLINE void multiply_queries_by_keys(float (*s)[COLUMNS / 8][4], const uint32_t (*qa)[HD / 16][4],
                                            const bf16 *Kt, int lane) {
    for (int m = 0; m < M; m++)
        for (int n = 0; n < COLUMNS / 8; n++) s[m][n][0] = s[m][n][1] = s[m][n][2] = s[m][n][3] = 0.0f;
    for (int k = 0; k < HD / 16; k++)
        for (int n = 0; n < COLUMNS / 8; n += 2) { // two 8-key blocks per load
            uint32_t bk[2][2];
            load_b_transposed_pair(bk, Kt + n * 8 * Tile<HD>::ld + k * 16, Tile<HD>::ld, lane);
            for (int m = 0; m < M; m++) {
                mma_bf16_16x8x16(s[m][n], qa[m][k], bk[0]);
                mma_bf16_16x8x16(s[m][n + 1], qa[m][k], bk[1]);
            }
        }
}

// o[m] (16 x HD) += P[m] (16 x 64, registers) V (64 x HD, a shared tile) for M m-tiles:
// every V fragment pair read from shared memory feeds all M.
template <int HD, int M>
DEVICE_INLINE void add_probabilities_times_values(float (*o)[HD / 8][4], const float (*p)[COLUMNS / 8][4],
                                                  const bf16 *Vt, int lane) {
    for (int k = 0; k < COLUMNS / 16; k++) {
        uint32_t a[M][4];
        for (int m = 0; m < M; m++) accumulators_as_a(a[m], p[m], k);
        for (int n = 0; n < HD / 16; n++) {
            uint32_t b_low[2], b_high[2];
            load_b_pair(b_low, b_high, Vt + k * 16 * Tile<HD>::ld + n * 16, Tile<HD>::ld, lane);
            for (int m = 0; m < M; m++) {
                mma_bf16_16x8x16(o[m][2 * n], a[m], b_low);
                mma_bf16_16x8x16(o[m][2 * n + 1], a[m], b_high);
            }
        }
    }
}

// A key tile's whole step for M m-tiles of a forward warp (each array from the first of
// them, whose first row is first_row; m-tile m's is first_row + 64 m): S = Q K^T, the
// online softmax (MASKED: tile_needs_mask), O += P V. The products sit in no condition of
// their own: mma.sync under a per-product condition makes ptxas fence every product with a
// warp barrier (WARPSYNC), which also keeps it from issuing the next ldmatrix early.
template <int HD, int M, bool MASKED>
DEVICE_INLINE void forward_tile(float (*o)[HD / 8][4], float (*row_max)[2], float (*row_sum)[2],
                                const uint32_t (*qa)[HD / 16][4], int first_row, const bf16 *Kt, const bf16 *Vt,
                                int key0, int start, int window, float scale_log2, int lane) {
    float s[M][COLUMNS / 8][4];
    multiply_queries_by_keys<HD, M>(s, qa, Kt, lane);
    UNROLL // else s[m] and o[m] go to local memory
    for (int m = 0; m < M; m++) {
        const int m_first_row = first_row + m * WARPS * 16;
        online_softmax_step<HD, MASKED>(s[m], o[m], row_max[m], row_sum[m], key0, m_first_row + lane / 4, start,
                                        window, scale_log2, lane % 4);
    }
    add_probabilities_times_values<HD, M>(o, s, Vt, lane);
}

// The offset of query head bh's (b * H + h) K/V head in [B, KV, T, HD].
template <int HD> DEVICE_INLINE long kv_head_offset(int bh, int H, int KV, int T) {
    const int b = bh / H, h = bh % H;
    return ((long)b * KV + h / (H / KV)) * T * HD;
}

// PLAIN's forward up to HD 64 is bounded to three blocks per SM (168 registers, as measured
// on 2026-12-04 at 142): ptxas's own choice at HD 32 (96 registers) spilled one (4 bytes,
// which the build refuses), and four blocks (128) spilled at HD 64 once the tile loads
// were unrolled.
template <int HD, Variant V> constexpr int FORWARD_BLOCKS_PER_SM = V == PLAIN && HD <= 64 ? 3 : 1;

template <int HD, Variant VARIANT, bool PROBED = false>
__global__ void __launch_bounds__(THREADS, FORWARD_BLOCKS_PER_SM<HD, VARIANT>)
    forward_kernel(float *out, bf16 *out_copy, float *lse, const bf16 *Q, const bf16 *K, const bf16 *V,
                   const int *row_start, int H, int KV, int T, float scale, int window) {
    using L = Tile<HD>;
    Probe<PROBED> probe;
    probe.begin();
    constexpr int M_TILES = FORWARD_M_TILES<HD, VARIANT>, BLOCK_ROWS = FORWARD_ROWS<HD, VARIANT>;
    DYNAMIC_SHARED(shared);
    bf16 *Ks = (bf16 *)shared, *Vs = Ks + 2 * L::elements; // two buffers each

    const int tiles = (T + BLOCK_ROWS - 1) / BLOCK_ROWS;
    const int bh = blockIdx.x, b = bh / H, h = bh % H;
    const int q0 = (tiles - 1 - (int)blockIdx.y) * BLOCK_ROWS; // the longest rows start first (forward_grid)
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, t = lane % 4;
    const int start = row_start ? row_start[b] : 0;
    const long head = (long)bh * T * HD, kv_head = kv_head_offset<HD>(bh, H, KV, T);
    const int q_last = imin(q0 + BLOCK_ROWS, T) - 1;
    // The warp's m-tile m is rows first_row[m] + [0, 16), this lane's row_low[m] and
    // row_low[m] + 8. M-tile m of all 4 warps is the block's m-th 64 rows, so every warp
    // has rows in each half: the key tiles that only one half sees (the causal diagonal,
    // a window's start) leave each warp the same work.
    int first_row[M_TILES], row_low[M_TILES];
    for (int m = 0; m < M_TILES; m++) {
        first_row[m] = q0 + m * WARPS * 16 + warp * 16;
        row_low[m] = first_row[m] + lane / 4;
    }

    // The warp's Q fragments stay in registers for the whole key loop.
    uint32_t qa[M_TILES][HD / 16][4];
    for (int m = 0; m < M_TILES; m++) {
        const int low_row = row_low[m], high_row = row_low[m] + 8;
        for (int k = 0; k < HD / 16; k++) {
            const bf16 *low = Q + head + (long)imin(low_row, T - 1) * HD + k * 16 + 2 * t;
            const bf16 *high = Q + head + (long)imin(high_row, T - 1) * HD + k * 16 + 2 * t;
            qa[m][k][0] = low_row < T ? load_u32(low) : 0u;
            qa[m][k][1] = high_row < T ? load_u32(high) : 0u;
            qa[m][k][2] = low_row < T ? load_u32(low + 8) : 0u;
            qa[m][k][3] = high_row < T ? load_u32(high + 8) : 0u;
        }
    }
    float o[M_TILES][HD / 8][4];
    float row_max[M_TILES][2]; // base-2 units, the same in the row's 4 lanes
    float row_sum[M_TILES][2]; // this lane's share of the row's sum
    for (int m = 0; m < M_TILES; m++) {
        for (int n = 0; n < HD / 8; n++) o[m][n][0] = o[m][n][1] = o[m][n][2] = o[m][n][3] = 0.0f;
        row_max[m][0] = row_max[m][1] = -INFINITY;
        row_sum[m][0] = row_sum[m][1] = 0.0f;
    }
    const float scale_log2 = scale * LOG2E;

    // The block's first row sees the earliest keys (a window's first key moves with its row).
    const int kt_first = attention_first_key(start, q0, window) / COLUMNS, kt_last = q_last / COLUMNS;
    const bool any_keys = q_last >= start;
    if (any_keys) {
        tile_load_async<HD>(Ks, K + kv_head, kt_first * COLUMNS, T);
        tile_load_async<HD>(Vs, V + kv_head, kt_first * COLUMNS, T);
        cp_async_commit();
    }
    for (int kt = kt_first; any_keys && kt <= kt_last; kt++) {
        const int buffer = (kt - kt_first) & 1;
        probe.step();
        probe.wait_begin();
        next_kv_tile<HD>(Ks, Vs, K + kv_head, V + kv_head, kt, kt_last, buffer, T); // the next tile loads while this one is used
        __syncthreads();
        probe.wait_end();
        const bf16 *Kt = Ks + buffer * L::elements, *Vt = Vs + buffer * L::elements;
        const int key0 = kt * COLUMNS;

        // Whether each m-tile sees any key of this tile (the same in all the warp's lanes):
        // not when every key is past its last row or before its first row's window, nor
        // when its rows are all padding or past T. Such an m-tile is skipped: with every
        // score masked its softmax step would change nothing. The common case, every m-tile
        // seeing the tile, runs all of them together; the others (a block's last key tile
        // for its first m-tile, windows, padding) each m-tile that sees it on its own.
        bool sees[M_TILES], all_see = true;
        for (int m = 0; m < M_TILES; m++) {
            const int last_row = imin(first_row[m] + 15, T - 1);
            sees[m] = first_row[m] < T && last_row >= start && key0 <= last_row &&
                      key0 + COLUMNS - 1 >= attention_first_key(start, first_row[m], window);
            all_see = all_see && sees[m];
        }
        // The warp's first m-tile has its smallest rows: a tile it needs no mask for, no
        // m-tile does.
        if (all_see && !tile_needs_mask(key0, COLUMNS, first_row[0], start, window)) {
            forward_tile<HD, M_TILES, false>(o, row_max, row_sum, qa, first_row[0], Kt, Vt, key0, start, window,
                                             scale_log2, lane);
        } else if (all_see) {
            forward_tile<HD, M_TILES, true>(o, row_max, row_sum, qa, first_row[0], Kt, Vt, key0, start, window,
                                            scale_log2, lane);
        } else if constexpr (M_TILES > 1) { // (one m-tile: all_see is whether it sees the tile)
            UNROLL
            for (int m = 0; m < M_TILES; m++)
                if (sees[m])
                    forward_tile<HD, 1, true>(&o[m], &row_max[m], &row_sum[m], &qa[m], first_row[m], Kt, Vt, key0,
                                              start, window, scale_log2, lane);
        }
        probe.wait_begin();
        __syncthreads(); // every warp is done with this buffer before it is refilled
        probe.wait_end();
    }

    // Unrolled, so that o[m] stays in registers: with the copy's stores this loop was no
    // longer unrolled by itself, and o went to a 304-byte stack frame (ptxas, HD 64 TUNED).
    UNROLL
    for (int m = 0; m < M_TILES; m++)
        for (int half = 0; half < 2; half++) {
            float sum = row_sum[m][half];
            sum += __shfl_xor_sync(0xffffffffu, sum, 1);
            sum += __shfl_xor_sync(0xffffffffu, sum, 2);
            const int row = row_low[m] + 8 * half;
            if (row >= T) continue;
            const float inverse = sum > 0.0f ? 1.0f / sum : 0.0f;
            const long at = ((long)b * T + row) * H * HD + h * HD + 2 * t;
            for (int n = 0; n < HD / 8; n++) {
                const float low = o[m][n][2 * half] * inverse, high = o[m][n][2 * half + 1] * inverse;
                out[at + n * 8] = low;
                out[at + n * 8 + 1] = high;
                if (out_copy) store_u32(out_copy + at + n * 8, pack_bf16x2(low, high));
            }
            if (t == 0) lse[(long)bh * T + row] = sum > 0.0f ? (row_max[m][half] + log2f(sum)) * LN2 : INFINITY;
        }
    probe.finish();
}

// Starts loading query tile q0 of head `head` (b*H + h): Q and dO rows, and their
// log-sum-exps (natural, as the forward wrote them: thread i < 64 copies row i's, and
// turns it to base 2 once its wait has completed the copy, lse_to_base2) and D values,
// all by cp.async, so the caller's cp_async_commit and cp_async_wait cover all four. Rows
// past T become zeros; their products then add nothing: Q's and dO's zero rows make S and dP zero, so P is 1
// and dS = P (dP - D) = 0, and P^T dO adds 0. (The lse and D values were plain loads and
// stores until 2026-12-05: each step's first two warps waited there for a global load's
// whole latency, and at the step's barrier so did the other two.)
template <int HD>
DEVICE_INLINE void load_query_tile(bf16 *Qs, bf16 *dOs, float *lse_s, float *D_s, const bf16 *Q, const bf16 *dO,
                                   const float *lse, const float *D, long head, int q0, int T) {
    tile_load_async<HD>(Qs, Q + head * T * HD, q0, T);
    tile_load_async<HD>(dOs, dO + head * T * HD, q0, T);
    static_assert(2 * ROWS <= THREADS, "a thread per row of lse, another per row of D");
    const int i = (int)threadIdx.x % ROWS, q = q0 + i;
    const bool valid = q < T;
    if ((int)threadIdx.x < ROWS) cp_async_4(lse_s + i, valid ? lse + head * T + q : lse, valid);
    else if ((int)threadIdx.x < 2 * ROWS) cp_async_4(D_s + i, valid ? D + head * T + q : D, valid);
}

// After the cp_async_wait that completes a query tile's copies and before the barrier that
// publishes them: the thread that copied a row's log-sum-exp (load_query_tile) scales it to
// base 2 in place, once per row rather than once per use.
DEVICE_INLINE void lse_to_base2(float *lse_t) {
    if ((int)threadIdx.x < ROWS) lse_t[threadIdx.x] *= LOG2E;
}

// The dK/dV kernel's element-wise step for a warp's 16 keys (this lane's key_low and
// key_low + 8) against a query tile from q0: S^T and dP^T (s, dp) become P^T and
// dS^T = P^T (dP^T - D) in place (MASKED: tile_needs_mask).
template <bool MASKED>
DEVICE_INLINE void key_rows_probabilities(float (*s)[4], float (*dp)[4], const float *lse_t, const float *D_t, int q0,
                                          int key_low, int start, int window, float scale_log2, int t) {
    for (int n = 0; n < COLUMNS / 8; n++)
        for (int e = 0; e < 4; e++) {
            const int column = n * 8 + 2 * t + (e & 1), q = q0 + column, key = e < 2 ? key_low : key_low + 8;
            float p = exp2_approx(s[n][e] * scale_log2 - lse_t[column]); // 0 for queries with lse +inf
            if (MASKED && masked_out(key, q, start, window)) p = 0.0f;
            s[n][e] = p;
            dp[n][e] = p * (dp[n][e] - D_t[column]);
        }
}

// The scores' gradient kept between the backward kernels ("mma-ds") is dS^T in tiles of
// 64 keys x 64 queries (bf16, row-major: keys are rows), only the tiles on or below the
// causal diagonal (query tile qt >= key tile kt: every pair either kernel visits), packed
// per head: head bh's tile (kt, qt) is number bh * score_tiles_per_head(T) +
// score_tile_index(kt, qt, tiles) of the buffer. Half the square, and each tile 8 KB in one
// piece for the dQ kernel's loads.
enum { SCORE_TILE_ELEMENTS = ROWS * COLUMNS };
HOST_DEVICE_INLINE int score_tiles_per_head(int T) {
    const int tiles = (T + ROWS - 1) / ROWS;
    return tiles * (tiles + 1) / 2;
}
HOST_DEVICE_INLINE int score_tile_index(int kt, int qt, int tiles) {
    return kt * tiles - kt * (kt - 1) / 2 + (qt - kt); // the rows before kt, then qt's place in it
}
// Kept up to head_dim 64: at 128 the dK/dV kernel has no register left for the writes
// (ptxas: 8 bytes of spill), and dQ recomputes there.
constexpr bool keeps_scores_gradient_at(int head_dim) { return head_dim <= 64; }

// The dK/dV kernel's dS^T of a warp's 16 keys (this lane's rows row_low and row_low + 8 of
// the tile, keys key_low and key_low + 8) against the tile's 64 queries, as bf16 into the
// tile: the dQ kernel that reads it (backward_q_from_scores_kernel) then needs one product
// a tile instead of three. Keys at or past T are not written (the dQ kernel's loads zero
// them); queries at or past T are written, as the zeros they are (their Q and dO rows are
// zeros).
DEVICE_INLINE void store_score_gradients(bf16 *tile, const float (*ds)[4], int row_low, int key_low, int T, int t) {
    UNROLL
    for (int half = 0; half < 2; half++) {
        if (key_low + 8 * half >= T) continue;
        bf16 *row = tile + (row_low + 8 * half) * COLUMNS + 2 * t;
        UNROLL
        for (int n = 0; n < COLUMNS / 8; n++) store_u32(row + n * 8, pack_bf16x2(ds[n][2 * half], ds[n][2 * half + 1]));
    }
}

// The dK/dV kernel's body. WRITES_SCORES: it also writes each dS^T tile it computes, as
// bf16, into scores_gradient (packed tiles: score_tile_index), for
// backward_q_from_scores_kernel.
template <int HD, Variant VARIANT, bool WRITES_SCORES, bool PROBED>
DEVICE_INLINE void backward_kv(float *dk, float *dv, int kv_row_stride, const bf16 *Q, const bf16 *K, const bf16 *V,
                               const bf16 *dO, const float *lse, const float *D, const int *row_start, int H, int KV,
                               int T, float scale, int window, bf16 *scores_gradient) {
    using L = Tile<HD>;
    Probe<PROBED> probe;
    probe.begin();
    DYNAMIC_SHARED(shared);
    bf16 *Ks = (bf16 *)shared, *Vs = Ks + L::elements;
    bf16 *Qs = Vs + L::elements, *dOs = Qs + 2 * L::elements; // two buffers each
    float *lse_s = (float *)(dOs + 2 * L::elements), *D_s = lse_s + 2 * ROWS;

    // The first key tiles, seen by the most queries, start first (backward_kv_grid).
    const int group = H / KV, b = blockIdx.x / KV, kv_head = blockIdx.x % KV, k0 = blockIdx.y * ROWS;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, t = lane % 4;
    const int start = row_start ? row_start[b] : 0;
    if (k0 + ROWS <= start) { // keys no query sees: zero gradients
        zero_rows<HD>(dk, kv_row_stride, kv_head * HD, b, T, k0);
        zero_rows<HD>(dv, kv_row_stride, kv_head * HD, b, T, k0);
        return;
    }
    const long kv_offset = ((long)b * KV + kv_head) * T * HD;
    tile_load_async<HD>(Ks, K + kv_offset, k0, T);
    tile_load_async<HD>(Vs, V + kv_offset, k0, T);
    cp_async_commit();
    // Queries k0.. see these keys; under a window only those up to W - 1 past the tile's last.
    const int q_end = window > 0 ? imin(T - 1, k0 + ROWS - 1 + window - 1) : T - 1;
    const int qt_first = imax(k0, start) / ROWS, qt_count = q_end / ROWS - qt_first + 1;
    const int steps = group * qt_count; // (head of the group, query tile) pairs
    load_query_tile<HD>(Qs, dOs, lse_s, D_s, Q, dO, lse, D, (long)b * H + kv_head * group, qt_first * ROWS, T);
    cp_async_commit();
    // The warp's K and V rows are the A operands of S^T and dP^T for every query tile.
    cp_async_wait<1>(); // K and V have arrived (the first query tile may still be loading)
    __syncthreads();
    RowOperand<HD, KV_KERNEL_KEEPS_ROWS<HD, VARIANT>> k_rows, v_rows;
    k_rows.load(Ks + warp * 16 * L::ld, lane);
    v_rows.load(Vs + warp * 16 * L::ld, lane);

    float dk_acc[HD / 8][4], dv_acc[HD / 8][4];
    for (int n = 0; n < HD / 8; n++)
        for (int e = 0; e < 4; e++) dk_acc[n][e] = dv_acc[n][e] = 0.0f;
    const int key_low = k0 + warp * 16 + lane / 4; // this lane's keys: key_low and key_low + 8
    const int warp_first_key = k0 + warp * 16;
    const float scale_log2 = scale * LOG2E;
    // WRITES_SCORES: the group's first head's tiles, each head's after the one before.
    bf16 *group_scores = nullptr;
    int tiles_per_head = 0, key_tile_first = 0;
    if constexpr (WRITES_SCORES) {
        tiles_per_head = score_tiles_per_head(T);
        key_tile_first = score_tile_index(k0 / ROWS, k0 / ROWS, (T + ROWS - 1) / ROWS); // query tile qt: + qt - kt
        group_scores = scores_gradient + ((long)b * H + kv_head * group) * tiles_per_head * SCORE_TILE_ELEMENTS;
    }
    for (int step = 0; step < steps; step++) {
        const int buffer = step & 1;
        probe.step();
        probe.wait_begin();
        if (step + 1 < steps) {
            const int member = (step + 1) / qt_count, qt = qt_first + (step + 1) % qt_count;
            load_query_tile<HD>(Qs + (buffer ^ 1) * L::elements, dOs + (buffer ^ 1) * L::elements,
                                lse_s + (buffer ^ 1) * ROWS, D_s + (buffer ^ 1) * ROWS, Q, dO, lse, D,
                                (long)b * H + kv_head * group + member, qt * ROWS, T);
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        lse_to_base2(lse_s + buffer * ROWS);
        __syncthreads();
        probe.wait_end();
        const int q0 = (qt_first + step % qt_count) * ROWS;
        const bf16 *Qt = Qs + buffer * L::elements, *dOt = dOs + buffer * L::elements;
        const float *lse_t = lse_s + buffer * ROWS, *D_t = D_s + buffer * ROWS;

        float s[COLUMNS / 8][4], dp[COLUMNS / 8][4]; // S^T and dP^T: this warp's 16 keys x 64 queries
        multiply_rows_by_tile_transposed(s, k_rows, Qt, lane);
        multiply_rows_by_tile_transposed(dp, v_rows, dOt, lane);
        if (tile_needs_mask(warp_first_key, 16, q0, start, window))
            key_rows_probabilities<true>(s, dp, lse_t, D_t, q0, key_low, start, window, scale_log2, t);
        else
            key_rows_probabilities<false>(s, dp, lse_t, D_t, q0, key_low, start, window, scale_log2, t);
        if constexpr (WRITES_SCORES) {
            // This step's head (step / qt_count of the group) and query tile q0 / 64.
            const int tile = (step / qt_count) * tiles_per_head + key_tile_first + (q0 / ROWS - k0 / ROWS);
            store_score_gradients(group_scores + (long)tile * SCORE_TILE_ELEMENTS, dp, warp * 16 + lane / 4, key_low, T, t);
        }
        multiply_registers_by_tile<HD>(dv_acc, s, dOt, lane);
        multiply_registers_by_tile<HD>(dk_acc, dp, Qt, lane);
        probe.wait_begin();
        __syncthreads(); // every warp is done with this buffer before it is refilled
        probe.wait_end();
    }
    write_rows<HD>(dv, kv_row_stride, kv_head * HD, b, T, key_low, dv_acc, 1.0f, lane);
    write_rows<HD>(dk, kv_row_stride, kv_head * HD, b, T, key_low, dk_acc, scale, lane);
    probe.finish();
}

template <int HD, Variant VARIANT, bool PROBED = false>
__global__ void __launch_bounds__(THREADS)
    backward_kv_kernel(float *dk, float *dv, int kv_row_stride, const bf16 *Q, const bf16 *K, const bf16 *V,
                       const bf16 *dO, const float *lse, const float *D, const int *row_start, int H, int KV, int T,
                       float scale, int window) {
    backward_kv<HD, VARIANT, false, PROBED>(dk, dv, kv_row_stride, Q, K, V, dO, lse, D, row_start, H, KV, T, scale,
                                            window, nullptr);
}

// The same, writing dS ("mma-ds", TUNED). Bounded to 2 blocks per SM: left to choose, ptxas
// took 168 registers at head_dim 32 and spilled 16 bytes (2 blocks is what head_dim 64 gets
// anyway).
template <int HD>
__global__ void __launch_bounds__(THREADS, 2)
    backward_kv_scores_kernel(float *dk, float *dv, int kv_row_stride, const bf16 *Q, const bf16 *K, const bf16 *V,
                              const bf16 *dO, const float *lse, const float *D, const int *row_start, int H, int KV,
                              int T, float scale, int window, bf16 *scores_gradient) {
    backward_kv<HD, TUNED, true, false>(dk, dv, kv_row_stride, Q, K, V, dO, lse, D, row_start, H, KV, T, scale, window,
                                        scores_gradient);
}

// Up to HD 64 the dQ kernel fits 168 registers without spilling (ptxas, CUDA 13), three
// blocks per SM (TUNED took 172 unbounded: two).
template <int HD> constexpr int BACKWARD_Q_BLOCKS_PER_SM = HD <= 64 ? 3 : 1;

// The dQ kernel's element-wise step for a warp's 16 queries (this lane's row_low and
// row_low + 8, their log-sum-exps in base 2 and D values) against a key tile from key0:
// dP (dp) becomes dS = P (dP - D), P from the scores s (MASKED: tile_needs_mask).
template <bool MASKED>
DEVICE_INLINE void query_rows_score_gradients(const float (*s)[4], float (*dp)[4], const float lse_rows[2],
                                              const float D_rows[2], int key0, int row_low, int start, int window,
                                              float scale_log2, int t) {
    for (int n = 0; n < COLUMNS / 8; n++)
        for (int e = 0; e < 4; e++) {
            const int key = key0 + n * 8 + 2 * t + (e & 1), half = e / 2, row = row_low + 8 * half;
            float p = exp2_approx(s[n][e] * scale_log2 - lse_rows[half]);
            if (MASKED && masked_out(key, row, start, window)) p = 0.0f;
            dp[n][e] = p * (dp[n][e] - D_rows[half]);
        }
}

template <int HD, Variant VARIANT, bool PROBED = false>
__global__ void __launch_bounds__(THREADS, BACKWARD_Q_BLOCKS_PER_SM<HD>)
    backward_q_kernel(float *dq, int q_row_stride, const bf16 *Q, const bf16 *K, const bf16 *V, const bf16 *dO,
                      const float *lse, const float *D, const int *row_start, int H, int KV, int T, float scale,
                      int window) {
    using L = Tile<HD>;
    Probe<PROBED> probe;
    probe.begin();
    DYNAMIC_SHARED(shared);
    bf16 *Qs = (bf16 *)shared, *dOs = Qs + L::elements;
    bf16 *Ks = dOs + L::elements, *Vs = Ks + 2 * L::elements; // two buffers each

    const int tiles = (T + ROWS - 1) / ROWS;
    const int bh = blockIdx.x, b = bh / H, h = bh % H;
    const int q0 = (tiles - 1 - (int)blockIdx.y) * ROWS; // the longest rows start first (backward_q_grid)
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, t = lane % 4;
    const int start = row_start ? row_start[b] : 0;
    const int q_last = imin(q0 + ROWS, T) - 1;
    if (q_last < start) { // only padding queries: zero gradients
        zero_rows<HD>(dq, q_row_stride, h * HD, b, T, q0);
        return;
    }
    const long head = (long)bh * T * HD, kv_head = kv_head_offset<HD>(bh, H, KV, T);
    const int row_low = q0 + warp * 16 + lane / 4, row_high = row_low + 8;
    const int warp_first_row = q0 + warp * 16;
    const float lse_low = row_low < T ? lse[(long)bh * T + row_low] * LOG2E : INFINITY;
    const float lse_high = row_high < T ? lse[(long)bh * T + row_high] * LOG2E : INFINITY;
    const float D_low = row_low < T ? D[(long)bh * T + row_low] : 0.0f;
    const float D_high = row_high < T ? D[(long)bh * T + row_high] : 0.0f;

    const int kt_first = attention_first_key(start, q0, window) / COLUMNS, kt_last = q_last / COLUMNS;
    tile_load_async<HD>(Qs, Q + head, q0, T);
    tile_load_async<HD>(dOs, dO + head, q0, T);
    cp_async_commit();
    tile_load_async<HD>(Ks, K + kv_head, kt_first * COLUMNS, T);
    tile_load_async<HD>(Vs, V + kv_head, kt_first * COLUMNS, T);
    cp_async_commit();
    // The warp's Q and dO rows are the A operands of S and dP for every key tile.
    cp_async_wait<1>(); // Q and dO have arrived (the first key tile may still be loading)
    __syncthreads();
    RowOperand<HD, Q_KERNEL_KEEPS_ROWS<VARIANT>> q_rows, do_rows;
    q_rows.load(Qs + warp * 16 * L::ld, lane);
    do_rows.load(dOs + warp * 16 * L::ld, lane);

    float dq_acc[HD / 8][4];
    for (int n = 0; n < HD / 8; n++) dq_acc[n][0] = dq_acc[n][1] = dq_acc[n][2] = dq_acc[n][3] = 0.0f;
    const float scale_log2 = scale * LOG2E;
    for (int kt = kt_first; kt <= kt_last; kt++) {
        const int buffer = (kt - kt_first) & 1;
        probe.step();
        probe.wait_begin();
        next_kv_tile<HD>(Ks, Vs, K + kv_head, V + kv_head, kt, kt_last, buffer, T);
        __syncthreads();
        probe.wait_end();
        const bf16 *Kt = Ks + buffer * L::elements, *Vt = Vs + buffer * L::elements;

        float s[COLUMNS / 8][4], dp[COLUMNS / 8][4]; // S and dP: this warp's 16 queries x 64 keys
        multiply_rows_by_tile_transposed(s, q_rows, Kt, lane);
        multiply_rows_by_tile_transposed(dp, do_rows, Vt, lane);
        const int key0 = kt * COLUMNS;
        const float lse_rows[2] = {lse_low, lse_high}, D_rows[2] = {D_low, D_high};
        if (tile_needs_mask(key0, COLUMNS, warp_first_row, start, window))
            query_rows_score_gradients<true>(s, dp, lse_rows, D_rows, key0, row_low, start, window, scale_log2, t);
        else
            query_rows_score_gradients<false>(s, dp, lse_rows, D_rows, key0, row_low, start, window, scale_log2, t);
        multiply_registers_by_tile<HD>(dq_acc, dp, Kt, lane);
        probe.wait_begin();
        __syncthreads(); // every warp is done with this buffer before it is refilled
        probe.wait_end();
    }
    write_rows<HD>(dq, q_row_stride, h * HD, b, T, row_low, dq_acc, scale, lane);
    probe.finish();
}

// The A fragment of the 16 x 16 block of m^T at m (m row-major, ld elements per row):
// block (rows r, columns c) of A is m's block (rows c, columns r), read by one
// ldmatrix.trans of m's four 8x8 quarters in A's register order (A rows 0-7 | 8-15 of
// columns 0-7, then of columns 8-15: m's rows 0-7 at columns 0-7 and 8-15, then its rows
// 8-15). Lane i gives m's row (i / 16) * 8 + i % 8 at columns ((i / 8) % 2) * 8.
DEVICE_INLINE void load_a_transposed(uint32_t a[4], const bf16 *m, int ld, int lane) {
    ldmatrix_x4_trans(a, m + ((lane / 16) * 8 + lane % 8) * ld + ((lane / 8) % 2) * 8);
}

// Starts copying a packed tile of the scores' gradient (`from`: 64 key rows of 64 queries,
// the tile's first key key0) into a padded shared tile; keys at or past T become zeros.
DEVICE_INLINE void score_tile_load_async(bf16 *tile, const bf16 *from, int key0, int T) {
    constexpr int chunks = COLUMNS / 8, rows_per_pass = THREADS / chunks;
    const int first = (int)threadIdx.x / chunks, column = (int)threadIdx.x % chunks * 8;
    UNROLL
    for (int i = 0; i < ROWS / rows_per_pass; i++) {
        const int row = first + i * rows_per_pass;
        const bool valid = key0 + row < T;
        cp_async_16(tile + row * Tile<COLUMNS>::ld + column, valid ? from + row * COLUMNS + column : from, valid);
    }
}

// dQ from the scores' gradient that backward_kv_scores_kernel wrote: for each key tile a
// query tile sees, dQ += dS K, one product (the dQ kernel above recomputes S and dP for it:
// three). The same blocks, grid (backward_q_grid) and key tiles as backward_q_kernel, whose
// visits are exactly the (query tile, key tile) pairs the dK/dV kernel wrote; masked
// entries were written as zeros. dS^T's tile is read as dS by ldmatrix.trans.
template <int HD>
__global__ void __launch_bounds__(THREADS)
    backward_q_from_scores_kernel(float *dq, int q_row_stride, const bf16 *K, const bf16 *scores_gradient,
                                  const int *row_start, int H, int KV, int T, float scale, int window) {
    using L = Tile<HD>;
    using S = Tile<COLUMNS>;
    DYNAMIC_SHARED(shared);
    bf16 *Ks = (bf16 *)shared, *dSs = Ks + 2 * L::elements; // two buffers each

    const int tiles = (T + ROWS - 1) / ROWS;
    const int bh = blockIdx.x, b = bh / H, h = bh % H;
    const int q0 = (tiles - 1 - (int)blockIdx.y) * ROWS; // the longest rows start first (backward_q_grid)
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int start = row_start ? row_start[b] : 0;
    const int q_last = imin(q0 + ROWS, T) - 1;
    if (q_last < start) { // only padding queries: zero gradients
        zero_rows<HD>(dq, q_row_stride, h * HD, b, T, q0);
        return;
    }
    const long kv_head = kv_head_offset<HD>(bh, H, KV, T);
    // This head's tiles; query tile q0 / 64's of key tile kt is score_tile_index(kt, q0 / 64).
    const bf16 *scores = scores_gradient + (long)bh * score_tiles_per_head(T) * SCORE_TILE_ELEMENTS;
    const int qt = q0 / ROWS;
    auto score_tile = [&](int kt) { return scores + score_tile_index(kt, qt, tiles) * SCORE_TILE_ELEMENTS; };
    const int row_low = q0 + warp * 16 + lane / 4;
    const int kt_first = attention_first_key(start, q0, window) / COLUMNS, kt_last = q_last / COLUMNS;
    tile_load_async<HD>(Ks, K + kv_head, kt_first * COLUMNS, T);
    score_tile_load_async(dSs, score_tile(kt_first), kt_first * COLUMNS, T);
    cp_async_commit();

    float dq_acc[HD / 8][4];
    for (int n = 0; n < HD / 8; n++) dq_acc[n][0] = dq_acc[n][1] = dq_acc[n][2] = dq_acc[n][3] = 0.0f;
    for (int kt = kt_first; kt <= kt_last; kt++) {
        const int buffer = (kt - kt_first) & 1;
        if (kt < kt_last) { // the next tile loads while this one is used
            tile_load_async<HD>(Ks + (buffer ^ 1) * L::elements, K + kv_head, (kt + 1) * COLUMNS, T);
            score_tile_load_async(dSs + (buffer ^ 1) * S::elements, score_tile(kt + 1), (kt + 1) * COLUMNS, T);
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        const bf16 *Kt = Ks + buffer * L::elements, *dSt = dSs + buffer * S::elements;
        // dQ (16 x HD) += dS (16 x 64: this warp's queries, the tile's keys) K (64 x HD).
        for (int k = 0; k < COLUMNS / 16; k++) {
            uint32_t a[4];
            load_a_transposed(a, dSt + k * 16 * S::ld + warp * 16, S::ld, lane);
            for (int n = 0; n < HD / 16; n++) {
                uint32_t b_low[2], b_high[2];
                load_b_pair(b_low, b_high, Kt + k * 16 * L::ld + n * 16, L::ld, lane);
                mma_bf16_16x8x16(dq_acc[2 * n], a, b_low);
                mma_bf16_16x8x16(dq_acc[2 * n + 1], a, b_high);
            }
        }
        __syncthreads(); // every warp is done with this buffer before it is refilled
    }
    write_rows<HD>(dq, q_row_stride, h * HD, b, T, row_low, dq_acc, scale, lane);
}

} // namespace attention_mma
