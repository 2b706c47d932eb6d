#!/usr/bin/env python3
"""Write the DPO reference fixture: the DPO, conservative-DPO, IPO and hinge losses of three
chosen/rejected pairs on the tiny Llama fixture, and their gradients, computed by PyTorch in
float64 from the definitions (developers only; CI never runs Python).

    .venv-tools/bin/python tools/make_dpo_fixtures.py [--losses-only]

Written from the papers' and TRL's definitions (DPOTrainer, loss_type sigmoid / ipo /
hinge; DeepSpeed-Chat's label smoothing), not from marlhf's C code. A row is prompt +
response; its score is the sum of the response tokens' log-probs (logits at slot t predict
token t+1, response tokens are slots prompt_length .. length-1). With h = (pc - rc) - (pr - rr):
    sigmoid  -log sigmoid(beta h)                              beta 0.1
    cdpo     -(1-eps) log sigmoid(beta h) - eps log sigmoid(-beta h)   beta 0.5, eps 0.2
    ipo      (h' - 1/(2 beta))^2, h' from per-token means          beta 0.1
    hinge    relu(1 - beta h)                                      beta 0.5
    simpo    -log sigmoid(beta (mean_c - mean_r) - gamma), no reference   beta 2, gamma 1
    rpo      sigmoid + 0.5 x the chosen response's mean -log-prob           beta 0.1
    orpo     -mean_c - beta log sigmoid(odds(mean_c) - odds(mean_r)), odds(m) = m - log(1 - e^m),
             no reference (TRL's ORPOTrainer with its NLL per pair)          beta 1
    ld       sigmoid on LD-DPO's sums (TRL's ld_alpha 0.5): in both rows of a pair the
             response tokens past the shorter response's length count 0.5 times, for the
             policy and the reference alike                                 beta 0.1
each averaged over the pairs. The reference sums come from a perturbed copy of the model.
Then, as TRL 1.12's DPOTrainer._compute_loss computes them from the logits (all three pairs one
batch; beta 0.1):
    mpo      loss_type ["sigmoid", "bco_pair", "sft"], loss_weights [0.8, 0.2, 1.0]: per pair
             0.8 sigmoid + 0.2 bco_pair, averaged, plus the cross-entropy over all the batch's
             chosen response tokens (one mean, not per pair)
    wpo      sigmoid with use_weighting: each pair's loss times w_c w_r, w a row's
             exp(mean over its response tokens of log p(token) - log sum_v p_v^2), under
             no_grad (WPO, Zhou et al. 2024)
    mpo_wpo_ld  mpo with use_weighting and ld_alpha 0.5 (the sft term and WPO's weights
             read the unweighted log-probs, the pair losses LD-DPO's sums)
And as TRL 1.12's CPOTrainer computes them (its own cpo_loss, called on the sums or means,
plus cpo_alpha times the cross-entropy over all the batch's chosen response tokens, as its
concatenated_forward computes it; no reference):
    cpo      loss_type "sigmoid", beta 0.5, label_smoothing 0.1, cpo_alpha 1 (CPO, Xu et al. 2024)
    cpo_simpo  loss_type "simpo", beta 2, simpo_gamma 1, label_smoothing 0.1, cpo_alpha 0.5

And tests/fixtures/dpo/trl_losses.json (`--losses-only` writes just it), TRL 1.12's own code
called on fixed log-prob sums of a batch of pairs (no model): DPOTrainer._compute_loss, run
with a stand-in for the trainer and for the model, selective_log_softmax replaced by the given
per-token log-probs (one completion token per row carrying the row's sum), for loss_type
aot and aot_unpaired (they sort the batch's log-ratios) alone and in a list with sigmoid;
CPOTrainer.cpo_loss for loss_type hinge, ipo (per-token means), simpo and sigmoid, with and
without the AlphaPO reward shape alpha ("alphapo" is simpo with alpha). Each case: the options,
the sums, token counts, the loss (the batch mean), the logged rewards (TRL's rewards/chosen,
rejected, margins, accuracies, batch means) and d loss / d each sum.

tests/fixtures/dpo/llama.safetensors:
    tokens          i64 [6, T]  row 2i chosen, 2i+1 rejected of pair i (right-padded with 0)
    lengths         i64 [6]
    prompt_lengths  i64 [6]
    ref_logps       f32 [6]     the reference's sums (inputs of the loss)
    ref_logps_ld    f32 [6]     the reference's LD-DPO sums (the input of "ld")
    policy_logps    f32 [6]     the fixture model's sums
    loss.<kind>     f32 [1]     for kind in sigmoid, cdpo, ipo, hinge, simpo, rpo, orpo, ld, mpo,
                                wpo, mpo_wpo_ld, cpo, cpo_simpo
    grad.<kind>.<weight name>   f32, d loss / d weight for kind in cdpo, ipo, simpo, rpo, orpo, ld,
                                mpo, wpo, mpo_wpo_ld, cpo, cpo_simpo
    wpo_log_weights f32 [6]     each row's log w under the fixture model (WPO)
"""
import collections
import copy
import json
import os
import sys
import types

import torch
from safetensors.torch import save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_model_fixtures as base  # noqa: E402

from transformers import AutoModelForCausalLM  # noqa: E402

KINDS = {"sigmoid": ("sigmoid", 0.1, 0.0), "cdpo": ("sigmoid", 0.5, 0.2), "ipo": ("ipo", 0.1, 0.0),
         "hinge": ("hinge", 0.5, 0.0), "simpo": ("simpo", 2.0, 1.0), "rpo": ("sigmoid", 0.1, 0.0),
         "orpo": ("orpo", 1.0, 0.0), "ld": ("sigmoid", 0.1, 0.0)}
GRAD_KINDS = ("cdpo", "ipo", "simpo", "rpo", "orpo", "ld")
LD_ALPHA = 0.5
RPO_WEIGHT = 0.5  # "rpo": sigmoid plus 0.5 x each pair's chosen mean negative log-likelihood


def make_pairs(g):
    rows, prompt_lengths = [], []
    for _ in range(3):
        prompt = torch.randint(3, 128, (int(torch.randint(2, 6, (1,), generator=g)),), generator=g).tolist()
        for _ in range(2):
            n = int(torch.randint(2, 9, (1,), generator=g))
            response = torch.randint(3, 128, (n - 1,), generator=g).tolist() + [2]  # ends with EOS (id 2)
            rows.append(prompt + response)
            prompt_lengths.append(len(prompt))
    T = max(len(r) for r in rows)
    tokens = torch.zeros(len(rows), T, dtype=torch.long)
    for i, r in enumerate(rows):
        tokens[i, :len(r)] = torch.tensor(r)
    return tokens, torch.tensor([len(r) for r in rows]), torch.tensor(prompt_lengths)


def response_sums(model, tokens, lengths, prompt_lengths, ld_alpha=None):
    mask = (torch.arange(tokens.shape[1])[None, :] < lengths[:, None]).long()
    logits = model(input_ids=tokens, attention_mask=mask).logits
    logp = torch.log_softmax(logits[:, :-1], dim=-1).gather(-1, tokens[:, 1:, None])[..., 0]
    slots = torch.arange(tokens.shape[1] - 1)[None, :]
    counted = (slots + 1 >= prompt_lengths[:, None]) & (slots + 1 < lengths[:, None])
    if ld_alpha is not None:  # TRL's ld_alpha: the shared length of the pair counts fully
        position = counted.long().cumsum(dim=1)
        count = counted.sum(dim=1)
        shared = torch.minimum(count[0::2], count[1::2]).repeat_interleave(2)
        weight = torch.where(position <= shared[:, None], 1.0, ld_alpha).to(logp.dtype)
        return (logp * weight * counted).sum(dim=1), count
    return (logp * counted).sum(dim=1), counted.sum(dim=1)


def dpo_loss(kind, policy, reference, counts):
    loss_type, beta, eps = KINDS[kind]  # for simpo the third value is gamma
    if loss_type == "simpo":  # reference-free, per-token means (TRL's CPOTrainer, loss_type "simpo")
        mean = policy / counts
        h = mean[0::2] - mean[1::2]
        return (-torch.nn.functional.logsigmoid(beta * h - eps)).mean()
    if loss_type == "orpo":  # reference-free, per-token means (Hong et al. 2024; TRL's ORPOTrainer)
        mean = policy / counts
        log_odds = mean - torch.log1p(-torch.exp(mean))
        ratio = torch.nn.functional.logsigmoid(log_odds[0::2] - log_odds[1::2])
        return (-mean[0::2] - beta * ratio).mean()
    if loss_type == "ipo":
        policy, reference = policy / counts, reference / counts
    h = (policy[0::2] - reference[0::2]) - (policy[1::2] - reference[1::2])
    if loss_type == "sigmoid":
        losses = -(1 - eps) * torch.nn.functional.logsigmoid(beta * h) - eps * torch.nn.functional.logsigmoid(-beta * h)
    elif loss_type == "ipo":
        losses = (h - 1 / (2 * beta)) ** 2
    else:
        losses = torch.relu(1 - beta * h)
    if kind == "rpo":
        losses = losses + RPO_WEIGHT * -(policy[0::2] / counts[0::2])
    return losses.mean()


# TRL 1.12's combined losses and WPO weighting (the "trl" kinds): loss types, weights, use_weighting, ld_alpha.
TRL_KINDS = {"mpo": (["sigmoid", "bco_pair", "sft"], [0.8, 0.2, 1.0], False, None),
             "wpo": (["sigmoid"], [1.0], True, None),
             "mpo_wpo_ld": (["sigmoid", "bco_pair", "sft"], [0.8, 0.2, 1.0], True, LD_ALPHA)}
TRL_BETA = 0.1


def trl_loss(model, tokens, lengths, prompt_lengths, reference, loss_types, loss_weights, use_weighting, ld_alpha):
    """The loss as TRL's _compute_loss computes it (its variable names), for the loss types used here."""
    F = torch.nn.functional
    mask = (torch.arange(tokens.shape[1])[None, :] < lengths[:, None]).long()
    shift_logits = model(input_ids=tokens, attention_mask=mask).logits[:, :-1]
    shift_labels = tokens[:, 1:]
    slots = torch.arange(tokens.shape[1] - 1)[None, :]
    shift_completion_mask = ((slots + 1 >= prompt_lengths[:, None]) & (slots + 1 < lengths[:, None])).long()
    per_token_logps = torch.log_softmax(shift_logits, dim=-1).gather(-1, shift_labels[..., None])[..., 0]
    per_token_logps = per_token_logps * shift_completion_mask
    logps, _ = response_sums(model, tokens, lengths, prompt_lengths, ld_alpha)
    chosen_logratios = logps[0::2] - reference[0::2]
    rejected_logratios = logps[1::2] - reference[1::2]
    delta_score = chosen_logratios - rejected_logratios
    beta = TRL_BETA
    loss = 0.0
    for loss_type, loss_weight in zip(loss_types, loss_weights, strict=True):
        if loss_type == "sigmoid":
            per_sequence_loss = -F.logsigmoid(beta * delta_score)
        elif loss_type == "bco_pair":
            per_sequence_loss = -F.logsigmoid(beta * chosen_logratios) - F.logsigmoid(-beta * rejected_logratios)
        elif loss_type == "sft":
            chosen_logits, chosen_labels = shift_logits[0::2], shift_labels[0::2]
            chosen_mask = shift_completion_mask[0::2].bool()
            batch_loss = F.cross_entropy(chosen_logits[chosen_mask], chosen_labels[chosen_mask])
            per_sequence_loss = batch_loss.expand(chosen_logits.size(0))
        else:
            raise ValueError(loss_type)
        if use_weighting:
            completion_lengths = shift_completion_mask.sum(dim=1).clamp_min(1)
            with torch.no_grad():
                lse1 = torch.logsumexp(shift_logits, dim=-1)
                lse2 = torch.logsumexp(2.0 * shift_logits, dim=-1)
                aligned_logps = (per_token_logps - (lse2 - 2.0 * lse1)) * shift_completion_mask
            weights = torch.exp(aligned_logps.sum(dim=1) / completion_lengths)
            per_sequence_loss = per_sequence_loss * weights[0::2] * weights[1::2]
        loss = loss + per_sequence_loss.mean() * loss_weight
    with torch.no_grad():
        lse1 = torch.logsumexp(shift_logits, dim=-1)
        lse2 = torch.logsumexp(2.0 * shift_logits, dim=-1)
        log_weights = ((per_token_logps - (lse2 - 2.0 * lse1)) * shift_completion_mask).sum(dim=1) / \
            shift_completion_mask.sum(dim=1)
    return loss, log_weights


# TRL 1.12's CPOTrainer (trl.experimental.cpo): loss_type, beta, simpo_gamma, label_smoothing, cpo_alpha.
CPO_KINDS = {"cpo": ("sigmoid", 0.5, 0.5, 0.1, 1.0), "cpo_simpo": ("simpo", 2.0, 1.0, 0.1, 0.5)}


def cpo_trainer_loss(model, tokens, lengths, prompt_lengths, loss_type, beta, simpo_gamma, label_smoothing, cpo_alpha):
    """The loss as TRL's CPOTrainer.get_batch_loss_metrics computes it: its own cpo_loss (called
    with a stand-in for the trainer holding the config's values) on the rows' log-prob sums, or
    per-token means for simpo, plus cpo_alpha times nn.CrossEntropyLoss over the chosen rows'
    labels (the prompt and the padding are -100, as its collator sets them)."""
    from trl.experimental.cpo.cpo_trainer import CPOTrainer

    trainer = types.SimpleNamespace(loss_type=loss_type, beta=beta, simpo_gamma=simpo_gamma,
                                    label_smoothing=label_smoothing, alpha=0.0,
                                    accelerator=types.SimpleNamespace(device=torch.device("cpu")))
    sums, counts = response_sums(model, tokens, lengths, prompt_lengths)
    logps = sums / counts if loss_type == "simpo" else sums
    losses, _, _ = CPOTrainer.cpo_loss(trainer, logps[0::2], logps[1::2])
    mask = (torch.arange(tokens.shape[1])[None, :] < lengths[:, None]).long()
    logits = model(input_ids=tokens, attention_mask=mask).logits
    labels = tokens.clone()
    slots = torch.arange(tokens.shape[1])[None, :]
    labels[(slots < prompt_lengths[:, None]) | (slots >= lengths[:, None])] = -100
    chosen_logits, chosen_labels = logits[0::2, :-1], labels[0::2, 1:]
    nll = torch.nn.CrossEntropyLoss()(chosen_logits.reshape(-1, chosen_logits.shape[-1]), chosen_labels.reshape(-1))
    return losses.mean() + cpo_alpha * nll


def dpo_trainer_case(loss_types, loss_weights, beta, label_smoothing, chosen, rejected, ref_chosen, ref_rejected):
    """TRL's DPOTrainer._compute_loss on given log-prob sums (precomputed reference)."""
    import trl.trainer.dpo_trainer as dpo_module
    from trl import DPOTrainer

    n = len(chosen)
    sums = torch.tensor(chosen + rejected, dtype=torch.float64, requires_grad=True)
    # Two slots per row: a prompt token, then one completion token whose log-prob (the one shifted
    # slot) is the row's sum.
    completion_mask = torch.tensor([[0, 1]] * (2 * n))
    inputs = {"input_ids": torch.zeros(2 * n, 2, dtype=torch.long), "attention_mask": torch.ones(2 * n, 2, dtype=torch.long),
              "completion_mask": completion_mask, "ref_chosen_logps": torch.tensor(ref_chosen, dtype=torch.float64),
              "ref_rejected_logps": torch.tensor(ref_rejected, dtype=torch.float64)}
    model = lambda **kwargs: types.SimpleNamespace(logits=torch.zeros(2 * n, 2, 3, dtype=torch.float64))
    accelerator = types.SimpleNamespace(device=torch.device("cpu"), gather=lambda x: x, gather_for_metrics=lambda x: x)
    trainer = types.SimpleNamespace(
        model=types.SimpleNamespace(training=True), accelerator=accelerator, aux_loss_enabled=False, ld_alpha=None,
        precompute_ref_logps=True, f_divergence_type="reverse_kl", loss_types=loss_types, loss_weights=loss_weights,
        beta=beta, label_smoothing=label_smoothing, use_weighting=False, args=types.SimpleNamespace(discopop_tau=0.05),
        _metrics=collections.defaultdict(lambda: collections.defaultdict(list)), _total_train_tokens=0)
    saved = dpo_module.selective_log_softmax
    dpo_module.selective_log_softmax = lambda logits, labels: sums[:, None].clone()
    try:
        loss = DPOTrainer._compute_loss(trainer, model, inputs, return_outputs=False)
    finally:
        dpo_module.selective_log_softmax = saved
    loss.backward()
    logged = trainer._metrics["train"]
    return {"trainer": "dpo", "loss_type": loss_types, "loss_weights": loss_weights, "beta": beta,
            "label_smoothing": label_smoothing, "chosen": chosen, "rejected": rejected, "ref_chosen": ref_chosen,
            "ref_rejected": ref_rejected, "chosen_tokens": [1] * n, "rejected_tokens": [1] * n, "loss": loss.item(),
            "rewards": [logged["rewards/chosen"][0], logged["rewards/rejected"][0], logged["rewards/margins"][0],
                        logged["rewards/accuracies"][0]],
            "d_chosen": sums.grad[:n].tolist(), "d_rejected": sums.grad[n:].tolist()}


def cpo_trainer_case(loss_type, beta, label_smoothing, simpo_gamma, alpha, chosen, rejected, chosen_tokens, rejected_tokens):
    """TRL's CPOTrainer.cpo_loss on given log-prob sums (per-token means for ipo and simpo, as its
    concatenated_forward gives them), the batch mean as get_batch_loss_metrics takes it."""
    from trl.experimental.cpo.cpo_trainer import CPOTrainer

    n = len(chosen)
    sums = torch.tensor(chosen + rejected, dtype=torch.float64, requires_grad=True)
    counts = torch.tensor(chosen_tokens + rejected_tokens, dtype=torch.float64)
    logps = sums / counts if loss_type in ("ipo", "simpo") else sums
    trainer = types.SimpleNamespace(loss_type=loss_type, beta=beta, simpo_gamma=simpo_gamma, label_smoothing=label_smoothing,
                                    alpha=alpha, accelerator=types.SimpleNamespace(device=torch.device("cpu")))
    losses, chosen_rewards, rejected_rewards = CPOTrainer.cpo_loss(trainer, logps[:n], logps[n:])
    loss = losses.mean()
    loss.backward()
    return {"trainer": "cpo", "loss_type": loss_type, "beta": beta, "label_smoothing": label_smoothing,
            "simpo_gamma": simpo_gamma, "alpha": alpha, "chosen": chosen, "rejected": rejected,
            "chosen_tokens": chosen_tokens, "rejected_tokens": rejected_tokens, "loss": loss.item(),
            "rewards": [chosen_rewards.mean().item(), rejected_rewards.mean().item(),
                        (chosen_rewards - rejected_rewards).mean().item(),
                        (chosen_rewards > rejected_rewards).double().mean().item()],
            "d_chosen": sums.grad[:n].tolist(), "d_rejected": sums.grad[n:].tolist()}


def write_trl_losses(out_dir):
    g = torch.Generator().manual_seed(53)

    def draws(n, low, high):
        return [round(low + (high - low) * float(x), 6) for x in torch.rand(n, generator=g, dtype=torch.float64)]

    cases = []
    # Five pairs whose policy and reference orders differ, so the sorts pair them otherwise.
    for loss_types, weights, beta, eps in ((["aot"], [1.0], 0.1, 0.0), (["aot"], [1.0], 0.5, 0.2),
                                           (["aot_unpaired"], [1.0], 0.1, 0.0), (["aot_unpaired"], [1.0], 0.3, 0.1),
                                           (["sigmoid", "aot"], [0.5, 1.5], 0.2, 0.0),
                                           (["aot_unpaired", "aot", "bco_pair"], [1.0, 0.5, 0.25], 0.2, 0.0)):
        chosen, rejected = draws(5, -40, -10), draws(5, -40, -10)
        ref_chosen, ref_rejected = draws(5, -40, -10), draws(5, -40, -10)
        cases.append(dpo_trainer_case(loss_types, weights, beta, eps, chosen, rejected, ref_chosen, ref_rejected))
    # CPOTrainer: hinge (some pairs past the kink), ipo, simpo and sigmoid, with AlphaPO's alpha.
    for loss_type, beta, eps, gamma, alpha in (("hinge", 0.5, 0.0, 0.5, 0.0), ("ipo", 0.1, 0.0, 0.5, 0.0),
                                               ("simpo", 2.5, 0.0, 1.0, 0.25), ("simpo", 2.0, 0.1, 0.5, -0.5),
                                               ("sigmoid", 0.5, 0.1, 0.5, 0.05), ("hinge", 0.5, 0.0, 0.5, 0.1),
                                               ("ipo", 0.2, 0.0, 0.5, 0.5)):
        chosen_tokens = [int(x) for x in torch.randint(2, 12, (4,), generator=g)]
        rejected_tokens = [int(x) for x in torch.randint(2, 12, (4,), generator=g)]
        chosen = [round(-k * t, 6) for k, t in zip(draws(4, 0.3, 3.0), chosen_tokens)]
        rejected = [round(-k * t, 6) for k, t in zip(draws(4, 0.3, 3.0), rejected_tokens)]
        cases.append(cpo_trainer_case(loss_type, beta, eps, gamma, alpha, chosen, rejected, chosen_tokens, rejected_tokens))
    # Ties: pairs 0 and 2 have the same chosen and the same rejected log-ratio (pair 3 ties with
    # neither), so where torch.sort puts equal values decides which pair gets which sorted
    # place's gradient (marlhf keeps tied values in their micro-batch order).
    for loss_types in (["aot"], ["aot_unpaired"]):
        chosen, rejected = [-20.0, -31.5, -18.0, -25.0], [-30.0, -22.25, -28.0, -26.0]
        ref_chosen, ref_rejected = [-22.0, -30.0, -20.0, -24.0], [-27.0, -24.0, -25.0, -23.5]
        case = dpo_trainer_case(loss_types, [1.0], 0.3, 0.0, chosen, rejected, ref_chosen, ref_rejected)
        case["ties"] = True  # the sorted loss has a kink here: no central differences
        cases.append(case)
    with open(os.path.join(out_dir, "trl_losses.json"), "w") as out:
        out.write("[\n" + ",\n".join(json.dumps(c) for c in cases) + "\n]\n")  # a case per line
    for c in cases:
        print(c["trainer"], c["loss_type"], "loss", round(c["loss"], 6))


def main():
    if "--losses-only" in sys.argv:
        write_trl_losses("tests/fixtures/dpo")
        return
    folder = "tests/fixtures/models/llama"
    out_dir = "tests/fixtures/dpo"
    os.makedirs(out_dir, exist_ok=True)
    g = torch.Generator().manual_seed(31)
    tokens, lengths, prompt_lengths = make_pairs(g)

    model32 = AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager").float().eval()
    model64 = copy.deepcopy(model32).double()
    base.exact_rope(model64)
    reference64 = copy.deepcopy(model64)
    with torch.no_grad():
        for p in reference64.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g, dtype=torch.float64))

    tensors = {"tokens": tokens, "lengths": lengths, "prompt_lengths": prompt_lengths}
    with base.float64_everywhere():
        with torch.no_grad():
            reference, counts = response_sums(reference64, tokens, lengths, prompt_lengths)
            reference_ld, _ = response_sums(reference64, tokens, lengths, prompt_lengths, LD_ALPHA)
        reference_ld = reference_ld.float().double()
        tensors["ref_logps_ld"] = reference_ld
        # The C side reads the reference sums as float32: use exactly those values here too.
        reference = reference.float().double()
        tensors["ref_logps"] = reference
        policy, _ = response_sums(model64, tokens, lengths, prompt_lengths)
        tensors["policy_logps"] = policy.detach()
        for kind in KINDS:
            model64.zero_grad(set_to_none=True)
            ld = LD_ALPHA if kind == "ld" else None
            policy, _ = response_sums(model64, tokens, lengths, prompt_lengths, ld)
            loss = dpo_loss(kind, policy, reference_ld if ld else reference, counts.double())
            tensors[f"loss.{kind}"] = loss.detach().reshape(1)
            print(f"{kind}: loss {loss.item():.6f}")
            if kind in GRAD_KINDS:
                loss.backward()
                for name, p in model64.named_parameters():
                    tensors[f"grad.{kind}.{name}"] = p.grad.detach().clone()
        for kind, (loss_types, loss_weights, use_weighting, ld_alpha) in TRL_KINDS.items():
            model64.zero_grad(set_to_none=True)
            loss, log_weights = trl_loss(model64, tokens, lengths, prompt_lengths, reference_ld if ld_alpha else reference,
                                         loss_types, loss_weights, use_weighting, ld_alpha)
            tensors[f"loss.{kind}"] = loss.detach().reshape(1)
            tensors["wpo_log_weights"] = log_weights
            print(f"{kind}: loss {loss.item():.6f}")
            loss.backward()
            for name, p in model64.named_parameters():
                tensors[f"grad.{kind}.{name}"] = p.grad.detach().clone()
        for kind, config in CPO_KINDS.items():
            model64.zero_grad(set_to_none=True)
            loss = cpo_trainer_loss(model64, tokens, lengths, prompt_lengths, *config)
            tensors[f"loss.{kind}"] = loss.detach().reshape(1)
            print(f"{kind}: loss {loss.item():.6f}")
            loss.backward()
            for name, p in model64.named_parameters():
                tensors[f"grad.{kind}.{name}"] = p.grad.detach().clone()
    tensors = {k: (v.float() if v.dtype == torch.float64 else v).contiguous() for k, v in tensors.items()}
    save_file(tensors, os.path.join(out_dir, "llama.safetensors"))
    print("policy sums", [round(float(x), 4) for x in tensors["policy_logps"]])
    print("reference sums", [round(float(x), 4) for x in tensors["ref_logps"]])
    write_trl_losses(out_dir)


if __name__ == "__main__":
    main()
