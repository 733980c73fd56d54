"""The safety gate (real_robot/loop/safety_gate.py) in front of a SimRobot: states checked, commands
filtered before they are sent, nothing sent on an implausible state, counts per episode."""

from __future__ import annotations

import numpy as np
import pytest

from real_robot.loop import SafetyGate
from real_robot.robots.sim_robot import SimRobot
from real_robot.safety import SafetyFilter, UnsafeState


@pytest.fixture
def robot():
    robot = SimRobot(suite="goal", task=8, image_size=32, realtime=False)
    robot.connect()
    yield robot
    robot.disconnect()


def test_a_command_is_filtered_then_sent(robot):
    gate = SafetyGate(SafetyFilter(robot.spec), robot)
    state = robot.observe().state
    hold = gate.hold_action(state)
    assert hold.shape == (7,) and not hold[:6].any()
    sent = gate.send(np.array([5.0, 0, 0, 0, 0, 0, 1.0]), state)
    assert robot.ticks == 1  # one command reached the robot
    assert sent[0] <= 1.0 and np.linalg.norm(sent[:3] * robot.spec.pos_scale) <= robot.spec.max_step
    assert gate.counts().get("range") == 1


def test_an_implausible_state_sends_nothing(robot):
    gate = SafetyGate(SafetyFilter(robot.spec), robot)
    state = robot.observe().state.copy()
    state[11] = np.nan
    with pytest.raises(UnsafeState, match="non_finite_state"):
        gate.hold_action(state)
    with pytest.raises(UnsafeState, match="non_finite_state"):
        gate.send(np.zeros(7), state)
    assert robot.ticks == 0 and gate.counts() == {"unsafe_state": 2}


def test_counts_are_this_episodes_only(robot):
    safety = SafetyFilter(robot.spec)
    state = robot.observe().state
    SafetyGate(safety, robot).send(np.full(7, np.nan), state)
    gate = SafetyGate(safety, robot)  # the next episode
    assert gate.counts() == {} and safety.counts["non_finite"] == 1
    gate.send(np.full(7, np.inf), robot.observe().state)
    assert gate.counts() == {"non_finite": 1}
