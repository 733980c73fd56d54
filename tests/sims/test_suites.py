"""LIBERO-style suites: one contract test over every task of every suite, fixed initial states."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest
import torch

import sims

SUITE_SIZES = {"spatial": 10, "object": 10, "goal": 10, "long": 10, "dynamic": 5}
ALL_TASKS = [(suite, i) for suite, n in SUITE_SIZES.items() for i in range(n)]
# sha256 of every suite's 50 initial states per task (floats rounded to 1e-9), see _init_hash.
# The same on every machine; it changes only when a task's placement sampler changes.
EXPECTED_INIT_HASH = "be5c3474b9e8e3b1c2693ed53b4384c63f20d3a34a94df0bf4230d9dbc820c0c"


def _init_hash() -> str:
    payload = {suite: [sims.suites.init_states(suite, t) for t in range(n)] for suite, n in SUITE_SIZES.items()}

    def rounded(obj):
        if isinstance(obj, float):
            return round(obj, 9)
        if isinstance(obj, dict):
            return {k: rounded(v) for k, v in obj.items()}
        if isinstance(obj, list):
            return [rounded(v) for v in obj]
        return obj

    text = json.dumps(rounded(payload), sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


def test_suite_registry_and_distinct_instructions():
    assert sims.suites.names() == list(SUITE_SIZES)
    instructions = []
    for suite, n in SUITE_SIZES.items():
        specs = sims.suites.tasks(suite)
        assert len(specs) == n
        assert all(s.suite == suite and s.max_steps > 0 for s in specs)
        instructions += [s.instruction for s in specs]
    assert len(set(instructions)) == len(instructions)
    with pytest.raises(ValueError, match="unknown suite"):
        sims.suites.tasks("libero_100")
    with pytest.raises(ValueError, match="has no task"):
        sims.suites.init_states("goal", "fly")


def test_fixed_initial_states_are_identical_everywhere():
    states = sims.suites.init_states("spatial", 0)
    assert len(states) == sims.suites.NUM_INIT_STATES == 50
    assert states == sims.suites.init_states("spatial", 0)  # pure function
    assert len({json.dumps(s["placement"], sort_keys=True) for s in states}) == 50  # all different
    assert _init_hash() == EXPECTED_INIT_HASH, (
        "the fixed evaluation initial states changed: if intended, update EXPECTED_INIT_HASH "
        "and say so (results before and after are not comparable)"
    )


def test_env_applies_the_listed_initial_state():
    state = sims.suites.init_states("goal", 2)[7]
    with sims.make("mujoco", suite="goal", num_envs=1, cameras=()) as env:
        env.reset(task_ids=[2], init_ids=[7])
        view = env.task_objs[2].view
        for name, (x, y, _yaw) in state["placement"].items():
            np.testing.assert_allclose(view.pos(name, np.array([0]))[0, :2], [x, y], atol=1e-6)


def test_init_pool_draws_every_reset_from_fixed_states():
    """Training on the protocol's states (init_pool=protocol): resets without explicit ids, auto-resets
    included, start from the pool's fixed states."""

    def placements(env):
        view = env.task_objs[2].view
        return [
            tuple(np.round(view.pos(name, np.arange(env.num_envs))[:, :2].ravel(), 6))
            for name in sims.suites.init_states("goal", 2)[0]["placement"]
        ]

    with sims.make("mujoco", suite="goal", num_envs=3, cameras=()) as env:
        env.reset(task_ids=[2, 2, 2], init_ids=[4, 4, 4])
        fixed = placements(env)
        env.set_init_pool([4])
        env.reset(seed=1, task_ids=[2, 2, 2])
        assert placements(env) == fixed
        env.set_init_pool(None)
        env.reset(seed=1, task_ids=[2, 2, 2])
        assert placements(env) != fixed
        with pytest.raises(ValueError, match="non-negative"):
            env.set_init_pool([-1])


@pytest.mark.parametrize("suite", list(SUITE_SIZES))
def test_predicates_false_on_every_initial_state(suite):
    n = sims.suites.NUM_INIT_STATES
    with sims.make("mujoco", suite=suite, num_envs=n, cameras=()) as env:
        for t in range(SUITE_SIZES[suite]):
            env.reset(task_ids=[t] * n, init_ids=list(range(n)))
            assert not env.success_mask().any(), f"{suite}/{t} succeeds at its initial state"


@pytest.mark.parametrize("suite", list(SUITE_SIZES))
def test_suite_env_shapes_with_cameras(suite):
    n = SUITE_SIZES[suite]
    with sims.make("mujoco", suite=suite, num_envs=n, cameras=("agentview", "wrist"), image_size=24) as env:
        obs = env.reset(seed=0)
        assert obs["task_id"].tolist() == list(range(n))  # env i starts on task i
        assert obs["rgb"].shape == (n, 2, 24, 24, 3)
        for _ in range(2):
            obs, reward, term, trunc, info = env.step(torch.rand(n, 7) * 2 - 1)
            assert torch.isfinite(obs["state"]).all() and torch.isfinite(obs["privileged"]).all()
            assert reward.shape == (n,) and not info["diverged"].any()


@pytest.mark.parametrize("suite,task", ALL_TASKS, ids=[f"{s}-{t}" for s, t in ALL_TASKS])
def test_expert_reaches_success(suite, task):
    init_ids = [3, 41]
    n = len(init_ids)
    spec = sims.suites.tasks(suite)[task]
    with sims.make("mujoco", suite=suite, num_envs=n, cameras=()) as env:
        expert = sims.suites.expert(suite, task, num_envs=n)
        obs = env.reset(task_ids=[task] * n, init_ids=init_ids)
        finished = np.zeros(n, bool)
        solved = np.zeros(n, bool)
        for _ in range(spec.max_steps):
            chunk = expert(obs)
            assert chunk.shape == (n, 1, 7)
            obs, reward, term, trunc, info = env.step(chunk[:, 0], active=torch.as_tensor(~finished))
            solved |= info["success"].numpy() & ~finished
            finished |= info["done"].numpy()
            if finished.all():
                break
        assert solved.all(), f"{suite}/{spec.name}: expert failed on init states {np.array(init_ids)[~solved]}"
        assert env.num_diverged == 0


@pytest.mark.parametrize("suite,task", [("spatial", 0), ("goal", 0), ("long", 4), ("dynamic", 2)])
def test_dense_reward_tracks_expert_progress(suite, task):
    spec = sims.suites.tasks(suite)[task]
    with sims.make("mujoco", suite=suite, num_envs=1, cameras=(), reward_type="dense") as env:
        expert = sims.suites.expert(suite, num_envs=1)
        obs = env.reset(task_ids=[task], init_ids=[5])
        rewards = []
        for _ in range(spec.max_steps):
            obs, reward, term, trunc, info = env.step(expert.act(obs))
            rewards.append(float(reward[0]))
            if info["done"][0]:
                break
        assert all(0.0 <= r <= 1.0 for r in rewards)
        assert bool(info["success"][0]) and rewards[-1] == 1.0
        assert max(rewards[:-1]) < 1.0 and rewards[len(rewards) // 2] > rewards[0]


def test_shaped_reward_is_potential_based_along_an_expert_episode():
    """reward_type=shaped: r_t = progress_t - progress_{t-1} + success, so the return telescopes to
    1 (final progress at success) - initial progress + 1, whatever the path."""
    spec = sims.suites.tasks("goal")[2]
    with (
        sims.make("mujoco", suite="goal", num_envs=1, cameras=(), reward_type="shaped") as env,
        sims.make("mujoco", suite="goal", num_envs=1, cameras=(), reward_type="dense") as dense,
    ):
        expert = sims.suites.expert("goal", num_envs=1)
        obs = env.reset(task_ids=[2], init_ids=[3])
        dense.reset(task_ids=[2], init_ids=[3])
        start = float(dense.task_objs[2].dense_reward(np.array([0]))[0])
        assert 0.0 < start < 0.9
        total = 0.0
        for _ in range(spec.max_steps):
            obs, reward, term, trunc, info = env.step(expert.act(obs))
            total += float(reward[0])
            if info["done"][0]:
                break
        assert bool(info["success"][0])
        assert abs(total - (2.0 - start)) < 1e-4
        assert abs(float(info["episode"]["return"][0]) - total) < 1e-4


def test_history_camera_shows_the_view_k_steps_ago():
    import torch

    import sims

    env = sims.make(
        "mujoco", suite="dynamic", num_envs=2, cameras=("agentview", "wrist", "agentview_prev2"), image_size=32
    )
    obs = env.reset(task_ids=[0, 0], init_ids=[0, 1])
    assert obs["rgb"].shape == (2, 3, 32, 32, 3) and torch.equal(obs["rgb"][:, 0], obs["rgb"][:, 2])  # episode start
    frames = [obs["rgb"][:, 0].clone()]
    for _ in range(4):
        obs, *_ = env.step(torch.zeros(2, 7))
        frames.append(obs["rgb"][:, 0].clone())
    assert torch.equal(obs["rgb"][:, 2], frames[2]) and not torch.equal(obs["rgb"][:, 2], frames[4])  # the slider moved
    with pytest.raises(ValueError, match="_prev<k>"):
        sims.make("mujoco", suite="dynamic", num_envs=1, cameras=("top",))
    env.close()


def _expert_episode(suite: str, task: int, gain: float, init_ids: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """Actions ``[T, N, 7]`` of the expert on ``init_ids`` and which envs succeeded."""
    n = len(init_ids)
    with sims.make("mujoco", suite=suite, num_envs=n, cameras=()) as env:
        expert = sims.suites.expert(suite, task, num_envs=n, gain=gain)
        obs = env.reset(task_ids=[task] * n, init_ids=init_ids)
        finished, solved, actions = np.zeros(n, bool), np.zeros(n, bool), []
        for _ in range(sims.suites.tasks(suite)[task].max_steps):
            act = expert.act(obs)
            actions.append(act.numpy())
            obs, _, _, _, info = env.step(act, active=torch.as_tensor(~finished))
            solved |= info["success"].numpy() & ~finished
            finished |= info["done"].numpy()
            if finished.all():
                break
    return np.stack(actions), solved


def test_smooth_expert_makes_smoother_slower_demonstrations():
    """gain < 1 commands a share of the remaining error per step: fewer saturated commands, about
    half the step-to-step change of the actions, longer episodes; the task is still solved."""
    stats = {}
    for gain in (1.0, 0.35):
        actions, solved = _expert_episode("goal", 8, gain, [3, 41])
        assert solved.all(), f"expert with gain {gain} failed"
        xyz = actions[:, :, :3]
        stats[gain] = (float((np.abs(xyz) > 0.99).mean()), float(np.abs(np.diff(xyz, axis=0)).mean()), len(actions))
    (sat1, jerk1, len1), (sat2, jerk2, len2) = stats[1.0], stats[0.35]
    assert sat2 < 0.5 * sat1 and jerk2 < 0.6 * jerk1 and len2 > len1, stats
    with pytest.raises(ValueError, match="gain must be in"):
        sims.suites.expert("goal", num_envs=1, gain=0.0)
