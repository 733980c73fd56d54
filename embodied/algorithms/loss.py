"""The chunk PPO loss of a policy on one minibatch of a training batch (see :mod:`embodied.algorithms.batch`),
which the RLlib Learner (:class:`embodied.rllib.learner.ChunkPPOLearner`) optimises, and its one
typed config :class:`LossConfig`: the only place the loss hyper-parameters have defaults (the YAML
schema ``AlgoConfig`` of ``embodied-train`` and the RLlib config read them from here).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch

from embodied.algorithms.batch import EXTRA_PREFIX
from embodied.algorithms.ppo import PPOStats, ppo_loss
from policies.base import TIME_LEFT
from policies.io import indexed_inputs


@dataclass(frozen=True)
class LossConfig:
    """Loss hyper-parameters (pi_RL's defaults where published); frozen, as the RLlib config holding it is once
    built (``dataclasses.replace`` makes a changed copy).

    Attributes:
        clip, dual_clip, value_clip: PPO clipping (None disables dual/value clipping).
        vf_coef, ent_coef, kl_coef: loss weights (no KL term by default).
        use_critic: False for GRPO (no value loss; the batch has no value columns).
        logprob_scale: multiplies log-probabilities before the ratio. 1: the ratio of whole chunks
            (product over the H*A action dimensions or tokens); 1/(H*A): the per-dimension
            geometric mean (GSPO's length-normalised sequence ratio), far less often clipped.
        neg_adv_scale: multiplies negative advantages (1: the plain objective; 0: only the better than
            average samples are pulled up and nothing is pushed away, a reward-weighted regression on
            them; values in between damp the push away from the worse ones).
    """

    clip: float = 0.2
    dual_clip: float | None = 3.0
    value_clip: float | None = 0.2
    vf_coef: float = 0.5
    ent_coef: float = 0.0
    kl_coef: float = 0.0
    use_critic: bool = True
    logprob_scale: float = 1.0
    neg_adv_scale: float = 1.0


def policy_obs(minibatch: dict[str, torch.Tensor], instructions: Sequence[str]) -> dict[str, Any]:
    """The observation dict a policy reads, from batch columns (``time_left`` where the batch has
    it: the value is then evaluated on the input it was collected with)."""
    time_left = minibatch[TIME_LEFT] if TIME_LEFT in minibatch else None
    return indexed_inputs(minibatch["rgb"], minibatch["state"], minibatch["task_id"], instructions, time_left=time_left)


def policy_extras(minibatch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k[len(EXTRA_PREFIX) :]: v for k, v in minibatch.items() if k.startswith(EXTRA_PREFIX)}


def evaluate_minibatch(
    policy: Any, minibatch: dict[str, torch.Tensor], instructions: Sequence[str]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(logprob [B], entropy [B], value [B])`` of the minibatch's chunks under ``policy`` now."""
    return policy.logprob(policy_obs(minibatch, instructions), policy_extras(minibatch))


def chunk_ppo_loss(
    logprob: torch.Tensor,
    entropy: torch.Tensor,
    value: torch.Tensor,
    minibatch: dict[str, torch.Tensor],
    cfg: LossConfig,
) -> tuple[torch.Tensor, PPOStats]:
    """PPO (or critic-free GRPO) loss of a minibatch from the policy's fresh outputs."""
    critic = (
        dict(values=value, old_values=minibatch["old_values"], returns=minibatch["value_targets"])
        if cfg.use_critic
        else {}
    )
    scale = cfg.logprob_scale
    advantages = minibatch["advantages"]
    if cfg.neg_adv_scale != 1.0:
        advantages = torch.where(advantages < 0, advantages * cfg.neg_adv_scale, advantages)
    return ppo_loss(
        logprob * scale,
        minibatch["old_logprob"] * scale,
        advantages,
        entropy=entropy,
        clip=cfg.clip,
        dual_clip=cfg.dual_clip if cfg.use_critic else None,
        value_clip=cfg.value_clip if cfg.use_critic else None,
        vf_coef=cfg.vf_coef,
        ent_coef=cfg.ent_coef,
        kl_coef=cfg.kl_coef,
        **critic,
    )
