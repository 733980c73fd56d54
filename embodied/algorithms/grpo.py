"""GRPO: group-relative advantages without a critic, and dynamic sampling.

G rollouts start from the same initial state (a group); each rollout's advantage is its return
normalised within the group, ``(R - mean) / (std + eps)``. Groups where every rollout succeeded or
every one failed carry no signal and are filtered out (DAPO's dynamic sampling).
"""

from __future__ import annotations

import torch


def grpo_advantages(returns: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """``returns`` ``[num_groups, G]`` -> advantages ``[num_groups, G]``."""
    if returns.ndim != 2 or returns.shape[1] < 2:
        raise ValueError(f"returns must be [num_groups, G] with G >= 2, got {tuple(returns.shape)}")
    mean = returns.mean(dim=1, keepdim=True)
    std = returns.std(dim=1, keepdim=True)
    return (returns - mean) / (std + eps)


def grpo_group_filter(success: torch.Tensor, low: float = 0.0, high: float = 1.0) -> torch.Tensor:
    """bool ``[num_groups]``: keep groups whose success rate is strictly between ``low`` and ``high``."""
    rate = success.float().mean(dim=1)
    return (rate > low) & (rate < high)
