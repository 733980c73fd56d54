"""Arms whose driver reports the tool pose and the joint angles (a Franka through franky, a UR arm
through ur_rtde): the one mapping between our actions and state and such a driver.

State ``[8 + J]``, the simulators' layout: the tool centre point (m, robot base frame), its
quaternion w x y z (the sign of ``home_quat``'s hemisphere), the gripper opening (m), the J joint
angles (rad). Actions, already through the client's safety filter:

- ``ee_delta`` ``[7]``: the target is the observed position plus ``a[:3] * pos_scale`` (m) and the
  observed orientation turned by the base-frame rotation vector ``a[3:6] * rot_scale`` (rad), exactly
  the target the filter checked (it is computed from the same state); the driver servos to it.
- ``joint_pos`` ``[J + 1]``: joint targets ``joint_low + (a + 1) / 2 * (joint_high - joint_low)``
  (rad), the filter's decoding.
- the last entry is the gripper, -1 open, +1 closed: the gripper moves when the command changes
  side of 0 (open <-> close), as LIBERO's binary gripper does.
"""

from __future__ import annotations

import abc
import time
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from real_robot.cameras.base import Camera, read_views
from real_robot.robots.base import Observation, Robot, RobotSpec
from real_robot.robots.models import ARM_MODELS
from real_robot.robots.pose import ee_delta_target, hemisphere


@dataclass
class ArmOptions:
    """The settings every pose-reporting arm shares (each adapter's config extends them)."""

    model: str = "panda"  # joint limits and rated speeds (real_robot/robots/models.py)
    action_mode: str = "ee_delta"  # ee_delta (7-D) | joint_pos (J + 1)
    control_hz: float = 20.0  # the client's loop rate; the policy must have been trained at it
    speed_fraction: float = 0.5  # the safety filter lets each joint move at this fraction of its rated speed
    workspace_low: list[float] = field(default_factory=lambda: [0.3, -0.3, 0.05])  # m, robot base frame
    workspace_high: list[float] = field(default_factory=lambda: [0.75, 0.3, 0.55])
    home_quat: list[float] = field(default_factory=lambda: [0.0, 1.0, 0.0, 0.0])  # w x y z: the quaternion's sign


@dataclass
class ArmReading:
    """One reading of the driver: ``pos [3]`` m, ``quat [4]`` w x y z, gripper opening (m), ``joints [J]`` rad."""

    pos: np.ndarray
    quat: np.ndarray
    gripper_width: float
    joints: np.ndarray


class ArmRobot(Robot):
    """The :class:`Robot` contract over a pose-reporting arm driver; subclasses implement the hooks."""

    what = "the arm"

    def __init__(self, cfg: ArmOptions, cameras: Optional[dict[str, Camera]] = None):
        model = ARM_MODELS.lookup(cfg.model)
        if not 0 < cfg.speed_fraction <= 1:
            raise ValueError(f"speed_fraction must lie in (0, 1], got {cfg.speed_fraction}")
        n = model.num_joints
        self.cfg, self.cameras = cfg, dict(cameras or {})
        self.spec = RobotSpec(
            action_mode=cfg.action_mode,
            action_dim=7 if cfg.action_mode == "ee_delta" else n + 1,
            control_hz=float(cfg.control_hz),
            cameras={name: [cam.size, cam.size] for name, cam in self.cameras.items()},
            state_dim=8 + n,
            name=cfg.model,
            joint_index=8,
            tcp_index=0,
            joint_low=list(model.joint_low),
            joint_high=list(model.joint_high),
            joint_vel_max=[v * cfg.speed_fraction for v in model.joint_vel_max],
            workspace_low=[float(v) for v in cfg.workspace_low],
            workspace_high=[float(v) for v in cfg.workspace_high],
        )
        problems = self.spec.problems()
        if problems:
            raise ValueError(f"{self.what}: " + "; ".join(problems))
        self.home = np.asarray(cfg.home_quat, np.float64)
        self.connected = False
        self._state: Optional[np.ndarray] = None
        self._closed: Optional[bool] = None  # the gripper's last command: closed, open, or none yet

    # ------------------------------------------------------------------ the driver's hooks
    @abc.abstractmethod
    def _open(self) -> None: ...

    @abc.abstractmethod
    def _read(self) -> ArmReading: ...

    @abc.abstractmethod
    def _move_pose(self, pos: np.ndarray, quat: np.ndarray) -> None:
        """Servo the tool toward ``pos [3]`` (m), ``quat [4]`` (w x y z), base frame."""

    @abc.abstractmethod
    def _move_joints(self, q: np.ndarray) -> None:
        """Servo the joints toward ``q [J]`` (rad)."""

    @abc.abstractmethod
    def _grip(self, close: bool) -> None: ...

    @abc.abstractmethod
    def _stop(self) -> None:
        """Stop the arm where it is."""

    @abc.abstractmethod
    def _close(self) -> None: ...

    def faults(self) -> list[str]:
        """What the driver reports wrong now (protective stop, errors); empty when all is well."""
        return []

    # ------------------------------------------------------------------ the contract
    def connect(self) -> None:
        if self.connected:
            return
        self._open()
        for cam in self.cameras.values():
            cam.open()
        self.connected, self._state, self._closed = True, None, None

    def observe(self) -> Observation:
        r = self._read()
        quat = hemisphere(np.asarray(r.quat, np.float64) / np.linalg.norm(r.quat), self.home)
        state = np.concatenate([np.asarray(r.pos, np.float64), quat, [r.gripper_width], np.asarray(r.joints)])
        if state.shape != (self.spec.state_dim,):
            raise RuntimeError(
                f"{self.what} reported {state.size - 8} joints, its model {self.cfg.model} has {self.spec.num_joints}"
            )
        images, ids = read_views(self.cameras)
        self._state = state.astype(np.float32)
        return Observation(self._state, images, ids, time.time())

    def send_action(self, action: np.ndarray) -> np.ndarray:
        s = self.spec
        a = np.clip(np.asarray(action, np.float64).reshape(-1), -1.0, 1.0)
        if a.shape != (s.action_dim,) or not np.isfinite(a).all():
            raise ValueError(f"{self.what} takes finite {s.action_dim}-D actions ({s.action_mode}), got {a}")
        x = (self._state if self._state is not None else self.observe().state).astype(np.float64)
        if s.action_mode == "ee_delta":
            self._move_pose(*ee_delta_target(x[0:3], x[3:7], a, s.pos_scale, s.rot_scale))
        else:
            lo, hi = np.asarray(s.joint_low), np.asarray(s.joint_high)
            self._move_joints(lo + (a[: s.num_joints] + 1.0) * 0.5 * (hi - lo))
        close = bool(a[-1] > 0.0)
        if close != self._closed:
            self._grip(close)
            self._closed = close
        return a

    def hold(self) -> None:
        if self.connected:
            self._stop()

    def disconnect(self) -> None:
        if not self.connected:
            return
        self.connected = False
        try:
            self._stop()
        finally:
            for cam in self.cameras.values():
                cam.close()
            self._close()
