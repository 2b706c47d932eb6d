// A batch-invariant matmul: out = inp . weight^T where each output element is computed by
// one fixed sequence of float operations that depends only on IC, never on the number of
// rows N, the row's place among them, the output tile it falls in or the thread count.
// So a row gets the same bits alone or in any batch, which OpenBLAS's sgemm does not
// promise: its Haswell/Zen kernels round a row differently for another N or another
// thread split (docs/lora.md, "One policy"). --batch-invariant (or the equivalent
// MARLHF_CPU_MATMUL=batch-invariant; cpu_set_matmul_mode) sends the CPU's float linear
// layers (ops/cpu/matmul.c) and the dequantized tiles of a quantized base
// (ops/cpu/matmul_q8.c) here; the backward stays on sgemm (it must be exact, not
// row-invariant).
//
// The fixed sequence for out[i][o], with x = inp row i and w = weight row o:
//   16 lane sums s[0..15], all +0; for k0 = 0, 16, 32, ... < IC, lane l (when k0 + l < IC)
//   does s[l] = fma(x[k0 + l], w[k0 + l], s[l]); then the lanes are added as a tree,
//   s[l] += s[l + 8], then + 4, + 2, + 1; s[0] is the dot product (plus the old out when
//   accumulating, one more add).
// The AVX-512 kernel below holds a 16-lane sum in one register and the portable loop in
// an array: both do exactly these operations, so they give the same bits
// (tests/test_row_invariance.c checks it). The kernel computes 4 input rows x 4 weight
// rows at once (16 sums in registers, each input and weight vector loaded once per 4
// uses); leftover weight rows are computed on a repeated row and thrown away, leftover
// input rows one at a time, both with the same sequence.
#include <immintrin.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "core/check.h"
#include "core/sanitizer.h"
#include "ops/cpu/ops_cpu.h"

#define LANES 16
#define KERNEL_ROWS 4    // input rows per kernel call
#define KERNEL_WEIGHTS 4 // weight rows per kernel call
// A thread's unit of work: this many input rows x weight rows, small enough that its
// inputs and weights stay in the core's L2 cache while its kernels run over them.
#define TILE_ROWS 32
#define TILE_WEIGHTS 32

// The linear layers' kernel, chosen once per process before the first forward: -1 until
// chosen, 0 sgemm, 1 the fixed-order kernel. The commands' --batch-invariant and the API's
// marlhf_set_batch_invariant choose it through ops_choose_batch_invariant; a program that
// does neither (the tests and benchmarks that call the ops directly) gets
// $MARLHF_CPU_MATMUL's choice at the first matmul.
static int matmul_mode = -1;

// $MARLHF_CPU_MATMUL: *choice -1 (unset), 0 (sgemm) or 1 (batch-invariant); a bad value is
// -1 with err_set() naming the variable.
static int environment_choice(int *choice) {
    const char *setting = getenv("MARLHF_CPU_MATMUL");
    *choice = -1;
    if (!setting) return 0;
    if (!strcmp(setting, "sgemm")) *choice = 0;
    else if (!strcmp(setting, "batch-invariant")) *choice = 1;
    else return err_set("MARLHF_CPU_MATMUL=%s: expected sgemm or batch-invariant", setting);
    return 0;
}

void cpu_set_matmul_mode(bool batch_invariant) { matmul_mode = batch_invariant ? 1 : 0; }

bool cpu_matmul_batch_invariant(void) {
    if (matmul_mode < 0) { // read by the thread that calls the ops
        int choice;
        if (environment_choice(&choice) != 0) die_from_err();
        matmul_mode = choice == 1;
    }
    return matmul_mode == 1;
}

int ops_choose_batch_invariant(const char *device, int requested, const char *request) {
    int environment;
    if (environment_choice(&environment) != 0) return -1;
    if (requested >= 0 && environment >= 0 && requested != environment)
        return err_set("%s and MARLHF_CPU_MATMUL=%s disagree: give one of them", request, getenv("MARLHF_CPU_MATMUL"));
    const int on = requested >= 0 ? requested : matmul_mode >= 0 ? matmul_mode : environment == 1;
    // The GPU's matmuls (cuBLASLt) have no fixed-order kernel: a run there would not be the
    // row-invariant run it asked for.
    if (on && device && strcmp(device, "cpu"))
        return err_set("%s: the row-invariant forward is a CPU kernel, --device %s has none",
                       requested < 0 && environment == 1 ? "MARLHF_CPU_MATMUL=batch-invariant" : request, device);
    cpu_set_matmul_mode(on);
    return 0;
}

bool ops_batch_invariant(const OpsBackend *ops) { return ops == &ops_cpu && cpu_matmul_batch_invariant(); }

// The portable form of the sequence: one output element.
// Whole groups of LANES first, without a bound check inside, so that the compiler can
// keep s in vector registers; then the partial group.
// A build without -march (the sanitizer build) would call libm's software fmaf for every
// term; on x86-64 a second copy compiled for FMA is chosen at load time where the CPU has
// the instruction. fmaf is exactly rounded either way, and the function has no separate
// product and sum the compiler could fuse, so both copies give the same bits. Unchecked
// access by access: the caller checks the whole ranges (core/sanitizer.h).
FMA_CLONES SANITIZER_UNCHECKED static float dot_fixed_order_portable(const float *x, const float *w, int IC) {
    float s[LANES] = {0};
    int k0 = 0;
    for (; k0 + LANES <= IC; k0 += LANES)
        for (int l = 0; l < LANES; l++) s[l] = fmaf(x[k0 + l], w[k0 + l], s[l]);
    for (int l = 0; k0 + l < IC; l++) s[l] = fmaf(x[k0 + l], w[k0 + l], s[l]);
    for (int half = LANES / 2; half >= 1; half /= 2)
        for (int l = 0; l < half; l++) s[l] += s[l + half];
    return s[0];
}

void cpu_matmul_fixed_order_portable(float *out, long out_stride, const float *inp, const float *weight, int N,
                                     int IC, int OC, bool accumulate) {
    if (N <= 0 || OC <= 0) return;
    SANITIZER_CHECK_RANGE(weight, (size_t)OC * IC * sizeof(float));
    SANITIZER_CHECK_RANGE(inp, (size_t)N * IC * sizeof(float));
#pragma omp parallel for schedule(static)
    for (int o = 0; o < OC; o++)
        for (int i = 0; i < N; i++) {
            float d = dot_fixed_order_portable(inp + (long)i * IC, weight + (long)o * IC, IC);
            float *y = out + (long)i * out_stride + o;
            *y = accumulate ? *y + d : d;
        }
}

#if defined(__AVX512F__) && defined(__AVX512DQ__)
// The lane tree of the sequence: 16 -> 8 -> 4 -> 2 -> 1, lane l adding lane l + half.
static inline float reduce_lanes(__m512 s16) {
    __m256 s8 = _mm256_add_ps(_mm512_castps512_ps256(s16), _mm512_extractf32x8_ps(s16, 1));
    __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
    __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    __m128 s1 = _mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1));
    return _mm_cvtss_f32(s1);
}

// ROWS input rows (x[r]) against KERNEL_WEIGHTS weight rows (w[c]); y[r][c] receives the
// dot product of x[r] and w[c]. ROWS is a constant at each call, so the sums stay in
// registers.
SANITIZER_UNCHECKED static inline __attribute__((always_inline)) void
kernel(float y[][KERNEL_WEIGHTS], const float *const *x, const float *const *w, int ROWS, int IC) {
    __m512 s[KERNEL_ROWS][KERNEL_WEIGHTS];
    for (int r = 0; r < ROWS; r++)
        for (int c = 0; c < KERNEL_WEIGHTS; c++) s[r][c] = _mm512_setzero_ps();
    int k0 = 0;
    for (; k0 + LANES <= IC; k0 += LANES) {
        __m512 wv[KERNEL_WEIGHTS];
        for (int c = 0; c < KERNEL_WEIGHTS; c++) wv[c] = _mm512_loadu_ps(w[c] + k0);
        for (int r = 0; r < ROWS; r++) {
            __m512 xv = _mm512_loadu_ps(x[r] + k0);
            for (int c = 0; c < KERNEL_WEIGHTS; c++) s[r][c] = _mm512_fmadd_ps(xv, wv[c], s[r][c]);
        }
    }
    if (k0 < IC) { // the last, partial lanes: the others keep their sums (mask3)
        const __mmask16 mask = (__mmask16)((1u << (IC - k0)) - 1);
        __m512 wv[KERNEL_WEIGHTS];
        for (int c = 0; c < KERNEL_WEIGHTS; c++) wv[c] = _mm512_maskz_loadu_ps(mask, w[c] + k0);
        for (int r = 0; r < ROWS; r++) {
            __m512 xv = _mm512_maskz_loadu_ps(mask, x[r] + k0);
            for (int c = 0; c < KERNEL_WEIGHTS; c++) s[r][c] = _mm512_mask3_fmadd_ps(xv, wv[c], s[r][c], mask);
        }
    }
    for (int r = 0; r < ROWS; r++)
        for (int c = 0; c < KERNEL_WEIGHTS; c++) y[r][c] = reduce_lanes(s[r][c]);
}

// Input rows [i0, i1) x weight rows [o0, o1) of the product.
SANITIZER_UNCHECKED static void tile(float *out, long out_stride, const float *inp, const float *weight, int i0,
                                     int i1, int o0, int o1, int IC, bool accumulate) {
    for (int c0 = o0; c0 < o1; c0 += KERNEL_WEIGHTS) {
        const int weights = o1 - c0 < KERNEL_WEIGHTS ? o1 - c0 : KERNEL_WEIGHTS;
        const float *w[KERNEL_WEIGHTS];
        for (int c = 0; c < KERNEL_WEIGHTS; c++) w[c] = weight + (long)(c0 + (c < weights ? c : 0)) * IC;
        for (int r0 = i0; r0 < i1;) {
            float y[KERNEL_ROWS][KERNEL_WEIGHTS];
            const float *x[KERNEL_ROWS];
            int rows;
            if (i1 - r0 >= KERNEL_ROWS) {
                rows = KERNEL_ROWS;
                for (int r = 0; r < rows; r++) x[r] = inp + (long)(r0 + r) * IC;
                kernel(y, x, w, KERNEL_ROWS, IC);
            } else {
                rows = 1;
                x[0] = inp + (long)r0 * IC;
                kernel(y, x, w, 1, IC);
            }
            for (int r = 0; r < rows; r++)
                for (int c = 0; c < weights; c++) {
                    float *dst = out + (long)(r0 + r) * out_stride + c0 + c;
                    *dst = accumulate ? *dst + y[r][c] : y[r][c];
                }
            r0 += rows;
        }
    }
}

void cpu_matmul_fixed_order(float *out, long out_stride, const float *inp, const float *weight, int N, int IC, int OC,
                            bool accumulate) {
    if (N <= 0 || OC <= 0) return;
    SANITIZER_CHECK_RANGE(weight, (size_t)OC * IC * sizeof(float));
    SANITIZER_CHECK_RANGE(inp, (size_t)N * IC * sizeof(float));
    SANITIZER_CHECK_RANGE(out, ((size_t)(N - 1) * out_stride + OC) * sizeof(float));
    const int row_tiles = (N + TILE_ROWS - 1) / TILE_ROWS, weight_tiles = (OC + TILE_WEIGHTS - 1) / TILE_WEIGHTS;
    // The larger operand is read once from memory: its tiles are the outer loop, and the
    // smaller one (more likely to stay in the caches) is read again for each of them. With
    // a static schedule each thread takes a contiguous run of outer tiles.
    const bool weights_outer = OC > N;
#pragma omp parallel for schedule(static)
    for (long t = 0; t < (long)row_tiles * weight_tiles; t++) {
        const long row_tile = weights_outer ? t % row_tiles : t / weight_tiles;
        const long weight_tile = weights_outer ? t / row_tiles : t % weight_tiles;
        const int i0 = (int)row_tile * TILE_ROWS, o0 = (int)weight_tile * TILE_WEIGHTS;
        const int i1 = i0 + TILE_ROWS < N ? i0 + TILE_ROWS : N, o1 = o0 + TILE_WEIGHTS < OC ? o0 + TILE_WEIGHTS : OC;
        tile(out, out_stride, inp, weight, i0, i1, o0, o1, IC, accumulate);
    }
}
#else
// Without AVX-512 the portable loop is the kernel (the same bits, more slowly).
void cpu_matmul_fixed_order(float *out, long out_stride, const float *inp, const float *weight, int N, int IC, int OC,
                            bool accumulate) {
    cpu_matmul_fixed_order_portable(out, out_stride, inp, weight, N, IC, OC, accumulate);
}
#endif
