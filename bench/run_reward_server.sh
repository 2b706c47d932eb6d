#!/usr/bin/env bash
# A reward model served over HTTP on OpenRLHF's /get_reward protocol: `marlhf serve
# --reward-model` (float32, then --quantize q8_0) beside the same model in PyTorch +
# transformers computed as OpenRLHF's `openrlhf.cli.serve_rm` computes it
# (bench/torch_reward_server.py), one after the other. Same weights (SmolLM2-135M-Instruct
# from the Q4_1 GGUF as a float32 Hugging Face folder, with bench/trl_ppo_iteration.py's
# fixed-seed score head), same texts (bench/reward_load.py: REQUESTS requests of QUERIES
# prompt + response texts of data/austen/rm_eval.jsonl, one client, as a PPO trainer posts
# a rollout), BATCH rows per forward on both sides, THREADS threads.
# Prints one JSON line per server (sequences/s, latency, the server's peak resident memory)
# and the largest difference between marlhf's float32 rewards and PyTorch's.
# Builds nothing: run `make` first; needs .venv-tools (scripts/setup-python).
#   REQUESTS=8 QUERIES=64 BATCH=4 THREADS=2 bench/run_reward_server.sh
set -euo pipefail
cd "$(dirname "$0")/.."
requests=${REQUESTS:-8} queries=${QUERIES:-64} batch=${BATCH:-4} threads=${THREADS:-2}
hf=${HF_DIR:-/tmp/smollm2-hf} rm=${RM_DIR:-/tmp/smollm2-rm}
py=.venv-tools/bin/python
. bench/smollm2_models.sh
out=$(mktemp -d)
. bench/serve_helpers.sh
peer=
trap 'kill $server $peer 2> /dev/null || true; rm -rf "$out"' EXIT
peak_mb() { awk '/^VmHWM:/ { print int($2 / 1024) }' "/proc/$1/status"; }
load() { echo "load average $1: $(cut -d' ' -f1-3 /proc/loadavg) (on $(nproc) cores; >0.5 = shared machine)" >&2; }
client=(bench/reward_load.py --requests "$requests" --queries "$queries" --threads "$threads")

for quantize in none q8_0; do
    load "before marlhf $quantize"
    start_server "$out/serve.log" --reward-model "$rm" --parallel "$batch" --quantize "$quantize" --threads "$threads"
    line=$(python3 "${client[@]}" "http://127.0.0.1:$port" --impl "marlhf-serve-$quantize" \
        --scores-out "$out/marlhf-$quantize.txt")
    echo "${line%\}}, \"batch\": $batch, \"peak_rss_mb\": $(peak_mb "$server")}"
    stop_server
done

load "before torch"
"$py" bench/torch_reward_server.py --model "$rm" --port-file "$out/torch.port" --batch-size "$batch" \
    --threads "$threads" 2> "$out/torch.log" &
peer=$!
for _ in $(seq 600); do [ -s "$out/torch.port" ] && break; sleep 0.1; done
[ -s "$out/torch.port" ] || { cat "$out/torch.log" >&2; exit 1; }
torch_version=$("$py" -c 'import torch; print(torch.__version__)')
line=$(python3 "${client[@]}" "http://127.0.0.1:$(cat "$out/torch.port")" --impl "torch-$torch_version-serve_rm" \
    --scores-out "$out/torch.txt")
echo "${line%\}}, \"batch\": $batch, \"peak_rss_mb\": $(peak_mb "$peer")}"
kill "$peer"

python3 - "$out/marlhf-none.txt" "$out/marlhf-q8_0.txt" "$out/torch.txt" <<'EOF'
import json, sys
f32, q8, torch = ([float(x) for x in open(p)] for p in sys.argv[1:])
print(json.dumps({"rewards_compared": len(torch),
                  "max_abs_diff_marlhf_f32_vs_torch": float(f"{max(abs(a - b) for a, b in zip(f32, torch)):.3g}"),
                  "max_abs_diff_marlhf_q8_0_vs_torch": float(f"{max(abs(a - b) for a, b in zip(q8, torch)):.3g}"),
                  "reward_std_torch": float(f"{(sum((b - sum(torch) / len(torch)) ** 2 for b in torch) / len(torch)) ** 0.5:.3g}")}))
EOF
