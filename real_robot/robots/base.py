"""The ``Robot`` contract the deployment client drives (real arm, :class:`SimRobot`, network robot).

A robot has a :class:`RobotSpec` (action space, control rate, cameras, state, limits), connects,
returns observations, executes one action per control step (returning the action it really
executed, after its own clamping) and disconnects cleanly (motors stopped / brakes on).
"""

from __future__ import annotations

import abc
from dataclasses import asdict, dataclass, field
from typing import Any, Optional

import numpy as np

#: the action modes the safety filter knows (:class:`RobotSpec`)
ACTION_MODES = ("ee_delta", "joint_pos")
TCP_NAMES = ("tcp_x", "tcp_y", "tcp_z", "tcp_qw", "tcp_qx", "tcp_qy", "tcp_qz", "gripper_width")
EE_ACTION_NAMES = ("dx", "dy", "dz", "droll", "dpitch", "dyaw")


@dataclass
class RobotSpec:
    """What the policy bundle is checked against at connect, and what the safety filter enforces.

    The defaults describe the Franka Panda as the simulators give it; a driver reports its own arm's
    values (a spec serialized before the layout fields existed loads with the Panda's).

    Attributes:
        action_mode: ``ee_delta`` (dx dy dz, rotation vector, then the gripper commands) or
            ``joint_pos`` (one command per joint, then the gripper commands).
        action_dim: A. The entries after the 6 pose deltas (``ee_delta``) or after the ``num_joints``
            joint commands (``joint_pos``) are gripper commands (-1 open, +1 closed).
        control_hz: the control rate of the robot's loop.
        cameras: camera name -> ``[height, width]`` of its frames.
        state_dim: S (tcp pos 3, tcp quat 4, gripper width 1, joints 7 for the Panda; the quaternion
            w x y z with the sign that keeps it in the home orientation's hemisphere, as the simulators
            give it: see ``sims.core.quat_hemisphere``).
        name: the arm the driver drives (``panda``, ``fr3``, ``ur5e``, ``so101_follower``, ...).
        joint_index: ``state[joint_index : joint_index + num_joints]`` are the joint positions (rad);
            None when the state has none. In ``ee_delta`` mode a state too short to hold them has none.
        tcp_index: ``state[tcp_index : tcp_index + 3]`` is the tool centre point (m, robot base frame);
            None when the driver reports none (then only ``joint_pos`` mode, and no workspace check).
        joint_low / joint_high: joint position limits (rad, real convention); their length is the
            joint count, ``num_joints``.
        joint_vel_max: joint speed limits (rad/s), one per joint.
        workspace_low / workspace_high: the box the tool centre point must stay in (m).
        pos_scale / rot_scale: metres / radians per unit ee_delta action and control step.
        max_step: largest tool displacement per control step the filter lets through (m).
        max_rot_step: largest rotation per control step (rad).
        gripper_range: allowed gripper commands.
        state_margin_m: a tool centre point reading further than this outside the workspace box is
            implausible: the safety filter stops the robot (m).
        state_margin_rad: in ``ee_delta`` mode, a joint reading further than this outside its limits
            is implausible (rad; ``joint_pos`` mode allows one speed step, ``joint_vel_max / control_hz``).
        state_names / action_names: what each state / action entry is (recorded with the episodes);
            empty: the Panda-style layout's names (:meth:`names`).
    """

    action_mode: str = "ee_delta"
    action_dim: int = 7
    control_hz: float = 20.0
    cameras: dict[str, list[int]] = field(default_factory=lambda: {"agentview": [64, 64], "wrist": [64, 64]})
    state_dim: int = 15
    name: str = "panda"
    joint_index: Optional[int] = 8
    tcp_index: Optional[int] = 0
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
    state_names: list[str] = field(default_factory=list)
    action_names: list[str] = field(default_factory=list)

    @property
    def num_joints(self) -> int:
        return len(self.joint_low)

    @property
    def joint_slice(self) -> Optional[slice]:
        """Where the joints sit in the state, or None when the state carries none."""
        if self.joint_index is None or self.joint_index < 0 or self.joint_index + self.num_joints > self.state_dim:
            return None
        return slice(self.joint_index, self.joint_index + self.num_joints)

    @property
    def tcp_slice(self) -> Optional[slice]:
        """Where the tool centre point sits in the state, or None when the state carries none."""
        if self.tcp_index is None or self.tcp_index < 0 or self.tcp_index + 3 > self.state_dim:
            return None
        return slice(self.tcp_index, self.tcp_index + 3)

    @property
    def gripper_slice(self) -> slice:
        """Where the gripper commands sit in an action."""
        return slice(6 if self.action_mode == "ee_delta" else self.num_joints, self.action_dim)

    def problems(self) -> list[str]:
        """What makes this spec unusable (empty when it is sound): sizes, orders, indices."""
        out = []
        if self.action_mode not in ACTION_MODES:
            out.append(f"action_mode must be one of {list(ACTION_MODES)}, not {self.action_mode!r}")
        n = self.num_joints
        if n < 1 or len(self.joint_high) != n or len(self.joint_vel_max) != n:
            out.append(
                f"joint_low, joint_high and joint_vel_max need one entry per joint, got "
                f"{len(self.joint_low)}, {len(self.joint_high)}, {len(self.joint_vel_max)}"
            )
        elif not all(lo < hi for lo, hi in zip(self.joint_low, self.joint_high)) or min(self.joint_vel_max) <= 0:
            out.append("every joint needs joint_low < joint_high and joint_vel_max > 0")
        if len(self.workspace_low) != 3 or len(self.workspace_high) != 3:
            out.append("workspace_low / workspace_high need 3 entries (x y z, metres)")
        elif not all(lo < hi for lo, hi in zip(self.workspace_low, self.workspace_high)):
            out.append("the workspace box needs workspace_low < workspace_high on every axis")
        if len(self.gripper_range) != 2 or self.gripper_range[0] > self.gripper_range[1]:
            out.append("gripper_range must be [low, high] with low <= high")
        if not self.control_hz > 0:
            out.append(f"control_hz must be positive, got {self.control_hz}")
        if self.tcp_index is not None and self.tcp_slice is None:
            out.append(f"tcp_index {self.tcp_index} + 3 does not fit in the {self.state_dim}-D state")
        if self.action_mode == "ee_delta":
            if self.action_dim < 6:
                out.append(f"ee_delta actions need 6 pose entries (+ grippers), action_dim is {self.action_dim}")
            if self.tcp_slice is None:
                out.append("ee_delta mode needs the tool centre point in the state (tcp_index)")
        elif self.action_mode == "joint_pos":
            if self.action_dim < n:
                out.append(f"joint_pos actions need one entry per joint ({n}), action_dim is {self.action_dim}")
            if self.joint_slice is None:
                out.append(
                    f"joint_pos mode needs the {n} joints in the state: joint_index {self.joint_index}, "
                    f"state_dim {self.state_dim}"
                )
        for key, names, size in (
            ("state_names", self.state_names, self.state_dim),
            ("action_names", self.action_names, self.action_dim),
        ):
            if names and len(names) != size:
                out.append(f"{key} has {len(names)} names for {size} entries")
        return out

    def names(self) -> tuple[list[str], list[str]]:
        """``(state names [S], action names [A])``: the driver's, or those of the Panda-style layout
        (tcp pose, gripper width, joints; pose deltas or joints, then the grippers)."""
        n, grips = self.num_joints, max(self.action_dim - (6 if self.action_mode == "ee_delta" else self.num_joints), 0)
        joints = [f"joint{i + 1}" for i in range(n)]
        state = list(self.state_names)
        if not state:
            panda_like = self.tcp_index == 0 and self.joint_index == len(TCP_NAMES) == self.state_dim - n
            state = [*TCP_NAMES, *joints] if panda_like else [f"state{i}" for i in range(self.state_dim)]
        action = list(self.action_names)
        if not action:
            head = list(EE_ACTION_NAMES) if self.action_mode == "ee_delta" else joints
            action = head + (["gripper"] if grips == 1 else [f"gripper{i + 1}" for i in range(grips)])
        return state, action

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
