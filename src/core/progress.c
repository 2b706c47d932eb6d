#include "core/progress.h"

#include <stdio.h>
#include <unistd.h>

#include "core/timer.h"

void progress_start(Progress *p, const char *label, long total, const char *unit) {
    *p = (Progress){.label = label, .unit = unit, .total = total, .interval = 10.0};
    p->tty = isatty(fileno(stderr));
    p->start_time = p->last_print = now_seconds();
}

static void format_duration(char *out, size_t size, double seconds) {
    long s = (long)(seconds + 0.5);
    if (s >= 3600) snprintf(out, size, "%ld:%02ld:%02ld", s / 3600, s / 60 % 60, s % 60);
    else snprintf(out, size, "%ld:%02ld", s / 60, s % 60);
}

static void draw(Progress *p, const char *status, bool final) {
    if (p->quiet) return;
    double elapsed = now_seconds() - p->start_time;
    double rate = elapsed > 0 ? p->done / elapsed : 0;
    char eta[32] = "?", spent[32];
    format_duration(spent, sizeof spent, elapsed);
    if (p->total > 0 && rate > 0) format_duration(eta, sizeof eta, (p->total - p->done) / rate);
    char bar[32] = "";
    if (p->total > 0) {
        int width = 20, filled = (int)(width * (double)p->done / p->total);
        for (int i = 0; i < width; i++) bar[i] = i < filled ? '=' : (i == filled ? '>' : ' ');
        bar[width] = '\0';
    }
    if (p->tty) fputc('\r', stderr);
    if (p->total > 0)
        fprintf(stderr, "%s [%s] %ld/%ld %s, %.2f %s/s, %s elapsed, ETA %s", p->label, bar, p->done, p->total,
                p->unit, rate, p->unit, spent, final ? "0:00" : eta);
    else
        fprintf(stderr, "%s %ld %s, %.2f %s/s, %s elapsed", p->label, p->done, p->unit, rate, p->unit, spent);
    if (status && *status) fprintf(stderr, ", %s", status);
    if (p->tty) fputs("\033[K", stderr); // clear the rest of the line
    if (!p->tty || final) fputc('\n', stderr);
    fflush(stderr);
}

void progress_update(Progress *p, long amount, const char *status) {
    p->done += amount;
    double now = now_seconds();
    if (p->tty ? now - p->last_print >= 0.2 : now - p->last_print >= p->interval) {
        p->last_print = now;
        draw(p, status, false);
    }
}

void progress_finish(Progress *p, const char *status) {
    if (p->finished) return;
    p->finished = true;
    draw(p, status, true);
}
