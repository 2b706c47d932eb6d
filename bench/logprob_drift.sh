#!/usr/bin/env bash
# How far quantized weights move a model's log-probs: `marlhf logprobs` of the first COUNT
# (default 64) prompts of data/austen/ppo_prompts.jsonl under a float model, then under each
# quantized file, one JSON line per file: the mean and largest |log-prob difference| over
# every token, and the mean log-prob of each.
#
#   bench/logprob_drift.sh FLOAT_MODEL FILE[:QUANTIZE]...
#
# FLOAT_MODEL (a folder or GGUF) runs with --quantize none; each FILE with --quantize
# QUANTIZE, or with its default when none is given (a K-quant or IQ4 GGUF: its own bits).
# The rows go 8 to a forward pass, so the products are the prefill path's (the dequantized
# weights through sgemm): what is measured is the weights' quantization, not a decode kernel.
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 2 ] || { echo "marlhf: error: usage: bench/logprob_drift.sh FLOAT_MODEL FILE[:QUANTIZE]..." >&2; exit 2; }
count=${COUNT:-64}
[[ "$count" =~ ^[1-9][0-9]*$ ]] ||
    { echo "marlhf: error: COUNT=$count: must be a whole number from 1 (bench/logprob_drift.sh)" >&2; exit 2; }
for spec in "$@"; do # every model there before the float run, which takes minutes
    [ -e "${spec%%:*}" ] || { echo "marlhf: error: ${spec%%:*} does not exist (bench/logprob_drift.sh)" >&2; exit 2; }
done
make --no-print-directory build/marlhf > /dev/null
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
head -n "$count" data/austen/ppo_prompts.jsonl | sed 's/"prompt"/"text"/' > "$work/texts.jsonl"
build/marlhf logprobs --model "$1" --quantize none --input "$work/texts.jsonl" --output "$work/float.jsonl"
shift
for spec in "$@"; do
    file=${spec%%:*} quantize=
    [ "$spec" != "$file" ] && quantize=${spec#*:}
    build/marlhf logprobs --model "$file" ${quantize:+--quantize "$quantize"} --input "$work/texts.jsonl" \
        --output "$work/quantized.jsonl"
    python3 - "$work/float.jsonl" "$work/quantized.jsonl" "$(basename "$file")" "${quantize:-default}" <<'PY'
import json, sys
floats = [json.loads(line)["logprobs"] for line in open(sys.argv[1])]
quantized = [json.loads(line)["logprobs"] for line in open(sys.argv[2])]
pairs = [(a, b) for fa, qa in zip(floats, quantized, strict=True) for a, b in zip(fa, qa, strict=True)]
differences = [abs(a - b) for a, b in pairs]
print(json.dumps({"bench": "logprob_drift", "file": sys.argv[3], "quantize": sys.argv[4], "tokens": len(pairs),
                  "mean_abs_logprob_difference": round(sum(differences) / len(pairs), 4),
                  "max_abs_logprob_difference": round(max(differences), 4),
                  "mean_logprob": round(sum(b for _, b in pairs) / len(pairs), 4),
                  "float_mean_logprob": round(sum(a for a, _ in pairs) / len(pairs), 4)}))
PY
done
