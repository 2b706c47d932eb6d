#!/usr/bin/env bash
# The CUDA backend checked against the CPU backend, and its speed, in one run on a GPU
# machine (it needs nothing from the network). Prints one summary line at the end.
#
#   1. build/tests/gpu/test_cuda: every op forward and backward against the CPU op on
#      random inputs (stated tolerances), the fixture models' log-probs, loss and
#      gradients, generation with the KV cache on the GPU (also serve's continuous batch),
#      quantized weights (every type's ops: Q8_0, Q4_0, NF4, Q4_1, Q5_1, Q2_K - Q6_K; quantized
#      models; a Q4_K_M file's and llama.cpp's Q5_K_M, Q3_K_M, Q2_K, Q4_1, Q5_1 files' log-probs
#      and logits); then the LoRA models again on the wmma and unfused attention kernels.
#      build/tests/gpu/test_collectives: NCCL as a communicator of one (SKIP without the
#      library).
#      With MARLHF_GPU_TEST_DEVICE=cpu it runs every check but the wmma rerun
#      with the CPU's ops standing in for the GPU (its host side: `make test` runs it so,
#      tests/cli/gpu_harness.sh).
#   2. 20 SFT steps of the tiny model with --device cuda and --device cpu: the per-step
#      losses must track (relative difference <= 2e-2); again with LoRA adapters, with
#      QLoRA (adapters over an NF4 and a Q4_0 base), on the wmma attention kernels
#      (MARLHF_CUDA_ATTENTION=wmma; mma is the default), 20 DPO steps, the tiny Gemma 2 and
#      Gemma 3, and Gemma 3 with a sliding window of 8 keys.
#   3. A short PPO run (reward model, then 3 PPO iterations) with --device cuda; again
#      with LoRA adapters, with QLoRA (--actor-quantize nf4 --critic-quantize q8_0), with
#      GRPO (no critic), and on the wmma and mma-ds attention kernels.
#   4. Speed (skipped with --no-bench): the SFT step of the SmolLM2-135M and ~1B Llama
#      shapes (random weights, B=8, T=1024) and decode at batch 1 and 64 (also with Q8_0,
#      Q4_K_M and Q5_K_M weights, and after a 1024-token prompt on float32, half and Q8_0
#      KV caches; no PyTorch peer for those), each beside
#      PyTorch eager doing the same on the same GPU (bench/torch_gpu_*.py), with each side's
#      peak device memory ("peak_mem_gib": bench/device_memory.h, max_memory_allocated); then the same
#      steps op by op (bench/ops_breakdown.c), with the mma attention kernels (the default),
#      their PLAIN variant (mma-plain), mma-ds (dS kept for the dQ kernel) and wmma. The
#      training step also runs on mma-plain, mma-ds, wmma and unfused.
#
# usage: tests/gpu/run.sh [--bundle FILE.tar.xz] [--no-bench | --quick-bench] [--bench-only] [--logs DIR] [--time-limit SECONDS]
#   --bench-only: step 4 alone (the speed runs; with --quick-bench its quick set).
#   --quick-bench: only the 1B shape's fused-attention steps beside PyTorch, its breakdowns, and decoding at
#             batch 1 and 64 with float weights (greedy, top-k 50, temperature 1; after a 1024-token prompt
#             on the float32 cache), without the PyTorch decode peers.
#   --time-limit: the run's wall-clock budget (a lent GPU's session is short): the checks
#             (steps 1-3) always run; a benchmark is cut at the limit, and one that would
#             start after it is skipped and named in the log, so the summary line still comes.
#   --bundle: binaries made by tests/gpu/bundle.sh, for a GPU machine without the build
#             packages; without it the script builds with make (nvcc must be present).
set -u
cd "$(dirname "$0")/../.."
# MARLHF_GPU_TEST_DEVICE=cpu runs steps 2-3 on the CPU: a check of this script itself.
# MARLHF_GPU_TEST_DEVICE=emulated runs steps 1-3 with `--device cuda` on the CUDA backend's
# own code on CPU threads (build/marlhf_emulated, build/tests/gpu/test_cuda_emulated;
# tests/emulated_cuda), no speed runs: what a GPU run would check, without a GPU, but
# not the GPU's rounding or timing. With --bench-only it runs step 4 instead, with the
# benchmark programs built over the emulation on a tiny shape (tests/gpu/speed.sh): the
# programs and the summary checked, not their speed (tests/cli/gpu_bench_emulated.sh).
device=${MARLHF_GPU_TEST_DEVICE:-cuda}
emulated=0
if [ "$device" = emulated ]; then
    emulated=1 device=cuda
fi
bundle="" checks=1 bench=1 quick=0 logs=tests/tmp/gpu time_limit=0
while [ $# -gt 0 ]; do
    case "$1" in
        --bundle|--logs|--time-limit)
            [ $# -ge 2 ] || { echo "tests/gpu/run.sh: option $1 needs a value" >&2; exit 2; } ;;
    esac
    case "$1" in
        --bundle) bundle=$2; shift 2 ;;
        --no-bench) bench=0; shift ;;
        --quick-bench) quick=1; shift ;;
        --bench-only) checks=0; shift ;;
        --logs) logs=$2; shift 2 ;;
        --time-limit) time_limit=$2; shift 2 ;;
        *) echo "tests/gpu/run.sh: unknown option $1" >&2; exit 2 ;;
    esac
done
if [ "$emulated" = 1 ]; then
    [ -z "$bundle" ] || { echo "tests/gpu/run.sh: MARLHF_GPU_TEST_DEVICE=emulated builds its own binaries (no --bundle)" >&2; exit 2; }
    [ "$checks" = 1 ] && bench=0 # the emulation's speeds are not speeds: step 4 only alone, as a check
fi
[ "$checks" = 0 ] && [ "$bench" = 0 ] && { echo "tests/gpu/run.sh: --bench-only and --no-bench leave nothing to run" >&2; exit 2; }
case "$time_limit" in
    '' | *[!0-9]*) echo "tests/gpu/run.sh: --time-limit must be a whole number of seconds, not '$time_limit'" >&2; exit 2 ;;
esac
mkdir -p "$logs"
log="$logs/gpu_checks.log"
: > "$log"
say() { echo "$@" | tee -a "$log"; }

if [ -n "$bundle" ]; then
    root=$(mktemp -d)
    tar xJf "$bundle" -C "$root" || { say "cannot unpack $bundle"; exit 2; }
    bin="$root/bundle/bin"
    export LD_LIBRARY_PATH="$root/bundle/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    marlhf="$bin/marlhf" test_cuda="$bin/test_cuda" train_step="$bin/train_step" decode="$bin/decode"
    ops_breakdown="$bin/ops_breakdown" test_collectives="$bin/test_collectives"
elif [ "$emulated" = 1 ]; then
    make -j"$(nproc)" build/marlhf_emulated build/tests/gpu/test_cuda_emulated build/tests/gpu/test_collectives_emulated \
        build/bench/train_step_emulated build/bench/decode_emulated build/bench/ops_breakdown_emulated \
        > "$logs/build.log" 2>&1 || { say "build failed: see $logs/build.log"; exit 2; }
    marlhf=build/marlhf_emulated test_cuda=build/tests/gpu/test_cuda_emulated
    test_collectives=build/tests/gpu/test_collectives_emulated train_step=build/bench/train_step_emulated
    decode=build/bench/decode_emulated ops_breakdown=build/bench/ops_breakdown_emulated
else
    make -j"$(nproc)" tests bench > "$logs/build.log" 2>&1 || { say "build failed: see $logs/build.log"; exit 2; }
    marlhf=build/marlhf test_cuda=build/tests/gpu/test_cuda train_step=build/bench/train_step decode=build/bench/decode
    ops_breakdown=build/bench/ops_breakdown test_collectives=build/tests/gpu/test_collectives
fi
# cuBLASLt and the CUDA runtime: the toolkit's, else the ones PyTorch ships.
for dir in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib \
           $(find /usr/local /opt /usr/lib -name 'libcublasLt.so.13' -printf '%h\n' 2>/dev/null | head -n 3); do
    [ -d "$dir" ] && export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$dir"
done
# NCCL (opened on demand, ops/cuda/nccl_library.cuh): the loader's, else the toolkit's or PyTorch's.
if [ -z "${MARLHF_NCCL_LIBRARY:-}" ] && ! ldconfig -p 2> /dev/null | grep -q 'libnccl.so.2 '; then
    nccl=$(find /usr/local /opt /usr/lib -name 'libnccl.so.2' 2>/dev/null | head -n 1)
    [ -n "$nccl" ] && export MARLHF_NCCL_LIBRARY="$nccl"
fi
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv,noheader >> "$log" 2>&1

passed=0 failed=0 skipped=0
check() { # check NAME CONDITION-EXIT-STATUS DETAIL
    if [ "$2" -eq 0 ]; then say "PASS $1 $3"; passed=$((passed + 1)); else say "FAIL $1 $3"; failed=$((failed + 1)); fi
}

# bench_run SECONDS OUTPUT COMMAND...: COMMAND >> OUTPUT (stderr to the log), stopped after
# SECONDS or at --time-limit, whichever comes first; skipped when less than 20 s are left.
bench_run() {
    local seconds=$1 out=$2 left
    shift 2
    if [ "$time_limit" -gt 0 ]; then
        left=$((time_limit - SECONDS))
        if [ "$left" -lt 20 ]; then
            say "SKIP (--time-limit $time_limit s reached after ${SECONDS} s): ${*##*/}"
            skipped=$((skipped + 1))
            return
        fi
        [ "$left" -lt "$seconds" ] && seconds=$left
    fi
    timeout "$seconds" "$@" >> "$out" 2>> "$log"
}
stage() { say "# ${SECONDS} s: $*"; }

# 1-3. ops and models, SFT and DPO steps against the CPU, PPO on the device (tests/gpu/checks.sh)
[ "$checks" = 1 ] && . tests/gpu/checks.sh

# 4. speed, each beside PyTorch eager on the same GPU (tests/gpu/speed.sh)
summary_speed=""
[ "$bench" = 1 ] && . tests/gpu/speed.sh
say "gpu checks: $passed passed, $failed failed${summary_speed:+; $summary_speed}; ${SECONDS} s$( [ "$skipped" -gt 0 ] && echo "; $skipped benchmarks skipped at --time-limit")"
[ "$failed" -eq 0 ]
