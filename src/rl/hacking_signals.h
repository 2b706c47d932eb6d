// Model-free warning signs of reward hacking and of a collapsing policy, measured on each
// PPO / GRPO iteration's responses (their token ids: no model, no decoding) and compared
// with the run's first iteration, whose responses are the starting (SFT) policy's:
//  - the mean response length: a reward model that pays for length (answers that swell to
//    the token limit) or against it (answers that shrink to nothing);
//  - distinct-2: the batch's distinct token bigrams over all its bigrams (the wording
//    narrowing to a few phrases);
//  - the repetitive fraction: the responses in which one token 4-gram occurs 3 or more
//    times (degenerate loops);
//  - the same-answer fraction: the most prompts that got one identical response, over the
//    prompts (every prompt answered alike; the samples of one prompt count as that one
//    prompt, so a GRPO group's identical answers are not a sign);
//  - the shared-trigram fraction: the responses holding the batch's most widespread token
//    trigram (a phrase the reward model over-pays, put into every answer).
// An alarm fires when a signal moves past its limit against the first iteration's value.
// rl/ppo.c logs the signals as metrics and prints a warning when an alarm starts or ends;
// nothing here changes training.
#pragma once
#include <stddef.h>

typedef struct {
    double mean_length;             // tokens per response
    double distinct_2;              // NAN when no response has two tokens
    double repetitive_fraction;     // of the responses
    double same_answer_fraction;    // of the prompts
    double shared_trigram_fraction; // of the responses
} HackingSignals;

// The signals of `count` responses: response i is tokens[i][0, lengths[i]) and answers
// prompt groups[i] (equal for the samples of one prompt). count 0: all zero, distinct_2 NAN.
void hacking_signals_measure(const int *const *tokens, const int *lengths, const int *groups, int count,
                             HackingSignals *out);

// The limits (0 turns one off).
typedef struct {
    double length_ratio;   // the mean length above ratio x the first's, or below the first's / ratio
    double distinct_ratio; // distinct-2 below this fraction of the first's
    double fraction_rise;  // a fraction (repetitive, same answer, shared trigram) up by this much
} HackingLimits;

enum {
    HACKING_LENGTH = 1 << 0,
    HACKING_DIVERSITY = 1 << 1,
    HACKING_REPETITION = 1 << 2,
    HACKING_SAME_ANSWER = 1 << 3,
    HACKING_SHARED_PHRASE = 1 << 4,
    // Not a signal of the responses' tokens: rl/ppo.c's check of the iteration's mean
    // reward-model score against the scores the reward model gave the preferred answers of
    // its own data (train/rm.h's REWARD_STATS_FILE, --alarm-score-quantile); described there.
    HACKING_REWARD_RANGE = 1 << 5,
    HACKING_ALARM_COUNT = 6,
};

// The alarms (HACKING_* bits) that `now` sets off against `first`. A signal that is NAN at
// either never does.
unsigned hacking_alarms(const HackingSignals *first, const HackingSignals *now, const HackingLimits *limits);
// One alarm (a single HACKING_* bit of the five signals, not HACKING_REWARD_RANGE) as a
// phrase for a warning line: what moved, from what to what, and the option that sets its limit.
void hacking_alarm_describe(unsigned alarm, const HackingSignals *first, const HackingSignals *now,
                            const HackingLimits *limits, char *text, size_t size);
