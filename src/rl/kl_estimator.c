#include "rl/kl_estimator.h"

#include <math.h>
#include <string.h>

double kl_estimate(KlEstimator estimator, double x) {
    switch (estimator) {
    case KL_K1: return x;
    case KL_K2: return 0.5 * x * x;
    case KL_K3: return exp(-x) + x - 1.0;
    case KL_ABS: return fabs(x);
    }
    return x;
}

double kl_estimate_slope(KlEstimator estimator, double x) {
    switch (estimator) {
    case KL_K1: return 1.0;
    case KL_K2: return x;
    case KL_K3: return 1.0 - exp(-x);
    case KL_ABS: return x > 0 ? 1.0 : x < 0 ? -1.0 : 0.0;
    }
    return 1.0;
}

static const char *const kl_estimator_names[] = {"k1", "k2", "k3", "abs"};

int kl_estimator_from_name(const char *name, KlEstimator *out) {
    for (int k = 0; k < (int)(sizeof kl_estimator_names / sizeof kl_estimator_names[0]); k++)
        if (!strcmp(name, kl_estimator_names[k])) {
            *out = (KlEstimator)k;
            return 0;
        }
    return -1;
}

const char *kl_estimator_name(KlEstimator estimator) { return kl_estimator_names[estimator]; }
