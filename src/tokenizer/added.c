// Added tokens (special tokens like "<|im_start|>", and user-added ones): found in the
// text before anything else, as HF's AddedVocabulary does -- the leftmost match, the
// longest one there, then on from its end; single_word matches that touch a word
// character are dropped; lstrip/rstrip take the white space beside the token into it.
#include <string.h>

#include "core/check.h"
#include "tokenizer/internal.h"
#include "tokenizer/utf8.h"

static int trie_node(AddedTrie *t, uint8_t byte) {
    if (t->count == t->cap) {
        t->cap = t->cap ? 2 * t->cap : 64;
        t->first_child = xrealloc(t->first_child, (size_t)t->cap * sizeof(int));
        t->next_sibling = xrealloc(t->next_sibling, (size_t)t->cap * sizeof(int));
        t->token = xrealloc(t->token, (size_t)t->cap * sizeof(int));
        t->byte = xrealloc(t->byte, (size_t)t->cap);
    }
    int n = t->count++;
    t->first_child[n] = t->next_sibling[n] = t->token[n] = -1;
    t->byte[n] = byte;
    return n;
}

static int trie_child(const AddedTrie *t, int node, uint8_t byte) {
    for (int c = t->first_child[node]; c >= 0; c = t->next_sibling[c])
        if (t->byte[c] == byte) return c;
    return -1;
}

void added_trie_build(AddedTrie *t, const AddedToken *added, int n_added, bool normalized) {
    added_trie_free(t);
    trie_node(t, 0); // the root
    for (int i = 0; i < n_added; i++) {
        if (added[i].normalized != normalized) continue;
        const char *content = normalized && added[i].normalized_content ? added[i].normalized_content : added[i].content;
        size_t len = strlen(content);
        if (len == 0) continue;
        int node = 0;
        for (size_t k = 0; k < len; k++) {
            uint8_t b = (uint8_t)content[k];
            int child = trie_child(t, node, b);
            if (child < 0) {
                child = trie_node(t, b);
                t->next_sibling[child] = t->first_child[node];
                t->first_child[node] = child;
            }
            node = child;
        }
        // Two added tokens with one content: the later one wins, as in HF's map.
        t->token[node] = i;
        t->first_byte[(uint8_t)content[0]] = true;
    }
}

void added_trie_free(AddedTrie *t) {
    free(t->first_child);
    free(t->next_sibling);
    free(t->token);
    free(t->byte);
    memset(t, 0, sizeof *t);
}

int added_trie_longest(const AddedTrie *t, const char *text, size_t len, size_t pos, size_t *end) {
    if (t->count == 0 || !t->first_byte[(uint8_t)text[pos]]) return -1;
    int node = 0, best = -1;
    for (size_t k = pos; k < len; k++) {
        node = trie_child(t, node, (uint8_t)text[k]);
        if (node < 0) break;
        if (t->token[node] >= 0) best = t->token[node], *end = k + 1;
    }
    return best;
}
