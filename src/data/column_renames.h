// Renamed columns: a file whose fields go by other names than a format's ("question" and
// "answer" for "prompt" and "response") read as if they did not, the way Hugging Face
// datasets' rename_columns() and OpenRLHF's --input_key / --output_key / --chosen_key ...
// serve. Written "old=new,old=new" (--rename-columns); each row's top-level fields are renamed
// before its format is detected and parsed, all at once (so "chosen=rejected,rejected=chosen"
// swaps two). A row without one of the old fields, or that has a new name already (other
// than one being renamed away), is an error naming the file and line, as datasets' is.
#pragma once
#include <jansson.h>

typedef struct ColumnRenames {
    int count;
    char **from, **to;
} ColumnRenames;

// Parses `text` ("old=new[,old=new...]": non-empty names, no name renamed twice, no two
// renamed to one). -1 with err_set() naming `option` on a malformed list. Empty text: none.
int column_renames_parse(const char *text, const char *option, ColumnRenames *out);
void column_renames_free(ColumnRenames *renames);

// Renames the fields of one row (a JSON object) in place. -1 with err_set() naming
// path:line when the row lacks an old field or already has a new one.
int column_renames_apply(const ColumnRenames *renames, json_t *row, const char *path, long line);
