"""Reference values of the critic-free policy losses of rl/ppo_loss.c and of GRPO's batch
scaling (rl/advantage.c rollout_group_advantages), computed with the formulas of TRL 1.12's
GRPOTrainer (developers only; CI never runs Python). From trl/trainer/grpo_trainer.py:
  _compute_loss: log_ratio = logp - old; "sequence" level: (log_ratio * mask).sum(-1) /
      mask.sum(-1), one per response; coef_1 = exp(that)
    grpo: -min(coef_1 A, clamp(coef_1, 1 - eps_low, 1 + eps_high) A)
    cispo: -clamp(coef_1, max=epsilon_high).detach() * A * logp
    sapo: -(sigmoid(tau (coef_1 - 1)) * 4 / tau) A, tau = sapo_temperature_pos if A > 0 else _neg
    luspo: grpo's per-token loss, summed over the response's tokens (not averaged)
    vespo: -phi A logp averaged over the tokens, phi = GRPOTrainer.get_gamma_weights (called
      here): w = exp(clamp(sum_t clamp(log_ratio, -20, 20), log 1e-8, 20)), phi = exp(lambda +
      k log w - lambda w), no gradient, (k, lambda) = (2, 3) if A >= 0 else (3, 2)
  per-response token mean of the per-token loss (loss_type "grpo"/"sapo"; one response here)
  _generate_and_score_completions, scale_rewards="batch": (r - group mean) / (nanstd(r) + 1e-4)
  and from TRL 1.16: delta (grpo's coef_1 clamped at it before the min) and top_entropy_quantile
  (get_high_entropy_mask: the per-token loss times entropy >= torch.quantile(entropies, 1 - rho)),
  the importance sampling of generation's log-probs and off-policy masking, the bias-corrected
  KL term, the experimental GMPOTrainer's loss, and verl's KL-Cov (below)
The gradients d loss / d logp_new come from torch autograd in float64.
Writes tests/fixtures/ppo/grpo_losses.json: {"losses": [{"loss_type", "level", "epsilon_low",
"epsilon_high", "cispo_max", "tau_pos", "tau_neg", "logp_old", "logp_new", "advantage", "loss",
"grad", "delta" (0: none), "entropy_quantile" (1: none), "entropies", "entropy_threshold"}],
"batch_scaling": [{"rewards", "groups", "advantages"}], "rollout_correction": [{"mode", "clip_min" (0: none),
"clip_max", "threshold" (-1: none), "epsilon_low", "epsilon_high", "logp_old", "logp_sampling", "logp_new",
"advantage", "weights", "kept", "loss", "grad"}], "kl_bias_correction": [{"level", "beta", "epsilon_low",
"epsilon_high", "logp_old", "logp_ref", "logp_new", "advantage", "loss", "grad"}], "gmpo": [{"epsilon_low",
"epsilon_high", "logp_old", "logp_new", "advantage", "loss", "grad"}], "kl_cov": [{"lengths", "kl_cov_ratio",
"ppo_kl_coef", "logp_old", "logp_new", "advantages", "selected", "loss", "grad"} (per response, lists)],
"gdpo": [{"parts" (per source, per response), "weights", "groups", "rewards", "advantages"}],
"clip_cov": [{"lengths", "clip_cov_ratio", "lower", "upper", "epsilon_low", "epsilon_high", "logp_old", "logp_new",
"advantages", "keys", "candidates", "selected", "loss", "grad"} (per response, lists)], "gpg": [{"rewards", "groups",
"alpha", "advantages", "logp_old", "logp_new", "advantage", "loss", "grad"}], "gmpo_entropy": [{"epsilon_low",
"epsilon_high", "logp_old", "logp_new", "advantage", "entropies", "entropy_quantile", "entropy_threshold", "kept",
"loss", "grad"}], "vespo_correction": [{"mode", "clip_min" (0: none), "clip_max", "logp_old", "logp_sampling",
"logp_new", "advantage", "phi", "loss", "grad"}], "gspo_token": [{"loss_type", "beta", "epsilon_low",
"epsilon_high", "cispo_max", "tau_pos", "tau_neg", "logp_old", "logp_ref", "logp_new", "advantages" (per token),
"loss", "grad"}]}.
usage: .venv-tools/bin/python tools/make_grpo_loss_fixtures.py
"""
import json
import math
import os
import random

import torch
from trl.trainer.grpo_trainer import GRPOTrainer
from trl.trainer.utils import nanstd

rng = random.Random(23)


def log_importance_weights(log_ratio, mask, level):
    """TRL's _compute_loss: the token log-ratios ("token"), or their mean over the response
    ("sequence", GSPO's importance_sampling_level), [B, 1]."""
    if level == "token":
        return log_ratio
    return ((log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).unsqueeze(-1)


def policy_case(loss_type, level, advantage, R, spread, delta=None, entropy_quantile=None):
    """One response of R tokens: TRL's per-token loss and its reduction for `loss_type`; with
    `delta` (TRL 1.16's two-sided clipping) grpo's coef_1 capped at it; with `entropy_quantile`
    (its top_entropy_quantile) the tokens below that quantile of random entropies masked out of
    the per-token loss (get_high_entropy_mask's rule: torch.quantile at 1 - rho, kept when >=)."""
    eps_low, eps_high, cispo_max, tau_pos, tau_neg = 0.2, 0.28, 1.1, 1.0, 1.05
    vespo = (2.0, 3.0, 3.0, 2.0)  # k_pos, lambda_pos, k_neg, lambda_neg (TRL's defaults)
    old = torch.tensor([rng.uniform(-4.0, -0.2) for _ in range(R)], dtype=torch.float64)
    new = (old + torch.tensor([rng.gauss(0, spread) for _ in range(R)], dtype=torch.float64)).requires_grad_()
    mask = torch.ones(1, R, dtype=torch.float64)
    per_token_logps, old_per_token_logps = new.view(1, R), old.view(1, R)
    advantages = torch.tensor([[advantage]], dtype=torch.float64)
    log_ratio = per_token_logps - old_per_token_logps
    coef_1 = torch.exp(log_importance_weights(log_ratio, mask, level))
    if loss_type == "cispo":
        clamped_ratios = torch.clamp(coef_1, max=cispo_max).detach()
        per_token_loss = -clamped_ratios * advantages * per_token_logps
    elif loss_type == "vespo":
        phi = GRPOTrainer.get_gamma_weights(advantages=advantages, log_ratio_per_token=log_ratio, mask=mask,
                                            importance_sampling_ratio=None, k_pos=vespo[0], lambda_pos=vespo[1],
                                            k_neg=vespo[2], lambda_neg=vespo[3])
        per_token_loss = -phi * advantages * per_token_logps
    elif loss_type in ("grpo", "luspo"):
        coef_2 = torch.clamp(coef_1, 1 - eps_low, 1 + eps_high)
        if delta is not None:
            coef_1 = torch.clamp(coef_1, max=delta)
        per_token_loss = -torch.min(coef_1 * advantages, coef_2 * advantages)
    else:  # sapo
        temperatures = torch.where(advantages > 0, torch.tensor(tau_pos), torch.tensor(tau_neg)).to(torch.float64)
        per_token_loss = -(torch.sigmoid(temperatures * (coef_1 - 1)) * 4 / temperatures) * advantages
    entropies = None
    if entropy_quantile is not None:
        entropies = torch.tensor([[rng.uniform(0.0, 3.0) for _ in range(R)]], dtype=torch.float32)
        threshold = torch.quantile(entropies[mask.bool()].float(), 1 - entropy_quantile)
        entropy_mask = ((entropies * mask.float()) >= threshold) & mask.bool()
        per_token_loss = per_token_loss * entropy_mask
    if loss_type == "luspo":
        loss = (per_token_loss * mask).sum(-1).mean()
    else:  # grpo, sapo: the per-response token mean; cispo, vespo: over the batch's tokens (one response)
        loss = ((per_token_loss * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()
    loss.backward()
    return {"loss_type": loss_type, "level": level, "epsilon_low": eps_low, "epsilon_high": eps_high,
            "cispo_max": cispo_max, "tau_pos": tau_pos, "tau_neg": tau_neg, "vespo": list(vespo),
            "token_sum": loss_type == "luspo", "logp_old": old.tolist(),
            "logp_new": new.detach().tolist(), "advantage": advantage, "loss": loss.item(), "grad": new.grad.tolist(),
            "delta": delta or 0.0, "entropy_quantile": entropy_quantile if entropy_quantile is not None else 1.0,
            "entropies": entropies[0].tolist() if entropies is not None else [],
            "entropy_threshold": threshold.item() if entropies is not None else 0.0}


losses = []
for loss_type in ["grpo", "cispo", "sapo"]:
    for level in ["token", "sequence"]:
        for advantage in [1.3, -0.7]:
            for R, spread in [(1, 0.05), (5, 0.3), (12, 0.15)]:
                losses.append(policy_case(loss_type, level, advantage, R, spread))

batch_scaling = []
for sizes in [[4, 4], [2, 3, 4], [1, 4], [8, 8, 8]]:
    groups = [g for g, n in enumerate(sizes) for _ in range(n)]
    rewards = torch.tensor([rng.gauss(0.5, 1.5) for _ in groups], dtype=torch.float64)
    means = torch.tensor([rewards[[i for i, h in enumerate(groups) if h == g]].mean().item() for g in groups],
                         dtype=torch.float64)
    # TRL's group mean of a one-response group is the response's reward: advantage 0.
    std_rewards = nanstd(rewards).expand_as(rewards)
    advantages = (rewards - means) / (std_rewards + 1e-4)
    batch_scaling.append({"rewards": rewards.tolist(), "groups": groups, "advantages": advantages.tolist()})

# Drawn after the cases above so that their values stay what they were.
for loss_type, levels in [("luspo", ["token", "sequence"]), ("vespo", ["token"])]:
    for level in levels:
        for advantage in [1.3, -0.7]:
            for R, spread in [(1, 0.05), (5, 0.3), (12, 0.15)]:
                losses.append(policy_case(loss_type, level, advantage, R, spread))

# TRL 1.16's delta (two-sided clipping) and top_entropy_quantile, drawn last for the same reason.
for advantage in [1.3, -0.7]:
    for R, spread in [(5, 0.3), (12, 0.4)]:
        losses.append(policy_case("grpo", "token", advantage, R, spread, delta=1.35))
        losses.append(policy_case("grpo", "sequence", advantage, R, spread, delta=1.35))
        losses.append(policy_case("grpo", "token", advantage, R, spread, entropy_quantile=0.2))
        losses.append(policy_case("cispo", "token", advantage, R, spread, entropy_quantile=0.5))



def one_response(R, new_spread, between_spread=None, shift=0.0):
    """One response of R tokens as the cases below draw it, [1, R] each: old log-probs uniform in
    [-4, -0.2]; then, when between_spread is given, other log-probs (a reference's, a sampler's)
    old + N(0, between_spread); then the new log-probs old + N(shift, new_spread), requiring grad;
    and the all-ones mask. Returns (old, between or None, new, mask), drawn in that order."""
    old = torch.tensor([[rng.uniform(-4.0, -0.2) for _ in range(R)]], dtype=torch.float64)
    between = None
    if between_spread is not None:
        between = old + torch.tensor([[rng.gauss(0, between_spread) for _ in range(R)]], dtype=torch.float64)
    new = (old + torch.tensor([[rng.gauss(shift, new_spread) for _ in range(R)]], dtype=torch.float64)).requires_grad_()
    return old, between, new, torch.ones(1, R, dtype=torch.float64)


def sampling_ratio(mode, clip_min, clip_max, old, sampling, mask):
    """TRL 1.16's vllm_importance_sampling_ratio (_generate_and_score_completions): exp of old -
    sampling per token, or of its sum over the response for the sequence modes; truncated by
    clamp(min, max) or set to 0 outside [min, max]."""
    per_token_logps_diff = (old - sampling) * mask
    logps_diff = per_token_logps_diff.sum(dim=-1, keepdim=True) if mode.startswith("sequence") else per_token_logps_diff
    ratio = torch.exp(logps_diff)
    if mode.endswith("truncate"):
        return torch.clamp(ratio, min=clip_min, max=clip_max)
    low = clip_min if clip_min is not None else -math.inf
    return ratio.masked_fill((ratio < low) | (ratio > clip_max), value=0.0)


def rollout_correction_case(mode, clip_min, clip_max, advantage, R, threshold):
    """One response of R tokens sampled by a generation engine whose log-probs (`sampling`) differ
    from the training forward's old ones: TRL 1.16's vllm_importance_sampling ratio
    (sampling_ratio), GRPOTrainer.get_off_policy_mask (called here) with the sampling log-probs, and _compute_loss's
    grpo per-token loss times both, averaged over the tokens, with its gradient."""
    eps_low, eps_high = 0.2, 0.28
    old, sampling, new, mask = one_response(R, 0.3, between_spread=0.8)
    advantages = torch.tensor([[advantage]], dtype=torch.float64)
    ratio = sampling_ratio(mode, clip_min, clip_max, old, sampling, mask)
    keep = torch.ones(1, 1, dtype=torch.float64)
    if threshold is not None:
        keep = GRPOTrainer.get_off_policy_mask(advantages=advantages, per_token_logps=new, sampling_per_token_logps=sampling,
                                               mask=mask, off_policy_threshold=threshold)
    coef_1 = torch.exp(new - old)
    coef_2 = torch.clamp(coef_1, 1 - eps_low, 1 + eps_high)
    per_token_loss = -torch.min(coef_1 * advantages, coef_2 * advantages) * keep * ratio
    loss = ((per_token_loss * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()
    loss.backward()
    return {"mode": mode, "clip_min": clip_min if clip_min is not None else 0.0, "clip_max": clip_max,
            "threshold": threshold if threshold is not None else -1.0, "epsilon_low": eps_low,
            "epsilon_high": eps_high, "logp_old": old[0].tolist(), "logp_sampling": sampling[0].tolist(),
            "logp_new": new[0].detach().tolist(), "advantage": advantage,
            "weights": ratio.expand(1, R)[0].tolist(), "kept": bool(keep.item() > 0), "loss": loss.item(),
            "grad": new.grad[0].tolist()}


# TRL 1.16's importance sampling of generation's log-probs and off-policy sequence masking,
# drawn after every case above so that their values stay what they were.
rollout_correction = []
for mode in ["token_truncate", "token_mask", "sequence_truncate", "sequence_mask"]:
    for clip_min, clip_max in [(None, 3.0), (0.5, 1.5)]:
        for advantage in [1.3, -0.7]:
            for R, threshold in [(5, None), (12, 0.05)]:
                rollout_correction.append(rollout_correction_case(mode, clip_min, clip_max, advantage, R, threshold))



def kl_bias_case(level, advantage, R, beta):
    """TRL 1.16's grpo loss with its k3 KL term times coef_1 (use_bias_correction_kl, the default):
    per_token_kl = exp(ref - logp) - (ref - logp) - 1, times exp(logp - old) per token or exp of the
    response's mean log-ratio, plus beta times it, averaged over the tokens; gradient by autograd."""
    eps_low, eps_high = 0.2, 0.28
    old, ref, new, mask = one_response(R, 0.3, between_spread=0.4)
    advantages = torch.tensor([[advantage]], dtype=torch.float64)
    log_ratio = new - old
    coef_1 = torch.exp(log_importance_weights(log_ratio, mask, level))
    per_token_kl = torch.exp(ref - new) - (ref - new) - 1
    per_token_kl = per_token_kl * coef_1
    coef_2 = torch.clamp(coef_1, 1 - eps_low, 1 + eps_high)
    per_token_loss = -torch.min(coef_1 * advantages, coef_2 * advantages) + beta * per_token_kl
    loss = ((per_token_loss * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()
    loss.backward()
    return {"level": level, "beta": beta, "epsilon_low": eps_low, "epsilon_high": eps_high,
            "logp_old": old[0].tolist(), "logp_ref": ref[0].tolist(), "logp_new": new[0].detach().tolist(),
            "advantage": advantage, "loss": loss.item(), "grad": new.grad[0].tolist()}


# TRL 1.16's bias-corrected KL term, drawn last for the same reason.
kl_bias_correction = []
for level in ["token", "sequence"]:
    for advantage in [1.3, -0.7]:
        for R in [5, 12]:
            kl_bias_correction.append(kl_bias_case(level, advantage, R, 0.2))



def gmpo_case(advantage, R, spread, eps_low, eps_high):
    """TRL 1.16's experimental GMPOTrainer._compute_loss for one response: the log-ratio clipped to
    [-epsilon, epsilon_high] in log space, one-sided by the advantage's sign (torch.minimum when
    A > 0, torch.maximum otherwise), the exponential of its mean over the tokens, times -A; the mean
    over responses (one here); gradient by autograd."""
    old, _, new, mask = one_response(R, spread)
    advantages = torch.tensor([advantage], dtype=torch.float64)
    log_ratio = new - old
    clamped_log_ratio = torch.clamp(log_ratio, min=-eps_low, max=eps_high)
    advantages_col = advantages.unsqueeze(1)
    clipped_log_ratio = torch.where(advantages_col > 0, torch.minimum(log_ratio, clamped_log_ratio),
                                    torch.maximum(log_ratio, clamped_log_ratio))
    log_importance_weights = (clipped_log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)
    coef = torch.exp(log_importance_weights)
    loss = (-coef * advantages).mean()
    loss.backward()
    return {"epsilon_low": eps_low, "epsilon_high": eps_high, "logp_old": old[0].tolist(),
            "logp_new": new[0].detach().tolist(), "advantage": advantage, "loss": loss.item(),
            "grad": new.grad[0].tolist()}


# TRL 1.16's GMPO, drawn last for the same reason.
gmpo = []
for advantage in [1.3, -0.7]:
    for R, spread in [(1, 0.05), (5, 0.3), (12, 0.6)]:
        for eps_low, eps_high in [(0.4, 0.4), (0.2, 0.3)]:
            gmpo.append(gmpo_case(advantage, R, spread, eps_low, eps_high))



def micro_batch_tensors(lengths, advantage_spread):
    """Random [B, T] old and new log-probs and token advantages of responses of these lengths,
    and their mask (the KL-Cov and Clip-Cov cases)."""
    B, T = len(lengths), max(lengths)
    mask = torch.zeros(B, T, dtype=torch.float64)
    for b, n in enumerate(lengths):
        mask[b, :n] = 1
    old = torch.tensor([[rng.uniform(-4.0, -0.2) for _ in range(T)] for _ in range(B)], dtype=torch.float64)
    new = (old + torch.tensor([[rng.gauss(0, 0.3) for _ in range(T)] for _ in range(B)], dtype=torch.float64))
    new = new.requires_grad_()
    advantages = torch.tensor([[rng.gauss(0, advantage_spread) for _ in range(T)] for _ in range(B)],
                              dtype=torch.float64)
    return B, T, mask, old, new, advantages


def kl_cov_case(lengths, kl_cov_ratio, ppo_kl_coef):
    """verl's compute_policy_loss_kl_cov (core_algos.py, written out: verl is not installed) on one
    micro-batch of responses with these lengths, token-varying advantages: -A ratio, and on the
    max(1, int(n kl_cov_ratio)) tokens of largest (A - mean A)(logp - mean logp) over the valid
    tokens (torch.topk) -A ratio + ppo_kl_coef |logp - old|; token-mean aggregation; autograd."""
    B, T, mask, old, new, advantages = micro_batch_tensors(lengths, 1)
    negative_approx_kl = new - old
    abs_kl = negative_approx_kl.abs()
    ratio = torch.exp(negative_approx_kl)
    pg_losses1 = -advantages * ratio
    pg_losses_kl = -advantages * ratio + ppo_kl_coef * abs_kl
    pg_losses = pg_losses1.clone()
    all_valid = mask > 0
    all_valid_idx = torch.nonzero(all_valid.reshape(-1), as_tuple=True)[0]
    all_valid_adv = advantages[all_valid].detach().reshape(-1)
    all_valid_logp = new[all_valid].detach().reshape(-1)
    cov_lst_all = (all_valid_adv - all_valid_adv.mean()) * (all_valid_logp - all_valid_logp.mean())
    k_percent_nums = max(1, int(len(cov_lst_all) * kl_cov_ratio))
    large_cov_idxs = all_valid_idx[torch.topk(cov_lst_all, k_percent_nums, largest=True).indices]
    rows, cols = large_cov_idxs // T, large_cov_idxs % T
    pg_losses[rows, cols] = pg_losses_kl[rows, cols]
    loss = (pg_losses * mask).sum() / mask.sum()
    loss.backward()
    selected = torch.zeros(B, T, dtype=torch.int64)
    selected[rows, cols] = 1
    return {"lengths": lengths, "kl_cov_ratio": kl_cov_ratio, "ppo_kl_coef": ppo_kl_coef,
            "logp_old": [old[b, :n].tolist() for b, n in enumerate(lengths)],
            "logp_new": [new[b, :n].detach().tolist() for b, n in enumerate(lengths)],
            "advantages": [advantages[b, :n].tolist() for b, n in enumerate(lengths)],
            "selected": [selected[b, :n].tolist() for b, n in enumerate(lengths)], "loss": loss.item(),
            "grad": [new.grad[b, :n].tolist() for b, n in enumerate(lengths)]}


# verl's KL-Cov, drawn last for the same reason.
kl_cov = [kl_cov_case([4, 6, 5], 0.2, 1.0), kl_cov_case([7, 3], 0.0002, 1.0), kl_cov_case([5, 5, 2, 8], 0.1, 0.5)]



def gdpo_case(generations, groups, weights, constant_source=None):
    """TRL 1.16's multi_objective_aggregation="normalize_then_sum" (GRPOTrainer
    _generate_and_score_completions, GDPO), written out on random rewards_per_func
    [groups * generations, sources]: each source normalised within each group by its mean and
    nanstd + 1e-4, the weighted nansum, then (rewards - nanmean) / (nanstd + 1e-4) over the batch.
    With `constant_source`, that source scores every response of the first group alike (its
    normalised score there is 0)."""
    sources = len(weights)
    per_func = torch.tensor([[rng.gauss(0.3 * k, 1.0 + k) for k in range(sources)]
                             for _ in range(groups * generations)], dtype=torch.float64)
    if constant_source is not None:
        per_func[:generations, constant_source] = 2.0
    weight = torch.tensor(weights, dtype=torch.float64)
    grouped = per_func.view(-1, generations, sources)
    mean_k = torch.nanmean(grouped, dim=1, keepdim=True)
    std_k = nanstd(grouped, dim=1, keepdim=True)
    reward_k = ((grouped - mean_k) / (std_k + 1e-4)).view(-1, sources)
    rewards = (reward_k * weight.unsqueeze(0)).nansum(dim=1)
    advantages = (rewards - torch.nanmean(rewards)) / (nanstd(rewards) + 1e-4)
    return {"parts": per_func.t().tolist(), "weights": weights,
            "groups": [g for g in range(groups) for _ in range(generations)], "rewards": rewards.tolist(),
            "advantages": advantages.tolist()}


def clip_cov_case(lengths, clip_cov_ratio, lower, upper, eps_low=0.2, eps_high=0.28):
    """verl's compute_policy_loss_clip_cov (core_algos.py, written out) on one micro-batch of
    responses with these lengths: PPO's clipped term, times 0 on up to max(1, int(n
    clip_cov_ratio)) tokens drawn among those that PPO's clip leaves alone (not pg_losses2 >
    pg_losses1) whose (A - mean A)(logp - mean logp) lies strictly in (lower, upper); token-mean
    aggregation; autograd. verl draws them with torch.randperm; here each token has a uniform key
    and the draw takes the smallest keys (marlhf's way, another uniform subset), so that the
    loss can be checked whatever the draw."""
    B, T, mask, old, new, advantages = micro_batch_tensors(lengths, 1.5)
    keys = torch.tensor([[rng.random() for _ in range(T)] for _ in range(B)], dtype=torch.float64)
    ratio = torch.exp(new - old)
    pg_losses1 = -advantages * ratio
    pg_losses2 = -advantages * torch.clamp(ratio, 1 - eps_low, 1 + eps_high)
    clip_by_origin = (pg_losses2 > pg_losses1) & (mask > 0)
    valid = mask > 0
    mean_adv = advantages[valid].mean()
    mean_logp = new.detach()[valid].mean()
    cov_all = (advantages - mean_adv) * (new.detach() - mean_logp)
    cov_all[~valid] = -torch.inf
    cov_all[clip_by_origin] = -torch.inf
    clip_num = max(int(clip_cov_ratio * mask.sum().item()), 1)
    candidates = (cov_all < upper) & (cov_all > lower) & valid
    picked = sorted(((keys[b, t].item(), b * T + t) for b, t in torch.nonzero(candidates).tolist()))[:clip_num]
    corr = torch.ones_like(advantages)
    selected = torch.zeros(B, T, dtype=torch.int64)
    for _, flat in picked:
        corr[flat // T, flat % T] = 0
        selected[flat // T, flat % T] = 1
    pg_losses = torch.maximum(pg_losses1, pg_losses2) * corr
    loss = (pg_losses * mask).sum() / mask.sum()
    loss.backward()
    rows = lambda x: [x[b, :n].tolist() for b, n in enumerate(lengths)]
    return {"lengths": lengths, "clip_cov_ratio": clip_cov_ratio, "lower": lower, "upper": upper,
            "epsilon_low": eps_low, "epsilon_high": eps_high, "logp_old": rows(old),
            "logp_new": rows(new.detach()), "advantages": rows(advantages), "keys": rows(keys),
            "candidates": rows(candidates.long()), "selected": rows(selected), "loss": loss.item(),
            "grad": rows(new.grad)}


# GDPO's aggregation, drawn last for the same reason.
gdpo = [gdpo_case(4, 2, [1.0, 1.0]), gdpo_case(3, 3, [1.0, 0.5, 2.0], constant_source=1),
        gdpo_case(8, 2, [0.7, -0.3]), gdpo_case(2, 4, [1.0])]

# verl's Clip-Cov, drawn last for the same reason: one token drawn of four candidates, a draw
# larger than its candidates (both taken), verl's defaults (one of four), wider bounds (3 of 9).
clip_cov = [clip_cov_case([6, 8, 5], 0.1, 1.0, 5.0), clip_cov_case([7, 9], 0.5, 1.0, 5.0),
            clip_cov_case([10, 4, 6], 0.0002, 1.0, 5.0), clip_cov_case([12, 10], 0.15, 0.05, 3.0)]



def gpg_case(sizes, pass_fail):
    """verl's compute_gpg_outcome_advantage (core_algos.py, written out) on groups of these sizes
    (at least 2 each: verl gives a lone response alpha r, marlhf 0): alpha = N /
    max(1, count_nonzero(scores)), advantage alpha (score - group mean) / f_norm (1); then its
    compute_policy_loss_gpg, -logp A, token-mean over one response of the batch (autograd)."""
    groups = [g for g, n in enumerate(sizes) for _ in range(n)]
    if pass_fail:
        scores = torch.tensor([float(rng.random() < 0.3) for _ in groups], dtype=torch.float64)
    else:
        scores = torch.tensor([rng.gauss(0.2, 1.0) for _ in groups], dtype=torch.float64)
    alpha = len(groups) / max(int(torch.count_nonzero(scores)), 1)
    advantages = []
    for q, g in enumerate(groups):
        members = torch.stack([scores[i] for i, h in enumerate(groups) if h == g])
        advantages.append((alpha * (scores[q] - members.mean()) / 1.0).item())
    R = 6
    old = torch.tensor([rng.uniform(-4.0, -0.2) for _ in range(R)], dtype=torch.float64)
    new = (old + torch.tensor([rng.gauss(0, 0.3) for _ in range(R)], dtype=torch.float64)).requires_grad_()
    advantage = advantages[0]
    loss = (-new * advantage).sum() / R
    loss.backward()
    return {"rewards": scores.tolist(), "groups": groups, "alpha": alpha, "advantages": advantages,
            "logp_old": old.tolist(), "logp_new": new.detach().tolist(), "advantage": advantage, "loss": loss.item(),
            "grad": new.grad.tolist()}


# verl's GPG, drawn last for the same reason: pass/fail rewards (some groups all 0) and others.
gpg = [gpg_case([4, 4, 4, 4], True), gpg_case([2, 3, 5], True), gpg_case([4, 4], False)]



def gmpo_entropy_case(advantage, R, spread, entropy_quantile):
    """TRL 1.16's GMPOTrainer._compute_loss with top_entropy_quantile < 1 for one response: the
    tokens whose entropy is below torch.quantile(entropies, 1 - quantile) (get_high_entropy_mask's
    rule, as policy_case writes it) leave the geometric mean, whose denominator is the kept
    tokens' count; epsilon 0.4 both sides; gradient by autograd."""
    eps_low = eps_high = 0.4
    old, _, new, mask = one_response(R, spread)
    entropies = torch.tensor([[rng.uniform(0.0, 3.0) for _ in range(R)]], dtype=torch.float32)
    threshold = torch.quantile(entropies[mask.bool()].float(), 1 - entropy_quantile)
    entropy_mask = ((entropies * mask.float()) >= threshold) & mask.bool()
    advantages = torch.tensor([advantage], dtype=torch.float64)
    log_ratio = new - old
    clamped_log_ratio = torch.clamp(log_ratio, min=-eps_low, max=eps_high)
    clipped_log_ratio = torch.where(advantages.unsqueeze(1) > 0, torch.minimum(log_ratio, clamped_log_ratio),
                                    torch.maximum(log_ratio, clamped_log_ratio))
    seq_mask = mask * entropy_mask
    log_importance_weights = (clipped_log_ratio * seq_mask).sum(-1) / seq_mask.sum(-1).clamp(min=1.0)
    loss = (-torch.exp(log_importance_weights) * advantages).mean()
    loss.backward()
    return {"epsilon_low": eps_low, "epsilon_high": eps_high, "logp_old": old[0].tolist(),
            "logp_new": new[0].detach().tolist(), "advantage": advantage, "entropies": entropies[0].tolist(),
            "entropy_quantile": entropy_quantile, "entropy_threshold": threshold.item(),
            "kept": entropy_mask[0].long().tolist(), "loss": loss.item(), "grad": new.grad[0].tolist()}


# TRL 1.16's GMPO with its entropy mask, drawn last for the same reason.
gmpo_entropy = [gmpo_entropy_case(advantage, R, spread, quantile) for advantage in [1.3, -0.7]
                for R, spread, quantile in [(6, 0.3, 0.5), (12, 0.6, 0.2), (4, 0.1, 0.8)]]


def vespo_correction_case(mode, clip_min, clip_max, advantage, R):
    """TRL 1.16's VESPO with vLLM importance sampling: the ratio (sampling_ratio), passed to GRPOTrainer.get_gamma_weights (called here) as importance_sampling_ratio,
    which adds the sum of its clamped logs to the sequence's log-ratio (the per-token loss is not
    weighted again for vespo); -phi A logp averaged over the tokens, autograd."""
    old, sampling, new, mask = one_response(R, 0.1, between_spread=0.5)
    advantages = torch.tensor([[advantage]], dtype=torch.float64)
    ratio = sampling_ratio(mode, clip_min, clip_max, old, sampling, mask)
    phi = GRPOTrainer.get_gamma_weights(advantages=advantages, log_ratio_per_token=new - old, mask=mask,
                                        importance_sampling_ratio=ratio)
    per_token_loss = -phi * advantages * new
    loss = ((per_token_loss * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()
    loss.backward()
    return {"mode": mode, "clip_min": clip_min if clip_min is not None else 0.0, "clip_max": clip_max,
            "logp_old": old[0].tolist(), "logp_sampling": sampling[0].tolist(), "logp_new": new[0].detach().tolist(),
            "advantage": advantage, "phi": phi.item(), "loss": loss.item(), "grad": new.grad[0].tolist()}


# TRL 1.16's VESPO with the rollout correction, drawn last for the same reason.
vespo_correction = [vespo_correction_case(mode, clip_min, clip_max, advantage, R)
                    for mode in ["token_truncate", "token_mask", "sequence_truncate", "sequence_mask"]
                    for clip_min, clip_max in [(None, 3.0), (0.5, 1.5)] for advantage, R in [(1.3, 5), (-0.7, 8)]]


def gspo_token_case(loss_type, R, shift, beta):
    """GSPO-token (TRL's importance_sampling_level="sequence_token" before 1.12, which dropped it; written
    out here): log_importance_weights = logp - logp.detach() + (the response's mean log-ratio).detach(),
    so each token's weight has the response's value and its own token's gradient; then grpo's
    clipped loss, cispo or sapo as in policy_case, with a different advantage on each token (as
    GAE gives), plus beta times TRL 1.16's bias-corrected k3 term (coef_1 times the k3 KL) when
    beta > 0; the per-response token mean; gradient by autograd."""
    eps_low, eps_high, cispo_max, tau_pos, tau_neg = 0.2, 0.28, 1.1, 1.0, 1.05
    old, ref, new, mask = one_response(R, 0.2, between_spread=0.4, shift=shift)
    advantages = torch.tensor([[rng.gauss(0.2, 1.0) for _ in range(R)]], dtype=torch.float64)
    log_ratio = new - old
    sequence_log_weight = ((log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).detach().unsqueeze(-1)
    coef_1 = torch.exp(new - new.detach() + sequence_log_weight)
    if loss_type == "cispo":
        per_token_loss = -torch.clamp(coef_1, max=cispo_max).detach() * advantages * new
    elif loss_type == "sapo":
        temperatures = torch.where(advantages > 0, torch.tensor(tau_pos), torch.tensor(tau_neg)).to(torch.float64)
        per_token_loss = -(torch.sigmoid(temperatures * (coef_1 - 1)) * 4 / temperatures) * advantages
    else:  # grpo
        coef_2 = torch.clamp(coef_1, 1 - eps_low, 1 + eps_high)
        per_token_loss = -torch.min(coef_1 * advantages, coef_2 * advantages)
    if beta > 0:
        per_token_loss = per_token_loss + beta * (torch.exp(ref - new) - (ref - new) - 1) * coef_1
    loss = ((per_token_loss * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()
    loss.backward()
    return {"loss_type": loss_type, "beta": beta, "epsilon_low": eps_low, "epsilon_high": eps_high,
            "cispo_max": cispo_max, "tau_pos": tau_pos, "tau_neg": tau_neg, "logp_old": old[0].tolist(),
            "logp_ref": ref[0].tolist(), "logp_new": new[0].detach().tolist(), "advantages": advantages[0].tolist(),
            "loss": loss.item(), "grad": new.grad[0].tolist()}


# GSPO-token, drawn last for the same reason: the response's ratio inside and outside the clip
# range (shift), with and without the KL term.
gspo_token = [gspo_token_case(loss_type, R, shift, beta) for loss_type in ["grpo", "cispo", "sapo"]
              for R, shift in [(1, 0.0), (6, 0.3), (12, -0.35), (9, 0.05)] for beta in [0.0, 0.1]]

path = os.path.join(os.path.dirname(__file__), "..", "tests/fixtures/ppo/grpo_losses.json")
with open(path, "w") as f:
    json.dump({"losses": losses, "batch_scaling": batch_scaling, "rollout_correction": rollout_correction,
               "kl_bias_correction": kl_bias_correction, "gmpo": gmpo, "kl_cov": kl_cov, "gdpo": gdpo,
               "clip_cov": clip_cov, "gpg": gpg, "gmpo_entropy": gmpo_entropy, "vespo_correction": vespo_correction,
               "gspo_token": gspo_token},
              f)
print("wrote", path, len(losses), "loss cases,", len(batch_scaling), "batches,", len(rollout_correction),
      "rollout-correction cases,", len(kl_bias_correction), "KL bias-correction cases,", len(gmpo), "GMPO cases,",
      len(kl_cov), "KL-Cov micro-batches,", len(gdpo), "GDPO batches,", len(clip_cov), "Clip-Cov micro-batches,", len(gpg), "GPG rollouts,", len(gmpo_entropy),
      "GMPO cases with the entropy mask,", len(vespo_correction), "VESPO cases with the rollout correction,",
      len(gspo_token), "GSPO-token cases")
