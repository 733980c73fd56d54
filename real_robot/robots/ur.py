"""A Universal Robots e-Series arm through ur_rtde (``pip install ur-rtde``; modules ``rtde_control``
and ``rtde_receive``).

Each control step servos toward the new target for one control period (``servoL`` to a base-frame
pose ``[x y z rx ry rz]``, m and rotation vector in rad, in ``ee_delta`` mode; ``servoJ`` to joint
angles in ``joint_pos`` mode), smoothed by ``servo_lookahead_s`` and ``servo_gain``; ``hold`` is
``servoStop``. The state reads ``getActualTCPPose`` and ``getActualQ``. ur_rtde drives no gripper:
pass an object with ``width() -> metres`` and ``move(close: bool)`` (a Robotiq driver, say) as
``gripper``; without one the state's gripper opening reads 0 and gripper commands are dropped.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, Optional

import numpy as np

from real_robot.cameras.base import Camera
from real_robot.robots.arm import ArmOptions, ArmReading, ArmRobot
from real_robot.robots.pose import quat_to_rotvec, rotvec_to_quat
from real_robot.robots.vendor import require


@dataclass
class URConfig(ArmOptions):
    """``robot=ur``: a UR3e / UR5e / UR10e / UR16e through ur_rtde (the ``robots`` extra)."""

    host: str = "192.168.1.10"  # the controller's address
    model: str = "ur5e"  # ur3e | ur5e | ur10e | ur16e
    servo_lookahead_s: float = 0.1  # servoL / servoJ smoothing, 0.03..0.2 s
    servo_gain: float = 300.0  # servoL / servoJ proportional gain, 100..2000
    stop_deceleration: float = 2.0  # servoStop's deceleration (rad/s^2)
    workspace_low: list[float] = field(default_factory=lambda: [-0.6, -0.6, 0.05])  # m, robot base frame
    workspace_high: list[float] = field(default_factory=lambda: [0.6, 0.6, 0.6])
    home_quat: list[float] = field(default_factory=lambda: [0.0, 1.0, 0.0, 0.0])  # tool pointing down


class URRobot(ArmRobot):
    what = "robot=ur"

    def __init__(
        self,
        cfg: Optional[URConfig] = None,
        cameras: Optional[dict[str, Camera]] = None,
        rtde: Any = None,
        gripper: Any = None,
    ):
        """``rtde``: an object with ``RTDEControlInterface`` and ``RTDEReceiveInterface`` (ur_rtde's,
        imported on connect when None; a test passes a stand-in); ``gripper``: see the module doc."""
        super().__init__(cfg or URConfig(), cameras)
        c = self.cfg
        if not 0.03 <= c.servo_lookahead_s <= 0.2 or not 100 <= c.servo_gain <= 2000:
            raise ValueError(
                f"ur_rtde takes servo_lookahead_s in 0.03..0.2 and servo_gain in 100..2000, got "
                f"{c.servo_lookahead_s} and {c.servo_gain}"
            )
        self._rtde, self._gripper = rtde, gripper
        self._control: Any = None
        self._receive: Any = None

    def _open(self) -> None:
        if self._rtde is None:
            self._rtde = SimpleNamespace(
                RTDEControlInterface=require("rtde_control", self.what).RTDEControlInterface,
                RTDEReceiveInterface=require("rtde_receive", self.what).RTDEReceiveInterface,
            )
        self._receive = self._rtde.RTDEReceiveInterface(self.cfg.host)
        self._control = self._rtde.RTDEControlInterface(self.cfg.host)

    def _read(self) -> ArmReading:
        tcp = np.asarray(self._receive.getActualTCPPose(), np.float64)
        return ArmReading(
            pos=tcp[:3],
            quat=rotvec_to_quat(tcp[3:6]),
            gripper_width=float(self._gripper.width()) if self._gripper is not None else 0.0,
            joints=np.asarray(self._receive.getActualQ(), np.float64),
        )

    def _servo_args(self) -> tuple[float, float, float, float, float]:
        # speed and acceleration are unused by servoL / servoJ (ur_rtde checks their range only)
        return 0.5, 0.5, 1.0 / self.spec.control_hz, self.cfg.servo_lookahead_s, self.cfg.servo_gain

    def _move_pose(self, pos: np.ndarray, quat: np.ndarray) -> None:
        self._control.servoL([*pos.tolist(), *quat_to_rotvec(quat).tolist()], *self._servo_args())

    def _move_joints(self, q: np.ndarray) -> None:
        self._control.servoJ(q.tolist(), *self._servo_args())

    def _grip(self, close: bool) -> None:
        if self._gripper is not None:
            self._gripper.move(close)

    def _stop(self) -> None:
        self._control.servoStop(self.cfg.stop_deceleration)

    def _close(self) -> None:
        control, receive, self._control, self._receive = self._control, self._receive, None, None
        try:
            control.stopScript()
            control.disconnect()
        finally:
            receive.disconnect()

    def faults(self) -> list[str]:
        r, out = self._receive, []
        if r is None:
            return out
        if r.isProtectiveStopped():
            out.append("the arm is protective-stopped: clear it on the teach pendant")
        if r.isEmergencyStopped():
            out.append("the emergency stop is pressed")
        return out
