// A regular-expression constraint for structured outputs (vLLM's `regex` / `choice`, JSON
// Schema's `pattern`): a pattern compiled to a byte-level DFA, so that the token mask
// (gen/token_mask.h) can advance it byte by byte like the JSON recogniser.
//
// The dialect is the common subset of Python's `re` and ECMAScript that outlines, xgrammar
// and vLLM users write: literals (any character; `\` before a non-alphanumeric character
// makes it literal), the escapes \n \t \r \f \v \a \xHH \uHHHH \UHHHHHHHH, the classes
// \d \w \s and \D \W \S with ASCII meanings (Python's re.ASCII: [0-9], [A-Za-z0-9_],
// [ \t\n\r\f\v]; their negations are every other character), `.` (any character but
// \n), character classes [...] with ranges, negation [^...], the escapes above inside
// (and \b as backspace); groups ( ), (?: ), (?P<name> ) and (?<name> ); alternation |;
// the quantifiers * + ? {m} {m,} {,n} {m,n} (lazy ones, *? and the like, match the same
// texts and are accepted); `^` at the start and `$` at the end of the pattern (or of one of
// its top-level alternatives). A `{` that does not make a quantifier is a literal, as in
// Python. Refused, with the position (in characters) where they are: backreferences and
// octal escapes, lookaround, word boundaries and the other anchors (\b \B \A \Z \z \G),
// Unicode properties (\p{..}), inline flags and the other (? extensions, possessive
// quantifiers, anchors elsewhere, bounds above REGEX_MAX_REPEAT.
//
// Matching is over UTF-8 bytes: every character set (a literal, a class, `.`, a negated
// class) is compiled to the byte sequences of its characters' UTF-8 encodings, so a text
// is accepted only as whole, well-formed UTF-8 characters (no surrogates). The pattern
// becomes a Thompson NFA (bounded repetitions expanded: at most REGEX_MAX_NFA_STATES
// states), then a DFA by subset construction (at most REGEX_MAX_DFA_STATES states, their
// sets at most REGEX_MAX_SET_ITEMS NFA states in all; a pattern past a cap is refused,
// naming it). States from which no accepted text
// can be reached are removed, so a state is alive iff the text so far is a prefix of an
// accepted one, and a pattern that matches nothing is refused.
//
// Semantics: the whole text must match (Python's re.fullmatch; `^` and `$` change
// nothing), or, with RegexOptions.search (JSON Schema's `pattern`, ECMAScript's
// RegExp.test), the pattern may match anywhere in the text unless anchored by `^` / `$`.
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define REGEX_MAX_REPEAT 1000       // the largest bound of {m,n}
#define REGEX_MAX_NFA_STATES 200000 // after expanding the bounded repetitions
#define REGEX_MAX_DFA_STATES 30000
#define REGEX_MAX_SET_ITEMS 8000000 // NFA states in all the DFA states' sets together (memory)
#define REGEX_MAX_NESTING 100 // groups inside groups

typedef struct RegexConstraint RegexConstraint;

typedef struct {
    bool search;      // JSON Schema's `pattern`: a match anywhere unless anchored
    bool json_string; // the text is a JSON string's decoded content: control characters
                      // other than \b \t \n \f \r (which JSON can write only as \uXXXX) are
                      // left out of the alphabet
    int min_chars;    // bounds on the text's length in code points (JSON Schema's
    int max_chars;    // minLength / maxLength): 0 and -1 when none
} RegexOptions;

// Compiles `pattern` (UTF-8, `length` bytes); options may be NULL (fullmatch, no bounds).
// Returns 0, or -1 with err_set(): "<what>: <problem> (at position N)".
int regex_constraint_compile(RegexConstraint **out, const char *pattern, size_t length, const RegexOptions *options,
                             const char *what);
// One of `count` literal strings exactly (vLLM's `choice`). Errors name `what`.
int regex_constraint_choice(RegexConstraint **out, const char *const *choices, const size_t *lengths, int count,
                            const char *what);
void regex_constraint_free(RegexConstraint *regex);

// The state is one int: -1 is dead (no accepted text has this prefix).
int32_t regex_state_start(const RegexConstraint *regex);
int32_t regex_state_feed(const RegexConstraint *regex, int32_t state, uint8_t byte);
bool regex_state_accepts(const RegexConstraint *regex, int32_t state);

// The DFA's transitions, for a caller that steps it inline (gen/token_mask.c): the state
// after `byte` is table[state * num_classes + classes[byte]] (-1: dead).
typedef struct {
    const int32_t *table;
    const uint8_t *classes;
    int num_classes;
} RegexTable;
RegexTable regex_constraint_table(const RegexConstraint *regex);

// The whole text: accepted or not (for tests and checks).
bool regex_constraint_matches(const RegexConstraint *regex, const char *text, size_t length);
// The DFA's number of states (for tests and measurements).
int regex_constraint_num_states(const RegexConstraint *regex);
