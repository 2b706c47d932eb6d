#!/usr/bin/env bash
# tests/gpu/run.sh's speed runs (step 4, tests/gpu/speed.sh) without a GPU: the benchmark
# programs built over the CUDA backend's CPU emulation (build/bench/*_emulated) on the
# tiny-llama shape, through the script itself (MARLHF_GPU_TEST_DEVICE=emulated
# --bench-only), full and --quick-bench, then with a --time-limit that skips them all. What
# this keeps working is what a lent GPU's short session runs after its checks: every
# program starts, prints the line the summary reads (peak device memory included), and the
# summary line names a figure for each of marlhf's runs; the PyTorch peers are not run
# (no torch here) and read n/a. Its figures are not speeds. Built only where nvcc is (the
# plain build): says SKIP elsewhere.
set -u
cd "$(dirname "$0")/../.."
bin=${MARLHF_BIN:-build/marlhf}
bench_dir="$(dirname "$bin")/bench"
tmp=${MARLHF_TEST_TMP:-/tmp}/cli_gpu_bench_emulated
rm -rf "$tmp" && mkdir -p "$tmp"
failures=0
. tests/cli_helpers.sh
if [ ! -x "$bench_dir/train_step_emulated" ] || [ "$(dirname "$bin")" != build ]; then
    echo "SKIP gpu_bench_emulated: $bench_dir/train_step_emulated is not built (no nvcc, or the sanitizer build)"
    exit 0
fi

# bench_lines FILE: how many result lines each kind of run left (train_step's, decode's)
bench_lines() {
    python3 - "$1" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
steps = [r for r in rows if "tokens_per_s" in r]
decodes = [r for r in rows if "decode_tokens_per_s" in r]
# every line of marlhf's says the most device memory it held, and it is some; each step's
# breakdown grows stage by stage up to that peak (weights, + gradients, + AdamW's moments,
# + what stays between steps)
memory = all(isinstance(r.get("peak_mem_gib"), float) and r["peak_mem_gib"] > 0 for r in steps + decodes)
stages = ("weights_gib", "with_gradients_gib", "with_optimizer_gib", "held_between_steps_gib", "peak_mem_gib")
memory = memory and all(all(isinstance(r.get(k), float) for k in stages) and
                        all(r[a] <= r[b] for a, b in zip(stages, stages[1:])) and r["weights_gib"] > 0 for r in steps)
print(len(steps), len(decodes), "memory" if memory else "no-memory")
PY
}

# The full set: 8 training steps (5 attention kernels, no clipping, stores off, q/k/v as
# three products), 28 decode lines (4 samplers x 2 batches, the norms unfolded x 2 batches,
# 4 quantized types x 3 batches, 3 KV caches x 2 batches), 4 breakdowns; the summary has a figure for each marlhf slot.
MARLHF_GPU_TEST_DEVICE=emulated bash tests/gpu/run.sh --bench-only --logs "$tmp/full" > "$tmp/full.out" 2>&1
rc=$?
summary=$(grep '^gpu checks:' "$tmp/full.out")
counts=$(bench_lines "$tmp/full/bench.jsonl" 2>&1)
breakdowns=$(grep -c modelled_step_ms "$tmp/full/ops_breakdown.jsonl" 2> /dev/null)
# the peers' figures are n/a here; nothing else may be
unexpected=$(echo "$summary" | sed 's/vs pytorch n\/a tok\/s MFU n\/a//g; s/vs n\/a//g' | grep -o 'n/a' | wc -l)
if [ $rc -eq 0 ] && [ "$counts" = "8 28 memory" ] && [ "$breakdowns" = 4 ] && [ "$unexpected" = 0 ] &&
    [[ "$summary" == *"tiny-llama step "[0-9]*" tok/s"*"peak memory 0."[0-9]" vs n/a GiB"* ]]; then
    pass "gpu_bench_emulated_full ($counts, $breakdowns breakdowns)"
else
    fail gpu_bench_emulated_full "rc $rc, lines [$counts], breakdowns [$breakdowns], n/a $unexpected: $summary $(tail -n 3 "$tmp/full.out")"
fi

# --quick-bench: the three fused kernels' steps, stores off and three products (5), decoding
# with float weights (4 samplers x 2 batches, the norms unfolded x 2 batches, the float32
# cache x 2 batches), 3 breakdowns.
MARLHF_GPU_TEST_DEVICE=emulated bash tests/gpu/run.sh --bench-only --quick-bench --logs "$tmp/quick" > "$tmp/quick.out" 2>&1
rc=$?
summary=$(grep '^gpu checks:' "$tmp/quick.out")
counts=$(bench_lines "$tmp/quick/bench.jsonl" 2>&1)
breakdowns=$(grep -c modelled_step_ms "$tmp/quick/ops_breakdown.jsonl" 2> /dev/null)
if [ $rc -eq 0 ] && [ "$counts" = "5 12 memory" ] && [ "$breakdowns" = 3 ] &&
    [[ "$summary" == *"(mma-plain "[0-9]*", mma-ds "[0-9]*", wmma n/a, unfused n/a; q/k/v as three products "[0-9]*", stores off "[0-9]*")"* ]] &&
    [[ "$summary" == *"after 64 prompt tokens B64 f32 cache "[0-9]*", f16 cache n/a"* ]] &&
    [[ "$summary" == *"(norms unfolded "[0-9]*"; q8_0 n/a"* ]]; then
    pass "gpu_bench_emulated_quick ($counts, $breakdowns breakdowns)"
else
    fail gpu_bench_emulated_quick "rc $rc, lines [$counts], breakdowns [$breakdowns]: $summary $(tail -n 3 "$tmp/quick.out")"
fi

# A --time-limit already spent: every benchmark of the quick set (14) skipped and named, and
# the summary line still comes, all n/a, with the count of those skipped.
MARLHF_GPU_TEST_DEVICE=emulated bash tests/gpu/run.sh --bench-only --quick-bench --time-limit 1 --logs "$tmp/late" \
    > "$tmp/late.out" 2>&1
rc=$?
summary=$(grep '^gpu checks:' "$tmp/late.out")
if [ $rc -eq 0 ] && [[ "$summary" == *"tiny-llama step n/a tok/s"*"; 14 benchmarks skipped at --time-limit" ]] &&
    [ "$(grep -c '^SKIP (--time-limit 1 s reached' "$tmp/late.out")" = 14 ]; then
    pass gpu_bench_emulated_time_limit
else
    fail gpu_bench_emulated_time_limit "rc $rc: $summary"
fi

# bench/host_overhead.sh: a decode step's launches counted with the work skipped
# (MARLHF_EMULATED_SKIP_WORK): at 1 row every product is a matvec kernel (no cuBLASLt), at
# 9 rows (past matvec's 8) they are cuBLASLt's; each line has the host's time per step.
SHAPES=tiny-llama BATCHES="1 9" SHORT=3 LONG=5 bash bench/host_overhead.sh > "$tmp/host.out" 2>&1
rc=$?
host=$(python3 - "$tmp/host.out" <<'PY' 2>&1
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
ok = (len(rows) == 2 and [r["batch"] for r in rows] == [1, 9] and all(r["kernels_per_step"] > 0 for r in rows)
      and rows[0]["products_per_step"] == 0 and rows[1]["products_per_step"] > 0
      and all(isinstance(r["host_ms_per_step"], float) for r in rows))
print("ok" if ok else "bad: %s" % rows)
PY
)
[ $rc -eq 0 ] && [ "$host" = ok ] && pass gpu_bench_emulated_host_overhead ||
    fail gpu_bench_emulated_host_overhead "rc $rc, $host: $(tail -n 3 "$tmp/host.out")"
SHORT=5 LONG=5 bash bench/host_overhead.sh > "$tmp/host_bad.out" 2>&1
rc=$?
[ $rc -eq 2 ] && grep -q "LONG > SHORT" "$tmp/host_bad.out" && pass gpu_bench_emulated_host_overhead_bad_range ||
    fail gpu_bench_emulated_host_overhead_bad_range "rc $rc: $(cat "$tmp/host_bad.out")"

# Options that contradict each other are refused before anything runs.
MARLHF_GPU_TEST_DEVICE=emulated bash tests/gpu/run.sh --bench-only --no-bench > "$tmp/none.out" 2>&1
rc=$?
[ $rc -eq 2 ] && grep -q "leave nothing to run" "$tmp/none.out" && pass gpu_bench_emulated_nothing_to_run ||
    fail gpu_bench_emulated_nothing_to_run "rc $rc: $(cat "$tmp/none.out")"
[ "$failures" -eq 0 ]
