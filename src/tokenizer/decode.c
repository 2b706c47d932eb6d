// Decoding: ids -> text, exactly as HF's tokenizer.decode(ids, skip_special_tokens).
//
// `tokenizers` turns each id into its token string (an added token's content, or its
// normalized form for normalized added tokens), drops special tokens when asked, and runs
// the decoder steps over the list of strings:
//   ByteLevel   -- every token whose characters are all in GPT-2's alphabet becomes those
//                  bytes (others keep their own UTF-8); all bytes joined, then lossy UTF-8
//                  (each maximal ill-formed subpart -> U+FFFD);
//   Metaspace   -- '▁' -> ' ', and dropped in the first token unless prepend_scheme=never;
//   Replace     -- a literal pattern in each token;
//   ByteFallback-- a run of <0xNN> tokens becomes its bytes if they are valid UTF-8, else
//                  one U+FFFD per byte;
//   Fuse        -- all tokens joined into one;
//   Strip       -- up to `start` leading and `stop` trailing copies of one character.
// No decoder: the tokens joined with spaces. transformers then applies its
// clean_up_tokenization where it does (tok->clean_up; see load_hf.c).
#include <string.h>

#include "core/check.h"
#include "tokenizer/internal.h"
#include "tokenizer/utf8.h"

// A list of strings held in one buffer.
typedef struct {
    TokBuf text;
    size_t *off, *len;
    int count, cap;
} StrList;

static void strlist_push(StrList *l, const char *s, size_t n) {
    if (l->count == l->cap) {
        l->cap = l->cap ? 2 * l->cap : 32;
        l->off = xrealloc(l->off, (size_t)l->cap * sizeof(size_t));
        l->len = xrealloc(l->len, (size_t)l->cap * sizeof(size_t));
    }
    l->off[l->count] = l->text.len;
    l->len[l->count] = n;
    l->count++;
    tokbuf_append(&l->text, s, n);
}

// Starts a new string that the caller fills with tokbuf_* on l->text, then ends.
static void strlist_begin(StrList *l) { strlist_push(l, "", 0); }
static void strlist_end(StrList *l) { l->len[l->count - 1] = l->text.len - l->off[l->count - 1]; }

static void strlist_free(StrList *l) {
    free(l->text.data);
    free(l->off);
    free(l->len);
    memset(l, 0, sizeof *l);
}

static const char *str_at(const StrList *l, int i) { return l->text.data + l->off[i]; }

// The byte of a "<0xNN>" token, or -1. Rust's u8::from_str_radix takes a leading '+'.
static int byte_token_value(const char *s, size_t n) {
    if (n != 6 || memcmp(s, "<0x", 3) != 0 || s[5] != '>') return -1;
    int v = 0;
    for (int k = 3; k < 5; k++) {
        char c = s[k];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (k == 3 && c == '+') continue;
        if (d < 0) return -1;
        v = v * 16 + d;
    }
    return v;
}

static void flush_bytes(StrList *out, TokBuf *bytes) {
    if (!bytes->len) return;
    if (utf8_is_valid(bytes->data, bytes->len)) strlist_push(out, bytes->data, bytes->len);
    else
        for (size_t i = 0; i < bytes->len; i++) strlist_push(out, "\xEF\xBF\xBD", 3);
    bytes->len = 0;
}

static void run_decoder(const DecStep *step, const StrList *in, StrList *out, bool *incomplete_tail) {
    switch (step->kind) {
    case DEC_BYTE_LEVEL: {
        TokBuf bytes = {0};
        for (int i = 0; i < in->count; i++) {
            const char *s = str_at(in, i);
            size_t n = in->len[i], start = bytes.len;
            bool all_in_alphabet = true;
            for (size_t k = 0; k < n;) {
                int clen;
                if (!utf8_char_len((const uint8_t *)s + k, n - k)) { all_in_alphabet = false; break; }
                int b = byte_level_byte(utf8_decode(s + k, &clen));
                if (b < 0) { all_in_alphabet = false; break; }
                tokbuf_putc(&bytes, (char)b);
                k += (size_t)clen;
            }
            if (!all_in_alphabet) {
                bytes.len = start;
                tokbuf_append(&bytes, s, n);
            }
        }
        *incomplete_tail = utf8_incomplete_tail(bytes.data, bytes.len);
        strlist_begin(out);
        utf8_append_lossy(&out->text, bytes.data, bytes.len);
        strlist_end(out);
        free(bytes.data);
        break;
    }
    case DEC_METASPACE: {
        size_t rep = strlen(step->replacement);
        for (int i = 0; i < in->count; i++) {
            const char *s = str_at(in, i);
            size_t n = in->len[i];
            strlist_begin(out);
            for (size_t k = 0; k < n;) {
                if (rep && k + rep <= n && memcmp(s + k, step->replacement, rep) == 0) {
                    if (!(i == 0 && step->prepend_scheme != PREPEND_NEVER)) tokbuf_putc(&out->text, ' ');
                    k += rep;
                } else {
                    tokbuf_putc(&out->text, s[k++]);
                }
            }
            strlist_end(out);
        }
        break;
    }
    case DEC_REPLACE: {
        size_t plen = strlen(step->pattern), clen = strlen(step->content);
        for (int i = 0; i < in->count; i++) {
            const char *s = str_at(in, i);
            size_t n = in->len[i];
            strlist_begin(out);
            for (size_t k = 0; k < n;) {
                if (plen && k + plen <= n && memcmp(s + k, step->pattern, plen) == 0) {
                    tokbuf_append(&out->text, step->content, clen);
                    k += plen;
                } else {
                    tokbuf_putc(&out->text, s[k++]);
                }
            }
            strlist_end(out);
        }
        break;
    }
    case DEC_BYTE_FALLBACK: {
        TokBuf bytes = {0};
        for (int i = 0; i < in->count; i++) {
            int b = byte_token_value(str_at(in, i), in->len[i]);
            if (b >= 0) {
                tokbuf_putc(&bytes, (char)b);
                continue;
            }
            flush_bytes(out, &bytes);
            strlist_push(out, str_at(in, i), in->len[i]);
        }
        flush_bytes(out, &bytes);
        free(bytes.data);
        break;
    }
    case DEC_FUSE:
        strlist_begin(out);
        for (int i = 0; i < in->count; i++) tokbuf_append(&out->text, str_at(in, i), in->len[i]);
        strlist_end(out);
        break;
    case DEC_STRIP: {
        size_t clen = strlen(step->strip_content);
        for (int i = 0; i < in->count; i++) {
            const char *s = str_at(in, i);
            size_t start = 0, end = in->len[i];
            for (int k = 0; k < step->strip_start && start + clen <= end; k++) {
                if (memcmp(s + start, step->strip_content, clen) != 0) break;
                start += clen;
            }
            for (int k = 0; k < step->strip_stop && end >= start + clen; k++) {
                if (memcmp(s + end - clen, step->strip_content, clen) != 0) break;
                end -= clen;
            }
            strlist_push(out, s + start, end - start);
        }
        break;
    }
    }
}

// The string `tokenizers` decodes an id to, or NULL (an id without a token).
static const char *decode_string(const Tokenizer *tok, int id, size_t *len) {
    if (id < 0 || id >= tok->vocab_size) return NULL;
    int a = tok->added_index ? tok->added_index[id] : -1;
    if (a >= 0) {
        const AddedToken *t = &tok->added[a];
        const char *s = t->normalized_content ? t->normalized_content : t->content;
        *len = strlen(s);
        return s;
    }
    if (id >= tok->bpe.n_ids || !tok->bpe.pieces[id]) return NULL;
    *len = (size_t)tok->bpe.piece_len[id];
    return tok->bpe.pieces[id];
}

// HF skips a token when its string is the content of a special added token.
static bool skipped_as_special(const Tokenizer *tok, const char *s, size_t len) {
    int a = strmap_get(&tok->added_map, s, len);
    return a >= 0 && tok->added[a].special;
}

char *tokenizer_decode_pieces(const Tokenizer *tok, const int *ids, int count, bool skip_special, size_t *len,
                              bool *incomplete_tail, bool *ends_in_byte_token) {
    StrList list = {0}, next = {0};
    for (int i = 0; i < count; i++) {
        size_t n;
        const char *s = decode_string(tok, ids[i], &n);
        if (!s || (skip_special && skipped_as_special(tok, s, n))) continue;
        strlist_push(&list, s, n);
    }
    *incomplete_tail = false;
    *ends_in_byte_token = false;
    if (!tok->has_decoder) {
        TokBuf out = {0};
        for (int i = 0; i < list.count; i++) {
            if (i) tokbuf_putc(&out, ' ');
            tokbuf_append(&out, str_at(&list, i), list.len[i]);
        }
        strlist_free(&list);
        return tokbuf_take(&out, len);
    }
    for (int k = 0; k < tok->n_dec; k++) {
        if (tok->dec[k].kind == DEC_BYTE_FALLBACK && list.count > 0)
            *ends_in_byte_token = byte_token_value(str_at(&list, list.count - 1), list.len[list.count - 1]) >= 0;
        next.count = 0;
        next.text.len = 0;
        run_decoder(&tok->dec[k], &list, &next, incomplete_tail);
        StrList t = list;
        list = next;
        next = t;
    }
    TokBuf out = {0};
    for (int i = 0; i < list.count; i++) tokbuf_append(&out, str_at(&list, i), list.len[i]);
    strlist_free(&list);
    strlist_free(&next);
    return tokbuf_take(&out, len);
}

// transformers' clean_up_tokenization: these replacements, one after the other.
static const char *const cleanup_from[] = {" .", " ?", " !", " ,", " ' ", " n't", " 'm", " 's", " 've", " 're"};
static const char *const cleanup_to[] = {".", "?", "!", ",", "'", "n't", "'m", "'s", "'ve", "'re"};

static void clean_up(TokBuf *text) {
    for (size_t r = 0; r < sizeof cleanup_from / sizeof cleanup_from[0]; r++) {
        size_t from = strlen(cleanup_from[r]), to = strlen(cleanup_to[r]);
        TokBuf out = {0};
        size_t k = 0;
        while (k < text->len) {
            if (k + from <= text->len && memcmp(text->data + k, cleanup_from[r], from) == 0) {
                tokbuf_append(&out, cleanup_to[r], to);
                k += from;
            } else {
                tokbuf_putc(&out, text->data[k++]);
            }
        }
        free(text->data);
        *text = out;
    }
}

char *tokenizer_decode_len(const Tokenizer *tok, const int *ids, int count, bool skip_special, size_t *len) {
    bool incomplete, byte_token;
    size_t n;
    char *text = tokenizer_decode_pieces(tok, ids, count, skip_special, &n, &incomplete, &byte_token);
    if (tok->clean_up) {
        TokBuf b = {text, n, n + 1};
        clean_up(&b);
        text = tokbuf_take(&b, &n);
    }
    if (len) *len = n;
    return text;
}

char *tokenizer_decode(const Tokenizer *tok, const int *ids, int count, bool skip_special) {
    return tokenizer_decode_len(tok, ids, count, skip_special, NULL);
}

// --- streaming -------------------------------------------------------------------------
// Each push decodes the context (the ids of the last piece that produced text) together
// with the pending ids, and emits what the pending ids add after the context's own text.
// Every decoder step above is local enough for that to equal a full decode: ByteLevel's
// lossy UTF-8 restarts cleanly after a complete character, ByteFallback runs end at a
// non-byte token, and the first-token rules (Metaspace, Strip) fall on the context in both
// decodes. So a push holds its text back while the bytes end inside a character or inside
// a run of byte tokens. Clean-up only rewrites runs of " .?!,'nmstvre": text is emitted up
// to the last character outside that set, where a later token cannot change it.
struct TokenizerStream {
    const Tokenizer *tok;
    bool skip_special;
    IdVec ids;       // ids[0, read) is the context, ids[read, len) pending
    int read;
    char *ctx_text;  // decode(context)
    size_t ctx_len;
    TokBuf held;     // decoded text awaiting clean-up
};

TokenizerStream *tokenizer_stream_new(const Tokenizer *tok, bool skip_special) {
    TokenizerStream *s = xcalloc(1, sizeof *s);
    s->tok = tok;
    s->skip_special = skip_special;
    s->ctx_text = xstrdup("");
    return s;
}

static bool cleanup_char(char c) { return c && strchr(" .?!,'nmstvre", c) != NULL; }

static char *emit(TokenizerStream *s, const char *text, size_t n, bool final, size_t *len) {
    if (!s->tok->clean_up) {
        char *piece = xmalloc(n + 1);
        memcpy(piece, text, n);
        piece[n] = '\0';
        if (len) *len = n;
        return piece;
    }
    tokbuf_append(&s->held, text, n);
    size_t cut = s->held.len;
    if (!final)
        while (cut > 0 && cleanup_char(s->held.data[cut - 1])) cut--;
    TokBuf out = {0};
    tokbuf_append(&out, s->held.data, cut);
    clean_up(&out);
    memmove(s->held.data, s->held.data + cut, s->held.len - cut);
    s->held.len -= cut;
    return tokbuf_take(&out, len);
}

int tokenizer_stream_push(TokenizerStream *s, int id, char **piece) { return tokenizer_stream_push_len(s, id, piece, NULL); }

int tokenizer_stream_flush(TokenizerStream *s, char **piece) { return tokenizer_stream_flush_len(s, piece, NULL); }

int tokenizer_stream_push_len(TokenizerStream *s, int id, char **piece, size_t *piece_len) {
    idvec_push(&s->ids, id);
    size_t n;
    bool incomplete, byte_token;
    char *text = tokenizer_decode_pieces(s->tok, s->ids.data, s->ids.len, s->skip_special, &n, &incomplete, &byte_token);
    if (incomplete || byte_token || n <= s->ctx_len) {
        free(text);
        *piece = xstrdup("");
        if (piece_len) *piece_len = 0;
        return 0;
    }
    CHECK(memcmp(text, s->ctx_text, s->ctx_len) == 0, "stream decode: the context's text changed");
    *piece = emit(s, text + s->ctx_len, n - s->ctx_len, false, piece_len);
    free(text);
    // The pending ids become the context.
    int pending = s->ids.len - s->read;
    memmove(s->ids.data, s->ids.data + s->read, (size_t)pending * sizeof(int));
    s->ids.len = pending;
    s->read = pending;
    free(s->ctx_text);
    s->ctx_text = tokenizer_decode_pieces(s->tok, s->ids.data, s->ids.len, s->skip_special, &s->ctx_len,
                                          &incomplete, &byte_token);
    return 0;
}

int tokenizer_stream_flush_len(TokenizerStream *s, char **piece, size_t *piece_len) {
    size_t n = 0;
    bool incomplete, byte_token;
    char *text = tokenizer_decode_pieces(s->tok, s->ids.data, s->ids.len, s->skip_special, &n, &incomplete, &byte_token);
    bool longer = n > s->ctx_len;
    CHECK(!longer || memcmp(text, s->ctx_text, s->ctx_len) == 0, "stream decode: the context's text changed");
    *piece = emit(s, longer ? text + s->ctx_len : "", longer ? n - s->ctx_len : 0, true, piece_len);
    free(text);
    s->ids.len = 0;
    s->read = 0;
    free(s->ctx_text);
    s->ctx_text = xstrdup("");
    s->ctx_len = 0;
    return 0;
}

void tokenizer_stream_free(TokenizerStream *s) {
    if (!s) return;
    free(s->ids.data);
    free(s->ctx_text);
    free(s->held.data);
    free(s);
}

// The bytes a token adds in the middle of a text: the decoder's steps on the token alone,
// with no start-of-text rule (Metaspace's and Strip's leading space) and no U+FFFD for a
// partial character. NULL for special added tokens and ids without a token.
char *tokenizer_token_bytes(const Tokenizer *tok, int id, size_t *len) {
    size_t n;
    const char *s = decode_string(tok, id, &n);
    if (!s || skipped_as_special(tok, s, n)) return NULL;
    if (tok->added_index && tok->added_index[id] >= 0) {
        TokBuf out = {0};
        tokbuf_append(&out, s, n);
        return tokbuf_take(&out, len);
    }
    TokBuf cur = {0};
    tokbuf_append(&cur, s, n);
    for (int k = 0; k < tok->n_dec; k++) {
        const DecStep *step = &tok->dec[k];
        TokBuf next = {0};
        switch (step->kind) {
        case DEC_BYTE_LEVEL: {
            bool all_in_alphabet = true;
            for (size_t i = 0; i < cur.len;) {
                int clen;
                if (!utf8_char_len((const uint8_t *)cur.data + i, cur.len - i)) { all_in_alphabet = false; break; }
                int b = byte_level_byte(utf8_decode(cur.data + i, &clen));
                if (b < 0) { all_in_alphabet = false; break; }
                tokbuf_putc(&next, (char)b);
                i += (size_t)clen;
            }
            if (!all_in_alphabet) next.len = 0, tokbuf_append(&next, cur.data, cur.len);
            break;
        }
        case DEC_METASPACE:
        case DEC_REPLACE: {
            const char *from = step->kind == DEC_METASPACE ? step->replacement : step->pattern;
            const char *to = step->kind == DEC_METASPACE ? " " : step->content;
            size_t from_len = strlen(from), to_len = strlen(to);
            for (size_t i = 0; i < cur.len;) {
                if (from_len && i + from_len <= cur.len && memcmp(cur.data + i, from, from_len) == 0) {
                    tokbuf_append(&next, to, to_len);
                    i += from_len;
                } else {
                    tokbuf_putc(&next, cur.data[i++]);
                }
            }
            break;
        }
        case DEC_BYTE_FALLBACK: {
            int b = byte_token_value(cur.data, cur.len);
            if (b >= 0) tokbuf_putc(&next, (char)b);
            else tokbuf_append(&next, cur.data, cur.len);
            break;
        }
        case DEC_FUSE:
        case DEC_STRIP: tokbuf_append(&next, cur.data, cur.len); break;
        }
        free(cur.data);
        cur = next;
    }
    if (!cur.data) tokbuf_append(&cur, "", 0);
    return tokbuf_take(&cur, len);
}
