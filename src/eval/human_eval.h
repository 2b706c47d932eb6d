// A blind pairwise comparison by a person (spec §9.5, the released human-eval.py without
// its unseeded order and lost skips): the session behind `marlhf human-eval`, shared by
// its web page and its terminal mode.
//
// Row i pairs model A's and model B's responses to one prompt. The person sees them as
// "Response 1" and "Response 2" in an order decided by a seeded coin (a pure function of
// seed and row, so a resumed session shows every row the way it was shown before) and
// answers 1, 2, tie or skip; the answer is stored in model terms (A, B, tie, skipped).
//
// Rows are judged in order. Every verdict is appended and fsynced to a partial file
// before it counts, so a session stopped at any moment continues at its first unjudged
// row; the partial file is checked against the rows and the seed before it is trusted.
// A skip is recorded too (verdict "skipped", left out of every count but its own): the
// person declined that row, and a resumed session must not ask again.
#pragma once
#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <time.h>

#include "eval/judge.h"

// What the person answered, in terms of the order shown.
typedef enum { HUMAN_TIE = 0, HUMAN_FIRST = 1, HUMAN_SECOND = 2, HUMAN_SKIP = 3 } HumanChoice;

// "1", "2", "tie" or "t", "skip" or "s" (case and surrounding blanks ignored); -1 (with
// err_set) otherwise.
int human_choice_parse(const char *text, HumanChoice *choice);
// "1", "2", "tie", "skip": the words of the API and of the verdict rows.
const char *human_choice_name(HumanChoice choice);

// Whether row `index` shows model B's response as Response 1: bit 0 of the Philox block
// (seed, stream = index, counter 0).
bool human_eval_swapped(uint64_t seed, long index);
// The answer in model terms: VERDICT_A, VERDICT_B or VERDICT_TIE; VERDICT_INVALID for a skip.
JudgeVerdict human_eval_verdict(HumanChoice choice, bool swapped);
// "A", "B", "tie", "skipped".
const char *human_verdict_name(JudgeVerdict verdict);

typedef struct {
    const char *prompt, *response_a, *response_b;
    bool has_rewards; // both inputs carried a numeric "reward": kept in the verdict rows
    double reward_a, reward_b;
} HumanEvalRow;

typedef struct {
    const HumanEvalRow *rows; // borrowed; n of them
    long n;
    uint64_t seed;
    json_t **verdicts; // [n]: the first `judged` are set
    long judged;
    char *partial_path, *dir;
    FILE *partial; // opened with the first new verdict: a session that records nothing leaves no file
} HumanEvalSession;

// Starts a session over `rows`, continuing the verdicts saved in `partial_path` by an
// earlier session over the same rows and seed (lines past row n, left by a session with a
// larger --limit, are ignored; a torn last line is cut off the file). A partial file of
// other rows or another seed is -1 with err_set naming its line (and nothing to close),
// unless `discard_other`: then it is removed and the session starts empty.
int human_eval_open(HumanEvalSession *session, const HumanEvalRow *rows, long n, uint64_t seed,
                    const char *partial_path, bool discard_other);
void human_eval_close(HumanEvalSession *session);

// The row to show next (the first unjudged one), or n when every row is judged.
long human_eval_next(const HumanEvalSession *session);
// The texts row `index` shows as Response 1 and Response 2.
void human_eval_shown(const HumanEvalSession *session, long index, const char **first, const char **second);

// Records the answer to row `index`, which must be the next one, at time `when`: the row
// ({index, prompt, response_a, response_b, swapped, choice, verdict, position_won, seed,
// timestamp[, reward_a, reward_b]}) is appended and fsynced to the partial file first.
// -1 with err_set (another row, or the file cannot be written; nothing is counted then).
int human_eval_record(HumanEvalSession *session, long index, HumanChoice choice, time_t when);

typedef struct {
    long rows, judged, wins_a, wins_b, ties, skipped;
    long valid;                   // wins and ties: what the win rate is over
    long first_wins, second_wins; // outright wins by the position shown
    double win_rate_a;            // (wins of A + ties / 2) / valid; NaN when valid = 0
    double low, high;             // its 95% Wilson interval; [0, 1] when valid = 0
} HumanEvalSummary;

void human_eval_summarize(const HumanEvalSession *session, HumanEvalSummary *summary);
// The summary's numbers as the JSON object saved in OUTPUT.summary.json (the command adds
// the input names and the seed).
json_t *human_eval_summary_json(const HumanEvalSummary *summary);

// When every row is judged: the verdicts to `output` and `summary` to its summary path,
// each atomically, then the partial file removed. -1 with err_set.
int human_eval_write_results(HumanEvalSession *session, const char *output, const json_t *summary);
