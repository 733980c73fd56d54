"""A gradient update of a policy on a training batch, in this process (what the RLlib Learner does
on its own device; used directly by tests and by tools that need no Ray)."""

from __future__ import annotations

import time
from typing import Any, Sequence

import numpy as np
import torch

from embodied.rl.batch import batch_size
from embodied.rl.loss import LossConfig, chunk_ppo_loss, evaluate_minibatch
from embodied.rl.params import split_parameters


def explained_variance(pred: torch.Tensor, target: torch.Tensor) -> float:
    """``1 - Var[target - pred] / Var[target]`` (0 when the targets are constant)."""
    var = target.var()
    return float(1.0 - (target - pred).var() / var) if var > 1e-12 else 0.0


def update_policy(policy: Any, optimizer: torch.optim.Optimizer, batch: dict[str, torch.Tensor],
                  instructions: Sequence[str], cfg: LossConfig, *, epochs: int = 1, minibatch_size: int | None = 32,
                  max_grad_norm: float = 1.0, generator: torch.Generator | None = None,
                  critic_only: bool = False) -> dict[str, float]:
    """``epochs`` shuffled passes of minibatch PPO over ``batch``; returns mean statistics.

    ``critic_only`` (critic warm-up): only the value head steps; the actor's gradients are dropped.
    ``minibatch_size=None``: the whole batch in one step per epoch.
    """
    if critic_only and not cfg.use_critic:
        raise ValueError("critic_only needs a critic (cfg.use_critic=True)")
    start = time.perf_counter()
    actor = split_parameters(policy)[0] if critic_only else []
    total = batch_size(batch)
    minibatch_size = minibatch_size or max(total, 1)
    device = policy.device
    stats: dict[str, list[float]] = {k: [] for k in ("policy_loss", "value_loss", "entropy", "clip_fraction",
                                                     "approx_kl")}
    policy.train()
    for _ in range(epochs if total else 0):
        perm = torch.randperm(total, generator=generator)
        for lo in range(0, total, minibatch_size):
            idx = perm[lo:lo + minibatch_size]
            mb = {k: v[idx].to(device) for k, v in batch.items()}
            lp, ent, val = evaluate_minibatch(policy, mb, instructions)
            loss, st = chunk_ppo_loss(lp, ent, val, mb, cfg)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            for p in actor:
                p.grad = None
            torch.nn.utils.clip_grad_norm_(policy.parameters(), max_grad_norm)
            optimizer.step()
            for k in stats:
                stats[k].append(getattr(st, k))
    out = {k: float(np.mean(v)) if v else 0.0 for k, v in stats.items()}
    out["minibatches"] = float(len(stats["approx_kl"]))
    out["explained_variance"] = explained_variance(batch["old_values"], batch["value_targets"]) \
        if cfg.use_critic and total else 0.0
    out["learn_s"] = time.perf_counter() - start
    return out
