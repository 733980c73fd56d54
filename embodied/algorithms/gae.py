"""Generalised advantage estimation at chunk level.

One RL step is one action chunk: ``rewards[t]`` is the sum of the rewards of the steps executed in
chunk t, ``values[t]`` the critic's value of the observation the chunk was chosen from. An
episode that ends inside chunk t cuts the recursion there: a *termination* bootstraps nothing, a
*truncation* (step limit, diverged physics) bootstraps from the value of the episode's final
observation, ``final_values[t]`` (or, when those are not given, from ``values[t]``).
"""

from __future__ import annotations

import torch


def chunk_gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    dones: torch.Tensor,
    truncs: torch.Tensor,
    last_value: torch.Tensor,
    gamma: float = 0.99,
    lam: float = 0.95,
    final_values: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Advantages and returns ``[T, N]``.

    Args:
        rewards: ``[T, N]`` chunk rewards.
        values: ``[T, N]`` values of the observations the chunks were chosen from.
        dones: ``[T, N]`` bool, the episode ended inside chunk t (terminated or truncated).
        truncs: ``[T, N]`` bool, the end was a truncation (implies ``dones``).
        last_value: ``[N]`` value of the observation after the last chunk (for unfinished episodes).
        gamma, lam: discount and GAE lambda, per chunk.
        final_values: ``[T, N]`` values of the final observations where ``truncs`` (optional).
    """
    if not (rewards.shape == values.shape == dones.shape == truncs.shape):
        raise ValueError(
            f"rewards, values, dones, truncs must share a shape [T, N]; got {tuple(rewards.shape)}, "
            f"{tuple(values.shape)}, {tuple(dones.shape)}, {tuple(truncs.shape)}"
        )
    if bool((truncs & ~dones).any()):
        raise ValueError("truncs must imply dones")
    t_len = rewards.shape[0]
    dones_f = dones.float()
    trunc_f = truncs.float()
    boot_at_trunc = final_values if final_values is not None else values
    adv = torch.zeros_like(values)
    next_adv = torch.zeros_like(last_value)
    next_value = last_value
    for t in reversed(range(t_len)):
        # continuing: bootstrap from the next chunk's value; ended: from the final value or nothing
        bootstrap = (1.0 - dones_f[t]) * next_value + trunc_f[t] * boot_at_trunc[t]
        delta = rewards[t] + gamma * bootstrap - values[t]
        next_adv = delta + gamma * lam * (1.0 - dones_f[t]) * next_adv
        adv[t] = next_adv
        next_value = values[t]
    return adv, adv + values


def normalize_advantages(adv: torch.Tensor, mask: torch.Tensor | None = None, eps: float = 1e-8) -> torch.Tensor:
    """Zero mean, unit std over the entries where ``mask`` (all by default)."""
    sel = adv if mask is None else adv[mask]
    if sel.numel() < 2:
        return adv - sel.mean() if sel.numel() else adv
    return (adv - sel.mean()) / (sel.std() + eps)
