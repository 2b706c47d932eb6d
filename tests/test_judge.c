// The pairwise judge's pure parts (src/eval/judge.[ch]): reading verdicts from tricky
// replies, mapping positions back to models under the seeded swap, the Wilson interval
// against published values, the prompts, the statistics and the response envelope; and
// the HTTP client's error-message extraction.
#include <math.h>

#include "core/check.h"
#include "eval/http_client.h"
#include "eval/judge.h"
#include "test.h"

typedef struct {
    const char *reply;
    JudgePosition expect;
} ReplyCase;

static void test_parse_verdicts(void) {
    static const ReplyCase cases[] = {
        {"Preferred: A", JUDGE_FIRST},
        {"Preferred: B", JUDGE_SECOND},
        {"Preferred: tie", JUDGE_TIE},
        {"preferred: b", JUDGE_SECOND},
        {"PREFERRED: A", JUDGE_FIRST},
        {"Summary A is shorter but misses the point.\nPreferred: B", JUDGE_SECOND},
        {"**Preferred:** A", JUDGE_FIRST},
        {"**Preferred: B**", JUDGE_SECOND},
        {"Preferred: Summary A", JUDGE_FIRST},
        {"Preferred: Response B.", JUDGE_SECOND},
        {"Preferred response: A", JUDGE_FIRST},
        {"Preferred: 1", JUDGE_FIRST},
        {"Preferred: Response 2", JUDGE_SECOND},
        {"Preference: B", JUDGE_SECOND},
        {"Winner: A", JUDGE_FIRST},
        {"{\"preferred\": \"A\"}", JUDGE_FIRST},
        {"```json\n{\"comparison\": \"B is clearer\", \"preferred\": \"B\"}\n```", JUDGE_SECOND},
        {"{\"comparison\": \"equally good\", \"choice\": \"E\"}", JUDGE_TIE}, // the released HH format
        {"Preferred: A\nOn reflection, B covers more.\nPreferred: B", JUDGE_SECOND}, // the last one counts
        {"Preferred: [[A]]", JUDGE_FIRST},
        {"Preferred: \"B\"", JUDGE_SECOND},
        {"Preferred: Tie (both are equally good)", JUDGE_TIE},
        {"Preferred: equal", JUDGE_TIE},
        {"Preferred: neither", JUDGE_TIE},
        {"Preferred:\n\nB", JUDGE_SECOND},
        {"B", JUDGE_SECOND}, // a bare verdict, as the released summarization prompt asked
        {"**A**", JUDGE_FIRST},
        {"Tie.", JUDGE_TIE},
        {"Preferred: B (more concise)", JUDGE_SECOND},
        {"Preferred: A, Preferred: B or Preferred: tie.\nPreferred: A", JUDGE_FIRST}, // instructions echoed, then an answer
        // No verdict in these.
        {"", JUDGE_INVALID},
        {"Both responses have merits and flaws.", JUDGE_INVALID},
        {"Preferred: A or B", JUDGE_INVALID},
        {"Preferred: A/B", JUDGE_INVALID},
        {"Preferred: a summary that covers the main point", JUDGE_INVALID},
        {"Preferred: C", JUDGE_INVALID},
        {"Preferred: 3", JUDGE_INVALID},
        {"Preferred: None", JUDGE_INVALID},
        {"I have no preference between them.", JUDGE_INVALID},
        {"The preferred summary is the second one.", JUDGE_INVALID},
        {"A is better than B", JUDGE_INVALID},
        {"Preferred:", JUDGE_INVALID},
        {"Preferred: Ab", JUDGE_INVALID},
        {"{\"preferred\": null}", JUDGE_INVALID},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        JudgePosition got = judge_parse_verdict(cases[i].reply);
        EXPECT(got == cases[i].expect, "case %zu \"%s\": got %d, expected %d", i, cases[i].reply, got, cases[i].expect);
    }
    EXPECT(judge_parse_verdict(NULL) == JUDGE_INVALID, "NULL reply");
}

static void test_swap_mapping(void) {
    EXPECT(judge_unswap(JUDGE_FIRST, false) == VERDICT_A, "first, not swapped");
    EXPECT(judge_unswap(JUDGE_SECOND, false) == VERDICT_B, "second, not swapped");
    EXPECT(judge_unswap(JUDGE_FIRST, true) == VERDICT_B, "first, swapped: B was shown first");
    EXPECT(judge_unswap(JUDGE_SECOND, true) == VERDICT_A, "second, swapped");
    EXPECT(judge_unswap(JUDGE_TIE, true) == VERDICT_TIE, "tie");
    EXPECT(judge_unswap(JUDGE_INVALID, false) == VERDICT_INVALID, "invalid");
    // The coin is a pure function of (seed, row), fair, and depends on the seed.
    int swapped = 0, same_as_other_seed = 0;
    for (uint64_t row = 0; row < 10000; row++) {
        bool s = judge_swapped(1234, row);
        EXPECT(s == judge_swapped(1234, row), "not reproducible at row %lu", (unsigned long)row);
        swapped += s;
        same_as_other_seed += s == judge_swapped(99, row);
    }
    EXPECT(abs(swapped - 5000) < 250, "%d of 10000 swapped", swapped);
    EXPECT(abs(same_as_other_seed - 5000) < 250, "%d of 10000 equal across seeds", same_as_other_seed);
}

static void test_names_round_trip(void) {
    JudgeVerdict all_verdicts[] = {VERDICT_A, VERDICT_B, VERDICT_TIE, VERDICT_INVALID};
    for (int i = 0; i < 4; i++) {
        JudgeVerdict v;
        EXPECT(judge_verdict_from_name(judge_verdict_name(all_verdicts[i]), &v) == 0 && v == all_verdicts[i], "%d", i);
    }
    JudgePosition all_positions[] = {JUDGE_FIRST, JUDGE_SECOND, JUDGE_TIE, JUDGE_INVALID};
    for (int i = 0; i < 4; i++) {
        JudgePosition p;
        EXPECT(judge_position_from_name(judge_position_name(all_positions[i]), &p) == 0 && p == all_positions[i], "%d", i);
    }
    JudgeVerdict v;
    EXPECT(judge_verdict_from_name("C", &v) == -1, "unknown verdict name");
    JudgeTask task;
    EXPECT(judge_task_parse("dialogue", "--task", &task) == 0 && task == JUDGE_DIALOGUE, "dialogue");
    EXPECT(judge_task_parse("tldr", "--task", &task) == 0 && task == JUDGE_SUMMARIZATION, "tldr alias");
    EXPECT(judge_task_parse("poetry", "--task", &task) == -1 && strstr(err_msg(), "--task"), "%s", err_msg());
}

static void test_wilson_interval(void) {
    // Published 95% Wilson intervals (e.g. statsmodels proportion_confint(method="wilson")).
    static const struct {
        double successes;
        long n;
        double low, high;
    } cases[] = {
        {0, 10, 0.0, 0.2775}, {1, 10, 0.0179, 0.4042}, {5, 10, 0.2366, 0.7634},
        {8, 10, 0.4902, 0.9433}, {10, 10, 0.7225, 1.0}, {81, 263, 0.2553, 0.3662},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        double low, high;
        judge_wilson_interval(cases[i].successes, cases[i].n, 1.959963984540054, &low, &high);
        EXPECT_CLOSE(low, cases[i].low, 6e-5, 0, "low");
        EXPECT_CLOSE(high, cases[i].high, 6e-5, 0, "high");
    }
    double low, high;
    judge_wilson_interval(22.5, 45, 1.959963984540054, &low, &high); // half wins from ties: symmetric around 1/2
    EXPECT_CLOSE(low + high, 1.0, 1e-12, 0, "symmetric");
    judge_wilson_interval(0, 0, 1.96, &low, &high);
    EXPECT(low == 0 && high == 1, "no data: [%g, %g]", low, high);
}

static void test_counts(void) {
    JudgeCounts c = {0};
    judge_counts_add(&c, VERDICT_A, JUDGE_FIRST);
    judge_counts_add(&c, VERDICT_A, JUDGE_SECOND);
    judge_counts_add(&c, VERDICT_B, JUDGE_FIRST);
    judge_counts_add(&c, VERDICT_TIE, JUDGE_TIE);
    judge_counts_add(&c, VERDICT_INVALID, JUDGE_INVALID);
    EXPECT(c.wins_a == 2 && c.wins_b == 1 && c.ties == 1 && c.invalid == 1, "counts");
    EXPECT(judge_counts_valid(&c) == 4, "invalid verdicts are not valid");
    EXPECT_CLOSE(judge_win_rate_a(&c), 2.5 / 4, 1e-12, 0, "win rate: ties count half, invalid not at all");
    EXPECT_CLOSE(judge_first_position_rate(&c), 2.0 / 4, 1e-12, 0, "first position");
    JudgeCounts empty = {0};
    EXPECT(isnan(judge_win_rate_a(&empty)) && isnan(judge_first_position_rate(&empty)), "no valid verdicts");
}

static void test_prompts(void) {
    const JudgeTask tasks[] = {JUDGE_SUMMARIZATION, JUDGE_DIALOGUE, JUDGE_QA};
    const char *criteria[][3] = {{"precise", "concise", "irrelevant"},
                                 {"helpful", "harmless", "honest"},
                                 {"helpful", "accurate", "well-supported"}};
    for (int t = 0; t < 3; t++) {
        char *p = judge_build_prompt(tasks[t], "THE-PROMPT-TEXT", "FIRST-TEXT-xyz", "SECOND-TEXT-xyz");
        EXPECT(strstr(p, "THE-PROMPT-TEXT") && strstr(p, "FIRST-TEXT-xyz") && strstr(p, "SECOND-TEXT-xyz"), "%s", p);
        EXPECT(strstr(p, "FIRST-TEXT-xyz") < strstr(p, "SECOND-TEXT-xyz"), "first shown first");
        EXPECT(strstr(p, " A]\nFIRST-TEXT-xyz") && strstr(p, " B]\nSECOND-TEXT-xyz"), "labels: %s", p);
        for (int k = 0; k < 3; k++) EXPECT(strstr(p, criteria[t][k]), "task %d lacks '%s'", t, criteria[t][k]);
        EXPECT(strstr(p, "Preferred: A") && strstr(p, "Preferred: B") && strstr(p, "Preferred: tie"), "format");
        free(p);
    }
    EXPECT(strstr(judge_reminder(), "Preferred: A"), "reminder names the format");
}

static void test_response_envelope(void) {
    char *reply = judge_reply_from_response(
        "{\"choices\": [{\"index\": 0, \"message\": {\"role\": \"assistant\", \"content\": \"Preferred: B\"}}]}");
    EXPECT(reply && !strcmp(reply, "Preferred: B"), "%s", reply ? reply : "NULL");
    free(reply);
    reply = judge_reply_from_response("{\"choices\": [{\"message\": {\"role\": \"assistant\", \"content\": null}}]}");
    EXPECT(reply && !*reply, "null content is an empty reply");
    free(reply);
    EXPECT(!judge_reply_from_response("<html>bad gateway</html>") && strstr(err_msg(), "not JSON"), "%s", err_msg());
    EXPECT(!judge_reply_from_response("{\"choices\": []}") && strstr(err_msg(), "choices"), "%s", err_msg());
    EXPECT(!judge_reply_from_response("{\"error\": {\"message\": \"overloaded\"}}") && strstr(err_msg(), "overloaded"),
           "%s", err_msg());

    char *m = http_error_message("{\"error\": {\"message\": \"Incorrect API key\", \"type\": \"auth\"}}");
    EXPECT(!strcmp(m, "Incorrect API key"), "%s", m);
    free(m);
    m = http_error_message("{\"detail\": \"Not Found\"}");
    EXPECT(!strcmp(m, "Not Found"), "%s", m);
    free(m);
    m = http_error_message("plain\ntext");
    EXPECT(!strcmp(m, "plain text"), "%s", m);
    free(m);
}

int main(void) {
    RUN(test_parse_verdicts);
    RUN(test_swap_mapping);
    RUN(test_names_round_trip);
    RUN(test_wilson_interval);
    RUN(test_counts);
    RUN(test_prompts);
    RUN(test_response_envelope);
    TEST_EXIT();
}
