"""policies.io: the one observation -> policy input mapping gives exactly the dicts its callers used
to build by hand (real MuJoCo observations, batch columns, decoded wire arrays), and a policy samples
the same chunks from it."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import policies
import sims
from embodied.algorithms.loss import policy_obs
from embodied.data.training import DemoTensors
from policies.io import INPUT_KEYS, env_inputs, indexed_inputs, instruction_texts, policy_inputs, task_instructions
from sims.core import obs_views

TINY = dict(d_model=32, image_size=32, vision_channels=[8, 16], chunk_size=3, prefix_layers=1, expert_layers=1)


def _assert_same(new: dict, old: dict) -> None:
    assert list(new) == list(old)
    for key, value in old.items():
        if isinstance(value, torch.Tensor):
            assert new[key].dtype == value.dtype and torch.equal(new[key], value)
        else:
            assert new[key] == value


def _hand_built(obs: dict, env) -> dict:
    """The dict evaluation and rollouts built before policies.io."""
    return {
        "rgb": obs_views(obs),
        "state": obs["state"],
        "instruction": [env.tasks[int(t)].instruction for t in obs["task_id"]],
    }


@pytest.mark.parametrize("cameras", [("agentview", "wrist"), ()])
def test_env_inputs_are_the_hand_built_dict_and_sample_the_same_chunks(cameras):
    with sims.make("mujoco", suite="goal", num_envs=2, image_size=32, cameras=cameras) as env:
        obs = env.reset(seed=0, task_ids=[3, 0], init_ids=[0, 1])
        old = _hand_built(obs, env)
        new = env_inputs(obs, task_instructions(env))
    assert tuple(new) == INPUT_KEYS and len(set(new["instruction"])) == 2
    _assert_same(new, old)
    assert new["state"] is obs["state"]  # no copy of the observation
    assert new["rgb"].shape == ((2, 2, 32, 32, 3) if cameras else (2, 0, 1, 1, 3))

    tleft = torch.tensor([0.25, 1.0])
    _assert_same(env_inputs(obs, task_instructions(env), time_left=tleft), {**old, "time_left": tleft})

    torch.manual_seed(0)
    policy = policies.make("flow", cameras=list(cameras), **TINY).eval()
    with torch.no_grad():
        a = policy.sample(old, mode="explore", generator=torch.Generator().manual_seed(1))
        b = policy.sample(new, mode="explore", generator=torch.Generator().manual_seed(1))
    assert torch.equal(a.actions, b.actions) and torch.equal(a.logprob, b.logprob)


def test_indexed_inputs_are_the_batch_columns_dicts():
    g = torch.Generator().manual_seed(0)
    texts = ["open the drawer", "put the bowl on the plate", "push the plate"]
    rgb = torch.randint(0, 256, (4, 2, 8, 8, 3), dtype=torch.uint8, generator=g)
    state, ids, tleft = torch.randn(4, 15, generator=g), torch.tensor([2, 0, 2, 1]), torch.rand(4, generator=g)
    old = {"rgb": rgb, "state": state, "instruction": [texts[int(t)] for t in ids]}
    _assert_same(indexed_inputs(rgb, state, ids, texts), old)
    assert instruction_texts(ids.numpy(), texts) == instruction_texts([2, 0, 2, 1], texts) == old["instruction"]

    # the learner's minibatch (embodied.algorithms.loss.policy_obs), with and without time_left
    minibatch = {"rgb": rgb, "state": state, "task_id": ids, "advantages": torch.zeros(4)}
    _assert_same(policy_obs(minibatch, texts), old)
    _assert_same(policy_obs({**minibatch, "time_left": tleft}, texts), {**old, "time_left": tleft})

    # demonstrations (embodied.data.training.DemoTensors.batch)
    demos = DemoTensors(
        rgb=rgb,
        state=state,
        actions=torch.randn(4, 7, generator=g),
        episode=torch.zeros(4),
        instruction_ids=ids,
        instructions=texts,
        chunk_index=torch.zeros(4, 3, dtype=torch.long),
        chunk_pad=torch.zeros(4, 3, dtype=torch.bool),
        cameras=["agentview", "wrist"],
        frame_size=8,
    )
    idx = torch.tensor([3, 1])
    obs, _ = demos.batch(idx)
    _assert_same(obs, {"rgb": rgb[idx], "state": state[idx], "instruction": [texts[i] for i in ids[idx].tolist()]})


def test_policy_inputs_of_decoded_wire_arrays_share_their_memory():
    rng = np.random.default_rng(0)
    decoded = [
        {
            "rgb": rng.integers(0, 256, (2, 16, 16, 3), dtype=np.uint8),
            "state": rng.standard_normal(15).astype(np.float32),
            "prompt": p,
        }
        for p in ("lift", "stack")
    ]
    rgb, state = np.stack([o["rgb"] for o in decoded]), np.stack([o["state"] for o in decoded])
    new = policy_inputs(rgb, state, [o["prompt"] for o in decoded])
    _assert_same(
        new, {"rgb": torch.from_numpy(rgb), "state": torch.from_numpy(state), "instruction": ["lift", "stack"]}
    )
    assert np.shares_memory(new["rgb"].numpy(), rgb) and np.shares_memory(new["state"].numpy(), state)
    assert "time_left" not in new
