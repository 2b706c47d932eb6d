// Constrained decoding over a vocabulary: which tokens keep a constraint's text acceptable
// (gen/constraint.h: JSON, or a regular expression), as a mask on a row of logits before
// sampling.
//
// The vocabulary's token byte strings (tokenizer_token_bytes) go into a trie, built once per
// tokenizer and shared by every sequence. Masking walks the trie depth first with the
// recogniser's state, one byte per trie edge, and skips a whole subtree as soon as its
// prefix is refused, so each distinct prefix of the vocabulary is tried at most once and
// most of the vocabulary is cut at its first byte outside strings. Every allowed token
// keeps its logit, every other one gets -inf: the sampler (greedy, or temperature, top-k,
// top-p) then draws from the masked distribution exactly. The stop tokens are allowed
// only where the text is complete; special tokens and tokens without bytes never are.
#pragma once
#include <stdbool.h>

#include "gen/constraint.h"
#include "gen/sampler.h"
#include "tokenizer/tokenizer.h"

typedef struct TokenTrie TokenTrie;

// The trie of ids [0, vocab_size) (the model's vocabulary: ids past the tokenizer's have no
// token and are never allowed).
TokenTrie *token_trie_new(const Tokenizer *tok, int vocab_size);
void token_trie_free(TokenTrie *trie);

// The masks of the last TOKEN_MASK_CACHE_ENTRIES states a sequence met, by the state's key
// (constraint_state_key): decoding meets the same state again and again (inside a string a
// grammar's stacks, a DFA's state, a JSON value's frames before its count moves), and then
// the allowed tokens are read back instead of walked. Exact: a mask depends only on the
// state (and the vocabulary).
enum { TOKEN_MASK_CACHE_ENTRIES = 8 };
typedef struct {
    uint8_t *key; // NULL: empty
    size_t key_length;
    uint64_t *allowed; // a bit per token id < V, set for the tokens the walk allowed
    int V;
    int count; // how many
} TokenMaskCacheEntry;

// Working memory for one sequence's masking (one state per trie level, the mask cache). It
// serves one constraint: the first token_mask_apply binds it.
typedef struct {
    ConstraintState *levels;
    int num_levels;
    const Constraint *constraint;
    TokenMaskCacheEntry cache[TOKEN_MASK_CACHE_ENTRIES];
    int cache_next; // the entry replaced next (round robin)
    uint8_t *key;   // the current state's key (room for sizeof(ConstraintState))
    long cache_hits, cache_misses;
    bool walk_always; // no cache (for the benchmark that compares)
} TokenMaskScratch;
void token_mask_scratch_init(TokenMaskScratch *scratch, const TokenTrie *trie);
void token_mask_scratch_free(TokenMaskScratch *scratch);

// masked[v] = logits[v] for the allowed tokens, -inf for the others; returns how many are
// allowed (0 only for a constraint that allows nothing, which a compiled one never does).
// A state met before (scratch's cache) skips the walk, with the same result.
int token_mask_apply(const TokenTrie *trie, const Constraint *constraint, const ConstraintState *state,
                     const int *stop_tokens, int num_stop_tokens, const float *logits, float *masked, int V,
                     TokenMaskScratch *scratch);
// Whether token_mask_apply would keep `token` (the same rule for one token: its bytes are
// a live continuation, or it is a stop token where the text is complete), without walking
// the vocabulary. Greedy decoding checks its raw argmax with this first: when that token
// is allowed it is also the masked argmax, and the whole mask is not needed.
bool token_mask_allows(const TokenTrie *trie, const Constraint *constraint, const ConstraintState *state,
                       const int *stop_tokens, int num_stop_tokens, int token, TokenMaskScratch *scratch);
// A greedy row's token without the whole mask: the raw logits' argmax (sampler_argmax, the first
// maximum) when the constraint allows it, for then it is also the masked logits' argmax,
// ties included. False, with *picked unset, when the mask is needed after all: a sampling
// row (temperature > 0), a refused argmax, or a stop token while !stops_allowed (the
// caller's min_new_tokens). *picked holds the token only: callers set its logprob as on
// the masked path.
bool token_mask_pick_greedy(const TokenTrie *trie, const Constraint *constraint, const ConstraintState *state,
                            const int *stop_tokens, int num_stop_tokens, bool stops_allowed, const float *logits,
                            int V, const SamplerConfig *sampler, TokenMaskScratch *scratch, SampledToken *picked);
// The state after `token`'s bytes (a stop token or a token without bytes: unchanged).
// False when they are refused.
bool token_mask_advance(const TokenTrie *trie, const Constraint *constraint, ConstraintState *state, int token);
