"""A critic separate from the policy, on privileged simulator state (asymmetric actor-critic).

The policy's own value head sees what the policy sees (camera images, proprioception). In
simulation the critic may see more: :class:`PrivilegedCritic` reads the proprioceptive state, the
env's ``privileged`` vector (object poses, goals), the task and the fraction of the episode's step
limit already used. Only training uses it; deployment runs the policy alone.

The time input matters when a step limit ends an episode as a failure (``truncation=fail``): the
same state is worth less with fewer steps left, which a critic without it cannot represent. The
policy's own (detached) value head reads it too, as ``obs["time_left"]`` (:func:`time_left`), from
the same :class:`EpisodeClock` (see :func:`embodied.algorithms.rollout.collect_chunks`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch
from torch import nn

#: ``policy``: the policy's value head; ``privileged``: :class:`PrivilegedCritic`
CRITICS = ("policy", "privileged")


@dataclass(frozen=True)
class CriticConfig:
    """Which critic a run trains (``embodied-train``'s keys ``algo.critic``, ``algo.critic_hidden``: the
    defaults live here); checked when made.

    Attributes:
        critic: ``policy`` (the policy's value head: it sees what the policy sees) or ``privileged``
            (:class:`PrivilegedCritic`, on the simulator's state; training only).
        critic_hidden: the privileged critic's MLP widths.
    """

    critic: str = "policy"
    critic_hidden: tuple[int, ...] = (256, 256, 256)

    def __post_init__(self) -> None:
        object.__setattr__(self, "critic_hidden", tuple(int(h) for h in self.critic_hidden))
        if self.critic not in CRITICS:
            raise ValueError(f"critic={self.critic!r}: choose one of {', '.join(CRITICS)}")
        if self.critic == "privileged" and (not self.critic_hidden or min(self.critic_hidden) < 1):
            raise ValueError(f"critic_hidden={list(self.critic_hidden)} must list layer widths >= 1")

    def module_entry(self, input_dim: int) -> dict[str, Any] | None:
        """The JSON-able ``critic`` entry of a module config (:func:`build_critic`) for critic inputs of
        ``input_dim`` features (:func:`critic_input_dim`); None for the policy's value head."""
        if self.critic == "policy":
            return None
        return {"kind": self.critic, "input_dim": int(input_dim), "hidden": list(self.critic_hidden)}


def critic_input_dim(state_dim: int, privileged_dim: int, num_tasks: int) -> int:
    """Width ``C`` of :func:`critic_features`: state, privileged, task one-hot, time fraction."""
    return state_dim + privileged_dim + num_tasks + 1


def time_used(elapsed: torch.Tensor, limits: torch.Tensor, task_id: torch.Tensor) -> torch.Tensor:
    """float ``[N]`` (CPU): ``elapsed [N]`` steps over the step limit of each env's task
    (``limits [num_tasks]`` indexed by ``task_id [N]``)."""
    tid = task_id.long().cpu()
    return elapsed.float().cpu() / limits.float().cpu()[tid]


def time_left(elapsed: torch.Tensor, limits: torch.Tensor, task_id: torch.Tensor) -> torch.Tensor:
    """float ``[N]`` in [0, 1] (CPU): the fraction of each episode's step limit still left,
    ``1 - time_used`` (0 at the limit), the policy value head's ``obs["time_left"]``."""
    return (1.0 - time_used(elapsed, limits, task_id)).clamp(0.0, 1.0)


def step_limits(env: Any) -> torch.Tensor:
    """float ``[num_tasks]``: the step limit of each of ``env.tasks`` (``TaskSpec.max_steps``)."""
    limits = torch.as_tensor([float(t.max_steps) for t in env.tasks], dtype=torch.float32)
    if len(limits) == 0 or bool((limits < 1).any()):
        raise ValueError(f"step limits must be >= 1 per task, got {limits.tolist()}")
    return limits


def critic_features(
    obs: dict[str, torch.Tensor], elapsed: torch.Tensor, limits: torch.Tensor, num_tasks: int
) -> torch.Tensor:
    """``[N, C]`` critic inputs from an observation dict (``state [N, S]``, ``privileged [N, P]``,
    ``task_id [N]``), ``elapsed [N]`` steps since each episode began and ``limits [num_tasks]`` the
    step limit of each task."""
    tid = obs["task_id"].long().cpu()
    onehot = torch.nn.functional.one_hot(tid, num_tasks).float()
    frac = time_used(elapsed, limits, tid)
    return torch.cat([obs["state"].float().cpu(), obs["privileged"].float().cpu(), onehot, frac[:, None]], dim=1)


class EpisodeClock:
    """Steps since the start of each env's episode, advanced by chunk results (the envs report the
    length only of episodes that ended); ``elapsed [N]`` sets where it starts (default 0: fresh
    episodes)."""

    def __init__(self, num_envs: int, elapsed: torch.Tensor | None = None):
        self.elapsed = torch.zeros(num_envs, dtype=torch.long)
        if elapsed is not None:
            start = torch.as_tensor(elapsed).long().cpu().reshape(-1)
            if start.shape != (num_envs,) or bool((start < 0).any()):
                raise ValueError(f"elapsed must be {num_envs} step counts >= 0, got {tuple(start.shape)}")
            self.elapsed = start.clone()

    def reset(self) -> None:
        self.elapsed.zero_()

    def advance(self, executed: torch.Tensor, done: torch.Tensor) -> torch.Tensor:
        """After a chunk (``executed [N, H]``, ``done [N]``): returns the step count at the chunk's end
        (of the episode that ended, where one did) and restarts the clock of ended episodes."""
        end = self.elapsed + executed.long().sum(1).cpu()
        self.elapsed = torch.where(done.cpu(), torch.zeros_like(end), end)
        return end


class RunningNorm(nn.Module):
    """Per-feature running mean / variance (parallel Welford), kept as buffers so they travel with
    the weights; inputs are standardised and clipped to ``[-clip, clip]``."""

    def __init__(self, dim: int, clip: float = 5.0, min_std: float = 1e-2):
        super().__init__()
        self.register_buffer("mean", torch.zeros(dim))
        self.register_buffer("var", torch.ones(dim))
        self.register_buffer("count", torch.zeros(()))
        self.clip, self.min_std = clip, min_std

    @torch.no_grad()
    def update(self, x: torch.Tensor) -> None:
        """Fold a batch ``[B, C]`` into the statistics."""
        x = x.to(self.mean.device, torch.float32)
        n = float(x.shape[0])
        if n == 0:
            return
        mean, var = x.mean(0), x.var(0, unbiased=False)
        total = self.count + n
        delta = mean - self.mean
        m2 = self.var * self.count + var * n + delta.pow(2) * self.count * n / total
        self.mean += delta * n / total
        self.var.copy_(m2 / total)
        self.count.fill_(total)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        std = self.var.sqrt().clamp_min(self.min_std)
        return ((x - self.mean) / std).clamp(-self.clip, self.clip)


class PrivilegedCritic(nn.Module):
    """``value [B]`` of critic inputs ``[B, C]`` (:func:`critic_features`): running input
    normalisation, then an MLP with tanh activations (the PPO baselines' critic for state tasks)."""

    def __init__(self, input_dim: int, hidden: Sequence[int] = (256, 256, 256)):
        super().__init__()
        if input_dim < 1 or not hidden or min(hidden) < 1:
            raise ValueError(f"critic needs input_dim >= 1 and hidden sizes >= 1, got {input_dim}, {list(hidden)}")
        self.input_dim = int(input_dim)
        self.norm = RunningNorm(input_dim)
        layers: list[nn.Module] = []
        width = input_dim
        for h in hidden:
            layers += [nn.Linear(width, h), nn.Tanh()]
            width = h
        self.mlp = nn.Sequential(*layers)
        self.head = nn.Linear(width, 1)
        for m in self.mlp:
            if isinstance(m, nn.Linear):
                nn.init.orthogonal_(m.weight, gain=2**0.5)
                nn.init.zeros_(m.bias)
        nn.init.orthogonal_(self.head.weight, gain=0.01)  # values start near 0: sparse returns lie in [0, 1]
        nn.init.zeros_(self.head.bias)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        if features.shape[-1] != self.input_dim:
            raise ValueError(f"critic expects {self.input_dim} input features, got {features.shape[-1]}")
        x = features.to(self.head.weight.device, torch.float32)
        return self.head(self.mlp(self.norm(x))).squeeze(-1)


def build_critic(config: dict[str, Any] | None) -> PrivilegedCritic | None:
    """The critic of a module config's ``critic`` entry (``{"kind", "input_dim", "hidden"}``), or
    None for the policy's value head."""
    if not config or config.get("kind", "policy") == "policy":
        return None
    if config["kind"] != "privileged":
        raise ValueError(f"unknown critic kind {config['kind']!r}; choose one of {CRITICS}")
    return PrivilegedCritic(int(config["input_dim"]), tuple(config.get("hidden", CriticConfig.critic_hidden)))


class CriticInputs:
    """What a rollout needs to value observations with a separate critic: the critic, each env's
    episode clock and each task's step limit (``limits [num_tasks]``, indexed by ``obs["task_id"]``)."""

    def __init__(self, critic: PrivilegedCritic, num_envs: int, limits: Sequence[int]):
        self.critic = critic
        self.clock = EpisodeClock(num_envs)
        self.limits = torch.as_tensor(list(limits), dtype=torch.float32)
        if len(self.limits) == 0 or bool((self.limits < 1).any()):
            raise ValueError(f"step limits must be >= 1 per task, got {list(limits)}")

    def features(self, obs: dict[str, torch.Tensor], elapsed: torch.Tensor | None = None) -> torch.Tensor:
        """``[N, C]`` inputs of ``obs`` at ``elapsed`` steps (default: the clock's)."""
        return critic_features(obs, self.clock.elapsed if elapsed is None else elapsed, self.limits, len(self.limits))

    @torch.no_grad()
    def value(self, features: torch.Tensor) -> torch.Tensor:
        """``[N]`` float values on the CPU."""
        return self.critic(features).float().cpu()
