// Per-token estimators of the KL divergence from the reference to the policy, from one
// sampled token's log-ratio x = logp - logp_ref (Schulman, "Approximating KL Divergence",
// 2020). The reward's KL penalty (--kl-estimator; TRL PPO's kl_estimator, OpenRLHF's
// --kl_estimator) and the KL loss term (--kl-loss-type; verl's kl_loss_type) each take one:
//   k1   x                    unbiased, can be negative (the reward penalty's classic form)
//   k2   x^2 / 2              biased, low variance, never negative (verl's "mse")
//   k3   exp(-x) - 1 + x      unbiased, never negative, low variance (verl's "low_var_kl",
//                             TRL's GRPO KL term; written (r - 1) - log r with r = p_ref / p)
//   abs  |x|                  verl's "abs"
// Not clamped (OpenRLHF and verl's low_var_kl clamp at 10; TRL does not).
#pragma once

typedef enum { KL_K1, KL_K2, KL_K3, KL_ABS } KlEstimator;

// The estimate at x = logp - logp_ref, and its derivative d/dx (= d/d logp; abs: 0 at 0).
double kl_estimate(KlEstimator estimator, double x);
double kl_estimate_slope(KlEstimator estimator, double x);

// "k1" | "k2" | "k3" | "abs"; -1 otherwise.
int kl_estimator_from_name(const char *name, KlEstimator *out);
const char *kl_estimator_name(KlEstimator estimator);
