"""The robot-side safety filter: every action passes through it before it reaches the motors.

On by default and configured from the :class:`~real_robot.robots.base.RobotSpec` the driver
reports: any joint count, its joint limits and speeds, its workspace box, and where the joints
(``spec.joint_slice``, ``state[8:15]`` for the Panda) and the tool centre point
(``spec.tcp_slice``, ``state[0:3]``) sit in its state. Actions hold the pose deltas (``ee_delta``)
or one command per joint (``joint_pos``), then the gripper commands (``spec.gripper_slice``).
Checks, in order, and each one counted by name in :attr:`SafetyFilter.counts`:

1. ``unsafe_state``: the robot's state is checked first (:meth:`SafetyFilter.check_state`). A
   state that is not a finite vector of ``state_dim`` numbers, a joint outside its limits widened
   by one speed step ``joint_vel_max / control_hz`` (``joint_pos`` mode; no target can then
   satisfy both the limits and the speed limit) or by ``state_margin_rad`` (``ee_delta`` mode), or
   a tool centre point outside the workspace box widened by ``state_margin_m`` is implausible: the
   filter logs a warning and raises :class:`UnsafeState` instead of returning any action, and
   :meth:`SafetyFilter.hold` does the same. A bad reading is never turned into a command; the caller
   stops the robot (the deployment client ends the episode with reason ``unsafe_state`` and takes
   the emergency-stop path).
2. ``shape`` / ``non_numeric`` / ``non_finite``: an action of the wrong shape, not numbers, or with
   NaN or inf anywhere is replaced by "hold still" (:meth:`SafetyFilter.hold`; safe, the state is
   good);
3. ``range``: components outside ``[-1, 1]`` are clipped;
4. ``gripper``: the gripper commands are clipped to ``gripper_range``;
5. ``ee_delta`` mode: ``step`` (the tool displacement ``|a[:3]| * pos_scale`` is scaled down to
   ``max_step``), ``rotation`` (likewise ``|a[3:6]| * rot_scale`` to ``max_rot_step``),
   ``workspace`` (the displacement is cut so the tool stays in the workspace box; outside the box
   only the components that move back toward it pass);
6. ``joint_pos`` mode: ``joint_limit`` (the requested targets are clipped to the joint limits),
   then ``joint_velocity`` (the clipped targets are clipped to ``q +- joint_vel_max / control_hz``).
   A joint found outside its limits (by at most one speed step, else the state is implausible) is
   brought back to them within one step.

Guarantees, for any input (every float, NaN, inf, any shape) and a plausible state: the returned
action is finite, in ``[-1, 1]``, its grippers in ``gripper_range``, and, evaluated in float64 the
way the robot decodes it, exactly (no tolerance):

- ``ee_delta``: ``|a[:3] * pos_scale| <= max_step``, ``|a[3:6] * rot_scale| <= max_rot_step``, and
  the target ``pos + a[:3] * pos_scale`` is inside the workspace box, per component; a component
  already outside it does not move further out;
- ``joint_pos``: the target ``joint_low + (a + 1) * 0.5 * (joint_high - joint_low)`` (see
  :meth:`SafetyFilter.joint_targets`) is inside the joint limits and ``|target - q| <=
  joint_vel_max / control_hz`` for every joint.

The comparisons are exact: the filter checks its own output after the action -> target round trip
and moves a component by the few ulps that rounding needs (these corrections are not counted).
:meth:`SafetyFilter.filter` returns the action actually sent; a plausible state never raises.
"""

from __future__ import annotations

import logging
import struct
from collections import Counter
from typing import Callable, Optional

import numpy as np

from real_robot.robots.base import RobotSpec

log = logging.getLogger(__name__)


class UnsafeState(RuntimeError):
    """The robot's state is implausible (a bad reading): stop the robot, send nothing."""

    def __init__(self, reason: str):
        super().__init__(f"implausible robot state ({reason}): stopping the robot")
        self.reason = reason


def _ordered(x: float) -> int:
    """An integer that orders like the float ``x`` (adjacent floats: adjacent integers)."""
    i = struct.unpack("<q", struct.pack("<d", x))[0]
    return i if i >= 0 else -(i & 0x7FFF_FFFF_FFFF_FFFF)


def _from_ordered(k: int) -> float:
    bits = k if k >= 0 else (-k) | (1 << 63)
    return struct.unpack("<d", struct.pack("<Q", bits))[0]


def _nearest_ok(
    value: Callable[[float], float],
    too_high: Callable[[float], bool],
    too_low: Callable[[float], bool],
    x: float,
    x_min: float,
    x_max: float,
) -> Optional[float]:
    """The float nearest ``x`` in ``[x_min, x_max]`` whose ``value`` is neither too high nor too low.

    ``value`` is non-decreasing (a float round trip such as action -> target); None when no float
    qualifies. A binary search over the floats: at most 64 evaluations.
    """

    def search(good: float, bad: float, is_bad: Callable[[float], bool]) -> float:
        g, b = _ordered(good), _ordered(bad)  # the float next to ``bad`` on ``good``'s side that passes
        while abs(b - g) > 1:
            mid = (g + b) // 2
            if is_bad(value(_from_ordered(mid))):
                b = mid
            else:
                g = mid
        return _from_ordered(g)

    for bad, edge, other in ((too_high, x_min, too_low), (too_low, x_max, too_high)):
        if bad(value(x)):
            if bad(value(edge)):
                return None
            x = search(edge, x, bad)
            return None if other(value(x)) else x
    return x


def _shrink_to_norm(v: np.ndarray, scale: float, limit: float) -> np.ndarray:
    """``v`` scaled toward zero by as many ulps as it takes for ``|v * scale| <= limit`` (exactly)."""
    for _ in range(64):
        if float(np.linalg.norm(v * scale)) <= limit:
            return v
        v = v * (1.0 - 2.0**-50)
    return np.zeros_like(v)


class SafetyFilter:
    def __init__(self, spec: RobotSpec):
        problems = spec.problems()
        if problems:
            raise ValueError(f"the safety filter cannot run on this robot spec ({spec.name}): " + "; ".join(problems))
        self.spec = spec
        self.joints, self.tcp, self.grip = spec.joint_slice, spec.tcp_slice, spec.gripper_slice
        self.n = spec.num_joints
        self.counts: Counter[str] = Counter()
        self.ws_lo = np.asarray(spec.workspace_low, np.float64)
        self.ws_hi = np.asarray(spec.workspace_high, np.float64)
        self.q_lo = np.asarray(spec.joint_low, np.float64)
        self.q_hi = np.asarray(spec.joint_high, np.float64)
        self.dq_max = np.asarray(spec.joint_vel_max, np.float64) / spec.control_hz
        g_lo, g_hi = spec.gripper_range
        grips = len(range(spec.action_dim)[self.grip])
        self.last_gripper = np.full(grips, float(np.clip(-1.0, max(g_lo, -1.0), min(g_hi, 1.0))))

    # ------------------------------------------------------------------ the state
    def check_state(self, state: np.ndarray) -> Optional[str]:
        """None for a plausible robot ``state [S]``, else why not (``state_type``, ``state_shape``,
        ``non_finite_state``, ``joint_out_of_range``, ``workspace_out_of_range``)."""
        s = self.spec
        try:
            raw = np.asarray(state)
            if raw.dtype.kind not in "iuf":
                return "state_type"
            x = raw.astype(np.float64)
        except (TypeError, ValueError):
            return "state_type"
        if x.shape != (s.state_dim,):
            return "state_shape"
        if not np.isfinite(x).all():
            return "non_finite_state"
        if self.joints is not None:
            q = x[self.joints]
            margin = self.dq_max if s.action_mode == "joint_pos" else s.state_margin_rad
            if (q < self.q_lo - margin).any() or (q > self.q_hi + margin).any():
                return "joint_out_of_range"
            # at the edge of that band rounding may leave no float target meeting both limits
            if s.action_mode == "joint_pos" and self._joint_action(np.clip(q, self.q_lo, self.q_hi), q) is None:
                return "joint_out_of_range"
        if self.tcp is not None:
            p = x[self.tcp]
            if (p < self.ws_lo - s.state_margin_m).any() or (p > self.ws_hi + s.state_margin_m).any():
                return "workspace_out_of_range"
        return None

    def _require_plausible(self, state: np.ndarray) -> np.ndarray:
        reason = self.check_state(state)
        if reason is not None:
            self._unsafe(reason)
        return np.asarray(state).astype(np.float64)

    def _unsafe(self, reason: str) -> None:
        self.counts["unsafe_state"] += 1
        log.warning("safety filter: implausible robot state (%s); no command sent, the robot must stop", reason)
        raise UnsafeState(reason)

    # ------------------------------------------------------------------ actions
    def hold(self, state: np.ndarray) -> np.ndarray:
        """The "hold still" action for ``state``: zero motion (ee_delta) or the current joints
        (brought inside the limits). Raises :class:`UnsafeState` on an implausible state."""
        x = self._require_plausible(state)
        a = np.zeros(self.spec.action_dim)
        if self.spec.action_mode == "joint_pos":
            q = x[self.joints]
            a[: self.n] = self._checked_joint_action(np.clip(q, self.q_lo, self.q_hi), q)
        a[self.grip] = self.last_gripper
        return a

    def filter(self, action: np.ndarray, state: np.ndarray) -> np.ndarray:
        """The action to send ``[A]`` for the requested ``action [A]`` in robot ``state [S]``.

        Raises :class:`UnsafeState` (and returns nothing) when the state is implausible.
        """
        x = self._require_plausible(state)
        try:
            raw = np.asarray(action)
            if raw.dtype.kind not in "iuf":
                self.counts["non_numeric"] += 1
                return self.hold(x)
            a = raw.astype(np.float64).reshape(-1)
        except (TypeError, ValueError):
            self.counts["non_numeric"] += 1
            return self.hold(x)
        if a.shape != (self.spec.action_dim,):
            self.counts["shape"] += 1
            return self.hold(x)
        if not np.isfinite(a).all():
            self.counts["non_finite"] += 1
            return self.hold(x)
        requested = a.copy()
        if (np.abs(a) > 1.0).any():
            self.counts["range"] += 1
            a = np.clip(a, -1.0, 1.0)
        g_lo, g_hi = self.spec.gripper_range
        g = a[self.grip]
        if ((g < g_lo) | (g > g_hi)).any():
            self.counts["gripper"] += 1
            a[self.grip] = np.clip(g, g_lo, g_hi)
        if self.spec.action_mode == "ee_delta":
            self._ee_delta(a, x)
        else:
            self._joint_pos(a, requested, x)
        self.last_gripper = a[self.grip].copy()
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
        pos = state[self.tcp]
        target = pos + move
        # inside the box: stop at its faces; outside: only the components that move back toward it
        lo = np.minimum(self.ws_lo, pos)
        hi = np.maximum(self.ws_hi, pos)
        clipped = np.clip(target, lo, hi)
        if (clipped != target).any():
            self.counts["workspace"] += 1
            move = clipped - pos
        a[:3] = np.clip(move / s.pos_scale, -1.0, 1.0)
        # exact after the round trip: every correction below only moves components toward zero, which
        # keeps the others' bounds (zero motion is always allowed)
        a[:3] = _shrink_to_norm(a[:3], s.pos_scale, s.max_step)
        a[3:6] = _shrink_to_norm(a[3:6], s.rot_scale, s.max_rot_step)
        for i in range(3):
            p, low, h, k = float(pos[i]), float(lo[i]), float(hi[i]), float(s.pos_scale)
            fit = _nearest_ok(lambda m: p + m * k, lambda t: t > h, lambda t: t < low, float(a[i]), -1.0, 1.0)
            a[i] = 0.0 if fit is None else fit  # None cannot happen: zero motion is inside [lo, hi]
        # outside the box not even a motion too small to change pos + move goes further out
        a[:3] = np.where(pos < self.ws_lo, np.maximum(a[:3], 0.0), a[:3])
        a[:3] = np.where(pos > self.ws_hi, np.minimum(a[:3], 0.0), a[:3])

    def joint_targets(self, a: np.ndarray) -> np.ndarray:
        """Joint targets (rad) ``[J]`` the robot decodes from joint actions ``a [J]``: ``[-1, 1]`` onto the limits."""
        return self.q_lo + (a + 1.0) * 0.5 * (self.q_hi - self.q_lo)

    def _joint_action(self, target: np.ndarray, q: np.ndarray) -> Optional[np.ndarray]:
        """Joint actions ``[J]`` in ``[-1, 1]`` decoding to targets inside the limits and within one speed
        step of ``q`` (exactly, in float64), nearest to ``target``; None when a joint has none."""
        lo, hi, dq = self.q_lo, self.q_hi, self.dq_max
        t = np.clip(target, np.maximum(lo, q - dq), np.minimum(hi, q + dq))
        a = np.clip(2.0 * (t - lo) / (hi - lo) - 1.0, -1.0, 1.0)
        back = self.joint_targets(a)
        bad = (back < lo) | (back > hi) | ~(np.abs(back - q) <= dq)
        for j in np.flatnonzero(bad):
            lj, hj, dj, qj = float(lo[j]), float(hi[j]), float(dq[j]), float(q[j])
            fit = _nearest_ok(
                lambda x: lj + (x + 1.0) * 0.5 * (hj - lj),
                lambda v: v > hj or v - qj > dj,
                lambda v: v < lj or qj - v > dj,
                float(a[j]),
                -1.0,
                1.0,
            )
            if fit is None:
                return None
            a[j] = fit
        return a

    def _checked_joint_action(self, target: np.ndarray, q: np.ndarray) -> np.ndarray:
        a = self._joint_action(target, q)
        if a is None:  # check_state rules this out; never send something unchecked
            self._unsafe("joint_out_of_range")
        return a

    def _joint_pos(self, a: np.ndarray, requested: np.ndarray, state: np.ndarray) -> None:
        q = state[self.joints]
        with np.errstate(over="ignore", invalid="ignore"):
            target = self.joint_targets(requested[: self.n])  # before the range clip: a request past the limits
        # limits first, then the speed limit; q is within one step of the limits (check_state), so the
        # result satisfies both
        lim = np.clip(target, self.q_lo, self.q_hi)
        if (lim != target).any():
            self.counts["joint_limit"] += 1
        slow = np.clip(lim, q - self.dq_max, q + self.dq_max)
        if (slow != lim).any():
            self.counts["joint_velocity"] += 1
        a[: self.n] = self._checked_joint_action(slow, q)
