// Tests of gen/grammar_constraint.c (GBNF grammars for structured outputs):
//  - refusals: each malformed grammar is refused with its problem and its line and column;
//  - acceptance and rejection over many texts for grammars written here (JSON-like,
//    arithmetic, nested lists, repetitions, UTF-8 classes, comments and multi-line rules),
//    every prefix of an accepted text alive;
//  - regular grammars against gen/regex_constraint.c's DFA on the equivalent regular
//    expression: random byte strings (UTF-8, invalid bytes included) matched alike, and
//    every prefix alive or dead alike (the DFA has its dead states cut, so this checks that
//    a grammar state is alive exactly when the text can still be completed);
//  - prefix viability of context-free (non-regular) grammars against a brute force over a
//    small byte alphabet; random grammars from pieces (refused with a message, or every
//    accepted text's prefixes alive);
//  - the bounds: a start past GRAMMAR_MAX_STACKS refused, deep nesting dropped with
//    `overflow` set, nothing wrongly accepted;
//  - the token mask under a grammar equals the brute force (each of SmolLM2's 49,152
//    tokens fed to the state) at every state of a text.
#include <math.h>
#include <string.h>

#include "core/check.h"
#include "core/timer.h"
#include "gen/constraint.h"
#include "gen/grammar_constraint.h"
#include "gen/regex_constraint.h"
#include "gen/token_mask.h"
#include "io/fs.h"
#include "tokenizer/tokenizer.h"
#include "test.h"
#include "constraint_check.h"


static GrammarConstraint *compile(const char *text) {
    GrammarConstraint *g = NULL;
    if (grammar_constraint_compile(&g, text, strlen(text), "grammar") != 0)
        fprintf(stderr, "  grammar refused: %s\n", err_msg());
    return g;
}

static bool prefixes_alive(const GrammarConstraint *g, const char *text, size_t length) {
    GrammarState *s = xmalloc(sizeof *s);
    grammar_state_init(g, s);
    bool alive = true;
    for (size_t i = 0; i < length && alive; i++) alive = grammar_state_feed(g, s, (uint8_t)text[i], s);
    free(s);
    return alive;
}

// --- refusals ------------------------------------------------------------------------------

static void test_refusals(void) {
    char deep[400] = "root ::= ";
    for (int i = 0; i < 101; i++) strcat(deep, "(");
    strcat(deep, "\"a\"");
    for (int i = 0; i < 101; i++) strcat(deep, ")");
    char ambiguous[2000] = "root ::= r0\n";
    for (int i = 0; i < 40; i++) sprintf(ambiguous + strlen(ambiguous), "r%d ::= r%d | r%d\n", i, i + 1, i + 1);
    strcat(ambiguous, "r40 ::= \"a\"\n");
    const struct {
        const char *grammar, *problem;
        int line, column;
    } cases[] = {
        {"", "the grammar is empty", 1, 1},
        {"# only a comment\n", "the grammar is empty", 2, 1},
        {"root ::= \"abc", "unterminated string literal", 1, 10},
        {"root ::= [a-", "unterminated character class", 1, 10},
        {"root ::= x", "the rule 'x' is used but never defined", 1, 10},
        {"a ::= \"x\"", "no rule is named 'root'", 1, 1},
        {"root ::= root \"x\" | \"y\"", "the rule 'root' is left-recursive", 1, 1},
        {"root ::= a\na ::= b? a \"x\" | \"y\"\nb ::= \"z\"", "the rule 'a' is left-recursive", 2, 1},
        {"root ::= a\na ::= (\"\" | b) \"x\"\nb ::= a", "left-recursive", 2, 1},
        {"root ::= \"x\" root", "the rule 'root' matches no finite text", 1, 1},
        {"root ::= \"a\" | \"a\" b\nb ::= (\"x\" b)+", "the rule 'b' matches no finite text", 2, 1},
        {"root ::= \"a\"{2,1}", "the repetition {2,1} has its bounds reversed", 1, 13},
        {"root ::= \"a\"{1001}", "a repetition bound above 1000", 1, 14},
        {"root ::= \"a\"{x}", "expected a number in the repetition", 1, 14},
        {"root ::= \"a\"{1;", "expected ',' or '}'", 1, 15},
        {"root ::= \"a\"{1,2", "expected '}' to close the repetition", 1, 17},
        {"root ::= \"\\q\"", "unknown escape \\q", 1, 11},
        {"root ::= \"\\x4\"", "the escape \\x needs 2 hex digits", 1, 11},
        {"root ::= \"\\uD800\"", "is not a character", 1, 11},
        {"root ::= \"\\U00110000\"", "is not a character", 1, 11},
        {"root ::= [z-a]", "comes before its start", 1, 11},
        {"root ::= []", "the character class matches no character", 1, 10},
        {"root ::= [^\\x00-\\U0010FFFF]", "the character class matches no character", 1, 10},
        {"root ::= (\"a\"", "the group '(' is never closed", 1, 10},
        {"root ::= \"a\")", "a ')' that closes no group", 1, 13},
        {"root ::= * \"a\"", "'*' has nothing to repeat", 1, 10},
        {"root ::= \"\"*", "nothing to repeat", 1, 12},
        {"root ::= <think> \"a\"", "token references <...> are not supported", 1, 10},
        {"root ::= \"a\"\nroot ::= \"b\"", "the rule 'root' is defined twice", 2, 1},
        {"root = \"a\"", "expected '::=' after the rule name 'root'", 1, 6},
        {"::= \"a\"", "expected a rule name, not ':'", 1, 1},
        {"root ::= \"\xff\"", "malformed UTF-8", 1, 11},
        {"root ::= \"\xc3\"", "malformed UTF-8", 1, 11},
        {"root ::= ( \"a\"\n b ::= \"c\" )", "a rule definition inside parentheses", 2, 2},
        {"root ::= \"a\" ; \"b\"", "unexpected ';'", 1, 14},
        {"root ::= a\n\na ::= \"x\" | [b-", "unterminated character class", 3, 13},
        {"root ::= a\n\na ::= \"x\" | [b-\n]", "the range's end U+000A comes before its start U+0062", 3, 14},
        {"root ::= \"\xc3\xa9\" \"\\q\"", "unknown escape \\q", 1, 15}, // columns count characters
        {deep, "groups nested more than 100 deep", 1, 110},
        {"root ::= \"ab\"{1000}{1000}", "more than 200000 elements", 1, 26},
        // x? is nullable: x?{0,200} can begin 200 ways at once.
        {"root ::= (\"a\"?){0,200} \"y\"", "the rule 'root' can continue in more than 128 ways at once", 1, 1},
        {"root ::= x \"y\"\nx ::= (\"a\"?){0,200}", "the rule 'x' can continue in more than 128 ways at once", 2, 1},
        // r1 ::= r2 | r2, r2 ::= r3 | r3, ...: 2^40 ways to the same place.
        {ambiguous, "expanding the rules takes more than 20000000 steps", 0, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        GrammarConstraint *g = NULL;
        const int rc = grammar_constraint_compile(&g, cases[i].grammar, strlen(cases[i].grammar), "--grammar");
        EXPECT(rc == -1 && g == NULL, "case %zu (%s) is refused", i, cases[i].problem);
        if (rc == 0) {
            grammar_constraint_free(g);
            continue;
        }
        const char *message = err_msg();
        char where[64] = "";
        if (cases[i].line) snprintf(where, sizeof where, "(at line %d, column %d)", cases[i].line, cases[i].column);
        EXPECT(strncmp(message, "--grammar: ", 11) == 0 && strstr(message, cases[i].problem) && strstr(message, where) &&
                   !strchr(message, '\n'),
               "case %zu: one line naming the field, \"%s\" and \"%s\"; got \"%s\"", i, cases[i].problem, where, message);
    }
}

// --- acceptance --------------------------------------------------------------------------

// tests/fixtures/constraints/: json.gbnf (a JSON object; also the fuzz seed) and
// arithmetic.gbnf (expressions with nested parentheses), read by main().
static char *json_grammar, *arithmetic_grammar;

typedef struct {
    const char *name, *grammar;
    const char *accepted[12], *rejected[14];
} Case;

static const Case cases[] = {
    {"json", NULL,
     {"{}", "{\"a\": 1}", "{\"a\":[1, 2.5e-3, -0, true, false, null]}", "{ \"k\": {\"n\": {}}, \"s\": \"\\u00e9\\n\" }",
      "{\"caf\xc3\xa9\": \"\xf0\x9f\x98\x80\"}", "{\"a\": [ [ [] ] ] }"},
     {"", "[]", "{", "{\"a\"}", "{\"a\": 01}", "{\"a\": 1,}", "{\"a\": tru}", "{\"a\": \"\\x\"}", "{\"a\": \"\n\"}",
      "{} ", "{\"a\": 1.}", "{\"a\": \"\xc3\"}", "{'a': 1}"}},
    {"arithmetic", NULL,
     {"1", "1+2*3", "(1)", "((2))", "-(-3)", "2.5*4", "3*(41-2.5)/-7+(1)", "0/0"},
     {"", "1+", "(1", "1)", "1..2", "+1", "1 + 2", "()", "1(2)", "--", ".5"}},
    {"nested lists", "root ::= \"[\" (item (\",\" \" \"? item)*)? \"]\"\nitem ::= [a-z]+ | root",
     {"[]", "[a]", "[a, b,c]", "[[a],[]]", "[[[[]]], x]"},
     {"[,]", "[a,]", "[a b]", "[[a]", "[A]", "", "[a]]", "[a,  b]"}},
    {"repetitions", "root ::= \"x\"{3} \"y\"{1,2} \"z\"{2,} (\"ab\"){0,2} [0-9]{0,}",
     {"xxxyzz", "xxxyyzzzab", "xxxyzzabab", "xxxyzzz123", "xxxyzzab7"},
     {"xxyzz", "xxxyyyzz", "xxxyz", "xxxyzzababab", "xxxyzza", "xxxxyzz", "xxxzz"}},
    {"UTF-8 classes", "root ::= [\xce\xb1-\xcf\x89]+ \" \" [^a-z\\u00e9] [\\U0001F600-\\U0001F64F]? .?",
     {"\xce\xb1\xce\xb2 Z", "\xcf\x89 X\xf0\x9f\x98\x80", "\xce\xb1 \xe2\x82\xac", "\xce\xb1 Z\xf0\x9f\x98\x80\n",
      "\xce\xb1 ZZ", "\xce\xb1 \xc3\xa8"},
     {"\xce\xb1\xce\xb2 a", "ab Z", "\xce\xb1 \xc3\xa9", "\xce\xb1 Z\xf0\x9f\x98\x80\xf0\x9f\x98\x80zz",
      "\xce\xb1 \xff", "\xce\xb1 \xed\xa0\x80", "\xce\xb1 \xc1\x81", "\xce\xb1 Z\xf0\x9f\x98", "\xce\xb1"}},
    {"comments and lines",
     "root ::= greeting # a comment\n"
     "  \" \" name   # continues onto this line\n"
     "\n"
     "greeting ::= \"hi\"\n"
     "  | \"hello\"\n"
     "name ::= (\n"
     "  \"bob\" |\n"
     "  \"ann\"\n"
     ")\t\"!\"?\r\n",
     {"hi bob", "hello ann", "hi ann!"},
     {"hibob", "hi  bob", "hello", "hi bob!!", "hi Bob"}},
    {"escapes", "root ::= \"\\x41\\u00e9\\U0001F600\\t\\n\\\\\\\"\\[\\]\" [\\[\\]\\\\-]",
     {"A\xc3\xa9\xf0\x9f\x98\x80\t\n\\\"[]]", "A\xc3\xa9\xf0\x9f\x98\x80\t\n\\\"[]-"},
     {"A\xc3\xa9\xf0\x9f\x98\x80\t\n\\\"[]", "A\xc3\xa9\xf0\x9f\x98\x80\t\n\\\"[]a"}},
    {"empty alternatives", "root ::= \"\" | \"a\" rest\nrest ::= | \"b\" rest | ( )",
     {"", "a", "ab", "abbb"},
     {"b", "aa", "aba"}},
};

static void test_acceptance(void) {
    int checked = 0;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *text = cases[i].grammar ? cases[i].grammar : i == 0 ? json_grammar : arithmetic_grammar;
        GrammarConstraint *g = compile(text);
        EXPECT(g != NULL, "the %s grammar compiles", cases[i].name);
        if (!g) continue;
        for (int k = 0; k < 12 && cases[i].accepted[k]; k++, checked++) {
            const char *t = cases[i].accepted[k];
            EXPECT(grammar_constraint_matches(g, t, strlen(t)), "%s: \"%s\" is accepted", cases[i].name, t);
            EXPECT(prefixes_alive(g, t, strlen(t)), "%s: every prefix of \"%s\" is alive", cases[i].name, t);
        }
        for (int k = 0; k < 14 && cases[i].rejected[k]; k++, checked++) {
            const char *t = cases[i].rejected[k];
            EXPECT(!grammar_constraint_matches(g, t, strlen(t)), "%s: \"%s\" is rejected", cases[i].name, t);
        }
        grammar_constraint_free(g);
    }
    printf("acceptance: %d texts\n", checked);
}

// --- against the regular-expression constraint -----------------------------------------------

static void test_regular_grammars_match_regex(void) {
    const struct {
        const char *grammar, *regex;
    } pairs[] = {
        {"root ::= [a-c]+ (\"-\" [0-9]{2,3})?", "[a-c]+(-[0-9]{2,3})?"},
        {"root ::= (\"ab\" | \"a\")* \"b\"", "(ab|a)*b"},
        {"root ::= [^a\\n]* \"a\"?", "[^a\\n]*a?"},
        {"root ::= \"x\" . \"y\"", "x[\\s\\S]y"},
        {"root ::= [\xc3\xa9-\xc3\xbc]{1,2} \"\xe2\x82\xac\"* [^\\u00e9]", "[\xc3\xa9-\xc3\xbc]{1,2}\xe2\x82\xac*[^\xc3\xa9]"},
        {"root ::= a b\na ::= \"x\" | \"y\" a\nb ::= [0-9]?", "y*x[0-9]?"},
        {"root ::= \"a\"{0,3} \"b\"{2,}", "a{0,3}b{2,}"},
        {"root ::= (\"a\" | \"b\" | \"\\U0001F600\")+ \"-\"? [\\U0001F600-\\U0001F64F \\n]*", "[ab\\U0001F600]+-?[\\U0001F600-\\U0001F64F \\n]*"},
        {"root ::= .*", "[\\s\\S]*"},
        {"root ::= (.\"a\")? [^\\x00-\\x7f]+", "([\\s\\S]a)?[^\\x00-\\x7f]+"},
    };
    static const char *const pieces[] = {"a", "b", "c", "x", "y", "-", "0", "5", "\n", " ", "\xc3\xa9", "\xc3\xbc",
                                         "\xe2\x82\xac", "\xf0\x9f\x98\x80", "\xf0\x9f\x99\x8f", "\xff", "\xc3", "\xed\xa0\x80",
                                         "\xe2\x82", "\xc1\x81"};
    const int num_pieces = (int)(sizeof pieces / sizeof pieces[0]);
    uint64_t rng = 20261201;
    int texts = 0, matched = 0, prefix_checks = 0;
    GrammarState *gs = xmalloc(sizeof *gs);
    for (size_t p = 0; p < sizeof pairs / sizeof pairs[0]; p++) {
        GrammarConstraint *g = compile(pairs[p].grammar);
        RegexConstraint *r = NULL;
        EXPECT(regex_constraint_compile(&r, pairs[p].regex, strlen(pairs[p].regex), NULL, "regex") == 0,
               "/%s/ compiles: %s", pairs[p].regex, err_msg());
        EXPECT(g != NULL, "%s compiles", pairs[p].grammar);
        if (!g || !r) {
            grammar_constraint_free(g), regex_constraint_free(r);
            continue;
        }
        int wrong = 0;
        for (int k = 0; k < 4000; k++) {
            char text[64] = "";
            const int n = (int)(random_next(&rng) >> 61) + (int)((rng >> 40) & 3);
            for (int i = 0; i < n; i++) {
                // Mostly the grammar's own characters, so that many texts match.
                const int pick = (int)((random_next(&rng) >> 33) % (uint64_t)num_pieces);
                strcat(text, pieces[(rng >> 20) & 1 ? pick : pick % 6]);
            }
            const size_t length = strlen(text);
            const bool expected = regex_constraint_matches(r, text, length);
            if (grammar_constraint_matches(g, text, length) != expected && wrong++ < 3)
                EXPECT(false, "%s on \"%s\": the regex says %d", pairs[p].grammar, text, expected);
            matched += expected, texts++;
            // Every prefix: alive in the grammar exactly when alive in the trimmed DFA.
            grammar_state_init(g, gs);
            int32_t rs = regex_state_start(r);
            for (size_t i = 0; i < length && rs >= 0; i++) {
                rs = regex_state_feed(r, rs, (uint8_t)text[i]);
                const bool alive = grammar_state_feed(g, gs, (uint8_t)text[i], gs);
                if (alive != (rs >= 0) && wrong++ < 3)
                    EXPECT(false, "%s: the prefix of %zu bytes of \"%s\" is %s, the DFA says %s", pairs[p].grammar, i + 1,
                           text, alive ? "alive" : "dead", rs >= 0 ? "alive" : "dead");
                if (alive && grammar_state_accepts(g, gs) != regex_state_accepts(r, rs) && wrong++ < 3)
                    EXPECT(false, "%s: the prefix of %zu bytes of \"%s\" accepted unlike the DFA", pairs[p].grammar, i + 1, text);
                prefix_checks++;
            }
        }
        EXPECT(wrong == 0, "%s: %d disagreements with /%s/", pairs[p].grammar, wrong, pairs[p].regex);
        grammar_constraint_free(g), regex_constraint_free(r);
    }
    free(gs);
    printf("against the regex DFA: %d texts (%d matching), %d prefixes\n", texts, matched, prefix_checks);
    EXPECT(matched > 2000 && matched < texts - 2000, "both kinds occur (%d of %d match)", matched, texts);
}

// --- prefix viability of context-free grammars ---------------------------------------------------

// Over the bytes ( ) a and the two of é: every text of up to MAX_TEXT bytes is fed; a prefix of
// up to CHECKED bytes must be alive exactly when some extension within MAX_TEXT bytes is
// accepted (the grammars below complete any viable prefix that short within that length).
#define MAX_TEXT 9
#define CHECKED 4
static const uint8_t alphabet[] = {'(', ')', 'a', 0xC3, 0xA9};

// Returns whether some extension of the text (its state *s, `length` bytes) up to MAX_TEXT
// bytes is accepted; compares that with the state's liveness for short prefixes.
static bool viable(const GrammarConstraint *g, const GrammarState *s, int length, int *compared, int *wrong,
                   const char *grammar) {
    bool any = grammar_state_accepts(g, s);
    if (length < MAX_TEXT) {
        GrammarState *next = xmalloc(sizeof *next);
        for (size_t k = 0; k < sizeof alphabet; k++) {
            const bool alive = grammar_state_feed(g, s, alphabet[k], next);
            if (alive) any |= viable(g, next, length + 1, compared, wrong, grammar);
        }
        free(next);
    }
    if (length <= CHECKED && length > 0) {
        (*compared)++;
        if (!any && (*wrong)++ < 3) fprintf(stderr, "  %s: a prefix of %d bytes is alive, no extension matches\n", grammar, length);
    }
    return any;
}

static void test_context_free_prefix_viability(void) {
    // (A prefix found dead wrongly is caught by the acceptance and regex tests: here a text
    // that extends a dead prefix is never fed, so only live prefixes can be checked.)
    const char *grammars[] = {
        "root ::= \"(\" root \")\" | \"a\"",
        "root ::= item*\nitem ::= \"(\" item* \")\" | \"\xc3\xa9\"",
        "root ::= \"(\" inner \")\" | \"a\"{2,3}\ninner ::= root? \"a\"?",
        "root ::= [^()]+ | \"(\" root{1,2} \")\"",
        "root ::= (\"(\" | \"a\") root? \")\" | \"\xc3\xa9\"",
    };
    int compared = 0, wrong = 0;
    for (size_t i = 0; i < sizeof grammars / sizeof grammars[0]; i++) {
        GrammarConstraint *g = compile(grammars[i]);
        EXPECT(g != NULL, "%s compiles", grammars[i]);
        if (!g) continue;
        GrammarState *s = xmalloc(sizeof *s);
        grammar_state_init(g, s);
        viable(g, s, 0, &compared, &wrong, grammars[i]);
        free(s);
        grammar_constraint_free(g);
    }
    printf("context-free prefix viability: %d prefixes against the brute force\n", compared);
    EXPECT(wrong == 0, "%d prefixes alive or dead unlike the brute force", wrong);
}

// Random grammars from pieces: each compiles or is refused with a message naming the field;
// a compiled one accepts a text only when every prefix of it is alive.
static void test_random_grammars(void) {
    static const char *const pieces[] = {"a", "root", "\"x\"", "\"\xc3\xa9\"", "[a-c]",
                                         "[^x]", ".", "(", ")", "|", "*", "+", "?", "{2}", "{1,3}", "{0,}", " ", "#c\n",
                                         "\"\"", "\"\\n\"", "[", "]", "\"", "{", "\\"};
    const int num_pieces = (int)(sizeof pieces / sizeof pieces[0]);
    uint64_t rng = 20261202;
    int compiled = 0, refused = 0, matched = 0;
    for (int k = 0; k < 4000; k++) {
        char grammar[512] = "root ::= ";
        append_random_pieces(grammar, pieces, num_pieces, &rng);
        strcat(grammar, "\na ::= \"y\" | [b-c] a?\n");
        GrammarConstraint *g = NULL;
        if (grammar_constraint_compile(&g, grammar, strlen(grammar), "grammar") != 0) {
            refused++;
            EXPECT(!g && strstr(err_msg(), "grammar: ") == err_msg() && strstr(err_msg(), "(at line"),
                   "%s: a refusal names the field and the place: %s", grammar, err_msg());
            continue;
        }
        compiled++;
        for (int t = 0; t < 30; t++) {
            char text[16];
            const int length = random_bytes(text, "xabc\xc3\xa9\n", 7, &rng);
            if (grammar_constraint_matches(g, text, (size_t)length)) {
                matched++;
                EXPECT(prefixes_alive(g, text, (size_t)length), "%s: a match with a dead prefix", grammar);
            }
        }
        grammar_constraint_free(g);
    }
    printf("random grammars: %d compiled, %d refused, %d matches\n", compiled, refused, matched);
    EXPECT(compiled > 300 && refused > 300 && matched > 300, "each kind occurs (%d compiled, %d refused, %d matches)",
           compiled, refused, matched);
}

// --- bounds ------------------------------------------------------------------------------------

static void test_bounds_and_copies(void) {
    // Nesting deeper than the pool holds: stacks are dropped (overflow set), and what is
    // accepted is still right.
    GrammarConstraint *g = compile("root ::= \"(\" root \")\" | \"x\"");
    if (!g) return;
    const int deep = 3000;
    char *text = xmalloc(2 * deep + 2);
    for (int d = 0; d < deep; d++) text[d] = '(';
    text[deep] = 'x';
    for (int d = 0; d < deep; d++) text[deep + 1 + d] = ')';
    EXPECT(grammar_constraint_matches(g, text + deep - 500, 1001), "500 levels are accepted");
    GrammarState *s = xmalloc(sizeof *s), *t = xmalloc(sizeof *t);
    grammar_state_init(g, s);
    EXPECT(!s->overflow, "no overflow at the start");
    const bool alive = grammar_state_feed_bytes(g, s, text, (size_t)deep);
    EXPECT(!alive && s->overflow, "%d levels are past the pool: dead with overflow set (alive %d, overflow %d)", deep,
           alive, s->overflow);
    EXPECT(!grammar_constraint_matches(g, text + 1, 2 * (size_t)deep), "an unbalanced text is not accepted");
    // A copy is independent of its source, and feeding in place equals feeding into another.
    grammar_state_init(g, s);
    grammar_state_feed_bytes(g, s, "((", 2);
    grammar_state_copy(t, s);
    EXPECT(grammar_state_feed(g, s, '(', s), "feed in place");
    EXPECT(grammar_state_feed_bytes(g, t, "x))", 3) && grammar_state_accepts(g, t), "the copy goes its own way");
    GrammarState *u = xmalloc(sizeof *u);
    grammar_state_feed(g, t, ')', u); // t accepts: no more ')' is possible
    EXPECT(u->num_stacks == 0, "past the end is dead");
    grammar_state_feed(g, s, 'x', u);
    grammar_state_feed(g, s, 'x', s);
    EXPECT(u->used == s->used && u->num_stacks == s->num_stacks &&
               !memcmp(u->pool, s->pool, (size_t)s->used * sizeof(int32_t)),
           "in place and into another state agree");
    EXPECT(s->used < 64, "a state uses little of its pool (%d entries)", s->used);
    free(text), free(s), free(t), free(u);
    grammar_constraint_free(g);
    // Through constraint.h: the union arm.
    Constraint *c = constraint_from_grammar(compile(arithmetic_grammar));
    EXPECT(c && constraint_matches(c, "1+(2*3)", 7) && !constraint_matches(c, "1+", 2), "constraint_matches");
    EXPECT(constraint_regex(c) == NULL, "not a regex");
    constraint_free(c);
}

// --- the token mask over the real vocabulary ----------------------------------------------

static void test_mask_equals_brute_force(void) {
    Tokenizer *tok = mask_check_tokenizer();
    if (!tok) return;
    TokenTrie *trie = token_trie_new(tok, tokenizer_vocab_size(tok));
    double ms = 0;
    int steps = 0;
    Constraint *c = constraint_from_grammar(compile(json_grammar));
    if (c) check_mask(trie, tok, c, "{\"name\": \"Jos\xc3\xa9\", \"n\": [1.5e3, true],\n \"o\": {}}", "json grammar", &ms, &steps);
    constraint_free(c);
    c = constraint_from_grammar(compile(arithmetic_grammar));
    if (c) check_mask(trie, tok, c, "3*(41-2.5)/-7", "arithmetic grammar", &ms, &steps);
    constraint_free(c);
    c = constraint_from_grammar(compile("root ::= [\xce\xb1-\xcf\x89]+ \" \" [^a-z\\u00e9] [\\U0001F600-\\U0001F64F]?"));
    if (c) check_mask(trie, tok, c, "\xce\xb1\xce\xb2 Z\xf0\x9f\x98\x80", "UTF-8 grammar", &ms, &steps);
    constraint_free(c);
    printf("token mask under a grammar over %d tokens: %.3f ms per step (under load), %d states\n",
           tokenizer_vocab_size(tok), ms / steps, steps);
    token_trie_free(trie);
    tokenizer_free(tok);
}

static char *read_fixture(const char *path) {
    char *text;
    size_t length;
    CHECK(fs_read_file(path, 1 << 20, &text, &length) == 0, "%s", err_msg());
    return text;
}

int main(void) {
    json_grammar = read_fixture("tests/fixtures/constraints/json.gbnf");
    arithmetic_grammar = read_fixture("tests/fixtures/constraints/arithmetic.gbnf");
    RUN(test_refusals);
    RUN(test_acceptance);
    RUN(test_regular_grammars_match_regex);
    RUN(test_context_free_prefix_viability);
    RUN(test_random_grammars);
    RUN(test_bounds_and_copies);
    RUN(test_mask_equals_brute_force);
    free(json_grammar), free(arithmetic_grammar);
    TEST_EXIT();
}
