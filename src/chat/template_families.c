// The per-family renderers. Each follows its published Jinja template statement by
// statement (the comments quote the part they mirror), including where the template
// trims, skips or raises, so that the output is byte-for-byte what transformers renders
// (checked by tests/test_chat_template.c against tools/make_chat_template_fixtures.py).
#include "chat/template_families.h"

#include <stdint.h>
#include <string.h>

#include "chat/python_json.h"
#include "core/check.h"

// --- text helpers --------------------------------------------------------------------

void text_append_bytes(TextBuffer *text, const char *bytes, size_t count) {
    if (text->length + count + 1 > text->capacity) {
        size_t capacity = text->capacity ? text->capacity : 256;
        while (capacity < text->length + count + 1) capacity *= 2;
        text->data = xrealloc(text->data, capacity);
        text->capacity = capacity;
    }
    memcpy(text->data + text->length, bytes, count);
    text->length += count;
    text->data[text->length] = '\0';
}

void text_append(TextBuffer *text, const char *s) { text_append_bytes(text, s, strlen(s)); }

// Python's str.isspace(): the characters str.strip() removes when given no argument.
static bool python_isspace(uint32_t cp) {
    if (cp == ' ' || (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x1F)) return true;
    if (cp < 0x85) return false;
    return cp == 0x85 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 ||
           cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

// Length of the well-formed UTF-8 sequence at s (at most `available` bytes) and its code
// point, or 0 if the bytes there are not one (then they are not whitespace either).
static size_t utf8_decode(const unsigned char *s, size_t available, uint32_t *cp) {
    unsigned lead = s[0];
    if (lead < 0x80) {
        *cp = lead;
        return 1;
    }
    size_t length;
    uint32_t value, smallest;
    if ((lead & 0xE0) == 0xC0) length = 2, value = lead & 0x1F, smallest = 0x80;
    else if ((lead & 0xF0) == 0xE0) length = 3, value = lead & 0x0F, smallest = 0x800;
    else if ((lead & 0xF8) == 0xF0) length = 4, value = lead & 0x07, smallest = 0x10000;
    else return 0;
    if (length > available) return 0;
    for (size_t k = 1; k < length; k++) {
        if ((s[k] & 0xC0) != 0x80) return 0;
        value = value << 6 | (s[k] & 0x3F);
    }
    if (value < smallest || value > 0x10FFFF || (value >= 0xD800 && value <= 0xDFFF)) return 0;
    *cp = value;
    return length;
}

void python_strip_bounds(const char *s, size_t length, size_t *start, size_t *end) {
    const unsigned char *u = (const unsigned char *)s;
    size_t begin = 0, finish = length;
    uint32_t cp;
    while (begin < finish) {
        size_t n = utf8_decode(u + begin, finish - begin, &cp);
        if (n == 0 || !python_isspace(cp)) break;
        begin += n;
    }
    while (finish > begin) {
        // The last character starts at most 3 continuation bytes before the end.
        size_t lead = finish - 1;
        while (lead > begin && finish - lead < 4 && (u[lead] & 0xC0) == 0x80) lead--;
        size_t n = utf8_decode(u + lead, finish - lead, &cp);
        if (n != finish - lead || !python_isspace(cp)) break;
        finish = lead;
    }
    *start = begin;
    *end = finish;
}

void text_append_stripped(TextBuffer *text, const char *s) {
    size_t start, end;
    python_strip_bounds(s, strlen(s), &start, &end);
    text_append_bytes(text, s + start, end - start);
}

static bool is_role(const ChatMessage *message, const char *role) { return strcmp(message->role, role) == 0; }

int chat_template_error(const ChatTemplate *t, const char *message) {
    if (t->source_path)
        return err_set("%s (chat template %s from %s)", message, t->name, t->source_path);
    return err_set("%s (chat template %s)", message, t->name);
}

// The test every alternating template makes of the message at loop index `index`:
//   {% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception(...) }}
static bool breaks_alternation(const ChatMessage *message, int index) {
    return is_role(message, "user") != (index % 2 == 0);
}

// --- Hermes-style tools: Qwen2.5 and Qwen3 ----------------------------------------------

// The text both Qwen templates put around the tools in the system turn.
#define HERMES_TOOLS_INTRO                                                                          \
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are "      \
    "provided with function signatures within <tools></tools> XML tags:\n<tools>"
#define HERMES_TOOLS_OUTRO                                                                          \
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments " \
    "within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, "            \
    "\"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n"

// {%- for tool in tools %}{{- "\n" }}{{- tool | tojson }}{%- endfor %} and the text after.
static void hermes_tools(const json_t *tools, TextBuffer *text) {
    for (size_t i = 0; i < json_array_size(tools); i++) {
        text_append(text, "\n");
        python_json_append(text, json_array_get(tools, i), -1);
    }
    text_append(text, HERMES_TOOLS_OUTRO);
}

// A call's arguments as the template's `tool_call.arguments | tojson` writes them (already
// checked to parse by chat_template_render_tools).
static void append_arguments(TextBuffer *text, const ChatToolCall *call, int indent) {
    json_t *arguments = json_loads(call->arguments, JSON_DECODE_ANY, NULL);
    CHECK(arguments, "tool call arguments that do not parse: %s", call->arguments);
    python_json_append(text, arguments, indent);
    json_decref(arguments);
}

// '<tool_call>\n{"name": "' + name + '", "arguments": ' + arguments | tojson + '}\n</tool_call>'
static void hermes_call(const ChatToolCall *call, TextBuffer *text) {
    text_append(text, "<tool_call>\n{\"name\": \"");
    text_append(text, call->name);
    text_append(text, "\", \"arguments\": ");
    append_arguments(text, call, -1);
    text_append(text, "}\n</tool_call>");
}

// A message of role "tool": consecutive ones share one user turn.
//   {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}'<|im_start|>user'
//   '\n<tool_response>\n' + content + '\n</tool_response>'
//   {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}'<|im_end|>\n'
static void hermes_tool_response(const ChatMessage *m, int count, int i, TextBuffer *text) {
    if (i == 0 || !is_role(&m[i - 1], "tool")) text_append(text, "<|im_start|>user");
    text_append(text, "\n<tool_response>\n");
    text_append(text, m[i].content);
    text_append(text, "\n</tool_response>");
    if (i == count - 1 || !is_role(&m[i + 1], "tool")) text_append(text, "<|im_end|>\n");
}

// --- ChatML: SmolLM2, Qwen2, Qwen2.5, OpenHermes ---------------------------------------

int render_chatml(const ChatTemplate *t, const ChatMessage *m, int count, const json_t *tools, bool generation,
                  TextBuffer *text) {
    // {%- if tools %}: an empty list is false.
    if (tools && json_array_size(tools) == 0) tools = NULL;
    int first = 0;
    if (tools) {
        // Qwen2.5: '<|im_start|>system\n' + (messages[0]['content'] if it is a system message,
        // else the default) + "\n\n" + the tools; the loop skips that first system message.
        text_append(text, "<|im_start|>system\n");
        if (is_role(&m[0], "system")) {
            text_append(text, m[0].content);
            first = 1;
        } else if (t->default_system) {
            text_append(text, t->default_system);
        }
        text_append(text, "\n\n" HERMES_TOOLS_INTRO);
        hermes_tools(tools, text);
    }
    for (int i = first; i < count; i++) {
        // {% if loop.first and messages[0]['role'] != 'system' %}<default system turn>
        // (Qwen2.5 writes the same turn before its loop and skips a first system message in it.)
        if (i == 0 && !tools && t->default_system && !is_role(&m[0], "system")) {
            text_append(text, "<|im_start|>system\n");
            text_append(text, t->default_system);
            text_append(text, "<|im_end|>\n");
        }
        if (is_role(&m[i], "tool")) {
            hermes_tool_response(m, count, i, text);
        } else if (is_role(&m[i], "assistant") && m[i].num_tool_calls > 0) {
            // Qwen2.5: '<|im_start|>' + role, '\n' + content if content, then per call
            // '\n<tool_call>...</tool_call>', then '<|im_end|>\n'.
            text_append(text, "<|im_start|>assistant");
            if (m[i].content[0]) {
                text_append(text, "\n");
                text_append(text, m[i].content);
            }
            for (int j = 0; j < m[i].num_tool_calls; j++) {
                text_append(text, "\n");
                hermes_call(&m[i].tool_calls[j], text);
            }
            text_append(text, "<|im_end|>\n");
        } else {
            // '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'
            text_append(text, "<|im_start|>");
            text_append(text, m[i].role);
            text_append(text, "\n");
            text_append(text, m[i].content);
            text_append(text, "<|im_end|>\n");
        }
    }
    if (generation) text_append(text, "<|im_start|>assistant\n");
    return 0;
}

// --- Qwen3: ChatML with reasoning -------------------------------------------------------

// A run of bytes inside a message.
typedef struct {
    const char *start;
    const char *end;
} TextSpan;

static void text_append_span(TextBuffer *text, TextSpan span) {
    text_append_bytes(text, span.start, (size_t)(span.end - span.start));
}

// Where the last `needle` in `span` starts, or NULL. (Neither "<think>" nor "</think>" can
// overlap itself, so the last match is where Python's split() makes its last cut.)
static const char *last_occurrence(TextSpan span, const char *needle) {
    size_t length = strlen(needle);
    if ((size_t)(span.end - span.start) < length) return NULL;
    for (const char *at = span.end - length;; at--) {
        if (memcmp(at, needle, length) == 0) return at;
        if (at == span.start) return NULL;
    }
}

// Python's str.lstrip('\n') / rstrip('\n'): newlines only, not other whitespace.
static TextSpan lstrip_newlines(TextSpan span) {
    while (span.start < span.end && *span.start == '\n') span.start++;
    return span;
}

static TextSpan rstrip_newlines(TextSpan span) {
    while (span.end > span.start && span.end[-1] == '\n') span.end--;
    return span;
}

static bool starts_with(const char *s, const char *prefix) { return strncmp(s, prefix, strlen(prefix)) == 0; }

static bool ends_with(const char *s, const char *suffix) {
    size_t length = strlen(s), suffix_length = strlen(suffix);
    return length >= suffix_length && memcmp(s + length - suffix_length, suffix, suffix_length) == 0;
}

// An assistant message's reasoning and answer, as the template takes them apart when the
// content has a '</think>':
//   content           = content.split('</think>')[-1].lstrip('\n')
//   reasoning_content = content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n')
// and otherwise content whole, reasoning_content ''.
static void qwen3_split_reasoning(const char *message, TextSpan *content, TextSpan *reasoning) {
    TextSpan whole = {message, message + strlen(message)};
    const char *first_close = strstr(message, "</think>");
    if (!first_close) {
        *content = whole;
        *reasoning = (TextSpan){message, message};
        return;
    }
    const char *last_close = last_occurrence(whole, "</think>");
    *content = lstrip_newlines((TextSpan){last_close + strlen("</think>"), whole.end});
    TextSpan before = rstrip_newlines((TextSpan){message, first_close});
    const char *open = last_occurrence(before, "<think>");
    if (open) before.start = open + strlen("<think>");
    *reasoning = lstrip_newlines(before);
}

int render_qwen3(const ChatTemplate *t, const ChatMessage *m, int count, const json_t *tools, bool generation,
                 TextBuffer *text) {
    // {%- if messages[0].role == 'system' %}'<|im_start|>system\n' + content + '<|im_end|>\n'
    // (the loop below skips that first system message). With tools: '<|im_start|>system\n',
    // the system message's content + '\n\n' if there is one, then the tools ({%- if tools %}:
    // an empty list is false).
    if (tools && json_array_size(tools) == 0) tools = NULL;
    if (tools) {
        text_append(text, "<|im_start|>system\n");
        if (is_role(&m[0], "system")) {
            text_append(text, m[0].content);
            text_append(text, "\n\n");
        }
        text_append(text, HERMES_TOOLS_INTRO);
        hermes_tools(tools, text);
    } else if (is_role(&m[0], "system")) {
        text_append(text, "<|im_start|>system\n");
        text_append(text, m[0].content);
        text_append(text, "<|im_end|>\n");
    }
    // ns.last_query_index: the last user message that is not a tool's answer
    // (startswith('<tool_response>') and endswith('</tool_response>')); the last index if none.
    int last_query = count - 1;
    for (int i = count - 1; i >= 0; i--) {
        if (is_role(&m[i], "user") &&
            !(starts_with(m[i].content, "<tool_response>") && ends_with(m[i].content, "</tool_response>"))) {
            last_query = i;
            break;
        }
    }
    for (int i = 0; i < count; i++) {
        if (is_role(&m[i], "user") || (is_role(&m[i], "system") && i > 0)) {
            // '<|im_start|>' + message.role + '\n' + content + '<|im_end|>' + '\n'
            text_append(text, "<|im_start|>");
            text_append(text, m[i].role);
            text_append(text, "\n");
            text_append(text, m[i].content);
            text_append(text, "<|im_end|>\n");
        } else if (is_role(&m[i], "assistant")) {
            TextSpan content, reasoning;
            qwen3_split_reasoning(m[i].content, &content, &reasoning);
            // {%- if loop.index0 > ns.last_query_index %}{%- if loop.last or (not loop.last and reasoning_content) %}
            //   '<|im_start|>' + message.role + '\n<think>\n' + reasoning_content.strip('\n') +
            //   '\n</think>\n\n' + content.lstrip('\n')
            // and otherwise '<|im_start|>' + message.role + '\n' + content: before the last query
            // the reasoning is gone, and so is an empty one in between (an empty string is false).
            text_append(text, "<|im_start|>assistant\n");
            if (i > last_query && (i == count - 1 || reasoning.end > reasoning.start)) {
                text_append(text, "<think>\n");
                text_append_span(text, rstrip_newlines(lstrip_newlines(reasoning)));
                text_append(text, "\n</think>\n\n");
                text_append_span(text, lstrip_newlines(content));
            } else {
                text_append_span(text, content);
            }
            // {%- for tool_call in message.tool_calls %}{%- if (loop.first and content) or
            // (not loop.first) %}'\n'{%- endif %}<tool_call>...{%- endfor %}
            for (int j = 0; j < m[i].num_tool_calls; j++) {
                if (j > 0 || content.end > content.start) text_append(text, "\n");
                hermes_call(&m[i].tool_calls[j], text);
            }
            text_append(text, "<|im_end|>\n");
        } else if (is_role(&m[i], "tool")) {
            hermes_tool_response(m, count, i, text);
        }
    }
    if (generation) {
        // {%- if enable_thinking is defined and enable_thinking is false %}: an empty think
        // block, so that the model answers without reasoning.
        text_append(text, "<|im_start|>assistant\n");
        if (!t->enable_thinking) text_append(text, "<think>\n\n</think>\n\n");
    }
    return 0;
}

// --- Llama-2 chat -----------------------------------------------------------------------

int render_llama2(const ChatTemplate *t, const ChatMessage *m, int count, bool generation, TextBuffer *text) {
    // A first system message becomes system_message; the loop runs over the rest.
    // (system_message != false holds for an empty string too, so "" still gets <<SYS>>.)
    int first = 0;
    const char *system_message = NULL;
    if (is_role(&m[0], "system")) {
        system_message = m[0].content;
        first = 1;
    }
    TextBuffer content = {0};
    for (int i = first; i < count; i++) {
        int index = i - first;
        if (breaks_alternation(&m[i], index)) {
            free(content.data);
            return chat_template_error(t, CHAT_ERROR_ALTERNATE);
        }
        content.length = 0;
        if (index == 0 && system_message) {
            // '<<SYS>>\n' + system_message + '\n<</SYS>>\n\n' + message['content'], stripped whole
            text_append(&content, "<<SYS>>\n");
            text_append(&content, system_message);
            text_append(&content, "\n<</SYS>>\n\n");
        }
        text_append(&content, m[i].content);
        if (is_role(&m[i], "user")) {
            // bos_token + '[INST] ' + content.strip() + ' [/INST]'
            text_append(text, t->bos_token);
            text_append(text, "[INST] ");
            text_append_stripped(text, content.data);
            text_append(text, " [/INST]");
        } else if (is_role(&m[i], "assistant")) {
            // ' '  + content.strip() + ' ' + eos_token
            text_append(text, " ");
            text_append_stripped(text, content.data);
            text_append(text, " ");
            text_append(text, t->eos_token);
        }
        // A later system message at an odd index passes the test above and prints nothing.
    }
    free(content.data);
    (void)generation; // the template never reads add_generation_prompt
    return 0;
}

// --- Llama 3 and 3.1 ----------------------------------------------------------------------

int render_llama3(const ChatTemplate *t, const ChatMessage *m, int count, const json_t *tools, bool generation,
                  TextBuffer *text) {
    int first = 0;
    if (t->llama31_system_header) {
        // {{- bos_token }}; a first system message is taken out (|trim) and always written
        // after the knowledge/date lines, even when empty.
        text_append(text, t->bos_token);
        const char *system_message = "";
        if (is_role(&m[0], "system")) {
            system_message = m[0].content;
            first = 1;
        }
        text_append(text, "<|start_header_id|>system<|end_header_id|>\n\n");
        // {%- if builtin_tools is defined or tools is not none %}"Environment: ipython\n"
        if (tools) text_append(text, "Environment: ipython\n");
        text_append(text, "Cutting Knowledge Date: December 2023\n");
        text_append(text, "Today Date: ");
        text_append(text, t->date_string);
        text_append(text, "\n\n");
        if (tools && !t->tools_in_user_message) {
            // {%- if tools is not none and not tools_in_user_message %}: in the system turn.
            text_append(text, "You have access to the following functions. To call a function, please respond with "
                              "JSON for a function call.Respond in the format {\"name\": function name, "
                              "\"parameters\": dictionary of argument name and its value}.Do not use variables.\n\n");
            for (size_t k = 0; k < json_array_size(tools); k++) {
                python_json_append(text, json_array_get(tools, k), 4);
                text_append(text, "\n\n");
            }
        }
        text_append_stripped(text, system_message);
        text_append(text, "<|eot_id|>");
        if (tools && t->tools_in_user_message) {
            // tools_in_user_message (true unless the caller sets it): the tools go before the
            // first remaining message's content (|trim), whatever its role, in a user turn.
            if (first >= count)
                return chat_template_error(t, "Cannot put tools in the first user message when there's no first "
                                              "user message!");
            text_append(text, "<|start_header_id|>user<|end_header_id|>\n\n"
                              "Given the following functions, please respond with a JSON for a function call "
                              "with its proper arguments that best answers the given prompt.\n\n"
                              "Respond in the format {\"name\": function name, \"parameters\": dictionary of "
                              "argument name and its value}.Do not use variables.\n\n");
            for (size_t k = 0; k < json_array_size(tools); k++) {
                python_json_append(text, json_array_get(tools, k), 4);
                text_append(text, "\n\n");
            }
            text_append_stripped(text, m[first].content);
            text_append(text, "<|eot_id|>");
            first++;
        }
    }
    for (int i = first; i < count; i++) {
        // Llama 3: {% if loop.index0 == 0 %}{% set content = bos_token + content %}
        if (i == 0 && !t->llama31_system_header) text_append(text, t->bos_token);
        if (is_role(&m[i], "tool")) {
            // "<|start_header_id|>ipython<|end_header_id|>\n\n", then the content | tojson
            // (a string "is iterable" to Jinja, so it is written as a JSON string).
            text_append(text, "<|start_header_id|>ipython<|end_header_id|>\n\n");
            python_json_append_string(text, m[i].content, strlen(m[i].content));
            text_append(text, "<|eot_id|>");
            continue;
        }
        if (m[i].num_tool_calls > 0) {
            // {%- if not message.tool_calls|length == 1 %}raise; then
            // '{"name": "' + name + '", ' + '"parameters": ' + arguments | tojson + "}"
            if (m[i].num_tool_calls != 1)
                return chat_template_error(t, "This model only supports single tool-calls at once!");
            text_append(text, "<|start_header_id|>assistant<|end_header_id|>\n\n{\"name\": \"");
            text_append(text, m[i].tool_calls[0].name);
            text_append(text, "\", \"parameters\": ");
            append_arguments(text, &m[i].tool_calls[0], -1);
            text_append(text, "}<|eot_id|>");
            continue;
        }
        // '<|start_header_id|>' + role + '<|end_header_id|>\n\n' + content | trim + '<|eot_id|>'
        text_append(text, "<|start_header_id|>");
        text_append(text, m[i].role);
        text_append(text, "<|end_header_id|>\n\n");
        text_append_stripped(text, m[i].content);
        text_append(text, "<|eot_id|>");
    }
    if (generation) text_append(text, "<|start_header_id|>assistant<|end_header_id|>\n\n");
    return 0;
}

// --- Gemma 1/2 and 3 ------------------------------------------------------------------------

int render_gemma(const ChatTemplate *t, const ChatMessage *m, int count, bool generation, TextBuffer *text) {
    text_append(text, t->bos_token);
    int first = 0;
    const char *first_user_prefix = NULL;
    if (is_role(&m[0], "system")) {
        // Gemma 1/2: raise_exception('System role not supported').
        // Gemma 3: first_user_prefix = messages[0]['content'] + '\n\n' (not trimmed).
        if (!t->fold_system_into_user) return chat_template_error(t, CHAT_ERROR_NO_SYSTEM);
        first_user_prefix = m[0].content;
        first = 1;
    }
    for (int i = first; i < count; i++) {
        int index = i - first;
        if (breaks_alternation(&m[i], index)) return chat_template_error(t, CHAT_ERROR_ALTERNATE);
        // '<start_of_turn>' + role + '\n' (+ prefix on the first turn) + content | trim + '<end_of_turn>\n'
        text_append(text, "<start_of_turn>");
        text_append(text, is_role(&m[i], "assistant") ? "model" : m[i].role);
        text_append(text, "\n");
        if (index == 0 && first_user_prefix) {
            text_append(text, first_user_prefix);
            text_append(text, "\n\n");
        }
        text_append_stripped(text, m[i].content);
        text_append(text, "<end_of_turn>\n");
    }
    if (generation) text_append(text, "<start_of_turn>model\n");
    return 0;
}

// --- Zephyr ---------------------------------------------------------------------------------

int render_zephyr(const ChatTemplate *t, const ChatMessage *m, int count, bool generation, TextBuffer *text) {
    for (int i = 0; i < count; i++) {
        // '<|user|>\n' + message['content'] + eos_token, then the template's own newline
        // after "}}" (trim_blocks only removes newlines after block tags).
        text_append(text, "<|");
        text_append(text, m[i].role);
        text_append(text, "|>\n");
        text_append(text, m[i].content);
        text_append(text, t->eos_token);
        text_append(text, "\n");
        // {% if loop.last and add_generation_prompt %}{{ '<|assistant|>' }}\n
        if (i == count - 1 && generation) text_append(text, "<|assistant|>\n");
    }
    return 0;
}

// --- The paper's plain transcripts: HH-RLHF and WebGPT -----------------------------------------

int render_plain_turns(const ChatTemplate *t, const ChatMessage *m, int count, bool generation, TextBuffer *text) {
    bool hh = t->family == CHAT_FAMILY_HH;
    CHECK(hh || t->family == CHAT_FAMILY_WEBGPT, "render_plain_turns on family %d", (int)t->family);
    const char *human = hh ? "\n\nHuman: " : " Human: ";
    const char *assistant = hh ? "\n\nAssistant: " : " Assistant: ";
    const char *prompt = hh ? "\n\nAssistant:" : " Assistant:";
    for (int i = 0; i < count; i++) {
        if (is_role(&m[i], "system")) return chat_template_error(t, CHAT_ERROR_NO_SYSTEM);
        if (breaks_alternation(&m[i], i)) return chat_template_error(t, CHAT_ERROR_ALTERNATE);
        text_append(text, is_role(&m[i], "user") ? human : assistant);
        text_append(text, m[i].content);
    }
    if (generation) text_append(text, prompt);
    return 0;
}
