#!/usr/bin/env python3
"""Writes the GGUF test fixtures of tests/test_gguf.c into tests/fixtures/gguf/.

Run with the tools environment:  .venv-tools/bin/python tools/make_gguf_fixtures.py
The output is deterministic (fixed seed), so re-running it gives identical files.

Why: src/io/gguf_dequant.c must convert every tensor type it supports exactly as the
reference does. The reference here is the `gguf` Python package (gguf-py, the one
llama.cpp ships): its GGUFWriter writes the files and gguf.quants.dequantize gives
the expected values, so the C test compares against code it shares nothing with.

Files:
  types.gguf            one small tensor per supported type (alignment 64, to exercise
                        a non-default general.alignment):
                          quant.<T>   random normal data quantized by gguf.quants.quantize
                                      (F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0);
                          random.<T>  blocks of random bytes whose f16 scale fields are
                                      random finite halves (all the above block types and
                                      Q2_K..Q6_K, IQ4_NL, IQ4_XS, TQ1_0, TQ2_0, MXFP4
                                      and NVFP4, most of which gguf-py cannot quantize: random
                                      blocks also reach bit patterns quantization never
                                      produces);
                          special.F16, special.BF16  zeros, infinities, quiet NaNs,
                                      subnormals, extremes, and random bit patterns.
  types.expected.f32    gguf.quants.dequantize() of every tensor of types.gguf, read back
                        with GGUFReader, as raw little-endian f32, concatenated in the
                        order of the tensors in the file.
  tiny_llama.gguf       a 2-layer llama-architecture model's metadata (for
                        config_from_gguf), a 32-token vocabulary, every metadata value
                        type under test.*, and two small F32 tensors (no output.weight,
                        so the embeddings are tied). tests/test_gguf.c hard-codes the
                        values written here: keep the two in step.
"""
import sys
from pathlib import Path

import numpy as np
import gguf
from gguf import GGMLQuantizationType as QT, GGUFValueType as VT

OUT = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "gguf"
SEED = 20240611

# Where the f16 scale fields sit in each block type (byte offsets of 2-byte fields).
F16_FIELDS = {
    QT.Q4_0: [0], QT.Q4_1: [0, 2], QT.Q5_0: [0], QT.Q5_1: [0, 2], QT.Q8_0: [0],
    QT.Q2_K: [80, 82], QT.Q3_K: [108], QT.Q4_K: [0, 2], QT.Q5_K: [0, 2], QT.Q6_K: [208],
    # Appended after the others so that their random bytes stay as they were.
    QT.IQ4_NL: [0], QT.IQ4_XS: [0], QT.TQ1_0: [52], QT.TQ2_0: [64],
    QT.MXFP4: [],  # its scale is an exponent byte: every value of it is finite or +inf by design
    QT.NVFP4: [],  # its scales are unsigned E4M3 bytes: every value is finite
}
QUANTIZABLE = [QT.F32, QT.F16, QT.BF16, QT.Q4_0, QT.Q4_1, QT.Q5_0, QT.Q5_1, QT.Q8_0]


def random_finite_halves(rng, n):
    """n random f16 bit patterns, none of them inf or NaN (exponent 31)."""
    bits = rng.integers(0, 1 << 16, size=n, dtype=np.uint16)
    exponent_all_ones = (bits & 0x7C00) == 0x7C00
    bits[exponent_all_ones] &= 0xBFFF  # clear the top exponent bit: finite
    return bits


def random_blocks(rng, qtype, n_blocks):
    _, type_size = gguf.GGML_QUANT_SIZES[qtype]
    blocks = rng.integers(0, 256, size=(n_blocks, type_size), dtype=np.uint8)
    for offset in F16_FIELDS[qtype]:
        halves = random_finite_halves(rng, n_blocks)
        blocks[:, offset:offset + 2] = halves.view(np.uint8).reshape(n_blocks, 2)
    return blocks


def special_f16():
    # Quiet NaNs only: numpy may convert halves with F16C, which would quiet a
    # signalling NaN, so those would not be a stable reference.
    specials = [0x0000, 0x8000, 0x0001, 0x8001, 0x03FF, 0x0400, 0x7BFF, 0xFBFF, 0x7C00, 0xFC00,
                0x7E00, 0xFE00, 0x7E01, 0x3C00, 0xBC00, 0x3555]
    rng = np.random.default_rng(SEED + 1)
    rest = random_finite_halves(rng, 256 - len(specials))
    return np.concatenate([np.array(specials, dtype=np.uint16), rest]).view(np.float16).reshape(4, 64)


def special_bf16():
    specials = [0x0000, 0x8000, 0x0001, 0x007F, 0x0080, 0x7F7F, 0xFF7F, 0x7F80, 0xFF80, 0x7FC0,
                0xFFC0, 0x7FC1, 0x3F80, 0xBF80]
    rng = np.random.default_rng(SEED + 2)
    rest = rng.integers(0, 1 << 16, size=64 - len(specials), dtype=np.uint16)
    rest[(rest & 0x7F80) == 0x7F80] &= 0xBFFF  # no inf/NaN among the random ones
    return np.concatenate([np.array(specials, dtype=np.uint16), rest]).view(np.uint8).reshape(2, 64)


def write_types(path):
    rng = np.random.default_rng(SEED)
    writer = gguf.GGUFWriter(str(path), arch="marlhf-test")
    writer.add_custom_alignment(64)
    for qtype in QUANTIZABLE:
        shape = (2, 2, 64) if qtype == QT.Q8_0 else (4, 64)  # one 3-D tensor: ne = [64, 2, 2]
        data = rng.standard_normal(size=shape).astype(np.float32) * 0.5
        quantized = gguf.quants.quantize(data, qtype)
        if qtype in (QT.F32, QT.F16):
            writer.add_tensor(f"quant.{qtype.name}", quantized)
        else:
            writer.add_tensor(f"quant.{qtype.name}", quantized, raw_dtype=qtype)
    for qtype in F16_FIELDS:
        block_size, _ = gguf.GGML_QUANT_SIZES[qtype]
        n_blocks = 16 if block_size == 32 else 6
        rows = 2
        blocks = random_blocks(rng, qtype, n_blocks)
        if qtype == QT.MXFP4:  # the subnormal scales (exponents 0, 1) and the largest ones
            blocks[:4, 0] = [0, 1, 254, 255]
        if qtype == QT.NVFP4:  # zero, E4M3's NaN (read as zero), a subnormal, the largest
            blocks[0, :4] = [0x00, 0x7F, 0x01, 0x7E]
            blocks[1, :4] = [0x80, 0xFF, 0x07, 0x08]  # the unused top bit set
        blocks = blocks.reshape(rows, -1)
        writer.add_tensor(f"random.{qtype.name}", blocks, raw_dtype=qtype)
    writer.add_tensor("special.F16", special_f16())
    writer.add_tensor("special.BF16", special_bf16(), raw_dtype=QT.BF16)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def write_expected(gguf_path, out_path):
    reader = gguf.GGUFReader(str(gguf_path))
    with open(out_path, "wb") as out:
        for tensor in reader.tensors:
            values = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
            assert values.size == tensor.n_elements, tensor.name
            out.write(np.ascontiguousarray(values, dtype="<f4").tobytes())


def write_tiny_llama(path):
    rng = np.random.default_rng(SEED + 3)
    writer = gguf.GGUFWriter(str(path), arch="llama")
    writer.add_name("tiny-llama-test")
    writer.add_context_length(256)
    writer.add_embedding_length(64)
    writer.add_block_count(2)
    writer.add_feed_forward_length(128)
    writer.add_head_count(4)
    writer.add_head_count_kv(2)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_freq_base(100000.0)

    tokens = ["<unk>", "<s>", "</s>", "<pad>"] + [f"tok{i}" for i in range(27)] + ["\u00e9t\u00e9"]
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores([-float(i) * 0.25 for i in range(len(tokens))])
    writer.add_token_types([3, 3, 3, 3] + [1] * (len(tokens) - 4))
    writer.add_token_merges(["t o", "to k", "\u00e9 t"])
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_chat_template("{% for m in messages %}{{ m['content'] }}\n{% endfor %}")

    # One value of every type, for the metadata round-trip test.
    writer.add_key_value("test.u8", 200, VT.UINT8)
    writer.add_key_value("test.i8", -100, VT.INT8)
    writer.add_key_value("test.u16", 60000, VT.UINT16)
    writer.add_key_value("test.i16", -30000, VT.INT16)
    writer.add_key_value("test.u32", 4000000000, VT.UINT32)
    writer.add_key_value("test.i32", -2000000000, VT.INT32)
    writer.add_key_value("test.f32", 0.15625, VT.FLOAT32)
    writer.add_key_value("test.bool", True, VT.BOOL)
    writer.add_key_value("test.string", "h\u00e9llo w\u00f6rld", VT.STRING)
    writer.add_key_value("test.empty_string", "", VT.STRING)
    writer.add_key_value("test.u64", 2**40 + 5, VT.UINT64)
    writer.add_key_value("test.i64", -(2**40), VT.INT64)
    writer.add_key_value("test.f64", 3.141592653589793, VT.FLOAT64)
    writer.add_key_value("test.array_u16", [1, 65535], VT.ARRAY, sub_type=VT.UINT16)
    writer.add_key_value("test.array_i64", [-(2**40), 0, 7], VT.ARRAY, sub_type=VT.INT64)
    writer.add_key_value("test.array_u64_big", [1, 2**63 + 1], VT.ARRAY, sub_type=VT.UINT64)
    writer.add_key_value("test.array_f64", [0.1, -2.5], VT.ARRAY, sub_type=VT.FLOAT64)
    writer.add_key_value("test.array_bool", [True, False, True], VT.ARRAY, sub_type=VT.BOOL)

    embeddings = (rng.standard_normal(size=(len(tokens), 64)) * 0.02).astype(np.float32)
    writer.add_tensor("token_embd.weight", embeddings)
    writer.add_tensor("output_norm.weight", np.ones(64, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def main():
    OUT.mkdir(parents=True, exist_ok=True)
    write_types(OUT / "types.gguf")
    write_expected(OUT / "types.gguf", OUT / "types.expected.f32")
    write_tiny_llama(OUT / "tiny_llama.gguf")
    total = sum(p.stat().st_size for p in OUT.iterdir())
    print(f"wrote {OUT} ({total} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
