// A lazy constraint (llama.cpp's lazy grammars): the text is free until one of its trigger
// strings has been written, and from there on it must be a text of an inner constraint
// (gen/constraint.h: JSON, JSON Schema, tool calls, a regular expression or a grammar)
// that starts with the trigger. The server uses it for tool_choice "auto": the model may
// answer in words, but once it opens a call (Hermes' "<tool_call>", Llama 3 JSON's "{" at
// the start of the answer) the call must be well formed and its arguments must match the
// tool's schema (docs/serving.md).
//
// Before the trigger every byte is allowed; the bytes go through a trigger automaton (an
// Aho-Corasick automaton: one state per prefix of a trigger, a byte that breaks a partial
// match falls back to the longest suffix that is still a prefix of some trigger), because
// a token may hold part of a trigger, its rest, or a trigger and bytes after it. A trigger
// marked `at_start` counts only as the text's first bytes. When the last byte of a trigger
// is fed, the inner constraint starts and is fed the trigger's bytes (the longest trigger
// that ends there), so it sees the whole call block; each later byte, inside the same
// token or not, goes through the inner constraint, which refuses what it cannot continue.
// The end of text is allowed anywhere before the trigger and, after it, where the inner
// constraint is complete. Nothing returns to free text after the trigger: a text the
// inner constraint accepts must run to the end of the answer.
//
// The state is ConstraintState's lazy_* fields plus, once triggered, the inner state in
// its union: copyable and keyed for the mask cache like the others.
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gen/constraint.h"

#define LAZY_MAX_TRIGGERS 16
#define LAZY_MAX_TRIGGER_BYTES 128

typedef struct {
    const char *text;
    size_t length;
    bool at_start; // only as the first bytes of the text
} LazyTrigger;

// Free text until one of the triggers, then `inner` (not itself lazy), which must accept
// each trigger as the start of a text. Takes ownership of `inner` (freed on error too).
// Returns 0, or -1 with err_set(): "<what>: <problem>" (an empty or too long trigger, too
// many, a trigger the inner constraint refuses).
int lazy_constraint_new(LazyConstraint **out, Constraint *inner, const LazyTrigger *triggers, int num_triggers,
                        const char *what);
void lazy_constraint_free(LazyConstraint *lazy);
const Constraint *lazy_constraint_inner(const LazyConstraint *lazy);

// gen/constraint.h's state calls for a lazy constraint (constraint.c dispatches here).
void lazy_state_init(const LazyConstraint *lazy, ConstraintState *state);
void lazy_state_copy(const LazyConstraint *lazy, ConstraintState *dst, const ConstraintState *src);
bool lazy_state_feed(const LazyConstraint *lazy, const ConstraintState *state, uint8_t byte, ConstraintState *out);
bool lazy_state_feed_bytes(const LazyConstraint *lazy, ConstraintState *state, const char *bytes, size_t length);
bool lazy_state_accepts(const LazyConstraint *lazy, const ConstraintState *state);
size_t lazy_state_key(const LazyConstraint *lazy, const ConstraintState *state, uint8_t *key);
// A trigger has been written: the inner constraint governs the text from here.
bool lazy_state_triggered(const ConstraintState *state);
