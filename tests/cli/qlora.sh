#!/usr/bin/env bash
# QLoRA end to end on the tiny model (tests/fixtures/models/tiny_chat): LoRA adapters trained
# on a quantized frozen base (--quantize q8_0 | q4_0 | nf4 | nf4-single) with sft, rm, dpo and kto. The runs learn;
# the saved final/ holds the dequantized base with the adapters merged (a plain float32 model
# computing what the adapted quantized model computes) and the adapter, which records its
# quantized base; the adapter goes back on that base with --quantize and is refused without;
# resume after SIGKILL is bit-identical and a resume on another base is refused; --quantize
# without LoRA, with an unknown type, or on --device cuda is a one-line error. Prints
# PASS/FAIL per case.
set -u
cd "$(dirname "$0")/../.."
bin=${MARLHF_BIN:-build/marlhf}
tmp=${MARLHF_TEST_TMP:-/tmp}/cli_qlora
rm -rf "$tmp" && mkdir -p "$tmp"
model=tests/fixtures/models/tiny_chat
data=tests/fixtures/train
failures=0
. tests/cli_helpers.sh
# logprobs_close A B LIMIT: the first rows' log-probs of two logprobs outputs within LIMIT
logprobs_close() {
    python3 -c '
import json, sys
a, b = (json.loads(open(p).readline())["logprobs"] for p in sys.argv[1:3])
d = max(abs(x - y) for x, y in zip(a, b))
assert len(a) == len(b) > 0 and d < float(sys.argv[3]), (d, a, b)
' "$@"
}

sft=(--model "$model" --data "$data/sft.jsonl" --eval-data "$data/sft_eval.jsonl" --max-seq-len 32
     --per-device-train-batch-size 4 --gradient-accumulation-steps 2 --num-train-epochs 4 --threads 2 --quiet)
echo '{"ids": [1, 5, 9, 14, 2, 7, 33, 4]}' > "$tmp/ids.jsonl"

# --- bad input --------------------------------------------------------------------------
expect_error qlora_needs_lora "--quantize q8_0 needs --lora-rank or --lora-adapter" \
    "$bin" sft "${sft[@]}" --quantize q8_0 --output "$tmp/x"
expect_error qlora_unknown_type "unknown quantization 'q3_k' (--quantize)" \
    "$bin" sft "${sft[@]}" --quantize q3_k --lora-rank 4 --output "$tmp/x"
expect_error qlora_cuda_refused "--quantize q4_0 runs on --device cpu only" \
    "$bin" dpo --model "$model" --data "$data/pairs.jsonl" --quantize q4_0 --lora-rank 4 --device cuda --output "$tmp/x"
expect_error qlora_dora_refused "--use-dora needs the float32 base weights: it cannot train over a quantized base" \
    "$bin" sft "${sft[@]}" --quantize q8_0 --lora-rank 4 --use-dora --output "$tmp/x"
expect_error qlora_nf4_needs_lora "--quantize nf4 needs --lora-rank or --lora-adapter" \
    "$bin" sft "${sft[@]}" --quantize nf4 --output "$tmp/x"
expect_error qlora_nf4_cuda_refused "--quantize nf4 runs on --device cpu only" \
    "$bin" kto --model "$model" --data "$data/pairs.jsonl" --quantize nf4 --lora-rank 4 --device cuda --output "$tmp/x"
expect_error qlora_nf4_single_cuda_refused "--quantize nf4-single runs on --device cpu only" \
    "$bin" sft "${sft[@]}" --quantize nf4-single --lora-rank 4 --device cuda --output "$tmp/x"
expect_error qlora_nf4_dora_refused "--use-dora needs the float32 base weights: it cannot train over a quantized base" \
    "$bin" sft "${sft[@]}" --quantize nf4 --lora-rank 4 --use-dora --output "$tmp/x"
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
long=("${sft[@]}" --learning-rate 1e-2 --lora-rank 4 --num-train-epochs 16 --save-every 1 --keep-last 2 --eval-every 0)
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

[ $failures -eq 0 ]
