#!/usr/bin/env bash
# Runs every test binary in $BUILD/tests (default build/) and the shell tests in
# tests/cli/, then prints "N passed, N failed". Exits non-zero if anything failed.
#
# MARLHF_TEST_JOBS programs run at once (default 2, or 1 on a one-core machine; 1 runs
# them one after another). Most programs leave a core idle much of the time (process
# start-up, model loading, servers waiting for clients, Python checks), so on CI's two
# cores two at a time finish the suite sooner. With more than one, each program's OpenMP /
# OpenBLAS threads are capped at cores / jobs (at least 1) and OpenMP waits passively:
# programs that each spin one thread per core on the same cores run many times slower than
# one after another (measured: lora.sh 33 -> 351 s). Commands a test runs with an explicit
# --threads keep their threads, so the multi-threaded paths are still exercised there.
# Each program gets a directory of its own under tests/tmp/$BUILD/, so programs running
# together never share a file, and each one's report is printed whole when it ends (the
# blocks come in the order they end).
#
# Programs start longest first, by the seconds tests/durations records for this build (plain
# or sanitized): a long program started last would leave the other slots idle at the end
# (a minute or more of each pass before). Programs it does not list start first. Each run
# writes what it measured to tests/tmp/$BUILD/durations, in the same form (lines of
# "program build seconds"); to refresh the file after a full `make test` and
# `make test SANITIZE=1`:
#   cat tests/tmp/build/durations tests/tmp/build-asan/durations | sort > tests/durations
set -u
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
export MARLHF_BIN="$BUILD/marlhf"
# Gradients start as NaN at each model_zero_grad (model/model.h): an op that adds into a
# gradient tensor nothing wrote, or a reader that skips model_settle_gradients, fails loudly.
export MARLHF_CHECK_GRADIENT_WRITES=1
# A stored product input (ops.h, hold_stored) is moved aside for its products and its
# buffer filled with NaN (ops/cpu/stored_inputs.c): any other reader of it fails loudly.
export MARLHF_CHECK_STORED_INPUTS=1
tmp_root="tests/tmp/$BUILD"
rm -rf "$tmp_root" && mkdir -p "$tmp_root/reports"
build_kind=plain
nm "$MARLHF_BIN" 2> /dev/null | grep -q '__asan_init' && build_kind=sanitized
cores=$(nproc 2> /dev/null || echo 1)
jobs=${MARLHF_TEST_JOBS:-$((cores >= 2 ? 2 : 1))}
case "$jobs" in
    ''|*[!0-9]*|0) echo "tests/run.sh: MARLHF_TEST_JOBS must be a positive integer, not '$jobs'" >&2; exit 2 ;;
esac
if [ "$jobs" -gt 1 ]; then
    threads=$((cores / jobs))
    [ "$threads" -lt 1 ] && threads=1
    export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$threads}
    export OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-$threads}
    export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
    echo "running $jobs test programs at a time, $OMP_NUM_THREADS thread(s) each"
fi

# run_one KIND PATH: runs one test program in its own directory and writes its report
# (the PASS/FAIL/SKIP lines, the tail of a failure, its wall time) to reports/NAME.
run_one() {
    local kind=$1 path=$2
    local name started rc
    name=$(basename "$path")
    export MARLHF_TEST_TMP="$tmp_root/$name"
    mkdir -p "$MARLHF_TEST_TMP"
    local out="$MARLHF_TEST_TMP/$name.out" report="$tmp_root/reports/$name"
    started=$SECONDS
    {
        echo "== $name"
        if [ "$kind" = binary ]; then
            "$path" > "$out" 2> "$MARLHF_TEST_TMP/$name.err"
            rc=$?
            grep -E '^(PASS|FAIL|SKIP) ' "$out"
            [ -s "$MARLHF_TEST_TMP/$name.err" ] && grep -E '^  ' "$MARLHF_TEST_TMP/$name.err" | head -n 20
            [ "$rc" -ne 0 ] && tail -n 5 "$MARLHF_TEST_TMP/$name.err"
        else
            bash "$path" > "$out" 2>&1
            rc=$?
            grep -E '^(PASS|FAIL|SKIP) ' "$out"
            [ "$rc" -ne 0 ] && tail -n 5 "$out"
        fi
        # A crash, or a non-zero exit with no FAIL line, is one more failure.
        if [ "$rc" -ne 0 ] && ! grep -q '^FAIL ' "$out"; then
            echo "FAIL $name (exit status $rc)"
        fi
        echo "   $((SECONDS - started)) s"
    } > "$report.tmp"
    echo "$name $build_kind $((SECONDS - started))" > "$MARLHF_TEST_TMP/duration"
    mv "$report.tmp" "$report"
}

# print_finished: prints the reports of the programs that have ended since the last call.
print_finished() {
    local report
    for report in "$tmp_root"/reports/*; do
        case "$report" in *.tmp|*.done|*/'*') continue ;; esac
        cat "$report" && mv "$report" "$report.done"
    done
}

# Every program with its recorded seconds for this build (1e9 where tests/durations has
# none), longest first.
declare -A recorded=()
if [ -f tests/durations ]; then
    while read -r name build seconds; do
        [ "$build" = "$build_kind" ] && recorded[$name]=$seconds
    done < tests/durations
fi
programs=()
while read -r _ kind path; do
    programs+=("$kind $path")
done < <(
    {
        for script in tests/cli/*.sh; do echo "${recorded[$(basename "$script")]:-1000000000} script $script"; done
        for bin in "$BUILD"/tests/test_*; do
            [ -x "$bin" ] || continue
            case "$bin" in *.o|*.d) continue ;; esac
            echo "${recorded[$(basename "$bin")]:-1000000000} binary $bin"
        done
    } | sort -k1,1nr -k3,3
)


running=0
for entry in "${programs[@]}"; do
    if [ "$running" -ge "$jobs" ]; then
        wait -n
        running=$((running - 1))
    fi
    run_one $entry &
    running=$((running + 1))
    print_finished
done
wait
print_finished
cat "$tmp_root"/*/duration 2> /dev/null | sort > "$tmp_root/durations"

passed=0
failed=0
skipped=0 # a test that cannot run on this machine says SKIP and why (not counted as passed)
for report in "$tmp_root"/reports/*.done; do
    [ -f "$report" ] || continue
    passed=$((passed + $(grep -c '^PASS ' "$report")))
    failed=$((failed + $(grep -c '^FAIL ' "$report")))
    skipped=$((skipped + $(grep -c '^SKIP ' "$report")))
done
# A program that left no report (its runner was killed) counts as a failure.
for entry in "${programs[@]}"; do
    name=$(basename "${entry#* }")
    if [ ! -f "$tmp_root/reports/$name.done" ]; then
        echo "FAIL $name (no report: its runner did not finish)"
        failed=$((failed + 1))
    fi
done
[ "$skipped" -gt 0 ] && echo "$skipped skipped (see the SKIP lines above)"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
