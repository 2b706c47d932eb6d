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
# usage: tests/gpu/run.sh [--bundle FILE.tar.xz] [--no-bench | --quick-bench] [--logs DIR] [--time-limit SECONDS]
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
# not the GPU's rounding or timing.
device=${MARLHF_GPU_TEST_DEVICE:-cuda}
emulated=0
if [ "$device" = emulated ]; then
    emulated=1 device=cuda
fi
bundle="" bench=1 quick=0 logs=tests/tmp/gpu time_limit=0
while [ $# -gt 0 ]; do
    case "$1" in
        --bundle|--logs|--time-limit)
            [ $# -ge 2 ] || { echo "tests/gpu/run.sh: option $1 needs a value" >&2; exit 2; } ;;
    esac
    case "$1" in
        --bundle) bundle=$2; shift 2 ;;
        --no-bench) bench=0; shift ;;
        --quick-bench) quick=1; shift ;;
        --logs) logs=$2; shift 2 ;;
        --time-limit) time_limit=$2; shift 2 ;;
        *) echo "tests/gpu/run.sh: unknown option $1" >&2; exit 2 ;;
    esac
done
if [ "$emulated" = 1 ]; then
    [ -z "$bundle" ] || { echo "tests/gpu/run.sh: MARLHF_GPU_TEST_DEVICE=emulated builds its own binaries (no --bundle)" >&2; exit 2; }
    bench=0
fi
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
        > "$logs/build.log" 2>&1 || { say "build failed: see $logs/build.log"; exit 2; }
    marlhf=build/marlhf_emulated test_cuda=build/tests/gpu/test_cuda_emulated
    test_collectives=build/tests/gpu/test_collectives_emulated
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

# 1. ops and models. The checks run with gradients NaN at each model_zero_grad and stored
# inputs moved aside on the CPU, as tests/run.sh's do (model/model.h, ops/cpu/stored_inputs.c);
# the speed runs below without.
export MARLHF_CHECK_GRADIENT_WRITES=1 MARLHF_CHECK_STORED_INPUTS=1
stage "test_cuda"
# About 20 s on the H200 (2026-12-04); emulated, every kernel runs on CPU threads: minutes.
test_cuda_seconds=300
[ "$emulated" = 1 ] && test_cuda_seconds=1200
timeout "$test_cuda_seconds" "$test_cuda" > "$logs/test_cuda.log" 2>&1
rc=$?
cat "$logs/test_cuda.log" >> "$log"
grep -E '^(PASS|FAIL|#)' "$logs/test_cuda.log"
tests_passed=$(grep -c '^PASS ' "$logs/test_cuda.log")
tests_failed=$(grep -c '^FAIL ' "$logs/test_cuda.log")
[ "$rc" -ne 0 ] && [ "$tests_failed" -eq 0 ] && { tests_failed=1; tail -n 5 "$logs/test_cuda.log"; }
# On a failure, look for bad memory accesses (where compute-sanitizer works and time allows).
if [ "$rc" -ne 0 ] && [ "$device" = cuda ] && command -v compute-sanitizer > /dev/null &&
    { [ "$time_limit" -eq 0 ] || [ $((time_limit - SECONDS)) -gt 400 ]; }; then
    timeout 240 compute-sanitizer --tool memcheck --print-limit 5 "$test_cuda" > "$logs/memcheck.log" 2>&1
    grep -E '^=+ (ERROR|Invalid|ERROR SUMMARY)|^========= +at ' "$logs/memcheck.log" | head -n 20 | tee -a "$log"
fi
# Which change broke a failing group: the failing groups again with the stored buffers
# turned into plain holds (src/ops/ops.h, hold_stored; the behaviour before 2026-12-05's
# session 40), into their own log, counted in neither total.
if [ "$tests_failed" -gt 0 ] && [ "$device" = cuda ]; then
    failing=$(grep '^FAIL ' "$logs/test_cuda.log" | awk '{print $2}' | tr '\n' ' ')
    # Under --time-limit, at most what leaves the speed runs ~260 s (a bad step is still
    # worth timing: the benchmarks do not depend on the checks).
    rerun_seconds=200
    if [ "$time_limit" -gt 0 ]; then
        rerun_seconds=$((time_limit - SECONDS - 260))
        [ "$rerun_seconds" -gt 200 ] && rerun_seconds=200
        [ "$rerun_seconds" -lt 30 ] && rerun_seconds=30
    fi
    if [ -n "$failing" ]; then
        MARLHF_CUDA_STORED_INPUTS=0 timeout "$rerun_seconds" "$test_cuda" $failing > "$logs/test_cuda_stores_off.log" 2>&1
        say "# failing groups again with MARLHF_CUDA_STORED_INPUTS=0: $(grep -c '^PASS ' "$logs/test_cuda_stores_off.log") of $(echo $failing | wc -w) pass"
    fi
fi
passed=$((passed + tests_passed)) failed=$((failed + tests_failed))
# The collectives (NCCL) as a communicator of one: the library loads and takes the calls
# (between GPUs they need a machine with several; tests/cli/gpu_emulated.sh runs 2 emulated
# ranks). A SKIP line (no NCCL library found) counts in neither total.
if [ "$device" = cuda ]; then
    stage "test_collectives"
    timeout 120 "$test_collectives" > "$logs/test_collectives.log" 2>&1
    rc=$?
    grep -E '^(PASS|FAIL|SKIP|#)' "$logs/test_collectives.log" | tee -a "$log"
    if ! { [ "$rc" -eq 0 ] && grep -q '^SKIP ' "$logs/test_collectives.log"; }; then
        check collectives_one_rank "$((rc != 0 || $(grep -c '^PASS ' "$logs/test_collectives.log") != 5))" \
            "(sum, reduce, broadcast, stale weight copy, beside and join; $(grep -m 1 '^# ' "$logs/test_collectives.log" | cut -c 3-))"
    fi
fi
# The LoRA models again on the other attention kernels (mma is the default): the adapters'
# gradients are the ones most sensitive to bf16 rounding, attention's included.
for kernels in wmma unfused; do
    MARLHF_CUDA_ATTENTION=$kernels timeout 120 "$test_cuda" test_lora_models > "$logs/test_cuda_lora_$kernels.log" 2>&1
    rc=$?
    grep -E '^# ' "$logs/test_cuda_lora_$kernels.log" >> "$log"
    check "test_lora_models_${kernels}_attention" $rc "($(grep -c gradients "$logs/test_cuda_lora_$kernels.log") models)"
done

# 2. 20 SFT steps, GPU against CPU: every weight, then LoRA adapters (rank 8, base frozen)
stage "SFT and DPO steps against the CPU"
model=tests/fixtures/models/tiny_chat data=tests/fixtures/train
tmp=$(mktemp -d) # run folders (models too) stay out of the logs folder
sft=(sft --model "$model" --data "$data/sft.jsonl" --max-seq-len 32 --per-device-train-batch-size 4
     --num-train-epochs 10 --max-steps 20 --eval-every 0 --quiet --threads 4)
sft_tracks_cpu() { # sft_tracks_cpu NAME OPTIONS...: the same 20 steps of "${sft[@]}" on both devices
    local name=$1 detail
    shift
    "$marlhf" "${sft[@]}" "$@" --device cpu --output "$tmp/$name-cpu" 2>> "$log"
    timeout 120 "$marlhf" "${sft[@]}" "$@" --device "$device" --output "$tmp/$name-cuda" 2>> "$log"
    detail=$(python3 - "$tmp/$name-cpu/metrics.jsonl" "$tmp/$name-cuda/metrics.jsonl" <<'PY' 2>&1
import json, sys
def losses(path):
    return [r["train/loss"] for r in map(json.loads, open(path)) if "train/loss" in r]
cpu, gpu = losses(sys.argv[1]), losses(sys.argv[2])
worst = max(abs(g - c) / abs(c) for c, g in zip(cpu, gpu)) if len(cpu) == len(gpu) == 20 else float("inf")
print(f"steps {len(cpu)}/{len(gpu)} loss {cpu[0]:.4f}->{cpu[-1]:.4f} (cpu) {gpu[0]:.4f}->{gpu[-1]:.4f} (cuda) "
      f"max rel diff {worst:.2e}")
sys.exit(0 if worst <= 2e-2 else 1)
PY
)
    check "${name}_20_steps_track_cpu" $? "($detail)"
    cp "$tmp/$name-cpu/metrics.jsonl" "$logs/${name}_cpu_metrics.jsonl" 2> /dev/null
    cp "$tmp/$name-cuda/metrics.jsonl" "$logs/${name}_cuda_metrics.jsonl" 2> /dev/null
}
sft_tracks_cpu sft --learning-rate 3e-3
sft_tracks_cpu sft_lora --learning-rate 1e-2 --lora-rank 8
# QLoRA: the adapters over a quantized frozen base (the GPU's dequantized bf16 tiles,
# ops/cuda/matmul_quantized.cu, against the CPU's float32 dequantized products)
sft_tracks_cpu sft_qlora_nf4 --learning-rate 1e-2 --lora-rank 8 --quantize nf4
sft_tracks_cpu sft_qlora_q4_0 --learning-rate 1e-2 --lora-rank 8 --quantize q4_0
# DPO: 20 steps of the same pairs on both devices (reference log-probs included)
sft=(dpo --model "$model" --data "$data/pairs.jsonl" --max-seq-len 32 --per-device-train-batch-size 4
     --num-train-epochs 10 --max-steps 20 --eval-every 0 --quiet --threads 4)
sft_tracks_cpu dpo --learning-rate 3e-3
sft=(sft --model "$model" --data "$data/sft.jsonl" --max-seq-len 32 --per-device-train-batch-size 4
     --num-train-epochs 10 --max-steps 20 --eval-every 0 --quiet --threads 4)
# the same on the wmma attention kernels (the CPU run ignores the variable)
export MARLHF_CUDA_ATTENTION=wmma
sft_tracks_cpu sft_wmma_attention --learning-rate 3e-3
unset MARLHF_CUDA_ATTENTION
# Gemma 2 (soft caps: the unfused attention kernels, the capped logits' gradient)
sft=(sft --model tests/fixtures/models/tiny_gemma2_chat --data "$data/sft.jsonl" --max-seq-len 32
     --per-device-train-batch-size 4 --num-train-epochs 10 --max-steps 20 --eval-every 0 --quiet --threads 4)
sft_tracks_cpu sft_gemma2 --learning-rate 3e-3
# Gemma 3 (q/k norms, its sliding layers' own RoPE table; the fused attention kernels)
sft=(sft --model tests/fixtures/models/tiny_gemma3_chat --data "$data/sft.jsonl" --max-seq-len 32
     --per-device-train-batch-size 4 --num-train-epochs 10 --max-steps 20 --eval-every 0 --quiet --threads 4)
sft_tracks_cpu sft_gemma3 --learning-rate 3e-3
# The same Gemma 3 with a sliding window of 8 keys over rows of 32 (the mma kernels' window,
# the unfused fallback's for wmma; a copy of the fixture with its config's window changed)
cp -r tests/fixtures/models/tiny_gemma3_chat "$tmp/gemma3_window8"
python3 - "$tmp/gemma3_window8/config.json" <<'PY'
import json, sys
config = json.load(open(sys.argv[1]))
config["sliding_window"] = 8
json.dump(config, open(sys.argv[1], "w"), indent=2)
PY
sft[2]="$tmp/gemma3_window8"
sft_tracks_cpu sft_gemma3_window --learning-rate 3e-3

# 3. PPO on the GPU: reward model, then 3 iterations with all four models on the device;
#    then with actor and critic adapters (the reference is the actor's base)
stage "reward model and PPO"
timeout 120 "$marlhf" rm --model "$model" --data "$data/pairs.jsonl" --max-seq-len 32 --per-device-train-batch-size 8 \
    --learning-rate 3e-3 --max-steps 6 --output "$tmp/rm" --quiet --device "$device" 2>> "$log"
check rm_on_gpu $? ""
ppo=(ppo --actor-model "$model" --reward-model "$tmp/rm/final" --prompts "$data/sft.jsonl" --eval-prompts "$data/sft_eval.jsonl"
     --eval-count 4 --rollout-batch-size 8 --generation-batch-size 8 --micro-batch-size 4 --max-new-tokens 10
     --max-iterations 3 --actor-learning-rate 1e-3 --critic-learning-rate 1e-3 --min-response-tokens 1 --quiet
     --termination-condition fixed --ngram 5)
ppo_on_gpu() { # ppo_on_gpu NAME OPTIONS...
    local name=$1 rc detail
    shift
    timeout 180 "$marlhf" "${ppo[@]}" "$@" --device "$device" --output "$tmp/$name" 2>> "$log"
    rc=$?
    detail=$(python3 - "$tmp/$name/metrics.jsonl" <<'PY' 2>&1
import json, math, sys
rows = [r for r in map(json.loads, open(sys.argv[1])) if "train/score" in r]
keys = ["train/score", "train/kl", "train/value_loss", "train/policy_loss", "train/device_memory_gib"]
print(" ".join(f"{k.split('/')[1]}={rows[-1].get(k, float('nan')):.4f}" for k in keys), f"iterations={len(rows)}")
sys.exit(0 if len(rows) == 3 and all(math.isfinite(v) for r in rows for v in r.values() if isinstance(v, float)) else 1)
PY
)
    [ $rc -eq 0 ] && [ -f "$tmp/$name/final/actor/model.safetensors" ]
    check "$name" $(( $? | $( [[ "$detail" == *iterations=3* ]] && echo 0 || echo 1 ) )) "($detail)"
    cp "$tmp/$name/metrics.jsonl" "$logs/${name}_metrics.jsonl" 2> /dev/null
}
ppo_on_gpu ppo_on_gpu
ppo_on_gpu ppo_lora_on_gpu --actor-lora-rank 8 --critic-lora-rank 8
ppo_on_gpu ppo_qlora_on_gpu --actor-lora-rank 8 --critic-lora-rank 8 --actor-quantize nf4 --critic-quantize q8_0
ppo_on_gpu grpo_on_gpu --advantage-estimator grpo --samples-per-prompt 2 --termination-condition token
export MARLHF_CUDA_ATTENTION=wmma
ppo_on_gpu ppo_wmma_attention_on_gpu
export MARLHF_CUDA_ATTENTION=mma-ds
ppo_on_gpu ppo_mma_ds_attention_on_gpu
unset MARLHF_CUDA_ATTENTION

# 4. speed, each beside PyTorch eager on the same GPU
summary_speed=""
if [ "$bench" = 1 ]; then
    results="$logs/bench.jsonl"
    : > "$results"
    export PYTHONUNBUFFERED=1
    unset MARLHF_CHECK_GRADIENT_WRITES MARLHF_CHECK_STORED_INPUTS
    stage "speed"
    speed_shapes="smollm2-135m:smollm2 llama-1b:llama1b"
    [ "$quick" = 1 ] && speed_shapes="llama-1b:llama1b" # the shape still behind PyTorch
    for shape in $speed_shapes; do
        ours=${shape%%:*} theirs=${shape##*:}
        bench_run 200 "$results" "$train_step" --device cuda --model "$ours" --batch 8 --seq 1024 --steps 10
        bench_run 200 "$results" "$train_step" --device cuda --model "$ours" --batch 8 --seq 1024 --steps 10 \
            --attention mma-plain
        bench_run 200 "$results" "$train_step" --device cuda --model "$ours" --batch 8 --seq 1024 --steps 10 \
            --attention mma-ds
        for attention in wmma unfused; do
            [ "$quick" = 1 ] || bench_run 200 "$results" "$train_step" --device cuda --model "$ours" --batch 8 --seq 1024 \
                --steps 10 --attention $attention
        done
        # --profile-steps: 3 more steps under torch.profiler, where PyTorch's kernel time goes by
        # kind ("pytorch-eager-profile"), beside ops_breakdown's "kinds_ms_per_step" below.
        bench_run 200 "$results" python3 bench/torch_gpu_train_step.py --shape "$theirs" --batch 8 --seq 1024 --steps 10 \
            --warmup 3 --device cuda --profile-steps 3
    done
    # Both steps clip the gradient norm to 1 (the default of each); the 1B pair again
    # without it (PyTorch's peer clipped nothing before 2026-12-05; not in the quick bench,
    # which has the fused q/k/v product's pair below in its time instead).
    [ "$quick" = 1 ] || bench_run 200 "$results" "$train_step" --device cuda --model llama-1b --batch 8 --seq 1024 \
        --steps 10 --max-grad-norm 0
    # The 1B step with the stored buffers turned into plain holds (src/ops/ops.h, hold_stored):
    # the session-40 change measured against what came before it.
    bench_run 200 "$results" env MARLHF_CUDA_STORED_INPUTS=0 "$train_step" --device cuda --model llama-1b --batch 8 \
        --seq 1024 --steps 10
    # The 1B step with q, k and v as three products (MARLHF_FUSED_QKV=0, model/transformer.c's
    # layer_fuses_qkv): the session-48 change against what came before it ("fused_qkv": false).
    bench_run 200 "$results" env MARLHF_FUSED_QKV=0 "$train_step" --device cuda --model llama-1b --batch 8 \
        --seq 1024 --steps 10
    [ "$quick" = 1 ] || bench_run 200 "$results" python3 bench/torch_gpu_train_step.py --shape llama1b --batch 8 \
        --seq 1024 --steps 10 --warmup 3 --device cuda --max-grad-norm 0
    # Decoding with the float weights (a batch-1 step's products are matvec_bf16.cuh's since
    # session 47; predicted near Q8_0's rate, 361 tok/s on 2026-12-04), greedy: each step's
    # tokens from the device (model_last_greedy, session 49), where 2026-12-04's copied the
    # logits; then sampled as PPO's rollouts are (temperature 0.8, top-k 50: the candidates
    # from the device, model_last_candidates); then as an OpenAI request samples by default
    # (temperature 1, no top-k: each row drawn over the whole vocabulary on the device since
    # session 50, model_last_sampled; before, the [B, V] logits were copied and sampled on the host).
    bench_run 200 "$results" "$decode" --device cuda --shape smollm2-135m --batches 1,64 --new 128 --prompt 32
    bench_run 200 "$results" "$decode" --device cuda --shape smollm2-135m --batches 1,64 --new 128 --prompt 32 \
        --temperature 0.8 --top-k 50
    bench_run 200 "$results" "$decode" --device cuda --shape smollm2-135m --batches 1,64 --new 128 --prompt 32 \
        --temperature 1 --top-k 0
    # quantized weights: the decode kernel (matvec_quantized.cuh, batches of up to 8) and the
    # tiles (64), and the float32 buffer without the quantized slots (float_params_mb)
    for quantize in q8_0 q4_k_m q5_k_m; do
        [ "$quick" = 1 ] || bench_run 200 "$results" "$decode" --device cuda --shape smollm2-135m --quantize $quantize \
            --batches 1,8,64 --new 128 --prompt 32
    done
    for batch in 1 64; do
        [ "$quick" = 1 ] || bench_run 200 "$results" python3 bench/torch_gpu_decode.py --shape smollm2 --batch $batch \
            --prompt-len 32 --new-tokens 128 --device cuda
        [ "$quick" = 1 ] || bench_run 200 "$results" python3 bench/torch_gpu_decode.py --shape smollm2 --batch $batch \
            --prompt-len 32 --new-tokens 128 --device cuda --temperature 0.8 --top-k 50
    done
    cat "$results" | tee -a "$log"
    # Op-by-op breakdown of the same steps (bench/ops_breakdown.c), into its own file.
    stage "op-by-op breakdown"
    shapes="smollm2-135m llama-1b" attentions="mma mma-plain mma-ds wmma"
    [ "$quick" = 1 ] && shapes=llama-1b attentions="mma mma-plain mma-ds"
    for shape in $shapes; do
        for attention in $attentions; do
            bench_run 120 "$logs/ops_breakdown.jsonl" "$ops_breakdown" --device cuda --model $shape --batch 8 --seq 1024 \
                --attention $attention
        done
    done
    grep -hs 'modelled\|kinds_ms_per_step\|"attention backward\|"attention forward\|attention_kernel\|attention_probe' \
        "$logs/ops_breakdown.jsonl" | tee -a "$log"
    grep -hs '"pytorch-eager-profile"' "$results" | cut -c1-400 | tee -a "$log"
    # Last (the first to go at --time-limit): the cached attention (attention_cached.cuh) over
    # each kind of KV cache, decoding after a long prompt.
    # The float32 cache also in the quick bench: the split runs of keys (flash-decoding, session
    # 50) are for long contexts at small batches. transformers at the same length (full bench).
    stage "decode on each KV cache"
    for kv_cache in f32 f16 q8_0; do
        [ "$quick" = 1 ] && [ $kv_cache != f32 ] && continue
        bench_run 200 "$results" "$decode" --device cuda --shape smollm2-135m --kv-cache $kv_cache \
            --batches 1,64 --new 64 --prompt 1024
    done
    for batch in 1 64; do
        [ "$quick" = 1 ] || bench_run 200 "$results" python3 bench/torch_gpu_decode.py --shape smollm2 --batch $batch \
            --prompt-len 1024 --new-tokens 64 --device cuda
    done
    grep -hs '"prompt": 1024\|"prompt_len": 1024' "$results" | tee -a "$log"
    summary_speed=$(python3 - "$results" <<'PY' 2>&1
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
def find(impl, **kv):
    for r in rows:
        if r.get("impl") == impl and all(r.get(k) == v for k, v in kv.items()):
            return r
    return {}
def rate(r, key): # a figure, or n/a for a benchmark skipped or failed
    return f"{r[key]:.0f}" if key in r else "n/a"
def gib(r): # the most device memory the run held (bench/device_memory.h, PyTorch's max_memory_allocated)
    return f"{r['peak_mem_gib']:.1f}" if r.get("peak_mem_gib") is not None else "n/a"
parts = []
for ours, theirs in [("smollm2-135m", "smollm2"), ("llama-1b", "llama1b")]:
    m, t = find("marlhf-cuda", model=ours), find("pytorch-eager", shape=theirs)
    u, a = find("marlhf-cuda-unfused", model=ours), find("marlhf-cuda-wmma", model=ours)
    p = find("marlhf-cuda-mma-plain", model=ours)
    s = find("marlhf-cuda-mma-ds", model=ours)
    three = find("marlhf-cuda", model=ours, fused_qkv=False) # MARLHF_FUSED_QKV=0 (the 1B shape only)
    unstored = find("marlhf-cuda", model=ours, stored_inputs=False)
    mfu = lambda r: f"{100 * r['mfu']:.1f}%" if "mfu" in r else "n/a"
    parts.append(f"{ours} step {rate(m, 'tokens_per_s')} tok/s MFU {mfu(m)} "
                 f"(mma-plain {rate(p, 'tokens_per_s')}, mma-ds {rate(s, 'tokens_per_s')}, wmma {rate(a, 'tokens_per_s')}, unfused {rate(u, 'tokens_per_s')}; "
                 f"q/k/v as three products {rate(three, 'tokens_per_s')}, stores off {rate(unstored, 'tokens_per_s')}) "
                 f"vs pytorch {rate(t, 'tokens_per_s')} tok/s MFU {mfu(t)}; peak memory {gib(m)} vs {gib(t)} GiB")
for batch in (1, 64):
    m, t = find("marlhf-cuda", batch=batch, quantize="none", prompt=32, temperature=0), find("transformers-generate", batch=batch, temperature=0, prompt_len=32)
    sampled = find("marlhf-cuda", batch=batch, quantize="none", prompt=32, temperature=0.8)
    whole_row = find("marlhf-cuda", batch=batch, quantize="none", prompt=32, temperature=1, top_k=0)
    sampled_peer = find("transformers-generate", batch=batch, temperature=0.8)
    q8, qk = find("marlhf-cuda", batch=batch, quantize="q8_0"), find("marlhf-cuda", batch=batch, quantize="q4_k_m")
    q5 = find("marlhf-cuda", batch=batch, quantize="q5_k_m")
    key = "decode_tokens_per_s"
    parts.append(f"decode B{batch} {rate(m, key)} vs {rate(t, key)} tok/s ({gib(m)} vs {gib(t)} GiB) "
                 f"(q8_0 {rate(q8, key)}, q4_k_m {rate(qk, key)}, q5_k_m {rate(q5, key)}; top-k 50 {rate(sampled, key)} vs {rate(sampled_peer, key)}; temperature 1 no top-k {rate(whole_row, key)})")
    caches = [(kv, find("marlhf-cuda", batch=batch, quantize="none", prompt=1024, kv_cache=kv)) for kv in ("f32", "f16", "q8_0")]
    long_peer = find("transformers-generate", batch=batch, prompt_len=1024)
    parts.append(f"after 1024 prompt tokens B{batch} " +
                 ", ".join(f"{kv} cache {rate(r, key)}" for kv, r in caches) + f" vs {rate(long_peer, key)} tok/s")
print("; ".join(parts))
PY
)
fi
say "gpu checks: $passed passed, $failed failed${summary_speed:+; $summary_speed}; ${SECONDS} s$( [ "$skipped" -gt 0 ] && echo "; $skipped benchmarks skipped at --time-limit")"
[ "$failed" -eq 0 ]
