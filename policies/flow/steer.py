"""Latent-noise steering of a frozen flow policy (DSRL: Wagenmaker et al., 2025, "Steering Your
Diffusion Policy with Latent Space Reinforcement Learning").

The flow's ODE maps an initial noise ``w [N, H, A]`` to an action chunk deterministically. DSRL
keeps the flow's weights fixed and learns a small Gaussian policy over ``w`` instead of over
actions: ``w ~ N(mean(s), std^2)``, the chunk is ``ODE(w)``. Its log-probability is the Gaussian
density of ``w`` (exact, and no gradient has to run through the flow), so PPO / GRPO train it as
any Gaussian policy, and nothing it does can unlearn what SFT taught the flow.

At initialisation ``mean = 0`` and ``std = 1``: the steered policy is exactly the flow's own
distribution (the ODE from standard normal noise, what evaluation of the plain flow runs).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from policies.base import DetachedValueHead


def _trunk(in_dim: int, hidden: int) -> list[nn.Module]:
    """Two tanh layers on layer-normalised (detached, unscaled) prefix features."""
    return [nn.LayerNorm(in_dim), nn.Linear(in_dim, hidden), nn.Tanh(), nn.Linear(hidden, hidden), nn.Tanh()]


class NoiseSteer(nn.Module):
    """State-conditioned Gaussian over the flow's initial noise, with its own value head.

    ``forward(features [N, F]) -> (mean [N, H, A], std [N, H, A])``; ``value(features, time_left)
    -> [N]`` (``time_input``: the value head also reads the fraction of the episode left, see
    :class:`~policies.base.DetachedValueHead`; without it, as bundles written before, it does not).
    ``mean = bound * tanh(.)`` keeps the noise near the region the flow was trained on (DSRL bounds
    its noise actions likewise); ``log std`` is clamped to ``[log std_min, log std_max]`` (as SAC
    clamps its log-std). Both come from one zero-initialised layer on a small MLP, so the policy
    starts at ``N(0, I)`` and can narrow its noise state by state where it has found what works (a
    single learned std per dimension moves too slowly at the learning rates that keep the mean
    stable).
    """

    def __init__(
        self,
        in_dim: int,
        chunk_size: int,
        action_dim: int,
        hidden: int = 256,
        bound: float = 2.0,
        std_min: float = 0.05,
        std_max: float = 1.2,
        time_input: bool = False,
    ):
        super().__init__()
        if bound <= 0 or not 0 < std_min < 1 < std_max:
            raise ValueError(
                f"need steer_bound > 0 and 0 < steer_std_min < 1 < steer_std_max, got {bound}, {std_min}, {std_max}"
            )
        self.shape = (chunk_size, action_dim)
        self.mlp = nn.Sequential(*_trunk(in_dim, hidden))
        self.head = nn.Linear(hidden, 2 * chunk_size * action_dim)  # mean and log-std, both 0 at the start
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)
        self.in_dim, self.hidden = in_dim, hidden
        self.value_mlp = self.make_value_head(time_input)
        self.bound = float(bound)
        self.log_std_range = (math.log(std_min), math.log(std_max))

    def forward(self, features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        raw_mean, raw_log_std = self.head(self.mlp(features)).chunk(2, dim=1)
        mean = self.bound * torch.tanh(raw_mean)
        std = torch.exp(raw_log_std.clamp(*self.log_std_range))
        return mean.reshape(-1, *self.shape), std.reshape(-1, *self.shape)

    def make_value_head(self, time_input: bool) -> nn.Module:
        """A fresh value head: with ``time_input`` a :class:`~policies.base.DetachedValueHead` that
        also reads the time left, else the tanh MLP on the features alone (bundles from before)."""
        self.time_input = bool(time_input)
        if time_input:
            return DetachedValueHead(self.in_dim, self.hidden)
        return nn.Sequential(*_trunk(self.in_dim, self.hidden), nn.Linear(self.hidden, 1))

    def value(self, features: torch.Tensor, time_left: torch.Tensor | None = None) -> torch.Tensor:
        """``[N]`` of (detached) features ``[N, F]``; ``time_left [N]`` is read only by a head with a
        time input (default ones: the start of an episode)."""
        if not self.time_input:
            return self.value_mlp(features)[:, 0]
        if time_left is None:
            time_left = features.new_ones(features.shape[0])
        return self.value_mlp(features, time_left)
