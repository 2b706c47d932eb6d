// LayerNorm and RMSNorm, forward and backward. Statistics are accumulated in double so
// that the result does not depend on the row's magnitude.
#include <math.h>

#include "ops/cpu/ops_cpu.h"

void cpu_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                           const float *weight, const float *bias, int N, int C, float eps) {
#pragma omp parallel for schedule(static)
    for (int i = 0; i < N; i++) {
        const float *x = inp + (long)i * C;
        double sum = 0;
        for (int c = 0; c < C; c++) sum += x[c];
        double mu = sum / C;
        double var = 0;
        for (int c = 0; c < C; c++) var += (x[c] - mu) * (x[c] - mu);
        var /= C;
        float s = (float)(1.0 / sqrt(var + eps));
        float m = (float)mu;
        float *y = out + (long)i * C;
        for (int c = 0; c < C; c++) y[c] = (x[c] - m) * s * weight[c] + (bias ? bias[c] : 0.0f);
        mean[i] = m;
        rstd[i] = s;
    }
}

void cpu_layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                            const float *inp, const float *weight, const float *mean,
                            const float *rstd, int N, int C) {
    if (dinp) {
#pragma omp parallel for schedule(static)
        for (int i = 0; i < N; i++) {
            const float *x = inp + (long)i * C, *dy = dout + (long)i * C;
            float m = mean[i], s = rstd[i];
            // dx = s * (g - mean(g) - xhat * mean(g * xhat)), with g = dy * w
            double sum_g = 0, sum_g_xhat = 0;
            for (int c = 0; c < C; c++) {
                float g = dy[c] * weight[c];
                float xhat = (x[c] - m) * s;
                sum_g += g;
                sum_g_xhat += (double)g * xhat;
            }
            float mean_g = (float)(sum_g / C), mean_g_xhat = (float)(sum_g_xhat / C);
            float *dx = dinp + (long)i * C;
            for (int c = 0; c < C; c++) {
                float xhat = (x[c] - m) * s;
                dx[c] += s * (dy[c] * weight[c] - mean_g - xhat * mean_g_xhat);
            }
        }
    }
    if (dweight || dbias) {
        const int block = 16;
#pragma omp parallel for schedule(static)
        for (int c0 = 0; c0 < C; c0 += block) {
            int c1 = c0 + block < C ? c0 + block : C;
            for (int i = 0; i < N; i++) {
                const float *x = inp + (long)i * C, *dy = dout + (long)i * C;
                for (int c = c0; c < c1; c++) {
                    if (dweight) dweight[c] += dy[c] * (x[c] - mean[i]) * rstd[i];
                    if (dbias) dbias[c] += dy[c];
                }
            }
        }
    }
}

void cpu_rmsnorm_forward(float *out, float *rstd, const float *inp, const float *weight, int N,
                         int C, float eps, bool weight_plus_one) {
    float offset = weight_plus_one ? 1.0f : 0.0f;
#pragma omp parallel for schedule(static)
    for (int i = 0; i < N; i++) {
        const float *x = inp + (long)i * C;
        double sum_sq = 0;
        for (int c = 0; c < C; c++) sum_sq += (double)x[c] * x[c];
        float s = (float)(1.0 / sqrt(sum_sq / C + eps));
        float *y = out + (long)i * C;
        for (int c = 0; c < C; c++) y[c] = x[c] * s * (offset + weight[c]);
        rstd[i] = s;
    }
}

void cpu_rmsnorm_backward(float *dinp, float *dweight, const float *dout, const float *inp,
                          const float *weight, const float *rstd, int N, int C,
                          bool weight_plus_one) {
    float offset = weight_plus_one ? 1.0f : 0.0f;
    if (dinp) {
#pragma omp parallel for schedule(static)
        for (int i = 0; i < N; i++) {
            const float *x = inp + (long)i * C, *dy = dout + (long)i * C;
            float s = rstd[i];
            // y = x*s*w with s = (mean(x^2)+eps)^-1/2:  dx = s*(g - xhat*mean(g*xhat)), g = dy*w
            double sum_g_xhat = 0;
            for (int c = 0; c < C; c++) sum_g_xhat += (double)dy[c] * (offset + weight[c]) * x[c] * s;
            float mean_g_xhat = (float)(sum_g_xhat / C);
            float *dx = dinp + (long)i * C;
            for (int c = 0; c < C; c++)
                dx[c] += s * (dy[c] * (offset + weight[c]) - x[c] * s * mean_g_xhat);
        }
    }
    if (dweight) {
        const int block = 16;
#pragma omp parallel for schedule(static)
        for (int c0 = 0; c0 < C; c0 += block) {
            int c1 = c0 + block < C ? c0 + block : C;
            for (int i = 0; i < N; i++) {
                const float *x = inp + (long)i * C, *dy = dout + (long)i * C;
                for (int c = c0; c < c1; c++) dweight[c] += dy[c] * x[c] * rstd[i];
            }
        }
    }
}
