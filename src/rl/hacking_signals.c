#include "rl/hacking_signals.h"

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/check.h"

// Every count below sorts keys and counts runs of equal ones: exact (no hashing, so no
// collisions) and plainly O(n log n) in the batch's tokens.

static int compare_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

// How many distinct keys keys[0, n) holds (sorts them).
static size_t count_distinct(uint64_t *keys, size_t n) {
    qsort(keys, n, sizeof(uint64_t), compare_u64);
    size_t distinct = 0;
    for (size_t k = 0; k < n; k++) distinct += k == 0 || keys[k] != keys[k - 1];
    return distinct;
}

static uint64_t pair_key(int first, int second) { return (uint64_t)(uint32_t)first << 32 | (uint32_t)second; }

// Distinct bigrams over all bigrams; NAN when there is none.
static double distinct_bigrams(const int *const *tokens, const int *lengths, int count) {
    size_t total = 0;
    for (int i = 0; i < count; i++) total += lengths[i] > 1 ? (size_t)lengths[i] - 1 : 0;
    if (total == 0) return NAN;
    uint64_t *keys = xmalloc(total * sizeof(uint64_t));
    size_t n = 0;
    for (int i = 0; i < count; i++)
        for (int t = 0; t + 1 < lengths[i]; t++) keys[n++] = pair_key(tokens[i][t], tokens[i][t + 1]);
    const size_t distinct = count_distinct(keys, n);
    free(keys);
    return (double)distinct / (double)total;
}

typedef struct {
    uint64_t high, low; // tokens 0-1 and 2-3 (a trigram: low holds token 2 only)
    int response;
} NGram;

static int compare_ngrams(const void *a, const void *b) {
    const NGram *x = a, *y = b;
    if (x->high != y->high) return x->high < y->high ? -1 : 1;
    if (x->low != y->low) return x->low < y->low ? -1 : 1;
    return (x->response > y->response) - (x->response < y->response);
}

static bool same_ngram(const NGram *x, const NGram *y) { return x->high == y->high && x->low == y->low; }

// A loop: one 4-gram at 3 or more places of the response (overlapping places count).
static bool is_repetitive(const int *tokens, int length, NGram *scratch) {
    if (length < 6) return false; // three places of a 4-gram need 6 tokens at the least
    int n = length - 3;
    for (int t = 0; t < n; t++)
        scratch[t] = (NGram){pair_key(tokens[t], tokens[t + 1]), pair_key(tokens[t + 2], tokens[t + 3]), 0};
    qsort(scratch, (size_t)n, sizeof(NGram), compare_ngrams);
    for (int run = 1, t = 1; t < n; t++) {
        run = same_ngram(&scratch[t], &scratch[t - 1]) ? run + 1 : 1;
        if (run >= 3) return true;
    }
    return false;
}

// The most responses that hold one trigram (each response counted once), over `count`.
static double shared_trigram(const int *const *tokens, const int *lengths, int count) {
    size_t total = 0;
    for (int i = 0; i < count; i++) total += lengths[i] > 2 ? (size_t)lengths[i] - 2 : 0;
    if (total == 0 || count == 0) return 0;
    NGram *all = xmalloc(total * sizeof(NGram));
    size_t n = 0;
    for (int i = 0; i < count; i++) {
        size_t start = n;
        for (int t = 0; t + 2 < lengths[i]; t++)
            all[n++] = (NGram){pair_key(tokens[i][t], tokens[i][t + 1]), (uint32_t)tokens[i][t + 2], i};
        // This response's trigrams once each.
        qsort(all + start, n - start, sizeof(NGram), compare_ngrams);
        size_t kept = start;
        for (size_t k = start; k < n; k++)
            if (k == start || !same_ngram(&all[k], &all[kept - 1])) all[kept++] = all[k];
        n = kept;
    }
    qsort(all, n, sizeof(NGram), compare_ngrams);
    size_t best = 0;
    for (size_t run = 0, k = 0; k < n; k++) {
        run = k > 0 && same_ngram(&all[k], &all[k - 1]) ? run + 1 : 1;
        if (run > best) best = run;
    }
    free(all);
    return (double)best / count;
}

typedef struct {
    const int *const *tokens;
    const int *lengths;
} Responses;

// By length, then token by token: identical responses end up next to each other.
static int compare_responses(const void *a, const void *b, void *context) {
    const Responses *r = context;
    int i = *(const int *)a, j = *(const int *)b;
    if (r->lengths[i] != r->lengths[j]) return r->lengths[i] < r->lengths[j] ? -1 : 1;
    for (int t = 0; t < r->lengths[i]; t++)
        if (r->tokens[i][t] != r->tokens[j][t]) return r->tokens[i][t] < r->tokens[j][t] ? -1 : 1;
    return 0;
}

// The most prompts that got one identical response, over the prompts.
static double same_answer(const int *const *tokens, const int *lengths, const int *groups, int count) {
    if (count <= 0) return 0;
    Responses responses = {tokens, lengths};
    int *order = xmalloc((size_t)count * sizeof(int));
    uint64_t *run_groups = xmalloc((size_t)count * sizeof(uint64_t));
    for (int i = 0; i < count; i++) order[i] = i;
    qsort_r(order, (size_t)count, sizeof(int), compare_responses, &responses);
    size_t best = 0;
    for (int first = 0, last; first < count; first = last) {
        last = first + 1;
        while (last < count && compare_responses(&order[first], &order[last], &responses) == 0) last++;
        for (int k = first; k < last; k++) run_groups[k - first] = (uint64_t)(uint32_t)groups[order[k]];
        const size_t prompts = count_distinct(run_groups, (size_t)(last - first));
        if (prompts > best) best = prompts;
    }
    for (int i = 0; i < count; i++) run_groups[i] = (uint64_t)(uint32_t)groups[i];
    const size_t prompts = count_distinct(run_groups, (size_t)count);
    free(order), free(run_groups);
    return (double)best / prompts;
}

void hacking_signals_measure(const int *const *tokens, const int *lengths, const int *groups, int count,
                             HackingSignals *out) {
    memset(out, 0, sizeof *out);
    long total_length = 0, longest = 0;
    for (int i = 0; i < count; i++) {
        total_length += lengths[i];
        if (lengths[i] > longest) longest = lengths[i];
    }
    out->mean_length = count > 0 ? (double)total_length / count : 0;
    out->distinct_2 = distinct_bigrams(tokens, lengths, count);
    NGram *scratch = xmalloc((size_t)(longest + 1) * sizeof(NGram));
    int repetitive = 0;
    for (int i = 0; i < count; i++) repetitive += is_repetitive(tokens[i], lengths[i], scratch);
    free(scratch);
    out->repetitive_fraction = count > 0 ? (double)repetitive / count : 0;
    out->same_answer_fraction = same_answer(tokens, lengths, groups, count);
    out->shared_trigram_fraction = shared_trigram(tokens, lengths, count);
}

unsigned hacking_alarms(const HackingSignals *first, const HackingSignals *now, const HackingLimits *limits) {
    unsigned alarms = 0;
    // NAN compares false everywhere below, so an unknown signal never sets one off.
    if (limits->length_ratio > 0 && first->mean_length > 0 &&
        (now->mean_length > limits->length_ratio * first->mean_length ||
         now->mean_length < first->mean_length / limits->length_ratio))
        alarms |= HACKING_LENGTH;
    if (limits->distinct_ratio > 0 && now->distinct_2 < limits->distinct_ratio * first->distinct_2)
        alarms |= HACKING_DIVERSITY;
    if (limits->fraction_rise > 0) {
        if (now->repetitive_fraction - first->repetitive_fraction >= limits->fraction_rise) alarms |= HACKING_REPETITION;
        if (now->same_answer_fraction - first->same_answer_fraction >= limits->fraction_rise)
            alarms |= HACKING_SAME_ANSWER;
        if (now->shared_trigram_fraction - first->shared_trigram_fraction >= limits->fraction_rise)
            alarms |= HACKING_SHARED_PHRASE;
    }
    return alarms;
}

// "N% of <what>, M% at the first iteration (--alarm-fraction-rise L)".
static void describe_rise(char *text, size_t size, const char *what, double now, double first,
                          const HackingLimits *limits) {
    snprintf(text, size, "%.0f%% of %s, %.0f%% at the first iteration (--alarm-fraction-rise %g)", 100 * now, what,
             100 * first, limits->fraction_rise);
}

void hacking_alarm_describe(unsigned alarm, const HackingSignals *first, const HackingSignals *now,
                            const HackingLimits *limits, char *text, size_t size) {
    switch (alarm) {
    case HACKING_LENGTH:
        snprintf(text, size, "mean response length %.1f tokens, %.2fx the first iteration's %.1f (--alarm-length-ratio %g)",
                 now->mean_length, now->mean_length / first->mean_length, first->mean_length, limits->length_ratio);
        break;
    case HACKING_DIVERSITY:
        snprintf(text, size, "distinct-2 %.3f, %.2fx the first iteration's %.3f (--alarm-distinct-ratio %g)",
                 now->distinct_2, now->distinct_2 / first->distinct_2, first->distinct_2, limits->distinct_ratio);
        break;
    case HACKING_REPETITION:
        describe_rise(text, size, "the responses repeat one 4-gram 3 or more times", now->repetitive_fraction,
                      first->repetitive_fraction, limits);
        break;
    case HACKING_SAME_ANSWER:
        describe_rise(text, size, "the prompts got one identical response", now->same_answer_fraction,
                      first->same_answer_fraction, limits);
        break;
    case HACKING_SHARED_PHRASE:
        describe_rise(text, size, "the responses hold one same trigram", now->shared_trigram_fraction,
                      first->shared_trigram_fraction, limits);
        break;
    default: CHECK(false, "hacking_alarm_describe: %u is not one alarm", alarm);
    }
}
