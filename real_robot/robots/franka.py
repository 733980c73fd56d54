"""A Franka Panda or FR3 through franky (``pip install franky-control``; import name ``franky``).

franky plans jerk-limited trajectories at 1 kHz toward targets that may change at any time: each
control step sends the new target as an asynchronous motion that replaces the running one
(``CartesianMotion`` to an absolute base-frame pose in ``ee_delta`` mode, ``JointMotion`` in
``joint_pos`` mode); ``hold`` sends the stop motion of that mode. Units are franky's: m, rad, and
its quaternions are x y z w (converted here). The gripper closes with ``Gripper.grasp_async``
(any width) and opens to its full width with ``move_async``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Optional

import numpy as np

from real_robot.cameras.base import Camera
from real_robot.robots.arm import ArmOptions, ArmReading, ArmRobot
from real_robot.robots.pose import wxyz, xyzw
from real_robot.robots.vendor import require


@dataclass
class FrankaConfig(ArmOptions):
    """``robot=franka``: a Franka Panda / FR3 through franky (the ``robots`` extra)."""

    host: str = "172.16.0.2"  # the robot's FCI address
    model: str = "panda"  # panda | fr3
    relative_dynamics_factor: float = 0.1  # franky scales its velocity, acceleration and jerk limits by this
    gripper_speed: float = 0.05  # m/s
    gripper_force: float = 20.0  # N, when grasping
    # the simulators' TCP orientation at home (gripper down): keeps the quaternion's sign theirs
    home_quat: list[float] = field(default_factory=lambda: [0.0, 0.92388, -0.382683, 0.0])


class FrankaRobot(ArmRobot):
    what = "robot=franka"

    def __init__(
        self,
        cfg: Optional[FrankaConfig] = None,
        cameras: Optional[dict[str, Camera]] = None,
        franky: Optional[ModuleType] = None,
    ):
        """``franky``: the franky module (imported on connect when None; a test passes a stand-in)."""
        super().__init__(cfg or FrankaConfig(), cameras)
        if not 0 < self.cfg.relative_dynamics_factor <= 1:
            raise ValueError(f"relative_dynamics_factor must lie in (0, 1], got {self.cfg.relative_dynamics_factor}")
        self._franky, self._robot, self._gripper = franky, None, None

    def _open(self) -> None:
        fr = self._franky = self._franky or require("franky", self.what)
        self._robot = fr.Robot(self.cfg.host)
        self._robot.recover_from_errors()
        self._robot.relative_dynamics_factor = self.cfg.relative_dynamics_factor
        self._gripper = fr.Gripper(self.cfg.host)

    def _read(self) -> ArmReading:
        pose = self._robot.current_cartesian_state.pose.end_effector_pose
        return ArmReading(
            pos=np.asarray(pose.translation, np.float64),
            quat=wxyz(pose.quaternion),
            gripper_width=float(self._gripper.width),
            joints=np.asarray(self._robot.current_joint_state.position, np.float64),
        )

    def _move(self, motion: Any) -> None:
        self._robot.move(motion, asynchronous=True)

    def _move_pose(self, pos: np.ndarray, quat: np.ndarray) -> None:
        fr = self._franky
        self._move(fr.CartesianMotion(fr.Affine(pos.tolist(), xyzw(quat).tolist()), fr.ReferenceType.Absolute))

    def _move_joints(self, q: np.ndarray) -> None:
        self._move(self._franky.JointMotion(q.tolist()))

    def _grip(self, close: bool) -> None:
        c, g = self.cfg, self._gripper
        if close:
            g.grasp_async(0.0, c.gripper_speed, c.gripper_force, epsilon_outer=1.0)
        else:
            g.move_async(g.max_width, c.gripper_speed)

    def _stop(self) -> None:
        fr = self._franky
        self._move(fr.CartesianStopMotion() if self.spec.action_mode == "ee_delta" else fr.JointStopMotion())

    def _close(self) -> None:
        robot, self._robot, self._gripper = self._robot, None, None
        if robot is not None:
            robot.stop()

    def faults(self) -> list[str]:
        if self._robot is None or not self._robot.has_errors:
            return []
        return ["franky reports robot errors (Robot.has_errors); clear them at the robot"]
