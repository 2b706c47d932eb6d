// Internal to src/data/: the rows of a dataset file, one JSON object at a time, with the
// line each starts on. Two layouts, told apart by the first non-blank byte:
//   - JSON Lines (streamed; blank lines skipped): a row is one line;
//   - one JSON array of objects ("[" first; read whole): a row is one element, found by
//     a scan that follows strings and nesting, so that each element is checked and
//     parsed on its own and its messages name its own line.
// Before parsing, every row is checked: at most max_row_bytes bytes, no NUL byte, valid
// UTF-8 (RFC 3629: no overlong forms, surrogates or code points above U+10FFFF). An
// invalid byte is reported with its line and column and, when it sits in a string, the
// field whose value (or name) it is in.
#pragma once
#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>

typedef struct {
    char *path;
    size_t max_row_bytes;
    bool is_array;
    long line;       // the line the last row returned starts on (1-based)
    long lines_seen; // lines consumed so far
    long end_line;   // the last line read (JSONL) or the line of the closing "]"
    // JSON Lines: the file and a read buffer; the current line is assembled in `row`.
    FILE *file;
    char *chunk;
    size_t chunk_length, chunk_position;
    char *row;
    size_t row_length, row_capacity;
    // JSON array: the whole file, the scan position and its line and column.
    char *text;
    size_t text_size, position;
    long position_line;
    long position_column;
    bool array_done;
} DataRowReader;

int data_rows_open(DataRowReader *reader, const char *path, size_t max_row_bytes);
// 1 with *row set to a JSON object (json_decref() it), 0 at the end, -1 on error.
int data_rows_next(DataRowReader *reader, json_t **row);
void data_rows_close(DataRowReader *reader);

// Checks `length` bytes of one row that starts on line `first_line`, column
// `first_column`: no NUL, valid UTF-8. -1 with err_set() naming path:line:column.
int data_check_row_bytes(const char *bytes, size_t length, const char *path, long first_line, long first_column);
