// Choosing the next token from a row of logits: greedy, or sampling with temperature,
// top-k, top-p and min-p, in that order (as transformers' logits processors apply them),
// after the penalties on tokens already seen (sampler_adjust_logits: transformers' repetition
// penalty, OpenAI's presence and frequency penalties, as vLLM applies them).
//
// The random number is given by the caller (gen/generate.c draws it from the counter-based
// RNG keyed by seed, row and step), so a row's tokens never depend on its batch.
#pragma once
#include <stdbool.h>
#include <stdint.h>

typedef struct {
    int token;
    float bias;
} SamplerLogitBias;

typedef struct {
    float temperature; // <= 0 means greedy
    int top_k;         // 0 = no top-k
    float top_p;       // applied when in (0, 1); 0 or >= 1 = no top-p
    // After top-p, only the tokens at least min_p times as likely as the most likely stay
    // (transformers' MinPLogitsWarper, llama.cpp's min_p). 0 = off.
    float min_p;
    // Tokens of the prompt or the answer so far: a logit x becomes x / penalty when positive,
    // x * penalty when not (transformers' repetition_penalty, llama.cpp's repeat_penalty over
    // the whole context, vLLM's). 0 or 1 = off.
    float repetition_penalty;
    // Tokens of the answer so far, each c times: the logit less frequency_penalty * c +
    // presence_penalty (OpenAI's, as vLLM applies them after the repetition penalty). 0 = off.
    float presence_penalty, frequency_penalty;
    // Added to the logits of these tokens after the penalties (OpenAI's logit_bias: -100 bans a
    // token, +100 all but forces it). The array is the caller's, alive while the config is used.
    const SamplerLogitBias *logit_bias;
    int logit_bias_count;
} SamplerConfig;

// Whether sampler_adjust_logits changes anything (then the row's logits must be on the host, and
// its token history given).
static inline bool sampler_adjusts_logits(const SamplerConfig *config) {
    return (config->repetition_penalty > 0.0f && config->repetition_penalty != 1.0f) ||
           config->presence_penalty != 0.0f || config->frequency_penalty != 0.0f || config->logit_bias_count > 0;
}

// What sampler_pick does with a row of V logits: keeps only the top_k largest (top_k in (0,
// V)); keeps the smallest set holding top_p of the mass; or, sampling, keeps every token
// (neither). Generation picks where the logits are by these (gen/generate.c, continuous.c).
static inline bool sampler_keeps_top_k(const SamplerConfig *config, int V) {
    return config->top_k > 0 && config->top_k < V;
}
static inline bool sampler_keeps_top_p(const SamplerConfig *config) {
    return config->top_p > 0.0f && config->top_p < 1.0f;
}
static inline bool sampler_keeps_min_p(const SamplerConfig *config) { return config->min_p > 0.0f; }
static inline bool sampler_samples_whole_row(const SamplerConfig *config, int V) {
    return config->temperature > 0.0f && !sampler_keeps_top_k(config, V) && !sampler_keeps_top_p(config) &&
           !sampler_keeps_min_p(config);
}
// Sampling with top-p and no top-k (sampler_candidates_hold_nucleus's rows).
static inline bool sampler_keeps_top_p_only(const SamplerConfig *config, int V) {
    return config->temperature > 0.0f && !sampler_keeps_top_k(config, V) && sampler_keeps_top_p(config);
}

typedef struct {
    int token;
    float logprob;          // log p(token) under the model: softmax of the raw logits
    float sampling_logprob; // log p(token) under the distribution sampled from (0 for greedy)
} SampledToken;

// Working memory for one row: sized for the vocabulary.
typedef struct {
    int vocab_size;
    float *values;
    int *indices;
    float *work;
    int *order;          // top-p's sort: the other buffer of each radix pass
    uint32_t *sort_keys; // top-p's sort: each candidate's key, by token id
    int *seen;           // sampler_adjust_logits: per token, how often the answer holds it (zeros between calls)
} SamplerScratch;

void sampler_scratch_init(SamplerScratch *scratch, int vocab_size);
void sampler_scratch_free(SamplerScratch *scratch);

// The penalties of `config` on logits[0..V) in place: the repetition penalty on every token of
// context[0..context_length) (the prompt) and generated[0..generated_length) (the answer so
// far), each once, then the frequency and presence penalties on the answer's, then the logit
// biases (a token outside [0, V) is an internal error: callers check ids). A -INFINITY logit
// (a masked token) stays so.
void sampler_adjust_logits(const SamplerConfig *config, float *logits, int V, const int *context, int context_length,
                      const int *generated, int generated_length, SamplerScratch *scratch);

// Greedy decoding's token: the first of the largest logits.
int sampler_argmax(const float *logits, int V);

// Picks a token from logits[0..V). `uniform` is a number in [0, 1).
SampledToken sampler_pick(const float *logits, int V, const SamplerConfig *config, double uniform,
                          SamplerScratch *scratch);

// sampler_pick on a row of which only its top-k candidates are given (model_last_candidates:
// ids ascending, their raw logits, count of them) and the whole row's log-normaliser lse:
// the same token and log-probs as sampler_pick on the whole row. config->top_k must be the
// one the candidates were chosen by (1 for a greedy row).
SampledToken sampler_pick_candidates(const float *values, const int *ids, int count, double lse,
                                     const SamplerConfig *config, double uniform, SamplerScratch *scratch);

// Top-p without top-k from a row's candidates, where a GPU holds the logits (gen/generate.c,
// continuous.c): its largest logits (model_last_candidates; ids ascending, raw logits, count
// of them, every token at least as likely as the last all in) and the scaled row's
// log-normaliser scaled_lse (temperature applied). Whether the candidates hold the row's
// nucleus: the mass outside them, 1 - the sum of their probabilities, is within 1 - top_p,
// so top-p drops every other token. Then sampler_pick_nucleus_candidates picks what
// sampler_pick would on the whole row, the mass outside and each candidate's probability
// taken from scaled_lse (the backend's sum, ~1e-7 from the host's fp64 one: a token whose
// cumulative mass lies that close to 1 - top_p may fall on the other side of the cut).
bool sampler_candidates_hold_nucleus(const float *values, int count, double scaled_lse, const SamplerConfig *config);
SampledToken sampler_pick_nucleus_candidates(const float *values, const int *ids, int count, double lse,
                                             double scaled_lse, const SamplerConfig *config, double uniform,
                                             SamplerScratch *scratch);

// log softmax(logits)[token] (the model's own log-prob of a token sampled from a masked
// copy of the logits), summed in double.
float sampler_logprob(const float *logits, int V, int token);

// The probabilities the sampler draws from (after temperature, top-k, top-p), into
// probs[0..V): zero outside the kept set. For tests and for --explain style tools.
void sampler_distribution(const float *logits, int V, const SamplerConfig *config, float *probs,
                          SamplerScratch *scratch);
