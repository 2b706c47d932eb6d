// Batched generation: prefill the (left-padded) prompts, then decode one token per row per
// step with the KV cache, until every row stops (stop token, stop check, or length).
//
// Each row samples with its own random stream: the token at step t of a row with id r
// uses the counter-based RNG at (seed, stream(r), t). So a row's output depends on its
// prompt, its id and the seed — not on the other rows, the batch size or the threads.
#pragma once
#include <stdbool.h>
#include <stdint.h>

#include "gen/sampler.h"
#include "gen/token_mask.h"
#include "model/model.h"

typedef enum { STOP_NONE, STOP_TOKEN, STOP_CHECK, STOP_LENGTH } StopReason;

typedef struct {
    SamplerConfig sampler;
    int max_new_tokens;
    uint64_t seed;
    const int *stop_tokens; // e.g. the EOS ids; the stop token is kept in the output
    int num_stop_tokens;
    // Optional: called after each token of a row; returns true to stop the row (stop
    // strings, which need the tokenizer, are checked this way).
    bool (*stop_check)(void *context, int row, const int *tokens, int count);
    void *stop_context;
    // Optional: called with each new token of each row, in row order (streaming output).
    // out[row] already holds the token then: it is out[row].tokens[out[row].length - 1],
    // with its log-probs (and top alternatives) at the same index.
    void (*on_token)(void *context, int row, int token);
    void *token_context;
    int pad_token; // fills the left padding of prompts (any valid id)
    // The stop tokens cannot be drawn before this many new tokens (Hugging Face's
    // min_new_tokens): a PPO policy cannot learn to answer with an immediate end of text.
    // The reported log-probs stay those of the unmasked model.
    int min_new_tokens;
    // Rows with the same prompt share one prefill (their first logits and cache slots are
    // copied from it) unless this is set. The prompt's forward then runs in a smaller batch,
    // so the numbers differ from a prefill per row by float rounding (about 1e-7 in the
    // log-probs); a run stays reproducible from its seed either way.
    bool prefill_each_row;
    // Optional per-row settings for a batch of independent requests (marlhf serve): row b
    // samples with row_samplers[b], from seed row_seeds[b], and stops at
    // row_max_new_tokens[b] (<= max_new_tokens) new tokens. NULL: the settings above.
    const SamplerConfig *row_samplers;
    const uint64_t *row_seeds;
    const int *row_max_new_tokens;
    // When > 0, each row also records, for every generated token, the top_logprobs most
    // likely tokens of the step and their log-probs under the model (log softmax of the raw
    // logits: before min_new_tokens' mask and the sampler's temperature, top-k and top-p),
    // most likely first, ties broken by the lower id (marlhf serve's OpenAI logprobs).
    // At most the vocabulary size is recorded. 0: nothing recorded, nothing computed.
    int top_logprobs;
    // Optional: every row's text must be accepted by this constraint (structured outputs,
    // gen/constraint.h: JSON or a regular expression): each step samples from the logits masked by it, the stop
    // tokens only once the text is complete (gen/token_mask.h; token_trie is the
    // vocabulary's). The reported log-probs stay the model's own.
    const Constraint *constraint;
    const TokenTrie *token_trie;
    // A greedy row's step first checks its raw argmax against the constraint and masks the
    // whole vocabulary only when that token is refused (token_mask_pick_greedy: the same
    // token either way). true: mask every step, for the tests and benchmarks that compare.
    bool mask_every_token;
} GenerateOptions;

// Where the time went (optional output of generate).
typedef struct {
    double prefill_seconds;  // the prompt forward
    double decode_seconds;   // every decode step, sampling included
    int decode_steps;        // forward passes after the prefill
    long generated_tokens;   // over all rows
    // Tokens picked from the backend's results (model_last_greedy, _candidates, _sampled),
    // not from copied logits
    long backend_picked_tokens;
    // Steps whose top-p rows' candidates fell short of a nucleus, so that their logits were
    // copied (generate_nucleus_candidates)
    int nucleus_misses;
} GenerateStats;

typedef struct {
    int *tokens;             // generated tokens (the stop token included)
    float *logprobs;         // log p under the model (temperature 1, no truncation)
    float *sampling_logprobs;// log p under the distribution sampled from
    // With options->top_logprobs: the top_count most likely tokens at each step, token t's
    // at [t * top_count, (t + 1) * top_count), most likely first; NULL (and 0) otherwise.
    // A greedy token's logprobs[t] equals top_logprobs[t * top_count] bit for bit (without
    // min_new_tokens, whose masked steps compute the former another way).
    int *top_tokens;
    float *top_logprobs;
    int top_count;
    int length;
    StopReason stop;
} GeneratedRow;

// Generates for B prompts. row_ids[b] keys row b's random stream (NULL: the row index).
// out[b] receives arrays of max_new_tokens entries (free with generated_row_free).
// stats may be NULL.
void generate(Model *model, const int *const *prompts, const int *prompt_lengths,
              const uint64_t *row_ids, int B, const GenerateOptions *options, GeneratedRow *out,
              GenerateStats *stats);
void generated_row_free(GeneratedRow *row);

// For generators built on the same pieces (gen/continuous.h): a row with room for
// max_new_tokens tokens (and top_count alternatives per token when > 0), empty.
void generated_row_alloc(GeneratedRow *row, int max_new_tokens, int top_count);
// Appends a sampled token with its log-probs, and the step's top alternatives from the
// raw logits when the row records them.
void generated_row_append(GeneratedRow *row, const float *logits, int V, SampledToken picked);
// The uniform number that picks the token at `step` of the row with id row_id.
// How many of a row's top-k candidates model_last_candidates makes room for when the largest
// top-k asked is largest_k: ties at the k-th largest beyond that send the step back to the
// whole logits.
static inline int generate_candidate_capacity(int largest_k, int V) {
    return 2 * largest_k + 16 < V ? 2 * largest_k + 16 : V;
}

// How many candidates a row sampled with top-p and no top-k asks model_last_candidates for,
// where the backend samples where the logits are (OpsBackend.samples_whole_rows: the GPU;
// sampler_candidates_hold_nucleus): 64 at first (previous 0); after a step whose candidates
// fell short of the row's nucleus (that step copies the logits) four times as many, up to
// 4096 (and V - 1); short at the most, -1: the row's nucleus is too wide for candidates,
// and the host samples its copied logits from then on.
static inline int generate_nucleus_candidates(int previous, int V) {
    const int most = 4096 < V - 1 ? 4096 : V - 1;
    if (previous >= most) return -1;
    const int k = previous > 0 ? 4 * previous : 64;
    return k < most ? k : most;
}

double generate_uniform(uint64_t seed, uint64_t row_id, int step);

const char *stop_reason_name(StopReason reason);
