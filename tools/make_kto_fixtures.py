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

The same examples and reference then go through TRL 1.12.0's own code for the two other
losses of `marlhf kto --loss` (trl.trainer.kto_trainer.KTOTrainer._compute_loss and
trl.experimental.bco.bco_trainer.BCOTrainer.get_batch_loss_metrics, called on a stand-in for
the trainer object that holds just the settings they read; the reference log-probs are
given as precomputed, as TRL's precompute_ref_log_probs does):
- apo_zero_unpaired (kto_trainer.py 787: calculate_kl False; 1570: kl = 0; 1581:
  desirable 1 - sigmoid(beta r); 1596: undesirable sigmoid(beta r); 1604: the weights;
  1671: the mean), the four examples in one batch, w_D 1.0, w_U 1.5.
- BCO (bco_trainer.py 1271-1275: the batch's rewards beta r first update RunningMoments,
  whose mean delta then shifts -log sigmoid(+-(beta r - delta)); 141-151: the update), as
  one optimizer step of two micro-batches, examples {0, 1} then {2, 3} (the gradient
  accumulated as TRL does: each micro-batch's mean loss / 2), then a third micro-batch
  {0, 1} against the running mean the first two left (no gradient).

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
    apo.loss                        f32 [1]     apo_zero_unpaired, the mean over the four
    apo.grad.<weight name>          f32
    bco.delta                       f32 [3]     delta of micro-batches {0,1}, {2,3}, {0,1}
    bco.loss                        f32 [3]     their mean losses
    bco.grad.<weight name>          f32         of the step of the first two micro-batches
"""
import copy
import functools
import os
import sys
from collections import defaultdict
from types import SimpleNamespace

import torch
from safetensors.torch import save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_model_fixtures as base  # noqa: E402
from make_dpo_fixtures import response_sums  # noqa: E402

from transformers import AutoModelForCausalLM  # noqa: E402

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
from trl.experimental.bco.bco_trainer import BCOTrainer, RunningMoments  # noqa: E402
from trl.trainer.kto_trainer import KTOTrainer  # noqa: E402

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


class SingleProcess:
    """What TRL's loss code asks of accelerate's Accelerator in one process."""
    device = torch.device("cpu")
    use_distributed = False
    is_main_process = True

    def gather_for_metrics(self, x):
        return x


def trl_apo_zero_unpaired(model, tokens, lengths, prompt_lengths, reference):
    """The mean apo_zero_unpaired loss of the examples by KTOTrainer._compute_loss."""
    slots = torch.arange(tokens.shape[1])[None, :]
    trainer = SimpleNamespace(
        model=model, accelerator=SingleProcess(), calculate_KL=False, precompute_ref_logps=True,
        use_liger_kernel=False, aux_loss_enabled=False, loss_type="apo_zero_unpaired", beta=BETA,
        desirable_weight=DESIRABLE_WEIGHT, undesirable_weight=UNDESIRABLE_WEIGHT,
        _metrics={"train": defaultdict(list), "eval": defaultdict(list)}, _total_train_tokens=0)
    trainer._compute_kl_logps = functools.partial(KTOTrainer._compute_kl_logps, trainer)
    batch = {"input_ids": tokens, "attention_mask": (slots < lengths[:, None]).long(),
             "completion_mask": ((slots >= prompt_lengths[:, None]) & (slots < lengths[:, None])).long(),
             "label": torch.tensor(DESIRABLE, dtype=torch.bool), "ref_logps": reference}
    loss = KTOTrainer._compute_loss(trainer, model, batch, return_outputs=False)
    assert trainer._metrics["eval"]["kl"] == [0.0] or trainer._metrics["train"]["kl"] == [0.0]
    return loss


class BcoStandIn:
    """The parts of a BCOTrainer its get_batch_loss_metrics reads, with TRL's RunningMoments."""

    def __init__(self):
        self.accelerator = SingleProcess()
        self.running = RunningMoments(accelerator=self.accelerator)
        self.beta, self.is_encoder_decoder, self.aux_loss_enabled = BETA, False, False
        self.match_underlying_distribution = False
        self.get_batch_logps = BCOTrainer.get_batch_logps
        for name in ("forward", "bco_loss", "_get_prompt_embeddings"):
            setattr(self, name, functools.partial(getattr(BCOTrainer, name), self))

    def micro_batch(self, model, tokens, lengths, prompt_lengths, reference, which):
        """TRL's mean BCO loss of examples `which` and the delta it used (the running mean updated)."""
        tokens, lengths, prompt_lengths = tokens[which], lengths[which], prompt_lengths[which]
        slots = torch.arange(tokens.shape[1])[None, :]
        completion = (slots >= prompt_lengths[:, None]) & (slots < lengths[:, None])
        batch = {"completion_input_ids": tokens, "completion_attention_mask": (slots < lengths[:, None]).long(),
                 "completion_labels": torch.where(completion, tokens, torch.full_like(tokens, -100)),
                 "label": [bool(DESIRABLE[i]) for i in which], "reference_logps": reference[which]}
        loss, metrics = BCOTrainer.get_batch_loss_metrics(self, model, batch)
        return loss, metrics["delta"]


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

        # apo_zero_unpaired by TRL's KTOTrainer: all four examples in one batch.
        model64.zero_grad(set_to_none=True)
        apo = trl_apo_zero_unpaired(model64, tokens, lengths, prompt_lengths, reference)
        apo.backward()
        tensors["apo.loss"] = apo.detach().reshape(1)
        for name, p in model64.named_parameters():
            tensors[f"apo.grad.{name}"] = p.grad.detach().clone()
        print(f"apo_zero_unpaired loss {apo.item():.6f}")

        # BCO by TRL's BCOTrainer: a step of micro-batches {0, 1} and {2, 3} from a fresh
        # running mean (Trainer divides each micro-batch's loss by the accumulation, 2), then {0, 1} again.
        model64.zero_grad(set_to_none=True)
        bco = BcoStandIn()
        losses, deltas = [], []
        for which in ([0, 1], [2, 3]):
            loss, delta = bco.micro_batch(model64, tokens, lengths, prompt_lengths, reference, which)
            (loss / 2).backward()
            losses.append(loss.item()), deltas.append(delta)
        with torch.no_grad():
            loss, delta = bco.micro_batch(model64, tokens, lengths, prompt_lengths, reference, [0, 1])
        losses.append(loss.item()), deltas.append(delta)
        assert abs(bco.running.count - 6) < 1e-9
        tensors["bco.delta"] = torch.tensor(deltas, dtype=torch.float64)
        tensors["bco.loss"] = torch.tensor(losses, dtype=torch.float64)
        for name, p in model64.named_parameters():
            tensors[f"bco.grad.{name}"] = p.grad.detach().clone()
        print("bco deltas", [round(d, 6) for d in deltas], "losses", [round(x, 6) for x in losses])
    tensors = {k: (v.float() if v.dtype == torch.float64 else v).contiguous() for k, v in tensors.items()}
    save_file(tensors, os.path.join(out_dir, "llama.safetensors"))
    print("policy sums", [round(float(x), 4) for x in tensors["policy_logps"]])
    print("reference sums", [round(float(x), 4) for x in tensors["ref_logps"]])


if __name__ == "__main__":
    main()
