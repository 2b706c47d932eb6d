#!/usr/bin/env bash
# QLoRA end to end on the tiny model (tests/fixtures/models/tiny_chat): LoRA adapters trained
# on a quantized frozen base (--quantize q8_0 | q4_0 | nf4 | nf4-single) with sft, rm, dpo and kto. The runs learn;
# the saved final/ holds the dequantized base with the adapters merged (a plain float32 model
# computing what the adapted quantized model computes) and the adapter, which records its
# quantized base; the adapter goes back on that base with --quantize and is refused without;
# resume after SIGKILL is bit-identical and a resume on another base is refused; --quantize
# without LoRA or with an unknown type is a one-line error; on --device cuda it runs (where
# no GPU is present, the one error is the device's). QDoRA (--use-dora over a quantized base)
# learns and merges; PPO takes it for actor and critic. ppo and GRPO
# with --actor-quantize / --critic-quantize: the run is the float32 run on the dequantized
# bases (tools/dequantize_model.py), its first iteration is on-policy (KL 0, ratio 1), it is
# reproducible, resumes bit for bit, learns (GRPO), and the bad combinations are refused.
# Prints PASS/FAIL per case.
set -u
cd "$(dirname "$0")/../.."
bin=${MARLHF_BIN:-build/marlhf}
tmp=${MARLHF_TEST_TMP:-/tmp}/cli_qlora
rm -rf "$tmp" && mkdir -p "$tmp"
model=tests/fixtures/models/tiny_chat
data=tests/fixtures/train
failures=0
. tests/cli_helpers.sh

sft=(--model "$model" --data "$data/sft.jsonl" --eval-data "$data/sft_eval.jsonl" --max-seq-len 32
     --per-device-train-batch-size 4 --gradient-accumulation-steps 2 --num-train-epochs 4 --threads 2 --quiet)
echo '{"ids": [1, 5, 9, 14, 2, 7, 33, 4]}' > "$tmp/ids.jsonl"

# --- bad input --------------------------------------------------------------------------
expect_error qlora_needs_lora "--quantize q8_0 needs --lora-rank or --lora-adapter" \
    "$bin" sft "${sft[@]}" --quantize q8_0 --output "$tmp/x"
expect_error qlora_unknown_type "unknown quantization 'q3_k' (--quantize)" \
    "$bin" sft "${sft[@]}" --quantize q3_k --lora-rank 4 --output "$tmp/x"
expect_runs_on_cuda qlora_cuda_allowed \
    "$bin" dpo --model "$model" --data "$data/pairs.jsonl" --quantize q4_0 --lora-rank 4 --device cuda --output "$tmp/x"
expect_error qlora_nf4_needs_lora "--quantize nf4 needs --lora-rank or --lora-adapter" \
    "$bin" sft "${sft[@]}" --quantize nf4 --output "$tmp/x"
expect_runs_on_cuda qlora_nf4_cuda_allowed \
    "$bin" kto --model "$model" --data "$data/pairs.jsonl" --quantize nf4 --lora-rank 4 --device cuda --output "$tmp/x"
expect_runs_on_cuda qlora_nf4_single_cuda_allowed \
    "$bin" sft "${sft[@]}" --quantize nf4-single --lora-rank 4 --device cuda --output "$tmp/x"
# NF4's blocks of 64 go along a row: the Qwen3 fixture's attention rows of 96 are refused (Q4_0's 32 fit).
expect_error qlora_nf4_rows_of_96 "quantized weights (nf4) need the model's hidden, intermediate and attention sizes to be multiples of 64" \
    "$bin" logprobs --model tests/fixtures/models/qwen3 --quantize nf4 --input "$tmp/ids.jsonl"
[ ! -e "$tmp/x" ] && pass qlora_refusals_write_nothing || fail qlora_refusals_write_nothing "$tmp/x exists"

for q in q8_0 q4_0 nf4 nf4-single; do
    # --- SFT on the quantized base: learns, saves merged weights and the adapter ------------
    "$bin" sft "${sft[@]}" --learning-rate 1e-2 --lora-rank 8 --lora-alpha 16 --quantize $q --eval-every 6 \
        --output "$tmp/sft_$q" 2> "$tmp/sft_$q.err"
    rc=$?
    final=$tmp/sft_$q/final
    losses=$(json_values "$tmp/sft_$q/metrics.jsonl" eval/loss 2> /dev/null)
    [ $rc -eq 0 ] && python3 -c "import sys; v=list(map(float, sys.argv[1].split())); sys.exit(0 if v[-1] < 0.95 * v[0] else 1)" "$losses" &&
        pass "sft_${q}_learns (eval loss $losses)" || fail sft_${q}_learns "exit $rc, eval losses $losses: $(tail -n 2 "$tmp/sft_$q.err")"
    python3 -c '
import json, sys
c = json.load(open(sys.argv[1]))
assert c["peft_type"] == "LORA" and c["r"] == 8 and c["marlhf_base_quantize"] == sys.argv[2], c
' "$final/adapter/adapter_config.json" $q && pass sft_${q}_adapter_records_base ||
        fail sft_${q}_adapter_records_base "$(cat "$final/adapter/adapter_config.json")"
    # final/ is float32 (dequantized base + adapters): the base's size, loads without --quantize
    # and equals the adapter on the quantized base (here decoded by the inference kernels,
    # which also quantize the activations: measured 0.002-0.003, limit 0.01).
    "$bin" logprobs --model "$final" --input "$tmp/ids.jsonl" > "$tmp/merged_$q.jsonl" 2> "$tmp/merged_$q.err"
    "$bin" logprobs --model "$model" --quantize $q --lora-adapter "$final" --input "$tmp/ids.jsonl" \
        > "$tmp/adapter_$q.jsonl" 2> "$tmp/adapter_$q.err"
    [ "$(stat -c %s "$final/model.safetensors")" -le "$(($(stat -c %s "$model/model.safetensors") + 4096))" ] &&
        logprobs_close "$tmp/merged_$q.jsonl" "$tmp/adapter_$q.jsonl" 0.01 &&
        pass sft_${q}_merged_equals_adapter_on_quantized_base ||
        fail sft_${q}_merged_equals_adapter_on_quantized_base "$(tail -n 1 "$tmp/merged_$q.err") $(tail -n 1 "$tmp/adapter_$q.err")"
    expect_error ${q}_adapter_without_quantize "was trained on a base quantized as $q: load it with --quantize $q" \
        "$bin" generate --model "$model" --lora-adapter "$final" --max-new-tokens 2 hello
    "$bin" generate --model "$model" --quantize $q --lora-adapter "$final" --max-new-tokens 3 --temperature 0 \
        --input "$data/sft_eval.jsonl" --output "$tmp/generated_$q.jsonl" 2> "$tmp/generate_$q.err" &&
        [ -s "$tmp/generated_$q.jsonl" ] && pass generate_${q}_lora_adapter || fail generate_${q}_lora_adapter "$(tail -n 1 "$tmp/generate_$q.err")"
done
# QDoRA: DoRA over the NF4 base (magnitudes and weight norms from the dequantized weights):
# learns, records DoRA and its base, and the merged final/ equals the adapter on the NF4 base.
"$bin" sft "${sft[@]}" --learning-rate 1e-2 --lora-rank 8 --lora-alpha 16 --quantize nf4 --use-dora --eval-every 6 \
    --output "$tmp/sft_qdora" 2> "$tmp/sft_qdora.err"
rc=$?
losses=$(json_values "$tmp/sft_qdora/metrics.jsonl" eval/loss 2> /dev/null)
[ $rc -eq 0 ] && python3 -c "import sys; v=list(map(float, sys.argv[1].split())); sys.exit(0 if v[-1] < 0.95 * v[0] else 1)" "$losses" &&
    python3 -c '
import json, sys
c = json.load(open(sys.argv[1]))
assert c["use_dora"] is True and c["marlhf_base_quantize"] == "nf4", c
' "$tmp/sft_qdora/final/adapter/adapter_config.json" && pass "sft_qdora_nf4_learns (eval loss $losses)" ||
    fail sft_qdora_nf4_learns "exit $rc, eval losses $losses: $(tail -n 2 "$tmp/sft_qdora.err")"
"$bin" logprobs --model "$tmp/sft_qdora/final" --input "$tmp/ids.jsonl" > "$tmp/merged_qdora.jsonl" 2> "$tmp/merged_qdora.err"
"$bin" logprobs --model "$model" --quantize nf4 --lora-adapter "$tmp/sft_qdora/final" --input "$tmp/ids.jsonl" \
    > "$tmp/adapter_qdora.jsonl" 2> "$tmp/adapter_qdora.err"
logprobs_close "$tmp/merged_qdora.jsonl" "$tmp/adapter_qdora.jsonl" 0.01 && pass sft_qdora_merged_equals_adapter_on_quantized_base ||
    fail sft_qdora_merged_equals_adapter_on_quantized_base "$(tail -n 1 "$tmp/merged_qdora.err") $(tail -n 1 "$tmp/adapter_qdora.err")"
# The two quantizations train differently (another base), and neither is the float32 run.
"$bin" sft "${sft[@]}" --learning-rate 1e-2 --lora-rank 8 --lora-alpha 16 --eval-every 6 --output "$tmp/sft_f32" 2> /dev/null
! cmp -s "$tmp/sft_q8_0/final/adapter/adapter_model.safetensors" "$tmp/sft_q4_0/final/adapter/adapter_model.safetensors" &&
    ! cmp -s "$tmp/sft_q8_0/final/adapter/adapter_model.safetensors" "$tmp/sft_f32/final/adapter/adapter_model.safetensors" &&
    pass qlora_adapters_differ_by_base || fail qlora_adapters_differ_by_base "identical adapters"
expect_error sft_float_adapter_on_quantized_base "trained on a base quantized as none, and this run's base is q8_0" \
    "$bin" sft "${sft[@]}" --lora-adapter "$tmp/sft_f32/final" --quantize q8_0 --output "$tmp/x"
expect_error q8_0_adapter_on_q4_0_base "quantized as q8_0" \
    "$bin" logprobs --model "$model" --quantize q4_0 --lora-adapter "$tmp/sft_q8_0/final" --input "$tmp/ids.jsonl"
expect_error nf4_adapter_on_nf4_single_base "quantized as nf4" \
    "$bin" logprobs --model "$model" --quantize nf4-single --lora-adapter "$tmp/sft_nf4/final" --input "$tmp/ids.jsonl"
# NF4 with and without double quantization are other bases (other scales), and not Q4_0.
! cmp -s "$tmp/sft_nf4/final/adapter/adapter_model.safetensors" "$tmp/sft_nf4-single/final/adapter/adapter_model.safetensors" &&
    ! cmp -s "$tmp/sft_nf4/final/adapter/adapter_model.safetensors" "$tmp/sft_q4_0/final/adapter/adapter_model.safetensors" &&
    pass qlora_nf4_adapters_differ_by_base || fail qlora_nf4_adapters_differ_by_base "identical adapters"
mkdir -p "$tmp/bad_base" && cp "$tmp/sft_q8_0/final/adapter/adapter_model.safetensors" "$tmp/bad_base/"
python3 -c 'import json, sys; c = json.load(open(sys.argv[1])); c["marlhf_base_quantize"] = "q3"; json.dump(c, open(sys.argv[2], "w"))' \
    "$tmp/sft_q8_0/final/adapter/adapter_config.json" "$tmp/bad_base/adapter_config.json"
expect_error adapter_bad_base_quantize "bad_base/adapter_config.json: \"marlhf_base_quantize\" must be" \
    "$bin" logprobs --model "$model" --quantize q8_0 --lora-adapter "$tmp/bad_base" --input "$tmp/ids.jsonl"

# --- exact resume -------------------------------------------------------------------------
long=("${sft[@]}" --learning-rate 1e-2 --lora-rank 4 --num-train-epochs "$(kill_test_epochs 16)" --save-every 1 --keep-last 2
      --eval-every 0)
for q in q4_0 nf4; do
    "$bin" sft "${long[@]}" --keep-last 0 --quantize $q --output "$tmp/straight_$q" 2> /dev/null
    interrupted_run "$tmp/killed_$q" "$bin" sft "${long[@]}" --quantize $q --output "$tmp/killed_$q"
    [ "$finished_early" = 1 ] && fail qlora_${q}_kill_mid_run "the run finished before the kill"
    cmp -s "$tmp/straight_$q/final/model.safetensors" "$tmp/killed_$q/final/model.safetensors" &&
        cmp -s "$tmp/straight_$q/final/adapter/adapter_model.safetensors" "$tmp/killed_$q/final/adapter/adapter_model.safetensors" &&
        pass qlora_${q}_resume_bit_identical || fail qlora_${q}_resume_bit_identical "$(tail -n 2 "$tmp/killed_$q.err")"
    # The same from a chosen checkpoint (the kill above may land before the first checkpoint is
    # whole): the run cut back to step 5 and resumed ends bit for bit where it ended.
    mkdir -p "$tmp/cut_$q" && cp -r "$tmp/straight_$q/." "$tmp/cut_$q/" && rm -rf "$tmp/cut_$q/final"
    for d in "$tmp"/cut_$q/checkpoint-*; do [ "${d##*-}" -gt 5 ] && rm -rf "$d"; done
    "$bin" sft "${long[@]}" --keep-last 0 --quantize $q --output "$tmp/cut_$q" --resume 2> "$tmp/cut_$q.err"
    [ -d "$tmp/cut_$q/checkpoint-5" ] && ls -d "$tmp"/cut_$q/checkpoint-* | grep -q -- '-6$' &&
        cmp -s "$tmp/straight_$q/final/adapter/adapter_model.safetensors" "$tmp/cut_$q/final/adapter/adapter_model.safetensors" &&
        cmp -s "$tmp/straight_$q/final/model.safetensors" "$tmp/cut_$q/final/model.safetensors" &&
        pass qlora_${q}_resume_from_step_5_bit_identical || fail qlora_${q}_resume_from_step_5_bit_identical "$(tail -n 2 "$tmp/cut_$q.err")"
    before=$(ls -R "$tmp/straight_$q" | md5sum)
    expect_error qlora_${q}_resume_without_quantize "quantized as $q, and this run's base is none" \
        "$bin" sft "${long[@]}" --output "$tmp/straight_$q" --resume
    expect_error qlora_${q}_resume_other_quantize "quantized as $q, and this run's base is q8_0" \
        "$bin" sft "${long[@]}" --quantize q8_0 --output "$tmp/straight_$q" --resume
    [ "$(ls -R "$tmp/straight_$q" | md5sum)" = "$before" ] && pass qlora_${q}_refused_resume_keeps_run || fail qlora_${q}_refused_resume_keeps_run "files changed"
done

# --- rm, dpo, kto on a quantized base --------------------------------------------------------
small=(--max-seq-len 32 --per-device-train-batch-size 4 --threads 2 --quiet --lora-rank 4 --max-steps 2)
"$bin" rm --model "$model" --data "$data/pairs.jsonl" "${small[@]}" --quantize q8_0 --output "$tmp/rm" 2> "$tmp/rm.err" &&
    python3 -c "import json,sys; c=json.load(open(sys.argv[1])); assert c['marlhf_base_quantize']=='q8_0' and c['modules_to_save']==['score']" \
        "$tmp/rm/final/adapter/adapter_config.json" && pass rm_q8_0 || fail rm_q8_0 "$(tail -n 2 "$tmp/rm.err")"
"$bin" dpo --model "$model" --data "$data/pairs.jsonl" "${small[@]}" --learning-rate 1e-3 --quantize q4_0 --output "$tmp/dpo" \
    2> "$tmp/dpo.err" && [ -f "$tmp/dpo/final/adapter/adapter_model.safetensors" ] && pass dpo_q4_0 ||
    fail dpo_q4_0 "$(tail -n 2 "$tmp/dpo.err")"
"$bin" kto --model "$model" --data "$data/pairs.jsonl" "${small[@]}" --learning-rate 1e-3 --quantize q8_0 --output "$tmp/kto" \
    2> "$tmp/kto.err" && [ -f "$tmp/kto/final/adapter/adapter_model.safetensors" ] && pass kto_q8_0 ||
    fail kto_q8_0 "$(tail -n 2 "$tmp/kto.err")"
"$bin" rm --model "$model" --data "$data/pairs.jsonl" "${small[@]}" --quantize nf4 --output "$tmp/rm_nf4" 2> "$tmp/rm_nf4.err" &&
    python3 -c "import json,sys; c=json.load(open(sys.argv[1])); assert c['marlhf_base_quantize']=='nf4' and c['modules_to_save']==['score']" \
        "$tmp/rm_nf4/final/adapter/adapter_config.json" && pass rm_nf4 || fail rm_nf4 "$(tail -n 2 "$tmp/rm_nf4.err")"
"$bin" dpo --model "$model" --data "$data/pairs.jsonl" "${small[@]}" --learning-rate 1e-3 --quantize nf4 --output "$tmp/dpo_nf4" \
    2> "$tmp/dpo_nf4.err" && [ -f "$tmp/dpo_nf4/final/adapter/adapter_model.safetensors" ] && pass dpo_nf4 ||
    fail dpo_nf4 "$(tail -n 2 "$tmp/dpo_nf4.err")"
"$bin" kto --model "$model" --data "$data/pairs.jsonl" "${small[@]}" --learning-rate 1e-3 --quantize nf4-single --output "$tmp/kto_nf4" \
    2> "$tmp/kto_nf4.err" && [ -f "$tmp/kto_nf4/final/adapter/adapter_model.safetensors" ] && pass kto_nf4-single ||
    fail kto_nf4-single "$(tail -n 2 "$tmp/kto_nf4.err")"

# --- ppo / grpo: the actor's and the critic's bases quantized (--actor-quantize, --critic-quantize) ---
"$bin" rm --model "$model" --data "$data/pairs.jsonl" --max-seq-len 32 --per-device-train-batch-size 8 \
    --learning-rate 3e-3 --max-steps 6 --output "$tmp/ppo_rm" --quiet --threads 2 2> "$tmp/ppo_rm.err" ||
    fail ppo_reward_model "$(tail -n 2 "$tmp/ppo_rm.err")"
ppo=(--reward-model "$tmp/ppo_rm/final" --prompts "$data/sft.jsonl" --eval-prompts "$data/sft_eval.jsonl" --eval-count 4
     --rollout-batch-size 8 --generation-batch-size 8 --micro-batch-size 4 --max-new-tokens 10 --max-iterations 3
     --actor-learning-rate 1e-3 --critic-learning-rate 1e-3 --min-response-tokens 1 --termination-condition fixed --ngram 5
     --quiet --threads 2)
lora=(--actor-lora-rank 4 --critic-lora-rank 4)
# The actor over a Q8_0 base, the critic (from the actor, a fresh value head) over a Q4_0 one.
qppo=("${ppo[@]}" "${lora[@]}" --actor-model "$model" --critic-model "$model" --actor-quantize q8_0 --critic-quantize q4_0)
# With the row-invariant CPU forward (MARLHF_CPU_MATMUL=batch-invariant: the linear layers'
# fixed-order kernel; the attention is row-invariant always), so the experience pass and the
# training forward give a row the same bits in any batch (docs/lora.md, "One policy").
MARLHF_CPU_MATMUL=batch-invariant "$bin" ppo "${qppo[@]}" --enable-ema --output "$tmp/ppo_q" 2> "$tmp/ppo_q.err"
rc=$?
python3 - "$tmp/ppo_q/final" << 'PY' && [ $rc -eq 0 ] && pass ppo_qlora_runs || fail ppo_qlora_runs "exit $rc: $(tail -n 2 "$tmp/ppo_q.err")"
import json, sys
final = sys.argv[1]
for part, q in (("actor", "q8_0"), ("critic", "q4_0"), ("actor_ema", "q8_0")):
    c = json.load(open(f"{final}/{part}/adapter/adapter_config.json"))
    assert c["marlhf_base_quantize"] == q and c["r"] == 4, (part, c)
PY
# The first iteration: the reference is the actor's quantized base with the adapters off, so
# the KL is exactly 0; the old log-probs (the experience pass over the rollout) equal the
# first PPO epoch's recomputed ones bit for bit: ratio exactly 1, approx KL exactly 0, although
# the epoch's micro-batches hold other rows, padded to other lengths, than the experience
# pass's. (With sgemm, OpenBLAS's Haswell kernels give a row other last bits in another
# batch: ratio 1 - 1.2e-8. Generating with the integer decode kernels instead of the
# dequantized weights would move it by ~1e-3.)
on_policy=$(python3 - "$tmp/ppo_q/metrics.jsonl" << 'PY'
import json, sys
first = [json.loads(l) for l in open(sys.argv[1]) if '"train/score"' in l][0]
ok = first["train/old_logprobs_from_training"] == 0 and first["train/kl"] == 0.0
ok &= first["train/ratio"] == 1.0 and first["train/approx_kl"] == 0.0
print(f"first iteration: kl {first['train/kl']}, ratio {first['train/ratio']}, approx kl {first['train/approx_kl']}")
sys.exit(0 if ok else 1)
PY
) && pass "ppo_qlora_first_iteration_on_policy ($on_policy)" || fail ppo_qlora_first_iteration_on_policy "$on_policy"
# The switch's bad value: one line naming the variable, exit 2, before a model is loaded.
MARLHF_CPU_MATMUL=bogus expect_error bad_cpu_matmul_choice "MARLHF_CPU_MATMUL=bogus: expected sgemm or batch-invariant" \
    "$bin" ppo "${qppo[@]}" --max-iterations 1 --output "$tmp/ppo_bogus"
# Reproducible bit for bit from the seed.
MARLHF_CPU_MATMUL=batch-invariant "$bin" ppo "${qppo[@]}" --enable-ema --output "$tmp/ppo_q_again" 2> /dev/null
cmp -s "$tmp/ppo_q/final/actor/adapter/adapter_model.safetensors" "$tmp/ppo_q_again/final/actor/adapter/adapter_model.safetensors" &&
    cmp -s "$tmp/ppo_q/final/critic/adapter/adapter_model.safetensors" "$tmp/ppo_q_again/final/critic/adapter/adapter_model.safetensors" &&
    cmp -s "$tmp/ppo_q/final/actor_ema/adapter/adapter_model.safetensors" "$tmp/ppo_q_again/final/actor_ema/adapter/adapter_model.safetensors" &&
    [ "$(json_values "$tmp/ppo_q/metrics.jsonl" train/policy_loss)" = "$(json_values "$tmp/ppo_q_again/metrics.jsonl" train/policy_loss)" ] &&
    pass ppo_qlora_reproducible || fail ppo_qlora_reproducible "adapters differ"
# The float32 run on the dequantized bases (tools/dequantize_model.py) is the same run: the
# same base fingerprints, the same rollouts and scores, the same losses (up to the rounding of
# the backward's dequantized tiles; measured 1e-8 relative in the gradient norms). The float32
# run on the original weights is not (the quantization moves the samples).
python3 tools/dequantize_model.py "$model" "$tmp/dequantized_q8_0" q8_0 2> /dev/null &&
    python3 tools/dequantize_model.py "$model" "$tmp/dequantized_q4_0" q4_0 2> /dev/null
MARLHF_CPU_MATMUL=batch-invariant "$bin" ppo "${ppo[@]}" "${lora[@]}" --actor-model "$tmp/dequantized_q8_0" --critic-model "$tmp/dequantized_q4_0" --output "$tmp/ppo_f" \
    2> "$tmp/ppo_f.err"
"$bin" ppo "${ppo[@]}" "${lora[@]}" --actor-model "$model" --critic-model "$model" --output "$tmp/ppo_f_original" 2> /dev/null
python3 - "$tmp/ppo_q" "$tmp/ppo_f" "$tmp/ppo_f_original" << 'PY' && pass ppo_qlora_equals_float_on_dequantized_base ||
import json, sys
q, f, original = sys.argv[1:]
def rows(run): return [json.loads(l) for l in open(f"{run}/metrics.jsonl")]
def fingerprint(run, part): return json.load(open(f"{run}/final/{part}/adapter/adapter_config.json"))["marlhf_base_fingerprint"]
ok = all(fingerprint(q, p) == fingerprint(f, p) for p in ("actor", "critic"))
ok &= open(f"{q}/samples/final.jsonl").read() == open(f"{f}/samples/final.jsonl").read()
ok &= open(f"{q}/samples/final.jsonl").read() != open(f"{original}/samples/final.jsonl").read()
worst = 0.0
for a, b in zip(rows(q), rows(f)):
    for key in a:
        if key.startswith(("train/time", "train/generation_tokens", "time")) or not isinstance(a[key], float):
            continue
        worst = max(worst, abs(a[key] - b[key]) / max(1.0, abs(b[key])))
ok &= len(rows(q)) == len(rows(f)) == 5 and worst < 1e-6
print(f"  largest relative difference of the metrics: {worst:.2g}", file=sys.stderr)
sys.exit(0 if ok else 1)
PY
    fail ppo_qlora_equals_float_on_dequantized_base "$(tail -n 2 "$tmp/ppo_f.err")"
# Killed and resumed: bit-identical to the straight run. 48 iterations (under the
# sanitizers four epochs of the prompts, 24, kill_test_epochs): interrupted_run kills soon
# after the checkpoint of iteration 1..4.
long_ppo=("${qppo[@]}" --max-iterations 48 --num-train-epochs "$(kill_test_epochs 12)" --save-every 1)
"$bin" ppo "${long_ppo[@]}" --output "$tmp/ppo_q_straight" 2> /dev/null
interrupted_run "$tmp/ppo_q_killed" "$bin" ppo "${long_ppo[@]}" --keep-last 2 --output "$tmp/ppo_q_killed"
[ "$finished_early" = 1 ] && fail ppo_qlora_kill_mid_run "the run finished before the kill"
cmp -s "$tmp/ppo_q_straight/final/actor/adapter/adapter_model.safetensors" "$tmp/ppo_q_killed/final/actor/adapter/adapter_model.safetensors" &&
    cmp -s "$tmp/ppo_q_straight/final/critic/adapter/adapter_model.safetensors" "$tmp/ppo_q_killed/final/critic/adapter/adapter_model.safetensors" &&
    cmp -s "$tmp/ppo_q_straight/final/actor/model.safetensors" "$tmp/ppo_q_killed/final/actor/model.safetensors" &&
    pass ppo_qlora_resume_bit_identical || fail ppo_qlora_resume_bit_identical "$(tail -n 2 "$tmp/ppo_q_killed.err")"
before=$(ls -R "$tmp/ppo_q_straight" | md5sum)
expect_error ppo_qlora_resume_other_quantize "checkpoint was made with --actor-quantize q8_0 --critic-quantize q4_0, this run has q4_0 and q4_0" \
    "$bin" ppo "${long_ppo[@]}" --actor-quantize q4_0 --output "$tmp/ppo_q_straight" --resume
expect_error ppo_qlora_resume_float "this run has none and none" \
    "$bin" ppo "${ppo[@]}" "${lora[@]}" --actor-model "$model" --critic-model "$model" --max-iterations 16 --num-train-epochs 4 \
    --save-every 1 --output "$tmp/ppo_q_straight" --resume
[ "$(ls -R "$tmp/ppo_q_straight" | md5sum)" = "$before" ] && pass ppo_qlora_refused_resume_keeps_run ||
    fail ppo_qlora_refused_resume_keeps_run "files changed"
# QDoRA in PPO: DoRA adapters over the quantized actor and critic. At initialisation DoRA's
# magnitudes are the base rows' norms, so the first iteration is on-policy again (KL 0).
"$bin" ppo "${qppo[@]}" --actor-use-dora --critic-use-dora --max-iterations 1 --output "$tmp/ppo_qdora" 2> "$tmp/ppo_qdora.err"
kl=$(json_values "$tmp/ppo_qdora/metrics.jsonl" train/kl 2> /dev/null)
[ "$kl" = "0.0" ] && python3 -c '
import json, sys
for part in ("actor", "critic"):
    c = json.load(open(f"{sys.argv[1]}/final/{part}/adapter/adapter_config.json"))
    assert c["use_dora"] is True and c["marlhf_base_quantize"] in ("q8_0", "q4_0"), c
' "$tmp/ppo_qdora" && pass "ppo_qdora_runs (first KL $kl)" || fail ppo_qdora_runs "KL '$kl': $(tail -n 2 "$tmp/ppo_qdora.err")"
# From a QLoRA SFT adapter: the actor over its Q8_0 base; the reference, the base with that
# adapter, takes the actor's quantization, so the first KL is 0 again.
"$bin" ppo "${ppo[@]}" --critic-lora-rank 4 --actor-model "$model" --actor-lora-adapter "$tmp/sft_q8_0/final" \
    --actor-quantize q8_0 --critic-quantize q8_0 --max-iterations 1 --output "$tmp/ppo_q_adapter" 2> "$tmp/ppo_q_adapter.err"
kl=$(json_values "$tmp/ppo_q_adapter/metrics.jsonl" train/kl 2> /dev/null)
[ "$kl" = "0.0" ] && pass "ppo_qlora_from_sft_adapter (KL $kl)" || fail ppo_qlora_from_sft_adapter "KL '$kl': $(tail -n 2 "$tmp/ppo_q_adapter.err")"
# GRPO (no critic) with a 4-bit actor learns: its score rises on the fixture task (measured
# -0.06 -> 2.3; alpha 32, as rank-4 adapters at alpha 4 move too little in 12 iterations,
# float32 or not).
"$bin" ppo "${ppo[@]}" --actor-lora-rank 4 --actor-lora-alpha 32 --actor-model "$model" --actor-quantize q4_0 \
    --advantage-estimator grpo --samples-per-prompt 4 --num-train-epochs 2 --max-iterations 12 \
    --termination-condition token --output "$tmp/grpo_q" 2> "$tmp/grpo_q.err"
scores=$(json_values "$tmp/grpo_q/metrics.jsonl" train/score 2> /dev/null)
python3 -c "import sys; v=list(map(float, sys.argv[1].split())); sys.exit(0 if len(v) == 12 and sum(v[-3:]) / 3 > v[0] + 1 else 1)" \
    "$scores" && [ ! -e "$tmp/grpo_q/final/critic" ] && pass "grpo_qlora_learns (scores $scores)" ||
    fail grpo_qlora_learns "scores '$scores': $(tail -n 2 "$tmp/grpo_q.err")"
# Refused, one line, exit 2, nothing written.
pbad=(--actor-model "$model" --reward-model "$tmp/ppo_rm/final" --prompts "$data/sft.jsonl" --output "$tmp/y")
expect_error ppo_actor_quantize_needs_lora "--actor-quantize q8_0 needs --actor-lora-rank or --actor-lora-adapter" \
    "$bin" ppo "${pbad[@]}" --actor-quantize q8_0
expect_error ppo_critic_quantize_needs_lora "--critic-quantize q4_0 needs --critic-lora-rank or --critic-lora-adapter" \
    "$bin" ppo "${pbad[@]}" --critic-quantize q4_0 --actor-lora-rank 4
expect_error ppo_actor_quantize_unknown "unknown quantization 'q3_k' (--actor-quantize)" \
    "$bin" ppo "${pbad[@]}" --actor-quantize q3_k --actor-lora-rank 4
expect_error ppo_critic_quantize_unknown "unknown quantization 'f16' (--critic-quantize)" \
    "$bin" ppo "${pbad[@]}" --critic_quantize f16 --critic-lora-rank 4
# (one short iteration: where it runs, on a GPU or the emulated backend, it runs to the end)
expect_runs_on_cuda ppo_actor_quantize_cuda_allowed \
    "$bin" ppo "${pbad[@]}" --actor-quantize q8_0 --actor-lora-rank 4 --device cuda --max-iterations 1 \
    --rollout-batch-size 4 --max-new-tokens 6 --threads 1 --quiet
expect_error grpo_critic_quantize "--critic-quantize: --advantage-estimator grpo has no critic" \
    "$bin" ppo "${pbad[@]}" --critic-quantize q8_0 --advantage-estimator grpo --samples-per-prompt 2
expect_error ppo_reference_quantize_other_than_actor_base "--reference-quantize q4_0: the reference is the actor's own base" \
    "$bin" ppo "${pbad[@]}" --actor-quantize q8_0 --actor-lora-rank 4 --reference-quantize q4_0
[ ! -e "$tmp/y" ] && pass ppo_qlora_refusals_write_nothing || fail ppo_qlora_refusals_write_nothing "$tmp/y exists"

[ $failures -eq 0 ]
