// The AdamW update (Loshchilov & Hutter): decay is applied to the weights directly,
// not through the gradient, matching torch.optim.AdamW.
#include <math.h>

#include "ops/cpu/ops_cpu.h"

void cpu_adamw_update(float *params, const float *grads, float *m, float *v, long n, float lr,
                      float beta1, float beta2, float eps, float weight_decay,
                      float bias_correction1, float bias_correction2, float grad_scale) {
    // torch: p *= 1 - lr*wd; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
    //        p -= lr/bc1 * m / (sqrt(v)/sqrt(bc2) + eps)
    const float step_size = lr / bias_correction1;
    const float sqrt_bc2 = sqrtf(bias_correction2);
#pragma omp parallel for schedule(static)
    for (long i = 0; i < n; i++) {
        float g = grads[i] * grad_scale;
        float p = params[i] * (1.0f - lr * weight_decay);
        float mi = beta1 * m[i] + (1.0f - beta1) * g;
        float vi = beta2 * v[i] + (1.0f - beta2) * g * g;
        m[i] = mi;
        v[i] = vi;
        params[i] = p - step_size * mi / (sqrtf(vi) / sqrt_bc2 + eps);
    }
}

// Fixed chunks summed in order: the result does not depend on the thread count.
double cpu_sum_squares(const float *x, long n) {
    const long chunk = 1 << 16;
    long n_chunks = (n + chunk - 1) / chunk;
    double partial[n_chunks > 0 ? n_chunks : 1];
#pragma omp parallel for schedule(static)
    for (long c = 0; c < n_chunks; c++) {
        long end = (c + 1) * chunk < n ? (c + 1) * chunk : n;
        double sum = 0;
        for (long i = c * chunk; i < end; i++) sum += (double)x[i] * x[i];
        partial[c] = sum;
    }
    double total = 0;
    for (long c = 0; c < n_chunks; c++) total += partial[c];
    return total;
}
