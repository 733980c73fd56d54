"""Training batches from chunk rollouts: flat ``[B]`` columns (``B = T * N`` chunks, or the kept
ones for GRPO) that a Learner cuts into minibatches.

Columns: ``rgb [B, V, H, W, 3]`` uint8, ``state [B, S]``, ``task_id [B]``, ``time_left [B]`` (the
fraction of the episode's step limit left, which the policy's value head reads; absent for rollouts
without it), the policy's sampling extras as ``x.<name> [B, ...]``, ``old_logprob [B]``,
``advantages [B]`` (normalised over the batch); with a critic also ``old_values [B]`` and
``value_targets [B]``, and with a separate critic (:mod:`embodied.algorithms.critic`) its inputs
``critic_obs [B, C]``.

How a rollout's chunks get their advantages (chunk GAE, or GRPO's groups) is one typed config,
:class:`AdvantageConfig`, and :func:`training_batch` makes a runner's batch with it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from embodied.algorithms.gae import chunk_gae, normalize_advantages
from embodied.algorithms.grpo import (
    GRPO_KEEP,
    GRPO_WEIGHTING,
    episode_weighted_advantages,
    grpo_advantages,
    grpo_group_filter,
    grpo_return_filter,
)
from embodied.algorithms.registry import ALGORITHMS, GROUP_ALGORITHMS
from embodied.algorithms.rollout import Rollout

EXTRA_PREFIX = "x."
#: a minibatch's column of its rows' indices in the iteration's batch ``[b]`` (int64): a learner whose
#: policy's encoder is frozen keeps each row's prefix tokens by it (:class:`embodied.rllib.module.PolicyRLModule`)
ROW = "row"


def _observation_columns(rollout: Rollout, rows: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    def flat(t: torch.Tensor) -> torch.Tensor:
        t = t.flatten(0, 1)
        return t if rows is None else t[rows]

    cols = {"rgb": flat(rollout.rgb), "state": flat(rollout.state), "task_id": flat(rollout.task_id)}
    if rollout.time_left is not None:
        cols["time_left"] = flat(rollout.time_left)
    cols.update({EXTRA_PREFIX + k: flat(v) for k, v in rollout.extras.items()})
    cols["old_logprob"] = flat(rollout.logprob)
    if rollout.critic_obs is not None:
        cols["critic_obs"] = flat(rollout.critic_obs)
    return cols


#: how an episode that hits a step limit enters GAE: ``bootstrap`` from the value of its final
#: observation (the episode could go on) or ``fail``: it ends there like a termination, so an episode
#: without success returns only what it earned (SimpleVLA-RL's binary outcome)
TRUNCATION = ("bootstrap", "fail")


def ppo_batch(
    rollout: Rollout, gamma: float = 0.99, lam: float = 0.95, normalize: bool = True, truncation: str = "bootstrap"
) -> dict[str, torch.Tensor]:
    """Chunk GAE (truncations per ``truncation``, one of :data:`TRUNCATION`), then every chunk as one
    row. With several env runners, pass ``normalize=False`` and normalise the concatenated advantages once."""
    if truncation not in TRUNCATION:
        raise ValueError(f"truncation must be one of {TRUNCATION}, got {truncation!r}")
    truncs = rollout.trunc if truncation == "bootstrap" else torch.zeros_like(rollout.trunc)
    adv, ret = chunk_gae(
        rollout.reward,
        rollout.value,
        rollout.done,
        truncs,
        rollout.last_value,
        gamma,
        lam,
        final_values=rollout.final_value,
    )
    cols = _observation_columns(rollout)
    cols["advantages"] = normalize_advantages(adv.flatten()) if normalize else adv.flatten()
    cols["old_values"] = rollout.value.flatten()
    cols["value_targets"] = ret.flatten()
    return cols


def first_episode_mask(done: torch.Tensor) -> torch.Tensor:
    """bool ``[T, N]``: chunks that belong to each env's first episode (up to its first end)."""
    ended_before = torch.cumsum(done.long(), dim=0) - done.long()
    return ended_before == 0


def grpo_batch(
    rollout: Rollout, group_size: int, weighting: str = "chunk", keep: str = "success", std_norm: bool = True
) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
    """GRPO rows: envs ``[g * G, (g + 1) * G)`` form group ``g`` (same initial state); each env's first
    episode is one rollout whose group-normalised return is the advantage of all its chunks (scaled
    by mean length / its length with ``weighting="episode"``, so each kept episode weighs the same:
    see :func:`embodied.algorithms.grpo.episode_weighted_advantages`). Groups that are unfinished are
    dropped, and (dynamic sampling) with ``keep="success"`` the all-success / all-failure ones, with
    ``keep="return"`` those whose returns are all equal. ``std_norm=False``: advantages ``R - mean``
    (see :func:`embodied.algorithms.grpo.grpo_advantages`)."""
    t_len, n = rollout.shape
    if group_size < 2 or n % group_size:
        raise ValueError(f"{n} envs do not split into groups of {group_size} (>= 2)")
    if weighting not in GRPO_WEIGHTING:
        raise ValueError(f"weighting must be one of {GRPO_WEIGHTING}, got {weighting!r}")
    if keep not in GRPO_KEEP:
        raise ValueError(f"keep must be one of {GRPO_KEEP}, got {keep!r}")
    mask = first_episode_mask(rollout.done)
    finished = (rollout.done & mask).any(0)
    returns = (rollout.reward * mask).sum(0)
    success = (rollout.success & mask).any(0)
    groups = n // group_size
    signal = (
        grpo_group_filter(success.view(groups, group_size))
        if keep == "success"
        else grpo_return_filter(returns.view(groups, group_size))
    )
    kept = signal & finished.view(groups, group_size).all(1)
    adv_env = grpo_advantages(returns.view(groups, group_size), std_norm=std_norm).flatten()
    kept_envs = kept.repeat_interleave(group_size)
    if weighting == "episode":  # lengths: chunks of each env's first episode
        adv_env[kept_envs] = episode_weighted_advantages(adv_env[kept_envs], mask.sum(0)[kept_envs])
    use = (mask & kept_envs[None, :]).flatten()
    rows = use.nonzero().flatten()
    cols = _observation_columns(rollout, rows)
    cols["advantages"] = adv_env[None, :].expand(t_len, n).flatten()[rows]
    return cols, {"groups": float(groups), "groups_kept": float(kept.sum())}


@dataclass(frozen=True, kw_only=True)
class AdvantageConfig:
    """How an env runner turns its rollout into advantages: chunk GAE for the algorithms with a critic,
    GRPO's groups for the critic-free ones (:data:`embodied.algorithms.registry.GROUP_ALGORITHMS`). The
    fields are ``embodied-train``'s keys ``algo.<field>`` and have their defaults here; checked when made.

    Attributes:
        name: the algorithm (:data:`embodied.algorithms.registry.ALGORITHMS`), which decides the kind.
        gamma, lam: chunk GAE's discount (per chunk) and lambda.
        group_size: GRPO: rollouts per initial state (a runner's envs are cut into groups of it).
        grpo_weighting: GRPO: ``chunk`` (each chunk weighs the same: long failures outweigh short
            successes) or ``episode`` (each kept episode weighs the same, GRPO's 1/|o_i|).
        grpo_keep: GRPO's dynamic sampling: ``success`` (drop all-success / all-failure groups) or
            ``return`` (drop groups whose returns are all equal: with shaped rewards, all-failure groups
            that made different progress keep their signal).
        grpo_std_norm: GRPO: divide each group's centred returns by their std (GRPO); False keeps their
            scale (Dr. GRPO).
    """

    name: str
    gamma: float = 0.99
    lam: float = 0.95
    group_size: int = 4
    grpo_weighting: str = "chunk"
    grpo_keep: str = "success"
    grpo_std_norm: bool = True

    def __post_init__(self) -> None:
        if self.name not in ALGORITHMS:
            raise ValueError(f"name={self.name!r}: {ALGORITHMS.unknown(self.name)}")
        for key in ("gamma", "lam"):
            if not 0.0 <= getattr(self, key) <= 1.0:
                raise ValueError(f"{key}={getattr(self, key)} must lie in [0, 1]")
        if self.grouped and self.group_size < 2:
            raise ValueError(f"group_size={self.group_size} must be >= 2: {self.name} compares the rollouts of a group")
        if self.grpo_weighting not in GRPO_WEIGHTING:
            raise ValueError(f"grpo_weighting={self.grpo_weighting!r}: choose {' or '.join(GRPO_WEIGHTING)}")
        if self.grpo_keep not in GRPO_KEEP:
            raise ValueError(f"grpo_keep={self.grpo_keep!r}: choose {' or '.join(GRPO_KEEP)}")

    @property
    def grouped(self) -> bool:
        """GRPO's groups (episodes scored whole, reset every iteration) rather than chunk GAE."""
        return self.name in GROUP_ALGORITHMS


def training_batch(
    rollout: Rollout, advantages: AdvantageConfig, truncation: str
) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
    """A runner's training batch of ``rollout`` (advantages not normalised: the algorithm normalises
    the runners' batches together) and its statistics (GRPO's group counts; none for GAE)."""
    a = advantages
    if a.grouped:
        return grpo_batch(rollout, a.group_size, a.grpo_weighting, a.grpo_keep, a.grpo_std_norm)
    return ppo_batch(rollout, a.gamma, a.lam, normalize=False, truncation=truncation), {}


def minibatches_per_epoch(total: int, minibatch_size: int | None) -> int:
    """How many minibatches one epoch over ``total`` rows is cut into: ``ceil(total / minibatch_size)``
    (1 for ``minibatch_size=None``, 0 for no rows)."""
    if total <= 0:
        return 0
    return 1 if minibatch_size is None else -(-total // int(minibatch_size))


def minibatch_indices(
    total: int, minibatch_size: int | None, generator: torch.Generator | None = None
) -> list[torch.Tensor]:
    """One epoch's minibatches over ``total`` rows: a fresh permutation cut into
    ``ceil(total / minibatch_size)`` parts of nearly equal size (sizes differ by at most one; no
    row is used twice, none is left out). ``minibatch_size=None``: the whole batch as one."""
    if total <= 0:
        return []
    perm = torch.randperm(total, generator=generator)
    return list(torch.tensor_split(perm, minibatches_per_epoch(total, minibatch_size)))


def batch_size(batch: dict[str, Any]) -> int:
    return int(len(batch["old_logprob"]))


def concat_batches(batches: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Rows of several batches (e.g. from several env runners) in one batch."""
    keys = batches[0].keys()
    return {k: torch.cat([torch.as_tensor(b[k]) for b in batches]) for k in keys}
