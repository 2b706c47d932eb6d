// marlhf tokenize: text -> token ids (or, with --decode, ids -> text) with a model's
// tokenizer, exactly as Hugging Face tokenizers does it (see tokenizer/tokenizer.h).
//
// Input  (JSONL): {"text": "..."}          with --decode: {"ids": [id, ...]}
// Output (JSONL): {"ids": [id, ...]}       with --decode: {"text": "..."}
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "cli/commands.h"
#include "cli/options.h"
#include "cli/output_file.h"
#include "core/check.h"
#include "io/jsonl.h"
#include "tokenizer/tokenizer.h"

// The output goes to a temporary file renamed into place at the end, so a run that fails
// half-way (a bad input line) leaves an existing output file untouched.

static int encode_row(const Tokenizer *tok, json_t *row, const char *path, long line, bool add_bos, FILE *out) {
    json_t *text = json_is_object(row) ? json_object_get(row, "text") : NULL;
    if (!text) return err_set("line has no \"text\" (%s:%ld)", path, line);
    if (!json_is_string(text)) return err_set("\"text\" must be a string (%s:%ld)", path, line);
    int *ids, n;
    tokenizer_encode(tok, json_string_value(text), json_string_length(text), add_bos, &ids, &n);
    fputs("{\"ids\": [", out);
    for (int i = 0; i < n; i++) fprintf(out, i ? ", %d" : "%d", ids[i]);
    fputs("]}\n", out);
    free(ids);
    return 0;
}

static int decode_row(const Tokenizer *tok, json_t *row, const char *path, long line, bool skip_special, FILE *out) {
    json_t *ids = json_is_object(row) ? json_object_get(row, "ids") : NULL;
    if (!ids) return err_set("line has no \"ids\" array (%s:%ld)", path, line);
    if (!json_is_array(ids)) return err_set("\"ids\" must be an array of integers (%s:%ld)", path, line);
    size_t n = json_array_size(ids);
    int *values = xmalloc((n ? n : 1) * sizeof(int));
    for (size_t i = 0; i < n; i++) {
        json_t *id = json_array_get(ids, i);
        if (!json_is_integer(id)) {
            free(values);
            return err_set("\"ids\"[%zu] is not an integer (%s:%ld)", i, path, line);
        }
        json_int_t v = json_integer_value(id);
        if (v < 0 || v >= tokenizer_vocab_size(tok)) {
            free(values);
            return err_set("token id %lld at \"ids\"[%zu] is outside the vocabulary [0, %d) (%s:%ld)", (long long)v, i,
                           tokenizer_vocab_size(tok), path, line);
        }
        values[i] = (int)v;
    }
    size_t len;
    char *text = tokenizer_decode_len(tok, values, (int)n, skip_special, &len);
    json_t *result = json_pack("{s:s%}", "text", text, len);
    CHECK(result, "decoded text is not UTF-8");
    char *line_text = json_dumps(result, JSON_COMPACT | JSON_ENSURE_ASCII);
    fprintf(out, "%s\n", line_text);
    free(line_text);
    json_decref(result);
    free(text);
    free(values);
    return 0;
}

int cmd_tokenize(int argc, char **argv) {
    // Static: the option parser's copies of string values stay reachable (no leak report).
    static char *model_path = NULL, *input = NULL, *output = "-";
    bool decode = false, add_bos = false, skip_special = false;
    long threads = 0;
    Option options[] = {
        {"model", NULL, OPT_STRING, &model_path, "Hugging Face folder or .gguf file (its tokenizer)", true, false},
        {"input", NULL, OPT_STRING, &input, "JSONL of {\"text\": ...} rows ({\"ids\": [...]} with --decode; '-' = stdin)",
         true, false},
        {"output", NULL, OPT_STRING, &output, "JSONL output ('-' = stdout)", false, false},
        {"decode", NULL, OPT_BOOL, &decode, "ids -> text instead of text -> ids", false, false},
        {"add-bos", "add_bos add-special-tokens", OPT_BOOL, &add_bos,
         "add the special tokens the tokenizer adds (BOS where it has one)", false, false},
        {"skip-special", "skip_special skip-special-tokens", OPT_BOOL, &skip_special,
         "with --decode: leave special tokens out of the text", false, false},
        {"threads", NULL, OPT_INT, &threads, "CPU threads (0 = all cores)", false, false},
    };
    OptionSet set = {"tokenize", "Text to token ids (or ids to text) with a model's tokenizer.",
                     "marlhf tokenize --model PATH --input FILE.jsonl [--output FILE] [--decode] [--add-bos] "
                     "[--skip-special]",
                     options, sizeof options / sizeof options[0], NULL, 0, 0};
    options_parse(&set, argc, argv);
    cli_set_threads(threads);

    Tokenizer *tok;
    if (tokenizer_load(&tok, model_path) != 0) die_from_err();
    JsonlReader reader;
    if (jsonl_open(&reader, input, 0) != 0) die_from_err();
    FILE *out = cli_output_open(output);
    for (;;) {
        json_t *row = NULL;
        int got = jsonl_next(&reader, &row);
        if (got < 0) die_from_err();
        if (got == 0) break;
        int rc = decode ? decode_row(tok, row, input, reader.line_number, skip_special, out)
                        : encode_row(tok, row, input, reader.line_number, add_bos, out);
        json_decref(row);
        if (rc != 0) die_from_err();
    }
    jsonl_close(&reader);
    cli_output_commit(out, output);
    tokenizer_free(tok);
    return 0;
}
