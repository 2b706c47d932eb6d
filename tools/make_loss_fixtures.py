"""Writes tests/fixtures/losses/losses.json: the SFT and reward-model losses and their
gradients computed by PyTorch autograd in float64 on random inputs, for tests/test_losses.c.
  sft:      loss = -sum(mask * logp) / count                       -> d loss / d logp
  sft_dft:  TRL's loss_type "dft": -sum(mask * logp * exp(logp).detach()) / count
  pairwise: loss = mean(-logsigmoid(chosen - rejected - margin))   -> d / d chosen, d / d rejected
  listwise: Plackett-Luce, K responses best first, mean over rows  -> d / d scores
  dschat:   DeepSpeed-Chat token span: mean over [d, e) of -logsigmoid(c_t - r_t), per pair,
            then mean over pairs                                    -> d / d values
usage: .venv-tools/bin/python tools/make_loss_fixtures.py
"""
import json
import os

import torch

torch.manual_seed(0)
out = {}

logp = (-torch.rand(3, 7, dtype=torch.float64) * 5).requires_grad_()
mask = (torch.rand(3, 7) > 0.4).double()
loss = -(mask * logp).sum() / mask.sum()
loss.backward()
out["sft"] = {"logp": logp.detach().tolist(), "mask": mask.tolist(), "loss": loss.item(), "dlogp": logp.grad.tolist()}

chosen = (torch.randn(6, dtype=torch.float64) * 2).requires_grad_()
rejected = (torch.randn(6, dtype=torch.float64) * 2).requires_grad_()
margin = torch.rand(6, dtype=torch.float64)
for name, m in (("pairwise", torch.zeros(6, dtype=torch.float64)), ("margin", margin)):
    chosen.grad = rejected.grad = None
    loss = -torch.nn.functional.logsigmoid(chosen - rejected - m).mean()
    loss.backward()
    out[name] = {"chosen": chosen.detach().tolist(), "rejected": rejected.detach().tolist(), "margin": m.tolist(),
                 "loss": loss.item(), "d_chosen": chosen.grad.tolist(), "d_rejected": rejected.grad.tolist()}

scores = (torch.randn(5, 4, dtype=torch.float64) * 3).requires_grad_()
K = scores.shape[1]
terms = [scores[:, k] - torch.logsumexp(scores[:, k:], dim=1) for k in range(K - 1)]
loss = -torch.stack(terms, 1).sum(1).mean()
loss.backward()
out["listwise"] = {"scores": scores.detach().tolist(), "loss": loss.item(), "d_scores": scores.grad.tolist()}

T, pad = 10, 0
pairs = []
chosen_ids = [[5, 6, 7, 8, 9, 0, 0, 0, 0, 0], [5, 6, 7, 1, 0, 0, 0, 0, 0, 0], [3, 4, 4, 4, 0, 0, 0, 0, 0, 0]]
rejected_ids = [[5, 6, 2, 0, 0, 0, 0, 0, 0, 0], [5, 6, 7, 1, 9, 9, 9, 0, 0, 0], [3, 4, 4, 4, 0, 0, 0, 0, 0, 0]]
cv = (torch.randn(3, T, dtype=torch.float64)).requires_grad_()
rv = (torch.randn(3, T, dtype=torch.float64)).requires_grad_()
losses, spans = [], []
for i in range(3):
    c, r = chosen_ids[i], rejected_ids[i]
    c_end = c.index(pad) if pad in c else T
    if c == r:
        d, e = c_end - 1, c_end
    else:
        r_end = r.index(pad) if pad in r else T
        e = max(c_end, r_end)
        d = next(t for t in range(T) if c[t] != r[t])
    spans.append([d, e])
    losses.append(-torch.nn.functional.logsigmoid(cv[i, d:e] - rv[i, d:e]).mean())
loss = torch.stack(losses).mean()
loss.backward()
out["dschat"] = {"chosen_ids": chosen_ids, "rejected_ids": rejected_ids, "pad": pad, "spans": spans,
                 "chosen_values": cv.detach().tolist(), "rejected_values": rv.detach().tolist(), "loss": loss.item(),
                 "d_chosen_values": cv.grad.tolist(), "d_rejected_values": rv.grad.tolist()}

# Drawn last, so the cases above keep their values.
logp = (-torch.rand(3, 7, dtype=torch.float64) * 3).requires_grad_()
mask = (torch.rand(3, 7) > 0.4).double()
per_token_loss = -logp * logp.exp().detach()  # TRL's SFTTrainer.compute_loss with loss_type "dft"
loss = (per_token_loss * mask).sum() / mask.sum()
loss.backward()
out["sft_dft"] = {"logp": logp.detach().tolist(), "mask": mask.tolist(), "loss": loss.item(),
                  "dlogp": logp.grad.tolist()}

path = os.path.join(os.path.dirname(__file__), "..", "tests/fixtures/losses/losses.json")
with open(path, "w") as f:
    json.dump(out, f, indent=1)
print("wrote", path)
