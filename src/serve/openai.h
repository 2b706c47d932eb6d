// The OpenAI API schema as `marlhf serve` speaks it: request bodies of /v1/chat/completions
// and /v1/completions parsed and checked, and the JSON of responses, stream chunks, model
// lists and errors. No HTTP and no model here: the server (serve/server.c) tokenizes and
// generates.
//
// Accepted parameters: model (must be the served name, or absent), messages (roles system,
// user, assistant; content a string or a list of {"type": "text", "text"} parts) or
// prompt (a string, a list of one string, or token ids), max_tokens (alias
// max_completion_tokens; 1..limit), temperature [0, 2] (0 = greedy), top_p (0, 1], top_k
// (extension; 0 or -1 = off), seed, stop (a string or up to 4), n (choices, 1..16), stream,
// stream_options.include_usage. Parameters that would change the output in ways marlhf
// does not implement (penalties, logit_bias, logprobs, echo, best_of > 1, tools) are
// refused when set to anything but their neutral value; other unknown keys are ignored.
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "chat/chat_template.h"

typedef enum { OPENAI_CHAT, OPENAI_COMPLETION } OpenAIKind;

#define OPENAI_MAX_STOP 4
#define OPENAI_MAX_CHOICES 16 // the most `n` a request may ask for

// An error as the API reports it: {"error": {"message", "type", "param", "code"}}.
typedef struct {
    int status;         // HTTP status
    const char *type;   // "invalid_request_error", "server_error", ...
    const char *param;  // the offending parameter, or NULL (null)
    const char *code;   // a machine-readable code, or NULL (null)
    char message[512];
} OpenAIError;

typedef struct {
    const char *model_name; // the served model's name
    int max_tokens_limit;   // upper bound on max_tokens
    int default_max_tokens; // when the request gives none
} OpenAILimits;

typedef struct {
    OpenAIKind kind;
    ChatMessage *messages; // chat: roles are static strings, contents owned
    int num_messages;
    char *prompt;          // completion: the text, or NULL when given as token ids
    int *prompt_ids;       // completion: token ids (range not checked here: no model)
    int num_prompt_ids;
    int n;                 // choices: answers generated for the prompt (1..OPENAI_MAX_CHOICES)
    int max_tokens;
    double temperature, top_p;
    int top_k;
    bool has_seed;
    uint64_t seed;
    char *stop[OPENAI_MAX_STOP]; // non-empty strings
    int num_stop;
    bool stream, include_usage;
} OpenAIRequest;

// Parses and checks a request body. Returns 0, or -1 with *err filled (400 for bad JSON,
// types and values; 404 model_not_found); *req is then empty (safe to free).
int openai_parse_request(OpenAIKind kind, const char *body, size_t size, const OpenAILimits *limits,
                         OpenAIRequest *req, OpenAIError *err);
void openai_request_free(OpenAIRequest *req);

// Fills *err (printf-style message); returns -1.
int openai_error_set(OpenAIError *err, int status, const char *type, const char *param, const char *code,
                     const char *fmt, ...) __attribute__((format(printf, 6, 7)));

// Every function below returns a malloc'd JSON text (free() it).
char *openai_error_json(const OpenAIError *err);
char *openai_model_json(const char *model_name, long created);  // one model object
char *openai_models_json(const char *model_name, long created); // the list of /v1/models

// What every response and chunk of one request repeats.
typedef struct {
    OpenAIKind kind;
    const char *id; // "chatcmpl-..." / "cmpl-..."
    long created;   // Unix seconds
    const char *model;
} OpenAIResponseHead;

// One answer of a response. text: len bytes of UTF-8.
typedef struct {
    const char *text;
    size_t len;
    const char *finish_reason;
} OpenAIChoice;

// The whole (non-streamed) response: choices[i] becomes the choice with "index" i.
// completion_tokens counts the tokens of every choice (the prompt's are counted once).
char *openai_completion_json(const OpenAIResponseHead *head, const OpenAIChoice *choices, int num_choices,
                             int prompt_tokens, int completion_tokens);
// One stream chunk of choice `index`: a piece of text (with the assistant role for the
// choice's first chat chunk), or with text NULL the choice's last chunk, carrying
// finish_reason.
char *openai_chunk_json(const OpenAIResponseHead *head, int index, bool with_role, const char *text, size_t len,
                        const char *finish_reason);
// The chunk stream_options.include_usage asks for: no choices, the usage (of all choices).
char *openai_usage_chunk_json(const OpenAIResponseHead *head, int prompt_tokens, int completion_tokens);
