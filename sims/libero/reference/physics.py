"""The physics protocol both sides of the scene check run: numpy and ``mujoco`` only, so the same
code imports in the reference venv (mujoco 2.3.7, as ``reference.physics``) and in the main venv
(mujoco 4, as ``sims.libero.reference.physics``)."""

from __future__ import annotations

from typing import Any

import numpy as np

#: physics substeps of the "at rest" comparison (0.4 s at LIBERO's 2 ms timestep)
REST_SUBSTEPS = 200


def apply_state(model: Any, data: Any, state: np.ndarray) -> None:
    """Set a flattened robosuite state ``[1 + nq + nv]`` = ``[time, qpos, qvel]`` (what
    ``env.set_init_state`` does), then ``mj_forward``."""
    import mujoco

    state = np.asarray(state, dtype=np.float64)
    if state.shape != (1 + model.nq + model.nv,):
        raise ValueError(
            f"state has shape {state.shape}; this model needs (1 + nq + nv,) = ({1 + model.nq + model.nv},)"
        )
    data.time = state[0]
    data.qpos[:] = state[1 : 1 + model.nq]
    data.qvel[:] = state[1 + model.nq :]
    mujoco.mj_forward(model, data)


def rest_rollout(model: Any, data: Any, substeps: int = REST_SUBSTEPS) -> None:
    """``substeps`` physics steps "at rest" from ``data``'s state: per substep ``mj_step1``; each
    torque motor on a hinge/slide joint gets that dof's ``qfrc_bias`` (gravity and Coriolis
    compensation, as robosuite's controllers add); each position servo holds its joint's initial
    position; ctrl clipped to its range; ``mj_step2``."""
    import mujoco

    motors, servos = [], []
    for i in range(model.nu):
        joint = model.actuator_trnid[i, 0]
        if int(model.actuator_trntype[i]) != int(mujoco.mjtTrn.mjTRN_JOINT) or int(model.jnt_type[joint]) not in (
            int(mujoco.mjtJoint.mjJNT_SLIDE),
            int(mujoco.mjtJoint.mjJNT_HINGE),
        ):
            continue
        if int(model.actuator_biastype[i]) == int(mujoco.mjtBias.mjBIAS_NONE):
            motors.append((i, model.jnt_dofadr[joint], model.actuator_gear[i, 0]))
        elif int(model.actuator_biastype[i]) == int(mujoco.mjtBias.mjBIAS_AFFINE):
            servos.append((i, data.qpos[model.jnt_qposadr[joint]]))
    data.ctrl[:] = 0.0
    for i, target in servos:
        data.ctrl[i] = target
    lo, hi = model.actuator_ctrlrange[:, 0], model.actuator_ctrlrange[:, 1]
    limited = model.actuator_ctrllimited.astype(bool)
    for _ in range(substeps):
        mujoco.mj_step1(model, data)
        for i, dof, gear in motors:
            data.ctrl[i] = data.qfrc_bias[dof] / gear
        data.ctrl[limited] = np.clip(data.ctrl[limited], lo[limited], hi[limited])
        mujoco.mj_step2(model, data)
