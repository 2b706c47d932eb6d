// Reading JSON Lines: one JSON value per line, blank lines skipped. Every error names
// the file, the line and (for JSON syntax errors) the column.
#pragma once
#include <jansson.h>
#include <stdio.h>

typedef struct {
    FILE *file;
    char *path;
    long line_number; // of the last line returned
    char *line;
    size_t capacity;
    size_t max_line_bytes;
} JsonlReader;

// "-" reads standard input. max_line_bytes bounds one line (0: 64 MiB).
int jsonl_open(JsonlReader *reader, const char *path, size_t max_line_bytes);
// 1 with *value set (caller json_decref()s it), 0 at end of file, -1 on error.
int jsonl_next(JsonlReader *reader, json_t **value);
void jsonl_close(JsonlReader *reader);

// Writes `value` as one JSON document (json_dumps with `flags`) and a newline to `path`,
// atomically (io/fs.h). Returns 0 or -1 with err_set() naming the path.
int json_write_file(const char *path, const json_t *value, size_t flags);

// What kind of JSON value `value` is, for error messages ("... is an array, expected a
// string"): "an object", "an array", "a string", "an integer", "a number", "a boolean" or
// "null".
const char *json_kind(const json_t *value);
