// The sampling options beyond temperature, top-k and top-p that every command generating
// text takes (generate, chat, infer, ppo's rollouts): min-p, the penalties on tokens already
// seen and logit biases (gen/sampler.h). `marlhf serve` takes the same per request (OpenAI's
// presence_penalty, frequency_penalty and logit_bias, vLLM's min_p and repetition_penalty).
#pragma once
#include <stdbool.h>

#include "cli/options.h"
#include "gen/sampler.h"

typedef struct {
    double min_p, repetition_penalty, presence_penalty, frequency_penalty;
    char *logit_bias; // --logit-bias "ID:BIAS,..." as given, or NULL
    SamplerLogitBias *biases; // parsed by sampler_extras_check
    int bias_count;
} SamplerExtrasCli;

#define SAMPLER_EXTRAS_CLI_DEFAULTS {.min_p = 0.0, .repetition_penalty = 1.0, .presence_penalty = 0.0, .frequency_penalty = 0.0}

// The five options, as initializers of a command's option table.
#define SAMPLER_EXTRAS_OPTIONS(extras)                                                                                \
    {"min-p", "min_p", OPT_FLOAT, &(extras)->min_p,                                                                  \
     "keep only the tokens at least this times as likely as the most likely, after top-p (0 = off)", false, false},  \
    {"repetition-penalty", "repetition_penalty repeat_penalty", OPT_FLOAT, &(extras)->repetition_penalty,           \
     "divide the positive logits of the prompt's and answer's tokens by this, multiply the others (1 = off)", false, \
     false},                                                                                                         \
    {"presence-penalty", "presence_penalty", OPT_FLOAT, &(extras)->presence_penalty,                                 \
     "subtract this from the logit of every token the answer holds (OpenAI's; 0 = off)", false, false},              \
    {"frequency-penalty", "frequency_penalty", OPT_FLOAT, &(extras)->frequency_penalty,                              \
     "subtract this times its count in the answer from each token's logit (OpenAI's; 0 = off)", false, false},       \
    {"logit-bias", "logit_bias", OPT_STRING, &(extras)->logit_bias,                                                  \
     "ID:BIAS,...: add BIAS (in [-100, 100]) to token ID's logit (OpenAI's logit_bias; -100 bans it)", false, false}

// Checks the values (min-p in [0, 1], the repetition penalty positive, the presence and
// frequency penalties in [-2, 2] as OpenAI's, --logit-bias well formed) and parses the biases;
// a bad one exits 2 naming its option. Call once, after options_parse.
void sampler_extras_check(SamplerExtrasCli *extras);
// Sets the options in *sampler (its logit biases borrow extras' array). vocab_size > 0: a
// biased token outside the vocabulary exits 2 naming --logit-bias (0: the caller checks).
void sampler_extras_apply(const SamplerExtrasCli *extras, SamplerConfig *sampler, int vocab_size);
void sampler_extras_free(SamplerExtrasCli *extras);
