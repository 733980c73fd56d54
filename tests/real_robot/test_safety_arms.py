"""The safety filter (real_robot/safety.py) on arms other than the Panda: a 6-joint UR arm (tool pose
and joints in its state), a 5-joint + gripper LeRobot-style arm (joints only, no tool pose) and a
bimanual one (two grippers). The same exact guarantees as for the Panda, from the spec alone; and
specs serialized before the layout fields existed load as the Panda's."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from real_robot.robots.base import RobotSpec
from real_robot.safety import SafetyFilter, UnsafeState

TAU = 2 * math.pi
UR_EE = RobotSpec(
    name="ur5e",
    state_dim=14,
    joint_low=[-TAU] * 6,
    joint_high=[TAU] * 6,
    joint_vel_max=[math.pi / 2] * 6,
    workspace_low=[-0.6, -0.6, 0.05],
    workspace_high=[0.6, 0.6, 0.6],
)
UR_JP = RobotSpec(**{**UR_EE.to_dict(), "action_mode": "joint_pos", "action_dim": 7})
SO_ARM = RobotSpec(  # SO-101-like: 5 joints (rad) then the gripper opening, no tool pose
    name="so101_follower",
    action_mode="joint_pos",
    action_dim=6,
    state_dim=6,
    joint_index=0,
    tcp_index=None,
    control_hz=30.0,
    joint_low=[-1.5, -1.7, -1.6, -1.7, -3.1],
    joint_high=[1.5, 1.7, 1.6, 1.7, 3.1],
    joint_vel_max=[1.5] * 5,
)
BIMANUAL = RobotSpec(  # two 6-joint arms, then two grippers, in state and action alike
    name="bi_so_follower",
    action_mode="joint_pos",
    action_dim=14,
    state_dim=14,
    joint_index=0,
    tcp_index=None,
    joint_low=[-1.5] * 12,
    joint_high=[1.5] * 12,
    joint_vel_max=[1.0] * 12,
)
any_part = st.one_of(st.floats(-1.5, 1.5), st.floats())


def plausible_states(spec: RobotSpec):
    """States ``[S]`` with every joint inside its limits widened by one speed step (joint_pos) or the
    margin (ee_delta), the tool inside its box widened by the margin, the rest in [-1, 1]."""
    f = SafetyFilter(spec)
    lo, hi = -np.ones(spec.state_dim), np.ones(spec.state_dim)
    q_margin = f.dq_max if spec.action_mode == "joint_pos" else spec.state_margin_rad
    lo[spec.joint_slice], hi[spec.joint_slice] = f.q_lo - q_margin, f.q_hi + q_margin
    if spec.tcp_slice is not None:
        lo[spec.tcp_slice] = f.ws_lo - spec.state_margin_m
        hi[spec.tcp_slice] = f.ws_hi + spec.state_margin_m
    return hnp.arrays(np.float64, spec.state_dim, elements=st.floats(0, 1)).map(lambda u: lo + u * (hi - lo))


def _sent(spec: RobotSpec, action: np.ndarray, state: np.ndarray) -> list[np.ndarray]:
    f = SafetyFilter(spec)
    try:
        return [f.filter(action, state), f.hold(state)]
    except UnsafeState as err:  # only rounding at the very edge of the joint band may leave no target
        assert err.reason == "joint_out_of_range"
        return []


@pytest.mark.parametrize("spec", [UR_JP, SO_ARM, BIMANUAL], ids=["ur5e", "so101", "bimanual"])
@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_joint_mode_keeps_any_arms_joint_limits_and_speeds(spec, data):
    action = data.draw(hnp.arrays(np.float64, spec.action_dim, elements=any_part))
    state = data.draw(plausible_states(spec))
    lo, hi = np.array(spec.joint_low), np.array(spec.joint_high)
    dq = np.array(spec.joint_vel_max) / spec.control_hz
    q = state[spec.joint_slice]
    n = spec.num_joints
    for sent in _sent(spec, action, state):
        assert sent.shape == (spec.action_dim,) and np.isfinite(sent).all() and (np.abs(sent) <= 1).all()
        target = lo + (sent[:n] + 1) * 0.5 * (hi - lo)  # the robot's decoding, float64
        assert ((target >= lo) & (target <= hi)).all() and (np.abs(target - q) <= dq).all()  # exact
        g = sent[n:]
        assert g.shape == (spec.action_dim - n,) and ((g >= -1) & (g <= 1)).all()


@settings(max_examples=150, deadline=None)
@given(action=hnp.arrays(np.float64, 7, elements=any_part), state=plausible_states(UR_EE))
def test_ee_mode_keeps_the_ur_tool_in_its_box(action, state):
    spec = UR_EE
    lo, hi, pos = np.array(spec.workspace_low), np.array(spec.workspace_high), state[:3]
    for sent in _sent(spec, action, state):
        move = sent[:3] * spec.pos_scale
        assert np.linalg.norm(move) <= spec.max_step and np.linalg.norm(sent[3:6] * spec.rot_scale) <= spec.max_rot_step
        target = pos + move
        assert (target >= np.minimum(lo, pos)).all() and (target <= np.maximum(hi, pos)).all()


def test_the_filter_reads_joints_and_tool_where_the_spec_says():
    f = SafetyFilter(UR_EE)
    home = np.r_[0.1, -0.4, 0.3, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, -1.57, 1.57, -1.57, -1.57, 0.0]
    assert f.check_state(home) is None and f.filter(np.zeros(7), home).shape == (7,)
    far = home.copy()
    far[8 + 5] = TAU + 0.3  # the 6th joint, past its limit by more than the margin
    assert f.check_state(far) == "joint_out_of_range"
    assert f.check_state(home[:13]) == "state_shape"  # the Panda's 15 would be wrong too
    so = SafetyFilter(SO_ARM)
    state = np.r_[0.0, 0.2, -0.2, 0.1, 0.0, 0.5]
    assert so.check_state(state) is None  # no tool pose, so no workspace check
    state[4] = 3.1 + 0.06  # the wrist roll beyond its limit by more than one speed step (0.05 rad)
    assert so.check_state(state) == "joint_out_of_range"
    hold = so.hold(np.r_[0.0, 0.2, -0.2, 0.1, 0.0, 0.5])
    np.testing.assert_allclose(so.joint_targets(hold[:5]), [0.0, 0.2, -0.2, 0.1, 0.0], atol=1e-12)
    assert hold[5] == -1.0  # the gripper keeps its last command (open at start)


def test_every_gripper_is_clipped_and_remembered():
    spec = RobotSpec(**{**BIMANUAL.to_dict(), "gripper_range": [-1.0, 0.5]})
    f = SafetyFilter(spec)
    state = np.zeros(14)
    sent = f.filter(np.r_[np.zeros(12), 0.9, -0.3], state)
    assert sent[12:].tolist() == [0.5, -0.3] and f.counts["gripper"] == 1
    assert f.hold(state)[12:].tolist() == [0.5, -0.3]


def test_specs_that_cannot_be_filtered_are_refused_and_old_specs_load_as_the_panda():
    with pytest.raises(ValueError, match="ee_delta mode needs the tool centre point"):
        SafetyFilter(RobotSpec(**{**SO_ARM.to_dict(), "action_mode": "ee_delta", "action_dim": 7}))
    with pytest.raises(ValueError, match="one entry per joint"):
        SafetyFilter(RobotSpec(**{**UR_EE.to_dict(), "joint_vel_max": [1.0] * 7}))
    with pytest.raises(ValueError, match="joint_pos mode needs the 6 joints"):
        SafetyFilter(RobotSpec(**{**UR_JP.to_dict(), "state_dim": 12}))
    new_fields = {"name", "joint_index", "tcp_index", "state_names", "action_names"}
    old = {k: v for k, v in RobotSpec(action_mode="joint_pos", action_dim=8).to_dict().items() if k not in new_fields}
    spec = RobotSpec.from_dict(old)
    assert (spec.name, spec.joint_slice, spec.tcp_slice, spec.num_joints) == ("panda", slice(8, 15), slice(0, 3), 7)
    assert spec.names()[0][7:9] == ["gripper_width", "joint1"] and spec.names()[1][-1] == "gripper"
