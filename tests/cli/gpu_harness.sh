#!/usr/bin/env bash
# The host side of the GPU checks (tests/gpu/test_cuda) on a machine without a GPU:
# MARLHF_GPU_TEST_DEVICE=cpu puts the CPU's ops, with the GPU's bf16 operands, in the GPU's
# place, so every check allocates, copies, compares and frees its buffers as it will on a
# GPU, the model code takes the paths it takes for a device, and the comparisons meet the
# rounding errors the GPU makes. What this keeps working is the harness and its tolerances,
# which otherwise meet a GPU only rarely (faults in five checks written after a GPU run --
# buffers used after expect_match freed them, a LoRA fixture read as if it held a value head --
# were found this way, and the LoRA gradients' tolerance that failed on the H200 fails here). Its PASS/FAIL
# lines are test_cuda's, prefixed "gpu_harness/". Built only where nvcc is (the plain build):
# says SKIP elsewhere.
set -u
cd "$(dirname "$0")/../.."
bin=${MARLHF_BIN:-build/marlhf}
harness="$(dirname "$bin")/tests/gpu/test_cuda"
tmp=${MARLHF_TEST_TMP:-/tmp}/cli_gpu_harness
rm -rf "$tmp" && mkdir -p "$tmp"
failures=0
. tests/cli_helpers.sh
if [ ! -x "$harness" ]; then
    echo "SKIP gpu_harness: $harness is not built (no nvcc, or the sanitizer build)"
    exit 0
fi
MARLHF_GPU_TEST_DEVICE=cpu run_test_cuda gpu_harness '*' "$harness"
status=$?
[ "$failures" -eq 0 ] && [ "$status" -eq 0 ]
