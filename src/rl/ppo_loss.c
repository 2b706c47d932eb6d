#include "rl/ppo_loss.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "core/check.h"

int ratio_kind_from_name(const char *name, RatioKind *out) {
    if (!strcmp(name, "per-token") || !strcmp(name, "per_token") || !strcmp(name, "token")) *out = RATIO_PER_TOKEN;
    else if (!strcmp(name, "macro") || !strcmp(name, "macro-product") || !strcmp(name, "macro_product"))
        *out = RATIO_MACRO_PRODUCT;
    else if (!strcmp(name, "sequence") || !strcmp(name, "gspo")) *out = RATIO_SEQUENCE_MEAN;
    else if (!strcmp(name, "sequence-token") || !strcmp(name, "sequence_token") || !strcmp(name, "gspo-token") ||
             !strcmp(name, "gspo_token"))
        *out = RATIO_SEQUENCE_TOKEN;
    else return -1;
    return 0;
}

int policy_loss_kind_from_name(const char *name, PolicyLossKind *out) {
    if (!strcmp(name, "ppo") || !strcmp(name, "clip") || !strcmp(name, "vanilla")) *out = POLICY_LOSS_PPO;
    else if (!strcmp(name, "cispo")) *out = POLICY_LOSS_CISPO;
    else if (!strcmp(name, "sapo")) *out = POLICY_LOSS_SAPO;
    else if (!strcmp(name, "vespo")) *out = POLICY_LOSS_VESPO;
    else if (!strcmp(name, "gmpo") || !strcmp(name, "geo_mean")) *out = POLICY_LOSS_GMPO;
    else if (!strcmp(name, "kl_cov") || !strcmp(name, "kl-cov")) *out = POLICY_LOSS_KL_COV;
    else if (!strcmp(name, "clip_cov") || !strcmp(name, "clip-cov")) *out = POLICY_LOSS_CLIP_COV;
    else if (!strcmp(name, "gpg")) *out = POLICY_LOSS_GPG;
    else return -1;
    return 0;
}

// One token's policy term. Returns its loss; *d_log_ratio is d loss / d log rho (to be
// spread over the log-probs the ratio is made of), *d_logp the part that reaches this
// token's log-prob directly (CISPO's). *clipped: the token counts as clipped.
typedef struct {
    double d_log_ratio, d_logp;
    int clipped;
} PolicyTermGradient;

// The ratio clipped to [1 - eps_low, 1 + eps_high].
static double clip_ratio(double ratio, double eps_low, double eps_high) {
    return ratio < 1 - eps_low ? 1 - eps_low : ratio > 1 + eps_high ? 1 + eps_high : ratio;
}

// PPO: the ratio clipped to [1 - eps_low, 1 + eps_high], the pessimistic of the two terms.
// ratio_cap > 0: the unclipped term's ratio is min(ratio, ratio_cap) (TRL's delta).
static double clipped_term(double advantage, double log_ratio, double eps_low, double eps_high, double ratio_cap,
                           PolicyTermGradient *g) {
    double ratio = exp(log_ratio);
    double clipped_ratio = clip_ratio(ratio, eps_low, eps_high);
    const bool capped = ratio_cap > 0 && ratio > ratio_cap;
    double unclipped_loss = -advantage * (capped ? ratio_cap : ratio), clipped_loss = -advantage * clipped_ratio;
    g->clipped = ratio < 1 - eps_low || ratio > 1 + eps_high;
    g->d_logp = 0;
    if (unclipped_loss >= clipped_loss) {
        g->d_log_ratio = capped ? 0 : -advantage * ratio; // the cap is constant
        return unclipped_loss;
    }
    // The clipped branch is active only outside the clip range, where it is constant.
    g->d_log_ratio = 0;
    return clipped_loss;
}

// CISPO: -sg(min(rho, w_max)) A logp_new. The weight is a constant to the gradient, which
// goes to logp_new alone, whatever the ratio's kind.
static double cispo_term(double advantage, double log_ratio, double logp_new, double max_weight, PolicyTermGradient *g) {
    double ratio = exp(log_ratio);
    double weight = ratio > max_weight ? max_weight : ratio;
    g->clipped = ratio > max_weight;
    g->d_log_ratio = 0;
    g->d_logp = -weight * advantage;
    return -weight * advantage * logp_new;
}

// SAPO: -(4 / tau) sigmoid(tau (rho - 1)) A; d/d log rho = -4 sigmoid (1 - sigmoid) rho A.
static double sapo_term(double advantage, double log_ratio, double tau_pos, double tau_neg, double eps_low,
                        double eps_high, PolicyTermGradient *g) {
    double ratio = exp(log_ratio), tau = advantage > 0 ? tau_pos : tau_neg;
    double gate = 1.0 / (1.0 + exp(-tau * (ratio - 1.0)));
    g->clipped = ratio < 1 - eps_low || ratio > 1 + eps_high; // reported only: nothing is clipped
    g->d_log_ratio = -4.0 * gate * (1.0 - gate) * ratio * advantage;
    g->d_logp = 0;
    return -4.0 / tau * gate * advantage;
}

// KL-Cov's policy term: the plain importance-weighted -A rho, no clipping (its penalty is added
// on the selected tokens apart: ppo_kl_cov_term).
static double unclipped_term(double advantage, double log_ratio, PolicyTermGradient *g) {
    const double ratio = exp(log_ratio);
    g->clipped = 0;
    g->d_logp = 0;
    g->d_log_ratio = -advantage * ratio;
    return -advantage * ratio;
}

// GPG: -A logp_new; its gradient -A goes to the token's log-prob alone.
static double policy_gradient_term(double advantage, double logp_new, PolicyTermGradient *g) {
    g->clipped = 0;
    g->d_log_ratio = 0;
    g->d_logp = -advantage;
    return -advantage * logp_new;
}

static double policy_term(const PpoLossConfig *config, double advantage, double log_ratio, double logp_new,
                          PolicyTermGradient *g) {
    switch (config->policy_loss) {
    case POLICY_LOSS_KL_COV: return unclipped_term(advantage, log_ratio, g);
    case POLICY_LOSS_GPG: return policy_gradient_term(advantage, logp_new, g);
    case POLICY_LOSS_CISPO: return cispo_term(advantage, log_ratio, logp_new, config->cispo_max_weight, g);
    case POLICY_LOSS_SAPO:
        return sapo_term(advantage, log_ratio, config->sapo_temperature_pos, config->sapo_temperature_neg,
                         config->clip_ratio, config->clip_ratio_high, g);
    case POLICY_LOSS_CLIP_COV: // its left-out tokens come with a zero advantage (actor_micro_step)
    case POLICY_LOSS_PPO:
    default: return clipped_term(advantage, log_ratio, config->clip_ratio, config->clip_ratio_high, config->ratio_cap, g);
    }
}

double ppo_vespo_loss(const PpoLossConfig *config, const float *logp_new, const float *logp_old,
                      const float *advantages, double sampling_log_weight, int R, float scale, float *dlogp,
                      PpoLossStats *stats) {
    double log_w = 0;
    for (int t = 0; t < R; t++) {
        double token_log_ratio = (double)logp_new[t] - logp_old[t];
        log_w += token_log_ratio < -20 ? -20 : token_log_ratio > 20 ? 20 : token_log_ratio;
    }
    log_w += sampling_log_weight; // log(pi/pi_old) + log(pi_old/pi_sampler), as TRL sums them
    const double lowest = log(1e-8);
    log_w = log_w < lowest ? lowest : log_w > 20 ? 20 : log_w;
    const double w = exp(log_w);
    double loss = 0;
    for (int t = 0; t < R; t++) {
        bool positive = advantages[t] >= 0;
        double k = positive ? config->vespo_k_pos : config->vespo_k_neg;
        double lambda = positive ? config->vespo_lambda_pos : config->vespo_lambda_neg;
        if (lambda < 1e-4) lambda = 1e-4;
        double phi = exp(lambda + k * log_w - lambda * w);
        if (!isfinite(phi)) phi = 0; // TRL's nan_to_num(nan=0, posinf=0, neginf=0)
        loss += -phi * advantages[t] * logp_new[t];
        if (dlogp) dlogp[t] += (float)(-phi * advantages[t] * scale);
        if (stats) {
            double token_log_ratio = (double)logp_new[t] - logp_old[t];
            stats->approx_kl += 0.5 * token_log_ratio * token_log_ratio;
            stats->ratio_sum += w;
            stats->tokens += 1;
        }
    }
    if (stats) stats->policy_loss += loss;
    return loss;
}

double ppo_gmpo_loss(const PpoLossConfig *config, const float *logp_new, const float *logp_old,
                     const float *advantages, const unsigned char *kept, int R, float scale, float *dlogp,
                     PpoLossStats *stats) {
    if (R == 0) return 0;
    double advantage = 0;
    for (int t = 0; t < R; t++) advantage += advantages[t];
    advantage /= R;
    const double low = -config->clip_ratio, high = config->clip_ratio_high;
    double mean_log_ratio = 0;
    int kept_count = 0;
    for (int t = 0; t < R; t++) {
        if (kept && !kept[t]) continue;
        const double log_ratio = (double)logp_new[t] - logp_old[t];
        const double clamped = log_ratio < low ? low : log_ratio > high ? high : log_ratio;
        mean_log_ratio += advantage > 0 ? fmin(log_ratio, clamped) : fmax(log_ratio, clamped);
        kept_count++;
    }
    const int denominator = kept_count > 0 ? kept_count : 1; // TRL's clamp(min=1)
    mean_log_ratio /= denominator;
    const double coefficient = exp(mean_log_ratio);
    const double loss = -advantage * coefficient * R;
    // R L's slope in a kept token's log-prob is R (-A coefficient / kept tokens): with every
    // token kept, -A coefficient (times 1.0, which keeps the bits).
    const double spread = kept ? (double)R / denominator : 1.0;
    for (int t = 0; t < R; t++) {
        const double log_ratio = (double)logp_new[t] - logp_old[t];
        // Clipped (no gradient): above high with A > 0, below low with A <= 0.
        const bool clipped = advantage > 0 ? log_ratio > high : log_ratio < low;
        if (dlogp && !clipped && (!kept || kept[t])) dlogp[t] += (float)(-advantage * coefficient * scale * spread);
        if (stats) {
            stats->clipped += clipped;
            stats->approx_kl += 0.5 * log_ratio * log_ratio;
            stats->ratio_sum += coefficient;
            stats->tokens += 1;
        }
    }
    if (stats) stats->policy_loss += loss;
    return loss;
}

// The tokens that share one ratio's value, group s of a response of R tokens: each token alone
// (per-token), each macro action (macro: the sum of its log-ratios), or the whole response
// (sequence and sequence-token: their mean). Its length; *factor = d log rho / d logp of each of
// its tokens (1 for a sum, 1/R for the mean), by which the group's log-ratio sum is scaled.
static int ratio_group(const PpoLossConfig *config, const int *segment_lengths, int s, int R, double *factor) {
    switch (config->ratio) {
    case RATIO_MACRO_PRODUCT: *factor = 1.0; return segment_lengths[s];
    case RATIO_SEQUENCE_MEAN:
    case RATIO_SEQUENCE_TOKEN: *factor = 1.0 / R; return R;
    case RATIO_PER_TOKEN:
    default: *factor = 1.0; return 1;
    }
}

// A group's d loss / d log rho, summed over its tokens, flows back to every token of the group
// times d log rho / d logp (ratio_group's factor). GSPO-token's ratio has the group's value but
// each token's own gradient: a token's d loss / d log rho reaches its own log-prob alone.
double ppo_policy_loss(const PpoLossConfig *config, const float *logp_new, const float *logp_old,
                       const float *advantages, const int *segment_lengths, int segments, int R, float scale,
                       float *dlogp, PpoLossStats *stats) {
    if (config->policy_loss == POLICY_LOSS_VESPO)
        return ppo_vespo_loss(config, logp_new, logp_old, advantages, 0.0, R, scale, dlogp, stats);
    if (config->policy_loss == POLICY_LOSS_GMPO)
        return ppo_gmpo_loss(config, logp_new, logp_old, advantages, NULL, R, scale, dlogp, stats);
    double loss = 0;
    int first = 0;
    const bool own_token_gradient = config->ratio == RATIO_SEQUENCE_TOKEN;
    for (int s = 0; config->ratio == RATIO_MACRO_PRODUCT ? s < segments : first < R; s++) {
        double factor;
        const int m = ratio_group(config, segment_lengths, s, R, &factor);
        double group_log_ratio = 0;
        for (int i = 0; i < m; i++) group_log_ratio += (double)logp_new[first + i] - logp_old[first + i];
        group_log_ratio *= factor;
        double group_gradient = 0; // d loss / d group log-ratio, summed over the group's tokens
        for (int i = 0; i < m; i++) {
            int t = first + i;
            double token_log_ratio = (double)logp_new[t] - logp_old[t];
            PolicyTermGradient g;
            loss += policy_term(config, advantages[t], group_log_ratio, logp_new[t], &g);
            if (own_token_gradient) {
                if (dlogp && g.d_log_ratio != 0) dlogp[t] += (float)(g.d_log_ratio * scale);
            } else group_gradient += g.d_log_ratio;
            if (dlogp && g.d_logp != 0) dlogp[t] += (float)(g.d_logp * scale);
            if (stats) {
                stats->clipped += g.clipped;
                stats->approx_kl += 0.5 * token_log_ratio * token_log_ratio;
                stats->ratio_sum += exp(group_log_ratio);
                stats->tokens += 1;
            }
        }
        if (dlogp && group_gradient != 0)
            for (int i = 0; i < m; i++) dlogp[first + i] += (float)(group_gradient * factor * scale);
        first += m;
    }
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

double ppo_kl_loss_ratio_weighted(const PpoLossConfig *config, const float *logp_new, const float *logp_old,
                                  const float *logp_ref, const int *segment_lengths, int segments, int R, float scale,
                                  float *dlogp) {
    double sum = 0;
    int first = 0;
    const bool own_token_gradient = config->ratio == RATIO_SEQUENCE_TOKEN;
    // The groups that share a ratio, as ppo_policy_loss takes them.
    for (int s = 0; config->ratio == RATIO_MACRO_PRODUCT ? s < segments : first < R; s++) {
        double factor;
        const int m = ratio_group(config, segment_lengths, s, R, &factor);
        double log_ratio = 0, group_kl = 0;
        for (int i = 0; i < m; i++) {
            log_ratio += (double)logp_new[first + i] - logp_old[first + i];
            group_kl += kl_estimate(config->kl_loss_estimator, (double)logp_new[first + i] - logp_ref[first + i]);
        }
        const double ratio = exp(log_ratio * factor);
        sum += ratio * group_kl;
        // d (rho sum_i kl_i) / d logp_t = rho kl'_t + (sum_i kl_i) rho factor; GSPO-token's
        // rho_t = sg(rho) pi_t / sg(pi_t): d (rho_t kl_t) / d logp_t = rho (kl'_t + kl_t).
        for (int i = 0; dlogp && i < m; i++) {
            const int t = first + i;
            const double new_minus_ref = (double)logp_new[t] - logp_ref[t];
            const double slope = kl_estimate_slope(config->kl_loss_estimator, new_minus_ref);
            const double through_ratio =
                own_token_gradient ? kl_estimate(config->kl_loss_estimator, new_minus_ref) : group_kl * factor;
            dlogp[t] += (float)(scale * config->kl_loss_coef * ratio * (slope + through_ratio));
        }
        first += m;
    }
    return sum;
}

// Each of n tokens' (A - mean A)(logp - mean logp), the means over all n (KL-Cov's and
// Clip-Cov's covariance), into covariance[0..n) (xmalloc'd).
static double *token_covariances(const float *advantages, const float *logp, long n) {
    double mean_advantage = 0, mean_logp = 0;
    for (long i = 0; i < n; i++) mean_advantage += advantages[i], mean_logp += logp[i];
    mean_advantage /= n, mean_logp /= n;
    double *covariance = xmalloc((size_t)n * sizeof(double));
    for (long i = 0; i < n; i++) covariance[i] = ((double)advantages[i] - mean_advantage) * ((double)logp[i] - mean_logp);
    return covariance;
}

typedef struct {
    double key;
    long index;
} RankedToken;

// Smallest key first, ties to the earlier token.
static int compare_ranked(const void *a, const void *b) {
    const RankedToken *x = a, *y = b;
    if (x->key != y->key) return x->key < y->key ? -1 : 1;
    return (x->index > y->index) - (x->index < y->index);
}

// Marks the first max(1, floor(n ratio)) of the `count` ranked tokens (all of them when there
// are fewer) in selected[0..n) after sorting them; returns how many.
static long select_first_ranked(RankedToken *ranked, long count, long n, double ratio, unsigned char *selected) {
    qsort(ranked, (size_t)count, sizeof(RankedToken), compare_ranked);
    long k = (long)(n * ratio);
    if (k < 1) k = 1;
    if (k > count) k = count;
    memset(selected, 0, (size_t)n);
    for (long i = 0; i < k; i++) selected[ranked[i].index] = 1;
    return k;
}

void kl_cov_tokens(const float *advantages, const float *logp, long n, double ratio, unsigned char *selected) {
    CHECK(n > 0, "KL-Cov over no tokens");
    double *covariance = token_covariances(advantages, logp, n);
    RankedToken *all = xmalloc((size_t)n * sizeof(RankedToken));
    for (long i = 0; i < n; i++) all[i] = (RankedToken){-covariance[i], i}; // the largest covariance first
    select_first_ranked(all, n, n, ratio, selected);
    free(all), free(covariance);
}

bool ppo_clip_binds(double advantage, double log_ratio, double eps_low, double eps_high) {
    const double ratio = exp(log_ratio);
    return -advantage * clip_ratio(ratio, eps_low, eps_high) > -advantage * ratio;
}

long clip_cov_tokens(const float *advantages, const float *logp, const unsigned char *unclipped, const double *keys,
                     long n, double ratio, double lower, double upper, unsigned char *selected) {
    CHECK(n > 0, "Clip-Cov over no tokens");
    double *covariance = token_covariances(advantages, logp, n);
    RankedToken *candidates = xmalloc((size_t)n * sizeof(RankedToken));
    long count = 0;
    for (long i = 0; i < n; i++)
        if (unclipped[i] && covariance[i] > lower && covariance[i] < upper) candidates[count++] = (RankedToken){keys[i], i};
    const long k = select_first_ranked(candidates, count, n, ratio, selected);
    free(candidates), free(covariance);
    return k;
}

double ppo_kl_cov_term(const float *logp_new, const float *logp_old, const unsigned char *selected, int R, float coef,
                       float scale, float *dlogp) {
    double sum = 0;
    for (int t = 0; t < R; t++) {
        if (!selected[t]) continue;
        const double log_ratio = (double)logp_new[t] - logp_old[t];
        sum += fabs(log_ratio);
        if (dlogp) dlogp[t] += (float)(scale * coef * (log_ratio > 0 ? 1.0 : log_ratio < 0 ? -1.0 : 0.0));
    }
    return sum;
}

static int compare_floats(const void *a, const void *b) {
    const float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

double ppo_quantile(const float *values, long n, double q) {
    CHECK(n > 0, "a quantile of no values");
    float *sorted = xmalloc((size_t)n * sizeof(float));
    memcpy(sorted, values, (size_t)n * sizeof(float));
    qsort(sorted, (size_t)n, sizeof(float), compare_floats);
    const double position = q * (double)(n - 1);
    long below = (long)floor(position);
    if (below >= n - 1) below = n - 1;
    const double fraction = position - (double)below;
    const double value = below + 1 < n ? sorted[below] + fraction * ((double)sorted[below + 1] - sorted[below])
                                       : sorted[below];
    free(sorted);
    return value;
}

double ppo_kl_loss(KlEstimator estimator, const float *logp_new, const float *logp_ref, int R, float coef, float scale,
                   float *dlogp) {
    double sum = 0;
    for (int t = 0; t < R; t++) {
        const double log_ratio = (double)logp_new[t] - logp_ref[t];
        sum += kl_estimate(estimator, log_ratio);
        if (dlogp) dlogp[t] += (float)(scale * coef * kl_estimate_slope(estimator, log_ratio));
    }
    return sum;
}

void rollout_correction_weights(RolloutCorrection mode, float min, float max, const float *logp_old,
                                const float *logp_rollout, int R, float *weights) {
    if (mode == ROLLOUT_CORRECTION_NONE) {
        for (int t = 0; t < R; t++) weights[t] = 1.0f;
        return;
    }
    const bool sequence = mode == ROLLOUT_CORRECTION_SEQUENCE_TRUNCATE || mode == ROLLOUT_CORRECTION_SEQUENCE_MASK;
    const bool truncate = mode == ROLLOUT_CORRECTION_TOKEN_TRUNCATE || mode == ROLLOUT_CORRECTION_SEQUENCE_TRUNCATE;
    double sequence_log_ratio = 0;
    for (int t = 0; t < R && sequence; t++) sequence_log_ratio += (double)logp_old[t] - logp_rollout[t];
    for (int t = 0; t < R; t++) {
        const double ratio = exp(sequence ? sequence_log_ratio : (double)logp_old[t] - logp_rollout[t]);
        if (truncate) weights[t] = (float)(ratio < min ? min : ratio > max ? max : ratio);
        else weights[t] = ratio < min || ratio > max ? 0.0f : (float)ratio;
    }
}

double rollout_correction_log_weight(RolloutCorrection mode, const float *weights, int R) {
    const double lowest = log(1e-8);
    const bool sequence = mode == ROLLOUT_CORRECTION_SEQUENCE_TRUNCATE || mode == ROLLOUT_CORRECTION_SEQUENCE_MASK;
    double sum = 0;
    for (int t = 0; t < (sequence ? (R > 0) : R); t++) { // a sequence mode's weight is on every token: once
        const double log_weight = log((double)weights[t]); // a masked token's 0: -inf, clamped
        sum += log_weight < lowest ? lowest : log_weight > 20 ? 20 : log_weight;
    }
    return sum;
}

bool off_policy_masked(const float *logp_sampling, const float *logp_new, int R, float threshold) {
    double sum = 0;
    for (int t = 0; t < R; t++) sum += (double)logp_sampling[t] - logp_new[t];
    return sum / (R > 0 ? R : 1) > threshold;
}

int rollout_correction_from_name(const char *name, RolloutCorrection *out) {
    static const struct {
        const char *name, *trl_name;
        RolloutCorrection mode;
    } names[] = {
        {"none", "none", ROLLOUT_CORRECTION_NONE},
        {"token-truncate", "token_truncate", ROLLOUT_CORRECTION_TOKEN_TRUNCATE},
        {"token-mask", "token_mask", ROLLOUT_CORRECTION_TOKEN_MASK},
        {"sequence-truncate", "sequence_truncate", ROLLOUT_CORRECTION_SEQUENCE_TRUNCATE},
        {"sequence-mask", "sequence_mask", ROLLOUT_CORRECTION_SEQUENCE_MASK},
    };
    for (size_t k = 0; k < sizeof names / sizeof names[0]; k++)
        if (!strcmp(name, names[k].name) || !strcmp(name, names[k].trl_name)) {
            *out = names[k].mode;
            return 0;
        }
    return -1;
}
