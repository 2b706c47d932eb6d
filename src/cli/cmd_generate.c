// marlhf generate: completions for prompts from the command line or a JSONL file.
//
// Input rows (JSONL): {"prompt": "text"} (with --chat, sent as a user message through the
// chat template), {"messages": [{"role": ..., "content": ...}, ...]}, or {"ids": [...]}.
// Output rows: {"prompt", "response", "prompt_tokens", "response_tokens", "stop_reason",
// "ids", "logprobs"} — logprobs are the model's (temperature 1) for each response token.
//
// --json / --json-schema FILE: every answer is constrained to a JSON object / a value of the
// schema (gen/json_constraint.h); --regex RE: the whole answer matches the regular expression
// (gen/regex_constraint.h); --choice A,B,... (or a JSON list of strings): the answer is one of
// them. An answer cut by --max-new-tokens has stop_reason "length".
// Under mpirun (dist/dist.h) rank r generates batches r, r + W, ... (the batches one
// process forms, so the same rows) and rank 0 writes every row, in order, at the end.
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "cli/batch_invariant.h"
#include "cli/commands.h"
#include "cli/constraint_options.h"
#include "cli/options.h"
#include "cli/sampler_options.h"
#include "cli/output_file.h"
#include "model/quantize.h"
#include "gen/text_model.h"
#include "core/check.h"
#include "core/progress.h"
#include "dist/dist.h"
#include "gen/generate.h"
#include "io/jsonl.h"

typedef struct {
    char *prompt_text; // for the output
    int *ids;
    int length;
} PromptRow;

typedef struct {
    const Tokenizer *tokenizer;
    const char *stop_string;
} StopContext;

// Stops a row once its decoded text contains the stop string.
static bool contains_stop_string(void *context, int row, const int *tokens, int count) {
    const StopContext *c = context;
    if (!c->stop_string || !*c->stop_string) return false;
    char *text = tokenizer_decode(c->tokenizer, tokens, count, true);
    bool found = strstr(text, c->stop_string) != NULL;
    free(text);
    return found;
}

static int parse_prompt_row(TextModel *tm, json_t *value, bool chat, const char *system, const char *path, long line,
                            PromptRow *row) {
    memset(row, 0, sizeof *row);
    if (!json_is_object(value)) return err_set("row must be a JSON object (%s:%ld)", path, line);
    json_t *prompt = json_object_get(value, "prompt"), *messages = json_object_get(value, "messages");
    json_t *ids = json_object_get(value, "ids");
    if (ids) {
        if (!json_is_array(ids) || json_array_size(ids) == 0)
            return err_set("\"ids\" must be a non-empty array (%s:%ld)", path, line);
        row->length = (int)json_array_size(ids);
        row->ids = xmalloc(row->length * sizeof(int));
        for (int i = 0; i < row->length; i++) {
            json_t *id = json_array_get(ids, i);
            if (!json_is_integer(id) || json_integer_value(id) < 0 ||
                json_integer_value(id) >= tm->model.config.vocab_size)
                return err_set("\"ids\"[%d] is not a token id of this model (%s:%ld)", i, path, line);
            row->ids[i] = (int)json_integer_value(id);
        }
        row->prompt_text = tokenizer_decode(tm->tokenizer, row->ids, row->length, false);
        return 0;
    }
    if (messages) {
        if (!json_is_array(messages) || json_array_size(messages) == 0)
            return err_set("\"messages\" must be a non-empty array (%s:%ld)", path, line);
        if (!tm->has_chat) return err_set("\"messages\" need a chat template; pass --chat-template (%s:%ld)", path, line);
        size_t n = json_array_size(messages);
        ChatMessage *list = xmalloc(n * sizeof(ChatMessage));
        for (size_t i = 0; i < n; i++) {
            json_t *m = json_array_get(messages, i);
            json_t *role = json_object_get(m, "role"), *content = json_object_get(m, "content");
            if (!json_is_string(role) || !json_is_string(content)) {
                free(list);
                return err_set("messages[%zu] needs string \"role\" and \"content\" (%s:%ld)", i, path, line);
            }
            list[i] = (ChatMessage){.role = json_string_value(role), .content = json_string_value(content)};
        }
        int rc = text_model_chat_ids(tm, list, (int)n, &row->ids, &row->length);
        free(list);
        if (rc != 0) return err_set("%s (%s:%ld)", err_msg(), path, line);
        row->prompt_text = tokenizer_decode(tm->tokenizer, row->ids, row->length, false);
        return 0;
    }
    if (!json_is_string(prompt)) return err_set("row needs \"prompt\" (a string), \"messages\" or \"ids\" (%s:%ld)", path, line);
    const char *text = json_string_value(prompt);
    row->prompt_text = xstrdup(text);
    if (chat) {
        ChatMessage list[2];
        int n = 0;
        if (system) list[n++] = (ChatMessage){.role = "system", .content = system};
        list[n++] = (ChatMessage){.role = "user", .content = text};
        if (text_model_chat_ids(tm, list, n, &row->ids, &row->length) != 0)
            return err_set("%s (%s:%ld)", err_msg(), path, line);
    } else {
        text_model_text_ids(tm, text, &row->ids, &row->length);
    }
    if (row->length == 0) return err_set("prompt is empty after tokenization (%s:%ld)", path, line);
    return 0;
}

// A prompt must leave room for at least one new token in the model's context (generation
// stops a row there, gen/generate.h).
static int parse_fitting_prompt_row(TextModel *tm, json_t *value, bool chat, const char *system, const char *path,
                                    long line, PromptRow *row) {
    if (parse_prompt_row(tm, value, chat, system, path, line, row) != 0) return -1;
    const int context = tm->model.config.max_position_embeddings;
    if (row->length >= context)
        return err_set("prompt of %d tokens does not fit the model's context of %d tokens with an answer (%s:%ld)",
                       row->length, context, path, line);
    return 0;
}

// sample >= 0: the answer's index among the prompt's --num-return-sequences answers.
static void write_result(FILE *out, TextModel *tm, const PromptRow *row, const GeneratedRow *gen, const char *stop_string,
                         int sample) {
    // The response text, without a trailing stop token, cut at the stop string.
    int length = gen->length;
    if (gen->stop == STOP_TOKEN && length > 0) length--;
    // With its length: a model may generate a NUL byte, which must not end the text.
    size_t response_length;
    char *response = tokenizer_decode_len(tm->tokenizer, gen->tokens, length, true, &response_length);
    if (gen->stop == STOP_CHECK && stop_string && *stop_string) {
        char *at = memmem(response, response_length, stop_string, strlen(stop_string));
        if (at) response_length = (size_t)(at - response);
    }
    json_t *o = json_object();
    json_object_set_new(o, "prompt", json_string(row->prompt_text));
    json_object_set_new(o, "response", json_stringn(response, response_length));
    if (sample >= 0) json_object_set_new(o, "sample", json_integer(sample));
    json_object_set_new(o, "prompt_tokens", json_integer(row->length));
    json_object_set_new(o, "response_tokens", json_integer(gen->length));
    json_object_set_new(o, "stop_reason", json_string(stop_reason_name(gen->stop)));
    json_t *ids = json_array(), *logprobs = json_array();
    for (int i = 0; i < gen->length; i++) {
        json_array_append_new(ids, json_integer(gen->tokens[i]));
        json_array_append_new(logprobs, json_real(gen->logprobs[i]));
    }
    json_object_set_new(o, "ids", ids);
    json_object_set_new(o, "logprobs", logprobs);
    char *line = json_dumps(o, JSON_COMPACT);
    fprintf(out, "%s\n", line);
    free(line);
    json_decref(o);
    free(response);
}


int cmd_generate(int argc, char **argv) {
    const char *quantize = NULL; // quantize_default
    const char *kv_cache = "f32";
    char *model_path = NULL, *input = NULL, *output = "-", *device = "cpu", *chat_template = NULL;
    char *system = NULL, *stop_string = NULL, *json_schema = NULL, *regex = NULL, *choice = NULL, *grammar = NULL,
         *grammar_file = NULL;
    bool json_object = false;
    long max_new_tokens = 256, min_new_tokens = 0, top_k = 50, batch_size = 8, seed = 1234, threads = 0, sequences = 1;
    double temperature = 0.8, top_p = 1.0;
    bool chat = false, greedy = false, no_thinking = false;
    char *lora_adapter = NULL;
    bool batch_invariant = false;
    SamplerExtrasCli extras = SAMPLER_EXTRAS_CLI_DEFAULTS;
    Option options[] = {
        {"model", NULL, OPT_STRING, &model_path, "Hugging Face folder or .gguf file", true, false},
        {"input", NULL, OPT_STRING, &input, "JSONL of {\"prompt\"}, {\"messages\"} or {\"ids\"} rows; else prompts are the arguments", false, false},
        {"output", NULL, OPT_STRING, &output, "JSONL output ('-' = stdout)", false, false},
        {"max-new-tokens", "max_new_tokens max_answer_seq_len", OPT_INT, &max_new_tokens, "tokens to generate per prompt at most", false, false},
        {"min-new-tokens", "min_new_tokens", OPT_INT, &min_new_tokens, "no stop token before this many new tokens", false, false},
        {"temperature", NULL, OPT_FLOAT, &temperature, "sampling temperature (0 = greedy)", false, false},
        {"top-k", "top_k", OPT_INT, &top_k, "keep the k most likely tokens (0 = all)", false, false},
        {"top-p", "top_p", OPT_FLOAT, &top_p, "nucleus sampling mass (1 = off)", false, false},
        SAMPLER_EXTRAS_OPTIONS(&extras),
        {"greedy", NULL, OPT_BOOL, &greedy, "greedy decoding (same as --temperature 0)", false, false},
        {"seed", NULL, OPT_INT, &seed, "random seed (a row's output depends only on it, its prompt and its index)", false, false},
        {"stop", NULL, OPT_STRING, &stop_string, "stop a row when its text contains this string", false, false},
        {"json", NULL, OPT_BOOL, &json_object, CONSTRAINT_HELP_JSON, false, false},
        {"json-schema", "json_schema", OPT_STRING, &json_schema, CONSTRAINT_HELP_JSON_SCHEMA, false, false},
        {"regex", NULL, OPT_STRING, &regex, CONSTRAINT_HELP_REGEX, false, false},
        {"choice", NULL, OPT_STRING, &choice, CONSTRAINT_HELP_CHOICE, false, false},
        {"grammar", NULL, OPT_STRING, &grammar, CONSTRAINT_HELP_GRAMMAR, false, false},
        {"grammar-file", "grammar_file", OPT_STRING, &grammar_file, CONSTRAINT_HELP_GRAMMAR_FILE, false, false},
        {"chat", NULL, OPT_BOOL, &chat, "send each prompt as a user message through the chat template", false, false},
        {"system", NULL, OPT_STRING, &system, "system message for --chat", false, false},
        {"chat-template", "chat_template", OPT_STRING, &chat_template, "chat template name or file (default: the model's own)", false, false},
        {"no-thinking", NULL, OPT_BOOL, &no_thinking, "render chat prompts with enable_thinking=False (Qwen3: the answer starts after an empty think block)", false, false},
        {"batch-size", "batch_size", OPT_INT, &batch_size, "rows (prompts x --num-return-sequences) generated together", false, false},
        {"num-return-sequences", "num_return_sequences n", OPT_INT, &sequences,
         "answers per prompt, each on its own random stream (they share the prompt's prefill); rows get \"sample\"", false,
         false},
        {"lora-adapter", "lora_path", OPT_STRING, &lora_adapter,
         "a saved LoRA adapter applied to --model (a marlhf model folder or a PEFT adapter folder)", false, false},
        {"device", NULL, OPT_STRING, &device, "cpu (cuda when built with it)", false, false},
        {"quantize", NULL, OPT_STRING, &quantize, QUANTIZE_OPTION_HELP, false, false},
        {"kv-cache", NULL, OPT_STRING, &kv_cache, "f32, f16 or q8_0: the KV cache in half floats (half its memory) or in 8-bit blocks (about 0.28 of it): faster decoding of long contexts; the prompt itself is attended in f32", false, false},
        {"threads", NULL, OPT_INT, &threads, "CPU threads (0 = all cores)", false, false},
        cli_batch_invariant_option(&batch_invariant),
    };
    const char *positional[64];
    OptionSet set = {"generate", "Generate completions for prompts (arguments or --input JSONL).",
                     "marlhf generate --model PATH [--chat] [PROMPT ...] | --input FILE.jsonl", options,
                     sizeof options / sizeof options[0], positional, 64, 0};
    options_parse(&set, argc, argv);
    sampler_extras_check(&extras);
    cli_set_batch_invariant(&set, device);
    if (!input && set.num_positional == 0) die_user("give prompts as arguments or --input FILE.jsonl (marlhf generate --help)");
    if (input && set.num_positional > 0) die_user("give prompts either as arguments or with --input, not both");
    if (max_new_tokens < 1 || max_new_tokens > 1 << 20) die_user("--max-new-tokens must be in [1, 1048576], got %ld", max_new_tokens);
    if (min_new_tokens < 0 || min_new_tokens > max_new_tokens)
        die_user("--min-new-tokens must be in [0, --max-new-tokens], got %ld", min_new_tokens);
    if (temperature < 0) die_user("--temperature must be >= 0, got %g", temperature);
    if (top_k < 0) die_user("--top-k must be >= 0, got %ld", top_k);
    if (!(top_p > 0 && top_p <= 1)) die_user("--top-p must be in (0, 1], got %g", top_p);
    if (batch_size < 1 || batch_size > 4096) die_user("--batch-size must be in [1, 4096], got %ld", batch_size);
    if (sequences < 1 || sequences > 4096) die_user("--num-return-sequences must be in [1, 4096], got %ld", sequences);
    if (sequences > 1 && (greedy || temperature == 0))
        die_user("--num-return-sequences %ld with greedy decoding: every answer would be the same", sequences);
    quantize = quantize_default(quantize, model_path);
    if (quantize_type_check(quantize, "--quantize") != 0) die_from_err();
    if (kv_cache_type_set(NULL, kv_cache, "--kv-cache") != 0) die_from_err();
    Constraint *constraint = cli_constraint_from_options(json_object != 0, json_schema, regex, choice, grammar, grammar_file);
    cli_set_threads(threads);

    TextModel tm;
    if (text_model_load(&tm, model_path, lora_adapter, device, quantize, chat_template, chat || no_thinking) != 0)
        die_from_err();
    if (no_thinking && text_model_disable_thinking(&tm) != 0) die_user("--no-thinking: %s", err_msg());
    if (kv_cache_type_set(&tm.model, kv_cache, "--kv-cache") != 0) die_from_err();
    // Read all prompts first: a bad row is reported before any generation work.
    PromptRow *rows = NULL;
    int count = 0, capacity = 0;
    if (input) {
        JsonlReader reader;
        if (jsonl_open(&reader, input, 0) != 0) die_from_err();
        json_t *value;
        int got;
        while ((got = jsonl_next(&reader, &value)) == 1) {
            if (count == capacity) rows = xrealloc(rows, (capacity = capacity ? 2 * capacity : 64) * sizeof(PromptRow));
            int rc = parse_fitting_prompt_row(&tm, value, chat, system, input, reader.line_number, &rows[count]);
            json_decref(value);
            if (rc != 0) die_from_err();
            count++;
        }
        if (got < 0) die_from_err();
        jsonl_close(&reader);
        if (count == 0) die_user("no prompts in %s", input);
    } else {
        rows = xcalloc(set.num_positional, sizeof(PromptRow));
        for (int i = 0; i < set.num_positional; i++) {
            json_t *value = json_pack("{s:s}", "prompt", positional[i]);
            if (parse_fitting_prompt_row(&tm, value, chat, system, "argument", i + 1, &rows[i]) != 0) die_from_err();
            json_decref(value);
        }
        count = set.num_positional;
    }

    const int rank = dist_rank(), world = dist_world_size();
    FILE *out = rank == 0 ? cli_output_open(output) : stdout; // only rank 0 writes
    StopContext stop = {tm.tokenizer, stop_string};
    GenerateOptions gen = {
        .sampler = {.temperature = greedy ? 0.0f : (float)temperature, .top_k = (int)top_k, .top_p = (float)top_p},
        .max_new_tokens = (int)max_new_tokens,
        .min_new_tokens = (int)min_new_tokens,
        .seed = (uint64_t)seed,
        .stop_tokens = tm.stop_tokens,
        .num_stop_tokens = tm.num_stop_tokens,
        .stop_check = stop_string ? contains_stop_string : NULL,
        .stop_context = &stop,
        .pad_token = tokenizer_pad_id(tm.tokenizer) >= 0 ? tokenizer_pad_id(tm.tokenizer) : 0,
        .constraint = constraint,
        .token_trie = constraint ? token_trie_new(tm.tokenizer, tm.model.config.vocab_size) : NULL,
    };
    sampler_extras_apply(&extras, &gen.sampler, tm.model.config.vocab_size);
    // Output row v answers prompt v / N (N = --num-return-sequences): its sample v % N.
    const int N = (int)sequences, prompt_count = count;
    count = prompt_count * N;
    // With several ranks each writes its rows to memory; batch_bytes[k] is batch k's share.
    const int batches = (int)((count + batch_size - 1) / batch_size);
    double *batch_bytes = xcalloc((size_t)batches, sizeof(double));
    char *mine = NULL;
    size_t mine_size = 0;
    FILE *rows_out = world > 1 ? open_memstream(&mine, &mine_size) : out;
    long mine_rows = 0;
    for (int k = rank; k < batches; k += world) mine_rows += count - k * batch_size < batch_size ? count - k * batch_size : batch_size;
    Progress progress;
    progress_start(&progress, "generate", mine_rows, N > 1 ? "answers" : "prompts");
    progress.quiet = rank != 0;
    long generated = 0;
    double decode_seconds = 0;
    for (int first = rank * (int)batch_size; first < count; first += world * (int)batch_size) {
        int B = count - first < batch_size ? count - first : (int)batch_size;
        const int **prompts = xmalloc(B * sizeof(int *));
        int *lengths = xmalloc(B * sizeof(int));
        uint64_t *row_ids = xmalloc(B * sizeof(uint64_t));
        for (int b = 0; b < B; b++) {
            const int v = first + b, prompt = v / N, sample = v % N;
            prompts[b] = rows[prompt].ids;
            lengths[b] = rows[prompt].length;
            // Sample 0's stream is the prompt's own (the answer without --num-return-sequences);
            // the others' lie above 2^40.
            row_ids[b] = (uint64_t)prompt + ((uint64_t)sample << 40);
        }
        GeneratedRow *results = xmalloc(B * sizeof(GeneratedRow));
        GenerateStats stats;
        generate(&tm.model, prompts, lengths, row_ids, B, &gen, results, &stats);
        generated += stats.generated_tokens;
        decode_seconds += stats.prefill_seconds + stats.decode_seconds;
        long before = world > 1 ? ftell(rows_out) : 0;
        for (int b = 0; b < B; b++) {
            write_result(rows_out, &tm, &rows[(first + b) / N], &results[b], stop_string, N > 1 ? (first + b) % N : -1);
            generated_row_free(&results[b]);
        }
        fflush(rows_out);
        if (world > 1) batch_bytes[first / batch_size] = (double)(ftell(rows_out) - before);
        char status[64];
        snprintf(status, sizeof status, "%.1f tokens/s", decode_seconds > 0 ? generated / decode_seconds : 0);
        progress_update(&progress, B, status);
        free(prompts), free(lengths), free(row_ids), free(results);
    }
    char status[64];
    snprintf(status, sizeof status, "%ld tokens, %.1f tokens/s", generated, decode_seconds > 0 ? generated / decode_seconds : 0);
    progress_finish(&progress, status);
    if (world > 1) {
        // Rank 0 receives every rank's rows (rank order) and writes them in batch order.
        fclose(rows_out);
        dist_sum_doubles(batch_bytes, batches);
        char *all;
        long all_size;
        dist_gather_bytes(mine, (long)mine_size, &all, &all_size);
        if (rank == 0) {
            long *cursor = xcalloc((size_t)world, sizeof(long)); // where each rank's next batch starts
            long start = 0;
            for (int r = 0; r < world; r++) {
                cursor[r] = start;
                for (int k = r; k < batches; k += world) start += (long)batch_bytes[k];
            }
            for (int k = 0; k < batches; k++) {
                fwrite(all + cursor[k % world], 1, (size_t)batch_bytes[k], out);
                cursor[k % world] += (long)batch_bytes[k];
            }
            free(cursor);
        }
        free(all), free(mine);
    }
    free(batch_bytes);
    cli_output_commit(out, output);
    for (int i = 0; i < prompt_count; i++) free(rows[i].ids), free(rows[i].prompt_text);
    free(rows);
    token_trie_free((TokenTrie *)gen.token_trie);
    constraint_free(constraint);
    text_model_free(&tm);
    sampler_extras_free(&extras);
    return 0;
}
