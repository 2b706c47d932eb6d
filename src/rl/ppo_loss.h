// The clipped PPO objectives for one response (spec §6.6, §8), with their gradients with
// respect to the new log-probs and values (fed to model_backward as dlogp / dvalue).
//
// Policy:  L = sum_t max(-A_t rho_t, -A_t clip(rho_t, 1-eps, 1+eps)) / N
//   rho per token (released code):           rho_t = exp(logp_new_t - logp_old_t)
//   rho per macro action (paper, --ratio macro): rho_t = exp(sum_{t' in tau(t)} (logp_new - logp_old))
// Value:   L = sum_t 0.5 max((V_t - G_t)^2, (clip(V_t, V_old_t - c, V_old_t + c) - G_t)^2) / N
// N is the number of response tokens in the optimizer step (scale = 1/N).
#pragma once

typedef enum { RATIO_PER_TOKEN, RATIO_MACRO_PRODUCT } RatioKind;

typedef struct {
    float clip_ratio;  // epsilon (released: 0.2): ratios below 1 - epsilon are clipped
    float clip_ratio_high; // ratios above 1 + this are clipped (DAPO's clip-higher; usually = clip_ratio)
    float value_clip;  // (released: 0.2); <= 0: no value clipping
    RatioKind ratio;
    float kl_loss_coef; // > 0: plus this times ppo_kl_loss per token (verl's use_kl_loss, TRL's GRPO beta)
} PpoLossConfig;

typedef struct {
    double policy_loss, value_loss; // sums over tokens (not yet divided)
    double clipped;                 // tokens whose ratio left [1-eps, 1+eps]
    double approx_kl;               // sum of 0.5 (logp_new - logp_old)^2 (k2 estimator)
    double ratio_sum;
    double tokens;
} PpoLossStats;

// Accumulates into dlogp[0..R) (may be NULL). Returns the summed loss (before scale).
double ppo_policy_loss(const PpoLossConfig *config, const float *logp_new, const float *logp_old,
                       const float *advantages, const int *segment_lengths, int segments, int R, float scale,
                       float *dlogp, PpoLossStats *stats);
// Accumulates into dvalues[0..R) (may be NULL). Returns the summed loss (before scale).
double ppo_value_loss(const PpoLossConfig *config, const float *values_new, const float *values_old,
                      const float *returns, int R, float scale, float *dvalues, PpoLossStats *stats);

// The KL to the reference as a loss term instead of (or besides) the reward penalty:
// sum_t k3_t with k3 = exp(ref - new) - (ref - new) - 1, Schulman's estimator (unbiased,
// never negative; verl's "low_var_kl", TRL GRPO's per-token KL). Accumulates
// scale * coef * d k3 / d logp_new = scale * coef * (1 - exp(ref - new)) into dlogp (may be
// NULL). Returns the summed k3 (before coef and scale).
double ppo_kl_loss(const float *logp_new, const float *logp_ref, int R, float coef, float scale, float *dlogp);

// "per-token" | "macro"; -1 otherwise.
int ratio_kind_from_name(const char *name, RatioKind *out);
