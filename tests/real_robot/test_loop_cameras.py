"""Camera-stall detection (real_robot/loop/cameras.py): on a fake clock, and on SimRobot's stalling camera."""

from __future__ import annotations

import numpy as np
import pytest

from real_robot.loop import CameraMonitor
from real_robot.robots.sim_robot import SimRobot


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_frames_that_keep_changing_never_stall():
    clock = FakeClock()
    mon = CameraMonitor(0.5, clock=clock)
    for i in range(20):
        clock.now = i * 1.0
        assert mon.stalled({"agentview": i, "wrist": i}) is None


def test_an_unchanged_frame_stalls_after_the_timeout_and_a_new_one_clears_it():
    clock = FakeClock()
    mon = CameraMonitor(0.5, clock=clock)
    assert mon.stalled({"agentview": 1, "wrist": 7}) is None
    clock.now = 0.5
    assert mon.stalled({"agentview": 2, "wrist": 7}) is None  # exactly the timeout: not yet
    clock.now = 0.51
    assert mon.stalled({"agentview": 3, "wrist": 7}) == "wrist"
    assert mon.stalled({"agentview": 4, "wrist": 8}) is None  # a new frame: it runs again
    clock.now = 1.0
    assert mon.stalled({"agentview": 5, "wrist": 8}) is None


def test_the_timeout_must_be_positive():
    with pytest.raises(ValueError, match="stall_timeout_s must be > 0"):
        CameraMonitor(0.0)


def test_sim_robot_stalling_camera_is_found():
    robot = SimRobot(suite="goal", task=8, image_size=32, realtime=False, stall_camera="wrist", stall_camera_after=3)
    robot.connect()
    clock = FakeClock()
    mon = CameraMonitor(0.25, clock=clock)
    found, wrist_ids = [], []
    try:
        for step in range(12):
            clock.now = step * 0.1
            frame_ids = robot.observe().frame_ids
            wrist_ids.append(frame_ids["wrist"])
            found.append(mon.stalled(frame_ids))
            robot.send_action(np.zeros(7))
    finally:
        robot.disconnect()
    last_change = wrist_ids.index(wrist_ids[-1])  # the wrist camera's last new frame
    assert 0 < last_change <= 3
    expected = last_change + 3  # the first period over 0.25 s later (0.1 s periods)
    assert found == [None] * expected + ["wrist"] * (12 - expected)
