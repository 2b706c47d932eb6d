"""Developer check: a GGUF file written by `marlhf convert SRC OUT.gguf` runs in llama.cpp
(llama-cpp-python) with the log-probs marlhf computes on SRC, and llama.cpp's tokenizer
gives marlhf's ids.

    .venv-tools/bin/python tools/check_gguf_export.py [--marlhf build/marlhf] [--outtype f32]
        [--lora-adapter DIR] SRC...

For each SRC (a Hugging Face folder or a GGUF file):
  1. marlhf convert SRC OUT.gguf --outtype T
  2. marlhf tokenize on a few texts, against llama.cpp's tokenize() of the GGUF;
  3. marlhf logprobs on SRC, against llama.cpp's logits (logits_all) on the GGUF:
     prints the largest |log-prob difference| and fails above --tolerance.
With --random-families TOKENIZER_DIR, small random GPT-2, Qwen2, Gemma and Gemma 2 models
(weights from transformers' init, norms and biases perturbed; the Gemma 2's initialised 10x
wider so that its soft caps of 2 and 5 bend its scores and logits) with that folder's
tokenizer are made in a temporary folder and checked too: every architecture's layout in
llama.cpp.
With --lora-adapter DIR (a LoRA adapter trained on SRC) the adapter is also written alone
(marlhf convert SRC A.gguf --lora-adapter DIR --adapter-only) and llama.cpp runs the base
GGUF with it (lora_path), against marlhf logprobs --model SRC --lora-adapter DIR.

With --outtype f32 the two agree to ~1e-5 (SmolLM2-135M). With f16 or q8_0 the tolerance
must be loose: llama.cpp computes with the stored precision and, for quantized matrices,
quantizes the activations too (on llama.cpp's own SmolLM2 Q4_1 file, llama.cpp and marlhf
already differ by up to 0.38 in a log-prob for that reason).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
from llama_cpp import Llama

TEXTS = ["Hello, world! It's 2026.", "  leading spaces and\ttabs\nnew lines 12345",
         "Émilie's café — naïve résumé", "def f(x):\n    return x ** 2  # square"]


def run(cmd, stdin=None):
    return subprocess.run(cmd, check=True, capture_output=True, text=True, input=stdin).stdout


def random_family_models(tokenizer_dir, tmp):
    import shutil

    import torch
    from transformers import (Gemma2Config, Gemma2ForCausalLM, GemmaConfig, GemmaForCausalLM, GPT2Config,
                              GPT2LMHeadModel, Qwen2Config, Qwen2ForCausalLM)
    with open(os.path.join(tokenizer_dir, "tokenizer.json")) as f:
        tok = json.load(f)
    vocab = 1 + max(list(tok["model"]["vocab"].values()) + [a["id"] for a in tok.get("added_tokens", [])])
    torch.manual_seed(0)
    small = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, max_position_embeddings=256)
    models = {
        "gpt2": GPT2LMHeadModel(GPT2Config(vocab_size=vocab, n_positions=256, n_embd=64, n_layer=2, n_head=4,
                                           bos_token_id=None, eos_token_id=None)),
        "qwen2": Qwen2ForCausalLM(Qwen2Config(vocab_size=vocab, tie_word_embeddings=False, **small)),
        "gemma": GemmaForCausalLM(GemmaConfig(vocab_size=vocab, head_dim=32, **small)),
        # query_pre_attn_scalar = head_dim: what llama.cpp infers for any shape but the 27B's.
        "gemma2": Gemma2ForCausalLM(Gemma2Config(vocab_size=vocab, head_dim=32, query_pre_attn_scalar=32,
                                                 attn_logit_softcapping=2.0, final_logit_softcapping=5.0,
                                                 sliding_window=256, initializer_range=0.2, **small)),
    }
    folders = []
    for name, model in models.items():
        with torch.no_grad():
            for pname, p in model.named_parameters():
                if "norm" in pname or "ln_" in pname or "bias" in pname:
                    p.add_(0.1 * torch.randn_like(p))
        folder = os.path.join(tmp, "random-" + name)
        model.float().save_pretrained(folder)
        for f in ("tokenizer.json", "tokenizer_config.json"):
            if os.path.exists(os.path.join(tokenizer_dir, f)):
                shutil.copy(os.path.join(tokenizer_dir, f), folder)
        folders.append(folder)
    return folders


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--marlhf", default="build/marlhf")
    ap.add_argument("--outtype", default="f32")
    ap.add_argument("--tolerance", type=float, default=1e-3)
    ap.add_argument("--lora-adapter")
    ap.add_argument("--random-families", metavar="TOKENIZER_DIR")
    ap.add_argument("sources", nargs="*")
    args = ap.parse_args()
    failed = False
    with tempfile.TemporaryDirectory() as tmp:
        sources = list(args.sources)
        if args.random_families:
            sources += random_family_models(args.random_families, tmp)
        for src in sources:
            out = os.path.join(tmp, os.path.basename(src.rstrip("/")) + ".gguf")
            run([args.marlhf, "convert", src, out, "--outtype", args.outtype])
            adapter = []
            lora = {}
            if args.lora_adapter:
                lora_path = os.path.join(tmp, "adapter.gguf")
                run([args.marlhf, "convert", src, lora_path, "--outtype", args.outtype, "--lora-adapter",
                     args.lora_adapter, "--adapter-only"])
                adapter = ["--lora-adapter", args.lora_adapter]
                lora = {"lora_path": lora_path}
            # f32 K/V cache: llama.cpp keeps it in f16 by default, ~1e-3 off over 30 layers.
            llm = Llama(model_path=out, logits_all=True, n_ctx=256, verbose=False, n_threads=2, type_k=0, type_v=0,
                        **lora)
            texts = os.path.join(tmp, "texts.jsonl")
            with open(texts, "w") as f:
                for t in TEXTS:
                    f.write(json.dumps({"text": t}) + "\n")
            ours = [json.loads(line)["ids"] for line in run([args.marlhf, "tokenize", "--model", src, "--input", texts]).splitlines()]
            theirs = [llm.tokenize(t.encode(), add_bos=False, special=False) for t in TEXTS]
            same_ids = ours == theirs
            ids = ours[0] + ours[3]
            ids_file = os.path.join(tmp, "ids.jsonl")
            with open(ids_file, "w") as f:
                f.write(json.dumps({"ids": ids}) + "\n")
            logp = json.loads(run([args.marlhf, "logprobs", "--model", src, "--input", ids_file] + adapter)
                              .splitlines()[0])["logprobs"]
            llm.reset()
            llm.eval(ids)
            logits = np.array(llm.scores[: len(ids)], dtype=np.float64)
            logits -= logits.max(axis=1, keepdims=True)
            lsm = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
            theirs_logp = [lsm[t, ids[t + 1]] for t in range(len(ids) - 1)]
            diff = max(abs(a - b) for a, b in zip(logp, theirs_logp))
            ok = same_ids and diff <= args.tolerance
            failed |= not ok
            print(f"{src}{' + LoRA adapter' if adapter else ''} -> {args.outtype} GGUF: tokenizer ids {'identical' if same_ids else 'DIFFER'}, "
                  f"max |log-prob diff| vs llama.cpp {diff:.2e} over {len(ids) - 1} tokens {'ok' if ok else 'FAIL'}")
            if not same_ids:
                for t, a, b in zip(TEXTS, ours, theirs):
                    if a != b:
                        print(f"  {t!r}: marlhf {a} llama.cpp {b}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
