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
run_test_cuda gpu_emulated '*' "$harness"
status=$?
# The models again with stored inputs turned into holds (MARLHF_CUDA_STORED_INPUTS=0, what
# bench/train_step measures the stores against and tests/gpu/run.sh reruns failing groups with).
MARLHF_CUDA_STORED_INPUTS=0 run_test_cuda gpu_emulated_stores_off 1 "$harness" test_fixture_models
stores_status=$?
[ "$failures" -eq 0 ] && [ "$status" -eq 0 ] && [ "$stores_status" -eq 0 ]
