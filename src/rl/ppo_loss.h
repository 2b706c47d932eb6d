// The clipped PPO objectives for one response (spec §6.6, §8), with their gradients with
// respect to the new log-probs and values (fed to model_backward as dlogp / dvalue).
//
// Policy:  L = sum_t max(-A_t rho_t, -A_t clip(rho_t, 1-eps, 1+eps)) / N
//   rho per token (released code):           rho_t = exp(logp_new_t - logp_old_t)
//   rho per macro action (paper, --ratio macro): rho_t = exp(sum_{t' in tau(t)} (logp_new - logp_old))
//   rho per response (GSPO, --ratio sequence):   rho_t = exp(mean_{t'} (logp_new - logp_old)),
//       the geometric mean of the token ratios (Zheng et al. 2025; TRL's
//       importance_sampling_level="sequence", OpenRLHF's policy_loss_type gspo)
//   GSPO-token (--ratio sequence-token):      rho_t = exp(mean_{t'} (logp_new - logp_old)) in value,
//       its gradient the token's own: sg(s) pi_t / sg(pi_t) (GSPO's token-level form; TRL's
//       importance_sampling_level="sequence_token" before 1.12, verl's gspo loss). With one
//       advantage per response it trains as GSPO; with per-token advantages (GAE) each token
//       keeps its own.
// Two other policy terms replace the clipped one (TRL GRPOTrainer's loss_type):
//   CISPO (MiniMax-M1): -sg(min(rho_t, w_max)) A_t logp_new_t — the weight is clipped and
//       carries no gradient, so no token ever loses its gradient (only its weight is capped)
//   SAPO (Soft Adaptive Policy Optimization): -(4 / tau) sigmoid(tau (rho_t - 1)) A_t, a
//       smooth gate in place of the hard clip; tau = tau_pos when A_t > 0, tau_neg otherwise.
//       At rho = 1 its gradient is PPO's.
//   VESPO: -sg(phi(w)) A_t logp_new_t with w the whole response's ratio (the product of its
//       token ratios, log clamped to [log 1e-8, 20], each token's log-ratio to [-20, 20]) and
//       phi(w) = exp(lambda + k log w - lambda w), a gamma-shaped weight with phi(1) = 1 that
//       fades as w leaves 1; (k, lambda) = (k_pos, lambda_pos) when A_t >= 0, else the _neg
//       pair (TRL's loss_type "vespo", get_gamma_weights). It makes its own ratio: --ratio
//       does not apply.
//   GMPO (Geometric-Mean Policy Optimization; TRL's experimental GMPOTrainer, verl's
//       "geo_mean"): one term for the whole response, -A exp(mean_t l_t), with A the mean of
//       its tokens' advantages and l_t the token's log-ratio clipped in log space, one-sided
//       by the sign of A: min(l, clamp(l, -eps_low, eps_high)) when A > 0, max(...) otherwise
//       (clip_ratio and clip_ratio_high are log-space bounds here; GMPO recommends 0.4). Each
//       token carries the response's term (so a sequence mean of token means averages them
//       over responses, as GMPO does). Its own ratio too: --ratio does not apply.
//   KL-Cov (Cui et al. 2025, "The Entropy Mechanism of RL for Reasoning LMs"; verl's
//       "kl_cov"): the unclipped -A_t rho_t, plus kl_cov_coef |logp_new_t - logp_old_t| on the
//       kl_cov_ratio fraction of a micro-batch's tokens (at least one) whose covariance
//       (A_t - mean A)(logp_t - mean logp) over the micro-batch is largest (kl_cov_tokens picks
//       them; ppo_kl_cov_term adds the penalty).
//   GPG (Chu et al. 2025; verl's "gpg"): -A_t logp_new_t, the plain policy gradient: no ratio,
//       so no clipping (its gradient is PPO's at ratio 1, and stays -A off-policy).
//   Clip-Cov (the same paper as KL-Cov; verl's "clip_cov"): PPO's clipped term, with the policy term
//       (loss and gradient) of a few tokens left out: clip_cov_ratio of a micro-batch's tokens
//       (at least one), drawn at random among those PPO's clip leaves alone whose covariance
//       lies strictly between clip_cov_lower and clip_cov_upper (clip_cov_tokens picks them).
// Value:   L = sum_t 0.5 max((V_t - G_t)^2, (clip(V_t, V_old_t - c, V_old_t + c) - G_t)^2) / N
// N is the number of response tokens in the optimizer step (scale = 1/N).
#pragma once

#include <stdbool.h>

#include "rl/kl_estimator.h"

typedef enum { RATIO_PER_TOKEN, RATIO_MACRO_PRODUCT, RATIO_SEQUENCE_MEAN, RATIO_SEQUENCE_TOKEN } RatioKind;
typedef enum {
    POLICY_LOSS_PPO,
    POLICY_LOSS_CISPO,
    POLICY_LOSS_SAPO,
    POLICY_LOSS_VESPO,
    POLICY_LOSS_GMPO,
    POLICY_LOSS_KL_COV,
    POLICY_LOSS_CLIP_COV,
    POLICY_LOSS_GPG
} PolicyLossKind;
// How the policy term is corrected for generation's log-probs differing from the training
// forward's (rollout_correction_weights; TRL's vllm_importance_sampling_mode).
typedef enum {
    ROLLOUT_CORRECTION_NONE,
    ROLLOUT_CORRECTION_TOKEN_TRUNCATE,
    ROLLOUT_CORRECTION_TOKEN_MASK,
    ROLLOUT_CORRECTION_SEQUENCE_TRUNCATE,
    ROLLOUT_CORRECTION_SEQUENCE_MASK,
} RolloutCorrection;

typedef struct {
    float clip_ratio;  // epsilon (released: 0.2): ratios below 1 - epsilon are clipped
    float clip_ratio_high; // ratios above 1 + this are clipped (DAPO's clip-higher; usually = clip_ratio)
    float value_clip;  // (released: 0.2); <= 0: no value clipping
    RatioKind ratio;
    PolicyLossKind policy_loss;
    float cispo_max_weight;  // CISPO's w_max (TRL's epsilon_high with loss_type "cispo"; ScaleRL: 5)
    float sapo_temperature_pos, sapo_temperature_neg; // SAPO's tau (TRL: 1.0 and 1.05)
    float vespo_k_pos, vespo_lambda_pos, vespo_k_neg, vespo_lambda_neg; // VESPO's phi (TRL: 2, 3, 3, 2)
    float kl_loss_coef; // > 0: plus this times ppo_kl_loss per token (verl's use_kl_loss, TRL's GRPO beta)
    KlEstimator kl_loss_estimator; // its per-token KL (verl's kl_loss_type; default k3)
    // Each token's KL term times its policy ratio, the ratio's gradient included (TRL's
    // use_bias_correction_kl, DeepSeek-V3.2's unbiased KL: ppo_kl_loss_ratio_weighted).
    bool kl_loss_bias_correction;
    // The clipped loss's two-sided clipping (TRL's delta, INTELLECT-2; verl's dual clip,
    // clip_ratio_c): its unclipped term takes min(ratio, ratio_cap), so a negative advantage's
    // loss stops growing with the ratio. 0: none.
    float ratio_cap;
    // The 80/20 rule (Wang et al. 2025, "Beyond the 80/20 Rule"; TRL's top_entropy_quantile
    // rho = 1 - this): the policy term of the tokens whose entropy is below this quantile of
    // the micro-batch's trained tokens' entropies is left out (actor_micro_step). 0: none.
    float low_entropy_fraction;
    // Generation samples with its own kernels (a KV cache, another precision or quantization),
    // so its log-probs of the sampled tokens are not quite the training forward's old ones: each
    // token's policy term is weighted by rollout_correction_weights (TRL's vLLM importance
    // sampling correction). NONE: off.
    RolloutCorrection rollout_correction;
    float rollout_correction_min, rollout_correction_max; // [C_min, C_max] (C_min 0: none)
    // Off-policy sequence masking (DeepSeek-V3.2; TRL's off_policy_mask_threshold): a response
    // whose mean log-ratio of sampling to current policy is above this leaves the policy term on
    // its negative-advantage tokens (off_policy_masked), when off_policy_mask.
    bool off_policy_mask;
    float off_policy_mask_threshold;
    // KL-Cov (POLICY_LOSS_KL_COV): the fraction of tokens penalised, and the penalty's weight
    // (verl's kl_cov_ratio 0.0002 and ppo_kl_coef 1).
    float kl_cov_ratio, kl_cov_coef;
    // Clip-Cov (POLICY_LOSS_CLIP_COV): the fraction of tokens left out and the covariance's
    // bounds (verl's clip_cov_ratio 0.0002, clip_cov_lb 1, clip_cov_ub 5).
    float clip_cov_ratio, clip_cov_lower, clip_cov_upper;
} PpoLossConfig;

typedef struct {
    double policy_loss, value_loss; // sums over tokens (not yet divided)
    double clipped;                 // tokens whose ratio left [1-eps, 1+eps] (CISPO: above w_max)
    double approx_kl;               // sum of 0.5 (logp_new - logp_old)^2 (k2 estimator)
    double ratio_sum;
    double tokens;
    // The entropy over the tokens the policy term trains (loss weight above 0, not left out by
    // the 80/20 rule): its sum and count (actor_micro_step; adaptive entropy control reads them)
    double trained_entropy, trained_tokens;
    // Over the response tokens (actor_micro_step, as `tokens`): the sum of their rollout-correction
    // weights, how many the off-policy mask left out of the policy term, and how many Clip-Cov did.
    double rollout_weight_sum, off_policy_masked, clip_cov_left_out;
} PpoLossStats;

// Accumulates into dlogp[0..R) (may be NULL). Returns the summed loss (before scale).
double ppo_policy_loss(const PpoLossConfig *config, const float *logp_new, const float *logp_old,
                       const float *advantages, const int *segment_lengths, int segments, int R, float scale,
                       float *dlogp, PpoLossStats *stats);
// Accumulates into dvalues[0..R) (may be NULL). Returns the summed loss (before scale).
double ppo_value_loss(const PpoLossConfig *config, const float *values_new, const float *values_old,
                      const float *returns, int R, float scale, float *dvalues, PpoLossStats *stats);

// The KL to the reference as a loss term instead of (or besides) the reward penalty:
// sum_t kl(new - ref) by the estimator (rl/kl_estimator.h; verl's default and TRL GRPO's per-token
// KL is k3 = exp(ref - new) - (ref - new) - 1, unbiased and never negative). Accumulates
// scale * coef * d kl / d logp_new (k3: 1 - exp(ref - new)) into dlogp (may be NULL). Returns
// the summed kl (before coef and scale).
double ppo_kl_loss(KlEstimator estimator, const float *logp_new, const float *logp_ref, int R, float coef, float scale,
                   float *dlogp);
// The same term with each token's kl times its policy ratio rho (config->ratio's: the token's
// own, its macro action's or the response's, GSPO-token's with the token's own gradient;
// DeepSeek-V3.2's bias-corrected KL, TRL's
// use_bias_correction_kl): sum_t rho_t kl_t by config->kl_loss_estimator. Accumulates
// scale * config->kl_loss_coef * its gradient, d rho / d logp_new included, into dlogp (may be
// NULL). Returns the sum (before coef and scale).
double ppo_kl_loss_ratio_weighted(const PpoLossConfig *config, const float *logp_new, const float *logp_old,
                                  const float *logp_ref, const int *segment_lengths, int segments, int R, float scale,
                                  float *dlogp);

// The importance weights of one response's R tokens for generation's log-probs: ratio
// exp(logp_old - logp_rollout) per token (token modes) or exp(sum over the response) on every
// token (sequence modes), then clamped to [min, max] (truncate modes) or 0 outside it (mask
// modes); 1 everywhere for NONE. As TRL computes vllm_importance_sampling_ratio.
void rollout_correction_weights(RolloutCorrection mode, float min, float max, const float *logp_old,
                                const float *logp_rollout, int R, float *weights);
// VESPO's share of a response's rollout-correction weights (TRL's get_gamma_weights with an
// importance_sampling_ratio): the sum over its tokens of log(weight) clamped to [log 1e-8, 20]
// (token modes), or that of the one weight (sequence modes, which put it on every token).
double rollout_correction_log_weight(RolloutCorrection mode, const float *weights, int R);
// VESPO over one response: one weight phi(w) per advantage sign from the response's ratio w
// (the product of its token ratios times exp(sampling_log_weight), the rollout correction's
// share: 0 without one), then CISPO-like terms -phi A logp whose weight carries no gradient.
double ppo_vespo_loss(const PpoLossConfig *config, const float *logp_new, const float *logp_old,
                      const float *advantages, double sampling_log_weight, int R, float scale, float *dlogp,
                      PpoLossStats *stats);
// DeepSeek-V3.2's off-policy sequence mask (TRL's get_off_policy_mask): true when the mean over
// the response of logp_sampling - logp_new is above `threshold` (its negative-advantage tokens
// then leave the policy term).
bool off_policy_masked(const float *logp_sampling, const float *logp_new, int R, float threshold);
// "none" | "token-truncate" | "token-mask" | "sequence-truncate" | "sequence-mask" (TRL's names
// with underscores too); -1 otherwise.
int rollout_correction_from_name(const char *name, RolloutCorrection *out);

// The q-quantile of values[0, n) (n > 0) as torch.quantile's default computes it: sorted, at
// position q (n - 1), interpolated linearly between its two neighbours.
double ppo_quantile(const float *values, long n, double q);

// "per-token" | "macro" | "sequence" | "sequence-token" (and TRL's spellings); -1 otherwise.
int ratio_kind_from_name(const char *name, RatioKind *out);
// GMPO over one response: L = -A exp(mean_t l_t), A the tokens' mean advantage, l_t the
// token's log-ratio clipped one-sidedly in log space by A's sign, the mean over the tokens with
// kept[t] (all when kept is NULL; TRL's entropy mask leaves the low-entropy ones out; none kept:
// a mean of 0). Returns R L (each token carries L) and accumulates its gradient into dlogp
// (may be NULL): R dL / d logp_t = -A exp(mean l) R / (kept tokens) where t is kept and its
// log-ratio not clipped, else 0.
double ppo_gmpo_loss(const PpoLossConfig *config, const float *logp_new, const float *logp_old,
                     const float *advantages, const unsigned char *kept, int R, float scale, float *dlogp,
                     PpoLossStats *stats);
// KL-Cov's penalised tokens among n (n > 0) with advantages[] and new log-probs logp[]: the
// max(1, floor(n ratio)) largest (A - mean A)(logp - mean logp), ties to the earlier token;
// selected[i] = 1 for them, else 0.
void kl_cov_tokens(const float *advantages, const float *logp, long n, double ratio, unsigned char *selected);
// Clip-Cov's left-out tokens among n (n > 0) with advantages[], new log-probs logp[] and
// unclipped[i] = 1 where PPO's clip leaves token i's term alone: of those whose
// (A - mean A)(logp - mean logp) (means over all n) lies strictly between lower and upper, the
// max(1, floor(n ratio)) with the smallest keys[i] (uniform draws: a random subset; all of them
// when there are fewer), ties to the earlier token; selected[i] = 1 for them, else 0. Returns
// how many were selected.
long clip_cov_tokens(const float *advantages, const float *logp, const unsigned char *unclipped, const double *keys,
                     long n, double ratio, double lower, double upper, unsigned char *selected);
// Whether PPO's clip replaces a token's term (verl's clip_by_origin: -A clip(rho) > -A rho).
bool ppo_clip_binds(double advantage, double log_ratio, double eps_low, double eps_high);
// KL-Cov's penalty on one response's selected tokens: sum of |logp_new - logp_old| over them
// (before coef and scale); accumulates scale * coef * its sign into dlogp (may be NULL).
double ppo_kl_cov_term(const float *logp_new, const float *logp_old, const unsigned char *selected, int R, float coef,
                       float scale, float *dlogp);

// "ppo" | "cispo" | "sapo" | "vespo" | "gmpo" | "kl_cov" | "clip_cov" | "gpg"; -1 otherwise.
int policy_loss_kind_from_name(const char *name, PolicyLossKind *out);
