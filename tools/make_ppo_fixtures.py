"""An independent reference for MA-PPO's advantages, returns and losses (PyTorch, float64),
written from the spec (shared/spec/ma-rlhf.md §6.4-§6.6, §8) without looking at the C code.
Writes tests/fixtures/ppo/cases.json for tests/test_ppo_math.c:
  inputs: logp_old, logp_ref, logp_new, values_old, values_new, score, segment lengths,
          config (kl_coef, reward_clip, gamma, lambda, value_function, macro_reward, ratio, clips)
  outputs: token rewards, advantages, returns, policy loss, value loss (both divided by
           N = R tokens), and their gradients d loss / d logp_new and d loss / d values_new.
usage: .venv-tools/bin/python tools/make_ppo_fixtures.py
"""
import json
import os
import random

import torch


def weights(kind, m):
    if kind == "equal":
        return [1.0 / m] * m
    if kind == "position":
        w = [1.0 / (i + 1) for i in range(m)]
        return [x / sum(w) for x in w]
    return [1.0 if i == m - 1 else 0.0 for i in range(m)]  # unit: the last token


def reference(case):
    c = case["config"]
    R = len(case["logp_old"])
    lo, lr_, ln = (torch.tensor(case[k], dtype=torch.float64) for k in ("logp_old", "logp_ref", "logp_new"))
    vo = torch.tensor(case["values_old"], dtype=torch.float64)
    vn = torch.tensor(case["values_new"], dtype=torch.float64, requires_grad=True)
    ln = ln.clone().requires_grad_()
    rewards = (-c["kl_coef"] * (lo - lr_)).tolist()
    score = max(-c["reward_clip"], min(c["reward_clip"], case["score"]))
    rewards[-1] += score
    segs = case["segments"]
    # aggregate per macro action
    mv, mr, pos = [], [], 0
    for m in segs:
        if m == 0:
            mv.append(0.0), mr.append(0.0)
            continue
        w = weights(c["value_function"], m)
        mv.append(sum(w[i] * vo[pos + i].item() for i in range(m)))
        rw = [1.0] * m if c["macro_reward"] == "sum" else w
        mr.append(sum(rw[i] * rewards[pos + i] for i in range(m)))
        pos += m
    adv_macro, ret_macro = [0.0] * len(segs), [0.0] * len(segs)
    next_v, next_a = 0.0, 0.0
    for s in reversed(range(len(segs))):
        delta = mr[s] + c["gamma"] * next_v - mv[s]
        a = delta + c["gamma"] * c["lambda"] * next_a
        adv_macro[s], ret_macro[s] = a, a + mv[s]
        next_v, next_a = mv[s], a
    adv, ret = [], []
    for s, m in enumerate(segs):
        adv += [adv_macro[s]] * m
        ret += [ret_macro[s]] * m
    A = torch.tensor(adv, dtype=torch.float64)
    G = torch.tensor(ret, dtype=torch.float64)
    # policy loss
    if c["ratio"] == "macro":
        parts, pos = [], 0
        for m in segs:
            lr_sum = (ln[pos:pos + m] - lo[pos:pos + m]).sum()
            parts.append(torch.exp(lr_sum).repeat(m))
            pos += m
        ratio = torch.cat(parts)
    else:
        ratio = torch.exp(ln - lo)
    eps = c["clip_ratio"]
    pg = torch.max(-A * ratio, -A * torch.clamp(ratio, 1 - eps, 1 + eps)).sum() / R
    pg.backward()
    vc = torch.clamp(vn, vo - c["value_clip"], vo + c["value_clip"])
    vl = (0.5 * torch.max((vn - G) ** 2, (vc - G) ** 2)).sum() / R
    vl.backward()
    case["expected"] = {"rewards": rewards, "advantages": adv, "returns": ret, "policy_loss": pg.item(),
                        "value_loss": vl.item(), "dlogp": ln.grad.tolist(), "dvalues": vn.grad.tolist()}


rng = random.Random(7)
cases = []
for index in range(40):
    R = rng.choice([1, 2, 4, 7, 13, 20])
    # a segmentation: positive lengths, sometimes a zero-length one before the last token
    segs, left = [], R - 1 if R > 1 else R
    while left > 0:
        m = min(left, rng.choice([1, 2, 3, 5]))
        segs.append(m)
        left -= m
    if R > 1:
        if rng.random() < 0.3:
            segs.append(0)
        segs.append(1)
    config = {"kl_coef": rng.choice([0.0, 0.05, 0.1]), "reward_clip": 2.5, "gamma": rng.choice([1.0, 0.99]),
              "lambda": rng.choice([0.95, 1.0]), "value_function": rng.choice(["equal", "position", "unit"]),
              "macro_reward": rng.choice(["mean", "sum"]), "ratio": rng.choice(["per-token", "macro"]),
              "clip_ratio": 0.2, "value_clip": 0.2}
    logp_old = [-rng.random() * 4 for _ in range(R)]
    case = {"config": config, "segments": segs, "logp_old": logp_old,
            "logp_ref": [x + rng.gauss(0, 0.3) for x in logp_old],
            "logp_new": [x + rng.gauss(0, 0.25) for x in logp_old],
            "values_old": [rng.gauss(0, 1) for _ in range(R)],
            "score": rng.gauss(0, 2)}
    case["values_new"] = [v + rng.gauss(0, 0.3) for v in case["values_old"]]
    reference(case)
    cases.append(case)
path = os.path.join(os.path.dirname(__file__), "..", "tests/fixtures/ppo/cases.json")
with open(path, "w") as f:
    json.dump(cases, f)
print("wrote", path, len(cases), "cases")
