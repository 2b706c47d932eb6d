# Shared by the scripts in tests/cli/ (sourced after `failures=0` and `tmp=...` are set):
# PASS/FAIL lines for tests/run.sh, and the bad-input check every command must pass.
pass() { echo "PASS $1"; }
fail() { echo "FAIL $1: $2"; failures=$((failures + 1)); }

# json_values FILE KEY: the KEY values of the JSON lines of FILE that have it, space-separated
# (a run's metrics.jsonl, say).
json_values() { python3 -c "import sys, json; print(' '.join(str(r[sys.argv[2]]) for r in map(json.loads, open(sys.argv[1])) if sys.argv[2] in r))" "$@"; }

# same_losses RUN_A RUN_B COUNT [TOLERANCE]: whether two runs' metrics.jsonl hold the same
# train/loss and eval/loss values, COUNT of them in all, each within TOLERANCE (1e-6 unless
# given) relative (of 1e-3 at least); prints the worst difference on stderr.
same_losses() {
    python3 - "$(json_values "$1/metrics.jsonl" train/loss) $(json_values "$1/metrics.jsonl" eval/loss)" \
        "$(json_values "$2/metrics.jsonl" train/loss) $(json_values "$2/metrics.jsonl" eval/loss)" "$3" "${4:-1e-6}" << 'PY'
import sys
a, b = [list(map(float, s.split())) for s in sys.argv[1:3]]
if not len(a) == len(b) == int(sys.argv[3]):
    print(f"{len(a)} and {len(b)} losses, want {sys.argv[3]}", file=sys.stderr)
    sys.exit(1)
worst = max(abs(x - y) / max(abs(x), 1e-3) for x, y in zip(a, b))
print(f"{len(a)} losses, worst relative difference {worst:.2e}", file=sys.stderr)
sys.exit(0 if worst <= float(sys.argv[4]) else 1)
PY
}

# expect_error NAME EXPECTED_SUBSTRING COMMAND...: the command must exit 2 and print exactly
# one line on stderr, "marlhf: error: ...", containing EXPECTED_SUBSTRING.
expect_error() {
    local name=$1 expected=$2
    shift 2
    "$@" > "$tmp/stdout" 2> "$tmp/stderr"
    local rc=$? lines
    lines=$(wc -l < "$tmp/stderr")
    if [ "$rc" -eq 2 ] && [ "$lines" -eq 1 ] && grep -q '^marlhf: error: ' "$tmp/stderr" &&
        grep -qF -- "$expected" "$tmp/stderr"; then
        echo "PASS $name"
    else
        echo "FAIL $name (exit $rc, $lines stderr lines, wanted '$expected'):"
        sed 's/^/    /' "$tmp/stderr" | head -n 5
        failures=$((failures + 1))
    fi
}

# expect_runs_on_cuda NAME COMMAND...: a command with --device cuda that the options allow.
# Where a GPU is present it must succeed; without one (or in a build without nvcc) its only
# complaint is the device: expect_error's one line naming --device cuda. Then, where the
# build has marlhf_emulated beside $bin (nvcc found, no sanitizer), the same command must
# succeed on the emulated CUDA backend (tests/emulated_cuda: the backend's own code on CPU
# threads), so that its GPU path runs in CI; its --output is the given one + "-emulated"
# (what the script checks of the given one afterwards stays true).
expect_runs_on_cuda() {
    local name=$1
    shift
    if "$@" > "$tmp/stdout" 2> "$tmp/stderr"; then
        echo "PASS $name"
        return
    fi
    expect_error "$name" "(--device cuda)" "$@"
    local emulated
    emulated="$(dirname "$bin")/marlhf_emulated"
    if [ "$1" = "$bin" ] && [ -x "$emulated" ]; then
        local arguments=("${@:2}") i
        for ((i = 0; i + 1 < ${#arguments[@]}; i++)); do
            [ "${arguments[i]}" = --output ] && arguments[i + 1]="${arguments[i + 1]}-emulated"
        done
        if "$emulated" "${arguments[@]}" > "$tmp/stdout" 2> "$tmp/stderr"; then
            pass "${name}_emulated"
        else
            fail "${name}_emulated" "on the emulated CUDA backend: $(tail -n 1 "$tmp/stderr")"
        fi
    fi
}

# wait_exit PID SECONDS: waits for a background process to end, at most SECONDS; kills it
# (-9) if it is still there. Sets exit_rc to its status, or 124 when it had to be killed.
wait_exit() {
    local pid=$1 tenths=$(($2 * 10))
    for _ in $(seq "$tenths"); do
        kill -0 "$pid" 2> /dev/null || break
        sleep 0.1
    done
    if kill -0 "$pid" 2> /dev/null; then
        kill -9 "$pid" 2> /dev/null
        wait "$pid" 2> /dev/null
        exit_rc=124
    else
        wait "$pid"
        exit_rc=$?
    fi
}

# wait_port PID LOG SED_EXPR TRIES: the port a server started with --port 0 prints on its ready
# line in LOG (SED_EXPR, for `sed -n`, prints just the number), polled every 0.1 s at most
# TRIES times while PID lives. Sets port ("" when none); returns 0 when found.
wait_port() {
    local pid=$1 log=$2 expr=$3 tries=$4
    port=
    for _ in $(seq "$tries"); do
        port=$(sed -n "$expr" "$log" 2> /dev/null)
        [ -n "$port" ] && return 0
        kill -0 "$pid" 2> /dev/null || return 1
        sleep 0.1
    done
    return 1
}

# latest_checkpoint_step OUT: the largest N of OUT's checkpoint-N folders (0: none). Half-
# written ones (checkpoint-N.tmp-PID, .old-PID) do not count.
latest_checkpoint_step() {
    local folder step latest=0
    for folder in "$1"/checkpoint-*; do
        step=${folder##*/checkpoint-}
        [[ $step =~ ^[0-9]+$ ]] && [ "$step" -gt "$latest" ] && latest=$step
    done
    echo "$latest"
}

# interrupted_run OUT COMMAND...: runs COMMAND (a trainer writing into OUT, saving every
# step, at least 24 steps) in the background, kills it (-9) at a random moment soon after
# its checkpoint of step 1..4, resumes it with --resume and kills that too at a random
# moment, then resumes it to the end (stderr in OUT.err). Sets finished_early=1 when the
# first run ended before its kill. The kill follows the run's progress, not the clock: a
# fixed delay after the first checkpoint landed after the end of a short run on a fast
# machine (a 24-iteration PPO lasts 0.5 s here).
interrupted_run() {
    local out=$1 pid kill_after=$((1 + RANDOM % 4))
    shift
    "$@" 2> /dev/null &
    pid=$!
    for _ in $(seq 3000); do
        [ "$(latest_checkpoint_step "$out")" -ge "$kill_after" ] && break
        kill -0 $pid 2> /dev/null || break
        sleep 0.01
    done
    sleep "0.0$((RANDOM % 5))" # mid-step or mid-save
    kill -9 $pid 2> /dev/null
    wait $pid 2> /dev/null
    finished_early=0
    [ -d "$out/final" ] && finished_early=1
    "$@" --resume 2> /dev/null &
    pid=$!
    sleep 0.$RANDOM
    kill -9 $pid 2> /dev/null
    wait $pid 2> /dev/null
    "$@" --resume 2> "$out.err"
}

# kill_test_epochs N: the epochs of a run that a resume test kills mid-way. N is chosen so
# that the plain build's run lasts a few seconds; the sanitizer build's steps are about 2.5
# times slower, so there 3/8 of N (at least 3) lasts about as long: the kills still land
# mid-run, and the sanitized pass spends its time on the paths rather than on more steps.
kill_test_epochs() {
    if sanitized_build; then
        local fewer=$(($1 * 3 / 8))
        echo $((fewer < 3 ? 3 : fewer))
    else
        echo "$1"
    fi
}

# json_field FILE KEY INDEX: the INDEX-th (a Python index, -1 the last) value of KEY among the
# rows of the JSON Lines FILE that have it.
json_field() { python3 -c "import sys, json; rows=[json.loads(l) for l in open(sys.argv[1])]; rows=[r for r in rows if sys.argv[2] in r]; print(rows[int(sys.argv[3])][sys.argv[2]])" "$@"; }
# mpi_test_environment: what mpirun needs on the test machines, exported. CI runs as root;
# the single-copy mechanism needs ptrace rights containers often lack; Open MPI's own
# allocations outlive MPI_Finalize, which LeakSanitizer would report in the SANITIZE build.
# The ob1 messaging layer (shared memory between ranks of one machine, what the tests run):
# Open MPI's default probes UCX first, which took half of a 2-rank job's start (0.40 against
# 0.21 s for a 2-step SFT; the suite starts a few hundred jobs).
mpi_test_environment() {
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl_vader_single_copy_mechanism=none
    export OMPI_MCA_pml=${OMPI_MCA_pml:-ob1}
    export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
}
# ranks N COMMAND...: COMMAND as N MPI processes on this machine (--oversubscribe: the 2-core
# machines start 2 or 3 ranks whatever the slot count).
ranks() {
    local n=$1
    shift
    mpirun --oversubscribe --bind-to none -np "$n" "$@"
}

# close A B TOLERANCE: two lists of numbers of equal length agree within TOLERANCE (relative to
# the larger of 1 and the first's magnitude);
# None (a null metric) matches only None.
close() { python3 -c "
import sys
a, b, tol = sys.argv[1].split(), sys.argv[2].split(), float(sys.argv[3])
ok = len(a) == len(b) > 0 and all(x == y or abs(float(x) - float(y)) <= tol * max(1.0, abs(float(x))) for x, y in zip(a, b))
sys.exit(0 if ok else 1)" "$@"; }
# weights_close A.safetensors B.safetensors TOLERANCE: every float32 tensor of the two files
# within TOLERANCE of each other, relative to the tensor's largest magnitude; prints the
# worst such difference. For runs that agree up to float rounding: where a BLAS's kernels
# round a row differently by its place in the batch (OpenBLAS's on AMD Zen), results that
# are bit for bit equal elsewhere differ in the last bits.
weights_close() {
    python3 - "$@" << 'PYEOF'
import array, json, struct, sys
def tensors(path):
    with open(path, "rb") as f:
        size = struct.unpack("<Q", f.read(8))[0]
        header, data = json.loads(f.read(size)), f.read()
    out = {}
    for name, info in header.items():
        if name == "__metadata__" or info["dtype"] != "F32":
            continue
        values = array.array("f")
        values.frombytes(data[info["data_offsets"][0]:info["data_offsets"][1]])
        out[name] = values
    return out
a, b, tolerance = tensors(sys.argv[1]), tensors(sys.argv[2]), float(sys.argv[3])
worst = 0.0 if a.keys() == b.keys() and a else float("inf")
for name in a.keys() & b.keys():
    scale = max(max(abs(x) for x in b[name]), 1e-30)
    worst = max(worst, max(abs(x - y) for x, y in zip(a[name], b[name])) / scale)
print(f"{worst:.3g}")
sys.exit(0 if worst <= tolerance else 1)
PYEOF
}

# logprobs_close A B LIMIT: the first rows' log-probs of two logprobs outputs within LIMIT
logprobs_close() {
    python3 -c '
import json, sys
a, b = (json.loads(open(p).readline())["logprobs"] for p in sys.argv[1:3])
d = max(abs(x - y) for x, y in zip(a, b))
assert len(a) == len(b) > 0 and d < float(sys.argv[3]), (d, a, b)
' "$@"
}

# sanitized_build: whether $bin is built with AddressSanitizer (make SANITIZE=1); asked once.
sanitized_build() {
    if [ -z "${bin_sanitized:-}" ]; then
        bin_sanitized=no
        nm "$bin" 2> /dev/null | grep -q '__asan_init' && bin_sanitized=yes
    fi
    [ "$bin_sanitized" = yes ]
}

# real_model_runs FILE SECTION: whether a test section on a real model (SmolLM2) runs: FILE is
# there (scripts/fetch-model) and $bin is the plain build. Under AddressSanitizer such sections
# are the plain build's to check: the tiny fixture models run the same code under the
# sanitizers, and a real model there is several times slower again (the sanitized pass would
# take most of CI's time). Prints why it does not run.
real_model_runs() {
    if [ ! -f "$1" ]; then
        echo "SKIP $2: $1 is not there (scripts/fetch-model)"
        return 1
    fi
    if sanitized_build; then
        echo "SKIP $2: $bin is built with AddressSanitizer; the plain build runs the real model"
        return 1
    fi
    return 0
}

# sft_learns FAMILY MODEL: SFT of MODEL on the tiny data into $tmp/sft (4 epochs) runs and its
# held-out loss falls by a quarter or more.
sft_learns() {
    local family=$1 model=$2 first last
    "$bin" sft --model "$model" --data "$data/sft.jsonl" --eval-data "$data/sft_eval.jsonl" --max-seq-len 32 \
        --per-device-train-batch-size 4 --gradient-accumulation-steps 2 --learning-rate 3e-3 --num-train-epochs 4 \
        --warmup-ratio 0.1 --eval-every 6 --threads 2 --quiet --output "$tmp/sft" 2> "$tmp/sft.err" ||
        fail "${family}_sft_runs" "$(tail -n 3 "$tmp/sft.err")"
    first=$(json_field "$tmp/sft/metrics.jsonl" eval/loss 0 2>/dev/null)
    last=$(json_field "$tmp/sft/metrics.jsonl" eval/loss -1 2>/dev/null)
    python3 -c "import sys; sys.exit(0 if float(sys.argv[2]) < 0.75 * float(sys.argv[1]) else 1)" "$first" "$last" 2>/dev/null &&
        pass "${family}_sft_learns (eval loss $first -> $last)" || fail "${family}_sft_learns" "eval loss '$first' -> '$last'"
}

# rm_and_ma_ppo FAMILY MODEL CLASSIFIER MODEL_TYPE: another model family through steps 2 and 3
# on the tiny data (the caller's $bin, $tmp, $data): a reward model trained from MODEL
# reaches eval accuracy 0.9 and is saved as CLASSIFIER; MA-PPO (fixed 3-grams) of
# $tmp/sft/final against it runs 3 iterations, saves a MODEL_TYPE actor, and a second run of
# the same seed gives the same actor and critic bit for bit.
rm_and_ma_ppo() {
    local family=$1 model=$2 classifier=$3 model_type=$4 acc lines run
    "$bin" rm --model "$model" --data "$data/pairs.jsonl" --eval-data "$data/pairs_eval.jsonl" --max-seq-len 32 \
        --per-device-train-batch-size 4 --learning-rate 3e-3 --num-train-epochs 4 --threads 2 --quiet \
        --output "$tmp/rm" 2> "$tmp/rm.err"
    acc=$(json_field "$tmp/rm/metrics.jsonl" eval/accuracy -1 2>/dev/null)
    python3 -c "import sys; sys.exit(0 if float(sys.argv[1]) >= 0.9 else 1)" "$acc" 2>/dev/null &&
        pass "${family}_rm_learns (eval accuracy $acc)" || fail "${family}_rm_learns" "accuracy '$acc' $(tail -n 2 "$tmp/rm.err")"
    grep -q "\"$classifier\"" "$tmp/rm/final/config.json" && pass "${family}_rm_saved_as_classifier" ||
        fail "${family}_rm_saved_as_classifier" "$(grep -A1 architectures "$tmp/rm/final/config.json")"
    for run in ppo ppo_again; do
        "$bin" ppo --actor-model "$tmp/sft/final" --reward-model "$tmp/rm/final" --prompts "$data/sft.jsonl" \
            --eval-prompts "$data/sft_eval.jsonl" --eval-count 4 --rollout-batch-size 8 --generation-batch-size 8 \
            --micro-batch-size 4 --max-new-tokens 10 --max-iterations 3 --actor-learning-rate 1e-3 \
            --critic-learning-rate 1e-3 --min-response-tokens 1 --termination-condition fixed --ngram 3 --seed 7 \
            --quiet --threads 2 --output "$tmp/$run" 2> "$tmp/$run.err"
    done
    lines=$(grep -c '"train/score"' "$tmp/ppo/metrics.jsonl" 2>/dev/null)
    [ "$lines" = 3 ] && [ -f "$tmp/ppo/final/actor/model.safetensors" ] &&
        grep -q "\"$model_type\"" "$tmp/ppo/final/actor/config.json" &&
        pass "${family}_ppo_runs" || fail "${family}_ppo_runs" "$lines iterations: $(tail -n 3 "$tmp/ppo.err")"
    cmp -s "$tmp/ppo/final/actor/model.safetensors" "$tmp/ppo_again/final/actor/model.safetensors" &&
        cmp -s "$tmp/ppo/final/critic/model.safetensors" "$tmp/ppo_again/final/critic/model.safetensors" &&
        pass "${family}_ppo_reproducible" || fail "${family}_ppo_reproducible" "two runs of seed 7 differ"
}

# run_test_cuda PREFIX EXPECTED_PASSES HARNESS [GROUP...]: runs a test_cuda build (the CPU
# standing in, or the emulated backend; the caller sets its environment), prints its
# PASS/FAIL/SKIP lines as PREFIX/NAME and the first lines of its failures' details, and
# fails PREFIX when it exits badly or its summary is not "EXPECTED_PASSES passed, 0 failed"
# ("*" for any count). Returns its exit status.
run_test_cuda() {
    local prefix=$1 expected=$2 harness=$3 status
    shift 3
    "$harness" "$@" > "$tmp/$prefix.out" 2> "$tmp/$prefix.err"
    status=$?
    sed -n "s/^\(PASS\|FAIL\|SKIP\) /\1 $prefix\//p" "$tmp/$prefix.out"
    grep -E '^  ' "$tmp/$prefix.err" | head -n 20
    if [ "$status" -ne 0 ] && ! grep -q '^FAIL ' "$tmp/$prefix.out"; then
        fail "${prefix}_exit" "$(basename "$harness") exited with status $status: $(tail -n 3 "$tmp/$prefix.err")"
    fi
    local pattern="^${expected/\*/[0-9]*} passed, 0 failed\$"
    grep -q "$pattern" "$tmp/$prefix.out" || fail "${prefix}_summary" "$(tail -n 1 "$tmp/$prefix.out")"
    return "$status"
}
