// Run reports: one self-contained HTML page (inline CSS and SVG, no network) with a plot
// of every metric a run logged (metrics.jsonl: SFT, RM or PPO runs alike), several runs
// overlaid with one colour each, a summary table, and the evaluation samples of each run
// at its first and last evaluation side by side.
#include "eval/report.h"

#include <dirent.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/check.h"
#include "eval/svg_plot.h"
#include "io/fs.h"
#include "io/jsonl.h"

typedef struct {
    char *dir, *name;
    RunMetrics metrics;
    json_t *first_samples, *last_samples; // arrays of sample objects, or NULL
    char *first_label, *last_label;
} RunData;

enum { SAMPLE_ROWS = 8 };

static MetricSeries *series_for(RunMetrics *metrics, const char *key) {
    for (int i = 0; i < metrics->count; i++)
        if (!strcmp(metrics->series[i].key, key)) return &metrics->series[i];
    metrics->series = xrealloc(metrics->series, (metrics->count + 1) * sizeof(MetricSeries));
    MetricSeries *s = &metrics->series[metrics->count++];
    memset(s, 0, sizeof *s);
    s->key = xstrdup(key);
    return s;
}

static void series_add(MetricSeries *s, double x, double y) {
    if (s->count == s->capacity) {
        s->capacity = s->capacity ? 2 * s->capacity : 64;
        s->x = xrealloc(s->x, s->capacity * sizeof(double));
        s->y = xrealloc(s->y, s->capacity * sizeof(double));
    }
    s->x[s->count] = x, s->y[s->count] = y;
    s->count++;
}

int run_metrics_read(const char *path, RunMetrics *metrics) {
    memset(metrics, 0, sizeof *metrics);
    JsonlReader reader;
    int rc = jsonl_open(&reader, path, 0);
    if (rc != 0) return -1;
    json_t *row;
    while ((rc = jsonl_next(&reader, &row)) == 1) {
        json_t *step = json_object_get(row, "step");
        if (!json_is_object(row) || !json_is_number(step)) {
            json_decref(row);
            rc = err_set("a metrics line without a numeric \"step\" (%s:%ld)", reader.path, reader.line_number);
            break;
        }
        const char *key;
        json_t *value;
        json_object_foreach(row, key, value) {
            if (!strcmp(key, "step") || !json_is_number(value)) continue;
            series_add(series_for(metrics, key), json_number_value(step), json_number_value(value));
        }
        json_decref(row);
    }
    jsonl_close(&reader);
    if (rc < 0) {
        run_metrics_free(metrics);
        return -1;
    }
    return 0;
}

const MetricSeries *run_metrics_find(const RunMetrics *metrics, const char *key) {
    for (int i = 0; i < metrics->count; i++)
        if (!strcmp(metrics->series[i].key, key)) return &metrics->series[i];
    return NULL;
}

void run_metrics_free(RunMetrics *metrics) {
    for (int i = 0; i < metrics->count; i++)
        free(metrics->series[i].key), free(metrics->series[i].x), free(metrics->series[i].y);
    free(metrics->series);
    memset(metrics, 0, sizeof *metrics);
}

static int load_metrics(RunData *run) {
    char *path = fs_join(run->dir, "metrics.jsonl");
    int rc = fs_is_file(path) ? run_metrics_read(path, &run->metrics)
                              : err_set("%s has no metrics.jsonl: is it a marlhf run folder? (%s)", run->dir, path);
    free(path);
    return rc;
}

static int compare_strings(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static json_t *load_samples(const char *path) {
    JsonlReader reader;
    if (jsonl_open(&reader, path, 0) != 0) return NULL;
    json_t *rows = json_array(), *row;
    int rc;
    while ((rc = jsonl_next(&reader, &row)) == 1) {
        if (json_is_object(row)) json_array_append(rows, row);
        json_decref(row);
    }
    jsonl_close(&reader);
    if (rc < 0) {
        json_decref(rows);
        return NULL;
    }
    return rows;
}

// samples/eval-*.jsonl in order and samples/final.jsonl: the first and the last.
static int load_sample_files(RunData *run) {
    char *dir = fs_join(run->dir, "samples");
    DIR *d = opendir(dir);
    if (!d) {
        free(dir);
        return 0; // SFT and RM runs have none
    }
    char **names = NULL;
    int count = 0;
    struct dirent *entry;
    while ((entry = readdir(d))) {
        size_t n = strlen(entry->d_name);
        if (n > 6 && !strcmp(entry->d_name + n - 6, ".jsonl")) {
            names = xrealloc(names, (count + 1) * sizeof(char *));
            names[count++] = xstrdup(entry->d_name);
        }
    }
    closedir(d);
    qsort(names, count, sizeof(char *), compare_strings); // eval-000000 < eval-000010 < final
    int rc = 0;
    if (count > 0) {
        char *first = fs_join(dir, names[0]), *last = fs_join(dir, names[count - 1]);
        run->first_samples = load_samples(first);
        run->last_samples = count > 1 ? load_samples(last) : NULL;
        if (!run->first_samples || (count > 1 && !run->last_samples)) rc = -1;
        run->first_label = xstrdup(names[0]);
        run->last_label = xstrdup(names[count - 1]);
        free(first), free(last);
    }
    for (int i = 0; i < count; i++) free(names[i]);
    free(names), free(dir);
    return rc;
}

static void run_free(RunData *run) {
    run_metrics_free(&run->metrics);
    free(run->dir), free(run->name), free(run->first_label), free(run->last_label);
    if (run->first_samples) json_decref(run->first_samples);
    if (run->last_samples) json_decref(run->last_samples);
}

// A run's display name: its folder's last component (or the one before final/).
static char *run_name(const char *dir) {
    char *copy = xstrdup(dir);
    size_t n = strlen(copy);
    while (n > 1 && copy[n - 1] == '/') copy[--n] = '\0';
    const char *slash = strrchr(copy, '/');
    char *name = xstrdup(slash ? slash + 1 : copy);
    free(copy);
    return name;
}

static const MetricSeries *find_metric(const RunData *run, const char *key) {
    return run_metrics_find(&run->metrics, key);
}

static void cell_value(FILE *out, const MetricSeries *s, bool last) {
    if (!s || s->count == 0) {
        fputs("<td>–</td>", out);
        return;
    }
    fprintf(out, "<td>%.4g</td>", last ? s->y[s->count - 1] : s->y[0]);
}

static void write_summary(FILE *out, RunData *runs, int count) {
    fputs("<h2>Summary</h2><table class=\"summary\"><tr><th>run</th><th>steps</th><th>eval score first</th>"
          "<th>eval score last</th><th>eval gold first</th><th>eval gold last</th><th>eval win rate last</th><th>KL last</th>"
          "<th>eval loss last</th><th>eval accuracy last</th><th>time (s)</th></tr>\n", out);
    for (int r = 0; r < count; r++) {
        const RunData *run = &runs[r];
        double steps = 0;
        for (int i = 0; i < run->metrics.count; i++)
            for (int j = 0; j < run->metrics.series[i].count; j++) steps = fmax(steps, run->metrics.series[i].x[j]);
        fprintf(out, "<tr><td><span class=\"swatch\" style=\"background:%s\"></span>", svg_series_colour(r));
        svg_write_escaped(out, run->name);
        fprintf(out, "</td><td>%.0f</td>", steps);
        cell_value(out, find_metric(run, "eval/score"), false);
        cell_value(out, find_metric(run, "eval/score"), true);
        cell_value(out, find_metric(run, "eval/gold"), false);
        cell_value(out, find_metric(run, "eval/gold"), true);
        cell_value(out, find_metric(run, "eval/win_rate"), true); // against the run's iteration 0
        cell_value(out, find_metric(run, "train/kl"), true);
        cell_value(out, find_metric(run, "eval/loss"), true);
        cell_value(out, find_metric(run, "eval/accuracy"), true);
        cell_value(out, find_metric(run, "time"), true);
        fputs("</tr>\n", out);
    }
    fputs("</table>\n", out);
}

// Every metric key of any run, eval/ first, then train/, then the rest, each in the order
// first seen.
static char **all_keys(RunData *runs, int count, int *key_count) {
    char **keys = NULL;
    int n = 0;
    const char *prefixes[] = {"eval/", "train/", ""};
    for (int p = 0; p < 3; p++)
        for (int r = 0; r < count; r++)
            for (int i = 0; i < runs[r].metrics.count; i++) {
                const char *key = runs[r].metrics.series[i].key;
                bool matches = p < 2 ? !strncmp(key, prefixes[p], strlen(prefixes[p]))
                                     : strncmp(key, "eval/", 5) && strncmp(key, "train/", 6);
                bool seen = false;
                for (int k = 0; k < n && !seen; k++) seen = !strcmp(keys[k], key);
                if (matches && !seen) {
                    keys = xrealloc(keys, (n + 1) * sizeof(char *));
                    keys[n++] = xstrdup(key);
                }
            }
    *key_count = n;
    return keys;
}

static void write_plots(FILE *out, RunData *runs, int count) {
    int key_count;
    char **keys = all_keys(runs, count, &key_count);
    fputs("<h2>Metrics</h2><div class=\"plots\">\n", out);
    SvgSeries *series = xcalloc(count, sizeof(SvgSeries));
    for (int k = 0; k < key_count; k++) {
        int used = 0;
        for (int r = 0; r < count; r++) {
            const MetricSeries *s = find_metric(&runs[r], keys[k]);
            if (!s) continue;
            series[used++] = (SvgSeries){.label = runs[r].name, .colour = r, .x = s->x, .y = s->y, .count = s->count};
        }
        svg_line_plot(out, keys[k], series, used);
        free(keys[k]);
    }
    fputs("</div>\n", out);
    free(series), free(keys);
}

static void write_field(FILE *out, json_t *row, const char *key) {
    json_t *value = json_object_get(row, key);
    if (json_is_string(value)) svg_write_escaped(out, json_string_value(value));
    else if (json_is_number(value)) fprintf(out, "%.4g", json_number_value(value));
    else fputs("–", out);
}

static void write_samples(FILE *out, RunData *runs, int count) {
    bool any = false;
    for (int r = 0; r < count; r++) any |= runs[r].first_samples != NULL;
    if (!any) return;
    fputs("<h2>Samples</h2>\n", out);
    for (int r = 0; r < count; r++) {
        const RunData *run = &runs[r];
        if (!run->first_samples) continue;
        fputs("<h3>", out);
        svg_write_escaped(out, run->name);
        fputs("</h3><table class=\"samples\"><tr><th>prompt</th><th>", out);
        svg_write_escaped(out, run->first_label);
        fputs("</th><th>reward</th><th>gold</th>", out);
        if (run->last_samples) {
            fputs("<th>", out);
            svg_write_escaped(out, run->last_label);
            fputs("</th><th>reward</th><th>gold</th>", out);
        }
        fputs("</tr>\n", out);
        size_t rows = json_array_size(run->first_samples);
        for (size_t i = 0; i < rows && i < SAMPLE_ROWS; i++) {
            json_t *first = json_array_get(run->first_samples, i);
            fputs("<tr><td>", out);
            write_field(out, first, "prompt");
            fputs("</td><td>", out);
            write_field(out, first, "response");
            fputs("</td><td>", out);
            write_field(out, first, "reward");
            fputs("</td><td>", out);
            write_field(out, first, "gold");
            fputs("</td>", out);
            json_t *last = run->last_samples ? json_array_get(run->last_samples, i) : NULL;
            if (run->last_samples) {
                fputs("<td>", out);
                if (last) write_field(out, last, "response");
                fputs("</td><td>", out);
                if (last) write_field(out, last, "reward");
                fputs("</td><td>", out);
                if (last) write_field(out, last, "gold");
                fputs("</td>", out);
            }
            fputs("</tr>\n", out);
        }
        fputs("</table>\n", out);
    }
}

static const char *page_style =
    "body{font-family:system-ui,sans-serif;margin:24px;color:#222;max-width:1400px}"
    "h1{font-size:22px}h2{font-size:18px;margin-top:28px}h3{font-size:15px}"
    "table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #ccc;padding:4px 6px;vertical-align:top}"
    "th{background:#f4f4f4}.samples td{max-width:320px}.swatch{display:inline-block;width:10px;height:10px;margin-right:6px}"
    ".plots{display:flex;flex-wrap:wrap;gap:8px}.plot{border:1px solid #eee}"
    ".plot-title{font-size:13px;font-weight:600}.tick,.axis,.legend{font-size:10px;fill:#444}"
    ".frame{fill:none;stroke:#999}.grid{stroke:#eee}.no-data{font-size:12px;fill:#999}";

// Counts the plots whose lines or dots have a size once laid out: the page's own check
// that it rendered, read back by the tests (tests/cli/report.sh, headless Chromium).
static const char *page_script =
    "window.addEventListener('load',function(){var n=0,plots=document.querySelectorAll('svg.plot');"
    "plots.forEach(function(svg){var shapes=svg.querySelectorAll('.series'),ok=false;"
    "shapes.forEach(function(s){var b=s.getBBox();if(b.width>0||b.height>0)ok=true;});if(ok)n++;});"
    "document.body.setAttribute('data-plots',plots.length);document.body.setAttribute('data-plots-rendered',n);});";

int report_write(const char *const *run_dirs, int count, const char *output, const char *title) {
    RunData *runs = xcalloc(count, sizeof(RunData));
    int rc = 0;
    for (int r = 0; r < count && rc == 0; r++) {
        runs[r].dir = xstrdup(run_dirs[r]);
        runs[r].name = run_name(run_dirs[r]);
        if (!fs_is_dir(run_dirs[r])) rc = err_set("no run folder %s", run_dirs[r]);
        if (rc == 0) rc = load_metrics(&runs[r]);
        if (rc == 0) rc = load_sample_files(&runs[r]);
    }
    if (rc == 0) {
        char *page = NULL;
        size_t size = 0;
        FILE *out = open_memstream(&page, &size);
        fputs("<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>", out);
        svg_write_escaped(out, title);
        fprintf(out, "</title><style>%s</style><script>%s</script></head><body><h1>", page_style, page_script);
        svg_write_escaped(out, title);
        fputs("</h1><p>Runs: ", out);
        for (int r = 0; r < count; r++) {
            fprintf(out, "%s<code>", r ? ", " : "");
            svg_write_escaped(out, runs[r].dir);
            fputs("</code>", out);
        }
        fputs(". Written by <code>marlhf report</code>.</p>\n", out);
        write_summary(out, runs, count);
        write_plots(out, runs, count);
        write_samples(out, runs, count);
        fputs("</body></html>\n", out);
        fclose(out);
        rc = fs_write_file_atomic(output, page, size);
        free(page);
    }
    for (int r = 0; r < count; r++) run_free(&runs[r]);
    free(runs);
    return rc;
}
