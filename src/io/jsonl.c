#include "io/jsonl.h"

#include <errno.h>
#include <string.h>

#include "core/check.h"
#include "io/fs.h"

int jsonl_open(JsonlReader *reader, const char *path, size_t max_line_bytes) {
    memset(reader, 0, sizeof *reader);
    reader->file = strcmp(path, "-") == 0 ? stdin : fopen(path, "rb");
    if (!reader->file) return err_set("cannot open %s: %s", path, strerror(errno));
    reader->path = xstrdup(path);
    reader->max_line_bytes = max_line_bytes ? max_line_bytes : (size_t)64 << 20;
    return 0;
}

int jsonl_next(JsonlReader *reader, json_t **value) {
    for (;;) {
        ssize_t length = getline(&reader->line, &reader->capacity, reader->file);
        if (length < 0) {
            if (ferror(reader->file))
                return err_set("read error after line %ld (%s)", reader->line_number, reader->path);
            return 0;
        }
        reader->line_number++;
        if ((size_t)length > reader->max_line_bytes)
            return err_set("line is %zd bytes, over the limit of %zu (%s:%ld)", length,
                           reader->max_line_bytes, reader->path, reader->line_number);
        if (memchr(reader->line, '\0', (size_t)length))
            return err_set("line contains a NUL byte (%s:%ld)", reader->path, reader->line_number);
        size_t start = 0;
        while (start < (size_t)length && strchr(" \t\r\n", reader->line[start])) start++;
        if (start == (size_t)length) continue; // blank line
        json_error_t error;
        *value = json_loadb(reader->line, (size_t)length, 0, &error);
        if (!*value)
            return err_set("invalid JSON: %s (%s:%ld:%d)", error.text, reader->path,
                           reader->line_number, error.column);
        return 1;
    }
}

void jsonl_close(JsonlReader *reader) {
    if (reader->file && reader->file != stdin) fclose(reader->file);
    free(reader->path);
    free(reader->line);
    memset(reader, 0, sizeof *reader);
}

int json_write_file(const char *path, const json_t *value, size_t flags) {
    char *text = json_dumps(value, flags);
    CHECK(text, "json_dumps failed");
    size_t n = strlen(text);
    text = xrealloc(text, n + 2);
    text[n] = '\n', text[n + 1] = '\0';
    int rc = fs_write_file_atomic(path, text, n + 1);
    free(text);
    return rc;
}

const char *json_kind(const json_t *value) {
    switch (json_typeof(value)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a number";
    case JSON_TRUE:
    case JSON_FALSE: return "a boolean";
    case JSON_NULL: return "null";
    }
    return "a JSON value";
}
