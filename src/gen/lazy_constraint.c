// The lazy constraint: free text until a trigger, then an inner constraint (lazy_constraint.h).
#include "gen/lazy_constraint.h"

#include <stdlib.h>
#include <string.h>

#include "core/check.h"

struct LazyConstraint {
    Constraint *inner;
    int num_triggers;
    char *text[LAZY_MAX_TRIGGERS];
    size_t length[LAZY_MAX_TRIGGERS];
    bool at_start[LAZY_MAX_TRIGGERS];
    // The automaton over the triggers that may match anywhere: state s is a prefix of one
    // of them (0: the empty one), next[s * 256 + b] the state after byte b (the longest
    // suffix of "prefix + b" that is a prefix of a trigger), fires[s] the longest trigger
    // that the prefix ends with (-1: none; the text is triggered there).
    int num_states;
    int32_t *next;
    int32_t *fires;
};

void lazy_constraint_free(LazyConstraint *lazy) {
    if (!lazy) return;
    constraint_free(lazy->inner);
    for (int i = 0; i < lazy->num_triggers; i++) free(lazy->text[i]);
    free(lazy->next), free(lazy->fires);
    free(lazy);
}

const Constraint *lazy_constraint_inner(const LazyConstraint *lazy) { return lazy->inner; }

// The automaton of the floating triggers: their trie first (next[] -1 where a trie edge is
// missing), then, breadth first so that a state's fallback is finished before it, each
// missing edge filled from the fallback state's (Aho-Corasick's failure links).
static void build_automaton(LazyConstraint *lazy) {
    size_t total = 1;
    for (int i = 0; i < lazy->num_triggers; i++)
        if (!lazy->at_start[i]) total += lazy->length[i];
    lazy->next = xmalloc(total * 256 * sizeof(int32_t));
    lazy->fires = xmalloc(total * sizeof(int32_t));
    int32_t *own = xmalloc(total * sizeof(int32_t)); // the trigger that is exactly this prefix
    memset(lazy->next, 0xff, total * 256 * sizeof(int32_t));
    for (size_t s = 0; s < total; s++) own[s] = -1;
    int states = 1;
    for (int i = 0; i < lazy->num_triggers; i++) {
        if (lazy->at_start[i]) continue;
        int32_t s = 0;
        for (size_t k = 0; k < lazy->length[i]; k++) {
            int32_t *edge = &lazy->next[(size_t)s * 256 + (uint8_t)lazy->text[i][k]];
            if (*edge < 0) *edge = states++;
            s = *edge;
        }
        if (own[s] < 0) own[s] = i; // a trigger given twice: the first
    }
    lazy->num_states = states;
    int32_t *fallback = xmalloc((size_t)states * sizeof(int32_t)), *queue = xmalloc((size_t)states * sizeof(int32_t));
    int head = 0, tail = 0;
    fallback[0] = 0;
    lazy->fires[0] = -1;
    for (int b = 0; b < 256; b++) {
        int32_t *edge = &lazy->next[b];
        if (*edge < 0) *edge = 0;
        else fallback[*edge] = 0, queue[tail++] = *edge;
    }
    while (head < tail) {
        const int32_t s = queue[head++];
        // The prefix is the longest trigger it ends with if it is one, else its fallback's.
        lazy->fires[s] = own[s] >= 0 ? own[s] : lazy->fires[fallback[s]];
        for (int b = 0; b < 256; b++) {
            int32_t *edge = &lazy->next[(size_t)s * 256 + b];
            const int32_t via_fallback = lazy->next[(size_t)fallback[s] * 256 + b];
            if (*edge < 0) *edge = via_fallback;
            else fallback[*edge] = via_fallback, queue[tail++] = *edge;
        }
    }
    free(fallback), free(queue), free(own);
}

int lazy_constraint_new(LazyConstraint **out, Constraint *inner, const LazyTrigger *triggers, int num_triggers,
                        const char *what) {
    *out = NULL;
    if (num_triggers < 1 || num_triggers > LAZY_MAX_TRIGGERS) {
        constraint_free(inner);
        return err_set("%s: %d triggers (1 to %d)", what, num_triggers, LAZY_MAX_TRIGGERS);
    }
    LazyConstraint *lazy = xcalloc(1, sizeof *lazy);
    lazy->inner = inner;
    ConstraintState *probe = xmalloc(sizeof *probe);
    for (int i = 0; i < num_triggers; i++) {
        const LazyTrigger *t = &triggers[i];
        int rc = 0;
        if (t->length == 0) rc = err_set("%s: trigger %d is empty", what, i);
        else if (t->length > LAZY_MAX_TRIGGER_BYTES)
            rc = err_set("%s: trigger %d is %zu bytes long (at most %d)", what, i, t->length, LAZY_MAX_TRIGGER_BYTES);
        if (rc == 0) {
            // The inner constraint is fed the trigger first: one it refuses could never be written.
            constraint_state_init(inner, probe);
            if (!constraint_state_feed_bytes(inner, probe, t->text, t->length))
                rc = err_set("%s: the trigger '%.*s' does not start any text the constraint accepts", what,
                             (int)t->length, t->text);
        }
        if (rc != 0) {
            free(probe);
            lazy_constraint_free(lazy);
            return -1;
        }
        lazy->text[i] = xmalloc(t->length);
        memcpy(lazy->text[i], t->text, t->length);
        lazy->length[i] = t->length;
        lazy->at_start[i] = t->at_start;
        lazy->num_triggers = i + 1;
    }
    free(probe);
    build_automaton(lazy);
    *out = lazy;
    return 0;
}

bool lazy_state_triggered(const ConstraintState *state) { return state->lazy_match < 0; }

// The first trigger that must start the text and begins with `prefix_of`'s first `matched`
// bytes then `byte` (-1: none).
static int start_step(const LazyConstraint *lazy, int prefix_of, int32_t matched, uint8_t byte) {
    for (int i = 0; i < lazy->num_triggers; i++) {
        if (!lazy->at_start[i] || lazy->length[i] <= (size_t)matched) continue;
        if (memcmp(lazy->text[i], lazy->text[prefix_of], (size_t)matched) == 0 && (uint8_t)lazy->text[i][matched] == byte)
            return i;
    }
    return -1;
}

void lazy_state_init(const LazyConstraint *lazy, ConstraintState *state) {
    state->lazy_match = 0;
    state->lazy_start = -1, state->lazy_start_trigger = 0;
    for (int i = 0; i < lazy->num_triggers; i++)
        if (lazy->at_start[i]) {
            state->lazy_start = 0, state->lazy_start_trigger = i;
            break;
        }
}

void lazy_state_copy(const LazyConstraint *lazy, ConstraintState *dst, const ConstraintState *src) {
    if (src->lazy_match < 0) constraint_state_copy(lazy->inner, dst, src);
    dst->lazy_match = src->lazy_match;
    dst->lazy_start = src->lazy_start, dst->lazy_start_trigger = src->lazy_start_trigger;
}

bool lazy_state_feed(const LazyConstraint *lazy, const ConstraintState *state, uint8_t byte, ConstraintState *out) {
    if (state->lazy_match < 0) {
        out->lazy_match = -1, out->lazy_start = -1, out->lazy_start_trigger = 0;
        return constraint_state_feed(lazy->inner, state, byte, out);
    }
    // Free text: where the triggers stand after the byte (computed before `out`, which
    // may be `state`, is written).
    const int32_t match = lazy->next[(size_t)state->lazy_match * 256 + byte];
    int fired = lazy->fires[match];
    int32_t start = -1, start_trigger = 0;
    if (state->lazy_start >= 0) {
        const int i = start_step(lazy, state->lazy_start_trigger, state->lazy_start, byte);
        if (i >= 0) {
            start = state->lazy_start + 1, start_trigger = i;
            // Some trigger that starts with these bytes may end here (i itself may be longer).
            for (int k = 0; k < lazy->num_triggers; k++)
                if (lazy->at_start[k] && lazy->length[k] == (size_t)start &&
                    memcmp(lazy->text[k], lazy->text[i], (size_t)start) == 0 &&
                    (fired < 0 || lazy->length[k] > lazy->length[fired])) {
                    fired = k;
                    break;
                }
        }
    }
    if (fired < 0) {
        out->lazy_match = match, out->lazy_start = start, out->lazy_start_trigger = start_trigger;
        return true;
    }
    // The trigger's last byte: from here the inner constraint, fed the whole trigger.
    constraint_state_init(lazy->inner, out);
    out->lazy_match = -1, out->lazy_start = -1, out->lazy_start_trigger = 0;
    return constraint_state_feed_bytes(lazy->inner, out, lazy->text[fired], lazy->length[fired]);
}

bool lazy_state_feed_bytes(const LazyConstraint *lazy, ConstraintState *state, const char *bytes, size_t length) {
    size_t i = 0;
    for (; i < length && state->lazy_match >= 0; i++)
        if (!lazy_state_feed(lazy, state, (uint8_t)bytes[i], state)) return false;
    return i == length || constraint_state_feed_bytes(lazy->inner, state, bytes + i, length - i);
}

bool lazy_state_accepts(const LazyConstraint *lazy, const ConstraintState *state) {
    return state->lazy_match >= 0 || constraint_state_accepts(lazy->inner, state);
}

size_t lazy_state_key(const LazyConstraint *lazy, const ConstraintState *state, uint8_t *key) {
    // A first byte tells the two modes apart; then the automaton's fields, or the inner
    // state's key (room: ConstraintState has the three int32 fields besides the union).
    if (state->lazy_match < 0) {
        key[0] = 1;
        return 1 + constraint_state_key(lazy->inner, state, key + 1);
    }
    key[0] = 0;
    memcpy(key + 1, &state->lazy_match, sizeof(int32_t));
    memcpy(key + 5, &state->lazy_start, sizeof(int32_t));
    memcpy(key + 9, &state->lazy_start_trigger, sizeof(int32_t));
    return 13;
}
