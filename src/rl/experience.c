#include "rl/experience.h"

#include <math.h>
#include <string.h>

#include "core/check.h"
#include "core/rng.h"

void sample_free(Sample *s) {
    free(s->response);
    free(s->logp_old), free(s->logp_ref), free(s->values_old), free(s->entropy), free(s->rollout_logp);
    free(s->rewards), free(s->advantages), free(s->returns), free(s->segments);
    memset(s, 0, sizeof *s);
}

// Rows of prompt + response, right-padded (row_start 0), as the model trains on them.
typedef struct {
    int B, T;
    int *tokens, *row_len, *targets;
} SampleBatch;

static void build_rows(Sample *const *samples, int count, SampleBatch *batch) {
    int T = 0;
    for (int b = 0; b < count; b++) {
        int length = samples[b]->prompt_length + samples[b]->response_length;
        if (length > T) T = length;
    }
    long N = (long)count * T;
    batch->B = count;
    batch->T = T;
    batch->tokens = xcalloc(N, sizeof(int));
    batch->row_len = xmalloc(count * sizeof(int));
    batch->targets = xmalloc(N * sizeof(int));
    for (long i = 0; i < N; i++) batch->targets[i] = -1;
    for (int b = 0; b < count; b++) {
        const Sample *s = samples[b];
        int *row = batch->tokens + (long)b * T;
        memcpy(row, s->prompt, s->prompt_length * sizeof(int));
        memcpy(row + s->prompt_length, s->response, s->response_length * sizeof(int));
        batch->row_len[b] = s->prompt_length + s->response_length;
        // Slot P-1+j predicts response token j.
        for (int j = 0; j < s->response_length; j++)
            batch->targets[(long)b * T + s->prompt_length - 1 + j] = s->response[j];
    }
}

static void free_rows(SampleBatch *batch) { free(batch->tokens), free(batch->row_len), free(batch->targets); }

static void forward(Model *model, const SampleBatch *batch) {
    ModelBatch input = {.B = batch->B, .T = batch->T, .tokens = batch->tokens, .row_len = batch->row_len};
    model_forward(model, &input);
}

void experience_logprobs(Model *model, Sample *const *samples, int count, int micro_batch, float **logp,
                         float **entropy) {
    for (int first = 0; first < count; first += micro_batch) {
        int B = count - first < micro_batch ? count - first : micro_batch;
        SampleBatch batch;
        build_rows(samples + first, B, &batch);
        long N = (long)batch.B * batch.T;
        float *all = xmalloc(N * sizeof(float)), *all_entropy = entropy ? xmalloc(N * sizeof(float)) : NULL;
        forward(model, &batch);
        model_logprobs(model, batch.targets, all, NULL, all_entropy);
        for (int b = 0; b < B; b++) {
            const Sample *s = samples[first + b];
            long offset = (long)b * batch.T + s->prompt_length - 1;
            memcpy(logp[first + b], all + offset, s->response_length * sizeof(float));
            if (entropy) memcpy(entropy[first + b], all_entropy + offset, s->response_length * sizeof(float));
        }
        free(all), free(all_entropy);
        free_rows(&batch);
    }
}

void experience_values(Model *model, Sample *const *samples, int count, int micro_batch, float **values) {
    for (int first = 0; first < count; first += micro_batch) {
        int B = count - first < micro_batch ? count - first : micro_batch;
        SampleBatch batch;
        build_rows(samples + first, B, &batch);
        float *all = xmalloc((long)batch.B * batch.T * sizeof(float));
        forward(model, &batch);
        model_values(model, all);
        for (int b = 0; b < B; b++) {
            const Sample *s = samples[first + b];
            memcpy(values[first + b], all + (long)b * batch.T + s->prompt_length - 1, s->response_length * sizeof(float));
        }
        free(all);
        free_rows(&batch);
    }
}

void experience_scores(Model *model, Sample *const *samples, int count, int micro_batch, float *scores) {
    for (int first = 0; first < count; first += micro_batch) {
        int B = count - first < micro_batch ? count - first : micro_batch;
        SampleBatch batch;
        build_rows(samples + first, B, &batch);
        float *all = xmalloc((long)batch.B * batch.T * sizeof(float));
        forward(model, &batch);
        model_values(model, all);
        for (int b = 0; b < B; b++) scores[first + b] = all[(long)b * batch.T + batch.row_len[b] - 1];
        free(all);
        free_rows(&batch);
    }
}

// The micro-batch's trained response tokens: those of the samples with a loss weight
// (--mask-truncated-completions' cut responses are not). How many there are, and a [B, T]
// per-slot array's values at them, in order.
static long trained_token_count(Sample *const *samples, int count) {
    long n = 0;
    for (int b = 0; b < count; b++) n += samples[b]->loss_scale != 0 ? samples[b]->response_length : 0;
    return n;
}

static void gather_trained_tokens(Sample *const *samples, int count, int T, const float *slots, float *out) {
    long k = 0;
    for (int b = 0; b < count; b++) {
        const Sample *s = samples[b];
        if (s->loss_scale == 0) continue;
        memcpy(out + k, slots + (long)b * T + s->prompt_length - 1, (size_t)s->response_length * sizeof(float));
        k += s->response_length;
    }
}

// The 80/20 rule (PpoLossConfig.low_entropy_fraction): the low_entropy_fraction quantile of
// this forward's entropies over the micro-batch's trained response tokens, as TRL takes it
// over a micro-batch's completion tokens; -INFINITY when every token is kept.
static double low_entropy_threshold(const PpoLossConfig *loss, Sample *const *samples, int count, int T,
                                    const float *entropy) {
    if (!(loss->low_entropy_fraction > 0)) return -INFINITY;
    const long n = trained_token_count(samples, count);
    if (n == 0) return -INFINITY;
    float *trained = xmalloc((size_t)n * sizeof(float));
    gather_trained_tokens(samples, count, T, entropy, trained);
    const double threshold = ppo_quantile(trained, n, loss->low_entropy_fraction);
    free(trained);
    return threshold;
}

// What generation's sampling changes in a sample's policy term (advantages[0..R), the
// sample's, modified in place; a weight >= 0 keeps each one's sign, and each policy loss form but
// VESPO's is linear in it): each token's advantage times its rollout-correction weight (VESPO:
// *sampling_log_weight, the weights' share of its sequence ratio, instead), and the negative ones
// 0 when the off-policy mask drops the response (its KL from the sampling log-probs: generation's
// with the correction, else the old ones).
static void correct_for_sampling(const PpoLossConfig *loss, const Sample *s, const float *logp_new, float *advantages,
                                 double *sampling_log_weight, PpoLossStats *stats) {
    const int R = s->response_length;
    const bool corrected = loss->rollout_correction != ROLLOUT_CORRECTION_NONE;
    *sampling_log_weight = 0.0;
    if (corrected) {
        float *weights = xmalloc(((size_t)R + 1) * sizeof(float));
        rollout_correction_weights(loss->rollout_correction, loss->rollout_correction_min,
                                   loss->rollout_correction_max, s->logp_old, s->rollout_logp, R, weights);
        // VESPO folds the weights into its own sequence ratio (TRL's get_gamma_weights); the
        // other forms weigh each token's term.
        if (loss->policy_loss == POLICY_LOSS_VESPO)
            *sampling_log_weight = rollout_correction_log_weight(loss->rollout_correction, weights, R);
        for (int j = 0; j < R; j++) {
            if (loss->policy_loss != POLICY_LOSS_VESPO) advantages[j] *= weights[j];
            if (stats) stats->rollout_weight_sum += weights[j];
        }
        free(weights);
    }
    if (loss->off_policy_mask &&
        off_policy_masked(corrected ? s->rollout_logp : s->logp_old, logp_new, R, loss->off_policy_mask_threshold))
        for (int j = 0; j < R; j++)
            if (advantages[j] < 0) {
                advantages[j] = 0.0f;
                if (stats) stats->off_policy_masked += 1;
            }
}

// KL-Cov and Clip-Cov (PpoLossConfig.policy_loss): which of the micro-batch's trained response
// tokens take KL-Cov's penalty or lose Clip-Cov's policy term, by their advantage's and new
// log-prob's covariance over them (kl_cov_tokens, clip_cov_tokens). Clip-Cov's random draws
// are keyed by the sample's rollout row, the epoch and the token, so that a token's draw does
// not depend on the micro-batch's other samples or the rank that trains it. [B, T] flags at the
// samples' response slots (xmalloc'd), or NULL when there is no such token.
// old_from_this_forward: the old log-probs are this forward's (every ratio 1).
static unsigned char *covariance_selection(const PpoLossConfig *loss, Sample *const *samples, int count, int T,
                                           const float *logp, bool old_from_this_forward, uint64_t seed, int epoch) {
    const long n = trained_token_count(samples, count);
    if (n == 0) return NULL;
    float *advantages = xmalloc((size_t)n * sizeof(float)), *logps = xmalloc((size_t)n * sizeof(float));
    unsigned char *chosen = xmalloc((size_t)n);
    long k = 0;
    for (int b = 0; b < count; b++) {
        const Sample *s = samples[b];
        if (s->loss_scale == 0) continue;
        memcpy(advantages + k, s->advantages, (size_t)s->response_length * sizeof(float));
        k += s->response_length;
    }
    gather_trained_tokens(samples, count, T, logp, logps);
    if (loss->policy_loss == POLICY_LOSS_KL_COV) kl_cov_tokens(advantages, logps, n, loss->kl_cov_ratio, chosen);
    else {
        unsigned char *unclipped = xmalloc((size_t)n);
        double *keys = xmalloc((size_t)n * sizeof(double));
        k = 0;
        for (int b = 0; b < count; b++) {
            const Sample *s = samples[b];
            if (s->loss_scale == 0) continue;
            const uint64_t stream = rng_stream("clip_cov", s->row_id, (uint64_t)epoch);
            for (int j = 0; j < s->response_length; j++, k++) {
                const double log_ratio = old_from_this_forward ? 0.0 : (double)logps[k] - s->logp_old[j];
                unclipped[k] = !ppo_clip_binds(advantages[k], log_ratio, loss->clip_ratio, loss->clip_ratio_high);
                keys[k] = rng_uniform_double(seed, stream, (uint64_t)j);
            }
        }
        clip_cov_tokens(advantages, logps, unclipped, keys, n, loss->clip_cov_ratio, loss->clip_cov_lower,
                        loss->clip_cov_upper, chosen);
        free(unclipped), free(keys);
    }
    unsigned char *selected = xcalloc((size_t)count * T, 1);
    k = 0;
    for (int b = 0; b < count; b++) {
        const Sample *s = samples[b];
        if (s->loss_scale == 0) continue;
        memcpy(selected + (long)b * T + s->prompt_length - 1, chosen + k, (size_t)s->response_length);
        k += s->response_length;
    }
    free(advantages), free(logps), free(chosen);
    return selected;
}

double actor_micro_step(Model *actor, Sample *const *samples, int count, const PpoLossConfig *loss,
                        double entropy_coef, bool old_from_this_forward, bool entropy_from_this_forward,
                        uint64_t seed, int epoch, PpoLossStats *stats, double *entropy_sum) {
    SampleBatch batch;
    build_rows(samples, count, &batch);
    long N = (long)batch.B * batch.T;
    float *logp = xmalloc(N * sizeof(float)), *dlogp = xcalloc(N, sizeof(float));
    float *entropy = xmalloc(N * sizeof(float)), *dentropy = entropy_coef != 0 ? xcalloc(N, sizeof(float)) : NULL;
    forward(actor, &batch);
    model_logprobs(actor, batch.targets, logp, NULL, entropy);
    const double threshold = low_entropy_threshold(loss, samples, count, batch.T, entropy);
    unsigned char *selected = loss->policy_loss == POLICY_LOSS_KL_COV || loss->policy_loss == POLICY_LOSS_CLIP_COV
                                  ? covariance_selection(loss, samples, count, batch.T, logp, old_from_this_forward,
                                                         seed, epoch)
                                  : NULL;
    unsigned char *kl_cov = loss->policy_loss == POLICY_LOSS_KL_COV ? selected : NULL;
    unsigned char *clip_cov = loss->policy_loss == POLICY_LOSS_CLIP_COV ? selected : NULL;
    // GMPO takes the response as one term: the 80/20 rule leaves its low-entropy tokens out of
    // the geometric mean instead (TRL's GMPO), its advantage stays the response's.
    const bool entropy_mask_gmpo = loss->policy_loss == POLICY_LOSS_GMPO && threshold > -INFINITY;
    const bool adjusts_advantages = (threshold > -INFINITY && !entropy_mask_gmpo) ||
                                    loss->rollout_correction != ROLLOUT_CORRECTION_NONE || loss->off_policy_mask || clip_cov;
    float *advantages = NULL; // a sample's advantages as the policy term sees them (adjusts_advantages)
    unsigned char *kept = NULL; // entropy_mask_gmpo: a sample's tokens in the geometric mean
    double total = 0;
    for (int b = 0; b < count; b++) {
        const Sample *s = samples[b];
        long offset = (long)b * batch.T + s->prompt_length - 1;
        if (old_from_this_forward) memcpy(s->logp_old, logp + offset, s->response_length * sizeof(float));
        if (old_from_this_forward || entropy_from_this_forward)
            memcpy(s->entropy, entropy + offset, s->response_length * sizeof(float));
        // The advantages the policy term sees: the sample's, or a copy that the 80/20 rule (a
        // token whose entropy is below the threshold leaves the policy term: a zero advantage
        // makes every policy loss form's term and gradient 0; the KL term stays), Clip-Cov's
        // left-out tokens (the same way), the rollout correction and the off-policy mask change.
        const float *sample_advantages = s->advantages;
        double sampling_log_weight = 0.0; // VESPO's share of the rollout correction
        if (adjusts_advantages) {
            advantages = xrealloc(advantages, (size_t)s->response_length * sizeof(float));
            memcpy(advantages, s->advantages, (size_t)s->response_length * sizeof(float));
            for (int j = 0; j < s->response_length && threshold > -INFINITY; j++)
                if (entropy[offset + j] < threshold) advantages[j] = 0.0f;
            for (int j = 0; j < s->response_length && clip_cov; j++)
                if (clip_cov[offset + j]) {
                    advantages[j] = 0.0f;
                    if (stats) stats->clip_cov_left_out += 1;
                }
            if (loss->rollout_correction != ROLLOUT_CORRECTION_NONE || loss->off_policy_mask)
                correct_for_sampling(loss, s, logp + offset, advantages, &sampling_log_weight, stats);
            sample_advantages = advantages;
        }
        if (entropy_mask_gmpo) {
            kept = xrealloc(kept, (size_t)s->response_length + 1);
            for (int j = 0; j < s->response_length; j++) kept[j] = entropy[offset + j] >= threshold;
            total += s->loss_scale * ppo_gmpo_loss(loss, logp + offset, s->logp_old, s->advantages, kept,
                                                   s->response_length, s->loss_scale, dlogp + offset, stats);
        } else if (loss->policy_loss == POLICY_LOSS_VESPO)
            total += s->loss_scale * ppo_vespo_loss(loss, logp + offset, s->logp_old, sample_advantages,
                                                    sampling_log_weight, s->response_length, s->loss_scale,
                                                    dlogp + offset, stats);
        else
            total += s->loss_scale * ppo_policy_loss(loss, logp + offset, s->logp_old, sample_advantages, s->segments,
                                                     s->segment_count, s->response_length, s->loss_scale,
                                                     dlogp + offset, stats);
        if (kl_cov) // (old log-probs from this forward: every |log-ratio| and its slope 0)
            total += s->loss_scale * loss->kl_cov_coef *
                     ppo_kl_cov_term(logp + offset, s->logp_old, kl_cov + offset, s->response_length, loss->kl_cov_coef,
                                     s->loss_scale, dlogp + offset);
        if (loss->kl_loss_coef > 0 && loss->kl_loss_bias_correction)
            total += s->loss_scale * loss->kl_loss_coef *
                     ppo_kl_loss_ratio_weighted(loss, logp + offset, s->logp_old, s->logp_ref, s->segments,
                                                s->segment_count, s->response_length, s->loss_scale, dlogp + offset);
        else if (loss->kl_loss_coef > 0)
            total += s->loss_scale * loss->kl_loss_coef *
                     ppo_kl_loss(loss->kl_loss_estimator, logp + offset, s->logp_ref, s->response_length,
                                 loss->kl_loss_coef, s->loss_scale, dlogp + offset);
        for (int j = 0; j < s->response_length; j++) {
            *entropy_sum += entropy[offset + j];
            // The bonus maximises entropy: loss -= coef * H (on the tokens the policy term keeps).
            if (entropy[offset + j] < threshold) continue;
            if (dentropy) dentropy[offset + j] = (float)(-entropy_coef * s->loss_scale);
            if (stats && s->loss_scale != 0) stats->trained_entropy += entropy[offset + j], stats->trained_tokens += 1;
        }
    }
    model_backward(actor, dlogp, dentropy, NULL);
    free(logp), free(dlogp), free(entropy), free(dentropy), free(advantages), free(selected), free(kept);
    free_rows(&batch);
    return total;
}

double critic_micro_step(Model *critic, Sample *const *samples, int count, const PpoLossConfig *loss,
                         PpoLossStats *stats) {
    SampleBatch batch;
    build_rows(samples, count, &batch);
    long N = (long)batch.B * batch.T;
    float *values = xmalloc(N * sizeof(float)), *dvalues = xcalloc(N, sizeof(float));
    forward(critic, &batch);
    model_values(critic, values);
    double total = 0;
    for (int b = 0; b < count; b++) {
        const Sample *s = samples[b];
        long offset = (long)b * batch.T + s->prompt_length - 1;
        total += s->loss_scale * ppo_value_loss(loss, values + offset, s->values_old, s->returns, s->response_length,
                                                s->loss_scale, dvalues + offset, stats);
    }
    model_backward(critic, NULL, NULL, dvalues);
    free(values), free(dvalues);
    free_rows(&batch);
    return total;
}
