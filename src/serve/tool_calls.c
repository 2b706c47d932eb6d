// Tool calls taken out of generated text (see tool_calls.h).
#include "serve/tool_calls.h"

#include <jansson.h>
#include <string.h>

#include "chat/python_json.h"
#include "core/check.h"

#define HERMES_OPEN "<tool_call>"
#define HERMES_CLOSE "</tool_call>"
#define PYTHON_TAG "<|python_tag|>"

void tool_scanner_init(ToolScanner *scanner, ChatToolSyntax syntax) {
    memset(scanner, 0, sizeof *scanner);
    scanner->syntax = syntax;
}

void tool_call_free(ToolCall *call) {
    free(call->name);
    free(call->arguments);
    memset(call, 0, sizeof *call);
}

void tool_scanner_free(ToolScanner *scanner) {
    for (int i = scanner->next_parsed; i < scanner->num_parsed; i++) tool_call_free(&scanner->parsed[i]);
    free(scanner->parsed);
    free(scanner->parsed_ends);
    free(scanner->held);
    free(scanner->out);
    memset(scanner, 0, sizeof *scanner);
}

static void append(char **buffer, size_t *length, size_t *capacity, const char *bytes, size_t count) {
    if (*length + count + 1 > *capacity) {
        *capacity = 2 * (*length + count + 1) + 64;
        *buffer = xrealloc(*buffer, *capacity);
    }
    memcpy(*buffer + *length, bytes, count);
    *length += count;
    (*buffer)[*length] = '\0';
}

static bool json_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
static bool text_space(char c) { return json_space(c) || c == '\f' || c == '\v'; }

// A call from a parsed JSON object: a string "name" and the value under the first of
// `keys` that it has (none: {} if `optional`). False if the object is not one.
static bool call_from_object(json_t *object, const char *const *keys, int num_keys, bool optional, ToolCall *call) {
    json_t *name = json_object_get(object, "name");
    if (!json_is_object(object) || !json_is_string(name)) return false;
    json_t *arguments = NULL;
    for (int i = 0; i < num_keys && !arguments; i++) arguments = json_object_get(object, keys[i]);
    if (!arguments && !optional) return false;
    call->name = xstrdup(json_string_value(name));
    if (arguments) {
        call->arguments = python_json_dumps(arguments, -1);
    } else {
        call->arguments = xstrdup("{}");
    }
    return true;
}

// The JSON of a <tool_call> block as a call.
static bool hermes_call(const char *body, size_t length, ToolCall *call) {
    json_t *object = json_loadb(body, length, 0, NULL); // whitespace around the value is allowed
    static const char *const keys[] = {"arguments"};
    bool ok = object && call_from_object(object, keys, 1, true, call);
    json_decref(object);
    return ok;
}

// How many bytes at the end of text[0, length) are a proper start of `tag` (held back:
// they may be the tag's beginning).
static size_t partial_tag(const char *text, size_t length, const char *tag) {
    size_t tag_length = strlen(tag);
    for (size_t k = tag_length - 1 < length ? tag_length - 1 : length; k > 0; k--)
        if (memcmp(text + length - k, tag, k) == 0) return k;
    return 0;
}

// A TEXT event for text[from, to): its whitespace at the end is held back (shown only once
// text follows it, or at the end when no call was made); what was held before goes first.
static void text_event(ToolScanner *s, const char *text, size_t from, size_t to, ToolEvent *event) {
    size_t body = to;
    while (body > from && text_space(text[body - 1])) body--;
    s->out_length = 0;
    append(&s->out, &s->out_length, &s->out_capacity, "", 0);
    if (body > from) {
        append(&s->out, &s->out_length, &s->out_capacity, s->held ? s->held : "", s->held_length);
        append(&s->out, &s->out_length, &s->out_capacity, text + from, body - from);
        s->held_length = 0;
    }
    append(&s->held, &s->held_length, &s->held_capacity, text + body, to - body);
    *event = (ToolEvent){.kind = TOOL_EVENT_TEXT, .end = to, .text = s->out, .length = s->out_length};
    s->position = to;
}

// The end of the answer: what is still held is content if no call was made.
static bool flush_event(ToolScanner *s, size_t length, ToolEvent *event) {
    if (s->flushed) return false;
    s->flushed = true;
    s->out_length = 0;
    append(&s->out, &s->out_length, &s->out_capacity, "", 0);
    if (s->calls == 0) append(&s->out, &s->out_length, &s->out_capacity, s->held ? s->held : "", s->held_length);
    s->held_length = 0;
    *event = (ToolEvent){.kind = TOOL_EVENT_TEXT, .end = length, .text = s->out, .length = s->out_length};
    return true;
}

static bool hermes_next(ToolScanner *s, const char *text, size_t length, bool final, ToolEvent *event) {
    size_t p = s->position;
    if (p >= length) return final && flush_event(s, length, event);
    const char *open = memmem(text + p, length - p, HERMES_OPEN, strlen(HERMES_OPEN));
    if (open == text + p) {
        const char *body = open + strlen(HERMES_OPEN);
        const char *close = memmem(body, (size_t)(text + length - body), HERMES_CLOSE, strlen(HERMES_CLOSE));
        if (!close && !final) return false; // the block is not complete yet
        const char *body_end = close ? close : text + length;
        size_t end = close ? (size_t)(close - text) + strlen(HERMES_CLOSE) : length;
        ToolCall call = {0};
        if (hermes_call(body, (size_t)(body_end - body), &call)) {
            *event = (ToolEvent){.kind = TOOL_EVENT_CALL, .end = end, .call = call};
            s->position = end;
            s->calls++;
            return true;
        }
        text_event(s, text, p, end, event); // not a call: its text is content
        return true;
    }
    size_t stop = open ? (size_t)(open - text) : length;
    if (!open && !final) stop -= partial_tag(text + p, length - p, HERMES_OPEN);
    if (stop == p) return final && flush_event(s, length, event);
    text_event(s, text, p, stop, event);
    return true;
}

// Llama 3 JSON: the objects of the whole answer, or false (then it is all content).
static bool llama_parse(ToolScanner *s, const char *text, size_t length) {
    size_t p = strncmp(text, PYTHON_TAG, strlen(PYTHON_TAG)) == 0 ? strlen(PYTHON_TAG) : 0;
    static const char *const keys[] = {"parameters", "arguments"};
    int capacity = 0;
    while (p < length) {
        json_error_t error;
        json_t *object = json_loadb(text + p, length - p, JSON_DISABLE_EOF_CHECK, &error);
        ToolCall call = {0};
        bool ok = object && call_from_object(object, keys, 2, false, &call);
        json_decref(object);
        if (!ok) return false;
        p += (size_t)error.position;
        if (s->num_parsed == capacity) {
            capacity = capacity ? 2 * capacity : 4;
            s->parsed = xrealloc(s->parsed, (size_t)capacity * sizeof *s->parsed);
            s->parsed_ends = xrealloc(s->parsed_ends, (size_t)capacity * sizeof *s->parsed_ends);
        }
        s->parsed[s->num_parsed] = call;
        s->parsed_ends[s->num_parsed++] = p;
        // Objects are separated by ";" (vLLM skips "; "), whitespace around it allowed.
        while (p < length && json_space(text[p])) p++;
        if (p < length) {
            if (text[p] != ';') return false;
            p++;
            while (p < length && json_space(text[p])) p++;
        }
    }
    if (s->num_parsed > 0) s->parsed_ends[s->num_parsed - 1] = length;
    return s->num_parsed > 0;
}

static bool llama_next(ToolScanner *s, const char *text, size_t length, bool final, ToolEvent *event) {
    if (s->llama_state == 0) {
        // An answer that starts with "{" or the python tag is a call candidate.
        bool tag_prefix = length < strlen(PYTHON_TAG) && strncmp(text, PYTHON_TAG, length) == 0;
        if (length == 0 || (tag_prefix && !final)) {
            if (!final) return false;
        } else {
            s->llama_state = text[0] == '{' || strncmp(text, PYTHON_TAG, strlen(PYTHON_TAG)) == 0 ? 2 : 1;
        }
    }
    if (s->llama_state == 2) {
        if (!final) return false;
        if (s->num_parsed == 0 && !s->flushed) {
            if (!llama_parse(s, text, length)) {
                for (int i = 0; i < s->num_parsed; i++) tool_call_free(&s->parsed[i]);
                s->num_parsed = 0;
                s->llama_state = 1; // all content
            }
        }
        if (s->llama_state == 2) {
            if (s->next_parsed == s->num_parsed) return false;
            int i = s->next_parsed++;
            *event = (ToolEvent){.kind = TOOL_EVENT_CALL, .end = s->parsed_ends[i], .call = s->parsed[i]};
            s->position = s->parsed_ends[i];
            s->calls++;
            return true;
        }
    }
    // Plain text: shown as it comes, nothing held.
    size_t p = s->position;
    if (p >= length) return false;
    s->out_length = 0;
    append(&s->out, &s->out_length, &s->out_capacity, text + p, length - p);
    *event = (ToolEvent){.kind = TOOL_EVENT_TEXT, .end = length, .text = s->out, .length = s->out_length};
    s->position = length;
    return true;
}

bool tool_scanner_next(ToolScanner *scanner, const char *text, size_t length, bool final, ToolEvent *event) {
    switch (scanner->syntax) {
    case CHAT_TOOLS_HERMES: return hermes_next(scanner, text, length, final, event);
    case CHAT_TOOLS_LLAMA3_JSON: return llama_next(scanner, text, length, final, event);
    case CHAT_TOOLS_NONE: break;
    }
    if (scanner->position >= length) return false;
    *event = (ToolEvent){.kind = TOOL_EVENT_TEXT, .end = length, .text = text + scanner->position,
                         .length = length - scanner->position};
    scanner->position = length;
    return true;
}

void tool_calls_extract(ChatToolSyntax syntax, const char *text, size_t length, char **content, ToolCall **calls,
                        int *num_calls) {
    ToolScanner scanner;
    tool_scanner_init(&scanner, syntax);
    char *out = NULL;
    size_t out_length = 0, out_capacity = 0;
    append(&out, &out_length, &out_capacity, "", 0);
    *calls = NULL;
    *num_calls = 0;
    int capacity = 0;
    ToolEvent event;
    while (tool_scanner_next(&scanner, text, length, true, &event)) {
        if (event.kind == TOOL_EVENT_TEXT) {
            append(&out, &out_length, &out_capacity, event.text, event.length);
            continue;
        }
        if (*num_calls == capacity) {
            capacity = capacity ? 2 * capacity : 4;
            *calls = xrealloc(*calls, (size_t)capacity * sizeof **calls);
        }
        (*calls)[(*num_calls)++] = event.call;
    }
    tool_scanner_free(&scanner);
    if (*num_calls > 0 && out_length == 0) {
        free(out);
        out = NULL;
    }
    *content = out;
}
