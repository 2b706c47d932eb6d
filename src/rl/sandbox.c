// The sandbox of sandbox.h: clone() into new namespaces, set the child up, exec, watch.
//
// The child runs parent code between clone() and execve(). The caller may be
// multithreaded (OpenMP), so another thread may have held the allocator's lock at the
// moment of the clone, and glibc still believes the child has the caller's threads: the
// child therefore only makes plain system calls (raw syscall() where glibc's wrapper
// involves other threads, as the set*id family does), on data the parent prepared
// (ChildPlan), and reports a failure as {step, errno} through a pipe that closes itself
// on a successful exec.
#include "rl/sandbox.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/audit.h>
#include <linux/capability.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <linux/securebits.h>
#include <stddef.h>
#include <math.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "core/check.h"

// Where a root caller's sandbox lives: Debian's nobody / nogroup.
#define NOBODY_ID 65534u
// After the kill, how long to wait for the pipes to close before reaping regardless.
#define KILL_GRACE_SECONDS 5.0
#define MAX_SANDBOX_FILES 64

struct Sandbox {
    char path[64];  // /tmp/marlhf-sandbox-XXXXXX
    char work_path[80];
    char *files[MAX_SANDBOX_FILES];  // names written into `path`, removed by sandbox_destroy
    int file_count;
};

SandboxLimits sandbox_default_limits(void) {
    return (SandboxLimits){
        .timeout_seconds = 4.0,
        .memory_bytes = 512L << 20,
        .max_output_bytes = 1L << 20,
        .max_file_bytes = 16L << 20,
        .max_processes = 8,
    };
}

// --- the scratch folder ----------------------------------------------------------------

int sandbox_create(Sandbox **out) {
    *out = NULL;
    Sandbox *sandbox = xcalloc(1, sizeof *sandbox);
    snprintf(sandbox->path, sizeof sandbox->path, "/tmp/marlhf-sandbox-XXXXXX");
    if (!mkdtemp(sandbox->path)) {
        int error = errno;
        free(sandbox);
        return err_set("sandbox: cannot create a scratch folder in /tmp: %s", strerror(error));
    }
    snprintf(sandbox->work_path, sizeof sandbox->work_path, "%s/work", sandbox->path);
    // 0755: as root the sandboxed process runs as nobody and must read the files given.
    if (chmod(sandbox->path, 0755) != 0 || mkdir(sandbox->work_path, 0755) != 0) {
        int error = errno;
        rmdir(sandbox->path);
        free(sandbox);
        return err_set("sandbox: cannot prepare the scratch folder: %s", strerror(error));
    }
    *out = sandbox;
    return 0;
}

const char *sandbox_path(const Sandbox *sandbox) { return sandbox->path; }
const char *sandbox_work_path(const Sandbox *sandbox) { return sandbox->work_path; }

int sandbox_add_file(Sandbox *sandbox, const char *name, const void *data, size_t size) {
    if (!*name || strchr(name, '/') || name[0] == '.' || strcmp(name, "work") == 0)
        return err_set("sandbox: \"%s\" is not a plain file name", name);
    if (sandbox->file_count == MAX_SANDBOX_FILES) return err_set("sandbox: more than %d files", MAX_SANDBOX_FILES);
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/%s", sandbox->path, name);
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) return err_set("sandbox: cannot create %s: %s", path, strerror(errno));
    sandbox->files[sandbox->file_count++] = xstrdup(name);
    const char *bytes = data;
    while (size > 0) {
        ssize_t written = write(fd, bytes, size);
        if (written < 0 && errno == EINTR) continue;
        if (written <= 0) {
            int error = errno;
            close(fd);
            return err_set("sandbox: cannot write %s: %s", path, strerror(error));
        }
        bytes += written;
        size -= (size_t)written;
    }
    close(fd);
    return 0;
}

void sandbox_destroy(Sandbox *sandbox) {
    if (!sandbox) return;
    char path[PATH_MAX];
    for (int i = 0; i < sandbox->file_count; i++) {
        snprintf(path, sizeof path, "%s/%s", sandbox->path, sandbox->files[i]);
        unlink(path);
        free(sandbox->files[i]);
    }
    // The tmpfs on work/ lived in the child's mount namespace only; here it is an empty
    // folder.
    rmdir(sandbox->work_path);
    rmdir(sandbox->path);
    free(sandbox);
}

// --- the child: from clone() to execve() -------------------------------------------------

typedef enum {
    STEP_FDS,
    STEP_SESSION,
    STEP_SETGID,
    STEP_SETGROUPS,
    STEP_SETUID,
    STEP_PRIVATE_MOUNTS,
    STEP_READ_ONLY,
    STEP_WORK_TMPFS,
    STEP_PROC,
    STEP_CHDIR,
    STEP_RLIMIT,
    STEP_SECUREBITS,
    STEP_CAPABILITIES,
    STEP_NO_NEW_PRIVS,
    STEP_SECCOMP,
    STEP_PARENT_DEATH,
    STEP_EXEC,
} ChildStep;

static const char *const child_step_names[] = {
    [STEP_FDS] = "set up file descriptors",
    [STEP_SESSION] = "start a new session",
    [STEP_SETGID] = "set the group id",
    [STEP_SETGROUPS] = "drop supplementary groups",
    [STEP_SETUID] = "set the user id",
    [STEP_PRIVATE_MOUNTS] = "make the mounts private",
    [STEP_READ_ONLY] = "make the file system read-only (mount_setattr)",
    [STEP_WORK_TMPFS] = "mount the tmpfs working folder",
    [STEP_PROC] = "mount /proc",
    [STEP_CHDIR] = "enter the working folder",
    [STEP_RLIMIT] = "set resource limits",
    [STEP_SECUREBITS] = "lock the securebits",
    [STEP_CAPABILITIES] = "drop capabilities",
    [STEP_NO_NEW_PRIVS] = "set no_new_privs",
    [STEP_SECCOMP] = "install the seccomp filter",
    [STEP_PARENT_DEATH] = "set the parent-death signal",
    [STEP_EXEC] = "execute the program",
};

typedef struct {
    int step;
    int error;
} ChildFailure;

typedef struct {
    int resource;
    struct rlimit value;
} ChildRlimit;

#define ENV_COUNT 6
typedef struct {
    const char *const *argv;
    char *envp[ENV_COUNT + 1];
    char env_storage[ENV_COUNT][128];
    int stdin_fd, stdout_fd, stderr_fd;
    int sync_fd;    // socket; the parent sends one byte once the id maps are written
    int report_fd;  // pipe, close-on-exec; a ChildFailure on failure
    bool drop_groups;
    const char *work_path;
    char tmpfs_options[96];
    ChildRlimit rlimits[8];
    int rlimit_count;
} ChildPlan;

// Fixed fds in the child, after the shuffle.
enum { CHILD_REPORT_FD = 3, CHILD_SYNC_FD = 4 };

static _Noreturn void child_fail(ChildStep step) {
    ChildFailure failure = {(int)step, errno};
    ssize_t ignored = write(CHILD_REPORT_FD, &failure, sizeof failure);
    (void)ignored;
    _exit(127);
}

// Moves the five descriptors the child keeps to 0..4 and closes every other one. The
// parent's numbers may be anything (0..2 too, if its own std streams were closed), so
// everything is first copied above 10.
static void child_setup_fds(const ChildPlan *plan) {
    int sources[5] = {plan->stdin_fd, plan->stdout_fd, plan->stderr_fd, plan->report_fd, plan->sync_fd};
    int high[5];
    for (int i = 0; i < 5; i++) {
        high[i] = fcntl(sources[i], F_DUPFD_CLOEXEC, 10);
        if (high[i] < 0) _exit(127);  // no report fd yet
    }
    for (int i = 0; i < 3; i++)
        if (dup2(high[i], i) != i) _exit(127);
    if (dup3(high[3], CHILD_REPORT_FD, O_CLOEXEC) != CHILD_REPORT_FD) _exit(127);
    if (dup3(high[4], CHILD_SYNC_FD, O_CLOEXEC) != CHILD_SYNC_FD) child_fail(STEP_FDS);
    if (syscall(SYS_close_range, 5u, ~0u, 0u) != 0) child_fail(STEP_FDS);
}

static void child_drop_capabilities(void) {
    // NOROOT: exec as uid 0 (of the namespace) grants no capabilities; locked, so the
    // program cannot undo it.
    unsigned long bits = SECBIT_NOROOT | SECBIT_NOROOT_LOCKED | SECBIT_NO_SETUID_FIXUP |
                         SECBIT_NO_SETUID_FIXUP_LOCKED | SECBIT_KEEP_CAPS_LOCKED | SECBIT_NO_CAP_AMBIENT_RAISE |
                         SECBIT_NO_CAP_AMBIENT_RAISE_LOCKED;
    if (prctl(PR_SET_SECUREBITS, bits, 0, 0, 0) != 0) child_fail(STEP_SECUREBITS);
    for (int cap = 0; cap < 64; cap++)
        if (prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 && errno != EINVAL) child_fail(STEP_CAPABILITIES);
    if (prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) != 0) child_fail(STEP_CAPABILITIES);
    struct __user_cap_header_struct header = {.version = _LINUX_CAPABILITY_VERSION_3, .pid = 0};
    struct __user_cap_data_struct data[2];
    memset(data, 0, sizeof data);
    if (syscall(SYS_capset, &header, data) != 0) child_fail(STEP_CAPABILITIES);
}

// The seccomp filter. The namespaces already cut the network and the read-only mounts
// cut writes; what they leave open is connect() to a Unix socket of the host (the mount
// being read-only does not stop it: a system bus, or a docker socket when the caller's
// groups allow it), so socket(AF_UNIX) is refused (socketpair(), which asyncio and
// multiprocessing use, stays allowed). Also refused: io_uring (it can create sockets
// without the socket() call), and kernel interfaces no test program needs (bpf,
// perf_event_open, userfaultfd, the keyrings, which are per user and so shared with
// the host's nobody). Another system-call ABI (i386, x32 on x86-64) is refused whole,
// so the filter cannot be bypassed through it.
#if defined(__x86_64__)
#define SANDBOX_AUDIT_ARCH AUDIT_ARCH_X86_64
#elif defined(__aarch64__)
#define SANDBOX_AUDIT_ARCH AUDIT_ARCH_AARCH64
#else
#error "sandbox.c: add this architecture's AUDIT_ARCH_* for the seccomp filter"
#endif
#define DENY(nr, error)                                         \
    BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, (nr), 0, 1),            \
    BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (error))

static const struct sock_filter seccomp_instructions[] = {
    BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
    BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SANDBOX_AUDIT_ARCH, 1, 0),
    BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS),
    BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
#if defined(__x86_64__)
    BPF_JUMP(BPF_JMP | BPF_JGE | BPF_K, 0x40000000u /* __X32_SYSCALL_BIT */, 0, 1),
    BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS),
#endif
    DENY(__NR_io_uring_setup, ENOSYS),
    DENY(__NR_io_uring_enter, ENOSYS),
    DENY(__NR_io_uring_register, ENOSYS),
    DENY(__NR_bpf, EPERM),
    DENY(__NR_perf_event_open, EPERM),
    DENY(__NR_userfaultfd, EPERM),
    DENY(__NR_keyctl, EPERM),
    DENY(__NR_add_key, EPERM),
    DENY(__NR_request_key, EPERM),
    BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_socket, 1, 0),
    BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    // socket(domain, ...): the low 32 bits of the first argument (little-endian).
    BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, args[0])),
    DENY(AF_UNIX, EACCES),
    BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
};

static void child_install_seccomp(void) {
    struct sock_fprog program = {
        .len = (unsigned short)(sizeof seccomp_instructions / sizeof seccomp_instructions[0]),
        .filter = (struct sock_filter *)seccomp_instructions,
    };
    if (prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &program, 0, 0) != 0) child_fail(STEP_SECCOMP);
}

static _Noreturn void child_main(const ChildPlan *plan) {
    child_setup_fds(plan);
    // A new session: no controlling terminal (no TIOCSTI into the caller's terminal), and
    // a process group of its own.
    if (setsid() < 0) child_fail(STEP_SESSION);
    // Wait until the parent has written the uid/gid maps; EOF means it gave up.
    char go;
    if (read(CHILD_SYNC_FD, &go, 1) != 1) _exit(127);

    // Become the namespace's uid/gid 0, i.e. the mapped outer id (nobody for a root
    // caller). Until now the child still had the caller's outer ids.
    // Raw system calls: glibc's wrappers would try to change the ids of every thread of
    // the caller (which the child does not have) and can wait for them for ever.
    if (syscall(SYS_setresgid, 0, 0, 0) != 0) child_fail(STEP_SETGID);
    if (plan->drop_groups && syscall(SYS_setgroups, 0, NULL) != 0) child_fail(STEP_SETGROUPS);
    if (syscall(SYS_setresuid, 0, 0, 0) != 0) child_fail(STEP_SETUID);

    // Files: nothing propagates back to the host; everything read-only, then the one
    // writable tmpfs and a /proc of this PID namespace.
    if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0) child_fail(STEP_PRIVATE_MOUNTS);
    struct mount_attr read_only = {.attr_set = MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID};
    if (syscall(SYS_mount_setattr, AT_FDCWD, "/", AT_RECURSIVE, &read_only, sizeof read_only) != 0)
        child_fail(STEP_READ_ONLY);
    if (mount("tmpfs", plan->work_path, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, plan->tmpfs_options) != 0)
        child_fail(STEP_WORK_TMPFS);
    unsigned long proc_flags = MS_NOSUID | MS_NODEV | MS_NOEXEC | MS_RDONLY;
    if (mount("proc", "/proc", "proc", proc_flags, NULL) != 0 &&
        // Where the kernel refuses a new proc (an outer /proc partly hidden, as in some
        // containers), hide the host's processes behind an empty read-only tmpfs.
        mount("tmpfs", "/proc", "tmpfs", proc_flags, "size=4k,mode=0555") != 0)
        child_fail(STEP_PROC);
    if (chdir(plan->work_path) != 0) child_fail(STEP_CHDIR);

    for (int i = 0; i < plan->rlimit_count; i++)
        if (setrlimit(plan->rlimits[i].resource, &plan->rlimits[i].value) != 0) child_fail(STEP_RLIMIT);

    child_drop_capabilities();
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) child_fail(STEP_NO_NEW_PRIVS);
    child_install_seccomp();

    // Set last: changing credentials clears it. If the parent already died, the sync
    // socket has hung up.
    if (prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) != 0) child_fail(STEP_PARENT_DEATH);
    struct pollfd sync_poll = {.fd = CHILD_SYNC_FD, .events = POLLIN};
    if (poll(&sync_poll, 1, 0) > 0 && (sync_poll.revents & (POLLHUP | POLLIN))) _exit(127);

    execve(plan->argv[0], (char *const *)plan->argv, plan->envp);
    child_fail(STEP_EXEC);
}

// --- the parent ------------------------------------------------------------------------

static double monotonic_seconds(void) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (double)now.tv_sec + 1e-9 * (double)now.tv_nsec;
}

// Our limit, but never above the caller's hard limit (raising it needs privileges the
// child no longer has once in its user namespace).
static void plan_rlimit(ChildPlan *plan, int resource, rlim_t value) {
    struct rlimit current;
    CHECK(getrlimit(resource, &current) == 0, "getrlimit failed");
    if (current.rlim_max != RLIM_INFINITY && value > current.rlim_max) value = current.rlim_max;
    CHECK(plan->rlimit_count < (int)(sizeof plan->rlimits / sizeof plan->rlimits[0]), "too many rlimits");
    plan->rlimits[plan->rlimit_count++] = (ChildRlimit){resource, {value, value}};
}

static void plan_env(ChildPlan *plan, int index, const char *name, const char *value) {
    snprintf(plan->env_storage[index], sizeof plan->env_storage[index], "%s=%s", name, value);
    plan->envp[index] = plan->env_storage[index];
}

static int write_proc_file(pid_t pid, const char *name, const char *text) {
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/%s", (int)pid, name);
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0) return err_set("sandbox: cannot open %s: %s", path, strerror(errno));
    ssize_t length = (ssize_t)strlen(text);
    ssize_t written = write(fd, text, (size_t)length);
    int error = errno;
    close(fd);
    if (written != length) return err_set("sandbox: cannot write %s: %s", path, strerror(error));
    return 0;
}

// The child's only uid/gid, 0, maps to nobody for a root caller (so it cannot write
// root's files), else to the caller (the only mapping an unprivileged process may write;
// then setgroups must be denied first).
static int write_id_maps(pid_t pid) {
    bool root = geteuid() == 0;
    char map[64];
    if (!root && write_proc_file(pid, "setgroups", "deny") != 0) return -1;
    snprintf(map, sizeof map, "0 %u 1\n", root ? NOBODY_ID : (unsigned)geteuid());
    if (write_proc_file(pid, "uid_map", map) != 0) return -1;
    snprintf(map, sizeof map, "0 %u 1\n", root ? NOBODY_ID : (unsigned)getegid());
    return write_proc_file(pid, "gid_map", map);
}

static void close_if_open(int *fd) {
    if (*fd >= 0) close(*fd);
    *fd = -1;
}

static void reap(pid_t pid, int *status) {
    while (waitpid(pid, status, 0) < 0)
        CHECK(errno == EINTR, "waitpid(%d) failed: %s", (int)pid, strerror(errno));
}

static int validate_limits(const SandboxLimits *limits) {
    if (!(limits->timeout_seconds > 0) || limits->timeout_seconds > 86400)
        return err_set("sandbox: timeout %g s is not in (0, 86400]", limits->timeout_seconds);
    if (limits->memory_bytes < (16L << 20)) return err_set("sandbox: memory limit under 16 MiB");
    if (limits->max_output_bytes < 1) return err_set("sandbox: output limit under 1 byte");
    if (limits->max_file_bytes < 4096) return err_set("sandbox: file limit under 4 KiB");
    if (limits->max_processes < 1) return err_set("sandbox: process limit under 1");
    return 0;
}

static int make_stdin(const void *data, size_t size) {
    int fd = memfd_create("marlhf-sandbox-stdin", MFD_CLOEXEC);
    if (fd < 0) return -1;
    const char *bytes = data;
    while (size > 0) {
        ssize_t written = write(fd, bytes, size);
        if (written < 0 && errno == EINTR) continue;
        if (written <= 0) {
            close(fd);
            return -1;
        }
        bytes += written;
        size -= (size_t)written;
    }
    if (lseek(fd, 0, SEEK_SET) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

// stdout: everything up to the cap. stderr: only the last SANDBOX_STDERR_KEEP bytes.
typedef struct {
    char *data;
    size_t size, capacity;
} Bytes;

static void bytes_append(Bytes *bytes, const char *data, size_t size) {
    if (bytes->size + size + 1 > bytes->capacity) {
        size_t capacity = bytes->capacity ? bytes->capacity : 4096;
        while (capacity < bytes->size + size + 1) capacity *= 2;
        bytes->data = xrealloc(bytes->data, capacity);
        bytes->capacity = capacity;
    }
    memcpy(bytes->data + bytes->size, data, size);
    bytes->size += size;
    bytes->data[bytes->size] = '\0';
}

typedef struct {
    pid_t pid;
    int pidfd;  // -1 on kernels without pidfd_open: then waitpid is polled
    int stdout_fd, stderr_fd;
    long max_output_bytes;
    double deadline;
} Watch;

// Reads stdout and stderr until both close and the child is reaped, killing it at the
// deadline or when stdout passes the cap. Fills out->outcome and friends.
static void watch_child(Watch *watch, SandboxRun *out) {
    Bytes stdout_bytes = {0}, stderr_bytes = {0};
    bytes_append(&stdout_bytes, "", 0);
    bytes_append(&stderr_bytes, "", 0);
    bool reaped = false, killed = false;
    int status = 0;
    double kill_time = 0;
    char buffer[16384];
    while (watch->stdout_fd >= 0 || watch->stderr_fd >= 0 || !reaped) {
        double now = monotonic_seconds();
        if (!killed && now >= watch->deadline) {
            kill(watch->pid, SIGKILL);  // PID 1 of its namespace: every process in it dies
            killed = true;
            kill_time = now;
            out->outcome = SANDBOX_TIMEOUT;
        }
        if (killed && now >= kill_time + KILL_GRACE_SECONDS) break;
        double until = killed ? kill_time + KILL_GRACE_SECONDS : watch->deadline;
        int wait_ms = (int)ceil((until - now) * 1000.0);
        if (wait_ms < 0) wait_ms = 0;
        if (watch->pidfd < 0 && !reaped && wait_ms > 10) wait_ms = 10;

        struct pollfd polls[3];
        int count = 0, stdout_slot = -1, stderr_slot = -1, pid_slot = -1;
        if (watch->stdout_fd >= 0) stdout_slot = count, polls[count++] = (struct pollfd){watch->stdout_fd, POLLIN, 0};
        if (watch->stderr_fd >= 0) stderr_slot = count, polls[count++] = (struct pollfd){watch->stderr_fd, POLLIN, 0};
        if (!reaped && watch->pidfd >= 0) pid_slot = count, polls[count++] = (struct pollfd){watch->pidfd, POLLIN, 0};
        int ready = poll(polls, (nfds_t)count, wait_ms);
        if (ready < 0) {
            CHECK(errno == EINTR, "poll failed: %s", strerror(errno));
            continue;
        }
        if (stdout_slot >= 0 && polls[stdout_slot].revents) {
            ssize_t got = read(watch->stdout_fd, buffer, sizeof buffer);
            if (got < 0 && errno != EINTR && errno != EAGAIN) got = 0;
            if (got == 0) close_if_open(&watch->stdout_fd);
            if (got > 0 && out->outcome != SANDBOX_OUTPUT_LIMIT) {
                size_t room = (size_t)watch->max_output_bytes - stdout_bytes.size;
                bytes_append(&stdout_bytes, buffer, (size_t)got < room ? (size_t)got : room);
                if ((size_t)got > room) {
                    if (!killed) kill(watch->pid, SIGKILL), killed = true, kill_time = monotonic_seconds();
                    out->outcome = SANDBOX_OUTPUT_LIMIT;
                }
            }
        }
        if (stderr_slot >= 0 && polls[stderr_slot].revents) {
            ssize_t got = read(watch->stderr_fd, buffer, sizeof buffer);
            if (got < 0 && errno != EINTR && errno != EAGAIN) got = 0;
            if (got == 0) close_if_open(&watch->stderr_fd);
            if (got > 0) {
                bytes_append(&stderr_bytes, buffer, (size_t)got);
                if (stderr_bytes.size > SANDBOX_STDERR_KEEP) {
                    memmove(stderr_bytes.data, stderr_bytes.data + stderr_bytes.size - SANDBOX_STDERR_KEEP,
                            SANDBOX_STDERR_KEEP);
                    stderr_bytes.size = SANDBOX_STDERR_KEEP;
                    stderr_bytes.data[stderr_bytes.size] = '\0';
                    out->err_truncated = true;
                }
            }
        }
        if (!reaped && (pid_slot < 0 || polls[pid_slot].revents)) {
            pid_t done = waitpid(watch->pid, &status, WNOHANG);
            CHECK(done >= 0 || errno == EINTR, "waitpid failed: %s", strerror(errno));
            if (done == watch->pid) reaped = true;
        }
    }
    close_if_open(&watch->stdout_fd);
    close_if_open(&watch->stderr_fd);
    if (!reaped) reap(watch->pid, &status);
    if (!killed) {
        if (WIFEXITED(status)) {
            out->outcome = SANDBOX_EXITED;
            out->exit_code = WEXITSTATUS(status);
        } else {
            out->outcome = SANDBOX_SIGNALED;
            out->signal = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
        }
    }
    out->out = stdout_bytes.data;
    out->out_size = stdout_bytes.size;
    out->err = stderr_bytes.data;
    out->err_size = stderr_bytes.size;
}

int sandbox_run(Sandbox *sandbox, const char *const argv[], const void *stdin_data, size_t stdin_size,
                const SandboxLimits *limits, SandboxRun *out) {
    memset(out, 0, sizeof *out);
    CHECK(argv && argv[0], "sandbox_run needs a program");
    if (validate_limits(limits) != 0) return -1;
    if (argv[0][0] != '/') return err_set("sandbox: program path \"%s\" is not absolute", argv[0]);

    ChildPlan plan;
    memset(&plan, 0, sizeof plan);
    plan.argv = argv;
    plan.work_path = sandbox->work_path;
    plan.drop_groups = geteuid() == 0;
    plan_env(&plan, 0, "PATH", "/usr/local/bin:/usr/bin:/bin");
    plan_env(&plan, 1, "LANG", "C.UTF-8");
    plan_env(&plan, 2, "HOME", sandbox->work_path);
    plan_env(&plan, 3, "TMPDIR", sandbox->work_path);
    plan_env(&plan, 4, "OPENBLAS_NUM_THREADS", "1");
    plan_env(&plan, 5, "OMP_NUM_THREADS", "1");
    plan.envp[ENV_COUNT] = NULL;
    snprintf(plan.tmpfs_options, sizeof plan.tmpfs_options, "size=%ld,nr_inodes=4096,mode=0777",
             limits->max_file_bytes);
    rlim_t cpu_seconds = (rlim_t)ceil(limits->timeout_seconds) + 1;
    plan_rlimit(&plan, RLIMIT_CPU, cpu_seconds);
    plan_rlimit(&plan, RLIMIT_AS, (rlim_t)limits->memory_bytes);
    plan_rlimit(&plan, RLIMIT_FSIZE, (rlim_t)limits->max_file_bytes);
    plan_rlimit(&plan, RLIMIT_NPROC, (rlim_t)limits->max_processes);
    plan_rlimit(&plan, RLIMIT_CORE, 0);
    plan_rlimit(&plan, RLIMIT_NOFILE, 256);
    plan_rlimit(&plan, RLIMIT_STACK, 8L << 20);
    plan_rlimit(&plan, RLIMIT_MEMLOCK, 0);

    int stdout_pipe[2] = {-1, -1}, stderr_pipe[2] = {-1, -1}, report_pipe[2] = {-1, -1}, sync_pair[2] = {-1, -1};
    int stdin_fd = make_stdin(stdin_data, stdin_size);
    if (stdin_fd < 0 || pipe2(stdout_pipe, O_CLOEXEC) != 0 || pipe2(stderr_pipe, O_CLOEXEC) != 0 ||
        pipe2(report_pipe, O_CLOEXEC) != 0 || socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sync_pair) != 0) {
        int error = errno;
        int fds[] = {stdin_fd,       stdout_pipe[0],  stdout_pipe[1], stderr_pipe[0], stderr_pipe[1],
                     report_pipe[0], report_pipe[1], sync_pair[0],   sync_pair[1]};
        for (size_t i = 0; i < sizeof fds / sizeof fds[0]; i++) close_if_open(&fds[i]);
        return err_set("sandbox: cannot create pipes: %s", strerror(error));
    }
    plan.stdin_fd = stdin_fd;
    plan.stdout_fd = stdout_pipe[1];
    plan.stderr_fd = stderr_pipe[1];
    plan.report_fd = report_pipe[1];
    plan.sync_fd = sync_pair[1];

    double start = monotonic_seconds();
    unsigned long flags = CLONE_NEWUSER | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWNS | CLONE_NEWIPC | CLONE_NEWUTS |
                          CLONE_NEWCGROUP | SIGCHLD;
    // A raw clone without a new stack behaves like fork(), with the namespaces; unlike
    // fork() + unshare(), it works from a multithreaded caller.
    pid_t pid = (pid_t)syscall(SYS_clone, flags, NULL, NULL, NULL, NULL);
    if (pid == 0) child_main(&plan);
    int clone_error = errno;
    close_if_open(&stdin_fd);
    close_if_open(&stdout_pipe[1]);
    close_if_open(&stderr_pipe[1]);
    close_if_open(&report_pipe[1]);
    close_if_open(&sync_pair[1]);
    int rc = 0;
    if (pid < 0) {
        rc = err_set("sandbox: cannot create the namespaces that isolate untrusted code (clone: %s); "
                     "user namespaces must be enabled",
                     strerror(clone_error));
        goto done;
    }
    rc = write_id_maps(pid);
    if (rc == 0 && send(sync_pair[0], "g", 1, MSG_NOSIGNAL) != 1)
        rc = err_set("sandbox: cannot start the child: %s", strerror(errno));
    if (rc != 0) {
        kill(pid, SIGKILL);
        int status;
        reap(pid, &status);
        goto done;
    }
    // Wait for exec (the report pipe closes) or a failure report.
    ChildFailure failure;
    ssize_t got;
    do got = read(report_pipe[0], &failure, sizeof failure);
    while (got < 0 && errno == EINTR);
    if (got != 0) {
        int status;
        reap(pid, &status);
        if (got == (ssize_t)sizeof failure && failure.step >= 0 && failure.step <= STEP_EXEC)
            rc = err_set("sandbox: cannot %s: %s (%s)", child_step_names[failure.step], strerror(failure.error),
                         argv[0]);
        else
            rc = err_set("sandbox: the child failed before running %s (status %d)", argv[0], status);
        goto done;
    }
    close_if_open(&sync_pair[0]);

    Watch watch = {
        .pid = pid,
        .pidfd = (int)syscall(SYS_pidfd_open, pid, 0),
        .stdout_fd = stdout_pipe[0],
        .stderr_fd = stderr_pipe[0],
        .max_output_bytes = limits->max_output_bytes,
        .deadline = start + limits->timeout_seconds,
    };
    stdout_pipe[0] = stderr_pipe[0] = -1;  // owned by watch_child now
    watch_child(&watch, out);
    close_if_open(&watch.pidfd);
    out->wall_seconds = monotonic_seconds() - start;

done:
    close_if_open(&stdout_pipe[0]);
    close_if_open(&stderr_pipe[0]);
    close_if_open(&report_pipe[0]);
    close_if_open(&sync_pair[0]);
    return rc;
}

void sandbox_run_free(SandboxRun *run) {
    free(run->out);
    free(run->err);
    memset(run, 0, sizeof *run);
}
