// Tests of src/rl/code_reward.c and src/rl/sandbox.c: the APPS reward values on small
// hand-written problems (tests/fixtures/apps/: standard-input and call-based, programs
// that pass, half pass, do not compile, crash), the output comparison rules, bad
// input_output JSON, code extraction from a response, and one test per sandbox limit
// with a hostile program: a loop, a sleeper hiding in a new session, 2 GiB of memory, an
// output flood, a fork bomb, a connection to 127.0.0.1 (only loopback is ever touched),
// writes outside the working folder, and the caller's environment.
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/check.h"
#include "rl/code_reward.h"
#include "rl/sandbox.h"
#include "test.h"

#define FIXTURES "tests/fixtures/apps"
#define PYTHON "/usr/bin/python3"

// --- helpers ---------------------------------------------------------------------------

static char *read_fixture(const char *name) {
    char path[512];
    snprintf(path, sizeof path, FIXTURES "/%s", name);
    FILE *file = fopen(path, "rb");
    CHECK(file, "cannot open %s", path);
    fseek(file, 0, SEEK_END);
    long size = ftell(file);
    fseek(file, 0, SEEK_SET);
    char *text = xmalloc((size_t)size + 1);
    CHECK(fread(text, 1, (size_t)size, file) == (size_t)size, "short read %s", path);
    text[size] = '\0';
    fclose(file);
    return text;
}

static double seconds_now(void) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (double)now.tv_sec + 1e-9 * (double)now.tv_nsec;
}

static CodeRewardLimits fast_limits(double timeout) {
    CodeRewardLimits limits = code_reward_default_limits();
    limits.timeout_seconds = timeout;
    limits.python = PYTHON;
    return limits;
}

// Scores fixture `program` on fixture `tests`; the result, or reward NAN on error.
static CodeRewardResult score_files(const char *program, const char *tests, double timeout) {
    char *source = read_fixture(program), *json = read_fixture(tests);
    CodeRewardLimits limits = fast_limits(timeout);
    CodeRewardResult result;
    if (code_reward(source, json, &limits, &result) != 0) {
        EXPECT(false, "%s on %s: %s", program, tests, err_msg());
        result.reward = NAN;
    }
    free(source);
    free(json);
    return result;
}

static CodeRewardResult score_text(const char *source, const char *json) {
    CodeRewardLimits limits = fast_limits(4.0);
    CodeRewardResult result;
    if (code_reward(source, json, &limits, &result) != 0) {
        EXPECT(false, "scoring %s: %s", source, err_msg());
        result.reward = NAN;
    }
    return result;
}

#define EXPECT_REWARD(result, expected_reward, expected_status, expected_passed, expected_total)              \
    do {                                                                                                    \
        CodeRewardResult r_ = (result);                                                                     \
        EXPECT_CLOSE(r_.reward, (expected_reward), 1e-12, 0, #result);                                      \
        EXPECT(r_.status == (expected_status), "%s: status %s (%s)", #result, code_status_name(r_.status),  \
               r_.reason);                                                                                  \
        EXPECT(r_.passed == (expected_passed) && r_.total == (expected_total), "%s: passed %d of %d (%s)", \
               #result, r_.passed, r_.total, r_.reason);                                                    \
    } while (0)

// Runs fixture `program` as `python3 -I -B <scratch>/program.py` in a fresh sandbox.
// *scratch gets the sandbox's path (to look for its processes afterwards).
static int run_fixture(const char *program, const char *input, const SandboxLimits *limits, SandboxRun *run,
                       char *scratch, size_t scratch_size) {
    Sandbox *sandbox;
    CHECK(sandbox_create(&sandbox) == 0, "%s", err_msg());
    char *source = read_fixture(program);
    CHECK(sandbox_add_file(sandbox, "program.py", source, strlen(source)) == 0, "%s", err_msg());
    free(source);
    char path[256];
    snprintf(path, sizeof path, "%s/program.py", sandbox_path(sandbox));
    if (scratch) snprintf(scratch, scratch_size, "%s", sandbox_path(sandbox));
    const char *argv[] = {PYTHON, "-I", "-B", path, NULL};
    int rc = sandbox_run(sandbox, argv, input, strlen(input), limits, run);
    if (rc != 0) EXPECT(false, "running %s: %s", program, err_msg());
    sandbox_destroy(sandbox);
    return rc;
}

static SandboxLimits limits_with_timeout(double timeout) {
    SandboxLimits limits = sandbox_default_limits();
    limits.timeout_seconds = timeout;
    return limits;
}

// Host processes whose command line mentions `marker` (a sandbox's scratch path).
static int processes_mentioning(const char *marker) {
    DIR *proc = opendir("/proc");
    CHECK(proc, "cannot open /proc");
    int count = 0;
    struct dirent *entry;
    char path[300], buffer[8192];
    while ((entry = readdir(proc))) {
        if (entry->d_name[0] < '0' || entry->d_name[0] > '9') continue;
        snprintf(path, sizeof path, "/proc/%s/cmdline", entry->d_name);
        int fd = open(path, O_RDONLY);
        if (fd < 0) continue;
        ssize_t size = read(fd, buffer, sizeof buffer);
        close(fd);
        if (size > 0 && memmem(buffer, (size_t)size, marker, strlen(marker))) count++;
    }
    closedir(proc);
    return count;
}

static bool file_exists(const char *path) {
    struct stat info;
    return stat(path, &info) == 0;
}

// --- reward values ---------------------------------------------------------------------

static void test_reward_stdin_problem(void) {
    EXPECT_REWARD(score_files("sum_correct.py", "sum_stdin.json", 4), 1.0, CODE_STATUS_RAN, 4, 4);
    EXPECT_REWARD(score_files("sum_half.py", "sum_stdin.json", 4), -0.3 + 0.65, CODE_STATUS_RAN, 2, 4);
    EXPECT_REWARD(score_files("sum_syntax_error.py", "sum_stdin.json", 4), -1.0, CODE_STATUS_COMPILE_ERROR, 0, 4);
    CodeRewardResult crash = score_files("sum_runtime_error.py", "sum_stdin.json", 4);
    EXPECT_REWARD(crash, -0.6, CODE_STATUS_RUNTIME_ERROR, 2, 4);
    EXPECT(crash.failed_test == 2 && strstr(crash.reason, "ZeroDivisionError"), "reason: %s", crash.reason);
    CodeRewardResult syntax = score_files("sum_syntax_error.py", "sum_stdin.json", 4);
    EXPECT(strstr(syntax.reason, "SyntaxError") && strstr(syntax.reason, "line 2"), "reason: %s", syntax.reason);
}

static void test_reward_call_based_problem(void) {
    EXPECT_REWARD(score_files("two_sum_correct.py", "two_sum_call.json", 4), 1.0, CODE_STATUS_RAN, 4, 4);
    EXPECT_REWARD(score_files("two_sum_half.py", "two_sum_call.json", 4), -0.3 + 0.65, CODE_STATUS_RAN, 2, 4);
    EXPECT_REWARD(score_files("two_sum_syntax_error.py", "two_sum_call.json", 4), -1.0, CODE_STATUS_COMPILE_ERROR,
                  0, 4);
    CodeRewardResult crash = score_files("two_sum_runtime_error.py", "two_sum_call.json", 4);
    EXPECT_REWARD(crash, -0.6, CODE_STATUS_RUNTIME_ERROR, 1, 4);
    EXPECT(crash.failed_test == 1 && strstr(crash.reason, "IndexError"), "reason: %s", crash.reason);
    // Top-level function, prints of its own, float and list results.
    EXPECT_REWARD(score_files("add_correct.py", "add_call.json", 4), 1.0, CODE_STATUS_RAN, 4, 4);
    CodeRewardResult exits = score_files("add_exits.py", "add_call.json", 4);
    EXPECT_REWARD(exits, -0.6, CODE_STATUS_RUNTIME_ERROR, 0, 4);
    EXPECT(strstr(exits.reason, "exited before add returned") != NULL, "reason: %s", exits.reason);
    CodeRewardResult missing = score_files("add_missing_function.py", "add_call.json", 4);
    EXPECT_REWARD(missing, -0.6, CODE_STATUS_RUNTIME_ERROR, 0, 4);
    EXPECT(strstr(missing.reason, "defines no function 'add'") != NULL, "reason: %s", missing.reason);
}

// Forging the call result: printing something that looks like one, or writing to every
// descriptor, does not make a wrong answer pass.
static void test_reward_call_result_cannot_be_printed(void) {
    const char *json = "{\"fn_name\": \"f\", \"inputs\": [[1]], \"outputs\": [[2]]}";
    EXPECT_REWARD(score_text("import os\n"
                             "def f(x):\n"
                             "    print('2')\n"
                             "    for fd in range(3, 20):\n"
                             "        try: os.write(fd, b'2\\n')\n"
                             "        except OSError: pass\n"
                             "    return 0\n",
                             json),
                  -0.3, CODE_STATUS_RAN, 0, 1);
    // Python equality: True == 1, 2 == 2.0, a tuple equals a list.
    EXPECT_REWARD(score_text("def f(x):\n    return 2.0\n", json), 1.0, CODE_STATUS_RAN, 1, 1);
    EXPECT_REWARD(score_text("def f(x):\n    return x == 1\n",
                             "{\"fn_name\": \"f\", \"inputs\": [[1]], \"outputs\": [[1]]}"),
                  1.0, CODE_STATUS_RAN, 1, 1);
    EXPECT_REWARD(score_text("def f(x):\n    return {1, 2}\n",
                             "{\"fn_name\": \"f\", \"inputs\": [[1]], \"outputs\": [[[1, 2]]]}"),
                  -0.3, CODE_STATUS_RAN, 0, 1);
}

static void test_reward_output_comparison(void) {
    // Trailing spaces, CR LF, blank lines: line comparison.
    EXPECT_REWARD(score_text("print('1 2  ')\nprint()\nprint('3\\r')\n",
                             "{\"inputs\": [\"\"], \"outputs\": [\"1 2\\n3\\n\"]}"),
                  1.0, CODE_STATUS_RAN, 1, 1);
    // Same tokens on other lines: token comparison. Output given as a list of lines.
    EXPECT_REWARD(score_text("print('1\\n2 3')\n", "{\"inputs\": [[\"\"]], \"outputs\": [[\"1 2\", \"3\"]]}"),
                  1.0, CODE_STATUS_RAN, 1, 1);
    // Decimals within 1e-5 relative pass; integers must be exact; different words fail.
    EXPECT_REWARD(score_text("print(0.333333333)\n", "{\"inputs\": [\"\"], \"outputs\": [\"0.3333333\\n\"]}"), 1.0,
                  CODE_STATUS_RAN, 1, 1);
    EXPECT_REWARD(score_text("print(1000001)\n", "{\"inputs\": [\"\"], \"outputs\": [\"1000000\\n\"]}"), -0.3,
                  CODE_STATUS_RAN, 0, 1);
    EXPECT_REWARD(score_text("print('YES')\n", "{\"inputs\": [\"\"], \"outputs\": [\"NO\\n\"]}"), -0.3,
                  CODE_STATUS_RAN, 0, 1);
    EXPECT_REWARD(score_text("print('1 2 3')\n", "{\"inputs\": [\"\"], \"outputs\": [\"1 2\\n\"]}"), -0.3,
                  CODE_STATUS_RAN, 0, 1);
    // Inputs given as a list of lines are joined with newlines; exit() works (site module).
    EXPECT_REWARD(score_text("a = input()\nb = input()\nprint(int(a) + int(b))\nexit()\n",
                             "{\"inputs\": [[\"2\", \"3\"]], \"outputs\": [\"5\"]}"),
                  1.0, CODE_STATUS_RAN, 1, 1);
    // Only the first max_tests tests run.
    char json[4096] = "{\"inputs\": [";
    for (int i = 0; i < 25; i++) strcat(json, i ? ", \"\"" : "\"\"");
    strcat(json, "], \"outputs\": [");
    for (int i = 0; i < 25; i++) strcat(json, i ? ", \"ok\"" : "\"ok\"");
    strcat(json, "]}");
    CodeRewardLimits limits = fast_limits(4.0);
    limits.max_tests = 3;
    CodeRewardResult capped;
    EXPECT(code_reward("print('ok')", json, &limits, &capped) == 0, "%s", err_msg());
    EXPECT_REWARD(capped, 1.0, CODE_STATUS_RAN, 3, 3);
}

static void test_reward_bad_input(void) {
    struct {
        const char *json, *message;
    } cases[] = {
        {"{\"inputs\": [\"1\"], \"outputs\": [\"1\"", "input_output: not valid JSON"},
        {"", "input_output: not valid JSON"},
        {"[1, 2]", "holds an array, expected an object"},
        {"{\"outputs\": [\"1\"]}", "\"inputs\" is missing"},
        {"{\"inputs\": \"1\", \"outputs\": [\"1\"]}", "\"inputs\" is a string, expected an array"},
        {"{\"inputs\": [\"1\", \"2\"], \"outputs\": [\"1\"]}", "2 inputs but 1 outputs"},
        {"{\"inputs\": [], \"outputs\": []}", "no tests"},
        {"{\"fn_name\": 3, \"inputs\": [[1]], \"outputs\": [1]}", "\"fn_name\" is an integer"},
        {"{\"fn_name\": \"f\", \"inputs\": [1], \"outputs\": [1]}", "inputs[0] is an integer, expected the array"},
        {"{\"inputs\": [\"1\", 5], \"outputs\": [\"1\", \"2\"]}", "inputs[1] is an integer"},
        {"{\"inputs\": [\"1\"], \"outputs\": [{\"a\": 1}]}", "outputs[0] is an object"},
    };
    CodeRewardLimits limits = fast_limits(4.0);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        CodeRewardResult result;
        err_clear();
        int rc = code_reward("print(1)", cases[i].json, &limits, &result);
        EXPECT(rc == -1 && strstr(err_msg(), cases[i].message), "case %zu: rc %d, message \"%s\", wanted \"%s\"", i,
               rc, err_msg(), cases[i].message);
    }
    CodeRewardResult result;
    EXPECT(code_reward("print(1)", NULL, &limits, &result) == -1, "NULL input_output");
    limits.python = "/nonexistent/python3";
    EXPECT(code_reward("print(1)", "{\"inputs\": [\"\"], \"outputs\": [\"1\"]}", &limits, &result) == -1 &&
               strstr(err_msg(), "/nonexistent/python3"),
           "missing interpreter: %s", err_msg());
    limits = fast_limits(0);
    EXPECT(code_reward("print(1)", "{\"inputs\": [\"\"], \"outputs\": [\"1\"]}", &limits, &result) == -1 &&
               strstr(err_msg(), "timeout"),
           "zero timeout: %s", err_msg());
}

static void test_code_from_response(void) {
    struct {
        const char *response, *code;
    } cases[] = {
        {"Here:\n```python\nprint(1)\n```\nDone.", "print(1)\n"},
        {"```Python3\nx = 1\n```", "x = 1\n"},
        {"```py\na\n```", "a\n"},
        {"Text ```\nbare\n``` then ```python\nchosen\n```", "chosen\n"},
        {"Only bare:\n```\nbare()\n```\n", "bare()\n"},
        {"```text\nnot code\n```\nprint(2)", "```text\nnot code\n```\nprint(2)"},
        {"print(3)\n", "print(3)\n"},
        {"```python\ncut off by max length", "cut off by max length"},
        {"", ""},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *code = code_from_response(cases[i].response);
        EXPECT(strcmp(code, cases[i].code) == 0, "case %zu: got \"%s\", expected \"%s\"", i, code, cases[i].code);
        free(code);
    }
}

// --- sandbox limits --------------------------------------------------------------------

static void test_limit_timeout(void) {
    char scratch[128];
    SandboxLimits limits = limits_with_timeout(1.0);
    SandboxRun run;
    if (run_fixture("loop_forever.py", "", &limits, &run, scratch, sizeof scratch) == 0) {
        // TIMEOUT is the deadline's kill (an exit, a signal or the output limit say otherwise),
        // and not before the deadline. No upper bound on the time: how soon after the
        // deadline the kill is seen depends on the machine's load (CI saw 1.4 s on 2 cores).
        EXPECT(run.outcome == SANDBOX_TIMEOUT, "outcome %d", run.outcome);
        EXPECT(run.wall_seconds >= 1.0, "killed after %.3f s", run.wall_seconds);
        sandbox_run_free(&run);
    }
    EXPECT(processes_mentioning(scratch) == 0, "processes of %s survived", scratch);
    // Sleeping (no CPU), output closed, a child in its own session: still all killed.
    if (run_fixture("sleep_forever.py", "", &limits, &run, scratch, sizeof scratch) == 0) {
        EXPECT(run.outcome == SANDBOX_TIMEOUT, "outcome %d", run.outcome);
        EXPECT(run.wall_seconds >= 1.0, "killed after %.3f s", run.wall_seconds);
        sandbox_run_free(&run);
    }
    EXPECT(processes_mentioning(scratch) == 0, "processes of %s survived", scratch);
    // In the reward: a runtime error, soon after the timeout.
    CodeRewardResult looped = score_files("loop_forever.py", "sum_stdin.json", 1.0);
    EXPECT_REWARD(looped, -0.6, CODE_STATUS_RUNTIME_ERROR, 0, 4);
    EXPECT(strstr(looped.reason, "timed out after 1 s") != NULL, "reason: %s", looped.reason);
    // The first timeout ends the evaluation: tests 2..4 are not run (each would take its second).
    EXPECT(looped.failed_test == 0, "failed test %d (%s)", looped.failed_test, looped.reason);
}

static void test_limit_memory(void) {
    SandboxLimits limits = sandbox_default_limits();
    SandboxRun run;
    if (run_fixture("alloc_2gb.py", "", &limits, &run, NULL, 0) == 0) {
        bool memory_error = run.outcome == SANDBOX_EXITED && run.exit_code != 0 && strstr(run.err, "MemoryError");
        bool killed = run.outcome == SANDBOX_SIGNALED;
        EXPECT(memory_error || killed, "outcome %d, exit %d, stderr: %s", run.outcome, run.exit_code, run.err);
        EXPECT(run.out_size == 0, "printed %s", run.out);
        sandbox_run_free(&run);
    }
    if (run_fixture("alloc_100mb.py", "", &limits, &run, NULL, 0) == 0) {
        EXPECT(run.outcome == SANDBOX_EXITED && run.exit_code == 0 && strcmp(run.out, "104857600\n") == 0,
               "100 MiB: outcome %d, out %s, err %s", run.outcome, run.out, run.err);
        sandbox_run_free(&run);
    }
    CodeRewardResult result = score_files("alloc_2gb.py", "sum_stdin.json", 4);
    EXPECT_REWARD(result, -0.6, CODE_STATUS_RUNTIME_ERROR, 0, 4);
}

static void test_limit_output(void) {
    SandboxLimits limits = limits_with_timeout(4.0);
    limits.max_output_bytes = 1 << 20;
    SandboxRun run;
    if (run_fixture("output_flood.py", "", &limits, &run, NULL, 0) == 0) {
        EXPECT(run.outcome == SANDBOX_OUTPUT_LIMIT, "outcome %d", run.outcome);
        EXPECT(run.out_size == (size_t)limits.max_output_bytes, "kept %zu bytes", run.out_size);
        // OUTPUT_LIMIT, not TIMEOUT: the flood was killed at its 1 MiB, before the deadline.
        sandbox_run_free(&run);
    }
    CodeRewardResult result = score_files("output_flood.py", "sum_stdin.json", 4);
    EXPECT_REWARD(result, -0.6, CODE_STATUS_RUNTIME_ERROR, 0, 4);
    EXPECT(strstr(result.reason, "output over 1048576 bytes") != NULL, "reason: %s", result.reason);
}

static void test_limit_processes(void) {
    char scratch[128];
    SandboxLimits limits = limits_with_timeout(1.0);
    limits.max_processes = 16;
    SandboxRun run;
    if (run_fixture("fork_bomb.py", "", &limits, &run, scratch, sizeof scratch) == 0) {
        EXPECT(run.outcome == SANDBOX_TIMEOUT, "outcome %d", run.outcome);
        sandbox_run_free(&run);
    }
    EXPECT(processes_mentioning(scratch) == 0, "processes of %s survived", scratch);
    // The limit itself: 16 tasks in all, so 15 children; the program then exits and its
    // sleeping children die with its namespace.
    if (run_fixture("fork_count.py", "", &limits, &run, scratch, sizeof scratch) == 0) {
        int forked = -1;
        EXPECT(sscanf(run.out, "forked %d then", &forked) == 1 && forked >= 1 && forked <= 15,
               "fork count: %s %s", run.out, run.err);
        // EXITED, not TIMEOUT: the sandbox did not wait for the sleeping children.
        EXPECT(run.outcome == SANDBOX_EXITED, "outcome %d after %.3f s", run.outcome, run.wall_seconds);
        sandbox_run_free(&run);
    }
    EXPECT(processes_mentioning(scratch) == 0, "processes of %s survived", scratch);
}

static void test_limit_network(void) {
    // Only loopback: a listener of our own on 127.0.0.1, ephemeral port.
    int listener = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    CHECK(listener >= 0, "socket failed");
    struct sockaddr_in address = {.sin_family = AF_INET, .sin_port = 0};
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    CHECK(bind(listener, (struct sockaddr *)&address, sizeof address) == 0, "bind failed");
    CHECK(listen(listener, 4) == 0, "listen failed");
    socklen_t length = sizeof address;
    CHECK(getsockname(listener, (struct sockaddr *)&address, &length) == 0, "getsockname failed");
    char port[16];
    snprintf(port, sizeof port, "%d\n", ntohs(address.sin_port));

    SandboxLimits limits = limits_with_timeout(4.0);
    SandboxRun run;
    if (run_fixture("network.py", port, &limits, &run, NULL, 0) == 0) {
        EXPECT(run.outcome == SANDBOX_EXITED && strncmp(run.out, "blocked", 7) == 0, "network: %s %s", run.out,
               run.err);
        sandbox_run_free(&run);
    }
    int accepted = accept(listener, NULL, NULL);
    EXPECT(accepted < 0 && (errno == EAGAIN || errno == EWOULDBLOCK), "a connection reached the host listener");
    if (accepted >= 0) close(accepted);
    close(listener);
}

// A Unix socket of the host, open to everyone (like a system bus): connect() works on a
// read-only mount, so it takes the seccomp filter to refuse it.
static void test_limit_unix_socket(void) {
    int listener = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    CHECK(listener >= 0, "socket failed");
    struct sockaddr_un address = {.sun_family = AF_UNIX};
    snprintf(address.sun_path, sizeof address.sun_path, "/tmp/marlhf-sandbox-socket-%d", (int)getpid());
    unlink(address.sun_path);
    CHECK(bind(listener, (struct sockaddr *)&address, sizeof address) == 0, "bind failed");
    chmod(address.sun_path, 0777);
    CHECK(listen(listener, 4) == 0, "listen failed");
    char input[128];
    snprintf(input, sizeof input, "%s\n", address.sun_path);
    SandboxLimits limits = limits_with_timeout(4.0);
    SandboxRun run;
    if (run_fixture("unix_socket.py", input, &limits, &run, NULL, 0) == 0) {
        EXPECT(run.outcome == SANDBOX_EXITED && strncmp(run.out, "blocked", 7) == 0, "unix socket: %s %s", run.out,
               run.err);
        EXPECT(strstr(run.out, "pair ok") != NULL, "socketpair: %s %s", run.out, run.err);
        sandbox_run_free(&run);
    }
    int accepted = accept(listener, NULL, NULL);
    EXPECT(accepted < 0 && (errno == EAGAIN || errno == EWOULDBLOCK), "a connection reached the host socket");
    if (accepted >= 0) close(accepted);
    close(listener);
    unlink(address.sun_path);
}

static void test_limit_writes(void) {
    char cwd[1024], project_tmp[1200], paths[2048];
    CHECK(getcwd(cwd, sizeof cwd), "getcwd failed");
    const char *test_tmp = getenv("MARLHF_TEST_TMP");
    snprintf(project_tmp, sizeof project_tmp, "%s/%s", cwd, test_tmp ? test_tmp : "tests/tmp");
    mkdir(project_tmp, 0755);
    char project_file[1300];
    snprintf(project_file, sizeof project_file, "%s/sandbox-escape", project_tmp);
    const char *targets[] = {"/tmp/marlhf-sandbox-escape", "/dev/shm/marlhf-sandbox-escape", project_file};
    paths[0] = '\0';
    for (int i = 0; i < 3; i++) {
        unlink(targets[i]);
        strcat(paths, targets[i]);
        strcat(paths, "\n");
    }
    SandboxLimits limits = limits_with_timeout(4.0);
    SandboxRun run;
    if (run_fixture("write_outside.py", paths, &limits, &run, NULL, 0) == 0) {
        for (int i = 0; i < 3; i++) {
            // Refused for the right reason: a read-only file system (or no permission),
            // not a folder that happens to be missing.
            char read_only[1400], denied[1400];
            snprintf(read_only, sizeof read_only, "blocked %s EROFS\n", targets[i]);
            snprintf(denied, sizeof denied, "blocked %s EACCES\n", targets[i]);
            EXPECT(strstr(run.out, read_only) || strstr(run.out, denied), "%s was not blocked:\n%s%s", targets[i],
                   run.out, run.err);
        }
        EXPECT(strstr(run.out, "remount blocked") != NULL, "remount: %s", run.out);
        EXPECT(strstr(run.out, "working folder writable ok") != NULL, "working folder: %s %s", run.out, run.err);
        sandbox_run_free(&run);
    }
    for (int i = 0; i < 3; i++) EXPECT(!file_exists(targets[i]), "%s exists after the run", targets[i]);
}

static void test_limit_environment(void) {
    setenv("MARLHF_SANDBOX_SECRET", "hunter2", 1);
    SandboxLimits limits = limits_with_timeout(4.0);
    SandboxRun run;
    if (run_fixture("environment.py", "", &limits, &run, NULL, 0) == 0) {
        EXPECT(strstr(run.out, "env HOME LANG OMP_NUM_THREADS OPENBLAS_NUM_THREADS PATH TMPDIR\n") != NULL,
               "environment: %s %s", run.out, run.err);
        EXPECT(strstr(run.out, "secret absent") && !strstr(run.out, "hunter2"), "secret leaked: %s", run.out);
        EXPECT(strstr(run.out, "pid 1\n") && strstr(run.out, "processes 1\n"), "host processes visible: %s",
               run.out);
        EXPECT(strstr(run.out, "CapEff 0000000000000000 CapBnd 0000000000000000") != NULL, "capabilities: %s",
               run.out);
        EXPECT(strstr(run.out, "NoNewPrivs 1 Seccomp 2") != NULL, "no_new_privs, seccomp filter: %s", run.out);
        // Its uid 0 is nobody outside when we are root (it cannot write root's files),
        // else ourselves.
        char uid_map[64];
        snprintf(uid_map, sizeof uid_map, "uid_map 0 %u 1\n", geteuid() == 0 ? 65534u : (unsigned)geteuid());
        EXPECT(strstr(run.out, uid_map) != NULL, "identity: %s", run.out);
        sandbox_run_free(&run);
    }
    unsetenv("MARLHF_SANDBOX_SECRET");
}

// Sandboxes in several threads at once, one of them a fork bomb at its process limit: the
// others still score 1.0. Each sandbox counts its processes in its own user namespace,
// although all of them run as the same outer uid.
typedef struct {
    bool fork_bomb;
    int perfect;  // rewards of 1.0 seen
    int runs;
} ConcurrentJob;

static void *concurrent_job(void *argument) {
    ConcurrentJob *job = argument;
    if (job->fork_bomb) {
        SandboxLimits limits = limits_with_timeout(2.0);
        SandboxRun run;
        char scratch[128];
        Sandbox *sandbox;
        CHECK(sandbox_create(&sandbox) == 0, "%s", err_msg());
        char *source = read_fixture("fork_bomb.py");
        CHECK(sandbox_add_file(sandbox, "program.py", source, strlen(source)) == 0, "%s", err_msg());
        free(source);
        snprintf(scratch, sizeof scratch, "%s/program.py", sandbox_path(sandbox));
        const char *argv[] = {PYTHON, "-I", "-B", scratch, NULL};
        if (sandbox_run(sandbox, argv, "", 0, &limits, &run) == 0) {
            job->runs = 1;
            job->perfect = run.outcome == SANDBOX_TIMEOUT;
            sandbox_run_free(&run);
        }
        sandbox_destroy(sandbox);
        return NULL;
    }
    char *source = read_fixture("sum_correct.py"), *json = read_fixture("sum_stdin.json");
    CodeRewardLimits limits = fast_limits(4.0);
    usleep(200000);  // let the fork bomb reach its limit first
    for (int i = 0; i < 3; i++) {
        CodeRewardResult result;
        if (code_reward(source, json, &limits, &result) != 0) {
            fprintf(stderr, "  concurrent reward failed: %s\n", err_msg());
            continue;
        }
        job->runs++;
        if (result.reward == 1.0) job->perfect++;
        else fprintf(stderr, "  concurrent reward %g: %s\n", result.reward, result.reason);
    }
    free(source);
    free(json);
    return NULL;
}

static void test_concurrent_sandboxes(void) {
    enum { JOBS = 4 };
    ConcurrentJob jobs[JOBS] = {{.fork_bomb = true}};
    pthread_t threads[JOBS];
    for (int i = 0; i < JOBS; i++) CHECK(pthread_create(&threads[i], NULL, concurrent_job, &jobs[i]) == 0, "thread");
    for (int i = 0; i < JOBS; i++) pthread_join(threads[i], NULL);
    EXPECT(jobs[0].runs == 1 && jobs[0].perfect == 1, "the fork bomb did not run into its timeout");
    for (int i = 1; i < JOBS; i++)
        EXPECT(jobs[i].runs == 3 && jobs[i].perfect == 3, "job %d: %d of %d runs scored 1.0", i, jobs[i].perfect,
               jobs[i].runs);
}

static void test_sandbox_bad_arguments(void) {
    Sandbox *sandbox;
    CHECK(sandbox_create(&sandbox) == 0, "%s", err_msg());
    EXPECT(sandbox_add_file(sandbox, "../escape.py", "x", 1) == -1, "a path was accepted as a file name");
    EXPECT(sandbox_add_file(sandbox, "work", "x", 1) == -1, "\"work\" was accepted as a file name");
    SandboxLimits limits = sandbox_default_limits();
    SandboxRun run;
    const char *relative[] = {"python3", "-c", "pass", NULL};
    EXPECT(sandbox_run(sandbox, relative, "", 0, &limits, &run) == -1 && strstr(err_msg(), "not absolute"),
           "relative program: %s", err_msg());
    const char *missing[] = {"/nonexistent/python3", NULL};
    EXPECT(sandbox_run(sandbox, missing, "", 0, &limits, &run) == -1 && strstr(err_msg(), "execute the program"),
           "missing program: %s", err_msg());
    const char *python[] = {PYTHON, "-c", "pass", NULL};
    limits.timeout_seconds = -1;
    EXPECT(sandbox_run(sandbox, python, "", 0, &limits, &run) == -1 && strstr(err_msg(), "timeout"),
           "negative timeout: %s", err_msg());
    char path[128];
    snprintf(path, sizeof path, "%s", sandbox_path(sandbox));
    sandbox_destroy(sandbox);
    EXPECT(!file_exists(path), "%s was not removed", path);
}

#define TIMED_RUN(fn)                                                     \
    do {                                                                  \
        double start_ = seconds_now();                                    \
        RUN(fn);                                                          \
        printf("time %s %.2f s\n", #fn, seconds_now() - start_);          \
    } while (0)

int main(void) {
    TIMED_RUN(test_reward_stdin_problem);
    TIMED_RUN(test_reward_call_based_problem);
    TIMED_RUN(test_reward_call_result_cannot_be_printed);
    TIMED_RUN(test_reward_output_comparison);
    TIMED_RUN(test_reward_bad_input);
    TIMED_RUN(test_code_from_response);
    TIMED_RUN(test_limit_timeout);
    TIMED_RUN(test_limit_memory);
    TIMED_RUN(test_limit_output);
    TIMED_RUN(test_limit_processes);
    TIMED_RUN(test_limit_network);
    TIMED_RUN(test_limit_unix_socket);
    TIMED_RUN(test_limit_writes);
    TIMED_RUN(test_limit_environment);
    TIMED_RUN(test_concurrent_sandboxes);
    TIMED_RUN(test_sandbox_bad_arguments);
    TEST_EXIT();
}
