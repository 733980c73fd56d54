"""The action queue of one episode, fed with chunks from the policy server.

Requests run in a background thread (``submit``) so the control loop keeps its rate while the
server thinks; :class:`~real_robot.loop.modes.LatencyMode` says when to ask and where a chunk starts.
"""

from __future__ import annotations

import time
from concurrent.futures import Future
from typing import Any, Callable, Optional

import cv2
import numpy as np
import torch

from embodied.latency import ActionQueue, LatencyStats
from real_robot.loop.modes import ChunkPlan, LatencyMode
from real_robot.policy_client import PolicyClient, ServerError
from real_robot.robots.base import Observation
from real_robot.spec import IMAGE_PREFIX, PROMPT_KEY, PolicySpec

#: what a failed request raises: the connection closed, an error reply, no reply in time
REQUEST_ERRORS = (ConnectionError, ServerError, TimeoutError)


class ChunkFeed:
    """Queues the chunks ``[H, A]`` that arrive and hands out the action ``[A]`` of each control step.

    ``stats`` gets each ``round_trip`` (seconds) and each ``failures``; ``measured``, the p95 round
    trip in control steps, starts at 1 and is updated as requests complete.
    """

    def __init__(
        self,
        mode: LatencyMode,
        client: PolicyClient,
        spec: PolicySpec,
        instruction: str,
        submit: Callable[..., Future],
        stats: LatencyStats,
        control_hz: float,
        request_timeout_s: float,
    ):
        self.mode, self.client, self.spec, self.instruction = mode, client, spec, instruction
        self.submit, self.stats, self.control_hz = submit, stats, control_hz
        self.request_timeout_s = request_timeout_s
        self.queue = ActionQueue(1, spec.action_dim, merge="replace")
        self.measured = 1
        self._inflight: Optional[tuple[Future, int, ChunkPlan]] = None  # (reply, request step, plan)

    @property
    def requesting(self) -> bool:
        return self._inflight is not None

    def collect(self, step: int, accept: bool = True) -> Optional[Exception]:
        """Queue the chunk of a finished request (unless not ``accept``: one that raced a lost
        connection). Returns the error of a failed request, after clearing the queue, else None."""
        if self._inflight is None or not self._inflight[0].done():
            return None
        reply, request_step, plan = self._inflight
        self._inflight = None
        try:
            chunk, seconds = reply.result()
        except REQUEST_ERRORS as err:
            self.stats.record("failures", 1.0)
            self.clear()  # hold from this period on: never act on a plan nobody refreshes
            return err
        self.stats.record("round_trip", seconds)
        self.measured = self.stats.delay(self.control_hz, "round_trip")
        if accept:
            start = self.mode.chunk_start(request_step, plan, step)
            self.queue.push(torch.from_numpy(np.array(chunk, np.float32))[None], start)
        return None

    def request_if_due(self, step: int, obs: Observation, hold: np.ndarray) -> bool:
        """Ask for a chunk from ``obs`` (taken at ``step``) if the mode wants one and none is in flight;
        ``hold [A]`` stands in for missing queued actions. Whether a request was sent."""
        if self._inflight is not None or not self.mode.wants_chunk(self.queued(), self.measured):
            return False
        plan = self.mode.plan(self.queue, self.measured, hold)
        self._inflight = (self.submit(self._request, obs, plan), step, plan)
        return True

    def pop(self) -> Optional[np.ndarray]:
        """The action ``[A]`` (float64) planned for this control step, or None (hold); the queue advances."""
        action, ok, _ = self.queue.pop()
        return action[0].numpy().astype(np.float64) if bool(ok[0]) else None

    def queued(self) -> int:
        return int(self.queue.remaining()[0])

    def clear(self) -> None:
        self.queue.clear()

    def message(self, obs: Observation, plan: ChunkPlan) -> dict[str, Any]:
        """The request for ``obs``: state, prompt, each camera's image resized to the policy's ``[s, s, 3]``."""
        size = self.spec.image_size
        msg: dict[str, Any] = {
            **self.mode.request_fields(obs.state.astype(np.float32), plan),
            PROMPT_KEY: self.instruction,
        }
        for cam in self.spec.cameras:
            img = obs.images[cam]
            if img.shape[:2] != (size, size):
                img = cv2.resize(img, (size, size), interpolation=cv2.INTER_AREA)
            msg[IMAGE_PREFIX + cam] = np.ascontiguousarray(img)
        return msg

    def _request(self, obs: Observation, plan: ChunkPlan) -> tuple[np.ndarray, float]:
        """Runs in the request thread: the chunk ``[H, A]`` and the round trip in seconds."""
        msg = self.message(obs, plan)
        start = time.perf_counter()
        chunk, _ = self.client.infer(msg, timeout=self.request_timeout_s)
        return chunk, time.perf_counter() - start
