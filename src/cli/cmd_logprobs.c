// marlhf logprobs: for each input row of token ids, the log-prob of every next token and
// the model's top-1 prediction at each position. This is how anyone checks the engine
// against another implementation.
//
// Input  (JSONL): {"ids": [id0, id1, ...]} or {"text": "..."} (tokenized by the model's tokenizer)
// Output (JSONL): {"logprobs": [log p(id1|id0), ..., log p(id_{n-1}|...)],
//                  "top1": [argmax after id0, ..., argmax after id_{n-1}]}
#include <errno.h>
#include <jansson.h>
#include <unistd.h>
#include <stdio.h>
#include <string.h>

#include "cli/batch_invariant.h"
#include "cli/commands.h"
#include "cli/options.h"
#include "cli/output_file.h"
#include "core/check.h"
#include "io/jsonl.h"
#include "model/lora.h"
#include "model/quantize.h"
#include "model/weights_io.h"
#include "tokenizer/tokenizer.h"

typedef struct {
    int *ids;
    int length;
    long line_number;
} InputRow;

// {"text": ...} rows are tokenized with the model's tokenizer, loaded at the first such row
// (so that {"ids"} input works with models that have none); BOS only with --add-bos.
static Tokenizer *row_tokenizer;
static bool row_add_bos;
static void free_row_tokenizer(void) { tokenizer_free(row_tokenizer); }

static int parse_text_row(json_t *text, const char *model_path, const char *path, long line_number, int vocab_size,
                          InputRow *row) {
    if (!json_is_string(text)) return err_set("\"text\" must be a string (%s:%ld)", path, line_number);
    if (!row_tokenizer) {
        if (tokenizer_load(&row_tokenizer, model_path) != 0) return -1;
        atexit(free_row_tokenizer);
    }
    tokenizer_encode(row_tokenizer, json_string_value(text), json_string_length(text), row_add_bos, &row->ids,
                     &row->length);
    row->line_number = line_number;
    if (row->length == 0) {
        free(row->ids);
        return err_set("\"text\" gives no tokens (%s:%ld)", path, line_number);
    }
    for (int i = 0; i < row->length; i++)
        if (row->ids[i] >= vocab_size) {
            int id = row->ids[i];
            free(row->ids);
            return err_set("the tokenizer gives id %d, outside the model's vocabulary of %d (%s:%ld)", id, vocab_size,
                           path, line_number);
        }
    return 0;
}

static int parse_row(json_t *value, const char *model_path, const char *path, long line_number, int vocab_size,
                     InputRow *row) {
    json_t *ids = json_is_object(value) ? json_object_get(value, "ids") : NULL;
    json_t *text = json_is_object(value) && !ids ? json_object_get(value, "text") : NULL;
    if (text) return parse_text_row(text, model_path, path, line_number, vocab_size, row);
    if (!ids) return err_set("line has no \"ids\" array or \"text\" (%s:%ld)", path, line_number);
    if (!json_is_array(ids)) return err_set("\"ids\" must be an array of integers (%s:%ld)", path, line_number);
    size_t n = json_array_size(ids);
    if (n == 0) return err_set("\"ids\" is empty (%s:%ld)", path, line_number);
    row->ids = xmalloc(n * sizeof(int));
    row->length = (int)n;
    row->line_number = line_number;
    for (size_t i = 0; i < n; i++) {
        json_t *id = json_array_get(ids, i);
        if (!json_is_integer(id)) {
            free(row->ids);
            return err_set("\"ids\"[%zu] is not an integer (%s:%ld)", i, path, line_number);
        }
        json_int_t v = json_integer_value(id);
        if (v < 0 || v >= vocab_size) {
            free(row->ids);
            return err_set("token id %lld at \"ids\"[%zu] is outside the vocabulary [0, %d) (%s:%ld)",
                           (long long)v, i, vocab_size, path, line_number);
        }
        row->ids[i] = (int)v;
    }
    return 0;
}

static void print_float_array(FILE *out, const float *values, int n) {
    fputc('[', out);
    for (int i = 0; i < n; i++) fprintf(out, i ? ", %.9g" : "%.9g", (double)values[i]);
    fputc(']', out);
}

static void run_batch(Model *model, InputRow *rows, int count, FILE *out) {
    int T = 0;
    for (int r = 0; r < count; r++)
        if (rows[r].length > T) T = rows[r].length;
    const long N = (long)count * T;
    int *tokens = xcalloc((size_t)N, sizeof(int)), *targets = xmalloc((size_t)N * sizeof(int));
    int *row_len = xmalloc((size_t)count * sizeof(int)), *top1 = xmalloc((size_t)N * sizeof(int));
    float *logp = xmalloc((size_t)N * sizeof(float));
    for (long i = 0; i < N; i++) targets[i] = -1;
    for (int r = 0; r < count; r++) {
        row_len[r] = rows[r].length;
        for (int t = 0; t < rows[r].length; t++) {
            tokens[(long)r * T + t] = rows[r].ids[t];
            if (t + 1 < rows[r].length) targets[(long)r * T + t] = rows[r].ids[t + 1];
        }
    }
    ModelBatch batch = {.B = count, .T = T, .tokens = tokens, .row_start = NULL, .row_len = row_len};
    model_forward(model, &batch);
    model_logprobs(model, targets, logp, top1, NULL);
    for (int r = 0; r < count; r++) {
        fputs("{\"logprobs\": ", out);
        print_float_array(out, logp + (long)r * T, rows[r].length - 1);
        fputs(", \"top1\": [", out);
        for (int t = 0; t < rows[r].length; t++) fprintf(out, t ? ", %d" : "%d", top1[(long)r * T + t]);
        fputs("]}\n", out);
    }
    free(tokens), free(targets), free(row_len), free(top1), free(logp);
}

// The output is written to a temporary file renamed into place at the end, so a run that
// fails half-way (bad input line) leaves an existing output file untouched.

int cmd_logprobs(int argc, char **argv) {
    char *model_path = NULL, *input = NULL, *output = "-", *device = "cpu";
    long batch_size = 8, threads = 0;
    char *lora_adapter = NULL, *quantize = NULL; // quantize_default
    bool batch_invariant = false;
    Option options[] = {
        {"model", NULL, OPT_STRING, &model_path, "Hugging Face folder or .gguf file", true, false},
        {"input", NULL, OPT_STRING, &input, "JSONL file of {\"ids\": [...]} or {\"text\": ...} rows ('-' = stdin)", true,
         false},
        {"add-bos", "add_bos", OPT_BOOL, &row_add_bos, "tokenize {\"text\"} rows with the tokenizer's BOS", false, false},
        {"output", NULL, OPT_STRING, &output, "JSONL output ('-' = stdout)", false, false},
        {"batch-size", "batch_size", OPT_INT, &batch_size, "rows per forward pass", false, false},
        {"lora-adapter", "lora_path", OPT_STRING, &lora_adapter,
         "a saved LoRA adapter applied to --model (a marlhf model folder or a PEFT adapter folder)", false, false},
        {"quantize", NULL, OPT_STRING, &quantize,
         QUANTIZE_TYPES ": the model's weights in 16 to 2 bits (CPU; the base a QLoRA adapter was trained on; left "
                        "out, a GGUF of Q2_K - Q6_K, IQ4_NL or IQ4_XS tensors runs with its own bits as its file "
                        "type's mix, anything else as none)",
         false, false},
        {"device", NULL, OPT_STRING, &device, "cpu (cuda when built with it)", false, false},
        {"threads", NULL, OPT_INT, &threads, "CPU threads (0 = all cores)", false, false},
        cli_batch_invariant_option(&batch_invariant),
    };
    OptionSet set = {"logprobs", "Per-token log-probs and top-1 next tokens of given token ids.",
                     "marlhf logprobs --model PATH --input FILE.jsonl [--output FILE.jsonl]", options,
                     sizeof options / sizeof options[0], NULL, 0, 0};
    options_parse(&set, argc, argv);
    cli_set_batch_invariant(&set, device);
    if (batch_size < 1 || batch_size > 4096) die_user("--batch-size must be in [1, 4096], got %ld", batch_size);
    const OpsBackend *ops = ops_backend_by_name(device);
    if (!ops) die_from_err();
    cli_set_threads(threads);

    Model model;
    const char *quantize_type = quantize_default(quantize, model_path);
    if (quantize_type_check(quantize_type, "--quantize") != 0) die_from_err();
    ModelLoadOptions load = {.with_lm_head = true, .quantize = quantize_type};
    if (model_load_with_adapter(&model, model_path, ops, &load, lora_adapter, 0) != 0) die_from_err();
    JsonlReader reader;
    if (jsonl_open(&reader, input, 0) != 0) die_from_err();
    FILE *out = cli_output_open(output);

    InputRow *rows = xcalloc((size_t)batch_size, sizeof(InputRow));
    int count = 0;
    for (;;) {
        json_t *value = NULL;
        int got = jsonl_next(&reader, &value);
        if (got < 0) die_from_err();
        if (got == 1) {
            int rc = parse_row(value, model_path, input, reader.line_number, model.config.vocab_size, &rows[count]);
            json_decref(value);
            if (rc != 0) die_from_err();
            if (model.config.positions == POSITIONS_LEARNED &&
                rows[count].length > model.config.max_position_embeddings)
                die_user("row has %d tokens, more than the model's %d positions (%s:%ld)", rows[count].length,
                         model.config.max_position_embeddings, input, reader.line_number);
            count++;
        }
        if (count == batch_size || (got == 0 && count > 0)) {
            run_batch(&model, rows, count, out);
            for (int r = 0; r < count; r++) free(rows[r].ids);
            count = 0;
        }
        if (got == 0) break;
    }
    free(rows);
    jsonl_close(&reader);
    cli_output_commit(out, output);
    model_free(&model);
    return 0;
}
