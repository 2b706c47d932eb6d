#include "rl/command_reward.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/check.h"
#include "core/timer.h"

struct CommandReward {
    char *command;
    pid_t pid;
    int to_child, from_child; // the program's stdin and stdout
    double timeout;
    char *pending;            // bytes read past the last answer line
    size_t pending_len, pending_capacity;
};

int command_reward_start(CommandReward **out, const char *command, double timeout_seconds) {
    *out = NULL;
    int in_pipe[2], out_pipe[2];
    if (pipe(in_pipe) != 0) return err_set("cannot start the reward command: %s (--reward-command)", strerror(errno));
    if (pipe(out_pipe) != 0) {
        close(in_pipe[0]), close(in_pipe[1]);
        return err_set("cannot start the reward command: %s (--reward-command)", strerror(errno));
    }
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) {
        close(in_pipe[0]), close(in_pipe[1]), close(out_pipe[0]), close(out_pipe[1]);
        return err_set("cannot start the reward command: %s (--reward-command)", strerror(errno));
    }
    if (pid == 0) {
        dup2(in_pipe[0], 0);
        dup2(out_pipe[1], 1);
        close(in_pipe[0]), close(in_pipe[1]), close(out_pipe[0]), close(out_pipe[1]);
        execl("/bin/sh", "sh", "-c", command, (char *)NULL);
        _exit(127);
    }
    close(in_pipe[0]), close(out_pipe[1]);
    CommandReward *r = xcalloc(1, sizeof *r);
    r->command = xstrdup(command);
    r->pid = pid;
    r->to_child = in_pipe[1];
    r->from_child = out_pipe[0];
    r->timeout = timeout_seconds;
    *out = r;
    return 0;
}

// The program is no longer usable: kill it and say why.
static int give_up(CommandReward *r, const char *why) {
    if (r->pid > 0) {
        kill(r->pid, SIGKILL);
        waitpid(r->pid, NULL, 0);
        r->pid = -1;
    }
    return err_set("reward command '%s': %s (--reward-command)", r->command, why);
}

static int write_all(int fd, const char *bytes, size_t length) {
    while (length > 0) {
        ssize_t n = write(fd, bytes, length);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return -1;
        bytes += n, length -= (size_t)n;
    }
    return 0;
}

// Reads up to the next newline into a fresh string (without it). Returns 0, -1 (closed or
// error) or -2 (timed out).
static int read_line(CommandReward *r, char **line) {
    const double deadline = now_seconds() + r->timeout;
    for (;;) {
        char *newline = r->pending_len ? memchr(r->pending, '\n', r->pending_len) : NULL;
        if (newline) {
            size_t length = (size_t)(newline - r->pending);
            *line = xmalloc(length + 1);
            memcpy(*line, r->pending, length);
            (*line)[length] = '\0';
            memmove(r->pending, newline + 1, r->pending_len - length - 1);
            r->pending_len -= length + 1;
            return 0;
        }
        double left = deadline - now_seconds();
        if (left <= 0) return -2;
        struct pollfd p = {.fd = r->from_child, .events = POLLIN};
        int ready = poll(&p, 1, (int)(left * 1000) + 1);
        if (ready < 0 && errno == EINTR) continue;
        if (ready < 0) return -1;
        if (ready == 0) continue; // the deadline decides
        if (r->pending_len + 4096 > r->pending_capacity) {
            r->pending_capacity = 2 * (r->pending_len + 4096);
            r->pending = xrealloc(r->pending, r->pending_capacity);
        }
        ssize_t n = read(r->from_child, r->pending + r->pending_len, r->pending_capacity - r->pending_len);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return -1;
        r->pending_len += (size_t)n;
    }
}

int command_reward_score(CommandReward *r, const char *prompt, const char *response, const char *row_json,
                         double *score) {
    if (r->pid <= 0) return err_set("reward command '%s' is not running (--reward-command)", r->command);
    // The row is already compact JSON (the data loader wrote it): it goes in as it is, not
    // parsed again for each of a prompt's answers.
    json_t *request = json_pack("{s:s, s:s}", "prompt", prompt, "response", response);
    char *head = json_dumps(request, JSON_COMPACT | JSON_ENSURE_ASCII);
    json_decref(request);
    const char *row = row_json ? row_json : "{}";
    size_t head_length = strlen(head) - 1, row_length = strlen(row); // without the head's closing brace
    size_t length = head_length + strlen(",\"row\":") + row_length + 1;
    char *text = xmalloc(length + 2);
    snprintf(text, length + 2, "%.*s,\"row\":%s}\n", (int)head_length, head, row);
    free(head);
    // A program that has exited makes the write fail with EPIPE, not kill marlhf.
    struct sigaction ignore = {.sa_handler = SIG_IGN}, previous;
    sigaction(SIGPIPE, &ignore, &previous);
    int written = write_all(r->to_child, text, length + 1);
    sigaction(SIGPIPE, &previous, NULL);
    free(text);
    if (written != 0) return give_up(r, "it exited (or closed its input) before answering");
    char *line = NULL;
    int rc = read_line(r, &line);
    if (rc == -2) {
        char why[96];
        snprintf(why, sizeof why, "no answer within %g s", r->timeout);
        return give_up(r, why);
    }
    if (rc != 0) return give_up(r, "it exited before answering");
    char *end = NULL;
    errno = 0;
    double value = strtod(line, &end);
    while (end && (*end == ' ' || *end == '\t' || *end == '\r')) end++;
    if (end == line || !end || *end != '\0' || errno == ERANGE || !isfinite(value)) {
        char why[160];
        snprintf(why, sizeof why, "answered \"%.60s\", not a finite number", line);
        free(line);
        return give_up(r, why);
    }
    free(line);
    *score = value;
    return 0;
}

void command_reward_stop(CommandReward *r) {
    if (!r) return;
    close(r->to_child);
    close(r->from_child);
    if (r->pid > 0) {
        // Its input is closed: a well-behaved program exits; give it a moment, then kill it.
        for (int i = 0; i < 50; i++) {
            if (waitpid(r->pid, NULL, WNOHANG) == r->pid) {
                r->pid = -1;
                break;
            }
            usleep(20000);
        }
        if (r->pid > 0) {
            kill(r->pid, SIGKILL);
            waitpid(r->pid, NULL, 0);
        }
    }
    free(r->pending), free(r->command), free(r);
}
