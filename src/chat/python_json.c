// Python's json.dumps as transformers' tojson filter calls it (see python_json.h).
#include "chat/python_json.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/check.h"

void python_float_repr(double x, char *out, size_t size) {
    // The shortest %e form that reads back as x: the correctly rounded p-digit decimal is
    // the closest one, so the first p whose rounding reads back is Python's choice.
    char scientific[40];
    for (int precision = 1; precision <= 17; precision++) {
        snprintf(scientific, sizeof scientific, "%.*e", precision - 1, x);
        if (strtod(scientific, NULL) == x) break;
    }
    // scientific is [-]d[.ddd]e[+-]XX: the digits and the decimal exponent.
    const char *p = scientific;
    bool negative = *p == '-';
    if (negative) p++;
    char digits[24];
    int count = 0;
    for (; *p && *p != 'e'; p++)
        if (*p != '.') digits[count++] = *p;
    int exponent = atoi(p + 1);
    while (count > 1 && digits[count - 1] == '0') count--;
    digits[count] = '\0';
    // float_repr_style 'short': fixed notation for 1e-4 <= |x| < 1e16, else d.ddde+XX.
    char body[64];
    int n = 0;
    if (exponent >= -4 && exponent < 16) {
        if (exponent < 0) {
            body[n++] = '0';
            body[n++] = '.';
            for (int i = 0; i < -exponent - 1; i++) body[n++] = '0';
            for (int i = 0; i < count; i++) body[n++] = digits[i];
        } else {
            // The digits, zeros up to the units, the point, the rest (or "0").
            for (int i = 0; i <= exponent || i < count; i++) {
                if (i == exponent + 1) body[n++] = '.';
                body[n++] = i < count ? digits[i] : '0';
            }
            if (count <= exponent + 1) {
                body[n++] = '.';
                body[n++] = '0';
            }
        }
        body[n] = '\0';
    } else {
        snprintf(body, sizeof body, "%c%s%se%c%02d", digits[0], count > 1 ? "." : "", digits + 1,
                 exponent < 0 ? '-' : '+', abs(exponent));
    }
    snprintf(out, size, "%s%s", negative ? "-" : "", body);
}

void python_json_append_string(TextBuffer *text, const char *s, size_t length) {
    text_append(text, "\"");
    size_t run = 0; // bytes copied as they are, pending
    for (size_t i = 0; i < length; i++) {
        unsigned char c = (unsigned char)s[i];
        const char *escape = NULL;
        char hex[8];
        switch (c) {
        case '"': escape = "\\\""; break;
        case '\\': escape = "\\\\"; break;
        case '\n': escape = "\\n"; break;
        case '\r': escape = "\\r"; break;
        case '\t': escape = "\\t"; break;
        case '\b': escape = "\\b"; break;
        case '\f': escape = "\\f"; break;
        default:
            if (c < 0x20) {
                snprintf(hex, sizeof hex, "\\u%04x", c);
                escape = hex;
            }
        }
        if (!escape) continue;
        text_append_bytes(text, s + run, i - run);
        text_append(text, escape);
        run = i + 1;
    }
    text_append_bytes(text, s + run, length - run);
    text_append(text, "\"");
}

static void newline_indent(TextBuffer *text, int indent, int level) {
    text_append(text, "\n");
    for (int i = 0; i < indent * level; i++) text_append(text, " ");
}

static void append_value(TextBuffer *text, const json_t *value, int indent, int level) {
    char number[64];
    switch (json_typeof(value)) {
    case JSON_OBJECT: {
        if (json_object_size(value) == 0) {
            text_append(text, "{}");
            break;
        }
        text_append(text, "{");
        bool first = true;
        const char *key;
        json_t *item;
        // json_object_foreach takes a non-const object; iteration does not change it.
        json_object_foreach((json_t *)value, key, item) {
            if (!first) text_append(text, indent < 0 ? ", " : ",");
            if (indent >= 0) newline_indent(text, indent, level + 1);
            python_json_append_string(text, key, strlen(key));
            text_append(text, ": ");
            append_value(text, item, indent, level + 1);
            first = false;
        }
        if (indent >= 0) newline_indent(text, indent, level);
        text_append(text, "}");
        break;
    }
    case JSON_ARRAY: {
        if (json_array_size(value) == 0) {
            text_append(text, "[]");
            break;
        }
        text_append(text, "[");
        for (size_t i = 0; i < json_array_size(value); i++) {
            if (i > 0) text_append(text, indent < 0 ? ", " : ",");
            if (indent >= 0) newline_indent(text, indent, level + 1);
            append_value(text, json_array_get(value, i), indent, level + 1);
        }
        if (indent >= 0) newline_indent(text, indent, level);
        text_append(text, "]");
        break;
    }
    case JSON_STRING: python_json_append_string(text, json_string_value(value), json_string_length(value)); break;
    case JSON_INTEGER:
        snprintf(number, sizeof number, "%" JSON_INTEGER_FORMAT, json_integer_value(value));
        text_append(text, number);
        break;
    case JSON_REAL:
        python_float_repr(json_real_value(value), number, sizeof number);
        text_append(text, number);
        break;
    case JSON_TRUE: text_append(text, "true"); break;
    case JSON_FALSE: text_append(text, "false"); break;
    case JSON_NULL: text_append(text, "null"); break;
    }
}

void python_json_append(TextBuffer *text, const json_t *value, int indent) { append_value(text, value, indent, 0); }

char *python_json_dumps(const json_t *value, int indent) {
    TextBuffer text = {0};
    text_append(&text, "");
    python_json_append(&text, value, indent);
    return text.data;
}
