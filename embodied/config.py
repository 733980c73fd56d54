"""Typed configuration schemas shared by the Hydra apps.

Dataclasses hold the fields and their documentation; YAML under ``configs/`` only selects and
overrides. Each app stores its top-level schema in Hydra's ConfigStore under ``<app>_schema`` and
its YAML starts with ``defaults: [<app>_schema, ...]``, so an unknown key or a value of the
wrong type fails before anything runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from hydra.core.config_store import ConfigStore


@dataclass
class SimConfig:
    """Which simulator and scene (config group ``sim``)."""

    backend: str = "mujoco"  # mujoco | mujoco_gpu | maniskill
    suite: Optional[str] = "spatial"  # a task suite (sims.suites.names()), or null with a task
    task: Optional[str] = None  # a stand-alone task (sims.tasks()), used when suite is null
    num_envs: int = 8  # envs stepped together
    cameras: list[str] = field(default_factory=lambda: ["agentview", "wrist"])  # [] for state only
    image_size: int = 128  # square camera images (pixels)
    num_threads: int = 0  # MuJoCo C threads stepping the batch; 0 = all cores
    control_hz: float = 20.0  # control rate of one env step
    action_mode: str = "ee_delta"  # ee_delta (7-D) | joint_pos (8-D)
    reward_type: str = "sparse"  # sparse success | dense shaped terms


def make_env(sim: SimConfig, *, seed: int = 0, device: str = "cpu", **overrides: Any):
    """Build the :class:`sims.VecEnv` a :class:`SimConfig` describes."""
    import sims

    kwargs: dict[str, Any] = dict(
        num_envs=sim.num_envs,
        cameras=tuple(sim.cameras),
        image_size=sim.image_size,
        num_threads=sim.num_threads or None,
        control_hz=sim.control_hz,
        action_mode=sim.action_mode,
        reward_type=sim.reward_type,
    )
    kwargs.update(overrides)
    if (sim.suite is None) == (sim.task is None):
        raise ValueError("set exactly one of sim.suite and sim.task (the other to null)")
    return sims.make(sim.backend, suite=sim.suite, task=sim.task, seed=seed, device=device, **kwargs)


def store(name: str, node: Any, group: str | None = None) -> None:
    """Register a schema in Hydra's ConfigStore (idempotent)."""
    ConfigStore.instance().store(name=name, node=node, group=group)
