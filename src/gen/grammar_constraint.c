// The GBNF grammar constraint (grammar_constraint.h): text -> rules of elements (groups and
// repetitions become rules of their own) -> checks (undefined rules, left recursion, rules
// that cannot finish) -> one flat element array that the recogniser's stacks index.
#include "gen/grammar_constraint.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/check.h"

#define MAX_CODE_POINT 0x10FFFFu

enum { ELEMENT_CHARS, ELEMENT_REF, ELEMENT_END }; // a class of characters, a rule, an alternative's end

typedef struct {
    int32_t kind;
    int32_t value; // CHARS: the class; REF: the rule
} Element;

typedef struct {
    uint32_t lo, hi;
} Range;

// --- the parser's rules ------------------------------------------------------------------

typedef struct {
    Element *items;
    int count, capacity;
} ElementList;

typedef struct {
    char *name;     // as written; NULL for a rule made for a group or a repetition
    int owner;      // the written rule it was made inside (itself for a written one)
    bool defined;
    size_t at;      // where it is defined, or first referenced while undefined
    ElementList *alts;
    int num_alts;
} Rule;

typedef struct {
    const char *text;
    size_t length, pos;
    const char *what;
    Rule *rules;
    int num_rules;
    int current; // the written rule being parsed
    int *named; // the written rules' indices (the lookup of names)
    int num_named;
    Range *ranges; // every class's ranges, one class after another
    int num_ranges, ranges_capacity;
    int *class_first; // class k: ranges [class_first[k], class_first[k + 1])
    int num_classes, classes_capacity;
    int any_class;        // `.`
    int ascii_class[128]; // the class of one ASCII character, made once (-1: not yet)
    long num_elements;
} Parser;

// "line L, column C" of a byte offset (the column counts characters, from 1).
static void line_column(const char *text, size_t at, int *line, int *column) {
    *line = 1, *column = 1;
    for (size_t i = 0; i < at; i++) {
        if (text[i] == '\n') (*line)++, *column = 1;
        else if (((uint8_t)text[i] & 0xC0) != 0x80) (*column)++;
    }
}

static int fail(const Parser *p, size_t at, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(const Parser *p, size_t at, const char *fmt, ...) {
    char message[512];
    va_list args;
    va_start(args, fmt);
    vsnprintf(message, sizeof message, fmt, args);
    va_end(args);
    int line, column;
    line_column(p->text, at, &line, &column);
    return err_set("%s: %s (at line %d, column %d)", p->what, message, line, column);
}

static void list_add(ElementList *list, Element e) {
    if (list->count == list->capacity) {
        list->capacity = list->capacity ? 2 * list->capacity : 8;
        list->items = xrealloc(list->items, (size_t)list->capacity * sizeof(Element));
    }
    list->items[list->count++] = e;
}

static int new_rule(Parser *p, const char *name, size_t name_length, size_t at) {
    p->rules = xrealloc(p->rules, (size_t)(p->num_rules + 1) * sizeof(Rule));
    Rule *r = &p->rules[p->num_rules];
    memset(r, 0, sizeof *r);
    if (name) {
        r->name = xmalloc(name_length + 1);
        memcpy(r->name, name, name_length);
        r->name[name_length] = '\0';
        p->named = xrealloc(p->named, (size_t)(p->num_named + 1) * sizeof(int));
        p->named[p->num_named++] = p->num_rules;
    }
    r->owner = name ? p->num_rules : p->current;
    r->at = at;
    return p->num_rules++;
}

static int new_alt(Parser *p, int rule) {
    Rule *r = &p->rules[rule];
    r->alts = xrealloc(r->alts, (size_t)(r->num_alts + 1) * sizeof(ElementList));
    memset(&r->alts[r->num_alts], 0, sizeof(ElementList));
    return r->num_alts++;
}

// Appends to rule's alternative alt, counting against the cap.
static int add_element(Parser *p, int rule, int alt, Element e) {
    if (++p->num_elements > GRAMMAR_MAX_ELEMENTS)
        return fail(p, p->pos, "the grammar needs more than %d elements once its repetitions are expanded (a cap "
                    "of this implementation)", GRAMMAR_MAX_ELEMENTS);
    list_add(&p->rules[rule].alts[alt], e);
    return 0;
}

static const char *rule_label(const Parser *p, int rule) {
    return p->rules[p->rules[rule].owner].name;
}

// --- characters and classes ----------------------------------------------------------------

static bool is_name_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
}

// One UTF-8 character of the grammar text at p->pos (well-formed, no surrogates).
static int decode_utf8(Parser *p, uint32_t *cp) {
    const uint8_t *s = (const uint8_t *)p->text + p->pos;
    const size_t left = p->length - p->pos;
    int n;
    uint32_t value, min;
    if (s[0] < 0x80) n = 1, value = s[0], min = 0;
    else if ((s[0] & 0xE0) == 0xC0) n = 2, value = s[0] & 0x1F, min = 0x80;
    else if ((s[0] & 0xF0) == 0xE0) n = 3, value = s[0] & 0x0F, min = 0x800;
    else if ((s[0] & 0xF8) == 0xF0) n = 4, value = s[0] & 0x07, min = 0x10000;
    else return fail(p, p->pos, "malformed UTF-8 (byte 0x%02X)", s[0]);
    if ((size_t)n > left) return fail(p, p->pos, "malformed UTF-8 (a character cut short)");
    for (int i = 1; i < n; i++) {
        if ((s[i] & 0xC0) != 0x80) return fail(p, p->pos, "malformed UTF-8 (byte 0x%02X)", s[i]);
        value = value << 6 | (s[i] & 0x3F);
    }
    if (value < min || value > MAX_CODE_POINT || (value >= 0xD800 && value <= 0xDFFF))
        return fail(p, p->pos, "malformed UTF-8 (an overlong form, a surrogate or past U+10FFFF)");
    p->pos += (size_t)n;
    *cp = value;
    return 0;
}

static int parse_hex(Parser *p, int digits, uint32_t *cp) {
    const size_t start = p->pos - 2; // the backslash
    uint32_t value = 0;
    for (int i = 0; i < digits; i++) {
        const char c = p->pos < p->length ? p->text[p->pos] : '\0';
        int d;
        if (c >= '0' && c <= '9') d = c - '0';
        else if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
        else if (c >= 'A' && c <= 'F') d = c - 'A' + 10;
        else return fail(p, start, "the escape \\%c needs %d hex digits", p->text[start + 1], digits);
        value = value * 16 + (uint32_t)d;
        p->pos++;
    }
    if (value > MAX_CODE_POINT || (value >= 0xD800 && value <= 0xDFFF))
        return fail(p, start, "the escape names U+%X, which is not a character", value);
    *cp = value;
    return 0;
}

// One character of a literal or a class: an escape or a UTF-8 character.
static int parse_char(Parser *p, uint32_t *cp) {
    if (p->text[p->pos] != '\\') return decode_utf8(p, cp);
    const size_t start = p->pos;
    if (p->pos + 1 >= p->length) return fail(p, start, "a backslash at the end of the grammar");
    const char c = p->text[p->pos + 1];
    p->pos += 2;
    switch (c) {
    case 'n': *cp = '\n'; return 0;
    case 't': *cp = '\t'; return 0;
    case 'r': *cp = '\r'; return 0;
    case '\\': case '"': case '[': case ']': *cp = (uint8_t)c; return 0;
    case 'x': return parse_hex(p, 2, cp);
    case 'u': return parse_hex(p, 4, cp);
    case 'U': return parse_hex(p, 8, cp);
    default:
        if ((uint8_t)c >= 0x20 && (uint8_t)c < 0x7F) return fail(p, start, "unknown escape \\%c", c);
        return fail(p, start, "unknown escape (a backslash before byte 0x%02X)", (uint8_t)c);
    }
}

static int by_lo(const void *a, const void *b) {
    const Range *x = a, *y = b;
    return (x->lo > y->lo) - (x->lo < y->lo);
}

// Adds a class from `count` ranges (sorted, merged, complemented if `negate`, without the
// surrogates); -1 when it holds no character.
static int add_class(Parser *p, Range *ranges, int count, bool negate) {
    if (count > 0) qsort(ranges, (size_t)count, sizeof(Range), by_lo);
    int n = 0;
    for (int i = 0; i < count; i++) {
        if (n > 0 && ranges[i].lo <= ranges[n - 1].hi + 1) {
            if (ranges[i].hi > ranges[n - 1].hi) ranges[n - 1].hi = ranges[i].hi;
        } else {
            ranges[n++] = ranges[i];
        }
    }
    // The complement (or the set itself) over the characters, the surrogates cut out: at
    // most n + 2 ranges.
    Range *out = xmalloc((size_t)(n + 3) * sizeof(Range));
    int m = 0;
    if (negate) {
        uint32_t next = 0;
        for (int i = 0; i < n; i++) {
            if (ranges[i].lo > next) out[m++] = (Range){next, ranges[i].lo - 1};
            next = ranges[i].hi + 1;
        }
        if (next <= MAX_CODE_POINT) out[m++] = (Range){next, MAX_CODE_POINT};
    } else if (n > 0) {
        memcpy(out, ranges, (size_t)n * sizeof(Range));
        m = n;
    }
    int k = 0;
    Range *final = xmalloc((size_t)(m + 2) * sizeof(Range));
    for (int i = 0; i < m; i++) {
        Range r = out[i];
        if (r.hi < 0xD800 || r.lo > 0xDFFF) final[k++] = r;
        else {
            if (r.lo < 0xD800) final[k++] = (Range){r.lo, 0xD7FF};
            if (r.hi > 0xDFFF) final[k++] = (Range){0xE000, r.hi};
        }
    }
    free(out);
    if (k == 0) {
        free(final);
        return -1;
    }
    while (p->num_ranges + k > p->ranges_capacity) {
        p->ranges_capacity = p->ranges_capacity ? 2 * p->ranges_capacity : 64;
        p->ranges = xrealloc(p->ranges, (size_t)p->ranges_capacity * sizeof(Range));
    }
    memcpy(p->ranges + p->num_ranges, final, (size_t)k * sizeof(Range));
    free(final);
    if (p->num_classes + 2 > p->classes_capacity) {
        p->classes_capacity = 2 * (p->num_classes + 2);
        p->class_first = xrealloc(p->class_first, (size_t)p->classes_capacity * sizeof(int));
    }
    p->class_first[p->num_classes] = p->num_ranges;
    p->num_ranges += k;
    p->class_first[p->num_classes + 1] = p->num_ranges;
    return p->num_classes++;
}

static int parse_literal(Parser *p, int rule, int alt) {
    const size_t start = p->pos++;
    for (;;) {
        if (p->pos >= p->length) return fail(p, start, "unterminated string literal");
        if (p->text[p->pos] == '"') {
            p->pos++;
            return 0;
        }
        uint32_t cp;
        if (parse_char(p, &cp) != 0) return -1;
        Range r = {cp, cp};
        int k = cp < 128 ? p->ascii_class[cp] : -1;
        if (k < 0) k = add_class(p, &r, 1, false);
        if (cp < 128) p->ascii_class[cp] = k;
        if (add_element(p, rule, alt, (Element){ELEMENT_CHARS, k}) != 0) return -1;
    }
}

static int parse_class(Parser *p, int rule, int alt) {
    const size_t start = p->pos++;
    bool negate = false;
    if (p->pos < p->length && p->text[p->pos] == '^') negate = true, p->pos++;
    Range *ranges = NULL;
    int count = 0;
    for (;;) {
        if (p->pos >= p->length) {
            free(ranges);
            return fail(p, start, "unterminated character class");
        }
        if (p->text[p->pos] == ']') {
            p->pos++;
            break;
        }
        uint32_t lo = 0, hi;
        const size_t at = p->pos;
        if (parse_char(p, &lo) != 0) return free(ranges), -1;
        hi = lo;
        if (p->pos + 1 < p->length && p->text[p->pos] == '-' && p->text[p->pos + 1] != ']') {
            p->pos++;
            if (parse_char(p, &hi) != 0) return free(ranges), -1;
            if (hi < lo) {
                free(ranges);
                return fail(p, at, "the range's end U+%04X comes before its start U+%04X", hi, lo);
            }
        }
        ranges = xrealloc(ranges, (size_t)(count + 1) * sizeof(Range));
        ranges[count++] = (Range){lo, hi};
    }
    const int k = add_class(p, ranges, count, negate);
    free(ranges);
    if (k < 0) return fail(p, start, "the character class matches no character");
    return add_element(p, rule, alt, (Element){ELEMENT_CHARS, k});
}

// Spaces, tabs, newlines and # comments.
static void skip_space(Parser *p) {
    while (p->pos < p->length) {
        const char c = p->text[p->pos];
        if (c == ' ' || c == '\t' || c == '\n' || c == '\r') p->pos++;
        else if (c == '#')
            while (p->pos < p->length && p->text[p->pos] != '\n') p->pos++;
        else break;
    }
}

static size_t name_end(const Parser *p, size_t at) {
    while (at < p->length && is_name_char(p->text[at])) at++;
    return at;
}

// At `name ::=` (the next rule's start)?
static bool at_rule_start(Parser *p) {
    const size_t saved = p->pos, end = name_end(p, p->pos);
    if (end == saved) return false;
    p->pos = end;
    skip_space(p);
    const bool yes = p->length - p->pos >= 3 && !memcmp(p->text + p->pos, "::=", 3);
    p->pos = saved;
    return yes;
}

static int find_rule(const Parser *p, const char *name, size_t length) {
    for (int i = 0; i < p->num_named; i++) {
        const char *other = p->rules[p->named[i]].name;
        if (strlen(other) == length && !memcmp(other, name, length)) return p->named[i];
    }
    return -1;
}

static int parse_alternatives(Parser *p, int rule, int nesting);

// Replaces the item at [atom, end) of rule's alternative alt by its repetition {min, max}
// (max -1: unbounded): min copies, then a rule R ::= ITEM R | "" (unbounded) or a chain of
// max - min nested optional rules R_k ::= ITEM R_(k-1) | "" (each a tail reference, so a
// stack does not deepen).
static int repeat(Parser *p, int rule, int alt, int atom, int min, int max, size_t at) {
    ElementList *list = &p->rules[rule].alts[alt];
    const int n = list->count - atom;
    if (n == 0) return fail(p, at, "nothing to repeat (an empty literal)");
    Element *item = xmalloc((size_t)n * sizeof(Element));
    memcpy(item, list->items + atom, (size_t)n * sizeof(Element));
    list->count = atom;
    p->num_elements -= n;
    int rc = 0;
    for (int i = 0; i < min && rc == 0; i++)
        for (int j = 0; j < n && rc == 0; j++) rc = add_element(p, rule, alt, item[j]);
    if (rc == 0 && max == -1) {
        const int r = new_rule(p, NULL, 0, at);
        const int a = new_alt(p, r);
        new_alt(p, r);
        for (int j = 0; j < n && rc == 0; j++) rc = add_element(p, r, a, item[j]);
        if (rc == 0) rc = add_element(p, r, a, (Element){ELEMENT_REF, r});
        if (rc == 0) rc = add_element(p, rule, alt, (Element){ELEMENT_REF, r});
    } else if (rc == 0 && max > min) {
        int previous = -1;
        for (int k = 0; k < max - min && rc == 0; k++) {
            const int r = new_rule(p, NULL, 0, at);
            const int a = new_alt(p, r);
            new_alt(p, r);
            for (int j = 0; j < n && rc == 0; j++) rc = add_element(p, r, a, item[j]);
            if (rc == 0 && previous >= 0) rc = add_element(p, r, a, (Element){ELEMENT_REF, previous});
            previous = r;
        }
        if (rc == 0) rc = add_element(p, rule, alt, (Element){ELEMENT_REF, previous});
    }
    free(item);
    return rc;
}

static int parse_count(Parser *p, int *value) {
    const size_t start = p->pos;
    if (p->pos >= p->length || p->text[p->pos] < '0' || p->text[p->pos] > '9')
        return fail(p, p->pos, "expected a number in the repetition { }");
    long v = 0;
    while (p->pos < p->length && p->text[p->pos] >= '0' && p->text[p->pos] <= '9') {
        v = v * 10 + (p->text[p->pos++] - '0');
        if (v > GRAMMAR_MAX_REPEAT)
            return fail(p, start, "a repetition bound above %d (a cap of this implementation)", GRAMMAR_MAX_REPEAT);
    }
    *value = (int)v;
    return 0;
}

// {m}, {m,} or {m,n} after an item; p->pos at '{'.
static int parse_bounds(Parser *p, int *min, int *max) {
    const size_t start = p->pos++;
    skip_space(p);
    if (parse_count(p, min) != 0) return -1;
    skip_space(p);
    if (p->pos < p->length && p->text[p->pos] == '}') {
        *max = *min;
    } else if (p->pos < p->length && p->text[p->pos] == ',') {
        p->pos++;
        skip_space(p);
        *max = -1;
        if (p->pos < p->length && p->text[p->pos] >= '0' && p->text[p->pos] <= '9' && parse_count(p, max) != 0)
            return -1;
        skip_space(p);
    } else {
        return fail(p, p->pos, "expected ',' or '}' in the repetition { }");
    }
    if (p->pos >= p->length || p->text[p->pos] != '}') return fail(p, p->pos, "expected '}' to close the repetition");
    p->pos++;
    if (*max >= 0 && *max < *min) return fail(p, start, "the repetition {%d,%d} has its bounds reversed", *min, *max);
    return 0;
}

// One alternative: items, each with its repetitions, up to '|', ')', the next rule or the end.
static int parse_sequence(Parser *p, int rule, int alt, int nesting) {
    for (;;) {
        skip_space(p);
        if (p->pos >= p->length) return 0;
        const char c = p->text[p->pos];
        if (c == '|' || c == ')') return 0;
        if (at_rule_start(p)) {
            if (nesting > 0) return fail(p, p->pos, "a rule definition inside parentheses (a ')' is missing)");
            return 0;
        }
        const int atom = p->rules[rule].alts[alt].count;
        const size_t at = p->pos;
        if (c == '"') {
            if (parse_literal(p, rule, alt) != 0) return -1;
        } else if (c == '[') {
            if (parse_class(p, rule, alt) != 0) return -1;
        } else if (c == '.') {
            p->pos++;
            if (add_element(p, rule, alt, (Element){ELEMENT_CHARS, p->any_class}) != 0) return -1;
        } else if (c == '(') {
            if (nesting + 1 > GRAMMAR_MAX_NESTING)
                return fail(p, at, "groups nested more than %d deep (a cap of this implementation)", GRAMMAR_MAX_NESTING);
            p->pos++;
            const int group = new_rule(p, NULL, 0, at);
            if (parse_alternatives(p, group, nesting + 1) != 0) return -1;
            skip_space(p);
            if (p->pos >= p->length || p->text[p->pos] != ')') return fail(p, at, "the group '(' is never closed");
            p->pos++;
            if (add_element(p, rule, alt, (Element){ELEMENT_REF, group}) != 0) return -1;
        } else if (is_name_char(c)) {
            const size_t end = name_end(p, p->pos);
            int target = find_rule(p, p->text + p->pos, end - p->pos);
            if (target < 0) target = new_rule(p, p->text + p->pos, end - p->pos, p->pos);
            p->pos = end;
            if (add_element(p, rule, alt, (Element){ELEMENT_REF, target}) != 0) return -1;
        } else if (c == '<') {
            return fail(p, at, "token references <...> are not supported");
        } else if (c == '*' || c == '+' || c == '?' || c == '{') {
            return fail(p, at, "'%c' has nothing to repeat", c);
        } else if ((uint8_t)c >= 0x20 && (uint8_t)c < 0x7F) {
            return fail(p, at, "unexpected '%c'", c);
        } else {
            return fail(p, at, "unexpected byte 0x%02X", (uint8_t)c);
        }
        for (;;) { // repetitions, each applying to what came before it
            skip_space(p);
            if (p->pos >= p->length) break;
            const char op = p->text[p->pos];
            const size_t op_at = p->pos;
            int min, max;
            if (op == '*') min = 0, max = -1, p->pos++;
            else if (op == '+') min = 1, max = -1, p->pos++;
            else if (op == '?') min = 0, max = 1, p->pos++;
            else if (op == '{') {
                if (parse_bounds(p, &min, &max) != 0) return -1;
            } else break;
            if (repeat(p, rule, alt, atom, min, max, op_at) != 0) return -1;
        }
    }
}

static int parse_alternatives(Parser *p, int rule, int nesting) {
    if (parse_sequence(p, rule, new_alt(p, rule), nesting) != 0) return -1;
    while (p->pos < p->length && p->text[p->pos] == '|') {
        p->pos++;
        if (parse_sequence(p, rule, new_alt(p, rule), nesting) != 0) return -1;
    }
    return 0;
}

static int parse_grammar(Parser *p) {
    skip_space(p);
    if (p->pos >= p->length) return fail(p, p->pos, "the grammar is empty (it needs a 'root' rule)");
    while (p->pos < p->length) {
        const size_t at = p->pos, end = name_end(p, p->pos);
        if (end == at) {
            const char c = p->text[at];
            if ((uint8_t)c >= 0x20 && (uint8_t)c < 0x7F) return fail(p, at, "expected a rule name, not '%c'", c);
            return fail(p, at, "expected a rule name, not byte 0x%02X", (uint8_t)c);
        }
        int rule = find_rule(p, p->text + at, end - at);
        if (rule >= 0 && p->rules[rule].defined)
            return fail(p, at, "the rule '%s' is defined twice", p->rules[rule].name);
        if (rule < 0) rule = new_rule(p, p->text + at, end - at, at);
        p->rules[rule].defined = true, p->rules[rule].at = at;
        p->current = rule;
        p->pos = end;
        skip_space(p);
        if (p->length - p->pos < 3 || memcmp(p->text + p->pos, "::=", 3) != 0)
            return fail(p, p->pos, "expected '::=' after the rule name '%s'", p->rules[rule].name);
        p->pos += 3;
        if (parse_alternatives(p, rule, 0) != 0) return -1;
        if (p->pos < p->length && p->text[p->pos] == ')') return fail(p, p->pos, "a ')' that closes no group");
        skip_space(p);
    }
    return 0;
}

// --- checks ------------------------------------------------------------------------------------

// Marks, to a fixed point, the rules with an alternative whose every element is marked or,
// if `characters`, a character class: the rules that can match the empty text (characters
// false) or some finite text (characters true).
static void mark_rules(const Parser *p, bool characters, bool *marked) {
    for (bool changed = true; changed;) {
        changed = false;
        for (int r = 0; r < p->num_rules; r++) {
            if (marked[r]) continue;
            for (int a = 0; a < p->rules[r].num_alts && !marked[r]; a++) {
                const ElementList *alt = &p->rules[r].alts[a];
                bool all = true;
                for (int i = 0; i < alt->count && all; i++)
                    all = alt->items[i].kind == ELEMENT_REF ? marked[alt->items[i].value] : characters;
                if (all) marked[r] = changed = true;
            }
        }
    }
}

// Undefined rules, no root, left recursion, rules that cannot finish. Returns the root's index.
static int check_rules(Parser *p) {
    const int n = p->num_rules;
    for (int r = 0; r < n; r++)
        if (p->rules[r].name && !p->rules[r].defined)
            return fail(p, p->rules[r].at, "the rule '%s' is used but never defined", p->rules[r].name);
    const int root = find_rule(p, "root", 4);
    if (root < 0) return fail(p, 0, "no rule is named 'root' (the start)");

    bool *nullable = xcalloc((size_t)n, sizeof(bool));
    mark_rules(p, false, nullable);
    // Left recursion: a cycle among "r can begin with s" (s referenced after only nullable
    // elements), found by an iterative depth-first search.
    int *edge_first = xcalloc((size_t)n + 1, sizeof(int)), *edges = NULL, num_edges = 0;
    for (int r = 0; r < n; r++) {
        edge_first[r] = num_edges;
        for (int a = 0; a < p->rules[r].num_alts; a++) {
            const ElementList *alt = &p->rules[r].alts[a];
            for (int i = 0; i < alt->count && alt->items[i].kind == ELEMENT_REF; i++) {
                edges = xrealloc(edges, (size_t)(num_edges + 1) * sizeof(int));
                edges[num_edges++] = alt->items[i].value;
                if (!nullable[alt->items[i].value]) break;
            }
        }
    }
    edge_first[n] = num_edges;
    int *color = xcalloc((size_t)n, sizeof(int)); // 0 unvisited, 1 on the path, 2 done
    int *path = xmalloc((size_t)n * sizeof(int)), *next_edge = xmalloc((size_t)n * sizeof(int));
    int rc = 0;
    for (int start = 0; start < n && rc == 0; start++) {
        if (color[start]) continue;
        int depth = 0;
        path[depth] = start, next_edge[depth] = edge_first[start], color[start] = 1, depth++;
        while (depth > 0 && rc == 0) {
            const int r = path[depth - 1];
            if (next_edge[depth - 1] == edge_first[r + 1]) {
                color[r] = 2, depth--;
                continue;
            }
            const int s = edges[next_edge[depth - 1]++];
            if (color[s] == 1) { // a cycle: name a written rule on it
                int named = s;
                for (int k = depth - 1; k >= 0 && path[k] != s; k--)
                    if (p->rules[path[k]].name) named = path[k];
                if (p->rules[s].name) named = s;
                rc = fail(p, p->rules[p->rules[named].owner].at, "the rule '%s' is left-recursive (it can begin with "
                          "itself): write the repetition with * or + or as right recursion", rule_label(p, named));
            } else if (color[s] == 0) {
                path[depth] = s, next_edge[depth] = edge_first[s], color[s] = 1, depth++;
            }
        }
    }
    free(edge_first), free(edges), free(color), free(path), free(next_edge), free(nullable);
    if (rc != 0) return -1;

    // Rules reachable from root, and those that can finish (match some finite text).
    bool *reachable = xcalloc((size_t)n, sizeof(bool)), *finite = xcalloc((size_t)n, sizeof(bool));
    int *todo = xmalloc((size_t)n * sizeof(int)), count = 0;
    reachable[root] = true, todo[count++] = root;
    while (count > 0) {
        const Rule *r = &p->rules[todo[--count]];
        for (int a = 0; a < r->num_alts; a++)
            for (int i = 0; i < r->alts[a].count; i++) {
                const Element *e = &r->alts[a].items[i];
                if (e->kind == ELEMENT_REF && !reachable[e->value]) reachable[e->value] = true, todo[count++] = e->value;
            }
    }
    mark_rules(p, true, finite);
    // A written rule first, so that the message names what the user wrote.
    for (int pass = 0; pass < 2 && rc == 0; pass++)
        for (int r = 0; r < n && rc == 0; r++)
            if (reachable[r] && !finite[r] && (pass == 1 || p->rules[r].name))
                rc = fail(p, p->rules[p->rules[r].owner].at, "the rule '%s' matches no finite text (every alternative "
                          "needs itself again)%s", rule_label(p, r), p->rules[r].name ? "" : " in a group or repetition");
    free(reachable), free(finite), free(todo);
    return rc != 0 ? -1 : root;
}

// --- the compiled grammar and its recogniser ----------------------------------------------

struct GrammarConstraint {
    Element *elements; // [REF root, END], then every rule's alternatives, each ended by END
    int num_elements;
    int *alt_start;    // rule r's alternatives: alt_start[rule_alt[r] .. rule_alt[r + 1])
    int *rule_alt;
    int num_rules;
    Range *ranges;
    int *class_first;
    uint64_t (*ascii)[2]; // per class: its characters below 128, as bits
    int num_classes;
    // The expansion of each position x, computed once: a stack B x (B below) expands to B F
    // for every fragment F of x, and, where x's frame can finish (ends[x]), to the
    // expansion of B as well. Position x's fragments are at fragments[fragment_first[x] ..
    // fragment_first[x + 1]), each its length, then its elements bottom to top.
    int32_t *fragment_first;
    int32_t *fragments;
    uint8_t *ends;
    GrammarState start;
};

static bool class_contains(const GrammarConstraint *g, int k, uint32_t cp) {
    if (cp < 128) return (g->ascii[k][cp >> 6] >> (cp & 63)) & 1;
    int lo = g->class_first[k], hi = g->class_first[k + 1] - 1;
    while (lo <= hi) { // the range whose span could hold cp
        const int mid = (lo + hi) / 2;
        if (g->ranges[mid].hi < cp) lo = mid + 1;
        else if (g->ranges[mid].lo > cp) hi = mid - 1;
        else return true;
    }
    return false;
}

// Does class k hold a character in [lo, hi]?
static bool class_meets(const GrammarConstraint *g, int k, uint32_t lo, uint32_t hi) {
    int a = g->class_first[k], b = g->class_first[k + 1];
    while (a < b) { // the first range that ends at or after lo
        const int mid = (a + b) / 2;
        if (g->ranges[mid].hi < lo) a = mid + 1;
        else b = mid;
    }
    return a < g->class_first[k + 1] && g->ranges[a].lo <= hi;
}

static bool same(const int32_t *a, const int32_t *b, int n) {
    for (int i = 0; i < n; i++)
        if (a[i] != b[i]) return false;
    return true;
}

// Adds the stack below + fragment to the state unless an equal one is among its first
// `earlier` stacks (the expansion of one stack never repeats itself: only what other stacks
// expanded to can be equal); past a bound it is dropped.
static void emit(GrammarState *out, int earlier, const int32_t *below, int below_length, const int32_t *fragment,
                 int fragment_length) {
    const int length = below_length + fragment_length;
    for (int i = 0, at = 0; i < earlier; i++) {
        const int32_t *stack = out->pool + at + 1;
        const int n = out->pool[at];
        if (n == length && same(stack, below, below_length) && same(stack + below_length, fragment, fragment_length)) return;
        at += n + 1;
    }
    if (out->num_stacks == GRAMMAR_MAX_STACKS || out->used + length + 1 > GRAMMAR_MAX_ITEMS) {
        out->overflow = 1;
        return;
    }
    int32_t *stack = out->pool + out->used;
    stack[0] = length;
    memcpy(stack + 1, below, (size_t)below_length * sizeof(int32_t));
    memcpy(stack + 1 + below_length, fragment, (size_t)fragment_length * sizeof(int32_t));
    out->used += length + 1;
    out->num_stacks++;
}

static const int32_t no_elements[1] = {0}; // an empty stack's (non-NULL) elements

// Adds to *out the expansion of the stack below + [x]: x's fragments on top of below, then,
// while the frame on top can finish, the same for the frame under it.
static void expand(const GrammarConstraint *g, const int32_t *below, int length, int32_t x, GrammarState *out) {
    const int earlier = out->num_stacks;
    for (;;) {
        for (int at = g->fragment_first[x]; at < g->fragment_first[x + 1]; at += g->fragments[at] + 1)
            emit(out, earlier, below, length, g->fragments + at + 1, g->fragments[at]);
        if (!g->ends[x]) return;
        if (length == 0) { // the text may end here
            emit(out, earlier, no_elements, 0, no_elements, 0);
            return;
        }
        x = below[--length];
    }
}

void grammar_state_copy(GrammarState *dst, const GrammarState *src) {
    dst->num_stacks = src->num_stacks;
    dst->used = src->used;
    dst->utf8_value = src->utf8_value;
    dst->utf8_need = src->utf8_need;
    dst->utf8_next_lo = src->utf8_next_lo, dst->utf8_next_hi = src->utf8_next_hi;
    dst->overflow = src->overflow;
    memcpy(dst->pool, src->pool, (size_t)src->used * sizeof(int32_t));
}

void grammar_state_init(const GrammarConstraint *g, GrammarState *state) { grammar_state_copy(state, &g->start); }

static void clear(GrammarState *out, const GrammarState *from) {
    out->num_stacks = 0, out->used = 0;
    out->utf8_value = 0, out->utf8_need = 0, out->utf8_next_lo = 0, out->utf8_next_hi = 0;
    out->overflow = from->overflow;
}

// The stacks whose top class holds a character in [lo, hi] (a character partly fed).
static void keep_meeting(const GrammarConstraint *g, const GrammarState *state, uint32_t lo, uint32_t hi,
                         GrammarState *out) {
    for (int i = 0, at = 0; i < state->num_stacks; i++) {
        const int n = state->pool[at];
        if (n > 0 && class_meets(g, g->elements[state->pool[at + n]].value, lo, hi)) {
            memcpy(out->pool + out->used, state->pool + at, (size_t)(n + 1) * sizeof(int32_t));
            out->used += n + 1;
            out->num_stacks++;
        }
        at += n + 1;
    }
}

// The stacks after character cp: each whose top holds it moves past it and is expanded.
static void advance(const GrammarConstraint *g, const GrammarState *state, uint32_t cp, GrammarState *out) {
    for (int i = 0, at = 0; i < state->num_stacks; i++) {
        const int n = state->pool[at];
        if (n > 0) {
            const int position = state->pool[at + n];
            if (class_contains(g, g->elements[position].value, cp)) expand(g, state->pool + at + 1, n - 1, position + 1, out);
        }
        at += n + 1;
    }
}

static _Thread_local GrammarState in_place;

bool grammar_state_feed(const GrammarConstraint *g, const GrammarState *state, uint8_t byte, GrammarState *out) {
    if (out == state) {
        grammar_state_copy(&in_place, state);
        state = &in_place;
    }
    clear(out, state);
    if (state->num_stacks == 0) return false;
    uint32_t value;
    int need;
    uint8_t next_lo = 0x80, next_hi = 0xBF;
    if (state->utf8_need == 0) { // a character's first byte
        if (byte < 0x80) {
            advance(g, state, byte, out);
            return out->num_stacks > 0;
        }
        if (byte >= 0xC2 && byte <= 0xDF) need = 1, value = byte & 0x1F;
        else if (byte >= 0xE0 && byte <= 0xEF) need = 2, value = byte & 0x0F;
        else if (byte >= 0xF0 && byte <= 0xF4) need = 3, value = byte & 0x07;
        else return false;
        // The second byte's range keeps out overlong forms, surrogates and past U+10FFFF.
        if (byte == 0xE0) next_lo = 0xA0;
        else if (byte == 0xED) next_hi = 0x9F;
        else if (byte == 0xF0) next_lo = 0x90;
        else if (byte == 0xF4) next_hi = 0x8F;
    } else {
        if (byte < state->utf8_next_lo || byte > state->utf8_next_hi) return false;
        value = state->utf8_value << 6 | (byte & 0x3F);
        need = state->utf8_need - 1;
        if (need == 0) {
            advance(g, state, value, out);
            return out->num_stacks > 0;
        }
    }
    // The characters this prefix can still become: from the lowest next byte and zeros to
    // the highest next byte and ones.
    const int rest = 6 * (need - 1);
    const uint32_t lo = (value << 6 | (next_lo & 0x3F)) << rest;
    const uint32_t hi = (value << 6 | (next_hi & 0x3F)) << rest | ((1u << rest) - 1);
    keep_meeting(g, state, lo, hi, out);
    if (out->num_stacks == 0) return false;
    out->utf8_value = value, out->utf8_need = (uint8_t)need;
    out->utf8_next_lo = next_lo, out->utf8_next_hi = next_hi;
    return true;
}

bool grammar_state_feed_bytes(const GrammarConstraint *g, GrammarState *state, const char *bytes, size_t length) {
    for (size_t i = 0; i < length; i++)
        if (!grammar_state_feed(g, state, (uint8_t)bytes[i], state)) return false;
    return state->num_stacks > 0;
}

bool grammar_state_accepts(const GrammarConstraint *g, const GrammarState *state) {
    (void)g;
    if (state->utf8_need) return false;
    for (int i = 0, at = 0; i < state->num_stacks; i++) {
        if (state->pool[at] == 0) return true;
        at += state->pool[at] + 1;
    }
    return false;
}

bool grammar_constraint_matches(const GrammarConstraint *g, const char *text, size_t length) {
    GrammarState *state = xmalloc(sizeof *state);
    grammar_state_init(g, state);
    const bool ok = grammar_state_feed_bytes(g, state, text, length) && grammar_state_accepts(g, state);
    free(state);
    return ok;
}

int grammar_constraint_num_rules(const GrammarConstraint *g) { return g->num_rules; }

// The fragments of every position (grammar_constraint.c's struct): a depth-first expansion
// of the stack [x] alone, where reaching the empty stack means x's frame can finish.
// Positions with more fragments than a state holds stacks (a state reaching them would
// overflow) are refused, naming the rule; so is a grammar whose expansion takes more than
// MAX_EXPANSION_STEPS (alternatives that lead to the same place in exponentially many ways).
#define MAX_EXPANSION_STEPS 20000000L
#define MAX_FRAGMENT_ITEMS 8000000L
static int build_fragments(const Parser *p, GrammarConstraint *g, const int *position_rule) {
    const int n = g->num_elements;
    g->fragment_first = xmalloc((size_t)(n + 1) * sizeof(int32_t));
    g->ends = xcalloc((size_t)n, 1);
    long used = 0, capacity = 1024, work_capacity = 1024, steps = 0;
    g->fragments = xmalloc((size_t)capacity * sizeof(int32_t));
    int32_t *work = xmalloc((size_t)work_capacity * sizeof(int32_t)); // stacks, each its elements then its length
    int rc = 0;
    for (int x = 0; x < n && rc == 0; x++) {
        g->fragment_first[x] = (int32_t)used;
        int count = 0;
        long top = 0;
        work[top++] = x, work[top++] = 1;
        while (top > 0 && rc == 0) {
            if (++steps > MAX_EXPANSION_STEPS) {
                rc = fail(p, p->rules[p->rules[position_rule[x]].owner].at, "expanding the rules takes more than %ld "
                          "steps (a cap of this implementation: alternatives that lead to the same place in too many "
                          "ways, near the rule '%s')", MAX_EXPANSION_STEPS, rule_label(p, position_rule[x]));
                break;
            }
            int length = work[top - 1];
            const long base = top - 1 - length;
            if (length == 0) { // x's frame is done: the stack under it continues
                g->ends[x] = 1;
                top = base;
                continue;
            }
            const int position = work[base + length - 1];
            const Element *e = &g->elements[position];
            if (e->kind == ELEMENT_CHARS) {
                bool seen = false;
                for (long at = g->fragment_first[x]; at < used && !seen; at += g->fragments[at] + 1)
                    seen = g->fragments[at] == length && !memcmp(g->fragments + at + 1, work + base, (size_t)length * sizeof(int32_t));
                if (!seen && ++count > GRAMMAR_MAX_STACKS) { // named by the rule of the character reached
                    const int r = position_rule[position];
                    rc = fail(p, p->rules[p->rules[r].owner].at, "the rule '%s' can continue in more than %d ways at "
                              "once (the parse stacks a state holds; a cap of this implementation)", rule_label(p, r),
                              GRAMMAR_MAX_STACKS);
                } else if (!seen && used + length + 1 > MAX_FRAGMENT_ITEMS) {
                    rc = fail(p, p->rules[p->rules[position_rule[x]].owner].at, "the grammar's expansions need more than "
                              "%ld entries (a cap of this implementation)", MAX_FRAGMENT_ITEMS);
                } else if (!seen) {
                    while (used + length + 1 > capacity) capacity *= 2;
                    g->fragments = xrealloc(g->fragments, (size_t)capacity * sizeof(int32_t));
                    g->fragments[used] = length;
                    memcpy(g->fragments + used + 1, work + base, (size_t)length * sizeof(int32_t));
                    used += length + 1;
                }
                top = base;
                continue;
            }
            if (e->kind == ELEMENT_END) { // the alternative is done: back to the rule that called it
                work[base + length - 1] = length - 1;
                top--;
                continue;
            }
            // A rule: what follows it stays below (nothing when it ends the alternative: a tail
            // call), and each alternative goes on top of a copy.
            if (g->elements[position + 1].kind == ELEMENT_END) length--;
            else work[base + length - 1] = position + 1;
            const int first = g->rule_alt[e->value], alts = g->rule_alt[e->value + 1] - first;
            const long needed = base + (long)alts * (length + 2);
            if (needed > work_capacity) {
                while (needed > work_capacity) work_capacity *= 2;
                work = xrealloc(work, (size_t)work_capacity * sizeof(int32_t));
            }
            for (int k = alts - 1; k >= 0; k--) {
                int32_t *copy = work + base + (long)k * (length + 2);
                if (k > 0) memcpy(copy, work + base, (size_t)length * sizeof(int32_t));
                copy[length] = g->alt_start[first + k];
                copy[length + 1] = length + 1;
            }
            top = needed;
        }
    }
    g->fragment_first[n] = (int32_t)used;
    free(work);
    return rc;
}

static void parser_free(Parser *p) {
    for (int r = 0; r < p->num_rules; r++) {
        for (int a = 0; a < p->rules[r].num_alts; a++) free(p->rules[r].alts[a].items);
        free(p->rules[r].alts);
        free(p->rules[r].name);
    }
    free(p->rules);
    free(p->named);
    free(p->ranges);
    free(p->class_first);
}

int grammar_constraint_compile(GrammarConstraint **out, const char *text, size_t length, const char *what) {
    *out = NULL;
    Parser p = {.text = text, .length = length, .what = what};
    for (int c = 0; c < 128; c++) p.ascii_class[c] = -1;
    Range any = {0, MAX_CODE_POINT};
    p.any_class = add_class(&p, &any, 1, false);
    int root = -1;
    if (memchr(text, '\0', length)) {
        fail(&p, (size_t)((const char *)memchr(text, '\0', length) - text), "a NUL byte in the grammar");
    } else if (parse_grammar(&p) == 0) {
        root = check_rules(&p);
    }
    if (root < 0) {
        parser_free(&p);
        return -1;
    }
    // Flatten: [REF root, END], then each rule's alternatives, each followed by END.
    GrammarConstraint *g = xcalloc(1, sizeof *g);
    g->num_rules = p.num_rules;
    int num_alts = 0;
    long num_elements = 2;
    for (int r = 0; r < p.num_rules; r++) {
        num_alts += p.rules[r].num_alts;
        for (int a = 0; a < p.rules[r].num_alts; a++) num_elements += p.rules[r].alts[a].count + 1;
    }
    g->elements = xmalloc((size_t)num_elements * sizeof(Element));
    g->alt_start = xmalloc((size_t)(num_alts ? num_alts : 1) * sizeof(int));
    g->rule_alt = xmalloc((size_t)(p.num_rules + 1) * sizeof(int));
    int *position_rule = xmalloc((size_t)num_elements * sizeof(int)); // for messages
    int e = 0, alt = 0;
    position_rule[0] = position_rule[1] = root;
    g->elements[e++] = (Element){ELEMENT_REF, root};
    g->elements[e++] = (Element){ELEMENT_END, 0};
    for (int r = 0; r < p.num_rules; r++) {
        g->rule_alt[r] = alt;
        for (int a = 0; a < p.rules[r].num_alts; a++) {
            g->alt_start[alt++] = e;
            if (p.rules[r].alts[a].count > 0)
                memcpy(g->elements + e, p.rules[r].alts[a].items, (size_t)p.rules[r].alts[a].count * sizeof(Element));
            for (int i = 0; i <= p.rules[r].alts[a].count; i++) position_rule[e + i] = r;
            e += p.rules[r].alts[a].count;
            g->elements[e++] = (Element){ELEMENT_END, 0};
        }
    }
    g->rule_alt[p.num_rules] = alt;
    g->num_elements = e;
    g->ranges = p.ranges, g->class_first = p.class_first, g->num_classes = p.num_classes;
    p.ranges = NULL, p.class_first = NULL;
    g->ascii = xcalloc((size_t)g->num_classes, sizeof *g->ascii);
    for (int k = 0; k < g->num_classes; k++)
        for (int i = g->class_first[k]; i < g->class_first[k + 1]; i++)
            for (uint32_t cp = g->ranges[i].lo; cp <= g->ranges[i].hi && cp < 128; cp++)
                g->ascii[k][cp >> 6] |= 1ull << (cp & 63);
    const int rc = build_fragments(&p, g, position_rule);
    free(position_rule);
    parser_free(&p);
    if (rc != 0) {
        grammar_constraint_free(g);
        return -1;
    }
    // The start: the root expanded.
    clear(&g->start, &g->start);
    g->start.overflow = 0;
    expand(g, no_elements, 0, 0, &g->start);
    if (g->start.overflow) {
        grammar_constraint_free(g);
        return err_set("%s: the grammar can begin in more ways than the recogniser holds (%d parse stacks of %d "
                       "entries in all; a cap of this implementation)", what, GRAMMAR_MAX_STACKS, GRAMMAR_MAX_ITEMS);
    }
    *out = g;
    return 0;
}

void grammar_constraint_free(GrammarConstraint *g) {
    if (!g) return;
    free(g->elements), free(g->alt_start), free(g->rule_alt);
    free(g->ranges), free(g->class_first), free(g->ascii);
    free(g->fragment_first), free(g->fragments), free(g->ends);
    free(g);
}
