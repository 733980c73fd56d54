"""The safety filter (real_robot/safety.py) on every state and action hypothesis finds, and the
Deployer's stop (the e-stop path) on a non-finite robot state."""

from __future__ import annotations

import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from real_robot.client import DeployConfig, Deployer
from real_robot.robots.base import Observation, Robot, RobotSpec
from real_robot.safety import SafetyFilter, UnsafeState
from real_robot.spec import PolicySpec

SPEC_EE = RobotSpec()
SPEC_JP = RobotSpec(action_mode="joint_pos", action_dim=8)
HOME = np.array([0.0, 0.0, 0.3, 1.0, 0.0, 0.0, 0.0, 0.04, 0.0, -0.785, 0.0, -2.356, 0.0, 1.571, 0.785])
any_float = st.floats()  # every float: NaN, +-inf, huge, subnormal
any_action_part = st.one_of(st.floats(-1.5, 1.5), any_float)


def robot_states(spec: RobotSpec):
    """Robot states ``[15]``: every component inside its plausible band, then up to 3 edits: any float,
    the exact edge of the band (widened by the plausibility margin) +- 1 ulp, or a value near that edge."""
    f = SafetyFilter(spec)
    margin_q = f.dq_max if spec.action_mode == "joint_pos" else np.full(7, spec.state_margin_rad)
    lo = np.r_[f.ws_lo, -np.ones(5), f.q_lo]
    hi = np.r_[f.ws_hi, np.ones(5), f.q_hi]
    margin = np.r_[np.full(3, spec.state_margin_m), np.zeros(5), margin_q]
    edit = st.tuples(st.integers(0, 14), st.integers(0, 4), st.integers(-1, 1), any_float)

    def build(base_edits):
        u, edits = base_edits
        state = lo + u * (hi - lo)
        for i, kind, ulps, x in edits:
            edge = lo[i] - margin[i] if kind in (1, 3) else hi[i] + margin[i]
            if kind == 0:
                state[i] = x
            elif kind <= 2:
                state[i] = np.nextafter(edge, np.inf * ulps) if ulps else edge
            else:
                state[i] = edge + (2 * u[i] - 1) * margin[i]
        return state

    return st.tuples(hnp.arrays(np.float64, 15, elements=st.floats(0, 1)), st.lists(edit, max_size=3)).map(build)


def _filter_or_stop(f: SafetyFilter, action: np.ndarray, state: np.ndarray) -> list[np.ndarray]:
    """The filtered ``action`` and the hold action after it; [] when the filter stopped on the state,
    which it must do exactly when the state is implausible."""
    reason = f.check_state(state)
    try:
        sent = [f.filter(action, state), f.hold(state)]
    except UnsafeState as err:
        assert reason is not None and err.reason == reason  # a plausible state never raises
        assert f.counts["unsafe_state"] == 1
        with pytest.raises(UnsafeState):
            f.hold(state)
        return []
    assert reason is None and not f.counts["unsafe_state"]
    return sent


@settings(max_examples=300, deadline=None)
@given(action=hnp.arrays(np.float64, 7, elements=any_action_part), state=robot_states(SPEC_EE))
def test_safety_filter_never_sends_an_action_outside_the_limits(action, state):
    spec = SPEC_EE
    f = SafetyFilter(spec)
    lo, hi = np.array(spec.workspace_low), np.array(spec.workspace_high)
    pos = state[:3]
    for sent in _filter_or_stop(f, action, state):
        assert sent.shape == (7,) and np.isfinite(sent).all() and (np.abs(sent) <= 1.0).all()
        assert spec.gripper_range[0] <= sent[6] <= spec.gripper_range[1]
        move = sent[:3] * spec.pos_scale
        assert np.linalg.norm(move) <= spec.max_step  # exact: no tolerance anywhere
        assert np.linalg.norm(sent[3:6] * spec.rot_scale) <= spec.max_rot_step
        target = pos + move  # what the robot commands
        # inside the box it stays inside; a component outside it does not move further out
        assert (target >= np.minimum(lo, pos)).all() and (target <= np.maximum(hi, pos)).all()
        assert ((pos >= lo) | (move >= 0)).all() and ((pos <= hi) | (move <= 0)).all()


@settings(max_examples=300, deadline=None)
@given(action=hnp.arrays(np.float64, 8, elements=any_action_part), state=robot_states(SPEC_JP))
def test_safety_filter_joint_mode_respects_joint_position_and_speed_limits(action, state):
    spec = SPEC_JP
    f = SafetyFilter(spec)
    lo, hi = np.array(spec.joint_low), np.array(spec.joint_high)
    dq = np.array(spec.joint_vel_max) / spec.control_hz
    q = state[8:15]
    for sent in _filter_or_stop(f, action, state):
        assert sent.shape == (8,) and np.isfinite(sent).all() and (np.abs(sent) <= 1.0).all()
        assert spec.gripper_range[0] <= sent[7] <= spec.gripper_range[1]
        target = lo + (sent[:7] + 1) * 0.5 * (hi - lo)  # the robot's decoding, float64
        assert ((target >= lo) & (target <= hi)).all()  # exact, after the round trip
        assert (np.abs(target - q) <= dq).all()  # every joint, also one found outside its limits


def _joint_targets(sent: np.ndarray, spec: RobotSpec = SPEC_JP) -> np.ndarray:
    lo, hi = np.array(spec.joint_low), np.array(spec.joint_high)
    return lo + (sent[:7] + 1) * 0.5 * (hi - lo)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_safety_filter_stops_on_a_non_finite_joint_reading(bad):
    f = SafetyFilter(SPEC_JP)
    state = HOME.copy()
    state[8 + 3] = bad  # before: "hold" sent NaN, or +inf sent every joint to its upper limit
    for action in (np.zeros(8), np.full(8, np.nan)):
        with pytest.raises(UnsafeState) as err:
            f.filter(action, state)
        assert err.value.reason == "non_finite_state"
    with pytest.raises(UnsafeState):
        f.hold(state)
    assert f.counts["unsafe_state"] == 3
    g = SafetyFilter(SPEC_EE)  # ee_delta too: a bad state is never turned into a command
    state = HOME.copy()
    state[4] = bad
    with pytest.raises(UnsafeState, match="non_finite_state"):
        g.filter(np.zeros(7), state)


def test_safety_filter_stops_on_implausible_states_and_holds_on_bad_actions():
    f = SafetyFilter(SPEC_EE)
    assert f.check_state(HOME) is None
    far_joint, far_tcp = HOME.copy(), HOME.copy()
    far_joint[8] = SPEC_EE.joint_high[0] + SPEC_EE.state_margin_rad + 0.01
    far_tcp[0] = SPEC_EE.workspace_high[0] + SPEC_EE.state_margin_m + 0.01
    for state, reason in [
        (HOME[:14], "state_shape"),
        (np.full(15, 1e308), "joint_out_of_range"),
        (far_joint, "joint_out_of_range"),
        (far_tcp, "workspace_out_of_range"),
    ]:
        assert f.check_state(state) == reason
        with pytest.raises(UnsafeState) as err:
            f.filter(np.zeros(7), state)
        assert err.value.reason == reason
    # a bad action with a good state is safe to replace by "hold still"
    for action in (np.full(7, np.nan), np.zeros(6), np.array([np.inf] + [0.0] * 6)):
        assert np.array_equal(f.filter(action, HOME), [0, 0, 0, 0, 0, 0, -1.0])
    assert f.counts["non_finite"] == 2 and f.counts["shape"] == 1


def test_safety_filter_stops_a_joint_too_far_past_its_limit():
    f = SafetyFilter(SPEC_JP)
    state = HOME.copy()
    state[8] = SPEC_JP.joint_high[0] + 0.5  # before: commanded back 0.5 rad in one step (4.6x the speed limit)
    assert f.check_state(state) == "joint_out_of_range"
    for action in (np.zeros(8), np.r_[np.ones(7), 1.0], f.hold(HOME)):
        with pytest.raises(UnsafeState, match="joint_out_of_range"):
            f.filter(action, state)


def test_safety_filter_brings_a_joint_just_past_its_limit_back_within_one_speed_step():
    f = SafetyFilter(SPEC_JP)
    lo, hi = np.array(SPEC_JP.joint_low), np.array(SPEC_JP.joint_high)
    dq = np.array(SPEC_JP.joint_vel_max) / SPEC_JP.control_hz  # joint 0: 2.175 / 20 = 0.10875 rad
    assert dq[0] == pytest.approx(0.10875)
    up = np.array([1, 0, 1, 0, 1, 0, 1], bool)  # these joints 0.05 rad past the upper limit, the others past the lower
    state = HOME.copy()
    state[8:15] = np.where(up, hi + 0.05, lo - 0.05)
    q = state[8:15]
    assert f.check_state(state) is None
    outward = np.r_[np.where(up, 1.0, -1.0), 1.0]
    for action in (outward, np.r_[np.where(up, 1.5, -1.5), 1.0], f.hold(state), -outward):
        t = _joint_targets(f.filter(action, state))
        assert ((t >= lo) & (t <= hi)).all() and (np.abs(t - q) <= dq).all()  # both, exactly
        if (action[:7] * outward[:7] > 0).all():
            assert np.array_equal(t, np.where(up, hi, lo))  # the target is the limit
        else:  # pulled back inside: one full speed step
            np.testing.assert_allclose(np.abs(t - q), dq, rtol=0, atol=1e-12)


def test_safety_filter_joint_mode_clips_limits_then_speed_and_counts_each():
    f = SafetyFilter(SPEC_JP)
    dq = np.array(SPEC_JP.joint_vel_max) / SPEC_JP.control_hz
    state = HOME.copy()
    q = state[8:15]
    inside = np.r_[f.hold(state)[:7], -1.0]
    inside[0] = 2.0 * (q[0] + 0.5 * dq[0] - SPEC_JP.joint_low[0]) / (SPEC_JP.joint_high[0] - SPEC_JP.joint_low[0]) - 1
    t = _joint_targets(f.filter(inside, state))
    assert abs(t[0] - q[0] - 0.5 * dq[0]) < 1e-12 and not f.counts  # a small step passes as it is
    fast = inside.copy()
    fast[0] = 0.5  # inside the limits, far away: the speed limit only
    t = _joint_targets(f.filter(fast, state))
    assert t[0] - q[0] == pytest.approx(dq[0], abs=1e-12) and t[0] - q[0] <= dq[0]
    assert f.counts == {"joint_velocity": 1}
    past = inside.copy()
    past[0] = 1.5  # past the upper limit: range, limit, then speed
    t = _joint_targets(f.filter(past, state))
    assert t[0] - q[0] == pytest.approx(dq[0], abs=1e-12) and t[0] - q[0] <= dq[0]
    assert f.counts == {"joint_velocity": 2, "joint_limit": 1, "range": 1}


def test_safety_filter_workspace_bound_is_exact():
    f = SafetyFilter(SPEC_EE)
    hi = np.array(SPEC_EE.workspace_high)
    state = HOME.copy()
    state[0] = hi[0] - 1e-6
    action = np.array([4e-5, 0, 0, 0, 0, 0, 1.0])  # +2 um: before, allclose (rtol 1e-5) let 1 um past the face
    sent = f.filter(action, state)
    target = state[:3] + sent[:3] * SPEC_EE.pos_scale
    assert target[0] <= hi[0] and target[0] == pytest.approx(hi[0], abs=1e-15)
    assert f.counts["workspace"] == 1
    state[0] = hi[0] + 0.1  # outside (but plausible): no component moves further out, motion back passes
    sent = f.filter(np.array([0.5, 0, 0, 0, 0, 0, 1.0]), state)
    assert sent[0] == 0.0
    sent = f.filter(np.array([-0.5, 0, 0, 0, 0, 0, 1.0]), state)
    assert sent[0] == -0.5


class _GlitchRobot(Robot):
    """A robot whose joint reading turns NaN from observation ``bad_step`` on."""

    def __init__(self, mode: str, bad_step: int):
        self.spec = RobotSpec(
            action_mode=mode, action_dim=7 if mode == "ee_delta" else 8, cameras={"agentview": [32, 32]}
        )
        self.bad_step, self.n = bad_step, 0
        self.sent: list[np.ndarray] = []
        self.holds = self.disconnects = 0
        self.connected = False

    def connect(self) -> None:
        self.connected = True

    def observe(self) -> Observation:
        state = HOME.copy()
        if self.n >= self.bad_step:
            state[8 + 3] = np.nan
        self.n += 1
        return Observation(
            state.astype(np.float32),
            {"agentview": np.zeros((32, 32, 3), np.uint8)},
            {"agentview": self.n},
            time.perf_counter(),
        )

    def send_action(self, action: np.ndarray) -> np.ndarray:
        self.sent.append(np.array(action, copy=True))
        return action

    def hold(self) -> None:
        self.holds += 1

    def disconnect(self) -> None:
        self.disconnects += 1
        self.connected = False


class _FakePolicyClient:
    """Stands in for :class:`PolicyClient`: every request gets a chunk of 0.5s; the states it saw are kept."""

    def __init__(self, action_dim: int):
        self.metadata = PolicySpec(
            family="flow",
            action_dim=action_dim,
            chunk_size=4,
            state_dim=15,
            cameras=("agentview",),
            image_size=32,
            control_hz=20.0,
        ).metadata()
        self.states: list[np.ndarray] = []

    def connect(self) -> PolicySpec:
        return PolicySpec.from_metadata(self.metadata)

    def infer(self, obs: dict, timeout: float | None = None) -> tuple[np.ndarray, dict]:
        self.states.append(np.array(obs["observation/state"]))
        return np.full((4, self.metadata["action_dim"]), 0.5, np.float32), {}

    def alive(self) -> bool:
        return True

    def close(self) -> None:
        pass


@pytest.mark.parametrize("mode", ["ee_delta", "joint_pos"])
def test_deployer_stops_the_robot_on_a_non_finite_state(mode):
    robot = _GlitchRobot(mode, bad_step=6)
    robot.connect()
    client = _FakePolicyClient(robot.spec.action_dim)
    dep = Deployer(robot, client, DeployConfig(mode="async", max_steps=30), "x")
    res = dep.run_episode()
    dep.close()
    assert res.reason == "unsafe_state" and res.steps == 6 and len(robot.sent) == 6
    assert robot.holds == 1 and robot.disconnects == 1 and not robot.connected  # the e-stop path
    assert all(np.isfinite(a).all() for a in robot.sent)  # nothing made of the NaN reading was sent
    assert all(np.isfinite(s).all() for s in client.states)  # ... nor asked of the policy
    assert "non_finite_state" in dep.last_error and res.safety_counts.get("unsafe_state") == 1
