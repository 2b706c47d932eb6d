"""Writes a float32 GGUF of a random Llama whose rows are all whole K-quant super-blocks
(hidden 1024, 8 heads of 128, 2 KV heads, intermediate 2816 = 11 x 256, 8 layers, vocabulary
32000, untied output: 156M weights, SmolLM2-135M's scale), so that llama.cpp's Q3_K_M and
Q2_K files of it hold Q3_K / Q2_K for the bulk of their matrices -- unlike SmolLM2's, whose
rows of 576 fall back to Q4_0 (docs/quantization.md, "Q3_K and Q2_K").
bench/run_kquant_random_decode.sh quantizes it with llama.cpp and times both programs.

    <python with gguf and numpy> bench/random_llama_gguf.py OUT.gguf
"""
import sys

import gguf
import numpy as np

sys.path.insert(0, __file__.rsplit("/", 2)[0] + "/tools")
from make_q5_k_fixture import llama_writer  # noqa: E402


def main(path):
    rng = np.random.default_rng(11)
    layers, hidden, heads, kv_heads, inter, vocab = 8, 1024, 8, 2, 2816, 32000
    head_dim = hidden // heads
    w = llama_writer(path, layers, hidden, heads, kv_heads, inter, vocab, 2048)

    def matrix(rows, cols):
        return (rng.standard_normal((rows, cols), dtype=np.float32) / np.sqrt(cols)).astype(np.float32)

    w.add_tensor("token_embd.weight", rng.standard_normal((vocab, hidden), dtype=np.float32))
    for i in range(layers):
        w.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(hidden, dtype=np.float32))
        w.add_tensor(f"blk.{i}.attn_q.weight", matrix(hidden, hidden))
        w.add_tensor(f"blk.{i}.attn_k.weight", matrix(kv_heads * head_dim, hidden))
        w.add_tensor(f"blk.{i}.attn_v.weight", matrix(kv_heads * head_dim, hidden))
        w.add_tensor(f"blk.{i}.attn_output.weight", matrix(hidden, hidden))
        w.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(hidden, dtype=np.float32))
        w.add_tensor(f"blk.{i}.ffn_gate.weight", matrix(inter, hidden))
        w.add_tensor(f"blk.{i}.ffn_up.weight", matrix(inter, hidden))
        w.add_tensor(f"blk.{i}.ffn_down.weight", matrix(hidden, inter))
    w.add_tensor("output_norm.weight", np.ones(hidden, dtype=np.float32))
    w.add_tensor("output.weight", matrix(vocab, hidden))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    main(sys.argv[1])
