"""Developer check: the adapter a marlhf LoRA run saves loads in PEFT onto the base model
and computes what the merged model.safetensors beside it computes.

    .venv-tools/bin/python tools/check_lora_export.py --base BASE_DIR --run RUN_DIR/final

  1. PeftModel.from_pretrained(base, RUN/final/adapter) (adapter_model.safetensors +
     adapter_config.json, as marlhf wrote them);
  2. transformers on RUN/final (the merged weights marlhf wrote);
  3. both on a few random sequences: prints the largest |logit difference| and fails
     above --tolerance.

An adapter with per-module ranks or alphas (rank_pattern, alpha_pattern) must give PEFT at
least two (rank, alpha) pairs; the logits check then covers each module's scale.

A DoRA adapter (use_dora, --use-dora) must come back as DoRA: the check fails unless PEFT
built a magnitude vector for every adapted module and read marlhf's values into them (a
PEFT that ignored them would start each at the row norm of W + s B A, and the merged
weights, m / ||W + s B A|| (W + s B A), would not match).
"""
import argparse
import json
import sys

import peft
import torch
import transformers


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--base", required=True, help="the model the run started from")
    parser.add_argument("--run", required=True, help="the run's final/ (or checkpoint) folder")
    parser.add_argument("--tolerance", type=float, default=1e-4)
    args = parser.parse_args()
    base = transformers.AutoModelForCausalLM.from_pretrained(args.base, attn_implementation="eager").float().eval()
    adapted = peft.PeftModel.from_pretrained(base, args.run + "/adapter").eval()
    dora = json.load(open(args.run + "/adapter/adapter_config.json")).get("use_dora", False)
    magnitudes = [n for n, _ in adapted.named_parameters() if "lora_magnitude_vector" in n]
    adapted_modules = [n for n, _ in adapted.named_parameters() if ".lora_A." in n]
    if dora and len(magnitudes) != len(adapted_modules):
        sys.exit(f"{args.run}: use_dora, but PEFT built {len(magnitudes)} magnitude vectors for "
                 f"{len(adapted_modules)} adapted modules")
    # Per-module ranks and alphas (rank_pattern, alpha_pattern): PEFT resolved them itself from
    # the saved config; each module's A must have that rank (PEFT refuses a shape mismatch
    # when loading, so this lists what it built).
    config = json.load(open(args.run + "/adapter/adapter_config.json"))
    if config.get("rank_pattern") or config.get("alpha_pattern"):
        ranks = {}
        for name, module in adapted.named_modules():
            if hasattr(module, "r") and "default" in getattr(module, "r", {}):
                ranks[(module.r["default"], module.lora_alpha["default"])] = ranks.get(
                    (module.r["default"], module.lora_alpha["default"]), 0) + 1
        if len(ranks) < 2:
            sys.exit(f"{args.run}: rank_pattern / alpha_pattern given, but PEFT built one (rank, alpha): {ranks}")
        print(f"{args.run}: PEFT's modules by (rank, alpha): {dict(sorted(ranks.items()))}")
    merged = transformers.AutoModelForCausalLM.from_pretrained(args.run, attn_implementation="eager").float().eval()
    vocab = merged.config.vocab_size
    ids = torch.randint(0, vocab, (3, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        a = adapted(input_ids=ids).logits
        m = merged(input_ids=ids).logits
    with adapted.disable_adapter(), torch.no_grad():
        plain = adapted(input_ids=ids).logits
    diff = float((a - m).abs().max())
    moved = float((a - plain).abs().max())
    print(f"{args.run}: PEFT {'DoRA ' if dora else ''}adapter vs merged weights: max |logit diff| {diff:.2e}; "
          f"the adapter moves logits by up to {moved:.2e}")
    if diff > args.tolerance or moved <= 10 * args.tolerance:
        sys.exit(1)


if __name__ == "__main__":
    main()
