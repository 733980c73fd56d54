"""Gymnasium adapters over a sims :class:`~sims.core.VecEnv`: numpy in, numpy out.

Two classes:

- :class:`GymVectorEnv`: a ``gymnasium.vector.VectorEnv`` over N sims envs stepped together
  (one batched ``VecEnv`` underneath, no Python loop over envs). Same-step autoreset.
- :class:`GymEnv`: a single ``gymnasium.Env`` (``num_envs=1`` underneath); no autoreset.

Registered ids (:func:`register_gymnasium_envs`, run when :mod:`sims.compat` is imported):
``embodied/Reach-v0``, ``embodied/PickCube-v0``, ``embodied/PlaceCube-v0`` and the suites
``embodied/{Spatial,Object,Goal,Long,Dynamic}Suite-v0``. Each id has both an
``entry_point`` (:class:`GymEnv`, used by ``gymnasium.make`` and by ``make_vec`` in ``"sync"`` /
``"async"`` mode) and a ``vector_entry_point`` (:class:`GymVectorEnv`, the default of
``make_vec``)::

    import gymnasium, sims.compat
    venv = gymnasium.make_vec("embodied/PickCube-v0", num_envs=8, cameras=(), seed=0)
    env = gymnasium.make("embodied/PickCube-v0", cameras=("agentview",), image_size=64)

Keyword arguments (``cameras``, ``image_size``, ``seed``, ``reward_type``, ``backend``, ...) pass
through to :func:`sims.make`. Without the ``import sims.compat`` gymnasium can import it itself:
``gymnasium.make("sims.compat:embodied/PickCube-v0")``.

Observations (a ``spaces.Dict``; per env, batch first in the vector env):
``state`` float32 ``[S]``, ``privileged`` float32 ``[P]``, ``task_id`` ``Discrete(len(tasks))``
(``MultiDiscrete`` batched, int64) and, when cameras are requested, ``rgb`` uint8 ``[V, H, W, 3]``.
Actions: ``Box(-1, 1, (A,), float32)`` (``[N, A]`` batched).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import gymnasium
import numpy as np
import torch
from gymnasium import spaces
from gymnasium.vector import AutoresetMode
from gymnasium.vector.utils import batch_space

import sims
from sims.core import Spec, VecEnv

#: gymnasium id suffix -> sims task name (kept here so that registering needs no MuJoCo import).
GYM_TASKS: dict[str, str] = {
    "Reach": "reach",
    "PickCube": "pick_cube",
    "PlaceCube": "place_cube",
}
#: gymnasium id suffix -> sims suite name (every env runs one of the suite's tasks).
GYM_SUITES: dict[str, str] = {
    "SpatialSuite": "spatial",
    "ObjectSuite": "object",
    "GoalSuite": "goal",
    "LongSuite": "long",
    "DynamicSuite": "dynamic",
}
GYM_NAMESPACE = "embodied"
GYM_VERSION = "v0"
#: reset option keys understood by :meth:`GymVectorEnv.reset` (per env, ``[N]``).
VECTOR_RESET_OPTIONS = ("task_ids", "init_ids")
#: reset option keys understood by :meth:`GymEnv.reset` (scalars).
SINGLE_RESET_OPTIONS = ("task_id", "init_id")


# ------------------------------------------------------------------------------------ helpers
def gym_id(name: str) -> str:
    """The registered gymnasium id of a task suffix, e.g. ``"PickCube"`` -> ``embodied/PickCube-v0``."""
    return f"{GYM_NAMESPACE}/{name}-{GYM_VERSION}"


def _space_from_spec(key: str, spec: Spec, num_tasks: int) -> spaces.Space:
    """The per-env gymnasium space of one observation entry."""
    dtype = np.dtype(str(spec.dtype).removeprefix("torch."))
    if key == "task_id":
        if spec.shape != ():
            raise ValueError(f"task_id must be a per-env scalar, got shape {spec.shape}")
        return spaces.Discrete(num_tasks)
    if dtype == np.uint8:
        low = 0 if spec.low is None else spec.low
        high = 255 if spec.high is None else spec.high
        return spaces.Box(low=low, high=high, shape=spec.shape, dtype=np.uint8)
    if np.issubdtype(dtype, np.floating):
        low = -np.inf if spec.low is None else spec.low
        high = np.inf if spec.high is None else spec.high
        return spaces.Box(low=low, high=high, shape=spec.shape, dtype=dtype)
    if np.issubdtype(dtype, np.integer):
        info = np.iinfo(dtype)
        low = info.min if spec.low is None else spec.low
        high = info.max if spec.high is None else spec.high
        return spaces.Box(low=low, high=high, shape=spec.shape, dtype=dtype)
    if dtype == np.bool_:
        return spaces.MultiBinary(spec.shape)
    raise TypeError(f"observation {key!r}: no gymnasium space for dtype {spec.dtype}")


def single_spaces(env: VecEnv) -> tuple[spaces.Dict, spaces.Box]:
    """Per-env observation and action spaces of a sims ``VecEnv``."""
    obs_space = spaces.Dict({k: _space_from_spec(k, s, len(env.tasks)) for k, s in env.observation_spec.items()})
    a = env.action_spec
    if a.dtype != torch.float32 or len(a.shape) != 1:
        raise TypeError(f"expected a float32 [A] action spec, got {a}")
    low = -1.0 if a.low is None else a.low
    high = 1.0 if a.high is None else a.high
    return obs_space, spaces.Box(low=low, high=high, shape=a.shape, dtype=np.float32)


def _to_numpy(obs: Mapping[str, torch.Tensor]) -> dict[str, np.ndarray]:
    """Batched observation dict of tensors ``[N, ...]`` -> dict of numpy arrays ``[N, ...]``."""
    return {k: v.detach().cpu().numpy() for k, v in obs.items()}


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().cpu().numpy()


def _make_or_wrap(
    env: VecEnv | None,
    num_envs: int | None,
    task: str | None,
    suite: str | None,
    backend: str,
    seed: int,
    make_kwargs: dict[str, Any],
) -> VecEnv:
    if env is None:
        return sims.make(
            backend,
            task=task,
            suite=suite,
            num_envs=1 if num_envs is None else num_envs,
            seed=seed,
            **make_kwargs,
        )
    if not isinstance(env, VecEnv):
        raise TypeError(f"env must be a sims VecEnv, got {type(env).__name__}")
    extra = sorted(make_kwargs) + [n for n, v in (("task", task), ("suite", suite)) if v is not None]
    if extra:
        raise ValueError(
            "give either an existing sims env (env=...) or the arguments to build one, "
            f"not both; got env=... and {extra}"
        )
    if num_envs is not None and num_envs != env.num_envs:
        raise ValueError(f"num_envs={num_envs} does not match the wrapped env's {env.num_envs}")
    return env


def _check_options(options: Mapping[str, Any] | None, allowed: Sequence[str]) -> dict[str, Any]:
    options = dict(options or {})
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise ValueError(f"unknown reset option(s) {unknown}; supported: {list(allowed)}")
    return options


# ------------------------------------------------------------------------------ vector env
class GymVectorEnv(gymnasium.vector.VectorEnv):
    """``gymnasium.vector.VectorEnv`` over a batched sims ``VecEnv`` (numpy in and out).

    Build it from an existing env (``GymVectorEnv(env)``) or from :func:`sims.make` arguments
    (``GymVectorEnv(num_envs=8, task="pick_cube", cameras=())``, which is what
    ``gymnasium.make_vec`` does).

    Autoreset is ``AutoresetMode.SAME_STEP`` (``metadata["autoreset_mode"]``): an env whose episode
    ends in :meth:`step` is reset inside that call, the returned observation is the first of the
    new episode, and, following gymnasium's same-step convention (``SyncVectorEnv``):

    - ``infos["final_obs"]``: object array ``[N]``, the final observation (a per-env dict of numpy
      arrays) where ``infos["_final_obs"]`` (bool ``[N]``) is True, None elsewhere;
    - ``infos["final_info"]`` / ``infos["_final_info"]``: the ended envs' step info
      (``success``, ``diverged``, ``elapsed`` = episode length, each with its ``_key`` mask);
    - ``infos[episode_stats_key]`` = ``{"r": float32 [N], "l": int64 [N]}`` episode return and
      length with mask ``infos["_" + episode_stats_key]`` (the ``RecordEpisodeStatistics``
      layout; pass ``episode_stats_key=None`` to leave it out, e.g. to use that wrapper instead).

    These keys are present only on steps where some env ended. Always present, with an all-True
    ``_key`` mask: ``success``, ``done``, ``diverged`` (bool ``[N]``) and ``elapsed`` (int64
    ``[N]``, steps into the episode of the *returned* observation, so 0 where an env was reset).
    Every info value is numpy, never torch: arrays, and inside each per-env final observation
    the arrays of that env (``task_id`` a ``np.int64`` scalar, as ``Discrete`` spaces expect).

    Reset options: ``{"task_ids": [N], "init_ids": [N]}`` (see :meth:`sims.core.VecEnv.reset`).
    ``render_mode="rgb_array"`` makes :meth:`render` return one ``[H, W, 3]`` frame per env.
    """

    metadata: dict[str, Any] = {
        "render_modes": ["rgb_array"],
        "render_fps": 20,
        "autoreset_mode": AutoresetMode.SAME_STEP,
    }

    def __init__(
        self,
        env: VecEnv | None = None,
        *,
        num_envs: int | None = None,
        task: str | None = None,
        suite: str | None = None,
        backend: str = "mujoco",
        seed: int = 0,
        render_mode: str | None = None,
        render_camera: str = "agentview",
        episode_stats_key: str | None = "episode",
        **make_kwargs: Any,
    ):
        if render_mode not in (None, "rgb_array"):
            raise ValueError(f"render_mode must be None or 'rgb_array', got {render_mode!r}")
        self.env = _make_or_wrap(env, num_envs, task, suite, backend, seed, make_kwargs)
        self.num_envs = self.env.num_envs
        self.render_mode = render_mode
        self.render_camera = render_camera
        self.episode_stats_key = episode_stats_key
        self.metadata = {**type(self).metadata, "render_fps": self.env.control_hz}
        self.single_observation_space, self.single_action_space = single_spaces(self.env)
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)
        self.action_space = batch_space(self.single_action_space, self.num_envs)

    @property
    def tasks(self) -> Sequence[sims.TaskSpec]:
        """The wrapped env's tasks; ``obs["task_id"]`` indexes into them."""
        return self.env.tasks

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """Reset every env.

        Args:
            seed: env i's stream is reseeded with ``(seed, i)``; None keeps the streams. A list
                of per-env seeds is not supported (the streams are already per env).
            options: optional ``task_ids`` / ``init_ids`` ``[N]``.

        Returns:
            observations (dict of numpy arrays ``[N, ...]``) and an empty info dict.
        """
        self._check_open()
        if seed is not None and not isinstance(seed, (int, np.integer)):
            raise ValueError(
                f"seed must be an int or None, got {type(seed).__name__}: env i is seeded with "
                "(seed, i), so per-env seed lists are not needed"
            )
        if options and "reset_mask" in options:
            raise ValueError(
                "options['reset_mask'] (partial reset) is not supported: envs already reset "
                "on the step their episode ends (AutoresetMode.SAME_STEP)"
            )
        opts = _check_options(options, VECTOR_RESET_OPTIONS)
        super().reset(seed=seed)
        obs = self.env.reset(
            seed=None if seed is None else int(seed),
            task_ids=opts.get("task_ids"),
            init_ids=opts.get("init_ids"),
        )
        return _to_numpy(obs), {}

    def step(
        self, actions: np.ndarray
    ) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """Step every env with ``actions`` ``[N, A]`` in ``[-1, 1]`` (values outside are clipped).

        Returns:
            obs (dict ``[N, ...]``), reward float32 ``[N]``, terminated bool ``[N]``,
            truncated bool ``[N]``, infos (see the class docstring).
        """
        self._check_open()
        act = np.asarray(actions)
        expected = self.action_space.shape
        if act.shape != expected:
            raise ValueError(f"actions must have shape {expected}, got {act.shape}")
        if not (np.issubdtype(act.dtype, np.floating) or np.issubdtype(act.dtype, np.integer)):
            raise TypeError(f"actions must be numeric, got dtype {act.dtype}")
        act_t = torch.as_tensor(act.astype(np.float32, copy=False), device=self.env.device)
        obs, reward, terminated, truncated, info = self.env.step(act_t)
        term, trunc = _np(terminated).astype(bool), _np(truncated).astype(bool)
        done = term | trunc

        def all_true() -> np.ndarray:
            return np.ones(self.num_envs, dtype=bool)

        infos: dict[str, Any] = {
            "success": _np(info["success"]),
            "_success": all_true(),
            "done": done,
            "_done": all_true(),
            "diverged": _np(info["diverged"]),
            "_diverged": all_true(),
        }
        if "elapsed" in info:
            infos["elapsed"], infos["_elapsed"] = _np(info["elapsed"]), all_true()
        if done.any():
            self._add_final(infos, info, done)
        return _to_numpy(obs), _np(reward).astype(np.float32), term, trunc, infos

    def _add_final(self, infos: dict[str, Any], info: dict[str, Any], done: np.ndarray) -> None:
        """Add the same-step autoreset keys for the envs where ``done`` ``[N]`` is True."""
        final = _to_numpy(info["final_obs"])
        final_obs = np.full(self.num_envs, None, dtype=object)
        for i in np.flatnonzero(done):
            final_obs[i] = {k: v[i] for k, v in final.items()}
        infos["final_obs"], infos["_final_obs"] = final_obs, done.copy()
        length = _np(info["episode"]["length"]).astype(np.int64)
        ret = _np(info["episode"]["return"]).astype(np.float32)
        infos["final_info"] = {
            "success": _np(info["success"]),
            "_success": done.copy(),
            "diverged": _np(info["diverged"]),
            "_diverged": done.copy(),
            "elapsed": length,
            "_elapsed": done.copy(),
        }
        infos["_final_info"] = done.copy()
        if self.episode_stats_key is not None:
            infos[self.episode_stats_key] = {
                "r": np.where(done, ret, 0.0).astype(np.float32),
                "l": np.where(done, length, 0).astype(np.int64),
            }
            infos[f"_{self.episode_stats_key}"] = done.copy()

    def render(self) -> tuple[np.ndarray, ...] | None:
        """One uint8 ``[H, W, 3]`` frame per env with ``render_mode="rgb_array"``, else None."""
        self._check_open()
        if self.render_mode is None:
            gymnasium.logger.warn("render() called with render_mode=None; returning None")
            return None
        render = getattr(self.env, "render", None)
        if render is None:
            raise NotImplementedError(f"{type(self.env).__name__} has no render(env_id, camera)")
        return tuple(render(env_id=i, camera=self.render_camera) for i in range(self.num_envs))

    def close_extras(self, **kwargs: Any) -> None:
        """Close the wrapped sims env (renderers, thread pools)."""
        env = getattr(self, "env", None)  # absent when __init__ failed
        if env is not None:
            env.close()

    def _check_open(self) -> None:
        if self.closed:
            raise RuntimeError("this GymVectorEnv is closed")


# ------------------------------------------------------------------------------ single env
class GymEnv(gymnasium.Env):
    """A single ``gymnasium.Env`` over a sims env with ``num_envs=1``.

    Gymnasium semantics: no autoreset. When a step ends the episode (``terminated or
    truncated``), that step returns the episode's final observation; the user then calls
    :meth:`reset`. (Underneath, the sims env has already reset itself: a following
    ``reset()`` without seed or options returns that new episode's first observation instead of
    drawing another one.) Stepping again before ``reset()`` raises ``RuntimeError``.

    Info: ``success``, ``diverged`` (bool) and ``elapsed`` (int, steps into the episode, equal
    to the episode length on its last step); on the last step also ``episode`` =
    ``{"r": return, "l": length}``.

    Reset options: ``{"task_id": int, "init_id": int}``. ``render_mode="rgb_array"`` makes
    :meth:`render` return a uint8 ``[H, W, 3]`` frame of ``render_camera``.
    """

    metadata: dict[str, Any] = {"render_modes": ["rgb_array"], "render_fps": 20}

    def __init__(
        self,
        env: VecEnv | None = None,
        *,
        task: str | None = None,
        suite: str | None = None,
        backend: str = "mujoco",
        seed: int = 0,
        render_mode: str | None = None,
        render_camera: str = "agentview",
        **make_kwargs: Any,
    ):
        if render_mode not in (None, "rgb_array"):
            raise ValueError(f"render_mode must be None or 'rgb_array', got {render_mode!r}")
        if "num_envs" in make_kwargs and make_kwargs.pop("num_envs") != 1:
            raise ValueError("GymEnv is a single env (num_envs=1); use GymVectorEnv for more")
        self.env = _make_or_wrap(env, 1, task, suite, backend, seed, make_kwargs)
        self.render_mode = render_mode
        self.render_camera = render_camera
        self.metadata = {**type(self).metadata, "render_fps": self.env.control_hz}
        self.observation_space, self.action_space = single_spaces(self.env)
        self._needs_reset = True
        self._pending_obs: dict[str, Any] | None = None
        self._closed = False

    @property
    def tasks(self) -> Sequence[sims.TaskSpec]:
        """The wrapped env's tasks; ``obs["task_id"]`` indexes into them."""
        return self.env.tasks

    @staticmethod
    def _row(obs: Mapping[str, torch.Tensor]) -> dict[str, Any]:
        """Row 0 of a batched observation, as numpy (``task_id`` as an ``np.int64`` scalar)."""
        return {k: v[0] for k, v in _to_numpy(obs).items()}

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """Start an episode. ``seed`` reseeds the env's random stream (None keeps it)."""
        self._check_open()
        opts = _check_options(options, SINGLE_RESET_OPTIONS)
        super().reset(seed=seed)
        if seed is None and not opts and self._pending_obs is not None:
            obs = self._pending_obs
        else:
            task_id, init_id = opts.get("task_id"), opts.get("init_id")
            obs = self._row(
                self.env.reset(
                    seed=seed,
                    task_ids=None if task_id is None else [int(task_id)],
                    init_ids=None if init_id is None else [int(init_id)],
                )
            )
        self._pending_obs = None
        self._needs_reset = False
        return obs, {}

    def step(self, action: np.ndarray) -> tuple[dict[str, Any], float, bool, bool, dict[str, Any]]:
        """Step with ``action`` ``[A]`` in ``[-1, 1]``; returns (obs, reward, terminated, truncated, info)."""
        self._check_open()
        if self._needs_reset:
            raise RuntimeError("the episode has ended (or never started): call reset() before step()")
        act = np.asarray(action)
        if act.shape != self.action_space.shape:
            raise ValueError(f"action must have shape {self.action_space.shape}, got {act.shape}")
        if not (np.issubdtype(act.dtype, np.floating) or np.issubdtype(act.dtype, np.integer)):
            raise TypeError(f"action must be numeric, got dtype {act.dtype}")
        act_t = torch.as_tensor(act.astype(np.float32, copy=False)[None], device=self.env.device)
        obs, reward, terminated, truncated, info = self.env.step(act_t)
        term, trunc = bool(terminated[0]), bool(truncated[0])
        out: dict[str, Any] = {
            "success": bool(info["success"][0]),
            "diverged": bool(info["diverged"][0]),
        }
        if "elapsed" in info:
            out["elapsed"] = int(info["elapsed"][0])
        if term or trunc:
            self._pending_obs = self._row(obs)  # the new episode, already reset underneath
            self._needs_reset = True
            obs = info["final_obs"]
            length = int(info["episode"]["length"][0])
            out["elapsed"] = length
            out["episode"] = {"r": float(info["episode"]["return"][0]), "l": length}
        return self._row(obs), float(reward[0]), term, trunc, out

    def render(self) -> np.ndarray | None:
        """A uint8 ``[H, W, 3]`` frame with ``render_mode="rgb_array"``, else None."""
        self._check_open()
        if self.render_mode is None:
            gymnasium.logger.warn("render() called with render_mode=None; returning None")
            return None
        render = getattr(self.env, "render", None)
        if render is None:
            raise NotImplementedError(f"{type(self.env).__name__} has no render(env_id, camera)")
        return render(env_id=0, camera=self.render_camera)

    def close(self) -> None:
        """Close the wrapped sims env; calling it twice is allowed."""
        if not getattr(self, "_closed", True):
            self._closed = True
            self.env.close()

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("this GymEnv is closed")


# ------------------------------------------------------------------------------ registration
def register_gymnasium_envs() -> list[str]:
    """Register ``embodied/<Task>-v0`` for every task in :data:`GYM_TASKS` (idempotent).

    Each id gets ``entry_point`` = :class:`GymEnv` and ``vector_entry_point`` =
    :class:`GymVectorEnv`, with ``kwargs={"task": <sims task name>}``. Imports no simulator.

    Returns:
        the registered ids.
    """
    ids = []
    entries = [(name, {"task": task}) for name, task in GYM_TASKS.items()]
    entries += [(name, {"suite": suite}) for name, suite in GYM_SUITES.items()]
    for name, kwargs in entries:
        env_id = gym_id(name)
        ids.append(env_id)
        if env_id in gymnasium.registry:
            continue
        gymnasium.register(
            id=env_id,
            entry_point=f"{__name__}:GymEnv",
            vector_entry_point=f"{__name__}:GymVectorEnv",
            kwargs=kwargs,
        )
    return ids


register_gymnasium_envs()
