"""The latency modes: when to ask the policy server for a chunk, what the request carries, and which
control step the chunk's first action is for. Pure policy, no I/O (:class:`~real_robot.loop.feed.ChunkFeed`
sends the requests); ``measured`` is the round-trip delay ``d`` in control steps.

- ``sync``: ask when the queue is empty; the robot holds until the chunk arrives, which starts then;
- ``async``: ask at ``threshold`` queued actions; the chunk is for the request's step (its actions
  for steps already past are dropped on arrival);
- ``rtc``: as async, and the request carries the queued plan (its first d actions frozen) for the
  server to inpaint the new chunk onto;
- ``aware``: a latency-aware policy: ask at d queued actions; the state carries those committed
  actions and d; the chunk starts d steps after the request.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Optional

import numpy as np
import torch

from embodied.latency import ActionQueue, augment_state, chunk_start, wants_chunk
from real_robot.spec import RTC_FROZEN_KEY, RTC_PREV_KEY, STATE_KEY

CLIENT_MODES = ("sync", "async", "rtc", "aware")


@dataclass(frozen=True)
class ChunkPlan:
    """What a request carries besides the observation.

    ``delay``: d in control steps (rtc: the frozen actions of ``prev``; aware: the chunk's start
    offset); ``prev``: rtc's queued plan ``[P, A]``, P <= H; ``committed``: aware's actions
    ``[max(D, 1), A]`` that run while the server plans (D the policy's largest delay).
    """

    delay: int = 0
    prev: Optional[np.ndarray] = None
    committed: Optional[np.ndarray] = None


class LatencyMode:
    """The shared rules; a subclass per mode changes what differs."""

    name: ClassVar[str]

    def __init__(self, threshold: int, chunk_size: int):
        if not 0 <= threshold < chunk_size:
            raise ValueError(f"threshold must be in 0..{chunk_size - 1} (below the chunk size), got {threshold}")
        self.threshold, self.chunk_size = threshold, chunk_size

    def plan_delay(self, measured: int) -> int:
        """The d this mode plans with."""
        return measured

    def wants_chunk(self, queued: int, measured: int) -> bool:
        """Whether to ask for a chunk with ``queued`` actions left (and no request in flight)."""
        return wants_chunk(self.name, queued, self.plan_delay(measured), self.threshold)

    def plan(self, queue: ActionQueue, measured: int, hold: np.ndarray) -> ChunkPlan:
        """The request's extras, from the queued plan of ``queue`` (one env) and ``hold [A]``."""
        return ChunkPlan()

    def chunk_start(self, request_step: int, plan: ChunkPlan, arrival_step: int) -> int:
        """The control step the first action of the chunk asked for at ``request_step`` is meant for."""
        return chunk_start(self.name, request_step, plan.delay)

    def request_fields(self, state: np.ndarray, plan: ChunkPlan) -> dict[str, Any]:
        """The request's state entry for robot ``state [S]`` (float32), and this mode's own entries."""
        return {STATE_KEY: state}


class SyncMode(LatencyMode):
    name = "sync"

    def chunk_start(self, request_step: int, plan: ChunkPlan, arrival_step: int) -> int:
        return arrival_step  # the robot waited for this chunk: it starts now


class AsyncMode(LatencyMode):
    name = "async"


class RtcMode(LatencyMode):
    name = "rtc"

    def plan(self, queue: ActionQueue, measured: int, hold: np.ndarray) -> ChunkPlan:
        acts, ok = queue.peek(self.chunk_size)
        prev = acts[0, : int(ok[0].sum())].numpy()
        return ChunkPlan(delay=min(measured, len(prev), self.chunk_size - 1), prev=prev)

    def request_fields(self, state: np.ndarray, plan: ChunkPlan) -> dict[str, Any]:
        return {STATE_KEY: state, RTC_PREV_KEY: plan.prev.astype(np.float32), RTC_FROZEN_KEY: int(plan.delay)}


class AwareMode(LatencyMode):
    name = "aware"

    def __init__(self, threshold: int, chunk_size: int, max_delay: int):
        super().__init__(threshold, chunk_size)
        self.max_delay = max_delay

    def plan_delay(self, measured: int) -> int:
        return min(measured, self.max_delay)  # the policy knows no longer delay

    def plan(self, queue: ActionQueue, measured: int, hold: np.ndarray) -> ChunkPlan:
        acts, ok = queue.peek(max(self.max_delay, 1))
        committed = np.where(ok[0, :, None].numpy(), acts[0].numpy(), hold[None]).astype(np.float32)
        return ChunkPlan(delay=self.plan_delay(measured), committed=committed)

    def request_fields(self, state: np.ndarray, plan: ChunkPlan) -> dict[str, Any]:
        wide = augment_state(
            torch.from_numpy(state)[None],
            torch.from_numpy(plan.committed)[None],
            torch.tensor([plan.delay]),
            self.max_delay,
        )[0].numpy()
        return {STATE_KEY: wide}


def make_mode(name: str, threshold: int, chunk_size: int, max_delay: Optional[int] = None) -> LatencyMode:
    """The mode called ``name`` (one of :data:`CLIENT_MODES`); ``aware`` needs the policy's ``max_delay``."""
    if name == "aware":
        if max_delay is None:
            raise ValueError("mode aware needs max_delay: the latency-aware policy's largest delay")
        return AwareMode(threshold, chunk_size, max_delay)
    modes = {m.name: m for m in (SyncMode, AsyncMode, RtcMode)}
    if name not in modes:
        raise ValueError(f"mode must be one of {CLIENT_MODES}, got {name!r}")
    return modes[name](threshold, chunk_size)
