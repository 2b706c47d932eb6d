// marlhf judge: a pairwise LLM judge of two models' results on the same prompts (spec
// §9.3–9.4, the released gpt4-eval scripts without their bugs), over any OpenAI-compatible
// chat-completions endpoint.
//
// Row i of A and row i of B must share their prompt. Each row is shown to the judge with
// a seeded coin flip deciding which model's response comes first (position bias); the
// verdict is mapped back to the models and the winning position recorded, so both the
// win rate and the judge's position bias can be read from the output.
//
// Differences from the released scripts, on purpose: the judge may write a short
// comparison before its verdict (max_tokens 5 truncated the HH answer there), a reply
// without a readable verdict is asked again once and then counted as "invalid" (not
// silently dropped), the coin flips are seeded, and the win rate comes with a 95% Wilson
// interval.
//
// Every verdict is appended (and fsynced) to OUTPUT.partial as soon as it is known, so an
// interrupted run (endpoint down, Ctrl-C) continues where it stopped; the output and its
// summary appear atomically at the end and the partial file is removed.
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/commands.h"
#include "cli/options.h"
#include "core/check.h"
#include "core/progress.h"
#include "eval/http_client.h"
#include "eval/judge.h"
#include "io/fs.h"
#include "io/jsonl.h"

typedef struct {
    const char *prompt, *response;
    long line;
    json_t *json; // owns the strings
} ResultRow;

static ResultRow *load_results(const char *path, long *count) {
    JsonlReader reader;
    if (jsonl_open(&reader, path, 0) != 0) die_from_err();
    ResultRow *rows = NULL;
    long n = 0;
    json_t *row;
    int rc;
    while ((rc = jsonl_next(&reader, &row)) == 1) {
        const char *prompt = json_string_value(json_object_get(row, "prompt"));
        const char *response = json_string_value(json_object_get(row, "response"));
        if (!prompt || !response)
            die_user("row without \"prompt\" and \"response\" strings (%s:%ld)", path, reader.line_number);
        rows = xrealloc(rows, (size_t)(n + 1) * sizeof *rows);
        rows[n++] = (ResultRow){prompt, response, reader.line_number, row};
    }
    if (rc < 0) die_from_err();
    jsonl_close(&reader);
    *count = n;
    return rows;
}


// The chat-completions URL of an API base given with or without a trailing slash (or
// already ending in /chat/completions).
static char *endpoint_url(const char *api_base) {
    if (strncmp(api_base, "http://", 7) && strncmp(api_base, "https://", 8))
        die_user("--api-base must be an http:// or https:// URL, got '%s'", api_base);
    size_t n = strlen(api_base);
    while (n > 0 && api_base[n - 1] == '/') n--;
    static const char suffix[] = "/chat/completions";
    bool complete = n >= sizeof suffix - 1 && !strncmp(api_base + n - (sizeof suffix - 1), suffix, sizeof suffix - 1);
    char *url = xmalloc(n + sizeof suffix);
    memcpy(url, api_base, n);
    strcpy(url + n, complete ? "" : suffix);
    return url;
}

typedef struct {
    const char *task, *judge_model;
    uint64_t seed;
    const ResultRow *a, *b;
} RunIdentity;

static const char *string_of(json_t *row, const char *key) {
    const char *value = json_string_value(json_object_get(row, key));
    return value ? value : "";
}

static void free_rows(json_t **rows, long count) {
    for (long i = 0; i < count; i++) json_decref(rows[i]);
    free(rows);
}

// Reads the verdicts an interrupted run saved in `path` (the first n at most) and checks
// that they belong to these inputs and settings: 0 with *rows and *saved set (both empty
// when there is no file), -1 with err_set() naming the file and line otherwise. A last
// line without its newline (a crash mid-write) is cut off the file.
static int load_partial(const char *path, const RunIdentity *id, long n, json_t ***rows_out, long *saved) {
    *rows_out = NULL, *saved = 0;
    if (!fs_exists(path)) return 0;
    char *data;
    size_t size;
    if (fs_read_file(path, (size_t)1 << 32, &data, &size) != 0) return -1;
    size_t complete = size;
    while (complete > 0 && data[complete - 1] != '\n') complete--;
    if (complete < size && truncate(path, (off_t)complete) != 0) {
        free(data);
        return err_set("cannot cut the torn last line of %s: %s", path, strerror(errno));
    }
    json_t **rows = NULL;
    long count = 0, line = 0;
    for (char *p = data, *end; p < data + complete; p = end + 1) {
        end = memchr(p, '\n', (size_t)(data + complete - p));
        line++;
        if (end == p || count >= n) continue; // resumed with a smaller --limit: keep what it needs
        json_error_t error;
        json_t *row = json_loadb(p, (size_t)(end - p), 0, &error);
        const char *why = NULL;
        JudgeVerdict verdict;
        JudgePosition position;
        json_t *index = json_object_get(row, "index"), *swapped = json_object_get(row, "swapped");
        if (!row) why = error.text;
        else if (!json_is_integer(index) || json_integer_value(index) != count) why = "its index is out of order";
        else if (!json_is_boolean(swapped) || judge_verdict_from_name(string_of(row, "verdict"), &verdict) != 0 ||
                 judge_position_from_name(json_string_value(json_object_get(row, "position_won")), &position) != 0 ||
                 !json_is_string(json_object_get(row, "reply")))
            why = "it is not a verdict row";
        else if (strcmp(string_of(row, "task"), id->task)) why = "it was judged for another --task";
        else if (strcmp(string_of(row, "judge_model"), id->judge_model)) why = "it was judged by another --judge-model";
        else if (json_is_true(swapped) != judge_swapped(id->seed, (uint64_t)count))
            why = "it was judged with another --seed";
        else if (strcmp(string_of(row, "prompt"), id->a[count].prompt) ||
                 strcmp(string_of(row, "response_a"), id->a[count].response) ||
                 strcmp(string_of(row, "response_b"), id->b[count].response))
            why = "its prompt or responses differ from the inputs";
        if (why) {
            err_set("cannot resume from the saved verdicts: %s; remove the file or give --overwrite (%s:%ld)", why, path,
                    line);
            json_decref(row), free(data), free_rows(rows, count);
            return -1;
        }
        rows = xrealloc(rows, (size_t)(count + 1) * sizeof *rows);
        rows[count++] = row;
    }
    free(data);
    *rows_out = rows, *saved = count;
    return 0;
}

typedef struct {
    HttpClient *client;
    const char *judge_model;
    long max_tokens;
} Judge;

static bool accept_reply(const char *body, void *context) {
    (void)context;
    char *reply = judge_reply_from_response(body);
    free(reply);
    return reply != NULL;
}

// Sends the conversation and returns the judge's reply, or NULL (err_set) when the
// endpoint gave none.
static char *ask(const Judge *judge, json_t *messages) {
    json_t *request = json_pack("{s:s, s:O, s:i, s:I}", "model", judge->judge_model, "messages", messages,
                                "temperature", 0, "max_tokens", (json_int_t)judge->max_tokens);
    char *body = json_dumps(request, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(request);
    char *response = NULL, *reply = NULL;
    if (http_post_json(judge->client, body, accept_reply, NULL, &response) == 0)
        reply = judge_reply_from_response(response);
    free(body), free(response);
    return reply;
}

static json_t *message(const char *role, const char *content) {
    return json_pack("{s:s, s:s}", "role", role, "content", content);
}

// Judges row `index`: the prompt with both responses in the row's order, once more with
// a reminder if the reply holds no verdict. NULL (err_set) when the endpoint failed.
static json_t *judge_row(const Judge *judge, JudgeTask task, uint64_t seed, long index, const ResultRow *a,
                         const ResultRow *b) {
    bool swapped = judge_swapped(seed, (uint64_t)index);
    const char *first = swapped ? b->response : a->response, *second = swapped ? a->response : b->response;
    char *prompt = judge_build_prompt(task, a->prompt, first, second);
    json_t *messages = json_pack("[o]", message("user", prompt));
    free(prompt);
    char *reply = ask(judge, messages), *first_reply = NULL;
    JudgePosition position = reply ? judge_parse_verdict(reply) : JUDGE_INVALID;
    if (reply && position == JUDGE_INVALID) {
        json_array_append_new(messages, message("assistant", reply));
        json_array_append_new(messages, message("user", judge_reminder()));
        first_reply = reply;
        reply = ask(judge, messages);
        if (reply) position = judge_parse_verdict(reply);
    }
    json_decref(messages);
    if (!reply) {
        free(first_reply);
        return NULL;
    }
    const char *won = judge_position_name(position);
    json_t *row = json_pack("{s:I, s:s, s:s, s:s, s:b, s:s, s:o, s:s}", "index", (json_int_t)index, "prompt",
                            a->prompt, "response_a", a->response, "response_b", b->response, "swapped", swapped,
                            "verdict", judge_verdict_name(judge_unswap(position, swapped)), "position_won",
                            won ? json_string(won) : json_null(), "reply", reply);
    if (first_reply) json_object_set_new(row, "first_reply", json_string(first_reply));
    json_object_set_new(row, "task", json_string(judge_task_name(task)));
    json_object_set_new(row, "judge_model", json_string(judge->judge_model));
    free(reply), free(first_reply);
    return row;
}

static char *row_line(json_t *row) {
    char *text = json_dumps(row, JSON_COMPACT | JSON_PRESERVE_ORDER);
    size_t n = strlen(text);
    text = xrealloc(text, n + 2);
    text[n] = '\n', text[n + 1] = '\0';
    return text;
}

static json_t *nullable_real(double x) { return isnan(x) ? json_null() : json_real(x); }

int cmd_judge(int argc, char **argv) {
    char *task_name = NULL, *output = NULL, *api_base = "http://127.0.0.1:8080/v1", *judge_model = "gpt-4o";
    long seed = 1234, retries = 4, max_tokens = 256, limit = 0;
    double timeout_s = 60, backoff_s = 1;
    bool overwrite = false, quiet = false;
    Option options[] = {
        {"task", "dataset", OPT_STRING, &task_name, "summarization, dialogue or qa: the judging criteria", true, false},
        {"output", "save_path", OPT_STRING, &output, "JSONL of verdicts, one per row (also OUTPUT.summary.json)", true, false},
        {"api-base", "base_url", OPT_STRING, &api_base, "OpenAI-compatible API base (key: $OPENAI_API_KEY, optional)", false, false},
        {"judge-model", NULL, OPT_STRING, &judge_model, "the \"model\" of each request", false, false},
        {"seed", NULL, OPT_INT, &seed, "seed of the per-row choice of which model is shown first", false, false},
        {"timeout-s", NULL, OPT_FLOAT, &timeout_s, "seconds allowed for one request", false, false},
        {"retries", NULL, OPT_INT, &retries, "further attempts on network errors, timeouts, 429 and 5xx", false, false},
        {"backoff-s", NULL, OPT_FLOAT, &backoff_s, "first wait before a retry (doubles each time, at most 60 s)", false, false},
        {"max-tokens", "max_tokens", OPT_INT, &max_tokens, "reply length limit of the judge", false, false},
        {"limit", NULL, OPT_INT, &limit, "judge only the first N rows (0: all)", false, false},
        {"overwrite", NULL, OPT_BOOL, &overwrite, "replace an existing output; discard saved verdicts of a different run", false, false},
        {"quiet", NULL, OPT_BOOL, &quiet, "no progress line", false, false},
    };
    const char *inputs[2];
    OptionSet set = {"judge", "Pairwise LLM judge of two results files over an OpenAI-compatible chat-completions API.",
                     "marlhf judge A.jsonl B.jsonl --task summarization|dialogue|qa --output VERDICTS.jsonl [options]",
                     options, sizeof options / sizeof options[0], inputs, 2, 0};
    options_parse(&set, argc, argv);
    if (set.num_positional != 2)
        die_user("give two results files: marlhf judge A.jsonl B.jsonl --task T --output FILE (--help)");
    JudgeTask task;
    if (judge_task_parse(task_name, "--task", &task) != 0) die_from_err();
    if (!(timeout_s > 0) || retries < 0 || retries > 100 || !(backoff_s >= 0) || max_tokens < 1 || limit < 0)
        die_user("--timeout-s must be > 0, --retries in 0..100, --backoff-s >= 0, --max-tokens >= 1, --limit >= 0");
    if (!*judge_model) die_user("--judge-model must not be empty");
    char *url = endpoint_url(api_base);
    if (fs_is_file(output) && !overwrite) die_user("%s exists; give --overwrite to replace it (--output)", output);
    if (fs_is_dir(output)) die_user("%s is a folder (--output)", output);

    long count_a, count_b;
    ResultRow *a = load_results(inputs[0], &count_a), *b = load_results(inputs[1], &count_b);
    if (count_a != count_b)
        die_user("%s has %ld rows but %s has %ld; judge results on the same prompts", inputs[0], count_a, inputs[1],
                 count_b);
    if (count_a == 0) die_user("no rows in %s", inputs[0]);
    for (long i = 0; i < count_a; i++)
        if (strcmp(a[i].prompt, b[i].prompt))
            die_user("the prompts of row %ld differ (%s:%ld, %s:%ld); judge results on the same prompts", i, inputs[0],
                     a[i].line, inputs[1], b[i].line);
    long n = limit > 0 && limit < count_a ? limit : count_a;

    size_t partial_size = strlen(output) + 16;
    char *partial_path = xmalloc(partial_size), *dir = fs_dirname(output);
    snprintf(partial_path, partial_size, "%s.partial", output);
    if (fs_mkdir_p(dir) != 0) die_from_err();
    // Saved verdicts of this very run are resumed even with --overwrite (which then only
    // replaces the finished output), so "run the same command again" always resumes.
    RunIdentity id = {judge_task_name(task), judge_model, (uint64_t)seed, a, b};
    long saved;
    json_t **rows;
    if (load_partial(partial_path, &id, n, &rows, &saved) != 0) {
        if (!overwrite) die_from_err();
        if (unlink(partial_path) != 0) die_user("cannot remove %s: %s", partial_path, strerror(errno));
        rows = NULL, saved = 0;
    }
    rows = xrealloc(rows, (size_t)n * sizeof *rows);
    FILE *partial = NULL; // opened with the first new verdict: a run that judges nothing leaves no file
    if (saved > 0 && !quiet) fprintf(stderr, "judge: resuming after %ld saved verdicts in %s\n", saved, partial_path);

    const char *key = getenv("OPENAI_API_KEY");
    HttpClientOptions http = {url, key, timeout_s, (int)retries, backoff_s, 60};
    Judge judge = {http_client_new(&http), judge_model, max_tokens};
    Progress progress;
    progress_start(&progress, "judge", n - saved, "rows");
    progress.quiet = quiet;
    for (long i = saved; i < n; i++) {
        json_t *row = judge_row(&judge, task, (uint64_t)seed, i, &a[i], &b[i]);
        if (!row && i == 0) die_user("%s (row 0 of %s)", err_msg(), inputs[0]);
        if (!row)
            die_user("%s (row %ld of %s; %ld verdicts saved in %s: run the same command again to resume)", err_msg(), i,
                     inputs[0], i, partial_path);
        if (!partial) {
            partial = fopen(partial_path, "a");
            if (!partial || fs_fsync_dir(dir) != 0) die_user("cannot write %s: %s", partial_path, strerror(errno));
        }
        char *line = row_line(row);
        if (fputs(line, partial) == EOF || fflush(partial) != 0 || fsync(fileno(partial)) != 0)
            die_user("cannot write %s: %s", partial_path, strerror(errno));
        free(line);
        rows[i] = row;
        progress_update(&progress, 1, NULL);
    }
    progress_finish(&progress, NULL);
    http_client_free(judge.client);
    if (partial) fclose(partial);

    JudgeCounts counts = {0};
    size_t size = 0;
    char *text = NULL;
    FILE *out = open_memstream(&text, &size);
    CHECK(out, "open_memstream failed");
    for (long i = 0; i < n; i++) {
        JudgeVerdict verdict;
        JudgePosition position;
        judge_verdict_from_name(json_string_value(json_object_get(rows[i], "verdict")), &verdict);
        judge_position_from_name(json_string_value(json_object_get(rows[i], "position_won")), &position);
        judge_counts_add(&counts, verdict, position);
        char *line = row_line(rows[i]);
        fputs(line, out);
        free(line);
    }
    fclose(out);

    long valid = judge_counts_valid(&counts);
    double rate = judge_win_rate_a(&counts), first_rate = judge_first_position_rate(&counts), low, high;
    judge_wilson_interval(counts.wins_a + 0.5 * counts.ties, valid, 1.959963984540054, &low, &high);
    json_t *summary = json_object();
    json_object_set_new(summary, "a", json_string(inputs[0]));
    json_object_set_new(summary, "b", json_string(inputs[1]));
    json_object_set_new(summary, "task", json_string(judge_task_name(task)));
    json_object_set_new(summary, "judge_model", json_string(judge_model));
    json_object_set_new(summary, "api_base", json_string(api_base));
    json_object_set_new(summary, "seed", json_integer(seed));
    json_object_set_new(summary, "rows", json_integer(n));
    json_object_set_new(summary, "wins_a", json_integer(counts.wins_a));
    json_object_set_new(summary, "wins_b", json_integer(counts.wins_b));
    json_object_set_new(summary, "ties", json_integer(counts.ties));
    json_object_set_new(summary, "invalid", json_integer(counts.invalid));
    json_object_set_new(summary, "valid", json_integer(valid));
    json_object_set_new(summary, "win_rate_a", nullable_real(rate));
    json_object_set_new(summary, "win_rate_a_ci95", valid ? json_pack("[f, f]", low, high) : json_null());
    json_object_set_new(summary, "interval", json_string("wilson score, ties counted as half a win"));
    json_object_set_new(summary, "first_position_wins", json_integer(counts.first_wins));
    json_object_set_new(summary, "second_position_wins", json_integer(counts.second_wins));
    json_object_set_new(summary, "first_position_win_fraction", nullable_real(first_rate));
    char *summary_text = json_dumps(summary, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(6));
    json_decref(summary);
    size_t summary_length = strlen(summary_text);
    summary_text = xrealloc(summary_text, summary_length + 2);
    strcpy(summary_text + summary_length, "\n");
    char *summary_file = judge_summary_path(output);
    // The verdicts first: once they exist the partial file is redundant, and a crash
    // before the summary leaves nothing a rerun with --overwrite cannot rebuild.
    if (fs_write_file_atomic(output, text, size) != 0 ||
        fs_write_file_atomic(summary_file, summary_text, summary_length + 1) != 0)
        die_from_err();
    if (unlink(partial_path) != 0 && errno != ENOENT) die_user("cannot remove %s: %s", partial_path, strerror(errno));

    printf("judge: %ld rows, %s (A) vs %s (B), judged by %s\n", n, inputs[0], inputs[1], judge_model);
    printf("A wins %ld, B wins %ld, ties %ld, invalid %ld\n", counts.wins_a, counts.wins_b, counts.ties, counts.invalid);
    if (valid)
        printf("win rate of A %.3f (95%% Wilson interval %.3f-%.3f, ties count half) over %ld valid verdicts\n", rate,
               low, high, valid);
    else
        printf("win rate of A: no valid verdicts\n");
    if (valid)
        printf("first-shown position won %.3f of valid verdicts (first %ld, second %ld, ties %ld)\n", first_rate,
               counts.first_wins, counts.second_wins, counts.ties);
    printf("verdicts -> %s, summary -> %s\n", output, summary_file);

    free_rows(rows, n);
    for (long i = 0; i < count_a; i++) json_decref(a[i].json), json_decref(b[i].json);
    free(a), free(b), free(text), free(summary_text), free(summary_file), free(partial_path), free(dir),
        free(url);
    return 0;
}
