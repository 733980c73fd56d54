"""The PPO update of a policy on a chunk rollout (the Learner's job)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from embodied.algorithms import chunk_gae, normalize_advantages, ppo_loss
from embodied.rl.rollout import Rollout


@dataclass
class PPOConfig:
    """PPO hyper-parameters (pi_RL's defaults where published).

    Attributes:
        gamma, lam: chunk-level GAE.
        clip, dual_clip, value_clip: PPO clipping (dual clip None disables it).
        vf_coef, ent_coef: loss weights (no KL term by default).
        epochs, minibatch_size: passes over the rollout and its minibatch size (chunks).
        max_grad_norm: gradient clipping.
    """

    gamma: float = 0.99
    lam: float = 0.95
    clip: float = 0.2
    dual_clip: float | None = 3.0
    value_clip: float | None = 0.2
    vf_coef: float = 0.5
    ent_coef: float = 0.0
    epochs: int = 2
    minibatch_size: int = 32
    max_grad_norm: float = 1.0


def minibatch_logprob(policy: Any, rollout: Rollout, idx: torch.Tensor
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``policy.logprob`` of the flattened rollout entries ``idx`` (on the policy's device)."""
    extras = {k: v.to(policy.device) for k, v in rollout.flat_extras(idx).items()}
    return policy.logprob(rollout.policy_obs(idx), extras)


def optimizer_step(policy: Any, optimizer: torch.optim.Optimizer, loss: torch.Tensor, max_grad_norm: float) -> None:
    """Backward, clip the gradient norm, step."""
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(policy.parameters(), max_grad_norm)
    optimizer.step()


def explained_variance(pred: torch.Tensor, target: torch.Tensor) -> float:
    var = target.var()
    return float(1.0 - (target - pred).var() / var) if var > 1e-12 else 0.0


def ppo_update(policy: Any, optimizer: torch.optim.Optimizer, rollout: Rollout, cfg: PPOConfig,
               generator: torch.Generator | None = None) -> dict[str, float]:
    """Advantages with chunk GAE, then ``epochs`` passes of minibatch PPO. Returns mean statistics."""
    start = time.perf_counter()
    adv, ret = chunk_gae(rollout.reward, rollout.value, rollout.done, rollout.trunc, rollout.last_value,
                         cfg.gamma, cfg.lam, final_values=rollout.final_value)
    flat_adv = normalize_advantages(adv.flatten())
    flat_ret, flat_val, flat_lp = ret.flatten(), rollout.value.flatten(), rollout.logprob.flatten()
    total = flat_adv.numel()
    device = policy.device
    stats: dict[str, list[float]] = {k: [] for k in ("policy_loss", "value_loss", "entropy", "clip_fraction",
                                                     "approx_kl")}
    policy.train()
    for _ in range(cfg.epochs):
        perm = torch.randperm(total, generator=generator)
        for lo in range(0, total, cfg.minibatch_size):
            idx = perm[lo:lo + cfg.minibatch_size]
            lp, ent, val = minibatch_logprob(policy, rollout, idx)
            loss, st = ppo_loss(lp, flat_lp[idx].to(device), flat_adv[idx].to(device), values=val,
                                old_values=flat_val[idx].to(device), returns=flat_ret[idx].to(device), entropy=ent,
                                clip=cfg.clip, dual_clip=cfg.dual_clip, value_clip=cfg.value_clip,
                                vf_coef=cfg.vf_coef, ent_coef=cfg.ent_coef)
            optimizer_step(policy, optimizer, loss, cfg.max_grad_norm)
            for k in stats:
                stats[k].append(getattr(st, k))
    out = {k: float(np.mean(v)) for k, v in stats.items()}
    out["explained_variance"] = explained_variance(flat_val, flat_ret)
    out["learn_s"] = time.perf_counter() - start
    return out
