// The session of `marlhf human-eval`: which order each row is shown in, what an answer
// means for the two models, the partial file that makes a session resumable, and the
// statistics at the end. No HTTP and no terminal here (cli/cmd_human_eval.c has both).
#include "eval/human_eval.h"
#include "eval/judge.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "core/check.h"
#include "core/rng.h"
#include "io/fs.h"

int human_choice_parse(const char *text, HumanChoice *choice) {
    static const struct {
        const char *word;
        HumanChoice choice;
    } words[] = {{"1", HUMAN_FIRST}, {"2", HUMAN_SECOND}, {"tie", HUMAN_TIE},
                 {"t", HUMAN_TIE},   {"skip", HUMAN_SKIP}, {"s", HUMAN_SKIP}};
    if (!text) return err_set("no choice given: 1, 2, tie or skip");
    while (isspace((unsigned char)*text)) text++;
    size_t n = strlen(text);
    while (n > 0 && isspace((unsigned char)text[n - 1])) n--;
    for (size_t i = 0; i < sizeof words / sizeof words[0]; i++)
        if (n == strlen(words[i].word) && !strncasecmp(text, words[i].word, n)) {
            *choice = words[i].choice;
            return 0;
        }
    return err_set("unknown choice '%.*s': 1, 2, tie or skip", n > 40 ? 40 : (int)n, text);
}

const char *human_choice_name(HumanChoice choice) {
    switch (choice) {
    case HUMAN_FIRST: return "1";
    case HUMAN_SECOND: return "2";
    case HUMAN_TIE: return "tie";
    case HUMAN_SKIP: return "skip";
    }
    return "?";
}

bool human_eval_swapped(uint64_t seed, long index) { return rng_below(seed, (uint64_t)index, 0, 2) == 1; }

JudgeVerdict human_eval_verdict(HumanChoice choice, bool swapped) {
    switch (choice) {
    case HUMAN_FIRST: return judge_unswap(JUDGE_FIRST, swapped);
    case HUMAN_SECOND: return judge_unswap(JUDGE_SECOND, swapped);
    case HUMAN_TIE: return VERDICT_TIE;
    case HUMAN_SKIP: return VERDICT_INVALID;
    }
    return VERDICT_INVALID;
}

const char *human_verdict_name(JudgeVerdict verdict) {
    return verdict == VERDICT_INVALID ? "skipped" : judge_verdict_name(verdict);
}

// --- the partial file ------------------------------------------------------------

static const char *string_of(const json_t *row, const char *key) {
    const char *value = json_string_value(json_object_get(row, key));
    return value ? value : "";
}

// Why saved row `index` cannot be continued by this session, or NULL when it can.
static const char *foreign_reason(const HumanEvalSession *s, const json_t *row, long index) {
    if (!json_is_object(row)) return "it is not a verdict row";
    json_t *at = json_object_get(row, "index"), *swapped = json_object_get(row, "swapped"),
           *seed = json_object_get(row, "seed");
    HumanChoice choice;
    if (!json_is_integer(at) || json_integer_value(at) != index) return "its index is out of order";
    if (!json_is_boolean(swapped) || !json_is_integer(seed) ||
        human_choice_parse(json_string_value(json_object_get(row, "choice")), &choice) != 0 ||
        !json_is_string(json_object_get(row, "verdict")))
        return "it is not a verdict row";
    if ((uint64_t)json_integer_value(seed) != s->seed || json_is_true(swapped) != human_eval_swapped(s->seed, index))
        return "it was judged with another --seed";
    if (strcmp(string_of(row, "verdict"), human_verdict_name(human_eval_verdict(choice, json_is_true(swapped)))))
        return "its verdict does not follow from its choice";
    const HumanEvalRow *r = &s->rows[index];
    if (strcmp(string_of(row, "prompt"), r->prompt) || strcmp(string_of(row, "response_a"), r->response_a) ||
        strcmp(string_of(row, "response_b"), r->response_b))
        return "its prompt or responses differ from the inputs";
    return NULL;
}

// Reads the saved verdicts into the session; -1 (err_set naming the line) at the first
// that does not belong to it.
static int load_partial(HumanEvalSession *s) {
    if (!fs_exists(s->partial_path)) return 0;
    char *data;
    size_t size;
    if (fs_read_file(s->partial_path, (size_t)1 << 32, &data, &size) != 0) return -1;
    size_t complete = size;
    while (complete > 0 && data[complete - 1] != '\n') complete--;
    // A crash in the middle of an append leaves a line without its newline: never a verdict.
    if (complete < size && truncate(s->partial_path, (off_t)complete) != 0) {
        free(data);
        return err_set("cannot cut the torn last line of %s: %s", s->partial_path, strerror(errno));
    }
    long line = 0;
    for (char *p = data, *end; p < data + complete; p = end + 1) {
        end = memchr(p, '\n', (size_t)(data + complete - p));
        line++;
        if (end == p || s->judged >= s->n) continue;
        json_error_t error;
        json_t *row = json_loadb(p, (size_t)(end - p), 0, &error);
        const char *why = row ? foreign_reason(s, row, s->judged) : error.text;
        if (why) {
            err_set("cannot resume from the saved verdicts: %s; remove the file or give --overwrite (%s:%ld)", why,
                    s->partial_path, line);
            json_decref(row);
            free(data);
            return -1;
        }
        s->verdicts[s->judged++] = row;
    }
    free(data);
    return 0;
}

static void drop_verdicts(HumanEvalSession *s) {
    for (long i = 0; i < s->judged; i++) json_decref(s->verdicts[i]);
    s->judged = 0;
}

int human_eval_open(HumanEvalSession *s, const HumanEvalRow *rows, long n, uint64_t seed, const char *partial_path,
                    bool discard_other) {
    *s = (HumanEvalSession){.rows = rows, .n = n, .seed = seed};
    s->verdicts = xcalloc(n > 0 ? (size_t)n : 1, sizeof(json_t *));
    s->partial_path = xstrdup(partial_path);
    s->dir = fs_dirname(partial_path);
    if (load_partial(s) == 0) return 0;
    drop_verdicts(s);
    if (discard_other && (unlink(s->partial_path) == 0 || errno == ENOENT)) return 0;
    if (discard_other) err_set("cannot remove %s: %s", s->partial_path, strerror(errno));
    human_eval_close(s);
    return -1;
}

void human_eval_close(HumanEvalSession *s) {
    drop_verdicts(s);
    if (s->partial) fclose(s->partial);
    free(s->verdicts), free(s->partial_path), free(s->dir);
    *s = (HumanEvalSession){0};
}

long human_eval_next(const HumanEvalSession *s) { return s->judged; }

void human_eval_shown(const HumanEvalSession *s, long index, const char **first, const char **second) {
    CHECK(index >= 0 && index < s->n, "row %ld of %ld", index, s->n);
    const HumanEvalRow *r = &s->rows[index];
    bool swapped = human_eval_swapped(s->seed, index);
    *first = swapped ? r->response_b : r->response_a;
    *second = swapped ? r->response_a : r->response_b;
}

static json_t *verdict_row(const HumanEvalSession *s, long index, HumanChoice choice, time_t when) {
    const HumanEvalRow *r = &s->rows[index];
    bool swapped = human_eval_swapped(s->seed, index);
    JudgeVerdict verdict = human_eval_verdict(choice, swapped);
    JudgePosition position = choice == HUMAN_FIRST ? JUDGE_FIRST : choice == HUMAN_SECOND ? JUDGE_SECOND
                             : choice == HUMAN_TIE ? JUDGE_TIE : JUDGE_INVALID;
    const char *won = judge_position_name(position);
    char stamp[32];
    struct tm utc;
    gmtime_r(&when, &utc);
    strftime(stamp, sizeof stamp, "%Y-%m-%dT%H:%M:%SZ", &utc);
    json_t *row = json_pack("{s:I, s:s, s:s, s:s, s:b, s:s, s:s, s:o, s:I, s:s}", "index", (json_int_t)index,
                            "prompt", r->prompt, "response_a", r->response_a, "response_b", r->response_b, "swapped",
                            swapped, "choice", human_choice_name(choice), "verdict", human_verdict_name(verdict),
                            "position_won", won ? json_string(won) : json_null(), "seed", (json_int_t)s->seed,
                            "timestamp", stamp);
    CHECK(row, "cannot build a verdict row (invalid UTF-8 in the inputs?)");
    if (r->has_rewards) {
        json_object_set_new(row, "reward_a", json_real(r->reward_a));
        json_object_set_new(row, "reward_b", json_real(r->reward_b));
    }
    return row;
}

static char *row_line(const json_t *row) {
    char *text = json_dumps(row, JSON_COMPACT | JSON_PRESERVE_ORDER);
    size_t n = strlen(text);
    text = xrealloc(text, n + 2);
    text[n] = '\n', text[n + 1] = '\0';
    return text;
}

int human_eval_record(HumanEvalSession *s, long index, HumanChoice choice, time_t when) {
    if (s->judged >= s->n) return err_set("every row is judged already");
    if (index != s->judged) return err_set("row %ld is not the one being judged (row %ld is)", index, s->judged);
    if (!s->partial) {
        // A new file's name is only durable once its folder is synced.
        s->partial = fopen(s->partial_path, "a");
        if (!s->partial) return err_set("cannot write %s: %s", s->partial_path, strerror(errno));
        if (fs_fsync_dir(s->dir) != 0) return -1;
    }
    json_t *row = verdict_row(s, index, choice, when);
    char *line = row_line(row);
    bool ok = fputs(line, s->partial) != EOF && fflush(s->partial) == 0 && fsync(fileno(s->partial)) == 0;
    free(line);
    if (!ok) {
        int saved = errno;
        json_decref(row);
        // What reached the file may be a torn line; the next open cuts it off.
        return err_set("cannot write %s: %s", s->partial_path, strerror(saved));
    }
    s->verdicts[s->judged++] = row;
    return 0;
}

// --- the end ----------------------------------------------------------------------

void human_eval_summarize(const HumanEvalSession *s, HumanEvalSummary *out) {
    *out = (HumanEvalSummary){.rows = s->n, .judged = s->judged};
    for (long i = 0; i < s->judged; i++) {
        const char *verdict = string_of(s->verdicts[i], "verdict");
        const char *won = string_of(s->verdicts[i], "position_won");
        if (!strcmp(verdict, "A")) out->wins_a++;
        else if (!strcmp(verdict, "B")) out->wins_b++;
        else if (!strcmp(verdict, "tie")) out->ties++;
        else out->skipped++;
        out->first_wins += !strcmp(won, "first");
        out->second_wins += !strcmp(won, "second");
    }
    out->valid = out->wins_a + out->wins_b + out->ties;
    out->win_rate_a = out->valid ? (out->wins_a + 0.5 * out->ties) / (double)out->valid : NAN;
    judge_wilson_interval(out->wins_a + 0.5 * out->ties, out->valid, 1.959963984540054, &out->low, &out->high);
}

json_t *human_eval_summary_json(const HumanEvalSummary *m) {
    json_t *o = json_object();
    json_object_set_new(o, "rows", json_integer(m->rows));
    json_object_set_new(o, "judged", json_integer(m->judged));
    json_object_set_new(o, "wins_a", json_integer(m->wins_a));
    json_object_set_new(o, "wins_b", json_integer(m->wins_b));
    json_object_set_new(o, "ties", json_integer(m->ties));
    json_object_set_new(o, "skipped", json_integer(m->skipped));
    json_object_set_new(o, "valid", json_integer(m->valid));
    json_object_set_new(o, "win_rate_a", m->valid ? json_real(m->win_rate_a) : json_null());
    json_object_set_new(o, "win_rate_a_ci95", m->valid ? json_pack("[f, f]", m->low, m->high) : json_null());
    json_object_set_new(o, "interval", json_string("wilson score, ties counted as half a win, skips left out"));
    json_object_set_new(o, "first_position_wins", json_integer(m->first_wins));
    json_object_set_new(o, "second_position_wins", json_integer(m->second_wins));
    return o;
}

int human_eval_write_results(HumanEvalSession *s, const char *output, const json_t *summary) {
    if (s->judged < s->n) return err_set("%ld of %ld rows are not judged yet", s->n - s->judged, s->n);
    size_t size = 0;
    char *text = NULL;
    FILE *out = open_memstream(&text, &size);
    CHECK(out, "open_memstream failed");
    for (long i = 0; i < s->n; i++) {
        char *line = row_line(s->verdicts[i]);
        fputs(line, out);
        free(line);
    }
    fclose(out);
    char *summary_text = json_dumps(summary, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(6));
    size_t summary_length = strlen(summary_text);
    summary_text = xrealloc(summary_text, summary_length + 2);
    strcpy(summary_text + summary_length, "\n");
    char *summary_file = judge_summary_path(output);
    // The verdicts first: once they exist the partial file is redundant.
    int rc = fs_write_file_atomic(output, text, size) == 0 &&
                     fs_write_file_atomic(summary_file, summary_text, summary_length + 1) == 0
                 ? 0
                 : -1;
    free(text), free(summary_text), free(summary_file);
    if (rc != 0) return -1;
    if (s->partial) fclose(s->partial);
    s->partial = NULL;
    if (unlink(s->partial_path) != 0 && errno != ENOENT)
        return err_set("cannot remove %s: %s", s->partial_path, strerror(errno));
    return 0;
}
