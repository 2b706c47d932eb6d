#include "rl/ppo.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/check.h"
#include "core/progress.h"
#include "core/rng.h"
#include "core/timer.h"
#include "data/chat_data.h"
#include "data/column_renames.h"
#include "data/dataset.h"
#include "data/split.h"
#include "dist/dist.h"
#include "dist/model_sync.h"
#include "dist/zero.h"
#include "eval/lexicon.h"
#include "io/fs.h"
#include "io/jsonl.h"
#include "model/lora.h"
#include "model/quantize.h"
#include "model/weights_io.h"
#include "rl/code_reward.h"
#include "rl/command_reward.h"
#include "rl/remote_reward.h"
#include "rl/experience.h"
#include "rl/hacking_signals.h"
#include "tokenizer/tokenizer.h"
#include "train/adamw.h"
#include "train/checkpoint.h"
#include "train/reference_sync.h"
#include "train/loop.h"
#include "train/lr_schedule.h"
#include "train/metrics.h"
#include "train/rm.h"
#include "train/sft.h"

PpoConfig ppo_default_config(void) {
    return (PpoConfig){
        .data_format = "auto",
        .data_phase = 3,
        .device = "cpu",
        .rewards = {REWARD_MODEL},
        .reward_weights = {1.0},
        .reward_count = 1,
        .reward_timeout_seconds = 60,
        .reward_label_key = "label",
        .reward_retries = 3,
        .max_prompt_len = 512,
        .max_new_tokens = 512,
        .estimator = ESTIMATOR_GAE,
        .samples_per_prompt = 1,
        .rollout_batch = 256,
        .generation_batch = 8,
        .micro_batch = 4,
        .minibatches = 1,
        .ppo_epochs = 1,
        .epochs = 1,
        .min_response_tokens = 2,
        .max_generation_rounds = 1,
        .sampler = {.temperature = 0.8f, .top_k = 50, .top_p = 1.0f},
        .actor_lr = 1.5e-5,
        .critic_lr = 1.5e-5,
        .weight_decay = 0.1,
        .beta1 = 0.9,
        .beta2 = 0.95,
        .eps = 1e-8,
        .clip_norm = 1.0,
        .warmup_ratio = 0.05,
        .schedule = LR_LINEAR,
        .loss_aggregation = LOSS_SEQUENCE_MEAN_TOKEN_MEAN,
        .advantage = {.kl_coef = 0.05f, .reward_clip = 2.5f, .gamma = 1.0f, .lambda = 0.95f,
                      .value_function = VALUE_EQUAL, .macro_reward = MACRO_REWARD_MEAN},
        .loss = {.clip_ratio = 0.2f, .clip_ratio_high = 0.2f, .value_clip = 0.2f, .ratio = RATIO_PER_TOKEN,
                 .policy_loss = POLICY_LOSS_PPO, .cispo_max_weight = 5.0f, .sapo_temperature_pos = 1.0f,
                 .sapo_temperature_neg = 1.05f, .vespo_k_pos = 2.0f, .vespo_lambda_pos = 3.0f,
                 .vespo_k_neg = 3.0f, .vespo_lambda_neg = 2.0f, .kl_loss_estimator = KL_K3, .kl_cov_ratio = 0.0002f,
                 .kl_cov_coef = 1.0f, .clip_cov_ratio = 0.0002f, .clip_cov_lower = 1.0f, .clip_cov_upper = 5.0f},
        .macro = {.condition = TERMINATION_FIXED, .ngram = 5, .repeat_times = 1, .randomized_include_one = true,
                  .parser_cutoff = 5, .dedupe_boundaries = true, .ppl_monotone = false, .seed = 1234},
        .kl_horizon = 10000,
        .ptx_coef = 27.8,
        .ptx_packing = -1,
        .ema_beta = 0.992,
        .hacking = {.length_ratio = 2.0, .distinct_ratio = 0.5, .fraction_rise = 0.25},
        .alarm_score_quantile = 0.99,
        .keep_last = 2,
        .log_samples = 4,
        .eval_samples = 1,
        .seed = 1234,
    };
}

static const char *const reward_kind_names[REWARD_KINDS] = {"model", "lexicon", "code", "command", "remote"};

int reward_kind_from_name(const char *name, RewardKind *out) {
    for (int k = 0; k < REWARD_KINDS; k++)
        if (!strcmp(name, reward_kind_names[k])) {
            *out = (RewardKind)k;
            return 0;
        }
    return -1;
}

const char *reward_kind_name(RewardKind kind) { return reward_kind_names[kind]; }

bool ppo_uses_reward(const PpoConfig *config, RewardKind kind) {
    for (int k = 0; k < config->reward_count; k++)
        if (config->rewards[k] == kind) return true;
    return false;
}

// Prompts tokenized once (with the tokenizer's special tokens), longer ones dropped.
typedef struct {
    int **ids;
    int *lengths;
    char **texts;
    char **input_output; // APPS tests (code reward), else NULL entries
    char **raw;          // the rows as read (reward command), else NULL entries
    long count, dropped;
    bool conversational; // rendered from lists of messages with the chat template (data/chat_data.h)
} PromptSet;

// Conversational prompts are rendered with --chat-template or the actor's template (the
// tokenizer then adds no BOS of its own: the template wrote it).
// actor_context: the actor's max_position_embeddings.
static int load_prompts(const PpoConfig *c, const char *path, bool apply_split, Tokenizer *tok, int actor_context,
                        PromptSet *out) {
    memset(out, 0, sizeof *out);
    Dataset data;
    DataFormat format = DATA_FORMAT_AUTO;
    if (c->data_format && strcmp(c->data_format, "auto") && data_format_parse(c->data_format, "--data-format", &format) != 0)
        return -1;
    // The command is given each prompt's row, a reward server its label.
    const bool keep_raw = ppo_uses_reward(c, REWARD_COMMAND) || ppo_uses_reward(c, REWARD_REMOTE);
    ColumnRenames renames;
    if (column_renames_parse(c->rename_columns, "--rename-columns", &renames) != 0) return -1;
    const int loaded = dataset_load_with(&data, path,
                                         &(DatasetLoadOptions){.format = format, .keep_raw = keep_raw, .renames = &renames});
    column_renames_free(&renames);
    if (loaded != 0) return -1;
    if (dataset_require_prompts(&data, apply_split ? "--prompts" : "--eval-prompts") != 0) {
        dataset_free(&data);
        return -1;
    }
    if (apply_split && c->data_split && *c->data_split) {
        long *indices, count;
        if (data_split_indices(data.count, c->data_split, c->data_phase, c->seed, &indices, &count) != 0) {
            dataset_free(&data);
            return -1;
        }
        Dataset part;
        dataset_take(&data, indices, count, &part);
        free(indices);
        dataset_free(&data);
        data = part;
    }
    if (dataset_render_chat(&data, tok, c->actor_path, c->chat_template) != 0) {
        dataset_free(&data);
        return -1;
    }
    out->conversational = data.conversational;
    // A prompt must also leave the actor room for an answer: generation stops a row at the
    // model's context (gen/generate.h), so a longer one is dropped as a too long one is.
    const int longest = c->max_prompt_len < actor_context - 1 ? c->max_prompt_len : actor_context - 1;
    out->ids = xcalloc(data.count + 1, sizeof(int *));
    out->lengths = xcalloc(data.count + 1, sizeof(int));
    out->texts = xcalloc(data.count + 1, sizeof(char *));
    out->input_output = xcalloc(data.count + 1, sizeof(char *));
    out->raw = xcalloc(data.count + 1, sizeof(char *));
    for (long i = 0; i < data.count; i++) {
        const DataRecord *r = &data.records[i];
        int *ids, n;
        tokenizer_encode(tok, r->prompt, strlen(r->prompt), true, &ids, &n);
        if (n == 0 || n > longest) { // dropped, not truncated (spec §3.3)
            free(ids);
            out->dropped++;
            continue;
        }
        out->ids[out->count] = ids;
        out->lengths[out->count] = n;
        out->texts[out->count] = xstrdup(r->prompt);
        out->input_output[out->count] = r->input_output && *r->input_output ? xstrdup(r->input_output) : NULL;
        out->raw[out->count] = r->raw ? xstrdup(r->raw) : NULL;
        out->count++;
    }
    dataset_free(&data);
    if (out->count == 0)
        return err_set("no prompt of %s fits --max-prompt-len %d%s", path, longest,
                       longest < c->max_prompt_len ? " (the actor's context, less one token for an answer)" : "");
    return 0;
}

static void free_prompts(PromptSet *p) {
    for (long i = 0; i < p->count; i++) free(p->ids[i]), free(p->texts[i]), free(p->input_output[i]), free(p->raw[i]);
    free(p->ids), free(p->lengths), free(p->texts), free(p->input_output), free(p->raw);
    memset(p, 0, sizeof *p);
}

typedef struct {
    PpoConfig c;
    Tokenizer *tokenizer;
    Model actor, reference, critic, reward, ema;
    bool has_reward_model;
    bool has_critic; // GAE; GRPO and RLOO run without one
    // With actor LoRA and no --reference-model, the reference is the actor with its
    // adapters switched off: the frozen base is the policy PPO started from.
    bool reference_is_actor_base;
    // --sync-ref-model: the reference follows the actor (model NULL: it stays as it started).
    ReferenceSync reference_sync;
    AdamW actor_optimizer, critic_optimizer;
    LrSchedule actor_schedule, critic_schedule;
    PromptSet prompts, eval_prompts;
    TokenizedExamples ptx;
    long ptx_cursor;
    Lexicon *lexicon;
    CommandReward *reward_command; // --reward command: the user's program, running
    RemoteReward *reward_remote;   // --reward remote: the reward server's client
    int stop_tokens[8], num_stop_tokens;
    MetricsWriter metrics;
    // state carried across iterations (saved in checkpoints)
    long iteration, epoch, cursor, optimizer_steps;
    // The actor's own optimizer steps: fewer than optimizer_steps (the critic's) by the steps of
    // the --critic-warmup-iterations, which its learning-rate schedule does not count.
    long actor_steps;
    double kl_coef;
    double reward_count, reward_mean, reward_m2; // running statistics for --normalize-reward
    // --adaptive-entropy: the coefficient now, and the last optimizer step's mean entropy over
    // the trained tokens (INFINITY before the first, so the first step has no bonus, as TRL's)
    double entropy_coef, last_trained_entropy;
    // This iteration's old log-probs (and entropies) are the training forward's, not an
    // experience pass's (PpoConfig.recompute_old_logprobs says when); or its old log-probs are
    // generation's and its entropies the first epoch's training forward's
    // (PpoConfig.old_logprobs_from_rollout).
    bool old_logprobs_from_training, old_logprobs_from_rollout;
    // This iteration is one of the --critic-warmup-iterations: the critic alone is trained.
    bool actor_frozen;
    // The first iteration's reward-hacking signals, the alarms' baseline, and the alarms on
    // after the last iteration: a warning is printed when one starts or ends, the same
    // across a resume (both saved in checkpoints).
    HackingSignals hacking_first;
    bool has_hacking_first;
    unsigned hacking_active;
    // The starting policy's held-out scores and gold scores, per eval prompt (the evaluation
    // at iteration 0; read back from its samples file on resume): each later evaluation's
    // win rates are against them. NULL when unknown.
    float *first_eval_scores, *first_eval_golds;
    long first_eval_count;
    // The reward-range alarm's limit: the --alarm-score-quantile of the reward model's scores
    // of the preferred answers of its data (reward_stats_path); NAN when off or unknown.
    double reward_range_limit;
    char *reward_stats_path;
} Ppo;

// ---------------------------------------------------------------------------------------
// Rewards other than a reward model

static float response_gold(Ppo *p, const Sample *s) {
    if (!p->lexicon) return NAN;
    char *text = tokenizer_decode(p->tokenizer, s->response, s->response_length, true);
    float gold = (float)lexicon_score(p->lexicon, text);
    free(text);
    return gold;
}

static float code_score(Ppo *p, const PromptSet *set, const Sample *s) {
    const char *tests = set->input_output[s->prompt_index];
    if (!tests) return -1.0f;
    char *text = tokenizer_decode(p->tokenizer, s->response, s->response_length, true);
    char *program = code_from_response(text);
    CodeRewardLimits limits = code_reward_default_limits();
    CodeRewardResult result;
    float reward = code_reward(program, tests, &limits, &result) == 0 ? (float)result.reward : -1.0f;
    free(program), free(text);
    return reward;
}

// The rewards of `count` responses of `set` from the reward server: each prompt's text,
// the response decoded without its end token, and the prompt row's label. Returns 0, or
// -1 with err_set() naming the server.
static int remote_scores(Ppo *p, const PromptSet *set, Sample *const *samples, int count, float *scores) {
    const char **prompts = xmalloc((count + 1) * sizeof(char *));
    char **responses = xmalloc((count + 1) * sizeof(char *)), **labels = xmalloc((count + 1) * sizeof(char *));
    for (int i = 0; i < count; i++) {
        const Sample *s = samples[i];
        int visible = s->response_length - (s->stop == STOP_TOKEN ? 1 : 0);
        prompts[i] = set->texts[s->prompt_index];
        responses[i] = tokenizer_decode(p->tokenizer, s->response, visible, true);
        labels[i] = remote_reward_label(set->raw[s->prompt_index], p->c.reward_label_key);
    }
    double *values = xmalloc((count + 1) * sizeof(double));
    int rc = remote_reward_score(p->reward_remote, count, prompts, (const char *const *)responses,
                                 (const char *const *)labels, values);
    for (int i = 0; i < count; i++) {
        if (rc == 0) scores[i] = (float)values[i];
        free(responses[i]), free(labels[i]);
    }
    free(prompts), free(responses), free(labels), free(values);
    return rc;
}

// The reward of one response of `set` by a rule instead of a model: the lexicon (its gold,
// set before), code execution, or the user's command. Returns 0, or -1 with err_set() (the
// command failed).
static int rule_score(Ppo *p, RewardKind kind, const PromptSet *set, const Sample *s, float *out) {
    if (kind == REWARD_LEXICON) {
        *out = s->gold;
    } else if (kind == REWARD_CODE) {
        *out = code_score(p, set, s);
    } else {
        int visible = s->response_length - (s->stop == STOP_TOKEN ? 1 : 0);
        char *text = tokenizer_decode(p->tokenizer, s->response, visible, true);
        double value;
        int rc = command_reward_score(p->reward_command, set->texts[s->prompt_index], text, set->raw[s->prompt_index],
                                      &value);
        free(text);
        if (rc != 0) return -1;
        *out = (float)value;
    }
    return 0;
}

// The score of each of `count` responses of `set` (their gold set first): the weighted sum of
// the reward sources' scores (PpoConfig.rewards), a reward model's and a server's a batch at a
// time, the others one response at a time; with `parts`, source k's own scores in parts[k].
// Returns 0, or -1 with err_set() (a reward command or server failed).
static int score_samples(Ppo *p, const PromptSet *set, Sample *const *samples, int count, float *scores,
                         float **parts) {
    float *part = xmalloc(((size_t)count + 1) * sizeof(float));
    for (int i = 0; i < count; i++) scores[i] = 0.0f;
    int rc = 0;
    for (int k = 0; k < p->c.reward_count && rc == 0; k++) {
        const RewardKind kind = p->c.rewards[k];
        if (kind == REWARD_MODEL) experience_scores(&p->reward, samples, count, p->c.micro_batch, part);
        else if (kind == REWARD_REMOTE) rc = count > 0 ? remote_scores(p, set, samples, count, part) : 0;
        else
            for (int i = 0; i < count && rc == 0; i++) rc = rule_score(p, kind, set, samples[i], &part[i]);
        for (int i = 0; i < count && rc == 0; i++) {
            scores[i] += (float)(p->c.reward_weights[k] * part[i]);
            if (parts) parts[k][i] = part[i];
        }
    }
    free(part);
    return rc;
}

// ---------------------------------------------------------------------------------------
// Rollout and experience

// Generates responses for the prompts order[0..count) of `set`. Row k samples with the
// random numbers of row id row_id_base + row_id_offset + k * row_id_stride: under mpirun a
// rank generates every W-th row of the iteration with the ids one process would use.
// sampler: NULL for the run's (PpoConfig.sampler).
static void rollout(Ppo *p, const PromptSet *set, const long *order, long count, uint64_t row_id_base,
                    uint64_t row_id_offset, uint64_t row_id_stride, Sample *out, GenerateStats *total_stats,
                    const SamplerConfig *sampler) {
    GenerateOptions options = {
        .sampler = sampler ? *sampler : p->c.sampler,
        .max_new_tokens = p->c.max_new_tokens,
        .seed = p->c.seed,
        .stop_tokens = p->stop_tokens,
        .num_stop_tokens = p->num_stop_tokens,
        .pad_token = tokenizer_pad_id(p->tokenizer) >= 0 ? tokenizer_pad_id(p->tokenizer) : 0,
        .min_new_tokens = p->c.min_new_tokens,
    };
    for (long first = 0; first < count; first += p->c.generation_batch) {
        int B = count - first < p->c.generation_batch ? (int)(count - first) : p->c.generation_batch;
        const int **prompts = xmalloc(B * sizeof(int *));
        int *lengths = xmalloc(B * sizeof(int));
        uint64_t *row_ids = xmalloc(B * sizeof(uint64_t));
        for (int b = 0; b < B; b++) {
            long index = order[first + b];
            prompts[b] = set->ids[index];
            lengths[b] = set->lengths[index];
            row_ids[b] = row_id_base + row_id_offset + (uint64_t)(first + b) * row_id_stride;
        }
        GeneratedRow *rows = xmalloc(B * sizeof(GeneratedRow));
        GenerateStats stats;
        generate(&p->actor, prompts, lengths, row_ids, B, &options, rows, &stats);
        total_stats->prefill_seconds += stats.prefill_seconds;
        total_stats->decode_seconds += stats.decode_seconds;
        total_stats->generated_tokens += stats.generated_tokens;
        for (int b = 0; b < B; b++) {
            Sample *s = &out[first + b];
            memset(s, 0, sizeof *s);
            s->prompt_index = order[first + b];
            s->prompt = prompts[b];
            s->prompt_length = lengths[b];
            s->response = rows[b].tokens;
            s->response_length = rows[b].length;
            s->stop = rows[b].stop;
            s->row_id = row_ids[b];
            rows[b].tokens = NULL;
            if (p->c.old_logprobs_from_rollout || p->c.loss.rollout_correction != ROLLOUT_CORRECTION_NONE)
                s->rollout_logp = rows[b].logprobs, rows[b].logprobs = NULL;
            generated_row_free(&rows[b]);
        }
        free(prompts), free(lengths), free(row_ids), free(rows);
    }
}

static void allocate_sample_arrays(Sample *s) {
    int R = s->response_length;
    s->logp_old = xmalloc(R * sizeof(float));
    s->logp_ref = xmalloc(R * sizeof(float));
    s->values_old = xmalloc(R * sizeof(float));
    s->entropy = xmalloc(R * sizeof(float));
    s->rewards = xmalloc(R * sizeof(float));
    s->advantages = xmalloc(R * sizeof(float));
    s->returns = xmalloc(R * sizeof(float));
}

// Splits a sample's response into macro actions (rl/macro.h).
static void segment_sample(Ppo *p, Sample *s) {
    const int R = s->response_length;
    float *perplexity = NULL;
    char **pieces = NULL;
    if (p->c.macro.condition == TERMINATION_PPL) { // per-token perplexity under the reference
        perplexity = xmalloc(R * sizeof(float));
        for (int j = 0; j < R; j++) perplexity[j] = expf(-s->logp_ref[j]);
    }
    if (p->c.macro.condition == TERMINATION_PARSING) {
        // Streamed pieces concatenate to the response text exactly (a character split
        // across tokens belongs to the token that completes it).
        pieces = xmalloc(R * sizeof(char *));
        TokenizerStream *stream = tokenizer_stream_new(p->tokenizer, true);
        for (int j = 0; j < R; j++) tokenizer_stream_push(stream, s->response[j], &pieces[j]);
        tokenizer_stream_free(stream);
    }
    MacroSegmentation segmentation;
    uint64_t stream = rng_stream("macro", (uint64_t)s->prompt_index, 0);
    if (macro_segment(&p->c.macro, R, perplexity, (const char *const *)pieces, stream, (uint64_t)p->iteration,
                      &segmentation) != 0) {
        // A segmentation failure must not stop training: that sample falls back to tokens.
        segmentation.lengths = xmalloc(R * sizeof(int));
        for (int j = 0; j < R; j++) segmentation.lengths[j] = 1;
        segmentation.count = R;
        segmentation.fallbacks = 1;
    }
    if (pieces) {
        for (int j = 0; j < R; j++) free(pieces[j]);
        free(pieces);
    }
    free(perplexity);
    s->segments = segmentation.lengths;
    s->segment_count = segmentation.count;
    s->parse_fallbacks = segmentation.fallbacks;
}

// An iteration's statistics. The scoring ones (score_rollout) cover every sample scored in
// any generation round; the experience ones (compute_experience) the samples trained on.
typedef struct {
    double scored, score, raw_score, gold, gold_count, length, stopped;      // scoring
    double experienced, kl_tokens, macro_actions, fallbacks, advantage, value; // experience
    // The samples and tokens that kl_sequence and entropy sum over: the experienced ones, or,
    // when the old log-probs come from the training forward, the trained ones.
    double kl_sequence, entropy, policy_samples, policy_tokens;
    double reward_parts[REWARD_KINDS]; // scoring: each reward source's scores (PpoConfig.rewards' order)
    double baseline; // experience, ReMax: the samples' greedy baselines
} RolloutStats; // doubles only: summed across ranks as an array
_Static_assert(sizeof(RolloutStats) == (18 + REWARD_KINDS) * sizeof(double),
               "RolloutStats is summed as an array of doubles");

// to += from, field by field.
static void rollout_stats_add(RolloutStats *to, const RolloutStats *from) {
    double *t = (double *)to;
    const double *f = (const double *)from;
    for (size_t i = 0; i < sizeof *to / sizeof(double); i++) t[i] += f[i];
}

// An iteration's kept samples as every rank sees them. Under mpirun each rank holds the
// Samples of the rows it generated and only the response lengths of the others (what the
// minibatches' loss weights need); one process holds them all.
typedef struct {
    int count;       // kept samples, in rollout order
    int *lengths;    // [count] response lengths
    int *groups;     // [count] the prompt (within the iteration) each sample answers
    unsigned char *truncated; // [count] 1: the response hit max_new_tokens without a stop token
    Sample **local;  // [count] this rank's Sample, NULL where another rank holds it
} Rollout;

// An empty rollout with room for `capacity` samples; rollout_append adds sample q of
// another; rollout_free releases the arrays (not the Samples, which the rounds own).
static Rollout rollout_new(long capacity) {
    return (Rollout){.lengths = xmalloc((capacity + 1) * sizeof(int)), .groups = xmalloc((capacity + 1) * sizeof(int)),
                     .truncated = xmalloc((size_t)capacity + 1), .local = xmalloc((capacity + 1) * sizeof(Sample *))};
}

static void rollout_append(Rollout *to, const Rollout *from, int q) {
    to->lengths[to->count] = from->lengths[q], to->groups[to->count] = from->groups[q];
    to->truncated[to->count] = from->truncated[q];
    to->local[to->count++] = from->local[q];
}

static void rollout_free(Rollout *r) { free(r->lengths), free(r->groups), free(r->truncated), free(r->local); }

// This rank's samples among positions[0..count) of the rollout, in that order.
static int local_samples(const Rollout *r, const int *positions, int count, Sample **out) {
    int n = 0;
    for (int i = 0; i < count; i++)
        if (r->local[positions[i]]) out[n++] = r->local[positions[i]];
    return n;
}

// All of this rank's samples of the rollout, in rollout order (*out: an array to free).
static int all_local_samples(const Rollout *r, Sample ***out) {
    *out = xmalloc((r->count + 1) * sizeof(Sample *));
    int n = 0;
    for (int q = 0; q < r->count; q++)
        if (r->local[q]) (*out)[n++] = r->local[q];
    return n;
}

// GRPO / RLOO: each kept sample's advantage from the sequence rewards of its group,
// clip(score) - kl_coef * sum_t kl(logp - logp_ref) (--kl-estimator; k1: the log-ratio), gathered from every rank (each holds
// some of a group's samples); under GDPO (the scores already normalised within their groups)
// those rewards standardised over the rollout. Indexed by rollout position.
static double *group_estimates(Ppo *p, const Rollout *r, const AdvantageConfig *advantage) {
    double *rewards = xcalloc(r->count + 1, sizeof(double));
    for (int q = 0; q < r->count; q++) {
        const Sample *s = r->local[q];
        if (!s) continue;
        double kl = 0;
        for (int j = 0; j < s->response_length; j++)
            kl += kl_estimate(advantage->kl_estimator, (double)s->logp_old[j] - s->logp_ref[j]);
        rewards[q] = clipped_score(advantage, s->score) - advantage->kl_coef * kl;
    }
    dist_sum_doubles(rewards, r->count);
    double *out = xcalloc(r->count + 1, sizeof(double));
    if (p->c.reward_aggregation == REWARD_NORMALIZE_THEN_SUM) batch_standardized(rewards, r->count, out);
    else rollout_group_advantages(p->c.estimator, p->c.group_scale, rewards, r->lengths, r->groups, r->count, out);
    free(rewards);
    return out;
}

// REINFORCE++-baseline: each kept sample's group mean of the clipped scores (gathered
// across ranks). Indexed by rollout position.
static double *group_mean_scores(const Rollout *r, const AdvantageConfig *advantage) {
    double *scores = xcalloc(r->count + 1, sizeof(double));
    for (int q = 0; q < r->count; q++)
        if (r->local[q]) scores[q] = clipped_score(advantage, r->local[q]->score);
    dist_sum_doubles(scores, r->count);
    double *out = xcalloc(r->count + 1, sizeof(double));
    for (int first = 0, last; first < r->count; first = last) {
        last = group_end(r->groups, r->count, first);
        double sum = 0;
        for (int q = first; q < last; q++) sum += scores[q];
        for (int q = first; q < last; q++) out[q] = sum / (last - first);
    }
    free(scores);
    return out;
}

// Each response token its own macro action (vanilla PPO and the critic-free estimators
// without --ratio macro).
static void token_segments(Sample *s) {
    s->segments = xmalloc(s->response_length * sizeof(int));
    for (int j = 0; j < s->response_length; j++) s->segments[j] = 1;
    s->segment_count = s->response_length;
}

// Whether a response was cut at max_new_tokens without a stop token (or a stop check).
static bool cut_short(const Sample *s) { return s->stop != STOP_TOKEN && s->stop != STOP_CHECK; }

// A response's score with DAPO's overlong punishment and, when it was cut short (cut_short),
// the missing-EOS penalty (the samples' and ReMax's greedy baselines').
static float shaped_score(const Ppo *p, float score, int response_length, bool truncated) {
    float shaped = score + overlong_penalty(response_length, p->c.max_new_tokens, p->c.overlong_buffer,
                                            (float)p->c.overlong_penalty);
    if (truncated) shaped -= (float)p->c.missing_eos_penalty;
    return shaped;
}

// GDPO (--multi-objective-aggregation normalize_then_sum): every sample's sum of its reward
// sources' scores normalised within its group (decoupled_group_rewards), from this rank's
// sources' scores parts[k][0..) (its samples in rollout order) gathered across the ranks.
// Indexed by rollout position.
static double *decoupled_rollout_rewards(Ppo *p, const Rollout *r, float *const *parts) {
    const int sources = p->c.reward_count;
    double *gathered = xcalloc((size_t)sources * r->count + 1, sizeof(double));
    const double *per_source[REWARD_KINDS];
    for (int k = 0; k < sources; k++) {
        for (int q = 0, i = 0; q < r->count; q++)
            if (r->local[q]) gathered[(size_t)k * r->count + q] = parts[k][i++];
        per_source[k] = gathered + (size_t)k * r->count;
    }
    dist_sum_doubles(gathered, sources * r->count); // one rank holds each sample: 0 + x is x exactly
    double *out = xcalloc(r->count + 1, sizeof(double));
    decoupled_group_rewards(per_source, p->c.reward_weights, sources, r->groups, r->count, out);
    free(gathered);
    return out;
}

// The score of each of the rollout's samples on this rank (reward model, lexicon, code
// execution, the user's command or a reward server), then the reward normalisation, DAPO's overlong
// punishment and the missing-EOS penalty: s->score. Adds the scoring statistics (summed over the ranks) to `stats`.
// Returns 0, or -1 with err_set() on every rank when a rank's reward command or server failed.
static int score_rollout(Ppo *p, const Rollout *r, RolloutStats *stats) {
    Sample **samples;
    const int count = all_local_samples(r, &samples);
    float *scores = xmalloc((count + 1) * sizeof(float));
    float *parts[REWARD_KINDS];
    for (int k = 0; k < p->c.reward_count; k++) parts[k] = xmalloc(((size_t)count + 1) * sizeof(float));
    for (int i = 0; i < count; i++) samples[i]->gold = response_gold(p, samples[i]);
    bool failed = score_samples(p, &p->prompts, samples, count, scores, parts) != 0;
    dist_weights_drain(&p->reward); // ZeRO-3: the ranks score different numbers of rows
    for (int i = 0; i < count && !failed; i++) samples[i]->raw_score = scores[i];
    // Agreed before the next collective, so no rank waits for one that stopped.
    if (dist_any_failed(failed)) {
        if (!failed) err_set("another rank's reward command or server failed");
        for (int k = 0; k < p->c.reward_count; k++) free(parts[k]);
        free(scores), free(samples);
        return -1;
    }
    // Reward normalisation: running mean and standard deviation of the raw scores, updated
    // in rollout order over every rank's scores, so the statistics are the same everywhere.
    double *raw = xcalloc(r->count + 1, sizeof(double));
    for (int q = 0; q < r->count; q++)
        if (r->local[q]) raw[q] = r->local[q]->raw_score;
    dist_sum_doubles(raw, r->count);
    double *decoupled = p->c.reward_aggregation == REWARD_NORMALIZE_THEN_SUM ? decoupled_rollout_rewards(p, r, parts) : NULL;
    for (int q = 0; q < r->count; q++) {
        float raw_score = (float)raw[q], score = raw_score;
        if (decoupled) score = (float)decoupled[q];
        if (p->c.normalize_reward) {
            p->reward_count += 1;
            double delta = raw_score - p->reward_mean;
            p->reward_mean += delta / p->reward_count;
            p->reward_m2 += delta * (raw_score - p->reward_mean);
            double std = p->reward_count > 1 ? sqrt(p->reward_m2 / (p->reward_count - 1)) : 1.0;
            score = (float)((raw_score - p->reward_mean) / (std > 1e-6 ? std : 1.0));
        }
        if (r->local[q]) {
            Sample *s = r->local[q];
            s->score = shaped_score(p, score, s->response_length, r->truncated[q]);
        }
    }
    free(raw), free(decoupled);
    RolloutStats local = {0};
    for (int i = 0; i < count; i++) {
        const Sample *s = samples[i];
        local.scored += 1;
        local.score += s->score;
        local.raw_score += s->raw_score;
        if (!isnan(s->gold)) local.gold += s->gold, local.gold_count++;
        local.length += s->response_length;
        local.stopped += s->stop == STOP_TOKEN;
        for (int k = 0; k < p->c.reward_count; k++) local.reward_parts[k] += parts[k][i];
    }
    dist_sum_doubles((double *)&local, sizeof local / sizeof(double));
    rollout_stats_add(stats, &local);
    for (int k = 0; k < p->c.reward_count; k++) free(parts[k]);
    free(scores), free(samples);
    return 0;
}

// ReMax (Li et al. 2023, verl's "remax"): each of this rank's `count` samples' baseline, the
// score of the actor's greedy answer to the same prompt (order[]), generated with the run's
// limits and scored and shaped as the samples' scores are (the reward sources, the overlong
// and missing-EOS penalties; --normalize-reward is refused with ReMax). The greedy answers
// are not trained on. Returns 0, or -1 with err_set() on every rank when a rank's reward
// command or server failed.
static int remax_baselines(Ppo *p, const long *order, long count, Sample *samples, GenerateStats *gen) {
    // One greedy answer per distinct prompt (a group's samples share theirs): unique[u] is the
    // u-th distinct prompt of order[], which_unique[i] sample i's.
    long *unique = xmalloc(((size_t)count + 1) * sizeof(long)), *which_unique = xmalloc(((size_t)count + 1) * sizeof(long));
    long distinct = 0;
    for (long i = 0; i < count; i++) {
        long u = 0;
        while (u < distinct && unique[u] != order[i]) u++;
        if (u == distinct) unique[distinct++] = order[i];
        which_unique[i] = u;
    }
    Sample *greedy = xcalloc((size_t)distinct + 1, sizeof(Sample));
    const SamplerConfig argmax = {.temperature = 0.0f};
    rollout(p, &p->prompts, unique, distinct, 0, 0, 1, greedy, gen, &argmax);
    dist_weights_drain(&p->actor); // ZeRO-3: the ranks' decode steps differ in number
    Sample **pointers = xmalloc(((size_t)distinct + 1) * sizeof(Sample *));
    float *scores = xmalloc(((size_t)distinct + 1) * sizeof(float));
    for (long u = 0; u < distinct; u++) pointers[u] = &greedy[u], greedy[u].gold = response_gold(p, &greedy[u]);
    const bool failed = score_samples(p, &p->prompts, pointers, (int)distinct, scores, NULL) != 0;
    dist_weights_drain(&p->reward); // ZeRO-3: the ranks score different numbers of rows
    for (long i = 0; i < count && !failed; i++) {
        const Sample *g = &greedy[which_unique[i]];
        samples[i].baseline = shaped_score(p, scores[which_unique[i]], g->response_length, cut_short(g));
    }
    for (long u = 0; u < distinct; u++) sample_free(&greedy[u]);
    free(greedy), free(pointers), free(scores), free(unique), free(which_unique);
    if (dist_any_failed(failed)) {
        if (!failed) err_set("another rank's reward command or server failed");
        return -1;
    }
    return 0;
}

// Experience of the samples to train on (already scored): the actor's (old) and the
// reference's log-probs, the critic's values, token rewards, macro actions and advantages.
// Adds the experience statistics (summed over the ranks) to `stats`.
static void compute_experience(Ppo *p, const Rollout *r, RolloutStats *stats) {
    const int micro = p->c.micro_batch;
    Sample **samples;
    const int count = all_local_samples(r, &samples);
    float **logp = xmalloc((count + 1) * sizeof(float *)), **ref = xmalloc((count + 1) * sizeof(float *));
    float **values = xmalloc((count + 1) * sizeof(float *)), **entropy = xmalloc((count + 1) * sizeof(float *));
    for (int i = 0; i < count; i++) {
        allocate_sample_arrays(samples[i]);
        logp[i] = samples[i]->logp_old, ref[i] = samples[i]->logp_ref;
        values[i] = samples[i]->values_old, entropy[i] = samples[i]->entropy;
    }
    if (p->old_logprobs_from_training) { // filled by the training forward; zeros meanwhile (times kl_coef 0)
        for (int i = 0; i < count; i++) {
            memset(logp[i], 0, samples[i]->response_length * sizeof(float));
            memset(entropy[i], 0, samples[i]->response_length * sizeof(float));
        }
    } else if (p->old_logprobs_from_rollout) { // the entropies from the first epoch's training forward
        for (int i = 0; i < count; i++) {
            memcpy(logp[i], samples[i]->rollout_logp, samples[i]->response_length * sizeof(float));
            memset(entropy[i], 0, samples[i]->response_length * sizeof(float));
        }
    } else {
        experience_logprobs(&p->actor, samples, count, micro, logp, entropy);
    }
    // ZeRO-3 (dist/zero.h): the ranks hold different numbers of samples, so each sharded
    // model's forwards are brought into step before another model's begin.
    dist_weights_drain(&p->actor);
    if (p->reference_is_actor_base) {
        p->actor.lora_enabled = false;
        experience_logprobs(&p->actor, samples, count, micro, ref, NULL);
        p->actor.lora_enabled = true;
        dist_weights_drain(&p->actor); // ZeRO-3 with LoRA: the actor's base is sharded
    } else {
        experience_logprobs(&p->reference, samples, count, micro, ref, NULL);
        dist_weights_drain(&p->reference);
    }
    if (p->has_critic) {
        experience_values(&p->critic, samples, count, micro, values);
        dist_weights_drain(&p->critic);
    } else
        for (int i = 0; i < count; i++) memset(values[i], 0, samples[i]->response_length * sizeof(float));
    AdvantageConfig advantage = p->c.advantage;
    advantage.kl_coef = (float)p->kl_coef;
    const AdvantageEstimator estimator = p->c.estimator;
    const bool group_relative = estimator == ESTIMATOR_GRPO || estimator == ESTIMATOR_DR_GRPO ||
                                estimator == ESTIMATOR_RLOO || estimator == ESTIMATOR_OPO || estimator == ESTIMATOR_GPG;
    const bool reinforce = estimator == ESTIMATOR_REINFORCE_PP || estimator == ESTIMATOR_REINFORCE_PP_BASELINE;
    const bool remax = estimator == ESTIMATOR_REMAX;
    double *sequence_advantage = group_relative ? group_estimates(p, r, &advantage) : NULL;
    double *score_baseline = estimator == ESTIMATOR_REINFORCE_PP_BASELINE ? group_mean_scores(r, &advantage) : NULL;
    double advantage_sum = 0, advantage_sq = 0, advantage_n = 0;
    RolloutStats local = {0};
    for (int i = 0, q = 0; i < count; i++, q++) {
        Sample *s = samples[i];
        while (r->local[q] != s) q++; // the sample's position in the rollout
        int R = s->response_length;
        if (score_baseline) { // KL per token, and the score less its group's mean on the last
            token_rewards(&advantage, s->logp_old, s->logp_ref, 0.0f, R, s->rewards);
            if (R > 0) s->rewards[R - 1] += (float)(clipped_score(&advantage, s->score) - score_baseline[q]);
        } else {
            token_rewards(&advantage, s->logp_old, s->logp_ref, s->score, R, s->rewards);
        }
        if (!p->has_critic) { // critic-free: macro actions matter only to --ratio macro
            if (!p->c.token_level) segment_sample(p, s);
            else token_segments(s);
        }
        if (sequence_advantage) { // GRPO / RLOO: the response's group advantage on every token
            for (int j = 0; j < R; j++) s->advantages[j] = (float)sequence_advantage[q], s->returns[j] = 0.0f;
        } else if (reinforce) { // REINFORCE++: returns-to-go, whitened below
            returns_to_go(s->rewards, R, advantage.gamma, s->advantages);
            memcpy(s->returns, s->advantages, R * sizeof(float));
        } else if (remax) { // ReMax: returns-to-go less the greedy answer's (clipped) score
            returns_to_go(s->rewards, R, advantage.gamma, s->returns);
            const float baseline = clipped_score(&advantage, s->baseline);
            for (int j = 0; j < R; j++) s->advantages[j] = s->returns[j] - baseline;
        } else if (p->c.token_level) { // vanilla PPO: no macro machinery at all
            token_segments(s);
            token_advantages(&advantage, s->values_old, s->rewards, R, s->advantages, s->returns);
        } else {
            segment_sample(p, s);
            macro_advantages(&advantage, s->values_old, s->rewards, R, s->segments, s->segment_count, s->advantages,
                             s->returns);
        }
        double kl = 0, entropy_sum = 0, value_sum = 0;
        int actions = 0;
        for (int j = 0; j < R; j++) {
            kl += s->logp_old[j] - s->logp_ref[j];
            entropy_sum += s->entropy[j];
            value_sum += s->values_old[j];
            advantage_sum += s->advantages[j], advantage_sq += (double)s->advantages[j] * s->advantages[j];
            advantage_n++;
        }
        for (int k = 0; k < s->segment_count; k++) actions += s->segments[k] > 0;
        if (!p->old_logprobs_from_training && !p->old_logprobs_from_rollout) { // else after training
            local.kl_sequence += kl;
            local.entropy += entropy_sum;
            local.policy_samples += 1;
            local.policy_tokens += R;
        }
        local.experienced += 1;
        local.baseline += remax ? s->baseline : 0.0;
        local.kl_tokens += R;
        local.value += value_sum;
        local.macro_actions += actions;
        local.fallbacks += s->parse_fallbacks;
    }
    dist_sum_doubles((double *)&local, sizeof local / sizeof(double));
    double advantage_moments[3] = {advantage_sum, advantage_sq, advantage_n};
    dist_sum_doubles(advantage_moments, 3);
    advantage_sum = advantage_moments[0], advantage_sq = advantage_moments[1], advantage_n = advantage_moments[2];
    local.advantage = advantage_sum;
    rollout_stats_add(stats, &local);
    free(sequence_advantage), free(score_baseline);
    if (((p->c.whiten_advantages && p->has_critic) || reinforce) && advantage_n > 1) {
        double mean = advantage_sum / advantage_n;
        double std = sqrt(advantage_sq / advantage_n - mean * mean);
        for (int i = 0; i < count; i++)
            for (int j = 0; j < samples[i]->response_length; j++)
                samples[i]->advantages[j] = (float)((samples[i]->advantages[j] - mean) / (std + 1e-8));
    }
    free(logp), free(ref), free(values), free(entropy), free(samples);
}

// ---------------------------------------------------------------------------------------
// Training

typedef struct {
    PpoLossStats actor, critic;
    double policy_loss, value_loss, entropy, actor_grad_norm, critic_grad_norm, steps;
    double ptx_loss; // summed over the steps: each step's PTX micro-batch's mean token loss (rank 0's)
} TrainStats;

// The weight of each token of this rank's samples in the mean over the whole minibatch
// (positions[0..count) of the rollout, whichever rank holds them).
// --mask-truncated-completions: a truncated response's tokens weigh 0 and a token mean
// counts only the others' (TRL's dapo normalisation); a sequence mean still divides by every
// response (TRL's grpo, dr_grpo).
// micro-batch-token-mean (TRL's bnpo) takes this rank's samples in minibatch order, as
// local_samples lists them and the training cuts them into micro-batches of micro_batch: each
// weighs 1 / (its micro-batch's tokens x the micro-batches of the step on all ranks), so that
// it depends on how the samples fall into micro-batches (on the number of ranks, too).
static void set_loss_scales(const Ppo *p, const Rollout *r, const int *positions, int count) {
    double tokens = 0;
    for (int i = 0; i < count; i++)
        if (!(p->c.mask_truncated && r->truncated[positions[i]])) tokens += r->lengths[positions[i]];
    double *micro_batch_tokens = NULL;
    int micro_batches = 0;
    if (p->c.loss_aggregation == LOSS_MICRO_BATCH_TOKEN_MEAN) {
        int local = 0;
        for (int i = 0; i < count; i++) local += r->local[positions[i]] != NULL;
        micro_batches = (local + p->c.micro_batch - 1) / p->c.micro_batch;
        micro_batch_tokens = xcalloc((size_t)micro_batches + 1, sizeof(double));
        for (int i = 0, j = 0; i < count; i++) {
            if (!r->local[positions[i]]) continue;
            if (!(p->c.mask_truncated && r->truncated[positions[i]]))
                micro_batch_tokens[j / p->c.micro_batch] += r->lengths[positions[i]];
            j++;
        }
        dist_sum_ints(&micro_batches, 1);
    }
    for (int i = 0, j = 0; i < count; i++) {
        Sample *s = r->local[positions[i]];
        if (!s) continue;
        const int micro_batch_index = j++ / p->c.micro_batch;
        if (p->c.mask_truncated && r->truncated[positions[i]]) {
            s->loss_scale = 0;
            continue;
        }
        switch (p->c.loss_aggregation) {
        case LOSS_TOKEN_MEAN: s->loss_scale = (float)(1.0 / tokens); break;
        case LOSS_MICRO_BATCH_TOKEN_MEAN:
            s->loss_scale = (float)(1.0 / (micro_batch_tokens[micro_batch_index] * micro_batches));
            break;
        case LOSS_SEQUENCE_MEAN_TOKEN_SUM_NORM: s->loss_scale = (float)(1.0 / ((double)p->c.max_new_tokens * count)); break;
        case LOSS_SEQUENCE_MEAN_TOKEN_SUM: s->loss_scale = (float)(1.0 / count); break;
        case LOSS_SEQUENCE_MEAN_TOKEN_MEAN:
        default: s->loss_scale = (float)(1.0 / ((double)s->response_length * count)); break;
        }
    }
    free(micro_batch_tokens);
}

// PPO-ptx: an SFT micro-batch from the ptx data, its loss weighted by ptx_coef. Under
// mpirun rank 0 runs it (one micro-batch per step, as one process does) and every rank
// moves the cursor. Returns the micro-batch's mean token loss, before ptx_coef (DeepSpeed-Chat's
// "unsupervised loss"); 0 on the other ranks.
static double ptx_micro_step(Ppo *p) {
    const TokenizedExamples *d = &p->ptx;
    int B = p->c.micro_batch < d->count ? p->c.micro_batch : (int)d->count;
    int T = 0;
    long *which = xmalloc(B * sizeof(long));
    for (int b = 0; b < B; b++) {
        which[b] = (p->ptx_cursor + b) % d->count;
        if (d->lengths[which[b]] > T) T = d->lengths[which[b]];
    }
    p->ptx_cursor = (p->ptx_cursor + B) % d->count;
    if (!dist_is_main()) {
        free(which);
        return 0;
    }
    SftBatch batch; // SFT's rows: the trained tokens, packed rows' segments (--ptx-packing)
    sft_batch_build(d, which, B, training_pad_id(p->tokenizer), 0, false, &batch);
    const long N = (long)batch.B * batch.T;
    float *logp = xmalloc(N * sizeof(float)), *dlogp = xcalloc(N, sizeof(float));
    double counted = 0;
    for (long i = 0; i < N; i++) counted += batch.mask[i];
    ModelBatch input = sft_batch_input(&batch);
    model_forward(&p->actor, &input);
    model_logprobs(&p->actor, batch.targets, logp, NULL, NULL);
    double loss = 0;
    if (counted > 0) {
        for (long i = 0; i < N; i++) {
            dlogp[i] = (float)(-p->c.ptx_coef * batch.mask[i] / counted);
            if (batch.mask[i]) loss -= logp[i];
        }
        loss /= counted;
        model_backward(&p->actor, dlogp, NULL, NULL);
    }
    free(logp), free(dlogp), free(which);
    sft_batch_free(&batch);
    return loss;
}

// With LoRA the EMA model carries adapters too, and only they move. Under ZeRO-3 each rank
// moves its shard of the EMA's layers, which are the actor's shard's.
static void ema_update(Ppo *p) { dist_moving_average(&p->ema, &p->actor, (float)p->c.ema_beta); }

// Adaptive entropy control after an optimizer step (Skywork-OR1; TRL's use_adaptive_entropy):
// the step's mean entropy over every rank's trained policy tokens moves the coefficient one
// delta up (at most the target) or down (above it), within [min, max].
static void adapt_entropy_coef(Ppo *p, double entropy_sum, double tokens) {
    double step[2] = {entropy_sum, tokens};
    dist_sum_doubles(step, 2);
    const double entropy = step[0] / (step[1] > 1 ? step[1] : 1);
    const double moved = entropy <= p->c.entropy_target ? p->entropy_coef + p->c.entropy_coef_delta
                                                        : p->entropy_coef - p->c.entropy_coef_delta;
    p->entropy_coef = moved < p->c.entropy_coef_min ? p->c.entropy_coef_min
                      : moved > p->c.entropy_coef_max ? p->c.entropy_coef_max
                                                      : moved;
    p->last_trained_entropy = entropy;
}

// The sums of the loss statistics over the ranks (the gradient norms and the step count
// are already the same everywhere).
static void sum_train_stats_across_ranks(TrainStats *stats) {
    double packed[19] = {stats->actor.policy_loss, stats->actor.value_loss, stats->actor.clipped,
                         stats->actor.approx_kl, stats->actor.ratio_sum, stats->actor.tokens,
                         stats->critic.policy_loss, stats->critic.value_loss, stats->critic.clipped,
                         stats->critic.approx_kl, stats->critic.ratio_sum, stats->critic.tokens,
                         stats->policy_loss, stats->value_loss, stats->entropy, stats->ptx_loss,
                         stats->actor.rollout_weight_sum, stats->actor.off_policy_masked,
                         stats->actor.clip_cov_left_out};
    dist_sum_doubles(packed, 19);
    PpoLossStats *parts[2] = {&stats->actor, &stats->critic};
    for (int k = 0; k < 2; k++) {
        const double *v = packed + 6 * k;
        *parts[k] = (PpoLossStats){.policy_loss = v[0], .value_loss = v[1], .clipped = v[2], .approx_kl = v[3],
                                   .ratio_sum = v[4], .tokens = v[5]};
    }
    stats->policy_loss = packed[12], stats->value_loss = packed[13], stats->entropy = packed[14];
    stats->ptx_loss = packed[15]; // rank 0's: the others ran no PTX batch
    stats->actor.rollout_weight_sum = packed[16], stats->actor.off_policy_masked = packed[17];
    stats->actor.clip_cov_left_out = packed[18];
}

// PPO epochs over the rollout. Every rank walks the same minibatches of the whole rollout
// and runs the micro-steps of the samples it holds; the summed gradients give every rank the
// same optimizer step.
// DAPO's dynamic sampling, the filter (the main loop refills): a group whose responses all
// got the same score teaches nothing (GRPO's advantages are all 0 there) but would still
// count in the loss's denominators, so its samples are left out of training.
// Fills `out` with the rest (arrays to free) and returns how many groups were left out.
// The scores are gathered across ranks first, so every rank leaves out the same samples.
static int drop_uniform_groups(const Rollout *r, Rollout *out) {
    double *scores = xcalloc(r->count + 1, sizeof(double));
    for (int q = 0; q < r->count; q++)
        if (r->local[q]) scores[q] = r->local[q]->score;
    dist_sum_doubles(scores, r->count); // one rank holds each sample: 0 + x is x exactly
    *out = rollout_new(r->count);
    int dropped = 0;
    for (int first = 0, last; first < r->count; first = last) {
        last = group_end(r->groups, r->count, first);
        bool uniform = true;
        for (int q = first; q < last; q++) uniform &= scores[q] == scores[first];
        if (uniform && last - first >= 2) dropped++;
        else
            for (int q = first; q < last; q++) rollout_append(out, r, q);
    }
    free(scores);
    return dropped;
}

// When the old log-probs or the entropies came from the training forward: the KL to the
// reference and the entropy of the trained samples, summed across ranks, into the rollout's
// statistics.
static void policy_stats_from_training(const Rollout *r, RolloutStats *stats) {
    double sums[4] = {0, 0, 0, 0}; // kl, entropy, samples, tokens
    for (int q = 0; q < r->count; q++) {
        const Sample *s = r->local[q];
        if (!s) continue;
        for (int j = 0; j < s->response_length; j++) {
            sums[0] += (double)s->logp_old[j] - s->logp_ref[j];
            sums[1] += s->entropy[j];
        }
        sums[2] += 1, sums[3] += s->response_length;
    }
    dist_sum_doubles(sums, 4);
    stats->kl_sequence = sums[0], stats->entropy = sums[1], stats->policy_samples = sums[2], stats->policy_tokens = sums[3];
}

// The most micro-batches of `micro_batch` samples any rank has, when this one has `samples`.
static int most_micro_batches(int samples, int micro_batch) {
    const int world = dist_world_size();
    int *counts = xcalloc((size_t)world, sizeof(int));
    counts[dist_rank()] = (samples + micro_batch - 1) / micro_batch;
    dist_sum_ints(counts, world);
    int most = 0;
    for (int r = 0; r < world; r++) most = counts[r] > most ? counts[r] : most;
    free(counts);
    return most;
}

// The actor's part of a minibatch: policy loss over this rank's `size` samples in `rounds`
// rounds of micro-batches (one per rank each: dist_backward_round_begin, ZeRO stage 2 sums
// gradients in every backward), PTX, one optimizer step, then what follows a step.
static void train_actor_minibatch(Ppo *p, Sample **minibatch, int size, int rounds, int epoch, TrainStats *stats) {
    dist_zero_grad(&p->actor);
    // Adaptive entropy control applies the coefficient of the end of the last step, and
    // only while that step's entropy was at most the target (TRL's gating).
    const double entropy_coef = !p->c.adaptive_entropy ? p->c.entropy_coef
                                : p->last_trained_entropy <= p->c.entropy_target ? p->entropy_coef
                                                                                  : 0.0;
    const double entropy_before[2] = {stats->actor.trained_entropy, stats->actor.trained_tokens};
    for (int round = 0, k = 0; round < rounds; round++, k += p->c.micro_batch) {
        dist_backward_round_begin(&p->actor, round == rounds - 1 && p->ptx.count == 0);
        if (k < size) {
            int n = size - k < p->c.micro_batch ? size - k : p->c.micro_batch;
            stats->policy_loss += actor_micro_step(&p->actor, minibatch + k, n, &p->c.loss, entropy_coef,
                                                   p->old_logprobs_from_training,
                                                   p->old_logprobs_from_rollout && epoch == 0, p->c.seed, epoch,
                                                   &stats->actor,
                                                   &stats->entropy);
        }
        dist_backward_round_end(&p->actor);
    }
    if (p->ptx.count > 0) {
        dist_backward_round_begin(&p->actor, true);
        stats->ptx_loss += ptx_micro_step(p);
        dist_backward_round_end(&p->actor);
    }
    double norm = dist_reduce_gradients(&p->actor, &p->actor_optimizer);
    dist_adamw_step(&p->actor_optimizer, &p->actor, lr_schedule_at(&p->actor_schedule, p->actor_steps),
                    isfinite(norm) ? grad_clip_coefficient(norm, (float)p->c.clip_norm) : 0.0f);
    stats->actor_grad_norm += norm;
    if (p->c.ema) ema_update(p);
    if (p->c.adaptive_entropy)
        adapt_entropy_coef(p, stats->actor.trained_entropy - entropy_before[0],
                           stats->actor.trained_tokens - entropy_before[1]);
    p->actor_steps++;
    // TR-DPO's update (TRL's GRPO sync_ref_model): the next rollout's KL is against it.
    reference_sync_after_step(&p->reference_sync, &p->actor, p->actor_steps);
}

static void train_on_rollout(Ppo *p, const Rollout *r, TrainStats *stats) {
    const int count = r->count;
    int *order = xmalloc(count * sizeof(int));
    Sample **mine = xmalloc(count * sizeof(Sample *));
    const int minibatches = p->c.minibatches < count ? p->c.minibatches : count;
    for (int epoch = 0; epoch < p->c.ppo_epochs; epoch++) {
        // A fresh sample order per PPO epoch, a pure function of (seed, iteration, epoch).
        long *permutation = xmalloc(count * sizeof(long));
        train_epoch_order(p->c.seed ^ 0x5050, p->iteration * 1000 + epoch, count, permutation);
        for (int i = 0; i < count; i++) order[i] = (int)permutation[i];
        free(permutation);
        for (int m = 0; m < minibatches; m++) {
            int first = (int)((long)count * m / minibatches), last = (int)((long)count * (m + 1) / minibatches);
            set_loss_scales(p, r, order + first, last - first);
            Sample **minibatch = mine;
            int size = local_samples(r, order + first, last - first, mine);
            // Actor, then critic: each its loss over the minibatch in micro-batches, then one step;
            // as many rounds of micro-batches as the rank with the most samples needs.
            const int rounds = most_micro_batches(size, p->c.micro_batch);
            if (!p->actor_frozen) train_actor_minibatch(p, minibatch, size, rounds, epoch, stats);
            // Critic: value loss, then its own step.
            if (p->has_critic) {
                dist_zero_grad(&p->critic);
                for (int round = 0, k = 0; round < rounds; round++, k += p->c.micro_batch) {
                    dist_backward_round_begin(&p->critic, round == rounds - 1);
                    if (k < size) {
                        int n = size - k < p->c.micro_batch ? size - k : p->c.micro_batch;
                        stats->value_loss +=
                            critic_micro_step(&p->critic, minibatch + k, n, &p->c.loss, &stats->critic);
                    }
                    dist_backward_round_end(&p->critic);
                }
                double norm = dist_reduce_gradients(&p->critic, &p->critic_optimizer);
                dist_adamw_step(&p->critic_optimizer, &p->critic,
                                lr_schedule_at(&p->critic_schedule, p->optimizer_steps),
                                isfinite(norm) ? grad_clip_coefficient(norm, (float)p->c.clip_norm) : 0.0f);
                stats->critic_grad_norm += norm;
            }
            p->optimizer_steps++;
            stats->steps++;
        }
    }
    sum_train_stats_across_ranks(stats);
    free(order), free(mine);
}

// ---------------------------------------------------------------------------------------
// Evaluation: the actor's responses to held-out prompts, scored by the reward and gold.

// Returns 0, or -1 with err_set() (the reward command or server failed).
// The starting policy's per-prompt eval scores, from samples/eval-000000.jsonl (a resumed
// run's evaluation at iteration 0 wrote it): false when the file is missing or not `count`
// rows with a numeric "reward" (the win rates are then unknown).
static bool load_first_eval(Ppo *p, long count) {
    char *path = fs_join(p->c.run_dir, "samples/eval-000000.jsonl");
    JsonlReader reader;
    const bool opened = fs_is_file(path) && jsonl_open(&reader, path, 0) == 0;
    free(path);
    if (!opened) {
        err_clear(); // not an error: the win rates are unknown
        return false;
    }
    float *scores = xmalloc(count * sizeof(float)), *golds = xmalloc(count * sizeof(float));
    long rows = 0;
    bool ok = true;
    json_t *row;
    int got = 0;
    while (ok && (got = jsonl_next(&reader, &row)) == 1) {
        json_t *reward = json_object_get(row, "reward"), *gold = json_object_get(row, "gold");
        ok = rows < count && json_is_number(reward);
        if (ok) {
            scores[rows] = (float)json_number_value(reward);
            golds[rows++] = json_is_number(gold) ? (float)json_number_value(gold) : NAN;
        }
        json_decref(row);
    }
    if (ok && got < 0) ok = false, err_clear();
    jsonl_close(&reader);
    if (!ok || rows != count) {
        free(scores), free(golds);
        return false;
    }
    p->first_eval_scores = scores, p->first_eval_golds = golds, p->first_eval_count = count;
    return true;
}

// The share of prompts where `now` beats `first` (a tie counts half), over the prompts where
// both are known; NAN when none is.
static double win_rate(const float *now, const float *first, long count) {
    double wins = 0, compared = 0;
    for (long i = 0; i < count; i++) {
        if (isnan(now[i]) || isnan(first[i])) continue;
        wins += now[i] > first[i] ? 1.0 : now[i] == first[i] ? 0.5 : 0.0;
        compared++;
    }
    return compared > 0 ? wins / compared : NAN;
}

static int evaluate(Ppo *p, bool final) {
    const PromptSet *set = p->eval_prompts.count ? &p->eval_prompts : NULL;
    if (!set) return 0;
    const long prompts = p->c.eval_prompts > 0 && p->c.eval_prompts < set->count ? p->c.eval_prompts : set->count;
    // Row i answers prompt i / K (K = --eval-samples-per-prompt), its sample i % K.
    const int K = p->c.eval_samples > 0 ? p->c.eval_samples : 1;
    const long count = prompts * K;
    long *order = xmalloc(count * sizeof(long));
    for (long i = 0; i < count; i++) order[i] = i / K;
    Sample *samples = xcalloc(count, sizeof(Sample));
    GenerateStats gen = {0};
    // Fixed row ids: every evaluation samples the same random numbers, so curves compare.
    rollout(p, set, order, count, 1000000000ULL, 0, 1, samples, &gen, NULL);
    Sample **pointers = xmalloc(count * sizeof(Sample *));
    for (long i = 0; i < count; i++) pointers[i] = &samples[i];
    float *scores = xmalloc(count * sizeof(float));
    for (long i = 0; i < count; i++) samples[i].gold = response_gold(p, &samples[i]);
    int rc = score_samples(p, set, pointers, (int)count, scores, NULL);
    double score = 0, gold = 0, gold_n = 0, length = 0;
    char name[64];
    snprintf(name, sizeof name, final ? "samples/final.jsonl" : "samples/eval-%06ld.jsonl", p->iteration);
    char *path = fs_join(p->c.run_dir, name);
    char *dir = fs_dirname(path);
    fs_mkdir_p(dir);
    FILE *out = rc == 0 ? fopen(path, "w") : NULL;
    float *golds = xmalloc(count * sizeof(float));
    for (long i = 0; i < count && rc == 0; i++) {
        Sample *s = &samples[i];
        const float value = scores[i];
        golds[i] = s->gold;
        score += value, length += s->response_length;
        if (!isnan(s->gold)) gold += s->gold, gold_n++;
        if (out) {
            int visible = s->response_length - (s->stop == STOP_TOKEN ? 1 : 0);
            char *text = tokenizer_decode(p->tokenizer, s->response, visible, true);
            json_t *row = json_pack("{s:s, s:s, s:f, s:i}", "prompt", set->texts[order[i]], "response", text, "reward",
                                    (double)value, "response_tokens", s->response_length);
            if (!isnan(s->gold)) json_object_set_new(row, "gold", json_real(s->gold));
            if (K > 1) json_object_set_new(row, "sample", json_integer(i % K));
            char *line = json_dumps(row, JSON_COMPACT);
            fprintf(out, "%s\n", line);
            free(line), free(text);
            json_decref(row);
        }
    }
    if (out) fclose(out);
    if (rc != 0) {
        for (long i = 0; i < count; i++) free(samples[i].response);
        free(samples), free(pointers), free(scores), free(golds), free(order), free(path), free(dir);
        return -1;
    }
    // Win rates against the starting policy on the same prompts: both sampled with the same
    // random numbers (fixed row ids), so the comparison is paired.
    if (p->iteration == 0 && !p->first_eval_scores) {
        p->first_eval_scores = xmalloc(count * sizeof(float)), p->first_eval_golds = xmalloc(count * sizeof(float));
        memcpy(p->first_eval_scores, scores, count * sizeof(float));
        memcpy(p->first_eval_golds, golds, count * sizeof(float));
        p->first_eval_count = count;
    } else if (p->iteration > 0 && !p->first_eval_scores) {
        load_first_eval(p, count);
    }
    const bool paired = p->iteration > 0 && p->first_eval_scores && p->first_eval_count == count;
    // Several answers a prompt: the mean over prompts of each one's best (verl's best@N).
    double best_sum = 0;
    for (long q = 0; q < prompts; q++) {
        float best = scores[q * K];
        for (int k = 1; k < K; k++) best = scores[q * K + k] > best ? scores[q * K + k] : best;
        best_sum += best;
    }
    const char *names[] = {"score", "gold", "response_length", "win_rate", "gold_win_rate", "best_of_n"};
    double values[] = {score / count, gold_n ? gold / gold_n : NAN, length / count,
                       paired ? win_rate(scores, p->first_eval_scores, count) : NAN,
                       paired ? win_rate(golds, p->first_eval_golds, count) : NAN, best_sum / prompts};
    metrics_log(&p->metrics, "eval", p->iteration, names, values, K > 1 ? 6 : 5);
    if (!p->c.quiet) {
        fprintf(stderr, "\neval at iteration %ld: score %.4f, gold %.4f, length %.1f", p->iteration, values[0], values[1],
                values[2]);
        if (paired) fprintf(stderr, ", win rate against iteration 0 %.3f (gold %.3f)", values[3], values[4]);
        fprintf(stderr, "\n");
    }
    for (long i = 0; i < count; i++) free(samples[i].response);
    free(samples), free(pointers), free(scores), free(golds), free(order), free(path), free(dir);
    return 0;
}

// ---------------------------------------------------------------------------------------
// Checkpoints

// The reward-hacking baseline in a checkpoint's state: the five signals by name, null for
// an unknown one (NAN; JSON has no NaN).
static const char *const hacking_signal_names[5] = {"mean_length", "distinct_2", "repetitive_fraction",
                                                    "same_answer_fraction", "shared_trigram_fraction"};
static double *hacking_signal_fields(HackingSignals *s) {
    _Static_assert(sizeof(HackingSignals) == 5 * sizeof(double), "HackingSignals is five doubles");
    return &s->mean_length;
}
static json_t *hacking_signals_to_json(const HackingSignals *signals) {
    HackingSignals copy = *signals;
    const double *fields = hacking_signal_fields(&copy);
    json_t *object = json_object();
    for (int i = 0; i < 5; i++)
        json_object_set_new(object, hacking_signal_names[i], isfinite(fields[i]) ? json_real(fields[i]) : json_null());
    return object;
}
static bool hacking_signals_from_json(json_t *object, HackingSignals *signals) {
    double *fields = hacking_signal_fields(signals);
    for (int i = 0; i < 5; i++) {
        json_t *value = json_object_get(object, hacking_signal_names[i]);
        if (!json_is_number(value) && !json_is_null(value)) return false;
        fields[i] = json_is_number(value) ? json_number_value(value) : NAN;
    }
    return true;
}

// RUN_DIR/checkpoint-<iteration>: actor, critic (with their optimizers' moments), EMA, trainer state.
// --ptx-packing's name in checkpoints ("none" for one row a row).
static const char *ptx_packing_name(const PpoConfig *c) {
    return c->ptx_packing >= 0 ? packing_strategy_name((PackingStrategy)c->ptx_packing) : "none";
}

static int write_checkpoint(Ppo *p, const AdamW *actor_moments, const AdamW *critic_moments) {
    json_t *state = json_object();
    json_object_set_new(state, "task", json_string("ppo"));
    json_object_set_new(state, "iteration", json_integer(p->iteration));
    json_object_set_new(state, "epoch", json_integer(p->epoch));
    json_object_set_new(state, "cursor", json_integer(p->cursor));
    json_object_set_new(state, "optimizer_steps", json_integer(p->optimizer_steps));
    json_object_set_new(state, "actor_optimizer_steps", json_integer(p->actor_steps));
    json_object_set_new(state, "kl_coef", json_real(p->kl_coef));
    json_object_set_new(state, "reward_count", json_real(p->reward_count));
    json_object_set_new(state, "reward_mean", json_real(p->reward_mean));
    json_object_set_new(state, "reward_m2", json_real(p->reward_m2));
    json_object_set_new(state, "entropy_coef", json_real(p->entropy_coef));
    // (null before the first step: JSON has no infinity)
    json_object_set_new(state, "last_trained_entropy",
                        isfinite(p->last_trained_entropy) ? json_real(p->last_trained_entropy) : json_null());
    json_object_set_new(state, "ptx_cursor", json_integer(p->ptx_cursor));
    json_object_set_new(state, "ptx_packing", json_string(ptx_packing_name(&p->c)));
    json_object_set_new(state, "num_prompts", json_integer(p->prompts.count));
    json_object_set_new(state, "world_size", json_integer(dist_world_size()));
    json_object_set_new(state, "actor_lora_rank", json_integer(p->actor.lora.rank));
    json_object_set_new(state, "critic_lora_rank", json_integer(p->has_critic ? p->critic.lora.rank : 0));
    json_object_set_new(state, "actor_quantize", json_string(model_quantize_name(&p->actor)));
    json_object_set_new(state, "critic_quantize", json_string(p->has_critic ? model_quantize_name(&p->critic) : "none"));
    json_object_set_new(state, "advantage_estimator", json_string(advantage_estimator_name(p->c.estimator)));
    json_object_set_new(state, "samples_per_prompt", json_integer(p->c.samples_per_prompt));
    if (p->has_hacking_first) json_object_set_new(state, "hacking_first", hacking_signals_to_json(&p->hacking_first));
    json_object_set_new(state, "hacking_active", json_integer(p->hacking_active));
    checkpoint_record_batch_invariant(state, p->actor.ops);
    reference_sync_save_state(&p->reference_sync, state);
    // The models in order, those the run has: actor, critic, EMA, a reference that follows the actor.
    const CheckpointModel all[4] = {{"actor", &p->actor, actor_moments},
                                    {"critic", &p->critic, critic_moments},
                                    {"actor_ema", &p->ema, NULL},
                                    {REFERENCE_SYNC_FOLDER, &p->reference, NULL}};
    const bool has[4] = {true, p->has_critic, p->c.ema, p->reference_sync.model != NULL};
    CheckpointModel models[4];
    int count = 0;
    for (int i = 0; i < 4; i++)
        if (has[i]) models[count++] = all[i];
    int rc = checkpoint_save(p->c.run_dir, p->iteration, models, count, p->tokenizer, state, (int)p->c.keep_last);
    json_decref(state);
    return rc;
}

// Collective: every rank calls it; rank 0 writes, reading sharded optimizers' moments from
// the other ranks as it goes, and under ZeRO-3 their shards of the weights (dist/zero.h).
static int save(Ppo *p) {
    if (dist_is_main()) {
        int rc = write_checkpoint(p, &p->actor_optimizer, &p->critic_optimizer);
        dist_serving_end();
        return rc;
    }
    const AdamW *optimizers[2] = {&p->actor_optimizer, p->has_critic ? &p->critic_optimizer : NULL};
    const Model *models[3] = {&p->actor, p->has_critic ? &p->critic : NULL, p->c.ema ? &p->ema : NULL};
    dist_serve_shards(optimizers, 2, models, 3);
    return 0;
}

// Collective: rank 0 evaluates the actor alone. Under ZeRO-3 the other ranks meanwhile play
// its passes' gathers (dist_weights_drain), so no rank holds the whole actor; with the hybrid
// engine every rank holds it whole for the evaluation instead, and plays only the reward
// model's passes. Returns true on every rank when rank 0's evaluation failed.
static bool evaluate_on_main(Ppo *p, bool final) {
    if (p->c.hybrid_engine) dist_weights_gather_all(&p->actor);
    bool failed = dist_is_main() && evaluate(p, final) != 0;
    dist_weights_drain(&p->actor);
    if (p->c.hybrid_engine) {
        // The actor was whole, so its passes announced nothing and its drain returned at
        // once; the reward model's scoring passes still need the other ranks.
        dist_weights_drain(&p->reward);
        dist_weights_reshard(&p->actor);
    }
    return dist_any_failed(failed);
}

static double number(json_t *state, const char *key) {
    json_t *v = json_object_get(state, key);
    return json_is_number(v) ? json_number_value(v) : 0;
}

// Under ZeRO-3 each rank loads only its shard of the layers of the models PPO shards (actor,
// critic, EMA, and the float32 reference and reward models).
static ModelKeepRange load_range(const Ppo *p) {
    return p->c.zero_stage == 3 && dist_world_size() > 1 ? dist_weights_load_range : NULL;
}

static int resume(Ppo *p) {
    char *checkpoint = checkpoint_latest(p->c.run_dir);
    if (!checkpoint) return 0;
    json_t *state = NULL;
    int rc = checkpoint_load_state(checkpoint, &state);
    if (rc == 0 && (long)number(state, "num_prompts") != p->prompts.count)
        rc = err_set("checkpoint was made with %ld prompts, this run has %ld (%s)", (long)number(state, "num_prompts"),
                     p->prompts.count, checkpoint);
    // Which rank generates which row depends on the process count: resuming with another
    // would not continue the same run.
    long saved_world = json_object_get(state, "world_size") ? (long)number(state, "world_size") : 1;
    if (rc == 0 && saved_world != dist_world_size())
        rc = err_set("checkpoint was made by %ld processes, this run has %d (%s): resume with mpirun -np %ld",
                     saved_world, dist_world_size(), checkpoint, saved_world);
    // Checkpoints from before the critic-free estimators have no estimator: GAE, 1 sample.
    json_t *estimator = json_object_get(state, "advantage_estimator");
    const char *saved_estimator = json_is_string(estimator) ? json_string_value(estimator) : "gae";
    long saved_samples = json_object_get(state, "samples_per_prompt") ? (long)number(state, "samples_per_prompt") : 1;
    if (rc == 0 && (strcmp(saved_estimator, advantage_estimator_name(p->c.estimator)) ||
                    saved_samples != p->c.samples_per_prompt))
        rc = err_set("checkpoint was made with --advantage-estimator %s --samples-per-prompt %ld, this run has %s and %d (%s)",
                     saved_estimator, saved_samples, advantage_estimator_name(p->c.estimator), p->c.samples_per_prompt,
                     checkpoint);
    if (rc == 0 && ((long)number(state, "actor_lora_rank") != p->actor.lora.rank ||
                    (long)number(state, "critic_lora_rank") != (p->has_critic ? p->critic.lora.rank : 0)))
        rc = err_set("checkpoint was made with --actor-lora-rank %ld --critic-lora-rank %ld, this run has %d and %d (%s)",
                     (long)number(state, "actor_lora_rank"), (long)number(state, "critic_lora_rank"), p->actor.lora.rank,
                     p->has_critic ? p->critic.lora.rank : 0, checkpoint);
    // The adapters belong to the base they were trained on (checkpoints from before QLoRA in
    // PPO have float32 bases).
    const char *saved_quantize[2];
    for (int i = 0; i < 2; i++) {
        json_t *q = json_object_get(state, i == 0 ? "actor_quantize" : "critic_quantize");
        saved_quantize[i] = json_is_string(q) ? json_string_value(q) : "none";
    }
    const char *this_quantize[2] = {model_quantize_name(&p->actor),
                                    p->has_critic ? model_quantize_name(&p->critic) : "none"};
    if (rc == 0 && (strcmp(saved_quantize[0], this_quantize[0]) || strcmp(saved_quantize[1], this_quantize[1])))
        rc = err_set("checkpoint was made with --actor-quantize %s --critic-quantize %s, this run has %s and %s (%s)",
                     saved_quantize[0], saved_quantize[1], this_quantize[0], this_quantize[1], checkpoint);
    // The PTX cursor counts rows: packed otherwise, they are other rows.
    json_t *saved_packing = json_object_get(state, "ptx_packing");
    const char *saved_ptx_packing = json_is_string(saved_packing) ? json_string_value(saved_packing) : "none";
    if (rc == 0 && strcmp(saved_ptx_packing, ptx_packing_name(&p->c)) != 0)
        rc = err_set("checkpoint was made with --ptx-packing %s, this run has %s (%s): other PTX rows", saved_ptx_packing,
                     ptx_packing_name(&p->c), checkpoint);
    if (rc == 0) rc = checkpoint_check_batch_invariant(state, p->actor.ops, checkpoint);
    if (rc == 0) rc = reference_sync_check_state(&p->reference_sync, state, checkpoint);
    char *actor_dir = checkpoint_model_dir(checkpoint, "actor"), *critic_dir = checkpoint_model_dir(checkpoint, "critic");
    char *ema_dir = checkpoint_model_dir(checkpoint, "actor_ema");
    char *reference_dir = checkpoint_model_dir(checkpoint, REFERENCE_SYNC_FOLDER);
    if (rc == 0) rc = model_reload_weights(&p->actor, actor_dir, load_range(p));
    if (rc == 0 && p->has_critic) rc = model_reload_weights(&p->critic, critic_dir, load_range(p));
    if (rc == 0 && p->c.ema) rc = model_reload_weights(&p->ema, ema_dir, load_range(p));
    if (rc == 0 && p->reference_sync.model) rc = model_reload_weights(&p->reference, reference_dir, load_range(p));
    if (rc == 0) rc = checkpoint_load_optimizer(checkpoint, "actor", &p->actor, &p->actor_optimizer);
    if (rc == 0 && p->has_critic) rc = checkpoint_load_optimizer(checkpoint, "critic", &p->critic, &p->critic_optimizer);
    if (rc == 0) {
        p->iteration = (long)number(state, "iteration");
        p->epoch = (long)number(state, "epoch");
        p->cursor = (long)number(state, "cursor");
        p->optimizer_steps = (long)number(state, "optimizer_steps");
        // Checkpoints from before the critic's warm-up: the actor took every step.
        const json_t *actor_steps = json_object_get(state, "actor_optimizer_steps");
        p->actor_steps = json_is_integer(actor_steps) ? (long)json_integer_value(actor_steps) : p->optimizer_steps;
        p->kl_coef = number(state, "kl_coef");
        p->reward_count = number(state, "reward_count");
        p->reward_mean = number(state, "reward_mean");
        p->reward_m2 = number(state, "reward_m2");
        // Checkpoints from before adaptive entropy control have neither: the run's own start.
        const json_t *coef = json_object_get(state, "entropy_coef"), *last = json_object_get(state, "last_trained_entropy");
        if (json_is_number(coef)) p->entropy_coef = json_number_value(coef);
        p->last_trained_entropy = json_is_number(last) ? json_number_value(last) : INFINITY;
        p->ptx_cursor = (long)number(state, "ptx_cursor");
        // A checkpoint from before the alarms has no baseline: the next iteration becomes it.
        json_t *first = json_object_get(state, "hacking_first");
        p->has_hacking_first = first && hacking_signals_from_json(first, &p->hacking_first);
        p->hacking_active = p->has_hacking_first ? (unsigned)number(state, "hacking_active") : 0;
        if (!p->c.quiet) fprintf(stderr, "resuming from %s (iteration %ld)\n", checkpoint, p->iteration);
    }
    free(actor_dir), free(critic_dir), free(ema_dir), free(reference_dir), free(checkpoint);
    json_decref(state);
    return rc;
}

// ---------------------------------------------------------------------------------------
// Reward-hacking alarms (rl/hacking_signals.h)

// The signals of the iteration's kept responses (every rank's, gathered), the alarms against
// the first iteration's, and a warning line from rank 0 when one starts or ends. No response
// kept: the signals are unknown (NAN) and the alarms stay as they were.
static int compare_doubles(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

// The reward model's statistics (train/rm.h's REWARD_STATS_FILE, when its folder has one):
// the reward-range alarm's limit, the --alarm-score-quantile of the scores of its data's
// preferred answers (the nearest rank: the ceil(q n)-th smallest). A file that does not read
// as the reward-model command writes it is an error naming it.
static int load_reward_range(Ppo *p) {
    if (!(p->c.alarm_score_quantile > 0) || !p->has_reward_model || !fs_is_dir(p->c.reward_path)) return 0;
    char *path = fs_join(p->c.reward_path, REWARD_STATS_FILE);
    if (!fs_is_file(path)) {
        free(path);
        return 0;
    }
    json_error_t error;
    json_t *stats = json_load_file(path, 0, &error);
    json_t *chosen = stats ? json_object_get(stats, "chosen") : NULL;
    size_t n = json_array_size(chosen);
    double *scores = xmalloc((n + 1) * sizeof(double));
    bool ok = json_is_array(chosen);
    for (size_t i = 0; ok && i < n; i++) {
        ok = json_is_number(json_array_get(chosen, i));
        if (ok) scores[i] = json_number_value(json_array_get(chosen, i));
    }
    int rc = 0;
    if (!stats) rc = err_set("%s (%s:%d)", error.text, path, error.line);
    else if (!ok) rc = err_set("\"chosen\" must be a list of numbers (%s)", path);
    if (rc == 0 && n > 0) { // none: every example was cut at the reward model's --max-seq-len, no alarm
        qsort(scores, n, sizeof(double), compare_doubles);
        size_t rank = (size_t)ceil(p->c.alarm_score_quantile * (double)n);
        p->reward_range_limit = scores[(rank > 0 ? rank : 1) - 1];
        p->reward_stats_path = path, path = NULL;
    }
    free(path), free(scores);
    json_decref(stats);
    return rc;
}

// HACKING_REWARD_RANGE's warning phrase.
static void reward_range_describe(const Ppo *p, double mean_raw_score, char *text, size_t size) {
    snprintf(text, size,
             "mean reward-model score %.4g, %s the %.3g quantile of its scores of the preferred answers of its own data, "
             "%.4g (%s; --alarm-score-quantile %g)",
             mean_raw_score, mean_raw_score > p->reward_range_limit ? "above" : "back under", p->c.alarm_score_quantile,
             p->reward_range_limit, p->reward_stats_path, p->c.alarm_score_quantile);
}

static void watch_for_hacking(Ppo *p, const Rollout *r, double mean_raw_score, HackingSignals *now) {
    if (r->count == 0) {
        *now = (HackingSignals){NAN, NAN, NAN, NAN, NAN};
        return;
    }
    const long width = p->c.max_new_tokens;
    int *gathered = xcalloc((size_t)(r->count * width + 1), sizeof(int));
    const int **responses = xmalloc((size_t)r->count * sizeof(int *));
    for (int q = 0; q < r->count; q++) {
        CHECK(r->lengths[q] <= width, "a response of %d tokens past --max-new-tokens %ld", r->lengths[q], width);
        if (r->local[q]) memcpy(gathered + q * width, r->local[q]->response, (size_t)r->lengths[q] * sizeof(int));
        responses[q] = gathered + q * width;
    }
    dist_sum_ints(gathered, r->count * width);
    hacking_signals_measure(responses, r->lengths, r->groups, r->count, now);
    free(responses), free(gathered);
    if (!p->has_hacking_first) p->hacking_first = *now, p->has_hacking_first = true;
    unsigned alarms = hacking_alarms(&p->hacking_first, now, &p->c.hacking);
    if (isfinite(p->reward_range_limit) && mean_raw_score > p->reward_range_limit) alarms |= HACKING_REWARD_RANGE;
    for (unsigned bit = 1; bit < 1u << HACKING_ALARM_COUNT; bit <<= 1) {
        const bool on = alarms & bit, was_on = p->hacking_active & bit;
        if (on == was_on || !dist_is_main()) continue;
        char text[640];
        if (bit == HACKING_REWARD_RANGE) reward_range_describe(p, mean_raw_score, text, sizeof text);
        else hacking_alarm_describe(bit, &p->hacking_first, now, &p->c.hacking, text, sizeof text);
        fprintf(stderr, on ? "\nppo: warning: iteration %ld: possible reward hacking or collapse: %s\n"
                           : "\nppo: iteration %ld: back within the alarm's limit: %s\n",
                p->iteration + 1, text);
    }
    p->hacking_active = alarms;
}

// Rank 0's line when --stop-on-alarm ends the run: where it stopped and what is left to
// resume from (the alarms' own warning lines came just before it).
static void report_stop_on_alarm(const Ppo *p) {
    if (!dist_is_main()) return;
    char *checkpoint = checkpoint_latest(p->c.run_dir);
    fprintf(stderr,
            "ppo: stopped at iteration %ld by --stop-on-alarm (%d alarm%s on): its responses were not trained on and "
            "no final model was written; %s%s\n",
            p->iteration + 1, __builtin_popcount(p->hacking_active), __builtin_popcount(p->hacking_active) == 1 ? "" : "s",
            checkpoint ? "--resume continues from " : "no checkpoint was saved before it (--save-every)",
            checkpoint ? checkpoint : "");
    free(checkpoint);
}

// ---------------------------------------------------------------------------------------
// The run

// A model that trains (the actor, the critic, the EMA), its base quantized as each tensor is
// read when `quantize` asks (QLoRA: adapters follow).
static int load_model(Model *model, const char *path, const OpsBackend *ops, bool lm_head, bool value_head,
                      bool require_value_head, uint64_t seed, const char *quantize, ModelKeepRange keep_range) {
    ModelLoadOptions options = {.with_lm_head = lm_head, .with_value_head = value_head,
                                .require_value_head = require_value_head, .seed = seed, .quantize = quantize,
                                .keep_range = keep_range};
    return model_load(model, path, ops, &options);
}

// A frozen model (the reference or the reward model), in 8 bits when asked, with its saved
// adapter when given. Under ZeRO-3 a float32 one is sharded as the actor is: each rank loads
// its shard of the layers and gathers each layer as a forward runs it; its saved adapter,
// whole on every rank, is read after the start (read_saved_adapters), as the actor's is.
static int load_frozen_model(Ppo *p, Model *model, const char *path, const OpsBackend *ops, bool lm_head,
                             bool value_head, const char *quantize, const char *adapter, uint64_t seed) {
    bool sharded = load_range(p) && !quantize_requested(quantize);
    if (sharded && adapter) {
        // An adapter trained over a quantized base (QLoRA) goes on that base, whole
        // (model_load_with_adapter quantizes it as the adapter's file says).
        char base_quantize[16];
        if (lora_read_adapter_base_quantize(adapter, base_quantize) != 0) return -1;
        sharded = !quantize_requested(base_quantize);
    }
    ModelLoadOptions options = {.with_lm_head = lm_head, .with_value_head = value_head,
                                .require_value_head = value_head, .quantize = quantize,
                                .keep_range = sharded ? load_range(p) : NULL};
    if (sharded && adapter) {
        if (model_load(model, path, ops, &options) != 0) return -1;
        if (model_add_lora_of_adapter(model, adapter, false, seed) != 0) {
            model_free(model);
            return -1;
        }
    } else if (model_load_with_adapter(model, path, ops, &options, adapter, seed) != 0) {
        return -1;
    }
    if (sharded) dist_weights_shard_frozen(model);
    return 0;
}

// End-of-turn tokens of chat formats stop a response as EOS does.
static void collect_stop_tokens(Ppo *p) {
    static const char *pieces[] = {"<|im_end|>", "<|eot_id|>", "<end_of_turn>", "<|end|>"};
    int eos = tokenizer_eos_id(p->tokenizer);
    if (eos >= 0) p->stop_tokens[p->num_stop_tokens++] = eos;
    for (size_t i = 0; i < sizeof pieces / sizeof pieces[0]; i++) {
        int id = tokenizer_piece_to_id(p->tokenizer, pieces[i]);
        if (id >= 0 && id != eos && tokenizer_is_special(p->tokenizer, id)) p->stop_tokens[p->num_stop_tokens++] = id;
    }
}

// Fresh adapters of `lora`, or the saved ones of `adapter`; nothing when lora->rank is 0.
// Under ZeRO-3 a saved adapter is only shaped here and read once the models have started
// (read_saved_adapters): its file is checked against the sharded base's fingerprint, which
// the start takes.
static int add_adapters(const Ppo *p, Model *model, const LoraConfig *lora, const char *adapter, bool value_head,
                        uint64_t seed) {
    if (lora->rank == 0) return 0;
    int rc = !adapter        ? model_add_lora(model, lora, value_head, seed)
             : load_range(p) ? model_add_lora_of_adapter(model, adapter, value_head, seed)
                             : model_load_lora_adapter(model, adapter, value_head, seed);
    // PPO trains without LoRA dropout (docs/lora.md), whatever a loaded adapter's file says;
    // the adapters it saves say so.
    model->lora.dropout = 0;
    return rc;
}

// The saved adapters add_adapters and load_frozen_model left unread under ZeRO-3, read on every
// rank (they are whole on each) after the models' start.
static int read_saved_adapters(Ppo *p) {
    const PpoConfig *c = &p->c;
    if (!load_range(p)) return 0;
    int rc = 0;
    if (c->actor_lora.rank > 0 && c->actor_lora_adapter) {
        rc = lora_read_adapter(&p->actor, c->actor_lora_adapter);
        if (rc == 0 && c->ema) rc = lora_read_adapter(&p->ema, c->actor_lora_adapter);
        // The reference made of the actor's start: its base with the saved adapter, sharded.
        if (rc == 0 && !p->reference_is_actor_base && !c->reference_path && dist_weights_sharded(&p->reference))
            rc = lora_read_adapter(&p->reference, c->actor_lora_adapter);
    }
    if (rc == 0 && p->has_critic && c->critic_lora.rank > 0 && c->critic_lora_adapter)
        rc = lora_read_adapter(&p->critic, c->critic_lora_adapter);
    if (dist_any_failed(rc != 0)) return rc != 0 ? -1 : err_set("another rank could not read a LoRA adapter");
    return 0;
}

// Each model's activations for the largest batch it will see, made once here. Reserved as
// each batch came, they were freed and made again whenever a row was longer than any
// before (at every layout's size, every layer's set) and, for the actor, twice an
// iteration between generation's layout and training's: on a CPU the new memory's first
// touch was ~2 s of a SmolLM2 iteration's ~28 (docs/benchmarks.md), on a GPU a free that
// waits for the device. Made here, the peak is reached before the first iteration (an
// out-of-memory shows then, not hours in), and generation runs in the actor's training
// layout: whole when that has the slots of its prefill (model_reserve_cached), else
// prefilled in chunks of rows that fit it (gen/generate.c, model_cached_rows_fitting).
static void reserve_activations(Ppo *p) {
    const PpoConfig *c = &p->c;
    int longest_prompt = longest_length(p->prompts.lengths, p->prompts.count);
    const int eval_longest = longest_length(p->eval_prompts.lengths, p->eval_prompts.count);
    if (eval_longest > longest_prompt) longest_prompt = eval_longest;
    // A row is its prompt and response, and stops at the actor's context (gen/generate.h);
    // a PTX row is cut as long as a rollout can be.
    const int context = p->actor.config.max_position_embeddings;
    int longest_row = longest_prompt + c->max_new_tokens < context ? longest_prompt + c->max_new_tokens : context;
    const int ptx_longest = tokenized_longest(&p->ptx);
    if (ptx_longest > longest_row) longest_row = ptx_longest;
    // Generation's batch first: the actor's training layout then keeps its rows.
    model_reserve_cached(&p->actor, c->generation_batch, longest_prompt);
    model_reserve(&p->actor, c->micro_batch, longest_row);
    if (!p->reference_is_actor_base) model_reserve(&p->reference, c->micro_batch, longest_row);
    if (p->has_critic) model_reserve(&p->critic, c->micro_batch, longest_row);
    if (p->has_reward_model) model_reserve(&p->reward, c->micro_batch, longest_row);
}

static int setup(Ppo *p) {
    const PpoConfig *c = &p->c;
    const OpsBackend *ops = ops_backend_by_name(c->device);
    if (!ops) return -1;
    if (tokenizer_load(&p->tokenizer, c->actor_path) != 0) return -1;
    p->reward_range_limit = NAN; // load_reward_range sets it when the reward model's folder has statistics
    // The reward model, the critic and the reference read the actor's token ids: a model with
    // another tokenizer would score other text than the actor wrote (trl#2523), or read past
    // its embedding table.
    if (ppo_uses_reward(c, REWARD_MODEL) && c->reward_path &&
        tokenizer_check_same_ids(p->tokenizer, c->reward_path, "--reward-model",
                                 "PPO hands the reward model the actor's token ids; train it from the actor's SFT "
                                 "model, or serve it (marlhf serve --reward-model) and score over --reward remote, "
                                 "which sends text") != 0)
        return -1;
    if (c->estimator == ESTIMATOR_GAE && c->critic_path &&
        tokenizer_check_same_ids(p->tokenizer, c->critic_path, "--critic-model", "the critic reads the actor's token ids") != 0)
        return -1;
    if (c->reference_path &&
        tokenizer_check_same_ids(p->tokenizer, c->reference_path, "--reference-model",
                                 "the reference's log-probs are of the actor's token ids") != 0)
        return -1;
    collect_stop_tokens(p);
    // The actor's context bounds the prompts and the PTX rows (generation stops a row there).
    ModelConfig actor_config;
    if (model_read_config(&actor_config, c->actor_path) != 0) return -1;
    const int actor_context = actor_config.max_position_embeddings;
    for (int i = 0; i < c->sampler.logit_bias_count; i++)
        if (c->sampler.logit_bias[i].token >= actor_config.vocab_size)
            return err_set("option --logit-bias: token %d is not in the actor's vocabulary of %d",
                           c->sampler.logit_bias[i].token, actor_config.vocab_size);
    if (load_prompts(c, c->prompts_path, true, p->tokenizer, actor_context, &p->prompts) != 0) return -1;
    if (c->eval_prompts_path &&
        load_prompts(c, c->eval_prompts_path, false, p->tokenizer, actor_context, &p->eval_prompts) != 0)
        return -1;
    if (c->chat_template && !p->prompts.conversational)
        return err_set("--chat-template renders conversational prompts (lists of messages), and %s holds text rows "
                       "(--chat-template)", c->prompts_path);
    if (c->eval_prompts_path && p->eval_prompts.conversational != p->prompts.conversational)
        return err_set("%s holds %s but %s does not: both are tokenized alike (--eval-prompts)", c->eval_prompts_path,
                       p->eval_prompts.conversational ? "lists of messages" : "text prompts", c->prompts_path);
    if (c->lexicon_path && lexicon_load(&p->lexicon, c->lexicon_path) != 0) return -1;
    if (ppo_uses_reward(c, REWARD_LEXICON) && !p->lexicon) return err_set("--reward lexicon needs --gold-lexicon FILE");
    if (ppo_uses_reward(c, REWARD_COMMAND) &&
        command_reward_start(&p->reward_command, c->reward_command, c->reward_timeout_seconds) != 0)
        return -1;
    if (ppo_uses_reward(c, REWARD_REMOTE)) {
        if (!c->reward_url) return err_set("--reward remote needs --reward-url URL");
        if (remote_reward_open(&p->reward_remote, c->reward_url, c->reward_timeout_seconds, c->reward_retries) != 0) return -1;
    }
    if (c->ptx_path) {
        Dataset data;
        if (dataset_load(&data, c->ptx_path, DATA_FORMAT_AUTO, 0) != 0) return -1;
        if (data.conversational != p->prompts.conversational) {
            dataset_free(&data);
            return err_set("%s holds %s but %s does not: both are tokenized alike (--ptx-data)", c->ptx_path,
                           data.conversational ? "lists of messages" : "text rows", c->prompts_path);
        }
        if (dataset_render_chat(&data, p->tokenizer, c->actor_path, c->chat_template) != 0) {
            dataset_free(&data);
            return -1;
        }
        SftExample *examples = xcalloc(data.count + 1, sizeof *examples);
        for (long i = 0; i < data.count; i++)
            examples[i] = (SftExample){.prompt = data.records[i].prompt,
                                       .response = data.records[i].chosen ? data.records[i].chosen : ""};
        // PTX rows are cut as long as a rollout can be, and no longer than the actor's context.
        const int longest = c->max_prompt_len + c->max_new_tokens < actor_context ? c->max_prompt_len + c->max_new_tokens
                                                                                  : actor_context;
        // Language-modeling {"text"} rows train every token (unpacked the same as their
        // completion: the text after BOS); packed into one stream, the BOS of each text too, as
        // DeepSpeed-Chat's group_texts labels every token.
        const SftLossTokens loss_tokens = dataset_text_rows_only(&data) ? SFT_LOSS_SEQUENCE : SFT_LOSS_COMPLETION;
        SftTask sft;
        int rc = c->ptx_packing >= 0 ? sft_task_init_packed(&sft, p->tokenizer, examples, data.count, NULL, 0, longest,
                                                            loss_tokens, (PackingStrategy)c->ptx_packing, false)
                                     : sft_task_init(&sft, p->tokenizer, examples, data.count, NULL, 0, longest,
                                                     loss_tokens);
        free(examples);
        dataset_free(&data);
        if (rc != 0) return -1;
        p->ptx = sft.train; // keep the tokenized examples, drop the (empty) rest
        tokenized_examples_free(&sft.eval);
    }
    // QLoRA needs the model's adapters (a quantized base cannot train in full); checked here
    // too for callers other than the command line.
    if (quantize_requested(c->actor_quantize) && c->actor_lora.rank == 0)
        return err_set("--actor-quantize %s needs --actor-lora-rank or --actor-lora-adapter: a quantized base is "
                       "frozen", c->actor_quantize);
    if (c->old_logprobs_from_rollout && c->recompute_old_logprobs)
        return err_set("--old-logprobs-from-rollout and --recompute-old-logprobs name two sources of the old log-probs: "
                       "give one");
    if (c->old_logprobs_from_rollout && quantize_requested(c->actor_quantize))
        return err_set("--old-logprobs-from-rollout needs a float actor: a quantized base (--actor-quantize %s) decodes "
                       "with other kernels than it trains with", c->actor_quantize);
    if (quantize_requested(c->critic_quantize) && (c->critic_lora.rank == 0 || c->estimator != ESTIMATOR_GAE))
        return err_set("--critic-quantize %s needs a critic with --critic-lora-rank or --critic-lora-adapter",
                       c->critic_quantize);
    const char *actor_quantize = quantize_requested(c->actor_quantize) ? c->actor_quantize : "none";
    if (load_model(&p->actor, c->actor_path, ops, true, false, false, 0, actor_quantize, load_range(p)) != 0) return -1;
    if (add_adapters(p, &p->actor, &c->actor_lora, c->actor_lora_adapter, false, c->seed) != 0) return -1;
    // Fresh actor adapters leave the base as the policy PPO starts from: the reference. A
    // saved adapter is part of the starting policy, so the reference carries it too. Over a
    // quantized base (--actor-quantize) the reference is that quantized base with the
    // adapters off, as PEFT's disable_adapter() gives TRL's QLoRA PPO.
    p->reference_is_actor_base = c->actor_lora.rank > 0 && !c->reference_path && !c->actor_lora_adapter;
    // A reference made from the actor's start takes the actor's quantization unless told
    // otherwise: its first KL is then 0, as with float32 weights.
    const char *reference_quantize = c->reference_quantize ? c->reference_quantize
                                     : c->reference_path   ? "none"
                                                           : actor_quantize;
    if (p->reference_is_actor_base && c->reference_quantize && strcmp(reference_quantize, actor_quantize))
        return err_set("--reference-quantize %s: the reference is the actor's own base (actor LoRA without "
                       "--reference-model), whose weights are %s (--actor-quantize)", reference_quantize,
                       actor_quantize);
    if (!p->reference_is_actor_base &&
        load_frozen_model(p, &p->reference, c->reference_path ? c->reference_path : c->actor_path, ops, true, false,
                          reference_quantize, c->reference_path ? NULL : c->actor_lora_adapter, c->seed) != 0)
        return -1;
    // A quantized reference multiplies as the trained actor does (the dequantized weights at
    // any micro-batch size): made from the actor's start over the same quantized base, its
    // log-probs are then the actor's own before the first step (KL 0).
    if (!p->reference_is_actor_base) p->reference.dequantized_matmuls = true;
    const char *critic_path = c->critic_path ? c->critic_path : c->reward_path;
    p->has_critic = c->estimator == ESTIMATOR_GAE;
    if (ppo_uses_reward(c, REWARD_MODEL)) {
        if (!c->reward_path) return err_set("missing --reward-model (or choose --reward lexicon|code)");
        if (load_frozen_model(p, &p->reward, c->reward_path, ops, false, true, c->reward_quantize, NULL, 0) != 0) return -1;
        p->has_reward_model = true;
        // The reward-range alarm holds the score to the reward model's own: not a sum of sources.
        if (c->reward_count == 1 && load_reward_range(p) != 0) return -1;
    }
    // The critic starts from the reward model (DeepSpeed-Chat, OpenRLHF); without one, from
    // the actor with a fresh value head.
    if (!p->has_critic) {
        // nothing: the group of responses is the baseline
    } else if (load_model(&p->critic, critic_path ? critic_path : c->actor_path, ops, false, true, false, c->seed,
                          c->critic_quantize, load_range(p)) != 0) {
        return -1;
    }
    if (p->has_critic && add_adapters(p, &p->critic, &c->critic_lora, c->critic_lora_adapter, true, c->seed + 1) != 0)
        return -1;
    if (!p->reference_is_actor_base && p->reference.config.vocab_size != p->actor.config.vocab_size)
        return err_set("the reference and the actor have different vocabularies");
    if (c->ema && load_model(&p->ema, c->actor_path, ops, true, false, false, 0, actor_quantize, load_range(p)) != 0)
        return -1;
    // The EMA starts as the actor: same (quantized) base, same initial adapters.
    if (c->ema && add_adapters(p, &p->ema, &c->actor_lora, c->actor_lora_adapter, false, c->seed) != 0) return -1;
    for (int i = 0; i < 1 + p->has_critic && !c->quiet; i++) {
        const Model *model = i == 0 ? &p->actor : &p->critic;
        if (model->lora.rank == 0) continue;
        char line[256];
        lora_describe(model, line, sizeof line);
        const char *quantize = model_quantize_name(model);
        fprintf(stderr, "ppo: %s LoRA %s%s%s%s\n", i == 0 ? "actor" : "critic", line,
                strcmp(quantize, "none") ? " over a base quantized as " : "", strcmp(quantize, "none") ? quantize : "",
                i == 0 && p->reference_is_actor_base ? "; the reference is the actor's base" : "");
    }
    p->actor.recompute = p->critic.recompute = c->gradient_checkpointing;
    model_enable_grad(&p->actor);
    if (p->has_critic) model_enable_grad(&p->critic);
    AdamWConfig adamw = {(float)c->beta1, (float)c->beta2, (float)c->eps, (float)c->weight_decay};
    dist_adamw_init(&p->actor_optimizer, &p->actor, adamw, c->zero_stage);
    if (p->has_critic) dist_adamw_init(&p->critic_optimizer, &p->critic, adamw, c->zero_stage);
    if (c->ema) dist_weights_shard_like(&p->ema, &p->actor); // ZeRO-3: the actor's shards
    // (cmd_ppo refused actor LoRA, whose reference is the actor's own base, and ZeRO-3.)
    CHECK(!(c->sync_ref_model && p->reference_is_actor_base), "--sync-ref-model with the actor's base as reference");
    if (c->sync_ref_model &&
        reference_sync_start(&p->reference_sync, &p->reference, &p->actor, c->ref_model_mixup_alpha,
                             c->ref_model_sync_steps, c->reference_path ? c->reference_path : c->actor_path,
                             c->actor_path) != 0)
        return -1;
    p->kl_coef = c->advantage.kl_coef;
    p->entropy_coef = c->entropy_coef;
    p->last_trained_entropy = INFINITY;
    reserve_activations(p);
    return 0;
}

static void teardown(Ppo *p) {
    free(p->first_eval_scores), free(p->first_eval_golds), free(p->reward_stats_path);
    dist_adamw_free(&p->actor_optimizer, &p->actor);
    model_free(&p->actor);
    if (p->has_critic) dist_adamw_free(&p->critic_optimizer, &p->critic), model_free(&p->critic);
    if (!p->reference_is_actor_base) dist_weights_free(&p->reference), model_free(&p->reference);
    if (p->has_reward_model) dist_weights_free(&p->reward), model_free(&p->reward);
    if (p->c.ema) dist_weights_free(&p->ema), model_free(&p->ema);
    free_prompts(&p->prompts), free_prompts(&p->eval_prompts);
    tokenized_examples_free(&p->ptx);
    if (p->lexicon) lexicon_free(p->lexicon);
    command_reward_stop(p->reward_command);
    remote_reward_close(p->reward_remote);
    tokenizer_free(p->tokenizer);
}

static int save_final(Ppo *p) {
    char *final_dir = fs_join(p->c.run_dir, "final");
    FsAtomicDir out;
    int rc = fs_atomic_dir_begin(&out, final_dir);
    free(final_dir);
    if (rc != 0) return -1;
    const struct {
        const char *name;
        Model *model;
        bool wanted;
    } parts[] = {{"actor", &p->actor, true}, {"critic", &p->critic, p->has_critic}, {"actor_ema", &p->ema, p->c.ema}};
    for (size_t i = 0; i < 3 && rc == 0; i++) {
        if (!parts[i].wanted) continue;
        char *dir = fs_join(out.tmp_path, parts[i].name);
        rc = fs_mkdir_p(dir);
        if (rc == 0) rc = model_write_hf_files(parts[i].model, dir);
        if (rc == 0) rc = tokenizer_write_hf(p->tokenizer, dir);
        free(dir);
    }
    if (rc != 0) {
        fs_atomic_dir_abort(&out);
        return -1;
    }
    return fs_atomic_dir_commit(&out);
}

// The row ids (random streams) of generation round `round` of an iteration of `rows` rows:
// round 0 takes iteration * rows + b, as every run without refills always has; refill
// rounds take ids from 2^62 up, which round 0 never reaches.
static uint64_t round_row_id_base(long iteration, int round, long rows) {
    if (round == 0) return (uint64_t)iteration * (uint64_t)rows;
    return (1ULL << 62) + ((uint64_t)iteration * PPO_MAX_GENERATION_ROUNDS + (uint64_t)round) * (uint64_t)rows;
}

int ppo_run(const PpoConfig *config) {
    Ppo *p = xcalloc(1, sizeof(Ppo));
    p->c = *config;
    // Data parallel (dist/dist.h): rank r generates and trains on rows r, r + W, ... of each
    // iteration's rollout batch; rank 0 alone evaluates, speaks and writes.
    const int world = dist_world_size(), rank = dist_rank();
    if (!dist_is_main()) p->c.quiet = true;
    int rc = setup(p);
    // An iteration takes rollout_batch prompts and answers each samples_per_prompt times:
    // row b of the iteration answers its prompt b / samples_per_prompt.
    const long prompts_per_iteration = p->c.rollout_batch, group = p->c.samples_per_prompt;
    const long per_iteration = prompts_per_iteration * group;
    long total_iterations = 0;
    if (rc == 0) {
        total_iterations = (p->prompts.count * p->c.epochs + prompts_per_iteration - 1) / prompts_per_iteration;
        if (p->c.max_iterations > 0 && p->c.max_iterations < total_iterations) total_iterations = p->c.max_iterations;
        const long steps_per_iteration = (long)p->c.ppo_epochs * p->c.minibatches;
        const long total_steps = total_iterations * steps_per_iteration;
        // The actor's schedule runs over the iterations after the critic's warm-up.
        const long frozen = p->c.critic_warmup_iterations < total_iterations ? p->c.critic_warmup_iterations
                                                                            : total_iterations;
        const long actor_steps = total_steps - frozen * steps_per_iteration;
        p->actor_schedule = (LrSchedule){(LrScheduleKind)p->c.schedule, (float)p->c.actor_lr,
                                         lr_warmup_steps_from_ratio(p->c.warmup_ratio, actor_steps), actor_steps};
        p->critic_schedule = (LrSchedule){(LrScheduleKind)p->c.schedule, (float)p->c.critic_lr,
                                          lr_warmup_steps_from_ratio(p->c.warmup_ratio, total_steps), total_steps};
        // Every rank starts from rank 0's trainable weights; under ZeRO-3 each keeps its
        // shard of the actor's, critic's and EMA's layers from here (and a LoRA model's base
        // fingerprint, which a resume checks its adapters against, is taken).
        dist_weights_start(&p->actor);
        if (p->has_critic) dist_weights_start(&p->critic);
        if (p->c.ema) dist_weights_start(&p->ema);
        // The frozen models are the same files everywhere: only sharded ones need a start.
        if (dist_weights_sharded(&p->reference)) dist_weights_start(&p->reference);
        if (dist_weights_sharded(&p->reward)) dist_weights_start(&p->reward);
        rc = read_saved_adapters(p);
        if (rc == 0 && p->c.resume) rc = resume(p);
        // A resumed run's weights are rank 0's everywhere too (every rank asks, so the
        // collectives match whether or not this rank found a checkpoint).
        if (rc == 0 && p->c.resume) {
            dist_weights_start(&p->actor);
            if (p->has_critic) dist_weights_start(&p->critic);
            if (p->c.ema) dist_weights_start(&p->ema);
        }
    }
    if (rc == 0) {
        bool failed = false;
        if (dist_is_main()) failed = metrics_open(&p->metrics, p->c.run_dir, p->c.resume ? p->iteration : -1) != 0;
        else metrics_open_none(&p->metrics);
        if (dist_any_failed(failed)) rc = failed ? -1 : err_set("rank 0 could not open the metrics of %s", p->c.run_dir);
    }
    if (rc != 0) {
        teardown(p);
        free(p);
        return -1;
    }
    if (!p->c.quiet)
        fprintf(stderr, "ppo: %ld prompts (%ld longer than %d tokens dropped), %ld iterations of %ld rollouts, "
                        "termination %s, advantages %s\n", p->prompts.count, p->prompts.dropped, p->c.max_prompt_len,
                total_iterations, per_iteration, macro_termination_name(p->c.macro.condition),
                advantage_estimator_name(p->c.estimator));
    // The SFT model's scores, for comparison.
    if (p->iteration == 0 && evaluate_on_main(p, false))
        rc = dist_is_main() ? -1 : err_set("rank 0's evaluation failed");
    long *order = xmalloc(p->prompts.count * sizeof(long));
    long order_epoch = -1;
    Progress progress;
    progress_start(&progress, "ppo", total_iterations, "iterations");
    progress.done = p->iteration;
    progress.quiet = p->c.quiet;
    const long local_rows = per_iteration / world + (rank < per_iteration % world);
    bool stopped_by_alarm = false;
    while (rc == 0 && p->iteration < total_iterations) {
        // Generation rounds. Each takes the next rollout_batch prompts of the epoch's order,
        // answers each samples_per_prompt times, drops the responses too short to learn from
        // (released: an immediate EOS) and scores the rest. With --filter-groups the groups
        // whose scores are all equal are left out (DAPO's dynamic sampling), and further rounds
        // refill the batch until it holds rollout_batch groups (extra groups are discarded, as
        // in verl) or --max-generation-rounds is reached (then it trains on fewer).
        double time_generation = 0, time_experience = 0;
        GenerateStats gen = {0};
        RolloutStats rs = {0};
        TrainStats ts = {0};
        Rollout kept = rollout_new(per_iteration);
        Sample **round_samples = xcalloc(p->c.max_generation_rounds, sizeof(Sample *));
        int rounds = 0, uniform_groups = 0;
        long kept_groups = 0, dropped_short = 0;
        for (;;) {
            double g0 = now_seconds();
            long *chosen = xmalloc(prompts_per_iteration * sizeof(long));
            for (long b = 0; b < prompts_per_iteration; b++) {
                if (p->cursor >= p->prompts.count) p->epoch++, p->cursor = 0;
                if (order_epoch != p->epoch) {
                    train_epoch_order(p->c.seed, p->epoch, p->prompts.count, order);
                    order_epoch = p->epoch;
                }
                chosen[b] = order[p->cursor++];
            }
            // This rank's rows of the round: b = rank, rank + W, ...
            long *mine = xmalloc((local_rows + 1) * sizeof(long));
            for (long k = 0; k < local_rows; k++) mine[k] = chosen[(rank + k * world) / group];
            Sample *samples = round_samples[rounds] = xcalloc(local_rows + 1, sizeof(Sample));
            if (p->c.hybrid_engine) dist_weights_gather_all(&p->actor);
            rollout(p, &p->prompts, mine, local_rows, round_row_id_base(p->iteration, rounds, per_iteration),
                    (uint64_t)rank, (uint64_t)world, samples, &gen, NULL);
            dist_weights_drain(&p->actor); // ZeRO-3: the ranks' decode steps differ in number
            if (p->c.estimator == ESTIMATOR_REMAX && remax_baselines(p, mine, local_rows, samples, &gen) != 0) {
                rc = -1; // every rank: remax_baselines agreed on it
                if (p->c.hybrid_engine) dist_weights_reshard(&p->actor);
                free(chosen), free(mine);
                rounds++;
                break;
            }
            if (p->c.hybrid_engine) dist_weights_reshard(&p->actor);
            free(chosen), free(mine);
            double g1 = now_seconds();
            time_generation += g1 - g0;
            // Every rank learns every row's response length, and whether it was cut at
            // max_new_tokens (lengths[per_iteration + b]).
            double *lengths = xcalloc(2 * per_iteration, sizeof(double));
            for (long k = 0; k < local_rows; k++) {
                lengths[rank + k * world] = samples[k].response_length;
                lengths[per_iteration + rank + k * world] = cut_short(&samples[k]);
            }
            dist_sum_doubles(lengths, 2 * per_iteration);
            Rollout fresh = rollout_new(per_iteration);
            for (long b = 0; b < per_iteration; b++) {
                if (lengths[b] < p->c.min_response_tokens) {
                    dropped_short++;
                    continue;
                }
                fresh.groups[fresh.count] = (int)(rounds * prompts_per_iteration + b / group); // distinct across rounds
                fresh.lengths[fresh.count] = (int)lengths[b];
                fresh.truncated[fresh.count] = lengths[per_iteration + b] > 0;
                fresh.local[fresh.count++] = b % world == rank ? &samples[b / world] : NULL;
            }
            free(lengths);
            if (fresh.count > 0 && score_rollout(p, &fresh, &rs) != 0) {
                rc = -1; // every rank: score_rollout agreed on it
                rollout_free(&fresh);
                rounds++;
                break;
            }
            Rollout passed = fresh;
            if (p->c.filter_groups && fresh.count > 0) uniform_groups += drop_uniform_groups(&fresh, &passed);
            // Whole groups, in order, until the batch holds rollout_batch of them.
            for (int first = 0, last; first < passed.count && kept_groups < prompts_per_iteration; first = last) {
                last = group_end(passed.groups, passed.count, first);
                for (int q = first; q < last; q++) rollout_append(&kept, &passed, q);
                kept_groups++;
            }
            if (passed.lengths != fresh.lengths) rollout_free(&passed);
            rollout_free(&fresh);
            rounds++;
            time_experience += now_seconds() - g1;
            if (!p->c.filter_groups || kept_groups >= prompts_per_iteration || rounds >= p->c.max_generation_rounds) break;
        }
        if (rc != 0) goto end_iteration; // a reward command failed: free the iteration's samples, stop
        const int count = kept.count;
        HackingSignals hacking;
        watch_for_hacking(p, &kept, rs.scored > 0 ? rs.raw_score / rs.scored : NAN, &hacking);
        // --stop-on-alarm: these responses are not learned from. Every rank measured the same
        // gathered responses, so all of them stop here together.
        if (p->c.stop_on_alarm && p->hacking_active) {
            stopped_by_alarm = true;
            goto end_iteration;
        }
        // While the actor is frozen nothing trains it, so its log-probs and entropies come from
        // the experience pass.
        p->actor_frozen = p->iteration < p->c.critic_warmup_iterations;
        p->old_logprobs_from_training = !p->c.recompute_old_logprobs && p->c.ppo_epochs == 1 && p->c.minibatches == 1 &&
                                        p->kl_coef == 0 && !(p->c.kl_target > 0) && !p->actor_frozen;
        p->old_logprobs_from_rollout =
            p->c.old_logprobs_from_rollout && !p->old_logprobs_from_training && !p->actor_frozen;
        double e0 = now_seconds();
        if (count > 0) compute_experience(p, &kept, &rs);
        double t2 = now_seconds();
        time_experience += t2 - e0;
        if (count > 0) train_on_rollout(p, &kept, &ts);
        if (p->old_logprobs_from_training || p->old_logprobs_from_rollout) policy_stats_from_training(&kept, &rs);
        double t3 = now_seconds();
        // Adaptive KL controller (Ziegler et al. 2019): move beta toward the target KL.
        // No sample measured (all dropped or filtered): the KL and entropy are unknown (logged
        // null) and the controller holds.
        double kl = rs.policy_samples > 0 ? rs.kl_sequence / rs.policy_samples : NAN;
        if (p->c.kl_target > 0 && rs.policy_samples > 0) {
            double error = kl / p->c.kl_target - 1.0;
            if (error > 0.2) error = 0.2;
            if (error < -0.2) error = -0.2;
            p->kl_coef *= 1.0 + error * per_iteration / p->c.kl_horizon;
        }
        p->iteration++;
        double tokens = rs.kl_tokens > 0 ? rs.kl_tokens : 1, actor_tokens = ts.actor.tokens > 0 ? ts.actor.tokens : 1;
        double policy_tokens = rs.policy_tokens > 0 ? rs.policy_tokens : NAN;
        const char *names[] = {"score", "raw_score", "gold", "kl", "kl_per_token", "entropy", "response_length",
                               "stopped_fraction", "dropped", "value_loss", "policy_loss", "clip_fraction",
                               "approx_kl", "ratio", "advantage", "value", "macro_actions", "macro_action_length",
                               "parse_fallbacks", "kl_coef", "actor_lr", "critic_lr", "actor_grad_norm",
                               "critic_grad_norm", "time_generation", "time_experience", "time_training",
                               "generation_tokens_per_s", "uniform_groups_dropped", "old_logprobs_from_training",
                               "old_logprobs_from_rollout",
                               "generation_rounds", "responses_trained", "distinct_2", "repetitive_fraction",
                               "same_answer_fraction", "shared_trigram_fraction", "hacking_alarms", "ptx_loss",
                               "entropy_coef", "rollout_weight", "off_policy_masked",
                               "device_memory_gib"};
        double scored = rs.scored > 0 ? rs.scored : 1, steps = ts.steps > 0 ? ts.steps : 1;
        double experienced = rs.experienced > 0 ? rs.experienced : 1;
        // Generation throughput of the whole job: the ranks generate side by side.
        double generation_rate[1] = {gen.decode_seconds + gen.prefill_seconds > 0
                                         ? gen.generated_tokens / (gen.decode_seconds + gen.prefill_seconds) : 0};
        dist_sum_doubles(generation_rate, 1);
        // On a GPU, the most device memory the iteration's four models held (the largest
        // rank's; every rank has the same kind of device); the line leaves it out on the CPU.
        int device_mib = ops_take_device_memory_peak_mib(p->actor.ops);
        if (device_mib >= 0) dist_max_ints(&device_mib, 1);
        double values[] = {rs.score / scored, rs.raw_score / scored, rs.gold_count ? rs.gold / rs.gold_count : NAN, kl,
                           rs.kl_sequence / policy_tokens, rs.entropy / policy_tokens, rs.length / scored,
                           rs.stopped / scored, (double)dropped_short, ts.value_loss / steps, ts.policy_loss / steps,
                           ts.actor.clipped / actor_tokens, ts.actor.approx_kl / actor_tokens,
                           ts.actor.ratio_sum / actor_tokens, rs.advantage / tokens, rs.value / tokens,
                           rs.macro_actions / experienced, rs.macro_actions > 0 ? rs.kl_tokens / rs.macro_actions : 0,
                           rs.fallbacks,
                           p->kl_coef, lr_schedule_at(&p->actor_schedule, p->actor_steps > 0 ? p->actor_steps - 1 : 0),
                           lr_schedule_at(&p->critic_schedule, p->optimizer_steps > 0 ? p->optimizer_steps - 1 : 0),
                           ts.actor_grad_norm / steps, ts.critic_grad_norm / steps, time_generation, time_experience,
                           t3 - t2, generation_rate[0], (double)uniform_groups, (double)p->old_logprobs_from_training,
                           (double)p->old_logprobs_from_rollout,
                           (double)rounds, (double)count, hacking.distinct_2, hacking.repetitive_fraction,
                           hacking.same_answer_fraction, hacking.shared_trigram_fraction,
                           (double)__builtin_popcount(p->hacking_active), p->ptx.count > 0 ? ts.ptx_loss / steps : NAN,
                           p->entropy_coef,
                           p->c.loss.rollout_correction != ROLLOUT_CORRECTION_NONE ? ts.actor.rollout_weight_sum / actor_tokens : NAN,
                           p->c.loss.off_policy_mask ? ts.actor.off_policy_masked / actor_tokens : NAN,
                           device_mib / 1024.0};
        // The line: the figures above but the last (the device memory, on a GPU only), each reward
        // source's mean score (before its weight) where there are several, then the device memory.
        enum { FIGURES = sizeof values / sizeof values[0] };
        static const char *const reward_part_names[REWARD_KINDS] = {"reward_model", "reward_lexicon", "reward_code",
                                                                    "reward_command", "reward_remote"};
        const char *line_names[FIGURES + REWARD_KINDS + 3];
        double line_values[FIGURES + REWARD_KINDS + 3];
        int metric_count = 0;
        for (int k = 0; k < FIGURES - 1; k++) line_names[metric_count] = names[k], line_values[metric_count++] = values[k];
        for (int k = 0; k < p->c.reward_count && p->c.reward_count > 1; k++)
            line_names[metric_count] = reward_part_names[p->c.rewards[k]],
            line_values[metric_count++] = rs.reward_parts[k] / scored;
        if (p->c.estimator == ESTIMATOR_REMAX) // the mean score of the greedy answers
            line_names[metric_count] = "baseline_score", line_values[metric_count++] = rs.baseline / experienced;
        if (p->c.loss.policy_loss == POLICY_LOSS_CLIP_COV) // the fraction of tokens Clip-Cov left out (verl's pg_clipfrac)
            line_names[metric_count] = "clip_cov_left_out",
            line_values[metric_count++] = ts.actor.clip_cov_left_out / actor_tokens;
        if (device_mib >= 0)
            line_names[metric_count] = names[FIGURES - 1], line_values[metric_count++] = values[FIGURES - 1];
        // A frozen actor (--critic-warmup-iterations) took no step: its training figures are null.
        static const char *const actor_training_metrics[] = {"policy_loss", "clip_fraction", "approx_kl", "ratio",
                                                             "actor_lr", "actor_grad_norm", "rollout_weight",
                                                             "off_policy_masked", "clip_cov_left_out"};
        for (int k = 0; k < metric_count && p->actor_frozen; k++)
            for (size_t a = 0; a < sizeof actor_training_metrics / sizeof actor_training_metrics[0]; a++)
                if (!strcmp(line_names[k], actor_training_metrics[a])) line_values[k] = NAN;
        bool failed = metrics_log(&p->metrics, "train", p->iteration, line_names, line_values, metric_count) != 0;
    end_iteration:
        for (int round = 0; round < rounds; round++) {
            for (long k = 0; k < local_rows; k++) sample_free(&round_samples[round][k]);
            free(round_samples[round]);
        }
        free(round_samples);
        rollout_free(&kept);
        if (rc != 0 || stopped_by_alarm) break;
        char status[128];
        snprintf(status, sizeof status, "score %.3f, kl %.3f, len %.1f", values[0], kl, values[6]);
        progress_update(&progress, 1, status);
        bool last = p->iteration == total_iterations;
        // Rank 0's writes can fail; all ranks agree and stop together (before the next
        // collective, which the save's gather is).
        if (dist_any_failed(failed)) {
            rc = failed ? -1 : err_set("rank 0 could not write in %s", p->c.run_dir);
            break;
        }
        if ((p->c.eval_every > 0 && p->iteration % p->c.eval_every == 0) || last) {
            if (evaluate_on_main(p, last)) {
                rc = dist_is_main() ? -1 : err_set("rank 0's evaluation failed");
                break;
            }
        }
        if ((p->c.save_every > 0 && p->iteration % p->c.save_every == 0) || last) {
            failed = save(p) != 0;
            if (dist_any_failed(failed)) rc = failed ? -1 : err_set("rank 0 could not write in %s", p->c.run_dir);
        }
    }
    progress_finish(&progress, NULL);
    if (rc == 0 && world > 1 && !dist_weights_sharded(&p->actor)) {
        // Same gradients and steps everywhere keep the ranks' weights identical; a difference is a
        // bug. (Under ZeRO-3 each layer weight has one owner: nothing to compare.)
        CHECK(dist_all_equal(model_weights_fingerprint(&p->actor)) &&
                  (!p->has_critic || dist_all_equal(model_weights_fingerprint(&p->critic))),
              "ranks ended PPO with different weights");
    }
    if (rc == 0 && stopped_by_alarm) {
        report_stop_on_alarm(p);
        rc = PPO_STOPPED_BY_ALARM;
    }
    if (rc == 0 && dist_weights_sharded(&p->actor)) {
        // ZeRO-3: the final folder is rank 0's, with every weight gathered to it, once the
        // moments, which the run no longer needs, have given their memory back.
        adamw_free(&p->actor_optimizer);
        dist_weights_gather_to_main(&p->actor);
        if (p->has_critic) {
            adamw_free(&p->critic_optimizer);
            dist_weights_gather_to_main(&p->critic);
        }
        if (p->c.ema) dist_weights_gather_to_main(&p->ema);
    }
    if (rc == 0) {
        bool failed = dist_is_main() && save_final(p) != 0;
        if (dist_any_failed(failed)) rc = failed ? -1 : err_set("rank 0 could not write %s/final", p->c.run_dir);
    }
    free(order);
    metrics_close(&p->metrics);
    teardown(p);
    free(p);
    return rc;
}
