#include "gen/sampler.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/check.h"
#include "ops/sampling_key.h"

void sampler_scratch_init(SamplerScratch *scratch, int vocab_size) {
    scratch->vocab_size = vocab_size;
    scratch->values = xmalloc((size_t)vocab_size * sizeof(float));
    scratch->indices = xmalloc((size_t)vocab_size * sizeof(int));
    scratch->work = xmalloc((size_t)vocab_size * sizeof(float));
    scratch->order = xmalloc((size_t)vocab_size * sizeof(int));
    scratch->sort_keys = xmalloc((size_t)vocab_size * sizeof(uint32_t));
    scratch->seen = xcalloc((size_t)vocab_size, sizeof(int));
}

void sampler_scratch_free(SamplerScratch *scratch) {
    free(scratch->values);
    free(scratch->indices);
    free(scratch->work);
    free(scratch->order);
    free(scratch->sort_keys);
    free(scratch->seen);
    memset(scratch, 0, sizeof *scratch);
}

static double log_sum_exp(const float *x, int n) {
    float max_value = x[0];
    for (int i = 1; i < n; i++)
        if (x[i] > max_value) max_value = x[i];
    double sum = 0;
    for (int i = 0; i < n; i++) sum += exp((double)(x[i] - max_value));
    return max_value + log(sum);
}

// Sorts the token ids indices[0..count) (ascending on entry) by their values, the largest
// first, ties by ascending id: four stable counting passes over the keys' bytes, least
// significant first, so that ties keep the ids' order. Was qsort_r with a comparator: ~20 ms
// for a 49k vocabulary on one core, more than a SmolLM2-135M decode step; this is ~1 ms.
static void sort_descending(int *indices, int count, const float *values, SamplerScratch *s) {
    uint32_t *keys = s->sort_keys;
    for (int i = 0; i < count; i++) keys[indices[i]] = sampling_descending_key(values[indices[i]]);
    int *from = indices, *to = s->order;
    for (int shift = 0; shift < 32; shift += 8) {
        int offsets[257] = {0};
        for (int i = 0; i < count; i++) offsets[((keys[from[i]] >> shift) & 0xff) + 1]++;
        for (int digit = 0; digit < 256; digit++) offsets[digit + 1] += offsets[digit];
        for (int i = 0; i < count; i++) to[offsets[(keys[from[i]] >> shift) & 0xff]++] = from[i];
        int *swap = from;
        from = to, to = swap;
    }
    // four passes: the sorted ids are back in `indices`
}

// Whether token v comes before token last (or is it) in sort_descending's order.
static bool sorts_no_later(int v, int last, const uint32_t *keys) {
    return keys[v] < keys[last] || (keys[v] == keys[last] && v <= last);
}

// The probability mass of a row outside its top-p candidates (sampler_candidates_hold_nucleus):
// 1 - the candidates' probabilities, each scaled as kept_set scales it, in [0, 1].
static double mass_outside(const float *values, int count, double scaled_lse, const SamplerConfig *config) {
    const float inv_temperature = 1.0f / config->temperature;
    double inside = 0;
    for (int i = 0; i < count; i++) inside += exp((double)(values[i] * inv_temperature) - scaled_lse);
    return inside < 1.0 ? 1.0 - inside : 0.0;
}

// Fills scratch->indices with the kept tokens (ascending index) and scratch->values with
// their scaled logits; returns how many. Also returns the log-normaliser over them.
// scaled_lse: NAN where the logits are the whole row or its top-k candidates; else they are
// a row's top-p candidates (sampler_pick_nucleus_candidates), scaled_lse the whole scaled
// row's log-normaliser, and top-p's walk starts with the mass outside them.
static int kept_set(const float *logits, int V, const SamplerConfig *config, SamplerScratch *s,
                    double *log_normaliser, double scaled_lse) {
    const float inv_temperature = 1.0f / config->temperature;
    float *scaled = s->values;
    for (int v = 0; v < V; v++) scaled[v] = logits[v] * inv_temperature;
    // top-k: keep every token at least as large as the k-th largest (ties all kept, as
    // transformers' TopKLogitsWarper does).
    float threshold = -INFINITY;
    if (sampler_keeps_top_k(config, V)) {
        threshold = sampling_kth_largest(scaled, V, config->top_k, s->work);
    }
    int count = 0;
    for (int v = 0; v < V; v++)
        if (scaled[v] >= threshold) s->indices[count++] = v;
    // top-p: drop the least likely tokens whose cumulative probability (from the least
    // likely up) stays <= 1 - top_p; the most likely token always stays.
    if (sampler_keeps_top_p(config) && count > 1) {
        sort_descending(s->indices, count, scaled, s);
        // Each token's probability is exp(scaled - max_value) / total: over the given logits,
        // or for top-p candidates over the whole row, whose other tokens come first from the
        // least likely up.
        double max_value = scaled[s->indices[0]], total = 0, tail = 0;
        if (isnan(scaled_lse)) {
            for (int i = 0; i < count; i++) total += exp(scaled[s->indices[i]] - max_value);
        } else {
            max_value = scaled_lse, total = 1.0;
            tail = mass_outside(logits, V, scaled_lse, config);
            CHECK(tail <= 1.0 - config->top_p, "top-p candidates that do not hold the row's nucleus");
        }
        int keep = count;
        for (int i = count - 1; i > 0; i--) {
            tail += exp(scaled[s->indices[i]] - max_value) / total;
            if (tail <= 1.0 - config->top_p) keep = i;
            else break;
        }
        // Back to ascending index order for a batch-independent, documented walk: the
        // kept tokens are the top-k candidates that sort no later than the keep-th.
        const int last = s->indices[keep - 1];
        count = 0;
        for (int v = 0; v < V; v++)
            if (scaled[v] >= threshold && sorts_no_later(v, last, s->sort_keys)) s->indices[count++] = v;
    }
    double max_value = -INFINITY;
    for (int i = 0; i < count; i++)
        if (scaled[s->indices[i]] > max_value) max_value = scaled[s->indices[i]];
    // min-p: p / p_max = exp(scaled - max) >= min_p stays (the most likely token always does).
    if (sampler_keeps_min_p(config)) {
        int kept = 0;
        for (int i = 0; i < count; i++)
            if (exp(scaled[s->indices[i]] - max_value) >= config->min_p) s->indices[kept++] = s->indices[i];
        count = kept;
    }
    double sum = 0;
    for (int i = 0; i < count; i++) sum += exp(scaled[s->indices[i]] - max_value);
    *log_normaliser = max_value + log(sum);
    return count;
}

void sampler_adjust_logits(const SamplerConfig *config, float *logits, int V, const int *context, int context_length,
                      const int *generated, int generated_length, SamplerScratch *scratch) {
    CHECK(scratch->vocab_size >= V, "sampler scratch too small");
    int *seen = scratch->seen;
    const float penalty = config->repetition_penalty;
    if (penalty > 0.0f && penalty != 1.0f) {
        // Each token once, however often it occurs: marked in `seen`, cleared after.
        for (int pass = 0; pass < 2; pass++) {
            const int *tokens = pass == 0 ? context : generated, n = pass == 0 ? context_length : generated_length;
            for (int i = 0; i < n; i++) {
                const int t = tokens[i];
                if (t < 0 || t >= V || seen[t]) continue;
                seen[t] = 1;
                logits[t] = logits[t] > 0.0f ? logits[t] / penalty : logits[t] * penalty;
            }
        }
        for (int pass = 0; pass < 2; pass++) {
            const int *tokens = pass == 0 ? context : generated, n = pass == 0 ? context_length : generated_length;
            for (int i = 0; i < n; i++)
                if (tokens[i] >= 0 && tokens[i] < V) seen[tokens[i]] = 0;
        }
    }
    if (config->presence_penalty != 0.0f || config->frequency_penalty != 0.0f) {
        for (int i = 0; i < generated_length; i++)
            if (generated[i] >= 0 && generated[i] < V) seen[generated[i]]++;
        for (int i = 0; i < generated_length; i++) {
            const int t = generated[i];
            if (t < 0 || t >= V || seen[t] == 0) continue;
            logits[t] -= config->frequency_penalty * (float)seen[t] + config->presence_penalty;
            seen[t] = 0; // (each token once)
        }
    }
    for (int i = 0; i < config->logit_bias_count; i++) {
        const int t = config->logit_bias[i].token;
        CHECK(t >= 0 && t < V, "logit bias of token %d outside the vocabulary of %d", t, V);
        logits[t] += config->logit_bias[i].bias;
    }
}

int sampler_argmax(const float *logits, int V) {
    int best = 0;
    for (int v = 1; v < V; v++)
        if (logits[v] > logits[best]) best = v;
    return best;
}

// sampler_pick's choice, with the log-normaliser of the model's whole row given: the
// logits may be a row's candidates only (sampler_pick_candidates), token an index into them.
static SampledToken pick(const float *logits, int V, const SamplerConfig *config, double uniform,
                         SamplerScratch *scratch, double lse, double scaled_lse) {
    CHECK(scratch->vocab_size >= V, "sampler scratch too small");
    SampledToken out = {0};
    if (config->temperature <= 0.0f) {
        const int best = sampler_argmax(logits, V);
        out.token = best;
        out.logprob = (float)(logits[best] - lse);
        out.sampling_logprob = 0.0f;
        return out;
    }
    double log_normaliser;
    int count = kept_set(logits, V, config, scratch, &log_normaliser, scaled_lse);
    // Walk the kept tokens in index order until the cumulative probability passes u.
    double cumulative = 0;
    int chosen = scratch->indices[count - 1];
    for (int i = 0; i < count; i++) {
        int v = scratch->indices[i];
        cumulative += exp(scratch->values[v] - log_normaliser);
        if (uniform < cumulative) {
            chosen = v;
            break;
        }
    }
    out.token = chosen;
    out.logprob = (float)(logits[chosen] - lse);
    out.sampling_logprob = (float)(scratch->values[chosen] - log_normaliser);
    return out;
}

SampledToken sampler_pick(const float *logits, int V, const SamplerConfig *config, double uniform,
                          SamplerScratch *scratch) {
    return pick(logits, V, config, uniform, scratch, log_sum_exp(logits, V), NAN);
}

// Every token the full row's top-k keeps is a candidate, and only those: the k-th largest of
// the candidates is the row's, so top-k keeps them all again, top-p sees the same set, and
// the walk in id order is the walk in candidate order.
SampledToken sampler_pick_candidates(const float *values, const int *ids, int count, double lse,
                                     const SamplerConfig *config, double uniform, SamplerScratch *scratch) {
    SampledToken out = pick(values, count, config, uniform, scratch, lse, NAN);
    out.token = ids[out.token];
    return out;
}

// Every token outside the candidates is less likely than every candidate (they are the
// row's largest, ties all in), so top-p's walk from the least likely up passes all of them
// first, their mass together: it drops them all when that stays within 1 - top_p.
bool sampler_candidates_hold_nucleus(const float *values, int count, double scaled_lse, const SamplerConfig *config) {
    CHECK(config->temperature > 0.0f && sampler_keeps_top_p(config), "nucleus candidates for a row without top-p");
    return isfinite(scaled_lse) && mass_outside(values, count, scaled_lse, config) <= 1.0 - config->top_p;
}

// The caller has asked sampler_candidates_hold_nucleus; kept_set checks it again from the
// mass outside, which it sums anyway.
SampledToken sampler_pick_nucleus_candidates(const float *values, const int *ids, int count, double lse,
                                             double scaled_lse, const SamplerConfig *config, double uniform,
                                             SamplerScratch *scratch) {
    CHECK(sampler_keeps_top_p_only(config, scratch->vocab_size) && isfinite(scaled_lse),
          "top-p candidates for a row without top-p alone, or without the row's log-normaliser");
    SampledToken out = pick(values, count, config, uniform, scratch, lse, scaled_lse);
    out.token = ids[out.token];
    return out;
}

float sampler_logprob(const float *logits, int V, int token) {
    float max_logit = logits[0];
    for (int v = 1; v < V; v++) max_logit = logits[v] > max_logit ? logits[v] : max_logit;
    double sum = 0;
    for (int v = 0; v < V; v++) sum += exp((double)(logits[v] - max_logit));
    return (float)(logits[token] - max_logit - log(sum));
}

void sampler_distribution(const float *logits, int V, const SamplerConfig *config, float *probs,
                          SamplerScratch *scratch) {
    memset(probs, 0, (size_t)V * sizeof(float));
    if (config->temperature <= 0.0f) {
        int best = 0;
        for (int v = 1; v < V; v++)
            if (logits[v] > logits[best]) best = v;
        probs[best] = 1.0f;
        return;
    }
    double log_normaliser;
    int count = kept_set(logits, V, config, scratch, &log_normaliser, NAN);
    for (int i = 0; i < count; i++) {
        int v = scratch->indices[i];
        probs[v] = (float)exp(scratch->values[v] - log_normaliser);
    }
}
