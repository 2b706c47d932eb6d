#!/usr/bin/env bash
# tools/reproduction_summary: a synthetic study (2 methods x 2 seeds, numbers chosen so that
# every mean, sd and crossing is known exactly) gives the expected summary.md and summary.tsv
# rows and four standalone SVG figures with one band and one line per method; bad input is a
# one-line error naming the file or option. Prints PASS/FAIL per case.
set -u
cd "$(dirname "$0")/../.."
bin=${MARLHF_BIN:-build/marlhf}
tool=$(dirname "$bin")/tools/reproduction_summary
tmp=${MARLHF_TEST_TMP:-/tmp}/cli_reproduction_summary
rm -rf "$tmp" && mkdir -p "$tmp"
case "$tmp" in /*) ;; *) tmp=$PWD/$tmp ;; esac
failures=0
. tests/cli_helpers.sh
if [ ! -x "$tool" ]; then
    fail reproduction_summary_built "no $tool (make $tool)"
    exit 1
fi

# write_run DIR "TRAIN_SCORES" "KLS" "STEP:SCORE:GOLD:LENGTH ..." MACRO_LENGTH: metrics.jsonl as
# `marlhf ppo` writes it, train/score and train/kl of iterations 1, 2, ..., an eval line after
# the train line of the same step.
write_run() {
    local dir=$1 train=($2) kl=($3) evals=($4) macro=$5 i e
    mkdir -p "$dir"
    for ((i = 0; i <= ${#train[@]}; i++)); do
        [ "$i" -gt 0 ] && echo "{\"step\":$i,\"time\":$i.5,\"train/score\":${train[i - 1]},\"train/raw_score\":0.1,\"train/kl\":${kl[i - 1]},\"train/response_length\":30.0,\"train/macro_action_length\":$macro}"
        for e in "${evals[@]}"; do
            IFS=: read -r step score gold length <<< "$e"
            [ "$step" = "$i" ] && echo "{\"step\":$i,\"time\":$i.9,\"eval/score\":$score,\"eval/gold\":$gold,\"eval/response_length\":$length}"
        done
    done > "$dir/metrics.jsonl"
}
# Window 2. Baseline "base": final training scores 2.5 and 1 (target 1.75), reached at
# iterations 5 and 4; last held-out scores 1.5 and 2 (target 1.75), seed1 never reaches it.
# "ma": reaches 1.75 at iterations 2 and 3 (median 2.5). Mean curves (moving averages averaged
# over seeds) reach 1.75 at iteration 4 (base: 0.25, 1, 1.75) and 3 (ma: 1.5, 2.5): speed-up 4 / 3.
runs=$tmp/runs
write_run "$runs/base/seed1" "0 1 1 2 2 3" "0 0.5 0.5 1 1 1" "0:0.5:0.25:32 3:1.0:0.5:31 6:1.5:0.75:30" 1
write_run "$runs/base/seed2" "0 0 2 2 1 1" "0 0.25 0.25 0.5 0.5 0.5" "0:0.5:0.25:32 3:1.25:0.5:33 6:2.0:1.0:34" 1
write_run "$runs/ma/seed1" "1 3 3 3 3 3" "0 0 0 0.25 0.25 0.25" "0:0.75:0.125:25 3:1.75:0.5:22 6:2.5:1.25:20" 3
write_run "$runs/ma/seed2" "0 2 2 2 2 2" "0 0 0 0.5 0.5 0.5" "0:0.25:0.375:25 3:1.0:0.25:23 6:2.25:0.5:22" 4
mkdir -p "$runs/ma/seed3" "$runs/ma/notes" # no metrics.jsonl / not a seed: both ignored
cp "$runs/ma/seed1/metrics.jsonl" "$runs/ma/notes/metrics.jsonl"

methods="base=Vanilla PPO, ma=MA-PPO n3"
out=$tmp/out/nested
"$tool" --runs "$runs" --methods "$methods" --baseline base --out-dir "$out" --window 2 > "$tmp/stdout" 2> "$tmp/stderr"
rc=$?
[ $rc -eq 0 ] && pass summary_runs || fail summary_runs "exit $rc: $(cat "$tmp/stderr")"

# check_line NAME FILE EXPECTED: FILE has the line EXPECTED exactly.
check_line() {
    if grep -qxF -- "$3" "$2"; then
        pass "$1"
    else
        fail "$1" "no line '$3' in $2; it has:"
        sed 's/^/    /' "$2" | head -n 8
    fi
}
md=$out/summary.md
check_line summary_md_header "$md" "| method | seeds | held-out RM score | held-out gold score | KL | held-out response length | iterations to reach Vanilla PPO's final training score | speed-up vs Vanilla PPO | first eval step with RM score ≥ Vanilla PPO's final held-out score |"
check_line summary_md_baseline_row "$md" "| Vanilla PPO | 2 | 1.750 ± 0.354 [1.500, 2.000] | 0.875 ± 0.177 [0.750, 1.000] | 0.750 ± 0.354 | 32.000 | 5, 4 (median 4.5; mean curve 4) | 1.000 | —, 6 |"
check_line summary_md_method_row "$md" "| MA-PPO n3 | 2 | 2.375 ± 0.177 [2.500, 2.250] | 0.875 ± 0.530 [1.250, 0.500] | 0.375 ± 0.177 | 21.000 | 2, 3 (median 2.5; mean curve 3) | 1.333 | 3, 6 |"
for text in "final training score, 1.750, is the mean over Vanilla PPO's seeds" "first iteration i ≥ 2 at which" \
    "over iterations i−1..i is ≥ 1.750" "final held-out score, 1.750, is the mean" "last evaluation (step 6)" \
    "Initial (step 0) held-out RM score 0.500 and gold score 0.250: the mean over all 4 runs."; do
    grep -qF -- "$text" "$md" && pass "summary_md_text: $text" || fail "summary_md_text" "no '$text' in $md"
done
# What the runs did: macro-action length, training response length, the last logged time.
check_line summary_md_runs_header "$md" "| method | macro-action length (tokens) | training response length (tokens) | run time (s) |"
check_line summary_md_runs_baseline "$md" "| Vanilla PPO | 1.000 ± 0.000 | 30.000 ± 0.000 | 6.900 ± 0.000 |"
check_line summary_md_runs_method "$md" "| MA-PPO n3 | 3.500 ± 0.707 | 30.000 ± 0.000 | 6.900 ± 0.000 |"
cmp -s "$md" "$tmp/stdout" && pass summary_md_printed || fail summary_md_printed "stdout is not summary.md"

tsv=$out/summary.tsv
t=$'\t'
check_line summary_tsv_header "$tsv" "method${t}label${t}seeds${t}seed_names${t}last_eval_step${t}heldout_score_mean${t}heldout_score_sd${t}heldout_score_per_seed${t}heldout_gold_mean${t}heldout_gold_sd${t}heldout_gold_per_seed${t}kl_mean${t}kl_sd${t}heldout_response_length_mean${t}final_train_score_per_seed${t}iterations_to_reach_per_seed${t}iterations_to_reach_median${t}iterations_to_reach_mean_curve${t}speedup${t}first_eval_step_reaching_per_seed${t}macro_action_length_mean${t}train_response_length_mean${t}run_time_mean"
check_line summary_tsv_baseline_row "$tsv" "base${t}Vanilla PPO${t}2${t}seed1,seed2${t}6${t}1.75${t}0.353553${t}1.5,2${t}0.875${t}0.176777${t}0.75,1${t}0.75${t}0.353553${t}32${t}2.5,1${t}5,4${t}4.5${t}4${t}1${t}inf,6${t}1${t}30${t}6.9"
check_line summary_tsv_method_row "$tsv" "ma${t}MA-PPO n3${t}2${t}seed1,seed2${t}6${t}2.375${t}0.176777${t}2.5,2.25${t}0.875${t}0.53033${t}1.25,0.5${t}0.375${t}0.176777${t}21${t}3,2${t}2,3${t}2.5${t}3${t}1.33333${t}3,6${t}3.5${t}30${t}6.9"
[ "$(wc -l < "$tsv")" -eq 3 ] && pass summary_tsv_rows || fail summary_tsv_rows "$(wc -l < "$tsv") lines"

# Each figure: well-formed standalone SVG; per method one band polygon (2 points per x) and
# one line, in the same colour.
for figure in heldout_score:3 heldout_gold:3 train_score:5 kl:6; do
    name=${figure%:*} points=${figure#*:}
    python3 - "$out/$name.svg" "$points" <<'PY' && pass "figure_$name" || fail "figure_$name" "see above"
import sys, xml.dom.minidom
path, points = sys.argv[1], int(sys.argv[2])
try:
    svg = xml.dom.minidom.parse(path).documentElement
except Exception as e:
    sys.exit(print(f"    not well-formed XML: {e}") or 1)
ok = svg.tagName == "svg" and svg.getAttribute("xmlns") == "http://www.w3.org/2000/svg"
bands = [p for p in svg.getElementsByTagName("polygon") if p.getAttribute("class") == "band"]
lines = [p for p in svg.getElementsByTagName("polyline") if p.getAttribute("class") == "series"]
ok = ok and len(bands) == 2 and len(lines) == 2
ok = ok and all(len(b.getAttribute("points").split()) == 2 * points for b in bands)
ok = ok and all(len(l.getAttribute("points").split()) == points for l in lines)
ok = ok and [b.getAttribute("fill") for b in bands] == [l.getAttribute("stroke") for l in lines]
ok = ok and len(svg.getElementsByTagName("style")) == 1
legend = [t.firstChild.data for t in svg.getElementsByTagName("text") if t.getAttribute("class") == "legend"]
ok = ok and legend == ["Vanilla PPO", "MA-PPO n3"]
if not ok:
    print(f"    {path}: {len(bands)} bands, {len(lines)} lines, legend {legend}")
sys.exit(0 if ok else 1)
PY
done

# The band is the min-max across seeds: with two seeds the baseline's mean line runs midway
# between its edges, which meet at step 0 (both seeds 0.5) and are apart at step 6 (1.5, 2.0).
python3 - "$out/heldout_score.svg" <<'PY' && pass figure_band_is_min_max || fail figure_band_is_min_max "band edges"
import sys, xml.dom.minidom
svg = xml.dom.minidom.parse(sys.argv[1]).documentElement
band = [p for p in svg.getElementsByTagName("polygon") if p.getAttribute("class") == "band"][0]
pts = [tuple(map(float, p.split(","))) for p in band.getAttribute("points").split()]
line = [p for p in svg.getElementsByTagName("polyline") if p.getAttribute("class") == "series"][0]
mean = [tuple(map(float, p.split(","))) for p in line.getAttribute("points").split()]
# upper edge left to right (max: 0.5, 1.25, 2.0), lower edge right to left (min: 1.5, 1.0, 0.5)
upper, lower = pts[:3], pts[3:][::-1]
# pixel y is linear in the value: the mean (0.5, 1.125, 1.75) lies halfway between min and max
ok = all(abs((u[1] + l[1]) / 2 - m[1]) <= 0.1 for u, l, m in zip(upper, lower, mean))
ok = ok and upper[0][1] == lower[0][1] and upper[2][1] < lower[2][1]
sys.exit(0 if ok else 1)
PY

# The same study against "ma": the targets are 2.5 (training) and 2.375 (held-out); base
# seed2 and ma seed2 never reach them, so both medians are —; ma's mean curve (1.5, 2.5) reaches
# 2.5 at iteration 3 (speed-up 1), base's never does (speed-up —).
"$tool" --runs "$runs" --methods "$methods" --baseline ma --out-dir "$tmp/out2" --window=2 > /dev/null 2>&1
check_line summary_never_reached_baseline "$tmp/out2/summary.md" "| Vanilla PPO | 2 | 1.750 ± 0.354 [1.500, 2.000] | 0.875 ± 0.177 [0.750, 1.000] | 0.750 ± 0.354 | 32.000 | 6, — (median —; mean curve —) | — | —, — |"
check_line summary_never_reached_method "$tmp/out2/summary.md" "| MA-PPO n3 | 2 | 2.375 ± 0.177 [2.500, 2.250] | 0.875 ± 0.530 [1.250, 0.500] | 0.375 ± 0.177 | 21.000 | 3, — (median —; mean curve 3) | 1.000 | 6, — |"
check_line summary_never_reached_tsv "$tmp/out2/summary.tsv" "base${t}Vanilla PPO${t}2${t}seed1,seed2${t}6${t}1.75${t}0.353553${t}1.5,2${t}0.875${t}0.176777${t}0.75,1${t}0.75${t}0.353553${t}32${t}2.5,1${t}6,inf${t}inf${t}inf${t}nan${t}inf,inf${t}1${t}30${t}6.9"

"$tool" --help > "$tmp/help" 2>&1 && grep -q -- "--baseline DIR" "$tmp/help" && pass summary_help || fail summary_help "no usage"

# Bad input: one line naming the option or the file, exit 2.
args=(--runs "$runs" --methods "$methods" --baseline base --out-dir "$tmp/bad-out")
expect_error summary_missing_runs "missing required option --runs" "$tool" "${args[@]:2}"
expect_error summary_missing_methods "missing required option --methods" "$tool" "${args[@]:0:2}" "${args[@]:4}"
expect_error summary_missing_baseline "missing required option --baseline" "$tool" "${args[@]:0:4}" "${args[@]:6}"
expect_error summary_missing_out_dir "missing required option --out-dir" "$tool" "${args[@]:0:6}"
expect_error summary_unknown_option "unknown option --seeds" "$tool" "${args[@]}" --seeds 3
expect_error summary_bad_window "option --window" "$tool" "${args[@]}" --window 0
expect_error summary_window_too_long "fewer than --window 7 ($runs/base/seed1/metrics.jsonl)" "$tool" "${args[@]}" --window 7
expect_error summary_bad_methods "option --methods: 'ma' is not DIR=LABEL" "$tool" "${args[@]:0:2}" --methods "base=A,ma" "${args[@]:4}"
expect_error summary_baseline_not_listed "option --baseline: 'ppo'" "$tool" "${args[@]:0:4}" --baseline ppo "${args[@]:6}"
expect_error summary_no_seeds "no seed*/metrics.jsonl in $runs/fixed3" "$tool" "${args[@]:0:2}" \
    --methods "base=A,fixed3=B" "${args[@]:4}"
bad=$tmp/bad && cp -r "$runs" "$bad"
sed -i '3s/.*/{"step": 2, "train\/score": /' "$bad/ma/seed2/metrics.jsonl"
expect_error summary_malformed_line "$bad/ma/seed2/metrics.jsonl:3" "$tool" --runs "$bad" "${args[@]:2}"
cp "$runs/ma/seed2/metrics.jsonl" "$bad/ma/seed2/metrics.jsonl"
sed -i '3s/.*/{"train\/score": 1}/' "$bad/ma/seed2/metrics.jsonl"
expect_error summary_line_without_step "$bad/ma/seed2/metrics.jsonl:3" "$tool" --runs "$bad" "${args[@]:2}"
grep -v '"step":6,.*eval' "$runs/ma/seed2/metrics.jsonl" > "$bad/ma/seed2/metrics.jsonl"
expect_error summary_different_last_eval \
    "runs of method 'ma' end at different evaluation steps: $bad/ma/seed1/metrics.jsonl at step 6, $bad/ma/seed2/metrics.jsonl at step 3" \
    "$tool" --runs "$bad" "${args[@]:2}"
[ ! -e "$tmp/bad-out" ] && pass summary_no_output_on_error || fail summary_no_output_on_error "$tmp/bad-out written"
exit $((failures > 0))
