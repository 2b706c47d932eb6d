#include "rl/advantage.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/check.h"

int value_function_from_name(const char *name, ValueFunction *out) {
    if (!strcmp(name, "equal")) *out = VALUE_EQUAL;
    else if (!strcmp(name, "position")) *out = VALUE_POSITION;
    else if (!strcmp(name, "unit")) *out = VALUE_UNIT;
    else return -1;
    return 0;
}

int macro_reward_from_name(const char *name, MacroReward *out) {
    if (!strcmp(name, "mean")) *out = MACRO_REWARD_MEAN;
    else if (!strcmp(name, "sum")) *out = MACRO_REWARD_SUM;
    else return -1;
    return 0;
}

float clipped_score(const AdvantageConfig *config, float score) {
    if (config->reward_clip > 0) {
        if (score > config->reward_clip) score = config->reward_clip;
        if (score < -config->reward_clip) score = -config->reward_clip;
    }
    return score;
}

void token_rewards(const AdvantageConfig *config, const float *logp, const float *logp_ref, float score, int R,
                   float *rewards) {
    for (int j = 0; j < R; j++) {
        const float log_ratio = logp[j] - logp_ref[j]; // (k1's penalty is this float itself)
        rewards[j] = -config->kl_coef * (float)kl_estimate(config->kl_estimator, log_ratio);
    }
    if (R > 0) rewards[R - 1] += clipped_score(config, score);
}

static const struct {
    const char *name;
    AdvantageEstimator estimator;
} estimator_names[] = {
    {"gae", ESTIMATOR_GAE},
    {"grpo", ESTIMATOR_GRPO},
    {"dr-grpo", ESTIMATOR_DR_GRPO},
    {"rloo", ESTIMATOR_RLOO},
    {"opo", ESTIMATOR_OPO},
    {"gpg", ESTIMATOR_GPG},
    {"remax", ESTIMATOR_REMAX},
    {"reinforce++", ESTIMATOR_REINFORCE_PP},
    {"reinforce++-baseline", ESTIMATOR_REINFORCE_PP_BASELINE},
    // OpenRLHF's and verl's spellings
    {"reinforce", ESTIMATOR_REINFORCE_PP},
    {"reinforce_plus_plus", ESTIMATOR_REINFORCE_PP},
    {"reinforce_baseline", ESTIMATOR_REINFORCE_PP_BASELINE},
    {"reinforce_plus_plus_baseline", ESTIMATOR_REINFORCE_PP_BASELINE},
    {"dr_grpo", ESTIMATOR_DR_GRPO},
};

int advantage_estimator_from_name(const char *name, AdvantageEstimator *out) {
    for (size_t i = 0; i < sizeof estimator_names / sizeof estimator_names[0]; i++)
        if (!strcmp(name, estimator_names[i].name)) {
            *out = estimator_names[i].estimator;
            return 0;
        }
    return -1;
}

const char *advantage_estimator_name(AdvantageEstimator estimator) {
    for (size_t i = 0; i < sizeof estimator_names / sizeof estimator_names[0]; i++)
        if (estimator_names[i].estimator == estimator) return estimator_names[i].name;
    return "gae";
}

float overlong_penalty(int length, int max_new_tokens, int buffer, float factor) {
    if (buffer <= 0) return 0.0f;
    const int expected = max_new_tokens - buffer; // lengths up to here are free
    if (length <= expected) return 0.0f;
    return -factor * (float)(length - expected) / (float)buffer;
}

void returns_to_go(const float *rewards, int R, float gamma, float *out) {
    double running = 0;
    for (int j = R - 1; j >= 0; j--) {
        running = rewards[j] + gamma * running;
        out[j] = (float)running;
    }
}

void group_advantages(AdvantageEstimator estimator, const double *rewards, const int *lengths, int G, double *out) {
    if (G < 2) {
        for (int g = 0; g < G; g++) out[g] = 0.0;
        return;
    }
    if (estimator == ESTIMATOR_OPO) { // the baseline weighs each reward by its response's length
        CHECK(lengths, "OPO's baseline needs the responses' lengths");
        double weighted = 0, total = 0;
        for (int g = 0; g < G; g++) weighted += (double)lengths[g] * rewards[g], total += lengths[g];
        const double baseline = total > 0 ? weighted / total : 0.0;
        for (int g = 0; g < G; g++) out[g] = rewards[g] - baseline;
        return;
    }
    double sum = 0;
    for (int g = 0; g < G; g++) sum += rewards[g];
    const double mean = sum / G;
    if (estimator == ESTIMATOR_RLOO) {
        for (int g = 0; g < G; g++) out[g] = rewards[g] - (sum - rewards[g]) / (G - 1);
        return;
    }
    if (estimator == ESTIMATOR_DR_GRPO || estimator == ESTIMATOR_GPG) { // GPG's alpha: rollout_group_advantages
        for (int g = 0; g < G; g++) out[g] = rewards[g] - mean;
        return;
    }
    double squares = 0;
    for (int g = 0; g < G; g++) squares += (rewards[g] - mean) * (rewards[g] - mean);
    const double std = sqrt(squares / (G - 1));
    for (int g = 0; g < G; g++) out[g] = (rewards[g] - mean) / (std + 1e-4);
}

int group_end(const int *groups, int count, int first) {
    int last = first;
    while (last < count && groups[last] == groups[first]) last++;
    return last;
}

void rollout_group_advantages(AdvantageEstimator estimator, GroupScale scale, const double *rewards, const int *lengths,
                              const int *groups, int count, double *out) {
    const bool grpo_unscaled = estimator == ESTIMATOR_GRPO && scale != GROUP_SCALE_GROUP;
    for (int first = 0, last; first < count; first = last) {
        last = group_end(groups, count, first);
        group_advantages(grpo_unscaled ? ESTIMATOR_DR_GRPO : estimator, rewards + first, lengths ? lengths + first : NULL,
                         last - first, out + first);
    }
    if (estimator == ESTIMATOR_GPG) {
        int nonzero = 0;
        for (int q = 0; q < count; q++) nonzero += rewards[q] != 0;
        const double alpha = (double)count / (nonzero > 0 ? nonzero : 1);
        for (int q = 0; q < count; q++) out[q] *= alpha;
        return;
    }
    if (estimator != ESTIMATOR_GRPO || scale != GROUP_SCALE_BATCH) return;
    double sum = 0, squares = 0;
    for (int q = 0; q < count; q++) sum += rewards[q];
    const double mean = count > 0 ? sum / count : 0;
    for (int q = 0; q < count; q++) squares += (rewards[q] - mean) * (rewards[q] - mean);
    const double std = count > 1 ? sqrt(squares / (count - 1)) : 0.0;
    for (int q = 0; q < count; q++) out[q] /= std + 1e-4;
}

void decoupled_group_rewards(const double *const *parts, const double *weights, int sources, const int *groups,
                             int count, double *out) {
    for (int q = 0; q < count; q++) out[q] = 0.0;
    double *normalized = xmalloc(((size_t)count + 1) * sizeof(double));
    for (int k = 0; k < sources; k++) {
        // group_advantages' GRPO is (x - group mean) / (unbiased group std + 1e-4), 0 alone.
        rollout_group_advantages(ESTIMATOR_GRPO, GROUP_SCALE_GROUP, parts[k], NULL, groups, count, normalized);
        for (int q = 0; q < count; q++) out[q] += weights[k] * normalized[q];
    }
    free(normalized);
}

void batch_standardized(const double *rewards, int count, double *out) {
    double sum = 0, squares = 0;
    for (int q = 0; q < count; q++) sum += rewards[q];
    const double mean = count > 0 ? sum / count : 0;
    for (int q = 0; q < count; q++) squares += (rewards[q] - mean) * (rewards[q] - mean);
    const double std = count > 1 ? sqrt(squares / (count - 1)) : 0.0;
    for (int q = 0; q < count; q++) out[q] = (rewards[q] - mean) / (std + 1e-4);
}

void macro_value_weights(ValueFunction value_function, int m, float *weights) {
    switch (value_function) {
    case VALUE_EQUAL:
        for (int i = 0; i < m; i++) weights[i] = 1.0f / m;
        break;
    case VALUE_POSITION: { // 1/(i+1), normalised: the first token of the macro action weighs most
        double total = 0;
        for (int i = 0; i < m; i++) total += 1.0 / (i + 1);
        for (int i = 0; i < m; i++) weights[i] = (float)(1.0 / (i + 1) / total);
        break;
    }
    case VALUE_UNIT: // the released code meant a one-hot on the last token (and crashed)
        for (int i = 0; i < m; i++) weights[i] = i == m - 1 ? 1.0f : 0.0f;
        break;
    }
}

void macro_advantages(const AdvantageConfig *config, const float *values, const float *rewards, int R,
                      const int *segment_lengths, int segments, float *advantages, float *returns) {
    float *macro_value = xcalloc((size_t)segments + 1, sizeof(float));
    float *macro_reward = xcalloc((size_t)segments + 1, sizeof(float));
    float *weights = xmalloc((size_t)(R > 0 ? R : 1) * sizeof(float));
    int first = 0;
    for (int s = 0; s < segments; s++) {
        int m = segment_lengths[s];
        CHECK(m >= 0 && first + m <= R, "segments overrun the response");
        if (m == 0) continue; // an empty macro action has value and reward 0 (released code)
        macro_value_weights(config->value_function, m, weights);
        double v = 0, r = 0;
        for (int i = 0; i < m; i++) {
            v += (double)weights[i] * values[first + i];
            r += (config->macro_reward == MACRO_REWARD_SUM ? 1.0 : (double)weights[i]) * rewards[first + i];
        }
        macro_value[s] = (float)v;
        macro_reward[s] = (float)r;
        first += m;
    }
    CHECK(first == R, "segments cover %d of %d tokens", first, R);
    // GAE over macro steps; the value after the last one is 0.
    float next_value = 0, next_advantage = 0;
    first = R;
    for (int s = segments - 1; s >= 0; s--) {
        float delta = macro_reward[s] + config->gamma * next_value - macro_value[s];
        float advantage = delta + config->gamma * config->lambda * next_advantage;
        float ret = advantage + macro_value[s];
        first -= segment_lengths[s];
        for (int i = 0; i < segment_lengths[s]; i++) {
            advantages[first + i] = advantage;
            returns[first + i] = ret;
        }
        next_value = macro_value[s];
        next_advantage = advantage;
    }
    free(macro_value), free(macro_reward), free(weights);
}

void token_advantages(const AdvantageConfig *config, const float *values, const float *rewards, int R,
                      float *advantages, float *returns) {
    float next_value = 0, next_advantage = 0;
    for (int j = R - 1; j >= 0; j--) {
        float delta = rewards[j] + config->gamma * next_value - values[j];
        advantages[j] = delta + config->gamma * config->lambda * next_advantage;
        returns[j] = advantages[j] + values[j];
        next_value = values[j];
        next_advantage = advantages[j];
    }
}
