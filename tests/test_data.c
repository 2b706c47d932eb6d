// Tests of src/data/: each dataset adapter on a small hand-written file in its Hugging
// Face schema (tests/fixtures/data/), with the exact prompt/chosen/rejected strings of
// MA-RLHF's DeepSpeed-Chat rules (spec 3.2); auto-detection and forced formats; the
// DS-Chat splits against numpy (tests/fixtures/data/splits.json, written by
// tools/make_split_fixtures.py: every index must match); prompt-length dropping with the
// SmolLM2 tokenizer; and bad data, each case an error naming file:line and the field,
// plus random damage to every fixture (never a crash).
#include <jansson.h>
#include <stdint.h>
#include <string.h>

#include "core/check.h"
#include "data/column_renames.h"
#include "data/dataset.h"
#include "data/mt19937.h"
#include "data/split.h"
#include "io/fs.h"
#include "tokenizer/tokenizer.h"
#include "test.h"

#define FIXTURES "tests/fixtures/data"
static const char *smollm2_path = "models/SmolLM2-135M-Instruct.Q4_1.gguf";

// --- helpers ---------------------------------------------------------------------------

static bool string_equal(const char *got, const char *expected) {
    if (!got || !expected) return got == expected;
    return strcmp(got, expected) == 0;
}

#define EXPECT_STR(got, expected)                                                               \
    do {                                                                                        \
        const char *got_ = (got), *expected_ = (expected);                                      \
        EXPECT(string_equal(got_, expected_), "%s:\n    got      \"%s\"\n    expected \"%s\"", #got, \
               got_ ? got_ : "(null)", expected_ ? expected_ : "(null)");                        \
    } while (0)

static bool load_or_fail(Dataset *dataset, const char *path, DataFormat format) {
    if (dataset_load(dataset, path, format, 0) == 0) return true;
    EXPECT(false, "loading %s: %s", path, err_msg());
    return false;
}

static char tmp_dir[512];

// Writes `length` bytes to a file of the test's temporary folder; returns its path
// (a static buffer per call slot: copy it if needed beyond the next call).
static const char *write_temp(const char *name, const char *bytes, size_t length) {
    static char path[8][600];
    static int slot;
    char *out = path[slot++ % 8];
    snprintf(out, 600, "%s/%s", tmp_dir, name);
    FILE *file = fopen(out, "wb");
    CHECK(file, "cannot write %s", out);
    CHECK(fwrite(bytes, 1, length, file) == length, "short write %s", out);
    fclose(file);
    return out;
}

static const char *write_text(const char *name, const char *text) { return write_temp(name, text, strlen(text)); }

// Loading `path` must fail with a message that holds "<path>:<line>" and `field`.
static void expect_load_error(const char *path, DataFormat format, size_t max_row_bytes, long line,
                              const char *field) {
    Dataset dataset;
    err_clear();
    int rc = dataset_load(&dataset, path, format, max_row_bytes);
    char where[700];
    snprintf(where, sizeof where, "%s:%ld", path, line);
    EXPECT(rc == -1, "loading %s should fail (wanted %s)", path, field);
    if (rc == 0) {
        dataset_free(&dataset);
        return;
    }
    EXPECT(strstr(err_msg(), where) != NULL, "message lacks \"%s\": %s", where, err_msg());
    EXPECT(strstr(err_msg(), field) != NULL, "message lacks \"%s\": %s", field, err_msg());
    EXPECT(strchr(err_msg(), '\n') == NULL, "message is not one line: %s", err_msg());
}

// --- adapters ----------------------------------------------------------------------------

static void test_tldr_comparisons(void) {
    Dataset d;
    if (!load_or_fail(&d, FIXTURES "/tldr_comparisons.jsonl", DATA_FORMAT_AUTO)) return;
    EXPECT(d.format == DATA_FORMAT_TLDR, "detected %s", data_format_name(d.format));
    EXPECT(d.count == 4, "%ld records", d.count);
    if (d.count != 4) goto done;
    const DataRecord *r = d.records;
    EXPECT_STR(r[0].prompt,
               "POST\nSubreddit: r/relationships\nMy girlfriend (24F) and I (25M) have been together for three "
               "years. We moved in together last spring and things have been great, except for one thing: she "
               "wants to adopt a dog and I'm allergic.\n\nI've tried antihistamines for a week at her sister's "
               "place and still woke up congested every morning. She says I'm exaggerating and that I'll \"get "
               "used to it\". I don't want to be the bad guy, but I also don't want to feel sick in my own "
               "home.\n\nHow do I tell her no without it turning into a fight?\nTL;DR: ");
    EXPECT_STR(r[0].chosen, " Girlfriend wants a dog, I'm allergic and antihistamines don't help. How do I say no "
                            "without a fight?");
    EXPECT_STR(r[0].rejected, " gf wants dog, i'm allergic, what do");
    EXPECT_STR(r[0].subreddit, "relationships");
    EXPECT_STR(r[0].id, "t3_1fz6ab");
    EXPECT(!r[0].is_article && r[0].row == 0 && r[0].line == 1, "row 0 metadata");
    // choice = 1: chosen is the second summary.
    EXPECT_STR(r[1].prompt, "POST\nSubreddit: r/jobs\nStarted a new job two weeks ago at a small company (8 people). "
                            "My manager keeps messaging me on Slack at 11pm and expects replies within minutes. "
                            "Nothing in the contract about being on call. Is this normal for startups or should I "
                            "bring it up now?\nTL;DR: ");
    EXPECT_STR(r[1].chosen, " My manager at a new startup job messages me at 11pm and expects quick replies, though "
                            "I'm not on call. Should I raise it now?");
    EXPECT_STR(r[1].rejected, " New job, manager expects late night replies on Slack. Normal?");
    // A CNN/Daily Mail item: ARTICLE, no subreddit line, the title unused.
    EXPECT_STR(r[2].prompt,
               "ARTICLE\nBy . Daily Mail Reporter . A hiker who spent two nights lost on Ben Nevis has thanked the "
               "search dog that found him. Tom Ellis, 34, from Leeds, was reported missing on Friday after failing "
               "to return from a solo walk. Mountain rescue teams found him on Sunday morning, cold but unhurt, "
               "after a collie named Meg picked up his scent.\nTL;DR: ");
    EXPECT(r[2].is_article && r[2].subreddit == NULL, "ARTICLE item metadata");
    EXPECT_STR(r[2].chosen, " Hiker lost for two nights on Ben Nevis was found by a search dog named Meg.");
    // A post with a null subreddit: no "Subreddit:" line; \u escapes (a surrogate pair
    // too) become UTF-8.
    EXPECT_STR(r[3].prompt, "POST\nCaf\xc3\xa9 owner here \xe2\x98\x95. A regular leaves a 1-star review every time "
                            "we run out of oat milk. Reply publicly or ignore? \xf0\x9f\x98\x82\nTL;DR: ");
    EXPECT(r[3].subreddit == NULL && !r[3].is_article && r[3].line == 4, "null subreddit metadata");
    EXPECT(r[0].responses == NULL && r[0].response_count == 0 && r[0].question == NULL, "no other fields");
done:
    dataset_free(&d);
}

static const char *hh_prompts[3] = {
    "\n\nHuman: What are some good vegetables to plant in early spring?\n\nAssistant: Peas, spinach, lettuce and "
    "radishes all tolerate cool soil and light frost.\n\nHuman: How deep should I plant the peas?\n\nAssistant:",
    "\n\nHuman: Can you help me write a birthday message for my grandmother?\n\nAssistant:",
    "\n\nHuman: how do i convert celsius to fahrenheit\n\nAssistant: Multiply by 9/5 and add 32.\n\nHuman: so what is "
    "20 degrees\n\nAssistant: 68 degrees Fahrenheit.\n\nHuman: and 100?\n\nAssistant:",
};

static void test_full_hh_rlhf(void) {
    Dataset d;
    if (!load_or_fail(&d, FIXTURES "/full_hh_rlhf.jsonl", DATA_FORMAT_AUTO)) return;
    EXPECT(d.format == DATA_FORMAT_HH, "detected %s", data_format_name(d.format));
    EXPECT(d.count == 3, "%ld records", d.count);
    for (long i = 0; i < d.count && i < 3; i++) EXPECT_STR(d.records[i].prompt, hh_prompts[i]);
    if (d.count == 3) {
        EXPECT_STR(d.records[0].chosen, " About one inch deep, and around two inches apart.");
        EXPECT_STR(d.records[0].rejected, " Peas are a legume.");
        EXPECT_STR(d.records[2].chosen, " 212 degrees Fahrenheit, the boiling point of water at sea level.");
        EXPECT_STR(d.records[2].rejected, " 100 degrees is hot.");
        EXPECT(d.records[2].line == 3 && d.records[2].id == NULL, "metadata");
    }
    dataset_free(&d);
}

// Dahoas/rm-static as one pretty-printed JSON array: rows span lines; each knows its own.
static void test_rm_static_json_array(void) {
    Dataset d;
    if (!load_or_fail(&d, FIXTURES "/rm_static.json", DATA_FORMAT_AUTO)) return;
    EXPECT(d.format == DATA_FORMAT_HH, "detected %s", data_format_name(d.format));
    EXPECT(d.count == 3, "%ld records", d.count);
    if (d.count == 3) {
        EXPECT_STR(d.records[0].prompt, hh_prompts[0]);
        EXPECT_STR(d.records[1].prompt, hh_prompts[1]);
        EXPECT_STR(d.records[2].prompt, "\n\nHuman: Is it safe to eat raw cookie dough?\n\nAssistant:");
        EXPECT_STR(d.records[2].chosen, " It's risky: raw flour and raw eggs can carry bacteria.");
        EXPECT_STR(d.records[2].rejected, " Yes, totally.");
        EXPECT(d.records[0].line == 2 && d.records[1].line == 8 && d.records[2].line == 14, "lines %ld %ld %ld",
               d.records[0].line, d.records[1].line, d.records[2].line);
    }
    dataset_free(&d);
}

static void test_webgpt_comparisons(void) {
    Dataset d;
    if (!load_or_fail(&d, FIXTURES "/webgpt_comparisons.jsonl", DATA_FORMAT_AUTO)) return;
    EXPECT(d.format == DATA_FORMAT_WEBGPT, "detected %s", data_format_name(d.format));
    EXPECT(d.count == 3, "%ld records", d.count);
    if (d.count != 3) goto done;
    const DataRecord *r = d.records;
    // score_1 > score_0: answer_1 is chosen; "[1][2]" goes in two passes, "(for example
    // when injured)" too (the reference removes genuine parentheticals).
    EXPECT_STR(r[0].prompt, " Human: Why do cats purr? Assistant:");
    EXPECT_STR(r[0].chosen, " Purring is produced by the laryngeal muscles opening and closing the glottis at 25 to "
                            "150 vibrations per second. Cats purr when content, but also to soothe themselves.");
    EXPECT_STR(r[0].rejected, " Cats purr when they are content, but also when they are stressed or hurt.");
    EXPECT_STR(r[0].id, "Qx1c0F6SxPMkqG5yRm7nUhz8aW2fTd");
    // A tie (0.0 and 0.0) goes to answer_0.
    EXPECT_STR(r[1].prompt, " Human: How do noise-cancelling headphones work? Assistant:");
    EXPECT_STR(r[1].chosen, " Microphones on the ear cups pick up outside sound, and the headphones play the "
                            "inverted wave so the two cancel out.");
    EXPECT_STR(r[1].rejected, " They use magic to block sound.");
    // A span does not cross a newline; " ." keeps its space (only spans take theirs).
    EXPECT_STR(r[2].chosen, " Saturn has the most confirmed moons as of 2023, overtaking Jupiter .\nSee.");
    EXPECT_STR(r[2].rejected, " Jupiter.");
    EXPECT(r[2].subreddit == NULL && !r[2].is_article, "no TL;DR metadata");
done:
    dataset_free(&d);
}

static void test_apps(void) {
    Dataset d;
    if (!load_or_fail(&d, FIXTURES "/apps.jsonl", DATA_FORMAT_AUTO)) return;
    EXPECT(d.format == DATA_FORMAT_APPS, "detected %s", data_format_name(d.format));
    EXPECT(d.count == 3, "%ld records", d.count);
    if (d.count != 3) goto done;
    const DataRecord *r = d.records;
    // Standard input: no starter code.
    EXPECT_STR(r[0].prompt,
               "\nQUESTION:\nYou are given an array $a$ of $n$ integers. Find the sum of its elements.\n\n\n"
               "-----Input-----\n\nThe first line contains $n$ ($1 \\le n \\le 100$). The second line contains $n$ "
               "integers $a_i$ ($|a_i| \\le 1000$).\n\n\n-----Output-----\n\nPrint one integer: the sum.\n\n\n"
               "-----Example-----\nInput\n3\n1 2 3\n\nOutput\n6\n\nUse Standard Input format\nANSWER:\n");
    EXPECT_STR(r[0].chosen, "n = int(input())\nprint(sum(map(int, input().split())))\n");
    EXPECT(!r[0].call_based, "row 0 is standard input");
    EXPECT_STR(r[0].id, "17");
    EXPECT_STR(r[0].difficulty, "introductory");
    EXPECT_STR(r[0].url, "https://codeforces.com/problemset/problem/1/Z");
    EXPECT_STR(r[0].starter_code, "");
    EXPECT_STR(r[0].input_output, "{\"inputs\": [\"3\\n1 2 3\\n\", \"1\\n-5\\n\"], \"outputs\": [\"6\\n\", "
                                  "\"-5\\n\"]}");
    EXPECT(r[0].solutions && strncmp(r[0].solutions, "[\"n = int(input())", 18) == 0, "solutions kept as JSON");
    EXPECT(r[0].question && strncmp(r[0].question, "You are given", 13) == 0, "question kept");
    // Call-based: starter code after the question, fn_name in input_output.
    EXPECT_STR(r[1].prompt,
               "\nQUESTION:\nGiven an array of integers nums and an integer target, return indices of the two numbers "
               "such that they add up to target.\n\nExample 1:\nInput: nums = [2,7,11,15], target = 9\nOutput: "
               "[0,1]\nclass Solution:\n    def twoSum(self, nums: List[int], target: int) -> List[int]:\n        "
               "\nUse Call-Based format\nANSWER:\n");
    EXPECT(r[1].call_based, "row 1 is call-based");
    EXPECT_STR(r[1].difficulty, "interview");
    // No solutions (APPS test items): chosen is NULL, solutions "".
    EXPECT(r[2].chosen == NULL, "row 2 has no solution");
    EXPECT_STR(r[2].solutions, "");
    EXPECT_STR(r[2].id, "4001");
    EXPECT(r[2].rejected == NULL && r[2].subreddit == NULL, "no pair fields");
done:
    dataset_free(&d);
}

static void test_local_formats(void) {
    Dataset d;
    if (load_or_fail(&d, FIXTURES "/sft.jsonl", DATA_FORMAT_AUTO)) {
        EXPECT(d.format == DATA_FORMAT_SFT && d.count == 2, "sft: %s, %ld", data_format_name(d.format), d.count);
        EXPECT_STR(d.records[0].prompt, "<|im_start|>user\nName a primary colour.<|im_end|>\n<|im_start|>assistant\n");
        EXPECT_STR(d.records[0].chosen, "Red.<|im_end|>");
        EXPECT(d.records[0].rejected == NULL, "sft has no rejected");
        dataset_free(&d);
    }
    if (load_or_fail(&d, FIXTURES "/pairs.jsonl", DATA_FORMAT_AUTO)) {
        EXPECT(d.format == DATA_FORMAT_PAIRS && d.count == 2, "pairs: %s, %ld", data_format_name(d.format), d.count);
        EXPECT_STR(d.records[1].prompt, "Q: Capital of France?\nA:");
        EXPECT_STR(d.records[1].chosen, " Paris");
        EXPECT_STR(d.records[1].rejected, " Lyon");
        dataset_free(&d);
    }
    if (load_or_fail(&d, FIXTURES "/ranked.jsonl", DATA_FORMAT_AUTO)) {
        EXPECT(d.format == DATA_FORMAT_RANKED && d.count == 2, "ranked: %s, %ld", data_format_name(d.format), d.count);
        EXPECT(d.records[0].response_count == 3 && d.records[1].response_count == 2, "response counts %d %d",
               d.records[0].response_count, d.records[1].response_count);
        if (d.records[0].response_count == 3) {
            EXPECT_STR(d.records[0].responses[0], "Soft rain on the roof\nthe garden drinks quietly\npuddles hold the sky");
            EXPECT_STR(d.records[0].responses[2], "rain");
        }
        EXPECT(d.records[0].chosen == NULL, "ranked leaves chosen NULL");
        dataset_free(&d);
    }
    if (load_or_fail(&d, FIXTURES "/unpaired.jsonl", DATA_FORMAT_AUTO)) {
        EXPECT(d.format == DATA_FORMAT_UNPAIRED && d.count == 3, "unpaired: %s, %ld", data_format_name(d.format), d.count);
        EXPECT_STR(d.records[0].chosen, " Paris");
        EXPECT(d.records[0].rejected == NULL && d.records[1].chosen == NULL, "one side per row");
        EXPECT_STR(d.records[1].rejected, " Lyon");
        EXPECT_STR(d.records[2].prompt, "Q: 2 + 2?\nA:");
        dataset_free(&d);
    }
    // TRL's prompt-completion rows are SFT rows.
    if (load_or_fail(&d, write_text("completions.jsonl", "{\"prompt\": \"p\", \"completion\": \" c\"}\n"),
                     DATA_FORMAT_AUTO)) {
        EXPECT(d.format == DATA_FORMAT_SFT && d.count == 1, "completion rows: %s", data_format_name(d.format));
        EXPECT_STR(d.records[0].chosen, " c");
        dataset_free(&d);
    }
    // TRL's language-modeling rows are SFT rows whose whole text is the response (other
    // fields ignored); a later row may be a prompt-completion one.
    if (load_or_fail(&d, write_text("text_rows.jsonl", "{\"text\": \"Once upon a time.\", \"id\": 7}\n"
                                                       "{\"prompt\": \"p\", \"completion\": \" c\"}\n"),
                     DATA_FORMAT_AUTO)) {
        EXPECT(d.format == DATA_FORMAT_SFT && d.count == 2 && !d.conversational, "text rows: %s",
               data_format_name(d.format));
        EXPECT_STR(d.records[0].prompt, "");
        EXPECT_STR(d.records[0].chosen, "Once upon a time.");
        EXPECT_STR(d.records[1].chosen, " c");
        EXPECT(d.records[0].text_only && !d.records[1].text_only, "text_only %d %d", d.records[0].text_only,
               d.records[1].text_only);
        // Such a row has no prompt: refused where prompts are answered.
        EXPECT(dataset_require_prompts(&d, "--prompts") == -1 && strstr(err_msg(), "text_rows.jsonl at line 1") &&
                   strstr(err_msg(), "(--prompts)"),
               "%s", err_msg());
        err_clear();
        dataset_free(&d);
    }
    if (load_or_fail(&d, FIXTURES "/prompts.jsonl", DATA_FORMAT_AUTO)) {
        EXPECT(d.format == DATA_FORMAT_PROMPTS && d.count == 3, "prompts: %s, %ld", data_format_name(d.format),
               d.count);
        EXPECT_STR(d.records[0].prompt, "Hello");
        dataset_free(&d);
    }
    // Raw (unescaped) UTF-8 and CRLF line ends are fine; a byte order mark is skipped.
    const char text[] = "\xef\xbb\xbf{\"prompt\": \"na\xc3\xafve \xe6\x97\xa5\xe6\x9c\xac \xf0\x9f\x8d\xb5\"}\r\n\r\n"
                        "{\"prompt\": \"x\"}\r\n";
    const char *path = write_temp("raw_utf8.jsonl", text, sizeof text - 1);
    if (load_or_fail(&d, path, DATA_FORMAT_AUTO)) {
        EXPECT(d.count == 2, "%ld records", d.count);
        EXPECT_STR(d.records[0].prompt, "na\xc3\xafve \xe6\x97\xa5\xe6\x9c\xac \xf0\x9f\x8d\xb5");
        EXPECT(d.records[1].line == 3, "line %ld", d.records[1].line);
        dataset_free(&d);
    }
}

// Preference rows without their prompt (TRL's implicit prompt; the raw Anthropic/hh-rlhf
// files): each record's prompt / chosen / rejected against what TRL's
// maybe_extract_prompt returns for the row (tests/fixtures/data/implicit_pairs*, written
// by tools/make_implicit_prompt_fixtures.py with TRL itself): strings for text rows, the
// message lists kept in record->conversation for conversational ones.
static void expect_implicit_pairs(const char *stem, bool conversational) {
    char data_path[256], expected_path[256], *text = NULL;
    size_t size = 0;
    snprintf(data_path, sizeof data_path, FIXTURES "/%s.jsonl", stem);
    snprintf(expected_path, sizeof expected_path, FIXTURES "/%s_expected.json", stem);
    CHECK(fs_read_file(expected_path, 1 << 20, &text, &size) == 0, "%s", err_msg());
    json_error_t error;
    json_t *expected = json_loadb(text, size, 0, &error);
    CHECK(expected, "%s: %s", expected_path, error.text);
    free(text);
    json_t *rows = json_object_get(expected, "rows");
    Dataset d;
    if (load_or_fail(&d, data_path, DATA_FORMAT_AUTO)) {
        EXPECT(d.format == DATA_FORMAT_PAIRS && d.count == (long)json_array_size(rows), "%s: %s, %ld records", stem,
               data_format_name(d.format), d.count);
        const char *keys[3] = {"prompt", "chosen", "rejected"};
        for (long r = 0; r < d.count && r < (long)json_array_size(rows); r++) {
            json_t *want = json_array_get(rows, (size_t)r);
            if (conversational) {
                json_t *got = d.records[r].conversation ? json_loads(d.records[r].conversation, 0, &error) : NULL;
                for (int k = 0; k < 3; k++)
                    EXPECT(got && json_equal(json_object_get(got, keys[k]), json_object_get(want, keys[k])),
                           "%s row %ld: %s is not TRL's (%s)", stem, r, keys[k], d.records[r].conversation);
                json_decref(got);
            } else {
                const char *got[3] = {d.records[r].prompt, d.records[r].chosen, d.records[r].rejected};
                for (int k = 0; k < 3; k++) {
                    EXPECT(string_equal(got[k], json_string_value(json_object_get(want, keys[k]))),
                           "%s row %ld: %s \"%s\", TRL's \"%s\"", stem, r, keys[k], got[k] ? got[k] : "(null)",
                           json_string_value(json_object_get(want, keys[k])));
                }
            }
        }
        dataset_free(&d);
    }
    json_decref(expected);
}

static void test_implicit_prompt_pairs(void) {
    expect_implicit_pairs("implicit_pairs", false);
    expect_implicit_pairs("implicit_pairs_messages", true);
    // No shared start: the strings differ at their first character, or one is empty (TRL
    // would index chosen[-1], or fail on an unbound index).
    expect_load_error(write_text("implicit_none.jsonl", "{\"chosen\": \"Yes.\", \"rejected\": \"No.\"}\n"),
                      DATA_FORMAT_AUTO, 0, 1, "share no leading text");
    expect_load_error(write_text("implicit_space.jsonl", "{\"chosen\": \"ab\", \"rejected\": \"ab\"}\n"
                                                         "{\"chosen\": \" yes\", \"rejected\": \" no\"}\n"),
                      DATA_FORMAT_AUTO, 0, 2, "share no leading text");
    expect_load_error(write_text("implicit_empty.jsonl", "{\"chosen\": \"\", \"rejected\": \"No.\"}\n"),
                      DATA_FORMAT_AUTO, 0, 1, "share no leading text");
    // A text row after a conversational one (and the reverse) is refused as before.
    expect_load_error(write_text("implicit_mixed.jsonl", "{\"chosen\": \"Q: a\", \"rejected\": \"Q: b\"}\n"
                                                         "{\"chosen\": [{\"role\": \"user\", \"content\": \"x\"}], "
                                                         "\"rejected\": [{\"role\": \"user\", \"content\": \"y\"}]}\n"),
                      DATA_FORMAT_AUTO, 0, 2, "");
}

static void test_forced_formats(void) {
    DataFormat format;
    const char *names[][2] = {{"tldr", "tldr"},
                              {"openai/summarize_from_feedback", "tldr"},
                              {"Dahoas/full-hh-rlhf", "hh"},
                              {"Dahoas/rm-static", "hh"},
                              {"openai/webgpt_comparisons", "webgpt"},
                              {"codeparrot/apps", "apps"},
                              {"ranked", "ranked"},
                              {"unpaired", "unpaired"},
                              {"auto", "auto"}};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        EXPECT(data_format_parse(names[i][0], "--data-format", &format) == 0, "%s: %s", names[i][0], err_msg());
        EXPECT_STR(data_format_name(format), names[i][1]);
    }
    EXPECT(data_format_parse("imdb", "--data-format", &format) == -1 && strstr(err_msg(), "--data-format") &&
               strstr(err_msg(), "imdb"),
           "unknown format: %s", err_msg());

    // Forced "prompts" on a pairs file reads only the prompts.
    Dataset d;
    if (load_or_fail(&d, FIXTURES "/pairs.jsonl", DATA_FORMAT_PROMPTS)) {
        EXPECT(d.format == DATA_FORMAT_PROMPTS && d.count == 2 && d.records[0].chosen == NULL, "forced prompts");
        dataset_free(&d);
    }
    // Forced "pairs" on an HH file is the same reading as detected "hh".
    if (load_or_fail(&d, FIXTURES "/full_hh_rlhf.jsonl", DATA_FORMAT_PAIRS)) {
        EXPECT_STR(d.records[1].prompt, hh_prompts[1]);
        dataset_free(&d);
    }
    // A forced format that the file is not: the first row already fails, naming the field.
    expect_load_error(FIXTURES "/tldr_comparisons.jsonl", DATA_FORMAT_HH, 0, 1, "\"prompt\"");
    expect_load_error(FIXTURES "/pairs.jsonl", DATA_FORMAT_TLDR, 0, 1, "\"info\"");
    expect_load_error(FIXTURES "/pairs.jsonl", DATA_FORMAT_RANKED, 0, 1, "\"responses\"");
    expect_load_error(FIXTURES "/sft.jsonl", DATA_FORMAT_WEBGPT, 0, 1, "\"question\"");
}

// dataset_take: deep copies, in the given order.
static void test_take(void) {
    Dataset d, taken;
    if (!load_or_fail(&d, FIXTURES "/ranked.jsonl", DATA_FORMAT_AUTO)) return;
    long order[3] = {1, 0, 1};
    dataset_take(&d, order, 3, &taken);
    dataset_free(&d); // the copy must not share memory with the source
    EXPECT(taken.count == 3 && taken.format == DATA_FORMAT_RANKED, "taken %ld", taken.count);
    EXPECT_STR(taken.records[0].prompt, "Say hi.\n");
    EXPECT_STR(taken.records[1].responses[1], "Rain falls down a lot\nit is wet");
    EXPECT(taken.records[2].row == 1 && taken.records[1].row == 0, "rows kept");
    dataset_free(&taken);
}

// dataset_load_keep_raw keeps each row as read (what --reward command is given): extra
// fields survive, the copy of dataset_take carries it, and plain dataset_load keeps none.
static void test_keep_raw(void) {
    const char *path = write_text("raw.jsonl", "{\"prompt\": \"2+2?\", \"answer\": \"4\"}\n{\"prompt\": \"3+3?\", \"answer\": 6}\n");
    Dataset d, plain, taken;
    CHECK(dataset_load_keep_raw(&d, path, DATA_FORMAT_AUTO, 0) == 0, "%s", err_msg());
    EXPECT(d.count == 2 && d.format == DATA_FORMAT_PROMPTS, "%ld rows", d.count);
    EXPECT_STR(d.records[0].raw, "{\"prompt\":\"2+2?\",\"answer\":\"4\"}"); // compact JSON
    EXPECT_STR(d.records[1].raw, "{\"prompt\":\"3+3?\",\"answer\":6}");
    long order[1] = {1};
    dataset_take(&d, order, 1, &taken);
    dataset_free(&d);
    EXPECT_STR(taken.records[0].raw, "{\"prompt\":\"3+3?\",\"answer\":6}");
    dataset_free(&taken);
    CHECK(dataset_load(&plain, path, DATA_FORMAT_AUTO, 0) == 0, "%s", err_msg());
    EXPECT(plain.records[0].raw == NULL, "plain load keeps no raw rows");
    dataset_free(&plain);
}

// --rename-columns: a file with other field names reads as the format's own; the renames are
// simultaneous (a swap works); a missing old field or a taken new name is an error naming the
// file and line; the raw row is the file's; a malformed list is refused naming the option.
static void test_column_renames(void) {
    ColumnRenames renames;
    CHECK(column_renames_parse("question=prompt,answer=response", "--rename-columns", &renames) == 0, "%s", err_msg());
    EXPECT(renames.count == 2 && !strcmp(renames.from[1], "answer") && !strcmp(renames.to[1], "response"), "parsed");
    const char *path = write_text("renamed.jsonl", "{\"question\": \"2+2?\", \"answer\": \" 4\", \"id\": 1}\n"
                                                   "{\"question\": \"3+3?\", \"answer\": \" 6\"}\n");
    Dataset d;
    CHECK(dataset_load_with(&d, path, &(DatasetLoadOptions){.renames = &renames, .keep_raw = true}) == 0, "%s",
          err_msg());
    EXPECT(d.count == 2 && d.format == DATA_FORMAT_SFT, "%ld rows, format %s", d.count, data_format_name(d.format));
    EXPECT_STR(d.records[1].prompt, "3+3?");
    EXPECT_STR(d.records[1].chosen, " 6");
    EXPECT_STR(d.records[0].raw, "{\"question\":\"2+2?\",\"answer\":\" 4\",\"id\":1}");
    dataset_free(&d);
    // The second row lacks "answer": its line is named.
    const char *missing = write_text("renamed_missing.jsonl", "{\"question\": \"a\", \"answer\": \"b\"}\n"
                                                              "{\"question\": \"c\", \"reply\": \"d\"}\n");
    err_clear();
    EXPECT(dataset_load_with(&d, missing, &(DatasetLoadOptions){.renames = &renames}) == -1 &&
               strstr(err_msg(), "no field \"answer\"") && strstr(err_msg(), "renamed_missing.jsonl:2"),
           "missing field: %s", err_msg());
    // A row that has "prompt" already cannot take another.
    const char *taken = write_text("renamed_taken.jsonl", "{\"question\": \"a\", \"answer\": \"b\", \"prompt\": \"c\"}\n");
    err_clear();
    EXPECT(dataset_load_with(&d, taken, &(DatasetLoadOptions){.renames = &renames}) == -1 &&
               strstr(err_msg(), "field \"prompt\" already") && strstr(err_msg(), "renamed_taken.jsonl:1"),
           "taken name: %s", err_msg());
    column_renames_free(&renames);
    // A swap: chosen and rejected trade places.
    CHECK(column_renames_parse("chosen=rejected,rejected=chosen", "--rename-columns", &renames) == 0, "%s", err_msg());
    const char *pairs = write_text("swapped.jsonl", "{\"prompt\": \"p\", \"chosen\": \" good\", \"rejected\": \" bad\"}\n");
    CHECK(dataset_load_with(&d, pairs, &(DatasetLoadOptions){.renames = &renames}) == 0, "%s", err_msg());
    EXPECT_STR(d.records[0].chosen, " bad");
    EXPECT_STR(d.records[0].rejected, " good");
    dataset_free(&d);
    column_renames_free(&renames);
    const char *bad[] = {"question", "=prompt", "question=", "a=b=c", "a=b,a=c", "a=c,b=c", "a=b,"};
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        err_clear();
        EXPECT(column_renames_parse(bad[k], "--rename-columns", &renames) == -1 &&
                   strstr(err_msg(), "--rename-columns"),
               "'%s' accepted: %s", bad[k], err_msg());
    }
    EXPECT(column_renames_parse(NULL, "--rename-columns", &renames) == 0 && renames.count == 0, "none");
}

// --- splits ------------------------------------------------------------------------------

static json_t *split_fixture;

static bool same_indices(const long *got, long count, const json_t *expected, const char *what) {
    if (!json_is_array(expected) || (long)json_array_size(expected) != count) {
        EXPECT(false, "%s: %ld indices, expected %zu", what, count, json_array_size(expected));
        return false;
    }
    for (long i = 0; i < count; i++) {
        if (got[i] != json_integer_value(json_array_get(expected, (size_t)i))) {
            EXPECT(false, "%s: index %ld is %ld, expected %lld", what, i, got[i],
                   (long long)json_integer_value(json_array_get(expected, (size_t)i)));
            return false;
        }
    }
    return true;
}

static void test_mt19937_matches_numpy(void) {
    size_t index;
    json_t *entry;
    json_array_foreach(json_object_get(split_fixture, "mt19937"), index, entry) {
        uint64_t seed = (uint64_t)json_integer_value(json_object_get(entry, "seed"));
        Mt19937 mt;
        mt19937_seed(&mt, (uint32_t)seed);
        json_t *words = json_object_get(entry, "u32");
        for (size_t k = 0; k < json_array_size(words); k++) {
            uint32_t word = mt19937_next_u32(&mt);
            EXPECT(word == (uint32_t)json_integer_value(json_array_get(words, k)), "seed %llu word %zu: %u",
                   (unsigned long long)seed, k, word);
        }
        mt19937_seed(&mt, (uint32_t)seed);
        json_t *doubles = json_object_get(entry, "doubles");
        for (size_t k = 0; k < json_array_size(doubles); k++) {
            double value = mt19937_next_double(&mt);
            double expected = strtod(json_string_value(json_array_get(doubles, k)), NULL);
            EXPECT(value == expected, "seed %llu double %zu: %.17g vs %.17g", (unsigned long long)seed, k, value,
                   expected);
        }
    }
}

// Python's perm[a:b] (negative bounds count from the end), for the large case whose
// phases the fixture leaves to the test.
static void python_slice(const json_t *perm, long a, long b, long n, json_t *out) {
    if (a < 0) a += n;
    if (b < 0) b += n;
    a = a < 0 ? 0 : a > n ? n : a;
    b = b < 0 ? 0 : b > n ? n : b;
    for (long i = a; i < b; i++) json_array_append(out, json_array_get(perm, (size_t)i));
}

static void test_splits_match_numpy(void) {
    size_t index, checked = 0, indices_checked = 0;
    json_t *entry;
    json_array_foreach(json_object_get(split_fixture, "cases"), index, entry) {
        long n = (long)json_integer_value(json_object_get(entry, "n"));
        uint64_t seed = (uint64_t)json_integer_value(json_object_get(entry, "seed"));
        json_t *perm = json_object_get(entry, "permutation");
        char what[160];
        long *permutation = NULL;
        EXPECT(data_shuffle_permutation(n, seed, &permutation) == 0, "%s", err_msg());
        snprintf(what, sizeof what, "permutation n=%ld seed=%llu", n, (unsigned long long)seed);
        same_indices(permutation, n, perm, what);
        free(permutation);
        size_t s;
        json_t *split;
        json_array_foreach(json_object_get(entry, "splits"), s, split) {
            const char *spec = json_string_value(json_object_get(split, "split"));
            json_t *bounds_expected = json_object_get(split, "boundaries");
            long *bounds = NULL;
            int parts = 0;
            EXPECT(data_split_boundaries(n, spec, &bounds, &parts) == 0, "%s", err_msg());
            snprintf(what, sizeof what, "boundaries n=%ld \"%s\"", n, spec);
            same_indices(bounds, parts + 1, bounds_expected, what);
            free(bounds);
            json_t *phases = json_object_get(split, "phases");
            for (int phase = 1; phase <= parts; phase++) {
                json_t *expected = json_array();
                if (json_is_array(phases)) {
                    json_array_extend(expected, json_array_get(phases, (size_t)phase - 1));
                } else {
                    python_slice(perm, (long)json_integer_value(json_array_get(bounds_expected, (size_t)phase - 1)),
                                 (long)json_integer_value(json_array_get(bounds_expected, (size_t)phase)), n,
                                 expected);
                }
                long *indices = NULL, count = -1;
                EXPECT(data_split_indices(n, spec, phase, seed, &indices, &count) == 0, "%s", err_msg());
                snprintf(what, sizeof what, "n=%ld seed=%llu \"%s\" phase %d", n, (unsigned long long)seed, spec,
                         phase);
                if (same_indices(indices, count, expected, what)) indices_checked += (size_t)count;
                free(indices);
                json_decref(expected);
                checked++;
            }
        }
    }
    json_array_foreach(json_object_get(split_fixture, "nested"), index, entry) {
        long n = (long)json_integer_value(json_object_get(entry, "n"));
        uint64_t seed = (uint64_t)json_integer_value(json_object_get(entry, "seed"));
        const char *outer = json_string_value(json_object_get(entry, "outer"));
        const char *spec = json_string_value(json_object_get(entry, "split"));
        EXPECT(strcmp(outer, DATA_WEBGPT_TRAIN_EVAL_SPLIT) == 0, "WebGPT pre-split is %s", outer);
        json_t *parts = json_object_get(entry, "parts");
        for (size_t part = 0; part < json_array_size(parts); part++) {
            json_t *phases = json_array_get(parts, part);
            for (size_t phase = 0; phase < json_array_size(phases); phase++) {
                long *indices = NULL, count = -1;
                EXPECT(data_split_indices_nested(n, outer, (int)part + 1, spec, (int)phase + 1, seed, &indices,
                                                 &count) == 0,
                       "%s", err_msg());
                char what[160];
                snprintf(what, sizeof what, "WebGPT n=%ld seed=%llu part %zu phase %zu", n, (unsigned long long)seed,
                         part + 1, phase + 1);
                if (same_indices(indices, count, json_array_get(phases, phase), what))
                    indices_checked += (size_t)count;
                free(indices);
                checked++;
            }
        }
    }
    printf("# %zu phase index lists, %zu indices, all equal to numpy's\n", checked, indices_checked);
    EXPECT(checked > 400, "only %zu phase lists checked", checked);
}

// The three phases of "2,4,4" cover every row once; the same call gives the same answer.
static void test_split_partition_and_determinism(void) {
    const long n = 92858; // TL;DR's train split
    char *seen = xcalloc((size_t)n, 1);
    long total = 0;
    for (int phase = 1; phase <= 3; phase++) {
        long *a = NULL, *b = NULL, count_a = 0, count_b = 0;
        EXPECT(data_split_indices(n, "2,4,4", phase, 1234, &a, &count_a) == 0, "%s", err_msg());
        EXPECT(data_split_indices(n, "2,4,4", phase, 1234, &b, &count_b) == 0, "%s", err_msg());
        EXPECT(count_a == count_b && memcmp(a, b, (size_t)count_a * sizeof *a) == 0, "phase %d differs", phase);
        for (long i = 0; i < count_a; i++) {
            EXPECT(a[i] >= 0 && a[i] < n && !seen[a[i]], "index %ld repeated or out of range", a[i]);
            if (a[i] >= 0 && a[i] < n) seen[a[i]] = 1;
        }
        total += count_a;
        if (phase == 3) EXPECT(count_a == 37143, "PPO phase of TL;DR has %ld prompts", count_a);
        free(a);
        free(b);
    }
    EXPECT(total == n, "phases cover %ld of %ld", total, n);
    free(seen);
}

static void test_split_errors(void) {
    size_t index;
    json_t *bad;
    long *indices = NULL, count = 0;
    json_array_foreach(json_object_get(split_fixture, "bad_splits"), index, bad) {
        err_clear();
        const char *spec = json_string_value(bad);
        EXPECT(data_split_indices(10, spec, 1, 1234, &indices, &count) == -1, "split \"%s\" accepted", spec);
        EXPECT(strstr(err_msg(), "--data-split") != NULL, "\"%s\": %s", spec, err_msg());
    }
    EXPECT(data_split_indices(10, NULL, 1, 1234, &indices, &count) == -1 && strstr(err_msg(), "--data-split"),
           "NULL split: %s", err_msg());
    EXPECT(data_split_indices(10, "2,4,4", 4, 1234, &indices, &count) == -1 && strstr(err_msg(), "--data-split") &&
               strstr(err_msg(), "phase 4"),
           "phase 4 of 3: %s", err_msg());
    EXPECT(data_split_indices(10, "2,4,4", 0, 1234, &indices, &count) == -1, "phase 0 accepted");
    EXPECT(data_split_indices(10, "2,4,4", 1, (uint64_t)1 << 32, &indices, &count) == -1 &&
               strstr(err_msg(), "--seed"),
           "seed 2^32: %s", err_msg());
    EXPECT(data_split_indices(-1, "2,4,4", 1, 1234, &indices, &count) == -1, "negative size accepted");
    EXPECT(data_split_indices_nested(100, DATA_WEBGPT_TRAIN_EVAL_SPLIT, 3, "2,4,4", 1, 1234, &indices, &count) == -1,
           "outer part 3 of 2 accepted");
}

// --- prompt length -----------------------------------------------------------------------

static void test_prompt_length_filter(void) {
    Tokenizer *tok = NULL;
    if (tokenizer_load(&tok, smollm2_path) != 0) {
        EXPECT(false, "cannot load %s: %s", smollm2_path, err_msg());
        return;
    }
    Dataset d;
    if (!load_or_fail(&d, FIXTURES "/prompts.jsonl", DATA_FORMAT_AUTO)) goto done;
    int lengths[3];
    for (int i = 0; i < 3; i++) {
        int *ids;
        tokenizer_encode(tok, d.records[i].prompt, strlen(d.records[i].prompt), true, &ids, &lengths[i]);
        free(ids);
    }
    // SmolLM2's post-processor adds nothing: "Hello" is one token.
    EXPECT(lengths[0] == 1, "\"Hello\" is %d tokens", lengths[0]);
    EXPECT(lengths[1] > lengths[2] && lengths[2] > lengths[0], "lengths %d %d %d", lengths[0], lengths[1], lengths[2]);
    long dropped = -1;
    // Exactly the longest length: nothing goes (the limit is inclusive).
    EXPECT(dataset_filter_prompt_length(&d, tok, lengths[1], &dropped) == 0 && dropped == 0 && d.count == 3,
           "limit %d: dropped %ld", lengths[1], dropped);
    // One less: the long TL;DR prompt goes, the order of the rest is kept.
    EXPECT(dataset_filter_prompt_length(&d, tok, lengths[1] - 1, &dropped) == 0 && dropped == 1 && d.count == 2,
           "limit %d: dropped %ld", lengths[1] - 1, dropped);
    if (d.count == 2) {
        EXPECT_STR(d.records[0].prompt, "Hello");
        EXPECT(d.records[1].row == 2, "row %ld kept second", d.records[1].row);
    }
    EXPECT(dataset_filter_prompt_length(&d, tok, 1, &dropped) == 0 && dropped == 1 && d.count == 1, "limit 1");
    EXPECT(dataset_filter_prompt_length(&d, tok, 0, &dropped) == -1 && strstr(err_msg(), "--max-prompt-len"),
           "limit 0: %s", err_msg());
    dataset_free(&d);
    // A whole TL;DR file at the paper's 512: nothing this short is dropped.
    if (load_or_fail(&d, FIXTURES "/tldr_comparisons.jsonl", DATA_FORMAT_AUTO)) {
        EXPECT(dataset_filter_prompt_length(&d, tok, 512, NULL) == 0 && d.count == 4, "TL;DR at 512: %ld", d.count);
        // At the shortest prompt's length only that prompt stays (row 3, the short post).
        int shortest = 1 << 30;
        for (long i = 0; i < d.count; i++) {
            int *ids, count;
            tokenizer_encode(tok, d.records[i].prompt, strlen(d.records[i].prompt), true, &ids, &count);
            free(ids);
            if (count < shortest) shortest = count;
        }
        EXPECT(dataset_filter_prompt_length(&d, tok, shortest, &dropped) == 0 && dropped == 3 && d.count == 1 &&
                   d.records[0].row == 3,
               "TL;DR at %d tokens: dropped %ld", shortest, dropped);
        dataset_free(&d);
    }
done:
    tokenizer_free(tok);
}

// --- bad data ---------------------------------------------------------------------------

#define TLDR_ROW(choice_json, text1_json)                                                                        \
    "{\"info\": {\"id\": \"t3_x\", \"post\": \"A post.\", \"title\": \"T\", \"subreddit\": \"AskReddit\"}, "       \
    "\"summaries\": [{\"text\": \" one\", \"policy\": \"ref\", \"note\": null}, {\"text\": " text1_json            \
    ", \"policy\": \"sup2\", \"note\": null}], \"choice\": " choice_json ", \"worker\": \"w\", \"batch\": \"b\", " \
    "\"split\": \"train\", \"extra\": {\"confidence\": 1}}\n"

static void test_bad_rows(void) {
    const char *good = TLDR_ROW("0", "\" two\"");
    char text[4096];

    // Missing field, wrong JSON type, choice out of range or of the wrong type.
    snprintf(text, sizeof text, "%s%s", good, "{\"info\": {\"post\": \"p\"}, \"summaries\": [{\"text\": \"a\"}, {\"text\": \"b\"}]}\n");
    expect_load_error(write_text("no_choice.jsonl", text), DATA_FORMAT_AUTO, 0, 2, "\"choice\"");
    snprintf(text, sizeof text, "%s%s", good, TLDR_ROW("0", "17"));
    expect_load_error(write_text("text_type.jsonl", text), DATA_FORMAT_AUTO, 0, 2, "\"summaries[1].text\"");
    snprintf(text, sizeof text, "%s%s%s", good, good, TLDR_ROW("2", "\" two\""));
    expect_load_error(write_text("choice_2.jsonl", text), DATA_FORMAT_AUTO, 0, 3, "\"choice\" is 2");
    expect_load_error(write_text("choice_str.jsonl", TLDR_ROW("\"1\"", "\" two\"")), DATA_FORMAT_AUTO, 0, 1, "\"choice\"");
    expect_load_error(write_text("choice_real.jsonl", TLDR_ROW("1.0", "\" two\"")), DATA_FORMAT_AUTO, 0, 1, "\"choice\"");
    expect_load_error(write_text("no_post.jsonl", "{\"info\": {\"post\": null, \"article\": null}, \"summaries\": []}\n"),
                      DATA_FORMAT_AUTO, 0, 1, "\"info.post\"");
    expect_load_error(write_text("info_type.jsonl", "{\"info\": \"x\", \"summaries\": []}\n"), DATA_FORMAT_AUTO, 0, 1,
                      "\"info\" is a string");
    expect_load_error(write_text("subreddit_type.jsonl",
                                 "{\"info\": {\"post\": \"p\", \"subreddit\": 3}, \"summaries\": [], \"choice\": 0}\n"),
                      DATA_FORMAT_AUTO, 0, 1, "\"info.subreddit\"");
    expect_load_error(write_text("three_summaries.jsonl",
                                 "{\"info\": {\"post\": \"p\"}, \"summaries\": [{\"text\": \"a\"}, {\"text\": \"b\"}, "
                                 "{\"text\": \"c\"}], \"choice\": 0}\n"),
                      DATA_FORMAT_AUTO, 0, 1, "\"summaries\" has 3");

    // Pairs, ranked, WebGPT, APPS.
    expect_load_error(write_text("pairs_null.jsonl", "{\"prompt\": \"p\", \"chosen\": \"a\", \"rejected\": \"b\"}\n"
                                                     "{\"prompt\": \"p\", \"chosen\": null, \"rejected\": \"b\"}\n"),
                      DATA_FORMAT_AUTO, 0, 2, "\"chosen\" is null");
    expect_load_error(write_text("half_pair.jsonl", "{\"prompt\": \"p\", \"chosen\": \"a\"}\n"), DATA_FORMAT_AUTO, 0, 1,
                      "\"rejected\"");
    expect_load_error(write_text("text_list.jsonl", "{\"text\": \"a\"}\n{\"text\": [\"a\"]}\n"), DATA_FORMAT_AUTO, 0, 2,
                      "\"text\" is an array");
    // Later rows must have the first row's format.
    expect_load_error(write_text("mixed.jsonl", "{\"prompt\": \"p\", \"chosen\": \"a\", \"rejected\": \"b\"}\n\n"
                                                "{\"prompt\": \"only a prompt\"}\n"),
                      DATA_FORMAT_AUTO, 0, 3, "\"chosen\"");
    expect_load_error(write_text("one_response.jsonl", "{\"prompt\": \"p\", \"responses\": [\"a\", \"b\"]}\n"
                                                       "{\"prompt\": \"p\", \"responses\": [\"only\"]}\n"),
                      DATA_FORMAT_AUTO, 0, 2, "\"responses\" has 1 entry");
    expect_load_error(write_text("response_type.jsonl", "{\"prompt\": \"p\", \"responses\": [\"a\", {\"t\": 1}]}\n"),
                      DATA_FORMAT_AUTO, 0, 1, "\"responses[1]\"");
    expect_load_error(write_text("completion_missing.jsonl", "{\"prompt\": \"p\", \"completion\": \"a\"}\n"
                                                             "{\"prompt\": \"p\"}\n"),
                      DATA_FORMAT_AUTO, 0, 2, "\"response\"");
    expect_load_error(write_text("label_string.jsonl", "{\"prompt\": \"p\", \"completion\": \"a\", \"label\": \"true\"}\n"),
                      DATA_FORMAT_AUTO, 0, 1, "\"label\" is a string, expected true or false");
    expect_load_error(write_text("label_missing.jsonl", "{\"prompt\": \"p\", \"completion\": \"a\", \"label\": true}\n"
                                                        "{\"prompt\": \"p\", \"completion\": \"b\"}\n"),
                      DATA_FORMAT_AUTO, 0, 2, "\"label\"");
    expect_load_error(write_text("completion_type.jsonl", "{\"prompt\": \"p\", \"completion\": 3, \"label\": false}\n"),
                      DATA_FORMAT_AUTO, 0, 1, "\"completion\"");
    expect_load_error(write_text("responses_type.jsonl", "{\"prompt\": \"p\", \"responses\": \"a\"}\n"),
                      DATA_FORMAT_AUTO, 0, 1, "\"responses\" is a string");
    expect_load_error(write_text("webgpt_score.jsonl",
                                 "{\"question\": {\"full_text\": \"q\"}, \"answer_0\": \"a\", \"answer_1\": \"b\", "
                                 "\"score_0\": \"1.0\", \"score_1\": 0}\n"),
                      DATA_FORMAT_AUTO, 0, 1, "\"score_0\"");
    expect_load_error(write_text("webgpt_question.jsonl",
                                 "{\"question\": {\"id\": \"x\"}, \"answer_0\": \"a\", \"answer_1\": \"b\", "
                                 "\"score_0\": 1, \"score_1\": 0}\n"),
                      DATA_FORMAT_AUTO, 0, 1, "\"question.full_text\"");
    expect_load_error(write_text("apps_solutions.jsonl",
                                 "{\"problem_id\": 1, \"question\": \"q\", \"solutions\": \"[\\\"print(1)\\\"\", "
                                 "\"input_output\": \"\"}\n"),
                      DATA_FORMAT_AUTO, 0, 1, "\"solutions\"");
    expect_load_error(write_text("apps_solution_type.jsonl",
                                 "{\"problem_id\": 1, \"question\": \"q\", \"solutions\": \"[1]\", \"input_output\": \"\"}\n"),
                      DATA_FORMAT_AUTO, 0, 1, "\"solutions\"");
    expect_load_error(write_text("apps_io.jsonl",
                                 "{\"problem_id\": 1, \"question\": \"q\", \"solutions\": \"\", "
                                 "\"input_output\": \"{\\\"inputs\\\": []}\"}\n"),
                      DATA_FORMAT_AUTO, 0, 1, "\"input_output\"");
    expect_load_error(write_text("apps_id.jsonl",
                                 "{\"problem_id\": \"1\", \"question\": \"q\", \"solutions\": \"\", \"input_output\": \"\"}\n"),
                      DATA_FORMAT_AUTO, 0, 1, "\"problem_id\"");
    expect_load_error(write_text("unknown.jsonl", "{\"sentence\": \"hello\", \"label\": 1}\n"), DATA_FORMAT_AUTO, 0, 1,
                      "(\"sentence\", \"label\")");
}

static void test_bad_files(void) {
    // Empty files, empty arrays, missing files.
    expect_load_error(write_text("empty.jsonl", ""), DATA_FORMAT_AUTO, 0, 1, "empty");
    expect_load_error(write_text("blank.jsonl", "\n  \n\n"), DATA_FORMAT_AUTO, 0, 3, "empty");
    expect_load_error(write_text("empty_array.json", "[ ]\n"), DATA_FORMAT_AUTO, 0, 1, "empty");
    Dataset d;
    EXPECT(dataset_load(&d, FIXTURES "/no_such_file.jsonl", DATA_FORMAT_AUTO, 0) == -1 &&
               strstr(err_msg(), "no_such_file.jsonl"),
           "missing file: %s", err_msg());
    EXPECT(dataset_load(&d, FIXTURES, DATA_FORMAT_AUTO, 0) == -1 && strstr(err_msg(), FIXTURES), "a folder: %s",
           err_msg());

    // Invalid UTF-8: a stray byte, an overlong form, a surrogate, a truncated sequence.
    const char stray[] = "{\"prompt\": \"ok\"}\n{\"prompt\": \"caf\xff\"}\n";
    expect_load_error(write_temp("utf8_stray.jsonl", stray, sizeof stray - 1), DATA_FORMAT_AUTO, 0, 2, "\"prompt\"");
    EXPECT(strstr(err_msg(), "UTF-8") && strstr(err_msg(), "0xff"), "%s", err_msg());
    const char overlong[] = "{\"prompt\": \"\xc0\xaf\"}\n";
    expect_load_error(write_temp("utf8_overlong.jsonl", overlong, sizeof overlong - 1), DATA_FORMAT_AUTO, 0, 1, "UTF-8");
    const char surrogate[] = "{\"prompt\": \"a\xed\xa0\x80\"}\n";
    expect_load_error(write_temp("utf8_surrogate.jsonl", surrogate, sizeof surrogate - 1), DATA_FORMAT_AUTO, 0, 1,
                      "UTF-8");
    const char truncated[] = "{\"prompt\": \"p\", \"chosen\": \"\xe2\x98\", \"rejected\": \"r\"}\n";
    expect_load_error(write_temp("utf8_truncated.jsonl", truncated, sizeof truncated - 1), DATA_FORMAT_AUTO, 0, 1,
                      "\"chosen\"");
    // In a JSON array the bad byte's own line is named, and its field.
    const char in_array[] = "[\n  {\"prompt\": \"a\"},\n  {\"prompt\": \"b\",\n   \"x\": 1,\n   \"note\": \"\xfe\"}\n]\n";
    expect_load_error(write_temp("utf8_array.json", in_array, sizeof in_array - 1), DATA_FORMAT_AUTO, 0, 5, "\"note\"");
    const char in_key[] = "{\"prompt\": \"a\", \"k\xff\": 1}\n";
    expect_load_error(write_temp("utf8_key.jsonl", in_key, sizeof in_key - 1), DATA_FORMAT_AUTO, 0, 1, "field name");
    const char nul[] = "{\"prompt\": \"a\"}\n{\"prompt\": \"a\0b\"}\n";
    expect_load_error(write_temp("nul.jsonl", nul, sizeof nul - 1), DATA_FORMAT_AUTO, 0, 2, "NUL");
    expect_load_error(write_text("nul_escape.jsonl", "{\"prompt\": \"a\\u0000b\"}\n"), DATA_FORMAT_AUTO, 0, 1, "JSON");

    // Over-long rows (a 100-byte limit), in both layouts.
    char long_rows[1024];
    snprintf(long_rows, sizeof long_rows, "{\"prompt\": \"short\"}\n{\"prompt\": \"short\"}\n{\"prompt\": \"%0150d\"}\n", 7);
    expect_load_error(write_text("long.jsonl", long_rows), DATA_FORMAT_AUTO, 100, 3, "100 bytes");
    EXPECT(dataset_load(&d, write_text("long_ok.jsonl", long_rows), DATA_FORMAT_AUTO, 200) == 0 && d.count == 3,
           "under a 200-byte limit: %s", err_msg());
    if (d.count == 3) dataset_free(&d);
    snprintf(long_rows, sizeof long_rows, "[{\"prompt\": \"short\"},\n\n {\"prompt\": \"%0150d\"}]\n", 7);
    expect_load_error(write_text("long.json", long_rows), DATA_FORMAT_AUTO, 100, 3, "100 bytes");

    // Malformed JSON, in both layouts.
    expect_load_error(write_text("bad_json.jsonl", "{\"prompt\": \"a\"}\n{\"prompt\": \"b\",\n"), DATA_FORMAT_AUTO, 0, 2,
                      "invalid JSON");
    expect_load_error(write_text("not_object.jsonl", "{\"prompt\": \"a\"}\n[\"prompt\", \"b\"]\n"), DATA_FORMAT_AUTO, 0,
                      2, "object");
    expect_load_error(write_text("bad_element.json", "[\n{\"prompt\": \"a\"},\n{\"prompt\": \"b\" \"c\"}\n]"),
                      DATA_FORMAT_AUTO, 0, 3, "invalid JSON");
    expect_load_error(write_text("unclosed.json", "[\n{\"prompt\": \"a\"},\n{\"prompt\": \"b\"}\n"), DATA_FORMAT_AUTO,
                      0, 3, "not closed");
    expect_load_error(write_text("unclosed_string.json", "[{\"prompt\": \"a\"}, {\"prompt\": \"b}]\n"), DATA_FORMAT_AUTO,
                      0, 1, "not closed");
    expect_load_error(write_text("trailing_comma.json", "[{\"prompt\": \"a\"},\n]\n"), DATA_FORMAT_AUTO, 0, 2,
                      "empty element");
    expect_load_error(write_text("after_array.json", "[{\"prompt\": \"a\"}]\n{\"prompt\": \"b\"}\n"), DATA_FORMAT_AUTO, 0,
                      2, "after the end");
    expect_load_error(write_text("scalar_element.json", "[{\"prompt\": \"a\"}, 3]"), DATA_FORMAT_AUTO, 0, 1, "object");
    expect_load_error(write_text("brace.json", "[{\"prompt\": \"a\"}}]"), DATA_FORMAT_AUTO, 0, 1, "'}'");
}

// Random damage to every fixture (bytes replaced, inserted, cut): each load must return 0
// or -1 with a message naming the file, and never crash (run under ASan by CI).
static void test_damaged_files_never_crash(void) {
    const char *names[] = {"tldr_comparisons.jsonl", "full_hh_rlhf.jsonl", "rm_static.json", "webgpt_comparisons.jsonl",
                           "apps.jsonl", "ranked.jsonl", "implicit_pairs.jsonl"};
    const char specials[] = "{}[]\",:\\\n\xff\xc3\x80 0";
    uint64_t state = 0x9e3779b97f4a7c15u;
    long failures = 0, successes = 0;
    for (size_t f = 0; f < sizeof names / sizeof names[0]; f++) {
        char path[256], *original = NULL;
        size_t size = 0;
        snprintf(path, sizeof path, FIXTURES "/%s", names[f]);
        CHECK(fs_read_file(path, 1 << 20, &original, &size) == 0, "%s", err_msg());
        char *damaged = xmalloc(size + 16);
        for (int trial = 0; trial < 150; trial++) {
            memcpy(damaged, original, size);
            size_t length = size;
            int edits = 1 + trial % 4;
            for (int e = 0; e < edits && length > 0; e++) {
                state = state * 6364136223846793005u + 1442695040888963407u;
                size_t at = (size_t)(state >> 33) % length;
                int kind = (int)(state >> 20) % 3;
                char byte = specials[(state >> 8) % (sizeof specials - 1)];
                if (kind == 0) damaged[at] = byte;
                else if (kind == 1 && length < size + 16) {
                    memmove(damaged + at + 1, damaged + at, length - at);
                    damaged[at] = byte;
                    length++;
                } else length = at; // cut the file here
            }
            const char *temp = write_temp("damaged", damaged, length);
            Dataset d;
            if (dataset_load(&d, temp, DATA_FORMAT_AUTO, 4096) == 0) {
                successes++;
                dataset_free(&d);
            } else {
                failures++;
                EXPECT(strstr(err_msg(), temp) != NULL && strchr(err_msg(), '\n') == NULL, "message: %s", err_msg());
            }
        }
        free(damaged);
        free(original);
    }
    printf("# damaged files: %ld loaded, %ld refused\n", successes, failures);
    EXPECT(failures > 0, "no damaged file was refused");
}

int main(void) {
    snprintf(tmp_dir, sizeof tmp_dir, "%s/test_data",
             getenv("MARLHF_TEST_TMP") ? getenv("MARLHF_TEST_TMP") : "/tmp");
    CHECK(fs_mkdir_p(tmp_dir) == 0, "%s", err_msg());
    char *text = NULL;
    size_t size = 0;
    CHECK(fs_read_file(FIXTURES "/splits.json", 16 << 20, &text, &size) == 0, "%s", err_msg());
    json_error_t error;
    split_fixture = json_loadb(text, size, 0, &error);
    CHECK(split_fixture, "%s: %s", FIXTURES "/splits.json", error.text);
    free(text);

    RUN(test_tldr_comparisons);
    RUN(test_full_hh_rlhf);
    RUN(test_rm_static_json_array);
    RUN(test_webgpt_comparisons);
    RUN(test_apps);
    RUN(test_local_formats);
    RUN(test_implicit_prompt_pairs);
    RUN(test_forced_formats);
    RUN(test_take);
    RUN(test_keep_raw);
    RUN(test_column_renames);
    RUN(test_mt19937_matches_numpy);
    RUN(test_splits_match_numpy);
    RUN(test_split_partition_and_determinism);
    RUN(test_split_errors);
    RUN(test_prompt_length_filter);
    RUN(test_bad_rows);
    RUN(test_bad_files);
    RUN(test_damaged_files_never_crash);
    json_decref(split_fixture);
    TEST_EXIT();
}
