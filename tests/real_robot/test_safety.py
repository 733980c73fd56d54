"""Deployment bridge on localhost: real websocket server, openpi-client, SimRobot, safety, faults."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import policies
from real_robot import protocol
from real_robot.client import Deployer, DeployConfig, DeployError, Watchdog
from real_robot.policy_client import PolicyClient
from real_robot.robots.base import Observation, Robot, RobotSpec
from real_robot.robots.network import NetworkRobot, RobotAdapterServer
from real_robot.robots.sim_robot import SimRobot
from real_robot.safety import SafetyFilter, UnsafeState
from real_robot.server import PolicyServer, ServerThread
from real_robot.spec import PolicySpec

TINY = dict(d_model=32, image_size=32, vision_channels=[8, 16], prefix_layers=1, expert_layers=1)
BIN = Path(sys.executable).parent


def _obs(size: int = 32) -> dict:
    return {"observation/state": np.zeros(15, np.float32),
            "observation/images/agentview": np.zeros((size, size, 3), np.uint8),
            "observation/images/wrist": np.zeros((size, size, 3), np.uint8), "prompt": "lift the can"}


@pytest.fixture(scope="module")
def tiny_server():
    torch.manual_seed(0)
    server = PolicyServer(policies.make("flow", chunk_size=6, **TINY), api_key="s3cret", max_message_bytes=1 << 20)
    with ServerThread(server) as port:
        yield server, port


def test_protocol_matches_openpi_and_rejects_unsafe_payloads():
    from openpi_client import msgpack_numpy

    obs = _obs()
    back = protocol.unpackb(msgpack_numpy.packb(obs))
    assert np.array_equal(back["observation/state"], obs["observation/state"]) and back["prompt"] == obs["prompt"]
    assert np.array_equal(msgpack_numpy.unpackb(protocol.packb(obs))["observation/images/wrist"],
                          obs["observation/images/wrist"])
    bad = [b"\xc1", b"", protocol.packb({"x": 1})[:-1],
           msgpack_numpy.packb({b"__ndarray__": True, b"data": b"abc", b"dtype": "|O", b"shape": [3]}),
           msgpack_numpy.packb({b"__ndarray__": True, b"data": b"abcd", b"dtype": "<f4", b"shape": [2]})]
    for raw in bad:
        with pytest.raises(protocol.ProtocolError):
            protocol.unpackb(raw)
    with pytest.raises(protocol.ProtocolError, match="exceeds the limit"):
        protocol.unpackb(b"\x00" * 100, max_bytes=10)


def test_openpi_client_gets_actions_and_the_api_key_is_checked(tiny_server):
    from openpi_client.websocket_client_policy import WebsocketClientPolicy

    server, port = tiny_server
    health = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz").read())
    assert health["status"] == "ok" and health["spec"]["chunk_size"] == 6
    client = WebsocketClientPolicy("127.0.0.1", port, api_key="s3cret")
    meta = client.get_server_metadata()
    assert meta["action_dim"] == 7 and "observation/images/wrist" in meta["request_keys"]
    reply = client.infer(_obs(48))
    assert reply["actions"].shape == (6, 7) and reply["actions"].dtype == np.float32
    assert {"decode_ms", "preprocess_ms", "infer_ms", "queue_ms"} <= set(reply["server_timing"])
    with pytest.raises(RuntimeError, match="NaN"):
        client.infer({**_obs(), "observation/state": np.full(15, np.nan, np.float32)})
    assert client.infer(_obs())["actions"].shape == (6, 7)  # still serving this connection
    for key in (None, "wrong"):
        with pytest.raises(Exception, match="401"):
            WebsocketClientPolicy("127.0.0.1", port, api_key=key)


def test_fuzz_malformed_messages_get_errors_and_the_server_keeps_serving(tiny_server, tmp_path):
    from real_robot.fuzz import KINDS, fuzz, main, passed

    server, port = tiny_server
    summary = fuzz(port, messages=1500, api_key="s3cret", seed=1, oversize_every=200)
    assert passed(summary), {k: v for k, v in summary.items() if k != "per_kind"}
    assert summary["messages"] == 1500 and set(summary["per_kind"]) == set(KINDS)  # every kind was sent
    assert summary["closed_oversize"] >= 7 and summary["error_replies"] > 1000 and summary["action_replies"] > 50
    ok = PolicyClient(f"ws://127.0.0.1:{port}", api_key="s3cret")
    ok.connect()
    assert ok.infer(_obs())[0].shape == (6, 7)  # everyone else is still served
    ok.close()
    # the script: its own server, a JSON summary, exit status 0 when it passed
    assert main(["--messages", "100", "--out", str(tmp_path / "fuzz.json")]) == 0
    assert json.loads((tmp_path / "fuzz.json").read_text())["passed"] is True


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
    for state, reason in [(HOME[:14], "state_shape"), (np.full(15, 1e308), "joint_out_of_range"),
                          (far_joint, "joint_out_of_range"), (far_tcp, "workspace_out_of_range")]:
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
        self.spec = RobotSpec(action_mode=mode, action_dim=7 if mode == "ee_delta" else 8,
                              cameras={"agentview": [32, 32]})
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
        return Observation(state.astype(np.float32), {"agentview": np.zeros((32, 32, 3), np.uint8)},
                           {"agentview": self.n}, time.perf_counter())

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
        self.metadata = PolicySpec(family="flow", action_dim=action_dim, chunk_size=4, state_dim=15,
                                   cameras=("agentview",), image_size=32, control_hz=20.0).metadata()
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


def test_watchdog_states():
    now = [0.0]
    w = Watchdog(0.1, 0.5, clock=lambda: now[0])
    assert w.state() == "ok"
    now[0] = 0.2
    assert w.state() == "hold"
    now[0] = 0.6
    assert w.state() == "stop"
    w.fresh()
    assert w.state() == "ok"


def test_deploy_spec_mismatch_is_refused(tiny_server):
    _, port = tiny_server
    robot = SimRobot(suite="goal", task=8, cameras=("agentview",), realtime=False)
    with pytest.raises(DeployError, match="needs cameras"):
        Deployer(robot, PolicyClient(f"ws://127.0.0.1:{port}", api_key="s3cret"), DeployConfig(), "x")


@pytest.mark.parametrize("mode", ["sync", "async", "rtc"])
def test_sim_robot_episode_through_the_server(tiny_server, mode):
    _, port = tiny_server
    robot = SimRobot(suite="goal", task=8, image_size=32, realtime=True)
    robot.connect()
    dep = Deployer(robot, PolicyClient(f"ws://127.0.0.1:{port}", api_key="s3cret"),
                   DeployConfig(mode=mode, max_steps=25), robot.instruction)
    res = dep.run_episode()
    dep.close()
    robot.disconnect()
    assert res.reason == "max_steps" and res.steps == 25 and len(res.actions) == 25
    assert res.latency["round_trip"]["count"] >= 3
    assert all(np.isfinite(a).all() and (np.abs(a) <= 1).all() for a in res.actions)


def test_camera_stall_and_emergency_stop(tiny_server):
    _, port = tiny_server
    robot = SimRobot(suite="goal", task=8, image_size=32, realtime=True, stall_camera="wrist", stall_camera_after=5)
    robot.connect()
    dep = Deployer(robot, PolicyClient(f"ws://127.0.0.1:{port}", api_key="s3cret"),
                   DeployConfig(mode="async", max_steps=200, stall_timeout_s=0.3), robot.instruction)
    res = dep.run_episode()
    assert res.reason == "camera_stalled:wrist" and res.steps < 200 and not robot.connected
    robot = SimRobot(suite="goal", task=8, image_size=32, realtime=True)
    robot.connect()
    dep.robot = robot
    res = dep.run_episode(on_step=lambda step, obs, sent: dep.emergency_stop() if step == 5 else None)
    assert res.reason == "estop" and res.steps == 6 and not robot.connected
    with pytest.raises(DeployError, match="emergency stop is engaged"):
        dep.run_episode()
    dep.reset_estop()
    robot.connect()
    dep.cfg.max_steps = 30  # an untrained policy: a long episode may drift the arm into an implausible state
    assert dep.run_episode(record=False).reason in ("max_steps", "success")
    dep.close()
    robot.disconnect()


def test_network_robot_behind_the_adapter_protocol(tiny_server):
    _, port = tiny_server
    sim = SimRobot(suite="goal", task=8, image_size=32, realtime=False)
    adapter = RobotAdapterServer(sim, api_key="r0bot")
    robot_port = adapter.start()
    robot = NetworkRobot(f"ws://127.0.0.1:{robot_port}", api_key="r0bot")
    robot.connect()
    assert robot.spec.cameras == {"agentview": [32, 32], "wrist": [32, 32]}
    obs = robot.observe()
    assert obs.state.shape == (15,) and obs.images["wrist"].shape == (32, 32, 3)
    sent = robot.send_action(np.array([2.0, 0, 0, 0, 0, 0, -1]))
    assert sent[0] == 1.0 and sim.ticks == 1  # clamped by the robot, one control step executed
    with pytest.raises(RuntimeError, match="action must be"):
        robot._call("send_action", action=np.zeros(3))
    dep = Deployer(robot, PolicyClient(f"ws://127.0.0.1:{port}", api_key="s3cret"),
                   DeployConfig(mode="async", max_steps=10, hold_timeout_s=5, stop_timeout_s=10), "lift the can")
    res = dep.run_episode()
    assert res.steps == 10 and sim.ticks == 11
    dep.close()
    robot.disconnect()
    adapter.stop()
    with pytest.raises(Exception):
        NetworkRobot(f"ws://127.0.0.1:{robot_port}", api_key="wrong").connect()


def test_opencv_camera_from_a_file_and_stall(tmp_path):
    import cv2

    from real_robot.cameras.opencv import CameraStalled, OpenCVCamera

    path = str(tmp_path / "cam.avi")
    vw = cv2.VideoWriter(path, cv2.VideoWriter_fourcc(*"MJPG"), 20, (80, 60))
    for i in range(5):
        vw.write(np.full((60, 80, 3), i * 40, np.uint8))
    vw.release()
    cam = OpenCVCamera(path, size=32, stall_timeout=0.05)
    frames = [cam.read() for _ in range(5)]
    assert frames[-1][0].shape == (32, 32, 3) and [f[1] for f in frames] == [1, 2, 3, 4, 5]
    time.sleep(0.1)
    with pytest.raises(CameraStalled):
        cam.read()
    cam.close()


def test_killing_the_server_mid_episode_holds_then_stops(tmp_path):
    """embodied-serve as a process, SIGKILLed mid-episode: the client holds from the next control
    period and the watchdog stops (and disconnects) the robot."""
    ckpt = policies.save(policies.make("flow", chunk_size=6, **TINY), tmp_path / "ckpt")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.Popen([str(BIN / "embodied-serve"), f"checkpoint={ckpt}", "port=0"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        port = _port_of(proc)
        robot = SimRobot(suite="goal", task=8, image_size=32, realtime=True)
        robot.connect()
        dep = Deployer(robot, PolicyClient(f"ws://127.0.0.1:{port}"),
                       DeployConfig(mode="async", max_steps=400, hold_timeout_s=0.2, stop_timeout_s=0.8),
                       robot.instruction)
        killed_at: list[int] = []

        def kill(step, obs, sent):
            if step == 15:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                killed_at.append(step)

        res = dep.run_episode(on_step=kill)
        dep.close()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert res.reason == "watchdog" and not robot.connected and res.steps < 400
    after = res.actions[killed_at[0] + 2:]
    assert after and all(np.abs(a[:6]).max() == 0 for a in after)  # holding still


def _port_of(proc: subprocess.Popen) -> int:
    deadline = time.time() + 120
    port = None
    while time.time() < deadline and port is None:
        line = proc.stdout.readline()
        if not line and proc.poll() is not None:
            raise RuntimeError("embodied-serve exited")
        if "listening on port" in line:
            port = int(line.rsplit(" ", 1)[-1])
    assert port is not None, "embodied-serve did not report its port"
    while time.time() < deadline:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz")
            return port
        except urllib.error.HTTPError:
            time.sleep(0.2)
    raise RuntimeError("embodied-serve never became ready")


def test_serve_benchmark_runs(tmp_path):
    out = tmp_path / "bench"
    proc = subprocess.run([str(BIN / "embodied-bench"), "bench=serve", f"out={out}", "requests=3", "rounds=1",
                           "warmup=1", "clients=2", "concurrency_seconds=1", "image_size=32"],
                          capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"), timeout=600,
                          check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((out / "serve.json").read_text())
    assert result["round_trip_ms"]["p50"] > 0 and result["in_process_ms"]["p50"] > 0
    assert result["concurrency"]["many"]["clients"] == 2 and result["concurrency"]["many"]["requests"] > 0
    assert "meets_target" in result


def test_serve_and_deploy_commands_record_a_dataset(tmp_path):
    from embodied.data.lerobot_format import Dataset

    ckpt = policies.save(policies.make("flow", chunk_size=6, **TINY), tmp_path / "ckpt")
    env = dict(os.environ, OMP_NUM_THREADS="1", EMBODIED_API_KEY="k3y")
    proc = subprocess.Popen([str(BIN / "embodied-serve"), f"checkpoint={ckpt}", "port=0"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        port = _port_of(proc)
        out = tmp_path / "deploy"
        run = subprocess.run([str(BIN / "embodied-deploy"), f"server=ws://127.0.0.1:{port}", f"out={out}",
                              "sim.image_size=32", "episodes=2", "max_steps=12", "mode=rtc"],
                             capture_output=True, text=True, env=env, timeout=300, check=False)
        assert run.returncode == 0, run.stderr[-3000:]
        wrong = subprocess.run([str(BIN / "embodied-deploy"), f"server=ws://127.0.0.1:{port}",
                                f"out={tmp_path / 'd2'}", "api_key=nope", "sim.image_size=32"],
                               capture_output=True, text=True, env=env, timeout=300, check=False)
        assert wrong.returncode != 0 and "401" in wrong.stderr
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
    summary = json.loads((out / "deploy.json").read_text())
    assert [e["steps"] for e in summary["episodes"]] == [12, 12] and "api_key" not in summary["config"]
    data = Dataset(out / "dataset")
    assert data.num_episodes == 2 and len(data) == 24
    ep = data.episode(0)
    assert ep["action"].shape == (12, 7)


def test_latency_aware_policy_deploys_in_aware_mode_only():
    from embodied.latency import widen_state_input

    aware = widen_state_input(policies.make("flow", chunk_size=6, **TINY), 2 * 7 + 1)
    with ServerThread(PolicyServer(aware)) as port:
        robot = SimRobot(suite="goal", task=8, image_size=32, realtime=True)
        robot.connect()
        with pytest.raises(DeployError, match="use mode=aware"):
            Deployer(robot, PolicyClient(f"ws://127.0.0.1:{port}"), DeployConfig(mode="async"), "x")
        dep = Deployer(robot, PolicyClient(f"ws://127.0.0.1:{port}"), DeployConfig(mode="aware", max_steps=20),
                       robot.instruction)
        assert dep.max_delay == 2
        res = dep.run_episode()
        dep.close()
        robot.disconnect()
    assert res.steps == 20 and res.latency["round_trip"]["count"] >= 2


def test_state_only_simulation_policy_is_refused_on_a_robot():
    from real_robot.client import check_compatible
    from real_robot.spec import PolicySpec

    robot = SimRobot(suite="goal", task=8, image_size=32)
    spec = PolicySpec(family="flow", action_dim=7, chunk_size=3, state_dim=15 + 50, cameras=(), image_size=32,
                      control_hz=20.0, state_obs="privileged")
    assert PolicySpec.from_metadata(spec.metadata()).state_obs == "privileged"  # travels to the client
    with pytest.raises(DeployError, match="simulator-only object state"):
        check_compatible(spec, robot)


def test_sim_robot_injects_latency_noise_and_dynamics_changes():
    up = np.array([0, 0, 1.0, 0, 0, 0, -1])
    base = SimRobot(suite="goal", task=8, image_size=32, realtime=False)
    odd = SimRobot(suite="goal", task=8, image_size=32, realtime=False, mass_scale=3.0, friction_scale=0.5,
                   obs_latency_steps=2, action_delay_steps=1, camera_noise_std=5.0, color_shift=20.0)
    base.connect()
    odd.connect()
    assert np.allclose(odd.env.sim.expand("body_mass")[0], 3.0 * base.env.sim.expand("body_mass")[0])
    start = odd.observe().state.copy()
    for _ in range(3):
        base.send_action(up)
        odd.send_action(up)
    assert base.observe().state[2] > start[2] + 0.05  # moved up
    # the first command ran one tick late and the reading is two ticks old: nothing visible yet
    assert np.allclose(odd.observe().state[:3], start[:3], atol=2e-3) and odd.ticks == 3
    diff = np.abs(base.observe().images["agentview"].astype(int) - odd.observe().images["agentview"].astype(int))
    assert diff.mean() > 2.0
    base.disconnect()
    odd.disconnect()
