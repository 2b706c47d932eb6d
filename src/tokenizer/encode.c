// tokenizer_encode(): text -> ids, the pipeline of tokenizer/internal.h.
#include <string.h>

#include "core/check.h"
#include "tokenizer/internal.h"
#include "tokenizer/utf8.h"

// Unicode White_Space (Rust regex's \s, which lstrip/rstrip use).
static bool is_white_space(uint32_t c) {
    return (c >= 9 && c <= 13) || c == ' ' || c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) ||
           c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

// Rust regex's \w: Alphabetic, marks, decimal digits, connector punctuation, joiners.
// Letters, letter numbers and marks stand in for Alphabetic (which adds a few symbols).
static bool is_word_char(uint32_t c) {
    static pcre2_code *re; // compiled once; pcre2 code is read-only after compiling
    if (c < 0x80) return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
    if (c == 0x200C || c == 0x200D) return true;
    #pragma omp critical(tokenizer_word_regex)
    if (!re) {
        int code;
        PCRE2_SIZE offset;
        re = pcre2_compile((PCRE2_SPTR) "^[\\p{L}\\p{Nl}\\p{M}\\p{Nd}\\p{Pc}]", PCRE2_ZERO_TERMINATED,
                           PCRE2_UTF | PCRE2_UCP, &code, &offset, NULL);
        CHECK(re, "cannot compile the word-character class");
    }
    char buf[4];
    int n = utf8_encode(c, buf);
    pcre2_match_data *md = pcre2_match_data_create(1, NULL);
    int rc = pcre2_match(re, (PCRE2_SPTR)buf, (size_t)n, 0, 0, md, NULL);
    pcre2_match_data_free(md);
    return rc >= 0;
}

static uint32_t char_before(const char *text, size_t pos, size_t *start) {
    size_t k = pos - 1;
    while (k > 0 && ((uint8_t)text[k] & 0xC0) == 0x80) k--;
    int n;
    *start = k;
    return utf8_decode(text + k, &n);
}

typedef struct {
    size_t start, end;
    int added; // index into tok->added, or -1 for text
} Segment;

typedef struct {
    Segment *data;
    int len, cap;
} SegmentList;

static void push_segment(SegmentList *list, size_t start, size_t end, int added) {
    if (list->len == list->cap) {
        list->cap = list->cap ? 2 * list->cap : 16;
        list->data = xrealloc(list->data, (size_t)list->cap * sizeof *list->data);
    }
    list->data[list->len++] = (Segment){start, end, added};
}

// HF's AddedVocabulary::find_matches: segments covering text[0, len).
static void find_added(const Tokenizer *tok, const AddedTrie *trie, const char *text, size_t len, SegmentList *out) {
    out->len = 0;
    size_t start_offset = 0;
    for (size_t i = 0; i < len;) {
        size_t end;
        int t = added_trie_longest(trie, text, len, i, &end);
        if (t < 0) {
            i++;
            continue;
        }
        const AddedToken *a = &tok->added[t];
        size_t start = i, stop = end;
        i = end; // the search goes on after the match, whatever becomes of it
        if (a->single_word) {
            size_t unused;
            int n;
            bool word_before = start > 0 && is_word_char(char_before(text, start, &unused));
            bool word_after = stop < len && is_word_char(utf8_decode(text + stop, &n));
            if (word_before || word_after) continue;
        }
        if (a->lstrip) {
            size_t k = start, prev;
            while (k > 0 && is_white_space(char_before(text, k, &prev))) k = prev;
            start = k;
        }
        if (start < start_offset) start = start_offset; // spaces an earlier match took
        if (a->rstrip) {
            int n;
            while (stop < len && is_white_space(utf8_decode(text + stop, &n))) stop += (size_t)n;
        }
        if (start_offset < start) push_segment(out, start_offset, start, -1);
        push_segment(out, start, stop, t);
        start_offset = stop;
        if (i < stop) i = stop;
    }
    if (start_offset < len) push_segment(out, start_offset, len, -1);
}

int tokenizer_encode(const Tokenizer *tok, const char *text, size_t len, bool add_special, int **ids, int *count) {
    add_special = add_special && !tok->chat_rendered; // tokenizer_set_chat_rendered: the template wrote them
    char *clean = NULL;
    if (!utf8_is_valid(text, len)) {
        TokBuf b = {0};
        utf8_append_lossy(&b, text, len);
        clean = tokbuf_take(&b, &len);
        text = clean;
    }
    IdVec out = {0};
    if (add_special)
        for (int i = 0; i < tok->n_post_prefix; i++) idvec_push(&out, tok->post_prefix[i]);

    EncodeScratch scratch = {0};
    scratch.md = pcre2_match_data_create(1, NULL);
    SegmentList raw = {0}, normed = {0};
    TokBuf normalized = {0};
    find_added(tok, &tok->raw_trie, text, len, &raw);
    for (int r = 0; r < raw.len; r++) {
        Segment seg = raw.data[r];
        if (seg.added >= 0) {
            idvec_push(&out, tok->added[seg.added].id);
            continue;
        }
        const char *piece = text + seg.start;
        size_t piece_len = seg.end - seg.start;
        if (tok->n_norm > 0) {
            tokenizer_normalize(tok, &scratch, piece, piece_len, &normalized);
            piece = normalized.data;
            piece_len = normalized.len;
        }
        if (piece_len == 0) continue;
        find_added(tok, &tok->norm_trie, piece, piece_len, &normed);
        for (int k = 0; k < normed.len; k++) {
            Segment sub = normed.data[k];
            if (sub.added >= 0) idvec_push(&out, tok->added[sub.added].id);
            else
                tokenizer_pre_tokenize_and_encode(tok, &scratch, piece + sub.start, sub.end - sub.start,
                                                  seg.start == 0 && sub.start == 0, &out);
        }
    }
    if (add_special)
        for (int i = 0; i < tok->n_post_suffix; i++) idvec_push(&out, tok->post_suffix[i]);
    free(raw.data);
    free(normed.data);
    free(normalized.data);
    encode_scratch_free(&scratch);
    free(clean);
    if (!out.data) out.data = xmalloc(sizeof(int));
    *ids = out.data;
    *count = out.len;
    return 0;
}
