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
(use_rslora=True: the scale is alpha / sqrt(r) = 4) into llama/lora_rslora/. Then llama with
per-module ranks and alphas (rank_pattern, alpha_pattern: RANK_PATTERN, ALPHA_PATTERN below)
into llama/lora_pattern/, and with rsLoRA too into llama/lora_pattern_rslora/; each of these
also checks that PEFT gave every module the rank and alpha the patterns resolve to.

Last, LoRA dropout into llama/lora_dropout/: llama's adapter saved again with
lora_dropout = 0.25, and the same reference tensors with PEFT's dropout modules (in
training mode PEFT computes lora_B(lora_A(dropout(x)))) replaced by marlhf's masks: those
of the first training pass of micro-batch DROPOUT_MICRO_BATCH of epoch DROPOUT_EPOCH with
seed DROPOUT_SEED (src/model/transformer.c model_training_pass_begin, src/model/lora.c dropout_stream, drawn as
src/ops/cpu/dropout.c draws them). Philox and rng_stream are written again below from
their definitions (src/core/philox.h, src/core/rng.c) and checked on Philox's known
answers, so the fixture holds PEFT's arithmetic on masks marlhf's C code has to reproduce.

Then DoRA (use_dora=True, Liu et al. 2024) on llama into llama/dora/: the rank-4 adapter on
every linear module with seeded random A, B and magnitude vectors (PEFT starts m at the row
norms of W, and m / ||W + s B A|| = 1 would hide the magnitude's use: each m is that norm
times 1 + 0.2 * a normal draw), the same reference tensors, the magnitudes' gradients
included (grad.<...>.lora_magnitude_vector), and the check that merge_and_unload gives the
same logits. And llama/dora_dropout/: that adapter with lora_dropout = 0.25 and marlhf's
masks, where PEFT computes the base term on the dropped input (DoraLinearVariant.forward
with base_result None: (m / ||W + s B A|| - 1) W dropout(x) + ...).
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


# Per-module ranks and alphas (PEFT's rank_pattern / alpha_pattern): PEFT gives a module the
# value of the first key k (in the dict's order) for which re.match(rf"(.*\.)?({k})$",
# module name) matches (peft/utils/other.py get_pattern_key), the default r / lora_alpha
# otherwise. The keys exercise that: a plain suffix, a regex, a full name that comes before a
# suffix also matching it, and one key matching a module's name only as a whole suffix
# ("proj" matches no module: "(.*\.)?(proj)$" needs a dot before it).
RANK_PATTERN = {"model.layers.0.self_attn.q_proj": 5, "q_proj": 2, "layers\\.1\\.mlp\\.(up|down)_proj": 6, "proj": 7}
ALPHA_PATTERN = {"o_proj": 3, "model\\.layers\\.0\\.mlp\\.up_proj": 12, "k_proj": 5.5}


# PEFT's narrower ways of choosing modules (make_one's `selection`): target_modules as one
# regex string, which PEFT matches with re.fullmatch against each module's whole name, and
# layers_to_transform with the list of names.
TARGET_REGEX = r"model\.layers\.0\.self_attn\.(q|v)_proj|.*\.mlp\.down_proj"
LAYERS_TO_TRANSFORM = [1]


def make_one(models_dir, name, seed, rslora=False, patterns=False, selection=None):
    folder = os.path.join(models_dir, name)
    out = os.path.join(folder, ("lora_pattern" if patterns else "lora") + ("_rslora" if rslora else ""))
    if selection:
        out = os.path.join(folder, f"lora_{selection}")
    os.makedirs(out, exist_ok=True)
    ref = load_file(os.path.join(folder, "reference.safetensors"))
    ids, lengths = ref["input_ids"], ref["lengths"]
    mask = (torch.arange(ids.shape[1])[None, :] < lengths[:, None]).long()

    model32 = AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager").float().eval()
    config = peft.LoraConfig(r=RANK, lora_alpha=ALPHA, lora_dropout=0.0,
                             target_modules=TARGET_REGEX if selection == "regex" else MODULES,
                             layers_to_transform=LAYERS_TO_TRANSFORM if selection == "layers" else None,
                             task_type="CAUSAL_LM", use_rslora=rslora,
                             rank_pattern=dict(RANK_PATTERN) if patterns else {},
                             alpha_pattern=dict(ALPHA_PATTERN) if patterns else {})
    lora32 = peft.get_peft_model(model32, config)
    if selection:  # the modules PEFT adapted, against the rule written out here
        import re
        adapted = sorted(m for m, module in lora32.base_model.model.named_modules() if hasattr(module, "lora_A"))
        want = sorted(f"model.layers.{l}.{path}" for l in range(model32.config.num_hidden_layers)
                      for path in ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                                   "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"]
                      if (re.fullmatch(TARGET_REGEX, f"model.layers.{l}.{path}") if selection == "regex"
                          else l in LAYERS_TO_TRANSFORM))
        assert adapted == want, (adapted, want)
    if patterns:  # what PEFT resolved, against the rule written out here
        import re
        for mname, module in lora32.base_model.model.named_modules():
            if not hasattr(module, "lora_A") or "default" not in module.lora_A:
                continue
            want_r = next((v for k, v in RANK_PATTERN.items() if re.match(rf"(.*\.)?({k})$", mname)), RANK)
            want_a = next((v for k, v in ALPHA_PATTERN.items() if re.match(rf"(.*\.)?({k})$", mname)), ALPHA)
            assert module.r["default"] == want_r and module.lora_alpha["default"] == want_a, (mname, module.r)
            scale = want_a / (want_r ** 0.5 if rslora else want_r)
            assert abs(module.scaling["default"] - scale) < 1e-12, (mname, module.scaling)
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


MASK32, MASK64 = 0xFFFFFFFF, 0xFFFFFFFFFFFFFFFF
DROPOUT, DROPOUT_SEED, DROPOUT_EPOCH, DROPOUT_MICRO_BATCH = 0.25, 1234, 2, 5


def philox4x32(seed, stream, counter):
    c = [counter & MASK32, counter >> 32, stream & MASK32, stream >> 32]
    k0, k1 = seed & MASK32, seed >> 32
    for _ in range(10):
        p0, p1 = 0xD2511F53 * c[0], 0xCD9E8D57 * c[2]
        c = [(p1 >> 32) ^ c[1] ^ k0, p1 & MASK32, (p0 >> 32) ^ c[3] ^ k1, p0 & MASK32]
        k0, k1 = (k0 + 0x9E3779B9) & MASK32, (k1 + 0xBB67AE85) & MASK32
    return c


def rng_stream(name, a, b):
    h = 0xCBF29CE484222325
    for byte in name.encode():
        h = ((h ^ byte) * 0x100000001B3) & MASK64
    h ^= (a * 0x9E3779B97F4A7C15) & MASK64
    h = ((h ^ (h >> 31)) * 0xBF58476D1CE4E5B9) & MASK64
    h ^= (b * 0xC2B2AE3D27D4EB4F) & MASK64
    h = ((h ^ (h >> 29)) * 0x94D049BB133111EB) & MASK64
    return h ^ (h >> 32)


def dropout_mask(shape, p, seed, stream):
    """marlhf's mask over a tensor of `shape`, flattened row-major: element i is kept where
    word i % 4 of block i / 4 is at least p * 2^32."""
    n = 1
    for d in shape:
        n *= d
    threshold = int(p * 4294967296.0)
    keep = []
    for block in range((n + 3) // 4):
        keep.extend(word >= threshold for word in philox4x32(seed, stream, block))
    return torch.tensor(keep[:n], dtype=torch.float64).reshape(shape)


class FixedMaskDropout(torch.nn.Module):
    """nn.Dropout(p) with a given mask: x * mask / (1 - p)."""

    def __init__(self, mask, p):
        super().__init__()
        self.mask, self.p = mask, p

    def forward(self, x):
        assert x.shape == self.mask.shape, (x.shape, self.mask.shape)
        return x * self.mask.to(x.dtype) / (1 - self.p)


def make_dropout(models_dir):
    assert philox4x32(0, 0, 0) == [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8]
    assert philox4x32(MASK64, MASK64, MASK64) == [0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD]
    folder = os.path.join(models_dir, "llama")
    out = os.path.join(folder, "lora_dropout")
    os.makedirs(out, exist_ok=True)
    ref = load_file(os.path.join(folder, "reference.safetensors"))
    ids, lengths = ref["input_ids"], ref["lengths"]
    mask = (torch.arange(ids.shape[1])[None, :] < lengths[:, None]).long()

    model32 = AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager").float()
    config = peft.LoraConfig(r=RANK, lora_alpha=ALPHA, lora_dropout=DROPOUT, target_modules=MODULES,
                             task_type="CAUSAL_LM")
    lora32 = peft.get_peft_model(model32, config)
    adapter = load_file(os.path.join(folder, "lora", "adapter_model.safetensors"))
    peft.set_peft_model_state_dict(lora32, adapter)
    lora32.save_pretrained(out, safe_serialization=True)
    os.remove(os.path.join(out, "README.md"))
    assert load_file(os.path.join(out, "adapter_model.safetensors")).keys() == adapter.keys()

    lora64 = copy.deepcopy(lora32).double().train()
    base.exact_rope(lora64)
    micro_batch = rng_stream("lora_dropout_micro_batch", DROPOUT_EPOCH, DROPOUT_MICRO_BATCH)
    first_pass = 1
    hidden, inter = lora64.config.hidden_size, lora64.config.intermediate_size
    q_dim = lora64.config.num_attention_heads * lora64.config.head_dim
    inputs = {"q_proj": hidden, "k_proj": hidden, "v_proj": hidden, "o_proj": q_dim, "gate_proj": hidden,
              "up_proj": hidden, "down_proj": inter}
    replaced = 0
    for layer_index, layer in enumerate(lora64.base_model.model.model.layers):
        for target, module_name in enumerate(MODULES):
            parent = layer.self_attn if module_name in ("q_proj", "k_proj", "v_proj", "o_proj") else layer.mlp
            module = getattr(parent, module_name)
            stream = rng_stream("lora_dropout", micro_batch, (first_pass << 20) | (layer_index * len(MODULES) + target))
            shape = (ids.shape[0], ids.shape[1], inputs[module_name])
            module.lora_dropout["default"] = FixedMaskDropout(dropout_mask(shape, DROPOUT, DROPOUT_SEED, stream), DROPOUT)
            replaced += 1
    assert replaced == len(MODULES) * len(lora64.base_model.model.model.layers)
    with base.float64_everywhere():
        lora64.zero_grad(set_to_none=True)
        result = lora64(input_ids=ids, attention_mask=mask, labels=base.labels_of(ids, mask))
        result.loss.backward()
    grads = {pname.replace(".default", ""): p.grad.detach().clone()
             for pname, p in lora64.named_parameters() if "lora_" in pname}
    assert set(grads) == set(adapter), set(grads) ^ set(adapter)
    tensors = {"logits": result.logits, "loss": result.loss.reshape(1)}
    tensors.update({f"grad.{n}": v for n, v in grads.items()})
    tensors = {k: v.float().contiguous() for k, v in tensors.items()}
    save_file(tensors, os.path.join(out, "reference.safetensors"))
    print(f"llama with lora_dropout {DROPOUT}: loss {float(result.loss):.6f}")


def make_dora(models_dir, dropout):
    folder = os.path.join(models_dir, "llama")
    out = os.path.join(folder, "dora_dropout" if dropout else "dora")
    os.makedirs(out, exist_ok=True)
    ref = load_file(os.path.join(folder, "reference.safetensors"))
    ids, lengths = ref["input_ids"], ref["lengths"]
    mask = (torch.arange(ids.shape[1])[None, :] < lengths[:, None]).long()

    model32 = AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager").float().eval()
    config = peft.LoraConfig(r=RANK, lora_alpha=ALPHA, lora_dropout=DROPOUT if dropout else 0.0,
                             target_modules=MODULES, task_type="CAUSAL_LM", use_dora=True)
    dora32 = peft.get_peft_model(model32, config)
    if dropout:  # the adapter of llama/dora/, read back as PEFT reads it
        adapter = load_file(os.path.join(folder, "dora", "adapter_model.safetensors"))
        peft.set_peft_model_state_dict(dora32, adapter)
    else:
        g = torch.Generator().manual_seed(6000)
        with torch.no_grad():
            for pname, p in dora32.named_parameters():
                if "lora_magnitude_vector" in pname:
                    p.mul_(1 + 0.2 * torch.randn(p.shape, generator=g))
                elif "lora_" in pname:
                    p.copy_(0.2 * torch.randn(p.shape, generator=g))
    dora32.save_pretrained(out, safe_serialization=True)
    os.remove(os.path.join(out, "README.md"))
    saved = load_file(os.path.join(out, "adapter_model.safetensors"))
    assert sum("lora_magnitude_vector" in k for k in saved) == len(MODULES) * 2, sorted(saved)

    dora64 = copy.deepcopy(dora32).double()
    base.exact_rope(dora64)
    if dropout:
        dora64.train()
        micro_batch = rng_stream("lora_dropout_micro_batch", DROPOUT_EPOCH, DROPOUT_MICRO_BATCH)
        hidden, inter = dora64.config.hidden_size, dora64.config.intermediate_size
        q_dim = dora64.config.num_attention_heads * dora64.config.head_dim
        inputs = {"q_proj": hidden, "k_proj": hidden, "v_proj": hidden, "o_proj": q_dim, "gate_proj": hidden,
                  "up_proj": hidden, "down_proj": inter}
        for layer_index, layer in enumerate(dora64.base_model.model.model.layers):
            for target, module_name in enumerate(MODULES):
                parent = layer.self_attn if module_name in ("q_proj", "k_proj", "v_proj", "o_proj") else layer.mlp
                module = getattr(parent, module_name)
                stream = rng_stream("lora_dropout", micro_batch, (1 << 20) | (layer_index * len(MODULES) + target))
                shape = (ids.shape[0], ids.shape[1], inputs[module_name])
                module.lora_dropout["default"] = FixedMaskDropout(dropout_mask(shape, DROPOUT, DROPOUT_SEED, stream),
                                                                  DROPOUT)
    with base.float64_everywhere():
        dora64.zero_grad(set_to_none=True)
        result = dora64(input_ids=ids, attention_mask=mask, labels=base.labels_of(ids, mask))
        result.loss.backward()
    grads = {}
    for pname, p in dora64.named_parameters():
        if "lora_" in pname:
            # save_pretrained drops the adapter's name, and ".weight" after the magnitude
            name = pname.replace(".default", "").replace("lora_magnitude_vector.weight", "lora_magnitude_vector")
            grads[name] = p.grad.detach().clone()
        else:
            assert p.grad is None, f"dora: frozen {pname} got a gradient"
    assert set(grads) == set(saved), set(grads) ^ set(saved)

    err = 0.0
    if not dropout:
        merged = copy.deepcopy(dora32).merge_and_unload()
        merged_logits = merged(input_ids=ids, attention_mask=mask).logits
        err = float((merged_logits.double() - result.logits)[mask.bool()].abs().max().detach())
        assert err < 1e-4, f"dora: merged logits differ by {err}"

    tensors = {"logits": result.logits, "loss": result.loss.reshape(1)}
    tensors.update({f"grad.{n}": v for n, v in grads.items()})
    tensors = {k: v.float().contiguous() for k, v in tensors.items()}
    save_file(tensors, os.path.join(out, "reference.safetensors"))
    print(f"llama DoRA{' with lora_dropout' if dropout else ''}: {len(saved)} adapter tensors, "
          f"loss {float(result.loss):.6f}, merged logits within {err:.1e}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", default="tests/fixtures/models")
    parser.add_argument("--only", help="write this model's plain adapter (lora/) alone, e.g. gemma2")
    parser.add_argument("--selection", action="store_true",
                        help="write llama's lora_regex/ and lora_layers/ alone (TARGET_REGEX, LAYERS_TO_TRANSFORM)")
    args = parser.parse_args()
    if args.selection:
        make_one(args.models, "llama", 7, selection="regex")
        make_one(args.models, "llama", 8, selection="layers")
        return
    seeds = {"llama": 0, "qwen2": 1, "gemma": 2, "gemma2": 6}  # gemma2 added later: its own seed
    if args.only:
        make_one(args.models, args.only, seeds[args.only])
        return
    for name in ["llama", "qwen2", "gemma", "gemma2"]:
        make_one(args.models, name, seeds[name])
    make_one(args.models, "llama", 3, rslora=True)
    make_one(args.models, "llama", 4, patterns=True)
    make_one(args.models, "llama", 5, rslora=True, patterns=True)
    make_one(args.models, "llama", 7, selection="regex")
    make_one(args.models, "llama", 8, selection="layers")
    make_dropout(args.models)
    make_dora(args.models, dropout=False)
    make_dora(args.models, dropout=True)


if __name__ == "__main__":
    main()
