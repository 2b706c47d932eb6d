// Token masks from a constraint over a byte trie of the vocabulary (token_mask.h).
#include "gen/token_mask.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/check.h"

// The trie in depth-first order: node i (i >= 1; 0 is the root) spells byte[i] after its
// parent, sits at depth[i] (1 = the first byte), and its subtree is [i, end[i]); the tokens
// whose bytes end there are ids[first[i] .. first[i + 1]).
struct TokenTrie {
    int num_nodes;
    uint8_t *byte;
    int *depth, *end, *first, *ids;
    int max_depth;
    int vocab_size;
    char **bytes; // each token's bytes (NULL: none), for advancing
    size_t *lengths;
};

static const TokenTrie *sort_trie;
static int by_bytes(const void *a, const void *b) {
    const int x = *(const int *)a, y = *(const int *)b;
    const size_t lx = sort_trie->lengths[x], ly = sort_trie->lengths[y];
    int r = memcmp(sort_trie->bytes[x], sort_trie->bytes[y], lx < ly ? lx : ly);
    if (r) return r;
    if (lx != ly) return lx < ly ? -1 : 1;
    return (x > y) - (x < y);
}

TokenTrie *token_trie_new(const Tokenizer *tok, int vocab_size) {
    TokenTrie *trie = xcalloc(1, sizeof *trie);
    trie->vocab_size = vocab_size;
    trie->bytes = xcalloc((size_t)vocab_size, sizeof(char *));
    trie->lengths = xcalloc((size_t)vocab_size, sizeof(size_t));
    const int known = tokenizer_vocab_size(tok) < vocab_size ? tokenizer_vocab_size(tok) : vocab_size;
    int *order = xmalloc((size_t)vocab_size * sizeof(int)), count = 0;
    size_t total = 0;
    for (int id = 0; id < known; id++) {
        trie->bytes[id] = tokenizer_token_bytes(tok, id, &trie->lengths[id]);
        if (trie->bytes[id] && trie->lengths[id] == 0) free(trie->bytes[id]), trie->bytes[id] = NULL;
        if (trie->bytes[id]) order[count++] = id, total += trie->lengths[id];
    }
    // Sorted by their bytes, the tokens list the trie depth first: a token adds the nodes of
    // its bytes past the prefix it shares with the one before.
    sort_trie = trie;
    qsort(order, (size_t)count, sizeof(int), by_bytes);
    sort_trie = NULL;
    const size_t capacity = total + 1;
    trie->byte = xcalloc(capacity, 1);
    trie->depth = xcalloc(capacity, sizeof(int));
    trie->end = xcalloc(capacity, sizeof(int));
    trie->first = xcalloc(capacity + 1, sizeof(int));
    trie->ids = xmalloc((size_t)(count ? count : 1) * sizeof(int));
    int *path = xmalloc((total + 2) * sizeof(int)); // the node at each depth of the current token
    int nodes = 1, placed = 0;
    path[0] = 0;
    const char *previous = NULL;
    size_t previous_length = 0;
    for (int k = 0; k < count; k++) {
        const int id = order[k];
        const char *b = trie->bytes[id];
        const size_t length = trie->lengths[id];
        size_t common = 0;
        while (previous && common < length && common < previous_length && b[common] == previous[common]) common++;
        for (size_t d = common; d < length; d++) {
            trie->byte[nodes] = (uint8_t)b[d];
            trie->depth[nodes] = (int)d + 1;
            trie->first[nodes] = placed;
            path[d + 1] = nodes++;
        }
        if ((int)length > trie->max_depth) trie->max_depth = (int)length;
        // The token ends at its last node: ids are placed in node order, so the node's
        // range is [first[node], first[node + 1]).
        trie->ids[placed++] = id;
        previous = b, previous_length = length;
    }
    trie->num_nodes = nodes;
    trie->first[nodes] = placed;
    // A node's ids: from its first to the next node's first.
    // Subtree ends: the next node at the same depth or shallower.
    int *stack = xmalloc((size_t)(trie->max_depth + 2) * sizeof(int)), height = 0;
    for (int i = 1; i < nodes; i++) {
        while (height > 0 && trie->depth[stack[height - 1]] >= trie->depth[i]) trie->end[stack[--height]] = i;
        stack[height++] = i;
    }
    while (height > 0) trie->end[stack[--height]] = nodes;
    free(stack), free(path), free(order);
    return trie;
}

void token_trie_free(TokenTrie *trie) {
    if (!trie) return;
    for (int id = 0; id < trie->vocab_size; id++) free(trie->bytes[id]);
    free(trie->bytes), free(trie->lengths);
    free(trie->byte), free(trie->depth), free(trie->end), free(trie->first), free(trie->ids);
    free(trie);
}

void token_mask_scratch_init(TokenMaskScratch *scratch, const TokenTrie *trie) {
    memset(scratch, 0, sizeof *scratch);
    scratch->num_levels = trie->max_depth + 1;
    scratch->levels = xmalloc((size_t)scratch->num_levels * sizeof(ConstraintState));
    scratch->key = xmalloc(sizeof(ConstraintState));
}

void token_mask_scratch_free(TokenMaskScratch *scratch) {
    for (int i = 0; i < TOKEN_MASK_CACHE_ENTRIES; i++) free(scratch->cache[i].key), free(scratch->cache[i].allowed);
    free(scratch->levels), free(scratch->key);
    memset(scratch, 0, sizeof *scratch);
}

// The cached mask of the state whose key is scratch->key (key_length bytes), or NULL.
static const TokenMaskCacheEntry *cache_find(const TokenMaskScratch *scratch, size_t key_length, int V) {
    for (int i = 0; i < TOKEN_MASK_CACHE_ENTRIES; i++) {
        const TokenMaskCacheEntry *e = &scratch->cache[i];
        if (e->key && e->V == V && e->key_length == key_length && !memcmp(e->key, scratch->key, key_length)) return e;
    }
    return NULL;
}

// The entry the walk about to run fills: the oldest, emptied, its key the current one.
static TokenMaskCacheEntry *cache_take(TokenMaskScratch *scratch, size_t key_length, int V) {
    TokenMaskCacheEntry *e = &scratch->cache[scratch->cache_next];
    scratch->cache_next = (scratch->cache_next + 1) % TOKEN_MASK_CACHE_ENTRIES;
    const size_t words = ((size_t)V + 63) / 64;
    if (!e->allowed || e->V != V) free(e->allowed), e->allowed = xmalloc(words * sizeof(uint64_t));
    memset(e->allowed, 0, words * sizeof(uint64_t));
    e->key = xrealloc(e->key, key_length ? key_length : 1);
    memcpy(e->key, scratch->key, key_length);
    e->key_length = key_length, e->V = V, e->count = 0;
    return e;
}

// The depth-first walk: the tokens whose bytes keep `state` alive, as bits of `allowed`
// (cleared by the caller); returns how many.
static int walk_trie(const TokenTrie *trie, const Constraint *constraint, const ConstraintState *state, int V,
                     TokenMaskScratch *scratch, uint64_t *allowed) {
    int count = 0;
    constraint_state_copy(constraint, &scratch->levels[0], state);
    // A regular expression's DFA is stepped here (a table lookup); JSON through its feed.
    const RegexConstraint *regex = constraint_regex(constraint);
    const RegexTable dfa = regex ? regex_constraint_table(regex) : (RegexTable){0};
    for (int i = 1; i < trie->num_nodes;) {
        const int d = trie->depth[i];
        bool alive;
        if (regex) {
            const int32_t from = scratch->levels[d - 1].regex;
            scratch->levels[d].regex = dfa.table[(size_t)from * (size_t)dfa.num_classes + dfa.classes[trie->byte[i]]];
            alive = scratch->levels[d].regex >= 0;
        } else {
            alive = constraint_state_feed(constraint, &scratch->levels[d - 1], trie->byte[i], &scratch->levels[d]);
        }
        if (!alive) {
            i = trie->end[i];
            continue;
        }
        for (int k = trie->first[i]; k < trie->first[i + 1]; k++) {
            const int id = trie->ids[k];
            if (id < V) allowed[id / 64] |= 1ull << (id % 64), count++;
        }
        i++;
    }
    return count;
}

int token_mask_apply(const TokenTrie *trie, const Constraint *constraint, const ConstraintState *state,
                     const int *stop_tokens, int num_stop_tokens, const float *logits, float *masked, int V,
                     TokenMaskScratch *scratch) {
    CHECK(V <= trie->vocab_size, "a vocabulary of %d tokens, a trie of %d", V, trie->vocab_size);
    if (!scratch->constraint) scratch->constraint = constraint;
    CHECK(scratch->constraint == constraint, "a token mask scratch serves one constraint");
    const size_t key_length = constraint_state_key(constraint, state, scratch->key);
    const TokenMaskCacheEntry *entry = scratch->walk_always ? NULL : cache_find(scratch, key_length, V);
    if (entry) {
        scratch->cache_hits++;
    } else {
        scratch->cache_misses++;
        TokenMaskCacheEntry *fresh = cache_take(scratch, key_length, V);
        fresh->count = walk_trie(trie, constraint, state, V, scratch, fresh->allowed);
        entry = fresh;
    }
    int allowed = entry->count;
    for (int v = 0; v < V; v++) masked[v] = entry->allowed[v / 64] >> (v % 64) & 1 ? logits[v] : -INFINITY;
    if (constraint_state_accepts(constraint, state))
        for (int s = 0; s < num_stop_tokens; s++)
            if (stop_tokens[s] >= 0 && stop_tokens[s] < V && masked[stop_tokens[s]] == -INFINITY)
                masked[stop_tokens[s]] = logits[stop_tokens[s]], allowed++;
    return allowed;
}

bool token_mask_allows(const TokenTrie *trie, const Constraint *constraint, const ConstraintState *state,
                       const int *stop_tokens, int num_stop_tokens, int token, TokenMaskScratch *scratch) {
    if (token < 0 || token >= trie->vocab_size) return false;
    if (trie->bytes[token]) {
        // The trie walk keeps a token when every prefix of its bytes is alive: feeding them
        // one by one from the same state decides the same.
        ConstraintState *after = &scratch->levels[0];
        constraint_state_copy(constraint, after, state);
        if (constraint_state_feed_bytes(constraint, after, trie->bytes[token], trie->lengths[token])) return true;
    }
    for (int s = 0; s < num_stop_tokens; s++)
        if (stop_tokens[s] == token) return constraint_state_accepts(constraint, state);
    return false;
}

bool token_mask_pick_greedy(const TokenTrie *trie, const Constraint *constraint, const ConstraintState *state,
                            const int *stop_tokens, int num_stop_tokens, bool stops_allowed, const float *logits,
                            int V, const SamplerConfig *sampler, TokenMaskScratch *scratch, SampledToken *picked) {
    if (sampler->temperature > 0.0f) return false;
    // The argmax alone: the log-probs are the caller's to compute, as on the masked path.
    const int best = sampler_argmax(logits, V);
    if (!stops_allowed)
        for (int s = 0; s < num_stop_tokens; s++)
            if (stop_tokens[s] == best) return false;
    if (!token_mask_allows(trie, constraint, state, stop_tokens, num_stop_tokens, best, scratch)) return false;
    *picked = (SampledToken){.token = best}; // greedy: sampling_logprob 0
    return true;
}

bool token_mask_advance(const TokenTrie *trie, const Constraint *constraint, ConstraintState *state, int token) {
    if (token < 0 || token >= trie->vocab_size || !trie->bytes[token]) return true;
    return constraint_state_feed_bytes(constraint, state, trie->bytes[token], trie->lengths[token]);
}
