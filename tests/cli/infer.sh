#!/usr/bin/env bash
# marlhf infer on the tiny model: one scored response per prompt, the same file from the
# same seed, the default results/<dataset>/temperature=<T>/<model>.jsonl path, the
# reference scores of chosen/rejected pairs, and bad input. Prints PASS/FAIL per case.
set -u
cd "$(dirname "$0")/../.."
root=$PWD
bin=$root/${MARLHF_BIN:-build/marlhf}
case "${MARLHF_BIN:-}" in /*) bin=$MARLHF_BIN ;; esac
tmp=${MARLHF_TEST_TMP:-/tmp}/cli_infer
rm -rf "$tmp" && mkdir -p "$tmp"
case "$tmp" in /*) ;; *) tmp=$root/$tmp ;; esac
model=$root/tests/fixtures/models/tiny_chat
data=$root/tests/fixtures/train
failures=0
. tests/cli_helpers.sh

"$bin" rm --model "$model" --data "$data/pairs.jsonl" --max-seq-len 32 --per-device-train-batch-size 8 \
    --learning-rate 3e-3 --max-steps 6 --output "$tmp/rm" --quiet --threads 2 2> "$tmp/rm.err" ||
    fail reward_model "$(tail -n 2 "$tmp/rm.err")"
args=(--model "$model" --reward-model "$tmp/rm/final" --data "$data/sft_eval.jsonl" --count 6 --batch-size 4
      --max-new-tokens 8 --threads 2 --quiet)

"$bin" infer "${args[@]}" --output "$tmp/a.jsonl" 2> "$tmp/a.err"
rc=$?
python3 - "$tmp/a.jsonl" <<'PY' && [ $rc -eq 0 ] && pass infer_writes_scored_responses || fail infer_writes_scored_responses "exit $rc $(cat "$tmp/a.err")"
import json, math, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
ok = len(rows) == 6 and all(set(r) == {"prompt", "response", "reward"} and math.isfinite(r["reward"]) for r in rows)
sys.exit(0 if ok else 1)
PY

"$bin" infer "${args[@]}" --output "$tmp/b.jsonl" 2> /dev/null
cmp -s "$tmp/a.jsonl" "$tmp/b.jsonl" && pass infer_reproducible_from_seed || fail infer_reproducible_from_seed "files differ"
"$bin" infer "${args[@]}" --output "$tmp/c.jsonl" --seed 7 2> /dev/null
cmp -s "$tmp/a.jsonl" "$tmp/c.jsonl" && fail infer_seed_matters "same file with another seed" || pass infer_seed_matters

# The batch does not change a prompt's response (per-prompt random streams).
"$bin" infer "${args[@]}" --batch-size 1 --output "$tmp/d.jsonl" 2> /dev/null
python3 - "$tmp/a.jsonl" "$tmp/d.jsonl" <<'PY' && pass infer_batch_invariant || fail infer_batch_invariant "responses differ"
import json, sys
a, b = ([json.loads(l) for l in open(p)] for p in sys.argv[1:3])
sys.exit(0 if [r["response"] for r in a] == [r["response"] for r in b] and
         all(abs(x["reward"] - y["reward"]) < 1e-4 for x, y in zip(a, b)) else 1)
PY

(cd "$tmp" && "$bin" infer "${args[@]}" --temperature 0.5 2> /dev/null)
[ -f "$tmp/results/sft_eval/temperature=0.5/tiny_chat.jsonl" ] && pass infer_default_path ||
    fail infer_default_path "$(cd "$tmp" && find results -type f 2> /dev/null)"

"$bin" infer --reward-model "$tmp/rm/final" --data "$data/pairs.jsonl" --ref-scores --count 0 --output "$tmp/ref.jsonl" \
    --quiet --threads 2 2> /dev/null
python3 - "$tmp/ref.jsonl" "$data/pairs.jsonl" <<'PY' && pass infer_ref_scores || fail infer_ref_scores "bad file"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
pairs = sum(1 for _ in open(sys.argv[2]))
ok = len(rows) == pairs and all({"rejected_response", "rejected_reward"} <= set(r) for r in rows)
# the trained reward model prefers the chosen responses on its own training pairs
ok = ok and sum(r["reward"] > r["rejected_reward"] for r in rows) > 0.6 * len(rows)
sys.exit(0 if ok else 1)
PY

# The reward model's final folder holds its scores of its own data (reward_stats.json: the
# training pairs here, no eval data; those cut at --max-seq-len 32 left out): the scores infer
# --ref-scores gives the same pairs, whole.
python3 - "$tmp/ref.jsonl" "$tmp/rm/final/reward_stats.json" "$data/pairs.jsonl" <<'PY' && pass rm_reward_stats || fail rm_reward_stats "differ"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]  # infer's order is its own: matched by their texts
by_text = {(r["prompt"], r["response"], r["rejected_response"]): r for r in rows}
stats = json.load(open(sys.argv[2]))
pairs = [json.loads(l) for l in open(sys.argv[3])]
used = [by_text[(pairs[i]["prompt"], pairs[i]["chosen"], pairs[i]["rejected"])] for i in stats["indices"]]
close = lambda a, b: len(a) == len(b) and all(abs(x - y) <= 1e-4 * max(1.0, abs(y)) for x, y in zip(a, b))
ok = stats["source"] == "train" and stats["responses_per_example"] == 2 and stats["examples"] == len(used) > 0
ok &= stats["examples"] + stats["cut_examples_left_out"] == len(rows) and stats["indices"] == sorted(stats["indices"])
ok &= close(stats["chosen"], [r["reward"] for r in used]) and close(stats["rejected"], [r["rejected_reward"] for r in used])
ok &= abs(stats["accuracy"] - sum(r["reward"] > r["rejected_reward"] for r in used) / len(used)) <= 1 / len(used)
print(stats["examples"], "whole pairs,", stats["cut_examples_left_out"], "cut", file=sys.stderr)
sys.exit(0 if ok else 1)
PY

# The reward model in 8 bits (--reward-quantize q8_0): the same pairs scored within a few
# hundredths of the float32 scores (not exactly: the quantization moves them), with the
# same preference on most pairs.
"$bin" infer --reward-model "$tmp/rm/final" --data "$data/pairs.jsonl" --ref-scores --count 0 --output "$tmp/ref_q8.jsonl" \
    --reward-quantize q8_0 --quiet --threads 2 2> /dev/null
python3 - "$tmp/ref.jsonl" "$tmp/ref_q8.jsonl" <<'PY' && pass infer_reward_quantize || fail infer_reward_quantize "scores"
import json, sys
f32, q8 = ([json.loads(l) for l in open(p)] for p in sys.argv[1:])
pairs = list(zip(f32, q8))
moved = [abs(a[k] - b[k]) for a, b in pairs for k in ("reward", "rejected_reward")]
spread = max(abs(a[k]) for a, _ in pairs for k in ("reward", "rejected_reward"))
same = sum((a["reward"] > a["rejected_reward"]) == (b["reward"] > b["rejected_reward"]) for a, b in pairs)
print(f"  reward-quantize: scores moved at most {max(moved):.4f} (largest |score| {spread:.3f}); "
      f"{same}/{len(pairs)} preferences kept", file=sys.stderr)
sys.exit(0 if len(q8) == len(f32) and 0 < max(moved) <= 0.05 * spread and same >= 0.9 * len(pairs) else 1)
PY
expect_error infer_bad_reward_quantize "--reward-quantize" "$bin" infer --reward-model "$tmp/rm/final" \
    --data "$data/pairs.jsonl" --ref-scores --output "$tmp/x.jsonl" --reward-quantize int8

expect_error infer_existing_output "--overwrite" "$bin" infer "${args[@]}" --output "$tmp/a.jsonl"
cmp -s "$tmp/a.jsonl" "$tmp/b.jsonl" && pass infer_existing_output_kept || fail infer_existing_output_kept "changed"
expect_error infer_ref_scores_need_pairs "--ref-scores" "$bin" infer --reward-model "$tmp/rm/final" \
    --data "$data/sft_eval.jsonl" --ref-scores --output "$tmp/x.jsonl"
printf '{"prompt": "a"}\n{"prompt": \n' > "$tmp/bad.jsonl"
expect_error infer_bad_min_new_tokens "--min-new-tokens" "$bin" infer "${args[@]}" --max-new-tokens 4 --min-new-tokens 5 \
    --output "$tmp/z.jsonl"
expect_error infer_malformed_jsonl "$tmp/bad.jsonl:2" "$bin" infer "${args[@]}" --data "$tmp/bad.jsonl" --output "$tmp/y.jsonl"
# Language-modeling {"text"} rows (SFT data) have no prompt: refused, not answered as empty prompts.
printf '{"prompt": "a", "response": " b"}\n{"text": "Once upon a time."}\n' > "$tmp/text_rows.jsonl"
expect_error infer_text_rows "text_rows.jsonl at line 2 is a language-modeling" "$bin" infer "${args[@]}" \
    --data "$tmp/text_rows.jsonl" --output "$tmp/t.jsonl"
expect_error infer_not_a_reward_model "value head" "$bin" infer "${args[@]}" --reward-model "$model" --output "$tmp/z.jsonl"
# A reward model of another tokenizer would score the policy's ids as other text (or read past
# its embedding table): refused before anything is loaded.
expect_error infer_reward_model_other_tokenizer "is not the one the token ids come from" "$bin" infer "${args[@]}" \
    --reward-model "$root/models/SmolLM2-135M-Instruct.Q4_1.gguf" --output "$tmp/z.jsonl"
expect_error infer_needs_model "--model" "$bin" infer --reward-model "$tmp/rm/final" --data "$data/sft_eval.jsonl"

# --best-of 4: four answers per prompt, the best-scored kept (the worst as rejected_response).
# Candidate 0 is the answer without --best-of, so the best is never worse than it; and the
# file trains `marlhf sft` (rejection-sampling fine-tuning).
"$bin" infer "${args[@]}" --best-of 4 --output "$tmp/best.jsonl" 2> "$tmp/best.err"
rc=$?
python3 - "$tmp/a.jsonl" "$tmp/best.jsonl" <<'PY' && [ $rc -eq 0 ] && pass infer_best_of || fail infer_best_of "exit $rc $(cat "$tmp/best.err")"
import json, sys
plain, best = ([json.loads(l) for l in open(p)] for p in sys.argv[1:])
ok = len(best) == len(plain) == 6
for p, b in zip(plain, best):
    c = b["candidate_rewards"]
    ok &= b["prompt"] == p["prompt"] and len(c) == 4 and b["reward"] == max(c) and b["rejected_reward"] == min(c)
    ok &= abs(c[0] - p["reward"]) < 1e-4 and b["reward"] >= p["reward"] - 1e-4
ok &= any(b["reward"] > p["reward"] + 1e-3 for p, b in zip(plain, best))  # some prompt gained
sys.exit(0 if ok else 1)
PY
"$bin" sft --model "$model" --data "$tmp/best.jsonl" --max-seq-len 48 --max-steps 2 --per-device-train-batch-size 2 \
    --output "$tmp/rs_sft" --quiet --threads 2 2> "$tmp/rs_sft.err" && [ -f "$tmp/rs_sft/final/model.safetensors" ] &&
    pass best_of_trains_sft || fail best_of_trains_sft "$(tail -n 2 "$tmp/rs_sft.err")"
expect_error infer_bad_best_of "--best-of" "$bin" infer "${args[@]}" --best-of 0 --output "$tmp/y.jsonl"
expect_error infer_best_of_greedy "--best-of" "$bin" infer "${args[@]}" --best-of 2 --temperature 0 --output "$tmp/y.jsonl"
expect_error infer_best_of_ref_scores "--best-of" "$bin" infer --reward-model "$tmp/rm/final" --data "$data/pairs.jsonl" \
    --ref-scores --best-of 2 --output "$tmp/y.jsonl"
exit $((failures > 0))
