// Macro-action termination conditions of MA-PPO (spec §7): how one response is cut into
// macro actions, per sample, as pure functions of the response (and the side inputs of the
// condition).
//
// A segmentation is a list of segment lengths that tile the response's R tokens (the
// generated tokens, EOS included if generated) from token 0. As in the released code
// (spec §6.5), the last segment is always the single final token when R >= 2: that token
// carries the reward-model score, and averaging it into a longer macro action would dilute
// the score. For R == 1 the whole response is one segment (the released code drops such
// responses before segmenting, §6.2).
//
// The four conditions:
//   fixed       n tokens at a time from the start; the remainder before the final token is
//               one shorter segment (§7.1).
//   randomized  the j-th macro action has the j-th length of a shuffled multiset
//               {1,2,3,5,10} x k (or {2,3,5,10} x k); after the list, everything up to the
//               final token is one macro action (§7.2).
//   parsing     constituents of a link-grammar parse of each sentence that span fewer than C
//               policy tokens (and at least two words) are macro actions; single words join
//               the preceding one; sentence starts always cut (§7.3; rl/macro_parsing.c).
//   ppl         a macro action ends where the reference model's per-token perplexity rises
//               (§7.5), at the released code's position or one token later (the paper's).
//
// Zero-length segments: the released code keeps the duplicate final boundary of fixed and
// randomized n-grams (when the walk ends exactly at the final token), which inserts an empty
// macro step before the final token (§11.1 item 1; always for n = 1). dedupe_boundaries =
// false reproduces it; true (the default) drops empty segments, so fixed n = 1 is exactly
// token-level PPO. Parsing and ppl never produce empty segments in either mode.
#pragma once
#include <stdbool.h>
#include <stdint.h>

typedef enum { TERMINATION_FIXED, TERMINATION_RANDOMIZED, TERMINATION_PARSING, TERMINATION_PPL } TerminationCondition;

typedef struct {
    TerminationCondition condition;
    int ngram;                   // fixed: n (>= 1)
    int repeat_times;            // randomized: each length repeated k times (>= 1)
    bool randomized_include_one; // true: {1,2,3,5,10} (released code); false: {2,3,5,10} (paper)
    int parser_cutoff;           // parsing: C (>= 1; paper: 5)
    bool dedupe_boundaries;      // true (default): no zero-length macro actions; false: the
                                 // released code's duplicate final boundary (spec §11.1 item 1)
    bool ppl_monotone;           // false (default): the released code's boundary; true: the
                                 // paper's monotone reading, one token later (spec §7.5/§12.3)
    uint64_t seed;               // randomized: the shuffle is drawn from the counter-based RNG
                                 // keyed by (seed, row stream, iteration), so it is deterministic
                                 // and independent of batch composition (the released code uses
                                 // Python's global `random`, one stream for the whole run)
} MacroConfig;

// Segment lengths, in token order; they sum to R. `fallbacks` counts the sentences the
// parsing condition could not parse or align and cut into fixed 5-grams instead (0 for the
// other conditions).
typedef struct {
    int *lengths;
    int count;
    int fallbacks;
} MacroSegmentation;

// Defaults: the released code's values (fixed 1-gram, repeat_times 1 with {1,2,3,5,10},
// parser cutoff 5, the code's ppl boundary, seed 1234), except dedupe_boundaries = true.
MacroConfig macro_config_default(void);

// Segments a response of R >= 1 tokens into *out (free with macro_segmentation_free).
//   token_ppl   per-token perplexity under the reference model, [R] (ppl; NULL otherwise).
//   token_text  the text of each token, [R] (parsing; NULL otherwise): the pieces of the
//               policy's tokenizer that concatenate to the response text, i.e. what
//               tokenizer_stream_push() returns for each id (a piece may be "" when the
//               token ends inside a UTF-8 character; EOS and other special tokens are "").
//               (tokenizer_decode() of each id alone usually gives the same pieces for
//               ASCII text, but U+FFFD for each part of a character split across tokens,
//               so such text then falls back rather than parsing.)
//   row_stream, iteration: with config->seed, the key of the randomized condition's shuffle:
//               the same key always gives the same lengths, whatever else is in the batch.
// Returns 0, or -1 with err_set() for a bad config or missing side input.
int macro_segment(const MacroConfig *config, int R, const float *token_ppl, const char *const *token_text,
                  uint64_t row_stream, uint64_t iteration, MacroSegmentation *out);
void macro_segmentation_free(MacroSegmentation *s);

// "fixed" | "randomized" | "parsing" | "ppl"; -1 with err_set() for anything else.
int macro_termination_from_name(const char *name, TerminationCondition *out);
const char *macro_termination_name(TerminationCondition condition);

// --- parsing condition (rl/macro_parsing.c) -----------------------------------------
//
// link-grammar's English dictionary and parse options live in one process-wide parser,
// created on first use (the dictionary takes ~0.1 s to load) and kept until
// macro_parsing_shutdown(). Every use of it holds one mutex, so callers on several threads
// are safe but parse one sentence at a time; the parser also switches the process's
// LC_CTYPE to a UTF-8 locale if it is not one already (link-grammar needs it).

// Marks is_start[j] = true for every token j (0 <= j < R) that begins a macro action
// according to the parsing condition (token 0 always does), leaving the other entries
// false, and adds the number of fallback sentences to *fallbacks. The final singleton is
// left to the caller. Returns 0, or -1 with err_set() if the parser cannot be created.
int macro_parsing_starts(int cutoff, int R, const char *const *token_text, bool *is_start, int *fallbacks);

// link-grammar's constituent tree of one sentence (single-line bracketed form, as the
// parsing condition sees it), xmalloc'd; NULL if the sentence does not parse. For tests
// and debugging.
char *macro_parsing_tree(const char *sentence);

// Frees the parser; the next parsing call creates it again.
void macro_parsing_shutdown(void);
