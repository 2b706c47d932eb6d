#!/usr/bin/env python3
"""Write tests/fixtures/tokenizers/: a test corpus and what Hugging Face `tokenizers`
(through transformers) makes of it, for checking the C tokenizer (tests/test_tokenizer.c).

Usage (developers only; CI never runs Python, the output is committed):

    .venv-tools/bin/python tools/make_tokenizer_fixtures.py [--gguf models/SmolLM2-135M-Instruct.Q4_1.gguf]

Deterministic: every string comes from random.Random with fixed seeds, the small
tokenizers are trained by `tokenizers` on text generated the same way (training is
deterministic for a given input), and nothing depends on the clock or the machine.

What is written:
  corpus.jsonl          one {"hex": ...} per line: the raw bytes of each test string
                        (hex, so that invalid UTF-8 survives JSON). At least 2,000
                        strings: prose, code, numbers, runs of spaces/tabs/newlines,
                        Unicode spaces, emoji (ZWJ sequences, flags, skin tones), CJK,
                        Arabic/Hebrew/Devanagari/Thai, combining marks, special-token
                        strings inside text, and byte sequences that are not UTF-8.
  <name>/tokenizer.json, tokenizer_config.json   the small trained tokenizers
  <name>/expected.jsonl one line per corpus string:
                        {"ids": encode(text, add_special_tokens=False),
                         "text": decode(ids), "text_skip": decode(ids, skip_special_tokens=True)}
                        where "text" is left out when it equals the input text (after the
                        U+FFFD replacement below) and "text_skip" when it equals "text";
                        for the first 200 strings also "ids_special" (add_special_tokens=True).
  smollm2_expected.jsonl  the same for SmolLM2-135M-Instruct's tokenizer, which
                        transformers builds from the GGUF file, with SmolLM2's own
                        pre-tokenizer (see smollm2_reference(): transformers' GGUF loader
                        ignores tokenizer.ggml.pre = "smollm"). The GGUF itself is not
                        committed: the test loads models/SmolLM2-135M-Instruct.Q4_1.gguf.
  bad/*.gguf            GGUFs with damaged tokenizer metadata (tests/cli/tokenizer_bad_input.sh).
  spm_small.gguf        the spm_small vocabulary as a llama.cpp GGUF (tokens, scores,
                        token types, no merges), and spm_gguf_expected.jsonl: what
                        transformers makes of that GGUF (merges derived from scores).

Invalid UTF-8 policy (the C tokenizer's, tested here): HF tokenizers only take str, so a
byte string is first decoded with bytes.decode('utf-8', errors='replace') -- each maximal
ill-formed subpart becomes U+FFFD -- and that string is tokenized. The C encoder does the
same replacement itself, so it is given the raw bytes.

The tokenizers:
  bytelevel_small  byte-level BPE, vocab ~1000, Llama-3 style: Split(Llama-3 regex) +
                   ByteLevel(use_regex=false), ignore_merges, special tokens
                   <|begin_of_text|> (BOS, added by the post-processor), <|end_of_text|>,
                   <|im_start|>, <|im_end|>, and a non-special added token " <tool>"-like
                   one with lstrip/rstrip.
  spm_small        sentencepiece-style BPE, vocab ~1000, Llama-2 style: normalizer
                   Prepend("▁") + Replace(" ", "▁"), byte fallback with <0x00>..<0xFF>
                   in the vocabulary, <unk> (fused), decoder Replace + ByteFallback +
                   Fuse + Strip, post-processor "<s> $A".
"""
import argparse
import json
import os
import random
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
OUT = os.path.join(ROOT, "tests", "fixtures", "tokenizers")

WORDS = ("the of and to in is was for on that with as by at from his her it an were are which this be or "
         "has had not but what all when there can been one would who more will their if out so up said "
         "about into than them only other new some could time these two may then do first any my now "
         "such like our over man me even most made after also did many before must through back years "
         "where much your way well down should because each just those people how too little state good "
         "very make world still own see men work long get here between both life being under never day "
         "same another know while last might us great old year off come since against go came right used "
         "take three tokenizer merges vocabulary reinforcement learning human feedback macro actions policy "
         "gradient reward model critic advantage transformer attention").split()
CODE = [
    "def f(x):\n    return x * 2\n",
    "int main(void) {\n\tprintf(\"%d\\n\", 42);\n\treturn 0;\n}\n",
    "for (int i = 0; i < n; i++) sum += a[i];",
    "if x != None and len(x) > 3:\n        print(x[::-1])",
    "const std::vector<int>& v = get();  // comment",
    "SELECT name, COUNT(*) FROM users WHERE age >= 18 GROUP BY name;",
    "<div class=\"row\"><a href='https://example.com/?q=1&b=2'>link</a></div>",
    "    \t  indented\twith\ttabs   \n\n\n",
    "x=[1,2,3];y={'a':1,\"b\":[True,False,None]}",
    "fn main() -> Result<(), Box<dyn Error>> { Ok(()) }",
    "$ ls -la /usr/local/bin | grep -E '^d' > out.txt 2>&1",
    "    }\n  }\n}\n\n",
    "#include <stdio.h>\r\n#define MAX(a, b) ((a) > (b) ? (a) : (b))\r\n",
]
EMOJI = ["😀", "👍🏽", "👨‍👩‍👧‍👦", "🏳️‍🌈", "🇫🇷", "🇯🇵", "❤️", "🧑🏿‍💻", "👩‍❤️‍💋‍👨", "🤖", "✨", "🦀", "1️⃣", "☕", "🫠"]
SCRIPTS = [
    "日本語のテキストです。", "中文分词测试，标点符号！", "한국어 문장입니다.", "カタカナとひらがな",
    "مرحبا بالعالم", "שלום עולם", "नमस्ते दुनिया", "สวัสดีชาวโลก", "Привет, мир!", "Γειά σου Κόσμε",
    "Xin chào thế giới", "ქართული ენა", "Հայերեն", "ᠮᠣᠩᠭᠣᠯ", "ꦗꦮ", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢", "𐍈𐌰𐌽𐍃",
]
ACCENTS = ["café", "cafe\u0301", "naïve", "nai\u0308ve", "Ångström", "A\u030angstro\u0308m", "ñ", "n\u0303",
           "Z̤͔ͧ̑̓ä͖̭̈̇lͮ̒ͫǫ̗", "e\u0301\u0302\u0303", "ﬁ ligature", "Ⅻ", "½ ¾", "x²+y³", "١٢٣ ٤٥", "１２３"]
SPECIALS = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<s>", "</s>", "<unk>", "<|begin_of_text|>",
            "<|end_of_text|>", "<tool>", "<|im_start", "im_end|>", "<0x41>", "<repo_name>", "<file_sep>"]
SPACES = [" ", "  ", "   ", "\t", "\n", "\r\n", "\n\n", " \n ", "\t\t", "\u00a0", "\u2003", "\u3000", "\u180e",
          "\u200b", "\u0085", "\ufeff", "\u2028", "\u000b", "\u000c", "\u001f"]
INVALID = [b"\xff", b"\xfe\xff", b"\xc0\xaf", b"\xe0\x80\xaf", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\xf5",
           b"\x80", b"\xbf\xbf", b"\xe2\x82", b"\xf0\x9f\x98", b"\xc3", b"\xe2\x28\xa1", b"\xf0\x28\x8c\x28",
           b"\xf8\x88\x80\x80\x80", b"\xc2"]


def number(rng):
    kind = rng.randrange(7)
    if kind == 0:
        return str(rng.randrange(10 ** rng.randrange(1, 12)))
    if kind == 1:
        return f"{rng.uniform(-1e4, 1e4):.{rng.randrange(0, 6)}f}"
    if kind == 2:
        return f"{rng.randrange(1, 10)},{rng.randrange(1000):03d},{rng.randrange(1000):03d}.{rng.randrange(100):02d}"
    if kind == 3:
        return f"{rng.randrange(1900, 2100)}-{rng.randrange(1, 13):02d}-{rng.randrange(1, 29):02d}"
    if kind == 4:
        return f"+1 ({rng.randrange(100, 999)}) {rng.randrange(100, 999)}-{rng.randrange(1000, 9999)}"
    if kind == 5:
        return "".join(rng.choice("0123456789") for _ in range(rng.randrange(13, 40)))
    return f"{rng.randrange(100)}%"


def sentence(rng):
    words = [rng.choice(WORDS) for _ in range(rng.randrange(3, 14))]
    if rng.random() < 0.3:
        words[0] = words[0].capitalize()
    if rng.random() < 0.2:
        words[rng.randrange(len(words))] = rng.choice(["don't", "I'm", "it's", "we'll", "they've", "you're", "I'D",
                                                       "He'S", "o'clock", "rock'n'roll"])
    return " ".join(words) + rng.choice([".", "!", "?", ",", ";", ":", "...", " .", ""])


def random_unicode(rng):
    blocks = [(0x20, 0x7e), (0xa0, 0x24f), (0x370, 0x3ff), (0x400, 0x4ff), (0x590, 0x6ff), (0x900, 0x97f),
              (0xe00, 0xe7f), (0x1100, 0x11ff), (0x2000, 0x206f), (0x2190, 0x23ff), (0x3040, 0x30ff),
              (0x4e00, 0x4fff), (0xac00, 0xad00), (0x1f300, 0x1f6ff), (0x1d400, 0x1d4ff), (0x10000, 0x1007f)]
    out = []
    for _ in range(rng.randrange(1, 25)):
        lo, hi = rng.choice(blocks)
        cp = rng.randrange(lo, hi + 1)
        if 0xd800 <= cp <= 0xdfff:
            continue
        out.append(chr(cp))
    return "".join(out)


def make_string(rng, kind):
    """One test string as bytes."""
    if kind == "prose":
        return " ".join(sentence(rng) for _ in range(rng.randrange(1, 4))).encode()
    if kind == "code":
        return rng.choice(CODE).encode()
    if kind == "numbers":
        return " ".join(number(rng) if rng.random() < 0.6 else rng.choice(WORDS)
                        for _ in range(rng.randrange(1, 8))).encode()
    if kind == "spaces":
        parts = []
        for _ in range(rng.randrange(1, 8)):
            parts.append(rng.choice(SPACES) * rng.randrange(1, 4))
            if rng.random() < 0.7:
                parts.append(rng.choice(WORDS + ["!", "?", "'s", "42", "日本"]))
        return "".join(parts).encode()
    if kind == "emoji":
        return "".join(rng.choice(EMOJI) if rng.random() < 0.5 else rng.choice([" ", "", "hi", " ok ", "\n"])
                       for _ in range(rng.randrange(1, 8))).encode()
    if kind == "scripts":
        parts = [rng.choice(SCRIPTS) for _ in range(rng.randrange(1, 4))]
        if rng.random() < 0.5:
            parts.insert(rng.randrange(len(parts) + 1), sentence(rng))
        return rng.choice([" ", "", "\n", " - "]).join(parts).encode()
    if kind == "accents":
        return " ".join(rng.choice(ACCENTS + WORDS) for _ in range(rng.randrange(1, 7))).encode()
    if kind == "specials":
        parts = []
        for _ in range(rng.randrange(1, 7)):
            parts.append(rng.choice(SPECIALS) if rng.random() < 0.5 else rng.choice(
                [sentence(rng), "user\n", "assistant\n", " ", "  ", "\n", "x", ""]))
        return "".join(parts).encode()
    if kind == "invalid":
        parts = []
        for _ in range(rng.randrange(1, 6)):
            r = rng.random()
            if r < 0.4:
                parts.append(rng.choice(INVALID))
            elif r < 0.6:
                parts.append(bytes(rng.randrange(256) for _ in range(rng.randrange(1, 6))))
            else:
                parts.append(rng.choice([sentence(rng), "é", "日本", "😀", " "]).encode())
        return b"".join(parts)
    if kind == "unicode":
        return random_unicode(rng).encode()
    if kind == "long":
        unit = rng.choice(["a", " ", "ab", "\n", "=", "é", "日", "😀", "\t", "0", " a", "-"])
        return (unit * rng.randrange(20, 300)).encode()
    raise ValueError(kind)


KINDS = ["prose", "code", "numbers", "spaces", "emoji", "scripts", "accents", "specials", "invalid", "unicode", "long"]


def make_corpus(seed, count):
    rng = random.Random(seed)
    corpus = [b"", b" ", b"\n", b"a", b"Hello world", b"Hello, world! 123", "<|im_start|>user\nHi<|im_end|>\n".encode(),
              b"\x00", b"tab\there", b"  leading and trailing  "]
    while len(corpus) < count:
        corpus.append(make_string(rng, KINDS[len(corpus) % len(KINDS)]))
    return corpus


def text_of(raw):
    return raw.decode("utf-8", errors="replace")


def write_expected(path, hf, corpus):
    with open(path, "w") as f:
        for i, raw in enumerate(corpus):
            text = text_of(raw)
            ids = hf.encode(text, add_special_tokens=False)
            row = {"ids": ids}
            # To keep the files small, a decode equal to the input text (or, skipping special
            # tokens, equal to the plain decode) is left out.
            decoded, decoded_skip = hf.decode(ids, skip_special_tokens=False), hf.decode(ids, skip_special_tokens=True)
            if decoded != text:
                row["text"] = decoded
            if decoded_skip != decoded:
                row["text_skip"] = decoded_skip
            if i < 200:
                row["ids_special"] = hf.encode(text, add_special_tokens=True)
            f.write(json.dumps(row, ensure_ascii=False, separators=(",", ":")) + "\n")


def train_bytelevel(texts, out_dir):
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers, AddedToken
    llama3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
              r"|\s*[\r\n]+|\s+(?!\S)|\s+")
    tok = Tokenizer(models.BPE(ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(llama3), behavior="isolated"),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|im_start|>", "<|im_end|>"]
    trainer = trainers.BpeTrainer(vocab_size=1000, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer)
    tok.add_tokens([AddedToken("<tool>", lstrip=True, rstrip=True, normalized=False, special=False)])
    bos = tok.token_to_id("<|begin_of_text|>")
    tok.post_processor = processors.TemplateProcessing(single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A $B",
                                                       special_tokens=[("<|begin_of_text|>", bos)])
    os.makedirs(out_dir, exist_ok=True)
    tok.save(os.path.join(out_dir, "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<|begin_of_text|>",
              "eos_token": "<|end_of_text|>", "pad_token": "<|end_of_text|>", "clean_up_tokenization_spaces": False,
              "chat_template": "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"}
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w") as f:
        json.dump(config, f, indent=2)


def train_spm(texts, out_dir):
    from tokenizers import Tokenizer, decoders, models, normalizers, processors, trainers
    byte_tokens = [f"<0x{i:02X}>" for i in range(256)]
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    # The alphabet: the 150 most frequent characters (ties by code point), so that rarer
    # ones go through byte fallback. Given explicitly, because the trainer's own cut
    # (limit_alphabet) breaks ties in hash order, which changes from run to run.
    counts = {}
    for text in texts:
        for ch in text.replace(" ", "▁"):
            counts[ch] = counts.get(ch, 0) + 1
    alphabet = sorted(sorted(counts), key=lambda ch: -counts[ch])[:150]
    trainer = trainers.BpeTrainer(vocab_size=1000, special_tokens=["<unk>", "<s>", "</s>"] + byte_tokens,
                                  initial_alphabet=alphabet, limit_alphabet=len(alphabet), show_progress=False)
    tok.train_from_iterator(texts, trainer)
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A $B",
                                                       special_tokens=[("<s>", tok.token_to_id("<s>"))])
    # As in Llama-2's tokenizer.json, the byte tokens are vocabulary entries, not added tokens.
    spec = json.loads(tok.to_str())
    spec["added_tokens"] = [t for t in spec["added_tokens"] if t["content"] not in byte_tokens]
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "tokenizer.json"), "w") as f:
        json.dump(spec, f, indent=2, ensure_ascii=False)
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
              "unk_token": "<unk>", "clean_up_tokenization_spaces": False}
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w") as f:
        json.dump(config, f, indent=2)


def write_spm_gguf(spm_dir, path):
    """spm_small's vocabulary as llama.cpp writes a sentencepiece model: tokens, scores
    (higher = merged earlier: minus the merge rank that makes the token), token types."""
    import gguf
    spec = json.load(open(os.path.join(spm_dir, "tokenizer.json")))
    vocab = spec["model"]["vocab"]
    tokens = [None] * len(vocab)
    for t, i in vocab.items():
        tokens[i] = t
    rank = {}
    for r, m in enumerate(spec["model"]["merges"]):
        left, right = m if isinstance(m, list) else m.split(" ")
        rank.setdefault(left + right, r)
    scores, types = [], []
    for i, t in enumerate(tokens):
        if t in ("<s>", "</s>"):
            scores.append(0.0), types.append(3)
        elif t == "<unk>":
            scores.append(0.0), types.append(2)
        elif t.startswith("<0x") and len(t) == 6:
            scores.append(0.0), types.append(6)
        else:
            scores.append(-float(rank.get(t, 10 ** 6 + i))), types.append(1)
    w = gguf.GGUFWriter(path, "llama")
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(vocab["<s>"])
    w.add_eos_token_id(vocab["</s>"])
    w.add_unk_token_id(vocab["<unk>"])
    w.add_add_bos_token(True)
    w.add_context_length(64)
    w.add_embedding_length(8)
    w.add_block_count(1)
    w.add_feed_forward_length(16)
    w.add_head_count(2)
    w.add_layer_norm_rms_eps(1e-5)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def smollm2_reference(gguf_path):
    """SmolLM2's tokenizer: transformers builds it from the GGUF (vocabulary, merges, special
    tokens), but as a plain GPT-2 ByteLevel pre-tokenizer, since it has no entry for
    tokenizer.ggml.pre = "smollm". SmolLM2's own tokenizer.json (and llama.cpp for "smollm")
    splits digits first: Sequence[Digits(individual_digits=True), ByteLevel]. That differs
    from the plain GPT-2 regex on a few strings (whitespace or a numeric character next to
    a digit), so the reference is the GGUF tokenizer with SmolLM2's own pre-tokenizer."""
    from tokenizers import pre_tokenizers
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(os.path.dirname(os.path.abspath(gguf_path)),
                                        gguf_file=os.path.basename(gguf_path))
    tok.backend_tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)])
    return tok


def write_bad_ggufs():
    """Tiny GGUFs with damaged tokenizer metadata, for tests/cli/tokenizer_bad_input.sh."""
    import gguf

    def base(path, model):
        w = gguf.GGUFWriter(path, "llama")
        w.add_tokenizer_model(model)
        return w

    def finish(w):
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()

    bad = os.path.join(OUT, "bad")
    os.makedirs(bad, exist_ok=True)
    w = base(os.path.join(bad, "unknown_pre.gguf"), "gpt2")  # a pre-tokenizer nobody knows
    w.add_tokenizer_pre("frobnicate")
    w.add_token_list(["a", "b", "ab"])
    w.add_token_merges(["a b"])
    finish(w)
    w = base(os.path.join(bad, "tokens_wrong_type.gguf"), "llama")  # tokens as integers
    w.add_array("tokenizer.ggml.tokens", [1, 2, 3])
    finish(w)
    w = base(os.path.join(bad, "no_merges.gguf"), "gpt2")  # byte-level without merges
    w.add_tokenizer_pre("default")
    w.add_token_list(["a", "b", "ab"])
    finish(w)
    w = base(os.path.join(bad, "unknown_model.gguf"), "rwkv")  # a tokenizer kind marlhf lacks
    w.add_token_list(["a", "b", "ab"])
    finish(w)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--gguf", default=os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf"))
    args = parser.parse_args()
    from transformers import AutoTokenizer

    corpus = make_corpus(seed=20250101, count=2200)
    training = [text_of(s) for s in make_corpus(seed=7, count=4000)] + [text_of(s) for s in corpus]
    os.makedirs(OUT, exist_ok=True)
    with open(os.path.join(OUT, "corpus.jsonl"), "w") as f:
        for raw in corpus:
            f.write(json.dumps({"hex": raw.hex()}, separators=(",", ":")) + "\n")

    train_bytelevel(training, os.path.join(OUT, "bytelevel_small"))
    train_spm(training, os.path.join(OUT, "spm_small"))
    for name in ("bytelevel_small", "spm_small"):
        hf = AutoTokenizer.from_pretrained(os.path.join(OUT, name))
        write_expected(os.path.join(OUT, name, "expected.jsonl"), hf, corpus)

    smol = smollm2_reference(args.gguf)
    write_expected(os.path.join(OUT, "smollm2_expected.jsonl"), smol, corpus)
    plain = AutoTokenizer.from_pretrained(os.path.dirname(os.path.abspath(args.gguf)),
                                          gguf_file=os.path.basename(args.gguf))
    differ = sum(plain.encode(text_of(r), add_special_tokens=False) != smol.encode(text_of(r), add_special_tokens=False)
                 for r in corpus)
    print(f"smollm2: transformers' plain GGUF loading (no Digits split) differs on {differ} of {len(corpus)} strings",
          file=sys.stderr)

    gguf_path = os.path.join(OUT, "spm_small.gguf")
    write_spm_gguf(os.path.join(OUT, "spm_small"), gguf_path)
    spm_gguf = AutoTokenizer.from_pretrained(OUT, gguf_file="spm_small.gguf")
    write_expected(os.path.join(OUT, "spm_gguf_expected.jsonl"), spm_gguf, corpus)
    write_bad_ggufs()
    print(f"wrote {len(corpus)} strings and 4 expectation files to {OUT}", file=sys.stderr)


if __name__ == "__main__":
    main()
