// Tool calls in generated text: what vLLM's `hermes` and `llama3_json` tool parsers take
// out of a model's answer, for /v1/chat/completions with `tools` (docs/serving.md).
//
// Hermes (CHAT_TOOLS_HERMES: Qwen2.5, Qwen3): each <tool_call>JSON</tool_call> block whose
// JSON (whitespace around it ignored) is an object with a string "name" is a call; its
// "arguments" (any JSON value; absent: {}) become the call's arguments string. A block
// whose JSON does not parse, or is not such an object, stays in the content as text. An
// opening tag never closed is a call if the rest of the answer is such a JSON (the model
// stopped before the closing tag, as vLLM's parser allows), else text.
// Llama 3 JSON (CHAT_TOOLS_LLAMA3_JSON: Llama 3.1): an answer that starts with "{" (or
// "<|python_tag|>") is one or more JSON objects separated by ";", each with a string "name"
// and "parameters" (or "arguments"); all parse, and the answer is those calls with no
// content, or one does not, and the whole answer is content (vLLM's rule).
//
// A call's arguments string is the value as Python's json.dumps(value, ensure_ascii=False)
// writes it (vLLM's arguments string; chat/python_json.h).
//
// Content: the text outside the calls. Whitespace that only separates calls or follows the
// last one is dropped (with calls found, the content never ends in whitespace: "Sure.\n
// <tool_call>...</tool_call>\n" has the content "Sure."); with no call it is all kept, so
// an answer without calls is its text unchanged.
//
// The scanner reads the answer as it grows and hands out events in order, each covering
// the text up to its `end`: text to show (possibly empty: consumed, nothing to show yet)
// or a call. It holds back what could still become a call: from an opening tag (or the
// start of one) to its closing tag, whitespace that a call may follow, and in Llama 3
// JSON an answer that starts with "{" until its end. Streaming and the whole answer go
// through the same scanner, so the streamed pieces add up to the non-streamed content.
#pragma once
#include <stdbool.h>
#include <stddef.h>

#include "chat/chat_template.h"

typedef struct {
    char *name;
    char *arguments; // JSON text
} ToolCall;

typedef enum { TOOL_EVENT_TEXT, TOOL_EVENT_CALL } ToolEventKind;

typedef struct {
    ToolEventKind kind;
    size_t end;       // the answer's text up to here is accounted for
    const char *text; // TEXT: length bytes to show (the scanner's, valid until its next call)
    size_t length;
    ToolCall call;    // CALL: the caller's (tool_call_free)
} ToolEvent;

typedef struct {
    ChatToolSyntax syntax;
    size_t position;       // the text before it is accounted for
    int calls;             // calls handed out
    char *held;            // whitespace held back (content only if text follows, or no call ever does)
    size_t held_length, held_capacity;
    char *out;             // the last TEXT event's text
    size_t out_length, out_capacity;
    bool flushed;          // the end was handed out
    // Llama 3 JSON: 0 undecided, 1 plain text, 2 calls (parsed at the end into `parsed`).
    int llama_state;
    ToolCall *parsed;
    size_t *parsed_ends;
    int num_parsed, next_parsed;
} ToolScanner;

// A scanner for `syntax` (CHAT_TOOLS_NONE: every event is text, nothing held).
void tool_scanner_init(ToolScanner *scanner, ChatToolSyntax syntax);
void tool_scanner_free(ToolScanner *scanner);

// The next event of the answer text[0, length) (text already seen must not change; the
// answer may only grow between calls). `final`: the answer is complete, nothing is held.
// Returns false when nothing more can be handed out now (with `final`: the answer is done).
bool tool_scanner_next(ToolScanner *scanner, const char *text, size_t length, bool final, ToolEvent *event);

// The whole answer at once: its content (malloc'd; *content NULL when calls were found and
// no content is left) and its calls (malloc'd array of *num_calls; free each with
// tool_call_free).
void tool_calls_extract(ChatToolSyntax syntax, const char *text, size_t length, char **content, ToolCall **calls,
                        int *num_calls);

void tool_call_free(ToolCall *call);
