"""What the MuJoCo engine asks of a task: the objects it adds to the tabletop, how it places them,
when it succeeds. The stand-alone tasks (:mod:`sims.mujoco.tasks`) and the suites' tasks
(:mod:`sims.mujoco.suites`) implement it; the env (:mod:`sims.mujoco.env`) runs them.

A task object is shared by all envs of a :class:`~sims.mujoco.env.MujocoVecEnv`; everything it
computes is batched over envs (arrays ``[N, ...]`` bound to the env's ``mujoco.batch.Batch``).
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import Any

import mujoco
import numpy as np

from sims.core import TaskSpec
from sims.protocol import EVAL_SEED


@dataclass(frozen=True)
class Region:
    """Axis-aligned placement region on the table top (metres, world frame)."""

    x: tuple[float, float]
    y: tuple[float, float]

    def sample(self, rng: np.random.Generator) -> np.ndarray:
        return np.array([rng.uniform(*self.x), rng.uniform(*self.y)])


class MujocoTask(abc.ABC):
    """Base class of tabletop tasks.

    Subclasses set ``name``, ``instruction``, ``max_steps``, ``privileged_keys`` and implement
    ``build``, ``sample_init``, ``apply_init``, ``success`` and ``privileged``.
    """

    name: str = ""
    suite: str = ""
    instruction: str = ""
    max_steps: int = 100
    privileged_keys: tuple[tuple[str, int], ...] = ()
    #: end the episode when the success predicate holds.
    terminate_on_success: bool = True

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if not cls.__dict__.get("_declarative") and not getattr(cls, "__abstractmethods__", None) and not cls.name:
            raise TypeError(f"task class {cls.__name__} must set a 'name'")

    @property
    def spec(self) -> TaskSpec:
        return TaskSpec(
            name=self.name,
            suite=self.suite,
            instruction=self.instruction,
            max_steps=self.max_steps,
            privileged_keys=self.privileged_keys,
        )

    @property
    def privileged_dim(self) -> int:
        return sum(size for _, size in self.privileged_keys)

    def build(self, spec: mujoco.MjSpec) -> None:
        """Add this task's objects to the tabletop spec (stand-alone tasks; suites share a scene)."""
        raise NotImplementedError(f"task {self.name!r} builds no scene of its own")

    def bind(self, env: Any) -> None:
        """Cache ids and views once the model is compiled and the batch exists.

        ``env`` is the :class:`~sims.mujoco.env.MujocoVecEnv` running the task (typed ``Any``: the env
        imports this module, so this module cannot import the env).
        """
        self.env = env

    @abc.abstractmethod
    def sample_init(self, rng: np.random.Generator) -> dict[str, np.ndarray]:
        """Draw one env's initial object placement from ``rng``."""

    def draw_init(self, rng: np.random.Generator, joint_noise: float) -> tuple[np.ndarray, dict[str, Any]]:
        """One env's initial state from ``rng``: the arm's joint offsets ``[7]`` from home (uniform in
        +- ``joint_noise`` rad), then the task's placement. The env's resets and the listed fixed initial
        states both draw through here, so they consume ``rng`` in the same order."""
        offsets = rng.uniform(-joint_noise, joint_noise, size=7)
        return offsets, self.sample_init(rng)

    @abc.abstractmethod
    def apply_init(self, ids: np.ndarray, inits: list[dict[str, np.ndarray]]) -> None:
        """Write the initial placements of envs ``ids`` into the batch state."""

    # success, privileged and dense_reward read the env's fields, which are numpy arrays on the host
    # or torch tensors on the Warp device (task_logic="device"): write them with ``self.env.xp``
    # (the array API namespace of the fields) and return arrays of that library.
    @abc.abstractmethod
    def success(self, ids: np.ndarray) -> Any:
        """bool ``[len(ids)]``: the success predicate of envs ``ids`` at the current state."""

    @abc.abstractmethod
    def privileged(self, ids: np.ndarray) -> Any:
        """float ``[len(ids), P]``: object poses and goals (for experts, critics, state-only RL)."""

    def dense_reward(self, ids: np.ndarray) -> Any:
        """float ``[len(ids)]`` shaped reward in [0, 1] (used when ``reward_type="dense"``)."""
        xp = self.env.xp
        return xp.astype(self.success(ids), xp.float64)

    def before_step(self, ids: np.ndarray) -> None:
        """Hook run before the physics of a control step (moving targets, conveyors)."""

    def init_rng(self, init_id: int, seed: int = EVAL_SEED) -> np.random.Generator:
        """Random stream of fixed initial state ``init_id`` (machine independent)."""
        key = [seed, init_id] + [ord(c) for c in f"{self.suite}/{self.name}"]
        return np.random.default_rng(key)


def free_joint_qpos(model: mujoco.MjModel, joint: str) -> slice:
    adr = model.joint(joint).qposadr[0]
    return slice(adr, adr + 7)


def free_joint_qvel(model: mujoco.MjModel, joint: str) -> slice:
    adr = model.joint(joint).dofadr[0]
    return slice(adr, adr + 6)


def yaw_quat(yaw: float) -> np.ndarray:
    return np.array([np.cos(yaw / 2), 0.0, 0.0, np.sin(yaw / 2)])
