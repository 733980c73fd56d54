"""Autoregressive action-token VLA (OpenVLA-style): 256 bins per action dimension over [-1, 1]."""

from policies.autoregressive.configuration_autoregressive import AutoregressiveConfig

__all__ = ["AutoregressiveConfig"]
