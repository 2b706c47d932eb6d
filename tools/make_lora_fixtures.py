#!/usr/bin/env python3
"""Write the LoRA reference fixtures: PEFT adapters on the tiny models, with the logits,
loss and adapter gradients PEFT computes (developers only; CI never runs Python).

    .venv-tools/bin/python tools/make_lora_fixtures.py [--models tests/fixtures/models]

For each of llama (GQA), qwen2 (q/k/v biases) and gemma (GeGLU, tied, (1+w) norms) this
wraps the fixture model of tools/make_model_fixtures.py with peft.get_peft_model
(r = 4, lora_alpha = 8, so the scale is 2; all seven linear modules; no dropout), sets
every lora_A and lora_B to seeded random values (PEFT starts B at zero, which would hide
bugs in B's use), and saves the adapter with save_pretrained into <model>/lora/:
adapter_model.safetensors and adapter_config.json exactly as PEFT writes them. Then, in
float64 with no float32 casts (float64_everywhere from make_model_fixtures.py), on the
fixture's own batch (input_ids, lengths of <model>/reference.safetensors) it computes the
logits, the causal-LM loss and the loss's gradient with respect to every adapter tensor,
into <model>/lora/reference.safetensors:

    logits                 f32 [3, 16, 128]
    loss                   f32 [1]
    grad.<adapter name>    f32, the name as in adapter_model.safetensors
                           (base_model.model.model.layers.L.<module>.lora_A.weight ...)

It checks that the base weights get no gradient and that merging the adapter
(merge_and_unload) gives the same logits. Then the same for llama with rsLoRA
(use_rslora=True: the scale is alpha / sqrt(r) = 4) into llama/lora_rslora/.
"""
import argparse
import copy
import os
import sys

import torch
from safetensors.torch import load_file, save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_model_fixtures as base  # noqa: E402

import peft  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

MODULES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
RANK, ALPHA = 4, 8


def make_one(models_dir, name, seed, rslora=False):
    folder = os.path.join(models_dir, name)
    out = os.path.join(folder, "lora_rslora" if rslora else "lora")
    os.makedirs(out, exist_ok=True)
    ref = load_file(os.path.join(folder, "reference.safetensors"))
    ids, lengths = ref["input_ids"], ref["lengths"]
    mask = (torch.arange(ids.shape[1])[None, :] < lengths[:, None]).long()

    model32 = AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager").float().eval()
    config = peft.LoraConfig(r=RANK, lora_alpha=ALPHA, lora_dropout=0.0, target_modules=MODULES,
                             task_type="CAUSAL_LM", use_rslora=rslora)
    lora32 = peft.get_peft_model(model32, config)
    g = torch.Generator().manual_seed(5000 + seed)
    with torch.no_grad():
        for pname, p in lora32.named_parameters():
            if "lora_" in pname:
                p.copy_(0.2 * torch.randn(p.shape, generator=g))
    lora32.save_pretrained(out, safe_serialization=True)
    os.remove(os.path.join(out, "README.md"))  # PEFT's model card template
    saved = load_file(os.path.join(out, "adapter_model.safetensors"))

    lora64 = copy.deepcopy(lora32).double()
    base.exact_rope(lora64)
    with base.float64_everywhere():
        lora64.zero_grad(set_to_none=True)
        result = lora64(input_ids=ids, attention_mask=mask, labels=base.labels_of(ids, mask))
        result.loss.backward()
    grads = {}
    for pname, p in lora64.named_parameters():
        if "lora_" in pname:
            # save_pretrained drops the adapter's name ("default") from the tensor names
            grads[pname.replace(".default", "")] = p.grad.detach().clone()
        else:
            assert p.grad is None, f"{name}: frozen {pname} got a gradient"
    assert set(grads) == set(saved), set(grads) ^ set(saved)

    merged = copy.deepcopy(lora32).merge_and_unload()
    merged_logits = merged(input_ids=ids, attention_mask=mask).logits
    valid = mask.bool()
    err = float((merged_logits.double() - result.logits)[valid].abs().max())
    assert err < 1e-4, f"{name}: merged logits differ by {err}"

    tensors = {"logits": result.logits, "loss": result.loss.reshape(1)}
    tensors.update({f"grad.{n}": v for n, v in grads.items()})
    tensors = {k: v.float().contiguous() for k, v in tensors.items()}
    save_file(tensors, os.path.join(out, "reference.safetensors"))
    print(f"{name}: {len(saved)} adapter tensors, loss {float(result.loss):.6f}, merged logits within {err:.1e}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", default="tests/fixtures/models")
    args = parser.parse_args()
    for seed, name in enumerate(["llama", "qwen2", "gemma"]):
        make_one(args.models, name, seed)
    make_one(args.models, "llama", 3, rslora=True)


if __name__ == "__main__":
    main()
