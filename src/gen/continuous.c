#include "gen/continuous.h"

#include <string.h>

#include "core/check.h"
#include "core/timer.h"

typedef struct {
    SequenceOptions options;
    GeneratedRow out;
    SamplerScratch scratch;
    int *prompt; // a copy, for the prompt cache (NULL without one)
    int prompt_length;
    // With options.constraint: the text's state, the masking's memory, the masked logits.
    ConstraintState *json;
    TokenMaskScratch mask;
    float *masked;
    // Top-p without top-k where the backend samples where the logits are: the candidates it
    // asks for (generate_nucleus_candidates; 0 before its first step, -1 for a nucleus too
    // wide for them)
    int nucleus_k;
} Sequence;

static void sequence_free(Sequence *sequence) {
    sampler_scratch_free(&sequence->scratch);
    free(sequence->prompt);
    if (sequence->json) token_mask_scratch_free(&sequence->mask);
    free(sequence->json), free(sequence->masked);
    sequence->json = NULL, sequence->masked = NULL, sequence->prompt = NULL;
}

// A prompt-cache entry: row `index` of the store holds these tokens' keys and values at
// slots [0, count).
typedef struct {
    int *tokens;
    int count;
    uint64_t last_used;
    int pins; // queued prompts that will copy it (chunked prefill): not replaced until they have
} StoredPrefix;

// A request queued for its prompt's prefill (options.prefill_chunk > 0): the queue's head
// is prefilled a chunk at a time into the staging cache, then joins the batch.
typedef struct {
    int *prompt; // a copy
    int prompt_length;
    SequenceOptions *sequences; // a copy; the ones dropped before their first token leave it
    int num_sequences;
    int entry;   // the prompt-cache entry it continues (pinned until copied), or -1
    int cached;  // that entry's tokens it takes
    bool started; // the staging cache holds its first `done` tokens (the queue's head only)
    int done;
} PendingPrompt;

struct ContinuousBatch {
    Model *model;
    ContinuousOptions options;
    int max_rows;
    int rows;            // sequences decoding: rows [0, rows) of everything below
    Sequence *sequences; // [max_rows]
    float *logits;       // [max_rows, V]: each row's next-token logits
    int *next;           // [max_rows]: each row's latest token, the next decode step's input
    KvCache cache;       // allocated by the first add, then grown as needed
    bool has_cache;
    ContinuousStats stats;
    // The prompt cache: options.prompt_cache_rows entries, their slots in `store` (every
    // row starting at slot 0; store.length the longest entry), allocated on first use.
    StoredPrefix *stored;
    KvCache store;
    bool has_store;
    uint64_t clock; // orders the entries' uses
    // Chunked prefill (options.prefill_chunk > 0): requests added wait here, in order, with
    // their rows reserved; the head's prompt goes into `staging` (one row from slot 0) a
    // chunk per step and is copied into the batch's cache when complete.
    PendingPrompt *pending; // [max_rows]
    int num_pending, pending_rows;
    KvCache staging;
    bool has_staging;
    // Picks left on the backend (generate.c does the same): when every row of a decode
    // forward is greedy or samples with top-k, or every row is greedy or samples the whole
    // vocabulary on a backend that samples whole rows (the GPU), with no constraint and no
    // top log-probs, its logits stay where the model computed them and rows [0,
    // backend_rows) take their tokens from model_last_greedy, their top-k candidates from
    // model_last_candidates, or their draws from model_last_sampled (backend_mode), instead
    // of `logits` (a [rows, V] copy and a pass over each row on the host); rows that join
    // after the forward bring their prefill's logits. On that backend rows with top-p and
    // no top-k take candidates too (nucleus_row), while those hold their nucleus (generate.c's
    // rule: a step where a row's fall short copies the logits, and the row asks for more from
    // then on, Sequence.nucleus_k). [max_rows] each, the candidates [max_rows,
    // candidate_capacity].
    int backend_rows;
    enum { BACKEND_GREEDY, BACKEND_CANDIDATES, BACKEND_WHOLE_ROWS } backend_mode;
    int *greedy_tokens, *drawn_tokens;
    float *greedy_logprobs, *inverse_temperature, *drawn_logprobs, *sampling_logprobs;
    double *uniforms;
    int *candidate_k, *candidate_counts, *candidate_ids;
    int candidate_capacity;
    float *candidate_values;
    double *candidate_lse, *candidate_scaled_lse;
    bool *nucleus_row;
};

ContinuousBatch *continuous_batch_new(Model *model, int max_rows, const ContinuousOptions *options) {
    CHECK(max_rows >= 1, "a continuous batch needs at least one row");
    CHECK(model->has_lm_head, "continuous batching needs a model with an LM head");
    ContinuousBatch *batch = xcalloc(1, sizeof *batch);
    batch->model = model;
    batch->options = *options;
    batch->max_rows = max_rows;
    batch->sequences = xcalloc((size_t)max_rows, sizeof(Sequence));
    batch->logits = xmalloc((size_t)max_rows * model->config.vocab_size * sizeof(float));
    batch->next = xmalloc((size_t)max_rows * sizeof(int));
    batch->greedy_tokens = xmalloc((size_t)max_rows * sizeof(int));
    batch->greedy_logprobs = xmalloc((size_t)max_rows * sizeof(float));
    batch->sampling_logprobs = xmalloc((size_t)max_rows * sizeof(float));
    batch->drawn_tokens = xmalloc((size_t)max_rows * sizeof(int));
    batch->drawn_logprobs = xmalloc((size_t)max_rows * sizeof(float));
    batch->uniforms = xmalloc((size_t)max_rows * sizeof(double));
    batch->inverse_temperature = xmalloc((size_t)max_rows * sizeof(float));
    batch->candidate_k = xmalloc((size_t)max_rows * sizeof(int));
    batch->candidate_counts = xmalloc((size_t)max_rows * sizeof(int));
    batch->candidate_lse = xmalloc((size_t)max_rows * sizeof(double));
    batch->candidate_scaled_lse = xmalloc((size_t)max_rows * sizeof(double));
    batch->nucleus_row = xmalloc((size_t)max_rows * sizeof(bool));
    // Both extend cached rows: the backend must attend from new slots to the cache's type.
    if (!kv_cache_can_extend(model)) batch->options.prompt_cache_rows = 0, batch->options.prefill_chunk = 0;
    CHECK(batch->options.prefill_chunk >= 0, "a prefill chunk of %d tokens", batch->options.prefill_chunk);
    if (batch->options.prefill_chunk > 0) batch->pending = xcalloc((size_t)max_rows, sizeof(PendingPrompt));
    if (batch->options.prompt_cache_rows > 0)
        batch->stored = xcalloc((size_t)batch->options.prompt_cache_rows, sizeof(StoredPrefix));
    return batch;
}

void continuous_batch_free(ContinuousBatch *batch) {
    if (!batch) return;
    for (int r = 0; r < batch->rows; r++) {
        generated_row_free(&batch->sequences[r].out);
        sequence_free(&batch->sequences[r]);
    }
    if (batch->has_cache) kv_cache_free(&batch->cache, batch->model);
    for (int e = 0; e < batch->options.prompt_cache_rows; e++) free(batch->stored[e].tokens);
    free(batch->stored);
    if (batch->has_store) kv_cache_free(&batch->store, batch->model);
    for (int p = 0; p < batch->num_pending; p++) free(batch->pending[p].prompt), free(batch->pending[p].sequences);
    free(batch->pending);
    if (batch->has_staging) kv_cache_free(&batch->staging, batch->model);
    free(batch->sequences), free(batch->logits), free(batch->next);
    free(batch->greedy_tokens), free(batch->greedy_logprobs), free(batch->inverse_temperature);
    free(batch->sampling_logprobs), free(batch->uniforms), free(batch->drawn_tokens), free(batch->drawn_logprobs);
    free(batch->candidate_k), free(batch->candidate_counts), free(batch->candidate_ids);
    free(batch->candidate_values), free(batch->candidate_lse), free(batch->candidate_scaled_lse);
    free(batch->nucleus_row);
    free(batch);
}

int continuous_batch_rows(const ContinuousBatch *batch) { return batch->rows + batch->pending_rows; }

void continuous_batch_stats(const ContinuousBatch *batch, ContinuousStats *stats) {
    *stats = batch->stats;
    stats->prefilling_rows = batch->pending_rows;
    stats->capacity_slots = batch->has_cache ? batch->cache.capacity_T : 0;
}

// Gives the cache at least `rows` rows and `slots` slots per row, moving the filled slots
// `shift` slots on. Sizes grow geometrically, so a batch that keeps growing is copied a
// logarithmic number of times (rows up to max_rows).
static void reshape_cache(ContinuousBatch *batch, int rows, int slots, int shift) {
    KvCache *cache = &batch->cache;
    if (!batch->has_cache) {
        kv_cache_init(cache, batch->model, rows, slots > 256 ? slots : 256);
        batch->has_cache = true;
        return;
    }
    if (rows <= cache->capacity_B && slots <= cache->capacity_T && shift == 0) return;
    int capacity_B = cache->capacity_B, capacity_T = cache->capacity_T;
    if (rows > capacity_B) {
        capacity_B = 2 * capacity_B < batch->max_rows ? 2 * capacity_B : batch->max_rows;
        if (rows > capacity_B) capacity_B = rows;
    }
    if (slots > capacity_T) capacity_T = slots > 2 * capacity_T ? slots : 2 * capacity_T;
    double start = now_seconds();
    kv_cache_relayout(cache, batch->model, capacity_B, capacity_T, shift);
    batch->stats.relayout_seconds += now_seconds() - start;
    batch->stats.relayouts++;
    batch->stats.moves_on += shift > 0;
    batch->stats.moves_back += shift < 0;
}

// The stored entry whose tokens begin the prompt for longest (at most prompt_length - 1:
// the prompt's last token must run to give its logits), and in *common how many; -1 (and
// 0) when none reaches PROMPT_CACHE_MIN_TOKENS.
static int find_prefix(const ContinuousBatch *batch, const int *prompt, int prompt_length, int *common) {
    int best = -1, best_common = 0;
    for (int e = 0; e < batch->options.prompt_cache_rows; e++) {
        const StoredPrefix *entry = &batch->stored[e];
        int n = 0;
        const int limit = entry->count < prompt_length - 1 ? entry->count : prompt_length - 1;
        while (n < limit && entry->tokens[n] == prompt[n]) n++;
        if (n > best_common) best = e, best_common = n;
    }
    if (best_common < PROMPT_CACHE_MIN_TOKENS) best = -1, best_common = 0;
    *common = best_common;
    return best;
}

// Keeps a finished sequence's cached slots (row `row` of the batch) in the store, in place
// of the least recently used entry.
static void store_prefix(ContinuousBatch *batch, int row) {
    const Sequence *sequence = &batch->sequences[row];
    const KvCache *cache = &batch->cache;
    // The cache holds the prompt and every token fed back: all but the last one sampled.
    const int count = sequence->prompt_length + sequence->out.length - 1;
    if (count < PROMPT_CACHE_MIN_TOKENS) return;
    CHECK(cache->length - cache->row_start[row] == count, "row %d holds %d slots, its sequence %d tokens", row,
          cache->length - cache->row_start[row], count);
    const int rows = batch->options.prompt_cache_rows;
    int entry = -1; // the least recently used of the entries no queued prompt waits for
    for (int e = 0; e < rows; e++)
        if (batch->stored[e].pins == 0 && (entry < 0 || batch->stored[e].last_used < batch->stored[entry].last_used))
            entry = e;
    if (entry < 0) return;
    KvCache *store = &batch->store;
    if (!batch->has_store) {
        kv_cache_init(store, batch->model, rows, count > 256 ? count : 256);
        store->B = rows; // every row starts at slot 0 (kv_cache_init zeroes row_start)
        batch->has_store = true;
    } else if (count > store->capacity_T) {
        kv_cache_relayout(store, batch->model, rows, count > 2 * store->capacity_T ? count : 2 * store->capacity_T, 0);
    }
    kv_cache_copy_slots(store, entry, 0, cache, row, cache->row_start[row], count, batch->model);
    if (count > store->length) store->length = count;
    StoredPrefix *stored = &batch->stored[entry];
    stored->tokens = xrealloc(stored->tokens, (size_t)count * sizeof(int));
    memcpy(stored->tokens, sequence->prompt, (size_t)sequence->prompt_length * sizeof(int));
    memcpy(stored->tokens + sequence->prompt_length, sequence->out.tokens,
           (size_t)(sequence->out.length - 1) * sizeof(int));
    stored->count = count;
    stored->last_used = ++batch->clock;
}

// Room for `total` more rows after batch->rows, for prompts of up to `longest` tokens that
// end at the slot the batch's next token goes to: a batch younger than the longest prompt
// moves on first. The slot after them must exist for the first decode.
static void make_room(ContinuousBatch *batch, int total, int longest) {
    KvCache *cache = &batch->cache;
    if (batch->rows == 0) {
        if (batch->has_cache) kv_cache_reset(cache);
        reshape_cache(batch, total, longest + 1, 0);
        cache->length = longest;
    } else {
        const int shift = longest > cache->length ? longest - cache->length : 0;
        reshape_cache(batch, batch->rows + total, cache->length + shift + 1, shift);
    }
    cache->B = batch->rows;
}

// Row `at`, whose cache slots and logits hold its prompt's, becomes a sequence.
static void start_sequence(ContinuousBatch *batch, int at, const SequenceOptions *options, const int *prompt,
                           int prompt_length) {
    const int V = batch->model->config.vocab_size;
    Sequence *sequence = &batch->sequences[at];
    sequence->options = *options;
    sequence->nucleus_k = 0;
    const int top = sequence->options.top_logprobs < V ? sequence->options.top_logprobs : V;
    generated_row_alloc(&sequence->out, sequence->options.max_new_tokens, top);
    sampler_scratch_init(&sequence->scratch, V);
    if (options->constraint) {
        CHECK(batch->options.token_trie, "a constrained sequence needs the vocabulary's token trie");
        sequence->json = xmalloc(sizeof(ConstraintState));
        constraint_state_init(options->constraint, sequence->json);
        token_mask_scratch_init(&sequence->mask, batch->options.token_trie);
        sequence->masked = xmalloc((size_t)V * sizeof(float));
    }
    // Penalties read the prompt and the answer so far, on a copy of the logits.
    const bool penalized = sampler_adjusts_logits(&sequence->options.sampler);
    if (penalized && !sequence->masked) sequence->masked = xmalloc((size_t)V * sizeof(float));
    if (batch->options.prompt_cache_rows > 0 || penalized) {
        sequence->prompt_length = prompt_length;
        sequence->prompt = xmalloc((size_t)prompt_length * sizeof(int));
        memcpy(sequence->prompt, prompt, (size_t)prompt_length * sizeof(int));
    }
}

// The requests' sequences join the batch with their whole prompts. Each request's first
// sequence gets a row after the batch's: the prompts that continue stored entry
// entry_of[u] (its requests[u].cached_tokens tokens) first, each extending a copy of it,
// then the others, in one prefill left-padded to the longest; the further sequences of a
// prompt copy its row.
static void join_whole(ContinuousBatch *batch, SequenceRequest *requests, int count, const int *entry_of) {
    Model *model = batch->model;
    const int V = model->config.vocab_size;
    int total = 0, longest = 0;
    for (int u = 0; u < count; u++) {
        total += requests[u].num_sequences;
        if (requests[u].prompt_length > longest) longest = requests[u].prompt_length;
    }
    make_room(batch, total, longest);
    KvCache *cache = &batch->cache;
    const int first = batch->rows;
    int *base_row = xmalloc((size_t)count * sizeof(int));
    int row = first, plain = 0, plain_longest = 0;
    for (int u = 0; u < count; u++) {
        if (entry_of[u] < 0) continue;
        const int P = requests[u].prompt_length, common = requests[u].cached_tokens;
        base_row[u] = row++;
        cache->row_start[base_row[u]] = cache->length - P;
        kv_cache_copy_slots(cache, base_row[u], cache->length - P, &batch->store, entry_of[u], 0, common, model);
        ModelBatch rest = {.B = 1, .T = P - common, .tokens = requests[u].prompt + common};
        model_extend_rows(model, &rest, cache, base_row[u]);
        model_last_logits(model, batch->logits + (long)base_row[u] * V);
        batch->stored[entry_of[u]].last_used = ++batch->clock;
        batch->stats.prompt_cache_hits++;
        batch->stats.prompt_tokens_reused += common;
    }
    for (int u = 0; u < count; u++)
        if (entry_of[u] < 0) {
            base_row[u] = row + plain++;
            if (requests[u].prompt_length > plain_longest) plain_longest = requests[u].prompt_length;
        }
    if (plain > 0) {
        int *tokens = xmalloc((size_t)plain * plain_longest * sizeof(int)), *row_start = xmalloc((size_t)plain * sizeof(int));
        for (int u = 0, i = 0; u < count; u++) {
            if (entry_of[u] >= 0) continue;
            row_start[i] = plain_longest - requests[u].prompt_length;
            for (int t = 0; t < row_start[i]; t++) tokens[(long)i * plain_longest + t] = batch->options.pad_token;
            memcpy(tokens + (long)i * plain_longest + row_start[i], requests[u].prompt,
                   (size_t)requests[u].prompt_length * sizeof(int));
            i++;
        }
        ModelBatch prefill = {.B = plain, .T = plain_longest, .tokens = tokens, .row_start = row_start};
        model_prefill_rows(model, &prefill, cache, row);
        model_last_logits(model, batch->logits + (long)row * V);
        free(tokens), free(row_start);
        row += plain;
    }
    for (int u = 0; u < count; u++) {
        for (int j = 0; j < requests[u].num_sequences; j++) {
            const int at = j == 0 ? base_row[u] : row++;
            if (at != base_row[u]) {
                kv_cache_copy_row(cache, model, at, base_row[u]);
                memcpy(batch->logits + (long)at * V, batch->logits + (long)base_row[u] * V, (size_t)V * sizeof(float));
            }
            start_sequence(batch, at, &requests[u].sequences[j], requests[u].prompt, requests[u].prompt_length);
        }
    }
    free(base_row);
    batch->rows += total;
    cache->B = batch->rows;
    batch->stats.prefills++;
}

// Chunked prefill: the requests wait in the queue, their rows reserved; a prompt that
// continues a stored entry pins it, so that the entry is still there when its prefill starts.
static void queue_requests(ContinuousBatch *batch, SequenceRequest *requests, int count) {
    for (int u = 0; u < count; u++) {
        PendingPrompt *pending = &batch->pending[batch->num_pending++];
        const int P = requests[u].prompt_length, n = requests[u].num_sequences;
        *pending = (PendingPrompt){.prompt = xmalloc((size_t)P * sizeof(int)),
                                   .prompt_length = P,
                                   .sequences = xmalloc((size_t)n * sizeof(SequenceOptions)),
                                   .num_sequences = n,
                                   .entry = -1};
        memcpy(pending->prompt, requests[u].prompt, (size_t)P * sizeof(int));
        memcpy(pending->sequences, requests[u].sequences, (size_t)n * sizeof(SequenceOptions));
        if (batch->options.prompt_cache_rows > 0)
            pending->entry = find_prefix(batch, pending->prompt, P, &pending->cached);
        if (pending->entry >= 0) batch->stored[pending->entry].pins++;
        requests[u].cached_tokens = pending->cached;
        batch->pending_rows += n;
    }
}

void continuous_batch_add(ContinuousBatch *batch, SequenceRequest *requests, int count) {
    int total = 0;
    for (int u = 0; u < count; u++) {
        CHECK(requests[u].prompt_length >= 1 && requests[u].num_sequences >= 1,
              "request %d has an empty prompt or no sequences", u);
        for (int j = 0; j < requests[u].num_sequences; j++)
            CHECK(requests[u].sequences[j].max_new_tokens >= 1, "request %d asks for no new tokens", u);
        total += requests[u].num_sequences;
    }
    if (count == 0) return;
    const int taken = continuous_batch_rows(batch);
    CHECK(taken + total <= batch->max_rows, "%d sequences do not fit the %d free rows of %d", total,
          batch->max_rows - taken, batch->max_rows);
    if (batch->options.prefill_chunk > 0) {
        queue_requests(batch, requests, count);
        return;
    }
    double start = now_seconds();
    int *entry_of = xmalloc((size_t)count * sizeof(int));
    for (int u = 0; u < count; u++) {
        requests[u].cached_tokens = 0;
        entry_of[u] = batch->options.prompt_cache_rows > 0
                          ? find_prefix(batch, requests[u].prompt, requests[u].prompt_length, &requests[u].cached_tokens)
                          : -1;
    }
    join_whole(batch, requests, count, entry_of);
    free(entry_of);
    batch->stats.prefill_seconds += now_seconds() - start;
}

// Takes queued request p off the queue (and its pin off the entry it has not copied yet).
static void remove_pending(ContinuousBatch *batch, int p) {
    PendingPrompt *pending = &batch->pending[p];
    if (pending->entry >= 0) batch->stored[pending->entry].pins--;
    batch->pending_rows -= pending->num_sequences;
    free(pending->prompt), free(pending->sequences);
    memmove(pending, pending + 1, (size_t)(batch->num_pending - p - 1) * sizeof(PendingPrompt));
    batch->num_pending--;
}

// A queued sequence that the stop check stops (a client gone, a timeout) leaves before its
// first token: on_finish gets an empty row. A request left without sequences leaves the
// queue, mid-prefill or not.
static void drop_stopped_pending(ContinuousBatch *batch) {
    const ContinuousOptions *options = &batch->options;
    if (!options->stop_check) return;
    for (int p = 0; p < batch->num_pending;) {
        PendingPrompt *pending = &batch->pending[p];
        int kept = 0;
        for (int j = 0; j < pending->num_sequences; j++) {
            const SequenceOptions sequence = pending->sequences[j];
            GeneratedRow empty = {0};
            if (options->stop_check(options->context, sequence.owner, &empty)) {
                empty.stop = STOP_CHECK;
                batch->pending_rows--;
                options->on_finish(options->context, sequence.owner, &empty);
            } else {
                pending->sequences[kept++] = sequence;
            }
        }
        pending->num_sequences = kept;
        if (kept == 0) remove_pending(batch, p);
        else p++;
    }
}

// The next `count` tokens of the queue head's prompt go into the staging cache: its first
// chunk as a prefill (after the stored prefix it continues, copied in, if any), the others
// extending the slots before them.
static void prefill_head_chunk(ContinuousBatch *batch, int count) {
    Model *model = batch->model;
    PendingPrompt *head = &batch->pending[0];
    KvCache *staging = &batch->staging;
    if (!head->started) {
        const int P = head->prompt_length;
        if (batch->has_staging && P > staging->capacity_T) {
            const int slots = P > 2 * staging->capacity_T ? P : 2 * staging->capacity_T;
            kv_cache_free(staging, model);
            kv_cache_init(staging, model, 1, slots);
        } else if (!batch->has_staging) {
            kv_cache_init(staging, model, 1, P > 256 ? P : 256);
            batch->has_staging = true;
        }
        kv_cache_reset(staging);
        staging->B = 1;
        staging->row_start[0] = 0;
        head->done = 0;
        if (head->entry >= 0) {
            StoredPrefix *stored = &batch->stored[head->entry];
            kv_cache_copy_slots(staging, 0, 0, &batch->store, head->entry, 0, head->cached, model);
            stored->pins--;
            stored->last_used = ++batch->clock;
            batch->stats.prompt_cache_hits++;
            batch->stats.prompt_tokens_reused += head->cached;
            head->done = head->cached;
            head->entry = -1;
        }
        head->started = true;
    }
    // The kernels of the prompt's whole prefill (all but the stored prefix in one forward).
    ModelBatch chunk = {.B = 1, .T = count, .tokens = head->prompt + head->done,
                        .kernel_rows = head->prompt_length - head->cached};
    staging->length = head->done + count;
    if (head->done == 0) model_prefill_rows(model, &chunk, staging, 0);
    else model_extend_rows(model, &chunk, staging, 0);
    head->done += count;
    batch->stats.prefill_chunks++;
}

// The queue's head, its whole prompt in the staging cache and its next-token logits in row
// batch->rows of the logits, joins the batch: its slots are copied to end at the slot the
// batch's next token goes to, and its further sequences copy its row.
static void join_staged(ContinuousBatch *batch) {
    Model *model = batch->model;
    const int V = model->config.vocab_size;
    const PendingPrompt *head = &batch->pending[0];
    const int P = head->prompt_length, first = batch->rows;
    make_room(batch, head->num_sequences, P);
    KvCache *cache = &batch->cache;
    cache->row_start[first] = cache->length - P;
    kv_cache_copy_slots(cache, first, cache->length - P, &batch->staging, 0, 0, P, model);
    for (int j = 0; j < head->num_sequences; j++) {
        if (j > 0) {
            kv_cache_copy_row(cache, model, first + j, first);
            memcpy(batch->logits + (long)(first + j) * V, batch->logits + (long)first * V, (size_t)V * sizeof(float));
        }
        start_sequence(batch, first + j, &head->sequences[j], head->prompt, P);
    }
    batch->rows += head->num_sequences;
    cache->B = batch->rows;
    batch->stats.prefills++;
    remove_pending(batch, 0);
}

// A step's prefill (chunked): at most prefill_chunk prompt tokens of the queued requests,
// in order. Whole prompts that fit go together into one prefill left-padded to the longest
// (their padded slots counted), as continuous_batch_add's; a prompt that does not (or that
// continues a stored entry) goes into the staging cache as much as fits, and joins when
// its last chunk is in.
static void prefill_step(ContinuousBatch *batch) {
    const int V = batch->model->config.vocab_size;
    drop_stopped_pending(batch);
    int budget = batch->options.prefill_chunk;
    while (budget > 0 && batch->num_pending > 0) {
        PendingPrompt *head = &batch->pending[0];
        if (!head->started && head->entry < 0 && head->prompt_length <= budget) {
            int count = 0, longest = 0;
            while (count < batch->num_pending) {
                const PendingPrompt *next = &batch->pending[count];
                const int padded = next->prompt_length > longest ? next->prompt_length : longest;
                if (next->entry >= 0 || (long)padded * (count + 1) > budget) break;
                longest = padded;
                count++;
            }
            SequenceRequest *requests = xmalloc((size_t)count * sizeof(SequenceRequest));
            int *entry_of = xmalloc((size_t)count * sizeof(int));
            for (int u = 0; u < count; u++) {
                const PendingPrompt *pending = &batch->pending[u];
                requests[u] = (SequenceRequest){pending->prompt, pending->prompt_length, pending->sequences,
                                                pending->num_sequences, 0};
                entry_of[u] = -1;
            }
            join_whole(batch, requests, count, entry_of);
            free(requests), free(entry_of);
            for (int u = 0; u < count; u++) remove_pending(batch, 0);
            budget -= longest * count;
            continue;
        }
        const int left = head->prompt_length - (head->started ? head->done : head->cached);
        const int count = left < budget ? left : budget;
        prefill_head_chunk(batch, count);
        budget -= count;
        if (head->done == head->prompt_length) {
            model_last_logits(batch->model, batch->logits + (long)batch->rows * V);
            join_staged(batch);
        }
    }
}

static bool is_stop_token(const ContinuousOptions *options, int token) {
    for (int i = 0; i < options->num_stop_tokens; i++)
        if (options->stop_tokens[i] == token) return true;
    return false;
}

// After the decode forward of `rows` rows: their picks from the backend where every row
// allows it (the struct's comment), else false and the caller copies the logits.
static bool picks_on_backend(ContinuousBatch *batch, int rows) {
    const int V = batch->model->config.vocab_size;
    const bool on_backend = batch->model->ops->samples_whole_rows;
    bool all_greedy = true, any_greedy = false, by_candidates = true, whole_rows = on_backend, any_nucleus = false;
    int largest_k = 1;
    for (int r = 0; r < rows; r++) {
        Sequence *sequence = &batch->sequences[r];
        const SamplerConfig *sampler = &sequence->options.sampler;
        const bool greedy = sampler->temperature <= 0.0f;
        if (sequence->json || sequence->options.top_logprobs > 0 || sampler_adjusts_logits(sampler)) return false;
        const bool nucleus = on_backend && sampler_keeps_top_p_only(sampler, V);
        if (nucleus && sequence->nucleus_k == 0) sequence->nucleus_k = generate_nucleus_candidates(0, V);
        if (nucleus && sequence->nucleus_k < 0) return false; // (too wide a nucleus: the host samples)
        batch->nucleus_row[r] = nucleus;
        any_nucleus = any_nucleus || nucleus;
        all_greedy = all_greedy && greedy;
        any_greedy = any_greedy || greedy;
        by_candidates = by_candidates && (greedy || sampler_keeps_top_k(sampler, V) || nucleus);
        whole_rows = whole_rows && (greedy || sampler_samples_whole_row(sampler, V));
        batch->inverse_temperature[r] = greedy ? 1.0f : 1.0f / sampler->temperature; // as the sampler scales
        batch->candidate_k[r] = greedy ? 1 : nucleus ? sequence->nucleus_k : sampler->top_k;
        if (batch->candidate_k[r] > largest_k) largest_k = batch->candidate_k[r];
    }
    if (all_greedy) {
        batch->backend_mode = BACKEND_GREEDY;
        model_last_greedy(batch->model, batch->greedy_tokens, batch->greedy_logprobs);
        return true;
    }
    if (whole_rows) { // (greedy rows beside the draws take model_last_greedy's tokens)
        batch->backend_mode = BACKEND_WHOLE_ROWS;
        for (int r = 0; r < rows; r++) { // the numbers the host's sampler would take for the next tokens
            const SequenceOptions *options = &batch->sequences[r].options;
            batch->uniforms[r] = generate_uniform(options->seed, options->row_id, batch->sequences[r].out.length);
        }
        if (!model_last_sampled(batch->model, batch->inverse_temperature, batch->uniforms, batch->drawn_tokens,
                                batch->drawn_logprobs, batch->sampling_logprobs))
            return false;
        if (any_greedy) model_last_greedy(batch->model, batch->greedy_tokens, batch->greedy_logprobs);
        return true;
    }
    if (!by_candidates) return false;
    batch->backend_mode = BACKEND_CANDIDATES;
    const int capacity = generate_candidate_capacity(largest_k, V);
    if (capacity > batch->candidate_capacity) {
        batch->candidate_capacity = capacity;
        free(batch->candidate_ids), free(batch->candidate_values);
        batch->candidate_ids = xmalloc((size_t)batch->max_rows * capacity * sizeof(int));
        batch->candidate_values = xmalloc((size_t)batch->max_rows * capacity * sizeof(float));
    }
    if (!model_last_candidates(batch->model, batch->inverse_temperature, batch->candidate_k, batch->candidate_capacity,
                               batch->candidate_counts, batch->candidate_ids, batch->candidate_values,
                               batch->candidate_lse, any_nucleus ? batch->candidate_scaled_lse : NULL))
        return false;
    bool held = true;
    for (int r = 0; r < rows; r++) {
        Sequence *sequence = &batch->sequences[r];
        if (!batch->nucleus_row[r] ||
            sampler_candidates_hold_nucleus(batch->candidate_values + (long)r * batch->candidate_capacity,
                                            batch->candidate_counts[r], batch->candidate_scaled_lse[r],
                                            &sequence->options.sampler))
            continue;
        held = false; // the row's next steps ask for more (the buffers grow then)
        sequence->nucleus_k = generate_nucleus_candidates(sequence->nucleus_k, V);
    }
    if (!held) batch->stats.nucleus_misses++;
    return held;
}

// Sample, report, retire, then the decode forward of the rows left.
static void decode_step(ContinuousBatch *batch) {
    const int rows = batch->rows;
    Model *model = batch->model;
    const ContinuousOptions *options = &batch->options;
    const int V = model->config.vocab_size;
    double start = now_seconds();
#pragma omp parallel for schedule(static)
    for (int r = 0; r < rows; r++) {
        Sequence *sequence = &batch->sequences[r];
        const float *logits = batch->logits + (long)r * V;
        const double u = generate_uniform(sequence->options.seed, sequence->options.row_id, sequence->out.length);
        SampledToken picked;
        const Constraint *constraint = sequence->options.constraint;
        if (r < batch->backend_rows) { // (no constraint, no top log-probs: picks_on_backend)
            const long first = (long)r * batch->candidate_capacity;
            const bool greedy = sequence->options.sampler.temperature <= 0.0f;
            if (batch->backend_mode == BACKEND_GREEDY || (batch->backend_mode == BACKEND_WHOLE_ROWS && greedy))
                picked = (SampledToken){.token = batch->greedy_tokens[r], .logprob = batch->greedy_logprobs[r]};
            else if (batch->backend_mode == BACKEND_WHOLE_ROWS)
                picked = (SampledToken){.token = batch->drawn_tokens[r],
                                        .logprob = batch->drawn_logprobs[r],
                                        .sampling_logprob = batch->sampling_logprobs[r]};
            else if (batch->nucleus_row[r])
                picked = sampler_pick_nucleus_candidates(batch->candidate_values + first, batch->candidate_ids + first,
                                                         batch->candidate_counts[r], batch->candidate_lse[r],
                                                         batch->candidate_scaled_lse[r], &sequence->options.sampler, u,
                                                         &sequence->scratch);
            else
                picked = sampler_pick_candidates(batch->candidate_values + first, batch->candidate_ids + first,
                                                 batch->candidate_counts[r], batch->candidate_lse[r],
                                                 &sequence->options.sampler, u, &sequence->scratch);
            generated_row_append(&sequence->out, NULL, V, picked);
            batch->next[r] = picked.token;
            continue;
        }
        const SamplerConfig *sampler = &sequence->options.sampler;
        const bool penalized = sampler_adjusts_logits(sampler);
        if (sequence->json && !penalized &&
            token_mask_pick_greedy(options->token_trie, constraint, sequence->json, options->stop_tokens,
                                   options->num_stop_tokens, true, logits, V, &sequence->options.sampler,
                                   &sequence->mask, &picked)) {
            picked.logprob = sampler_logprob(logits, V, picked.token); // as on the masked path
            token_mask_advance(options->token_trie, constraint, sequence->json, picked.token);
        } else if (sequence->json) {
            const int allowed = token_mask_apply(options->token_trie, constraint, sequence->json, options->stop_tokens,
                                                 options->num_stop_tokens, logits, sequence->masked, V, &sequence->mask);
            if (penalized)
                sampler_adjust_logits(sampler, sequence->masked, V, sequence->prompt, sequence->prompt_length,
                                 sequence->out.tokens, sequence->out.length, &sequence->scratch);
            if (allowed > 0) {
                picked = sampler_pick(sequence->masked, V, &sequence->options.sampler, u, &sequence->scratch);
            } else { // nothing fits (a compiled constraint never gets here): the row ends
                CHECK(options->num_stop_tokens > 0, "a constrained row without stop tokens");
                picked = (SampledToken){.token = options->stop_tokens[0]};
            }
            picked.logprob = sampler_logprob(logits, V, picked.token); // the model's own
            token_mask_advance(options->token_trie, constraint, sequence->json, picked.token);
        } else if (penalized) {
            memcpy(sequence->masked, logits, (size_t)V * sizeof(float));
            sampler_adjust_logits(sampler, sequence->masked, V, sequence->prompt, sequence->prompt_length,
                             sequence->out.tokens, sequence->out.length, &sequence->scratch);
            picked = sampler_pick(sequence->masked, V, sampler, u, &sequence->scratch);
            picked.logprob = sampler_logprob(logits, V, picked.token); // the model's own
        } else {
            picked = sampler_pick(logits, V, &sequence->options.sampler, u, &sequence->scratch);
        }
        generated_row_append(&sequence->out, logits, V, picked);
        batch->next[r] = picked.token;
    }
    batch->stats.backend_picked_tokens += batch->backend_rows;
    batch->backend_rows = 0; // (used: the rows move below)
    for (int r = 0; r < rows; r++) {
        Sequence *sequence = &batch->sequences[r];
        GeneratedRow *out = &sequence->out;
        if (options->on_token) options->on_token(options->context, sequence->options.owner, out);
        if (is_stop_token(options, batch->next[r])) out->stop = STOP_TOKEN;
        else if (options->stop_check && options->stop_check(options->context, sequence->options.owner, out))
            out->stop = STOP_CHECK;
        else if (out->length == sequence->options.max_new_tokens) out->stop = STOP_LENGTH;
    }
    batch->stats.generated_tokens += rows;
    // The stopped sequences leave; the others move up, in order, with their cache rows.
    int kept = 0;
    for (int r = 0; r < rows; r++) {
        Sequence *sequence = &batch->sequences[r];
        if (sequence->out.stop != STOP_NONE) {
            if (options->prompt_cache_rows > 0) store_prefix(batch, r);
            sequence_free(sequence);
            GeneratedRow out = sequence->out;
            void *owner = sequence->options.owner;
            memset(sequence, 0, sizeof *sequence);
            options->on_finish(options->context, owner, &out);
            continue;
        }
        if (kept != r) {
            kv_cache_copy_row(&batch->cache, model, kept, r);
            batch->sequences[kept] = *sequence;
            memset(sequence, 0, sizeof *sequence);
            batch->next[kept] = batch->next[r];
        }
        kept++;
    }
    batch->rows = kept;
    batch->cache.B = kept;
    if (kept > 0) {
        // The next token's slot must exist: the rows' slots move back by the oldest row's
        // start, and the buffers double when that would leave less than a quarter free.
        KvCache *cache = &batch->cache;
        if (cache->length == cache->capacity_T) {
            int oldest = cache->row_start[0];
            for (int r = 1; r < kept; r++)
                if (cache->row_start[r] < oldest) oldest = cache->row_start[r];
            const int filled = cache->length - oldest;
            int slots = cache->capacity_T - filled < cache->capacity_T / 4 ? 2 * cache->capacity_T : cache->capacity_T;
            if (slots < filled + 1) slots = filled + 1;
            reshape_cache(batch, kept, slots, -oldest);
        }
        ModelBatch decode = {.B = kept, .T = 1, .tokens = batch->next};
        model_forward_cached(model, &decode, cache);
        if (picks_on_backend(batch, kept)) batch->backend_rows = kept;
        else model_last_logits(model, batch->logits);
    }
    batch->stats.decode_seconds += now_seconds() - start;
    batch->stats.decode_steps++;
}

void continuous_batch_step(ContinuousBatch *batch) {
    if (batch->rows > 0) decode_step(batch);
    if (batch->num_pending > 0) {
        double start = now_seconds();
        prefill_step(batch);
        batch->stats.prefill_seconds += now_seconds() - start;
    }
}
