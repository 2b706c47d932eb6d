# tests/gpu/run.sh's step 4, sourced by it (its variables, binaries and helpers: bench_run,
# say, stage): the speed runs, each beside PyTorch eager doing the same on the same GPU,
# into $logs/bench.jsonl and $logs/ops_breakdown.jsonl; sets summary_speed, the speed part of
# the summary line (tests/gpu/bench_summary.py).
#
# Under the emulation (MARLHF_GPU_TEST_DEVICE=emulated --bench-only, which
# tests/cli/gpu_bench_emulated.sh runs in `make test`) every run below but PyTorch's is made
# with the emulated benchmark programs on the tiny-llama shape at a few tokens: a check that
# the programs run and that this file and the summary read their lines, before a GPU's
# short session depends on them. Its figures are not speeds.
if [ "$emulated" = 1 ]; then
    train_pairs="tiny-llama:tiny" behind_pair="tiny-llama:tiny"
    step_size=(--batch 2 --seq 64 --steps 2) breakdown_size=(--batch 2 --seq 64)
    decode_shape=tiny-llama short_prompt=16 short_new=8 long_prompt=64 long_new=8
else
    train_pairs="smollm2-135m:smollm2 llama-1b:llama1b"
    behind_pair="llama-1b:llama1b" # the shape still behind PyTorch (2026-12-04)
    step_size=(--batch 8 --seq 1024 --steps 10) breakdown_size=(--batch 8 --seq 1024)
    decode_shape=smollm2-135m short_prompt=32 short_new=128 long_prompt=1024 long_new=64
fi
[ "$quick" = 1 ] && train_pairs=$behind_pair
behind=${behind_pair%%:*} behind_peer=${behind_pair##*:}
# peer SECONDS OUTPUT COMMAND...: a PyTorch run, as bench_run (not under the emulation: no torch)
peer() { [ "$emulated" = 1 ] || bench_run "$@"; }

results="$logs/bench.jsonl"
: > "$results"
export PYTHONUNBUFFERED=1
unset MARLHF_CHECK_GRADIENT_WRITES MARLHF_CHECK_STORED_INPUTS
stage "speed"
for pair in $train_pairs; do
    ours=${pair%%:*} theirs=${pair##*:}
    bench_run 200 "$results" "$train_step" --device cuda --model "$ours" "${step_size[@]}"
    bench_run 200 "$results" "$train_step" --device cuda --model "$ours" "${step_size[@]}" --attention mma-plain
    bench_run 200 "$results" "$train_step" --device cuda --model "$ours" "${step_size[@]}" --attention mma-ds
    for attention in wmma unfused; do
        [ "$quick" = 1 ] || bench_run 200 "$results" "$train_step" --device cuda --model "$ours" "${step_size[@]}" \
            --attention $attention
    done
    # --profile-steps: 3 more steps under torch.profiler, where PyTorch's kernel time goes by
    # kind ("pytorch-eager-profile"), beside ops_breakdown's "kinds_ms_per_step" below.
    peer 200 "$results" python3 bench/torch_gpu_train_step.py --shape "$theirs" "${step_size[@]}" \
        --warmup 3 --device cuda --profile-steps 3
done
# Both steps clip the gradient norm to 1 (the default of each); the 1B pair again
# without it (PyTorch's peer clipped nothing before 2026-12-05; not in the quick bench,
# which has the fused q/k/v product's pair below in its time instead).
[ "$quick" = 1 ] || bench_run 200 "$results" "$train_step" --device cuda --model "$behind" "${step_size[@]}" \
    --max-grad-norm 0
# The 1B step with the stored buffers turned into plain holds (src/ops/ops.h, hold_stored):
# the session-40 change measured against what came before it.
bench_run 200 "$results" env MARLHF_CUDA_STORED_INPUTS=0 "$train_step" --device cuda --model "$behind" "${step_size[@]}"
# The 1B step with q, k and v as three products (MARLHF_FUSED_QKV=0, model/transformer.c's
# layer_fuses_qkv): the session-48 change against what came before it ("fused_qkv": false).
bench_run 200 "$results" env MARLHF_FUSED_QKV=0 "$train_step" --device cuda --model "$behind" "${step_size[@]}"
[ "$quick" = 1 ] || peer 200 "$results" python3 bench/torch_gpu_train_step.py --shape "$behind_peer" "${step_size[@]}" \
    --warmup 3 --device cuda --max-grad-norm 0
# Decoding with the float weights (a batch-1 step's products are matvec_bf16.cuh's since
# session 47; predicted near Q8_0's rate, 361 tok/s on 2026-12-04), greedy: each step's
# tokens from the device (model_last_greedy, session 49), where 2026-12-04's copied the
# logits; then sampled as PPO's rollouts are (temperature 0.8, top-k 50: the candidates
# from the device, model_last_candidates); then as an OpenAI request samples by default
# (temperature 1, no top-k: each row drawn over the whole vocabulary on the device since
# session 50, model_last_sampled; before, the [B, V] logits were copied and sampled on the host).
short=(--new $short_new --prompt $short_prompt)
bench_run 200 "$results" "$decode" --device cuda --shape $decode_shape --batches 1,64 "${short[@]}"
# The same greedy steps with each RMSNorm a launch of its own (MARLHF_UNFOLDED_NORMS=1,
# model/transformer.c's layer_folds_norm): the session-59 change against what came before it
# ("folded_norms": false; at batch 64 nothing is folded).
bench_run 200 "$results" env MARLHF_UNFOLDED_NORMS=1 "$decode" --device cuda --shape $decode_shape --batches 1,8 \
    "${short[@]}"
bench_run 200 "$results" "$decode" --device cuda --shape $decode_shape --batches 1,64 "${short[@]}" \
    --temperature 0.8 --top-k 50
bench_run 200 "$results" "$decode" --device cuda --shape $decode_shape --batches 1,64 "${short[@]}" \
    --temperature 1 --top-k 0
# Top-p without top-k (session 53): each row's largest logits from the device while they hold
# its nucleus (gen/sampler.h, sampler_candidates_hold_nucleus), else the copied row. Random
# weights give nearly uniform rows, whose nucleus no candidates hold; at temperature 0.1 the
# rows are peaked as a trained model's are. The line's backend_picked_tokens and
# nucleus_misses say which path the steps took.
bench_run 200 "$results" "$decode" --device cuda --shape $decode_shape --batches 1,64 "${short[@]}" \
    --temperature 0.1 --top-p 0.9
# quantized weights: the decode kernel (matvec_quantized.cuh, batches of up to 8) and the
# tiles (64), and the float32 buffer without the quantized slots (float_params_mb); bf16
# (session 54) is its own tile at 64 rows, no dequantization, and 2 bytes a weight where the
# float model holds 4 and its bf16 copies 2 more (peak_mem_gib beside the float line's)
for quantize in q8_0 q4_k_m q5_k_m bf16; do
    [ "$quick" = 1 ] || bench_run 200 "$results" "$decode" --device cuda --shape $decode_shape --quantize $quantize \
        --batches 1,8,64 "${short[@]}"
done
for batch in 1 64; do
    [ "$quick" = 1 ] || peer 200 "$results" python3 bench/torch_gpu_decode.py --shape smollm2 --batch $batch \
        --prompt-len $short_prompt --new-tokens $short_new --device cuda
    [ "$quick" = 1 ] || peer 200 "$results" python3 bench/torch_gpu_decode.py --shape smollm2 --batch $batch \
        --prompt-len $short_prompt --new-tokens $short_new --device cuda --temperature 0.8 --top-k 50
    [ "$quick" = 1 ] || peer 200 "$results" python3 bench/torch_gpu_decode.py --shape smollm2 --batch $batch \
        --prompt-len $short_prompt --new-tokens $short_new --device cuda --temperature 0.1 --top-p 0.9
done
cat "$results" | tee -a "$log"
# Op-by-op breakdown of the same steps (bench/ops_breakdown.c), into its own file.
stage "op-by-op breakdown"
shapes="" attentions="mma mma-plain mma-ds wmma"
for pair in $train_pairs; do shapes+=" ${pair%%:*}"; done
[ "$quick" = 1 ] && attentions="mma mma-plain mma-ds"
for shape in $shapes; do
    for attention in $attentions; do
        bench_run 120 "$logs/ops_breakdown.jsonl" "$ops_breakdown" --device cuda --model $shape "${breakdown_size[@]}" \
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
    bench_run 200 "$results" "$decode" --device cuda --shape $decode_shape --kv-cache $kv_cache \
        --batches 1,64 --new $long_new --prompt $long_prompt
done
for batch in 1 64; do
    [ "$quick" = 1 ] || peer 200 "$results" python3 bench/torch_gpu_decode.py --shape smollm2 --batch $batch \
        --prompt-len $long_prompt --new-tokens $long_new --device cuda
done
grep -hs "\"prompt\": $long_prompt\\|\"prompt_len\": $long_prompt" "$results" | tee -a "$log"
summary_speed=$(python3 tests/gpu/bench_summary.py "$results" --pairs "$train_pairs" --prompt $short_prompt \
    --long-prompt $long_prompt 2>&1)
