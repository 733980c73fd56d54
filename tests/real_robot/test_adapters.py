"""The Franka (franky) and UR (ur_rtde) adapters against recording stand-ins of their vendor
libraries: no arm is wired to this machine, so each stand-in records every call and, like a perfect
servo, reaches each target at once. What is tested is our mapping (units, frames, quaternion order,
the gripper, the stop), the check mode and the missing-library error, not the vendors' drivers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from scipy.spatial.transform import Rotation

from real_robot.robots.check import check_robot
from real_robot.robots.franka import FrankaConfig, FrankaRobot
from real_robot.robots.models import ARM_MODELS
from real_robot.robots.pose import wxyz
from real_robot.robots.ur import URConfig, URRobot
from real_robot.robots.vendor import VendorMissing
from real_robot.safety import SafetyFilter

PANDA_HOME = [0.0, -0.785, 0.0, -2.356, 0.0, 1.571, 0.785]
DOWN_XYZW = [0.92388, -0.382683, 0.0, 0.0]  # the simulators' home TCP orientation, x y z w


class _Recorder:
    def __init__(self):
        self.calls: list[tuple] = []

    def names(self) -> list[str]:
        return [c[0] for c in self.calls]


def fake_franky(pos=(0.5, 0.0, 0.3), quat_xyzw=DOWN_XYZW, joints=PANDA_HOME, width=0.08):
    """A stand-in ``franky`` module: the classes our adapter uses, recording into ``rec``."""
    rec = _Recorder()
    arm = SimpleNamespace(pos=np.array(pos, float), quat=np.array(quat_xyzw, float), q=np.array(joints, float))

    class Affine:
        def __init__(self, translation=(0, 0, 0), quaternion=(0, 0, 0, 1)):
            self.translation, self.quaternion = np.array(translation, float), np.array(quaternion, float)

    class CartesianMotion:
        def __init__(self, target, reference_type=None):
            self.target, self.reference_type = target, reference_type

    class JointMotion:
        def __init__(self, q):
            self.q = list(q)

    class CartesianStopMotion:
        pass

    class JointStopMotion:
        pass

    class Robot:
        has_errors = False

        def __init__(self, host):
            rec.calls.append(("Robot", host))

        def recover_from_errors(self):
            rec.calls.append(("recover_from_errors",))

        @property
        def current_cartesian_state(self):
            pose = Affine(arm.pos, arm.quat)
            return SimpleNamespace(pose=SimpleNamespace(end_effector_pose=pose))

        @property
        def current_joint_state(self):
            return SimpleNamespace(position=arm.q.copy())

        def move(self, motion, asynchronous=False):
            rec.calls.append(("move", motion, asynchronous))
            if isinstance(motion, CartesianMotion):
                arm.pos, arm.quat = motion.target.translation, motion.target.quaternion
            elif isinstance(motion, JointMotion):
                arm.q = np.array(motion.q)

        def stop(self):
            rec.calls.append(("stop",))

    class Gripper:
        max_width = 0.08

        def __init__(self, host):
            self.width = width

        def grasp_async(self, w, speed, force, epsilon_outer=None):
            rec.calls.append(("grasp_async", w, speed, force, epsilon_outer))

        def move_async(self, w, speed):
            rec.calls.append(("move_async", w, speed))

    module = SimpleNamespace(
        Robot=Robot,
        Gripper=Gripper,
        Affine=Affine,
        CartesianMotion=CartesianMotion,
        JointMotion=JointMotion,
        CartesianStopMotion=CartesianStopMotion,
        JointStopMotion=JointStopMotion,
        ReferenceType=SimpleNamespace(Absolute="absolute", Relative="relative"),
    )
    return module, rec, arm


def test_franka_state_and_ee_delta_targets_in_franky_units():
    franky, rec, arm = fake_franky(quat_xyzw=[-q for q in DOWN_XYZW])  # the other sign of the same rotation
    robot = FrankaRobot(FrankaConfig(host="10.0.0.2"), franky=franky)
    assert (robot.spec.num_joints, robot.spec.state_dim, robot.spec.action_dim) == (7, 15, 7)
    robot.connect()
    assert rec.names()[:2] == ["Robot", "recover_from_errors"]
    state = robot.observe().state
    assert state.shape == (15,) and state.dtype == np.float32
    np.testing.assert_allclose(state[:3], [0.5, 0.0, 0.3], atol=1e-7)
    np.testing.assert_allclose(state[3:7], wxyz(DOWN_XYZW), atol=1e-6)  # w x y z, home hemisphere
    assert state[7] == pytest.approx(0.08) and np.allclose(state[8:], PANDA_HOME, atol=1e-6)
    a = np.array([0.4, -0.2, 1.0, 0.0, 0.0, 0.6, 1.0])  # up, and a yaw of 0.3 rad about the base z axis
    assert np.array_equal(robot.send_action(a), a)
    _, motion, asynchronous = rec.calls[-2]
    assert asynchronous and motion.reference_type == "absolute"
    np.testing.assert_allclose(motion.target.translation, state[:3].astype(float) + a[:3] * 0.05, atol=1e-12)
    want = Rotation.from_rotvec([0, 0, 0.3]) * Rotation.from_quat(DOWN_XYZW)  # base frame: turn applied last
    assert (Rotation.from_quat(motion.target.quaternion) * want.inv()).magnitude() < 1e-6
    assert rec.calls[-1] == ("grasp_async", 0.0, 0.05, 20.0, 1.0)  # +1: close (grasp any width)
    robot.send_action(np.r_[np.zeros(6), 0.7])
    assert rec.names()[-1] == "move"  # still closed: the gripper is not commanded again
    robot.send_action(np.r_[np.zeros(6), -0.2])
    assert rec.calls[-1] == ("move_async", 0.08, 0.05)  # open to the full width
    robot.hold()
    assert type(rec.calls[-1][1]).__name__ == "CartesianStopMotion"
    robot.disconnect()
    robot.disconnect()  # idempotent
    assert rec.names()[-2:] == ["move", "stop"]


def test_franka_joint_mode_decodes_as_the_safety_filter_and_stops_in_joint_mode():
    franky, rec, arm = fake_franky()
    robot = FrankaRobot(FrankaConfig(model="fr3", action_mode="joint_pos", speed_fraction=0.25), franky=franky)
    spec, fr3 = robot.spec, ARM_MODELS["fr3"]
    assert spec.action_dim == 8 and spec.joint_low == list(fr3.joint_low)
    assert spec.joint_vel_max == pytest.approx([v * 0.25 for v in fr3.joint_vel_max])
    robot.connect()
    state = robot.observe().state
    f = SafetyFilter(spec)
    assert f.check_state(state) is None
    sent = f.filter(np.r_[np.full(7, 0.9), -1.0], state)  # far away: the filter limits the speed
    robot.send_action(sent)
    q = np.array([c for c in rec.calls if c[0] == "move"][-1][1].q)
    np.testing.assert_array_equal(q, f.joint_targets(sent[:7]))  # the same decoding, bit for bit
    assert (np.abs(q - state[8:]) <= np.array(spec.joint_vel_max) / spec.control_hz + 1e-6).all()
    robot.hold()
    assert type(rec.calls[-1][1]).__name__ == "JointStopMotion"
    robot.disconnect()


def test_check_mode_reads_verifies_and_holds_without_moving_the_arm():
    franky, rec, arm = fake_franky()
    robot = FrankaRobot(FrankaConfig(), franky=franky)
    report = check_robot(robot, hold_s=0.0)
    assert report.ok, report.failures
    motions = [type(c[1]).__name__ for c in rec.calls if c[0] == "move"]
    assert motions == ["CartesianStopMotion"] * 2  # the hold, and the stop before disconnecting
    assert "grasp_async" not in rec.names() and "move_async" not in rec.names() and rec.names()[-1] == "stop"
    franky, rec, arm = fake_franky(pos=(0.9, 0.0, 0.3), joints=[0.0, -0.785, 0.0, -0.05, 0.0, 1.571, 0.785])
    report = check_robot(FrankaRobot(FrankaConfig(), franky=franky), hold_s=0.0)
    assert not report.ok and "stop" in rec.names()  # disconnected all the same
    text = " ".join(report.failures)
    assert "joint 4 reads -0.0500 rad" in text and "outside the workspace box" in text


def test_a_missing_vendor_library_names_the_pip_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "franky", None)  # as if franky-control were not installed
    with pytest.raises(VendorMissing, match=r"franky-control.*embodied-platform\[robots\]"):
        FrankaRobot().connect()
    monkeypatch.setitem(sys.modules, "rtde_control", None)
    with pytest.raises(VendorMissing, match="ur-rtde"):
        URRobot().connect()


def fake_rtde(tcp=(0.1, -0.4, 0.3, np.pi, 0.0, 0.0), q=(0.0, -1.57, 1.57, -1.57, -1.57, 0.0)):
    rec = _Recorder()
    arm = SimpleNamespace(tcp=np.array(tcp, float), q=np.array(q, float), protective=False)

    class RTDEReceiveInterface:
        def __init__(self, host):
            rec.calls.append(("receive", host))

        def getActualTCPPose(self):
            return arm.tcp.tolist()

        def getActualQ(self):
            return arm.q.tolist()

        def isProtectiveStopped(self):
            return arm.protective

        def isEmergencyStopped(self):
            return False

        def disconnect(self):
            rec.calls.append(("receive.disconnect",))

    class RTDEControlInterface:
        def __init__(self, host):
            rec.calls.append(("control", host))

        def servoL(self, pose, speed, acc, time, lookahead, gain):
            rec.calls.append(("servoL", list(pose), time, lookahead, gain))
            arm.tcp = np.array(pose)

        def servoJ(self, q, speed, acc, time, lookahead, gain):
            rec.calls.append(("servoJ", list(q), time, lookahead, gain))
            arm.q = np.array(q)

        def servoStop(self, a):
            rec.calls.append(("servoStop", a))

        def stopScript(self):
            rec.calls.append(("stopScript",))

        def disconnect(self):
            rec.calls.append(("control.disconnect",))

    return (
        SimpleNamespace(RTDEControlInterface=RTDEControlInterface, RTDEReceiveInterface=RTDEReceiveInterface),
        rec,
        arm,
    )


class _Gripper:
    def __init__(self):
        self.moves: list[bool] = []

    def width(self) -> float:
        return 0.085

    def move(self, close: bool) -> None:
        self.moves.append(close)


def test_ur_state_servol_targets_and_the_stop():
    rtde, rec, arm = fake_rtde()
    grip = _Gripper()
    robot = URRobot(URConfig(host="192.168.0.9", control_hz=25.0), rtde=rtde, gripper=grip)
    assert (robot.spec.name, robot.spec.num_joints, robot.spec.state_dim) == ("ur5e", 6, 14)
    robot.connect()
    state = robot.observe().state
    np.testing.assert_allclose(state[3:7], [0, 1, 0, 0], atol=1e-6)  # a half turn about x: tool down
    assert state[7] == pytest.approx(0.085) and np.allclose(state[8:], arm.q, atol=1e-6)
    a = np.array([0.0, 1.0, 0.0, 0.4, 0.0, 0.0, 1.0])
    robot.send_action(a)
    name, pose, t, lookahead, gain = rec.calls[-1]
    assert (name, t, lookahead, gain) == ("servoL", 1 / 25.0, 0.1, 300.0) and grip.moves == [True]
    np.testing.assert_allclose(pose[:3], state[:3].astype(float) + [0.0, 0.05, 0.0], atol=1e-12)
    want = Rotation.from_rotvec([0.2, 0, 0]) * Rotation.from_rotvec([np.pi, 0, 0])
    assert (Rotation.from_rotvec(pose[3:]) * want.inv()).magnitude() < 1e-6  # UR's rotation vector
    robot.hold()
    assert rec.calls[-1] == ("servoStop", 2.0)
    arm.protective = True
    assert robot.faults() == ["the arm is protective-stopped: clear it on the teach pendant"]
    robot.disconnect()
    assert rec.names()[-3:] == ["stopScript", "control.disconnect", "receive.disconnect"]


def test_ur_joint_mode_servoj_and_a_check_that_fails_on_a_protective_stop():
    rtde, rec, arm = fake_rtde()
    robot = URRobot(URConfig(model="ur10e", action_mode="joint_pos"), rtde=rtde)
    assert robot.spec.action_dim == 7 and robot.spec.joint_vel_max[0] == pytest.approx(2 * np.pi / 3 * 0.5)
    robot.connect()
    state = robot.observe().state
    assert state[7] == 0.0  # no gripper driver: the opening reads 0
    f = SafetyFilter(robot.spec)
    sent = f.filter(np.r_[np.zeros(6), 1.0], state)
    robot.send_action(sent)
    assert rec.calls[-1][0] == "servoJ" and np.array_equal(rec.calls[-1][1], f.joint_targets(sent[:6]))
    robot.disconnect()
    arm.protective = True
    report = check_robot(robot, hold_s=0.0)
    assert report.failures == ["driver: the arm is protective-stopped: clear it on the teach pendant"]
    assert "servoJ" not in rec.names()[rec.names().index("stopScript") + 1 :]  # the check sent no motion


def test_embodied_deploy_check_mode_as_a_command(tmp_path):
    """``embodied-deploy check=true``: the rehearsal robot passes; a Franka without franky installed
    fails with the package to install; neither needs a policy server."""
    deploy = str(Path(sys.executable).parent / "embodied-deploy")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    ok = subprocess.run(
        [deploy, "check=true", "robot=sim", "sim.realtime=false", "sim.image_size=32", f"out={tmp_path / 'sim'}"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert ok.returncode == 0, ok.stderr[-2000:]
    report = json.loads((tmp_path / "sim" / "check.json").read_text())
    assert report["ok"] and report["spec"]["name"] == "panda" and "passed" in ok.stdout
    missing = subprocess.run(
        [
            deploy,
            "check=true",
            "robot=franka",
            "franka.model=fr3",
            "cameras=[{name:wrist,kind:realsense}]",
            f"out={tmp_path / 'f'}",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert missing.returncode != 0 and "pip package franky-control" in missing.stderr
