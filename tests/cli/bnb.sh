#!/usr/bin/env bash
# Checkpoints that bitsandbytes quantized (model/bnb_checkpoint.h), end to end on
# tests/fixtures/bnb/nf4 (a tiny Llama saved by transformers after loading with
# BitsAndBytesConfig(load_in_4bit, nf4, double quantization); tools/make_bnb_fixtures.py):
# generate runs on it; QLoRA sft on it saves an adapter that records its nf4 base and a float32
# final/ (dequantized + merged) that computes what the adapter on the bnb base computes;
# convert writes its dequantized floats; rm and GRPO train adapters on it; and the refusals: training it without LoRA, --quantize
# with another type, ppo without actor adapters, a missing absmax and a malformed quant_state
# (exit 2, the tensor named). Prints PASS/FAIL per case.
set -u
cd "$(dirname "$0")/../.."
bin=${MARLHF_BIN:-build/marlhf}
tmp=${MARLHF_TEST_TMP:-/tmp}/cli_bnb
rm -rf "$tmp" && mkdir -p "$tmp"
model=tests/fixtures/bnb/nf4
data=tests/fixtures/train
failures=0
. tests/cli_helpers.sh
echo '{"ids": [1, 5, 9, 14, 2, 7, 33, 4]}' > "$tmp/ids.jsonl"

# --- runs -------------------------------------------------------------------------------
"$bin" generate --model "$model" --max-new-tokens 4 --threads 1 "Hello" > "$tmp/gen.jsonl" 2> "$tmp/gen.err" &&
    python3 -c 'import json, sys; r = json.loads(open(sys.argv[1]).readline()); assert r["response_tokens"] == 4, r' \
        "$tmp/gen.jsonl" && pass bnb_generate || fail bnb_generate "$(tail -n 2 "$tmp/gen.err")"

"$bin" sft --model "$model" --data "$data/sft.jsonl" --max-seq-len 32 --per-device-train-batch-size 4 --max-steps 2 \
    --learning-rate 1e-2 --lora-rank 4 --threads 1 --quiet --output "$tmp/sft" 2> "$tmp/sft.err"
rc=$?
final=$tmp/sft/final
[ $rc -eq 0 ] && python3 -c '
import json, sys
a = json.load(open(sys.argv[1] + "/adapter/adapter_config.json"))
c = json.load(open(sys.argv[1] + "/config.json"))
assert a["marlhf_base_quantize"] == "nf4" and a["r"] == 4 and "quantization_config" not in c, (a, c)
' "$final" && pass bnb_qlora_sft_saves_adapter || fail bnb_qlora_sft_saves_adapter "exit $rc: $(tail -n 2 "$tmp/sft.err")"
# final/ (float32: the dequantized base with the adapter merged) = the adapter on the bnb base
# (both the float kernel here: measured 5e-7).
"$bin" logprobs --model "$final" --input "$tmp/ids.jsonl" --threads 1 > "$tmp/merged.jsonl" 2> "$tmp/merged.err"
"$bin" logprobs --model "$model" --lora-adapter "$final" --input "$tmp/ids.jsonl" --threads 1 > "$tmp/adapter.jsonl" \
    2> "$tmp/adapter.err"
"$bin" logprobs --model "$model" --input "$tmp/ids.jsonl" --threads 1 > "$tmp/base.jsonl" 2> "$tmp/base.err"
logprobs_close "$tmp/merged.jsonl" "$tmp/adapter.jsonl" 1e-4 && ! logprobs_close "$tmp/merged.jsonl" "$tmp/base.jsonl" 1e-4 2> /dev/null &&
    pass bnb_merged_equals_adapter_on_bnb_base ||
    fail bnb_merged_equals_adapter_on_bnb_base "$(cat "$tmp/merged.err" "$tmp/adapter.err" | tail -n 2)"

"$bin" convert "$model" "$tmp/converted" 2> "$tmp/convert.err" &&
    "$bin" logprobs --model "$tmp/converted" --input "$tmp/ids.jsonl" --threads 1 > "$tmp/converted.jsonl" &&
    logprobs_close "$tmp/converted.jsonl" "$tmp/base.jsonl" 1e-5 && ! grep -q quantization_config "$tmp/converted/config.json" &&
    pass bnb_convert_dequantizes || fail bnb_convert_dequantizes "$(tail -n 2 "$tmp/convert.err")"

# A QLoRA reward model on it (rm), then GRPO with the actor's adapters on it: both record the
# nf4 base, and GRPO's first iteration is on-policy (KL 0, ratio 1).
"$bin" rm --model "$model" --data "$data/pairs.jsonl" --max-seq-len 32 --per-device-train-batch-size 8 --max-steps 2 \
    --learning-rate 3e-3 --lora-rank 4 --quiet --threads 1 --output "$tmp/rm" 2> "$tmp/rm.err" &&
    "$bin" ppo --actor-model "$model" --reward-model "$tmp/rm/final" --prompts "$data/sft.jsonl" --rollout-batch-size 4 \
        --generation-batch-size 4 --micro-batch-size 4 --max-new-tokens 6 --max-iterations 2 --min-response-tokens 1 \
        --termination-condition token --advantage-estimator grpo --samples-per-prompt 2 --actor-lora-rank 4 --quiet \
        --threads 1 --output "$tmp/grpo" 2> "$tmp/grpo.err" &&
    python3 -c '
import json, sys
for d in (sys.argv[1] + "/rm/final", sys.argv[1] + "/grpo/final/actor"):
    a = json.load(open(d + "/adapter/adapter_config.json"))
    assert a["marlhf_base_quantize"] == "nf4", (d, a)
first = json.loads(open(sys.argv[1] + "/grpo/metrics.jsonl").readline())
assert first["train/kl"] == 0 and first["train/ratio"] == 1, first
' "$tmp" && pass bnb_qlora_rm_and_grpo || fail bnb_qlora_rm_and_grpo "$(cat "$tmp/rm.err" "$tmp/grpo.err" | tail -n 2)"

# --- refusals -----------------------------------------------------------------------------
expect_error bnb_full_training_refused "tests/fixtures/bnb/nf4 is a bitsandbytes nf4 checkpoint: its 4-bit base is frozen" \
    "$bin" sft --model "$model" --data "$data/sft.jsonl" --quiet --output "$tmp/x"
expect_runs_on_cuda bnb_cuda_allowed \
    "$bin" sft --model "$model" --data "$data/sft.jsonl" --lora-rank 4 --device cuda --quiet --output "$tmp/x"
expect_error bnb_requantize_refused "--quantize q8_0 would quantize them a second time (leave --quantize out, or give nf4)" \
    "$bin" generate --model "$model" --quantize q8_0 "Hello"
expect_error bnb_ppo_needs_actor_lora "option --actor-quantize nf4 needs --actor-lora-rank or --actor-lora-adapter" \
    "$bin" ppo --actor-model "$model" --reward-model "$model" --prompts "$data/sft.jsonl" --advantage-estimator grpo \
    --samples-per-prompt 2 --output "$tmp/x"
# Damaged copies: an absmax renamed away, a quant_state's JSON broken (same sizes: the
# header's length and the data offsets stay).
damage() { # damage OUT_DIR OLD_NAME NEW_NAME | --json TENSOR
    mkdir -p "$1" && cp "$model/config.json" "$model/tokenizer.json" "$model/tokenizer_config.json" "$1/"
    python3 - "$model/model.safetensors" "$1/model.safetensors" "$2" "$3" << 'EOF'
import json, struct, sys
src, dst, a, b = sys.argv[1:5]
raw = open(src, "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
header = raw[8:8 + n].decode()
data = bytearray(raw[8 + n:])
if a == "--json":
    begin, end = json.loads(header)[b]["data_offsets"]
    data[begin:end] = b"[" * (end - begin)
else:
    assert len(a) == len(b) and header.count('"%s"' % a) == 1
    header = header.replace('"%s"' % a, '"%s"' % b)
open(dst, "wb").write(raw[:8] + header.encode() + bytes(data))
EOF
}
t=model.layers.1.mlp.up_proj.weight
damage "$tmp/no_absmax" "$t.absmax" "$t.absmaX"
expect_error bnb_missing_absmax "bitsandbytes tensor '$t' has no '$t.absmax' ($tmp/no_absmax)" \
    "$bin" generate --model "$tmp/no_absmax" "Hello"
damage "$tmp/bad_state" --json "$t.quant_state.bitsandbytes__nf4"
expect_error bnb_malformed_quant_state "bitsandbytes tensor '$t': its quant_state is not a JSON object" \
    "$bin" sft --model "$tmp/bad_state" --data "$data/sft.jsonl" --lora-rank 4 --quiet --output "$tmp/x"
[ ! -e "$tmp/x" ] && pass bnb_refusals_write_nothing || fail bnb_refusals_write_nothing "$tmp/x exists"

[ "$failures" -eq 0 ]
