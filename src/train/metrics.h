// A run's metrics: one JSON object per line in RUN_DIR/metrics.jsonl ({"step", "time",
// name: value, ...}) and the same scalars in a TensorBoard event file. On resume, lines
// after the checkpoint's step are dropped so the file reads as one uninterrupted run.
#pragma once
#include <stdbool.h>

#include "io/tfevents.h"

typedef struct {
    char *path;
    FILE *jsonl;
    TfEventsWriter events;
    double start_time;
} MetricsWriter;

// resume_step < 0: start fresh (an existing metrics.jsonl is replaced); else keep the
// lines with step <= resume_step and append.
int metrics_open(MetricsWriter *writer, const char *run_dir, long resume_step);
// A writer that logs nothing: the ranks other than 0 of a data-parallel run.
void metrics_open_none(MetricsWriter *writer);
// Logs names[i] = values[i] at `step` under `prefix` ("train", "eval", ...): JSON keys and
// TensorBoard tags are "<prefix>/<name>".
int metrics_log(MetricsWriter *writer, const char *prefix, long step, const char *const *names,
                const double *values, int count);
void metrics_close(MetricsWriter *writer);
