"""llama.cpp's quantization of a GGUF file, timed: what `llama-quantize SRC DST TYPE THREADS`
does, through llama-cpp-python's llama_model_quantize. Prints one JSON line: the type, the
threads and the seconds the call took (reading SRC and writing DST included, as marlhf
convert's time includes them).

    PYTHON bench/llamacpp_quantize.py --source F32.gguf --output OUT.gguf --type q2_k [--threads 2]
"""
import argparse
import ctypes
import json
import os
import sys
import time


def fail(message):
    """One line on stderr and exit 2, as marlhf's own errors."""
    print(f"marlhf: error: {message} (bench/llamacpp_quantize.py)", file=sys.stderr)
    sys.exit(2)


class Parser(argparse.ArgumentParser):
    def error(self, message):
        fail(message)


# llama_ftype values (llama.h) of the mixes marlhf convert writes under the same names.
FILE_TYPES = {"q8_0": 7, "q4_0": 2, "q4_1": 3, "q5_0": 8, "q5_1": 9, "q2_k": 10, "q3_k_m": 12, "q4_k_m": 15,
              "q5_k_m": 17, "iq4_nl": 25, "iq4_xs": 30}

ap = Parser()
ap.add_argument("--source", required=True, help="the GGUF file to quantize (F32 or F16)")
ap.add_argument("--output", required=True)
ap.add_argument("--type", required=True, help=", ".join(FILE_TYPES))
ap.add_argument("--threads", type=int, default=2)
args = ap.parse_args()
if not os.path.isfile(args.source):
    fail(f"{args.source} does not exist")
if os.path.exists(args.output):
    fail(f"{args.output} exists; remove it first")
if args.type not in FILE_TYPES:
    fail(f"--type {args.type}: expected one of {', '.join(FILE_TYPES)}")
if args.threads < 1:
    fail(f"--threads {args.threads}: expected at least 1")
try:
    import llama_cpp
except ImportError:
    fail("llama-cpp-python is not installed in this Python (pip install llama-cpp-python)")

params = llama_cpp.llama_model_quantize_default_params()
params.ftype = FILE_TYPES[args.type]
params.nthread = args.threads
start = time.perf_counter()
rc = llama_cpp.llama_model_quantize(args.source.encode(), args.output.encode(), ctypes.byref(params))
seconds = time.perf_counter() - start
if rc != 0:
    fail(f"llama.cpp could not quantize {args.source} to {args.type} (code {rc})")
print(json.dumps({"program": "llama.cpp", "version": llama_cpp.__version__, "type": args.type,
                  "threads": args.threads, "seconds": round(seconds, 3)}))
