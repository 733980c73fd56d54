"""Episode bookkeeping of a batched env: what :meth:`sims.VecEnv.step` does around the simulator.

Every backend steps its simulator its own way; what an episode is does not depend on it. An
:class:`EpisodeBook` keeps each env's steps and return, ends episodes (``terminated`` at success,
``truncated`` at the task's step limit or on divergence), builds ``info`` and resets the envs whose
episode ended (automatic reset)::

    book = EpisodeBook(num_envs, limits=[t.max_steps for t in tasks])
    ...                                            # in step: advance the simulator
    out = book.record(stepped, task_ids, success=success, diverged=diverged)
    obs = observe()                                # the final observation of the envs that ended
    return book.finish(out, obs, restart, device)  # restart(ids) resets those envs, returns the obs

``record`` and ``info`` are pure numpy and torch (no simulator), unit-tested on their own in
tests/sims/test_episodes.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch

from sims.core import Obs

#: ``info["elapsed"]`` of an env whose episode ended at a step: ``next``, 0 (the steps of the new
#: episode its observation starts); ``ended``, the ended episode's length (the LIBERO env's)
ELAPSED_OF_ENDED = ("next", "ended")


@dataclass(frozen=True)
class StepOutcome:
    """What one step did to each env's episode, every array ``[N]`` (rows of envs not stepped:
    False, reward 0).

    Attributes:
        stepped: bool, the envs the step advanced.
        success: bool, the task's goal holds after the step (never where the physics diverged).
        diverged: bool, the physics diverged at the step.
        reward: float64.
        terminated: bool, the episode reached a terminal state.
        truncated: bool, the episode hit its step limit or diverged without terminating.
    """

    stepped: np.ndarray
    success: np.ndarray
    diverged: np.ndarray
    reward: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray

    @property
    def done(self) -> np.ndarray:
        """bool ``[N]``: the episode ended at this step."""
        return self.terminated | self.truncated


class EpisodeBook:
    """Each env's episode: steps taken, return, step limit; how a step ends it.

    Args:
        num_envs: N.
        limits: the step limit of each task ``[T]`` (an env's limit is its task's).

    Attributes:
        elapsed: int64 ``[N]``, steps of each env's current episode (updated in place: callers may
            hold it).
        returns: float64 ``[N]``, sum of each env's rewards in its current episode.
        limits: int64 ``[T]``.
        num_diverged: steps that diverged, over all envs, since the book was made.
    """

    def __init__(self, num_envs: int, limits: Any) -> None:
        self.num_envs = int(num_envs)
        self.limits = np.asarray(limits, dtype=np.int64).reshape(-1)
        self.elapsed = np.zeros(self.num_envs, np.int64)
        self.returns = np.zeros(self.num_envs, np.float64)
        self.num_diverged = 0

    def mask(self, stepped: Any) -> np.ndarray:
        """``stepped`` (None: every env; env ids; or a bool mask ``[N]``) as a bool mask ``[N]``."""
        if stepped is None:
            return np.ones(self.num_envs, bool)
        arr = np.asarray(stepped)
        if arr.dtype == bool:
            if arr.shape != (self.num_envs,):
                raise ValueError(f"a mask of stepped envs must have shape [{self.num_envs}], got {list(arr.shape)}")
            return arr.copy()
        out = np.zeros(self.num_envs, bool)
        out[arr.astype(np.int64).reshape(-1)] = True
        return out

    def record(
        self,
        stepped: Any,
        task_ids: np.ndarray,
        *,
        success: np.ndarray,
        diverged: np.ndarray,
        reward: np.ndarray | None = None,
        terminal: Any = True,
    ) -> StepOutcome:
        """Count a step of the envs ``stepped`` and say how it ends their episodes.

        Args:
            stepped: the envs the step advanced (env ids, a bool mask ``[N]``, or None for all).
            task_ids: int ``[N]``, each env's task (its step limit is ``limits[task_ids]``).
            success: bool ``[N]``, the goal holds after the step (ignored where diverged).
            diverged: bool ``[N]``, the physics diverged.
            reward: float ``[N]``, or None for the sparse reward (1 at success).
            terminal: bool ``[N]`` or one for all: whether success ends the episode (``terminated``).

        Only the rows of ``stepped`` are read; the others come back False, reward 0, their counts
        unchanged. A diverged env is truncated (not successful); an env that succeeds at its step
        limit is terminated, not truncated.
        """
        on = self.mask(stepped)
        diverged = np.asarray(diverged, bool) & on
        success = np.asarray(success, bool) & ~diverged & on
        if reward is None:
            reward = success.astype(np.float64)
        reward = np.where(on, np.asarray(reward, np.float64), 0.0)
        self.num_diverged += int(diverged.sum())
        self.elapsed[on] += 1
        self.returns[on] += reward[on]
        terminated = success & np.broadcast_to(np.asarray(terminal, bool), success.shape)
        at_limit = self.elapsed >= self.limits[np.asarray(task_ids, np.int64)]
        truncated = on & ~terminated & (at_limit | diverged)
        return StepOutcome(on, success, diverged, reward, terminated, truncated)

    def episode(self, device: torch.device | str = "cpu") -> dict[str, torch.Tensor]:
        """``{"return": float32 [N], "length": int64 [N]}`` of the current episodes (new tensors)."""
        return {
            "return": torch.as_tensor(self.returns.astype(np.float32), device=device),
            "length": torch.as_tensor(self.elapsed.copy(), device=device),
        }

    def info(self, out: StepOutcome, final_obs: Obs, device: torch.device | str = "cpu") -> dict[str, Any]:
        """The contract's ``info`` of a step, read before the envs that ended are reset: ``success``,
        ``done``, ``diverged`` ``[N]`` bool, ``final_obs``, ``episode`` (``return``/``length``) and
        ``elapsed`` ``[N]`` int64 (the steps counted so far)."""
        to_t = lambda a, dt: torch.as_tensor(a, dtype=dt, device=device)  # noqa: E731
        return {
            "success": to_t(out.success, torch.bool),
            "done": to_t(out.done, torch.bool),
            "diverged": to_t(out.diverged, torch.bool),
            "final_obs": final_obs,
            "episode": self.episode(device),
            "elapsed": to_t(self.elapsed.copy(), torch.int64),
        }

    def reset(self, rows: Any = None) -> None:
        """Start a new episode in envs ``rows`` (env ids or a bool mask; None: every env)."""
        on = self.mask(rows)
        self.elapsed[on] = 0
        self.returns[on] = 0.0

    def set_elapsed(self, steps: Any, task_ids: np.ndarray) -> None:
        """Set each env's step count ``[N]``, each below its task's step limit (random episode starts)."""
        arr = np.asarray(steps.cpu() if isinstance(steps, torch.Tensor) else steps, np.int64)
        limits = self.limits[np.asarray(task_ids, np.int64)]
        if arr.shape != (self.num_envs,) or (arr < 0).any() or (arr >= limits).any():
            raise ValueError(f"steps must be [{self.num_envs}] values in [0, the task's max_steps)")
        self.elapsed[:] = arr

    def finish(
        self,
        out: StepOutcome,
        obs: Obs,
        restart: Callable[[np.ndarray], Obs],
        device: torch.device | str = "cpu",
        *,
        elapsed_of_ended: str = "next",
    ) -> tuple[Obs, torch.Tensor, torch.Tensor, torch.Tensor, dict[str, Any]]:
        """The end of :meth:`sims.VecEnv.step`: ``info`` with ``obs`` as the final observation, then the
        automatic reset of the envs whose episode ended.

        Args:
            out: the step's :meth:`record`.
            obs: the observation after the step (the final one of the envs that ended; not modified).
            restart: resets the given env ids (the simulator, and this book's rows through
                :meth:`reset`) and returns the observation of every env after it.
            elapsed_of_ended: one of :data:`ELAPSED_OF_ENDED`.

        Returns:
            The contract's ``obs, reward, terminated, truncated, info``.
        """
        if elapsed_of_ended not in ELAPSED_OF_ENDED:
            raise ValueError(f"elapsed_of_ended must be one of {ELAPSED_OF_ENDED}, got {elapsed_of_ended!r}")
        info = self.info(out, obs, device)
        done = np.flatnonzero(out.done)
        if len(done):
            obs = restart(done)
        if elapsed_of_ended == "next":
            info["elapsed"] = torch.as_tensor(self.elapsed.copy(), dtype=torch.int64, device=device)
        to_t = lambda a, dt: torch.as_tensor(a, dtype=dt, device=device)  # noqa: E731
        return (
            obs,
            to_t(out.reward, torch.float32),
            to_t(out.terminated, torch.bool),
            to_t(out.truncated, torch.bool),
            info,
        )


__all__ = ["ELAPSED_OF_ENDED", "EpisodeBook", "StepOutcome"]
