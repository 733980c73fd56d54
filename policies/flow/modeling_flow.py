"""The flow-matching VLA (pi_0-style): a multimodal prefix and an action expert.

Training (flow matching): ``x_t = t*noise + (1-t)*a``, the expert predicts ``noise - a``, with
``t ~ Beta(1.5, 1)``. Sampling: K Euler steps from t=1 to t=0; the prefix is computed once per
chunk and reused by every denoising step. Actions live in the processor's normalised space inside
the model (log-probabilities too); the env receives them unnormalised and clipped to [-1, 1].

``sample`` draws with one of the samplers of :mod:`policies.flow.samplers` (``ode``, ``sde``,
``sde_full``, ``noise``, ``fpo``, ``steer``: each owns its denoising transition, the layout of the
``extras`` it leaves and the log-probability ``logprob`` computes from them).

Value (``value_features``, see :class:`~policies.base.PolicyConfig`): ``detached`` (default) reads
the fused state token and the pooled prefix, detached, plus ``obs["time_left"]`` (1.0 when absent)
in :class:`~policies.base.DetachedValueHead` (a steered policy's steering head reads the same);
``shared`` (bundles from before the field) the pooled prefix (``value_head="prefix"``) or the
expert's output for a zero chunk at t=1 (``"expert"``), with gradients into the encoder and expert.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from policies.base import ENCODED, ChunkSample, DetachedValueHead, Mode, Policy, obs_time_left
from policies.encoders.prefix import PrefixEncoder
from policies.flow import sde as S
from policies.flow.configuration_flow import FlowConfig
from policies.flow.samplers import SAMPLERS, Draw, sampler_index, sampler_of
from policies.flow.steer import NoiseSteer


def timestep_embedding(t: torch.Tensor, dim: int) -> torch.Tensor:
    """Sinusoidal embedding of ``t`` ``[N]`` in [0, 1] -> ``[N, dim]``."""
    half = dim // 2
    freqs = torch.exp(-math.log(1000.0) * torch.arange(half, device=t.device, dtype=torch.float32) / half)
    args = t.float()[:, None] * 1000.0 * freqs[None]
    return torch.cat([torch.sin(args), torch.cos(args)], dim=1)


class ActionExpert(nn.Module):
    """Velocity (and Flow-Noise std) of the H action tokens, attending to the prefix.

    ``forward(x [N, H, A], t [N], prefix [N, T, d], pad [N, T]) -> features [N, H, d]``.
    """

    def __init__(self, config: FlowConfig):
        super().__init__()
        d = config.d_model
        self.inp = nn.Linear(config.action_dim, d)
        self.pos = nn.Parameter(torch.randn(1, config.chunk_size, d) * 0.02)
        self.time = nn.Sequential(nn.Linear(d, d), nn.GELU(), nn.Linear(d, d))
        layer = nn.TransformerDecoderLayer(
            d, config.expert_heads, 4 * d, dropout=0.0, batch_first=True, norm_first=True, activation="gelu"
        )
        self.decoder = nn.TransformerDecoder(layer, config.expert_layers)
        self.norm = nn.LayerNorm(d)
        self.d = d

    def forward(self, x: torch.Tensor, t: torch.Tensor, prefix: torch.Tensor, pad: torch.Tensor) -> torch.Tensor:
        h = self.inp(x) + self.pos + self.time(timestep_embedding(t, self.d))[:, None, :]
        return self.norm(self.decoder(h, prefix, memory_key_padding_mask=pad))


class FlowPolicy(Policy):
    """pi_0-style flow VLA with ODE, Flow-SDE and Flow-Noise samplers (see the module docstring)."""

    family = "flow"
    config_class = FlowConfig

    def __init__(self, config: FlowConfig):
        super().__init__(config)
        d = config.d_model
        self.prefix = PrefixEncoder(config)
        self.expert = ActionExpert(config)
        self.velocity = nn.Linear(d, config.action_dim)
        self.noise_head = nn.Linear(d, config.action_dim)  # Flow-Noise only; dropped at deployment
        self.value_mlp = self._make_value_head()
        self.steer: NoiseSteer | None = None
        if config.sampler == "steer":
            self.add_steer()

    def add_steer(self, use: bool = True) -> NoiseSteer:
        """Attach the DSRL steering module (fresh: the steered policy starts as the flow's own
        distribution; an attached one is kept) and, with ``use``, switch the sampler to ``steer``."""
        c = self.config
        if self.steer is None:
            device = self.velocity.weight.device
            self.steer = NoiseSteer(
                2 * c.d_model,
                c.chunk_size,
                c.action_dim,
                hidden=c.steer_hidden,
                bound=c.steer_bound,
                std_min=c.steer_std_min,
                std_max=c.steer_std_max,
                time_input=c.value_features == "detached",
            ).to(device)
        if use:
            c.sampler = "steer"
        return self.steer

    def load_state_dict(self, state_dict: Any, strict: bool = True, assign: bool = False) -> Any:
        # weights of a once-steered policy (trained on with another sampler) still hold steer.*
        if self.steer is None and any(k.startswith("steer.") for k in state_dict):
            self.add_steer(use=False)
        return super().load_state_dict(state_dict, strict=strict, assign=assign)

    def _make_value_head(self) -> nn.Module:
        c = self.config
        if c.value_features == "detached":
            return DetachedValueHead(2 * c.d_model, c.value_hidden)
        return nn.Sequential(nn.Linear(c.d_model, c.d_model), nn.GELU(), nn.Linear(c.d_model, 1))

    def use_value_features(self, value_features: str) -> None:
        super().use_value_features(value_features)
        if self.steer is not None:  # the steering module's own critic follows
            device = self.steer.head.weight.device
            self.steer.value_mlp = self.steer.make_value_head(value_features == "detached").to(device)

    @property
    def rl_trainable(self) -> str | None:
        """The only submodule RL may train (``steer``: DSRL keeps the flow fixed), or None (all)."""
        return "steer" if self.steer is not None and self.config.sampler == "steer" else None

    # ------------------------------------------------------------------ building blocks
    def encode(self, obs: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
        """Prefix tokens ``[N, T, d]`` and padding mask ``[N, T]`` (once per chunk; ``obs[ENCODED]``
        when the caller holds them already)."""
        if ENCODED in obs:
            return obs[ENCODED]
        return self.prefix(self.processor.prepare(obs, self.device))

    def _features(self, x: torch.Tensor, t: torch.Tensor, prefix: torch.Tensor, pad: torch.Tensor) -> torch.Tensor:
        return self.expert(x, t, prefix, pad)

    def _noise_std(self, feats: torch.Tensor) -> torch.Tensor:
        c = self.config
        return c.noise_std_min + (c.noise_std_max - c.noise_std_min) * torch.sigmoid(self.noise_head(feats))

    def _steer_features(self, prefix: torch.Tensor, pad: torch.Tensor) -> torch.Tensor:
        """The steering module's (and the detached value head's) input ``[N, 2d]``: the fused state
        token (the prefix's last) and the pooled prefix, detached (the flow's encoder stays as SFT
        left it; the value loss moves neither it nor the actor)."""
        return torch.cat([prefix[:, -1], PrefixEncoder.pooled(prefix, pad)], dim=1).detach()

    def _value(self, prefix: torch.Tensor, pad: torch.Tensor, time_left: torch.Tensor) -> torch.Tensor:
        """``[N]`` (``time_left [N]``: see :func:`~policies.base.obs_time_left`). Steered: the steering
        module's own head; ``detached``: :class:`~policies.base.DetachedValueHead` on the detached
        state token and pooled prefix; ``shared``: on the pooled prefix, or on the expert's output for
        a zero chunk at t=1."""
        if self.rl_trainable == "steer":
            return self.steer.value(self._steer_features(prefix, pad), time_left)
        if self.config.value_features == "detached":
            return self.value_mlp(self._steer_features(prefix, pad), time_left)
        if self.config.value_head == "prefix":
            return self.value_mlp(PrefixEncoder.pooled(prefix, pad))[:, 0]
        n = prefix.shape[0]
        zeros = prefix.new_zeros(n, self.config.chunk_size, self.config.action_dim)
        feats = self._features(zeros, prefix.new_ones(n), prefix, pad)
        return self.value_mlp(feats.mean(1))[:, 0]

    def _repeat(self, prefix: torch.Tensor, pad: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        return prefix.repeat_interleave(k, 0), pad.repeat_interleave(k, 0)

    # ------------------------------------------------------------------ the contract
    def sample_with(self, mode: Mode) -> str:
        """The sampler a ``mode`` call draws with: the config's (``explore``), the ODE (``greedy``); a
        steered policy draws its initial noise from its steering Gaussian in both modes (it is the
        policy's noise distribution, as N(0, I) is the plain flow's)."""
        if self.config.sampler == "steer":
            return "steer"
        return "ode" if mode == "greedy" else self.config.sampler

    def sample(
        self, obs: dict[str, Any], *, mode: Mode = "explore", generator: torch.Generator | None = None
    ) -> ChunkSample:
        """A chunk ``[N, H, A]`` by K denoising steps of the sampler :meth:`sample_with` names; ``extras``
        hold what that sampler's log-probability needs (:mod:`policies.flow.samplers`) and its index."""
        cfg = self.config
        prefix, pad = self.encode(obs)
        name = self.sample_with(mode)
        sampler = SAMPLERS.lookup(name)()
        dev = prefix.device
        rng = generator.device if generator is not None else dev
        d = Draw(
            n=prefix.shape[0],
            h=cfg.chunk_size,
            a=cfg.action_dim,
            k_steps=cfg.num_steps,
            prefix=prefix,
            pad=pad,
            normal=lambda shape: torch.randn(shape, generator=generator, device=rng).to(dev),
            uniform=lambda shape: torch.rand(shape, generator=generator, device=rng).to(dev),
            integers=lambda high, shape: torch.randint(0, high, shape, generator=generator, device=rng).to(dev),
        )
        x = sampler.start(self, d)
        d.chain.append(x)
        for k, t_val in enumerate(S.time_grid(cfg.num_steps)):
            t = torch.full((d.n,), t_val, device=dev)
            feats = self._features(x, t, prefix, pad)
            x = sampler.transition(self, d, k, x, t, feats, self.velocity(feats))
            d.chain.append(x)
        sampler.finish(self, d, x)
        # which sampler drew the chunk: logprob() follows it, whatever the config says now
        d.extras["sampler"] = torch.full((d.n,), sampler_index(name), dtype=torch.long, device=dev)
        value = self._value(prefix, pad, obs_time_left(obs, d.n, dev))
        return ChunkSample(
            actions=self.processor.unnormalize_actions(x),
            logprob=d.logprob.detach(),
            value=value.detach(),
            extras={k: v.detach() for k, v in d.extras.items()},
        )

    def logprob(
        self, obs: dict[str, Any], extras: dict[str, torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Exact log-probability, entropy and value ``[N]`` of sampled chunks under the current weights,
        by the sampler that drew them (``extras["sampler"]``; see :mod:`policies.flow.samplers`)."""
        prefix, pad = self.encode(obs)
        value = self._value(prefix, pad, obs_time_left(obs, prefix.shape[0], prefix.device))
        lp, ent = sampler_of(extras, self.config.sampler).logprob(self, prefix, pad, extras)
        return lp, ent, value

    def _fpo_surrogate(
        self, action: torch.Tensor, t: torch.Tensor, eps: torch.Tensor, prefix: torch.Tensor, pad: torch.Tensor
    ) -> torch.Tensor:
        """FPO's log-likelihood surrogate ``[N]`` of normalised chunks ``action [N, H, A]`` from M
        flow-matching draws ``t [N, M]``, ``eps [N, M, H, A]``: minus half the squared velocity error,
        summed over the chunk and averaged over the draws (one batched expert pass of N*M rows)."""
        n, m = t.shape
        a = action[:, None].expand(-1, m, -1, -1).flatten(0, 1)
        rp, rpad = self._repeat(prefix, pad, m)
        err = self._velocity_error(a, t.flatten(), eps.flatten(0, 1), rp, rpad)
        return -0.5 * err.flatten(1).sum(1).reshape(n, m).mean(1)

    def _velocity_error(
        self, action: torch.Tensor, t: torch.Tensor, noise: torch.Tensor, prefix: torch.Tensor, pad: torch.Tensor
    ) -> torch.Tensor:
        """Flow matching's squared error ``[B, H, A]`` at ``x_t = t*noise + (1-t)*action``: the predicted
        velocity against ``noise - action`` (``action``, ``noise`` ``[B, H, A]`` normalised; ``t`` ``[B]``)."""
        x_t = t[:, None, None] * noise + (1.0 - t[:, None, None]) * action
        v = self.velocity(self._features(x_t, t, prefix, pad))
        return (v - (noise - action)) ** 2

    def value(self, obs: dict[str, Any]) -> torch.Tensor:
        prefix, pad = self.encode(obs)
        return self._value(prefix, pad, obs_time_left(obs, prefix.shape[0], prefix.device))

    def sft_loss(self, obs: dict[str, Any], actions: torch.Tensor) -> torch.Tensor:
        """Flow matching: MSE between the predicted velocity and ``noise - actions``."""
        cfg = self.config
        prefix, pad = self.encode(obs)
        a = self.processor.normalize_actions(actions.to(prefix.device))
        n = a.shape[0]
        t = S.flow_time(torch.distributions.Beta(cfg.beta_a, cfg.beta_b).sample((n,)).to(prefix.device))
        noise = torch.randn_like(a)
        return torch.mean(self._velocity_error(a, t, noise, prefix, pad))
