// Continuous batching (marlhf serve): sequences join a batch that is already decoding and
// leave it as soon as they stop, so a short request does not wait for a long one, and a
// request that arrives mid-generation starts at the next step instead of after the batch.
//
// Each step samples one token for every sequence, reports it, retires the sequences that
// stopped, and runs one decode forward for the rest. New sequences are added between steps
// with one prefill forward of their prompts (the sequences that answer one prompt share
// it). Sequence s samples with the same random numbers generate() gives a row with its
// row_id, seed and sampler, at each of its own steps: its tokens are generate()'s for a
// lone prompt, whenever it joins — with batch-mates, up to float rounding (the matmuls run
// on other row counts), so a near tie in the logits could go the other way.
//
// The KV cache (model/model.h) keeps the engine's shared slot counter: every sequence's
// next token goes to the same slot `length`. A joining prompt of P tokens is written to
// slots [length - P, length) of a free row (when the batch is younger than P, the others
// are first moved P - length slots on); a sequence that stops frees its row (the rows after
// it move up one, keeping the order). When the next token would not fit, the rows' slots
// move back by the oldest row's start (and the buffers grow when that frees too little).
// Positions count from each row's own start, so none of these moves changes a number.
//
// The prompt cache (options.prompt_cache_rows > 0; llama.cpp's cache_prompt, vLLM's prefix
// caching): a sequence that ends leaves its cached slots (its prompt and the tokens it fed
// back) in a store of that many rows, least recently used out first. A prompt that begins
// with one of them (a chat's next turn: the conversation so far, then the new message)
// copies the longest such prefix (at least PROMPT_CACHE_MIN_TOKENS, and never its last
// token, whose logits it needs) and runs only the rest of itself (model_extend_rows).
// Its tokens are then computed in another order than a full prefill's, so they match it
// up to float rounding, like a sequence's with batch-mates.
//
// Chunked prefill (options.prefill_chunk = N > 0; vLLM's max_num_batched_tokens, llama.cpp
// server's n_batch): continuous_batch_add only queues the requests, their rows reserved,
// and each step, after its decode forward, runs at most N tokens of the queued prompts, in
// order. Prompts that fit whole in what is left of the N join as add joins them (one
// prefill, left-padded, its padding counted); a longer one (or one that continues a stored
// prefix: copied in first, not counted) is prefilled into a staging cache of one row, a
// chunk per step -- the first chunk a prefill, the others extending it -- and when its last
// chunk is in, its slots are copied into the batch's cache to end at the next token's slot
// and it joins. So a long prompt costs the running rows at most N tokens of prefill per
// step instead of its whole prefill at once. Its keys and values are the same numbers a
// whole prefill writes up to float rounding (the later chunks attend to the earlier ones
// through the cache, and the matmuls run on other row counts); with a half or Q8_0 cache,
// through its rounded or 8-bit keys and values, as a decode step does. A queued sequence
// the stop check stops before its first token leaves then (on_finish gets an empty row).
#pragma once
#include <stdbool.h>
#include <stdint.h>

#include "gen/generate.h"
#include "gen/token_mask.h"

typedef struct {
    SamplerConfig sampler;
    uint64_t seed;
    uint64_t row_id;    // keys the random stream, as generate()'s row_ids
    int max_new_tokens; // >= 1
    int top_logprobs;   // alternatives recorded per token (0: none; at most the vocabulary)
    void *owner;        // handed back to the callbacks
    // Optional: the sequence's text must be accepted by this constraint (structured
    // outputs): each step samples from the logits masked by it (gen/token_mask.h), the stop
    // tokens only once the text is complete. The caller keeps it alive until on_finish.
    // Needs ContinuousOptions.token_trie. Log-probs stay the model's own (unmasked).
    const Constraint *constraint;
} SequenceOptions;

enum { PROMPT_CACHE_MIN_TOKENS = 8 };

// Sequences answering one prompt.
typedef struct {
    const int *prompt;
    int prompt_length; // >= 1
    const SequenceOptions *sequences;
    int num_sequences; // >= 1
    int cached_tokens; // out: the prompt's tokens taken from the prompt cache (OpenAI's cached_tokens)
} SequenceRequest;

typedef struct {
    const int *stop_tokens; // kept in the output, as generate() does
    int num_stop_tokens;
    int pad_token;          // fills the left padding of a prefill of several prompts
    // Called with each new token of each sequence (the row holds it, with its log-probs),
    // in row order (the order the sequences joined).
    void (*on_token)(void *context, void *owner, const GeneratedRow *row);
    // Optional: true stops the sequence after its latest token (stop strings, cancellation).
    // With prefill_chunk > 0 it is also asked, with an empty row (length 0), each step that
    // the sequence's request waits for or is in its prefill: true drops it before its first
    // token.
    bool (*stop_check)(void *context, void *owner, const GeneratedRow *row);
    // The sequence stopped (row->stop says why); the row's arrays pass to the callee
    // (generated_row_free).
    void (*on_finish)(void *context, void *owner, GeneratedRow *row);
    void *context;
    int prompt_cache_rows; // finished sequences kept for prompts that continue them (0: none)
    const TokenTrie *token_trie; // the vocabulary's trie, for sequences with a constraint
    int prefill_chunk;     // prompt tokens prefilled per step, between decode steps (0: whole
                           // prompts, in continuous_batch_add)
} ContinuousOptions;

typedef struct ContinuousBatch ContinuousBatch;

// A batch of at most max_rows sequences on `model` (an LM head). The batch keeps its state
// in its own KV cache and logits: the model's activations hold nothing it needs between two
// calls, so other forwards of the same model may run between them on the same thread
// (marlhf serve's embeddings do).
ContinuousBatch *continuous_batch_new(Model *model, int max_rows, const ContinuousOptions *options);
void continuous_batch_free(ContinuousBatch *batch);
// Rows taken: sequences decoding, and those queued for their prompt's prefill (chunked).
int continuous_batch_rows(const ContinuousBatch *batch);
// Adds the requests' sequences (at most max_rows - continuous_batch_rows in all) with one
// prefill forward; they get their first tokens at the next step. With prefill_chunk > 0
// they are queued (the prompts and sequence options copied) and the steps prefill them.
// Each request's cached_tokens is set now.
void continuous_batch_add(ContinuousBatch *batch, SequenceRequest *requests, int count);
// One token for every sequence: sample, report, retire the stopped ones, then the decode
// forward of the others; with prefill_chunk > 0, then up to that many tokens of the queued
// prompts (the sequences whose prompts are complete get their first tokens at the next
// step). Nothing to do without sequences.
void continuous_batch_step(ContinuousBatch *batch);

// Where the time went, since the batch was made.
typedef struct {
    double prefill_seconds, decode_seconds, relayout_seconds;
    long prefills, decode_steps, generated_tokens; // prefills: joins (prompts joining together count once)
    long prefill_chunks; // forwards of part of a prompt into the staging cache (chunked prefill)
    int prefilling_rows; // rows reserved now by requests queued for their prefill
    long relayouts;     // the cache's slots moved or its buffers grew, in all
    long moves_on;      // ... for a prompt longer than the batch so far
    long moves_back;    // ... for the next token's slot past the buffers' end
    long prompt_cache_hits;      // prompts that continued a stored sequence
    long prompt_tokens_reused;   // their tokens taken from the store (not computed)
    long backend_picked_tokens;  // tokens picked from the backend's results, not from copied logits
    long nucleus_misses;         // steps whose top-p rows' candidates fell short of a nucleus (logits copied)
    int capacity_slots; // the KV cache's slots per row now
} ContinuousStats;
void continuous_batch_stats(const ContinuousBatch *batch, ContinuousStats *stats);
