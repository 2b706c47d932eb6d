"""Reference values of the pair losses of train/losses.c (dpo_pair_loss_from_sums), computed
with the formulas of TRL 1.12's DPOTrainer._compute_loss (one loss type, weight 1) in float64
(developers only; CI never runs Python). The log-ratios a = chosen_logps - ref_chosen_logps
and b = rejected_logps - ref_rejected_logps (sums over the response tokens) become scores by
f_divergence_type:
    reverse_kl        s(u) = u
    forward_kl        s(u) = 1 - exp(-u)
    js_divergence     s(u) = log 2 + logsigmoid(u)
    alpha_divergence  s(u) = (exp(min((alpha - 1) u, 80)) - 1) / (alpha - 1)
and with h = s(a) - s(b) (IPO and sigmoid_norm: s(a) / n_chosen - s(b) / n_rejected, the
token counts of the two responses):
    sigmoid       -logsigmoid(beta h)          (TRL 1.12's "sigmoid" has no label smoothing)
    robust        (-(1 - eps) logsigmoid(beta h) + eps logsigmoid(-beta h)) / (1 - 2 eps)
    exo_pair      qw (log qw - log1p(-eps)) + ql (log ql - log eps), qw = sigmoid(beta h),
                  log qw = logsigmoid(beta h), ql and log ql the same of -beta h
    hinge         relu(1 - beta h)
    ipo           (h - 1 / (2 beta))^2
    sigmoid_norm  -logsigmoid(beta h)
    nca_pair      -logsigmoid(beta a) - 0.5 logsigmoid(-beta a) - 0.5 logsigmoid(-beta b)
    bco_pair      -logsigmoid(beta a) - logsigmoid(-beta b)
    sppo_hard     (a - 0.5 / beta)^2 + (b + 0.5 / beta)^2
    apo_zero      1 - sigmoid(beta a) + sigmoid(beta b)
    apo_down      sigmoid(beta a) + 1 - sigmoid(beta h)
    discopop      -logsigmoid(beta h) (1 - m) + exp(-beta h) m, m = sigmoid(beta h / tau)
The gradients d loss / d chosen_logps and d loss / d rejected_logps come from torch autograd.
The other losses use a and b themselves (TRL allows them reverse_kl only).
Writes tests/fixtures/dpo/loss_types.json: [{"loss_type", "f_divergence", "f_alpha", "beta",
"label_smoothing", "discopop_tau", "logps": [chosen, rejected, ref_chosen, ref_rejected],
"tokens": [chosen, rejected], "loss", "grad": [d chosen, d rejected]}].
And tests/fixtures/dpo/loss_combinations.json, several loss types at once as TRL 1.12 sums them
(loss_type a list, loss_weights: the sum over k of weight_k times loss type k's per-pair loss;
TRL's "sft" term needs the tokens, tests/test_dpo.c checks it): the same fields with
"loss_type" a list and "loss_weights".
usage: .venv-tools/bin/python tools/make_dpo_loss_fixtures.py
"""
import json
import math
import os
import random

import torch
import torch.nn.functional as F

rng = random.Random(7)


def scores(divergence, alpha, logratios):
    if divergence == "forward_kl":
        return 1 - torch.exp(-logratios)
    if divergence == "js_divergence":
        return math.log(2) + F.logsigmoid(logratios)
    if divergence == "alpha_divergence" and abs(alpha - 1.0) >= 1e-6:
        t = torch.clamp((alpha - 1.0) * logratios, max=80.0)
        return (torch.exp(t) - 1.0) / (alpha - 1.0)
    return logratios


def trl_loss(loss_type, divergence, alpha, beta, eps, tau, tokens, chosen_logps, rejected_logps, ref_chosen_logps,
             ref_rejected_logps):
    chosen_logratios = chosen_logps - ref_chosen_logps
    rejected_logratios = rejected_logps - ref_rejected_logps
    chosen_scores = scores(divergence, alpha, chosen_logratios)
    rejected_scores = scores(divergence, alpha, rejected_logratios)
    delta_score = chosen_scores - rejected_scores
    if loss_type in ("ipo", "sigmoid_norm"):
        delta_score = chosen_scores / tokens[0] - rejected_scores / tokens[1]
    if loss_type in ("sigmoid", "sigmoid_norm"):
        return -F.logsigmoid(beta * delta_score)
    if loss_type == "hinge":
        return torch.relu(1 - beta * delta_score)
    if loss_type == "ipo":
        return (delta_score - 1 / (2 * beta)) ** 2
    if loss_type == "exo_pair":
        epsilon = torch.tensor(eps, dtype=torch.float64)
        qw, log_qw = torch.sigmoid(beta * delta_score), F.logsigmoid(beta * delta_score)
        ql, log_ql = torch.sigmoid(-beta * delta_score), F.logsigmoid(-beta * delta_score)
        return qw * (log_qw - torch.log1p(-epsilon)) + ql * (log_ql - torch.log(epsilon))
    if loss_type == "nca_pair":
        chosen_rewards, rejected_rewards = beta * chosen_logratios, beta * rejected_logratios
        return -F.logsigmoid(chosen_rewards) - 0.5 * F.logsigmoid(-chosen_rewards) - 0.5 * F.logsigmoid(-rejected_rewards)
    if loss_type == "robust":
        clean = -(1 - eps) * F.logsigmoid(beta * delta_score)
        flipped = -eps * F.logsigmoid(-beta * delta_score)
        return (clean - flipped) / (1 - 2 * eps)
    if loss_type == "bco_pair":
        return -F.logsigmoid(beta * chosen_logratios) - F.logsigmoid(-beta * rejected_logratios)
    if loss_type == "sppo_hard":
        return (chosen_logratios - 0.5 / beta) ** 2 + (rejected_logratios + 0.5 / beta) ** 2
    if loss_type == "apo_zero":
        return 1 - torch.sigmoid(beta * chosen_logratios) + torch.sigmoid(beta * rejected_logratios)
    if loss_type == "apo_down":
        return torch.sigmoid(beta * chosen_logratios) + 1 - torch.sigmoid(beta * (chosen_logratios - rejected_logratios))
    if loss_type == "discopop":
        logits = delta_score * beta
        modulation = torch.sigmoid(logits / tau)
        return -F.logsigmoid(logits) * (1 - modulation) + torch.exp(-logits) * modulation
    raise ValueError(loss_type)


def case(loss_type, beta, eps, tau, logps, tokens, divergence="reverse_kl", alpha=0.5):
    policy = torch.tensor(logps[:2], dtype=torch.float64, requires_grad=True)
    reference = torch.tensor(logps[2:], dtype=torch.float64)
    loss = trl_loss(loss_type, divergence, alpha, beta, eps, tau, tokens, policy[0], policy[1], reference[0],
                    reference[1])
    loss.backward()
    return {"loss_type": loss_type, "f_divergence": divergence, "f_alpha": alpha, "beta": beta,
            "label_smoothing": eps, "discopop_tau": tau, "logps": logps, "tokens": tokens, "loss": loss.item(),
            "grad": policy.grad.tolist()}


def combined_case(loss_types, weights, beta, eps, logps, tokens, divergence="reverse_kl", alpha=0.5):
    policy = torch.tensor(logps[:2], dtype=torch.float64, requires_grad=True)
    reference = torch.tensor(logps[2:], dtype=torch.float64)
    loss = 0.0
    for loss_type, weight in zip(loss_types, weights, strict=True):
        loss = loss + weight * trl_loss(loss_type, divergence, alpha, beta, eps, 0.05, tokens, policy[0], policy[1],
                                        reference[0], reference[1])
    loss.backward()
    return {"loss_type": loss_types, "loss_weights": weights, "f_divergence": divergence, "f_alpha": alpha,
            "beta": beta, "label_smoothing": eps, "discopop_tau": 0.05, "logps": logps, "tokens": tokens,
            "loss": loss.item(), "grad": policy.grad.tolist()}


def write_cases(name, cases):
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "dpo", name)
    with open(path, "w") as out:
        out.write("[\n" + ",\n".join(json.dumps(c) for c in cases) + "\n]\n")  # a case per line
    print(f"wrote {os.path.relpath(path)}: {len(cases)} cases")


def random_pair():
    """Sums of a few dozen tokens' log-probs, the reference near the policy, and the counts."""
    chosen, rejected = rng.uniform(-60, -5), rng.uniform(-60, -5)
    logps = [chosen, rejected, chosen + rng.gauss(0, 3), rejected + rng.gauss(0, 3)]
    return [round(x, 6) for x in logps], [rng.randint(3, 40), rng.randint(3, 40)]


def main():
    types = ["sigmoid", "sigmoid_norm", "robust", "exo_pair", "hinge", "ipo", "nca_pair", "bco_pair", "sppo_hard",
             "apo_zero", "apo_down", "discopop"]
    cases = []
    for loss_type in types:
        eps = {"robust": 0.2, "exo_pair": 1e-3}.get(loss_type, 0.0)
        for beta in (0.1, 0.5, 2.0):
            for _ in range(3):
                cases.append(case(loss_type, beta, eps, 0.05, *random_pair()))
        # A tie (h = 0).
        cases.append(case(loss_type, 0.1, {"robust": 0.1, "exo_pair": 0.05}.get(loss_type, 0.0), 0.05,
                          [-10.0, -12.0, -10.0, -12.0], [5, 7]))
    # DiscoPOP's blend neither end (|beta h| near tau).
    cases.append(case("discopop", 1.0, 0.0, 0.05, [-10.0, -12.0, -10.02, -12.01], [4, 6]))
    cases.append(case("discopop", 0.5, 0.0, 0.2, [-10.0, -12.0, -10.3, -11.9], [4, 6]))
    # f-DPO: every divergence with every loss that has a form, alpha 0.5 and 1.5 (and 1: reverse KL).
    for loss_type in ["sigmoid", "sigmoid_norm", "hinge", "ipo", "exo_pair", "robust", "discopop"]:
        eps = {"robust": 0.2, "exo_pair": 1e-3}.get(loss_type, 0.0)
        for divergence, alpha in [("forward_kl", 0.5), ("js_divergence", 0.5), ("alpha_divergence", 0.5),
                                  ("alpha_divergence", 1.5), ("alpha_divergence", 1.0)]:
            for beta in (0.1, 1.0):
                logps, tokens = random_pair()
                cases.append(case(loss_type, beta, eps, 0.05, logps, tokens, divergence, alpha))
    # alpha's exponent held at 80 (a flat score): (alpha - 1) u = 3 x 40.
    cases.append(case("sigmoid", 0.1, 0.0, 0.05, [-5.0, -30.0, -45.0, -31.0], [5, 7], "alpha_divergence", 4.0))
    write_cases("loss_types.json", cases)
    # Combinations (drawn after the single types, so loss_types.json does not change): the MPO
    # recipe's pair losses, a per-token-mean loss with per-sum ones, a repeated type, weights
    # of 0, and a divergence with the losses that take one.
    combinations = []
    for loss_types, weights, eps, divergence in [
            (["sigmoid", "bco_pair"], [0.8, 0.2], 0.0, "reverse_kl"),
            (["ipo", "sigmoid", "nca_pair"], [0.5, 1.0, 2.0], 0.0, "reverse_kl"),
            (["robust", "exo_pair", "apo_zero", "sppo_hard"], [1.0, 0.3, 0.7, 0.05], 0.2, "reverse_kl"),
            (["sigmoid", "sigmoid"], [0.25, 0.5], 0.0, "reverse_kl"),
            (["hinge", "discopop", "apo_down"], [0.0, 1.5, 1.0], 0.0, "reverse_kl"),
            (["sigmoid", "sigmoid_norm", "ipo"], [1.0, 0.5, 0.25], 0.0, "js_divergence"),
            (["robust", "hinge"], [0.6, 0.4], 0.1, "forward_kl")]:
        for beta in (0.1, 1.0):
            for _ in range(2):
                combinations.append(combined_case(loss_types, weights, beta, eps, *random_pair(), divergence))
    write_cases("loss_combinations.json", combinations)


if __name__ == "__main__":
    main()
