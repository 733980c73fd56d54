"""``check``: the first thing to run on hardware. Connect, read the spec and the state, verify them,
hold, disconnect; nothing here ever calls ``send_action``, so the arm is not commanded to move.

Verified: the spec is sound (:meth:`RobotSpec.problems`: joint count, limits, indices), every
reading is a finite ``[S]`` vector, every joint lies inside its limits and the tool centre point
inside the workspace box (strictly, no plausibility margin), the safety filter accepts the state,
every camera of the spec gives ``[H, W, 3]`` uint8 frames of its size, the driver reports no fault,
and the arm stays put while held (no joint moves by more than ``hold_tolerance_rad``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from real_robot.robots.base import Robot, RobotSpec
from real_robot.safety import SafetyFilter


@dataclass
class CheckReport:
    """What :func:`check_robot` found: ``failures`` (empty: passed), ``notes`` (what was read)."""

    robot: str
    failures: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    spec: dict[str, Any] = field(default_factory=dict)
    state: list[float] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failures

    def lines(self) -> list[str]:
        return [f"  ok    {n}" for n in self.notes] + [f"  FAIL  {f}" for f in self.failures]


def _state_failures(spec: RobotSpec, state: np.ndarray) -> list[str]:
    out = []
    if state.shape != (spec.state_dim,) or not np.isfinite(state).all():
        return [f"the state must be {spec.state_dim} finite numbers, got shape {list(state.shape)}: {state}"]
    if spec.joint_slice is not None:
        q, lo, hi = state[spec.joint_slice], np.asarray(spec.joint_low), np.asarray(spec.joint_high)
        for j in np.flatnonzero((q < lo) | (q > hi)):
            out.append(f"joint {j + 1} reads {q[j]:.4f} rad, outside its limits [{lo[j]:.4f}, {hi[j]:.4f}]")
    if spec.tcp_slice is not None:
        p, lo, hi = state[spec.tcp_slice], np.asarray(spec.workspace_low), np.asarray(spec.workspace_high)
        if ((p < lo) | (p > hi)).any():
            box = f"{lo.tolist()}..{hi.tolist()}"
            out.append(f"the tool centre point {np.round(p, 4).tolist()} m lies outside the workspace box {box}")
    reason = SafetyFilter(spec).check_state(state)
    if reason is not None:
        out.append(f"the safety filter refuses this state ({reason})")
    return out


def _image_failures(spec: RobotSpec, images: dict[str, np.ndarray]) -> list[str]:
    out = []
    for cam, (h, w) in spec.cameras.items():
        img = images.get(cam)
        if img is None:
            out.append(f"camera {cam!r} of the spec sent no frame")
        elif not isinstance(img, np.ndarray) or img.dtype != np.uint8 or img.shape != (h, w, 3):
            got = f"{getattr(img, 'dtype', type(img).__name__)} {list(getattr(img, 'shape', []))}"
            out.append(f"camera {cam!r} sent {got}, the spec says uint8 [{h}, {w}, 3]")
    return out


def check_robot(robot: Robot, reads: int = 3, hold_s: float = 0.5, hold_tolerance_rad: float = 0.02) -> CheckReport:
    """Connect ``robot``, verify what it reports (see the module doc), hold it, disconnect; no motion."""
    report = CheckReport(robot=type(robot).__name__)
    robot.connect()
    try:
        spec = robot.spec
        report.spec = spec.to_dict()
        problems = spec.problems()
        report.failures += [f"spec: {p}" for p in problems]
        report.notes.append(
            f"spec {spec.name}: {spec.num_joints} joints, action {spec.action_mode} [{spec.action_dim}], "
            f"state [{spec.state_dim}], {spec.control_hz:g} Hz, cameras {sorted(spec.cameras)}"
        )
        if problems:
            return report
        first = None
        for _ in range(max(reads, 1)):
            obs = robot.observe()
            state = np.asarray(obs.state, np.float64)
            first = state if first is None else first
            report.failures += _state_failures(spec, state) + _image_failures(spec, obs.images)
            if report.failures:
                break
        report.state = state.tolist()
        names = spec.names()[0]
        report.notes.append("state " + ", ".join(f"{n}={v:.4g}" for n, v in zip(names, state)))
        report.failures += [f"driver: {f}" for f in getattr(robot, "faults", lambda: [])()]
        robot.hold()
        time.sleep(hold_s)
        after = np.asarray(robot.observe().state, np.float64)
        if spec.joint_slice is not None and after.shape == first.shape:
            moved = float(np.abs(after[spec.joint_slice] - first[spec.joint_slice]).max())
            if moved > hold_tolerance_rad:
                report.failures.append(
                    f"a joint moved {moved:.4f} rad while the arm was held (tolerance {hold_tolerance_rad})"
                )
            else:
                report.notes.append(f"held still: joints moved at most {moved:.4f} rad")
    finally:
        robot.disconnect()
    return report
