"""The chunk PPO loss of a policy on one minibatch of a training batch (see :mod:`embodied.algorithms.batch`),
which the RLlib Learner (:class:`embodied.rllib.learner.ChunkPPOLearner`) optimises, and its one
typed config :class:`LossConfig`: the only place the loss hyper-parameters have defaults (the YAML
schema ``AlgoConfig`` of ``embodied-train`` refers to them under the same names, and the learner
receives the config as it was made).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch

from embodied.algorithms.batch import EXTRA_PREFIX
from embodied.algorithms.ppo import PPOStats, ppo_loss
from policies.base import TIME_LEFT
from policies.io import indexed_inputs

#: what the PPO ratio compares: ``chunk`` (whole chunks) or ``per_dim`` (its per-dimension geometric mean)
RATIOS = ("chunk", "per_dim")


@dataclass(frozen=True)
class LossConfig:
    """Loss hyper-parameters (pi_RL's defaults where published); frozen, as the RLlib config holding it is once
    built (``dataclasses.replace`` makes a changed copy), and checked when made (:meth:`__post_init__`).

    Attributes:
        clip, dual_clip, value_clip: PPO clipping (None disables dual/value clipping).
        vf_coef, ent_coef, kl_coef: loss weights (no KL term by default).
        neg_adv_scale: multiplies negative advantages (1: the plain objective; 0: only the better than
            average samples are pulled up and nothing is pushed away, a reward-weighted regression on
            them; values in between damp the push away from the worse ones).
        ratio: ``chunk``: the ratio of whole chunks (product over the H*A action dimensions or tokens);
            ``per_dim``: its per-dimension geometric mean (GSPO's length-normalised sequence ratio, the
            log-probabilities divided by H*A), far less often clipped.
        use_critic: False for GRPO (no value loss; the batch has no value columns). Set by the
            algorithm (:attr:`embodied.algorithms.registry.AlgoSpec.critic`), not a YAML key.
    """

    clip: float = 0.2
    dual_clip: float | None = 3.0
    value_clip: float | None = 0.2
    vf_coef: float = 0.5
    ent_coef: float = 0.0
    kl_coef: float = 0.0
    neg_adv_scale: float = 1.0
    ratio: str = "chunk"
    use_critic: bool = True

    def __post_init__(self) -> None:
        if not self.clip > 0:
            raise ValueError(f"clip={self.clip} must be > 0")
        if self.dual_clip is not None and not self.dual_clip > 1:
            raise ValueError(f"dual_clip={self.dual_clip} must be > 1 (null: off)")
        if self.value_clip is not None and not self.value_clip > 0:
            raise ValueError(f"value_clip={self.value_clip} must be > 0 (null: off)")
        if not self.vf_coef >= 0:
            raise ValueError(f"vf_coef={self.vf_coef} must be >= 0")
        if not self.kl_coef >= 0:
            raise ValueError(f"kl_coef={self.kl_coef} must be >= 0")
        if not 0.0 <= self.neg_adv_scale <= 1.0:
            raise ValueError(
                f"neg_adv_scale={self.neg_adv_scale} must lie in [0, 1] (1: plain objective, 0: only positive advantages)"
            )
        if self.ratio not in RATIOS:
            raise ValueError(f"ratio={self.ratio!r}: choose {' or '.join(RATIOS)}")

    def logprob_scale(self, action_dims: int | None) -> float:
        """What log-probabilities are multiplied by before the ratio: 1 (``chunk``) or ``1 / action_dims``
        (``per_dim``; ``action_dims``: H*A of the policy, the action dimensions or tokens of a chunk)."""
        if self.ratio == "chunk":
            return 1.0
        if not action_dims:
            raise ValueError("ratio='per_dim' needs the policy's action dimensions per chunk (H*A)")
        return 1.0 / action_dims


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
    action_dims: int | None = None,
) -> tuple[torch.Tensor, PPOStats]:
    """PPO (or critic-free GRPO) loss of a minibatch from the policy's fresh outputs; ``action_dims``
    (H*A of the policy) is needed with ``cfg.ratio="per_dim"``."""
    critic = (
        dict(values=value, old_values=minibatch["old_values"], returns=minibatch["value_targets"])
        if cfg.use_critic
        else {}
    )
    scale = cfg.logprob_scale(action_dims)
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
