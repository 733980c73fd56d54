"""A fixed-rate loop clock: ``wait()`` sleeps until the next period; an overrun restarts the schedule
(no burst of catch-up iterations)."""

from __future__ import annotations

import time


class FixedRate:
    def __init__(self, hz: float):
        self.period = 1.0 / hz
        self.next_t = time.perf_counter()

    def wait(self) -> None:
        self.next_t += self.period
        delay = self.next_t - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        else:
            self.next_t = time.perf_counter()
