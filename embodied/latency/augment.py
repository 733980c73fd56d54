"""The latency-aware observation (ARLI): the state plus the actions committed during inference.

A chunk chosen from the observation at step t starts acting at step t + d; the d actions that
execute meanwhile are already committed. Giving them (and d) to the policy keeps the decision
Markovian under delay. The state grows from S to ``S + max_delay * A + 1``: the committed actions
(slots at and after d are zero) and ``d / max_delay``.
"""

from __future__ import annotations

from typing import Any

import torch


def augmented_state_dim(state_dim: int, action_dim: int, max_delay: int) -> int:
    return state_dim + max_delay * action_dim + 1


def max_delay_of(policy_state_dim: int, state_dim: int, action_dim: int) -> int | None:
    """The largest delay a latency-aware policy reading ``policy_state_dim`` dims was built for
    (the inverse of :func:`augmented_state_dim`), or None if it is not one."""
    extra = policy_state_dim - state_dim - 1
    if extra < 0 or extra % action_dim:
        return None
    return extra // action_dim


def augment_state(state: torch.Tensor, committed: torch.Tensor, delay: torch.Tensor, max_delay: int) -> torch.Tensor:
    """``[N, S]`` -> ``[N, S + max_delay * A + 1]``.

    Args:
        committed: ``[N, >= max_delay, A]`` the actions for steps ``t .. t + max_delay - 1``.
        delay: ``[N]`` d per env (0 .. max_delay); slots ``>= d`` are zeroed.
    """
    n = state.shape[0]
    delay = torch.as_tensor(delay, device=state.device).expand(n)
    c = committed[:, :max_delay].to(state.device, state.dtype)
    keep = torch.arange(max_delay, device=state.device)[None, :] < delay[:, None]
    c = torch.where(keep[..., None], c, torch.zeros_like(c))
    flag = (delay.to(state.dtype) / max(max_delay, 1))[:, None]
    return torch.cat([state, c.flatten(1), flag], 1)


def widen_state_input(policy: Any, extra: int) -> Any:
    """A copy of ``policy`` reading ``state_dim + extra`` state dims; the new inputs start with
    zero weights (normalisation mean 0, std 1), so it acts exactly as before until trained."""
    import policies

    if extra <= 0:
        raise ValueError(f"extra must be positive, got {extra}")
    cfg = policy.config.to_dict()
    old_dim = cfg["state_dim"]
    cfg["state_dim"] = old_dim + extra
    wide = policies.make(policy.family, **cfg)
    state = policy.state_dict()
    widened = {}
    for name, tensor in wide.state_dict().items():
        src = state[name]
        if src.shape != tensor.shape:
            if src.ndim != 2 or tensor.shape[0] != src.shape[0] or tensor.shape[1] != old_dim + extra:
                raise ValueError(f"cannot widen parameter {name}: {tuple(src.shape)} -> {tuple(tensor.shape)}")
            src = torch.cat([src, torch.zeros(src.shape[0], extra, dtype=src.dtype)], 1)
        widened[name] = src
    wide.load_state_dict(widened)
    stats = dict(policy.processor.stats)
    stats["state_mean"] = list(stats["state_mean"]) + [0.0] * extra
    stats["state_std"] = list(stats["state_std"]) + [1.0] * extra
    wide.processor.set_stats(stats)
    return wide.to(policy.device)
