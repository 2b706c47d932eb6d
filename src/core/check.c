#include "core/check.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

// Cleanup that must run however the process ends (e.g. removing a half-written output).
static void (*cleanup_functions[16])(void);
static int cleanup_count;

void cleanup_register(void (*fn)(void)) {
    CHECK(cleanup_count < 16, "too many cleanup functions");
    cleanup_functions[cleanup_count++] = fn;
    atexit(fn);
}

// A user error ends the process at once: the registered cleanup runs, stdio is flushed,
// and _exit skips the rest of the teardown (memory still allocated then is not a leak,
// and leak checkers need not report it).
static _Noreturn void exit_user_error(void) {
    for (int i = cleanup_count - 1; i >= 0; i--) cleanup_functions[i]();
    fflush(NULL);
    _exit(2);
}

static char process_label[64];

int env_switch(const char *name) {
    const char *setting = getenv(name);
    if (!setting || !*setting || !strcmp(setting, "0")) return 0;
    if (!strcmp(setting, "1")) return 1;
    return err_set("%s is '%s'; expected 0 or 1 (environment)", name, setting);
}

void err_set_process_label(const char *label) { snprintf(process_label, sizeof process_label, "%s", label); }

// One message buffer per thread: worker threads may report errors independently.
static _Thread_local char last_error[1024];

int err_set(const char *fmt, ...) {
    // Formatted aside first: callers add context to the previous message with
    // err_set("%s (%s)", err_msg(), where), and vsnprintf must not read its own output.
    char message[sizeof last_error];
    va_list args;
    va_start(args, fmt);
    vsnprintf(message, sizeof message, fmt, args);
    va_end(args);
    memcpy(last_error, message, sizeof last_error);
    // The message must stay on one line whatever the input contained.
    for (char *p = last_error; *p; p++)
        if (*p == '\n' || *p == '\r') *p = ' ';
    return -1;
}

const char *err_msg(void) { return last_error; }

void err_clear(void) { last_error[0] = '\0'; }

void die_user(const char *fmt, ...) {
    char message[1024];
    va_list args;
    va_start(args, fmt);
    vsnprintf(message, sizeof message, fmt, args);
    va_end(args);
    for (char *p = message; *p; p++)
        if (*p == '\n' || *p == '\r') *p = ' ';
    fflush(stdout);
    fprintf(stderr, "marlhf: error: %s%s\n", process_label, message);
    exit_user_error();
}

void die_from_err(void) {
    die_user("%s", last_error[0] ? last_error : "unknown error");
}

void die_internal(const char *file, int line, const char *fmt, ...) {
    char message[1024];
    va_list args;
    va_start(args, fmt);
    vsnprintf(message, sizeof message, fmt, args);
    va_end(args);
    fflush(stdout);
    fprintf(stderr, "marlhf: internal error at %s:%d: %s%s\n", file, line, process_label, message);
    exit(1);
}

void *xmalloc_at(size_t size, const char *file, int line) {
    void *p = malloc(size ? size : 1);
    if (!p) die_internal(file, line, "out of memory allocating %zu bytes", size);
    return p;
}

void *xcalloc_at(size_t count, size_t size, const char *file, int line) {
    void *p = calloc(count ? count : 1, size ? size : 1);
    if (!p) die_internal(file, line, "out of memory allocating %zu x %zu bytes", count, size);
    return p;
}

void *xrealloc_at(void *ptr, size_t size, const char *file, int line) {
    void *p = realloc(ptr, size ? size : 1);
    if (!p) die_internal(file, line, "out of memory reallocating %zu bytes", size);
    return p;
}

char *xstrdup_at(const char *s, const char *file, int line) {
    size_t n = strlen(s) + 1;
    char *p = xmalloc_at(n, file, line);
    memcpy(p, s, n);
    return p;
}

char *xstrndup_at(const char *s, size_t length, const char *file, int line) {
    size_t n = strnlen(s, length);
    char *p = xmalloc_at(n + 1, file, line);
    memcpy(p, s, n);
    p[n] = '\0';
    return p;
}

void *xaligned_alloc_at(size_t size, const char *file, int line) {
    size_t rounded = (size + 63) / 64 * 64;
    if (rounded == 0) rounded = 64;
    void *p = aligned_alloc(64, rounded);
    if (!p) die_internal(file, line, "out of memory allocating %zu bytes", size);
    memset(p, 0, rounded);
    return p;
}
