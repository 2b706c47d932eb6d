// PPO and MA-PPO (step 3 of RLHF): the actor generates responses to prompts, the frozen
// reference and reward models and the critic score them, rewards and macro-level
// advantages are computed per sample, and the actor and critic take clipped PPO steps.
//
// One iteration (see docs/architecture.md for where each part lives):
//   rollout     gen/generate.c on the actor (temperature, top-k, top-p), per-row RNG
//   experience  full forwards over prompt+response: actor log-probs (old), reference
//               log-probs, critic values, reward-model score at the last token
//   rewards     -beta*(logp - logp_ref) per token + clip(score) on the last (rl/advantage.c)
//   macro       per-sample segmentation (rl/macro.c), macro GAE, advantages to tokens
//   train       ppo_epochs x minibatches: clipped policy loss -> actor AdamW step; clipped
//               value loss -> critic AdamW step (rl/ppo_loss.c); optional entropy bonus, PTX
// With --advantage-estimator grpo|rloo|reinforce++|reinforce++-baseline there is no
// critic: GRPO and RLOO answer each prompt --samples-per-prompt times and take a response's
// advantage from its group's rewards; REINFORCE++ whitens returns-to-go.
//   bookkeeping adaptive KL controller, actor EMA, metrics, evaluation, checkpoints
//
// Defaults are the released MA-RLHF configuration (spec §10.2): kl 0.05, gamma 1,
// lambda 0.95, clip 0.2, value clip 0.2, reward clip 2.5, T 0.8, top-k 50, top-p 1.0,
// 512 + 512 tokens, lr 1.5e-5 (actor and critic), weight decay 0.1, betas (0.9, 0.95),
// linear schedule with warmup ratio 0.05, 256 rollouts per optimizer step, one PPO epoch,
// fixed 5-gram macro actions with equal value weights, mean macro reward, per-token ratio.
// The one deliberate default that differs from the released code: duplicate macro
// boundaries are removed, so --ngram 1 is exactly token-level PPO (--keep-duplicate-boundaries
// restores the released zero-length step).
#pragma once
#include <stdbool.h>
#include <stdint.h>

#include "gen/sampler.h"
#include "model/model.h"
#include "rl/advantage.h"
#include "rl/hacking_signals.h"
#include "rl/macro.h"
#include "rl/ppo_loss.h"

typedef enum { REWARD_MODEL, REWARD_LEXICON, REWARD_CODE, REWARD_COMMAND, REWARD_REMOTE, REWARD_KINDS } RewardKind;
// "model" | "lexicon" | "code" | "command" | "remote"; -1 otherwise.
int reward_kind_from_name(const char *name, RewardKind *out);
const char *reward_kind_name(RewardKind kind);
// How the policy loss's token terms are averaged over a minibatch of S responses:
//   seq-mean-token-mean      each response's token mean, then the mean over responses (released)
//   token-mean               the mean over all the minibatch's tokens (DAPO)
//   seq-mean-token-sum-norm  each response's token sum over max_new_tokens, then the mean over
//                            responses: no length bias (Dr. GRPO; verl's name)
//   seq-mean-token-sum       each response's token sum, then the mean over responses (verl's
//                            name; with the ratio per response, TRL's loss_type "luspo")
//   micro-batch-token-mean   each micro-batch's token mean, then the mean over the optimizer
//                            step's micro-batches on every rank (TRL's loss_type "bnpo")
typedef enum {
    LOSS_SEQUENCE_MEAN_TOKEN_MEAN,
    LOSS_TOKEN_MEAN,
    LOSS_SEQUENCE_MEAN_TOKEN_SUM_NORM,
    LOSS_SEQUENCE_MEAN_TOKEN_SUM,
    LOSS_MICRO_BATCH_TOKEN_MEAN
} LossAggregation;


typedef struct {
    // models and data
    const char *actor_path;     // the SFT model
    const char *reference_path; // default: actor_path (with actor LoRA: the actor's own base)
    LoraConfig actor_lora, critic_lora; // rank 0: train every weight
    const char *actor_lora_adapter, *critic_lora_adapter; // start from these saved adapters (or NULL)
    const char *reward_path;    // the reward model (REWARD_MODEL)
    const char *critic_path;    // default: reward_path
    // "q8_0" (or another --quantize name): the frozen reference / reward model's weights
    // quantized (model/quantize.h; NULL or "none": float32). Not the reference when it is the actor's own base.
    // A reference built from the actor's start (no reference_path) with reference_quantize
    // NULL takes actor_quantize.
    const char *reference_quantize, *reward_quantize;
    // QLoRA: the actor's / critic's frozen base under its LoRA adapters quantized (NULL or
    // "none": float32). Needs that model's adapters (actor_lora / critic_lora rank > 0). The
    // actor generates the rollouts, computes the old log-probs and trains on the same
    // quantized base; with fresh actor adapters the reference is that quantized base with the
    // adapters switched off; the EMA shares the actor's quantization; the value head stays float32.
    const char *actor_quantize, *critic_quantize;
    const char *prompts_path, *eval_prompts_path, *data_format, *data_split;
    const char *rename_columns; // the prompt files' fields renamed, "old=new,..." (data/column_renames.h); NULL: none
    const char *chat_template;  // conversational prompts: this template (name or file) instead of the actor's
    int data_phase;
    const char *ptx_path;       // SFT data mixed into the actor loss (PPO-ptx)
    // -1: one PTX row a row; else a PackingStrategy (train/packing.h) packing the PTX rows into
    // rows of max_prompt_len + max_new_tokens tokens (wrapped: DeepSpeed-Chat's group_texts).
    int ptx_packing;
    const char *lexicon_path;   // gold score (and REWARD_LEXICON)
    const char *run_dir;
    const char *device;
    // The reward's sources in --reward's order, each scoring every response, and their weights:
    // the score is the weighted sum (TRL's reward_funcs with reward_weights, summed before the
    // group's normalisation). Each kind at most once; one source of weight 1 by default.
    RewardKind rewards[REWARD_KINDS];
    double reward_weights[REWARD_KINDS];
    int reward_count;
    const char *reward_command;     // REWARD_COMMAND: the user's program (rl/command_reward.h)
    double reward_timeout_seconds;  // its time limit for one answer (REWARD_REMOTE: one request)
    const char *reward_url;         // REWARD_REMOTE: the server's /get_reward (rl/remote_reward.h)
    const char *reward_label_key;   // REWARD_REMOTE: the prompt row's field sent as the label
    int reward_retries;             // REWARD_REMOTE: further attempts after a timeout, 429 or 5xx
    // sizes
    int max_prompt_len, max_new_tokens;
    int rollout_batch;   // prompts per iteration
    int generation_batch;// rows generated together
    int micro_batch;     // rows per training forward/backward
    int minibatches;     // optimizer steps per PPO epoch
    int ppo_epochs;
    long epochs;         // passes over the prompts
    long max_iterations; // > 0: stop after this many
    int min_response_tokens; // shorter responses are dropped (released: 2)
    int min_new_tokens;      // no stop token before this many new tokens (0: off, released)
    SamplerConfig sampler;
    // optimisation
    double actor_lr, critic_lr, weight_decay, beta1, beta2, eps, clip_norm, warmup_ratio;
    int schedule; // LrScheduleKind
    LossAggregation loss_aggregation;
    // objective
    // GAE needs the critic; the others (rl/advantage.h) run with no critic loaded, trained
    // or saved. GRPO and RLOO compare the samples_per_prompt responses to each prompt; their
    // sequence reward is clip(score) - kl_coef * sum_t (logp - logp_ref) (TRL's RLOO; with
    // --kl-coef 0 it is TRL's GRPO default, beta 0). REINFORCE++ whitens the returns-to-go
    // of the token rewards (KL per token, score on the last; -baseline: the score less its
    // group's mean).
    AdvantageEstimator estimator;
    int samples_per_prompt; // responses generated per prompt (GRPO/RLOO: at least 2)
    GroupScale group_scale; // GRPO only
    // GRPO only: NORMALIZE_THEN_SUM (GDPO) makes s->score the sum of the reward sources' in-group
    // normalised scores (then the penalties), and the advantage that sum standardised over the
    // rollout, group_scale unused.
    RewardAggregation reward_aggregation;
    AdvantageConfig advantage;
    PpoLossConfig loss;
    MacroConfig macro;
    bool token_level; // vanilla PPO through its own code path (--termination-condition token)
    bool whiten_advantages, normalize_reward;
    // DAPO's dynamic sampling (grpo, dr-grpo, rloo, reinforce++-baseline): groups whose
    // responses all got the same score are left out of training, and up to
    // max_generation_rounds - 1 further rounds of rollout_batch prompts refill the batch to
    // rollout_batch groups (verl's max_num_gen_batches; 1: no refill).
    bool filter_groups;
    // Responses that hit max_new_tokens without a stop token are left out of the losses
    // (TRL's mask_truncated_completions; DAPO's overlong filtering): their tokens weigh 0 (the
    // actor's terms and the critic's value loss), a token mean counts only the others', a
    // sequence mean still counts them (TRL's normalisations alike). Their rewards still count
    // in the advantages.
    bool mask_truncated;
    int max_generation_rounds;
    int overlong_buffer;      // DAPO's soft overlong punishment (rl/advantage.h overlong_penalty); 0: off
    double overlong_penalty;  // its factor
    // Subtracted from the score of each response that hit max_new_tokens without a stop token
    // (TRL's missing_eos_penalty), after the reward normalisation, as the overlong punishment; 0: off.
    double missing_eos_penalty;
    // The first critic_warmup_iterations iterations train the critic only: the actor takes no
    // step (nor its EMA, PTX, entropy control or reference sync) and its learning-rate schedule
    // starts when it does (OpenRLHF's freezing_actor_steps, verl's critic_warmup). GAE only.
    long critic_warmup_iterations;
    double kl_target, kl_horizon; // adaptive KL controller when kl_target > 0
    double entropy_coef, ptx_coef;
    // Adaptive entropy control (Skywork-OR1; TRL's use_adaptive_entropy): entropy_coef is the
    // starting coefficient; after each optimizer step it moves by entropy_coef_delta within
    // [entropy_coef_min, entropy_coef_max], up when the step's mean entropy over the trained
    // policy tokens (all ranks) is at most entropy_target, down otherwise, and a step applies the
    // bonus only when the previous step's entropy was at most the target.
    bool adaptive_entropy;
    double entropy_coef_min, entropy_coef_max, entropy_coef_delta, entropy_target;
    bool ema;
    double ema_beta;
    // --sync-ref-model (train/reference_sync.h): every ref_model_sync_steps optimizer steps the
    // reference becomes ref_model_mixup_alpha x actor + (1 - it) x itself (TRL's GRPOConfig
    // sync_ref_model); it rides in checkpoints. A float reference of the actor's shape only.
    bool sync_ref_model;
    double ref_model_mixup_alpha;
    long ref_model_sync_steps;
    bool gradient_checkpointing;
    // The old log-probs are those of the training forward, not of an experience pass over the
    // rollout, when they are needed for the ratio alone and the ratio is 1 by construction: one
    // optimizer step per rollout (one PPO epoch, one minibatch) and no KL in the reward (kl_coef
    // 0, no adaptive controller). TRL's GRPOTrainer does the same. This forces the pass.
    bool recompute_old_logprobs;
    // The old log-probs are the ones generation computed for the sampled tokens (the model's,
    // temperature 1), as TRL's PPOTrainer takes them, instead of an experience pass of the
    // actor over the rollout (DeepSpeed-Chat's and the released code's, the default): one
    // forward fewer per iteration, the first ratio 1 to within the decode path's float
    // rounding rather than the training forward's. The entropy then comes from each sample's
    // training forward in the first PPO epoch. Not with a quantized actor base (its decode
    // kernels round otherwise than its training ones), nor with recompute_old_logprobs; where
    // the training forward gives the old log-probs (above) that takes precedence.
    bool old_logprobs_from_rollout;
    // Under mpirun: 1 shards the actor's and critic's AdamW moments, 2 their gradients too, 3
    // their layers' weights too (dist/zero.h).
    int zero_stage;
    // ZeRO-3 only: the actor's layers are gathered whole on every rank for each generation
    // round and evaluation, and resharded after (dist_weights_gather_all; DeepSpeed-Chat's
    // --enable_hybrid_engine). Faster generation for the whole actor's memory meanwhile;
    // the same bits either way. Without stage 3 the actor is whole already.
    bool hybrid_engine;
    // The reward-hacking alarms' limits (rl/hacking_signals.h): each iteration's responses
    // against the first iteration's; a warning line, no change to training, unless
    // stop_on_alarm: then an iteration whose responses set off an alarm is not trained on and
    // the run stops there (ppo_run returns PPO_STOPPED_BY_ALARM).
    HackingLimits hacking;
    // The reward-range alarm (0: off): the iteration's mean raw score above this quantile of
    // the reward model's scores of the preferred answers of its own data (train/rm.h's
    // REWARD_STATS_FILE in the --reward-model folder; no file, no alarm).
    double alarm_score_quantile;
    bool stop_on_alarm;
    // bookkeeping
    long eval_every, save_every, keep_last, log_samples;
    int eval_prompts; // how many eval prompts to generate for (0: all)
    // Answers per eval prompt (TRL's num_generations_eval, verl's val_kwargs.n), each on its own
    // fixed random stream; above 1 the mean over prompts of each one's best score is logged too.
    int eval_samples;
    uint64_t seed;
    bool resume, quiet;
} PpoConfig;

#define PPO_MAX_GENERATION_ROUNDS 1024

PpoConfig ppo_default_config(void);
// Whether `kind` is one of the config's reward sources.
bool ppo_uses_reward(const PpoConfig *config, RewardKind kind);
// What ppo_run returns when --stop-on-alarm stopped the run: it is not an error (nothing is
// wrong with the input; what was saved is intact) but the run did not finish, so `marlhf
// ppo` exits with this status and a pipeline stops at the stage.
#define PPO_STOPPED_BY_ALARM 3

// Runs PPO; the final actor (and critic, and actor_ema) go to RUN_DIR/final/. Returns 0,
// PPO_STOPPED_BY_ALARM (no final/), or -1 with err_set().
int ppo_run(const PpoConfig *config);
