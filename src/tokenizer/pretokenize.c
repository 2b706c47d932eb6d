// Normalizers and pre-tokenizers: one piece of text -> the words BPE sees.
//
// Each step is HF's (tokenizers/src/pre_tokenizers, normalizers), reimplemented:
//   Split(pattern, behavior, invert) -- the regex's matches and the text between them,
//     kept, removed or merged with a neighbour as `behavior` says;
//   ByteLevel -- optional prefix space, GPT-2 regex split (use_regex), then every byte
//     spelled in GPT-2's alphabet;
//   Digits -- each digit (individual_digits) or each run of digits on its own;
//   Metaspace -- ' ' -> '▁', '▁' prepended (always, or only at the start of the text),
//     optional split before each '▁'.
// Pieces live in the scratch arena as (offset, length), since the arena grows.
#include <string.h>

#include "core/check.h"
#include "tokenizer/internal.h"
#include "tokenizer/utf8.h"

struct Piece {
    size_t off, len;
    bool at_origin; // starts at offset 0 of the original text
};

static void push_piece(EncodeScratch *s, size_t off, size_t len, bool at_origin) {
    if (len == 0) return; // HF drops empty splits
    if (s->n_next == s->cap_next) {
        s->cap_next = s->cap_next ? 2 * s->cap_next : 64;
        s->next_pieces = xrealloc(s->next_pieces, (size_t)s->cap_next * sizeof *s->next_pieces);
    }
    s->next_pieces[s->n_next++] = (struct Piece){off, len, at_origin};
}

// Splits arena[p.off, +p.len) by `re` with HF's SplitDelimiterBehavior.
static void split_piece(EncodeScratch *s, struct Piece p, const TokRegex *re, SplitBehavior behavior, bool invert) {
    // Segments (start, end, is_match) covering the piece, relative to p.off.
    enum { MAX_STACK = 64 };
    size_t stack[3 * MAX_STACK];
    size_t *seg = stack, cap = MAX_STACK, n = 0;
    size_t prev = 0, pos = 0;
    long last_match_end = -1;
    for (;;) {
        const char *text = s->arena.data + p.off;
        size_t ms, me;
        if (pos > p.len || !tok_regex_find(re, s->md, text, p.len, pos, &ms, &me)) break;
        if (ms == me && (long)me == last_match_end) { // Rust's find_iter: no empty match right after a match
            if (pos >= p.len) break;
            int clen;
            utf8_decode(text + pos, &clen);
            pos += (size_t)clen;
            continue;
        }
        if (n + 2 > cap) {
            size_t *bigger = xmalloc(2 * cap * 3 * sizeof(size_t));
            memcpy(bigger, seg, n * 3 * sizeof(size_t));
            if (seg != stack) free(seg);
            seg = bigger;
            cap *= 2;
        }
        if (prev != ms) seg[3 * n] = prev, seg[3 * n + 1] = ms, seg[3 * n + 2] = invert, n++;
        seg[3 * n] = ms, seg[3 * n + 1] = me, seg[3 * n + 2] = !invert, n++;
        prev = me;
        last_match_end = (long)me;
        if (me == ms) { // an accepted empty match: search on from the next character
            if (me >= p.len) break;
            int clen;
            utf8_decode(text + me, &clen);
            pos = me + (size_t)clen;
        } else {
            pos = me;
        }
    }
    if (n + 1 > cap) {
        size_t *bigger = xmalloc((cap + 1) * 3 * sizeof(size_t));
        memcpy(bigger, seg, n * 3 * sizeof(size_t));
        if (seg != stack) free(seg);
        seg = bigger;
    }
    if (prev != p.len) seg[3 * n] = prev, seg[3 * n + 1] = p.len, seg[3 * n + 2] = invert, n++;

    // Apply the behavior: out segments as (start, end) pairs, written over seg in place.
    size_t m = 0; // kept segments
    bool previous_match = false;
    switch (behavior) {
    case SPLIT_ISOLATED:
        for (size_t i = 0; i < n; i++) seg[3 * m] = seg[3 * i], seg[3 * m + 1] = seg[3 * i + 1], m++;
        break;
    case SPLIT_REMOVED:
        for (size_t i = 0; i < n; i++)
            if (!seg[3 * i + 2]) seg[3 * m] = seg[3 * i], seg[3 * m + 1] = seg[3 * i + 1], m++;
        break;
    case SPLIT_CONTIGUOUS:
        for (size_t i = 0; i < n; i++) {
            bool is_match = seg[3 * i + 2];
            if (is_match == previous_match && m > 0) seg[3 * (m - 1) + 1] = seg[3 * i + 1];
            else seg[3 * m] = seg[3 * i], seg[3 * m + 1] = seg[3 * i + 1], m++;
            previous_match = is_match;
        }
        break;
    case SPLIT_MERGED_WITH_PREVIOUS:
        for (size_t i = 0; i < n; i++) {
            bool is_match = seg[3 * i + 2];
            if (is_match && !previous_match && m > 0) seg[3 * (m - 1) + 1] = seg[3 * i + 1];
            else seg[3 * m] = seg[3 * i], seg[3 * m + 1] = seg[3 * i + 1], m++;
            previous_match = is_match;
        }
        break;
    case SPLIT_MERGED_WITH_NEXT: {
        // Walk from the right: a match joins the segment after it (unless that one is a match too).
        size_t write = n; // kept segments fill seg[write..n) from the right
        for (size_t i = n; i-- > 0;) {
            bool is_match = seg[3 * i + 2];
            size_t start = seg[3 * i], end = seg[3 * i + 1];
            if (is_match && !previous_match && write < n) seg[3 * write] = start;
            else write--, seg[3 * write] = start, seg[3 * write + 1] = end;
            previous_match = is_match;
        }
        for (size_t i = write; i < n; i++) seg[3 * m] = seg[3 * i], seg[3 * m + 1] = seg[3 * i + 1], m++;
        break;
    }
    }
    for (size_t i = 0; i < m; i++)
        push_piece(s, p.off + seg[3 * i], seg[3 * i + 1] - seg[3 * i], p.at_origin && seg[3 * i] == 0);
    if (seg != stack) free(seg);
}

// Appends arena[off, +len) with every byte spelled in GPT-2's alphabet; returns the new offset.
static size_t byte_level_spell(EncodeScratch *s, size_t off, size_t len) {
    tokbuf_reserve(&s->arena, 2 * len);
    size_t out = s->arena.len;
    const uint8_t *src = (const uint8_t *)s->arena.data + off;
    char *dst = s->arena.data + out;
    size_t k = 0;
    for (size_t i = 0; i < len; i++) k += (size_t)utf8_encode(byte_level_char(src[i]), dst + k);
    s->arena.len += k;
    return out;
}

static void swap_pieces(EncodeScratch *s) {
    struct Piece *t = s->pieces;
    int cap = s->cap_pieces;
    s->pieces = s->next_pieces;
    s->cap_pieces = s->cap_next;
    s->n_pieces = s->n_next;
    s->next_pieces = t;
    s->cap_next = cap;
    s->n_next = 0;
}

static void run_step(const PreStep *step, EncodeScratch *s) {
    s->n_next = 0;
    for (int i = 0; i < s->n_pieces; i++) {
        struct Piece p = s->pieces[i];
        switch (step->kind) {
        case PRE_SPLIT:
        case PRE_DIGITS:
            split_piece(s, p, &step->regex, step->kind == PRE_DIGITS ? SPLIT_ISOLATED : step->behavior,
                        step->kind == PRE_SPLIT && step->invert);
            break;
        case PRE_BYTE_LEVEL: {
            if (step->add_prefix_space && s->arena.data[p.off] != ' ') {
                tokbuf_reserve(&s->arena, p.len + 1); // before taking a pointer into the arena
                size_t off = s->arena.len;
                tokbuf_putc(&s->arena, ' ');
                tokbuf_append(&s->arena, s->arena.data + p.off, p.len);
                p.off = off, p.len++;
            }
            int first = s->n_next;
            if (step->use_regex) split_piece(s, p, &step->regex, SPLIT_ISOLATED, false);
            else push_piece(s, p.off, p.len, p.at_origin);
            for (int k = first; k < s->n_next; k++) {
                struct Piece *q = &s->next_pieces[k];
                size_t before = s->arena.len;
                q->off = byte_level_spell(s, q->off, q->len);
                q->len = s->arena.len - before;
            }
            break;
        }
        case PRE_METASPACE: {
            size_t rep_len = strlen(step->replacement);
            tokbuf_reserve(&s->arena, rep_len * (p.len + 1));
            size_t off = s->arena.len;
            const char *text = s->arena.data + p.off;
            bool starts_with_rep = p.len >= rep_len && memcmp(text, step->replacement, rep_len) == 0;
            bool starts_with_space = p.len > 0 && text[0] == ' ';
            bool prepend = !(starts_with_rep || starts_with_space) &&
                           (step->prepend_scheme == PREPEND_ALWAYS ||
                            (step->prepend_scheme == PREPEND_FIRST && p.at_origin));
            if (prepend) tokbuf_append(&s->arena, step->replacement, rep_len);
            for (size_t k = 0; k < p.len; k++) {
                char c = s->arena.data[p.off + k];
                if (c == ' ') tokbuf_append(&s->arena, step->replacement, rep_len);
                else tokbuf_putc(&s->arena, c);
            }
            struct Piece q = {off, s->arena.len - off, p.at_origin};
            if (step->split) split_piece(s, q, &step->regex, SPLIT_MERGED_WITH_NEXT, false);
            else push_piece(s, q.off, q.len, q.at_origin);
            break;
        }
        }
    }
    swap_pieces(s);
}

void tokenizer_pre_tokenize_and_encode(const Tokenizer *tok, EncodeScratch *s, const char *text, size_t len,
                                       bool at_origin, IdVec *out) {
    if (len == 0) return;
    s->arena.len = 0;
    tokbuf_append(&s->arena, text, len);
    s->n_pieces = 0;
    s->n_next = 0;
    push_piece(s, 0, len, at_origin);
    swap_pieces(s);
    for (int i = 0; i < tok->n_pre; i++) run_step(&tok->pre[i], s);
    for (int i = 0; i < s->n_pieces; i++)
        bpe_encode_word(&tok->bpe, s, s->arena.data + s->pieces[i].off, s->pieces[i].len, out);
}

// Unicode White_Space, which Rust's char::is_whitespace tests.
static bool is_white_space(uint32_t c) {
    return (c >= 9 && c <= 13) || c == ' ' || c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) ||
           c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

void tokenizer_normalize(const Tokenizer *tok, EncodeScratch *s, const char *text, size_t len, TokBuf *out) {
    out->len = 0;
    tokbuf_append(out, text, len);
    TokBuf next = {0};
    for (int i = 0; i < tok->n_norm; i++) {
        const NormStep *step = &tok->norm[i];
        next.len = 0;
        switch (step->kind) {
        case NORM_PREPEND:
            if (out->len == 0) continue; // HF prepends to non-empty text only
            tokbuf_append(&next, step->text, strlen(step->text));
            tokbuf_append(&next, out->data, out->len);
            break;
        case NORM_REPLACE: {
            size_t pos = 0, prev = 0, ms, me;
            long last_end = -1;
            size_t content_len = strlen(step->text);
            while (pos <= out->len && tok_regex_find(&step->pattern, s->md, out->data, out->len, pos, &ms, &me)) {
                if (ms == me && (long)me == last_end) {
                    if (pos >= out->len) break;
                    int clen;
                    utf8_decode(out->data + pos, &clen);
                    pos += (size_t)clen;
                    continue;
                }
                tokbuf_append(&next, out->data + prev, ms - prev);
                tokbuf_append(&next, step->text, content_len);
                prev = me;
                last_end = (long)me;
                if (me == ms) {
                    if (me >= out->len) break;
                    int clen;
                    utf8_decode(out->data + me, &clen);
                    pos = me + (size_t)clen;
                } else {
                    pos = me;
                }
            }
            tokbuf_append(&next, out->data + prev, out->len - prev);
            break;
        }
        case NORM_STRIP: {
            size_t start = 0, end = out->len;
            while (step->strip_left && start < end) {
                int clen;
                uint32_t c = utf8_decode(out->data + start, &clen);
                if (!is_white_space(c)) break;
                start += (size_t)clen;
            }
            while (step->strip_right && end > start) {
                size_t k = end - 1;
                while (k > start && ((uint8_t)out->data[k] & 0xC0) == 0x80) k--;
                int clen;
                if (!is_white_space(utf8_decode(out->data + k, &clen))) break;
                end = k;
            }
            tokbuf_append(&next, out->data + start, end - start);
            break;
        }
        }
        TokBuf t = *out;
        *out = next;
        next = t;
    }
    free(next.data);
}

void encode_scratch_free(EncodeScratch *s) {
    if (s->md) pcre2_match_data_free(s->md);
    free(s->arena.data);
    free(s->pieces);
    free(s->next_pieces);
    free(s->symbols);
    free(s->heap);
    memset(s, 0, sizeof *s);
}
