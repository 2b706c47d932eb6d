#!/usr/bin/env bash
# Runs every test binary in $BUILD/tests (default build/) and the shell tests in
# tests/cli/, then prints "N passed, N failed". Exits non-zero if anything failed.
set -u
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
export MARLHF_BIN="$BUILD/marlhf"
export MARLHF_TEST_TMP="tests/tmp/$BUILD"
rm -rf "$MARLHF_TEST_TMP" && mkdir -p "$MARLHF_TEST_TMP"
passed=0
failed=0
skipped=0 # a test that cannot run on this machine says SKIP and why (not counted as passed)
count() {  # count PASS/FAIL lines of one program's output (a crash is one more failure); print its wall time
    local name=$1 out=$2 rc=$3
    local p f
    p=$(grep -c '^PASS ' "$out")
    f=$(grep -c '^FAIL ' "$out")
    if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then
        echo "FAIL $name (exit status $rc)"
        f=1
    fi
    passed=$((passed + p))
    failed=$((failed + f))
    echo "   $((SECONDS - started)) s"
}
for bin in "$BUILD"/tests/test_*; do
    [ -x "$bin" ] || continue
    case "$bin" in *.o|*.d) continue ;; esac
    name=$(basename "$bin")
    echo "== $name"
    out="$MARLHF_TEST_TMP/$name.out"
    started=$SECONDS
    "$bin" > "$out" 2> "$MARLHF_TEST_TMP/$name.err"
    rc=$?
    grep -E '^(PASS|FAIL) ' "$out"
    [ -s "$MARLHF_TEST_TMP/$name.err" ] && grep -E '^  ' "$MARLHF_TEST_TMP/$name.err" | head -n 20
    [ "$rc" -ne 0 ] && tail -n 5 "$MARLHF_TEST_TMP/$name.err"
    count "$name" "$out" "$rc"
done
for script in tests/cli/*.sh; do
    [ -f "$script" ] || continue
    name=$(basename "$script")
    echo "== $name"
    out="$MARLHF_TEST_TMP/$name.out"
    started=$SECONDS
    bash "$script" > "$out" 2>&1
    rc=$?
    grep -E '^(PASS|FAIL|SKIP) ' "$out"
    skipped=$((skipped + $(grep -c '^SKIP ' "$out")))
    [ "$rc" -ne 0 ] && tail -n 5 "$out"
    count "$name" "$out" "$rc"
done
[ "$skipped" -gt 0 ] && echo "$skipped skipped (see the SKIP lines above)"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
