// The constraint interface over the JSON, regular-expression, grammar and lazy recognisers (constraint.h).
#include "gen/constraint.h"

#include <stdlib.h>
#include <string.h>

#include "core/check.h"
#include "gen/lazy_constraint.h"

struct Constraint {
    JsonConstraint *json; // one of the four
    RegexConstraint *regex;
    GrammarConstraint *grammar;
    LazyConstraint *lazy;
};

Constraint *constraint_from_json(JsonConstraint *json) {
    if (!json) return NULL;
    Constraint *c = xcalloc(1, sizeof *c);
    c->json = json;
    return c;
}

Constraint *constraint_from_regex(RegexConstraint *regex) {
    if (!regex) return NULL;
    Constraint *c = xcalloc(1, sizeof *c);
    c->regex = regex;
    return c;
}

Constraint *constraint_from_grammar(GrammarConstraint *grammar) {
    if (!grammar) return NULL;
    Constraint *c = xcalloc(1, sizeof *c);
    c->grammar = grammar;
    return c;
}

Constraint *constraint_from_lazy(LazyConstraint *lazy) {
    if (!lazy) return NULL;
    // The state has one set of lazy fields: a lazy constraint inside another has none left.
    CHECK(!lazy_constraint_inner(lazy)->lazy, "a lazy constraint's inner constraint is lazy");
    Constraint *c = xcalloc(1, sizeof *c);
    c->lazy = lazy;
    return c;
}

void constraint_free(Constraint *c) {
    if (!c) return;
    json_constraint_free(c->json);
    regex_constraint_free(c->regex);
    grammar_constraint_free(c->grammar);
    lazy_constraint_free(c->lazy);
    free(c);
}

void constraint_state_init(const Constraint *c, ConstraintState *state) {
    if (c->lazy) lazy_state_init(c->lazy, state);
    else if (c->regex) state->regex = regex_state_start(c->regex);
    else if (c->grammar) grammar_state_init(c->grammar, &state->grammar);
    else json_state_init(c->json, &state->json);
}

void constraint_state_copy(const Constraint *c, ConstraintState *dst, const ConstraintState *src) {
    if (c->lazy) lazy_state_copy(c->lazy, dst, src);
    else if (c->regex) dst->regex = src->regex;
    else if (c->grammar) grammar_state_copy(&dst->grammar, &src->grammar);
    else json_state_copy(&dst->json, &src->json);
}

bool constraint_state_feed(const Constraint *c, const ConstraintState *state, uint8_t byte, ConstraintState *out) {
    if (c->lazy) return lazy_state_feed(c->lazy, state, byte, out);
    if (c->regex) return (out->regex = regex_state_feed(c->regex, state->regex, byte)) >= 0;
    if (c->grammar) return grammar_state_feed(c->grammar, &state->grammar, byte, &out->grammar);
    return json_state_feed(c->json, &state->json, byte, &out->json);
}

bool constraint_state_feed_bytes(const Constraint *c, ConstraintState *state, const char *bytes, size_t length) {
    if (c->lazy) return lazy_state_feed_bytes(c->lazy, state, bytes, length);
    if (c->grammar) return grammar_state_feed_bytes(c->grammar, &state->grammar, bytes, length);
    if (!c->regex) return json_state_feed_bytes(c->json, &state->json, bytes, length);
    for (size_t i = 0; i < length && state->regex >= 0; i++) state->regex = regex_state_feed(c->regex, state->regex, (uint8_t)bytes[i]);
    return state->regex >= 0;
}

bool constraint_state_accepts(const Constraint *c, const ConstraintState *state) {
    if (c->lazy) return lazy_state_accepts(c->lazy, state);
    if (c->grammar) return grammar_state_accepts(c->grammar, &state->grammar);
    return c->regex ? regex_state_accepts(c->regex, state->regex) : json_state_accepts(c->json, &state->json);
}

// Appends `size` bytes of `value` to the key.
static size_t put(uint8_t *key, size_t at, const void *value, size_t size) {
    memcpy(key + at, value, size);
    return at + size;
}

size_t constraint_state_key(const Constraint *c, const ConstraintState *state, uint8_t *key) {
    size_t n = 0;
    if (c->lazy) return lazy_state_key(c->lazy, state, key);
    if (c->regex) return put(key, n, &state->regex, sizeof state->regex);
    if (c->grammar) {
        const GrammarState *g = &state->grammar;
        n = put(key, n, &g->num_stacks, sizeof g->num_stacks);
        n = put(key, n, &g->used, sizeof g->used);
        n = put(key, n, &g->utf8_value, sizeof g->utf8_value);
        n = put(key, n, &g->utf8_need, sizeof g->utf8_need);
        n = put(key, n, &g->utf8_next_lo, sizeof g->utf8_next_lo);
        n = put(key, n, &g->utf8_next_hi, sizeof g->utf8_next_hi);
        n = put(key, n, &g->overflow, sizeof g->overflow);
        return put(key, n, g->pool, (size_t)g->used * sizeof g->pool[0]);
    }
    return json_state_key(c->json, &state->json, key);
}

const RegexConstraint *constraint_regex(const Constraint *c) { return c->regex; }

bool constraint_matches(const Constraint *c, const char *text, size_t length) {
    if (c->lazy) {
        ConstraintState *state = xmalloc(sizeof *state);
        lazy_state_init(c->lazy, state);
        const bool accepted = lazy_state_feed_bytes(c->lazy, state, text, length) && lazy_state_accepts(c->lazy, state);
        free(state);
        return accepted;
    }
    if (c->grammar) return grammar_constraint_matches(c->grammar, text, length);
    return c->regex ? regex_constraint_matches(c->regex, text, length) : json_constraint_matches(c->json, text, length);
}
