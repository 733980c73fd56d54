"""The update schedule of one iteration (:func:`run_epochs`: shuffled, evenly cut minibatches every
epoch, an early stop at a target approx KL), which :class:`embodied.rllib.algorithm.ChunkRL` drives
through its learners, and the update's one typed config (:class:`UpdateConfig`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from embodied.algorithms.batch import minibatch_indices, minibatches_per_epoch
from policies.precision import PRECISIONS


@dataclass(frozen=True)
class UpdateConfig:
    """The update of an iteration: its schedule and optimizers (pi_RL's defaults where published), the one
    place these settings have defaults. Frozen and checked when made (:meth:`__post_init__`); the fields
    have the names of ``embodied-train``'s YAML keys (``algo.<field>``), and
    :class:`embodied.rllib.algorithm.ChunkRLConfig` carries it (``config.update``) to the algorithm's
    schedule (:class:`embodied.rllib.algorithm.ChunkRL`) and to every learner.

    Attributes:
        lr, critic_lr: actor and critic (value head) learning rates (``lr=0``: a frozen-actor control;
            ``critic_lr=None``: no critic, as GRPO).
        epochs: passes over each iteration's batch, each a fresh shuffle cut into even minibatches.
        minibatch_size: chunks per gradient step (None: the whole batch, one step per epoch).
        target_kl: stop an iteration's remaining minibatches once one's approx KL (measured before its
            step) exceeds it (None: never).
        kl_rollback: with ``target_kl``, the stop also undoes the actor's last two steps (the minibatch
            beyond the target still stepped, and the one before it crossed it), so the iteration ends
            on weights whose approx KL was measured within the target. Early stopping alone keeps the
            step that crossed it, however far it went.
        max_grad_norm: global gradient-norm clip of each optimizer's gradients (0: none).
        freeze_prefix: train the action expert / decoder and heads only, not the observation encoder.
        critic_warmup: the first N iterations update only the value head (the actor keeps its weights and
            keeps sampling), so the first policy updates use a critic fitted to it rather than a random one.
        precision: the learners' numerics, a name of :data:`policies.precision.PRECISIONS`: ``fp32``, or
            ``bf16`` (the train forward under bfloat16 autocast, the frozen weights, e.g. the prefix with
            ``freeze_prefix``, held in bfloat16; the trained weights stay float32). The env runners sample
            in float32 either way, so with ``bf16`` the first minibatch's approx KL measures the rounding.
        compile: torch.compile the learners' policy's heavy submodules
            (:func:`policies.precision.compile_policy`; eager, with a warning, where it cannot run).
    """

    lr: float = 5e-6
    critic_lr: float | None = 1e-4
    epochs: int = 2
    minibatch_size: int | None = 64
    target_kl: float | None = 0.05
    kl_rollback: bool = False
    max_grad_norm: float = 1.0
    freeze_prefix: bool = True
    critic_warmup: int = 0
    precision: str = "fp32"
    compile: bool = False

    def __post_init__(self) -> None:
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision={self.precision!r}: {PRECISIONS.unknown(self.precision)}")
        if not self.lr >= 0:
            raise ValueError(f"lr={self.lr} must be >= 0 (0 keeps the actor frozen: a control run)")
        if self.critic_lr is not None and not self.critic_lr >= 0:
            raise ValueError(f"critic_lr={self.critic_lr} must be >= 0 (null: no critic)")
        if self.epochs < 1:
            raise ValueError(f"epochs={self.epochs} must be >= 1")
        if self.minibatch_size is not None and self.minibatch_size < 1:
            raise ValueError(f"minibatch_size={self.minibatch_size} must be >= 1 (null: the whole batch per step)")
        if self.target_kl is not None and not self.target_kl > 0:
            raise ValueError(f"target_kl={self.target_kl} must be > 0 (null: no early stop)")
        if not self.max_grad_norm >= 0:
            raise ValueError(f"max_grad_norm={self.max_grad_norm} must be >= 0 (0: no clipping)")
        if self.critic_warmup < 0:
            raise ValueError(f"critic_warmup={self.critic_warmup} must be >= 0")


def explained_variance(pred: torch.Tensor, target: torch.Tensor) -> float:
    """``1 - Var[target - pred] / Var[target]`` (0 when the targets are constant)."""
    var = target.var()
    return float(1.0 - (target - pred).var() / var) if var > 1e-12 else 0.0


STAT_KEYS = ("policy_loss", "value_loss", "entropy", "clip_fraction", "approx_kl")
#: statistics a minibatch may also return whose largest value over the iteration is reported
MAX_KEYS = ("log_ratio_max",)


def gradient_noise_scale(cosine: float, minibatch: int) -> float:
    """The batch size at which a gradient's noise equals its signal, from the cosine between the mean
    gradients of two disjoint minibatches of ``minibatch`` rows each: with ``g_i = G + n_i`` and
    ``E|n_i|^2 = tr(Sigma) / minibatch``, ``cos ~ |G|^2 / (|G|^2 + tr(Sigma) / minibatch)``, so
    ``tr(Sigma) / |G|^2 ~ minibatch * (1 - cos) / cos`` (McCandlish et al. 2018's simple noise scale).
    A minibatch far below it steps mostly on noise. ``inf`` when the cosine is not above 0."""
    return minibatch * (1.0 - cosine) / cosine if cosine > 0 else float("inf")


def run_epochs(
    step: Callable[[torch.Tensor], dict[str, float]],
    total: int,
    *,
    epochs: int,
    minibatch_size: int | None,
    target_kl: float | None = None,
    generator: torch.Generator | None = None,
    undo: Callable[[], None] | None = None,
) -> dict[str, float]:
    """Call ``step(rows)`` once per minibatch: ``epochs`` passes, each over a fresh permutation of the
    ``total`` rows cut evenly (:func:`embodied.algorithms.batch.minibatch_indices`). ``step`` takes one
    gradient step and returns that minibatch's statistics (:data:`STAT_KEYS`, ``approx_kl``
    measured before its step). When a minibatch's approx KL exceeds ``target_kl`` the iteration's
    remaining minibatches and epochs are skipped, and ``undo()`` (when given) takes the actor back to
    its weights before the previous minibatch's step (:attr:`UpdateConfig.kl_rollback`).

    Returns the means over the minibatches run, ``approx_kl_first`` / ``clip_fraction_first`` (the
    first minibatch: how far the weights that sampled the batch already are from the ones that
    train on it), ``approx_kl_max`` (the largest minibatch's) and ``log_ratio_max`` (the largest
    ``|log ratio|`` of one row, when ``step`` reports it: a KL beyond the target that comes from one
    row shows here), ``minibatches``, ``epochs_run``, ``kl_stop`` (1 when the target stopped it),
    ``kl_rollback`` (1 when ``undo`` was called) and ``grad_cos_first``: the cosine between the first two
    minibatches' actor gradients, when ``step`` reports it (``grad_cos``) and both lie in the first
    epoch, on disjoint rows (NaN otherwise).
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
    if stop and undo is not None:
        undo()
    out = {k: float(np.mean([p[k] for p in per])) if per else 0.0 for k in STAT_KEYS}
    out["approx_kl_first"] = float(per[0]["approx_kl"]) if per else 0.0
    out["approx_kl_max"] = float(max(p["approx_kl"] for p in per)) if per else 0.0
    for key in MAX_KEYS:
        out[key] = float(max(p.get(key, 0.0) for p in per)) if per else 0.0
    out["clip_fraction_first"] = float(per[0]["clip_fraction"]) if per else 0.0
    first_two_disjoint = len(per) > 1 and minibatches_per_epoch(total, minibatch_size) > 1
    out["grad_cos_first"] = float(per[1].get("grad_cos", np.nan)) if first_two_disjoint else float("nan")
    out.update(
        minibatches=float(len(per)),
        epochs_run=float(epochs_run),
        kl_stop=float(stop),
        kl_rollback=float(stop and undo is not None),
    )
    return out
