// A context-free grammar constraint for structured outputs, in llama.cpp's GBNF (its
// `--grammar` / `--grammar-file`, vLLM's `grammar`): a byte-level recogniser that the token
// mask (gen/token_mask.h) advances like the JSON and regular-expression ones.
//
// The notation. A grammar is rules `name ::= alternatives`; `root` is the start. Names are
// letters, digits, '-' and '_'. Alternatives are separated by `|`, each a sequence of
// items: string literals "..." (escapes \n \t \r \\ \" \[ \] \xHH \uHHHH \UHHHHHHHH; any
// other UTF-8 character as itself), character classes [...] (characters, ranges a-z, the
// same escapes, `^` first for the complement; `-` last is itself), `.` (any character),
// rule references, groups ( ... ), each item followed by any of the repetitions * + ? {m}
// {m,} {m,n} (a literal repeats as a whole: "ab"* is ("ab")*). `#` starts a comment that
// runs to the end of the line. Whitespace, newlines included, separates items anywhere; a
// rule runs on until the next `name ::=` (a superset of llama.cpp's layout, where a newline
// outside parentheses ends a rule unless a `|` ends the line). Refused, with the line and
// column: malformed syntax, an undefined or twice-defined rule, no `root`, llama.cpp's token
// references <...>, a class that matches no character, left recursion (a rule that can
// begin with itself: write the repetition with * or right recursion), a rule that matches
// no finite text, {m,n} bounds above GRAMMAR_MAX_REPEAT, a grammar past the caps below.
//
// Matching is over UTF-8 bytes (well-formed, no surrogates): the state is a set of parse
// stacks (llama.cpp's method): each stack holds, for every rule being matched, the element
// that comes next, the innermost on top, always a character class (or nothing: the text
// may end). A character pops the tops it matches and expands what follows until
// characters are on top again (each position's expansion is computed once, when
// compiling); a rule reference at the end of an alternative replaces its frame (so right
// recursion and repetitions do not deepen a stack). A character's bytes
// are fed one at a time: between them a stack stays only while its top class holds some
// character that starts with those bytes, so, every rule being able to finish, a state is
// alive exactly when the text so far is a prefix of an accepted one. Equal stacks are kept
// once. Bounds: at most GRAMMAR_MAX_STACKS stacks and GRAMMAR_MAX_ITEMS entries in all. A
// grammar with a point that can continue in more ways than a state holds stacks is refused
// when compiling (naming the rule), and so is one whose start needs more entries; a stack
// past a bound later (nesting deeper than the room left, or several ambiguous parses
// together) is dropped and `overflow` set: that can forbid a text the grammar allows, never
// allow one it forbids.
//
// The state (GrammarState) is a fixed-size value; grammar_state_copy copies only its used
// part (the mask copies one per trie level). One per generated sequence.
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define GRAMMAR_MAX_REPEAT 1000      // the largest bound of {m,n}
#define GRAMMAR_MAX_ELEMENTS 200000  // rule elements once repetitions are expanded
#define GRAMMAR_MAX_NESTING 100      // groups inside groups
#define GRAMMAR_MAX_STACKS 128       // parse stacks alive at once
#define GRAMMAR_MAX_ITEMS 4000       // their entries in all (each stack: its length, then its elements)

typedef struct GrammarConstraint GrammarConstraint;

typedef struct {
    int32_t num_stacks; // 0: dead (no accepted text has this prefix)
    int32_t used;       // entries of pool in use
    uint32_t utf8_value; // the bits of a character whose bytes are partly fed
    uint8_t utf8_need;   // its bytes still to come (0: none)
    uint8_t utf8_next_lo, utf8_next_hi; // the range of its next byte
    uint8_t overflow;    // a stack was dropped past a bound
    // The stacks one after another: the length, then the element indices bottom to top.
    int32_t pool[GRAMMAR_MAX_ITEMS];
} GrammarState;

// Compiles the GBNF text (`length` bytes of UTF-8). Returns 0, or -1 with err_set():
// "<what>: <problem> (at line L, column C)" (the column in characters).
int grammar_constraint_compile(GrammarConstraint **out, const char *text, size_t length, const char *what);
void grammar_constraint_free(GrammarConstraint *grammar);

// The state before any byte.
void grammar_state_init(const GrammarConstraint *grammar, GrammarState *state);
void grammar_state_copy(GrammarState *dst, const GrammarState *src);
// Feeds one byte: *out (may be *state) becomes the state after it; false when no accepted
// text has this prefix (then out->num_stacks is 0).
bool grammar_state_feed(const GrammarConstraint *grammar, const GrammarState *state, uint8_t byte, GrammarState *out);
// Feeds `length` bytes in place; false as soon as the text cannot be accepted.
bool grammar_state_feed_bytes(const GrammarConstraint *grammar, GrammarState *state, const char *bytes, size_t length);
// The text fed so far is a complete accepted text.
bool grammar_state_accepts(const GrammarConstraint *grammar, const GrammarState *state);

// The whole text: accepted or not (for tests and checks).
bool grammar_constraint_matches(const GrammarConstraint *grammar, const char *text, size_t length);
// The number of rules, user-written and made for groups and repetitions (for tests).
int grammar_constraint_num_rules(const GrammarConstraint *grammar);
