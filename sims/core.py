"""The simulation contract: one object steps N environments at once, tensors in and out.

Isaac-Gym style. Every backend (``mujoco``, ``mujoco_gpu``, ``maniskill``) implements
:class:`VecEnv`; users build one with :func:`make`.

Conventions
-----------
- Batch first: observations are a dict of tensors ``[N, ...]`` on ``env.device``.
- Actions are float32 ``[N, A]`` in ``[-1, 1]``.
- ``step`` resets every env whose episode ended (automatic reset). The returned observation is
  then the first observation of the new episode; the last observation of the old one is in
  ``info["final_obs"]`` (rows valid where ``info["done"]``).
- ``terminated`` means the task reached a terminal state (success by default); ``truncated``
  means the step limit was hit or the physics diverged (``info["diverged"]``): do not treat a
  truncation as terminal when bootstrapping values.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

import torch

from sims.registry import Registry, load_attr

if TYPE_CHECKING:
    import numpy as np

Obs = dict[str, torch.Tensor]

#: what ``obs["state"]`` holds: ``proprio`` the robot's own state (the default, what a real robot
#: gives); ``privileged`` that state followed by ``obs["privileged"]`` (object poses, velocities,
#: goals): for state-only policies in simulation, which cannot be deployed on a real robot
STATE_OBS = ("proprio", "privileged")


@dataclass(frozen=True)
class Spec:
    """Shape and dtype of one per-env observation or action entry (batch dimension excluded)."""

    shape: tuple[int, ...]
    dtype: torch.dtype
    low: float | None = None
    high: float | None = None
    doc: str = ""


@dataclass(frozen=True)
class TaskSpec:
    """What a task is, independent of the backend that simulates it.

    Attributes:
        name: unique task name within its suite (``pick_cube``).
        suite: suite name, or ``""`` for a stand-alone task.
        instruction: the language instruction given to the policy.
        max_steps: episode step limit in control steps.
        privileged_keys: names of the entries of ``obs["privileged"]``, in order, with sizes.
        extras: anything backend- or suite-specific (placement regions, predicates ...).
    """

    name: str
    suite: str
    instruction: str
    max_steps: int
    privileged_keys: tuple[tuple[str, int], ...] = ()
    extras: Mapping[str, Any] = field(default_factory=dict)


class VecEnv(abc.ABC):
    """N environments stepped together. See the module docstring for conventions.

    Attributes:
        num_envs: N.
        device: where observation and reward tensors live.
        tasks: the tasks this env can run; ``obs["task_id"]`` indexes into it.
        control_hz: control rate of one ``step``.
        observation_spec: per-env spec of each observation key.
        action_spec: per-env action spec, ``(A,)`` float32 in ``[-1, 1]``.
    """

    num_envs: int
    device: torch.device
    tasks: Sequence[TaskSpec]
    control_hz: float
    observation_spec: dict[str, Spec]
    action_spec: Spec

    @abc.abstractmethod
    def reset(
        self,
        *,
        seed: int | None = None,
        task_ids: Sequence[int] | torch.Tensor | None = None,
        init_ids: Sequence[int] | torch.Tensor | None = None,
    ) -> Obs:
        """Reset every env.

        Args:
            seed: reseeds env i's random stream with ``(seed, i)``; None keeps the streams.
            task_ids: ``[N]`` task index per env (default: keep the current ones).
            init_ids: ``[N]`` fixed initial-state ids; the initial state is then a pure function
                of (task, init id), the same on every machine, independent of ``seed``.
        """

    @abc.abstractmethod
    def step(
        self, actions: torch.Tensor, *, active: torch.Tensor | None = None, render: bool = True
    ) -> tuple[Obs, torch.Tensor, torch.Tensor, torch.Tensor, dict[str, Any]]:
        """Advance the envs one control step.

        Args:
            actions: ``[N, A]`` in ``[-1, 1]``.
            active: optional bool ``[N]``; envs where it is False are not advanced (their
                observation is returned unchanged, reward 0, not done).
            render: False: render camera views only where an episode ends at this step (its final
                observation and the first one of the next episode); the other rows of ``obs["rgb"]``
                keep the frames last rendered. For callers that do not read this step's pixels
                (:func:`step_chunk` between chunk boundaries). A frame history renders every step
                regardless, and backends that render inside their physics step may ignore it.

        Returns:
            obs, reward ``[N]`` float32, terminated ``[N]`` bool, truncated ``[N]`` bool, info with
            ``success`` ``[N]`` bool, ``done`` ``[N]`` bool, ``diverged`` ``[N]`` bool,
            ``final_obs`` (Obs, rows valid where done) and ``episode`` (``return``/``length``
            ``[N]``, valid where done).
        """

    @abc.abstractmethod
    def close(self) -> None:
        """Release native resources (renderers, thread pools)."""

    def __enter__(self) -> "VecEnv":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def step_chunk(self, actions: torch.Tensor, *, render_every_step: bool = False) -> "ChunkResult":
        """Execute an action chunk ``[N, H, A]``; see :func:`step_chunk`."""
        return step_chunk(self, actions, render_every_step=render_every_step)


@dataclass
class ChunkResult:
    """Outcome of executing one action chunk ``[N, H, A]``.

    Attributes:
        obs: observation after the chunk (first observation of a new episode where one ended).
        reward: ``[N]`` sum of rewards of the executed steps.
        terminated: ``[N]`` the episode terminated inside the chunk.
        truncated: ``[N]`` the episode was truncated inside the chunk.
        step_done: ``[N, H]`` bool, True at the step where the env's episode ended.
        executed: ``[N, H]`` bool, which steps were executed (False after the env's end).
        success: ``[N]`` bool, success reached inside the chunk.
        final_obs: rows valid where ``terminated | truncated``: the last observation of the
            episode that ended.
        episode: ``return``/``length`` ``[N]`` of the episodes that ended.
    """

    obs: Obs
    reward: torch.Tensor
    terminated: torch.Tensor
    truncated: torch.Tensor
    step_done: torch.Tensor
    executed: torch.Tensor
    success: torch.Tensor
    final_obs: Obs
    episode: dict[str, torch.Tensor]

    @property
    def done(self) -> torch.Tensor:
        return self.terminated | self.truncated


def step_chunk(env: VecEnv, actions: torch.Tensor, *, render_every_step: bool = False) -> ChunkResult:
    """Execute ``actions`` ``[N, H, A]`` step by step; each env stops at its own episode end.

    An env whose episode ends at step h is reset (automatic reset) and is not advanced for the
    remaining H-1-h steps of the chunk, so the chunk never leaks into the next episode.

    Camera views are rendered only for the observations returned: the chunk's last one and the
    final observation of each episode that ends inside the chunk (the intermediate observations
    are not returned). The pixels are those that rendering every step gives; ``render_every_step``
    renders every step anyway (the cost of the per-step API, for comparisons).
    """
    if actions.ndim != 3 or actions.shape[0] != env.num_envs:
        raise ValueError(f"step_chunk expects actions [N={env.num_envs}, H, A], got {tuple(actions.shape)}")
    n, horizon = actions.shape[:2]
    dev = env.device
    reward = torch.zeros(n, dtype=torch.float32, device=dev)
    terminated = torch.zeros(n, dtype=torch.bool, device=dev)
    truncated = torch.zeros(n, dtype=torch.bool, device=dev)
    success = torch.zeros(n, dtype=torch.bool, device=dev)
    step_done = torch.zeros(n, horizon, dtype=torch.bool, device=dev)
    executed = torch.zeros(n, horizon, dtype=torch.bool, device=dev)
    final_obs: Obs | None = None
    episode: dict[str, torch.Tensor] = {}
    active = torch.ones(n, dtype=torch.bool, device=dev)
    obs: Obs = {}
    for h in range(horizon):
        obs, r, term, trunc, info = env.step(actions[:, h], active=active, render=render_every_step or h == horizon - 1)
        executed[:, h] = active
        reward += torch.where(active, r, torch.zeros_like(r))
        success |= info["success"] & active
        done = (term | trunc) & active
        terminated |= term & active
        truncated |= trunc & active
        step_done[:, h] = done
        if done.any():
            if final_obs is None:
                final_obs = {k: v.clone() for k, v in info["final_obs"].items()}
                episode = {k: v.clone() for k, v in info["episode"].items()}
            else:
                for k, v in info["final_obs"].items():
                    final_obs[k][done] = v[done]
                for k, v in info["episode"].items():
                    episode[k][done] = v[done]
        active = active & ~done
        if not active.any():
            break
    if final_obs is None:
        final_obs = {k: v.clone() for k, v in obs.items()}
        episode = {
            "return": torch.zeros(n, device=dev),
            "length": torch.zeros(n, dtype=torch.int64, device=dev),
        }
    return ChunkResult(obs, reward, terminated, truncated, step_done, executed, success, final_obs, episode)


def env_index_array(
    values: Sequence[int] | torch.Tensor | None, n: int, name: str, high: int | None = None
) -> "np.ndarray | None":
    """``values`` (a sequence, a tensor or one int for every env) as int64 ``[n]``, each in ``[0, high)``
    when ``high`` is given; None stays None. For the per-env ids of :meth:`VecEnv.reset` (``task_ids``,
    ``init_ids``)."""
    import numpy as np

    if values is None:
        return None
    arr = np.asarray(values.cpu() if isinstance(values, torch.Tensor) else values, dtype=np.int64)
    if arr.ndim == 0:
        arr = np.full(n, int(arr))
    if arr.shape != (n,):
        raise ValueError(f"{name} must have shape [{n}], got {arr.shape}")
    if high is not None and ((arr < 0).any() or (arr >= high).any()):
        raise ValueError(f"{name} must be in [0, {high}), got {arr.tolist()}")
    return arr


# --------------------------------------------------------------------------------------------
# Registry of backends. Backends are imported lazily: ``import sims`` loads no simulator.

_BACKENDS: Registry[str | Callable[..., VecEnv]] = Registry("simulation backend", sort=True)


def register_backend(name: str, factory: str | Callable[..., VecEnv]) -> None:
    """Register a backend under ``name``: a callable, or ``"module:attr"`` imported on use."""
    _BACKENDS.register(name, factory)


def backends() -> list[str]:
    """Names of the registered backends."""
    return _BACKENDS.names()


def make(
    backend: str = "mujoco",
    *,
    task: str | None = None,
    suite: str | None = None,
    num_envs: int = 1,
    seed: int = 0,
    device: str | torch.device = "cpu",
    **kwargs: Any,
) -> VecEnv:
    """Build a :class:`VecEnv`.

    Args:
        backend: ``"mujoco"`` (CPU, default), ``"mujoco_gpu"``, ``"maniskill"``.
        task: one task name (``"pick_cube"``), or None with ``suite``.
        suite: a task suite; every env runs one of its tasks.
        num_envs: N.
        seed: seed of the per-env random streams (env i uses ``(seed, i)``).
        device: where tensors are returned.
        **kwargs: backend options (``cameras``, ``image_size``, ``num_threads``, ...), and
            ``state_obs`` (one of :data:`STATE_OBS`, default ``proprio``).
    """
    factory = _BACKENDS.lookup(backend)
    if num_envs < 1:
        raise ValueError(f"num_envs must be >= 1, got {num_envs}")
    if (task is None) == (suite is None):
        raise ValueError("give exactly one of task=... or suite=...")
    state_obs = kwargs.pop("state_obs", "proprio")
    if state_obs not in STATE_OBS:
        raise ValueError(f"state_obs must be one of {STATE_OBS}, got {state_obs!r}")
    env = load_attr(factory)(task=task, suite=suite, num_envs=num_envs, seed=seed, device=device, **kwargs)
    return PrivilegedStateEnv(env) if state_obs == "privileged" else env


def quat_hemisphere(q: Any, ref: Any) -> Any:
    """Quaternions ``[N, 4]`` (numpy or torch) with the sign that puts them in ``ref``'s hemisphere
    (``q . ref >= 0``).

    ``q`` and ``-q`` are the same rotation; a policy needs one continuous representative. ``w >= 0``
    is discontinuous exactly where the gripper points down (``w`` crosses 0 there at every yaw);
    the hemisphere of the home orientation is continuous for every orientation the arm reaches
    (it flips only 180 deg away from home). Both backends give the TCP quaternion this way.
    """
    below = (q * ref).sum(-1)[..., None] < 0
    return q * (1 - 2 * below)


def obs_views(obs: Obs) -> torch.Tensor:
    """``obs["rgb"]`` ``[N, V, H, W, 3]``, or an empty ``[N, 0, 1, 1, 3]`` uint8 batch when the env renders
    no cameras (for state-only policies, whose inputs keep one layout)."""
    rgb = obs.get("rgb")
    if rgb is not None:
        return rgb
    state = obs["state"]
    return torch.zeros((state.shape[0], 0, 1, 1, 3), dtype=torch.uint8, device=state.device)


class PrivilegedStateEnv(VecEnv):
    """Wraps a :class:`VecEnv` so that ``obs["state"]`` is ``[N, S + P]``: the proprioceptive state
    followed by the privileged vector (in every observation, ``final_obs`` included). Everything
    else (``obs["privileged"]``, rewards, attributes) is the wrapped env's."""

    def __init__(self, env: VecEnv):
        if "privileged" not in env.observation_spec:
            raise ValueError(
                f"state_obs='privileged' needs an env with a 'privileged' observation; "
                f"{type(env).__name__} has {sorted(env.observation_spec)}"
            )
        self.env = env
        s, p = env.observation_spec["state"], env.observation_spec["privileged"]
        self.observation_spec = dict(env.observation_spec)
        self.observation_spec["state"] = Spec(
            (s.shape[0] + p.shape[0],), s.dtype, doc=f"{s.doc}; then privileged: {p.doc}"
        )

    def __getattr__(self, name: str) -> Any:  # num_envs, device, tasks, control_hz, cameras, ...
        if name == "env":  # not set yet (e.g. during unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.env, name)

    @staticmethod
    def _widen(obs: Obs) -> Obs:
        out = dict(obs)
        out["state"] = torch.cat([obs["state"], obs["privileged"].to(obs["state"].dtype)], dim=-1)
        return out

    def reset(self, **kwargs: Any) -> Obs:
        return self._widen(self.env.reset(**kwargs))

    def step(
        self, actions: torch.Tensor, *, active: torch.Tensor | None = None, render: bool = True
    ) -> tuple[Obs, torch.Tensor, torch.Tensor, torch.Tensor, dict[str, Any]]:
        obs, reward, terminated, truncated, info = self.env.step(actions, active=active, render=render)
        info = dict(info)
        info["final_obs"] = self._widen(info["final_obs"])
        return self._widen(obs), reward, terminated, truncated, info

    def close(self) -> None:
        self.env.close()


register_backend("mujoco", "sims.mujoco.factory:make_mujoco_env")
register_backend("mujoco_gpu", "sims.mujoco.factory:make_mujoco_gpu_env")
register_backend("maniskill", "sims.maniskill.env:make_maniskill_env")
