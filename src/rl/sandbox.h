// A sandbox for running untrusted programs (the Python code a policy writes for the APPS
// reward, spec 10.3): one command, stdin from memory, stdout/stderr captured, in a child
// process that cannot harm the host. All C, no wrapper script, so it works inside the
// marlhf binary.
//
// Mechanism (each line names the limit and what enforces it):
//   - Isolation: the child is created with clone() in new user, PID, network, mount, IPC,
//     UTS and cgroup namespaces. It is PID 1 of its own PID namespace, so killing it kills
//     every process it started (fork bombs, daemons, setsid escapes included), and it
//     sees no host process. The network namespace has only a loopback that is down: no
//     connection can reach the host or anything else, 127.0.0.1 included.
//   - Identity: the user namespace maps its only uid/gid (0) to the caller's when the
//     caller is not root, and to nobody/nogroup (65534) when it is root, so as root the
//     program cannot write files owned by root. Supplementary groups are dropped (root),
//     every capability is dropped (bounding, ambient, effective, permitted, with the
//     NOROOT securebits locked, so exec gains none) and no_new_privs is set.
//   - Files: the whole mount tree is made read-only (mount_setattr AT_RECURSIVE), so even
//     world-writable folders (/tmp, /dev/shm) refuse writes. The only writable place is
//     the working folder, a fresh tmpfs (size = max_file_bytes) mounted on
//     <scratch>/work, which disappears with the namespace. The scratch folder itself
//     (mkdtemp under /tmp, holding the files given with sandbox_add_file) is read-only
//     inside and removed by sandbox_destroy. /proc is a fresh proc of the new PID
//     namespace, mounted read-only.
//   - System calls: a seccomp filter refuses socket(AF_UNIX) (connect() to a host Unix
//     socket is not stopped by a read-only mount), io_uring, bpf, perf_event_open,
//     userfaultfd and the keyrings, and kills a process using another system-call ABI.
//   - Environment: cleared; the child gets PATH, LANG (fixed values), HOME and TMPDIR
//     (the working folder) and OPENBLAS/OMP_NUM_THREADS=1. Nothing of the caller's
//     environment reaches it. Its session is new (no controlling terminal); file
//     descriptors other than 0, 1, 2 are closed.
//   - Time: a wall-clock deadline enforced by the parent (SIGKILL to the namespace's
//     PID 1), plus RLIMIT_CPU = ceil(timeout) + 1 s as a backstop.
//   - Memory: RLIMIT_AS = memory_bytes for each process (Python raises MemoryError, or
//     the process dies).
//   - Processes: RLIMIT_NPROC = max_processes. Because the child runs in its own user
//     namespace, the kernel counts its processes (and threads) separately from every
//     other process of the same uid, so the limit holds for root too and concurrent
//     sandboxes do not share it.
//   - Output: stdout beyond max_output_bytes kills the child (outcome OUTPUT_LIMIT); the
//     last SANDBOX_STDERR_KEEP bytes of stderr are kept, the rest is read and dropped.
//   - Disk: RLIMIT_FSIZE = max_file_bytes per file and the tmpfs size for all files.
//   - Parent death: PR_SET_PDEATHSIG(SIGKILL), so a crashed caller leaves no sandbox.
//
// Requirements: Linux >= 5.12 (mount_setattr), user namespaces enabled (always for root;
// for other users kernel.unprivileged_userns_clone / no AppArmor restriction). Where the
// namespaces cannot be created, sandbox_run fails with an error naming the step: running
// untrusted code without isolation is refused, never done silently.
//
// Thread safety: different Sandbox objects may be used from different threads at once
// (the child process calls no allocator between clone and exec).
#pragma once
#include <stdbool.h>
#include <stddef.h>

typedef struct {
    double timeout_seconds;  // wall clock, from start to exit; > 0
    long memory_bytes;       // RLIMIT_AS of each process
    long max_output_bytes;   // stdout cap; more kills the child
    long max_file_bytes;     // RLIMIT_FSIZE, and the size of the writable tmpfs
    int max_processes;       // RLIMIT_NPROC (processes and threads) inside the namespace
} SandboxLimits;

// 4 s, 512 MiB, 1 MiB of output, 16 MiB of files, 8 processes.
SandboxLimits sandbox_default_limits(void);

typedef enum {
    SANDBOX_EXITED,        // exited by itself; exit_code holds the status
    SANDBOX_SIGNALED,      // killed by a signal it did not get from us (SIGSEGV, SIGKILL from RLIMIT_CPU...)
    SANDBOX_TIMEOUT,       // still running at the deadline: killed by the parent
    SANDBOX_OUTPUT_LIMIT,  // wrote more than max_output_bytes to stdout: killed by the parent
} SandboxOutcome;

// Bytes of stderr kept (the end of it, where Python puts the exception).
#define SANDBOX_STDERR_KEEP 8192

typedef struct {
    SandboxOutcome outcome;
    int exit_code;        // SANDBOX_EXITED
    int signal;           // SANDBOX_SIGNALED
    char *out;            // stdout, NUL-terminated (may contain NUL bytes; use out_size)
    size_t out_size;      // <= max_output_bytes
    char *err;            // the last SANDBOX_STDERR_KEEP bytes of stderr, NUL-terminated
    size_t err_size;
    bool err_truncated;   // stderr was longer than what `err` holds
    double wall_seconds;  // from clone to reaping the child
} SandboxRun;

typedef struct Sandbox Sandbox;

// Creates a scratch folder /tmp/marlhf-sandbox-XXXXXX. -1 with err_set on failure.
int sandbox_create(Sandbox **out);
// Its absolute path: a file added as NAME is PATH/NAME inside the sandbox too (read-only).
const char *sandbox_path(const Sandbox *sandbox);
// The working folder of each run (a fresh, empty, writable tmpfs each time).
const char *sandbox_work_path(const Sandbox *sandbox);
// Writes a file into the scratch folder. NAME is a plain file name (no '/', not "work").
int sandbox_add_file(Sandbox *sandbox, const char *name, const void *data, size_t size);
// Runs argv (argv[0] an absolute path; NULL-terminated) with stdin_data as its stdin.
// Returns 0 when the program ran, whatever its outcome (see out->outcome); -1 with
// err_set when the sandbox itself could not be set up (then nothing of the program ran).
// On success free `out` with sandbox_run_free.
int sandbox_run(Sandbox *sandbox, const char *const argv[], const void *stdin_data, size_t stdin_size,
                const SandboxLimits *limits, SandboxRun *out);
void sandbox_run_free(SandboxRun *run);
// Removes the scratch folder and its files. NULL is fine.
void sandbox_destroy(Sandbox *sandbox);
