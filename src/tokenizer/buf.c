// The growable byte buffer and id vector of tokenizer/internal.h.
#include <string.h>

#include "core/check.h"
#include "tokenizer/internal.h"

void tokbuf_reserve(TokBuf *b, size_t extra) {
    if (b->len + extra + 1 <= b->cap) return;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < b->len + extra + 1) cap *= 2;
    b->data = xrealloc(b->data, cap);
    b->cap = cap;
}

void tokbuf_append(TokBuf *b, const void *data, size_t n) {
    tokbuf_reserve(b, n);
    if (n) memcpy(b->data + b->len, data, n);
    b->len += n;
}

void tokbuf_putc(TokBuf *b, char c) {
    tokbuf_reserve(b, 1);
    b->data[b->len++] = c;
}

char *tokbuf_take(TokBuf *b, size_t *len) {
    tokbuf_reserve(b, 0);
    b->data[b->len] = '\0';
    char *data = b->data;
    if (len) *len = b->len;
    memset(b, 0, sizeof *b);
    return data;
}

void idvec_push(IdVec *v, int id) {
    if (v->len == v->cap) {
        v->cap = v->cap ? 2 * v->cap : 64;
        v->data = xrealloc(v->data, (size_t)v->cap * sizeof(int));
    }
    v->data[v->len++] = id;
}
