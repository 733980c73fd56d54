"""Pure controller functions against straightforward references, with tiny arrays."""

from __future__ import annotations

import mujoco
import numpy as np
import torch

import sims
from sims.mujoco import controller as ctl


def test_damped_ik_step_matches_the_textbook_formula():
    rng = np.random.default_rng(0)
    jac = rng.normal(size=(3, 6, 7))
    err = rng.normal(size=(3, 6))
    null_dq = rng.normal(size=(3, 7))
    lam = 0.05
    pinv = np.stack([j.T @ np.linalg.inv(j @ j.T + lam**2 * np.eye(6)) for j in jac])
    expected = np.einsum("njk,nk->nj", pinv, err) + np.einsum("njk,nk->nj", np.eye(7)[None] - pinv @ jac, null_dq)
    np.testing.assert_allclose(ctl.damped_ik_step(jac, err, lam, null_dq), expected, atol=1e-10)
    np.testing.assert_allclose(ctl.damped_ik_step(jac, err, lam), np.einsum("njk,nk->nj", pinv, err), atol=1e-10)


def test_controller_gives_the_same_targets_on_numpy_and_torch():
    """The per-step controller is one code path over both libraries (the Warp backend runs it on torch)."""
    rng = np.random.default_rng(1)
    axes, anchors, tcp = rng.normal(size=(4, 7, 3)), rng.normal(size=(4, 7, 3)), rng.normal(size=(4, 3))
    q, actions = rng.uniform(-1, 1, size=(4, 7)), rng.uniform(-1, 1, size=(4, 8))
    q_home, q_low, q_high = np.zeros(7), np.full(7, -0.8), np.full(7, 0.8)
    jac = ctl.geometric_jacobian(axes, anchors, tcp)
    jac_t = ctl.geometric_jacobian(*(torch.from_numpy(a) for a in (axes, anchors, tcp)))
    np.testing.assert_allclose(jac_t.numpy(), jac, atol=1e-12)
    cfg = ctl.EEDeltaConfig()
    target = ctl.ee_delta_targets(actions, q, jac, q_home, q_low, q_high, cfg)
    target_t = ctl.ee_delta_targets(torch.from_numpy(actions), torch.from_numpy(q), jac_t, q_home, q_low, q_high, cfg)
    assert isinstance(target_t, torch.Tensor) and (np.abs(target) <= 0.8).all()
    np.testing.assert_allclose(target_t.numpy(), target, atol=1e-12)
    np.testing.assert_allclose(
        ctl.joint_position_targets(torch.from_numpy(actions)).numpy(), ctl.joint_position_targets(actions), atol=1e-12
    )
    np.testing.assert_allclose(
        ctl.gripper_target(torch.from_numpy(actions[:, 6])).numpy(), ctl.gripper_target(actions[:, 6]), atol=1e-12
    )
    quats = rng.normal(size=(4, 4))
    np.testing.assert_allclose(
        ctl.quat_mul(torch.from_numpy(quats), torch.from_numpy(quats[::-1].copy())).numpy(),
        ctl.quat_mul(quats, quats[::-1]),
        atol=1e-12,
    )


def test_geometric_jacobian_and_tcp_quaternion_match_mujoco():
    with sims.make("mujoco", task="reach", num_envs=2, cameras=()) as env:
        env.reset(seed=3)
        jac = ctl.geometric_jacobian(env.xaxis[:, env.arm_jnt], env.xanchor[:, env.arm_jnt], env.tcp_pos())
        data = mujoco.MjData(env.model)
        for i in range(2):
            env.sim.get_data(i, data)
            mujoco.mj_forward(env.model, data)
            jp, jr = np.zeros((3, env.model.nv)), np.zeros((3, env.model.nv))
            mujoco.mj_jacSite(env.model, data, jp, jr, env.tcp_site)
            np.testing.assert_allclose(jac[i, :3], jp[:, env.arm_qvel], atol=1e-9)
            np.testing.assert_allclose(jac[i, 3:], jr[:, env.arm_qvel], atol=1e-9)
        np.testing.assert_allclose(
            env.tcp_quat(), ctl.quat_hemisphere(ctl.mat_to_quat(env.tcp_mat()), ctl.TCP_HOME_QUAT), atol=1e-9
        )


def test_tcp_quaternion_is_continuous_with_the_gripper_down():
    """``w`` is ~0 with the gripper pointing down: a ``w >= 0`` sign rule flips the whole quaternion
    from one reset to the next. The home-hemisphere rule keeps it on one side."""
    with sims.make("mujoco", task="reach", num_envs=8, cameras=()) as env:
        q = env.reset(seed=0)["state"][:, 3:7].numpy()
        assert np.abs(q[:, 0]).max() < 0.05  # the gripper points down
        assert (q @ ctl.TCP_HOME_QUAT > 0.9).all()
        yaw = np.array([[0.0, 0.0, 0.0, 0.0, 0.0, 0.5, 0.0]] * 8, np.float32)  # turn the hand about z
        for _ in range(10):
            obs, *_ = env.step(torch.from_numpy(yaw))
            q_next = obs["state"][:, 3:7].numpy()
            assert np.abs(q_next - q).max() < 0.2  # no sign flip between control steps
            q = q_next
        assert (q @ ctl.TCP_HOME_QUAT < 0.95).all()  # it did turn


def test_rotation_helpers_round_trip():
    rng = np.random.default_rng(1)
    q = rng.normal(size=(5, 4))
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    mats = np.zeros((5, 9))
    for i in range(5):
        mujoco.mju_quat2Mat(mats[i], q[i])
    canon = q * np.where(q[:, :1] < 0, -1, 1)
    np.testing.assert_allclose(ctl.mat_to_quat(mats), canon, atol=1e-9)
    np.testing.assert_allclose(ctl.quat_to_mat(q), mats.reshape(5, 3, 3), atol=1e-12)
    ident = np.tile(np.eye(3), (5, 1, 1))
    assert np.allclose(ctl.rotation_error(ident, ident), 0.0)
    rv = ctl.rotation_error(ident, mats.reshape(5, 3, 3))
    assert np.all(np.linalg.norm(rv, axis=1) <= np.pi + 1e-9)
