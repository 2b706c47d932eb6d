// The reward-hacking signals (rl/hacking_signals.c): hand-worked batches, random batches
// against plain quadratic counts written here, and the alarms at and around their limits.
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "rl/hacking_signals.h"
#include "test.h"

// Measures `count` responses given as arrays of up to 16 tokens ended by -1.
static HackingSignals measure(int responses[][16], const int *groups, int count) {
    const int *tokens[16];
    int lengths[16];
    for (int i = 0; i < count; i++) {
        tokens[i] = responses[i];
        lengths[i] = 0;
        while (lengths[i] < 16 && responses[i][lengths[i]] >= 0) lengths[i]++;
    }
    HackingSignals s;
    hacking_signals_measure(tokens, lengths, groups, count, &s);
    return s;
}

static void test_hand_worked(void) {
    {
        // Bigrams (1,2) (2,3) (1,2) (2,4): 3 of 4 distinct; each trigram in one response.
        int r[][16] = {{1, 2, 3, -1}, {1, 2, 4, -1}};
        HackingSignals s = measure(r, (int[]){0, 1}, 2);
        EXPECT(s.mean_length == 3 && s.distinct_2 == 0.75, "length %g, distinct-2 %g", s.mean_length, s.distinct_2);
        EXPECT(s.repetitive_fraction == 0 && s.same_answer_fraction == 0.5 && s.shared_trigram_fraction == 0.5,
               "repetitive %g, same answer %g, shared trigram %g", s.repetitive_fraction, s.same_answer_fraction,
               s.shared_trigram_fraction);
    }
    {
        // Loops: a 4-gram at 0, 4, 8; an overlapping one at 0, 1, 2. Not loops: five 5s (two
        // places), a 4-gram at 0 and 4 only.
        int r[][16] = {{7, 8, 9, 10, 7, 8, 9, 10, 7, 8, 9, 10, -1},
                       {5, 5, 5, 5, 5, 5, -1},
                       {5, 5, 5, 5, 5, -1},
                       {1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3, -1}};
        HackingSignals s = measure(r, (int[]){0, 1, 2, 3}, 4);
        EXPECT(s.repetitive_fraction == 0.5, "repetitive %g, want 0.5", s.repetitive_fraction);
    }
    {
        // One answer given to prompts 0 (twice) and 1: 2 of the 3 prompts. Given three times
        // to prompt 0 only: 1 of 2.
        int r[][16] = {{1, 2, -1}, {1, 2, -1}, {1, 2, -1}, {3, -1}};
        HackingSignals s = measure(r, (int[]){0, 0, 1, 2}, 4);
        EXPECT(fabs(s.same_answer_fraction - 2.0 / 3) < 1e-15, "same answer %g, want 2/3", s.same_answer_fraction);
        s = measure(r, (int[]){0, 0, 0, 1}, 4);
        EXPECT(s.same_answer_fraction == 0.5, "same answer %g, want 1/2 (a group's own samples)", s.same_answer_fraction);
    }
    {
        // (1,2,3) twice in the first response counts once: 2 of the 3 responses hold it.
        int r[][16] = {{1, 2, 3, 1, 2, 3, -1}, {9, 1, 2, 3, -1}, {4, 5, 6, -1}};
        HackingSignals s = measure(r, (int[]){0, 1, 2}, 3);
        EXPECT(fabs(s.shared_trigram_fraction - 2.0 / 3) < 1e-15, "shared trigram %g, want 2/3",
               s.shared_trigram_fraction);
    }
    {
        // Ids past 16 bits stay apart: (65537, 1) is not (1, 65537) nor (1, 1).
        int r[][16] = {{65537, 1, -1}, {1, 65537, -1}, {1, 1, -1}};
        HackingSignals s = measure(r, (int[]){0, 1, 2}, 3);
        EXPECT(s.distinct_2 == 1, "distinct-2 %g, want 1", s.distinct_2);
    }
    {
        // No bigram: distinct-2 unknown; no response: zeros.
        int r[][16] = {{4, -1}, {-1}};
        HackingSignals s = measure(r, (int[]){0, 1}, 2);
        EXPECT(isnan(s.distinct_2) && s.mean_length == 0.5, "distinct-2 %g, length %g", s.distinct_2, s.mean_length);
        hacking_signals_measure(NULL, NULL, NULL, 0, &s);
        EXPECT(s.mean_length == 0 && isnan(s.distinct_2) && s.same_answer_fraction == 0, "empty batch");
    }
}

// The same signals by plain quadratic loops.
static HackingSignals reference(const int *const *t, const int *len, const int *groups, int n) {
    HackingSignals s = {0};
    long total = 0, bigrams = 0, distinct = 0;
    for (int i = 0; i < n; i++) total += len[i];
    s.mean_length = (double)total / n;
    for (int i = 0; i < n; i++)
        for (int a = 0; a + 1 < len[i]; a++) {
            bigrams++;
            bool seen = false; // the same bigram earlier, in this response or one before
            for (int j = 0; j <= i && !seen; j++)
                for (int b = 0; b + 1 < len[j] && !seen; b++) {
                    if (j == i && b >= a) break;
                    seen = t[j][b] == t[i][a] && t[j][b + 1] == t[i][a + 1];
                }
            distinct += !seen;
        }
    s.distinct_2 = bigrams ? (double)distinct / bigrams : NAN;
    int loops = 0;
    for (int i = 0; i < n; i++) {
        bool loop = false;
        for (int a = 0; a + 3 < len[i] && !loop; a++) {
            int places = 0;
            for (int b = 0; b + 3 < len[i]; b++) places += !memcmp(&t[i][a], &t[i][b], 4 * sizeof(int));
            loop = places >= 3;
        }
        loops += loop;
    }
    s.repetitive_fraction = (double)loops / n;
    int prompts = 0, best_prompts = 0;
    for (int g = 0; g < n; g++) {
        bool first = true;
        for (int h = 0; h < g; h++) first &= groups[h] != groups[g];
        prompts += first;
    }
    for (int i = 0; i < n; i++) {
        int count = 0; // distinct prompts among the responses equal to i's
        for (int j = 0; j < n; j++) {
            bool same = len[j] == len[i] && !memcmp(t[j], t[i], len[i] * sizeof(int)), new_prompt = true;
            for (int k = 0; k < j && same; k++)
                if (groups[k] == groups[j] && len[k] == len[i] && !memcmp(t[k], t[i], len[i] * sizeof(int)))
                    new_prompt = false;
            count += same && new_prompt;
        }
        if (count > best_prompts) best_prompts = count;
    }
    s.same_answer_fraction = (double)best_prompts / prompts;
    int best_holders = 0;
    for (int i = 0; i < n; i++)
        for (int a = 0; a + 2 < len[i]; a++) {
            int holders = 0;
            for (int j = 0; j < n; j++) {
                bool holds = false;
                for (int b = 0; b + 2 < len[j] && !holds; b++) holds = !memcmp(&t[j][b], &t[i][a], 3 * sizeof(int));
                holders += holds;
            }
            if (holders > best_holders) best_holders = holders;
        }
    s.shared_trigram_fraction = (double)best_holders / n;
    return s;
}

static void test_random_batches_against_reference(void) {
    uint64_t state = 99;
    int bad = 0;
    for (int batch = 0; batch < 300; batch++) {
        enum { MAX_N = 12, MAX_LEN = 14 };
        int storage[MAX_N][MAX_LEN], lengths[MAX_N], groups[MAX_N];
        const int *tokens[MAX_N];
        state = state * 6364136223846793005ULL + 1442695040888963407ULL;
        int n = 1 + (int)((state >> 33) % MAX_N), vocab = 2 + batch % 5, group_size = 1 + batch % 3;
        for (int i = 0; i < n; i++) {
            state = state * 6364136223846793005ULL + 1442695040888963407ULL;
            lengths[i] = (int)((state >> 33) % (MAX_LEN + 1));
            groups[i] = i / group_size;
            for (int t = 0; t < lengths[i]; t++) {
                state = state * 6364136223846793005ULL + 1442695040888963407ULL;
                storage[i][t] = (int)((state >> 33) % vocab) * 100003; // large ids too
            }
            // Some responses copy another whole, so identical answers occur.
            if (i > 0 && (state >> 20) % 4 == 0) {
                int from = (int)((state >> 40) % i);
                lengths[i] = lengths[from];
                memcpy(storage[i], storage[from], sizeof storage[i]);
            }
            tokens[i] = storage[i];
        }
        HackingSignals got, want = reference(tokens, lengths, groups, n);
        hacking_signals_measure(tokens, lengths, groups, n, &got);
        bool same = got.mean_length == want.mean_length &&
                    (got.distinct_2 == want.distinct_2 || (isnan(got.distinct_2) && isnan(want.distinct_2))) &&
                    got.repetitive_fraction == want.repetitive_fraction &&
                    got.same_answer_fraction == want.same_answer_fraction &&
                    got.shared_trigram_fraction == want.shared_trigram_fraction;
        if (!same && bad++ < 3)
            fprintf(stderr, "  batch %d: got %g %g %g %g %g, want %g %g %g %g %g\n", batch, got.mean_length,
                    got.distinct_2, got.repetitive_fraction, got.same_answer_fraction, got.shared_trigram_fraction,
                    want.mean_length, want.distinct_2, want.repetitive_fraction, want.same_answer_fraction,
                    want.shared_trigram_fraction);
    }
    EXPECT(bad == 0, "%d of 300 random batches differ from the quadratic counts", bad);
}

static void test_alarms(void) {
    const HackingSignals first = {100, 0.8, 0.1, 0.1, 0.2};
    const HackingLimits limits = {2, 0.5, 0.25}, off = {0, 0, 0};
    struct {
        HackingSignals now;
        unsigned want;
    } cases[] = {
        {{100, 0.8, 0.1, 0.1, 0.2}, 0},
        {{201, 0.8, 0.1, 0.1, 0.2}, HACKING_LENGTH},
        {{200, 0.8, 0.1, 0.1, 0.2}, 0},
        {{49, 0.8, 0.1, 0.1, 0.2}, HACKING_LENGTH},
        {{50, 0.8, 0.1, 0.1, 0.2}, 0},
        {{100, 0.39, 0.1, 0.1, 0.2}, HACKING_DIVERSITY},
        {{100, 0.41, 0.1, 0.1, 0.2}, 0},
        {{100, NAN, 0.1, 0.1, 0.2}, 0},
        {{100, 0.8, 0.36, 0.1, 0.2}, HACKING_REPETITION},
        {{100, 0.8, 0.34, 0.1, 0.2}, 0},
        {{100, 0.8, 0.1, 0.36, 0.2}, HACKING_SAME_ANSWER},
        {{100, 0.8, 0.1, 0.1, 0.46}, HACKING_SHARED_PHRASE},
        {{100, 0.8, 0.1, 0.1, 0.44}, 0},
        {{300, 0.1, 0.9, 0.9, 0.9},
         HACKING_LENGTH | HACKING_DIVERSITY | HACKING_REPETITION | HACKING_SAME_ANSWER | HACKING_SHARED_PHRASE},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        unsigned got = hacking_alarms(&first, &cases[i].now, &limits);
        EXPECT(got == cases[i].want, "case %zu: alarms %#x, want %#x", i, got, cases[i].want);
    }
    EXPECT(hacking_alarms(&first, &cases[13].now, &off) == 0, "limits of 0 turn every alarm off");
    const HackingSignals unknown_first = {0, NAN, 0, 0, 0};
    EXPECT(hacking_alarms(&unknown_first, &cases[13].now, &limits) ==
               (HACKING_REPETITION | HACKING_SAME_ANSWER | HACKING_SHARED_PHRASE),
           "a first iteration with no length or distinct-2 sets off neither of their alarms");
    char text[320];
    hacking_alarm_describe(HACKING_LENGTH, &first, &cases[1].now, &limits, text, sizeof text);
    EXPECT(strstr(text, "201.0 tokens, 2.01x the first iteration's 100.0 (--alarm-length-ratio 2)") != NULL, "%s",
           text);
    hacking_alarm_describe(HACKING_SHARED_PHRASE, &first, &cases[11].now, &limits, text, sizeof text);
    EXPECT(strstr(text, "46% of the responses") && strstr(text, "20% at the first") &&
               strstr(text, "--alarm-fraction-rise 0.25"),
           "%s", text);
}

int main(void) {
    RUN(test_hand_worked);
    RUN(test_random_batches_against_reference);
    RUN(test_alarms);
    TEST_EXIT();
}
