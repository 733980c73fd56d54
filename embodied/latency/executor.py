"""Execution modes under inference delay, shared by the simulation harness and the robot client.

One call of :meth:`ChunkExecutor.next_action` per control step returns the action of that step
for N envs (envs of one wave advance in lockstep). Inference of a chunk takes ``d`` control steps:
``delay`` fixed (``delay_source="steps"``: deterministic, for tests and training) or measured
(``"wallclock"``: ``ceil(seconds * control_hz)`` of the real inference call).

- ``sync``: when the queue is empty, ask for a chunk and wait ``d`` steps holding still; the chunk
  then executes in full (or its first ``action_steps``: a receding horizon, LeRobot's
  ``n_action_steps``). Time is lost, the world moves on meanwhile.
- ``async``: ask when ``threshold`` or fewer actions are queued; the chunk is planned from the
  observation at the request step t, so when it arrives at t + d its first d actions are in the
  past and are dropped, the rest merge into the queue. The robot never waits when
  ``threshold >= d``, but acts on an observation d steps old.
- ``rtc``: as ``async``, and the new chunk is inpainted onto the queued plan (flow policies):
  its first d actions are exactly the ones executing during inference, the rest is guided toward
  the queued plan (:mod:`policies.flow.rtc`).
- ``aware``: the latency-aware policy (ARLI): ask when d actions are queued, give the policy the
  observation with those committed actions (:mod:`embodied.latency.augment`); its chunk starts at
  t + d and executes in full.

Where no action is queued for a step the robot holds: zero end-effector motion, the last gripper
command (the ``ee_delta`` action mode).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Optional

import torch

from embodied.latency.augment import augment_state
from embodied.latency.queue import MERGE_RULES, ActionQueue
from embodied.latency.stats import LatencyStats, delay_steps

EXECUTION_MODES = ("sync", "async", "rtc", "aware")
DELAY_SOURCES = ("steps", "wallclock")
GRIPPER_OPEN = -1.0


@dataclass
class LatencyConfig:
    """How chunks are executed under inference delay.

    Attributes:
        mode: sync | async | rtc | aware (see the module docstring).
        delay: d, inference delay in control steps (``delay_source=steps``).
        delay_source: ``steps`` (simulated, deterministic) or ``wallclock`` (measured per call).
        threshold: async/rtc ask for the next chunk when this many actions or fewer are queued
            (default ``max(delay, chunk_size // 2)``).
        merge: async: how a new chunk meets the queued actions (replace | keep | blend).
        rtc_beta: bound on the RTC guidance weight.
        max_delay: aware: the committed-action slots of the policy's augmented state (default
            ``delay``); must match the policy it drives.
        action_steps: sync: execute only the first k actions of each chunk, then ask again
            (replanning more often from fresher observations; default: the whole chunk).
        action_offset: sync: skip the first j actions of each chunk (a diagnostic: what naive
            async and RTC do to a chunk under delay, without the delay).
    """

    mode: str = "sync"
    delay: int = 0
    delay_source: str = "steps"
    threshold: Optional[int] = None
    merge: str = "replace"
    rtc_beta: float = 5.0
    max_delay: Optional[int] = None
    action_steps: Optional[int] = None
    action_offset: int = 0

    def check(self, chunk_size: int) -> None:
        if self.mode not in EXECUTION_MODES:
            raise ValueError(f"execution mode must be one of {EXECUTION_MODES}, got {self.mode!r}")
        if self.delay_source not in DELAY_SOURCES:
            raise ValueError(f"delay_source must be one of {DELAY_SOURCES}, got {self.delay_source!r}")
        if self.merge not in MERGE_RULES:
            raise ValueError(f"merge must be one of {MERGE_RULES}, got {self.merge!r}")
        if self.delay < 0:
            raise ValueError(f"delay must be >= 0 control steps, got {self.delay}")
        if self.mode in ("async", "rtc", "aware") and self.delay >= chunk_size:
            raise ValueError(
                f"{self.mode} execution needs delay < chunk size: a chunk of {chunk_size} actions is "
                f"all in the past after a delay of {self.delay} steps; use a policy with longer chunks"
            )
        if self.mode == "aware" and self.max_delay is not None and self.delay > self.max_delay:
            raise ValueError(f"delay {self.delay} exceeds the policy's max_delay {self.max_delay}")
        if self.action_steps is not None:
            if self.mode != "sync":
                raise ValueError(
                    f"action_steps applies to sync execution; {self.mode} decides when to replan from threshold / delay"
                )
            if not 1 <= self.action_steps <= chunk_size:
                raise ValueError(f"action_steps must be in 1..{chunk_size} (the chunk size), got {self.action_steps}")
        if self.action_offset:
            if self.mode != "sync":
                raise ValueError(f"action_offset applies to sync execution, not {self.mode}")
            steps = self.action_steps or chunk_size - self.action_offset
            if self.action_offset < 0 or self.action_offset + steps > chunk_size:
                raise ValueError(
                    f"action_offset {self.action_offset} + action_steps {steps} must fit in the chunk "
                    f"of {chunk_size} actions"
                )
        if self.threshold is not None and not 0 <= self.threshold < chunk_size:
            raise ValueError(f"threshold must be in 0..{chunk_size - 1}, got {self.threshold}")


def wants_chunk(mode: str, queued: int, delay: int, threshold: int) -> bool:
    """Whether to ask for a chunk with ``queued`` actions left (no request in flight)."""
    if mode == "sync":
        return queued == 0
    if mode == "aware":
        return queued <= delay
    return queued <= threshold


def chunk_start(mode: str, request_step: int, delay: int) -> int:
    """The control step a chunk's first action is meant for: the observation's step (async, rtc:
    its first ``delay`` actions are past on arrival), or the arrival (sync waits, aware plans for it)."""
    return request_step + delay if mode in ("sync", "aware") else request_step


def hold_action(last: torch.Tensor) -> torch.Tensor:
    """Hold still ``[N, A]``: zero end-effector motion, the gripper command of ``last``."""
    out = torch.zeros_like(last)
    out[:, -1] = last[:, -1]
    return out


class ChunkExecutor:
    """Turns chunk requests into one action per control step for N envs in lockstep.

    The agent is asked through ``agent.act(obs, env) -> [N, H, A]`` (``aware``: the observation's
    state is augmented) or ``agent.act_rtc(obs, env, prev, prev_valid, frozen)`` (``rtc``).
    """

    def __init__(self, cfg: LatencyConfig, num_envs: int, chunk_size: int, action_dim: int, control_hz: float):
        cfg.check(chunk_size)
        self.cfg, self.n, self.h, self.a, self.hz = cfg, num_envs, chunk_size, action_dim, control_hz
        self.threshold = cfg.threshold if cfg.threshold is not None else max(cfg.delay, chunk_size // 2)
        self.max_delay = cfg.max_delay if cfg.max_delay is not None else cfg.delay
        self.stats = LatencyStats()
        self.reset()

    def reset(self) -> None:
        """A new wave: empty queue, gripper open, nothing pending."""
        self.queue = ActionQueue(self.n, self.a, merge=self.cfg.merge)
        self.last = torch.zeros(self.n, self.a)
        self.last[:, -1] = GRIPPER_OPEN
        self.pending: tuple[int, int, torch.Tensor] | None = None  # (arrival step, start step, chunk)
        self.requests = 0
        self.held_steps = torch.zeros(self.n, dtype=torch.long)

    @property
    def now(self) -> int:
        return self.queue.now

    def committed(self, count: int) -> torch.Tensor:
        """The actions for steps ``now .. now + count - 1`` ``[N, count, A]`` (hold where none is queued)."""
        acts, ok = self.queue.peek(count)
        return torch.where(ok[..., None], acts, hold_action(self.last)[:, None, :].expand_as(acts))

    def _request(self, obs: dict[str, Any], env: Any, agent: Any) -> tuple[torch.Tensor, float]:
        mode, d = self.cfg.mode, self.cfg.delay
        start = time.perf_counter()
        if mode == "rtc":
            prev, valid = self.queue.peek(self.h)
            chunk = agent.act_rtc(obs, env, prev, valid, d)
        elif mode == "aware":
            aug = dict(obs)
            aug["state"] = augment_state(
                obs["state"], self.committed(max(self.max_delay, 1)), torch.full((self.n,), d), self.max_delay
            )
            chunk = agent.act(aug, env)
        else:
            chunk = agent.act(obs, env)
        seconds = time.perf_counter() - start
        self.stats.record("inference", seconds)
        self.requests += 1
        if tuple(chunk.shape) != (self.n, self.h, self.a):
            raise ValueError(
                f"the agent returned a chunk of shape {tuple(chunk.shape)}, expected [{self.n}, {self.h}, {self.a}]"
            )
        return chunk.detach().float().cpu(), seconds

    def _arrive(self) -> None:
        """Queue the chunk in flight once its arrival step has come."""
        if self.pending is not None and self.pending[0] <= self.now:
            self.queue.push(self.pending[2], self.pending[1])
            self.pending = None

    def reads_observation(self) -> bool:
        """Whether the next :meth:`next_action` call reads its observation (asks for a chunk): the
        steps whose observation must be rendered. A chunk in flight whose arrival step has come is
        queued first (as that call would), so the answer is exact."""
        self._arrive()
        return self.pending is None and wants_chunk(
            self.cfg.mode, int(self.queue.remaining().max()), self.cfg.delay, self.threshold
        )

    def next_action(self, obs: dict[str, Any], env: Any, agent: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """The action ``[N, A]`` for the current step and whether it came from a chunk ``[N]``
        (False: the robot held still); then the step advances."""
        t = self.now
        if self.reads_observation():
            chunk, seconds = self._request(obs, env, agent)
            d = self.cfg.delay if self.cfg.delay_source == "steps" else delay_steps(seconds, self.hz)
            self.stats.record("delay_steps", float(d))
            start = chunk_start(self.cfg.mode, t, d)
            if self.cfg.action_steps is not None or self.cfg.action_offset:
                first = self.cfg.action_offset
                chunk = chunk[:, first : first + (self.cfg.action_steps or self.h - first)]
            if d == 0:
                self.queue.push(chunk, start)
            else:
                self.pending = (t + d, start, chunk)
        act, ok, _ = self.queue.pop()
        act = torch.where(ok[:, None], act, hold_action(self.last))
        self.held_steps += (~ok).long()
        self.last = act
        return act, ok
