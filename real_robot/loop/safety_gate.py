"""The loop's only way to the motors: the robot's state is checked before anything is made of it,
and every command passes the :class:`~real_robot.safety.SafetyFilter` before it is sent."""

from __future__ import annotations

import numpy as np

from real_robot.robots.base import Robot
from real_robot.safety import SafetyFilter


class SafetyGate:
    """One episode's gate between the loop and ``robot``; both methods raise
    :class:`~real_robot.safety.UnsafeState` on an implausible state, and then nothing is sent."""

    def __init__(self, safety: SafetyFilter, robot: Robot):
        self.safety, self.robot = safety, robot
        self._counts_before = dict(safety.counts)

    def hold_action(self, state: np.ndarray) -> np.ndarray:
        """The "hold still" action ``[A]`` (float64) for robot ``state [S]``."""
        return self.safety.hold(state)

    def send(self, wanted: np.ndarray, state: np.ndarray) -> np.ndarray:
        """Filter ``wanted [A]`` for ``state [S]``, send it, and return what was sent ``[A]`` (float64)."""
        sent = self.safety.filter(wanted, state)
        self.robot.send_action(sent)
        return sent

    def counts(self) -> dict[str, int]:
        """The filter's interventions during this episode, by name (only those that happened)."""
        before = self._counts_before
        return {k: v - before.get(k, 0) for k, v in self.safety.counts.items() if v - before.get(k, 0)}
