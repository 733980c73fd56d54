"""The flow-matching VLA (pi_0-style): a multimodal prefix and an action expert.

Training (flow matching): ``x_t = t*noise + (1-t)*a``, the expert predicts ``noise - a``, with
``t ~ Beta(1.5, 1)``. Sampling: K Euler steps from t=1 to t=0; the prefix is computed once per
chunk and reused by every denoising step. Actions live in the processor's normalised space inside
the model (log-probabilities too); the env receives them unnormalised and clipped to [-1, 1].

``sample`` returns in ``extras`` what ``logprob`` needs:
- ``sde``: ``step`` [N] (the stochastic step index), ``x_t`` and ``x_next`` [N, H, A];
- ``sde_full`` and ``noise``: ``chain`` [N, K+1, H, A] (every intermediate x);
- ``ode``/greedy: ``chain`` as well (log-probability 0: the ODE is deterministic);
- ``fpo``: ``action`` [N, H, A] (the sampled chunk, normalised), ``fpo_t`` [N, M] and
  ``fpo_eps`` [N, M, H, A]: M fixed flow-matching draws. The "log-probability" is FPO's
  surrogate ``-1/2 * mean_j ||v(x_tj, t_j) - (eps_j - a)||^2`` (summed over the H*A
  dimensions), so a PPO ratio of two weights is ``exp(L_old - L_new)``, FPO's ratio of the
  flow-matching losses (McAllister et al., 2025, "Flow Matching Policy Gradients");
- ``steer`` (DSRL, :mod:`policies.flow.steer`): ``steer_w`` [N, H, A], the initial noise drawn from
  the steering Gaussian; the ODE from it gives the chunk, and the log-probability (and entropy) is
  that Gaussian's. The flow itself gets no gradient, and the value comes from the steering module's
  own head on the detached prefix.

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
from policies.flow.configuration_flow import SAMPLERS, FlowConfig
from policies.flow.steer import NoiseSteer


def _flow_time(u: torch.Tensor) -> torch.Tensor:
    """Flow-matching times from draws ``u`` in [0, 1], kept off the ends: ``0.999 * u + 0.001``."""
    return 0.999 * u + 0.001


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
        layer = nn.TransformerDecoderLayer(d, config.expert_heads, 4 * d, dropout=0.0, batch_first=True,
                                           norm_first=True, activation="gelu")
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
            self.steer = NoiseSteer(2 * c.d_model, c.chunk_size, c.action_dim, hidden=c.steer_hidden,
                                    bound=c.steer_bound, std_min=c.steer_std_min, std_max=c.steer_std_max,
                                    time_input=c.value_features == "detached").to(device)
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
    def sample(self, obs: dict[str, Any], *, mode: Mode = "explore",
               generator: torch.Generator | None = None) -> ChunkSample:
        cfg = self.config
        prefix, pad = self.encode(obs)
        n, h, a, k_steps = prefix.shape[0], cfg.chunk_size, cfg.action_dim, cfg.num_steps
        dt = 1.0 / k_steps
        # greedy mode runs the ODE from random noise; a steered policy draws that noise from its steering
        # Gaussian in both modes (it is the policy's noise distribution, as N(0, I) is the plain flow's)
        sampler = "steer" if cfg.sampler == "steer" else "ode" if mode == "greedy" else cfg.sampler
        if sampler == "steer" and self.steer is None:
            raise RuntimeError("sampler='steer' needs the steering module: call policy.add_steer() first")
        rng_device = generator.device if generator is not None else prefix.device

        def normal(shape: tuple[int, ...]) -> torch.Tensor:
            return torch.randn(shape, generator=generator, device=rng_device).to(prefix.device)

        x = normal((n, h, a))
        logprob = torch.zeros(n, device=prefix.device)
        if sampler == "steer":
            mean, std = self.steer(self._steer_features(prefix, pad))
            x = mean + std * x
            logprob = S.gaussian_logprob(x, mean, std)
            steer_w = x
        chain = [x]
        if sampler == "sde":  # one stochastic step per chunk, drawn uniformly per sample
            stoch = torch.randint(0, cfg.sde_steps or k_steps, (n,), generator=generator,
                                  device=rng_device).to(prefix.device)
        extras: dict[str, torch.Tensor] = {}
        for k, t_val in enumerate(S.time_grid(k_steps)):
            t = torch.full((n,), t_val, device=prefix.device)
            feats = self._features(x, t, prefix, pad)
            v = self.velocity(feats)
            if sampler in ("ode", "fpo", "steer"):
                x_next = S.ode_step(x, v, dt)
            else:
                if sampler == "noise":
                    mean, std = S.ode_step(x, v, dt), self._noise_std(feats)
                else:
                    mean, std = S.sde_step(x, v, t, dt, cfg.noise_level)
                eps = normal(tuple(mean.shape))
                noisy = mean + std * eps
                if sampler == "sde":
                    is_k = (stoch == k)
                    x_next = torch.where(is_k[:, None, None], noisy, S.ode_step(x, v, dt))
                    lp = S.gaussian_logprob(noisy, mean, std)
                    logprob = torch.where(is_k, lp, logprob)
                    S.keep_stochastic_step(extras, k, is_k, x, x_next)
                else:
                    x_next = noisy
                    logprob = logprob + S.gaussian_logprob(noisy, mean, std)
            x = x_next
            chain.append(x)
        if sampler == "fpo":
            u = torch.rand((n, cfg.fpo_samples), generator=generator, device=rng_device).to(prefix.device)
            fpo_t = _flow_time(u)
            fpo_eps = normal((n, cfg.fpo_samples, h, a))
            logprob = self._fpo_surrogate(x, fpo_t, fpo_eps, prefix, pad)
            extras = {"action": x, "fpo_t": fpo_t, "fpo_eps": fpo_eps}
        elif sampler == "sde":
            extras["step"] = stoch
        elif sampler == "steer":
            extras = {"steer_w": steer_w}
        else:
            extras["chain"] = torch.stack(chain, dim=1)
        # which sampler produced the chunk: logprob() follows it, whatever the config says now
        extras["sampler"] = torch.full((n,), SAMPLERS.index(sampler), dtype=torch.long, device=prefix.device)
        actions = self.processor.unnormalize_actions(x)
        value = self._value(prefix, pad, obs_time_left(obs, n, prefix.device))
        return ChunkSample(actions=actions, logprob=logprob.detach(), value=value.detach(),
                           extras={k: v.detach() for k, v in extras.items()})

    def logprob(self, obs: dict[str, Any], extras: dict[str, torch.Tensor]
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Exact log-probability of the sampled chunk under the current weights.

        ``sde``: the one stochastic transition; ``sde_full``/``noise``: the sum over all K.
        """
        cfg = self.config
        prefix, pad = self.encode(obs)
        n, k_steps = prefix.shape[0], cfg.num_steps
        value = self._value(prefix, pad, obs_time_left(obs, n, prefix.device))
        dt = 1.0 / k_steps
        if "steer_w" in extras:
            if self.steer is None:
                raise RuntimeError("these chunks were steered (extras 'steer_w') but the policy has no steering module")
            mean, std = self.steer(self._steer_features(prefix, pad))
            return S.gaussian_logprob(extras["steer_w"].to(prefix.device), mean, std), S.gaussian_entropy(std), value
        if "fpo_t" in extras:
            dev = prefix.device
            lp = self._fpo_surrogate(extras["action"].to(dev), extras["fpo_t"].to(dev), extras["fpo_eps"].to(dev),
                                     prefix, pad)
            return lp, torch.zeros_like(lp), value  # no closed-form entropy: FPO has no entropy bonus
        if "step" in extras:
            x_t, x_next = extras["x_t"].to(prefix.device), extras["x_next"].to(prefix.device)
            t = 1.0 - extras["step"].to(prefix.device).float() * dt
            v = self.velocity(self._features(x_t, t, prefix, pad))
            mean, std = S.sde_step(x_t, v, t, dt, cfg.noise_level)
            return S.gaussian_logprob(x_next, mean, std), S.gaussian_entropy(std), value
        if "chain" not in extras:
            raise KeyError("extras need 'step', 'x_t', 'x_next' (Flow-SDE) or 'chain' (full chain / Flow-Noise)")
        chain = extras["chain"].to(prefix.device)  # [N, K+1, H, A]
        kind = SAMPLERS[int(extras["sampler"][0])] if "sampler" in extras else cfg.sampler
        if "sampler" in extras and not bool((extras["sampler"] == extras["sampler"][0]).all()):
            raise ValueError("extras mix chunks of different samplers; compute their log-probs separately")
        if kind == "ode":
            zero = torch.zeros(n, device=prefix.device)
            return zero, zero, value
        # every transition in one batched expert pass: [N*K, H, A]
        x_t = chain[:, :-1].flatten(0, 1)
        x_next = chain[:, 1:].flatten(0, 1)
        t = torch.tensor(S.time_grid(k_steps), device=prefix.device).repeat(n)
        rp, rpad = self._repeat(prefix, pad, k_steps)
        feats = self._features(x_t, t, rp, rpad)
        v = self.velocity(feats)
        if kind == "noise":
            mean, std = S.ode_step(x_t, v, dt), self._noise_std(feats)
        else:
            mean, std = S.sde_step(x_t, v, t, dt, cfg.noise_level)
        lp = S.gaussian_logprob(x_next, mean, std).reshape(n, k_steps).sum(1)
        ent = S.gaussian_entropy(std).reshape(n, k_steps).sum(1)
        return lp, ent, value

    def _fpo_surrogate(self, action: torch.Tensor, t: torch.Tensor, eps: torch.Tensor, prefix: torch.Tensor,
                       pad: torch.Tensor) -> torch.Tensor:
        """FPO's log-likelihood surrogate ``[N]`` of normalised chunks ``action [N, H, A]`` from M
        flow-matching draws ``t [N, M]``, ``eps [N, M, H, A]``: minus half the squared velocity error,
        summed over the chunk and averaged over the draws (one batched expert pass of N*M rows)."""
        n, m = t.shape
        a = action[:, None].expand(-1, m, -1, -1).flatten(0, 1)
        rp, rpad = self._repeat(prefix, pad, m)
        err = self._velocity_error(a, t.flatten(), eps.flatten(0, 1), rp, rpad)
        return -0.5 * err.flatten(1).sum(1).reshape(n, m).mean(1)

    def _velocity_error(self, action: torch.Tensor, t: torch.Tensor, noise: torch.Tensor, prefix: torch.Tensor,
                        pad: torch.Tensor) -> torch.Tensor:
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
        t = _flow_time(torch.distributions.Beta(cfg.beta_a, cfg.beta_b).sample((n,)).to(prefix.device))
        noise = torch.randn_like(a)
        return torch.mean(self._velocity_error(a, t, noise, prefix, pad))
