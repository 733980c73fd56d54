"""Real LIBERO in our batched simulator: a suite's exported scenes behind the :class:`sims.VecEnv` contract.

    env = sims.make("mujoco", suite="libero_spatial", num_envs=8, cameras=("agentview", "wrist"))
    obs = env.reset(init_ids=list(range(8)))    # the official init states 0..7 (envs i on task i % 10)
    obs, reward, terminated, truncated, info = env.step(actions)      # actions [8, 7] in [-1, 1]

A suite env groups its envs by task: one :class:`~sims.libero.worlds.LiberoWorlds` per task that
envs run (one compiled model each), every group stepped with LIBERO's own controller, goal and
observation timing. What an episode is follows LIBERO's protocol (openpi's LIBERO example):

- a reset puts the env in an init state (``init_ids``: LIBERO's official states 0..49, or the held-out
  states 50..99 that LIBERO's placement initializer sampled; without them each env draws one of the
  training states ``TRAIN_STATES_FROM .. 49`` with its own random stream, or one of
  :meth:`set_init_pool`'s pool), then plays the protocol's open-gripper wait steps, which the step
  count does not include;
- an action ``[7]`` is OSC_POSE's: delta position, delta axis-angle, gripper (-1 open, +1 close);
- the episode ends on success (``terminated``, reward 1) or at the suite's step limit (``truncated``);
- ``obs["state"]`` is the protocol's 8-D state (:data:`sims.libero.STATE_NAMES`), ``obs["rgb"]``
  ``[N, V, 128, 128, 3]`` its views in the protocol's orientation, ``obs["task_id"]`` the index
  into ``env.tasks``.

An automatic reset keeps the env's gripper command, as robosuite keeps it across resets; ``reset()``
starts every env as a new one (command ``[0, 0]``). LIBERO has 50 official states per task: the
anchor's protocol trains and evaluates on all 50 (``set_init_pool(range(50))``); otherwise
demonstrations and training draw from states 25..49 (:func:`sims.suites.training_init_id`). Either
way states 50..99, which LIBERO's own placement initializer drew for the scene cache
(:mod:`sims.libero.reference.export`), stay held out (:func:`sims.suites.heldout_states`).
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any, Sequence

import mujoco
import numpy as np
import torch

from sims.core import Obs, Spec, TaskSpec, VecEnv, env_index_array
from sims.episodes import EpisodeBook
from sims.libero import (
    ACTION_DIM,
    ACTION_NAMES,
    INIT_IDS,
    MAX_STEPS,
    NUM_INIT_STATES,
    NUM_STATES,
    NUM_TASKS,
    NUM_WAIT_STEPS,
    STATE_NAMES,
    TRAIN_STATES_FROM,
)
from sims.libero.physics import BatchPhysics
from sims.libero.scenes import BOX_CONTACTS, ensure_tasks
from sims.libero.worlds import CAMERAS, LiberoWorlds
from sims.registry import closest_key

CONTROL_HZ = 20.0
#: joint speeds beyond this (rad/s or m/s) count as a diverged simulation, as in the MuJoCo backend
MAX_QVEL = 1e3
#: visual mesh faces per mesh by default (:func:`sims.mujoco.meshes.decimated_copy`): ~3x the frame rate of
#: the meshes as they are, at the image difference docs/results/libero-scenes.md measures; None: as they are
DEFAULT_RENDER_FACES = 2000
#: options of :class:`LiberoVecEnv` that :func:`sims.make` passes through
OPTIONS = (
    "cameras",
    "image_size",
    "tasks",
    "cache",
    "box_contacts",
    "shadows",
    "reflections",
    "render_faces",
    "antialias",
    "max_steps",
    "reward_type",
    "wait_steps",
    "num_threads",
    "state_obs",
)


#: LIBERO's task table (index, name, instruction, goal, movable objects per task of each standard suite),
#: written from the LIBERO package by ``python -m reference.task_table`` in the reference venv
TASK_TABLE = Path(__file__).with_name("tasks.json")


@functools.lru_cache(maxsize=None)
def _task_table() -> dict[str, list[dict[str, Any]]]:
    return json.loads(TASK_TABLE.read_text())


def task_specs(suite: str, cache: str | None = None, tasks: Sequence[int] | None = None) -> list[TaskSpec]:
    """The tasks of ``suite`` (all of them, or ``tasks``) as :class:`TaskSpec`s, from LIBERO's task table:
    no scene needs exporting to list them (an env exports-checks the tasks it runs, ``cache`` is unused here)."""
    if suite not in MAX_STEPS:
        raise ValueError(f"unknown LIBERO suite {suite!r} for the batched simulator; choose one of {list(MAX_STEPS)}")
    count = NUM_TASKS[suite]
    if tasks is not None:
        bad = [t for t in tasks if not 0 <= int(t) < count]
        if bad or not len(tasks):
            raise ValueError(
                f"tasks must be a non-empty list of {suite}'s task indices 0..{count - 1}, got {list(tasks)}"
            )
    rows = _task_table()[suite]
    return [
        TaskSpec(
            name=r["name"],
            suite=suite,
            instruction=r["language"],
            max_steps=MAX_STEPS[suite],
            extras={"task_index": r["index"], "goal": r["goal"], "objects": r["objects"]},
        )
        for r in (rows if tasks is None else [rows[int(t)] for t in tasks])
    ]


class LiberoVecEnv(VecEnv):
    """N envs over the exported tasks of one LIBERO suite. Build with ``sims.make("mujoco", suite=...)``.

    Args beyond :func:`sims.make`'s:
        cameras: of ``agentview`` and ``wrist`` (the protocol's two; ``()``: state only).
        image_size: the views' height and width (the protocol renders 256 and openpi resizes to 224;
            128 is what we train on).
        tasks: the suite's task indices the env runs (default all); ``obs["task_id"]`` and
            ``reset(task_ids=...)`` index into this list. A task's scene missing from the cache is
            exported when an env first runs it (named ``tasks``: when the env is made), about 10 s a
            task (:func:`sims.libero.scenes.ensure_tasks`; ``EMBODIED_LIBERO_AUTO_EXPORT=0``: it raises).
        cache: the scene cache root (default :func:`sims.libero.scenes.cache_root`).
        box_contacts, shadows, reflections, render_faces, antialias: see :class:`~sims.libero.worlds.LiberoWorlds`
            (datasets, training and evaluation must render alike); ``render_faces`` defaults to
            :data:`DEFAULT_RENDER_FACES`, None renders the meshes as they are.
        max_steps: overrides the suite's step limit.
        reward_type: ``sparse`` only (1 at success): LIBERO's goals have no shaped reward.
        wait_steps: the open-gripper steps after each reset.
        num_threads: threads stepping each task's envs (default one per 4 envs, at most the cores).
        state_obs: ``proprio`` only (the protocol's 8-D state): LIBERO's tasks have no common
            privileged vector.
    """

    def __init__(
        self,
        suite: str,
        num_envs: int,
        *,
        seed: int = 0,
        device: str | torch.device = "cpu",
        cameras: Sequence[str] = ("agentview", "wrist"),
        image_size: int = 128,
        tasks: Sequence[int] | None = None,
        cache: str | None = None,
        box_contacts: str = "reference",
        shadows: bool = False,
        reflections: bool = False,
        render_faces: int | None = DEFAULT_RENDER_FACES,
        antialias: bool = True,
        max_steps: int | None = None,
        reward_type: str = "sparse",
        wait_steps: int = NUM_WAIT_STEPS,
        num_threads: int | None = None,
        state_obs: str = "proprio",
    ) -> None:
        if num_envs < 1:
            raise ValueError(f"num_envs must be >= 1, got {num_envs}")
        unknown = [c for c in cameras if c not in CAMERAS]
        if unknown:
            raise ValueError(f"unknown camera(s) {unknown}; LIBERO's views are {sorted(CAMERAS)}")
        if box_contacts not in BOX_CONTACTS:
            raise ValueError(f"box_contacts must be one of {BOX_CONTACTS}, got {box_contacts!r}")
        if state_obs != "proprio":
            raise ValueError(
                f"state_obs={state_obs!r} is not available for a LIBERO suite: its tasks have no common "
                "privileged vector; use state_obs='proprio' (the protocol's 8-D state) with cameras"
            )
        if reward_type != "sparse":
            raise ValueError(f"LIBERO's goals give a sparse reward only; reward_type={reward_type!r} is not available")
        if max_steps is not None and max_steps < 1:
            raise ValueError(f"max_steps must be >= 1, got {max_steps}")
        if wait_steps < 0:
            raise ValueError(f"wait_steps must be >= 0, got {wait_steps}")
        if image_size < 16:
            raise ValueError(f"image_size must be >= 16, got {image_size}")
        self.suite, self.cache = suite, cache
        self.tasks = task_specs(suite, cache, tasks)
        if tasks is not None:  # named tasks are exported now if missing (others: when an env first runs them)
            ensure_tasks(suite, [t.extras["task_index"] for t in self.tasks], cache)
        if max_steps is not None:
            self.tasks = [
                TaskSpec(t.name, t.suite, t.instruction, int(max_steps), t.privileged_keys, t.extras)
                for t in self.tasks
            ]
        self.num_envs = num_envs
        self.device = torch.device(device)
        self.control_hz = CONTROL_HZ
        self.action_mode = "osc_pose"
        self.state_names, self.action_names = STATE_NAMES, ACTION_NAMES
        self.cameras = tuple(cameras)
        self.image_size = int(image_size)
        self.wait_steps = int(wait_steps)
        self._world_options = dict(
            box_contacts=box_contacts,
            cameras=self.cameras,
            image_size=self.image_size,
            shadows=shadows,
            reflections=reflections,
            render_faces=render_faces,
            antialias=antialias,
            nthread=num_threads,
        )
        self.action_spec = Spec(
            (ACTION_DIM,),
            torch.float32,
            -1.0,
            1.0,
            "OSC_POSE: delta position 3, delta axis-angle 3, gripper (-1 open, +1 close)",
        )
        self.observation_spec = {
            "state": Spec((len(STATE_NAMES),), torch.float32, doc=", ".join(STATE_NAMES)),
            "task_id": Spec((), torch.int64),
        }
        if self.cameras:
            self.observation_spec["rgb"] = Spec(
                (len(self.cameras), self.image_size, self.image_size, 3), torch.uint8, 0, 255
            )
        self._task_ids = np.arange(num_envs, dtype=np.int64) % len(self.tasks)
        self._worlds: dict[int, LiberoWorlds] = {}
        self._members: dict[int, np.ndarray] = {}  # task -> its env ids, in the order of its worlds' envs
        self._local = np.zeros(num_envs, np.int64)  # env id -> its index in its task's worlds
        self._init_ids = np.full(num_envs, -1, np.int64)  # fixed init ids (reset(init_ids=...)), -1: draw
        self._current_init = np.zeros(num_envs, np.int64)
        # steps, returns and step limits of the episodes; how a step ends them (sims/episodes.py)
        self._book = EpisodeBook(num_envs, [t.max_steps for t in self.tasks])
        self.init_pool: np.ndarray | None = None
        self._rngs = self._make_rngs(seed)
        self._closed = False
        # the simulators are built at the first reset (or step): a caller's reset(task_ids=...) then
        # compiles only the tasks it runs
        self._started = False

    # ------------------------------------------------------------------ groups
    def _make_rngs(self, seed: int) -> list[np.random.Generator]:
        return [np.random.default_rng([seed, i]) for i in range(self.num_envs)]

    def _regroup(self) -> None:
        """One :class:`LiberoWorlds` per task that envs run, sized to its envs (kept when unchanged)."""
        members = {int(t): np.flatnonzero(self._task_ids == t) for t in np.unique(self._task_ids)}
        for t in list(self._worlds):
            if t not in members or len(members[t]) != self._worlds[t].num_envs:
                self._worlds.pop(t).close()
        new = [t for t in members if t not in self._worlds]
        # the tasks first run now are exported if missing, in one exporter run
        folders = dict(
            zip(new, ensure_tasks(self.suite, [self.tasks[t].extras["task_index"] for t in new], self.cache))
        )
        for t, envs in members.items():
            if t not in self._worlds:
                self._worlds[t] = LiberoWorlds(folders[t], len(envs), **self._world_options)
            self._local[envs] = np.arange(len(envs))
        self._members = members

    def _start(self) -> None:
        if not self._started:
            self.reset()

    def worlds(self, task: int) -> LiberoWorlds:
        """The simulator of task ``task``'s envs (privileged access: experts, parity checks)."""
        self._start()
        if task not in self._worlds:
            raise ValueError(f"no env runs task {task} now; tasks in use: {sorted(self._worlds)}")
        return self._worlds[task]

    def worlds_or_none(self, task: int) -> LiberoWorlds | None:
        """The simulator of task ``task``'s envs, or None when no env runs it now."""
        return self._worlds.get(task)

    @property
    def num_diverged(self) -> int:
        """Steps that diverged, over all envs, since the env was made."""
        return self._book.num_diverged

    @num_diverged.setter
    def num_diverged(self, value: int) -> None:
        self._book.num_diverged = int(value)

    @property
    def task_ids(self) -> np.ndarray:
        """The task each env runs now ``[N]`` (indices into :attr:`tasks`)."""
        return self._task_ids.copy()

    def env_rows(self, task: int) -> np.ndarray:
        """The env ids of task ``task``, in the order of :meth:`worlds`' envs."""
        self.worlds(task)
        return self._members[task].copy()

    def _draw_init(self, env: int) -> int:
        if self._init_ids[env] >= 0:
            return int(self._init_ids[env])
        if self.init_pool is not None:
            return int(self.init_pool[self._rngs[env].integers(len(self.init_pool))])
        return int(self._rngs[env].integers(TRAIN_STATES_FROM, NUM_INIT_STATES))

    def set_init_pool(self, init_ids: Any | None) -> None:
        """Draw every reset without an explicit init id (automatic resets included) from these init states
        (official 0..49 or sampled 50..99; each env picks one with its own random stream); None: the
        training states again (``TRAIN_STATES_FROM .. 49``)."""
        pool = None if init_ids is None else np.asarray(list(init_ids), np.int64)
        if pool is not None and (len(pool) == 0 or (pool < 0).any() or (pool >= NUM_STATES).any()):
            raise ValueError(f"an init pool needs LIBERO init ids in {INIT_IDS}, got {list(init_ids)}")
        self.init_pool = pool

    # ------------------------------------------------------------------ contract
    def reset(
        self,
        *,
        seed: int | None = None,
        task_ids: Sequence[int] | torch.Tensor | None = None,
        init_ids: Sequence[int] | torch.Tensor | None = None,
    ) -> Obs:
        self._check_open()
        if seed is not None:
            self._rngs = self._make_rngs(int(seed))
        tids = env_index_array(task_ids, self.num_envs, "task_ids", high=len(self.tasks))
        if tids is not None:
            self._task_ids[:] = tids
        iids = env_index_array(init_ids, self.num_envs, "init_ids")
        if iids is not None and ((iids < 0).any() or (iids >= NUM_STATES).any()):
            raise ValueError(
                f"a LIBERO task has {NUM_STATES} init states: init_ids must be in {INIT_IDS}, got {iids.tolist()}"
            )
        self._init_ids[:] = -1 if iids is None else iids
        self._regroup()
        self._started = True
        for t, envs in self._members.items():
            ids = np.array([self._draw_init(e) for e in envs], np.int64)
            self._worlds[t].reset(ids, wait_steps=self.wait_steps)
            self._current_init[envs] = ids
        self._book.reset()
        return self._observe()

    def step(
        self, actions: torch.Tensor, *, active: torch.Tensor | None = None, render: bool = True
    ) -> tuple[Obs, torch.Tensor, torch.Tensor, torch.Tensor, dict[str, Any]]:
        self._check_open()
        self._start()
        n = self.num_envs
        act = torch.as_tensor(actions).detach().to("cpu", torch.float64).numpy()
        if act.shape != (n, ACTION_DIM):
            raise ValueError(f"actions must have shape [{n}, {ACTION_DIM}], got {list(act.shape)}")
        if not np.isfinite(act).all():
            raise ValueError("actions contain NaN or inf")
        act = act.clip(-1.0, 1.0)
        stepped = np.ones(n, bool) if active is None else torch.as_tensor(active).detach().cpu().numpy().astype(bool)
        success = np.zeros(n, bool)
        diverged = np.zeros(n, bool)
        for t, envs in self._members.items():
            envs = envs[stepped[envs]]
            if len(envs):
                success[envs], diverged[envs] = self._step_task(t, envs, act[envs], render)
        out = self._book.record(stepped, self._task_ids, success=success, diverged=diverged)
        if not render:  # the final observations of the episodes that ended are drawn all the same
            for t, envs in self._members.items():
                self._worlds[t].render_views(self._local[envs[out.done[envs]]])
        # info["elapsed"] of an env that ended: its episode's length (what this env has always reported)
        return self._book.finish(out, self._observe(), self._restart, self.device, elapsed_of_ended="ended")

    def _step_task(
        self, task: int, envs: np.ndarray, actions: np.ndarray, render: bool
    ) -> tuple[np.ndarray, np.ndarray]:
        """One control step of task ``task``'s envs ``envs``: whether each one's goal holds after it, and
        whether its physics diverged (a new bad-acceleration warning, a non-finite position or a joint
        speed above :data:`MAX_QVEL`), each ``[len(envs)]``, from the arrays bound to the task's batch."""
        worlds, rows = self._worlds[task], self._local[envs]
        physics = worlds.physics
        warned = _bad_acc(physics, rows)
        success = worlds.step(actions, env_ids=rows, render=render)
        diverged = (
            (_bad_acc(physics, rows) > warned)
            | ~np.isfinite(physics.qpos[rows]).all(axis=1)
            | (np.abs(physics.qvel[rows]).max(axis=1) > MAX_QVEL)
        )
        return success, diverged

    def _restart(self, envs: np.ndarray) -> Obs:
        """Automatic reset of ``envs`` (their episode ended); every env's observation after it."""
        self._reset_envs(envs)
        return self._observe()

    def _reset_envs(self, envs: np.ndarray) -> None:
        """Automatic reset of ``envs``: a new init state, the gripper command kept (as robosuite keeps it)."""
        for t, members in self._members.items():
            mine = envs[self._task_ids[envs] == t]
            if not len(mine):
                continue
            worlds, local = self._worlds[t], self._local[mine]
            ids = np.array([self._draw_init(e) for e in mine], np.int64)
            worlds.reset(
                ids, wait_steps=self.wait_steps, gripper_command=worlds.arm.gripper[local].copy(), env_ids=local
            )
            self._current_init[mine] = ids
        self._book.reset(envs)

    def _observe(self) -> Obs:
        state = np.zeros((self.num_envs, len(STATE_NAMES)), np.float32)
        rgb = (
            np.zeros((self.num_envs, len(self.cameras), self.image_size, self.image_size, 3), np.uint8)
            if self.cameras
            else None
        )
        for t, envs in self._members.items():
            worlds = self._worlds[t]
            state[envs] = worlds.state()
            if rgb is not None:
                rgb[envs] = worlds.images()
        obs = {
            "state": torch.from_numpy(state).to(self.device),
            "task_id": torch.from_numpy(self._task_ids.copy()).to(self.device),
        }
        if rgb is not None:
            obs["rgb"] = torch.from_numpy(rgb).to(self.device)
        return obs

    # ------------------------------------------------------------------ extras
    @property
    def init_ids(self) -> np.ndarray:
        """The init state each env's current episode started from ``[N]`` (0..49 official, 50..99 sampled)."""
        self._start()
        return self._current_init.copy()

    def success_mask(self) -> np.ndarray:
        """bool ``[N]``: each env's goal in its state now."""
        self._start()
        out = np.zeros(self.num_envs, bool)
        for t, envs in self._members.items():
            out[envs] = self._worlds[t].success(self._local[envs])
        return out

    def render(self, env_id: int = 0, camera: str = "agentview") -> np.ndarray:
        """An ``[H, W, 3]`` uint8 frame of one env in the protocol's orientation (for videos)."""
        if not 0 <= env_id < self.num_envs:
            raise ValueError(f"env_id must be in 0..{self.num_envs - 1}, got {env_id}")
        self._start()
        t = int(self._task_ids[env_id])
        return self._worlds[t].render(int(self._local[env_id]), camera)

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("this env is closed")

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for w in self._worlds.values():
            w.close()
        self._worlds.clear()


def _bad_acc(physics: BatchPhysics, rows: np.ndarray) -> np.ndarray:
    """The bad-acceleration warnings of simulations ``rows`` ``[len(rows)]``: MuJoCo's count, as ``MjData.warning``'s
    (which :meth:`BatchPhysics.sync` copies), from the batch's bound array."""
    return physics.batch.warning[rows, mujoco.mjtWarning.mjWARN_BADQACC, 1].astype(np.int64)


def make_libero_env(*, suite: str, num_envs: int, seed: int, device: str | torch.device, **kwargs: Any) -> LiberoVecEnv:
    """The ``mujoco`` backend's factory for LIBERO suites; unknown options are refused with the closest named."""
    for key in kwargs:
        if key not in OPTIONS:
            guess = closest_key(key, OPTIONS)
            hint = f"did you mean {guess!r}? " if guess else ""
            raise ValueError(f"unknown option {key!r} for a LIBERO suite env; {hint}options: {list(OPTIONS)}")
    return LiberoVecEnv(suite, num_envs, seed=seed, device=device, **kwargs)


__all__ = [
    "CONTROL_HZ",
    "DEFAULT_RENDER_FACES",
    "TASK_TABLE",
    "LiberoVecEnv",
    "OPTIONS",
    "make_libero_env",
    "task_specs",
]
