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
# "gpu_emulated/". Built only where nvcc is (the plain build): says SKIP elsewhere.
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
"$harness" > "$tmp/test_cuda.out" 2> "$tmp/test_cuda.err"
status=$?
sed -n 's/^\(PASS\|FAIL\|SKIP\) /\1 gpu_emulated\//p' "$tmp/test_cuda.out"
grep -E '^  ' "$tmp/test_cuda.err" | head -n 20
if [ "$status" -ne 0 ] && ! grep -q '^FAIL ' "$tmp/test_cuda.out"; then
    fail gpu_emulated_exit "test_cuda_emulated exited with status $status: $(tail -n 3 "$tmp/test_cuda.err")"
fi
grep -q '^[0-9]* passed, 0 failed$' "$tmp/test_cuda.out" || fail gpu_emulated_summary "$(tail -n 1 "$tmp/test_cuda.out")"
# The models again with stored inputs turned into holds (MARLHF_CUDA_STORED_INPUTS=0, what
# bench/train_step measures the stores against and tests/gpu/run.sh reruns failing groups with).
MARLHF_CUDA_STORED_INPUTS=0 "$harness" test_fixture_models > "$tmp/stores_off.out" 2> "$tmp/stores_off.err"
stores_status=$?
sed -n 's/^\(PASS\|FAIL\|SKIP\) /\1 gpu_emulated_stores_off\//p' "$tmp/stores_off.out"
grep -E '^  ' "$tmp/stores_off.err" | head -n 20
grep -q '^1 passed, 0 failed$' "$tmp/stores_off.out" ||
    fail gpu_emulated_stores_off "status $stores_status: $(tail -n 1 "$tmp/stores_off.out")"
[ "$failures" -eq 0 ] && [ "$status" -eq 0 ]
