// The regular-expression constraint (regex_constraint.h): pattern -> syntax tree of
// code-point sets -> Thompson NFA over UTF-8 bytes -> DFA by subset construction, with the
// states that cannot reach an accepting one cut out.
#include "gen/regex_constraint.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/check.h"

#define MAX_CODE_POINT 0x10FFFFu

// --- sets of code points ----------------------------------------------------------------

typedef struct {
    uint32_t lo, hi;
} Range;

typedef struct {
    Range *ranges;
    int count, capacity;
} CharSet;

static void set_add(CharSet *s, uint32_t lo, uint32_t hi) {
    if (s->count == s->capacity) {
        s->capacity = s->capacity ? 2 * s->capacity : 4;
        s->ranges = xrealloc(s->ranges, (size_t)s->capacity * sizeof(Range));
    }
    s->ranges[s->count++] = (Range){lo, hi};
}

static int by_lo(const void *a, const void *b) {
    const Range *x = a, *y = b;
    return (x->lo > y->lo) - (x->lo < y->lo);
}

// Sorted, merged, without the surrogates (which UTF-8 cannot encode).
static void set_normalize(CharSet *s) {
    qsort(s->ranges, (size_t)s->count, sizeof(Range), by_lo);
    int n = 0;
    for (int i = 0; i < s->count; i++) {
        if (n > 0 && s->ranges[i].lo <= s->ranges[n - 1].hi + 1) {
            if (s->ranges[i].hi > s->ranges[n - 1].hi) s->ranges[n - 1].hi = s->ranges[i].hi;
        } else {
            s->ranges[n++] = s->ranges[i];
        }
    }
    s->count = n;
    for (int i = 0; i < s->count; i++) {
        Range r = s->ranges[i];
        if (r.hi < 0xD800 || r.lo > 0xDFFF) continue;
        if (r.lo < 0xD800 && r.hi > 0xDFFF) {
            s->ranges[i].hi = 0xD7FF;
            set_add(s, 0xE000, r.hi);
            qsort(s->ranges, (size_t)s->count, sizeof(Range), by_lo);
        } else if (r.lo < 0xD800) {
            s->ranges[i].hi = 0xD7FF;
        } else if (r.hi > 0xDFFF) {
            s->ranges[i].lo = 0xE000;
        } else {
            memmove(&s->ranges[i], &s->ranges[i + 1], (size_t)(s->count - i - 1) * sizeof(Range));
            s->count--, i--;
        }
    }
}

static void set_negate(CharSet *s) {
    set_normalize(s);
    CharSet out = {0};
    uint32_t next = 0;
    for (int i = 0; i < s->count; i++) {
        if (s->ranges[i].lo > next) set_add(&out, next, s->ranges[i].lo - 1);
        next = s->ranges[i].hi + 1;
    }
    if (next <= MAX_CODE_POINT) set_add(&out, next, MAX_CODE_POINT);
    free(s->ranges);
    *s = out;
    set_normalize(s);
}

static void set_add_set(CharSet *s, const CharSet *t) {
    for (int i = 0; i < t->count; i++) set_add(s, t->ranges[i].lo, t->ranges[i].hi);
}

// \d \w \s (ASCII), negated for \D \W \S.
static void set_class(CharSet *s, char letter) {
    CharSet c = {0};
    switch (letter | 0x20) {
    case 'd': set_add(&c, '0', '9'); break;
    case 'w': set_add(&c, '0', '9'), set_add(&c, 'A', 'Z'), set_add(&c, 'a', 'z'), set_add(&c, '_', '_'); break;
    default: set_add(&c, '\t', '\r'), set_add(&c, ' ', ' '); break; // \t \n \v \f \r and space
    }
    if (letter >= 'A' && letter <= 'Z') set_negate(&c);
    set_add_set(s, &c);
    free(c.ranges);
}

// --- the syntax tree --------------------------------------------------------------------

typedef enum { A_SET, A_CONCAT, A_ALT, A_REPEAT } AstKind;

typedef struct Ast {
    AstKind kind;
    CharSet set;
    struct Ast **kids;
    int num_kids;
    int min, max;                     // REPEAT (max -1: no bound)
    bool anchor_start, anchor_end;    // a top-level alternative's ^ and $
} Ast;

static Ast *ast_new(AstKind kind) {
    Ast *a = xcalloc(1, sizeof *a);
    a->kind = kind;
    return a;
}

static void ast_add(Ast *a, Ast *kid) {
    a->kids = xrealloc(a->kids, (size_t)(a->num_kids + 1) * sizeof(Ast *));
    a->kids[a->num_kids++] = kid;
}

static void ast_free(Ast *a) {
    if (!a) return;
    for (int i = 0; i < a->num_kids; i++) ast_free(a->kids[i]);
    free(a->kids), free(a->set.ranges), free(a);
}

static Ast *ast_char(uint32_t c) {
    Ast *a = ast_new(A_SET);
    set_add(&a->set, c, c);
    return a;
}

// --- the parser -------------------------------------------------------------------------

typedef struct {
    uint32_t *cp; // the pattern's characters
    int n, i;
    const char *what;
    int depth;
} Parser;

static Ast *fail(Parser *p, int at, const char *message) {
    err_set("%s: %s (at position %d)", p->what, message, at);
    return NULL;
}

static bool at(const Parser *p, int k, uint32_t c) { return p->i + k < p->n && p->cp[p->i + k] == c; }

static int hex_value(uint32_t c) {
    if (c >= '0' && c <= '9') return (int)(c - '0');
    if (c >= 'a' && c <= 'f') return (int)(c - 'a' + 10);
    if (c >= 'A' && c <= 'F') return (int)(c - 'A' + 10);
    return -1;
}

// A quantifier {m}, {m,}, {,n}, {m,n} or {,} at p->i: its length in characters (0: not
// one, the `{` is a literal), its bounds.
static int brace_quantifier(const Parser *p, long *min, long *max) {
    int k = p->i + 1;
    long lo = -1, hi = -1;
    while (k < p->n && p->cp[k] >= '0' && p->cp[k] <= '9') lo = (lo < 0 ? 0 : lo) * 10 + (p->cp[k++] - '0'), lo = lo > 1000000 ? 1000000 : lo;
    bool comma = k < p->n && p->cp[k] == ',';
    if (comma) {
        k++;
        while (k < p->n && p->cp[k] >= '0' && p->cp[k] <= '9') hi = (hi < 0 ? 0 : hi) * 10 + (p->cp[k++] - '0'), hi = hi > 1000000 ? 1000000 : hi;
    }
    if (k >= p->n || p->cp[k] != '}') return 0;
    if (!comma && lo < 0) return 0; // "{}" is a literal
    *min = lo < 0 ? 0 : lo;
    *max = comma ? hi : lo;
    return k + 1 - p->i;
}

static bool quantifier_here(const Parser *p) {
    long a, b;
    return p->i < p->n && (p->cp[p->i] == '*' || p->cp[p->i] == '+' || p->cp[p->i] == '?' ||
                           (p->cp[p->i] == '{' && brace_quantifier(p, &a, &b) > 0));
}

// An escape at p->i (the backslash): a character (*c) or a set (set->count > 0). Returns
// 0, or -1 with the error set.
static int parse_escape(Parser *p, bool in_class, uint32_t *c, CharSet *set) {
    const int start = p->i;
    if (p->i + 1 >= p->n) {
        fail(p, start, "a trailing backslash");
        return -1;
    }
    const uint32_t e = p->cp[p->i + 1];
    p->i += 2;
    switch (e) {
    case 'd': case 'D': case 'w': case 'W': case 's': case 'S': set_class(set, (char)e); return 0;
    case 'n': *c = '\n'; return 0;
    case 't': *c = '\t'; return 0;
    case 'r': *c = '\r'; return 0;
    case 'f': *c = '\f'; return 0;
    case 'v': *c = '\v'; return 0;
    case 'a': *c = 7; return 0;
    case 'x': case 'u': case 'U': {
        const int digits = e == 'x' ? 2 : e == 'u' ? 4 : 8;
        uint32_t value = 0;
        for (int k = 0; k < digits; k++) {
            const int h = p->i < p->n ? hex_value(p->cp[p->i]) : -1;
            if (h < 0) {
                char m[64];
                snprintf(m, sizeof m, "\\%c needs %d hexadecimal digits", (char)e, digits);
                fail(p, start, m);
                return -1;
            }
            value = value * 16 + (uint32_t)h, p->i++;
        }
        if (value > MAX_CODE_POINT || (value >= 0xD800 && value <= 0xDFFF)) {
            fail(p, start, "the escape is not a Unicode scalar value (a surrogate or above U+10FFFF)");
            return -1;
        }
        *c = value;
        return 0;
    }
    case 'b':
        if (in_class) {
            *c = 8;
            return 0;
        }
        fail(p, start, "the word boundary \\b is not supported");
        return -1;
    case 'B': case 'A': case 'Z': case 'z': case 'G': {
        char m[96];
        snprintf(m, sizeof m, "the assertion \\%c is not supported (only ^ at the start and $ at the end)", (char)e);
        fail(p, start, m);
        return -1;
    }
    case 'p': case 'P': fail(p, start, "Unicode property classes (\\p{...}) are not supported"); return -1;
    case 'k': fail(p, start, "backreferences are not supported"); return -1;
    default: break;
    }
    if (e >= '0' && e <= '9') {
        fail(p, start, "backreferences and octal escapes are not supported");
        return -1;
    }
    if ((e >= 'a' && e <= 'z') || (e >= 'A' && e <= 'Z')) {
        char m[64];
        snprintf(m, sizeof m, "bad escape \\%c", (char)e);
        fail(p, start, m);
        return -1;
    }
    *c = e;
    return 0;
}

// One item of a class: a character (returns 1, *c) or a set (returns 2); -1 on error.
static int class_item(Parser *p, uint32_t *c, CharSet *set) {
    if (p->cp[p->i] == '\\') {
        CharSet s = {0};
        if (parse_escape(p, true, c, &s) != 0) return -1;
        if (s.count == 0) return 1;
        set_add_set(set, &s);
        free(s.ranges);
        return 2;
    }
    *c = p->cp[p->i++];
    return 1;
}

static Ast *parse_class(Parser *p) {
    const int start = p->i++;
    Ast *a = ast_new(A_SET);
    const bool negate = at(p, 0, '^');
    if (negate) p->i++;
    bool first = true;
    for (;;) {
        if (p->i >= p->n) {
            ast_free(a);
            return fail(p, start, "an unterminated character set");
        }
        if (p->cp[p->i] == ']' && !first) {
            p->i++;
            break;
        }
        first = false;
        const int item_at = p->i;
        uint32_t lo = 0, hi = 0;
        CharSet items = {0};
        const int kind = class_item(p, &lo, &items);
        if (kind < 0) {
            free(items.ranges), ast_free(a);
            return NULL;
        }
        if (at(p, 0, '-') && p->i + 1 < p->n && p->cp[p->i + 1] != ']') {
            p->i++;
            const int kind_hi = class_item(p, &hi, &items);
            if (kind_hi < 0 || kind == 2 || kind_hi == 2 || lo > hi) {
                free(items.ranges), ast_free(a);
                return kind_hi < 0 ? NULL : fail(p, item_at, "a bad character range");
            }
            set_add(&a->set, lo, hi);
        } else if (kind == 1) {
            set_add(&a->set, lo, lo);
        }
        set_add_set(&a->set, &items);
        free(items.ranges);
    }
    if (negate) set_negate(&a->set);
    else set_normalize(&a->set);
    return a;
}

static Ast *parse_alternation(Parser *p, bool top);

static Ast *parse_group(Parser *p) {
    const int start = p->i++;
    if (at(p, 0, '?')) {
        const uint32_t k = p->i + 1 < p->n ? p->cp[p->i + 1] : 0;
        if (k == ':') {
            p->i += 2;
        } else if ((k == 'P' && at(p, 2, '<')) || (k == '<' && !at(p, 2, '=') && !at(p, 2, '!'))) {
            p->i += k == 'P' ? 3 : 2;
            const int name = p->i;
            while (p->i < p->n && p->cp[p->i] != '>') {
                const uint32_t c = p->cp[p->i];
                if (!(c == '_' || (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c >= 0x80))
                    return fail(p, start, "a bad group name");
                p->i++;
            }
            if (p->i >= p->n || p->i == name) return fail(p, start, "a bad group name");
            p->i++;
        } else if (k == 'P' && at(p, 2, '=')) {
            return fail(p, start, "backreferences are not supported");
        } else if (k == '=' || k == '!' || (k == '<' && (at(p, 2, '=') || at(p, 2, '!')))) {
            return fail(p, start, "lookahead and lookbehind are not supported");
        } else {
            return fail(p, start, "this (? extension is not supported (inline flags, atomic groups, comments, conditionals)");
        }
    }
    if (++p->depth > REGEX_MAX_NESTING) return fail(p, start, "groups nest too deeply");
    Ast *inner = parse_alternation(p, false);
    p->depth--;
    if (!inner) return NULL;
    if (!at(p, 0, ')')) {
        ast_free(inner);
        return fail(p, start, "a missing ), unterminated subpattern");
    }
    p->i++;
    return inner;
}

static Ast *parse_atom(Parser *p) {
    const uint32_t c = p->cp[p->i];
    if (c == '(') return parse_group(p);
    if (c == '[') return parse_class(p);
    if (c == '.') {
        p->i++;
        Ast *a = ast_new(A_SET);
        set_add(&a->set, '\n', '\n');
        set_negate(&a->set);
        return a;
    }
    if (c == '\\') {
        Ast *a = ast_new(A_SET);
        uint32_t ch = 0;
        if (parse_escape(p, false, &ch, &a->set) != 0) {
            ast_free(a);
            return NULL;
        }
        if (a->set.count == 0) set_add(&a->set, ch, ch);
        set_normalize(&a->set);
        return a;
    }
    if (quantifier_here(p)) return fail(p, p->i, "nothing to repeat");
    p->i++;
    return ast_char(c);
}

// Quantifiers after an atom.
static Ast *parse_quantifiers(Parser *p, Ast *atom) {
    if (!quantifier_here(p)) return atom;
    const int start = p->i;
    long min = 0, max = -1;
    const uint32_t q = p->cp[p->i];
    if (q == '*') min = 0, max = -1, p->i++;
    else if (q == '+') min = 1, max = -1, p->i++;
    else if (q == '?') min = 0, max = 1, p->i++;
    else p->i += brace_quantifier(p, &min, &max);
    if (max >= 0 && min > max) {
        ast_free(atom);
        return fail(p, start, "the minimum repeat is greater than the maximum");
    }
    if (min > REGEX_MAX_REPEAT || max > REGEX_MAX_REPEAT) {
        ast_free(atom);
        char m[96];
        snprintf(m, sizeof m, "a repetition bound above %d is not supported", REGEX_MAX_REPEAT);
        return fail(p, start, m);
    }
    if (at(p, 0, '?')) p->i++; // lazy: the same texts match
    else if (at(p, 0, '+')) {
        ast_free(atom);
        return fail(p, p->i, "possessive quantifiers are not supported");
    }
    if (quantifier_here(p)) {
        ast_free(atom);
        return fail(p, p->i, "multiple repeat");
    }
    Ast *r = ast_new(A_REPEAT);
    r->min = (int)min, r->max = (int)max;
    ast_add(r, atom);
    return r;
}

static Ast *parse_branch(Parser *p, bool top) {
    Ast *cat = ast_new(A_CONCAT);
    if (top && at(p, 0, '^')) cat->anchor_start = true, p->i++;
    while (p->i < p->n && p->cp[p->i] != '|' && p->cp[p->i] != ')') {
        const uint32_t c = p->cp[p->i];
        if (c == '$' && top && (p->i + 1 == p->n || p->cp[p->i + 1] == '|')) {
            cat->anchor_end = true, p->i++;
            break;
        }
        if (c == '$' || c == '^') {
            ast_free(cat);
            return fail(p, p->i, c == '$' ? "'$' is supported only at the end of the pattern"
                                           : "'^' is supported only at the start of the pattern");
        }
        Ast *atom = parse_atom(p);
        if (atom) atom = parse_quantifiers(p, atom);
        if (!atom) {
            ast_free(cat);
            return NULL;
        }
        ast_add(cat, atom);
    }
    if (cat->anchor_start && quantifier_here(p)) {
        ast_free(cat);
        return fail(p, p->i, "nothing to repeat");
    }
    return cat;
}

static Ast *parse_alternation(Parser *p, bool top) {
    Ast *alt = ast_new(A_ALT);
    for (;;) {
        Ast *branch = parse_branch(p, top);
        if (!branch) {
            ast_free(alt);
            return NULL;
        }
        ast_add(alt, branch);
        if (!at(p, 0, '|')) break;
        p->i++;
    }
    if (top && p->i < p->n) {
        ast_free(alt);
        return fail(p, p->i, "an unbalanced parenthesis");
    }
    return alt;
}

// The pattern's characters; -1 on malformed UTF-8.
static int decode_utf8(const char *text, size_t length, uint32_t **out, int *count, size_t *bad) {
    uint32_t *cp = xmalloc((length + 1) * sizeof(uint32_t));
    int n = 0;
    for (size_t i = 0; i < length;) {
        const uint8_t b = (uint8_t)text[i];
        int extra = b < 0x80 ? 0 : b >= 0xC2 && b <= 0xDF ? 1 : b >= 0xE0 && b <= 0xEF ? 2 : b >= 0xF0 && b <= 0xF4 ? 3 : -1;
        uint32_t c = extra == 0 ? b : extra == 1 ? b & 0x1F : extra == 2 ? b & 0x0F : b & 0x07;
        bool ok = extra >= 0 && i + (size_t)extra < length;
        for (int k = 1; ok && k <= extra; k++) {
            const uint8_t t = (uint8_t)text[i + (size_t)k];
            if ((t & 0xC0) != 0x80) ok = false;
            c = c << 6 | (t & 0x3F);
        }
        if (ok && ((extra == 2 && (c < 0x800 || (c >= 0xD800 && c <= 0xDFFF))) || (extra == 3 && (c < 0x10000 || c > MAX_CODE_POINT))))
            ok = false;
        if (!ok) {
            free(cp);
            *bad = i;
            return -1;
        }
        cp[n++] = c;
        i += (size_t)extra + 1;
    }
    *out = cp, *count = n;
    return 0;
}

// --- the NFA ----------------------------------------------------------------------------

typedef struct {
    int to, next; // next: the state's next edge (-1: none)
    uint8_t lo, hi;
    bool eps;
} Edge;

typedef struct {
    int *head; // each state's first edge
    bool *has_bytes;
    int num_states, capacity;
    Edge *edges;
    int num_edges, edge_capacity;
    bool overflow;
} Nfa;

typedef struct {
    int entry, exit;
} Frag;

static int nfa_state(Nfa *nfa) {
    if (nfa->num_states >= REGEX_MAX_NFA_STATES) {
        nfa->overflow = true;
        return 0;
    }
    if (nfa->num_states == nfa->capacity) {
        nfa->capacity = nfa->capacity ? 2 * nfa->capacity : 64;
        nfa->head = xrealloc(nfa->head, (size_t)nfa->capacity * sizeof(int));
        nfa->has_bytes = xrealloc(nfa->has_bytes, (size_t)nfa->capacity * sizeof(bool));
    }
    nfa->head[nfa->num_states] = -1;
    nfa->has_bytes[nfa->num_states] = false;
    return nfa->num_states++;
}

static void nfa_edge(Nfa *nfa, int from, int to, bool eps, uint8_t lo, uint8_t hi) {
    if (nfa->overflow) return;
    if (nfa->num_edges == nfa->edge_capacity) {
        nfa->edge_capacity = nfa->edge_capacity ? 2 * nfa->edge_capacity : 128;
        nfa->edges = xrealloc(nfa->edges, (size_t)nfa->edge_capacity * sizeof(Edge));
    }
    nfa->edges[nfa->num_edges] = (Edge){.to = to, .next = nfa->head[from], .lo = lo, .hi = hi, .eps = eps};
    nfa->head[from] = nfa->num_edges++;
    if (!eps) nfa->has_bytes[from] = true;
}

static int utf8_encode(uint32_t c, uint8_t *b) {
    if (c < 0x80) return b[0] = (uint8_t)c, 1;
    if (c < 0x800) return b[0] = (uint8_t)(0xC0 | c >> 6), b[1] = (uint8_t)(0x80 | (c & 0x3F)), 2;
    if (c < 0x10000)
        return b[0] = (uint8_t)(0xE0 | c >> 12), b[1] = (uint8_t)(0x80 | (c >> 6 & 0x3F)), b[2] = (uint8_t)(0x80 | (c & 0x3F)), 3;
    b[0] = (uint8_t)(0xF0 | c >> 18), b[1] = (uint8_t)(0x80 | (c >> 12 & 0x3F));
    b[2] = (uint8_t)(0x80 | (c >> 6 & 0x3F)), b[3] = (uint8_t)(0x80 | (c & 0x3F));
    return 4;
}

// tails[k]: a state from which any k continuation bytes lead to the fragment's exit.
static int tail_state(Nfa *nfa, int *tails, int exit, int k) {
    if (k == 0) return exit;
    if (tails[k] < 0) {
        const int below = tail_state(nfa, tails, exit, k - 1);
        tails[k] = nfa_state(nfa);
        nfa_edge(nfa, tails[k], below, false, 0x80, 0xBF);
    }
    return tails[k];
}

// The code points [lo, hi] (one encoded length, no surrogates) as byte-range sequences
// from f.entry to f.exit, split until each byte position ranges independently (the
// classic UTF-8 range split of RE2 and Go's regexp).
static void emit_range(Nfa *nfa, Frag f, int *tails, uint32_t lo, uint32_t hi) {
    if (lo > hi || nfa->overflow) return;
    static const uint32_t limits[] = {0x7F, 0x7FF, 0xFFFF};
    for (int k = 0; k < 3; k++)
        if (lo <= limits[k] && hi > limits[k]) {
            emit_range(nfa, f, tails, lo, limits[k]);
            emit_range(nfa, f, tails, limits[k] + 1, hi);
            return;
        }
    uint8_t a[4], b[4];
    const int n = utf8_encode(lo, a);
    for (int i = 1; i < n; i++) {
        const uint32_t m = (1u << (6 * i)) - 1;
        if ((lo & ~m) != (hi & ~m)) {
            if ((lo & m) != 0) {
                emit_range(nfa, f, tails, lo, lo | m);
                emit_range(nfa, f, tails, (lo | m) + 1, hi);
                return;
            }
            if ((hi & m) != m) {
                emit_range(nfa, f, tails, lo, (hi & ~m) - 1);
                emit_range(nfa, f, tails, hi & ~m, hi);
                return;
            }
        }
    }
    utf8_encode(hi, b);
    int j = n; // the bytes from j on are all any continuation byte: a shared tail
    while (j > 1 && a[j - 1] == 0x80 && b[j - 1] == 0xBF) j--;
    int cur = f.entry;
    for (int k = 0; k < j; k++) {
        const int next = k == n - 1 ? f.exit : k == j - 1 ? tail_state(nfa, tails, f.exit, n - j) : nfa_state(nfa);
        nfa_edge(nfa, cur, next, false, a[k], b[k]);
        cur = next;
    }
}

static Frag build(Nfa *nfa, const Ast *a) {
    Frag f = {nfa_state(nfa), 0};
    f.exit = f.entry;
    if (nfa->overflow) return f;
    switch (a->kind) {
    case A_SET: {
        f.exit = nfa_state(nfa);
        int tails[4] = {-1, -1, -1, -1};
        for (int i = 0; i < a->set.count; i++) emit_range(nfa, f, tails, a->set.ranges[i].lo, a->set.ranges[i].hi);
        return f;
    }
    case A_CONCAT:
        for (int i = 0; i < a->num_kids && !nfa->overflow; i++) {
            Frag g = build(nfa, a->kids[i]);
            nfa_edge(nfa, f.exit, g.entry, true, 0, 0);
            f.exit = g.exit;
        }
        return f;
    case A_ALT:
        f.exit = nfa_state(nfa);
        for (int i = 0; i < a->num_kids && !nfa->overflow; i++) {
            Frag g = build(nfa, a->kids[i]);
            nfa_edge(nfa, f.entry, g.entry, true, 0, 0);
            nfa_edge(nfa, g.exit, f.exit, true, 0, 0);
        }
        return f;
    case A_REPEAT: {
        int cur = f.entry;
        for (int k = 0; k < a->min && !nfa->overflow; k++) {
            Frag g = build(nfa, a->kids[0]);
            nfa_edge(nfa, cur, g.entry, true, 0, 0);
            cur = g.exit;
        }
        if (a->max < 0) {
            const int loop = nfa_state(nfa);
            Frag g = build(nfa, a->kids[0]);
            nfa_edge(nfa, cur, loop, true, 0, 0);
            nfa_edge(nfa, loop, g.entry, true, 0, 0);
            nfa_edge(nfa, g.exit, loop, true, 0, 0);
            f.exit = loop;
        } else {
            // Each optional copy may be skipped straight to the end (not through the copies
            // after it), so that the state sets stay small.
            const int end = nfa_state(nfa);
            for (int k = a->min; k < a->max && !nfa->overflow; k++) {
                Frag g = build(nfa, a->kids[0]);
                nfa_edge(nfa, cur, g.entry, true, 0, 0);
                nfa_edge(nfa, cur, end, true, 0, 0);
                cur = g.exit;
            }
            nfa_edge(nfa, cur, end, true, 0, 0);
            f.exit = end;
        }
        return f;
    }
    }
    return f;
}

// --- the DFA ----------------------------------------------------------------------------

struct RegexConstraint {
    int num_states, num_classes;
    uint8_t classes[256];
    int32_t *next; // [state * num_classes + class], -1 dead
    bool *accepting;
};

typedef struct {
    int *items; // every key's NFA states, one after another
    size_t num_items, item_capacity;
    size_t *offset;
    int *length, *count; // a key's NFA states and its code-point count
    int num_keys, key_capacity;
    int *slots; // open addressing: key ids, -1 empty
    size_t num_slots;
} KeyTable;

static uint64_t key_hash(const int *items, int length, int count) {
    uint64_t h = 1469598103934665603ull ^ (uint64_t)count;
    for (int i = 0; i < length; i++) h = (h ^ (uint64_t)(uint32_t)items[i]) * 1099511628211ull;
    return h ^ (h >> 29);
}

static void keys_grow(KeyTable *t) {
    const size_t slots = t->num_slots ? 2 * t->num_slots : 1024;
    int *fresh = xmalloc(slots * sizeof(int));
    for (size_t s = 0; s < slots; s++) fresh[s] = -1;
    for (int k = 0; k < t->num_keys; k++) {
        size_t s = key_hash(t->items + t->offset[k], t->length[k], t->count[k]) & (slots - 1);
        while (fresh[s] >= 0) s = (s + 1) & (slots - 1);
        fresh[s] = k;
    }
    free(t->slots);
    t->slots = fresh, t->num_slots = slots;
}

// The key's id, adding it when new (*added); -1 past REGEX_MAX_SET_ITEMS.
static int keys_find(KeyTable *t, const int *items, int length, int count, bool *added) {
    if ((size_t)(t->num_keys + 1) * 2 > t->num_slots) keys_grow(t);
    size_t s = key_hash(items, length, count) & (t->num_slots - 1);
    for (; t->slots[s] >= 0; s = (s + 1) & (t->num_slots - 1)) {
        const int k = t->slots[s];
        if (t->length[k] == length && t->count[k] == count &&
            (length == 0 || !memcmp(t->items + t->offset[k], items, (size_t)length * sizeof(int))))
            return *added = false, k;
    }
    if (t->num_items + (size_t)length > REGEX_MAX_SET_ITEMS) return -1;
    if (t->num_keys == t->key_capacity) {
        t->key_capacity = t->key_capacity ? 2 * t->key_capacity : 256;
        t->offset = xrealloc(t->offset, (size_t)t->key_capacity * sizeof(size_t));
        t->length = xrealloc(t->length, (size_t)t->key_capacity * sizeof(int));
        t->count = xrealloc(t->count, (size_t)t->key_capacity * sizeof(int));
    }
    while (t->num_items + (size_t)length > t->item_capacity) {
        t->item_capacity = t->item_capacity ? 2 * t->item_capacity : 1024;
        t->items = xrealloc(t->items, t->item_capacity * sizeof(int));
    }
    const int k = t->num_keys++;
    t->offset[k] = t->num_items, t->length[k] = length, t->count[k] = count;
    if (length > 0) memcpy(t->items + t->num_items, items, (size_t)length * sizeof(int));
    t->num_items += (size_t)length;
    t->slots[s] = k;
    *added = true;
    return k;
}

static int by_int(const void *a, const void *b) {
    const int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

typedef struct {
    const Nfa *nfa;
    int match;
    int *mark, generation;
    int *stack;
    int *set; // the closure's states that matter: those with byte edges, and the match
} Closure;

// The epsilon closure of `seeds`, reduced to the states that matter, sorted.
static int closure(Closure *c, const int *seeds, int num_seeds) {
    c->generation++;
    int top = 0, n = 0;
    for (int i = 0; i < num_seeds; i++)
        if (c->mark[seeds[i]] != c->generation) c->mark[seeds[i]] = c->generation, c->stack[top++] = seeds[i];
    while (top > 0) {
        const int s = c->stack[--top];
        if (c->nfa->has_bytes[s] || s == c->match) c->set[n++] = s;
        for (int e = c->nfa->head[s]; e >= 0; e = c->nfa->edges[e].next) {
            const Edge *edge = &c->nfa->edges[e];
            if (edge->eps && c->mark[edge->to] != c->generation) c->mark[edge->to] = c->generation, c->stack[top++] = edge->to;
        }
    }
    qsort(c->set, (size_t)n, sizeof(int), by_int);
    return n;
}

static bool json_control(int b) { return b < 0x20 && b != 8 && b != 9 && b != 10 && b != 12 && b != 13; }

static int determinize(RegexConstraint *r, const Nfa *nfa, int start, int match, const RegexOptions *o, const char *what) {
    // Byte classes: bytes that no edge, no count and no alphabet rule tells apart.
    bool cut[257] = {false};
    cut[0] = cut[0x80] = cut[0xC0] = cut[256] = true;
    if (o->json_string)
        for (int b = 0; b <= 0x20; b++) cut[b] = true;
    for (int e = 0; e < nfa->num_edges; e++)
        if (!nfa->edges[e].eps) cut[nfa->edges[e].lo] = cut[nfa->edges[e].hi + 1] = true;
    uint8_t representative[256];
    int classes = 0;
    for (int b = 0; b < 256; b++) {
        if (cut[b] && b > 0) classes++;
        if (cut[b]) representative[classes] = (uint8_t)b;
        r->classes[b] = (uint8_t)classes;
    }
    r->num_classes = classes + 1;
    Closure c = {.nfa = nfa, .match = match};
    c.mark = xcalloc((size_t)nfa->num_states, sizeof(int));
    c.stack = xmalloc((size_t)nfa->num_states * sizeof(int));
    c.set = xmalloc((size_t)nfa->num_states * sizeof(int));
    int *seeds = xmalloc(((size_t)nfa->num_edges + 1) * sizeof(int));
    KeyTable keys = {.item_capacity = 1024};
    keys.items = xmalloc(keys.item_capacity * sizeof(int));
    size_t table_capacity = 0;
    int rc = 0;
    bool added;
    int n = closure(&c, &start, 1);
    keys_find(&keys, c.set, n, 0, &added);
    for (int id = 0; id < keys.num_keys; id++) {
        if ((size_t)keys.num_keys * (size_t)r->num_classes > table_capacity) {
            table_capacity = (size_t)keys.num_keys * 2 * (size_t)r->num_classes;
            r->next = xrealloc(r->next, table_capacity * sizeof(int32_t));
            r->accepting = xrealloc(r->accepting, table_capacity / (size_t)r->num_classes * sizeof(bool));
        }
        const int count = keys.count[id];
        r->accepting[id] = false;
        for (int k = 0; k < keys.length[id]; k++)
            if (keys.items[keys.offset[id] + (size_t)k] == match && count >= o->min_chars) r->accepting[id] = true;
        for (int cls = 0; cls < r->num_classes; cls++) {
            const uint8_t b = representative[cls];
            int32_t *slot = &r->next[(size_t)id * (size_t)r->num_classes + (size_t)cls];
            *slot = -1;
            int next_count = count + (b < 0x80 || b >= 0xC0);
            if (o->max_chars >= 0 && next_count > o->max_chars) continue;
            if (o->max_chars < 0 && next_count > o->min_chars) next_count = o->min_chars;
            if (o->json_string && json_control(b)) continue;
            int num_seeds = 0;
            for (int k = 0; k < keys.length[id]; k++) {
                const int s = keys.items[keys.offset[id] + (size_t)k];
                for (int e = nfa->head[s]; e >= 0; e = nfa->edges[e].next) {
                    const Edge *edge = &nfa->edges[e];
                    if (!edge->eps && edge->lo <= b && b <= edge->hi) seeds[num_seeds++] = edge->to;
                }
            }
            if (num_seeds == 0) continue;
            n = closure(&c, seeds, num_seeds);
            if (n == 0) continue;
            // the key table may move its arrays: nothing of it is held across this call
            const int target = keys_find(&keys, c.set, n, next_count, &added);
            if (target < 0) {
                rc = err_set("%s: the pattern's automaton needs more than %d NFA states in its DFA states' sets (a cap "
                             "of this implementation; smaller repetition bounds help)", what, REGEX_MAX_SET_ITEMS);
                goto done;
            }
            if (added && keys.num_keys > REGEX_MAX_DFA_STATES) {
                rc = err_set("%s: the pattern needs more than %d automaton states (a cap of this implementation; "
                             "smaller repetition bounds help)", what, REGEX_MAX_DFA_STATES);
                goto done;
            }
            *slot = target;
        }
    }
    r->num_states = keys.num_keys;
done:
    free(c.mark), free(c.stack), free(c.set), free(seeds);
    free(keys.items), free(keys.offset), free(keys.length), free(keys.count), free(keys.slots);
    return rc;
}

// Cuts every transition into a state from which no accepting state can be reached.
static int prune(RegexConstraint *r, const char *what, bool json_string) {
    const int S = r->num_states, C = r->num_classes;
    // Reverse edges, counted then placed.
    int *start = xcalloc((size_t)S + 1, sizeof(int));
    for (size_t e = 0; e < (size_t)S * (size_t)C; e++)
        if (r->next[e] >= 0) start[r->next[e] + 1]++;
    for (int s = 0; s < S; s++) start[s + 1] += start[s];
    int *from = xmalloc(((size_t)start[S] + 1) * sizeof(int)), *fill = xmalloc(((size_t)S + 1) * sizeof(int));
    memcpy(fill, start, (size_t)S * sizeof(int));
    for (int s = 0; s < S; s++)
        for (int c = 0; c < C; c++) {
            const int t = r->next[(size_t)s * (size_t)C + (size_t)c];
            if (t >= 0) from[fill[t]++] = s;
        }
    bool *live = xcalloc((size_t)S, sizeof(bool));
    int *queue = xmalloc((size_t)S * sizeof(int)), head = 0, tail = 0;
    for (int s = 0; s < S; s++)
        if (r->accepting[s]) live[s] = true, queue[tail++] = s;
    while (head < tail) {
        const int t = queue[head++];
        for (int k = start[t]; k < start[t + 1]; k++)
            if (!live[from[k]]) live[from[k]] = true, queue[tail++] = from[k];
    }
    for (size_t e = 0; e < (size_t)S * (size_t)C; e++)
        if (r->next[e] >= 0 && !live[r->next[e]]) r->next[e] = -1;
    const bool start_live = live[0];
    free(start), free(from), free(fill), free(live), free(queue);
    if (!start_live)
        return err_set("%s: the pattern matches nothing%s", what, json_string ? " that a JSON string can hold" : "");
    return 0;
}

static Ast *any_star(void) {
    Ast *any = ast_new(A_SET);
    set_add(&any->set, 0, MAX_CODE_POINT);
    set_normalize(&any->set);
    Ast *star = ast_new(A_REPEAT);
    star->min = 0, star->max = -1;
    ast_add(star, any);
    return star;
}

static int compile_ast(RegexConstraint **out, Ast *tree, const RegexOptions *options, const char *what) {
    static const RegexOptions plain = {.max_chars = -1};
    const RegexOptions *o = options ? options : &plain;
    if (o->search) // each top-level alternative not anchored may have anything around it
        for (int i = 0; i < tree->num_kids; i++) {
            Ast *branch = tree->kids[i];
            Ast *wrapped = ast_new(A_CONCAT);
            if (!branch->anchor_start) ast_add(wrapped, any_star());
            ast_add(wrapped, branch);
            if (!branch->anchor_end) ast_add(wrapped, any_star());
            tree->kids[i] = wrapped;
        }
    Nfa nfa = {0};
    Frag f = build(&nfa, tree);
    const int match = nfa_state(&nfa);
    nfa_edge(&nfa, f.exit, match, true, 0, 0);
    ast_free(tree);
    int rc = 0;
    RegexConstraint *r = xcalloc(1, sizeof *r);
    if (nfa.overflow)
        rc = err_set("%s: the pattern needs more than %d automaton states once its repetitions are expanded (a cap "
                     "of this implementation; smaller repetition bounds help)", what, REGEX_MAX_NFA_STATES);
    if (rc == 0) rc = determinize(r, &nfa, f.entry, match, o, what);
    if (rc == 0) rc = prune(r, what, o->json_string);
    free(nfa.head), free(nfa.has_bytes), free(nfa.edges);
    if (rc != 0) {
        regex_constraint_free(r);
        r = NULL;
    }
    *out = r;
    return rc;
}

int regex_constraint_compile(RegexConstraint **out, const char *pattern, size_t length, const RegexOptions *options,
                             const char *what) {
    *out = NULL;
    Parser p = {.what = what};
    size_t bad = 0;
    if (decode_utf8(pattern, length, &p.cp, &p.n, &bad) != 0)
        return err_set("%s: the pattern is not valid UTF-8 (at byte %zu)", what, bad);
    Ast *tree = parse_alternation(&p, true);
    free(p.cp);
    if (!tree) return -1;
    return compile_ast(out, tree, options, what);
}

int regex_constraint_choice(RegexConstraint **out, const char *const *choices, const size_t *lengths, int count,
                            const char *what) {
    *out = NULL;
    if (count < 1) return err_set("%s: give at least one choice", what);
    Ast *alt = ast_new(A_ALT);
    for (int i = 0; i < count; i++) {
        uint32_t *cp;
        int n;
        size_t bad;
        if (decode_utf8(choices[i], lengths[i], &cp, &n, &bad) != 0) {
            ast_free(alt);
            return err_set("%s: choice %d is not valid UTF-8 (at byte %zu)", what, i, bad);
        }
        Ast *cat = ast_new(A_CONCAT);
        for (int k = 0; k < n; k++) ast_add(cat, ast_char(cp[k]));
        free(cp);
        ast_add(alt, cat);
    }
    return compile_ast(out, alt, NULL, what);
}

void regex_constraint_free(RegexConstraint *r) {
    if (!r) return;
    free(r->next), free(r->accepting), free(r);
}

int32_t regex_state_start(const RegexConstraint *r) {
    (void)r;
    return 0;
}

int32_t regex_state_feed(const RegexConstraint *r, int32_t state, uint8_t byte) {
    return state < 0 ? -1 : r->next[(size_t)state * (size_t)r->num_classes + r->classes[byte]];
}

bool regex_state_accepts(const RegexConstraint *r, int32_t state) { return state >= 0 && r->accepting[state]; }

bool regex_constraint_matches(const RegexConstraint *r, const char *text, size_t length) {
    int32_t s = regex_state_start(r);
    for (size_t i = 0; i < length && s >= 0; i++) s = regex_state_feed(r, s, (uint8_t)text[i]);
    return regex_state_accepts(r, s);
}

int regex_constraint_num_states(const RegexConstraint *r) { return r->num_states; }

RegexTable regex_constraint_table(const RegexConstraint *r) {
    return (RegexTable){.table = r->next, .classes = r->classes, .num_classes = r->num_classes};
}
