"""Reference values of the critic-free advantages (rl/advantage.c group_advantages), computed
the way TRL 1.12 computes them, with TRL's own nanstd (developers only; CI never runs Python):
  GRPO (GRPOTrainer, scale_rewards="group"): (r - group mean) / (nanstd(group) + 1e-4)
  Dr. GRPO (GRPOTrainer, scale_rewards="none"): r - group mean
  RLOO (RLOOTrainer): r - (group sum - r) / (G - 1)
and OPO as verl computes it (core_algos.compute_opo_outcome_advantage, written out: verl is not
installed): r - (lengths * r).sum() / lengths.sum(), the responses' lengths drawn at random;
with 0 for a group of one (TRL: num_generations 1 gives zeros; verl's baseline 0 there gives r,
but a group of one has nothing to compare with). Writes tests/fixtures/ppo/group_advantages.json:
[{"rewards": [...], "grpo": [...], "rloo": [...], "dr_grpo": [...], "lengths": [...], "opo": [...]}].
usage: .venv-tools/bin/python tools/make_group_advantage_fixtures.py
"""
import json
import os
import random

import torch
from trl.trainer.utils import nanstd

rng = random.Random(11)
length_rng = random.Random(12)  # its own stream: the rewards stay what they were
cases = []
for G in [1, 2, 2, 3, 4, 4, 5, 8, 16]:
    rewards = torch.tensor([rng.gauss(0, 2) for _ in range(G)], dtype=torch.float64)
    if G == 4 and not any(c["rewards"] and len(c["rewards"]) == 4 for c in cases):
        rewards = torch.full((4,), 1.5, dtype=torch.float64)  # equal rewards: advantage 0
    grouped = rewards.view(1, G)
    if G > 1:
        mean = grouped.mean(dim=1, keepdim=True)
        grpo = ((grouped - mean) / (nanstd(grouped, dim=1).view(1, 1) + 1e-4)).view(-1)
        rloo = (grouped - (grouped.sum(dim=1, keepdim=True) - grouped) / (G - 1)).view(-1)
        dr_grpo = (grouped - mean).view(-1)
    else:
        grpo = rloo = dr_grpo = torch.zeros(1, dtype=torch.float64)
    lengths = torch.tensor([length_rng.randint(1, 40) for _ in range(G)], dtype=torch.float64)
    if G > 1:
        opo = rewards - (lengths * rewards).sum() / lengths.sum()
    else:
        opo = torch.zeros(1, dtype=torch.float64)
    cases.append({"rewards": rewards.tolist(), "grpo": grpo.tolist(), "rloo": rloo.tolist(), "dr_grpo": dr_grpo.tolist(),
                  "lengths": [int(x) for x in lengths.tolist()], "opo": opo.tolist()})
path = os.path.join(os.path.dirname(__file__), "..", "tests/fixtures/ppo/group_advantages.json")
with open(path, "w") as f:
    json.dump(cases, f)
print("wrote", path, len(cases), "groups")
