// The gold sentiment score of the Jane Austen task; see lexicon.h for the exact rules.
#include "eval/lexicon.h"

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/check.h"
#include "core/hash.h"

typedef struct {
    char *phrase; // NULL: empty slot
    size_t len;
    double valence;
} LexEntry;

struct Lexicon {
    LexEntry *slots;
    size_t capacity; // a power of two, at least twice the count
    long count;
    int longest; // words in the longest phrase
};

static LexEntry *find_slot(const Lexicon *lex, const char *s, size_t n) {
    size_t mask = lex->capacity - 1;
    // FNV-1a from the start this table always had (a digit short of HASH_FNV1A_START: any start
    // spreads the words; kept so the table's layout is what it was).
    for (size_t i = (size_t)hash_bytes(1469598103934665603ull, s, n) & mask;; i = (i + 1) & mask) {
        LexEntry *e = &lex->slots[i];
        if (!e->phrase || (e->len == n && memcmp(e->phrase, s, n) == 0)) return e;
    }
}

static void grow(Lexicon *lex) {
    LexEntry *old = lex->slots;
    size_t old_capacity = lex->capacity;
    lex->capacity = old_capacity ? old_capacity * 2 : 1024;
    lex->slots = xcalloc(lex->capacity, sizeof *lex->slots);
    for (size_t i = 0; i < old_capacity; i++)
        if (old[i].phrase) *find_slot(lex, old[i].phrase, old[i].len) = old[i];
    free(old);
}

static int is_word_byte(unsigned char c) {
    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '\'';
}

// PHRASE of a lexicon line: words of [a-z0-9'] without an apostrophe at either end,
// joined by single spaces. Returns the word count, or 0 if the phrase is malformed.
static int phrase_words(const char *s, size_t n) {
    int words = 0;
    size_t i = 0;
    for (;;) {
        size_t start = i;
        while (i < n && s[i] != ' ') {
            if (!is_word_byte((unsigned char)s[i])) return 0;
            i++;
        }
        if (i == start || s[start] == '\'' || s[i - 1] == '\'') return 0;
        words++;
        if (i == n) return words;
        i++; // the space; a word must follow
        if (i == n) return 0;
    }
}

// VALENCE: -?[0-9]+(\.[0-9]+)?
static int valence_ok(const char *s, size_t n) {
    size_t i = 0;
    if (i < n && s[i] == '-') i++;
    size_t digits = i;
    while (i < n && s[i] >= '0' && s[i] <= '9') i++;
    if (i == digits) return 0;
    if (i < n && s[i] == '.') {
        i++;
        size_t frac = i;
        while (i < n && s[i] >= '0' && s[i] <= '9') i++;
        if (i == frac) return 0;
    }
    return i == n;
}

static int parse_line(Lexicon *lex, const char *line, size_t n, const char *path, long lineno) {
    const char *tab = memchr(line, '\t', n);
    if (!tab) return err_set("lexicon line has no tab between phrase and valence (%s:%ld)", path, lineno);
    size_t phrase_len = (size_t)(tab - line);
    const char *val = tab + 1;
    size_t val_len = n - phrase_len - 1;
    int words = phrase_words(line, phrase_len);
    if (words == 0)
        return err_set("lexicon phrase must be words of [a-z0-9'] (no apostrophe at either end) "
                       "joined by single spaces (%s:%ld)", path, lineno);
    if (words > LEXICON_MAX_PHRASE_WORDS)
        return err_set("lexicon phrase has %d words, over the limit of %d (%s:%ld)", words,
                       LEXICON_MAX_PHRASE_WORDS, path, lineno);
    if (!valence_ok(val, val_len))
        return err_set("lexicon valence must be -?[0-9]+(.[0-9]+)? (%s:%ld)", path, lineno);
    char *number = xmalloc(val_len + 1);
    memcpy(number, val, val_len);
    number[val_len] = '\0';
    double valence = strtod(number, NULL);
    free(number);
    if (!isfinite(valence)) return err_set("lexicon valence out of range (%s:%ld)", path, lineno);
    if ((size_t)(lex->count + 1) * 2 > lex->capacity) grow(lex);
    LexEntry *e = find_slot(lex, line, phrase_len);
    if (e->phrase)
        return err_set("lexicon phrase '%.*s' given twice (%s:%ld)", (int)phrase_len, line, path, lineno);
    e->phrase = xmalloc(phrase_len + 1);
    memcpy(e->phrase, line, phrase_len);
    e->phrase[phrase_len] = '\0';
    e->len = phrase_len;
    e->valence = valence;
    lex->count++;
    if (words > lex->longest) lex->longest = words;
    return 0;
}

int lexicon_load(Lexicon **out, const char *tsv_path) {
    *out = NULL;
    FILE *f = fopen(tsv_path, "rb");
    if (!f) return err_set("cannot open lexicon %s: %s", tsv_path, strerror(errno));
    Lexicon *lex = xcalloc(1, sizeof *lex);
    grow(lex);
    char *line = NULL;
    size_t cap = 0;
    long lineno = 0;
    int rc = 0;
    ssize_t got;
    while ((got = getline(&line, &cap, f)) >= 0) {
        lineno++;
        size_t n = (size_t)got;
        if (n > 0 && line[n - 1] == '\n') n--;
        if (n == 0 || line[0] == '#') continue;
        if (memchr(line, '\0', n)) {
            rc = err_set("lexicon line contains a NUL byte (%s:%ld)", tsv_path, lineno);
            break;
        }
        if ((rc = parse_line(lex, line, n, tsv_path, lineno)) != 0) break;
    }
    if (rc == 0 && ferror(f)) rc = err_set("read error after line %ld (%s)", lineno, tsv_path);
    if (rc == 0 && lex->count == 0) rc = err_set("lexicon has no entries (%s)", tsv_path);
    free(line);
    fclose(f);
    if (rc != 0) {
        lexicon_free(lex);
        return -1;
    }
    *out = lex;
    return 0;
}

void lexicon_parts(const Lexicon *lex, const char *text, size_t len, double *sum, long *words) {
    // The words, joined by single spaces into norm; word w is norm[start[w], start[w]+size[w]).
    char *norm = xmalloc(len + 1);
    size_t *start = xmalloc((len / 2 + 1) * sizeof *start);
    size_t *size = xmalloc((len / 2 + 1) * sizeof *size);
    size_t n_norm = 0;
    long n = 0;
    size_t run = 0; // bytes of the current run, at norm + n_norm
    for (size_t i = 0; i <= len; i++) {
        unsigned char c = 0; // one past the end: a separator
        if (i < len) {
            c = (unsigned char)text[i];
            if (c == 0xE2 && i + 2 < len && (unsigned char)text[i + 1] == 0x80 &&
                ((unsigned char)text[i + 2] == 0x98 || (unsigned char)text[i + 2] == 0x99)) {
                c = '\'';
                i += 2;
            } else if (c >= 'A' && c <= 'Z') {
                c = (unsigned char)(c - 'A' + 'a');
            }
        }
        if (i < len && is_word_byte(c)) {
            norm[n_norm + run++] = (char)c;
            continue;
        }
        // End of a run: strip apostrophes at both ends; keep it if anything is left.
        size_t a = 0, b = run;
        while (a < b && norm[n_norm + a] == '\'') a++;
        while (b > a && norm[n_norm + b - 1] == '\'') b--;
        if (b > a) {
            size_t at = n_norm + (n > 0);
            memmove(norm + at, norm + n_norm + a, b - a);
            if (n > 0) norm[n_norm] = ' ';
            start[n] = at;
            size[n] = b - a;
            n++;
            n_norm = at + (b - a);
        }
        run = 0;
    }
    // A word takes at least 1 byte and a separator, so n <= len / 2 + 1; the space added
    // before each word after the first replaces that separator, so n_norm <= len.
    double s = 0.0;
    for (long w = 0; w < n;) {
        long k = lex->longest < n - w ? lex->longest : n - w;
        for (; k >= 1; k--) {
            size_t from = start[w], to = start[w + k - 1] + size[w + k - 1];
            const LexEntry *e = find_slot(lex, norm + from, to - from);
            if (e->phrase) {
                s += e->valence;
                break;
            }
        }
        w += k >= 1 ? k : 1;
    }
    free(norm);
    free(start);
    free(size);
    *sum = s;
    *words = n;
}

double lexicon_score_n(const Lexicon *lex, const char *text, size_t len) {
    double s;
    long n;
    lexicon_parts(lex, text, len, &s, &n);
    if (n == 0) return 0.0;
    double score = s / sqrt((double)n);
    if (score > LEXICON_CLIP) score = LEXICON_CLIP;
    if (score < -LEXICON_CLIP) score = -LEXICON_CLIP;
    return score;
}

double lexicon_score(const Lexicon *lex, const char *text) {
    return lexicon_score_n(lex, text, strlen(text));
}

long lexicon_size(const Lexicon *lex) {
    return lex->count;
}

void lexicon_free(Lexicon *lex) {
    if (!lex) return;
    for (size_t i = 0; i < lex->capacity; i++) free(lex->slots[i].phrase);
    free(lex->slots);
    free(lex);
}
