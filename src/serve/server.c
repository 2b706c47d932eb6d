// The HTTP side of `marlhf serve`: libmicrohttpd in thread-per-connection mode, routing,
// the request limits (body size, concurrency, timeouts) and one generation worker that
// runs a continuous batch (gen/continuous.h) of up to --parallel rows (a request takes one
// row per choice, OpenAI's n): queued requests join it between decode steps, in arrival
// order, as rows free up, and each leaves as soon as its choices end (the model is a single
// instance; a decode step costs little more for 4 rows than for 1). A streaming request's
// tokens go from the worker into a buffer that MHD's chunked reader hands out as
// server-sent events. OpenAI request/response JSON is serve/openai.c. The same worker runs
// /v1/embeddings requests (serve/embeddings_api.h, model/pooling.h): one forward of up to
// --parallel inputs between two decode steps, so that embeddings and generation share the
// model without a lock and neither holds the other back for more than a forward.
#include "serve/server.h"

#include <errno.h>
#include <math.h>
#include <microhttpd.h>
#include <netdb.h>
#include <omp.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "core/check.h"
#include "core/timer.h"
#include "gen/continuous.h"
#include "gen/lazy_constraint.h"
#include "serve/embeddings_api.h"
#include "serve/listener.h"
#include "serve/tool_calls.h"
#include "serve/openai.h"
#include "serve/reward_api.h"

typedef struct Job Job;
typedef struct EmbedJob EmbedJob;
typedef struct RewardJob RewardJob;

struct Server {
    TextModel *tm;          // the generative model, or NULL when serving a reward model
    TokenTrie *trie;        // its vocabulary's bytes, for constrained answers (structured outputs)
    Model *reward_model;    // the reward model (value head), or NULL
    const Tokenizer *reward_tokenizer;
    bool worker_started; // the worker: generation and embeddings, or a reward server's scoring
    ServerOptions options;
    char *model_name;
    struct MHD_Daemon *daemon;
    int listen_fd;
    int port;
    long created;
    pthread_t worker;
    // Everything below, and every Job's shared fields, under `lock`; `changed` is broadcast
    // on any change (few waiters, so one condition is simpler than one per job).
    pthread_mutex_t lock;
    pthread_cond_t changed;
    Job *queue_head, *queue_tail;
    EmbedJob *embed_head, *embed_tail; // /v1/embeddings requests, in arrival order
    RewardJob *reward_head, *reward_tail; // /get_reward requests waiting to be scored, in arrival order
    int in_flight; // admitted requests not yet answered (generation and embeddings, queued included)
    int open_posts; // POST requests between their headers and the end of their answer
    bool stopping;
    uint64_t requests; // numbers the requests: ids and default seeds
    // For GET /metrics: generation requests answered (any outcome) and failed of them; the
    // usage of the others; the batch as the worker left it after its last step.
    uint64_t answered, failed, prompt_tokens, completion_tokens;
    int rows_generating;
    ContinuousStats batch_stats;
    // For GET /metrics of a reward server: /get_reward requests scored, their sequences,
    // tokens, the scoring rounds (requests scored together count once) and their forwards,
    // and the seconds spent scoring.
    uint64_t reward_requests, reward_sequences, reward_tokens, reward_rounds, reward_forwards;
    double reward_seconds;
    // For GET /metrics: /v1/embeddings requests answered with their vectors, their inputs
    // and tokens, the embedding forwards (concurrent requests share them) and their seconds.
    uint64_t embedding_requests, embedding_inputs, embedding_tokens, embedding_forwards;
    double embedding_seconds;
};

// A reply token kept for the log-probs of its choice: where the text it added lies in the
// choice's text (before a stop string cut it), and its log-prob; its alternatives are at
// [i * top_logprobs, (i + 1) * top_logprobs) of the choice's top arrays for the i-th record.
typedef struct {
    int token;
    float logprob;
    size_t start, end;
} TokenRecord;

// One answer of a request (a request with n choices has n of them, generated as n rows of
// the worker's batch). The worker's alone until the job is finished; then read-only.
typedef struct {
    Job *job;
    int index; // in the job's choices
    TokenizerStream *decoder;
    char *text; // the answer so far (cut at a stop string once one is seen)
    size_t text_len, text_capacity, emitted;
    bool stop_hit;
    const char *finish_reason;
    StopReason stop; // how its row ended
    int completion_tokens;
    // With log-probs asked: the reply's tokens (not the stop token), in order, with room for
    // the job's max_new. The first records_emitted go with the text emitted so far (streamed
    // or, at the end, in the response); streamed, chars_emitted is the length of their texts
    // in characters, where the next chunk's text_offset starts.
    TokenRecord *records;
    int *top_tokens;
    float *top_logprobs;
    int num_records, records_emitted;
    long chars_emitted;
    // With tools (the job's tool_syntax): the scanner that takes calls out of the text, the
    // content shown so far (the text outside the calls), and the calls with their ids.
    ToolScanner scanner;
    char *content;
    size_t content_len, content_capacity;
    ToolCall *calls;
    char (*call_ids)[64];
    int num_calls, calls_capacity;
} Choice;

// One generation request, shared by the HTTP thread that admitted it, the worker, and for
// a stream the MHD response that reads it.
struct Job {
    Server *server;
    Job *next; // in the queue
    int refs;
    OpenAIResponseHead head;
    char id[48];
    int *ids;
    int num_ids;
    int max_new;
    SamplerConfig sampler;
    SamplerLogitBias *logit_bias; // the request's (sampler.logit_bias points here)
    uint64_t seed;
    char *stop[OPENAI_MAX_STOP];
    int num_stop;
    bool stream, include_usage;
    bool logprobs;    // log-probs asked (openai.h says which tokens have them, and how)
    int top_logprobs; // alternatives per token
    ChatToolSyntax tool_syntax; // how calls are parsed out of the answers (NONE: no tools, or tool_choice none)
    bool parallel_tool_calls;   // false: one call per answer at most
    Constraint *constraint; // the answers' (response_format, tool calls forced or lazy under "auto"), or NULL
    double deadline;

    // The worker's alone until `finished` is set; then read-only.
    Choice *choices;
    int num_choices; // the request's n: rows of the batch this job takes
    int choices_left; // still generating
    bool timed_out;
    bool failed; // for the whole request: one choice that cannot finish fails them all
    OpenAIError error;

    // Shared.
    char *out; // the event stream not yet handed to MHD
    size_t out_len, out_capacity, out_read;
    bool finished, cancelled;
};

// One /v1/embeddings request. The HTTP thread that admitted it owns it; the worker runs
// it, a forward of up to --parallel inputs per turn of its loop (between decode steps, so
// generation goes on), and touches it no more once it has set `finished` (under the lock).
struct EmbedJob {
    EmbedJob *next; // in the queue
    int **ids;      // [count] token ids per input
    int *lengths;
    int count;
    int *order;     // the inputs in the order they run: shortest first, so that a forward
                    // pads its rows to about their own length
    long tokens;    // of every input
    double deadline;
    bool per_token; // --pooling none: a vector per token (POST /embeddings)
    long *offsets;  // [count]: input i's first vector is vectors[offsets[i] * hidden_size]
    // The worker's until `finished`.
    int done;       // inputs embedded (order[0, done))
    float *vectors; // [count * hidden_size], or one vector per token with per_token
    double seconds; // in forwards
    bool failed;
    OpenAIError error;
    bool finished;  // shared
};

// One /get_reward request. The HTTP thread that admitted it owns it; the reward worker
// scores it together with the others waiting at the time (up to --reward-batch requests)
// and touches it no more once it has set `finished` (under the lock).
struct RewardJob {
    RewardJob *next; // in the queue
    RewardRequest req;
    double deadline;
    // The worker's until `finished`.
    float *scores; // [req.count]
    long tokens;
    double seconds; // of the round it was scored in
    int batch_mates; // the other requests of that round
    bool failed;
    OpenAIError error;
    bool finished; // shared
};

// --- jobs ------------------------------------------------------------------------------

static void job_unref_locked(Job *job) {
    if (--job->refs > 0) return;
    free(job->ids);
    free(job->logit_bias);
    for (int i = 0; i < job->num_stop; i++) free(job->stop[i]);
    for (int i = 0; i < job->num_choices; i++) {
        Choice *choice = &job->choices[i];
        free(choice->text), free(choice->records), free(choice->top_tokens), free(choice->top_logprobs);
        tool_scanner_free(&choice->scanner);
        for (int k = 0; k < choice->num_calls; k++) tool_call_free(&choice->calls[k]);
        free(choice->content), free(choice->calls), free(choice->call_ids);
    }
    free(job->choices);
    constraint_free(job->constraint);
    free(job->out);
    free(job);
}

static void grow_append(char **buffer, size_t *length, size_t *capacity, const char *bytes, size_t count) {
    if (*length + count + 1 > *capacity) {
        *capacity = 2 * (*length + count + 1) + 256;
        *buffer = xrealloc(*buffer, *capacity);
    }
    memcpy(*buffer + *length, bytes, count);
    *length += count;
    (*buffer)[*length] = '\0';
}

// Takes ownership of json. Server-Sent Events: one "data:" line per event.
static void sse_event_locked(Job *job, char *json) {
    grow_append(&job->out, &job->out_len, &job->out_capacity, "data: ", 6);
    grow_append(&job->out, &job->out_len, &job->out_capacity, json, strlen(json));
    grow_append(&job->out, &job->out_len, &job->out_capacity, "\n\n", 2);
    free(json);
}

static void sse_event(Job *job, char *json) {
    pthread_mutex_lock(&job->server->lock);
    sse_event_locked(job, json);
    pthread_cond_broadcast(&job->server->changed);
    pthread_mutex_unlock(&job->server->lock);
}

// Cuts the choice's text at the first of the job's stop strings in it (as `marlhf generate
// --stop` does).
static void find_stop(const Job *job, Choice *choice) {
    size_t cut = choice->text_len;
    for (int i = 0; i < job->num_stop; i++) {
        const char *at = memmem(choice->text, choice->text_len, job->stop[i], strlen(job->stop[i]));
        if (at && (size_t)(at - choice->text) < cut) cut = (size_t)(at - choice->text);
        choice->stop_hit |= at != NULL;
    }
    choice->text_len = cut;
}

// How much of the choice's text is final: all but a tail that could still grow into a stop
// string.
static size_t settled_length(const Job *job, const Choice *choice) {
    if (choice->stop_hit) return choice->text_len;
    size_t hold = 0;
    for (int i = 0; i < job->num_stop; i++) {
        size_t length = strlen(job->stop[i]);
        for (size_t k = length - 1 < choice->text_len ? length - 1 : choice->text_len; k > hold; k--)
            if (memcmp(choice->text + choice->text_len - k, job->stop[i], k) == 0) {
                hold = k;
                break;
            }
    }
    size_t settled = choice->text_len - hold;
    while (settled > choice->emitted && settled < choice->text_len && (choice->text[settled] & 0xC0) == 0x80)
        settled--;
    return settled > choice->emitted ? settled : choice->emitted;
}

// How many of the choice's token records the text up to `upto` accounts for: the tokens
// whose text ends there or before; once the text is final (cut at a stop string, or
// generated to its end), also the one whose text the end cuts. A token whose text starts
// after a stop string's cut never counts.
static int records_within(const Choice *choice, size_t upto, bool final) {
    int count = choice->records_emitted;
    while (count < choice->num_records) {
        const TokenRecord *record = &choice->records[count];
        if (!(record->end <= upto || (final && record->start < upto))) break;
        count++;
    }
    return count;
}

// Characters (code points) of valid UTF-8: text_offset counts them.
static long utf8_characters(const char *text, size_t len) {
    long count = 0;
    for (size_t i = 0; i < len; i++) count += ((unsigned char)text[i] & 0xC0) != 0x80;
    return count;
}

// The log-probs of records [first, last) of a choice as openai.c prints them, each token's
// text decoded alone, text offsets from `offset` on. Returns the offset after the last one.
// Free with logprobs_free.
static long logprobs_build(const Job *job, const Choice *choice, int first, int last, long offset,
                           OpenAILogprobs *out) {
    const Tokenizer *tokenizer = job->server->tm->tokenizer;
    const int k = job->top_logprobs;
    const int count = last - first;
    *out = (OpenAILogprobs){NULL, 0};
    if (count == 0) return offset;
    OpenAILogprobEntry *entries = xcalloc((size_t)count, sizeof(OpenAILogprobEntry));
    // One array for every entry's alternatives (logprobs_free finds it at the first entry).
    OpenAIToken *tops = k > 0 ? xcalloc((size_t)count * k, sizeof(OpenAIToken)) : NULL;
    for (int i = 0; i < count; i++) {
        const TokenRecord *record = &choice->records[first + i];
        OpenAILogprobEntry *entry = &entries[i];
        entry->token.text = tokenizer_decode_len(tokenizer, &record->token, 1, false, &entry->token.len);
        entry->token.logprob = record->logprob;
        entry->text_offset = offset;
        offset += utf8_characters(entry->token.text, entry->token.len);
        entry->top = k > 0 ? tops + (long)i * k : NULL;
        entry->num_top = k;
        for (int j = 0; j < k; j++) {
            const long at = (long)(first + i) * k + j;
            OpenAIToken *top = &tops[(long)i * k + j];
            top->text = tokenizer_decode_len(tokenizer, &choice->top_tokens[at], 1, false, &top->len);
            top->logprob = choice->top_logprobs[at];
        }
    }
    *out = (OpenAILogprobs){entries, count};
    return offset;
}

static void logprobs_free(OpenAILogprobs *logprobs) {
    for (int i = 0; i < logprobs->count; i++) {
        const OpenAILogprobEntry *entry = &logprobs->entries[i];
        free((char *)entry->token.text);
        for (int j = 0; j < entry->num_top; j++) free((char *)entry->top[j].text);
    }
    if (logprobs->count > 0) free((OpenAIToken *)logprobs->entries[0].top);
    free((OpenAILogprobEntry *)logprobs->entries);
    memset(logprobs, 0, sizeof *logprobs);
}

// Emits choice `index`'s text up to `upto` with the log-probs of the tokens that text
// accounts for (streamed: as a chunk with the choice's index). `final`: the text is
// complete, and any record left goes out even without new text.
static void emit_settled(Job *job, int index, size_t upto, bool final) {
    Choice *choice = &job->choices[index];
    final = final || choice->stop_hit;
    const int records = job->logprobs ? records_within(choice, upto, final) : 0;
    if (upto <= choice->emitted && !(final && records > choice->records_emitted)) return;
    if (job->stream) {
        OpenAILogprobs logprobs = {0};
        if (job->logprobs)
            choice->chars_emitted = logprobs_build(job, choice, choice->records_emitted, records,
                                                   choice->chars_emitted, &logprobs);
        size_t from = upto > choice->emitted ? choice->emitted : upto;
        sse_event(job, openai_chunk_json(&job->head, index, false, choice->text + from, upto - from,
                                         job->logprobs ? &logprobs : NULL, NULL));
        logprobs_free(&logprobs);
    }
    if (upto > choice->emitted) choice->emitted = upto;
    if (job->logprobs) choice->records_emitted = records;
}

// With tools: hands the choice's text up to `upto` to its scanner, and sends (streamed) or
// keeps what comes out: text outside the calls as content, each call whole, with the
// log-probs of the tokens whose text ends within what the piece accounts for. At the end
// (`final`), the records left go out too, in a chunk without text.
static void emit_tools(Job *job, int index, size_t upto, bool final) {
    Choice *choice = &job->choices[index];
    final = final || choice->stop_hit;
    ToolEvent event;
    while (tool_scanner_next(&choice->scanner, choice->text ? choice->text : "", upto, final, &event)) {
        const int records = job->logprobs ? records_within(choice, event.end, false) : 0;
        OpenAILogprobs logprobs = {0};
        if (job->stream && job->logprobs)
            choice->chars_emitted = logprobs_build(job, choice, choice->records_emitted, records,
                                                   choice->chars_emitted, &logprobs);
        if (event.kind == TOOL_EVENT_TEXT) {
            grow_append(&choice->content, &choice->content_len, &choice->content_capacity, event.text, event.length);
            if (job->stream && (event.length > 0 || records > choice->records_emitted))
                sse_event(job, openai_chunk_json(&job->head, index, false, event.text, event.length,
                                                 job->logprobs ? &logprobs : NULL, NULL));
        } else if (!job->parallel_tool_calls && choice->num_calls > 0) {
            tool_call_free(&event.call); // parallel_tool_calls false: the first call only
        } else {
            if (choice->num_calls == choice->calls_capacity) {
                choice->calls_capacity = choice->calls_capacity ? 2 * choice->calls_capacity : 4;
                choice->calls = xrealloc(choice->calls, (size_t)choice->calls_capacity * sizeof *choice->calls);
                choice->call_ids = xrealloc(choice->call_ids, (size_t)choice->calls_capacity * sizeof *choice->call_ids);
            }
            int k = choice->num_calls++;
            choice->calls[k] = event.call;
            // Unique per server run: the request's id, the choice and the call's number.
            snprintf(choice->call_ids[k], sizeof choice->call_ids[k], "call_%s%02x%02x",
                     job->id + strlen("chatcmpl-"), index & 0xff, k & 0xff);
            if (job->stream) {
                OpenAIToolCall call = {choice->call_ids[k], event.call.name, event.call.arguments};
                sse_event(job, openai_tool_call_chunk_json(&job->head, index, k, &call,
                                                           job->logprobs ? &logprobs : NULL));
            }
        }
        logprobs_free(&logprobs);
        if (event.end > choice->emitted) choice->emitted = event.end;
        if (job->logprobs) choice->records_emitted = records;
    }
    // The records the text's end cuts (or a stop string's), in a chunk without text.
    if (final) emit_settled(job, index, choice->emitted, true);
}

static void add_text(const Job *job, Choice *choice, const char *piece, size_t length) {
    if (choice->stop_hit || length == 0) return;
    grow_append(&choice->text, &choice->text_len, &choice->text_capacity, piece, length);
    find_stop(job, choice);
}

// Keeps the log-probs of the token just generated for `choice` (the batch row's latest),
// whose text went to [start, end) of the choice's text.
static void record_token(const Job *job, Choice *choice, const GeneratedRow *row, size_t start, size_t end) {
    const int t = row->length - 1, k = job->top_logprobs;
    TokenRecord *record = &choice->records[choice->num_records];
    *record = (TokenRecord){row->tokens[t], row->logprobs[t], start, end};
    for (int j = 0; j < k; j++) {
        choice->top_tokens[(long)choice->num_records * k + j] = row->top_tokens[(long)t * row->top_count + j];
        choice->top_logprobs[(long)choice->num_records * k + j] = row->top_logprobs[(long)t * row->top_count + j];
    }
    choice->num_records++;
}

// A new token of a choice (the latest of `row`, its row of the batch).
static void on_token(void *context, void *owner, const GeneratedRow *row) {
    Choice *choice = owner;
    Job *job = choice->job;
    const int token = row->tokens[row->length - 1];
    const TextModel *tm = job->server->tm;
    for (int i = 0; i < tm->num_stop_tokens; i++)
        if (tm->stop_tokens[i] == token) return; // the end-of-turn token is not reply text
    char *piece = NULL;
    size_t length = 0;
    tokenizer_stream_push_len(choice->decoder, token, &piece, &length);
    // A token after a stop string adds nothing (the row stops at it anyway).
    if (job->logprobs && !choice->stop_hit) record_token(job, choice, row, choice->text_len, choice->text_len + length);
    add_text(job, choice, piece, length);
    free(piece);
    if (job->tool_syntax != CHAT_TOOLS_NONE) {
        emit_tools(job, choice->index, settled_length(job, choice), false);
        // parallel_tool_calls false: the answer ends with its first call (the text after it
        // is not generated).
        if (!job->parallel_tool_calls && choice->num_calls > 0) choice->stop_hit = true;
    } else {
        emit_settled(job, choice->index, settled_length(job, choice), false);
    }
}

static bool should_stop(void *context, void *owner, const GeneratedRow *row) {
    Choice *choice = owner;
    Job *job = choice->job;
    // A request that failed (a sibling choice halted) stops every choice.
    if (choice->stop_hit || job->failed) return true;
    pthread_mutex_lock(&job->server->lock);
    bool halt = job->cancelled || job->server->stopping;
    pthread_mutex_unlock(&job->server->lock);
    if (!halt && now_seconds() > job->deadline) job->timed_out = halt = true;
    return halt;
}

static void fail_job(Job *job, int status, const char *code, const char *message) {
    job->failed = true;
    openai_error_set(&job->error, status, "server_error", NULL, code, "%s", message);
}

static void explain_halt(Job *job, bool cancelled, bool stopping) {
    if (job->timed_out)
        fail_job(job, 503, "timeout", "the request did not finish within the server's --request-timeout-s");
    else if (stopping) fail_job(job, 503, "server_shutting_down", "the server is shutting down");
    else if (cancelled) fail_job(job, 499, "cancelled", "the client went away");
    else fail_job(job, 500, "internal_error", "the generation stopped for no known reason");
}

// After the generation, a choice's text gets its tail; a choice halted before its end (by
// the stop check, without a stop string) fails its whole request.
static void finish_text(Server *s, Choice *choice, const GeneratedRow *row) {
    Job *job = choice->job;
    char *rest = NULL;
    size_t length = 0;
    tokenizer_stream_flush_len(choice->decoder, &rest, &length);
    add_text(job, choice, rest, length);
    free(rest);
    tokenizer_stream_free(choice->decoder);
    choice->decoder = NULL;
    if (row->stop == STOP_CHECK && !choice->stop_hit && !job->failed) {
        pthread_mutex_lock(&s->lock);
        bool cancelled = job->cancelled, stopping = s->stopping;
        pthread_mutex_unlock(&s->lock);
        explain_halt(job, cancelled, stopping);
    }
}

// How a choice of a request that did not fail ended; its stream gets the text held back.
static void finish_choice(Job *job, Choice *choice) {
    if (job->tool_syntax != CHAT_TOOLS_NONE) emit_tools(job, choice->index, choice->text_len, true);
    else emit_settled(job, choice->index, choice->text_len, true);
    // An answer with calls ends for them (as vLLM reports it, whatever stopped the row).
    choice->finish_reason = choice->num_calls > 0                                   ? "tool_calls"
                            : choice->stop_hit || choice->stop == STOP_TOKEN ? "stop"
                                                                             : "length";
}

static void job_done_locked(Server *s, Job *job);

// A choice's row left the batch. Once every choice of its request has, the request is
// answered: each choice's text first gets its tail, so that a request one of whose
// choices halted is known to have failed before any of them sends its last text.
static void on_finish(void *context, void *owner, GeneratedRow *row) {
    Server *s = context;
    Choice *choice = owner;
    Job *job = choice->job;
    finish_text(s, choice, row);
    choice->stop = row->stop;
    choice->completion_tokens = row->length;
    generated_row_free(row);
    if (--job->choices_left > 0) return;
    for (int i = 0; i < job->num_choices && !job->failed; i++) finish_choice(job, &job->choices[i]);
    pthread_mutex_lock(&s->lock);
    job_done_locked(s, job);
    pthread_mutex_unlock(&s->lock);
}

// A request joins the batch: its choices get their decoders and log-prob records, a chat
// stream each choice's first chunk (the role), and `sequences` each choice's settings.
// Choice i samples from random stream i << 40 of the request's seed — the stream `marlhf
// generate --num-return-sequences` gives sample i of a lone prompt — so choice 0 is the
// answer of the request with n = 1, and a request's tokens do not depend on its
// batch-mates (its log-probs only up to float rounding: the batch runs through the same
// matmuls). The choices share the prompt's prefill.
static void prepare_job(Server *s, Job *job, SequenceOptions *sequences) {
    job->choices_left = job->num_choices;
    for (int i = 0; i < job->num_choices; i++) {
        Choice *choice = &job->choices[i];
        choice->job = job;
        choice->index = i;
        choice->decoder = tokenizer_stream_new(s->tm->tokenizer, true);
        tool_scanner_init(&choice->scanner, job->tool_syntax);
        if (job->logprobs) {
            choice->records = xmalloc((size_t)job->max_new * sizeof(TokenRecord));
            choice->top_tokens = xmalloc((size_t)job->max_new * job->top_logprobs * sizeof(int));
            choice->top_logprobs = xmalloc((size_t)job->max_new * job->top_logprobs * sizeof(float));
        }
        if (job->stream && job->head.kind == OPENAI_CHAT)
            sse_event(job, openai_chunk_json(&job->head, i, true, "", 0, NULL, NULL));
        sequences[i] = (SequenceOptions){.sampler = job->sampler,
                                         .seed = job->seed,
                                         .row_id = (uint64_t)i << 40,
                                         .max_new_tokens = job->max_new,
                                         .top_logprobs = job->logprobs ? job->top_logprobs : 0,
                                         .owner = choice,
                                         .constraint = job->constraint};
    }
}

// The tokens of all the request's answers (OpenAI's usage.completion_tokens).
static int completion_tokens(const Job *job) {
    int total = 0;
    for (int i = 0; i < job->num_choices; i++) total += job->choices[i].completion_tokens;
    return total;
}

// The end of a job's stream: each choice's finish chunk (or the error), usage if asked,
// [DONE].
static void finish_stream_locked(Job *job) {
    if (job->failed) {
        sse_event_locked(job, openai_error_json(&job->error));
    } else {
        for (int i = 0; i < job->num_choices; i++)
            sse_event_locked(job, openai_chunk_json(&job->head, i, false, NULL, 0, NULL, job->choices[i].finish_reason));
        if (job->include_usage)
            sse_event_locked(job, openai_usage_chunk_json(&job->head, job->num_ids, completion_tokens(job)));
    }
    grow_append(&job->out, &job->out_len, &job->out_capacity, "data: [DONE]\n\n", 14);
}

// Marks a job answered (its stream's last events written) and lets it go. Under the lock.
static void job_done_locked(Server *s, Job *job) {
    if (job->stream) finish_stream_locked(job);
    job->finished = true;
    s->in_flight--;
    s->answered++;
    if (job->failed) {
        s->failed++;
    } else {
        s->prompt_tokens += (uint64_t)job->num_ids;
        s->completion_tokens += (uint64_t)completion_tokens(job);
    }
    pthread_cond_broadcast(&s->changed);
    job_unref_locked(job);
}

// --- embeddings (the worker's side) ------------------------------------------------------

// An embedding request answered (its vectors, or its error): its HTTP thread takes over.
// Under the lock.
static void embed_done_locked(Server *s, EmbedJob *job) {
    EmbedJob *before = NULL;
    for (EmbedJob *at = s->embed_head; at != job; at = at->next) before = at;
    if (before) before->next = job->next;
    else s->embed_head = job->next;
    if (s->embed_tail == job) s->embed_tail = before;
    s->in_flight--;
    if (!job->failed) {
        s->embedding_requests++;
        s->embedding_inputs += (uint64_t)job->count;
        s->embedding_tokens += (uint64_t)job->tokens;
    }
    job->finished = true;
    pthread_cond_broadcast(&s->changed);
}

// The embedding requests whose inputs fill the next forward (up to `max` of them, in
// arrival order): queued ones that can no longer run (past their deadline, or the server
// stopping) are answered 503 first. Under the lock.
static int next_embed_jobs_locked(Server *s, EmbedJob **jobs, int max) {
    int count = 0, inputs = 0;
    for (EmbedJob *job = s->embed_head, *next; job && inputs < max; job = next) {
        next = job->next;
        if (!s->stopping && now_seconds() <= job->deadline) {
            jobs[count++] = job;
            inputs += job->count - job->done;
            continue;
        }
        job->failed = true;
        if (s->stopping)
            openai_error_set(&job->error, 503, "server_error", NULL, "server_shutting_down", "the server is shutting down");
        else
            openai_error_set(&job->error, 503, "server_error", NULL, "timeout",
                             "the request did not finish within the server's --request-timeout-s");
        embed_done_locked(s, job);
    }
    return count;
}

// One forward of the next inputs of the waiting embedding requests: up to --parallel of
// them, the first request's next ones (its inputs run shortest first) and then, while
// rows are left, the next requests' — so concurrent requests share forwards — and no more
// rows than fit the model's context when padded to the longest, so that a forward never
// needs more activation memory than one prompt of the full context (attention keeps rows
// x length^2 probabilities). Outside the lock; afterwards a request is done when every
// input is embedded or it failed. Returns the forward's seconds (each request in it counts
// them in its own time too).
static double embed_step(Server *s, EmbedJob **jobs, int num_jobs) {
    Model *model = &s->tm->model;
    const int C = model->config.hidden_size, context = model->config.max_position_embeddings;
    const int P = s->options.parallel;
    const int **rows = xmalloc((size_t)P * sizeof(int *));
    int *lengths = xmalloc((size_t)P * sizeof(int)), *row_job = xmalloc((size_t)P * sizeof(int));
    int *row_input = xmalloc((size_t)P * sizeof(int));
    int B = 0, longest = 0;
    long vectors_needed = 0;
    for (int j = 0; j < num_jobs && B < P; j++) {
        const EmbedJob *job = jobs[j];
        bool full = false;
        for (int k = job->done; k < job->count && B < P; k++) {
            const int input = job->order[k], length = job->lengths[input];
            const int padded = length > longest ? length : longest;
            if (B > 0 && (long)(B + 1) * padded > context) {
                full = true;
                break;
            }
            rows[B] = job->ids[input], lengths[B] = length, row_job[B] = j, row_input[B] = input;
            longest = padded;
            vectors_needed += s->options.pooling == POOLING_NONE ? length : 1;
            B++;
        }
        if (full) break;
    }
    float *vectors = xmalloc((size_t)vectors_needed * C * sizeof(float));
    const double start = now_seconds();
    if (s->options.pooling == POOLING_NONE) token_embeddings(model, rows, lengths, B, vectors);
    else pooled_embeddings(model, rows, lengths, B, s->options.pooling, vectors);
    const double seconds = now_seconds() - start;
    for (int j = 0; j < num_jobs; j++)
        if (j <= row_job[B - 1]) jobs[j]->seconds += seconds;
    const float *from = vectors;
    for (int b = 0; b < B; b++) {
        EmbedJob *job = jobs[row_job[b]];
        const int input = row_input[b];
        const size_t floats = (size_t)(job->per_token ? lengths[b] : 1) * C;
        for (size_t c = 0; c < floats && !job->failed; c++)
            if (!isfinite(from[c])) {
                job->failed = true;
                openai_error_set(&job->error, 500, "server_error", NULL, "internal_error",
                                 "the model's hidden states for input[%d] are not finite", input);
            }
        memcpy(job->vectors + (size_t)job->offsets[input] * C, from, floats * sizeof(float));
        from += floats;
        job->done++;
    }
    free(rows), free(lengths), free(row_job), free(row_input), free(vectors);
    return seconds;
}

// The worker: between decode steps, queued requests join the batch in arrival order while
// their choices (one row each) fit in options.parallel rows — a request with more choices
// than that joins a batch without rows, alone — with one prefill for all that join
// together; a request that cannot join yet holds back the ones behind it. A queued request
// that was cancelled or timed out, or any once the server stops, is answered without
// generating; the rows of a running one stop at their next token then. Embedding
// requests run alongside: one forward of up to --parallel inputs per turn, before the
// decode step, the first request's in arrival order and then the next ones' (embed_step).
static void *worker_main(void *arg) {
    Server *s = arg;
    // OpenMP settings are per thread: this one runs every forward pass.
    if (s->options.threads > 0) omp_set_num_threads(s->options.threads);
    TextModel *tm = s->tm;
    const int max_rows = s->options.parallel > OPENAI_MAX_CHOICES ? s->options.parallel : OPENAI_MAX_CHOICES;
    const int pad = tokenizer_pad_id(tm->tokenizer);
    ContinuousOptions options = {.stop_tokens = tm->stop_tokens,
                                 .num_stop_tokens = tm->num_stop_tokens,
                                 .pad_token = pad >= 0 ? pad : 0,
                                 .on_token = on_token,
                                 .stop_check = should_stop,
                                 .on_finish = on_finish,
                                 .context = s,
                                 .prompt_cache_rows = s->options.prompt_cache_rows,
                                 .token_trie = s->trie,
                                 .prefill_chunk = s->options.prefill_chunk};
    ContinuousBatch *batch = continuous_batch_new(&tm->model, max_rows, &options);
    Job **joining = xmalloc((size_t)max_rows * sizeof(Job *));
    SequenceRequest *requests = xmalloc((size_t)max_rows * sizeof(SequenceRequest));
    SequenceOptions *sequences = xmalloc((size_t)max_rows * sizeof(SequenceOptions));
    EmbedJob **embedding = xmalloc((size_t)s->options.parallel * sizeof(EmbedJob *));
    pthread_mutex_lock(&s->lock);
    for (;;) {
        const int rows = continuous_batch_rows(batch); // only this thread changes it
        if (rows == 0) {
            while (!s->queue_head && !s->embed_head && !s->stopping) pthread_cond_wait(&s->changed, &s->lock);
            if (!s->queue_head && !s->embed_head) break; // stopping, and nothing left to answer
        }
        const int num_embedding = next_embed_jobs_locked(s, embedding, s->options.parallel);
        int count = 0, new_rows = 0;
        while (s->queue_head) {
            Job *job = s->queue_head;
            if (now_seconds() > job->deadline) job->timed_out = true;
            const bool halted = job->cancelled || s->stopping || job->timed_out;
            if (!halted && rows + new_rows > 0 && rows + new_rows + job->num_choices > s->options.parallel) break;
            s->queue_head = job->next;
            if (!s->queue_head) s->queue_tail = NULL;
            if (halted) {
                explain_halt(job, job->cancelled, s->stopping);
                job_done_locked(s, job);
            } else {
                joining[count++] = job;
                new_rows += job->num_choices;
            }
        }
        if (rows + new_rows == 0 && num_embedding == 0) continue;
        pthread_mutex_unlock(&s->lock);
        const double embedding_seconds = num_embedding > 0 ? embed_step(s, embedding, num_embedding) : 0;
        if (count > 0) {
            if (rows > 0 || count > 1)
                fprintf(stderr, "serve: %d request%s (%d row%s) join%s %d generating row%s\n", count,
                        count > 1 ? "s" : "", new_rows, new_rows > 1 ? "s" : "", count > 1 ? "" : "s", rows,
                        rows == 1 ? "" : "s");
            for (int j = 0, first = 0; j < count; first += joining[j]->num_choices, j++) {
                prepare_job(s, joining[j], sequences + first);
                requests[j] = (SequenceRequest){.prompt = joining[j]->ids,
                                                .prompt_length = joining[j]->num_ids,
                                                .sequences = sequences + first,
                                                .num_sequences = joining[j]->num_choices};
            }
            continuous_batch_add(batch, requests, count);
            for (int j = 0; j < count; j++) joining[j]->head.cached_tokens = requests[j].cached_tokens;
        }
        if (rows + new_rows > 0) continuous_batch_step(batch);
        pthread_mutex_lock(&s->lock);
        s->embedding_forwards += num_embedding > 0;
        s->embedding_seconds += embedding_seconds;
        for (int e = 0; e < num_embedding; e++) // still queued: only this thread takes one off
            if (embedding[e]->failed || embedding[e]->done == embedding[e]->count) embed_done_locked(s, embedding[e]);
        continuous_batch_stats(batch, &s->batch_stats);
        s->rows_generating = continuous_batch_rows(batch) - s->batch_stats.prefilling_rows;
    }
    pthread_mutex_unlock(&s->lock);
    continuous_batch_free(batch);
    free(joining), free(requests), free(sequences), free(embedding);
    return NULL;
}

// --- reward scoring (a reward server's worker) -------------------------------------------

// A reward request answered (its scores, or its error): its HTTP thread takes over. Under
// the lock; the job is off the queue.
static void reward_done_locked(Server *s, RewardJob *job) {
    s->in_flight--;
    if (!job->failed) {
        s->reward_requests++;
        s->reward_sequences += (uint64_t)job->req.count;
        s->reward_tokens += (uint64_t)job->tokens;
    }
    job->finished = true;
    pthread_cond_broadcast(&s->changed);
}

// Asked before each forward of a scoring round: the server is stopping.
static bool reward_round_stops(void *context) {
    Server *s = context;
    pthread_mutex_lock(&s->lock);
    const bool stopping = s->stopping;
    pthread_mutex_unlock(&s->lock);
    return stopping;
}

// The reward worker: whenever the model is free, the requests that arrived meanwhile (up
// to --reward-batch of them, in arrival order) are scored together — their sequences
// sorted by length into forwards of --parallel rows (serve/reward_api.h) — so concurrent
// clients share forwards instead of queueing for the model one by one. A queued request
// past its deadline, or any once the server stops, is answered 503 without scoring; a
// round that has started scores to its end, unless the server stops (503 at its next
// forward).
static void *reward_worker_main(void *arg) {
    Server *s = arg;
    if (s->options.threads > 0) omp_set_num_threads(s->options.threads);
    const int cap = s->options.reward_batch > 0 ? s->options.reward_batch : 1;
    RewardJob **round = xmalloc((size_t)cap * sizeof(RewardJob *));
    const RewardRequest **reqs = xmalloc((size_t)cap * sizeof(RewardRequest *));
    float **scores = xmalloc((size_t)cap * sizeof(float *));
    long *tokens = xmalloc((size_t)cap * sizeof(long));
    pthread_mutex_lock(&s->lock);
    for (;;) {
        while (!s->reward_head && !s->stopping) pthread_cond_wait(&s->changed, &s->lock);
        if (!s->reward_head) break; // stopping, and nothing left to answer
        int count = 0;
        while (s->reward_head && count < cap) {
            RewardJob *job = s->reward_head;
            s->reward_head = job->next;
            if (!s->reward_head) s->reward_tail = NULL;
            if (s->stopping || now_seconds() > job->deadline) {
                job->failed = true;
                if (s->stopping)
                    openai_error_set(&job->error, 503, "server_error", NULL, "server_shutting_down",
                                     "the server is shutting down");
                else
                    openai_error_set(&job->error, 503, "server_error", NULL, "timeout",
                                     "the request waited for the model past the server's --request-timeout-s");
                reward_done_locked(s, job);
                continue;
            }
            round[count++] = job;
        }
        if (count == 0) continue;
        pthread_mutex_unlock(&s->lock);
        for (int r = 0; r < count; r++) reqs[r] = &round[r]->req, scores[r] = round[r]->scores;
        const double start = now_seconds();
        const int forwards = reward_requests_score(s->reward_model, s->reward_tokenizer, reqs, count, s->options.parallel,
                                                   scores, tokens, reward_round_stops, s);
        const double seconds = now_seconds() - start;
        if (count > 1) fprintf(stderr, "serve: %d reward requests scored together (%d forwards)\n", count, forwards);
        pthread_mutex_lock(&s->lock);
        s->reward_rounds++;
        s->reward_forwards += forwards > 0 ? (uint64_t)forwards : 0;
        s->reward_seconds += seconds;
        for (int r = 0; r < count; r++) {
            if (forwards < 0) {
                round[r]->failed = true;
                openai_error_set(&round[r]->error, 503, "server_error", NULL, "server_shutting_down",
                                 "the server is shutting down");
            }
            round[r]->tokens = tokens[r];
            round[r]->seconds = seconds;
            round[r]->batch_mates = count - 1;
            reward_done_locked(s, round[r]);
        }
    }
    pthread_mutex_unlock(&s->lock);
    free(round), free(reqs), free(scores), free(tokens);
    return NULL;
}

// --- HTTP ------------------------------------------------------------------------------

typedef enum {
    ROUTE_NONE,
    ROUTE_HEALTH,
    ROUTE_METRICS,
    ROUTE_MODELS,
    ROUTE_MODEL,
    ROUTE_CHAT,
    ROUTE_COMPLETIONS,
    ROUTE_EMBEDDINGS,
    ROUTE_EMBEDDINGS_NATIVE, // llama.cpp's /embeddings: a list of vectors per input (--pooling none: per token)
    ROUTE_REWARD
} Route;

// What one call of the access handler answers with.
typedef struct {
    Server *server;
    struct MHD_Connection *connection;
    const char *method;
    const char *url;
} Exchange;

// The body of a POST, gathered across calls of the access handler.
typedef struct {
    Route route;
    char *body;
    size_t size, capacity;
    bool too_big;
} Upload;

// URLs and messages reach the log and error messages: one printable line, bounded.
static void printable(const char *in, char *out, size_t size) {
    size_t n = 0;
    for (; in && *in && n + 1 < size; in++) out[n++] = (unsigned char)*in < 0x20 || *in == 0x7f ? '?' : *in;
    out[n] = '\0';
}

static void log_exchange(const Exchange *ex, int status, const char *detail) {
    char method[24], url[160];
    printable(ex->method, method, sizeof method);
    printable(ex->url, url, sizeof url);
    fprintf(stderr, "serve: %s %s %d%s%s\n", method, url, status, detail ? " " : "", detail ? detail : "");
}

// Takes ownership of body (malloc'd).
static enum MHD_Result respond(const Exchange *ex, int status, char *body, const char *content_type,
                               const char *allow, const char *detail) {
    log_exchange(ex, status, detail);
    struct MHD_Response *response = MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE);
    if (!response) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(response, MHD_HTTP_HEADER_CONTENT_TYPE, content_type);
    if (allow) MHD_add_response_header(response, MHD_HTTP_HEADER_ALLOW, allow);
    enum MHD_Result result = MHD_queue_response(ex->connection, (unsigned int)status, response);
    MHD_destroy_response(response);
    return result;
}

static enum MHD_Result respond_json(const Exchange *ex, int status, char *json, const char *detail) {
    return respond(ex, status, json, "application/json", NULL, detail);
}

static enum MHD_Result respond_error(const Exchange *ex, const OpenAIError *err, const char *allow) {
    char detail[160];
    printable(err->message, detail, sizeof detail);
    return respond(ex, err->status, openai_error_json(err), "application/json", allow, detail);
}

static enum MHD_Result respond_new_error(const Exchange *ex, int status, const char *type, const char *code,
                                         const char *allow, const char *fmt, ...) __attribute__((format(printf, 6, 7)));
static enum MHD_Result respond_new_error(const Exchange *ex, int status, const char *type, const char *code,
                                         const char *allow, const char *fmt, ...) {
    OpenAIError err = {.status = status, .type = type, .code = code};
    va_list args;
    va_start(args, fmt);
    vsnprintf(err.message, sizeof err.message, fmt, args);
    va_end(args);
    return respond_error(ex, &err, allow);
}

static Route find_route(const char *url) {
    static const char model_prefix[] = "/v1/models/";
    if (strcmp(url, "/health") == 0) return ROUTE_HEALTH;
    if (strcmp(url, "/metrics") == 0) return ROUTE_METRICS;
    if (strcmp(url, "/v1/models") == 0) return ROUTE_MODELS;
    if (strncmp(url, model_prefix, sizeof model_prefix - 1) == 0 && url[sizeof model_prefix - 1]) return ROUTE_MODEL;
    if (strcmp(url, "/v1/chat/completions") == 0) return ROUTE_CHAT;
    if (strcmp(url, "/v1/completions") == 0) return ROUTE_COMPLETIONS;
    if (strcmp(url, "/v1/embeddings") == 0) return ROUTE_EMBEDDINGS;
    if (strcmp(url, "/embeddings") == 0 || strcmp(url, "/embedding") == 0) return ROUTE_EMBEDDINGS_NATIVE;
    if (strcmp(url, "/get_reward") == 0) return ROUTE_REWARD;
    return ROUTE_NONE;
}

// Prometheus' text format: "# HELP", "# TYPE" and one sample per metric.
static void metric(char **text, size_t *length, size_t *capacity, const char *name, const char *type,
                   const char *help, double value) {
    char line[512];
    int n = snprintf(line, sizeof line, "# HELP marlhf_%s %s\n# TYPE marlhf_%s %s\nmarlhf_%s %.17g\n", name, help, name,
                     type, name, value);
    grow_append(text, length, capacity, line, (size_t)n);
}

// Where the model runs on a GPU (--device cuda), the device memory its backend holds and the
// most it has held (ops_device_memory: weights, their bf16 copies, KV caches, scratch).
static void device_memory_metrics(char **text, size_t *length, size_t *capacity, const OpsBackend *ops) {
    size_t in_use, peak;
    if (!ops_device_memory(ops, &in_use, &peak)) return;
    metric(text, length, capacity, "device_memory_bytes", "gauge",
           "Device memory the model's backend holds: weights, their bf16 copies, KV caches, scratch.", (double)in_use);
    metric(text, length, capacity, "device_memory_peak_bytes", "gauge",
           "The most device memory the model's backend has held at once.", (double)peak);
}

// The metrics of a reward server: its requests and what scoring them cost.
static char *reward_metrics_text(Server *s) {
    pthread_mutex_lock(&s->lock);
    const int in_flight = s->in_flight;
    const uint64_t requests = s->reward_requests, sequences = s->reward_sequences, tokens = s->reward_tokens,
                   rounds = s->reward_rounds, forwards = s->reward_forwards;
    const double seconds = s->reward_seconds;
    pthread_mutex_unlock(&s->lock);
    char *text = NULL;
    size_t length = 0, capacity = 0;
    metric(&text, &length, &capacity, "requests_in_progress", "gauge",
           "Reward requests admitted and not yet answered (waiting to score included).", in_flight);
    metric(&text, &length, &capacity, "reward_requests_total", "counter", "Reward requests scored.", (double)requests);
    metric(&text, &length, &capacity, "reward_sequences_total", "counter", "Sequences scored.", (double)sequences);
    metric(&text, &length, &capacity, "reward_tokens_total", "counter", "Tokens of the sequences scored.", (double)tokens);
    metric(&text, &length, &capacity, "reward_rounds_total", "counter",
           "Scoring rounds: the requests waiting for the model scored together (--reward-batch) count once.",
           (double)rounds);
    metric(&text, &length, &capacity, "reward_forwards_total", "counter", "Reward-model forwards.", (double)forwards);
    metric(&text, &length, &capacity, "reward_seconds_total", "counter", "Time in reward-model forwards.", seconds);
    device_memory_metrics(&text, &length, &capacity, s->reward_model->ops);
    return text;
}

static char *metrics_text(Server *s) {
    if (s->reward_model) return reward_metrics_text(s);
    pthread_mutex_lock(&s->lock);
    int queued = 0;
    for (const Job *job = s->queue_head; job; job = job->next) queued++;
    const int in_flight = s->in_flight, rows = s->rows_generating;
    const uint64_t answered = s->answered, failed = s->failed, prompt = s->prompt_tokens,
                   completion = s->completion_tokens;
    const ContinuousStats stats = s->batch_stats;
    const uint64_t embedding_requests = s->embedding_requests, embedding_inputs = s->embedding_inputs,
                   embedding_tokens = s->embedding_tokens, embedding_forwards = s->embedding_forwards;
    const double embedding_seconds = s->embedding_seconds;
    pthread_mutex_unlock(&s->lock);
    char *text = NULL;
    size_t length = 0, capacity = 0;
    metric(&text, &length, &capacity, "requests_in_progress", "gauge",
           "Generation and embedding requests admitted and not yet answered (queued included).", in_flight);
    metric(&text, &length, &capacity, "requests_queued", "gauge", "Generation requests waiting to join the batch.",
           queued);
    metric(&text, &length, &capacity, "rows_generating", "gauge",
           "Rows of the continuous batch decoding after its last step (one per choice).", rows);
    metric(&text, &length, &capacity, "rows_prefilling", "gauge",
           "Rows reserved after the last step by requests whose prompts are being prefilled in chunks.",
           stats.prefilling_rows);
    metric(&text, &length, &capacity, "requests_answered_total", "counter",
           "Generation requests answered, whatever the outcome.", (double)answered);
    metric(&text, &length, &capacity, "requests_failed_total", "counter",
           "Generation requests that failed (timed out, cancelled, server stopping).", (double)failed);
    metric(&text, &length, &capacity, "prompt_tokens_total", "counter", "Prompt tokens of the requests that did not fail.",
           (double)prompt);
    metric(&text, &length, &capacity, "completion_tokens_total", "counter",
           "Generated tokens of the requests that did not fail (their usage).", (double)completion);
    metric(&text, &length, &capacity, "generated_tokens_total", "counter",
           "Tokens the batch generated, failed requests included.", (double)stats.generated_tokens);
    metric(&text, &length, &capacity, "prefills_total", "counter",
           "Prompts joining the batch (requests joining together in one prefill count once).", (double)stats.prefills);
    metric(&text, &length, &capacity, "prefill_chunks_total", "counter",
           "Forwards of part of a long prompt (--prefill-chunk tokens at most per decode step).",
           (double)stats.prefill_chunks);
    metric(&text, &length, &capacity, "decode_steps_total", "counter", "Decode steps of the batch.",
           (double)stats.decode_steps);
    metric(&text, &length, &capacity, "backend_picked_tokens_total", "counter",
           "Tokens picked from the backend's results (greedy tokens, top-k or top-p candidates, whole-row draws) "
           "instead of from copied logits.",
           (double)stats.backend_picked_tokens);
    metric(&text, &length, &capacity, "nucleus_misses_total", "counter",
           "Decode steps whose top-p rows' candidates fell short of a nucleus (their logits copied instead).",
           (double)stats.nucleus_misses);
    metric(&text, &length, &capacity, "prefill_seconds_total", "counter", "Time in prefills (chunks included).",
           stats.prefill_seconds);
    metric(&text, &length, &capacity, "decode_seconds_total", "counter", "Time in decode steps, sampling included.",
           stats.decode_seconds);
    metric(&text, &length, &capacity, "kv_cache_slots", "gauge", "Slots per row of the batch's KV cache.",
           stats.capacity_slots);
    metric(&text, &length, &capacity, "prompt_cache_hits_total", "counter",
           "Prompts that continued a finished answer kept by --prompt-cache.", (double)stats.prompt_cache_hits);
    metric(&text, &length, &capacity, "prompt_tokens_cached_total", "counter",
           "Prompt tokens taken from the prompt cache instead of computed.", (double)stats.prompt_tokens_reused);
    metric(&text, &length, &capacity, "embedding_requests_total", "counter",
           "Embedding requests answered with their vectors.", (double)embedding_requests);
    metric(&text, &length, &capacity, "embedding_inputs_total", "counter", "Inputs (texts) of those requests.",
           (double)embedding_inputs);
    metric(&text, &length, &capacity, "embedding_tokens_total", "counter", "Tokens of those inputs.",
           (double)embedding_tokens);
    metric(&text, &length, &capacity, "embedding_forwards_total", "counter",
           "Embedding forwards (up to --parallel inputs each, of one request or of several).", (double)embedding_forwards);
    metric(&text, &length, &capacity, "embedding_seconds_total", "counter", "Time in embedding forwards.",
           embedding_seconds);
    device_memory_metrics(&text, &length, &capacity, s->tm->model.ops);
    return text;
}

static enum MHD_Result handle_get(const Exchange *ex, Route route) {
    Server *s = ex->server;
    if (route == ROUTE_METRICS) return respond(ex, 200, metrics_text(s), "text/plain; version=0.0.4", NULL, NULL);
    if (route == ROUTE_HEALTH) {
        pthread_mutex_lock(&s->lock);
        int in_flight = s->in_flight;
        pthread_mutex_unlock(&s->lock);
        char body[128];
        snprintf(body, sizeof body, "{\"status\":\"ok\",\"requests_in_progress\":%d,\"max_concurrent\":%d}", in_flight,
                 s->options.max_concurrent);
        return respond_json(ex, 200, xstrdup(body), NULL);
    }
    if (route == ROUTE_MODELS) return respond_json(ex, 200, openai_models_json(s->model_name, s->created), NULL);
    const char *name = ex->url + strlen("/v1/models/");
    if (strcmp(name, s->model_name) != 0) {
        char shown[160];
        printable(name, shown, sizeof shown);
        return respond_new_error(ex, 404, "invalid_request_error", "model_not_found", NULL,
                                 "The model '%s' does not exist", shown);
    }
    return respond_json(ex, 200, openai_model_json(s->model_name, s->created), NULL);
}

// The request's prompt as token ids. 0, or -1 with *err.
static int prompt_ids(Server *s, const OpenAIRequest *req, int **ids, int *count, OpenAIError *err) {
    TextModel *tm = s->tm;
    const char *param = req->kind == OPENAI_CHAT ? "messages" : "prompt";
    *ids = NULL;
    *count = 0;
    for (int i = 0; i < req->logit_bias_count; i++)
        if (req->logit_bias[i].token >= tm->model.config.vocab_size)
            return openai_error_set(err, 400, "invalid_request_error", "logit_bias", "invalid_value",
                                    "logit_bias token %d is not a token id of this model (vocabulary %d)",
                                    req->logit_bias[i].token, tm->model.config.vocab_size);
    if (req->kind == OPENAI_CHAT) {
        if (!tm->has_chat)
            return openai_error_set(err, 400, "invalid_request_error", "messages", "no_chat_template",
                                    "this model has no chat template; start the server with --chat-template NAME "
                                    "or use /v1/completions");
        // Tools for a template that has none are refused under their own name; an empty list
        // is nothing to refuse.
        const char *tools = req->tools_json;
        if (tools && chat_template_check_tools(&tm->chat) != 0) {
            if (req->num_tools > 0)
                return openai_error_set(err, 400, "invalid_request_error", "tools", "tools_not_supported", "%s",
                                        err_msg());
            tools = NULL;
        }
        // The request's chat_template_kwargs on a copy of the template (it borrows the
        // model's strings); a variable this template does not read is the request's error.
        ChatTemplate chat = tm->chat;
        if (req->template_kwargs_json) {
            json_t *kwargs = json_loads(req->template_kwargs_json, 0, NULL);
            CHECK(kwargs, "chat_template_kwargs kept as JSON does not parse");
            int applied = chat_template_apply_kwargs(&chat, kwargs);
            json_decref(kwargs);
            if (applied != 0)
                return openai_error_set(err, 400, "invalid_request_error", "chat_template_kwargs", "invalid_value", "%s",
                                        err_msg());
        }
        if (text_model_chat_ids_with(tm, &chat, req->messages, req->num_messages, tools, ids, count) != 0)
            return openai_error_set(err, 400, "invalid_request_error", "messages", "invalid_value", "%s", err_msg());
    } else if (req->prompt) {
        text_model_text_ids(tm, req->prompt, ids, count);
    } else {
        for (int i = 0; i < req->num_prompt_ids; i++)
            if (req->prompt_ids[i] >= tm->model.config.vocab_size)
                return openai_error_set(err, 400, "invalid_request_error", "prompt", "invalid_value",
                                        "prompt[%d] = %d is not a token id of this model (vocabulary %d)", i,
                                        req->prompt_ids[i], tm->model.config.vocab_size);
        *ids = xmalloc((size_t)req->num_prompt_ids * sizeof(int));
        memcpy(*ids, req->prompt_ids, (size_t)req->num_prompt_ids * sizeof(int));
        *count = req->num_prompt_ids;
    }
    if (*count == 0) return openai_error_set(err, 400, "invalid_request_error", param, "invalid_value", "the prompt is empty");
    // At least one position must be left for the reply.
    int context = tm->model.config.max_position_embeddings;
    if (*count >= context)
        return openai_error_set(err, 400, "invalid_request_error", param, "context_length_exceeded",
                                "This model's maximum context length is %d tokens, but the prompt has %d tokens",
                                context, *count);
    return 0;
}

static ssize_t stream_read(void *cls, uint64_t position, char *buffer, size_t max) {
    Job *job = cls;
    Server *s = job->server;
    pthread_mutex_lock(&s->lock);
    while (job->out_read == job->out_len && !job->finished) pthread_cond_wait(&s->changed, &s->lock);
    size_t n = job->out_len - job->out_read;
    if (n > max) n = max;
    memcpy(buffer, job->out + job->out_read, n);
    job->out_read += n;
    pthread_mutex_unlock(&s->lock);
    return n > 0 ? (ssize_t)n : MHD_CONTENT_READER_END_OF_STREAM;
}

// MHD is done with the stream (sent, or the client left): a generation nobody reads stops.
static void stream_free(void *cls) {
    Job *job = cls;
    Server *s = job->server;
    pthread_mutex_lock(&s->lock);
    job->cancelled = true;
    job_unref_locked(job);
    pthread_mutex_unlock(&s->lock);
}

static Job *job_new(Server *s, OpenAIRequest *req, int *ids, int count, uint64_t number) {
    Job *job = xcalloc(1, sizeof(Job));
    job->server = s;
    job->refs = 2; // the HTTP side and the worker
    snprintf(job->id, sizeof job->id, "%s-%lx%06llx", req->kind == OPENAI_CHAT ? "chatcmpl" : "cmpl",
             (unsigned long)s->created, (unsigned long long)number);
    job->head = (OpenAIResponseHead){req->kind, job->id, (long)time(NULL), s->model_name, 0};
    job->ids = ids;
    job->num_ids = count;
    job->num_choices = req->n;
    job->choices = xcalloc((size_t)req->n, sizeof(Choice));
    int room = s->tm->model.config.max_position_embeddings - count;
    job->max_new = req->max_tokens < room ? req->max_tokens : room;
    // temperature 0 is greedy in the sampler; top_p 1 is no nucleus cut.
    job->sampler = (SamplerConfig){.temperature = (float)req->temperature,
                                   .top_k = req->top_k,
                                   .top_p = (float)req->top_p,
                                   .min_p = (float)req->min_p,
                                   .repetition_penalty = (float)req->repetition_penalty,
                                   .presence_penalty = (float)req->presence_penalty,
                                   .frequency_penalty = (float)req->frequency_penalty};
    job->logit_bias = req->logit_bias, req->logit_bias = NULL; // the job's from here
    job->sampler.logit_bias = job->logit_bias, job->sampler.logit_bias_count = req->logit_bias_count;
    job->seed = req->has_seed ? req->seed : number;
    for (int i = 0; i < req->num_stop; i++) {
        job->stop[i] = req->stop[i];
        req->stop[i] = NULL;
    }
    job->num_stop = req->num_stop;
    req->num_stop = 0;
    job->stream = req->stream;
    job->include_usage = req->include_usage;
    job->logprobs = req->logprobs;
    // Calls are parsed out of the answers when tools were given and not switched off.
    job->tool_syntax = req->kind == OPENAI_CHAT && req->num_tools > 0 && !req->tool_choice_none
                           ? chat_template_tool_syntax(&s->tm->chat)
                           : CHAT_TOOLS_NONE;
    job->parallel_tool_calls = req->parallel_tool_calls || req->kind != OPENAI_CHAT;
    job->constraint = req->constraint; // the job's from here
    req->constraint = NULL;
    // generate() records at most the vocabulary.
    job->top_logprobs = req->top_logprobs < s->tm->model.config.vocab_size ? req->top_logprobs
                                                                           : s->tm->model.config.vocab_size;
    job->deadline = now_seconds() + s->options.request_timeout_s;
    return job;
}

// Admission of a request to a worker's queue: true when it may join, with s->lock held and
// the request counted in s->in_flight; otherwise the lock is released and *refusal says why
// (503 while the server stops, 429 when --max-concurrent requests are already in flight,
// doing `doing`).
static bool admit_request(Server *s, const char *doing, OpenAIError *refusal) {
    pthread_mutex_lock(&s->lock);
    if (!s->stopping && s->in_flight < s->options.max_concurrent) {
        s->in_flight++;
        return true;
    }
    bool stopping = s->stopping;
    pthread_mutex_unlock(&s->lock);
    if (stopping) openai_error_set(refusal, 503, "server_error", NULL, "server_shutting_down", "the server is shutting down");
    else
        openai_error_set(refusal, 429, "requests", NULL, "rate_limit_exceeded",
                         "the server is busy: %d requests are %s (--max-concurrent); retry later",
                         s->options.max_concurrent, doing);
    return false;
}

// POST /get_reward on a reward server (serve/reward_api.h). The request waits in the
// reward worker's queue (counted against --max-concurrent) and is scored with the others
// waiting at the same time; this thread answers.
static enum MHD_Result handle_reward(const Exchange *ex, Upload *upload) {
    Server *s = ex->server;
    RewardJob *job = xcalloc(1, sizeof(RewardJob));
    OpenAIError err;
    if (reward_request_parse(upload->body ? upload->body : "", upload->size, &job->req, &err) != 0) {
        free(job);
        return respond_error(ex, &err, NULL);
    }
    job->scores = xmalloc((size_t)job->req.count * sizeof(float));
    if (!admit_request(s, "scoring or waiting", &err)) {
        reward_request_free(&job->req);
        free(job->scores), free(job);
        return respond_error(ex, &err, NULL);
    }
    job->deadline = now_seconds() + s->options.request_timeout_s;
    if (s->reward_tail) s->reward_tail->next = job;
    else s->reward_head = job;
    s->reward_tail = job;
    pthread_cond_broadcast(&s->changed);
    while (!job->finished) pthread_cond_wait(&s->changed, &s->lock);
    pthread_mutex_unlock(&s->lock);

    enum MHD_Result result;
    if (job->failed) {
        result = respond_error(ex, &job->error, NULL);
    } else {
        char detail[128];
        snprintf(detail, sizeof detail, "(%d sequence%s, %ld tokens, %.2f s, %d batch-mate%s)", job->req.count,
                 job->req.count == 1 ? "" : "s", job->tokens, job->seconds, job->batch_mates,
                 job->batch_mates == 1 ? "" : "s");
        result = respond_json(ex, 200, reward_response_json(job->scores, job->req.count), detail);
    }
    reward_request_free(&job->req);
    free(job->scores), free(job);
    return result;
}

static void embed_job_free(EmbedJob *job) {
    for (int i = 0; i < job->count; i++) free(job->ids[i]);
    free(job->ids), free(job->lengths), free(job->order), free(job->offsets), free(job->vectors);
    free(job);
}

typedef struct {
    int length, index;
} InputOrder;

// Shortest first; equal lengths in request order, so the forwards are the same every time.
static int shortest_first(const void *a, const void *b) {
    const InputOrder *x = a, *y = b;
    if (x->length != y->length) return x->length < y->length ? -1 : 1;
    return (x->index > y->index) - (x->index < y->index);
}

// An embedding request's inputs as token ids (texts tokenized as /v1/completions tokenizes
// a text prompt: with the BOS the tokenizer adds), checked against the vocabulary and the
// context, and the order they run in. Returns the job, or NULL with *err (400).
static EmbedJob *embed_job_new(Server *s, EmbeddingsRequest *req, OpenAIError *err) {
    TextModel *tm = s->tm;
    const int vocab = tm->model.config.vocab_size, context = tm->model.config.max_position_embeddings;
    EmbedJob *job = xcalloc(1, sizeof(EmbedJob));
    job->ids = xcalloc((size_t)req->count, sizeof(int *));
    job->lengths = xcalloc((size_t)req->count, sizeof(int));
    job->count = req->count;
    for (int i = 0; i < req->count; i++) {
        EmbeddingInput *input = &req->inputs[i];
        if (input->text) {
            text_model_text_ids(tm, input->text, &job->ids[i], &job->lengths[i]);
        } else {
            for (int t = 0; t < input->num_ids; t++)
                if (input->ids[t] >= vocab) {
                    openai_error_set(err, 400, "invalid_request_error", "input", "invalid_value",
                                     "input[%d][%d] = %d is not a token id of this model (vocabulary %d)", i, t,
                                     input->ids[t], vocab);
                    embed_job_free(job);
                    return NULL;
                }
            job->ids[i] = input->ids; // the request's array passes to the job
            job->lengths[i] = input->num_ids;
            input->ids = NULL;
        }
        job->tokens += job->lengths[i];
        if (job->lengths[i] == 0 || job->lengths[i] > context) {
            if (job->lengths[i] == 0)
                openai_error_set(err, 400, "invalid_request_error", "input", "invalid_value", "input[%d] has no tokens", i);
            else
                openai_error_set(err, 400, "invalid_request_error", "input", "context_length_exceeded",
                                 "This model's maximum context length is %d tokens, but input[%d] has %d tokens", context,
                                 i, job->lengths[i]);
            embed_job_free(job);
            return NULL;
        }
    }
    // A vector per token: the answer grows with the tokens (SmolLM2: 576 floats, ~6 KB of
    // JSON, each), so a request holds one context's worth of them at most.
    if (s->options.pooling == POOLING_NONE && job->tokens > context) {
        openai_error_set(err, 400, "invalid_request_error", "input", "context_length_exceeded",
                         "with --pooling none (a vector per token) a request's inputs hold at most the model's context, "
                         "%d tokens, in all; these have %ld", context, job->tokens);
        embed_job_free(job);
        return NULL;
    }
    InputOrder *order = xmalloc((size_t)job->count * sizeof(InputOrder));
    for (int i = 0; i < job->count; i++) order[i] = (InputOrder){job->lengths[i], i};
    qsort(order, (size_t)job->count, sizeof(InputOrder), shortest_first);
    job->order = xmalloc((size_t)job->count * sizeof(int));
    for (int i = 0; i < job->count; i++) job->order[i] = order[i].index;
    free(order);
    // A vector per input, or with --pooling none one per token, inputs in request order.
    job->per_token = s->options.pooling == POOLING_NONE;
    job->offsets = xmalloc((size_t)job->count * sizeof(long));
    long at = 0;
    for (int i = 0; i < job->count; at += job->per_token ? job->lengths[i] : 1, i++) job->offsets[i] = at;
    const long vectors = job->per_token ? job->tokens : job->count;
    job->vectors = xmalloc((size_t)vectors * tm->model.config.hidden_size * sizeof(float));
    return job;
}

// POST /v1/embeddings and POST /embeddings: the request waits in the worker's embedding
// queue (counted against --max-concurrent) and the worker runs it between decode steps;
// this thread answers. With --pooling none there is no vector per text, the only shape the
// OpenAI API has: /v1/embeddings refuses, as llama.cpp's server does, and /embeddings
// answers the vectors of every token.
static enum MHD_Result handle_embeddings(const Exchange *ex, Upload *upload) {
    Server *s = ex->server;
    const int hidden = s->tm->model.config.hidden_size;
    const bool native = upload->route == ROUTE_EMBEDDINGS_NATIVE;
    if (!native && s->options.pooling == POOLING_NONE)
        return respond_new_error(ex, 400, "invalid_request_error", "pooling_not_supported", NULL,
                                 "this server runs --pooling none (a vector per token), which the OpenAI embeddings "
                                 "API cannot return: POST /embeddings answers the per-token vectors; for one vector "
                                 "per text start the server with --pooling mean, last or cls");
    EmbeddingsRequest req;
    OpenAIError err;
    if ((native ? embeddings_native_request_parse : embeddings_request_parse)(upload->body ? upload->body : "",
                                                                              upload->size, s->model_name, hidden,
                                                                              &req, &err) != 0)
        return respond_error(ex, &err, NULL);
    const bool base64 = req.base64;
    EmbedJob *job = embed_job_new(s, &req, &err);
    embeddings_request_free(&req);
    if (!job) return respond_error(ex, &err, NULL);

    if (!admit_request(s, "in progress or queued", &err)) {
        embed_job_free(job);
        return respond_error(ex, &err, NULL);
    }
    job->deadline = now_seconds() + s->options.request_timeout_s;
    if (s->embed_tail) s->embed_tail->next = job;
    else s->embed_head = job;
    s->embed_tail = job;
    pthread_cond_broadcast(&s->changed);
    while (!job->finished) pthread_cond_wait(&s->changed, &s->lock);
    pthread_mutex_unlock(&s->lock);

    enum MHD_Result result;
    if (job->failed) {
        result = respond_error(ex, &job->error, NULL);
    } else {
        char detail[96];
        snprintf(detail, sizeof detail, "(%d input%s, %ld tokens, %.2f s)", job->count, job->count == 1 ? "" : "s",
                 job->tokens, job->seconds);
        char *json;
        if (native) {
            int *per_input = xmalloc((size_t)job->count * sizeof(int));
            for (int i = 0; i < job->count; i++) per_input[i] = job->per_token ? job->lengths[i] : 1;
            json = embeddings_native_response_json(job->vectors, per_input, job->count, hidden);
            free(per_input);
        } else {
            json = embeddings_response_json(job->vectors, job->count, hidden, base64, s->model_name, job->tokens);
        }
        result = respond_json(ex, 200, json, detail);
    }
    embed_job_free(job);
    return result;
}

// Under tool_choice "auto", a tool whose `parameters` schema the JSON constraint cannot
// honour (a keyword outside its subset: `format`, `minimum`, ...) keeps its call syntax and
// name checked but its arguments free (any object): its schema is taken out of `tools`
// and the server's log says so. (Forced calls answer such a schema with a 400 instead;
// "auto" was never refused for a schema and is not now.)
static void drop_unsupported_schemas(json_t *tools) {
    for (size_t i = 0; i < json_array_size(tools); i++) {
        json_t *function = json_object_get(json_array_get(tools, i), "function");
        json_t *parameters = json_object_get(function, "parameters");
        if (!parameters) continue;
        char what[64];
        snprintf(what, sizeof what, "tools[%zu].function.parameters", i);
        JsonConstraint *probe = NULL;
        if (json_constraint_schema(&probe, parameters, what) == 0) {
            json_constraint_free(probe);
            continue;
        }
        fprintf(stderr, "serve: tool_choice auto: %s; that tool's arguments are not checked against its schema\n",
                err_msg());
        json_object_del(function, "parameters");
    }
}

// The answers' constraint from the tools (what serve/tool_calls.c parses as calls): Hermes
// "<tool_call>\n" OBJECT "\n</tool_call>" blocks separated by "\n", Llama 3 JSON objects
// separated by "; ", each {"name": NAME, "arguments" / "parameters": a value of the tool's
// parameters schema}.
// - tool_choice "required" or a named function: the whole answer is calls; a named
//   function or parallel_tool_calls false: one call (as vLLM decodes a named choice).
// - "auto" (with at least one tool, and no response_format / structured output of its
//   own): a lazy constraint (gen/lazy_constraint.h): free text until the template's call
//   opening — "<tool_call>" anywhere for Hermes, "{" as the answer's first byte for Llama 3
//   JSON (its parser's rule) — then the same calls to the end of the answer: one with
//   parallel_tool_calls false, else one or more; no text after the last call (only the
//   end of the answer may follow its closing tag).
// 0, or -1 with *err (a forced call's schema the constraint refuses).
static int tool_choice_constraint(Server *s, OpenAIRequest *req, OpenAIError *err) {
    const bool forced = req->tool_choice_required || req->tool_choice_name;
    const bool lazy = !forced && !req->tool_choice_none && req->num_tools > 0 && !req->constraint;
    if (req->kind != OPENAI_CHAT || !(forced || lazy)) return 0;
    const ChatToolSyntax syntax = chat_template_tool_syntax(&s->tm->chat);
    if (syntax == CHAT_TOOLS_NONE) { // prompt_ids refused the tools before
        if (lazy) return 0;
        return openai_error_set(err, 400, "invalid_request_error", "tool_choice", "tools_not_supported",
                                "this model's chat template has no tool calls to force");
    }
    json_t *tools = json_loads(req->tools_json, 0, NULL);
    CHECK(tools, "the request's tools do not parse again");
    const bool hermes = syntax == CHAT_TOOLS_HERMES;
    const int max_calls = req->parallel_tool_calls && !req->tool_choice_name ? 0 : 1;
    JsonConstraint *calls = NULL;
    int rc = json_constraint_tool_calls(&calls, tools, req->tool_choice_name, hermes ? "<tool_call>\n" : "",
                                        hermes ? "\n</tool_call>" : "", hermes ? "\n" : "; ",
                                        hermes ? "arguments" : "parameters", max_calls);
    if (rc != 0 && lazy) {
        // Only when some schema is refused are the tools compiled one by one to find it
        // (the common request compiles its schemas once).
        err_clear();
        drop_unsupported_schemas(tools);
        rc = json_constraint_tool_calls(&calls, tools, req->tool_choice_name, hermes ? "<tool_call>\n" : "", hermes ? "\n</tool_call>" : "",
                                        hermes ? "\n" : "; ", hermes ? "arguments" : "parameters", max_calls);
    }
    json_decref(tools);
    if (rc != 0 && lazy) { // not expected once the schemas it refuses are out: unconstrained, as before
        fprintf(stderr, "serve: tool_choice auto: the calls are not constrained (%s)\n", err_msg());
        return 0;
    }
    if (rc != 0) return openai_error_set(err, 400, "invalid_request_error", "tools", "invalid_value", "%s", err_msg());
    if (!lazy) {
        req->constraint = constraint_from_json(calls);
        return 0;
    }
    const LazyTrigger trigger = hermes ? (LazyTrigger){"<tool_call>", strlen("<tool_call>"), false}
                                       : (LazyTrigger){"{", 1, true};
    LazyConstraint *lazy_calls = NULL;
    // The call syntax starts with its trigger, so this cannot be refused.
    CHECK(lazy_constraint_new(&lazy_calls, constraint_from_json(calls), &trigger, 1, "tools") == 0, "%s", err_msg());
    req->constraint = constraint_from_lazy(lazy_calls);
    return 0;
}

static enum MHD_Result handle_generation(const Exchange *ex, Upload *upload) {
    Server *s = ex->server;
    OpenAILimits limits = {s->model_name, s->options.max_tokens_limit, s->options.default_max_tokens};
    OpenAIRequest req;
    OpenAIError err;
    OpenAIKind kind = upload->route == ROUTE_CHAT ? OPENAI_CHAT : OPENAI_COMPLETION;
    if (openai_parse_request(kind, upload->body ? upload->body : "", upload->size, &limits, &req, &err) != 0)
        return respond_error(ex, &err, NULL);
    int *ids = NULL, count = 0;
    if (prompt_ids(s, &req, &ids, &count, &err) != 0 || tool_choice_constraint(s, &req, &err) != 0) {
        free(ids);
        openai_request_free(&req);
        return respond_error(ex, &err, NULL);
    }

    if (!admit_request(s, "generating or queued", &err)) {
        free(ids);
        openai_request_free(&req);
        return respond_error(ex, &err, NULL);
    }
    Job *job = job_new(s, &req, ids, count, s->requests++);
    if (s->queue_tail) s->queue_tail->next = job;
    else s->queue_head = job;
    s->queue_tail = job;
    pthread_cond_broadcast(&s->changed);
    pthread_mutex_unlock(&s->lock);
    openai_request_free(&req);

    if (job->stream) {
        // The response owns the HTTP side's reference from here (stream_free drops it).
        struct MHD_Response *response = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, stream_read, job, stream_free);
        if (!response) {
            stream_free(job);
            return MHD_NO;
        }
        MHD_add_response_header(response, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
        MHD_add_response_header(response, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
        log_exchange(ex, 200, "stream");
        enum MHD_Result result = MHD_queue_response(ex->connection, 200, response);
        MHD_destroy_response(response);
        return result;
    }
    double start = now_seconds();
    pthread_mutex_lock(&s->lock);
    while (!job->finished) pthread_cond_wait(&s->changed, &s->lock);
    pthread_mutex_unlock(&s->lock);
    enum MHD_Result result;
    if (job->failed) {
        result = respond_error(ex, &job->error, NULL);
    } else {
        char detail[96];
        snprintf(detail, sizeof detail, "(%d + %d tokens, %.2f s)", job->num_ids, completion_tokens(job),
                 now_seconds() - start);
        OpenAIChoice choices[OPENAI_MAX_CHOICES];
        OpenAILogprobs logprobs[OPENAI_MAX_CHOICES] = {0};
        OpenAIToolCall *calls[OPENAI_MAX_CHOICES] = {0};
        for (int i = 0; i < job->num_choices; i++) {
            const Choice *choice = &job->choices[i];
            if (job->logprobs) logprobs_build(job, choice, 0, choice->records_emitted, 0, &logprobs[i]);
            choices[i] = (OpenAIChoice){.text = choice->text ? choice->text : "",
                                        .len = choice->text_len,
                                        .finish_reason = choice->finish_reason,
                                        .logprobs = job->logprobs ? &logprobs[i] : NULL};
            if (job->tool_syntax != CHAT_TOOLS_NONE) {
                // The content is the text outside the calls: null when calls left none.
                bool none = choice->num_calls > 0 && choice->content_len == 0;
                choices[i].text = none ? NULL : choice->content ? choice->content : "";
                choices[i].len = choice->content_len;
                calls[i] = xcalloc(choice->num_calls ? choice->num_calls : 1, sizeof(OpenAIToolCall));
                for (int k = 0; k < choice->num_calls; k++)
                    calls[i][k] = (OpenAIToolCall){choice->call_ids[k], choice->calls[k].name,
                                                   choice->calls[k].arguments};
                choices[i].tool_calls = calls[i];
                choices[i].num_tool_calls = choice->num_calls;
            }
        }
        result = respond_json(ex, 200,
                              openai_completion_json(&job->head, choices, job->num_choices, job->num_ids,
                                                     completion_tokens(job)),
                              detail);
        for (int i = 0; i < job->num_choices; i++) logprobs_free(&logprobs[i]), free(calls[i]);
    }
    pthread_mutex_lock(&s->lock);
    job_unref_locked(job);
    pthread_mutex_unlock(&s->lock);
    return result;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *connection, const char *url,
                                  const char *method, const char *version, const char *upload_data,
                                  size_t *upload_data_size, void **request_state) {
    Server *s = cls;
    Exchange ex = {s, connection, method, url};
    Upload *upload = *request_state;
    if (!upload) { // the headers have arrived; no body yet
        Route route = find_route(url);
        bool is_get = strcmp(method, MHD_HTTP_METHOD_GET) == 0 || strcmp(method, MHD_HTTP_METHOD_HEAD) == 0;
        bool is_post = strcmp(method, MHD_HTTP_METHOD_POST) == 0;
        char shown[160];
        printable(url, shown, sizeof shown);
        if (route == ROUTE_NONE)
            return respond_new_error(&ex, 404, "invalid_request_error", "unknown_url", NULL, "Unknown request URL: %.16s %s",
                                     method, shown);
        bool post_route = route == ROUTE_CHAT || route == ROUTE_COMPLETIONS || route == ROUTE_EMBEDDINGS ||
                          route == ROUTE_EMBEDDINGS_NATIVE || route == ROUTE_REWARD;
        if (post_route ? !is_post : !is_get)
            return respond_new_error(&ex, 405, "invalid_request_error", "method_not_allowed", post_route ? "POST" : "GET, HEAD",
                                     "%.16s is not allowed on %s (use %s)", method, shown, post_route ? "POST" : "GET");
        if (!post_route) return handle_get(&ex, route);
        // One kind of model per server: a reward model scores, a generative model answers.
        if (route == ROUTE_REWARD && !s->reward_model)
            return respond_new_error(&ex, 400, "invalid_request_error", "not_a_reward_model", NULL,
                                     "this server serves a generative model; /get_reward needs a reward model "
                                     "(marlhf serve --reward-model PATH)");
        if (route != ROUTE_REWARD && s->reward_model)
            return respond_new_error(&ex, 400, "invalid_request_error", "not_a_generative_model", NULL,
                                     "this server serves a reward model: POST /get_reward {\"query\": [...]} "
                                     "(%s needs marlhf serve --model PATH)", shown);
        const char *length = MHD_lookup_connection_value(connection, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        if (length && strtoull(length, NULL, 10) > (unsigned long long)s->options.max_body_bytes)
            return respond_new_error(&ex, 413, "invalid_request_error", "request_too_large", NULL,
                                     "the request body (%.20s bytes) is over this server's limit of %ld bytes "
                                     "(--max-body-bytes)", length, s->options.max_body_bytes);
        upload = xcalloc(1, sizeof(Upload));
        upload->route = route;
        *request_state = upload;
        pthread_mutex_lock(&s->lock);
        s->open_posts++;
        pthread_mutex_unlock(&s->lock);
        return MHD_YES;
    }
    if (*upload_data_size > 0) {
        // A body without Content-Length (chunked) is only known to be too big as it comes;
        // MHD cannot answer in the middle of it, so the rest is read and dropped.
        if (!upload->too_big && upload->size + *upload_data_size > (size_t)s->options.max_body_bytes) {
            upload->too_big = true;
            free(upload->body);
            upload->body = NULL;
        }
        if (!upload->too_big) grow_append(&upload->body, &upload->size, &upload->capacity, upload_data, *upload_data_size);
        *upload_data_size = 0;
        return MHD_YES;
    }
    if (upload->too_big)
        return respond_new_error(&ex, 413, "invalid_request_error", "request_too_large", NULL,
                                 "the request body is over this server's limit of %ld bytes (--max-body-bytes)",
                                 s->options.max_body_bytes);
    if (upload->route == ROUTE_REWARD) return handle_reward(&ex, upload);
    if (upload->route == ROUTE_EMBEDDINGS || upload->route == ROUTE_EMBEDDINGS_NATIVE) return handle_embeddings(&ex, upload);
    return handle_generation(&ex, upload);
}

static void on_completed(void *cls, struct MHD_Connection *connection, void **request_state,
                         enum MHD_RequestTerminationCode code) {
    Server *s = cls;
    Upload *upload = *request_state;
    if (!upload) return;
    free(upload->body);
    free(upload);
    *request_state = NULL;
    pthread_mutex_lock(&s->lock);
    s->open_posts--;
    pthread_cond_broadcast(&s->changed);
    pthread_mutex_unlock(&s->lock);
}

// --- start and stop --------------------------------------------------------------------

// Starts a server for `tm` (generation) or `reward_model` (scoring): exactly one is set.
static int start(Server **out, TextModel *tm, Model *reward_model, const Tokenizer *reward_tokenizer,
                 const ServerOptions *options) {
    *out = NULL;
    int fd = -1;
    bool ipv6 = false;
    if (listener_open(options->host, options->port, 128, &fd, &ipv6) != 0) return -1;
    Server *s = xcalloc(1, sizeof(Server));
    s->tm = tm;
    s->reward_model = reward_model;
    s->reward_tokenizer = reward_tokenizer;
    s->options = *options;
    if (s->options.parallel < 1) s->options.parallel = 1;
    s->model_name = xstrdup(options->model_name);
    s->listen_fd = fd;
    s->port = listener_port(fd);
    s->created = (long)time(NULL);
    pthread_mutex_init(&s->lock, NULL);
    pthread_cond_init(&s->changed, NULL);
    if (tm) s->trie = token_trie_new(tm->tokenizer, tm->model.config.vocab_size);
    CHECK(pthread_create(&s->worker, NULL, tm ? worker_main : reward_worker_main, s) == 0,
          "cannot start the %s thread", tm ? "generation" : "scoring");
    s->worker_started = true;
    // A connection is one thread; the bound keeps a flood of clients from exhausting them,
    // and is far above what --max-concurrent admits, so busy clients still get their 429.
    unsigned int connections = 256 + 4 * (unsigned int)options->max_concurrent;
    // MHD_USE_ITC: server_stop quiesces the daemon (stops accepting) before it drains.
    unsigned int flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL | MHD_USE_ITC;
    if (ipv6) flags |= MHD_USE_IPv6;
    // MHD drops a connection idle past its timeout, and a connection whose handler or
    // stream reader waits on the worker looks idle: the margin lets every request end by
    // its own deadline (and answer 503) first.
    unsigned int idle_timeout = (unsigned int)options->request_timeout_s + 60;
    s->daemon = MHD_start_daemon(flags, 0, NULL, NULL, on_request, s, MHD_OPTION_LISTEN_SOCKET, fd,
                                 MHD_OPTION_NOTIFY_COMPLETED, on_completed, s, MHD_OPTION_CONNECTION_TIMEOUT,
                                 idle_timeout, MHD_OPTION_CONNECTION_LIMIT, connections,
                                 MHD_OPTION_END);
    if (!s->daemon) {
        server_stop(s);
        close(fd);
        return err_set("cannot start the HTTP server on %s:%d (libmicrohttpd)", options->host, options->port);
    }
    *out = s;
    return 0;
}

int server_start(Server **out, TextModel *tm, const ServerOptions *options) {
    return start(out, tm, NULL, NULL, options);
}

int server_start_reward(Server **out, Model *reward_model, const Tokenizer *tokenizer, const ServerOptions *options) {
    return start(out, NULL, reward_model, tokenizer, options);
}

int server_port(const Server *server) { return server->port; }

void server_stop(Server *s) {
    MHD_socket quiesced = s->daemon ? MHD_quiesce_daemon(s->daemon) : MHD_INVALID_SOCKET;
    pthread_mutex_lock(&s->lock);
    s->stopping = true;
    pthread_cond_broadcast(&s->changed);
    // MHD_stop_daemon cuts every connection at once; first the worker halts the running
    // generation and fails the queued ones, and their answers (503, or a stream's last
    // event) go out. A client that does not read its answer gets a few seconds.
    struct timespec deadline;
    clock_gettime(CLOCK_REALTIME, &deadline);
    deadline.tv_sec += 5;
    while (s->open_posts > 0 && pthread_cond_timedwait(&s->changed, &s->lock, &deadline) == 0) {
    }
    pthread_mutex_unlock(&s->lock);
    if (s->daemon) MHD_stop_daemon(s->daemon);
    if (quiesced != MHD_INVALID_SOCKET) close(quiesced);
    if (s->worker_started) pthread_join(s->worker, NULL);
    pthread_mutex_destroy(&s->lock);
    pthread_cond_destroy(&s->changed);
    token_trie_free(s->trie);
    free(s->model_name);
    free(s);
}
