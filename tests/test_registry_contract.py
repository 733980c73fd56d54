"""One contract test over everything registered, in MuJoCo Playground's pattern (one test
parametrized over every registered environment):

- every simulation backend (:func:`sims.backends`) x every suite (:func:`sims.suites.names`): the
  observations fit ``observation_spec``, one step within ``action_spec`` gives ``[N]`` rewards and
  flags, and a reset with the same seed gives the same observation;
- every policy family (:func:`policies.families`), tiny: a greedy action chunk for a real MuJoCo
  observation has the env's shape and range, and a saved and loaded bundle gives the same chunk.

The per-task checks of the MuJoCo backend are in tests/sims/test_contract.py.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any, Iterator

import pytest
import torch

import policies
import sims
from policies.io import env_inputs
from sims.core import Obs, VecEnv

NUM_ENVS = 2
CAMERAS = ("agentview", "wrist")
IMAGE_SIZE = 32
CHUNK_SIZE = 3
#: the contract's action range (sims.core, policies.base)
ACTION_LOW, ACTION_HIGH = -1.0, 1.0

#: what a backend imports beyond the core dependencies (pyproject's optional extras ``gpu``, ``maniskill``)
BACKEND_PACKAGES: dict[str, tuple[str, ...]] = {
    "mujoco_gpu": ("mujoco_warp", "warp"),
    "maniskill": ("mani_skill",),
}

#: sizes every family accepts, and each family's own depth knob at one layer
TINY_POLICY: dict[str, Any] = dict(
    d_model=32, image_size=IMAGE_SIZE, vision_channels=[8, 16], chunk_size=CHUNK_SIZE, prefix_layers=1
)
TINY_FAMILY: dict[str, dict[str, Any]] = {
    "flow": {"expert_layers": 1},
    "autoregressive": {"decoder_layers": 1},
    "diffusion": {"denoiser_layers": 1, "inference_steps": 2},
}
POLICY_SUITE = "spatial"


def _make_env(backend: str, suite: str) -> VecEnv:
    """The backend's env of ``suite``, or a skip naming what it lacks."""
    missing = [name for name in BACKEND_PACKAGES.get(backend, ()) if importlib.util.find_spec(name) is None]
    if missing:
        pytest.skip(f"backend {backend!r} needs the package(s) {missing}, which are not installed")
    try:
        return sims.make(backend, suite=suite, num_envs=NUM_ENVS, cameras=CAMERAS, image_size=IMAGE_SIZE, seed=0)
    except ValueError as err:
        if repr(suite) not in str(err):  # only the backend refusing this suite is a skip
            raise
        pytest.skip(f"backend {backend!r} does not serve suite {suite!r}: {err}")


def _check_obs(env: VecEnv, obs: Obs) -> None:
    assert set(obs) == set(env.observation_spec)
    for key, spec in env.observation_spec.items():
        value = obs[key]
        assert value.shape == (env.num_envs, *spec.shape), key
        assert value.dtype == spec.dtype, key
        assert value.device == env.device, key
        if value.is_floating_point():
            assert torch.isfinite(value).all(), key
        if spec.low is not None:
            assert (value >= spec.low).all(), key
        if spec.high is not None:
            assert (value <= spec.high).all(), key


@pytest.mark.parametrize("suite", sims.suites.names())
@pytest.mark.parametrize("backend", sims.backends())
def test_backend_runs_suite_by_the_contract(backend: str, suite: str) -> None:
    with _make_env(backend, suite) as env:
        assert env.num_envs == NUM_ENVS
        assert [t.name for t in env.tasks] == [t.name for t in sims.suites.tasks(suite)]
        spec = env.action_spec
        assert len(spec.shape) == 1 and spec.dtype == torch.float32
        assert (spec.low, spec.high) == (ACTION_LOW, ACTION_HIGH)

        first = env.reset(seed=0)
        _check_obs(env, first)
        assert ((first["task_id"] >= 0) & (first["task_id"] < len(env.tasks))).all()

        gen = torch.Generator().manual_seed(0)
        actions = spec.low + (spec.high - spec.low) * torch.rand(NUM_ENVS, *spec.shape, generator=gen)
        obs, reward, terminated, truncated, info = env.step(actions.to(env.device))
        _check_obs(env, obs)
        flags = {
            "reward": (reward, torch.float32),
            "terminated": (terminated, torch.bool),
            "truncated": (truncated, torch.bool),
        }
        flags.update({key: (info[key], torch.bool) for key in ("success", "done", "diverged")})
        for name, (value, dtype) in flags.items():
            assert value.shape == (NUM_ENVS,) and value.dtype == dtype, name
        assert torch.isfinite(reward).all()
        assert torch.equal(info["done"].cpu(), (terminated | truncated).cpu())
        assert set(info["final_obs"]) == set(obs)

        # after a step, so the reset must restore the state rather than find it unchanged
        again = env.reset(seed=0)
        for key in first:
            assert torch.equal(first[key], again[key]), key


@pytest.fixture(scope="module")
def mujoco_env() -> Iterator[tuple[VecEnv, Obs]]:
    """A MuJoCo env of :data:`POLICY_SUITE` and its first observation."""
    with sims.make(
        "mujoco", suite=POLICY_SUITE, num_envs=NUM_ENVS, cameras=CAMERAS, image_size=IMAGE_SIZE, seed=0
    ) as env:
        yield env, env.reset(seed=0)


def _greedy(policy: Any, inputs: dict[str, Any]) -> torch.Tensor:
    # greedy flow still integrates the ODE from drawn noise: a seeded generator fixes it for every family
    return policy.act(inputs, mode="greedy", generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("family", policies.families())
def test_policy_family_acts_on_an_env_and_round_trips(
    family: str, mujoco_env: tuple[VecEnv, Obs], tmp_path: Path
) -> None:
    if family in ("pi0", "pi05", "smolvla"):
        pytest.skip(f"the {family} family's contract test runs in .venv-lerobot (tests/lerobot), with its tokenizer")
    try:
        policies.policy_class(family)
    except ImportError as err:
        pytest.skip(f"the {family} family's code is not installed: {err}")
    env, obs = mujoco_env
    action_dim = env.action_spec.shape[0]
    torch.manual_seed(0)
    policy = policies.make(
        family,
        action_dim=action_dim,
        state_dim=env.observation_spec["state"].shape[0],
        cameras=list(env.cameras),
        control_hz=env.control_hz,
        **TINY_POLICY,
        **TINY_FAMILY.get(family, {}),
    ).eval()
    policy.check_env(env)
    inputs = env_inputs(obs, [t.instruction for t in sims.suites.tasks(POLICY_SUITE)])

    chunk = _greedy(policy, inputs)
    assert chunk.shape == (NUM_ENVS, CHUNK_SIZE, action_dim) and chunk.dtype == torch.float32
    assert torch.isfinite(chunk).all()
    assert (chunk >= ACTION_LOW).all() and (chunk <= ACTION_HIGH).all()
    result = env.step_chunk(chunk)
    assert result.reward.shape == (NUM_ENVS,) and result.executed.shape == (NUM_ENVS, CHUNK_SIZE)

    loaded = policies.load(policies.save(policy, tmp_path / family))
    assert type(loaded) is type(policy) and loaded.config == policy.config
    assert torch.equal(_greedy(loaded, inputs), chunk)
