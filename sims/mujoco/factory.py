"""The MuJoCo backends' entry points (registered in :mod:`sims.core`): a task or suite name -> an env.

Stand-alone tasks come from :mod:`sims.mujoco.tasks`, suites from the registry :mod:`sims.suites`.
"""

from __future__ import annotations

from typing import Any

import torch

from sims.core import VecEnv
from sims.mujoco.env import MujocoVecEnv
from sims.mujoco.tasks import make_task
from sims.suites import build_tasks


def make_mujoco_env(
    *, task: str | None, suite: str | None, num_envs: int, seed: int, device: str | torch.device, **kwargs: Any
) -> VecEnv:
    """Factory registered as backend ``"mujoco"`` in :mod:`sims.core` (a real LIBERO suite, ``libero_*``:
    its exported scenes, :class:`sims.libero.env.LiberoVecEnv`)."""
    if suite is not None and suite.startswith("libero_"):
        from sims.libero.env import make_libero_env

        return make_libero_env(suite=suite, num_envs=num_envs, seed=seed, device=device, **kwargs)
    if suite is not None:
        suite_tasks = build_tasks(suite)
        return MujocoVecEnv(
            suite_tasks, num_envs, seed=seed, device=device, scene_builder=suite_tasks[0].scene.build, **kwargs
        )
    return MujocoVecEnv([make_task(task)], num_envs, seed=seed, device=device, **kwargs)


def make_mujoco_gpu_env(
    *, task: str | None, suite: str | None, num_envs: int, seed: int, device: str | torch.device, **kwargs: Any
) -> MujocoVecEnv:
    """Factory registered as backend ``"mujoco_gpu"``: the same scenes on MuJoCo Warp physics."""
    if suite is not None and suite.startswith("libero_"):
        raise ValueError(
            f"{suite} runs on the CPU backend only (its scenes and controller are not ported to "
            "MuJoCo Warp): use sims.make('mujoco', suite=...)"
        )
    kwargs.setdefault("physics", "warp")
    return make_mujoco_env(task=task, suite=suite, num_envs=num_envs, seed=seed, device=device, **kwargs)
