"""GRPO on chunk rollouts: G envs per group start from the same initial state, each env's first
episode is one rollout; its return, normalised within the group, is the advantage of all its
chunks. Groups whose rollouts all succeeded or all failed are dropped (dynamic sampling); no critic.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from embodied.algorithms import grpo_advantages, grpo_group_filter, ppo_loss
from embodied.rl.ppo_update import minibatch_logprob, optimizer_step
from embodied.rl.rollout import Rollout


@dataclass
class GRPOConfig:
    """GRPO hyper-parameters (SimpleVLA-RL: clip 0.2 / 0.28 (asymmetric), binary success reward)."""

    group_size: int = 4
    clip: float = 0.2
    epochs: int = 2
    minibatch_size: int = 32
    max_grad_norm: float = 1.0
    ent_coef: float = 0.0


def first_episode_mask(done: torch.Tensor) -> torch.Tensor:
    """bool ``[T, N]``: chunks that belong to each env's first episode (up to its first end)."""
    ended_before = torch.cumsum(done.long(), dim=0) - done.long()
    return ended_before == 0


def grpo_update(policy: Any, optimizer: torch.optim.Optimizer, rollout: Rollout, cfg: GRPOConfig,
                generator: torch.Generator | None = None) -> dict[str, float]:
    """One GRPO update; the rollout's envs are ordered in groups of ``cfg.group_size``."""
    start = time.perf_counter()
    t_len, n = rollout.shape
    if n % cfg.group_size:
        raise ValueError(f"{n} envs do not split into groups of {cfg.group_size}")
    mask = first_episode_mask(rollout.done)
    finished = (rollout.done & mask).any(0)  # [N] the first episode ended inside the rollout
    returns = (rollout.reward * mask).sum(0)
    success = (rollout.success & mask).any(0)
    groups = n // cfg.group_size
    keep = grpo_group_filter(success.view(groups, cfg.group_size)) & finished.view(groups, -1).all(1)
    adv_env = grpo_advantages(returns.view(groups, cfg.group_size)).flatten()
    use = mask & keep.repeat_interleave(cfg.group_size)[None, :]
    stats: dict[str, list[float]] = {k: [] for k in ("policy_loss", "entropy", "clip_fraction", "approx_kl")}
    flat_use = use.flatten().nonzero().flatten()
    if flat_use.numel():
        flat_adv = adv_env[None, :].expand(t_len, n).flatten()
        flat_lp = rollout.logprob.flatten()
        device = policy.device
        policy.train()
        for _ in range(cfg.epochs):
            perm = flat_use[torch.randperm(flat_use.numel(), generator=generator)]
            for lo in range(0, perm.numel(), cfg.minibatch_size):
                idx = perm[lo:lo + cfg.minibatch_size]
                lp, ent, _ = minibatch_logprob(policy, rollout, idx)
                loss, st = ppo_loss(lp, flat_lp[idx].to(device), flat_adv[idx].to(device), entropy=ent,
                                    clip=cfg.clip, dual_clip=None, value_clip=None, ent_coef=cfg.ent_coef)
                optimizer_step(policy, optimizer, loss, cfg.max_grad_norm)
                for k in stats:
                    stats[k].append(getattr(st, k))
    out = {k: float(np.mean(v)) if v else 0.0 for k, v in stats.items()}
    out.update(groups_kept=float(keep.sum()), groups=float(groups), value_loss=0.0, explained_variance=0.0,
               learn_s=time.perf_counter() - start)
    return out
