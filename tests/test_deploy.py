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

import policies
from real_robot import protocol
from real_robot.client import Deployer, DeployConfig, DeployError, Watchdog
from real_robot.policy_client import PolicyClient
from real_robot.robots.base import RobotSpec
from real_robot.robots.network import NetworkRobot, RobotAdapterServer
from real_robot.robots.sim_robot import SimRobot
from real_robot.safety import SafetyFilter
from real_robot.server import PolicyServer, ServerThread

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


def _malformed(rng: np.random.Generator) -> bytes | str:
    good = _obs()
    kind = int(rng.integers(0, 10))
    if kind == 0:
        return bytes(rng.integers(0, 256, int(rng.integers(1, 200)), dtype=np.uint8))  # garbage
    if kind == 1:
        return "not binary"
    if kind == 2:
        drop = list(good)[int(rng.integers(len(good)))]
        return protocol.packb({k: v for k, v in good.items() if k != drop and rng.random() < 0.7})  # missing
    if kind == 3:
        return protocol.packb({**good, f"extra{rng.integers(99)}": 1})
    if kind == 4:
        dt = rng.choice([np.float16, np.int32, np.uint16, np.float64, np.int8])
        return protocol.packb({**good, "observation/images/wrist": np.zeros((32, 32, 3), dt)})
    if kind == 5:
        shape = tuple(int(s) for s in rng.integers(0, 40, int(rng.integers(0, 5))))
        shape = (16,) if shape == (15,) else shape
        return protocol.packb({**good, "observation/state": np.zeros(shape, np.float32)})
    if kind == 6:
        s = np.zeros(15, np.float32)
        s[int(rng.integers(15))] = rng.choice([np.nan, np.inf, -np.inf])
        return protocol.packb({**good, "observation/state": s})
    if kind == 7:
        return protocol.packb({**good, "prompt": [1, b"x", "", "x" * 5000, None][int(rng.integers(5))]})
    if kind == 8:  # lying array header
        return protocol.packb({**good, "observation/state": {"__ndarray__": True, "data": b"\x00" * 7,
                                                              "dtype": "<f4", "shape": [15]}})
    return protocol.packb([1, 2, 3])


def test_fuzz_malformed_messages_get_errors_and_the_server_keeps_serving(tiny_server):
    from websockets.exceptions import ConnectionClosed
    from websockets.sync.client import connect

    server, port = tiny_server
    rng = np.random.default_rng(0)
    headers = {"Authorization": "Api-Key s3cret"}
    ws = connect(f"ws://127.0.0.1:{port}", additional_headers=headers, max_size=None)
    ws.recv()
    errors = closed = 0
    for i in range(2000):
        msg = _malformed(rng)
        if i % 250 == 0:
            msg = b"\x92" + b"\xc5\xff\xff" + b"\x00" * 65535 * 20  # a huge payload: over the limit
        try:
            ws.send(msg)
            reply = ws.recv(timeout=10)
        except ConnectionClosed:  # the server closed this connection (oversized message): open another
            closed += 1
            ws = connect(f"ws://127.0.0.1:{port}", additional_headers=headers, max_size=None)
            ws.recv()
            continue
        assert isinstance(reply, str) and reply.startswith("error:"), reply
        errors += 1
    assert errors + closed == 2000 and closed >= 8 and errors > 1900
    ok = PolicyClient(f"ws://127.0.0.1:{port}", api_key="s3cret")
    ok.connect()
    assert ok.infer(_obs())[0].shape == (6, 7)  # everyone else is still served
    ok.close()


finite = st.floats(-1e6, 1e6, allow_nan=False)
anything = st.one_of(finite, st.just(float("nan")), st.just(float("inf")), st.just(-float("inf")))


@settings(max_examples=400, deadline=None)
@given(action=st.lists(anything, min_size=7, max_size=7), pos=st.lists(st.floats(-1, 1), min_size=3, max_size=3),
       joints=st.lists(st.floats(-4, 4), min_size=7, max_size=7))
def test_safety_filter_never_sends_an_action_outside_the_limits(action, pos, joints):
    spec = RobotSpec()
    f = SafetyFilter(spec)
    state = np.zeros(15)
    state[:3], state[8:15] = pos, joints
    sent = f.filter(np.array(action), state)
    assert sent.shape == (7,) and np.isfinite(sent).all() and (np.abs(sent) <= 1.0).all()
    assert spec.gripper_range[0] <= sent[6] <= spec.gripper_range[1]
    move = sent[:3] * spec.pos_scale
    assert np.linalg.norm(move) <= spec.max_step + 1e-9
    assert np.linalg.norm(sent[3:6] * spec.rot_scale) <= spec.max_rot_step + 1e-9
    lo, hi = np.array(spec.workspace_low), np.array(spec.workspace_high)
    target = np.array(pos) + move
    inside = (np.array(pos) >= lo) & (np.array(pos) <= hi)
    assert ((target >= lo - 1e-9) & (target <= hi + 1e-9) | ~inside).all()  # inside stays inside
    # outside the box, no component moves further out
    assert (~(np.array(pos) < lo) | (move >= -1e-12)).all() and (~(np.array(pos) > hi) | (move <= 1e-12)).all()


@settings(max_examples=300, deadline=None)
@given(action=st.lists(anything, min_size=8, max_size=8), joints=st.lists(st.floats(-4, 4), min_size=7, max_size=7))
def test_safety_filter_joint_mode_respects_joint_position_and_speed_limits(action, joints):
    spec = RobotSpec(action_mode="joint_pos", action_dim=8)
    f = SafetyFilter(spec)
    state = np.zeros(15)
    state[8:15] = joints
    sent = f.filter(np.array(action), state)
    lo, hi = np.array(spec.joint_low), np.array(spec.joint_high)
    target = lo + (sent[:7] + 1) * 0.5 * (hi - lo)
    assert np.isfinite(sent).all() and ((target >= lo - 1e-9) & (target <= hi + 1e-9)).all()
    q = np.array(joints)
    within = (q >= lo) & (q <= hi)
    step = np.abs(target - q)
    assert (step[within] <= np.array(spec.joint_vel_max)[within] / spec.control_hz + 1e-9).all()


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
