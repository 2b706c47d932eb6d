// Python's json.dumps(value, ensure_ascii=False, indent=indent), which is what transformers'
// `tojson` filter writes into chat templates (tools, tool-call arguments), byte for byte:
// keys in their order (jansson keeps the order of the parsed text, as Python's dicts do),
// ", " and ": " between items without an indent, "," and a newline plus `indent` spaces
// per level with one, "{}" and "[]" for empty containers; strings with \" \\ \n \r \t \b
// \f escaped and the other control characters as \u00xx, everything else (non-ASCII, DEL,
// U+2028) as it is; integers in decimal; reals as Python's repr() writes a float (the
// shortest text that reads back as the same double: "0.1", "1e-07", "1e+16",
// "1000000000000000.0", "-0.0"). Used by src/chat/ (templates) and serve/tool_calls.c
// (a tool call's arguments, which vLLM writes with json.dumps too).
#pragma once
#include <jansson.h>

#include "chat/template_families.h"

// Appends `value` to `text`; indent < 0: none (one line).
void python_json_append(TextBuffer *text, const json_t *value, int indent);

// The same as a new malloc'd string (free() it).
char *python_json_dumps(const json_t *value, int indent);

// A string as json.dumps writes it (quotes included); `s` is UTF-8.
void python_json_append_string(TextBuffer *text, const char *s, size_t length);

// Python's repr() of a finite double, into out (at least 32 bytes).
void python_float_repr(double x, char *out, size_t size);
