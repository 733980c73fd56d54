"""The ``Robot`` contract the deployment client drives (real arm, :class:`SimRobot`, network robot).

A robot has a :class:`RobotSpec` (action space, control rate, cameras, state, limits), connects,
returns observations, executes one action per control step (returning the action it really
executed, after its own clamping) and disconnects cleanly (motors stopped / brakes on).
"""

from __future__ import annotations

import abc
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np


@dataclass
class RobotSpec:
    """What the policy bundle is checked against at connect, and what the safety filter enforces.

    Attributes:
        action_mode: ``ee_delta`` (7-D: dx dy dz, rotation vector, gripper) or ``joint_pos`` (8-D).
        action_dim: A.
        control_hz: the control rate of the robot's loop.
        cameras: camera name -> ``[height, width]`` of its frames.
        state_dim: S (tcp pos 3, tcp quat 4, gripper width 1, joints 7 for the Panda; the quaternion
            w x y z with the sign that keeps it in the home orientation's hemisphere, as the simulators
            give it: see ``sims.core.quat_hemisphere``).
        joint_low / joint_high: joint position limits (rad, real convention).
        joint_vel_max: joint speed limits (rad/s).
        workspace_low / workspace_high: the box the tool centre point must stay in (m).
        pos_scale / rot_scale: metres / radians per unit ee_delta action and control step.
        max_step: largest tool displacement per control step the filter lets through (m).
        max_rot_step: largest rotation per control step (rad).
        gripper_range: allowed gripper commands.
        state_margin_m: a tool centre point reading further than this outside the workspace box is
            implausible: the safety filter stops the robot (m).
        state_margin_rad: in ``ee_delta`` mode, a joint reading further than this outside its limits
            is implausible (rad; ``joint_pos`` mode allows one speed step, ``joint_vel_max / control_hz``).
    """

    action_mode: str = "ee_delta"
    action_dim: int = 7
    control_hz: float = 20.0
    cameras: dict[str, list[int]] = field(default_factory=lambda: {"agentview": [64, 64], "wrist": [64, 64]})
    state_dim: int = 15
    joint_low: list[float] = field(
        default_factory=lambda: [-2.8973, -1.7628, -2.8973, -3.0718, -2.8973, -0.0175, -2.8973]
    )
    joint_high: list[float] = field(default_factory=lambda: [2.8973, 1.7628, 2.8973, -0.0698, 2.8973, 3.7525, 2.8973])
    joint_vel_max: list[float] = field(default_factory=lambda: [2.175, 2.175, 2.175, 2.175, 2.61, 2.61, 2.61])
    workspace_low: list[float] = field(default_factory=lambda: [-0.5, -0.35, 0.02])
    workspace_high: list[float] = field(default_factory=lambda: [0.25, 0.35, 0.6])
    pos_scale: float = 0.05
    rot_scale: float = 0.5
    max_step: float = 0.09
    max_rot_step: float = 0.4
    gripper_range: list[float] = field(default_factory=lambda: [-1.0, 1.0])
    state_margin_m: float = 0.3
    state_margin_rad: float = 0.2

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "RobotSpec":
        return cls(**{k: v for k, v in data.items() if k in cls.__dataclass_fields__})


@dataclass
class Observation:
    """One reading of the robot: ``state [S]`` float32, ``images`` camera -> uint8 ``[H, W, 3]``,
    per-camera frame counters (a counter that stops moving is a stalled camera), the time it was
    taken and, for simulated robots, whether the task is solved."""

    state: np.ndarray
    images: dict[str, np.ndarray]
    frame_ids: dict[str, int]
    timestamp: float
    success: bool = False


class Robot(abc.ABC):
    spec: RobotSpec

    @abc.abstractmethod
    def connect(self) -> None: ...

    @abc.abstractmethod
    def observe(self) -> Observation: ...

    @abc.abstractmethod
    def send_action(self, action: np.ndarray) -> np.ndarray:
        """Execute ``action [A]`` for one control step; returns what was actually executed."""

    @abc.abstractmethod
    def hold(self) -> None:
        """Keep the current pose (zero motion, gripper unchanged)."""

    @abc.abstractmethod
    def disconnect(self) -> None:
        """Stop the motors cleanly and release the connection (idempotent)."""

    def __enter__(self) -> "Robot":
        self.connect()
        return self

    def __exit__(self, *exc: object) -> None:
        self.disconnect()
