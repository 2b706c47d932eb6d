// The APPS code-execution reward (spec 10.3): run the Python program a policy wrote on
// the problem's tests, in the sandbox of rl/sandbox.h, and score it
//
//   R = -1.0                        the program does not compile
//   R = -0.6                        it compiles but hits a runtime error on a test
//   R = -0.3 + 1.3 * passed / total otherwise (1.0 when every test passes)
//
// Definitions (ours; the paper's harness is not released, spec 15.4):
//   - Compiles: Python's compile(source, path, "exec") succeeds, run in the sandbox
//     before any test. Any failure of that step (SyntaxError, IndentationError, null
//     bytes, and a compile that runs out of time or memory) is a compile error. A call-based
//     program that does not define fn_name compiles; that is a runtime error (APPS's
//     harness calls it a compile error).
//   - Runtime error, on any test: a non-zero exit status (an uncaught exception ends
//     Python with status 1), death by a signal, the per-test timeout (wall clock; APPS's
//     harness also counts a timeout as -1, a runtime error), the memory limit (MemoryError
//     or a kill), stdout beyond the output limit, and for call-based problems an exit
//     (sys.exit) before the function returned. The first runtime error stops the run:
//     the reward is -0.6 whatever the other tests would do.
//   - Tests: the first max_tests of input_output (APPS has problems with hundreds), in
//     order; total = that number.
//
// Standard-input problems (no fn_name): each input (a string, or a list of strings
// joined with "\n", as APPS does) is the program's stdin; the program runs as __main__.
// Its stdout passes when any of these match the expected output (a string, or a list of
// strings joined with "\n"):
//   1. line by line, each line stripped of leading/trailing whitespace, empty lines
//      dropped (APPS's main comparison);
//   2. token by token, split on any whitespace;
//   3. token by token where a token pair that is not equal may be two decimal numbers
//      (digits, sign, '.', exponent; at least one of them not an integer) with
//      |got - expected| <= 1e-8 + 1e-5 |expected| (numpy.allclose's defaults, which APPS
//      uses). Integers must match exactly: APPS's float fallback also accepts 1000001 for
//      1000000, a known hole we do not copy. APPS's last fallback (lines as unordered sets
//      of tokens) is not used either.
// Call-based problems (fn_name set): a driver execs the program, takes
// Solution().fn_name when the program defines class Solution with that method (LeetCode
// style), else the top-level fn_name (Codewars style), calls it with the test's input
// list as positional arguments, and sends back json.dumps(result) (tuples become lists)
// on a descriptor of its own tagged with a random nonce; the program's own prints go to
// stderr. It passes when it equals the expected output, or the expected output's first
// element when that is a non-empty list (APPS wraps most results in a list), with
// Python's == on JSON values (1 == 1.0 == true, lists element-wise, objects key-wise).
// A result json.dumps cannot write (a set, an object) or that is not standard JSON
// (NaN) fails the test. The program shares the driver's interpreter, as in APPS's
// harness, so a determined program could still forge a result by introspection; the
// expected outputs never enter the sandbox.
// Both kinds run with APPS's preamble of imports already done (sys, math, itertools,
// collections names, heapq, typing.List/Tuple, ... and numpy as np, imported on first
// use), as APPS's harness prepends it.
//
// The interpreter is limits->python, else $MARLHF_PYTHON, else /usr/bin/python3, run as
// `python3 -I -B`: -I ignores the environment's PYTHON* variables, the user's site
// folder and the script's folder; -B writes no .pyc. -S is not used: without the site
// module, exit() and quit() (common in competitive code) do not exist and
// dist-packages are not importable. The interpreter must be readable by the sandbox's
// user (nobody when marlhf runs as root), so not a pyenv shim under /root.
#pragma once
#include <stdbool.h>

typedef struct {
    double timeout_seconds;  // per test (and for the compile step); default 4
    long memory_mb;          // address-space limit per process; default 512
    long max_output_bytes;   // stdout per test; default 1 MiB
    int max_tests;           // the first N tests are run; default 20
    const char *python;      // NULL: $MARLHF_PYTHON, else /usr/bin/python3
} CodeRewardLimits;

CodeRewardLimits code_reward_default_limits(void);

typedef enum {
    CODE_STATUS_COMPILE_ERROR,
    CODE_STATUS_RUNTIME_ERROR,
    CODE_STATUS_RAN,  // every test ran to its end (passed or not)
} CodeStatus;

typedef struct {
    double reward;
    CodeStatus status;
    int passed;           // tests passed (before the runtime error, if any)
    int total;            // tests considered: min(tests in input_output, max_tests)
    int failed_test;      // 0-based test of the runtime error, or of the first wrong answer; -1
    double seconds;       // wall time of the whole evaluation
    char reason[256];     // one line: "passed 3 of 4 tests", "test 2/4: ZeroDivisionError: ..."
} CodeRewardResult;

// Scores `program` (Python source) on `input_output_json` (APPS's JSON text). Returns 0
// with *out filled; -1 with err_set when the input_output JSON is malformed (naming what
// is wrong) or the sandbox cannot run (then there is no reward to give).
int code_reward(const char *program, const char *input_output_json, const CodeRewardLimits *limits,
                CodeRewardResult *out);

// The code in a model's response: the content of the first ```python (or ```py,
// ```python3) fenced block; else of the first bare ``` block; else the whole text. An
// unclosed block runs to the end of the text (a response cut by max length). xmalloc'd.
char *code_from_response(const char *response);

const char *code_status_name(CodeStatus status);
