"""The watchdog (real_robot/loop/watchdog.py) on a fake clock."""

from __future__ import annotations

import pytest

from real_robot.loop import Watchdog, WatchdogState


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_it_holds_then_stops_without_fresh_actions():
    clock = FakeClock()
    w = Watchdog(0.25, 1.0, clock=clock)
    for t, state in [
        (0.25, WatchdogState.OK),
        (0.26, WatchdogState.HOLD),
        (1.0, WatchdogState.HOLD),
        (1.01, WatchdogState.STOP),
    ]:
        clock.now = t
        assert w.check(fresh=False) is state, t  # the timeouts are "over", not "at"


def test_a_fresh_action_resets_it():
    clock = FakeClock()
    w = Watchdog(0.25, 1.0, clock=clock)
    clock.now = 5.0
    assert w.check(fresh=False) is WatchdogState.STOP
    assert w.check(fresh=True) is WatchdogState.OK
    clock.now = 5.2
    assert w.check(fresh=False) is WatchdogState.OK
    w.fresh()  # e.g. a reconnect: the new connection gets the full window
    clock.now = 6.1
    assert w.state() is WatchdogState.HOLD and w.state() == "hold"


def test_bad_timeouts_are_refused():
    with pytest.raises(ValueError, match="0 < hold_timeout <= stop_timeout, got 2 and 1"):
        Watchdog(2, 1)
    with pytest.raises(ValueError, match="hold_timeout_s"):
        Watchdog(0, 1)
