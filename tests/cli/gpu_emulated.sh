#!/usr/bin/env bash
# The GPU checks (tests/gpu/test_cuda) against the CUDA backend's own source on CPU threads:
# build/tests/gpu/test_cuda_emulated is test_cuda linked with src/ops/cuda compiled by the
# host C++ compiler over the emulated runtime of tests/emulated_cuda (device memory in host
# memory, kernels as fibers, cuBLASLt's product in plain loops). Where gpu_harness.sh keeps
# the harness and its tolerances working with the CPU's ops standing in, this runs the GPU
# backend's host code (scratch slots, the bf16 weight cache, held and stored matmul inputs,
# the attention's dispatch) and every kernel against the CPU, so a change to the GPU path
# made without a GPU is checked before one is lent. What it cannot see: timing, the tensor
# cores' rounding, register and shared-memory limits (the kernel-facts and probe checks
# say SKIP), races between streams. Its PASS/FAIL lines are test_cuda's, prefixed
# "gpu_emulated/", then an SFT run of marlhf_emulated with --device cuda against the CPU's. Built only where nvcc is (the plain build): says SKIP elsewhere.
set -u
cd "$(dirname "$0")/../.."
bin=${MARLHF_BIN:-build/marlhf}
harness="$(dirname "$bin")/tests/gpu/test_cuda_emulated"
tmp=${MARLHF_TEST_TMP:-/tmp}/cli_gpu_emulated
rm -rf "$tmp" && mkdir -p "$tmp"
failures=0
. tests/cli_helpers.sh
if [ ! -x "$harness" ]; then
    echo "SKIP gpu_emulated: $harness is not built (no nvcc, or the sanitizer build)"
    exit 0
fi
run_test_cuda gpu_emulated '*' "$harness"
status=$?
# The models again with stored inputs turned into holds (MARLHF_CUDA_STORED_INPUTS=0, what
# bench/train_step measures the stores against and tests/gpu/run.sh reruns failing groups with).
MARLHF_CUDA_STORED_INPUTS=0 run_test_cuda gpu_emulated_stores_off 1 "$harness" test_fixture_models
stores_status=$?
# marlhf itself with --device cuda on the emulated backend: 20 SFT steps of the tiny model
# track the CPU's losses, as tests/gpu/run.sh checks on a GPU (MARLHF_GPU_TEST_DEVICE=emulated
# runs all of that script's runs this way).
emulated_bin="$(dirname "$bin")/marlhf_emulated"
sft=(sft --model tests/fixtures/models/tiny_chat --data tests/fixtures/train/sft.jsonl --max-seq-len 32
     --per-device-train-batch-size 4 --num-train-epochs 10 --max-steps 20 --eval-every 0 --quiet --threads 1
     --learning-rate 3e-3)
if "$emulated_bin" "${sft[@]}" --device cpu --output "$tmp/sft-cpu" 2> "$tmp/sft-cpu.err" &&
    "$emulated_bin" "${sft[@]}" --device cuda --output "$tmp/sft-cuda" 2> "$tmp/sft-cuda.err"; then
    cpu_losses=$(json_values "$tmp/sft-cpu/metrics.jsonl" train/loss)
    cuda_losses=$(json_values "$tmp/sft-cuda/metrics.jsonl" train/loss)
    if python3 - "$cpu_losses" "$cuda_losses" <<'PY'; then
import sys
cpu, gpu = [list(map(float, s.split())) for s in sys.argv[1:3]]
worst = max(abs(g - c) / abs(c) for c, g in zip(cpu, gpu)) if len(cpu) == len(gpu) == 20 else float("inf")
print(f"# sft on the emulated GPU: {len(gpu)} steps, loss {gpu[0]:.4f} -> {gpu[-1]:.4f}, worst relative difference {worst:.2e}")
sys.exit(0 if worst <= 2e-2 else 1)
PY
        pass gpu_emulated_sft_tracks_cpu
    else
        fail gpu_emulated_sft_tracks_cpu "losses cpu [$cpu_losses] cuda [$cuda_losses]"
    fi
else
    fail gpu_emulated_sft_tracks_cpu "$(tail -n 2 "$tmp"/sft-*.err)"
fi
[ "$failures" -eq 0 ] && [ "$status" -eq 0 ] && [ "$stores_status" -eq 0 ]
