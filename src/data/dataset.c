// Loading a dataset file into records, copying, selecting and filtering; the schemas
// themselves are in adapters.c, the file layouts in row_reader.c.
#include "data/dataset.h"

#include <string.h>

#include "core/check.h"
#include "data/adapters.h"
#include "data/column_renames.h"
#include "data/row_reader.h"
#include "tokenizer/tokenizer.h"

// Canonical names first; the others are the Hugging Face dataset ids and aliases.
static const struct {
    const char *name;
    DataFormat format;
} format_names[] = {
    {"auto", DATA_FORMAT_AUTO},
    {"tldr", DATA_FORMAT_TLDR},
    {"hh", DATA_FORMAT_HH},
    {"webgpt", DATA_FORMAT_WEBGPT},
    {"apps", DATA_FORMAT_APPS},
    {"sft", DATA_FORMAT_SFT},
    {"pairs", DATA_FORMAT_PAIRS},
    {"ranked", DATA_FORMAT_RANKED},
    {"prompts", DATA_FORMAT_PROMPTS},
    {"unpaired", DATA_FORMAT_UNPAIRED},
    {"summarize", DATA_FORMAT_TLDR},
    {"openai/summarize_from_feedback", DATA_FORMAT_TLDR},
    {"Dahoas/full-hh-rlhf", DATA_FORMAT_HH},
    {"Dahoas/rm-static", DATA_FORMAT_HH},
    {"hh-rlhf", DATA_FORMAT_HH},
    {"openai/webgpt_comparisons", DATA_FORMAT_WEBGPT},
    {"codeparrot/apps", DATA_FORMAT_APPS},
};
enum { FORMAT_NAME_COUNT = sizeof format_names / sizeof format_names[0] };

const char *data_format_name(DataFormat format) {
    for (int i = 0; i < FORMAT_NAME_COUNT; i++)
        if (format_names[i].format == format) return format_names[i].name;
    return "unknown";
}

int data_format_parse(const char *name, const char *option, DataFormat *format) {
    for (int i = 0; i < FORMAT_NAME_COUNT; i++) {
        if (strcmp(format_names[i].name, name) == 0) {
            *format = format_names[i].format;
            return 0;
        }
    }
    return err_set("unknown dataset format \"%s\"; expected auto, tldr, hh, webgpt, apps, sft, pairs, ranked, "
                   "prompts or a Hugging Face dataset id (openai/summarize_from_feedback, Dahoas/full-hh-rlhf, "
                   "Dahoas/rm-static, openai/webgpt_comparisons, codeparrot/apps) (%s)",
                   name, option);
}

void data_record_free(DataRecord *record) {
    char *owned[] = {record->prompt,    record->chosen,       record->rejected,   record->id,
                     record->subreddit, record->question,     record->solutions,  record->input_output,
                     record->difficulty, record->url,         record->starter_code, record->raw,
                     record->conversation};
    for (size_t i = 0; i < sizeof owned / sizeof owned[0]; i++) free(owned[i]);
    for (int k = 0; k < record->response_count; k++) free(record->responses[k]);
    free(record->responses);
    for (int k = 0; k < record->turn_count; k++) free(record->turns[k]);
    free(record->turns);
    memset(record, 0, sizeof *record);
}

static char *copy_or_null(const char *s) { return s ? xstrdup(s) : NULL; }

void data_record_copy(const DataRecord *source, DataRecord *out) {
    *out = *source; // the scalars; every pointer is replaced below
    out->prompt = copy_or_null(source->prompt);
    out->chosen = copy_or_null(source->chosen);
    out->rejected = copy_or_null(source->rejected);
    out->id = copy_or_null(source->id);
    out->subreddit = copy_or_null(source->subreddit);
    out->question = copy_or_null(source->question);
    out->solutions = copy_or_null(source->solutions);
    out->input_output = copy_or_null(source->input_output);
    out->difficulty = copy_or_null(source->difficulty);
    out->url = copy_or_null(source->url);
    out->starter_code = copy_or_null(source->starter_code);
    out->raw = copy_or_null(source->raw);
    out->conversation = copy_or_null(source->conversation);
    out->responses = NULL;
    if (source->response_count > 0) {
        out->responses = xmalloc((size_t)source->response_count * sizeof *out->responses);
        for (int k = 0; k < source->response_count; k++) out->responses[k] = copy_or_null(source->responses[k]);
    }
    out->turns = NULL;
    if (source->turn_count > 0) {
        out->turns = xmalloc((size_t)source->turn_count * sizeof *out->turns);
        for (int k = 0; k < source->turn_count; k++) out->turns[k] = xstrdup(source->turns[k]);
    }
}

void dataset_free(Dataset *dataset) {
    for (long i = 0; i < dataset->count; i++) data_record_free(&dataset->records[i]);
    free(dataset->records);
    free(dataset->path);
    memset(dataset, 0, sizeof *dataset);
}

int dataset_load_with(Dataset *dataset, const char *path, const DatasetLoadOptions *options) {
    memset(dataset, 0, sizeof *dataset);
    DataRowReader reader;
    const size_t max_row_bytes = options->max_row_bytes ? options->max_row_bytes : DATA_DEFAULT_MAX_ROW_BYTES;
    if (data_rows_open(&reader, path, max_row_bytes) != 0) return -1;
    Dataset loaded = {.path = xstrdup(path), .format = options->format};
    long capacity = 0;
    int rc;
    json_t *row;
    while ((rc = data_rows_next(&reader, &row)) == 1) {
        DataRowPlace at = {path, reader.line};
        char *raw = options->keep_raw ? json_dumps(row, JSON_COMPACT) : NULL;
        if (options->renames && column_renames_apply(options->renames, row, path, reader.line) != 0) {
            free(raw);
            json_decref(row);
            rc = -1;
            break;
        }
        if (loaded.format == DATA_FORMAT_AUTO && data_detect_format(row, &at, &loaded.format) != 0) {
            free(raw);
            json_decref(row);
            rc = -1;
            break;
        }
        // A file is conversational or not as a whole: its prompts are tokenized one way.
        const bool conversational = data_row_is_conversational(row) && loaded.format != DATA_FORMAT_HH;
        if (loaded.count == 0) loaded.conversational = conversational;
        else if (conversational != loaded.conversational) {
            rc = err_set("row %s lists of messages but the first row %s: every row must be alike (%s:%ld)",
                         conversational ? "holds" : "does not hold", conversational ? "does not" : "does", path,
                         reader.line);
            free(raw);
            json_decref(row);
            break;
        }
        if (loaded.count == capacity) {
            capacity = capacity ? 2 * capacity : 256;
            loaded.records = xrealloc(loaded.records, (size_t)capacity * sizeof *loaded.records);
        }
        DataRecord *record = &loaded.records[loaded.count];
        rc = data_parse_row(loaded.format, row, &at, record);
        json_decref(row);
        if (rc != 0) {
            free(raw);
            break;
        }
        record->raw = raw;
        record->row = loaded.count++;
        record->line = reader.line;
    }
    if (rc == 0 && loaded.count == 0) {
        rc = err_set("no rows: the file is empty (%s:%ld)", path, reader.end_line > 0 ? reader.end_line : 1);
    }
    data_rows_close(&reader);
    if (rc != 0) {
        dataset_free(&loaded);
        return -1;
    }
    loaded.records = xrealloc(loaded.records, (size_t)loaded.count * sizeof *loaded.records);
    *dataset = loaded;
    return 0;
}

int dataset_load(Dataset *dataset, const char *path, DataFormat format, size_t max_row_bytes) {
    return dataset_load_with(dataset, path, &(DatasetLoadOptions){.format = format, .max_row_bytes = max_row_bytes});
}

int dataset_load_keep_raw(Dataset *dataset, const char *path, DataFormat format, size_t max_row_bytes) {
    return dataset_load_with(dataset, path,
                             &(DatasetLoadOptions){.format = format, .max_row_bytes = max_row_bytes, .keep_raw = true});
}

int dataset_require_prompts(const Dataset *dataset, const char *option) {
    for (long i = 0; i < dataset->count; i++)
        if (dataset->records[i].text_only)
            return err_set("row of %s at line %ld is a language-modeling {\"text\"} row: it has no prompt to answer (%s)",
                           dataset->path, dataset->records[i].line, option);
    return 0;
}

bool dataset_text_rows_only(const Dataset *dataset) {
    for (long i = 0; i < dataset->count; i++)
        if (!dataset->records[i].text_only) return false;
    return dataset->count > 0;
}

void dataset_take(const Dataset *source, const long *indices, long count, Dataset *out) {
    CHECK(count >= 0, "dataset_take of %ld records", count);
    Dataset taken = {.path = xstrdup(source->path ? source->path : ""), .format = source->format, .count = count,
                     .conversational = source->conversational};
    taken.records = xcalloc((size_t)(count > 0 ? count : 1), sizeof *taken.records);
    for (long i = 0; i < count; i++) {
        CHECK(indices[i] >= 0 && indices[i] < source->count, "index %ld outside a dataset of %ld records", indices[i],
              source->count);
        data_record_copy(&source->records[indices[i]], &taken.records[i]);
    }
    *out = taken;
}

int dataset_filter_prompt_length(Dataset *dataset, const Tokenizer *tok, int max_prompt_tokens, long *dropped) {
    if (max_prompt_tokens < 1) return err_set("a prompt limit of %d tokens (--max-prompt-len)", max_prompt_tokens);
    // Tokenizing is the cost, and a Tokenizer may encode on many threads at once.
    int *lengths = xmalloc((size_t)(dataset->count > 0 ? dataset->count : 1) * sizeof *lengths);
#pragma omp parallel for schedule(dynamic, 16)
    for (long i = 0; i < dataset->count; i++) {
        const char *prompt = dataset->records[i].prompt;
        CHECK(prompt, "a conversational row's prompt filtered before dataset_render_chat rendered it");
        int *ids;
        CHECK(tokenizer_encode(tok, prompt, strlen(prompt), true, &ids, &lengths[i]) == 0, "tokenizer_encode failed");
        free(ids);
    }
    long kept = 0, gone = 0;
    for (long i = 0; i < dataset->count; i++) {
        DataRecord *record = &dataset->records[i];
        if (lengths[i] > max_prompt_tokens) {
            data_record_free(record);
            gone++;
        } else {
            if (kept != i) dataset->records[kept] = *record; // moved: the old slot is not freed again
            kept++;
        }
    }
    free(lengths);
    dataset->count = kept;
    if (dropped) *dropped = gone;
    return 0;
}
