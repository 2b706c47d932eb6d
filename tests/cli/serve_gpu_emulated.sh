#!/usr/bin/env bash
# marlhf serve with --device cuda, on the CUDA backend's own code run on CPU threads
# (build/marlhf_emulated, tests/emulated_cuda): the tiny chat model answering a chat request,
# two completions at once through the continuous batch (--parallel 2), each answer's usage
# adding up in /metrics, a top_p request whose tokens come from the device's candidates
# (the metrics' backend picks), the same with penalties picked on the host, whose device memory gauges (ops_device_memory) count at least
# cuBLASLt's 64 MiB workspace beside the model, the peak no less than what is held; a CPU
# server has no such gauges; SIGTERM ends it with status 0. What test_cuda checks of the
# continuous batch, here through HTTP and the server's threads. Built only where nvcc is
# (the plain build): says SKIP elsewhere.
set -u
cd "$(dirname "$0")/../.."
plain_bin=${MARLHF_BIN:-build/marlhf}
bin="$(dirname "$plain_bin")/marlhf_emulated"
tmp=${MARLHF_TEST_TMP:-/tmp}/cli_serve_gpu_emulated
rm -rf "$tmp" && mkdir -p "$tmp"
model=tests/fixtures/models/tiny_chat
failures=0
. tests/cli_helpers.sh
. tests/serve_helpers.sh
if [ ! -x "$bin" ]; then
    echo "SKIP serve_gpu_emulated: $bin is not built (no nvcc, or the sanitizer build)"
    exit 0
fi

# metric_value NAME: the sample of marlhf_NAME in $tmp/metrics.txt, or nothing
metric_value() { sed -n "s/^marlhf_$1 //p" "$tmp/metrics.txt"; }

if start_server "$tmp/server.log" --model "$model" --device cuda --threads 1 --parallel 2; then
    status=$(request POST /v1/chat/completions '{"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 6, "temperature": 0}')
    cp "$tmp/body" "$tmp/chat.json"
    [ "$status" = 200 ] && python3 -c "
import json, sys
a = json.load(open(sys.argv[1]))
sys.exit(0 if a['choices'][0]['message']['role'] == 'assistant' and a['usage']['completion_tokens'] >= 1 else 1)" "$tmp/chat.json" &&
        pass serve_gpu_emulated_chat || fail serve_gpu_emulated_chat "status $status: $(head -c 300 "$tmp/chat.json")"
    # two at once: both answered, in the batch's two rows
    for k in 1 2; do
        curl -s --max-time 120 -o "$tmp/both_$k.json" -w '%{http_code}' -H 'Content-Type: application/json' \
            --data-binary "{\"prompt\": \"Once upon a time $k\", \"max_tokens\": 8, \"temperature\": 0}" \
            "http://127.0.0.1:$port/v1/completions" > "$tmp/both_$k.status" &
    done
    wait_pids=$(jobs -p | grep -v "^$server_pid$")
    for pid in $wait_pids; do wait "$pid"; done
    [ "$(cat "$tmp/both_1.status")" = 200 ] && [ "$(cat "$tmp/both_2.status")" = 200 ] &&
        pass serve_gpu_emulated_two_at_once ||
        fail serve_gpu_emulated_two_at_once "statuses $(cat "$tmp"/both_*.status): $(head -c 200 "$tmp/both_1.json")"
    # top_p without top_k (gen/sampler.h, sampler_candidates_hold_nucleus): at temperature
    # 0.2 the tiny model's rows are peaked, so its tokens after the first come from the
    # device's candidates (/metrics: backend picks, steps short of a nucleus)
    curl -s --max-time 60 -o "$tmp/metrics.txt" "http://127.0.0.1:$port/metrics"
    picked_before=$(metric_value backend_picked_tokens_total)
    status=$(request POST /v1/completions '{"prompt": "Once upon a time", "max_tokens": 8, "temperature": 0.2, "top_p": 0.9, "seed": 3}')
    cp "$tmp/body" "$tmp/top_p.json"
    curl -s --max-time 60 -o "$tmp/metrics.txt" "http://127.0.0.1:$port/metrics"
    picked_after=$(metric_value backend_picked_tokens_total) misses=$(metric_value nucleus_misses_total)
    tokens=$(python3 -c "import json, sys; print(json.load(open(sys.argv[1]))['usage']['completion_tokens'])" "$tmp/top_p.json" 2> /dev/null)
    if [ "$status" = 200 ] && [ -n "$tokens" ] && [ -n "$misses" ] &&
        python3 -c "import sys; b, a, m, t = map(float, sys.argv[1:]); sys.exit(0 if a - b >= t - 1 - m > 0 else 1)" \
            "$picked_before" "$picked_after" "$misses" "$tokens"; then
        pass "serve_gpu_emulated_top_p ($((${picked_after%.*} - ${picked_before%.*})) of $tokens tokens picked on the device, $misses steps short)"
    else
        fail serve_gpu_emulated_top_p "status $status tokens [$tokens] picked [$picked_before -> $picked_after] misses [$misses]: $(head -c 200 "$tmp/top_p.json")"
    fi
    # The same request with penalties: they read the tokens seen, so every token is picked on
    # the host from the copied logits (no backend pick), and the request is answered.
    status=$(request POST /v1/completions '{"prompt": "Once upon a time", "max_tokens": 8, "temperature": 0.2, "top_p": 0.9, "seed": 3, "repetition_penalty": 1.3, "frequency_penalty": 0.5}')
    cp "$tmp/body" "$tmp/penalized.json"
    curl -s --max-time 60 -o "$tmp/metrics.txt" "http://127.0.0.1:$port/metrics"
    picked_penalized=$(metric_value backend_picked_tokens_total)
    tokens=$(python3 -c "import json, sys; print(json.load(open(sys.argv[1]))['usage']['completion_tokens'])" "$tmp/penalized.json" 2> /dev/null)
    [ "$status" = 200 ] && [ -n "$tokens" ] && [ "$tokens" -ge 1 ] && [ "$picked_penalized" = "$picked_after" ] &&
        pass "serve_gpu_emulated_penalties ($tokens tokens, all picked on the host)" ||
        fail serve_gpu_emulated_penalties "status $status tokens [$tokens] picked [$picked_after -> $picked_penalized]"
    held=$(metric_value device_memory_bytes) peak=$(metric_value device_memory_peak_bytes)
    answered=$(metric_value requests_answered_total)
    if [ -n "$held" ] && [ -n "$peak" ] && [ "$answered" = 5 ] &&
        python3 -c "import sys; h, p = map(float, sys.argv[1:]); sys.exit(0 if 64 * 2**20 < h <= p else 1)" "$held" "$peak"; then
        pass "serve_gpu_emulated_metrics (device memory $held bytes held, $peak at most)"
    else
        fail serve_gpu_emulated_metrics "held [$held] peak [$peak] answered [$answered]"
    fi
    stop_server
    [ "$stop_rc" = 0 ] && pass serve_gpu_emulated_sigterm || fail serve_gpu_emulated_sigterm "exit $stop_rc: $(tail -n 2 "$tmp/server.log")"
else
    fail serve_gpu_emulated_start "$(tail -n 3 "$tmp/server.log")"
fi

# The CPU's server says nothing of device memory.
bin=$plain_bin
if start_server "$tmp/cpu_server.log" --model "$model" --threads 1; then
    curl -s --max-time 60 -o "$tmp/metrics.txt" "http://127.0.0.1:$port/metrics"
    grep -q '^marlhf_requests_answered_total 0$' "$tmp/metrics.txt" && ! grep -q device_memory "$tmp/metrics.txt" &&
        pass serve_cpu_no_device_memory || fail serve_cpu_no_device_memory "$(grep -c . "$tmp/metrics.txt") lines"
    stop_server
else
    fail serve_cpu_start "$(tail -n 3 "$tmp/cpu_server.log")"
fi
[ "$failures" -eq 0 ]
