// The termination conditions of MA-PPO (rl/macro.h) against the spec's test vectors and
// hand-derived parses.
//
//   fixed       spec §12.1's table in the released mode (zero-length segments kept) and
//               deduplicated; n = 1 with dedupe is token-level for R = 1..50.
//   randomized  reproducible per (seed, stream, iteration), different across rows, lengths
//               drawn from the multiset without replacement, uniform first length.
//   ppl         spec §12.3 in both readings.
//   parsing     tests/fixtures/macro/parsing_cases.json: responses tokenized with SmolLM2's
//               tokenizer, link-grammar's tree of each sentence, and the segmentation
//               derived by hand from that tree with the rules of §7.3 (each case carries its
//               derivation); multi-sentence, newlines, no EOS, other cutoffs, and fallbacks
//               (gibberish, code, CJK, French). Also: random text never breaks the tiling,
//               and several threads may parse at once.
#include <jansson.h>
#include <omp.h>
#include <string.h>
#include <time.h>

#include "core/check.h"
#include "core/rng.h"
#include "rl/macro.h"
#include "test.h"
#include "tokenizer/tokenizer.h"

static const char *smollm2_path = "models/SmolLM2-135M-Instruct.Q4_1.gguf";
static const char *parsing_cases_path = "tests/fixtures/macro/parsing_cases.json";

// True if s tiles [0, R) with positive lengths and ends with the final singleton (R >= 2).
static bool tiles_positive(const MacroSegmentation *s, int R) {
    int total = 0;
    for (int k = 0; k < s->count; k++) {
        if (s->lengths[k] <= 0) return false;
        total += s->lengths[k];
    }
    if (total != R) return false;
    return R == 1 ? s->count == 1 : s->lengths[s->count - 1] == 1;
}

static bool lengths_equal(const MacroSegmentation *s, const int *expected, int count) {
    if (s->count != count) return false;
    for (int k = 0; k < count; k++)
        if (s->lengths[k] != expected[k]) return false;
    return true;
}

static void format_lengths(const int *lengths, int count, char *out, size_t size) {
    size_t used = 0;
    out[0] = '\0';
    for (int k = 0; k < count && used + 16 < size; k++)
        used += (size_t)snprintf(out + used, size - used, k ? ",%d" : "%d", lengths[k]);
}

static MacroSegmentation segment_fixed(int n, int R, bool dedupe) {
    MacroConfig config = macro_config_default();
    config.condition = TERMINATION_FIXED;
    config.ngram = n;
    config.dedupe_boundaries = dedupe;
    MacroSegmentation s;
    CHECK(macro_segment(&config, R, NULL, NULL, 0, 0, &s) == 0, "%s", err_msg());
    return s;
}

// --- fixed n-gram ------------------------------------------------------------------------

// Spec §12.1 (released code, P = 5): the lengths for R = 7..11 and n = 1, 2, 3, 5.
static void test_fixed_spec_table_released(void) {
    static const int ngrams[4] = {1, 2, 3, 5};
    static const int table[5][4][13] = {
        // {count, lengths...}
        {{8, 1, 1, 1, 1, 1, 1, 0, 1}, {5, 2, 2, 2, 0, 1}, {4, 3, 3, 0, 1}, {3, 5, 1, 1}},                    // R = 7
        {{9, 1, 1, 1, 1, 1, 1, 1, 0, 1}, {5, 2, 2, 2, 1, 1}, {4, 3, 3, 1, 1}, {3, 5, 2, 1}},                 // R = 8
        {{10, 1, 1, 1, 1, 1, 1, 1, 1, 0, 1}, {6, 2, 2, 2, 2, 0, 1}, {4, 3, 3, 2, 1}, {3, 5, 3, 1}},          // R = 9
        {{11, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 1}, {6, 2, 2, 2, 2, 1, 1}, {5, 3, 3, 3, 0, 1}, {3, 5, 4, 1}},    // R = 10
        {{12, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 1}, {7, 2, 2, 2, 2, 2, 0, 1}, {5, 3, 3, 3, 1, 1}, {4, 5, 5, 0, 1}}, // R = 11
    };
    for (int r = 0; r < 5; r++) {
        for (int c = 0; c < 4; c++) {
            int R = 7 + r;
            MacroSegmentation s = segment_fixed(ngrams[c], R, false);
            const int *expected = table[r][c];
            char got[256], want[256];
            format_lengths(s.lengths, s.count, got, sizeof got);
            format_lengths(expected + 1, expected[0], want, sizeof want);
            EXPECT(lengths_equal(&s, expected + 1, expected[0]), "R=%d n=%d: got %s, expected %s", R, ngrams[c], got,
                   want);
            EXPECT(s.fallbacks == 0, "no fallbacks");
            macro_segmentation_free(&s);
        }
    }
}

// The same table with dedupe: the zero-length segments are gone, the rest is unchanged.
static void test_fixed_spec_table_deduped(void) {
    for (int R = 7; R <= 11; R++) {
        for (int n = 1; n <= 5; n++) {
            MacroSegmentation released = segment_fixed(n, R, false);
            MacroSegmentation deduped = segment_fixed(n, R, true);
            int expected[64], count = 0;
            for (int k = 0; k < released.count; k++)
                if (released.lengths[k] > 0) expected[count++] = released.lengths[k];
            EXPECT(lengths_equal(&deduped, expected, count), "R=%d n=%d deduped", R, n);
            EXPECT(tiles_positive(&deduped, R), "R=%d n=%d tiles", R, n);
            macro_segmentation_free(&released);
            macro_segmentation_free(&deduped);
        }
    }
    static const int r7_n2[] = {2, 2, 2, 1};
    MacroSegmentation s = segment_fixed(2, 7, true);
    EXPECT(lengths_equal(&s, r7_n2, 4), "R=7 n=2 deduped is 2,2,2,1");
    macro_segmentation_free(&s);
}

static void test_fixed_ngram1_is_token_level(void) {
    for (int R = 1; R <= 50; R++) {
        MacroSegmentation s = segment_fixed(1, R, true);
        bool ones = s.count == R;
        for (int k = 0; ones && k < s.count; k++) ones = s.lengths[k] == 1;
        EXPECT(ones, "R=%d: %d segments, expected R ones", R, s.count);
        macro_segmentation_free(&s);
    }
    // R == 1 is one segment in the released mode too (the released code never sees it).
    MacroSegmentation s = segment_fixed(3, 1, false);
    EXPECT(s.count == 1 && s.lengths[0] == 1, "R=1 released: one segment");
    macro_segmentation_free(&s);
}

// --- randomized n-gram ---------------------------------------------------------------------

static MacroSegmentation segment_randomized(int k, bool include_one, bool dedupe, uint64_t seed, uint64_t stream,
                                            uint64_t iteration, int R) {
    MacroConfig config = macro_config_default();
    config.condition = TERMINATION_RANDOMIZED;
    config.repeat_times = k;
    config.randomized_include_one = include_one;
    config.dedupe_boundaries = dedupe;
    config.seed = seed;
    MacroSegmentation s;
    CHECK(macro_segment(&config, R, NULL, NULL, stream, iteration, &s) == 0, "%s", err_msg());
    return s;
}

static void test_randomized_reproducible_per_row(void) {
    MacroSegmentation a = segment_randomized(2, true, true, 1234, 7, 3, 120);
    MacroSegmentation b = segment_randomized(2, true, true, 1234, 7, 3, 120);
    EXPECT(lengths_equal(&a, b.lengths, b.count), "same key, same lengths");
    // Different rows, iterations and seeds draw different shuffles (42 lengths: a repeat by
    // chance has probability ~1e-20).
    MacroSegmentation other_row = segment_randomized(2, true, true, 1234, 8, 3, 120);
    MacroSegmentation other_iteration = segment_randomized(2, true, true, 1234, 7, 4, 120);
    MacroSegmentation other_seed = segment_randomized(2, true, true, 99, 7, 3, 120);
    EXPECT(!lengths_equal(&a, other_row.lengths, other_row.count), "another row differs");
    EXPECT(!lengths_equal(&a, other_iteration.lengths, other_iteration.count), "another iteration differs");
    EXPECT(!lengths_equal(&a, other_seed.lengths, other_seed.count), "another seed differs");
    macro_segmentation_free(&a);
    macro_segmentation_free(&b);
    macro_segmentation_free(&other_row);
    macro_segmentation_free(&other_iteration);
    macro_segmentation_free(&other_seed);
}

// A long response uses the whole shuffled list: its lengths are exactly the multiset, then
// the rest as one macro action, then the final singleton.
static void test_randomized_uses_the_multiset(void) {
    for (int include_one = 0; include_one <= 1; include_one++) {
        for (int k = 1; k <= 3; k++) {
            int list_count = (include_one ? 5 : 4) * k, list_sum = (include_one ? 21 : 20) * k;
            for (uint64_t stream = 0; stream < 20; stream++) {
                int R = list_sum + 1 + 7 + (int)stream; // 7+ tokens of rest, then the final one
                MacroSegmentation s = segment_randomized(k, include_one, true, 1234, stream, 0, R);
                EXPECT(tiles_positive(&s, R), "tiles");
                EXPECT(s.count == list_count + 2, "k=%d: %d segments, expected %d", k, s.count, list_count + 2);
                if (s.count != list_count + 2) {
                    macro_segmentation_free(&s);
                    continue;
                }
                int seen[11] = {0};
                for (int j = 0; j < list_count; j++)
                    if (s.lengths[j] >= 1 && s.lengths[j] <= 10) seen[s.lengths[j]]++;
                EXPECT(seen[1] == (include_one ? k : 0) && seen[2] == k && seen[3] == k && seen[5] == k &&
                           seen[10] == k,
                       "k=%d include_one=%d: counts 1:%d 2:%d 3:%d 5:%d 10:%d", k, include_one, seen[1], seen[2],
                       seen[3], seen[5], seen[10]);
                EXPECT(s.lengths[list_count] == R - 1 - list_sum, "the rest is one macro action");
                EXPECT(s.lengths[list_count + 1] == 1, "final singleton");
                macro_segmentation_free(&s);
            }
        }
    }
}

// Short responses: every length but the remainder is from the multiset, no value more than
// k times; the released mode's zero-length segment appears only right before the final one.
static void test_randomized_short_responses(void) {
    for (int R = 1; R <= 60; R++) {
        for (uint64_t stream = 0; stream < 10; stream++) {
            for (int dedupe = 0; dedupe <= 1; dedupe++) {
                MacroSegmentation s = segment_randomized(1, true, dedupe, 5, stream, (uint64_t)R, R);
                int total = 0, seen[11] = {0};
                bool ok = s.count >= 1 && s.lengths[s.count - 1] == 1;
                for (int j = 0; j < s.count; j++) {
                    total += s.lengths[j];
                    if (s.lengths[j] == 0) ok = ok && !dedupe && j == s.count - 2;
                    if (j < s.count - 2 && s.lengths[j] >= 1 && s.lengths[j] <= 10) seen[s.lengths[j]]++;
                    if (j < s.count - 2) ok = ok && s.lengths[j] >= 1 && s.lengths[j] <= 10;
                }
                for (int v = 0; v <= 10; v++) ok = ok && seen[v] <= 1;
                EXPECT(ok && total == R, "R=%d stream=%d dedupe=%d", R, (int)stream, dedupe);
                if (dedupe) EXPECT(tiles_positive(&s, R), "R=%d tiles", R);
                macro_segmentation_free(&s);
            }
        }
    }
}

// The first macro action's length is uniform over the multiset's values (Fisher-Yates).
static void test_randomized_first_length_uniform(void) {
    int counts[11] = {0}, trials = 20000;
    for (int t = 0; t < trials; t++) {
        MacroSegmentation s = segment_randomized(1, true, true, 1234, (uint64_t)t, 0, 40);
        counts[s.lengths[0]]++;
        macro_segmentation_free(&s);
    }
    static const int values[5] = {1, 2, 3, 5, 10};
    for (int v = 0; v < 5; v++) // expected 4000 each, sd ~57
        EXPECT(counts[values[v]] > 3700 && counts[values[v]] < 4300, "first length %d drawn %d times of %d",
               values[v], counts[values[v]], trials);
}

// --- perplexity ------------------------------------------------------------------------------

static void test_ppl_spec_example(void) {
    static const float ppl[6] = {5, 3, 4, 2, 6, 1};
    MacroConfig config = macro_config_default();
    config.condition = TERMINATION_PPL;
    MacroSegmentation s;
    EXPECT(macro_segment(&config, 6, ppl, NULL, 0, 0, &s) == 0, "%s", err_msg());
    static const int code[] = {1, 2, 2, 1}; // [t0] [t1 t2] [t3 t4] [t5]
    EXPECT(lengths_equal(&s, code, 4), "released reading");
    macro_segmentation_free(&s);

    config.ppl_monotone = true;
    EXPECT(macro_segment(&config, 6, ppl, NULL, 0, 0, &s) == 0, "%s", err_msg());
    static const int monotone[] = {2, 2, 1, 1}; // [t0 t1] [t2 t3] [t4] [t5]
    EXPECT(lengths_equal(&s, monotone, 4), "monotone reading");
    macro_segmentation_free(&s);
}

static void test_ppl_edge_cases(void) {
    MacroConfig config = macro_config_default();
    config.condition = TERMINATION_PPL;
    MacroSegmentation s;
    // Rising at the last step: the monotone reading cuts at R-1, which is final anyway.
    static const float rising[3] = {1, 2, 3};
    for (int monotone = 0; monotone <= 1; monotone++) {
        for (int dedupe = 0; dedupe <= 1; dedupe++) {
            config.ppl_monotone = monotone;
            config.dedupe_boundaries = dedupe;
            EXPECT(macro_segment(&config, 3, rising, NULL, 0, 0, &s) == 0, "%s", err_msg());
            EXPECT(tiles_positive(&s, 3), "rising, monotone=%d dedupe=%d: no empty segment", monotone, dedupe);
            macro_segmentation_free(&s);
        }
    }
    static const float falling[4] = {4, 3, 2, 1};
    EXPECT(macro_segment(&config, 4, falling, NULL, 0, 0, &s) == 0, "%s", err_msg());
    static const int one_action[] = {3, 1};
    EXPECT(lengths_equal(&s, one_action, 2), "non-increasing: one macro action and the final token");
    macro_segmentation_free(&s);
    EXPECT(macro_segment(&config, 1, falling, NULL, 0, 0, &s) == 0 && s.count == 1 && s.lengths[0] == 1, "R=1");
    macro_segmentation_free(&s);

    // Random perplexities: always a positive tiling ending in the final singleton.
    float ppl[64];
    for (int t = 0; t < 200; t++) {
        int R = 1 + (int)rng_below(3, 1, (uint64_t)t, 64);
        for (int j = 0; j < R; j++) ppl[j] = 1 + 10 * rng_uniform(3, 2, (uint64_t)(t * 64 + j));
        config.ppl_monotone = t % 2;
        EXPECT(macro_segment(&config, R, ppl, NULL, 0, 0, &s) == 0, "%s", err_msg());
        EXPECT(tiles_positive(&s, R), "random ppl R=%d", R);
        macro_segmentation_free(&s);
    }
}

// --- errors ----------------------------------------------------------------------------------

static void test_bad_input(void) {
    MacroConfig config = macro_config_default();
    MacroSegmentation s;
    EXPECT(macro_segment(&config, 0, NULL, NULL, 0, 0, &s) == -1, "R = 0");
    config.ngram = 0;
    EXPECT(macro_segment(&config, 5, NULL, NULL, 0, 0, &s) == -1 && strstr(err_msg(), "ngram"), "ngram 0: %s",
           err_msg());
    config = macro_config_default();
    config.condition = TERMINATION_RANDOMIZED;
    config.repeat_times = 0;
    EXPECT(macro_segment(&config, 5, NULL, NULL, 0, 0, &s) == -1, "repeat_times 0");
    config = macro_config_default();
    config.condition = TERMINATION_PPL;
    EXPECT(macro_segment(&config, 5, NULL, NULL, 0, 0, &s) == -1 && strstr(err_msg(), "perplexity"),
           "ppl without perplexities: %s", err_msg());
    config.condition = TERMINATION_PARSING;
    EXPECT(macro_segment(&config, 5, NULL, NULL, 0, 0, &s) == -1 && strstr(err_msg(), "text"),
           "parsing without text: %s", err_msg());
    config.parser_cutoff = 0;
    const char *text[2] = {"Hi", "."};
    EXPECT(macro_segment(&config, 2, NULL, text, 0, 0, &s) == -1, "parser cutoff 0");

    TerminationCondition condition;
    static const char *names[4] = {"fixed", "randomized", "parsing", "ppl"};
    for (int c = 0; c < 4; c++) {
        EXPECT(macro_termination_from_name(names[c], &condition) == 0 && (int)condition == c, "%s", names[c]);
        EXPECT(!strcmp(macro_termination_name((TerminationCondition)c), names[c]), "name of %d", c);
    }
    EXPECT(macro_termination_from_name("constituency", &condition) == -1 && strstr(err_msg(), "constituency"),
           "unknown name: %s", err_msg());
}

// --- parsing ---------------------------------------------------------------------------------

static Tokenizer *tokenizer;

// The response's tokens and their stream-decoded pieces (EOS last when asked: piece "").
static char **token_pieces(const char *text, bool eos, int *R) {
    int *ids, count;
    tokenizer_encode(tokenizer, text, strlen(text), false, &ids, &count);
    ids = xrealloc(ids, sizeof(int) * ((size_t)count + 1));
    if (eos) ids[count++] = tokenizer_eos_id(tokenizer);
    char **pieces = xmalloc(sizeof(char *) * (size_t)count);
    TokenizerStream *stream = tokenizer_stream_new(tokenizer, true);
    for (int j = 0; j < count; j++) tokenizer_stream_push(stream, ids[j], &pieces[j]);
    tokenizer_stream_free(stream);
    free(ids);
    *R = count;
    return pieces;
}

static void free_pieces(char **pieces, int R) {
    for (int j = 0; j < R; j++) free(pieces[j]);
    free(pieces);
}

static int json_int_array(const json_t *array, int *out, int capacity) {
    int n = (int)json_array_size(array);
    CHECK(n <= capacity, "fixture array too long");
    for (int k = 0; k < n; k++) out[k] = (int)json_integer_value(json_array_get(array, (size_t)k));
    return n;
}

static void test_parsing_hand_derived_cases(void) {
    json_error_t error;
    json_t *cases = json_load_file(parsing_cases_path, 0, &error);
    CHECK(cases, "%s: %s", parsing_cases_path, error.text);
    double parse_seconds = 0;
    int sentences_parsed = 0;
    for (size_t c = 0; c < json_array_size(cases); c++) {
        const json_t *row = json_array_get(cases, c);
        const char *name = json_string_value(json_object_get(row, "name"));
        const char *text = json_string_value(json_object_get(row, "text"));
        int R;
        char **pieces = token_pieces(text, json_is_true(json_object_get(row, "eos")), &R);

        // The inputs the derivation was made from: SmolLM2's pieces and link-grammar's trees.
        const json_t *tokens = json_object_get(row, "tokens");
        bool same_tokens = (int)json_array_size(tokens) == R;
        for (int j = 0; same_tokens && j < R; j++)
            same_tokens = !strcmp(pieces[j], json_string_value(json_array_get(tokens, (size_t)j)));
        EXPECT(same_tokens, "%s: the tokenizer's pieces differ from the fixture's", name);
        const json_t *sentences = json_object_get(row, "sentences"), *trees = json_object_get(row, "trees");
        for (size_t k = 0; k < json_array_size(sentences); k++) {
            const char *sentence = json_string_value(json_array_get(sentences, k));
            const json_t *expected_tree = json_array_get(trees, k);
            struct timespec t0, t1;
            clock_gettime(CLOCK_MONOTONIC, &t0);
            char *tree = macro_parsing_tree(sentence);
            clock_gettime(CLOCK_MONOTONIC, &t1);
            if (c > 0) { // the first call loads the dictionary
                parse_seconds += (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
                sentences_parsed++;
            }
            if (json_is_null(expected_tree))
                EXPECT(!tree, "%s: sentence %zu should not parse, got %s", name, k, tree);
            else
                EXPECT(tree && !strcmp(tree, json_string_value(expected_tree)), "%s: tree %s, expected %s", name,
                       tree ? tree : "(none)", json_string_value(expected_tree));
            free(tree);
        }

        MacroConfig config = macro_config_default();
        config.condition = TERMINATION_PARSING;
        config.parser_cutoff = (int)json_integer_value(json_object_get(row, "cutoff"));
        MacroSegmentation s;
        EXPECT(macro_segment(&config, R, NULL, (const char *const *)pieces, 0, 0, &s) == 0, "%s", err_msg());
        int expected[64];
        int count = json_int_array(json_object_get(row, "lengths"), expected, 64);
        char got[256], want[256];
        format_lengths(s.lengths, s.count, got, sizeof got);
        format_lengths(expected, count, want, sizeof want);
        EXPECT(lengths_equal(&s, expected, count), "%s: got %s, expected %s", name, got, want);
        EXPECT(s.fallbacks == json_integer_value(json_object_get(row, "fallbacks")), "%s: %d fallbacks", name,
               s.fallbacks);
        EXPECT(tiles_positive(&s, R), "%s: tiles", name);
        macro_segmentation_free(&s);
        free_pieces(pieces, R);
    }
    if (sentences_parsed)
        printf("# parsing: %.2f ms per sentence (%d sentences, link-grammar, after the dictionary load)\n",
               1e3 * parse_seconds / sentences_parsed, sentences_parsed);
    json_decref(cases);
}

// Random mixtures of words, punctuation, spaces, newlines, digits, code and non-ASCII text,
// as byte-level pieces and as arbitrary split points (with invalid UTF-8 too): the result
// always tiles the response with the final singleton, whatever the parser makes of it.
static void test_parsing_random_text_tiles(void) {
    static const char *const fragments[] = {
        "The", " cat", " sat", ".", " ", "\n", "\n\n", " on", " the", " mat", ",", " and", " I", " think",
        " so", "!", "?", " It", "'s", " good", " 42", " x", "+", "1", "(", ")", " 猫", "é", "\xe7\x8c", "\xab",
        "  ", "\t", "...", " don", "'t", " ", "", "\xff", " we", " went", " home", " yesterday", "[", "]",
    };
    const int fragment_count = (int)(sizeof fragments / sizeof fragments[0]);
    MacroConfig config = macro_config_default();
    config.condition = TERMINATION_PARSING;
    const char *pieces[80];
    for (int t = 0; t < 300; t++) {
        int R = 1 + (int)rng_below(11, 1, (uint64_t)t, 80);
        for (int j = 0; j < R; j++) pieces[j] = fragments[rng_below(11, 2, (uint64_t)(t * 80 + j), (uint64_t)fragment_count)];
        config.parser_cutoff = 1 + t % 8;
        MacroSegmentation s;
        EXPECT(macro_segment(&config, R, NULL, pieces, 0, 0, &s) == 0, "%s", err_msg());
        EXPECT(tiles_positive(&s, R), "random text %d (R=%d) tiles", t, R);
        macro_segmentation_free(&s);
    }
    // Whitespace only, and a single token.
    const char *blank[4] = {" ", "\n", "  ", ""};
    MacroSegmentation s;
    EXPECT(macro_segment(&config, 4, NULL, blank, 0, 0, &s) == 0 && s.count == 2 && s.lengths[0] == 3,
           "blank text: one action and the final token");
    macro_segmentation_free(&s);
    EXPECT(macro_segment(&config, 1, NULL, blank, 0, 0, &s) == 0 && s.count == 1, "R=1");
    macro_segmentation_free(&s);
}

// Rows segmented on several threads at once (the parser is shared behind a mutex) give the
// same segmentations as one thread.
static void test_parsing_threads(void) {
    static const char *const texts[] = {
        "My sister bought a new car yesterday. She drives it to work every day.",
        "Please remember to water the plants before you leave.\nThanks!",
        "The committee postponed the meeting until next Tuesday. asdf qwer zxcv",
        "It's important to stay hydrated, especially during hot weather!",
    };
    enum { ROWS = 16 };
    int R[ROWS];
    char **pieces[ROWS];
    MacroSegmentation serial[ROWS], parallel[ROWS];
    MacroConfig config = macro_config_default();
    config.condition = TERMINATION_PARSING;
    for (int r = 0; r < ROWS; r++) {
        pieces[r] = token_pieces(texts[r % 4], true, &R[r]);
        CHECK(macro_segment(&config, R[r], NULL, (const char *const *)pieces[r], 0, 0, &serial[r]) == 0, "%s",
              err_msg());
    }
    int failures = 0;
#pragma omp parallel for num_threads(4) schedule(dynamic, 1) reduction(+ : failures)
    for (int r = 0; r < ROWS; r++)
        if (macro_segment(&config, R[r], NULL, (const char *const *)pieces[r], 0, 0, &parallel[r]) != 0) failures++;
    EXPECT(failures == 0, "parallel segmentation failed");
    for (int r = 0; r < ROWS; r++) {
        if (!failures)
            EXPECT(lengths_equal(&parallel[r], serial[r].lengths, serial[r].count), "row %d differs across threads", r);
        macro_segmentation_free(&serial[r]);
        macro_segmentation_free(&parallel[r]);
        free_pieces(pieces[r], R[r]);
    }
    // Shutting down and parsing again recreates the parser.
    macro_parsing_shutdown();
    char *tree = macro_parsing_tree("The cat sat on the mat.");
    EXPECT(tree && !strncmp(tree, "[S ", 3), "parser recreated after shutdown: %s", tree ? tree : "(none)");
    free(tree);
}

int main(void) {
    RUN(test_fixed_spec_table_released);
    RUN(test_fixed_spec_table_deduped);
    RUN(test_fixed_ngram1_is_token_level);
    RUN(test_randomized_reproducible_per_row);
    RUN(test_randomized_uses_the_multiset);
    RUN(test_randomized_short_responses);
    RUN(test_randomized_first_length_uniform);
    RUN(test_ppl_spec_example);
    RUN(test_ppl_edge_cases);
    RUN(test_bad_input);
    if (tokenizer_load(&tokenizer, smollm2_path) != 0) {
        printf("FAIL parsing tests (%s)\n", err_msg());
        return 1;
    }
    RUN(test_parsing_hand_derived_cases);
    RUN(test_parsing_random_text_tiles);
    RUN(test_parsing_threads);
    tokenizer_free(tokenizer);
    macro_parsing_shutdown();
    TEST_EXIT();
}
