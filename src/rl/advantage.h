// Rewards, macro-action aggregation and GAE for one response (MA-PPO, spec §6.4–§6.5).
//
// Index j = 0..R-1 runs over the response's tokens (the EOS token included when generated).
// values[j] is the critic's value of the state before token j; logp/logp_ref are the
// actor's and the reference's log-probs of token j. The segmentation (rl/macro.h) gives
// macro-action lengths summing to R (zero-length segments allowed: the released code's
// duplicate boundary).
#pragma once
#include <stdbool.h>

#include "rl/kl_estimator.h"

typedef enum { VALUE_EQUAL, VALUE_POSITION, VALUE_UNIT } ValueFunction;
typedef enum { MACRO_REWARD_MEAN, MACRO_REWARD_SUM } MacroReward;

typedef struct {
    float kl_coef;        // beta
    KlEstimator kl_estimator; // the penalty's per-token KL (rl/kl_estimator.h; released: k1)
    float reward_clip;    // the RM score is clipped to [-clip, clip] (released: 2.5); <= 0: off
    float gamma, lambda;  // GAE (released: 1.0, 0.95)
    ValueFunction value_function;
    MacroReward macro_reward; // mean (released code) or sum (paper)
} AdvantageConfig;

// r[j] = -beta * kl(logp[j] - logp_ref[j]) (k1: the log-ratio itself); r[R-1] += clip(score).
void token_rewards(const AdvantageConfig *config, const float *logp, const float *logp_ref, float score, int R,
                   float *rewards);

// Aggregates values and rewards per macro action, runs GAE over macro steps, and maps the
// advantage and return of each macro action back to its tokens: advantages[j], returns[j].
void macro_advantages(const AdvantageConfig *config, const float *values, const float *rewards, int R,
                      const int *segment_lengths, int segments, float *advantages, float *returns);

// The weights sigma_i of the tokens of a macro action of m tokens (sum to 1).
void macro_value_weights(ValueFunction value_function, int m, float *weights);

// "equal" | "position" | "unit"; "mean" | "sum". -1 for anything else.
int value_function_from_name(const char *name, ValueFunction *out);
int macro_reward_from_name(const char *name, MacroReward *out);

// ---- critic-free estimators: one advantage per response, from a group of responses ----
// GAE is PPO's (a critic). GRPO (Shao et al. 2024, TRL's GRPOTrainer with scale_rewards
// "group") and RLOO (Ahmadian et al. 2024, TRL's RLOOTrainer) need no critic: each prompt is
// answered G times and a response's advantage compares its sequence reward with the
// group's. For the G rewards of one group, out[g] =
//   GRPO  (r_g - mean) / (std + 1e-4), std the unbiased standard deviation of the group
//   Dr. GRPO  r_g - mean: no division by the group's spread (Liu et al. 2025, "Understanding
//         R1-Zero-Like Training"; TRL's scale_rewards="none", OpenRLHF's dr_grpo), which
//         weighs easy and hard prompts alike; usually with --loss-aggregation
//         seq-mean-token-sum-norm, its other half
//   RLOO  r_g - mean of the other G - 1 rewards
//   OPO   r_g - sum_h L_h r_h / sum_h L_h, the baseline weighted by the responses' lengths L
//         (Hao et al. 2025, "On-Policy RL with Optimal Reward Baseline"; verl's "opo")
//   GPG   alpha (r_g - mean) (Chu et al. 2025, "GPG: A Simple and Strong Reinforcement Learning
//         Baseline for Model Reasoning"; verl's "gpg"), alpha = N / (how many of the rollout's
//         N rewards are not 0): with pass/fail rewards, the gradient lost to the groups that all
//         fail is made up (rollout_group_advantages applies alpha; per group it is Dr. GRPO's)
// and 0 for a group of one (nothing to compare with). Every token of the response gets it.
//
// ReMax (Li et al. 2023; verl's "remax") needs neither: a response's advantage is its
// returns-to-go less the score of the actor's greedy answer to the same prompt (rl/ppo.c
// remax_baselines), on every token.
//
// REINFORCE++ (Hu 2025; OpenRLHF's "reinforce", verl's "reinforce_plus_plus") needs no
// group: the token rewards of token_rewards (KL per token, clipped score on the last)
// are summed into returns-to-go, which are the advantages, whitened over the rollout's
// tokens. REINFORCE++-baseline first subtracts the group's mean score from each score.
typedef enum {
    ESTIMATOR_GAE,
    ESTIMATOR_GRPO,
    ESTIMATOR_RLOO,
    ESTIMATOR_REINFORCE_PP,
    ESTIMATOR_REINFORCE_PP_BASELINE,
    ESTIMATOR_DR_GRPO,
    ESTIMATOR_OPO,
    ESTIMATOR_REMAX,
    ESTIMATOR_GPG
} AdvantageEstimator;
// lengths[0..G): the responses' token counts (OPO's weights; may be NULL for the others).
void group_advantages(AdvantageEstimator estimator, const double *rewards, const int *lengths, int G, double *out);
// GRPO's division of r - group mean: by the group's standard deviation (the paper; TRL's
// scale_rewards="group"), by the whole rollout's (TRL's "batch", as Liu et al. 2025 propose:
// a group whose rewards barely differ is not magnified), or by nothing (TRL's "none", the
// advantages of Dr. GRPO).
typedef enum { GROUP_SCALE_GROUP, GROUP_SCALE_BATCH, GROUP_SCALE_NONE } GroupScale;
// The advantages of a whole rollout: rewards[0..count), groups[q] the prompt sample q
// answers (a group's samples consecutive). GRPO is scaled as `scale` says; the other
// estimators ignore it. For GROUP_SCALE_BATCH the divisor is the unbiased standard deviation
// of all `count` rewards plus 1e-4 (TRL: nanstd(rewards) + 1e-4).
void rollout_group_advantages(AdvantageEstimator estimator, GroupScale scale, const double *rewards, const int *lengths,
                              const int *groups, int count, double *out);
// How several reward sources' scores (--reward model,command) become GRPO's advantages
// (TRL's multi_objective_aggregation). SUM_THEN_NORMALIZE, the default: the weighted sum is
// the score, normalised as --scale-rewards says. NORMALIZE_THEN_SUM (GDPO, Liu et al. 2026,
// "Group reward-Decoupled Normalization Policy Optimization"): each source's scores are
// normalised within each group first (decoupled_group_rewards), so that a source with a wide
// spread cannot drown one with a narrow one, and the weighted sum of those is standardised
// over the whole rollout (batch_standardized).
typedef enum { REWARD_SUM_THEN_NORMALIZE, REWARD_NORMALIZE_THEN_SUM } RewardAggregation;
// GDPO's rewards: out[q] = sum_k weights[k] * (parts[k][q] - m) / (s + 1e-4), m and s the mean
// and unbiased standard deviation of parts[k] over sample q's group (groups[] as in
// rollout_group_advantages); a sample alone in its group gets 0 from every source.
void decoupled_group_rewards(const double *const *parts, const double *weights, int sources, const int *groups,
                             int count, double *out);
// out[q] = (rewards[q] - mean) / (std + 1e-4) over all `count` rewards, std unbiased (0 for
// one reward). TRL: (rewards - nanmean(rewards)) / (nanstd(rewards) + 1e-4).
void batch_standardized(const double *rewards, int count, double *out);
// The end of the group that starts at `first` in groups[0..count) (a group's samples are
// consecutive): the first index past it.
int group_end(const int *groups, int count, int first);
// out[j] = sum_{t >= j} gamma^(t - j) rewards[t].
void returns_to_go(const float *rewards, int R, float gamma, float *out);
// "gae" | "grpo" | "dr-grpo" | "rloo" | "opo" | "gpg" | "remax" | "reinforce++" | "reinforce++-baseline" (also OpenRLHF's and
// verl's names); -1 otherwise; and back.
int advantage_estimator_from_name(const char *name, AdvantageEstimator *out);
const char *advantage_estimator_name(AdvantageEstimator estimator);
// DAPO's soft overlong punishment (Yu et al. 2025; verl's reward_manager.overlong_buffer):
// a response of `length` tokens out of at most max_new_tokens loses
// factor * (length - (max_new_tokens - buffer)) / buffer when it reaches into the last
// `buffer` tokens (down to -factor at the limit), and nothing before. buffer <= 0: off.
float overlong_penalty(int length, int max_new_tokens, int buffer, float factor);

// clip(score) as token_rewards applies it to the last token.
float clipped_score(const AdvantageConfig *config, float score);

// Plain token-level GAE (vanilla PPO), written independently of the macro path: tests and
// `--termination-condition token` use it to show that one-token macro actions are exactly
// token-level PPO.
void token_advantages(const AdvantageConfig *config, const float *values, const float *rewards, int R,
                      float *advantages, float *returns);
