# Sourced by the benches that compare with PyTorch on SmolLM2-135M: checks that the build
# and .venv-tools are there, exports THREADS to the math libraries, and makes (once) $hf,
# the Q4_1 GGUF as a float32 Hugging Face folder, and $rm, those weights with
# bench/trl_ppo_iteration.py's fixed-seed score head (a LlamaForSequenceClassification).
# Needs hf, rm, threads and py set.
[ -x build/marlhf ] || { echo "build/marlhf missing: run make" >&2; exit 1; }
[ -x "$py" ] || { echo "$py missing: run scripts/setup-python" >&2; exit 1; }
export OMP_NUM_THREADS=$threads MKL_NUM_THREADS=$threads TOKENIZERS_PARALLELISM=false
[ -f "$hf/model.safetensors" ] ||
    build/marlhf convert models/SmolLM2-135M-Instruct.Q4_1.gguf "$hf" --threads "$threads" --overwrite >&2
[ -f "$rm/model.safetensors" ] ||
    "$py" bench/trl_ppo_iteration.py --actor "$hf" --make-reward-model "$rm" 2>&1 | grep '^wrote' >&2
