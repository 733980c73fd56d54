"""Configuration of the flow-matching VLA (pi_0-style)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from policies.base import PolicyConfig


@dataclass
class FlowConfig(PolicyConfig):
    """Flow VLA fields (beyond :class:`PolicyConfig`).

    Attributes:
        num_steps: K Euler denoising steps from t=1 (noise) to t=0 (actions); 4-5 in pi_RL.
        sampler: exploration sampler, a name registered in :mod:`policies.flow.samplers`: ``ode`` (deterministic), ``sde`` (Flow-SDE, one uniformly
            drawn stochastic step per call: the accelerated mode), ``sde_full`` (Flow-SDE, every
            step stochastic), ``noise`` (Flow-Noise: learned std on every step). Greedy mode
            always uses the ODE. ``fpo`` (FPO, Flow Policy Optimization): the ODE from random
            noise, the flow's own distribution (the same sampler evaluation runs); its "log-
            probability" is the conditional flow-matching surrogate of ``fpo_samples`` fixed
            (t, noise) draws, so the whole chunk's randomness is credited. ``steer`` (DSRL): the
            flow's weights stay fixed and a small Gaussian policy over its initial noise (see
            :mod:`policies.flow.steer`) picks where the ODE starts, in both modes; a policy with this
            sampler carries the steering module (``steer.*`` weights) in its bundle.
        noise_level: Flow-SDE noise level a in ``sigma_t = a * sqrt(t / (1 - t))`` (0.5 in pi_RL).
        sde_steps: ``sde``: draw the stochastic step from the first ``sde_steps`` denoising steps only
            (None: from all K). The late steps' noise is the smallest, so their log-probabilities' scores
            (``(x - mean) / std^2``) are the largest: they carry most of a batch's gradient norm.
        noise_std_min / noise_std_max: bounds of Flow-Noise's learned std ([0.08, 0.16] in pi_RL).
        expert_layers / expert_heads: the action expert (self-attention over the H action tokens
            and cross-attention to the prefix).
        beta_a / beta_b: t ~ Beta(a, b) during flow-matching training (pi_0: Beta(1.5, 1)).
        fpo_samples: (t, noise) draws per chunk of the ``fpo`` surrogate (FPO: 4-8).
        steer_hidden: width of the steering MLP's two hidden layers (and of its value head's).
        steer_bound: bound of the steered noise mean, ``bound * tanh(.)`` (DSRL bounds its noise actions).
        steer_std_min / steer_std_max: bounds of the steered noise's learned, state-dependent std
            (it starts at 1).
    """

    num_steps: int = 5
    sampler: str = "sde"
    noise_level: float = 0.5
    sde_steps: Optional[int] = None
    noise_std_min: float = 0.08
    noise_std_max: float = 0.16
    expert_layers: int = 2
    expert_heads: int = 4
    beta_a: float = 1.5
    beta_b: float = 1.0
    fpo_samples: int = 4
    steer_hidden: int = 256
    steer_bound: float = 2.0
    steer_std_min: float = 0.05
    steer_std_max: float = 1.2

    def __post_init__(self) -> None:
        from policies.flow.samplers import SAMPLERS  # the registry (torch): imported when a config is made

        if self.sampler not in SAMPLERS:
            raise ValueError(f"FlowConfig.sampler: {SAMPLERS.unknown(self.sampler)}")
        if self.fpo_samples < 1:
            raise ValueError(f"fpo_samples must be >= 1, got {self.fpo_samples}")
        if self.num_steps < 1:
            raise ValueError(f"num_steps must be >= 1, got {self.num_steps}")
        if self.sde_steps is not None and not 1 <= self.sde_steps <= self.num_steps:
            raise ValueError(f"sde_steps must lie in 1..num_steps ({self.num_steps}) or be None, got {self.sde_steps}")
        if not 0 < self.noise_std_min <= self.noise_std_max:
            raise ValueError("need 0 < noise_std_min <= noise_std_max")
        self.check_value_fields()
