#include "gen/generate.h"

#include <math.h>
#include <string.h>

#include "core/check.h"
#include "core/rng.h"
#include "core/timer.h"

const char *stop_reason_name(StopReason reason) {
    switch (reason) {
    case STOP_TOKEN: return "stop_token";
    case STOP_CHECK: return "stop_string";
    case STOP_LENGTH: return "length";
    default: return "none";
    }
}

void generated_row_free(GeneratedRow *row) {
    free(row->tokens);
    free(row->logprobs);
    free(row->sampling_logprobs);
    free(row->top_tokens);
    free(row->top_logprobs);
    memset(row, 0, sizeof *row);
}

void generated_row_alloc(GeneratedRow *row, int max_new_tokens, int top_count) {
    memset(row, 0, sizeof *row);
    row->tokens = xmalloc((size_t)max_new_tokens * sizeof(int));
    row->logprobs = xmalloc((size_t)max_new_tokens * sizeof(float));
    row->sampling_logprobs = xmalloc((size_t)max_new_tokens * sizeof(float));
    if (top_count > 0) {
        row->top_count = top_count;
        row->top_tokens = xmalloc((size_t)max_new_tokens * top_count * sizeof(int));
        row->top_logprobs = xmalloc((size_t)max_new_tokens * top_count * sizeof(float));
    }
}

// log softmax(logits)[token], summed in double.
static float log_softmax_at(const float *logits, int V, int token) {
    float max_logit = logits[0];
    for (int v = 1; v < V; v++) max_logit = logits[v] > max_logit ? logits[v] : max_logit;
    double sum = 0;
    for (int v = 0; v < V; v++) sum += exp((double)(logits[v] - max_logit));
    return (float)(logits[token] - max_logit - log(sum));
}

// The k most likely tokens of a row of logits, most likely first (ties: the lower id first),
// and their log-probs under the model. The normaliser is computed as sampler_pick computes
// the chosen token's log-prob, so that a greedy token's log-prob and its first alternative's
// are the same float.
static void record_top(const float *logits, int V, int k, int *top_tokens, float *top_logprobs) {
    float max_logit = logits[0];
    for (int v = 1; v < V; v++)
        if (logits[v] > max_logit) max_logit = logits[v];
    double sum = 0;
    for (int v = 0; v < V; v++) sum += exp((double)(logits[v] - max_logit));
    const double log_normaliser = max_logit + log(sum);
    // Insertion into the best k so far, in one pass: a token enters only when it beats the
    // last kept one strictly (on a tie the kept token has the lower id), and moves up past
    // the kept tokens it beats strictly.
    int count = 0;
    for (int v = 0; v < V; v++) {
        if (count == k && !(logits[v] > logits[top_tokens[k - 1]])) continue;
        int at = count < k ? count++ : k - 1;
        while (at > 0 && logits[v] > logits[top_tokens[at - 1]]) {
            top_tokens[at] = top_tokens[at - 1];
            at--;
        }
        top_tokens[at] = v;
    }
    for (int j = 0; j < k; j++) top_logprobs[j] = (float)(logits[top_tokens[j]] - log_normaliser);
}

// Rows whose prompts are equal: source[b] is the index, in order of first appearance, of row
// b's prompt among the distinct ones (so source[b] <= b), first_row[u] the first row with
// prompt u. Returns the number of distinct prompts.
static int distinct_prompts(const int *const *prompts, const int *prompt_lengths, int B, int *source, int *first_row) {
    int U = 0;
    for (int b = 0; b < B; b++) {
        int u = 0;
        for (; u < U; u++) {
            const int f = first_row[u];
            if (prompt_lengths[f] == prompt_lengths[b] &&
                (prompts[f] == prompts[b] || !memcmp(prompts[f], prompts[b], (size_t)prompt_lengths[b] * sizeof(int))))
                break;
        }
        if (u == U) first_row[U++] = b;
        source[b] = u;
    }
    return U;
}

void generated_row_append(GeneratedRow *row, const float *logits, int V, SampledToken picked) {
    row->tokens[row->length] = picked.token;
    row->logprobs[row->length] = picked.logprob;
    row->sampling_logprobs[row->length] = picked.sampling_logprob;
    if (row->top_count > 0)
        record_top(logits, V, row->top_count, row->top_tokens + (long)row->length * row->top_count,
                   row->top_logprobs + (long)row->length * row->top_count);
    row->length++;
}

double generate_uniform(uint64_t seed, uint64_t row_id, int step) {
    return rng_uniform_double(seed, rng_stream("sample", row_id, 0), (uint64_t)step);
}

// The prefill of `prefill`'s rows into the empty cache, and each row's last logits: one
// forward, or (0 < chunk_rows < the rows) one for each chunk of chunk_rows rows, written to
// its rows of the cache (model_prefill_rows).
static void prefill_rows(Model *model, const ModelBatch *prefill, KvCache *cache, int chunk_rows, float *logits) {
    if (chunk_rows <= 0 || chunk_rows >= prefill->B) {
        model_forward_cached(model, prefill, cache);
        model_last_logits(model, logits);
        return;
    }
    const long V = model->config.vocab_size, T = prefill->T;
    cache->B = prefill->B;
    cache->length = prefill->T;
    for (int first = 0; first < prefill->B; first += chunk_rows) {
        const int rows = prefill->B - first < chunk_rows ? prefill->B - first : chunk_rows;
        ModelBatch chunk = {.B = rows, .T = prefill->T, .tokens = prefill->tokens + first * T,
                            .row_start = prefill->row_start + first};
        model_prefill_rows(model, &chunk, cache, first);
        model_last_logits(model, logits + first * V);
    }
}

static bool is_stop_token(const GenerateOptions *options, int token) {
    for (int i = 0; i < options->num_stop_tokens; i++)
        if (options->stop_tokens[i] == token) return true;
    return false;
}

void generate(Model *model, const int *const *prompts, const int *prompt_lengths,
              const uint64_t *row_ids, int B, const GenerateOptions *options, GeneratedRow *out,
              GenerateStats *stats) {
    const int V = model->config.vocab_size;
    const int max_new = options->max_new_tokens;
    CHECK(B > 0 && max_new > 0, "generate needs rows and a positive max_new_tokens");
    for (int b = 0; options->row_max_new_tokens && b < B; b++)
        CHECK(options->row_max_new_tokens[b] > 0 && options->row_max_new_tokens[b] <= max_new,
              "row %d asks for %d new tokens (1 to %d)", b, options->row_max_new_tokens[b], max_new);
    // A row holds at most the model's context: prompt and new tokens, each at its position.
    // Its limit depends on its own prompt only, so a row's answer does not depend on its batch.
    const int context = model->config.max_position_embeddings;
    int T0 = 0;
    int *limit = xmalloc((size_t)B * sizeof(int));
    for (int b = 0; b < B; b++) {
        CHECK(prompt_lengths[b] > 0, "row %d has an empty prompt", b);
        CHECK(prompt_lengths[b] < context, "row %d's prompt of %d tokens leaves no room in the model's %d positions",
              b, prompt_lengths[b], context);
        if (prompt_lengths[b] > T0) T0 = prompt_lengths[b];
        const int asked = options->row_max_new_tokens ? options->row_max_new_tokens[b] : max_new;
        limit[b] = asked < context - prompt_lengths[b] ? asked : context - prompt_lengths[b];
    }
    // Left padding: every row's next token lands in the same cache slot.
    int *tokens = xmalloc((size_t)B * T0 * sizeof(int)), *row_start = xmalloc((size_t)B * sizeof(int));
    for (int b = 0; b < B; b++) {
        row_start[b] = T0 - prompt_lengths[b];
        for (int t = 0; t < row_start[b]; t++) tokens[(long)b * T0 + t] = options->pad_token;
        memcpy(tokens + (long)b * T0 + row_start[b], prompts[b], (size_t)prompt_lengths[b] * sizeof(int));
    }
    const int top_count = options->top_logprobs < V ? options->top_logprobs : V;
    for (int b = 0; b < B; b++) generated_row_alloc(&out[b], max_new, top_count);

    KvCache cache;
    kv_cache_init(&cache, model, B, T0 + max_new);
    // A trainable model (PPO's actor) keeps the layout reserved for its training where its
    // decode steps fit it: prompts with more slots than it has are prefilled in chunks of
    // rows that do (prefill below), rather than freeing it for a generation layout that the
    // next training forward would free again (on a GPU, runs of cudaFree, each waiting for
    // the device).
    const bool decode_fits = model->grads && model_cached_rows_fitting(model, 1) >= B;
    const int chunk_rows = decode_fits ? model_cached_rows_fitting(model, T0) : 0;
    if (chunk_rows < 1) model_reserve_cached(model, B, T0);
    float *logits = xmalloc((size_t)B * V * sizeof(float));
    int *next = xmalloc((size_t)B * sizeof(int));
    // Penalties on the tokens seen read each row's logits on the host (sampler_adjust_logits).
    bool any_penalized = false;
    for (int b = 0; b < B; b++)
        any_penalized = any_penalized ||
                        sampler_adjusts_logits(options->row_samplers ? &options->row_samplers[b] : &options->sampler);
    float *masked_logits = options->min_new_tokens > 0 || options->constraint || any_penalized
                               ? xmalloc((size_t)B * V * sizeof(float))
                               : NULL;
    ConstraintState *json = NULL;
    TokenMaskScratch *mask = NULL;
    if (options->constraint) {
        CHECK(options->token_trie, "constrained generation needs the vocabulary's token trie");
        json = xmalloc((size_t)B * sizeof(ConstraintState));
        mask = xmalloc((size_t)B * sizeof(TokenMaskScratch));
        for (int b = 0; b < B; b++) {
            constraint_state_init(options->constraint, &json[b]);
            token_mask_scratch_init(&mask[b], options->token_trie);
        }
    }
    // Rows with nothing that reads their logits on the host (a constraint, the top log-probs,
    // min_new_tokens' masking of the stop tokens) leave them where the model computed them:
    // greedy rows take their token and its log-prob from model_last_greedy, and rows sampled
    // with top-k (greedy ones beside them as top-k 1) their top-k candidates and
    // log-normaliser from model_last_candidates, instead of the B x V logits (12.6 MB a step
    // at batch 64 of a 49k vocabulary) and a pass over each on the host. Where the backend
    // samples where the logits are (the GPU; OpsBackend.samples_whole_rows), so do rows
    // with top-p and no top-k, from their largest logits while those hold the nucleus
    // (sampler_candidates_hold_nucleus; a step where a row's fall short copies the logits,
    // and the row asks for more from then on, up to a most: generate_nucleus_candidates,
    // nucleus_k); and rows that sample the
    // whole vocabulary take their draw from model_last_sampled, greedy ones beside them
    // their model_last_greedy token. Elsewhere the host samples the copied row.
    const bool host_reads_logits = options->constraint || top_count > 0 || any_penalized;
    const bool on_backend = model->ops->samples_whole_rows;
    bool all_greedy = !host_reads_logits, by_candidates = !host_reads_logits;
    bool whole_rows = !host_reads_logits && on_backend;
    int largest_k = 1;
    float *inverse_temperature = xmalloc((size_t)B * sizeof(float));
    int *candidate_k = xmalloc((size_t)B * sizeof(int));
    int *nucleus_k = xcalloc((size_t)B, sizeof(int)); // a top-p row's candidates (0: not such a row)
    bool any_nucleus = false;
    for (int b = 0; b < B; b++) {
        const SamplerConfig *sampler = options->row_samplers ? &options->row_samplers[b] : &options->sampler;
        const bool greedy = sampler->temperature <= 0.0f;
        if (on_backend && sampler_keeps_top_p_only(sampler, V))
            nucleus_k[b] = generate_nucleus_candidates(0, V), any_nucleus = true;
        all_greedy = all_greedy && greedy;
        by_candidates = by_candidates && (greedy || sampler_keeps_top_k(sampler, V) || nucleus_k[b] > 0);
        whole_rows = whole_rows && (greedy || sampler_samples_whole_row(sampler, V));
        inverse_temperature[b] = greedy ? 1.0f : 1.0f / sampler->temperature; // as the sampler scales
        candidate_k[b] = greedy ? 1 : nucleus_k[b] > 0 ? nucleus_k[b] : sampler->top_k;
        if (candidate_k[b] > largest_k) largest_k = candidate_k[b];
    }
    whole_rows = whole_rows && !all_greedy; // (all greedy: model_last_greedy alone)
    bool *greedy_row = whole_rows ? xmalloc((size_t)B * sizeof(bool)) : NULL;
    bool any_greedy_row = false;
    for (int b = 0; whole_rows && b < B; b++) {
        greedy_row[b] = (options->row_samplers ? &options->row_samplers[b] : &options->sampler)->temperature <= 0.0f;
        any_greedy_row = any_greedy_row || greedy_row[b];
    }
    int candidate_capacity = generate_candidate_capacity(largest_k, V);
    int *greedy_tokens = all_greedy || any_greedy_row ? xmalloc((size_t)B * sizeof(int)) : NULL;
    float *greedy_logprobs = all_greedy || any_greedy_row ? xmalloc((size_t)B * sizeof(float)) : NULL;
    // model_last_sampled's inputs and outputs
    double *uniforms = whole_rows ? xmalloc((size_t)B * sizeof(double)) : NULL;
    int *drawn_tokens = whole_rows ? xmalloc((size_t)B * sizeof(int)) : NULL;
    float *drawn_logprobs = whole_rows ? xmalloc((size_t)B * sizeof(float)) : NULL;
    float *sampling_logprobs = whole_rows ? xmalloc((size_t)B * sizeof(float)) : NULL;
    int *candidate_counts = NULL, *candidate_ids = NULL;
    float *candidate_values = NULL;
    double *candidate_lse = NULL, *candidate_scaled_lse = NULL;
    if (by_candidates && !all_greedy) {
        candidate_counts = xmalloc((size_t)B * sizeof(int));
        candidate_ids = xmalloc((size_t)B * candidate_capacity * sizeof(int));
        candidate_values = xmalloc((size_t)B * candidate_capacity * sizeof(float));
        candidate_lse = xmalloc((size_t)B * sizeof(double));
        if (any_nucleus) candidate_scaled_lse = xmalloc((size_t)B * sizeof(double));
    }
    bool *done = xcalloc((size_t)B, sizeof(bool));
    SamplerScratch *scratch = xmalloc((size_t)B * sizeof(SamplerScratch));
    for (int b = 0; b < B; b++) sampler_scratch_init(&scratch[b], V);

    GenerateStats local_stats = {0};
    double t0 = now_seconds();
    // GRPO answers each prompt G times: its G rows share one prefill of the prompt (one
    // forward of the distinct prompts, then their cache rows and logits are copied).
    int *source = xmalloc((size_t)B * sizeof(int)), *first_row = xmalloc((size_t)B * sizeof(int));
    const int U = options->prefill_each_row ? B : distinct_prompts(prompts, prompt_lengths, B, source, first_row);
    if (U == B) {
        ModelBatch prefill = {.B = B, .T = T0, .tokens = tokens, .row_start = row_start};
        prefill_rows(model, &prefill, &cache, chunk_rows, logits);
    } else {
        int *unique_tokens = xmalloc((size_t)U * T0 * sizeof(int)), *unique_start = xmalloc((size_t)U * sizeof(int));
        for (int u = 0; u < U; u++) {
            memcpy(unique_tokens + (long)u * T0, tokens + (long)first_row[u] * T0, (size_t)T0 * sizeof(int));
            unique_start[u] = row_start[first_row[u]];
        }
        ModelBatch prefill = {.B = U, .T = T0, .tokens = unique_tokens, .row_start = unique_start};
        // rows [0, U) of the logits, spread below from the last row down
        prefill_rows(model, &prefill, &cache, chunk_rows, logits);
        for (int b = B - 1; b >= 0; b--)
            if (source[b] != b) memcpy(logits + (long)b * V, logits + (long)source[b] * V, (size_t)V * sizeof(float));
        kv_cache_expand_rows(&cache, model, source, B);
        free(unique_tokens), free(unique_start);
    }
    free(source), free(first_row);
    local_stats.prefill_seconds = now_seconds() - t0;
    t0 = now_seconds();
    int remaining = B;
    for (int step = 0; step < max_new && remaining > 0; step++) {
        // (the first step's logits are the prefill's, above)
        const bool unmasked = step >= options->min_new_tokens || options->num_stop_tokens == 0;
        const bool on_device = all_greedy && step > 0 && unmasked;
        bool on_candidates = candidate_counts && step > 0 && unmasked;
        for (int b = 0; b < B; b++) // (a top-p row too wide for candidates: the host samples)
            on_candidates = on_candidates && (done[b] || nucleus_k[b] >= 0);
        bool on_whole_rows = whole_rows && step > 0 && unmasked;
        if (on_device) model_last_greedy(model, greedy_tokens, greedy_logprobs);
        else if (on_candidates) {
            on_candidates = model_last_candidates(model, inverse_temperature, candidate_k, candidate_capacity,
                                                  candidate_counts, candidate_ids, candidate_values, candidate_lse,
                                                  candidate_scaled_lse);
            bool held = true; // every unfinished top-p row's nucleus among its candidates
            for (int b = 0; on_candidates && b < B; b++) {
                const SamplerConfig *sampler = options->row_samplers ? &options->row_samplers[b] : &options->sampler;
                if (done[b] || nucleus_k[b] <= 0 ||
                    sampler_candidates_hold_nucleus(candidate_values + (long)b * candidate_capacity,
                                                    candidate_counts[b], candidate_scaled_lse[b], sampler))
                    continue;
                held = false; // this step from the copied logits, the row's next ones from more candidates
                nucleus_k[b] = generate_nucleus_candidates(nucleus_k[b], V);
                if (nucleus_k[b] > candidate_k[b]) candidate_k[b] = nucleus_k[b];
                if (candidate_k[b] > largest_k) largest_k = candidate_k[b];
            }
            if (on_candidates && !held) {
                on_candidates = false;
                local_stats.nucleus_misses++;
                const int grown = generate_candidate_capacity(largest_k, V);
                if (grown > candidate_capacity) {
                    candidate_capacity = grown;
                    free(candidate_ids), free(candidate_values);
                    candidate_ids = xmalloc((size_t)B * candidate_capacity * sizeof(int));
                    candidate_values = xmalloc((size_t)B * candidate_capacity * sizeof(float));
                }
            }
        }
        if (on_whole_rows) { // the same uniform number as the host's sampler would take
            for (int b = 0; b < B; b++)
                uniforms[b] = generate_uniform(options->row_seeds ? options->row_seeds[b] : options->seed,
                                               row_ids ? row_ids[b] : (uint64_t)b, step);
            on_whole_rows = model_last_sampled(model, inverse_temperature, uniforms, drawn_tokens, drawn_logprobs,
                                               sampling_logprobs);
            if (on_whole_rows && any_greedy_row) model_last_greedy(model, greedy_tokens, greedy_logprobs);
        }
        if (step > 0 && !on_device && !on_candidates && !on_whole_rows) model_last_logits(model, logits);
        if (on_device || on_candidates || on_whole_rows)
            for (int b = 0; b < B; b++) local_stats.backend_picked_tokens += !done[b];
#pragma omp parallel for schedule(static)
        for (int b = 0; b < B; b++) {
            if (done[b]) continue;
            const uint64_t seed = options->row_seeds ? options->row_seeds[b] : options->seed;
            const SamplerConfig *sampler = options->row_samplers ? &options->row_samplers[b] : &options->sampler;
            const double u = generate_uniform(seed, row_ids ? row_ids[b] : (uint64_t)b, step);
            const float *row_logits = logits + (long)b * V;
            SampledToken picked;
            if (on_device || on_candidates || on_whole_rows) {
                const long first = (long)b * candidate_capacity; // (row b's candidates)
                if (on_device || (on_whole_rows && greedy_row[b]))
                    picked = (SampledToken){.token = greedy_tokens[b], .logprob = greedy_logprobs[b]};
                else if (on_whole_rows)
                    picked = (SampledToken){.token = drawn_tokens[b],
                                            .logprob = drawn_logprobs[b],
                                            .sampling_logprob = sampling_logprobs[b]};
                else if (nucleus_k[b] > 0)
                    picked = sampler_pick_nucleus_candidates(candidate_values + first, candidate_ids + first,
                                                             candidate_counts[b], candidate_lse[b],
                                                             candidate_scaled_lse[b], sampler, u, &scratch[b]);
                else
                    picked = sampler_pick_candidates(candidate_values + first, candidate_ids + first,
                                                     candidate_counts[b], candidate_lse[b], sampler, u, &scratch[b]);
                generated_row_append(&out[b], NULL, V, picked); // (no top log-probs to record)
                next[b] = picked.token;
                continue;
            }
            const bool penalized = sampler_adjusts_logits(sampler);
            if (options->constraint && !penalized &&
                !options->mask_every_token &&
                token_mask_pick_greedy(options->token_trie, options->constraint, &json[b], options->stop_tokens,
                                       options->num_stop_tokens, step >= options->min_new_tokens, row_logits, V,
                                       sampler, &mask[b], &picked)) {
                picked.logprob = log_softmax_at(row_logits, V, picked.token); // as on the masked path
                token_mask_advance(options->token_trie, options->constraint, &json[b], picked.token);
            } else if (options->constraint) {
                float *masked = masked_logits + (long)b * V;
                int allowed = token_mask_apply(options->token_trie, options->constraint, &json[b], options->stop_tokens,
                                               options->num_stop_tokens, row_logits, masked, V, &mask[b]);
                if (step < options->min_new_tokens)
                    for (int i = 0; i < options->num_stop_tokens; i++)
                        if (options->stop_tokens[i] >= 0 && options->stop_tokens[i] < V && masked[options->stop_tokens[i]] > -INFINITY)
                            masked[options->stop_tokens[i]] = -INFINITY, allowed--;
                if (penalized)
                    sampler_adjust_logits(sampler, masked, V, prompts[b], prompt_lengths[b], out[b].tokens, out[b].length,
                                     &scratch[b]);
                if (allowed > 0) {
                    picked = sampler_pick(masked, V, sampler, u, &scratch[b]);
                } else { // nothing fits (a compiled constraint never gets here): the row ends
                    CHECK(options->num_stop_tokens > 0, "a constrained row without stop tokens");
                    picked = (SampledToken){.token = options->stop_tokens[0]};
                }
                picked.logprob = log_softmax_at(row_logits, V, picked.token); // the model's own
                token_mask_advance(options->token_trie, options->constraint, &json[b], picked.token);
            } else if ((step < options->min_new_tokens && options->num_stop_tokens > 0) || penalized) {
                float *masked = masked_logits + (long)b * V;
                memcpy(masked, row_logits, (size_t)V * sizeof(float));
                for (int i = 0; step < options->min_new_tokens && i < options->num_stop_tokens; i++)
                    if (options->stop_tokens[i] >= 0 && options->stop_tokens[i] < V) masked[options->stop_tokens[i]] = -INFINITY;
                if (penalized)
                    sampler_adjust_logits(sampler, masked, V, prompts[b], prompt_lengths[b], out[b].tokens, out[b].length,
                                     &scratch[b]);
                picked = sampler_pick(masked, V, sampler, u, &scratch[b]);
                picked.logprob = log_softmax_at(row_logits, V, picked.token); // the model's own
            } else {
                picked = sampler_pick(row_logits, V, sampler, u, &scratch[b]);
            }
            generated_row_append(&out[b], row_logits, V, picked);
            next[b] = picked.token;
        }
        for (int b = 0; b < B; b++) {
            if (done[b]) {
                next[b] = options->pad_token;
                continue;
            }
            GeneratedRow *row = &out[b];
            if (options->on_token) options->on_token(options->token_context, b, next[b]);
            if (is_stop_token(options, next[b])) row->stop = STOP_TOKEN;
            else if (options->stop_check && options->stop_check(options->stop_context, b, row->tokens, row->length))
                row->stop = STOP_CHECK;
            else if (row->length == limit[b])
                row->stop = STOP_LENGTH;
            if (row->stop != STOP_NONE) {
                done[b] = true;
                remaining--;
            }
        }
        if (remaining == 0 || step + 1 == max_new) break;
        // Finished rows keep decoding a pad token (cheap, and it keeps the batch shape);
        // their outputs are ignored. Each such pad starts its row anew at its own slot, at
        // position 0: a finished row never runs past the model's positions while others go on.
        for (int b = 0; b < B; b++)
            if (done[b]) cache.row_start[b] = cache.length;
        ModelBatch decode = {.B = B, .T = 1, .tokens = next};
        model_forward_cached(model, &decode, &cache);
        local_stats.decode_steps++;
    }
    local_stats.decode_seconds = now_seconds() - t0;
    for (int b = 0; b < B; b++) local_stats.generated_tokens += out[b].length;
    if (stats) *stats = local_stats;
    for (int b = 0; b < B; b++) sampler_scratch_free(&scratch[b]);
    for (int b = 0; json && b < B; b++) token_mask_scratch_free(&mask[b]);
    free(json), free(mask);
    free(greedy_tokens), free(greedy_logprobs), free(uniforms), free(sampling_logprobs);
    free(greedy_row), free(drawn_tokens), free(drawn_logprobs);
    free(inverse_temperature), free(candidate_k), free(nucleus_k);
    free(candidate_counts), free(candidate_ids), free(candidate_values), free(candidate_lse), free(candidate_scaled_lse);
    free(scratch), free(logits), free(next), free(done), free(tokens), free(row_start), free(masked_logits), free(limit);
    kv_cache_free(&cache, model);
}
