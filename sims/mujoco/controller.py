"""Controllers: map normalised actions in [-1, 1] to servo targets, batched over envs.

Pure functions over ``[N, ...]`` arrays, no loop over environments; the ones the env calls each
control step take numpy arrays or torch tensors alike (:mod:`sims.mujoco.arrays`).

End-effector delta pose (default, 7-D, as LIBERO): ``(dx, dy, dz, droll, dpitch, dyaw, gripper)``.
Position deltas scale to ``pos_scale`` metres and rotation deltas (a world-frame rotation vector)
to ``rot_scale`` radians per control step. Joint targets come from one damped-least-squares
inverse-kinematics step with a null-space pull toward the home posture; the joint servos track
them during the control step's physics substeps. Gripper: -1 open, +1 closed.

Joint position (8-D): seven arm angles in the real Panda's convention, mapped affinely from
[-1, 1] to the real joint limits, and the gripper.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from sims.core import quat_hemisphere  # noqa: F401  (re-exported: the TCP quaternion convention)
from sims.mujoco.arrays import like, xp_of
from sims.mujoco.robot import FINGER_MAX, REAL_JOINT_LOWER, REAL_JOINT_UPPER, to_sim_joints


@dataclass(frozen=True)
class EEDeltaConfig:
    """Gains of the end-effector delta controller.

    Attributes:
        pos_scale: metres per unit action per control step (LIBERO's OSC uses 0.05).
        rot_scale: radians per unit action per control step (LIBERO: 0.5).
        damping: damped least squares lambda (keeps IK finite near singularities).
        null_gain: fraction of the distance to the home posture removed per step in the null space.
        max_joint_step: cap on any joint's target change per step (rad).
    """

    pos_scale: float = 0.05
    rot_scale: float = 0.5
    damping: float = 0.05
    null_gain: float = 0.1
    max_joint_step: float = 0.3


def geometric_jacobian(axes: Any, anchors: Any, point: Any) -> Any:
    """Jacobian ``[N, 6, J]`` of a point on the last link of a chain of hinge joints.

    Args:
        axes: ``[N, J, 3]`` joint axes in world frame.
        anchors: ``[N, J, 3]`` joint anchor points in world frame.
        point: ``[N, 3]`` the point (e.g. the TCP).
    """
    xp = xp_of(axes)
    r = point[:, None, :] - anchors  # [N, J, 3]
    ax, ay, az = axes[..., 0], axes[..., 1], axes[..., 2]
    rx, ry, rz = r[..., 0], r[..., 1], r[..., 2]
    # axis x r, written out: np.cross costs 3x more on these small arrays
    linear = xp.stack([ay * rz - az * ry, az * rx - ax * rz, ax * ry - ay * rx], axis=1)  # [N, 3, J]
    return xp.concat([linear, xp.permute_dims(axes, (0, 2, 1))], axis=1)


def damped_ik_step(jac: Any, err: Any, damping: float, null_dq: Any | None = None) -> Any:
    """One damped least-squares step ``dq = J^T (J J^T + lambda^2 I)^-1 err`` ``[N, J]``.

    Args:
        jac: ``[N, 6, J]``.
        err: ``[N, 6]`` desired (linear, angular) displacement.
        damping: lambda.
        null_dq: optional ``[N, J]`` secondary motion projected into the Jacobian's null space.
    """
    xp = xp_of(jac)
    jt = xp.permute_dims(jac, (0, 2, 1))
    jjt = jac @ jt + like(damping**2 * np.eye(6), jac)
    if null_dq is None:
        return (jt @ xp.linalg.solve(jjt, err[..., None]))[..., 0]
    # one solve for both right-hand sides: dq = J^+ err + (I - J^+ J) null_dq
    rhs = xp.stack([err, (jac @ null_dq[..., None])[..., 0]], axis=2)  # [N, 6, 2]
    sol = jt @ xp.linalg.solve(jjt, rhs)  # [N, J, 2]
    return sol[..., 0] + null_dq - sol[..., 1]


def gripper_target(command: Any) -> Any:
    """Finger position target ``[N]`` (m) from a command in [-1 open, +1 closed]."""
    return FINGER_MAX * (1.0 - xp_of(command).clip(command, -1.0, 1.0)) * 0.5


def ee_delta_targets(
    actions: Any,
    q: Any,
    jac: Any,
    q_home: np.ndarray,
    q_low: np.ndarray,
    q_high: np.ndarray,
    cfg: EEDeltaConfig,
) -> Any:
    """Arm joint targets ``[N, 7]`` for end-effector delta actions ``[N, 7]``.

    Args:
        actions: ``[N, 7]`` in [-1, 1] (the gripper column is ignored here).
        q: ``[N, 7]`` current arm angles (simulation convention).
        jac: ``[N, 6, 7]`` TCP Jacobian.
        q_home: ``[7]`` posture the null space is pulled toward.
        q_low, q_high: ``[7]`` joint limits.

    ``actions``, ``q`` and ``jac`` are numpy arrays or torch tensors (one library for all three).
    """
    xp = xp_of(q)
    err = xp.concat([actions[:, :3] * cfg.pos_scale, actions[:, 3:6] * cfg.rot_scale], axis=1)
    null_dq = cfg.null_gain * (like(q_home, q)[None] - q)
    dq = damped_ik_step(jac, err, cfg.damping, null_dq)
    dq = xp.clip(dq, -cfg.max_joint_step, cfg.max_joint_step)
    return xp.clip(q + dq, like(q_low, q), like(q_high, q))


def joint_position_targets(actions: Any) -> Any:
    """Arm joint targets ``[N, 7]`` (simulation convention) from ``[N, 8]`` joint actions."""
    a = xp_of(actions).clip(actions[:, :7], -1.0, 1.0)
    low, high = like(REAL_JOINT_LOWER, a), like(REAL_JOINT_UPPER, a)
    q_real = low + (a + 1.0) * 0.5 * (high - low)
    return to_sim_joints(q_real)


def joint_position_actions(q_real: np.ndarray, gripper: np.ndarray) -> np.ndarray:
    """Inverse of :func:`joint_position_targets`: real angles ``[N, 7]`` -> actions ``[N, 8]``."""
    a = 2.0 * (q_real - REAL_JOINT_LOWER) / (REAL_JOINT_UPPER - REAL_JOINT_LOWER) - 1.0
    return np.concatenate([a, gripper[:, None]], axis=1)


def quat_mul(a: Any, b: Any) -> Any:
    """Hamilton product of quaternions ``[..., 4]`` (w, x, y, z), numpy or torch (one library for both)."""
    aw, ax, ay, az = a[..., 0], a[..., 1], a[..., 2], a[..., 3]
    bw, bx, by, bz = b[..., 0], b[..., 1], b[..., 2], b[..., 3]
    return xp_of(a).stack(
        [
            aw * bw - ax * bx - ay * by - az * bz,
            aw * bx + ax * bw + ay * bz - az * by,
            aw * by - ax * bz + ay * bw + az * bx,
            aw * bz + ax * by - ay * bx + az * bw,
        ],
        axis=-1,
    )


#: The TCP orientation at the home pose (gripper pointing down, hand turned -45 deg about z), w x y z.
TCP_HOME_QUAT = np.array([0.0, 0.92388, -0.382683, 0.0])


def mat_to_quat(mat: np.ndarray) -> np.ndarray:
    """Rotation matrices ``[N, 9]`` (row-major) -> unit quaternions ``[N, 4]`` (w, x, y, z), w >= 0."""
    m = mat.reshape(-1, 3, 3)
    tr = m[:, 0, 0] + m[:, 1, 1] + m[:, 2, 2]
    cand = np.stack(
        [
            1.0 + tr,
            1.0 + m[:, 0, 0] - m[:, 1, 1] - m[:, 2, 2],
            1.0 - m[:, 0, 0] + m[:, 1, 1] - m[:, 2, 2],
            1.0 - m[:, 0, 0] - m[:, 1, 1] + m[:, 2, 2],
        ],
        axis=1,
    )
    k = np.argmax(cand, axis=1)
    s = np.sqrt(np.maximum(cand[np.arange(len(k)), k], 1e-12)) * 2.0  # 4*|component|
    q = np.empty((len(k), 4))
    w = np.stack(
        [s / 4, (m[:, 2, 1] - m[:, 1, 2]) / s, (m[:, 0, 2] - m[:, 2, 0]) / s, (m[:, 1, 0] - m[:, 0, 1]) / s], 1
    )
    x = np.stack(
        [(m[:, 2, 1] - m[:, 1, 2]) / s, s / 4, (m[:, 0, 1] + m[:, 1, 0]) / s, (m[:, 0, 2] + m[:, 2, 0]) / s], 1
    )
    y = np.stack(
        [(m[:, 0, 2] - m[:, 2, 0]) / s, (m[:, 0, 1] + m[:, 1, 0]) / s, s / 4, (m[:, 1, 2] + m[:, 2, 1]) / s], 1
    )
    z = np.stack(
        [(m[:, 1, 0] - m[:, 0, 1]) / s, (m[:, 0, 2] + m[:, 2, 0]) / s, (m[:, 1, 2] + m[:, 2, 1]) / s, s / 4], 1
    )
    for idx, cand_q in enumerate((w, x, y, z)):
        q[k == idx] = cand_q[k == idx]
    q *= np.where(q[:, :1] < 0, -1.0, 1.0)
    return q / np.linalg.norm(q, axis=1, keepdims=True)


def quat_to_rotvec(quat: np.ndarray) -> np.ndarray:
    """Unit quaternions ``[N, 4]`` (w, x, y, z) -> rotation vectors ``[N, 3]`` (angle in [0, pi])."""
    q = quat * np.where(quat[:, :1] < 0, -1.0, 1.0)
    sin_half = np.linalg.norm(q[:, 1:], axis=1)
    angle = 2.0 * np.arctan2(sin_half, q[:, 0])
    scale = np.where(sin_half > 1e-9, angle / np.maximum(sin_half, 1e-12), 2.0)
    return q[:, 1:] * scale[:, None]


def rotation_error(current: np.ndarray, desired: np.ndarray) -> np.ndarray:
    """World-frame rotation vector ``[N, 3]`` taking ``current`` to ``desired`` (``[N, 3, 3]``)."""
    err = desired @ current.transpose(0, 2, 1)
    return quat_to_rotvec(mat_to_quat(err.reshape(-1, 9)))


def quat_to_mat(q: np.ndarray) -> np.ndarray:
    """Unit quaternions ``[N, 4]`` (w, x, y, z) -> rotation matrices ``[N, 3, 3]``."""
    w, x, y, z = q[:, 0], q[:, 1], q[:, 2], q[:, 3]
    return np.stack(
        [
            1 - 2 * (y * y + z * z),
            2 * (x * y - z * w),
            2 * (x * z + y * w),
            2 * (x * y + z * w),
            1 - 2 * (x * x + z * z),
            2 * (y * z - x * w),
            2 * (x * z - y * w),
            2 * (y * z + x * w),
            1 - 2 * (x * x + y * y),
        ],
        axis=1,
    ).reshape(-1, 3, 3)
