"""One contract test over every registered MuJoCo task, plus the behaviours the contract promises."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch

import sims
from sims.core import ChunkResult

NUM_ENVS = 3
TASKS = sims.tasks()


def _make(task: str, **kw):
    kw.setdefault("num_envs", NUM_ENVS)
    kw.setdefault("cameras", ())
    return sims.make("mujoco", task=task, **kw)


def _check_obs(env, obs) -> None:
    assert set(obs) == set(env.observation_spec)
    for key, spec in env.observation_spec.items():
        value = obs[key]
        assert value.shape == (env.num_envs, *spec.shape), key
        assert value.dtype == spec.dtype, key
        if value.is_floating_point():
            assert torch.isfinite(value).all(), key


def test_import_sims_loads_no_backend():
    code = "import sims, sys; heavy = [m for m in ('mujoco', 'ray', 'mani_skill', 'jax', 'transformers') if m in sys.modules]; assert not heavy, heavy"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_registry_lists_tasks():
    assert {"reach", "pick_cube", "place_cube"} <= set(TASKS)
    assert "mujoco" in sims.backends()


@pytest.mark.parametrize("task", TASKS)
def test_reset_step_shapes_no_nan(task):
    with _make(task, cameras=("agentview", "wrist"), image_size=32) as env:
        obs = env.reset(seed=1)
        _check_obs(env, obs)
        assert obs["rgb"].shape == (NUM_ENVS, 2, 32, 32, 3)
        assert env.action_spec.shape == (7,)
        gen = torch.Generator().manual_seed(0)
        for _ in range(4):
            actions = torch.rand(NUM_ENVS, 7, generator=gen) * 2 - 1
            obs, reward, term, trunc, info = env.step(actions)
            _check_obs(env, obs)
            assert reward.shape == (NUM_ENVS,) and reward.dtype == torch.float32
            assert term.dtype == trunc.dtype == torch.bool
            for key in ("success", "done", "diverged"):
                assert info[key].shape == (NUM_ENVS,) and info[key].dtype == torch.bool
            assert set(info["final_obs"]) == set(obs)
        # Images show something: not a constant frame, and the two views differ.
        rgb = obs["rgb"].float()
        assert rgb.std() > 5.0
        assert (rgb[:, 0] - rgb[:, 1]).abs().mean() > 5.0
        assert not env.success_mask().any()  # the predicate is false at the start


@pytest.mark.parametrize("task", TASKS)
def test_determinism_under_seed_and_threads(task):
    def rollout(num_threads: int, seed: int):
        with _make(task, num_threads=num_threads) as env:
            obs = env.reset(seed=seed)
            gen = torch.Generator().manual_seed(7)
            states = [obs["state"]]
            for _ in range(5):
                obs, *_ = env.step(torch.rand(NUM_ENVS, 7, generator=gen) * 2 - 1)
                states.append(obs["state"])
            return torch.stack(states), obs["privileged"]

    a_states, a_priv = rollout(1, seed=3)
    b_states, b_priv = rollout(2, seed=3)
    c_states, _ = rollout(1, seed=4)
    assert torch.equal(a_states, b_states) and torch.equal(a_priv, b_priv)
    assert not torch.equal(a_states[0], c_states[0])


def test_per_env_seeds_differ_and_init_ids_are_fixed():
    with _make("pick_cube", num_envs=4) as env:
        priv = env.reset(seed=0)["privileged"]
        assert len({tuple(row[:2].tolist()) for row in priv}) == 4  # each env its own placement
        fixed = env.reset(init_ids=[5, 5, 6, 5])["privileged"]
        assert torch.equal(fixed[0], fixed[1]) and torch.equal(fixed[0], fixed[3])
        assert not torch.equal(fixed[0], fixed[2])
        again = env.reset(seed=123, init_ids=[5, 5, 6, 5])["privileged"]
        assert torch.equal(fixed, again)  # independent of the seed


def test_automatic_reset_with_final_obs():
    with _make("reach", num_envs=2, max_steps=3) as env:
        env.reset(seed=0)
        zero = torch.zeros(2, 7)
        for step in range(3):
            obs, reward, term, trunc, info = env.step(zero)
        assert trunc.all() and not term.any() and info["done"].all()
        assert info["episode"]["length"].tolist() == [3, 3]
        assert info["elapsed"].tolist() == [0, 0]
        # The returned obs is a fresh episode: the goal moved, the final obs keeps the old one.
        assert not torch.equal(obs["privileged"][:, :3], info["final_obs"]["privileged"][:, :3])
        obs, *_, info = env.step(zero)
        assert not info["done"].any() and info["elapsed"].tolist() == [1, 1]


def test_diverging_env_ends_its_episode_only():
    with _make("pick_cube", num_envs=3) as env:
        env.reset(seed=0)
        qvel = env.qvel[1].copy()
        qvel[:] = 1e12
        env.set_state(1, qvel=qvel)
        obs, reward, term, trunc, info = env.step(torch.zeros(3, 7))
        assert info["diverged"].tolist() == [False, True, False]
        assert trunc.tolist() == [False, True, False] and not term.any()
        assert env.num_diverged == 1
        assert torch.isfinite(obs["state"]).all()
        assert info["elapsed"][1] == 0  # env 1 was reset, the others continue
        assert info["elapsed"][0] == 1
        obs, *_, info = env.step(torch.zeros(3, 7))
        assert not info["diverged"].any()


def test_step_chunk_stops_each_env_at_its_end():
    with _make("reach", num_envs=2, max_steps=4) as env:
        env.reset(seed=0)
        env.step(torch.zeros(2, 7), active=torch.tensor([True, False]))  # env 0 is one step ahead
        result: ChunkResult = env.step_chunk(torch.zeros(2, 5, 7))
        assert result.step_done[0].nonzero().flatten().tolist() == [2]
        assert result.step_done[1].nonzero().flatten().tolist() == [3]
        assert result.executed[0].tolist() == [True, True, True, False, False]
        assert result.executed[1].tolist() == [True, True, True, True, False]
        assert result.truncated.all() and result.episode["length"].tolist() == [4, 4]
        # After the chunk both envs sit at the start of a new episode, not advanced past it.
        obs, *_, info = env.step(torch.zeros(2, 7))
        assert info["elapsed"].tolist() == [1, 1]


@pytest.mark.parametrize("task", ["pick_cube", "place_cube"])
def test_scripted_controller_succeeds_in_every_env(task):
    from sims.mujoco.scripted import PickPlaceExpert

    n = 4
    with _make(task, num_envs=n) as env:
        expert = PickPlaceExpert(n, place=task == "place_cube")
        obs = env.reset(seed=11)
        solved = np.zeros(n, bool)
        for _ in range(env.tasks[0].max_steps):
            obs, reward, term, trunc, info = env.step(expert.act(obs), active=torch.as_tensor(~solved))
            solved |= info["success"].numpy()
            assert not (trunc.numpy() & ~solved).any(), "an env hit its step limit without success"
            expert.reset(info["done"])
            if solved.all():
                break
        assert solved.all()
        assert env.num_diverged == 0


def test_ee_delta_moves_the_gripper_along_the_command():
    with _make("reach", num_envs=1) as env:
        env.reset(seed=0)
        start = env.tcp_pos().copy()
        action = torch.zeros(1, 7)
        action[0, 2] = 1.0  # +z
        for _ in range(4):
            env.step(action)
        moved = env.tcp_pos()[0] - start[0]
        assert moved[2] > 0.12  # ~0.05 m per step commanded
        assert np.abs(moved[:2]).max() < 0.3 * moved[2]


def test_joint_position_mode_reaches_targets_in_real_convention():
    from sims.mujoco.controller import joint_position_actions
    from sims.mujoco.robot import HOME_QPOS_REAL

    with _make("reach", num_envs=2, action_mode="joint_pos") as env:
        assert env.action_spec.shape == (8,)
        env.reset(seed=0)
        target = np.stack([HOME_QPOS_REAL, HOME_QPOS_REAL + np.array([0.3, 0.2, -0.2, 0.3, 0.2, -0.3, 0.4])])
        actions = torch.as_tensor(joint_position_actions(target, np.array([-1.0, 1.0])), dtype=torch.float32)
        for _ in range(20):
            obs, *_ = env.step(actions)
        np.testing.assert_allclose(env.arm_joints_real(), target, atol=0.02)
        assert obs["state"][0, 7] > 0.07 and obs["state"][1, 7] < 0.01  # open vs closed gripper


def test_clear_errors_on_bad_input():
    with pytest.raises(ValueError, match="unknown task 'nope'.*available"):
        sims.make("mujoco", task="nope")
    with pytest.raises(ValueError, match="unknown simulation backend"):
        sims.make("bullet", task="reach")
    with pytest.raises(ValueError, match="unknown camera"):
        _make("reach", cameras=("topdown",))
    with pytest.raises(ValueError, match="exactly one of task"):
        sims.make("mujoco")
    with _make("reach", num_envs=2) as env:
        with pytest.raises(ValueError, match=r"actions must have shape \[2, 7\]"):
            env.step(torch.zeros(2, 6))
        with pytest.raises(ValueError, match="NaN"):
            env.step(torch.full((2, 7), float("nan")))
        with pytest.raises(ValueError, match="task_ids"):
            env.reset(task_ids=[0, 5])


def test_render_quality_changes_only_round_silhouettes():
    with pytest.raises(ValueError, match="render_quality must be one of"):
        sims.make("mujoco", task="pick_cube", num_envs=1, cameras=(), render_quality="ultra")
    images = {}
    for quality in ("fast", "full"):
        with sims.make("mujoco", task="pick_cube", num_envs=1, image_size=64, render_quality=quality, seed=3) as env:
            images[quality] = env.reset(init_ids=[0])["rgb"].numpy().astype(int)
            assert env.render_quality == quality
            assert (env.model.vis.quality.numslices, env.model.vis.quality.numstacks) == sims.mujoco.env.RENDER_QUALITY[
                quality
            ]
    diff = np.abs(images["fast"] - images["full"])
    assert diff.any()  # the coarser primitives are drawn
    assert diff.mean() < 1.5 and (diff.max(axis=-1) > 30).mean() < 0.02  # a pixel on the edges, no more


def test_osmesa_fallback_renders():
    code = (
        "import sims\n"
        "env = sims.make('mujoco', task='pick_cube', num_envs=1, image_size=24)\n"
        "rgb = env.reset()['rgb']\n"
        "assert rgb.shape == (1, 2, 24, 24, 3) and rgb.float().std() > 5, rgb.float().std()\n"
    )
    import os

    env = dict(os.environ, MUJOCO_GL="osmesa")
    env.pop("PYOPENGL_PLATFORM", None)
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr


def test_privileged_state_obs_appends_object_state_everywhere():
    with sims.make("mujoco", task="pick_cube", num_envs=2, cameras=(), max_steps=2, state_obs="privileged") as env:
        assert env.observation_spec["state"].shape == (15 + 10,)
        obs = env.reset(seed=0)
        torch.testing.assert_close(obs["state"], torch.cat([obs["state"][:, :15], obs["privileged"]], 1))
        assert not torch.equal(obs["state"][:, 15:18], torch.zeros(2, 3))  # the cube's position is there
        res = env.step_chunk(torch.zeros(2, 3, 7))
        assert res.done.all()  # the final observation is widened too, and keeps the old episode's cube
        torch.testing.assert_close(res.final_obs["state"][:, 15:], res.final_obs["privileged"])
        torch.testing.assert_close(res.obs["state"][:, 15:], res.obs["privileged"])
        assert env.tasks[0].name == "pick_cube" and env.num_envs == 2  # the wrapped env's attributes
    with pytest.raises(ValueError, match="state_obs must be one of"):
        sims.make("mujoco", task="pick_cube", state_obs="objects")
