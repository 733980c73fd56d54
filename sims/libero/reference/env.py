"""One LIBERO task in its reference simulator (robosuite 1.4), with the official protocol's views.

Runs in ``.venv-libero`` only (numpy, libero). :class:`ReferenceTask` wraps LIBERO's
``OffScreenRenderEnv`` for one task of a suite:

- :meth:`reset` restores one of the task's initial states (``set_init_state``: the full simulator
  state) and plays the protocol's wait steps (the open-gripper dummy action): init ids 0..49 are
  LIBERO's official states, 50..99 (standard suites) the held-out states LIBERO's placement
  initializer sampled, read from the scene cache (``sampled_states.npy``, exported there first when
  missing), so that this simulator and the batched one start from the very same states;
- :meth:`observation` is what the policy sees: both camera images rotated by 180 degrees (the
  renders are upside down) and the 8-D state (end-effector position, axis-angle, gripper);
- privileged access for scripted experts and tests: object and fixture poses (:meth:`pose`), the
  BDDL goal's predicates and their truth (:meth:`goal`), and placing an object (:meth:`place`).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

#: the official protocol's step limits and constants (mirrors ``sims.libero``, which this venv cannot import)
MAX_STEPS = {"libero_spatial": 220, "libero_object": 280, "libero_goal": 300, "libero_10": 520, "libero_90": 400}
NUM_WAIT_STEPS = 10
SEED = 7
NUM_SAMPLED_STATES = 50  # the sampled states of a standard suite's task (sims.libero.NUM_SAMPLED_STATES)
DUMMY_ACTION = np.array([0.0, 0.0, 0.0, 0.0, 0.0, 0.0, -1.0])  # hold still, gripper open
CAMERAS = ("agentview", "robot0_eye_in_hand")


def base_suite(suite: str) -> str:
    """``libero_spatial_swap`` -> ``libero_spatial`` (a LIBERO-PRO variant keeps its base's limit)."""
    for base in sorted(MAX_STEPS, key=len, reverse=True):
        if suite == base or suite.startswith(base + "_"):
            return base
    raise ValueError(f"not a LIBERO suite: {suite!r}")


def quat2axisangle(quat: np.ndarray) -> np.ndarray:
    """Axis-angle ``[3]`` of a unit quaternion ``[4]`` in robosuite's (x, y, z, w) order."""
    w = float(np.clip(quat[3], -1.0, 1.0))
    den = math.sqrt(1.0 - w * w)
    if math.isclose(den, 0.0):
        return np.zeros(3)
    return np.asarray(quat[:3], dtype=np.float64) * 2.0 * math.acos(w) / den


def protocol_state(obs: dict[str, np.ndarray]) -> np.ndarray:
    """The official 8-D state ``[8]`` float32: eef position, eef axis-angle, gripper finger positions."""
    return np.concatenate(
        [obs["robot0_eef_pos"], quat2axisangle(obs["robot0_eef_quat"]), obs["robot0_gripper_qpos"]]
    ).astype(np.float32)


def instruction(suite: str, task: Any) -> str:
    """The instruction the policy gets: the task's ``language`` on the standard suites (what openpi's
    LIBERO example sends, the datasets' text); on a LIBERO-PRO variant its BDDL file's, where the
    perturbation lives (``libero_goal_lan``'s "place the bowl on the stove" for "put the bowl on the stove")."""
    if suite in MAX_STEPS:
        return task.language
    from libero.libero import get_libero_path
    from libero.libero.envs.bddl_utils import get_problem_info

    return get_problem_info(str(Path(get_libero_path("bddl_files")) / task.problem_folder / task.bddl_file))[
        "language_instruction"
    ]


def load_suite(suite: str) -> Any:
    from libero.libero import benchmark

    names = benchmark.get_benchmark_dict()
    if suite not in names:
        raise ValueError(f"unknown LIBERO suite {suite!r}; choose one of {sorted(names)}")
    return names[suite]()


class ReferenceTask:
    """Task ``task_id`` of ``suite`` in LIBERO's own env.

    Args:
        image_size: camera height and width in pixels; 0 renders nothing (state-only, much faster).
        hard_reset: robosuite's default rebuilds the whole model at every reset (seconds); the
            initial state restores the full simulator state either way, so the default here is False.
        seed: the env's seed (the protocol's 7).
        cache: the scene cache root the sampled states (init ids 50..99) are read from (default
            ``$EMBODIED_LIBERO_CACHE`` or ``~/.cache/embodied/libero``, as the main venv's).
    """

    def __init__(
        self,
        suite: str,
        task_id: int,
        *,
        image_size: int = 128,
        hard_reset: bool = False,
        seed: int = SEED,
        cache: str | Path | None = None,
    ) -> None:
        from libero.libero import get_libero_path
        from libero.libero.envs import OffScreenRenderEnv

        self.suite_name = suite
        self.suite = load_suite(suite)
        if not 0 <= task_id < self.suite.n_tasks:
            raise ValueError(f"task {task_id} out of range for {suite} (0..{self.suite.n_tasks - 1})")
        self.task_id = task_id
        self.task = self.suite.get_task(task_id)
        self.name: str = self.task.name
        self.language: str = instruction(suite, self.task)
        self.init_states: np.ndarray = np.asarray(self.suite.get_task_init_states(task_id))
        self.max_steps = MAX_STEPS[base_suite(suite)]
        self.image_size = image_size
        self.bddl_file = Path(get_libero_path("bddl_files")) / self.task.problem_folder / self.task.bddl_file
        render = image_size > 0
        kwargs: dict[str, Any] = dict(bddl_file_name=str(self.bddl_file), hard_reset=hard_reset)
        if render:
            kwargs.update(camera_heights=image_size, camera_widths=image_size)
        else:
            kwargs.update(use_camera_obs=False, has_offscreen_renderer=False)
        self.env = OffScreenRenderEnv(**kwargs)
        self.env.seed(seed)
        self.cache = cache
        self._sampled: np.ndarray | None = None
        self.raw: dict[str, np.ndarray] = {}

    # -- the protocol ------------------------------------------------------------------------
    @property
    def num_states(self) -> int:
        """How many init ids the task has: a standard suite's 100 (official 0..49, sampled 50..99), a
        LIBERO-PRO variant's official ones."""
        return len(self.init_states) + (NUM_SAMPLED_STATES if self.suite_name in MAX_STEPS else 0)

    def init_ids_help(self) -> str:
        """The task's init ids in words, for error messages."""
        official = f"0..{len(self.init_states) - 1} (LIBERO's official init states)"
        if self.suite_name not in MAX_STEPS:
            return f"{official} only: a LIBERO-PRO variant has no sampled states"
        return (
            f"{official} or {len(self.init_states)}..{self.num_states - 1} (the held-out states LIBERO's "
            "placement initializer sampled)"
        )

    @property
    def sampled_states(self) -> np.ndarray:
        """The held-out states LIBERO's own placement initializer drew for this task ``[50, 1 + nq + nv]``
        (init ids 50..99), read from the scene cache's ``sampled_states.npy`` (the task exported into the
        cache first when missing, :func:`reference.export.ensure_task`)."""
        if self._sampled is None:
            if self.suite_name not in MAX_STEPS:
                raise ValueError(f"{self.suite_name} task {self.task_id} has init ids {self.init_ids_help()}")
            from .export import ensure_task

            path = ensure_task(self.suite_name, self.task_id, self.cache) / "sampled_states.npy"
            states = np.load(path)
            if states.shape != (NUM_SAMPLED_STATES,) + self.init_states.shape[1:]:
                raise ValueError(
                    f"{path} holds states {list(states.shape)}; this task's are "
                    f"[{NUM_SAMPLED_STATES}, {self.init_states.shape[1]}]: export the task again"
                )
            self._sampled = states
        return self._sampled

    def state_of(self, init_id: int) -> np.ndarray:
        """The flattened simulator state ``[1 + nq + nv]`` of init id ``init_id``."""
        if not 0 <= init_id < self.num_states:
            raise ValueError(
                f"init state {init_id} out of range: {self.suite_name} task {self.task_id} has init ids "
                f"{self.init_ids_help()}"
            )
        if init_id < len(self.init_states):
            return self.init_states[init_id]
        return self.sampled_states[init_id - len(self.init_states)]

    def reset(self, init_id: int, *, wait_steps: int = NUM_WAIT_STEPS) -> dict[str, np.ndarray]:
        """Restore initial state ``init_id`` (official 0..49, sampled 50..99) and play ``wait_steps`` dummy
        steps."""
        state = self.state_of(init_id)
        self.env.reset()
        self.raw = self.env.set_init_state(state)
        for _ in range(wait_steps):
            self.raw, _, _, _ = self.env.step(DUMMY_ACTION)
        return self.raw

    def step(self, action: np.ndarray) -> bool:
        """One control step (``action [7]`` in [-1, 1]); whether the task's goal holds after it."""
        action = np.asarray(action, dtype=np.float64).reshape(-1)
        if action.shape != (7,) or not np.isfinite(action).all():
            raise ValueError(f"a LIBERO action is 7 finite numbers, got shape {list(action.shape)}")
        self.raw, _, done, _ = self.env.step(action)
        return bool(done)

    def success(self) -> bool:
        return bool(self.env.check_success())

    def observation(self) -> dict[str, Any]:
        """``{"agentview", "wrist"}`` uint8 ``[H, W, 3]`` (rotated 180 degrees; absent without
        rendering) and ``"state"`` float32 ``[8]`` of the last reset or step."""
        out: dict[str, Any] = {"state": protocol_state(self.raw)}
        if self.image_size > 0:
            out["agentview"] = np.ascontiguousarray(self.raw["agentview_image"][::-1, ::-1])
            out["wrist"] = np.ascontiguousarray(self.raw["robot0_eye_in_hand_image"][::-1, ::-1])
        return out

    def camera_observables(self, enabled: bool) -> None:
        """Turn robosuite's two camera observables on or off: off, a step renders nothing (the views are
        then drawn only on request, :meth:`render_views`)."""
        if self.image_size <= 0:
            raise ValueError("this env was made without rendering (image_size=0)")
        for cam in ("agentview", "robot0_eye_in_hand"):
            self.inner.modify_observable(observable_name=f"{cam}_image", attribute="enabled", modifier=enabled)

    def render_views(self) -> dict[str, np.ndarray]:
        """Both views of the simulator now, drawn directly as the camera observables draw them
        (``sim.render``), in the protocol's orientation ``[H, W, 3]``."""
        if self.image_size <= 0:
            raise ValueError("this env was made without rendering (image_size=0)")
        sim, size = self.inner.sim, self.image_size
        return {
            view: np.ascontiguousarray(sim.render(camera_name=cam, width=size, height=size)[::-1, ::-1])
            for view, cam in (("agentview", "agentview"), ("wrist", "robot0_eye_in_hand"))
        }

    # -- privileged access ---------------------------------------------------------------------
    @property
    def inner(self) -> Any:
        """The robosuite env (``Libero_*`` problem class) under the wrapper."""
        return self.env.env

    def object_names(self) -> list[str]:
        return list(self.inner.objects_dict)

    def fixture_names(self) -> list[str]:
        return list(self.inner.fixtures_dict)

    def pose(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        """World position ``[3]`` and orientation quaternion ``[4]`` (w, x, y, z) of an object or fixture."""
        inner = self.inner
        if name not in inner.obj_body_id:
            raise KeyError(f"no object or fixture {name!r}; have {sorted(inner.obj_body_id)}")
        body = inner.obj_body_id[name]
        return (np.array(inner.sim.data.body_xpos[body]), np.array(inner.sim.data.body_xquat[body]))

    def place(self, name: str, position: np.ndarray, quat_wxyz: np.ndarray | None = None) -> None:
        """Put a free object at ``position [3]`` (keeping its orientation unless given), at rest."""
        inner = self.inner
        if name not in inner.objects_dict:
            raise KeyError(f"{name!r} is not a movable object; have {self.object_names()}")
        joints = inner.objects_dict[name].joints
        if not joints:
            raise ValueError(f"{name!r} has no free joint to move it by")
        current = inner.sim.data.get_joint_qpos(joints[-1])
        quat = current[3:7] if quat_wxyz is None else np.asarray(quat_wxyz, dtype=np.float64)
        inner.sim.data.set_joint_qpos(joints[-1], np.concatenate([np.asarray(position, np.float64), quat]))
        inner.sim.data.set_joint_qvel(joints[-1], np.zeros(6))
        inner.sim.forward()

    def goal(self) -> list[tuple[list[str], bool]]:
        """The BDDL goal: each predicate (e.g. ``["on", "akita_black_bowl_1", "plate_1"]``) with its
        truth now; the task succeeds when all hold."""
        inner = self.inner
        return [(list(p), bool(inner._eval_predicate(p))) for p in inner.parsed_problem["goal_state"]]

    def close(self) -> None:
        self.env.close()

    def __enter__(self) -> "ReferenceTask":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
