#!/usr/bin/env python3
"""Write the KTO reference fixture: the KTO loss of four labelled examples on the tiny Llama
fixture, its KL baseline, and every weight's gradient, computed by PyTorch in float64 from
the definitions (developers only; CI never runs Python).

    .venv-tools/bin/python tools/make_kto_fixtures.py

Written from the KTO paper's and TRL's KTOTrainer (loss_type "kto") definitions, not from
marlhf's C code. An example is prompt + completion (ending with EOS); its score is the sum of
the completion tokens' log-probs (logits at slot t predict token t+1). The mismatched row of
example i is its prompt followed by example (i + 1) mod 4's completion. With
r_i = policy_i - reference_i and
    z0 = max(0, mean_i (policy(mismatched_i) - reference(mismatched_i))), no gradient,
the loss is the mean over the examples of
    desirable    w_D (1 - sigmoid(beta (r - z0)))
    undesirable  w_U (1 - sigmoid(beta (z0 - r)))
with beta 0.5, w_D 1.0, w_U 1.5. The reference is a perturbed copy of the model, chosen
(through the perturbation's seed) so that z0 > 0 and the baseline is exercised.

tests/fixtures/kto/llama.safetensors:
    tokens, kl_tokens               i64 [4, T], [4, Tk] (right-padded with 0)
    lengths, prompt_lengths         i64 [4]     (of the rows)
    kl_lengths                      i64 [4]     (the mismatched rows' prompt lengths are the rows')
    desirable                       i64 [4]     1 or 0
    ref_logps, ref_kl_logps         f32 [4]     the reference's sums (inputs of the loss)
    policy_logps, policy_kl_logps   f32 [4]     the fixture model's sums
    kl                              f32 [1]     z0
    loss                            f32 [1]
    grad.<weight name>              f32         d loss / d weight
"""
import copy
import os
import sys

import torch
from safetensors.torch import save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_model_fixtures as base  # noqa: E402
from make_dpo_fixtures import response_sums  # noqa: E402

from transformers import AutoModelForCausalLM  # noqa: E402

BETA, DESIRABLE_WEIGHT, UNDESIRABLE_WEIGHT = 0.5, 1.0, 1.5
DESIRABLE = [1, 0, 1, 0]


def make_examples(g):
    prompts, completions = [], []
    for _ in range(4):
        prompts.append(torch.randint(3, 128, (int(torch.randint(2, 6, (1,), generator=g)),), generator=g).tolist())
        n = int(torch.randint(2, 8, (1,), generator=g))
        completions.append(torch.randint(3, 128, (n - 1,), generator=g).tolist() + [2])  # ends with EOS (id 2)
    return prompts, completions


def pad(rows, prompt_lengths):
    T = max(len(r) for r in rows)
    tokens = torch.zeros(len(rows), T, dtype=torch.long)
    for i, r in enumerate(rows):
        tokens[i, :len(r)] = torch.tensor(r)
    return tokens, torch.tensor([len(r) for r in rows]), torch.tensor(prompt_lengths)


def kto_loss(policy, reference, policy_kl, reference_kl):
    kl = (policy_kl - reference_kl).mean().clamp(min=0).detach()
    logratio = policy - reference
    losses = []
    for i, d in enumerate(DESIRABLE):
        if d:
            losses.append(DESIRABLE_WEIGHT * (1 - torch.sigmoid(BETA * (logratio[i] - kl))))
        else:
            losses.append(UNDESIRABLE_WEIGHT * (1 - torch.sigmoid(BETA * (kl - logratio[i]))))
    return torch.stack(losses).mean(), kl


def main():
    folder = "tests/fixtures/models/llama"
    out_dir = "tests/fixtures/kto"
    os.makedirs(out_dir, exist_ok=True)
    g = torch.Generator().manual_seed(41)
    prompts, completions = make_examples(g)
    rows = [p + c for p, c in zip(prompts, completions)]
    kl_rows = [prompts[i] + completions[(i + 1) % 4] for i in range(4)]
    tokens, lengths, prompt_lengths = pad(rows, [len(p) for p in prompts])
    kl_tokens, kl_lengths, _ = pad(kl_rows, [len(p) for p in prompts])

    model32 = AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager").float().eval()
    model64 = copy.deepcopy(model32).double()
    base.exact_rope(model64)
    tensors = {"tokens": tokens, "lengths": lengths, "prompt_lengths": prompt_lengths, "kl_tokens": kl_tokens,
               "kl_lengths": kl_lengths, "desirable": torch.tensor(DESIRABLE)}
    with base.float64_everywhere():
        # A perturbation under which the policy is, on the mismatched rows, above the reference.
        for seed in range(100):
            noise = torch.Generator().manual_seed(1000 + seed)
            reference64 = copy.deepcopy(model64)
            with torch.no_grad():
                for p in reference64.parameters():
                    p.add_(0.05 * torch.randn(p.shape, generator=noise, dtype=torch.float64))
                reference, _ = response_sums(reference64, tokens, lengths, prompt_lengths)
                reference_kl, _ = response_sums(reference64, kl_tokens, kl_lengths, prompt_lengths)
                policy_kl, _ = response_sums(model64, kl_tokens, kl_lengths, prompt_lengths)
            # The C side reads the reference sums as float32: use exactly those values here too.
            reference, reference_kl = reference.float().double(), reference_kl.float().double()
            if (policy_kl - reference_kl).mean() > 0.05:
                break
        policy, _ = response_sums(model64, tokens, lengths, prompt_lengths)
        loss, kl = kto_loss(policy, reference, policy_kl, reference_kl)
        loss.backward()
        print(f"perturbation seed {1000 + seed}: kl {kl.item():.6f}, loss {loss.item():.6f}")
        tensors.update({"ref_logps": reference, "ref_kl_logps": reference_kl, "policy_logps": policy.detach(),
                        "policy_kl_logps": policy_kl, "kl": kl.reshape(1), "loss": loss.detach().reshape(1)})
        for name, p in model64.named_parameters():
            tensors[f"grad.{name}"] = p.grad.detach().clone()
    tensors = {k: (v.float() if v.dtype == torch.float64 else v).contiguous() for k, v in tensors.items()}
    save_file(tensors, os.path.join(out_dir, "llama.safetensors"))
    print("policy sums", [round(float(x), 4) for x in tensors["policy_logps"]])
    print("reference sums", [round(float(x), 4) for x in tensors["ref_logps"]])


if __name__ == "__main__":
    main()
