"""The physics under LIBERO's controller: N simulations of one scene on MuJoCo's batch thread pool.

robosuite plays a control step as 25 substeps, each ``sim.forward()`` (the controller reads the
robot), torques, ``sim.step()``. :class:`BatchPhysics` does the same on a persistent
``mujoco.batch.Batch``: a substep is one threaded call that integrates and then computes the
position and velocity stages at the new state, which the next substep continues from (as
``mj_step1`` / ``mj_step2``: no stage is computed twice). The last substep of a control step leaves
the derived fields where ``mj_step`` leaves them (at the start of that substep), which is what
robosuite's goal check and observations read; the next control step computes them afresh.

The controller reads the arm from the bound arrays (no per-env Python calls); the Jacobian of the
grip site comes from the joint axes and anchors (the arm is a chain of hinges), the inertia from
the sparse mass matrix. ``datas[i]`` is an ``MjData`` copy of simulation i for everything else
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


def hinge_jacobian(axis: np.ndarray, anchor: np.ndarray, point: np.ndarray) -> np.ndarray:
    """The Jacobian ``[N, 6, J]`` (translation rows, then rotation rows) of world points ``[N, 3]`` on
    the last link of a chain of hinges with world axes and anchors ``[N, J, 3]``."""
    jacp = np.cross(axis, point[:, None, :] - anchor)
    return np.concatenate([np.swapaxes(jacp, 1, 2), np.swapaxes(axis, 1, 2)], axis=1)


class BatchPhysics:
    """``num_envs`` simulations of ``model`` stepped on ``nthread`` threads.

    Args:
        model: the scene (the batch reads it as it is at each call: edit it, then :meth:`reset` envs).
        num_envs: N.
        site: the site the controller drives (its position, orientation and Jacobian).
        arm_qpos, arm_dofs, arm_joints: the arm's qpos addresses, dof addresses and joint ids (hinges).
        nthread: threads of the batch (default one per :data:`ENVS_PER_THREAD` envs, at most the cores).
    """

    def __init__(self, model: mujoco.MjModel, num_envs: int, *, site: int, arm_qpos: np.ndarray,
                 arm_dofs: np.ndarray, arm_joints: np.ndarray, nthread: int | None = None) -> None:
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
        self.time[rows], self.qpos[rows], self.qvel[rows] = states[:, 0], states[:, 1:1 + nq], states[:, 1 + nq:]
        self.batch.forward(rows, stage=_VEL)
        self._current[rows] = True
        self.sync(rows)

    def _ensure_current(self, rows: np.ndarray) -> None:
        stale = rows[~self._current[rows]]
        if len(stale):
            self.batch.forward(stale, stage=_VEL)
            self._current[stale] = True

    def read(self, rows: np.ndarray) -> dict[str, np.ndarray]:
        """What the controller reads of simulations ``rows`` at their state now: the site's ``pos [n, 3]``,
        ``mat [n, 3, 3]``, ``jac [n, 6, 7]`` and velocity ``vel [n, 6]``, the arm's ``mass [n, 7, 7]``,
        ``q``, ``qd`` and ``bias`` (``qfrc_bias``) ``[n, 7]``."""
        self._ensure_current(rows)
        n = len(rows)
        pos = self._site_xpos[rows, self.site]
        jac = hinge_jacobian(self._xaxis[rows][:, self.arm_joints], self._xanchor[rows][:, self.arm_joints], pos)
        qd = self.qvel[rows][:, self.arm_dofs]
        return {"pos": pos, "mat": self._site_xmat[rows, self.site].reshape(n, 3, 3), "jac": jac,
                "vel": (jac @ qd[..., None])[..., 0], "mass": self._mass[rows][:, self._mass_index],
                "q": self.qpos[rows][:, self.arm_qpos], "qd": qd, "bias": self._bias[rows][:, self.arm_dofs]}

    def site_pos(self, rows: np.ndarray) -> np.ndarray:
        """The driven site's position ``[n, 3]`` (the derived fields of the last call)."""
        return self._site_xpos[rows, self.site].copy()

    def body_quat(self, rows: np.ndarray, body: int) -> np.ndarray:
        """A body's orientation ``[n, 4]`` (w, x, y, z; the derived fields of the last call)."""
        return self._xquat[rows, body].copy()

    def substep(self, rows: np.ndarray, actuators: np.ndarray, controls: np.ndarray, last: bool) -> None:
        """One physics step of simulations ``rows`` with ``controls [n, len(actuators)]``; ``last``: the
        control step's last, which leaves the derived fields at its start (as ``mj_step``)."""
        self.ctrl[np.ix_(rows, actuators)] = controls
        self.batch.step(rows, nstep=1, stage=_NONE if last else _VEL)
        self._current[rows] = not last

    def sync(self, rows: Sequence[int] | None = None) -> None:
        """Copy simulations ``rows`` (default all) into :attr:`datas`."""
        for r in range(self.num_envs) if rows is None else rows:
            self.batch.get_data(int(r), data=self.datas[r])

    def close(self) -> None:
        self.batch = None  # type: ignore[assignment]


__all__ = ["BatchPhysics", "arm_mass_index", "hinge_jacobian"]
