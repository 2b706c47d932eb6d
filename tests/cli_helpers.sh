# Shared by the scripts in tests/cli/ (sourced after `failures=0` and `tmp=...` are set):
# PASS/FAIL lines for tests/run.sh, and the bad-input check every command must pass.
pass() { echo "PASS $1"; }
fail() { echo "FAIL $1: $2"; failures=$((failures + 1)); }

# expect_error NAME EXPECTED_SUBSTRING COMMAND...: the command must exit 2 and print exactly
# one line on stderr, "marlhf: error: ...", containing EXPECTED_SUBSTRING.
expect_error() {
    local name=$1 expected=$2
    shift 2
    "$@" > "$tmp/stdout" 2> "$tmp/stderr"
    local rc=$? lines
    lines=$(wc -l < "$tmp/stderr")
    if [ "$rc" -eq 2 ] && [ "$lines" -eq 1 ] && grep -q '^marlhf: error: ' "$tmp/stderr" &&
        grep -qF -- "$expected" "$tmp/stderr"; then
        echo "PASS $name"
    else
        echo "FAIL $name (exit $rc, $lines stderr lines, wanted '$expected'):"
        sed 's/^/    /' "$tmp/stderr" | head -n 5
        failures=$((failures + 1))
    fi
}
