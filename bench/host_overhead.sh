#!/usr/bin/env bash
# What a GPU decode step asks of the host, measured without a GPU: build/bench/decode over the
# CUDA backend's CPU emulation with MARLHF_EMULATED_SKIP_WORK=1 (tests/emulated_cuda/
# emulated_runtime.h: every launch and cuBLASLt product checked and counted, none run), so
# that the time left is the model's C code, the backend's host wrappers and the emulation's
# bookkeeping -- the host's share of a step without the driver's cost per launch, which a
# GPU adds (a few microseconds each) -- and the counts are the launches a GPU step makes.
# One JSON line per shape and batch:
#   host_ms_per_step     the decode steps' wall time per step, one thread (--new LONG's run)
#   kernels_per_step     kernel launches per decode step    } from two runs, --new SHORT and
#   products_per_step    cuBLASLt products per decode step  } --new LONG: their difference
#                                                             over LONG - SHORT steps
# Needs nvcc (the emulated binaries are built beside the CUDA backend). Figures are not
# speeds of a GPU. SHAPES (default "smollm2-135m llama-1b"), BATCHES ("1 64"), SHORT (17),
# LONG (65) set the runs; QUANTIZE (e.g. q8_0) runs the weights so quantized (--quantize).
#   bash bench/host_overhead.sh
set -euo pipefail
cd "$(dirname "$0")/.."
make --no-print-directory build/bench/decode_emulated > /dev/null ||
    { echo "bench/host_overhead.sh: build/bench/decode_emulated is not built (it needs nvcc)" >&2; exit 2; }
short=${SHORT:-17} long=${LONG:-65}
[[ "$short" =~ ^[1-9][0-9]*$ && "$long" =~ ^[1-9][0-9]*$ && $long -gt $short ]] ||
    { echo "bench/host_overhead.sh: SHORT=$short and LONG=$long must be whole numbers with LONG > SHORT" >&2; exit 2; }

# run SHAPE BATCH NEW: the decode line, then the emulation's count line
run() {
    MARLHF_EMULATED_SKIP_WORK=1 MARLHF_EMULATED_COUNT_LAUNCHES=1 OMP_NUM_THREADS=1 \
        build/bench/decode_emulated --shape "$1" --device cuda --batches "$2" --new "$3" \
            ${QUANTIZE:+--quantize "$QUANTIZE"} 2>&1 |
        grep '^{\|^emulation: [0-9]* kernel launches'
}

for shape in ${SHAPES:-smollm2-135m llama-1b}; do
    for batch in ${BATCHES:-1 64}; do
        run "$shape" "$batch" "$short" > /tmp/host_overhead_short.$$
        run "$shape" "$batch" "$long" > /tmp/host_overhead_long.$$
        python3 - "$shape" "$batch" "$short" "$long" /tmp/host_overhead_short.$$ /tmp/host_overhead_long.$$ <<'PY'
import json, re, sys
shape, batch, short, long_, short_file, long_file = sys.argv[1:]
def read(path):
    lines = open(path).read().splitlines()
    decode = json.loads(next(l for l in lines if l.startswith("{")))
    counts = re.search(r"emulation: (\d+) kernel launches, (\d+) cuBLASLt products", "\n".join(lines))
    return decode, int(counts.group(1)), int(counts.group(2))
_, kernels_short, products_short = read(short_file)
decode, kernels_long, products_long = read(long_file)
steps = int(long_) - int(short)
print(json.dumps({"bench": "host_overhead", "shape": shape, "batch": int(batch), "quantize": decode.get("quantize"),
                  "host_ms_per_step": decode["ms_per_step"],
                  "kernels_per_step": round((kernels_long - kernels_short) / steps, 1),
                  "products_per_step": round((products_long - products_short) / steps, 1),
                  "new_tokens": [int(short), int(long_)], "threads": 1}))
PY
        rm -f /tmp/host_overhead_short.$$ /tmp/host_overhead_long.$$
    done
done
