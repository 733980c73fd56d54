"""Diffusion-policy baseline: DDPM training and DDIM sampling on diffusers schedulers (SFT and
evaluation only: no exact log-probability, so no RL)."""

from policies.diffusion.configuration_diffusion import DiffusionConfig

__all__ = ["DiffusionConfig"]
