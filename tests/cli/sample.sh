#!/usr/bin/env bash
# marlhf sample: TL;DR rows stratified by subreddit (at most --per-group each, then topped
# up), the same instances for two models' results with the same prompts, uniform choice
# for other datasets, and bad input. Prints PASS/FAIL per case.
set -u
cd "$(dirname "$0")/../.."
bin=${MARLHF_BIN:-build/marlhf}
tmp=${MARLHF_TEST_TMP:-/tmp}/cli_sample
rm -rf "$tmp" && mkdir -p "$tmp"
failures=0
. tests/cli_helpers.sh

# Two models' results on the same 200 prompts: 12 subreddits of uneven size and articles.
python3 - "$tmp" <<'PY'
import json, sys
subs = ["relationships"] * 60 + ["AskReddit"] * 40 + ["tifu"] * 30 + ["dogs", "cats", "books", "movies", "running",
        "cooking", "travel", "jobs", "math"] * 6 + ["ARTICLE"] * 16
for model in ("a", "b"):
    with open(f"{sys.argv[1]}/{model}.jsonl", "w") as f:
        for i, s in enumerate(subs):
            prompt = ("ARTICLE\n" if s == "ARTICLE" else f"POST\nSubreddit: r/{s}\n") + f"TITLE: post {i}\nTL;DR:"
            f.write(json.dumps({"prompt": prompt, "response": f"{model} {i}", "reward": i * 0.1}) + "\n")
PY
"$bin" sample "$tmp/a.jsonl" --dataset tldr --output "$tmp/sa.jsonl" 2> /dev/null
"$bin" sample "$tmp/b.jsonl" --dataset tldr --output "$tmp/sb.jsonl" 2> /dev/null
python3 - "$tmp/sa.jsonl" "$tmp/sb.jsonl" <<'PY' && pass sample_tldr_stratified || fail sample_tldr_stratified "bad choice"
import collections, json, sys
a, b = ([json.loads(l) for l in open(p)] for p in sys.argv[1:3])
def group(p): return "ARTICLE" if p.startswith("ARTICLE") else p.split("Subreddit: r/")[1].split()[0]
counts = collections.Counter(group(r["prompt"]) for r in a)
ok = len(a) == 50 and len({r["index"] for r in a}) == 50           # 50 distinct rows
ok = ok and len(counts) == 13                                       # every group represented
ok = ok and [r["index"] for r in a] == [r["index"] for r in b]      # same instances for both models
ok = ok and all(r["prompt"] == s["prompt"] for r, s in zip(a, b))
sys.exit(0 if ok else 1)
PY

"$bin" sample "$tmp/a.jsonl" --dataset tldr --output "$tmp/sa2.jsonl" 2> /dev/null
cmp -s "$tmp/sa.jsonl" "$tmp/sa2.jsonl" && pass sample_reproducible || fail sample_reproducible "differs"
"$bin" sample "$tmp/a.jsonl" --dataset tldr --seed 7 --output "$tmp/sa3.jsonl" 2> /dev/null
cmp -s "$tmp/sa.jsonl" "$tmp/sa3.jsonl" && fail sample_seed_matters "same with another seed" || pass sample_seed_matters
"$bin" sample "$tmp/a.jsonl" --dataset hh --count 20 --output "$tmp/hh.jsonl" 2> /dev/null
[ "$(wc -l < "$tmp/hh.jsonl")" = 20 ] && pass sample_uniform_count || fail sample_uniform_count "$(wc -l < "$tmp/hh.jsonl") rows"
head -n 7 "$tmp/a.jsonl" > "$tmp/small.jsonl"
"$bin" sample "$tmp/small.jsonl" --output "$tmp/small_out.jsonl" 2> /dev/null
[ "$(wc -l < "$tmp/small_out.jsonl")" = 7 ] && pass sample_fewer_rows_than_count || fail sample_fewer_rows_than_count "wrong"

expect_error sample_existing_output "--overwrite" "$bin" sample "$tmp/a.jsonl" --output "$tmp/sa.jsonl"
printf '{"prompt": "x"}\n{"response": "y"}\n' > "$tmp/noprompt.jsonl"
expect_error sample_row_without_prompt "noprompt.jsonl:2" "$bin" sample "$tmp/noprompt.jsonl" --output "$tmp/o.jsonl"
expect_error sample_missing_file "$tmp/none.jsonl" "$bin" sample "$tmp/none.jsonl" --output "$tmp/o.jsonl"
expect_error sample_needs_output "--output" "$bin" sample "$tmp/a.jsonl"
exit $((failures > 0))
