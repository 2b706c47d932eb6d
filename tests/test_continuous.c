// Continuous batching (gen/continuous.h): sequences that join a running batch at any step,
// and leave it when they stop, generate what generate() gives each of them alone.
//
//  - A schedule of 60 requests (1 to 3 sequences each, prompts of 1 to 30 tokens, 1 to 60
//    new tokens, greedy and sampled, some recording top alternatives) joining a batch of at
//    most 5 rows at pseudo-random steps, on four model families (learned positions
//    included): every sequence's tokens equal generate()'s for its prompt alone with the
//    same seed, row id and sampler, and its log-probs and alternatives agree within 1e-4
//    (the batch runs the matmuls on other row counts than a lone prompt does).
//  - The run moves the cache's slots every way it can: prompts longer than the batch so far
//    (the rows move on), stopped rows leaving from the middle (the rows after move up),
//    the next token's slot past the buffers (the rows move back); the buffers stay bounded
//    (they would grow without end if moving back did not work).
//  - Stop tokens and a stop check end sequences as they end generate()'s rows.
//  - The same with the KV cache in half floats and in Q8_0 blocks (one model each).
//  - A prompt prefilled in two parts (model_extend_rows) gives the logits of one prefill
//    (within the quantization's effect with a Q8_0 cache).
//  - Expansion, row copies, relayouts and slot copies of a Q8_0 cache leave the bytes the
//    same moves on a float cache leave, quantized.
//  - The prompt cache: multi-turn conversations whose later turns continue stored earlier
//    ones generate what generate() gives their prompts alone, and report the cached tokens.
//  - A KV-cache relayout (grow, shift) keeps every cached number; the decode after it
//    matches the one before to the bit.
//  - Chunked prefill (prefill_chunk): the schedule above and the prompt-cache turns with
//    prompts prefilled a chunk per step; a 40-token prompt joining a decoding batch in
//    chunks of 1, 7, 13, 40 and 64 tokens against whole (float32, half and Q8_0 caches,
//    Q8_0 weights); a request stopped in the middle of its prefill.
#include "core/check.h"
#include "core/rng.h"
#include "gen/continuous.h"
#include "model/quantize.h"
#include "model/weights_io.h"
#include "test.h"

static void load(Model *model, const char *path) {
    ModelLoadOptions options = {.with_lm_head = true};
    CHECK(model_load(model, path, &ops_cpu, &options) == 0, "%s", err_msg());
}

enum { MAX_SEQUENCES = 3, NUM_REQUESTS = 60, MAX_PROMPT = 30 };

typedef struct {
    int prompt[MAX_PROMPT];
    int prompt_length;
    int join_step; // the earliest step the request may join at
    SequenceOptions sequences[MAX_SEQUENCES];
    int num_sequences;
    GeneratedRow results[MAX_SEQUENCES];
    int tokens_seen[MAX_SEQUENCES]; // on_token calls
    bool finished[MAX_SEQUENCES];
    int stop_after; // the stop check stops a sequence at this many tokens (0: never)
    bool needs_empty_batch;   // joins a batch without sequences only
    int steps_after_previous; // joins at least this many steps after the request before it
} Request;

// The owner of sequence j of request r is &owners[r * MAX_SEQUENCES + j].
typedef struct {
    Request *request;
    int sequence;
} Owner;

static void on_token(void *context, void *owner_ptr, const GeneratedRow *row) {
    Owner *owner = owner_ptr;
    owner->request->tokens_seen[owner->sequence]++;
    EXPECT(row->length == owner->request->tokens_seen[owner->sequence], "a token reported twice or skipped");
}

static bool stop_check(void *context, void *owner_ptr, const GeneratedRow *row) {
    Owner *owner = owner_ptr;
    return owner->request->stop_after > 0 && row->length >= owner->request->stop_after;
}

static void on_finish(void *context, void *owner_ptr, GeneratedRow *row) {
    Owner *owner = owner_ptr;
    EXPECT(!owner->request->finished[owner->sequence], "a sequence finished twice");
    owner->request->finished[owner->sequence] = true;
    owner->request->results[owner->sequence] = *row;
}

// The model's requests: their prompts, settings and join steps from a fixed random stream.
// backend_samplers: only greedy and top-k samplers and no top log-probs, so that every decode
// step takes its picks from the backend (continuous.c picks_on_backend).
static void make_requests(Request *requests, Owner *owners, int vocab_size, int max_total, bool backend_samplers) {
    uint64_t stream = rng_stream("test-continuous", 0, 0), counter = 0;
#define DRAW(n) ((int)(rng_uniform_double(99, stream, counter++) * (n)))
    int step = 0;
    for (int r = 0; r < NUM_REQUESTS; r++) {
        Request *request = &requests[r];
        memset(request, 0, sizeof *request);
        // Requests come faster than the batch answers them, so it stays busy long enough for
        // the slots to pass the buffers' end; then, three times, it empties, starts again
        // with a short prompt and is joined a step later by a long one, so the rows move on.
        const bool restart = r == 48 || r == 52 || r == 56, long_prompt = r == 49 || r == 53 || r == 57;
        request->prompt_length = 1 + (long_prompt || r % 7 == 3 ? MAX_PROMPT - 1 : DRAW(12));
        if (restart) request->prompt_length = 2;
        for (int t = 0; t < request->prompt_length; t++) request->prompt[t] = 1 + DRAW(vocab_size - 1);
        step += DRAW(2);
        request->join_step = step;
        request->needs_empty_batch = restart;
        request->steps_after_previous = long_prompt ? 1 : 0;
        request->num_sequences = 1 + (r % 5 == 1 ? DRAW(MAX_SEQUENCES) : 0);
        request->stop_after = r % 6 == 4 ? 1 + DRAW(10) : 0;
        int longest = max_total - request->prompt_length;
        for (int j = 0; j < request->num_sequences; j++) {
            SequenceOptions *sequence = &request->sequences[j];
            const int kind = backend_samplers ? 2 * DRAW(2) : DRAW(3);
            sequence->sampler = kind == 0   ? (SamplerConfig){.temperature = 0.0f}
                                : kind == 1 ? (SamplerConfig){.temperature = 1.0f}
                                            : (SamplerConfig){.temperature = 1.3f, .top_k = 12, .top_p = 0.9f};
            sequence->seed = 1000 + r;
            sequence->row_id = (uint64_t)j << 40;
            sequence->max_new_tokens = 1 + DRAW(60);
            if (sequence->max_new_tokens > longest) sequence->max_new_tokens = longest;
            sequence->top_logprobs = r % 4 == 2 && !backend_samplers ? 3 : 0;
            owners[r * MAX_SEQUENCES + j] = (Owner){request, j};
            sequence->owner = &owners[r * MAX_SEQUENCES + j];
        }
    }
#undef DRAW
}

static void check_against_generate(Model *model, const char *name, Request *requests, const int *stop_tokens,
                                   int num_stop_tokens) {
    double worst = 0;
    for (int r = 0; r < NUM_REQUESTS; r++) {
        Request *request = &requests[r];
        for (int j = 0; j < request->num_sequences; j++) {
            const SequenceOptions *sequence = &request->sequences[j];
            GeneratedRow *got = &request->results[j];
            EXPECT(request->finished[j], "%s request %d sequence %d never finished", name, r, j);
            if (!request->finished[j]) continue;
            EXPECT(request->tokens_seen[j] == got->length, "%s request %d: %d tokens reported, %d generated", name, r,
                   request->tokens_seen[j], got->length);
            GenerateOptions alone = {.sampler = sequence->sampler,
                                     .max_new_tokens = sequence->max_new_tokens,
                                     .seed = sequence->seed,
                                     .stop_tokens = stop_tokens,
                                     .num_stop_tokens = num_stop_tokens,
                                     .top_logprobs = sequence->top_logprobs};
            const int *prompt = request->prompt;
            GeneratedRow want;
            generate(model, &prompt, &request->prompt_length, &sequence->row_id, 1, &alone, &want, NULL);
            // The stop check is the caller's: generate() without it stops later or equally.
            int length = want.length;
            StopReason stop = want.stop;
            if (request->stop_after > 0 && request->stop_after < length) length = request->stop_after, stop = STOP_CHECK;
            else if (request->stop_after > 0 && request->stop_after == length && stop == STOP_LENGTH) stop = STOP_CHECK;
            EXPECT(got->length == length && got->stop == stop &&
                       !memcmp(got->tokens, want.tokens, (size_t)length * sizeof(int)),
                   "%s request %d sequence %d: %d tokens (stop %s), alone %d (stop %s)", name, r, j, got->length,
                   stop_reason_name(got->stop), length, stop_reason_name(stop));
            for (int t = 0; t < got->length && t < length; t++) {
                double d = fabs(got->logprobs[t] - want.logprobs[t]);
                if (d > worst) worst = d;
                EXPECT(got->top_count == want.top_count, "top counts differ");
                for (int k = 0; k < got->top_count && k < want.top_count; k++) {
                    EXPECT(got->top_tokens[t * got->top_count + k] == want.top_tokens[t * want.top_count + k],
                           "%s request %d: alternative %d of token %d differs", name, r, k, t);
                    d = fabs(got->top_logprobs[t * got->top_count + k] - want.top_logprobs[t * want.top_count + k]);
                    if (d > worst) worst = d;
                }
            }
            generated_row_free(&want);
            generated_row_free(got);
        }
    }
    // A Q8_0 cache rounds keys and values that the batch's matmuls (other row counts than a
    // lone prompt's) made a few ulp apart to different steps now and then: 1.1e-4 seen.
    const double tolerance = model->kv_cache_type == KV_CACHE_Q8_0 ? 1e-3 : 1e-4;
    EXPECT(worst <= tolerance, "%s: log-probs differ from generate() alone by %.3g", name, worst);
}

static void test_joining_sequences_match_generate(void) {
    // The last two runs keep the KV cache in half floats (--kv-cache f16) and in Q8_0 blocks
    // (--kv-cache q8_0): the slots moved are halves or 8-bit records, and generate() alone
    // uses the same cache.
    // The three after them prefill in chunks (prefill_chunk 7, 1 and 5): the prompts longer
    // than a chunk wait in the queue, rows reserved, while the others decode. (With a half
    // cache the later chunks read the earlier ones through halves, which may turn a sampled
    // token here: test_chunked_prefill_matches_whole bounds that effect instead.)
    // Then Gemma 2 (soft-capped scores in the decode and chunk kernels) in chunks of 7, and
    // sliding windows of 5 keys: Mistral's in every layer, Gemma 3's in its first layer, whole
    // prompts (test_chunked_prefill_matches_whole prefills Mistral's in chunks).
    // The last two draw only greedy and top-k samplers, without top log-probs: every decode
    // step's picks come from the backend (model_last_greedy, model_last_candidates), and
    // they must be generate()'s all the same.
    const char *models[] = {"tests/fixtures/models/llama", "tests/fixtures/models/gpt2", "tests/fixtures/models/gemma",
                            "tests/fixtures/models/qwen2", "tests/fixtures/models/llama", "tests/fixtures/models/gemma",
                            "tests/fixtures/models/llama", "tests/fixtures/models/gpt2", "tests/fixtures/models/qwen2",
                            "tests/fixtures/models/gemma2", "tests/fixtures/models/mistral_window",
                            "tests/fixtures/models/gemma3_window", "tests/fixtures/models/llama",
                            "tests/fixtures/models/gemma2"};
    const char *kv_cache[] = {"f32", "f32", "f32", "f32", "f16", "q8_0", "f32", "f32", "f32", "f32", "f32", "f32", "f32", "f32"};
    const int prefill_chunk[] = {0, 0, 0, 0, 0, 0, 7, 1, 5, 7, 0, 0, 0, 7};
    for (int m = 0; m < 14; m++) {
        const bool backend_samplers = m >= 12;
        Model model;
        load(&model, models[m]);
        CHECK(kv_cache_type_set(&model, kv_cache[m], "--kv-cache") == 0, "%s", err_msg());
        static Request requests[NUM_REQUESTS];
        static Owner owners[NUM_REQUESTS * MAX_SEQUENCES];
        // Learned positions bound a sequence's prompt and tokens (GPT-2's fixture has 64).
        const int max_total = model.config.max_position_embeddings < 80 ? model.config.max_position_embeddings : 80;
        make_requests(requests, owners, model.config.vocab_size, max_total, backend_samplers);
        const int stop_tokens[] = {model.config.vocab_size - 1, 3};
        ContinuousOptions options = {.stop_tokens = stop_tokens,
                                     .num_stop_tokens = 2,
                                     .pad_token = 0,
                                     .on_token = on_token,
                                     .stop_check = stop_check,
                                     .on_finish = on_finish,
                                     .prefill_chunk = prefill_chunk[m]};
        const int max_rows = 5;
        ContinuousBatch *batch = continuous_batch_new(&model, max_rows, &options);
        int next_request = 0, joined_late = 0, last_join = 0;
        for (int step = 0; next_request < NUM_REQUESTS || continuous_batch_rows(batch) > 0; step++) {
            // Requests join in order, as many as fit; up to two in one prefill.
            SequenceRequest joining[2];
            int count = 0, rows = continuous_batch_rows(batch);
            while (count < 2 && next_request < NUM_REQUESTS && requests[next_request].join_step <= step &&
                   rows + requests[next_request].num_sequences <= max_rows &&
                   (!requests[next_request].needs_empty_batch || rows == 0) &&
                   step >= last_join + requests[next_request].steps_after_previous) {
                Request *request = &requests[next_request++];
                last_join = step;
                joining[count++] = (SequenceRequest){request->prompt, request->prompt_length, request->sequences,
                                                     request->num_sequences, 0};
                rows += request->num_sequences;
            }
            if (count > 0 && continuous_batch_rows(batch) > 0) joined_late++;
            continuous_batch_add(batch, joining, count);
            continuous_batch_step(batch);
            CHECK(step < 100000, "the schedule does not end");
        }
        ContinuousStats stats;
        continuous_batch_stats(batch, &stats);
        EXPECT(joined_late > 10, "%s: only %d requests joined a running batch", models[m], joined_late);
        // A prompt prefilled in chunks joins a batch older by the steps it took, so the rows
        // move on less often (never with chunks of 1 token here).
        const long moves_on = prefill_chunk[m] == 0 ? 3 : prefill_chunk[m] > 1 ? 1 : 0;
        EXPECT(stats.moves_on >= moves_on && stats.moves_back >= 1, "%s: the slots moved on %ld times, back %ld times",
               models[m], stats.moves_on, stats.moves_back);
        EXPECT(stats.capacity_slots <= 512, "%s: the cache grew to %d slots per row", models[m], stats.capacity_slots);
        if (getenv("TEST_VERBOSE"))
            printf("%s %s chunk %d: %ld steps, %ld prefills, %ld chunks, moved on %ld, back %ld, %d slots\n", models[m],
                   kv_cache[m], prefill_chunk[m], stats.decode_steps, stats.prefills, stats.prefill_chunks,
                   stats.moves_on, stats.moves_back, stats.capacity_slots);
        EXPECT((stats.prefill_chunks > 0) == (prefill_chunk[m] > 0), "%s: %ld chunk forwards", models[m],
               stats.prefill_chunks);
        // In a backend-samplers run every token but each sequence's first (its prefill's
        // logits) is picked from the backend's results (no tie at a top-k boundary past the
        // candidates' room is expected with random weights).
        long sequences = 0;
        for (int r = 0; r < NUM_REQUESTS; r++) sequences += requests[r].num_sequences;
        if (backend_samplers)
            EXPECT(stats.backend_picked_tokens == stats.generated_tokens - sequences,
                   "%s: %ld of %ld tokens picked on the backend (%ld sequences)", models[m],
                   stats.backend_picked_tokens, stats.generated_tokens, sequences);
        if (getenv("TEST_VERBOSE"))
            printf("%s: %ld of %ld tokens picked on the backend\n", models[m], stats.backend_picked_tokens,
                   stats.generated_tokens);
        continuous_batch_free(batch);
        check_against_generate(&model, models[m], requests, stop_tokens, 2);
        model_free(&model);
    }
}

// The relayout keeps every number: the same decode step on a cache before and after a move
// (grown, shifted on, then back) gives the same logits, bit for bit.
static void test_relayout_keeps_the_cache(void) {
    Model model;
    load(&model, "tests/fixtures/models/llama");
    const int V = model.config.vocab_size;
    int tokens[2 * 6] = {0, 0, 5, 9, 17, 3, 60, 61, 62, 63, 64, 65};
    int row_start[2] = {2, 0};
    KvCache cache;
    kv_cache_init(&cache, &model, 2, 8);
    ModelBatch prefill = {.B = 2, .T = 6, .tokens = tokens, .row_start = row_start};
    model_forward_cached(&model, &prefill, &cache);
    int next[2] = {7, 8};
    float *before = xmalloc((size_t)2 * V * sizeof(float)), *after = xmalloc((size_t)2 * V * sizeof(float));
    KvCache copy;
    kv_cache_init(&copy, &model, 2, 8);
    // The same prefill into a second cache, then moves: 5 slots on into 3 rows of 20, back 4.
    model_forward_cached(&model, &prefill, &copy);
    kv_cache_relayout(&copy, &model, 3, 20, 5);
    EXPECT(copy.length == 11 && copy.row_start[0] == 7 && copy.row_start[1] == 5, "moved to %d, rows from %d and %d",
           copy.length, copy.row_start[0], copy.row_start[1]);
    kv_cache_relayout(&copy, &model, 3, 20, -4);
    ModelBatch decode = {.B = 2, .T = 1, .tokens = next};
    model_forward_cached(&model, &decode, &cache);
    model_last_logits(&model, before);
    model_forward_cached(&model, &decode, &copy);
    model_last_logits(&model, after);
    EXPECT(!memcmp(before, after, (size_t)2 * V * sizeof(float)), "the decode after a relayout differs");
    // A relayout that would push a row before slot 0 is refused.
    EXPECT(copy.row_start[1] == 1, "row 1 starts at %d", copy.row_start[1]);
    kv_cache_free(&cache, &model);
    kv_cache_free(&copy, &model);
    free(before), free(after);
    model_free(&model);
}

// model_extend_rows: a prompt prefilled in two parts (the first 9 tokens, then the other
// 8 extending them) gives the next-token logits of the whole prompt prefilled at once.
static void test_extend_matches_prefill(void) {
    // Gemma 2 with a sliding window of 5: the 8 extending queries' windows begin at 8 slots.
    const char *models[] = {"tests/fixtures/models/llama", "tests/fixtures/models/gpt2", "tests/fixtures/models/gemma",
                            "tests/fixtures/models/gemma2_window"};
    for (int m = 0; m < 4; m++) {
        Model model;
        load(&model, models[m]);
        if (m == 2) CHECK(kv_cache_type_set(&model, "q8_0", "--kv-cache") == 0, "%s", err_msg());
        const int V = model.config.vocab_size;
        int prompt[17];
        for (int t = 0; t < 17; t++) prompt[t] = 1 + (t * 37 + 5) % (V - 1);
        float *whole = xmalloc((size_t)V * sizeof(float)), *parts = xmalloc((size_t)V * sizeof(float));
        KvCache cache;
        kv_cache_init(&cache, &model, 1, 32);
        ModelBatch all = {.B = 1, .T = 17, .tokens = prompt};
        model_forward_cached(&model, &all, &cache);
        model_last_logits(&model, whole);
        kv_cache_reset(&cache);
        // The prompt will end at slot 20: its first 9 tokens at slots [3, 12).
        ModelBatch head = {.B = 1, .T = 9, .tokens = prompt};
        cache.length = 12;
        model_prefill_rows(&model, &head, &cache, 0);
        cache.B = 1;
        cache.length = 20;
        ModelBatch rest = {.B = 1, .T = 8, .tokens = prompt + 9};
        model_extend_rows(&model, &rest, &cache, 0); // slots [12, 20)
        model_last_logits(&model, parts);
        double worst = 0;
        for (int v = 0; v < V; v++)
            if (fabs(whole[v] - parts[v]) > worst) worst = fabs(whole[v] - parts[v]);
        // With a Q8_0 cache the extension reads the first part through its 8-bit keys and
        // values, where the whole prefill attends to them in float32: 5e-3 seen.
        const double tolerance = model.kv_cache_type == KV_CACHE_Q8_0 ? 2e-2 : 1e-4;
        EXPECT(worst <= tolerance, "%s: the extended prompt's logits differ by %.3g", models[m], worst);
        kv_cache_free(&cache, &model);
        free(whole), free(parts);
        model_free(&model);
    }
}

// The prompt cache: 6 conversations of 3 turns, each turn's prompt the previous turn's
// prompt and answer and 3 new tokens, sent as the previous turn ends (so the turns of
// other conversations are running); a store of 3 rows (so older conversations are
// evicted). Each turn generates what generate() gives its prompt alone; the turns that
// found their conversation's last turn in the store report every token of it as cached.
enum { CONVERSATIONS = 6, TURNS = 3, TURN_PROMPT_MAX = 200 };
typedef struct {
    int prompt[TURN_PROMPT_MAX];
    int prompt_length, turn;
    bool running;
    SequenceOptions sequence;
    GeneratedRow result;
    bool finished;
    int cached_tokens[TURNS];
    int stored_tokens; // the previous turn's prompt and answer but its last token
} Conversation;

static void conversation_finished(void *context, void *owner, GeneratedRow *row) {
    Conversation *conversation = owner;
    conversation->result = *row;
    conversation->finished = true;
}

static void test_prompt_cache_turns(void) {
    // The last two prefill in chunks of 5 tokens: a turn's stored prefix is copied in, the
    // rest extends it a chunk per step (and the entries queued turns will copy stay). Not
    // with a half cache: conversation 2's first prompt has a near tie (3e-4 apart) between
    // two tokens, which the halves of its first chunk turn.
    const char *models[] = {"tests/fixtures/models/llama", "tests/fixtures/models/gpt2", "tests/fixtures/models/llama",
                            "tests/fixtures/models/llama", "tests/fixtures/models/gpt2"};
    const bool half_cache[] = {false, false, true, false, false};
    const int prefill_chunk[] = {0, 0, 0, 5, 5};
    for (int m = 0; m < 5; m++) {
        Model model;
        load(&model, models[m]);
        if (half_cache[m]) CHECK(kv_cache_type_set(&model, "f16", "--kv-cache") == 0, "%s", err_msg());
        const int V = model.config.vocab_size;
        static Conversation conversations[CONVERSATIONS];
        for (int c = 0; c < CONVERSATIONS; c++) {
            Conversation *conversation = &conversations[c];
            memset(conversation, 0, sizeof *conversation);
            conversation->prompt_length = 4 + c;
            for (int t = 0; t < conversation->prompt_length; t++) conversation->prompt[t] = 1 + (c * 13 + t * 7) % (V - 1);
            conversation->sequence = (SequenceOptions){.sampler = {.temperature = c % 2 ? 1.0f : 0.0f},
                                                       .seed = 50 + c,
                                                       .max_new_tokens = 6 + c,
                                                       .owner = conversation};
        }
        ContinuousOptions options = {
            .on_finish = conversation_finished, .prompt_cache_rows = 3, .prefill_chunk = prefill_chunk[m]};
        ContinuousBatch *batch = continuous_batch_new(&model, 4, &options);
        long checked = 0, reported = 0;
        double worst = 0;
        for (int step = 0; step < 10000; step++) {
            bool all_done = true;
            for (int c = 0; c < CONVERSATIONS; c++) {
                Conversation *conversation = &conversations[c];
                if (conversation->running && conversation->finished) {
                    // This turn against generate() alone, then the next turn's prompt.
                    GenerateOptions alone = {.sampler = conversation->sequence.sampler,
                                             .max_new_tokens = conversation->sequence.max_new_tokens,
                                             .seed = conversation->sequence.seed};
                    const int *prompt = conversation->prompt;
                    GeneratedRow want;
                    generate(&model, &prompt, &conversation->prompt_length, &conversation->sequence.row_id, 1, &alone,
                             &want, NULL);
                    const GeneratedRow *got = &conversation->result;
                    EXPECT(got->length == want.length && !memcmp(got->tokens, want.tokens, (size_t)got->length * sizeof(int)),
                           "%s conversation %d turn %d differs from generate() alone", models[m], c, conversation->turn);
                    for (int t = 0; t < got->length && t < want.length; t++)
                        if (fabs(got->logprobs[t] - want.logprobs[t]) > worst) worst = fabs(got->logprobs[t] - want.logprobs[t]);
                    checked++;
                    conversation->stored_tokens = conversation->prompt_length + got->length - 1;
                    memcpy(conversation->prompt + conversation->prompt_length, got->tokens, (size_t)got->length * sizeof(int));
                    conversation->prompt_length += got->length;
                    for (int t = 0; t < 3; t++) conversation->prompt[conversation->prompt_length++] = 2 + (c + t * 11) % (V - 2);
                    generated_row_free(&want);
                    generated_row_free(&conversation->result);
                    conversation->running = conversation->finished = false;
                    conversation->turn++;
                }
                if (conversation->turn < TURNS) all_done = false;
                if (!conversation->running && conversation->turn < TURNS && continuous_batch_rows(batch) < 4 &&
                    (step + c) % 3 == 0) {
                    SequenceRequest request = {conversation->prompt, conversation->prompt_length, &conversation->sequence, 1, 0};
                    continuous_batch_add(batch, &request, 1);
                    conversation->cached_tokens[conversation->turn] = request.cached_tokens;
                    // Found, a turn's prefix is the whole previous turn that the cache held.
                    EXPECT(request.cached_tokens == 0 || request.cached_tokens == conversation->stored_tokens,
                           "%s conversation %d turn %d: %d tokens cached, the previous turn left %d", models[m], c,
                           conversation->turn, request.cached_tokens, conversation->stored_tokens);
                    reported += request.cached_tokens;
                    conversation->running = true;
                }
            }
            if (all_done) break;
            continuous_batch_step(batch);
        }
        ContinuousStats stats;
        continuous_batch_stats(batch, &stats);
        continuous_batch_free(batch);
        EXPECT(checked == CONVERSATIONS * TURNS, "%s: %ld turns answered", models[m], checked);
        // With a half cache the stored prefix is read through halves where generate() alone
        // attends to its prompt in float32 during the prefill.
        EXPECT(worst <= (half_cache[m] ? 2e-3 : 1e-4), "%s: log-probs differ from generate() alone by %.3g", models[m],
               worst);
        EXPECT(stats.prompt_cache_hits >= 4 && stats.prompt_tokens_reused == reported,
               "%s: %ld hits, %ld tokens reused (%ld reported)", models[m], stats.prompt_cache_hits,
               stats.prompt_tokens_reused, reported);
        if (getenv("TEST_VERBOSE"))
            printf("%s%s chunk %d: %ld turns, %ld prompt-cache hits, %ld tokens reused, %ld chunks\n", models[m],
                   half_cache[m] ? " f16" : "", prefill_chunk[m], checked, stats.prompt_cache_hits,
                   stats.prompt_tokens_reused, stats.prefill_chunks);
        model_free(&model);
    }
}

// The row operations on a Q8_0 cache (--kv-cache q8_0) move whole slot records: a
// prefill into a float cache and into a Q8_0 cache, then the same expansion, row copy,
// relayouts and slot copies on both, leave in every filled slot of the Q8_0 cache exactly
// the bytes of the float cache's slots quantized. Rows of 16-wide heads (one short block
// each) and of 32-wide heads (one whole block).
static void quantize_float_cache(char *out, const float *cache, int rows, int capacity, const Model *model) {
    const int KV = model->config.num_kv_heads, D = model->config.head_dim;
    for (int b = 0; b < rows; b++)
        ops_cpu.cache_write_q8(out + (long)b * capacity * kv_q8_slot_bytes(KV, D), cache + (long)b * capacity * KV * D,
                               1, capacity, capacity, 0, KV, D);
}

static void expect_quantized_equal(const KvCache *q8, const KvCache *f32, const Model *model, const char *what) {
    CHECK(q8->type == KV_CACHE_Q8_0 && f32->type == KV_CACHE_F32 && q8->B == f32->B && q8->length == f32->length &&
              q8->capacity_B == f32->capacity_B && q8->capacity_T == f32->capacity_T,
          "%s: the caches' shapes differ", what);
    const long record = kv_cache_slot_bytes(model, KV_CACHE_Q8_0);
    char *want = xmalloc((size_t)f32->capacity_B * f32->capacity_T * record);
    long compared = 0;
    for (int l = 0; l < model->config.num_layers; l++)
        for (int kv = 0; kv < 2; kv++) {
            quantize_float_cache(want, kv ? f32->v[l] : f32->k[l], f32->capacity_B, f32->capacity_T, model);
            const char *got = kv ? q8->v[l] : q8->k[l];
            for (int b = 0; b < q8->B; b++) {
                EXPECT(q8->row_start[b] == f32->row_start[b], "%s: row %d starts at %d, not %d", what, b,
                       q8->row_start[b], f32->row_start[b]);
                const long first = ((long)b * q8->capacity_T + q8->row_start[b]) * record;
                const long bytes = (q8->length - q8->row_start[b]) * record;
                EXPECT(!memcmp(got + first, want + first, (size_t)bytes), "%s: layer %d %s row %d differs", what, l,
                       kv ? "values" : "keys", b);
                compared += bytes;
            }
        }
    EXPECT(compared > 0, "%s: nothing compared", what);
    free(want);
}

static void test_q8_cache_row_operations(void) {
    const char *models[] = {"tests/fixtures/models/llama", "tests/fixtures/models/gemma"};
    for (int m = 0; m < 2; m++) {
        Model model;
        load(&model, models[m]);
        KvCache caches[2], stores[2]; // [0] float, [1] Q8_0
        int tokens[3 * 6] = {0, 0, 5, 9, 17, 3, 60, 61, 62, 63, 64, 65, 0, 0, 0, 0, 7, 8};
        int row_start[3] = {2, 0, 4};
        for (int c = 0; c < 2; c++) {
            CHECK(kv_cache_type_set(&model, c ? "q8_0" : "f32", "--kv-cache") == 0, "%s", err_msg());
            kv_cache_init(&caches[c], &model, 5, 10);
            kv_cache_init(&stores[c], &model, 2, 16);
            ModelBatch prefill = {.B = 3, .T = 6, .tokens = tokens, .row_start = row_start};
            model_forward_cached(&model, &prefill, &caches[c]);
        }
        expect_quantized_equal(&caches[1], &caches[0], &model, "prefill");
        const int source[5] = {0, 1, 1, 2, 0};
        for (int c = 0; c < 2; c++) kv_cache_expand_rows(&caches[c], &model, source, 5);
        expect_quantized_equal(&caches[1], &caches[0], &model, "expand_rows");
        for (int c = 0; c < 2; c++) kv_cache_copy_row(&caches[c], &model, 1, 3);
        expect_quantized_equal(&caches[1], &caches[0], &model, "copy_row");
        for (int c = 0; c < 2; c++) kv_cache_relayout(&caches[c], &model, 6, 24, 7);
        expect_quantized_equal(&caches[1], &caches[0], &model, "relayout on");
        for (int c = 0; c < 2; c++) kv_cache_relayout(&caches[c], &model, 5, 12, -5);
        expect_quantized_equal(&caches[1], &caches[0], &model, "relayout back");
        // Row 3's slots out to a store and back into row 4 (the prompt cache's moves).
        for (int c = 0; c < 2; c++) {
            const int start = caches[c].row_start[3], count = caches[c].length - start;
            kv_cache_copy_slots(&stores[c], 1, 2, &caches[c], 3, start, count, &model);
            kv_cache_copy_slots(&caches[c], 4, start, &stores[c], 1, 2, count, &model);
            caches[c].row_start[4] = start;
        }
        expect_quantized_equal(&caches[1], &caches[0], &model, "copy_slots");
        for (int c = 0; c < 2; c++) kv_cache_free(&caches[c], &model), kv_cache_free(&stores[c], &model);
        model_free(&model);
    }
}

// Chunked prefill (ContinuousOptions.prefill_chunk): a companion sequence is decoding when
// a request with a 40-token prompt (72 with Q8_0 weights, past the 64 rows from which a
// whole prefill multiplies by the dequantized weights) and two sequences (greedy, and
// sampled) arrives. Against the same schedule with whole prompts (prefill_chunk 0):
//  - chunks of 1, 7 and 13 tokens: the same tokens, and every log-prob of the vocabulary at
//    every step within 1e-5 (float32 cache, float32 or Q8_0 weights; the later chunks
//    attend to the earlier ones through the cache and the matmuls run on other row counts:
//    2.4e-6 seen), 2e-3 with a half cache (the earlier chunks are read through their
//    halves: 7e-4 seen) and 1e-2 with a Q8_0 cache (through their 8-bit records: 4.5e-3);
//  - chunks of the prompt's length and longer: bit for bit (the same prefill).
//  - While the long prompt is prefilled the companion gets a token at every step, and the
//    prompt takes ceil(length / chunk) chunk forwards.
enum { MAX_LONG_PROMPT = 80, COMPANION_TOKENS = 30, LONG_TOKENS = 12 };
typedef struct {
    GeneratedRow row;
    bool finished;
    int tokens;        // on_token calls
    int empty_checks;  // stop checks before its first token (queued for its prefill)
    int cancel_at;     // the stop check stops it at this empty check (0: never)
} ChunkSequence;

static void chunk_on_token(void *context, void *owner, const GeneratedRow *row) { ((ChunkSequence *)owner)->tokens++; }

static bool chunk_stop_check(void *context, void *owner, const GeneratedRow *row) {
    ChunkSequence *sequence = owner;
    if (row->length > 0) return false;
    sequence->empty_checks++;
    return sequence->cancel_at > 0 && sequence->empty_checks >= sequence->cancel_at;
}

static void chunk_on_finish(void *context, void *owner, GeneratedRow *row) {
    ChunkSequence *sequence = owner;
    EXPECT(!sequence->finished, "a sequence finished twice");
    sequence->finished = true;
    sequence->row = *row;
}

typedef struct {
    ChunkSequence companion, answers[2];
    long prefill_chunks;
    int waited_steps;        // steps between the long request's add and its first token
    int companion_gaps;      // steps of that wait in which the companion got no token
} ChunkRun;

static void run_chunk_schedule(Model *model, int prompt_length, int chunk, int cancel_at, ChunkRun *run) {
    const int V = model->config.vocab_size;
    memset(run, 0, sizeof *run);
    int companion_prompt[5] = {3, 17, 42, 9, 100}, long_prompt[MAX_LONG_PROMPT];
    CHECK(prompt_length <= MAX_LONG_PROMPT, "a prompt of %d tokens", prompt_length);
    for (int t = 0; t < prompt_length; t++) long_prompt[t] = 1 + (t * 37 + 11) % (V - 1);
    SequenceOptions companion = {.sampler = {.temperature = 0.0f}, .seed = 7, .max_new_tokens = COMPANION_TOKENS,
                                 .owner = &run->companion};
    SequenceOptions answers[2] = {
        {.sampler = {.temperature = 0.0f}, .seed = 11, .max_new_tokens = LONG_TOKENS, .top_logprobs = V,
         .owner = &run->answers[0]},
        {.sampler = {.temperature = 1.0f}, .seed = 11, .row_id = 1ull << 40, .max_new_tokens = LONG_TOKENS,
         .top_logprobs = V, .owner = &run->answers[1]}};
    run->answers[0].cancel_at = run->answers[1].cancel_at = cancel_at;
    ContinuousOptions options = {.pad_token = 0,
                                 .on_token = chunk_on_token,
                                 .stop_check = chunk_stop_check,
                                 .on_finish = chunk_on_finish,
                                 .prefill_chunk = chunk};
    ContinuousBatch *batch = continuous_batch_new(model, 4, &options);
    SequenceRequest first = {companion_prompt, 5, &companion, 1, 0};
    continuous_batch_add(batch, &first, 1);
    int added_at = -1;
    for (int step = 0; !run->companion.finished || !run->answers[0].finished || !run->answers[1].finished; step++) {
        if (step == 8) {
            SequenceRequest second = {long_prompt, prompt_length, answers, 2, 0};
            continuous_batch_add(batch, &second, 1);
            added_at = step;
        }
        const int before = run->companion.tokens;
        continuous_batch_step(batch);
        if (added_at >= 0 && run->answers[0].tokens == 0 && !run->answers[0].finished) {
            run->waited_steps++;
            if (run->companion.tokens == before && !run->companion.finished) run->companion_gaps++;
        }
        CHECK(step < 1000, "the schedule does not end");
    }
    ContinuousStats stats;
    continuous_batch_stats(batch, &stats);
    run->prefill_chunks = stats.prefill_chunks;
    EXPECT(continuous_batch_rows(batch) == 0 && stats.prefilling_rows == 0, "rows left: %d (%d prefilling)",
           continuous_batch_rows(batch), stats.prefilling_rows);
    continuous_batch_free(batch);
}

static void free_chunk_run(ChunkRun *run) {
    generated_row_free(&run->companion.row);
    for (int j = 0; j < 2; j++) generated_row_free(&run->answers[j].row);
}

// Largest difference between two runs' log-probs (every token of the vocabulary at every
// step of both answers, and the companion's), or INFINITY when their tokens differ.
static double chunk_run_difference(const ChunkRun *a, const ChunkRun *b, bool *bitwise) {
    double worst = 0;
    *bitwise = true;
    const ChunkSequence *pairs[3][2] = {{&a->companion, &b->companion}, {&a->answers[0], &b->answers[0]},
                                        {&a->answers[1], &b->answers[1]}};
    for (int i = 0; i < 3; i++) {
        const GeneratedRow *x = &pairs[i][0]->row, *y = &pairs[i][1]->row;
        if (x->length != y->length || x->stop != y->stop) return INFINITY;
        if (x->length == 0) continue; // stopped before its first token (no arrays)
        if (memcmp(x->tokens, y->tokens, (size_t)x->length * sizeof(int))) return INFINITY;
        if (memcmp(x->logprobs, y->logprobs, (size_t)x->length * sizeof(float))) *bitwise = false;
        double d = test_max_abs_diff(x->logprobs, y->logprobs, x->length);
        if (d > worst) worst = d;
        // The alternatives (the whole vocabulary) by token: near ties may swap places.
        if (x->top_count != y->top_count) return INFINITY;
        for (int t = 0; t < x->length; t++)
            for (int k = 0; k < x->top_count; k++) {
                const long at = (long)t * x->top_count + k;
                int l = 0;
                while (l < y->top_count && y->top_tokens[(long)t * y->top_count + l] != x->top_tokens[at]) l++;
                if (l == y->top_count) return INFINITY;
                const float other = y->top_logprobs[(long)t * y->top_count + l];
                if (other != x->top_logprobs[at] || l != k) *bitwise = false;
                d = fabs((double)other - x->top_logprobs[at]);
                if (d > worst) worst = d;
            }
    }
    return worst;
}

static void test_chunked_prefill_matches_whole(void) {
    // llama, gpt2 (learned positions), llama with a half cache, gemma with a Q8_0 cache,
    // llama with Q8_0 weights, Mistral with a sliding window of 5 (a chunk's queries see
    // windows that begin at different slots, some in the chunks before).
    const char *models[] = {"tests/fixtures/models/llama", "tests/fixtures/models/gpt2", "tests/fixtures/models/llama",
                            "tests/fixtures/models/gemma", "tests/fixtures/models/llama",
                            "tests/fixtures/models/mistral_window"};
    const char *kv_cache[] = {"f32", "f32", "f16", "q8_0", "f32", "f32"};
    const char *labels[] = {"llama", "gpt2", "llama --kv-cache f16", "gemma --kv-cache q8_0", "llama --quantize q8_0",
                            "mistral_window"};
    const double tolerance[] = {1e-5, 1e-5, 2e-3, 1e-2, 1e-5, 1e-5};
    const int prompt_lengths[] = {40, 40, 40, 40, 72, 40};
    for (int m = 0; m < 6; m++) {
        Model model;
        load(&model, models[m]);
        CHECK(kv_cache_type_set(&model, kv_cache[m], "--kv-cache") == 0, "%s", err_msg());
        if (m == 4) CHECK(model_quantize(&model, "q8_0") == 0, "%s", err_msg());
        const int P = prompt_lengths[m];
        static ChunkRun whole, chunked;
        run_chunk_schedule(&model, P, 0, 0, &whole);
        EXPECT(whole.prefill_chunks == 0 && whole.answers[0].row.length == LONG_TOKENS, "%s: %ld chunks, %d tokens",
               labels[m], whole.prefill_chunks, whole.answers[0].row.length);
        const int chunks[] = {1, 7, 13, P, P + 24};
        for (int c = 0; c < 5; c++) {
            run_chunk_schedule(&model, P, chunks[c], 0, &chunked);
            bool bitwise;
            const double d = chunk_run_difference(&chunked, &whole, &bitwise);
            const bool one_chunk = chunks[c] >= P;
            if (one_chunk) EXPECT(bitwise, "%s: a chunk of %d differs from the whole prefill by %.3g", labels[m], chunks[c], d);
            else EXPECT(d <= tolerance[m], "%s: chunks of %d differ from the whole prefill by %.3g", labels[m], chunks[c], d);
            // The companion's 5-token prompt is chunked too by chunks of 1.
            const int want_chunks = one_chunk ? 0 : (P + chunks[c] - 1) / chunks[c];
            EXPECT(chunked.prefill_chunks == want_chunks + (chunks[c] < 5 ? 5 : 0),
                   "%s: %ld chunk forwards for chunks of %d, not %d", labels[m], chunked.prefill_chunks, chunks[c],
                   want_chunks);
            // Added before step 8, the prompt's last chunk runs at step 8 + chunks - 1 and
            // its first token comes a step later; the companion never waits.
            EXPECT(chunked.waited_steps == (want_chunks > 0 ? want_chunks : 1) && chunked.companion_gaps == 0,
                   "%s: chunks of %d: the first token after %d steps, the companion without a token in %d",
                   labels[m], chunks[c], chunked.waited_steps, chunked.companion_gaps);
            if (getenv("TEST_VERBOSE"))
                printf("%s chunk %d: max difference %.3g%s\n", labels[m], chunks[c], d, bitwise ? " (bitwise)" : "");
            free_chunk_run(&chunked);
        }
        free_chunk_run(&whole);
        model_free(&model);
    }
}

// A request stopped while its prompt is being prefilled in chunks (its client gone) leaves
// at once: its sequences finish with no tokens (stop check), its rows are free, no more of
// its chunks run, and the companion's answer is the one it gives without it.
static void test_chunked_prefill_cancelled(void) {
    Model model;
    load(&model, "tests/fixtures/models/llama");
    static ChunkRun alone, cancelled;
    // The request is stopped at its third check: after two chunks of 7.
    run_chunk_schedule(&model, 40, 7, 3, &cancelled);
    for (int j = 0; j < 2; j++)
        EXPECT(cancelled.answers[j].finished && cancelled.answers[j].row.length == 0 &&
                   cancelled.answers[j].row.stop == STOP_CHECK && cancelled.answers[j].tokens == 0,
               "answer %d: %d tokens, stop %s", j, cancelled.answers[j].row.length,
               stop_reason_name(cancelled.answers[j].row.stop));
    EXPECT(cancelled.prefill_chunks == 2, "%ld chunks ran", cancelled.prefill_chunks);
    // The companion alone: the long request cancelled at its first check.
    run_chunk_schedule(&model, 40, 7, 1, &alone);
    EXPECT(alone.prefill_chunks == 0, "%ld chunks ran", alone.prefill_chunks);
    bool bitwise;
    const double d = chunk_run_difference(&cancelled, &alone, &bitwise);
    EXPECT(bitwise, "the companion's answer differs by %.3g", d);
    free_chunk_run(&cancelled), free_chunk_run(&alone);
    model_free(&model);
}

int main(void) {
    RUN(test_q8_cache_row_operations);
    RUN(test_relayout_keeps_the_cache);
    RUN(test_extend_matches_prefill);
    RUN(test_prompt_cache_turns);
    RUN(test_joining_sequences_match_generate);
    RUN(test_chunked_prefill_matches_whole);
    RUN(test_chunked_prefill_cancelled);
    TEST_EXIT();
}
