"""The flow policy's samplers: one small registered class per way of drawing a chunk.

A sampler owns three things: its denoising transition (:meth:`FlowSampler.transition`, called at each
of the K steps with the velocity the expert predicted), the layout of the ``extras`` it leaves in a
:class:`~policies.base.ChunkSample`, and the log-probability of a chunk from those extras
(:meth:`FlowSampler.logprob`). :meth:`FlowPolicy.sample` and :meth:`FlowPolicy.logprob` only look the
sampler up (by the config's name, or by the index a sampled chunk carries in ``extras["sampler"]``)
and call it. A new sampler is a subclass registered here with :func:`register_sampler`; its name is
then valid in ``FlowConfig.sampler`` and in the algorithms' YAML.

Registration order fixes each sampler's index in ``extras["sampler"]``: append, never reorder.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Protocol

import torch

import policies.flow.sde as S
from sims.registry import Registry


class FlowPolicy(Protocol):
    """What a sampler uses of the policy (:class:`policies.flow.modeling_flow.FlowPolicy`)."""

    config: Any
    steer: Any

    def velocity(self, feats: torch.Tensor) -> torch.Tensor: ...
    def _features(self, x: torch.Tensor, t: torch.Tensor, prefix: torch.Tensor, pad: torch.Tensor) -> torch.Tensor: ...
    def _noise_std(self, feats: torch.Tensor) -> torch.Tensor: ...
    def _steer_features(self, prefix: torch.Tensor, pad: torch.Tensor) -> torch.Tensor: ...
    def _repeat(self, prefix: torch.Tensor, pad: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]: ...
    def _fpo_surrogate(
        self, action: torch.Tensor, t: torch.Tensor, eps: torch.Tensor, prefix: torch.Tensor, pad: torch.Tensor
    ) -> torch.Tensor: ...


@dataclass
class Draw:
    """One ``sample`` call's state: the batch ``n`` of chunks ``[n, h, a]`` over ``k_steps`` denoising steps
    of size ``dt``, the prefix ``[n, T, d]`` / ``pad [n, T]``, the call's random draws (``normal``,
    ``uniform``, ``integers``: on the generator the caller passed) and what the sampler builds up:
    ``logprob [n]``, ``extras`` and the ``chain`` of every x so far (``[n, h, a]`` each)."""

    n: int
    h: int
    a: int
    k_steps: int
    prefix: torch.Tensor
    pad: torch.Tensor
    normal: Callable[[tuple[int, ...]], torch.Tensor]
    uniform: Callable[[tuple[int, ...]], torch.Tensor]
    integers: Callable[[int, tuple[int, ...]], torch.Tensor]
    logprob: torch.Tensor = field(init=False)
    extras: dict[str, torch.Tensor] = field(default_factory=dict)
    chain: list[torch.Tensor] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.logprob = torch.zeros(self.n, device=self.prefix.device)

    @property
    def dt(self) -> float:
        return 1.0 / self.k_steps


class FlowSampler:
    """The ODE (Euler) from standard normal noise: deterministic, log-probability 0. The base of the others.

    Extras: ``chain [N, K+1, H, A]``.
    """

    name: ClassVar[str] = "ode"
    #: whether its chunks carry a log-probability RL can train on (the ODE's is 0: it does not explore)
    explores: ClassVar[bool] = False

    def start(self, policy: FlowPolicy, d: Draw) -> torch.Tensor:
        """The initial noise ``x_1 [n, h, a]``."""
        return d.normal((d.n, d.h, d.a))

    def transition(
        self,
        policy: FlowPolicy,
        d: Draw,
        k: int,
        x: torch.Tensor,
        t: torch.Tensor,
        feats: torch.Tensor,
        v: torch.Tensor,
    ) -> torch.Tensor:
        """``x_{t - dt}`` from ``x [n, h, a]`` at step ``k`` (time ``t [n]``), the expert's features
        ``feats [n, h, d]`` and velocity ``v [n, h, a]`` there."""
        return S.ode_step(x, v, d.dt)

    def finish(self, policy: FlowPolicy, d: Draw, x: torch.Tensor) -> None:
        """Fill ``d.extras`` (and ``d.logprob``) once the chunk ``x [n, h, a]`` is drawn."""
        d.extras["chain"] = torch.stack(d.chain, dim=1)

    def logprob(
        self, policy: FlowPolicy, prefix: torch.Tensor, pad: torch.Tensor, extras: dict[str, torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Log-probability and entropy ``[N]`` of the chunks these extras describe, under the weights now."""
        zero = torch.zeros(prefix.shape[0], device=prefix.device)
        return zero, zero


class ChainSampler(FlowSampler):
    """Every denoising step stochastic; the log-probability sums the K Gaussian transitions of the
    recorded ``chain [N, K+1, H, A]`` (one batched expert pass). Subclasses give the transition's
    mean and std."""

    explores = True

    def gaussian(
        self, policy: FlowPolicy, x: torch.Tensor, t: torch.Tensor, feats: torch.Tensor, v: torch.Tensor, dt: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def transition(
        self,
        policy: FlowPolicy,
        d: Draw,
        k: int,
        x: torch.Tensor,
        t: torch.Tensor,
        feats: torch.Tensor,
        v: torch.Tensor,
    ) -> torch.Tensor:
        mean, std = self.gaussian(policy, x, t, feats, v, d.dt)
        noisy = mean + std * d.normal(tuple(mean.shape))
        d.logprob = d.logprob + S.gaussian_logprob(noisy, mean, std)
        return noisy

    def logprob(
        self, policy: FlowPolicy, prefix: torch.Tensor, pad: torch.Tensor, extras: dict[str, torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if "chain" not in extras:
            raise KeyError(f"{self.name} chunks need extras 'chain' [N, K+1, H, A]")
        chain = extras["chain"].to(prefix.device)
        n, k_steps = chain.shape[0], chain.shape[1] - 1
        x_t, x_next = chain[:, :-1].flatten(0, 1), chain[:, 1:].flatten(0, 1)  # [N*K, H, A]
        t = torch.tensor(S.time_grid(k_steps), device=prefix.device).repeat(n)
        rp, rpad = policy._repeat(prefix, pad, k_steps)
        feats = policy._features(x_t, t, rp, rpad)
        mean, std = self.gaussian(policy, x_t, t, feats, policy.velocity(feats), 1.0 / k_steps)
        lp = S.gaussian_logprob(x_next, mean, std).reshape(n, k_steps).sum(1)
        return lp, S.gaussian_entropy(std).reshape(n, k_steps).sum(1)


class SDEFullSampler(ChainSampler):
    """Flow-SDE with every step stochastic (:func:`policies.flow.sde.sde_step`, noise level
    ``config.noise_level``)."""

    name = "sde_full"

    def gaussian(
        self, policy: FlowPolicy, x: torch.Tensor, t: torch.Tensor, feats: torch.Tensor, v: torch.Tensor, dt: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return S.sde_step(x, v, t, dt, policy.config.noise_level)


class NoiseSampler(ChainSampler):
    """Flow-Noise: the ODE step's mean with the learned, bounded std of the noise head."""

    name = "noise"

    def gaussian(
        self, policy: FlowPolicy, x: torch.Tensor, t: torch.Tensor, feats: torch.Tensor, v: torch.Tensor, dt: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return S.ode_step(x, v, dt), policy._noise_std(feats)


class SDESampler(FlowSampler):
    """Accelerated Flow-SDE: one stochastic step per chunk, drawn uniformly per sample from the first
    ``config.sde_steps`` steps (all K when None); the others follow the ODE. The log-probability is
    that one transition's.

    Extras: ``step [N]`` (its index), ``x_t`` and ``x_next [N, H, A]`` (its two ends).
    """

    explores = True

    name = "sde"

    def start(self, policy: FlowPolicy, d: Draw) -> torch.Tensor:
        x = d.normal((d.n, d.h, d.a))
        d.extras["step"] = d.integers(policy.config.sde_steps or d.k_steps, (d.n,))
        return x

    def transition(
        self,
        policy: FlowPolicy,
        d: Draw,
        k: int,
        x: torch.Tensor,
        t: torch.Tensor,
        feats: torch.Tensor,
        v: torch.Tensor,
    ) -> torch.Tensor:
        mean, std = S.sde_step(x, v, t, d.dt, policy.config.noise_level)
        noisy = mean + std * d.normal(tuple(mean.shape))  # drawn at every step: one stream per call
        is_k = d.extras["step"] == k
        x_next = torch.where(is_k[:, None, None], noisy, S.ode_step(x, v, d.dt))
        d.logprob = torch.where(is_k, S.gaussian_logprob(noisy, mean, std), d.logprob)
        S.keep_stochastic_step(d.extras, k, is_k, x, x_next)
        return x_next

    def finish(self, policy: FlowPolicy, d: Draw, x: torch.Tensor) -> None:
        d.extras["step"] = d.extras.pop("step")  # after x_t and x_next, as the extras have always been laid out

    def logprob(
        self, policy: FlowPolicy, prefix: torch.Tensor, pad: torch.Tensor, extras: dict[str, torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not {"step", "x_t", "x_next"} <= extras.keys():
            raise KeyError("sde chunks need extras 'step' [N], 'x_t' and 'x_next' [N, H, A]")
        x_t, x_next = extras["x_t"].to(prefix.device), extras["x_next"].to(prefix.device)
        t = 1.0 - extras["step"].to(prefix.device).float() / policy.config.num_steps
        v = policy.velocity(policy._features(x_t, t, prefix, pad))
        mean, std = S.sde_step(x_t, v, t, 1.0 / policy.config.num_steps, policy.config.noise_level)
        return S.gaussian_logprob(x_next, mean, std), S.gaussian_entropy(std)


class FPOSampler(FlowSampler):
    """FPO (Flow Policy Optimization): the ODE from random noise; the "log-probability" is the
    flow-matching surrogate of ``config.fpo_samples`` fixed (t, noise) draws
    (:meth:`FlowPolicy._fpo_surrogate`), no entropy.

    Extras: ``action [N, H, A]`` (the chunk, normalised), ``fpo_t [N, M]``, ``fpo_eps [N, M, H, A]``.
    """

    explores = True

    name = "fpo"

    def finish(self, policy: FlowPolicy, d: Draw, x: torch.Tensor) -> None:
        m = policy.config.fpo_samples
        fpo_t = S.flow_time(d.uniform((d.n, m)))
        fpo_eps = d.normal((d.n, m, d.h, d.a))
        d.logprob = policy._fpo_surrogate(x, fpo_t, fpo_eps, d.prefix, d.pad)
        d.extras.update(action=x, fpo_t=fpo_t, fpo_eps=fpo_eps)

    def logprob(
        self, policy: FlowPolicy, prefix: torch.Tensor, pad: torch.Tensor, extras: dict[str, torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not {"action", "fpo_t", "fpo_eps"} <= extras.keys():
            raise KeyError("fpo chunks need extras 'action' [N, H, A], 'fpo_t' [N, M] and 'fpo_eps' [N, M, H, A]")
        dev = prefix.device
        lp = policy._fpo_surrogate(
            extras["action"].to(dev), extras["fpo_t"].to(dev), extras["fpo_eps"].to(dev), prefix, pad
        )
        return lp, torch.zeros_like(lp)  # no closed-form entropy: FPO has no entropy bonus


class SteerSampler(FlowSampler):
    """DSRL (:mod:`policies.flow.steer`): the initial noise from the steering Gaussian, then the ODE;
    the log-probability and entropy are that Gaussian's. Used in both modes.

    Extras: ``steer_w [N, H, A]`` (the initial noise).
    """

    explores = True

    name = "steer"

    def start(self, policy: FlowPolicy, d: Draw) -> torch.Tensor:
        if policy.steer is None:
            raise RuntimeError("sampler='steer' needs the steering module: call policy.add_steer() first")
        mean, std = policy.steer(policy._steer_features(d.prefix, d.pad))
        x = mean + std * d.normal((d.n, d.h, d.a))
        d.logprob = S.gaussian_logprob(x, mean, std)
        d.extras["steer_w"] = x
        return x

    def finish(self, policy: FlowPolicy, d: Draw, x: torch.Tensor) -> None:
        pass

    def logprob(
        self, policy: FlowPolicy, prefix: torch.Tensor, pad: torch.Tensor, extras: dict[str, torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if policy.steer is None:
            raise RuntimeError("these chunks were steered (extras 'steer_w') but the policy has no steering module")
        if "steer_w" not in extras:
            raise KeyError("steer chunks need extras 'steer_w' [N, H, A]")
        mean, std = policy.steer(policy._steer_features(prefix, pad))
        return S.gaussian_logprob(extras["steer_w"].to(prefix.device), mean, std), S.gaussian_entropy(std)


#: the samplers by name, in index order (``extras["sampler"]``)
SAMPLERS: Registry[type[FlowSampler]] = Registry("flow sampler")


def register_sampler(cls: type[FlowSampler]) -> type[FlowSampler]:
    """Register a sampler class under its ``name`` (usable as a decorator)."""
    SAMPLERS.register(cls.name, cls)
    return cls


for _cls in (FlowSampler, SDESampler, SDEFullSampler, NoiseSampler, FPOSampler, SteerSampler):
    register_sampler(_cls)


def sampler_index(name: str) -> int:
    """The index ``extras["sampler"]`` holds for sampler ``name``."""
    return SAMPLERS.names().index(name)


#: for extras without ``sampler``: the sampler whose own key they hold
_KEYED = (("steer_w", "steer"), ("fpo_t", "fpo"), ("step", "sde"))


def sampler_of(extras: dict[str, torch.Tensor], default: str) -> FlowSampler:
    """The sampler that drew the chunks of ``extras``: by ``extras["sampler"]``, else by the keys only one
    sampler leaves, else ``default``; ``ValueError`` when the chunks mix samplers."""
    if "sampler" not in extras:
        name = next((n for key, n in _KEYED if key in extras), default)
        return SAMPLERS.lookup(name)()
    ids = extras["sampler"]
    if not bool((ids == ids[0]).all()):
        raise ValueError("extras mix chunks of different samplers; compute their log-probs separately")
    return SAMPLERS[SAMPLERS.names()[int(ids[0])]]()


__all__ = [
    "SAMPLERS",
    "ChainSampler",
    "Draw",
    "FPOSampler",
    "FlowSampler",
    "NoiseSampler",
    "SDEFullSampler",
    "SDESampler",
    "SteerSampler",
    "register_sampler",
    "sampler_index",
    "sampler_of",
]
