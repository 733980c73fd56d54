"""Rotation helpers in numpy for the arm adapters (no simulator import on the robot PC).

Quaternions are ``w x y z`` (the state's convention) unless a name says ``xyzw`` (franky's, scipy's).
"""

from __future__ import annotations

import numpy as np


def quat_mul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Hamilton product ``a * b`` of quaternions ``[4]`` (w x y z): rotate by ``b``, then by ``a``."""
    aw, ax, ay, az = a
    bw, bx, by, bz = b
    return np.array(
        [
            aw * bw - ax * bx - ay * by - az * bz,
            aw * bx + ax * bw + ay * bz - az * by,
            aw * by - ax * bz + ay * bw + az * bx,
            aw * bz + ax * by - ay * bx + az * bw,
        ]
    )


def rotvec_to_quat(v: np.ndarray) -> np.ndarray:
    """Rotation vector ``[3]`` (axis * angle, rad) -> unit quaternion ``[4]`` (w x y z)."""
    v = np.asarray(v, np.float64)
    angle = float(np.linalg.norm(v))
    if angle < 1e-12:
        return np.array([1.0, *(0.5 * v)]) / np.sqrt(1.0 + 0.25 * angle**2)
    return np.array([np.cos(angle / 2), *(np.sin(angle / 2) * v / angle)])


def quat_to_rotvec(q: np.ndarray) -> np.ndarray:
    """Unit quaternion ``[4]`` (w x y z) -> rotation vector ``[3]`` with angle in ``[0, pi]``."""
    q = np.asarray(q, np.float64)
    q = q / np.linalg.norm(q)
    if q[0] < 0:
        q = -q
    s = float(np.linalg.norm(q[1:]))
    if s < 1e-12:
        return 2.0 * q[1:]
    return 2.0 * np.arctan2(s, q[0]) * q[1:] / s


def hemisphere(q: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """``q`` or ``-q`` (the same rotation), whichever lies in ``ref``'s hemisphere (``q . ref >= 0``),
    as the simulators give the TCP quaternion (``sims.core.quat_hemisphere``)."""
    return -q if float(np.dot(q, ref)) < 0 else q


def wxyz(q_xyzw: np.ndarray) -> np.ndarray:
    return np.asarray(q_xyzw, np.float64)[[3, 0, 1, 2]]


def xyzw(q_wxyz: np.ndarray) -> np.ndarray:
    return np.asarray(q_wxyz, np.float64)[[1, 2, 3, 0]]


def ee_delta_target(
    pos: np.ndarray, quat: np.ndarray, action: np.ndarray, pos_scale: float, rot_scale: float
) -> tuple[np.ndarray, np.ndarray]:
    """The pose ``(position [3] m, quaternion [4] w x y z)`` an ``ee_delta`` action asks for: the
    position moved by ``action[:3] * pos_scale`` and the orientation turned by the base-frame rotation
    vector ``action[3:6] * rot_scale`` (as the simulators' controller reads it)."""
    target = np.asarray(pos, np.float64) + np.asarray(action[:3], np.float64) * pos_scale
    turn = rotvec_to_quat(np.asarray(action[3:6], np.float64) * rot_scale)
    q = quat_mul(turn, np.asarray(quat, np.float64))
    return target, q / np.linalg.norm(q)
