"""Real LIBERO behind the VecEnv contract (sims/libero/env.py): ``sims.make("mujoco", suite="libero_*")``
on one exported libero_spatial task, a few envs, a few steps."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import needs_libero_venv

import sims
from sims.libero import scenes
from sims.libero.experts import PickPlaceExpert
from sims.libero.worlds import LiberoWorlds

pytestmark = needs_libero_venv  # the scene export runs in the reference venv

UP = [0.0, 0.0, 1.0, 0.0, 0.0, 0.0, -1.0]


def _make(cache, n, **kw):
    kw.setdefault("cameras", ())
    return sims.make(
        "mujoco", suite="libero_spatial", num_envs=n, cache=str(cache), tasks=[0], box_contacts="native", **kw
    )


def test_contract_reset_step_and_the_worlds_underneath(libero_exported):
    cache = libero_exported[0]
    with _make(cache, 3, cameras=("agentview", "wrist"), image_size=32) as env:
        assert env.control_hz == 20.0 and env.action_spec.shape == (7,)
        assert env.tasks[0].max_steps == 220 and "black bowl" in env.tasks[0].instruction
        obs = env.reset(init_ids=[0, 1, 0])
        assert obs["state"].shape == (3, 8) and obs["state"].dtype == torch.float32
        assert obs["rgb"].shape == (3, 2, 32, 32, 3) and obs["rgb"].dtype == torch.uint8
        assert obs["task_id"].tolist() == [0, 0, 0]
        # the same init state and reset as the physics core's
        core = LiberoWorlds(scenes.task_dir("libero_spatial", 0, cache), 2, box_contacts="native")
        np.testing.assert_array_equal(obs["state"][:2].numpy(), core.reset([0, 1]))
        np.testing.assert_array_equal(obs["state"][0], obs["state"][2])
        assert env.render(1, "wrist").shape == (32, 32, 3)
        before = obs["state"].clone()
        actions = torch.tensor([UP] * 3)
        for _ in range(2):
            obs, reward, terminated, truncated, info = env.step(actions, active=torch.tensor([True, False, True]))
        assert info["elapsed"].tolist() == [2, 0, 2]
        assert torch.equal(obs["state"][1], before[1])  # an inactive env does not move
        assert (obs["state"][[0, 2], 2] > before[[0, 2], 2] + 0.01).all()
        torch.testing.assert_close(obs["state"][0], obs["state"][2])
        assert not reward.any() and not (terminated | truncated).any()


def test_a_subset_step_is_the_same_physics_as_a_full_one(libero_exported):
    """Each env keeps its own controller state and observation clock: stepping envs one at a time gives
    what stepping them together gives."""
    with _make(libero_exported[0], 2) as env:
        env.reset(init_ids=[4, 4])
        actions = torch.tensor([[0.3, -0.2, 0.1, 0.0, 0.0, 0.2, 1.0]] * 2)
        for _ in range(3):
            env.step(actions, active=torch.tensor([True, False]))
        for _ in range(3):
            obs, *_ = env.step(actions, active=torch.tensor([False, True]))
        np.testing.assert_array_equal(obs["state"][0].numpy(), obs["state"][1].numpy())
        w = env.worlds(0)
        np.testing.assert_array_equal(w.sim_state()[0, 1:], w.sim_state()[1, 1:])


def test_truncation_and_automatic_reset_keep_the_fixed_init_state(libero_exported):
    with _make(libero_exported[0], 2, max_steps=2) as env:
        obs0 = env.reset(init_ids=[2, 3])
        actions = torch.tensor([UP] * 2)
        env.step(actions)
        obs, reward, terminated, truncated, info = env.step(actions)
        assert truncated.all() and not terminated.any() and info["done"].all()
        assert info["episode"]["length"].tolist() == [2, 2]
        assert (info["final_obs"]["state"][:, 2] > obs0["state"][:, 2] + 0.01).all()
        # a new episode from the same init states; the gripper command robosuite keeps (open: [1, -1])
        assert info["elapsed"].tolist() == [2, 2] and env.init_ids.tolist() == [2, 3]
        np.testing.assert_allclose(obs["state"].numpy(), obs0["state"].numpy(), atol=2e-3)
        np.testing.assert_array_equal(env.worlds(0).arm.gripper, [[1.0, -1.0]] * 2)
        env.step(actions)
        env.set_init_pool([7])
        env.reset()
        assert env.init_ids.tolist() == [7, 7]


def test_the_sampled_held_out_states_are_init_ids_50_to_99(libero_exported):
    """Init ids 50..99 are the sampled states of the cache, by reset and by init pool; random draws keep
    to the training states 25..49."""
    folder = scenes.task_dir("libero_spatial", 0, libero_exported[0])
    sampled = scenes.load_sampled_states(folder)
    with _make(libero_exported[0], 2, wait_steps=0) as env:
        env.reset(init_ids=[60, 99])
        assert env.init_ids.tolist() == [60, 99]
        np.testing.assert_array_equal(env.worlds(0).sim_state()[:, 1:], sampled[[10, 49], 1:])
        env.set_init_pool([60])
        env.reset()
        assert env.init_ids.tolist() == [60, 60]
        env.set_init_pool(None)
        draws = []
        for seed in range(10):
            env.reset(seed=seed)
            draws += env.init_ids.tolist()
        assert min(draws) >= 25 and max(draws) <= 49


def test_success_terminates_with_reward_one(libero_exported):
    with _make(libero_exported[0], 1) as env:
        env.reset(init_ids=[0])
        expert = PickPlaceExpert(env.worlds(0))
        expert.reset()
        for _ in range(env.tasks[0].max_steps):
            obs, reward, terminated, truncated, info = env.step(torch.as_tensor(expert.act(), dtype=torch.float32))
            if info["done"].any():
                break
        assert terminated.tolist() == [True] and reward.tolist() == [1.0] and info["success"].all()
        assert info["episode"]["return"].tolist() == [1.0] and 0 < info["episode"]["length"].item() < 220
        assert not env.success_mask().any()  # the automatic reset put the bowl back


def test_task_specs_and_init_states_from_the_cache(libero_exported, monkeypatch):
    cache = libero_exported[0]
    monkeypatch.setenv(scenes.CACHE_ENV, str(cache))
    assert sims.suites.backend("libero_spatial") == "mujoco"
    states = sims.suites.init_states("libero_spatial", 0)
    assert (
        len(states) == 50
        and len(states[0]["sim_state"]) == scenes.load_init_states(scenes.task_dir("libero_spatial", 0, cache)).shape[1]
    )
    # the task list comes from LIBERO's task table, without exports; it agrees with the exported scene
    specs = sims.suites.tasks("libero_spatial")
    meta = scenes.read_meta(scenes.task_dir("libero_spatial", 0, cache))
    assert len(specs) == 10 and specs[0].name == meta["task_name"] and specs[0].instruction == meta["language"]
    assert specs[0].extras["goal"] == meta["goal_state"] and specs[0].extras["objects"] == sorted(meta["objects"])
    # with first-use export off, an env runs exported tasks only: task 1 is not
    monkeypatch.setenv(scenes.AUTO_EXPORT_ENV, "0")
    with sims.make("mujoco", suite="libero_spatial", num_envs=2, cameras=()) as env:
        with pytest.raises(scenes.SceneCacheError, match="--tasks 1"):
            env.reset(task_ids=[0, 1])
    with pytest.raises(ValueError, match="pass env="):
        sims.suites.expert("libero_spatial")
    # held out: the 50 states LIBERO's placement initializer sampled, which no training start uses
    assert sims.suites.heldout_states("libero_spatial") == (50, 50)
    assert [sims.suites.training_init_id("libero_spatial", k) for k in (0, 24)] == [25, 49]
    with pytest.raises(ValueError, match="held-out sampled ones"):
        sims.suites.training_init_id("libero_spatial", 25)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(camera=("agentview",)), "did you mean 'cameras'"),
        (dict(cameras=("front",)), "LIBERO's views are"),
        (dict(reward_type="dense"), "sparse reward only"),
        (dict(tasks=[10]), r"task indices 0\.\.9"),
    ],
)
def test_bad_options_are_refused(libero_exported, kwargs, message):
    args = dict(cache=str(libero_exported[0]), tasks=[0], cameras=())
    args.update(kwargs)
    with pytest.raises(ValueError, match=message):
        sims.make("mujoco", suite="libero_spatial", num_envs=1, **args)


def test_bad_calls_are_refused(libero_exported, monkeypatch):
    with _make(libero_exported[0], 2) as env:
        with pytest.raises(
            ValueError,
            match=r"init_ids must be in 0\.\.49 \(LIBERO's official init states\) or "
            r"50\.\.99 \(the held-out states",
        ):
            env.reset(init_ids=[0, 100])
        with pytest.raises(ValueError, match=r"init ids in 0\.\.49 .* or 50\.\.99"):
            env.set_init_pool([60, 100])
        with pytest.raises(ValueError, match=r"task_ids must be in \[0, 1\)"):
            env.reset(task_ids=[0, 1])
        with pytest.raises(ValueError, match=r"actions must have shape \[2, 7\]"):
            env.step(torch.zeros(2, 6))
        with pytest.raises(ValueError, match="NaN"):
            env.step(torch.full((2, 7), float("nan")))
    with pytest.raises(RuntimeError, match="closed"):
        env.reset()
    monkeypatch.setenv(scenes.AUTO_EXPORT_ENV, "0")  # (on, task 1 is exported: test_libero_scenes.py)
    with pytest.raises(scenes.SceneCacheError, match="--tasks 1"):
        sims.make("mujoco", suite="libero_spatial", num_envs=1, cache=str(libero_exported[0]), tasks=[1])
    with pytest.raises(ValueError, match="CPU backend only"):
        sims.make("mujoco_gpu", suite="libero_spatial", num_envs=1)


def test_chunks_return_the_pixels_of_rendering_every_step(libero_exported):
    """Render on demand on a LIBERO task: the views drawn later from an observation sample's positions
    are the ones drawn at the sample, and chunks return the frames per-step rendering gives (episodes
    ending inside chunks included)."""
    cache = libero_exported[0]
    worlds = LiberoWorlds(
        scenes.task_dir("libero_spatial", 0, cache),
        2,
        box_contacts="native",
        cameras=("agentview", "wrist"),
        image_size=32,
    )
    try:
        worlds.reset([3, 7], wait_steps=0)  # the sample at the reset: the synced state, drawn directly by render()
        for e in range(2):
            for v, cam in enumerate(("agentview", "wrist")):
                np.testing.assert_array_equal(worlds.images()[e, v], worlds.render(e, cam))
    finally:
        worlds.close()

    def run(every: bool):
        gen = torch.Generator().manual_seed(0)
        frames, finals = [], []
        with _make(cache, 2, cameras=("agentview", "wrist"), image_size=32, max_steps=4) as env:
            frames.append(env.reset(seed=1)["rgb"].clone())
            for _ in range(3):
                res = env.step_chunk(torch.rand(2, 3, 7, generator=gen) * 2 - 1, render_every_step=every)
                frames.append(res.obs["rgb"].clone())
                finals.append(res.final_obs["rgb"][res.done].clone())
        return frames, finals

    every, lazy = run(True), run(False)
    assert sum(len(f) for f in every[1]) >= 2
    for a, b in zip(every, lazy):
        assert all(torch.equal(x, y) for x, y in zip(a, b))
