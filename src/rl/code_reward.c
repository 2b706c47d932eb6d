// The APPS reward of code_reward.h: parse input_output, compile-check the program in the
// sandbox, run each test in a fresh sandboxed process, compare in C.
#include "rl/code_reward.h"

#include <ctype.h>
#include <jansson.h>
#include <math.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "core/check.h"
#include "io/jsonl.h"
#include "rl/sandbox.h"

#define PROGRAM_FILE "solution.py"

CodeRewardLimits code_reward_default_limits(void) {
    return (CodeRewardLimits){
        .timeout_seconds = 4.0,
        .memory_mb = 512,
        .max_output_bytes = 1L << 20,
        .max_tests = 20,
        .python = NULL,
    };
}

const char *code_status_name(CodeStatus status) {
    switch (status) {
    case CODE_STATUS_COMPILE_ERROR: return "compile_error";
    case CODE_STATUS_RUNTIME_ERROR: return "runtime_error";
    case CODE_STATUS_RAN: return "ran";
    }
    return "?";
}

// --- the Python side -------------------------------------------------------------------
// Each driver is run as `python3 -I -B -c DRIVER <scratch>/solution.py`.

// Only compiles: nothing of the program runs. Prints one line "Type: message (line N)".
static const char compile_driver[] =
    "import sys\n"
    "path = sys.argv[1]\n"
    "try:\n"
    "    with open(path, 'rb') as f:\n"
    "        compile(f.read(), path, 'exec', dont_inherit=True)\n"
    "except Exception as error:\n"
    "    line = getattr(error, 'lineno', None)\n"
    "    message = getattr(error, 'msg', None) or str(error)\n"
    "    sys.stderr.write(f'{type(error).__name__}: {message}' + (f' (line {line})' if line else '') + '\\n')\n"
    "    sys.exit(1)\n";

// APPS's preamble (testing_util.py), run in the program's namespace; numpy only on first
// use (it is slow to import and often absent).
#define APPS_PREAMBLE                                                                        \
    "import sys\\nimport time\\nimport itertools\\n"                                         \
    "from itertools import accumulate, product, permutations, combinations\\n"               \
    "import collections\\n"                                                                  \
    "from collections import Counter, OrderedDict, deque, defaultdict, ChainMap\\n"          \
    "from functools import lru_cache\\nimport math\\n"                                       \
    "from math import sqrt, sin, cos, tan, ceil, fabs, floor, gcd, exp, log, log2\\n"        \
    "import fractions\\nfrom typing import List, Tuple\\nimport random\\nimport heapq\\n"     \
    "from heapq import *\\n"                                                                 \
    "class _LazyNumpy:\\n"                                                                   \
    "    def __getattr__(self, name):\\n"                                                    \
    "        import numpy\\n"                                                                \
    "        return getattr(numpy, name)\\n"                                                 \
    "np = _LazyNumpy()\\n"

// Standard input: the program runs as __main__ on the sandbox's stdin and stdout.
static const char stdin_driver[] =
    "import builtins, sys\n"
    "path = sys.argv[1]\n"
    "sys.argv = [path]\n"
    "with open(path, 'rb') as f:\n"
    "    code = compile(f.read(), path, 'exec', dont_inherit=True)\n"
    "namespace = {'__name__': '__main__', '__builtins__': builtins, '__file__': path}\n"
    "exec('" APPS_PREAMBLE "', namespace)\n"
    "del f\n"
    "exec(code, namespace)\n";

// Call-based: stdin is "<nonce>\n{"fn_name": ..., "args": [...]}". The result goes out as
// "<nonce> <json>\n" on a private copy of stdout; fd 1 is pointed at stderr so that the
// program's prints cannot be taken for it, and stdin at /dev/null once read.
static const char call_driver[] =
    "import builtins, json, os, sys\n"
    "def _marlhf_call():\n"
    "    path = sys.argv[1]\n"
    "    sys.argv = [path]\n"
    "    nonce, _, request = sys.stdin.buffer.read().partition(b'\\n')\n"
    "    request = json.loads(request)\n"
    "    null = os.open(os.devnull, os.O_RDONLY)\n"
    "    os.dup2(null, 0)\n"
    "    os.close(null)\n"
    "    result_fd = os.dup(1)\n"
    "    os.dup2(2, 1)\n"
    "    with open(path, 'rb') as f:\n"
    "        code = compile(f.read(), path, 'exec', dont_inherit=True)\n"
    "    namespace = {'__name__': '__main__', '__builtins__': builtins, '__file__': path}\n"
    "    exec('" APPS_PREAMBLE "', namespace)\n"
    "    exec(code, namespace)\n"
    "    name = request['fn_name']\n"
    "    solution = namespace.get('Solution')\n"
    "    if isinstance(solution, type) and hasattr(solution, name):\n"
    "        function = getattr(solution(), name)\n"
    "    elif callable(namespace.get(name)):\n"
    "        function = namespace[name]\n"
    "    else:\n"
    "        raise NameError(f'the program defines no function {name!r}')\n"
    "    result = function(*request['args'])\n"
    "    try:\n"
    "        text = json.dumps(result, allow_nan=False)\n"
    "    except (TypeError, ValueError):\n"
    "        text = '!' + type(result).__name__\n"
    "    sys.stdout.flush()\n"
    "    sys.stderr.flush()\n"
    "    data = nonce + b' ' + text.encode('utf-8', 'replace') + b'\\n'\n"
    "    while data:\n"
    "        data = data[os.write(result_fd, data):]\n"
    "    os._exit(0)\n"
    "_marlhf_call()\n";

// --- input_output ----------------------------------------------------------------------

typedef struct {
    json_t *root;
    json_t *inputs, *outputs;
    const char *fn_name;  // NULL: standard input
    int total;
} AppsTests;

// A string, or a list of strings (joined with "\n" where used).
static bool is_text_or_lines(const json_t *value) {
    if (json_is_string(value)) return true;
    if (!json_is_array(value)) return false;
    size_t index;
    json_t *line;
    json_array_foreach(value, index, line) if (!json_is_string(line)) return false;
    return true;
}

// Every error names input_output and what is wrong, so a bad dataset row can be found.
static int parse_tests(const char *text, int max_tests, AppsTests *tests) {
    memset(tests, 0, sizeof *tests);
    if (!text) return err_set("input_output: missing (NULL)");
    json_error_t error;
    tests->root = json_loads(text, 0, &error);
    if (!tests->root)
        return err_set("input_output: not valid JSON: %s at character %d", error.text, error.position);
    if (!json_is_object(tests->root))
        return err_set("input_output: holds %s, expected an object with \"inputs\" and \"outputs\"",
                       json_kind(tests->root));
    tests->inputs = json_object_get(tests->root, "inputs");
    tests->outputs = json_object_get(tests->root, "outputs");
    if (!json_is_array(tests->inputs))
        return err_set("input_output: \"inputs\" is %s, expected an array",
                       tests->inputs ? json_kind(tests->inputs) : "missing");
    if (!json_is_array(tests->outputs))
        return err_set("input_output: \"outputs\" is %s, expected an array",
                       tests->outputs ? json_kind(tests->outputs) : "missing");
    size_t count = json_array_size(tests->inputs);
    if (count != json_array_size(tests->outputs))
        return err_set("input_output: %zu inputs but %zu outputs", count, json_array_size(tests->outputs));
    if (count == 0) return err_set("input_output: no tests (\"inputs\" is empty)");
    json_t *fn_name = json_object_get(tests->root, "fn_name");
    if (fn_name && !json_is_null(fn_name) && !json_is_string(fn_name))
        return err_set("input_output: \"fn_name\" is %s, expected a string", json_kind(fn_name));
    // APPS asks `if not data.get("fn_name")`: an empty name means standard input.
    if (json_is_string(fn_name) && json_string_length(fn_name) > 0) tests->fn_name = json_string_value(fn_name);
    tests->total = count < (size_t)max_tests ? (int)count : max_tests;
    for (int i = 0; i < tests->total; i++) {
        json_t *input = json_array_get(tests->inputs, (size_t)i), *output = json_array_get(tests->outputs, (size_t)i);
        if (tests->fn_name && !json_is_array(input))
            return err_set("input_output: inputs[%d] is %s, expected the array of arguments of %s", i,
                           json_kind(input), tests->fn_name);
        if (!tests->fn_name && !is_text_or_lines(input))
            return err_set("input_output: inputs[%d] is %s, expected a string or an array of strings", i,
                           json_kind(input));
        if (!tests->fn_name && !is_text_or_lines(output))
            return err_set("input_output: outputs[%d] is %s, expected a string or an array of strings", i,
                           json_kind(output));
    }
    return 0;
}

// A string as is, or a list of strings joined with "\n". xmalloc'd.
static char *joined_text(const json_t *value, size_t *size) {
    if (json_is_string(value)) {
        *size = json_string_length(value);
        char *text = xmalloc(*size + 1);
        memcpy(text, json_string_value(value), *size + 1);
        return text;
    }
    size_t total = 0, count = json_array_size(value);
    for (size_t i = 0; i < count; i++) total += json_string_length(json_array_get(value, i)) + 1;
    char *text = xmalloc(total + 1), *at = text;
    for (size_t i = 0; i < count; i++) {
        if (i > 0) *at++ = '\n';
        json_t *line = json_array_get(value, i);
        memcpy(at, json_string_value(line), json_string_length(line));
        at += json_string_length(line);
    }
    *at = '\0';
    *size = (size_t)(at - text);
    return text;
}

// --- comparing standard output ---------------------------------------------------------

static bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

typedef struct {
    const char *at, *end;
} Cursor;

// The next non-empty line, stripped; false at the end.
static bool next_line(Cursor *cursor, const char **start, size_t *length) {
    while (cursor->at < cursor->end) {
        const char *line = cursor->at;
        const char *stop = memchr(line, '\n', (size_t)(cursor->end - line));
        if (!stop) stop = cursor->end;
        cursor->at = stop < cursor->end ? stop + 1 : stop;
        while (line < stop && is_space(*line)) line++;
        while (stop > line && is_space(stop[-1])) stop--;
        if (stop > line) {
            *start = line;
            *length = (size_t)(stop - line);
            return true;
        }
    }
    return false;
}

static bool next_token(Cursor *cursor, const char **start, size_t *length) {
    while (cursor->at < cursor->end && is_space(*cursor->at)) cursor->at++;
    if (cursor->at == cursor->end) return false;
    *start = cursor->at;
    while (cursor->at < cursor->end && !is_space(*cursor->at)) cursor->at++;
    *length = (size_t)(cursor->at - *start);
    return true;
}

// A decimal number token: sign, digits, at most one '.', optional exponent. Sets
// *integer when it has neither '.' nor an exponent.
static bool parse_decimal(const char *token, size_t length, double *value, bool *integer) {
    char copy[128];
    if (length == 0 || length >= sizeof copy) return false;
    for (size_t i = 0; i < length; i++)
        if (!strchr("0123456789+-.eE", token[i])) return false;
    memcpy(copy, token, length);
    copy[length] = '\0';
    char *end;
    *value = strtod(copy, &end);
    *integer = !strpbrk(copy, ".eE");
    return end == copy + length && isfinite(*value);
}

static bool tokens_close(const char *got, size_t got_length, const char *expected, size_t expected_length) {
    double got_value, expected_value;
    bool got_integer, expected_integer;
    if (!parse_decimal(got, got_length, &got_value, &got_integer) ||
        !parse_decimal(expected, expected_length, &expected_value, &expected_integer))
        return false;
    if (got_integer && expected_integer) return false;  // integers were compared exactly
    return fabs(got_value - expected_value) <= 1e-8 + 1e-5 * fabs(expected_value);
}

static bool same_text(const char *a, size_t a_length, const char *b, size_t b_length) {
    return a_length == b_length && memcmp(a, b, a_length) == 0;
}

static bool lines_match(const char *got, size_t got_size, const char *expected, size_t expected_size) {
    Cursor a = {got, got + got_size}, b = {expected, expected + expected_size};
    for (;;) {
        const char *line_a, *line_b;
        size_t length_a, length_b;
        bool more_a = next_line(&a, &line_a, &length_a), more_b = next_line(&b, &line_b, &length_b);
        if (!more_a || !more_b) return more_a == more_b;
        if (!same_text(line_a, length_a, line_b, length_b)) return false;
    }
}

static bool tokens_match(const char *got, size_t got_size, const char *expected, size_t expected_size,
                         bool allow_close_numbers) {
    Cursor a = {got, got + got_size}, b = {expected, expected + expected_size};
    for (;;) {
        const char *token_a, *token_b;
        size_t length_a, length_b;
        bool more_a = next_token(&a, &token_a, &length_a), more_b = next_token(&b, &token_b, &length_b);
        if (!more_a || !more_b) return more_a == more_b;
        if (same_text(token_a, length_a, token_b, length_b)) continue;
        if (!allow_close_numbers || !tokens_close(token_a, length_a, token_b, length_b)) return false;
    }
}

static bool stdout_matches(const char *got, size_t got_size, const char *expected, size_t expected_size) {
    return lines_match(got, got_size, expected, expected_size) ||
           tokens_match(got, got_size, expected, expected_size, false) ||
           tokens_match(got, got_size, expected, expected_size, true);
}

// --- comparing call results: Python's == on JSON values ---------------------------------

static bool json_numeric(const json_t *value, double *number, bool *integer, json_int_t *integer_value) {
    if (json_is_integer(value)) *integer_value = json_integer_value(value), *integer = true;
    else if (json_is_true(value)) *integer_value = 1, *integer = true;
    else if (json_is_false(value)) *integer_value = 0, *integer = true;
    else if (json_is_real(value)) *number = json_real_value(value), *integer = false;
    else return false;
    if (*integer) *number = (double)*integer_value;
    return true;
}

static bool python_equal(const json_t *a, const json_t *b) {
    double number_a, number_b;
    bool integer_a, integer_b;
    json_int_t int_a = 0, int_b = 0;
    bool numeric_a = json_numeric(a, &number_a, &integer_a, &int_a);
    bool numeric_b = json_numeric(b, &number_b, &integer_b, &int_b);
    if (numeric_a || numeric_b) {
        if (!numeric_a || !numeric_b) return false;
        if (integer_a && integer_b) return int_a == int_b;
        return number_a == number_b;
    }
    if (json_typeof(a) != json_typeof(b)) return false;
    switch (json_typeof(a)) {
    case JSON_NULL: return true;
    case JSON_STRING:
        return same_text(json_string_value(a), json_string_length(a), json_string_value(b), json_string_length(b));
    case JSON_ARRAY: {
        size_t count = json_array_size(a);
        if (count != json_array_size(b)) return false;
        for (size_t i = 0; i < count; i++)
            if (!python_equal(json_array_get(a, i), json_array_get(b, i))) return false;
        return true;
    }
    case JSON_OBJECT: {
        if (json_object_size(a) != json_object_size(b)) return false;
        const char *key;
        json_t *value;
        json_object_foreach((json_t *)a, key, value) {
            json_t *other = json_object_get(b, key);
            if (!other || !python_equal(value, other)) return false;
        }
        return true;
    }
    default: return false;
    }
}

// APPS: `output == expected`, or `output == expected[0]` for a non-empty list.
static bool call_result_matches(const json_t *got, const json_t *expected) {
    if (python_equal(got, expected)) return true;
    return json_is_array(expected) && json_array_size(expected) > 0 && python_equal(got, json_array_get(expected, 0));
}

// --- running ---------------------------------------------------------------------------

typedef struct {
    Sandbox *sandbox;
    SandboxLimits limits;
    const char *python;
    char program_path[128];
} Runner;

static int run_driver(Runner *runner, const char *driver, const void *input, size_t input_size, SandboxRun *run) {
    const char *argv[] = {runner->python, "-I", "-B", "-c", driver, runner->program_path, NULL};
    return sandbox_run(runner->sandbox, argv, input, input_size, &runner->limits, run);
}

// The last non-empty line of stderr (where Python puts the exception), shortened.
static void last_stderr_line(const SandboxRun *run, char *out, size_t size) {
    const char *end = run->err + run->err_size;
    while (end > run->err && is_space(end[-1])) end--;
    const char *start = end;
    while (start > run->err && start[-1] != '\n') start--;
    size_t length = (size_t)(end - start);
    if (length >= size) length = size - 1;
    memcpy(out, start, length);
    out[length] = '\0';
    for (char *p = out; *p; p++)
        if ((unsigned char)*p < 32) *p = ' ';
}

// Describes why a run is a runtime error; false when it exited with status 0.
static bool describe_failure(const SandboxRun *run, const SandboxLimits *limits, char *out, size_t size) {
    char line[160];
    switch (run->outcome) {
    case SANDBOX_TIMEOUT: snprintf(out, size, "timed out after %g s", limits->timeout_seconds); return true;
    case SANDBOX_OUTPUT_LIMIT: snprintf(out, size, "output over %ld bytes", limits->max_output_bytes); return true;
    case SANDBOX_SIGNALED:
        snprintf(out, size, "killed by signal %d (%s)", run->signal, strsignal(run->signal));
        return true;
    case SANDBOX_EXITED:
        if (run->exit_code == 0) return false;
        last_stderr_line(run, line, sizeof line);
        snprintf(out, size, "exit status %d: %s", run->exit_code, line[0] ? line : "(no message)");
        return true;
    }
    return false;
}

static void make_nonce(char out[33]) {
    unsigned char bytes[16];
    CHECK(getrandom(bytes, sizeof bytes, 0) == (ssize_t)sizeof bytes, "getrandom failed");
    for (int i = 0; i < 16; i++) snprintf(out + 2 * i, 3, "%02x", bytes[i]);
}

// The JSON value after "<nonce> " on stdout. *found: the driver wrote its line (the
// function returned). NULL also when the result was not JSON ("!type", NaN, a big int).
static json_t *find_call_result(const SandboxRun *run, const char *nonce, bool *found) {
    *found = false;
    size_t nonce_length = strlen(nonce);
    const char *at = run->out, *end = run->out + run->out_size;
    while (at < end) {
        const char *stop = memchr(at, '\n', (size_t)(end - at));
        if (!stop) stop = end;
        if ((size_t)(stop - at) > nonce_length && memcmp(at, nonce, nonce_length) == 0 && at[nonce_length] == ' ') {
            *found = true;
            const char *text = at + nonce_length + 1;
            if (*text == '!') return NULL;
            json_error_t error;
            return json_loadb(text, (size_t)(stop - text), JSON_DECODE_ANY, &error);
        }
        at = stop + 1;
    }
    return NULL;
}

// Runs test `index`. Returns 1 passed, 0 failed, -1 runtime error (reason written),
// -2 the sandbox could not run (err_set).
static int run_test(Runner *runner, const AppsTests *tests, int index, char *reason, size_t reason_size) {
    json_t *input = json_array_get(tests->inputs, (size_t)index);
    json_t *expected = json_array_get(tests->outputs, (size_t)index);
    SandboxRun run;
    char failure[200];
    int verdict;
    if (!tests->fn_name) {
        size_t input_size;
        char *stdin_text = joined_text(input, &input_size);
        int rc = run_driver(runner, stdin_driver, stdin_text, input_size, &run);
        free(stdin_text);
        if (rc != 0) return -2;
        if (describe_failure(&run, &runner->limits, failure, sizeof failure)) {
            snprintf(reason, reason_size, "test %d/%d: %s", index + 1, tests->total, failure);
            verdict = -1;
        } else {
            size_t expected_size;
            char *expected_text = joined_text(expected, &expected_size);
            verdict = stdout_matches(run.out, run.out_size, expected_text, expected_size) ? 1 : 0;
            free(expected_text);
        }
    } else {
        char nonce[33];
        make_nonce(nonce);
        json_t *request = json_pack("{s:s, s:O}", "fn_name", tests->fn_name, "args", input);
        CHECK(request, "json_pack failed");
        char *request_text = json_dumps(request, JSON_COMPACT);
        json_decref(request);
        CHECK(request_text, "json_dumps failed");
        size_t stdin_size = strlen(nonce) + 1 + strlen(request_text);
        char *stdin_text = xmalloc(stdin_size + 1);
        snprintf(stdin_text, stdin_size + 1, "%s\n%s", nonce, request_text);
        free(request_text);
        int rc = run_driver(runner, call_driver, stdin_text, stdin_size, &run);
        free(stdin_text);
        if (rc != 0) return -2;
        bool found;
        json_t *result = find_call_result(&run, nonce, &found);
        if (describe_failure(&run, &runner->limits, failure, sizeof failure)) {
            snprintf(reason, reason_size, "test %d/%d: %s", index + 1, tests->total, failure);
            verdict = -1;
        } else if (!found) {
            snprintf(reason, reason_size, "test %d/%d: exited before %s returned", index + 1, tests->total,
                     tests->fn_name);
            verdict = -1;
        } else {
            verdict = result && call_result_matches(result, expected) ? 1 : 0;
        }
        json_decref(result);
    }
    sandbox_run_free(&run);
    return verdict;
}

static double now_seconds(void) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (double)now.tv_sec + 1e-9 * (double)now.tv_nsec;
}

static int validate_limits(const CodeRewardLimits *limits) {
    if (!(limits->timeout_seconds > 0) || limits->timeout_seconds > 3600)
        return err_set("code reward: timeout %g s is not in (0, 3600]", limits->timeout_seconds);
    if (limits->memory_mb < 32) return err_set("code reward: memory limit %ld MB is under 32 MB", limits->memory_mb);
    if (limits->max_output_bytes < 1) return err_set("code reward: output limit under 1 byte");
    if (limits->max_tests < 1) return err_set("code reward: max_tests %d is under 1", limits->max_tests);
    return 0;
}

int code_reward(const char *program, const char *input_output_json, const CodeRewardLimits *limits_or_null,
                CodeRewardResult *out) {
    CHECK(program && out, "code_reward needs a program and a result");
    memset(out, 0, sizeof *out);
    out->failed_test = -1;
    double start = now_seconds();
    CodeRewardLimits limits = limits_or_null ? *limits_or_null : code_reward_default_limits();
    if (validate_limits(&limits) != 0) return -1;
    const char *python = limits.python ? limits.python : getenv("MARLHF_PYTHON");
    if (!python || !*python) python = "/usr/bin/python3";
    if (python[0] != '/' || access(python, X_OK) != 0)
        return err_set("code reward: the Python interpreter \"%s\" is not an executable absolute path", python);

    AppsTests tests;
    if (parse_tests(input_output_json, limits.max_tests, &tests) != 0) {
        json_decref(tests.root);
        return -1;
    }
    Runner runner = {.python = python, .limits = sandbox_default_limits()};
    runner.limits.timeout_seconds = limits.timeout_seconds;
    runner.limits.memory_bytes = limits.memory_mb << 20;
    runner.limits.max_output_bytes = limits.max_output_bytes;
    int rc = -1;
    if (sandbox_create(&runner.sandbox) != 0) goto done;
    snprintf(runner.program_path, sizeof runner.program_path, "%s/" PROGRAM_FILE, sandbox_path(runner.sandbox));
    if (sandbox_add_file(runner.sandbox, PROGRAM_FILE, program, strlen(program)) != 0) goto done;
    out->total = tests.total;

    // 1. Does it compile? Any failure of this step counts (see code_reward.h).
    SandboxRun compile_run;
    if (run_driver(&runner, compile_driver, "", 0, &compile_run) != 0) goto done;
    char failure[200];
    if (describe_failure(&compile_run, &runner.limits, failure, sizeof failure)) {
        out->status = CODE_STATUS_COMPILE_ERROR;
        out->reward = -1.0;
        if (compile_run.outcome == SANDBOX_EXITED && compile_run.exit_code == 1) {
            last_stderr_line(&compile_run, failure, sizeof failure);
        }
        snprintf(out->reason, sizeof out->reason, "does not compile: %s", failure);
        sandbox_run_free(&compile_run);
        rc = 0;
        goto done;
    }
    sandbox_run_free(&compile_run);

    // 2. The tests, until the first runtime error.
    out->status = CODE_STATUS_RAN;
    for (int i = 0; i < tests.total; i++) {
        int verdict = run_test(&runner, &tests, i, out->reason, sizeof out->reason);
        if (verdict == -2) goto done;
        if (verdict == -1) {
            out->status = CODE_STATUS_RUNTIME_ERROR;
            out->failed_test = i;
            break;
        }
        if (verdict == 1) out->passed++;
        else if (out->failed_test < 0) out->failed_test = i;
    }
    if (out->status == CODE_STATUS_RUNTIME_ERROR) {
        out->reward = -0.6;
    } else {
        out->reward = -0.3 + 1.3 * (double)out->passed / (double)out->total;
        if (out->failed_test >= 0)
            snprintf(out->reason, sizeof out->reason, "passed %d of %d tests (first wrong answer: test %d)",
                     out->passed, out->total, out->failed_test + 1);
        else
            snprintf(out->reason, sizeof out->reason, "passed %d of %d tests", out->passed, out->total);
    }
    rc = 0;
done:
    sandbox_destroy(runner.sandbox);
    json_decref(tests.root);
    out->seconds = now_seconds() - start;
    return rc;
}

// --- the code in a response --------------------------------------------------------------

// The content of the fenced block whose opening fence is at `fence` (pointing at "```").
static char *fenced_content(const char *fence) {
    const char *start = strchr(fence, '\n');
    if (!start) return xstrdup("");
    start++;
    const char *end = strstr(start, "```");
    if (!end) end = start + strlen(start);
    size_t length = (size_t)(end - start);
    char *code = xmalloc(length + 1);
    memcpy(code, start, length);
    code[length] = '\0';
    return code;
}

// The info string after "```", trimmed and lower-cased, into `out`.
static void fence_language(const char *fence, char *out, size_t size) {
    const char *at = fence + 3;
    while (*at == ' ' || *at == '\t') at++;
    size_t length = 0;
    while (at[length] && at[length] != '\n' && !is_space(at[length])) length++;
    if (length >= size) length = size - 1;
    for (size_t i = 0; i < length; i++) out[i] = (char)tolower((unsigned char)at[i]);
    out[length] = '\0';
}

char *code_from_response(const char *response) {
    CHECK(response, "code_from_response(NULL)");
    const char *bare = NULL;
    // Fences come in pairs: after an opening fence, skip to the one that closes it.
    for (const char *fence = strstr(response, "```"); fence;) {
        char language[32];
        fence_language(fence, language, sizeof language);
        if (strcmp(language, "python") == 0 || strcmp(language, "py") == 0 || strcmp(language, "python3") == 0)
            return fenced_content(fence);
        if (!language[0] && !bare) bare = fence;
        const char *line_end = strchr(fence, '\n');
        if (!line_end) break;
        const char *closing = strstr(line_end + 1, "```");
        if (!closing) break;
        fence = strstr(closing + 3, "```");
    }
    return bare ? fenced_content(bare) : xstrdup(response);
}
