"""Writes tests/fixtures/gguf/q5_k_m.gguf and q5_k_m.expected.json: a small random Llama
quantized by llama.cpp itself to its Q5_K_M mix (Q5_K for most matrices, Q6_K for the output
and the attn_v / ffn_down llama.cpp picks), and llama.cpp's logits on that file, so that
tests/test_kquant.c can hold marlhf's Q5_K decode (the file's own bits) to llama.cpp's without
llama.cpp at test time.

    .venv-tools/bin/python tools/make_q5_k_fixture.py [--llama-python PYTHON]

Two steps, two interpreters: this one (gguf-py) writes the float32 GGUF; PYTHON, one with
llama-cpp-python (llama_model_quantize, Llama), quantizes it (ftype MOSTLY_Q5_K_M) and
evaluates both files on the same tokens. The model: 2 layers, hidden 256 (4 heads of 64, 2
KV heads), intermediate 256, vocabulary 512 (a byte-level BPE table: the 256 byte tokens, one
merge and filler tokens; only ids are used), weights N(0, 1 / fan_in), untied output. Every
row is whole super-blocks of 256, so llama.cpp keeps no fallback type in the mix.

The expected file holds, for the token ids given, llama.cpp's logits on the Q5_K_M file (f32
K/V cache, all positions of one batch, 7 significant digits) and the largest difference
between them and llama.cpp's logits on the float32 file: how far the quantization itself
moves them, which the test's tolerance must stay well under.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
out_dir = os.path.join(root, "tests/fixtures/gguf")
IDS = [1, 17, 300, 42, 511, 256, 99, 7, 128, 64, 5, 333]
LLAMA_FTYPE_MOSTLY_Q5_K_M = 17


def byte_tokens():
    """GPT-2's byte-to-character table: the byte-level BPE vocabulary's first 256 tokens."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return [chars[b] for b in range(256)]


def llama_writer(path, layers, hidden, heads, kv_heads, inter, vocab, context):
    """A GGUFWriter for a Llama of these sizes, its metadata written: the byte-level BPE
    vocabulary (the 256 byte tokens, one merge, filler tokens up to `vocab`; only ids are
    used), BOS 1, EOS 2. The tensors are the caller's (this fixture's, make_q4_1_fixtures.py's,
    bench/random_llama_gguf.py's)."""
    import gguf
    w = gguf.GGUFWriter(path, "llama")
    w.add_block_count(layers)
    w.add_context_length(context)
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(inter)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_rope_dimension_count(hidden // heads)
    w.add_vocab_size(vocab)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(byte_tokens() + ["to"] + [f"tok{i}" for i in range(vocab - 257)])
    w.add_token_types([1] * vocab)
    w.add_token_merges(["t o"])  # llama.cpp refuses a BPE table without merges
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    return w


def write_random_llama(path, seed, layers, hidden, heads, kv_heads, inter, vocab):
    """A float32 GGUF of a random Llama of these sizes (llama_writer's metadata): weights
    N(0, 1 / fan_in), norms near 1, an untied output 3x larger, from numpy's generator
    seeded `seed` in this order, so a fixture's file is the same on every run."""
    import numpy as np
    rng = np.random.default_rng(seed)
    head_dim = hidden // heads
    w = llama_writer(path, layers, hidden, heads, kv_heads, inter, vocab, 128)

    def matrix(rows, cols):  # GGUF's [rows, cols] (ne = cols, rows): rows outputs of cols inputs
        return (rng.standard_normal((rows, cols)) / np.sqrt(cols)).astype(np.float32)

    w.add_tensor("token_embd.weight", rng.standard_normal((vocab, hidden)).astype(np.float32))
    for i in range(layers):
        w.add_tensor(f"blk.{i}.attn_norm.weight", (1 + 0.1 * rng.standard_normal(hidden)).astype(np.float32))
        w.add_tensor(f"blk.{i}.attn_q.weight", matrix(hidden, hidden))
        w.add_tensor(f"blk.{i}.attn_k.weight", matrix(kv_heads * head_dim, hidden))
        w.add_tensor(f"blk.{i}.attn_v.weight", matrix(kv_heads * head_dim, hidden))
        w.add_tensor(f"blk.{i}.attn_output.weight", matrix(hidden, hidden))
        w.add_tensor(f"blk.{i}.ffn_norm.weight", (1 + 0.1 * rng.standard_normal(hidden)).astype(np.float32))
        w.add_tensor(f"blk.{i}.ffn_gate.weight", matrix(inter, hidden))
        w.add_tensor(f"blk.{i}.ffn_up.weight", matrix(inter, hidden))
        w.add_tensor(f"blk.{i}.ffn_down.weight", matrix(hidden, inter))
    w.add_tensor("output_norm.weight", np.ones(hidden, dtype=np.float32))
    w.add_tensor("output.weight", 3 * matrix(vocab, hidden))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def write_f32(path):
    write_random_llama(path, seed=5, layers=2, hidden=256, heads=4, kv_heads=2, inter=256, vocab=512)


def llama_step(f32, q5, expected):
    """Run under llama-cpp-python: quantize, evaluate, write the expected logits."""
    import llama_cpp
    import numpy as np
    from llama_cpp import Llama
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = LLAMA_FTYPE_MOSTLY_Q5_K_M
    params.nthread = 1
    assert llama_cpp.llama_model_quantize(f32.encode(), q5.encode(), params) == 0, "llama.cpp quantize failed"

    def logits(path):
        llm = Llama(model_path=path, logits_all=True, n_ctx=64, n_batch=64, verbose=False, n_threads=1,
                    type_k=0, type_v=0)
        llm.eval(IDS)
        return np.array(llm.scores[: len(IDS)], dtype=np.float32)

    q5_logits, f32_logits = logits(q5), logits(f32)
    with open(expected, "w") as f:
        json.dump({"source": "llama.cpp (llama-cpp-python " + llama_cpp.__version__ + ") on q5_k_m.gguf, ftype "
                   "MOSTLY_Q5_K_M of the float32 model; f32 K/V cache; the ids in one batch",
                   "ids": IDS, "vocab": int(q5_logits.shape[1]),
                   # How far llama.cpp's logits move from the float32 file's to the Q5_K_M file's.
                   "quantization_max_difference": float(np.abs(q5_logits - f32_logits).max()),
                   "logits": [[float(f"{x:.7g}") for x in row] for row in q5_logits]}, f)
        f.write("\n")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--llama-python", default=os.environ.get("LLAMA_CPP_PYTHON", "python3"),
                    help="an interpreter with llama-cpp-python")
    ap.add_argument("--llama-step", nargs=3, metavar=("F32", "Q5", "EXPECTED"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.llama_step:
        llama_step(*args.llama_step)
        return
    q5 = os.path.join(out_dir, "q5_k_m.gguf")
    expected = os.path.join(out_dir, "q5_k_m.expected.json")
    with tempfile.TemporaryDirectory() as tmp:
        f32 = os.path.join(tmp, "f32.gguf")
        write_f32(f32)
        subprocess.run([args.llama_python, os.path.abspath(__file__), "--llama-step", f32, q5, expected], check=True)
    print("wrote", q5, expected)


if __name__ == "__main__":
    sys.exit(main())
