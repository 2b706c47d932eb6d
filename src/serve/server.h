// The HTTP server of `marlhf serve`: libmicrohttpd (one thread per connection), the routes
// of the OpenAI API (serve/openai.h for the schema), the limits, and one generation worker.
//
// A server serves one model: a generative one (the routes below) or a reward model
// (server_start_reward: POST /get_reward, OpenRLHF's remote reward-model protocol, see
// serve/reward_api.h; with /health, /metrics and /v1/models; the generation routes answer
// 400, as /get_reward does on a generative server).
//
// Routes: GET /health ({"status", "requests_in_progress", "max_concurrent"}), GET /metrics
// (Prometheus text: requests in progress and queued, rows generating, requests answered and
// failed, prompt and completion tokens, prefills, decode steps and their seconds, the KV
// cache's slots; the embedding requests, inputs, tokens and seconds), GET /v1/models, GET
// /v1/models/<name>, POST /v1/chat/completions, POST /v1/completions, POST /v1/embeddings
// (serve/embeddings_api.h: the final hidden states pooled by options.pooling and
// L2-normalised, model/pooling.h; refused with --pooling none), POST /embeddings and
// /embedding (llama.cpp's route: a list of vectors per input, one per token with
// --pooling none). Anything else is 404; a known path with another method
// is 405.
//
// Limits, each answered with an OpenAI-style error: a body over max_body_bytes is 413 (from
// its Content-Length, before the body is read; a chunked body is counted and dropped); a
// valid request when max_concurrent requests (generation and embeddings) are already in
// progress or queued is 429; a request still queued or running after request_timeout_s is
// 503 (an embedding request is checked before each of its forwards).
//
// One model, one worker thread running a continuous batch (gen/continuous.h) of up to
// `parallel` rows, a row per choice (OpenAI's n; each row with its own parameters and
// seed): requests are queued in arrival order and join the batch between decode steps as
// rows free up (a request with more choices than that joins an empty batch, alone), and
// each is answered as soon as its choices end. A request's tokens depend only on its
// prompt, parameters and seed — with batch-mates, up to float rounding (a near tie could
// go the other way). With prompt_cache_rows > 0 (--prompt-cache) finished answers stay in
// a store, and a prompt that continues one (a chat's next turn) computes only its new
// tokens (gen/continuous.h; usage.prompt_tokens_details.cached_tokens counts the others);
// its answer then depends on earlier requests up to float rounding, so the store is off
// by default. With prefill_chunk > 0 (--prefill-chunk) a joining request's prompt is
// prefilled at most that many tokens per decode step, so a long prompt does not stop the
// running answers for its whole prefill (gen/continuous.h). An embedding request waits in a queue of its own and the same worker runs
// it, one forward of up to `parallel` of its inputs between two decode steps (fewer when
// padded to the longest they would pass the context; requests in arrival order, a
// request's inputs shortest first), so the two share the model without a
// lock and neither holds the other back for more than a forward. Streaming
// (stream: true) sends Server-Sent Events: the worker appends `data: {chunk}\n\n` as text
// is decoded and MHD's content reader hands it out, ending with `data: [DONE]\n\n`.
// Text that could be the start of a stop string is held back until it is known not to be,
// so the streamed pieces always add up to the non-streamed text. With tools (and
// tool_choice "auto") each choice's text also goes through a tool-call scanner
// (serve/tool_calls.h): calls become message.tool_calls, or whole delta.tool_calls chunks
// when streamed, and the rest is the content.
#pragma once
#include "gen/text_model.h"
#include "model/pooling.h"

typedef struct {
    const char *host;       // address to bind (name or numeric)
    int port;               // 0: any free port (server_port tells which)
    const char *model_name; // the name the API serves the model under
    long max_body_bytes;
    int max_tokens_limit;
    int default_max_tokens;
    int max_concurrent;
    int parallel;           // rows of the continuous batch, one per choice (1: one answer at a time)
    int prompt_cache_rows;  // finished answers kept for prompts that continue them (0: none)
    int prefill_chunk;      // prompt tokens prefilled per decode step (0: a prompt's whole prefill at once)
    int request_timeout_s;
    int threads;            // OpenMP threads of the worker (0: the default)
    Pooling pooling;        // how /v1/embeddings pools a text's final hidden states
    int reward_batch;       // a reward server: the most waiting /get_reward requests scored together (1: one at a time)
} ServerOptions;

typedef struct Server Server;

// Binds, starts the worker and the HTTP threads. The model must outlive the server.
// Returns 0, or -1 with err_set() (address in use, unknown host, ...).
int server_start(Server **out, TextModel *tm, const ServerOptions *options);
// A reward server: /get_reward scores with `reward_model` (value head) and `tokenizer`,
// options.parallel sequences per forward, on one worker thread: the requests that arrive
// while it scores wait (counted against max_concurrent) and are then scored together, up
// to options.reward_batch of them, their sequences sorted by length across requests. A
// request still waiting after request_timeout_s is 503; a round that started scores to its
// end, unless the server stops (503 before its next forward).
int server_start_reward(Server **out, Model *reward_model, const Tokenizer *tokenizer, const ServerOptions *options);
int server_port(const Server *server);
// Stops accepting connections, halts the running generation and fails the queued ones
// (their clients get 503, or a stream's error event), gives those answers up to 5 s to go
// out, closes every connection and frees the server.
void server_stop(Server *server);
