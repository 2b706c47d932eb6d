#!/usr/bin/env bash
# Bad input to the command line: every case must exit with status 2 and print exactly
# one line, "marlhf: error: ...", naming the file and the field/tensor (or the option); and
# tests/gpu/run.sh's bad options (one "tests/gpu/run.sh: ..." line, exit 2, nothing written).
# Prints PASS/FAIL per case, like the C tests.
set -u
cd "$(dirname "$0")/../.."
bin=${MARLHF_BIN:-build/marlhf}
tmp=${MARLHF_TEST_TMP:-/tmp}/cli_bad_input
rm -rf "$tmp" && mkdir -p "$tmp"
failures=0
. tests/cli_helpers.sh


ids="$tmp/ids.jsonl"
echo '{"ids": [1, 2, 3, 4]}' > "$ids"
llama=tests/fixtures/models/llama
gguf=tests/fixtures/gguf/tiny_llama_model.gguf

# --- safetensors -----------------------------------------------------------------
cp -r "$llama" "$tmp/truncated" && head -c 100000 "$llama/model.safetensors" > "$tmp/truncated/model.safetensors"
expect_error truncated_safetensors "$tmp/truncated/model.safetensors" "$bin" logprobs --model "$tmp/truncated" --input "$ids"

cp -r "$llama" "$tmp/header" && printf '\xff\xff\xff\xff\xff\xff\x00\x00' | dd of="$tmp/header/model.safetensors" bs=1 seek=0 conv=notrunc 2>/dev/null
expect_error safetensors_header_too_long "$tmp/header/model.safetensors" "$bin" logprobs --model "$tmp/header" --input "$ids"

cp -r "$llama" "$tmp/garbage" && head -c 4096 /dev/urandom > "$tmp/garbage/model.safetensors"
expect_error safetensors_garbage "$tmp/garbage/model.safetensors" "$bin" logprobs --model "$tmp/garbage" --input "$ids"

# A config that disagrees with the weights: a tensor of the wrong shape.
cp -r "$llama" "$tmp/shape" && sed -i 's/"intermediate_size": 128/"intermediate_size": 96/' "$tmp/shape/config.json"
expect_error tensor_wrong_shape "model.layers.0.mlp.gate_proj.weight" "$bin" logprobs --model "$tmp/shape" --input "$ids"

# --- config.json -----------------------------------------------------------------
cp -r "$llama" "$tmp/nofield" && sed -i '/"hidden_size"/d' "$tmp/nofield/config.json"
expect_error config_missing_field "hidden_size" "$bin" logprobs --model "$tmp/nofield" --input "$ids"
cp -r "$llama" "$tmp/badjson" && echo '{"model_type": "llama",' > "$tmp/badjson/config.json"
expect_error config_bad_json "$tmp/badjson/config.json" "$bin" logprobs --model "$tmp/badjson" --input "$ids"
cp -r "$llama" "$tmp/badtype" && sed -i 's/"model_type": "llama"/"model_type": "bert"/' "$tmp/badtype/config.json"
expect_error config_unknown_model_type "model_type" "$bin" logprobs --model "$tmp/badtype" --input "$ids"
# Sliding windows: a negative one, and transformers 5's layer_types naming other sliding layers
# than the family's (Gemma 2 slides its even layers).
window=tests/fixtures/models/gemma2_window
cp -r "$window" "$tmp/negwindow" && sed -i 's/"sliding_window": 5/"sliding_window": -5/' "$tmp/negwindow/config.json"
expect_error config_negative_window "'sliding_window'" "$bin" logprobs --model "$tmp/negwindow" --input "$ids"
cp -r "$window" "$tmp/swapped" && python3 - "$tmp/swapped/config.json" <<'PY'
import json, sys
config = json.load(open(sys.argv[1]))
config["layer_types"] = ["full_attention", "sliding_attention"]
json.dump(config, open(sys.argv[1], "w"))
PY
expect_error config_layer_types_other_windows "'layer_types' entry 0" "$bin" logprobs --model "$tmp/swapped" --input "$ids"
expect_error model_missing "does not exist" "$bin" logprobs --model "$tmp/nowhere" --input "$ids"

# --- GGUF ------------------------------------------------------------------------
cp "$gguf" "$tmp/magic.gguf" && printf 'GGUX' | dd of="$tmp/magic.gguf" bs=1 seek=0 conv=notrunc 2>/dev/null
expect_error gguf_bad_magic "$tmp/magic.gguf" "$bin" logprobs --model "$tmp/magic.gguf" --input "$ids"
cp "$gguf" "$tmp/version.gguf" && printf '\x07' | dd of="$tmp/version.gguf" bs=1 seek=4 conv=notrunc 2>/dev/null
expect_error gguf_bad_version "version" "$bin" logprobs --model "$tmp/version.gguf" --input "$ids"
head -c 60000 "$gguf" > "$tmp/truncated.gguf"
expect_error gguf_truncated "$tmp/truncated.gguf" "$bin" logprobs --model "$tmp/truncated.gguf" --input "$ids"
expect_error gguf_unsupported_type "blk.0.ffn_up.weight" "$bin" logprobs --model tests/fixtures/gguf/tiny_llama_model_bad_type.gguf --input "$ids"

# --- input rows ------------------------------------------------------------------
printf '{"ids": [1, 2]}\n{"ids": [1, 2\n' > "$tmp/badline.jsonl"
expect_error jsonl_bad_json "$tmp/badline.jsonl:2" "$bin" logprobs --model "$llama" --input "$tmp/badline.jsonl"
echo '{"ids": [1, 999999]}' > "$tmp/range.jsonl"
expect_error jsonl_id_out_of_range "outside the vocabulary" "$bin" logprobs --model "$llama" --input "$tmp/range.jsonl"
echo '{"tokens": [1]}' > "$tmp/noids.jsonl"
expect_error jsonl_missing_ids "$tmp/noids.jsonl:1" "$bin" logprobs --model "$llama" --input "$tmp/noids.jsonl"
echo '{"ids": [1, "x"]}' > "$tmp/type.jsonl"
expect_error jsonl_wrong_type "not an integer" "$bin" logprobs --model "$llama" --input "$tmp/type.jsonl"
printf '{"ids": [1, 2]}\n\xff\xfe\n' > "$tmp/utf8.jsonl"
expect_error jsonl_invalid_utf8 "$tmp/utf8.jsonl:2" "$bin" logprobs --model "$llama" --input "$tmp/utf8.jsonl"
expect_error input_missing "$tmp/none.jsonl" "$bin" logprobs --model "$llama" --input "$tmp/none.jsonl"

# --- options ---------------------------------------------------------------------
expect_error unknown_option "--frobnicate" "$bin" logprobs --model "$llama" --input "$ids" --frobnicate 3
expect_error bad_integer "--batch-size" "$bin" logprobs --model "$llama" --input "$ids" --batch-size abc
expect_error missing_required "--input" "$bin" logprobs --model "$llama"
expect_error unknown_command "frobnicate" "$bin" frobnicate
expect_error unknown_device "--device" "$bin" logprobs --model "$llama" --input "$ids" --device tpu
# --device cuda: without a usable GPU (or without nvcc at build time) a one-line user error;
# where a GPU is present the command must run and agree with the CPU.
if "$bin" logprobs --model "$llama" --input "$ids" --device cuda > "$tmp/cuda.out" 2> "$tmp/cuda.err"; then
    "$bin" logprobs --model "$llama" --input "$ids" > "$tmp/cpu.out" 2> /dev/null
    python3 - "$tmp/cpu.out" "$tmp/cuda.out" <<'PY' && pass device_cuda_matches_cpu || fail device_cuda_matches_cpu "log-probs differ"
import json, sys
cpu, gpu = (json.loads(open(p).readline()) for p in sys.argv[1:3])
a, b = cpu["logprobs"], gpu["logprobs"]
sys.exit(0 if len(a) == len(b) and max(abs(x - y) for x, y in zip(a, b)) < 0.05 else 1)
PY
else
    expect_error device_cuda_unavailable "--device cuda" "$bin" logprobs --model "$llama" --input "$ids" --device cuda
fi
# An unknown attention implementation in the environment: a one-line error when the GPU
# opens (a build without CUDA refuses --device cuda first).
want="--device cuda"
# (A CUDA build holds the variable's name; the runtime is linked statically, so ldd cannot tell.)
grep -q MARLHF_CUDA_ATTENTION "$bin" && want=MARLHF_CUDA_ATTENTION
expect_error device_cuda_bad_attention_kernels "$want" env MARLHF_CUDA_ATTENTION=flash "$bin" logprobs --model "$llama" \
    --input "$ids" --device cuda
want="--device cuda"
grep -q MARLHF_CUDA_STORED_INPUTS "$bin" && want=MARLHF_CUDA_STORED_INPUTS
expect_error device_cuda_bad_stored_inputs "$want" env MARLHF_CUDA_STORED_INPUTS=yes "$bin" logprobs --model "$llama" \
    --input "$ids" --device cuda
# How GPU ranks sum (dist/dist.h): read at start by every build, MPI or not.
expect_error data_parallel_bad_nccl_setting "MARLHF_NCCL" env MARLHF_NCCL=yes "$bin" logprobs --model "$llama" \
    --input "$ids"
# The fused q/k/v product's switch (model/model.h, model_set_qkv_fusion), read at the first
# forward: 0, 1 or unset.
expect_error fused_qkv_bad_setting "MARLHF_FUSED_QKV" env MARLHF_FUSED_QKV=yes "$bin" logprobs --model "$llama" \
    --input "$ids"
# The switch that keeps the RMSNorms apart from the products (model/model.h,
# model_norms_folded), read at the first forward: 0, 1 or unset.
expect_error unfolded_norms_bad_setting "MARLHF_UNFOLDED_NORMS" env MARLHF_UNFOLDED_NORMS=yes "$bin" logprobs \
    --model "$llama" --input "$ids"
# The test switch that fills gradients with NaN (model/model.h): only 0 or 1, and a training
# run refused on anything else writes no model.
expect_error check_gradient_writes_bad_value "MARLHF_CHECK_GRADIENT_WRITES" env MARLHF_CHECK_GRADIENT_WRITES=yes \
    "$bin" sft --model tests/fixtures/models/tiny_chat --data tests/fixtures/train/sft.jsonl --max-seq-len 32 \
    --per-device-train-batch-size 4 --max-steps 1 --quiet --threads 1 --output "$tmp/check_writes_sft"
if [ ! -e "$tmp/check_writes_sft/model.safetensors" ]; then echo "PASS check_gradient_writes_bad_value_writes_no_model"
else echo "FAIL check_gradient_writes_bad_value_writes_no_model"; failures=$((failures + 1)); fi
# Its companion that moves stored product inputs aside (ops/cpu/stored_inputs.c): the same.
expect_error check_stored_inputs_bad_value "MARLHF_CHECK_STORED_INPUTS" env MARLHF_CHECK_STORED_INPUTS=yes \
    "$bin" sft --model tests/fixtures/models/tiny_chat --data tests/fixtures/train/sft.jsonl --max-seq-len 32 \
    --per-device-train-batch-size 4 --max-steps 1 --quiet --threads 1 --output "$tmp/check_stores_sft"
if [ ! -e "$tmp/check_stores_sft/model.safetensors" ]; then echo "PASS check_stored_inputs_bad_value_writes_no_model"
else echo "FAIL check_stored_inputs_bad_value_writes_no_model"; failures=$((failures + 1)); fi
# The SFT loss-token and batching switches take true or false only, and write nothing otherwise.
expect_error completion_only_loss_garbage "--completion-only-loss expects true or false" "$bin" sft \
    --model tests/fixtures/models/tiny_chat --data tests/fixtures/train/sft.jsonl --completion-only-loss=maybe \
    --output "$tmp/completion_only_garbage"
expect_error group_by_length_garbage "--group-by-length expects true or false" "$bin" dpo \
    --model tests/fixtures/models/tiny_chat --data tests/fixtures/train/pairs.jsonl --group-by-length=2 \
    --output "$tmp/group_garbage"
expect_error packing_garbage "--packing expects true or false" "$bin" sft \
    --model tests/fixtures/models/tiny_chat --data tests/fixtures/train/sft.jsonl --packing=bfd \
    --output "$tmp/packing_garbage"
expect_error padding_free_garbage "--padding-free expects true or false" "$bin" sft \
    --model tests/fixtures/models/tiny_chat --data tests/fixtures/train/sft.jsonl --padding-free=maybe \
    --output "$tmp/packing_garbage"
expect_error eval_packing_garbage "--eval-packing expects true or false" "$bin" sft \
    --model tests/fixtures/models/tiny_chat --data tests/fixtures/train/sft.jsonl --packing --eval-packing=maybe \
    --output "$tmp/packing_garbage"
for command in dpo kto rm; do
    expect_error "${command}_padding_free_garbage" "--padding-free expects true or false" "$bin" "$command" \
        --model tests/fixtures/models/tiny_chat --data tests/fixtures/train/pairs.jsonl --padding-free=2 \
        --output "$tmp/packing_garbage"
done
expect_error packing_strategy_garbage "--packing-strategy first_fit: give bfd, bfd_split or wrapped" "$bin" sft \
    --model tests/fixtures/models/tiny_chat --data tests/fixtures/train/sft.jsonl --packing --packing-strategy first_fit \
    --output "$tmp/packing_garbage"
[ ! -e "$tmp/completion_only_garbage" ] && [ ! -e "$tmp/group_garbage" ] && [ ! -e "$tmp/packing_garbage" ] &&
    echo "PASS sft_switch_garbage_writes_nothing" ||
    { echo "FAIL sft_switch_garbage_writes_nothing"; failures=$((failures + 1)); }
echo '{"batch_size": "many"}' > "$tmp/config.json"
expect_error config_file_bad_value "--batch-size" "$bin" logprobs --model "$llama" --input "$ids" --config "$tmp/config.json"

# --- nothing already saved is lost ------------------------------------------------
mkdir -p "$tmp/existing" && echo keep > "$tmp/existing/file"
expect_error convert_refuses_overwrite "--overwrite" "$bin" convert "$llama" "$tmp/existing"
if [ "$(cat "$tmp/existing/file")" = keep ]; then echo "PASS convert_kept_existing"; else echo "FAIL convert_kept_existing"; failures=$((failures + 1)); fi
"$bin" convert "$tmp/truncated" "$tmp/existing" --overwrite 2>/dev/null
if [ "$(cat "$tmp/existing/file" 2>/dev/null)" = keep ]; then echo "PASS failed_convert_kept_existing"; else echo "FAIL failed_convert_kept_existing"; failures=$((failures + 1)); fi

echo keep > "$tmp/out.jsonl"
expect_error logprobs_bad_row_keeps_output "$tmp/badline.jsonl:2" "$bin" logprobs --model "$llama" --input "$tmp/badline.jsonl" --output "$tmp/out.jsonl"
if [ "$(cat "$tmp/out.jsonl")" = keep ] && [ -z "$(ls "$tmp" | grep 'out.jsonl.tmp')" ]; then echo "PASS logprobs_kept_existing_output"; else echo "FAIL logprobs_kept_existing_output"; failures=$((failures + 1)); fi

# bench/train_step's --max-grad-norm (the peers' comparison turns on it): garbage or a
# negative value is one line naming the option, exit 2, before any model is built.
train_step="$(dirname "$bin")/bench/train_step"
expect_error train_step_max_grad_norm_garbage "--max-grad-norm" "$train_step" --max-grad-norm abc
expect_error train_step_max_grad_norm_negative "--max-grad-norm" "$train_step" --max-grad-norm -1
expect_error train_step_max_grad_norm_trailing "--max-grad-norm" "$train_step" --max-grad-norm 1x

# bench/matmul_bf16's --repeats: garbage, zero, a missing value, an unknown option: one line
# naming it, exit 2, before any matrix is made.
matmul_bf16="$(dirname "$bin")/bench/matmul_bf16"
expect_error matmul_bf16_repeats_garbage "--repeats" "$matmul_bf16" --repeats abc
expect_error matmul_bf16_repeats_zero "--repeats" "$matmul_bf16" --repeats 0
expect_error matmul_bf16_repeats_missing "--repeats" "$matmul_bf16" --repeats
expect_error matmul_bf16_unknown_option "--fast" "$matmul_bf16" --fast
# The PPO benchmark's iteration count (bench/run_ppo_iteration.sh, bench/trl_ppo_iteration.py):
# checked before anything is loaded.
expect_error ppo_bench_iterations_garbage "ITERATIONS=abc" env ITERATIONS=abc bash bench/run_ppo_iteration.sh
expect_error ppo_bench_iterations_zero "ITERATIONS=0" env ITERATIONS=0 bash bench/run_ppo_iteration.sh
expect_error trl_bench_iterations_zero "--iterations 0" python3 bench/trl_ppo_iteration.py --iterations 0
expect_error trl_bench_iterations_garbage "--iterations" python3 bench/trl_ppo_iteration.py --iterations abc
# bench/logprob_drift.sh: no file to compare, a model that is not there, a bad COUNT -- each
# refused before the float model's minutes-long run.
expect_error logprob_drift_no_files "usage" bash bench/logprob_drift.sh "$tmp/float"
expect_error logprob_drift_missing_file "$tmp/absent.gguf" bash bench/logprob_drift.sh "$tmp" "$tmp/absent.gguf:q4_0"
expect_error logprob_drift_count_garbage "COUNT=abc" env COUNT=abc bash bench/logprob_drift.sh "$tmp" "$tmp"
# The llama.cpp comparison scripts: a missing file, garbage ids, a file that is not GGUF -- each
# refused before llama-cpp-python is needed (it is not installed here, which is refused too).
printf '{"ids": [1, 2, 3]}\n' > "$tmp/llama_ids.jsonl"
printf '{"ids": [1, 2, 3]}\nnot json\n' > "$tmp/llama_ids_garbage.jsonl"
expect_error llamacpp_logprobs_missing_model "$tmp/absent.gguf" python3 bench/llamacpp_logprobs.py \
    --model "$tmp/absent.gguf" --input "$tmp/llama_ids.jsonl"
expect_error llamacpp_logprobs_garbage_ids "llama_ids_garbage.jsonl:2" python3 bench/llamacpp_logprobs.py \
    --model "$tmp/llama_ids.jsonl" --input "$tmp/llama_ids_garbage.jsonl"
expect_error llamacpp_logprobs_no_input "--input" python3 bench/llamacpp_logprobs.py --model "$tmp/llama_ids.jsonl"
expect_error llamacpp_dequant_check_not_gguf "not a GGUF file" python3 tools/check_gguf_llamacpp_dequant.py \
    "$tmp/llama_ids.jsonl"
expect_error llamacpp_dequant_check_usage "usage" python3 tools/check_gguf_llamacpp_dequant.py
expect_error llamacpp_quantize_missing_source "$tmp/absent.gguf" python3 bench/llamacpp_quantize.py \
    --source "$tmp/absent.gguf" --output "$tmp/q.gguf" --type q2_k
expect_error llamacpp_quantize_unknown_type "--type q3_k_s" python3 bench/llamacpp_quantize.py \
    --source "$tmp/llama_ids.jsonl" --output "$tmp/q.gguf" --type q3_k_s
expect_error llamacpp_quantize_output_exists "exists" python3 bench/llamacpp_quantize.py \
    --source "$tmp/llama_ids.jsonl" --output "$tmp/llama_ids.jsonl" --type q2_k

# tests/gpu/run.sh's options: a bad --time-limit, a missing value, an unknown option: one line,
# exit 2, before it builds or writes anything.
for args in "--time-limit 5m" "--time-limit" "--logs" "--fast"; do
    # shellcheck disable=SC2086
    bash tests/gpu/run.sh --logs "$tmp/gpu_logs_${args// /_}" $args > /dev/null 2> "$tmp/gpu_run.err" < /dev/null
    rc=$?
    if [ "$rc" -eq 2 ] && [ "$(wc -l < "$tmp/gpu_run.err")" -eq 1 ] && grep -q '^tests/gpu/run.sh: ' "$tmp/gpu_run.err" &&
        [ ! -e "$tmp/gpu_logs_${args// /_}" ]; then
        echo "PASS gpu_run_refuses_${args// /_}"
    else
        echo "FAIL gpu_run_refuses_${args// /_} (exit $rc): $(head -n 2 "$tmp/gpu_run.err")"
        failures=$((failures + 1))
    fi
done

[ "$failures" -eq 0 ]
