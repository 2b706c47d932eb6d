// TensorBoard event files: scalar summaries written as TFRecords of Event protocol
// buffers, so `tensorboard --logdir RUN_DIR` plots a run with no Python in marlhf.
//
// A record is: uint64 length, uint32 masked CRC-32C of the length, the bytes, uint32
// masked CRC-32C of the bytes. The Event message is encoded by hand: wall_time (1,
// double), step (2, int64), file_version (3, string) or summary (5) holding values
// (1) each with tag (1, string) and simple_value (2, float).
#pragma once
#include <stdint.h>
#include <stdio.h>

typedef struct {
    FILE *file;
    char *path;
} TfEventsWriter;

// Creates RUN_DIR/events.out.tfevents.<seconds>.marlhf.<pid> and writes the version event.
int tfevents_open(TfEventsWriter *writer, const char *run_dir);
// One scalar (tag, value) at `step`. Flushed at once so a killed run loses nothing.
int tfevents_scalar(TfEventsWriter *writer, const char *tag, long step, double wall_time, float value);
void tfevents_close(TfEventsWriter *writer);

// CRC-32C (Castagnoli) of bytes, and TFRecord's masked form.
uint32_t crc32c(const void *data, size_t length);
uint32_t crc32c_masked(const void *data, size_t length);
