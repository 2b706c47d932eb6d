// Shared by the constraint tests (test_json_constraint.c, test_regex_constraint.c, test_grammar_constraint.c): the
// token mask under a constraint (gen/token_mask.h) against the brute force (every token's
// bytes fed to a copy of the state), and random texts made of pieces. Include after test.h.
#pragma once
#include <math.h>
#include <stdbool.h>
#include <string.h>

#include "core/check.h"
#include "core/timer.h"
#include "gen/constraint.h"
#include "gen/token_mask.h"
#include "tokenizer/tokenizer.h"

static int brute_force_mask(const Constraint *c, const ConstraintState *state, const Tokenizer *tok, int V, bool *allowed) {
    int count = 0;
    ConstraintState copy;
    for (int v = 0; v < V; v++) {
        size_t length;
        char *bytes = tokenizer_token_bytes(tok, v, &length);
        allowed[v] = false;
        if (bytes && length > 0) {
            constraint_state_copy(c, &copy, state);
            allowed[v] = constraint_state_feed_bytes(c, &copy, bytes, length);
        }
        count += allowed[v];
        free(bytes);
    }
    return count;
}

// The mask at every state of `text` (which the constraint accepts) against the brute force.
static void check_mask(const TokenTrie *trie, const Tokenizer *tok, Constraint *c, const char *text, const char *what,
                       double *mask_ms, int *steps_out) {
    const int V = tokenizer_vocab_size(tok);
    const int eos = tokenizer_eos_id(tok);
    float *logits = xmalloc((size_t)V * sizeof(float)), *masked = xmalloc((size_t)V * sizeof(float));
    for (int v = 0; v < V; v++) logits[v] = (float)(v % 89) * 0.01f;
    bool *allowed = xmalloc((size_t)V);
    ConstraintState *state = xmalloc(sizeof *state);
    constraint_state_init(c, state);
    TokenMaskScratch scratch;
    token_mask_scratch_init(&scratch, trie);
    int steps = 0, mismatches = 0, allows_mismatches = 0, cache_mismatches = 0;
    double seconds = 0;
    float *other_logits = xmalloc((size_t)V * sizeof(float)), *other_masked = xmalloc((size_t)V * sizeof(float));
    for (int v = 0; v < V; v++) other_logits[v] = (float)(v % 13) * -0.5f;
    for (size_t i = 0; i <= strlen(text); i++) {
        const double t0 = now_seconds();
        const int count = token_mask_apply(trie, c, state, &eos, 1, logits, masked, V, &scratch);
        seconds += now_seconds() - t0;
        int expected = brute_force_mask(c, state, tok, V, allowed);
        if (constraint_state_accepts(c, state)) allowed[eos] = true, expected++;
        for (int v = 0; v < V; v++)
            if ((masked[v] > -INFINITY) != allowed[v] || (allowed[v] && masked[v] != logits[v])) mismatches++;
        // The same state again is read from the mask cache: the same tokens, with the new
        // call's logits.
        const long hits = scratch.cache_hits;
        const int again = token_mask_apply(trie, c, state, &eos, 1, other_logits, other_masked, V, &scratch);
        if (scratch.cache_hits != hits + 1 || again != count) cache_mismatches++;
        for (int v = 0; v < V; v++)
            if (other_masked[v] != (masked[v] > -INFINITY ? other_logits[v] : -INFINITY)) cache_mismatches++;
        // One token at a time (greedy decoding's short cut) decides as the mask: every
        // allowed token and every fifth of the others (all of them would double the test).
        for (int v = 0; v < V; v++)
            if ((allowed[v] || v % 5 == 0) &&
                token_mask_allows(trie, c, state, &eos, 1, v, &scratch) != (masked[v] > -INFINITY))
                allows_mismatches++;
        EXPECT(count == expected && count > 0, "%s after %zu bytes: %d tokens allowed, the brute force allows %d", what, i,
               count, expected);
        steps++;
        if (i < strlen(text)) EXPECT(constraint_state_feed(c, state, (uint8_t)text[i], state), "%s: the text is accepted", what);
    }
    EXPECT(mismatches == 0, "%s: %d tokens masked differently from the brute force", what, mismatches);
    EXPECT(cache_mismatches == 0, "%s: the cached masks differ from the walked ones %d times", what, cache_mismatches);
    EXPECT(allows_mismatches == 0, "%s: token_mask_allows differs from the mask for %d tokens", what, allows_mismatches);
    EXPECT(constraint_state_accepts(c, state), "%s: the whole text is accepted", what);
    printf("%s: %d states, %ld masks read from the cache\n", what, steps, scratch.cache_hits - steps);
    *mask_ms += 1e3 * seconds, *steps_out += steps;
    token_mask_scratch_free(&scratch);
    free(state), free(allowed), free(logits), free(masked), free(other_logits), free(other_masked);
}

// SmolLM2's tokenizer (models/, fetched by `make test`), or NULL with the test failed.
static Tokenizer *mask_check_tokenizer(void) {
    const char *path = "models/SmolLM2-135M-Instruct.Q4_1.gguf";
    Tokenizer *tok = NULL;
    if (tokenizer_load(&tok, path) != 0) {
        fprintf(stderr, "  cannot load %s: %s (run scripts/fetch-model)\n", path, err_msg());
        test_current_failures++;
        return NULL;
    }
    return tok;
}

static inline uint64_t random_next(uint64_t *rng) {
    *rng = *rng * 6364136223846793005ull + 1442695040888963407ull;
    return *rng;
}

// Appends 1 to 16 pieces drawn at random.
static inline void append_random_pieces(char *text, const char *const *pieces, int num_pieces, uint64_t *rng) {
    const int n = 1 + (int)(random_next(rng) >> 60);
    for (int i = 0; i < n; i++) strcat(text, pieces[(random_next(rng) >> 33) % (uint64_t)num_pieces]);
}

// 0 to 7 bytes drawn from `alphabet` (its first `size` bytes); returns the length.
static inline int random_bytes(char *text, const char *alphabet, int size, uint64_t *rng) {
    const int length = (int)(random_next(rng) >> 61);
    for (int i = 0; i < length; i++) text[i] = alphabet[(random_next(rng) >> 33) % (uint64_t)size];
    return length;
}
