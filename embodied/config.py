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


POLICY_CONFIGS = {
    "flow": "policies.flow.configuration_flow:FlowConfig",
    "autoregressive": "policies.autoregressive.configuration_autoregressive:AutoregressiveConfig",
    "diffusion": "policies.diffusion.configuration_diffusion:DiffusionConfig",
}


def register_policy_schemas() -> None:
    """Store each family's typed config (plus a ``family`` field) as ``policy/<family>_schema``.

    ``configs/policy/<family>.yaml`` extends it, so every model field is a typed override:
    ``policy=flow policy.num_steps=4``.
    """
    import importlib
    from dataclasses import field as dc_field
    from dataclasses import make_dataclass

    for family, target in POLICY_CONFIGS.items():
        module, _, attr = target.partition(":")
        try:
            cls = getattr(importlib.import_module(module), attr)
        except ImportError:  # a family whose code is not installed is simply not offered
            continue
        node = make_dataclass(f"{cls.__name__}Node", [("family", str, dc_field(default=family))], bases=(cls,))
        store(f"{family}_schema", node, group="policy")


def policy_overrides(node: Any) -> tuple[str, dict[str, Any]]:
    """``(family, config fields)`` of a policy node from the ``policy`` config group."""
    from dataclasses import asdict, is_dataclass

    data = asdict(node) if is_dataclass(node) else dict(node)
    family = data.pop("family", None)
    if family is None:
        raise ValueError("policy.family is missing: use policy=flow|autoregressive|diffusion")
    return family, data
