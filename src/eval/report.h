// Run reports (`marlhf report`): a self-contained HTML page with a plot of every metric of
// one or more run folders, overlaid, and their evaluation samples before and after.
#pragma once

// Reads each folder's metrics.jsonl (and samples/*.jsonl when present) and writes the page
// to `output` atomically. Returns 0, or -1 with err_set() naming the file.
int report_write(const char *const *run_dirs, int count, const char *output, const char *title);
