// Fixed, randomized and perplexity-based termination conditions, and the conversion of
// boundaries into segment lengths shared by all four (spec §6.5, §7). The parsing
// condition's tree walk is in rl/macro_parsing.c.
//
// Every condition first builds the released code's boundary list: response offsets,
// nondecreasing, starting at 0 and ending with the final token R-1. The lengths are the
// differences of consecutive boundaries followed by a 1 (the final singleton), exactly as
// the released code's `diff(B) + [1]`, so a repeated boundary becomes a zero-length
// segment unless dedupe_boundaries drops it.
#include "rl/macro.h"

#include <string.h>

#include "core/check.h"
#include "core/rng.h"

MacroConfig macro_config_default(void) {
    return (MacroConfig){
        .condition = TERMINATION_FIXED,
        .ngram = 1,
        .repeat_times = 1,
        .randomized_include_one = true,
        .parser_cutoff = 5,
        .dedupe_boundaries = true,
        .ppl_monotone = false,
        .seed = 1234,
    };
}

static const char *const termination_names[] = {
    [TERMINATION_FIXED] = "fixed",
    [TERMINATION_RANDOMIZED] = "randomized",
    [TERMINATION_PARSING] = "parsing",
    [TERMINATION_PPL] = "ppl",
};

int macro_termination_from_name(const char *name, TerminationCondition *out) {
    for (int c = 0; c < (int)(sizeof termination_names / sizeof termination_names[0]); c++) {
        if (name && !strcmp(name, termination_names[c])) {
            *out = (TerminationCondition)c;
            return 0;
        }
    }
    return err_set("unknown termination condition '%s' (expected fixed, randomized, parsing or ppl)",
                   name ? name : "(null)");
}

const char *macro_termination_name(TerminationCondition condition) {
    CHECK((unsigned)condition < sizeof termination_names / sizeof termination_names[0], "bad termination %d",
          (int)condition);
    return termination_names[condition];
}

void macro_segmentation_free(MacroSegmentation *s) {
    if (!s) return;
    free(s->lengths);
    s->lengths = NULL;
    s->count = 0;
    s->fallbacks = 0;
}

// A growing list of boundary offsets.
typedef struct {
    int *at;
    int count;
} Boundaries;

static void boundaries_push(Boundaries *b, int offset) {
    b->at[b->count++] = offset;
}

// The segments of boundary list b (0 = b[0] <= ... <= b[n-1] = R-1) and the final
// singleton: diff(b) + [1]. With dedupe, zero-length segments are dropped.
static void boundaries_to_segments(const Boundaries *b, int R, bool dedupe, MacroSegmentation *out) {
    CHECK(b->count >= 1 && b->at[0] == 0 && b->at[b->count - 1] == R - 1, "boundary list must span [0, R-1]");
    out->lengths = xmalloc(sizeof(int) * (size_t)b->count);
    out->count = 0;
    for (int k = 0; k + 1 < b->count; k++) {
        int length = b->at[k + 1] - b->at[k];
        CHECK(length >= 0, "boundaries out of order at %d", k);
        if (length == 0 && dedupe) continue;
        out->lengths[out->count++] = length;
    }
    out->lengths[out->count++] = 1;
}

// §7.1: walk tokens 0..R-2, counting; every n-th token closes a macro action.
static void fixed_boundaries(int n, int R, Boundaries *b) {
    boundaries_push(b, 0);
    int count = 0;
    for (int i = 0; i + 1 < R; i++) {
        if (++count == n) {
            boundaries_push(b, i + 1);
            count = 0;
        }
    }
    boundaries_push(b, R - 1);
}

// §7.2: the j-th macro action has length lengths[j]; after the list is used up, the walk
// stops and the rest (before the final token) is one macro action.
//
// The released code shuffles with Python's global `random`, seeded once per run, so a
// row's lengths depend on how many shuffles came before it (batch composition, rank,
// restarts). Here the shuffle is a Fisher-Yates whose draws are a pure function of
// (seed, row_stream, iteration): a deliberate generalisation to per-sample, reproducible
// draws with the same distribution (uniform over orderings of the multiset).
static void randomized_boundaries(const MacroConfig *config, int R, uint64_t row_stream, uint64_t iteration,
                                  Boundaries *b) {
    static const int lengths_with_one[] = {1, 2, 3, 5, 10};
    const int *base = config->randomized_include_one ? lengths_with_one : lengths_with_one + 1;
    int base_count = config->randomized_include_one ? 5 : 4;
    int list_count = base_count * config->repeat_times;
    int *list = xmalloc(sizeof(int) * (size_t)list_count);
    // repeat_interleave: each length k times in a row (the order before shuffling only
    // matters for reproducing a given shuffle, not for the distribution).
    for (int i = 0; i < list_count; i++) list[i] = base[i / config->repeat_times];
    uint64_t stream = rng_stream("macro-randomized", row_stream, iteration);
    for (int i = list_count - 1; i > 0; i--) {
        int j = (int)rng_below(config->seed, stream, (uint64_t)i, (uint64_t)i + 1);
        int swap = list[i];
        list[i] = list[j];
        list[j] = swap;
    }
    boundaries_push(b, 0);
    int count = 0, next = 0;
    for (int i = 0; i + 1 < R && next < list_count; i++) {
        if (++count == list[next]) {
            boundaries_push(b, i + 1);
            count = 0;
            next++;
        }
    }
    boundaries_push(b, R - 1);
    free(list);
}

// §7.5: the released code starts a macro action at token i whenever token i+1 is more
// surprising than token i (p[i+1] > p[i]); the paper's monotone reading keeps token i in
// the current action (perplexity non-increasing inside it) and starts the next at i+1.
// A NaN comparison is false, so a NaN perplexity never cuts.
static void ppl_boundaries(const float *ppl, bool monotone, int R, Boundaries *b) {
    boundaries_push(b, 0);
    for (int i = 0; i + 1 < R; i++) {
        if (!(ppl[i + 1] > ppl[i])) continue;
        int at = monotone ? i + 1 : i;
        if (at > b->at[b->count - 1]) boundaries_push(b, at);
    }
    // The monotone reading can cut at R-1, which is the final boundary anyway.
    if (b->at[b->count - 1] != R - 1) boundaries_push(b, R - 1);
}

// Parsing: the segment starts come from the tree walk; the final token is its own segment.
static int parsing_boundaries(const MacroConfig *config, int R, const char *const *token_text, Boundaries *b,
                              int *fallbacks) {
    bool *is_start = xcalloc((size_t)R, sizeof(bool));
    if (macro_parsing_starts(config->parser_cutoff, R, token_text, is_start, fallbacks) != 0) {
        free(is_start);
        return -1;
    }
    CHECK(is_start[0], "parsing must start a macro action at token 0");
    for (int j = 0; j < R - 1; j++)
        if (is_start[j]) boundaries_push(b, j);
    boundaries_push(b, R - 1);
    free(is_start);
    return 0;
}

static int check_config(const MacroConfig *config, int R, const float *token_ppl, const char *const *token_text) {
    if (R < 1) return err_set("macro_segment: a response needs at least one token (got %d)", R);
    switch (config->condition) {
    case TERMINATION_FIXED:
        if (config->ngram < 1) return err_set("--ngram must be >= 1 (got %d)", config->ngram);
        return 0;
    case TERMINATION_RANDOMIZED:
        if (config->repeat_times < 1 || config->repeat_times > 1000000)
            return err_set("--repeat-times must be in [1, 1000000] (got %d)", config->repeat_times);
        return 0;
    case TERMINATION_PARSING:
        if (config->parser_cutoff < 1) return err_set("--parser-cutoff must be >= 1 (got %d)", config->parser_cutoff);
        if (!token_text) return err_set("the parsing termination condition needs each token's text");
        return 0;
    case TERMINATION_PPL:
        if (!token_ppl) return err_set("the ppl termination condition needs each token's perplexity");
        return 0;
    }
    return err_set("unknown termination condition %d", (int)config->condition);
}

int macro_segment(const MacroConfig *config, int R, const float *token_ppl, const char *const *token_text,
                  uint64_t row_stream, uint64_t iteration, MacroSegmentation *out) {
    *out = (MacroSegmentation){0};
    if (check_config(config, R, token_ppl, token_text) != 0) return -1;
    if (R == 1) {
        out->lengths = xmalloc(sizeof(int));
        out->lengths[0] = 1;
        out->count = 1;
        return 0;
    }
    // Every condition adds at most one boundary per token, plus the first and the final.
    Boundaries b = {.at = xmalloc(sizeof(int) * ((size_t)R + 2)), .count = 0};
    int fallbacks = 0;
    bool dedupe = config->dedupe_boundaries;
    switch (config->condition) {
    case TERMINATION_FIXED:
        fixed_boundaries(config->ngram, R, &b);
        break;
    case TERMINATION_RANDOMIZED:
        randomized_boundaries(config, R, row_stream, iteration, &b);
        break;
    case TERMINATION_PARSING:
        if (parsing_boundaries(config, R, token_text, &b, &fallbacks) != 0) {
            free(b.at);
            return -1;
        }
        dedupe = true;
        break;
    case TERMINATION_PPL:
        ppl_boundaries(token_ppl, config->ppl_monotone, R, &b);
        dedupe = true;
        break;
    }
    CHECK(b.count <= R + 2, "too many boundaries");
    boundaries_to_segments(&b, R, dedupe, out);
    out->fallbacks = fallbacks;
    free(b.at);

    int total = 0;
    for (int k = 0; k < out->count; k++) total += out->lengths[k];
    CHECK(total == R, "segments sum to %d, not R = %d", total, R);
    return 0;
}
