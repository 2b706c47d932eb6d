#include "gen/continuous.h"

#include <string.h>

#include "core/check.h"
#include "core/timer.h"

typedef struct {
    SequenceOptions options;
    GeneratedRow out;
    SamplerScratch scratch;
} Sequence;

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
    return batch;
}

void continuous_batch_free(ContinuousBatch *batch) {
    if (!batch) return;
    for (int r = 0; r < batch->rows; r++) {
        generated_row_free(&batch->sequences[r].out);
        sampler_scratch_free(&batch->sequences[r].scratch);
    }
    if (batch->has_cache) kv_cache_free(&batch->cache, batch->model);
    free(batch->sequences), free(batch->logits), free(batch->next);
    free(batch);
}

int continuous_batch_rows(const ContinuousBatch *batch) { return batch->rows; }

void continuous_batch_stats(const ContinuousBatch *batch, ContinuousStats *stats) {
    *stats = batch->stats;
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

void continuous_batch_add(ContinuousBatch *batch, const SequenceRequest *requests, int count) {
    Model *model = batch->model;
    const int V = model->config.vocab_size;
    int total = 0, longest = 0;
    for (int u = 0; u < count; u++) {
        CHECK(requests[u].prompt_length >= 1 && requests[u].num_sequences >= 1,
              "request %d has an empty prompt or no sequences", u);
        for (int j = 0; j < requests[u].num_sequences; j++)
            CHECK(requests[u].sequences[j].max_new_tokens >= 1, "request %d asks for no new tokens", u);
        total += requests[u].num_sequences;
        if (requests[u].prompt_length > longest) longest = requests[u].prompt_length;
    }
    if (count == 0) return;
    CHECK(batch->rows + total <= batch->max_rows, "%d sequences do not fit the %d free rows of %d", total,
          batch->max_rows - batch->rows, batch->max_rows);
    double start = now_seconds();
    // The prompts end at the slot the batch's next token goes to; a batch younger than the
    // longest prompt moves on first. The slot after it must exist for the first decode.
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

    // One prefill of the prompts, left-padded to the longest, into the rows after the
    // batch's; the further sequences of a prompt copy its row.
    int *tokens = xmalloc((size_t)count * longest * sizeof(int)), *row_start = xmalloc((size_t)count * sizeof(int));
    for (int u = 0; u < count; u++) {
        row_start[u] = longest - requests[u].prompt_length;
        for (int t = 0; t < row_start[u]; t++) tokens[(long)u * longest + t] = batch->options.pad_token;
        memcpy(tokens + (long)u * longest + row_start[u], requests[u].prompt,
               (size_t)requests[u].prompt_length * sizeof(int));
    }
    const int first = batch->rows;
    ModelBatch prefill = {.B = count, .T = longest, .tokens = tokens, .row_start = row_start};
    model_prefill_rows(model, &prefill, cache, first);
    model_last_logits(model, batch->logits + (long)first * V);
    free(tokens), free(row_start);
    int row = first + count;
    for (int u = 0; u < count; u++) {
        for (int j = 0; j < requests[u].num_sequences; j++) {
            const int at = j == 0 ? first + u : row++;
            if (at != first + u) {
                kv_cache_copy_row(cache, model, at, first + u);
                memcpy(batch->logits + (long)at * V, batch->logits + (long)(first + u) * V, (size_t)V * sizeof(float));
            }
            Sequence *sequence = &batch->sequences[at];
            sequence->options = requests[u].sequences[j];
            const int top = sequence->options.top_logprobs < V ? sequence->options.top_logprobs : V;
            generated_row_alloc(&sequence->out, sequence->options.max_new_tokens, top);
            sampler_scratch_init(&sequence->scratch, V);
        }
    }
    batch->rows += total;
    cache->B = batch->rows;
    batch->stats.prefill_seconds += now_seconds() - start;
    batch->stats.prefills++;
}

static bool is_stop_token(const ContinuousOptions *options, int token) {
    for (int i = 0; i < options->num_stop_tokens; i++)
        if (options->stop_tokens[i] == token) return true;
    return false;
}

void continuous_batch_step(ContinuousBatch *batch) {
    const int rows = batch->rows;
    if (rows == 0) return;
    Model *model = batch->model;
    const ContinuousOptions *options = &batch->options;
    const int V = model->config.vocab_size;
    double start = now_seconds();
#pragma omp parallel for schedule(static)
    for (int r = 0; r < rows; r++) {
        Sequence *sequence = &batch->sequences[r];
        const float *logits = batch->logits + (long)r * V;
        const double u = generate_uniform(sequence->options.seed, sequence->options.row_id, sequence->out.length);
        SampledToken picked = sampler_pick(logits, V, &sequence->options.sampler, u, &sequence->scratch);
        generated_row_append(&sequence->out, logits, V, picked);
        batch->next[r] = picked.token;
    }
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
            sampler_scratch_free(&sequence->scratch);
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
        model_last_logits(model, batch->logits);
    }
    batch->stats.decode_seconds += now_seconds() - start;
    batch->stats.decode_steps++;
}
