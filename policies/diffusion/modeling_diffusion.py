"""Diffusion-policy baseline: a DDPM/DDIM action-chunk generator on diffusers' schedulers.

Architecture (sizes from :class:`~policies.diffusion.configuration_diffusion.DiffusionConfig`):

- the shared :class:`~policies.encoders.prefix.PrefixEncoder` turns the observation into prefix
  tokens ``[N, T, d]`` and their padding mask ``[N, T]``, computed *once per chunk*;
- :class:`ChunkDenoiser`, a small transformer over the H action tokens: each token is the
  projection of one noisy action plus a learned position embedding plus the (MLP of the)
  sinusoidal embedding of the diffusion timestep; every layer self-attends over the H tokens and
  cross-attends to the prefix (padding positions masked out); a linear head predicts, per token,
  the noise (``prediction_type="epsilon"``, default), the clean action (``"sample"``) or the
  velocity (``"v_prediction"``).

Everything happens in the Processor's normalised action space
(:meth:`~policies.processor.Processor.normalize_actions`, dataset mean/std); sampled chunks are
mapped back with :meth:`~policies.processor.Processor.unnormalize_actions`, which clips to the
env's ``[-1, 1]``.

Training (:meth:`DiffusionPolicy.sft_loss`): diffusers' ``DDPMScheduler.add_noise`` at uniformly
drawn timesteps, MSE between the prediction and its target.

Sampling (:meth:`DiffusionPolicy.sample`): diffusers' ``DDIMScheduler`` with the same betas,
``inference_steps`` steps from Gaussian noise ``[N, H, A]``:

- ``mode="explore"``: the initial noise comes from ``generator`` (the global RNG when None),
  DDIM's ``eta = config.ddim_eta`` (default 0: the chunk is a deterministic function of that
  noise; eta > 0 adds per-step noise drawn from the same generator);
- ``mode="greedy"``: deterministic DDIM (eta = 0); the initial noise comes from ``generator``
  when one is given, else from a fresh CPU generator seeded with ``config.greedy_seed``, so
  repeated greedy calls on the same batch return the same chunk.

Diffusion has **no exact log-probability** of a chunk (the likelihood of a DDIM/DDPM sample is
intractable without the whole chain's densities, and DDIM with eta = 0 is deterministic), so
``ChunkSample.logprob`` and ``value`` are zeros and :meth:`DiffusionPolicy.logprob` raises
``NotImplementedError``: this family is for supervised fine-tuning and evaluation; online RL uses
the ``flow`` (Flow-SDE / Flow-Noise) or ``autoregressive`` (PPO / GRPO) families.

The schedulers are plain attributes, not ``nn.Module`` s, rebuilt from the config: they hold no
trained state, so the ``state_dict`` (saved as safetensors) holds only the network's weights.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from diffusers.schedulers.scheduling_ddim import DDIMScheduler
from diffusers.schedulers.scheduling_ddpm import DDPMScheduler
from torch import nn

from policies.base import ChunkSample, Mode, Policy
from policies.diffusion.configuration_diffusion import DiffusionConfig
from policies.encoders.prefix import PrefixEncoder


def sinusoidal_embedding(timesteps: torch.Tensor, dim: int, max_period: float = 10000.0) -> torch.Tensor:
    """Transformer-style sinusoidal embedding of (integer) diffusion timesteps.

    Args:
        timesteps: ``[N]`` timesteps (any numeric dtype).
        dim: embedding size (even or odd; an odd size gets one zero column).

    Returns:
        ``[N, dim]`` float32: ``[cos(t * f_k), sin(t * f_k)]`` with frequencies ``f_k`` from 1 down
        to ``1 / max_period``.
    """
    half = dim // 2
    freqs = torch.exp(
        -math.log(max_period) * torch.arange(half, dtype=torch.float32, device=timesteps.device) / max(half, 1)
    )
    args = timesteps.float()[:, None] * freqs[None, :]
    emb = torch.cat([torch.cos(args), torch.sin(args)], dim=-1)
    if dim % 2:
        emb = F.pad(emb, (0, 1))
    return emb


class ChunkDenoiser(nn.Module):
    """Transformer over the H noisy action tokens, cross-attending to the prefix.

    ``forward(noisy [N, H, A], timesteps [N], prefix [N, T, d], pad [N, T]) -> [N, H, A]``: the
    prediction selected by ``prediction_type`` (noise by default).
    """

    def __init__(self, config: DiffusionConfig):
        super().__init__()
        d, h, a = config.d_model, config.chunk_size, config.action_dim
        self.d_model = d
        self.action_in = nn.Linear(a, d)
        self.pos_emb = nn.Parameter(torch.randn(1, h, d) * 0.02)
        self.time_mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.SiLU(), nn.Linear(4 * d, d))
        layer = nn.TransformerDecoderLayer(
            d, config.denoiser_heads, 4 * d, dropout=0.0, batch_first=True, norm_first=True, activation="gelu"
        )
        self.blocks = nn.TransformerDecoder(layer, config.denoiser_layers)
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, a)

    def forward(
        self, noisy: torch.Tensor, timesteps: torch.Tensor, prefix: torch.Tensor, pad: torch.Tensor
    ) -> torch.Tensor:
        """Predict from noisy chunks.

        Args:
            noisy: ``[N, H, A]`` noisy normalised action chunks.
            timesteps: ``[N]`` diffusion timesteps in ``[0, train_timesteps)``.
            prefix: ``[N, T, d]`` prefix tokens.
            pad: ``[N, T]`` bool, True at prefix padding positions (not attended to).

        Returns:
            ``[N, H, A]`` prediction (noise, clean chunk or velocity).
        """
        temb = self.time_mlp(sinusoidal_embedding(timesteps, self.d_model))  # [N, d]
        x = self.action_in(noisy) + self.pos_emb + temb[:, None, :]  # [N, H, d]
        x = self.blocks(x, prefix, memory_key_padding_mask=pad)
        return self.head(self.norm(x))


class DiffusionPolicy(Policy):
    """Diffusion-policy baseline (SFT and evaluation; no RL: see the module docstring)."""

    family = "diffusion"
    config_class = DiffusionConfig

    def __init__(self, config: DiffusionConfig):
        if not isinstance(config, DiffusionConfig):
            raise TypeError(f"DiffusionPolicy needs a DiffusionConfig, got {type(config).__name__}")
        super().__init__(config)
        self.config: DiffusionConfig = config
        self.encoder = PrefixEncoder(config)
        self.denoiser = ChunkDenoiser(config)
        self._build_schedulers()

    # ------------------------------------------------------------------ schedulers
    def _build_schedulers(self) -> None:
        """(Re)build the DDPM (training) and DDIM (sampling) schedulers from the config.

        Both share ``train_timesteps``, the beta schedule and the prediction type, so DDIM inverts
        exactly the forward process the denoiser was trained on. Plain attributes, not modules:
        nothing of theirs enters the ``state_dict``.
        """
        c = self.config
        common: dict[str, Any] = {
            "num_train_timesteps": c.train_timesteps,
            "beta_schedule": c.beta_schedule,
            "beta_start": c.beta_start,
            "beta_end": c.beta_end,
            "prediction_type": c.prediction_type,
            "clip_sample": c.clip_sample > 0,
            "clip_sample_range": c.clip_sample if c.clip_sample > 0 else 1.0,
        }
        self.train_scheduler = DDPMScheduler(**common)
        self.sample_scheduler = DDIMScheduler(**common, set_alpha_to_one=True, steps_offset=0)
        self.sample_scheduler.set_timesteps(c.inference_steps)
        # Python ints: indexing the (CPU) scheduler tables works whatever device the model is on.
        self._sample_timesteps: list[int] = [int(t) for t in self.sample_scheduler.timesteps]

    # ------------------------------------------------------------------ helpers
    def _prefix(self, obs: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
        """Prefix tokens ``[N, T, d]`` and padding mask ``[N, T]`` of a batch of observations."""
        return self.encoder(self.processor.prepare(obs, self.device))

    def _check_actions(self, actions: torch.Tensor) -> None:
        want = (self.chunk_size, self.action_dim)
        if actions.ndim != 3 or tuple(actions.shape[1:]) != want:
            raise ValueError(
                f"actions must be [N, {want[0]}, {want[1]}] (chunk_size, action_dim), got {tuple(actions.shape)}"
            )

    @staticmethod
    def _randn(shape: tuple[int, ...], generator: torch.Generator | None, device: torch.device) -> torch.Tensor:
        """Standard normal ``shape`` drawn from ``generator`` (on its own device), moved to ``device``."""
        if generator is None:
            return torch.randn(shape, device=device)
        return torch.randn(shape, generator=generator, device=generator.device).to(device)

    # ------------------------------------------------------------------ contract
    @torch.no_grad()
    def sample(
        self, obs: dict[str, Any], *, mode: Mode = "explore", generator: torch.Generator | None = None
    ) -> ChunkSample:
        """Sample action chunks by DDIM (no gradients).

        Args:
            obs: ``rgb`` uint8 ``[N, V, H_img, W_img, 3]``, ``state`` ``[N, S]``, ``instruction``
                (N strings).
            mode: ``"explore"`` (initial noise from ``generator``, eta = ``config.ddim_eta``) or
                ``"greedy"`` (eta = 0; initial noise from ``generator`` or, without one, from a
                CPU generator seeded with ``config.greedy_seed``).
            generator: source of the initial noise (and of DDIM's per-step noise when eta > 0).

        Returns:
            ``ChunkSample(actions [N, H, A] in [-1, 1], logprob zeros [N], value zeros [N],
            extras={})``: diffusion has no exact log-probability (see :meth:`logprob`).
        """
        if mode not in ("explore", "greedy"):
            raise ValueError(f"mode must be 'explore' or 'greedy', got {mode!r}")
        device = self.device
        prefix, pad = self._prefix(obs)
        n = prefix.shape[0]
        eta = self.config.ddim_eta
        if mode == "greedy":
            eta = 0.0
            if generator is None:
                generator = torch.Generator().manual_seed(self.config.greedy_seed)
        x = self._randn((n, self.chunk_size, self.action_dim), generator, device)
        sched = self.sample_scheduler
        for t in self._sample_timesteps:
            tt = torch.full((n,), t, dtype=torch.long, device=device)
            pred = self.denoiser(x, tt, prefix, pad)
            x = sched.step(pred, t, x, eta=eta, generator=generator if eta > 0 else None).prev_sample
        actions = self.processor.unnormalize_actions(x)
        zeros = torch.zeros(n, device=device)
        return ChunkSample(actions=actions, logprob=zeros, value=zeros.clone(), extras={})

    def logprob(
        self, obs: dict[str, Any], extras: dict[str, torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Not available: raises ``NotImplementedError``.

        The likelihood of a diffusion sample is intractable (DDIM with eta = 0 is even a
        deterministic map from the initial noise), so no PPO/GRPO ratio can be formed.
        """
        raise NotImplementedError(
            "the 'diffusion' policy family has no exact log-probability of an action chunk (DDIM sampling is "
            "a deterministic map of the initial noise; the DDPM chain's likelihood is intractable), so it "
            "supports supervised fine-tuning and evaluation only. For online RL use the 'flow' family "
            "(Flow-SDE / Flow-Noise) or the 'autoregressive' family (PPO / GRPO)."
        )

    def sft_loss(
        self, obs: dict[str, Any], actions: torch.Tensor, *, generator: torch.Generator | None = None
    ) -> torch.Tensor:
        """DDPM denoising loss (scalar) for expert chunks.

        Args:
            obs: a batch of N observations (see :meth:`sample`).
            actions: ``[N, H, A]`` expert chunks in ``[-1, 1]`` (normalised inside).
            generator: optional source of the timesteps ``[N]`` (uniform in
                ``[0, train_timesteps)``) and the noise ``[N, H, A]``; the global RNG when None.

        Returns:
            MSE between the denoiser's prediction and its target (the noise for ``"epsilon"``,
            the clean normalised chunk for ``"sample"``, the velocity for ``"v_prediction"``).
        """
        self._check_actions(actions)
        device = self.device
        prefix, pad = self._prefix(obs)
        x0 = self.processor.normalize_actions(actions.to(device))
        n = x0.shape[0]
        if n != prefix.shape[0]:
            raise ValueError(f"{n} action chunks for a batch of {prefix.shape[0]} observations")
        noise = self._randn(tuple(x0.shape), generator, device)
        if generator is None:
            timesteps = torch.randint(0, self.config.train_timesteps, (n,), device=device)
        else:
            timesteps = torch.randint(
                0, self.config.train_timesteps, (n,), generator=generator, device=generator.device
            ).to(device)
        noisy = self.train_scheduler.add_noise(x0, noise, timesteps)
        pred = self.denoiser(noisy, timesteps, prefix, pad)
        if self.config.prediction_type == "epsilon":
            target = noise
        elif self.config.prediction_type == "sample":
            target = x0
        else:
            target = self.train_scheduler.get_velocity(x0, noise, timesteps)
        return F.mse_loss(pred, target)
