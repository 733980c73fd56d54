"""The physics under LIBERO's controller: N simulations of one scene on MuJoCo's batch thread pool.

robosuite plays a control step as 25 substeps, each ``sim.forward()`` (the controller reads the
robot), torques, ``sim.step()``. :class:`BatchPhysics` does the same on a persistent
``mujoco.batch.Batch``: a substep is one threaded call that integrates and then computes the
position and velocity stages at the new state, which the next substep continues from (as
``mj_step1`` / ``mj_step2``: no stage is computed twice). The last substep of a control step leaves
the derived fields where ``mj_step`` leaves them (at the start of that substep), which is what
robosuite's goal check and observations read; the next control step computes them afresh.

The controller reads the arm from the bound arrays (no per-env Python calls; with every env in the
call, ``rows=None``, through slices rather than gathers); the Jacobian of the grip site comes from
the joint axes and anchors (the arm is a chain of hinges), the inertia from the sparse mass matrix. ``datas[i]`` is an ``MjData`` copy of simulation i for everything else
(goal predicates, experts, rendering), refreshed by :meth:`sync`.
"""

from __future__ import annotations

from typing import Sequence

import mujoco
import numpy as np
from mujoco import batch as mjbatch

#: envs per thread of the default thread count (fewer envs share one thread: a call's hand-off costs more)
ENVS_PER_THREAD = 4
_VEL = mujoco.mjtStage.mjSTAGE_VEL
_NONE = mujoco.mjtStage.mjSTAGE_NONE


def arm_mass_index(model: mujoco.MjModel, dofs: np.ndarray) -> np.ndarray:
    """Indices ``[D, D]`` into ``MjData.M`` (the sparse inertia) of the dense block of ``dofs``."""
    d = mujoco.MjData(model)
    d.M[:] = np.arange(1, len(d.M) + 1)
    full = np.zeros((model.nv, model.nv))
    mujoco.mj_fullM(model, d, full)
    index = full[np.ix_(dofs, dofs)].astype(np.int64) - 1
    if (index < 0).any():
        raise ValueError("the arm's inertia block has entries outside the sparse mass matrix")
    return index


def cross(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Cross products ``[..., 3]`` of vectors ``[..., 3]`` (as ``np.cross``, with less overhead on small arrays)."""
    a0, a1, a2 = a[..., 0], a[..., 1], a[..., 2]
    b0, b1, b2 = b[..., 0], b[..., 1], b[..., 2]
    return np.stack([a1 * b2 - a2 * b1, a2 * b0 - a0 * b2, a0 * b1 - a1 * b0], axis=-1)


def hinge_jacobian(axis: np.ndarray, anchor: np.ndarray, point: np.ndarray) -> np.ndarray:
    """The Jacobian ``[N, 6, J]`` (translation rows, then rotation rows) of world points ``[N, 3]`` on
    the last link of a chain of hinges with world axes and anchors ``[N, J, 3]``."""
    jac = np.empty((axis.shape[0], 6, axis.shape[1]))
    jac[:, :3] = np.swapaxes(cross(axis, point[:, None, :] - anchor), 1, 2)
    jac[:, 3:] = np.swapaxes(axis, 1, 2)
    return jac


def as_index(idx: np.ndarray) -> slice | np.ndarray:
    """Indices ``[K]`` as a slice when they are a contiguous increasing range (a view, not a gather)."""
    idx = np.asarray(idx, dtype=np.int64).reshape(-1)
    if len(idx) and (np.diff(idx) == 1).all():
        return slice(int(idx[0]), int(idx[-1]) + 1)
    return idx


class BatchPhysics:
    """``num_envs`` simulations of ``model`` stepped on ``nthread`` threads.

    Args:
        model: the scene (the batch reads it as it is at each call: edit it, then :meth:`reset` envs).
        num_envs: N.
        site: the site the controller drives (its position, orientation and Jacobian).
        arm_qpos, arm_dofs, arm_joints: the arm's qpos addresses, dof addresses and joint ids (hinges).
        nthread: threads of the batch (default one per :data:`ENVS_PER_THREAD` envs, at most the cores).
    """

    def __init__(
        self,
        model: mujoco.MjModel,
        num_envs: int,
        *,
        site: int,
        arm_qpos: np.ndarray,
        arm_dofs: np.ndarray,
        arm_joints: np.ndarray,
        nthread: int | None = None,
    ) -> None:
        import os

        if (model.jnt_type[arm_joints] != mujoco.mjtJoint.mjJNT_HINGE).any():
            raise ValueError("the arm's joints must all be hinges")
        self.model, self.num_envs = model, num_envs
        self.site, self.arm_qpos, self.arm_dofs, self.arm_joints = site, arm_qpos, arm_dofs, arm_joints
        if nthread is None:  # a thread pays off from a few envs on (a substep is one call per env batch)
            cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
            nthread = min(cores, num_envs // ENVS_PER_THREAD)
        self.batch = mjbatch.Batch(model, num_envs, nthread=max(1, min(int(nthread), num_envs)), persistent=True)
        self.batch.set_models(model)  # the caller's model, edits included, rather than a copy
        b = self.batch
        self.qpos, self.qvel, self.time, self.ctrl = b.bind("qpos"), b.bind("qvel"), b.bind("time"), b.bind("ctrl")
        self._site_xpos, self._site_xmat = b.bind("site_xpos"), b.bind("site_xmat")
        self._xaxis, self._xanchor, self._xquat = b.bind("xaxis"), b.bind("xanchor"), b.bind("xquat")
        self._mass, self._bias = b.bind("M"), b.bind("qfrc_bias")
        self._mass_index = arm_mass_index(model, arm_dofs)
        self._joints, self._qpos, self._dofs = as_index(arm_joints), as_index(arm_qpos), as_index(arm_dofs)
        self.datas = [mujoco.MjData(model) for _ in range(num_envs)]
        self._current = np.zeros(num_envs, dtype=bool)  # position and velocity stages at the state now

    def load(self, rows: np.ndarray, states: np.ndarray) -> None:
        """Simulations ``rows`` to flattened robosuite states ``[len(rows), 1 + nq + nv]`` (time, qpos,
        qvel) from the model's defaults, as ``env.set_init_state`` after a reset; derived fields current."""
        rows = np.asarray(rows, dtype=np.int64)
        states = np.asarray(states, dtype=np.float64)
        nq, nv = self.model.nq, self.model.nv
        if states.shape != (len(rows), 1 + nq + nv):
            raise ValueError(f"states must be [{len(rows)}, 1 + nq + nv = {1 + nq + nv}], got {list(states.shape)}")
        if not len(rows):
            return
        self.batch.set_models(self.model)
        self.batch.reset(rows, stage=_NONE)
        self.time[rows], self.qpos[rows], self.qvel[rows] = states[:, 0], states[:, 1 : 1 + nq], states[:, 1 + nq :]
        self.batch.forward(rows, stage=_VEL)
        self._current[rows] = True
        self.sync(rows)

    def _ensure_current(self, rows: np.ndarray | None) -> None:
        if rows is None:
            if not self._current.all():
                stale = np.flatnonzero(~self._current)
                self.batch.forward(None if len(stale) == self.num_envs else stale, stage=_VEL)
                self._current[:] = True
            return
        stale = rows[~self._current[rows]]
        if len(stale):
            self.batch.forward(stale, stage=_VEL)
            self._current[stale] = True

    def read(self, rows: np.ndarray | None = None) -> dict[str, np.ndarray]:
        """What the controller reads of simulations ``rows`` (default all, in order) at their state now,
        as new arrays: the site's ``pos [n, 3]``, ``mat [n, 3, 3]``, ``jac [n, 6, 7]`` and velocity
        ``vel [n, 6]``, the arm's ``mass [n, 7, 7]``, ``q``, ``qd`` and ``bias`` (``qfrc_bias``) ``[n, 7]``."""
        self._ensure_current(rows)
        r = slice(None) if rows is None else rows  # all rows: views of the bound arrays, one copy each
        pos = np.array(self._site_xpos[r, self.site])
        n = len(pos)
        jac = hinge_jacobian(self._xaxis[r][:, self._joints], self._xanchor[r][:, self._joints], pos)
        qd = np.array(self.qvel[r][:, self._dofs])
        return {
            "pos": pos,
            "mat": np.array(self._site_xmat[r, self.site]).reshape(n, 3, 3),
            "jac": jac,
            "vel": (jac @ qd[..., None])[..., 0],
            "mass": self._mass[r][:, self._mass_index],
            "q": np.array(self.qpos[r][:, self._qpos]),
            "qd": qd,
            "bias": np.array(self._bias[r][:, self._dofs]),
        }

    def site_pos(self, rows: np.ndarray) -> np.ndarray:
        """The driven site's position ``[n, 3]`` (the derived fields of the last call)."""
        return self._site_xpos[rows, self.site].copy()

    def body_quat(self, rows: np.ndarray, body: int) -> np.ndarray:
        """A body's orientation ``[n, 4]`` (w, x, y, z; the derived fields of the last call)."""
        return self._xquat[rows, body].copy()

    def substep(self, rows: np.ndarray | None, actuators: np.ndarray | slice, controls: np.ndarray, last: bool) -> None:
        """One physics step of simulations ``rows`` (None: all) with ``controls [n, len(actuators)]``;
        ``last``: the control step's last, which leaves the derived fields at its start (as ``mj_step``)."""
        if rows is None or isinstance(actuators, slice):
            self.ctrl[slice(None) if rows is None else rows, actuators] = controls
        else:
            self.ctrl[np.ix_(rows, actuators)] = controls
        self.batch.step(rows, nstep=1, stage=_NONE if last else _VEL)
        self._current[slice(None) if rows is None else rows] = not last

    def sync(self, rows: Sequence[int] | None = None) -> None:
        """Copy simulations ``rows`` (default all) into :attr:`datas`."""
        for r in range(self.num_envs) if rows is None else rows:
            self.batch.get_data(int(r), data=self.datas[r])

    def close(self) -> None:
        self.batch = None  # type: ignore[assignment]


__all__ = ["BatchPhysics", "arm_mass_index", "as_index", "cross", "hinge_jacobian"]
