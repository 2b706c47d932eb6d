// Run reports (`marlhf report`): a self-contained HTML page with a plot of every metric of
// one or more run folders, overlaid, and their evaluation samples before and after.
#pragma once

// Reads each folder's metrics.jsonl (and samples/*.jsonl when present) and writes the page
// to `output` atomically. Returns 0, or -1 with err_set() naming the file.
int report_write(const char *const *run_dirs, int count, const char *output, const char *title);

// A run's metrics.jsonl read back (also used by tools/reproduction_summary.c): one series
// per key, in the order first seen, each the (step, value) pairs of the lines that have a
// number under that key, in file order. "step" itself is not a series.
typedef struct {
    char *key;
    double *x, *y; // x: the line's "step"
    int count, capacity;
} MetricSeries;

typedef struct {
    MetricSeries *series;
    int count;
} RunMetrics;

// Reads a metrics.jsonl file into *metrics. Returns 0, or -1 with err_set() naming the file
// and line (invalid JSON, a line without a numeric "step"); *metrics is then empty.
int run_metrics_read(const char *path, RunMetrics *metrics);
// The series of `key`, or NULL if no line has it.
const MetricSeries *run_metrics_find(const RunMetrics *metrics, const char *key);
void run_metrics_free(RunMetrics *metrics);
