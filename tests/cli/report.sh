#!/usr/bin/env bash
# marlhf report: two short PPO runs (token-level and MA-PPO) and an SFT run in one page;
# the page renders in headless Chromium with every plot drawn; text from the data is
# escaped; bad run folders are one-line errors. Prints PASS/FAIL per case.
set -u
cd "$(dirname "$0")/../.."
bin=${MARLHF_BIN:-build/marlhf}
tmp=${MARLHF_TEST_TMP:-/tmp}/cli_report
rm -rf "$tmp" && mkdir -p "$tmp"
case "$tmp" in /*) ;; *) tmp=$PWD/$tmp ;; esac
model=tests/fixtures/models/tiny_chat
data=tests/fixtures/train
failures=0
. tests/cli_helpers.sh

# Eval prompts with markup in them: the page must show it as text.
{ echo '{"prompt": "Tell me about <b>bold</b> & the cat."}'; head -n 3 "$data/sft_eval.jsonl"; } > "$tmp/eval.jsonl"
"$bin" sft --model "$model" --data "$data/sft.jsonl" --eval-data "$data/sft_eval.jsonl" --max-seq-len 32 \
    --max-steps 4 --eval-every 2 --output "$tmp/sft" --quiet --threads 2 2> /dev/null
"$bin" rm --model "$model" --data "$data/pairs.jsonl" --max-seq-len 32 --per-device-train-batch-size 8 \
    --learning-rate 3e-3 --max-steps 4 --output "$tmp/rm" --quiet --threads 2 2> /dev/null
for run in "token 1" "fixed 5"; do
    set -- $run
    "$bin" ppo --actor-model "$model" --reward-model "$tmp/rm/final" --prompts "$data/sft.jsonl" \
        --eval-prompts "$tmp/eval.jsonl" --eval-every 1 --rollout-batch-size 8 --generation-batch-size 8 \
        --micro-batch-size 4 --max-new-tokens 8 --max-iterations 3 --min-response-tokens 1 --quiet --threads 2 \
        --termination-condition fixed --ngram "$2" --output "$tmp/ppo-$1" 2> /dev/null
done

"$bin" report "$tmp/ppo-token" "$tmp/ppo-fixed" "$tmp/sft" --output "$tmp/report.html" 2> "$tmp/report.err"
rc=$?
[ $rc -eq 0 ] && [ -s "$tmp/report.html" ] && pass report_written || fail report_written "exit $rc: $(cat "$tmp/report.err")"
grep -q '&lt;b&gt;bold&lt;/b&gt; &amp; the cat' "$tmp/report.html" && ! grep -q '<b>bold</b>' "$tmp/report.html" &&
    pass report_escapes_text || fail report_escapes_text "markup from the data reached the page"
for key in eval/score eval/win_rate train/kl train/value_loss train/time_generation eval/loss; do
    grep -q "<title>$key</title>" "$tmp/report.html" && pass "report_plots_$key" || fail "report_plots_$key" missing
done

# Headless Chromium lays the page out; its script counts the plots whose lines have a size.
if command -v chromium > /dev/null; then
    timeout 60 chromium --headless --no-sandbox --disable-gpu --dump-dom "file://$tmp/report.html" \
        > "$tmp/dom.html" 2> /dev/null
    plots=$(grep -o 'data-plots="[0-9]*"' "$tmp/dom.html" | grep -o '[0-9]*')
    rendered=$(grep -o 'data-plots-rendered="[0-9]*"' "$tmp/dom.html" | grep -o '[0-9]*')
    [ -n "$plots" ] && [ "$plots" -ge 20 ] && [ "$rendered" = "$plots" ] && pass "report_renders_in_chromium ($rendered plots)" ||
        fail report_renders_in_chromium "plots=${plots:-none} rendered=${rendered:-none}"
else
    fail report_renders_in_chromium "chromium is not installed (scripts/setup installs it)"
fi

# The default output is FIRST_RUN/report.html.
"$bin" report "$tmp/ppo-token" 2> /dev/null && [ -s "$tmp/ppo-token/report.html" ] && pass report_default_output ||
    fail report_default_output "no $tmp/ppo-token/report.html"

expect_error report_no_folder "$tmp/none" "$bin" report "$tmp/none"
mkdir -p "$tmp/empty"
expect_error report_not_a_run "metrics.jsonl" "$bin" report "$tmp/empty"
mkdir -p "$tmp/broken" && printf '{"step": 0, "eval/score": 1}\n{"step": \n' > "$tmp/broken/metrics.jsonl"
expect_error report_malformed_metrics "metrics.jsonl:2" "$bin" report "$tmp/broken"
expect_error report_no_arguments "run folders" "$bin" report
exit $((failures > 0))
