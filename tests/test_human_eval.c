// The human-eval session (src/eval/human_eval.[ch]): the seeded order of the responses,
// answers mapped back to the models, the partial file (resume, torn lines, a partial of
// another session refused), the finished output and the summary's numbers.
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/check.h"
#include "eval/human_eval.h"
#include "eval/judge.h"
#include "io/fs.h"
#include "test.h"

static char *tmp_dir;

static char *tmp_path(const char *name) { return fs_join(tmp_dir, name); }

#define NUM_ROWS 10
static char prompts[NUM_ROWS][32], texts_a[NUM_ROWS][32], texts_b[NUM_ROWS][32];
static HumanEvalRow rows[NUM_ROWS];

static void make_rows(void) {
    for (int i = 0; i < NUM_ROWS; i++) {
        snprintf(prompts[i], sizeof prompts[i], "prompt %d", i);
        snprintf(texts_a[i], sizeof texts_a[i], "model a says %d", i);
        snprintf(texts_b[i], sizeof texts_b[i], "model b says %d", i);
        rows[i] = (HumanEvalRow){prompts[i], texts_a[i], texts_b[i], i % 2 == 0, 0.25 * i, -0.5 * i};
    }
}

static long count_lines(const char *path) {
    char *data;
    size_t size;
    if (fs_read_file(path, 1 << 20, &data, &size) != 0) return -1;
    long lines = 0;
    for (size_t i = 0; i < size; i++) lines += data[i] == '\n';
    free(data);
    return lines;
}

static void test_choice_words(void) {
    static const struct {
        const char *text;
        HumanChoice choice;
    } good[] = {{"1", HUMAN_FIRST}, {"2", HUMAN_SECOND}, {"tie", HUMAN_TIE}, {"TIE", HUMAN_TIE}, {"t", HUMAN_TIE},
                {" s\n", HUMAN_SKIP}, {"skip", HUMAN_SKIP}, {"Skip", HUMAN_SKIP}};
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        HumanChoice choice = HUMAN_SKIP;
        int rc = human_choice_parse(good[i].text, &choice);
        EXPECT(rc == 0 && choice == good[i].choice, "'%s' -> rc %d choice %d", good[i].text, rc, (int)choice);
    }
    static const char *bad[] = {"", "3", "0", "x", "12", "tied", "1 2", "q"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        HumanChoice choice;
        EXPECT(human_choice_parse(bad[i], &choice) == -1, "'%s' accepted", bad[i]);
    }
    HumanChoice choice;
    EXPECT(human_choice_parse(NULL, &choice) == -1, "NULL accepted");
    EXPECT(!strcmp(human_choice_name(HUMAN_FIRST), "1") && !strcmp(human_choice_name(HUMAN_SECOND), "2") &&
               !strcmp(human_choice_name(HUMAN_TIE), "tie") && !strcmp(human_choice_name(HUMAN_SKIP), "skip"),
           "names");
}

static void test_swap_is_seeded_and_balanced(void) {
    long swapped = 0, differ = 0, n = 4000;
    for (long i = 0; i < n; i++) {
        bool s = human_eval_swapped(1234, i);
        EXPECT(s == human_eval_swapped(1234, i), "row %ld: not a function of (seed, row)", i);
        swapped += s;
        differ += s != human_eval_swapped(1235, i);
    }
    // Binomial(4000, 1/2): the standard deviation is ~32, so these bounds are ~6 sigma.
    EXPECT(swapped > 1800 && swapped < 2200, "%ld of %ld swapped", swapped, n);
    EXPECT(differ > 1800 && differ < 2200, "seeds 1234 and 1235 agree on %ld of %ld rows", n - differ, n);
    long runs = 1;
    for (long i = 1; i < n; i++) runs += human_eval_swapped(1234, i) != human_eval_swapped(1234, i - 1);
    EXPECT(runs > 1800 && runs < 2200, "%ld runs: the coins of neighbouring rows are not independent", runs);

    // What the session shows follows the coin.
    make_rows();
    char *partial = tmp_path("shown.partial");
    HumanEvalSession session;
    EXPECT(human_eval_open(&session, rows, NUM_ROWS, 99, partial, false) == 0, "open: %s", err_msg());
    for (long i = 0; i < NUM_ROWS; i++) {
        const char *first, *second;
        human_eval_shown(&session, i, &first, &second);
        bool s = human_eval_swapped(99, i);
        EXPECT(first == (s ? rows[i].response_b : rows[i].response_a) &&
                   second == (s ? rows[i].response_a : rows[i].response_b),
               "row %ld shown in the wrong order", i);
    }
    human_eval_close(&session);
    free(partial);
}

static void test_choices_map_back_to_models(void) {
    EXPECT(human_eval_verdict(HUMAN_FIRST, false) == VERDICT_A, "1 unswapped");
    EXPECT(human_eval_verdict(HUMAN_SECOND, false) == VERDICT_B, "2 unswapped");
    EXPECT(human_eval_verdict(HUMAN_FIRST, true) == VERDICT_B, "1 swapped");
    EXPECT(human_eval_verdict(HUMAN_SECOND, true) == VERDICT_A, "2 swapped");
    EXPECT(human_eval_verdict(HUMAN_TIE, true) == VERDICT_TIE && human_eval_verdict(HUMAN_TIE, false) == VERDICT_TIE,
           "tie");
    EXPECT(human_eval_verdict(HUMAN_SKIP, true) == VERDICT_INVALID, "skip");
    EXPECT(!strcmp(human_verdict_name(VERDICT_A), "A") && !strcmp(human_verdict_name(VERDICT_B), "B") &&
               !strcmp(human_verdict_name(VERDICT_TIE), "tie") && !strcmp(human_verdict_name(VERDICT_INVALID), "skipped"),
           "verdict names");

    // Through a session: the recorded row names the model whose text was shown where chosen.
    make_rows();
    char *partial = tmp_path("map.partial");
    HumanEvalSession session;
    EXPECT(human_eval_open(&session, rows, NUM_ROWS, 5, partial, false) == 0, "open: %s", err_msg());
    for (long i = 0; i < NUM_ROWS; i++) {
        const char *first, *second;
        human_eval_shown(&session, i, &first, &second);
        HumanChoice choice = i % 3 == 0 ? HUMAN_SECOND : HUMAN_FIRST;
        const char *chosen = choice == HUMAN_FIRST ? first : second;
        EXPECT(human_eval_record(&session, i, choice, 0) == 0, "record %ld: %s", i, err_msg());
        json_t *row = session.verdicts[i];
        const char *want = chosen[6] == 'a' ? "A" : "B"; // "model a says ..."
        EXPECT(!strcmp(json_string_value(json_object_get(row, "verdict")), want), "row %ld: verdict %s, chose '%s'", i,
               json_string_value(json_object_get(row, "verdict")), chosen);
        EXPECT(json_is_true(json_object_get(row, "swapped")) == human_eval_swapped(5, i), "row %ld: swapped", i);
        EXPECT(!strcmp(json_string_value(json_object_get(row, "position_won")), choice == HUMAN_FIRST ? "first" : "second"),
               "row %ld: position", i);
        EXPECT(!strcmp(json_string_value(json_object_get(row, "timestamp")), "1970-01-01T00:00:00Z"), "row %ld: time", i);
        EXPECT((json_object_get(row, "reward_a") != NULL) == rows[i].has_rewards, "row %ld: rewards", i);
    }
    human_eval_close(&session);
    unlink(partial);
    free(partial);
}

static void test_record_only_the_next_row(void) {
    make_rows();
    char *partial = tmp_path("order.partial");
    HumanEvalSession session;
    EXPECT(human_eval_open(&session, rows, 3, 1, partial, false) == 0, "open: %s", err_msg());
    EXPECT(!fs_exists(partial), "a session that records nothing writes no file");
    EXPECT(human_eval_record(&session, 1, HUMAN_FIRST, 0) == -1 && strstr(err_msg(), "row 0 is"), "row 1 first: %s",
           err_msg());
    EXPECT(human_eval_record(&session, 0, HUMAN_FIRST, 0) == 0, "row 0");
    EXPECT(human_eval_record(&session, 0, HUMAN_FIRST, 0) == -1, "row 0 twice");
    EXPECT(human_eval_record(&session, 1, HUMAN_SKIP, 0) == 0 && human_eval_record(&session, 2, HUMAN_TIE, 0) == 0,
           "rows 1, 2");
    EXPECT(human_eval_next(&session) == 3, "next %ld", human_eval_next(&session));
    EXPECT(human_eval_record(&session, 3, HUMAN_TIE, 0) == -1 && strstr(err_msg(), "every row"), "past the end");
    EXPECT(count_lines(partial) == 3, "%ld lines in the partial file", count_lines(partial));
    human_eval_close(&session);
    unlink(partial);
    free(partial);
}

static void test_resume(void) {
    make_rows();
    char *partial = tmp_path("resume.partial"), *output = tmp_path("resume.jsonl");
    HumanEvalSession session;
    EXPECT(human_eval_open(&session, rows, NUM_ROWS, 42, partial, false) == 0, "open: %s", err_msg());
    for (long i = 0; i < 4; i++) human_eval_record(&session, i, (HumanChoice)(i % 4), 1000 + i);
    json_t *saved[4];
    for (int i = 0; i < 4; i++) saved[i] = json_incref(session.verdicts[i]);
    human_eval_close(&session); // the person quits

    // A crash in the middle of the next append: a torn last line.
    FILE *f = fopen(partial, "a");
    fputs("{\"index\": 4, \"prompt\": \"pro", f);
    fclose(f);
    EXPECT(human_eval_open(&session, rows, NUM_ROWS, 42, partial, false) == 0, "reopen: %s", err_msg());
    EXPECT(session.judged == 4 && human_eval_next(&session) == 4, "resumed at %ld", human_eval_next(&session));
    for (int i = 0; i < 4; i++) EXPECT(json_equal(session.verdicts[i], saved[i]), "verdict %d changed", i);
    EXPECT(count_lines(partial) == 4, "the torn line was not cut");
    for (long i = 4; i < NUM_ROWS; i++)
        EXPECT(human_eval_record(&session, i, HUMAN_FIRST, 2000) == 0, "record %ld: %s", i, err_msg());
    json_t *summary = json_pack("{s:s}", "a", "x");
    EXPECT(human_eval_write_results(&session, output, summary) == 0, "write: %s", err_msg());
    json_decref(summary);
    human_eval_close(&session);
    EXPECT(count_lines(output) == NUM_ROWS, "%ld rows in the output", count_lines(output));
    EXPECT(!fs_exists(partial), "the partial file is left after the output");
    char *summary_file = tmp_path("resume.summary.json");
    EXPECT(fs_is_file(summary_file), "no summary file");

    // A smaller --limit later: the rows past it are ignored.
    FILE *copy = fopen(partial, "w");
    char *data;
    size_t size;
    fs_read_file(output, 1 << 20, &data, &size);
    fwrite(data, 1, size, copy);
    fclose(copy);
    free(data);
    EXPECT(human_eval_open(&session, rows, 3, 42, partial, false) == 0 && session.judged == 3, "limit 3: %s", err_msg());
    human_eval_close(&session);
    for (int i = 0; i < 4; i++) json_decref(saved[i]);
    unlink(partial), unlink(output), unlink(summary_file);
    free(partial), free(output), free(summary_file);
}

static void test_resume_refuses_another_session(void) {
    make_rows();
    char *partial = tmp_path("other.partial");
    HumanEvalSession session;
    human_eval_open(&session, rows, NUM_ROWS, 7, partial, false);
    for (long i = 0; i < 3; i++) human_eval_record(&session, i, HUMAN_FIRST, 0);
    human_eval_close(&session);

    EXPECT(human_eval_open(&session, rows, NUM_ROWS, 8, partial, false) == -1 && strstr(err_msg(), "another --seed") &&
               strstr(err_msg(), "other.partial:1"),
           "another seed: %s", err_msg());
    HumanEvalRow changed[NUM_ROWS];
    memcpy(changed, rows, sizeof changed);
    changed[1].response_b = "model b says something else";
    EXPECT(human_eval_open(&session, changed, NUM_ROWS, 7, partial, false) == -1 && strstr(err_msg(), "differ") &&
               strstr(err_msg(), "other.partial:2"),
           "other responses: %s", err_msg());
    FILE *f = fopen(partial, "a");
    fputs("not json\n", f);
    fclose(f);
    EXPECT(human_eval_open(&session, rows, NUM_ROWS, 7, partial, false) == -1 && strstr(err_msg(), "other.partial:4"),
           "garbage: %s", err_msg());
    // --overwrite: the foreign file goes and the session starts empty.
    EXPECT(human_eval_open(&session, rows, NUM_ROWS, 8, partial, true) == 0 && session.judged == 0, "discard: %s",
           err_msg());
    EXPECT(!fs_exists(partial), "the foreign partial file is still there");
    human_eval_close(&session);
    free(partial);
}

static void test_summary_numbers(void) {
    make_rows();
    char *partial = tmp_path("summary.partial");
    HumanEvalSession session;
    human_eval_open(&session, rows, NUM_ROWS, 3, partial, false);
    HumanEvalSummary m;
    human_eval_summarize(&session, &m);
    EXPECT(m.rows == NUM_ROWS && m.judged == 0 && m.valid == 0 && isnan(m.win_rate_a) && m.low == 0 && m.high == 1,
           "empty summary");
    // 8 wins of A and 2 of B, answered through whatever order each row was shown in.
    for (long i = 0; i < NUM_ROWS; i++) {
        bool want_a = i < 8, swapped = human_eval_swapped(3, i);
        human_eval_record(&session, i, want_a != swapped ? HUMAN_FIRST : HUMAN_SECOND, 0);
    }
    human_eval_summarize(&session, &m);
    EXPECT(m.wins_a == 8 && m.wins_b == 2 && m.ties == 0 && m.skipped == 0 && m.valid == 10, "counts %ld %ld", m.wins_a,
           m.wins_b);
    EXPECT(m.first_wins + m.second_wins == 10, "positions %ld + %ld", m.first_wins, m.second_wins);
    EXPECT_CLOSE(m.win_rate_a, 0.8, 1e-12, 0, "win rate 8/10");
    // The Wilson interval of 8/10 at 95%: 0.4902-0.9433 (published tables).
    EXPECT_CLOSE(m.low, 0.49016247153664183, 1e-9, 0, "low 8/10");
    EXPECT_CLOSE(m.high, 0.9433178485456247, 1e-9, 0, "high 8/10");
    human_eval_close(&session);
    unlink(partial);

    // 2 A, 1 B, 1 tie, 1 skip: the tie is half a win, the skip is not a verdict.
    human_eval_open(&session, rows, 5, 3, partial, false);
    const char *want[] = {"A", "B", "tie", "skip", "A"};
    for (long i = 0; i < 5; i++) {
        bool swapped = human_eval_swapped(3, i);
        HumanChoice choice = !strcmp(want[i], "tie") ? HUMAN_TIE : !strcmp(want[i], "skip") ? HUMAN_SKIP
                             : (!strcmp(want[i], "A") != swapped) ? HUMAN_FIRST : HUMAN_SECOND;
        human_eval_record(&session, i, choice, 0);
    }
    human_eval_summarize(&session, &m);
    EXPECT(m.wins_a == 2 && m.wins_b == 1 && m.ties == 1 && m.skipped == 1 && m.valid == 4 && m.judged == 5,
           "counts %ld %ld %ld %ld", m.wins_a, m.wins_b, m.ties, m.skipped);
    EXPECT_CLOSE(m.win_rate_a, 0.625, 1e-12, 0, "win rate 2.5/4");
    EXPECT_CLOSE(m.low, 0.21942652006536278, 1e-9, 0, "low 2.5/4");
    EXPECT_CLOSE(m.high, 0.908100770820988, 1e-9, 0, "high 2.5/4");
    json_t *o = human_eval_summary_json(&m);
    EXPECT(json_integer_value(json_object_get(o, "wins_a")) == 2 && json_integer_value(json_object_get(o, "skipped")) == 1 &&
               json_integer_value(json_object_get(o, "valid")) == 4 &&
               fabs(json_real_value(json_object_get(o, "win_rate_a")) - 0.625) < 1e-12 &&
               json_array_size(json_object_get(o, "win_rate_a_ci95")) == 2,
           "summary json");
    json_decref(o);
    human_eval_close(&session);
    unlink(partial);
    free(partial);

    char *path = judge_summary_path("out/v.jsonl");
    EXPECT(!strcmp(path, "out/v.summary.json"), "%s", path);
    free(path);
    path = judge_summary_path("verdicts");
    EXPECT(!strcmp(path, "verdicts.summary.json"), "%s", path);
    free(path);
}

int main(void) {
    char template[] = "/tmp/test_human_eval.XXXXXX";
    tmp_dir = mkdtemp(template);
    CHECK(tmp_dir, "mkdtemp failed");
    RUN(test_choice_words);
    RUN(test_swap_is_seeded_and_balanced);
    RUN(test_choices_map_back_to_models);
    RUN(test_record_only_the_next_row);
    RUN(test_resume);
    RUN(test_resume_refuses_another_session);
    RUN(test_summary_numbers);
    fs_remove_tree(tmp_dir);
    TEST_EXIT();
}
