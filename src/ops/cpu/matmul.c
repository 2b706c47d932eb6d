// Linear layers through OpenBLAS sgemm. These calls are made outside any OpenMP
// parallel region so that OpenBLAS (the OpenMP build) uses all threads itself.
#include <cblas.h>
#include <stdbool.h>

#include "ops/cpu/ops_cpu.h"

// out = inp . weight^T, or out += it when `accumulate`.
static void matmul(float *out, const float *inp, const float *weight, int N, int IC, int OC, bool accumulate) {
    // A few rows (decode steps at small batch) are matrix-vector products: streaming each
    // weight row once for all N inputs beats sgemm's packing, which costs more than the
    // arithmetic here. The simd reduction fixes the summation order for a given build.
    if (N <= 4) {
#pragma omp parallel for schedule(static)
        for (int o = 0; o < OC; o++) {
            const float *w = weight + (long)o * IC;
            for (int i = 0; i < N; i++) {
                const float *x = inp + (long)i * IC;
                float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
                for (int c = 0; c < IC; c++) sum += w[c] * x[c];
                out[(long)i * OC + o] = accumulate ? out[(long)i * OC + o] + sum : sum;
            }
        }
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

void cpu_matmul_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                         const float *inp, const float *weight, int N, int IC, int OC) {
    if (dinp)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, IC, OC, 1.0f, dout, OC,
                    weight, IC, 1.0f, dinp, IC);
    if (dweight)
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, IC, N, 1.0f, dout, OC, inp, IC,
                    1.0f, dweight, IC);
    if (dbias) {
        const int block = 16;
#pragma omp parallel for schedule(static)
        for (int o0 = 0; o0 < OC; o0 += block) {
            int o1 = o0 + block < OC ? o0 + block : OC;
            for (int i = 0; i < N; i++)
                for (int o = o0; o < o1; o++) dbias[o] += dout[(long)i * OC + o];
        }
    }
}
