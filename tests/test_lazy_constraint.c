// Tests of gen/lazy_constraint.c (free text until a trigger, then an inner constraint):
//  - whole texts accepted or refused under inner regular expressions whose texts are
//    known: a trigger split across tokens, a trigger inside a token followed by bytes the
//    inner constraint must check, false starts ("<tc" then other text), overlapping
//    partial matches ("<<tc>"), several triggers (the longest that ends first is the one
//    fed), a trigger that must start the text;
//  - random texts made of pieces against a reference written here with plain loops (find
//    the first place a trigger ends, hand the inner constraint the text from the trigger's
//    start), whole and every prefix, fed in one call and split into random "tokens";
//  - state copies are independent; keys: equal for states reached by different texts
//    that must behave alike, different where they differ;
//  - refusals: no trigger, an empty one, one the inner constraint cannot start with;
//  - the token mask over SmolLM2's vocabulary equals the brute force (each token's bytes
//    fed to a copy of the state) at every state of a text with free words, a Hermes
//    tool-call block (the JSON tool-call recogniser inside) and the mask cache.
#include <math.h>
#include <string.h>

#include "core/check.h"
#include "core/timer.h"
#include "gen/constraint.h"
#include "gen/lazy_constraint.h"
#include "gen/regex_constraint.h"
#include "gen/token_mask.h"
#include "tokenizer/tokenizer.h"
#include "test.h"
#include "constraint_check.h"

static Constraint *regex_of(const char *pattern) {
    RegexConstraint *regex = NULL;
    CHECK(regex_constraint_compile(&regex, pattern, strlen(pattern), NULL, "test") == 0, "%s", err_msg());
    return constraint_from_regex(regex);
}

// The lazy constraint of the inner regular expression and the triggers ('^' first: only at
// the start of the text).
static Constraint *lazy_of(const char *pattern, const char *const *triggers, int n) {
    LazyTrigger t[LAZY_MAX_TRIGGERS];
    for (int i = 0; i < n; i++) {
        const bool anchored = triggers[i][0] == '^';
        t[i] = (LazyTrigger){triggers[i] + anchored, strlen(triggers[i] + anchored), anchored};
    }
    LazyConstraint *lazy = NULL;
    CHECK(lazy_constraint_new(&lazy, regex_of(pattern), t, n, "test") == 0, "%s", err_msg());
    return constraint_from_lazy(lazy);
}

static bool feeds(const Constraint *c, const char *text) {
    ConstraintState state;
    constraint_state_init(c, &state);
    return constraint_state_feed_bytes(c, &state, text, strlen(text));
}

static bool matches(const Constraint *c, const char *text) { return constraint_matches(c, text, strlen(text)); }

static void test_known_texts(void) {
    const char *tc[] = {"<tc>"};
    Constraint *c = lazy_of("<tc>[ab]+</tc>", tc, 1);
    const struct {
        const char *text;
        bool alive, accepted;
    } cases[] = {
        {"", true, true},
        {"hello", true, true},
        {"hello <tc", true, true},            // a partial trigger is still free text
        {"hello <tc>", true, false},          // triggered: the call must be finished
        {"hello <tc>ab</tc>", true, true},
        {"hello <tc>ac", false, false},       // the inner constraint refuses 'c'
        {"hello <tc>ab</tc> more", false, false}, // nothing after the call's end
        {"<tc x <t c> <tc>a</tc>", true, true},   // false starts, then the call
        {"<tc x", true, true},
        {"<<tc>a</tc>", true, true},          // '<' breaks "<" and starts "<tc>" again
        {"<t<tc>b</tc>", true, true},
        {"<<tc>c", false, false},             // ... so the call's bytes are checked
        {"<t<tc>x", false, false},
        {"<tc<tc>b</tc>", true, true},
        {"<tc><tc>a</tc>", false, false},     // the first trigger starts the call
        {"</tc>", true, true},                // the closing tag alone is free text
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        EXPECT(feeds(c, cases[i].text) == cases[i].alive, "'%s': alive %d", cases[i].text, cases[i].alive);
        EXPECT(matches(c, cases[i].text) == cases[i].accepted, "'%s': accepted %d", cases[i].text, cases[i].accepted);
    }
    // Byte by byte inside a token: one token's bytes complete the trigger and continue.
    ConstraintState state, after;
    constraint_state_init(c, &state);
    EXPECT(constraint_state_feed_bytes(c, &state, "Sure <t", 7), "the first token");
    constraint_state_copy(c, &after, &state);
    EXPECT(!constraint_state_feed_bytes(c, &after, "c>c", 3), "a token with the trigger's rest and a bad byte");
    constraint_state_copy(c, &after, &state);
    EXPECT(constraint_state_feed_bytes(c, &after, "c>ab", 4), "a token with the trigger's rest and call bytes");
    EXPECT(lazy_state_triggered(&after) && !constraint_state_accepts(c, &after), "triggered, not complete");
    EXPECT(constraint_state_feed_bytes(c, &after, "</tc>", 5) && constraint_state_accepts(c, &after), "closed");
    constraint_state_copy(c, &after, &state);
    EXPECT(!constraint_state_feed_bytes(c, &after, "c>", 2) || !constraint_state_accepts(c, &after),
           "the trigger alone is not a complete text");
    // The whole trigger and its call in one token.
    constraint_state_init(c, &state);
    EXPECT(constraint_state_feed_bytes(c, &state, "<tc>b</tc>", 10) && constraint_state_accepts(c, &state), "one token");
    constraint_state_init(c, &state);
    EXPECT(!constraint_state_feed_bytes(c, &state, "x<tc>x", 6), "one token: trigger then a refused byte");
    constraint_free(c);

    // Several triggers: the longest one that ends at the first place any does is fed.
    const char *several[] = {"xcall", "call", "^{"};
    c = lazy_of("xcall[0-9]|call[a-z]|\\{[0-9]\\}", several, 3);
    EXPECT(matches(c, "xcall1"), "'xcall' is fed whole (xcall1)");
    EXPECT(!matches(c, "xcallz"), "'xcall' is fed whole (not call + z)");
    EXPECT(matches(c, "ycallz"), "'call' alone");
    EXPECT(!matches(c, "ycall1"), "'call' then a digit");
    EXPECT(matches(c, "{5}"), "a trigger at the start");
    EXPECT(!matches(c, "{x"), "a trigger at the start, then a refused byte");
    EXPECT(matches(c, " {x"), "'{' counts only at the start");
    EXPECT(matches(c, "a{x}"), "'{' counts only at the start");
    EXPECT(matches(c, "xcalxcall3"), "a false start of the longer trigger");
    constraint_free(c);

    // A trigger inside a longer one's partial match fires first (the first to end wins).
    const char *inside[] = {"xcallz", "call"};
    c = lazy_of("xcallz!|call[0-9]", inside, 2);
    EXPECT(matches(c, "xcall5"), "'call' ends inside 'xcallz'");
    EXPECT(!matches(c, "xcallz!"), "'call' fired before 'xcallz' could");
    constraint_free(c);
    // A start trigger and a floating one end at the same byte: the longer is fed.
    const char *both[] = {"^<|py", "py"};
    c = lazy_of("<\\|py[0-9]|py[a-z]", both, 2);
    EXPECT(matches(c, "<|py1"), "the start trigger is the longer");
    EXPECT(!matches(c, "<|pyz"), "not the floating one");
    EXPECT(matches(c, "xpyz"), "the floating one elsewhere");
    constraint_free(c);

    // Two triggers that must start the text, one a prefix of the other: the shorter fires.
    const char *starts[] = {"^<|py|>", "^<|p"};
    c = lazy_of("<\\|p[a-z|>]*;", starts, 2);
    EXPECT(matches(c, "<|pa;"), "the shorter start trigger");
    EXPECT(!matches(c, "<|pa"), "triggered, incomplete");
    EXPECT(matches(c, "<|x"), "not a start trigger");
    EXPECT(matches(c, "x<|p"), "not at the start");
    constraint_free(c);
}

// The reference: the first place where a trigger ends (a '^' one only as the text's
// start), the longest trigger ending there, and the inner constraint's verdict on the text
// from that trigger's start. `prefix`: alive rather than accepted.
static bool reference(const Constraint *inner, const char *const *triggers, int n, const char *text, size_t length,
                      bool prefix) {
    for (size_t end = 1; end <= length; end++) {
        size_t best = 0;
        for (int i = 0; i < n; i++) {
            const bool anchored = triggers[i][0] == '^';
            const char *t = triggers[i] + anchored;
            const size_t tl = strlen(t);
            if (tl > end || (anchored && tl != end) || memcmp(text + end - tl, t, tl) != 0) continue;
            if (tl > best) best = tl;
        }
        if (best == 0) continue;
        ConstraintState state;
        constraint_state_init(inner, &state);
        const bool alive = constraint_state_feed_bytes(inner, &state, text + end - best, length - (end - best));
        return prefix ? alive : alive && constraint_state_accepts(inner, &state);
    }
    return true;
}

static void random_texts(const char *pattern, const char *const *triggers, int n, const char *const *pieces,
                         int num_pieces, uint64_t seed) {
    Constraint *c = lazy_of(pattern, triggers, n), *inner = regex_of(pattern);
    uint64_t rng = seed;
    int wrong = 0, accepted = 0, triggered = 0, split_wrong = 0;
    char text[256];
    for (int trial = 0; trial < 4000; trial++) {
        size_t length = 0;
        const int count = (int)(random_next(&rng) >> 33) % 9;
        for (int k = 0; k < count; k++) {
            const char *piece = pieces[(random_next(&rng) >> 33) % (uint64_t)num_pieces];
            memcpy(text + length, piece, strlen(piece));
            length += strlen(piece);
        }
        text[length] = '\0';
        const bool expected = reference(inner, triggers, n, text, length, false);
        if (constraint_matches(c, text, length) != expected) {
            if (wrong++ < 5) fprintf(stderr, "  '%s': expected %d\n", text, expected);
        }
        accepted += expected;
        // Every prefix, byte by byte, and the whole text in random "tokens" from the start.
        ConstraintState state, split;
        constraint_state_init(c, &state);
        bool alive = true;
        for (size_t i = 0; i <= length; i++) {
            if (alive != reference(inner, triggers, n, text, i, true)) {
                if (wrong++ < 5) fprintf(stderr, "  '%.*s': alive %d\n", (int)i, text, alive);
                break;
            }
            if (!alive || i == length) break;
            alive = constraint_state_feed(c, &state, (uint8_t)text[i], &state);
        }
        triggered += alive && lazy_state_triggered(&state);
        constraint_state_init(c, &split);
        bool split_alive = true;
        for (size_t at = 0; at < length && split_alive;) {
            size_t take = 1 + (random_next(&rng) >> 33) % 6;
            if (take > length - at) take = length - at;
            split_alive = constraint_state_feed_bytes(c, &split, text + at, take);
            at += take;
        }
        const bool split_accepted = split_alive && constraint_state_accepts(c, &split);
        if (split_accepted != expected) split_wrong++;
    }
    EXPECT(wrong == 0, "%s: %d texts or prefixes decided unlike the reference", pattern, wrong);
    EXPECT(split_wrong == 0, "%s: %d texts decided differently when fed in pieces", pattern, split_wrong);
    EXPECT(accepted > 400 && accepted < 3800, "%s: both verdicts met (%d of 4000 accepted)", pattern, accepted);
    EXPECT(triggered > 100, "%s: the trigger fired in %d texts", pattern, triggered);
    constraint_free(c), constraint_free(inner);
}

static void test_random_texts(void) {
    const char *tc[] = {"<tc>"};
    const char *tc_pieces[] = {"<", "t", "c", ">", "a", "b", "</tc>", "<tc>", "x", "<t", "c>", "<tc"};
    random_texts("<tc>[ab]+</tc>(\n<tc>[ab]+</tc>)*", tc, 1, tc_pieces, 12, 1);
    const char *several[] = {"xcall", "call", "^{", "aa"};
    const char *several_pieces[] = {"x", "call", "ca", "ll", "{", "}", "1", "z", "y", "a", "c"};
    random_texts("xcall[0-9]|call[a-z]|\\{[0-9]\\}|aa+b", several, 4, several_pieces, 11, 2);
}

static void key_of(const Constraint *c, const char *text, uint8_t *key, size_t *length) {
    ConstraintState state;
    constraint_state_init(c, &state);
    CHECK(constraint_state_feed_bytes(c, &state, text, strlen(text)), "'%s' is alive", text);
    *length = constraint_state_key(c, &state, key);
}

static bool same_key(const Constraint *c, const char *a, const char *b) {
    static uint8_t ka[sizeof(ConstraintState)], kb[sizeof(ConstraintState)];
    size_t la, lb;
    key_of(c, a, ka, &la), key_of(c, b, kb, &lb);
    return la == lb && memcmp(ka, kb, la) == 0;
}

static void test_copies_and_keys(void) {
    const char *triggers[] = {"^{", "<tc>"};
    Constraint *c = lazy_of("<tc>[ab]+</tc>|\\{a*\\}", triggers, 2);
    EXPECT(same_key(c, "hello", "x y z"), "free text without partial matches: one key");
    EXPECT(same_key(c, "hi <t", "<t"), "the same partial trigger: one key");
    EXPECT(!same_key(c, "hi <t", "hi <"), "different partial triggers: different keys");
    EXPECT(!same_key(c, "", "x"), "the start trigger still possible or not: different keys");
    EXPECT(same_key(c, "x", "yy"), "the start trigger ruled out either way: one key");
    EXPECT(same_key(c, "a <tc>ab", "<tc>ba"), "triggered, the inner states equal: one key");
    EXPECT(!same_key(c, "a <tc>ab", "a <tc>ab</"), "triggered, the inner states differ: different keys");
    EXPECT(!same_key(c, "<tc>", "{"), "different inner states: different keys");

    // Copies: free and triggered states continue independently.
    ConstraintState state, copy;
    constraint_state_init(c, &state);
    EXPECT(constraint_state_feed_bytes(c, &state, "so <t", 5), "free");
    constraint_state_copy(c, &copy, &state);
    EXPECT(constraint_state_feed_bytes(c, &copy, "c>a", 3) && lazy_state_triggered(&copy), "the copy triggers");
    EXPECT(!lazy_state_triggered(&state) && constraint_state_accepts(c, &state), "the original is still free");
    EXPECT(constraint_state_feed_bytes(c, &state, "x", 1) && constraint_state_accepts(c, &state), "and stays free");
    ConstraintState copy2;
    constraint_state_copy(c, &copy2, &copy);
    EXPECT(constraint_state_feed_bytes(c, &copy2, "</tc>", 5) && constraint_state_accepts(c, &copy2), "a triggered copy closes");
    EXPECT(!constraint_state_accepts(c, &copy), "its source is still open");
    EXPECT(constraint_state_feed_bytes(c, &copy, "b</tc>", 6) && constraint_state_accepts(c, &copy), "and closes itself");
    constraint_free(c);
}

static void test_refusals(void) {
    LazyConstraint *lazy = NULL;
    LazyTrigger empty = {"", 0, false}, other = {"<x>", 3, false}, good = {"<tc>", 4, false};
    EXPECT(lazy_constraint_new(&lazy, regex_of("<tc>a"), &good, 0, "grammar_triggers") != 0 &&
               strstr(err_msg(), "grammar_triggers: 0 triggers"), "no trigger: %s", err_msg());
    EXPECT(lazy_constraint_new(&lazy, regex_of("<tc>a"), &empty, 1, "grammar_triggers") != 0 &&
               strstr(err_msg(), "trigger 0 is empty"), "an empty trigger: %s", err_msg());
    LazyTrigger two[2] = {good, other};
    EXPECT(lazy_constraint_new(&lazy, regex_of("<tc>a"), two, 2, "grammar_triggers") != 0 &&
               strstr(err_msg(), "the trigger '<x>' does not start"), "a trigger the inner refuses: %s", err_msg());
    EXPECT(lazy == NULL, "nothing made");
}

// The mask over the real vocabulary at every state of an answer with words, a false start
// and a Hermes call whose JSON the tool-call recogniser checks.
static void test_mask(void) {
    Tokenizer *tok = mask_check_tokenizer();
    if (!tok) return;
    TokenTrie *trie = token_trie_new(tok, tokenizer_vocab_size(tok));
    json_t *tools = json_loads("[{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"parameters\": "
                               "{\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}}, "
                               "\"required\": [\"city\"]}}}]",
                               0, NULL);
    JsonConstraint *calls = NULL;
    CHECK(json_constraint_tool_calls(&calls, tools, NULL, "<tool_call>\n", "\n</tool_call>", "\n", "arguments", 1) == 0,
          "%s", err_msg());
    json_decref(tools);
    LazyTrigger trigger = {"<tool_call>", strlen("<tool_call>"), false};
    LazyConstraint *lazy = NULL;
    CHECK(lazy_constraint_new(&lazy, constraint_from_json(calls), &trigger, 1, "test") == 0, "%s", err_msg());
    Constraint *c = constraint_from_lazy(lazy);
    double ms = 0;
    int steps = 0;
    check_mask(trie, tok, c, "Let me <tool call> that: <tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
                             "{\"city\": \"Paris\"}}\n</tool_call>",
               "lazy tool call", &ms, &steps);
    printf("token mask over %d tokens (under load): %.2f ms per step, %d states\n", tokenizer_vocab_size(tok),
           ms / (steps ? steps : 1), steps);
    constraint_free(c);
    token_trie_free(trie);
    tokenizer_free(tok);
}

int main(void) {
    RUN(test_known_texts);
    RUN(test_random_texts);
    RUN(test_copies_and_keys);
    RUN(test_refusals);
    RUN(test_mask);
    TEST_EXIT();
}
