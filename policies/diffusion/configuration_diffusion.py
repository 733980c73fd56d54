"""Configuration of the diffusion-policy baseline (:class:`policies.diffusion.DiffusionPolicy`)."""

from __future__ import annotations

from dataclasses import dataclass

from policies.base import PolicyConfig

BETA_SCHEDULES = ("linear", "scaled_linear", "squaredcos_cap_v2", "sigmoid")
PREDICTION_TYPES = ("epsilon", "sample", "v_prediction")


@dataclass
class DiffusionConfig(PolicyConfig):
    """A DDPM-trained, DDIM-sampled action-chunk generator (Chi et al.'s Diffusion Policy, on
    diffusers' schedulers) conditioned on the shared multimodal prefix.

    Every field below is part of ``config.json`` in a checkpoint; the schedulers are rebuilt from
    these fields when a checkpoint loads (they hold no trained state).
    """

    # DDPM training: number of diffusion steps of the forward (noising) process.
    train_timesteps: int = 100
    # DDIM sampling: denoising steps per chunk (<= train_timesteps; 10 -> timesteps 90, 80, ..., 0).
    inference_steps: int = 10
    # Noise schedule of both schedulers: "squaredcos_cap_v2" (cosine), "linear", "scaled_linear", "sigmoid".
    beta_schedule: str = "squaredcos_cap_v2"
    # First beta of the "linear"/"scaled_linear"/"sigmoid" schedules (unused by the cosine schedule).
    beta_start: float = 1e-4
    # Last beta of the "linear"/"scaled_linear"/"sigmoid" schedules (unused by the cosine schedule).
    beta_end: float = 0.02
    # Clip the predicted clean chunk to [-c, c] (normalised action space) at every step; 0 = off.
    clip_sample: float = 0.0
    # Transformer layers of the denoiser (self-attention over the H action tokens + cross-attention to the prefix).
    denoiser_layers: int = 2
    # Attention heads of the denoiser (must divide d_model).
    denoiser_heads: int = 4
    # What the denoiser predicts: "epsilon" (the noise), "sample" (the clean chunk) or "v_prediction".
    prediction_type: str = "epsilon"
    # DDIM eta in explore mode: 0 = deterministic given the initial noise, 1 = DDPM-like per-step noise.
    ddim_eta: float = 0.0
    # Seed of the initial noise in greedy mode when sample() gets no generator (greedy is then reproducible).
    greedy_seed: int = 0

    def __post_init__(self) -> None:
        if self.beta_schedule not in BETA_SCHEDULES:
            raise ValueError(f"beta_schedule must be one of {BETA_SCHEDULES}, got {self.beta_schedule!r}")
        if self.prediction_type not in PREDICTION_TYPES:
            raise ValueError(f"prediction_type must be one of {PREDICTION_TYPES}, got {self.prediction_type!r}")
        if self.train_timesteps < 1:
            raise ValueError(f"train_timesteps must be >= 1, got {self.train_timesteps}")
        if not 1 <= self.inference_steps <= self.train_timesteps:
            raise ValueError(
                f"inference_steps must be in 1..train_timesteps ({self.train_timesteps}), got {self.inference_steps}"
            )
        if self.d_model % self.denoiser_heads:
            raise ValueError(f"denoiser_heads ({self.denoiser_heads}) must divide d_model ({self.d_model})")
        if self.clip_sample < 0:
            raise ValueError(f"clip_sample must be >= 0 (0 = off), got {self.clip_sample}")
        if self.ddim_eta < 0:
            raise ValueError(f"ddim_eta must be >= 0, got {self.ddim_eta}")
