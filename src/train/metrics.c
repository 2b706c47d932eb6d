#include "train/metrics.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <string.h>

#include "core/check.h"
#include "core/timer.h"
#include "io/fs.h"

int metrics_open(MetricsWriter *writer, const char *run_dir, long resume_step) {
    memset(writer, 0, sizeof *writer);
    if (fs_mkdir_p(run_dir) != 0) return -1;
    writer->path = fs_join(run_dir, "metrics.jsonl");
    char *kept = NULL;
    size_t kept_length = 0;
    if (resume_step >= 0 && fs_is_file(writer->path)) {
        // Keep the lines of steps the checkpoint covers; later ones are redone.
        FILE *old = fopen(writer->path, "r");
        if (!old) return err_set("cannot read %s: %s", writer->path, strerror(errno));
        FILE *memory = open_memstream(&kept, &kept_length);
        char *line = NULL;
        size_t capacity = 0;
        while (getline(&line, &capacity, old) > 0) {
            json_t *value = json_loads(line, 0, NULL);
            json_t *step = value ? json_object_get(value, "step") : NULL;
            if (step && json_is_integer(step) && json_integer_value(step) <= resume_step) fputs(line, memory);
            json_decref(value);
        }
        free(line);
        fclose(old);
        fclose(memory);
    }
    if (fs_write_file_atomic(writer->path, kept ? kept : "", kept_length) != 0) {
        free(kept);
        return -1;
    }
    free(kept);
    writer->jsonl = fopen(writer->path, "a");
    if (!writer->jsonl) return err_set("cannot append to %s: %s", writer->path, strerror(errno));
    writer->start_time = now_seconds();
    return tfevents_open(&writer->events, run_dir);
}

void metrics_open_none(MetricsWriter *writer) { memset(writer, 0, sizeof *writer); }

int metrics_log(MetricsWriter *writer, const char *prefix, long step, const char *const *names,
                const double *values, int count) {
    if (!writer->jsonl) return 0; // metrics_open_none
    json_t *line = json_object();
    json_object_set_new(line, "step", json_integer(step));
    json_object_set_new(line, "time", json_real(now_seconds() - writer->start_time));
    double wall_time = (double)time(NULL);
    for (int i = 0; i < count; i++) {
        char key[160];
        snprintf(key, sizeof key, "%s/%s", prefix, names[i]);
        // JSON has no NaN or infinity: those become null (and still reach TensorBoard).
        json_object_set_new(line, key, isfinite(values[i]) ? json_real(values[i]) : json_null());
        if (tfevents_scalar(&writer->events, key, step, wall_time, (float)values[i]) != 0) {
            json_decref(line);
            return -1;
        }
    }
    char *text = json_dumps(line, JSON_COMPACT | JSON_REAL_PRECISION(10));
    json_decref(line);
    int rc = 0;
    if (fprintf(writer->jsonl, "%s\n", text) < 0 || fflush(writer->jsonl) != 0)
        rc = err_set("cannot write %s: %s", writer->path, strerror(errno));
    free(text);
    return rc;
}

void metrics_close(MetricsWriter *writer) {
    if (writer->jsonl) fclose(writer->jsonl);
    tfevents_close(&writer->events);
    free(writer->path);
    memset(writer, 0, sizeof *writer);
}
