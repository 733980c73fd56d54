"""Samplers of the flow policy as pure functions on tensors (docs/design.md, "Reinforcement learning").

Time runs from t=1 (noise) to t=0 (action) in K steps of size d = 1/K. ``v`` is the predicted
velocity ``noise - action`` at ``(x_t, t)``.

- ODE (Euler): ``x_{t-d} = x_t - d * v``.
- Flow-SDE: from ``x0_hat = x_t - t*v`` and ``x1_hat = x_t + (1-t)*v``, with
  ``sigma_t = a * sqrt(t / (1 - t))`` (at t=1 the next t, ``t - d``, replaces t in ``1 - t``),
  ``mean = x0_hat*(1 - (t-d)) + x1_hat*((t-d) - sigma_t**2 * d / (2*t))`` and
  ``std = sqrt(d) * sigma_t``. The transition is Gaussian, so its log-probability is exact.
- Flow-Noise: the mean is the ODE step and the std comes from a learned, bounded noise head.
"""

from __future__ import annotations

import math

import torch


def _bcast(t: torch.Tensor | float, like: torch.Tensor) -> torch.Tensor:
    """``t`` (scalar or ``[N]``) broadcast against ``like`` ``[N, ...]``."""
    t = torch.as_tensor(t, dtype=like.dtype, device=like.device)
    return t.reshape(t.shape + (1,) * (like.ndim - t.ndim)) if t.ndim else t


def flow_time(u: torch.Tensor) -> torch.Tensor:
    """Flow-matching times from draws ``u`` in [0, 1], kept off the ends: ``0.999 * u + 0.001``."""
    return 0.999 * u + 0.001


def ode_step(x_t: torch.Tensor, v: torch.Tensor, dt: float) -> torch.Tensor:
    """Euler step from t to t - dt: ``x_t - dt * v``."""
    return x_t - dt * v


def sde_sigma(t: torch.Tensor | float, dt: float, noise_level: float, like: torch.Tensor) -> torch.Tensor:
    """``sigma_t = a * sqrt(t / (1 - t))``, with ``1 - (t - dt)`` in the denominator at t=1."""
    t = _bcast(t, like)
    one_minus = torch.where(t >= 1.0 - 1e-6, 1.0 - (t - dt), 1.0 - t)
    return noise_level * torch.sqrt(t / one_minus)


def sde_step(
    x_t: torch.Tensor, v: torch.Tensor, t: torch.Tensor | float, dt: float, noise_level: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and std of the Flow-SDE transition ``x_t -> x_{t-dt}`` (see the module docstring).

    Args:
        x_t: ``[N, H, A]``; v: ``[N, H, A]`` velocity at ``(x_t, t)``; t: scalar or ``[N]``.

    Returns:
        mean ``[N, H, A]`` and std (broadcastable to it).
    """
    tt = _bcast(t, x_t)
    sigma = sde_sigma(t, dt, noise_level, x_t)
    x0_hat = x_t - tt * v
    x1_hat = x_t + (1.0 - tt) * v
    t_next = tt - dt
    mean = x0_hat * (1.0 - t_next) + x1_hat * (t_next - sigma**2 * dt / (2.0 * tt))
    std = math.sqrt(dt) * sigma
    return mean, std.expand_as(mean)


def gaussian_logprob(x: torch.Tensor, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    """Log-density of ``x`` under ``N(mean, std^2)``, summed over all but the batch dim -> ``[N]``."""
    var = std**2
    lp = -0.5 * ((x - mean) ** 2 / var + torch.log(2.0 * math.pi * var))
    return lp.flatten(1).sum(1)


def gaussian_entropy(std: torch.Tensor) -> torch.Tensor:
    """Entropy of ``N(., std^2)`` summed over all but the batch dim -> ``[N]``."""
    return (0.5 * torch.log(2.0 * math.pi * math.e * std**2)).flatten(1).sum(1)


def time_grid(num_steps: int) -> list[float]:
    """The K denoising times ``[1, 1 - 1/K, ..., 1/K]`` (each step goes from t to t - 1/K)."""
    return [1.0 - k / num_steps for k in range(num_steps)]


def keep_stochastic_step(
    extras: dict[str, torch.Tensor], k: int, is_k: torch.Tensor, x: torch.Tensor, x_next: torch.Tensor
) -> None:
    """Accelerated Flow-SDE's record of each sample's one stochastic transition: at step ``k`` of the
    chain, rows with ``is_k [N]`` keep ``x_t`` / ``x_next`` (``[N, ...]``) in ``extras`` (filled at k=0)."""
    if k == 0:
        extras["x_t"], extras["x_next"] = x.clone(), x_next.clone()
        return
    rows = is_k.reshape(is_k.shape + (1,) * (x.ndim - 1))
    extras["x_t"] = torch.where(rows, x, extras["x_t"])
    extras["x_next"] = torch.where(rows, x_next, extras["x_next"])
