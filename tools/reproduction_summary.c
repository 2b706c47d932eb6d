// reproduction_summary: a multi-seed PPO / MA-PPO study aggregated into tables and figures.
//
// The study is RUNS_DIR/<method>/seed<k>/metrics.jsonl, each written by `marlhf ppo`
// (eval lines at step 0, every --eval-every iterations and at the end; one train line per
// iteration). Written to OUT_DIR:
//   summary.md, summary.tsv   one row per method: held-out scores at the last evaluation,
//                             KL, iterations to reach the baseline's final training score,
//                             speed-up (the definitions are the paragraph under the table)
//   heldout_score.svg, heldout_gold.svg, train_score.svg, kl.svg
//                             the mean across seeds of each method, with a min-max band
//
//   build/tools/reproduction_summary --runs runs/study --baseline ppo --out-dir runs/study/summary
//       --methods "ppo=Vanilla PPO,fixed3=MA-PPO (n=3)" [--window 4]
#include <dirent.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/check.h"
#include "eval/report.h"
#include "eval/svg_plot.h"
#include "io/fs.h"

enum { MAX_ITERATIONS = 10000000 };

// What each run contributes to the table (a method's cell aggregates them across seeds).
enum {
    LAST_SCORE,  // eval/score at the last evaluation
    LAST_GOLD,   // eval/gold at the last evaluation
    LAST_LENGTH, // eval/response_length at the last evaluation
    FINAL_KL,    // train/kl averaged over the last `window` iterations
    FINAL_TRAIN, // train/score averaged over the last `window` iterations
    REACH,       // iterations to reach the baseline's final training score (INFINITY: never)
    FIRST_EVAL,  // first eval step with eval/score >= the baseline's final held-out score (INFINITY: never)
    MACRO_LENGTH,    // train/macro_action_length averaged over every iteration (what the termination did)
    TRAIN_LENGTH,    // train/response_length averaged over every iteration
    WALL_TIME,       // the run's last "time" (seconds from its start): equal compute shows here
    NUM_RESULTS
};

typedef struct {
    char *name, *path; // "seed1", RUNS_DIR/<method>/seed1/metrics.jsonl
    RunMetrics metrics;
    const MetricSeries *eval_score;
    int iterations;           // the last training iteration
    double *train_score, *kl; // indexed by iteration 1..iterations; NaN where none was logged
    double last_eval_step;
    double result[NUM_RESULTS];
} Run;

typedef struct {
    char *dir, *label;
    Run *runs;
    int run_count;
    double reach_median; // INFINITY when the median run never reaches the target
    // The first iteration at which the seed-mean of the runs' moving averages reaches the
    // target (INFINITY: never): the crossing of the mean curve of train_score.svg, the
    // reading of the paper's Fig. 2, and what the speed-up compares.
    double reach_mean_curve;
} Method;

// Mean, min and max across a method's runs at each x where all of them have a value.
typedef struct {
    double *x, *mean, *low, *high;
    int count;
} Curve;

static const char *usage =
    "usage: reproduction_summary --runs DIR --methods \"DIR=LABEL,...\" --baseline DIR --out-dir OUT [--window N]";

static void print_help(void) {
    printf("Aggregates a multi-seed PPO / MA-PPO study, RUNS/<method>/seed<k>/metrics.jsonl, into\n"
           "OUT/summary.md, OUT/summary.tsv and the figures heldout_score.svg, heldout_gold.svg,\n"
           "train_score.svg and kl.svg (mean across seeds, min-max band).\n\n%s\n\noptions:\n", usage);
    printf("  --runs DIR        the study folder: one folder per method, seed* folders in each (required)\n"
           "  --methods LIST    comma-separated DIR=LABEL, in display order (required)\n"
           "  --baseline DIR    the method the others are compared with, one of --methods (required)\n"
           "  --out-dir OUT     where the tables and figures go; created if missing (required)\n"
           "  --window N        iterations of the training-score moving average and of the final\n"
           "                    training score and KL (default: 4)\n"
           "  --help            show this help\n");
}

// --- statistics ------------------------------------------------------------------

static double mean_of(const double *v, int n) {
    double sum = 0;
    for (int i = 0; i < n; i++) sum += v[i];
    return n > 0 ? sum / n : NAN;
}

// The sample standard deviation (n - 1); NaN for fewer than two values.
static double sd_of(const double *v, int n) {
    if (n < 2) return NAN;
    double mean = mean_of(v, n), sum = 0;
    for (int i = 0; i < n; i++) sum += (v[i] - mean) * (v[i] - mean);
    return sqrt(sum / (n - 1));
}

static int compare_doubles(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

// The median (INFINITY sorts last, so a median that falls on a never-reached run is INFINITY).
static double median_of(const double *v, int n) {
    double *sorted = xmalloc(n * sizeof(double));
    memcpy(sorted, v, n * sizeof(double));
    qsort(sorted, n, sizeof(double), compare_doubles);
    double median = n % 2 ? sorted[n / 2] : (sorted[n / 2 - 1] + sorted[n / 2]) / 2;
    free(sorted);
    return median;
}

// The mean of a[end - window + 1 .. end] (NaN if any of them is NaN).
static double window_mean(const double *a, int end, int window) {
    double sum = 0;
    for (int i = end - window + 1; i <= end; i++) sum += a[i];
    return sum / window;
}

// The value a series logged at `step` (the last one if several), NaN if none.
static double value_at(const MetricSeries *s, double step) {
    double value = NAN;
    for (int i = 0; s && i < s->count; i++)
        if (s->x[i] == step) value = s->y[i];
    return value;
}

// --- options -----------------------------------------------------------------------

typedef struct {
    const char *runs, *methods, *baseline, *out_dir;
    int window;
} Args;

static void parse_args(int argc, char **argv, Args *args) {
    const char *names[] = {"runs", "methods", "baseline", "out-dir", "window"};
    const char *values[5] = {NULL, NULL, NULL, NULL, "4"};
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        if (!strcmp(arg, "--help") || !strcmp(arg, "-h")) {
            print_help();
            exit(0);
        }
        if (strncmp(arg, "--", 2)) die_user("unexpected argument '%s' (reproduction_summary --help)", arg);
        const char *name = arg + 2, *equals = strchr(name, '=');
        size_t length = equals ? (size_t)(equals - name) : strlen(name);
        int o = 0;
        while (o < 5 && !(strlen(names[o]) == length && !strncmp(names[o], name, length))) o++;
        if (o == 5) die_user("unknown option --%.*s (reproduction_summary --help)", (int)length, name);
        if (!equals && i + 1 >= argc) die_user("option --%s needs a value", names[o]);
        values[o] = equals ? equals + 1 : argv[++i];
    }
    for (int o = 0; o < 4; o++)
        if (!values[o] || !values[o][0]) die_user("missing required option --%s (reproduction_summary --help)", names[o]);
    char *end;
    long window = strtol(values[4], &end, 10);
    if (end == values[4] || *end || window < 1 || window > MAX_ITERATIONS)
        die_user("option --window expects a whole number of iterations >= 1, got '%s'", values[4]);
    *args = (Args){values[0], values[1], values[2], values[3], (int)window};
}

// A copy of [start, end) without the spaces around it.
static char *trimmed(const char *start, const char *end) {
    while (start < end && (*start == ' ' || *start == '\t')) start++;
    while (end > start && (end[-1] == ' ' || end[-1] == '\t')) end--;
    char *copy = xmalloc(end - start + 1);
    memcpy(copy, start, end - start);
    copy[end - start] = '\0';
    return copy;
}

// "dir=label,dir=label,..." in display order.
static Method *parse_methods(const char *list, int *count) {
    Method *methods = NULL;
    int n = 0;
    for (const char *entry = list;; entry++) {
        const char *comma = strchr(entry, ','), *end = comma ? comma : entry + strlen(entry);
        const char *equals = memchr(entry, '=', end - entry);
        if (!equals) die_user("option --methods: '%.*s' is not DIR=LABEL", (int)(end - entry), entry);
        methods = xrealloc(methods, (n + 1) * sizeof(Method));
        methods[n] = (Method){.dir = trimmed(entry, equals), .label = trimmed(equals + 1, end)};
        if (!methods[n].dir[0] || !methods[n].label[0])
            die_user("option --methods: '%.*s' is not DIR=LABEL", (int)(end - entry), entry);
        for (int m = 0; m < n; m++)
            if (!strcmp(methods[m].dir, methods[n].dir)) die_user("option --methods: '%s' is listed twice", methods[n].dir);
        n++;
        if (!comma) break;
        entry = comma;
    }
    *count = n;
    return methods;
}

// --- reading the runs ---------------------------------------------------------------

static int compare_names(const void *a, const void *b) {
    return strverscmp(((const Run *)a)->name, ((const Run *)b)->name); // seed2 before seed10
}

// Values of a series by iteration 1..iterations, NaN where none was logged.
static double *per_iteration(const MetricSeries *s, int iterations) {
    double *a = xmalloc((iterations + 1) * sizeof(double));
    for (int i = 0; i <= iterations; i++) a[i] = NAN;
    for (int i = 0; s && i < s->count; i++) {
        double step = s->x[i];
        if (step >= 1 && step <= iterations && step == floor(step)) a[(int)step] = s->y[i];
    }
    return a;
}

static void load_run(Run *run, int window) {
    if (run_metrics_read(run->path, &run->metrics) != 0) die_from_err();
    run->eval_score = run_metrics_find(&run->metrics, "eval/score");
    if (!run->eval_score) die_user("no evaluation lines (eval/score) in %s", run->path);
    run->last_eval_step = -INFINITY;
    for (int i = 0; i < run->eval_score->count; i++) run->last_eval_step = fmax(run->last_eval_step, run->eval_score->x[i]);
    const MetricSeries *score = run_metrics_find(&run->metrics, "train/score");
    if (!score) die_user("no training lines (train/score) in %s", run->path);
    for (int i = 0; i < score->count; i++) {
        double step = score->x[i];
        if (step < 1 || step > MAX_ITERATIONS || step != floor(step))
            die_user("train/score logged at step %g: iterations are whole numbers from 1 (%s)", step, run->path);
        if (step > run->iterations) run->iterations = (int)step;
    }
    if (run->iterations < window)
        die_user("%d training iterations, fewer than --window %d (%s)", run->iterations, window, run->path);
    run->train_score = per_iteration(score, run->iterations);
    run->kl = per_iteration(run_metrics_find(&run->metrics, "train/kl"), run->iterations);
}

// The method's seed*/metrics.jsonl files, read, in name order.
static void load_method(Method *method, const char *runs_dir, int window) {
    char *dir = fs_join(runs_dir, method->dir);
    DIR *d = opendir(dir);
    struct dirent *entry;
    while (d && (entry = readdir(d))) {
        if (strncmp(entry->d_name, "seed", 4)) continue;
        char *seed_dir = fs_join(dir, entry->d_name), *path = fs_join(seed_dir, "metrics.jsonl");
        free(seed_dir);
        if (!fs_is_file(path)) {
            free(path);
            continue;
        }
        method->runs = xrealloc(method->runs, (method->run_count + 1) * sizeof(Run));
        method->runs[method->run_count++] = (Run){.name = xstrdup(entry->d_name), .path = path};
    }
    if (d) closedir(d);
    if (method->run_count == 0)
        die_user("no seed*/metrics.jsonl in %s (method '%s' of --methods)", dir, method->dir);
    free(dir);
    qsort(method->runs, method->run_count, sizeof(Run), compare_names);
    for (int r = 0; r < method->run_count; r++) load_run(&method->runs[r], window);
    for (int r = 1; r < method->run_count; r++)
        if (method->runs[r].last_eval_step != method->runs[0].last_eval_step)
            die_user("runs of method '%s' end at different evaluation steps: %s at step %g, %s at step %g",
                     method->dir, method->runs[0].path, method->runs[0].last_eval_step, method->runs[r].path,
                     method->runs[r].last_eval_step);
}

static void free_methods(Method *methods, int count) {
    for (int m = 0; m < count; m++) {
        for (int r = 0; r < methods[m].run_count; r++) {
            Run *run = &methods[m].runs[r];
            run_metrics_free(&run->metrics);
            free(run->name), free(run->path), free(run->train_score), free(run->kl);
        }
        free(methods[m].runs), free(methods[m].dir), free(methods[m].label);
    }
    free(methods);
}

// --- the numbers -------------------------------------------------------------------

// The mean of every value a series logged (NaN when the run never logged it).
static double series_mean(const MetricSeries *s) {
    if (!s || s->count == 0) return NAN;
    return mean_of(s->y, s->count);
}

// Every run's results; the targets are the baseline's final training and held-out scores.
static void compute_results(Method *methods, int count, const Method *baseline, int window, double *train_target,
                            double *eval_target) {
    for (int m = 0; m < count; m++)
        for (int r = 0; r < methods[m].run_count; r++) {
            Run *run = &methods[m].runs[r];
            double step = run->last_eval_step;
            run->result[LAST_SCORE] = value_at(run->eval_score, step);
            run->result[LAST_GOLD] = value_at(run_metrics_find(&run->metrics, "eval/gold"), step);
            run->result[LAST_LENGTH] = value_at(run_metrics_find(&run->metrics, "eval/response_length"), step);
            run->result[FINAL_KL] = window_mean(run->kl, run->iterations, window);
            run->result[FINAL_TRAIN] = window_mean(run->train_score, run->iterations, window);
            run->result[MACRO_LENGTH] = series_mean(run_metrics_find(&run->metrics, "train/macro_action_length"));
            run->result[TRAIN_LENGTH] = series_mean(run_metrics_find(&run->metrics, "train/response_length"));
            const MetricSeries *time = run_metrics_find(&run->metrics, "time");
            run->result[WALL_TIME] = time ? time->y[time->count - 1] : NAN;
        }
    double train_sum = 0, eval_sum = 0;
    for (int r = 0; r < baseline->run_count; r++) {
        train_sum += baseline->runs[r].result[FINAL_TRAIN];
        eval_sum += baseline->runs[r].result[LAST_SCORE];
    }
    *train_target = train_sum / baseline->run_count;
    *eval_target = eval_sum / baseline->run_count;
    for (int m = 0; m < count; m++) {
        double *reach = xmalloc(methods[m].run_count * sizeof(double));
        for (int r = 0; r < methods[m].run_count; r++) {
            Run *run = &methods[m].runs[r];
            run->result[REACH] = INFINITY;
            for (int i = window; i <= run->iterations && !isfinite(run->result[REACH]); i++)
                if (window_mean(run->train_score, i, window) >= *train_target) run->result[REACH] = i;
            run->result[FIRST_EVAL] = INFINITY;
            for (int i = 0; i < run->eval_score->count; i++)
                if (run->eval_score->y[i] >= *eval_target)
                    run->result[FIRST_EVAL] = fmin(run->result[FIRST_EVAL], run->eval_score->x[i]);
            reach[r] = run->result[REACH];
        }
        methods[m].reach_median = median_of(reach, methods[m].run_count);
        free(reach);
        // The mean curve: summed in the order the target was, so that the baseline's own
        // last point equals the target exactly and its curve always reaches it.
        int common_iterations = methods[m].runs[0].iterations;
        for (int r = 1; r < methods[m].run_count; r++)
            if (methods[m].runs[r].iterations < common_iterations) common_iterations = methods[m].runs[r].iterations;
        methods[m].reach_mean_curve = INFINITY;
        for (int i = window; i <= common_iterations && !isfinite(methods[m].reach_mean_curve); i++) {
            double sum = 0;
            for (int r = 0; r < methods[m].run_count; r++) sum += window_mean(methods[m].runs[r].train_score, i, window);
            if (sum / methods[m].run_count >= *train_target) methods[m].reach_mean_curve = i;
        }
    }
}

// A method's result `which`, one value per seed (caller frees).
static double *results_of(const Method *method, int which) {
    double *v = xmalloc(method->run_count * sizeof(double));
    for (int r = 0; r < method->run_count; r++) v[r] = method->runs[r].result[which];
    return v;
}

// The mean across a method's seeds of result `which`.
static double method_mean(const Method *method, int which) {
    double *v = results_of(method, which);
    double mean = mean_of(v, method->run_count);
    free(v);
    return mean;
}

// Baseline median / this median; NaN when either median is never reached.
static double speedup(const Method *method, const Method *baseline) {
    if (!isfinite(method->reach_mean_curve) || !isfinite(baseline->reach_mean_curve)) return NAN;
    return baseline->reach_mean_curve / method->reach_mean_curve;
}

// --- summary.md and summary.tsv ---------------------------------------------------------

static void md_number(FILE *out, double v) {
    if (isfinite(v)) fprintf(out, "%.3f", v);
    else fputs("—", out);
}

static void md_count(FILE *out, double v) { // iterations and steps: whole numbers
    if (isfinite(v)) fprintf(out, "%g", v);
    else fputs("—", out);
}

static void md_text(FILE *out, const char *text) {
    for (const char *c = text; *c; c++) {
        if (*c == '|') fputc('\\', out);
        fputc(*c == '\n' || *c == '\r' ? ' ' : *c, out);
    }
}

// "mean ± sd", then " [v1, v2, ...]" when per_seed.
static void md_stat(FILE *out, const Method *method, int which, bool per_seed) {
    double *v = results_of(method, which);
    fputs(" | ", out);
    md_number(out, mean_of(v, method->run_count));
    fputs(" ± ", out);
    md_number(out, sd_of(v, method->run_count));
    if (per_seed) {
        fputs(" [", out);
        for (int r = 0; r < method->run_count; r++) {
            if (r) fputs(", ", out);
            md_number(out, v[r]);
        }
        fputs("]", out);
    }
    free(v);
}

static void md_counts(FILE *out, const Method *method, int which) {
    fputs(" | ", out);
    for (int r = 0; r < method->run_count; r++) {
        if (r) fputs(", ", out);
        md_count(out, method->runs[r].result[which]);
    }
}

// The mean of a step-0 eval metric over the runs that have one; *runs counts them.
static double initial_mean(const Method *methods, int count, const char *key, int *runs) {
    double sum = 0;
    *runs = 0;
    for (int m = 0; m < count; m++)
        for (int r = 0; r < methods[m].run_count; r++) {
            double v = value_at(run_metrics_find(&methods[m].runs[r].metrics, key), 0);
            if (isfinite(v)) sum += v, (*runs)++;
        }
    return *runs ? sum / *runs : NAN;
}

static void write_markdown(FILE *out, const Method *methods, int count, const Method *baseline, int window,
                           double train_target, double eval_target) {
    fputs("| method | seeds | held-out RM score | held-out gold score | KL | held-out response length | iterations to reach ",
          out);
    md_text(out, baseline->label);
    fputs("'s final training score | speed-up vs ", out);
    md_text(out, baseline->label);
    fputs(" | first eval step with RM score ≥ ", out);
    md_text(out, baseline->label);
    fputs("'s final held-out score |\n|---|---|---|---|---|---|---|---|---|\n", out);
    for (int m = 0; m < count; m++) {
        const Method *method = &methods[m];
        fputs("| ", out);
        md_text(out, method->label);
        fprintf(out, " | %d", method->run_count);
        md_stat(out, method, LAST_SCORE, true);
        md_stat(out, method, LAST_GOLD, true);
        md_stat(out, method, FINAL_KL, false);
        fputs(" | ", out);
        md_number(out, method_mean(method, LAST_LENGTH));
        md_counts(out, method, REACH);
        fputs(" (median ", out);
        md_count(out, method->reach_median);
        fputs("; mean curve ", out);
        md_count(out, method->reach_mean_curve);
        fputs(") | ", out);
        md_number(out, speedup(method, baseline));
        md_counts(out, method, FIRST_EVAL);
        fputs(" |\n", out);
    }

    fputs("\nEach ± cell is the mean ± sample standard deviation across a method's seeds (in name order, "
          "per-seed values in brackets). Held-out numbers are at the last evaluation (step ", out);
    bool same_step = true; // one last step for every method: say it once
    for (int m = 1; m < count; m++) same_step &= methods[m].runs[0].last_eval_step == methods[0].runs[0].last_eval_step;
    for (int m = 0; m < (same_step ? 1 : count); m++) {
        fprintf(out, "%s%g", m ? ", " : "", methods[m].runs[0].last_eval_step);
        if (!same_step) fputs(" for ", out), md_text(out, methods[m].label);
    }
    fprintf(out, "); KL is train/kl averaged over each run's last %d iterations. ", window);
    fputs("The baseline's final training score, ", out);
    md_number(out, train_target);
    fputs(", is the mean over ", out);
    md_text(out, baseline->label);
    fprintf(out, "'s seeds of train/score averaged over their last %d iterations. A run's iterations to reach it "
                 "is the first iteration i ≥ %d at which the trailing moving average of train/score ",
            window, window);
    if (window > 1) fprintf(out, "over iterations i−%d..i is ≥ ", window - 1);
    else fputs("at iteration i is ≥ ", out);
    md_number(out, train_target);
    fputs(" (— where it never is); the median counts a run that never reaches it as infinitely many iterations. "
          "The mean curve is the mean across a method's seeds of those moving averages (the line of "
          "train_score.svg); it reaches the target at the iteration given, and the speed-up is ", out);
    md_text(out, baseline->label);
    fputs("'s mean-curve iteration divided by the method's (— when the method's never reaches it). "
          "The baseline's final held-out score, ", out);
    md_number(out, eval_target);
    fputs(", is the mean over ", out);
    md_text(out, baseline->label);
    fputs("'s seeds of eval/score at the last evaluation; the last column is each run's first evaluation step with "
          "eval/score ≥ it. ", out);
    int score_runs, gold_runs, all_runs = 0;
    for (int m = 0; m < count; m++) all_runs += methods[m].run_count;
    double initial_score = initial_mean(methods, count, "eval/score", &score_runs);
    double initial_gold = initial_mean(methods, count, "eval/gold", &gold_runs);
    fputs("Initial (step 0) held-out RM score ", out);
    md_number(out, initial_score);
    fputs(" and gold score ", out);
    md_number(out, initial_gold);
    if (score_runs == all_runs && gold_runs == all_runs) fprintf(out, ": the mean over all %d runs. ", all_runs);
    else fprintf(out, ": the mean over the runs that have one (%d and %d of %d). ", score_runs, gold_runs, all_runs);
    fputs("summary.tsv holds the same numbers (inf: never reached; nan: undefined).\n", out);

    // What the runs did: the termination condition's macro-action length, and the compute.
    fputs("\n| method | macro-action length (tokens) | training response length (tokens) | run time (s) |\n"
          "|---|---|---|---|\n", out);
    for (int m = 0; m < count; m++) {
        fputs("| ", out);
        md_text(out, methods[m].label);
        md_stat(out, &methods[m], MACRO_LENGTH, false);
        md_stat(out, &methods[m], TRAIN_LENGTH, false);
        md_stat(out, &methods[m], WALL_TIME, false);
        fputs(" |\n", out);
    }
    fputs("\nAveraged over every training iteration of a run (macro-action length: train/macro_action_length, "
          "response tokens per macro action); run time: the run's last logged time, generation, experience, "
          "training, evaluations and checkpoints included.\n", out);
}

static void tsv_number(FILE *out, double v) {
    if (isnan(v)) fputs("nan", out);
    else if (isinf(v)) fputs(v > 0 ? "inf" : "-inf", out);
    else fprintf(out, "%.6g", v);
}

static void tsv_text(FILE *out, const char *text) {
    for (const char *c = text; *c; c++) fputc(*c == '\t' || *c == '\n' || *c == '\r' ? ' ' : *c, out);
}

// "\tmean\tsd\tv1,v2,..." (the per-seed list only when per_seed).
static void tsv_stat(FILE *out, const Method *method, int which, bool per_seed) {
    double *v = results_of(method, which);
    fputc('\t', out);
    tsv_number(out, mean_of(v, method->run_count));
    fputc('\t', out);
    tsv_number(out, sd_of(v, method->run_count));
    if (per_seed) {
        fputc('\t', out);
        for (int r = 0; r < method->run_count; r++) {
            if (r) fputc(',', out);
            tsv_number(out, v[r]);
        }
    }
    free(v);
}

static void tsv_per_seed(FILE *out, const Method *method, int which) {
    fputc('\t', out);
    for (int r = 0; r < method->run_count; r++) {
        if (r) fputc(',', out);
        tsv_number(out, method->runs[r].result[which]);
    }
}

static void write_tsv(FILE *out, const Method *methods, int count, const Method *baseline) {
    fputs("method\tlabel\tseeds\tseed_names\tlast_eval_step\theldout_score_mean\theldout_score_sd\theldout_score_per_seed"
          "\theldout_gold_mean\theldout_gold_sd\theldout_gold_per_seed\tkl_mean\tkl_sd\theldout_response_length_mean"
          "\tfinal_train_score_per_seed\titerations_to_reach_per_seed\titerations_to_reach_median\titerations_to_reach_mean_curve\tspeedup"
          "\tfirst_eval_step_reaching_per_seed\tmacro_action_length_mean\ttrain_response_length_mean\trun_time_mean\n",
          out);
    for (int m = 0; m < count; m++) {
        const Method *method = &methods[m];
        tsv_text(out, method->dir);
        fputc('\t', out);
        tsv_text(out, method->label);
        fprintf(out, "\t%d\t", method->run_count);
        for (int r = 0; r < method->run_count; r++) {
            if (r) fputc(',', out);
            tsv_text(out, method->runs[r].name);
        }
        fputc('\t', out);
        tsv_number(out, method->runs[0].last_eval_step);
        tsv_stat(out, method, LAST_SCORE, true);
        tsv_stat(out, method, LAST_GOLD, true);
        tsv_stat(out, method, FINAL_KL, false);
        fputc('\t', out);
        tsv_number(out, method_mean(method, LAST_LENGTH));
        tsv_per_seed(out, method, FINAL_TRAIN);
        tsv_per_seed(out, method, REACH);
        fputc('\t', out);
        tsv_number(out, method->reach_median);
        fputc('\t', out);
        tsv_number(out, method->reach_mean_curve);
        fputc('\t', out);
        tsv_number(out, speedup(method, baseline));
        tsv_per_seed(out, method, FIRST_EVAL);
        const int done[] = {MACRO_LENGTH, TRAIN_LENGTH, WALL_TIME};
        for (int d = 0; d < 3; d++) {
            fputc('\t', out);
            tsv_number(out, method_mean(method, done[d]));
        }
        fputc('\n', out);
    }
}

// --- figures -----------------------------------------------------------------------

static void curve_init(Curve *curve, int capacity) {
    capacity = capacity > 0 ? capacity : 1;
    *curve = (Curve){xmalloc(capacity * sizeof(double)), xmalloc(capacity * sizeof(double)),
                     xmalloc(capacity * sizeof(double)), xmalloc(capacity * sizeof(double)), 0};
}

// Adds the point x if every one of the n values is finite.
static void curve_add(Curve *curve, double x, const double *values, int n) {
    double low = INFINITY, high = -INFINITY;
    for (int i = 0; i < n; i++) {
        if (!isfinite(values[i])) return;
        low = fmin(low, values[i]), high = fmax(high, values[i]);
    }
    int i = curve->count++;
    curve->x[i] = x, curve->mean[i] = mean_of(values, n), curve->low[i] = low, curve->high[i] = high;
}

static void curve_free(Curve *curve) { free(curve->x), free(curve->mean), free(curve->low), free(curve->high); }

// An eval metric at each step that all of the method's runs evaluated.
static void eval_curve(Curve *curve, const Method *method, const char *key) {
    const MetricSeries *first = run_metrics_find(&method->runs[0].metrics, key);
    curve_init(curve, first ? first->count : 0);
    double *values = xmalloc(method->run_count * sizeof(double));
    for (int i = 0; first && i < first->count; i++) {
        bool seen = false;
        for (int j = 0; j < i; j++) seen |= first->x[j] == first->x[i];
        if (seen) continue;
        for (int r = 0; r < method->run_count; r++)
            values[r] = value_at(run_metrics_find(&method->runs[r].metrics, key), first->x[i]);
        curve_add(curve, first->x[i], values, method->run_count);
    }
    free(values);
}

// The training score's trailing moving average (moving = true, from iteration `window` on)
// or the KL, at each iteration that all of the method's runs have.
static void train_curve(Curve *curve, const Method *method, bool moving, int window) {
    int iterations = method->runs[0].iterations;
    for (int r = 1; r < method->run_count; r++)
        if (method->runs[r].iterations < iterations) iterations = method->runs[r].iterations;
    curve_init(curve, iterations);
    double *values = xmalloc(method->run_count * sizeof(double));
    for (int i = moving ? window : 1; i <= iterations; i++) {
        for (int r = 0; r < method->run_count; r++)
            values[r] = moving ? window_mean(method->runs[r].train_score, i, window) : method->runs[r].kl[i];
        curve_add(curve, i, values, method->run_count);
    }
    free(values);
}

enum { HELDOUT_SCORE, HELDOUT_GOLD, TRAIN_SCORE, KL_FIGURE };

static void write_figure(const char *out_dir, int figure, const Method *methods, int count, int window) {
    const char *files[] = {"heldout_score.svg", "heldout_gold.svg", "train_score.svg", "kl.svg"};
    const char *y_labels[] = {"held-out RM score", "held-out gold score", "training RM score", "KL (train/kl)"};
    char title[128];
    if (figure == HELDOUT_SCORE) snprintf(title, sizeof title, "Held-out RM score: mean, min–max over seeds");
    if (figure == HELDOUT_GOLD) snprintf(title, sizeof title, "Held-out gold score: mean, min–max over seeds");
    if (figure == TRAIN_SCORE) snprintf(title, sizeof title, "Training score: %d-iteration moving average", window);
    if (figure == KL_FIGURE) snprintf(title, sizeof title, "KL to the reference policy (train/kl)");
    Curve *curves = xcalloc(count, sizeof(Curve));
    SvgSeries *series = xcalloc(count, sizeof(SvgSeries));
    for (int m = 0; m < count; m++) {
        if (figure == HELDOUT_SCORE) eval_curve(&curves[m], &methods[m], "eval/score");
        if (figure == HELDOUT_GOLD) eval_curve(&curves[m], &methods[m], "eval/gold");
        if (figure == TRAIN_SCORE || figure == KL_FIGURE) train_curve(&curves[m], &methods[m], figure == TRAIN_SCORE, window);
        series[m] = (SvgSeries){.label = methods[m].label, .colour = m, .x = curves[m].x, .y = curves[m].mean,
                                .count = curves[m].count, .y_low = curves[m].low, .y_high = curves[m].high};
    }
    char *text = NULL;
    size_t size = 0;
    FILE *out = open_memstream(&text, &size);
    SvgPlotOptions options = {.x_label = "iteration", .y_label = y_labels[figure], .standalone = true};
    svg_line_plot_with(out, title, series, count, &options);
    fclose(out);
    char *path = fs_join(out_dir, files[figure]);
    if (fs_write_file_atomic(path, text, size) != 0) die_from_err();
    free(path), free(text), free(series);
    for (int m = 0; m < count; m++) curve_free(&curves[m]);
    free(curves);
}

// The text an open_memstream writer produced, written to OUT_DIR/name.
static void write_text(const char *out_dir, const char *name, char *text, size_t size) {
    char *path = fs_join(out_dir, name);
    if (fs_write_file_atomic(path, text, size) != 0) die_from_err();
    free(path);
}

int main(int argc, char **argv) {
    Args args;
    parse_args(argc, argv, &args);
    int count;
    Method *methods = parse_methods(args.methods, &count);
    const Method *baseline = NULL;
    for (int m = 0; m < count; m++)
        if (!strcmp(methods[m].dir, args.baseline)) baseline = &methods[m];
    if (!baseline) die_user("option --baseline: '%s' is not one of the --methods", args.baseline);
    if (!fs_is_dir(args.runs)) die_user("option --runs: no folder %s", args.runs);
    for (int m = 0; m < count; m++) load_method(&methods[m], args.runs, args.window);
    double train_target, eval_target;
    compute_results(methods, count, baseline, args.window, &train_target, &eval_target);

    if (fs_mkdir_p(args.out_dir) != 0) die_from_err();
    char *markdown = NULL, *tsv = NULL;
    size_t markdown_size = 0, tsv_size = 0;
    FILE *out = open_memstream(&markdown, &markdown_size);
    write_markdown(out, methods, count, baseline, args.window, train_target, eval_target);
    fclose(out);
    out = open_memstream(&tsv, &tsv_size);
    write_tsv(out, methods, count, baseline);
    fclose(out);
    write_text(args.out_dir, "summary.md", markdown, markdown_size);
    write_text(args.out_dir, "summary.tsv", tsv, tsv_size);
    for (int figure = HELDOUT_SCORE; figure <= KL_FIGURE; figure++)
        write_figure(args.out_dir, figure, methods, count, args.window);
    fputs(markdown, stdout);
    fprintf(stderr, "reproduction_summary: summary.md, summary.tsv, heldout_score.svg, heldout_gold.svg, "
                    "train_score.svg, kl.svg in %s\n", args.out_dir);
    free(markdown), free(tsv);
    free_methods(methods, count);
    return 0;
}
