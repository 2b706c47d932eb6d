"""Writes tests/fixtures/gguf/q3_k_m.gguf and q2_k.gguf with their .expected.json: the random
Llama of tools/make_q5_k_fixture.py (the same float32 weights) quantized by llama.cpp itself
to its Q3_K_M mix (Q3_K for most matrices; Q4_K / Q5_K for the attn_v, attn_output and
ffn_down llama.cpp picks, Q6_K for the output) and to its Q2_K mix (Q2_K; Q3_K for attn_v,
attn_output and ffn_down, Q6_K for the output), and llama.cpp's logits on each file, so that
tests/test_kquant.c can hold marlhf's Q3_K and Q2_K decode (the files' own bits) to
llama.cpp's without llama.cpp at test time.

    .venv-tools/bin/python tools/make_q3_k_fixture.py [--llama-python PYTHON]

As in make_q5_k_fixture.py, two interpreters: this one (gguf-py, numpy) writes the float32
GGUF; PYTHON, one with llama-cpp-python, quantizes it (llama_model_quantize, ftypes
MOSTLY_Q3_K_M and MOSTLY_Q2_K, no importance matrix) and evaluates every file on the same
tokens (f32 K/V cache, all positions in one batch). Each expected file holds llama.cpp's
logits on that file (7 significant digits) and the largest difference between them and
llama.cpp's logits on the float32 file: how far the quantization itself moves them.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_q5_k_fixture import IDS, out_dir, write_f32  # noqa: E402

# llama.cpp's llama_ftype values.
FTYPES = {"q3_k_m": ("MOSTLY_Q3_K_M", 12), "q2_k": ("MOSTLY_Q2_K", 10)}


def llama_step(f32, out_dir_arg):
    """Run under llama-cpp-python: quantize to each type, evaluate, write the expected logits."""
    import llama_cpp
    import numpy as np
    from llama_cpp import Llama

    def logits(path):
        llm = Llama(model_path=path, logits_all=True, n_ctx=64, n_batch=64, verbose=False, n_threads=1,
                    type_k=0, type_v=0)
        llm.eval(IDS)
        return np.array(llm.scores[: len(IDS)], dtype=np.float32)

    f32_logits = logits(f32)
    for name, (ftype_name, ftype) in FTYPES.items():
        quantized = os.path.join(out_dir_arg, name + ".gguf")
        params = llama_cpp.llama_model_quantize_default_params()
        params.ftype = ftype
        params.nthread = 1
        assert llama_cpp.llama_model_quantize(f32.encode(), quantized.encode(), params) == 0, \
            "llama.cpp quantize failed"
        q_logits = logits(quantized)
        with open(os.path.join(out_dir_arg, name + ".expected.json"), "w") as f:
            json.dump({"source": "llama.cpp (llama-cpp-python " + llama_cpp.__version__ + ") on " + name +
                       ".gguf, ftype " + ftype_name + " of the float32 model; f32 K/V cache; the ids in one batch",
                       "ids": IDS, "vocab": int(q_logits.shape[1]),
                       "quantization_max_difference": float(np.abs(q_logits - f32_logits).max()),
                       "logits": [[float(f"{x:.7g}") for x in row] for row in q_logits]}, f)
            f.write("\n")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--llama-python", default=os.environ.get("LLAMA_CPP_PYTHON", "python3"),
                    help="an interpreter with llama-cpp-python")
    ap.add_argument("--llama-step", nargs=2, metavar=("F32", "OUT_DIR"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.llama_step:
        llama_step(*args.llama_step)
        return
    with tempfile.TemporaryDirectory() as tmp:
        f32 = os.path.join(tmp, "f32.gguf")
        write_f32(f32)
        subprocess.run([args.llama_python, os.path.abspath(__file__), "--llama-step", f32, out_dir], check=True)
    for name in FTYPES:
        print("wrote", os.path.join(out_dir, name + ".gguf"), os.path.join(out_dir, name + ".expected.json"))


if __name__ == "__main__":
    sys.exit(main())
