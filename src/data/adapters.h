// Internal to src/data/: one parser per dataset schema (the table in data/dataset.h),
// from a parsed JSON row to a DataRecord, and the detection of a row's schema.
#pragma once
#include <stdbool.h>

#include <jansson.h>

#include "data/dataset.h"

// Where a row comes from, for the messages: "(<path>:<line>)".
typedef struct {
    const char *path;
    long line;
} DataRowPlace;

// Whether the row holds lists of messages (TRL's conversational formats, data/dataset.h):
// its "messages", or its "prompt" (else "chosen" or "rejected"), is a list.
bool data_row_is_conversational(const json_t *row);

// The format the fields of `row` (an object) say, or -1 with err_set() naming the row.
int data_detect_format(const json_t *row, const DataRowPlace *at, DataFormat *format);

// Fills *record (zeroed first) from `row` in `format` (not AUTO). On error the record
// holds nothing (already freed) and err_set() names the field and the place.
int data_parse_row(DataFormat format, const json_t *row, const DataRowPlace *at, DataRecord *record);
