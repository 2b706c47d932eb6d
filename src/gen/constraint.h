// A decoding constraint for structured outputs, behind one interface: a JSON / JSON Schema
// recogniser (gen/json_constraint.h), a regular expression (gen/regex_constraint.h:
// vLLM's `regex` and `choice`), a GBNF grammar (gen/grammar_constraint.h: llama.cpp's
// `--grammar`, vLLM's `grammar`) or a lazy one (gen/lazy_constraint.h: free text until a
// trigger string, then one of the others: tool calls under tool_choice "auto"). The token mask (gen/token_mask.h), generation and the
// server drive each through these calls: a state per generated sequence, fed byte by
// byte, alive while the text is a prefix of an accepted one, accepting where it may end.
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gen/grammar_constraint.h"
#include "gen/json_constraint.h"
#include "gen/regex_constraint.h"

typedef struct Constraint Constraint;

// One sequence's state (copy it with constraint_state_copy: only its used part is copied).
typedef struct {
    // The recogniser's (a lazy constraint's inner one's once it is triggered).
    union {
        JsonState json;
        int32_t regex; // -1: dead
        GrammarState grammar;
    };
    // A lazy constraint's own (gen/lazy_constraint.h; the others leave them alone): before
    // the trigger, the trigger automaton's state over the triggers that may match anywhere,
    // -1 once triggered; the bytes fed so far while they are a prefix of a trigger that must
    // start the text, and one such trigger (lazy_start -1: none can any more).
    int32_t lazy_match, lazy_start, lazy_start_trigger;
} ConstraintState;

// These take ownership of the compiled recogniser (NULL in, NULL out).
Constraint *constraint_from_json(JsonConstraint *json);
Constraint *constraint_from_regex(RegexConstraint *regex);
Constraint *constraint_from_grammar(GrammarConstraint *grammar);
typedef struct LazyConstraint LazyConstraint;
Constraint *constraint_from_lazy(LazyConstraint *lazy);
void constraint_free(Constraint *constraint);

void constraint_state_init(const Constraint *constraint, ConstraintState *state);
void constraint_state_copy(const Constraint *constraint, ConstraintState *dst, const ConstraintState *src);
// Feeds one byte: *out (may be *state) becomes the state after it; false when no accepted
// text has this prefix.
bool constraint_state_feed(const Constraint *constraint, const ConstraintState *state, uint8_t byte,
                           ConstraintState *out);
// Feeds `length` bytes in place; false as soon as the text cannot be accepted.
bool constraint_state_feed_bytes(const Constraint *constraint, ConstraintState *state, const char *bytes,
                                 size_t length);
// The text fed so far is complete (the end of text may come now).
bool constraint_state_accepts(const Constraint *constraint, const ConstraintState *state);
// The state's used part as bytes, field by field (no padding, nothing past the used
// part), into `key` (room for sizeof(ConstraintState) bytes); returns the length. Two
// states with equal keys are the same state, so whatever follows from one (the token mask)
// holds at the other; equal states may still have different keys (paths in another order).
size_t constraint_state_key(const Constraint *constraint, const ConstraintState *state, uint8_t *key);
// The regular expression of a regex constraint (NULL for the others): the token mask steps its
// DFA inline.
const RegexConstraint *constraint_regex(const Constraint *constraint);
// The whole text: accepted or not (for tests and checks).
bool constraint_matches(const Constraint *constraint, const char *text, size_t length);
