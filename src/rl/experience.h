// One rollout sample and the passes that fill it: generation results, experience
// (log-probs, values, score) from full forwards over prompt + response, and the training
// micro-steps of the actor and the critic. Used by rl/ppo.c.
#pragma once
#include <stdbool.h>

#include "gen/generate.h"
#include "model/model.h"
#include "rl/ppo_loss.h"

typedef struct {
    long prompt_index;
    const int *prompt; // owned by the prompt set
    int prompt_length;
    int *response;
    int response_length;
    StopReason stop;
    float *logp_old, *logp_ref, *values_old, *entropy; // [response_length]
    // generation's log-probs of the response (PpoConfig.old_logprobs_from_rollout,
    // PpoLossConfig.rollout_correction), or NULL
    float *rollout_logp;
    float *rewards, *advantages, *returns;
    int *segments;
    int segment_count;
    int parse_fallbacks;
    float score;     // reward before clipping (RM score, lexicon or code reward)
    float raw_score; // the same before reward normalisation
    float gold;      // lexicon score of the response (NAN when there is no lexicon)
    float baseline;  // ReMax: the score of the actor's greedy answer to the prompt (remax_baselines)
    uint64_t row_id; // the rollout row that generated it (its sampling's random numbers; Clip-Cov's draws)
    float loss_scale; // this sample's tokens' weight in its minibatch's mean
} Sample;

void sample_free(Sample *sample);

// Log-probs of each sample's response tokens under `model` (and their entropies when
// entropy != NULL): logp[s][j] for token j of sample s. Rows are run `micro_batch` at a time.
void experience_logprobs(Model *model, Sample *const *samples, int count, int micro_batch, float **logp,
                         float **entropy);
// Values of the states before each response token (critic): values[s][j].
void experience_values(Model *model, Sample *const *samples, int count, int micro_batch, float **values);
// The value head at each sample's last token (reward model score).
void experience_scores(Model *model, Sample *const *samples, int count, int micro_batch, float *scores);

// Actor micro-step: forward over the samples, clipped policy loss (+ entropy bonus), backward
// (gradients accumulate in the actor). Returns the summed, scaled loss. With
// old_from_this_forward the samples' logp_old and entropy are first set to this forward's
// (the actor has not moved since the rollout: the ratio is 1); with entropy_from_this_forward
// their entropy only (the old log-probs came from generation).
double actor_micro_step(Model *actor, Sample *const *samples, int count, const PpoLossConfig *loss,
                        double entropy_coef, bool old_from_this_forward, bool entropy_from_this_forward,
                        uint64_t seed, int epoch, PpoLossStats *stats, double *entropy_sum);
// Critic micro-step: forward, clipped value loss, backward.
double critic_micro_step(Model *critic, Sample *const *samples, int count, const PpoLossConfig *loss,
                         PpoLossStats *stats);
