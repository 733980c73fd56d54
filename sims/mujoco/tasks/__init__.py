"""Registry of stand-alone MuJoCo tasks (the LIBERO-style suites' tasks implement the same
:class:`~sims.mujoco.task.MujocoTask`)."""

from __future__ import annotations

from sims.mujoco.task import MujocoTask
from sims.mujoco.tasks.pick_place import PickCube, PlaceCube
from sims.mujoco.tasks.reach import Reach

_TASKS: dict[str, type[MujocoTask]] = {}


def register_task(cls: type[MujocoTask]) -> type[MujocoTask]:
    """Register a task class under its ``name`` (usable as a decorator)."""
    if cls.name in _TASKS:
        raise ValueError(f"task {cls.name!r} is already registered")
    _TASKS[cls.name] = cls
    return cls


def task_names() -> list[str]:
    return sorted(_TASKS)


def make_task(name: str) -> MujocoTask:
    if name not in _TASKS:
        raise ValueError(f"unknown task {name!r}; available tasks: {task_names()}")
    return _TASKS[name]()


for _cls in (Reach, PickCube, PlaceCube):
    register_task(_cls)
