"""The robot-side safety filter: every action passes through it before it reaches the motors.

On by default and configured from the :class:`~real_robot.robots.base.RobotSpec`. Checks, in
order, and each clip counted by name:

- ``non_finite``: NaN or inf anywhere -> the whole action is replaced by "hold still";
- ``range``: components outside ``[-1, 1]`` are clipped;
- ``gripper``: the gripper command is clipped to ``gripper_range``;
- ``ee_delta`` mode: ``step`` (the tool displacement ``|a[:3]| * pos_scale`` is scaled down to
  ``max_step``), ``rotation`` (likewise for ``max_rot_step``), ``workspace`` (the displacement is
  cut so the tool stays in the workspace box; outside the box only motion back toward it passes);
- ``joint_pos`` mode: ``joint_limit`` (targets clipped to the joint limits) and ``joint_velocity``
  (``|target - q| <= joint_vel_max / control_hz``).

:meth:`SafetyFilter.filter` returns the action actually sent; :attr:`SafetyFilter.counts` holds
how often each clip fired.
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from real_robot.robots.base import RobotSpec

JOINT_SLICE = slice(8, 15)  # real joint angles in the Panda state
POS_SLICE = slice(0, 3)  # tool centre point


class SafetyFilter:
    def __init__(self, spec: RobotSpec):
        if spec.action_mode not in ("ee_delta", "joint_pos"):
            raise ValueError(f"the safety filter knows action modes ee_delta and joint_pos, not {spec.action_mode!r}")
        self.spec = spec
        self.counts: Counter[str] = Counter()
        self.ws_lo = np.asarray(spec.workspace_low, np.float64)
        self.ws_hi = np.asarray(spec.workspace_high, np.float64)
        self.q_lo = np.asarray(spec.joint_low, np.float64)
        self.q_hi = np.asarray(spec.joint_high, np.float64)
        self.dq_max = np.asarray(spec.joint_vel_max, np.float64) / spec.control_hz
        self.last_gripper = -1.0

    def hold(self, state: np.ndarray) -> np.ndarray:
        """The "hold still" action for ``state``: zero motion (ee_delta) or the current joints."""
        a = np.zeros(self.spec.action_dim)
        if self.spec.action_mode == "joint_pos":
            q = np.clip(np.asarray(state, np.float64)[JOINT_SLICE], self.q_lo, self.q_hi)
            a[:7] = 2.0 * (q - self.q_lo) / (self.q_hi - self.q_lo) - 1.0
        a[-1] = self.last_gripper
        return a

    def filter(self, action: np.ndarray, state: np.ndarray) -> np.ndarray:
        """The action to send ``[A]`` for the requested ``action [A]`` in robot ``state [S]``."""
        a = np.array(action, dtype=np.float64, copy=True).reshape(-1)
        state = np.asarray(state, np.float64)
        if a.shape != (self.spec.action_dim,):
            self.counts["shape"] += 1
            return self.hold(state)
        if not np.isfinite(a).all() or not np.isfinite(state).all():
            self.counts["non_finite"] += 1
            return self.hold(state)
        if (np.abs(a) > 1.0).any():
            self.counts["range"] += 1
            a = np.clip(a, -1.0, 1.0)
        g_lo, g_hi = self.spec.gripper_range
        if not g_lo <= a[-1] <= g_hi:
            self.counts["gripper"] += 1
            a[-1] = float(np.clip(a[-1], g_lo, g_hi))
        if self.spec.action_mode == "ee_delta":
            self._ee_delta(a, state)
        else:
            self._joint_pos(a, state)
        self.last_gripper = float(a[-1])
        return a

    def _ee_delta(self, a: np.ndarray, state: np.ndarray) -> None:
        s = self.spec
        move = a[:3] * s.pos_scale
        norm = float(np.linalg.norm(move))
        if norm > s.max_step:
            self.counts["step"] += 1
            move *= s.max_step / norm
        rot = a[3:6] * s.rot_scale
        rnorm = float(np.linalg.norm(rot))
        if rnorm > s.max_rot_step:
            self.counts["rotation"] += 1
            a[3:6] *= s.max_rot_step / rnorm
        pos = state[POS_SLICE]
        target = pos + move
        # inside the box: stop at its faces; outside: only the components that move back toward it
        lo = np.minimum(self.ws_lo, pos)
        hi = np.maximum(self.ws_hi, pos)
        clipped = np.clip(target, lo, hi)
        if not np.allclose(clipped, target, atol=1e-12):
            self.counts["workspace"] += 1
            move = clipped - pos
        a[:3] = move / s.pos_scale

    def _joint_pos(self, a: np.ndarray, state: np.ndarray) -> None:
        target = self.q_lo + (a[:7] + 1.0) * 0.5 * (self.q_hi - self.q_lo)
        q = np.asarray(state, np.float64)[JOINT_SLICE]
        # limits first (a joint found outside its limits is brought back), then the speed limit
        slow = np.clip(target, q - self.dq_max, q + self.dq_max)
        if not np.allclose(slow, target, atol=1e-12):
            self.counts["joint_velocity"] += 1
        clipped = np.clip(slow, self.q_lo, self.q_hi)
        if not np.allclose(clipped, slow, atol=1e-12):
            self.counts["joint_limit"] += 1
        a[:7] = np.clip(2.0 * (clipped - self.q_lo) / (self.q_hi - self.q_lo) - 1.0, -1.0, 1.0)
