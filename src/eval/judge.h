// A pairwise LLM judge (spec §9.3–9.4, without the released scripts' bugs): the prompt
// that shows two responses to the judge, the reading of its verdict, the mapping from
// shown positions back to the two models, and the statistics of a set of verdicts.
//
// Everything here is a pure function of its arguments (no network, no files), so the
// parts that decide an evaluation's outcome are unit-tested on their own; the HTTP
// client is eval/http_client.c and the command is cli/cmd_judge.c.
#pragma once
#include <stdbool.h>
#include <stdint.h>

typedef enum { JUDGE_SUMMARIZATION, JUDGE_DIALOGUE, JUDGE_QA } JudgeTask;

// "summarization" (also "summarize", "tldr"), "dialogue" (also "hh", "hh-rlhf"),
// "qa" (also "webgpt"). -1 with err_set() naming `option` otherwise.
int judge_task_parse(const char *name, const char *option, JudgeTask *task);
const char *judge_task_name(JudgeTask task);

// What the judge preferred, in terms of the order it was shown the two texts.
typedef enum { JUDGE_INVALID = -1, JUDGE_TIE = 0, JUDGE_FIRST = 1, JUDGE_SECOND = 2 } JudgePosition;
// The same verdict in terms of the two models being compared.
typedef enum { VERDICT_INVALID = -1, VERDICT_TIE = 0, VERDICT_A = 1, VERDICT_B = 2 } JudgeVerdict;

// The one user message sent to the judge (xmalloc'd): the task's criteria, the prompt
// and the two texts labelled A (first) and B (second), and the requested answer format
// (a short comparison, then a final line "Preferred: A|B|tie"). One user message and no
// system message, because some chat templates (Gemma's) have no system role.
char *judge_build_prompt(JudgeTask task, const char *prompt, const char *first, const char *second);
// The follow-up sent once when a reply carried no readable verdict.
const char *judge_reminder(void);

// Reads the verdict of a judge's reply: the last "Preferred:", "Preference:", "Winner:",
// "Choice:" or "Verdict:" (case-insensitive, markdown bold and quotes allowed, also as a
// JSON field) whose value is A/B/tie, "Summary A", "Response B", "1", "2", "equal", ...;
// or a reply that is nothing but such a value. JUDGE_INVALID when there is none.
JudgePosition judge_parse_verdict(const char *reply);

// Whether row `row` shows model B first: a seeded coin flip, a pure function of
// (seed, row), so a resumed run flips the same coins.
bool judge_swapped(uint64_t seed, uint64_t row);
// A position verdict mapped back to the models.
JudgeVerdict judge_unswap(JudgePosition position, bool swapped);

const char *judge_verdict_name(JudgeVerdict verdict);    // "A", "B", "tie", "invalid"
const char *judge_position_name(JudgePosition position); // "first", "second", "tie", NULL for invalid
// Inverses of the two above; -1 when `name` is none of them (NULL reads as invalid).
int judge_verdict_from_name(const char *name, JudgeVerdict *verdict);
int judge_position_from_name(const char *name, JudgePosition *position);

// The Wilson score interval of a proportion `successes / n` at normal quantile z (1.96 →
// 95%). `successes` may be fractional (a tie counts one half); n = 0 gives [0, 1].
void judge_wilson_interval(double successes, long n, double z, double *low, double *high);

// Where the summary of a verdicts file goes (judge and human-eval alike): "out/v.jsonl" ->
// "out/v.summary.json"; a name without ".jsonl" gets the suffix appended. xmalloc'd.
char *judge_summary_path(const char *output);

typedef struct {
    long wins_a, wins_b, ties, invalid;
    long first_wins, second_wins; // by the position shown, over valid verdicts
} JudgeCounts;

void judge_counts_add(JudgeCounts *counts, JudgeVerdict verdict, JudgePosition position);
long judge_counts_valid(const JudgeCounts *counts);
// (wins of A + ties / 2) / valid verdicts; NaN when none is valid.
double judge_win_rate_a(const JudgeCounts *counts);
// The fraction of valid verdicts won outright by the position shown first; NaN when none.
double judge_first_position_rate(const JudgeCounts *counts);

// The judge's reply inside a chat-completions response body
// ({"choices": [{"message": {"content": "..."}}]}), xmalloc'd; NULL (with err_set) when
// the body is not such a response.
char *judge_reply_from_response(const char *body);
