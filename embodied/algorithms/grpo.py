"""GRPO: group-relative advantages without a critic, and dynamic sampling.

G rollouts start from the same initial state (a group); each rollout's advantage is its return
normalised within the group, ``(R - mean) / (std + eps)``. Groups where every rollout succeeded or
every one failed carry no signal and are filtered out (DAPO's dynamic sampling); with shaped rewards
the filter can keep every group whose returns differ instead (:func:`grpo_return_filter`), so
all-failure groups still tell a rollout that got nearer the goal from one that did not.
"""

from __future__ import annotations

import torch


def grpo_advantages(returns: torch.Tensor, eps: float = 1e-6, std_norm: bool = True) -> torch.Tensor:
    """``returns`` ``[num_groups, G]`` -> advantages ``[num_groups, G]``: ``(R - mean) / (std + eps)``,
    or ``R - mean`` with ``std_norm=False`` (Dr. GRPO): the advantages then keep the returns' scale, so
    a group whose shaped returns barely differ pushes barely instead of as hard as a success does."""
    if returns.ndim != 2 or returns.shape[1] < 2:
        raise ValueError(f"returns must be [num_groups, G] with G >= 2, got {tuple(returns.shape)}")
    centred = returns - returns.mean(dim=1, keepdim=True)
    return centred / (returns.std(dim=1, keepdim=True) + eps) if std_norm else centred


def grpo_group_filter(success: torch.Tensor, low: float = 0.0, high: float = 1.0) -> torch.Tensor:
    """bool ``[num_groups]``: keep groups whose success rate is strictly between ``low`` and ``high``."""
    rate = success.float().mean(dim=1)
    return (rate > low) & (rate < high)


def grpo_return_filter(returns: torch.Tensor, tol: float = 1e-6) -> torch.Tensor:
    """bool ``[num_groups]``: keep groups ``returns [num_groups, G]`` whose returns differ (max - min > ``tol``).

    With sparse success rewards (one success ends an episode) this is :func:`grpo_group_filter`;
    with shaped ones an all-failure group whose rollouts made different progress is kept."""
    return (returns.amax(dim=1) - returns.amin(dim=1)) > tol


#: which groups GRPO keeps: ``success`` (success rate strictly between 0 and 1) or ``return``
#: (returns not all equal: see :func:`grpo_return_filter`)
GRPO_KEEP = ("success", "return")

#: how GRPO weighs a rollout's chunks: ``episode`` (every episode counts once, GRPO's 1/|o_i|) or
#: ``chunk`` (every chunk counts once, so long episodes count more)
GRPO_WEIGHTING = ("episode", "chunk")


def episode_weighted_advantages(advantages: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Advantages ``[E]`` of E episodes, scaled so that each episode weighs the same in a loss that
    averages over chunks: ``A_e * mean(lengths) / length_e`` (``lengths [E]`` in chunks, >= 1).

    Broadcast to their chunks unscaled, the group-normalised advantages (zero-sum per group) weigh
    each episode by its length; failures that run to the step limit outlast successes, so the
    chunks' mean advantage is negative and every update also pushes the policy away from its own
    samples: a random walk that grows with the learning rate. Scaled, the chunk sum is zero again.
    """
    if advantages.shape != lengths.shape or advantages.ndim != 1:
        raise ValueError(
            f"advantages and lengths must both be [E], got {tuple(advantages.shape)} and {tuple(lengths.shape)}"
        )
    lengths = lengths.to(advantages.dtype)
    if not bool((lengths >= 1).all()):
        raise ValueError("episode lengths must be >= 1 chunk")
    return advantages * lengths.mean() / lengths
