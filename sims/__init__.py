"""Simulators behind one batched-tensor contract.

``import sims`` is light: backends (MuJoCo, ManiSkill, MuJoCo Warp) load when an env is made.

    import sims
    env = sims.make("mujoco", task="pick_cube", num_envs=8, cameras=("agentview", "wrist"))
"""

from sims import suites  # noqa: F401  (light: task definitions load on use)
from sims.core import (
    ChunkResult,
    Obs,
    Spec,
    TaskSpec,
    VecEnv,
    backends,
    make,
    register_backend,
    step_chunk,
)


def tasks(backend: str = "mujoco") -> list[str]:
    """Names of the stand-alone tasks a backend provides."""
    if backend != "mujoco":
        raise ValueError(f"task listing is only available for the mujoco backend, not {backend!r}")
    from sims.mujoco.tasks import task_names

    return task_names()


__all__ = [
    "ChunkResult",
    "Obs",
    "Spec",
    "TaskSpec",
    "VecEnv",
    "backends",
    "make",
    "register_backend",
    "step_chunk",
    "tasks",
]
