"""Real-time chunking (RTC) for flow policies: inpaint the new chunk onto the committed actions.

The new chunk's action ``i`` is meant for step ``t + i``, where ``t`` is the step of the
observation. The previous plan covers steps ``t .. t + o - 1`` (``o`` = queued actions). The
first ``d`` of them execute while the new chunk is computed, so they are frozen: the returned
chunk holds exactly those actions there. The rest of the overlap is a soft target: during the
denoising, the velocity is guided toward it with weights ``W`` that fall from 1 to 0 over the
overlap (an exponential ramp), and the guidance weight is bounded by ``beta``.

Guidance (pseudo-inverse guidance, in this code's time, t = 1 noise -> t = 0 action): with
``a_hat = x - t * v(x, t)`` the predicted clean chunk, ``g = (d a_hat / d x)^T [W * (Y - a_hat)]``
and ``v <- v - min(beta, (tau^2 + (1 - tau)^2) / (tau * (1 - tau))) * g``, ``tau = 1 - t``.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from policies.flow import sde as S


def soft_mask(horizon: int, frozen: torch.Tensor, overlap: torch.Tensor) -> torch.Tensor:
    """Guidance weights ``[N, H]``: 1 on the first ``frozen`` steps, an exponential ramp from 1
    down to 0 over the rest of the ``overlap``, 0 after it.

    Args:
        frozen: ``[N]`` frozen steps d; overlap: ``[N]`` steps the previous plan covers (>= frozen).
    """
    i = torch.arange(horizon, dtype=torch.float32)[None, :]
    f, o = frozen.float()[:, None], overlap.float()[:, None]
    c = ((o - i) / (o - f + 1.0)).clamp(0.0, 1.0)
    ramp = c * (torch.exp(c) - 1.0) / (math.e - 1.0)
    return torch.where(i < f, torch.ones_like(ramp), torch.where(i < o, ramp, torch.zeros_like(ramp)))


def guidance_weight(t: float, beta: float) -> float:
    """``min(beta, (tau^2 + (1-tau)^2) / (tau (1-tau)))`` with ``tau = 1 - t`` (inf at the ends)."""
    tau = 1.0 - t
    if tau <= 0.0 or tau >= 1.0:
        return beta
    return min(beta, (tau**2 + (1.0 - tau) ** 2) / (tau * (1.0 - tau)))


def rtc_sample(
    policy: Any,
    obs: dict[str, Any],
    prev: torch.Tensor,
    prev_valid: torch.Tensor,
    frozen: int,
    *,
    beta: float = 5.0,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """A chunk ``[N, H, A]`` (env space) continuing the previous plan, from the ODE sampler.

    Args:
        policy: a flow policy (``family == "flow"``).
        obs: the observation batch at step t.
        prev: ``[N, L, A]`` the previous plan for steps ``t .. t + L - 1`` (env space).
        prev_valid: ``[N, L]`` which of them exist (a prefix of each row).
        frozen: d, the steps that execute during inference; the chunk returns ``prev`` there.
        beta: bound on the guidance weight.
    """
    if getattr(policy, "family", None) != "flow":
        raise ValueError(f"real-time chunking needs a flow policy, got the {getattr(policy, 'family', '?')} family")
    cfg = policy.config
    h, a, k_steps = cfg.chunk_size, cfg.action_dim, cfg.num_steps
    if prev.ndim != 3 or prev.shape[-1] != a:
        raise ValueError(f"prev must be [N, L, {a}], got {tuple(prev.shape)}")
    with torch.no_grad():
        prefix, pad = policy.encode(obs)
    n, dev = prefix.shape[0], prefix.device
    length = min(prev.shape[1], h)
    target = torch.zeros(n, h, a, device=dev)
    valid = torch.zeros(n, h, dtype=torch.bool, device=dev)
    target[:, :length] = policy.processor.normalize_actions(prev[:, :length].to(dev))
    valid[:, :length] = prev_valid[:, :length].to(dev)
    overlap = valid.sum(1).cpu()
    frozen_n = torch.clamp(torch.full((n,), frozen), max=overlap)
    weights = soft_mask(h, frozen_n, overlap).to(dev)[..., None]  # [N, H, 1]
    rng_device = generator.device if generator is not None else dev
    x = torch.randn((n, h, a), generator=generator, device=rng_device).to(dev)
    dt = 1.0 / k_steps
    for t_val in S.time_grid(k_steps):
        t = torch.full((n,), t_val, device=dev)
        with torch.enable_grad():
            xg = x.detach().requires_grad_(True)
            v = policy.velocity(policy._features(xg, t, prefix, pad))
            a_hat = xg - t_val * v
            err = weights * (target - a_hat)
            (g,) = torch.autograd.grad(a_hat, xg, grad_outputs=err)
        x = S.ode_step(x, v.detach() - guidance_weight(t_val, beta) * g, dt).detach()
    actions = policy.processor.unnormalize_actions(x)
    keep = (torch.arange(h, device=dev)[None, :] < frozen_n.to(dev)[:, None]) & valid
    out = torch.where(keep[..., None], torch.zeros_like(actions), actions)
    out[:, :length] = torch.where(keep[:, :length, None], prev[:, :length].to(dev).float(), out[:, :length])
    return out
