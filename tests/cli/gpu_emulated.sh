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
# say SKIP), races between streams in orders other than issue order and the side stream's
# latest (the attention groups run both ways). Its PASS/FAIL lines are test_cuda's, prefixed
# "gpu_emulated/", then an SFT run of marlhf_emulated with --device cuda against the CPU's,
# and SFT and PPO on 2 MPI ranks with --device cuda against one process, through host
# memory and through (emulated) NCCL. Built only where
# nvcc is (the plain build): says SKIP elsewhere.
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
# The groups that run the mma attention backward (its dQ kernel on a side stream beside
# dK/dV) with the side stream's kernels run as late as a GPU may run them
# (MARLHF_EMULATED_STREAMS=late, emulated_runtime.h): a missing join or event then gives
# wrong gradients here, where in issue order it cannot show.
MARLHF_EMULATED_STREAMS=late run_test_cuda gpu_emulated_streams_late 4 "$harness" test_attention test_attention_rotary \
    test_attention_backward_overlap test_fixture_models
streams_status=$?
# marlhf itself with --device cuda on the emulated backend: 20 SFT steps of the tiny model
# track the CPU's losses, as tests/gpu/run.sh checks on a GPU (MARLHF_GPU_TEST_DEVICE=emulated
# runs all of that script's runs this way). The device's memory is closed to host code
# there (MARLHF_EMULATED_DEVICE_CLOSED, tests/emulated_cuda/emulated_runtime.h): the steps
# and the checkpoint's save touch it only through the backend's copies.
emulated_bin="$(dirname "$bin")/marlhf_emulated"
sft=(sft --model tests/fixtures/models/tiny_chat --data tests/fixtures/train/sft.jsonl --max-seq-len 32
     --per-device-train-batch-size 4 --num-train-epochs 10 --max-steps 20 --eval-every 0 --quiet --threads 1
     --learning-rate 3e-3)
if "$emulated_bin" "${sft[@]}" --device cpu --output "$tmp/sft-cpu" 2> "$tmp/sft-cpu.err" &&
    MARLHF_EMULATED_DEVICE_CLOSED=1 "$emulated_bin" "${sft[@]}" --device cuda --output "$tmp/sft-cuda" 2> "$tmp/sft-cuda.err"; then
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
# Packed SFT (--packing: rows of 64 tokens, the examples side by side, each attending to
# itself only; model/packed_attention.c) tracks the CPU's packed run in the same way.
packed=("${sft[@]}" --max-seq-len 64 --packing --max-steps 6)
if "$emulated_bin" "${packed[@]}" --device cpu --output "$tmp/packed-cpu" 2> "$tmp/packed-cpu.err" &&
    MARLHF_EMULATED_DEVICE_CLOSED=1 "$emulated_bin" "${packed[@]}" --device cuda --output "$tmp/packed-cuda" \
        2> "$tmp/packed-cuda.err" &&
    python3 - "$(json_values "$tmp/packed-cpu/metrics.jsonl" train/loss)" \
        "$(json_values "$tmp/packed-cuda/metrics.jsonl" train/loss)" <<'PY'; then
import sys
cpu, gpu = [list(map(float, s.split())) for s in sys.argv[1:3]]
worst = max(abs(g - c) / abs(c) for c, g in zip(cpu, gpu)) if len(cpu) == len(gpu) > 0 else float("inf")
print(f"# packed sft on the emulated GPU: {len(gpu)} steps, loss {gpu[0]:.4f} -> {gpu[-1]:.4f}, worst relative difference {worst:.2e}")
sys.exit(0 if worst <= 2e-2 else 1)
PY
    pass gpu_emulated_packed_sft_tracks_cpu
else
    fail gpu_emulated_packed_sft_tracks_cpu "$(tail -n 2 "$tmp"/packed-*.err)"
fi
# The same runs' logs: on the device every line says the most device memory held since the
# one before (train/device_memory_gib: at least cuBLASLt's 64 MiB workspace and the model),
# on the CPU none does.
cuda_memory=$(json_values "$tmp/sft-cuda/metrics.jsonl" train/device_memory_gib 2> /dev/null)
cpu_memory=$(json_values "$tmp/sft-cpu/metrics.jsonl" train/device_memory_gib 2> /dev/null)
if [ "$(echo $cuda_memory | wc -w)" = 20 ] && [ -z "$cpu_memory" ] &&
    python3 -c "import sys; sys.exit(0 if all(v > 0.0625 for v in map(float, sys.argv[1:])) else 1)" $cuda_memory; then
    pass "gpu_emulated_sft_logs_device_memory ($(echo $cuda_memory | cut -d' ' -f1) GiB)"
else
    fail gpu_emulated_sft_logs_device_memory "cuda [$cuda_memory] cpu [$cpu_memory]"
fi
# A GPU without room (the emulated device made smaller, MARLHF_EMULATED_MEMORY_MIB,
# tests/emulated_cuda/emulated_runtime.h): one line naming what was asked for and what is
# free, exit status 2 -- too small for cuBLASLt's 64 MiB workspace, then too small for the
# run's 69 MiB.
expect_error gpu_emulated_out_of_memory_at_open "asked for cuBLASLt's workspace, 32.0 MiB free of 32.0 MiB" \
    env MARLHF_EMULATED_MEMORY_MIB=32 "$emulated_bin" "${sft[@]}" --device cuda --output "$tmp/sft-small-gpu"
expect_error gpu_emulated_out_of_memory "out of GPU memory" \
    env MARLHF_EMULATED_MEMORY_MIB=66 "$emulated_bin" "${sft[@]}" --device cuda --output "$tmp/sft-small-gpu"

# A reward model trained on the device (rm --device cuda), then inference with rewards: the
# pairs' own responses scored (--ref-scores), and greedy responses generated and scored,
# on the device against the CPU. Greedy tokens can differ where two are nearly tied (bf16
# against fp32): rows whose responses differ are counted, not compared (at most 1 in 8).
data=tests/fixtures/train
"$emulated_bin" rm --model tests/fixtures/models/tiny_chat --data "$data/pairs.jsonl" --max-seq-len 32 \
    --per-device-train-batch-size 8 --learning-rate 3e-3 --max-steps 6 --output "$tmp/dp-rm" --quiet --threads 1 \
    --device cuda 2> "$tmp/rm.err" || fail gpu_emulated_rm_runs "$(tail -n 1 "$tmp/rm.err")"
for device in cpu cuda; do
    "$emulated_bin" infer --ref-scores --reward-model "$tmp/dp-rm/final" --data "$data/pairs.jsonl" --no-shuffle \
        --batch-size 4 --device $device --output "$tmp/ref-scores-$device.jsonl" 2> "$tmp/infer.err" &&
        "$emulated_bin" infer --model tests/fixtures/models/tiny_chat --reward-model "$tmp/dp-rm/final" \
            --data "$data/pairs.jsonl" --no-shuffle --temperature 0 --max-new-tokens 4 --batch-size 4 --device $device \
            --output "$tmp/infer-$device.jsonl" 2>> "$tmp/infer.err" ||
        fail "gpu_emulated_infer_runs_$device" "$(tail -n 1 "$tmp/infer.err")"
done
if python3 - "$tmp" <<'PY'; then
import json, sys
rows = {name: [json.loads(line) for line in open(f"{sys.argv[1]}/{name}.jsonl")]
        for name in ("ref-scores-cpu", "ref-scores-cuda", "infer-cpu", "infer-cuda")}
def far(a, b):
    return abs(a - b) > 5e-2 * max(1.0, abs(a))  # bf16 products on the device (test_cuda's values: 3e-2)
cpu, gpu = rows["ref-scores-cpu"], rows["ref-scores-cuda"]
assert len(cpu) == len(gpu) == 48, (len(cpu), len(gpu))
worst = max(max(abs(c["reward"] - g["reward"]), abs(c["rejected_reward"] - g["rejected_reward"])) for c, g in zip(cpu, gpu))
assert not any(far(c["reward"], g["reward"]) or far(c["rejected_reward"], g["rejected_reward"]) for c, g in zip(cpu, gpu)), worst
cpu, gpu = rows["infer-cpu"], rows["infer-cuda"]
same = [(c, g) for c, g in zip(cpu, gpu) if c["response"] == g["response"]]
assert len(cpu) == len(gpu) == 48 and len(same) >= 42, (len(cpu), len(gpu), len(same))
worst_generated = max(abs(c["reward"] - g["reward"]) for c, g in same)
assert not any(far(c["reward"], g["reward"]) for c, g in same), worst_generated
print(f"# infer on the emulated GPU: reference rewards within {worst:.2e} of the CPU's, "
      f"{len(same)}/48 greedy responses the same, their rewards within {worst_generated:.2e}")
PY
    pass gpu_emulated_infer_rewards_track_cpu
else
    fail gpu_emulated_infer_rewards_track_cpu "see above"
fi

# What a decode step asks of the host: its kernel launches and cuBLASLt products, counted by
# the emulation (MARLHF_EMULATED_COUNT_LAUNCHES=1), as the difference between 20 and 10
# greedy tokens of the 2-layer model after a short prompt. A batch-1 step's products are
# matvec_bf16.cuh's (no cuBLASLt call: each cost about as much host time as the GPU spends
# on the product); 29 launches a token when written (13 a layer, and the embedding, final
# norm and LM head), 23 since a layer's q, k and v products and its gate and up products are
# one launch each (matmul_forward_parts), 21 since a layer's RoPE of q and of k and its two
# cache writes (2 kernels and 2 copies, which are not counted here) are one kernel
# (rotate_and_cache_write). More is a step that got slower on a GPU: say why where it is added.
# (--min-new-tokens keeps every counted step on the host's sampler; a greedy step past it
# adds the log-prob kernel's argmax, model_last_greedy, in place of the logits' copy.)
launches_for() {
    MARLHF_EMULATED_COUNT_LAUNCHES=1 "$emulated_bin" generate --model tests/fixtures/models/tiny_chat --device cuda \
        --greedy --max-new-tokens "$1" --min-new-tokens "$1" "hello" 2>&1 > /dev/null |
        sed -n 's/^emulation: \([0-9]*\) kernel launches, \([0-9]*\) cuBLASLt products$/\1 \2/p'
}
read -r kernels_10 products_10 <<< "$(launches_for 10)"
read -r kernels_20 products_20 <<< "$(launches_for 20)"
if [ -n "$kernels_10" ] && [ -n "$kernels_20" ]; then
    per_token=$(((kernels_20 - kernels_10) / 10)) products_per_token=$(((products_20 - products_10) / 10))
    [ "$per_token" -le 21 ] && [ "$products_per_token" = 0 ] &&
        pass "gpu_emulated_decode_step_launches ($per_token kernels, $products_per_token cuBLASLt products a token)" ||
        fail gpu_emulated_decode_step_launches "$per_token kernels and $products_per_token cuBLASLt products a token"
else
    fail gpu_emulated_decode_step_launches "no counts: $(launches_for 10 | head -n 2)"
fi

# Data parallelism with --device cuda (docs/distributed.md): each rank's gradients leave the
# device for MPI's sum and come back, and the weights are broadcast the same way
# (dist/model_sync.c). Untested on GPUs (the lent machine has one GPU and no mpirun); here
# on the emulated one: 2 ranks x 1 micro-batch against one process accumulating 2, as
# data_parallel.sh checks on the CPU. The tolerances are wider than the CPU's: the two sum
# a step's gradients in another order, and where that moves a weight across a bf16
# rounding boundary the GPU's bf16 copy of it moves by a whole bf16 step (measured here:
# PPO's gradient norms within 5e-4 after 3 iterations; SFT's losses the same to 1e-6 when
# g++ fused multiply-adds in the emulated kernels, and from step 10 on within 3e-5 since
# they are built without, -ffp-contract=off: which step crosses a boundary is chance, so
# the bound is 2e-4).
if command -v mpirun > /dev/null && ldd "$emulated_bin" 2> /dev/null | grep -q libmpi; then
    mpi_test_environment
    echo '{"ids": [1, 5, 9, 14, 2, 33, 7, 12, 40, 3]}' > "$tmp/ids.jsonl"
    # same_final_model NAME ONE TWO: the two final models' log-probs (the CPU's) within 1e-3
    same_final_model() {
        "$bin" logprobs --model "$2" --input "$tmp/ids.jsonl" > "$tmp/$1_one.logprobs" 2> /dev/null &&
            "$bin" logprobs --model "$3" --input "$tmp/ids.jsonl" > "$tmp/$1_two.logprobs" 2> /dev/null &&
            logprobs_close "$tmp/$1_one.logprobs" "$tmp/$1_two.logprobs" 1e-3 2> /dev/null
    }
    dp_sft=(sft --model tests/fixtures/models/tiny_chat --data tests/fixtures/train/sft.jsonl --max-seq-len 32
            --per-device-train-batch-size 4 --num-train-epochs 3 --eval-every 0 --quiet --threads 1
            --learning-rate 3e-3 --device cuda)
    "$emulated_bin" "${dp_sft[@]}" --gradient-accumulation-steps 2 --output "$tmp/dp-sft-one" 2> "$tmp/dp-sft-one.err"
    # (device memory closed to host code: the sums' staging goes through the backend's copies)
    MARLHF_EMULATED_DEVICE_CLOSED=1 ranks 2 "$emulated_bin" "${dp_sft[@]}" --output "$tmp/dp-sft-two" 2> "$tmp/dp-sft-two.err"
    ranks 2 "$emulated_bin" "${dp_sft[@]}" --output "$tmp/dp-sft-again" 2> /dev/null
    one=$(json_values "$tmp/dp-sft-one/metrics.jsonl" train/loss 2> /dev/null)
    two=$(json_values "$tmp/dp-sft-two/metrics.jsonl" train/loss 2> /dev/null)
    [ "$(echo "$one" | wc -w)" = 18 ] && close "$one" "$two" 2e-4 &&
        same_final_model sft "$tmp/dp-sft-one/final" "$tmp/dp-sft-two/final" &&
        pass "gpu_emulated_sft_two_ranks_same_training (18 steps)" ||
        fail gpu_emulated_sft_two_ranks_same_training "one process: [$one] two ranks: [$two] $(tail -n 1 "$tmp/dp-sft-two.err")"
    cmp -s "$tmp/dp-sft-two/final/model.safetensors" "$tmp/dp-sft-again/final/model.safetensors" &&
        pass gpu_emulated_sft_two_ranks_bit_identical_rerun ||
        fail gpu_emulated_sft_two_ranks_bit_identical_rerun "final weights differ"
    # PPO: the actor, reference, critic and reward model on the device in every rank; the
    # paths that need the whole rollout (normalised rewards, whitened advantages, two
    # minibatches, EMA, PTX) gather it across the ranks. Greedy rollouts (--top-k 1): a
    # sampled token sits on a threshold that a bf16 step of a weight can move it across,
    # and then the runs part (sampled, they did by the 2nd or the 4th iteration).
    dp_ppo=(ppo --actor-model tests/fixtures/models/tiny_chat --reward-model "$tmp/dp-rm/final" --prompts "$data/sft.jsonl"
            --rollout-batch-size 8 --generation-batch-size 8 --micro-batch-size 2 --max-new-tokens 10
            --max-iterations 3 --actor-learning-rate 1e-3 --critic-learning-rate 1e-3 --min-response-tokens 3
            --threads 1 --quiet --device cuda --termination-condition fixed --ngram 3 --normalize-reward
            --whiten-advantages --num-minibatches 2 --ppo-epochs 2 --enable-ema --ptx-data "$data/sft.jsonl"
            --ptx-coef 0.5 --top-k 1)
    # same_actor_and_critic A B: two PPO runs' final actor and critic, bit for bit
    same_actor_and_critic() {
        cmp -s "$1/final/actor/model.safetensors" "$2/final/actor/model.safetensors" &&
            cmp -s "$1/final/critic/model.safetensors" "$2/final/critic/model.safetensors"
    }
    "$emulated_bin" "${dp_ppo[@]}" --output "$tmp/dp-ppo-one" 2> "$tmp/dp-ppo-one.err"
    ranks 2 "$emulated_bin" "${dp_ppo[@]}" --output "$tmp/dp-ppo-two" 2> "$tmp/dp-ppo-two.err"
    ppo_differs=
    for key in train/score train/policy_loss train/value_loss train/actor_grad_norm train/critic_grad_norm; do
        one=$(json_values "$tmp/dp-ppo-one/metrics.jsonl" $key 2> /dev/null)
        two=$(json_values "$tmp/dp-ppo-two/metrics.jsonl" $key 2> /dev/null)
        [ "$(echo "$one" | wc -w)" = 3 ] && close "$one" "$two" 3e-3 || ppo_differs+=" $key: [$one] vs [$two]"
    done
    # each iteration's line says the device memory of the rank that held the most
    [ "$(json_values "$tmp/dp-ppo-two/metrics.jsonl" train/device_memory_gib 2> /dev/null | wc -w)" = 3 ] ||
        ppo_differs+=" train/device_memory_gib: not on every line"
    [ -z "$ppo_differs" ] && same_final_model ppo "$tmp/dp-ppo-one/final/actor" "$tmp/dp-ppo-two/final/actor" &&
        pass "gpu_emulated_ppo_two_ranks_same_training (3 iterations)" ||
        fail gpu_emulated_ppo_two_ranks_same_training "${ppo_differs:-the final actors differ in log-probs} $(tail -n 1 "$tmp/dp-ppo-two.err")"

    # NCCL (dist/model_sync.c, ops/cuda/collectives.cu; here tests/emulated_cuda/nccl.cpp,
    # whose sums are MPI's on the device memory, so the same bits as the host path). The
    # runs above had one emulated GPU for both ranks: NCCL cannot pair two ranks on one GPU,
    # so they summed through host memory and said why. With a GPU each
    # (MARLHF_EMULATED_DEVICES=2) and NCCL required, SFT (device memory closed to host code)
    # and PPO give the host path's bits; the collectives themselves on 2 ranks
    # (tests/gpu/test_collectives.c); NCCL required where the ranks share a GPU is refused
    # on every rank before anything is written. Through NCCL the sums are taken during the
    # last backward of each step, on the collectives' stream (dist/backward_sums.h): those
    # runs have the emulation's late streams (MARLHF_EMULATED_STREAMS=late), where a sum
    # that the step's readers did not wait for has not happened yet.
    grep -q "through host memory (MPI): ranks 0 and 1 share the GPU" "$tmp/dp-sft-two.err" &&
        pass gpu_emulated_nccl_auto_says_ranks_share_a_gpu ||
        fail gpu_emulated_nccl_auto_says_ranks_share_a_gpu "$(head -n 3 "$tmp/dp-sft-two.err")"
    MARLHF_EMULATED_STREAMS=late MARLHF_EMULATED_DEVICES=2 MARLHF_NCCL=1 MARLHF_EMULATED_DEVICE_CLOSED=1 \
        ranks 2 "$emulated_bin" "${dp_sft[@]}" --output "$tmp/nccl-sft" 2> "$tmp/nccl-sft.err"
    grep -q "2 ranks sum gradients on their GPUs with NCCL" "$tmp/nccl-sft.err" &&
        cmp -s "$tmp/dp-sft-two/final/model.safetensors" "$tmp/nccl-sft/final/model.safetensors" &&
        pass gpu_emulated_nccl_sft_same_bits_as_host_sums ||
        fail gpu_emulated_nccl_sft_same_bits_as_host_sums "$(head -n 3 "$tmp/nccl-sft.err")"
    MARLHF_EMULATED_STREAMS=late MARLHF_EMULATED_DEVICES=2 MARLHF_NCCL=1 ranks 2 "$emulated_bin" "${dp_ppo[@]}" \
        --output "$tmp/nccl-ppo" 2> "$tmp/nccl-ppo.err"
    grep -q "with NCCL" "$tmp/nccl-ppo.err" &&
        same_actor_and_critic "$tmp/dp-ppo-two" "$tmp/nccl-ppo" &&
        pass gpu_emulated_nccl_ppo_same_bits_as_host_sums ||
        fail gpu_emulated_nccl_ppo_same_bits_as_host_sums "$(head -n 3 "$tmp/nccl-ppo.err")"
    collectives="$(dirname "$bin")/tests/gpu/test_collectives_emulated"
    MARLHF_EMULATED_STREAMS=late MARLHF_EMULATED_DEVICES=2 ranks 2 "$collectives" > "$tmp/collectives.out" 2>&1 &&
        [ "$(grep -c '^PASS ' "$tmp/collectives.out")" = 10 ] &&
        pass "gpu_emulated_collectives_two_ranks (sum, reduce, broadcast, stale weight copy, beside and join)" ||
        fail gpu_emulated_collectives_two_ranks "$(grep -v '^#' "$tmp/collectives.out" | head -n 5)"
    MARLHF_NCCL=1 ranks 2 "$emulated_bin" "${dp_sft[@]}" --output "$tmp/nccl-refused" > /dev/null 2> "$tmp/nccl-refused.err"
    rc=$?
    errors=$(grep -c "^marlhf: error: " "$tmp/nccl-refused.err")
    [ "$rc" = 2 ] && [ "$errors" = 2 ] && [ ! -e "$tmp/nccl-refused" ] &&
        [ "$(grep "^marlhf: error: " "$tmp/nccl-refused.err" | grep -c "MARLHF_NCCL=1 .*share the GPU")" = 2 ] &&
        pass gpu_emulated_nccl_required_refused_when_ranks_share_a_gpu ||
        fail gpu_emulated_nccl_required_refused_when_ranks_share_a_gpu "exit $rc, $errors error lines: $(head -n 2 "$tmp/nccl-refused.err")"
    # The sums in the backward are taken in the last round of micro-batches of a step only
    # (the earlier ones add into the gradients); a rank with no micro-batch in that round
    # issues its zeros' sums at the round's end. 2 accumulation steps of 7 examples: 7
    # micro-batches an epoch, so every other step's last round has one for rank 0 only.
    # Through NCCL (ZeRO-1 too) the host path's bits.
    accumulated=("${dp_sft[@]}" --per-device-train-batch-size 7 --gradient-accumulation-steps 2)
    MARLHF_EMULATED_DEVICES=2 MARLHF_NCCL=0 ranks 2 "$emulated_bin" "${accumulated[@]}" \
        --output "$tmp/accumulated-host" 2> "$tmp/accumulated-host.err"
    for stage in 0 1; do
        MARLHF_EMULATED_STREAMS=late MARLHF_EMULATED_DEVICES=2 MARLHF_NCCL=1 ranks 2 "$emulated_bin" \
            "${accumulated[@]}" --zero-stage $stage --output "$tmp/accumulated-nccl-$stage" 2> "$tmp/accumulated-nccl-$stage.err"
        [ -s "$tmp/accumulated-host/final/model.safetensors" ] && grep -q "with NCCL" "$tmp/accumulated-nccl-$stage.err" &&
            cmp -s "$tmp/accumulated-host/final/model.safetensors" "$tmp/accumulated-nccl-$stage/final/model.safetensors" &&
            pass "gpu_emulated_nccl_accumulation_stage${stage}_same_bits_as_host_sums" ||
            fail "gpu_emulated_nccl_accumulation_stage${stage}_same_bits_as_host_sums" \
                "$(head -n 3 "$tmp/accumulated-nccl-$stage.err") $(tail -n 1 "$tmp/accumulated-host.err")"
    done
    # Three ranks, a GPU each: ZeRO-1's spans reduced onto three owners. MPI adds three
    # ranks' values in an order that depends on the message's length (the whole buffer on
    # the host path, a span at a time here), so the losses agree to rounding, not in bits.
    three=("${dp_sft[@]}" --per-device-train-batch-size 5 --gradient-accumulation-steps 2 --num-train-epochs 2)
    MARLHF_EMULATED_DEVICES=3 MARLHF_NCCL=0 ranks 3 "$emulated_bin" "${three[@]}" --output "$tmp/three-host" \
        2> "$tmp/three-host.err"
    host_losses=$(json_values "$tmp/three-host/metrics.jsonl" train/loss 2> /dev/null)
    for stage in 0 1; do
        MARLHF_EMULATED_STREAMS=late MARLHF_EMULATED_DEVICES=3 MARLHF_NCCL=1 ranks 3 "$emulated_bin" "${three[@]}" \
            --zero-stage $stage --output "$tmp/three-nccl-$stage" 2> "$tmp/three-nccl-$stage.err"
        nccl_losses=$(json_values "$tmp/three-nccl-$stage/metrics.jsonl" train/loss 2> /dev/null)
        [ "$(echo "$host_losses" | wc -w)" = 4 ] && grep -q "3 ranks sum gradients on their GPUs with NCCL" "$tmp/three-nccl-$stage.err" &&
            close "$host_losses" "$nccl_losses" 1e-5 &&
            pass "gpu_emulated_nccl_three_ranks_stage${stage}_tracks_host_sums" ||
            fail "gpu_emulated_nccl_three_ranks_stage${stage}_tracks_host_sums" \
                "host: [$host_losses] NCCL: [$nccl_losses] $(head -n 3 "$tmp/three-nccl-$stage.err")"
    done

    # ZeRO-1 on the device (dist/zero.c: each rank's shard of the moments in device memory,
    # the reduce-scatter and the all-gather through host buffers): the same bits as the
    # whole optimizer on 2 ranks, the moments' file included; resumed from its first
    # checkpoint (the shards loaded back into device memory) to the same bits again.
    MARLHF_EMULATED_DEVICE_CLOSED=1 ranks 2 "$emulated_bin" "${dp_sft[@]}" --zero-stage 1 --save-every 6 --keep-last 3 \
        --output "$tmp/zero1-sft" 2> "$tmp/zero1-sft.err"
    cmp -s "$tmp/dp-sft-two/final/model.safetensors" "$tmp/zero1-sft/final/model.safetensors" &&
        cmp -s "$tmp/dp-sft-two/checkpoint-18/optimizer.safetensors" "$tmp/zero1-sft/checkpoint-18/optimizer.safetensors" &&
        pass gpu_emulated_zero1_sft_same_bits ||
        fail gpu_emulated_zero1_sft_same_bits "final weights or moments differ: $(tail -n 1 "$tmp/zero1-sft.err")"
    cp "$tmp/zero1-sft/final/model.safetensors" "$tmp/zero1-sft-straight.safetensors"
    rm -rf "$tmp/zero1-sft/final" "$tmp/zero1-sft/checkpoint-18" "$tmp/zero1-sft/checkpoint-12"
    ranks 2 "$emulated_bin" "${dp_sft[@]}" --zero-stage 1 --save-every 6 --keep-last 3 --output "$tmp/zero1-sft" \
        --resume 2> "$tmp/zero1-resume.err"
    cmp -s "$tmp/zero1-sft-straight.safetensors" "$tmp/zero1-sft/final/model.safetensors" &&
        pass gpu_emulated_zero1_sft_resume_same_bits ||
        fail gpu_emulated_zero1_sft_resume_same_bits "$(tail -n 1 "$tmp/zero1-resume.err")"
    ranks 2 "$emulated_bin" "${dp_ppo[@]}" --zero-stage 1 --output "$tmp/zero1-ppo" 2> "$tmp/zero1-ppo.err"
    same_actor_and_critic "$tmp/dp-ppo-two" "$tmp/zero1-ppo" &&
        pass gpu_emulated_zero1_ppo_same_bits ||
        fail gpu_emulated_zero1_ppo_same_bits "final actor or critic differ: $(tail -n 1 "$tmp/zero1-ppo.err")"
    # ZeRO-1 with NCCL: each shard's sums reduced onto its rank and each updated shard
    # broadcast from it in device memory (dist/zero.c): the same bits again, moments too.
    MARLHF_EMULATED_DEVICES=2 MARLHF_NCCL=1 MARLHF_EMULATED_DEVICE_CLOSED=1 ranks 2 "$emulated_bin" "${dp_sft[@]}" \
        --zero-stage 1 --save-every 6 --keep-last 3 --output "$tmp/nccl-zero1-sft" 2> "$tmp/nccl-zero1-sft.err"
    grep -q "with NCCL" "$tmp/nccl-zero1-sft.err" &&
        cmp -s "$tmp/dp-sft-two/final/model.safetensors" "$tmp/nccl-zero1-sft/final/model.safetensors" &&
        cmp -s "$tmp/dp-sft-two/checkpoint-18/optimizer.safetensors" "$tmp/nccl-zero1-sft/checkpoint-18/optimizer.safetensors" &&
        pass gpu_emulated_nccl_zero1_sft_same_bits ||
        fail gpu_emulated_nccl_zero1_sft_same_bits "$(head -n 3 "$tmp/nccl-zero1-sft.err")"
    MARLHF_EMULATED_STREAMS=late MARLHF_EMULATED_DEVICES=2 MARLHF_NCCL=1 ranks 2 "$emulated_bin" "${dp_ppo[@]}" \
        --zero-stage 1 --output "$tmp/nccl-zero1-ppo" 2> "$tmp/nccl-zero1-ppo.err"
    grep -q "with NCCL" "$tmp/nccl-zero1-ppo.err" &&
        same_actor_and_critic "$tmp/dp-ppo-two" "$tmp/nccl-zero1-ppo" &&
        pass gpu_emulated_nccl_zero1_ppo_same_bits ||
        fail gpu_emulated_nccl_zero1_ppo_same_bits "$(head -n 3 "$tmp/nccl-zero1-ppo.err")"
else
    echo "SKIP gpu_emulated data parallel: mpirun missing or $emulated_bin not linked with MPI"
fi
[ "$failures" -eq 0 ] && [ "$status" -eq 0 ] && [ "$stores_status" -eq 0 ] && [ "$streams_status" -eq 0 ]
