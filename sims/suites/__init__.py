"""Registry of the task suites: LIBERO-style ``spatial``, ``object``, ``goal``, ``long`` (10 tasks
each) and ``dynamic`` (5 tasks with moving objects), the suites of other backends (``maniskill``),
and real LIBERO's (``libero_spatial`` ...: its exported scenes in the ``mujoco`` backend, :mod:`sims.libero.env`).

    import sims
    sims.suites.names()                    # ["spatial", "object", "goal", "long", "dynamic"]
    sims.suites.tasks("spatial")           # list[TaskSpec]
    sims.suites.init_states("spatial", 0)  # the 50 fixed evaluation initial states of task 0
    sims.suites.expert("spatial", 0)       # scripted expert: obs -> action chunk [N, 1, 7]
    env = sims.make("mujoco", suite="spatial", num_envs=8)

Evaluation protocol (:mod:`sims.protocol`): every task has 50 fixed initial states
(``reset(init_ids=...)``), generated from a fixed seed and identical on every machine; one episode
each; success = the task's predicates all hold; the episode ends on success or at the task's step limit.

The registry names each suite's content by ``"module:attr"`` and imports it on use, so listing the
suites loads no simulator; the content (e.g. :mod:`sims.mujoco.suites`) never imports the registry.
"""

from __future__ import annotations

import importlib
from typing import Any

from sims.core import TaskSpec
from sims.protocol import NUM_INIT_STATES, TRAIN_INIT_OFFSET

#: suites whose task objects sims builds (fixed initial states, scripted experts), in canonical order:
#: name -> (backend, "module:function" returning a fresh list of the suite's task objects)
_SUITES: dict[str, tuple[str, str]] = {
    "spatial": ("mujoco", "sims.mujoco.suites.spatial:tasks"),
    "object": ("mujoco", "sims.mujoco.suites.object_suite:tasks"),
    "goal": ("mujoco", "sims.mujoco.suites.goal:goal_tasks"),
    "long": ("mujoco", "sims.mujoco.suites.goal:long_tasks"),
    "dynamic": ("mujoco", "sims.mujoco.suites.dynamic:tasks"),
}
#: the scripted expert of a backend's suites: "module:class", built as ``cls(tasks, num_envs, gain=...)``
_EXPERTS: dict[str, str] = {
    "mujoco": "sims.mujoco.suites.experts:SuiteExpert",
}
#: suites simulated by another backend, known by their specs only: name -> (backend, "module:function"
#: giving its TaskSpecs)
_EXTERNAL: dict[str, tuple[str, str]] = {
    "maniskill": ("maniskill", "sims.maniskill.env:task_specs"),
}
#: the experts of those suites, which plan in the simulator itself: "module:class", built as
#: ``cls(env, gain=...)`` over the env they act in
_ENV_EXPERTS: dict[str, str] = {
    "maniskill": "sims.maniskill.experts:ManiSkillExpert",
}


#: real LIBERO's suites, simulated from the scene cache (``python -m sims.libero.scenes export``) by the
#: ``mujoco`` backend; their task specs and init states come from that cache
_LIBERO = ("libero_spatial", "libero_object", "libero_goal", "libero_10", "libero_90")


def _load(ref: str) -> Any:
    module, _, attr = ref.partition(":")
    return getattr(importlib.import_module(module), attr)


def names() -> list[str]:
    """Suite names in their canonical order (the suites with fixed initial states and experts)."""
    return list(_SUITES)


def all_names() -> list[str]:
    """The suites of :func:`names` and the suites of other backends (``maniskill``)."""
    return list(_SUITES) + list(_EXTERNAL)


def expert_names() -> list[str]:
    """The suites whose demonstrations :func:`expert` can make: ours, ``maniskill`` (ManiSkill's motion
    planners) and real LIBERO's."""
    return list(_SUITES) + list(_ENV_EXPERTS) + list(_LIBERO)


def libero_names() -> list[str]:
    """Real LIBERO's standard suites, which ``sims.make("mujoco", suite=...)`` runs from the scene cache (the
    embodied commands evaluate them in LIBERO's own env with ``simulator=robosuite``)."""
    return list(_LIBERO)


def env_names() -> list[str]:
    """Every suite :func:`sims.make` runs: :func:`all_names` and real LIBERO's (:func:`libero_names`)."""
    return all_names() + list(_LIBERO)


def is_libero(suite: str) -> bool:
    """Whether ``suite`` is one of real LIBERO's, simulated from its exported scenes."""
    return suite in _LIBERO


def training_init_id(suite: str, k: int) -> int:
    """The init id of a suite's ``k``-th training state (demonstrations, RL's starts outside the
    protocol): ``TRAIN_INIT_OFFSET + k`` for ours, never an evaluation state; for real LIBERO, whose
    demonstrations come from its 50 official states, official state ``TRAIN_STATES_FROM + k``
    (k < :func:`num_training_states`; never a held-out state, :func:`heldout_states`)."""
    count = num_training_states(suite)
    if k < 0 or (count is not None and k >= count):
        raise ValueError(
            f"training state {k} out of range for {suite!r}"
            + (
                f": it has {count} (init ids {training_init_id(suite, 0)}..{training_init_id(suite, count - 1)}); "
                "no demonstration or random start uses its other official states or its held-out "
                "sampled ones"
                if count is not None
                else ""
            )
        )
    if suite in _LIBERO:
        from sims.libero import TRAIN_STATES_FROM

        return TRAIN_STATES_FROM + k
    return TRAIN_INIT_OFFSET + k


def num_training_states(suite: str) -> int | None:
    """How many training states a task of ``suite`` has (None: as many as asked for)."""
    if suite in _LIBERO:
        from sims.libero import NUM_INIT_STATES as LIBERO_STATES
        from sims.libero import TRAIN_STATES_FROM

        return LIBERO_STATES - TRAIN_STATES_FROM
    return None


def heldout_states(suite: str) -> tuple[int, int]:
    """``(first init id, count)`` of the states a run is also scored on that no demonstration and no
    training start (either init pool) ever uses: ours the 50 after the protocol's (50..99); real
    LIBERO's the 50 that LIBERO's own placement initializer sampled beyond its 50 official states, init
    ids 50..99 (the scene cache's ``sampled_states.npy``, :mod:`sims.libero.reference.export`)."""
    if suite in _LIBERO:
        from sims.libero import NUM_SAMPLED_STATES, SAMPLED_STATES_FROM

        return SAMPLED_STATES_FROM, NUM_SAMPLED_STATES
    return NUM_INIT_STATES, NUM_INIT_STATES


def backend(suite: str) -> str:
    """The :func:`sims.make` backend that simulates ``suite``."""
    if suite in _LIBERO:
        return "mujoco"
    if suite in _EXTERNAL:
        return _EXTERNAL[suite][0]
    if suite not in _SUITES:
        raise ValueError(f"unknown suite {suite!r}; available suites: {all_names()}")
    return _SUITES[suite][0]


def build_tasks(suite: str) -> list[Any]:
    """Fresh task objects of a suite (one set per env), e.g.
    :class:`~sims.mujoco.suites.base.SuiteTask` for the MuJoCo suites."""
    if suite not in _SUITES:
        raise ValueError(f"unknown suite {suite!r}; available suites: {names()}")
    return _load(_SUITES[suite][1])()


def tasks(suite: str) -> list[TaskSpec]:
    """The suite's tasks, as backend-independent specs (a LIBERO suite's: from LIBERO's task table)."""
    if suite in _LIBERO:
        from sims.libero.env import task_specs

        return task_specs(suite)
    if suite in _EXTERNAL:
        return _load(_EXTERNAL[suite][1])()
    if suite not in _SUITES:
        raise ValueError(f"unknown suite {suite!r}; available suites: {env_names()}")
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
    initial velocities and the robot's initial joint offsets, as plain Python data (a LIBERO task's:
    the official flattened simulator states, ``{"sim_state": [1 + nq + nv floats]}``; its held-out
    sampled ones are :func:`sims.libero.scenes.load_sampled_states`)."""
    if suite in _LIBERO:
        from sims.libero import NUM_TASKS
        from sims.libero.scenes import ensure_tasks, load_init_states

        if isinstance(task, int) and not 0 <= task < NUM_TASKS[suite]:
            raise ValueError(f"task index {task} out of range for suite {suite!r} ({NUM_TASKS[suite]} tasks)")
        index = task if isinstance(task, int) else _task_index(suite, task)  # a name needs every task's spec
        return [{"sim_state": row.tolist()} for row in load_init_states(ensure_tasks(suite, [index])[0])]
    t = build_tasks(suite)[_task_index(suite, task)]
    return [t.initial_state(k) for k in range(NUM_INIT_STATES)]


def expert(suite: str, task: int | str | None = None, num_envs: int = 1, gain: float = 1.0, env: Any = None) -> Any:
    """Scripted expert for envs of this suite (all tasks; ``task`` is checked, for clarity).
    ``gain`` < 1 makes smoother, slower demonstrations (see :mod:`sims.mujoco.suites.experts`).

    Returns a :class:`~sims.mujoco.suites.experts.SuiteExpert`: ``expert(obs) -> [N, 1, 7]`` chunks,
    ``expert.act(obs) -> [N, 7]``, ``expert.reset(done_mask)``. A real LIBERO suite's experts read the
    simulator's state, so they need the ``env`` (a ``sims.make("mujoco", suite=...)`` env) they act in:
    :class:`sims.libero.experts.LiberoSuiteExpert`; so do ``maniskill``'s, ManiSkill's motion planners
    (:class:`sims.maniskill.experts.ManiSkillExpert`).
    """
    if suite in _EXTERNAL:
        if suite not in _ENV_EXPERTS:
            raise ValueError(f"suite {suite!r} has no scripted experts (collect its demonstrations another way)")
        if env is None:
            raise ValueError(
                f"{suite}'s experts plan in the simulator: pass env=, a sims.make({backend(suite)!r}, ...) env"
            )
        return _load(_ENV_EXPERTS[suite])(env, gain=gain)
    if suite in _LIBERO:
        if env is None or getattr(env, "suite", None) != suite:
            raise ValueError(
                f"{suite}'s scripted experts act on the simulator's privileged state: pass env=, a "
                f"sims.make('mujoco', suite={suite!r}, ...) env"
            )
        from sims.libero.experts import LiberoSuiteExpert

        return LiberoSuiteExpert(env, gain=gain)
    if task is not None:
        _task_index(suite, task)
    suite_tasks = build_tasks(suite)
    return _load(_EXPERTS[backend(suite)])(suite_tasks, num_envs, gain=gain)


__all__ = [
    "NUM_INIT_STATES",
    "all_names",
    "backend",
    "build_tasks",
    "env_names",
    "expert",
    "expert_names",
    "heldout_states",
    "init_states",
    "is_libero",
    "libero_names",
    "names",
    "num_training_states",
    "tasks",
    "training_init_id",
]
