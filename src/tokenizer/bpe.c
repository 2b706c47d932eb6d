// The BPE model: one pre-tokenized word -> ids, as `tokenizers`' BPE does it.
//
// The word's characters become symbols (the vocabulary token of each character; else its
// <0xNN> byte tokens when byte_fallback is on; else the unknown token, fused over a run of
// unknown characters when fuse_unk is on; else the character is dropped -- all as HF).
// Then the adjacent pair with the lowest merge rank is merged, leftmost first among
// equal ranks, until no pair has a merge: a min-heap of (rank, position) with stale
// entries skipped, so long words (runs of spaces, minified code) stay O(n log n).
// With ignore_merges (Llama-3), a word that is itself a token is that token.
#include <string.h>

#include "core/check.h"
#include "tokenizer/internal.h"
#include "tokenizer/utf8.h"

struct BpeSymbol {
    int id;
    int prev, next; // indices of the neighbouring live symbols, -1 at the ends
    int len;        // bytes of the word it covers; 0 once merged into its left neighbour
};

struct BpeMerge {
    int rank, pos, merged;
};

static bool merge_before(const struct BpeMerge *a, const struct BpeMerge *b) {
    return a->rank != b->rank ? a->rank < b->rank : a->pos < b->pos;
}

static void heap_push(struct BpeMerge *heap, int *n, struct BpeMerge m) {
    int i = (*n)++;
    heap[i] = m;
    while (i > 0) {
        int parent = (i - 1) / 2;
        if (!merge_before(&heap[i], &heap[parent])) break;
        struct BpeMerge t = heap[i];
        heap[i] = heap[parent];
        heap[parent] = t;
        i = parent;
    }
}

static struct BpeMerge heap_pop(struct BpeMerge *heap, int *n) {
    struct BpeMerge top = heap[0];
    heap[0] = heap[--*n];
    int i = 0;
    for (;;) {
        int l = 2 * i + 1, r = l + 1, best = i;
        if (l < *n && merge_before(&heap[l], &heap[best])) best = l;
        if (r < *n && merge_before(&heap[r], &heap[best])) best = r;
        if (best == i) break;
        struct BpeMerge t = heap[i];
        heap[i] = heap[best];
        heap[best] = t;
        i = best;
    }
    return top;
}

static void add_symbol(EncodeScratch *s, int *n, int id, int len) {
    if (*n == s->cap_symbols) {
        s->cap_symbols = s->cap_symbols ? 2 * s->cap_symbols : 256;
        s->symbols = xrealloc(s->symbols, (size_t)s->cap_symbols * sizeof *s->symbols);
    }
    s->symbols[*n] = (struct BpeSymbol){id, *n - 1, *n + 1, len};
    (*n)++;
}

static int char_id(const BpeModel *bpe, const char *c, int clen) {
    int n;
    uint32_t cp = utf8_decode(c, &n);
    if (cp < TOK_CHAR_IDS) return bpe->char_ids[cp];
    return strmap_get(&bpe->vocab, c, (size_t)clen);
}

void bpe_encode_word(const BpeModel *bpe, EncodeScratch *s, const char *word, size_t len, IdVec *out) {
    if (len == 0) return;
    if (bpe->ignore_merges) {
        int id = strmap_get(&bpe->vocab, word, len);
        if (id >= 0) {
            idvec_push(out, id);
            return;
        }
    }
    int n = 0;
    int unk_len = 0; // a pending unknown token covering unk_len bytes (0: none)
    for (size_t i = 0; i < len;) {
        int clen;
        utf8_decode(word + i, &clen);
        int id = char_id(bpe, word + i, clen);
        if (id >= 0) {
            if (unk_len) add_symbol(s, &n, bpe->unk_id, unk_len), unk_len = 0;
            add_symbol(s, &n, id, clen);
        } else {
            bool have_bytes = bpe->byte_fallback;
            for (int k = 0; have_bytes && k < clen; k++) have_bytes = bpe->byte_ids[(uint8_t)word[i + k]] >= 0;
            if (have_bytes) {
                // As HF: a pending unknown token stays pending across byte-fallback tokens.
                for (int k = 0; k < clen; k++) add_symbol(s, &n, bpe->byte_ids[(uint8_t)word[i + k]], 1);
            } else if (bpe->unk_id >= 0) {
                if (unk_len && !bpe->fuse_unk) add_symbol(s, &n, bpe->unk_id, unk_len), unk_len = 0;
                unk_len += clen;
            }
        }
        i += (size_t)clen;
    }
    if (unk_len) add_symbol(s, &n, bpe->unk_id, unk_len);
    if (n == 0) return;
    struct BpeSymbol *sym = s->symbols;
    sym[n - 1].next = -1;

    if (n > 1) {
        if (s->cap_heap < 2 * n) {
            s->cap_heap = 2 * n;
            s->heap = xrealloc(s->heap, (size_t)s->cap_heap * sizeof *s->heap);
        }
        int heap_n = 0;
        for (int i = 0; i + 1 < n; i++) {
            int rank, merged;
            if (pairmap_get(&bpe->merges, sym[i].id, sym[i + 1].id, &rank, &merged))
                heap_push(s->heap, &heap_n, (struct BpeMerge){rank, i, merged});
        }
        while (heap_n > 0) {
            struct BpeMerge top = heap_pop(s->heap, &heap_n);
            struct BpeSymbol *left = &sym[top.pos];
            if (left->len == 0 || left->next < 0) continue;
            struct BpeSymbol *right = &sym[left->next];
            int rank, merged;
            // Stale entry: the pair at this position has changed since it was queued.
            if (!pairmap_get(&bpe->merges, left->id, right->id, &rank, &merged) || merged != top.merged) continue;
            left->id = merged;
            left->len += right->len;
            right->len = 0;
            left->next = right->next;
            if (right->next >= 0) sym[right->next].prev = top.pos;
            // A heap entry per live pair at most 2 per merge: room was reserved for 2n.
            if (heap_n + 2 > s->cap_heap) {
                s->cap_heap *= 2;
                s->heap = xrealloc(s->heap, (size_t)s->cap_heap * sizeof *s->heap);
            }
            if (left->prev >= 0 && pairmap_get(&bpe->merges, sym[left->prev].id, left->id, &rank, &merged))
                heap_push(s->heap, &heap_n, (struct BpeMerge){rank, left->prev, merged});
            if (left->next >= 0 && pairmap_get(&bpe->merges, left->id, sym[left->next].id, &rank, &merged))
                heap_push(s->heap, &heap_n, (struct BpeMerge){rank, top.pos, merged});
        }
    }
    for (int i = 0; i >= 0; i = sym[i].next) idvec_push(out, sym[i].id);
}

int bpe_add_merge(BpeModel *bpe, const char *left, size_t left_len, const char *right, size_t right_len,
                  const char *file, const char *field) {
    int a = strmap_get(&bpe->vocab, left, left_len), b = strmap_get(&bpe->vocab, right, right_len);
    if (a < 0 || b < 0) {
        const char *missing = a < 0 ? left : right;
        int missing_len = (int)(a < 0 ? left_len : right_len);
        return err_set("%s[%d] merges \"%.*s\", which is not in the vocabulary (%s)", field, bpe->n_merges,
                       missing_len, missing, file);
    }
    char stack[256];
    char *joined = left_len + right_len <= sizeof stack ? stack : xmalloc(left_len + right_len);
    memcpy(joined, left, left_len);
    memcpy(joined + left_len, right, right_len);
    int merged = strmap_get(&bpe->vocab, joined, left_len + right_len);
    if (merged < 0) {
        int rc = err_set("%s[%d] makes \"%.*s\", which is not in the vocabulary (%s)", field, bpe->n_merges,
                         (int)(left_len + right_len), joined, file);
        if (joined != stack) free(joined);
        return rc;
    }
    if (joined != stack) free(joined);
    // A pair listed twice keeps its last rank, as HF's map does.
    pairmap_put(&bpe->merges, a, b, bpe->n_merges, merged);
    if ((bpe->n_merges & (bpe->n_merges - 1)) == 0) // grow at powers of two
        bpe->merge_pairs = xrealloc(bpe->merge_pairs, (size_t)2 * (bpe->n_merges ? 2 * bpe->n_merges : 1) * sizeof(int));
    bpe->merge_pairs[2 * bpe->n_merges] = a;
    bpe->merge_pairs[2 * bpe->n_merges + 1] = b;
    bpe->n_merges++;
    return 0;
}

void bpe_finish(BpeModel *bpe) {
    for (int b = 0; b < 256; b++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", b);
        bpe->byte_ids[b] = strmap_get(&bpe->vocab, name, 6);
    }
    free(bpe->char_ids);
    bpe->char_ids = xmalloc(TOK_CHAR_IDS * sizeof(int));
    for (uint32_t cp = 0; cp < TOK_CHAR_IDS; cp++) {
        char c[4];
        int n = utf8_encode(cp, c);
        bpe->char_ids[cp] = strmap_get(&bpe->vocab, c, (size_t)n);
    }
}

void bpe_free(BpeModel *bpe) {
    for (int i = 0; i < bpe->n_ids; i++) free(bpe->pieces[i]);
    free(bpe->pieces);
    free(bpe->piece_len);
    strmap_free(&bpe->vocab);
    pairmap_free(&bpe->merges);
    free(bpe->merge_pairs);
    free(bpe->char_ids);
    memset(bpe, 0, sizeof *bpe);
}
