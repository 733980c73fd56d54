"""LIBERO-style task suites on the MuJoCo tabletop: ``spatial``, ``object``, ``goal``, ``long``
(10 tasks each) and ``dynamic`` (5 tasks with moving objects).

    import sims
    sims.suites.names()                    # ["spatial", "object", "goal", "long", "dynamic"]
    sims.suites.tasks("spatial")           # list[TaskSpec]
    sims.suites.init_states("spatial", 0)  # the 50 fixed evaluation initial states of task 0
    sims.suites.expert("spatial", 0)       # scripted expert: obs -> action chunk [N, 1, 7]
    env = sims.make("mujoco", suite="spatial", num_envs=8)

Evaluation protocol: every task has 50 fixed initial states (``reset(init_ids=...)``), generated
from a fixed seed and identical on every machine; one episode each; success = the task's
predicates all hold; the episode ends on success or at the task's step limit.
"""

from __future__ import annotations

from typing import Any, Callable

from sims.core import TaskSpec
from sims.protocol import NUM_INIT_STATES
_SUITES: dict[str, str] = {
    "spatial": "sims.suites.spatial:tasks",
    "object": "sims.suites.object_suite:tasks",
    "goal": "sims.suites.goal:goal_tasks",
    "long": "sims.suites.goal:long_tasks",
    "dynamic": "sims.suites.dynamic:tasks",
}


#: suites simulated by another backend: name -> (backend, "module:function" giving its TaskSpecs)
_EXTERNAL: dict[str, tuple[str, str]] = {
    "maniskill": ("maniskill", "sims.maniskill.env:task_specs"),
}


def names() -> list[str]:
    """Suite names in their canonical order (the MuJoCo suites)."""
    return list(_SUITES)


def all_names() -> list[str]:
    """The MuJoCo suites and the suites of other backends (``maniskill``)."""
    return list(_SUITES) + list(_EXTERNAL)


def backend(suite: str) -> str:
    """The :func:`sims.make` backend that simulates ``suite``."""
    if suite in _EXTERNAL:
        return _EXTERNAL[suite][0]
    if suite not in _SUITES:
        raise ValueError(f"unknown suite {suite!r}; available suites: {all_names()}")
    return "mujoco"


def _factory(suite: str) -> Callable[[], list[Any]]:
    if suite not in _SUITES:
        raise ValueError(f"unknown suite {suite!r}; available suites: {names()}")
    module, _, attr = _SUITES[suite].partition(":")
    import importlib

    return getattr(importlib.import_module(module), attr)


def build_tasks(suite: str) -> list[Any]:
    """Fresh :class:`~sims.suites.base.SuiteTask` objects of a suite (one set per env)."""
    return _factory(suite)()


def tasks(suite: str) -> list[TaskSpec]:
    """The suite's tasks, as backend-independent specs."""
    if suite in _EXTERNAL:
        import importlib

        module, _, attr = _EXTERNAL[suite][1].partition(":")
        return getattr(importlib.import_module(module), attr)()
    return [t.spec for t in build_tasks(suite)]


def _task_index(suite: str, task: int | str) -> int:
    specs = tasks(suite)
    if isinstance(task, str):
        for i, s in enumerate(specs):
            if s.name == task:
                return i
        raise ValueError(f"suite {suite!r} has no task {task!r}; tasks: {[s.name for s in specs]}")
    if not 0 <= task < len(specs):
        raise ValueError(f"task index {task} out of range for suite {suite!r} ({len(specs)} tasks)")
    return task


def init_states(suite: str, task: int | str) -> list[dict[str, Any]]:
    """The 50 fixed evaluation initial states of a task: object placements ``(x, y, yaw)``,
    initial velocities and the robot's initial joint offsets, as plain Python data."""
    from sims.suites.protocol import initial_state

    t = build_tasks(suite)[_task_index(suite, task)]
    return [initial_state(t, k) for k in range(NUM_INIT_STATES)]


def expert(suite: str, task: int | str | None = None, num_envs: int = 1, gain: float = 1.0):
    """Scripted expert for envs of this suite (all tasks; ``task`` is checked, for clarity).
    ``gain`` < 1 makes smoother, slower demonstrations (see :mod:`sims.suites.experts`).

    Returns a :class:`~sims.suites.expert.SuiteExpert`: ``expert(obs) -> [N, 1, 7]`` chunks,
    ``expert.act(obs) -> [N, 7]``, ``expert.reset(done_mask)``.
    """
    from sims.suites.experts import SuiteExpert

    if suite in _EXTERNAL:
        raise ValueError(f"suite {suite!r} has no scripted experts (collect its demonstrations another way)")
    if task is not None:
        _task_index(suite, task)
    return SuiteExpert(build_tasks(suite), num_envs, gain=gain)


__all__ = ["NUM_INIT_STATES", "all_names", "backend", "build_tasks", "expert", "init_states", "names", "tasks"]
