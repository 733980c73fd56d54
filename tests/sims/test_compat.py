"""Adapters in sims/compat: gymnasium VectorEnv / Env and the RSL-RL VecEnv (tiny sizes)."""

from __future__ import annotations

import subprocess
import sys
import warnings

import gymnasium
import numpy as np
import pytest
import torch
from gymnasium.utils.env_checker import check_env
from gymnasium.vector import AutoresetMode

import sims
import sims.compat  # registers the gymnasium ids
from sims.compat import GymEnv, GymVectorEnv

NUM_ENVS = 2
REACH_STEPS = 50  # Reach.max_steps: episodes truncate there under zero actions


def _vec(env_id: str = "embodied/Reach-v0", **kw) -> GymVectorEnv:
    kw.setdefault("cameras", ())
    kw.setdefault("seed", 0)
    return gymnasium.make_vec(
        env_id, num_envs=kw.pop("num_envs", NUM_ENVS), vectorization_mode="vector_entry_point", **kw
    )


def _assert_numpy_only(tree, path="infos") -> None:
    """Every leaf of an info dict is numpy: an array, or (inside per-env final observations) a
    numpy scalar such as the ``Discrete`` ``task_id``; object arrays hold dicts or None."""
    if isinstance(tree, dict):
        for k, v in tree.items():
            _assert_numpy_only(v, f"{path}[{k!r}]")
        return
    if isinstance(tree, np.generic) and "final_obs" in path:
        return
    assert isinstance(tree, np.ndarray), f"{path} is {type(tree).__name__}, not a numpy array"
    if tree.dtype == object:
        for i, item in enumerate(tree):
            if item is not None:
                _assert_numpy_only(item, f"{path}[{i}]")


# ------------------------------------------------------------------------------ imports
def test_import_compat_registers_ids_without_loading_mujoco():
    code = (
        "import sys, sims, sims.compat, gymnasium\n"
        "assert 'mujoco' not in sys.modules and 'rsl_rl' not in sys.modules, "
        "[m for m in ('mujoco', 'rsl_rl') if m in sys.modules]\n"
        "ids = {'embodied/Reach-v0', 'embodied/PickCube-v0', 'embodied/PlaceCube-v0'}\n"
        "assert ids <= set(gymnasium.registry), ids - set(gymnasium.registry)\n"
        "spec = gymnasium.spec('embodied/PickCube-v0')\n"
        "assert spec.entry_point and spec.vector_entry_point and spec.kwargs == {'task': 'pick_cube'}\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


# ------------------------------------------------------------------------------ vector env
@pytest.mark.parametrize("env_id", ["embodied/Reach-v0", "embodied/PickCube-v0", "embodied/PlaceCube-v0"])
def test_make_vec_builds_and_steps(env_id):
    venv = _vec(env_id)
    try:
        assert isinstance(venv, GymVectorEnv) and venv.num_envs == NUM_ENVS
        assert venv.metadata["autoreset_mode"] == AutoresetMode.SAME_STEP
        assert venv.single_action_space == gymnasium.spaces.Box(-1, 1, (7,), np.float32)
        assert venv.action_space.shape == (NUM_ENVS, 7)
        assert venv.observation_space["state"].shape == (NUM_ENVS, 15)
        assert venv.observation_space["state"].dtype == np.float32
        assert set(venv.single_observation_space.keys()) == {"state", "privileged", "task_id"}

        obs, info = venv.reset(seed=1)
        assert obs in venv.observation_space and info == {}
        assert obs["task_id"].dtype == np.int64
        venv.action_space.seed(0)
        for _ in range(3):
            obs, rew, term, trunc, infos = venv.step(venv.action_space.sample())
            assert obs in venv.observation_space
            assert isinstance(rew, np.ndarray) and rew.shape == (NUM_ENVS,) and rew.dtype == np.float32
            for flag in (term, trunc):
                assert isinstance(flag, np.ndarray) and flag.dtype == np.bool_ and flag.shape == (NUM_ENVS,)
            _assert_numpy_only(infos)
            for key in ("success", "done", "diverged", "elapsed"):
                assert infos[key].shape == (NUM_ENVS,) and infos[f"_{key}"].all()
    finally:
        venv.close()
    assert venv.closed


def test_vector_seeded_reset_is_reproducible():
    venv = _vec()
    try:
        a, _ = venv.reset(seed=7)
        b, _ = venv.reset()
        c, _ = venv.reset(seed=7)
        np.testing.assert_array_equal(a["privileged"], c["privileged"])
        assert not np.array_equal(a["privileged"], b["privileged"])  # new goals without a seed
    finally:
        venv.close()


def test_same_step_autoreset_gives_final_obs():
    venv = _vec()
    try:
        obs, _ = venv.reset(seed=0)
        zeros = np.zeros(venv.action_space.shape, np.float32)
        for t in range(1, REACH_STEPS):
            obs, rew, term, trunc, infos = venv.step(zeros)
            assert not (term | trunc).any() and "final_obs" not in infos
            assert (infos["elapsed"] == t).all()
        before = obs
        obs, rew, term, trunc, infos = venv.step(zeros)
        assert trunc.all() and not term.any()
        _assert_numpy_only(infos)
        assert infos["_final_obs"].all() and infos["final_obs"].dtype == object
        assert infos["_final_info"].all() and (infos["final_info"]["elapsed"] == REACH_STEPS).all()
        assert infos["_episode"].all() and (infos["episode"]["l"] == REACH_STEPS).all()
        assert (infos["elapsed"] == 0).all()  # the returned obs starts a new episode
        for i in range(NUM_ENVS):
            final = infos["final_obs"][i]
            assert final in venv.single_observation_space
            # the goal (privileged[:3]) is fixed within an episode and redrawn on reset
            np.testing.assert_array_equal(final["privileged"][:3], before["privileged"][i, :3])
            assert not np.array_equal(obs["privileged"][i, :3], final["privileged"][:3])
        obs, *_, infos = venv.step(zeros)  # keeps going without reset()
        assert (infos["elapsed"] == 1).all() and "final_obs" not in infos
    finally:
        venv.close()


def test_vector_rgb_space():
    venv = _vec(cameras=("agentview", "wrist"), image_size=32)
    try:
        space = venv.single_observation_space["rgb"]
        assert space.shape == (2, 32, 32, 3) and space.dtype == np.uint8
        obs, _ = venv.reset(seed=0)
        assert obs["rgb"].shape == (NUM_ENVS, 2, 32, 32, 3) and obs["rgb"].dtype == np.uint8
        assert obs in venv.observation_space
        obs, *_ = venv.step(np.zeros(venv.action_space.shape, np.float32))
        assert obs in venv.observation_space and obs["rgb"].any()
    finally:
        venv.close()


def test_vector_rejects_bad_input():
    venv = _vec()
    try:
        with pytest.raises(ValueError, match="shape"):
            venv.step(np.zeros((NUM_ENVS + 1, 7), np.float32))
        with pytest.raises(ValueError, match="NaN"):
            venv.step(np.full((NUM_ENVS, 7), np.nan, np.float32))
        with pytest.raises(ValueError, match="unknown reset option"):
            venv.reset(options={"bogus": 1})
        with pytest.raises(ValueError, match="seed"):
            venv.reset(seed=[1, 2])
        with pytest.raises(ValueError, match="reset_mask"):
            venv.reset(options={"reset_mask": np.ones(NUM_ENVS, bool)})
    finally:
        venv.close()
    with pytest.raises(RuntimeError, match="closed"):
        venv.step(np.zeros((NUM_ENVS, 7), np.float32))


def test_wrap_existing_env():
    env = sims.make("mujoco", task="reach", num_envs=NUM_ENVS, cameras=(), seed=0)
    venv = GymVectorEnv(env)
    assert venv.num_envs == NUM_ENVS and venv.tasks[0].name == "reach"
    with pytest.raises(ValueError, match="not both"):
        GymVectorEnv(env, task="reach")
    venv.close()


# ------------------------------------------------------------------------------ single env
def test_check_env_passes_on_single_env():
    env = gymnasium.make("embodied/Reach-v0", cameras=(), image_size=32)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check_env(env.unwrapped)  # also renders through the spec with render_mode="rgb_array"
    # unbounded float observations (-inf/inf Box) are the only thing check_env remarks on
    other = [str(w.message) for w in caught if "infinity" not in str(w.message)]
    assert not other, other
    env.close()


def test_single_env_ends_episodes_without_autoreset():
    env = GymEnv(task="reach", cameras=(), seed=0, render_mode="rgb_array", image_size=32)
    try:
        assert env.render().shape == (32, 32, 3)
        with pytest.raises(RuntimeError, match="reset"):
            env.step(np.zeros(7, np.float32))
        obs, _ = env.reset(seed=3)
        goal = obs["privileged"][:3].copy()
        for t in range(1, REACH_STEPS + 1):
            obs, rew, term, trunc, info = env.step(np.zeros(7, np.float32))
            assert isinstance(rew, float) and type(term) is bool and type(trunc) is bool
            assert info["elapsed"] == t
        assert trunc and not term and info["episode"]["l"] == REACH_STEPS
        np.testing.assert_array_equal(obs["privileged"][:3], goal)  # the final obs, same episode
        with pytest.raises(RuntimeError, match="reset"):
            env.step(np.zeros(7, np.float32))
        obs2, _ = env.reset()
        assert obs2 in env.observation_space
        assert not np.array_equal(obs2["privileged"][:3], goal)
        obs3, *_ = env.step(np.zeros(7, np.float32))
        np.testing.assert_array_equal(obs3["privileged"][:3], obs2["privileged"][:3])
    finally:
        env.close()
        env.close()


def test_make_vec_sync_mode_uses_single_envs():
    venv = gymnasium.make_vec("embodied/Reach-v0", num_envs=2, vectorization_mode="sync", cameras=())
    try:
        obs, _ = venv.reset(seed=0)
        assert obs in venv.observation_space
        obs, *_ = venv.step(venv.action_space.sample())
        assert obs in venv.observation_space
    finally:
        venv.close()


# ------------------------------------------------------------------------------ RSL-RL
def _rsl_env(**kw):
    from sims.compat.rsl_rl import make_rsl_rl_env

    kw.setdefault("num_envs", 4)
    return make_rsl_rl_env(task="reach", seed=0, **kw)


def test_rsl_rl_env_contract():
    from rsl_rl.env import VecEnv as RslVecEnv
    from tensordict import TensorDict

    env = _rsl_env(num_envs=NUM_ENVS)
    try:
        assert isinstance(env, RslVecEnv)
        assert env.num_actions == 7 and env.max_episode_length == REACH_STEPS
        obs = env.get_observations()
        assert isinstance(obs, TensorDict) and tuple(obs.batch_size) == (NUM_ENVS,)
        assert obs["policy"].shape == obs["critic"].shape == (NUM_ENVS, 15 + 6)
        assert (env.episode_length_buf == 0).all()
        actions = torch.full((NUM_ENVS, 7), 5.0)  # out of range: clipped, not rejected
        for t in range(1, REACH_STEPS + 1):
            obs, rew, dones, extras = env.step(actions if t == 1 else torch.zeros(NUM_ENVS, 7))
            assert rew.shape == (NUM_ENVS,) and rew.dtype == torch.float32
            assert dones.dtype == torch.long and extras["time_outs"].dtype == torch.bool
            if t < REACH_STEPS:
                assert (env.episode_length_buf == t).all() and not dones.any() and extras["log"] == {}
        assert dones.all() and extras["time_outs"].all() and (env.episode_length_buf == 0).all()
        assert extras["log"]["/success_rate"].shape == (NUM_ENVS,)
        assert extras["log"]["/diverged_rate"].shape == (NUM_ENVS,)
        # rsl_rl's init_at_random_ep_len writes episode_length_buf: episodes end earlier
        env.episode_length_buf = torch.tensor([REACH_STEPS - 2, 0])
        env.step(torch.zeros(NUM_ENVS, 7))
        _, _, dones, extras = env.step(torch.zeros(NUM_ENVS, 7))
        assert dones.tolist() == [1, 0] and extras["time_outs"].tolist() == [True, False]
        with pytest.raises(ValueError, match="shape"):
            env.step(torch.zeros(NUM_ENVS, 6))
        with pytest.raises(ValueError, match="episode_length_buf"):
            env.episode_length_buf = torch.tensor([REACH_STEPS, 0])
    finally:
        env.close()


def test_rsl_rl_obs_groups():
    from sims.compat.rsl_rl import make_rsl_rl_env

    env = make_rsl_rl_env(
        task="reach",
        num_envs=NUM_ENVS,
        cameras=("agentview",),
        image_size=32,
        obs_groups={"policy": ["state", "task_id"], "camera": ["rgb"], "critic": ["state", "privileged"]},
    )
    try:
        obs = env.get_observations()
        assert obs["policy"].shape == (NUM_ENVS, 15 + 1)  # task_id one-hot over 1 task
        assert obs["camera"].shape == (NUM_ENVS, 3, 32, 32) and obs["camera"].dtype == torch.float32
        assert 0.0 <= float(obs["camera"].min()) and float(obs["camera"].max()) <= 1.0
    finally:
        env.close()
    with pytest.raises(ValueError, match="does not observe"):
        make_rsl_rl_env(task="reach", num_envs=1, obs_groups={"policy": ["rgb"]}, cameras=())
    with pytest.raises(ValueError, match="group of its own"):
        make_rsl_rl_env(
            task="reach", num_envs=1, obs_groups={"policy": ["rgb", "state"]}, cameras=("agentview",), image_size=32
        )


def test_rsl_rl_on_policy_runner_trains(tmp_path):
    from rsl_rl.runners import OnPolicyRunner

    from sims.compat.rsl_rl import default_ppo_cfg

    torch.manual_seed(0)
    env = _rsl_env(num_envs=4)
    cfg = default_ppo_cfg(
        num_steps_per_env=8, save_interval=1, hidden_dims=(16,), num_learning_epochs=1, num_mini_batches=2
    )
    try:
        runner = OnPolicyRunner(env, cfg, log_dir=str(tmp_path), device="cpu")
        before = {k: v.clone() for k, v in runner.alg.actor.state_dict().items()}
        runner.learn(num_learning_iterations=2, init_at_random_ep_len=True)
        assert runner.current_learning_iteration == 1
        after = runner.alg.actor.state_dict()
        assert any(not torch.equal(before[k], after[k]) for k in before)
        assert (tmp_path / "model_0.pt").is_file() and (tmp_path / "model_1.pt").is_file()
        runner.save(str(tmp_path / "final.pt"))
        loaded = OnPolicyRunner(
            env, default_ppo_cfg(num_steps_per_env=8, hidden_dims=(16,)), log_dir=None, device="cpu"
        )
        loaded.load(str(tmp_path / "final.pt"))
        assert loaded.current_learning_iteration == 1
        for k, v in loaded.alg.actor.state_dict().items():
            assert torch.equal(v, after[k]), k
        act = loaded.get_inference_policy()(env.get_observations())
        assert act.shape == (4, 7) and torch.isfinite(act).all()
    finally:
        env.close()


def test_suite_ids_build_a_multi_task_vector_env():
    import gymnasium

    import sims.compat  # noqa: F401

    venv = gymnasium.make_vec("embodied/GoalSuite-v0", num_envs=3, cameras=(), seed=0)
    try:
        obs, infos = venv.reset(seed=0)
        assert obs["task_id"].tolist() == [0, 1, 2]
        obs, reward, term, trunc, infos = venv.step(np.zeros((3, 7), np.float32))
        assert obs["state"].shape == (3, 15) and reward.dtype.kind == "f"
    finally:
        venv.close()
