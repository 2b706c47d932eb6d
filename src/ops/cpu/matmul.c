// Linear layers through OpenBLAS sgemm. These calls are made outside any OpenMP
// parallel region so that OpenBLAS (the OpenMP build) uses all threads itself.
#include <cblas.h>
#include <stdbool.h>
#include <string.h>

#include "core/sanitizer.h"
#include "ops/cpu/ops_cpu.h"

// One weight row against n input rows, which are `width` apart: out[i * out_stride] =
// w . x_i (+ its old value when `accumulate`). The simd reduction fixes the summation
// order for a given build (in the sanitizer build, for the copy the CPU runs: FMA_CLONES).
// Exempt from the sanitizers' per-access checks: matmul checks the whole ranges first
// (core/sanitizer.h).
FMA_CLONES SANITIZER_UNCHECKED static void dot_rows(float *out, long out_stride, const float *w,
                                         const float *inp, int n, int width, bool accumulate) {
    for (int i = 0; i < n; i++) {
        const float *x = inp + (long)i * width;
        float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
        for (int c = 0; c < width; c++) sum += w[c] * x[c];
        out[i * out_stride] = accumulate ? out[i * out_stride] + sum : sum;
    }
}

// out = inp . weight^T, or out += it when `accumulate`.
// With the row-invariant forward chosen (--batch-invariant, MARLHF_CPU_MATMUL=batch-invariant;
// cpu_matmul_batch_invariant) every N takes the fixed-order kernel
// (ops/cpu/matmul_invariant.c), so a row's bits do not depend on the batch around it.
static void matmul(float *out, const float *inp, const float *weight, int N, int IC, int OC, bool accumulate) {
    if (cpu_matmul_batch_invariant()) {
        cpu_matmul_fixed_order(out, OC, inp, weight, N, IC, OC, accumulate);
        return;
    }
    // A few rows (decode steps at small batch) are matrix-vector products: streaming each
    // weight row once for all N inputs beats sgemm's packing, which costs more than the
    // arithmetic here.
    if (N <= 4) {
        SANITIZER_CHECK_RANGE(weight, (size_t)OC * IC * sizeof(float));
        SANITIZER_CHECK_RANGE(inp, (size_t)N * IC * sizeof(float));
        SANITIZER_CHECK_RANGE(out, (size_t)N * OC * sizeof(float));
#pragma omp parallel for schedule(static)
        for (int o = 0; o < OC; o++) dot_rows(out + o, OC, weight + (long)o * IC, inp, N, IC, accumulate);
    } else
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, OC, IC, 1.0f, inp, IC, weight,
                    IC, accumulate ? 1.0f : 0.0f, out, OC);
}

void cpu_matmul_forward(float *out, const float *inp, const float *weight, const float *bias,
                        int N, int IC, int OC) {
    matmul(out, inp, weight, N, IC, OC, false);
    if (bias) {
#pragma omp parallel for schedule(static)
        for (int i = 0; i < N; i++)
            for (int o = 0; o < OC; o++) out[(long)i * OC + o] += bias[o];
    }
}

void cpu_matmul_accumulate(float *out, const float *inp, const float *weight, int N, int IC, int OC) {
    matmul(out, inp, weight, N, IC, OC, true);
}

void cpu_matmul_forward_residual(float *out, const float *inp, const float *weight, const float *bias,
                                 const float *residual, int N, int IC, int OC) {
    cpu_matmul_forward(out, inp, weight, bias, N, IC, OC);
    const long n = (long)N * OC;
#pragma omp parallel for schedule(static)
    // cpu_backend.c's accumulate, the same floats; written out here so that this file stands
    // alone (tests/test_ops_f64.c compiles it in double).
    for (long i = 0; i < n; i++) out[i] += residual[i];
}

void cpu_matmul_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                         const float *inp, const float *weight, int N, int IC, int OC, WriteMode dinp_mode,
                         WriteMode weight_mode) {
    // beta 0: sgemm writes its output without reading it
    if (dinp)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, IC, OC, 1.0f, dout, OC,
                    weight, IC, dinp_mode == WRITE_ADD ? 1.0f : 0.0f, dinp, IC);
    if (dweight)
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, IC, N, 1.0f, dout, OC, inp, IC,
                    weight_mode == WRITE_ADD ? 1.0f : 0.0f, dweight, IC);
    if (dbias) {
        // Overwritten: the sums start from 0 as added ones would, the same bits.
        if (weight_mode == WRITE_OVERWRITE) memset(dbias, 0, (size_t)OC * sizeof(float));
        const int block = 16;
#pragma omp parallel for schedule(static)
        for (int o0 = 0; o0 < OC; o0 += block) {
            int o1 = o0 + block < OC ? o0 + block : OC;
            for (int i = 0; i < N; i++)
                for (int o = o0; o < o1; o++) dbias[o] += dout[(long)i * OC + o];
        }
    }
}
