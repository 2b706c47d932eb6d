// Error handling for the whole project.
//
// Two kinds of failure, two exits:
//  - a *user error* (bad file, bad option, bad data) is reported as one line
//    "marlhf: error: <what> (<where>)" and exits with status 2. Library code never
//    exits on a user error: it records the message with err_set() and returns -1,
//    so callers (and tests) can inspect it; the command line turns it into exit 2.
//  - an *internal error* (a broken invariant, out of memory) aborts at once with the
//    file and line, exit status 1. CHECK() is for those.
#pragma once
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>

// The CUDA backend includes this header from C++, which spells "does not return" differently.
#ifdef __cplusplus
#define MARLHF_NORETURN [[noreturn]]
#else
#define MARLHF_NORETURN _Noreturn
#endif

// Records the message of the last user error (printf-style). Returns -1 so that
// `return err_set(...)` reads naturally in functions that return 0 on success.
int err_set(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
// The message recorded by the last err_set(), or "" if none.
const char *err_msg(void);
void err_clear(void);

// A label put after "marlhf: error: " in every error line of this process (e.g. "[rank 1
// of 4] " under mpirun, dist/dist.c), so that one of several processes can be told apart.
void err_set_process_label(const char *label);

// Registers cleanup to run at exit, including the exit of a user error (die_user).
void cleanup_register(void (*fn)(void));

// A 0/1 switch from the environment (a test or measuring setting): 1 when $name is "1", 0
// when it is unset, empty or "0", and -1 with err_set() naming it for any other value (a
// misspelt value must not quietly leave a switch off).
int env_switch(const char *name);

// Prints "marlhf: error: <message>", runs the registered cleanup and exits 2.
// For the command-line layer.
MARLHF_NORETURN void die_user(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
// Prints the recorded err_msg() as a user error and exits 2.
MARLHF_NORETURN void die_from_err(void);
// Prints "marlhf: internal error at file:line: message" and exits 1.
MARLHF_NORETURN void die_internal(const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#define CHECK(cond, ...)                                        \
    do {                                                        \
        if (!(cond)) die_internal(__FILE__, __LINE__, __VA_ARGS__); \
    } while (0)

// Allocation that never returns NULL (out of memory is an internal error).
void *xmalloc_at(size_t size, const char *file, int line);
void *xcalloc_at(size_t count, size_t size, const char *file, int line);
void *xrealloc_at(void *ptr, size_t size, const char *file, int line);
char *xstrdup_at(const char *s, const char *file, int line);
// The first `length` bytes of s (at most strlen(s)) as a new string.
char *xstrndup_at(const char *s, size_t length, const char *file, int line);
// 64-byte aligned, zero-filled; free with free().
void *xaligned_alloc_at(size_t size, const char *file, int line);
#define xmalloc(size) xmalloc_at((size), __FILE__, __LINE__)
#define xcalloc(count, size) xcalloc_at((count), (size), __FILE__, __LINE__)
#define xrealloc(ptr, size) xrealloc_at((ptr), (size), __FILE__, __LINE__)
#define xstrdup(s) xstrdup_at((s), __FILE__, __LINE__)
#define xstrndup(s, length) xstrndup_at((s), (length), __FILE__, __LINE__)
#define xaligned_alloc(size) xaligned_alloc_at((size), __FILE__, __LINE__)
