#!/usr/bin/env bash
# The embedding API from outside: the example programs of examples/ (linked against
# build/libmarlhf.so, as another project would link it) give what the command gives,
# the on-device preference loop runs, is deterministic and saves a model the command
# loads, the shared library exports only the API, and a Python program reaches it with
# ctypes. Prints PASS/FAIL per case.
set -u
cd "$(dirname "$0")/../.."
bin=${MARLHF_BIN:-build/marlhf}
build=$(dirname "$bin")
tmp=${MARLHF_TEST_TMP:-/tmp}/cli_embedding
rm -rf "$tmp" && mkdir -p "$tmp"
model=tests/fixtures/models/tiny_chat
data=tests/fixtures/train
failures=0
. tests/cli_helpers.sh

# --- examples/generate: the same response as `marlhf generate` -----------------------------
for settings in "--temperature 0" "--temperature 1 --seed 5" "--temperature 1 --seed 5 --chat"; do
    read -r -a extra <<< "$settings"
    api=$("$build/examples/generate" "$model" "Tell me about the cat." --max-new-tokens 12 "${extra[@]}" 2> "$tmp/gen.err")
    command=$("$bin" generate --model "$model" --max-new-tokens 12 "${extra[@]}" "Tell me about the cat." 2> /dev/null |
        python3 -c 'import json, sys; print(json.loads(sys.stdin.readline())["response"])')
    [ -n "$command" ] && [ "$api" = "$command" ] && pass "embedding_generate_matches_command ($settings)" ||
        fail "embedding_generate_matches_command ($settings)" "api '$api' command '$command' $(tail -n 1 "$tmp/gen.err")"
done
"$build/examples/generate" tests/fixtures/no_such_model "x" > /dev/null 2> "$tmp/gen.err"
rc=$?
[ $rc -eq 2 ] && grep -q 'no_such_model' "$tmp/gen.err" && pass embedding_generate_bad_model ||
    fail embedding_generate_bad_model "exit $rc: $(cat "$tmp/gen.err")"

# --- examples/preference_loop: online DPO judged by a reward model ---------------------------
"$bin" rm --model "$model" --data "$data/pairs.jsonl" --output "$tmp/rm" --max-seq-len 32 --learning-rate 3e-3 \
    --num-train-epochs 2 --threads 2 --quiet 2> "$tmp/rm.err" || fail embedding_reward_model "$(tail -n 2 "$tmp/rm.err")"
printf 'Tell me about the cat.\nTell me about the dog.\nTell me about the goat.\nTell me about the cow.\n' > "$tmp/prompts.txt"
loop() { "$build/examples/preference_loop" "$model" "$tmp/rm/final" "$tmp/prompts.txt" "$1" 6; }
loop "$tmp/loop1" > "$tmp/loop1.out" 2> "$tmp/loop1.err"
rc=$?
rounds=$(grep -c '^round ' "$tmp/loop1.out")
[ $rc -eq 0 ] && [ "$rounds" -eq 6 ] && [ -f "$tmp/loop1/adapter/adapter_model.safetensors" ] &&
    pass "embedding_preference_loop ($(grep '^round 5' "$tmp/loop1.out"))" ||
    fail embedding_preference_loop "exit $rc, $rounds rounds: $(tail -n 2 "$tmp/loop1.err")"
loop "$tmp/loop2" > "$tmp/loop2.out" 2> /dev/null
sed 's/loop2/loop1/' "$tmp/loop2.out" | cmp -s - "$tmp/loop1.out" && pass embedding_preference_loop_deterministic ||
    fail embedding_preference_loop_deterministic "$(diff "$tmp/loop1.out" "$tmp/loop2.out" | head -n 4)"
"$bin" generate --model "$tmp/loop1" --max-new-tokens 4 "Tell me about the cat." > "$tmp/saved.out" 2> "$tmp/saved.err" &&
    [ -s "$tmp/saved.out" ] && pass embedding_saved_model_loads || fail embedding_saved_model_loads "$(tail -n 1 "$tmp/saved.err")"
before=$(sha256sum "$tmp/loop1/model.safetensors")
loop "$tmp/loop1" > /dev/null 2> "$tmp/again.err"
rc=$?
[ $rc -eq 2 ] && grep -q 'already exists' "$tmp/again.err" && [ "$(sha256sum "$tmp/loop1/model.safetensors")" = "$before" ] &&
    pass embedding_save_never_overwrites || fail embedding_save_never_overwrites "exit $rc: $(cat "$tmp/again.err")"

# --- the shared library: only the API is exported; a ctypes program uses it ---------------
others=$(nm -D --defined-only "$build/libmarlhf.so" | awk '{print $3}' | grep -v '^marlhf_' | grep -v '^$')
[ -z "$others" ] && pass "embedding_exports_only_api ($(nm -D --defined-only "$build/libmarlhf.so" | grep -c ' marlhf_') symbols)" ||
    fail embedding_exports_only_api "also exported: $(echo $others | head -c 300)"
if nm -D "$build/libmarlhf.so" | grep -q '__asan_init'; then
    echo "SKIP embedding_python_ctypes: this library is built with AddressSanitizer, which Python cannot load after its own start"
else
    python3 - "$build/libmarlhf.so" "$model" > "$tmp/ctypes.out" 2>&1 << 'PYEOF'
import ctypes, sys
lib = ctypes.CDLL(sys.argv[1])
class ModelParams(ctypes.Structure):
    _fields_ = [("kind", ctypes.c_int), ("device", ctypes.c_char_p), ("lora_adapter", ctypes.c_char_p),
                ("chat_template", ctypes.c_char_p), ("quantize", ctypes.c_char_p)]  # all of marlhf_model_params:
                # the library returns the whole struct by value
lib.marlhf_model_default_params.restype = ModelParams
lib.marlhf_model_load.restype = ctypes.c_void_p
lib.marlhf_model_load.argtypes = [ctypes.c_char_p, ctypes.POINTER(ModelParams)]
lib.marlhf_logprob.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.POINTER(ctypes.c_double),
                               ctypes.POINTER(ctypes.c_int)]
lib.marlhf_model_free.argtypes = [ctypes.c_void_p]
lib.marlhf_last_error.restype = ctypes.c_char_p
params = lib.marlhf_model_default_params()
model = lib.marlhf_model_load(sys.argv[2].encode(), ctypes.byref(params))
assert model, lib.marlhf_last_error()
total, tokens = ctypes.c_double(), ctypes.c_int()
assert lib.marlhf_logprob(model, b"Tell me about the cat.", b" The cat is good.", ctypes.byref(total), ctypes.byref(tokens)) == 0
print("logprob", total.value, "tokens", tokens.value)
lib.marlhf_model_free(model)
PYEOF
    rc=$?
    [ $rc -eq 0 ] && grep -q '^logprob -' "$tmp/ctypes.out" && pass "embedding_python_ctypes ($(cat "$tmp/ctypes.out"))" ||
        fail embedding_python_ctypes "exit $rc: $(tail -n 3 "$tmp/ctypes.out")"
fi
exit $((failures > 0))
