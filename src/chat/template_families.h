// Internal to src/chat/: the per-family renderers behind chat_template_render(), and the
// small text helpers they share. Not for use outside src/chat/.
#pragma once
#include <stdbool.h>
#include <stddef.h>

#include <jansson.h>

#include "chat/chat_template.h"

// A growing NUL-terminated byte string.
typedef struct {
    char *data;
    size_t length;
    size_t capacity;
} TextBuffer;

void text_append_bytes(TextBuffer *text, const char *bytes, size_t count);
void text_append(TextBuffer *text, const char *s);
// `s` with what Python's str.strip() removes taken off both ends (Jinja's "trim").
void text_append_stripped(TextBuffer *text, const char *s);

// [*start, *end) of `s` without the leading and trailing characters for which Python's
// str.isspace() is true (UTF-8 decoded; a byte that is not valid UTF-8 is not a space).
void python_strip_bounds(const char *s, size_t length, size_t *start, size_t *end);

// Each appends the rendering of messages[0..count) to `text`, or returns -1 with
// err_set() (the caller frees `text`). Roles and contents are already checked.
// `tools`: the parsed tools array, or NULL (no tools; only the families with a tool syntax
// get one, and their messages may have tool calls and the role "tool").
int render_chatml(const ChatTemplate *t, const ChatMessage *m, int count, const json_t *tools, bool generation,
                  TextBuffer *text);
int render_qwen3(const ChatTemplate *t, const ChatMessage *m, int count, const json_t *tools, bool generation,
                 TextBuffer *text);
int render_llama2(const ChatTemplate *t, const ChatMessage *m, int count, bool generation, TextBuffer *text);
int render_llama3(const ChatTemplate *t, const ChatMessage *m, int count, const json_t *tools, bool generation,
                  TextBuffer *text);
int render_gemma(const ChatTemplate *t, const ChatMessage *m, int count, bool generation, TextBuffer *text);
int render_zephyr(const ChatTemplate *t, const ChatMessage *m, int count, bool generation, TextBuffer *text);
int render_plain_turns(const ChatTemplate *t, const ChatMessage *m, int count, bool generation, TextBuffer *text);

// The template's own error texts, so a caller sees what transformers would have raised.
#define CHAT_ERROR_ALTERNATE "Conversation roles must alternate user/assistant/user/assistant/..."
#define CHAT_ERROR_NO_SYSTEM "System role not supported"
// err_set() of `message` with the template's name and file.
int chat_template_error(const ChatTemplate *t, const char *message);
