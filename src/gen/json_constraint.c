// The JSON constraint: a schema compiled into a graph of nodes, and a recogniser that runs
// the text's bytes through it (see json_constraint.h).
//
// A path is a stack of frames, one per value being written (the root frame at the
// bottom); a frame's node says what kind of value it is and its phase where in it the text
// is. A value's frame is pushed by its first byte. Values that end with a closing byte
// (objects, arrays, strings) pop themselves there; those that may go on (numbers, enum
// literals that are a prefix of another, a repetition of tool calls) pop when a byte comes
// that they cannot take, which then goes to the frame below: in JSON such a byte is never
// one the value could have taken, so this greedy choice loses nothing. Alternatives (anyOf,
// type lists, any value) fork the path at their first byte, into the branches that can
// start with it.
#include "gen/json_constraint.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/check.h"
#include "gen/regex_constraint.h"

typedef enum { K_ROOT, K_ALT, K_OBJECT, K_ARRAY, K_STRING, K_NUMBER, K_INTEGER, K_LITERALS, K_SEQ, K_REPEAT } Kind;

// A numeric bound: a sign and a magnitude, the magnitude as its integer part and the digits of
// its fraction (none for an integer; no trailing zero). Zero is never negative. A bound read
// from a JSON real is the shortest decimal that reads back as that double (0.1, not
// 0.1000000000000000055...), which is what schemas mean and what pydantic writes.
#define BOUND_FRACTION_DIGITS 21
typedef struct {
    bool negative;
    uint64_t integer;
    char fraction[BOUND_FRACTION_DIGITS + 1];
} Decimal;

typedef struct {
    Kind kind;
    bool first[256]; // the bytes that can start the value
    // OBJECT: the properties (names as JSON spells them inside the quotes), which are
    // required, the schema of other keys (-1: none allowed).
    int num_props;
    char **names;
    size_t *name_lengths;
    int *prop_nodes;
    uint64_t required;
    int extra;
    // ARRAY: the items after the tuple's (prefixItems, in children), their bounds (max -1:
    // none). STRING: the length bounds (code points).
    int item, min_count, max_count;
    // LITERALS: the texts.
    int num_literals;
    char **literals;
    size_t *literal_lengths;
    // ALT, SEQ: the children. ROOT, REPEAT: children[0]; REPEAT's separator. ARRAY: the
    // tuple's items (prefixItems), the first num_children items.
    int num_children;
    int *children;
    char *separator;
    size_t separator_length;
    // STRING with a `pattern`: the decoded content's automaton (the length bounds in it).
    RegexConstraint *regex;
    // INTEGER: the values allowed, minimum..maximum inclusive (always set: without bounds
    // ±(10^18 - 1), the 18 digits every integer is held to). NUMBER under bounds (bounded):
    // those present, each inclusive or exclusive, integers or decimal fractions.
    bool bounded, has_minimum, has_maximum, minimum_exclusive, maximum_exclusive;
    Decimal minimum, maximum;
    // INTEGER: `multipleOf` (0: none). NUMBER: `multipleOf` 10^-fraction_places (-1: none): no
    // nonzero fraction digit after that many, the bounds moved onto that grid (inclusive).
    uint64_t multiple_of;
    int fraction_places;
    // A `$ref`'s target is reached through an ALT with one child, made before the target is
    // compiled so that the target can refer to it (a recursive schema is a graph); definition
    // is the reference's text and origin the schema's name (`what`; the root's too), for
    // errors.
    char *definition, *origin;
    // The least number of open values (frames, this one included) that a complete value of
    // the node needs; DEPTH_INFINITE: it has no finite value. A value is opened (and an
    // alternative, a key or an item chosen) only where it fits in what is left of
    // JSON_MAX_DEPTH, so that a text that starts to match can always be completed.
    int min_depth;
} Node;

#define DEPTH_INFINITE (1 << 20)

struct JsonConstraint {
    Node *nodes;
    int num_nodes, capacity;
    int root;
    int any; // the any-value node, made on first use (-1)
    // While compiling a schema: its root (for $ref) and the references compiled so far, each
    // to one node (its text is the schema's: valid while compiling).
    const json_t *schema_root;
    const char **ref_texts;
    int *ref_nodes;
    int num_refs;
};

// Phases.
enum { ROOT_START, ROOT_DONE };
enum { O_OPEN, O_KEY_START, O_COMMA_SPACE, O_COLON, O_VALUE_SPACE, O_VALUE, O_AFTER_VALUE, O_KEY };
enum { A_OPEN, A_AFTER_VALUE, A_COMMA_SPACE, A_VALUE };
enum { NUM_SIGN, NUM_ZERO, NUM_INT, NUM_FRAC0, NUM_FRAC, NUM_EXP0, NUM_EXP_SIGN, NUM_EXP };
enum { R_AFTER_ITEM, R_SEPARATOR, R_ITEM };

// --- numbers within bounds ----------------------------------------------------------------
//
// An integer, or a number under minimum / maximum, is read digit by digit against its
// bounds, with no table of the numbers: its frame holds the phase (NUM_SIGN .. NUM_FRAC: no
// exponent), count (its bytes), a (the integer part's digits read as a number) and b
// (NUMBER_NEGATIVE, and for each bound of the sign's magnitudes how the fraction's digits so
// far compare with the bound's first as many: FRACTION_BELOW, FRACTION_ABOVE, or neither:
// equal so far). A byte is taken only where some number that begins with the text so far is
// within the bounds (and within JSON_MAX_NUMBER_BYTES), so the text can always be
// completed. The comparison is of exact decimals: the text as written against the bound's
// decimal (Decimal).
enum { NUMBER_NEGATIVE = 1 };
enum { FRACTION_BELOW = 1, FRACTION_ABOVE = 2 };       // a bound's two bits of b
enum { LOW_FRACTION_SHIFT = 1, HIGH_FRACTION_SHIFT = 3 }; // where its bits are
#define INTEGER_MAX_DIGITS 19 // int64's: 2^63 - 1 has 19
#define INTEGER_DEFAULT_LIMIT 999999999999999999LL // 10^18 - 1: an integer with no bounds has at most 18 digits

// A magnitude: an integer part and the digits of a fraction ("" for none; trailing zeros
// allowed).
typedef struct {
    uint64_t integer;
    const char *fraction;
} Magnitude;

// -1, 0, 1 as a is below, equal to, above b.
static int magnitude_compare(Magnitude a, Magnitude b) {
    if (a.integer != b.integer) return a.integer < b.integer ? -1 : 1;
    const size_t a_digits = strlen(a.fraction), b_digits = strlen(b.fraction);
    for (size_t k = 0; k < a_digits || k < b_digits; k++) {
        const char x = k < a_digits ? a.fraction[k] : '0', y = k < b_digits ? b.fraction[k] : '0';
        if (x != y) return x < y ? -1 : 1;
    }
    return 0;
}

// The magnitudes (absolute values) that one sign may have: low..high, each end inclusive or
// not, no high where that side has no bound; empty: no value has that sign. -0 is 0.
typedef struct {
    Magnitude low, high;
    bool low_exclusive, high_exclusive, has_high, empty;
} Magnitudes;

static bool decimal_is_zero(const Decimal *d) { return d->integer == 0 && !d->fraction[0]; }

static Magnitudes sign_magnitudes(const Node *n, bool negative) {
    Magnitudes m = {.low = {0, ""}, .high = {0, ""}};
    const Decimal *min = &n->minimum, *max = &n->maximum;
    if (!negative) { // the value is the magnitude
        m.empty = n->has_maximum && max->negative;
        if (n->has_minimum && !min->negative)
            m.low = (Magnitude){min->integer, min->fraction}, m.low_exclusive = n->minimum_exclusive;
        if (n->has_maximum) m.has_high = true, m.high = (Magnitude){max->integer, max->fraction}, m.high_exclusive = n->maximum_exclusive;
    } else { // the value is minus the magnitude
        m.empty = n->has_minimum && !min->negative && !decimal_is_zero(min);
        if (n->has_maximum && (max->negative || decimal_is_zero(max)))
            m.low = (Magnitude){max->integer, max->fraction}, m.low_exclusive = n->maximum_exclusive;
        if (n->has_minimum) m.has_high = true, m.high = (Magnitude){min->integer, min->fraction}, m.high_exclusive = n->minimum_exclusive;
    }
    return m;
}

// The magnitude x is allowed.
static bool magnitude_allowed(const Magnitudes *m, Magnitude x) {
    if (m->empty) return false;
    const int low = magnitude_compare(x, m->low);
    if (low < 0 || (low == 0 && m->low_exclusive)) return false;
    if (!m->has_high) return true;
    const int high = magnitude_compare(x, m->high);
    return high < 0 || (high == 0 && !m->high_exclusive);
}

// Some allowed magnitude lies in [first, end) (integers, first < end).
static bool interval_allowed(const Magnitudes *m, uint64_t first, uint64_t end) {
    if (m->empty) return false;
    // The interval's lower end: first (inclusive) or the low bound, whichever is higher.
    Magnitude from = {first, ""};
    bool from_exclusive = false;
    if (magnitude_compare(m->low, from) >= 0) from = m->low, from_exclusive = m->low_exclusive;
    // Its upper end: end (exclusive) or the high bound, whichever is lower.
    Magnitude to = {end, ""};
    bool to_exclusive = true;
    if (m->has_high && magnitude_compare(m->high, to) < 0) to = m->high, to_exclusive = m->high_exclusive;
    const int order = magnitude_compare(from, to);
    return order < 0 || (order == 0 && !from_exclusive && !to_exclusive);
}

// Some allowed magnitude has an integer part that begins with the digits written (value
// `part`, `digits` of them; zero: the part is "0", which takes no more digits). Followed by
// j more digits the integer part is one of part*10^j .. part*10^j + 10^j - 1; with a
// fraction (numbers) the magnitude is anywhere in [part*10^j, (part+1)*10^j). A number's
// point strictly inside that interval needs at most one digit more than the bounds' fractions
// have, which fits (read_bound limits the bounds' digits).
static bool integer_part_completable(const Magnitudes *m, uint64_t part, int digits, bool zero, bool integer,
                                     uint64_t multiple_of) {
    if (m->empty) return false;
    const int max_digits = integer ? INTEGER_MAX_DIGITS : JSON_MAX_INTEGER_DIGITS;
    uint64_t scale = 1; // 10^j
    for (int total = digits; total <= max_digits; total++) {
        if (part > UINT64_MAX / scale) return false;
        const uint64_t first = part * scale;
        if (m->has_high && first > m->high.integer) return false; // and so for every longer part
        const uint64_t last = first + (scale - 1); // no overflow: first <= high <= 2^63, scale <= first (or 1)
        if (integer) {
            // The smallest integer of [first, last] above the low bound (an integer) and a
            // multiple of multipleOf (a magnitude is one when its value is), checked against
            // the high one. No overflow: x <= 2^63 and the step < 2^63.
            uint64_t x = m->low.integer + (m->low_exclusive ? 1 : 0);
            if (x < first) x = first;
            if (multiple_of > 1 && x % multiple_of) x += multiple_of - x % multiple_of;
            if (x <= last && magnitude_allowed(m, (Magnitude){x, ""})) return true;
        } else if (interval_allowed(m, first, last + 1)) {
            return true;
        }
        if (zero || scale > UINT64_MAX / 10) return false;
        scale *= 10;
    }
    return false;
}

// The digits of the integer part a (no leading zero: "0" is one digit).
static int decimal_digits(uint64_t a) {
    int digits = 1;
    for (; a >= 10; a /= 10) digits++;
    return digits;
}

// The fraction digits written so far (in NUM_FRAC0 / NUM_FRAC).
static int fraction_digits(const JsonFrame *f) {
    return f->count - ((f->b & NUMBER_NEGATIVE) ? 1 : 0) - decimal_digits(f->a) - 1;
}

// Where the magnitudes that begin with the text (a, then k fraction digits whose comparison
// with `bound`'s is `state`: all of [x, x + 10^-k)) lie against the bound.
enum { WHOLLY_BELOW, WHOLLY_ABOVE, STRADDLES };
static int fraction_against(uint64_t a, int state, Magnitude bound) {
    if (a != bound.integer) return a < bound.integer ? WHOLLY_BELOW : WHOLLY_ABOVE;
    return state == FRACTION_BELOW ? WHOLLY_BELOW : state == FRACTION_ABOVE ? WHOLLY_ABOVE : STRADDLES;
}

// The bound has nonzero digits after its k-th fraction digit (its fraction has no trailing
// zero): the text, equal to it so far, is still below it.
static bool bound_goes_on(Magnitude bound, int k) { return (int)strlen(bound.fraction) > k; }

// In NUM_FRAC0 / NUM_FRAC: x = a.(the k digits) itself is within the bounds.
static bool fraction_value_allowed(const Magnitudes *m, const JsonFrame *f) {
    if (m->empty) return false;
    const int k = fraction_digits(f);
    const int low = fraction_against(f->a, (int)(f->b >> LOW_FRACTION_SHIFT) & 3, m->low);
    if (low == WHOLLY_BELOW || (low == STRADDLES && (bound_goes_on(m->low, k) || m->low_exclusive))) return false;
    if (!m->has_high) return true;
    const int high = fraction_against(f->a, (int)(f->b >> HIGH_FRACTION_SHIFT) & 3, m->high);
    return high == WHOLLY_BELOW || (high == STRADDLES && (bound_goes_on(m->high, k) || !m->high_exclusive));
}

// The number written so far (frame f of node n) can be completed within the bounds.
static bool bounded_completable(const Node *n, const JsonFrame *f) {
    const bool negative = f->b & NUMBER_NEGATIVE;
    const Magnitudes m = sign_magnitudes(n, negative);
    const bool integer = n->kind == K_INTEGER;
    switch (f->phase) {
    case NUM_SIGN: // a sign alone: some first digit
        for (uint64_t digit = 0; digit <= 9; digit++)
            if (integer_part_completable(&m, digit, 1, digit == 0, integer, n->multiple_of)) return true;
        return false;
    case NUM_ZERO:
    case NUM_INT:
        return integer_part_completable(&m, f->a, f->count - (negative ? 1 : 0), f->phase == NUM_ZERO, integer,
                                        n->multiple_of);
    default: { // NUM_FRAC0, NUM_FRAC: the magnitudes [x, x + 10^-k) of x = a.(the k digits)
        if (m.empty) return false;
        const int k = fraction_digits(f);
        const bool room = f->count < JSON_MAX_NUMBER_BYTES; // for one more digit
        if (k == 0 && !room) return false;                  // "a." needs a digit
        // Under multipleOf 10^-p (bounded_number_byte takes only zeros past p places) the checks
        // below hold as they are: the bounds are on that grid and inclusive (decimal_onto_grid),
        // and so are the interval's ends while k <= p, so where the interval meets the bounds it
        // holds a multiple; past p places the only multiple in it is x, and a bound in it is x.
        const int low_state = (int)(f->b >> LOW_FRACTION_SHIFT) & 3, high_state = (int)(f->b >> HIGH_FRACTION_SHIFT) & 3;
        const int low = fraction_against(f->a, low_state, m.low);
        if (low == WHOLLY_BELOW) return false;
        // At the low bound (x is it, nothing more to come): exclusive needs a nonzero digit.
        if (low == STRADDLES && !bound_goes_on(m.low, k) && m.low_exclusive && !room) return false;
        if (!m.has_high) return true;
        const int high = fraction_against(f->a, high_state, m.high);
        if (high == WHOLLY_ABOVE) return false;
        // x is at most the high bound; below it unless x is the bound itself.
        if (high == STRADDLES && m.high_exclusive && !bound_goes_on(m.high, k)) return false;
        // Both bounds begin with the text: [low, high] is in the interval, empty only when
        // they are one point with an exclusive end (then no text got here).
        if (low == STRADDLES && high == STRADDLES && magnitude_compare(m.low, m.high) == 0)
            return !m.low_exclusive && !m.high_exclusive;
        return true;
    }
    }
}

static bool bounded_can_end(const Node *n, const JsonFrame *f) {
    const Magnitudes m = sign_magnitudes(n, f->b & NUMBER_NEGATIVE);
    if (f->phase == NUM_ZERO || f->phase == NUM_INT)
        return magnitude_allowed(&m, (Magnitude){f->a, ""}) && (n->multiple_of <= 1 || f->a % n->multiple_of == 0);
    return f->phase == NUM_FRAC && fraction_value_allowed(&m, f);
}

// The comparison state of a bound's fraction digits after fraction digit `digit` at place k
// (0 first), from `state` before it: once below or above, it stays so.
static int next_fraction_state(int state, Magnitude bound, int k, uint8_t digit) {
    if (state != 0) return state;
    const char expected = k < (int)strlen(bound.fraction) ? bound.fraction[k] : '0';
    return digit < expected ? FRACTION_BELOW : digit > expected ? FRACTION_ABOVE : 0;
}

// One byte of a bounded number; false (f unchanged) when it is not JSON's number syntax
// (integers: no fraction; no exponent) or leaves no completion within the bounds.
static bool bounded_number_byte(const Node *n, JsonFrame *f, uint8_t b) {
    if (f->count >= JSON_MAX_NUMBER_BYTES) return false;
    const bool digit = b >= '0' && b <= '9';
    JsonFrame next = *f;
    if (f->phase == NUM_SIGN) {
        if (!digit) return false;
        next.phase = b == '0' ? NUM_ZERO : NUM_INT;
        next.a = (uint64_t)(b - '0');
    } else if (f->phase == NUM_INT && digit) {
        if (f->a > (UINT64_MAX - 9) / 10) return false; // beyond every bound (they are at most 2^63)
        next.a = f->a * 10 + (uint64_t)(b - '0');
    } else if (f->phase == NUM_ZERO || f->phase == NUM_INT) {
        if (b != '.' || n->kind == K_INTEGER) return false;
        next.phase = NUM_FRAC0;
    } else { // NUM_FRAC0, NUM_FRAC
        if (!digit) return false;
        if (n->fraction_places >= 0 && fraction_digits(f) >= n->fraction_places && b != '0') return false;
        next.phase = NUM_FRAC;
        // Each bound's comparison matters only where the integer part is the bound's: kept at
        // "equal so far" elsewhere, so that such states share a key.
        const Magnitudes m = sign_magnitudes(n, f->b & NUMBER_NEGATIVE);
        const int k = fraction_digits(f);
        const int low_state = (int)(f->b >> LOW_FRACTION_SHIFT) & 3, high_state = (int)(f->b >> HIGH_FRACTION_SHIFT) & 3;
        next.b = f->b & NUMBER_NEGATIVE;
        if (f->a == m.low.integer) next.b |= (uint64_t)next_fraction_state(low_state, m.low, k, b) << LOW_FRACTION_SHIFT;
        if (m.has_high && f->a == m.high.integer)
            next.b |= (uint64_t)next_fraction_state(high_state, m.high, k, b) << HIGH_FRACTION_SHIFT;
    }
    next.count++;
    if (!bounded_completable(n, &next)) return false;
    *f = next;
    return true;
}

// The frame of a bounded number that begins with `byte`; false when none can.
static bool bounded_number_start(const Node *n, int node, uint8_t byte, JsonFrame *f) {
    *f = (JsonFrame){.node = node, .phase = NUM_SIGN};
    if (byte != '-') return bounded_number_byte(n, f, byte);
    f->count = 1;
    f->b = NUMBER_NEGATIVE;
    return bounded_completable(n, f);
}

// --- building ---------------------------------------------------------------------------

static int new_node(JsonConstraint *c, Kind kind) {
    if (c->num_nodes == c->capacity) {
        c->capacity = c->capacity ? 2 * c->capacity : 32;
        c->nodes = xrealloc(c->nodes, (size_t)c->capacity * sizeof(Node));
    }
    Node *n = &c->nodes[c->num_nodes];
    memset(n, 0, sizeof *n);
    n->kind = kind;
    n->extra = -1;
    n->max_count = -1;
    return c->num_nodes++;
}

static JsonConstraint *constraint_new(void) {
    JsonConstraint *c = xcalloc(1, sizeof *c);
    c->any = -1;
    c->root = -1;
    return c;
}

void json_constraint_free(JsonConstraint *c) {
    if (!c) return;
    for (int i = 0; i < c->num_nodes; i++) {
        Node *n = &c->nodes[i];
        for (int k = 0; k < n->num_props; k++) free(n->names[k]);
        for (int k = 0; k < n->num_literals; k++) free(n->literals[k]);
        free(n->names), free(n->name_lengths), free(n->prop_nodes);
        free(n->literals), free(n->literal_lengths), free(n->children), free(n->separator);
        regex_constraint_free(n->regex);
        free(n->definition), free(n->origin);
    }
    free(c->ref_texts), free(c->ref_nodes);
    free(c->nodes);
    free(c);
}

static void set_first_range(Node *n, const char *bytes) {
    for (const char *b = bytes; *b; b++) n->first[(uint8_t)*b] = true;
}

static void add_child(JsonConstraint *c, int node, int child) {
    Node *n = &c->nodes[node];
    n->children = xrealloc(n->children, (size_t)(n->num_children + 1) * sizeof(int));
    n->children[n->num_children++] = child;
}

// Bytes that start any of the children (ALT), the first child (SEQ, REPEAT, ROOT).
static void derive_first(JsonConstraint *c, int node) {
    Node *n = &c->nodes[node];
    memset(n->first, 0, sizeof n->first);
    const int count = n->kind == K_ALT ? n->num_children : 1;
    for (int k = 0; k < count; k++)
        for (int b = 0; b < 256; b++) n->first[b] |= c->nodes[n->children[k]].first[b];
}

static int literals_node(JsonConstraint *c, char **texts, size_t *lengths, int count) {
    int node = new_node(c, K_LITERALS);
    Node *n = &c->nodes[node];
    n->literals = texts;
    n->literal_lengths = lengths;
    n->num_literals = count;
    for (int k = 0; k < count; k++) n->first[(uint8_t)texts[k][0]] = true;
    return node;
}

static int literal_node(JsonConstraint *c, const char *text) {
    char **texts = xmalloc(sizeof(char *));
    size_t *lengths = xmalloc(sizeof(size_t));
    texts[0] = xstrdup(text);
    lengths[0] = strlen(text);
    return literals_node(c, texts, lengths, 1);
}

static int string_node(JsonConstraint *c, int min_length, int max_length) {
    int node = new_node(c, K_STRING);
    c->nodes[node].min_count = min_length;
    c->nodes[node].max_count = max_length;
    set_first_range(&c->nodes[node], "\"");
    return node;
}

static int number_node(JsonConstraint *c) {
    int node = new_node(c, K_NUMBER);
    set_first_range(&c->nodes[node], "-0123456789");
    return node;
}

// An integer, or a number under bounds (n's minimum / maximum fields set): its first bytes
// are those that some value within the bounds starts with; -1 when there is none.
static int bounded_number_node(JsonConstraint *c, const Node *bounds) {
    int node = new_node(c, bounds->kind);
    Node *n = &c->nodes[node];
    n->bounded = true;
    n->has_minimum = bounds->has_minimum, n->minimum = bounds->minimum, n->minimum_exclusive = bounds->minimum_exclusive;
    n->has_maximum = bounds->has_maximum, n->maximum = bounds->maximum, n->maximum_exclusive = bounds->maximum_exclusive;
    n->multiple_of = bounds->multiple_of;
    n->fraction_places = bounds->fraction_places;
    bool any = false;
    for (const char *b = "-0123456789"; *b; b++) {
        JsonFrame f;
        n->first[(uint8_t)*b] = bounded_number_start(n, node, (uint8_t)*b, &f);
        any |= n->first[(uint8_t)*b];
    }
    if (any) return node;
    c->num_nodes--; // the last node made: nothing refers to it
    return -1;
}

// An object with the given properties (none yet) and other keys' schema.
static int object_node(JsonConstraint *c, int extra) {
    int node = new_node(c, K_OBJECT);
    c->nodes[node].extra = extra;
    set_first_range(&c->nodes[node], "{");
    return node;
}

static void add_property(JsonConstraint *c, int node, const char *name, int value, bool required) {
    Node *n = &c->nodes[node];
    // The name as JSON writes it between its quotes.
    json_t *string = json_string(name);
    char *quoted = json_dumps(string, JSON_ENCODE_ANY);
    json_decref(string);
    size_t length = strlen(quoted);
    n->names = xrealloc(n->names, (size_t)(n->num_props + 1) * sizeof(char *));
    n->name_lengths = xrealloc(n->name_lengths, (size_t)(n->num_props + 1) * sizeof(size_t));
    n->prop_nodes = xrealloc(n->prop_nodes, (size_t)(n->num_props + 1) * sizeof(int));
    n->names[n->num_props] = xmalloc(length - 1);
    memcpy(n->names[n->num_props], quoted + 1, length - 2);
    n->names[n->num_props][length - 2] = '\0';
    n->name_lengths[n->num_props] = length - 2;
    n->prop_nodes[n->num_props] = value;
    if (required) n->required |= (uint64_t)1 << n->num_props;
    n->num_props++;
    free(quoted);
}

// Any JSON value (objects' keys any strings, each value any JSON).
static int any_node(JsonConstraint *c) {
    if (c->any >= 0) return c->any;
    const int any = new_node(c, K_ALT);
    c->any = any;
    const int object = object_node(c, any);
    const int array = new_node(c, K_ARRAY);
    c->nodes[array].item = any;
    c->nodes[array].min_count = 0;
    set_first_range(&c->nodes[array], "[");
    char **texts = xmalloc(3 * sizeof(char *));
    size_t *lengths = xmalloc(3 * sizeof(size_t));
    const char *words[] = {"true", "false", "null"};
    for (int k = 0; k < 3; k++) texts[k] = xstrdup(words[k]), lengths[k] = strlen(words[k]);
    const int children[] = {object, array, string_node(c, 0, -1), number_node(c), literals_node(c, texts, lengths, 3)};
    for (int k = 0; k < 5; k++) add_child(c, any, children[k]);
    derive_first(c, any);
    return any;
}

static int root_node(JsonConstraint *c, int child) {
    int root = new_node(c, K_ROOT);
    add_child(c, root, child);
    derive_first(c, root);
    c->root = root;
    return root;
}

static int finish_graph(JsonConstraint *c);

JsonConstraint *json_constraint_object(void) {
    JsonConstraint *c = constraint_new();
    root_node(c, object_node(c, any_node(c)));
    c->nodes[c->root].origin = xstrdup("json_object");
    CHECK(finish_graph(c) == 0, "any JSON object is finite");
    return c;
}

// --- schemas ----------------------------------------------------------------------------

static int schema_error(const char *what, const char *at, const char *fmt, const char *detail) {
    char message[400];
    snprintf(message, sizeof message, fmt, detail);
    return err_set("%s: %s (at %s)", what, message, at[0] ? at : "the schema's root");
}

static const char *const annotations[] = {"title",   "description", "$schema",    "$id",    "$comment",  "default",
                                          "examples", "strict",     "deprecated", "readOnly", "writeOnly", "$defs",
                                          "definitions"};
static const char *const keywords[] = {"type",        "properties", "required",         "additionalProperties",
                                       "items",       "minItems",   "maxItems",         "enum",
                                       "const",       "anyOf",      "oneOf",            "$ref",
                                       "minLength",   "maxLength",  "pattern",          "prefixItems",
                                       "format",      "minimum",    "exclusiveMinimum", "maximum",
                                       "exclusiveMaximum", "allOf",    "multipleOf"};

static bool in_list(const char *key, const char *const *list, size_t count) {
    for (size_t i = 0; i < count; i++)
        if (!strcmp(key, list[i])) return true;
    return false;
}

// A non-negative integer keyword, or -1 when absent; -2 (error set) when not one.
static long long count_keyword(const json_t *schema, const char *key, const char *what, const char *at) {
    json_t *v = json_object_get(schema, key);
    if (!v) return -1;
    if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > 1000000) {
        schema_error(what, at, "'%s' must be a non-negative integer", key);
        return -2;
    }
    return json_integer_value(v);
}

typedef enum { T_OBJECT = 1, T_ARRAY = 2, T_STRING = 4, T_NUMBER = 8, T_INTEGER = 16, T_BOOLEAN = 32, T_NULL = 64 } TypeBit;

static int type_bit(const char *name) {
    static const char *const names[] = {"object", "array", "string", "number", "integer", "boolean", "null"};
    for (int i = 0; i < 7; i++)
        if (!strcmp(name, names[i])) return 1 << i;
    return 0;
}

static bool value_has_type(const json_t *v, int types) {
    return ((types & T_OBJECT) && json_is_object(v)) || ((types & T_ARRAY) && json_is_array(v)) ||
           ((types & T_STRING) && json_is_string(v)) || ((types & T_NUMBER) && json_is_number(v)) ||
           ((types & T_INTEGER) && json_is_integer(v)) || ((types & T_BOOLEAN) && json_is_boolean(v)) ||
           ((types & T_NULL) && json_is_null(v));
}

static int compile(JsonConstraint *c, const json_t *schema, const char *what, const char *at, int depth);

static int compile_child(JsonConstraint *c, const json_t *schema, const char *what, const char *at, const char *key,
                         int depth) {
    char child_at[512];
    snprintf(child_at, sizeof child_at, "%.250s%s%.250s", at, at[0] ? "." : "", key);
    return compile(c, schema, what, child_at, depth + 1);
}

// `$ref`: `#` (the root), `#/$defs/NAME` or `#/definitions/NAME`. Each definition is
// compiled once, to an ALT node with the target as its only child; a reference met again,
// also from inside its own target (recursion), is that node.
// The schema a `$ref` names; NULL (error set) when it names none or is not supported.
static const json_t *ref_target(const JsonConstraint *c, const char *ref, const char *what, const char *at) {
    if (!strcmp(ref, "#")) return c->schema_root;
    const char *name = NULL, *container = NULL;
    if (!strncmp(ref, "#/$defs/", 8)) container = "$defs", name = ref + 8;
    else if (!strncmp(ref, "#/definitions/", 14)) container = "definitions", name = ref + 14;
    if (!name || !*name || strchr(name, '/') || strchr(name, '~')) {
        schema_error(what, at, "'$ref' '%.200s' is not supported (only #, #/$defs/NAME and #/definitions/NAME)", ref);
        return NULL;
    }
    json_t *defs = json_object_get(c->schema_root, container);
    const json_t *target = json_is_object(defs) ? json_object_get(defs, name) : NULL;
    if (!target) schema_error(what, at, "'$ref' '%.200s' names no definition of the schema", ref);
    return target;
}

static int compile_ref(JsonConstraint *c, const char *ref, const char *what, const char *at, int depth) {
    for (int i = 0; i < c->num_refs; i++)
        if (!strcmp(c->ref_texts[i], ref)) return c->ref_nodes[i];
    const json_t *target = ref_target(c, ref, what, at);
    if (!target) return -1;
    const int node = new_node(c, K_ALT);
    c->nodes[node].definition = xstrdup(ref);
    c->nodes[node].origin = xstrdup(what);
    c->ref_texts = xrealloc(c->ref_texts, (size_t)(c->num_refs + 1) * sizeof(char *));
    c->ref_nodes = xrealloc(c->ref_nodes, (size_t)(c->num_refs + 1) * sizeof(int));
    c->ref_texts[c->num_refs] = ref;
    c->ref_nodes[c->num_refs++] = node;
    char ref_at[512];
    snprintf(ref_at, sizeof ref_at, "%s", ref[1] ? ref + 2 : "");
    const int target_node = compile(c, target, what, ref_at, depth);
    if (target_node < 0) return -1;
    add_child(c, node, target_node);
    derive_first(c, node);
    return node;
}

// enum / const: the allowed values as compact JSON texts, of the given types.
static int compile_literals(JsonConstraint *c, const json_t *schema, int types, const char *what, const char *at) {
    json_t *values = json_object_get(schema, "enum"), *constant = json_object_get(schema, "const");
    if (values && constant) return schema_error(what, at, "%s", "'enum' and 'const' together are not supported");
    if (values && (!json_is_array(values) || json_array_size(values) == 0))
        return schema_error(what, at, "%s", "'enum' must be a non-empty list");
    if (values && json_array_size(values) > JSON_MAX_ENUM)
        return schema_error(what, at, "'enum' has more than %s values", "64");
    const size_t count = values ? json_array_size(values) : 1;
    char **texts = xmalloc(count * sizeof(char *));
    size_t *lengths = xmalloc(count * sizeof(size_t));
    int kept = 0;
    for (size_t i = 0; i < count; i++) {
        json_t *v = values ? json_array_get(values, i) : constant;
        if (types && !value_has_type(v, types)) continue;
        char *text = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
        bool duplicate = false;
        for (int k = 0; k < kept && !duplicate; k++) duplicate = !strcmp(texts[k], text);
        if (duplicate) {
            free(text);
            continue;
        }
        texts[kept] = text;
        lengths[kept++] = strlen(text);
    }
    if (kept == 0) {
        free(texts), free(lengths);
        return schema_error(what, at, "%s", "no value of 'enum' / 'const' has the schema's 'type'");
    }
    return literals_node(c, texts, lengths, kept);
}

static int compile_object(JsonConstraint *c, const json_t *schema, const char *what, const char *at, int depth) {
    json_t *properties = json_object_get(schema, "properties"), *required = json_object_get(schema, "required");
    json_t *additional = json_object_get(schema, "additionalProperties");
    if (properties && !json_is_object(properties)) return schema_error(what, at, "%s", "'properties' must be an object");
    if (properties && json_object_size(properties) > JSON_MAX_PROPERTIES)
        return schema_error(what, at, "more than %s properties are not supported", "64");
    if (required && !json_is_array(required)) return schema_error(what, at, "%s", "'required' must be a list of strings");
    int extra = -1;
    if (json_is_true(additional) || (json_is_object(additional) && json_object_size(additional) == 0)) {
        extra = any_node(c);
    } else if (json_is_object(additional)) {
        extra = compile_child(c, additional, what, at, "additionalProperties", depth);
        if (extra < 0) return -1;
    } else if (additional && !json_is_false(additional)) {
        return schema_error(what, at, "%s", "'additionalProperties' must be a boolean or a schema");
    }
    // The property schemas first (compiling adds nodes: the object's index is taken after).
    const size_t n = properties ? json_object_size(properties) : 0;
    int *values = xmalloc((n ? n : 1) * sizeof(int));
    const char **names = xmalloc((n ? n : 1) * sizeof(char *));
    size_t i = 0;
    const char *key;
    json_t *value;
    json_object_foreach((json_t *)properties, key, value) {
        char child_at[512];
        snprintf(child_at, sizeof child_at, "properties.%s", key);
        names[i] = key;
        values[i] = compile_child(c, value, what, at, child_at, depth);
        if (values[i] < 0) {
            free(values), free(names);
            return -1;
        }
        i++;
    }
    uint64_t required_bits = 0;
    for (size_t r = 0; required && r < json_array_size(required); r++) {
        json_t *name = json_array_get(required, r);
        if (!json_is_string(name)) {
            free(values), free(names);
            return schema_error(what, at, "%s", "'required' must be a list of strings");
        }
        size_t k = 0;
        while (k < n && strcmp(names[k], json_string_value(name)) != 0) k++;
        if (k == n && extra < 0) {
            free(values), free(names);
            return schema_error(what, at, "'required' names '%.200s', which is not a property, and no other keys are "
                                "allowed ('additionalProperties')", json_string_value(name));
        }
        if (k == n) {
            free(values), free(names);
            return schema_error(what, at, "'required' names '%.200s', which is not among 'properties' (not supported)",
                                json_string_value(name));
        }
        required_bits |= (uint64_t)1 << k;
    }
    const int node = object_node(c, extra);
    for (size_t k = 0; k < n; k++) add_property(c, node, names[k], values[k], (required_bits >> k) & 1);
    free(values), free(names);
    return node;
}

// An array: `items` for every item, or a tuple (`prefixItems`) whose items after the
// listed ones match `items` (absent: any value; false: none), within minItems / maxItems.
static int compile_array(JsonConstraint *c, const json_t *schema, const char *what, const char *at, int depth) {
    json_t *items = json_object_get(schema, "items"), *prefix = json_object_get(schema, "prefixItems");
    long long min_items = count_keyword(schema, "minItems", what, at), max_items = count_keyword(schema, "maxItems", what, at);
    if (min_items == -2 || max_items == -2) return -1;
    if (max_items >= 0 && min_items > max_items) return schema_error(what, at, "%s", "'minItems' is above 'maxItems'");
    if (items && !json_is_object(items) && !json_is_boolean(items))
        return schema_error(what, at, "%s", "'items' must be a schema (a list of schemas is not supported: write 'prefixItems')");
    if (prefix && !json_is_array(prefix)) return schema_error(what, at, "%s", "'prefixItems' must be a list of schemas");
    const size_t num_prefix = prefix ? json_array_size(prefix) : 0;
    if (json_is_false(items) && min_items > (long long)num_prefix)
        return schema_error(what, at, "%s", "'items': false with 'minItems' above the number of 'prefixItems' matches nothing");
    int *tuple = xmalloc((num_prefix ? num_prefix : 1) * sizeof(int));
    for (size_t i = 0; i < num_prefix; i++) {
        char child_at[64];
        snprintf(child_at, sizeof child_at, "prefixItems[%zu]", i);
        tuple[i] = compile_child(c, json_array_get(prefix, i), what, at, child_at, depth);
        if (tuple[i] < 0) {
            free(tuple);
            return -1;
        }
    }
    int item = items && !json_is_false(items) ? compile_child(c, items, what, at, "items", depth) : any_node(c);
    if (item < 0) {
        free(tuple);
        return -1;
    }
    // items: false: no item after the tuple's.
    if (json_is_false(items) && (max_items < 0 || max_items > (long long)num_prefix)) max_items = (long long)num_prefix;
    const int node = new_node(c, K_ARRAY);
    for (size_t i = 0; i < num_prefix; i++) add_child(c, node, tuple[i]);
    free(tuple);
    Node *n = &c->nodes[node];
    n->item = item;
    n->min_count = min_items < 0 ? 0 : (int)min_items;
    n->max_count = (int)max_items;
    set_first_range(n, "[");
    return node;
}

// `format` of strings, as patterns of gen/regex_constraint.h's dialect (anchored: the
// whole content). Written from the RFCs' grammars, narrowed where Python's own parsers
// (datetime, uuid) are narrower, so that every accepted text is one that both read:
//  - date: RFC 3339 full-date YYYY-MM-DD, the year 0001-9999, the day within its month's
//    length, 29 February only in leap years (Gregorian: divisible by 4, not by 100 unless
//    by 400);
//  - time: RFC 3339 full-time hh:mm:ss[.frac]OFFSET, hour 00-23, minute and second 00-59
//    (no leap second 60), a fraction of 1 to 6 digits, the offset Z or +hh:mm / -hh:mm
//    (hour 00-23); upper-case Z only;
//  - date-time: RFC 3339 date-time, date "T" time (upper-case T only);
//  - uuid: RFC 4122's string form, 8-4-4-4-12 hexadecimal digits of either case, any
//    version and variant.
#define FORMAT_YEAR "(?:[1-9][0-9]{3}|0[1-9][0-9]{2}|00[1-9][0-9]|000[1-9])"
#define FORMAT_LEAP_YEAR "(?:[0-9]{2}(?:0[48]|[2468][048]|[13579][26])|(?:0[48]|[2468][048]|[13579][26])00)"
#define FORMAT_DATE                                                                                                    \
    "(?:" FORMAT_YEAR "-(?:(?:0[13578]|1[02])-(?:0[1-9]|[12][0-9]|3[01])|(?:0[469]|11)-(?:0[1-9]|[12][0-9]|30)|"       \
    "02-(?:0[1-9]|1[0-9]|2[0-8]))|" FORMAT_LEAP_YEAR "-02-29)"
#define FORMAT_TIME                                                                                                    \
    "(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:\\.[0-9]{1,6})?(?:Z|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])"
static const char *const format_names[] = {"date", "time", "date-time", "uuid"};
static const char *const format_patterns[] = {
    "^" FORMAT_DATE "$",
    "^" FORMAT_TIME "$",
    "^" FORMAT_DATE "T" FORMAT_TIME "$",
    "^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$",
};

// The pattern of a `format` (absent: NULL), or -1 (error set) for one not supported.
static int format_pattern(const json_t *schema, const char **pattern, const char *what, const char *at) {
    *pattern = NULL;
    json_t *format = json_object_get(schema, "format");
    if (!format) return 0;
    if (!json_is_string(format)) return schema_error(what, at, "%s", "'format' must be a string");
    for (size_t i = 0; i < sizeof format_names / sizeof format_names[0]; i++)
        if (!strcmp(json_string_value(format), format_names[i])) {
            *pattern = format_patterns[i];
            return 0;
        }
    return schema_error(what, at, "'format' '%.100s' is not supported (only date, time, date-time and uuid)",
                        json_string_value(format));
}

// -1, 0, 1 as the signed decimal a is below, equal to, above b.
static int decimal_compare(const Decimal *a, const Decimal *b) {
    if (a->negative != b->negative) return a->negative ? -1 : 1;
    const int order = magnitude_compare((Magnitude){a->integer, a->fraction}, (Magnitude){b->integer, b->fraction});
    return a->negative ? -order : order;
}

static Decimal decimal_from_int64(int64_t value) {
    Decimal d = {.negative = value < 0};
    d.integer = value < 0 ? 0 - (uint64_t)value : (uint64_t)value; // 0 - x: exact for INT64_MIN too
    return d;
}

// The stricter of a side's bound so far and (value, exclusive).
static void tighten(bool lower, bool *has, Decimal *bound, bool *bound_exclusive, Decimal value, bool exclusive) {
    const int order = *has ? decimal_compare(&value, bound) : 0;
    if (*has && (lower ? order < 0 : order > 0)) return;
    if (*has && order == 0 && !exclusive) return;
    *has = true, *bound = value, *bound_exclusive = exclusive;
}

// x, a double with a fraction (so |x| < 2^52), as the shortest decimal that reads back as x:
// the digits of "%.*e" at the least precision that round-trips, placed by its exponent. -1
// when that takes more than BOUND_FRACTION_DIGITS fraction digits, or more bytes with one
// digit more than a number here may have (JSON_MAX_NUMBER_BYTES), which the recogniser
// needs to write every value beside the bound.
static int decimal_from_fraction_double(double x, Decimal *out) {
    const double magnitude = fabs(x);
    char text[64];
    for (int precision = 1; precision <= 17; precision++) {
        snprintf(text, sizeof text, "%.*e", precision - 1, magnitude);
        if (strtod(text, NULL) == magnitude) break;
    }
    // text is d[.ddd]e(+|-)XX: its digits, then where the point falls among them.
    char digits[32];
    int count = 0;
    const char *p = text;
    for (; *p != 'e'; p++)
        if (*p >= '0' && *p <= '9') digits[count++] = *p;
    while (count > 1 && digits[count - 1] == '0') count--;
    const int point = atoi(p + 1) + 1; // the point follows the first `point` digits (<= 0: zeros first)
    memset(out, 0, sizeof *out);
    out->negative = x < 0;
    int length = 0;
    for (int zero = point; zero < 0; zero++) {
        if (length == BOUND_FRACTION_DIGITS) return -1;
        out->fraction[length++] = '0';
    }
    for (int k = 0; k < count; k++) {
        if (k < point) {
            out->integer = out->integer * 10 + (uint64_t)(digits[k] - '0');
        } else {
            if (length == BOUND_FRACTION_DIGITS) return -1;
            out->fraction[length++] = digits[k];
        }
    }
    out->fraction[length] = '\0';
    // The sign, the integer part, the point, the fraction and one digit more.
    return 1 + decimal_digits(out->integer) + 1 + length + 1 <= JSON_MAX_NUMBER_BYTES ? 0 : -1;
}

// A bound's JSON value as a bound (value, exclusive) on the side `lower`. A JSON integer is
// itself. A real on an integer is rounded inward (minimum 0.5: 1), and one beyond int64
// either bounds nothing or leaves nothing (stored as INT64_MAX / INT64_MIN exclusive). On a
// number a real with a fraction is its shortest decimal (decimal_from_fraction_double); other
// bounds beyond ±10^18 are clamped there, past every number of 18 integer digits. -1: error
// set.
static int read_bound(const json_t *v, const char *key, bool lower, bool integer, Decimal *value, bool *exclusive,
                      const char *what, const char *at) {
    const double two_63 = 9223372036854775808.0, limit = 1e18;
    if (json_is_integer(v)) {
        int64_t x = json_integer_value(v);
        if (!integer && x > (int64_t)limit) x = (int64_t)limit;
        if (!integer && x < -(int64_t)limit) x = -(int64_t)limit;
        *value = decimal_from_int64(x);
        return 0;
    }
    const double x = json_real_value(v);
    if (!integer) {
        if (x != floor(x)) {
            if (decimal_from_fraction_double(x, value) != 0) {
                char detail[120];
                snprintf(detail, sizeof detail, "'%s' %.17g", key, x);
                return schema_error(what, at, "%s has more digits than the numbers here are written with (a bound's "
                                    "digits and one more in 24 bytes)", detail);
            }
            return 0;
        }
        *value = decimal_from_int64((int64_t)(x > limit ? limit : x < -limit ? -limit : x));
        return 0;
    }
    double rounded = x;
    if (x != floor(x)) rounded = lower ? ceil(x) : floor(x), *exclusive = false;
    if (rounded >= two_63) *value = decimal_from_int64(INT64_MAX), *exclusive = lower; // lower: nothing left; upper: no bound
    else if (rounded < -two_63) *value = decimal_from_int64(INT64_MIN), *exclusive = !lower;
    else *value = decimal_from_int64((int64_t)rounded);
    return 0;
}

// minimum / exclusiveMinimum and maximum / exclusiveMaximum (the numeric forms of draft 6
// on, or draft 4's boolean exclusiveMinimum / exclusiveMaximum that makes minimum / maximum
// exclusive) into `bounds`: the stricter where a side has two. -1: error set.
static int read_bounds(Node *bounds, const json_t *schema, bool integer, const char *what, const char *at) {
    static const char *const plain[] = {"minimum", "maximum"}, *const strict[] = {"exclusiveMinimum", "exclusiveMaximum"};
    for (int side = 0; side < 2; side++) {
        const bool lower = side == 0;
        bool *has = lower ? &bounds->has_minimum : &bounds->has_maximum;
        Decimal *bound = lower ? &bounds->minimum : &bounds->maximum;
        bool *bound_exclusive = lower ? &bounds->minimum_exclusive : &bounds->maximum_exclusive;
        json_t *v = json_object_get(schema, plain[side]), *e = json_object_get(schema, strict[side]);
        if (v && !json_is_number(v)) return schema_error(what, at, "'%s' must be a number", plain[side]);
        if (e && !json_is_number(e) && !json_is_boolean(e))
            return schema_error(what, at, "'%s' must be a number (or, draft 4, a boolean)", strict[side]);
        if (json_is_true(e) && !v) return schema_error(what, at, "'%s' true needs the bound beside it (draft 4)", strict[side]);
        if (v) {
            Decimal value;
            bool exclusive = json_is_true(e);
            if (read_bound(v, plain[side], lower, integer, &value, &exclusive, what, at) != 0) return -1;
            tighten(lower, has, bound, bound_exclusive, value, exclusive);
        }
        if (json_is_number(e)) {
            Decimal value;
            bool exclusive = true;
            if (read_bound(e, strict[side], lower, integer, &value, &exclusive, what, at) != 0) return -1;
            tighten(lower, has, bound, bound_exclusive, value, exclusive);
        }
    }
    return 0;
}

// Adds (up) or takes one unit in fraction place `places` to or from the magnitude of d (a
// magnitude of at least one unit when taking; at most `places` fraction digits).
static void magnitude_step(Decimal *d, int places, bool up) {
    char digits[BOUND_FRACTION_DIGITS + 1];
    const int length = (int)strlen(d->fraction);
    for (int k = 0; k < places; k++) digits[k] = k < length ? d->fraction[k] : '0';
    int k = places - 1;
    for (; k >= 0; k--) { // the carry or borrow runs left
        if (up ? digits[k] < '9' : digits[k] > '0') {
            digits[k] = (char)(digits[k] + (up ? 1 : -1));
            break;
        }
        digits[k] = up ? '0' : '9';
    }
    if (k < 0) d->integer = up ? d->integer + 1 : d->integer - 1;
    int kept = places;
    while (kept > 0 && digits[kept - 1] == '0') kept--;
    memcpy(d->fraction, digits, (size_t)kept);
    d->fraction[kept] = '\0';
    if (decimal_is_zero(d)) d->negative = false;
}

// Moves a bound onto the grid of multiples of 10^-places, inward, and makes it inclusive: a
// lower bound to the least multiple at or above it (above it when exclusive), an upper bound
// to the greatest at or below it. Its magnitude is cut to `places` digits (toward zero), then
// stepped one unit where the cut or the exclusion asks for it.
static void decimal_onto_grid(Decimal *d, bool *exclusive, bool lower, int places) {
    bool cut = false; // a nonzero digit past `places` was cut
    for (int k = places; d->fraction[k]; k++) cut |= d->fraction[k] != '0';
    if ((int)strlen(d->fraction) > places) d->fraction[places] = '\0';
    for (int k = (int)strlen(d->fraction) - 1; k >= 0 && d->fraction[k] == '0'; k--) d->fraction[k] = '\0';
    // The cut moved the bound toward zero: inward for a negative lower bound and a positive
    // (or zero) upper one, where only an exclusive bound still on the grid steps a unit
    // further in (toward zero; an upper bound of 0 to -10^-places); outward for the others,
    // which step a unit away from zero when cut or exclusive.
    const bool toward_zero_is_inward = lower ? d->negative : !d->negative;
    if (toward_zero_is_inward) {
        if (!cut && *exclusive) {
            if (decimal_is_zero(d)) d->negative = true, magnitude_step(d, places, true); // upper 0: -10^-places
            else magnitude_step(d, places, false);
        }
    } else if (cut || *exclusive) {
        magnitude_step(d, places, true);
    }
    if (decimal_is_zero(d)) d->negative = false;
    *exclusive = false;
}

// The most fraction places of a number's multipleOf: a number's 18 integer digits, the point
// and these fill its 24 bytes with the sign.
#define MULTIPLE_OF_MAX_PLACES 4

// `multipleOf` on an integer: a positive integer (2, or 2.0) into bounds->multiple_of. On a
// number: 1, 0.1, 0.01, 0.001 or 0.0001 (a price's cents, a percentage's tenths) into
// bounds->fraction_places; any other step on a number is refused (its multiples are not done).
static int read_multiple_of(Node *bounds, const json_t *schema, bool integer, const char *what, const char *at) {
    bounds->fraction_places = -1;
    const json_t *v = json_object_get(schema, "multipleOf");
    if (!v) return 0;
    if (!integer) {
        // 1, or a real whose shortest decimal is 0.0...01.
        Decimal step;
        if (json_is_number(v) && json_number_value(v) == 1) {
            bounds->fraction_places = 0;
            return 0;
        }
        if (json_is_real(v) && json_real_value(v) > 0 && json_real_value(v) < 1 &&
            decimal_from_fraction_double(json_real_value(v), &step) == 0) {
            const int places = (int)strlen(step.fraction);
            bool power_of_ten = places <= MULTIPLE_OF_MAX_PLACES && step.fraction[places - 1] == '1';
            for (int k = 0; k < places - 1; k++) power_of_ten &= step.fraction[k] == '0';
            if (power_of_ten) {
                bounds->fraction_places = places;
                return 0;
            }
        }
        return schema_error(what, at, "%s", "'multipleOf' on a number must be 1, 0.1, 0.01, 0.001 or 0.0001 "
                                            "(other steps are supported on integers only)");
    }
    const double two_63 = 9223372036854775808.0;
    if (json_is_integer(v) && json_integer_value(v) > 0) {
        bounds->multiple_of = (uint64_t)json_integer_value(v);
        return 0;
    }
    if (json_is_real(v) && json_real_value(v) >= 1 && json_real_value(v) < two_63 && json_real_value(v) == floor(json_real_value(v))) {
        bounds->multiple_of = (uint64_t)json_real_value(v);
        return 0;
    }
    return schema_error(what, at, "%s", "'multipleOf' on an integer must be a positive integer");
}

// An integer, or a number with bounds (without them: number_node). An integer with no
// bounds is held to 18 digits, as every JSON integer here; with a bound on one side, the
// other side is int64's limit.
static int compile_number(JsonConstraint *c, const json_t *schema, bool integer, const char *what, const char *at) {
    Node bounds = {.kind = integer ? K_INTEGER : K_NUMBER};
    if (read_bounds(&bounds, schema, integer, what, at) != 0) return -1;
    if (read_multiple_of(&bounds, schema, integer, what, at) != 0) return -1;
    if (!integer && !bounds.has_minimum && !bounds.has_maximum && bounds.fraction_places < 0) return number_node(c);
    if (!integer && bounds.fraction_places >= 0) {
        if (bounds.has_minimum) decimal_onto_grid(&bounds.minimum, &bounds.minimum_exclusive, true, bounds.fraction_places);
        if (bounds.has_maximum) decimal_onto_grid(&bounds.maximum, &bounds.maximum_exclusive, false, bounds.fraction_places);
    }
    if (integer && !bounds.has_minimum && !bounds.has_maximum) {
        bounds.minimum = decimal_from_int64(-INTEGER_DEFAULT_LIMIT), bounds.maximum = decimal_from_int64(INTEGER_DEFAULT_LIMIT);
    } else if (integer) {
        if (!bounds.has_minimum) bounds.minimum = decimal_from_int64(INT64_MIN);
        if (!bounds.has_maximum) bounds.maximum = decimal_from_int64(INT64_MAX);
    }
    if (integer) bounds.has_minimum = bounds.has_maximum = true;
    const int node = bounded_number_node(c, &bounds);
    if (node >= 0) return node;
    char given[300] = "";
    static const char *const names[] = {"minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum", "multipleOf"};
    for (int k = 0; k < 5; k++) {
        json_t *v = json_object_get(schema, names[k]);
        if (!v) continue;
        char *text = json_dumps(v, JSON_ENCODE_ANY);
        snprintf(given + strlen(given), sizeof given - strlen(given), "%s'%s': %.40s", given[0] ? ", " : "", names[k], text);
        free(text);
    }
    return schema_error(what, at, integer ? "the bounds (%s) leave no integer"
                                          : "the bounds (%s) leave no number of at most 18 integer digits", given);
}

static int compile_type(JsonConstraint *c, const json_t *schema, int type, const char *what, const char *at, int depth) {
    switch (type) {
    case T_OBJECT: return compile_object(c, schema, what, at, depth);
    case T_ARRAY: return compile_array(c, schema, what, at, depth);
    case T_STRING: {
        long long min_length = count_keyword(schema, "minLength", what, at), max_length = count_keyword(schema, "maxLength", what, at);
        if (min_length == -2 || max_length == -2) return -1;
        if (max_length >= 0 && min_length > max_length)
            return schema_error(what, at, "%s", "'minLength' is above 'maxLength'");
        json_t *pattern = json_object_get(schema, "pattern");
        const char *format = NULL;
        if (format_pattern(schema, &format, what, at) != 0) return -1;
        if (pattern && format) return schema_error(what, at, "%s", "'format' beside 'pattern' is not supported");
        if (!pattern && !format) return string_node(c, min_length < 0 ? 0 : (int)min_length, (int)max_length);
        if (pattern && !json_is_string(pattern)) return schema_error(what, at, "%s", "'pattern' must be a string");
        // JSON Schema's pattern: a match anywhere unless anchored, on the decoded content,
        // the length bounds folded into the automaton. A format is an anchored pattern.
        RegexOptions options = {.search = true, .json_string = true, .min_chars = min_length < 0 ? 0 : (int)min_length,
                                .max_chars = (int)max_length};
        char where[700];
        snprintf(where, sizeof where, "%s: '%s' (at %s)", what, pattern ? "pattern" : "format", at[0] ? at : "the schema's root");
        RegexConstraint *regex = NULL;
        const char *text = pattern ? json_string_value(pattern) : format;
        const size_t length = pattern ? json_string_length(pattern) : strlen(format);
        if (regex_constraint_compile(&regex, text, length, &options, where) != 0) return -1;
        const int node = string_node(c, 0, -1);
        c->nodes[node].regex = regex;
        return node;
    }
    case T_NUMBER: return compile_number(c, schema, false, what, at);
    case T_INTEGER: return compile_number(c, schema, true, what, at);
    case T_BOOLEAN: {
        char **texts = xmalloc(2 * sizeof(char *));
        size_t *lengths = xmalloc(2 * sizeof(size_t));
        texts[0] = xstrdup("true"), texts[1] = xstrdup("false");
        lengths[0] = 4, lengths[1] = 5;
        return literals_node(c, texts, lengths, 2);
    }
    default: return literal_node(c, "null");
    }
}

// An allOf member with its `$ref`s followed (beside a `$ref`, only annotations); NULL
// (error set) for a reference that names nothing or a chain of them that does not end.
static const json_t *follow_refs(const JsonConstraint *c, const json_t *member, const char *what, const char *at) {
    for (int hops = 0; hops < 32; hops++) {
        json_t *ref = json_is_object(member) ? json_object_get(member, "$ref") : NULL;
        if (!ref) return member;
        if (!json_is_string(ref)) {
            schema_error(what, at, "%s", "'$ref' must be a string");
            return NULL;
        }
        const char *key;
        json_t *value;
        json_object_foreach((json_t *)member, key, value) {
            if (strcmp(key, "$ref") != 0 && !in_list(key, annotations, sizeof annotations / sizeof annotations[0])) {
                schema_error(what, at, "'%.100s' beside '$ref' is not supported", key);
                return NULL;
            }
        }
        member = ref_target(c, json_string_value(ref), what, at);
        if (!member) return NULL;
    }
    schema_error(what, at, "%s", "'$ref' refers to itself through references only");
    return NULL;
}

// One allOf member (an object schema) into the merged one: its properties (a name given
// before must have the same schema), its required keys, its additionalProperties (absent or
// false closes the object; schemas must agree). -1: error set.
static int merge_member(const json_t *member, json_t *properties, json_t *required, bool *closed,
                        const json_t **additional, const char *what, const char *at) {
    const char *key;
    json_t *value;
    json_object_foreach((json_t *)member, key, value) {
        if (in_list(key, annotations, sizeof annotations / sizeof annotations[0])) continue;
        if (!strcmp(key, "type") && json_is_string(value) && !strcmp(json_string_value(value), "object")) continue;
        if (strcmp(key, "properties") != 0 && strcmp(key, "required") != 0 && strcmp(key, "additionalProperties") != 0)
            return schema_error(what, at, "'%.100s' in an 'allOf' of several schemas is not supported (only object schemas "
                                "merge: type object, properties, required, additionalProperties)", key);
    }
    json_t *member_properties = json_object_get(member, "properties"), *member_required = json_object_get(member, "required");
    json_t *member_additional = json_object_get(member, "additionalProperties");
    if (member_properties && !json_is_object(member_properties))
        return schema_error(what, at, "%s", "'properties' must be an object");
    if (member_required && !json_is_array(member_required))
        return schema_error(what, at, "%s", "'required' must be a list of strings");
    json_object_foreach(member_properties, key, value) {
        json_t *before = json_object_get(properties, key);
        if (before && !json_equal(before, value))
            return schema_error(what, at, "'allOf' gives the property '%.200s' two different schemas (not supported)", key);
        json_object_set(properties, key, value);
    }
    for (size_t i = 0; member_required && i < json_array_size(member_required); i++)
        json_array_append(required, json_array_get(member_required, i));
    if (!member_additional || json_is_false(member_additional)) {
        *closed = true;
    } else if (json_is_object(member_additional) && json_object_size(member_additional) > 0) {
        if (*additional && !json_equal(*additional, member_additional))
            return schema_error(what, at, "%s", "'allOf' gives two different 'additionalProperties' schemas (not supported)");
        *additional = member_additional;
    } else if (!json_is_true(member_additional) && !json_is_object(member_additional)) {
        return schema_error(what, at, "%s", "'additionalProperties' must be a boolean or a schema");
    }
    return 0;
}

// allOf: one schema is that schema (older pydantic's allOf: [{"$ref": ...}]); several
// must each be an object schema (a `$ref` to one followed; true or annotations only: no
// constraint), merged into one object schema: the union of the properties (one named in
// two members must have the same schema in both), the union of the required keys, and the
// stricter additionalProperties (false or absent, then a schema, then true).
static int compile_all_of(JsonConstraint *c, const json_t *all, const char *what, const char *at, int depth) {
    if (!json_is_array(all) || json_array_size(all) == 0)
        return schema_error(what, at, "%s", "'allOf' must be a non-empty list of schemas");
    if (json_array_size(all) == 1) return compile_child(c, json_array_get(all, 0), what, at, "allOf[0]", depth);
    json_t *properties = json_object(), *required = json_array();
    const json_t *additional = NULL;
    bool closed = false;
    int node = -1;
    size_t i;
    for (i = 0; i < json_array_size(all); i++) {
        char member_at[600];
        snprintf(member_at, sizeof member_at, "%.500s%sallOf[%zu]", at, at[0] ? "." : "", i);
        const json_t *member = follow_refs(c, json_array_get(all, i), what, member_at);
        if (!member) break;
        if (json_is_true(member)) continue;
        if (!json_is_object(member)) {
            schema_error(what, member_at, "%s", "an 'allOf' member must be an object schema");
            break;
        }
        if (merge_member(member, properties, required, &closed, &additional, what, member_at) != 0) break;
    }
    if (i == json_array_size(all)) {
        json_t *merged = json_pack("{s:s, s:O, s:O}", "type", "object", "properties", properties, "required", required);
        // The schemas are the members' own values (not copies): a `$ref`'s text stays valid
        // while the whole schema compiles (JsonConstraint.ref_texts).
        if (closed) json_object_set_new(merged, "additionalProperties", json_false());
        else if (additional) json_object_set(merged, "additionalProperties", (json_t *)additional);
        else json_object_set_new(merged, "additionalProperties", json_true());
        char merged_at[600];
        snprintf(merged_at, sizeof merged_at, "%.500s%sallOf", at, at[0] ? "." : "");
        node = compile(c, merged, what, merged_at, depth + 1);
        json_decref(merged);
    }
    json_decref(properties), json_decref(required);
    return node;
}

static int compile(JsonConstraint *c, const json_t *schema, const char *what, const char *at, int depth) {
    if (depth > JSON_MAX_DEPTH - 2)
        return schema_error(what, at, "the schema nests more than %s levels", "30");
    if (json_is_true(schema)) return any_node(c);
    if (json_is_false(schema)) return schema_error(what, at, "%s", "the schema false matches nothing");
    if (!json_is_object(schema)) return schema_error(what, at, "%s", "a schema must be an object or a boolean");
    const char *key;
    json_t *value;
    int constraining = 0;
    json_object_foreach((json_t *)schema, key, value) {
        if (in_list(key, annotations, sizeof annotations / sizeof annotations[0])) continue;
        if (!in_list(key, keywords, sizeof keywords / sizeof keywords[0]))
            return schema_error(what, at, "'%.100s' is not supported", key);
        constraining++;
    }
    if (constraining == 0) return any_node(c);
    const char *format = NULL; // only date, time, date-time, uuid, whatever the type
    if (format_pattern(schema, &format, what, at) != 0) return -1;
    json_t *all = json_object_get(schema, "allOf");
    if (all) {
        if (constraining > 1) return schema_error(what, at, "%s", "'allOf' beside other keywords is not supported");
        return compile_all_of(c, all, what, at, depth);
    }
    json_t *ref = json_object_get(schema, "$ref");
    json_t *alternatives = json_object_get(schema, "anyOf");
    const char *alt_key = "anyOf";
    if (!alternatives) alternatives = json_object_get(schema, "oneOf"), alt_key = "oneOf";
    if (ref || alternatives) {
        if (constraining > 1)
            return schema_error(what, at, "%s", "'$ref', 'anyOf' and 'oneOf' beside other keywords are not supported");
        if (ref) {
            if (!json_is_string(ref)) return schema_error(what, at, "%s", "'$ref' must be a string");
            return compile_ref(c, json_string_value(ref), what, at, depth);
        }
        if (!json_is_array(alternatives) || json_array_size(alternatives) == 0)
            return schema_error(what, at, "'%s' must be a non-empty list of schemas", alt_key);
        const size_t n = json_array_size(alternatives);
        int *children = xmalloc(n * sizeof(int));
        for (size_t i = 0; i < n; i++) {
            char child_at[64];
            snprintf(child_at, sizeof child_at, "%s[%zu]", alt_key, i);
            children[i] = compile_child(c, json_array_get(alternatives, i), what, at, child_at, depth);
            if (children[i] < 0) {
                free(children);
                return -1;
            }
        }
        const int node = new_node(c, K_ALT);
        for (size_t i = 0; i < n; i++) add_child(c, node, children[i]);
        free(children);
        derive_first(c, node);
        return node;
    }
    // type: a name or a list of names (absent: from the keywords present, else any).
    json_t *type = json_object_get(schema, "type");
    int types = 0;
    if (json_is_string(type)) {
        types = type_bit(json_string_value(type));
        if (!types) return schema_error(what, at, "'type' '%.100s' is not a JSON Schema type", json_string_value(type));
    } else if (json_is_array(type)) {
        for (size_t i = 0; i < json_array_size(type); i++) {
            json_t *name = json_array_get(type, i);
            int bit = json_is_string(name) ? type_bit(json_string_value(name)) : 0;
            if (!bit) return schema_error(what, at, "%s", "'type' lists something that is not a JSON Schema type");
            types |= bit;
        }
        if (!types) return schema_error(what, at, "%s", "'type' is an empty list: nothing matches");
    } else if (type) {
        return schema_error(what, at, "%s", "'type' must be a string or a list of strings");
    }
    if (json_object_get(schema, "enum") || json_object_get(schema, "const")) {
        json_object_foreach((json_t *)schema, key, value) {
            if (!in_list(key, annotations, sizeof annotations / sizeof annotations[0]) && strcmp(key, "type") != 0 &&
                strcmp(key, "enum") != 0 && strcmp(key, "const") != 0)
                return schema_error(what, at, "'%.100s' beside 'enum' / 'const' is not supported", key);
        }
        return compile_literals(c, schema, types, what, at);
    }
    if (!types) {
        if (json_object_get(schema, "properties") || json_object_get(schema, "required") ||
            json_object_get(schema, "additionalProperties"))
            types |= T_OBJECT;
        if (json_object_get(schema, "items") || json_object_get(schema, "minItems") || json_object_get(schema, "maxItems") ||
            json_object_get(schema, "prefixItems"))
            types |= T_ARRAY;
        if (json_object_get(schema, "minLength") || json_object_get(schema, "maxLength") || json_object_get(schema, "pattern") ||
            json_object_get(schema, "format"))
            types |= T_STRING;
        if (json_object_get(schema, "minimum") || json_object_get(schema, "maximum") ||
            json_object_get(schema, "exclusiveMinimum") || json_object_get(schema, "exclusiveMaximum") ||
            json_object_get(schema, "multipleOf"))
            types |= T_NUMBER;
    }
    // integer beside number: number covers it.
    if ((types & T_NUMBER) && (types & T_INTEGER)) types &= ~T_INTEGER;
    int children[7], count = 0;
    for (int bit = 1; bit <= T_NULL; bit <<= 1) {
        if (!(types & bit)) continue;
        children[count] = compile_type(c, schema, bit, what, at, depth);
        if (children[count] < 0) return -1;
        count++;
    }
    if (count == 1) return children[0];
    const int node = new_node(c, K_ALT);
    for (int i = 0; i < count; i++) add_child(c, node, children[i]);
    derive_first(c, node);
    return node;
}

// --- the graph's properties --------------------------------------------------------------

// The nodes whose values can begin without a byte of their own (ALT's children) must not
// form a cycle (a definition that is one of its own alternatives, "left recursion"), or
// starting a value would never end. Depth-first over those edges; state 1: on the stack.
// Returns a node on a cycle, *named a reference on it (met first as the search unwinds from
// the cycle's end to its start).
static int find_alt_cycle(const JsonConstraint *c, int node, uint8_t *state, int *named) {
    if (state[node] == 2 || c->nodes[node].kind != K_ALT) return -1;
    if (state[node] == 1) return node;
    state[node] = 1;
    for (int k = 0; k < c->nodes[node].num_children; k++) {
        const int cycle = find_alt_cycle(c, c->nodes[node].children[k], state, named);
        if (cycle < 0) continue;
        if (*named < 0 && (c->nodes[node].definition || node == cycle)) *named = node;
        return cycle;
    }
    state[node] = 2;
    return -1;
}

static int depth_plus_one(int depth) { return depth >= DEPTH_INFINITE ? DEPTH_INFINITE : depth + 1; }

// The array's k-th item's node (k counts from 0).
static int array_item(const Node *n, int k) { return k < n->num_children ? n->children[k] : n->item; }

// A node's least depth from its children's current values (see Node.min_depth).
static int node_min_depth(const JsonConstraint *c, const Node *n) {
    int depth = 0;
    switch (n->kind) {
    case K_ALT:
        depth = DEPTH_INFINITE;
        for (int k = 0; k < n->num_children; k++)
            if (c->nodes[n->children[k]].min_depth < depth) depth = c->nodes[n->children[k]].min_depth;
        return depth;
    case K_OBJECT: // the required properties' values (the key's frame is no deeper)
        for (int k = 0; k < n->num_props; k++)
            if (((n->required >> k) & 1) && c->nodes[n->prop_nodes[k]].min_depth > depth)
                depth = c->nodes[n->prop_nodes[k]].min_depth;
        return depth_plus_one(depth);
    case K_ARRAY: { // the first minItems items
        const int tuple = n->min_count < n->num_children ? n->min_count : n->num_children;
        for (int k = 0; k < tuple; k++)
            if (c->nodes[n->children[k]].min_depth > depth) depth = c->nodes[n->children[k]].min_depth;
        if (n->min_count > n->num_children && c->nodes[n->item].min_depth > depth) depth = c->nodes[n->item].min_depth;
        return depth_plus_one(depth);
    }
    case K_ROOT:
    case K_SEQ:
    case K_REPEAT: // all the children (REPEAT: at least one item)
        for (int k = 0; k < n->num_children; k++)
            if (c->nodes[n->children[k]].min_depth > depth) depth = c->nodes[n->children[k]].min_depth;
        return depth_plus_one(depth);
    default: return 1; // scalars and literals: one frame
    }
}

// After the whole graph is built: the first bytes through references (a reference's node
// was made before its target had them), the least depths, and the checks that keep every
// started text completable: no left recursion, every definition has a finite value, the
// root's values fit in JSON_MAX_DEPTH.
static int finish_graph(JsonConstraint *c) {
    uint8_t *state = xcalloc((size_t)c->num_nodes, 1);
    int cycle = -1, named = -1;
    for (int i = 0; i < c->num_nodes && cycle < 0; i++) cycle = find_alt_cycle(c, i, state, &named);
    free(state);
    if (cycle >= 0) // only references make cycles: one is named
        return err_set("%s: '$ref' '%.200s' is one of its own alternatives (left recursion, not supported)",
                       c->nodes[named].origin ? c->nodes[named].origin : "schema",
                       c->nodes[named].definition ? c->nodes[named].definition : "#");
    // The first bytes grow until nothing changes (a fixed point: the graph may have cycles).
    for (bool changed = true; changed;) {
        changed = false;
        for (int i = 0; i < c->num_nodes; i++) {
            Node *n = &c->nodes[i];
            if (n->kind != K_ALT && n->kind != K_SEQ && n->kind != K_REPEAT && n->kind != K_ROOT) continue;
            bool before[256];
            memcpy(before, n->first, sizeof before);
            derive_first(c, i);
            changed |= memcmp(before, n->first, sizeof before) != 0;
        }
    }
    // The least depths shrink from "infinite" until nothing changes: a node's value is finite
    // once its children's are (the least fixed point of node_min_depth).
    for (int i = 0; i < c->num_nodes; i++) c->nodes[i].min_depth = DEPTH_INFINITE;
    for (bool changed = true; changed;) {
        changed = false;
        for (int i = 0; i < c->num_nodes; i++) {
            const int depth = node_min_depth(c, &c->nodes[i]);
            if (depth < c->nodes[i].min_depth) c->nodes[i].min_depth = depth, changed = true;
        }
    }
    // Named: a definition with no finite value, the root (`#`) only when no other is one.
    int infinite = -1;
    for (int i = 0; i < c->num_nodes; i++)
        if (c->nodes[i].definition && c->nodes[i].min_depth >= DEPTH_INFINITE &&
            (infinite < 0 || !strcmp(c->nodes[infinite].definition, "#")))
            infinite = i;
    if (infinite >= 0)
            return err_set("%s: '$ref' '%.200s' has no finite value (each of its values must contain another: a "
                           "required property or item refers back to it with no alternative)",
                           c->nodes[infinite].origin, c->nodes[infinite].definition);
    // The root's frame and JSON_MAX_DEPTH values.
    if (c->nodes[c->root].min_depth > JSON_MAX_DEPTH + 1)
        return err_set("%s: every value of the schema nests more than %d levels", c->nodes[c->root].origin, JSON_MAX_DEPTH);
    return 0;
}

int json_constraint_schema(JsonConstraint **out, const json_t *schema, const char *what) {
    *out = NULL;
    JsonConstraint *c = constraint_new();
    c->schema_root = schema;
    int node = compile_ref(c, "#", what, "", 0);
    if (node < 0) {
        json_constraint_free(c);
        return -1;
    }
    c->schema_root = NULL;
    c->num_refs = 0;
    root_node(c, node);
    c->nodes[c->root].origin = xstrdup(what);
    if (finish_graph(c) != 0) {
        json_constraint_free(c);
        return -1;
    }
    *out = c;
    return 0;
}
int json_constraint_tool_calls(JsonConstraint **out, const json_t *tools, const char *only, const char *open,
                               const char *close, const char *separator, const char *arguments_key, int max_calls) {
    *out = NULL;
    JsonConstraint *c = constraint_new();
    const int calls = new_node(c, K_ALT);
    for (size_t i = 0; i < json_array_size(tools); i++) {
        json_t *function = json_object_get(json_array_get(tools, i), "function");
        const char *name = json_string_value(json_object_get(function, "name"));
        if (!name || (only && strcmp(name, only) != 0)) continue;
        json_t *parameters = json_object_get(function, "parameters");
        char what[96];
        snprintf(what, sizeof what, "tools[%zu].function.parameters", i);
        c->schema_root = parameters;
        c->num_refs = 0; // each tool's references are to its own definitions
        int arguments = parameters ? compile_ref(c, "#", what, "", 1) : object_node(c, any_node(c));
        if (arguments < 0) {
            json_constraint_free(c);
            return -1;
        }
        json_t *name_value = json_string(name);
        char *name_text = json_dumps(name_value, JSON_ENCODE_ANY);
        json_decref(name_value);
        const int name_node = literal_node(c, name_text);
        free(name_text);
        const int call = object_node(c, -1);
        add_property(c, call, "name", name_node, true);
        add_property(c, call, arguments_key, arguments, true);
        add_child(c, calls, call);
    }
    CHECK(c->nodes[calls].num_children > 0, "no tool to call (the caller checks the name)");
    derive_first(c, calls);
    int item = calls;
    if (open[0] || close[0]) {
        item = new_node(c, K_SEQ);
        if (open[0]) add_child(c, item, literal_node(c, open));
        add_child(c, item, calls);
        if (close[0]) add_child(c, item, literal_node(c, close));
        derive_first(c, item);
    }
    const int repeat = new_node(c, K_REPEAT);
    add_child(c, repeat, item);
    c->nodes[repeat].separator = xstrdup(separator);
    c->nodes[repeat].separator_length = strlen(separator);
    c->nodes[repeat].min_count = 1;
    c->nodes[repeat].max_count = max_calls > 0 ? max_calls : -1;
    CHECK(separator[0], "tool calls need a separator");
    derive_first(c, repeat);
    c->schema_root = NULL;
    c->num_refs = 0;
    root_node(c, repeat);
    c->nodes[c->root].origin = xstrdup("tools");
    if (finish_graph(c) != 0) {
        json_constraint_free(c);
        return -1;
    }
    *out = c;
    return 0;
}

// --- recognising ------------------------------------------------------------------------

static void path_copy(JsonPath *dst, const JsonPath *src) {
    dst->depth = src->depth;
    memcpy(dst->frames, src->frames, (size_t)src->depth * sizeof(JsonFrame));
}

void json_state_copy(JsonState *dst, const JsonState *src) {
    dst->num_paths = src->num_paths;
    for (int i = 0; i < src->num_paths; i++) path_copy(&dst->paths[i], &src->paths[i]);
}

// Appends `size` bytes of `value` to the key.
static size_t key_put(uint8_t *key, size_t at, const void *value, size_t size) {
    memcpy(key + at, value, size);
    return at + size;
}

// How the integer part's digits so far (`digits` of them, value `part`) compare with the
// first as many digits of the bound `bound` (-1, 0, 1; 1 when it has fewer digits).
static int prefix_compare(uint64_t part, int digits, uint64_t bound) {
    const int bound_digits = decimal_digits(bound);
    if (digits > bound_digits) return 1;
    uint64_t head = bound;
    for (int k = digits; k < bound_digits; k++) head /= 10;
    return part < head ? -1 : part > head ? 1 : 0;
}

// A bounded number's integer part as the key sees it: what decides the rest of the text is
// not its value but how it compares with the bounds' leading digits (a digit-by-digit
// comparison), so numbers that compare alike share a key (and a cached mask).
static uint64_t bounded_number_class(const Node *n, const JsonFrame *f) {
    const bool negative = f->b & NUMBER_NEGATIVE;
    const Magnitudes m = sign_magnitudes(n, negative);
    if (f->phase == NUM_SIGN || m.empty) return 0;
    const int integer_digits = decimal_digits(f->a); // no leading zero: its value says how many digits
    const int low = prefix_compare(f->a, integer_digits, m.low.integer) + 1;
    const int high = m.has_high ? prefix_compare(f->a, integer_digits, m.high.integer) + 1 : 3;
    return (uint64_t)(integer_digits * 16 + low * 4 + high);
}

size_t json_state_key(const JsonConstraint *c, const JsonState *state, uint8_t *key) {
    size_t n = key_put(key, 0, &state->num_paths, sizeof state->num_paths);
    for (int p = 0; p < state->num_paths; p++) {
        const JsonPath *path = &state->paths[p];
        n = key_put(key, n, &path->depth, sizeof path->depth);
        for (int d = 0; d < path->depth; d++) { // field by field: a frame has padding
            const JsonFrame *f = &path->frames[d];
            const Node *node = &c->nodes[f->node];
            // A string's count is only compared with its bounds (feed_path's K_STRING).
            int32_t count = f->count;
            if (node->kind == K_STRING && node->max_count < 0 && count > node->min_count) count = node->min_count;
            // (Under multipleOf the integer part's value itself: its remainder decides too.)
            const uint64_t a = node->bounded && node->multiple_of <= 1 ? bounded_number_class(node, f) : f->a;
            n = key_put(key, n, &f->node, sizeof f->node);
            n = key_put(key, n, &f->phase, sizeof f->phase);
            n = key_put(key, n, &f->aux, sizeof f->aux);
            n = key_put(key, n, &count, sizeof count);
            n = key_put(key, n, &f->str, sizeof f->str);
            n = key_put(key, n, &a, sizeof a);
            n = key_put(key, n, &f->b, sizeof f->b);
        }
    }
    return n;
}

void json_state_init(const JsonConstraint *c, JsonState *state) {
    state->num_paths = 1;
    state->paths[0].depth = 1;
    state->paths[0].frames[0] = (JsonFrame){.node = c->root, .phase = ROOT_START};
}

// Adds a path to the state (unless an equal one is there, or the state is full).
static void emit(JsonState *out, const JsonPath *p) {
    for (int i = 0; i < out->num_paths; i++)
        if (out->paths[i].depth == p->depth && !memcmp(out->paths[i].frames, p->frames, (size_t)p->depth * sizeof(JsonFrame)))
            return;
    if (out->num_paths == JSON_MAX_PATHS) return;
    path_copy(&out->paths[out->num_paths++], p);
}

static JsonFrame *top(JsonPath *p) { return &p->frames[p->depth - 1]; }

// The frame on top finished its value and was popped: the frame below takes note.
static void child_done(const JsonConstraint *c, JsonPath *p) {
    for (;;) {
        JsonFrame *f = top(p);
        const Node *n = &c->nodes[f->node];
        switch (n->kind) {
        case K_ROOT: f->phase = ROOT_DONE; return;
        case K_OBJECT: f->phase = O_AFTER_VALUE; return;
        case K_ARRAY: f->count++, f->phase = A_AFTER_VALUE; return;
        case K_REPEAT: f->count++, f->phase = R_AFTER_ITEM, f->aux = 0; return;
        case K_SEQ:
            if (++f->count < n->num_children) return;
            p->depth--; // the sequence is complete too
            continue;
        default: CHECK(false, "a value inside a scalar");
        }
    }
}

static void start_value(const JsonConstraint *c, JsonPath *p, int node, uint8_t byte, JsonState *out);

// A value of `node` opened on top of `frames` frames can be completed within the root's
// frame and JSON_MAX_DEPTH values.
static bool fits(const JsonConstraint *c, int frames, int node) { return frames + c->nodes[node].min_depth <= JSON_MAX_DEPTH + 1; }

static bool push(JsonPath *p, JsonFrame frame) {
    if (p->depth >= JSON_MAX_DEPTH + 1) return false; // the root frame and JSON_MAX_DEPTH values
    p->frames[p->depth++] = frame;
    return true;
}

// A value of `node` starts with `byte` on path p (modified; forks copy it).
static void start_value(const JsonConstraint *c, JsonPath *p, int node, uint8_t byte, JsonState *out) {
    const Node *n = &c->nodes[node];
    if (!n->first[byte] || !fits(c, p->depth, node)) return; // an alternative too deep for what is left is not taken
    switch (n->kind) {
    case K_ALT: {
        int last = -1;
        for (int k = 0; k < n->num_children; k++)
            if (c->nodes[n->children[k]].first[byte]) last = k;
        for (int k = 0; k < n->num_children; k++) {
            if (!c->nodes[n->children[k]].first[byte]) continue;
            if (k == last) {
                start_value(c, p, n->children[k], byte, out);
            } else {
                JsonPath fork;
                path_copy(&fork, p);
                start_value(c, &fork, n->children[k], byte, out);
            }
        }
        return;
    }
    case K_SEQ:
    case K_REPEAT:
        if (!push(p, (JsonFrame){.node = node, .phase = R_ITEM})) return;
        start_value(c, p, n->children[0], byte, out);
        return;
    case K_OBJECT:
        if (push(p, (JsonFrame){.node = node, .phase = O_OPEN})) emit(out, p);
        return;
    case K_ARRAY:
        if (push(p, (JsonFrame){.node = node, .phase = A_OPEN})) emit(out, p);
        return;
    case K_STRING: // a pattern's automaton state in a
        if (push(p, (JsonFrame){.node = node, .a = n->regex ? (uint64_t)regex_state_start(n->regex) : 0})) emit(out, p);
        return;
    case K_NUMBER:
    case K_INTEGER: {
        JsonFrame frame;
        if (n->bounded) { // first[] said it can start
            CHECK(bounded_number_start(n, node, byte, &frame), "a bounded number's first byte");
        } else {
            const int phase = byte == '-' ? NUM_SIGN : byte == '0' ? NUM_ZERO : NUM_INT;
            frame = (JsonFrame){.node = node, .phase = (int16_t)phase, .count = 1, .aux = byte != '-'};
        }
        if (push(p, frame)) emit(out, p);
        return;
    }
    case K_LITERALS: {
        uint64_t alive = 0;
        for (int k = 0; k < n->num_literals; k++)
            if ((uint8_t)n->literals[k][0] == byte) alive |= (uint64_t)1 << k;
        if (push(p, (JsonFrame){.node = node, .count = 1, .a = alive})) emit(out, p);
        return;
    }
    case K_ROOT: CHECK(false, "the root inside a value");
    }
}

// String contents, one byte: aux is 0 (plain), 1 (after '\'), 2..5 (expecting the k-1'th
// hex digit of \u, its value so far in str's high half); str's low byte the UTF-8
// continuation bytes still due, its second byte the allowed range of the next one.
// Returns 1 (taken), 2 (the closing quote), 0 (refused). *starts_char: a character began.
enum { RANGE_ANY, RANGE_A0, RANGE_9F, RANGE_90, RANGE_8F };
static int string_byte(JsonFrame *f, uint8_t b, bool *starts_char) {
    *starts_char = false;
    int pending = f->str & 0xff, range = (f->str >> 8) & 0xff;
    if (pending > 0) {
        uint8_t low = 0x80, high = 0xbf;
        if (range == RANGE_A0) low = 0xa0;
        else if (range == RANGE_9F) high = 0x9f;
        else if (range == RANGE_90) low = 0x90;
        else if (range == RANGE_8F) high = 0x8f;
        if (b < low || b > high) return 0;
        f->str = pending - 1; // the range applies to the first continuation byte only
        return 1;
    }
    if (f->aux == 1) {
        if (b == 'u') {
            f->aux = 2;
            f->str = 0;
            return 1;
        }
        if (!strchr("\"\\/bfnrt", b) || b == 0) return 0;
        f->aux = 0;
        return 1;
    }
    if (f->aux >= 2) {
        int digit = b >= '0' && b <= '9' ? b - '0' : b >= 'a' && b <= 'f' ? b - 'a' + 10 : b >= 'A' && b <= 'F' ? b - 'A' + 10 : -1;
        if (digit < 0) return 0;
        unsigned value = ((unsigned)f->str >> 16) * 16 + (unsigned)digit;
        // \u0000 and the surrogates are refused as soon as their digits say so.
        const int k = f->aux - 1; // digits now read
        if (k == 2 && value >= 0xd8 && value <= 0xdf) return 0;
        if (k == 4 && value == 0) return 0;
        f->str = (int32_t)(value << 16);
        f->aux = k == 4 ? 0 : (int16_t)(f->aux + 1);
        if (k == 4) f->str = 0;
        return 1;
    }
    if (b == '"') return 2;
    if (b < 0x20) return 0;
    *starts_char = true;
    if (b == '\\') {
        f->aux = 1;
        return 1;
    }
    if (b < 0x80) return 1;
    if (b >= 0xc2 && b <= 0xdf) f->str = 1;
    else if (b == 0xe0) f->str = 2 | RANGE_A0 << 8;
    else if (b == 0xed) f->str = 2 | RANGE_9F << 8;
    else if (b >= 0xe1 && b <= 0xef) f->str = 2;
    else if (b == 0xf0) f->str = 3 | RANGE_90 << 8;
    else if (b >= 0xf1 && b <= 0xf3) f->str = 3;
    else if (b == 0xf4) f->str = 3 | RANGE_8F << 8;
    else return 0;
    return 1;
}

// A string with a pattern: its decoded content goes through the pattern's automaton (state
// in f->a). Plain bytes go as they are; an escape's character when its letter comes (a
// backslash only where some escape keeps the content alive); \uXXXX is refused (write the
// character itself; the control characters it alone can write are outside the automaton's
// alphabet, so nothing the pattern allows needs it).
static const char short_escapes[] = "\"\\/bfnrt", short_escape_bytes[] = "\"\\/\b\f\n\r\t";
static bool pattern_byte(const RegexConstraint *regex, JsonFrame *f, uint8_t byte, int16_t escape) {
    const int32_t state = (int32_t)f->a;
    if (escape == 0 && byte == '\\') {
        for (int k = 0; k < 8; k++)
            if (regex_state_feed(regex, state, (uint8_t)short_escape_bytes[k]) >= 0) return true;
        return false;
    }
    if (escape == 1) {
        const char *letter = byte ? strchr(short_escapes, byte) : NULL;
        if (!letter) return false;
        byte = (uint8_t)short_escape_bytes[letter - short_escapes];
    }
    const int32_t next = regex_state_feed(regex, state, byte);
    if (next < 0) return false;
    f->a = (uint64_t)next;
    return true;
}

static bool number_can_end(const Node *n, const JsonFrame *f) {
    if (n->bounded) return bounded_can_end(n, f);
    return f->phase == NUM_ZERO || f->phase == NUM_INT || f->phase == NUM_FRAC || f->phase == NUM_EXP;
}

// A number with no bounds, one byte.
static bool number_byte(JsonFrame *f, uint8_t b) {
    const bool digit = b >= '0' && b <= '9';
    if (f->count >= JSON_MAX_NUMBER_BYTES) return false;
    int next = -1;
    // aux counts the digits of the integer part, then of the exponent: at most
    // JSON_MAX_INTEGER_DIGITS and 2, so that every number fits an int64 or a finite double.
    switch (f->phase) {
    case NUM_SIGN: next = b == '0' ? NUM_ZERO : digit ? NUM_INT : -1; break;
    case NUM_ZERO:
    case NUM_INT:
        if (digit && f->phase == NUM_INT && f->aux < JSON_MAX_INTEGER_DIGITS) next = NUM_INT;
        else if (b == '.') next = NUM_FRAC0;
        else if (b == 'e' || b == 'E') next = NUM_EXP0;
        break;
    case NUM_FRAC0: next = digit ? NUM_FRAC : -1; break;
    case NUM_FRAC: next = digit ? NUM_FRAC : (b == 'e' || b == 'E') ? NUM_EXP0 : -1; break;
    case NUM_EXP0: next = digit ? NUM_EXP : (b == '+' || b == '-') ? NUM_EXP_SIGN : -1; break;
    case NUM_EXP_SIGN:
    case NUM_EXP: next = digit && !(f->phase == NUM_EXP && f->aux >= 2) ? NUM_EXP : -1; break;
    }
    if (next < 0) return false;
    if (next == NUM_EXP0) f->aux = 0;
    else if (digit && (next == NUM_INT || next == NUM_ZERO || next == NUM_EXP)) f->aux++;
    f->phase = (int16_t)next;
    f->count++;
    return true;
}

static bool literals_can_end(const Node *n, const JsonFrame *f) {
    for (int k = 0; k < n->num_literals; k++)
        if (((f->a >> k) & 1) && n->literal_lengths[k] == (size_t)f->count) return true;
    return false;
}

// The properties an object (node n, frame f, on top of `frames` frames counting its own)
// may still take: not given yet, their values fit in the depth left; and whether other keys
// may come (their schema fits).
static uint64_t all_props(const Node *n) { return n->num_props == 64 ? ~(uint64_t)0 : (((uint64_t)1 << n->num_props) - 1); }
static uint64_t usable_props(const JsonConstraint *c, const Node *n, const JsonFrame *f, int frames) {
    uint64_t usable = 0;
    for (int k = 0; k < n->num_props; k++)
        if (!((f->a >> k) & 1) && fits(c, frames, n->prop_nodes[k])) usable |= (uint64_t)1 << k;
    return usable;
}
static bool extra_fits(const JsonConstraint *c, const Node *n, int frames) { return n->extra >= 0 && fits(c, frames, n->extra); }
static bool object_more_keys(const JsonConstraint *c, const Node *n, const JsonFrame *f, int frames) {
    return extra_fits(c, n, frames) || usable_props(c, n, f, frames) != 0;
}
static bool object_can_close(const Node *n, const JsonFrame *f) { return (n->required & ~f->a) == 0; }

// A key of the object on top of p starts (its opening quote): a key frame goes on top, its
// b the properties whose names begin with the key so far.
static void start_key(const JsonConstraint *c, const Node *n, JsonPath *p, int node, JsonState *out) {
    if (!object_more_keys(c, n, top(p), p->depth)) return;
    if (push(p, (JsonFrame){.node = node, .phase = O_KEY, .b = all_props(n)})) emit(out, p);
}

static void key_byte(const JsonConstraint *c, JsonPath *p, uint8_t byte, JsonState *out) {
    JsonFrame *f = top(p);
    const Node *n = &c->nodes[f->node];
    JsonFrame *object = &p->frames[p->depth - 2];
    const int frames = p->depth - 1; // the object's value goes where the key is
    const uint64_t usable = usable_props(c, n, object, frames);
    const bool extra = extra_fits(c, n, frames);
    bool starts_char;
    const int r = string_byte(f, byte, &starts_char);
    if (r == 0) return;
    if (r == 2) {
        int exact = -1;
        for (int k = 0; k < n->num_props; k++)
            if (((f->b >> k) & 1) && n->name_lengths[k] == (size_t)f->count) exact = k;
        int value;
        if (exact >= 0) { // a property's name is that property, even where other keys may come
            if (!((usable >> exact) & 1)) return; // given already, or its value has no room
            object->a |= (uint64_t)1 << exact;
            value = n->prop_nodes[exact];
        } else if (extra) {
            value = n->extra;
        } else {
            return;
        }
        p->depth--;
        object->phase = O_COLON;
        object->count = value;
        emit(out, p);
        return;
    }
    uint64_t candidates = 0;
    for (int k = 0; k < n->num_props; k++)
        if (((f->b >> k) & 1) && (size_t)f->count < n->name_lengths[k] && (uint8_t)n->names[k][f->count] == byte)
            candidates |= (uint64_t)1 << k;
    if (!(candidates & usable) && !extra) return;
    f->b = candidates;
    f->count++;
    emit(out, p);
}

// One byte on one path (p is the caller's copy, modified); what survives goes to out.
static void feed_path(const JsonConstraint *c, JsonPath *p, uint8_t byte, JsonState *out) {
    for (;;) {
        JsonFrame *f = top(p);
        const Node *n = &c->nodes[f->node];
        switch (n->kind) {
        case K_ROOT:
            if (f->phase == ROOT_START) start_value(c, p, n->children[0], byte, out);
            return;
        case K_OBJECT:
            switch (f->phase) {
            case O_KEY: key_byte(c, p, byte, out); return;
            case O_OPEN:
                if (byte == '"') start_key(c, n, p, f->node, out);
                else if (byte == '}' && object_can_close(n, f)) p->depth--, child_done(c, p), emit(out, p);
                return;
            case O_COMMA_SPACE:
                if (byte == ' ') f->phase = O_KEY_START, emit(out, p);
                else if (byte == '"') start_key(c, n, p, f->node, out);
                return;
            case O_KEY_START:
                if (byte == '"') start_key(c, n, p, f->node, out);
                return;
            case O_COLON:
                if (byte == ':') f->phase = O_VALUE_SPACE, emit(out, p);
                return;
            case O_VALUE_SPACE:
                if (byte == ' ') {
                    f->phase = O_VALUE, emit(out, p);
                    return;
                }
                start_value(c, p, f->count, byte, out);
                return;
            case O_VALUE: start_value(c, p, f->count, byte, out); return;
            case O_AFTER_VALUE:
                if (byte == ',' && object_more_keys(c, n, f, p->depth)) f->phase = O_COMMA_SPACE, emit(out, p);
                else if (byte == '}' && object_can_close(n, f)) p->depth--, child_done(c, p), emit(out, p);
                return;
            }
            return;
        case K_ARRAY:
            switch (f->phase) {
            case A_OPEN:
                if (byte == ']') {
                    if (n->min_count == 0) p->depth--, child_done(c, p), emit(out, p);
                    return;
                }
                if (n->max_count != 0) start_value(c, p, array_item(n, 0), byte, out);
                return;
            case A_AFTER_VALUE: // another item only where it fits (those before minItems do)
                if (byte == ',' && (n->max_count < 0 || f->count < n->max_count) && fits(c, p->depth, array_item(n, f->count)))
                    f->phase = A_COMMA_SPACE, emit(out, p);
                else if (byte == ']' && f->count >= n->min_count) p->depth--, child_done(c, p), emit(out, p);
                return;
            case A_COMMA_SPACE:
                if (byte == ' ') {
                    f->phase = A_VALUE, emit(out, p);
                    return;
                }
                start_value(c, p, array_item(n, f->count), byte, out);
                return;
            case A_VALUE: start_value(c, p, array_item(n, f->count), byte, out); return;
            }
            return;
        case K_STRING: {
            bool starts_char;
            const int16_t escape = f->aux; // 1: this byte follows a backslash
            const int r = string_byte(f, byte, &starts_char);
            if (r == 0) return;
            if (r == 2) {
                if (f->count < n->min_count) return;
                if (n->regex && !regex_state_accepts(n->regex, (int32_t)f->a)) return;
                p->depth--, child_done(c, p), emit(out, p);
                return;
            }
            if (n->regex && !pattern_byte(n->regex, f, byte, escape)) return;
            if (starts_char) {
                if (n->max_count >= 0 && f->count >= n->max_count) return;
                f->count++;
            }
            emit(out, p);
            return;
        }
        case K_NUMBER:
        case K_INTEGER:
            if (n->bounded ? bounded_number_byte(n, f, byte) : number_byte(f, byte)) {
                emit(out, p);
                return;
            }
            if (!number_can_end(n, f)) return;
            p->depth--, child_done(c, p);
            continue;
        case K_LITERALS: {
            uint64_t alive = 0;
            for (int k = 0; k < n->num_literals; k++)
                if (((f->a >> k) & 1) && (size_t)f->count < n->literal_lengths[k] && (uint8_t)n->literals[k][f->count] == byte)
                    alive |= (uint64_t)1 << k;
            if (alive) {
                f->a = alive, f->count++;
                emit(out, p);
                return;
            }
            if (!literals_can_end(n, f)) return;
            p->depth--, child_done(c, p);
            continue;
        }
        case K_SEQ: start_value(c, p, n->children[f->count], byte, out); return;
        case K_REPEAT:
            if (f->phase == R_ITEM) {
                start_value(c, p, n->children[0], byte, out);
                return;
            }
            if (f->phase == R_SEPARATOR) {
                if ((uint8_t)n->separator[f->aux] != byte) return;
                if (++f->aux == (int)n->separator_length) f->phase = R_ITEM;
                emit(out, p);
                return;
            }
            if ((n->max_count < 0 || f->count < n->max_count) && (uint8_t)n->separator[0] == byte) {
                f->aux = 1;
                f->phase = n->separator_length == 1 ? R_ITEM : R_SEPARATOR;
                emit(out, p);
                return;
            }
            if (f->count < n->min_count) return;
            p->depth--, child_done(c, p);
            continue;
        case K_ALT: CHECK(false, "an alternative as a frame");
        }
    }
}

bool json_state_feed(const JsonConstraint *c, const JsonState *state, uint8_t byte, JsonState *out) {
    if (out == state) {
        JsonState tmp;
        json_state_copy(&tmp, state);
        return json_state_feed(c, &tmp, byte, out);
    }
    out->num_paths = 0;
    for (int i = 0; i < state->num_paths; i++) {
        JsonPath p;
        path_copy(&p, &state->paths[i]);
        feed_path(c, &p, byte, out);
    }
    return out->num_paths > 0;
}

bool json_state_feed_bytes(const JsonConstraint *c, JsonState *state, const char *bytes, size_t length) {
    for (size_t i = 0; i < length; i++)
        if (!json_state_feed(c, state, (uint8_t)bytes[i], state)) return false;
    return state->num_paths > 0;
}

bool json_state_accepts(const JsonConstraint *c, const JsonState *state) {
    for (int i = 0; i < state->num_paths; i++) {
        JsonPath p;
        path_copy(&p, &state->paths[i]);
        for (;;) {
            JsonFrame *f = top(&p);
            const Node *n = &c->nodes[f->node];
            bool can_end = false;
            if (n->kind == K_ROOT) {
                if (f->phase == ROOT_DONE) return true;
                break;
            }
            if (n->kind == K_NUMBER || n->kind == K_INTEGER) can_end = number_can_end(n, f);
            else if (n->kind == K_LITERALS) can_end = literals_can_end(n, f);
            else if (n->kind == K_REPEAT) can_end = f->phase == R_AFTER_ITEM && f->count >= n->min_count;
            if (!can_end) break;
            p.depth--;
            child_done(c, &p);
        }
    }
    return false;
}

bool json_constraint_matches(const JsonConstraint *c, const char *text, size_t length) {
    JsonState *state = xmalloc(sizeof *state);
    json_state_init(c, state);
    bool ok = json_state_feed_bytes(c, state, text, length) && json_state_accepts(c, state);
    free(state);
    return ok;
}
