"""The update schedule of one iteration (:func:`run_epochs`: shuffled, evenly cut minibatches every
epoch, an early stop at a target approx KL) and a gradient update of a policy on a training batch
in this process (:func:`update_policy`: the same schedule the RLlib algorithm drives through its
learners, for tools that need no Ray)."""

from __future__ import annotations

import time
from typing import Any, Callable, Sequence

import numpy as np
import torch

from embodied.rl.batch import batch_size, minibatch_indices
from embodied.rl.loss import LossConfig, chunk_ppo_loss, evaluate_minibatch
from embodied.rl.params import split_parameters


def explained_variance(pred: torch.Tensor, target: torch.Tensor) -> float:
    """``1 - Var[target - pred] / Var[target]`` (0 when the targets are constant)."""
    var = target.var()
    return float(1.0 - (target - pred).var() / var) if var > 1e-12 else 0.0


STAT_KEYS = ("policy_loss", "value_loss", "entropy", "clip_fraction", "approx_kl")


def run_epochs(step: Callable[[torch.Tensor], dict[str, float]], total: int, *, epochs: int,
               minibatch_size: int | None, target_kl: float | None = None,
               generator: torch.Generator | None = None) -> dict[str, float]:
    """Call ``step(rows)`` once per minibatch: ``epochs`` passes, each over a fresh permutation of the
    ``total`` rows cut evenly (:func:`embodied.rl.batch.minibatch_indices`). ``step`` takes one
    gradient step and returns that minibatch's statistics (:data:`STAT_KEYS`, ``approx_kl``
    measured before its step). When a minibatch's approx KL exceeds ``target_kl`` the iteration's
    remaining minibatches and epochs are skipped.

    Returns the means over the minibatches run, ``approx_kl_first`` / ``clip_fraction_first`` (the
    first minibatch: how far the weights that sampled the batch already are from the ones that
    train on it), ``minibatches``, ``epochs_run`` and ``kl_stop`` (1 when the target stopped it).
    """
    per: list[dict[str, float]] = []
    epochs_run, stop = 0, False
    for _ in range(epochs if total else 0):
        epochs_run += 1
        for rows in minibatch_indices(total, minibatch_size, generator):
            per.append(step(rows))
            if target_kl is not None and per[-1]["approx_kl"] > target_kl:
                stop = True
                break
        if stop:
            break
    out = {k: float(np.mean([p[k] for p in per])) if per else 0.0 for k in STAT_KEYS}
    out["approx_kl_first"] = float(per[0]["approx_kl"]) if per else 0.0
    out["clip_fraction_first"] = float(per[0]["clip_fraction"]) if per else 0.0
    out.update(minibatches=float(len(per)), epochs_run=float(epochs_run), kl_stop=float(stop))
    return out


def update_policy(policy: Any, optimizer: torch.optim.Optimizer, batch: dict[str, torch.Tensor],
                  instructions: Sequence[str], cfg: LossConfig, *, epochs: int = 1, minibatch_size: int | None = 32,
                  max_grad_norm: float = 1.0, generator: torch.Generator | None = None,
                  critic_only: bool = False, target_kl: float | None = None) -> dict[str, float]:
    """``epochs`` shuffled passes of minibatch PPO over ``batch`` (:func:`run_epochs`); returns its
    statistics.

    ``critic_only`` (critic warm-up): only the value head steps; the actor's gradients are dropped.
    ``minibatch_size=None``: the whole batch in one step per epoch.
    """
    if critic_only and not cfg.use_critic:
        raise ValueError("critic_only needs a critic (cfg.use_critic=True)")
    start = time.perf_counter()
    actor = split_parameters(policy)[0] if critic_only else []
    total = batch_size(batch)
    device = policy.device
    policy.train()

    def step(rows: torch.Tensor) -> dict[str, float]:
        mb = {k: v[rows].to(device) for k, v in batch.items()}
        lp, ent, val = evaluate_minibatch(policy, mb, instructions)
        loss, st = chunk_ppo_loss(lp, ent, val, mb, cfg)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        for p in actor:
            p.grad = None
        torch.nn.utils.clip_grad_norm_(policy.parameters(), max_grad_norm)
        optimizer.step()
        return {k: float(getattr(st, k)) for k in STAT_KEYS}

    out = run_epochs(step, total, epochs=epochs, minibatch_size=minibatch_size, target_kl=target_kl,
                     generator=generator)
    out["explained_variance"] = explained_variance(batch["old_values"], batch["value_targets"]) \
        if cfg.use_critic and total else 0.0
    out["learn_s"] = time.perf_counter() - start
    return out
