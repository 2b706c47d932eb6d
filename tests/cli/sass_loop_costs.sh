#!/usr/bin/env bash
# tools/sass_loop_costs.py (what a kernel's loops cost, read from cuobjdump's SASS) on a
# made-up function whose control codes were written by hand (tests/fixtures/sass/
# toy_loop.sass): the loop's range, instruction count, stall sum (4 + 6 + 6 + 1 + 5),
# scoreboard waits and instruction counts; and its one-line errors (exit 2): no such
# function, no such file, a range that is not hex, an unknown option, a bad number.
set -u
cd "$(dirname "$0")/../.."
tmp=${MARLHF_TEST_TMP:-/tmp}/cli_sass_loop_costs
rm -rf "$tmp" && mkdir -p "$tmp"
failures=0
. tests/cli_helpers.sh
fixture=tests/fixtures/sass/toy_loop.sass
want="  0x0010-0x0050: 5 instructions, 22 stall cycles, 2 scoreboard waits; HMMA 2 MUFU 1 LDSM 1"
got=$(python3 tools/sass_loop_costs.py "$fixture" --min-bytes 16 --kernel toy 2>&1 | sed -n 2p)
[ "$got" = "$want" ] && pass sass_loop_costs_loop || fail sass_loop_costs_loop "got '$got'"
# A range given by address, with each instruction listed (stall, waits).
python3 tools/sass_loop_costs.py "$fixture" --range 0x20 0x30 --list > "$tmp/range.txt" 2>&1
grep -q '0x0020-0x0030: 2 instructions, 12 stall cycles, 1 scoreboard waits; HMMA 2' "$tmp/range.txt" &&
    grep -q '    0x0020  6 W01 HMMA.16816.F32.BF16 R8, R4, R6, R8' "$tmp/range.txt" &&
    pass sass_loop_costs_range || fail sass_loop_costs_range "$(head -n 4 "$tmp/range.txt")"
# Loops shorter than --min-bytes (the default 0x400) are left out.
[ "$(python3 tools/sass_loop_costs.py "$fixture" | wc -l)" -eq 1 ] && pass sass_loop_costs_min_bytes ||
    fail sass_loop_costs_min_bytes "a 0x40-byte loop was reported under the default --min-bytes"
for case in "no_kernel:--kernel nothing:matches --kernel 'nothing'" "missing:$tmp/none.sass:cannot read" \
    "bad_range:--range 0x10 zz:'zz' is not a hex address" "bad_option:--loops:unrecognized arguments: --loops" \
    "bad_min_bytes:--min-bytes many:invalid int value"; do
    name=${case%%:*} rest=${case#*:} arguments=${rest%%:*} expected=${rest#*:}
    if [ "$name" = missing ]; then set -- "$arguments"; else set -- "$fixture" $arguments; fi
    python3 tools/sass_loop_costs.py "$@" > "$tmp/out" 2> "$tmp/err"
    rc=$?
    if [ "$rc" -eq 2 ] && [ "$(wc -l < "$tmp/err")" -eq 1 ] && grep -qF "$expected" "$tmp/err"; then
        pass "sass_loop_costs_$name"
    else
        fail "sass_loop_costs_$name" "exit $rc: $(head -n 2 "$tmp/err")"
    fi
done
[ "$failures" -eq 0 ]
