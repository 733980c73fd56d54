"""LIBERO's action space: robosuite 1.4's OSC_POSE controller and Panda gripper, batched over envs.

A LIBERO action ``[7]`` in [-1, 1] is a delta end-effector pose and a gripper command. Per control
step (20 Hz) robosuite sets a goal once, then for each of the 25 physics substeps (2 ms) computes
operational-space torques toward it. This module is that controller, written from robosuite's
``OperationalSpaceController`` (``controllers/osc.py``, ``utils/control_utils.py``) and
``PandaGripper.format_action``, with its defaults as LIBERO configures them:

- the action is clipped to [-1, 1] and scaled to 0.05 m and 0.5 rad per step;
- the position goal is the current end-effector position plus the delta; the orientation goal is the
  delta rotation (axis-angle, world frame) applied to the current orientation, and is left unchanged
  when all three rotation deltas are exactly zero (so the goal of an earlier step is kept);
- torques ``J^T [Lambda_pos F, Lambda_ori T] + qfrc_bias + N^T M (kp_null (q_null - q) - kd_null qd)``
  with ``F = kp (goal_pos - pos) - kd v``, ``T = kp e_ori - kd w`` (kp 150, kd = 2 sqrt(kp),
  null-space kp 10, kd 2 sqrt(10)), clipped to the motors' range;
- the gripper command moves by 0.01 per substep toward +1 (close) or -1 (open) by the sign of the
  action, and drives the two finger position servos across their control ranges.

The maths are pure functions over ``[N, ...]`` numpy arrays, one vectorised computation per substep
for all envs (robosuite's pinv of the operational-space inertias by LU inverses where the two are the
same, :func:`psd_inverse`); :class:`OSCArm` gathers what they need from the simulations of one LIBERO
scene (:class:`sims.libero.physics.BatchPhysics`) and plays control steps on them, with the hidden
state robosuite keeps outside the simulator state (orientation goal, null-space posture, gripper command).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

import mujoco
import numpy as np

from sims.libero.physics import BatchPhysics, as_index
from sims.mujoco.controller import quat_to_mat

#: the Panda of LIBERO's scenes (robosuite's ``MountedPanda`` with its ``PandaGripper``)
EEF_SITE = "gripper0_grip_site"
ARM_JOINTS = tuple(f"robot0_joint{i}" for i in range(1, 8))
GRIPPER_JOINTS = ("gripper0_finger_joint1", "gripper0_finger_joint2")
#: ``MountedPanda.init_qpos``: the posture the null-space torques pull toward (robosuite adds its
#: initialisation noise to it at a reset; LIBERO's env, measured, does not)
INIT_QPOS = (0.0, -0.161037389, 0.0, -2.44459747, 0.0, 2.22675220, np.pi / 4)
#: ``PandaGripper.init_qpos``: the fingers' opening at a reset
GRIPPER_INIT_QPOS = (0.020833, -0.020833)


@dataclass(frozen=True)
class OSCConfig:
    """OSC_POSE as LIBERO configures it (robosuite's ``osc_pose.json``, ``control_freq=20``)."""

    kp: float = 150.0
    damping_ratio: float = 1.0
    output_max: tuple[float, ...] = (0.05, 0.05, 0.05, 0.5, 0.5, 0.5)  # metres, radians per step at |a| = 1
    nullspace_kp: float = 10.0
    substeps: int = 25  # physics steps per control step (0.05 s / 0.002 s)
    gripper_speed: float = 0.01  # gripper command change per substep
    init_qpos: tuple[float, ...] = field(default=INIT_QPOS)

    @property
    def kd(self) -> float:
        return 2.0 * float(np.sqrt(self.kp)) * self.damping_ratio


# -- pure maths over [N, ...] arrays -----------------------------------------------------------------


def scale_action(action: np.ndarray, cfg: OSCConfig = OSCConfig()) -> np.ndarray:
    """Arm actions ``[N, 6]`` clipped to [-1, 1] and scaled to metres / radians ``[N, 6]``."""
    return np.clip(action, -1.0, 1.0) * np.asarray(cfg.output_max)


def axisangle_to_matrix(vec: np.ndarray) -> np.ndarray:
    """Rotation matrices ``[N, 3, 3]`` of axis-angle vectors ``[N, 3]`` (identity for a zero vector),
    through the unit quaternion as robosuite computes them."""
    vec = np.asarray(vec, dtype=np.float64)
    angle = np.linalg.norm(vec, axis=-1)
    axis = vec / np.where(np.isclose(angle, 0.0), 1.0, angle)[:, None]
    return quat_to_mat(np.concatenate([np.cos(angle / 2)[:, None], np.sin(angle / 2)[:, None] * axis], axis=1))


#: the entries (2, 1), (0, 2), (1, 0) of a skew-symmetric matrix: the vector it crosses with
_VEE = (np.array([2, 0, 1]), np.array([1, 2, 0]))


def orientation_error(desired: np.ndarray, current: np.ndarray) -> np.ndarray:
    """robosuite's orientation error ``[N, 3]`` between rotation matrices ``[N, 3, 3]``:
    ``0.5 * sum_i current[:, i] x desired[:, i]``, computed as the vector of the skew-symmetric
    ``0.5 * (D C^T - C D^T)`` (the same sum, one matrix product)."""
    k = desired @ np.swapaxes(current, -1, -2)
    return 0.5 * (k - np.swapaxes(k, -1, -2))[:, _VEE[0], _VEE[1]]


def update_goal(
    scaled: np.ndarray, ee_pos: np.ndarray, ee_mat: np.ndarray, goal_mat: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """The goal of a control step: position ``[N, 3]`` = current + delta; orientation ``[N, 3, 3]`` =
    delta rotation times current, or ``goal_mat`` (the earlier goal) where the rotation delta is all zero.

    Args:
        scaled: scaled arm actions ``[N, 6]`` (:func:`scale_action`).
        ee_pos, ee_mat: the end effector's position ``[N, 3]`` and orientation ``[N, 3, 3]`` now.
        goal_mat: the orientation goal so far ``[N, 3, 3]``.
    """
    rotate = (scaled[:, 3:] != 0.0).any(axis=-1)
    new_mat = np.where(rotate[:, None, None], axisangle_to_matrix(scaled[:, 3:]) @ ee_mat, goal_mat)
    return ee_pos + scaled[:, :3], new_mat


#: the bound on a matrix's condition number above which :func:`psd_inverse` leaves it to
#: ``np.linalg.pinv`` (below it the LU inverse is pinv's result to within about ``cond * 1e-16``, relative)
PINV_COND = 1e8


def _lu_inverse(a: np.ndarray, max_cond: float) -> tuple[np.ndarray, np.ndarray]:
    """LU inverses of matrices ``[N, k, k]`` and which rows ``[N]`` are singular or may have a condition
    number above ``max_cond`` (their inverses are not to be used). The bound is the product of the
    sums of the absolute entries of the matrix and of its inverse: at least the 1-, 2- and inf-norm
    condition numbers, at most ``k^2`` times the 1-norm one."""
    try:
        inv = np.linalg.inv(a)
    except np.linalg.LinAlgError:  # an exactly singular row (LU's zero pivot, so a zero determinant)
        inv = np.full_like(a, np.nan)
        regular = np.linalg.det(a) != 0.0
        if regular.any():
            inv[regular] = np.linalg.inv(a[regular])
    n = len(a)
    with np.errstate(invalid="ignore", over="ignore"):
        cond = np.abs(a).reshape(n, -1).sum(axis=1) * np.abs(inv).reshape(n, -1).sum(axis=1)
    return inv, ~(cond <= max_cond)  # NaN (a singular row) included


def psd_inverse(a: np.ndarray, max_cond: float = PINV_COND) -> np.ndarray:
    """``np.linalg.pinv`` of matrices ``[N, k, k]`` (robosuite inverts the operational-space inertias
    ``J M^-1 J^T`` with it) at the cost of an LU inverse: the rows that are singular or whose condition
    number may exceed ``max_cond`` (near a kinematic singularity) are inverted by pinv itself, the
    others, where pinv and the inverse agree, by ``np.linalg.inv``."""
    inv, bad = _lu_inverse(a, max_cond)
    if bad.any():
        inv[bad] = np.linalg.pinv(a[bad])
    return inv


def opspace_inverses(lam_inv: np.ndarray, max_cond: float = PINV_COND) -> tuple[np.ndarray, np.ndarray]:
    """robosuite's three operational-space inertias from ``lam_inv = J M^-1 J^T [N, 6, 6]``: the full
    one ``pinv(lam_inv) [N, 6, 6]`` and the block-diagonal ``[N, 6, 6]`` of the position and orientation
    ones (``pinv`` of its diagonal 3x3 blocks), each as :func:`psd_inverse` computes it, in one LU call
    (the inverse of a block-diagonal matrix is that of its blocks)."""
    n = len(lam_inv)
    stacked = np.zeros((2 * n, 6, 6))
    stacked[:n] = lam_inv
    stacked[n:, :3, :3], stacked[n:, 3:, 3:] = lam_inv[:, :3, :3], lam_inv[:, 3:, 3:]
    inv, bad = _lu_inverse(stacked, max_cond)
    full, blocks = inv[:n], inv[n:]
    if bad[:n].any():
        full[bad[:n]] = np.linalg.pinv(lam_inv[bad[:n]])
    redo = bad[n:]
    if redo.any():  # each block by itself, as robosuite (pinv's cut-off is relative to the block's norm)
        blocks[redo] = 0.0
        blocks[redo, :3, :3] = np.linalg.pinv(lam_inv[redo, :3, :3])
        blocks[redo, 3:, 3:] = np.linalg.pinv(lam_inv[redo, 3:, 3:])
    return full, blocks


def osc_torques(
    mass: np.ndarray,
    jac: np.ndarray,
    pos_err: np.ndarray,
    ori_err: np.ndarray,
    ee_vel: np.ndarray,
    q: np.ndarray,
    qd: np.ndarray,
    q_null: np.ndarray,
    bias: np.ndarray,
    cfg: OSCConfig = OSCConfig(),
) -> np.ndarray:
    """Operational-space torques ``[N, 7]`` with decoupled position and orientation, gravity and
    Coriolis compensation and a null-space pull toward ``q_null`` (before clipping to the motors).

    robosuite's ``opspace_matrices`` and ``nullspace_torques``, batched: ``M^-1 J^T`` by a solve, the
    operational-space inertias by :func:`opspace_inverses` (pinv's results), and the null-space
    projection applied as ``N^T v = v - J^T (Jbar^T v)`` rather than formed.

    Args:
        mass: the arm's joint-space inertia ``[N, 7, 7]``.
        jac: the end-effector Jacobian ``[N, 6, 7]`` (translation rows, then rotation rows).
        pos_err, ori_err: goal minus current position ``[N, 3]``; :func:`orientation_error` ``[N, 3]``.
        ee_vel: the end effector's linear and angular velocity ``[N, 6]``.
        q, qd: the arm's joint positions and velocities ``[N, 7]``.
        q_null: the null-space posture ``[N, 7]``.
        bias: the arm dofs' ``qfrc_bias`` ``[N, 7]``.
    """
    desired = np.concatenate([pos_err, ori_err], axis=1)
    desired = (cfg.kp * desired - cfg.kd * ee_vel)[..., None]  # the desired force and torque [N, 6, 1]
    jt = np.swapaxes(jac, -1, -2)
    m_inv_jt = np.linalg.solve(mass, jt)  # [N, 7, 6]
    lam_full, lam_blocks = opspace_inverses(jac @ m_inv_jt)
    kv = 2.0 * np.sqrt(cfg.nullspace_kp)
    pose = mass @ (cfg.nullspace_kp * (q_null - q) - kv * qd)[..., None]  # [N, 7, 1]
    jbar_t_pose = np.swapaxes(lam_full, -1, -2) @ (np.swapaxes(m_inv_jt, -1, -2) @ pose)  # Jbar = M^-1 J^T Lambda
    return (jt @ (lam_blocks @ desired - jbar_t_pose) + pose)[..., 0] + bias


def gripper_step(action: np.ndarray, cfg: OSCConfig = OSCConfig()) -> np.ndarray:
    """The change ``[N, 2]`` one substep of gripper actions ``[N]`` asks of the gripper command."""
    return np.array([-1.0, 1.0]) * cfg.gripper_speed * np.sign(action)[:, None]


def gripper_command(command: np.ndarray, action: np.ndarray, cfg: OSCConfig = OSCConfig()) -> np.ndarray:
    """The gripper command ``[N, 2]`` after one substep of gripper actions ``[N]`` (robosuite's
    ``PandaGripper.format_action``: -1 open, +1 closed, by the action's sign)."""
    return np.clip(command + gripper_step(action, cfg), -1.0, 1.0)


# -- the arm of a LIBERO scene ----------------------------------------------------------------------


class OSCArm:
    """OSC_POSE on the Panda of one LIBERO scene, for a batch of simulations of that model (:meth:`physics`).

    Hidden state per env (robosuite keeps it in the controller, not the simulator): the orientation
    goal ``goal_mat [N, 3, 3]``, the null-space posture ``q_null [N, 7]`` and the gripper command
    ``gripper [N, 2]``; :meth:`reset` sets it.
    """

    def __init__(self, model: mujoco.MjModel, cfg: OSCConfig = OSCConfig()) -> None:
        self.model, self.cfg = model, cfg

        def ident(kind: mujoco.mjtObj, name: str) -> int:
            i = mujoco.mj_name2id(model, kind, name)
            if i < 0:
                raise ValueError(
                    f"this model has no {kind.name[6:].lower()} {name!r}: not a LIBERO scene with "
                    "robosuite's Panda (load one with sims.libero.scenes.load_scene)"
                )
            return i

        self.site = ident(mujoco.mjtObj.mjOBJ_SITE, EEF_SITE)
        joints = [ident(mujoco.mjtObj.mjOBJ_JOINT, j) for j in ARM_JOINTS]
        self.joint_ids = np.array(joints)
        self.qpos_idx = np.array([model.jnt_qposadr[j] for j in joints])
        self.dof_idx = np.array([model.jnt_dofadr[j] for j in joints])
        by_joint = {int(model.actuator_trnid[a, 0]): a for a in range(model.nu)}
        self.arm_act = np.array([by_joint[j] for j in joints])
        self.grip_act = np.array([by_joint[ident(mujoco.mjtObj.mjOBJ_JOINT, j)] for j in GRIPPER_JOINTS])
        self._actuators = as_index(np.concatenate([self.arm_act, self.grip_act]))  # the controls a substep sets
        lo, hi = model.actuator_ctrlrange[self.arm_act].T
        self.torque_lo, self.torque_hi = lo.copy(), hi.copy()
        g_lo, g_hi = model.actuator_ctrlrange[self.grip_act].T
        self.grip_bias, self.grip_weight = 0.5 * (g_hi + g_lo), 0.5 * (g_hi - g_lo)
        self.finger_idx = np.array([model.jnt_qposadr[ident(mujoco.mjtObj.mjOBJ_JOINT, j)] for j in GRIPPER_JOINTS])
        self.goal_mat = np.zeros((0, 3, 3))
        self.q_null = np.zeros((0, 7))
        self.gripper = np.zeros((0, 2))
        self.fresh = np.zeros(0, dtype=bool)
        self._home: dict[str, np.ndarray] | None = None

    def reset(
        self,
        num_envs: int | None = None,
        *,
        rows: Sequence[int] | None = None,
        goal_mat: np.ndarray | None = None,
        q_null: np.ndarray | None = None,
        gripper: np.ndarray | None = None,
        fresh: bool = True,
    ) -> None:
        """Set the hidden state of a batch of ``num_envs`` envs, or of its envs ``rows`` (the others kept);
        the defaults are robosuite's right after LIBERO's
        reset (which builds a new controller with the arm at ``cfg.init_qpos``, then applies the init
        state). The orientation goal: default the end effector's orientation at ``cfg.init_qpos``,
        not at the init state. The null-space posture: default ``cfg.init_qpos``. The gripper
        command: default ``[0, 0]`` (a new env's; robosuite keeps it across resets, so in LIBERO's
        protocol a later episode starts with the previous one's, and the open-gripper wait steps
        bring it to ``[1, -1]`` within 4 steps).

        ``fresh``: robosuite's new controller reads the robot once, at ``cfg.init_qpos``, and the first
        substep after the reset uses that reading: the first step's position goal is the end
        effector's position at ``cfg.init_qpos`` plus the delta, and its first substep's torques come
        from that configuration at rest (with the current gravity compensation). False: continue
        from the state as it is (the goal from the current end effector).
        """
        if (num_envs is None) == (rows is None):
            raise ValueError("give num_envs (a new batch) or rows (envs of the batch set up before)")
        n = int(num_envs) if rows is None else len(rows)
        home = self.home_orientation() if goal_mat is None else goal_mat
        goal = np.broadcast_to(home, (n, 3, 3))
        null = np.broadcast_to(self.cfg.init_qpos if q_null is None else q_null, (n, 7))
        grip = np.broadcast_to([0.0, 0.0] if gripper is None else gripper, (n, 2))
        if rows is None:
            self.goal_mat = np.array(goal, dtype=np.float64)
            self.q_null = np.array(null, dtype=np.float64)
            self.gripper = np.array(grip, dtype=np.float64)
            self.fresh = np.full(n, bool(fresh))
            return
        rows = self._rows(rows, n)
        self.goal_mat[rows], self.q_null[rows], self.gripper[rows] = goal, null, grip
        self.fresh[rows] = bool(fresh)

    def physics(self, num_envs: int, nthread: int | None = None) -> BatchPhysics:
        """``num_envs`` simulations of this arm's scene for :meth:`step`."""
        return BatchPhysics(
            self.model,
            num_envs,
            site=self.site,
            arm_qpos=self.qpos_idx,
            arm_dofs=self.dof_idx,
            arm_joints=self.joint_ids,
            nthread=nthread,
        )

    def _rows(self, rows: np.ndarray, n: int) -> np.ndarray:
        rows = np.asarray(rows, dtype=np.int64).reshape(-1)
        if len(rows) != n:
            raise ValueError(f"rows names {len(rows)} envs, expected {n}")
        if len(rows) and (rows.min() < 0 or rows.max() >= len(self.goal_mat)):
            raise ValueError(
                f"rows must be in 0..{len(self.goal_mat) - 1} (the envs reset() set up), got {rows.tolist()}"
            )
        return rows

    def home_state(self) -> dict[str, np.ndarray]:
        """What a new robosuite controller reads: the arm at ``cfg.init_qpos``, the fingers at the
        gripper's initial opening, at rest (``pos [3]``, ``mat [3, 3]``, ``jac [6, 7]``, ``mass [7, 7]``,
        ``q [7]``, ``qd [7]``, ``vel [6]``)."""
        if self._home is None:
            qpos = self.model.qpos0.copy()
            qpos[self.qpos_idx] = self.cfg.init_qpos
            qpos[self.finger_idx] = GRIPPER_INIT_QPOS
            physics = self.physics(1, nthread=1)
            physics.load(np.zeros(1, np.int64), np.concatenate([[0.0], qpos, np.zeros(self.model.nv)])[None])
            s = physics.read(np.zeros(1, np.int64))
            physics.close()
            self._home = {k: v[0] for k, v in s.items() if k != "bias"}
        return self._home

    def home_orientation(self) -> np.ndarray:
        """The end effector's orientation ``[3, 3]`` with the arm at ``cfg.init_qpos``."""
        return self.home_state()["mat"].copy()

    def step(
        self,
        physics: BatchPhysics,
        actions: np.ndarray,
        rows: Sequence[int] | None = None,
        before_substep: Callable[[int], None] | None = None,
        after_substep: Callable[[int], None] | None = None,
    ) -> None:
        """One control step of ``actions [n, 7]`` on the simulations ``rows`` of ``physics`` (default all,
        in order; the others do not move): the goal set from the first substep's state, then
        ``cfg.substeps`` physics substeps with fresh torques and gripper controls each.
        ``before_substep(i)`` is called once substep ``i``'s state is read (the derived fields at its
        start), ``after_substep(i)`` once it is integrated."""
        n = physics.num_envs if rows is None else len(rows)
        actions = np.asarray(actions, dtype=np.float64)
        if actions.shape != (n, 7) or not np.isfinite(actions).all():
            raise ValueError(f"actions must be [{n}, 7] finite numbers, got {list(actions.shape)}")
        if len(self.goal_mat) != physics.num_envs:
            raise ValueError(
                f"reset() the controller for {physics.num_envs} envs first (it holds {len(self.goal_mat)})"
            )
        ids = None if rows is None else self._rows(rows, n)
        if ids is not None and n == physics.num_envs and (ids == np.arange(n)).all():
            ids = None  # every env in order: slices and views rather than gathers
        sel = slice(None) if ids is None else ids
        goal_mat, q_null, gripper, fresh = self.goal_mat[sel], self.q_null[sel], self.gripper[sel], self.fresh[sel]
        scaled = scale_action(actions[:, :6], self.cfg)
        grip_step = gripper_step(actions[:, 6], self.cfg)  # gripper_command's, the same every substep
        controls = np.empty((n, len(self.arm_act) + len(self.grip_act)))
        for sub in range(self.cfg.substeps):
            s = physics.read(ids)
            if before_substep is not None:
                before_substep(sub)
            if sub == 0:
                if fresh.any():  # robosuite's first reading after a reset: the home configuration
                    home = self.home_state()
                    for k, v in home.items():
                        s[k] = np.where(fresh.reshape((-1,) + (1,) * v.ndim), v, s[k])
                goal_pos, goal_mat = update_goal(scaled, s["pos"], s["mat"], goal_mat)
                self.goal_mat[sel] = goal_mat
            tau = osc_torques(
                s["mass"],
                s["jac"],
                goal_pos - s["pos"],
                orientation_error(goal_mat, s["mat"]),
                s["vel"],
                s["q"],
                s["qd"],
                q_null,
                s["bias"],
                self.cfg,
            )
            np.clip(tau, self.torque_lo, self.torque_hi, out=controls[:, : len(self.arm_act)])
            gripper = np.clip(gripper + grip_step, -1.0, 1.0)
            self.gripper[sel] = gripper
            controls[:, len(self.arm_act) :] = self.grip_bias + self.grip_weight * gripper
            physics.substep(ids, self._actuators, controls, last=sub == self.cfg.substeps - 1)
            if after_substep is not None:
                after_substep(sub)
        self.fresh[sel] = False
