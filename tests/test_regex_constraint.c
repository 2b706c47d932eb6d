// Tests of gen/regex_constraint.c (regular expressions and choices for structured outputs):
//  - the recogniser against Python's re: every (pattern, text) of
//    tests/fixtures/regex/cases.json (tools/make_regex_fixtures.py: re.fullmatch with
//    re.ASCII, and re.search for JSON Schema's unanchored `pattern`), multi-byte UTF-8
//    texts included, and every prefix of a matching text alive;
//  - prefix viability: over a small byte alphabet (a, b, c and the two bytes of é), a text
//    is alive exactly when some extension of it matches (brute force);
//  - refusals name the construct and its position; the caps are refused, not hit;
//  - choices; JSON-string and length options;
//  - the token mask under a regex and under a choice equals the brute force (each of
//    SmolLM2's 49,152 tokens fed to the state) at every state of a text.
#include <jansson.h>
#include <math.h>
#include <string.h>

#include "core/check.h"
#include "core/timer.h"
#include "gen/constraint.h"
#include "gen/regex_constraint.h"
#include "gen/token_mask.h"
#include "tokenizer/tokenizer.h"
#include "test.h"
#include "constraint_check.h"

static const char *fixture_path = "tests/fixtures/regex/cases.json";

static RegexConstraint *compile(const char *pattern, const RegexOptions *options) {
    RegexConstraint *r = NULL;
    if (regex_constraint_compile(&r, pattern, strlen(pattern), options, "regex") != 0)
        fprintf(stderr, "  %s refused: %s\n", pattern, err_msg());
    return r;
}

static bool prefixes_alive(const RegexConstraint *r, const char *text, size_t length) {
    int32_t s = regex_state_start(r);
    for (size_t i = 0; i < length; i++)
        if ((s = regex_state_feed(r, s, (uint8_t)text[i])) < 0) return false;
    return true;
}

static void check_group(json_t *group, bool search, int *patterns, int *texts, int *matches) {
    for (size_t p = 0; p < json_array_size(group); p++) {
        json_t *entry = json_array_get(group, p);
        const char *pattern = json_string_value(json_object_get(entry, "pattern"));
        RegexOptions options = {.search = search, .max_chars = -1};
        RegexConstraint *r = compile(pattern, &options);
        EXPECT(r != NULL, "/%s/ compiles", pattern);
        if (!r) continue;
        (*patterns)++;
        json_t *cases = json_object_get(entry, "cases");
        int wrong = 0;
        for (size_t k = 0; k < json_array_size(cases); k++) {
            json_t *text = json_array_get(json_array_get(cases, k), 0);
            const bool expected = json_is_true(json_array_get(json_array_get(cases, k), 1));
            const char *t = json_string_value(text);
            const size_t n = json_string_length(text);
            const bool got = regex_constraint_matches(r, t, n);
            if (got != expected && wrong++ < 3)
                EXPECT(false, "/%s/%s on \"%s\": %d, Python says %d", pattern, search ? " (search)" : "", t, got, expected);
            if (expected) EXPECT(prefixes_alive(r, t, n), "/%s/: every prefix of \"%s\" is alive", pattern, t);
            (*texts)++, *matches += expected;
        }
        EXPECT(wrong == 0, "/%s/: %d texts judged unlike Python", pattern, wrong);
        regex_constraint_free(r);
    }
}

static void test_against_python(void) {
    json_error_t error;
    json_t *fixture = json_load_file(fixture_path, JSON_ALLOW_NUL, &error);
    EXPECT(fixture != NULL, "%s: %s (tools/make_regex_fixtures.py writes it)", fixture_path, error.text);
    if (!fixture) return;
    int patterns = 0, texts = 0, matches = 0;
    check_group(json_object_get(fixture, "fullmatch"), false, &patterns, &texts, &matches);
    check_group(json_object_get(fixture, "search"), true, &patterns, &texts, &matches);
    json_t *refused = json_object_get(fixture, "refused");
    for (size_t i = 0; i < json_array_size(refused); i++) {
        const char *pattern = json_string_value(json_array_get(refused, i));
        RegexConstraint *r = NULL;
        EXPECT(regex_constraint_compile(&r, pattern, strlen(pattern), NULL, "regex") != 0 && !r,
               "/%s/ (refused by Python) is refused", pattern);
        EXPECT(strstr(err_msg(), "(at position ") != NULL, "/%s/: the error gives a position: %s", pattern, err_msg());
        regex_constraint_free(r);
    }
    printf("against Python's re: %d patterns, %d texts (%d match), %zu refusals\n", patterns, texts, matches,
           json_array_size(refused));
    EXPECT(patterns >= 50 && texts >= 3000, "the fixture has its cases (%d patterns, %d texts)", patterns, texts);
    json_decref(fixture);
}

// --- prefix viability -------------------------------------------------------------------

static const uint8_t alphabet[] = {'a', 'b', 'c', 0xC3, 0xA9};
enum { ALPHABET = sizeof alphabet, CHECKED = 4, EXTENDED = 9 };

// Whether some extension of buf[0, length) (up to EXTENDED bytes in all) matches; for
// lengths up to CHECKED, compares with the DFA's state.
static bool brute_live(const RegexConstraint *r, uint8_t *buf, int length, int *compared, int *wrong, const char *pattern) {
    bool live = regex_constraint_matches(r, (const char *)buf, (size_t)length);
    if (length < EXTENDED)
        for (int x = 0; x < ALPHABET && (!live || length <= CHECKED); x++) {
            buf[length] = alphabet[x];
            live |= brute_live(r, buf, length + 1, compared, wrong, pattern);
        }
    if (length <= CHECKED) {
        const bool alive = prefixes_alive(r, (const char *)buf, (size_t)length);
        (*compared)++;
        if (alive != live && (*wrong)++ < 3)
            fprintf(stderr, "  /%s/: a prefix of %d bytes is %s, the brute force says %s\n", pattern, length,
                    alive ? "alive" : "dead", live ? "live" : "dead");
    }
    return live;
}

static void test_prefix_viability(void) {
    // Where dead states arise (a state set that cannot reach the match): an empty class, a
    // JSON string's alphabet, a length bound. Then patterns where every state is live.
    const struct {
        const char *pattern;
        RegexOptions options;
    } cut[] = {{"a[^\\s\\S]|b", {.max_chars = -1}},
               {"a\\x01|bc?", {.json_string = true, .max_chars = -1}},
               {"(ab|a)c?", {.min_chars = 3, .max_chars = -1}},
               {"[ab]*c", {.min_chars = 2, .max_chars = 3}}};
    int compared = 0, wrong = 0;
    for (size_t i = 0; i < sizeof cut / sizeof cut[0]; i++) {
        RegexConstraint *r = compile(cut[i].pattern, &cut[i].options);
        EXPECT(r != NULL, "/%s/ compiles", cut[i].pattern);
        if (!r) continue;
        uint8_t buf[EXTENDED + 1];
        brute_live(r, buf, 0, &compared, &wrong, cut[i].pattern);
        regex_constraint_free(r);
    }
    const char *patterns[] = {"(ab|a)*b", "a{2,3}c?", "(a|bc)+", "[ab]c{1,2}|ca", "\xc3\xa9+a|b", "(\xc3\xa9|a)b{0,2}",
                              "[^a]c", "a.b", "(a|b)*c(a|b)", "(?:\xc3\xa9\xc3\xa9){2}|\xc3\xa9" "a"};
    for (size_t i = 0; i < sizeof patterns / sizeof patterns[0]; i++) {
        RegexConstraint *r = compile(patterns[i], NULL);
        EXPECT(r != NULL, "/%s/ compiles", patterns[i]);
        if (!r) continue;
        uint8_t buf[EXTENDED + 1];
        brute_live(r, buf, 0, &compared, &wrong, patterns[i]);
        regex_constraint_free(r);
    }
    printf("prefix viability: %d prefixes compared with the brute force\n", compared);
    EXPECT(wrong == 0, "%d prefixes alive or dead unlike the brute force", wrong);
}

// --- refusals ---------------------------------------------------------------------------

static void test_refusals(void) {
    const struct {
        const char *pattern, *message;
    } cases[] = {
        {"a(?=b)", "lookahead and lookbehind are not supported (at position 1)"},
        {"(?<!a)b", "lookahead and lookbehind are not supported (at position 0)"},
        {"(a)\\1", "backreferences and octal escapes are not supported (at position 3)"},
        {"(?P<x>a)(?P=x)", "backreferences are not supported (at position 8)"},
        {"\\bword", "the word boundary \\b is not supported (at position 0)"},
        {"x\\Z", "the assertion \\Z is not supported"},
        {"\\p{L}+", "Unicode property classes (\\p{...}) are not supported (at position 0)"},
        {"(?i)abc", "this (? extension is not supported"},
        {"a*+", "possessive quantifiers are not supported (at position 2)"},
        {"a^b", "'^' is supported only at the start of the pattern (at position 1)"},
        {"a$b", "'$' is supported only at the end of the pattern (at position 1)"},
        {"(^a)", "'^' is supported only at the start"},
        {"a{1001}", "a repetition bound above 1000 is not supported (at position 1)"},
        {"(a{1000}){1000}", "more than 200000 automaton states once its repetitions are expanded"},
        {"(a|b)*a(a|b){16}", "the pattern needs more than 30000 automaton states"},
        {"[^\\s\\S]", "the pattern matches nothing"},
        {"\\ud800", "not a Unicode scalar value"},
        {"a\xc3", "not valid UTF-8 (at byte 1)"},
        {"\xc3\xa9(", "a missing ), unterminated subpattern (at position 1)"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        RegexConstraint *r = NULL;
        const int rc = regex_constraint_compile(&r, cases[i].pattern, strlen(cases[i].pattern), NULL, "--regex");
        EXPECT(rc != 0 && !r, "/%s/ is refused", cases[i].pattern);
        EXPECT(strstr(err_msg(), cases[i].message) && !strncmp(err_msg(), "--regex: ", 9), "/%s/: \"%s\" says \"%s\"",
               cases[i].pattern, err_msg(), cases[i].message);
        regex_constraint_free(r);
    }
    // Below the caps: the largest bound, and a pattern whose DFA is large but allowed.
    RegexConstraint *r = compile(".{0,1000}", NULL);
    EXPECT(r && regex_constraint_num_states(r) <= REGEX_MAX_DFA_STATES, ".{0,1000} compiles");
    if (r) printf(".{0,1000}: %d DFA states\n", regex_constraint_num_states(r));
    regex_constraint_free(r);
    r = compile("(a|b)*a(a|b){12}", NULL);
    EXPECT(r && regex_constraint_num_states(r) > 8000, "(a|b)*a(a|b){12}: 2^13 states");
    regex_constraint_free(r);
}

// --- choices and options ----------------------------------------------------------------

static void test_choice_and_options(void) {
    const char *choices[] = {"yes", "no", "yes, sir", "caf\xc3\xa9 (*.+?)", ""};
    size_t lengths[5];
    for (int i = 0; i < 5; i++) lengths[i] = strlen(choices[i]);
    RegexConstraint *r = NULL;
    EXPECT(regex_constraint_choice(&r, choices, lengths, 5, "choice") == 0, "choices compile: %s", err_msg());
    for (int i = 0; r && i < 5; i++) EXPECT(regex_constraint_matches(r, choices[i], lengths[i]), "choice %d matches", i);
    const char *others[] = {"ye", "yes,", "No", "caf\xc3\xa9 ", "caf\xc3\xa9 (*.+?))", "cafe (*.+?)"};
    for (int i = 0; r && i < 6; i++) EXPECT(!regex_constraint_matches(r, others[i], strlen(others[i])), "'%s' is no choice", others[i]);
    regex_constraint_free(r);
    EXPECT(regex_constraint_choice(&r, choices, lengths, 0, "choice") != 0 && strstr(err_msg(), "at least one"),
           "no choices: refused");
    const char *bad[] = {"a\xff"};
    size_t bad_length[] = {2};
    EXPECT(regex_constraint_choice(&r, bad, bad_length, 1, "choice") != 0 && strstr(err_msg(), "not valid UTF-8"),
           "a choice that is not UTF-8: refused");

    // JSON strings: no raw control characters but \b \t \n \f \r; lengths in code points.
    RegexOptions json = {.json_string = true, .max_chars = -1};
    r = compile("[\\x00-\\x1f]", &json);
    EXPECT(r && regex_constraint_matches(r, "\n", 1) && !regex_constraint_matches(r, "\x01", 1),
           "a JSON string's alphabet has \\n, not \\x01");
    regex_constraint_free(r);
    EXPECT(regex_constraint_compile(&r, "\\x01", 4, &json, "pattern") != 0 && strstr(err_msg(), "that a JSON string can hold"),
           "a pattern only control characters match is refused for JSON");
    RegexOptions bounded = {.min_chars = 2, .max_chars = 3};
    r = compile("[a\xc3\xa9]*", &bounded);
    const char *in[] = {"aa", "\xc3\xa9\xc3\xa9\xc3\xa9", "a\xc3\xa9"}, *out[] = {"a", "aaaa", "\xc3\xa9", ""};
    for (int i = 0; r && i < 3; i++) EXPECT(regex_constraint_matches(r, in[i], strlen(in[i])), "'%s' has 2 or 3 characters", in[i]);
    for (int i = 0; r && i < 4; i++) EXPECT(!regex_constraint_matches(r, out[i], strlen(out[i])), "'%s' has not", out[i]);
    EXPECT(r && !prefixes_alive(r, "aaaa", 4) && prefixes_alive(r, "aa\xc3", 3), "a fourth character is dead at once");
    regex_constraint_free(r);
    RegexOptions impossible = {.min_chars = 3, .max_chars = -1};
    EXPECT(regex_constraint_compile(&r, "ab?", 3, &impossible, "pattern") != 0 && strstr(err_msg(), "matches nothing"),
           "a pattern no text of the length matches is refused");
}

// Random patterns from the dialect's characters (most of them malformed): each compiles or
// is refused naming the field, never crashes (the sanitizer build checks the memory), and
// a text a compiled one accepts has every prefix alive.
static void test_random_patterns(void) {
    static const char *const pieces[] = {"a", "b", "\xc3\xa9", "(", ")", "(?:", "[", "]", "[^", "{", "}", "{2}", "{1,3}", "{,2}",
                                         "|", "*", "+", "?", "^", "$", ".", "\\", "\\d", "\\w", "\\s", "\\S", "-", ",",
                                         "1", "\\x4", "\\n", "(?P<n>", "(?=", "\\1", "*?", "\xf0\x9f\x98\x80"};
    const int num_pieces = (int)(sizeof pieces / sizeof pieces[0]);
    uint64_t rng = 20261201;
    int compiled = 0, refused = 0, checked = 0;
    for (int k = 0; k < 3000; k++) {
        char pattern[256] = "";
        append_random_pieces(pattern, pieces, num_pieces, &rng);
        RegexConstraint *r = NULL;
        if (regex_constraint_compile(&r, pattern, strlen(pattern), NULL, "regex") != 0) {
            refused++;
            EXPECT(!r && strstr(err_msg(), "regex: ") == err_msg(), "/%s/: a refusal names the field: %s", pattern, err_msg());
            continue;
        }
        compiled++;
        for (int t = 0; t < 20; t++) {
            char text[16];
            const int length = random_bytes(text, "ab\xc3\xa9-1 \n", 8, &rng);
            const bool match = regex_constraint_matches(r, text, (size_t)length);
            if (match) EXPECT(prefixes_alive(r, text, (size_t)length), "/%s/: a match with a dead prefix", pattern);
            checked += match;
        }
        regex_constraint_free(r);
    }
    printf("random patterns: %d compiled, %d refused, %d matches checked\n", compiled, refused, checked);
    EXPECT(compiled > 300 && refused > 300, "both kinds occur (%d compiled, %d refused)", compiled, refused);
}

// --- the token mask over the real vocabulary ----------------------------------------------

static void test_mask_equals_brute_force(void) {
    Tokenizer *tok = mask_check_tokenizer();
    if (!tok) return;
    TokenTrie *trie = token_trie_new(tok, tokenizer_vocab_size(tok));
    double ms = 0;
    int steps = 0;
    RegexConstraint *r = compile("(Name|Nom): [A-Z][a-z\xc3\xa9 ]{1,12}; age \\d{1,3}(\\.\\d)?( \xf0\x9f\x98\x80)?\n?", NULL);
    Constraint *c = constraint_from_regex(r);
    if (c) check_mask(trie, tok, c, "Nom: Jos\xc3\xa9 ana; age 42.5 \xf0\x9f\x98\x80", "regex", &ms, &steps);
    constraint_free(c);
    const char *choices[] = {"positive", "negative", "neutral", "n/a"};
    size_t lengths[] = {8, 8, 7, 3};
    r = NULL;
    EXPECT(regex_constraint_choice(&r, choices, lengths, 4, "choice") == 0, "choices compile");
    c = constraint_from_regex(r);
    if (c) check_mask(trie, tok, c, "neutral", "choice", &ms, &steps);
    constraint_free(c);
    printf("token mask under a regex / choice over %d tokens: %.3f ms per step (under load), %d states\n",
           tokenizer_vocab_size(tok), ms / steps, steps);
    token_trie_free(trie);
    tokenizer_free(tok);
}

int main(void) {
    RUN(test_against_python);
    RUN(test_prefix_viability);
    RUN(test_refusals);
    RUN(test_choice_and_options);
    RUN(test_random_patterns);
    RUN(test_mask_equals_brute_force);
    TEST_EXIT();
}
