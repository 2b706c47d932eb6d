#include "rl/ppo_loss.h"

#include <math.h>
#include <string.h>

int ratio_kind_from_name(const char *name, RatioKind *out) {
    if (!strcmp(name, "per-token") || !strcmp(name, "per_token") || !strcmp(name, "token")) *out = RATIO_PER_TOKEN;
    else if (!strcmp(name, "macro") || !strcmp(name, "macro-product") || !strcmp(name, "macro_product"))
        *out = RATIO_MACRO_PRODUCT;
    else return -1;
    return 0;
}

// One policy term: loss value and d loss / d log rho (= rho * d loss / d rho), the ratio
// clipped to [1 - eps_low, 1 + eps_high].
static double clipped_term(double advantage, double log_ratio, double eps_low, double eps_high, double *d_log_ratio,
                           int *clipped) {
    double ratio = exp(log_ratio);
    double clipped_ratio = ratio < 1 - eps_low ? 1 - eps_low : ratio > 1 + eps_high ? 1 + eps_high : ratio;
    double unclipped_loss = -advantage * ratio, clipped_loss = -advantage * clipped_ratio;
    *clipped = ratio < 1 - eps_low || ratio > 1 + eps_high;
    if (unclipped_loss >= clipped_loss) {
        *d_log_ratio = -advantage * ratio;
        return unclipped_loss;
    }
    // The clipped branch is active only outside the clip range, where it is constant.
    *d_log_ratio = 0;
    return clipped_loss;
}

double ppo_policy_loss(const PpoLossConfig *config, const float *logp_new, const float *logp_old,
                       const float *advantages, const int *segment_lengths, int segments, int R, float scale,
                       float *dlogp, PpoLossStats *stats) {
    double loss = 0;
    int first = 0;
    for (int s = 0; s < segments; s++) {
        int m = segment_lengths[s];
        double macro_log_ratio = 0;
        if (config->ratio == RATIO_MACRO_PRODUCT)
            for (int i = 0; i < m; i++) macro_log_ratio += (double)logp_new[first + i] - logp_old[first + i];
        double macro_gradient = 0; // d loss / d macro log-ratio, summed over the action's tokens
        for (int i = 0; i < m; i++) {
            int t = first + i;
            double token_log_ratio = (double)logp_new[t] - logp_old[t];
            double log_ratio = config->ratio == RATIO_MACRO_PRODUCT ? macro_log_ratio : token_log_ratio;
            double d_log_ratio;
            int clipped;
            loss += clipped_term(advantages[t], log_ratio, config->clip_ratio, config->clip_ratio_high, &d_log_ratio,
                                 &clipped);
            if (config->ratio == RATIO_MACRO_PRODUCT) macro_gradient += d_log_ratio;
            else if (dlogp) dlogp[t] += (float)(d_log_ratio * scale);
            if (stats) {
                stats->clipped += clipped;
                stats->approx_kl += 0.5 * token_log_ratio * token_log_ratio;
                stats->ratio_sum += exp(log_ratio);
                stats->tokens += 1;
            }
        }
        // Every token's log-prob enters the shared macro ratio.
        if (config->ratio == RATIO_MACRO_PRODUCT && dlogp)
            for (int i = 0; i < m; i++) dlogp[first + i] += (float)(macro_gradient * scale);
        first += m;
    }
    (void)R;
    if (stats) stats->policy_loss += loss;
    return loss;
}

double ppo_value_loss(const PpoLossConfig *config, const float *values_new, const float *values_old,
                      const float *returns, int R, float scale, float *dvalues, PpoLossStats *stats) {
    double loss = 0;
    for (int t = 0; t < R; t++) {
        double v = values_new[t], g = returns[t];
        double unclipped = (v - g) * (v - g);
        double d = v - g; // d/dv of 0.5 (v - g)^2
        double term = unclipped;
        if (config->value_clip > 0) {
            double lo = values_old[t] - config->value_clip, hi = values_old[t] + config->value_clip;
            double vc = v < lo ? lo : v > hi ? hi : v;
            double clipped = (vc - g) * (vc - g);
            if (clipped > unclipped) {
                term = clipped;
                d = (v < lo || v > hi) ? 0.0 : vc - g;
            }
        }
        loss += 0.5 * term;
        if (dvalues) dvalues[t] += (float)(d * scale);
    }
    if (stats) stats->value_loss += loss;
    return loss;
}

double ppo_kl_loss(const float *logp_new, const float *logp_ref, int R, float coef, float scale, float *dlogp) {
    double sum = 0;
    for (int t = 0; t < R; t++) {
        const double log_ratio = (double)logp_ref[t] - logp_new[t], ratio = exp(log_ratio);
        sum += ratio - log_ratio - 1.0;
        if (dlogp) dlogp[t] += (float)(scale * coef * (1.0 - ratio));
    }
    return sum;
}
