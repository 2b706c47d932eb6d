#!/usr/bin/env bash
# Data parallelism under mpirun (dist/dist.h) on the tiny model: two processes with one
# micro-batch each give the same SFT / reward-model / DPO training as one process accumulating
# two, PPO (and GRPO) on 2 or 3 ranks the same iterations as one process (to float rounding), and
# inference with rewards and generation the same file byte for byte; ZeRO-1 (sharded AdamW
# moments), ZeRO-2 (sharded gradients too) and ZeRO-3 (sharded layer weights too) the same
# training as whole ones, resumable, ZeRO-2 and ZeRO-3 with accumulation and with ranks left
# without a micro-batch; runs are bit-identical run to run; only rank 0 writes; a job whose rank
# is killed resumes to the same weights; resuming with another process count, and commands that
# do not run data parallel, are refused. Under AddressSanitizer only the SFT, killed-rank and
# ZeRO-1/2/3 SFT sections run (see below). Prints PASS/FAIL per case.
set -u
cd "$(dirname "$0")/../.."
bin=${MARLHF_BIN:-build/marlhf}
tmp=${MARLHF_TEST_TMP:-/tmp}/cli_data_parallel
rm -rf "$tmp" && mkdir -p "$tmp"
model=tests/fixtures/models/tiny_chat
data=tests/fixtures/train
failures=0
. tests/cli_helpers.sh

if ! command -v mpirun > /dev/null || ! ldd "$bin" 2> /dev/null | grep -q libmpi; then
    fail data_parallel_built "$bin is not linked with MPI or mpirun is missing (scripts/setup installs openmpi-bin)"
    exit 1
fi
mpi_test_environment
# kill_a_rank WAIT_FOR OUT PAUSES COMMAND...: starts COMMAND (an mpirun job writing to
# --output OUT) in the background, waits until a path matching WAIT_FOR exists, then
# 0 to PAUSES-1 tenths of a second more, kills one of its ranks with SIGKILL and waits for
# mpirun to end (sets exit_rc).
kill_a_rank() {
    local wait_for=$1 out=$2 pauses=$3 launcher victim pid
    shift 3
    "$@" > /dev/null 2>&1 &
    launcher=$!
    for _ in $(seq 1200); do compgen -G "$wait_for" > /dev/null && break; sleep 0.02; done
    sleep "0.$((RANDOM % pauses))"
    # A rank, never mpirun itself (PIDs wrap, so the newest process need not be a rank).
    victim=
    for pid in $(pgrep -f -- "--output $out"); do
        [ "$(cat "/proc/$pid/comm" 2> /dev/null)" = marlhf ] && victim=$pid
    done
    [ -n "$victim" ] && kill -9 "$victim"
    wait_exit "$launcher" 60
}
# same_file_on_ranks COMMAND ARGS...: `marlhf COMMAND ARGS --output F` writes 7 rows as one
# process, and the same file byte for byte on 2 and on 3 ranks.
same_file_on_ranks() {
    local command=$1 n
    shift
    "$bin" "$command" "$@" --output "$tmp/${command}_one.jsonl" 2> /dev/null
    for n in 2 3; do
        ranks $n "$bin" "$command" "$@" --output "$tmp/${command}_$n.jsonl" 2> "$tmp/${command}_$n.err"
        [ "$(wc -l < "$tmp/${command}_one.jsonl")" = 7 ] && cmp -s "$tmp/${command}_one.jsonl" "$tmp/${command}_$n.jsonl" &&
            pass "${command}_${n}_ranks_same_file" || fail "${command}_${n}_ranks_same_file" "$(tail -n 2 "$tmp/${command}_$n.err")"
    done
}
logprobs_of() { "$bin" logprobs --model "$1" --input "$tmp/ids.jsonl" | python3 -c "import sys, json; print(' '.join(map(str, json.loads(sys.stdin.readline())['logprobs'])))"; }
echo '{"ids": [1, 5, 9, 14, 2, 33, 7, 12, 40, 3]}' > "$tmp/ids.jsonl"

# --- SFT: 2 ranks x 1 micro-batch == 1 process x 2 accumulated ---------------------------
sft=(--model "$model" --data "$data/sft.jsonl" --eval-data "$data/sft_eval.jsonl" --max-seq-len 32
     --per-device-train-batch-size 4 --learning-rate 3e-3 --num-train-epochs 3 --eval-every 4 --threads 1)
"$bin" sft "${sft[@]}" --gradient-accumulation-steps 2 --output "$tmp/sft_one" --quiet 2> "$tmp/sft_one.err" ||
    fail sft_one_process "$(tail -n 2 "$tmp/sft_one.err")"
ranks 2 "$bin" sft "${sft[@]}" --gradient-accumulation-steps 1 --output "$tmp/sft_two" > "$tmp/sft_two.out" 2> "$tmp/sft_two.err"
rc=$?
[ $rc -eq 0 ] && [ -f "$tmp/sft_two/final/model.safetensors" ] && pass sft_two_ranks_runs ||
    fail sft_two_ranks_runs "exit $rc: $(tail -n 3 "$tmp/sft_two.err")"
one=$(json_values "$tmp/sft_one/metrics.jsonl" train/loss 2> /dev/null)
two=$(json_values "$tmp/sft_two/metrics.jsonl" train/loss 2> /dev/null)
[ "$(echo "$one" | wc -w)" = 18 ] && close "$one" "$two" 1e-5 && pass "sft_two_ranks_same_losses (18 steps)" ||
    fail sft_two_ranks_same_losses "one process: $one / two ranks: $two"
close "$(json_values "$tmp/sft_one/metrics.jsonl" eval/loss)" "$(json_values "$tmp/sft_two/metrics.jsonl" eval/loss)" 1e-5 &&
    pass sft_two_ranks_same_eval_loss || fail sft_two_ranks_same_eval_loss "eval losses differ"
close "$(logprobs_of "$tmp/sft_one/final")" "$(logprobs_of "$tmp/sft_two/final")" 1e-4 &&
    pass sft_two_ranks_same_model || fail sft_two_ranks_same_model "final models' log-probs differ"
# Only rank 0 speaks and writes: one summary line, one event file.
[ "$(grep -c 'final model in' "$tmp/sft_two.err")" = 1 ] && [ "$(ls "$tmp"/sft_two/events.out.tfevents.* | wc -l)" = 1 ] &&
    pass sft_only_rank0_writes || fail sft_only_rank0_writes "$(grep -c 'final model in' "$tmp/sft_two.err") summary lines"
ranks 2 "$bin" sft "${sft[@]}" --output "$tmp/sft_two_again" --quiet 2> /dev/null
cmp -s "$tmp/sft_two/final/model.safetensors" "$tmp/sft_two_again/final/model.safetensors" &&
    pass sft_two_ranks_bit_identical_rerun || fail sft_two_ranks_bit_identical_rerun "final weights differ"

# --- a rank killed mid-run: resume under mpirun to the same weights -------------------------
long=("${sft[@]}" --num-train-epochs 16 --save-every 1 --keep-last 2 --eval-every 0 --quiet)
ranks 2 "$bin" sft "${long[@]}" --output "$tmp/straight" 2> /dev/null
kill_a_rank "$tmp/killed/checkpoint-*" "$tmp/killed" 3 ranks 2 "$bin" sft "${long[@]}" --output "$tmp/killed"
[ "$exit_rc" -ne 0 ] && [ ! -d "$tmp/killed/final" ] && pass sft_rank_killed_stops_job ||
    fail sft_rank_killed_stops_job "mpirun exit $exit_rc, final/ $( [ -d "$tmp/killed/final" ] && echo exists || echo absent)"
ranks 2 "$bin" sft "${long[@]}" --output "$tmp/killed" --resume 2> "$tmp/killed.err"
cmp -s "$tmp/straight/final/model.safetensors" "$tmp/killed/final/model.safetensors" &&
    pass sft_two_ranks_resume_bit_identical || fail sft_two_ranks_resume_bit_identical "$(tail -n 2 "$tmp/killed.err")"
lines=$(grep -c '"train/loss"' "$tmp/killed/metrics.jsonl")
[ "$lines" = 96 ] && pass sft_two_ranks_resume_metrics_continuous || fail sft_two_ranks_resume_metrics_continuous "$lines lines"
# The step is a number of examples per process count: resuming with another is refused.
before=$(ls "$tmp/straight")
expect_error sft_resume_other_process_count "made by 2 processes, this run has 1" \
    "$bin" sft "${long[@]}" --output "$tmp/straight" --resume
[ "$(ls "$tmp/straight")" = "$before" ] && pass sft_refused_resume_keeps_run || fail sft_refused_resume_keeps_run "files changed"

# --- ZeRO-1: the AdamW moments sharded across ranks ---------------------------------------
# The same update elementwise; only the gradient norm is added up shard by shard.
for n in 2 3; do
    ranks $n "$bin" sft "${sft[@]}" --output "$tmp/zero0_$n" --quiet 2> /dev/null
    ranks $n "$bin" sft "${sft[@]}" --output "$tmp/zero1_$n" --quiet --zero-stage 1 2> "$tmp/zero1_$n.err"
    close "$(json_values "$tmp/zero0_$n/metrics.jsonl" train/loss)" "$(json_values "$tmp/zero1_$n/metrics.jsonl" train/loss)" 1e-5 &&
        close "$(logprobs_of "$tmp/zero0_$n/final")" "$(logprobs_of "$tmp/zero1_$n/final")" 1e-5 &&
        pass "sft_zero1_${n}_ranks_same_training" || fail "sft_zero1_${n}_ranks_same_training" "$(tail -n 2 "$tmp/zero1_$n.err")"
done
# Collectives in small pieces (MARLHF_COLLECTIVE_FLOATS; 1000 floats, so many rounds and
# a short last shard): the same bits on 2 ranks, the same training on 3.
MARLHF_COLLECTIVE_FLOATS=1000 ranks 2 "$bin" sft "${sft[@]}" --output "$tmp/pieces_zero0_2" --quiet 2> /dev/null
MARLHF_COLLECTIVE_FLOATS=1000 ranks 2 "$bin" sft "${sft[@]}" --output "$tmp/pieces_zero1_2" --quiet --zero-stage 1 2> /dev/null
cmp -s "$tmp/zero0_2/final/model.safetensors" "$tmp/pieces_zero0_2/final/model.safetensors" &&
    cmp -s "$tmp/zero1_2/final/model.safetensors" "$tmp/pieces_zero1_2/final/model.safetensors" &&
    pass collectives_in_pieces_same_bits || fail collectives_in_pieces_same_bits "final weights differ"
MARLHF_COLLECTIVE_FLOATS=1000 ranks 3 "$bin" sft "${sft[@]}" --output "$tmp/pieces_zero1_3" --quiet --zero-stage 1 \
    2> "$tmp/pieces.err"
close "$(logprobs_of "$tmp/zero1_3/final")" "$(logprobs_of "$tmp/pieces_zero1_3/final")" 1e-5 &&
    pass collectives_in_pieces_three_ranks || fail collectives_in_pieces_three_ranks "$(tail -n 2 "$tmp/pieces.err")"
MARLHF_COLLECTIVE_FLOATS=lots expect_error collective_floats_bad "MARLHF_COLLECTIVE_FLOATS" "$bin" sft "${sft[@]}" --output "$tmp/x"
# NCCL required (dist/dist.h) of CPU ranks: refused on every rank, exit 2, nothing written.
# In the default (auto) CPU ranks sum with MPI and say nothing about it.
MARLHF_NCCL=1 ranks 2 "$bin" sft "${sft[@]}" --output "$tmp/nccl_cpu" > /dev/null 2> "$tmp/nccl_cpu.err"
rc=$?
[ "$rc" = 2 ] && [ ! -e "$tmp/nccl_cpu" ] &&
    [ "$(grep -c '^marlhf: error: .*MARLHF_NCCL=1 .*the cpu backend has no collectives' "$tmp/nccl_cpu.err")" = 2 ] &&
    ! grep -q "data parallel:" "$tmp/zero1_2.err" &&
    pass nccl_required_refused_on_cpu || fail nccl_required_refused_on_cpu "exit $rc: $(head -n 2 "$tmp/nccl_cpu.err")"
# The checkpoint holds every moment (gathered on rank 0), as without sharding.
last=$(ls -d "$tmp"/zero1_3/checkpoint-* | tail -n 1)
[ -f "$last/optimizer.safetensors" ] &&
    [ "$(stat -c %s "$last/optimizer.safetensors")" = "$(stat -c %s "$tmp/zero0_3/$(basename "$last")/optimizer.safetensors")" ] &&
    pass sft_zero1_checkpoint_has_all_moments || fail sft_zero1_checkpoint_has_all_moments "$last"
# resume_after_killed_rank STAGE: the long SFT run on 2 ranks with --zero-stage STAGE, straight
# and with a rank killed mid-run then resumed; PASS when both end with the same weights.
resume_after_killed_rank() {
    local stage=$1 zero_long=("${long[@]}" --zero-stage "$1")
    ranks 2 "$bin" sft "${zero_long[@]}" --output "$tmp/zero${stage}_straight" 2> /dev/null
    kill_a_rank "$tmp/zero${stage}_killed/checkpoint-*" "$tmp/zero${stage}_killed" 3 \
        ranks 2 "$bin" sft "${zero_long[@]}" --output "$tmp/zero${stage}_killed"
    ranks 2 "$bin" sft "${zero_long[@]}" --output "$tmp/zero${stage}_killed" --resume 2> "$tmp/zero${stage}_killed.err"
    [ "$exit_rc" -ne 0 ] && cmp -s "$tmp/zero${stage}_straight/final/model.safetensors" "$tmp/zero${stage}_killed/final/model.safetensors" &&
        pass "sft_zero${stage}_resume_bit_identical" ||
        fail "sft_zero${stage}_resume_bit_identical" "kill exit $exit_rc: $(tail -n 2 "$tmp/zero${stage}_killed.err")"
}
resume_after_killed_rank 1
expect_error zero_stage_bad "--zero-stage must be 0, 1, 2 or 3" "$bin" sft "${sft[@]}" --output "$tmp/x" --zero-stage 4
# (ZeRO-1 with --device cuda: tests/cli/gpu_emulated.sh, on the emulated CUDA backend)

# --- ZeRO-2: the gradients sharded too, summed part by part inside each backward -------------
# The same sums as stage 0 added in another order: the same training to rounding.
for n in 2 3; do
    ranks $n "$bin" sft "${sft[@]}" --output "$tmp/zero2_$n" --quiet --zero-stage 2 2> "$tmp/zero2_$n.err"
    close "$(json_values "$tmp/zero0_$n/metrics.jsonl" train/loss) $(json_values "$tmp/zero0_$n/metrics.jsonl" eval/loss)" \
          "$(json_values "$tmp/zero2_$n/metrics.jsonl" train/loss) $(json_values "$tmp/zero2_$n/metrics.jsonl" eval/loss)" 1e-5 &&
        close "$(logprobs_of "$tmp/zero0_$n/final")" "$(logprobs_of "$tmp/zero2_$n/final")" 1e-5 &&
        pass "sft_zero2_${n}_ranks_same_training" || fail "sft_zero2_${n}_ranks_same_training" "$(tail -n 2 "$tmp/zero2_$n.err")"
done
# Rank 0 writes the sharded moments, reading the other ranks' shards piece by piece: on 2
# ranks stages 1 and 2 train stage 0's bits, so their checkpoints' optimizer files are its bytes.
last=$(ls -d "$tmp"/zero0_2/checkpoint-* | tail -n 1)
cmp -s "$last/optimizer.safetensors" "$tmp/zero1_2/$(basename "$last")/optimizer.safetensors" &&
    cmp -s "$last/optimizer.safetensors" "$tmp/zero2_2/$(basename "$last")/optimizer.safetensors" &&
    pass sharded_checkpoints_same_bytes || fail sharded_checkpoints_same_bytes "$last"
# Accumulation (the owner's shard carries the earlier backwards' sums into the next) and
# rounds where some ranks have no micro-batch: 48 examples in micro-batches of 5 are 10, the
# last of 3 examples; 3 ranks x 2 accumulated take 6 a step, so the second step's second
# round has one micro-batch, and two ranks add their zeros to its sums.
idle=("${sft[@]}" --per-device-train-batch-size 5 --gradient-accumulation-steps 2)
ranks 3 "$bin" sft "${idle[@]}" --output "$tmp/idle_zero0" --quiet 2> /dev/null
ranks 3 "$bin" sft "${idle[@]}" --output "$tmp/idle_zero2" --quiet --zero-stage 2 2> "$tmp/idle_zero2.err"
MARLHF_COLLECTIVE_FLOATS=1000 ranks 3 "$bin" sft "${idle[@]}" --output "$tmp/idle_pieces_zero2" --quiet --zero-stage 2 \
    2> "$tmp/idle_pieces_zero2.err"
for run in idle_zero2 idle_pieces_zero2; do
    close "$(json_values "$tmp/idle_zero0/metrics.jsonl" train/loss) $(json_values "$tmp/idle_zero0/metrics.jsonl" train/grad_norm)" \
          "$(json_values "$tmp/$run/metrics.jsonl" train/loss) $(json_values "$tmp/$run/metrics.jsonl" train/grad_norm)" 1e-5 &&
        close "$(logprobs_of "$tmp/idle_zero0/final")" "$(logprobs_of "$tmp/$run/final")" 1e-5 &&
        pass "sft_${run}_accumulation_and_idle_ranks" || fail "sft_${run}_accumulation_and_idle_ranks" "$(tail -n 2 "$tmp/$run.err")"
done
expect_error zero2_stage_cuda "--zero-stage 2 runs on --device cpu only" "$bin" sft "${sft[@]}" --output "$tmp/x" --zero-stage 2 --device cuda

# --- ZeRO-3: the layers' weights sharded too, each layer gathered while it runs --------------
# The same arithmetic on the same gathered weights as stage 0: on 2 ranks the same bits --
# every checkpoint's weights and moments (rank 0 gathers the layers to write them) and the
# final model; on 3 the same training to rounding (the gradient sums go as ZeRO-2's).
ranks 2 "$bin" sft "${sft[@]}" --output "$tmp/zero3_2" --quiet --zero-stage 3 2> "$tmp/zero3_2.err"
same=0
for checkpoint in "$tmp"/zero0_2/checkpoint-* "$tmp/zero0_2/final"; do
    for file in model.safetensors optimizer.safetensors; do
        [ -f "$checkpoint/$file" ] || continue
        cmp -s "$checkpoint/$file" "$tmp/zero3_2/$(basename "$checkpoint")/$file" && same=$((same + 1)) ||
            echo "differs: $(basename "$checkpoint")/$file"
    done
done
[ "$same" = 3 ] && pass "sft_zero3_2_ranks_same_bits (checkpoint weights, moments, final)" ||
    fail sft_zero3_2_ranks_same_bits "$same of 3 files equal: $(tail -n 2 "$tmp/zero3_2.err")"
ranks 3 "$bin" sft "${sft[@]}" --output "$tmp/zero3_3" --quiet --zero-stage 3 2> "$tmp/zero3_3.err"
close "$(json_values "$tmp/zero0_3/metrics.jsonl" train/loss) $(json_values "$tmp/zero0_3/metrics.jsonl" eval/loss)" \
      "$(json_values "$tmp/zero3_3/metrics.jsonl" train/loss) $(json_values "$tmp/zero3_3/metrics.jsonl" eval/loss)" 1e-5 &&
    close "$(logprobs_of "$tmp/zero0_3/final")" "$(logprobs_of "$tmp/zero3_3/final")" 1e-5 &&
    pass sft_zero3_3_ranks_same_training || fail sft_zero3_3_ranks_same_training "$(tail -n 2 "$tmp/zero3_3.err")"
# Rounds where some ranks have no micro-batch, evaluations where one has none (12 examples in
# chunks of 8 on 3 ranks), messages of 1000 floats, and gradient checkpointing (each layer recomputed
# inside the backward, on the weights gathered for it): the ranks with nothing to run play the
# others' gathers, or every rank waits forever.
ranks 3 "$bin" sft "${idle[@]}" --output "$tmp/idle_zero3" --quiet --zero-stage 3 2> "$tmp/idle_zero3.err"
MARLHF_COLLECTIVE_FLOATS=1000 ranks 3 "$bin" sft "${idle[@]}" --output "$tmp/idle_pieces_zero3" --quiet --zero-stage 3 \
    2> "$tmp/idle_pieces_zero3.err"
ranks 3 "$bin" sft "${idle[@]}" --gradient-checkpointing --output "$tmp/idle_checkpointing_zero3" --quiet --zero-stage 3 \
    2> "$tmp/idle_checkpointing_zero3.err"
for run in idle_zero3 idle_pieces_zero3 idle_checkpointing_zero3; do
    close "$(json_values "$tmp/idle_zero0/metrics.jsonl" train/loss) $(json_values "$tmp/idle_zero0/metrics.jsonl" train/grad_norm)" \
          "$(json_values "$tmp/$run/metrics.jsonl" train/loss) $(json_values "$tmp/$run/metrics.jsonl" train/grad_norm)" 1e-5 &&
        close "$(logprobs_of "$tmp/idle_zero0/final")" "$(logprobs_of "$tmp/$run/final")" 1e-5 &&
        pass "sft_${run}_accumulation_and_idle_ranks" || fail "sft_${run}_accumulation_and_idle_ranks" "$(tail -n 2 "$tmp/$run.err")"
done
# Other layouts, 2 ranks against 2 whole, every checkpoint file and the final model: GPT-2
# (its checkpoints are written transposed, from a copy read through the shards) and Gemma 2
# (sandwich norms, soft caps).
python3 tests/cli/tiny_gpt2_model.py tests/fixtures/models/gpt2 "$model" "$tmp/tiny_gpt2"
for family in "$tmp/tiny_gpt2" tests/fixtures/models/tiny_gemma2_chat; do
    name=$(basename "$family")
    layout=(--model "$family" --data "$data/sft.jsonl" --max-seq-len 32 --per-device-train-batch-size 4
            --learning-rate 3e-3 --max-steps 4 --save-every 2 --threads 1 --quiet)
    ranks 2 "$bin" sft "${layout[@]}" --output "$tmp/${name}_zero0" 2> /dev/null
    ranks 2 "$bin" sft "${layout[@]}" --zero-stage 3 --output "$tmp/${name}_zero3" 2> "$tmp/${name}_zero3.err"
    same=0
    for file in checkpoint-2/model.safetensors checkpoint-4/model.safetensors checkpoint-4/optimizer.safetensors \
                final/model.safetensors; do
        cmp -s "$tmp/${name}_zero0/$file" "$tmp/${name}_zero3/$file" && same=$((same + 1))
    done
    [ "$same" = 4 ] && pass "sft_zero3_${name}_same_bits" ||
        fail "sft_zero3_${name}_same_bits" "$same of 4 files equal: $(tail -n 2 "$tmp/${name}_zero3.err")"
done
# LoRA: the frozen base sharded (each rank loads its shard, gathers each layer while it runs),
# the adapters trained as under ZeRO-2 (whole weights, sharded gradients and moments). On 2
# ranks the same adapters, moments and losses as ZeRO-2, bit for bit, in every checkpoint and
# the final folder (the fingerprint of the base, which no rank holds whole, in the adapter's
# config too); the merged weights, which rank 0 merges piece by piece as it writes them, to
# rounding (the rank sum in another order than the whole merge's matrix product).
# same_adapter_checkpoints NAME A B: SFT runs A and B (B's stderr in B.err) saved the same
# adapters, adapter config and moments in every checkpoint and the final folder (at least 5
# files) and logged the same losses, bit for bit; their merged final weights agree to 1e-6.
same_adapter_checkpoints() {
    local name=$1 a=$2 b=$3 same=0 files=0 checkpoint file
    for checkpoint in "$a"/checkpoint-* "$a/final"; do
        for file in adapter/adapter_model.safetensors adapter/adapter_config.json optimizer.safetensors; do
            [ -f "$checkpoint/$file" ] || continue
            files=$((files + 1))
            cmp -s "$checkpoint/$file" "$b/$(basename "$checkpoint")/$file" && same=$((same + 1))
        done
    done
    [ "$files" -ge 5 ] && [ "$same" = "$files" ] &&
        [ "$(json_values "$a/metrics.jsonl" train/loss)" = "$(json_values "$b/metrics.jsonl" train/loss)" ] &&
        close "$(logprobs_of "$a/final")" "$(logprobs_of "$b/final")" 1e-6 &&
        pass "$name ($same files)" || fail "$name" "$same of $files files equal: $(tail -n 2 "$b.err")"
}
ranks 2 "$bin" sft "${sft[@]}" --lora-rank 4 --save-every 3 --output "$tmp/lora_zero2_2" --quiet --zero-stage 2 2> /dev/null
ranks 2 "$bin" sft "${sft[@]}" --lora-rank 4 --save-every 3 --output "$tmp/lora_zero3_2" --quiet --zero-stage 3 \
    2> "$tmp/lora_zero3_2.err"
same_adapter_checkpoints sft_lora_zero3_2_ranks_same_adapters "$tmp/lora_zero2_2" "$tmp/lora_zero3_2"
# DoRA: the fresh magnitudes (the base's row norms) set again at the start with each layer
# gathered, the weight norms taken layer by layer as each runs, the merged rows streamed whole
# (each scaled by its own norm). ZeRO-2's adapters, config and moments in every checkpoint,
# bit for bit; verified to fail when the start does not set the magnitudes again.
for stage in 2 3; do
    ranks 2 "$bin" sft "${sft[@]}" --lora-rank 4 --use-dora --save-every 3 --zero-stage $stage \
        --output "$tmp/dora_zero${stage}_2" --quiet 2> "$tmp/dora_zero${stage}_2.err"
done
same_adapter_checkpoints sft_dora_zero3_2_ranks_same_adapters "$tmp/dora_zero2_2" "$tmp/dora_zero3_2"
expect_error zero3_qlora "not with --quantize" \
    "$bin" sft "${sft[@]}" --output "$tmp/x" --zero-stage 3 --lora-rank 4 --quantize q8_0
# A saved adapter as the start (--lora-adapter): shaped at the load, read by every rank once
# the base is sharded, its file checked against the fingerprint of the base the start takes
# from the shards. ZeRO-2's adapters and losses, bit for bit; an adapter whose fingerprint is
# of other weights stops every rank with the file's name and writes nothing.
for stage in 2 3; do
    ranks 2 "$bin" sft "${sft[@]}" --lora-adapter "$tmp/lora_zero2_2/final" --max-steps 3 --zero-stage $stage \
        --output "$tmp/lora_adapter_zero$stage" --quiet 2> "$tmp/lora_adapter_zero$stage.err"
done
[ -s "$tmp/lora_adapter_zero3/final/adapter/adapter_model.safetensors" ] &&
    cmp -s "$tmp/lora_adapter_zero2/final/adapter/adapter_model.safetensors" "$tmp/lora_adapter_zero3/final/adapter/adapter_model.safetensors" &&
    [ "$(json_values "$tmp/lora_adapter_zero2/metrics.jsonl" train/loss)" = "$(json_values "$tmp/lora_adapter_zero3/metrics.jsonl" train/loss)" ] &&
    ! cmp -s "$tmp/lora_zero2_2/final/adapter/adapter_model.safetensors" "$tmp/lora_adapter_zero3/final/adapter/adapter_model.safetensors" &&
    pass sft_lora_zero3_from_saved_adapter_same_as_zero2 ||
    fail sft_lora_zero3_from_saved_adapter_same_as_zero2 "$(tail -n 2 "$tmp/lora_adapter_zero3.err")"
# The first loss is the saved adapter's, not fresh adapters' (whose B is zero: the base's loss).
[ "$(json_values "$tmp/lora_adapter_zero3/metrics.jsonl" train/loss | cut -d' ' -f1)" != \
  "$(json_values "$tmp/lora_zero3_2/metrics.jsonl" train/loss | cut -d' ' -f1)" ] &&
    pass sft_lora_zero3_saved_adapter_is_read || fail sft_lora_zero3_saved_adapter_is_read "first loss as fresh adapters'"
rm -rf "$tmp/other_base" && cp -r "$tmp/lora_zero2_2/final/adapter" "$tmp/other_base"
python3 -c "
import json, sys
path = sys.argv[1] + '/adapter_config.json'
config = json.load(open(path))
config['marlhf_base_fingerprint'] = '0123456789abcdef'
json.dump(config, open(path, 'w'))" "$tmp/other_base"
ranks 2 "$bin" sft "${sft[@]}" --lora-adapter "$tmp/other_base" --zero-stage 3 --output "$tmp/other_base_run" --quiet \
    > /dev/null 2> "$tmp/other_base.err"
rc=$?
[ $rc = 2 ] && [ "$(grep -c "marlhf: error: .*other_base/adapter_config.json: the adapters were trained on other base weights" "$tmp/other_base.err")" = 2 ] &&
    [ -z "$(ls "$tmp/other_base_run" 2> /dev/null | grep -v '^metrics.jsonl$\|^events.out')" ] &&
    pass sft_lora_zero3_adapter_of_other_base_refused ||
    fail sft_lora_zero3_adapter_of_other_base_refused "exit $rc: $(head -n 3 "$tmp/other_base.err")"
expect_error zero3_stage_cuda "--zero-stage 3 runs on --device cpu only" "$bin" sft "${sft[@]}" --output "$tmp/x" --zero-stage 3 --device cuda

# Under AddressSanitizer the sections above (SFT across ranks, a killed rank's resume, ZeRO-1,
# ZeRO-2, ZeRO-3, collectives in pieces) take the data-parallel code sanitized; the rest runs
# the same collectives for the other trainers and is the plain build's to check (every mpirun
# job is several sanitized processes: this script was the sanitized pass's longest). ZeRO-2's
# and ZeRO-3's rerun and resume go through the same checkpoint code as ZeRO-1's, so they are
# plain-only too.
if sanitized_build; then
    echo "SKIP data_parallel.sh from LoRA on: $bin is built with AddressSanitizer; the plain build runs it"
    [ "$failures" -eq 0 ]
    exit
fi
ranks 2 "$bin" sft "${sft[@]}" --output "$tmp/zero2_2_again" --quiet --zero-stage 2 2> /dev/null
cmp -s "$tmp/zero2_2/final/model.safetensors" "$tmp/zero2_2_again/final/model.safetensors" &&
    pass sft_zero2_bit_identical_rerun || fail sft_zero2_bit_identical_rerun "final weights differ"
resume_after_killed_rank 2
resume_after_killed_rank 3
# Rank 0's checkpoint write fails while it streams the sharded moments (a file size limit of
# 800 KB lets the 556 KB weights through, not the 1.1 MB of moments): both ranks stop with one
# line each, exit 2, nothing half-written is left, no rank waits forever for a request.
rm -rf "$tmp/too_large"
mpirun --oversubscribe --bind-to none -np 2 bash -c 'trap "" XFSZ; ulimit -f 800; exec "$@"' limited \
    "$bin" sft "${sft[@]}" --max-steps 2 --save-every 1 --zero-stage 2 --quiet --output "$tmp/too_large" \
    > /dev/null 2> "$tmp/too_large.err"
rc=$?
[ $rc -ne 0 ] && grep -q "rank 0 of 2.*File too large.*optimizer.safetensors" "$tmp/too_large.err" &&
    grep -q "rank 1 of 2.*rank 0 could not save a checkpoint" "$tmp/too_large.err" &&
    [ -z "$(ls "$tmp/too_large" | grep -v '^metrics.jsonl$\|^events.out')" ] &&
    pass sharded_checkpoint_write_fails_cleanly || fail sharded_checkpoint_write_fails_cleanly "exit $rc: $(grep marlhf "$tmp/too_large.err")"

# --- LoRA: the adapters' gradients summed, their moments sharded by ZeRO-1 ----------------------
# With LoRA dropout too: a micro-batch's masks depend on its place in the run, not on the
# rank that runs it, so 2 ranks train what one process does with accumulation. And DoRA: its
# magnitudes are summed and sharded with the adapters.
"$bin" sft "${sft[@]}" --gradient-accumulation-steps 2 --lora-rank 4 --output "$tmp/lora_one" --quiet 2> /dev/null
"$bin" sft "${sft[@]}" --gradient-accumulation-steps 2 --lora-rank 4 --lora-dropout 0.2 --output "$tmp/lora_dropout_one" \
    --quiet 2> /dev/null
ranks 2 "$bin" sft "${sft[@]}" --lora-rank 4 --output "$tmp/lora_two" --quiet 2> "$tmp/lora_two.err"
ranks 2 "$bin" sft "${sft[@]}" --lora-rank 4 --zero-stage 1 --output "$tmp/lora_zero1" --quiet 2> "$tmp/lora_zero1.err"
ranks 2 "$bin" sft "${sft[@]}" --lora-rank 4 --lora-dropout 0.2 --output "$tmp/lora_dropout_two" --quiet \
    2> "$tmp/lora_dropout_two.err"
"$bin" sft "${sft[@]}" --gradient-accumulation-steps 2 --lora-rank 4 --use-dora --output "$tmp/dora_one" --quiet 2> /dev/null
ranks 2 "$bin" sft "${sft[@]}" --lora-rank 4 --use-dora --output "$tmp/dora_two" --quiet 2> "$tmp/dora_two.err"
ranks 2 "$bin" sft "${sft[@]}" --lora-rank 4 --use-dora --zero-stage 1 --output "$tmp/dora_zero1" --quiet \
    2> "$tmp/dora_zero1.err"
ranks 2 "$bin" sft "${sft[@]}" --lora-rank 4 --use-dora --zero-stage 2 --output "$tmp/dora_zero2" --quiet \
    2> "$tmp/dora_zero2.err"
for pair in lora_one:lora_two lora_one:lora_zero1 lora_dropout_one:lora_dropout_two dora_one:dora_two dora_one:dora_zero1 \
            dora_one:dora_zero2; do
    one=${pair%%:*} run=${pair#*:}
    close "$(json_values "$tmp/$one/metrics.jsonl" train/loss)" "$(json_values "$tmp/$run/metrics.jsonl" train/loss)" 1e-5 &&
        close "$(logprobs_of "$tmp/$one/final")" "$(logprobs_of "$tmp/$run/final")" 1e-5 &&
        pass "sft_${run}_ranks_same_training" || fail "sft_${run}_ranks_same_training" "$(tail -n 2 "$tmp/$run.err")"
done
# LoRA under ZeRO-3 on 3 ranks with rounds where ranks have no micro-batch (they play the
# others' backwards: the base's gathers and the adapters' sums) and LoRA dropout; a rank killed
# mid-run resumes to the same adapters (the base read back as shards, the fingerprint taken
# again before the checkpoint's adapters are checked against it).
ranks 3 "$bin" sft "${idle[@]}" --lora-rank 4 --lora-dropout 0.2 --output "$tmp/lora_idle_zero2" --quiet --zero-stage 2 \
    2> /dev/null
ranks 3 "$bin" sft "${idle[@]}" --lora-rank 4 --lora-dropout 0.2 --output "$tmp/lora_idle_zero3" --quiet --zero-stage 3 \
    2> "$tmp/lora_idle_zero3.err"
cmp -s "$tmp/lora_idle_zero2/final/adapter/adapter_model.safetensors" "$tmp/lora_idle_zero3/final/adapter/adapter_model.safetensors" &&
    pass sft_lora_zero3_3_ranks_idle_rounds_same_adapters ||
    fail sft_lora_zero3_3_ranks_idle_rounds_same_adapters "$(tail -n 2 "$tmp/lora_idle_zero3.err")"
ranks 2 "$bin" sft "${long[@]}" --lora-rank 4 --zero-stage 3 --output "$tmp/lora_zero3_straight" --quiet 2> /dev/null
kill_a_rank "$tmp/lora_zero3_killed/checkpoint-*" "$tmp/lora_zero3_killed" 3 \
    ranks 2 "$bin" sft "${long[@]}" --lora-rank 4 --zero-stage 3 --output "$tmp/lora_zero3_killed" --quiet
ranks 2 "$bin" sft "${long[@]}" --lora-rank 4 --zero-stage 3 --output "$tmp/lora_zero3_killed" --quiet --resume \
    2> "$tmp/lora_zero3_killed.err"
[ "$exit_rc" -ne 0 ] &&
    cmp -s "$tmp/lora_zero3_straight/final/adapter/adapter_model.safetensors" "$tmp/lora_zero3_killed/final/adapter/adapter_model.safetensors" &&
    pass sft_lora_zero3_resume_bit_identical || fail sft_lora_zero3_resume_bit_identical "kill exit $exit_rc: $(tail -n 2 "$tmp/lora_zero3_killed.err")"
! cmp -s "$tmp/lora_one/final/adapter/adapter_model.safetensors" "$tmp/lora_dropout_one/final/adapter/adapter_model.safetensors" &&
    pass sft_lora_dropout_changes_training || fail sft_lora_dropout_changes_training "the same adapters with and without dropout"

# --- reward model ------------------------------------------------------------------------
rm_args=(--model "$model" --data "$data/pairs.jsonl" --eval-data "$data/pairs_eval.jsonl" --max-seq-len 32
         --per-device-train-batch-size 4 --learning-rate 3e-3 --num-train-epochs 3 --threads 1 --quiet)
"$bin" rm "${rm_args[@]}" --gradient-accumulation-steps 2 --output "$tmp/rm_one" 2> /dev/null
ranks 2 "$bin" rm "${rm_args[@]}" --output "$tmp/rm_two" 2> "$tmp/rm_two.err"
close "$(json_values "$tmp/rm_one/metrics.jsonl" train/loss)" "$(json_values "$tmp/rm_two/metrics.jsonl" train/loss)" 1e-5 &&
    pass rm_two_ranks_same_losses || fail rm_two_ranks_same_losses "$(tail -n 2 "$tmp/rm_two.err")"
close "$(json_values "$tmp/rm_one/metrics.jsonl" eval/accuracy) $(json_values "$tmp/rm_one/metrics.jsonl" eval/loss)" \
      "$(json_values "$tmp/rm_two/metrics.jsonl" eval/accuracy) $(json_values "$tmp/rm_two/metrics.jsonl" eval/loss)" 1e-5 &&
    pass rm_two_ranks_same_eval || fail rm_two_ranks_same_eval "eval accuracy/loss differ"
# ZeRO-2 through the value head's backward (its gradient is final with the head's).
ranks 2 "$bin" rm "${rm_args[@]}" --zero-stage 2 --output "$tmp/rm_zero2" 2> "$tmp/rm_zero2.err"
close "$(json_values "$tmp/rm_one/metrics.jsonl" train/loss) $(json_values "$tmp/rm_one/metrics.jsonl" eval/loss)" \
      "$(json_values "$tmp/rm_zero2/metrics.jsonl" train/loss) $(json_values "$tmp/rm_zero2/metrics.jsonl" eval/loss)" 1e-5 &&
    pass rm_zero2_same_training || fail rm_zero2_same_training "$(tail -n 2 "$tmp/rm_zero2.err")"
# ZeRO-3 against 2 whole ranks, bit for bit: the evaluations give rank 0 two chunks of pairs
# and rank 1 one, and the final folder's reward statistics are rank 0's forwards alone, on the
# layers gathered to it.
ranks 2 "$bin" rm "${rm_args[@]}" --zero-stage 3 --output "$tmp/rm_zero3" 2> "$tmp/rm_zero3.err"
cmp -s "$tmp/rm_two/final/model.safetensors" "$tmp/rm_zero3/final/model.safetensors" &&
    cmp -s "$tmp/rm_two/final/reward_stats.json" "$tmp/rm_zero3/final/reward_stats.json" &&
    [ "$(json_values "$tmp/rm_two/metrics.jsonl" eval/loss)" = "$(json_values "$tmp/rm_zero3/metrics.jsonl" eval/loss)" ] &&
    pass rm_zero3_same_training || fail rm_zero3_same_training "$(tail -n 2 "$tmp/rm_zero3.err")"

# --- DPO: the reference log-probs computed by both ranks and gathered, then as SFT ---------
dpo_args=(--model "$model" --data "$data/pairs.jsonl" --eval-data "$data/pairs_eval.jsonl" --max-seq-len 32
          --per-device-train-batch-size 4 --learning-rate 3e-3 --num-train-epochs 2 --eval-every 3 --threads 1 --quiet)
"$bin" dpo "${dpo_args[@]}" --gradient-accumulation-steps 2 --output "$tmp/dpo_one" 2> /dev/null
ranks 2 "$bin" dpo "${dpo_args[@]}" --output "$tmp/dpo_two" 2> "$tmp/dpo_two.err"
close "$(json_values "$tmp/dpo_one/metrics.jsonl" train/loss) $(json_values "$tmp/dpo_one/metrics.jsonl" eval/margin)" \
      "$(json_values "$tmp/dpo_two/metrics.jsonl" train/loss) $(json_values "$tmp/dpo_two/metrics.jsonl" eval/margin)" 1e-5 &&
    pass dpo_two_ranks_same_training || fail dpo_two_ranks_same_training "$(tail -n 2 "$tmp/dpo_two.err")"
# TR-DPO: every rank mixes the same reference and scores its share of the rows again.
sync=(--sync-ref-model --ref-model-sync-steps 2 --ref-model-mixup-alpha 0.5)
"$bin" dpo "${dpo_args[@]}" "${sync[@]}" --gradient-accumulation-steps 2 --output "$tmp/dpo_sync_one" 2> /dev/null
ranks 2 "$bin" dpo "${dpo_args[@]}" "${sync[@]}" --output "$tmp/dpo_sync_two" 2> "$tmp/dpo_sync_two.err"
close "$(json_values "$tmp/dpo_sync_one/metrics.jsonl" train/loss) $(json_values "$tmp/dpo_sync_one/metrics.jsonl" eval/margin)" \
      "$(json_values "$tmp/dpo_sync_two/metrics.jsonl" train/loss) $(json_values "$tmp/dpo_sync_two/metrics.jsonl" eval/margin)" 1e-5 &&
    pass dpo_sync_ref_model_two_ranks || fail dpo_sync_ref_model_two_ranks "$(tail -n 2 "$tmp/dpo_sync_two.err")"

# --- KTO: each micro-batch estimates its own KL baseline, so two ranks = one with accumulation
kto_args=(--model "$model" --data "$data/pairs.jsonl" --eval-data "$data/pairs_eval.jsonl" --max-seq-len 32
          --per-device-train-batch-size 4 --learning-rate 3e-3 --max-steps 6 --eval-every 3 --threads 1 --quiet)
"$bin" kto "${kto_args[@]}" --gradient-accumulation-steps 2 --output "$tmp/kto_one" 2> /dev/null
ranks 2 "$bin" kto "${kto_args[@]}" --output "$tmp/kto_two" 2> "$tmp/kto_two.err"
close "$(json_values "$tmp/kto_one/metrics.jsonl" train/loss) $(json_values "$tmp/kto_one/metrics.jsonl" eval/kl)" \
      "$(json_values "$tmp/kto_two/metrics.jsonl" train/loss) $(json_values "$tmp/kto_two/metrics.jsonl" eval/kl)" 1e-5 &&
    pass kto_two_ranks_same_training || fail kto_two_ranks_same_training "$(tail -n 2 "$tmp/kto_two.err")"
# DPO and KTO under ZeRO-2: one backward per micro-step each (the chosen and rejected rows,
# or the KL rows, in the same forward).
ranks 2 "$bin" dpo "${dpo_args[@]}" --zero-stage 2 --output "$tmp/dpo_zero2" 2> "$tmp/dpo_zero2.err"
ranks 2 "$bin" kto "${kto_args[@]}" --zero-stage 2 --output "$tmp/kto_zero2" 2> "$tmp/kto_zero2.err"
for name in dpo kto; do
    close "$(json_values "$tmp/${name}_one/metrics.jsonl" train/loss)" "$(json_values "$tmp/${name}_zero2/metrics.jsonl" train/loss)" 1e-5 &&
        close "$(logprobs_of "$tmp/${name}_one/final")" "$(logprobs_of "$tmp/${name}_zero2/final")" 1e-5 &&
        pass "${name}_zero2_same_training" || fail "${name}_zero2_same_training" "$(tail -n 2 "$tmp/${name}_zero2.err")"
done
# ZeRO-3 against the same 2 ranks whole, bit for bit. A KTO micro-step runs two forwards (its
# KL rows, then its own) and one backward; BCO scores every rank's micro-batches before the
# step (TrainTask.begin_step), a pass the other ranks play when they have fewer.
ranks 2 "$bin" dpo "${dpo_args[@]}" --zero-stage 3 --output "$tmp/dpo_zero3" 2> "$tmp/dpo_zero3.err"
ranks 2 "$bin" kto "${kto_args[@]}" --zero-stage 3 --output "$tmp/kto_zero3" 2> "$tmp/kto_zero3.err"
ranks 2 "$bin" kto "${kto_args[@]}" --loss bco --output "$tmp/bco_two" 2> /dev/null
ranks 2 "$bin" kto "${kto_args[@]}" --loss bco --zero-stage 3 --output "$tmp/bco_zero3" 2> "$tmp/bco_zero3.err"
# With --reference-model the reference log-probs come from that model, loaded whole before
# training; without one (above) from the sharded policy itself inside the loop.
ranks 2 "$bin" dpo "${dpo_args[@]}" --reference-model "$model" --zero-stage 3 --output "$tmp/dpo_reference_zero3" \
    2> "$tmp/dpo_reference_zero3.err"
cmp -s "$tmp/dpo_two/final/model.safetensors" "$tmp/dpo_reference_zero3/final/model.safetensors" &&
    pass dpo_zero3_reference_model_same_bits ||
    fail dpo_zero3_reference_model_same_bits "$(tail -n 2 "$tmp/dpo_reference_zero3.err")"
# DPO under ZeRO-3 resumed after a killed rank: the reference log-probs are computed again by
# the sharded starting weights, then each rank reads its shard of the checkpoint.
dpo_long=("${dpo_args[@]}" --num-train-epochs 4 --save-every 1 --zero-stage 3)
ranks 2 "$bin" dpo "${dpo_long[@]}" --output "$tmp/dpo_zero3_straight" 2> /dev/null
kill_a_rank "$tmp/dpo_zero3_killed/checkpoint-*" "$tmp/dpo_zero3_killed" 3 \
    ranks 2 "$bin" dpo "${dpo_long[@]}" --output "$tmp/dpo_zero3_killed"
ranks 2 "$bin" dpo "${dpo_long[@]}" --output "$tmp/dpo_zero3_killed" --resume 2> "$tmp/dpo_zero3_killed.err"
[ "$exit_rc" -ne 0 ] &&
    cmp -s "$tmp/dpo_zero3_straight/final/model.safetensors" "$tmp/dpo_zero3_killed/final/model.safetensors" &&
    pass dpo_zero3_resume_bit_identical ||
    fail dpo_zero3_resume_bit_identical "kill exit $exit_rc: $(tail -n 2 "$tmp/dpo_zero3_killed.err")"
for name in dpo kto bco; do
    cmp -s "$tmp/${name}_two/final/model.safetensors" "$tmp/${name}_zero3/final/model.safetensors" &&
        [ "$(json_values "$tmp/${name}_two/metrics.jsonl" eval/loss)" = "$(json_values "$tmp/${name}_zero3/metrics.jsonl" eval/loss)" ] &&
        pass "${name}_zero3_same_bits" || fail "${name}_zero3_same_bits" "$(tail -n 2 "$tmp/${name}_zero3.err")"
done
# LoRA reward models, DPO (the reference is the base with the adapters off, computed sharded
# before training) and KTO under ZeRO-3: ZeRO-2's adapters (and the RM's trained value head)
# and losses, bit for bit.
for name in rm dpo kto; do
    case $name in rm) args=("${rm_args[@]}") ;; dpo) args=("${dpo_args[@]}") ;; kto) args=("${kto_args[@]}") ;; esac
    ranks 2 "$bin" $name "${args[@]}" --lora-rank 4 --zero-stage 2 --output "$tmp/${name}_lora_zero2" 2> /dev/null
    ranks 2 "$bin" $name "${args[@]}" --lora-rank 4 --zero-stage 3 --output "$tmp/${name}_lora_zero3" 2> "$tmp/${name}_lora_zero3.err"
    [ -s "$tmp/${name}_lora_zero3/final/adapter/adapter_model.safetensors" ] &&
        cmp -s "$tmp/${name}_lora_zero2/final/adapter/adapter_model.safetensors" "$tmp/${name}_lora_zero3/final/adapter/adapter_model.safetensors" &&
        [ "$(json_values "$tmp/${name}_lora_zero2/metrics.jsonl" train/loss)" = "$(json_values "$tmp/${name}_lora_zero3/metrics.jsonl" train/loss)" ] &&
        pass "${name}_lora_zero3_same_adapters" || fail "${name}_lora_zero3_same_adapters" "$(tail -n 2 "$tmp/${name}_lora_zero3.err")"
done

# --- PPO / MA-PPO: each rank generates and trains on every other row of a rollout ----------
"$bin" rm --model "$model" --data "$data/pairs.jsonl" --max-seq-len 32 --per-device-train-batch-size 8 \
    --learning-rate 3e-3 --max-steps 6 --output "$tmp/ppo_rm" --quiet --threads 1 2> /dev/null
ppo=(--actor-model "$model" --reward-model "$tmp/ppo_rm/final" --prompts "$data/sft.jsonl" --eval-prompts "$data/sft_eval.jsonl"
     --eval-count 4 --rollout-batch-size 8 --generation-batch-size 8 --micro-batch-size 2 --max-new-tokens 10
     --max-iterations 4 --actor-learning-rate 1e-3 --critic-learning-rate 1e-3 --min-response-tokens 3 --threads 1 --quiet)
# Every path that needs the whole rollout: reward normalisation, advantage whitening, two
# minibatches and PPO epochs, PTX, EMA, the adaptive KL, dropped short responses.
extras=(--termination-condition fixed --ngram 3 --normalize-reward --whiten-advantages --num-minibatches 2 --ppo-epochs 2
        --enable-ema --ptx-data "$data/sft.jsonl" --ptx-coef 0.5 --kl-target 0.1)
"$bin" ppo "${ppo[@]}" "${extras[@]}" --output "$tmp/ppo_one" 2> "$tmp/ppo_one.err" || fail ppo_one_process "$(tail -n 2 "$tmp/ppo_one.err")"
ranks 2 "$bin" ppo "${ppo[@]}" "${extras[@]}" --output "$tmp/ppo_two" 2> "$tmp/ppo_two.err"
rc=$?
[ $rc -eq 0 ] && [ -f "$tmp/ppo_two/final/actor_ema/model.safetensors" ] && pass ppo_two_ranks_runs ||
    fail ppo_two_ranks_runs "exit $rc: $(tail -n 3 "$tmp/ppo_two.err")"
for key in train/score train/kl train/dropped train/policy_loss train/value_loss train/advantage train/clip_fraction \
           train/actor_grad_norm train/critic_grad_norm train/kl_coef eval/score; do
    close "$(json_values "$tmp/ppo_one/metrics.jsonl" $key)" "$(json_values "$tmp/ppo_two/metrics.jsonl" $key)" 1e-4 &&
        pass "ppo_two_ranks_same_$key" ||
        fail "ppo_two_ranks_same_$key" "$(json_values "$tmp/ppo_one/metrics.jsonl" $key) vs $(json_values "$tmp/ppo_two/metrics.jsonl" $key)"
done
close "$(logprobs_of "$tmp/ppo_one/final/actor")" "$(logprobs_of "$tmp/ppo_two/final/actor")" 1e-4 &&
    pass ppo_two_ranks_same_actor || fail ppo_two_ranks_same_actor "final actors' log-probs differ"
ranks 2 "$bin" ppo "${ppo[@]}" "${extras[@]}" --output "$tmp/ppo_two_again" 2> /dev/null
cmp -s "$tmp/ppo_two/final/actor/model.safetensors" "$tmp/ppo_two_again/final/actor/model.safetensors" &&
    cmp -s "$tmp/ppo_two/final/critic/model.safetensors" "$tmp/ppo_two_again/final/critic/model.safetensors" &&
    pass ppo_two_ranks_bit_identical_rerun || fail ppo_two_ranks_bit_identical_rerun "final weights differ"
# ppo_one_and_two_ranks NAME ARGS...: a PPO run in one process ($tmp/NAME_one) and on 2 ranks
# ($tmp/NAME_two); PASS NAME when their scores, policy losses and final actors agree (1e-4)
# and their reward-hacking signals, measured on the responses gathered from the ranks, are
# the same.
ppo_one_and_two_ranks() {
    local name=$1 signal
    shift
    "$bin" ppo "${ppo[@]}" "$@" --output "$tmp/${name}_one" 2> "$tmp/${name}_one.err"
    ranks 2 "$bin" ppo "${ppo[@]}" "$@" --output "$tmp/${name}_two" 2> "$tmp/${name}_two.err"
    local one="$tmp/${name}_one/metrics.jsonl" two="$tmp/${name}_two/metrics.jsonl"
    for signal in distinct_2 repetitive_fraction same_answer_fraction shared_trigram_fraction; do
        if [ "$(json_values "$one" "train/$signal")" != "$(json_values "$two" "train/$signal")" ]; then
            fail "$name" "train/$signal: $(json_values "$one" "train/$signal") in one process, $(json_values "$two" "train/$signal") on 2 ranks"
            return
        fi
    done
    close "$(json_values "$one" train/score) $(json_values "$one" train/policy_loss)" \
          "$(json_values "$two" train/score) $(json_values "$two" train/policy_loss)" 1e-4 &&
        close "$(logprobs_of "$tmp/${name}_one/final/actor")" "$(logprobs_of "$tmp/${name}_two/final/actor")" 1e-4 &&
        pass "$name" || fail "$name" "$(tail -n 2 "$tmp/${name}_two.err")"
}
# GRPO: the two answers to a prompt land on different ranks; the group statistics are gathered.
grpo=(--advantage-estimator grpo --samples-per-prompt 2 --termination-condition token)
ppo_one_and_two_ranks grpo_two_ranks_same_training "${grpo[@]}"
# GRPO (no critic) with the actor's gradients sharded (ZeRO-2); one process has no shards.
ppo_one_and_two_ranks grpo_zero2_two_ranks_same_training "${grpo[@]}" --zero-stage 2
# DAPO's group filter decides on the gathered scores: the same groups are left out on both.
# With no KL in the reward the old log-probs (and the logged KL and entropy) come from the
# training forward; GRPO's batch scaling takes the standard deviation of every rank's rewards.
# Refill rounds take the same prompts and row ids on every rank.
filtered=("${grpo[@]}" --reward lexicon --gold-lexicon data/austen/lexicon.tsv --filter-groups --max-generation-rounds 3
          --kl-ctl 0 --scale-rewards batch)
"$bin" ppo "${ppo[@]}" "${filtered[@]}" --output "$tmp/filter_one" 2> "$tmp/filter_one.err"
ranks 2 "$bin" ppo "${ppo[@]}" "${filtered[@]}" --output "$tmp/filter_two" 2> "$tmp/filter_two.err"
close "$(json_values "$tmp/filter_one/metrics.jsonl" train/uniform_groups_dropped) $(json_values "$tmp/filter_one/metrics.jsonl" train/policy_loss)" \
      "$(json_values "$tmp/filter_two/metrics.jsonl" train/uniform_groups_dropped) $(json_values "$tmp/filter_two/metrics.jsonl" train/policy_loss)" 1e-4 &&
    close "$(json_values "$tmp/filter_one/metrics.jsonl" train/kl) $(json_values "$tmp/filter_one/metrics.jsonl" train/entropy)" \
          "$(json_values "$tmp/filter_two/metrics.jsonl" train/kl) $(json_values "$tmp/filter_two/metrics.jsonl" train/entropy)" 1e-4 &&
    [ "$(json_values "$tmp/filter_two/metrics.jsonl" train/old_logprobs_from_training)" = "$(json_values "$tmp/filter_one/metrics.jsonl" train/old_logprobs_from_training)" ] &&
    [ "$(json_values "$tmp/filter_two/metrics.jsonl" train/responses_trained)" = "$(json_values "$tmp/filter_one/metrics.jsonl" train/responses_trained)" ] &&
    [ "$(json_values "$tmp/filter_one/metrics.jsonl" train/generation_rounds | cut -d' ' -f1)" = 3.0 ] &&
    [ "$(json_values "$tmp/filter_two/metrics.jsonl" train/old_logprobs_from_training | tr ' ' '\n' | sort -u)" = 1.0 ] &&
    close "$(logprobs_of "$tmp/filter_one/final/actor")" "$(logprobs_of "$tmp/filter_two/final/actor")" 1e-4 &&
    pass grpo_filter_two_ranks_same_training || fail grpo_filter_two_ranks_same_training "$(tail -n 2 "$tmp/filter_two.err")"
# ReMax: each rank answers its own prompts greedily for their baselines; the weighted sum of
# two reward sources (the reward model and the lexicon) on each rank's own responses.
ppo_one_and_two_ranks remax_two_ranks_same_training --advantage-estimator remax --termination-condition token \
    --reward model,lexicon --reward-weights 1,0.5 --gold-lexicon data/austen/lexicon.tsv
# GDPO: the two answers to a prompt land on different ranks; each source's scores are gathered
# before their in-group normalisation.
ppo_one_and_two_ranks gdpo_two_ranks_same_training "${grpo[@]}" --reward model,lexicon --reward-weights 1,0.5 \
    --gold-lexicon data/austen/lexicon.tsv --multi-objective-aggregation normalize_then_sum
# --reward command: each rank runs its own copy of the program for its own responses.
printf '%s\n' 'import json, sys' 'for line in sys.stdin:' '    print(json.loads(line)["response"].count("e") / 5, flush=True)' \
    > "$tmp/count_e.py"
ppo_one_and_two_ranks command_reward_two_ranks_same_training "${grpo[@]}" --reward command \
    --reward-command "python3 $tmp/count_e.py"
expect_error ppo_zero_stage_bad "--zero-stage must be 0, 1, 2 or 3" "$bin" ppo "${ppo[@]}" --output "$tmp/x" --zero-stage -1
expect_error ppo_zero_stage_cuda "--zero-stage 2 runs on --device cpu only" \
    "$bin" ppo "${ppo[@]}" --output "$tmp/x" --zero-stage 2 --device cuda
ranks 2 "$bin" ppo "${ppo[@]}" "${extras[@]}" --zero-stage 1 --output "$tmp/ppo_zero1" 2> "$tmp/ppo_zero1.err"
close "$(json_values "$tmp/ppo_two/metrics.jsonl" train/score)" "$(json_values "$tmp/ppo_zero1/metrics.jsonl" train/score)" 1e-5 &&
    close "$(logprobs_of "$tmp/ppo_two/final/actor")" "$(logprobs_of "$tmp/ppo_zero1/final/actor")" 1e-5 &&
    pass ppo_zero1_same_training || fail ppo_zero1_same_training "$(tail -n 2 "$tmp/ppo_zero1.err")"
# ZeRO-2 on the actor and the critic: the PTX micro-batch runs on rank 0 alone, so rank 1
# adds its zeros to that backward's sums; the minibatches of 4 samples give each rank 2.
ranks 2 "$bin" ppo "${ppo[@]}" "${extras[@]}" --zero-stage 2 --output "$tmp/ppo_zero2" 2> "$tmp/ppo_zero2.err"
close "$(json_values "$tmp/ppo_two/metrics.jsonl" train/score) $(json_values "$tmp/ppo_two/metrics.jsonl" train/critic_grad_norm)" \
      "$(json_values "$tmp/ppo_zero2/metrics.jsonl" train/score) $(json_values "$tmp/ppo_zero2/metrics.jsonl" train/critic_grad_norm)" 1e-5 &&
    close "$(logprobs_of "$tmp/ppo_two/final/actor")" "$(logprobs_of "$tmp/ppo_zero2/final/actor")" 1e-5 &&
    pass ppo_zero2_same_training || fail ppo_zero2_same_training "$(tail -n 2 "$tmp/ppo_zero2.err")"
# ZeRO-3: every decode step, experience forward and micro-step gathers the layers it runs, the
# ranks with fewer rows play the others' gathers, rank 0 evaluates while the others play its
# gathers and writes asking them for their shards, and each rank moves its shard of the EMA.
# The gathers change no arithmetic: the same bits as ZeRO-2 (actor, critic, EMA, evaluation
# samples) on 2 ranks and on 3 (rollouts of 3, 3 and 2 rows generated 2 at a time:
# two generations on two ranks, one on the third, which fails without the drain after them),
# and stage 0's training to 1e-5.
zero3_extras=("${extras[@]}" --generation-batch-size 2)
ranks 2 "$bin" ppo "${ppo[@]}" "${zero3_extras[@]}" --output "$tmp/ppo_zero0_gen2" 2> /dev/null
for n in 2 3; do
    ranks $n "$bin" ppo "${ppo[@]}" "${zero3_extras[@]}" --zero-stage 2 --output "$tmp/ppo_zero2_gen2_$n" 2> /dev/null
    ranks $n "$bin" ppo "${ppo[@]}" "${zero3_extras[@]}" --zero-stage 3 --output "$tmp/ppo_zero3_$n" 2> "$tmp/ppo_zero3_$n.err"
    cmp -s "$tmp/ppo_zero2_gen2_$n/final/actor/model.safetensors" "$tmp/ppo_zero3_$n/final/actor/model.safetensors" &&
        cmp -s "$tmp/ppo_zero2_gen2_$n/final/critic/model.safetensors" "$tmp/ppo_zero3_$n/final/critic/model.safetensors" &&
        cmp -s "$tmp/ppo_zero2_gen2_$n/final/actor_ema/model.safetensors" "$tmp/ppo_zero3_$n/final/actor_ema/model.safetensors" &&
        [ -n "$(ls "$tmp/ppo_zero3_$n"/samples/eval-*.jsonl 2> /dev/null)" ] &&
        diff -q <(cat "$tmp/ppo_zero2_gen2_$n"/samples/eval-*.jsonl) <(cat "$tmp/ppo_zero3_$n"/samples/eval-*.jsonl) > /dev/null &&
        pass "ppo_zero3_${n}_ranks_same_bits_as_zero2" || fail "ppo_zero3_${n}_ranks_same_bits_as_zero2" "$(tail -n 2 "$tmp/ppo_zero3_$n.err")"
    # The hybrid engine: the actor gathered whole for each generation and evaluation (each
    # rank then decodes at its own pace), resharded before training. Verified to fail without
    # the gathers (the weights and samples differ) and to stop with an internal error at the
    # first backward without the reshard.
    ranks $n "$bin" ppo "${ppo[@]}" "${zero3_extras[@]}" --zero-stage 3 --enable-hybrid-engine \
        --output "$tmp/ppo_zero3_hybrid_$n" 2> "$tmp/ppo_zero3_hybrid_$n.err"
    cmp -s "$tmp/ppo_zero3_$n/final/actor/model.safetensors" "$tmp/ppo_zero3_hybrid_$n/final/actor/model.safetensors" &&
        cmp -s "$tmp/ppo_zero3_$n/final/critic/model.safetensors" "$tmp/ppo_zero3_hybrid_$n/final/critic/model.safetensors" &&
        [ -n "$(ls "$tmp/ppo_zero3_hybrid_$n"/samples/eval-*.jsonl 2> /dev/null)" ] &&
        diff -q <(cat "$tmp/ppo_zero3_$n"/samples/eval-*.jsonl) <(cat "$tmp/ppo_zero3_hybrid_$n"/samples/eval-*.jsonl) > /dev/null &&
        pass "ppo_zero3_hybrid_engine_${n}_ranks_same_bits" ||
        fail "ppo_zero3_hybrid_engine_${n}_ranks_same_bits" "$(tail -n 2 "$tmp/ppo_zero3_hybrid_$n.err")"
done
close "$(json_values "$tmp/ppo_zero0_gen2/metrics.jsonl" train/score) $(json_values "$tmp/ppo_zero0_gen2/metrics.jsonl" train/critic_grad_norm)" \
      "$(json_values "$tmp/ppo_zero3_2/metrics.jsonl" train/score) $(json_values "$tmp/ppo_zero3_2/metrics.jsonl" train/critic_grad_norm)" 1e-5 &&
    close "$(logprobs_of "$tmp/ppo_zero0_gen2/final/actor")" "$(logprobs_of "$tmp/ppo_zero3_2/final/actor")" 1e-5 &&
    pass ppo_zero3_same_training_as_zero0 || fail ppo_zero3_same_training_as_zero0 "$(tail -n 2 "$tmp/ppo_zero3_2.err")"
# GRPO without a critic: the actor alone sharded.
ranks 2 "$bin" ppo "${ppo[@]}" "${grpo[@]}" --zero-stage 3 --output "$tmp/grpo_zero3" 2> "$tmp/grpo_zero3.err"
cmp -s "$tmp/grpo_zero2_two_ranks_same_training_two/final/actor/model.safetensors" "$tmp/grpo_zero3/final/actor/model.safetensors" &&
    pass grpo_zero3_same_bits_as_zero2 || fail grpo_zero3_same_bits_as_zero2 "$(tail -n 2 "$tmp/grpo_zero3.err")"
# same_ppo_adapters NAME A B: PPO runs A and B (output folders; B's stderr in B.err) saved the
# same actor, critic and EMA adapters and wrote the same evaluation samples, bit for bit.
same_ppo_adapters() {
    local name=$1 a=$2 b=$3 same=0 part
    for part in actor critic actor_ema; do
        cmp -s "$a/final/$part/adapter/adapter_model.safetensors" "$b/final/$part/adapter/adapter_model.safetensors" &&
            same=$((same + 1))
    done
    [ "$same" = 3 ] && [ -n "$(ls "$b"/samples/eval-*.jsonl 2> /dev/null)" ] &&
        diff -q <(cat "$a"/samples/eval-*.jsonl) <(cat "$b"/samples/eval-*.jsonl) > /dev/null &&
        pass "$name" || fail "$name" "$same of 3 adapters equal: $(tail -n 2 "$b.err")"
}
# LoRA on the actor (its base is also the reference) and the critic under ZeRO-3: the bases
# sharded, the adapters trained as under ZeRO-2. On 3 ranks the same actor, critic and EMA
# adapters and evaluation samples as ZeRO-2, with and without the hybrid engine.
ranks 3 "$bin" ppo "${ppo[@]}" "${zero3_extras[@]}" --actor-lora-rank 4 --critic-lora-rank 4 --zero-stage 2 \
    --output "$tmp/ppo_lora_zero2" 2> /dev/null
for mode in plain hybrid_engine; do
    extra=()
    [ $mode = hybrid_engine ] && extra=(--enable-hybrid-engine)
    ranks 3 "$bin" ppo "${ppo[@]}" "${zero3_extras[@]}" --actor-lora-rank 4 --critic-lora-rank 4 --zero-stage 3 "${extra[@]}" \
        --output "$tmp/ppo_lora_zero3_$mode" 2> "$tmp/ppo_lora_zero3_$mode.err"
    same_ppo_adapters "ppo_lora_zero3_${mode}_same_adapters_as_zero2" "$tmp/ppo_lora_zero2" "$tmp/ppo_lora_zero3_$mode"
done
# Saved actor and critic adapters as the start: read on every rank after the models start
# (the EMA's too, and the reference's, the actor's sharded base with its saved adapter). On 2
# ranks ZeRO-2's adapters and samples, bit for bit (verified to fail without the EMA's or the
# reference's read).
saved=(--actor-lora-adapter "$tmp/ppo_lora_zero2/final/actor" --critic-lora-adapter "$tmp/ppo_lora_zero2/final/critic"
       --max-iterations 2)
for stage in 2 3; do
    ranks 2 "$bin" ppo "${ppo[@]}" "${zero3_extras[@]}" "${saved[@]}" --zero-stage $stage \
        --output "$tmp/ppo_saved_adapters_zero$stage" 2> "$tmp/ppo_saved_adapters_zero$stage.err"
done
same_ppo_adapters ppo_lora_zero3_from_saved_adapters_same_as_zero2 "$tmp/ppo_saved_adapters_zero2" "$tmp/ppo_saved_adapters_zero3"
# DoRA on both, on 3 ranks with the hybrid engine (the EMA's magnitudes set at its start too).
dora=(--actor-lora-rank 4 --critic-lora-rank 4 --actor-use-dora --critic-use-dora)
for stage in 2 3; do
    ranks 3 "$bin" ppo "${ppo[@]}" "${zero3_extras[@]}" "${dora[@]}" --zero-stage $stage --enable-hybrid-engine \
        --output "$tmp/ppo_dora_zero$stage" 2> "$tmp/ppo_dora_zero$stage.err"
done
same_ppo_adapters ppo_dora_zero3_same_adapters_as_zero2 "$tmp/ppo_dora_zero2" "$tmp/ppo_dora_zero3"
expect_error ppo_zero3_qlora "not with --actor-quantize q8_0" \
    "$bin" ppo "${ppo[@]}" --actor-lora-rank 4 --actor-quantize q8_0 --zero-stage 3 --output "$tmp/x"
# LoRA on the actor (the reference is its base) and the critic, their moments sharded.
"$bin" ppo "${ppo[@]}" "${extras[@]}" --actor-lora-rank 4 --critic-lora-rank 4 --output "$tmp/ppo_lora_one" 2> /dev/null
ranks 2 "$bin" ppo "${ppo[@]}" "${extras[@]}" --actor-lora-rank 4 --critic-lora-rank 4 --zero-stage 1 \
    --output "$tmp/ppo_lora_two" 2> "$tmp/ppo_lora_two.err"
close "$(json_values "$tmp/ppo_lora_one/metrics.jsonl" train/score)" "$(json_values "$tmp/ppo_lora_two/metrics.jsonl" train/score)" 1e-4 &&
    close "$(json_values "$tmp/ppo_lora_one/metrics.jsonl" train/kl)" "$(json_values "$tmp/ppo_lora_two/metrics.jsonl" train/kl)" 1e-4 &&
    close "$(logprobs_of "$tmp/ppo_lora_one/final/actor")" "$(logprobs_of "$tmp/ppo_lora_two/final/actor")" 1e-4 &&
    pass ppo_lora_two_ranks_zero1_same_training || fail ppo_lora_two_ranks_zero1_same_training "$(tail -n 2 "$tmp/ppo_lora_two.err")"
# Three ranks: a rollout of 8 rows does not divide evenly (3, 3, 2 rows).
ranks 3 "$bin" ppo "${ppo[@]}" "${extras[@]}" --output "$tmp/ppo_three" 2> "$tmp/ppo_three.err"
close "$(json_values "$tmp/ppo_one/metrics.jsonl" train/score)" "$(json_values "$tmp/ppo_three/metrics.jsonl" train/score)" 1e-4 &&
    close "$(logprobs_of "$tmp/ppo_one/final/actor")" "$(logprobs_of "$tmp/ppo_three/final/actor")" 1e-4 &&
    pass ppo_three_ranks_uneven_rows || fail ppo_three_ranks_uneven_rows "$(tail -n 2 "$tmp/ppo_three.err")"

# A rank killed after a random iteration's checkpoint; the resumed job ends where an
# uninterrupted one does.
long_ppo=("${ppo[@]}" --max-iterations 16 --num-train-epochs 4 --save-every 1 --eval-every 0 --termination-condition fixed --ngram 3)
ranks 2 "$bin" ppo "${long_ppo[@]}" --output "$tmp/ppo_straight" 2> /dev/null
k=$((2 + RANDOM % 8))
kill_a_rank "$tmp/ppo_killed/checkpoint-$k" "$tmp/ppo_killed" 1 \
    ranks 2 "$bin" ppo "${long_ppo[@]}" --output "$tmp/ppo_killed" --keep-last 0
if [ -d "$tmp/ppo_killed/final" ]; then
    fail ppo_two_ranks_killed_mid_run "the run finished before the kill"
else
    ranks 2 "$bin" ppo "${long_ppo[@]}" --output "$tmp/ppo_killed" --resume 2> "$tmp/ppo_killed.err"
    cmp -s "$tmp/ppo_straight/final/actor/model.safetensors" "$tmp/ppo_killed/final/actor/model.safetensors" &&
        pass "ppo_two_ranks_resume_bit_identical (killed after iteration $k)" ||
        fail ppo_two_ranks_resume_bit_identical "$(tail -n 2 "$tmp/ppo_killed.err")"
fi
expect_error ppo_resume_other_process_count "made by 2 processes, this run has 1" \
    "$bin" ppo "${long_ppo[@]}" --output "$tmp/ppo_straight" --resume
# The same under ZeRO-3, with the EMA: each checkpoint written by rank 0 asking the other rank
# for its shards, each rank reading back only its own on resume.
ranks 2 "$bin" ppo "${long_ppo[@]}" --enable-ema --zero-stage 3 --output "$tmp/ppo_zero3_straight" 2> /dev/null
kill_a_rank "$tmp/ppo_zero3_killed/checkpoint-$k" "$tmp/ppo_zero3_killed" 1 \
    ranks 2 "$bin" ppo "${long_ppo[@]}" --enable-ema --zero-stage 3 --output "$tmp/ppo_zero3_killed" --keep-last 0
ranks 2 "$bin" ppo "${long_ppo[@]}" --enable-ema --zero-stage 3 --output "$tmp/ppo_zero3_killed" --resume \
    2> "$tmp/ppo_zero3_killed.err"
[ "$exit_rc" -ne 0 ] && cmp -s "$tmp/ppo_zero3_straight/final/actor/model.safetensors" "$tmp/ppo_zero3_killed/final/actor/model.safetensors" &&
    cmp -s "$tmp/ppo_zero3_straight/final/critic/model.safetensors" "$tmp/ppo_zero3_killed/final/critic/model.safetensors" &&
    cmp -s "$tmp/ppo_zero3_straight/final/actor_ema/model.safetensors" "$tmp/ppo_zero3_killed/final/actor_ema/model.safetensors" &&
    pass "ppo_zero3_resume_bit_identical (killed after iteration $k)" ||
    fail ppo_zero3_resume_bit_identical "kill exit $exit_rc: $(tail -n 2 "$tmp/ppo_zero3_killed.err")"
# And with LoRA: the adapters read back after the first start, checked against the base's
# fingerprint taken from the shards.
lora_long=("${long_ppo[@]}" --actor-lora-rank 4 --critic-lora-rank 4 --enable-ema --zero-stage 3)
ranks 2 "$bin" ppo "${lora_long[@]}" --output "$tmp/ppo_lora_zero3_straight" 2> /dev/null
kill_a_rank "$tmp/ppo_lora_zero3_killed/checkpoint-$k" "$tmp/ppo_lora_zero3_killed" 1 \
    ranks 2 "$bin" ppo "${lora_long[@]}" --output "$tmp/ppo_lora_zero3_killed" --keep-last 0
ranks 2 "$bin" ppo "${lora_long[@]}" --output "$tmp/ppo_lora_zero3_killed" --resume 2> "$tmp/ppo_lora_zero3_killed.err"
same=0
for part in actor critic actor_ema; do
    cmp -s "$tmp/ppo_lora_zero3_straight/final/$part/adapter/adapter_model.safetensors" \
        "$tmp/ppo_lora_zero3_killed/final/$part/adapter/adapter_model.safetensors" && same=$((same + 1))
done
[ "$exit_rc" -ne 0 ] && [ "$same" = 3 ] && pass "ppo_lora_zero3_resume_bit_identical (killed after iteration $k)" ||
    fail ppo_lora_zero3_resume_bit_identical "kill exit $exit_rc, $same of 3 equal: $(tail -n 2 "$tmp/ppo_lora_zero3_killed.err")"

# --- inference with rewards: each rank its batches, rank 0 writes the same file -----------
infer=(--model "$model" --reward-model "$tmp/ppo_rm/final" --data "$data/sft.jsonl" --count 7 --batch-size 2
       --max-new-tokens 8 --threads 1 --quiet)
same_file_on_ranks infer "${infer[@]}"
"$bin" infer "${infer[@]}" --best-of 3 --output "$tmp/best_one.jsonl" 2> /dev/null
ranks 2 "$bin" infer "${infer[@]}" --best-of 3 --output "$tmp/best_two.jsonl" 2> "$tmp/best_two.err"
[ -s "$tmp/best_one.jsonl" ] && cmp -s "$tmp/best_one.jsonl" "$tmp/best_two.jsonl" && pass infer_best_of_two_ranks_same_file ||
    fail infer_best_of_two_ranks_same_file "$(tail -n 2 "$tmp/best_two.err")"
ref=(--reward-model "$tmp/ppo_rm/final" --data "$data/pairs.jsonl" --ref-scores --count 7 --batch-size 2 --threads 1 --quiet)
"$bin" infer "${ref[@]}" --output "$tmp/ref_one.jsonl" 2> /dev/null
ranks 2 "$bin" infer "${ref[@]}" --output "$tmp/ref_two.jsonl" 2> "$tmp/ref_two.err"
[ -s "$tmp/ref_one.jsonl" ] && cmp -s "$tmp/ref_one.jsonl" "$tmp/ref_two.jsonl" && pass infer_ref_scores_two_ranks_same_file ||
    fail infer_ref_scores_two_ranks_same_file "$(tail -n 2 "$tmp/ref_two.err")"

# --- generate: each rank its batches, rank 0 writes every row in order -------------------
head -n 7 "$data/sft.jsonl" > "$tmp/prompts7.jsonl"
generate=(--model "$model" --input "$tmp/prompts7.jsonl" --batch-size 2 --max-new-tokens 8 --temperature 0.9 --threads 1)
same_file_on_ranks generate "${generate[@]}"
"$bin" generate "${generate[@]}" --num-return-sequences 3 --output "$tmp/n3_one.jsonl" 2> /dev/null
ranks 2 "$bin" generate "${generate[@]}" --num-return-sequences 3 --output "$tmp/n3_two.jsonl" 2> "$tmp/n3_two.err"
[ "$(wc -l < "$tmp/n3_one.jsonl")" = 21 ] && cmp -s "$tmp/n3_one.jsonl" "$tmp/n3_two.jsonl" &&
    pass generate_num_return_sequences_two_ranks || fail generate_num_return_sequences_two_ranks "$(tail -n 2 "$tmp/n3_two.err")"
ranks 2 "$bin" generate "${generate[@]}" > "$tmp/generate_stdout.jsonl" 2> /dev/null
cmp -s "$tmp/generate_one.jsonl" "$tmp/generate_stdout.jsonl" && pass generate_two_ranks_stdout ||
    fail generate_two_ranks_stdout "stdout differs from the one-process file"

# --- the pipeline with a launcher: every stage on 2 ranks -----------------------------------
cat > "$tmp/pipeline.json" <<JSON
{"output": "$tmp/pipeline", "model": "$model", "threads": 1, "quiet": true,
 "launcher": ["mpirun", "--oversubscribe", "--bind-to", "none", "-np", "2"],
 "sft": {"data": "$data/sft.jsonl", "max-seq-len": 32, "per-device-train-batch-size": 2, "learning-rate": 3e-3, "max-steps": 3},
 "rm": {"data": "$data/pairs.jsonl", "max-seq-len": 32, "per-device-train-batch-size": 4, "learning-rate": 3e-3, "max-steps": 3},
 "ppo": {"prompts": "$data/sft.jsonl", "rollout-batch-size": 8, "generation-batch-size": 4, "micro-batch-size": 2,
         "max-new-tokens": 8, "max-iterations": 2, "min-response-tokens": 1, "termination-condition": "fixed", "ngram": 3}}
JSON
"$bin" pipeline "$tmp/pipeline.json" 2> "$tmp/pipeline.err"
rc=$?
states=$(cat "$tmp"/pipeline/{sft,rm,ppo}/checkpoint-*/trainer_state.json 2> /dev/null | grep -c '"world_size": 2')
[ $rc -eq 0 ] && [ -f "$tmp/pipeline/ppo/final/actor/model.safetensors" ] && [ "$states" = 3 ] &&
    pass pipeline_launcher_two_ranks || fail pipeline_launcher_two_ranks "exit $rc, $states stages on 2 ranks: $(tail -n 2 "$tmp/pipeline.err")"
python3 -c "import json, sys; c = json.load(open(sys.argv[1])); c['launcher'] = 'mpirun -np 2'; json.dump(c, open(sys.argv[2], 'w'))" \
    "$tmp/pipeline.json" "$tmp/bad_launcher.json"
expect_error pipeline_bad_launcher '"launcher" in' "$bin" pipeline "$tmp/bad_launcher.json"

# --- errors name the rank ----------------------------------------------------------------
ranks 2 "$bin" sft "${sft[@]}" --data "$tmp/missing.jsonl" --output "$tmp/x" > /dev/null 2> "$tmp/missing.err"
rc=$?
[ $rc -eq 2 ] && grep -q "^marlhf: error: \[rank 0 of 2\] .*missing.jsonl" "$tmp/missing.err" &&
    grep -q "^marlhf: error: \[rank 1 of 2\] .*missing.jsonl" "$tmp/missing.err" &&
    pass errors_name_the_rank || fail errors_name_the_rank "exit $rc: $(grep 'marlhf: error' "$tmp/missing.err" | head -n 2)"

# --- commands that run as one process ---------------------------------------------------
ranks 2 "$bin" logprobs --model "$model" --input "$tmp/ids.jsonl" > /dev/null 2> "$tmp/logprobs.err"
rc=$?
[ $rc -eq 2 ] && grep -q '^marlhf: error: \[rank 0 of 2\] marlhf logprobs runs as one process' "$tmp/logprobs.err" &&
    pass logprobs_under_mpirun_refused || fail logprobs_under_mpirun_refused "exit $rc: $(head -n 2 "$tmp/logprobs.err")"

[ "$failures" -eq 0 ]
