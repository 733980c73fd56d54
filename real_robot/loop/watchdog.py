"""The watchdog: how long the loop has gone without a fresh action (one planned for the current step)."""

from __future__ import annotations

import time
from typing import Callable

from real_robot.loop.exits import StrEnum


class WatchdogState(StrEnum):
    OK = "ok"
    HOLD = "hold"  # over hold_timeout without a fresh action: counted as starved (the robot already holds)
    STOP = "stop"  # over stop_timeout: stop the robot


class Watchdog:
    """``ok`` -> ``hold`` after ``hold_timeout`` s without a fresh action -> ``stop`` after ``stop_timeout``."""

    def __init__(self, hold_timeout: float, stop_timeout: float, clock: Callable[[], float] = time.perf_counter):
        if not 0 < hold_timeout <= stop_timeout:
            raise ValueError(
                f"need 0 < hold_timeout <= stop_timeout, got {hold_timeout} and {stop_timeout}: "
                "set hold_timeout_s / stop_timeout_s accordingly"
            )
        self.hold_timeout, self.stop_timeout, self.clock = hold_timeout, stop_timeout, clock
        self.last_fresh = clock()

    def fresh(self) -> None:
        self.last_fresh = self.clock()

    def state(self) -> WatchdogState:
        idle = self.clock() - self.last_fresh
        if idle > self.stop_timeout:
            return WatchdogState.STOP
        return WatchdogState.HOLD if idle > self.hold_timeout else WatchdogState.OK

    def check(self, fresh: bool) -> WatchdogState:
        """One control period: ``fresh`` when it has an action planned for it (then ``ok``)."""
        if fresh:
            self.fresh()
            return WatchdogState.OK
        return self.state()
