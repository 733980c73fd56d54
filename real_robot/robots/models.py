"""Rated joint limits and speeds of the arms the adapters drive (the manufacturers' published figures).

An adapter's ``model`` option picks one; the :class:`~real_robot.robots.base.RobotSpec` it reports
carries these limits (speeds scaled by the adapter's ``speed_fraction``) to the safety filter.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from sims.registry import Registry

TAU = 2.0 * math.pi


@dataclass(frozen=True)
class ArmModel:
    joint_low: tuple[float, ...]  # rad
    joint_high: tuple[float, ...]  # rad
    joint_vel_max: tuple[float, ...]  # rad/s

    @property
    def num_joints(self) -> int:
        return len(self.joint_low)


def _symmetric(limit: float, speeds: tuple[float, ...]) -> ArmModel:
    return ArmModel(tuple(-limit for _ in speeds), tuple(limit for _ in speeds), speeds)


#: arm models by name: Franka's Panda and FR3 (libfranka's limits), Universal Robots' e-Series
#: (every joint +-360 deg; speeds per joint from the data sheets)
ARM_MODELS: Registry[ArmModel] = Registry(
    "arm model",
    {
        "panda": ArmModel(
            (-2.8973, -1.7628, -2.8973, -3.0718, -2.8973, -0.0175, -2.8973),
            (2.8973, 1.7628, 2.8973, -0.0698, 2.8973, 3.7525, 2.8973),
            (2.175, 2.175, 2.175, 2.175, 2.61, 2.61, 2.61),
        ),
        "fr3": ArmModel(
            (-2.7437, -1.7837, -2.9007, -3.0421, -2.8065, 0.5445, -3.0159),
            (2.7437, 1.7837, 2.9007, -0.1518, 2.8065, 4.5169, 3.0159),
            (2.62, 2.62, 2.62, 2.62, 5.26, 4.18, 5.26),
        ),
        "ur3e": _symmetric(TAU, (math.pi,) * 3 + (TAU,) * 3),
        "ur5e": _symmetric(TAU, (math.pi,) * 6),
        "ur10e": _symmetric(TAU, (TAU / 3,) * 2 + (math.pi,) * 4),
        "ur16e": _symmetric(TAU, (TAU / 3,) * 2 + (math.pi,) * 4),
    },
)
