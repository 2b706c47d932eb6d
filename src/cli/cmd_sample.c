// marlhf sample: the evaluation instances (spec §9.2, the released
// sample_from_dataset.py without its CLI bugs): 50 rows of an inference results file,
// chosen from the prompts alone, so that the results files of two models with the same
// prompts give the same instances.
//
// --dataset tldr: stratified by post type. A prompt that starts with "ARTICLE" is its own
// group; otherwise the group is the subreddit word after "Subreddit: r/". Up to 5 rows are
// taken from each group, the pool is shuffled, then topped up with other random rows (or
// cut) to --count. Any other dataset: --count uniformly random rows. The random numbers
// are marlhf's (Philox, --seed), not Python's `random`, so the instances differ from the
// released script's for the same seed.
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/commands.h"
#include "cli/options.h"
#include "core/check.h"
#include "core/rng.h"
#include "io/fs.h"
#include "io/jsonl.h"

// Fisher-Yates with the counter-based generator: a pure function of (seed, stream, n).
static void shuffle(long *items, long n, uint64_t seed, uint64_t stream) {
    for (long i = n - 1; i > 0; i--) {
        long j = (long)rng_below(seed, stream, (uint64_t)i, (uint64_t)(i + 1));
        long t = items[i];
        items[i] = items[j], items[j] = t;
    }
}

// The stratification key of a TL;DR prompt (the caller frees it).
static char *post_group(const char *prompt) {
    if (!strncmp(prompt, "ARTICLE", 7)) return xstrdup("ARTICLE");
    const char *at = strstr(prompt, "Subreddit: r/");
    if (!at) return xstrdup("");
    at += strlen("Subreddit: r/");
    size_t n = strcspn(at, " \t\r\n");
    char *group = xmalloc(n + 1);
    memcpy(group, at, n);
    group[n] = '\0';
    return group;
}

int cmd_sample(int argc, char **argv) {
    char *dataset = "other", *output = NULL;
    long count = 50, seed = 42, per_group = 5;
    bool overwrite = false;
    Option options[] = {
        {"dataset", NULL, OPT_STRING, &dataset, "tldr (stratified by subreddit) or anything else (uniform)", false, false},
        {"count", NULL, OPT_INT, &count, "instances", false, false},
        {"per-group", "per_group", OPT_INT, &per_group, "tldr: rows taken from each subreddit", false, false},
        {"seed", NULL, OPT_INT, &seed, "seed of the choice", false, false},
        {"output", "save_path", OPT_STRING, &output, "JSONL of the chosen rows, each with its \"index\" (required)", true, false},
        {"overwrite", NULL, OPT_BOOL, &overwrite, "replace an existing output file", false, false},
    };
    const char *inputs[1];
    OptionSet set = {"sample", "The evaluation instances of an inference results file, chosen from its prompts alone.",
                     "marlhf sample RESULTS.jsonl --output SAMPLE.jsonl [--dataset tldr] [--count 50]", options,
                     sizeof options / sizeof options[0], inputs, 1, 0};
    options_parse(&set, argc, argv);
    if (set.num_positional != 1) die_user("give one results file: marlhf sample RESULTS.jsonl --output FILE (--help)");
    if (count < 1 || per_group < 1) die_user("--count and --per-group must be positive");
    if (fs_is_file(output) && !overwrite) die_user("%s exists; give --overwrite to replace it (--output)", output);

    JsonlReader reader;
    if (jsonl_open(&reader, inputs[0], 0) != 0) die_from_err();
    json_t **rows = NULL;
    long n = 0;
    json_t *row;
    int rc;
    while ((rc = jsonl_next(&reader, &row)) == 1) {
        if (!json_is_object(row) || !json_is_string(json_object_get(row, "prompt")))
            die_user("row without a \"prompt\" string (%s:%ld)", inputs[0], reader.line_number);
        rows = xrealloc(rows, (n + 1) * sizeof(json_t *));
        rows[n++] = row;
    }
    if (rc < 0) die_from_err();
    jsonl_close(&reader);
    if (n == 0) die_user("no rows in %s", inputs[0]);
    if (count > n) count = n;

    long *chosen = xmalloc(n * sizeof(long));
    long picked = 0;
    bool *taken = xcalloc(n, sizeof(bool));
    if (!strcmp(dataset, "tldr") || !strcmp(dataset, "summarize")) {
        // Groups in order of first appearance; from each, up to per_group random members.
        char **groups = xmalloc(n * sizeof(char *));
        for (long i = 0; i < n; i++) groups[i] = post_group(json_string_value(json_object_get(rows[i], "prompt")));
        long *members = xmalloc(n * sizeof(long));
        bool *grouped = xcalloc(n, sizeof(bool));
        for (long g = 0, group_index = 0; g < n; g++) {
            if (grouped[g]) continue;
            long m = 0;
            for (long i = g; i < n; i++)
                if (!grouped[i] && !strcmp(groups[i], groups[g])) members[m++] = i, grouped[i] = true;
            shuffle(members, m, (uint64_t)seed, 1000 + (uint64_t)group_index++);
            for (long k = 0; k < m && k < per_group; k++) chosen[picked++] = members[k], taken[members[k]] = true;
        }
        shuffle(chosen, picked, (uint64_t)seed, 1);
        for (long i = 0; i < n; i++) free(groups[i]);
        free(groups), free(members), free(grouped);
    }
    if (picked < count) { // top up (or, for other datasets, fill) with random rows not yet taken
        long *rest = xmalloc(n * sizeof(long)), r = 0;
        for (long i = 0; i < n; i++)
            if (!taken[i]) rest[r++] = i;
        shuffle(rest, r, (uint64_t)seed, 2);
        for (long k = 0; picked < count && k < r; k++) chosen[picked++] = rest[k];
        free(rest);
    }
    if (picked > count) picked = count;

    size_t size = 0;
    char *text = NULL;
    FILE *out = open_memstream(&text, &size);
    for (long k = 0; k < picked; k++) {
        json_t *copy = json_copy(rows[chosen[k]]);
        json_object_set_new(copy, "index", json_integer(chosen[k]));
        char *line = json_dumps(copy, JSON_COMPACT | JSON_PRESERVE_ORDER);
        fprintf(out, "%s\n", line);
        free(line);
        json_decref(copy);
    }
    fclose(out);
    char *dir = fs_dirname(output);
    if (fs_mkdir_p(dir) != 0 || fs_write_file_atomic(output, text, size) != 0) die_from_err();
    fprintf(stderr, "sample: %ld of %ld rows -> %s\n", picked, n, output);
    free(dir), free(text), free(chosen), free(taken);
    for (long i = 0; i < n; i++) json_decref(rows[i]);
    free(rows);
    return 0;
}
