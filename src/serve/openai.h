// The OpenAI API schema as `marlhf serve` speaks it: request bodies of /v1/chat/completions
// and /v1/completions parsed and checked, and the JSON of responses, stream chunks, model
// lists and errors. No HTTP and no model here: the server (serve/server.c) tokenizes and
// generates.
//
// Accepted parameters: model (must be the served name, or absent), messages (roles system,
// user, assistant; content a string or a list of {"type": "text", "text"} parts) or
// prompt (a string, a list of one string, or token ids), max_tokens (alias
// max_completion_tokens; 1..limit), temperature [0, 2] (0 = greedy), top_p (0, 1], top_k
// (extension; 0 or -1 = off), presence_penalty and frequency_penalty [-2, 2], logit_bias (an
// object of up to 1,024 token ids, as decimal strings, to biases in [-100, 100]), min_p [0, 1] and
// repetition_penalty (0, 100] (vLLM's extensions; gen/sampler.h), seed, stop (a string or up to 4), n (choices, 1..16), stream,
// stream_options.include_usage, and log-probs: chat's logprobs (a boolean) with
// top_logprobs (0..20; more than 0 only with logprobs true), completions' logprobs (0..5:
// the alternatives per token; null, false or absent = none; their top_logprobs only 0).
// Parameters that would change the output in ways marlhf does not implement (echo,
// best_of > 1, the deprecated functions / function_call) are refused when
// set to anything but their neutral value; other unknown keys are ignored.
//
// Tool calling (chat): tools ([{"type": "function", "function": {"name", "description",
// "parameters"}}]; name a non-empty string, description a string, parameters an object,
// strict a boolean; other keys pass to the template as sent; an empty list goes to a
// tool-calling template as one, as vLLM passes it, and is neutral for any other),
// tool_choice ("auto", the default; "none": the tools are still rendered into the prompt,
// as vLLM does, and the answer is not parsed for calls; "required": the answer is
// constrained to calls of the tools; {"type": "function", "function": {"name"}}: to one
// call of that tool, which must be in tools), parallel_tool_calls (a boolean; false: the answer
// has one call at most).
//
// Structured outputs (both routes): response_format {"type": "text"} (the default),
// {"type": "json_object"} (the answer is a JSON object) or {"type": "json_schema",
// "json_schema": {"name", "schema", "strict", "description"}} (a value matching the schema:
// gen/json_constraint.h has the subset; an unsupported keyword is a 400 naming it);
// vLLM's structured_outputs {"regex": PATTERN} (gen/regex_constraint.h: the whole answer
// matches), {"choice": [strings]} (the answer is one of them), {"json": SCHEMA (an object
// or a JSON string)}, {"json_object": true} or {"grammar": GBNF} (gen/grammar_constraint.h),
// one of them, not beside response_format, and the fields vLLM had before 0.12
// (guided_regex, guided_choice, guided_json, guided_grammar) or llama.cpp's `grammar` (a
// GBNF text; "" is none), not beside structured_outputs; llama.cpp's grammar_lazy true
// with grammar_triggers [{"type": 1, "value": WORD}] makes `grammar` lazy (free text until
// a word: gen/lazy_constraint.h); structural_tag and the other fields are a 400. Messages: role "tool" (content,
// tool_call_id a string if given), assistant tool_calls ([{"id", "type": "function",
// "function": {"name", "arguments": a string holding JSON, or an object}}]; content may be
// null then). Whether the template renders them is the server's question (a 400 if not).
//
// A response with calls (the server parses them, serve/tool_calls.h): the choice's message
// has "tool_calls": [{"id": "call_...", "type": "function", "function": {"name",
// "arguments": a JSON string}}] and its content is null when no text is left,
// finish_reason "tool_calls". Streamed, each call is one chunk whose delta is {"tool_calls":
// [{"index": k, "id", "type": "function", "function": {"name", "arguments"}}]} (k counts
// the choice's calls from 0), sent when its block is complete.
//
// Log-probs are those of the model's own distribution: log softmax of the raw logits,
// before temperature, top-k and top-p (as vLLM reports them by default), so a sampled token
// may have a low one, and they do not depend on the sampling parameters. The alternatives
// are the most likely tokens of that distribution, most likely first, ties broken by the
// lower token id. A token is shown as its text decoded alone by the tokenizer (as vLLM
// does): always valid UTF-8, so a token that ends inside a multi-byte character shows the
// part it holds as U+FFFD (HF's decode does the same), and "bytes" are the UTF-8 bytes of
// that text, not the token's raw bytes. A non-finite log-prob is reported as -9999.0.
//
// Which tokens have log-probs: the generated tokens of the answer, in order, one entry each.
// The model's stop token that ends it (EOS, <|im_end|>) is not answer text and has none,
// though usage counts it. When a stop string cuts the answer, the tokens whose text starts
// before the cut have entries (the one the cut splits included), those after it none. So
// for plain text the entries' tokens concatenate to the answer.
// Shapes:
//   chat: choice.logprobs = {"content": [{"token", "logprob", "bytes": [ints],
//         "top_logprobs": [{"token", "logprob", "bytes"}, ... top_logprobs of them]}, ...]}
//   completions (OpenAI's legacy shape): choice.logprobs = {"tokens": [str],
//         "token_logprobs": [float], "top_logprobs": [one per token: with logprobs k > 0 a
//         {token text: log-prob} object of the k most likely tokens, plus the chosen one when
//         it is not among them (OpenAI: up to k + 1; tokens whose texts are equal share the
//         more likely one's key); with logprobs 0 null], "text_offset": [ints]}, where
//         text_offset is where each token starts in the choice's text (not counting the
//         prompt), in characters (code points), as vLLM counts it: 0 for the first token,
//         then the previous offset plus the previous token's length (so it indexes the
//         text wherever the tokens' texts concatenate to it).
// Streamed, a choice's chunk carries the entries of the tokens whose text ends within the
// text sent so far, that no earlier chunk carried: a token goes with the chunk that carries
// the end of its text (text held back, because it may grow into a stop string or ends
// inside a character, takes its tokens' entries along when it goes; a token that adds no
// text of its own goes with the next chunk). Once a stop string cuts the answer, and at its
// end, the entries left go out (the token the cut splits included), in a chunk without
// text if no text is left to send. So a chunk may carry text with an empty list, or entries
// without text; the first chat chunk (the role) and the finish chunk carry "logprobs":
// null. The entries of a choice's chunks, in order, are those of the non-streamed choice,
// text_offset continuing from chunk to chunk. Without log-probs asked, every choice and
// chunk has "logprobs": null.
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "chat/chat_template.h"
#include "gen/constraint.h"
#include "gen/sampler.h"

typedef enum { OPENAI_CHAT, OPENAI_COMPLETION } OpenAIKind;

#define OPENAI_MAX_STOP 4
#define OPENAI_MAX_CHOICES 16 // the most `n` a request may ask for
#define OPENAI_MAX_TOP_LOGPROBS 20   // chat's top_logprobs
#define OPENAI_MAX_LEGACY_LOGPROBS 5 // completions' logprobs (OpenAI's limit)

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
    double presence_penalty, frequency_penalty; // [-2, 2]; 0 = off
    double min_p;                               // [0, 1] (vLLM's extension); 0 = off
    double repetition_penalty;                  // (0, 100] (vLLM's extension); 1 = off
    SamplerLogitBias *logit_bias;               // OpenAI's: token id (checked by the server) -> [-100, 100]
    int logit_bias_count;
    bool has_seed;
    uint64_t seed;
    char *stop[OPENAI_MAX_STOP]; // non-empty strings
    int num_stop;
    bool stream, include_usage;
    bool logprobs;    // log-probs asked: chat's logprobs true, completions' logprobs not null
    int top_logprobs; // alternatives per token: chat's top_logprobs, completions' logprobs
    char *tools_json;         // chat: the tools as a JSON array's text (NULL: none given)
    char *template_kwargs_json; // chat: vLLM's chat_template_kwargs (the variables marlhf's
                                // templates read: chat_template_apply_kwargs) as JSON text, or NULL
    int num_tools;            // its length (0: an empty list, or none)
    bool tool_choice_none;    // tool_choice "none": tools rendered, the answer not parsed for calls
    bool tool_choice_required; // tool_choice "required": the answer is calls of the tools (constrained)
    char *tool_choice_name;   // a named tool_choice: the answer is calls of that tool (constrained)
    bool parallel_tool_calls; // as given (default true); false: one call at most
    // response_format json_object / json_schema, structured_outputs (or guided_*): the
    // answer's constraint (NULL: text).
    Constraint *constraint;
} OpenAIRequest;

// Parses and checks a request body. Returns 0, or -1 with *err filled (400 for bad JSON,
// types and values; 404 model_not_found); *req is then empty (safe to free).
int openai_parse_request(OpenAIKind kind, const char *body, size_t size, const OpenAILimits *limits,
                         OpenAIRequest *req, OpenAIError *err);
void openai_request_free(OpenAIRequest *req);

// A request body as a JSON value (duplicate keys refused), or NULL with *err filled: a 400
// invalid_json naming the line and column. Shared by every OpenAI-style route's parser.
json_t *openai_parse_json_body(const char *body, size_t size, OpenAIError *err);

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
    int cached_tokens; // usage.prompt_tokens_details.cached_tokens: the prompt's tokens from the prompt cache
} OpenAIResponseHead;

// A token as log-probs show it: its text (len bytes of UTF-8; see above) and log-prob.
typedef struct {
    const char *text;
    size_t len;
    float logprob;
} OpenAIToken;

// One generated token's log-probs: the token, its alternatives, and (completions) where it
// starts in its choice's text, in characters.
typedef struct {
    OpenAIToken token;
    const OpenAIToken *top; // the most likely tokens, most likely first
    int num_top;
    long text_offset;
} OpenAILogprobEntry;

// The log-probs of a choice, or of the tokens of one stream chunk.
typedef struct {
    const OpenAILogprobEntry *entries;
    int count;
} OpenAILogprobs;

// A tool call of an answer: "arguments" is JSON text.
typedef struct {
    const char *id;
    const char *name;
    const char *arguments;
} OpenAIToolCall;

// One answer of a response. text: len bytes of UTF-8 (NULL: chat's "content": null).
typedef struct {
    const char *text;
    size_t len;
    const char *finish_reason;
    const OpenAILogprobs *logprobs; // NULL: none asked ("logprobs": null)
    const OpenAIToolCall *tool_calls; // chat: the calls parsed out of the answer
    int num_tool_calls;
} OpenAIChoice;

// The whole (non-streamed) response: choices[i] becomes the choice with "index" i.
// completion_tokens counts the tokens of every choice (the prompt's are counted once).
char *openai_completion_json(const OpenAIResponseHead *head, const OpenAIChoice *choices, int num_choices,
                             int prompt_tokens, int completion_tokens);
// One stream chunk of choice `index`: a piece of text (with the assistant role for the
// choice's first chat chunk) and the log-probs of its tokens (NULL: "logprobs": null), or
// with text NULL the choice's last chunk, carrying finish_reason.
char *openai_chunk_json(const OpenAIResponseHead *head, int index, bool with_role, const char *text, size_t len,
                        const OpenAILogprobs *logprobs, const char *finish_reason);
// A stream chunk of choice `index` carrying its call number `call_index` whole, with the
// log-probs of the tokens that wrote it (NULL: "logprobs": null).
char *openai_tool_call_chunk_json(const OpenAIResponseHead *head, int index, int call_index,
                                  const OpenAIToolCall *call, const OpenAILogprobs *logprobs);
// The chunk stream_options.include_usage asks for: no choices, the usage (of all choices).
char *openai_usage_chunk_json(const OpenAIResponseHead *head, int prompt_tokens, int completion_tokens);
