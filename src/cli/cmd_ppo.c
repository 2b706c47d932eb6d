// marlhf ppo: PPO / MA-PPO against a reward model (step 3). See rl/ppo.h.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/batch_invariant.h"
#include "cli/commands.h"
#include "cli/train_options.h"
#include "cli/options.h"
#include "cli/sampler_options.h"
#include "model/bnb_checkpoint.h"
#include "model/quantize.h"
#include "core/check.h"
#include "data/column_renames.h"
#include "rl/ppo.h"
#include "train/packing.h"
#include "train/lr_schedule.h"

// --reward's sources ("model,command": each kind once) and --reward-weights' weights (one a
// source, finite; default 1 each) into the config.
static void parse_reward_sources(const char *sources, const char *weights, PpoConfig *c) {
    c->reward_count = 0;
    for (const char *at = sources;;) {
        const char *comma = strchr(at, ',');
        const size_t length = comma ? (size_t)(comma - at) : strlen(at);
        char name[16] = "";
        RewardKind kind;
        if (length < sizeof name) memcpy(name, at, length), name[length] = '\0';
        if (length >= sizeof name || reward_kind_from_name(name, &kind) != 0)
            die_user("option --reward must be model, lexicon, code, command or remote, or several of them separated by "
                     "commas, got '%s'", sources);
        if (ppo_uses_reward(c, kind)) die_user("option --reward names %s twice, got '%s'", name, sources);
        c->rewards[c->reward_count] = kind;
        c->reward_weights[c->reward_count++] = 1.0;
        if (!comma) break;
        at = comma + 1;
    }
    if (!weights) return;
    int count = 0;
    for (const char *at = weights;;) {
        char *end;
        const double weight = strtod(at, &end);
        if (end == at || (*end != ',' && *end != '\0') || !isfinite(weight) || count == c->reward_count)
            die_user("option --reward-weights must be %d number%s separated by commas, one for each --reward source, "
                     "got '%s'", c->reward_count, c->reward_count == 1 ? "" : "s", weights);
        c->reward_weights[count++] = weight;
        if (*end == '\0') break;
        at = end + 1;
    }
    if (count != c->reward_count)
        die_user("option --reward-weights must be %d number%s separated by commas, one for each --reward source, got "
                 "'%s'", c->reward_count, c->reward_count == 1 ? "" : "s", weights);
}

int cmd_ppo(int argc, char **argv) {
    PpoConfig c = ppo_default_config();
    char *actor = NULL, *reference = NULL, *reward_model = NULL, *critic = NULL, *prompts = NULL, *eval_prompts = NULL;
    char *ptx_packing = "none";
    char *output = NULL, *ptx = NULL, *lexicon = NULL, *data_split = "", *data_format = "auto", *device = "cpu";
    char *rename_columns = NULL;
    char *chat_template = NULL;
    char *reward_command = NULL, *reward_url = NULL, *reward_label_key = "label", *reward_weights = NULL;
    double reward_timeout = 60;
    long reward_retries = 3;
    char *termination = "fixed", *value_function = "equal", *macro_reward = "mean", *ratio = NULL;
    char *reward = "model", *schedule = "linear", *aggregation = NULL, *policy_loss = "ppo", *scale_rewards = "group";
    char *multi_objective = "sum_then_normalize";
    long max_prompt_len = c.max_prompt_len, max_new_tokens = c.max_new_tokens, rollout_batch = c.rollout_batch;
    long generation_batch = c.generation_batch, micro_batch = c.micro_batch, minibatches = c.minibatches;
    long ppo_epochs = c.ppo_epochs, epochs = c.epochs, max_iterations = 0, min_response = c.min_response_tokens, min_new = 0;
    long top_k = c.sampler.top_k, ngram = c.macro.ngram, repeat_times = c.macro.repeat_times;
    long parser_cutoff = c.macro.parser_cutoff, eval_every = 0, save_every = 0, keep_last = c.keep_last, seed = 1234;
    long eval_count = 0, data_phase = 3, threads = 0, zero_stage = 0, samples_per_prompt = 1, eval_samples = 1;
    char *estimator = "gae", *kl_estimator = "k1", *kl_loss_type = NULL;
    const char *reference_quantize = NULL, *reward_quantize = "none", *actor_quantize = "none", *critic_quantize = "none";
    double temperature = c.sampler.temperature, top_p = c.sampler.top_p, actor_lr = c.actor_lr, critic_lr = c.critic_lr;
    double weight_decay = c.weight_decay, warmup_ratio = c.warmup_ratio, clip_norm = c.clip_norm;
    double kl_coef = c.advantage.kl_coef, reward_clip = c.advantage.reward_clip, gamma = c.advantage.gamma;
    double lambda = c.advantage.lambda, clip_ratio = c.loss.clip_ratio, value_clip = c.loss.value_clip;
    double kl_target = 0, kl_horizon = c.kl_horizon, entropy_coef = 0, ptx_coef = c.ptx_coef, ema_beta = c.ema_beta;
    double kl_loss_coef = 0, clip_ratio_high = -1, overlong_penalty = 1.0, cispo_max_weight = c.loss.cispo_max_weight;
    double ratio_cap = 0, top_entropy_quantile = 1.0;
    double entropy_coef_min = 0.0, entropy_coef_max = 1.0, entropy_coef_delta = 0.005, entropy_target = 0.2;
    bool adaptive_entropy = false;
    double sapo_temperature_pos = c.loss.sapo_temperature_pos, sapo_temperature_neg = c.loss.sapo_temperature_neg;
    double vespo_k_pos = c.loss.vespo_k_pos, vespo_lambda_pos = c.loss.vespo_lambda_pos;
    double vespo_k_neg = c.loss.vespo_k_neg, vespo_lambda_neg = c.loss.vespo_lambda_neg;
    long overlong_buffer = 0, max_generation_rounds = 1;
    double alarm_length_ratio = c.hacking.length_ratio, alarm_distinct_ratio = c.hacking.distinct_ratio;
    double alarm_fraction_rise = c.hacking.fraction_rise;
    bool stop_on_alarm = false;
    double alarm_score_quantile = c.alarm_score_quantile;
    bool keep_duplicates = false, paper_randomized = false, ppl_monotone = false, whiten = false, normalize = false;
    bool ema = false, hybrid_engine = false, resume = false, quiet = false, checkpointing = false, filter_groups = false, recompute_old = false,
         old_from_rollout = false;
    bool batch_invariant = false, mask_truncated = false;
    double missing_eos_penalty = 0, rollout_correction_min = 0, rollout_correction_max = 3.0;
    double off_policy_mask_threshold = -1;
    char *rollout_correction = "none";
    bool kl_loss_bias_correction = false;
    double kl_cov_ratio = c.loss.kl_cov_ratio, kl_cov_coef = c.loss.kl_cov_coef;
    double clip_cov_ratio = c.loss.clip_cov_ratio, clip_cov_lower = c.loss.clip_cov_lower;
    double clip_cov_upper = c.loss.clip_cov_upper;
    long critic_warmup_iterations = 0;
    SamplerExtrasCli extras = SAMPLER_EXTRAS_CLI_DEFAULTS;
    Option options[180] = {
        {"actor-model", "actor_model_name_or_path model", OPT_STRING, &actor, "the SFT model (actor and, by default, reference)", true, false},
        {"reward-model", "reward_model critic_model_name_or_path_for_reward", OPT_STRING, &reward_model, "the reward model (frozen)", false, false},
        {"critic-model", "critic_model_name_or_path", OPT_STRING, &critic, "critic initialisation (default: the reward model)", false, false},
        {"reference-model", "reference_model", OPT_STRING, &reference, "frozen reference (default: the actor's start)", false, false},
        {"reference-quantize", "reference_quantize", OPT_STRING, &reference_quantize,
         QUANTIZE_TYPES ": the reference's weights in 16 to 2 bits (a half to about a twelfth of the memory; its log-probs, "
         "hence the KL, move by the quantization's error (under bf16 a bf16 checkpoint's by float rounding only); default: none, or --actor-quantize's type for a reference made from "
         "--actor-model)", false, false},
        {"actor-quantize", "actor_quantize", OPT_STRING, &actor_quantize,
         QUANTIZE_TYPES ": the actor's frozen base in 16 to 2 bits under its LoRA adapters (QLoRA; needs "
         "--actor-lora-rank or --actor-lora-adapter); rollouts, old log-probs and training all use it", false,
         false},
        {"critic-quantize", "critic_quantize", OPT_STRING, &critic_quantize,
         QUANTIZE_TYPES ": the critic's frozen base in 16 to 2 bits under its LoRA adapters (QLoRA; needs "
         "--critic-lora-rank or --critic-lora-adapter); the value head stays float32", false, false},
        {"reward-quantize", "reward_quantize", OPT_STRING, &reward_quantize,
         QUANTIZE_TYPES ": the reward model's weights in 16 to 2 bits (a half to about a twelfth of the memory; scores move "
         "by the quantization's error)", false, false},
        {"prompts", "data data_path", OPT_STRING, &prompts, "prompts (any supported schema; the prompt field is used)", true, false},
        {"eval-prompts", "eval_prompts", OPT_STRING, &eval_prompts, "held-out prompts scored at every evaluation", false, false},
        {"output", "output_dir", OPT_STRING, &output, "run folder", true, false},
        {"data-format", "data_format", OPT_STRING, &data_format, "auto|tldr|hh|webgpt|apps|sft|pairs|ranked|prompts|unpaired", false, false},
        {"rename-columns", "rename_columns", OPT_STRING, &rename_columns,
         "old=new,...: the prompt files' fields renamed before their format is read, e.g. question=prompt", false, false},
        {"data-split", "data_split", OPT_STRING, &data_split, "DeepSpeed-Chat split weights, e.g. 2,4,4 (empty: all rows)", false, false},
        {"chat-template", "chat_template", OPT_STRING, &chat_template,
         "chat template (name or file) for conversational prompts (lists of messages); default: the actor's own", false, false},
        {"data-phase", "data_phase", OPT_INT, &data_phase, "which part of --data-split PPO uses", false, false},
        {"reward", NULL, OPT_STRING, &reward,
         "model | lexicon (the gold lexicon as reward) | code (APPS execution) | command (--reward-command) | "
         "remote (--reward-url), or several separated by commas (e.g. model,command): their weighted sum",
         false, false},
        {"reward-weights", "reward_weights", OPT_STRING, &reward_weights,
         "one weight per --reward source, separated by commas (TRL's reward_weights; default: all 1)", false, false},
        {"reward-command", "reward_command", OPT_STRING, &reward_command,
         "a program scoring responses: one JSON line {prompt, response, row} in, one number out (see docs/grpo.md)",
         false, false},
        {"reward-timeout", "reward_timeout", OPT_FLOAT, &reward_timeout,
         "seconds the reward command may take per answer (remote: per request of up to 64 responses)", false, false},
        {"reward-url", "remote_rm_url", OPT_STRING, &reward_url,
         "a reward server's endpoint, e.g. http://host:5000/get_reward (OpenRLHF's protocol; marlhf serve "
         "--reward-model serves one)",
         false, false},
        {"reward-retries", NULL, OPT_INT, &reward_retries,
         "further attempts when the reward server times out or answers 429/5xx (waits 1, 2, 4... s)", false, false},
        {"reward-label-key", "label_key", OPT_STRING, &reward_label_key,
         "the prompt row's field sent to the reward server as each response's label (null when absent)", false, false},
        {"gold-lexicon", "gold_lexicon", OPT_STRING, &lexicon, "lexicon TSV: gold sentiment score of responses (metrics)", false, false},
        {"max-prompt-len", "max_prompt_seq_len", OPT_INT, &max_prompt_len, "longer prompts are dropped", false, false},
        {"max-new-tokens", "max_answer_seq_len", OPT_INT, &max_new_tokens, "response length limit", false, false},
        {"temperature", NULL, OPT_FLOAT, &temperature, "rollout sampling temperature", false, false},
        {"top-k", "top_k", OPT_INT, &top_k, "rollout top-k (0: off)", false, false},
        {"top-p", "top_p", OPT_FLOAT, &top_p, "rollout top-p (1: off)", false, false},
        SAMPLER_EXTRAS_OPTIONS(&extras),
        {"rollout-batch-size", "rollout_batch_size generation_batch_numbers", OPT_INT, &rollout_batch, "prompts per iteration", false, false},
        {"generation-batch-size", "per_device_generation_batch_size", OPT_INT, &generation_batch, "rows generated together", false, false},
        {"micro-batch-size", "per_device_training_batch_size", OPT_INT, &micro_batch, "rows per training forward/backward", false, false},
        {"num-minibatches", "num_minibatches", OPT_INT, &minibatches, "optimizer steps per PPO epoch", false, false},
        {"ppo-epochs", "ppo_epochs", OPT_INT, &ppo_epochs, "passes over each rollout", false, false},
        {"num-train-epochs", "num_train_epochs epochs", OPT_INT, &epochs, "passes over the prompts", false, false},
        {"max-iterations", "max_iterations", OPT_INT, &max_iterations, "stop after this many iterations (0: no limit)", false, false},
        {"min-response-tokens", "min_response_tokens", OPT_INT, &min_response, "drop shorter responses", false, false},
        {"min-new-tokens", "min_new_tokens", OPT_INT, &min_new, "no end of text before this many new tokens (0: off)", false, false},
        {"actor-learning-rate", "actor_learning_rate", OPT_FLOAT, &actor_lr, "actor peak learning rate", false, false},
        {"critic-learning-rate", "critic_learning_rate", OPT_FLOAT, &critic_lr, "critic peak learning rate", false, false},
        {"weight-decay", "actor_weight_decay weight_decay", OPT_FLOAT, &weight_decay, "AdamW weight decay (both models)", false, false},
        {"lr-scheduler-type", "lr_scheduler_type", OPT_STRING, &schedule, "constant|linear|cosine", false, false},
        {"warmup-ratio", "warmup_ratio", OPT_FLOAT, &warmup_ratio, "warmup fraction of optimizer steps", false, false},
        {"max-grad-norm", "max_grad_norm", OPT_FLOAT, &clip_norm, "gradient clipping (0: off)", false, false},
        {"loss-aggregation", "loss_agg_mode", OPT_STRING, &aggregation,
         "seq-mean-token-mean (released; the default) | token-mean (DAPO; the default with --policy-loss cispo or vespo) | "
         "seq-mean-token-sum-norm (Dr. GRPO; the default with --advantage-estimator dr-grpo) | seq-mean-token-sum (the "
         "default with --policy-loss luspo) | micro-batch-token-mean (TRL's bnpo: each micro-batch's token mean, averaged "
         "over the step's micro-batches)", false, false},
        {"policy-loss", "loss_type policy_loss_type loss_mode", OPT_STRING, &policy_loss,
         "ppo (clipped ratio) | cispo (clipped, gradient-free token weights; MiniMax-M1) | sapo (soft gate) | vespo "
         "(gradient-free gamma weight of the response's ratio) | luspo (ppo with --ratio sequence and "
         "--loss-aggregation seq-mean-token-sum) | gmpo (the geometric mean of the log-clipped token ratios; "
         "--cliprange 0.4 by default, in log space) | kl_cov (unclipped, a KL penalty on the tokens of largest "
         "advantage-log-prob covariance) | clip_cov (clipped, a few tokens of covariance within bounds left out) | "
         "gpg (-A logp, no ratio)",
         false, false},
        {"kl-cov-ratio", "kl_cov_ratio", OPT_FLOAT, &kl_cov_ratio,
         "--policy-loss kl_cov: the fraction of a micro-batch's tokens penalised (verl's; at least one)", false, false},
        {"kl-cov-coef", "ppo_kl_coef", OPT_FLOAT, &kl_cov_coef,
         "--policy-loss kl_cov: the weight of their |logp - old logp| (verl's ppo_kl_coef)", false, false},
        {"clip-cov-ratio", "clip_cov_ratio", OPT_FLOAT, &clip_cov_ratio,
         "--policy-loss clip_cov: the fraction of a micro-batch's tokens left out (verl's; at least one)", false, false},
        {"clip-cov-lower", "clip_cov_lb", OPT_FLOAT, &clip_cov_lower,
         "--policy-loss clip_cov: only tokens whose covariance is above this are drawn (verl's clip_cov_lb)", false,
         false},
        {"clip-cov-upper", "clip_cov_ub", OPT_FLOAT, &clip_cov_upper,
         "--policy-loss clip_cov: ... and below this (verl's clip_cov_ub)", false, false},
        {"cispo-max-weight", "cispo_max_weight", OPT_FLOAT, &cispo_max_weight,
         "--policy-loss cispo: the token weight's cap (TRL's epsilon_high for cispo)", false, false},
        {"sapo-temperature-pos", "sapo_temperature_pos", OPT_FLOAT, &sapo_temperature_pos,
         "--policy-loss sapo: the gate's temperature for positive advantages", false, false},
        {"sapo-temperature-neg", "sapo_temperature_neg", OPT_FLOAT, &sapo_temperature_neg,
         "--policy-loss sapo: the gate's temperature for the others", false, false},
        {"vespo-k-pos", "vespo_k_pos", OPT_FLOAT, &vespo_k_pos, "--policy-loss vespo: k of the weight for advantages >= 0",
         false, false},
        {"vespo-lambda-pos", "vespo_lambda_pos", OPT_FLOAT, &vespo_lambda_pos,
         "--policy-loss vespo: lambda of the weight for advantages >= 0", false, false},
        {"vespo-k-neg", "vespo_k_neg", OPT_FLOAT, &vespo_k_neg, "--policy-loss vespo: k for negative advantages", false,
         false},
        {"vespo-lambda-neg", "vespo_lambda_neg", OPT_FLOAT, &vespo_lambda_neg,
         "--policy-loss vespo: lambda for negative advantages", false, false},
        {"scale-rewards", "scale_rewards", OPT_STRING, &scale_rewards,
         "--advantage-estimator grpo: divide r - group mean by the group's std (group), the rollout's (batch) or not (none)",
         false, false},
        {"multi-objective-aggregation", "multi_objective_aggregation", OPT_STRING, &multi_objective,
         "--advantage-estimator grpo: sum_then_normalize (the --reward sources' weighted sum is the score) or "
         "normalize_then_sum (GDPO: each source normalised within the group, the weighted sum standardised over the "
         "rollout)",
         false, false},
        {"recompute-old-logprobs", "recompute_old_logprobs", OPT_BOOL, &recompute_old,
         "always run the actor over the rollout for the old log-probs (by default skipped when one optimizer step follows "
         "each rollout and --kl-ctl is 0: they are the training forward's)", false, false},
        {"old-logprobs-from-rollout", "old_logprobs_from_rollout", OPT_BOOL, &old_from_rollout,
         "take the old log-probs from generation, as TRL's PPOTrainer does, instead of a forward of the actor over the "
         "rollout (one forward fewer per iteration)", false, false},
        {"kl-ctl", "kl_ctl kl_coef init_kl_coef", OPT_FLOAT, &kl_coef, "KL penalty coefficient beta", false, false},
        {"kl-estimator", "kl_estimator", OPT_STRING, &kl_estimator,
         "the KL penalty's per-token estimate from x = logp - logp_ref: k1 (x, the released code's), k2 (x^2 / 2), "
         "k3 (exp(-x) - 1 + x: unbiased, never negative; TRL's and OpenRLHF's kl_estimator) or abs (|x|); "
         "train/kl logs k1's whatever this", false, false},
        {"kl-loss-coef", "kl_loss_coef", OPT_FLOAT, &kl_loss_coef,
         "KL to the reference as a loss term, k3 by default (verl's use_kl_loss, TRL's GRPO beta); pair with --kl-ctl 0",
         false, false},
        {"kl-loss-bias-correction", "use_bias_correction_kl", OPT_BOOL, &kl_loss_bias_correction,
         "--kl-loss-coef's term times each token's policy ratio, its gradient included (DeepSeek-V3.2's unbiased KL; "
         "TRL's use_bias_correction_kl, on by default in TRL 1.16's GRPO)", false, false},
        {"kl-loss-type", "kl_loss_type", OPT_STRING, &kl_loss_type,
         "--kl-loss-coef's per-token estimate: k3 (the default: verl's low_var_kl unclamped, TRL's GRPO KL), k1, k2 "
         "(verl's mse) or abs", false, false},
        {"kl-target", "target", OPT_FLOAT, &kl_target, "adaptive KL controller target (0: fixed beta)", false, false},
        {"kl-horizon", "horizon", OPT_FLOAT, &kl_horizon, "adaptive KL controller horizon", false, false},
        {"alarm-length-ratio", "alarm_length_ratio", OPT_FLOAT, &alarm_length_ratio,
         "reward-hacking alarm: warn when the mean response length is above this many times the first iteration's, or "
         "below the first's divided by it (0: off)", false, false},
        {"alarm-distinct-ratio", "alarm_distinct_ratio", OPT_FLOAT, &alarm_distinct_ratio,
         "reward-hacking alarm: warn when distinct-2 (distinct token bigrams over all) falls below this fraction of the "
         "first iteration's (0: off)", false, false},
        {"alarm-fraction-rise", "alarm_fraction_rise", OPT_FLOAT, &alarm_fraction_rise,
         "reward-hacking alarm: warn when the share of looping responses, of prompts given one identical answer, or of "
         "responses holding one same trigram rises this much above the first iteration's (0: off)", false, false},
        {"alarm-score-quantile", "alarm_score_quantile", OPT_FLOAT, &alarm_score_quantile,
         "reward-hacking alarm: warn when the iteration's mean reward-model score is above this quantile of the reward "
         "model's scores of the preferred answers of its own data (its folder's reward_stats.json, written by marlhf rm; "
         "0: off)", false, false},
        {"stop-on-alarm", "stop_on_alarm", OPT_BOOL, &stop_on_alarm,
         "stop the run when a reward-hacking alarm goes on: that iteration's responses are not trained on, no final "
         "model is written, exit status 3 (--resume continues from the last checkpoint)", false, false},
        {"reward-clip", "clip_reward_value", OPT_FLOAT, &reward_clip, "clip the score to [-c, c] (0: off)", false, false},
        {"gamma", NULL, OPT_FLOAT, &gamma, "GAE discount", false, false},
        {"lam", "lambda", OPT_FLOAT, &lambda, "GAE lambda", false, false},
        {"cliprange", "clip_ratio cliprange clip_ratio_low", OPT_FLOAT, &clip_ratio, "PPO ratio clip epsilon", false, false},
        {"cliprange-high", "clip_ratio_high eps_clip_high", OPT_FLOAT, &clip_ratio_high,
         "upper clip epsilon (DAPO's clip-higher, e.g. 0.28); -1: the same as --cliprange", false,
         false},
        {"delta", "clip_ratio_c dual_clip", OPT_FLOAT, &ratio_cap,
         "--policy-loss ppo: two-sided clipping, the unclipped term's ratio capped at this (TRL's delta, INTELLECT-2; "
         "verl's dual clip clip_ratio_c), above 1 + --cliprange-high; 0: off", false, false},
        {"top-entropy-quantile", "top_entropy_quantile", OPT_FLOAT, &top_entropy_quantile,
         "train the policy term on this top fraction of each micro-batch's response tokens by entropy only (TRL's "
         "top_entropy_quantile, the 80/20 rule: 0.2), in [0, 1]; 1: every token", false, false},
        {"filter-groups", "dynamic_filtering filter_groups", OPT_BOOL, &filter_groups,
         "leave out of training the groups whose responses all scored the same (DAPO's dynamic sampling, no refill)", false,
         false},
        {"mask-truncated-completions", "mask_truncated_completions", OPT_BOOL, &mask_truncated,
         "leave the responses that hit --max-new-tokens without a stop token out of the losses (TRL's "
         "mask_truncated_completions, DAPO's overlong filtering): a sequence mean still counts them, a token mean "
         "does not", false, false},
        {"max-generation-rounds", "max_num_gen_batches", OPT_INT, &max_generation_rounds,
         "with --filter-groups: generate up to this many rounds of --rollout-batch-size prompts per iteration to refill "
         "the batch with groups that were not filtered (DAPO; 1: no refill)", false, false},
        {"overlong-buffer", "overlong_buffer_len", OPT_INT, &overlong_buffer,
         "DAPO's soft overlong punishment: the last N of --max-new-tokens lower the score linearly (0: off)", false, false},
        {"overlong-penalty", "overlong_penalty_factor", OPT_FLOAT, &overlong_penalty,
         "the score lost at --max-new-tokens with --overlong-buffer", false, false},
        {"missing-eos-penalty", "missing_eos_penalty", OPT_FLOAT, &missing_eos_penalty,
         "subtracted from the score of each response that hit --max-new-tokens without a stop token (TRL's "
         "missing_eos_penalty), after --normalize-reward; 0: off", false, false},
        {"critic-warmup-iterations", "critic_warmup freezing_actor_steps", OPT_INT, &critic_warmup_iterations,
         "train only the critic for this many first iterations, the actor frozen (OpenRLHF's freezing_actor_steps, "
         "verl's critic_warmup): its steps, EMA, PTX and schedule start after them; --advantage-estimator gae", false,
         false},
        {"rollout-correction", "vllm_importance_sampling_mode", OPT_STRING, &rollout_correction,
         "weight each token's policy term for generation's log-probs differing from the actor pass's (TRL's vLLM "
         "importance sampling): token-truncate, token-mask, sequence-truncate or sequence-mask, the ratio "
         "exp(old - generation's) per token or for the response, clamped to [--rollout-correction-min, -max] or 0 "
         "outside; none: off", false, false},
        {"rollout-correction-max", "vllm_importance_sampling_clip_max vllm_importance_sampling_cap", OPT_FLOAT,
         &rollout_correction_max, "--rollout-correction's upper bound C_max (TRL's default)", false, false},
        {"rollout-correction-min", "vllm_importance_sampling_clip_min", OPT_FLOAT, &rollout_correction_min,
         "--rollout-correction's lower bound C_min (0: none)", false, false},
        {"off-policy-mask-threshold", "off_policy_mask_threshold", OPT_FLOAT, &off_policy_mask_threshold,
         "DeepSeek-V3.2's off-policy sequence masking (TRL's): a response whose mean log-ratio of sampling to "
         "current policy is above this trains no negative-advantage token (e.g. 0.5; negative: off)", false, false},
        {"cliprange-value", "cliprange_value value_clip", OPT_FLOAT, &value_clip, "value clip (0: off)", false, false},
        {"entropy-coef", "entropy_coef", OPT_FLOAT, &entropy_coef,
         "entropy bonus coefficient (with --adaptive-entropy its start)", false, false},
        {"adaptive-entropy", "use_adaptive_entropy", OPT_BOOL, &adaptive_entropy,
         "Skywork-OR1's adaptive entropy control (TRL's use_adaptive_entropy): after each optimizer step the "
         "coefficient moves by --entropy-coef-delta, up while the trained tokens' mean entropy is at most "
         "--entropy-target, down above it; the bonus applies only at or below the target", false, false},
        {"entropy-coef-min", "entropy_coef_min", OPT_FLOAT, &entropy_coef_min,
         "--adaptive-entropy: the coefficient's lower bound", false, false},
        {"entropy-coef-max", "entropy_coef_max", OPT_FLOAT, &entropy_coef_max,
         "--adaptive-entropy: the coefficient's upper bound", false, false},
        {"entropy-coef-delta", "entropy_coef_delta", OPT_FLOAT, &entropy_coef_delta,
         "--adaptive-entropy: the coefficient's step", false, false},
        {"entropy-target", "entropy_target", OPT_FLOAT, &entropy_target,
         "--adaptive-entropy: the target mean entropy in nats (TRL's default 0.2; set it near the entropy logged early)",
         false, false},
        {"whiten-advantages", "whiten_advantages", OPT_BOOL, &whiten, "normalise advantages over each rollout", false, false},
        {"normalize-reward", "normalize_reward", OPT_BOOL, &normalize, "running mean/std normalisation of scores", false, false},
        {"ptx-data", "unsupervised_dataset_name", OPT_STRING, &ptx, "SFT data mixed into the actor loss (PPO-ptx)", false, false},
        {"ptx-coef", "unsup_coef", OPT_FLOAT, &ptx_coef, "PPO-ptx coefficient", false, false},
        {"ptx-packing", "ptx_packing", OPT_STRING, &ptx_packing,
         "none (one PTX row a row) | wrapped (the rows as one stream cut into rows of --max-prompt-len + "
         "--max-new-tokens tokens: DeepSpeed-Chat's group_texts) | bfd | bfd_split (sft --packing's)", false, false},
        {"enable-ema", "enable_ema", OPT_BOOL, &ema, "keep an EMA of the actor (saved as actor_ema)", false, false},
        {"ema-beta", "ema_beta", OPT_FLOAT, &ema_beta, "EMA decay", false, false},
        {"advantage-estimator", "advantage_estimator adv_estimator", OPT_STRING, &estimator,
         "gae (PPO, with a critic) | grpo | dr-grpo | rloo | opo | gpg | remax (the greedy answer's score the baseline) | "
         "reinforce++ | reinforce++-baseline (no critic)", false, false},
        {"samples-per-prompt", "n_samples_per_prompt num_generations", OPT_INT, &samples_per_prompt,
         "responses generated per prompt (grpo, dr-grpo, rloo, opo, gpg, reinforce++-baseline: at least 2)", false, false},
        {"termination-condition", "termination_condition", OPT_STRING, &termination, "fixed | randomized | parsing | ppl | token (vanilla PPO)", false, false},
        {"ngram", NULL, OPT_INT, &ngram, "macro-action length for fixed n-gram (1: token-level PPO)", false, false},
        {"repeat-times", "repeat_times", OPT_INT, &repeat_times, "randomized n-gram: repeats of each length", false, false},
        {"parser-cutoff", "parser_cutoff parsing_cutoff", OPT_INT, &parser_cutoff, "parsing: constituents under C tokens form macro actions", false, false},
        {"value-function", "value_function", OPT_STRING, &value_function, "equal | position | unit", false, false},
        {"macro-reward", "macro_reward", OPT_STRING, &macro_reward, "mean (released code) | sum (paper)", false, false},
        {"ratio", "importance_sampling_level", OPT_STRING, &ratio,
         "per-token (released code; the default) | macro (paper's macro-action product) | sequence (GSPO: the response's "
         "geometric mean; the default with --policy-loss luspo) | sequence-token (GSPO-token: the response's ratio, "
         "each token's own gradient and advantage)",
         false, false},
        {"keep-duplicate-boundaries", "keep_duplicate_boundaries", OPT_BOOL, &keep_duplicates,
         "released code's zero-length macro step (then --ngram 1 is not token-level PPO)", false, false},
        {"randomized-paper-lengths", NULL, OPT_BOOL, &paper_randomized, "randomized lengths {2,3,5,10} (paper) instead of {1,2,3,5,10}", false, false},
        {"ppl-monotone", NULL, OPT_BOOL, &ppl_monotone, "perplexity boundary one token later (paper's reading)", false, false},
        {"eval-every", "eval_every", OPT_INT, &eval_every, "iterations between evaluations (0: start and end)", false, false},
        {"eval-count", "eval_count", OPT_INT, &eval_count, "eval prompts used (0: all)", false, false},
        {"eval-samples-per-prompt", "num_generations_eval n_samples_per_prompt_eval", OPT_INT, &eval_samples,
         "answers per eval prompt (TRL's num_generations_eval); above 1, eval/best_of_n: the mean of each prompt's "
         "best score", false, false},
        {"save-every", "save_steps", OPT_INT, &save_every, "iterations between checkpoints (0: at the end)", false, false},
        {"keep-last", "keep_last", OPT_INT, &keep_last, "checkpoints kept", false, false},
        {"seed", NULL, OPT_INT, &seed, "seed (prompt order, sampling, randomized macro actions)", false, false},
        {"resume", NULL, OPT_BOOL, &resume, "continue from the newest checkpoint", false, false},
        {"gradient-checkpointing", "actor_gradient_checkpointing", OPT_BOOL, &checkpointing, "recompute layers in backward", false, false},
        {"zero-stage", "actor_zero_stage", OPT_INT, &zero_stage,
         "under mpirun: 1 shards the actor's and critic's AdamW moments across processes (ZeRO-1), "
         "2 (--device cpu) their gradients too (ZeRO-2), 3 (--device cpu) their layers' weights too (ZeRO-3)", false, false},
        {"enable-hybrid-engine", "enable_hybrid_engine", OPT_BOOL, &hybrid_engine,
         "with --zero-stage 3: gather the actor's layers whole on every process for each generation (DeepSpeed-Chat's "
         "hybrid engine: faster rollouts, the whole actor's memory meanwhile); no effect otherwise", false, false},
        {"quiet", NULL, OPT_BOOL, &quiet, "no progress bar", false, false},
        {"device", NULL, OPT_STRING, &device, "cpu (cuda when built with it)", false, false},
        {"threads", NULL, OPT_INT, &threads, "CPU threads (0 = all cores)", false, false},
        cli_batch_invariant_option(&batch_invariant),
    };
    int count = 0;
    while (options[count].name) count++;
    LoraCli actor_lora = {0}, critic_lora = {0};
    count += lora_cli_options(&actor_lora, "actor-", options + count);
    count += lora_cli_options(&critic_lora, "critic-", options + count);
    ReferenceSyncCli sync = reference_sync_cli_defaults();
    const Option *sync_options = options + count;
    count += reference_sync_cli_options(&sync, options + count);
    CHECK(count <= (int)(sizeof options / sizeof options[0]), "ppo option table too small");
    OptionSet set = {"ppo", "PPO / MA-PPO (or critic-free GRPO / RLOO): train the actor against a reward with macro actions.",
                     "marlhf ppo --actor-model SFT --reward-model RM --prompts FILE --output RUN_DIR [options]", options,
                     count, NULL, 0, 0};
    options_parse(&set, argc, argv);
    sampler_extras_check(&extras);
    cli_set_batch_invariant(&set, device);

    if (reference_quantize && quantize_type_check(reference_quantize, "--reference-quantize") != 0) die_from_err();
    if (quantize_type_check(actor_quantize, "--actor-quantize") != 0) die_from_err();
    if (quantize_type_check(critic_quantize, "--critic-quantize") != 0) die_from_err();
    if (quantize_type_check(reward_quantize, "--reward-quantize") != 0) die_from_err();
    c.reference_quantize = reference_quantize, c.reward_quantize = reward_quantize;
    parse_reward_sources(reward, reward_weights, &c);
    if (ppo_uses_reward(&c, REWARD_COMMAND) && (!reward_command || !*reward_command))
        die_user("option --reward command needs --reward-command 'PROGRAM ARGS'");
    if (reward_command && !ppo_uses_reward(&c, REWARD_COMMAND)) die_user("option --reward-command needs --reward command");
    if (!(reward_timeout > 0) || !isfinite(reward_timeout))
        die_user("option --reward-timeout must be positive, got %g", reward_timeout);
    if (ppo_uses_reward(&c, REWARD_REMOTE) && (!reward_url || !*reward_url))
        die_user("option --reward remote needs --reward-url http://HOST:PORT/get_reward");
    if (reward_url && !ppo_uses_reward(&c, REWARD_REMOTE)) die_user("option --reward-url needs --reward remote");
    c.reward_command = reward_command, c.reward_timeout_seconds = reward_timeout;
    if (reward_retries < 0 || reward_retries > 100) die_user("option --reward-retries must be in 0..100, got %ld", reward_retries);
    c.reward_url = reward_url, c.reward_label_key = reward_label_key, c.reward_retries = (int)reward_retries;
    if (ppo_uses_reward(&c, REWARD_MODEL) && !reward_model)
        die_user("missing option --reward-model (or --reward lexicon|code)");
    if (!strcmp(termination, "token")) c.token_level = true;
    else if (macro_termination_from_name(termination, &c.macro.condition) != 0)
        die_user("option --termination-condition must be fixed, randomized, parsing, ppl or token, got '%s'", termination);
    if (value_function_from_name(value_function, &c.advantage.value_function) != 0)
        die_user("option --value-function must be equal, position or unit, got '%s'", value_function);
    if (macro_reward_from_name(macro_reward, &c.advantage.macro_reward) != 0)
        die_user("option --macro-reward must be mean or sum, got '%s'", macro_reward);
    // LUSPO (TRL's loss_type "luspo") is the clipped loss with the response's ratio, summed
    // over its tokens: a name for three settings.
    const bool luspo = !strcmp(policy_loss, "luspo");
    if (policy_loss_kind_from_name(luspo ? "ppo" : policy_loss, &c.loss.policy_loss) != 0)
        die_user("option --policy-loss must be ppo, cispo, sapo, vespo, luspo, gmpo, kl_cov, clip_cov or gpg, got '%s'",
                 policy_loss);
    if (!(kl_cov_ratio > 0 && kl_cov_ratio <= 1) || !(kl_cov_coef >= 0) || !isfinite(kl_cov_coef))
        die_user("options --kl-cov-ratio must be in (0, 1] and --kl-cov-coef >= 0, got %g and %g", kl_cov_ratio,
                 kl_cov_coef);
    c.loss.kl_cov_ratio = (float)kl_cov_ratio, c.loss.kl_cov_coef = (float)kl_cov_coef;
    if (!(clip_cov_ratio > 0 && clip_cov_ratio <= 1) || !isfinite(clip_cov_lower) || !isfinite(clip_cov_upper) ||
        !(clip_cov_lower < clip_cov_upper))
        die_user("options --clip-cov-ratio must be in (0, 1] and --clip-cov-lower below --clip-cov-upper, got %g, %g "
                 "and %g", clip_cov_ratio, clip_cov_lower, clip_cov_upper);
    c.loss.clip_cov_ratio = (float)clip_cov_ratio, c.loss.clip_cov_lower = (float)clip_cov_lower;
    c.loss.clip_cov_upper = (float)clip_cov_upper;
    if ((c.loss.policy_loss == POLICY_LOSS_VESPO || c.loss.policy_loss == POLICY_LOSS_GMPO ||
         c.loss.policy_loss == POLICY_LOSS_KL_COV || c.loss.policy_loss == POLICY_LOSS_CLIP_COV ||
         c.loss.policy_loss == POLICY_LOSS_GPG) && ratio &&
        strcmp(ratio, "per-token") != 0)
        die_user("option --ratio does not apply to --policy-loss %s (it makes its own ratio or takes the token's)",
                 policy_loss);
    // GMPO clips log-ratios, and recommends a wider range than PPO's (TRL's GMPOConfig epsilon).
    if (c.loss.policy_loss == POLICY_LOSS_GMPO && !options_given(&set, "cliprange")) clip_ratio = 0.4;
    if (!ratio) ratio = luspo ? "sequence" : "per-token";
    if (ratio_kind_from_name(ratio, &c.loss.ratio) != 0)
        die_user("option --ratio must be per-token, macro, sequence or sequence-token, got '%s'", ratio);
    const double vespo_settings[4] = {vespo_k_pos, vespo_lambda_pos, vespo_k_neg, vespo_lambda_neg};
    for (int i = 0; i < 4; i++)
        if (!isfinite(vespo_settings[i]) || vespo_settings[i] < 0 || (i % 2 == 1 && vespo_settings[i] == 0))
            die_user("options --vespo-k-pos/neg must be >= 0 and --vespo-lambda-pos/neg > 0, got %g", vespo_settings[i]);
    c.loss.vespo_k_pos = (float)vespo_k_pos, c.loss.vespo_lambda_pos = (float)vespo_lambda_pos;
    c.loss.vespo_k_neg = (float)vespo_k_neg, c.loss.vespo_lambda_neg = (float)vespo_lambda_neg;
    if (!(cispo_max_weight > 0) || !isfinite(cispo_max_weight))
        die_user("option --cispo-max-weight must be positive, got %g", cispo_max_weight);
    if (!(sapo_temperature_pos > 0) || !isfinite(sapo_temperature_pos) || !(sapo_temperature_neg > 0) ||
        !isfinite(sapo_temperature_neg))
        die_user("options --sapo-temperature-pos and --sapo-temperature-neg must be positive");
    c.loss.cispo_max_weight = (float)cispo_max_weight;
    c.loss.sapo_temperature_pos = (float)sapo_temperature_pos, c.loss.sapo_temperature_neg = (float)sapo_temperature_neg;
    LrScheduleKind kind;
    if (lr_schedule_kind_from_name(schedule, &kind) != 0) die_user("option --lr-scheduler-type must be constant, linear or cosine");
    struct { const char *name; long value, lo, hi; } ranges[] = {
        {"--max-prompt-len", max_prompt_len, 1, 1 << 20}, {"--max-new-tokens", max_new_tokens, 1, 1 << 20},
        {"--rollout-batch-size", rollout_batch, 1, 1 << 20}, {"--generation-batch-size", generation_batch, 1, 4096},
        {"--micro-batch-size", micro_batch, 1, 4096}, {"--num-minibatches", minibatches, 1, 1 << 20},
        {"--ppo-epochs", ppo_epochs, 1, 1000}, {"--num-train-epochs", epochs, 1, 1000000},
        {"--max-iterations", max_iterations, 0, 1L << 40}, {"--min-response-tokens", min_response, 1, 1 << 20}, {"--min-new-tokens", min_new, 0, 1 << 20},
        {"--top-k", top_k, 0, 1 << 24}, {"--ngram", ngram, 1, 1 << 20}, {"--repeat-times", repeat_times, 1, 1000},
        {"--parser-cutoff", parser_cutoff, 2, 1 << 20}, {"--eval-every", eval_every, 0, 1L << 40},
        {"--save-every", save_every, 0, 1L << 40}, {"--keep-last", keep_last, 0, 1 << 20}, {"--seed", seed, 0, 1L << 62},
        {"--eval-count", eval_count, 0, 1 << 30}, {"--data-phase", data_phase, 1, 16},
        {"--eval-samples-per-prompt", eval_samples, 1, 64},
        {"--samples-per-prompt", samples_per_prompt, 1, 4096}, {"--overlong-buffer", overlong_buffer, 0, max_new_tokens - 1},
        {"--max-generation-rounds", max_generation_rounds, 1, PPO_MAX_GENERATION_ROUNDS},
        {"--critic-warmup-iterations", critic_warmup_iterations, 0, 1L << 40},
    };
    for (size_t i = 0; i < sizeof ranges / sizeof ranges[0]; i++)
        if (ranges[i].value < ranges[i].lo || ranges[i].value > ranges[i].hi)
            die_user("option %s must be in [%ld, %ld], got %ld", ranges[i].name, ranges[i].lo, ranges[i].hi, ranges[i].value);
    if (temperature < 0) die_user("option --temperature must be >= 0, got %g", temperature);
    if (!(top_p > 0 && top_p <= 1)) die_user("option --top-p must be in (0, 1], got %g", top_p);
    if (!(actor_lr > 0) || !(critic_lr > 0)) die_user("options --actor-learning-rate and --critic-learning-rate must be positive");
    if (kl_coef < 0 || clip_ratio <= 0 || value_clip < 0 || reward_clip < 0 || gamma < 0 || gamma > 1 || lambda < 0 || lambda > 1)
        die_user("options --kl-ctl, --cliprange, --cliprange-value, --reward-clip must be >= 0 and --gamma, --lam in [0, 1]");
    if (clip_ratio_high < 0) clip_ratio_high = clip_ratio;
    if (!(clip_ratio_high > 0) || !isfinite(clip_ratio_high))
        die_user("option --cliprange-high must be positive, got %g", clip_ratio_high);
    if (ratio_cap != 0 && !(ratio_cap > 1 + clip_ratio_high && isfinite(ratio_cap)))
        die_user("option --delta must be above 1 + --cliprange-high (%g), or 0 (off), got %g", 1 + clip_ratio_high,
                 ratio_cap);
    if (adaptive_entropy &&
        !(entropy_coef_min >= 0 && entropy_coef_min <= entropy_coef_max && isfinite(entropy_coef_max) &&
          entropy_coef_delta > 0 && isfinite(entropy_coef_delta) && entropy_target >= 0 && isfinite(entropy_target) &&
          entropy_coef >= entropy_coef_min && entropy_coef <= entropy_coef_max))
        die_user("option --adaptive-entropy needs 0 <= --entropy-coef-min <= --entropy-coef (%g) <= --entropy-coef-max, "
                 "--entropy-coef-delta > 0 and --entropy-target >= 0", entropy_coef);
    if (!(top_entropy_quantile >= 0 && top_entropy_quantile <= 1))
        die_user("option --top-entropy-quantile must be in [0, 1], got %g", top_entropy_quantile);
    if (!(overlong_penalty >= 0) || !isfinite(overlong_penalty))
        die_user("option --overlong-penalty must be >= 0, got %g", overlong_penalty);
    if (!(missing_eos_penalty >= 0) || !isfinite(missing_eos_penalty))
        die_user("option --missing-eos-penalty must be >= 0, got %g", missing_eos_penalty);
    if (warmup_ratio < 0 || warmup_ratio > 1) die_user("option --warmup-ratio must be in [0, 1], got %g", warmup_ratio);
    if (ema_beta <= 0 || ema_beta >= 1) die_user("option --ema-beta must be in (0, 1), got %g", ema_beta);
    if (kl_horizon <= 0) die_user("option --kl-horizon must be positive, got %g", kl_horizon);
    if (!(alarm_length_ratio == 0 || (alarm_length_ratio > 1 && isfinite(alarm_length_ratio))))
        die_user("option --alarm-length-ratio must be 0 (off) or above 1, got %g", alarm_length_ratio);
    if (!(alarm_distinct_ratio >= 0 && alarm_distinct_ratio < 1))
        die_user("option --alarm-distinct-ratio must be in [0, 1), got %g", alarm_distinct_ratio);
    if (!(alarm_fraction_rise >= 0 && alarm_fraction_rise <= 1))
        die_user("option --alarm-fraction-rise must be in [0, 1], got %g", alarm_fraction_rise);
    c.hacking = (HackingLimits){alarm_length_ratio, alarm_distinct_ratio, alarm_fraction_rise};
    if (!(alarm_score_quantile >= 0 && alarm_score_quantile <= 1))
        die_user("option --alarm-score-quantile must be in [0, 1], got %g", alarm_score_quantile);
    c.alarm_score_quantile = alarm_score_quantile;
    if (stop_on_alarm && alarm_length_ratio == 0 && alarm_distinct_ratio == 0 && alarm_fraction_rise == 0 &&
        alarm_score_quantile == 0)
        die_user("option --stop-on-alarm needs an alarm: --alarm-length-ratio, --alarm-distinct-ratio, "
                 "--alarm-fraction-rise and --alarm-score-quantile are all 0 (off)");
    c.stop_on_alarm = stop_on_alarm;
    if (advantage_estimator_from_name(estimator, &c.estimator) != 0)
        die_user("option --advantage-estimator must be gae, grpo, dr-grpo, rloo, opo, gpg, remax, reinforce++ or "
                 "reinforce++-baseline, got '%s'",
                 estimator);
    // Dr. GRPO's two halves go together unless told otherwise (as OpenRLHF's dr_grpo), CISPO's
    // and VESPO's token weights are averaged over the minibatch's tokens (TRL's loss_type
    // "cispo", "vespo"), as GPG's terms are (its paper's loss; verl's token-mean), and LUSPO
    // sums each response's tokens.
    const bool token_mean_form = c.loss.policy_loss == POLICY_LOSS_CISPO || c.loss.policy_loss == POLICY_LOSS_VESPO ||
                                 c.loss.policy_loss == POLICY_LOSS_GPG;
    if (!aggregation)
        aggregation = c.estimator == ESTIMATOR_DR_GRPO ? "seq-mean-token-sum-norm"
                      : luspo                          ? "seq-mean-token-sum"
                      : token_mean_form                ? "token-mean"
                                                       : "seq-mean-token-mean";
    if (!strcmp(aggregation, "seq-mean-token-mean")) c.loss_aggregation = LOSS_SEQUENCE_MEAN_TOKEN_MEAN;
    else if (!strcmp(aggregation, "token-mean")) c.loss_aggregation = LOSS_TOKEN_MEAN;
    else if (!strcmp(aggregation, "seq-mean-token-sum-norm")) c.loss_aggregation = LOSS_SEQUENCE_MEAN_TOKEN_SUM_NORM;
    else if (!strcmp(aggregation, "seq-mean-token-sum")) c.loss_aggregation = LOSS_SEQUENCE_MEAN_TOKEN_SUM;
    else if (!strcmp(aggregation, "micro-batch-token-mean") || !strcmp(aggregation, "bnpo"))
        c.loss_aggregation = LOSS_MICRO_BATCH_TOKEN_MEAN;
    else
        die_user("option --loss-aggregation must be seq-mean-token-mean, token-mean, seq-mean-token-sum-norm, "
                 "seq-mean-token-sum or micro-batch-token-mean (bnpo), got '%s'", aggregation);
    const bool needs_group = c.estimator == ESTIMATOR_GRPO || c.estimator == ESTIMATOR_DR_GRPO || c.estimator == ESTIMATOR_RLOO ||
                             c.estimator == ESTIMATOR_OPO || c.estimator == ESTIMATOR_GPG ||
                             c.estimator == ESTIMATOR_REINFORCE_PP_BASELINE;
    if (needs_group && samples_per_prompt < 2)
        die_user("option --samples-per-prompt must be at least 2 with --advantage-estimator %s (the group is the baseline)",
                 estimator);
    if (c.estimator != ESTIMATOR_GAE && critic)
        die_user("option --critic-model: --advantage-estimator %s has no critic", estimator);
    if (c.estimator != ESTIMATOR_GAE && critic_warmup_iterations > 0)
        die_user("option --critic-warmup-iterations: --advantage-estimator %s has no critic to warm up", estimator);
    c.samples_per_prompt = (int)samples_per_prompt;
    if (!strcmp(scale_rewards, "group")) c.group_scale = GROUP_SCALE_GROUP;
    else if (!strcmp(scale_rewards, "batch")) c.group_scale = GROUP_SCALE_BATCH;
    else if (!strcmp(scale_rewards, "none")) c.group_scale = GROUP_SCALE_NONE;
    else die_user("option --scale-rewards must be group, batch or none, got '%s'", scale_rewards);
    if (c.group_scale != GROUP_SCALE_GROUP && c.estimator != ESTIMATOR_GRPO)
        die_user("option --scale-rewards applies to --advantage-estimator grpo only (got %s)", estimator);
    if (!strcmp(multi_objective, "sum_then_normalize")) c.reward_aggregation = REWARD_SUM_THEN_NORMALIZE;
    else if (!strcmp(multi_objective, "normalize_then_sum")) c.reward_aggregation = REWARD_NORMALIZE_THEN_SUM;
    else
        die_user("option --multi-objective-aggregation must be sum_then_normalize or normalize_then_sum, got '%s'",
                 multi_objective);
    if (c.reward_aggregation == REWARD_NORMALIZE_THEN_SUM && c.estimator != ESTIMATOR_GRPO)
        die_user("option --multi-objective-aggregation normalize_then_sum applies to --advantage-estimator grpo only "
                 "(got %s)", estimator);
    if (c.reward_aggregation == REWARD_NORMALIZE_THEN_SUM && options_given(&set, "scale-rewards"))
        die_user("option --scale-rewards: --multi-objective-aggregation normalize_then_sum standardises the summed "
                 "rewards over the rollout itself");
    c.recompute_old_logprobs = recompute_old;
    c.old_logprobs_from_rollout = old_from_rollout;
    c.ptx_packing = strcmp(ptx_packing, "none") == 0 ? -1 : packing_strategy_parse(ptx_packing);
    if (c.ptx_packing < 0 && strcmp(ptx_packing, "none") != 0)
        die_user("option --ptx-packing must be none, wrapped, bfd or bfd_split, got '%s'", ptx_packing);
    if (c.ptx_packing >= 0 && !ptx) die_user("option --ptx-packing %s packs --ptx-data: give it", ptx_packing);

    c.actor_path = actor, c.reference_path = reference, c.reward_path = reward_model, c.critic_path = critic;
    c.prompts_path = prompts, c.eval_prompts_path = eval_prompts, c.run_dir = output, c.ptx_path = ptx;
    c.lexicon_path = lexicon, c.data_split = data_split, c.data_format = data_format, c.data_phase = (int)data_phase;
    ColumnRenames renames; // checked here, applied as the prompts are read
    if (column_renames_parse(rename_columns, "--rename-columns", &renames) != 0) die_from_err();
    column_renames_free(&renames);
    c.rename_columns = rename_columns;
    c.chat_template = chat_template;
    c.device = device, c.schedule = kind;
    c.max_prompt_len = (int)max_prompt_len, c.max_new_tokens = (int)max_new_tokens, c.rollout_batch = (int)rollout_batch;
    c.generation_batch = (int)generation_batch, c.micro_batch = (int)micro_batch, c.minibatches = (int)minibatches;
    c.ppo_epochs = (int)ppo_epochs, c.epochs = epochs, c.max_iterations = max_iterations;
    c.min_response_tokens = (int)min_response;
    c.min_new_tokens = (int)min_new;
    c.sampler = (SamplerConfig){.temperature = (float)temperature, .top_k = (int)top_k, .top_p = (float)top_p};
    sampler_extras_apply(&extras, &c.sampler, 0);
    c.actor_lr = actor_lr, c.critic_lr = critic_lr, c.weight_decay = weight_decay, c.warmup_ratio = warmup_ratio;
    c.clip_norm = clip_norm;
    c.advantage.kl_coef = (float)kl_coef, c.advantage.reward_clip = (float)reward_clip;
    c.advantage.gamma = (float)gamma, c.advantage.lambda = (float)lambda;
    c.loss.clip_ratio = (float)clip_ratio, c.loss.clip_ratio_high = (float)clip_ratio_high;
    // TRL applies delta in its clipped losses only (grpo, dapo, dr_grpo, luspo: --policy-loss ppo).
    if (ratio_cap != 0 && c.loss.policy_loss != POLICY_LOSS_PPO)
        die_user("option --delta caps the clipped loss's ratio: --policy-loss %s has none (--delta)", policy_loss);
    c.loss.ratio_cap = (float)ratio_cap;
    c.loss.low_entropy_fraction = (float)(1.0 - top_entropy_quantile);
    c.loss.value_clip = (float)value_clip;
    c.overlong_buffer = (int)overlong_buffer, c.overlong_penalty = overlong_penalty;
    c.missing_eos_penalty = missing_eos_penalty, c.critic_warmup_iterations = critic_warmup_iterations;
    if (rollout_correction_from_name(rollout_correction, &c.loss.rollout_correction) != 0)
        die_user("option --rollout-correction must be none, token-truncate, token-mask, sequence-truncate or "
                 "sequence-mask, got '%s'", rollout_correction);
    if (!(rollout_correction_min >= 0 && rollout_correction_max > rollout_correction_min && isfinite(rollout_correction_max)))
        die_user("options --rollout-correction-min and -max must be 0 <= min < max, got %g and %g",
                 rollout_correction_min, rollout_correction_max);
    if (c.loss.rollout_correction != ROLLOUT_CORRECTION_NONE && old_from_rollout)
        die_user("option --rollout-correction weights the actor pass's old log-probs against generation's, and "
                 "--old-logprobs-from-rollout makes them generation's: give one (--rollout-correction)");
    c.loss.rollout_correction_min = (float)rollout_correction_min;
    c.loss.rollout_correction_max = (float)rollout_correction_max;
    c.loss.off_policy_mask = off_policy_mask_threshold >= 0;
    c.loss.off_policy_mask_threshold = (float)off_policy_mask_threshold;
    // GMPO takes the response as one term: the masks and weights that act on single tokens'
    // advantages would change its mean advantage instead (TRL's GMPO has none of them; its
    // --top-entropy-quantile leaves tokens out of the geometric mean, actor_micro_step).
    if (c.loss.policy_loss == POLICY_LOSS_GMPO &&
        (c.loss.rollout_correction != ROLLOUT_CORRECTION_NONE || c.loss.off_policy_mask))
        die_user("option --policy-loss gmpo weighs the response as a whole: not with --rollout-correction or "
                 "--off-policy-mask-threshold (--policy-loss)");
    if (filter_groups && !needs_group)
        die_user("option --filter-groups needs groups of responses: --advantage-estimator grpo, dr-grpo, rloo, opo, gpg or "
                 "reinforce++-baseline");
    c.filter_groups = filter_groups;
    c.mask_truncated = mask_truncated;
    if (max_generation_rounds > 1 && !filter_groups)
        die_user("option --max-generation-rounds refills what --filter-groups leaves out; add --filter-groups");
    c.max_generation_rounds = (int)max_generation_rounds;
    if (!(kl_loss_coef >= 0) || !isfinite(kl_loss_coef)) die_user("option --kl-loss-coef must be >= 0, got %g", kl_loss_coef);
    c.loss.kl_loss_coef = (float)kl_loss_coef;
    if (kl_estimator_from_name(kl_estimator, &c.advantage.kl_estimator) != 0)
        die_user("option --kl-estimator must be k1, k2, k3 or abs, got '%s'", kl_estimator);
    if (kl_loss_type && kl_estimator_from_name(kl_loss_type, &c.loss.kl_loss_estimator) != 0)
        die_user("option --kl-loss-type must be k1, k2, k3 or abs, got '%s'", kl_loss_type);
    if (kl_loss_bias_correction && !(kl_loss_coef > 0))
        die_user("option --kl-loss-bias-correction weights --kl-loss-coef's term: give --kl-loss-coef above 0");
    c.loss.kl_loss_bias_correction = kl_loss_bias_correction;
    if (kl_loss_type && !(kl_loss_coef > 0))
        die_user("option --kl-loss-type picks --kl-loss-coef's estimate: give --kl-loss-coef above 0");
    c.kl_target = kl_target, c.kl_horizon = kl_horizon, c.entropy_coef = entropy_coef, c.ptx_coef = ptx_coef;
    c.adaptive_entropy = adaptive_entropy;
    c.entropy_coef_min = entropy_coef_min, c.entropy_coef_max = entropy_coef_max;
    c.entropy_coef_delta = entropy_coef_delta, c.entropy_target = entropy_target;
    if (normalize && c.reward_aggregation == REWARD_NORMALIZE_THEN_SUM)
        die_user("option --normalize-reward: --multi-objective-aggregation normalize_then_sum normalises each reward "
                 "source within its group instead");
    if (normalize && c.estimator == ESTIMATOR_REMAX)
        die_user("option --normalize-reward: --advantage-estimator remax compares each score with a greedy answer's "
                 "score as it is (--normalize-reward)");
    c.whiten_advantages = whiten, c.normalize_reward = normalize, c.ema = ema, c.ema_beta = ema_beta;
    c.macro.ngram = (int)ngram, c.macro.repeat_times = (int)repeat_times, c.macro.parser_cutoff = (int)parser_cutoff;
    c.macro.dedupe_boundaries = !keep_duplicates, c.macro.randomized_include_one = !paper_randomized;
    c.macro.ppl_monotone = ppl_monotone, c.macro.seed = (uint64_t)seed;
    c.eval_every = eval_every, c.save_every = save_every, c.keep_last = keep_last, c.eval_prompts = (int)eval_count;
    c.eval_samples = (int)eval_samples;
    c.seed = (uint64_t)seed, c.resume = resume, c.quiet = quiet, c.gradient_checkpointing = checkpointing;
    if (zero_stage < 0 || zero_stage > 3)
        die_user("option --zero-stage must be 0, 1, 2 or 3 (ZeRO-1 shards the optimizer state, ZeRO-2 the gradients "
                 "too, ZeRO-3 the weights too), got %ld", zero_stage);
    if (zero_stage >= 2 && strcmp(device, "cpu"))
        die_user("option --zero-stage %ld runs on --device cpu only (ZeRO-1 runs on cuda too; got --device %s)",
                 zero_stage, device);
    c.zero_stage = (int)zero_stage;
    c.hybrid_engine = hybrid_engine;
    lora_cli_finish(&actor_lora, "actor-", &c.actor_lora);
    lora_cli_finish(&critic_lora, "critic-", &c.critic_lora);
    if (c.estimator != ESTIMATOR_GAE && (c.critic_lora.rank > 0 || critic_lora.adapter))
        die_user("option --critic-lora-rank: --advantage-estimator %s has no critic", estimator);
    lora_cli_check_zero_stage(&c.actor_lora, "actor-", actor_quantize, zero_stage);
    lora_cli_check_zero_stage(&c.critic_lora, "critic-", critic_quantize, zero_stage);
    reference_sync_cli_check(&sync, sync_options, true, NULL, c.actor_lora.rank > 0 || actor_lora.adapter, zero_stage);
    c.sync_ref_model = sync.enabled;
    c.ref_model_mixup_alpha = sync.mixup_alpha;
    c.ref_model_sync_steps = sync.steps;
    c.actor_lora_adapter = actor_lora.adapter, c.critic_lora_adapter = critic_lora.adapter;
    // A bitsandbytes 4-bit actor (or critic) checkpoint is a quantized base as --actor-quantize
    // makes one (model/bnb_checkpoint.h): its own quantization, checked as that option is below.
    for (int i = 0; i < 2; i++) {
        const char *path = i == 0 ? actor : critic ? critic : reward_model;
        ModelConfig cfg;
        if (!path || (i == 1 && c.estimator != ESTIMATOR_GAE) || model_read_config(&cfg, path) != 0) continue;
        const char **q = i == 0 ? &actor_quantize : &critic_quantize;
        if (bnb_resolve_quantize(&cfg, path, *q, i == 0 ? "--actor-quantize" : "--critic-quantize", q) != 0)
            die_from_err();
    }
    // QLoRA for the actor and the critic (as sft's --quantize): a quantized base is frozen, so
    // the model needs adapters; no DoRA (its norms need the float32 weights).
    const struct {
        const char *model, *quantize;
        const LoraConfig *lora;
    } qlora[2] = {{"actor", actor_quantize, &c.actor_lora}, {"critic", critic_quantize, &c.critic_lora}};
    for (int i = 0; i < 2; i++) {
        const char *m = qlora[i].model, *q = qlora[i].quantize;
        if (!quantize_requested(q)) continue;
        if (i == 1 && c.estimator != ESTIMATOR_GAE)
            die_user("option --critic-quantize: --advantage-estimator %s has no critic", estimator);
        if (qlora[i].lora->rank == 0)
            die_user("option --%s-quantize %s needs --%s-lora-rank or --%s-lora-adapter: a quantized base is frozen, it "
                     "cannot be trained in full", m, q, m, m);
    }
    c.actor_quantize = actor_quantize, c.critic_quantize = critic_quantize;
    cli_set_threads(threads);
    int rc = ppo_run(&c);
    sampler_extras_free(&extras);
    if (rc == PPO_STOPPED_BY_ALARM) return PPO_STOPPED_BY_ALARM; // its line is printed
    if (rc != 0) die_from_err();
    if (!quiet) fprintf(stderr, "ppo: final actor in %s/final/actor\n", output);
    return 0;
}
