// The gold sentiment score of the Jane Austen task (src/eval/lexicon.[ch]) against the
// Python one that built the task (tools/build_austen_task.py wrote
// tests/fixtures/lexicon/scores.jsonl: edge cases, then texts of every data/austen file),
// hand-computed cases, and damaged lexicon files (-1 with file:line).
#include <stdint.h>
#include <unistd.h>

#include "core/check.h"
#include "eval/lexicon.h"
#include "io/jsonl.h"
#include "test.h"

#define LEXICON_TSV "data/austen/lexicon.tsv"
#define FIXTURES "tests/fixtures/lexicon"

static void test_scores_match_python(void) {
    Lexicon *lex = NULL;
    EXPECT(lexicon_load(&lex, LEXICON_TSV) == 0, "%s", err_msg());
    if (!lex) return;
    EXPECT(lexicon_size(lex) == 3375, "%ld phrases", lexicon_size(lex));
    JsonlReader reader;
    EXPECT(jsonl_open(&reader, FIXTURES "/scores.jsonl", 0) == 0, "%s", err_msg());
    if (!reader.file) {
        lexicon_free(lex);
        return;
    }
    json_t *row;
    int rc, rows = 0, wrong = 0, nonzero = 0, clipped = 0;
    double worst = 0;
    while ((rc = jsonl_next(&reader, &row)) == 1) {
        json_t *text = json_object_get(row, "text");
        double expect = json_number_value(json_object_get(row, "score"));
        double expect_sum = json_number_value(json_object_get(row, "sum"));
        json_int_t expect_words = json_integer_value(json_object_get(row, "words"));
        EXPECT(json_is_string(text) && json_is_number(json_object_get(row, "score")), "line %ld",
               reader.line_number);
        if (!json_is_string(text)) {
            json_decref(row);
            continue;
        }
        double sum;
        long words;
        lexicon_parts(lex, json_string_value(text), json_string_length(text), &sum, &words);
        double got = lexicon_score_n(lex, json_string_value(text), json_string_length(text));
        double diff = fabs(got - expect);
        if (diff > worst) worst = diff;
        if (!(diff <= 1e-12) || sum != expect_sum || words != (long)expect_words) {
            if (wrong++ < 5)
                fprintf(stderr, "  line %ld: score %.17g sum %g words %ld, Python %.17g %g %lld: %.60s\n",
                        reader.line_number, got, sum, words, expect, expect_sum,
                        (long long)expect_words, json_string_value(text));
        }
        nonzero += got != 0;
        clipped += fabs(got) == LEXICON_CLIP;
        rows++;
        json_decref(row);
    }
    EXPECT(rc == 0, "%s", err_msg());
    EXPECT(rows >= 300, "only %d rows", rows);
    EXPECT(nonzero >= rows / 2 && clipped >= 5, "%d nonzero, %d clipped of %d", nonzero, clipped, rows);
    EXPECT(wrong == 0, "%d of %d scores differ from Python (worst %.3g)", wrong, rows, worst);
    jsonl_close(&reader);
    lexicon_free(lex);
}

static void write_file(const char *path, const char *content) {
    FILE *f = fopen(path, "wb");
    CHECK(f, "cannot write %s", path);
    fputs(content, f);
    fclose(f);
}

static void tmp_path(char *out, size_t size, const char *name) {
    const char *dir = getenv("MARLHF_TEST_TMP") ? getenv("MARLHF_TEST_TMP") : "/tmp";
    snprintf(out, size, "%s/test_lexicon_%ld_%s", dir, (long)getpid(), name);
}

// A small lexicon, scored by hand.
static void test_hand_cases(void) {
    char path[512];
    tmp_path(path, sizeof path, "small.tsv");
    write_file(path, "# a comment\n\ngood\t3\nbad\t-3\nnot good\t-2\nnot good at all\t-4\n"
                     "kind\t2\nkind of\t0\ndon't\t-1\nhalf\t0.5\nhalfway\t-0.25\n");
    Lexicon *lex = NULL;
    EXPECT(lexicon_load(&lex, path) == 0, "%s", err_msg());
    if (!lex) return;
    EXPECT(lexicon_size(lex) == 9, "%ld", lexicon_size(lex));
    struct { const char *text; double sum; long words; } cases[] = {
        {"", 0, 0},
        {" ,.;--'' ' \xe2\x80\x99", 0, 0},
        {"Good", 3, 1},
        {"GOOD good gOOd.", 9, 3},
        {"not good", -2, 2},
        {"Not--good!", -2, 2},
        {"not good at all, good", -4 + 3, 5},
        {"not good at", -2, 3},
        {"a kind of kind", 2, 4},
        {"'good' \"bad\"", 0, 2},
        {"don't", -1, 1},
        {"DON\xe2\x80\x99T \xe2\x80\x98good\xe2\x80\x99", -1 + 3, 2},
        {"don\xe2\x80\x9dt", 0, 2},    // U+201D is not an apostrophe: "don", "t"
        {"don\xe2\x80", 0, 1},         // a cut-off sequence separates
        {"caf\xc3\xa9 good\xc3\xa9", 3, 2}, // non-ASCII bytes separate words
        {"\xff\xfegood\xff", 3, 1},    // so do bytes that are not UTF-8
        {"good_bad", 0, 2},
        {"good1 2bad", 0, 2},
        {"half halfway", 0.25, 2},
        {"'''good'''s", 0, 1},         // "good'''s" after stripping: not "good"
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        double sum;
        long words;
        lexicon_parts(lex, cases[i].text, strlen(cases[i].text), &sum, &words);
        EXPECT(sum == cases[i].sum && words == cases[i].words, "case %zu '%s': sum %g words %ld",
               i, cases[i].text, sum, words);
        double score = lexicon_score(lex, cases[i].text);
        double expect = words ? fmin(3.0, fmax(-3.0, cases[i].sum / sqrt((double)cases[i].words))) : 0;
        EXPECT(score == expect, "case %zu: score %.17g, expected %.17g", i, score, expect);
    }
    EXPECT(lexicon_score(lex, "good good good good") == 3.0, "clipped at +3");
    EXPECT(lexicon_score(lex, "good bad bad x x x x x") == -3.0 / sqrt(8.0), "mixed");
    EXPECT(lexicon_score(lex, "bad bad bad bad bad bad bad bad bad") == -3.0, "clipped at -3");
    // An embedded NUL separates words when the length is given.
    double sum;
    long words;
    lexicon_parts(lex, "good\0good", 9, &sum, &words);
    EXPECT(sum == 6 && words == 2, "NUL: sum %g words %ld", sum, words);
    // A long text of many words (the word arrays are sized from the length).
    size_t n = 200001;
    char *big = xmalloc(n + 1);
    for (size_t i = 0; i < n; i++) big[i] = i % 2 ? ' ' : 'x';
    big[n] = '\0';
    lexicon_parts(lex, big, n, &sum, &words);
    EXPECT(sum == 0 && words == 100001, "many words: %ld", words);
    free(big);
    lexicon_free(lex);
    unlink(path);
}

static void expect_bad(const char *file, long line, const char *what) {
    char path[512];
    snprintf(path, sizeof path, FIXTURES "/%s", file);
    Lexicon *lex = (Lexicon *)(uintptr_t)1;
    err_clear();
    int rc = lexicon_load(&lex, path);
    char where[600];
    snprintf(where, sizeof where, "(%s:%ld)", path, line);
    EXPECT(rc == -1 && lex == NULL, "%s: loaded", file);
    EXPECT(strstr(err_msg(), where) != NULL, "%s: message '%s' should name %s", file, err_msg(), where);
    EXPECT(strstr(err_msg(), what) != NULL, "%s: message '%s' should say '%s'", file, err_msg(), what);
    if (rc == 0) lexicon_free(lex);
}

static void test_bad_lexicons(void) {
    expect_bad("bad_no_tab.tsv", 2, "no tab");
    expect_bad("bad_valence.tsv", 2, "valence");
    expect_bad("bad_valence_empty.tsv", 3, "valence");
    expect_bad("bad_valence_exponent.tsv", 2, "valence");
    expect_bad("bad_upper.tsv", 3, "phrase");
    expect_bad("bad_char.tsv", 2, "phrase");
    expect_bad("bad_apostrophe_edge.tsv", 2, "phrase");
    expect_bad("bad_double_space.tsv", 2, "phrase");
    expect_bad("bad_empty_phrase.tsv", 2, "phrase");
    expect_bad("bad_duplicate.tsv", 3, "twice");
    expect_bad("bad_too_long.tsv", 2, "limit");
    expect_bad("bad_two_tabs.tsv", 2, "valence");
    expect_bad("bad_non_ascii.tsv", 2, "phrase");

    // Made here: CRLF line ends, a NUL byte, no entries, a missing file.
    char path[512];
    tmp_path(path, sizeof path, "crlf.tsv");
    write_file(path, "good\t3\r\n");
    Lexicon *lex = NULL;
    EXPECT(lexicon_load(&lex, path) == -1 && !lex, "CRLF accepted");
    char where[600];
    snprintf(where, sizeof where, "(%s:1)", path);
    EXPECT(strstr(err_msg(), where), "CRLF: '%s'", err_msg());
    unlink(path);

    tmp_path(path, sizeof path, "nul.tsv");
    FILE *f = fopen(path, "wb");
    CHECK(f, "cannot write %s", path);
    fwrite("good\t3\nba\0d\t-3\n", 1, 15, f);
    fclose(f);
    EXPECT(lexicon_load(&lex, path) == -1 && !lex, "NUL accepted");
    snprintf(where, sizeof where, "(%s:2)", path);
    EXPECT(strstr(err_msg(), where) && strstr(err_msg(), "NUL"), "NUL: '%s'", err_msg());
    unlink(path);

    tmp_path(path, sizeof path, "empty.tsv");
    write_file(path, "# nothing\n\n");
    EXPECT(lexicon_load(&lex, path) == -1 && !lex, "empty lexicon accepted");
    EXPECT(strstr(err_msg(), "no entries") && strstr(err_msg(), path), "empty: '%s'", err_msg());
    unlink(path);

    EXPECT(lexicon_load(&lex, FIXTURES "/no_such_file.tsv") == -1 && !lex, "missing file");
    EXPECT(strstr(err_msg(), FIXTURES "/no_such_file.tsv"), "missing: '%s'", err_msg());

    // The last line may lack its newline; '#' only starts a comment at the line start.
    tmp_path(path, sizeof path, "nonl.tsv");
    write_file(path, "#x\ngood\t3\nbad\t-3");
    EXPECT(lexicon_load(&lex, path) == 0 && lex, "%s", err_msg());
    if (lex) {
        EXPECT(lexicon_size(lex) == 2 && lexicon_score(lex, "bad") == -3.0, "last line");
        lexicon_free(lex);
    }
    unlink(path);
}

int main(void) {
    RUN(test_scores_match_python);
    RUN(test_hand_cases);
    RUN(test_bad_lexicons);
    TEST_EXIT();
}
