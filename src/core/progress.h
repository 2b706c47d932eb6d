// A progress bar for long work: on a terminal, one line redrawn in place with the count,
// rate and ETA (and an optional status such as the loss); otherwise a plain line at most
// every `interval` seconds, so logs stay readable.
#pragma once
#include <stdbool.h>

typedef struct {
    const char *label;
    const char *unit;   // "rows", "steps", ...
    long total;         // 0 if unknown
    long done;
    double start_time, last_print;
    double interval;    // seconds between plain lines
    bool tty;
    bool finished;
    bool quiet; // print nothing
} Progress;

void progress_start(Progress *p, const char *label, long total, const char *unit);
// Advances by `amount` and redraws if due. `status` (may be NULL) is appended, e.g. "loss 2.31".
void progress_update(Progress *p, long amount, const char *status);
void progress_finish(Progress *p, const char *status);
