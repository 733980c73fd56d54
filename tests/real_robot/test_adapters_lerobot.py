"""LeRobot's robots behind the network robot protocol (real_robot/robots/lerobot_bridge.py).

Across processes, for real: ``.venv-lerobot``'s Python runs LeRobot's own SO-101 follower class
served by the bridge's entry point, with the Feetech motor bus replaced by a recording stand-in
(tests/real_robot/lerobot_standin.py: no serial arm on this machine); this side drives it as a
``NetworkRobot``. In-process, the mapping on a stand-in LeRobot robot (cameras, a bimanual layout)."""

from __future__ import annotations

import functools
import json
import math
import os
import signal
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from real_robot.robots.check import check_robot
from real_robot.robots.lerobot_bridge import LeRobotArm, LeRobotBridgeConfig
from real_robot.robots.network import NetworkRobot
from real_robot.safety import SafetyFilter

ROOT = Path(__file__).resolve().parents[2]
LEROBOT_PY = ROOT / ".venv-lerobot" / "bin" / "python"
MOTORS = ["shoulder_pan", "shoulder_lift", "elbow_flex", "wrist_flex", "wrist_roll", "gripper"]
HALF_DEG = (3000 - 1000) / 2 * 360 / 4095  # a calibrated range of 1000..3000 steps, in degrees either side


@functools.cache
def _lerobot_ready() -> bool:
    if not LEROBOT_PY.exists():
        return False
    probe = subprocess.run(
        [str(LEROBOT_PY), "-c", "import lerobot.robots.so_follower"], capture_output=True, timeout=120
    )
    return probe.returncode == 0


def _events(log: Path) -> list[dict]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


@pytest.fixture(scope="module")
def bridge(tmp_path_factory):
    if not _lerobot_ready():
        pytest.skip(".venv-lerobot with lerobot is not set up (scripts/setup.sh makes it)")
    tmp = tmp_path_factory.mktemp("lerobot")
    cal = {
        m: {"id": i + 1, "drive_mode": 0, "homing_offset": 0, "range_min": 1000, "range_max": 3000}
        for i, m in enumerate(MOTORS)
    }
    (tmp / "cal").mkdir()
    (tmp / "cal" / "arm.json").write_text(json.dumps(cal))
    log = tmp / "bus.jsonl"
    proc = subprocess.Popen(
        [
            str(LEROBOT_PY),
            str(Path(__file__).parent / "lerobot_standin.py"),
            "--host=127.0.0.1",
            "--port=0",
            "--control_hz=30",
            "--robot.type=so101_follower",
            "--robot.port=/dev/standin",
            "--robot.id=arm",
            f"--robot.calibration_dir={tmp / 'cal'}",
        ],
        env=dict(os.environ, STANDIN_LOG=str(log), OMP_NUM_THREADS="1"),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=tmp,
    )
    port, deadline, seen = None, time.time() + 120, []
    while port is None and time.time() < deadline:
        line = proc.stdout.readline()
        seen.append(line)
        if not line and proc.poll() is not None:
            pytest.fail("the LeRobot bridge exited:\n" + "".join(seen))
        if "listening on port" in line:
            port = int(line.rsplit(" ", 1)[-1])
    yield f"ws://127.0.0.1:{port}", log
    proc.send_signal(signal.SIGTERM)
    proc.wait(30)


def test_lerobot_so101_across_processes_check_then_joint_commands_in_degrees(bridge):
    address, log = bridge
    report = check_robot(NetworkRobot(address), hold_s=0.0)
    assert report.ok, report.failures
    goals = [e for e in _events(log) if e["event"] == "goal"]
    assert goals and all(g["values"] == g["before"] for g in goals)  # check's hold: nothing moved
    robot = NetworkRobot(address)
    robot.connect()
    s = robot.spec
    assert (s.name, s.action_mode, s.num_joints, s.action_dim, s.state_dim) == ("so101_follower", "joint_pos", 5, 6, 6)
    assert s.tcp_index is None and s.joint_slice == slice(0, 5) and s.control_hz == 30.0
    np.testing.assert_allclose(s.joint_high, [math.radians(HALF_DEG)] * 5)
    assert s.names()[0] == [f"{m}.pos" for m in MOTORS]
    state = robot.observe().state
    np.testing.assert_allclose(state, [0, 0, 0, 0, 0, 0.5])  # joints at 0 deg; the gripper half open (50 of 100)
    f = SafetyFilter(s)
    sent = robot.send_action(f.filter(np.array([0.01, -0.01, 0.0, 0.0, 0.0, -1.0]), state))
    goal = _events(log)[-1]["values"]
    np.testing.assert_allclose([goal[m] for m in MOTORS[:5]], [0.01 * HALF_DEG, -0.01 * HALF_DEG, 0, 0, 0], atol=1e-9)
    assert goal["gripper"] == pytest.approx(100.0)  # -1 is open: LeRobot's 100
    np.testing.assert_allclose(sent, [0.01, -0.01, 0, 0, 0, -1.0], atol=1e-12)  # mapped back from what LeRobot sent
    np.testing.assert_allclose(robot.observe().state[:2], np.radians([0.01 * HALF_DEG, -0.01 * HALF_DEG]), atol=1e-6)
    too_fast = f.filter(np.array([1.0, 0, 0, 0, 0, 1.0]), robot.observe().state)  # speed limit: 1.5 rad/s at 30 Hz
    robot.send_action(too_fast)
    moved = _events(log)[-1]["values"]["shoulder_pan"] - 0.01 * HALF_DEG
    assert 0 < math.radians(moved) <= 1.5 / 30 + 1e-6 and _events(log)[-1]["values"]["gripper"] == pytest.approx(0.0)
    before = len(_events(log))
    robot.reset()  # a real arm has no reset: it stays where it is (the operator resets the scene)
    assert len(_events(log)) == before
    robot.disconnect()
    assert _events(log)[-1] == {"event": "disconnect", "torque_off": True}


class _StandInLeRobot:
    """A LeRobot-shaped bimanual robot with one camera: records what it is sent, reaches it at once."""

    def __init__(self):
        arms = {f"{side}_{m}": 0.0 for side in ("left", "right") for m in MOTORS}
        self.present = {k: (50.0 if "gripper" in k else 0.0) for k in arms}
        self.action_features = {f"{k}.pos": float for k in arms}
        self.observation_features = {**self.action_features, "top": (48, 64, 3), "top_depth": (48, 64, 1)}
        degrees = SimpleNamespace(value="degrees")
        bus = SimpleNamespace(
            motors={
                m: SimpleNamespace(model="sts3215", norm_mode=degrees if m != "gripper" else "range_0_100")
                for m in MOTORS
            },
            calibration={m: SimpleNamespace(range_min=1000, range_max=3000) for m in MOTORS},
            model_resolution_table={"sts3215": 4096},
        )
        self.left_arm, self.right_arm = SimpleNamespace(bus=bus), SimpleNamespace(bus=bus)
        self.is_connected = self.is_calibrated = False
        self.sent: list[dict] = []
        self.frame = np.zeros((48, 64, 3), np.uint8)

    def connect(self, calibrate=True):
        assert calibrate is False  # never LeRobot's interactive calibration
        self.is_connected = self.is_calibrated = True

    def get_observation(self):
        return {
            **{f"{k}.pos": v for k, v in self.present.items()},
            "top": self.frame.copy(),
            "top_depth": np.zeros((48, 64, 1)),
        }

    def send_action(self, action):
        self.sent.append(dict(action))
        self.present.update({k.removesuffix(".pos"): v for k, v in action.items()})
        return action

    def disconnect(self):
        self.is_connected = False


def test_lerobot_mapping_bimanual_cameras_and_hold():
    lr = _StandInLeRobot()
    arm = LeRobotArm(lr, LeRobotBridgeConfig(gripper_open=0.0, gripper_closed=80.0), name="bi_so_follower")
    s = arm.spec
    assert (s.num_joints, s.action_dim, s.cameras) == (10, 12, {"top": [48, 64]})  # depth is no camera view
    assert arm.grippers == ["left_gripper", "right_gripper"] and s.gripper_slice == slice(10, 12)
    arm.connect()
    obs = arm.observe()
    assert obs.images["top"].shape == (48, 64, 3) and obs.frame_ids == {"top": 1}
    assert arm.observe().frame_ids == {"top": 1}  # the same picture: the counter stands (a stall shows)
    lr.frame[0, 0] = 9
    assert arm.observe().frame_ids == {"top": 2}
    np.testing.assert_allclose(obs.state[10:], [1 - 50 / 80] * 2)  # opening: this gripper is open at 0
    arm.send_action(np.r_[np.zeros(10), 1.0, -1.0])
    assert lr.sent[-1]["left_gripper.pos"] == 80.0 and lr.sent[-1]["right_gripper.pos"] == 0.0
    lr.present["left_shoulder_pan"] = 12.5  # pushed by hand since
    arm.hold()
    assert lr.sent[-1]["left_shoulder_pan.pos"] == 12.5 and lr.sent[-1]["left_gripper.pos"] == 80.0
    lr.left_arm.bus.motors["elbow_flex"].norm_mode = "range_m100_100"
    with pytest.raises(ValueError, match="use_degrees=true"):
        LeRobotArm(lr)


def test_the_bridge_refuses_a_command_line_without_a_robot_type():
    if not _lerobot_ready():
        pytest.skip(".venv-lerobot with lerobot is not set up")
    run = subprocess.run(
        [str(LEROBOT_PY), "-m", "real_robot.robots.lerobot_bridge", "--port=0"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 2 and "--robot.type=TYPE" in run.stderr and "so101_follower" in run.stderr
