# tests/gpu/run.sh's steps 1-3, sourced by it (its variables, binaries and helpers: check,
# say, stage; its totals `passed` and `failed`): every op and the models against the CPU,
# SFT and DPO steps tracking the CPU's, reward model and PPO runs on the device.
# Skipped with --bench-only.
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
# The frozen reference and reward models in bf16 (2 bytes a weight, no float32 copy on the GPU)
ppo_on_gpu ppo_bf16_frozen_on_gpu --reference-quantize bf16 --reward-quantize bf16
ppo_on_gpu grpo_on_gpu --advantage-estimator grpo --samples-per-prompt 2 --termination-condition token
export MARLHF_CUDA_ATTENTION=wmma
ppo_on_gpu ppo_wmma_attention_on_gpu
export MARLHF_CUDA_ATTENTION=mma-ds
ppo_on_gpu ppo_mma_ds_attention_on_gpu
unset MARLHF_CUDA_ATTENTION
