"""The PPO loss on chunk log-probabilities: ratio clipping, optional dual clip, value clipping,
entropy bonus, optional approx-KL penalty. Its hyper-parameters have no defaults here: they come
from :class:`embodied.algorithms.loss.LossConfig`, the one place that sets them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class PPOStats:
    """Diagnostics of one loss evaluation (plain floats)."""

    policy_loss: float
    value_loss: float
    entropy: float
    clip_fraction: float
    approx_kl: float
    #: the largest ``|log ratio|`` of one row: the k3 approx KL is a mean, and one row with a log ratio
    #: of 4 (a ratio of 55) adds 50 / B to it, however little the others moved
    log_ratio_max: float = 0.0


def ppo_loss(
    logprob: torch.Tensor,
    old_logprob: torch.Tensor,
    advantages: torch.Tensor,
    *,
    values: torch.Tensor | None = None,
    old_values: torch.Tensor | None = None,
    returns: torch.Tensor | None = None,
    entropy: torch.Tensor | None = None,
    clip: float,
    dual_clip: float | None,
    value_clip: float | None,
    vf_coef: float,
    ent_coef: float,
    kl_coef: float,
) -> tuple[torch.Tensor, PPOStats]:
    """Scalar PPO loss over a batch ``[B]`` and its diagnostics.

    ``values``/``old_values``/``returns`` are omitted for critic-free algorithms (GRPO).
    Dual clip (for negative advantages) bounds the loss at ``-dual_clip * A``; ``dual_clip`` and
    ``value_clip`` None disable them, ``kl_coef`` 0 drops the approx-KL term.
    """
    log_ratio = logprob - old_logprob
    ratio = torch.exp(log_ratio)
    surr1 = ratio * advantages
    surr2 = torch.clamp(ratio, 1.0 - clip, 1.0 + clip) * advantages
    pg = -torch.min(surr1, surr2)
    if dual_clip is not None:
        if dual_clip <= 1.0:
            raise ValueError(f"dual_clip must be > 1, got {dual_clip}")
        pg = torch.where(advantages < 0, torch.min(pg, -dual_clip * advantages), pg)
    policy_loss = pg.mean()
    total = policy_loss
    value_loss = torch.zeros((), device=logprob.device)
    if values is not None:
        if returns is None:
            raise ValueError("values need returns")
        err = (values - returns) ** 2
        if value_clip is not None and old_values is not None:
            clipped = old_values + torch.clamp(values - old_values, -value_clip, value_clip)
            err = torch.max(err, (clipped - returns) ** 2)
        value_loss = 0.5 * err.mean()
        total = total + vf_coef * value_loss
    ent = entropy.mean() if entropy is not None else torch.zeros((), device=logprob.device)
    total = total - ent_coef * ent
    approx_kl = ((ratio - 1.0) - log_ratio).mean()
    if kl_coef:
        total = total + kl_coef * approx_kl
    with torch.no_grad():
        clip_fraction = ((ratio - 1.0).abs() > clip).float().mean()
        log_ratio_max = log_ratio.abs().max() if log_ratio.numel() else torch.zeros(())
    return total, PPOStats(
        float(policy_loss.detach()),
        float(value_loss.detach()),
        float(ent.detach()),
        float(clip_fraction),
        float(approx_kl.detach()),
        float(log_ratio_max),
    )
